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
    __m256 acc = _mm256_setzero_ps(), acc_m = _mm256_setzero_ps();
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
        const float dy = y[i].d;
        acc = _mm256_fmadd_ps(_mm256_set1_ps(dy * _cvtsh_ss(x[i].d)), _mm256_cvtepi32_ps(sumi), acc);
        acc_m = _mm256_fmadd_ps(_mm256_set1_ps(dy * _cvtsh_ss(x[i].dmin)), _mm256_cvtepi32_ps(summ), acc_m);
    }
    *s = kq_hsum_ps_avx2(_mm256_sub_ps(acc, acc_m));
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
                       kq_rows_q4_K_q8_K_avx512, Q4_K_PACK_MIN_TOKENS);
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

/* kq_unpack_scales_mins, 16 rows at once: plane i holds byte i of each row's packed scales. */
BUBO_TARGET_AVX512 static inline __attribute__((always_inline)) void kq_unpack_prepacked_q4_K(packed_kq_avx512 *p,
                                                                                              const uint8_t *b) {
    kq_load_nibbles(p, b);
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

BUBO_PREPACKED_KQUANT(q4_K, block_q4_K)
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
