/* Q5_0 and Q5_1: 32 5-bit values (low 4 bits as Q4's nibbles, the 5th bits packed in qh) and
 * an f16 scale (Q5_1 also an f16 min).
 *
 *   Q5_0: x = (q - 16) * d         dot with Q8_0 activations
 *   Q5_1: x = q * d + m            dot with Q8_1 activations (m * s folds in the min)
 *
 * As in q4.c the SIMD dot products multiply the unsigned q by the signed activations and take
 * Q5_0's offset off afterwards as 16 * sum(qy). */
#include "legacy_tile.h"
#include "legacy_tile_avx2.h"

/* The 5-bit value of element j (0..31) of a block. */
static inline int q5_value(const uint8_t *qs, uint32_t qh, int j) {
    const int nibble = j < 16 ? (qs[j] & 0x0F) : (qs[j - 16] >> 4);
    return nibble | (int)((qh >> j) & 1) << 4;
}

static inline uint32_t q5_high_bits(const uint8_t qh[4]) {
    uint32_t bits;
    memcpy(&bits, qh, 4);
    return bits;
}

/* ==== scalar reference ==================================================================== */

/* Packs 32 values 0..31 into nibbles and 5th bits. */
static void q5_pack(const int q[32], uint8_t qs[16], uint8_t qh_out[4]) {
    uint32_t qh = 0;
    for (int j = 0; j < 16; j++) {
        qs[j] = (uint8_t)((q[j] & 0x0F) | (q[j + 16] & 0x0F) << 4);
        qh |= (uint32_t)(q[j] >> 4) << j | (uint32_t)(q[j + 16] >> 4) << (j + 16);
    }
    memcpy(qh_out, &qh, 4);
}

/* ggml's reference quantizers (quantize_row_q5_0_ref, _q5_1_ref), for tests and tools. */
static void quantize_row_q5_0_scalar(const float *restrict x, void *restrict vy, int64_t n) {
    block_q5_0 *restrict y = vy;
    for (int64_t i = 0; i < n / QK5_0; i++, x += QK5_0) {
        float amax = 0.0f, max = 0.0f; /* the value of largest magnitude, with its sign */
        for (int j = 0; j < QK5_0; j++) {
            if (amax < fabsf(x[j])) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        }
        const float d = max / -16;
        const float id = inverse_scale(d);
        int q[QK5_0];
        for (int j = 0; j < QK5_0; j++) {
            const int v = (int)(int8_t)(x[j] * id + 16.5f);
            q[j] = v < 31 ? v : 31;
        }
        y[i].d = bubo_f2h(d);
        q5_pack(q, y[i].qs, y[i].qh);
    }
}

static void quantize_row_q5_1_scalar(const float *restrict x, void *restrict vy, int64_t n) {
    block_q5_1 *restrict y = vy;
    for (int64_t i = 0; i < n / QK5_1; i++, x += QK5_1) {
        float min = x[0], max = x[0];
        for (int j = 1; j < QK5_1; j++) {
            if (x[j] < min) min = x[j];
            if (x[j] > max) max = x[j];
        }
        const float d = (max - min) / 31;
        const float id = inverse_scale(d);
        int q[QK5_1];
        for (int j = 0; j < QK5_1; j++) q[j] = (uint8_t)((x[j] - min) * id + 0.5f) & 0x1F;
        y[i].d = bubo_f2h(d);
        y[i].m = bubo_f2h(min);
        q5_pack(q, y[i].qs, y[i].qh);
    }
}

static void dequantize_row_q5_0_scalar(const void *restrict vx, float *restrict y, int64_t n) {
    const block_q5_0 *restrict x = vx;
    for (int64_t i = 0; i < n / QK5_0; i++, y += QK5_0) {
        const float d = bubo_h2f(x[i].d);
        const uint32_t qh = q5_high_bits(x[i].qh);
        for (int j = 0; j < QK5_0; j++) y[j] = (float)(q5_value(x[i].qs, qh, j) - 16) * d;
    }
}

static void dequantize_row_q5_1_scalar(const void *restrict vx, float *restrict y, int64_t n) {
    const block_q5_1 *restrict x = vx;
    for (int64_t i = 0; i < n / QK5_1; i++, y += QK5_1) {
        const float d = bubo_h2f(x[i].d), m = bubo_h2f(x[i].m);
        const uint32_t qh = q5_high_bits(x[i].qh);
        for (int j = 0; j < QK5_1; j++) y[j] = (float)q5_value(x[i].qs, qh, j) * d + m;
    }
}

/* Blocks [0, nb): the scalar kernels, and the tails of the SIMD ones. */
static float dot_q5_0_q8_0_blocks(const block_q5_0 *restrict x, const block_q8_0 *restrict y, int nb) {
    float sumf = 0.0f;
    for (int i = 0; i < nb; i++) {
        const uint32_t qh = q5_high_bits(x[i].qh);
        int sumi = 0;
        for (int j = 0; j < QK5_0; j++) sumi += (q5_value(x[i].qs, qh, j) - 16) * y[i].qs[j];
        sumf += (float)sumi * (bubo_h2f(x[i].d) * bubo_h2f(y[i].d));
    }
    return sumf;
}

static float dot_q5_1_q8_1_blocks(const block_q5_1 *restrict x, const block_q8_1 *restrict y, int nb) {
    float sumf = 0.0f;
    for (int i = 0; i < nb; i++) {
        const uint32_t qh = q5_high_bits(x[i].qh);
        int sumi = 0;
        for (int j = 0; j < QK5_1; j++) sumi += q5_value(x[i].qs, qh, j) * y[i].qs[j];
        sumf += (float)sumi * (bubo_h2f(x[i].d) * y[i].d) + bubo_h2f(x[i].m) * y[i].s;
    }
    return sumf;
}

static void vec_dot_q5_0_q8_0_scalar(int n, float *restrict s, const void *restrict vx, const void *restrict vy) {
    *s = dot_q5_0_q8_0_blocks(vx, vy, n / QK5_0);
}

static void vec_dot_q5_1_q8_1_scalar(int n, float *restrict s, const void *restrict vx, const void *restrict vy) {
    *s = dot_q5_1_q8_1_blocks(vx, vy, n / QK5_1);
}

/* ==== x86: AVX2 and AVX-512 ================================================================ */
#if defined(BUBO_X86)

/* One block's 32 values 0..31 in element order. */
BUBO_TARGET_AVX2 static inline __m256i q5_bytes_avx2(const uint8_t *qs, const uint8_t *qh) {
    return _mm256_or_si256(nibbles_avx2(qs), _mm256_and_si256(bits_to_bytes_avx2(qh), _mm256_set1_epi8(0x10)));
}

BUBO_TARGET_AVX2 static void dequantize_row_q5_0_avx2(const void *restrict vx, float *restrict y, int64_t n) {
    const block_q5_0 *restrict x = vx;
    const __m256 zero = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK5_0; i++, y += QK5_0) {
        const __m256 d = _mm256_set1_ps(_cvtsh_ss(x[i].d));
        const __m256i q = _mm256_sub_epi8(q5_bytes_avx2(x[i].qs, x[i].qh), _mm256_set1_epi8(16));
        STORE16_AVX2(y, _mm256_castsi256_si128(q), _mm256_cvtepi8_epi32, d, zero);
        STORE16_AVX2(y + 16, _mm256_extracti128_si256(q, 1), _mm256_cvtepi8_epi32, d, zero);
    }
}

BUBO_TARGET_AVX2 static void dequantize_row_q5_1_avx2(const void *restrict vx, float *restrict y, int64_t n) {
    const block_q5_1 *restrict x = vx;
    for (int64_t i = 0; i < n / QK5_1; i++, y += QK5_1) {
        const __m256 d = _mm256_set1_ps(_cvtsh_ss(x[i].d)), m = _mm256_set1_ps(_cvtsh_ss(x[i].m));
        const __m256i q = q5_bytes_avx2(x[i].qs, x[i].qh);
        STORE16_AVX2(y, _mm256_castsi256_si128(q), _mm256_cvtepu8_epi32, d, m);
        STORE16_AVX2(y + 16, _mm256_extracti128_si256(q, 1), _mm256_cvtepu8_epi32, d, m);
    }
}

/* int32 lane sums of one block: sum(q * qy) - sum(16 * qy), in int16 first (each pair sum is at
 * most 2 * 31 * 127 in magnitude, so the difference cannot saturate). */
BUBO_TARGET_AVX2 static inline __m256i dot_q5_0_block_avx2(const block_q5_0 *x, const block_q8_0 *y) {
    const __m256i q = q5_bytes_avx2(x->qs, x->qh);
    const __m256i a = _mm256_loadu_si256((const __m256i *)y->qs);
    const __m256i p = _mm256_sub_epi16(_mm256_maddubs_epi16(q, a), _mm256_maddubs_epi16(_mm256_set1_epi8(16), a));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

BUBO_TARGET_AVX2 static inline __m256i dot_q5_1_block_avx2(const block_q5_1 *x, const block_q8_1 *y) {
    return dot_u8s8_avx2(q5_bytes_avx2(x->qs, x->qh), _mm256_loadu_si256((const __m256i *)y->qs));
}

BUBO_TARGET_AVX2 static __m256i dot1_q5_0_avx2(const void *x, const void *y) { return dot_q5_0_block_avx2(x, y); }

/* the tiles' chain (legacy_tile_avx2.h): the packed tile's bits */
BUBO_TARGET_AVX2 static void vec_dot_q5_0_q8_0_avx2(int n, float *restrict s, const void *restrict vx,
                                                     const void *restrict vy) {
    *s = vec_dot_legacy_chain_avx2(n / QK8_0, vx, sizeof(block_q5_0), vy, dot1_q5_0_avx2, 0);
}

BUBO_TARGET_AVX2 static __m256i dot1_q5_1_avx2(const void *x, const void *y) { return dot_q5_1_block_avx2(x, y); }

/* the tiles' chain (legacy_tile_avx2.h): the packed tile's bits */
BUBO_TARGET_AVX2 static void vec_dot_q5_1_q8_1_avx2(int n, float *restrict s, const void *restrict vx,
                                                     const void *restrict vy) {
    *s = vec_dot_legacy_chain_avx2(n / QK8_0, vx, sizeof(block_q5_1), vy, dot1_q5_1_avx2, 1);
}

/* --- AVX-512 --- */

/* One block's values as two 16-byte halves (elements 0..15, 16..31), each 0..31: the 5th bits
 * are a ready-made byte mask. Adding 0x10 sets the bit, as the nibbles are below it. */
BUBO_TARGET_AVX512 static inline void q5_halves_avx512(const uint8_t *qs, const uint8_t *qh, __m128i *lo, __m128i *hi) {
    const uint32_t bits = q5_high_bits(qh);
    const __m128i five = _mm_set1_epi8(0x10);
    nibble_halves(qs, lo, hi);
    *lo = _mm_mask_add_epi8(*lo, (__mmask16)(bits & 0xFFFF), *lo, five);
    *hi = _mm_mask_add_epi8(*hi, (__mmask16)(bits >> 16), *hi, five);
}

BUBO_TARGET_AVX512 static void dequantize_row_q5_0_avx512(const void *restrict vx, float *restrict y, int64_t n) {
    const block_q5_0 *restrict x = vx;
    const __m512 zero = _mm512_setzero_ps();
    const __m128i sixteen = _mm_set1_epi8(16);
    for (int64_t i = 0; i < n / QK5_0; i++, y += QK5_0) {
        const __m512 d = _mm512_set1_ps(_cvtsh_ss(x[i].d));
        __m128i lo, hi;
        q5_halves_avx512(x[i].qs, x[i].qh, &lo, &hi);
        STORE16_AVX512(y, _mm_sub_epi8(lo, sixteen), _mm512_cvtepi8_epi32, d, zero);
        STORE16_AVX512(y + 16, _mm_sub_epi8(hi, sixteen), _mm512_cvtepi8_epi32, d, zero);
    }
}

BUBO_TARGET_AVX512 static void dequantize_row_q5_1_avx512(const void *restrict vx, float *restrict y, int64_t n) {
    const block_q5_1 *restrict x = vx;
    for (int64_t i = 0; i < n / QK5_1; i++, y += QK5_1) {
        const __m512 d = _mm512_set1_ps(_cvtsh_ss(x[i].d)), m = _mm512_set1_ps(_cvtsh_ss(x[i].m));
        __m128i lo, hi;
        q5_halves_avx512(x[i].qs, x[i].qh, &lo, &hi);
        STORE16_AVX512(y, lo, _mm512_cvtepu8_epi32, d, m);
        STORE16_AVX512(y + 16, hi, _mm512_cvtepu8_epi32, d, m);
    }
}

/* Two blocks' 64 values 0..31 in element order: the two qh words are one 64-bit byte mask. */
BUBO_TARGET_AVX512 static inline __m512i q5_bytes_2x_avx512(const uint8_t *qs0, const uint8_t *qh0,
                                                            const uint8_t *qs1, const uint8_t *qh1) {
    const __mmask64 high = _cvtu64_mask64((uint64_t)q5_high_bits(qh0) | (uint64_t)q5_high_bits(qh1) << 32);
    const __m512i q = nibbles_2x_avx512(qs0, qs1);
    return _mm512_mask_add_epi8(q, high, q, _mm512_set1_epi8(0x10));
}

BUBO_TARGET_AVX512 static inline __m512i dot_q5_0_2blocks_avx512(const block_q5_0 *x0, const block_q5_0 *x1,
                                                        const block_q8_0 *y0, const block_q8_0 *y1) {
    const __m512i q = q5_bytes_2x_avx512(x0->qs, x0->qh, x1->qs, x1->qh);
    const __m512i a = load_2x32_avx512(y0->qs, y1->qs);
    const __m512i zero = _mm512_setzero_si512();
    return _mm512_sub_epi32(_mm512_dpbusd_epi32(zero, q, a), _mm512_dpbusd_epi32(zero, _mm512_set1_epi8(16), a));
}

BUBO_TARGET_AVX512 static inline __m512i dot_q5_1_2blocks_avx512(const block_q5_1 *x0, const block_q5_1 *x1,
                                                        const block_q8_1 *y0, const block_q8_1 *y1) {
    return _mm512_dpbusd_epi32(_mm512_setzero_si512(), q5_bytes_2x_avx512(x0->qs, x0->qh, x1->qs, x1->qh),
                               load_2x32_avx512(y0->qs, y1->qs));
}

BUBO_TARGET_AVX512 static inline __m512i udot2_q5_0_avx512(const void *x0, const void *x1, __m512i a) {
    return _mm512_dpbusd_epi32(_mm512_setzero_si512(), q5_bytes_2x_avx512(((const block_q5_0 *)x0)->qs, ((const block_q5_0 *)x0)->qh, ((const block_q5_0 *)x1)->qs,
                                                      ((const block_q5_0 *)x1)->qh), a);
}

BUBO_TARGET_AVX512 static __m512i dot2_q5_0_avx512(const void *x0, const void *x1, const void *y0, const void *y1) {
    return dot_q5_0_2blocks_avx512(x0, x1, y0, y1);
}

BUBO_TARGET_AVX512 static void vec_dot_q5_0_q8_0_avx512(int n, float *restrict s, const void *restrict vx,
                                                         const void *restrict vy) {
    *s = vec_dot_legacy_avx512(n / QK8_0, vx, sizeof(block_q5_0), vy, dot2_q5_0_avx512, 0);
}

BUBO_TARGET_AVX512 static inline __m512i udot2_q5_1_avx512(const void *x0, const void *x1, __m512i a) {
    return _mm512_dpbusd_epi32(_mm512_setzero_si512(), q5_bytes_2x_avx512(((const block_q5_1 *)x0)->qs, ((const block_q5_1 *)x0)->qh, ((const block_q5_1 *)x1)->qs,
                                                      ((const block_q5_1 *)x1)->qh), a);
}

BUBO_TARGET_AVX512 static __m512i dot2_q5_1_avx512(const void *x0, const void *x1, const void *y0, const void *y1) {
    return dot_q5_1_2blocks_avx512(x0, x1, y0, y1);
}

BUBO_TARGET_AVX512 static void vec_dot_q5_1_q8_1_avx512(int n, float *restrict s, const void *restrict vx,
                                                         const void *restrict vy) {
    *s = vec_dot_legacy_avx512(n / QK8_0, vx, sizeof(block_q5_1), vy, dot2_q5_1_avx512, 1);
}

#endif /* BUBO_X86 */

/* ==== arm64: NEON ========================================================================== */
#if defined(BUBO_ARM64)

/* One block's values as two 16-byte halves (elements 0..15, 16..31), each 0..31. */
static inline void q5_halves_neon(const uint8_t *qs, const uint8_t *qh, uint8x16_t *lo, uint8x16_t *hi) {
    const uint8x16_t raw = vld1q_u8(qs), five = vdupq_n_u8(0x10);
    uint8x16_t bits_lo, bits_hi;
    bits_to_bytes_neon(qh, &bits_lo, &bits_hi);
    *lo = vorrq_u8(vandq_u8(raw, vdupq_n_u8(0x0F)), vandq_u8(bits_lo, five));
    *hi = vorrq_u8(vshrq_n_u8(raw, 4), vandq_u8(bits_hi, five));
}

static void dequantize_row_q5_0_neon(const void *restrict vx, float *restrict y, int64_t n) {
    const block_q5_0 *restrict x = vx;
    const int8x16_t sixteen = vdupq_n_s8(16);
    for (int64_t i = 0; i < n / QK5_0; i++, y += QK5_0) {
        const float32x4_t d = vdupq_n_f32(f16_to_f32_neon(x[i].d));
        uint8x16_t lo, hi;
        q5_halves_neon(x[i].qs, x[i].qh, &lo, &hi);
        store_s8x16_scaled(y, vsubq_s8(vreinterpretq_s8_u8(lo), sixteen), d);
        store_s8x16_scaled(y + 16, vsubq_s8(vreinterpretq_s8_u8(hi), sixteen), d);
    }
}

static void dequantize_row_q5_1_neon(const void *restrict vx, float *restrict y, int64_t n) {
    const block_q5_1 *restrict x = vx;
    for (int64_t i = 0; i < n / QK5_1; i++, y += QK5_1) {
        const float32x4_t d = vdupq_n_f32(f16_to_f32_neon(x[i].d)), m = vdupq_n_f32(f16_to_f32_neon(x[i].m));
        uint8x16_t lo, hi;
        q5_halves_neon(x[i].qs, x[i].qh, &lo, &hi);
        store_u8x16_scaled(y, lo, d, m);
        store_u8x16_scaled(y + 16, hi, d, m);
    }
}

/* int32 lane sums of one block; `offset` (16 for Q5_0, 0 for Q5_1) is subtracted from every
 * value, which leaves them in signed-byte range either way. */
static inline int32x4_t dot_q5_block_neon(const uint8_t *qs, const uint8_t *qh, const int8_t *qy, int8x16_t offset) {
    uint8x16_t lo, hi;
    q5_halves_neon(qs, qh, &lo, &hi);
    const int8x16_t a = vsubq_s8(vreinterpretq_s8_u8(lo), offset), b = vsubq_s8(vreinterpretq_s8_u8(hi), offset);
    return dot_s8x16(dot_s8x16(vdupq_n_s32(0), a, vld1q_s8(qy)), b, vld1q_s8(qy + 16));
}

static void vec_dot_q5_0_q8_0_neon(int n, float *restrict s, const void *restrict vx, const void *restrict vy) {
    const block_q5_0 *restrict x = vx;
    const block_q8_0 *restrict y = vy;
    const int nb = n / QK5_0;
    const int8x16_t sixteen = vdupq_n_s8(16);
    float32x4_t acc0 = vdupq_n_f32(0.0f), acc1 = vdupq_n_f32(0.0f);
    int i = 0;
    for (; i + 2 <= nb; i += 2) {
        const float d0 = f16_to_f32_neon(x[i].d) * f16_to_f32_neon(y[i].d);
        const float d1 = f16_to_f32_neon(x[i + 1].d) * f16_to_f32_neon(y[i + 1].d);
        acc0 = vmlaq_n_f32(acc0, vcvtq_f32_s32(dot_q5_block_neon(x[i].qs, x[i].qh, y[i].qs, sixteen)), d0);
        acc1 = vmlaq_n_f32(acc1, vcvtq_f32_s32(dot_q5_block_neon(x[i + 1].qs, x[i + 1].qh, y[i + 1].qs, sixteen)), d1);
    }
    *s = vaddvq_f32(vaddq_f32(acc0, acc1)) + dot_q5_0_q8_0_blocks(x + i, y + i, nb - i);
}

static void vec_dot_q5_1_q8_1_neon(int n, float *restrict s, const void *restrict vx, const void *restrict vy) {
    const block_q5_1 *restrict x = vx;
    const block_q8_1 *restrict y = vy;
    const int nb = n / QK5_1;
    const int8x16_t zero = vdupq_n_s8(0);
    float32x4_t acc0 = vdupq_n_f32(0.0f), acc1 = vdupq_n_f32(0.0f);
    float mins = 0.0f;
    int i = 0;
    for (; i + 2 <= nb; i += 2) {
        const float d0 = f16_to_f32_neon(x[i].d) * y[i].d, d1 = f16_to_f32_neon(x[i + 1].d) * y[i + 1].d;
        mins += f16_to_f32_neon(x[i].m) * y[i].s + f16_to_f32_neon(x[i + 1].m) * y[i + 1].s;
        acc0 = vmlaq_n_f32(acc0, vcvtq_f32_s32(dot_q5_block_neon(x[i].qs, x[i].qh, y[i].qs, zero)), d0);
        acc1 = vmlaq_n_f32(acc1, vcvtq_f32_s32(dot_q5_block_neon(x[i + 1].qs, x[i + 1].qh, y[i + 1].qs, zero)), d1);
    }
    *s = vaddvq_f32(vaddq_f32(acc0, acc1)) + mins + dot_q5_1_q8_1_blocks(x + i, y + i, nb - i);
}

#endif /* BUBO_ARM64 */

/* ==== x86 tiles (legacy_tile.h) ========================================================== */
#if defined(BUBO_X86)

BUBO_TARGET_AVX512 static void pack_q5_0_avx512(packed_panel_avx512 *p, const uint8_t *x, size_t x_stride, int n_rows,
                                                  int k0, int kp) {
    for (int k = 0; k < kp; k++) {
        const size_t off = (size_t)(k0 + k) * sizeof(block_q5_0);
        __m512i z[8];
        for (int i = 0; i < 8; i++) {
            const block_q5_0 *a = (const block_q5_0 *)tile_block(x, x_stride, n_rows, i, off);
            const block_q5_0 *b = (const block_q5_0 *)tile_block(x, x_stride, n_rows, i + 8, off);
            z[i] = q5_bytes_2x_avx512(a->qs, a->qh, b->qs, b->qh);
        }
        transpose_rows_avx512(z, p->q[k]);
        const __m512i heads = gather_block_heads_avx512(x, x_stride, n_rows, off);
        p->d[k] = f16_low_halves_avx512(heads);
    }
}

BUBO_TARGET_AVX512 static void tile_q5_0_q8_0_avx512(int n, int n_rows, int n_tokens, float *restrict s, size_t s_stride,
                                                    const void *restrict x, size_t x_stride, const void *restrict y,
                                                    size_t y_stride) {
    tile_legacy_avx512(n, n_rows, n_tokens, s, s_stride, x, x_stride, y, y_stride, pack_q5_0_avx512, udot2_q5_0_avx512, sizeof(block_q5_0), 0, 16);
}

BUBO_TARGET_AVX512 static void pack_q5_1_avx512(packed_panel_avx512 *p, const uint8_t *x, size_t x_stride, int n_rows,
                                                  int k0, int kp) {
    for (int k = 0; k < kp; k++) {
        const size_t off = (size_t)(k0 + k) * sizeof(block_q5_1);
        __m512i z[8];
        for (int i = 0; i < 8; i++) {
            const block_q5_1 *a = (const block_q5_1 *)tile_block(x, x_stride, n_rows, i, off);
            const block_q5_1 *b = (const block_q5_1 *)tile_block(x, x_stride, n_rows, i + 8, off);
            z[i] = q5_bytes_2x_avx512(a->qs, a->qh, b->qs, b->qh);
        }
        transpose_rows_avx512(z, p->q[k]);
        const __m512i heads = gather_block_heads_avx512(x, x_stride, n_rows, off);
        p->d[k] = f16_low_halves_avx512(heads);
        p->m[k] = f16_low_halves_avx512(_mm512_srli_epi32(heads, 16));
    }
}

BUBO_TARGET_AVX512 static void tile_q5_1_q8_1_avx512(int n, int n_rows, int n_tokens, float *restrict s, size_t s_stride,
                                                    const void *restrict x, size_t x_stride, const void *restrict y,
                                                    size_t y_stride) {
    tile_legacy_avx512(n, n_rows, n_tokens, s, s_stride, x, x_stride, y, y_stride, pack_q5_1_avx512, udot2_q5_1_avx512, sizeof(block_q5_1), 1, 0);
}

BUBO_PREPACKED_LEGACY(q5_0, block_q5_0, pack_q5_0_avx512, udot2_q5_0_avx512, 5, 0, 16)
BUBO_PREPACKED_LEGACY_AVX2(q5_0, block_q5_0, 5, 0, 16)
BUBO_PREPACKED_LEGACY(q5_1, block_q5_1, pack_q5_1_avx512, udot2_q5_1_avx512, 5, 1, 0)
BUBO_PREPACKED_LEGACY_AVX2(q5_1, block_q5_1, 5, 1, 0)

#endif /* BUBO_X86 */

/* vec_dot looped over a tile, where no SIMD tile exists */
BUBO_LOOP_TILE(loop_tile_q5_0_q8_0_scalar, vec_dot_q5_0_q8_0_scalar)
BUBO_LOOP_TILE(loop_tile_q5_1_q8_1_scalar, vec_dot_q5_1_q8_1_scalar)
#if defined(BUBO_X86)
BUBO_LOOP_TILE(loop_tile_q5_0_q8_0_avx2, vec_dot_q5_0_q8_0_avx2)
BUBO_LOOP_TILE(loop_tile_q5_1_q8_1_avx2, vec_dot_q5_1_q8_1_avx2)
#endif
#if defined(BUBO_ARM64)
BUBO_LOOP_TILE(loop_tile_q5_0_q8_0_neon, vec_dot_q5_0_q8_0_neon)
BUBO_LOOP_TILE(loop_tile_q5_1_q8_1_neon, vec_dot_q5_1_q8_1_neon)
#endif

/* ==== registration ========================================================================= */

void bubo_register_q5(bubo_type_traits *table) {
    bubo_type_traits *q5_0 = &table[BUBO_TYPE_Q5_0];
    q5_0->supported = 1;
    q5_0->vec_dot_type = BUBO_TYPE_Q8_0;
    q5_0->to_float[BUBO_ISA_SCALAR] = dequantize_row_q5_0_scalar;
    q5_0->from_float[BUBO_ISA_SCALAR] = quantize_row_q5_0_scalar;
    q5_0->vec_dot[BUBO_ISA_SCALAR] = vec_dot_q5_0_q8_0_scalar;
    q5_0->vec_dot_tile[BUBO_ISA_SCALAR] = loop_tile_q5_0_q8_0_scalar;

    bubo_type_traits *q5_1 = &table[BUBO_TYPE_Q5_1];
    q5_1->supported = 1;
    q5_1->vec_dot_type = BUBO_TYPE_Q8_1;
    q5_1->to_float[BUBO_ISA_SCALAR] = dequantize_row_q5_1_scalar;
    q5_1->from_float[BUBO_ISA_SCALAR] = quantize_row_q5_1_scalar;
    q5_1->vec_dot[BUBO_ISA_SCALAR] = vec_dot_q5_1_q8_1_scalar;
    q5_1->vec_dot_tile[BUBO_ISA_SCALAR] = loop_tile_q5_1_q8_1_scalar;

#if defined(BUBO_X86)
    q5_0->to_float[BUBO_ISA_AVX2] = dequantize_row_q5_0_avx2;
    q5_0->vec_dot[BUBO_ISA_AVX2] = vec_dot_q5_0_q8_0_avx2;
    q5_0->vec_dot_tile[BUBO_ISA_AVX2] = loop_tile_q5_0_q8_0_avx2;
    q5_0->prepack[BUBO_ISA_AVX2] = q5_0_prepack_avx2;
    q5_0->vec_dot_tile_prepacked[BUBO_ISA_AVX2] = q5_0_tile_prepacked_avx2;
    q5_0->prepacked_row[BUBO_ISA_AVX2] = q5_0_prepacked_row_avx2;
    q5_0->to_float[BUBO_ISA_AVX512] = dequantize_row_q5_0_avx512;
    q5_0->vec_dot[BUBO_ISA_AVX512] = vec_dot_q5_0_q8_0_avx512;
    q5_0->vec_dot_tile[BUBO_ISA_AVX512] = tile_q5_0_q8_0_avx512;
    q5_0->prepack[BUBO_ISA_AVX512] = q5_0_prepack_avx512;
    q5_0->vec_dot_tile_prepacked[BUBO_ISA_AVX512] = q5_0_tile_prepacked_avx512;
    q5_0->prepacked_row[BUBO_ISA_AVX512] = q5_0_prepacked_row_avx512;
    q5_1->to_float[BUBO_ISA_AVX2] = dequantize_row_q5_1_avx2;
    q5_1->vec_dot[BUBO_ISA_AVX2] = vec_dot_q5_1_q8_1_avx2;
    q5_1->vec_dot_tile[BUBO_ISA_AVX2] = loop_tile_q5_1_q8_1_avx2;
    q5_1->prepack[BUBO_ISA_AVX2] = q5_1_prepack_avx2;
    q5_1->vec_dot_tile_prepacked[BUBO_ISA_AVX2] = q5_1_tile_prepacked_avx2;
    q5_1->prepacked_row[BUBO_ISA_AVX2] = q5_1_prepacked_row_avx2;
    q5_1->to_float[BUBO_ISA_AVX512] = dequantize_row_q5_1_avx512;
    q5_1->vec_dot[BUBO_ISA_AVX512] = vec_dot_q5_1_q8_1_avx512;
    q5_1->vec_dot_tile[BUBO_ISA_AVX512] = tile_q5_1_q8_1_avx512;
    q5_1->prepack[BUBO_ISA_AVX512] = q5_1_prepack_avx512;
    q5_1->vec_dot_tile_prepacked[BUBO_ISA_AVX512] = q5_1_tile_prepacked_avx512;
    q5_1->prepacked_row[BUBO_ISA_AVX512] = q5_1_prepacked_row_avx512;
#endif
#if defined(BUBO_ARM64)
    q5_0->to_float[BUBO_ISA_NEON] = dequantize_row_q5_0_neon;
    q5_0->vec_dot[BUBO_ISA_NEON] = vec_dot_q5_0_q8_0_neon;
    q5_0->vec_dot_tile[BUBO_ISA_NEON] = loop_tile_q5_0_q8_0_neon;
    q5_1->to_float[BUBO_ISA_NEON] = dequantize_row_q5_1_neon;
    q5_1->vec_dot[BUBO_ISA_NEON] = vec_dot_q5_1_q8_1_neon;
    q5_1->vec_dot_tile[BUBO_ISA_NEON] = loop_tile_q5_1_q8_1_neon;
#endif
}
