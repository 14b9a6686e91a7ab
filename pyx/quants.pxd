# Mirrors csrc/include/bubo/quants.h (the type ids and block layouts stay in C: Python sees
# ints and bytes).
from libc.stdint cimport int64_t, uint16_t

from cpu cimport bubo_isa

cdef extern from "bubo/quants.h" nogil:
    ctypedef int bubo_type
    enum:
        BUBO_TYPE_F32
        BUBO_TYPE_F16
        BUBO_TYPE_BF16
        BUBO_TYPE_COUNT

    ctypedef uint16_t bubo_f16
    ctypedef uint16_t bubo_bf16

    ctypedef void (*bubo_to_float_fn)(const void *x, float *y, int64_t n) noexcept nogil
    ctypedef void (*bubo_from_float_fn)(const float *x, void *y, int64_t n) noexcept nogil
    ctypedef void (*bubo_vec_dot_fn)(int n, float *s, const void *x, const void *y) noexcept nogil
    ctypedef void (*bubo_vec_dot_tile_fn)(int n, int n_rows, int n_tokens, float *s, size_t s_stride,
                                          const void *x, size_t x_stride, const void *y,
                                          size_t y_stride) noexcept nogil

    ctypedef struct bubo_type_traits:
        const char *name
        int64_t blck_size
        size_t type_size
        int supported
        bubo_type vec_dot_type
        bubo_to_float_fn to_float[4]
        bubo_from_float_fn from_float[4]
        bubo_vec_dot_fn vec_dot[4]
        bubo_vec_dot_tile_fn vec_dot_tile[4]

    const bubo_type_traits *bubo_type_get_traits(int type)
    bubo_to_float_fn bubo_get_to_float(bubo_type type)
    bubo_from_float_fn bubo_get_from_float(bubo_type type)
    bubo_vec_dot_fn bubo_get_vec_dot(bubo_type type)
    bubo_vec_dot_tile_fn bubo_get_vec_dot_tile(bubo_type type)
    size_t bubo_row_size(bubo_type type, int64_t n)
    size_t bubo_prepacked_size(bubo_type type, int64_t rows, int64_t n)
    bubo_isa bubo_prepack_isa(bubo_type type)

    float bubo_f16_to_f32(bubo_f16 h)
    bubo_f16 bubo_f32_to_f16(float f)
    float bubo_bf16_to_f32(bubo_bf16 h)
    bubo_bf16 bubo_f32_to_bf16(float f)
