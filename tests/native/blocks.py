"""Weight rows for kernel tests: random bits with sane f16 scales, or realistic values from the
gguf package's own quantizer where it has one."""

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants as gq

# Byte offsets of the f16 scale fields in each block (random bytes there could be inf/nan).
SCALE_FIELDS = {
    T.Q4_0: (0,), T.Q4_1: (0, 2), T.Q5_0: (0,), T.Q5_1: (0, 2), T.Q8_0: (0,),
    T.Q2_K: (80, 82), T.Q3_K: (108,), T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,),
}
GGUF_QUANTIZES = (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0)


def random_blocks(t: T, n_rows: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """n_rows rows of n elements of type t, as raw bytes: random bits with sane scales."""
    t = T(t)
    blck, size = gq.GGML_QUANT_SIZES[t]
    if t == T.F32:
        return rng.standard_normal((n_rows, n)).astype(np.float32).view(np.uint8)
    if t == T.F16:
        return rng.standard_normal((n_rows, n)).astype(np.float16).view(np.uint8)
    if t == T.BF16:
        return gq.quantize(rng.standard_normal((n_rows, n)).astype(np.float32), T.BF16)
    raw = rng.integers(0, 256, size=(n_rows, n // blck, size), dtype=np.uint8)
    for off in SCALE_FIELDS[t]:
        scales = (rng.uniform(0.002, 0.05, size=(n_rows, n // blck)) *
                  rng.choice([-1, 1], size=(n_rows, n // blck))).astype(np.float16)
        raw[:, :, off:off + 2] = scales.view(np.uint8).reshape(n_rows, n // blck, 2)
    return raw.reshape(n_rows, -1)


def realistic_rows(t: T, n_rows: int, n: int, seed: int) -> np.ndarray:
    """Weights in a realistic distribution: gguf's own quantizer where it has one, else random
    blocks."""
    t = T(t)
    rng = np.random.default_rng(seed)
    if t in GGUF_QUANTIZES:
        x = rng.standard_normal((n_rows, n)).astype(np.float32) * rng.uniform(0.01, 3)
        return gq.quantize(x, t)
    return random_blocks(t, n_rows, n, rng)
