"""Block-type kernels against independent oracles.

- dequantization equals the `gguf` package's numpy dequantizer, on random blocks and on real
  tensors of the catalog models;
- every SIMD variant this CPU runs equals the scalar reference within a tolerance named per
  bit width;
- the dot product with quantized activations matches a float64 dot of the dequantized weight row
  with the unquantized activations, within the error that quantizing the activations introduces.
"""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import quants as gq

from bubo import _kernels as K

from blocks import random_blocks, realistic_rows
from reference.reader import reader

WEIGHT_TYPES = [T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0,
                T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K]
ACTIVATION_TYPES = {T.Q8_0: 8, T.Q8_1: 9, T.Q8_K: 15}
SIMD = [isa for isa in K.supported_isas() if isa != "scalar"]

# SIMD vs scalar: relative tolerance on the dot product, scaled by sum(|w_i * a_i|). Integer
# sums inside a block are exact in every variant; only the order of float accumulation across
# blocks (and FMA contraction) differs, which the fewer bits a type has the less it matters.
DOT_SIMD_RTOL = {
    "f32": 2e-6, "f16": 2e-6, "bf16": 2e-6,
    "q8_0": 2e-6, "q5_0": 2e-6, "q5_1": 2e-6, "q4_0": 2e-6, "q4_1": 2e-6,
    "q6_K": 2e-6, "q5_K": 2e-6, "q4_K": 2e-6, "q3_K": 2e-6, "q2_K": 2e-6,
}
# Dequantization is a multiply (and add) per element: SIMD and scalar may differ by FMA
# contraction only, i.e. by an ulp or two.
DEQUANT_RTOL = 1e-6


def variants(t: T, kernel: str) -> list[str]:
    """The levels of `kernel` that t has and this CPU runs (test_type_is_registered checks
    that none is missing)."""
    return [isa for isa in K.type_info(int(t))[kernel] if isa in ["scalar"] + SIMD]


def name(t: T) -> str:
    return K.type_info(int(t))["name"]


def n_for(t: T) -> int:
    blck = gq.GGML_QUANT_SIZES[t][0]
    return 2048 if blck == 1 else 8 * max(blck, 256)


@pytest.mark.parametrize("t", WEIGHT_TYPES, ids=lambda t: t.name)
def test_type_is_registered(t):
    info = K.type_info(int(t))
    assert info["supported"], f"{t.name} is not marked supported"
    for field in ("to_float", "vec_dot"):
        assert "scalar" in info[field], f"{t.name} has no scalar {field}"
        if t == T.F32 and field == "to_float":
            continue  # a memcpy at every level: the table falls back to the scalar entry
        for isa in SIMD:
            assert isa in info[field], f"{t.name} has no {isa} {field}"
    assert info["vec_dot_type"] in (0, 8, 9, 15)


@pytest.mark.parametrize("t", WEIGHT_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("source", ["gguf_quantizer", "random_bits"])
def test_dequantize_matches_gguf(t, source):
    n = n_for(t)
    rng = np.random.default_rng(int(t) * 7 + 1)
    raw = realistic_rows(t, 4, n, int(t)) if source == "gguf_quantizer" else random_blocks(t, 4, n, rng)
    expected = gq.dequantize(raw, t).astype(np.float32)
    for isa in variants(t, "to_float"):
        got = np.stack([K.dequantize(int(t), row.tobytes(), isa) for row in raw])
        np.testing.assert_allclose(got, expected, rtol=DEQUANT_RTOL, atol=1e-6 * float(np.abs(expected).max()),
                                   err_msg=f"{t.name} {isa} dequantize vs gguf")


@pytest.mark.parametrize("t", WEIGHT_TYPES, ids=lambda t: t.name)
def test_vec_dot_simd_matches_scalar_and_float64(t):
    n = n_for(t)
    rng = np.random.default_rng(int(t) + 100)
    info = K.type_info(int(t))
    vt = info["vec_dot_type"]
    rtol = DOT_SIMD_RTOL[info["name"]]
    rows = realistic_rows(t, 6, n, int(t) + 3)
    for r, row in enumerate(rows):
        # Activations of varied magnitude, including one row with outliers.
        a = rng.standard_normal(n).astype(np.float32) * (10.0 ** rng.uniform(-2, 2))
        if r == 0:
            a[rng.integers(0, n, 5)] *= 100
        qa = K.quantize(vt, a, "scalar")
        w = K.dequantize(int(t), row.tobytes(), "scalar").astype(np.float64)
        a_deq = K.dequantize(vt, qa.tobytes(), "scalar").astype(np.float64) if vt != 0 else a.astype(np.float64)
        scalar = K.vec_dot(int(t), row.tobytes(), qa.tobytes(), "scalar")
        exact = float(np.dot(w, a.astype(np.float64)))
        # The activation quantization error, bounded term by term, plus float32 rounding.
        mag = float(np.sum(np.abs(w * a)))
        bound = float(np.sum(np.abs(w) * np.abs(a - a_deq))) * 1.001 + 1e-5 * mag + 1e-6
        assert abs(scalar - exact) <= bound, (t.name, scalar, exact, bound)
        for isa in SIMD:
            got = K.vec_dot(int(t), row.tobytes(), qa.tobytes(), isa)
            assert abs(got - scalar) <= rtol * mag + 1e-6, (t.name, isa, got, scalar)


@pytest.mark.parametrize("at", [T.Q8_0, T.Q8_1], ids=lambda t: t.name)
def test_legacy_activation_quantizers_equal_scalar_byte_for_byte(at):
    """Q8_0 / Q8_1 activations: every SIMD quantizer gives the scalar reference's bytes, over rows
    whose block count takes the AVX-512 quantizer's 16-blocks-at-a-time path and its one-block
    tail (37 = 2 x 16 + 5), with zero blocks, exact ties, scales near the smallest normal (where
    1/d overflows) and values across 60 orders of magnitude."""
    tid = ACTIVATION_TYPES[at]
    rng = np.random.default_rng(7)
    for nb in (1, 15, 16, 17, 37):
        x = (rng.standard_normal(nb * 32) * np.exp(rng.uniform(-70, 30, nb * 32))).astype(np.float32)
        x[rng.random(nb * 32) < 0.1] = 0.0
        x[:32] = np.linspace(-1, 1, 32)  # exact ties at half steps
        if nb > 3:
            x[32:64] = 0.0
            x[64:96] = 1e-38
        ref = K.quantize(tid, x, "scalar").tobytes()
        for isa in SIMD:
            assert K.quantize(tid, x, isa).tobytes() == ref, (at.name, isa, nb)


@pytest.mark.parametrize("at", list(ACTIVATION_TYPES), ids=lambda t: t.name)
def test_activation_quantization(at):
    """Q8 activation blocks: SIMD equals scalar, scale = absmax/127, error within half a step,
    and Q8_0 equals the gguf package's quantizer byte for byte."""
    tid = ACTIVATION_TYPES[at]
    info = K.type_info(tid)
    blck = info["blck_size"]
    rng = np.random.default_rng(tid)
    n = 4096
    x = rng.standard_normal(n).astype(np.float32) * 3
    x[:blck] = 0.0  # an all-zero block must not divide by zero
    x[blck:2 * blck] = np.linspace(-1, 1, blck)  # exact ties at half steps
    ref = K.quantize(tid, x, "scalar")
    for isa in SIMD:
        assert isa in info["from_float"], f"{info['name']} has no {isa} quantizer"
        got = K.quantize(tid, x, isa)
        # A rounding tie may go either way in a vector unit: allow one step, nowhere else.
        y_ref = K.dequantize(tid, ref.tobytes(), "scalar")
        y_got = K.dequantize(tid, got.tobytes(), "scalar")
        step = np.repeat(np.abs(x.reshape(-1, blck)).max(axis=1) / 127, blck)
        assert np.all(np.abs(y_ref - y_got) <= step * 1.0001 + 1e-30), isa
    y = K.dequantize(tid, ref.tobytes(), "scalar")
    step = np.repeat(np.abs(x.reshape(-1, blck)).max(axis=1) / 127, blck)
    # Q8_0 stores d as f16 (q is computed with the f32 d, as ggml does): the rounded scale moves
    # an element by up to |q| * 2^-11 of a step on top of the half step.
    half_step = 0.5001 + (127 * 2.0 ** -11 if at == T.Q8_0 else 0.0)
    assert np.all(np.abs(y - x) <= step * half_step + 1e-30)
    assert np.all(y[:blck] == 0)
    if at == T.Q8_0:
        np.testing.assert_array_equal(ref, gq.quantize(x.reshape(1, -1), T.Q8_0).reshape(-1))


def test_unsupported_types_have_no_kernels():
    for tid in K.type_ids():
        info = K.type_info(tid)
        if info["name"].startswith(("iq", "tq", "mxfp4", "nvfp4", "q1_0")):
            assert not info["supported"], info["name"]
            assert info["vec_dot"] == [] and info["to_float"] == []


def test_bad_lengths_are_refused():
    with pytest.raises(ValueError):
        K.dequantize(int(T.Q4_0), b"\x00" * 17)
    with pytest.raises(ValueError):
        K.quantize(int(T.Q8_0), np.zeros(33, np.float32))
    with pytest.raises(ValueError):
        K.vec_dot(int(T.Q4_0), b"\x00" * 18, b"\x00" * 10)
    with pytest.raises(ValueError):
        K.type_info(4)  # an id GGUF retired


# ---- real tensors ------------------------------------------------------------------------

# Only 2-D tensors are checked: smollm2's F32 tensors are all 1-D norms, so it lists none.
REAL = {
    "smollm2:135m": [T.Q4_1, T.Q8_0],
    "gemma3:270m": [T.Q4_K, T.Q5_0, T.Q6_K, T.Q8_0],
    "qwen2.5-coder:0.5b": [T.Q4_K, T.Q5_0, T.Q6_K],
}


@pytest.mark.models
@pytest.mark.parametrize("model", list(REAL))
def test_real_tensors(model, catalog_model):
    gguf_file = reader(catalog_model(model))
    rng = np.random.default_rng(0)
    for t in REAL[model]:
        tensor = next(x for x in gguf_file.tensors if x.tensor_type == t and len(x.shape) == 2)
        raw = np.asarray(tensor.data)
        rows = raw.view(np.uint8).reshape(raw.shape[0], -1)[:8]
        expected = gq.dequantize(rows, t).astype(np.float32)
        vt = K.type_info(int(t))["vec_dot_type"]
        for isa in variants(t, "to_float"):
            got = np.stack([K.dequantize(int(t), r.tobytes(), isa) for r in rows])
            np.testing.assert_allclose(got, expected, rtol=DEQUANT_RTOL, atol=1e-6 * float(np.abs(expected).max()),
                                       err_msg=f"{model} {tensor.name} {isa}")
        a = rng.standard_normal(expected.shape[1]).astype(np.float32)
        qa = K.quantize(vt, a)
        a_deq = K.dequantize(vt, qa.tobytes()).astype(np.float64) if vt != 0 else a.astype(np.float64)
        for r, w in zip(rows, expected.astype(np.float64)):
            exact = float(np.dot(w, a))
            mag = float(np.sum(np.abs(w * a)))
            bound = float(np.sum(np.abs(w) * np.abs(a - a_deq))) * 1.001 + 1e-5 * mag + 1e-6
            for isa in variants(t, "vec_dot"):
                got = K.vec_dot(int(t), r.tobytes(), qa.tobytes(), isa)
                assert abs(got - exact) <= bound, (model, tensor.name, isa, got, exact, bound)
