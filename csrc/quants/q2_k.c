/* Q2_K weights: super-blocks of 256 elements in 16 groups of 16; element value
 * d * scale[g] * q - dmin * min[g] with 2-bit q and 4-bit scale and min (scales[g]: scale in the
 * low nibble, min in the high one). Dot products take Q8_K.
 *
 * Layout, per half h = 0, 1 (128 elements, qs += 32h), j = 0..3, l = 0..31:
 *   element 128h + 32j + l = (qs[l] >> 2j) & 3
 *
 * dot = sum_i dy * (d * sum_g scale[g] * sum(q * a over g) - dmin * sum_g min[g] * bsum[g]). */
#include "kquants_internal.h"

/* ---- scalar reference ------------------------------------------------------------------ */

static void unpack_q2_K(const block_q2_K *restrict x, uint8_t q[QK_K]) {
    for (int h = 0; h < 2; h++)
        for (int j = 0; j < 4; j++)
            for (int l = 0; l < 32; l++) q[128 * h + 32 * j + l] = (x->qs[32 * h + l] >> (2 * j)) & 3;
}

static void dequantize_row_q2_K_scalar(const void *restrict vx, float *restrict y, int64_t n) {
    const block_q2_K *restrict x = vx;
    for (int64_t i = 0; i < n / QK_K; i++, y += QK_K) {
        const float d = bubo_h2f(x[i].d), dmin = bubo_h2f(x[i].dmin);
        uint8_t q[QK_K];
        unpack_q2_K(&x[i], q);
        for (int g = 0; g < 16; g++) {
            const float dl = d * (x[i].scales[g] & 0xF), ml = dmin * (x[i].scales[g] >> 4);
            for (int l = 16 * g; l < 16 * g + 16; l++) y[l] = dl * q[l] - ml;
        }
    }
}

static void vec_dot_q2_K_q8_K_scalar(int n, float *restrict s, const void *restrict vx, const void *restrict vy) {
    const block_q2_K *restrict x = vx;
    const block_q8_K *restrict y = vy;
    float sumf = 0;
    for (int i = 0; i < n / QK_K; i++) {
        uint8_t q[QK_K];
        unpack_q2_K(&x[i], q);
        int32_t sumi = 0, summ = 0;
        for (int g = 0; g < 16; g++) {
            int32_t dot = 0;
            for (int l = 16 * g; l < 16 * g + 16; l++) dot += q[l] * y[i].qs[l];
            sumi += (x[i].scales[g] & 0xF) * dot;
            summ += (x[i].scales[g] >> 4) * y[i].bsums[g];
        }
        sumf += y[i].d * bubo_h2f(x[i].d) * (float)sumi - y[i].d * bubo_h2f(x[i].dmin) * (float)summ;
    }
    *s = sumf;
}

/* ---- x86-64: AVX2, AVX-512 ------------------------------------------------------------- */

#if defined(BUBO_X86)

/* The 16 scales (low nibbles) and 16 mins (high nibbles) as words. */
BUBO_TARGET_AVX2
static inline void scales_mins_q2_K_avx2(const uint8_t *packed, __m256i *scales, __m256i *mins) {
    const __m128i b = _mm_loadu_si128((const __m128i *)packed), m4 = _mm_set1_epi8(0x0F);
    *scales = _mm256_cvtepu8_epi16(_mm_and_si128(b, m4));
    *mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(b, 4), m4));
}

BUBO_TARGET_AVX2
static void dequantize_row_q2_K_avx2(const void *restrict vx, float *restrict y, int64_t n) {
    const block_q2_K *restrict x = vx;
    const __m256i m2 = _mm256_set1_epi8(3);
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = _cvtsh_ss(x[i].d), dmin = _cvtsh_ss(x[i].dmin);
        const uint8_t *sc = x[i].scales;
        for (int h = 0; h < 2; h++) {
            const __m256i qbits = _mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * h));
            for (int j = 0; j < 4; j++, y += 32, sc += 2) {
                const __m256i q = _mm256_and_si256(_mm256_srli_epi16(qbits, 2 * j), m2);
                kq_store16_avx2(y, _mm256_castsi256_si128(q), d * (sc[0] & 0xF), dmin * (sc[0] >> 4));
                kq_store16_avx2(y + 16, _mm256_extracti128_si256(q, 1), d * (sc[1] & 0xF), dmin * (sc[1] >> 4));
            }
        }
    }
}

BUBO_TARGET_AVX2
static void vec_dot_q2_K_q8_K_avx2(int n, float *restrict s, const void *restrict vx, const void *restrict vy) {
    const block_q2_K *restrict x = vx;
    const block_q8_K *restrict y = vy;
    const __m256i m2 = _mm256_set1_epi8(3);
    __m256 acc = _mm256_setzero_ps(), acc_m = _mm256_setzero_ps();
    for (int i = 0; i < n / QK_K; i++) {
        __m256i sc16, min16;
        scales_mins_q2_K_avx2(x[i].scales, &sc16, &min16);
        const __m256i summ = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y[i].bsums), min16);
        const int8_t *a = y[i].qs;
        /* the scale words of groups 0-7, then 8-15, in both lanes */
        const __m256i halves[2] = {_mm256_permute2x128_si256(sc16, sc16, 0x00),
                                   _mm256_permute2x128_si256(sc16, sc16, 0x11)};
        __m256i sumi = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            const __m256i qbits = _mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * h));
            for (int j = 0; j < 4; j++, a += 32) {
                const __m256i q = _mm256_and_si256(_mm256_srli_epi16(qbits, 2 * j), m2);
                sumi = kq_dot32_scaled_avx2(sumi, q, a, kq_group16_scales_avx2(halves[h], j));
            }
        }
        const float dy = y[i].d;
        acc = _mm256_fmadd_ps(_mm256_set1_ps(dy * _cvtsh_ss(x[i].d)), _mm256_cvtepi32_ps(sumi), acc);
        acc_m = _mm256_fmadd_ps(_mm256_set1_ps(dy * _cvtsh_ss(x[i].dmin)), _mm256_cvtepi32_ps(summ), acc_m);
    }
    *s = bubo_hsum_f32x8(_mm256_sub_ps(acc, acc_m));
}

/* Elements 64k .. 64k + 63 (k = 0..3): the 32 qs bytes of half k / 2 in both 256-bit halves,
 * shifted by 4(k % 2) and 4(k % 2) + 2. */
BUBO_TARGET_AVX512
static inline __m512i unpack_run_q2_K_avx512(const uint8_t *qs, int k) {
    const long long sh = 4 * (k % 2);
    const __m512i bits = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(qs + 32 * (k / 2))));
    const __m512i shift = _mm512_setr_epi64(sh, sh, sh, sh, sh + 2, sh + 2, sh + 2, sh + 2);
    return _mm512_and_si512(_mm512_srlv_epi64(bits, shift), _mm512_set1_epi8(3));
}

BUBO_TARGET_AVX512
static void dequantize_row_q2_K_avx512(const void *restrict vx, float *restrict y, int64_t n) {
    const block_q2_K *restrict x = vx;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = _cvtsh_ss(x[i].d), dmin = _cvtsh_ss(x[i].dmin);
        for (int k = 0; k < 4; k++, y += 64) {
            const __m512i q = unpack_run_q2_K_avx512(x[i].qs, k);
            const uint8_t *sc = x[i].scales + 4 * k;
            kq_store16_avx512(y + 0, _mm512_extracti32x4_epi32(q, 0), d * (sc[0] & 0xF), dmin * (sc[0] >> 4));
            kq_store16_avx512(y + 16, _mm512_extracti32x4_epi32(q, 1), d * (sc[1] & 0xF), dmin * (sc[1] >> 4));
            kq_store16_avx512(y + 32, _mm512_extracti32x4_epi32(q, 2), d * (sc[2] & 0xF), dmin * (sc[2] >> 4));
            kq_store16_avx512(y + 48, _mm512_extracti32x4_epi32(q, 3), d * (sc[3] & 0xF), dmin * (sc[3] >> 4));
        }
    }
}

BUBO_TARGET_AVX512
static void vec_dot_q2_K_q8_K_avx512(int n, float *restrict s, const void *restrict vx, const void *restrict vy) {
    const block_q2_K *restrict x = vx;
    const block_q8_K *restrict y = vy;
    __m512 acc = _mm512_setzero_ps();
    __m256 acc_m = _mm256_setzero_ps();
    for (int i = 0; i < n / QK_K; i++) {
        __m256i sc16, min16;
        scales_mins_q2_K_avx2(x[i].scales, &sc16, &min16);
        const __m512i words = _mm512_castsi256_si512(sc16);
        const __m256i summ = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y[i].bsums), min16);
        __m512i sumi = _mm512_setzero_si512();
        for (int k = 0; k < 4; k++)
            sumi = kq_dot64_scaled_avx512(sumi, unpack_run_q2_K_avx512(x[i].qs, k), y[i].qs + 64 * k,
                                          kq_group16_scales_avx512(words, k));
        const float dy = y[i].d;
        acc = _mm512_fmadd_ps(_mm512_set1_ps(dy * _cvtsh_ss(x[i].d)), _mm512_cvtepi32_ps(sumi), acc);
        acc_m = _mm256_fmadd_ps(_mm256_set1_ps(dy * _cvtsh_ss(x[i].dmin)), _mm256_cvtepi32_ps(summ), acc_m);
    }
    *s = _mm512_reduce_add_ps(acc) - bubo_hsum_f32x8(acc_m);
}

#endif /* BUBO_X86 */

/* ---- arm64: NEON ----------------------------------------------------------------------- */

#if defined(BUBO_ARM64)

/* Elements 128h + 32j + 16t .. + 15 (t = 0, 1) as q: q[2j + t]. */
static inline void unpack_half_q2_K_neon(const uint8_t *qs, int8x16_t q[8]) {
    const uint8x16_t m2 = vdupq_n_u8(3);
    for (int t = 0; t < 2; t++) {
        const uint8x16_t b = vld1q_u8(qs + 16 * t);
        q[0 + t] = vreinterpretq_s8_u8(vandq_u8(b, m2));
        q[2 + t] = vreinterpretq_s8_u8(vandq_u8(vshrq_n_u8(b, 2), m2));
        q[4 + t] = vreinterpretq_s8_u8(vandq_u8(vshrq_n_u8(b, 4), m2));
        q[6 + t] = vreinterpretq_s8_u8(vshrq_n_u8(b, 6));
    }
}

static void dequantize_row_q2_K_neon(const void *restrict vx, float *restrict y, int64_t n) {
    const block_q2_K *restrict x = vx;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = bubo_h2f(x[i].d), dmin = bubo_h2f(x[i].dmin);
        const uint8_t *sc = x[i].scales;
        for (int h = 0; h < 2; h++) {
            int8x16_t q[8];
            unpack_half_q2_K_neon(x[i].qs + 32 * h, q);
            for (int g = 0; g < 8; g++, y += 16, sc++) kq_store16_neon(y, q[g], d * (*sc & 0xF), dmin * (*sc >> 4));
        }
    }
}

static void vec_dot_q2_K_q8_K_neon(int n, float *restrict s, const void *restrict vx, const void *restrict vy) {
    const block_q2_K *restrict x = vx;
    const block_q8_K *restrict y = vy;
    float sumf = 0;
    for (int i = 0; i < n / QK_K; i++) {
        const uint8x16_t sc = vld1q_u8(x[i].scales);
        const int16x8_t mins_lo = vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(vshrq_n_u8(sc, 4))));
        const int16x8_t mins_hi = vreinterpretq_s16_u16(vmovl_high_u8(vshrq_n_u8(sc, 4)));
        const int16x8_t b0 = vld1q_s16(y[i].bsums), b1 = vld1q_s16(y[i].bsums + 8);
        int32x4_t pm = vmull_s16(vget_low_s16(b0), vget_low_s16(mins_lo));
        pm = vmlal_high_s16(pm, b0, mins_lo);
        pm = vmlal_s16(pm, vget_low_s16(b1), vget_low_s16(mins_hi));
        pm = vmlal_high_s16(pm, b1, mins_hi);
        const int32_t summ = vaddvq_s32(pm);

        const int8_t *a = y[i].qs;
        int32x4_t sumi = vdupq_n_s32(0);
        for (int h = 0; h < 2; h++) {
            int8x16_t q[8];
            unpack_half_q2_K_neon(x[i].qs + 32 * h, q);
            for (int g = 0; g < 8; g++, a += 16)
                sumi = vmlaq_n_s32(sumi, kq_dot16_neon(vdupq_n_s32(0), q[g], vld1q_s8(a)),
                                   x[i].scales[8 * h + g] & 0xF);
        }
        const float dy = y[i].d;
        sumf += dy * bubo_h2f(x[i].d) * (float)vaddvq_s32(sumi) - dy * bubo_h2f(x[i].dmin) * (float)summ;
    }
    *s = sumf;
}

#endif /* BUBO_ARM64 */

/* vec_dot looped over a tile, where no SIMD tile exists */
BUBO_LOOP_TILE(loop_tile_q2_K_q8_K_scalar, vec_dot_q2_K_q8_K_scalar)
#if defined(BUBO_X86)
BUBO_LOOP_TILE(loop_tile_q2_K_q8_K_avx2, vec_dot_q2_K_q8_K_avx2)
BUBO_LOOP_TILE(loop_tile_q2_K_q8_K_avx512, vec_dot_q2_K_q8_K_avx512)
#endif
#if defined(BUBO_ARM64)
BUBO_LOOP_TILE(loop_tile_q2_K_q8_K_neon, vec_dot_q2_K_q8_K_neon)
#endif

void bubo_register_q2_k(bubo_type_traits *table) {
    bubo_type_traits *t = &table[BUBO_TYPE_Q2_K];
    t->supported = 1;
    t->vec_dot_type = BUBO_TYPE_Q8_K;
    t->to_float[BUBO_ISA_SCALAR] = dequantize_row_q2_K_scalar;
    t->vec_dot[BUBO_ISA_SCALAR] = vec_dot_q2_K_q8_K_scalar;
    t->vec_dot_tile[BUBO_ISA_SCALAR] = loop_tile_q2_K_q8_K_scalar;
#if defined(BUBO_X86)
    t->to_float[BUBO_ISA_AVX2] = dequantize_row_q2_K_avx2;
    t->vec_dot[BUBO_ISA_AVX2] = vec_dot_q2_K_q8_K_avx2;
    t->vec_dot_tile[BUBO_ISA_AVX2] = loop_tile_q2_K_q8_K_avx2;
    t->to_float[BUBO_ISA_AVX512] = dequantize_row_q2_K_avx512;
    t->vec_dot[BUBO_ISA_AVX512] = vec_dot_q2_K_q8_K_avx512;
    t->vec_dot_tile[BUBO_ISA_AVX512] = loop_tile_q2_K_q8_K_avx512;
#endif
#if defined(BUBO_ARM64)
    t->to_float[BUBO_ISA_NEON] = dequantize_row_q2_K_neon;
    t->vec_dot[BUBO_ISA_NEON] = vec_dot_q2_K_q8_K_neon;
    t->vec_dot_tile[BUBO_ISA_NEON] = loop_tile_q2_K_q8_K_neon;
#endif
}
