# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""numpy-in, numpy-out entry points to the thread pool and the kernel table's variants. `isa`
names a level ("scalar", "avx2", "avx512", "neon"); None means this CPU's best."""
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t

import numpy as np

from common cimport bubo_status, bubo_err, BUBO_OK, BUBO_ERR_IO, BUBO_ERR_FORMAT, BUBO_ERR_UNSUPPORTED, BUBO_ERR_NOMEM, BUBO_ERR_INVALID
from cpu cimport bubo_isa, bubo_cpu_supports, bubo_cpu_best_isa, bubo_isa_name, BUBO_ISA_COUNT
from quants cimport (bubo_type, bubo_type_traits, bubo_type_get_traits, bubo_row_size,
                     bubo_get_to_float, bubo_get_from_float, bubo_get_vec_dot,
                     bubo_to_float_fn, bubo_from_float_fn, bubo_vec_dot_fn,
                     bubo_f16_to_f32, bubo_f32_to_f16, bubo_bf16_to_f32, bubo_f32_to_bf16)
from threadpool cimport (bubo_pool, bubo_pool_create, bubo_pool_free, bubo_pool_n_threads,
                         bubo_pool_run, bubo_pool_barrier)

include "status.pxi"


# ---- levels ---------------------------------------------------------------------------------

cdef bubo_isa _isa_from_name(str name) except *:
    cdef int i
    for i in range(BUBO_ISA_COUNT):
        if bubo_isa_name(<bubo_isa>i).decode() == name:
            return <bubo_isa>i
    raise ValueError(f"unknown isa {name!r}")


def supported_isas():
    """Names of the levels this CPU runs, lowest first."""
    cdef int i
    return [bubo_isa_name(<bubo_isa>i).decode() for i in range(BUBO_ISA_COUNT) if bubo_cpu_supports(<bubo_isa>i)]


def best_isa():
    return bubo_isa_name(bubo_cpu_best_isa()).decode()


# ---- the type table -------------------------------------------------------------------------

cdef const bubo_type_traits *_traits(int type_id) except NULL:
    cdef const bubo_type_traits *t = bubo_type_get_traits(type_id)
    if t == NULL:
        raise ValueError(f"unknown type id {type_id}")
    return t


def type_info(int type_id):
    """The type's table row: layout, whether bubo runs it, and which levels have each kernel
    (built into this library; see supported_isas() for what the CPU runs). None for an id GGUF
    does not define."""
    cdef const bubo_type_traits *t = bubo_type_get_traits(type_id)
    if t == NULL:
        return None
    cdef int i
    return {
        "name": t.name.decode(),
        "blck_size": t.blck_size,
        "type_size": t.type_size,
        "supported": bool(t.supported),
        "vec_dot_type": t.vec_dot_type,
        "to_float": [bubo_isa_name(<bubo_isa>i).decode() for i in range(BUBO_ISA_COUNT) if t.to_float[i] != NULL],
        "from_float": [bubo_isa_name(<bubo_isa>i).decode() for i in range(BUBO_ISA_COUNT) if t.from_float[i] != NULL],
        "vec_dot": [bubo_isa_name(<bubo_isa>i).decode() for i in range(BUBO_ISA_COUNT) if t.vec_dot[i] != NULL],
    }


cdef bubo_isa _kernel_isa(isa) except *:
    cdef bubo_isa level = _isa_from_name(isa)
    if not bubo_cpu_supports(level):
        raise ValueError(f"isa {isa!r} is not available on this CPU")
    return level


cdef size_t _row_bytes(int type_id, int64_t n) except? 0:
    cdef size_t size = bubo_row_size(<bubo_type>type_id, n)
    if size == 0 and n != 0:
        raise ValueError(f"{n} elements are not a whole number of {type_info(type_id)['name']} blocks")
    return size


def to_float(int type_id, const uint8_t[::1] data, int64_t n, isa=None):
    """Dequantize n elements stored in data (bubo_row_size(type, n) bytes)."""
    _traits(type_id)
    cdef size_t size = _row_bytes(type_id, n)
    if <size_t>data.shape[0] != size:
        raise ValueError(f"{n} elements take {size} bytes, got {data.shape[0]}")
    cdef bubo_to_float_fn fn = bubo_get_to_float(<bubo_type>type_id) if isa is None else _traits(type_id).to_float[<int>_kernel_isa(isa)]
    if fn == NULL:
        raise ValueError(f"type {type_id} has no to_float kernel for isa {isa!r}")
    out = np.empty(n, dtype=np.float32)
    cdef float[::1] y = out
    with nogil:
        fn(&data[0] if size else NULL, &y[0] if n else NULL, n)
    return out


def from_float(int type_id, const float[::1] x, isa=None):
    """Quantize the f32 vector x into blocks of the type; returns the bytes as uint8."""
    _traits(type_id)
    cdef int64_t n = x.shape[0]
    cdef size_t size = _row_bytes(type_id, n)
    cdef bubo_from_float_fn fn = bubo_get_from_float(<bubo_type>type_id) if isa is None else _traits(type_id).from_float[<int>_kernel_isa(isa)]
    if fn == NULL:
        raise ValueError(f"type {type_id} has no from_float kernel for isa {isa!r}")
    out = np.zeros(size, dtype=np.uint8)
    cdef uint8_t[::1] y = out
    with nogil:
        fn(&x[0] if n else NULL, &y[0] if size else NULL, n)
    return out


def vec_dot(int type_id, const uint8_t[::1] x, const uint8_t[::1] y, int n, isa=None):
    """dot(x, y) over n elements: x in the type, y in its vec_dot_type."""
    cdef const bubo_type_traits *t = _traits(type_id)
    cdef size_t x_size = _row_bytes(type_id, n)
    cdef size_t y_size = _row_bytes(t.vec_dot_type, n)
    if <size_t>x.shape[0] != x_size or <size_t>y.shape[0] != y_size:
        raise ValueError(f"{n} elements take {x_size} and {y_size} bytes, got {x.shape[0]} and {y.shape[0]}")
    cdef bubo_vec_dot_fn fn = bubo_get_vec_dot(<bubo_type>type_id) if isa is None else t.vec_dot[<int>_kernel_isa(isa)]
    if fn == NULL:
        raise ValueError(f"type {type_id} has no vec_dot kernel for isa {isa!r}")
    cdef float s = 0
    if n:
        with nogil:
            fn(n, &s, &x[0], &y[0])
    return s


# The exact scalar conversions, one element at a time (the table's kernels are tested through
# to_float / from_float).

def f16_to_f32(const uint16_t[::1] bits):
    out = np.empty(bits.shape[0], dtype=np.float32)
    cdef float[::1] y = out
    cdef Py_ssize_t i
    with nogil:
        for i in range(bits.shape[0]):
            y[i] = bubo_f16_to_f32(bits[i])
    return out


def f32_to_f16(const float[::1] x):
    out = np.empty(x.shape[0], dtype=np.uint16)
    cdef uint16_t[::1] y = out
    cdef Py_ssize_t i
    with nogil:
        for i in range(x.shape[0]):
            y[i] = bubo_f32_to_f16(x[i])
    return out


def bf16_to_f32(const uint16_t[::1] bits):
    out = np.empty(bits.shape[0], dtype=np.float32)
    cdef float[::1] y = out
    cdef Py_ssize_t i
    with nogil:
        for i in range(bits.shape[0]):
            y[i] = bubo_bf16_to_f32(bits[i])
    return out


def f32_to_bf16(const float[::1] x):
    out = np.empty(x.shape[0], dtype=np.uint16)
    cdef uint16_t[::1] y = out
    cdef Py_ssize_t i
    with nogil:
        for i in range(x.shape[0]):
            y[i] = bubo_f32_to_bf16(x[i])
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
        return bubo_pool_n_threads(self.pool)


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
    checks every slot. Returns (calls per thread index, stamp errors per thread index)."""
    cdef int nth = bubo_pool_n_threads(pool.pool)
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
