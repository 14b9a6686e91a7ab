/* Building blocks shared by the legacy 32-element block families (q4.c, q5.c, q8.c).
 *
 * Every legacy block holds 32 elements, so one AVX2 register holds one block's 32 bytes and one
 * AVX-512 register two blocks'. The integer part of a dot product stays exact inside a block
 * (int32 lanes); the dot products then take four blocks a step and convert their eight f16
 * scales with one vcvtph2ps, instead of converting and broadcasting each block's scales apart.
 *
 * In every legacy type the low nibbles of qs[0..15] are elements 0..15 and the high nibbles
 * elements 16..31. */
#ifndef BUBO_LEGACY_SIMD_H
#define BUBO_LEGACY_SIMD_H

#include "quants_internal.h"

#include <float.h>

/* The quantizers' 1/d, or 0 where it is not finite: d = 0 (an all-zero block), or d so small
 * (amax below ~4e-37) that 1/d overflows. ggml's reference would then convert inf or nan to an
 * integer, which C leaves undefined; here such a block quantizes to zeros. */
static inline float inverse_scale(float d) {
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    return id <= FLT_MAX ? id : 0.0f;
}

#if defined(BUBO_X86)

/* ---- AVX2 ------------------------------------------------------------------------------- */

/* One block's 16 bytes of nibbles -> 32 bytes 0..15 in element order. */
BUBO_TARGET_AVX2 static inline __m256i nibbles_avx2(const uint8_t *qs) {
    const __m128i packed = _mm_loadu_si128((const __m128i *)qs);
    const __m256i both = _mm256_inserti128_si256(_mm256_castsi128_si256(packed), _mm_srli_epi16(packed, 4), 1);
    return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}

/* One block's nibbles as two 16-byte halves: elements 0..15 and 16..31, each 0..15. */
BUBO_TARGET_AVX2 static inline void nibble_halves(const uint8_t *qs, __m128i *lo, __m128i *hi) {
    const __m128i raw = _mm_loadu_si128((const __m128i *)qs), mask = _mm_set1_epi8(0x0F);
    *lo = _mm_and_si128(raw, mask);
    *hi = _mm_and_si128(_mm_srli_epi16(raw, 4), mask);
}

/* Dequantizers: y[0..15] = float(q[0..15]) * d + m for 16 bytes q, read as signed or unsigned
 * by `widen` (_mm256_cvtepi8_epi32 / _mm256_cvtepu8_epi32, or the _mm512_ ones). With m = 0
 * this is q * d; with m != 0, q * d is exact for the 4- and 5-bit types (at most 5 + 11
 * significant bits), so the fma rounds as the reference's q * d + m does. */
#define STORE16_AVX2(y, q, widen, d, m)                                                                    \
    do {                                                                                                   \
        _mm256_storeu_ps((y), _mm256_fmadd_ps(_mm256_cvtepi32_ps(widen(q)), (d), (m)));                    \
        _mm256_storeu_ps((y) + 8, _mm256_fmadd_ps(_mm256_cvtepi32_ps(widen(_mm_srli_si128((q), 8))), (d), (m))); \
    } while (0)
#define STORE16_AVX512(y, q, widen, d, m) _mm512_storeu_ps((y), _mm512_fmadd_ps(_mm512_cvtepi32_ps(widen(q)), (d), (m)))

/* 32 bits (little-endian) -> 32 bytes, 0xFF where the element's bit is set. */
BUBO_TARGET_AVX2 static inline __m256i bits_to_bytes_avx2(const uint8_t *qh) {
    uint32_t bits;
    memcpy(&bits, qh, 4);
    /* Byte j takes the byte of qh that holds bit j, then tests its own bit in it. */
    const __m256i which_byte = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                                 0x0101010101010101, 0x0000000000000000);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), which_byte);
    return _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
}

/* Sums of four u8 * s8 products in each of 8 int32 lanes. maddubs saturates at int16, which
 * none of the callers reach: |u| <= 128 and |s| <= 127 give at most 2 * 128 * 127 = 32512. */
BUBO_TARGET_AVX2 static inline __m256i dot_u8s8_avx2(__m256i u, __m256i s) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

/* Four blocks' int32 lane sums (8 lanes each) -> one vector whose lanes i and i+4 hold the two
 * halves of block i's sum, the order dxdy_4blocks_avx2 lays the scales out in. */
BUBO_TARGET_AVX2 static inline __m256i fold_4blocks_avx2(__m256i b0, __m256i b1, __m256i b2, __m256i b3) {
    return _mm256_hadd_epi32(_mm256_hadd_epi32(b0, b1), _mm256_hadd_epi32(b2, b3));
}

/* Eight f16 values at arbitrary addresses -> __m128i of their bits, for one vcvtph2ps. */
BUBO_TARGET_AVX2 static inline __m128i gather_f16x8(const bubo_f16 *p0, const bubo_f16 *p1, const bubo_f16 *p2,
                                                    const bubo_f16 *p3, const bubo_f16 *p4, const bubo_f16 *p5,
                                                    const bubo_f16 *p6, const bubo_f16 *p7) {
    __m128i v = _mm_cvtsi32_si128(*p0);
    v = _mm_insert_epi16(v, *p1, 1);
    v = _mm_insert_epi16(v, *p2, 2);
    v = _mm_insert_epi16(v, *p3, 3);
    v = _mm_insert_epi16(v, *p4, 4);
    v = _mm_insert_epi16(v, *p5, 5);
    v = _mm_insert_epi16(v, *p6, 6);
    return _mm_insert_epi16(v, *p7, 7);
}

/* Scales of four consecutive blocks x[0..3] (type size x_size, f16 d first) and y[0..3] (Q8_0):
 * dx*dy of block k in lanes k and k+4, the order fold_4blocks_avx2 leaves the sums in. */
BUBO_TARGET_AVX2 static inline __m256 dxdy_4blocks_avx2(const void *x, size_t x_size, const block_q8_0 *y) {
    const uint8_t *xb = x;
    const __m256 h = _mm256_cvtph_ps(gather_f16x8((const bubo_f16 *)xb, (const bubo_f16 *)(xb + x_size),
                                                  (const bubo_f16 *)(xb + 2 * x_size), (const bubo_f16 *)(xb + 3 * x_size),
                                                  &y[0].d, &y[1].d, &y[2].d, &y[3].d));
    return _mm256_mul_ps(h, _mm256_permute2f128_ps(h, h, 1));
}

/* Scales of four consecutive blocks x[0..3] (type size x_size, f16 d and m first) and y[0..3]
 * (Q8_1): lane 2k holds dx*dy and lane 2k+1 holds m*s of block k. */
BUBO_TARGET_AVX2 static inline __m256 dm_ds_4blocks_avx2(const void *x, size_t x_size, const block_q8_1 *y) {
    const uint8_t *xb = x;
    uint32_t dm[4];
    for (int k = 0; k < 4; k++) memcpy(&dm[k], xb + k * x_size, 4);
    __m128i xh = _mm_cvtsi32_si128((int)dm[0]);
    xh = _mm_insert_epi32(xh, (int)dm[1], 1);
    xh = _mm_insert_epi32(xh, (int)dm[2], 2);
    xh = _mm_insert_epi32(xh, (int)dm[3], 3);
    const __m256 xdm = _mm256_cvtph_ps(xh);
    /* (d, s) of two blocks per 128-bit half, loaded as doubles: building them in memory first
     * would stall on store forwarding */
    const __m128d ds01 = _mm_loadh_pd(_mm_load_sd((const double *)&y[0]), (const double *)&y[1]);
    const __m128d ds23 = _mm_loadh_pd(_mm_load_sd((const double *)&y[2]), (const double *)&y[3]);
    const __m256 yds = _mm256_set_m128(_mm_castpd_ps(ds23), _mm_castpd_ps(ds01));
    return _mm256_mul_ps(xdm, yds);
}

/* ---- AVX-512 ---------------------------------------------------------------------------- */

/* Two blocks of 32 bytes (at unrelated addresses) -> one register, first block low. */
BUBO_TARGET_AVX512 static inline __m512i load_2x32_avx512(const void *p0, const void *p1) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)p0)),
                              _mm256_loadu_si256((const __m256i *)p1), 1);
}

/* Two blocks' nibbles -> 64 bytes 0..15 in element order: each block's 16 bytes sit in two
 * 128-bit lanes, the second of which is shifted down by a nibble. */
BUBO_TARGET_AVX512 static inline __m512i nibbles_2x_avx512(const uint8_t *qs0, const uint8_t *qs1) {
    const __m256i b0 = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs0));
    const __m256i b1 = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs1));
    __m512i q = _mm512_inserti64x4(_mm512_castsi256_si512(b0), b1, 1);
    q = _mm512_mask_srli_epi16(q, (__mmask32)0xFF00FF00u, q, 4);
    return _mm512_and_si512(q, _mm512_set1_epi8(0x0F));
}

/* acc[0] += float(z01) * scales of blocks 0,1 and acc[1] += float(z23) * scales of blocks 2,3,
 * where z01 holds blocks 0 and 1 (8 int32 lanes each), z23 blocks 2 and 3, and lane idx[k] of
 * `scales` holds block k's combined scale. Two accumulators: one chain of dependent FMAs would
 * be the loop's bottleneck. */
BUBO_TARGET_AVX512 static inline void fma_4blocks_avx512(__m512 acc[2], __m512i z01, __m512i z23, __m512 scales,
                                                         const int idx[4]) {
    const __m512i spread01 = _mm512_set_epi32(idx[1], idx[1], idx[1], idx[1], idx[1], idx[1], idx[1], idx[1],
                                              idx[0], idx[0], idx[0], idx[0], idx[0], idx[0], idx[0], idx[0]);
    const __m512i spread23 = _mm512_set_epi32(idx[3], idx[3], idx[3], idx[3], idx[3], idx[3], idx[3], idx[3],
                                              idx[2], idx[2], idx[2], idx[2], idx[2], idx[2], idx[2], idx[2]);
    acc[0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(z01), _mm512_permutexvar_ps(spread01, scales), acc[0]);
    acc[1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(z23), _mm512_permutexvar_ps(spread23, scales), acc[1]);
}

#endif /* BUBO_X86 */

#if defined(BUBO_ARM64)

/* ---- NEON ------------------------------------------------------------------------------- */

static inline float32x4_t f16x4_to_f32(uint16x4_t h) { return vcvt_f32_f16(vreinterpret_f16_u16(h)); }
static inline float f16_to_f32_neon(bubo_f16 h) { return vgetq_lane_f32(f16x4_to_f32(vdup_n_u16(h)), 0); }
static inline bubo_f16 f32_to_f16_neon(float f) {
    return vget_lane_u16(vreinterpret_u16_f16(vcvt_f16_f32(vdupq_n_f32(f))), 0);
}

/* Sum of the products of two 16-byte signed vectors, 4 int32 lanes. */
static inline int32x4_t dot_s8x16(int32x4_t acc, int8x16_t a, int8x16_t b) {
#if defined(__ARM_FEATURE_DOTPROD)
    return vdotq_s32(acc, a, b);
#else
    const int16x8_t lo = vmull_s8(vget_low_s8(a), vget_low_s8(b));
    const int16x8_t hi = vmull_high_s8(a, b);
    return vpadalq_s16(vpadalq_s16(acc, lo), hi);
#endif
}

/* 32 bits (little-endian) -> two 16-byte vectors, 0xFF where the element's bit is set. */
static inline void bits_to_bytes_neon(const uint8_t *qh, uint8x16_t *lo, uint8x16_t *hi) {
    static const uint8_t bit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    const uint8x16_t m = vld1q_u8(bit);
    *lo = vtstq_u8(vcombine_u8(vdup_n_u8(qh[0]), vdup_n_u8(qh[1])), m);
    *hi = vtstq_u8(vcombine_u8(vdup_n_u8(qh[2]), vdup_n_u8(qh[3])), m);
}

/* y[0..15] = float(q[0..15]) * d + m. */
static inline void store_u8x16_scaled(float *y, uint8x16_t q, float32x4_t d, float32x4_t m) {
    const uint16x8_t lo = vmovl_u8(vget_low_u8(q)), hi = vmovl_high_u8(q);
    vst1q_f32(y + 0, vfmaq_f32(m, vcvtq_f32_u32(vmovl_u16(vget_low_u16(lo))), d));
    vst1q_f32(y + 4, vfmaq_f32(m, vcvtq_f32_u32(vmovl_high_u16(lo)), d));
    vst1q_f32(y + 8, vfmaq_f32(m, vcvtq_f32_u32(vmovl_u16(vget_low_u16(hi))), d));
    vst1q_f32(y + 12, vfmaq_f32(m, vcvtq_f32_u32(vmovl_high_u16(hi)), d));
}

/* y[0..15] = float(q[0..15]) * d. */
static inline void store_s8x16_scaled(float *y, int8x16_t q, float32x4_t d) {
    const int16x8_t lo = vmovl_s8(vget_low_s8(q)), hi = vmovl_high_s8(q);
    vst1q_f32(y + 0, vmulq_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo))), d));
    vst1q_f32(y + 4, vmulq_f32(vcvtq_f32_s32(vmovl_high_s16(lo)), d));
    vst1q_f32(y + 8, vmulq_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi))), d));
    vst1q_f32(y + 12, vmulq_f32(vcvtq_f32_s32(vmovl_high_s16(hi)), d));
}

#endif /* BUBO_ARM64 */

#endif
