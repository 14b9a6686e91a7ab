"""The matrix-matrix tile kernels (vec_dot_tile): every variant this CPU runs, for every supported
weight type, against the scalar vec_dot of each (row, token) pair, on tiles with ragged edges
(rows not a multiple of the 16 a register holds, tokens not a multiple of the micro tile or of
the chunk, columns not a multiple of the panel) and with row, activation and output strides
wider than the data."""
import numpy as np
import pytest
from test_matmul import SUPPORTED_TYPES, decode_activations, make_weights

from bubo import _kernels as K

F32 = 0

# |tile - vec_dot| <= tol * sum_i |w_i x_i| per output. The tile adds the same exact per-block
# integer products as vec_dot but in another order (one fma per block, mins folded per block),
# so the two differ by f32 rounding of the running sum: a few ulps of the magnitude sum.
TILE_FLOAT_REL_TOL = 1e-6
TILE_QUANT_REL_TOL = 1e-5

# (rows, tokens): single outputs, exact register and micro-tile multiples, one past them, and a
# token count past the 64-token chunk with a ragged micro tile in each chunk
SHAPES = [(1, 1), (16, 8), (17, 9), (15, 7), (33, 70), (5, 131)]


def blocks_for(type_id):
    info = K.type_info(type_id)
    return max(info["blck_size"], K.type_info(info["vec_dot_type"])["blck_size"])


def pad_lines(a, extra, rng):
    """a [n, m] bytes -> [n, m + extra] with random bytes after each line: a stride wider than
    the row, whose padding the kernel must not read as data."""
    out = rng.integers(0, 256, size=(a.shape[0], a.shape[1] + extra), dtype=np.uint8)
    out[:, : a.shape[1]] = a
    return out


def operands(type_id, rows, tokens, n, rng):
    w_bytes, w_exact = make_weights(type_id, rows, n, rng)
    w = w_bytes.reshape(rows, -1)
    x = rng.standard_normal((tokens, n)).astype(np.float32)
    vdt = K.type_info(type_id)["vec_dot_type"]
    if vdt == F32:
        y = x.view(np.uint8).reshape(tokens, -1)
        xa = x.astype(np.float64)
    else:
        y = np.stack([K.quantize(vdt, row) for row in x])
        xa = np.stack([decode_activations(vdt, row, n) for row in y])
    tol = TILE_FLOAT_REL_TOL if vdt == F32 else TILE_QUANT_REL_TOL
    return w, y, tol * (np.abs(xa) @ np.abs(w_exact).T)


def pairwise(type_id, w, y, n, isa):
    """out[t, r] by the scalar vec_dot, one pair at a time."""
    row_bytes = K.row_size(type_id, n)
    act_bytes = K.row_size(K.type_info(type_id)["vec_dot_type"], n)
    return np.array([[K.vec_dot(type_id, wr[:row_bytes].tobytes(), yt[:act_bytes].tobytes(), isa=isa) for wr in w]
                     for yt in y], np.float32)


def tile_variants():
    isas = set(K.supported_isas())
    return [(t, isa) for t in SUPPORTED_TYPES for isa in K.type_info(t)["vec_dot_tile"] if isa in isas]


@pytest.mark.parametrize("type_id,isa", tile_variants(),
                         ids=lambda v: K.type_info(v)["name"] if isinstance(v, int) else v)
@pytest.mark.parametrize("rows,tokens", SHAPES, ids=lambda v: str(v))
def test_tile_matches_vec_dot(type_id, isa, rows, tokens):
    rng = np.random.default_rng(type_id * 7919 + rows * 131 + tokens)
    blck = blocks_for(type_id)
    # 9 legacy blocks: one full 8-block panel and a one-block panel; 288 elements = 1 k-block + 32
    n = blck * (9 if blck == 32 else 2) if rows * tokens > 100 else blck * 3
    w, y, bound = operands(type_id, rows, tokens, n, rng)
    want = pairwise(type_id, w, y, n, "scalar")
    s_stride = rows + 3
    got = K.vec_dot_tile(type_id, n, pad_lines(w, 7, rng), pad_lines(y, 5, rng), isa=isa, s_stride=s_stride)
    assert np.all(np.isnan(got[:, rows:])), "wrote outside the tile"
    err = np.abs(got[:, :rows] - want)
    assert np.all(err <= bound), f"worst {np.max(err / np.maximum(bound, 1e-30)):.3g} of the bound"
    if isa == "scalar":  # the fallback is vec_dot looped: the same bits
        assert np.array_equal(got[:, :rows], want)


@pytest.mark.parametrize("type_id,isa", tile_variants(),
                         ids=lambda v: K.type_info(v)["name"] if isinstance(v, int) else v)
def test_tile_result_does_not_depend_on_tile_shape(type_id, isa):
    """An output's bits are the same in a sub-tile as in the whole tile, whichever edge it sits
    on: the matmul driver's split over threads and chunks never changes a result."""
    rng = np.random.default_rng(type_id)
    rows, tokens = 40, 75
    n = blocks_for(type_id) * (11 if blocks_for(type_id) == 32 else 2)
    w, y, _ = operands(type_id, rows, tokens, n, rng)
    whole = K.vec_dot_tile(type_id, n, w, y, isa=isa)
    for r0, r1, t0, t1 in [(0, 1, 0, 1), (3, 20, 5, 14), (16, 40, 8, 75), (39, 40, 70, 75), (1, 34, 0, 9)]:
        part = K.vec_dot_tile(type_id, n, w[r0:r1], y[t0:t1], isa=isa)
        assert np.array_equal(part, whole[t0:t1, r0:r1]), (r0, r1, t0, t1)


@pytest.mark.parametrize("type_id", SUPPORTED_TYPES, ids=lambda t: K.type_info(t)["name"])
def test_every_vec_dot_has_a_tile(type_id):
    info = K.type_info(type_id)
    assert info["vec_dot_tile"] == info["vec_dot"]


@pytest.mark.parametrize("type_id,isa", tile_variants(),
                         ids=lambda v: K.type_info(v)["name"] if isinstance(v, int) else v)
def test_tile_empty_shapes(type_id, isa):
    vdt = K.type_info(type_id)["vec_dot_type"]
    n = blocks_for(type_id)
    w = np.zeros((9, K.row_size(type_id, n)), np.uint8)
    y = np.zeros((7, K.row_size(vdt, n)), np.uint8)
    # no columns: every dot product is an empty sum (whole register blocks of rows and tokens too)
    assert np.array_equal(K.vec_dot_tile(type_id, 0, w, y, isa=isa), np.zeros((7, 9), np.float32))
    w, y = w[:3], y[:2]
    assert K.vec_dot_tile(type_id, n, w[:0], y, isa=isa).shape == (2, 0)
    assert K.vec_dot_tile(type_id, n, w, y[:0], isa=isa).shape == (0, 3)


FLOAT_TYPES = [0, 1, 30]  # F32, F16, BF16: one element per block, so the shapes above barely reach their SIMD loops


@pytest.mark.parametrize("type_id,isa", [(t, i) for t in FLOAT_TYPES for i in K.type_info(t)["vec_dot_tile"]
                                          if i in set(K.supported_isas())],
                         ids=lambda v: K.type_info(v)["name"] if isinstance(v, int) else v)
@pytest.mark.parametrize("rows,tokens", [(1, 1), (9, 1), (4, 3), (9, 7), (17, 10), (3, 2), (8, 13), (8, 8), (4, 6)],
                         ids=lambda v: str(v))
@pytest.mark.parametrize("n", [5, 384, 389, 400, 421], ids=lambda v: f"n{v}")
def test_float_tile_gives_vec_dot_bits_on_long_rows(type_id, isa, rows, tokens, n):
    """Rows shorter than one SIMD step (5), of whole 64-element steps (384), with a scalar or
    masked tail (389), of whole 16-element steps past the last 64 (400), and both (421): each
    tile output has its own vec_dot's bits at the same level, whatever its place in the tile (the
    register-blocked tiles keep vec_dot's order per output: at AVX-512 F32's and BF16's four
    chains, run one after the other; F16's one chain, also for one token, four rows at a time),
    and nothing is written outside the tile."""
    rng = np.random.default_rng(rows * 31 + tokens + n)
    w, y, _ = operands(type_id, rows, tokens, n, rng)
    want = pairwise(type_id, w, y, n, isa)
    got = K.vec_dot_tile(type_id, n, pad_lines(w, 6, rng), pad_lines(y, 4, rng), isa=isa, s_stride=rows + 1)
    assert np.array_equal(got[:, :rows], want)
    assert np.all(np.isnan(got[:, rows:])), "wrote outside the tile"


@pytest.mark.parametrize("type_id,isa", [(t, i) for t in FLOAT_TYPES for i in K.type_info(t)["vec_dot_tile"]
                                          if i in set(K.supported_isas())],
                         ids=lambda v: K.type_info(v)["name"] if isinstance(v, int) else v)
@pytest.mark.parametrize("rows,tokens", [(9, 70), (5, 131), (17, 100)], ids=lambda v: str(v))
def test_float_tile_many_tokens_gives_vec_dot_bits(type_id, isa, rows, tokens):
    """Enough tokens (over 96 KiB of activations) for the F16 tile's tokens-outer order."""
    rng = np.random.default_rng(rows * 17 + tokens)
    n = 389
    w, y, _ = operands(type_id, rows, tokens, n, rng)
    want = pairwise(type_id, w, y, n, isa)
    got = K.vec_dot_tile(type_id, n, w, y, isa=isa)
    assert np.array_equal(got, want)


@pytest.mark.parametrize("type_id,isa", [(t, i) for t in FLOAT_TYPES for i in K.type_info(t)["vec_dot_tile"]
                                          if i in set(K.supported_isas())],
                         ids=lambda v: K.type_info(v)["name"] if isinstance(v, int) else v)
def test_float_tile_rows_in_chunks_give_vec_dot_bits(type_id, isa):
    """Long rows (2053 elements: 4-8 KB each) and over 96 KiB of activations: the tokens-outer
    order takes the rows in chunks of 256-512 KiB of weights (60-124 rows here, the last chunk
    partial, two rows past the last block of four), every output still its vec_dot's bits."""
    rng = np.random.default_rng(type_id + 7)
    rows, tokens, n = 130, 13, 2053
    w, y, _ = operands(type_id, rows, tokens, n, rng)
    want = pairwise(type_id, w, y, n, isa)
    got = K.vec_dot_tile(type_id, n, w, y, isa=isa)
    assert np.array_equal(got, want)
