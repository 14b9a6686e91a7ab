/* The sampler's row passes (csrc/sample/scan.c) at every level this machine runs, against the
 * scalar level (the same bits for the sum, the same max and selection) and against a double
 * precision reference (the sum within SUM_RTOL). Built natively and, for NEON, cross-compiled and
 * run under qemu by tests/native/test_sampler_scan.py. Prints one line per failure, then
 * "N failures". */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "sample/sample_internal.h"

#define SUM_RTOL 1e-6 /* float exps in double vs exp() in double */
#define TOP_K_MAX 64

static int failures;

#define CHECK(cond, ...)                                                                                 \
    do {                                                                                                 \
        if (!(cond)) {                                                                                   \
            failures++;                                                                                  \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);                                                  \
            printf(__VA_ARGS__);                                                                         \
            printf("\n");                                                                                \
        }                                                                                                \
    } while (0)

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static double uniform(void) { /* xorshift64*, in (0, 1) */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return ((double)((rng_state * 0x2545f4914f6cdd1dull) >> 11) + 0.5) * 0x1.0p-53;
}

static float normal(void) { return (float)(sqrt(-2.0 * log(uniform())) * cos(6.283185307179586 * uniform())); }

/* a row of n: kind 0 normal * scale, 1 with half -inf, 2 rounded to halves (ties), 3 all equal */
static void fill(float *x, size_t n, int kind, float scale) {
    for (size_t i = 0; i < n; i++) {
        float v = normal() * scale;
        if (kind == 1 && uniform() < 0.5)
            v = -INFINITY;
        if (kind == 2)
            v = roundf(v * 2.0f) / 2.0f;
        if (kind == 3)
            v = 1.5f;
        x[i] = v;
    }
}

static double reference_sum(const float *x, size_t n, float max) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++)
        s += exp((double)x[i] - (double)max);
    return s;
}

/* the k best by a plain O(n k) scan: higher value, ties to the lower index */
static size_t reference_top(const float *x, size_t n, size_t k, int skip_neg_inf, scored_token *out) {
    size_t m = 0;
    for (; m < k; m++) {
        long best = -1;
        for (size_t i = 0; i < n; i++) {
            if (skip_neg_inf && x[i] == -INFINITY)
                continue;
            int taken = 0;
            for (size_t j = 0; j < m; j++)
                taken |= out[j].id == (int32_t)i;
            if (!taken && (best < 0 || x[i] > x[best]))
                best = (long)i;
        }
        if (best < 0)
            break;
        out[m].logit = x[best];
        out[m].id = (int32_t)best;
    }
    return m;
}

int main(void) {
    static const size_t sizes[] = {1, 7, 15, 16, 17, 33, 1000, 4099};
    static const float scales[] = {1.0f, 30.0f, 3000.0f};
    bubo_isa isas[BUBO_ISA_COUNT];
    int n_isa = 0;
    for (int i = 0; i < BUBO_ISA_COUNT; i++)
        if (bubo_cpu_supports((bubo_isa)i))
            isas[n_isa++] = (bubo_isa)i;
    float *x = malloc(4099 * sizeof *x);
    scored_token heap[TOP_K_MAX], got[TOP_K_MAX], want[TOP_K_MAX];
    int rows = 0;
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++)
        for (int kind = 0; kind < 4; kind++)
            for (size_t ci = 0; ci < sizeof scales / sizeof scales[0]; ci++) {
                const size_t n = sizes[si];
                fill(x, n, kind, scales[ci]);
                rows++;
                int bad0;
                const float max0 = bubo_scan_max(BUBO_ISA_SCALAR, x, n, &bad0);
                CHECK(!bad0, "n=%zu kind=%d: a finite row reported bad", n, kind);
                if (max0 == -INFINITY)
                    continue;
                const double sum0 = bubo_scan_sum_exp(BUBO_ISA_SCALAR, x, n, max0);
                const double ref = reference_sum(x, n, max0);
                CHECK(fabs(sum0 - ref) <= SUM_RTOL * ref, "n=%zu kind=%d: sum %.17g vs %.17g", n, kind, sum0, ref);
                for (int a = 0; a < n_isa; a++) {
                    const char *name = bubo_isa_name(isas[a]);
                    int bad;
                    const float max = bubo_scan_max(isas[a], x, n, &bad);
                    CHECK(max == max0 && !bad, "%s n=%zu kind=%d: max %g vs %g", name, n, kind, max, max0);
                    const double sum = bubo_scan_sum_exp(isas[a], x, n, max0);
                    CHECK(sum == sum0, "%s n=%zu kind=%d: sum %.17g, scalar %.17g", name, n, kind, sum, sum0);
                    static const size_t ks[] = {1, 5, 40, TOP_K_MAX};
                    for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++)
                        for (int skip = 0; skip < 2; skip++) {
                            const size_t k = ks[ki];
                            const size_t m = bubo_scan_top(isas[a], x, n, k, skip, heap, got);
                            const size_t mw = reference_top(x, n, k, skip, want);
                            CHECK(m == mw, "%s n=%zu kind=%d k=%zu: %zu selected, want %zu", name, n, kind, k, m, mw);
                            for (size_t j = 0; j < m && j < mw; j++)
                                CHECK(got[j].id == want[j].id && got[j].logit == want[j].logit,
                                      "%s n=%zu kind=%d k=%zu: [%zu] is %d, want %d", name, n, kind, k, j, got[j].id,
                                      want[j].id);
                        }
                }
            }
    /* nan and +inf are reported wherever they sit, at every level */
    for (int a = 0; a < n_isa; a++)
        for (size_t pos = 0; pos < 40; pos += 13)
            for (int which = 0; which < 2; which++) {
                fill(x, 40, 0, 1.0f);
                x[pos] = which ? INFINITY : NAN;
                int bad;
                bubo_scan_max(isas[a], x, 40, &bad);
                CHECK(bad, "%s: %s at %zu not reported", bubo_isa_name(isas[a]), which ? "inf" : "nan", pos);
            }
    for (int a = 0; a < n_isa; a++)
        printf("level %s\n", bubo_isa_name(isas[a]));
    printf("%d rows\n%d failures\n", rows, failures);
    free(x);
    return failures != 0;
}
