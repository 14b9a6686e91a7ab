/* Shared by the block-family files: registration hooks, the ISA target attributes and small
 * helpers. Each family file fills its types' rows of the table in its bubo_register_* function. */
#ifndef BUBO_QUANTS_INTERNAL_H
#define BUBO_QUANTS_INTERNAL_H

#include <math.h>
#include <string.h>

#include "bubo/quants.h"

#if defined(__x86_64__) || defined(_M_X64)
#define BUBO_X86 1
#include <immintrin.h>
/* Compile one function for a level above the baseline; the table only calls it where cpuid says yes. */
#define BUBO_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#define BUBO_TARGET_AVX512 \
    __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512dq")))
#endif

#if defined(BUBO_X86)
/* The horizontal sums of an AVX2 register, one per width (AVX-512's float ones below). */
BUBO_TARGET_AVX2 static inline float bubo_hsum_f32x8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

BUBO_TARGET_AVX2 static inline int32_t bubo_hsum_i32x8(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
}

/* The sum of a vector's 16 lanes as a fixed tree: lanes j and j + 8, then j and j + 4, then j and
 * j + 2, then 0 and 1 (GCC's _mm512_reduce_add_ps, written out so that no compiler's choice of
 * tree can move a bit). bubo_hsum4_f32x16 sums four vectors with the same tree at once: a tile
 * that reduces its outputs four at a time keeps exactly its vec_dot's bits. */
BUBO_TARGET_AVX512 static inline __attribute__((always_inline)) float bubo_hsum_f32x16(__m512 v) {
    const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    const __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    const __m128 p = _mm_add_ps(q, _mm_permute_ps(q, _MM_SHUFFLE(1, 0, 3, 2)));
    return _mm_cvtss_f32(_mm_add_ss(p, _mm_movehdup_ps(p)));
}

/* {bubo_hsum_f32x16(a), bubo_hsum_f32x16(b), bubo_hsum_f32x16(c), bubo_hsum_f32x16(d)} */
BUBO_TARGET_AVX512 static inline __attribute__((always_inline)) __m128 bubo_hsum4_f32x16(__m512 a, __m512 b, __m512 c, __m512 d) {
    /* lanes j + j + 8: quarters {a0+a2, a1+a3, b0+b2, b1+b3}, likewise c and d */
    const __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                                    _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
    const __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, _MM_SHUFFLE(1, 0, 1, 0)),
                                    _mm512_shuffle_f32x4(c, d, _MM_SHUFFLE(3, 2, 3, 2)));
    /* j + j + 4: quarter k holds vector k's four partial sums */
    const __m512 q = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(3, 1, 3, 1)));
    const __m512 p = _mm512_add_ps(q, _mm512_permute_ps(q, _MM_SHUFFLE(1, 0, 3, 2))); /* j + j + 2 */
    const __m512 r = _mm512_add_ps(p, _mm512_movehdup_ps(p));                        /* 0 + 1 */
    return _mm512_castps512_ps128(_mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 4, 8, 12, 0, 4, 8, 12, 0, 4, 8, 12), r));
}
#endif

#if defined(__aarch64__)
#define BUBO_ARM64 1
#include <arm_neon.h>
#endif

/* Each family file defines one of these; traits.c calls them all once. */
void bubo_register_float(bubo_type_traits *table); /* F32, F16, BF16 */
void bubo_register_q4(bubo_type_traits *table);    /* Q4_0, Q4_1 */
void bubo_register_q5(bubo_type_traits *table);    /* Q5_0, Q5_1 */
void bubo_register_q8(bubo_type_traits *table);    /* Q8_0, Q8_1 (weights and activations) */
void bubo_register_q2_k(bubo_type_traits *table);
void bubo_register_q3_k(bubo_type_traits *table);
void bubo_register_q4_k(bubo_type_traits *table);
void bubo_register_q5_k(bubo_type_traits *table);
void bubo_register_q6_k(bubo_type_traits *table);
void bubo_register_q8_k(bubo_type_traits *table); /* Q8_K activations */

/* The tile every vec_dot has until a SIMD tile replaces it: vec_dot per (row, token), a weight
 * row dotted with every token of the tile while it is in L1. */
#define BUBO_LOOP_TILE(tile_name, vec_dot_name)                                                            \
    static void tile_name(int n, int n_rows, int n_tokens, float *restrict s, size_t s_stride,             \
                          const void *restrict x, size_t x_stride, const void *restrict y, size_t y_stride) { \
        const uint8_t *xb = x, *yb = y;                                                                   \
        for (int r = 0; r < n_rows; r++)                                                                  \
            for (int t = 0; t < n_tokens; t++)                                                            \
                vec_dot_name(n, &s[(size_t)t * s_stride + r], xb + (size_t)r * x_stride, yb + (size_t)t * y_stride); \
    }

static inline float bubo_h2f(bubo_f16 h) { return bubo_f16_to_f32(h); }
static inline bubo_f16 bubo_f2h(float f) { return bubo_f32_to_f16(f); }

#endif
