/* Q3_K weights: super-blocks of 256 elements in 16 groups of 16; element value
 * d * (scale[g] - 32) * q with q in -4..3 and 6-bit scale. Dot products take Q8_K.
 *
 * Layout, per half h = 0, 1 (128 elements, qs += 32h), j = 0..3, l = 0..31:
 *   element 128h + 32j + l   low 2 bits: (qs[l] >> 2j) & 3;  q = those - 4 unless bit
 *                            4h + j of hmask[l] is set (then q = those).
 * The 16 scales are packed 6 bits each into 12 bytes (unpack_scales_q3_K).
 *
 * The SIMD kernels multiply the unsigned u = q + 4 (0..7) and take the offset out per group:
 * with s = scale - 32, sum(s * q * a) = sum(s * u * a) - 4 * sum_g s[g] * bsum[g]. */
#include "kquants_internal.h"

/* bytes 0-7: low 4 bits of scales 0-7 (low nibble) and 8-15 (high nibble); bytes 8-11: the top
 * 2 bits, scale j at bits 2(j / 4) of byte 8 + j % 4. Out: the stored 0..63 as 16 bytes in words
 * (as kq_unpack_scales_mins, for the same reason); the scale is that minus 32. */
static inline void unpack_scales_q3_K(const uint8_t packed[K_SCALE_SIZE], uint32_t out[4]) {
    uint32_t p[3];
    memcpy(p, packed, K_SCALE_SIZE);
    out[0] = (p[0] & 0x0f0f0f0f) | (((p[2] >> 0) & 0x03030303) << 4);
    out[1] = (p[1] & 0x0f0f0f0f) | (((p[2] >> 2) & 0x03030303) << 4);
    out[2] = ((p[0] >> 4) & 0x0f0f0f0f) | (((p[2] >> 4) & 0x03030303) << 4);
    out[3] = ((p[1] >> 4) & 0x0f0f0f0f) | (((p[2] >> 6) & 0x03030303) << 4);
}

/* ---- scalar reference ------------------------------------------------------------------ */

static void unpack_q3_K(const block_q3_K *restrict x, int8_t q[QK_K]) {
    for (int h = 0; h < 2; h++)
        for (int j = 0; j < 4; j++)
            for (int l = 0; l < 32; l++) {
                const int low = (x->qs[32 * h + l] >> (2 * j)) & 3;
                const int high = (x->hmask[l] >> (4 * h + j)) & 1;
                q[128 * h + 32 * j + l] = (int8_t)(low - (high ? 0 : 4));
            }
}

static void dequantize_row_q3_K_scalar(const void *restrict vx, float *restrict y, int64_t n) {
    const block_q3_K *restrict x = vx;
    for (int64_t i = 0; i < n / QK_K; i++, y += QK_K) {
        const float d = bubo_h2f(x[i].d);
        uint32_t scw[4];
        int8_t q[QK_K];
        unpack_scales_q3_K(x[i].scales, scw);
        const uint8_t *sc = (const uint8_t *)scw;
        unpack_q3_K(&x[i], q);
        for (int g = 0; g < 16; g++) {
            const float dl = d * (sc[g] - 32);
            for (int l = 16 * g; l < 16 * g + 16; l++) y[l] = dl * q[l];
        }
    }
}

static void vec_dot_q3_K_q8_K_scalar(int n, float *restrict s, const void *restrict vx, const void *restrict vy) {
    const block_q3_K *restrict x = vx;
    const block_q8_K *restrict y = vy;
    float sumf = 0;
    for (int i = 0; i < n / QK_K; i++) {
        uint32_t scw[4];
        int8_t q[QK_K];
        unpack_scales_q3_K(x[i].scales, scw);
        const uint8_t *sc = (const uint8_t *)scw;
        unpack_q3_K(&x[i], q);
        int32_t sumi = 0;
        for (int g = 0; g < 16; g++) {
            int32_t dot = 0;
            for (int l = 16 * g; l < 16 * g + 16; l++) dot += q[l] * y[i].qs[l];
            sumi += (sc[g] - 32) * dot;
        }
        sumf += y[i].d * bubo_h2f(x[i].d) * (float)sumi;
    }
    *s = sumf;
}

/* ---- x86-64: AVX2, AVX-512 ------------------------------------------------------------- */

#if defined(BUBO_X86)

/* Elements 128h + 32j .. + 31 as unsigned u = q + 4 (0..7). */
BUBO_TARGET_AVX2
static inline __m256i unpack_run_q3_K_avx2(__m256i qbits, __m256i hbits, int h, int j) {
    const __m256i m2 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
    /* word shifts: the masks keep only bits that came from the same byte */
    const __m256i low = _mm256_and_si256(_mm256_srli_epi16(qbits, 2 * j), m2);
    const __m256i high = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hbits, 4 * h + j), one), 2);
    return _mm256_or_si256(low, high);
}

BUBO_TARGET_AVX2
static void dequantize_row_q3_K_avx2(const void *restrict vx, float *restrict y, int64_t n) {
    const block_q3_K *restrict x = vx;
    const __m256i off = _mm256_set1_epi8(4);
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = _cvtsh_ss(x[i].d);
        uint32_t scw[4];
        unpack_scales_q3_K(x[i].scales, scw);
        const uint8_t *sc = (const uint8_t *)scw;
        const __m256i hbits = _mm256_loadu_si256((const __m256i *)x[i].hmask);
        for (int h = 0; h < 2; h++) {
            const __m256i qbits = _mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * h));
            for (int j = 0; j < 4; j++, y += 32) {
                const __m256i q = _mm256_sub_epi8(unpack_run_q3_K_avx2(qbits, hbits, h, j), off);
                const int g = 8 * h + 2 * j;
                kq_store16_avx2(y, _mm256_castsi256_si128(q), d * (sc[g] - 32), 0.0f);
                kq_store16_avx2(y + 16, _mm256_extracti128_si256(q, 1), d * (sc[g + 1] - 32), 0.0f);
            }
        }
    }
}

BUBO_TARGET_AVX2
static void vec_dot_q3_K_q8_K_avx2(int n, float *restrict s, const void *restrict vx, const void *restrict vy) {
    const block_q3_K *restrict x = vx;
    const block_q8_K *restrict y = vy;
    __m256 acc = _mm256_setzero_ps();
    for (int i = 0; i < n / QK_K; i++) {
        uint32_t scw[4];
        unpack_scales_q3_K(x[i].scales, scw);
        const __m256i sc16 = _mm256_sub_epi16(_mm256_cvtepu8_epi16(kq_words_to_xmm(scw)), _mm256_set1_epi16(32));
        const __m256i bsums = _mm256_loadu_si256((const __m256i *)y[i].bsums);
        const __m256i offset = _mm256_slli_epi32(_mm256_madd_epi16(bsums, sc16), 2);
        const __m256i hbits = _mm256_loadu_si256((const __m256i *)x[i].hmask);
        const int8_t *a = y[i].qs;
        /* the scale words of groups 0-7, then 8-15, in both lanes */
        const __m256i halves[2] = {_mm256_permute2x128_si256(sc16, sc16, 0x00),
                                   _mm256_permute2x128_si256(sc16, sc16, 0x11)};
        __m256i sumi = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            const __m256i qbits = _mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * h));
            for (int j = 0; j < 4; j++, a += 32) {
                const __m256i u = unpack_run_q3_K_avx2(qbits, hbits, h, j);
                sumi = kq_dot32_scaled_avx2(sumi, u, a, kq_group16_scales_avx2(halves[h], j));
            }
        }
        const __m256 dd = _mm256_set1_ps(y[i].d * _cvtsh_ss(x[i].d));
        acc = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(_mm256_sub_epi32(sumi, offset)), acc);
    }
    *s = bubo_hsum_f32x8(acc);
}

/* Elements 64k .. 64k + 63 (k = 0..3) as u = q + 4: the 32 qs bytes of half k / 2 in both
 * 256-bit halves, shifted by 4(k % 2) and 4(k % 2) + 2; plus 4 where hmask bit 2k (low half)
 * or 2k + 1 (high half) is set. hbits holds the 32 hmask bytes in both halves. */
BUBO_TARGET_AVX512
static inline __m512i unpack_run_q3_K_avx512(const uint8_t *qs, __m512i hbits, int k) {
    const long long sh = 4 * (k % 2);
    const __m512i bits = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(qs + 32 * (k / 2))));
    const __m512i shift = _mm512_setr_epi64(sh, sh, sh, sh, sh + 2, sh + 2, sh + 2, sh + 2);
    const __m512i low = _mm512_and_si512(_mm512_srlv_epi64(bits, shift), _mm512_set1_epi8(3));
    const __m512i sel = _mm512_inserti64x4(_mm512_set1_epi8((char)(1 << (2 * k))),
                                           _mm256_set1_epi8((char)(1 << (2 * k + 1))), 1);
    return _mm512_mask_add_epi8(low, _mm512_test_epi8_mask(hbits, sel), low, _mm512_set1_epi8(4));
}

BUBO_TARGET_AVX512
static void dequantize_row_q3_K_avx512(const void *restrict vx, float *restrict y, int64_t n) {
    const block_q3_K *restrict x = vx;
    const __m512i off = _mm512_set1_epi8(4);
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = _cvtsh_ss(x[i].d);
        uint32_t scw[4];
        unpack_scales_q3_K(x[i].scales, scw);
        const uint8_t *sc = (const uint8_t *)scw;
        const __m512i hbits = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)x[i].hmask));
        for (int k = 0; k < 4; k++, y += 64) {
            const __m512i q = _mm512_sub_epi8(unpack_run_q3_K_avx512(x[i].qs, hbits, k), off);
            kq_store16_avx512(y + 0, _mm512_extracti32x4_epi32(q, 0), d * (sc[4 * k + 0] - 32), 0.0f);
            kq_store16_avx512(y + 16, _mm512_extracti32x4_epi32(q, 1), d * (sc[4 * k + 1] - 32), 0.0f);
            kq_store16_avx512(y + 32, _mm512_extracti32x4_epi32(q, 2), d * (sc[4 * k + 2] - 32), 0.0f);
            kq_store16_avx512(y + 48, _mm512_extracti32x4_epi32(q, 3), d * (sc[4 * k + 3] - 32), 0.0f);
        }
    }
}

BUBO_TARGET_AVX512
static void vec_dot_q3_K_q8_K_avx512(int n, float *restrict s, const void *restrict vx, const void *restrict vy) {
    const block_q3_K *restrict x = vx;
    const block_q8_K *restrict y = vy;
    __m512 acc = _mm512_setzero_ps();
    for (int i = 0; i < n / QK_K; i++) {
        uint32_t scw[4];
        unpack_scales_q3_K(x[i].scales, scw);
        const __m256i sc16 = _mm256_sub_epi16(_mm256_cvtepu8_epi16(kq_words_to_xmm(scw)), _mm256_set1_epi16(32));
        const __m512i words = _mm512_castsi256_si512(sc16);
        const __m256i bsums = _mm256_loadu_si256((const __m256i *)y[i].bsums);
        const __m256i offset = _mm256_slli_epi32(_mm256_madd_epi16(bsums, sc16), 2);
        const __m512i hbits = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)x[i].hmask));
        __m512i sumi = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_zextsi256_si512(offset));
        for (int k = 0; k < 4; k++)
            sumi = kq_dot64_scaled_avx512(sumi, unpack_run_q3_K_avx512(x[i].qs, hbits, k), y[i].qs + 64 * k,
                                          kq_group16_scales_avx512(words, k));
        const __m512 dd = _mm512_set1_ps(y[i].d * _cvtsh_ss(x[i].d));
        acc = _mm512_fmadd_ps(dd, _mm512_cvtepi32_ps(sumi), acc);
    }
    *s = _mm512_reduce_add_ps(acc);
}

#endif /* BUBO_X86 */

/* ---- arm64: NEON ----------------------------------------------------------------------- */

#if defined(BUBO_ARM64)

/* Elements 128h + 32j + 16t .. + 15 (t = 0, 1) as signed q: q[2j + t]. */
static inline void unpack_half_q3_K_neon(const uint8_t *qs, const uint8_t *hmask, int h, int8x16_t q[8]) {
    const uint8x16_t m2 = vdupq_n_u8(3), four = vdupq_n_u8(4);
    for (int t = 0; t < 2; t++) {
        const uint8x16_t b = vld1q_u8(qs + 16 * t), hb = vld1q_u8(hmask + 16 * t);
        for (int j = 0; j < 4; j++) {
            /* low 2 bits, minus 4 where the high bit is clear: (low + 4 * bit) - 4 */
            const uint8x16_t low = vandq_u8(vshlq_u8(b, vdupq_n_s8((int8_t)(-2 * j))), m2);
            const uint8x16_t hi = vandq_u8(vtstq_u8(hb, vdupq_n_u8((uint8_t)(1 << (4 * h + j)))), four);
            q[2 * j + t] = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(low, hi)), vreinterpretq_s8_u8(four));
        }
    }
}

static void dequantize_row_q3_K_neon(const void *restrict vx, float *restrict y, int64_t n) {
    const block_q3_K *restrict x = vx;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = bubo_h2f(x[i].d);
        uint32_t scw[4];
        unpack_scales_q3_K(x[i].scales, scw);
        const uint8_t *sc = (const uint8_t *)scw;
        for (int h = 0; h < 2; h++) {
            int8x16_t q[8];
            unpack_half_q3_K_neon(x[i].qs + 32 * h, x[i].hmask, h, q);
            for (int g = 0; g < 8; g++, y += 16) kq_store16_neon(y, q[g], d * (sc[8 * h + g] - 32), 0.0f);
        }
    }
}

static void vec_dot_q3_K_q8_K_neon(int n, float *restrict s, const void *restrict vx, const void *restrict vy) {
    const block_q3_K *restrict x = vx;
    const block_q8_K *restrict y = vy;
    float sumf = 0;
    for (int i = 0; i < n / QK_K; i++) {
        uint32_t scw[4];
        unpack_scales_q3_K(x[i].scales, scw);
        const uint8_t *sc = (const uint8_t *)scw;
        const int8_t *a = y[i].qs;
        int32x4_t sumi = vdupq_n_s32(0);
        for (int h = 0; h < 2; h++) {
            int8x16_t q[8];
            unpack_half_q3_K_neon(x[i].qs + 32 * h, x[i].hmask, h, q);
            for (int g = 0; g < 8; g++, a += 16)
                sumi = vmlaq_n_s32(sumi, kq_dot16_neon(vdupq_n_s32(0), q[g], vld1q_s8(a)), sc[8 * h + g] - 32);
        }
        sumf += y[i].d * bubo_h2f(x[i].d) * (float)vaddvq_s32(sumi);
    }
    *s = sumf;
}

#endif /* BUBO_ARM64 */

/* vec_dot looped over a tile, where no SIMD tile exists */
BUBO_LOOP_TILE(loop_tile_q3_K_q8_K_scalar, vec_dot_q3_K_q8_K_scalar)
#if defined(BUBO_X86)
BUBO_LOOP_TILE(loop_tile_q3_K_q8_K_avx2, vec_dot_q3_K_q8_K_avx2)
BUBO_LOOP_TILE(loop_tile_q3_K_q8_K_avx512, vec_dot_q3_K_q8_K_avx512)
#endif
#if defined(BUBO_ARM64)
BUBO_LOOP_TILE(loop_tile_q3_K_q8_K_neon, vec_dot_q3_K_q8_K_neon)
#endif

void bubo_register_q3_k(bubo_type_traits *table) {
    bubo_type_traits *t = &table[BUBO_TYPE_Q3_K];
    t->supported = 1;
    t->vec_dot_type = BUBO_TYPE_Q8_K;
    t->to_float[BUBO_ISA_SCALAR] = dequantize_row_q3_K_scalar;
    t->vec_dot[BUBO_ISA_SCALAR] = vec_dot_q3_K_q8_K_scalar;
    t->vec_dot_tile[BUBO_ISA_SCALAR] = loop_tile_q3_K_q8_K_scalar;
#if defined(BUBO_X86)
    t->to_float[BUBO_ISA_AVX2] = dequantize_row_q3_K_avx2;
    t->vec_dot[BUBO_ISA_AVX2] = vec_dot_q3_K_q8_K_avx2;
    t->vec_dot_tile[BUBO_ISA_AVX2] = loop_tile_q3_K_q8_K_avx2;
    t->to_float[BUBO_ISA_AVX512] = dequantize_row_q3_K_avx512;
    t->vec_dot[BUBO_ISA_AVX512] = vec_dot_q3_K_q8_K_avx512;
    t->vec_dot_tile[BUBO_ISA_AVX512] = loop_tile_q3_K_q8_K_avx512;
#endif
#if defined(BUBO_ARM64)
    t->to_float[BUBO_ISA_NEON] = dequantize_row_q3_K_neon;
    t->vec_dot[BUBO_ISA_NEON] = vec_dot_q3_K_q8_K_neon;
    t->vec_dot_tile[BUBO_ISA_NEON] = loop_tile_q3_K_q8_K_neon;
#endif
}
