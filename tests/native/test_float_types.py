"""F32 / F16 / BF16 rows of the kernel table: the exact scalar conversions over every 16-bit
pattern, each level's to_float / from_float (bit-exact to numpy and to the gguf package), and
each level's dot product against a float64 dot."""
import numpy as np
import pytest
from gguf import GGMLQuantizationType as GT
from gguf import quants as gq

from bubo import _kernels as K

F32, F16, BF16 = 0, 1, 30
FLOAT_TYPES = {F32: GT.F32, F16: GT.F16, BF16: GT.BF16}
ISAS = K.supported_isas()

# |dot - float64 dot| <= DOT_REL_TOL * sum|x_i y_i|. The SIMD variants sum in f32 over 4 x 8
# or 4 x 16 lanes (a few hundred terms per lane at most here): about 1e-7 measured;
# one dropped or doubled element (about sum/n) is far above it.
DOT_REL_TOL = 1e-6

ALL_BITS = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)


def bits32(a):
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def from_bits32(u):
    return np.asarray(u, dtype=np.uint32).view(np.float32)


def assert_same_floats(got, want):
    """Bit-equal, except that any nan matches any nan of the same sign."""
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(np.signbit(got[nan]), np.signbit(want[nan]))
    bad = np.flatnonzero(bits32(got[~nan]) != bits32(want[~nan]))
    assert bad.size == 0, f"{bad.size} differ, first: {got[~nan][bad[:5]]} vs {want[~nan][bad[:5]]}"


def assert_same_f16(got, want):
    got, want = np.asarray(got, np.uint16), np.asarray(want, np.uint16)
    nan = ((want & 0x7C00) == 0x7C00) & ((want & 0x3FF) != 0)
    got_nan = ((got & 0x7C00) == 0x7C00) & ((got & 0x3FF) != 0)
    assert np.array_equal(got_nan, nan)
    assert np.array_equal(got[nan] & 0x8000, want[nan] & 0x8000)
    bad = np.flatnonzero(got[~nan] != want[~nan])
    assert bad.size == 0, f"{bad.size} differ, first: {got[~nan][bad[:5]]} vs {want[~nan][bad[:5]]}"


# ---- numpy references -------------------------------------------------------------------------


def bf16_to_f32_ref(bits):
    """bf16 is the top half of an f32."""
    return from_bits32(np.asarray(bits, np.uint32) << 16)


def f32_to_bf16_ref(x):
    """Round to nearest even by comparing distances in float64 (independent of the bit trick the
    kernels use); nan stays nan."""
    x = np.asarray(x, np.float32)
    u = bits32(x)
    lo = (u >> 16).astype(np.uint32)  # truncation: toward zero
    hi = lo + 1  # next bf16 away from zero (the carry moves into the exponent, inf included)
    with np.errstate(invalid="ignore", over="ignore"):
        lo_v = bf16_to_f32_ref(lo).astype(np.float64)
        # past the largest finite bf16 the next step is 2^128 (unbounded exponent): a value
        # nearer to it than to the largest finite overflows to inf, as IEEE rounding says
        hi_v = np.where((hi & 0x7FFF) == 0x7F80, np.copysign(2.0**128, lo_v), bf16_to_f32_ref(hi & 0xFFFF))
        xd = x.astype(np.float64)
        d_lo, d_hi = np.abs(xd - lo_v), np.abs(hi_v - xd)
        pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & ((lo & 1) == 1))
    out = np.where(pick_hi & (d_lo != 0), hi, lo).astype(np.uint16)
    nan = np.isnan(x)
    out[nan] = (lo[nan] | 0x40).astype(np.uint16)
    return out


def f32_probe_values(decode, bits16):
    """f32 inputs that pin down rounding to a 16-bit float format: every representable value,
    every midpoint between neighbours (ties) and one f32 ulp either side, and a strided sweep over
    all f32 bit patterns."""
    with np.errstate(invalid="ignore"):
        vals = decode(bits16).astype(np.float64)
    finite = np.sort(np.unique(vals[np.isfinite(vals)]))
    mids = ((finite[:-1] + finite[1:]) / 2).astype(np.float32)  # exact: one more bit than the format
    sweep = from_bits32(np.arange(0, 1 << 32, 4099, dtype=np.uint64).astype(np.uint32))
    probes = np.concatenate([
        decode(bits16), mids, np.nextafter(mids, np.float32(np.inf)), np.nextafter(mids, np.float32(-np.inf)),
        -mids, sweep, np.array([np.inf, -np.inf, np.nan, -np.nan, 0.0, -0.0, 3.4e38, -3.4e38], np.float32),
    ])
    return np.ascontiguousarray(probes, dtype=np.float32)


F16_PROBES = f32_probe_values(lambda b: b.view(np.float16).astype(np.float32), ALL_BITS)
BF16_PROBES = f32_probe_values(bf16_to_f32_ref, ALL_BITS)


# ---- exact scalar conversions -----------------------------------------------------------------


def test_f16_to_f32_every_pattern():
    assert_same_floats(K.f16_to_f32(ALL_BITS), ALL_BITS.view(np.float16).astype(np.float32))


def test_f32_to_f16_rounds_to_nearest_even():
    got = K.f32_to_f16(F16_PROBES)
    with np.errstate(over="ignore"):
        want = F16_PROBES.astype(np.float16).view(np.uint16)
    assert_same_f16(got, want)
    # spot checks that do not lean on numpy
    assert K.f32_to_f16(np.array([65520.0, 65519.996, 2.0**-25, 2.0**-25 * 1.0000001, 2.0**-24 * 1.5],
                                 np.float32)).tolist() == [
        0x7C00, 0x7BFF, 0x0000, 0x0001, 0x0002]


def test_f32_to_f16_nan_stays_nan():
    nans = from_bits32(np.array([0x7F800001, 0x7FC00000, 0xFF800001, 0x7F802000, 0x7FFFFFFF], np.uint32))
    h = K.f32_to_f16(nans)
    assert np.all((h & 0x7C00) == 0x7C00) and np.all((h & 0x3FF) != 0)
    assert np.array_equal(h >> 15, (bits32(nans) >> 31).astype(np.uint16))


def test_bf16_to_f32_every_pattern():
    assert np.array_equal(bits32(K.bf16_to_f32(ALL_BITS)), bits32(bf16_to_f32_ref(ALL_BITS)))


def test_f32_to_bf16_rounds_to_nearest_even():
    assert np.array_equal(K.f32_to_bf16(BF16_PROBES), f32_to_bf16_ref(BF16_PROBES))


def test_f32_to_bf16_matches_gguf_bit_for_bit():
    want = gq.quantize(BF16_PROBES, GT.BF16).view(np.uint16)
    assert np.array_equal(K.f32_to_bf16(BF16_PROBES), want)


def test_f16_round_trip_is_identity():
    finite = ALL_BITS[(ALL_BITS & 0x7C00) != 0x7C00]
    assert np.array_equal(K.f32_to_f16(K.f16_to_f32(finite)), finite)
    assert np.array_equal(K.f32_to_bf16(K.bf16_to_f32(finite)), finite)


# ---- the table rows ---------------------------------------------------------------------------


@pytest.mark.parametrize("type_id", FLOAT_TYPES)
def test_table_rows(type_id):
    info = K.type_info(type_id)
    assert info["supported"] and info["vec_dot_type"] == F32 and info["blck_size"] == 1
    assert info["type_size"] == {F32: 4, F16: 2, BF16: 2}[type_id]
    assert "scalar" in info["to_float"] and "scalar" in info["from_float"]
    for isa in ("scalar", "avx2", "avx512") if "avx2" in ISAS else ("scalar",):
        assert isa in info["vec_dot"]


def kernel_isas(type_id, kernel):
    return [isa for isa in K.type_info(type_id)[kernel] if isa in ISAS]


@pytest.mark.parametrize("type_id", [F16, BF16])
def test_to_float_every_pattern_every_level(type_id):
    want = K.f16_to_f32(ALL_BITS) if type_id == F16 else K.bf16_to_f32(ALL_BITS)
    data = ALL_BITS.view(np.uint8)
    for isa in kernel_isas(type_id, "to_float"):
        # odd lengths exercise the tails
        for n in (1 << 16, 1 << 16 - 1, 37):
            got = K.dequantize(type_id, data[: 2 * n], isa=isa)
            assert np.array_equal(bits32(got), bits32(want[:n])), isa


@pytest.mark.parametrize("type_id", [F16, BF16])
def test_from_float_every_level_equals_scalar_conversion(type_id):
    probes = F16_PROBES if type_id == F16 else BF16_PROBES
    convert = K.f32_to_f16 if type_id == F16 else K.f32_to_bf16
    want = convert(probes)
    for isa in kernel_isas(type_id, "from_float"):
        for n in (probes.size, probes.size - 5, 13):
            got = K.quantize(type_id, probes[:n], isa=isa).view(np.uint16)
            if type_id == F16:
                assert_same_f16(got, want[:n])
            else:
                assert np.array_equal(got, want[:n]), isa


@pytest.mark.parametrize("type_id", FLOAT_TYPES)
def test_quant_dequant_match_gguf(type_id):
    rng = np.random.default_rng(type_id)
    x = np.concatenate([rng.standard_normal(1001).astype(np.float32) * 10,
                        [0.0, -0.0, 1e-8, 65504.0, 1e30]]).astype(np.float32)
    gt = FLOAT_TYPES[type_id]
    with np.errstate(over="ignore"):
        want = np.ascontiguousarray(gq.quantize(x, gt)).view(np.uint8).reshape(-1)
    for isa in kernel_isas(type_id, "from_float"):
        got = K.quantize(type_id, x, isa=isa)
        assert np.array_equal(got, want), isa
    for isa in kernel_isas(type_id, "to_float"):
        got = K.dequantize(type_id, want, isa=isa)
        assert np.array_equal(bits32(got), bits32(gq.dequantize(want, gt).reshape(-1))), isa


@pytest.mark.parametrize("type_id", FLOAT_TYPES)
def test_vec_dot_every_level_vs_float64(type_id):
    rng = np.random.default_rng(100 + type_id)
    for n in list(range(1, 70)) + [100, 576, 1000, 4099]:
        w = rng.standard_normal(n).astype(np.float32)
        y = rng.standard_normal(n).astype(np.float32)
        w_data = K.quantize(type_id, w, isa="scalar")
        w_exact = K.dequantize(type_id, w_data, isa="scalar").astype(np.float64)
        want = float(w_exact @ y.astype(np.float64))
        bound = DOT_REL_TOL * float(np.abs(w_exact) @ np.abs(y.astype(np.float64)))
        for isa in kernel_isas(type_id, "vec_dot"):
            got = K.vec_dot(type_id, w_data, y.view(np.uint8), isa=isa)
            assert abs(got - want) <= bound, (isa, n, got, want)
