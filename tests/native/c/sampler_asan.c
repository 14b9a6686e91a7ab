/* Runs every sampler stage (and Mirostat, masks, DRY with multi-token breakers, n_probs up to the
 * vocabulary) over random logits under AddressSanitizer + UBSan; built by test_sampler_asan.py. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "bubo/sampler.h"
int main(void) {
    const uint32_t n = 300;
    static char text[4096]; static uint64_t off[301]; size_t pos = 0;
    for (uint32_t i = 0; i < n; i++) { off[i] = pos; int len = i % 5; for (int j = 0; j < len; j++) text[pos++] = "ab:\nfo"[(i + j) % 6]; }
    off[n] = pos;
    const char *brk[] = {"\n", ":", "foo", "ab:"}; size_t bl[] = {1, 1, 3, 3};
    bubo_logit_bias bias[] = {{3, 2.0f}, {4, -INFINITY}};
    float *lg = malloc(n * sizeof *lg); bubo_token_logprob top[300], out; bubo_err err;
    uint8_t mask[300];
    srand(1);
    for (int cfg = 0; cfg < 60; cfg++) {
        bubo_sampler_params p = {0};
        p.repeat_last_n = cfg % 3 * 20; /* every fourth: a window with no penalty in it (none allocated) */
        p.repeat_penalty = cfg % 4 == 1 ? 1.0f : 1.2f; p.frequency_penalty = p.presence_penalty = cfg % 4 == 1 ? 0 : 0.1f;
        p.dry_multiplier = cfg % 2 ? 0.8f : 0; p.dry_base = 1.75f; p.dry_allowed_length = cfg % 3; p.dry_penalty_last_n = 50;
        p.dry_breakers = brk; p.dry_breaker_lens = bl; p.n_dry_breakers = 4; p.vocab_pieces = text; p.vocab_offsets = off;
        p.top_n_sigma = cfg % 4 == 0 ? 1.0f : -1; p.top_k = cfg % 5 * 30; p.typical_p = cfg % 7 == 0 ? 0.5f : 1; p.top_p = cfg % 3 ? 0.9f : 1;
        p.min_p = 0.05f; p.xtc_probability = cfg % 2 ? 0.5f : 0; p.xtc_threshold = 0.02f; p.min_keep = cfg % 4;
        p.temperature = cfg % 6 == 0 ? 0 : 0.9f; p.dynatemp_range = cfg % 5 == 0 ? 0.3f : 0; p.dynatemp_exponent = 1;
        p.mirostat = cfg % 9 == 0 ? 1 : cfg % 9 == 1 ? 2 : 0; p.mirostat_tau = 5; p.mirostat_eta = 0.1f;
        p.logit_bias = bias; p.n_logit_bias = cfg % 5 == 2 ? 0 : 2; /* without: some steps copy no logits */ p.n_probs = cfg * 7; p.seed = cfg;
        bubo_sampler *s;
        if (bubo_sampler_create(n, &p, &s, &err)) { printf("create: %s\n", err.msg); return 1; }
        for (int step = 0; step < 200; step++) {
            for (uint32_t i = 0; i < n; i++) { lg[i] = (float)(rand() % 2000) / 200.0f; mask[i] = rand() % 4 != 0; }
            if (bubo_sampler_sample(s, lg, step % 2 ? mask : NULL, NULL, &out, top, &err)) { printf("sample: %s\n", err.msg); return 1; }
            bubo_sampler_accept(s, step % 3 ? out.token : (int32_t)(step % 7), &err);
            size_t nc = bubo_sampler_n_candidates(s); int32_t ids[300]; float pr[300];
            bubo_sampler_candidates(s, ids, pr); (void)nc;
        }
        bubo_sampler_reset(s);
        bubo_sampler_free(s);
    }
    free(lg); puts("ok"); return 0;
}
