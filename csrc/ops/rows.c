/* Dot products of one vector with strided f32 rows, and the weighted sum of such rows: an
 * encoder's attention, whose keys and values are the chunk's own activation rows (row j of a
 * head at base + j * stride). The scalar level keeps eight partial sums per dot; the SIMD levels
 * sum a row in vector lanes, four rows' sums reduced together by the tree each row's sum takes
 * alone (a row's score does not depend on how many rows there are). */
#include "ops_internal.h"

static void dot_rows_scalar(int n_rows, int len, const float *x, const float *rows, int64_t stride, float *out) {
    for (int j = 0; j < n_rows; j++) {
        const float *r = rows + (size_t)j * (size_t)stride;
        float acc[8] = {0};
        int i = 0;
        for (; i + 8 <= len; i += 8)
            for (int u = 0; u < 8; u++) acc[u] += x[i + u] * r[i + u];
        float s = 0.0f;
        for (; i < len; i++) s += x[i] * r[i];
        for (int u = 0; u < 8; u++) s += acc[u];
        out[j] = s;
    }
}

static void sum_rows_scalar(int n_rows, int len, const float *w, const float *rows, int64_t stride, float *out) {
    memset(out, 0, (size_t)len * sizeof *out);
    for (int j = 0; j < n_rows; j++) {
        const float *r = rows + (size_t)j * (size_t)stride;
        for (int i = 0; i < len; i++) out[i] += w[j] * r[i];
    }
}

#if defined(BUBO_X86)

BUBO_TARGET_AVX2 static inline __m256 dot8_avx2(int len, const float *x, const float *r) {
    __m256 acc = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= len; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(r + i), acc);
    if (i < len) {
        const __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(len - i), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        acc = _mm256_fmadd_ps(_mm256_maskload_ps(x + i, m), _mm256_maskload_ps(r + i, m), acc);
    }
    return acc;
}

/* {sum of a, of b, of c, of d}: pairs of lanes, then per half the pairs' pairs, then the halves */
BUBO_TARGET_AVX2 static inline __m128 hsum4_avx2(__m256 a, __m256 b, __m256 c, __m256 d) {
    /* {a0+a1, a2+a3, b0+b1, b2+b3 | a4+a5, a6+a7, b4+b5, b6+b7}, likewise c and d; then per half
     * {a, b, c, d} over that half's lanes */
    const __m256 s = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
    return _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
}

/* every row's sum by the same tree, the last rows' as the groups of four's */
BUBO_TARGET_AVX2 static void dot_rows_avx2(int n_rows, int len, const float *x, const float *rows, int64_t stride,
                                           float *out) {
    int j = 0;
    for (; j + 4 <= n_rows; j += 4) {
        const float *r = rows + (size_t)j * (size_t)stride;
        _mm_storeu_ps(out + j, hsum4_avx2(dot8_avx2(len, x, r), dot8_avx2(len, x, r + stride),
                                          dot8_avx2(len, x, r + 2 * stride), dot8_avx2(len, x, r + 3 * stride)));
    }
    for (; j < n_rows; j++) {
        const __m256 a = dot8_avx2(len, x, rows + (size_t)j * (size_t)stride);
        out[j] = _mm_cvtss_f32(hsum4_avx2(a, a, a, a));
    }
}

BUBO_TARGET_AVX2 static void sum_rows_avx2(int n_rows, int len, const float *w, const float *rows, int64_t stride,
                                           float *out) {
    int i = 0;
    for (; i + 8 <= len; i += 8) {
        __m256 acc = _mm256_setzero_ps();
        for (int j = 0; j < n_rows; j++)
            acc = _mm256_fmadd_ps(_mm256_set1_ps(w[j]), _mm256_loadu_ps(rows + (size_t)j * (size_t)stride + i), acc);
        _mm256_storeu_ps(out + i, acc);
    }
    for (; i < len; i++) {
        float s = 0.0f;
        for (int j = 0; j < n_rows; j++) s += w[j] * rows[(size_t)j * (size_t)stride + i];
        out[i] = s;
    }
}

BUBO_TARGET_AVX512 static inline __m512 dot16_avx512(int len, const float *x, const float *r) {
    __m512 acc = _mm512_setzero_ps();
    for (int i = 0; i < len; i += 16) {
        const __mmask16 m = i + 16 <= len ? (__mmask16)0xffff : vm_tail_mask16(len - i);
        acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, r + i), acc);
    }
    return acc;
}

BUBO_TARGET_AVX512 static void dot_rows_avx512(int n_rows, int len, const float *x, const float *rows, int64_t stride,
                                               float *out) {
    int j = 0;
    for (; j + 4 <= n_rows; j += 4) {
        const float *r = rows + (size_t)j * (size_t)stride;
        _mm_storeu_ps(out + j, bubo_hsum4_f32x16(dot16_avx512(len, x, r), dot16_avx512(len, x, r + stride),
                                                 dot16_avx512(len, x, r + 2 * stride),
                                                 dot16_avx512(len, x, r + 3 * stride)));
    }
    for (; j < n_rows; j++) out[j] = bubo_hsum_f32x16(dot16_avx512(len, x, rows + (size_t)j * (size_t)stride));
}

BUBO_TARGET_AVX512 static void sum_rows_avx512(int n_rows, int len, const float *w, const float *rows, int64_t stride,
                                               float *out) {
    for (int i = 0; i < len; i += 16) {
        const __mmask16 m = i + 16 <= len ? (__mmask16)0xffff : vm_tail_mask16(len - i);
        __m512 acc = _mm512_setzero_ps();
        for (int j = 0; j < n_rows; j++)
            acc = _mm512_fmadd_ps(_mm512_set1_ps(w[j]), _mm512_maskz_loadu_ps(m, rows + (size_t)j * (size_t)stride + i), acc);
        _mm512_mask_storeu_ps(out + i, m, acc);
    }
}

#endif

#if defined(BUBO_ARM64)

static inline float32x4_t dot4_neon(int len, const float *x, const float *r) {
    float32x4_t acc = vdupq_n_f32(0);
    int i = 0;
    for (; i + 4 <= len; i += 4) acc = vfmaq_f32(acc, vld1q_f32(x + i), vld1q_f32(r + i));
    float tail[4] = {0};
    for (int k = 0; i < len; i++, k++) tail[k] = x[i] * r[i];
    return vaddq_f32(acc, vld1q_f32(tail));
}

static void dot_rows_neon(int n_rows, int len, const float *x, const float *rows, int64_t stride, float *out) {
    int j = 0;
    for (; j + 4 <= n_rows; j += 4) {
        const float *r = rows + (size_t)j * (size_t)stride;
        const float32x4_t a = dot4_neon(len, x, r), b = dot4_neon(len, x, r + stride);
        const float32x4_t c = dot4_neon(len, x, r + 2 * stride), d = dot4_neon(len, x, r + 3 * stride);
        vst1q_f32(out + j, vpaddq_f32(vpaddq_f32(a, b), vpaddq_f32(c, d)));
    }
    for (; j < n_rows; j++) out[j] = vaddvq_f32(dot4_neon(len, x, rows + (size_t)j * (size_t)stride));
}

static void sum_rows_neon(int n_rows, int len, const float *w, const float *rows, int64_t stride, float *out) {
    int i = 0;
    for (; i + 4 <= len; i += 4) {
        float32x4_t acc = vdupq_n_f32(0);
        for (int j = 0; j < n_rows; j++) acc = vfmaq_n_f32(acc, vld1q_f32(rows + (size_t)j * (size_t)stride + i), w[j]);
        vst1q_f32(out + i, acc);
    }
    for (; i < len; i++) {
        float s = 0.0f;
        for (int j = 0; j < n_rows; j++) s += w[j] * rows[(size_t)j * (size_t)stride + i];
        out[i] = s;
    }
}

#endif

void bubo_register_rows(bubo_ops *tables) {
    tables[BUBO_ISA_SCALAR].dot_rows = dot_rows_scalar;
    tables[BUBO_ISA_SCALAR].sum_rows = sum_rows_scalar;
#if defined(BUBO_X86)
    tables[BUBO_ISA_AVX2].dot_rows = dot_rows_avx2;
    tables[BUBO_ISA_AVX2].sum_rows = sum_rows_avx2;
    tables[BUBO_ISA_AVX512].dot_rows = dot_rows_avx512;
    tables[BUBO_ISA_AVX512].sum_rows = sum_rows_avx512;
#endif
#if defined(BUBO_ARM64)
    tables[BUBO_ISA_NEON].dot_rows = dot_rows_neon;
    tables[BUBO_ISA_NEON].sum_rows = sum_rows_neon;
#endif
}
