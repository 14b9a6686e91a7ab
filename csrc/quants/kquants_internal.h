/* Shared by the k-quant family files (q2_k.c ... q6_k.c): the packed 6-bit scales of q4_K and
 * q5_K, and the few SIMD pieces every k-quant kernel is built from.
 *
 * Every k-quant dot product has the same shape: unpack a run of weight quants into bytes,
 * multiply them with the Q8_K activations in integers (exact), weight each 16- or 32-element
 * group by its integer scale (still exact), and only then go to float with the two f16
 * super-block scales. Offsets and minimums never touch the elements: they are a per-group
 * constant times the activations' bsums (sum of each 16 quants). */
#ifndef BUBO_KQUANTS_INTERNAL_H
#define BUBO_KQUANTS_INTERNAL_H

#include "quants_internal.h"

/* The packed scale bytes are read as little-endian words (x86-64 and arm64 both are). */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "k-quant kernels assume a little-endian target"
#endif

/* q4_K and q5_K pack 8 6-bit scales and 8 6-bit mins into 12 bytes:
 *   bytes 0-3   scale 0-3 in bits 0-5; bits 6-7: the top 2 bits of scale 4-7
 *   bytes 4-7   min 0-3 in bits 0-5;   bits 6-7: the top 2 bits of min 4-7
 *   bytes 8-11  low nibble: the low 4 bits of scale 4-7; high nibble: of min 4-7
 * Unpacked into 16 bytes, as words (little-endian): bytes 0..7 = scales, 8..15 = mins. Words,
 * so that the SIMD kernels build a register from them directly (_mm_set_epi32): a 16-byte
 * vector load of bytes just stored piecewise stalls on store forwarding. */
static inline void kq_unpack_scales_mins(const uint8_t packed[K_SCALE_SIZE], uint32_t out[4]) {
    uint32_t p[3];
    memcpy(p, packed, K_SCALE_SIZE);
    out[0] = p[0] & 0x3f3f3f3f;
    out[1] = (p[2] & 0x0f0f0f0f) | (((p[0] >> 6) & 0x03030303) << 4);
    out[2] = p[1] & 0x3f3f3f3f;
    out[3] = ((p[2] >> 4) & 0x0f0f0f0f) | (((p[1] >> 6) & 0x03030303) << 4);
}

/* The scalar references of q4_K and q5_K differ only in how a block's quants are unpacked
 * (4 bits, or 4 + 1 from qh): given q[QK_K] unpacked, the rest is shared. value = d*scale*q - dmin*min
 * per 32-element group. */
static inline void kq_dequant_scale_min_block(const uint8_t packed[K_SCALE_SIZE], float d, float dmin,
                                              const uint8_t q[QK_K], float *restrict y) {
    uint32_t smw[4];
    kq_unpack_scales_mins(packed, smw);
    const uint8_t *sm = (const uint8_t *)smw; /* scales | mins */
    for (int g = 0; g < 8; g++) {
        const float dl = d * sm[g], ml = dmin * sm[8 + g];
        for (int l = 32 * g; l < 32 * g + 32; l++) y[l] = dl * q[l] - ml;
    }
}

/* One block's term of the dot product with Q8_K activations; the mins come from y's bsums. */
static inline float kq_dot_scale_min_block(const uint8_t packed[K_SCALE_SIZE], bubo_f16 d, bubo_f16 dmin,
                                           const uint8_t q[QK_K], const block_q8_K *y) {
    uint32_t smw[4];
    kq_unpack_scales_mins(packed, smw);
    const uint8_t *sm = (const uint8_t *)smw; /* scales | mins */
    int32_t sumi = 0, summ = 0;
    for (int g = 0; g < 8; g++) {
        int32_t dot = 0;
        for (int l = 32 * g; l < 32 * g + 32; l++) dot += q[l] * y->qs[l];
        sumi += sm[g] * dot;
        summ += sm[8 + g] * (y->bsums[2 * g] + y->bsums[2 * g + 1]);
    }
    return y->d * bubo_h2f(d) * (float)sumi - y->d * bubo_h2f(dmin) * (float)summ;
}

#if defined(BUBO_X86)

/* The 16 bytes of kq_unpack_scales_mins (or any 4 words) as a register, without a trip
 * through memory. */
BUBO_TARGET_AVX2
static inline __m128i kq_words_to_xmm(const uint32_t w[4]) {
    return _mm_setr_epi32((int)w[0], (int)w[1], (int)w[2], (int)w[3]);
}

/* vpshufb indices that copy word w of each 128-bit lane to all 8 words of that lane. */
BUBO_TARGET_AVX2
static inline __m256i kq_splat_word_idx(int w) {
    return _mm256_set1_epi16((short)(((2 * w + 1) << 8) | (2 * w)));
}

/* q4_K, q5_K: the 8 dwords min[j] * (bsum[2j] + bsum[2j + 1]), from the words of
 * kq_unpack_scales_mins (scales in lane 0, mins in lane 1). */
BUBO_TARGET_AVX2
static inline __m256i kq_mins_dot_bsums_avx2(__m256i scales_mins, const int16_t *bsums) {
    const __m256i pairs = _mm256_setr_epi8(0, 1, 0, 1, 2, 3, 2, 3, 4, 5, 4, 5, 6, 7, 6, 7,
                                           8, 9, 8, 9, 10, 11, 10, 11, 12, 13, 12, 13, 14, 15, 14, 15);
    const __m256i mins = _mm256_shuffle_epi8(_mm256_permute2x128_si256(scales_mins, scales_mins, 0x11), pairs);
    return _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)bsums), mins);
}

/* y[0..15] = dl * q - ml for 16 signed bytes q. */
BUBO_TARGET_AVX2
static inline void kq_store16_avx2(float *y, __m128i q, float dl, float ml) {
    const __m256 vd = _mm256_set1_ps(dl), vm = _mm256_set1_ps(ml);
    const __m256 lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
    const __m256 hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q, 8)));
    _mm256_storeu_ps(y, _mm256_fmsub_ps(vd, lo, vm));
    _mm256_storeu_ps(y + 8, _mm256_fmsub_ps(vd, hi, vm));
}

BUBO_TARGET_AVX512
static inline void kq_store16_avx512(float *y, __m128i q, float dl, float ml) {
    const __m512 v = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q));
    _mm512_storeu_ps(y, _mm512_fmsub_ps(_mm512_set1_ps(dl), v, _mm512_set1_ps(ml)));
}

/* The AVX2 kernels of the 16-element-group types (q2_K, q3_K, q6_K) work on 32 elements per
 * register: 128-bit lane 0 is group 2t, lane 1 group 2t+1. Given half = the 8 scale words of
 * groups 8h..8h+7 in both lanes, this spreads the words of groups 8h+2m and 8h+2m+1 over
 * lane 0 and lane 1, ready for vpmaddwd. */
BUBO_TARGET_AVX2
static inline __m256i kq_group16_scales_avx2(__m256i half, int m) {
    const char a = (char)(4 * m), b = (char)(4 * m + 2);
    const __m256i idx = _mm256_setr_epi8(a, a + 1, a, a + 1, a, a + 1, a, a + 1, a, a + 1, a, a + 1,
                                         a, a + 1, a, a + 1, b, b + 1, b, b + 1, b, b + 1, b, b + 1,
                                         b, b + 1, b, b + 1, b, b + 1, b, b + 1);
    return _mm256_shuffle_epi8(half, idx);
}

/* The AVX-512 kernels of those types work on 64 elements: 128-bit lane L is group 4k+L. From
 * the 16 scale words of a super-block, the words of register k. */
BUBO_TARGET_AVX512
static inline __m512i kq_group16_scales_avx512(__m512i words, int k) {
    const short g = (short)(4 * k);
    const __m512i idx = _mm512_set_epi16(
        g + 3, g + 3, g + 3, g + 3, g + 3, g + 3, g + 3, g + 3, g + 2, g + 2, g + 2, g + 2, g + 2, g + 2, g + 2, g + 2,
        g + 1, g + 1, g + 1, g + 1, g + 1, g + 1, g + 1, g + 1, g, g, g, g, g, g, g, g);
    return _mm512_permutexvar_epi16(idx, words);
}

/* The AVX-512 kernels of the 32-element-group types (q4_K, q5_K): register c holds groups 2c
 * (low 256 bits) and 2c + 1 (high). From the 8 scale words, the words of register c. */
BUBO_TARGET_AVX512
static inline __m512i kq_group32_scales_avx512(__m512i words, int c) {
    const __m512i idx = _mm512_inserti64x4(_mm512_set1_epi16((short)(2 * c)), _mm256_set1_epi16((short)(2 * c + 1)), 1);
    return _mm512_permutexvar_epi16(idx, words);
}

/* 64 weight bytes (unsigned, < 128) times 64 activation bytes, summed in pairs (vpmaddubsw:
 * 2 * 127 * 127 stays inside int16), then each pair sum times its group's scale word and added
 * into 16 int32 lanes (VNNI vpdpwssd). */
BUBO_TARGET_AVX512
static inline __m512i kq_dot64_scaled_avx512(__m512i acc, __m512i w, const int8_t *a, __m512i scale_words) {
    const __m512i p = _mm512_maddubs_epi16(w, _mm512_loadu_si512((const void *)a));
    return _mm512_dpwssd_epi32(acc, p, scale_words);
}

/* The same for 32 bytes, without VNNI. */
BUBO_TARGET_AVX2
static inline __m256i kq_dot32_scaled_avx2(__m256i acc, __m256i w, const int8_t *a, __m256i scale_words) {
    const __m256i p = _mm256_maddubs_epi16(w, _mm256_loadu_si256((const __m256i *)a));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(p, scale_words));
}

#endif /* BUBO_X86 */

#if defined(BUBO_ARM64)

/* acc + the products of 16 signed bytes, summed four by four into 4 lanes. Only the total over
 * the lanes is meant: the plain-NEON path sums other elements into each lane. */
static inline int32x4_t kq_dot16_neon(int32x4_t acc, int8x16_t a, int8x16_t b) {
#if defined(__ARM_FEATURE_DOTPROD)
    return vdotq_s32(acc, a, b);
#else
    const int16x8_t p0 = vmull_s8(vget_low_s8(a), vget_low_s8(b));
    const int16x8_t p1 = vmull_high_s8(a, b);
    return vpadalq_s16(vpadalq_s16(acc, p0), p1);
#endif
}

/* y[0..15] = dl * q - ml for 16 signed bytes q. */
static inline void kq_store16_neon(float *y, int8x16_t q, float dl, float ml) {
    const int16x8_t lo = vmovl_s8(vget_low_s8(q)), hi = vmovl_high_s8(q);
    const float32x4_t vm = vdupq_n_f32(ml);
    vst1q_f32(y + 0, vsubq_f32(vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo))), dl), vm));
    vst1q_f32(y + 4, vsubq_f32(vmulq_n_f32(vcvtq_f32_s32(vmovl_high_s16(lo)), dl), vm));
    vst1q_f32(y + 8, vsubq_f32(vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi))), dl), vm));
    vst1q_f32(y + 12, vsubq_f32(vmulq_n_f32(vcvtq_f32_s32(vmovl_high_s16(hi)), dl), vm));
}

#endif /* BUBO_ARM64 */

#endif
