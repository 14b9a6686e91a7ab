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
   A shared VM's speed moves by half within seconds, and only ever down (another tenant's work
   slows ours; nothing makes it faster than the hardware), so the script runs --rounds rounds of
   (the loops, then the pp512s), prints every round, and takes the best of all rounds for each
   figure: each loop's best run, each engine's best repetition. Those are the figures least
   disturbed, the nearest to what the hardware does undisturbed.
4. The ceiling (AVX-512 VNNI machines): what a pp512 could reach here at most while its results
   stay as they are. Two more loops without memory, run in each round beside the peak loop:
   - a Q4_1 block as the prompt tile computes it for 16 rows and one token: 8 vpdpbusd (its 32
     products per row, exact), then the float steps of the block formula that every Q4_1 and Q5_1
     kernel shares (and batch invariance rests on): the sum converted, the weight and activation
     scales multiplied, a fused multiply-add of the two, one of the block minimum's term; eight
     tokens in flight, the tokens' scales broadcast from memory as the tile reads them;
   - f32 fused multiply-adds, twelve chains (attention's scores and V sums are f32 work).
   For a model whose matrices are all Q4_1/Q5_1 (smollm2:135m), the bound: a token's matrix
   multiply-adds at the Q4_1 loop's rate plus its attention multiply-adds at the FMA loop's,
   with nothing else (norms, RoPE, activation quantization, SwiGLU, memory, threads' waits) taking
   any time. The float steps are 4 per 8 vpdpbusd whichever order they run in (the scales' product
   varies with row, token and block; the minimum's term is one fused multiply-add per block), so
   a faster kernel needs a different formula, that is, different results.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))

from results import cpu_name  # noqa: E402

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

/* f32 fused multiply-adds on 512-bit registers: 16 multiply-adds each, twelve chains */
#define FM(x) x = _mm512_fmadd_ps(x, fa, fb)
__attribute__((target("avx512f"))) static void *run_fma(void *arg) {
    const __m512 fa = _mm512_set1_ps(0.999f), fb = _mm512_set1_ps(1e-3f);
    __m512 c0 = _mm512_set1_ps(0), c1 = _mm512_set1_ps(1), c2 = _mm512_set1_ps(2), c3 = _mm512_set1_ps(3),
           c4 = _mm512_set1_ps(4), c5 = _mm512_set1_ps(5), c6 = _mm512_set1_ps(6), c7 = _mm512_set1_ps(7),
           c8 = _mm512_set1_ps(8), c9 = _mm512_set1_ps(9), c10 = _mm512_set1_ps(10), c11 = _mm512_set1_ps(11);
    for (long n = 0; n < iters; n++) {
        FM(c0); FM(c1); FM(c2); FM(c3); FM(c4); FM(c5); FM(c6); FM(c7); FM(c8); FM(c9); FM(c10); FM(c11);
    }
    __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(c0, c1), _mm512_add_ps(c2, c3)),
                             _mm512_add_ps(_mm512_add_ps(c4, c5), _mm512_add_ps(c6, c7)));
    s = _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(c8, c9), _mm512_add_ps(c10, c11)));
    sink = (int)_mm512_reduce_add_ps(s);
    (void)arg;
    return NULL;
}

/* The instructions a Q4_1 (or Q5_1) block costs the prompt tile, for 16 rows and one token, with
 * no memory but the tokens' scales (broadcast from an array, as the tile reads them): 8 vpdpbusd
 * summing its 32 products per row exactly (a chain from zero), then the float steps every kernel
 * of the type shares: the sum converted, the two scales multiplied, one fused multiply-add of the
 * sum and one of the block minimum's term. Eight tokens in flight, as in the tile. Counted: 512
 * multiply-adds per (block, token). */
#define BLOCK(t) do { \
        __m512i i = _mm512_dpbusd_epi32(_mm512_setzero_si512(), a, b##t); \
        i = _mm512_dpbusd_epi32(i, a, b##t); i = _mm512_dpbusd_epi32(i, a, b##t); \
        i = _mm512_dpbusd_epi32(i, a, b##t); i = _mm512_dpbusd_epi32(i, a, b##t); \
        i = _mm512_dpbusd_epi32(i, a, b##t); i = _mm512_dpbusd_epi32(i, a, b##t); \
        i = _mm512_dpbusd_epi32(i, a, b##t); \
        y##t = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), _mm512_mul_ps(dw, _mm512_set1_ps(scale[t])), y##t); \
        y##t = _mm512_fmadd_ps(mw, _mm512_set1_ps(scale[8 + t]), y##t); \
    } while (0)
__attribute__((target("avx512f,avx512vnni"))) static void *run_q4_1(void *arg) {
    /* a: the weights (one register for the 8 tokens); b0 .. b7: each token's quants */
    __m512i a = _mm512_set1_epi8(3), b0 = _mm512_set1_epi8(-5), b1 = _mm512_set1_epi8(-4),
            b2 = _mm512_set1_epi8(-3), b3 = _mm512_set1_epi8(-2), b4 = _mm512_set1_epi8(-1),
            b5 = _mm512_set1_epi8(1), b6 = _mm512_set1_epi8(2), b7 = _mm512_set1_epi8(4);
    __m512 dw = _mm512_set1_ps(1e-3f), mw = _mm512_set1_ps(-1e-3f);
    float scale[16]; /* each token's block scale and its quants' sum times it, broadcast from memory as in the tile */
    for (int t = 0; t < 16; t++) scale[t] = 1e-3f * (float)(t + 1);
    __m512 y0 = _mm512_setzero_ps(), y1 = y0, y2 = y0, y3 = y0, y4 = y0, y5 = y0, y6 = y0, y7 = y0;
    for (long n = 0; n < iters; n++) {
        /* new quants and scales each step, as a tile's blocks have: nothing is hoisted or shared */
        __asm__ volatile("" : "+v"(a), "+v"(b0), "+v"(b1), "+v"(b2), "+v"(b3));
        __asm__ volatile("" : "+v"(b4), "+v"(b5), "+v"(b6), "+v"(b7), "+v"(dw), "+v"(mw) : : "memory");
        BLOCK(0); BLOCK(1); BLOCK(2); BLOCK(3); BLOCK(4); BLOCK(5); BLOCK(6); BLOCK(7);
    }
    __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(y0, y1), _mm512_add_ps(y2, y3)),
                             _mm512_add_ps(_mm512_add_ps(y4, y5), _mm512_add_ps(y6, y7)));
    sink = (int)_mm512_reduce_add_ps(s);
    (void)arg;
    return NULL;
}

int main(int argc, char **argv) {
    const int n_threads = atoi(argv[1]);
    iters = atol(argv[2]);
    /* argv[3]: vnni (default), avx2 (32 multiply-adds a step), fma (f32), q4_1 (the block's mix) */
    const char mode = argc > 3 ? argv[3][0] : 'v';
    void *(*fn)(void *) = mode == 'a' ? run_avx2 : mode == 'f' ? run_fma : mode == 'q' ? run_q4_1 : run;
    const double per_step = mode == 'a' ? 12.0 * 32 : mode == 'f' ? 12.0 * 16 : mode == 'q' ? 8.0 * 512 : 12.0 * 64;
    pthread_t th[256];
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < n_threads; i++) pthread_create(&th[i], NULL, fn, NULL);
    for (int i = 0; i < n_threads; i++) pthread_join(th[i], NULL);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    const double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    printf("%.6f %.6f\n", (double)n_threads * (double)iters * per_step / s, s); /* multiply-adds/s, seconds */
    return 0;
}
"""


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


class Loops:
    """The PEAK_C loops, built once; rates() runs each mode once for about half a second (the
    iteration counts found at the start) and returns multiply-adds per second, all threads."""

    def __init__(self, n_threads: int, modes: list[str]):
        cc = shutil.which("cc") or shutil.which("gcc")
        if cc is None:
            raise SystemExit("prefill_peak: no C compiler (cc) to build the peak loop")
        self.dir = tempfile.TemporaryDirectory()
        src, self.exe = Path(self.dir.name) / "peak.c", Path(self.dir.name) / "peak"
        src.write_text(PEAK_C)
        subprocess.run([cc, "-O2", "-pthread", str(src), "-o", str(self.exe)], check=True)
        self.n_threads, self.steps = n_threads, {}
        for mode in modes:
            iters = 100_000
            while self.run(mode, iters)[1] < 0.5:
                iters *= 4
            self.steps[mode] = iters

    def run(self, mode: str, iters: int) -> tuple[float, float]:
        rate, seconds = subprocess.run([str(self.exe), str(self.n_threads), str(iters), mode], capture_output=True,
                                       text=True, check=True).stdout.split()
        return float(rate), float(seconds)

    def rates(self) -> dict[str, float]:
        return {mode: self.run(mode, iters)[0] for mode, iters in self.steps.items()}


def matrix_macs(model: Path) -> tuple[int, int, dict[str, int]]:
    """(multiply-adds per token of the layers' weight matrices, of attention at pp512, metadata:
    also "with_min", the matrices' multiply-adds of types with a block minimum, Q4_1 and Q5_1)."""
    from bubo.gguf import GGUFFile

    with GGUFFile(model) as f:
        md = f.metadata
        arch = str(md["general.architecture"])
        macs = with_min = 0
        for t in f.tensors:
            if t.name.startswith("blk.") and t.name.endswith(".weight") and len(t.shape) == 2 and min(t.shape) > 1:
                macs += t.shape[0] * t.shape[1]
                if t.type_name in ("q4_1", "q5_1"):
                    with_min += t.shape[0] * t.shape[1]
        n_layer = int(md[f"{arch}.block_count"])
        n_head = int(md[f"{arch}.attention.head_count"])
        n_embd = int(md[f"{arch}.embedding_length"])
        hdk = int(md.get(f"{arch}.attention.key_length", n_embd // n_head))
        hdv = int(md.get(f"{arch}.attention.value_length", hdk))
    attn = n_layer * n_head * (hdk + hdv) * (512 + 1) // 2
    return macs, attn, {"n_layer": n_layer, "n_head": n_head, "n_embd": n_embd, "with_min": with_min}


def bubo_pp(model: Path, threads: int, reps: int) -> float:
    out = subprocess.run([sys.executable, "-m", "bubo", "bench", "-m", str(model), "-p", "512", "-n", "0",
                          "-t", str(threads), "-r", str(reps), "-o", "json"], capture_output=True, text=True,
                         check=True, env=dict(os.environ, SKBUILD_EDITABLE_VERBOSE="0"))
    return max(json.loads(out.stdout)[0]["samples_ts"])


def llama_pp(exe: Path, model: Path, threads: int, reps: int) -> float:
    out = subprocess.run([str(exe), "-m", str(model), "-p", "512", "-n", "0", "-t", str(threads), "-r", str(reps),
                          "-o", "json"], capture_output=True, text=True, check=True)
    return max(json.loads(out.stdout)[0]["samples_ts"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--save", action="store_true",
                    help="also write the tables to benchmarks/results/ (benchmarks/report.py makes docs/benchmarks.md)")
    ap.add_argument("-m", "--model", default="smollm2:135m", help="catalog name or GGUF path")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--repetitions", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=5,
                    help="rounds of (the loops, then each engine's pp512); each figure is the best of all rounds")
    ap.add_argument("--llama-bench", type=Path, default=None, help="also measure this llama-bench")
    args = ap.parse_args(argv)
    if args.threads < 1 or args.repetitions < 1 or args.rounds < 1:
        ap.error("-t, -r and --rounds must be positive")
    level = peak_level()
    if level is None:
        print("prefill_peak: this CPU has neither AVX-512 VNNI nor AVX2; the peak loop needs one", file=sys.stderr)
        return 2
    from bubo import store

    model = store.resolve(args.model)
    macs, attn, hp = matrix_macs(model)
    modes = [level, "q4_1", "fma"] if level == "vnni" else [level]
    loops = Loops(args.threads, modes)
    engines = ["bubo"] + (["llama.cpp"] if args.llama_bench else [])
    rounds: list[tuple[dict[str, float], dict[str, float]]] = []
    for _ in range(args.rounds):
        rates = loops.rates()
        tps = {"bubo": bubo_pp(model, args.threads, args.repetitions)}
        if args.llama_bench:
            tps["llama.cpp"] = llama_pp(args.llama_bench, model, args.threads, args.repetitions)
        rounds.append((rates, tps))
    print(f"## pp512 against the int8 peak: {args.model} ({model.name}), {args.threads} threads, {cpu_name()}\n")
    print(f"weight matrices: {macs / 1e6:.1f} M multiply-adds per token ({hp['n_layer']} layers, "
          f"n_embd {hp['n_embd']}); attention at pp512: {attn / 1e6:.1f} M (f32, not counted)\n")
    print(f"### pp512 against the int8 peak, {args.model}: rounds\n")
    print(f"{args.rounds} rounds of the loops, then the pp512s (each engine's best of -r {args.repetitions}); "
          "G multiply-adds/s, t/s:\n")
    print("| round | " + " | ".join(modes) + " | " + " | ".join(engines) + " |")
    print("| ---: | " + " | ".join("---:" for _ in modes + engines) + " |")
    for i, (rates, tps) in enumerate(rounds, 1):
        print(f"| {i} | " + " | ".join(f"{rates[m] / 1e9:.1f}" for m in modes) + " | " +
              " | ".join(f"{tps[e]:.1f}" for e in engines) + " |")
    best = {m: max(r[m] for r, _ in rounds) for m in modes}
    best_tps = {e: max(t[e] for _, t in rounds) for e in engines}
    peak = best[level]
    print(f"\n### pp512 against the int8 peak, {args.model}\n")
    print(f"The best of every round: int8 peak ({PEAK_NAMES[level]}, {args.threads} threads) "
          f"{peak / 1e9:.1f} G multiply-adds/s\n")
    print("| engine | pp512 t/s | int8 G multiply-adds/s | of the peak |")
    print("| --- | ---: | ---: | ---: |")
    for e in engines:
        print(f"| {e} | {best_tps[e]:.1f} | {best_tps[e] * macs / 1e9:.1f} | {100 * best_tps[e] * macs / peak:.1f}% |")
    if args.llama_bench:
        print(f"\nbubo / llama.cpp: {best_tps['bubo'] / best_tps['llama.cpp']:.2f}x")
    if level == "vnni":
        print_ceiling(macs, attn, hp["with_min"], peak, best["q4_1"], best["fma"], args.threads, args.model)
        if hp["with_min"] == macs:
            c = ceiling_fraction(macs, attn, peak, best["q4_1"], best["fma"])
            print(f"\nbubo's pp512 is {100 * best_tps['bubo'] * macs / peak / c:.1f}% of that ceiling.")
    return 0


def ceiling_fraction(macs: int, attn: int, peak: float, mix: float, fma: float) -> float:
    """The ceiling's share of the int8 peak: the matrices at the Q4_1 block's rate and attention at
    the FMA peak, nothing else taking any time."""
    return macs / (macs / mix + attn / fma) / peak


def print_ceiling(macs: int, attn: int, with_min: int, peak: float, mix: float, fma: float, threads: int,
                  model: str) -> None:
    """The most a pp512 can reach here without changing its results: the matrices at their block
    formula's instruction-mix ceiling (measured by the q4_1 loop) and attention's f32 work at the
    FMA peak, nothing else taking any time."""
    print(f"\n### the ceiling: loops without memory, {model}\n")
    print(f"The best of every round, {threads} threads:\n")
    print("| loop | G multiply-adds/s | of the int8 peak |")
    print("| --- | ---: | ---: |")
    print(f"| vpdpbusd alone (the int8 peak) | {peak / 1e9:.1f} | 100.0% |")
    print(f"| a Q4_1 block: 8 vpdpbusd + convert, multiply, 2 FMA | {mix / 1e9:.1f} | {100 * mix / peak:.1f}% |")
    print(f"| f32 FMA | {fma / 1e9:.1f} | {100 * fma / peak:.1f}% |")
    if with_min != macs:
        print("\n(the bound below is for models whose matrices are all Q4_1 or Q5_1; this one's are not)")
        return
    t_token = macs / mix + attn / fma  # seconds per token at both ceilings, nothing else
    print(f"\nA token's {macs / 1e6:.1f} M matrix multiply-adds at the Q4_1 block's ceiling and its "
          f"{attn / 1e6:.1f} M attention multiply-adds at the f32 FMA peak, with nothing else: "
          f"{1 / t_token:.0f} t/s, {100 * ceiling_fraction(macs, attn, peak, mix, fma):.1f}% of the int8 peak. "
          "That is the most a pp512 can reach here while every result stays as it is.")


if __name__ == "__main__":
    import results

    with results.saving("prefill_peak", "--save" in sys.argv[1:]):
        code = main()
    raise SystemExit(code)
