#!/usr/bin/env python3
"""Prepacked weights against weights in place, side by side in one run.

    python benchmarks/prepack.py                  # matmuls per type, then the three catalog models
    python benchmarks/prepack.py --skip-models    # the matmuls only

1. Matmuls: for each type that has prepacked kernels on this CPU (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and
   Q4_K on AVX-512), enough copies of a [rows, cols] matrix (cols rounded up to whole blocks) to spill the caches
   (--mib of weights), each multiplied by 1 and by 4 tokens (a decode step of 1 and 4 sequences) with 2 threads,
   in place (bubo_matmul) and prepacked (bubo_matmul_prepacked), alternating, best of --rounds: microseconds
   per matrix and the ratio in place / prepacked (above 1: packing helps).
2. Models: `python -m bubo bench -p 512 -n 128` on each catalog model with BUBO_NO_PREPACK=1 and
   without, alternating round by round, median over --rounds: tokens per second and the ratio
   prepacked / in place (above 1: packing helps).
3. Server under steady load (--steady-s seconds per point, 0 skips it): `python -m bubo serve -np 4
   -c 16384 -t 2` on each model, packed and in place; 1 and 4 client threads each stream 128-token
   /completion answers (greedy, ignore_eos) back to back: generated tokens per second over the
   window, and 4 clients against 1.

The outputs are the same bits either way (tests/native/test_prepacked.py); only the time differs.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "native"))

from gguf import GGMLQuantizationType as GT  # noqa: E402

from bubo import _ops  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_serve  # noqa: E402  (its server process and /completion client)

TYPES = [GT.Q4_0, GT.Q4_1, GT.Q5_0, GT.Q5_1, GT.Q8_0, GT.Q4_K, GT.Q6_K]
MODELS = ["smollm2:135m", "gemma3:270m", "qwen2.5-coder:0.5b"]


def matmuls(rows: int, cols_wanted: int, mib: int, rounds: int) -> None:
    from blocks import realistic_rows

    pool = _ops.ThreadPool(2)
    rng = np.random.default_rng(0)
    print(f"### matmuls: [{rows}, {cols_wanted}], {mib} MiB of copies, 2 threads, best of {rounds}\n")
    print("| type | cols | tokens | in place us | prepacked us | in place / prepacked |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for t in TYPES:
        blck = 256 if t in (GT.Q4_K, GT.Q6_K) else 32
        cols = -(-cols_wanted // blck) * blck
        base = np.ascontiguousarray(realistic_rows(t, rows, cols, 1)).view(np.uint8).reshape(-1)
        if _ops.prepack(int(t), base, rows, cols) is None:
            print(f"| {t.name} | {cols} | - | - | - | no prepacked kernels on this CPU |")
            continue
        copies = max(1, mib * (1 << 20) // base.nbytes)
        inplace = [base.copy() for _ in range(copies)]
        packed = [_ops.prepack(int(t), w, rows, cols) for w in inplace]
        for n in (1, 2, 4, 5, 8):
            x = rng.standard_normal((n, cols)).astype(np.float32)
            best = {False: float("inf"), True: float("inf")}
            for _ in range(rounds):
                for mode, mats in ((False, inplace), (True, packed)):
                    t0 = time.perf_counter()
                    for w in mats:
                        _ops.matmul(pool, int(t), w, rows, cols, x, prepacked=mode)
                    best[mode] = min(best[mode], (time.perf_counter() - t0) / len(mats) * 1e6)
            print(f"| {t.name} | {cols} | {n} | {best[False]:.1f} | {best[True]:.1f} | "
                  f"{best[False] / best[True]:.2f}x |")
    print()


def bench(model: str, packed: bool, n_prompt: int, n_gen: int) -> dict[str, float]:
    env = {**os.environ, "BUBO_NO_PREPACK": "0" if packed else "1"}
    out = subprocess.run([sys.executable, "-m", "bubo", "bench", "-m", model, "-p", str(n_prompt), "-n", str(n_gen),
                          "-t", "2", "-r", "3"], env=env, capture_output=True, text=True, check=True).stdout
    res = {}
    for line in out.splitlines():
        m = re.search(r"\|\s*((?:pp|tg)\d+)\s*\|\s*([\d.]+)", line)
        if m:
            res[m.group(1)] = float(m.group(2))
    return res


def models(names: list[str], rounds: int, n_prompt: int, n_gen: int) -> None:
    print(f"### models: bubo bench -p {n_prompt} -n {n_gen} -t 2, median of {rounds} rounds, alternating\n")
    print("| model | test | in place t/s | prepacked t/s | prepacked / in place |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name in names:
        runs: dict[bool, list[dict[str, float]]] = {False: [], True: []}
        for _ in range(rounds):
            for packed in (False, True):
                runs[packed].append(bench(name, packed, n_prompt, n_gen))
        for test in runs[True][0]:
            a = statistics.median(r[test] for r in runs[False])
            b = statistics.median(r[test] for r in runs[True])
            print(f"| {name} | {test} | {a:.2f} | {b:.2f} | {b / a:.2f}x |")
    print()


def steady(model: str, packed: bool, n_clients: int, seconds: float) -> float:
    """Generated tokens per second of n_clients streaming 128-token answers back to back."""
    from bubo import store

    path = store.pull(model)
    port = bench_serve.free_port()
    cmd = [sys.executable, "-m", "bubo", "serve", "-m", str(path), "--host", bench_serve.HOST, "--port", str(port),
           "-c", "16384", "-t", "2", "-np", "4"]
    os.environ["BUBO_NO_PREPACK"] = "0" if packed else "1"  # the server process inherits it
    try:
        with bench_serve.Server("bubo", cmd, port):
            bench_serve.completion(port, "Warm up.", 8)
            done = [0] * n_clients
            stop_at = time.perf_counter() + seconds

            def client(i: int) -> None:
                k = 0
                while time.perf_counter() < stop_at:
                    done[i] += bench_serve.completion(port, bench_serve.client_prompt(1000 * i + k), 128).n_tokens
                    k += 1

            t0 = time.perf_counter()
            threads = [threading.Thread(target=client, args=(i,)) for i in range(n_clients)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            return sum(done) / (time.perf_counter() - t0)
    finally:
        os.environ.pop("BUBO_NO_PREPACK", None)


def servers(names: list[str], seconds: float) -> None:
    print(f"### server under steady load: -np 4, 128-token answers back to back, {seconds:.0f} s a point\n")
    print("| model | in place 1 | prepacked 1 | in place 4 | prepacked 4 | 4 / 1 clients, prepacked |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name in names:
        r = {(packed, n): steady(name, packed, n, seconds) for packed in (False, True) for n in (1, 4)}
        print(f"| {name} | {r[False, 1]:.1f} | {r[True, 1]:.1f} | {r[False, 4]:.1f} | {r[True, 4]:.1f} | "
              f"{r[True, 4] / r[True, 1]:.2f}x |")
    print()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--save", action="store_true",
                    help="also write the tables to benchmarks/results/ (benchmarks/report.py makes docs/benchmarks.md)")
    ap.add_argument("--rows", type=int, default=2048)
    ap.add_argument("--cols", type=int, default=640)
    ap.add_argument("--mib", type=int, default=96, help="weights per type, so that they come from DRAM")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-m", "--models", default=",".join(MODELS))
    ap.add_argument("-p", "--n-prompt", type=int, default=512)
    ap.add_argument("-n", "--n-gen", type=int, default=128)
    ap.add_argument("--skip-models", action="store_true")
    ap.add_argument("--steady-s", type=float, default=10.0, help="seconds per server point (0: no server part)")
    args = ap.parse_args()
    matmuls(args.rows, args.cols, args.mib, args.rounds)
    names = [m for m in args.models.split(",") if m]
    if not args.skip_models:
        models(names, args.rounds, args.n_prompt, args.n_gen)
        if args.steady_s > 0:
            servers(names, args.steady_s)


if __name__ == "__main__":
    import results

    with results.saving("prepack", "--save" in sys.argv[1:]):
        code = main()
    raise SystemExit(code)
