/* Attention of one query head over one sequence of the paged KV cache.
 *
 * The blocks are read where they lie (no gather into a contiguous K/V copy). Softmax is online
 * (Milakov & Gimelshein 2018; as llama.cpp's CPU flash attention does it): a running maximum m,
 * denominator l and weighted sum of V, rescaled by exp(m_old - m_new) when a score raises the
 * maximum. The update is per token, not per block, on purpose: the result then depends on the
 * positions only, never on the block size or on which blocks a sequence happens to hold, so a
 * batched, forked or re-appended sequence gets bit-identical attention. That matters more than
 * it seems: these quantized models amplify a last-bit difference in layer 0 into logit changes
 * of ~1 (measured on smollm2:135m) through the rounding of the int8 activation blocks.
 *
 * Products go through the kernel table: K rows are dotted with the query by the storage type's
 * vec_dot (f16 x f32, f32 x f32, q8_0 x q8_0), V rows are widened by its to_float. */
#include <math.h>

#include "ops_internal.h"

void bubo_attend_paged(const bubo_kv_view *view, int kv_head, int head_dim_k, int head_dim_v, int32_t kv_begin,
                       int32_t kv_end, const void *q, float kq_scale, float *out, float *v_tmp) {
    const bubo_vec_dot_fn vec_dot = bubo_get_vec_dot(view->type);
    const bubo_to_float_fn to_float = bubo_get_to_float(view->type);
    const int bs = view->block_size;

    float m = -INFINITY; /* running max of the scores */
    float l = 0.0f;      /* running sum of exp(score - m) */
    for (int j = 0; j < head_dim_v; j++) out[j] = 0.0f;

    for (int32_t blk0 = kv_begin - kv_begin % bs; blk0 < kv_end; blk0 += bs) {
        const int32_t i0 = blk0 > kv_begin ? blk0 : kv_begin;
        const int32_t i1 = blk0 + bs < kv_end ? blk0 + bs : kv_end;
        const int32_t block = view->table[blk0 / bs];
        const uint8_t *k = view->k + (size_t)block * view->block_bytes_k + (size_t)kv_head * view->head_bytes_k;
        const uint8_t *v = view->v + (size_t)block * view->block_bytes_v + (size_t)kv_head * view->head_bytes_v;
        for (int32_t i = i0; i < i1; i++) {
            float s;
            vec_dot(head_dim_k, &s, k + (size_t)(i - blk0) * view->row_bytes_k, q);
            s *= kq_scale;
            float p = 1.0f; /* exp(s - m) */
            if (s > m) {
                const float correction = expf(m - s); /* 0 at the first token: m is -inf */
                l *= correction;
                for (int j = 0; j < head_dim_v; j++) out[j] *= correction;
                m = s;
            } else {
                p = expf(s - m);
            }
            l += p;
            to_float(v + (size_t)(i - blk0) * view->row_bytes_v, v_tmp, head_dim_v);
            for (int j = 0; j < head_dim_v; j++) out[j] += p * v_tmp[j];
        }
    }
    const float inv_l = 1.0f / l;
    for (int j = 0; j < head_dim_v; j++) out[j] *= inv_l;
}
