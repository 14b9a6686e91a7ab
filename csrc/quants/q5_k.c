/* Q5_K weights: as Q4_K (8 groups of 32, value d * scale[g] * q - dmin * min[g], the same
 * packed 6-bit scales and mins) with a 5th bit: q is 0..31. Dot products take Q8_K.
 *
 * Layout: qs[32c + l] holds the low 4 bits of element 64c + l (low nibble) and of element
 * 64c + 32 + l (high nibble), c = 0..3, l = 0..31; the 5th bit of element 32g + l is bit g of
 * qh[l]. */
#include "kquants_internal.h"

/* ---- scalar reference ------------------------------------------------------------------ */

static void unpack_q5_K(const block_q5_K *restrict x, uint8_t q[QK_K]) {
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            q[64 * c + l] = (uint8_t)((x->qs[32 * c + l] & 0x0F) | (((x->qh[l] >> (2 * c)) & 1) << 4));
            q[64 * c + 32 + l] = (uint8_t)((x->qs[32 * c + l] >> 4) | (((x->qh[l] >> (2 * c + 1)) & 1) << 4));
        }
}

static void dequantize_row_q5_K_scalar(const void *restrict vx, float *restrict y, int64_t n) {
    const block_q5_K *restrict x = vx;
    uint8_t q[QK_K];
    for (int64_t i = 0; i < n / QK_K; i++, y += QK_K) {
        unpack_q5_K(&x[i], q);
        kq_dequant_scale_min_block(x[i].scales, bubo_h2f(x[i].d), bubo_h2f(x[i].dmin), q, y);
    }
}

static void vec_dot_q5_K_q8_K_scalar(int n, float *restrict s, const void *restrict vx, const void *restrict vy) {
    const block_q5_K *restrict x = vx;
    const block_q8_K *restrict y = vy;
    uint8_t q[QK_K];
    float sumf = 0;
    for (int i = 0; i < n / QK_K; i++) {
        unpack_q5_K(&x[i], q);
        sumf += kq_dot_scale_min_block(x[i].scales, x[i].d, x[i].dmin, q, &y[i]);
    }
    *s = sumf;
}

/* ---- x86-64: AVX2, AVX-512 ------------------------------------------------------------- */

#if defined(BUBO_X86)

/* Groups 2c and 2c + 1 as bytes 0..31: low nibbles (or high ones) plus bit (2c or 2c+1) of qh. */
BUBO_TARGET_AVX2
static inline void unpack_pair_q5_K_avx2(const uint8_t *qs, __m256i hb, int c, __m256i q[2]) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
    const __m256i bits = _mm256_loadu_si256((const __m256i *)qs);
    /* the word shifts leave bit 0 of each byte from that same byte; the mask keeps only it */
    const __m256i h0 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2 * c), one), 4);
    const __m256i h1 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2 * c + 1), one), 4);
    q[0] = _mm256_or_si256(_mm256_and_si256(bits, m4), h0);
    q[1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(bits, 4), m4), h1);
}

BUBO_TARGET_AVX2
static void dequantize_row_q5_K_avx2(const void *restrict vx, float *restrict y, int64_t n) {
    const block_q5_K *restrict x = vx;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = _cvtsh_ss(x[i].d), dmin = _cvtsh_ss(x[i].dmin);
        uint32_t smw[4];
        kq_unpack_scales_mins(x[i].scales, smw);
        const uint8_t *sm = (const uint8_t *)smw; /* scales | mins */
        const __m256i hb = _mm256_loadu_si256((const __m256i *)x[i].qh);
        for (int c = 0; c < 4; c++) {
            __m256i q[2];
            unpack_pair_q5_K_avx2(x[i].qs + 32 * c, hb, c, q);
            for (int k = 0; k < 2; k++, y += 32) {
                const float dl = d * sm[2 * c + k], ml = dmin * sm[8 + 2 * c + k];
                kq_store16_avx2(y, _mm256_castsi256_si128(q[k]), dl, ml);
                kq_store16_avx2(y + 16, _mm256_extracti128_si256(q[k], 1), dl, ml);
            }
        }
    }
}

BUBO_TARGET_AVX2
static void vec_dot_q5_K_q8_K_avx2(int n, float *restrict s, const void *restrict vx, const void *restrict vy) {
    const block_q5_K *restrict x = vx;
    const block_q8_K *restrict y = vy;
    __m256 acc = _mm256_setzero_ps(), acc_m = _mm256_setzero_ps();
    for (int i = 0; i < n / QK_K; i++) {
        uint32_t smw[4];
        kq_unpack_scales_mins(x[i].scales, smw);
        const __m256i sm16 = _mm256_cvtepu8_epi16(kq_words_to_xmm(smw));
        const __m256i scales = _mm256_permute2x128_si256(sm16, sm16, 0x00);
        const __m256i summ = kq_mins_dot_bsums_avx2(sm16, y[i].bsums);

        const __m256i hb = _mm256_loadu_si256((const __m256i *)x[i].qh);
        const int8_t *a = y[i].qs;
        __m256i sumi = _mm256_setzero_si256();
        for (int c = 0; c < 4; c++, a += 64) {
            __m256i q[2];
            unpack_pair_q5_K_avx2(x[i].qs + 32 * c, hb, c, q);
            const __m256i s0 = _mm256_shuffle_epi8(scales, kq_splat_word_idx(2 * c));
            const __m256i s1 = _mm256_shuffle_epi8(scales, kq_splat_word_idx(2 * c + 1));
            sumi = kq_dot32_scaled_avx2(sumi, q[0], a, s0);
            sumi = kq_dot32_scaled_avx2(sumi, q[1], a + 32, s1);
        }
        const float dy = y[i].d;
        acc = _mm256_fmadd_ps(_mm256_set1_ps(dy * _cvtsh_ss(x[i].d)), _mm256_cvtepi32_ps(sumi), acc);
        acc_m = _mm256_fmadd_ps(_mm256_set1_ps(dy * _cvtsh_ss(x[i].dmin)), _mm256_cvtepi32_ps(summ), acc_m);
    }
    *s = bubo_hsum_f32x8(_mm256_sub_ps(acc, acc_m));
}

/* Elements 64c .. 64c + 63 (groups 2c, 2c + 1) as bytes: the 32 qs bytes in both halves
 * shifted 0 and 4, plus 16 where the qh bit (2c in the low half, 2c + 1 in the high) is set;
 * hb holds the 32 qh bytes in both halves. */
BUBO_TARGET_AVX512
static inline __m512i unpack_pair_q5_K_avx512(const uint8_t *qs, __m512i hb, int c) {
    const __m512i bits = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)qs));
    const __m512i q4 = _mm512_and_si512(_mm512_srlv_epi64(bits, _mm512_setr_epi64(0, 0, 0, 0, 4, 4, 4, 4)),
                                        _mm512_set1_epi8(0x0F));
    const __m512i sel = _mm512_inserti64x4(_mm512_set1_epi8((char)(1 << (2 * c))),
                                           _mm256_set1_epi8((char)(1 << (2 * c + 1))), 1);
    return _mm512_mask_add_epi8(q4, _mm512_test_epi8_mask(hb, sel), q4, _mm512_set1_epi8(16));
}

BUBO_TARGET_AVX512
static void dequantize_row_q5_K_avx512(const void *restrict vx, float *restrict y, int64_t n) {
    const block_q5_K *restrict x = vx;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = _cvtsh_ss(x[i].d), dmin = _cvtsh_ss(x[i].dmin);
        uint32_t smw[4];
        kq_unpack_scales_mins(x[i].scales, smw);
        const uint8_t *sm = (const uint8_t *)smw; /* scales | mins */
        const __m512i hb = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)x[i].qh));
        for (int c = 0; c < 4; c++, y += 64) {
            const __m512i q = unpack_pair_q5_K_avx512(x[i].qs + 32 * c, hb, c);
            const float d0 = d * sm[2 * c], m0 = dmin * sm[8 + 2 * c];
            const float d1 = d * sm[2 * c + 1], m1 = dmin * sm[9 + 2 * c];
            kq_store16_avx512(y + 0, _mm512_extracti32x4_epi32(q, 0), d0, m0);
            kq_store16_avx512(y + 16, _mm512_extracti32x4_epi32(q, 1), d0, m0);
            kq_store16_avx512(y + 32, _mm512_extracti32x4_epi32(q, 2), d1, m1);
            kq_store16_avx512(y + 48, _mm512_extracti32x4_epi32(q, 3), d1, m1);
        }
    }
}

BUBO_TARGET_AVX512
static void vec_dot_q5_K_q8_K_avx512(int n, float *restrict s, const void *restrict vx, const void *restrict vy) {
    const block_q5_K *restrict x = vx;
    const block_q8_K *restrict y = vy;
    __m512 acc = _mm512_setzero_ps();
    __m256 acc_m = _mm256_setzero_ps();
    for (int i = 0; i < n / QK_K; i++) {
        uint32_t smw[4];
        kq_unpack_scales_mins(x[i].scales, smw);
        const __m256i sm16 = _mm256_cvtepu8_epi16(kq_words_to_xmm(smw));
        const __m512i words = _mm512_castsi256_si512(sm16);
        const __m256i summ = kq_mins_dot_bsums_avx2(sm16, y[i].bsums);

        const __m512i hb = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)x[i].qh));
        const int8_t *a = y[i].qs;
        __m512i sumi = _mm512_setzero_si512();
        for (int c = 0; c < 4; c++, a += 64) {
            const __m512i w = unpack_pair_q5_K_avx512(x[i].qs + 32 * c, hb, c);
            sumi = kq_dot64_scaled_avx512(sumi, w, a, kq_group32_scales_avx512(words, c));
        }
        const float dy = y[i].d;
        acc = _mm512_fmadd_ps(_mm512_set1_ps(dy * _cvtsh_ss(x[i].d)), _mm512_cvtepi32_ps(sumi), acc);
        acc_m = _mm256_fmadd_ps(_mm256_set1_ps(dy * _cvtsh_ss(x[i].dmin)), _mm256_cvtepi32_ps(summ), acc_m);
    }
    *s = _mm512_reduce_add_ps(acc) - bubo_hsum_f32x8(acc_m);
}

#endif /* BUBO_X86 */

/* ---- arm64: NEON ----------------------------------------------------------------------- */

#if defined(BUBO_ARM64)

/* Groups 2c and 2c + 1, 16 bytes at a time (t = 0, 1): q[2k + t] for k = 0 (low), 1 (high). */
static inline void unpack_pair_q5_K_neon(const uint8_t *qs, const uint8_t *qh, int c, int8x16_t q[4]) {
    const uint8x16_t m4 = vdupq_n_u8(0x0F), b16 = vdupq_n_u8(16);
    const uint8x16_t bit0 = vdupq_n_u8((uint8_t)(1 << (2 * c))), bit1 = vdupq_n_u8((uint8_t)(2 << (2 * c)));
    for (int t = 0; t < 2; t++) {
        const uint8x16_t b = vld1q_u8(qs + 16 * t), hb = vld1q_u8(qh + 16 * t);
        /* vtstq: all ones where the bit is set */
        q[t] = vreinterpretq_s8_u8(vorrq_u8(vandq_u8(b, m4), vandq_u8(vtstq_u8(hb, bit0), b16)));
        q[2 + t] = vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(b, 4), vandq_u8(vtstq_u8(hb, bit1), b16)));
    }
}

static void dequantize_row_q5_K_neon(const void *restrict vx, float *restrict y, int64_t n) {
    const block_q5_K *restrict x = vx;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = bubo_h2f(x[i].d), dmin = bubo_h2f(x[i].dmin);
        uint32_t smw[4];
        kq_unpack_scales_mins(x[i].scales, smw);
        const uint8_t *sm = (const uint8_t *)smw; /* scales | mins */
        for (int c = 0; c < 4; c++) {
            int8x16_t q[4];
            unpack_pair_q5_K_neon(x[i].qs + 32 * c, x[i].qh, c, q);
            for (int k = 0; k < 2; k++, y += 32) {
                const float dl = d * sm[2 * c + k], ml = dmin * sm[8 + 2 * c + k];
                kq_store16_neon(y, q[2 * k], dl, ml);
                kq_store16_neon(y + 16, q[2 * k + 1], dl, ml);
            }
        }
    }
}

static void vec_dot_q5_K_q8_K_neon(int n, float *restrict s, const void *restrict vx, const void *restrict vy) {
    const block_q5_K *restrict x = vx;
    const block_q8_K *restrict y = vy;
    float sumf = 0;
    for (int i = 0; i < n / QK_K; i++) {
        uint32_t smw[4];
        kq_unpack_scales_mins(x[i].scales, smw);
        const uint8_t *sm = (const uint8_t *)smw; /* scales | mins */
        const int16x8_t bsum32 = vpaddq_s16(vld1q_s16(y[i].bsums), vld1q_s16(y[i].bsums + 8));
        const int16x8_t mins = vreinterpretq_s16_u16(vmovl_u8(vld1_u8(sm + 8)));
        const int32x4_t pm = vmull_s16(vget_low_s16(bsum32), vget_low_s16(mins));
        const int32_t summ = vaddvq_s32(vmlal_high_s16(pm, bsum32, mins));

        const int8_t *a = y[i].qs;
        int32x4_t sumi = vdupq_n_s32(0);
        for (int c = 0; c < 4; c++, a += 64) {
            int8x16_t q[4];
            unpack_pair_q5_K_neon(x[i].qs + 32 * c, x[i].qh, c, q);
            int32x4_t lo = kq_dot16_neon(vdupq_n_s32(0), q[0], vld1q_s8(a));
            int32x4_t hi = kq_dot16_neon(vdupq_n_s32(0), q[2], vld1q_s8(a + 32));
            lo = kq_dot16_neon(lo, q[1], vld1q_s8(a + 16));
            hi = kq_dot16_neon(hi, q[3], vld1q_s8(a + 48));
            sumi = vmlaq_n_s32(sumi, lo, sm[2 * c]);
            sumi = vmlaq_n_s32(sumi, hi, sm[2 * c + 1]);
        }
        const float dy = y[i].d;
        sumf += dy * bubo_h2f(x[i].d) * (float)vaddvq_s32(sumi) - dy * bubo_h2f(x[i].dmin) * (float)summ;
    }
    *s = sumf;
}

#endif /* BUBO_ARM64 */

/* vec_dot looped over a tile, where no SIMD tile exists */
BUBO_LOOP_TILE(loop_tile_q5_K_q8_K_scalar, vec_dot_q5_K_q8_K_scalar)
#if defined(BUBO_X86)
BUBO_LOOP_TILE(loop_tile_q5_K_q8_K_avx2, vec_dot_q5_K_q8_K_avx2)
BUBO_LOOP_TILE(loop_tile_q5_K_q8_K_avx512, vec_dot_q5_K_q8_K_avx512)
#endif
#if defined(BUBO_ARM64)
BUBO_LOOP_TILE(loop_tile_q5_K_q8_K_neon, vec_dot_q5_K_q8_K_neon)
#endif

void bubo_register_q5_k(bubo_type_traits *table) {
    bubo_type_traits *t = &table[BUBO_TYPE_Q5_K];
    t->supported = 1;
    t->vec_dot_type = BUBO_TYPE_Q8_K;
    t->to_float[BUBO_ISA_SCALAR] = dequantize_row_q5_K_scalar;
    t->vec_dot[BUBO_ISA_SCALAR] = vec_dot_q5_K_q8_K_scalar;
    t->vec_dot_tile[BUBO_ISA_SCALAR] = loop_tile_q5_K_q8_K_scalar;
#if defined(BUBO_X86)
    t->to_float[BUBO_ISA_AVX2] = dequantize_row_q5_K_avx2;
    t->vec_dot[BUBO_ISA_AVX2] = vec_dot_q5_K_q8_K_avx2;
    t->vec_dot_tile[BUBO_ISA_AVX2] = loop_tile_q5_K_q8_K_avx2;
    t->to_float[BUBO_ISA_AVX512] = dequantize_row_q5_K_avx512;
    t->vec_dot[BUBO_ISA_AVX512] = vec_dot_q5_K_q8_K_avx512;
    t->vec_dot_tile[BUBO_ISA_AVX512] = loop_tile_q5_K_q8_K_avx512;
#endif
#if defined(BUBO_ARM64)
    t->to_float[BUBO_ISA_NEON] = dequantize_row_q5_K_neon;
    t->vec_dot[BUBO_ISA_NEON] = vec_dot_q5_K_q8_K_neon;
    t->vec_dot_tile[BUBO_ISA_NEON] = loop_tile_q5_K_q8_K_neon;
#endif
}
