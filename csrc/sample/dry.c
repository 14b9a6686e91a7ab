/* DRY ("don't repeat yourself"), the repetition penalty from koboldcpp that llama.cpp runs after
 * the classic penalties.
 *
 * A token that would extend a repeat gets a penalty that grows exponentially with the repeat's
 * length: if the last L tokens also occur earlier in the window, followed there by token t, and
 * L >= allowed_length, then t loses multiplier * base^(L - allowed_length). Repeats do not reach
 * back across a sequence breaker (a newline, a colon, ...), and a token that is itself a whole
 * breaker is never penalized.
 *
 * Breakers are strings; a token is a breaker's "head" when its text contains the whole breaker
 * (the breaker is that one token), or ends with a proper prefix of it (the rest must follow in
 * the next tokens). llama.cpp matches the rest against one tokenization of it; here the next
 * tokens' text must spell it, which also catches other tokenizations of the same text. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sample/sample_internal.h"

typedef struct {
    uint16_t breaker;  /* index into breakers */
    uint16_t tail_off; /* the head token's text ends with breaker[0 .. tail_off) */
} dry_head;

struct bubo_dry {
    float multiplier;
    float base;
    int32_t allowed_length;
    int32_t last_n;
    uint32_t n_vocab;

    uint8_t *whole_breaker; /* [n_vocab] 1: the token's text contains a whole breaker */
    uint32_t *head_start;   /* [n_vocab + 1] the token's entries in heads */
    dry_head *heads;        /* [n_heads] tokens whose text ends with a breaker's proper prefix */
    size_t n_breakers;
    char (*breakers)[BUBO_DRY_MAX_BREAKER_LEN];
    size_t *breaker_len;

    char *pieces;      /* vocabulary text, kept only when some head needs a tail matched */
    uint64_t *offsets; /* [n_vocab + 1] */

    int32_t *z;          /* [last_n] z[k]: how many tokens from k on (most recent first) repeat the newest ones */
    int32_t *max_repeat; /* [n_vocab] longest repeat each token would extend; -1 between calls */
    int32_t *touched;    /* [last_n] tokens whose max_repeat is set */
};

static int contains(const char *hay, size_t n, const char *needle, size_t m) {
    for (size_t i = 0; i + m <= n; i++)
        if (hay[i] == needle[0] && memcmp(hay + i, needle, m) == 0)
            return 1;
    return 0;
}

/* Calls fn for each head entry of token text w: pass 1 counts them, pass 2 stores them. */
static size_t scan_token(bubo_dry *d, uint32_t token, const char *w, size_t wl, dry_head *store) {
    size_t n = 0;
    for (size_t b = 0; b < d->n_breakers; b++) {
        const char *br = d->breakers[b];
        size_t bl = d->breaker_len[b];
        if (contains(w, wl, br, bl)) {
            d->whole_breaker[token] = 1;
            continue;
        }
        for (size_t pos = 0; pos < wl; pos++) {
            size_t m = wl - pos; /* the text from pos to the end is a proper prefix of the breaker? */
            if (m < bl && w[pos] == br[0] && memcmp(w + pos, br, m) == 0) {
                if (store)
                    store[n] = (dry_head){(uint16_t)b, (uint16_t)m};
                n++;
            }
        }
    }
    return n;
}

bubo_status bubo_dry_create(uint32_t n_vocab, const bubo_sampler_params *p, bubo_dry **out, bubo_err *err) {
    *out = NULL;
    if (p->dry_multiplier == 0.0f || p->dry_base < 1.0f || p->dry_penalty_last_n <= 0)
        return BUBO_OK;
    if (p->n_dry_breakers > UINT16_MAX)
        return bubo_set_err(err, BUBO_ERR_INVALID, "too many DRY sequence breakers (%zu)", p->n_dry_breakers);
    if (p->n_dry_breakers > 0 && (!p->vocab_pieces || !p->vocab_offsets))
        return bubo_set_err(err, BUBO_ERR_INVALID, "DRY sequence breakers need the vocabulary's token pieces");
    for (size_t b = 0; b < p->n_dry_breakers; b++)
        if (p->dry_breaker_lens[b] == 0)
            return bubo_set_err(err, BUBO_ERR_INVALID, "DRY sequence breaker %zu is empty", b);

    bubo_dry *d = calloc(1, sizeof *d);
    if (!d)
        return bubo_set_err(err, BUBO_ERR_NOMEM, "out of memory");
    d->multiplier = p->dry_multiplier;
    d->base = p->dry_base;
    d->allowed_length = p->dry_allowed_length;
    d->last_n = p->dry_penalty_last_n;
    d->n_vocab = n_vocab;
    d->n_breakers = p->n_dry_breakers;
    d->whole_breaker = calloc(n_vocab, 1);
    d->head_start = calloc((size_t)n_vocab + 1, sizeof *d->head_start);
    d->breakers = calloc(d->n_breakers ? d->n_breakers : 1, sizeof *d->breakers);
    d->breaker_len = calloc(d->n_breakers ? d->n_breakers : 1, sizeof *d->breaker_len);
    d->z = calloc((size_t)d->last_n, sizeof *d->z);
    d->max_repeat = calloc(n_vocab, sizeof *d->max_repeat);
    d->touched = calloc((size_t)d->last_n, sizeof *d->touched);
    if (!d->whole_breaker || !d->head_start || !d->breakers || !d->breaker_len || !d->z || !d->max_repeat ||
        !d->touched)
        goto nomem;
    for (uint32_t t = 0; t < n_vocab; t++)
        d->max_repeat[t] = -1;
    for (size_t b = 0; b < d->n_breakers; b++) {
        size_t len = p->dry_breaker_lens[b];
        if (len > BUBO_DRY_MAX_BREAKER_LEN)
            len = BUBO_DRY_MAX_BREAKER_LEN; /* as llama.cpp: truncated */
        memcpy(d->breakers[b], p->dry_breakers[b], len);
        d->breaker_len[b] = len;
    }

    size_t n_heads = 0;
    if (d->n_breakers > 0) {
        for (uint32_t t = 0; t < n_vocab; t++) {
            const char *w = p->vocab_pieces + p->vocab_offsets[t];
            size_t wl = (size_t)(p->vocab_offsets[t + 1] - p->vocab_offsets[t]);
            d->head_start[t] = (uint32_t)n_heads;
            n_heads += scan_token(d, t, w, wl, NULL);
        }
    }
    d->head_start[n_vocab] = (uint32_t)n_heads;
    if (n_heads > 0) {
        d->heads = malloc(n_heads * sizeof *d->heads);
        uint64_t n_bytes = p->vocab_offsets[n_vocab] - p->vocab_offsets[0];
        d->pieces = malloc(n_bytes ? n_bytes : 1);
        d->offsets = malloc(((size_t)n_vocab + 1) * sizeof *d->offsets);
        if (!d->heads || !d->pieces || !d->offsets)
            goto nomem;
        memcpy(d->pieces, p->vocab_pieces + p->vocab_offsets[0], n_bytes);
        for (uint32_t t = 0; t <= n_vocab; t++)
            d->offsets[t] = p->vocab_offsets[t] - p->vocab_offsets[0];
        for (uint32_t t = 0; t < n_vocab; t++)
            scan_token(d, t, d->pieces + d->offsets[t], (size_t)(d->offsets[t + 1] - d->offsets[t]),
                       d->heads + d->head_start[t]);
    }
    *out = d;
    return BUBO_OK;
nomem:
    bubo_dry_free(d);
    return bubo_set_err(err, BUBO_ERR_NOMEM, "out of memory for the DRY sampler (%u tokens)", n_vocab);
}

void bubo_dry_free(bubo_dry *d) {
    if (!d)
        return;
    free(d->whole_breaker);
    free(d->head_start);
    free(d->heads);
    free(d->breakers);
    free(d->breaker_len);
    free(d->pieces);
    free(d->offsets);
    free(d->z);
    free(d->max_repeat);
    free(d->touched);
    free(d);
}

/* How many tokens after the head (recent[i]) spell the tail of a breaker, or -1. */
static int tail_tokens(const bubo_dry *d, const int32_t *recent, int32_t i, const char *tail, size_t tail_len) {
    size_t got = 0;
    int32_t c = 0;
    while (got < tail_len) {
        if (c >= i || c >= BUBO_DRY_MAX_TAIL_TOKENS)
            return -1;
        int32_t t = recent[i - 1 - c];
        c++;
        const char *w = d->pieces + d->offsets[t];
        size_t wl = (size_t)(d->offsets[t + 1] - d->offsets[t]);
        size_t m = wl < tail_len - got ? wl : tail_len - got;
        if (memcmp(w, tail + got, m) != 0)
            return -1;
        got += m;
    }
    return c;
}

void bubo_dry_apply(bubo_dry *d, const int32_t *recent, int32_t n_recent, float *logits) {
    const int32_t n = n_recent < d->last_n ? n_recent : d->last_n;
    if (n <= d->allowed_length)
        return;

    /* 1. The most recent breaker bounds how far back a repeat may reach. */
    int32_t rep_limit = n;
    for (int32_t i = 0; i < n; i++) {
        int32_t t = recent[i];
        int longest = d->whole_breaker[t] ? 0 : -1;
        for (uint32_t h = d->head_start[t]; h < d->head_start[t + 1]; h++) {
            const dry_head *e = &d->heads[h];
            int c = tail_tokens(d, recent, i, d->breakers[e->breaker] + e->tail_off,
                                d->breaker_len[e->breaker] - e->tail_off);
            if (c > longest)
                longest = c;
        }
        if (longest >= 0) {
            rep_limit = i - longest;
            break;
        }
    }
    if (rep_limit < d->allowed_length)
        return;

    /* 2. Z-function of the window read newest first: z[k] is how many of the newest tokens are
     *    repeated by the run that ends k tokens back. Linear time. */
    const int32_t *r = recent;
    int32_t lo = 0, hi = 0; /* the rightmost match seen: r[lo .. hi) == r[0 .. hi - lo) */
    for (int32_t k = 1; k < n; k++) {
        int32_t zk = 0;
        if (k < hi) {
            zk = d->z[k - lo];
            if (zk > hi - k)
                zk = hi - k;
        }
        while (k + zk < n && r[zk] == r[k + zk])
            zk++;
        d->z[k] = zk;
        if (k + zk > hi) {
            lo = k;
            hi = k + zk;
        }
    }

    /* 3. The token that followed each earlier occurrence would extend the repeat. */
    int32_t n_touched = 0;
    for (int32_t k = 1; k < n; k++) {
        int32_t len = d->z[k] < rep_limit ? d->z[k] : rep_limit;
        if (len < d->allowed_length)
            continue;
        int32_t t = r[k - 1];
        if (d->max_repeat[t] < 0)
            d->touched[n_touched++] = t;
        if (len > d->max_repeat[t])
            d->max_repeat[t] = len;
    }

    /* 4. Penalize; the exponent is clamped so that base^exponent stays a finite float. */
    int32_t max_exponent = 0;
    if (d->base > 1.000001f)
        max_exponent = (int32_t)(88.7228391f / logf(d->base));
    for (int32_t i = 0; i < n_touched; i++) {
        int32_t t = d->touched[i];
        if (!d->whole_breaker[t]) {
            int32_t e = d->max_repeat[t] - d->allowed_length;
            if (max_exponent > 0 && e > max_exponent)
                e = max_exponent;
            logits[t] -= d->multiplier * powf(d->base, (float)e);
        }
        d->max_repeat[t] = -1;
    }
}
