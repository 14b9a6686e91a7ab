#!/usr/bin/env python3
"""Prompt processing against the machine's int8 peak: how many of the multiply-adds the CPU's
int8 dot-product units can do per second does a pp512 reach?

    python benchmarks/prefill_peak.py -m smollm2:135m -t 2
    python benchmarks/prefill_peak.py -m smollm2:135m --llama-bench /tmp/llama-build2/bin/llama-bench

1. The peak. A small C loop, compiled here with the system's cc, runs 12 independent VNNI dot
   products (vpdpbusd on 512-bit registers: 64 int8 multiply-adds each) per iteration on each of
   -t threads for about a second; peak = multiply-adds / wall time, all threads together. (No
   memory is touched: it is the arithmetic ceiling, not a figure any matrix product reaches.)
   On a CPU without AVX-512 VNNI whose best is AVX2, the loop's multiply-add is AVX2's: vpmaddubsw
   (32 int8 products summed in pairs to int16) then vpaddw into the accumulator, the two
   instructions that the AVX2 tiles spend on 32 multiply-adds; elsewhere the script says so and
   stops.
2. The work of a prompt token: the multiply-adds of every weight matrix of every layer (the
   products a prompt's tokens go through; the output matrix is left out, since pp512 computes the
   logits of the last token only, as llama-bench does), counted from the GGUF's tensor shapes.
   Attention's own products (scores and the weighted V sum over the ~256 positions a pp512 token
   sees on average) are f32 work and are printed beside it, not counted in the fraction.
3. pp512 of `bubo bench` (and of llama-bench when --llama-bench names one), -r repetitions:
   int8 multiply-adds per second = t/s x matrix multiply-adds per token; fraction = that / peak.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

PEAK_C = r"""
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static long iters;
static volatile int sink;

/* twelve accumulators named one by one, so that they stay in registers */
#define DP(x) x = _mm512_dpbusd_epi32(x, a, b)
__attribute__((target("avx512f,avx512vnni"))) static void *run(void *arg) {
    const __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(-5);
    __m512i c0 = _mm512_set1_epi32(0), c1 = _mm512_set1_epi32(1), c2 = _mm512_set1_epi32(2),
            c3 = _mm512_set1_epi32(3), c4 = _mm512_set1_epi32(4), c5 = _mm512_set1_epi32(5),
            c6 = _mm512_set1_epi32(6), c7 = _mm512_set1_epi32(7), c8 = _mm512_set1_epi32(8),
            c9 = _mm512_set1_epi32(9), c10 = _mm512_set1_epi32(10), c11 = _mm512_set1_epi32(11);
    for (long n = 0; n < iters; n++) {
        DP(c0); DP(c1); DP(c2); DP(c3); DP(c4); DP(c5); DP(c6); DP(c7); DP(c8); DP(c9); DP(c10); DP(c11);
    }
    __m512i s = _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(c0, c1), _mm512_add_epi32(c2, c3)),
                                 _mm512_add_epi32(_mm512_add_epi32(c4, c5), _mm512_add_epi32(c6, c7)));
    s = _mm512_add_epi32(s, _mm512_add_epi32(_mm512_add_epi32(c8, c9), _mm512_add_epi32(c10, c11)));
    sink = _mm512_reduce_add_epi32(s);
    (void)arg;
    return NULL;
}

/* AVX2 (no VNNI): vpmaddubsw + vpaddw, 32 multiply-adds into int16 accumulators */
#define MA(x) x = _mm256_add_epi16(x, _mm256_maddubs_epi16(a, b))
__attribute__((target("avx2"))) static void *run_avx2(void *arg) {
    const __m256i a = _mm256_set1_epi8(3), b = _mm256_set1_epi8(-5);
    __m256i c0 = _mm256_set1_epi16(0), c1 = _mm256_set1_epi16(1), c2 = _mm256_set1_epi16(2),
            c3 = _mm256_set1_epi16(3), c4 = _mm256_set1_epi16(4), c5 = _mm256_set1_epi16(5),
            c6 = _mm256_set1_epi16(6), c7 = _mm256_set1_epi16(7), c8 = _mm256_set1_epi16(8),
            c9 = _mm256_set1_epi16(9), c10 = _mm256_set1_epi16(10), c11 = _mm256_set1_epi16(11);
    for (long n = 0; n < iters; n++) {
        MA(c0); MA(c1); MA(c2); MA(c3); MA(c4); MA(c5); MA(c6); MA(c7); MA(c8); MA(c9); MA(c10); MA(c11);
    }
    __m256i s = _mm256_add_epi16(_mm256_add_epi16(_mm256_add_epi16(c0, c1), _mm256_add_epi16(c2, c3)),
                                 _mm256_add_epi16(_mm256_add_epi16(c4, c5), _mm256_add_epi16(c6, c7)));
    s = _mm256_add_epi16(s, _mm256_add_epi16(_mm256_add_epi16(c8, c9), _mm256_add_epi16(c10, c11)));
    sink = _mm256_extract_epi16(s, 0);
    (void)arg;
    return NULL;
}

int main(int argc, char **argv) {
    const int n_threads = atoi(argv[1]);
    iters = atol(argv[2]);
    const int avx2 = argc > 3 && argv[3][0] == 'a'; /* "avx2": the AVX2 loop, 32 multiply-adds a step */
    pthread_t th[256];
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < n_threads; i++) pthread_create(&th[i], NULL, avx2 ? run_avx2 : run, NULL);
    for (int i = 0; i < n_threads; i++) pthread_join(th[i], NULL);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    const double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    printf("%.6f\n", (double)n_threads * (double)iters * 12.0 * (avx2 ? 32.0 : 64.0) / s);
    return 0;
}
"""


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def peak_level() -> str | None:
    """"vnni" (AVX-512 VNNI), "avx2", or None: the int8 multiply-add the peak loop runs here."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    if " avx512_vnni" in flags and " avx512f" in flags:
        return "vnni"
    return "avx2" if " avx2" in flags else None


PEAK_NAMES = {"vnni": "vpdpbusd", "avx2": "vpmaddubsw + vpaddw"}


def int8_peak(n_threads: int, level: str, repeats: int = 3) -> float:
    """int8 multiply-adds per second of n_threads threads of the level's multiply-add loop (the
    best of a few runs)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise SystemExit("prefill_peak: no C compiler (cc) to build the peak loop")
    with tempfile.TemporaryDirectory() as d:
        src, exe = Path(d) / "peak.c", Path(d) / "peak"
        src.write_text(PEAK_C)
        subprocess.run([cc, "-O2", "-pthread", str(src), "-o", str(exe)], check=True)
        iters, width = 1_000_000, 64 if level == "vnni" else 32
        while True:  # about a second per run
            rate = float(subprocess.run([str(exe), str(n_threads), str(iters), level], capture_output=True,
                                        text=True, check=True).stdout)
            if n_threads * iters * 12 * width / rate > 0.5:
                break
            iters *= 4
        return max(float(subprocess.run([str(exe), str(n_threads), str(iters), level], capture_output=True,
                                         text=True, check=True).stdout) for _ in range(repeats))


def matrix_macs(model: Path) -> tuple[int, int, dict[str, int]]:
    """(multiply-adds per token of the layers' weight matrices, of attention at pp512, metadata)."""
    from bubo.gguf import GGUFFile

    with GGUFFile(model) as f:
        md = f.metadata
        arch = str(md["general.architecture"])
        macs = 0
        for t in f.tensors:
            if t.name.startswith("blk.") and t.name.endswith(".weight") and len(t.shape) == 2 and min(t.shape) > 1:
                macs += t.shape[0] * t.shape[1]
        n_layer = int(md[f"{arch}.block_count"])
        n_head = int(md[f"{arch}.attention.head_count"])
        n_embd = int(md[f"{arch}.embedding_length"])
        hdk = int(md.get(f"{arch}.attention.key_length", n_embd // n_head))
        hdv = int(md.get(f"{arch}.attention.value_length", hdk))
    attn = n_layer * n_head * (hdk + hdv) * (512 + 1) // 2
    return macs, attn, {"n_layer": n_layer, "n_head": n_head, "n_embd": n_embd}


def bubo_pp(model: Path, threads: int, reps: int) -> float:
    out = subprocess.run([sys.executable, "-m", "bubo", "bench", "-m", str(model), "-p", "512", "-n", "0",
                          "-t", str(threads), "-r", str(reps), "-o", "json"], capture_output=True, text=True,
                         check=True, env=dict(os.environ, SKBUILD_EDITABLE_VERBOSE="0"))
    return float(json.loads(out.stdout)[0]["avg_ts"])


def llama_pp(exe: Path, model: Path, threads: int, reps: int) -> float:
    out = subprocess.run([str(exe), "-m", str(model), "-p", "512", "-n", "0", "-t", str(threads), "-r", str(reps),
                          "-o", "json"], capture_output=True, text=True, check=True)
    return float(json.loads(out.stdout)[0]["avg_ts"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default="smollm2:135m", help="catalog name or GGUF path")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--repetitions", type=int, default=3)
    ap.add_argument("--llama-bench", type=Path, default=None, help="also measure this llama-bench")
    args = ap.parse_args(argv)
    if args.threads < 1 or args.repetitions < 1:
        ap.error("-t and -r must be positive")
    level = peak_level()
    if level is None:
        print("prefill_peak: this CPU has neither AVX-512 VNNI nor AVX2; the peak loop needs one", file=sys.stderr)
        return 2
    from bubo import store

    model = store.resolve(args.model)
    macs, attn, hp = matrix_macs(model)
    peak = int8_peak(args.threads, level)
    rows = [("bubo", bubo_pp(model, args.threads, args.repetitions))]
    if args.llama_bench:
        rows.append(("llama.cpp", llama_pp(args.llama_bench, model, args.threads, args.repetitions)))
    print(f"## pp512 against the int8 peak: {args.model} ({model.name}), {args.threads} threads, {cpu_name()}\n")
    print(f"int8 peak ({PEAK_NAMES[level]}, {args.threads} threads): {peak / 1e9:.1f} G multiply-adds/s")
    print(f"weight matrices: {macs / 1e6:.1f} M multiply-adds per token ({hp['n_layer']} layers, "
          f"n_embd {hp['n_embd']}); attention at pp512: {attn / 1e6:.1f} M (f32, not counted)\n")
    print("| engine | pp512 t/s | int8 G multiply-adds/s | of the peak |")
    print("| --- | ---: | ---: | ---: |")
    for who, tps in rows:
        print(f"| {who} | {tps:.1f} | {tps * macs / 1e9:.1f} | {100 * tps * macs / peak:.1f}% |")
    if len(rows) == 2:
        print(f"\nbubo / llama.cpp: {rows[0][1] / rows[1][1]:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
