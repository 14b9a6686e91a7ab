/* Sixteen 16-lane vectors reduced at once, vector i's result in lane i: the adds (or maxes)
 * transpose the lanes as they go, 8 + 4 + 2 + 1 of them in all instead of 16 horizontal
 * reductions. Used where sixteen rows are reduced together: attention's scores and softmax
 * (ops/attention.c), the activation quantizers' 16 blocks at a time (q8.c). */
#ifndef BUBO_REDUCE16_H
#define BUBO_REDUCE16_H

#include "quants_internal.h"

#if defined(BUBO_X86)

/* 16 vectors v[p] -> their sums, v[p]'s in lane p, each in the order of attention's sum16_tree
 * (lanes i and i + 8, then i and i + 4, then pairs); exact for integers below 2^24. */
BUBO_TARGET_AVX512 static inline __m512 reduce16_avx512(const __m512 *v) {
    __m512 a[8], b[4], c[2];
    for (int k = 0; k < 8; k++) /* lanes 0-7: position 2k's (i, i + 8) sums, 8-15: 2k + 1's */
        a[k] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    for (int k = 0; k < 4; k++) /* 128-bit lane j: position 4k + j's (i, i + 4) sums */
        b[k] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * k], a[2 * k + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_f32x4(a[2 * k], a[2 * k + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    for (int k = 0; k < 2; k++) /* 128-bit lane j: (0 + 2, 1 + 3) of positions 8k + j, 8k + 4 + j */
        c[k] = _mm512_add_ps(_mm512_shuffle_ps(b[2 * k], b[2 * k + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(b[2 * k], b[2 * k + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    const __m512 r = _mm512_add_ps(_mm512_shuffle_ps(c[0], c[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm512_shuffle_ps(c[0], c[1], _MM_SHUFFLE(3, 1, 3, 1))); /* lane 4j + m: j + 4m */
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), r);
}

/* 16 rows' 16-lane vectors v[i] -> each row's maximum, row i in lane i (max is exact in any order). */
BUBO_TARGET_AVX512 static inline __m512 reduce16_max_avx512(const __m512 *v) {
    __m512 a[8], b[4], c[2];
    for (int k = 0; k < 8; k++)
        a[k] = _mm512_max_ps(_mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    for (int k = 0; k < 4; k++)
        b[k] = _mm512_max_ps(_mm512_shuffle_f32x4(a[2 * k], a[2 * k + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_f32x4(a[2 * k], a[2 * k + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    for (int k = 0; k < 2; k++)
        c[k] = _mm512_max_ps(_mm512_shuffle_ps(b[2 * k], b[2 * k + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(b[2 * k], b[2 * k + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    const __m512 r = _mm512_max_ps(_mm512_shuffle_ps(c[0], c[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm512_shuffle_ps(c[0], c[1], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), r);
}

#endif /* BUBO_X86 */
#endif
