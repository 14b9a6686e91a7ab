/* Dot products of one vector with strided f32 rows, and the weighted sum of such rows: an
 * encoder's attention, whose keys and values are the chunk's own activation rows (row j of a
 * head at base + j * stride). The scalar level keeps eight partial sums per dot; the SIMD levels
 * sum a row in vector lanes, four rows' sums reduced together. */
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

BUBO_TARGET_AVX2 static void dot_rows_avx2(int n_rows, int len, const float *x, const float *rows, int64_t stride,
                                           float *out) {
    int j = 0;
    for (; j + 4 <= n_rows; j += 4) {
        const float *r = rows + (size_t)j * (size_t)stride;
        const __m256 a = dot8_avx2(len, x, r), b = dot8_avx2(len, x, r + stride);
        const __m256 c = dot8_avx2(len, x, r + 2 * stride), d = dot8_avx2(len, x, r + 3 * stride);
        /* {a0+a1, b0+b1, a2+a3, b2+b3 | the same of the high halves}, likewise c, d */
        const __m256 ab = _mm256_hadd_ps(a, b), cd = _mm256_hadd_ps(c, d);
        const __m256 s = _mm256_hadd_ps(ab, cd); /* per half: a, b, c, d */
        _mm_storeu_ps(out + j, _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1)));
    }
    for (; j < n_rows; j++) out[j] = bubo_hsum_f32x8(dot8_avx2(len, x, rows + (size_t)j * (size_t)stride));
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
        const __m512 a = dot16_avx512(len, x, r), b = dot16_avx512(len, x, r + stride);
        const __m512 c = dot16_avx512(len, x, r + 2 * stride), d = dot16_avx512(len, x, r + 3 * stride);
        /* halves added: {a, b} and {c, d} in 8 lanes each, then quarters: a, b, c, d in 4 each */
        const __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                                        _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
        const __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, _MM_SHUFFLE(1, 0, 1, 0)),
                                        _mm512_shuffle_f32x4(c, d, _MM_SHUFFLE(3, 2, 3, 2)));
        const __m512 q = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(2, 0, 2, 0)),
                                       _mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(3, 1, 3, 1)));
        /* each quarter's four lanes: two horizontal adds leave its sum in every lane */
        const __m512 p = _mm512_add_ps(q, _mm512_permute_ps(q, _MM_SHUFFLE(1, 0, 3, 2)));
        const __m512 s = _mm512_add_ps(p, _mm512_permute_ps(p, _MM_SHUFFLE(2, 3, 0, 1)));
        _mm_storeu_ps(out + j, _mm512_castps512_ps128(
                                   _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), s)));
    }
    for (; j < n_rows; j++) out[j] = _mm512_reduce_add_ps(dot16_avx512(len, x, rows + (size_t)j * (size_t)stride));
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
