/* Shared by the sampler's files; not part of the public API. */
#ifndef BUBO_SAMPLE_INTERNAL_H
#define BUBO_SAMPLE_INTERNAL_H

#include "bubo/sampler.h"

/* llama.cpp's limits on a sequence breaker: its length in bytes, and how many tokens after the
 * head token the rest of it may span. */
#define BUBO_DRY_MAX_BREAKER_LEN 40
#define BUBO_DRY_MAX_TAIL_TOKENS 20

typedef struct bubo_dry bubo_dry;

/* NULL in *out (and BUBO_OK) when the parameters turn DRY off. */
bubo_status bubo_dry_create(uint32_t n_vocab, const bubo_sampler_params *p, bubo_dry **out, bubo_err *err);
void bubo_dry_free(bubo_dry *d);

/* Subtract DRY's penalties from logits [n_vocab]. recent: the history, most recent first,
 * n_recent tokens (DRY reads at most its own window of them). */
void bubo_dry_apply(bubo_dry *d, const int32_t *recent, int32_t n_recent, float *logits);

/* ---- whole-vocabulary passes (scan.c), one variant per instruction set ---------------------- */

#include "bubo/cpu.h"

typedef struct {
    float logit;
    int32_t id;
} scored_token;

/* The largest of x[0 .. n); *bad is set when some value is NaN or +inf. */
float bubo_scan_max(bubo_isa isa, const float *x, size_t n, int *bad);

/* The sum of exp(x[i] - max) in double, the same bits at every level (see scan.c). */
double bubo_scan_sum_exp(bubo_isa isa, const float *x, size_t n, float max);

/* The k best of x[0 .. n) (higher value, ties to the lower index), best first, in out[0 .. k);
 * skipping -inf when skip_neg_inf. heap: k scratch entries (out may be heap). Returns how many. */
size_t bubo_scan_top(bubo_isa isa, const float *x, size_t n, size_t k, int skip_neg_inf, scored_token *heap,
                     scored_token *out);

#endif
