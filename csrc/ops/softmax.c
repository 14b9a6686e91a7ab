/* Softmax in place: x = softmax(x * scale + mask), max-subtracted so exp never overflows.
 *
 * Three passes: scale, mask and track the max; exponentiate and sum; normalize. A row masked
 * everywhere (max = -inf) becomes zeros rather than 0/0. The reference sums in double. */
#include "ops_internal.h"

static void softmax_zero(int64_t n, float *x) { memset(x, 0, (size_t)n * sizeof *x); }

static void softmax_scalar(int64_t n, float *x, float scale, const float *mask) {
    float max = -INFINITY;
    for (int64_t i = 0; i < n; i++) {
        float v = x[i] * scale;
        if (mask) v += mask[i];
        x[i] = v;
        max = v > max ? v : max;
    }
    if (max == -INFINITY) {
        softmax_zero(n, x);
        return;
    }
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) {
        x[i] = expf(x[i] - max);
        sum += x[i];
    }
    const float inv = (float)(1.0 / sum);
    for (int64_t i = 0; i < n; i++) x[i] *= inv;
}

#if defined(BUBO_X86)

BUBO_TARGET_AVX2 static void softmax_avx2(int64_t n, float *x, float scale, const float *mask) {
    const __m256 vscale = _mm256_set1_ps(scale);
    __m256 vmax = _mm256_set1_ps(-INFINITY);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), vscale);
        if (mask) v = _mm256_add_ps(v, _mm256_loadu_ps(mask + i));
        _mm256_storeu_ps(x + i, v);
        vmax = _mm256_max_ps(vmax, v);
    }
    float max = vm_hmax_avx2(vmax);
    for (; i < n; i++) {
        float v = x[i] * scale;
        if (mask) v += mask[i];
        x[i] = v;
        max = v > max ? v : max;
    }
    if (max == -INFINITY) {
        softmax_zero(n, x);
        return;
    }

    const __m256 vmax_b = _mm256_set1_ps(max);
    __m256 vsum = _mm256_setzero_ps();
    for (i = 0; i + 8 <= n; i += 8) {
        __m256 e = vm_exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(x + i), vmax_b));
        _mm256_storeu_ps(x + i, e);
        vsum = _mm256_add_ps(vsum, e);
    }
    float sum = bubo_hsum_f32x8(vsum);
    for (; i < n; i++) {
        x[i] = expf(x[i] - max);
        sum += x[i];
    }

    const float inv = 1.0f / sum;
    const __m256 vinv = _mm256_set1_ps(inv);
    for (i = 0; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), vinv));
    for (; i < n; i++) x[i] *= inv;
}

BUBO_TARGET_AVX512 static void softmax_avx512(int64_t n, float *x, float scale, const float *mask) {
    const __m512 vscale = _mm512_set1_ps(scale);
    __m512 vmax = _mm512_set1_ps(-INFINITY);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = i + 16 <= n ? (__mmask16)0xffff : vm_tail_mask16(n - i);
        __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), vscale);
        if (mask) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, mask + i));
        _mm512_mask_storeu_ps(x + i, m, v);
        vmax = _mm512_mask_max_ps(vmax, m, vmax, v);
    }
    const float max = _mm512_reduce_max_ps(vmax);
    if (max == -INFINITY) {
        softmax_zero(n, x);
        return;
    }

    const __m512 vmax_b = _mm512_set1_ps(max);
    __m512 vsum = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = i + 16 <= n ? (__mmask16)0xffff : vm_tail_mask16(n - i);
        __m512 e = vm_exp_avx512(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), vmax_b));
        _mm512_mask_storeu_ps(x + i, m, e);
        vsum = _mm512_mask_add_ps(vsum, m, vsum, e);
    }

    const __m512 vinv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(vsum));
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = i + 16 <= n ? (__mmask16)0xffff : vm_tail_mask16(n - i);
        _mm512_mask_storeu_ps(x + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), vinv));
    }
}

#endif

#if defined(BUBO_ARM64)

static void softmax_neon(int64_t n, float *x, float scale, const float *mask) {
    float32x4_t vmax = vdupq_n_f32(-INFINITY);
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        float32x4_t v = vmulq_n_f32(vld1q_f32(x + i), scale);
        if (mask) v = vaddq_f32(v, vld1q_f32(mask + i));
        vst1q_f32(x + i, v);
        vmax = vmaxq_f32(vmax, v);
    }
    float max = vmaxvq_f32(vmax);
    for (; i < n; i++) {
        float v = x[i] * scale;
        if (mask) v += mask[i];
        x[i] = v;
        max = v > max ? v : max;
    }
    if (max == -INFINITY) {
        softmax_zero(n, x);
        return;
    }

    const float32x4_t vmax_b = vdupq_n_f32(max);
    float32x4_t vsum = vdupq_n_f32(0);
    for (i = 0; i + 4 <= n; i += 4) {
        float32x4_t e = vm_exp_neon(vsubq_f32(vld1q_f32(x + i), vmax_b));
        vst1q_f32(x + i, e);
        vsum = vaddq_f32(vsum, e);
    }
    float sum = vaddvq_f32(vsum);
    for (; i < n; i++) {
        x[i] = expf(x[i] - max);
        sum += x[i];
    }

    const float inv = 1.0f / sum;
    for (i = 0; i + 4 <= n; i += 4) vst1q_f32(x + i, vmulq_n_f32(vld1q_f32(x + i), inv));
    for (; i < n; i++) x[i] *= inv;
}

#endif

void bubo_register_softmax(bubo_ops *tables) {
    tables[BUBO_ISA_SCALAR].softmax = softmax_scalar;
#if defined(BUBO_X86)
    tables[BUBO_ISA_AVX2].softmax = softmax_avx2;
    tables[BUBO_ISA_AVX512].softmax = softmax_avx512;
#endif
#if defined(BUBO_ARM64)
    tables[BUBO_ISA_NEON].softmax = softmax_neon;
#endif
}
