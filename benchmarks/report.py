#!/usr/bin/env python3
"""Write docs/benchmarks.md from the result files the benchmarks saved (benchmarks/results/, see
results.py): for each benchmark, what it measures and how to run it, then its current tables,
one per CPU it ran on.

    python benchmarks/report.py            # rewrite docs/benchmarks.md
    python benchmarks/report.py --check    # exit 1 if docs/benchmarks.md is not what the files make
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
DOC = ROOT / "docs" / "benchmarks.md"

# each benchmark: (its folder under results/, heading, what it measures and how it is run)
BENCHMARKS: list[tuple[str, str, str]] = [
    ("bench_llamacpp", "Against llama.cpp",
     "`benchmarks/bench_llamacpp.py` runs `bubo bench` and llama.cpp's `llama-bench` on the same GGUF files "
     "and thread count, alternating round by round: `pp512` decodes a 512-token prompt as one batch (`pp16`, `pp8`: a "
     "16- or 8-token one, a short turn of a chat), `tg128` "
     "generates 128 tokens one at a time (`@ dN`: after N tokens already in the cache), both from random "
     "tokens as llama-bench does. The ratio is bubo's tokens per second over llama.cpp's."),
    ("default_model", "The default model",
     "`benchmarks/default_model.py`: every chat model of the catalog on factual questions whose answer is a "
     "word or a number and on chat openers whose answer must end on its own, greedy; a right answer holds "
     "the expected word and does not loop. The default model is the one that answers them all; "
     "tests/test_default_model.py holds it to that."),
    ("bench_lora", "LoRA adapters",
     "`benchmarks/bench_lora.py`: prompt and generation speed of one server with one random LoRA adapter of rank "
     "16 on every projection against the same server without it, bubo and llama-server with the same adapter "
     "file in one run (`/completion`, a 512-token prompt never cached, 128 tokens generated, the servers' own "
     "timings, medians of 3 runs). \"vs base\" is each server with the adapter over itself without it."),
    ("kl", "Quality against llama.cpp",
     "`benchmarks/kl.py`: each catalog model's mean KL-divergence to its exact model (every tensor dequantized "
     "to F32), llama-perplexity's measure over the same chunks of the same text, bubo's runs of the two files "
     "beside llama.cpp's. The ratio is bubo's over llama.cpp's: at most 1.02 after any change to a kernel, "
     "to attention or to the forward pass."),
    ("prepack", "Prepacked weights",
     "`benchmarks/prepack.py`: matrices packed at load into the tiles' layout, against the rows in place "
     "(`BUBO_NO_PREPACK=1`): the kernels alone, whole models under `bubo bench`, and the server under steady "
     "load."),
    ("prefill_peak", "Prompts against the int8 peak",
     "`benchmarks/prefill_peak.py`: pp512 beside llama.cpp's, as a share of what back-to-back VNNI dot products "
     "reach on the same threads, measured on the spot (the best of several rounds: a shared machine only ever "
     "runs slower than its hardware)."),
    ("bench_spec", "Speculative decoding",
     "`benchmarks/bench_spec.py`: greedy chat answers with drafting against without, bubo and llama-server "
     "side by side on the same prompts: prompt lookup on edits (whose answers repeat their prompt) and free "
     "text, and a draft model. \"Same answers\" compares each server's drafted answers with its plain ones."),
    ("bench_serve", "Many clients",
     "`benchmarks/bench_serve.py`: clients streaming from bubo and llama-server with the same slots, context "
     "and threads: aggregate tokens per second and time to first token, and prompts that share a long history "
     "or system prompt."),
    ("bench_responses", "Continued conversations",
     "`benchmarks/bench_responses.py`: a 10-turn conversation, time to first token per turn: bubo continuing "
     "each turn with `previous_response_id` (only the new message is sent), bubo with the whole conversation "
     "resent, and llama-server with it resent (its prefix cache on). One slot, the same GGUF, context and "
     "threads; each server started afresh for its conversation. The ratio is llama-server's time over bubo's "
     "with `previous_response_id`."),
    ("bench_embed", "Embeddings",
     "`benchmarks/bench_embed.py`: varied sentences through `/v1/embeddings`, bubo and llama-server "
     "`--embedding` on the same F16 GGUF and threads, one server at a time, alternating rounds."),
    ("bench_small", "Small requests",
     "`benchmarks/bench_small.py`: the lightest routes (`/health`, `/tokenize`, a one-token `/completion`, a "
     "one-input `/v1/embeddings`) from several keep-alive clients, bubo and llama-server on the same GGUF and "
     "threads, side by side, each load sent to them in turn in alternating bursts: requests per second, and the "
     "server's CPU time per request (for bubo also the part outside its engine's threads: the HTTP path and the "
     "request's preparation, and how often those threads slept); the one-token completion's core steps called "
     "in-process, with no HTTP server or Flask request: the part of its CPU outside the engine that no HTTP path "
     "could remove; and what a sleep of the event loop's thread costs on the machine."),
    ("bench_ray", "Replicas on Ray Serve",
     "`benchmarks/bench_ray.py`: streamed answers through `bubo ray-serve` against `bubo serve` alone, and "
     "prefix-aware routing against Ray Serve's default, on a local cluster."),
    ("soak", "A soak under hostile traffic",
     "`benchmarks/soak.py --hostile 0.3`: normal clients beside hostile ones (schemas that once expanded "
     "exponentially, 16 MB bodies, clients that do not read; the saved run also sent Markdown whose highlighter "
     "backtracked, to the server-side rendering the chat page no longer uses) for the whole run, with /health "
     "probed throughout."),
    ("grammar", "Grammar masks",
     "`benchmarks/grammar.py`: the time to compute a token mask for JSON Schema grammars over a catalog "
     "vocabulary."),
    ("kernels", "Kernels",
     "`benchmarks/kernels.py`: each type's dot product and matrix tile per instruction-set level, in "
     "multiply-adds per second."),
]


def _table(record: dict[str, Any]) -> str:
    cols = record["columns"]
    def numeric(i: int) -> bool:
        cells = [r[i] for r in record["rows"] if i < len(r) and r[i]]
        return bool(cells) and all(re.match(r"^[-+]?\d", c) and not re.search(r"[a-wyzA-Z]", c) for c in cells)

    align = ["---:" if numeric(i) else "---" for i in range(len(cols))]
    lines = ["| " + " | ".join(cols) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in record["rows"]]
    return "\n".join(lines)


def render() -> str:
    out = ["# Benchmarks", "",
           "bubo beside its peers, each benchmark run side by side in one process and the ratios printed. "
           "Every table names the CPU it ran on and the command that made it; the tables are written by "
           "`python benchmarks/report.py` from the files the benchmarks save with `--save` "
           "(benchmarks/results/), and git keeps the earlier runs.", ""]
    known = {name for name, _, _ in BENCHMARKS}
    unknown = sorted(p.name for p in RESULTS.iterdir() if p.is_dir() and p.name not in known) if RESULTS.is_dir() \
        else []
    if unknown:
        raise SystemExit(f"results for benchmarks report.py does not describe: {', '.join(unknown)}")
    for name, heading, what in BENCHMARKS:
        files = sorted((RESULTS / name).glob("*.json")) if (RESULTS / name).is_dir() else []
        if not files:
            continue
        out += [f"## {heading}", "", what, ""]
        records = [json.loads(f.read_text(encoding="utf-8")) for f in files]
        records.sort(key=lambda r: (r["cpu"], r["title"]))
        for r in records:
            out += [f"### {r['title']}", "", f"{r['cpu']}; `{r['command']}`, {r['date']}", "", _table(r), ""]
    return "\n".join(out).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true", help="say whether docs/benchmarks.md is current, write nothing")
    args = p.parse_args(argv)
    text = render()
    if args.check:
        if DOC.read_text(encoding="utf-8") != text:
            print("docs/benchmarks.md is not what benchmarks/results/ makes: run python benchmarks/report.py",
                  file=sys.stderr)
            return 1
        return 0
    tmp = DOC.with_suffix(".md.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(DOC)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
