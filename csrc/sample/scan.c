/* The sampler's passes over a whole row of logits, per instruction set: the maximum, the sum of
 * exponentials for the raw log-softmax, and the k best tokens (top-k, greedy, n_probs).
 *
 * The sum is defined once for every level, so that a row gives the same bits on any machine:
 * element i contributes exp(x[i] - max), computed in float by vmath's exp (the difference rounded
 * to float first) and taken as 0 below SCAN_EXP_FLOOR, where it would be subnormal and the levels
 * could round it differently; the term goes to lane i % SCAN_LANES, each lane adds its terms in
 * index order in double, and the lanes are folded in halves (lane j += lane j + w, for w = 8, 4,
 * 2, 1). Against a double-precision sum this is off by about 1e-6 relative (float exp, and the
 * difference rounded to float), far below what a reported log-probability needs; the floor drops
 * less than n * 1e-38 of a sum that is at least 1.
 *
 * The selection keeps a heap of the k best seen so far, worst at the root; once it is full a
 * token can only enter by reaching the root's value, which the SIMD levels test a vector at a
 * time. Its result does not depend on the level. */
#include <math.h>
#include <string.h>

#include "ops/vmath.h"
#include "sample/sample_internal.h"

#define SCAN_LANES 16
#define SCAN_EXP_FLOOR -87.0f /* exp(-87) = 1.6e-38: just above FLT_MIN */

/* ---- the heap ------------------------------------------------------------------------------ */

/* the root is the worst kept token: lowest value, ties to the higher id */
static inline int heap_worse(const scored_token *a, const scored_token *b) {
    return a->logit < b->logit || (a->logit == b->logit && a->id > b->id);
}

static void heap_sift_down(scored_token *h, size_t n, size_t i) {
    for (;;) {
        size_t w = i, l = 2 * i + 1, r = l + 1;
        if (l < n && heap_worse(&h[l], &h[w]))
            w = l;
        if (r < n && heap_worse(&h[r], &h[w]))
            w = r;
        if (w == i)
            return;
        scored_token t = h[i];
        h[i] = h[w];
        h[w] = t;
        i = w;
    }
}

static void heap_sift_up(scored_token *h, size_t i) {
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!heap_worse(&h[i], &h[parent]))
            return;
        scored_token t = h[i];
        h[i] = h[parent];
        h[parent] = t;
        i = parent;
    }
}

typedef struct {
    scored_token *h;
    size_t n, k;
    int skip_neg_inf;
} top_heap;

static inline void top_offer(top_heap *t, float v, uint32_t id) {
    if (t->skip_neg_inf && v == -INFINITY)
        return;
    scored_token x = {v, (int32_t)id};
    if (t->n < t->k) {
        t->h[t->n] = x;
        heap_sift_up(t->h, t->n++);
    } else if (heap_worse(&t->h[0], &x)) {
        t->h[0] = x;
        heap_sift_down(t->h, t->n, 0);
    }
}

/* Offers x[i .. n) one by one until the heap is full; returns where it stopped. */
static size_t top_fill(top_heap *t, const float *x, size_t i, size_t n) {
    for (; i < n && t->n < t->k; i++)
        top_offer(t, x[i], (uint32_t)i);
    return i;
}

/* ---- scalar (the same arithmetic as the SIMD levels, lane for lane) -------------------------- */

static float max_scalar(const float *x, size_t n, int *bad) {
    float m = -INFINITY;
    int b = 0;
    for (size_t i = 0; i < n; i++) {
        b |= isnan(x[i]) || x[i] == INFINITY;
        if (x[i] > m)
            m = x[i];
    }
    *bad = b;
    return m;
}

static inline float exp_term_scalar(float v, float max) {
    const float d = v - max;
    return d < SCAN_EXP_FLOOR ? 0.0f : vm_exp_lanewise(d);
}

static double fold_lanes(double lane[SCAN_LANES]) {
    for (int w = SCAN_LANES / 2; w > 0; w /= 2)
        for (int j = 0; j < w; j++)
            lane[j] += lane[j + w];
    return lane[0];
}

static double sum_exp_scalar(const float *x, size_t n, float max) {
    double lane[SCAN_LANES] = {0};
    for (size_t i = 0; i < n; i++)
        lane[i % SCAN_LANES] += (double)exp_term_scalar(x[i], max);
    return fold_lanes(lane);
}

static void top_scan_scalar(top_heap *t, const float *x, size_t n) {
    for (size_t i = top_fill(t, x, 0, n); i < n; i++)
        if (x[i] >= t->h[0].logit)
            top_offer(t, x[i], (uint32_t)i);
}

/* ---- AVX2 ---------------------------------------------------------------------------------- */
#if defined(BUBO_X86)

BUBO_TARGET_AVX2 static float max_avx2(const float *x, size_t n, int *bad) {
    const __m256 inf = _mm256_set1_ps(INFINITY);
    __m256 m = _mm256_set1_ps(-INFINITY), b = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        b = _mm256_or_ps(b, _mm256_cmp_ps(v, inf, _CMP_NLT_UQ)); /* nan or +inf */
        m = _mm256_max_ps(m, v);
    }
    float mx = vm_hmax_avx2(m);
    int tail_bad;
    float tail = max_scalar(x + i, n - i, &tail_bad);
    *bad = _mm256_movemask_ps(b) != 0 || tail_bad;
    return tail > mx ? tail : mx;
}

BUBO_TARGET_AVX2 static inline __m256 exp_term_avx2(__m256 v, __m256 max) {
    __m256 d = _mm256_sub_ps(v, max);
    __m256 keep = _mm256_cmp_ps(d, _mm256_set1_ps(SCAN_EXP_FLOOR), _CMP_GE_OQ);
    return _mm256_and_ps(keep, vm_exp_avx2(d));
}

BUBO_TARGET_AVX2 static double sum_exp_avx2(const float *x, size_t n, float max) {
    const __m256 vmax = _mm256_set1_ps(max);
    __m256d a[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd()};
    float pad[SCAN_LANES];
    for (size_t i = 0; i < n; i += SCAN_LANES) {
        const float *p = x + i;
        if (n - i < SCAN_LANES) { /* the tail, padded with terms that are 0 */
            for (size_t j = 0; j < SCAN_LANES; j++)
                pad[j] = i + j < n ? x[i + j] : -INFINITY;
            p = pad;
        }
        __m256 e0 = exp_term_avx2(_mm256_loadu_ps(p), vmax), e1 = exp_term_avx2(_mm256_loadu_ps(p + 8), vmax);
        a[0] = _mm256_add_pd(a[0], _mm256_cvtps_pd(_mm256_castps256_ps128(e0)));
        a[1] = _mm256_add_pd(a[1], _mm256_cvtps_pd(_mm256_extractf128_ps(e0, 1)));
        a[2] = _mm256_add_pd(a[2], _mm256_cvtps_pd(_mm256_castps256_ps128(e1)));
        a[3] = _mm256_add_pd(a[3], _mm256_cvtps_pd(_mm256_extractf128_ps(e1, 1)));
    }
    double lane[SCAN_LANES];
    for (int j = 0; j < 4; j++)
        _mm256_storeu_pd(lane + 4 * j, a[j]);
    return fold_lanes(lane);
}

BUBO_TARGET_AVX2 static void top_scan_avx2(top_heap *t, const float *x, size_t n) {
    size_t i = top_fill(t, x, 0, n);
    for (; i + 8 <= n; i += 8) {
        __m256 ge = _mm256_cmp_ps(_mm256_loadu_ps(x + i), _mm256_set1_ps(t->h[0].logit), _CMP_GE_OQ);
        for (unsigned m = (unsigned)_mm256_movemask_ps(ge); m; m &= m - 1) {
            const size_t j = i + (size_t)__builtin_ctz(m);
            if (x[j] >= t->h[0].logit)
                top_offer(t, x[j], (uint32_t)j);
        }
    }
    for (; i < n; i++)
        if (x[i] >= t->h[0].logit)
            top_offer(t, x[i], (uint32_t)i);
}

/* ---- AVX-512 ------------------------------------------------------------------------------- */

BUBO_TARGET_AVX512 static float max_avx512(const float *x, size_t n, int *bad) {
    const __m512 inf = _mm512_set1_ps(INFINITY);
    __m512 m = _mm512_set1_ps(-INFINITY);
    __mmask16 b = 0;
    for (size_t i = 0; i < n; i += 16) {
        const __mmask16 k = n - i >= 16 ? (__mmask16)0xffff : vm_tail_mask16((int64_t)(n - i));
        __m512 v = _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), k, x + i);
        b |= _mm512_cmp_ps_mask(v, inf, _CMP_NLT_UQ); /* nan or +inf */
        m = _mm512_max_ps(m, v);
    }
    *bad = b != 0;
    return _mm512_reduce_max_ps(m);
}

BUBO_TARGET_AVX512 static double sum_exp_avx512(const float *x, size_t n, float max) {
    const __m512 vmax = _mm512_set1_ps(max), floor = _mm512_set1_ps(SCAN_EXP_FLOOR);
    __m512d lo = _mm512_setzero_pd(), hi = _mm512_setzero_pd(); /* lanes 0-7, 8-15 */
    for (size_t i = 0; i < n; i += SCAN_LANES) {
        const __mmask16 k = n - i >= 16 ? (__mmask16)0xffff : vm_tail_mask16((int64_t)(n - i));
        __m512 d = _mm512_sub_ps(_mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), k, x + i), vmax);
        __m512 e = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(d, floor, _CMP_GE_OQ), vm_exp_avx512(d));
        lo = _mm512_add_pd(lo, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
        hi = _mm512_add_pd(hi, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1))));
    }
    double lane[SCAN_LANES];
    _mm512_storeu_pd(lane, lo);
    _mm512_storeu_pd(lane + 8, hi);
    return fold_lanes(lane);
}

BUBO_TARGET_AVX512 static void top_scan_avx512(top_heap *t, const float *x, size_t n) {
    size_t i = top_fill(t, x, 0, n);
    for (; i < n; i += 16) {
        const __mmask16 k = n - i >= 16 ? (__mmask16)0xffff : vm_tail_mask16((int64_t)(n - i));
        __m512 v = _mm512_maskz_loadu_ps(k, x + i);
        for (unsigned m = _mm512_mask_cmp_ps_mask(k, v, _mm512_set1_ps(t->h[0].logit), _CMP_GE_OQ); m; m &= m - 1) {
            const size_t j = i + (size_t)__builtin_ctz(m);
            if (x[j] >= t->h[0].logit)
                top_offer(t, x[j], (uint32_t)j);
        }
    }
}

#endif /* BUBO_X86 */

/* ---- NEON ---------------------------------------------------------------------------------- */
#if defined(BUBO_ARM64)

static float max_neon(const float *x, size_t n, int *bad) {
    const float32x4_t inf = vdupq_n_f32(INFINITY);
    float32x4_t m = vdupq_n_f32(-INFINITY);
    uint32x4_t ok = vdupq_n_u32(0xffffffffu); /* x < inf: false for nan and +inf */
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        float32x4_t v = vld1q_f32(x + i);
        ok = vandq_u32(ok, vcltq_f32(v, inf));
        m = vmaxq_f32(m, v);
    }
    int tail_bad;
    float tail = max_scalar(x + i, n - i, &tail_bad);
    *bad = vminvq_u32(ok) == 0 || tail_bad;
    float mx = vmaxvq_f32(m);
    return tail > mx ? tail : mx;
}

static inline float32x4_t exp_term_neon(float32x4_t v, float32x4_t max) {
    float32x4_t d = vsubq_f32(v, max);
    uint32x4_t keep = vcgeq_f32(d, vdupq_n_f32(SCAN_EXP_FLOOR));
    return vreinterpretq_f32_u32(vandq_u32(keep, vreinterpretq_u32_f32(vm_exp_neon(d))));
}

static double sum_exp_neon(const float *x, size_t n, float max) {
    const float32x4_t vmax = vdupq_n_f32(max);
    float64x2_t a[8];
    for (int j = 0; j < 8; j++)
        a[j] = vdupq_n_f64(0.0);
    float pad[SCAN_LANES];
    for (size_t i = 0; i < n; i += SCAN_LANES) {
        const float *p = x + i;
        if (n - i < SCAN_LANES) {
            for (size_t j = 0; j < SCAN_LANES; j++)
                pad[j] = i + j < n ? x[i + j] : -INFINITY;
            p = pad;
        }
        for (int q = 0; q < 4; q++) {
            float32x4_t e = exp_term_neon(vld1q_f32(p + 4 * q), vmax);
            a[2 * q] = vaddq_f64(a[2 * q], vcvt_f64_f32(vget_low_f32(e)));
            a[2 * q + 1] = vaddq_f64(a[2 * q + 1], vcvt_high_f64_f32(e));
        }
    }
    double lane[SCAN_LANES];
    for (int j = 0; j < 8; j++)
        vst1q_f64(lane + 2 * j, a[j]);
    return fold_lanes(lane);
}

static void top_scan_neon(top_heap *t, const float *x, size_t n) {
    size_t i = top_fill(t, x, 0, n);
    for (; i + 4 <= n; i += 4) {
        uint32x4_t ge = vcgeq_f32(vld1q_f32(x + i), vdupq_n_f32(t->h[0].logit));
        if (vmaxvq_u32(ge) == 0)
            continue;
        for (size_t j = i; j < i + 4; j++)
            if (x[j] >= t->h[0].logit)
                top_offer(t, x[j], (uint32_t)j);
    }
    for (; i < n; i++)
        if (x[i] >= t->h[0].logit)
            top_offer(t, x[i], (uint32_t)i);
}

#endif /* BUBO_ARM64 */

/* ---- dispatch ------------------------------------------------------------------------------ */

float bubo_scan_max(bubo_isa isa, const float *x, size_t n, int *bad) {
#if defined(BUBO_X86)
    if (isa == BUBO_ISA_AVX512)
        return max_avx512(x, n, bad);
    if (isa == BUBO_ISA_AVX2)
        return max_avx2(x, n, bad);
#elif defined(BUBO_ARM64)
    if (isa == BUBO_ISA_NEON)
        return max_neon(x, n, bad);
#endif
    return max_scalar(x, n, bad);
}

double bubo_scan_sum_exp(bubo_isa isa, const float *x, size_t n, float max) {
#if defined(BUBO_X86)
    if (isa == BUBO_ISA_AVX512)
        return sum_exp_avx512(x, n, max);
    if (isa == BUBO_ISA_AVX2)
        return sum_exp_avx2(x, n, max);
#elif defined(BUBO_ARM64)
    if (isa == BUBO_ISA_NEON)
        return sum_exp_neon(x, n, max);
#endif
    return sum_exp_scalar(x, n, max);
}

size_t bubo_scan_top(bubo_isa isa, const float *x, size_t n, size_t k, int skip_neg_inf, scored_token *heap,
                     scored_token *out) {
    top_heap t = {heap, 0, k, skip_neg_inf};
    if (k == 0)
        return 0;
#if defined(BUBO_X86)
    if (isa == BUBO_ISA_AVX512)
        top_scan_avx512(&t, x, n);
    else if (isa == BUBO_ISA_AVX2)
        top_scan_avx2(&t, x, n);
    else
        top_scan_scalar(&t, x, n);
#elif defined(BUBO_ARM64)
    if (isa == BUBO_ISA_NEON)
        top_scan_neon(&t, x, n);
    else
        top_scan_scalar(&t, x, n);
#else
    top_scan_scalar(&t, x, n);
#endif
    /* pop the worst to the back: out[0 .. t.n) best first */
    for (size_t m = t.n; m > 0; m--) {
        scored_token worst = heap[0];
        heap[0] = heap[m - 1];
        heap_sift_down(heap, m - 1, 0);
        out[m - 1] = worst;
    }
    return t.n;
}
