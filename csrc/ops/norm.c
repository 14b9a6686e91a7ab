/* RMSNorm: y = x / sqrt(mean(x^2) + eps) * w.
 * LayerNorm: y = (x - mean(x)) / sqrt(mean((x - mean)^2) + eps) * w + b (two passes: the mean,
 * then the squares of the centered values).
 *
 * The references sum in double, as ggml does; the SIMD variants keep f32 lanes (rows are at most
 * a few thousand elements of activations, far from where that loses digits). */
#include "ops_internal.h"

static void rms_norm_scalar(int64_t n, float *y, const float *x, const float *w, float eps) {
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) sum += (double)x[i] * (double)x[i];
    const float scale = 1.0f / sqrtf((float)(sum / (double)n) + eps);
    if (w)
        for (int64_t i = 0; i < n; i++) y[i] = x[i] * scale * w[i];
    else
        for (int64_t i = 0; i < n; i++) y[i] = x[i] * scale;
}

/* one element of LayerNorm's output: the scalar level's, and the SIMD levels' tails */
static inline float layer_norm_one(float x, float mean, float inv, const float *w, const float *b, int64_t i) {
    return (x - mean) * inv * (w ? w[i] : 1.0f) + (b ? b[i] : 0.0f);
}

static void layer_norm_scalar(int64_t n, float *y, const float *x, const float *w, const float *b, float eps) {
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) sum += x[i];
    const float mean = (float)(sum / (double)n);
    double var = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const float d = x[i] - mean;
        var += (double)d * d;
    }
    const float inv = (float)(1.0 / sqrt(var / (double)n + (double)eps));
    for (int64_t i = 0; i < n; i++) y[i] = layer_norm_one(x[i], mean, inv, w, b, i);
}

#if defined(BUBO_X86)

BUBO_TARGET_AVX2 static void rms_norm_avx2(int64_t n, float *y, const float *x, const float *w, float eps) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + 8);
        acc0 = _mm256_fmadd_ps(a, a, acc0);
        acc1 = _mm256_fmadd_ps(b, b, acc1);
    }
    float sum = bubo_hsum_f32x8(_mm256_add_ps(acc0, acc1));
    for (; i < n; i++) sum += x[i] * x[i];
    const float scale = 1.0f / sqrtf(sum / (float)n + eps);

    const __m256 vscale = _mm256_set1_ps(scale);
    i = 0;
    if (w) {
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), vscale), _mm256_loadu_ps(w + i)));
        for (; i < n; i++) y[i] = x[i] * scale * w[i];
    } else {
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), vscale));
        for (; i < n; i++) y[i] = x[i] * scale;
    }
}

BUBO_TARGET_AVX512 static void rms_norm_avx512(int64_t n, float *y, const float *x, const float *w, float eps) {
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512 a = _mm512_loadu_ps(x + i), b = _mm512_loadu_ps(x + i + 16);
        acc0 = _mm512_fmadd_ps(a, a, acc0);
        acc1 = _mm512_fmadd_ps(b, b, acc1);
    }
    for (; i < n; i += 16) {
        __mmask16 m = i + 16 <= n ? (__mmask16)0xffff : vm_tail_mask16(n - i);
        __m512 a = _mm512_maskz_loadu_ps(m, x + i);
        acc0 = _mm512_fmadd_ps(a, a, acc0);
    }
    const float scale = 1.0f / sqrtf(_mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1)) / (float)n + eps);

    const __m512 vscale = _mm512_set1_ps(scale);
    for (i = 0; i < n; i += 16) {
        __mmask16 m = i + 16 <= n ? (__mmask16)0xffff : vm_tail_mask16(n - i);
        __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), vscale);
        if (w) v = _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, w + i));
        _mm512_mask_storeu_ps(y + i, m, v);
    }
}

BUBO_TARGET_AVX2 static void layer_norm_avx2(int64_t n, float *y, const float *x, const float *w, const float *b, float eps) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_add_ps(s0, _mm256_loadu_ps(x + i));
        s1 = _mm256_add_ps(s1, _mm256_loadu_ps(x + i + 8));
    }
    float sum = bubo_hsum_f32x8(_mm256_add_ps(s0, s1));
    for (int64_t k = i; k < n; k++) sum += x[k];
    const float mean = sum / (float)n;
    const __m256 vmean = _mm256_set1_ps(mean);
    s0 = s1 = _mm256_setzero_ps();
    for (i = 0; i + 16 <= n; i += 16) {
        const __m256 d0 = _mm256_sub_ps(_mm256_loadu_ps(x + i), vmean), d1 = _mm256_sub_ps(_mm256_loadu_ps(x + i + 8), vmean);
        s0 = _mm256_fmadd_ps(d0, d0, s0);
        s1 = _mm256_fmadd_ps(d1, d1, s1);
    }
    float var = bubo_hsum_f32x8(_mm256_add_ps(s0, s1));
    for (int64_t k = i; k < n; k++) var += (x[k] - mean) * (x[k] - mean);
    const float inv = 1.0f / sqrtf(var / (float)n + eps);
    const __m256 vinv = _mm256_set1_ps(inv);
    for (i = 0; i + 8 <= n; i += 8) {
        __m256 v = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), vmean), vinv);
        if (w) v = _mm256_mul_ps(v, _mm256_loadu_ps(w + i));
        if (b) v = _mm256_add_ps(v, _mm256_loadu_ps(b + i));
        _mm256_storeu_ps(y + i, v);
    }
    for (; i < n; i++) y[i] = layer_norm_one(x[i], mean, inv, w, b, i);
}

BUBO_TARGET_AVX512 static void layer_norm_avx512(int64_t n, float *y, const float *x, const float *w, const float *b,
                                                 float eps) {
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm512_add_ps(s0, _mm512_loadu_ps(x + i));
        s1 = _mm512_add_ps(s1, _mm512_loadu_ps(x + i + 16));
    }
    for (; i < n; i += 16)
        s0 = _mm512_add_ps(s0, _mm512_maskz_loadu_ps(i + 16 <= n ? (__mmask16)0xffff : vm_tail_mask16(n - i), x + i));
    const float mean = _mm512_reduce_add_ps(_mm512_add_ps(s0, s1)) / (float)n;
    const __m512 vmean = _mm512_set1_ps(mean);
    s0 = s1 = _mm512_setzero_ps();
    for (i = 0; i + 32 <= n; i += 32) {
        const __m512 d0 = _mm512_sub_ps(_mm512_loadu_ps(x + i), vmean);
        const __m512 d1 = _mm512_sub_ps(_mm512_loadu_ps(x + i + 16), vmean);
        s0 = _mm512_fmadd_ps(d0, d0, s0);
        s1 = _mm512_fmadd_ps(d1, d1, s1);
    }
    for (; i < n; i += 16) {
        const __mmask16 m = i + 16 <= n ? (__mmask16)0xffff : vm_tail_mask16(n - i);
        const __m512 d = _mm512_maskz_sub_ps(m, _mm512_maskz_loadu_ps(m, x + i), vmean);
        s0 = _mm512_fmadd_ps(d, d, s0);
    }
    const __m512 vinv = _mm512_set1_ps(1.0f / sqrtf(_mm512_reduce_add_ps(_mm512_add_ps(s0, s1)) / (float)n + eps));
    for (i = 0; i < n; i += 16) {
        const __mmask16 m = i + 16 <= n ? (__mmask16)0xffff : vm_tail_mask16(n - i);
        __m512 v = _mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), vmean), vinv);
        if (w) v = _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, w + i));
        if (b) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, b + i));
        _mm512_mask_storeu_ps(y + i, m, v);
    }
}

#endif

#if defined(BUBO_ARM64)

static void rms_norm_neon(int64_t n, float *y, const float *x, const float *w, float eps) {
    float32x4_t acc0 = vdupq_n_f32(0), acc1 = vdupq_n_f32(0);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        float32x4_t a = vld1q_f32(x + i), b = vld1q_f32(x + i + 4);
        acc0 = vfmaq_f32(acc0, a, a);
        acc1 = vfmaq_f32(acc1, b, b);
    }
    float sum = vaddvq_f32(vaddq_f32(acc0, acc1));
    for (; i < n; i++) sum += x[i] * x[i];
    const float scale = 1.0f / sqrtf(sum / (float)n + eps);

    i = 0;
    if (w) {
        for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vmulq_f32(vmulq_n_f32(vld1q_f32(x + i), scale), vld1q_f32(w + i)));
        for (; i < n; i++) y[i] = x[i] * scale * w[i];
    } else {
        for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vmulq_n_f32(vld1q_f32(x + i), scale));
        for (; i < n; i++) y[i] = x[i] * scale;
    }
}

static void layer_norm_neon(int64_t n, float *y, const float *x, const float *w, const float *b, float eps) {
    float32x4_t s0 = vdupq_n_f32(0), s1 = vdupq_n_f32(0);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        s0 = vaddq_f32(s0, vld1q_f32(x + i));
        s1 = vaddq_f32(s1, vld1q_f32(x + i + 4));
    }
    float sum = vaddvq_f32(vaddq_f32(s0, s1));
    for (int64_t k = i; k < n; k++) sum += x[k];
    const float mean = sum / (float)n;
    const float32x4_t vmean = vdupq_n_f32(mean);
    s0 = s1 = vdupq_n_f32(0);
    for (i = 0; i + 8 <= n; i += 8) {
        const float32x4_t d0 = vsubq_f32(vld1q_f32(x + i), vmean), d1 = vsubq_f32(vld1q_f32(x + i + 4), vmean);
        s0 = vfmaq_f32(s0, d0, d0);
        s1 = vfmaq_f32(s1, d1, d1);
    }
    float var = vaddvq_f32(vaddq_f32(s0, s1));
    for (int64_t k = i; k < n; k++) var += (x[k] - mean) * (x[k] - mean);
    const float inv = 1.0f / sqrtf(var / (float)n + eps);
    for (i = 0; i + 4 <= n; i += 4) {
        float32x4_t v = vmulq_n_f32(vsubq_f32(vld1q_f32(x + i), vmean), inv);
        if (w) v = vmulq_f32(v, vld1q_f32(w + i));
        if (b) v = vaddq_f32(v, vld1q_f32(b + i));
        vst1q_f32(y + i, v);
    }
    for (; i < n; i++) y[i] = layer_norm_one(x[i], mean, inv, w, b, i);
}

#endif

void bubo_register_norm(bubo_ops *tables) {
    tables[BUBO_ISA_SCALAR].rms_norm = rms_norm_scalar;
    tables[BUBO_ISA_SCALAR].layer_norm = layer_norm_scalar;
#if defined(BUBO_X86)
    tables[BUBO_ISA_AVX2].rms_norm = rms_norm_avx2;
    tables[BUBO_ISA_AVX2].layer_norm = layer_norm_avx2;
    tables[BUBO_ISA_AVX512].rms_norm = rms_norm_avx512;
    tables[BUBO_ISA_AVX512].layer_norm = layer_norm_avx512;
#endif
#if defined(BUBO_ARM64)
    tables[BUBO_ISA_NEON].rms_norm = rms_norm_neon;
    tables[BUBO_ISA_NEON].layer_norm = layer_norm_neon;
#endif
}
