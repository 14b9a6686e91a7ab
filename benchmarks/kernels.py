"""Kernel microbenchmark: GB/s of weight bytes streamed by the dot product of each block type,
per SIMD variant, on one thread. Two working sets: one that fits in L2 (compute-bound: how fast
the kernel itself is) and one far larger than the last-level cache (memory-bound: what a decode
step sees). For reference it also prints this machine's single-thread memory read bandwidth.

    python benchmarks/kernels.py [--types q4_K,q8_0] [--big-mb 128]
    python benchmarks/kernels.py --gemm [--types q4_1,q8_0] [--tokens 512]

--gemm measures instead the matrix-matrix product of prompt processing: GFLOP/s
(2 * rows * cols * tokens / time) of bubo_matmul, with the tile kernels, for the shapes of
smollm2:135m (and gemma3:270m, qwen2.5 for the k-quants) on 1 and 2 threads, the thread counts
alternating so that noise from neighbours hits both.

Not a test: numbers move with the machine and its neighbours; compare variants within one run.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from bubo import _kernels as K

WEIGHT_TYPES = ["f32", "f16", "bf16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0",
                "q2_K", "q3_K", "q4_K", "q5_K", "q6_K"]


def type_id(name: str) -> int:
    return next(t for t in K.type_ids() if K.type_info(t)["name"] == name)


def make_rows(tid: int, n_cols: int, total_bytes: int, rng) -> np.ndarray:
    info = K.type_info(tid)
    row_bytes = K.row_size(tid, n_cols)
    rows = max(1, total_bytes // row_bytes)
    # Valid blocks: quantize random floats where a quantizer exists, else dequantizable bits
    # with small f16 scales (the dot kernels' speed does not depend on the values).
    if info["from_float"]:
        x = rng.standard_normal((min(rows, 64), n_cols)).astype(np.float32)
        block = np.stack([K.quantize(tid, r) for r in x])
    else:
        block = rng.integers(0, 256, size=(min(rows, 64), row_bytes), dtype=np.uint8)
        block[:, :] &= 0x3B  # keeps every f16 field finite and small
    reps = -(-rows // block.shape[0])
    return np.ascontiguousarray(np.tile(block, (reps, 1))[:rows])


def gbps(fn, nbytes: int, min_time: float = 0.3) -> float:
    fn()  # warm up
    best = float("inf")
    total, runs = 0.0, 0
    while total < min_time or runs < 3:
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        best = min(best, dt)
        total += dt
        runs += 1
    return nbytes / best / 1e9


def memory_bandwidth(mb: int) -> float:
    a = np.ones(mb * (1 << 20) // 8, dtype=np.float64)
    return gbps(lambda: a.sum(), a.nbytes)


# (rows, cols) of the catalog models' weight matrices: smollm2:135m for the legacy types, and
# gemma3:270m / qwen2.5-coder:0.5b where the columns must be whole 256-element super-blocks
GEMM_SHAPES = [(576, 576), (192, 576), (1536, 576), (576, 1536), (49152, 576)]
GEMM_SHAPES_K = [(640, 1024), (640, 2048), (896, 4864)]


def gemm(types: list[str], n_tokens: int) -> None:
    import sys
    from pathlib import Path

    from gguf import GGMLQuantizationType

    from bubo import _ops

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "native"))
    from blocks import realistic_rows

    pools = {n: _ops.ThreadPool(n) for n in (1, 2)}
    rng = np.random.default_rng(0)
    print(f"bubo_matmul, {n_tokens} tokens, table level {K.best_isa()}: GFLOP/s")
    print(f"{'type':6s} {'rows x cols':>13s} {'1 thread':>9s} {'2 threads':>9s}")
    for name in types:
        tid = type_id(name)
        info = K.type_info(tid)
        if not info["supported"]:
            continue
        shapes = GEMM_SHAPES_K if info["blck_size"] == 256 else GEMM_SHAPES
        for rows, cols in shapes:
            if info["blck_size"] == 1:
                w = rng.standard_normal((rows, cols)).astype(np.float32)
                data = (w if name == "f32" else w.astype(np.float16)).view(np.uint8).reshape(-1)
            else:
                data = np.ascontiguousarray(realistic_rows(GGMLQuantizationType(tid), rows, cols, 0))
                data = data.view(np.uint8).reshape(-1)
            x = rng.standard_normal((n_tokens, cols)).astype(np.float32)
            flops = 2.0 * rows * cols * n_tokens
            best = {1: float("inf"), 2: float("inf")}
            for _ in range(3):
                for n in (1, 2):
                    _ops.matmul(pools[n], tid, data, rows, cols, x)
                    t0 = time.perf_counter()
                    _ops.matmul(pools[n], tid, data, rows, cols, x)
                    best[n] = min(best[n], time.perf_counter() - t0)
            print(f"{name:6s} {f'{rows}x{cols}':>13s} {flops / best[1] / 1e9:9.1f} {flops / best[2] / 1e9:9.1f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--types", default=",".join(WEIGHT_TYPES))
    ap.add_argument("--cols", type=int, default=4096)
    ap.add_argument("--small-kb", type=int, default=256)
    ap.add_argument("--big-mb", type=int, default=128)
    ap.add_argument("--gemm", action="store_true", help="matrix-matrix products instead (see above)")
    ap.add_argument("--tokens", type=int, default=512)
    args = ap.parse_args()
    if args.gemm:
        types = args.types.split(",") if args.types != ",".join(WEIGHT_TYPES) else [
            "q4_1", "q8_0", "q5_0", "q4_K", "q6_K", "f32", "f16"]
        gemm(types, args.tokens)
        return
    rng = np.random.default_rng(0)
    isas = K.supported_isas()
    print(f"CPU levels: {', '.join(isas)} (table picks {K.best_isa()}); one thread; "
          f"row of {args.cols} elements")
    print(f"memory read bandwidth, one thread (numpy sum of {args.big_mb} MB): "
          f"{memory_bandwidth(args.big_mb):.1f} GB/s")
    header = f"{'type':6s} {'set':>6s} " + " ".join(f"{isa:>9s}" for isa in isas) + "   best/scalar"
    print(header)
    for name in args.types.split(","):
        tid = type_id(name)
        info = K.type_info(tid)
        if not info["supported"]:
            print(f"{name:6s} not supported yet")
            continue
        act = K.quantize(info["vec_dot_type"], rng.standard_normal(args.cols).astype(np.float32))
        for label, size in (("L2", args.small_kb << 10), ("DRAM", args.big_mb << 20)):
            w = make_rows(tid, args.cols, size, rng)
            cells, speeds = [], {}
            for isa in isas:
                if isa not in info["vec_dot"]:
                    cells.append(f"{'-':>9s}")
                    continue
                repeat = max(1, (64 << 20) // w.nbytes) if label == "L2" else 1
                s = gbps(lambda: K.vec_dot_rows(tid, w, act, isa, repeat), w.nbytes * repeat)
                speeds[isa] = s
                cells.append(f"{s:9.2f}")
            ratio = max(speeds.values()) / speeds["scalar"] if "scalar" in speeds else float("nan")
            print(f"{name:6s} {label:>6s} " + " ".join(cells) + f"   {ratio:6.1f}x")
    print("GB/s of weight bytes read by vec_dot (higher is better)")


if __name__ == "__main__":
    main()
