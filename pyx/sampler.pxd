# Mirrors csrc/include/bubo/sampler.h
from libc.stdint cimport int32_t, uint8_t, uint32_t, uint64_t

from common cimport bubo_status, bubo_err

cdef extern from "bubo/sampler.h" nogil:
    ctypedef struct bubo_logit_bias:
        int32_t token
        float bias

    ctypedef struct bubo_sampler_params:
        int32_t repeat_last_n
        float repeat_penalty
        float frequency_penalty
        float presence_penalty
        float dry_multiplier
        float dry_base
        int32_t dry_allowed_length
        int32_t dry_penalty_last_n
        const char *const *dry_breakers
        const size_t *dry_breaker_lens
        size_t n_dry_breakers
        const char *vocab_pieces
        const uint64_t *vocab_offsets
        float top_n_sigma
        int32_t top_k
        float typical_p
        float top_p
        float min_p
        float xtc_probability
        float xtc_threshold
        int32_t min_keep
        float temperature
        float dynatemp_range
        float dynatemp_exponent
        int32_t mirostat
        float mirostat_tau
        float mirostat_eta
        const bubo_logit_bias *logit_bias
        size_t n_logit_bias
        int32_t n_probs
        uint64_t seed

    ctypedef struct bubo_token_logprob:
        int32_t token
        double logprob

    enum:
        BUBO_SAMPLER_N_DRAWS

    ctypedef struct bubo_sampler:
        pass

    bubo_status bubo_sampler_create(uint32_t n_vocab, const bubo_sampler_params *params, bubo_sampler **out,
                                    bubo_err *err)
    void bubo_sampler_free(bubo_sampler *s)
    uint32_t bubo_sampler_n_vocab(const bubo_sampler *s)
    int32_t bubo_sampler_n_probs(const bubo_sampler *s)
    uint64_t bubo_sampler_seed(const bubo_sampler *s)
    double bubo_sampler_mirostat_mu(const bubo_sampler *s)
    bubo_status bubo_sampler_sample(bubo_sampler *s, const float *logits, const uint8_t *allowed,
                                    const double *draws, bubo_token_logprob *out, bubo_token_logprob *top,
                                    bubo_err *err)
    bubo_status bubo_sampler_accept(bubo_sampler *s, int32_t token, bubo_err *err)
    void bubo_sampler_reset(bubo_sampler *s)
    size_t bubo_sampler_n_candidates(const bubo_sampler *s)
    void bubo_sampler_candidates(bubo_sampler *s, int32_t *ids, float *probs)
