/* Q4_K weights: super-blocks of 256 elements in 8 groups of 32; element value
 * d * scale[g] * q - dmin * min[g] with 4-bit q and 6-bit scale and min (kq_unpack_scales_mins).
 * Dot products take Q8_K activations.
 *
 * Layout: qs[32c + l] holds element 64c + l in its low nibble and element 64c + 32 + l in its
 * high nibble (c = 0..3, l = 0..31), so group 2c is the low nibbles of 32 bytes, group 2c + 1
 * their high nibbles.
 *
 * dot = sum_i dy * (dx * sum_g scale[g] * sum(q * a over g) - dmin * sum_g min[g] * sum(a over g))
 * where the integer sums are exact in every variant and sum(a over g) comes from bsums. */
#include "kquants_internal.h"
#include "kquant_tile.h"
#include "kquant_tile_avx2.h"

/* ---- scalar reference ------------------------------------------------------------------ */

static void unpack_q4_K(const block_q4_K *restrict x, uint8_t q[QK_K]) {
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            q[64 * c + l] = x->qs[32 * c + l] & 0x0F;
            q[64 * c + 32 + l] = x->qs[32 * c + l] >> 4;
        }
}

static void dequantize_row_q4_K_scalar(const void *restrict vx, float *restrict y, int64_t n) {
    const block_q4_K *restrict x = vx;
    uint8_t q[QK_K];
    for (int64_t i = 0; i < n / QK_K; i++, y += QK_K) {
        unpack_q4_K(&x[i], q);
        kq_dequant_scale_min_block(x[i].scales, bubo_h2f(x[i].d), bubo_h2f(x[i].dmin), q, y);
    }
}

static void vec_dot_q4_K_q8_K_scalar(int n, float *restrict s, const void *restrict vx, const void *restrict vy) {
    const block_q4_K *restrict x = vx;
    const block_q8_K *restrict y = vy;
    uint8_t q[QK_K];
    float sumf = 0;
    for (int i = 0; i < n / QK_K; i++) {
        unpack_q4_K(&x[i], q);
        sumf += kq_dot_scale_min_block(x[i].scales, x[i].d, x[i].dmin, q, &y[i]);
    }
    *s = sumf;
}

/* ---- x86-64: AVX2, AVX-512 ------------------------------------------------------------- */

#if defined(BUBO_X86)

BUBO_TARGET_AVX2
static void dequantize_row_q4_K_avx2(const void *restrict vx, float *restrict y, int64_t n) {
    const block_q4_K *restrict x = vx;
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = _cvtsh_ss(x[i].d), dmin = _cvtsh_ss(x[i].dmin);
        uint32_t smw[4];
        kq_unpack_scales_mins(x[i].scales, smw);
        const uint8_t *sm = (const uint8_t *)smw; /* scales | mins */
        for (int c = 0; c < 4; c++, y += 64) {
            const __m256i bits = _mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * c));
            const __m256i lo = _mm256_and_si256(bits, m4), hi = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
            const float d0 = d * sm[2 * c], m0 = dmin * sm[8 + 2 * c];
            const float d1 = d * sm[2 * c + 1], m1 = dmin * sm[9 + 2 * c];
            kq_store16_avx2(y + 0, _mm256_castsi256_si128(lo), d0, m0);
            kq_store16_avx2(y + 16, _mm256_extracti128_si256(lo, 1), d0, m0);
            kq_store16_avx2(y + 32, _mm256_castsi256_si128(hi), d1, m1);
            kq_store16_avx2(y + 48, _mm256_extracti128_si256(hi, 1), d1, m1);
        }
    }
}

BUBO_TARGET_AVX2
static void vec_dot_q4_K_q8_K_avx2(int n, float *restrict s, const void *restrict vx, const void *restrict vy) {
    const block_q4_K *restrict x = vx;
    const block_q8_K *restrict y = vy;
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m128 acc = _mm_setzero_ps(); /* kquant_tile_avx2.h's chain: the prepacked tile's bits */
    for (int i = 0; i < n / QK_K; i++) {
        uint32_t smw[4];
        kq_unpack_scales_mins(x[i].scales, smw);
        const __m256i sm16 = _mm256_cvtepu8_epi16(kq_words_to_xmm(smw));
        const __m256i scales = _mm256_permute2x128_si256(sm16, sm16, 0x00);
        const __m256i summ = kq_mins_dot_bsums_avx2(sm16, y[i].bsums);

        const uint8_t *q = x[i].qs;
        const int8_t *a = y[i].qs;
        __m256i sumi = _mm256_setzero_si256();
        for (int c = 0; c < 4; c++, q += 32, a += 64) {
            const __m256i bits = _mm256_loadu_si256((const __m256i *)q);
            const __m256i lo = _mm256_and_si256(bits, m4), hi = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
            const __m256i s0 = _mm256_shuffle_epi8(scales, kq_splat_word_idx(2 * c));
            const __m256i s1 = _mm256_shuffle_epi8(scales, kq_splat_word_idx(2 * c + 1));
            sumi = kq_dot32_scaled_avx2(sumi, lo, a, s0);
            sumi = kq_dot32_scaled_avx2(sumi, hi, a + 32, s1);
        }
        acc = kq_chain_step_avx2(acc, bubo_hsum_i32x8(sumi), bubo_hsum_i32x8(summ), _cvtsh_ss(x[i].d),
                                 _cvtsh_ss(x[i].dmin), y[i].d);
    }
    *s = _mm_cvtss_f32(acc);
}

BUBO_TARGET_AVX512
static void dequantize_row_q4_K_avx512(const void *restrict vx, float *restrict y, int64_t n) {
    const block_q4_K *restrict x = vx;
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    /* a 32-byte run in both halves, shifted 0 and 4: the two groups' nibbles side by side */
    const __m512i nibble_shift = _mm512_setr_epi64(0, 0, 0, 0, 4, 4, 4, 4);
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = _cvtsh_ss(x[i].d), dmin = _cvtsh_ss(x[i].dmin);
        uint32_t smw[4];
        kq_unpack_scales_mins(x[i].scales, smw);
        const uint8_t *sm = (const uint8_t *)smw; /* scales | mins */
        for (int c = 0; c < 4; c++, y += 64) {
            const __m512i bits = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * c)));
            const __m512i q = _mm512_and_si512(_mm512_srlv_epi64(bits, nibble_shift), m4);
            const float d0 = d * sm[2 * c], m0 = dmin * sm[8 + 2 * c];
            const float d1 = d * sm[2 * c + 1], m1 = dmin * sm[9 + 2 * c];
            kq_store16_avx512(y + 0, _mm512_extracti32x4_epi32(q, 0), d0, m0);
            kq_store16_avx512(y + 16, _mm512_extracti32x4_epi32(q, 1), d0, m0);
            kq_store16_avx512(y + 32, _mm512_extracti32x4_epi32(q, 2), d1, m1);
            kq_store16_avx512(y + 48, _mm512_extracti32x4_epi32(q, 3), d1, m1);
        }
    }
}

/* One row against nt tokens (nt a constant where inlined): per super-block the weights are
 * unpacked once and serve every token; per (row, token) the integer sums (isum = sum of scale *
 * (q . qy) over 16 lanes, msum = sum of min * bsum over 8) and the kq_chain_step chain are those of
 * vec_dot, so each output has its bits. */
BUBO_TARGET_AVX512 static inline __attribute__((always_inline)) void dots_q4_K_q8_K_avx512(
    int n, const int nt, float *restrict s, size_t s_stride, const void *restrict vx, const uint8_t *restrict y,
    size_t y_stride) {
    const block_q4_K *restrict x = vx;
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i nibble_shift = _mm512_setr_epi64(0, 0, 0, 0, 4, 4, 4, 4);
    __m128 acc[KQ_ROWS_MAX_TOKENS];
#pragma GCC unroll 8
    for (int t = 0; t < nt; t++) acc[t] = _mm_setzero_ps();
    for (int i = 0; i < n / QK_K; i++) {
        uint32_t smw[4];
        kq_unpack_scales_mins(x[i].scales, smw);
        const __m256i sm16 = _mm256_cvtepu8_epi16(kq_words_to_xmm(smw));
        const __m512i words = _mm512_castsi256_si512(sm16);
        /* register c: 64 consecutive elements, groups 2c (low nibbles) and 2c + 1 (high nibbles) */
        __m512i w[4], sw[4];
        for (int c = 0; c < 4; c++) {
            const __m512i bits = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * c)));
            w[c] = _mm512_and_si512(_mm512_srlv_epi64(bits, nibble_shift), m4);
            sw[c] = kq_group32_scales_avx512(words, c);
        }
        const float d = _cvtsh_ss(x[i].d), dmin = _cvtsh_ss(x[i].dmin);
#pragma GCC unroll 8
        for (int t = 0; t < nt; t++) {
            const block_q8_K *yb = (const block_q8_K *)(y + (size_t)t * y_stride) + i;
            const __m256i msum = kq_mins_dot_bsums_avx2(sm16, yb->bsums);
            __m512i sumi = _mm512_setzero_si512();
            for (int c = 0; c < 4; c++) sumi = kq_dot64_scaled_avx512(sumi, w[c], yb->qs + 64 * c, sw[c]);
            acc[t] = kq_chain_step(acc[t], sumi, msum, d, dmin, yb->d);
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < nt; t++) s[(size_t)t * s_stride] = _mm_cvtss_f32(acc[t]);
}

BUBO_TARGET_AVX512
static void vec_dot_q4_K_q8_K_avx512(int n, float *restrict s, const void *restrict vx, const void *restrict vy) {
    dots_q4_K_q8_K_avx512(n, 1, s, 0, vx, vy, 0);
}

#endif /* BUBO_X86 */

/* ---- arm64: NEON ----------------------------------------------------------------------- */

#if defined(BUBO_ARM64)

static void dequantize_row_q4_K_neon(const void *restrict vx, float *restrict y, int64_t n) {
    const block_q4_K *restrict x = vx;
    const uint8x16_t m4 = vdupq_n_u8(0x0F);
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = bubo_h2f(x[i].d), dmin = bubo_h2f(x[i].dmin);
        uint32_t smw[4];
        kq_unpack_scales_mins(x[i].scales, smw);
        const uint8_t *sm = (const uint8_t *)smw; /* scales | mins */
        for (int c = 0; c < 4; c++, y += 64) {
            const uint8x16_t b0 = vld1q_u8(x[i].qs + 32 * c), b1 = vld1q_u8(x[i].qs + 32 * c + 16);
            const float d0 = d * sm[2 * c], m0 = dmin * sm[8 + 2 * c];
            const float d1 = d * sm[2 * c + 1], m1 = dmin * sm[9 + 2 * c];
            kq_store16_neon(y + 0, vreinterpretq_s8_u8(vandq_u8(b0, m4)), d0, m0);
            kq_store16_neon(y + 16, vreinterpretq_s8_u8(vandq_u8(b1, m4)), d0, m0);
            kq_store16_neon(y + 32, vreinterpretq_s8_u8(vshrq_n_u8(b0, 4)), d1, m1);
            kq_store16_neon(y + 48, vreinterpretq_s8_u8(vshrq_n_u8(b1, 4)), d1, m1);
        }
    }
}

static void vec_dot_q4_K_q8_K_neon(int n, float *restrict s, const void *restrict vx, const void *restrict vy) {
    const block_q4_K *restrict x = vx;
    const block_q8_K *restrict y = vy;
    const uint8x16_t m4 = vdupq_n_u8(0x0F);
    float sumf = 0;
    for (int i = 0; i < n / QK_K; i++) {
        uint32_t smw[4];
        kq_unpack_scales_mins(x[i].scales, smw);
        const uint8_t *sm = (const uint8_t *)smw; /* scales | mins */
        /* bsums of each 32-element group, times the group's min */
        const int16x8_t bsum32 = vpaddq_s16(vld1q_s16(y[i].bsums), vld1q_s16(y[i].bsums + 8));
        const int16x8_t mins = vreinterpretq_s16_u16(vmovl_u8(vld1_u8(sm + 8)));
        const int32x4_t pm = vmull_s16(vget_low_s16(bsum32), vget_low_s16(mins));
        const int32_t summ = vaddvq_s32(vmlal_high_s16(pm, bsum32, mins));

        const uint8_t *q = x[i].qs;
        const int8_t *a = y[i].qs;
        int32x4_t sumi = vdupq_n_s32(0);
        for (int c = 0; c < 4; c++, q += 32, a += 64) {
            const uint8x16_t b0 = vld1q_u8(q), b1 = vld1q_u8(q + 16);
            int32x4_t lo = vdupq_n_s32(0), hi = vdupq_n_s32(0);
            lo = kq_dot16_neon(lo, vreinterpretq_s8_u8(vandq_u8(b0, m4)), vld1q_s8(a + 0));
            lo = kq_dot16_neon(lo, vreinterpretq_s8_u8(vandq_u8(b1, m4)), vld1q_s8(a + 16));
            hi = kq_dot16_neon(hi, vreinterpretq_s8_u8(vshrq_n_u8(b0, 4)), vld1q_s8(a + 32));
            hi = kq_dot16_neon(hi, vreinterpretq_s8_u8(vshrq_n_u8(b1, 4)), vld1q_s8(a + 48));
            sumi = vmlaq_n_s32(sumi, lo, sm[2 * c]);
            sumi = vmlaq_n_s32(sumi, hi, sm[2 * c + 1]);
        }
        const float dy = y[i].d;
        sumf += dy * bubo_h2f(x[i].d) * (float)vaddvq_s32(sumi) - dy * bubo_h2f(x[i].dmin) * (float)summ;
    }
    *s = sumf;
}

#endif /* BUBO_ARM64 */

/* ---- x86-64 tile (kquant_tile.h) ------------------------------------------------------- */
#if defined(BUBO_X86)
BUBO_TARGET_AVX512 static void kq_unpack_q4_K_avx512(const void *vb, uint8_t q[QK_K], int32_t sc[16], int16_t m[16],
                                                     float *dx, float *dm) {
    const block_q4_K *b = vb;
    uint32_t smw[4];
    kq_unpack_scales_mins(b->scales, smw);
    const uint8_t *sm = (const uint8_t *)smw; /* scales | mins */
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    for (int c = 0; c < 4; c++) {
        const __m256i bits = _mm256_loadu_si256((const __m256i *)(b->qs + 32 * c));
        _mm256_storeu_si256((__m256i *)(q + 64 * c), _mm256_and_si256(bits, m4));
        _mm256_storeu_si256((__m256i *)(q + 64 * c + 32), _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4));
    }
    for (int j = 0; j < 16; j++) {
        sc[j] = sm[j / 2];
        m[j] = sm[8 + j / 2];
    }
    *dx = _cvtsh_ss(b->d);
    *dm = _cvtsh_ss(b->dmin);
}

#define Q4_K_PACK_MIN_TOKENS 4 /* fewer tokens: kq_rows_q4_K_q8_K_avx512 (same bits) */

BUBO_TARGET_AVX512 static void kq_rows_q4_K_q8_K_avx512(int n, int nt, float *restrict s, size_t s_stride,
                                                      const void *restrict x, const void *restrict y, size_t y_stride) {
    KQ_ROWS_DISPATCH(dots_q4_K_q8_K_avx512, nt, n, s, s_stride, x, y, y_stride);
}

BUBO_TARGET_AVX512 static void tile_q4_K_q8_K_avx512(int n, int n_rows, int n_tokens, float *restrict s, size_t s_stride,
                                                   const void *restrict x, size_t x_stride, const void *restrict y,
                                                   size_t y_stride) {
    tile_kquant_avx512(n, n_rows, n_tokens, s, s_stride, x, x_stride, y, y_stride, sizeof(block_q4_K), kq_unpack_q4_K_avx512,
                       kq_rows_q4_K_q8_K_avx512, Q4_K_PACK_MIN_TOKENS, KQ_GROUPS32 | KQ_DOT16);
}

/* Prepacked (kquant_tile.h), per group and super-block, 2304 bytes = 16 x 144: the values two a
 * byte (2048), the 12 packed scale bytes as planes of the 16 rows (192), d and dmin as f16 (64). */
#define Q4_K_PP_SCALES 2048
#define Q4_K_PP_D (Q4_K_PP_SCALES + 16 * K_SCALE_SIZE)
#define Q4_K_PP_DMIN (Q4_K_PP_D + 32)
_Static_assert(Q4_K_PP_DMIN + 32 == 16 * sizeof(block_q4_K), "prepacked q4_K size");

BUBO_TARGET_AVX512 static void kq_compress_q4_K(const packed_kq_avx512 *p, const uint8_t *x, size_t x_stride, int n_rows,
                                                size_t off, uint8_t *b) {
    kq_store_nibbles(p, b);
    memset(b + Q4_K_PP_SCALES, 0, 16 * sizeof(block_q4_K) - Q4_K_PP_SCALES);
    for (int r = 0; r < TILE_ROWS && r < n_rows; r++) {
        const block_q4_K *blk = (const block_q4_K *)(x + (size_t)r * x_stride + off);
        for (int i = 0; i < K_SCALE_SIZE; i++) b[Q4_K_PP_SCALES + 16 * i + r] = blk->scales[i];
        memcpy(b + Q4_K_PP_D + 2 * r, &blk->d, 2);
        memcpy(b + Q4_K_PP_DMIN + 2 * r, &blk->dmin, 2);
    }
}

/* kq_unpack_scales_mins, 16 rows at once: plane i holds byte i of each row's packed scales. The
 * panel without its values (those kq_values_prepacked_q4_K gives). */
BUBO_TARGET_AVX512 static inline __attribute__((always_inline)) void kq_panel_prepacked_q4_K(packed_kq_avx512 *p,
                                                                                             const uint8_t *b) {
    __m512i plane[K_SCALE_SIZE];
    for (int i = 0; i < K_SCALE_SIZE; i++)
        plane[i] = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(b + Q4_K_PP_SCALES + 16 * i)));
    const __m512i m63 = _mm512_set1_epi32(63), m15 = _mm512_set1_epi32(15);
    for (int g = 0; g < 4; g++) {
        const __m512i sc = _mm512_and_si512(plane[g], m63), mn = _mm512_and_si512(plane[4 + g], m63);
        const __m512i sc_hi = _mm512_or_si512(_mm512_and_si512(plane[8 + g], m15),
                                              _mm512_slli_epi32(_mm512_srli_epi32(plane[g], 6), 4));
        const __m512i mn_hi = _mm512_or_si512(_mm512_srli_epi32(plane[8 + g], 4),
                                              _mm512_slli_epi32(_mm512_srli_epi32(plane[4 + g], 6), 4));
        p->sc[2 * g] = p->sc[2 * g + 1] = sc;
        p->sc[8 + 2 * g] = p->sc[8 + 2 * g + 1] = sc_hi;
        p->m_pair[g] = _mm512_or_si512(mn, _mm512_slli_epi32(mn, 16));
        p->m_pair[4 + g] = _mm512_or_si512(mn_hi, _mm512_slli_epi32(mn_hi, 16));
    }
    p->dx = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(b + Q4_K_PP_D)));
    p->dm = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(b + Q4_K_PP_DMIN)));
}

BUBO_TARGET_AVX512 static inline __attribute__((always_inline)) void kq_values_prepacked_q4_K(const uint8_t *b, int j,
                                                                                              __m512i q[4]) {
    kq_nibble_values(b, j, q);
}

BUBO_PREPACKED_KQUANT(q4_K, block_q4_K, KQ_GROUPS32 | KQ_DOT16)

/* Prepacked for AVX2 (kquant_tile_avx2.h), per group (16 rows) and super-block, 2304 bytes =
 * 16 x 144: per half h, 32 value registers m (1024 at 1024 h: element 8m + i of the half's row r
 * in the low nibble of byte 4r + i, element 8m + 4 + i in its high nibble); then per half the 12
 * packed scale bytes as planes of its 8 rows (96 each), then d and dmin as f16 (32 each). */
#define Q4_K_P2_VALUES 1024
#define Q4_K_P2_SCALES (2 * Q4_K_P2_VALUES)
#define Q4_K_P2_D (Q4_K_P2_SCALES + 2 * KQ2_ROWS * K_SCALE_SIZE)
#define Q4_K_P2_DMIN (Q4_K_P2_D + 2 * 2 * KQ2_ROWS)
_Static_assert(Q4_K_P2_DMIN + 2 * 2 * KQ2_ROWS == TILE_ROWS * sizeof(block_q4_K), "prepacked q4_K (AVX2) size");

static void q4_K_pack_row_avx2(uint8_t *gb, int rr, const void *vblk) {
    const block_q4_K *blk = vblk;
    const int h = rr / KQ2_ROWS, r = rr % KQ2_ROWS;
    uint8_t q[QK_K], *b = gb + Q4_K_P2_VALUES * h;
    unpack_q4_K(blk, q);
    for (int m = 0; m < 32; m++)
        for (int i = 0; i < 4; i++) b[32 * m + 4 * r + i] = (uint8_t)(q[8 * m + i] | q[8 * m + 4 + i] << 4);
    for (int i = 0; i < K_SCALE_SIZE; i++) gb[Q4_K_P2_SCALES + KQ2_ROWS * (K_SCALE_SIZE * h + i) + r] = blk->scales[i];
    memcpy(gb + Q4_K_P2_D + 2 * rr, &blk->d, 2);
    memcpy(gb + Q4_K_P2_DMIN + 2 * rr, &blk->dmin, 2);
}

static void q4_K_prepack_avx2(const void *restrict x, size_t x_stride, int64_t rows, int n, void *restrict dst) {
    kq2_prepack(x, x_stride, rows, n, dst, sizeof(block_q4_K), q4_K_pack_row_avx2);
}

/* kq_unpack_scales_mins, 8 rows at once (kq_panel_prepacked_q4_K's planes). */
BUBO_TARGET_AVX2 static void kq2_panel_q4_K(kq2_panel *p, const uint8_t *gb, int h) {
    __m256i plane[K_SCALE_SIZE];
    const uint8_t *planes = gb + Q4_K_P2_SCALES + KQ2_ROWS * K_SCALE_SIZE * h;
    for (int i = 0; i < K_SCALE_SIZE; i++)
        plane[i] = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(planes + KQ2_ROWS * i)));
    const __m256i m63 = _mm256_set1_epi32(63), m15 = _mm256_set1_epi32(15);
    __m256i mn[8];
    for (int g = 0; g < 4; g++) {
        const __m256i sc = _mm256_and_si256(plane[g], m63);
        const __m256i sc_hi = _mm256_or_si256(_mm256_and_si256(plane[8 + g], m15),
                                              _mm256_slli_epi32(_mm256_srli_epi32(plane[g], 6), 4));
        mn[g] = _mm256_and_si256(plane[4 + g], m63);
        mn[4 + g] = _mm256_or_si256(_mm256_srli_epi32(plane[8 + g], 4),
                                    _mm256_slli_epi32(_mm256_srli_epi32(plane[4 + g], 6), 4));
        p->sc[g] = kq2_pair(sc);
        p->sc[4 + g] = kq2_pair(sc_hi);
    }
    for (int j = 0; j < 4; j++) /* the mins (< 64) as int16 pairs, groups 2j and 2j + 1 */
        p->m_groups[j] = _mm256_or_si256(mn[2 * j], _mm256_slli_epi32(mn[2 * j + 1], 16));
    p->dx = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(gb + Q4_K_P2_D + 2 * KQ2_ROWS * h)));
    p->dm = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(gb + Q4_K_P2_DMIN + 2 * KQ2_ROWS * h)));
}

/* Q4_K's msum for one token and half: the sum over the 8 groups of m times the group's activation
 * sum, two groups per vpmaddwd (m_groups against gs, kq_group_sums' pairs in every dword); the
 * same integer as KQ2_FINISH's. */
BUBO_TARGET_AVX2 static inline __attribute__((always_inline)) __m256i kq2_mins_q4_K(const kq2_panel *p,
                                                                                   const __m256i gs[4]) {
    /* a tree, not a chain: the halves' two sums of a whole-group tile overlap */
    const __m256i m01 = _mm256_add_epi32(_mm256_madd_epi16(p->m_groups[0], gs[0]), _mm256_madd_epi16(p->m_groups[1], gs[1]));
    const __m256i m23 = _mm256_add_epi32(_mm256_madd_epi16(p->m_groups[2], gs[2]), _mm256_madd_epi16(p->m_groups[3], gs[3]));
    return _mm256_add_epi32(m01, m23);
}

/* KQ2_STORE after Q4_K's mins (kq2_mins_q4_K). */
#define KQ2_FINISH_Q4_K(p, nt, first, live, s, s_stride, yt, y_stride, isum, msum)                              \
    do {                                                                                                   \
        _Pragma("GCC unroll 8") for (int t_ = 0; t_ < (nt); t_++) {                                        \
            __m256i gs_[4];                                                                                \
            kq2_dwords4(kq_group_sums((const block_q8_K *)((yt) + (size_t)t_ * (y_stride))), gs_);         \
            msum[t_] = kq2_mins_q4_K(p, gs_);                                                              \
        }                                                                                                  \
        KQ2_STORE(p, nt, first, live, 0, s, s_stride, yt, y_stride, isum, msum);                           \
    } while (0)

/* Per 32-element group: its 8 k-steps' products add up in int16 (8 x 2 x 15 x 127 < 2^15), then
 * one vpmaddwd by the group's scale. */
BUBO_TARGET_AVX2 static inline __attribute__((always_inline)) void kq2_micro_q4_K_body(
    const kq2_panel *p, const uint8_t *b, const int nt, int first, __m256i live, float *s, size_t s_stride,
    const uint8_t *yt, size_t y_stride) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256i isum[KQ2_KTOKENS], msum[KQ2_KTOKENS];
#pragma GCC unroll 8
    for (int t = 0; t < nt; t++) isum[t] = _mm256_setzero_si256();
    for (int g = 0; g < 8; g++) {
        __m256i acc[KQ2_KTOKENS];
#pragma GCC unroll 8
        for (int t = 0; t < nt; t++) acc[t] = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int mm = 0; mm < 4; mm++) {
            /* one unpacked register live at a time: the tokens' sums stay in registers */
            const __m256i z = _mm256_loadu_si256((const __m256i *)(b + 32 * (4 * g + mm)));
            const __m256i lo = _mm256_and_si256(z, m4);
#pragma GCC unroll 8
            for (int t = 0; t < nt; t++)
            {
                acc[t] = _mm256_add_epi16(acc[t], _mm256_maddubs_epi16(lo, kq2_bcast4(
                    ((const block_q8_K *)(yt + (size_t)t * y_stride))->qs + 32 * g + 8 * mm)));
                KQ2_KEEP(acc[t]);
            }
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(z, 4), m4);
#pragma GCC unroll 8
            for (int t = 0; t < nt; t++)
            {
                acc[t] = _mm256_add_epi16(acc[t], _mm256_maddubs_epi16(hi, kq2_bcast4(
                    ((const block_q8_K *)(yt + (size_t)t * y_stride))->qs + 32 * g + 8 * mm + 4)));
                KQ2_KEEP(acc[t]);
            }
        }
#pragma GCC unroll 8
        for (int t = 0; t < nt; t++) isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(acc[t], p->sc[g]));
    }
    KQ2_FINISH_Q4_K(p, nt, first, live, s, s_stride, yt, y_stride, isum, msum);
}

BUBO_TARGET_AVX2 static void kq2_micro_q4_K(const kq2_panel *p, const uint8_t *b, int nt, int first, __m256i live,
                                            float *s, size_t s_stride, const uint8_t *yt, size_t y_stride) {
    KQ2_MICRO_DISPATCH(kq2_micro_q4_K_body, p, b, nt, first, live, s, s_stride, yt, y_stride);
}

/* Q4_K's whole-group tile takes 4 tokens (its int32 sums in memory, the int16 ones in registers) and
 * serves every token count, 4 at a time (kq2_tile_prepacked's pair_all): on an AMD EPYC Zen 5 at
 * AVX2 (benchmarks/tile_bench.c, one thread, [1536, 1536] in L2), 512 tokens 148 -> 157 G
 * multiply-adds/s against the half tile, decode steps of 4 tokens 126 -> 137 G/s. */
#define Q4_K_PAIR_TOKENS 4
_Static_assert(Q4_K_PAIR_TOKENS >= 1 && Q4_K_PAIR_TOKENS <= 4, "KQ2_MICRO2_DISPATCH's cases");

/* kq2_micro_q4_K_body for both halves of a group: each broadcast feeds one vpmaddubsw per half. */
BUBO_TARGET_AVX2 static inline __attribute__((always_inline)) void kq2_micro2_q4_K_body(
    const kq2_panel *p, const uint8_t *gb, size_t values, const int nt, int first, float *s, size_t s_stride,
    const uint8_t *yt, size_t y_stride) {
    const __m256i live = _mm256_set1_epi32(-1);
    const uint8_t *b0 = gb, *b1 = gb + values;
    __m256i isum0[Q4_K_PAIR_TOKENS], isum1[Q4_K_PAIR_TOKENS], msum0[Q4_K_PAIR_TOKENS], msum1[Q4_K_PAIR_TOKENS];
#pragma GCC unroll 4
    for (int t = 0; t < nt; t++) isum0[t] = isum1[t] = _mm256_setzero_si256();
    for (int g = 0; g < 8; g++) {
        __m256i acc0[Q4_K_PAIR_TOKENS], acc1[Q4_K_PAIR_TOKENS];
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++) acc0[t] = acc1[t] = _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int mm = 0; mm < 4; mm++) {
            const int8_t *a[Q4_K_PAIR_TOKENS];
#pragma GCC unroll 4
            for (int t = 0; t < nt; t++) a[t] = ((const block_q8_K *)(yt + (size_t)t * y_stride))->qs + 32 * g + 8 * mm;
            kq2_nibbles2(_mm256_loadu_si256((const __m256i *)(b0 + 32 * (4 * g + mm))),
                         _mm256_loadu_si256((const __m256i *)(b1 + 32 * (4 * g + mm))), nt, a, acc0, acc1);
        }
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++) {
            isum0[t] = _mm256_add_epi32(isum0[t], _mm256_madd_epi16(acc0[t], p[0].sc[g]));
            isum1[t] = _mm256_add_epi32(isum1[t], _mm256_madd_epi16(acc1[t], p[1].sc[g]));
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < nt; t++) { /* the token's group sums serve both halves */
        __m256i gs[4];
        kq2_dwords4(kq_group_sums((const block_q8_K *)(yt + (size_t)t * y_stride)), gs);
        msum0[t] = kq2_mins_q4_K(&p[0], gs);
        msum1[t] = kq2_mins_q4_K(&p[1], gs);
    }
    KQ2_STORE(&p[0], nt, first, live, 1, s, s_stride, yt, y_stride, isum0, msum0);
    KQ2_STORE(&p[1], nt, first, live, 1, s + KQ2_ROWS, s_stride, yt, y_stride, isum1, msum1);
}

BUBO_TARGET_AVX2 static void kq2_micro2_q4_K(const kq2_panel *p, const uint8_t *gb, size_t values, int nt, int first,
                                             float *s, size_t s_stride, const uint8_t *yt, size_t y_stride) {
    KQ2_MICRO2_DISPATCH(kq2_micro2_q4_K_body, Q4_K_PAIR_TOKENS, p, gb, values, nt, first, s, s_stride, yt, y_stride);
}

BUBO_TARGET_AVX2 static void q4_K_tile_prepacked_avx2(int n, int n_rows, int n_tokens, float *restrict s, size_t s_stride,
                                                      const void *restrict x, size_t x_stride, const void *restrict y,
                                                      size_t y_stride) {
    kq2_tile_prepacked(n, n_rows, n_tokens, s, s_stride, x, x_stride, y, y_stride, sizeof(block_q4_K), Q4_K_P2_VALUES,
                       kq2_panel_q4_K, kq2_micro_q4_K, kq2_micro2_q4_K, Q4_K_PAIR_TOKENS, 1);
}
#endif /* BUBO_X86 */

/* vec_dot looped over a tile, where no SIMD tile exists */
BUBO_LOOP_TILE(loop_tile_q4_K_q8_K_scalar, vec_dot_q4_K_q8_K_scalar)
#if defined(BUBO_X86)
BUBO_LOOP_TILE(loop_tile_q4_K_q8_K_avx2, vec_dot_q4_K_q8_K_avx2)
#endif
#if defined(BUBO_ARM64)
BUBO_LOOP_TILE(loop_tile_q4_K_q8_K_neon, vec_dot_q4_K_q8_K_neon)
#endif

void bubo_register_q4_k(bubo_type_traits *table) {
    bubo_type_traits *t = &table[BUBO_TYPE_Q4_K];
    t->supported = 1;
    t->vec_dot_type = BUBO_TYPE_Q8_K;
    t->to_float[BUBO_ISA_SCALAR] = dequantize_row_q4_K_scalar;
    t->vec_dot[BUBO_ISA_SCALAR] = vec_dot_q4_K_q8_K_scalar;
    t->vec_dot_tile[BUBO_ISA_SCALAR] = loop_tile_q4_K_q8_K_scalar;
#if defined(BUBO_X86)
    t->to_float[BUBO_ISA_AVX2] = dequantize_row_q4_K_avx2;
    t->vec_dot[BUBO_ISA_AVX2] = vec_dot_q4_K_q8_K_avx2;
    t->vec_dot_tile[BUBO_ISA_AVX2] = loop_tile_q4_K_q8_K_avx2;
    t->prepack[BUBO_ISA_AVX2] = q4_K_prepack_avx2;
    t->vec_dot_tile_prepacked[BUBO_ISA_AVX2] = q4_K_tile_prepacked_avx2;
    t->to_float[BUBO_ISA_AVX512] = dequantize_row_q4_K_avx512;
    t->vec_dot[BUBO_ISA_AVX512] = vec_dot_q4_K_q8_K_avx512;
    t->vec_dot_tile[BUBO_ISA_AVX512] = tile_q4_K_q8_K_avx512;
    t->prepack[BUBO_ISA_AVX512] = q4_K_prepack_avx512;
    t->vec_dot_tile_prepacked[BUBO_ISA_AVX512] = q4_K_tile_prepacked_avx512;
#endif
#if defined(BUBO_ARM64)
    t->to_float[BUBO_ISA_NEON] = dequantize_row_q4_K_neon;
    t->vec_dot[BUBO_ISA_NEON] = vec_dot_q4_K_q8_K_neon;
    t->vec_dot_tile[BUBO_ISA_NEON] = loop_tile_q4_K_q8_K_neon;
#endif
}
