#!/usr/bin/env python3
"""Tokenizer throughput per catalog model: MB/s of English text through Tokenizer.encode (one
thread, the GIL released inside), and of the ids back through decode and the streaming
detokenizer.

    python benchmarks/tokenizer.py [--mb 1] [--models smollm2:135m,gemma3:270m,...]

The text is the license texts under /usr/share/common-licenses (plain English prose), repeated
to the size asked; where that folder is missing, seeded pseudo-English from a word list."""

from __future__ import annotations

import argparse
import pathlib
import random
import time

from bubo import store
from bubo._tokenizer import Tokenizer

WORDS = ("the of and to in is that it for as with was on be by this are or his from at which but have an "
         "they not were one all their you had we there can been has more when will would who so no other "
         "time people into only some could them than first may then way like new also its use two these "
         "language model token text number world system program data between each those through under").split()


def english(n_bytes: int) -> str:
    licenses = pathlib.Path("/usr/share/common-licenses")
    parts = []
    if licenses.is_dir():
        for f in sorted(licenses.iterdir()):
            if f.is_file():
                parts.append(f.read_text("utf-8", "replace"))
    if parts:
        text = "\n\n".join(parts)
    else:
        rng = random.Random(0)
        sentences = []
        for _ in range(n_bytes // 40 + 1):
            words = [rng.choice(WORDS) for _ in range(rng.randint(4, 14))]
            sentences.append(" ".join(words).capitalize() + rng.choice(".,;!?"))
        text = " ".join(sentences)
    while len(text.encode()) < n_bytes:
        text += "\n" + text
    return text.encode()[:n_bytes].decode("utf-8", "ignore")


def best_of(n: int, f) -> float:
    best = float("inf")
    for _ in range(n):
        t0 = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=float, default=1.0, help="megabytes of text (default 1)")
    ap.add_argument("--models", default=",".join(store.CATALOG), help="comma-separated catalog names")
    ap.add_argument("--repeat", type=int, default=3, help="best of this many runs")
    args = ap.parse_args()

    text = english(int(args.mb * 1e6))
    mb = len(text.encode()) / 1e6
    print(f"{mb:.2f} MB of English text")
    print(f"{'model':22} {'tokens':>9} {'encode MB/s':>12} {'decode MB/s':>12} {'stream MB/s':>12}")
    for name in args.models.split(","):
        tok = Tokenizer(store.pull(name))
        ids = tok.encode(text, add_special=False)
        t_enc = best_of(args.repeat, lambda: tok.encode(text, add_special=False))
        t_dec = best_of(args.repeat, lambda: tok.decode(ids))

        def stream():
            d = tok.detokenizer()
            for i in ids:
                d.feed(i)
            d.flush()

        t_stream = best_of(1, stream)
        print(f"{name:22} {len(ids):9d} {mb / t_enc:12.1f} {mb / t_dec:12.1f} {mb / t_stream:12.1f}")


if __name__ == "__main__":
    main()
