#!/usr/bin/env python3
"""Constrained against unconstrained generation, tokens per second, in one run.

One in-process Engine (one slot) on the model (default qwen2.5-coder:0.5b, 151,936 tokens); the
same chat prompt is answered N tokens long (ignore_eos) with no constraint, and with a JSON
Schema's grammar whose instances can run long (an array of objects with free strings), so that
the constrained answer also keeps going for N tokens. Rounds alternate the two; each figure is
the median over rounds of generated tokens / generation time (the FinishEvent's timings, the
prompt excluded). The ratio constrained / unconstrained is what the issue asks for (>= 0.9).

    python benchmarks/constrained.py [-m qwen2.5-coder:0.5b] [-n 128] [--rounds 3] [-t 2]"""

from __future__ import annotations

import argparse
import statistics
import sys

import gevent

from bubo import store
from bubo._grammar import Grammar
from bubo.chat.schema import schema_to_gbnf
from bubo.engine import FinishEvent, GenerationRequest
from bubo.engine.engine import Engine
from bubo.sampling import SamplingParams

SCHEMA = {
    "type": "object",
    "properties": {"notes": {"type": "array", "items": {
        "type": "object",
        "properties": {"title": {"type": "string"}, "body": {"type": "string"}, "score": {"type": "integer"}},
        "required": ["title", "body", "score"]}}},
    "required": ["notes"],
}


def run(engine: Engine, prompt: list[int], n: int, grammar: Grammar | None) -> tuple[float, int, str]:
    req = GenerationRequest(prompt, SamplingParams(temperature=0.8, seed=7), max_tokens=n, grammar=grammar,
                            ignore_eos=grammar is None, cache_prompt=True)
    events = list(engine.submit(req))
    fin = events[-1]
    assert isinstance(fin, FinishEvent), fin
    return fin.timings.predicted_per_second, fin.completion_tokens, fin.reason


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--save", action="store_true",
                    help="also write the tables to benchmarks/results/ (benchmarks/report.py makes docs/benchmarks.md)")
    ap.add_argument("-m", "--model", default="qwen2.5-coder:0.5b")
    ap.add_argument("-n", "--n-predict", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-t", "--threads", type=int, default=2)
    args = ap.parse_args()

    engine = Engine(str(store.pull(args.model)), n_ctx=2048, n_threads=args.threads, n_parallel=1)
    engine.start()
    with gevent.Timeout(300):
        while not engine.ready:
            assert engine.load_error is None, engine.load_error
            gevent.sleep(0.05)
    assert engine.runtime is not None
    text = engine.runtime.chat_prompt([{"role": "user", "content": "Write many detailed notes about rivers as JSON."}])
    prompt = engine.tokenizer.encode(text, add_special=True, parse_special=True)
    grammar = Grammar(schema_to_gbnf(SCHEMA))
    run(engine, prompt, 8, None)  # warm-up: weights paged in, prompt cached
    free, bound = [], []
    for _ in range(args.rounds):
        tps, n, _ = run(engine, prompt, args.n_predict, None)
        free.append(tps)
        tps, n_c, reason = run(engine, prompt, args.n_predict, grammar)
        bound.append(tps)
        if n_c < args.n_predict:
            print(f"note: a constrained answer ended after {n_c} tokens ({reason})")
    engine.stop()
    f, b = statistics.median(free), statistics.median(bound)
    print(f"model {args.model}, {args.n_predict} tokens, {args.threads} threads, median of {args.rounds} rounds")
    print(f"| generation | tokens/s |\n| --- | ---: |\n| unconstrained | {f:.1f} |\n| JSON Schema grammar | {b:.1f} |")
    print(f"constrained / unconstrained: {b / f:.3f}x")


if __name__ == "__main__":
    import results

    with results.saving("grammar", "--save" in sys.argv[1:]):
        code = main()
    raise SystemExit(code)
