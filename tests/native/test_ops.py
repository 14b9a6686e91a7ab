"""The float ops of the forward pass, every level this CPU runs, against float64 numpy references.

Tolerances are relative to the result, widened by the condition number where one exists: an op
that evaluates exp(a) inherits a relative error of about |a| ulps from rounding a to f32, in the
reference scalar code as much as in the vector code. Where a value underflows to the subnormal
range only an absolute bound (TINY) makes sense."""
import ctypes
import ctypes.util
import math

import numpy as np
import pytest

from bubo import _kernels as K
from bubo import _ops

ISAS = K.supported_isas()
SIMD_ISAS = [isa for isa in ISAS if isa != "scalar"]

F32_EPS = float(np.finfo(np.float32).eps)
TINY = 1e-35  # below this an f32 result is (near) subnormal: absolute bound only
RMS_NORM_REL_TOL = 8 * F32_EPS  # the scale (sum, sqrt, divide) and two products: a few ulps
# |act - act_ref| <= ACT_REL_TOL * max(1, |a|) * |act_ref| + TINY, a the argument of exp
ACT_REL_TOL = 1e-6
# The SIMD levels evaluate exp (and erfc) with polynomials (csrc/ops/vmath.h); they stay within
# VEXP_REL_TOL * max(1, |a|) of the scalar level, which calls libm. Measured: 3.5e-7.
VEXP_REL_TOL = 1e-6
SOFTMAX_REL_TOL = 1e-6  # per probability, times max(1, |score - max|)
# RoPE against ggml's own f32 angles: cos/sin to an ulp, then one rotation with an FMA
ROPE_REL_TOL = 4 * F32_EPS  # of the largest |x| of the head
# RoPE against the exact angle pos * base^(-2i/n_rot): the running f32 product drifts by about
# one ulp per step, an angle error of ~ pos * (i ulps of base^(-2i/n_rot)); 2e-5 measured for pos < 256
ROPE_EXACT_ANGLE_TOL = 5e-5

SIZES = [1, 3, 8, 15, 16, 17, 33, 64, 100, 576, 1031]


@pytest.fixture(params=ISAS)
def isa(request):
    return request.param


def test_every_level_has_a_whole_table():
    assert _ops.ops_isa(None) == K.best_isa()
    for isa in ISAS:
        assert _ops.ops_isa(isa) == isa
    with pytest.raises(ValueError):
        _ops.silu(np.ones(4, np.float32), isa="no-such-isa")
    for isa in {"scalar", "avx2", "avx512", "neon"} - set(ISAS):
        with pytest.raises(ValueError):
            _ops.silu(np.ones(4, np.float32), isa=isa)


# ---- RMSNorm ----------------------------------------------------------------------------------


def rms_norm_ref(x, w, eps):
    x = x.astype(np.float64)
    y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return y * w.astype(np.float64) if w is not None else y


@pytest.mark.parametrize("with_weight", [True, False])
def test_rms_norm(isa, with_weight):
    rng = np.random.default_rng(1)
    for n in SIZES:
        x = (rng.standard_normal((3, n)) * rng.uniform(0.01, 100, (3, 1))).astype(np.float32)
        w = rng.standard_normal(n).astype(np.float32) if with_weight else None
        for eps in (1e-6, 1e-5):
            want = rms_norm_ref(x, w, eps)
            got = _ops.rms_norm(x, w, eps, isa=isa)
            np.testing.assert_allclose(got, want, rtol=RMS_NORM_REL_TOL, atol=TINY, err_msg=f"{isa} n={n}")


def test_rms_norm_eps_guards_a_zero_row(isa):
    got = _ops.rms_norm(np.zeros(40, np.float32), None, 1e-6, isa=isa)
    assert np.array_equal(got, np.zeros(40, np.float32))


# ---- LayerNorm --------------------------------------------------------------------------------


def layer_norm_ref(x, w, b, eps):
    x = x.astype(np.float64)
    c = x - x.mean(axis=-1, keepdims=True)
    y = c / np.sqrt(np.mean(c * c, axis=-1, keepdims=True) + eps)
    return y * (w.astype(np.float64) if w is not None else 1) + (b.astype(np.float64) if b is not None else 0)


@pytest.mark.parametrize("affine", ["w and b", "w", "b", "none"])
def test_layer_norm(isa, affine):
    """Rows with a mean far from zero against their spread too (an offset of 30 spreads): the
    centered values lose what rounding x - mean loses, about the offset's ulps over the spread,
    in the double-summing scalar level as much as in the f32 lanes; the bound says so."""
    rng = np.random.default_rng(3)
    for n in SIZES:
        spread = rng.uniform(0.01, 100, (4, 1))
        offset = np.array([[0.0], [1.0], [-3.0], [30.0]]) * spread
        x = (rng.standard_normal((4, n)) * spread + offset).astype(np.float32)
        w = rng.standard_normal(n).astype(np.float32) if "w" in affine else None
        b = rng.standard_normal(n).astype(np.float32) if affine.endswith("b") else None
        for eps in (1e-12, 1e-5):
            want = layer_norm_ref(x, w, b, eps)
            got = _ops.layer_norm(x, w, b, eps, isa=isa)
            cond = 1 + np.abs(x).max(-1, keepdims=True) / np.maximum(x.std(-1, keepdims=True), 1e-30)
            wabs = np.abs(w) if w is not None else 1.0
            bound = 16 * F32_EPS * (cond * wabs + np.abs(want)) + TINY
            assert (np.abs(got - want) <= bound).all(), f"{isa} n={n}: {np.abs(got - want).max()}"


def test_layer_norm_of_a_constant_row_is_its_bias(isa):
    b = np.arange(40, dtype=np.float32)
    got = _ops.layer_norm(np.full(40, 7.5, np.float32), np.ones(40, np.float32), b, 1e-5, isa=isa)
    assert np.array_equal(got, b)


# ---- strided rows (an encoder's attention) ----------------------------------------------------


@pytest.mark.parametrize("n_rows,length,stride", [(1, 1, 1), (3, 7, 9), (4, 16, 16), (5, 32, 384), (20, 32, 384),
                                                  (9, 64, 70), (13, 100, 128), (2, 129, 129)])
def test_dot_rows_and_sum_rows(isa, n_rows, length, stride):
    """Each row read at its stride, nothing past length: the columns past it hold NaN."""
    rng = np.random.default_rng(n_rows * 1000 + length)
    rows = np.full((n_rows, stride), np.nan, np.float32)
    rows[:, :length] = rng.standard_normal((n_rows, length)) * rng.uniform(0.01, 10, (n_rows, 1))
    x = rng.standard_normal(length).astype(np.float32)
    w = rng.uniform(0, 1, n_rows).astype(np.float32)
    body = rows[:, :length].astype(np.float64)
    got = _ops.dot_rows(x, rows, isa=isa)
    bound = 4 * length * F32_EPS * (np.abs(body) @ np.abs(x.astype(np.float64))) + TINY
    assert (np.abs(got - body @ x.astype(np.float64)) <= bound).all(), isa
    got = _ops.sum_rows(w, rows, length, isa=isa)
    bound = 4 * n_rows * F32_EPS * (w.astype(np.float64) @ np.abs(body)) + TINY
    assert (np.abs(got - w.astype(np.float64) @ body) <= bound).all(), isa


# ---- activations ------------------------------------------------------------------------------

ACT_X = np.concatenate([
    np.linspace(-30, 30, 6001),
    np.random.default_rng(2).standard_normal(1001) * 4,
    [0.0, -0.0, 1e-30, -1e-30, 80, -80, -87.5, -88.5, -90, -100, -104, -110, 88, 100, 1e4, -1e4],
]).astype(np.float32)


def _erfc(v):
    return np.vectorize(math.erfc)(v)


def act_ref(name, x):
    """(value, argument of the exp it evaluates), in float64. GELU-tanh as x * sigmoid(2u), which
    is 0.5 x (1 + tanh u) without float64's own cancellation for negative x."""
    x = x.astype(np.float64)
    with np.errstate(over="ignore"):
        if name == "silu":
            return x / (1 + np.exp(-x)), x
        if name == "gelu":
            two_u = 2 * math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)
            return x / (1 + np.exp(-two_u)), two_u
        if name == "gelu_erf":
            return 0.5 * x * _erfc(-x / math.sqrt(2)), x * x / 2
    raise KeyError(name)


def act_bound(rel_tol, ref, arg):
    return rel_tol * np.maximum(1.0, np.abs(arg)) * np.abs(ref) + TINY


def assert_within(got, want, bound, what):
    err = np.abs(np.asarray(got, np.float64) - want)
    bad = np.flatnonzero(~(err <= bound))
    assert bad.size == 0, f"{what}: {bad.size} outside, worst at index {bad[np.argmax((err / bound)[bad])]}"


@pytest.mark.parametrize("name", ["silu", "gelu", "gelu_erf"])
def test_activation_vs_float64(isa, name):
    want, arg = act_ref(name, ACT_X)
    got = getattr(_ops, name)(ACT_X, isa=isa)
    assert_within(got, want, act_bound(ACT_REL_TOL, want, arg), f"{name} {isa}")


@pytest.mark.parametrize("name", ["silu", "gelu", "gelu_erf"])
def test_vector_exp_stays_near_scalar(name):
    """The named tolerance of the vectorized exp / erfc approximations against libm."""
    scalar = getattr(_ops, name)(ACT_X, isa="scalar").astype(np.float64)
    _, arg = act_ref(name, ACT_X)
    for isa in SIMD_ISAS:
        got = getattr(_ops, name)(ACT_X, isa=isa)
        assert_within(got, scalar, act_bound(VEXP_REL_TOL, scalar, arg), f"{name} {isa} vs scalar")


@pytest.mark.parametrize("name", ["silu", "gelu", "gelu_erf"])
def test_activation_tails(isa, name):
    """Every length up to a few vectors: the scalar or masked tails compute the same function."""
    x = np.random.default_rng(3).standard_normal(70).astype(np.float32) * 5
    want, arg = act_ref(name, x)
    for n in range(71):
        got = getattr(_ops, name)(x[:n], isa=isa)
        assert_within(got, want[:n], act_bound(ACT_REL_TOL, want[:n], arg[:n]), f"{name} {isa} n={n}")


def test_activation_specials(isa):
    x = np.zeros(40, np.float32)  # inf and nan in vector lanes and in the tail
    x[[3, 37]], x[[5, 38]] = np.inf, np.nan
    for name in ("silu", "gelu", "gelu_erf"):
        got = getattr(_ops, name)(x, isa=isa)
        assert np.all(got[[3, 37]] == np.inf) and np.all(np.isnan(got[[5, 38]])), (name, isa)
        assert np.count_nonzero(got) == 4, (name, isa)


@pytest.mark.parametrize("name,act", [("swiglu", "silu"), ("geglu", "gelu")])
def test_gated(isa, name, act):
    rng = np.random.default_rng(4)
    for n in SIZES:
        gate = (rng.standard_normal(n) * 4).astype(np.float32)
        up = rng.standard_normal(n).astype(np.float32)
        a, arg = act_ref(act, gate)
        want = a * up
        got = getattr(_ops, name)(gate, up, isa=isa)
        # one more rounding for the product
        assert_within(got, want, act_bound(ACT_REL_TOL, want, arg) + F32_EPS * np.abs(want), f"{name} {isa} n={n}")


# ---- elementwise ------------------------------------------------------------------------------


def test_elementwise_is_exact(isa):
    """One IEEE operation per element: bit-equal to numpy's f32 arithmetic."""
    rng = np.random.default_rng(5)
    for n in SIZES:
        x = rng.standard_normal(n).astype(np.float32)
        y = rng.standard_normal(n).astype(np.float32)
        assert np.array_equal(_ops.add(x, y, isa=isa), x + y)
        assert np.array_equal(_ops.mul(x, y, isa=isa), x * y)
        assert np.array_equal(_ops.scale(x, 0.125, isa=isa), x * np.float32(0.125))
        assert np.array_equal(_ops.scale(x, 3.3, isa=isa), x * np.float32(3.3))


# ---- softmax ----------------------------------------------------------------------------------


def softmax_ref(x, scale, mask):
    a = x.astype(np.float64) * scale
    if mask is not None:
        a = a + mask
    shifted = a - a.max(axis=-1, keepdims=True)
    e = np.exp(shifted)
    return e / e.sum(axis=-1, keepdims=True), shifted


def test_softmax(isa):
    rng = np.random.default_rng(6)
    for n in SIZES:
        x = (rng.standard_normal((4, n)) * 8).astype(np.float32)
        for scale, with_mask in ((1.0, False), (0.125, True), (1 / math.sqrt(96), True)):
            mask = None
            if with_mask:  # causal-style: a random suffix of each row masked, never the first entry
                mask = np.zeros((4, n), np.float32)
                for r in range(4):
                    mask[r, rng.integers(1, n + 1):] = -np.inf
            want, shifted = softmax_ref(x, scale, mask)
            got = _ops.softmax(x, scale, mask, isa=isa)
            bound = SOFTMAX_REL_TOL * np.maximum(1.0, np.abs(np.where(np.isfinite(shifted), shifted, 0))) * want + TINY
            assert_within(got, want, bound, f"softmax {isa} n={n} scale={scale}")
            if with_mask:
                assert np.all(got[mask == -np.inf] == 0)
            np.testing.assert_allclose(got.astype(np.float64).sum(axis=-1), 1.0, rtol=0, atol=n * F32_EPS)


def test_softmax_large_scores_do_not_overflow(isa):
    x = np.array([1000.0, 999.0, -1000.0, 1000.0], np.float32)
    want, _ = softmax_ref(x, 1.0, None)
    np.testing.assert_allclose(_ops.softmax(x, isa=isa), want, rtol=SOFTMAX_REL_TOL, atol=TINY)


def test_softmax_fully_masked_row_is_zero(isa):
    mask = np.full(21, -np.inf, np.float32)
    got = _ops.softmax(np.ones(21, np.float32), 1.0, mask, isa=isa)
    assert np.array_equal(got, np.zeros(21, np.float32))


# ---- RoPE -------------------------------------------------------------------------------------

_libm = ctypes.CDLL(ctypes.util.find_library("m"))
_libm.powf.restype = ctypes.c_float
_libm.powf.argtypes = [ctypes.c_float, ctypes.c_float]


def ggml_angles(pos, n_rot, base, freq_scale, freq_factors):
    """[n_tokens, n_rot/2] f32 angles exactly as ggml's CPU rope cache computes them: theta starts
    at pos and is multiplied by powf(base, -2/n_rot) in f32 once per pair."""
    theta_scale = np.float32(_libm.powf(np.float32(base), np.float32(-2.0) / np.float32(n_rot)))
    theta = np.asarray(pos, np.int32).astype(np.float32)
    out = np.empty((len(theta), n_rot // 2), np.float32)
    for i in range(n_rot // 2):
        ff = np.float32(1.0) if freq_factors is None else np.float32(freq_factors[i])
        out[:, i] = np.float32(freq_scale) * (theta / ff)
        theta = theta * theta_scale
    return out


def exact_angles(pos, n_rot, base, freq_scale, freq_factors):
    i = np.arange(n_rot // 2, dtype=np.float64)
    ff = np.ones(n_rot // 2) if freq_factors is None else np.asarray(freq_factors, np.float64)
    return np.asarray(pos, np.float64)[:, None] * freq_scale * base ** (-2 * i / n_rot) / ff


def rope_ref(x, angles, n_rot, mode):
    """Rotate in float64 by the given [n_tokens, n_rot/2] angles."""
    y = x.astype(np.float64).copy()
    c = np.cos(angles.astype(np.float64))[:, None, :]
    s = np.sin(angles.astype(np.float64))[:, None, :]
    half = n_rot // 2
    if mode == "normal":
        a, b = y[..., 0:n_rot:2].copy(), y[..., 1:n_rot:2].copy()
        y[..., 0:n_rot:2], y[..., 1:n_rot:2] = a * c - b * s, a * s + b * c
    else:
        a, b = y[..., :half].copy(), y[..., half:n_rot].copy()
        y[..., :half], y[..., half:n_rot] = a * c - b * s, a * s + b * c
    return y


ROPE_CASES = [
    # n_heads, head_dim, n_rot, base, freq_scale: llama (smollm2), qwen2, gemma3, partial rotation
    (9, 64, 64, 1e5, 1.0),
    (14, 64, 64, 1e6, 1.0),
    (4, 256, 256, 1e6, 0.125),
    (3, 96, 32, 1e4, 1.0),
    (2, 24, 22, 1e4, 0.5),
]


def head_bound(x, tol):
    return tol * np.abs(x.astype(np.float64)).max(axis=-1, keepdims=True) + TINY


@pytest.mark.parametrize("mode", ["normal", "neox"])
@pytest.mark.parametrize("case", ROPE_CASES)
def test_rope_matches_ggml_angles(isa, mode, case):
    n_heads, head_dim, n_rot, base, freq_scale = case
    rng = np.random.default_rng(7)
    pos = np.concatenate([np.arange(5), rng.integers(0, 32768, 6)]).astype(np.int32)
    x = rng.standard_normal((len(pos), n_heads, head_dim)).astype(np.float32)
    got = _ops.rope(x, pos, n_rot, base, freq_scale, mode=mode, isa=isa)
    want = rope_ref(x, ggml_angles(pos, n_rot, base, freq_scale, None), n_rot, mode)
    assert_within(got, want, head_bound(x, ROPE_REL_TOL), f"rope {mode} {isa} {case}")
    # the dims past n_rot pass through untouched
    assert np.array_equal(got[..., n_rot:], x[..., n_rot:])


@pytest.mark.parametrize("mode", ["normal", "neox"])
def test_rope_matches_the_exact_formula(isa, mode):
    n_heads, head_dim, n_rot, base, freq_scale = 3, 128, 128, 1e4, 0.5
    rng = np.random.default_rng(8)
    pos = np.arange(256, dtype=np.int32)
    x = rng.standard_normal((256, n_heads, head_dim)).astype(np.float32)
    got = _ops.rope(x, pos, n_rot, base, freq_scale, mode=mode, isa=isa)
    want = rope_ref(x, exact_angles(pos, n_rot, base, freq_scale, None), n_rot, mode)
    assert_within(got, want, head_bound(x, ROPE_EXACT_ANGLE_TOL), f"rope {mode} {isa}")


def test_rope_freq_factors(isa):
    n_rot = 64
    rng = np.random.default_rng(9)
    ff = rng.uniform(1, 8, n_rot // 2).astype(np.float32)
    pos = rng.integers(0, 4096, 7).astype(np.int32)
    x = rng.standard_normal((7, 4, 64)).astype(np.float32)
    for mode in ("normal", "neox"):
        got = _ops.rope(x, pos, n_rot, 5e5, 1.0, mode=mode, freq_factors=ff, isa=isa)
        want = rope_ref(x, ggml_angles(pos, n_rot, 5e5, 1.0, ff), n_rot, mode)
        assert_within(got, want, head_bound(x, ROPE_REL_TOL), f"rope ff {mode} {isa}")


def test_rope_position_zero_is_identity(isa):
    x = np.random.default_rng(10).standard_normal((1, 2, 64)).astype(np.float32)
    for mode in ("normal", "neox"):
        assert np.array_equal(_ops.rope(x, [0], 64, 1e4, mode=mode, isa=isa), x)


def test_rope_levels_agree():
    rng = np.random.default_rng(11)
    pos = rng.integers(0, 32768, 9).astype(np.int32)
    x = rng.standard_normal((9, 5, 80)).astype(np.float32)
    for mode in ("normal", "neox"):
        scalar = _ops.rope(x, pos, 80, 1e6, mode=mode, isa="scalar")
        for isa in SIMD_ISAS:
            got = _ops.rope(x, pos, 80, 1e6, mode=mode, isa=isa)
            assert_within(got, scalar.astype(np.float64), head_bound(x, ROPE_REL_TOL), f"{mode} {isa}")


def test_rope_rejects_bad_shapes():
    x = np.zeros((2, 1, 8), np.float32)
    with pytest.raises(ValueError):
        _ops.rope(x, [0, 1], 9, 1e4)  # odd
    with pytest.raises(ValueError):
        _ops.rope(x, [0, 1], 10, 1e4)  # past head_dim
    with pytest.raises(ValueError):
        _ops.rope(x, [0], 8, 1e4)  # one position for two tokens
