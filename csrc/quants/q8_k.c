/* Q8_K: the activations every k-quant dot product takes. A block is 256 int8 quants with one
 * f32 scale, plus the sum of each 16 quants (bsums), from which a weight type adds in its
 * per-group minimum or offset without touching the elements again.
 *
 * d = amax / 127 and q = round(x * 127 / amax), rounded to nearest even: that is the vector
 * units' native rounding, so every variant here produces the same bytes as the scalar one.
 * |q| <= 127 (x * (127/amax) is at most 127 times (1 + 2^-23), far from rounding up to 128),
 * never -128: the x86 dot products multiply unsigned weight bytes with these (vpmaddubsw) and
 * count on |q| <= 127 to stay clear of int16 saturation. An all-zero block gets d = 0, q = 0. */
#include "kquants_internal.h"

/* A block whose largest magnitude is below this is stored as zeros: 127 / amax would overflow
 * to inf (from about 3.7e-37 down), and values that small are zero to any model. */
#define Q8_K_AMAX_MIN 1e-36f

/* ---- scalar reference ------------------------------------------------------------------ */

static void quantize_row_q8_K_scalar(const float *restrict x, void *restrict vy, int64_t n) {
    block_q8_K *restrict y = vy;
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        float amax = 0;
        for (int j = 0; j < QK_K; j++) {
            const float ax = fabsf(x[j]);
            if (ax > amax) amax = ax;
        }
        if (!(amax >= Q8_K_AMAX_MIN)) {
            memset(&y[i], 0, sizeof(y[i]));
            continue;
        }
        const float iscale = 127.0f / amax;
        y[i].d = amax / 127.0f;
        for (int g = 0; g < QK_K / 16; g++) {
            int sum = 0;
            for (int j = 16 * g; j < 16 * g + 16; j++) {
                const int q = (int)nearbyintf(x[j] * iscale);
                y[i].qs[j] = (int8_t)q;
                sum += q;
            }
            y[i].bsums[g] = (int16_t)sum;
        }
    }
}

static void dequantize_row_q8_K_scalar(const void *restrict vx, float *restrict y, int64_t n) {
    const block_q8_K *restrict x = vx;
    for (int64_t i = 0; i < n / QK_K; i++)
        for (int j = 0; j < QK_K; j++) *y++ = x[i].d * x[i].qs[j];
}

/* ---- x86-64: AVX2, AVX-512 ------------------------------------------------------------- */

#if defined(BUBO_X86)

BUBO_TARGET_AVX2
static void quantize_row_q8_K_avx2(const float *restrict x, void *restrict vy, int64_t n) {
    block_q8_K *restrict y = vy;
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    /* vpackssdw / vpacksswb interleave the 128-bit lanes; this puts the dwords back in order */
    const __m256i unshuffle = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        __m256 vmax = _mm256_setzero_ps();
        for (int j = 0; j < QK_K; j += 8) vmax = _mm256_max_ps(vmax, _mm256_and_ps(_mm256_loadu_ps(x + j), abs_mask));
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        const float amax = _mm_cvtss_f32(m4);
        if (!(amax >= Q8_K_AMAX_MIN)) {
            memset(&y[i], 0, sizeof(y[i]));
            continue;
        }
        const float iscale = 127.0f / amax;
        y[i].d = amax / 127.0f;
        const __m256 vs = _mm256_set1_ps(iscale);
        for (int j = 0; j < QK_K; j += 32) { /* two groups of 16 */
            const __m256i q0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + j + 0), vs));
            const __m256i q1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + j + 8), vs));
            const __m256i q2 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + j + 16), vs));
            const __m256i q3 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + j + 24), vs));
            y[i].bsums[j / 16 + 0] = (int16_t)bubo_hsum_i32x8(_mm256_add_epi32(q0, q1));
            y[i].bsums[j / 16 + 1] = (int16_t)bubo_hsum_i32x8(_mm256_add_epi32(q2, q3));
            const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(q0, q1), _mm256_packs_epi32(q2, q3));
            _mm256_storeu_si256((__m256i *)(y[i].qs + j), _mm256_permutevar8x32_epi32(bytes, unshuffle));
        }
    }
}

BUBO_TARGET_AVX512
static void quantize_row_q8_K_avx512(const float *restrict x, void *restrict vy, int64_t n) {
    block_q8_K *restrict y = vy;
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        __m512 vmax = _mm512_setzero_ps();
        for (int j = 0; j < QK_K; j += 16) vmax = _mm512_max_ps(vmax, _mm512_abs_ps(_mm512_loadu_ps(x + j)));
        const float amax = _mm512_reduce_max_ps(vmax);
        if (!(amax >= Q8_K_AMAX_MIN)) {
            memset(&y[i], 0, sizeof(y[i]));
            continue;
        }
        const float iscale = 127.0f / amax;
        y[i].d = amax / 127.0f;
        const __m512 vs = _mm512_set1_ps(iscale);
        for (int g = 0; g < QK_K / 16; g++) { /* one register is one group of 16 */
            const __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + 16 * g), vs));
            _mm_storeu_si128((__m128i *)(y[i].qs + 16 * g), _mm512_cvtepi32_epi8(q));
            y[i].bsums[g] = (int16_t)_mm512_reduce_add_epi32(q);
        }
    }
}

#endif /* BUBO_X86 */

/* ---- arm64: NEON ----------------------------------------------------------------------- */

#if defined(BUBO_ARM64)

static void quantize_row_q8_K_neon(const float *restrict x, void *restrict vy, int64_t n) {
    block_q8_K *restrict y = vy;
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        float32x4_t vmax = vdupq_n_f32(0);
        for (int j = 0; j < QK_K; j += 4) vmax = vmaxq_f32(vmax, vabsq_f32(vld1q_f32(x + j)));
        const float amax = vmaxvq_f32(vmax);
        if (!(amax >= Q8_K_AMAX_MIN)) {
            memset(&y[i], 0, sizeof(y[i]));
            continue;
        }
        const float iscale = 127.0f / amax;
        y[i].d = amax / 127.0f;
        for (int g = 0; g < QK_K / 16; g++) {
            const float *xg = x + 16 * g;
            /* vcvtnq: round to nearest, ties to even, as the scalar reference */
            const int32x4_t q0 = vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(xg + 0), iscale));
            const int32x4_t q1 = vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(xg + 4), iscale));
            const int32x4_t q2 = vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(xg + 8), iscale));
            const int32x4_t q3 = vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(xg + 12), iscale));
            y[i].bsums[g] = (int16_t)vaddvq_s32(vaddq_s32(vaddq_s32(q0, q1), vaddq_s32(q2, q3)));
            const int16x8_t h0 = vcombine_s16(vmovn_s32(q0), vmovn_s32(q1));
            const int16x8_t h1 = vcombine_s16(vmovn_s32(q2), vmovn_s32(q3));
            vst1q_s8(y[i].qs + 16 * g, vcombine_s8(vmovn_s16(h0), vmovn_s16(h1)));
        }
    }
}

#endif /* BUBO_ARM64 */

void bubo_register_q8_k(bubo_type_traits *table) {
    bubo_type_traits *t = &table[BUBO_TYPE_Q8_K];
    t->supported = 0; /* activations only: no model tensor is Q8_K */
    t->to_float[BUBO_ISA_SCALAR] = dequantize_row_q8_K_scalar;
    t->from_float[BUBO_ISA_SCALAR] = quantize_row_q8_K_scalar;
#if defined(BUBO_X86)
    t->from_float[BUBO_ISA_AVX2] = quantize_row_q8_K_avx2;
    t->from_float[BUBO_ISA_AVX512] = quantize_row_q8_K_avx512;
#endif
#if defined(BUBO_ARM64)
    t->from_float[BUBO_ISA_NEON] = quantize_row_q8_K_neon;
#endif
}
