"""Legacy 32-element block types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1): edge cases the table-wide
oracle tests in test_quants.py do not reach.

- every row length from 1 to 9 blocks, so each SIMD main loop (4 blocks a step) and its scalar
  tail are both exercised;
- all-zero blocks, extreme and subnormal scales, Q8_0 weights holding -128, Q5 blocks with every
  or no high bit set;
- the activation quantizers of every ISA equal the scalar one byte for byte (stronger than the
  one-step allowance of test_quants.py: bubo's SIMD quantizers round exactly like roundf), and
  Q8_1's s is d * sum(qs);
- the scalar reference weight quantizers equal the gguf package's byte for byte.
"""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import quants as gq

from bubo import _kernels as K

LEGACY = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0]
SIMD = [isa for isa in K.supported_isas() if isa != "scalar"]
ALL_ISAS = ["scalar"] + SIMD
Q8_0, Q8_1 = 8, 9

# SIMD vs scalar dot product, relative to sum(|w_i * a_i|): the integer sums of a block are exact
# in every variant, only the order of the float accumulation over blocks differs.
DOT_RTOL = 2e-6
# Dot product vs float64 of the dequantized operands: only float32 accumulation error remains.
DOT_EXACT_RTOL = 1e-5
# Byte offsets of the f16 scale fields (d, and m where the type has one).
SCALE_FIELDS = {T.Q4_0: (0,), T.Q4_1: (0, 2), T.Q5_0: (0,), T.Q5_1: (0, 2), T.Q8_0: (0,)}


def vec_dot_type(t: T) -> int:
    return K.type_info(int(t))["vec_dot_type"]


def random_rows(t: T, n_blocks: int, rng: np.random.Generator, scale=(0.002, 0.05)) -> np.ndarray:
    """One row of random bits with scales drawn from `scale` (magnitude range, random sign)."""
    size = gq.GGML_QUANT_SIZES[t][1]
    raw = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    for off in SCALE_FIELDS[t]:
        s = (rng.uniform(*scale, size=n_blocks) * rng.choice([-1, 1], size=n_blocks)).astype(np.float16)
        raw[:, off:off + 2] = s.view(np.uint8).reshape(n_blocks, 2)
    return raw.reshape(-1)


def check_dot(t: T, w: np.ndarray, a: np.ndarray):
    """Every ISA's vec_dot against float64 of the dequantized operands, and SIMD against scalar."""
    vt = vec_dot_type(t)
    qa = K.quantize(vt, a, "scalar").tobytes()
    wf = K.dequantize(int(t), w.tobytes(), "scalar").astype(np.float64)
    af = K.dequantize(vt, qa, "scalar").astype(np.float64)
    exact = float(np.dot(wf, af))
    mag = float(np.sum(np.abs(wf * af)))
    scalar = K.vec_dot(int(t), w.tobytes(), qa, "scalar")
    assert abs(scalar - exact) <= DOT_EXACT_RTOL * mag + 1e-30, (t.name, scalar, exact)
    for isa in SIMD:
        got = K.vec_dot(int(t), w.tobytes(), qa, isa)
        assert abs(got - scalar) <= DOT_RTOL * mag + 1e-30, (t.name, isa, got, scalar)


@pytest.mark.parametrize("t", LEGACY, ids=lambda t: t.name)
def test_every_length_through_main_loop_and_tail(t):
    rng = np.random.default_rng(int(t))
    for n_blocks in range(1, 10):
        w = random_rows(t, n_blocks, rng)
        expected = gq.dequantize(w.reshape(1, -1), t).reshape(-1).astype(np.float32)
        for isa in ALL_ISAS:
            np.testing.assert_array_equal(K.dequantize(int(t), w.tobytes(), isa), expected,
                                          err_msg=f"{t.name} {isa} {n_blocks} blocks")
        check_dot(t, w, rng.standard_normal(32 * n_blocks).astype(np.float32))


@pytest.mark.parametrize("t", LEGACY, ids=lambda t: t.name)
def test_zero_blocks(t):
    """All-zero weights give 0 in every variant, and so do all-zero activations."""
    rng = np.random.default_rng(1)
    n = 32 * 6
    zero_w = np.zeros(gq.GGML_QUANT_SIZES[t][1] * 6, np.uint8)
    a = rng.standard_normal(n).astype(np.float32)
    qa = K.quantize(vec_dot_type(t), a).tobytes()
    qz = K.quantize(vec_dot_type(t), np.zeros(n, np.float32)).tobytes()
    w = random_rows(t, 6, rng)
    for isa in ALL_ISAS:
        assert K.vec_dot(int(t), zero_w.tobytes(), qa, isa) == 0.0
        assert np.all(K.dequantize(int(t), zero_w.tobytes(), isa) == 0.0)
        if t in (T.Q4_1, T.Q5_1):
            continue  # the min m still meets s = 0: the sum is 0 only up to rounding
        assert K.vec_dot(int(t), w.tobytes(), qz, isa) == 0.0


@pytest.mark.parametrize("t", LEGACY, ids=lambda t: t.name)
@pytest.mark.parametrize("scale", [(1e3, 6e4), (1e-7, 5e-6)], ids=["huge", "subnormal"])
def test_extreme_scales(t, scale):
    rng = np.random.default_rng(7)
    w = random_rows(t, 8, rng, scale=scale)
    expected = gq.dequantize(w.reshape(1, -1), t).reshape(-1).astype(np.float32)
    for isa in ALL_ISAS:
        np.testing.assert_array_equal(K.dequantize(int(t), w.tobytes(), isa), expected, err_msg=isa)
    check_dot(t, w, rng.standard_normal(256).astype(np.float32))


def test_q8_0_weights_holding_minus_128():
    """-128 is a valid int8 in a file though ggml's quantizer never writes it; the sign tricks of
    the SIMD kernels must still multiply it right."""
    rng = np.random.default_rng(3)
    w = random_rows(T.Q8_0, 8, rng).reshape(8, 34)
    w[:, 2:] = np.where(rng.random((8, 32)) < 0.5, 0x80, w[:, 2:])
    check_dot(T.Q8_0, w.reshape(-1), rng.standard_normal(256).astype(np.float32))


@pytest.mark.parametrize("t", [T.Q5_0, T.Q5_1], ids=lambda t: t.name)
@pytest.mark.parametrize("qh", [0x00, 0xFF])
def test_q5_high_bits_all_or_none(t, qh):
    rng = np.random.default_rng(qh)
    w = random_rows(t, 8, rng).reshape(8, -1)
    off = 2 * len(SCALE_FIELDS[t])
    w[:, off:off + 4] = qh
    w = w.reshape(-1)
    expected = gq.dequantize(w.reshape(1, -1), t).reshape(-1).astype(np.float32)
    for isa in ALL_ISAS:
        np.testing.assert_array_equal(K.dequantize(int(t), w.tobytes(), isa), expected, err_msg=isa)
    check_dot(t, w, rng.standard_normal(256).astype(np.float32))


OVERFLOWING_BLOCK = 4  # the index of the subnormal block below


def activation_inputs(rng: np.random.Generator) -> np.ndarray:
    blocks = [
        np.zeros(32),
        np.linspace(-1, 1, 32),                        # ties at half steps
        np.r_[127.0, (np.arange(31) - 15) + 0.5],      # amax 127: d = 1, and x / d are exact ties
        rng.standard_normal(32) * 1e30,
        rng.standard_normal(32) * 1e-41,               # subnormal: 1 / d overflows
        rng.standard_normal(32) * 1e-36,               # tiny, but 1 / d is finite
        np.full(32, -3.0),
        rng.standard_normal(32 * 26) * 3,
    ]
    return np.concatenate(blocks).astype(np.float32)


@pytest.mark.parametrize("tid", [Q8_0, Q8_1], ids=["Q8_0", "Q8_1"])
def test_activation_quantizers_equal_across_isas(tid):
    x = activation_inputs(np.random.default_rng(5))
    ref = K.quantize(tid, x, "scalar")
    for isa in SIMD:
        np.testing.assert_array_equal(K.quantize(tid, x, isa), ref, err_msg=isa)
    if tid == Q8_0:
        # ggml leaves the block whose 1 / d overflows undefined (inf to int8): compare the rest.
        defined = np.ones(len(x) // 32, bool)
        defined[OVERFLOWING_BLOCK] = False
        ours = ref.reshape(-1, 34)[defined].reshape(-1)
        with np.errstate(over="ignore"):  # the 1e30 block's d is beyond f16: inf, in ggml too
            theirs = gq.quantize(x.reshape(-1, 32)[defined].reshape(1, -1), T.Q8_0).reshape(-1)
        np.testing.assert_array_equal(ours, theirs)
        assert not ref.reshape(-1, 34)[OVERFLOWING_BLOCK].any()  # quantized to zeros, d = 0


def test_q8_1_sum_field():
    x = activation_inputs(np.random.default_rng(6))
    blocks = K.quantize(Q8_1, x).reshape(-1, 40)
    d = blocks[:, 0:4].copy().view(np.float32).reshape(-1)
    s = blocks[:, 4:8].copy().view(np.float32).reshape(-1)
    qs = blocks[:, 8:].view(np.int8).astype(np.int64)
    np.testing.assert_array_equal(s, (d * qs.sum(axis=1).astype(np.float32)).astype(np.float32))
    assert np.all(np.abs(qs) <= 127)


@pytest.mark.parametrize("t", [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1], ids=lambda t: t.name)
def test_reference_weight_quantizer_matches_gguf(t):
    rng = np.random.default_rng(int(t) + 11)
    x = (rng.standard_normal(32 * 64) * rng.uniform(0.01, 3)).astype(np.float32)
    x[:32] = 0.0
    x[32:64] = 1.5  # a constant block: d = 0 for the min types
    np.testing.assert_array_equal(K.quantize(int(t), x, "scalar"), gq.quantize(x.reshape(1, -1), t).reshape(-1))
