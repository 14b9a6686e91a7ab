"""`bubo bench`: llama-bench's pp and tg tests on the native model, and speculative decoding
against plain generation."""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

from bubo import cpus
from bubo.cli.flags import check_cache_flags


def bench(path: Any, n_prompt: int, n_gen: int, n_threads: int | None, reps: int,
          n_depth: int = 0, type_k: str = "f16", type_v: str = "f16") -> list[dict[str, Any]]:
    """llama-bench's two tests on the native model: `pp` decodes n_prompt tokens as one batch,
    `tg` decodes n_gen tokens one at a time, each after n_depth tokens already in the cache
    (decoded once, untimed; 0: an empty cache), in a KV cache of type_k and type_v; each after a
    warm-up run, `reps` times. Random tokens, as llama-bench uses: speed does not depend on the
    text."""
    import numpy as np

    from bubo import GGUFFile, store

    if n_prompt < 0 or n_gen < 0 or (n_prompt == 0 and n_gen == 0):
        raise ValueError("give -p and/or -n as positive token counts")
    if reps <= 0:
        raise ValueError("-r must be at least 1")
    if n_depth < 0:
        raise ValueError(f"-d {n_depth}: the depth is a token count, 0 or more")
    path = store.resolve(path)
    from bubo._model import KVCache
    from bubo._model import Model as NativeModel

    with GGUFFile(path) as f:
        md = f.metadata
        size = sum(t.nbytes for t in f.tensors)
        params = sum(int(np.prod(t.shape)) for t in f.tensors)
    n_ctx = n_depth + max(n_prompt, n_gen, 1) + 1
    n_ctx_train = md.get(f"{md.get('general.architecture')}.context_length")
    if n_depth and isinstance(n_ctx_train, int) and n_ctx > n_ctx_train:
        raise ValueError(f"-d {n_depth}: the depth and the test ({n_ctx} tokens) pass the model's context "
                         f"({n_ctx_train})")
    model = NativeModel(str(path), n_threads or 0)
    threads = n_threads or cpus.usable()
    kv = KVCache(model, n_ctx, type=type_k, type_v=type_v)
    rng = np.random.default_rng(0)
    n_vocab = model.n_vocab
    depth = rng.integers(0, n_vocab, n_depth, dtype=np.int32)
    for a in range(0, n_depth, 512):  # the depth, once: each test truncates back to it
        b = min(a + 512, n_depth)
        model.decode(kv, depth[a:b], np.arange(a, b, dtype=np.int32), np.zeros(b - a, dtype=np.int32),
                     np.zeros(b - a, dtype=bool))

    def run_pp() -> float:
        kv.truncate(0, n_depth)
        toks = rng.integers(0, n_vocab, n_prompt, dtype=np.int32)
        rows = np.zeros(n_prompt, dtype=bool)
        rows[-1] = True
        t0 = time.perf_counter()
        model.decode(kv, toks, np.arange(n_depth, n_depth + n_prompt, dtype=np.int32),
                     np.zeros(n_prompt, dtype=np.int32), rows)
        return time.perf_counter() - t0

    def run_tg() -> float:
        kv.truncate(0, n_depth)
        toks = rng.integers(0, n_vocab, n_gen, dtype=np.int32)
        one_row = np.ones(1, dtype=bool)
        seq = np.zeros(1, dtype=np.int32)
        t0 = time.perf_counter()
        for i in range(n_gen):
            model.decode(kv, toks[i : i + 1], np.array([n_depth + i], dtype=np.int32), seq, one_row)
        return time.perf_counter() - t0

    arch = str(md.get("general.architecture", "?"))
    ft = md.get("general.file_type")
    quant = store.FILE_TYPE_NAMES.get(ft, "?") if isinstance(ft, int) else "?"
    desc = f"{arch} {md.get('general.size_label', '?')} {quant}"
    results = []
    for test, n, fn in (("pp", n_prompt, run_pp), ("tg", n_gen, run_tg)):
        if n == 0:
            continue
        fn()  # warm-up: page in the weights, spin up the threads
        speeds = [n / fn() for _ in range(reps)]
        results.append({
            "model": desc, "model_size": size, "model_n_params": params, "backend": "CPU",
            "n_threads": threads, "test": f"{test}{n}" + (f" @ d{n_depth}" if n_depth else ""),
            "n_prompt": n if test == "pp" else 0, "n_gen": n if test == "tg" else 0, "n_depth": n_depth,
            "type_k": type_k, "type_v": type_v,
            "avg_ts": statistics.mean(speeds),
            "stddev_ts": statistics.stdev(speeds) if len(speeds) > 1 else 0.0, "samples_ts": speeds,
        })
    return results


BENCH_EDIT = ("Rename the variable `total` to `acc` everywhere in this function and answer with the whole function "
              "only.\n\n```python\ndef mean_and_spread(values):\n    total = 0\n    for v in values:\n"
              "        total += v\n    mean = total / len(values)\n    total = 0\n    for v in values:\n"
              "        total += (v - mean) ** 2\n    return mean, (total / len(values)) ** 0.5\n```")
BENCH_CODE = ("Write a Python function that parses a CSV file into a list of dictionaries, with type hints and a "
              "docstring.")


def bench_draft(path: Any, draft: str, n_gen: int, n_threads: int | None, reps: int,
                prompts: list[str] | None = None) -> list[dict[str, Any]]:
    """Generation with speculative decoding against without it: greedy chat answers of at most
    n_gen tokens to each prompt, by two bubo.Model instances of the same model (one drafting:
    prompt lookup for draft "ngram", else the draft model `draft`), alternated `reps` times after
    a warm-up. Tokens per second are the answers' own (Timings.predicted_*), summed."""
    from bubo import store
    from bubo.engine.draft import DraftConfig
    from bubo.llm import Model

    if n_gen <= 0 or reps <= 0:
        raise ValueError("give -n and -r as positive counts")
    path = store.resolve(path)
    config = DraftConfig() if draft == "ngram" else DraftConfig(model=draft)
    prompts = prompts or [BENCH_EDIT if draft == "ngram" else BENCH_CODE]
    with Model(path, n_ctx=4096, n_threads=n_threads, draft=False) as plain, \
            Model(path, n_ctx=4096, n_threads=n_threads, draft=config) as drafted:
        sums = {"plain": [0, 0.0], "drafted": [0, 0.0]}
        n_drafted = n_kept = 0
        same = True
        for rep in range(reps + 1):
            for p in prompts:
                msgs = [{"role": "user", "content": p}]
                a = plain.chat(msgs, max_tokens=n_gen, temperature=0)
                b = drafted.chat(msgs, max_tokens=n_gen, temperature=0)
                if rep == 0:
                    continue  # the warm-up: page the weights in, learn what a pass costs
                same = same and a.tokens == b.tokens
                for key, c in (("plain", a), ("drafted", b)):
                    sums[key][0] += c.timings.predicted_n
                    sums[key][1] += c.timings.predicted_s
                n_drafted += b.timings.draft_n
                n_kept += b.timings.draft_n_accepted
    plain_ts, drafted_ts = (sums[k][0] / sums[k][1] if sums[k][1] else 0.0 for k in ("plain", "drafted"))
    return [{"model": str(path.name), "draft": draft, "n_threads": n_threads or cpus.usable(),
             "test": f"tg{n_gen} x{len(prompts)}", "plain_ts": plain_ts, "drafted_ts": drafted_ts,
             "speedup": drafted_ts / plain_ts if plain_ts else 0.0, "draft_n": n_drafted,
             "draft_n_accepted": n_kept, "same_answers": same}]


def draft_table(results: list[dict[str, Any]]) -> str:
    lines = ["| model | draft | threads | test | plain t/s | drafted t/s | drafted / plain | drafted tokens kept "
             "| same answers |", "| --- | --- | ---: | --- | ---: | ---: | ---: | ---: | --- |"]
    for r in results:
        n, k = r["draft_n"], r["draft_n_accepted"]
        kept = f"{k}/{n} ({k / n:.0%})" if n else "0/0"
        lines.append(f"| {r['model']} | {r['draft']} | {r['n_threads']} | {r['test']} | {r['plain_ts']:.2f} | "
                     f"{r['drafted_ts']:.2f} | {r['speedup']:.2f}x | {kept} | {r['same_answers']} |")
    return "\n".join(lines)


def markdown_table(results: list[dict[str, Any]]) -> str:
    """llama-bench's markdown table (with its type_k and type_v columns where a cache is not f16)."""
    types = any(r.get("type_k", "f16") != "f16" or r.get("type_v", "f16") != "f16" for r in results)
    head: tuple[str, ...] = ("model", "size", "params", "backend", "threads") + (
        ("type_k", "type_v") if types else ()) + ("test", "t/s")
    right: tuple[bool, ...] = (False, True, True, False, True) + ((False, False) if types else ()) + (True, True)
    rows = []
    for r in results:
        p = r["model_n_params"]
        rows.append((
            r["model"], f"{r['model_size'] / 1024**2:.2f} MiB",
            f"{p / 1e9:.2f} B" if p >= 1e9 else f"{p / 1e6:.2f} M",
            r["backend"], str(r["n_threads"]),
        ) + ((r.get("type_k", "f16"), r.get("type_v", "f16")) if types else ()) + (
            r["test"], f"{r['avg_ts']:.2f} ± {r['stddev_ts']:.2f}",
        ))
    widths = [max([len(h)] + [len(row[i]) for row in rows]) for i, h in enumerate(head)]
    widths[0] = max(widths[0], 30)
    widths[-1] = max(widths[-1], 20)

    def line(cells: tuple[str, ...]) -> str:
        return "| " + " | ".join(c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, widths, right)) + " |"

    sep = "| " + " | ".join(("-" * (w - 1) + ":") if r else "-" * w for w, r in zip(widths, right)) + " |"
    return "\n".join([line(head), sep] + [line(row) for row in rows])


def bench_command(args: argparse.Namespace) -> int:
    if args.draft is not None:
        results = bench_draft(args.model, args.draft, args.n_gen, args.threads, args.repetitions, args.prompt)
        print(json.dumps(results, indent=2) if args.output == "json" else draft_table(results))
        return 0
    check_cache_flags(args)
    results = bench(args.model, args.n_prompt, args.n_gen, args.threads, args.repetitions, args.n_depth,
                    args.cache_type_k or "f16", args.cache_type_v or "f16")
    if args.output == "json":
        print(json.dumps(results, indent=2))
    else:
        print(markdown_table(results))
    return 0
