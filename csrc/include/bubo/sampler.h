/* The sampler chain: one next token from a row of logits, as llama.cpp's common sampler picks it.
 *
 * Order (llama.cpp's default chain):
 *   mask (grammar hook) -> logit bias -> repeat/frequency/presence penalties -> DRY
 *   -> top-n-sigma -> top-k -> typical -> top-p -> min-p -> XTC -> temperature (dynamic if
 *   dynatemp_range > 0) -> draw
 * or, with mirostat = 1 or 2 (as llama.cpp: no penalties, no DRY, no filters):
 *   mask -> logit bias -> temperature -> Mirostat v1/v2 (which draws).
 *
 * Each step also reports the log-probability of the chosen token and the n_probs most likely
 * tokens under the RAW logits (before mask, bias or any stage), as llama-server reports them:
 * log-softmax with the max subtracted and the sum of exponentials taken in double.
 *
 * Randomness: one xoshiro256** stream per sampler, seeded with splitmix64(seed); a uniform draw is
 * the top 53 bits of the next output times 2^-53, in [0, 1). Each step draws once for XTC (only
 * when XTC is enabled: xtc_probability > 0 and xtc_threshold <= 0.5) and then once for the final
 * pick, whatever the candidates are, so a seed fixes the whole run. reset() reseeds with the same
 * seed. Candidates are walked in descending logit order, ties to the lower token id, so a draw
 * maps to one token independently of how the stages reordered them.
 *
 * temperature <= 0 is greedy: the stages run, then the best remaining candidate (ties to the
 * lower id) is taken. With the default filters this is the argmax of the penalized logits.
 *
 * Sampling does not allocate: every buffer is sized for n_vocab at creation. sample() does not
 * record the token: call accept() with the token that is actually emitted (penalties and DRY read
 * that history; the caller may also accept prompt tokens, as llama-server does). */
#ifndef BUBO_SAMPLER_H
#define BUBO_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

#include "bubo/common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int32_t token;
    float bias; /* added to the logit; -INFINITY bans the token */
} bubo_logit_bias;

typedef struct {
    /* penalties over the last repeat_last_n accepted tokens (0: off) */
    int32_t repeat_last_n;
    float repeat_penalty;    /* 1: off; a positive logit is divided by it, a negative one multiplied */
    float frequency_penalty; /* subtracted once per occurrence */
    float presence_penalty;  /* subtracted once if present */

    /* DRY: a token that would extend a repeat of length L >= dry_allowed_length found in the
     * last dry_penalty_last_n tokens loses dry_multiplier * dry_base^(L - dry_allowed_length);
     * a repeat does not reach back across a sequence breaker. Off when dry_multiplier == 0. */
    float dry_multiplier;
    float dry_base;
    int32_t dry_allowed_length;
    int32_t dry_penalty_last_n; /* 0: off */
    const char *const *dry_breakers;  /* n_dry_breakers byte strings (not NUL-terminated) */
    const size_t *dry_breaker_lens;   /* their lengths (each 1..40; longer ones are truncated) */
    size_t n_dry_breakers;
    /* The vocabulary's text, needed only when DRY is on with breakers: piece i is
     * vocab_pieces[vocab_offsets[i] .. vocab_offsets[i + 1]), n_vocab + 1 offsets. */
    const char *vocab_pieces;
    const uint64_t *vocab_offsets;

    float top_n_sigma; /* <= 0: off; keep logits >= max - top_n_sigma * std */
    int32_t top_k;     /* <= 0: off */
    float typical_p;   /* >= 1: off */
    float top_p;       /* >= 1: off */
    float min_p;       /* <= 0: off */
    float xtc_probability;
    float xtc_threshold; /* > 0.5: off */
    int32_t min_keep;    /* top-p, min-p, typical and XTC keep at least this many (0: 1) */

    float temperature;       /* <= 0: greedy */
    float dynatemp_range;    /* > 0: temperature in [temperature - range, temperature + range] by entropy */
    float dynatemp_exponent;

    int32_t mirostat; /* 0: off, 1: Mirostat, 2: Mirostat 2.0 */
    float mirostat_tau;
    float mirostat_eta;

    const bubo_logit_bias *logit_bias;
    size_t n_logit_bias;

    int32_t n_probs; /* how many top alternatives sample() reports (clamped to n_vocab) */
    uint64_t seed;
} bubo_sampler_params;

typedef struct {
    int32_t token;
    double logprob;
} bubo_token_logprob;

/* How many uniform draws one step may use: [0] for XTC's coin, [1] for the pick. */
#define BUBO_SAMPLER_N_DRAWS 2

typedef struct bubo_sampler bubo_sampler;

/* Everything in params is copied. BUBO_ERR_INVALID names the bad field (NaN, a negative window,
 * mirostat not in 0..2, a logit-bias token out of range, DRY breakers without the vocabulary). */
bubo_status bubo_sampler_create(uint32_t n_vocab, const bubo_sampler_params *params, bubo_sampler **out,
                                bubo_err *err);
void bubo_sampler_free(bubo_sampler *s);

uint32_t bubo_sampler_n_vocab(const bubo_sampler *s);
int32_t bubo_sampler_n_probs(const bubo_sampler *s); /* after clamping */
uint64_t bubo_sampler_seed(const bubo_sampler *s);
double bubo_sampler_mirostat_mu(const bubo_sampler *s);

/* One step. logits: n_vocab floats (NaN or +inf is refused; -inf excludes a token). allowed:
 * NULL or n_vocab bytes, 0 = excluded before the chain. draws: NULL (use the sampler's stream)
 * or BUBO_SAMPLER_N_DRAWS uniforms in [0, 1) to use instead (tests feed them; the stream does not
 * advance). out: the chosen token and its raw log-probability. top: n_probs entries, most likely
 * first (ties to the lower id), or NULL when n_probs is 0. BUBO_ERR_INVALID when nothing is left
 * to choose from (mask and biases exclude every token). */
bubo_status bubo_sampler_sample(bubo_sampler *s, const float *logits, const uint8_t *allowed, const double *draws,
                                bubo_token_logprob *out, bubo_token_logprob *top, bubo_err *err);

/* Record an emitted token (for penalties and DRY). BUBO_ERR_INVALID when out of range. */
bubo_status bubo_sampler_accept(bubo_sampler *s, int32_t token, bubo_err *err);

/* Forget the history, restore Mirostat's mu and reseed with the same seed. */
void bubo_sampler_reset(bubo_sampler *s);

/* The candidates of the last sample(): how many, then their ids and probabilities (they sum to 1),
 * in descending probability order (ties to the lower id; sorting them is why s is not const).
 * For tests and diagnostics. */
size_t bubo_sampler_n_candidates(const bubo_sampler *s);
void bubo_sampler_candidates(bubo_sampler *s, int32_t *ids, float *probs);

#ifdef __cplusplus
}
#endif
#endif
