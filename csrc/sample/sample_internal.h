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

#endif
