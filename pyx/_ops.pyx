# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""numpy-in, numpy-out entry points to the float ops, the thread pool and the matmul driver
(the kernel table's variants are in bubo._kernels). `isa` names a level ("scalar", "avx2", "avx512", "neon"); None means this
CPU's best."""
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t

import numpy as np

from common cimport bubo_status, bubo_err, BUBO_OK, BUBO_ERR_IO, BUBO_ERR_FORMAT, BUBO_ERR_UNSUPPORTED, BUBO_ERR_NOMEM, BUBO_ERR_INVALID
from cpu cimport bubo_isa, bubo_cpu_supports, bubo_cpu_best_isa, bubo_isa_name, BUBO_ISA_COUNT
from quants cimport (bubo_type, bubo_type_traits, bubo_type_get_traits, bubo_row_size, bubo_prepacked_size,
                     bubo_prepack_isa, BUBO_TYPE_F32, BUBO_TYPE_F16)
from threadpool cimport (bubo_pool, bubo_pool_create, bubo_pool_free, bubo_pool_n_threads,
                         bubo_pool_run, bubo_pool_barrier, bubo_pool_capacity, bubo_pool_set_active)
from ops cimport (bubo_ops, bubo_ops_for_isa, bubo_ops_best, bubo_rope_params, BUBO_ROPE_NORMAL,
                  BUBO_ROPE_NEOX, bubo_matmul_scratch_size, bubo_matmul, bubo_matmul_prepack, bubo_matmul_prepacked,
                  bubo_prepacked_row,
                  BUBO_ATTEND_GROUP, BUBO_ATTEND_CHUNK, bubo_attend_scratch_floats, bubo_attend_paged_isa)
from kv cimport bubo_kv_view

include "status.pxi"


# ---- levels ---------------------------------------------------------------------------------

cdef bubo_isa _isa_from_name(str name) except *:
    cdef int i
    for i in range(BUBO_ISA_COUNT):
        if bubo_isa_name(<bubo_isa>i).decode() == name:
            return <bubo_isa>i
    raise ValueError(f"unknown isa {name!r}")


cdef const bubo_ops *_ops(isa) except NULL:
    if isa is None:
        return bubo_ops_best()
    cdef const bubo_ops *t = bubo_ops_for_isa(_isa_from_name(isa))
    if t == NULL:
        raise ValueError(f"isa {isa!r} is not available on this CPU")
    return t


def ops_isa(isa=None):
    """The level whose op table `isa` selects (None: the one bubo picked for this CPU)."""
    return bubo_isa_name(_ops(isa).isa).decode()


# ---- ops --------------------------------------------------------------------------------------

cdef _f32(a):
    return np.ascontiguousarray(a, dtype=np.float32)


cdef const float *_row_or_null(object a, int64_t n, str name, list keep) except? NULL:
    """a's data as one row of n floats (kept alive in keep), or NULL for None."""
    if a is None:
        return NULL
    cdef const float[::1] v = _f32(a).reshape(-1)
    if v.shape[0] != n:
        raise ValueError(f"{name} has {v.shape[0]} elements, rows have {n}")
    keep.append(v)
    return &v[0]


cdef _norm_rows(x, w, b, float eps, isa, bint centered):
    """Each row of x (the last axis) through the level's rms_norm, or its layer_norm (centered)."""
    cdef const bubo_ops *t = _ops(isa)
    out = _f32(x).copy()
    cdef int64_t n = out.shape[out.ndim - 1] if out.ndim else 1
    cdef float[:, ::1] rows = out.reshape(-1, n)
    keep: list = []
    cdef const float *wp = _row_or_null(w, n, "w", keep)
    cdef const float *bp = _row_or_null(b, n, "b", keep)
    cdef Py_ssize_t r
    with nogil:
        for r in range(rows.shape[0]):
            if centered:
                t.layer_norm(n, &rows[r, 0], &rows[r, 0], wp, bp, eps)
            else:
                t.rms_norm(n, &rows[r, 0], &rows[r, 0], wp, eps)
    return out


def rms_norm(x, w, float eps, isa=None):
    """Each row of x (the last axis) normalized; w (one row) or None."""
    return _norm_rows(x, w, None, eps, isa, False)


def layer_norm(x, w, b, float eps, isa=None):
    """Each row of x (the last axis) centered and normalized, times w plus b (one row each, or
    None)."""
    return _norm_rows(x, w, b, eps, isa, True)


_ROPE_MODES = {"normal": BUBO_ROPE_NORMAL, "neox": BUBO_ROPE_NEOX}


def rope(x, pos, int n_rot, float freq_base, float freq_scale=1.0, str mode="normal", freq_factors=None, isa=None):
    """x [n_tokens, n_heads, head_dim] rotated (a copy); pos [n_tokens] int."""
    cdef const bubo_ops *t = _ops(isa)
    out = _f32(x).copy()
    if out.ndim != 3:
        raise ValueError("x must be [n_tokens, n_heads, head_dim]")
    cdef int64_t n_tokens = out.shape[0]
    cdef int n_heads = out.shape[1], head_dim = out.shape[2]
    if n_rot < 0 or n_rot % 2 or n_rot > head_dim:
        raise ValueError(f"n_rot={n_rot} must be even and within head_dim={head_dim}")
    if mode not in _ROPE_MODES:
        raise ValueError(f"mode must be one of {sorted(_ROPE_MODES)}")
    cdef const int32_t[::1] pv = np.ascontiguousarray(pos, dtype=np.int32)
    if pv.shape[0] != n_tokens:
        raise ValueError(f"{pv.shape[0]} positions for {n_tokens} tokens")
    cdef bubo_rope_params p
    p.mode = _ROPE_MODES[mode]
    p.n_rot = n_rot
    p.freq_base = freq_base
    p.freq_scale = freq_scale
    p.freq_factors = NULL
    p.angles = NULL
    cdef const float[::1] ff
    if freq_factors is not None:
        ff = _f32(freq_factors).reshape(-1)
        if ff.shape[0] != n_rot // 2:
            raise ValueError(f"freq_factors needs n_rot/2 = {n_rot // 2} entries")
        if ff.shape[0]:
            p.freq_factors = &ff[0]
    cdef float[::1] flat = out.reshape(-1)
    if n_tokens and n_heads and head_dim:
        with nogil:
            t.rope(&flat[0], n_tokens, n_heads, head_dim, &pv[0], &p)
    return out


def softmax(x, float scale=1.0, mask=None, isa=None):
    """softmax(x * scale + mask) over the last axis; mask broadcasts to x."""
    cdef const bubo_ops *t = _ops(isa)
    out = _f32(x).copy()
    cdef int64_t n = out.shape[out.ndim - 1] if out.ndim else 1
    cdef float[:, ::1] rows = out.reshape(-1, n)
    cdef const float[:, ::1] mrows
    cdef bint has_mask = mask is not None
    if has_mask:
        mrows = _f32(np.broadcast_to(np.asarray(mask, dtype=np.float32), out.shape)).reshape(-1, n)
    cdef Py_ssize_t r
    with nogil:
        for r in range(rows.shape[0]):
            t.softmax(n, &rows[r, 0], scale, &mrows[r, 0] if has_mask else NULL)
    return out


cdef enum _unary:
    UNARY_SILU, UNARY_GELU, UNARY_GELU_ERF


cdef _unary_op(int which, x, isa):
    cdef const bubo_ops *t = _ops(isa)
    xa = _f32(x)
    out = np.empty_like(xa)
    cdef const float[::1] xv = xa.reshape(-1)
    cdef float[::1] yv = out.reshape(-1)
    cdef int64_t n = xv.shape[0]
    if n == 0:
        return out
    with nogil:
        if which == UNARY_SILU:
            t.silu(n, &yv[0], &xv[0])
        elif which == UNARY_GELU:
            t.gelu(n, &yv[0], &xv[0])
        else:
            t.gelu_erf(n, &yv[0], &xv[0])
    return out


def silu(x, isa=None):
    return _unary_op(UNARY_SILU, x, isa)


def gelu(x, isa=None):
    """The tanh approximation (gelu_pytorch_tanh)."""
    return _unary_op(UNARY_GELU, x, isa)


def gelu_erf(x, isa=None):
    return _unary_op(UNARY_GELU_ERF, x, isa)


cdef enum _binary:
    BINARY_SWIGLU, BINARY_GEGLU, BINARY_ADD, BINARY_MUL


cdef _binary_op(int which, a, b, isa):
    cdef const bubo_ops *t = _ops(isa)
    aa, ba = _f32(a), _f32(b)
    if aa.shape != ba.shape:
        raise ValueError(f"shapes differ: {aa.shape} and {ba.shape}")
    out = np.empty_like(aa)
    cdef const float[::1] av = aa.reshape(-1)
    cdef const float[::1] bv = ba.reshape(-1)
    cdef float[::1] yv = out.reshape(-1)
    cdef int64_t n = av.shape[0]
    if n == 0:
        return out
    with nogil:
        if which == BINARY_SWIGLU:
            t.swiglu(n, &yv[0], &av[0], &bv[0])
        elif which == BINARY_GEGLU:
            t.geglu(n, &yv[0], &av[0], &bv[0])
        elif which == BINARY_ADD:
            t.add(n, &yv[0], &av[0], &bv[0])
        else:
            t.mul(n, &yv[0], &av[0], &bv[0])
    return out


def swiglu(gate, up, isa=None):
    return _binary_op(BINARY_SWIGLU, gate, up, isa)


def geglu(gate, up, isa=None):
    return _binary_op(BINARY_GEGLU, gate, up, isa)


def add(x, y, isa=None):
    return _binary_op(BINARY_ADD, x, y, isa)


def mul(x, y, isa=None):
    return _binary_op(BINARY_MUL, x, y, isa)


def scale(x, float s, isa=None):
    cdef const bubo_ops *t = _ops(isa)
    xa = _f32(x)
    out = np.empty_like(xa)
    cdef const float[::1] xv = xa.reshape(-1)
    cdef float[::1] yv = out.reshape(-1)
    cdef int64_t n = xv.shape[0]
    if n:
        with nogil:
            t.scale(n, &yv[0], &xv[0], s)
    return out


def _strided_rows(rows, int length):
    ra = _f32(rows)
    if ra.ndim != 2 or ra.shape[1] < length:
        raise ValueError(f"rows must be 2-D with at least {length} columns, not shape {ra.shape}")
    return ra


def dot_rows(x, rows, isa=None):
    """[x . rows[j, :len(x)] for each row j]: rows is read with its row stride, the columns
    past len(x) left alone."""
    cdef const bubo_ops *t = _ops(isa)
    cdef const float[::1] xv = _f32(x).reshape(-1)
    cdef int length = xv.shape[0]
    cdef const float[:, ::1] rv = _strided_rows(rows, length)
    out = np.zeros(rv.shape[0], np.float32)
    cdef float[::1] ov = out
    if rv.shape[0] and length:
        with nogil:
            t.dot_rows(<int>rv.shape[0], length, &xv[0], &rv[0, 0], rv.shape[1], &ov[0])
    return out


def sum_rows(w, rows, int length, isa=None):
    """sum over j of w[j] * rows[j, :length]: rows read with its row stride."""
    cdef const bubo_ops *t = _ops(isa)
    cdef const float[::1] wv = _f32(w).reshape(-1)
    cdef const float[:, ::1] rv = _strided_rows(rows, length)
    if wv.shape[0] != rv.shape[0]:
        raise ValueError(f"{wv.shape[0]} weights for {rv.shape[0]} rows")
    out = np.zeros(length, np.float32)
    cdef float[::1] ov = out
    if rv.shape[0] and length:
        with nogil:
            t.sum_rows(<int>rv.shape[0], length, &wv[0], &rv[0, 0], rv.shape[1], &ov[0])
    return out


# ---- thread pool ------------------------------------------------------------------------------

cdef class ThreadPool:
    """A persistent pool of n threads counting the caller."""
    cdef bubo_pool *pool

    def __cinit__(self, int n_threads):
        cdef bubo_err err
        check_status(bubo_pool_create(n_threads, &self.pool, &err), &err, "ThreadPool")

    def __dealloc__(self):
        bubo_pool_free(self.pool)

    @property
    def n_threads(self):
        """The threads a run uses now (set_active), counting the caller."""
        return bubo_pool_n_threads(self.pool)

    @property
    def capacity(self):
        return bubo_pool_capacity(self.pool)

    def set_active(self, int n):
        """Let the next runs use n threads (clamped to 1..capacity)."""
        bubo_pool_set_active(self.pool, n)


ctypedef struct _probe_ctx:
    bubo_pool *pool
    int64_t run
    int64_t *calls   # [nth] runs each thread index took part in
    int64_t *stamps  # [nth] the phase each thread last wrote
    int64_t *errors  # [nth] stamps that were not what the barrier promised


cdef void _probe_share(void *vctx, int ith, int nth) noexcept nogil:
    cdef _probe_ctx *c = <_probe_ctx *>vctx
    cdef int j, phase
    c.calls[ith] += 1
    for phase in range(2):
        c.stamps[ith] = 2 * c.run + phase
        bubo_pool_barrier(c.pool)
        for j in range(nth):
            if c.stamps[j] != 2 * c.run + phase:
                c.errors[ith] += 1
        bubo_pool_barrier(c.pool)


def pool_probe(ThreadPool pool, int64_t n_runs):
    """Run a two-phase probe n_runs times: each thread stamps its slot, crosses a barrier and
    checks every slot. Returns (calls per thread index, stamp errors per thread index), one entry
    per thread the pool has (those a run leaves idle: 0 calls)."""
    cdef int nth = bubo_pool_capacity(pool.pool)
    calls = np.zeros(nth, dtype=np.int64)
    stamps = np.full(nth, -1, dtype=np.int64)
    errors = np.zeros(nth, dtype=np.int64)
    cdef int64_t[::1] cv = calls, sv = stamps, ev = errors
    cdef _probe_ctx ctx
    ctx.pool = pool.pool
    ctx.calls = &cv[0]
    ctx.stamps = &sv[0]
    ctx.errors = &ev[0]
    cdef int64_t run
    with nogil:
        for run in range(n_runs):
            ctx.run = run
            bubo_pool_run(pool.pool, _probe_share, &ctx)
    return calls, errors


# ---- matmul -----------------------------------------------------------------------------------

def matmul(ThreadPool pool, int type_id, const uint8_t[::1] w, int64_t rows, int64_t cols, x, bint prepacked=False):
    """y [n_tokens, rows] = x [n_tokens, cols] @ W.T for W [rows, cols] stored as type_id blocks
    (prepacked: w is prepack()'s form of W). pool None: the calling thread alone."""
    cdef const bubo_type_traits *t = bubo_type_get_traits(type_id)
    if t == NULL:
        raise ValueError(f"unknown type id {type_id}")
    cdef size_t row_bytes = bubo_row_size(<bubo_type>type_id, cols)
    if row_bytes == 0 and cols != 0:
        raise ValueError(f"{cols} columns are not a whole number of {t.name.decode()} blocks")
    cdef const float[:, ::1] xv = _f32(x).reshape(-1, cols)
    cdef int64_t n_tokens = xv.shape[0]
    cdef size_t w_size = bubo_prepacked_size(<bubo_type>type_id, rows, cols) if prepacked else row_bytes * <size_t>rows
    if <size_t>w.shape[0] != w_size:
        raise ValueError(f"W [{rows}, {cols}] takes {w_size} bytes, got {w.shape[0]}")
    out = np.zeros((n_tokens, rows), dtype=np.float32)
    cdef float[:, ::1] yv = out
    cdef size_t scratch_size = bubo_matmul_scratch_size(<bubo_type>type_id, cols, n_tokens)
    scratch = np.empty(max(scratch_size, 1), dtype=np.uint8)
    cdef uint8_t[::1] sv = scratch
    cdef bubo_pool *p = pool.pool if pool is not None else NULL
    cdef bubo_err err
    cdef bubo_status status = BUBO_OK
    cdef bubo_isa isa = bubo_prepack_isa(<bubo_type>type_id)
    if rows and n_tokens:
        with nogil:
            if prepacked:
                status = bubo_matmul_prepacked(p, isa, <bubo_type>type_id, &w[0] if w_size else NULL, rows, cols,
                                               &xv[0, 0], n_tokens, &yv[0, 0], &sv[0], scratch_size, &err)
            else:
                status = bubo_matmul(p, <bubo_type>type_id, &w[0] if w_size else NULL, rows, cols,
                                     &xv[0, 0], n_tokens, &yv[0, 0], &sv[0], scratch_size, &err)
    check_status(status, &err, "matmul")
    return out


def prepack(int type_id, const uint8_t[::1] w, int64_t rows, int64_t cols):
    """W's prepacked form for matmul(..., prepacked=True), for this CPU's best level
    (BUBO_FORCE_ISA respected), or None where that level has no prepacked kernels for type_id."""
    cdef bubo_isa isa = bubo_prepack_isa(<bubo_type>type_id)
    if isa == BUBO_ISA_COUNT:
        return None
    cdef size_t row_bytes = bubo_row_size(<bubo_type>type_id, cols)
    if row_bytes == 0 or <size_t>w.shape[0] != row_bytes * <size_t>rows or rows <= 0:
        raise ValueError(f"W [{rows}, {cols}] takes {row_bytes * rows} bytes, got {w.shape[0]}")
    out = np.zeros(bubo_prepacked_size(<bubo_type>type_id, rows, cols), dtype=np.uint8)
    cdef uint8_t[::1] ov = out
    cdef bubo_err err
    cdef bubo_status status
    with nogil:
        status = bubo_matmul_prepack(isa, <bubo_type>type_id, &w[0], rows, cols, &ov[0], &err)
    check_status(status, &err, "prepack")
    return out


def prepacked_row(int type_id, const uint8_t[::1] packed, int64_t rows, int64_t cols, int64_t r):
    """Row r's original bytes, rebuilt from prepack()'s form of a [rows, cols] matrix."""
    cdef size_t row_bytes = bubo_row_size(<bubo_type>type_id, cols)
    if row_bytes == 0 or <size_t>packed.shape[0] != bubo_prepacked_size(<bubo_type>type_id, rows, cols):
        raise ValueError(f"a prepacked [{rows}, {cols}] matrix takes {bubo_prepacked_size(<bubo_type>type_id, rows, cols)} "
                         f"bytes, got {packed.shape[0]}")
    out = np.zeros(row_bytes, dtype=np.uint8)
    cdef uint8_t[::1] ov = out
    cdef bubo_err err
    cdef bubo_status status
    with nogil:
        status = bubo_prepacked_row(bubo_prepack_isa(<bubo_type>type_id), <bubo_type>type_id, &packed[0], rows, cols, r,
                                    &ov[0], &err)
    check_status(status, &err, "prepacked_row")
    return out


# ---- attention over a paged KV cache ---------------------------------------------------------

ATTEND_GROUP = BUBO_ATTEND_GROUP
ATTEND_CHUNK = BUBO_ATTEND_CHUNK
_TYPE_Q8_0 = 8  # ggml's ids (bubo/quants.h), which quants.pxd does not name
_TYPE_Q4_0 = 2
_KV_TYPES = (BUBO_TYPE_F32, BUBO_TYPE_F16, _TYPE_Q8_0, _TYPE_Q4_0)


def attend_paged(int type_id, const uint8_t[:, :, :, ::1] k, const uint8_t[:, :, :, ::1] v, table,
                 int kv_head, int head_dim_k, int head_dim_v, kv_begin, kv_end, const uint8_t[:, :, ::1] q,
                 float kq_scale, isa=None, type_v=None):
    """out [n_tok, n_q, head_dim_v]: the attention of token t's n_q queries q[t] (rows in type_id's
    vec_dot_type) over positions kv_begin[t] .. kv_end[t]-1 of the sequence whose block table is
    `table`, in the pools k [n_blocks, block_size, n_head_kv, head bytes] and v (the layout of one
    layer of bubo_kv); V rows of type type_v (None: type_id)."""
    cdef bubo_isa level = bubo_cpu_best_isa() if isa is None else _isa_from_name(isa)
    if not bubo_cpu_supports(level):
        raise ValueError(f"isa {isa!r} is not available on this CPU")
    cdef const bubo_type_traits *t = bubo_type_get_traits(type_id)
    cdef int tv_id = type_id if type_v is None else type_v
    if t == NULL or type_id not in _KV_TYPES or tv_id not in _KV_TYPES:
        raise ValueError(f"type ids {type_id}, {tv_id} are not KV cache types")
    cdef const int32_t[::1] tv = np.ascontiguousarray(table, dtype=np.int32)
    cdef const int32_t[::1] bv = np.ascontiguousarray(kv_begin, dtype=np.int32).reshape(-1)
    cdef const int32_t[::1] ev = np.ascontiguousarray(kv_end, dtype=np.int32).reshape(-1)
    cdef int block_size = k.shape[1], n_head_kv = k.shape[2], n_tok = q.shape[0], n_q = q.shape[1]
    cdef Py_ssize_t i, j
    if (v.shape[0] != k.shape[0] or v.shape[1] != block_size or v.shape[2] != n_head_kv
            or <size_t>k.shape[3] != bubo_row_size(<bubo_type>type_id, head_dim_k)
            or <size_t>v.shape[3] != bubo_row_size(<bubo_type>tv_id, head_dim_v)):
        raise ValueError("k and v must be [n_blocks, block_size, n_head_kv, one head's row bytes]")
    if not (0 <= kv_head < n_head_kv) or n_tok < 1 or n_q < 1 or bv.shape[0] != n_tok or ev.shape[0] != n_tok:
        raise ValueError("bad head, query count or ranges")
    for j in range(n_tok):
        if not (0 <= bv[j] < ev[j] <= tv.shape[0] * block_size):
            raise ValueError(f"bad range [{bv[j]}, {ev[j]}) for token {j}")
        for i in range(bv[j] // block_size, (ev[j] - 1) // block_size + 1):
            if not (0 <= tv[i] < k.shape[0]):
                raise ValueError(f"table[{i}] = {tv[i]} is not a block")
    cdef bubo_kv_view view
    view.type = <bubo_type>type_id
    view.type_v = <bubo_type>tv_id
    view.block_size = block_size
    view.k = &k[0, 0, 0, 0]
    view.v = &v[0, 0, 0, 0]
    view.head_bytes_k = k.shape[3]
    view.head_bytes_v = v.shape[3]
    view.row_bytes_k = view.head_bytes_k * n_head_kv
    view.row_bytes_v = view.head_bytes_v * n_head_kv
    view.head_stride_k = view.head_bytes_k  # every head of a token side by side
    view.head_stride_v = view.head_bytes_v
    view.block_bytes_k = view.row_bytes_k * block_size
    view.block_bytes_v = view.row_bytes_v * block_size
    view.table = &tv[0]
    out = np.zeros((n_tok, n_q, head_dim_v), dtype=np.float32)
    cdef float[:, :, ::1] ov = out
    scratch = np.empty(bubo_attend_scratch_floats(n_tok, n_q, head_dim_k, head_dim_v), dtype=np.float32)
    cdef float[::1] sv = scratch
    with nogil:
        bubo_attend_paged_isa(level, &view, kv_head, head_dim_k, head_dim_v, n_tok, &bv[0], &ev[0], n_q,
                              &q[0, 0, 0], q.shape[2], kq_scale, &ov[0, 0, 0], <size_t>n_q * head_dim_v, &sv[0])
    return out
