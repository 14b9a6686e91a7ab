"""A draft model replayed: the most its drafts can give on bench_spec's code prompts, counted.

Each prompt's greedy answer comes from the target once without drafting. One pass of the draft
model over prompt and answer gives its greedy guess for every answer token, from the true text
before it (teacher-forced), and the probability of that guess. A draft that starts at token i
keeps its tokens while the guesses agree with the answer, so these guesses give the kept length
of every draft exactly: what a draft says after its first miss is refused anyway. The draft
passes are spent all the same.

Each step then costs k draft passes plus the target's pass of 1 + k rows. The pass costs are
measured in this process (the best of --reps runs; the draft's pass with one row), or given.
Printed per answer, and over all the answers (summed time, as bench_spec sums it):
- the speed-up of drafting a fixed k tokens at every step (k = 1..5);
- that of the draft model's own cut (DraftModel._worth_more, then the best length by the
  drafted tokens' probabilities, as bubo.engine.draft cuts a draft), with hindsight: a step
  whose best cut does not pay drafts nothing, where bubo decides before drafting (by the
  sequence's record) and keeps at least one token; so it is a bound on bubo's policy, a little
  above it.

Nothing but the passes is counted, so this is the ceiling of drafting with these two models on
this machine, which an end-to-end run (bench_spec.py --draft-model) approaches from below.

    python benchmarks/draft_replay.py [--model qwen2.5-coder:1.5b] [--draft-model qwen2.5-coder:0.5b] [--level avx2]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_spec import TASKS  # noqa: E402
from lookup_replay import describe_costs, greedy_answer, replay_args, target_costs  # noqa: E402
from results import cpu_name  # noqa: E402

K_MAX = 5  # the fixed draft lengths weighed


def guesses(draft: Any, prompt: list[int], answer: list[int], n_vocab: int) -> tuple[list[bool], list[float]]:
    """Per answer token: whether the draft's greedy guess from the text before it is that token,
    and the guess's probability (the draft's first n_vocab tokens, as it drafts)."""
    import numpy as np

    from bubo._model import KVCache

    seq = prompt + answer
    kv = KVCache(draft.native, len(seq) + 16, n_seq_max=1)
    want = np.zeros(len(seq), bool)
    want[len(prompt) - 1:-1] = True  # the rows whose next token is an answer token
    logits = np.asarray(draft.native.decode(kv, np.asarray(seq, np.int32), np.arange(len(seq), dtype=np.int32),
                                            np.zeros(len(seq), np.int32), want), dtype=np.float64)[:, :n_vocab]
    best = logits.argmax(axis=1)
    probs = 1.0 / np.exp(logits - logits.max(axis=1, keepdims=True)).sum(axis=1)
    return [int(best[j]) == answer[j] for j in range(len(answer))], [float(x) for x in probs]


def replay(hit: list[bool], prob: list[float], k: int | None, step: Any, draft_s: float) -> float:
    """Seconds for the answer drafted k tokens a step (None: the draft model's own cut)."""
    from bubo.engine.draft import MIN_GAIN, DraftModel

    i, spent = 1, 0.0  # the first token comes from the prompt's pass
    while i < len(hit):
        cap = len(hit) - i - 1
        if k is not None:
            n = best = min(k, cap)
        else:  # as DraftModel.propose: on while more could pay, then the best cut of what was drafted
            chance, gain, n = 1.0, [1.0], 0
            while n < min(cap, 16):
                chance *= prob[i + n]
                gain.append(gain[-1] + chance)
                n += 1
                if not DraftModel._worth_more(gain, step, draft_s):
                    break
            best = max(range(1, n + 1), key=lambda j: gain[j] / (step(j) + n * draft_s), default=0)
            if n and gain[best] / (step(best) + n * draft_s) < MIN_GAIN / step(0):
                n = best = 0  # drafting does not beat the plain step (choose_lengths says no)
        kept = 0
        while kept < best and hit[i + kept]:
            kept += 1
        spent += n * draft_s + step(best)
        i += kept + 1
    return spent


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    replay_args(ap, "code")
    ap.add_argument("--draft-model", default="qwen2.5-coder:0.5b")
    ap.add_argument("--draft-ms", type=float, default=None, help="milliseconds for a pass of the draft model")
    args = ap.parse_args(argv)
    if args.level == "avx2":
        os.environ["BUBO_FORCE_ISA"] = "avx2"  # before the library is loaded

    import numpy as np

    from bubo import store
    from bubo._model import KVCache
    from bubo.engine.draft import DEFAULT_DRAFT, DRAFT_OUT_VOCAB
    from bubo.llm import Model
    from bubo.runtime import Runtime

    model = Model(args.model, n_ctx=4096, n_threads=args.threads)
    rt = model._loaded.runtime
    draft = Runtime(store.resolve(args.draft_model), n_threads=args.threads, requant=DEFAULT_DRAFT.requant)
    draft.native.out_vocab = n_vocab = min(rt.n_vocab, draft.n_vocab, DRAFT_OUT_VOCAB)  # as DraftModel drafts
    cost = target_costs(model, args)
    if args.draft_ms is not None:
        draft_s = args.draft_ms / 1e3
    else:  # one row after a short prompt, the best of reps
        kv = KVCache(draft.native, 1024, n_seq_max=1)
        toks = draft.tokenizer.encode("def add(a, b):\n    return a + b\n" * 8)
        n0 = len(toks)
        draft.native.decode(kv, np.asarray(toks, np.int32), np.arange(n0, dtype=np.int32), np.zeros(n0, np.int32),
                            np.zeros(n0, bool))
        draft_s = float("inf")
        for _ in range(args.reps * 3):
            t0 = time.perf_counter()
            draft.native.decode(kv, np.asarray(toks[:1], np.int32), np.arange(n0, n0 + 1, dtype=np.int32),
                                np.zeros(1, np.int32), np.ones(1, bool))
            draft_s = min(draft_s, time.perf_counter() - t0)
            kv.truncate(0, n0)

    def step(m: int) -> float:  # the target's pass with m drafted rows
        return cost(1 + m)

    level = " at the AVX2 level" if args.level == "avx2" else ""
    print(f"### draft model {args.draft_model} for {args.model}{level}, replayed\n")
    print(f"{cpu_name()}, -t {args.threads}; {describe_costs(cost, args)}; a draft pass {draft_s * 1e3:.1f} ms "
          f"({'given' if args.draft_ms is not None else 'measured'})\n")
    head = " | ".join(f"k = {k}" for k in range(1, K_MAX + 1))
    print(f"| task | prompt | tokens | guesses right | {head} | the draft's own cut (a bound) |")
    print("| --- | --- | ---: | ---: |" + " ---: |" * (K_MAX + 1))
    for task in args.tasks.split(","):
        plain_s, spent = 0.0, [0.0] * (K_MAX + 1)
        for text in TASKS[task]:
            prompt, answer = greedy_answer(model, text, args.max_tokens)
            hit, prob = guesses(draft, prompt, answer, n_vocab)
            p = (len(hit) - 1) * step(0)
            plain_s += p
            row = []
            for j, k in enumerate([*range(1, K_MAX + 1), None]):
                s = replay(hit, prob, k, step, draft_s)
                spent[j] += s
                row.append(f"{p / s:.2f}x" if s else "-")
            words = " ".join(text.split()[:5])
            right = sum(hit[1:]) / max(len(hit) - 1, 1)  # (the first token comes from the prompt's pass)
            print(f"| {task} | {words} ... | {len(hit)} | {right:.0%} | {' | '.join(row)} |")
        print(f"| {task} | all | | | {' | '.join(f'**{plain_s / s:.2f}x**' for s in spent[:K_MAX + 1])} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
