"""Paged attention (csrc/ops/attention.c), every level this CPU runs: against a float64 numpy
reference over windows whose ends cut the aligned position groups, and bit-identity of one
query head's result whatever else shares the call (other heads of its KV head, the block size,
the block table): the per-head half of bubo's batch invariance.

The reference takes the values exactly as stored (f16 K/V widened, q8_0 dequantized), so the
tolerance covers only the kernel's f32 arithmetic: the dot products (head_dim terms), the
polynomial exp (~1e-6 relative per unit of |score - max|, tests/native/test_ops.py) and the
weighted sum."""
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf.quants import dequantize, quantize

from bubo import _kernels as K
from bubo import _ops

ISAS = K.supported_isas()
GROUP = _ops.ATTEND_GROUP
TYPES = {"f32": int(QT.F32), "f16": int(QT.F16), "q8_0": int(QT.Q8_0)}
# |out - ref| <= ATTN_TOL * (1 + max |score|) * max |V|, per element. Measured: 2.4e-8 (f32, f16 and
# q8_0 alike: the reference uses their stored values), over every level and window here.
ATTN_TOL = 2e-7


def _store(rows, type_name):
    """rows [..., d] f32 -> (bytes [..., row bytes], the values as stored, f64)."""
    if type_name == "f32":
        stored = rows.astype(np.float32)
        return stored.view(np.uint8), stored.astype(np.float64)
    if type_name == "f16":
        stored = rows.astype(np.float16)
        return stored.view(np.uint8), stored.astype(np.float64)
    raw = quantize(rows.astype(np.float32), QT.Q8_0)
    return np.ascontiguousarray(raw), dequantize(raw, QT.Q8_0).astype(np.float64)


class Cache:
    """One layer of a paged cache: n_pos positions in blocks of block_size, blocks in the pool
    in a shuffled order (table[i] holds positions i*bs .. i*bs+bs-1), plus a spare block."""

    def __init__(self, rng, type_name, n_pos, block_size, n_head_kv, head_dim, scale=1.0):
        self.type_name, self.type_id = type_name, TYPES[type_name]
        self.block_size, self.head_dim = block_size, head_dim
        k = (rng.standard_normal((n_pos, n_head_kv, head_dim)) * scale).astype(np.float32)
        v = rng.standard_normal((n_pos, n_head_kv, head_dim)).astype(np.float32)
        n_table = -(-n_pos // block_size)
        self.table = rng.permutation(n_table + 1)[:n_table].astype(np.int32)
        kb, self.k = _store(k, type_name)
        vb, self.v = _store(v, type_name)
        self.k_pool = self._pool(kb, n_table + 1)
        self.v_pool = self._pool(vb, n_table + 1)

    def _pool(self, rows, n_blocks):
        pool = np.zeros((n_blocks, self.block_size) + rows.shape[1:], np.uint8)
        for i in range(rows.shape[0]):
            pool[self.table[i // self.block_size], i % self.block_size] = rows[i]
        return pool

    def query(self, q):
        """q [n_q, d] f32 -> (rows in the vec_dot_type, the values as the kernel sees them)."""
        if self.type_name == "q8_0":
            return _store(q, "q8_0")
        return q.astype(np.float32).view(np.uint8), q.astype(np.float32).astype(np.float64)

    def attend(self, kv_head, begin, end, q_bytes, kq_scale, isa):
        """One token's heads q_bytes [n_q, bytes] over [begin, end)."""
        return self.attend_tokens(kv_head, [begin], [end], q_bytes[None], kq_scale, isa)[0]

    def attend_tokens(self, kv_head, begins, ends, q_bytes, kq_scale, isa):
        """Tokens' heads q_bytes [n_tok, n_q, bytes], token t over [begins[t], ends[t])."""
        return _ops.attend_paged(self.type_id, self.k_pool, self.v_pool, self.table, kv_head, self.head_dim,
                                 self.head_dim, begins, ends, np.ascontiguousarray(q_bytes), kq_scale, isa=isa)


def attend_ref(cache, kv_head, begin, end, q, kq_scale):
    k = cache.k[begin:end, kv_head]
    v = cache.v[begin:end, kv_head]
    s = kq_scale * (q @ k.T)
    p = np.exp(s - s.max(axis=1, keepdims=True))
    return (p @ v) / p.sum(axis=1, keepdims=True), np.abs(s).max(), np.abs(v).max()


# windows that start and end inside a group, on its edges, span one position, or many groups
WINDOWS = [(0, 1), (0, 16), (0, 17), (5, 6), (5, 21), (16, 48), (3, 200), (17, 31), (31, 33), (100, 293)]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("type_name", list(TYPES))
@pytest.mark.parametrize("head_dim", [64, 256])
def test_attention_vs_float64(isa, type_name, head_dim):
    rng = np.random.default_rng(1)
    n_head_kv, n_q = 2, 3
    cache = Cache(rng, type_name, 300, 32, n_head_kv, head_dim, scale=2.0)
    kq_scale = 1.0 / np.sqrt(head_dim)
    for begin, end in WINDOWS:
        for kv_head in range(n_head_kv):
            q_bytes, q = cache.query(rng.standard_normal((n_q, head_dim)).astype(np.float32))
            got = cache.attend(kv_head, begin, end, q_bytes, kq_scale, isa)
            want, s_max, v_max = attend_ref(cache, kv_head, begin, end, q, kq_scale)
            bound = ATTN_TOL * (1 + s_max) * v_max
            err = np.abs(got - want).max()
            assert err <= bound, f"{type_name} {isa} [{begin}, {end}) head {kv_head}: {err:.3g} > {bound:.3g}"


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("type_name,head_dim", [("f32", 8), ("f32", 40), ("f32", 72), ("f32", 128), ("q8_0", 32),
                                                ("q8_0", 96), ("q8_0", 128), ("q8_0", 576)])
def test_head_dims_off_the_vector_width(isa, type_name, head_dim):
    """The V accumulation's tails (head_dim not a multiple of 16 or 8) use the same fused steps; a
    q8_0 head off the 64-element chunks of its block kernels scores through the kernel table's vec_dot,
    and one of many chunks (576: 9) joins them all in order."""
    rng = np.random.default_rng(head_dim)
    cache = Cache(rng, type_name, 70, 16, 1, head_dim)
    q_bytes, q = cache.query(rng.standard_normal((2, head_dim)).astype(np.float32))
    got = cache.attend(0, 7, 70, q_bytes, 0.3, isa)
    want, s_max, v_max = attend_ref(cache, 0, 7, 70, q, 0.3)
    assert np.abs(got - want).max() <= ATTN_TOL * (1 + s_max) * v_max


@pytest.mark.parametrize("isa", ISAS)
def test_large_scores_do_not_overflow(isa):
    """Scores in the hundreds: the running max keeps every exp argument <= 0, and a later,
    larger score rescales the earlier groups (to 0 here, far below it)."""
    rng = np.random.default_rng(2)
    cache = Cache(rng, "f32", 100, 32, 1, 32, scale=30.0)
    q_bytes, q = cache.query(rng.standard_normal((4, 32)).astype(np.float32) * 10)
    got = cache.attend(0, 0, 100, q_bytes, 1.0, isa)
    want, s_max, v_max = attend_ref(cache, 0, 0, 100, q, 1.0)
    assert np.isfinite(got).all()
    assert np.abs(got - want).max() <= ATTN_TOL * (1 + s_max) * v_max


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("type_name", ["f16", "q8_0"])
@pytest.mark.parametrize("sink", [0.0, 6.0, 12.0, 24.0])
def test_chunked_is_the_unchunked_result_to_rounding(isa, type_name, sink):
    """The same K/V rows at positions [0, W) (inside the first chunk: one softmax, nothing merged)
    and at [S, S + W) (across the boundary at ATTEND_CHUNK: two partials merged), S a multiple of
    the group so that the groups hold the same rows: the two results differ by float rounding
    only, also where the first row is an attention sink whose score dominates (sink x the mean
    query as its key: scores up to 33 above the rest, as qwen2's first positions). Measured on every
    level: the two at most 3e-6 apart where the float64 reference is 5e-6 from either (the exp of
    arguments around -12 rounds that far), equal bits past a gap of 25. The second chunk's rows
    move the exact result by 0.31, 0.043 and 3.7e-5 at sinks 0, 6 and 12: a merge that lost them,
    or weighed them with the wrong maximum, fails."""
    chunk, width, head_dim, n_q = _ops.ATTEND_CHUNK, 150, 64, 4
    start = chunk - 6 * GROUP  # the window's last 150 - 96 rows in the second chunk
    if start < width:
        pytest.skip(f"a build with chunks of {chunk} positions: the window does not fit in one")
    rng = np.random.default_rng(int(sink))
    q = rng.standard_normal((n_q, head_dim)).astype(np.float32)
    k = rng.standard_normal((width, 1, head_dim)).astype(np.float32)
    v = rng.standard_normal((width, 1, head_dim)).astype(np.float32)
    k[0, 0] = q.mean(axis=0) * sink
    v[0, 0] *= 3.0
    cache = Cache(rng, type_name, start + width, 32, 1, head_dim)
    kb, k_stored = _store(k, type_name)
    vb, v_stored = _store(v, type_name)
    rows_k = np.zeros((start + width,) + kb.shape[1:], np.uint8)
    rows_v = np.zeros((start + width,) + vb.shape[1:], np.uint8)
    for base in (0, start):
        rows_k[base : base + width], rows_v[base : base + width] = kb, vb
    cache.k_pool, cache.v_pool = cache._pool(rows_k, cache.k_pool.shape[0]), cache._pool(rows_v, cache.v_pool.shape[0])
    cache.k, cache.v = k_stored, v_stored  # the reference reads positions [0, W)
    q_bytes, q_seen = cache.query(q)
    whole = cache.attend(0, 0, width, q_bytes, 0.125, isa)
    merged = cache.attend(0, start, start + width, q_bytes, 0.125, isa)
    want, s_max, v_max = attend_ref(cache, 0, 0, width, q_seen, 0.125)
    # float rounding, as test_attention_vs_float64 bounds it: 3.4e-5 at sink 12, where the second
    # chunk's rows move the exact result by 3.7e-5 (at sinks 0 and 6: 8e-6 and 2.6e-5 against 0.31, 0.043)
    bound = ATTN_TOL * (1 + s_max) * v_max
    diff = np.abs(whole - merged).max()
    assert diff <= bound, (isa, type_name, diff, bound)
    assert np.abs(merged - want).max() <= bound and np.abs(whole - want).max() <= bound


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("type_name", list(TYPES))
def test_a_head_is_the_same_alone_grouped_or_in_any_block_layout(isa, type_name):
    """One query head's result, bit for bit: alone, among other heads of its KV head (at any
    index), and over caches holding the same rows in blocks of other sizes and other orders."""
    head_dim, n_pos, n_q = 64, 150, 7
    layouts = [(32, 0), (16, 1), (1, 2), (7, 3), (48, 4), (256, 5)]  # (block size, table shuffle seed)
    caches = []
    for bs, seed in layouts:
        c = Cache(np.random.default_rng(9), type_name, n_pos, bs, 2, head_dim)  # same rows: same seed
        # the same rows in another table order
        perm = np.random.default_rng(seed).permutation(c.k_pool.shape[0])
        inv = np.argsort(perm)
        c.k_pool, c.v_pool = np.ascontiguousarray(c.k_pool[perm]), np.ascontiguousarray(c.v_pool[perm])
        c.table = inv[c.table].astype(np.int32)
        caches.append(c)
    q_bytes, _ = caches[0].query(np.random.default_rng(3).standard_normal((n_q, head_dim)).astype(np.float32))
    for begin, end in [(0, 150), (21, 149), (37, 38)]:
        alone = np.stack([caches[0].attend(1, begin, end, q_bytes[h : h + 1], 0.125, isa)[0] for h in range(n_q)])
        for c in caches:
            grouped = c.attend(1, begin, end, q_bytes, 0.125, isa)
            assert np.array_equal(grouped.view(np.uint32), alone.view(np.uint32)), (c.block_size, begin, end)
            # a slice of the heads, as forward.c makes for small decode steps
            part = c.attend(1, begin, end, q_bytes[2:5], 0.125, isa)
            assert np.array_equal(part.view(np.uint32), alone[2:5].view(np.uint32))


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("type_name", ["f16", "q8_0"])
def test_a_token_is_the_same_alone_or_among_other_tokens(isa, type_name):
    """A prompt's tokens attended together (causal ends, a sliding window's begins, in any order,
    with repeats) give each (token, head) the bits it gets alone."""
    rng = np.random.default_rng(6)
    head_dim, n_q = 64, 3
    cache = Cache(rng, type_name, 120, 32, 2, head_dim)
    ends = np.array([70, 71, 72, 90, 17, 71, 120, 1, 33, 64, 65, 100, 101, 102, 5, 48], np.int32)
    for window in (0, 20):
        begins = np.maximum(ends - window, 0) if window else np.zeros_like(ends)
        q_bytes, _ = cache.query(rng.standard_normal((len(ends) * n_q, head_dim)).astype(np.float32))
        q_bytes = q_bytes.reshape(len(ends), n_q, -1)
        together = cache.attend_tokens(0, begins, ends, q_bytes, 0.125, isa)
        for t in range(len(ends)):
            alone = cache.attend(0, begins[t], ends[t], q_bytes[t], 0.125, isa)
            assert np.array_equal(together[t].view(np.uint32), alone.view(np.uint32)), (window, t)
        # a subset, in another order
        sub = [5, 0, 11, 3]
        part = cache.attend_tokens(0, begins[sub], ends[sub], q_bytes[sub], 0.125, isa)
        assert np.array_equal(part.view(np.uint32), together[sub].view(np.uint32))


@pytest.mark.parametrize("type_name", ["f16", "q8_0"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_levels_agree_bit_for_bit(type_name, head_dim):
    """Every level computes one scalar formula per score (the same lanes, summed in one tree order;
    q8_0 blocks as exact integers, joined in order by fused multiply-adds) and accumulates V with
    fused multiply-adds, and their exps agree in the normal range: with scores whose weights stay
    normal, the levels give the same bits."""
    if len(ISAS) < 2:
        pytest.skip(f"this CPU runs one level only ({ISAS})")
    rng = np.random.default_rng(4)
    cache = Cache(rng, type_name, 200, 32, 1, head_dim)
    q_bytes, _ = cache.query(rng.standard_normal((3, head_dim)).astype(np.float32))
    results = [cache.attend(0, 13, 200, q_bytes, 0.125, isa) for isa in ISAS]
    for isa, r in zip(ISAS, results):
        assert np.array_equal(r.view(np.uint32), results[0].view(np.uint32)), isa


def test_rejects_bad_arguments():
    rng = np.random.default_rng(5)
    cache = Cache(rng, "f32", 40, 16, 1, 32)
    q_bytes, _ = cache.query(np.ones((1, 32), np.float32))
    with pytest.raises(ValueError):
        cache.attend(0, 5, 5, q_bytes, 1.0, None)  # empty range
    with pytest.raises(ValueError):
        cache.attend(0, 0, 49, q_bytes, 1.0, None)  # past the table
    with pytest.raises(ValueError):
        cache.attend(1, 0, 10, q_bytes, 1.0, None)  # no such KV head
    with pytest.raises(ValueError):
        cache.attend_tokens(0, [0, 0], [4, 5], q_bytes[None], 1.0, None)  # two ranges, one token
