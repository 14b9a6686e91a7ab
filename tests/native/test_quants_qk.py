"""k-quant kernels (q2_K ... q6_K with Q8_K activations): the edge cases test_quants.py does not
reach.

- the Q8_K quantizer against a numpy oracle, byte for byte, in every variant (all variants
  round half to even, so they agree exactly, not only within a step), bsums included;
- blocks at the extremes of every field (all quant bits set or clear, largest scales, activations
  at +-127), where an int16 product or sum that saturates would show as a gross error;
- all-zero blocks, and rows of a single block.
"""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import quants as gq

from bubo import _kernels as K

K_TYPES = [T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K]
Q8_K = 15
Q8_K_AMAX_MIN = np.float32(1e-36)  # as csrc/quants/q8_k.c: smaller blocks quantize to zeros
ISAS = K.supported_isas()

# Byte offsets of the f16 super-block scales (d, and dmin where the type has one).
F16_FIELDS = {T.Q2_K: (80, 82), T.Q3_K: (108,), T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,)}

# The dot product against float64 over the dequantized operands, relative to the magnitude of
# its terms (the scale part and the min part counted apart, as they can cancel): the integer
# sums are exact, so only a few float32 roundings of the scales and the sums remain. A saturated
# int16 would be off by whole percents.
DOT_EXTREME_RTOL = 1e-5


def q8_K_fields(raw: np.ndarray):
    """(d, qs, bsums) of a uint8 array of Q8_K blocks."""
    blocks = raw.reshape(-1, 292)
    d = blocks[:, :4].copy().view(np.float32)[:, 0]
    qs = blocks[:, 4:260].view(np.int8)
    bsums = blocks[:, 260:].copy().view(np.int16)
    return d, qs, bsums


def q8_K_oracle(x: np.ndarray):
    """d = amax / 127 and q = round-half-even(x * (127 / amax)), in float32 as the kernels; a block
    with amax below Q8_K_AMAX_MIN is all zeros."""
    blocks = x.reshape(-1, 256).astype(np.float32)
    amax = np.abs(blocks).max(axis=1)
    zero = amax < Q8_K_AMAX_MIN
    with np.errstate(divide="ignore", over="ignore"):  # the zero blocks' lanes, discarded
        iscale = np.where(zero, np.float32(0), np.float32(127) / amax).astype(np.float32)
    q = np.rint(blocks * iscale[:, None]).astype(np.int8)
    d = np.where(zero, np.float32(0), amax / np.float32(127)).astype(np.float32)
    return d, q, q.reshape(-1, 16, 16).sum(axis=2, dtype=np.int16)


@pytest.mark.parametrize("isa", ISAS)
def test_q8_K_quantizer_matches_oracle(isa):
    rng = np.random.default_rng(5)
    x = (rng.standard_normal(256 * 12) * 10.0 ** rng.uniform(-3, 3, size=256 * 12)).astype(np.float32)
    x[:256] = 0                                   # all-zero block
    x[256:512] = np.linspace(-1, 1, 256)          # ties at half steps
    x[512:768] = np.float32(1e-30)                # tiny but nonzero
    x[768:1024] = rng.choice([-3e4, 3e4], 256)    # every element at +-amax
    x[1024] = -1e6                                # one outlier
    x[1280:1536] = np.float32(1e-37)              # 127 / amax would overflow: zeros
    x[1536:1792] = np.float32(2e-36)              # just above that
    d, qs, bsums = q8_K_fields(K.quantize(Q8_K, x, isa))
    d_ref, qs_ref, bsums_ref = q8_K_oracle(x)
    np.testing.assert_array_equal(d, d_ref)
    np.testing.assert_array_equal(qs, qs_ref)
    np.testing.assert_array_equal(bsums, bsums_ref)
    assert qs.min() >= -127 and qs.max() <= 127
    assert d[0] == 0 and not qs[0].any() and not bsums[0].any()


def test_q8_K_dequantize():
    rng = np.random.default_rng(6)
    x = rng.standard_normal(512).astype(np.float32)
    raw = K.quantize(Q8_K, x, "scalar")
    d, qs, _ = q8_K_fields(raw)
    np.testing.assert_array_equal(K.dequantize(Q8_K, raw.tobytes(), "scalar"),
                                  (d[:, None] * qs.astype(np.float32)).reshape(-1))


def extreme_blocks(t: T, fill: int, n_blocks: int, scales) -> np.ndarray:
    """Blocks of t with every byte `fill` (all quant bits and scale bits set or clear) and the
    f16 super-block scales (d, dmin) at `scales`."""
    size = gq.GGML_QUANT_SIZES[t][1]
    raw = np.full((n_blocks, size), fill, dtype=np.uint8)
    for off, scale in zip(F16_FIELDS[t], scales):
        raw[:, off:off + 2] = np.frombuffer(np.float16(scale).tobytes(), np.uint8)
    return raw.reshape(-1)


def activations(kind: str, n: int, rng) -> np.ndarray:
    if kind == "plus":
        return np.full(n, 3.0, np.float32)        # every quant +127
    if kind == "minus":
        return np.full(n, -3.0, np.float32)       # every quant -127
    return rng.standard_normal(n).astype(np.float32)


@pytest.mark.parametrize("t", K_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("fill", [0x00, 0xFF, 0x55, 0xAA, 0x80])
@pytest.mark.parametrize("kind", ["plus", "minus", "random"])
def test_extreme_blocks(t, fill, kind):
    """Largest quants and scales against +-127 activations: each int16 pair sum and each int32
    group sum is at its limit here, so any saturation shows."""
    rng = np.random.default_rng(fill)
    n_blocks = 3
    raw = extreme_blocks(t, fill, n_blocks, (1.5, 1.5))
    w = gq.dequantize(raw.reshape(n_blocks, -1), t).reshape(-1).astype(np.float64)
    # the min part alone (d = 0): zero for the types without mins
    w_min = gq.dequantize(extreme_blocks(t, fill, n_blocks, (0.0, 1.5)).reshape(n_blocks, -1), t)
    w_min = w_min.reshape(-1).astype(np.float64) if len(F16_FIELDS[t]) == 2 else np.zeros_like(w)
    a = activations(kind, 256 * n_blocks, rng)
    qa = K.quantize(Q8_K, a, "scalar")
    a_deq = K.dequantize(Q8_K, qa.tobytes(), "scalar").astype(np.float64)
    exact = float(np.dot(w, a_deq))
    mag = float(np.sum(np.abs((w - w_min) * a_deq)) + np.sum(np.abs(w_min * a_deq)))
    for isa in ISAS:
        np.testing.assert_allclose(K.dequantize(int(t), raw.tobytes(), isa), w, rtol=1e-6, atol=1e-6 * np.abs(w).max(),
                                   err_msg=f"{t.name} {isa}")
        got = K.vec_dot(int(t), raw.tobytes(), qa.tobytes(), isa)
        assert abs(got - exact) <= DOT_EXTREME_RTOL * mag + 1e-6, (t.name, hex(fill), kind, isa, got, exact, mag)


@pytest.mark.parametrize("t", K_TYPES, ids=lambda t: t.name)
def test_zero_blocks_and_single_block_rows(t):
    rng = np.random.default_rng(int(t))
    size = gq.GGML_QUANT_SIZES[t][1]
    zero = np.zeros(size, np.uint8)
    qa = K.quantize(Q8_K, rng.standard_normal(256).astype(np.float32), "scalar")
    qa_zero = K.quantize(Q8_K, np.zeros(256, np.float32), "scalar")
    one = rng.integers(0, 256, size, dtype=np.uint8)
    for off in F16_FIELDS[t]:
        one[off:off + 2] = np.frombuffer(np.float16(0.02).tobytes(), np.uint8)
    w = gq.dequantize(one.reshape(1, -1), t).reshape(-1).astype(np.float64)
    a_deq = K.dequantize(Q8_K, qa.tobytes(), "scalar").astype(np.float64)
    for isa in ISAS:
        assert not K.dequantize(int(t), zero.tobytes(), isa).any()
        assert K.vec_dot(int(t), zero.tobytes(), qa.tobytes(), isa) == 0
        assert K.vec_dot(int(t), one.tobytes(), qa_zero.tobytes(), isa) == 0
        np.testing.assert_allclose(K.dequantize(int(t), one.tobytes(), isa), w, rtol=1e-6, atol=1e-6 * np.abs(w).max())
        got = K.vec_dot(int(t), one.tobytes(), qa.tobytes(), isa)
        assert abs(got - float(np.dot(w, a_deq))) <= 2e-6 * float(np.sum(np.abs(w * a_deq))) + 1e-6, (t.name, isa)


@pytest.mark.parametrize("t", K_TYPES, ids=lambda t: t.name)
def test_default_variant_is_the_best_isa(t):
    """With no ISA named, the entry points run the table's pick (bubo_get_*)."""
    rng = np.random.default_rng(7)
    a = rng.standard_normal(512).astype(np.float32)
    w = rng.integers(0, 256, 2 * gq.GGML_QUANT_SIZES[t][1], dtype=np.uint8)
    for off in F16_FIELDS[t]:
        for b in range(2):
            o = b * gq.GGML_QUANT_SIZES[t][1] + off
            w[o:o + 2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
    best = K.best_isa()
    qa = K.quantize(Q8_K, a)
    np.testing.assert_array_equal(qa, K.quantize(Q8_K, a, best))
    np.testing.assert_array_equal(K.dequantize(int(t), w.tobytes()), K.dequantize(int(t), w.tobytes(), best))
    assert K.vec_dot(int(t), w.tobytes(), qa.tobytes()) == K.vec_dot(int(t), w.tobytes(), qa.tobytes(), best)
