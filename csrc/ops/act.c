/* Activations: SiLU, GELU (tanh approximation and exact erf), and the gated forms
 * swiglu = silu(gate) * up, geglu = gelu(gate) * up.
 *
 * Every variant of every activation is one loop shape around a per-element function (vmath.h),
 * so the loops are stamped out by macros: a unary y = f(x) and a gated y = f(gate) * up. */
#include "ops_internal.h"

#define UNARY_SCALAR(name, f)                                                          \
    static void name##_scalar(int64_t n, float *y, const float *x) {                   \
        for (int64_t i = 0; i < n; i++) y[i] = f(x[i]);                                \
    }
#define GATED_SCALAR(name, f)                                                                   \
    static void name##_scalar(int64_t n, float *y, const float *gate, const float *up) {        \
        for (int64_t i = 0; i < n; i++) y[i] = f(gate[i]) * up[i];                              \
    }

UNARY_SCALAR(silu, vm_silu_ref)
UNARY_SCALAR(gelu, vm_gelu_ref)
UNARY_SCALAR(gelu_erf, vm_gelu_erf_ref)
GATED_SCALAR(swiglu, vm_silu_ref)
GATED_SCALAR(geglu, vm_gelu_ref)

#if defined(BUBO_X86)

#define UNARY_AVX2(name, vf, f)                                                                \
    BUBO_TARGET_AVX2 static void name##_avx2(int64_t n, float *y, const float *x) {           \
        int64_t i = 0;                                                                         \
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, vf(_mm256_loadu_ps(x + i)));        \
        for (; i < n; i++) y[i] = f(x[i]);                                                     \
    }
#define GATED_AVX2(name, vf, f)                                                                          \
    BUBO_TARGET_AVX2 static void name##_avx2(int64_t n, float *y, const float *gate, const float *up) { \
        int64_t i = 0;                                                                                   \
        for (; i + 8 <= n; i += 8)                                                                       \
            _mm256_storeu_ps(y + i, _mm256_mul_ps(vf(_mm256_loadu_ps(gate + i)), _mm256_loadu_ps(up + i))); \
        for (; i < n; i++) y[i] = f(gate[i]) * up[i];                                                    \
    }
/* AVX-512 tails run the vector function under a mask, so every element takes the same path. */
#define UNARY_AVX512(name, vf)                                                                 \
    BUBO_TARGET_AVX512 static void name##_avx512(int64_t n, float *y, const float *x) {       \
        for (int64_t i = 0; i < n; i += 16) {                                                  \
            __mmask16 m = i + 16 <= n ? (__mmask16)0xffff : vm_tail_mask16(n - i);             \
            _mm512_mask_storeu_ps(y + i, m, vf(_mm512_maskz_loadu_ps(m, x + i)));              \
        }                                                                                      \
    }
#define GATED_AVX512(name, vf)                                                                               \
    BUBO_TARGET_AVX512 static void name##_avx512(int64_t n, float *y, const float *gate, const float *up) { \
        for (int64_t i = 0; i < n; i += 16) {                                                                \
            __mmask16 m = i + 16 <= n ? (__mmask16)0xffff : vm_tail_mask16(n - i);                           \
            __m512 g = vf(_mm512_maskz_loadu_ps(m, gate + i));                                               \
            _mm512_mask_storeu_ps(y + i, m, _mm512_mul_ps(g, _mm512_maskz_loadu_ps(m, up + i)));             \
        }                                                                                                    \
    }

UNARY_AVX2(silu, vm_silu_avx2, vm_silu_ref)
UNARY_AVX2(gelu, vm_gelu_avx2, vm_gelu_ref)
UNARY_AVX2(gelu_erf, vm_gelu_erf_avx2, vm_gelu_erf_ref)
GATED_AVX2(swiglu, vm_silu_avx2, vm_silu_ref)
GATED_AVX2(geglu, vm_gelu_avx2, vm_gelu_ref)

UNARY_AVX512(silu, vm_silu_avx512)
UNARY_AVX512(gelu, vm_gelu_avx512)
UNARY_AVX512(gelu_erf, vm_gelu_erf_avx512)
GATED_AVX512(swiglu, vm_silu_avx512)
GATED_AVX512(geglu, vm_gelu_avx512)

#endif

#if defined(BUBO_ARM64)

#define UNARY_NEON(name, vf, f)                                                \
    static void name##_neon(int64_t n, float *y, const float *x) {             \
        int64_t i = 0;                                                         \
        for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vf(vld1q_f32(x + i)));     \
        for (; i < n; i++) y[i] = f(x[i]);                                     \
    }
#define GATED_NEON(name, vf, f)                                                                 \
    static void name##_neon(int64_t n, float *y, const float *gate, const float *up) {          \
        int64_t i = 0;                                                                          \
        for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vmulq_f32(vf(vld1q_f32(gate + i)), vld1q_f32(up + i))); \
        for (; i < n; i++) y[i] = f(gate[i]) * up[i];                                           \
    }

UNARY_NEON(silu, vm_silu_neon, vm_silu_ref)
UNARY_NEON(gelu, vm_gelu_neon, vm_gelu_ref)
UNARY_NEON(gelu_erf, vm_gelu_erf_neon, vm_gelu_erf_ref)
GATED_NEON(swiglu, vm_silu_neon, vm_silu_ref)
GATED_NEON(geglu, vm_gelu_neon, vm_gelu_ref)

#endif

#define REGISTER_ACT(t, suffix)          \
    do {                                 \
        (t).silu = silu_##suffix;         \
        (t).gelu = gelu_##suffix;         \
        (t).gelu_erf = gelu_erf_##suffix; \
        (t).swiglu = swiglu_##suffix;     \
        (t).geglu = geglu_##suffix;       \
    } while (0)

void bubo_register_act(bubo_ops *tables) {
    REGISTER_ACT(tables[BUBO_ISA_SCALAR], scalar);
#if defined(BUBO_X86)
    REGISTER_ACT(tables[BUBO_ISA_AVX2], avx2);
    REGISTER_ACT(tables[BUBO_ISA_AVX512], avx512);
#endif
#if defined(BUBO_ARM64)
    REGISTER_ACT(tables[BUBO_ISA_NEON], neon);
#endif
}
