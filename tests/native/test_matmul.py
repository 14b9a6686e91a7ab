"""The matmul driver, for every weight type whose table row is filled: against a float64 product
of the gguf package's dequantized weights, for one token (matrix-vector) and several (tiles),
with results that do not depend on the thread count or on which level's kernels run."""
import numpy as np
import pytest
from gguf import GGMLQuantizationType as GT
from gguf import quants as gq

from bubo import _kernels as K
from bubo import _ops
from bubo.errors import UnsupportedError

from blocks import realistic_rows

F32 = 0
SUPPORTED_TYPES = [t for t in K.type_ids() if K.type_info(t)["supported"]]
ISAS = K.supported_isas()

# |y - y_ref| <= tol * sum_i |w_i x_i| per output. Float weights: the dot products' f32
# summation (about 1e-7 measured, as in test_float_types). Quantized weights multiply integer
# blocks exactly and then sum per-block f32 terms, including separately applied mins, which can
# exceed |w x| term by term: a looser bound.
MATMUL_FLOAT_REL_TOL = 1e-6
MATMUL_QUANT_REL_TOL = 1e-5


# ---- activation blocks as numpy sees them ------------------------------------------------------
# The activations of quantized weights are quantized by bubo (its own tests check that against
# gguf); the reference decodes bubo's blocks here, so that it multiplies exactly what the kernels do.

Q8_LAYOUTS = {  # vec_dot_type id: numpy dtype of one block, elements per block
    8: (np.dtype([("d", "<f2"), ("qs", "i1", 32)]), 32),  # Q8_0
    9: (np.dtype([("d", "<f4"), ("s", "<f4"), ("qs", "i1", 32)]), 32),  # Q8_1
    15: (np.dtype([("d", "<f4"), ("qs", "i1", 256), ("bsums", "<i2", 16)]), 256),  # Q8_K
}


def decode_activations(type_id, data, n):
    dtype, blck = Q8_LAYOUTS[type_id]
    blocks = np.frombuffer(np.ascontiguousarray(data).tobytes(), dtype=dtype)
    assert blocks.size * blck == n
    return (blocks["d"].astype(np.float64)[:, None] * blocks["qs"].astype(np.float64)).reshape(-1)


def test_q8_0_decoder_matches_gguf():
    x = np.random.default_rng(0).standard_normal(96).astype(np.float32)
    data = gq.quantize(x, GT.Q8_0)
    assert np.array_equal(decode_activations(8, data, 96), gq.dequantize(data, GT.Q8_0).astype(np.float64))


# ---- the product -------------------------------------------------------------------------------


def cols_for(type_id):
    """About 200 columns, an odd number of blocks: not a multiple of 64 unless the block is."""
    info = K.type_info(type_id)
    blck = max(info["blck_size"], K.type_info(info["vec_dot_type"])["blck_size"])
    k = -(-200 // blck)
    return blck * (k if k % 2 else k + 1)


def make_weights(type_id, rows, cols, rng):
    """Weight bytes and their float64 values as the gguf package dequantizes them."""
    blocks = realistic_rows(GT(type_id), rows, cols, int(rng.integers(1 << 30)))
    data = np.ascontiguousarray(blocks).view(np.uint8).reshape(-1)
    dequant = gq.dequantize(data.reshape(rows, -1), GT(type_id))
    return data, np.asarray(dequant, np.float64).reshape(rows, cols)


def reference(type_id, w_exact, x):
    vdt = K.type_info(type_id)["vec_dot_type"]
    if vdt == F32:
        xa = x.astype(np.float64)
    else:
        n_tokens, cols = x.shape
        xa = decode_activations(vdt, K.quantize(vdt, x.reshape(-1)), n_tokens * cols).reshape(n_tokens, cols)
    tol = MATMUL_FLOAT_REL_TOL if vdt == F32 else MATMUL_QUANT_REL_TOL
    return xa @ w_exact.T, tol * (np.abs(xa) @ np.abs(w_exact).T)


@pytest.mark.parametrize("type_id", SUPPORTED_TYPES, ids=lambda t: K.type_info(t)["name"])
@pytest.mark.parametrize("n_tokens", [1, 3, 17, 64])
@pytest.mark.parametrize("rows", [37, 100])
def test_matmul_vs_float64(type_id, n_tokens, rows):
    rng = np.random.default_rng(type_id * 1000 + n_tokens * 10 + rows)
    cols = cols_for(type_id)
    data, w_exact = make_weights(type_id, rows, cols, rng)
    x = rng.standard_normal((n_tokens, cols)).astype(np.float32)
    want, bound = reference(type_id, w_exact, x)
    got = _ops.matmul(None, type_id, data, rows, cols, x)
    assert got.shape == (n_tokens, rows)
    err = np.abs(got - want)
    assert np.all(err <= bound), f"worst {np.max(err / bound):.3g} of the bound"
    # each output is computed in one summation order by one thread: any thread count gives the same bits
    for n_threads in (1, 2, 3, 4):
        pool = _ops.ThreadPool(n_threads)
        for _ in range(3):
            assert np.array_equal(_ops.matmul(pool, type_id, data, rows, cols, x), got), n_threads


@pytest.mark.parametrize("type_id", SUPPORTED_TYPES, ids=lambda t: K.type_info(t)["name"])
def test_matmul_every_level(type_id, native_env):
    """BUBO_FORCE_ISA caps the level the driver's kernels come from; each stays within the bound."""
    rng = np.random.default_rng(type_id)
    rows, cols = 45, cols_for(type_id)
    data, w_exact = make_weights(type_id, rows, cols, rng)
    x = rng.standard_normal((5, cols)).astype(np.float32)
    pool = _ops.ThreadPool(2)
    for isa in ISAS:
        native_env.setenv("BUBO_FORCE_ISA", isa)
        want, bound = reference(type_id, w_exact, x)
        got = _ops.matmul(pool, type_id, data, rows, cols, x)
        assert np.all(np.abs(got - want) <= bound), isa


def test_matmul_one_row_and_one_column():
    w = np.array([[2.5]], np.float32)
    x = np.array([[4.0], [-1.0]], np.float32)
    assert _ops.matmul(None, F32, w.view(np.uint8).reshape(-1), 1, 1, x).tolist() == [[10.0], [-2.5]]


def test_matmul_rejects_bad_arguments():
    w = np.zeros(4 * 8, np.uint8)
    with pytest.raises(ValueError):
        _ops.matmul(None, F32, w, 2, 3, np.zeros((1, 3), np.float32))  # W too small for [2, 3]
    with pytest.raises(ValueError):
        _ops.matmul(None, 999, w, 1, 8, np.zeros((1, 8), np.float32))  # no such type
    unsupported = [t for t in K.type_ids() if not (i := K.type_info(t))["supported"] and i["blck_size"] == 32]
    if unsupported:
        t = unsupported[0]
        size = K.type_info(t)["type_size"]
        with pytest.raises(UnsupportedError):
            _ops.matmul(None, t, np.zeros(size, np.uint8), 1, 32, np.zeros((1, 32), np.float32))
