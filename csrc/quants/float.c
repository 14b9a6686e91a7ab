/* Float element types: F32, F16 (IEEE half) and BF16 (bfloat16).
 *
 * "Blocks" of one element. Activations stay f32 (vec_dot_type F32 for all three), so a float
 * matmul reads each weight element once, widens it in registers and multiplies by the raw
 * activations: no activation quantization step.
 *
 * Every variant of one kernel computes the same thing; the conversions are bit-exact across
 * variants (F16C and NEON convert with round-to-nearest-even like the scalar code), the dot
 * products differ only in summation order. */
#include "quants_internal.h"

/* ---- exact scalar conversions ------------------------------------------------------------ */

static inline uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float bubo_f16_to_f32(bubo_f16 h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ff;
    if (exp == 0x1f) /* inf, or nan made quiet (as F16C's vcvtph2ps does) */
        return bits_f32(sign | 0x7f800000 | (mant ? 0x400000 | (mant << 13) : 0));
    if (exp == 0) { /* zero or subnormal: mant * 2^-24, exact in f32 */
        float v = (float)mant * 0x1p-24f;
        return bits_f32(sign | f32_bits(v));
    }
    return bits_f32(sign | ((exp + 112) << 23) | (mant << 13));
}

bubo_f16 bubo_f32_to_f16(float f) {
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    x &= 0x7fffffff;
    if (x > 0x7f800000) /* nan: quiet, keeping the payload's top bits (as vcvtps2ph does) */
        return sign | 0x7e00 | (uint16_t)((x >> 13) & 0x3ff);
    if (x >= 0x477ff000) /* inf, or >= 65520 = halfway between 65504 and 2^16: rounds to inf */
        return sign | 0x7c00;
    if (x >= 0x38800000) { /* normal half: rebias the exponent, round off 13 mantissa bits */
        uint32_t h = ((x >> 23) - 112) << 10 | ((x >> 13) & 0x3ff);
        uint32_t rem = x & 0x1fff;
        h += rem > 0x1000 || (rem == 0x1000 && (h & 1)); /* a carry moves into the exponent */
        return sign | (uint16_t)h;
    }
    if (x < 0x33000000) /* below 2^-25, half the smallest subnormal (2^-25 itself ties to 0) */
        return sign;
    /* subnormal half: value = m * 2^-24 with m = M >> (126 - e) for f32 = M * 2^(e-150) */
    uint32_t e = x >> 23, m_full = (x & 0x7fffff) | 0x800000;
    uint32_t shift = 126 - e; /* 14..24 */
    uint32_t h = m_full >> shift;
    uint32_t rem = m_full & ((1u << shift) - 1), halfway = 1u << (shift - 1);
    h += rem > halfway || (rem == halfway && (h & 1)); /* may carry into the smallest normal */
    return sign | (uint16_t)h;
}

float bubo_bf16_to_f32(bubo_bf16 h) { return bits_f32((uint32_t)h << 16); }

bubo_bf16 bubo_f32_to_bf16(float f) {
    uint32_t x = f32_bits(f);
    if ((x & 0x7fffffff) > 0x7f800000) /* nan: truncating could leave an all-zero mantissa (inf) */
        return (bubo_bf16)((x >> 16) | 0x40);
    /* Round to nearest even. Cannot overflow 32 bits: the largest non-nan x is 0xff800000. */
    return (bubo_bf16)((x + 0x7fff + ((x >> 16) & 1)) >> 16);
}

/* ---- F32 ----------------------------------------------------------------------------------
 * to_float / from_float are copies; libc's memcpy is already vectorized. */

static void f32_copy(const void *restrict x, float *restrict y, int64_t n) { memcpy(y, x, (size_t)n * 4); }
static void f32_copy_from(const float *restrict x, void *restrict y, int64_t n) { memcpy(y, x, (size_t)n * 4); }

/* The reference sums in double, as ggml's scalar ggml_vec_dot_f32 does. */
static void vec_dot_f32_f32_scalar(int n, float *restrict s, const void *restrict vx, const void *restrict vy) {
    const float *x = vx, *y = vy;
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += (double)x[i] * (double)y[i];
    *s = (float)sum;
}

/* ---- F16 ---------------------------------------------------------------------------------- */

static void f16_to_float_scalar(const void *restrict vx, float *restrict y, int64_t n) {
    const bubo_f16 *x = vx;
    for (int64_t i = 0; i < n; i++) y[i] = bubo_f16_to_f32(x[i]);
}

static void f16_from_float_scalar(const float *restrict x, void *restrict vy, int64_t n) {
    bubo_f16 *y = vy;
    for (int64_t i = 0; i < n; i++) y[i] = bubo_f32_to_f16(x[i]);
}

static void vec_dot_f16_f32_scalar(int n, float *restrict s, const void *restrict vx, const void *restrict vy) {
    const bubo_f16 *x = vx;
    const float *y = vy;
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += (double)bubo_f16_to_f32(x[i]) * (double)y[i];
    *s = (float)sum;
}

/* ---- BF16 --------------------------------------------------------------------------------- */

static void bf16_to_float_scalar(const void *restrict vx, float *restrict y, int64_t n) {
    const bubo_bf16 *x = vx;
    for (int64_t i = 0; i < n; i++) y[i] = bubo_bf16_to_f32(x[i]);
}

static void bf16_from_float_scalar(const float *restrict x, void *restrict vy, int64_t n) {
    bubo_bf16 *y = vy;
    for (int64_t i = 0; i < n; i++) y[i] = bubo_f32_to_bf16(x[i]);
}

static void vec_dot_bf16_f32_scalar(int n, float *restrict s, const void *restrict vx, const void *restrict vy) {
    const bubo_bf16 *x = vx;
    const float *y = vy;
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += (double)bubo_bf16_to_f32(x[i]) * (double)y[i];
    *s = (float)sum;
}

/* ---- AVX2 (+FMA, F16C) --------------------------------------------------------------------
 * Dot products keep four independent accumulators so consecutive FMAs do not wait on each
 * other's latency; each loop falls through to a scalar tail. */
#if defined(BUBO_X86)

/* Widen 8 bf16 to f32: the bf16 bits are the f32's top half. */
BUBO_TARGET_AVX2 static inline __m256 load_bf16x8(const bubo_bf16 *p) {
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

/* Narrow 8 f32 to bf16 with bubo_f32_to_bf16's rounding and nan rule. */
BUBO_TARGET_AVX2 static inline __m128i store_bf16x8_bits(__m256 v) {
    __m256i x = _mm256_castps_si256(v);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
    __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7fff)), lsb), 16);
    __m256i quiet_nan = _mm256_or_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(0x40));
    __m256i abs = _mm256_and_si256(x, _mm256_set1_epi32(0x7fffffff));
    __m256i is_nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7f800000)); /* abs >= 0: signed compare is fine */
    __m256i h = _mm256_blendv_epi8(rounded, quiet_nan, is_nan);
    h = _mm256_and_si256(h, _mm256_set1_epi32(0xffff));
    /* packus saturates to 0..65535, so the masked values pass unchanged; it works per 128-bit lane */
    __m256i packed = _mm256_packus_epi32(h, h);
    packed = _mm256_permute4x64_epi64(packed, 0x08); /* lane 0's low quad, then lane 1's */
    return _mm256_castsi256_si128(packed);
}

BUBO_TARGET_AVX2 static void vec_dot_f32_f32_avx2(int n, float *restrict s, const void *restrict vx, const void *restrict vy) {
    const float *x = vx, *y = vy;
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    int i = 0;
    for (; i + 32 <= n; i += 32)
        for (int k = 0; k < 4; k++)
            acc[k] = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8 * k), _mm256_loadu_ps(y + i + 8 * k), acc[k]);
    for (; i + 8 <= n; i += 8) acc[0] = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), acc[0]);
    float sum = bubo_hsum_f32x8(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
    for (; i < n; i++) sum += x[i] * y[i];
    *s = sum;
}

BUBO_TARGET_AVX2 static void f16_to_float_avx2(const void *restrict vx, float *restrict y, int64_t n) {
    const bubo_f16 *x = vx;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))));
    for (; i < n; i++) y[i] = bubo_f16_to_f32(x[i]);
}

BUBO_TARGET_AVX2 static void f16_from_float_avx2(const float *restrict x, void *restrict vy, int64_t n) {
    bubo_f16 *y = vy;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) y[i] = bubo_f32_to_f16(x[i]);
}

/* F16 x F32 at AVX2: one 8-lane accumulator per output, stepped by 8 in order, then its
 * horizontal sum, then the scalar tail. The tile below keeps that order for every output, so it
 * gives vec_dot's bits whatever the tile's shape (batch invariance), while a 4-row x 3-token
 * block of outputs shares each weight and activation load: 7 loads for 12 FMAs, where one output
 * at a time takes 2 loads per FMA. */
BUBO_TARGET_AVX2 static inline __m256 load_f16x8(const bubo_f16 *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

BUBO_TARGET_AVX2 static inline float f16_f32_finish(__m256 acc, int i, int n, const bubo_f16 *x, const float *y) {
    float sum = bubo_hsum_f32x8(acc);
    for (; i < n; i++) sum += bubo_f16_to_f32(x[i]) * y[i];
    return sum;
}

BUBO_TARGET_AVX2 static void vec_dot_f16_f32_avx2(int n, float *restrict s, const void *restrict vx, const void *restrict vy) {
    const bubo_f16 *x = vx;
    const float *y = vy;
    __m256 acc = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(load_f16x8(x + i), _mm256_loadu_ps(y + i), acc);
    *s = f16_f32_finish(acc, i, n, x, y);
}

/* outputs (r .. r + 3, t .. t + 2): weight rows x, activation rows y */
BUBO_TARGET_AVX2 static inline void f16_block_4x3(int n, const bubo_f16 *const x[4], const float *const y[3], float *s,
                                                  size_t s_stride) {
    __m256 a[4][3];
    for (int k = 0; k < 4; k++)
        for (int j = 0; j < 3; j++) a[k][j] = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v0 = _mm256_loadu_ps(y[0] + i), v1 = _mm256_loadu_ps(y[1] + i), v2 = _mm256_loadu_ps(y[2] + i);
        for (int k = 0; k < 4; k++) {
            const __m256 w = load_f16x8(x[k] + i);
            a[k][0] = _mm256_fmadd_ps(w, v0, a[k][0]);
            a[k][1] = _mm256_fmadd_ps(w, v1, a[k][1]);
            a[k][2] = _mm256_fmadd_ps(w, v2, a[k][2]);
        }
    }
    for (int j = 0; j < 3; j++)
        for (int k = 0; k < 4; k++) s[(size_t)j * s_stride + k] = f16_f32_finish(a[k][j], i, n, x[k], y[j]);
}

/* outputs (r .. r + 3, t): a decode step's four rows share each activation load */
BUBO_TARGET_AVX2 static inline void f16_block_4x1(int n, const bubo_f16 *const x[4], const float *y, float *s) {
    __m256 a[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(y + i);
        for (int k = 0; k < 4; k++) a[k] = _mm256_fmadd_ps(load_f16x8(x[k] + i), v, a[k]);
    }
    for (int k = 0; k < 4; k++) s[k] = f16_f32_finish(a[k], i, n, x[k], y);
}

/* Activations up to this size stay in L1/L2 while the weights stream past once (rows outer);
 * past it the rows go in chunks of at most F16_TILE_CHUNK_BYTES of weights (half an AVX2 core's
 * smallest L2, 512 KB on Zen 3), each chunk staying in L2 while the tokens go by a block at a
 * time (tokens outer within the chunk). */
#define F16_TILE_ROWS_OUTER_BYTES (96 * 1024)
#define F16_TILE_CHUNK_BYTES (256 * 1024)
#define F512_CHUNK_BYTES (512 * 1024) /* AVX-512 cores have 1-2 MB of L2 */

/* rows per chunk: a multiple of the block's rows, at least one block */
static inline int f16_tile_chunk_rows(int row_bytes, int chunk_bytes, int block_rows) {
    const int rows = chunk_bytes / row_bytes / block_rows * block_rows;
    return rows > block_rows ? rows : block_rows;
}

BUBO_TARGET_AVX2 static void tile_f16_f32_avx2(int n, int n_rows, int n_tokens, float *restrict s, size_t s_stride,
                                               const void *restrict vx, size_t x_stride, const void *restrict vy,
                                               size_t y_stride) {
    const uint8_t *xb = vx, *yb = vy;
#define XR(r) ((const bubo_f16 *)(xb + (size_t)(r) * x_stride))
#define YT(t) ((const float *)(yb + (size_t)(t) * y_stride))
    const int r4 = n_rows / 4 * 4, t3 = n_tokens / 3 * 3;
    if ((size_t)n_tokens * (size_t)n * sizeof(float) <= F16_TILE_ROWS_OUTER_BYTES) {
        for (int r = 0; r < r4; r += 4) {
            const bubo_f16 *const xs[4] = {XR(r), XR(r + 1), XR(r + 2), XR(r + 3)};
            for (int t = 0; t < t3; t += 3) {
                const float *const ys[3] = {YT(t), YT(t + 1), YT(t + 2)};
                f16_block_4x3(n, xs, ys, s + (size_t)t * s_stride + r, s_stride);
            }
            for (int t = t3; t < n_tokens; t++) f16_block_4x1(n, xs, YT(t), s + (size_t)t * s_stride + r);
        }
    } else {
        const int chunk = f16_tile_chunk_rows(n * 2, F16_TILE_CHUNK_BYTES, 4);
        for (int r0 = 0; r0 < r4; r0 += chunk) {
            const int r1 = r0 + chunk < r4 ? r0 + chunk : r4;
            for (int t = 0; t < t3; t += 3) {
                const float *const ys[3] = {YT(t), YT(t + 1), YT(t + 2)};
                for (int r = r0; r < r1; r += 4) {
                    const bubo_f16 *const xs[4] = {XR(r), XR(r + 1), XR(r + 2), XR(r + 3)};
                    f16_block_4x3(n, xs, ys, s + (size_t)t * s_stride + r, s_stride);
                }
            }
            for (int t = t3; t < n_tokens; t++)
                for (int r = r0; r < r1; r += 4) {
                    const bubo_f16 *const xs[4] = {XR(r), XR(r + 1), XR(r + 2), XR(r + 3)};
                    f16_block_4x1(n, xs, YT(t), s + (size_t)t * s_stride + r);
                }
        }
    }
    for (int r = r4; r < n_rows; r++) /* the rows past the last four */
        for (int t = 0; t < n_tokens; t++) vec_dot_f16_f32_avx2(n, &s[(size_t)t * s_stride + r], XR(r), YT(t));
#undef XR
#undef YT
}

BUBO_TARGET_AVX2 static void bf16_to_float_avx2(const void *restrict vx, float *restrict y, int64_t n) {
    const bubo_bf16 *x = vx;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, load_bf16x8(x + i));
    for (; i < n; i++) y[i] = bubo_bf16_to_f32(x[i]);
}

BUBO_TARGET_AVX2 static void bf16_from_float_avx2(const float *restrict x, void *restrict vy, int64_t n) {
    bubo_bf16 *y = vy;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm_storeu_si128((__m128i *)(y + i), store_bf16x8_bits(_mm256_loadu_ps(x + i)));
    for (; i < n; i++) y[i] = bubo_f32_to_bf16(x[i]);
}

BUBO_TARGET_AVX2 static void vec_dot_bf16_f32_avx2(int n, float *restrict s, const void *restrict vx, const void *restrict vy) {
    const bubo_bf16 *x = vx;
    const float *y = vy;
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    int i = 0;
    for (; i + 32 <= n; i += 32)
        for (int k = 0; k < 4; k++)
            acc[k] = _mm256_fmadd_ps(load_bf16x8(x + i + 8 * k), _mm256_loadu_ps(y + i + 8 * k), acc[k]);
    for (; i + 8 <= n; i += 8) acc[0] = _mm256_fmadd_ps(load_bf16x8(x + i), _mm256_loadu_ps(y + i), acc[0]);
    float sum = bubo_hsum_f32x8(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
    for (; i < n; i++) sum += bubo_bf16_to_f32(x[i]) * y[i];
    *s = sum;
}

/* ---- AVX-512 ------------------------------------------------------------------------------
 * 16 lanes; the tails of fewer than 16 elements use masked loads instead of a scalar loop. */

BUBO_TARGET_AVX512 static inline __m512 load_bf16x16(const bubo_bf16 *p) {
    __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}

BUBO_TARGET_AVX512 static inline __m512 maskz_load_bf16x16(__mmask16 m, const bubo_bf16 *p) {
    __m512i w = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}

BUBO_TARGET_AVX512 static inline __m256i bf16x16_bits(__m512 v) {
    __m512i x = _mm512_castps_si512(v);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(1));
    __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(x, _mm512_set1_epi32(0x7fff)), lsb), 16);
    __m512i quiet_nan = _mm512_or_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(0x40));
    __m512i abs = _mm512_and_si512(x, _mm512_set1_epi32(0x7fffffff));
    __mmask16 is_nan = _mm512_cmpgt_epi32_mask(abs, _mm512_set1_epi32(0x7f800000));
    return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(is_nan, rounded, quiet_nan));
}

static inline __mmask16 tail_mask16(int64_t k) { return (__mmask16)((1u << k) - 1); }

BUBO_TARGET_AVX512 static void vec_dot_f32_f32_avx512(int n, float *restrict s, const void *restrict vx, const void *restrict vy) {
    const float *x = vx, *y = vy;
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    int i = 0;
    for (; i + 64 <= n; i += 64)
        for (int k = 0; k < 4; k++)
            acc[k] = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 16 * k), _mm512_loadu_ps(y + i + 16 * k), acc[k]);
    for (; i + 16 <= n; i += 16) acc[0] = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i), acc[0]);
    if (i < n) {
        __mmask16 m = tail_mask16(n - i);
        acc[1] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i), acc[1]);
    }
    *s = bubo_hsum_f32x16(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
}

BUBO_TARGET_AVX512 static void f16_to_float_avx512(const void *restrict vx, float *restrict y, int64_t n) {
    const bubo_f16 *x = vx;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(x + i))));
    if (i < n) {
        __mmask16 m = tail_mask16(n - i);
        _mm512_mask_storeu_ps(y + i, m, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, x + i)));
    }
}

BUBO_TARGET_AVX512 static void f16_from_float_avx512(const float *restrict x, void *restrict vy, int64_t n) {
    bubo_f16 *y = vy;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(y + i),
                            _mm512_cvtps_ph(_mm512_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    if (i < n) {
        __mmask16 m = tail_mask16(n - i);
        __m256i h = _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm256_mask_storeu_epi16(y + i, m, h);
    }
}

/* F16 x F32 at AVX-512, as at AVX2: one 16-lane accumulator per output, stepped by 16 in order,
 * the masked tail last, then its horizontal sum. (ggml sums in four chains; one chain lets the
 * tile hold a block of 4 rows x 6 tokens of outputs in registers in one pass over the weights,
 * where four chains take four passes or half the tokens: 1.25x as fast at 384 and 1,536 columns
 * x 12 tokens on Zen 5.) */
BUBO_TARGET_AVX512 static void vec_dot_f16_f32_avx512(int n, float *restrict s, const void *restrict vx, const void *restrict vy) {
    const bubo_f16 *x = vx;
    const float *y = vy;
    __m512 acc = _mm512_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16)
        acc = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(x + i))), _mm512_loadu_ps(y + i), acc);
    if (i < n) {
        __mmask16 m = tail_mask16(n - i);
        acc = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, x + i)), _mm512_maskz_loadu_ps(m, y + i), acc);
    }
    *s = bubo_hsum_f32x16(acc);
}

BUBO_TARGET_AVX512 static void bf16_to_float_avx512(const void *restrict vx, float *restrict y, int64_t n) {
    const bubo_bf16 *x = vx;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, load_bf16x16(x + i));
    if (i < n) {
        __mmask16 m = tail_mask16(n - i);
        _mm512_mask_storeu_ps(y + i, m, maskz_load_bf16x16(m, x + i));
    }
}

BUBO_TARGET_AVX512 static void bf16_from_float_avx512(const float *restrict x, void *restrict vy, int64_t n) {
    bubo_bf16 *y = vy;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm256_storeu_si256((__m256i *)(y + i), bf16x16_bits(_mm512_loadu_ps(x + i)));
    if (i < n) {
        __mmask16 m = tail_mask16(n - i);
        _mm256_mask_storeu_epi16(y + i, m, bf16x16_bits(_mm512_maskz_loadu_ps(m, x + i)));
    }
}

BUBO_TARGET_AVX512 static void vec_dot_bf16_f32_avx512(int n, float *restrict s, const void *restrict vx, const void *restrict vy) {
    const bubo_bf16 *x = vx;
    const float *y = vy;
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    int i = 0;
    for (; i + 64 <= n; i += 64)
        for (int k = 0; k < 4; k++)
            acc[k] = _mm512_fmadd_ps(load_bf16x16(x + i + 16 * k), _mm512_loadu_ps(y + i + 16 * k), acc[k]);
    for (; i + 16 <= n; i += 16) acc[0] = _mm512_fmadd_ps(load_bf16x16(x + i), _mm512_loadu_ps(y + i), acc[0]);
    if (i < n) {
        __mmask16 m = tail_mask16(n - i);
        acc[1] = _mm512_fmadd_ps(maskz_load_bf16x16(m, x + i), _mm512_maskz_loadu_ps(m, y + i), acc[1]);
    }
    *s = bubo_hsum_f32x16(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
}

/* Float weights at AVX-512 (F32, F16, BF16). F32's and BF16's vec_dots keep four 16-lane chains
 * per output (ggml's): chunk c of every 64 elements goes to chain c, the 16-element chunks past
 * the last 64 to chain 0, the masked tail to chain 1; then one reduce of (c0 + c1) + (c2 + c3).
 * The chains are independent, so the tile runs them one after the other (F32: a block of 4 rows x
 * up to 6 tokens holds one accumulator per output for the chain at hand) or two at a time (BF16:
 * 4 rows x up to 3 tokens). F16's has one chain, and its block of 4 rows x up to 6 tokens one
 * pass. Each weight chunk, loaded (and converted) once, feeds up to 6 or 3 FMAs where vec_dot
 * gives it one. Every output keeps vec_dot's operations in vec_dot's order, so it has vec_dot's
 * bits whatever the tile's shape (batch invariance). */
enum { F512_F32, F512_F16, F512_BF16 };
#define F512_ROWS 4
#define F512_TOKENS 6
#define F512_PAIR_TOKENS 3 /* BF16: f512_block_pairs */

BUBO_TARGET_AVX512 static inline __attribute__((always_inline)) __m512 f512_load(int kind, const void *x, int i) {
    if (kind == F512_F32) return _mm512_loadu_ps((const float *)x + i);
    if (kind == F512_F16) return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const bubo_f16 *)x + i)));
    return load_bf16x16((const bubo_bf16 *)x + i);
}

BUBO_TARGET_AVX512 static inline __attribute__((always_inline)) __m512 f512_load_tail(int kind, __mmask16 m, const void *x,
                                                                                   int i) {
    if (kind == F512_F32) return _mm512_maskz_loadu_ps(m, (const float *)x + i);
    if (kind == F512_F16) return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const bubo_f16 *)x + i));
    return maskz_load_bf16x16(m, (const bubo_bf16 *)x + i);
}

/* one 16-element chunk at i into the block's accumulators (m: the tail's mask, 0 for a whole chunk) */
BUBO_TARGET_AVX512 static inline __attribute__((always_inline)) void f512_chunk(int kind, int nt, int i, __mmask16 m,
                                                                             const void *const x[F512_ROWS],
                                                                             const float *const *y,
                                                                             __m512 a[F512_ROWS][F512_TOKENS]) {
    __m512 w[F512_ROWS];
    for (int r = 0; r < F512_ROWS; r++) w[r] = m ? f512_load_tail(kind, m, x[r], i) : f512_load(kind, x[r], i);
    for (int t = 0; t < nt; t++) {
        const __m512 v = m ? _mm512_maskz_loadu_ps(m, y[t] + i) : _mm512_loadu_ps(y[t] + i);
        for (int r = 0; r < F512_ROWS; r++) a[r][t] = _mm512_fmadd_ps(w[r], v, a[r][t]);
    }
}

/* f512_block for F16's one chain (vec_dot_f16_f32_avx512): a block of 4 rows x up to 6 tokens holds
 * every output's accumulator in registers through one pass over the weights. */
BUBO_TARGET_AVX512 static inline __attribute__((always_inline)) void f512_block_one(int kind, int nt, int n,
                                                                                 const void *const x[F512_ROWS],
                                                                                 const float *const *y, float *s,
                                                                                 size_t s_stride) {
    __m512 a[F512_ROWS][F512_TOKENS];
    for (int r = 0; r < F512_ROWS; r++)
        for (int t = 0; t < nt; t++) a[r][t] = _mm512_setzero_ps();
    const int n16 = n / 16 * 16;
    for (int i = 0; i < n16; i += 16) f512_chunk(kind, nt, i, 0, x, y, a);
    if (n16 < n) f512_chunk(kind, nt, n16, tail_mask16(n - n16), x, y, a);
    for (int t = 0; t < nt; t++)
        _mm_storeu_ps(s + (size_t)t * s_stride, bubo_hsum4_f32x16(a[0][t], a[1][t], a[2][t], a[3][t]));
}

/* outputs (rows x[0..3], tokens y[0..nt-1]) into s[t * s_stride + r], chain by chain (F16: its one) */
BUBO_TARGET_AVX512 static inline __attribute__((always_inline)) void f512_block(int kind, int nt, int n,
                                                                             const void *const x[F512_ROWS],
                                                                             const float *const *y, float *s,
                                                                             size_t s_stride) {
    if (kind == F512_F16) {
        f512_block_one(kind, nt, n, x, y, s, s_stride);
        return;
    }
    __m512 chain[4][F512_ROWS][F512_TOKENS];
    const int n64 = n / 64 * 64, n16 = n / 16 * 16;
    for (int c = 0; c < 4; c++) {
        __m512 a[F512_ROWS][F512_TOKENS];
        for (int r = 0; r < F512_ROWS; r++)
            for (int t = 0; t < nt; t++) a[r][t] = _mm512_setzero_ps();
        for (int i = 16 * c; i < n64; i += 64) f512_chunk(kind, nt, i, 0, x, y, a);
        if (c == 0)
            for (int i = n64; i < n16; i += 16) f512_chunk(kind, nt, i, 0, x, y, a);
        if (c == 1 && n16 < n) f512_chunk(kind, nt, n16, tail_mask16(n - n16), x, y, a);
        for (int r = 0; r < F512_ROWS; r++)
            for (int t = 0; t < nt; t++) chain[c][r][t] = a[r][t];
    }
    for (int t = 0; t < nt; t++) {
        __m512 sum[F512_ROWS];
        for (int r = 0; r < F512_ROWS; r++)
            sum[r] = _mm512_add_ps(_mm512_add_ps(chain[0][r][t], chain[1][r][t]), _mm512_add_ps(chain[2][r][t], chain[3][r][t]));
        _mm_storeu_ps(s + (size_t)t * s_stride, bubo_hsum4_f32x16(sum[0], sum[1], sum[2], sum[3]));
    }
}

/* f512_block for up to 3 tokens with the chains in pairs: chains 0 and 1 in one pass, their sum
 * kept in registers, then 2 and 3: the same operations per output in the same order, with half
 * the passes and a third of the spills. 7-9% faster for BF16 rows (and F16's, when they had four
 * chains) of 384 and 1536 on Zen 5, whose half-width weights leave room for the second chain's
 * loads; F32's full-width ones do not (12% slower), so F32 keeps f512_block. */
BUBO_TARGET_AVX512 static inline __attribute__((always_inline)) void f512_block_pairs(int kind, int nt, int n,
                                                                                   const void *const x[F512_ROWS],
                                                                                   const float *const *y, float *s,
                                                                                   size_t s_stride) {
    __m512 c01[F512_ROWS][F512_PAIR_TOKENS];
    const int n64 = n / 64 * 64, n16 = n / 16 * 16;
    for (int p = 0; p < 2; p++) {
        __m512 a[F512_ROWS][F512_TOKENS], b[F512_ROWS][F512_TOKENS]; /* f512_chunk's shape; nt used */
        for (int r = 0; r < F512_ROWS; r++)
            for (int t = 0; t < nt; t++) a[r][t] = b[r][t] = _mm512_setzero_ps();
        for (int i = 32 * p; i < n64; i += 64) {
            f512_chunk(kind, nt, i, 0, x, y, a);
            f512_chunk(kind, nt, i + 16, 0, x, y, b);
        }
        if (p == 0) {
            for (int i = n64; i < n16; i += 16) f512_chunk(kind, nt, i, 0, x, y, a);
            if (n16 < n) f512_chunk(kind, nt, n16, tail_mask16(n - n16), x, y, b);
        }
        for (int r = 0; r < F512_ROWS; r++)
            for (int t = 0; t < nt; t++)
                c01[r][t] = p == 0 ? _mm512_add_ps(a[r][t], b[r][t]) : _mm512_add_ps(c01[r][t], _mm512_add_ps(a[r][t], b[r][t]));
    }
    for (int t = 0; t < nt; t++)
        _mm_storeu_ps(s + (size_t)t * s_stride, bubo_hsum4_f32x16(c01[0][t], c01[1][t], c01[2][t], c01[3][t]));
}

/* a block of 4 rows and tokens t .. t + nt - 1, nt the rest up to F512_TOKENS: each count its own
 * code (BF16: blocks of up to 3 tokens, f512_block_pairs) */
BUBO_TARGET_AVX512 static inline __attribute__((always_inline)) void f512_rows_tokens(int kind, int n, const void *const xs[F512_ROWS],
                                                                                   const uint8_t *yb, size_t y_stride,
                                                                                   int t, int n_tokens, float *s,
                                                                                   size_t s_stride) {
    const int nt = n_tokens - t < F512_TOKENS ? n_tokens - t : F512_TOKENS;
    const float *ys[F512_TOKENS];
    for (int j = 0; j < nt; j++) ys[j] = (const float *)(yb + (size_t)(t + j) * y_stride);
    float *out = s + (size_t)t * s_stride;
    if (kind == F512_BF16) { /* F512_PAIR_TOKENS a block, the chains in pairs */
        for (int j = 0; j < nt; j += F512_PAIR_TOKENS) {
            const int m = nt - j < F512_PAIR_TOKENS ? nt - j : F512_PAIR_TOKENS;
            if (m == 3) f512_block_pairs(kind, 3, n, xs, ys + j, out + (size_t)j * s_stride, s_stride);
            else if (m == 2) f512_block_pairs(kind, 2, n, xs, ys + j, out + (size_t)j * s_stride, s_stride);
            else f512_block_pairs(kind, 1, n, xs, ys + j, out + (size_t)j * s_stride, s_stride);
        }
        return;
    }
    switch (nt) { /* F32: four chains, F16: one (f512_block_one) */
    case 6: f512_block(kind, 6, n, xs, ys, out, s_stride); break;
    case 5: f512_block(kind, 5, n, xs, ys, out, s_stride); break;
    case 4: f512_block(kind, 4, n, xs, ys, out, s_stride); break;
    case 3: f512_block(kind, 3, n, xs, ys, out, s_stride); break;
    case 2: f512_block(kind, 2, n, xs, ys, out, s_stride); break;
    default: f512_block(kind, 1, n, xs, ys, out, s_stride); break;
    }
}

/* Rows outer while all the tokens' activations fit in L2 (the weights stream past once), tokens
 * outer past that (a chunk's rows stay in L2 while the tokens go by), as the AVX2 F16 tile. */
BUBO_TARGET_AVX512 static inline __attribute__((always_inline)) void f512_tile(int kind, bubo_vec_dot_fn vec_dot, int n,
                                                                            int n_rows, int n_tokens, float *restrict s,
                                                                            size_t s_stride, const void *restrict vx,
                                                                            size_t x_stride, const void *restrict vy,
                                                                            size_t y_stride) {
    const uint8_t *xb = vx, *yb = vy;
    if (n_tokens == 1 && kind != F512_F16) {
        /* a decode step: row by row, each row's chains side by side (the block's passes would
         * read a long row's weights four times, from L2: 1.3x slower at 8192 columns; F16's one
         * pass goes on to the blocks, four rows' chains side by side) */
        for (int r = 0; r < n_rows; r++) vec_dot(n, &s[r], xb + (size_t)r * x_stride, yb);
        return;
    }
    const int r4 = n_rows / F512_ROWS * F512_ROWS;
#define F512_XS(r) {xb + (size_t)(r) * x_stride, xb + (size_t)(r + 1) * x_stride, xb + (size_t)(r + 2) * x_stride, \
                    xb + (size_t)(r + 3) * x_stride}
    if ((size_t)n_tokens * (size_t)n * sizeof(float) <= F16_TILE_ROWS_OUTER_BYTES) {
        for (int r = 0; r < r4; r += F512_ROWS) {
            const void *const xs[F512_ROWS] = F512_XS(r);
            for (int t = 0; t < n_tokens; t += F512_TOKENS)
                f512_rows_tokens(kind, n, xs, yb, y_stride, t, n_tokens, s + r, s_stride);
        }
    } else {
        /* rows in chunks whose weights stay in L2 while the tokens go by, a block of tokens at a
         * time (its activations in L1 across the chunk's rows) */
        const int chunk = f16_tile_chunk_rows(n * (kind == F512_F32 ? 4 : 2), F512_CHUNK_BYTES, F512_ROWS);
        for (int r0 = 0; r0 < r4; r0 += chunk) {
            const int r1 = r0 + chunk < r4 ? r0 + chunk : r4;
            for (int t = 0; t < n_tokens; t += F512_TOKENS)
                for (int r = r0; r < r1; r += F512_ROWS) {
                    const void *const xs[F512_ROWS] = F512_XS(r);
                    f512_rows_tokens(kind, n, xs, yb, y_stride, t, n_tokens, s + r, s_stride);
                }
        }
    }
#undef F512_XS
    for (int r = r4; r < n_rows; r++) /* the rows past the last four */
        for (int t = 0; t < n_tokens; t++)
            vec_dot(n, &s[(size_t)t * s_stride + r], xb + (size_t)r * x_stride, yb + (size_t)t * y_stride);
}

#define BUBO_F512_TILE(name, kind, vec_dot)                                                                         \
    BUBO_TARGET_AVX512 static void name(int n, int n_rows, int n_tokens, float *restrict s, size_t s_stride,        \
                                        const void *restrict x, size_t x_stride, const void *restrict y,            \
                                        size_t y_stride) {                                                          \
        f512_tile(kind, vec_dot, n, n_rows, n_tokens, s, s_stride, x, x_stride, y, y_stride);                       \
    }
BUBO_F512_TILE(tile_f32_f32_avx512, F512_F32, vec_dot_f32_f32_avx512)
BUBO_F512_TILE(tile_f16_f32_avx512, F512_F16, vec_dot_f16_f32_avx512)
BUBO_F512_TILE(tile_bf16_f32_avx512, F512_BF16, vec_dot_bf16_f32_avx512)

#endif /* BUBO_X86 */

/* ---- NEON ---------------------------------------------------------------------------------
 * fcvt rounds with FPCR's mode, round-to-nearest-even unless a program changes it. */
#if defined(BUBO_ARM64)

static inline float32x4_t neon_load_f16x4(const bubo_f16 *p) {
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p)));
}

static inline float32x4_t neon_load_bf16x4(const bubo_bf16 *p) {
    return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p), 16));
}

static inline uint16x4_t neon_bf16x4_bits(float32x4_t v) {
    uint32x4_t x = vreinterpretq_u32_f32(v);
    uint32x4_t lsb = vandq_u32(vshrq_n_u32(x, 16), vdupq_n_u32(1));
    uint32x4_t rounded = vshrq_n_u32(vaddq_u32(vaddq_u32(x, vdupq_n_u32(0x7fff)), lsb), 16);
    uint32x4_t quiet_nan = vorrq_u32(vshrq_n_u32(x, 16), vdupq_n_u32(0x40));
    uint32x4_t is_nan = vcgtq_u32(vandq_u32(x, vdupq_n_u32(0x7fffffff)), vdupq_n_u32(0x7f800000));
    return vmovn_u32(vbslq_u32(is_nan, quiet_nan, rounded));
}

static void vec_dot_f32_f32_neon(int n, float *restrict s, const void *restrict vx, const void *restrict vy) {
    const float *x = vx, *y = vy;
    float32x4_t acc[4] = {vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0)};
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int k = 0; k < 4; k++) acc[k] = vfmaq_f32(acc[k], vld1q_f32(x + i + 4 * k), vld1q_f32(y + i + 4 * k));
    for (; i + 4 <= n; i += 4) acc[0] = vfmaq_f32(acc[0], vld1q_f32(x + i), vld1q_f32(y + i));
    float sum = vaddvq_f32(vaddq_f32(vaddq_f32(acc[0], acc[1]), vaddq_f32(acc[2], acc[3])));
    for (; i < n; i++) sum += x[i] * y[i];
    *s = sum;
}

static void f16_to_float_neon(const void *restrict vx, float *restrict y, int64_t n) {
    const bubo_f16 *x = vx;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, neon_load_f16x4(x + i));
    for (; i < n; i++) y[i] = bubo_f16_to_f32(x[i]);
}

static void f16_from_float_neon(const float *restrict x, void *restrict vy, int64_t n) {
    bubo_f16 *y = vy;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1_u16(y + i, vreinterpret_u16_f16(vcvt_f16_f32(vld1q_f32(x + i))));
    for (; i < n; i++) y[i] = bubo_f32_to_f16(x[i]);
}

static void vec_dot_f16_f32_neon(int n, float *restrict s, const void *restrict vx, const void *restrict vy) {
    const bubo_f16 *x = vx;
    const float *y = vy;
    float32x4_t acc[4] = {vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0)};
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int k = 0; k < 4; k++) acc[k] = vfmaq_f32(acc[k], neon_load_f16x4(x + i + 4 * k), vld1q_f32(y + i + 4 * k));
    for (; i + 4 <= n; i += 4) acc[0] = vfmaq_f32(acc[0], neon_load_f16x4(x + i), vld1q_f32(y + i));
    float sum = vaddvq_f32(vaddq_f32(vaddq_f32(acc[0], acc[1]), vaddq_f32(acc[2], acc[3])));
    for (; i < n; i++) sum += bubo_f16_to_f32(x[i]) * y[i];
    *s = sum;
}

static void bf16_to_float_neon(const void *restrict vx, float *restrict y, int64_t n) {
    const bubo_bf16 *x = vx;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, neon_load_bf16x4(x + i));
    for (; i < n; i++) y[i] = bubo_bf16_to_f32(x[i]);
}

static void bf16_from_float_neon(const float *restrict x, void *restrict vy, int64_t n) {
    bubo_bf16 *y = vy;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1_u16(y + i, neon_bf16x4_bits(vld1q_f32(x + i)));
    for (; i < n; i++) y[i] = bubo_f32_to_bf16(x[i]);
}

static void vec_dot_bf16_f32_neon(int n, float *restrict s, const void *restrict vx, const void *restrict vy) {
    const bubo_bf16 *x = vx;
    const float *y = vy;
    float32x4_t acc[4] = {vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0)};
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int k = 0; k < 4; k++) acc[k] = vfmaq_f32(acc[k], neon_load_bf16x4(x + i + 4 * k), vld1q_f32(y + i + 4 * k));
    for (; i + 4 <= n; i += 4) acc[0] = vfmaq_f32(acc[0], neon_load_bf16x4(x + i), vld1q_f32(y + i));
    float sum = vaddvq_f32(vaddq_f32(vaddq_f32(acc[0], acc[1]), vaddq_f32(acc[2], acc[3])));
    for (; i < n; i++) sum += bubo_bf16_to_f32(x[i]) * y[i];
    *s = sum;
}

#endif /* BUBO_ARM64 */

/* ---- registration ------------------------------------------------------------------------- */

/* vec_dot looped over a tile, where no SIMD tile exists */
BUBO_LOOP_TILE(loop_tile_f32_f32_scalar, vec_dot_f32_f32_scalar)
BUBO_LOOP_TILE(loop_tile_f16_f32_scalar, vec_dot_f16_f32_scalar)
BUBO_LOOP_TILE(loop_tile_bf16_f32_scalar, vec_dot_bf16_f32_scalar)
#if defined(BUBO_X86)
BUBO_LOOP_TILE(loop_tile_f32_f32_avx2, vec_dot_f32_f32_avx2)
BUBO_LOOP_TILE(loop_tile_bf16_f32_avx2, vec_dot_bf16_f32_avx2)
#endif
#if defined(BUBO_ARM64)
BUBO_LOOP_TILE(loop_tile_f32_f32_neon, vec_dot_f32_f32_neon)
BUBO_LOOP_TILE(loop_tile_f16_f32_neon, vec_dot_f16_f32_neon)
BUBO_LOOP_TILE(loop_tile_bf16_f32_neon, vec_dot_bf16_f32_neon)
#endif

void bubo_register_float(bubo_type_traits *table) {
    bubo_type_traits *f32 = &table[BUBO_TYPE_F32], *f16 = &table[BUBO_TYPE_F16], *bf16 = &table[BUBO_TYPE_BF16];
    f32->supported = f16->supported = bf16->supported = 1;
    f32->vec_dot_type = f16->vec_dot_type = bf16->vec_dot_type = BUBO_TYPE_F32;

    /* Scalar only: the copy is the best at every level, and the lookup falls back to it. */
    f32->to_float[BUBO_ISA_SCALAR] = f32_copy;
    f32->from_float[BUBO_ISA_SCALAR] = f32_copy_from;
    f32->vec_dot[BUBO_ISA_SCALAR] = vec_dot_f32_f32_scalar;
    f32->vec_dot_tile[BUBO_ISA_SCALAR] = loop_tile_f32_f32_scalar;
    f16->to_float[BUBO_ISA_SCALAR] = f16_to_float_scalar;
    f16->from_float[BUBO_ISA_SCALAR] = f16_from_float_scalar;
    f16->vec_dot[BUBO_ISA_SCALAR] = vec_dot_f16_f32_scalar;
    f16->vec_dot_tile[BUBO_ISA_SCALAR] = loop_tile_f16_f32_scalar;
    bf16->to_float[BUBO_ISA_SCALAR] = bf16_to_float_scalar;
    bf16->from_float[BUBO_ISA_SCALAR] = bf16_from_float_scalar;
    bf16->vec_dot[BUBO_ISA_SCALAR] = vec_dot_bf16_f32_scalar;
    bf16->vec_dot_tile[BUBO_ISA_SCALAR] = loop_tile_bf16_f32_scalar;
#if defined(BUBO_X86)
    f32->vec_dot[BUBO_ISA_AVX2] = vec_dot_f32_f32_avx2;
    f32->vec_dot_tile[BUBO_ISA_AVX2] = loop_tile_f32_f32_avx2;
    f16->to_float[BUBO_ISA_AVX2] = f16_to_float_avx2;
    f16->from_float[BUBO_ISA_AVX2] = f16_from_float_avx2;
    f16->vec_dot[BUBO_ISA_AVX2] = vec_dot_f16_f32_avx2;
    f16->vec_dot_tile[BUBO_ISA_AVX2] = tile_f16_f32_avx2;
    bf16->to_float[BUBO_ISA_AVX2] = bf16_to_float_avx2;
    bf16->from_float[BUBO_ISA_AVX2] = bf16_from_float_avx2;
    bf16->vec_dot[BUBO_ISA_AVX2] = vec_dot_bf16_f32_avx2;
    bf16->vec_dot_tile[BUBO_ISA_AVX2] = loop_tile_bf16_f32_avx2;

    f32->vec_dot[BUBO_ISA_AVX512] = vec_dot_f32_f32_avx512;

    f32->vec_dot_tile[BUBO_ISA_AVX512] = tile_f32_f32_avx512;
    f16->to_float[BUBO_ISA_AVX512] = f16_to_float_avx512;
    f16->from_float[BUBO_ISA_AVX512] = f16_from_float_avx512;
    f16->vec_dot[BUBO_ISA_AVX512] = vec_dot_f16_f32_avx512;
    f16->vec_dot_tile[BUBO_ISA_AVX512] = tile_f16_f32_avx512;
    bf16->to_float[BUBO_ISA_AVX512] = bf16_to_float_avx512;
    bf16->from_float[BUBO_ISA_AVX512] = bf16_from_float_avx512;
    bf16->vec_dot[BUBO_ISA_AVX512] = vec_dot_bf16_f32_avx512;
    bf16->vec_dot_tile[BUBO_ISA_AVX512] = tile_bf16_f32_avx512;
#endif
#if defined(BUBO_ARM64)
    f32->vec_dot[BUBO_ISA_NEON] = vec_dot_f32_f32_neon;
    f32->vec_dot_tile[BUBO_ISA_NEON] = loop_tile_f32_f32_neon;
    f16->to_float[BUBO_ISA_NEON] = f16_to_float_neon;
    f16->from_float[BUBO_ISA_NEON] = f16_from_float_neon;
    f16->vec_dot[BUBO_ISA_NEON] = vec_dot_f16_f32_neon;
    f16->vec_dot_tile[BUBO_ISA_NEON] = loop_tile_f16_f32_neon;
    bf16->to_float[BUBO_ISA_NEON] = bf16_to_float_neon;
    bf16->from_float[BUBO_ISA_NEON] = bf16_from_float_neon;
    bf16->vec_dot[BUBO_ISA_NEON] = vec_dot_bf16_f32_neon;
    bf16->vec_dot_tile[BUBO_ISA_NEON] = loop_tile_bf16_f32_neon;
#endif
}
