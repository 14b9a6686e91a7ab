# Mirrors csrc/include/bubo/ops.h
from libc.stdint cimport int32_t, int64_t

from common cimport bubo_status, bubo_err
from cpu cimport bubo_isa
from quants cimport bubo_type
from threadpool cimport bubo_pool
from kv cimport bubo_kv_view

cdef extern from "bubo/ops.h" nogil:
    ctypedef enum bubo_rope_mode:
        BUBO_ROPE_NORMAL
        BUBO_ROPE_NEOX

    ctypedef struct bubo_rope_params:
        bubo_rope_mode mode
        int n_rot
        float freq_base
        float freq_scale
        const float *freq_factors
        const float *angles

    ctypedef struct bubo_ops:
        bubo_isa isa
        void (*rms_norm)(int64_t n, float *y, const float *x, const float *w, float eps) noexcept nogil
        void (*layer_norm)(int64_t n, float *y, const float *x, const float *w, const float *b, float eps) noexcept nogil
        void (*rope)(float *x, int64_t n_tokens, int n_heads, int head_dim, const int32_t *pos,
                     const bubo_rope_params *p) noexcept nogil
        void (*softmax)(int64_t n, float *x, float scale, const float *mask) noexcept nogil
        void (*silu)(int64_t n, float *y, const float *x) noexcept nogil
        void (*gelu)(int64_t n, float *y, const float *x) noexcept nogil
        void (*gelu_erf)(int64_t n, float *y, const float *x) noexcept nogil
        void (*swiglu)(int64_t n, float *y, const float *gate, const float *up) noexcept nogil
        void (*geglu)(int64_t n, float *y, const float *gate, const float *up) noexcept nogil
        void (*add)(int64_t n, float *z, const float *x, const float *y) noexcept nogil
        void (*mul)(int64_t n, float *z, const float *x, const float *y) noexcept nogil
        void (*scale)(int64_t n, float *y, const float *x, float s) noexcept nogil
        void (*dot_rows)(int n_rows, int len, const float *x, const float *rows, int64_t stride, float *out) noexcept nogil
        void (*sum_rows)(int n_rows, int len, const float *w, const float *rows, int64_t stride, float *out) noexcept nogil

    const bubo_ops *bubo_ops_for_isa(bubo_isa isa)
    const bubo_ops *bubo_ops_best()

    size_t bubo_matmul_scratch_size(bubo_type type, int64_t cols, int64_t n_tokens)
    bubo_status bubo_matmul(bubo_pool *pool, bubo_type type, const void *w, int64_t rows, int64_t cols,
                            const float *x, int64_t n_tokens, float *y, void *scratch, size_t scratch_size,
                            bubo_err *err)
    bubo_status bubo_matmul_prepack(bubo_isa isa, bubo_type type, const void *w, int64_t rows, int64_t cols,
                                    void *dst, bubo_err *err)
    bubo_status bubo_matmul_prepacked(bubo_pool *pool, bubo_isa isa, bubo_type type, const void *w, int64_t rows,
                                      int64_t cols, const float *x, int64_t n_tokens, float *y, void *scratch,
                                      size_t scratch_size, bubo_err *err)
    bubo_status bubo_prepacked_row(bubo_isa isa, bubo_type type, const void *packed, int64_t rows, int64_t cols,
                                   int64_t r, void *dst, bubo_err *err)

    int BUBO_ATTEND_GROUP
    int BUBO_ATTEND_CHUNK
    size_t bubo_attend_scratch_floats(int n_tok, int n_q, int head_dim_k, int head_dim_v)
    void bubo_attend_paged_isa(bubo_isa isa, const bubo_kv_view *view, int kv_head, int head_dim_k, int head_dim_v,
                               int n_tok, const int32_t *kv_begin, const int32_t *kv_end, int n_q, const void *q,
                               size_t q_stride, float kq_scale, float *out, size_t out_tok_stride, float *scratch)
