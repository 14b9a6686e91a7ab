"""Prompt lookup replayed: what drafting saves on bench_spec's prompts, counted rather than timed.

Each prompt's greedy answer is generated once without drafting; then bubo's own drafter
(NgramDrafter, choose_lengths and the scheduler's probes, as bubo.engine.scheduler runs them for
one sequence) drafts that answer again token by token, each draft checked against the answer as
the target's pass would check it. What a pass of n rows costs is measured in this process first
(the best of --reps runs of each count: a shared machine only ever runs slower than its
hardware). Per answer it prints the target's passes, the rows they checked, the drafted tokens
kept, and the speed-up those costs give (plain: one pass a token); per task the speed-up over
all its answers (summed time, as bench_spec sums it).

With --learn SPREAD the pacing does not know the costs: it learns them as the scheduler does
(bubo.engine.draft.Costs, a fresh one as a server starts, over the answers in turn). Each pass
is observed at its cost times exp(|x|), x drawn from a normal of that spread (a shared machine
only ever runs slower than its hardware), and each prompt's pass as one chunk of rows (what a
row of a prompt's chunk costs: measured here, or --row-ms, which --costs needs: the costs'
machine's). The times are summed over LEARN_SEEDS draws of that noise, the counts averaged.
What the passes cost is still the given costs, so the speed-up lost against the plain replay is
what learning them costs: trying counts not run yet, and choosing by noisy medians.

The machine's drift does not move these counts, so two drafting policies can be told apart
here where an end-to-end run (bench_spec.py, bubo beside llama-server) cannot. What it leaves
out is everything but the passes: the scheduler's own work per step, sampling, HTTP.

    python benchmarks/lookup_replay.py [--model qwen2.5-coder:1.5b] [--level avx2] [--tasks edit,free] [-v]
        [--costs 31.0,32.2,36.7,...] [--learn 0.1 [--row-ms 9.3]]
"""

from __future__ import annotations

import argparse
import math
import os
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_spec import TASKS  # noqa: E402
from results import cpu_name  # noqa: E402

MAX_ROWS = 17  # pass sizes measured: the longest draft (n_max 16) and its pending token
LEARN_SEEDS = 6  # --learn: draws of the passes' noise, summed
CHUNK_ROWS = 64  # the prompt chunk timed for what a row of it costs


def step_costs(model: Any, reps: int) -> list[float]:
    """Seconds for a pass of 1..MAX_ROWS rows (every row's logits, as a draft's check), after a
    short prompt: the best of reps runs of each, the counts alternating."""
    import numpy as np

    from bubo._model import KVCache

    rt = model._loaded.runtime
    kv = KVCache(rt.native, 1024, n_seq_max=1)
    toks = rt.tokenizer.encode("def add(a, b):\n    return a + b\n" * 8)
    n0 = len(toks)
    rt.native.decode(kv, np.asarray(toks, np.int32), np.arange(n0, dtype=np.int32), np.zeros(n0, np.int32),
                     np.zeros(n0, bool))
    best = [float("inf")] * (MAX_ROWS + 1)
    for _ in range(reps):
        for n in range(1, MAX_ROWS + 1):
            t0 = time.perf_counter()
            rt.native.decode(kv, np.asarray(toks[:n], np.int32), np.arange(n0, n0 + n, dtype=np.int32),
                             np.zeros(n, np.int32), np.ones(n, bool))
            best[n] = min(best[n], time.perf_counter() - t0)
            kv.truncate(0, n0)
    return best


def chunk_row_cost(model: Any, reps: int) -> float:
    """Seconds per row of a prompt's chunk of CHUNK_ROWS rows (no logits): the best of reps runs."""
    import numpy as np

    from bubo._model import KVCache

    rt = model._loaded.runtime
    kv = KVCache(rt.native, 1024, n_seq_max=1)
    toks = np.asarray((rt.tokenizer.encode("def add(a, b):\n    return a + b\n" * 16))[:CHUNK_ROWS], np.int32)
    n = len(toks)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        rt.native.decode(kv, toks, np.arange(n, dtype=np.int32), np.zeros(n, np.int32), np.zeros(n, bool))
        best = min(best, time.perf_counter() - t0)
        kv.truncate(0, 0)
    return best / n


def replay_args(ap: argparse.ArgumentParser, tasks: str) -> None:
    """The options of both replays (this one and draft_replay.py)."""
    ap.add_argument("--model", default="qwen2.5-coder:1.5b")
    ap.add_argument("--level", choices=["native", "avx2"], default="native",
                    help="avx2: bubo at the AVX2 level (BUBO_FORCE_ISA) on a CPU that has more")
    ap.add_argument("--tasks", default=tasks, help="comma-separated, of bench_spec's")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=7, help="runs of each pass measured")
    ap.add_argument("--costs", default=None,
                    help="milliseconds for the target's passes of 1, 2, ... rows, comma-separated, instead of "
                         "measuring them (the same figures for two versions of the drafter; past the last, each "
                         "row costs what the last one did)")


def target_costs(model: Any, args: argparse.Namespace) -> Callable[[int], float]:
    """Seconds for the target's pass of n rows: --costs, or measured (step_costs); past the last
    figure each row costs what the last one did (never less than nothing)."""
    if args.costs:
        best = [0.0] + [float(x) / 1e3 for x in args.costs.split(",")]
        if len(best) < 3:
            raise SystemExit("--costs needs the passes of 1 and 2 rows at least")
    else:
        best = step_costs(model, args.reps)
    last = len(best) - 1
    row = max(0.0, best[last] - best[last - 1])

    def cost(n: int) -> float:
        return best[n] if n <= last else best[last] + (n - last) * row

    return cost


def greedy_answer(model: Any, text: str, max_tokens: int) -> tuple[list[int], list[int]]:
    """(the prompt's tokens, the greedy answer's tokens, end of generation included) of a chat
    question, asked without drafting."""
    rt = model._loaded.runtime
    messages = [{"role": "user", "content": text}]
    plain = model.chat(messages, max_tokens=max_tokens, temperature=0, draft_max=0)
    prompt = rt.tokenizer.encode(rt.chat_prompt(messages), add_special=True, parse_special=True)
    if len(prompt) != plain.prompt_tokens:
        raise SystemExit(f"the prompt's tokens differ from the engine's: {len(prompt)} against {plain.prompt_tokens}")
    return prompt, list(plain.tokens)


def describe_costs(cost: Callable[[int], float], args: argparse.Namespace) -> str:
    """The costs as the tables' heading gives them."""
    return (f"the target's pass of one row {cost(1) * 1e3:.1f} ms, of n rows against one "
            f"({'given' if args.costs else f'best of {args.reps}'}): "
            + ", ".join(f"{n}: {cost(n) / cost(1):.2f}x" for n in range(2, 9)))


def replay(prompt: list[int], answer: list[int], rt: Any, costs: Any, cost: Any, max_tokens: int,
           trace: bool, learn: tuple[float, random.Random, float] | None = None
           ) -> tuple[float, float, int, int, int, int]:
    """(plain seconds, drafted seconds, passes, rows, drafted, kept) of one answer drafted again.
    learn: (spread, random numbers, seconds per row of a prompt's chunk): the pacing learns the
    costs in `costs` as the scheduler does (see the module's text) instead of knowing them."""
    from bubo.engine import draft as D

    d = D.NgramDrafter(D.DEFAULT_DRAFT, rt.word_starts(), rt.separators(), len(prompt), rt.grammar_pieces(),
                       rt.space_runs())

    def slower(seconds: float) -> float:  # learn's noise: a pass observed slower than it runs
        assert learn is not None
        return seconds * math.exp(abs(learn[1].gauss(0.0, learn[0])))

    if learn is not None and len(prompt) - 1 >= D.ROW_COST_ROWS:  # its last row gives logits
        costs.observe_rows(len(prompt), 1, slower((len(prompt) - 1 + costs.row_factor) * learn[2]))
    tokens = prompt + answer[:1]  # the first token comes from the prompt's pass
    i, spent, passes, rows, drafted, kept = 1, 0.0, 0, 0, 0, 0
    while i < len(answer):
        limit = max(0, min(d.config.n_max, max_tokens - i - 1))
        offer = d.propose(tokens, limit) if limit > 0 else []
        one = cost(1) if learn is None else costs.target(1)
        draft: list[int] = []
        if one is not None:  # the scheduler's first step, with nothing measured yet, is plain
            step = (lambda m: cost(1 + m)) if learn is None else (lambda m: costs.target(1 + m) or one)
            k = D.choose_lengths([d.alpha(costs.alpha)], [len(offer)], step, 0.0)[0]
            if k == 0:
                costs.idle()
                if d.since >= D.PROBE_EVERY:
                    k = min(len(offer), D.PROBE_LENGTH)
            draft = offer[:k] if k >= max(1, d.config.n_min) else []
            if not draft:
                d.idle()
        n = 0
        while n < len(draft) and i + n < len(answer) and draft[n] == answer[i + n]:
            n += 1
        spent += cost(1 + len(draft))
        if learn is not None:
            costs.observe(1 + len(draft), slower(cost(1 + len(draft))))
        passes += 1
        rows += 1 + len(draft)
        if draft:
            d.taken(len(draft), n)
            costs.record(len(draft), n)
            drafted += len(draft)
            kept += n
        if trace:
            print(f"    {i:4d} {rt.tokenizer.decode(answer[i:i + n + 1])!r:32} drafted {len(draft)} kept {n}"
                  f" (kind {d.matched if draft else '-'})")
        tokens += answer[i:i + n + 1]
        i += n + 1
    return (len(answer) - 1) * cost(1), spent, passes, rows, drafted, kept


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    replay_args(ap, "edit,free")
    ap.add_argument("-v", "--verbose", action="store_true", help="every pass of every answer")
    ap.add_argument("--learn", type=float, default=None, metavar="SPREAD",
                    help="the pacing learns the costs, each pass observed slower than it runs by exp(|x|), x normal "
                         "of this spread (0.1: a tenth), summed over several draws")
    ap.add_argument("--row-ms", type=float, default=None,
                    help="with --learn: milliseconds per row of a prompt's chunk (default: measured here)")
    args = ap.parse_args(argv)
    if args.level == "avx2":
        os.environ["BUBO_FORCE_ISA"] = "avx2"  # before the library is loaded

    from bubo.engine import draft as D
    from bubo.llm import Model

    model = Model(args.model, n_ctx=4096, n_threads=args.threads)
    rt = model._loaded.runtime
    cost = target_costs(model, args)

    level = " at the AVX2 level" if args.level == "avx2" else ""
    print(f"### prompt lookup replayed, {args.model}{level}\n")
    print(f"{cpu_name()}, -t {args.threads}; {describe_costs(cost, args)}\n")
    row_s = None
    if args.learn is not None and args.costs and not args.row_ms:
        raise SystemExit("--learn with --costs needs --row-ms: a prompt row's cost on the costs' machine")
    if args.learn is not None:
        row_s = args.row_ms / 1e3 if args.row_ms else chunk_row_cost(model, args.reps)
        print(f"Costs learned: each pass observed with a spread of {args.learn}, a prompt's row {row_s * 1e3:.2f} ms "
              f"({'given' if args.row_ms else f'a chunk of {CHUNK_ROWS}, best of {args.reps}'}); {LEARN_SEEDS} draws "
              "summed.\n")
    print("| task | prompt | tokens | passes | rows checked | drafted tokens kept | speed-up |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    answers = [(task, text, *greedy_answer(model, text, args.max_tokens))
               for task in args.tasks.split(",") for text in TASKS[task]]
    draws = LEARN_SEEDS if row_s is not None else 1
    sums = [[0.0, 0.0, 0, 0, 0, 0] for _ in answers]
    for seed in range(draws):
        # the scheduler's record, over the answers in turn (as one server's)
        costs = D.Costs(row_factor=D.logits_row_factor(rt.native))
        learn = (args.learn, random.Random(seed), row_s) if row_s is not None else None
        for (_, _, prompt, answer), acc in zip(answers, sums):
            got = replay(prompt, answer, rt, costs, cost, args.max_tokens, args.verbose and seed == 0, learn)
            acc[:] = [a + b for a, b in zip(acc, got)]
    summary: dict[str, list[float]] = {}
    for (task, text, _, answer), (p, s, passes, rows, drafted, kept) in zip(answers, sums):
        words = " ".join(text.split()[:5])  # the counts: per draw, on average
        print(f"| {task} | {words} ... | {len(answer)} | {passes / draws:.0f} | {rows / draws:.0f} | "
              f"{kept / draws:.0f}/{drafted / draws:.0f} ({kept / max(drafted, 1):.0%}) | {p / s:.2f}x |")
        total = summary.setdefault(task, [0.0, 0.0])
        total[0], total[1] = total[0] + p, total[1] + s
    print("\n| task | speed-up over its answers |\n| --- | ---: |")
    print("\n".join(f"| {task} | {p / s:.2f}x |" for task, (p, s) in summary.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
