/* Elementwise add, mul and scale: the residual connections, norm weights and attention scales
 * between the bigger ops. Memory-bound; the SIMD variants exist so that a level's table is
 * whole and the baseline x86-64 build (SSE2) is not what runs on an AVX-512 machine. */
#include "ops_internal.h"

static void add_scalar(int64_t n, float *z, const float *x, const float *y) {
    for (int64_t i = 0; i < n; i++) z[i] = x[i] + y[i];
}
static void mul_scalar(int64_t n, float *z, const float *x, const float *y) {
    for (int64_t i = 0; i < n; i++) z[i] = x[i] * y[i];
}
static void scale_scalar(int64_t n, float *y, const float *x, float s) {
    for (int64_t i = 0; i < n; i++) y[i] = x[i] * s;
}

#if defined(BUBO_X86)

#define BINARY_AVX2(name, vop, op)                                                                  \
    BUBO_TARGET_AVX2 static void name##_avx2(int64_t n, float *z, const float *x, const float *y) { \
        int64_t i = 0;                                                                              \
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(z + i, vop(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i))); \
        for (; i < n; i++) z[i] = x[i] op y[i];                                                     \
    }
#define BINARY_AVX512(name, vop)                                                                        \
    BUBO_TARGET_AVX512 static void name##_avx512(int64_t n, float *z, const float *x, const float *y) { \
        for (int64_t i = 0; i < n; i += 16) {                                                           \
            __mmask16 m = i + 16 <= n ? (__mmask16)0xffff : vm_tail_mask16(n - i);                      \
            _mm512_mask_storeu_ps(z + i, m, vop(_mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i))); \
        }                                                                                               \
    }

BINARY_AVX2(add, _mm256_add_ps, +)
BINARY_AVX2(mul, _mm256_mul_ps, *)
BINARY_AVX512(add, _mm512_add_ps)
BINARY_AVX512(mul, _mm512_mul_ps)

BUBO_TARGET_AVX2 static void scale_avx2(int64_t n, float *y, const float *x, float s) {
    const __m256 vs = _mm256_set1_ps(s);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), vs));
    for (; i < n; i++) y[i] = x[i] * s;
}

BUBO_TARGET_AVX512 static void scale_avx512(int64_t n, float *y, const float *x, float s) {
    const __m512 vs = _mm512_set1_ps(s);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = i + 16 <= n ? (__mmask16)0xffff : vm_tail_mask16(n - i);
        _mm512_mask_storeu_ps(y + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), vs));
    }
}

#endif

#if defined(BUBO_ARM64)

#define BINARY_NEON(name, vop, op)                                                        \
    static void name##_neon(int64_t n, float *z, const float *x, const float *y) {        \
        int64_t i = 0;                                                                    \
        for (; i + 4 <= n; i += 4) vst1q_f32(z + i, vop(vld1q_f32(x + i), vld1q_f32(y + i))); \
        for (; i < n; i++) z[i] = x[i] op y[i];                                           \
    }

BINARY_NEON(add, vaddq_f32, +)
BINARY_NEON(mul, vmulq_f32, *)

static void scale_neon(int64_t n, float *y, const float *x, float s) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vmulq_n_f32(vld1q_f32(x + i), s));
    for (; i < n; i++) y[i] = x[i] * s;
}

#endif

#define REGISTER_ELEMENTWISE(t, suffix) \
    do {                                \
        (t).add = add_##suffix;         \
        (t).mul = mul_##suffix;         \
        (t).scale = scale_##suffix;     \
    } while (0)

void bubo_register_elementwise(bubo_ops *tables) {
    REGISTER_ELEMENTWISE(tables[BUBO_ISA_SCALAR], scalar);
#if defined(BUBO_X86)
    REGISTER_ELEMENTWISE(tables[BUBO_ISA_AVX2], avx2);
    REGISTER_ELEMENTWISE(tables[BUBO_ISA_AVX512], avx512);
#endif
#if defined(BUBO_ARM64)
    REGISTER_ELEMENTWISE(tables[BUBO_ISA_NEON], neon);
#endif
}
