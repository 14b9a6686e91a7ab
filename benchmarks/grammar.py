#!/usr/bin/env python3
"""Grammar mask cost per catalog model: the JSON grammar of tests/native/test_grammar.py, a seeded
JSON document (nested objects, arrays, numbers, escapes, accented and CJK text) tokenized by the
model, then replayed token by token as a constrained generation would: mask() (timed), check that
the document's token is allowed, accept_token(). Prints the per-token mask time (mean, median,
p90, max) and the cold cost of a first mask in a fresh matcher at typical states.

    python benchmarks/grammar.py [--models smollm2:135m,gemma3:270m,qwen2.5-coder:0.5b] [--docs 3]"""

from __future__ import annotations

import argparse
import json
import pathlib
import random
import statistics
import sys
import time

import numpy as np

import bubo
from bubo import store
from bubo._grammar import Grammar, Matcher, Vocab

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests" / "native"))
from test_grammar import JSON_GBNF  # noqa: E402  (one definition of the benchmark's grammar)

CATALOG = ["smollm2:135m", "gemma3:270m", "qwen2.5-coder:0.5b"]
WORDS = ["alpha", "beta", "gamma", "delta", "naïve", "café", "東京", "数据", "línea", "tab\there", "quote\"d",
         "user_id", "createdAt", "description", "items", "price", "tags", "enabled", "score", "notes"]


def document(rng: random.Random) -> str:
    def value(depth):
        r = rng.random()
        if depth < 3 and r < 0.25:
            return {rng.choice(WORDS): value(depth + 1) for _ in range(rng.randint(1, 4))}
        if depth < 3 and r < 0.4:
            return [value(depth + 1) for _ in range(rng.randint(0, 4))]
        if r < 0.6:
            return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 8)))
        if r < 0.75:
            return rng.randint(-10**6, 10**6)
        if r < 0.85:
            return round(rng.uniform(-1000, 1000), rng.randint(0, 6))
        return rng.choice([True, False, None])
    doc = {"records": [value(0) for _ in range(6)], "summary": value(1)}
    return json.dumps(doc, indent=rng.choice([None, 2]), ensure_ascii=rng.random() < 0.3)


def pct(xs, q):
    return float(np.percentile(np.array(xs), q))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(CATALOG))
    ap.add_argument("--docs", type=int, default=3, help="seeded documents per model")
    args = ap.parse_args()
    grammar = Grammar(JSON_GBNF)
    print(f"{'model':<20} {'vocab':>7} {'trie nodes':>10} {'tokens':>6} {'mean ms':>8} {'median':>7} "
          f"{'p90':>7} {'max':>7}   cold first mask ms: start / in string / after ':'")
    for name in args.models.split(","):
        tok = bubo.Tokenizer(store.pull(name))
        t0 = time.perf_counter()
        vocab = Vocab.from_tokenizer(tok)
        build_s = time.perf_counter() - t0
        times = []
        n_tokens = 0
        for d in range(args.docs):
            text = document(random.Random(d))
            ids = tok.encode(text, add_special=False)
            m = Matcher(grammar, vocab)
            mask = np.empty(len(vocab), dtype=np.uint8)
            for t in ids:
                t1 = time.perf_counter()
                m.mask(out=mask)
                times.append(time.perf_counter() - t1)
                if not mask[t] or not m.accept_token(t):
                    raise SystemExit(f"{name}: token {t} {tok.token_to_piece(t, False)!r} of the document refused")
            assert m.accepting
            n_tokens += len(ids)
        cold = []
        for prefix in [b"", b'{"records": ["caf', b'{"records": [{"a":']:
            m = Matcher(grammar, vocab)
            assert m.accept_bytes(prefix)
            t1 = time.perf_counter()
            m.mask()
            cold.append((time.perf_counter() - t1) * 1e3)
        ms = [x * 1e3 for x in times]
        print(f"{name:<20} {len(vocab):>7} {vocab.n_nodes:>10} {n_tokens:>6} {statistics.mean(ms):>8.3f} "
              f"{statistics.median(ms):>7.3f} {pct(ms, 90):>7.3f} {max(ms):>7.3f}   "
              + " / ".join(f"{c:.3f}" for c in cold) + f"   (trie built in {build_s * 1e3:.0f} ms)")


if __name__ == "__main__":
    main()
