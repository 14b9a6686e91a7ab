/* Q6_K weights: super-blocks of 256 elements in 16 groups of 16; element value
 * d * scale[g] * (q - 32) with 6-bit q and signed 8-bit scale. Dot products take Q8_K.
 *
 * Layout, per half h = 0, 1 of the block (128 elements; ql += 64h, qh += 32h), l = 0..31:
 *   element l       low 4 bits: ql[l] & 0xF,      high 2 bits: qh[l] bits 0-1
 *   element l + 32  ql[l + 32] & 0xF,             qh[l] bits 2-3
 *   element l + 64  ql[l] >> 4,                   qh[l] bits 4-5
 *   element l + 96  ql[l + 32] >> 4,              qh[l] bits 6-7
 *
 * The SIMD kernels multiply the unsigned q (0..63) and take the offset out once per group:
 * sum(scale * (q - 32) * a) = sum(scale * q * a) - 32 * sum_g scale[g] * bsum[g]. */
#include "kquants_internal.h"
#include "kquant_tile.h"
#include "kquant_tile_avx2.h"

/* ---- scalar reference ------------------------------------------------------------------ */

/* q - 32 of every element, in order */
static void unpack_q6_K(const block_q6_K *restrict x, int8_t q[QK_K]) {
    for (int h = 0; h < 2; h++) {
        const uint8_t *ql = x->ql + 64 * h, *qh = x->qh + 32 * h;
        int8_t *o = q + 128 * h;
        for (int l = 0; l < 32; l++) {
            o[l + 0] = (int8_t)(((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32);
            o[l + 32] = (int8_t)(((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
            o[l + 64] = (int8_t)(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
            o[l + 96] = (int8_t)(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
        }
    }
}

static void dequantize_row_q6_K_scalar(const void *restrict vx, float *restrict y, int64_t n) {
    const block_q6_K *restrict x = vx;
    for (int64_t i = 0; i < n / QK_K; i++, y += QK_K) {
        const float d = bubo_h2f(x[i].d);
        int8_t q[QK_K];
        unpack_q6_K(&x[i], q);
        for (int g = 0; g < 16; g++) {
            const float dl = d * x[i].scales[g];
            for (int l = 16 * g; l < 16 * g + 16; l++) y[l] = dl * q[l];
        }
    }
}

static void vec_dot_q6_K_q8_K_scalar(int n, float *restrict s, const void *restrict vx, const void *restrict vy) {
    const block_q6_K *restrict x = vx;
    const block_q8_K *restrict y = vy;
    float sumf = 0;
    for (int i = 0; i < n / QK_K; i++) {
        int8_t q[QK_K];
        unpack_q6_K(&x[i], q);
        int32_t sumi = 0;
        for (int g = 0; g < 16; g++) {
            int32_t dot = 0;
            for (int l = 16 * g; l < 16 * g + 16; l++) dot += q[l] * y[i].qs[l];
            sumi += x[i].scales[g] * dot;
        }
        sumf += y[i].d * bubo_h2f(x[i].d) * (float)sumi;
    }
    *s = sumf;
}

/* ---- x86-64: AVX2, AVX-512 ------------------------------------------------------------- */

#if defined(BUBO_X86)

/* The four 32-element runs of half a block as unsigned q (0..63), in element order. */
BUBO_TARGET_AVX2
static inline void unpack_half_q6_K_avx2(const uint8_t *ql, const uint8_t *qh, __m256i q[4]) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(0x03);
    const __m256i b0 = _mm256_loadu_si256((const __m256i *)ql);
    const __m256i b1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
    const __m256i hb = _mm256_loadu_si256((const __m256i *)qh);
    /* word shifts are safe here: the masks keep only bits that stay inside their byte */
    q[0] = _mm256_or_si256(_mm256_and_si256(b0, m4), _mm256_slli_epi16(_mm256_and_si256(hb, m2), 4));
    q[1] = _mm256_or_si256(_mm256_and_si256(b1, m4),
                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2), m2), 4));
    q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b0, 4), m4),
                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 4), m2), 4));
    q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b1, 4), m4),
                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 6), m2), 4));
}

BUBO_TARGET_AVX2
static void dequantize_row_q6_K_avx2(const void *restrict vx, float *restrict y, int64_t n) {
    const block_q6_K *restrict x = vx;
    const __m256i off = _mm256_set1_epi8(32);
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = _cvtsh_ss(x[i].d);
        for (int h = 0; h < 2; h++) {
            __m256i q[4];
            unpack_half_q6_K_avx2(x[i].ql + 64 * h, x[i].qh + 32 * h, q);
            for (int m = 0; m < 4; m++, y += 32) {
                const __m256i v = _mm256_sub_epi8(q[m], off);
                const int g = 8 * h + 2 * m;
                kq_store16_avx2(y, _mm256_castsi256_si128(v), d * x[i].scales[g], 0.0f);
                kq_store16_avx2(y + 16, _mm256_extracti128_si256(v, 1), d * x[i].scales[g + 1], 0.0f);
            }
        }
    }
}

BUBO_TARGET_AVX2
static void vec_dot_q6_K_q8_K_avx2(int n, float *restrict s, const void *restrict vx, const void *restrict vy) {
    const block_q6_K *restrict x = vx;
    const block_q8_K *restrict y = vy;
    __m128 acc = _mm_setzero_ps(); /* kquant_tile_avx2.h's chain: the prepacked tile's bits */
    for (int i = 0; i < n / QK_K; i++) {
        const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x[i].scales));
        const __m256i bsums = _mm256_loadu_si256((const __m256i *)y[i].bsums);
        const __m256i offset = _mm256_slli_epi32(_mm256_madd_epi16(bsums, sc16), 5);
        const int8_t *a = y[i].qs;
        /* the scale words of groups 0-7, then 8-15, in both lanes */
        const __m256i halves[2] = {_mm256_permute2x128_si256(sc16, sc16, 0x00),
                                   _mm256_permute2x128_si256(sc16, sc16, 0x11)};
        __m256i sumi = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            __m256i q[4];
            unpack_half_q6_K_avx2(x[i].ql + 64 * h, x[i].qh + 32 * h, q);
            for (int m = 0; m < 4; m++, a += 32)
                sumi = kq_dot32_scaled_avx2(sumi, q[m], a, kq_group16_scales_avx2(halves[h], m));
        }
        const float d = _cvtsh_ss(x[i].d);
        acc = kq_chain_step_avx2(acc, bubo_hsum_i32x8(sumi), bubo_hsum_i32x8(offset), d, d, y[i].d);
    }
    *s = _mm_cvtss_f32(acc);
}

/* The two 64-element runs of half a block as unsigned q (0..63): elements 0..63 and 64..127.
 * The 32 high-bit bytes go to both 256-bit halves and a per-half shift moves the right pair
 * of bits to bits 4-5 (64-bit shifts: the mask drops what crosses a byte). */
BUBO_TARGET_AVX512
static inline void unpack_half_q6_K_avx512(const uint8_t *ql, const uint8_t *qh, __m512i q[2]) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), m_hi = _mm512_set1_epi8(0x30);
    const __m512i bits = _mm512_loadu_si512((const void *)ql);
    const __m512i hb = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)qh));
    const __m512i hi01 = _mm512_and_si512(_mm512_sllv_epi64(hb, _mm512_setr_epi64(4, 4, 4, 4, 2, 2, 2, 2)), m_hi);
    const __m512i hi23 = _mm512_and_si512(_mm512_srlv_epi64(hb, _mm512_setr_epi64(0, 0, 0, 0, 2, 2, 2, 2)), m_hi);
    q[0] = _mm512_or_si512(_mm512_and_si512(bits, m4), hi01);
    q[1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(bits, 4), m4), hi23);
}

BUBO_TARGET_AVX512
static void dequantize_row_q6_K_avx512(const void *restrict vx, float *restrict y, int64_t n) {
    const block_q6_K *restrict x = vx;
    const __m512i off = _mm512_set1_epi8(32);
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = _cvtsh_ss(x[i].d);
        const int8_t *sc = x[i].scales;
        for (int h = 0; h < 2; h++) {
            __m512i q[2];
            unpack_half_q6_K_avx512(x[i].ql + 64 * h, x[i].qh + 32 * h, q);
            for (int k = 0; k < 2; k++, y += 64, sc += 4) {
                const __m512i v = _mm512_sub_epi8(q[k], off);
                kq_store16_avx512(y + 0, _mm512_extracti32x4_epi32(v, 0), d * sc[0], 0.0f);
                kq_store16_avx512(y + 16, _mm512_extracti32x4_epi32(v, 1), d * sc[1], 0.0f);
                kq_store16_avx512(y + 32, _mm512_extracti32x4_epi32(v, 2), d * sc[2], 0.0f);
                kq_store16_avx512(y + 48, _mm512_extracti32x4_epi32(v, 3), d * sc[3], 0.0f);
            }
        }
    }
}

/* One row against nt tokens (nt a constant where inlined): per super-block the weights are
 * unpacked once and serve every token; per (row, token) the integer sums (isum = sum of scale *
 * (q . qy) with q unsigned 0..63, over 16 lanes; msum = sum of 32 * scale * bsum, over 8) and the
 * kq_chain_step chain are those of vec_dot, so each output has its bits. */
BUBO_TARGET_AVX512 static inline __attribute__((always_inline)) void dots_q6_K_q8_K_avx512(
    int n, const int nt, float *restrict s, size_t s_stride, const void *restrict vx, const uint8_t *restrict y,
    size_t y_stride) {
    const block_q6_K *restrict x = vx;
    __m128 acc[KQ_ROWS_MAX_TOKENS];
#pragma GCC unroll 8
    for (int t = 0; t < nt; t++) acc[t] = _mm_setzero_ps();
    for (int i = 0; i < n / QK_K; i++) {
        const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x[i].scales));
        const __m512i words = _mm512_castsi256_si512(sc16);
        __m512i q[4], sw[4];
        unpack_half_q6_K_avx512(x[i].ql, x[i].qh, q);
        unpack_half_q6_K_avx512(x[i].ql + 64, x[i].qh + 32, q + 2);
        for (int k = 0; k < 4; k++) sw[k] = kq_group16_scales_avx512(words, k);
        const float d = _cvtsh_ss(x[i].d);
#pragma GCC unroll 8
        for (int t = 0; t < nt; t++) {
            const block_q8_K *yb = (const block_q8_K *)(y + (size_t)t * y_stride) + i;
            const __m256i bsums = _mm256_loadu_si256((const __m256i *)yb->bsums);
            const __m256i msum = _mm256_slli_epi32(_mm256_madd_epi16(bsums, sc16), 5);
            __m512i sumi = _mm512_setzero_si512();
            for (int k = 0; k < 4; k++) sumi = kq_dot64_scaled_avx512(sumi, q[k], yb->qs + 64 * k, sw[k]);
            acc[t] = kq_chain_step(acc[t], sumi, msum, d, d, yb->d);
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < nt; t++) s[(size_t)t * s_stride] = _mm_cvtss_f32(acc[t]);
}

BUBO_TARGET_AVX512
static void vec_dot_q6_K_q8_K_avx512(int n, float *restrict s, const void *restrict vx, const void *restrict vy) {
    dots_q6_K_q8_K_avx512(n, 1, s, 0, vx, vy, 0);
}

#endif /* BUBO_X86 */

/* ---- arm64: NEON ----------------------------------------------------------------------- */

#if defined(BUBO_ARM64)

/* The eight 16-element groups of half a block as signed q - 32, in element order. */
static inline void unpack_half_q6_K_neon(const uint8_t *ql, const uint8_t *qh, int8x16_t q[8]) {
    const uint8x16_t m4 = vdupq_n_u8(0x0F), m_hi = vdupq_n_u8(0x30);
    const int8x16_t off = vdupq_n_s8(32);
    for (int t = 0; t < 2; t++) { /* bytes l = 16t .. 16t + 15 */
        const uint8x16_t b0 = vld1q_u8(ql + 16 * t), b1 = vld1q_u8(ql + 32 + 16 * t);
        const uint8x16_t hb = vld1q_u8(qh + 16 * t);
        const uint8x16_t e0 = vorrq_u8(vandq_u8(b0, m4), vandq_u8(vshlq_n_u8(hb, 4), m_hi));
        const uint8x16_t e1 = vorrq_u8(vandq_u8(b1, m4), vandq_u8(vshlq_n_u8(hb, 2), m_hi));
        const uint8x16_t e2 = vorrq_u8(vshrq_n_u8(b0, 4), vandq_u8(hb, m_hi));
        const uint8x16_t e3 = vorrq_u8(vshrq_n_u8(b1, 4), vandq_u8(vshrq_n_u8(hb, 2), m_hi));
        q[0 + t] = vsubq_s8(vreinterpretq_s8_u8(e0), off);
        q[2 + t] = vsubq_s8(vreinterpretq_s8_u8(e1), off);
        q[4 + t] = vsubq_s8(vreinterpretq_s8_u8(e2), off);
        q[6 + t] = vsubq_s8(vreinterpretq_s8_u8(e3), off);
    }
}

static void dequantize_row_q6_K_neon(const void *restrict vx, float *restrict y, int64_t n) {
    const block_q6_K *restrict x = vx;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = bubo_h2f(x[i].d);
        for (int h = 0; h < 2; h++) {
            int8x16_t q[8];
            unpack_half_q6_K_neon(x[i].ql + 64 * h, x[i].qh + 32 * h, q);
            for (int g = 0; g < 8; g++, y += 16) kq_store16_neon(y, q[g], d * x[i].scales[8 * h + g], 0.0f);
        }
    }
}

static void vec_dot_q6_K_q8_K_neon(int n, float *restrict s, const void *restrict vx, const void *restrict vy) {
    const block_q6_K *restrict x = vx;
    const block_q8_K *restrict y = vy;
    float sumf = 0;
    for (int i = 0; i < n / QK_K; i++) {
        const int8_t *a = y[i].qs;
        int32x4_t sumi = vdupq_n_s32(0);
        for (int h = 0; h < 2; h++) {
            int8x16_t q[8];
            unpack_half_q6_K_neon(x[i].ql + 64 * h, x[i].qh + 32 * h, q);
            for (int g = 0; g < 8; g++, a += 16)
                sumi = vmlaq_n_s32(sumi, kq_dot16_neon(vdupq_n_s32(0), q[g], vld1q_s8(a)), x[i].scales[8 * h + g]);
        }
        sumf += y[i].d * bubo_h2f(x[i].d) * (float)vaddvq_s32(sumi);
    }
    *s = sumf;
}

#endif /* BUBO_ARM64 */

/* ---- x86-64 tile (kquant_tile.h) ------------------------------------------------------- */
#if defined(BUBO_X86)
BUBO_TARGET_AVX512 static void kq_unpack_q6_K_avx512(const void *vb, uint8_t q[QK_K], int32_t sc[16], int16_t m[16],
                                                     float *dx, float *dm) {
    const block_q6_K *b = vb;
    for (int h = 0; h < 2; h++) {
        __m256i v[4];
        unpack_half_q6_K_avx2(b->ql + 64 * h, b->qh + 32 * h, v);
        for (int i = 0; i < 4; i++) _mm256_storeu_si256((__m256i *)(q + 128 * h + 32 * i), v[i]);
    }
    for (int j = 0; j < 16; j++) {
        sc[j] = b->scales[j];
        m[j] = (int16_t)(32 * b->scales[j]); /* the -32 offset of q, as a min */
    }
    *dx = *dm = _cvtsh_ss(b->d);
}

#define Q6_K_PACK_MIN_TOKENS 5 /* fewer tokens: kq_rows_q6_K_q8_K_avx512 (same bits) */

BUBO_TARGET_AVX512 static void kq_rows_q6_K_q8_K_avx512(int n, int nt, float *restrict s, size_t s_stride,
                                                      const void *restrict x, const void *restrict y, size_t y_stride) {
    KQ_ROWS_DISPATCH(dots_q6_K_q8_K_avx512, nt, n, s, s_stride, x, y, y_stride);
}

BUBO_TARGET_AVX512 static void tile_q6_K_q8_K_avx512(int n, int n_rows, int n_tokens, float *restrict s, size_t s_stride,
                                                   const void *restrict x, size_t x_stride, const void *restrict y,
                                                   size_t y_stride) {
    tile_kquant_avx512(n, n_rows, n_tokens, s, s_stride, x, x_stride, y, y_stride, sizeof(block_q6_K), kq_unpack_q6_K_avx512,
                       kq_rows_q6_K_q8_K_avx512, Q6_K_PACK_MIN_TOKENS, 0);
}

/* Prepacked (kquant_tile.h), per group and super-block, 3360 bytes = 16 x 210: the low 4 bits of
 * the values two a byte (2048), their high 2 bits four a byte (1024: byte k of lane r in the store
 * of group g, half h holds dword 4h + i's byte k at bits 2i), the 16 signed scales as planes of the
 * 16 rows (256), d as f16 (32). */
#define Q6_K_PP_HIGH 2048
#define Q6_K_PP_SCALES (Q6_K_PP_HIGH + 1024)
#define Q6_K_PP_D (Q6_K_PP_SCALES + 256)
_Static_assert(Q6_K_PP_D + 32 == 16 * sizeof(block_q6_K), "prepacked q6_K size");

BUBO_TARGET_AVX512 static void kq_compress_q6_K(const packed_kq_avx512 *p, const uint8_t *x, size_t x_stride, int n_rows,
                                                size_t off, uint8_t *b) {
    kq_store_nibbles(p, b);
    const __m512i m3 = _mm512_set1_epi8(0x03);
    for (int g = 0; g < 8; g++)
        for (int h = 0; h < 2; h++) {
            __m512i z = _mm512_setzero_si512();
            for (int i = 0; i < 4; i++) /* epi16 shifts: the masked bits stay inside their byte */
                z = _mm512_or_si512(z, _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(p->q[g][4 * h + i], 4), m3), 2 * i));
            _mm512_storeu_si512(b + Q6_K_PP_HIGH + 64 * (2 * g + h), z);
        }
    memset(b + Q6_K_PP_SCALES, 0, 16 * sizeof(block_q6_K) - Q6_K_PP_SCALES);
    for (int r = 0; r < TILE_ROWS && r < n_rows; r++) {
        const block_q6_K *blk = (const block_q6_K *)(x + (size_t)r * x_stride + off);
        for (int j = 0; j < 16; j++) b[Q6_K_PP_SCALES + 16 * j + r] = (uint8_t)blk->scales[j];
        memcpy(b + Q6_K_PP_D + 2 * r, &blk->d, 2);
    }
}

/* The panel without its values (those kq_values_prepacked_q6_K gives). */
BUBO_TARGET_AVX512 static inline __attribute__((always_inline)) void kq_panel_prepacked_q6_K(packed_kq_avx512 *p,
                                                                                             const uint8_t *b) {
    const __m512i low16 = _mm512_set1_epi32(0xFFFF);
    for (int j = 0; j < 16; j++)
        p->sc[j] = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b + Q6_K_PP_SCALES + 16 * j)));
    for (int i = 0; i < 8; i++) /* m = 32 * scale, two int16 a lane */
        p->m_pair[i] = _mm512_or_si512(_mm512_and_si512(_mm512_slli_epi32(p->sc[2 * i], 5), low16),
                                       _mm512_slli_epi32(p->sc[2 * i + 1], 21));
    p->dx = p->dm = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(b + Q6_K_PP_D)));
}

/* The low 4 bits as the 4-bit types', then the high 2 bits (their store holds dwords 4h + i of group
 * g, bits 2i..2i+1 of each byte) into bits 4-5 (epi16 shifts: the mask drops what crosses a byte). */
BUBO_TARGET_AVX512 static inline __attribute__((always_inline)) void kq_values_prepacked_q6_K(const uint8_t *b, int j,
                                                                                              __m512i q[4]) {
    kq_nibble_values(b, j, q);
    const __m512i m_hi = _mm512_set1_epi8(0x30);
    const __m512i z = _mm512_loadu_si512(b + Q6_K_PP_HIGH + 64 * (2 * (j / 2) + j % 2));
    const __m512i hi[4] = {_mm512_slli_epi16(z, 4), _mm512_slli_epi16(z, 2), z, _mm512_srli_epi16(z, 2)};
    for (int i = 0; i < 4; i++) q[i] = _mm512_ternarylogic_epi32(q[i], hi[i], m_hi, 0xF8); /* a | (b & c) */
}

BUBO_PREPACKED_KQUANT(q6_K, block_q6_K, 0)

/* Prepacked for AVX2 (kquant_tile_avx2.h), per group (16 rows) and super-block, 3360 bytes =
 * 16 x 210: per half h, 1536 bytes of values at 1536 h, in the order the micro tile reads them: per
 * 16 elements g, three registers (96 bytes at 96 g): the low 4 bits of elements 16g..16g+7 and
 * 16g+8..16g+15 (element 16g + 8j + i of the half's row r in the low nibble of byte 4r + i of
 * register j, element 16g + 8j + 4 + i in its high nibble), then their high 2 bits (bits
 * 2c..2c+1 of byte 4r + i: element 16g + 4c + i); then per half the 16 scales as planes of its 8
 * rows (128 each), then d as f16 (16 each). */
#define Q6_K_P2_VALUES 1536
#define Q6_K_P2_SCALES (2 * Q6_K_P2_VALUES)
#define Q6_K_P2_D (Q6_K_P2_SCALES + 2 * 16 * KQ2_ROWS)
_Static_assert(Q6_K_P2_D + 2 * 2 * KQ2_ROWS == TILE_ROWS * sizeof(block_q6_K), "prepacked q6_K (AVX2) size");

static void q6_K_pack_row_avx2(uint8_t *gb, int rr, const void *vblk) {
    const block_q6_K *blk = vblk;
    const int h = rr / KQ2_ROWS, r = rr % KQ2_ROWS;
    int8_t q[QK_K];
    unpack_q6_K(blk, q); /* q - 32 */
    uint8_t u[QK_K];
    for (int e = 0; e < QK_K; e++) u[e] = (uint8_t)(q[e] + 32);
    for (int g = 0; g < 16; g++) {
        uint8_t *b = gb + Q6_K_P2_VALUES * h + 96 * g;
        for (int i = 0; i < 4; i++) {
            for (int j = 0; j < 2; j++)
                b[32 * j + 4 * r + i] = (uint8_t)((u[16 * g + 8 * j + i] & 15) | (u[16 * g + 8 * j + 4 + i] & 15) << 4);
            uint8_t hi = 0;
            for (int c = 0; c < 4; c++) hi |= (uint8_t)((u[16 * g + 4 * c + i] >> 4) << (2 * c));
            b[64 + 4 * r + i] = hi;
        }
    }
    for (int j = 0; j < 16; j++) gb[Q6_K_P2_SCALES + KQ2_ROWS * (16 * h + j) + r] = (uint8_t)blk->scales[j];
    memcpy(gb + Q6_K_P2_D + 2 * rr, &blk->d, 2);
}

static void q6_K_prepack_avx2(const void *restrict x, size_t x_stride, int64_t rows, int n, void *restrict dst) {
    kq2_prepack(x, x_stride, rows, n, dst, sizeof(block_q6_K), q6_K_pack_row_avx2);
}

BUBO_TARGET_AVX2 static void kq2_panel_q6_K(kq2_panel *p, const uint8_t *gb, int h) {
    __m256i sc[16];
    for (int j = 0; j < 16; j++) {
        sc[j] = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(gb + Q6_K_P2_SCALES + KQ2_ROWS * (16 * h + j))));
        p->sc[j] = kq2_pair(sc[j]);
    }
    const __m256i low16 = _mm256_set1_epi32(0xFFFF);
    for (int i = 0; i < 8; i++) /* m = 32 * scale */
        p->m_pair[i] = _mm256_or_si256(_mm256_and_si256(_mm256_slli_epi32(sc[2 * i], 5), low16),
                                       _mm256_slli_epi32(sc[2 * i + 1], 21));
    p->dx = p->dm = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(gb + Q6_K_P2_D + 2 * KQ2_ROWS * h)));
}

/* Per 16 elements: two pairs of k-steps add up in int16 (2 x 2 x 63 x 127 < 2^15), each pair
 * widened and scaled by one vpmaddwd. */
BUBO_TARGET_AVX2 static inline __attribute__((always_inline)) void kq2_micro_q6_K_body(
    const kq2_panel *p, const uint8_t *b, const int nt, int first, __m256i live, float *s, size_t s_stride,
    const uint8_t *yt, size_t y_stride) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), m_hi = _mm256_set1_epi8(0x30);
    __m256i isum[KQ2_KTOKENS], msum[KQ2_KTOKENS];
#pragma GCC unroll 8
    for (int t = 0; t < nt; t++) isum[t] = msum[t] = _mm256_setzero_si256();
    for (int g = 0; g < 16; g++) {
        const __m256i n0 = _mm256_loadu_si256((const __m256i *)(b + 96 * g));
        const __m256i n1 = _mm256_loadu_si256((const __m256i *)(b + 96 * g + 32));
        const __m256i h = _mm256_loadu_si256((const __m256i *)(b + 96 * g + 64));
        const __m256i k0 = _mm256_or_si256(_mm256_and_si256(n0, m4), _mm256_and_si256(_mm256_slli_epi16(h, 4), m_hi));
        const __m256i k1 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(n0, 4), m4),
                                           _mm256_and_si256(_mm256_slli_epi16(h, 2), m_hi));
        const __m256i k2 = _mm256_or_si256(_mm256_and_si256(n1, m4), _mm256_and_si256(h, m_hi));
        const __m256i k3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(n1, 4), m4),
                                           _mm256_and_si256(_mm256_srli_epi16(h, 2), m_hi));
#pragma GCC unroll 8
        for (int t = 0; t < nt; t++) {
            const int8_t *a = ((const block_q8_K *)(yt + (size_t)t * y_stride))->qs + 16 * g;
            const __m256i p01 = _mm256_add_epi16(_mm256_maddubs_epi16(k0, kq2_bcast4(a)),
                                                 _mm256_maddubs_epi16(k1, kq2_bcast4(a + 4)));
            const __m256i p23 = _mm256_add_epi16(_mm256_maddubs_epi16(k2, kq2_bcast4(a + 8)),
                                                 _mm256_maddubs_epi16(k3, kq2_bcast4(a + 12)));
            isum[t] = _mm256_add_epi32(isum[t], _mm256_add_epi32(_mm256_madd_epi16(p01, p->sc[g]),
                                                                 _mm256_madd_epi16(p23, p->sc[g])));
            KQ2_KEEP(isum[t]);
        }
    }
    KQ2_FINISH(p, nt, first, live, 0, s, s_stride, yt, y_stride, isum, msum);
}

BUBO_TARGET_AVX2 static void kq2_micro_q6_K(const kq2_panel *p, const uint8_t *b, int nt, int first, __m256i live,
                                            float *s, size_t s_stride, const uint8_t *yt, size_t y_stride) {
    KQ2_MICRO_DISPATCH(kq2_micro_q6_K_body, p, b, nt, first, live, s, s_stride, yt, y_stride);
}

/* Two of a half's k-steps (the low nibbles at n, the high bits of h shifted by sh_lo and sh_hi
 * into bits 4-5), as kq2_micro_q6_K_body unpacks them. */
#define KQ2_Q6_PAIR(n, h, sh_lo, sh_hi, k_lo, k_hi)                                                       \
    do {                                                                                                 \
        k_lo = _mm256_or_si256(_mm256_and_si256(n, m4), _mm256_and_si256(sh_lo(h), m_hi));               \
        k_hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(n, 4), m4), _mm256_and_si256(sh_hi(h), m_hi)); \
    } while (0)
#define KQ2_SL4(h) _mm256_slli_epi16(h, 4)
#define KQ2_SL2(h) _mm256_slli_epi16(h, 2)
#define KQ2_SL0(h) (h)
#define KQ2_SR2(h) _mm256_srli_epi16(h, 2)

/* Q6_K's whole-group tile takes up to 3 tokens, for decode steps only: for prompts, and at 4 tokens,
 * its unpacking leaves too few registers (prompts 113 -> 103-106 G multiply-adds/s per thread
 * against the half tile, [1536, 1536] x 512 on an AMD EPYC Zen 5 at AVX2). */
#define Q6_K_PAIR_TOKENS 3
_Static_assert(Q6_K_PAIR_TOKENS >= 1 && Q6_K_PAIR_TOKENS <= 4, "KQ2_MICRO2_DISPATCH's cases");

/* kq2_micro_q6_K_body for both halves of a group, a pair of k-steps at a time: each broadcast
 * feeds one vpmaddubsw per half. Each 16 elements' sum is the same integer (the two pairs' scaled
 * sums added to isum one after the other instead of together), so every output has the same bits. */
BUBO_TARGET_AVX2 static inline __attribute__((always_inline)) void kq2_micro2_q6_K_body(
    const kq2_panel *p, const uint8_t *gb, size_t values, const int nt, int first, float *s, size_t s_stride,
    const uint8_t *yt, size_t y_stride) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), m_hi = _mm256_set1_epi8(0x30), live = _mm256_set1_epi32(-1);
    const uint8_t *b0 = gb, *b1 = gb + values;
    __m256i isum0[Q6_K_PAIR_TOKENS], isum1[Q6_K_PAIR_TOKENS], msum0[Q6_K_PAIR_TOKENS], msum1[Q6_K_PAIR_TOKENS];
#pragma GCC unroll 4
    for (int t = 0; t < nt; t++) isum0[t] = isum1[t] = msum0[t] = msum1[t] = _mm256_setzero_si256();
    for (int g = 0; g < 16; g++) {
#pragma GCC unroll 2
        for (int j = 0; j < 2; j++) { /* k-steps 0-1 from the first nibbles, 2-3 from the second */
            const __m256i n0 = _mm256_loadu_si256((const __m256i *)(b0 + 96 * g + 32 * j));
            const __m256i n1 = _mm256_loadu_si256((const __m256i *)(b1 + 96 * g + 32 * j));
            const __m256i h0 = _mm256_loadu_si256((const __m256i *)(b0 + 96 * g + 64));
            const __m256i h1 = _mm256_loadu_si256((const __m256i *)(b1 + 96 * g + 64));
            __m256i k0a, k0b, k1a, k1b;
            if (j == 0) {
                KQ2_Q6_PAIR(n0, h0, KQ2_SL4, KQ2_SL2, k0a, k0b);
                KQ2_Q6_PAIR(n1, h1, KQ2_SL4, KQ2_SL2, k1a, k1b);
            } else {
                KQ2_Q6_PAIR(n0, h0, KQ2_SL0, KQ2_SR2, k0a, k0b);
                KQ2_Q6_PAIR(n1, h1, KQ2_SL0, KQ2_SR2, k1a, k1b);
            }
#pragma GCC unroll 4
            for (int t = 0; t < nt; t++) {
                const int8_t *a = ((const block_q8_K *)(yt + (size_t)t * y_stride))->qs + 16 * g + 8 * j;
                const __m256i ya = kq2_bcast4(a), yb = kq2_bcast4(a + 4);
                const __m256i p0 = _mm256_add_epi16(_mm256_maddubs_epi16(k0a, ya), _mm256_maddubs_epi16(k0b, yb));
                const __m256i p1 = _mm256_add_epi16(_mm256_maddubs_epi16(k1a, ya), _mm256_maddubs_epi16(k1b, yb));
                isum0[t] = _mm256_add_epi32(isum0[t], _mm256_madd_epi16(p0, p[0].sc[g]));
                KQ2_KEEP(isum0[t]);
                isum1[t] = _mm256_add_epi32(isum1[t], _mm256_madd_epi16(p1, p[1].sc[g]));
                KQ2_KEEP(isum1[t]);
            }
        }
    }
    KQ2_FINISH(&p[0], nt, first, live, 1, s, s_stride, yt, y_stride, isum0, msum0);
    KQ2_FINISH(&p[1], nt, first, live, 1, s + KQ2_ROWS, s_stride, yt, y_stride, isum1, msum1);
}

BUBO_TARGET_AVX2 static void kq2_micro2_q6_K(const kq2_panel *p, const uint8_t *gb, size_t values, int nt, int first,
                                             float *s, size_t s_stride, const uint8_t *yt, size_t y_stride) {
    KQ2_MICRO2_DISPATCH(kq2_micro2_q6_K_body, Q6_K_PAIR_TOKENS, p, gb, values, nt, first, s, s_stride, yt, y_stride);
}

BUBO_TARGET_AVX2 static void q6_K_tile_prepacked_avx2(int n, int n_rows, int n_tokens, float *restrict s, size_t s_stride,
                                                      const void *restrict x, size_t x_stride, const void *restrict y,
                                                      size_t y_stride) {
    kq2_tile_prepacked(n, n_rows, n_tokens, s, s_stride, x, x_stride, y, y_stride, sizeof(block_q6_K), Q6_K_P2_VALUES,
                       kq2_panel_q6_K, kq2_micro_q6_K, kq2_micro2_q6_K, Q6_K_PAIR_TOKENS, 0);
}
#endif /* BUBO_X86 */

/* vec_dot looped over a tile, where no SIMD tile exists */
BUBO_LOOP_TILE(loop_tile_q6_K_q8_K_scalar, vec_dot_q6_K_q8_K_scalar)
#if defined(BUBO_X86)
BUBO_LOOP_TILE(loop_tile_q6_K_q8_K_avx2, vec_dot_q6_K_q8_K_avx2)
#endif
#if defined(BUBO_ARM64)
BUBO_LOOP_TILE(loop_tile_q6_K_q8_K_neon, vec_dot_q6_K_q8_K_neon)
#endif

void bubo_register_q6_k(bubo_type_traits *table) {
    bubo_type_traits *t = &table[BUBO_TYPE_Q6_K];
    t->supported = 1;
    t->vec_dot_type = BUBO_TYPE_Q8_K;
    t->to_float[BUBO_ISA_SCALAR] = dequantize_row_q6_K_scalar;
    t->vec_dot[BUBO_ISA_SCALAR] = vec_dot_q6_K_q8_K_scalar;
    t->vec_dot_tile[BUBO_ISA_SCALAR] = loop_tile_q6_K_q8_K_scalar;
#if defined(BUBO_X86)
    t->to_float[BUBO_ISA_AVX2] = dequantize_row_q6_K_avx2;
    t->vec_dot[BUBO_ISA_AVX2] = vec_dot_q6_K_q8_K_avx2;
    t->vec_dot_tile[BUBO_ISA_AVX2] = loop_tile_q6_K_q8_K_avx2;
    t->prepack[BUBO_ISA_AVX2] = q6_K_prepack_avx2;
    t->vec_dot_tile_prepacked[BUBO_ISA_AVX2] = q6_K_tile_prepacked_avx2;
    t->to_float[BUBO_ISA_AVX512] = dequantize_row_q6_K_avx512;
    t->vec_dot[BUBO_ISA_AVX512] = vec_dot_q6_K_q8_K_avx512;
    t->vec_dot_tile[BUBO_ISA_AVX512] = tile_q6_K_q8_K_avx512;
    t->prepack[BUBO_ISA_AVX512] = q6_K_prepack_avx512;
    t->vec_dot_tile_prepacked[BUBO_ISA_AVX512] = q6_K_tile_prepacked_avx512;
#endif
#if defined(BUBO_ARM64)
    t->to_float[BUBO_ISA_NEON] = dequantize_row_q6_K_neon;
    t->vec_dot[BUBO_ISA_NEON] = vec_dot_q6_K_q8_K_neon;
    t->vec_dot_tile[BUBO_ISA_NEON] = loop_tile_q6_K_q8_K_neon;
#endif
}
