/* Q8_0 and Q8_1: 32 int8 values and a scale.
 *
 * Q8_0 is both a weight type (its dot product takes Q8_0 activations) and the activation type of
 * Q4_0, Q5_0 and Q8_0 weights. Q8_1 is only an activation type (for Q4_1 and Q5_1): it also
 * carries s = d * sum(qs), which folds the weight's min into one multiply per block.
 *
 * The activation quantizers run once per layer input. Every variant computes exactly what the
 * scalar reference does (d = amax / 127, q = roundf(x * (1 / d)) with ties away from zero,
 * through the same float operations), so all of them equal ggml's quantize_row_q8_0_ref byte
 * for byte wherever that is defined (see inverse_scale for where it is not). */
#include "legacy_tile.h"
#include "legacy_tile_avx2.h"
#include "reduce16.h"

/* ==== scalar reference ==================================================================== */

static void quantize_row_q8_0_scalar(const float *restrict x, void *restrict vy, int64_t n) {
    block_q8_0 *restrict y = vy;
    for (int64_t i = 0; i < n / QK8_0; i++, x += QK8_0) {
        float amax = 0.0f;
        for (int j = 0; j < QK8_0; j++) amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / 127.0f;
        const float id = inverse_scale(d);
        y[i].d = bubo_f2h(d);
        for (int j = 0; j < QK8_0; j++) y[i].qs[j] = (int8_t)roundf(x[j] * id);
    }
}

static void quantize_row_q8_1_scalar(const float *restrict x, void *restrict vy, int64_t n) {
    block_q8_1 *restrict y = vy;
    for (int64_t i = 0; i < n / QK8_1; i++, x += QK8_1) {
        float amax = 0.0f;
        for (int j = 0; j < QK8_1; j++) amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / 127.0f;
        const float id = inverse_scale(d);
        int sum = 0;
        for (int j = 0; j < QK8_1; j++) {
            y[i].qs[j] = (int8_t)roundf(x[j] * id);
            sum += y[i].qs[j];
        }
        y[i].d = d;
        y[i].s = d * (float)sum;
    }
}

static void dequantize_row_q8_0_scalar(const void *restrict vx, float *restrict y, int64_t n) {
    const block_q8_0 *restrict x = vx;
    for (int64_t i = 0; i < n / QK8_0; i++, y += QK8_0) {
        const float d = bubo_h2f(x[i].d);
        for (int j = 0; j < QK8_0; j++) y[j] = (float)x[i].qs[j] * d;
    }
}

static void dequantize_row_q8_1_scalar(const void *restrict vx, float *restrict y, int64_t n) {
    const block_q8_1 *restrict x = vx;
    for (int64_t i = 0; i < n / QK8_1; i++, y += QK8_1)
        for (int j = 0; j < QK8_1; j++) y[j] = (float)x[i].qs[j] * x[i].d;
}

/* Blocks [0, nb): the scalar kernel, and the tail of the SIMD ones. */
static float dot_q8_0_q8_0_blocks(const block_q8_0 *restrict x, const block_q8_0 *restrict y, int nb) {
    float sumf = 0.0f;
    for (int i = 0; i < nb; i++) {
        int sumi = 0;
        for (int j = 0; j < QK8_0; j++) sumi += x[i].qs[j] * y[i].qs[j];
        sumf += (float)sumi * (bubo_h2f(x[i].d) * bubo_h2f(y[i].d));
    }
    return sumf;
}

static void vec_dot_q8_0_q8_0_scalar(int n, float *restrict s, const void *restrict vx, const void *restrict vy) {
    *s = dot_q8_0_q8_0_blocks(vx, vy, n / QK8_0);
}

/* ==== x86: AVX2 and AVX-512 ================================================================ */
#if defined(BUBO_X86)

/* roundf(v) for every lane: truncate, then step away from zero where the fraction is >= 0.5
 * (the vector rounding modes only offer ties-to-even). */
BUBO_TARGET_AVX2 static inline __m256 round_half_away_avx2(__m256 v) {
    const __m256 sign_bit = _mm256_set1_ps(-0.0f);
    const __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m256 frac = _mm256_andnot_ps(sign_bit, _mm256_sub_ps(v, t));
    const __m256 away = _mm256_or_ps(_mm256_and_ps(v, sign_bit), _mm256_set1_ps(1.0f));
    return _mm256_add_ps(t, _mm256_and_ps(_mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ), away));
}

/* One block of 32 floats -> its scale d and 32 int8 at q; returns sum(q). */
BUBO_TARGET_AVX2 static inline int quantize_block_avx2(const float *x, float *d_out, int8_t *q) {
    const __m256 sign_bit = _mm256_set1_ps(-0.0f);
    __m256 v[4];
    for (int k = 0; k < 4; k++) v[k] = _mm256_loadu_ps(x + 8 * k);
    __m256 m = _mm256_max_ps(_mm256_andnot_ps(sign_bit, v[0]), _mm256_andnot_ps(sign_bit, v[1]));
    m = _mm256_max_ps(m, _mm256_max_ps(_mm256_andnot_ps(sign_bit, v[2]), _mm256_andnot_ps(sign_bit, v[3])));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm_cvtss_f32(m4);
    const float d = amax / 127.0f;
    const __m256 id = _mm256_set1_ps(inverse_scale(d));
    __m256i i[4];
    for (int k = 0; k < 4; k++) i[k] = _mm256_cvtps_epi32(round_half_away_avx2(_mm256_mul_ps(v[k], id)));
    const int sum = bubo_hsum_i32x8(_mm256_add_epi32(_mm256_add_epi32(i[0], i[1]), _mm256_add_epi32(i[2], i[3])));
    /* The packs work per 128-bit lane, leaving 4-element groups in the order 0 2 4 6 1 3 5 7. */
    const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(i[0], i[1]), _mm256_packs_epi32(i[2], i[3]));
    _mm256_storeu_si256((__m256i *)q, _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    *d_out = d;
    return sum;
}

BUBO_TARGET_AVX2 static void quantize_row_q8_0_avx2(const float *restrict x, void *restrict vy, int64_t n) {
    block_q8_0 *restrict y = vy;
    for (int64_t i = 0; i < n / QK8_0; i++) {
        float d;
        quantize_block_avx2(x + i * QK8_0, &d, y[i].qs);
        y[i].d = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
    }
}

BUBO_TARGET_AVX2 static void quantize_row_q8_1_avx2(const float *restrict x, void *restrict vy, int64_t n) {
    block_q8_1 *restrict y = vy;
    for (int64_t i = 0; i < n / QK8_1; i++) {
        float d;
        const int sum = quantize_block_avx2(x + i * QK8_1, &d, y[i].qs);
        y[i].d = d;
        y[i].s = d * (float)sum;
    }
}

BUBO_TARGET_AVX2 static void dequantize_row_q8_0_avx2(const void *restrict vx, float *restrict y, int64_t n) {
    const block_q8_0 *restrict x = vx;
    for (int64_t i = 0; i < n / QK8_0; i++, y += QK8_0) {
        const __m256 d = _mm256_set1_ps(_cvtsh_ss(x[i].d));
        for (int k = 0; k < 4; k++) {
            const __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(x[i].qs + 8 * k)));
            _mm256_storeu_ps(y + 8 * k, _mm256_mul_ps(_mm256_cvtepi32_ps(q), d));
        }
    }
}

/* int32 lane sums of one block's products; signed x signed through maddubs' unsigned x signed
 * by moving x's sign onto y. */
BUBO_TARGET_AVX2 static inline __m256i dot_q8_0_block_avx2(const block_q8_0 *x, const block_q8_0 *y) {
    const __m256i qx = _mm256_loadu_si256((const __m256i *)x->qs);
    const __m256i qy = _mm256_loadu_si256((const __m256i *)y->qs);
    return dot_u8s8_avx2(_mm256_sign_epi8(qx, qx), _mm256_sign_epi8(qy, qx));
}

BUBO_TARGET_AVX2 static __m256i dot1_q8_0_avx2(const void *x, const void *y) { return dot_q8_0_block_avx2(x, y); }

/* the tiles' chain (legacy_tile_avx2.h): the packed tile's bits */
BUBO_TARGET_AVX2 static void vec_dot_q8_0_q8_0_avx2(int n, float *restrict s, const void *restrict vx,
                                                     const void *restrict vy) {
    *s = vec_dot_legacy_chain_avx2(n / QK8_0, vx, sizeof(block_q8_0), vy, dot1_q8_0_avx2, 0);
}

/* --- AVX-512 --- */

BUBO_TARGET_AVX512 static inline __m512 round_half_away_avx512(__m512 v) {
    const __m512 t = _mm512_roundscale_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __mmask16 up = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_sub_ps(v, t)), _mm512_set1_ps(0.5f), _CMP_GE_OQ);
    const __m512 away = _mm512_or_ps(_mm512_and_ps(v, _mm512_set1_ps(-0.0f)), _mm512_set1_ps(1.0f));
    return _mm512_mask_add_ps(t, up, t, away);
}

BUBO_TARGET_AVX512 static inline int quantize_block_avx512(const float *x, float *d_out, int8_t *q) {
    const __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
    const float d = amax / 127.0f;
    const __m512 id = _mm512_set1_ps(inverse_scale(d));
    const __m512i i0 = _mm512_cvtps_epi32(round_half_away_avx512(_mm512_mul_ps(v0, id)));
    const __m512i i1 = _mm512_cvtps_epi32(round_half_away_avx512(_mm512_mul_ps(v1, id)));
    _mm_storeu_si128((__m128i *)q, _mm512_cvtsepi32_epi8(i0));
    _mm_storeu_si128((__m128i *)(q + 16), _mm512_cvtsepi32_epi8(i1));
    *d_out = d;
    return _mm512_reduce_add_epi32(_mm512_add_epi32(i0, i1));
}

/* 16 blocks at once (512 floats): the same operations per element and per block as
 * quantize_block_avx512, with the blocks' maxima, scales and sums reduced sixteen to a register
 * (reduce16.h) and their divisions done as two vector ones. Block b's int8 values go to
 * q + b * q_stride; d[b] gets its scale and sum[b] the sum of its values (as a float: exact). */
BUBO_TARGET_AVX512 static inline void quantize_16_blocks_avx512(const float *x, int8_t *q, size_t q_stride, float *d,
                                                                float *sum) {
    __m512 v[16];
    for (int b = 0; b < 16; b++)
        v[b] = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(x + 32 * b)), _mm512_abs_ps(_mm512_loadu_ps(x + 32 * b + 16)));
    const __m512 dv = _mm512_div_ps(reduce16_max_avx512(v), _mm512_set1_ps(127.0f));
    /* inverse_scale, lane by lane: 1/d, or 0 where d is 0 or 1/d is not finite */
    __m512 id = _mm512_maskz_div_ps(_mm512_cmp_ps_mask(dv, _mm512_setzero_ps(), _CMP_NEQ_UQ), _mm512_set1_ps(1.0f), dv);
    id = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(id, _mm512_set1_ps(FLT_MAX), _CMP_LE_OQ), id);
    for (int b = 0; b < 16; b++) {
        const __m512 idb = _mm512_permutexvar_ps(_mm512_set1_epi32(b), id);
        const __m512i i0 = _mm512_cvtps_epi32(round_half_away_avx512(_mm512_mul_ps(_mm512_loadu_ps(x + 32 * b), idb)));
        const __m512i i1 = _mm512_cvtps_epi32(round_half_away_avx512(_mm512_mul_ps(_mm512_loadu_ps(x + 32 * b + 16), idb)));
        int8_t *qb = q + (size_t)b * q_stride;
        _mm_storeu_si128((__m128i *)qb, _mm512_cvtsepi32_epi8(i0));
        _mm_storeu_si128((__m128i *)(qb + 16), _mm512_cvtsepi32_epi8(i1));
        v[b] = _mm512_cvtepi32_ps(_mm512_add_epi32(i0, i1));
    }
    _mm512_storeu_ps(d, dv);
    _mm512_storeu_ps(sum, reduce16_avx512(v));
}

BUBO_TARGET_AVX512 static void quantize_row_q8_0_avx512(const float *restrict x, void *restrict vy, int64_t n) {
    block_q8_0 *restrict y = vy;
    const int64_t nb = n / QK8_0;
    int64_t i = 0;
    for (; i + 16 <= nb; i += 16) {
        float d[16], sum[16];
        quantize_16_blocks_avx512(x + i * QK8_0, y[i].qs, sizeof(block_q8_0), d, sum);
        uint16_t h[16];
        _mm256_storeu_si256((__m256i *)h, _mm512_cvtps_ph(_mm512_loadu_ps(d), _MM_FROUND_TO_NEAREST_INT));
        for (int b = 0; b < 16; b++) y[i + b].d = h[b];
    }
    for (; i < nb; i++) {
        float d;
        quantize_block_avx512(x + i * QK8_0, &d, y[i].qs);
        y[i].d = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
    }
}

BUBO_TARGET_AVX512 static void quantize_row_q8_1_avx512(const float *restrict x, void *restrict vy, int64_t n) {
    block_q8_1 *restrict y = vy;
    const int64_t nb = n / QK8_1;
    int64_t i = 0;
    for (; i + 16 <= nb; i += 16) {
        float d[16], sum[16];
        quantize_16_blocks_avx512(x + i * QK8_1, y[i].qs, sizeof(block_q8_1), d, sum);
        for (int b = 0; b < 16; b++) {
            y[i + b].d = d[b];
            y[i + b].s = d[b] * sum[b];
        }
    }
    for (; i < nb; i++) {
        float d;
        const int sum = quantize_block_avx512(x + i * QK8_1, &d, y[i].qs);
        y[i].d = d;
        y[i].s = d * (float)sum;
    }
}

BUBO_TARGET_AVX512 static void dequantize_row_q8_0_avx512(const void *restrict vx, float *restrict y, int64_t n) {
    const block_q8_0 *restrict x = vx;
    for (int64_t i = 0; i < n / QK8_0; i++, y += QK8_0) {
        const __m512 d = _mm512_set1_ps(_cvtsh_ss(x[i].d));
        const __m512i q0 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)x[i].qs));
        const __m512i q1 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(x[i].qs + 16)));
        _mm512_storeu_ps(y, _mm512_mul_ps(_mm512_cvtepi32_ps(q0), d));
        _mm512_storeu_ps(y + 16, _mm512_mul_ps(_mm512_cvtepi32_ps(q1), d));
    }
}

/* Two blocks' int32 lane sums (8 lanes each). vpdpbusd multiplies unsigned by signed, so x's
 * sign moves onto y: |x| * (x < 0 ? -y : y). */
BUBO_TARGET_AVX512 static inline __m512i dot_q8_0_2blocks_avx512(const block_q8_0 *x0, const block_q8_0 *x1,
                                                        const block_q8_0 *y0, const block_q8_0 *y1) {
    const __m512i qx = load_2x32_avx512(x0->qs, x1->qs);
    const __m512i qy = load_2x32_avx512(y0->qs, y1->qs);
    const __m512i zero = _mm512_setzero_si512();
    const __m512i sy = _mm512_mask_sub_epi8(qy, _mm512_movepi8_mask(qx), zero, qy);
    return _mm512_dpbusd_epi32(zero, _mm512_abs_epi8(qx), sy);
}

BUBO_TARGET_AVX512 static inline __m512i udot2_q8_0_avx512(const void *x0, const void *x1, __m512i a) {
    return _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_xor_si512(load_2x32_avx512(((const block_q8_0 *)x0)->qs, ((const block_q8_0 *)x1)->qs),
                                                    _mm512_set1_epi8((char)0x80)), a);
}

BUBO_TARGET_AVX512 static __m512i dot2_q8_0_avx512(const void *x0, const void *x1, const void *y0, const void *y1) {
    return dot_q8_0_2blocks_avx512(x0, x1, y0, y1);
}

BUBO_TARGET_AVX512 static void vec_dot_q8_0_q8_0_avx512(int n, float *restrict s, const void *restrict vx,
                                                         const void *restrict vy) {
    *s = vec_dot_legacy_avx512(n / QK8_0, vx, sizeof(block_q8_0), vy, dot2_q8_0_avx512, 0);
}

#endif /* BUBO_X86 */

/* ==== arm64: NEON ========================================================================== */
#if defined(BUBO_ARM64)

/* One block -> d and q (ties away from zero: vcvtaq is roundf); returns sum(q). */
static inline int quantize_block_neon(const float *x, float *d_out, int8_t *q) {
    float32x4_t v[8];
    float32x4_t m = vdupq_n_f32(0.0f);
    for (int k = 0; k < 8; k++) {
        v[k] = vld1q_f32(x + 4 * k);
        m = vmaxq_f32(m, vabsq_f32(v[k]));
    }
    const float amax = vmaxvq_f32(m);
    const float d = amax / 127.0f;
    const float id = inverse_scale(d);
    int32x4_t sum = vdupq_n_s32(0);
    for (int k = 0; k < 8; k += 2) {
        const int32x4_t a = vcvtaq_s32_f32(vmulq_n_f32(v[k], id));
        const int32x4_t b = vcvtaq_s32_f32(vmulq_n_f32(v[k + 1], id));
        sum = vaddq_s32(sum, vaddq_s32(a, b));
        const int16x8_t ab = vcombine_s16(vqmovn_s32(a), vqmovn_s32(b));
        vst1_s8(q + 4 * k, vqmovn_s16(ab));
    }
    *d_out = d;
    return vaddvq_s32(sum);
}

static void quantize_row_q8_0_neon(const float *restrict x, void *restrict vy, int64_t n) {
    block_q8_0 *restrict y = vy;
    for (int64_t i = 0; i < n / QK8_0; i++) {
        float d;
        quantize_block_neon(x + i * QK8_0, &d, y[i].qs);
        y[i].d = f32_to_f16_neon(d);
    }
}

static void quantize_row_q8_1_neon(const float *restrict x, void *restrict vy, int64_t n) {
    block_q8_1 *restrict y = vy;
    for (int64_t i = 0; i < n / QK8_1; i++) {
        float d;
        const int sum = quantize_block_neon(x + i * QK8_1, &d, y[i].qs);
        y[i].d = d;
        y[i].s = d * (float)sum;
    }
}

static void dequantize_row_q8_0_neon(const void *restrict vx, float *restrict y, int64_t n) {
    const block_q8_0 *restrict x = vx;
    for (int64_t i = 0; i < n / QK8_0; i++, y += QK8_0) {
        const float32x4_t d = vdupq_n_f32(f16_to_f32_neon(x[i].d));
        store_s8x16_scaled(y, vld1q_s8(x[i].qs), d);
        store_s8x16_scaled(y + 16, vld1q_s8(x[i].qs + 16), d);
    }
}

static inline int32x4_t dot_q8_0_block_neon(const block_q8_0 *x, const block_q8_0 *y) {
    const int32x4_t p = dot_s8x16(vdupq_n_s32(0), vld1q_s8(x->qs), vld1q_s8(y->qs));
    return dot_s8x16(p, vld1q_s8(x->qs + 16), vld1q_s8(y->qs + 16));
}

static void vec_dot_q8_0_q8_0_neon(int n, float *restrict s, const void *restrict vx, const void *restrict vy) {
    const block_q8_0 *restrict x = vx;
    const block_q8_0 *restrict y = vy;
    const int nb = n / QK8_0;
    float32x4_t acc0 = vdupq_n_f32(0.0f), acc1 = vdupq_n_f32(0.0f);
    int i = 0;
    for (; i + 2 <= nb; i += 2) {
        const float d0 = f16_to_f32_neon(x[i].d) * f16_to_f32_neon(y[i].d);
        const float d1 = f16_to_f32_neon(x[i + 1].d) * f16_to_f32_neon(y[i + 1].d);
        acc0 = vmlaq_n_f32(acc0, vcvtq_f32_s32(dot_q8_0_block_neon(x + i, y + i)), d0);
        acc1 = vmlaq_n_f32(acc1, vcvtq_f32_s32(dot_q8_0_block_neon(x + i + 1, y + i + 1)), d1);
    }
    *s = vaddvq_f32(vaddq_f32(acc0, acc1)) + dot_q8_0_q8_0_blocks(x + i, y + i, nb - i);
}

#endif /* BUBO_ARM64 */

/* ==== x86 tiles (legacy_tile.h) ========================================================== */
#if defined(BUBO_X86)

BUBO_TARGET_AVX512 static void pack_q8_0_avx512(packed_panel_avx512 *p, const uint8_t *x, size_t x_stride, int n_rows,
                                                  int k0, int kp) {
    for (int k = 0; k < kp; k++) {
        const size_t off = (size_t)(k0 + k) * sizeof(block_q8_0);
        __m512i z[8];
        for (int i = 0; i < 8; i++) {
            const block_q8_0 *a = (const block_q8_0 *)tile_block(x, x_stride, n_rows, i, off);
            const block_q8_0 *b = (const block_q8_0 *)tile_block(x, x_stride, n_rows, i + 8, off);
            z[i] = _mm512_xor_si512(load_2x32_avx512(a->qs, b->qs), _mm512_set1_epi8((char)0x80));
        }
        transpose_rows_avx512(z, p->q[k]);
        const __m512i heads = gather_block_heads_avx512(x, x_stride, n_rows, off);
        p->d[k] = f16_low_halves_avx512(heads);
    }
}

BUBO_TARGET_AVX512 static void tile_q8_0_q8_0_avx512(int n, int n_rows, int n_tokens, float *restrict s, size_t s_stride,
                                                    const void *restrict x, size_t x_stride, const void *restrict y,
                                                    size_t y_stride) {
    tile_legacy_avx512(n, n_rows, n_tokens, s, s_stride, x, x_stride, y, y_stride, pack_q8_0_avx512, udot2_q8_0_avx512, sizeof(block_q8_0), 0, 128);
}

BUBO_PREPACKED_LEGACY(q8_0, block_q8_0, pack_q8_0_avx512, udot2_q8_0_avx512, 8, 0, 128)
BUBO_PREPACKED_LEGACY_AVX2(q8_0, block_q8_0, 8, 0, 0)

#endif /* BUBO_X86 */

/* vec_dot looped over a tile, where no SIMD tile exists */
BUBO_LOOP_TILE(loop_tile_q8_0_q8_0_scalar, vec_dot_q8_0_q8_0_scalar)
#if defined(BUBO_X86)
BUBO_LOOP_TILE(loop_tile_q8_0_q8_0_avx2, vec_dot_q8_0_q8_0_avx2)
#endif
#if defined(BUBO_ARM64)
BUBO_LOOP_TILE(loop_tile_q8_0_q8_0_neon, vec_dot_q8_0_q8_0_neon)
#endif

/* ==== registration ========================================================================= */

void bubo_register_q8(bubo_type_traits *table) {
    bubo_type_traits *q8_0 = &table[BUBO_TYPE_Q8_0];
    q8_0->supported = 1;
    q8_0->vec_dot_type = BUBO_TYPE_Q8_0;
    q8_0->to_float[BUBO_ISA_SCALAR] = dequantize_row_q8_0_scalar;
    q8_0->from_float[BUBO_ISA_SCALAR] = quantize_row_q8_0_scalar;
    q8_0->vec_dot[BUBO_ISA_SCALAR] = vec_dot_q8_0_q8_0_scalar;
    q8_0->vec_dot_tile[BUBO_ISA_SCALAR] = loop_tile_q8_0_q8_0_scalar;

    /* An activation type only: no tensors of it, so not "supported" and no dot product. */
    bubo_type_traits *q8_1 = &table[BUBO_TYPE_Q8_1];
    q8_1->supported = 0;
    q8_1->vec_dot_type = BUBO_TYPE_Q8_1;
    q8_1->to_float[BUBO_ISA_SCALAR] = dequantize_row_q8_1_scalar;
    q8_1->from_float[BUBO_ISA_SCALAR] = quantize_row_q8_1_scalar;

#if defined(BUBO_X86)
    q8_0->to_float[BUBO_ISA_AVX2] = dequantize_row_q8_0_avx2;
    q8_0->from_float[BUBO_ISA_AVX2] = quantize_row_q8_0_avx2;
    q8_0->vec_dot[BUBO_ISA_AVX2] = vec_dot_q8_0_q8_0_avx2;
    q8_0->vec_dot_tile[BUBO_ISA_AVX2] = loop_tile_q8_0_q8_0_avx2;
    q8_0->prepack[BUBO_ISA_AVX2] = q8_0_prepack_avx2;
    q8_0->vec_dot_tile_prepacked[BUBO_ISA_AVX2] = q8_0_tile_prepacked_avx2;
    q8_0->prepacked_row[BUBO_ISA_AVX2] = q8_0_prepacked_row_avx2;
    q8_0->to_float[BUBO_ISA_AVX512] = dequantize_row_q8_0_avx512;
    q8_0->from_float[BUBO_ISA_AVX512] = quantize_row_q8_0_avx512;
    q8_0->vec_dot[BUBO_ISA_AVX512] = vec_dot_q8_0_q8_0_avx512;
    q8_0->vec_dot_tile[BUBO_ISA_AVX512] = tile_q8_0_q8_0_avx512;
    q8_0->prepack[BUBO_ISA_AVX512] = q8_0_prepack_avx512;
    q8_0->vec_dot_tile_prepacked[BUBO_ISA_AVX512] = q8_0_tile_prepacked_avx512;
    q8_0->prepacked_row[BUBO_ISA_AVX512] = q8_0_prepacked_row_avx512;
    q8_1->from_float[BUBO_ISA_AVX2] = quantize_row_q8_1_avx2;
    q8_1->from_float[BUBO_ISA_AVX512] = quantize_row_q8_1_avx512;
#endif
#if defined(BUBO_ARM64)
    q8_0->to_float[BUBO_ISA_NEON] = dequantize_row_q8_0_neon;
    q8_0->from_float[BUBO_ISA_NEON] = quantize_row_q8_0_neon;
    q8_0->vec_dot[BUBO_ISA_NEON] = vec_dot_q8_0_q8_0_neon;
    q8_0->vec_dot_tile[BUBO_ISA_NEON] = loop_tile_q8_0_q8_0_neon;
    q8_1->from_float[BUBO_ISA_NEON] = quantize_row_q8_1_neon;
#endif
}
