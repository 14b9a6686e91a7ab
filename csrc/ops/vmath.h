/* Vector math shared by the op kernels: exp, and the activations built on it, per level.
 *
 * exp(x) = 2^n * e^r with n = round(x / ln 2) and |r| <= ln2 / 2; e^r is Cephes' expf
 * polynomial (degree 7 counting 1 + r), good to about 1 ulp on that interval. 2^n is applied as
 * two factors 2^(n/2) * 2^(n - n/2) so that results near FLT_MAX and in the subnormal range
 * come out right (AVX-512 has vscalefps for this). x is clamped to [EXP_LO, EXP_HI], just past
 * where exp under- and overflows, which keeps n within reach of the two factors; nan
 * propagates through the clamps.
 *
 * SiLU and the tanh GELU are written as x * sigmoid(.) since 0.5 x (1 + tanh(u)) = x / (1 + e^-2u):
 * one exp, no cancellation for negative x, and the same formula as the scalar reference. */
#ifndef BUBO_OPS_VMATH_H
#define BUBO_OPS_VMATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "quants/quants_internal.h" /* BUBO_X86 / BUBO_ARM64, the target attributes, intrinsics */

#define VM_EXP_HI 88.8f   /* exp overflows above 88.7228 */
#define VM_EXP_LO -104.0f /* exp(x) rounds to 0 below -103.97 */
#define VM_LOG2E 1.44269504088896341f
#define VM_LN2_HI 0.693359375f     /* ln 2 = HI + LO, HI with few bits so n * HI is exact */
#define VM_LN2_LO -2.12194440e-4f
#define VM_EXP_P0 1.9875691500e-4f /* Cephes expf: e^r ~ 1 + r + r^2 (P5 + P4 r + ... + P0 r^5) */
#define VM_EXP_P1 1.3981999507e-3f
#define VM_EXP_P2 8.3334519073e-3f
#define VM_EXP_P3 4.1665795894e-2f
#define VM_EXP_P4 1.6666665459e-1f
#define VM_EXP_P5 5.0000001201e-1f

#define VM_SQRT_2_OVER_PI 0.79788456080286536f
#define VM_GELU_COEF_A 0.044715f
#define VM_SQRT1_2 0.70710678118654752f
/* erfc(z) ~ t exp(-z^2 + P(t)), t = 1 / (1 + z/2), z >= 0, with P of degree 9 (Numerical Recipes'
 * erfcc, after W. J. Cody): relative error below 1.2e-7 everywhere, so 0.5 x erfc(-x / sqrt 2)
 * keeps its relative accuracy far into the negative tail. */
static const float vm_erfc_coef[10] = { /* P's coefficients, highest degree first (Horner) */
    0.17087277f, -0.82215223f, 1.48851587f, -1.13520398f, 0.27886807f,
    -0.18628806f, 0.09678418f, 0.37409196f, 1.00002368f, -1.26551223f,
};

/* ---- scalar references (libm) ------------------------------------------------------------- */

static inline float vm_silu_ref(float x) { return x / (1.0f + expf(-x)); }

static inline float vm_gelu_ref(float x) {
    float u = VM_SQRT_2_OVER_PI * x * (1.0f + VM_GELU_COEF_A * x * x);
    return x / (1.0f + expf(-2.0f * u));
}

/* 1 + erf(x) = erfc(-x): no cancellation for negative x */
static inline float vm_gelu_erf_ref(float x) { return 0.5f * x * erfcf(-x * VM_SQRT1_2); }

/* The vector exp lane for lane, for a scalar fallback that must give the same bits as the SIMD
 * levels: every step is the same IEEE operation (fmaf is the fused multiply-add they use). For
 * results in the normal range the two-factor scaling is exact, like vscalefps; below it the levels
 * may round subnormals differently. */
static inline float vm_exp_lanewise(float x) {
    x = fmaxf(VM_EXP_LO, fminf(VM_EXP_HI, x));
    float n = rintf(x * VM_LOG2E);
    float r = fmaf(-n, VM_LN2_HI, x);
    r = fmaf(-n, VM_LN2_LO, r);
    float p = VM_EXP_P0;
    p = fmaf(p, r, VM_EXP_P1);
    p = fmaf(p, r, VM_EXP_P2);
    p = fmaf(p, r, VM_EXP_P3);
    p = fmaf(p, r, VM_EXP_P4);
    p = fmaf(p, r, VM_EXP_P5);
    const float r2 = r * r;
    p = fmaf(p, r2, r) + 1.0f;
    const int32_t ni = (int32_t)n, n1 = ni >> 1, n2 = ni - n1;
    const uint32_t b1 = (uint32_t)(n1 + 127) << 23, b2 = (uint32_t)(n2 + 127) << 23;
    float s1, s2;
    memcpy(&s1, &b1, sizeof s1);
    memcpy(&s2, &b2, sizeof s2);
    return p * s1 * s2;
}

/* ---- AVX2 ----------------------------------------------------------------------------------- */
#if defined(BUBO_X86)

BUBO_TARGET_AVX2 static inline float vm_hmax_avx2(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

BUBO_TARGET_AVX2 static inline __m256 vm_exp_avx2(__m256 x) {
    /* the constant first: min/max return their second operand when either is nan */
    x = _mm256_max_ps(_mm256_set1_ps(VM_EXP_LO), _mm256_min_ps(_mm256_set1_ps(VM_EXP_HI), x));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(VM_LOG2E)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(VM_LN2_HI), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(VM_LN2_LO), r);
    __m256 p = _mm256_set1_ps(VM_EXP_P0);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(VM_EXP_P1));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(VM_EXP_P2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(VM_EXP_P3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(VM_EXP_P4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(VM_EXP_P5));
    p = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
    __m256i ni = _mm256_cvtps_epi32(n); /* in [-150, 128] */
    __m256i n1 = _mm256_srai_epi32(ni, 1), n2 = _mm256_sub_epi32(ni, n1);
    __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, _mm256_set1_epi32(127)), 23));
    __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, _mm256_set1_epi32(127)), 23));
    return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
}

BUBO_TARGET_AVX2 static inline __m256 vm_silu_avx2(__m256 x) {
    __m256 one = _mm256_set1_ps(1.0f);
    return _mm256_div_ps(x, _mm256_add_ps(one, vm_exp_avx2(_mm256_sub_ps(_mm256_setzero_ps(), x))));
}

BUBO_TARGET_AVX2 static inline __m256 vm_gelu_avx2(__m256 x) {
    __m256 one = _mm256_set1_ps(1.0f);
    __m256 inner = _mm256_fmadd_ps(_mm256_mul_ps(x, x), _mm256_set1_ps(VM_GELU_COEF_A), one);
    __m256 minus_2u = _mm256_mul_ps(_mm256_mul_ps(x, inner), _mm256_set1_ps(-2.0f * VM_SQRT_2_OVER_PI));
    return _mm256_div_ps(x, _mm256_add_ps(one, vm_exp_avx2(minus_2u)));
}

/* 0.5 x (1 + erf(x / sqrt 2)) = x * (0.5 erfc(|z|)) for x < 0 (no cancellation), x * (1 - 0.5 erfc(z)) for
 * x >= 0 (and +inf stays inf) */
BUBO_TARGET_AVX2 static inline __m256 vm_gelu_erf_avx2(__m256 x) {
    __m256 z = _mm256_mul_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.0f), x), _mm256_set1_ps(VM_SQRT1_2));
    __m256 t = _mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_fmadd_ps(z, _mm256_set1_ps(0.5f), _mm256_set1_ps(1.0f)));
    __m256 poly = _mm256_set1_ps(vm_erfc_coef[0]);
    for (int k = 1; k < 10; k++) poly = _mm256_fmadd_ps(poly, t, _mm256_set1_ps(vm_erfc_coef[k]));
    __m256 erfc = _mm256_mul_ps(t, vm_exp_avx2(_mm256_fnmadd_ps(z, z, poly)));
    __m256 half_erfc = _mm256_mul_ps(_mm256_set1_ps(0.5f), erfc);
    __m256 neg = _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_LT_OQ);
    return _mm256_mul_ps(x, _mm256_blendv_ps(_mm256_sub_ps(_mm256_set1_ps(1.0f), half_erfc), half_erfc, neg));
}

/* ---- AVX-512 -------------------------------------------------------------------------------- */

/* exp(x) = p * 2^n: the polynomial p of the reduced argument, and n (the clamped x's). */
BUBO_TARGET_AVX512 static inline __m512 vm_exp_parts_avx512(__m512 x, __m512 *n_out) {
    x = _mm512_max_ps(_mm512_set1_ps(VM_EXP_LO), _mm512_min_ps(_mm512_set1_ps(VM_EXP_HI), x));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(VM_LOG2E)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(VM_LN2_HI), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(VM_LN2_LO), r);
    __m512 p = _mm512_set1_ps(VM_EXP_P0);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(VM_EXP_P1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(VM_EXP_P2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(VM_EXP_P3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(VM_EXP_P4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(VM_EXP_P5));
    *n_out = n;
    return _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
}

BUBO_TARGET_AVX512 static inline __m512 vm_exp_avx512(__m512 x) {
    __m512 n;
    const __m512 p = vm_exp_parts_avx512(x, &n);
    return _mm512_scalef_ps(p, n); /* p * 2^n, overflow to inf and subnormals handled */
}

/* vm_exp_lanewise on 16 lanes: the same operations (two-factor scaling, as vm_exp_avx2, not
 * vscalefps), so a lane's result is the scalar function's bits, subnormals included. */
BUBO_TARGET_AVX512 static inline __m512 vm_exp_lanewise_avx512(__m512 x) {
    __m512 n;
    const __m512 p = vm_exp_parts_avx512(x, &n);
    const __m512i ni = _mm512_cvtps_epi32(n), n1 = _mm512_srai_epi32(ni, 1), n2 = _mm512_sub_epi32(ni, n1);
    const __m512 s1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(n1, _mm512_set1_epi32(127)), 23));
    const __m512 s2 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(n2, _mm512_set1_epi32(127)), 23));
    return _mm512_mul_ps(_mm512_mul_ps(p, s1), s2);
}

BUBO_TARGET_AVX512 static inline __m512 vm_silu_avx512(__m512 x) {
    __m512 one = _mm512_set1_ps(1.0f);
    return _mm512_div_ps(x, _mm512_add_ps(one, vm_exp_avx512(_mm512_sub_ps(_mm512_setzero_ps(), x))));
}

BUBO_TARGET_AVX512 static inline __m512 vm_gelu_avx512(__m512 x) {
    __m512 one = _mm512_set1_ps(1.0f);
    __m512 inner = _mm512_fmadd_ps(_mm512_mul_ps(x, x), _mm512_set1_ps(VM_GELU_COEF_A), one);
    __m512 minus_2u = _mm512_mul_ps(_mm512_mul_ps(x, inner), _mm512_set1_ps(-2.0f * VM_SQRT_2_OVER_PI));
    return _mm512_div_ps(x, _mm512_add_ps(one, vm_exp_avx512(minus_2u)));
}

BUBO_TARGET_AVX512 static inline __m512 vm_gelu_erf_avx512(__m512 x) {
    __m512 z = _mm512_mul_ps(_mm512_abs_ps(x), _mm512_set1_ps(VM_SQRT1_2));
    __m512 t = _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_fmadd_ps(z, _mm512_set1_ps(0.5f), _mm512_set1_ps(1.0f)));
    __m512 poly = _mm512_set1_ps(vm_erfc_coef[0]);
    for (int k = 1; k < 10; k++) poly = _mm512_fmadd_ps(poly, t, _mm512_set1_ps(vm_erfc_coef[k]));
    __m512 erfc = _mm512_mul_ps(t, vm_exp_avx512(_mm512_fnmadd_ps(z, z, poly)));
    __m512 half_erfc = _mm512_mul_ps(_mm512_set1_ps(0.5f), erfc);
    __mmask16 neg = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ);
    return _mm512_mul_ps(x, _mm512_mask_blend_ps(neg, _mm512_sub_ps(_mm512_set1_ps(1.0f), half_erfc), half_erfc));
}

static inline __mmask16 vm_tail_mask16(int64_t k) { return (__mmask16)((1u << k) - 1); }

#endif /* BUBO_X86 */

/* ---- NEON ----------------------------------------------------------------------------------- */
#if defined(BUBO_ARM64)

static inline float32x4_t vm_exp_neon(float32x4_t x) {
    x = vmaxq_f32(vdupq_n_f32(VM_EXP_LO), vminq_f32(vdupq_n_f32(VM_EXP_HI), x));
    float32x4_t n = vrndnq_f32(vmulq_n_f32(x, VM_LOG2E));
    float32x4_t r = vfmsq_f32(x, n, vdupq_n_f32(VM_LN2_HI));
    r = vfmsq_f32(r, n, vdupq_n_f32(VM_LN2_LO));
    float32x4_t p = vdupq_n_f32(VM_EXP_P0);
    p = vfmaq_f32(vdupq_n_f32(VM_EXP_P1), p, r);
    p = vfmaq_f32(vdupq_n_f32(VM_EXP_P2), p, r);
    p = vfmaq_f32(vdupq_n_f32(VM_EXP_P3), p, r);
    p = vfmaq_f32(vdupq_n_f32(VM_EXP_P4), p, r);
    p = vfmaq_f32(vdupq_n_f32(VM_EXP_P5), p, r);
    p = vaddq_f32(vfmaq_f32(r, p, vmulq_f32(r, r)), vdupq_n_f32(1.0f));
    int32x4_t ni = vcvtq_s32_f32(n);
    int32x4_t n1 = vshrq_n_s32(ni, 1), n2 = vsubq_s32(ni, n1);
    float32x4_t s1 = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(n1, vdupq_n_s32(127)), 23));
    float32x4_t s2 = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(n2, vdupq_n_s32(127)), 23));
    return vmulq_f32(vmulq_f32(p, s1), s2);
}

static inline float32x4_t vm_silu_neon(float32x4_t x) {
    return vdivq_f32(x, vaddq_f32(vdupq_n_f32(1.0f), vm_exp_neon(vnegq_f32(x))));
}

static inline float32x4_t vm_gelu_neon(float32x4_t x) {
    float32x4_t inner = vfmaq_f32(vdupq_n_f32(1.0f), vmulq_f32(x, x), vdupq_n_f32(VM_GELU_COEF_A));
    float32x4_t minus_2u = vmulq_n_f32(vmulq_f32(x, inner), -2.0f * VM_SQRT_2_OVER_PI);
    return vdivq_f32(x, vaddq_f32(vdupq_n_f32(1.0f), vm_exp_neon(minus_2u)));
}

static inline float32x4_t vm_gelu_erf_neon(float32x4_t x) {
    float32x4_t z = vmulq_n_f32(vabsq_f32(x), VM_SQRT1_2);
    float32x4_t t = vdivq_f32(vdupq_n_f32(1.0f), vfmaq_f32(vdupq_n_f32(1.0f), z, vdupq_n_f32(0.5f)));
    float32x4_t poly = vdupq_n_f32(vm_erfc_coef[0]);
    for (int k = 1; k < 10; k++) poly = vfmaq_f32(vdupq_n_f32(vm_erfc_coef[k]), poly, t);
    float32x4_t erfc = vmulq_f32(t, vm_exp_neon(vfmsq_f32(poly, z, z)));
    float32x4_t half_erfc = vmulq_n_f32(erfc, 0.5f);
    uint32x4_t neg = vcltq_f32(x, vdupq_n_f32(0.0f));
    return vmulq_f32(x, vbslq_f32(neg, half_erfc, vsubq_f32(vdupq_n_f32(1.0f), half_erfc)));
}

#endif /* BUBO_ARM64 */

#endif
