# cython: language_level=3, boundscheck=False, wraparound=False
"""Entry points to the block-type kernels, for tests and benchmarks: every variant in the
kernel table can be called by name, so tests compare each SIMD variant with the scalar one."""

import numpy as np

from libc.stdint cimport int64_t, uint8_t, uint16_t
from cpu cimport (bubo_isa, bubo_config_get, bubo_config_reload, bubo_cpu_supports, bubo_cpu_best_isa, bubo_isa_name,
                  BUBO_ISA_SCALAR, BUBO_ISA_COUNT)
from quants cimport *

ISA_NAMES = ("scalar", "avx2", "avx512", "neon")


cdef const bubo_type_traits *_traits(int type_id) except NULL:
    cdef const bubo_type_traits *t = bubo_type_get_traits(type_id)
    if t == NULL:
        raise ValueError(f"unknown type id {type_id}")
    return t


cdef int _isa_index(object isa) except -2:  # -1 is a valid answer: "no ISA given"
    if isa is None:
        return -1
    if isa not in ISA_NAMES:
        raise ValueError(f"unknown ISA {isa!r}; one of {ISA_NAMES}")
    cdef int i = ISA_NAMES.index(isa)
    if not bubo_cpu_supports(<bubo_isa>i):
        raise ValueError(f"this CPU cannot run {isa} kernels")
    return i


def supported_isas():
    """The ISA levels this CPU runs, lowest first."""
    cdef int i
    return [ISA_NAMES[i] for i in range(4) if bubo_cpu_supports(<bubo_isa>i)]


def best_isa():
    """The level the kernel table picks (BUBO_FORCE_ISA caps it)."""
    return bubo_isa_name(bubo_cpu_best_isa()).decode()


def reload_config():
    """Read BUBO_FORCE_ISA, BUBO_NO_PREPACK and BUBO_PREFETCH_AHEAD again (the C core reads them
    once, when first needed): for tests that change them between calls. The op tables, picked
    once, keep their level."""
    bubo_config_reload()


def prefetch_ahead():
    """Whether the prepacked tiles prefetch a tuned distance ahead (else the piece at hand):
    BUBO_PREFETCH_AHEAD, or this CPU's default (csrc/include/bubo/cpu.h)."""
    return bool(bubo_config_get().prefetch_ahead)


def type_ids():
    """Every type id GGUF defines."""
    return [i for i in range(BUBO_TYPE_COUNT) if bubo_type_get_traits(i) != NULL]


cdef list _variants(void **fns):
    cdef int i
    return [ISA_NAMES[i] for i in range(4) if fns[i] != NULL]


def type_info(int type_id):
    cdef const bubo_type_traits *t = _traits(type_id)
    return {
        "id": type_id,
        "name": t.name.decode(),
        "blck_size": t.blck_size,
        "type_size": t.type_size,
        "supported": bool(t.supported),
        "vec_dot_type": t.vec_dot_type,
        "to_float": _variants(<void **>t.to_float),
        "from_float": _variants(<void **>t.from_float),
        "vec_dot": _variants(<void **>t.vec_dot),
        "vec_dot_tile": _variants(<void **>t.vec_dot_tile),
    }


def row_size(int type_id, int64_t n):
    cdef size_t r = bubo_row_size(type_id, n)
    if r == 0 and n != 0:
        raise ValueError(f"{n} elements is not a whole number of {type_info(type_id)['name']} blocks")
    return r


cdef int64_t _check_len(const bubo_type_traits *t, int64_t n, size_t nbytes) except -1:
    if n % t.blck_size:
        raise ValueError(f"{n} elements is not a multiple of {t.name.decode()}'s block size {t.blck_size}")
    if <size_t>(n // t.blck_size) * t.type_size != nbytes:
        raise ValueError(f"{nbytes} bytes do not hold {n} {t.name.decode()} elements")
    return 0


def dequantize(int type_id, data, isa=None):
    """Dequantize a 1-D buffer of whole blocks of type_id into float32."""
    cdef const bubo_type_traits *t = _traits(type_id)
    cdef const uint8_t[::1] src = np.frombuffer(data, dtype=np.uint8)
    if src.shape[0] % t.type_size:
        raise ValueError(f"{src.shape[0]} bytes is not a whole number of {t.name.decode()} blocks")
    cdef int64_t n = (src.shape[0] // t.type_size) * t.blck_size
    cdef int i = _isa_index(isa)
    cdef bubo_to_float_fn fn = bubo_get_to_float(type_id) if i < 0 else t.to_float[i]
    if fn == NULL:
        raise NotImplementedError(f"no {isa or 'usable'} to_float variant for {t.name.decode()}")
    out = np.empty(n, dtype=np.float32)
    cdef float[::1] dst = out
    if n:
        with nogil:
            fn(&src[0], &dst[0], n)
    return out


def quantize(int type_id, x, isa=None):
    """Quantize a 1-D float32 array (whole blocks) into type_id's blocks, as uint8."""
    cdef const bubo_type_traits *t = _traits(type_id)
    cdef const float[::1] src = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    cdef int64_t n = src.shape[0]
    if n % t.blck_size:
        raise ValueError(f"{n} elements is not a multiple of {t.name.decode()}'s block size {t.blck_size}")
    cdef int i = _isa_index(isa)
    cdef bubo_from_float_fn fn = bubo_get_from_float(type_id) if i < 0 else t.from_float[i]
    if fn == NULL:
        raise NotImplementedError(f"no {isa or 'usable'} from_float variant for {t.name.decode()}")
    out = np.zeros((n // t.blck_size) * t.type_size, dtype=np.uint8)
    cdef uint8_t[::1] dst = out
    if n:
        with nogil:
            fn(&src[0], &dst[0], n)
    return out


def vec_dot(int type_id, weights, activations, isa=None):
    """dot(weight row, activation row): weights in type_id's blocks, activations already
    quantized into its vec_dot_type (see quantize)."""
    cdef const bubo_type_traits *t = _traits(type_id)
    cdef const bubo_type_traits *a = _traits(t.vec_dot_type)
    cdef const uint8_t[::1] w = np.frombuffer(weights, dtype=np.uint8)
    cdef const uint8_t[::1] y = np.frombuffer(activations, dtype=np.uint8)
    if w.shape[0] % t.type_size or w.shape[0] == 0:
        raise ValueError(f"{w.shape[0]} bytes is not a whole, nonzero number of {t.name.decode()} blocks")
    cdef int64_t n = (w.shape[0] // t.type_size) * t.blck_size
    _check_len(a, n, y.shape[0])
    cdef int i = _isa_index(isa)
    cdef bubo_vec_dot_fn fn = bubo_get_vec_dot(type_id) if i < 0 else t.vec_dot[i]
    if fn == NULL:
        raise NotImplementedError(f"no {isa or 'usable'} vec_dot variant for {t.name.decode()}")
    cdef float s = 0
    with nogil:
        fn(<int>n, &s, &w[0], &y[0])
    return s


def vec_dot_rows(int type_id, weights, activations, isa=None, int repeat=1):
    """out[r] = dot(weight row r, activations) for a 2-D uint8 array of weight rows, on one
    thread, `repeat` times (the microbenchmark's inner loop; the last pass's results return)."""
    cdef const bubo_type_traits *t = _traits(type_id)
    cdef const bubo_type_traits *a = _traits(t.vec_dot_type)
    w2 = np.ascontiguousarray(weights, dtype=np.uint8)
    if w2.ndim != 2 or w2.shape[1] == 0 or w2.shape[1] % t.type_size:
        raise ValueError("weights must be 2-D: rows of whole blocks")
    cdef const uint8_t[:, ::1] w = w2
    cdef const uint8_t[::1] y = np.frombuffer(activations, dtype=np.uint8)
    cdef int64_t n = (w.shape[1] // t.type_size) * t.blck_size
    _check_len(a, n, y.shape[0])
    cdef int i = _isa_index(isa)
    cdef bubo_vec_dot_fn fn = bubo_get_vec_dot(type_id) if i < 0 else t.vec_dot[i]
    if fn == NULL:
        raise NotImplementedError(f"no {isa or 'usable'} vec_dot variant for {t.name.decode()}")
    if repeat < 1:
        raise ValueError("repeat must be >= 1")
    out = np.empty(w.shape[0], dtype=np.float32)
    cdef float[::1] o = out
    cdef Py_ssize_t r, k, rows = w.shape[0]
    with nogil:
        for k in range(repeat):
            for r in range(rows):
                fn(<int>n, &o[r], &w[r, 0], &y[0])
    return out


def vec_dot_tile(int type_id, int64_t n, weights, activations, isa=None, s_stride=None):
    """out[t, r] = dot(weight row r, activation row t) through the tile kernel, one call.
    weights: 2-D uint8, one row of n elements per line (the line may be longer: its length is
    the row stride); activations: 2-D uint8, one row of n elements of the vec_dot_type per line,
    likewise. Returns float32 [n_tokens, s_stride] (default n_rows); columns past n_rows are
    NaN unless the kernel wrote them (it must not)."""
    cdef const bubo_type_traits *t = _traits(type_id)
    cdef const bubo_type_traits *a = _traits(t.vec_dot_type)
    w2 = np.ascontiguousarray(weights, dtype=np.uint8)
    y2 = np.ascontiguousarray(activations, dtype=np.uint8)
    if w2.ndim != 2 or y2.ndim != 2:
        raise ValueError("weights and activations must be 2-D")
    cdef size_t row_bytes = bubo_row_size(type_id, n)
    cdef size_t act_bytes = bubo_row_size(t.vec_dot_type, n)
    if n < 0 or (n and (row_bytes == 0 or act_bytes == 0)):
        raise ValueError(f"{n} elements is not a whole number of {t.name.decode()} and {a.name.decode()} blocks")
    if <size_t>w2.shape[1] < row_bytes or <size_t>y2.shape[1] < act_bytes:
        raise ValueError("a weight or activation line is shorter than one row")
    cdef int n_rows = w2.shape[0], n_tokens = y2.shape[0]
    cdef size_t stride = n_rows if s_stride is None else s_stride
    if stride < <size_t>n_rows:
        raise ValueError("s_stride must be >= the number of rows")
    cdef int i = _isa_index(isa)
    cdef bubo_vec_dot_tile_fn fn = bubo_get_vec_dot_tile(type_id) if i < 0 else t.vec_dot_tile[i]
    if fn == NULL:
        raise NotImplementedError(f"no {isa or 'usable'} vec_dot_tile variant for {t.name.decode()}")
    out = np.full((n_tokens, stride), np.nan, dtype=np.float32)
    # empty buffers still need an address: one spare line
    wbuf = np.zeros((n_rows + 1, w2.shape[1] or 1), np.uint8); wbuf[:n_rows, :w2.shape[1]] = w2
    ybuf = np.zeros((n_tokens + 1, y2.shape[1] or 1), np.uint8); ybuf[:n_tokens, :y2.shape[1]] = y2
    obuf = np.full((n_tokens + 1) * stride + 1, np.nan, np.float32)
    cdef const uint8_t[:, ::1] w = wbuf
    cdef const uint8_t[:, ::1] y = ybuf
    cdef float[::1] o = obuf
    cdef size_t xs = w.shape[1], ys = y.shape[1]
    with nogil:
        fn(<int>n, n_rows, n_tokens, &o[0], stride, &w[0, 0], xs, &y[0, 0], ys)
    out[:] = obuf[:n_tokens * stride].reshape(n_tokens, stride)
    if not np.all(np.isnan(obuf[n_tokens * stride:])):
        raise RuntimeError("the tile kernel wrote past its last output")
    return out


# ---- the exact scalar half / bfloat16 conversions, one element at a time ----

ctypedef float (*_widen_fn)(uint16_t h) noexcept nogil
ctypedef uint16_t (*_narrow_fn)(float f) noexcept nogil


cdef _widen(const uint16_t[::1] bits, _widen_fn widen):
    out = np.empty(bits.shape[0], dtype=np.float32)
    cdef float[::1] y = out
    cdef Py_ssize_t i
    with nogil:
        for i in range(bits.shape[0]):
            y[i] = widen(bits[i])
    return out


cdef _narrow(const float[::1] x, _narrow_fn narrow):
    out = np.empty(x.shape[0], dtype=np.uint16)
    cdef uint16_t[::1] y = out
    cdef Py_ssize_t i
    with nogil:
        for i in range(x.shape[0]):
            y[i] = narrow(x[i])
    return out


def f16_to_f32(bits):
    return _widen(bits, bubo_f16_to_f32)


def f32_to_f16(x):
    return _narrow(x, bubo_f32_to_f16)


def bf16_to_f32(bits):
    return _widen(bits, bubo_bf16_to_f32)


def f32_to_bf16(x):
    return _narrow(x, bubo_f32_to_bf16)
