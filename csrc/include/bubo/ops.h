/* Float ops of the forward pass and the matmul driver.
 *
 * Each op has a scalar reference and AVX2, AVX-512 and NEON variants, gathered per level into
 * one bubo_ops table. bubo_ops_best() is picked once from bubo_cpu_best_isa(); the model holds
 * that pointer and never tests CPU features in a loop. Tests call a chosen level through
 * bubo_ops_for_isa().
 *
 * The SIMD variants evaluate exp with a polynomial (csrc/ops/vmath.h) instead of libm's expf:
 * softmax, SiLU and GELU agree with the scalar reference to a few float ulps, not bit for bit.
 * Everything else differs at most by summation order and fused multiply-adds.
 *
 * Kernels do not allocate and do not validate: their preconditions are stated here, and the
 * caller (the model at load time, the Cython layer for tests) checks shapes once. */
#ifndef BUBO_OPS_H
#define BUBO_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "bubo/common.h"
#include "bubo/cpu.h"
#include "bubo/kv.h"
#include "bubo/quants.h"
#include "bubo/threadpool.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- RoPE ---------------------------------------------------------------------------------- */

typedef enum {
    BUBO_ROPE_NORMAL = 0, /* rotate adjacent pairs (x[2i], x[2i+1]): llama */
    BUBO_ROPE_NEOX = 2,   /* rotate (x[i], x[i + n_rot/2]): qwen2, gemma (llama.cpp's value) */
} bubo_rope_mode;

typedef struct {
    bubo_rope_mode mode;
    int n_rot;                 /* rotated dims per head: even, <= head_dim; the rest pass through */
    float freq_base;           /* theta_i = pos * freq_scale * freq_base^(-2i/n_rot) / freq_factors[i] */
    float freq_scale;          /* 1 / linear context-scaling factor; 1.0 for none */
    const float *freq_factors; /* [n_rot/2] divisors of each pair's frequency (llama3 rope_freqs), or NULL */
    const float *angles;       /* a one-token call's angles from bubo_rope_angles, or NULL: computed here */
} bubo_rope_params;

/* Token pos's angles under p: cos of its n_rot/2 pairs, then their sin, into cs [n_rot]; exactly
 * the values the rope op computes itself. A forward pass computes them once per token for all
 * its layers (and for Q and K) and hands them over in p->angles. */
void bubo_rope_angles(int32_t pos, const bubo_rope_params *p, float *cs);

/* ---- the op table -------------------------------------------------------------------------- */

/* Elementwise ops take n >= 0 elements; outputs may alias inputs exactly (in place), not overlap
 * them partially. */
typedef struct {
    bubo_isa isa;

    /* y = x / sqrt(mean(x^2) + eps) * w; w [n] or NULL for no weight. */
    void (*rms_norm)(int64_t n, float *y, const float *x, const float *w, float eps);
    /* y = (x - mean(x)) / sqrt(var(x) + eps) * w + b; w, b [n] or NULL for none. */
    void (*layer_norm)(int64_t n, float *y, const float *x, const float *w, const float *b, float eps);

    /* In place over x [n_tokens][n_heads][head_dim]; pos [n_tokens]. The angles are computed as
     * llama.cpp's CPU backend does (a running product of base^(-2/n_rot) in f32), so they match
     * its rounding. */
    void (*rope)(float *x, int64_t n_tokens, int n_heads, int head_dim, const int32_t *pos,
                 const bubo_rope_params *p);

    /* In place: x = softmax(x * scale + mask); mask [n] additive (0 or -inf), or NULL. A row
     * whose every entry is -inf becomes all zeros. */
    void (*softmax)(int64_t n, float *x, float scale, const float *mask);

    void (*silu)(int64_t n, float *y, const float *x);     /* x * sigmoid(x) */
    void (*gelu)(int64_t n, float *y, const float *x);     /* tanh approximation (gelu_pytorch_tanh) */
    void (*gelu_erf)(int64_t n, float *y, const float *x); /* exact: 0.5 x (1 + erf(x / sqrt 2)) */
    void (*swiglu)(int64_t n, float *y, const float *gate, const float *up); /* silu(gate) * up */
    void (*geglu)(int64_t n, float *y, const float *gate, const float *up);  /* gelu(gate) * up (tanh) */

    void (*add)(int64_t n, float *z, const float *x, const float *y); /* z = x + y */
    void (*mul)(int64_t n, float *z, const float *x, const float *y); /* z = x * y */
    void (*scale)(int64_t n, float *y, const float *x, float s);      /* y = x * s */

    /* Strided f32 rows (row j at rows + j * stride), len floats each: out[j] = x . row j for
     * j < n_rows; sum_rows: out[i] = sum over j of w[j] * row j [i], i < len. An encoder's
     * attention over its own activation rows. */
    void (*dot_rows)(int n_rows, int len, const float *x, const float *rows, int64_t stride, float *out);
    void (*sum_rows)(int n_rows, int len, const float *w, const float *rows, int64_t stride, float *out);

    /* the paged attention's kernels of this level (csrc/ops/attention.c; bubo_attend_paged) */
    const struct bubo_attend_level *attend;
} bubo_ops;

/* The table of one level; NULL if this build or this CPU lacks it. */
const bubo_ops *bubo_ops_for_isa(bubo_isa isa);
/* The table of bubo_cpu_best_isa(), chosen at the first call. */
const bubo_ops *bubo_ops_best(void);

/* ---- matmul -------------------------------------------------------------------------------- */

/* Bytes of scratch that bubo_matmul needs for n_tokens activation rows of cols elements against
 * weights of this type: the activations quantized into the type's vec_dot_type (0 when that is
 * F32: the activations are used as they are). 0 also for an unsupported type or bad cols;
 * bubo_matmul reports those. */
size_t bubo_matmul_scratch_size(bubo_type type, int64_t cols, int64_t n_tokens);

/* y[t][r] = dot(W[r], x[t]) for t < n_tokens, r < rows.
 *   w        [rows][row bytes = bubo_row_size(type, cols)], rows contiguous
 *   x        [n_tokens][cols] f32
 *   y        [n_tokens][rows] f32
 *   scratch  at least bubo_matmul_scratch_size(type, cols, n_tokens) bytes (may be NULL if 0)
 * Work is split over the pool's threads (pool NULL: the calling thread alone). The result does
 * not depend on the thread count: a y element is one vec_dot call (n_tokens == 1) or one
 * vec_dot_tile output, whose arithmetic does not depend on the tiling (n_tokens > 1). Kernels are
 * this CPU's best (bubo_get_vec_dot / bubo_get_vec_dot_tile / bubo_get_from_float). */
bubo_status bubo_matmul(bubo_pool *pool, bubo_type type, const void *w, int64_t rows, int64_t cols,
                        const float *x, int64_t n_tokens, float *y, void *scratch, size_t scratch_size,
                        bubo_err *err);

/* Weights used many times can be packed once for a level that has prepacked kernels for their
 * type (bubo_prepack_isa: this CPU's best, or none): bubo_matmul_prepack writes W's prepacked form,
 * bubo_prepacked_size(type, rows, cols) bytes, into dst, and bubo_matmul_prepacked multiplies it,
 * with bubo_matmul's arguments plus that level (BUBO_ERR_UNSUPPORTED for a level without the
 * kernels or that this CPU lacks). Each output is the same bits as bubo_matmul gives on W in place
 * at that level; the packing saves the tile its per-call unpacking (most of a decode step's cost
 * for the legacy types Q4_0 ... Q8_0 and for Q4_K). bubo_prepacked_row writes row r's own bytes
 * back (bubo_row_size(type, cols)) from the packed form, for the legacy types. */
/* Several matrices of cols columns that multiply the same x (a layer's Q, K and V; gate and up):
 * x quantized once, every part's rows split over the threads as one range, one pool run. Each part
 * has its own type and rows (prepacked_isa BUBO_ISA_COUNT: weights in place, else the level they
 * were prepacked for) and its output y [n_tokens][rows]; all must take their activations as one
 * type (BUBO_ERR_INVALID otherwise). Each output is the same bits as the part's bubo_matmul. */
#define BUBO_MATMUL_MAX_PARTS 3
typedef struct {
    bubo_type type;
    bubo_isa prepacked_isa;
    const void *w;
    int64_t rows;
    float *y;
} bubo_matmul_part;
/* A per-row step to run first (prologue NULL or fn NULL: none): fn(ctx, t) for every row t of x,
 * in the product's own pool run, each row by the thread that then quantizes it, so that a step
 * that writes x (a norm, an activation) costs no pool run and no pass over x of its own. The
 * products wait for every row's step; the results are those of the step run alone, then the
 * product. */
typedef struct {
    void (*fn)(const void *ctx, int32_t t);
    const void *ctx;
} bubo_matmul_prologue;
bubo_status bubo_matmul_parts(bubo_pool *pool, int n_parts, const bubo_matmul_part *parts, int64_t cols,
                              const float *x, int64_t n_tokens, const bubo_matmul_prologue *prologue, void *scratch,
                              size_t scratch_size, bubo_err *err);

bubo_status bubo_matmul_prepack(bubo_isa isa, bubo_type type, const void *w, int64_t rows, int64_t cols, void *dst,
                                bubo_err *err);
bubo_status bubo_matmul_prepacked(bubo_pool *pool, bubo_isa isa, bubo_type type, const void *w, int64_t rows,
                                  int64_t cols, const float *x, int64_t n_tokens, float *y, void *scratch,
                                  size_t scratch_size, bubo_err *err);
bubo_status bubo_prepacked_row(bubo_isa isa, bubo_type type, const void *packed, int64_t rows, int64_t cols,
                               int64_t r, void *dst, bubo_err *err);


/* ---- attention over the paged KV cache ------------------------------------------------------ */

/* Positions are taken in groups of this many, aligned to absolute positions (see attention.c). */
#define BUBO_ATTEND_GROUP 16
/* and in chunks of this many, aligned the same way: each chunk's softmax is computed on its own
 * and the chunks' partials merged in position order, so that a sequence's positions can be split
 * over threads with the same result as in one run (see attention.c). A build may set another
 * multiple of the group, to compare (-DBUBO_ATTEND_CHUNK=1024 in CMAKE_C_FLAGS). */
#ifndef BUBO_ATTEND_CHUNK
#define BUBO_ATTEND_CHUNK 256
#endif
#if BUBO_ATTEND_CHUNK % BUBO_ATTEND_GROUP != 0
#error "BUBO_ATTEND_CHUNK must be a multiple of BUBO_ATTEND_GROUP"
#endif

/* For n_tok tokens of one sequence and, for each, n_q query heads h sharing KV head kv_head (GQA):
 *   out[t][h][0 .. head_dim_v) = softmax_i(kq_scale * dot(q[t][h], K_i)) . V_i
 * over the positions kv_begin[t] <= i < kv_end[t] (the causal and sliding-window mask is the
 * range), reading the cache blocks in place with an online softmax; each K/V row is read and
 * widened once for all the tokens and heads that attend to it.
 * A (token, head) result depends on its query and the K/V rows of its positions only: the same
 * bits whatever the other tokens and heads, the block size or the block table (batch invariance).
 *   q        n_tok * n_q queries, row t * n_q + h at q_stride bytes, in the cache type's
 *            vec_dot_type (f32 for f16/f32 storage, q8_0 blocks for q8_0): what
 *            bubo_get_vec_dot(view->type) takes; f32 rows q_stride a multiple of 4
 *   out      token t's heads at out + t * out_tok_stride, head_dim_v floats apart
 *   scratch  bubo_attend_scratch_floats(n_tok, n_q, head_dim_k, head_dim_v) floats
 * kv_end[t] > kv_begin[t] >= 0; every position in the ranges was written. bubo_attend_paged runs
 * this CPU's best level (bubo_cpu_best_isa); _isa runs the given one, which the CPU must support. */
size_t bubo_attend_scratch_floats(int n_tok, int n_q, int head_dim_k, int head_dim_v);
void bubo_attend_paged(const bubo_kv_view *view, int kv_head, int head_dim_k, int head_dim_v, int n_tok,
                       const int32_t *kv_begin, const int32_t *kv_end, int n_q, const void *q, size_t q_stride,
                       float kq_scale, float *out, size_t out_tok_stride, float *scratch);
void bubo_attend_paged_isa(bubo_isa isa, const bubo_kv_view *view, int kv_head, int head_dim_k, int head_dim_v,
                           int n_tok, const int32_t *kv_begin, const int32_t *kv_end, int n_q, const void *q,
                           size_t q_stride, float kq_scale, float *out, size_t out_tok_stride, float *scratch);

/* The same result in pieces, for splitting a sequence's positions over threads: the partial of
 * chunk `chunk` (positions chunk * BUBO_ATTEND_CHUNK .. + BUBO_ATTEND_CHUNK - 1, cut to each
 * token's range), unnormalized: m, l [n_tok * n_q] (row t * n_q + h) its running max and sum,
 * out its weighted sum of V (-inf, 0 and zeros for a token with no position there). Merged into
 * (m, l, out) (initially m = -inf) in ascending chunk order by bubo_attend_merge, then normalized
 * by bubo_attend_normalize, these give bubo_attend_paged's bits exactly. */
void bubo_attend_partial_isa(bubo_isa isa, const bubo_kv_view *view, int kv_head, int head_dim_k, int head_dim_v,
                             int n_tok, const int32_t *kv_begin, const int32_t *kv_end, int32_t chunk, int n_q,
                             const void *q, size_t q_stride, float kq_scale, float *m, float *l, float *out,
                             size_t out_tok_stride, float *scratch);
void bubo_attend_partial(const bubo_kv_view *view, int kv_head, int head_dim_k, int head_dim_v, int n_tok,
                         const int32_t *kv_begin, const int32_t *kv_end, int32_t chunk, int n_q, const void *q,
                         size_t q_stride, float kq_scale, float *m, float *l, float *out, size_t out_tok_stride,
                         float *scratch);
void bubo_attend_merge(int n_tok, int n_q, int head_dim_v, float *m, float *l, float *out, size_t out_tok_stride,
                       const float *pm, const float *pl, const float *pout, size_t pout_tok_stride);
void bubo_attend_normalize(int n_tok, int n_q, int head_dim_v, const float *l, float *out, size_t out_tok_stride);

#ifdef __cplusplus
}
#endif
#endif
