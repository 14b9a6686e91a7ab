/* Q4_0 and Q4_1: 32 4-bit values and an f16 scale (Q4_1 also an f16 min).
 *
 *   Q4_0: x = (q - 8) * d          dot with Q8_0 activations
 *   Q4_1: x = q * d + m            dot with Q8_1 activations, whose s = dy * sum(qy) turns the
 *                                  min's share of a block, m * dy * sum(qy), into one multiply
 *
 * The SIMD dot products multiply the unsigned nibbles q by the signed activations directly
 * (maddubs on AVX2, vpdpbusd on AVX-512); Q4_0's offset is taken off afterwards as 8 * sum(qy),
 * computed by the same instruction. */
#include "legacy_tile.h"
#include "legacy_tile_avx2.h"

/* ==== scalar reference ==================================================================== */

/* ggml's reference quantizers (quantize_row_q4_0_ref, _q4_1_ref), for tests and tools. */
static void quantize_row_q4_0_scalar(const float *restrict x, void *restrict vy, int64_t n) {
    block_q4_0 *restrict y = vy;
    for (int64_t i = 0; i < n / QK4_0; i++, x += QK4_0) {
        float amax = 0.0f, max = 0.0f; /* the value of largest magnitude, with its sign */
        for (int j = 0; j < QK4_0; j++) {
            if (amax < fabsf(x[j])) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        }
        const float d = max / -8;
        const float id = inverse_scale(d);
        y[i].d = bubo_f2h(d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            const int lo = (int)(int8_t)(x[j] * id + 8.5f), hi = (int)(int8_t)(x[j + QK4_0 / 2] * id + 8.5f);
            y[i].qs[j] = (uint8_t)((lo < 15 ? lo : 15) | (hi < 15 ? hi : 15) << 4);
        }
    }
}

static void quantize_row_q4_1_scalar(const float *restrict x, void *restrict vy, int64_t n) {
    block_q4_1 *restrict y = vy;
    for (int64_t i = 0; i < n / QK4_1; i++, x += QK4_1) {
        float min = x[0], max = x[0];
        for (int j = 1; j < QK4_1; j++) {
            if (x[j] < min) min = x[j];
            if (x[j] > max) max = x[j];
        }
        const float d = (max - min) / 15;
        const float id = inverse_scale(d);
        y[i].d = bubo_f2h(d);
        y[i].m = bubo_f2h(min);
        for (int j = 0; j < QK4_1 / 2; j++) {
            const int lo = (int)(int8_t)((x[j] - min) * id + 0.5f);
            const int hi = (int)(int8_t)((x[j + QK4_1 / 2] - min) * id + 0.5f);
            y[i].qs[j] = (uint8_t)((lo < 15 ? lo : 15) | (hi < 15 ? hi : 15) << 4);
        }
    }
}

static void dequantize_row_q4_0_scalar(const void *restrict vx, float *restrict y, int64_t n) {
    const block_q4_0 *restrict x = vx;
    for (int64_t i = 0; i < n / QK4_0; i++, y += QK4_0) {
        const float d = bubo_h2f(x[i].d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            y[j] = (float)((x[i].qs[j] & 0x0F) - 8) * d;
            y[j + QK4_0 / 2] = (float)((x[i].qs[j] >> 4) - 8) * d;
        }
    }
}

static void dequantize_row_q4_1_scalar(const void *restrict vx, float *restrict y, int64_t n) {
    const block_q4_1 *restrict x = vx;
    for (int64_t i = 0; i < n / QK4_1; i++, y += QK4_1) {
        const float d = bubo_h2f(x[i].d), m = bubo_h2f(x[i].m);
        for (int j = 0; j < QK4_1 / 2; j++) {
            y[j] = (float)(x[i].qs[j] & 0x0F) * d + m;
            y[j + QK4_1 / 2] = (float)(x[i].qs[j] >> 4) * d + m;
        }
    }
}

/* Blocks [0, nb): the scalar kernels, and the tails of the SIMD ones. */
static float dot_q4_0_q8_0_blocks(const block_q4_0 *restrict x, const block_q8_0 *restrict y, int nb) {
    float sumf = 0.0f;
    for (int i = 0; i < nb; i++) {
        int sumi = 0;
        for (int j = 0; j < QK4_0 / 2; j++)
            sumi += ((x[i].qs[j] & 0x0F) - 8) * y[i].qs[j] + ((x[i].qs[j] >> 4) - 8) * y[i].qs[j + QK4_0 / 2];
        sumf += (float)sumi * (bubo_h2f(x[i].d) * bubo_h2f(y[i].d));
    }
    return sumf;
}

static float dot_q4_1_q8_1_blocks(const block_q4_1 *restrict x, const block_q8_1 *restrict y, int nb) {
    float sumf = 0.0f;
    for (int i = 0; i < nb; i++) {
        int sumi = 0;
        for (int j = 0; j < QK4_1 / 2; j++)
            sumi += (x[i].qs[j] & 0x0F) * y[i].qs[j] + (x[i].qs[j] >> 4) * y[i].qs[j + QK4_1 / 2];
        sumf += (float)sumi * (bubo_h2f(x[i].d) * y[i].d) + bubo_h2f(x[i].m) * y[i].s;
    }
    return sumf;
}

static void vec_dot_q4_0_q8_0_scalar(int n, float *restrict s, const void *restrict vx, const void *restrict vy) {
    *s = dot_q4_0_q8_0_blocks(vx, vy, n / QK4_0);
}

static void vec_dot_q4_1_q8_1_scalar(int n, float *restrict s, const void *restrict vx, const void *restrict vy) {
    *s = dot_q4_1_q8_1_blocks(vx, vy, n / QK4_1);
}

/* ==== x86: AVX2 and AVX-512 ================================================================ */
#if defined(BUBO_X86)

BUBO_TARGET_AVX2 static void dequantize_row_q4_0_avx2(const void *restrict vx, float *restrict y, int64_t n) {
    const block_q4_0 *restrict x = vx;
    const __m256 zero = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK4_0; i++, y += QK4_0) {
        const __m256 d = _mm256_set1_ps(_cvtsh_ss(x[i].d));
        __m128i lo, hi;
        nibble_halves(x[i].qs, &lo, &hi);
        lo = _mm_sub_epi8(lo, _mm_set1_epi8(8));
        hi = _mm_sub_epi8(hi, _mm_set1_epi8(8));
        STORE16_AVX2(y, lo, _mm256_cvtepi8_epi32, d, zero);
        STORE16_AVX2(y + 16, hi, _mm256_cvtepi8_epi32, d, zero);
    }
}

BUBO_TARGET_AVX2 static void dequantize_row_q4_1_avx2(const void *restrict vx, float *restrict y, int64_t n) {
    const block_q4_1 *restrict x = vx;
    for (int64_t i = 0; i < n / QK4_1; i++, y += QK4_1) {
        const __m256 d = _mm256_set1_ps(_cvtsh_ss(x[i].d)), m = _mm256_set1_ps(_cvtsh_ss(x[i].m));
        __m128i lo, hi;
        nibble_halves(x[i].qs, &lo, &hi);
        STORE16_AVX2(y, lo, _mm256_cvtepu8_epi32, d, m);
        STORE16_AVX2(y + 16, hi, _mm256_cvtepu8_epi32, d, m);
    }
}

/* int32 lane sums of one block: sum((q - 8) * qy) = sum(q * qy) - sum(8 * qy), in int16 first
 * (|q * qy + q' * qy'| <= 2 * 15 * 127, so the difference cannot saturate). */
BUBO_TARGET_AVX2 static inline __m256i dot_q4_0_block_avx2(const block_q4_0 *x, const block_q8_0 *y) {
    const __m256i q = nibbles_avx2(x->qs);
    const __m256i a = _mm256_loadu_si256((const __m256i *)y->qs);
    const __m256i p = _mm256_sub_epi16(_mm256_maddubs_epi16(q, a), _mm256_maddubs_epi16(_mm256_set1_epi8(8), a));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

BUBO_TARGET_AVX2 static inline __m256i dot_q4_1_block_avx2(const block_q4_1 *x, const block_q8_1 *y) {
    return dot_u8s8_avx2(nibbles_avx2(x->qs), _mm256_loadu_si256((const __m256i *)y->qs));
}

BUBO_TARGET_AVX2 static __m256i dot1_q4_0_avx2(const void *x, const void *y) { return dot_q4_0_block_avx2(x, y); }

/* the tiles' chain (legacy_tile_avx2.h): the packed tile's bits */
BUBO_TARGET_AVX2 static void vec_dot_q4_0_q8_0_avx2(int n, float *restrict s, const void *restrict vx,
                                                     const void *restrict vy) {
    *s = vec_dot_legacy_chain_avx2(n / QK8_0, vx, sizeof(block_q4_0), vy, dot1_q4_0_avx2, 0);
}

BUBO_TARGET_AVX2 static __m256i dot1_q4_1_avx2(const void *x, const void *y) { return dot_q4_1_block_avx2(x, y); }

/* the tiles' chain (legacy_tile_avx2.h): the packed tile's bits */
BUBO_TARGET_AVX2 static void vec_dot_q4_1_q8_1_avx2(int n, float *restrict s, const void *restrict vx,
                                                     const void *restrict vy) {
    *s = vec_dot_legacy_chain_avx2(n / QK8_0, vx, sizeof(block_q4_1), vy, dot1_q4_1_avx2, 1);
}

/* --- AVX-512 --- */

BUBO_TARGET_AVX512 static void dequantize_row_q4_0_avx512(const void *restrict vx, float *restrict y, int64_t n) {
    const block_q4_0 *restrict x = vx;
    const __m512 zero = _mm512_setzero_ps();
    for (int64_t i = 0; i < n / QK4_0; i++, y += QK4_0) {
        const __m512 d = _mm512_set1_ps(_cvtsh_ss(x[i].d));
        __m128i lo, hi;
        nibble_halves(x[i].qs, &lo, &hi);
        STORE16_AVX512(y, _mm_sub_epi8(lo, _mm_set1_epi8(8)), _mm512_cvtepi8_epi32, d, zero);
        STORE16_AVX512(y + 16, _mm_sub_epi8(hi, _mm_set1_epi8(8)), _mm512_cvtepi8_epi32, d, zero);
    }
}

BUBO_TARGET_AVX512 static void dequantize_row_q4_1_avx512(const void *restrict vx, float *restrict y, int64_t n) {
    const block_q4_1 *restrict x = vx;
    for (int64_t i = 0; i < n / QK4_1; i++, y += QK4_1) {
        const __m512 d = _mm512_set1_ps(_cvtsh_ss(x[i].d)), m = _mm512_set1_ps(_cvtsh_ss(x[i].m));
        __m128i lo, hi;
        nibble_halves(x[i].qs, &lo, &hi);
        STORE16_AVX512(y, lo, _mm512_cvtepu8_epi32, d, m);
        STORE16_AVX512(y + 16, hi, _mm512_cvtepu8_epi32, d, m);
    }
}

/* Two blocks' int32 lane sums: sum(q * qy) - sum(8 * qy), both with vpdpbusd. */
BUBO_TARGET_AVX512 static inline __m512i dot_q4_0_2blocks_avx512(const block_q4_0 *x0, const block_q4_0 *x1,
                                                        const block_q8_0 *y0, const block_q8_0 *y1) {
    const __m512i q = nibbles_2x_avx512(x0->qs, x1->qs);
    const __m512i a = load_2x32_avx512(y0->qs, y1->qs);
    const __m512i zero = _mm512_setzero_si512();
    return _mm512_sub_epi32(_mm512_dpbusd_epi32(zero, q, a), _mm512_dpbusd_epi32(zero, _mm512_set1_epi8(8), a));
}

BUBO_TARGET_AVX512 static inline __m512i dot_q4_1_2blocks_avx512(const block_q4_1 *x0, const block_q4_1 *x1,
                                                        const block_q8_1 *y0, const block_q8_1 *y1) {
    return _mm512_dpbusd_epi32(_mm512_setzero_si512(), nibbles_2x_avx512(x0->qs, x1->qs),
                               load_2x32_avx512(y0->qs, y1->qs));
}

BUBO_TARGET_AVX512 static inline __m512i udot2_q4_0_avx512(const void *x0, const void *x1, __m512i a) {
    return _mm512_dpbusd_epi32(_mm512_setzero_si512(), nibbles_2x_avx512(((const block_q4_0 *)x0)->qs, ((const block_q4_0 *)x1)->qs), a);
}

BUBO_TARGET_AVX512 static __m512i dot2_q4_0_avx512(const void *x0, const void *x1, const void *y0, const void *y1) {
    return dot_q4_0_2blocks_avx512(x0, x1, y0, y1);
}

BUBO_TARGET_AVX512 static void vec_dot_q4_0_q8_0_avx512(int n, float *restrict s, const void *restrict vx,
                                                         const void *restrict vy) {
    *s = vec_dot_legacy_avx512(n / QK8_0, vx, sizeof(block_q4_0), vy, dot2_q4_0_avx512, 0);
}

BUBO_TARGET_AVX512 static inline __m512i udot2_q4_1_avx512(const void *x0, const void *x1, __m512i a) {
    return _mm512_dpbusd_epi32(_mm512_setzero_si512(), nibbles_2x_avx512(((const block_q4_1 *)x0)->qs, ((const block_q4_1 *)x1)->qs), a);
}

BUBO_TARGET_AVX512 static __m512i dot2_q4_1_avx512(const void *x0, const void *x1, const void *y0, const void *y1) {
    return dot_q4_1_2blocks_avx512(x0, x1, y0, y1);
}

BUBO_TARGET_AVX512 static void vec_dot_q4_1_q8_1_avx512(int n, float *restrict s, const void *restrict vx,
                                                         const void *restrict vy) {
    *s = vec_dot_legacy_avx512(n / QK8_0, vx, sizeof(block_q4_1), vy, dot2_q4_1_avx512, 1);
}

#endif /* BUBO_X86 */

/* ==== arm64: NEON ========================================================================== */
#if defined(BUBO_ARM64)

static void dequantize_row_q4_0_neon(const void *restrict vx, float *restrict y, int64_t n) {
    const block_q4_0 *restrict x = vx;
    for (int64_t i = 0; i < n / QK4_0; i++, y += QK4_0) {
        const float32x4_t d = vdupq_n_f32(f16_to_f32_neon(x[i].d));
        const uint8x16_t raw = vld1q_u8(x[i].qs);
        const int8x16_t eight = vdupq_n_s8(8);
        store_s8x16_scaled(y, vsubq_s8(vreinterpretq_s8_u8(vandq_u8(raw, vdupq_n_u8(0x0F))), eight), d);
        store_s8x16_scaled(y + 16, vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(raw, 4)), eight), d);
    }
}

static void dequantize_row_q4_1_neon(const void *restrict vx, float *restrict y, int64_t n) {
    const block_q4_1 *restrict x = vx;
    for (int64_t i = 0; i < n / QK4_1; i++, y += QK4_1) {
        const float32x4_t d = vdupq_n_f32(f16_to_f32_neon(x[i].d)), m = vdupq_n_f32(f16_to_f32_neon(x[i].m));
        const uint8x16_t raw = vld1q_u8(x[i].qs);
        store_u8x16_scaled(y, vandq_u8(raw, vdupq_n_u8(0x0F)), d, m);
        store_u8x16_scaled(y + 16, vshrq_n_u8(raw, 4), d, m);
    }
}

/* int32 lane sums of one block; `offset` is subtracted from every nibble (8 for Q4_0, 0 for
 * Q4_1: the nibbles are small enough for signed bytes either way). */
static inline int32x4_t dot_q4_block_neon(const uint8_t *qs, const int8_t *qy, int8x16_t offset) {
    const uint8x16_t raw = vld1q_u8(qs);
    const int8x16_t lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(raw, vdupq_n_u8(0x0F))), offset);
    const int8x16_t hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(raw, 4)), offset);
    return dot_s8x16(dot_s8x16(vdupq_n_s32(0), lo, vld1q_s8(qy)), hi, vld1q_s8(qy + 16));
}

static void vec_dot_q4_0_q8_0_neon(int n, float *restrict s, const void *restrict vx, const void *restrict vy) {
    const block_q4_0 *restrict x = vx;
    const block_q8_0 *restrict y = vy;
    const int nb = n / QK4_0;
    const int8x16_t eight = vdupq_n_s8(8);
    float32x4_t acc0 = vdupq_n_f32(0.0f), acc1 = vdupq_n_f32(0.0f);
    int i = 0;
    for (; i + 2 <= nb; i += 2) {
        const float d0 = f16_to_f32_neon(x[i].d) * f16_to_f32_neon(y[i].d);
        const float d1 = f16_to_f32_neon(x[i + 1].d) * f16_to_f32_neon(y[i + 1].d);
        acc0 = vmlaq_n_f32(acc0, vcvtq_f32_s32(dot_q4_block_neon(x[i].qs, y[i].qs, eight)), d0);
        acc1 = vmlaq_n_f32(acc1, vcvtq_f32_s32(dot_q4_block_neon(x[i + 1].qs, y[i + 1].qs, eight)), d1);
    }
    *s = vaddvq_f32(vaddq_f32(acc0, acc1)) + dot_q4_0_q8_0_blocks(x + i, y + i, nb - i);
}

static void vec_dot_q4_1_q8_1_neon(int n, float *restrict s, const void *restrict vx, const void *restrict vy) {
    const block_q4_1 *restrict x = vx;
    const block_q8_1 *restrict y = vy;
    const int nb = n / QK4_1;
    const int8x16_t zero = vdupq_n_s8(0);
    float32x4_t acc0 = vdupq_n_f32(0.0f), acc1 = vdupq_n_f32(0.0f);
    float mins = 0.0f;
    int i = 0;
    for (; i + 2 <= nb; i += 2) {
        const float d0 = f16_to_f32_neon(x[i].d) * y[i].d, d1 = f16_to_f32_neon(x[i + 1].d) * y[i + 1].d;
        mins += f16_to_f32_neon(x[i].m) * y[i].s + f16_to_f32_neon(x[i + 1].m) * y[i + 1].s;
        acc0 = vmlaq_n_f32(acc0, vcvtq_f32_s32(dot_q4_block_neon(x[i].qs, y[i].qs, zero)), d0);
        acc1 = vmlaq_n_f32(acc1, vcvtq_f32_s32(dot_q4_block_neon(x[i + 1].qs, y[i + 1].qs, zero)), d1);
    }
    *s = vaddvq_f32(vaddq_f32(acc0, acc1)) + mins + dot_q4_1_q8_1_blocks(x + i, y + i, nb - i);
}

#endif /* BUBO_ARM64 */

/* ==== x86 tiles (legacy_tile.h) ========================================================== */
#if defined(BUBO_X86)

BUBO_TARGET_AVX512 static void pack_q4_0_avx512(packed_panel_avx512 *p, const uint8_t *x, size_t x_stride, int n_rows,
                                                  int k0, int kp) {
    for (int k = 0; k < kp; k++) {
        const size_t off = (size_t)(k0 + k) * sizeof(block_q4_0);
        __m512i z[8];
        for (int i = 0; i < 8; i++) {
            const block_q4_0 *a = (const block_q4_0 *)tile_block(x, x_stride, n_rows, i, off);
            const block_q4_0 *b = (const block_q4_0 *)tile_block(x, x_stride, n_rows, i + 8, off);
            z[i] = nibbles_2x_avx512(a->qs, b->qs);
        }
        transpose_rows_avx512(z, p->q[k]);
        const __m512i heads = gather_block_heads_avx512(x, x_stride, n_rows, off);
        p->d[k] = f16_low_halves_avx512(heads);
    }
}

BUBO_TARGET_AVX512 static void tile_q4_0_q8_0_avx512(int n, int n_rows, int n_tokens, float *restrict s, size_t s_stride,
                                                    const void *restrict x, size_t x_stride, const void *restrict y,
                                                    size_t y_stride) {
    tile_legacy_avx512(n, n_rows, n_tokens, s, s_stride, x, x_stride, y, y_stride, pack_q4_0_avx512, udot2_q4_0_avx512, sizeof(block_q4_0), 0, 8);
}

BUBO_TARGET_AVX512 static void pack_q4_1_avx512(packed_panel_avx512 *p, const uint8_t *x, size_t x_stride, int n_rows,
                                                  int k0, int kp) {
    for (int k = 0; k < kp; k++) {
        const size_t off = (size_t)(k0 + k) * sizeof(block_q4_1);
        __m512i z[8];
        for (int i = 0; i < 8; i++) {
            const block_q4_1 *a = (const block_q4_1 *)tile_block(x, x_stride, n_rows, i, off);
            const block_q4_1 *b = (const block_q4_1 *)tile_block(x, x_stride, n_rows, i + 8, off);
            z[i] = nibbles_2x_avx512(a->qs, b->qs);
        }
        transpose_rows_avx512(z, p->q[k]);
        const __m512i heads = gather_block_heads_avx512(x, x_stride, n_rows, off);
        p->d[k] = f16_low_halves_avx512(heads);
        p->m[k] = f16_low_halves_avx512(_mm512_srli_epi32(heads, 16));
    }
}

BUBO_TARGET_AVX512 static void tile_q4_1_q8_1_avx512(int n, int n_rows, int n_tokens, float *restrict s, size_t s_stride,
                                                    const void *restrict x, size_t x_stride, const void *restrict y,
                                                    size_t y_stride) {
    tile_legacy_avx512(n, n_rows, n_tokens, s, s_stride, x, x_stride, y, y_stride, pack_q4_1_avx512, udot2_q4_1_avx512, sizeof(block_q4_1), 1, 0);
}

BUBO_PREPACKED_LEGACY(q4_0, block_q4_0, pack_q4_0_avx512, udot2_q4_0_avx512, 4, 0, 8)
BUBO_PREPACKED_LEGACY_AVX2(q4_0, block_q4_0, 4, 0, 8)
BUBO_PREPACKED_LEGACY(q4_1, block_q4_1, pack_q4_1_avx512, udot2_q4_1_avx512, 4, 1, 0)
BUBO_PREPACKED_LEGACY_AVX2(q4_1, block_q4_1, 4, 1, 0)

#endif /* BUBO_X86 */

/* vec_dot looped over a tile, where no SIMD tile exists */
BUBO_LOOP_TILE(loop_tile_q4_0_q8_0_scalar, vec_dot_q4_0_q8_0_scalar)
BUBO_LOOP_TILE(loop_tile_q4_1_q8_1_scalar, vec_dot_q4_1_q8_1_scalar)
#if defined(BUBO_X86)
BUBO_LOOP_TILE(loop_tile_q4_0_q8_0_avx2, vec_dot_q4_0_q8_0_avx2)
BUBO_LOOP_TILE(loop_tile_q4_1_q8_1_avx2, vec_dot_q4_1_q8_1_avx2)
#endif
#if defined(BUBO_ARM64)
BUBO_LOOP_TILE(loop_tile_q4_0_q8_0_neon, vec_dot_q4_0_q8_0_neon)
BUBO_LOOP_TILE(loop_tile_q4_1_q8_1_neon, vec_dot_q4_1_q8_1_neon)
#endif

/* ==== registration ========================================================================= */

void bubo_register_q4(bubo_type_traits *table) {
    bubo_type_traits *q4_0 = &table[BUBO_TYPE_Q4_0];
    q4_0->supported = 1;
    q4_0->vec_dot_type = BUBO_TYPE_Q8_0;
    q4_0->to_float[BUBO_ISA_SCALAR] = dequantize_row_q4_0_scalar;
    q4_0->from_float[BUBO_ISA_SCALAR] = quantize_row_q4_0_scalar;
    q4_0->vec_dot[BUBO_ISA_SCALAR] = vec_dot_q4_0_q8_0_scalar;
    q4_0->vec_dot_tile[BUBO_ISA_SCALAR] = loop_tile_q4_0_q8_0_scalar;

    bubo_type_traits *q4_1 = &table[BUBO_TYPE_Q4_1];
    q4_1->supported = 1;
    q4_1->vec_dot_type = BUBO_TYPE_Q8_1;
    q4_1->to_float[BUBO_ISA_SCALAR] = dequantize_row_q4_1_scalar;
    q4_1->from_float[BUBO_ISA_SCALAR] = quantize_row_q4_1_scalar;
    q4_1->vec_dot[BUBO_ISA_SCALAR] = vec_dot_q4_1_q8_1_scalar;
    q4_1->vec_dot_tile[BUBO_ISA_SCALAR] = loop_tile_q4_1_q8_1_scalar;

#if defined(BUBO_X86)
    q4_0->to_float[BUBO_ISA_AVX2] = dequantize_row_q4_0_avx2;
    q4_0->vec_dot[BUBO_ISA_AVX2] = vec_dot_q4_0_q8_0_avx2;
    q4_0->vec_dot_tile[BUBO_ISA_AVX2] = loop_tile_q4_0_q8_0_avx2;
    q4_0->prepack[BUBO_ISA_AVX2] = q4_0_prepack_avx2;
    q4_0->vec_dot_tile_prepacked[BUBO_ISA_AVX2] = q4_0_tile_prepacked_avx2;
    q4_0->prepacked_row[BUBO_ISA_AVX2] = q4_0_prepacked_row_avx2;
    q4_0->to_float[BUBO_ISA_AVX512] = dequantize_row_q4_0_avx512;
    q4_0->vec_dot[BUBO_ISA_AVX512] = vec_dot_q4_0_q8_0_avx512;
    q4_0->vec_dot_tile[BUBO_ISA_AVX512] = tile_q4_0_q8_0_avx512;
    q4_0->prepack[BUBO_ISA_AVX512] = q4_0_prepack_avx512;
    q4_0->vec_dot_tile_prepacked[BUBO_ISA_AVX512] = q4_0_tile_prepacked_avx512;
    q4_0->prepacked_row[BUBO_ISA_AVX512] = q4_0_prepacked_row_avx512;
    q4_1->to_float[BUBO_ISA_AVX2] = dequantize_row_q4_1_avx2;
    q4_1->vec_dot[BUBO_ISA_AVX2] = vec_dot_q4_1_q8_1_avx2;
    q4_1->vec_dot_tile[BUBO_ISA_AVX2] = loop_tile_q4_1_q8_1_avx2;
    q4_1->prepack[BUBO_ISA_AVX2] = q4_1_prepack_avx2;
    q4_1->vec_dot_tile_prepacked[BUBO_ISA_AVX2] = q4_1_tile_prepacked_avx2;
    q4_1->prepacked_row[BUBO_ISA_AVX2] = q4_1_prepacked_row_avx2;
    q4_1->to_float[BUBO_ISA_AVX512] = dequantize_row_q4_1_avx512;
    q4_1->vec_dot[BUBO_ISA_AVX512] = vec_dot_q4_1_q8_1_avx512;
    q4_1->vec_dot_tile[BUBO_ISA_AVX512] = tile_q4_1_q8_1_avx512;
    q4_1->prepack[BUBO_ISA_AVX512] = q4_1_prepack_avx512;
    q4_1->vec_dot_tile_prepacked[BUBO_ISA_AVX512] = q4_1_tile_prepacked_avx512;
    q4_1->prepacked_row[BUBO_ISA_AVX512] = q4_1_prepacked_row_avx512;
#endif
#if defined(BUBO_ARM64)
    q4_0->to_float[BUBO_ISA_NEON] = dequantize_row_q4_0_neon;
    q4_0->vec_dot[BUBO_ISA_NEON] = vec_dot_q4_0_q8_0_neon;
    q4_0->vec_dot_tile[BUBO_ISA_NEON] = loop_tile_q4_0_q8_0_neon;
    q4_1->to_float[BUBO_ISA_NEON] = dequantize_row_q4_1_neon;
    q4_1->vec_dot[BUBO_ISA_NEON] = vec_dot_q4_1_q8_1_neon;
    q4_1->vec_dot_tile[BUBO_ISA_NEON] = loop_tile_q4_1_q8_1_neon;
#endif
}
