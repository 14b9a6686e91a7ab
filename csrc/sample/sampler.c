/* The sampler chain (see bubo/sampler.h for the order and the conventions).
 *
 * Stages that act on every token (mask, bias, penalties, DRY) edit a copy of the logits indexed
 * by token id. The rest work on a candidate list of the tokens still allowed (finite logits),
 * which the filters shrink. Most filters need the best candidates in order, rarely all of them, so
 * the list keeps a sorted prefix: cand[0 .. n_sorted) is in descending order and no later
 * candidate beats any of it. sort_prefix() extends it with a selection (linear) plus a sort of the
 * new part only; top-k 40 out of 150k tokens never sorts the rest.
 *
 * Most chains never look past a few of the best candidates: after top-k every stage works on what
 * it kept, and greedy keeps the best one. Then the list starts as just those, selected straight
 * from the row (scan.c), and the chain runs on exactly the list it would have had after top-k.
 * The raw log-softmax and n_probs' selection are row passes in scan.c too. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sample/sample_internal.h"

/* Mirostat v1 estimates the Zipf exponent from this many of the best candidates (llama.cpp's m). */
#define MIROSTAT_M 100

/* Up to this many, the candidates the chain can reach are selected straight from the row (a heap
 * pass) instead of listing every allowed token and quickselecting them. */
#define REACH_MAX 1024

typedef struct {
    int32_t id;
    float logit;
    float p;   /* probability, when the current stage computed it */
    float aux; /* typical's score */
} bubo_cand;

struct bubo_sampler {
    uint32_t n_vocab;
    bubo_sampler_params p; /* pointers cleared; the data they held lives below */
    bubo_logit_bias *bias; /* [n_bias] */
    size_t n_bias;

    /* history of accepted tokens: a ring of the last hist_cap, newest at hist[(hist_head - 1) % cap] */
    int32_t *hist;
    uint32_t hist_cap, hist_len, hist_head;
    int32_t *recent;    /* [hist_cap] scratch: the history, newest first */
    int32_t *pen_count; /* [n_vocab] occurrences in the last repeat_last_n tokens (NULL: penalties off) */
    uint32_t *stamp;    /* [n_vocab] penalties applied this step when == stamp_now (NULL: penalties off) */
    uint32_t stamp_now;
    bubo_dry *dry; /* NULL: off */

    float *work;     /* [n_vocab] logits after mask, bias, penalties, DRY (NULL until a step needs it) */
    bubo_cand *cand; /* [reach], or [n_vocab] where the chain may need every token (reach 0) */
    size_t n_cand, n_sorted;
    int probs_normalized; /* cand[].p holds the final probabilities (after the pick) */

    size_t reach;       /* the chain looks at no more than this many best candidates (0: it may need all) */
    scored_token *heap; /* [max(n_probs, reach)] a selection's heap */
    bubo_isa isa;

    double mu; /* Mirostat's running maximum surprise */
    uint64_t rng[4];
};

/* ---- random numbers: xoshiro256**, seeded by splitmix64 -------------------------------------- */

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static void rng_seed(uint64_t s[4], uint64_t seed) {
    for (int i = 0; i < 4; i++)
        s[i] = splitmix64(&seed);
}

static double rng_uniform(uint64_t s[4]) {
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return (double)(result >> 11) * 0x1.0p-53;
}

/* ---- the candidate list ------------------------------------------------------------------- */

/* a comes before b: higher logit, ties to the lower id (a total order: ids are distinct) */
static inline int cand_before(const bubo_cand *a, const bubo_cand *b) {
    return a->logit > b->logit || (a->logit == b->logit && a->id < b->id);
}

static int cand_cmp(const void *x, const void *y) {
    const bubo_cand *a = x, *b = y;
    return cand_before(a, b) ? -1 : cand_before(b, a) ? 1 : 0;
}

static inline void cand_swap(bubo_cand *a, bubo_cand *b) {
    bubo_cand t = *a;
    *a = *b;
    *b = t;
}

/* Moves the k best of a[0 .. n) to a[0 .. k), in no order (quickselect, median-of-three pivot). */
static void select_best(bubo_cand *a, size_t n, size_t k) {
    size_t lo = 0, hi = n;
    while (hi - lo > 1 && k > lo && k < hi) {
        size_t mid = lo + (hi - lo) / 2;
        /* median of a[lo], a[mid], a[hi - 1] goes to a[hi - 1] */
        if (cand_before(&a[mid], &a[lo]))
            cand_swap(&a[mid], &a[lo]);
        if (cand_before(&a[hi - 1], &a[lo]))
            cand_swap(&a[hi - 1], &a[lo]);
        if (cand_before(&a[mid], &a[hi - 1]))
            cand_swap(&a[mid], &a[hi - 1]);
        const bubo_cand pivot = a[hi - 1];
        size_t store = lo;
        for (size_t i = lo; i < hi - 1; i++)
            if (cand_before(&a[i], &pivot))
                cand_swap(&a[i], &a[store++]);
        cand_swap(&a[store], &a[hi - 1]);
        /* a[lo .. store) beat the pivot at a[store]; the rest lose to it */
        if (k <= store)
            hi = store;
        else
            lo = store + 1;
    }
}

/* Makes cand[0 .. k) the k best candidates in order (k is clamped to n_cand). */
static void sort_prefix(bubo_sampler *s, size_t k) {
    if (k > s->n_cand)
        k = s->n_cand;
    if (k <= s->n_sorted)
        return;
    bubo_cand *rest = s->cand + s->n_sorted;
    select_best(rest, s->n_cand - s->n_sorted, k - s->n_sorted);
    qsort(rest, k - s->n_sorted, sizeof *rest, cand_cmp);
    s->n_sorted = k;
}

/* Before reading cand[i] in order: grows the sorted prefix geometrically, so that a walk over
 * the first m candidates costs O(n_cand * log m) at worst. */
static inline void sort_through(bubo_sampler *s, size_t i) {
    if (i >= s->n_sorted) {
        size_t k = 2 * s->n_sorted;
        if (k < 64)
            k = 64;
        if (k < i + 1)
            k = i + 1;
        sort_prefix(s, k);
    }
}

static float cand_max_logit(const bubo_sampler *s) {
    if (s->n_sorted > 0)
        return s->cand[0].logit;
    float m = -INFINITY;
    for (size_t i = 0; i < s->n_cand; i++)
        if (s->cand[i].logit > m)
            m = s->cand[i].logit;
    return m;
}

/* p = softmax(logit) over the candidates; the sum is taken in double. Returns that sum of
 * exp(logit - max), for stages that want unnormalized weights. */
static double cand_softmax(bubo_sampler *s) {
    const double max = cand_max_logit(s);
    double sum = 0.0;
    for (size_t i = 0; i < s->n_cand; i++) {
        double e = exp((double)s->cand[i].logit - max);
        s->cand[i].p = (float)e;
        sum += e;
    }
    const double inv = 1.0 / sum;
    for (size_t i = 0; i < s->n_cand; i++)
        s->cand[i].p = (float)((double)s->cand[i].p * inv);
    return sum;
}

/* Keeps the candidates with logit >= threshold, in their order. The sorted prefix stays sorted:
 * what it loses is its tail. */
static void keep_at_least(bubo_sampler *s, float threshold) {
    size_t kept = 0, kept_sorted = 0;
    for (size_t i = 0; i < s->n_cand; i++) {
        if (s->cand[i].logit >= threshold) {
            if (i < s->n_sorted)
                kept_sorted++;
            s->cand[kept++] = s->cand[i];
        }
    }
    s->n_cand = kept;
    s->n_sorted = kept_sorted;
}

static void keep_best(bubo_sampler *s, size_t k) {
    sort_prefix(s, k);
    if (k < s->n_cand)
        s->n_cand = k;
}

static size_t min_keep(const bubo_sampler *s) { return s->p.min_keep > 0 ? (size_t)s->p.min_keep : 0; }

/* ---- the stages ---------------------------------------------------------------------------- */

static int penalties_on(const bubo_sampler_params *p) {
    return p->repeat_last_n > 0 && (p->repeat_penalty != 1.0f || p->frequency_penalty != 0.0f || p->presence_penalty != 0.0f);
}

static void apply_penalties(bubo_sampler *s) {
    const bubo_sampler_params *p = &s->p;
    if (!penalties_on(p))
        return;
    if (++s->stamp_now == 0) { /* wrapped: forget every old stamp */
        memset(s->stamp, 0, (size_t)s->n_vocab * sizeof *s->stamp);
        s->stamp_now = 1;
    }
    const uint32_t n = s->hist_len < (uint32_t)p->repeat_last_n ? s->hist_len : (uint32_t)p->repeat_last_n;
    for (uint32_t i = 0; i < n; i++) {
        const int32_t t = s->recent[i];
        if (s->stamp[t] == s->stamp_now)
            continue;
        s->stamp[t] = s->stamp_now;
        const int32_t count = s->pen_count[t];
        float *l = &s->work[t];
        /* multiply a negative logit, divide a positive one: the penalty always lowers it */
        if (*l <= 0.0f)
            *l *= p->repeat_penalty;
        else
            *l /= p->repeat_penalty;
        *l -= (float)count * p->frequency_penalty + (float)(count > 0) * p->presence_penalty;
    }
}

static void top_n_sigma(bubo_sampler *s) {
    const float n = s->p.top_n_sigma;
    if (n <= 0.0f || s->n_cand <= 1)
        return;
    double sum = 0.0, max = -INFINITY;
    for (size_t i = 0; i < s->n_cand; i++) {
        sum += s->cand[i].logit;
        if (s->cand[i].logit > max)
            max = s->cand[i].logit;
    }
    const double mean = sum / (double)s->n_cand;
    double acc = 0.0;
    for (size_t i = 0; i < s->n_cand; i++) {
        double d = s->cand[i].logit - mean;
        acc += d * d;
    }
    const double sd = sqrt(acc / (double)s->n_cand);
    keep_at_least(s, (float)(max - n * sd));
}

static void top_k(bubo_sampler *s) {
    if (s->p.top_k > 0)
        keep_best(s, (size_t)s->p.top_k);
}

static int score_cmp(const void *x, const void *y) {
    const bubo_cand *a = x, *b = y;
    if (a->aux != b->aux)
        return a->aux < b->aux ? -1 : 1;
    return (a->id > b->id) - (a->id < b->id);
}

/* Locally typical sampling: keep the tokens whose surprise is closest to the entropy until their
 * mass exceeds typical_p. */
static void typical(bubo_sampler *s) {
    const float tp = s->p.typical_p;
    if (tp >= 1.0f)
        return;
    cand_softmax(s);
    double entropy = 0.0;
    for (size_t i = 0; i < s->n_cand; i++)
        if (s->cand[i].p > 0.0f)
            entropy -= (double)s->cand[i].p * log((double)s->cand[i].p);
    for (size_t i = 0; i < s->n_cand; i++) {
        const double p = s->cand[i].p;
        s->cand[i].aux = (float)fabs((p > 0.0 ? -log(p) : INFINITY) - entropy);
    }
    qsort(s->cand, s->n_cand, sizeof *s->cand, score_cmp);
    s->n_sorted = 0; /* now in score order, not logit order */
    const size_t mk = min_keep(s);
    double cum = 0.0;
    for (size_t i = 0; i < s->n_cand; i++) {
        cum += s->cand[i].p;
        if (cum > tp && (mk == 0 || i + 1 >= mk)) {
            s->n_cand = i + 1;
            break;
        }
    }
}

/* Nucleus: the fewest best tokens whose mass reaches top_p. */
static void top_p(bubo_sampler *s) {
    const float tp = s->p.top_p;
    if (tp >= 1.0f)
        return;
    cand_softmax(s);
    const size_t mk = min_keep(s);
    double cum = 0.0;
    for (size_t i = 0; i < s->n_cand; i++) {
        sort_through(s, i);
        cum += s->cand[i].p;
        if (cum >= tp && i + 1 >= mk) {
            s->n_cand = i + 1;
            break;
        }
    }
}

/* Keep tokens at least min_p times as likely as the best: logit >= max + log(min_p). */
static void min_p(bubo_sampler *s) {
    const float mp = s->p.min_p;
    if (mp <= 0.0f || s->n_cand == 0)
        return;
    const float threshold = cand_max_logit(s) + logf(mp);
    size_t count = 0;
    for (size_t i = 0; i < s->n_cand; i++)
        count += s->cand[i].logit >= threshold;
    if (count >= min_keep(s))
        keep_at_least(s, threshold);
    else
        keep_best(s, min_keep(s));
}

/* Exclude Top Choices: with probability xtc_probability, drop every token at least
 * xtc_threshold likely except the least likely of them. */
static void xtc(bubo_sampler *s, double coin) {
    if (s->n_cand < 2 || coin > s->p.xtc_probability)
        return;
    cand_softmax(s);
    size_t last = 0; /* the last of the leading run with p >= threshold */
    for (size_t i = 0; i < s->n_cand; i++) {
        sort_through(s, i);
        if (s->cand[i].p >= s->p.xtc_threshold)
            last = i;
        else
            break;
    }
    if (last > 0 && s->n_cand - last >= min_keep(s)) {
        memmove(s->cand, s->cand + last, (s->n_cand - last) * sizeof *s->cand);
        s->n_cand -= last;
        s->n_sorted = s->n_sorted > last ? s->n_sorted - last : 0;
    }
}

static void temperature_plain(bubo_sampler *s, float t) {
    if (t <= 0.0f) {
        keep_best(s, 1);
        return;
    }
    for (size_t i = 0; i < s->n_cand; i++)
        s->cand[i].logit /= t;
}

/* Plain temperature, or with dynatemp_range > 0 a temperature between temperature - range and
 * temperature + range that rises with the normalized entropy of the candidates. */
static void temperature(bubo_sampler *s) {
    const bubo_sampler_params *p = &s->p;
    if (p->dynatemp_range <= 0.0f) {
        temperature_plain(s, p->temperature);
        return;
    }
    if (s->n_cand <= 1)
        return;
    const float min_temp = fmaxf(0.0f, p->temperature - p->dynatemp_range);
    const float max_temp = p->temperature + p->dynatemp_range;
    const double max_entropy = log((double)s->n_cand);
    cand_softmax(s);
    double entropy = 0.0;
    for (size_t i = 0; i < s->n_cand; i++)
        if (s->cand[i].p > 0.0f)
            entropy -= (double)s->cand[i].p * log((double)s->cand[i].p);
    const double normalized = entropy / max_entropy;
    temperature_plain(s, (float)(min_temp + (max_temp - min_temp) * pow(normalized, p->dynatemp_exponent)));
}

/* The pick: walks the candidates in order until the running mass reaches u * total.
 * Leaves the normalized probabilities in cand[].p. */
static size_t draw(bubo_sampler *s, double u) {
    const double max = cand_max_logit(s);
    double sum = 0.0;
    for (size_t i = 0; i < s->n_cand; i++) {
        double e = exp((double)s->cand[i].logit - max);
        s->cand[i].p = (float)e;
        sum += e;
    }
    const double target = u * sum;
    size_t chosen = s->n_cand - 1; /* only reached through rounding */
    double cum = 0.0;
    for (size_t i = 0; i < s->n_cand; i++) {
        sort_through(s, i);
        cum += (double)s->cand[i].p;
        if (cum >= target) {
            chosen = i;
            break;
        }
    }
    const double inv = 1.0 / sum;
    for (size_t i = 0; i < s->n_cand; i++)
        s->cand[i].p = (float)((double)s->cand[i].p * inv);
    s->probs_normalized = 1;
    return chosen;
}

static void mirostat_update(bubo_sampler *s, double p_chosen) {
    const double surprise = -log2(p_chosen);
    s->mu -= (double)s->p.mirostat_eta * (surprise - (double)s->p.mirostat_tau);
}

/* Mirostat 1: estimate the Zipf exponent s_hat from the best MIROSTAT_M candidates, choose the k
 * that makes the expected surprise mu, sample from the top k, then move mu towards tau. */
static size_t mirostat_v1(bubo_sampler *s, double u) {
    sort_prefix(s, MIROSTAT_M);
    if (s->n_cand > 1) {
        cand_softmax(s);
        double sum_tb = 0.0, sum_tt = 0.0;
        for (size_t i = 0; i + 1 < MIROSTAT_M && i + 1 < s->n_cand; i++) {
            const double t = log((double)(i + 2) / (double)(i + 1));
            const double b = log((double)s->cand[i].p / (double)s->cand[i + 1].p);
            sum_tb += t * b;
            sum_tt += t * t;
        }
        const double s_hat = sum_tb / sum_tt;
        const double eps = s_hat - 1.0;
        const double k = pow(eps * pow(2.0, s->mu) / (1.0 - pow((double)s->n_vocab, -eps)), 1.0 / s_hat);
        /* a NaN k (a flat distribution) keeps one token, as llama.cpp does; a huge one keeps all */
        size_t keep = 1;
        if (k >= (double)s->n_cand)
            keep = s->n_cand;
        else if (k >= 1.0)
            keep = (size_t)k;
        keep_best(s, keep);
    }
    size_t chosen = draw(s, u);
    mirostat_update(s, s->cand[chosen].p);
    return chosen;
}

/* Mirostat 2: drop the candidates whose surprise -log2(p) exceeds mu (keeping the best), sample,
 * then move mu towards tau. */
static size_t mirostat_v2(bubo_sampler *s, double u) {
    cand_softmax(s);
    size_t keep = s->n_cand;
    for (size_t i = 0; i < s->n_cand; i++) {
        sort_through(s, i);
        if (-log2((double)s->cand[i].p) > s->mu) {
            keep = i;
            break;
        }
    }
    keep_best(s, keep > 0 ? keep : 1);
    size_t chosen = draw(s, u);
    mirostat_update(s, s->cand[chosen].p);
    return chosen;
}

/* ---- raw log-probabilities ---------------------------------------------------------------- */

/* The n_probs best raw logits, best first, as log-probabilities. */
static void raw_top(bubo_sampler *s, const float *logits, double max, double log_sum, bubo_token_logprob *top) {
    const size_t k = bubo_scan_top(s->isa, logits, s->n_vocab, (size_t)s->p.n_probs, 0, s->heap, s->heap);
    for (size_t i = 0; i < k; i++) {
        top[i].token = s->heap[i].id;
        top[i].logprob = ((double)s->heap[i].logit - max) - log_sum;
    }
}

/* How many of the best candidates the chain (without Mirostat) can look at, or 0 when it may need
 * every one. Top-n-sigma reads them all; after top-k every stage works on what top-k kept. Greedy
 * needs one: no stage before the temperature drops the best candidate (top-p keeps the first, min-p's
 * threshold max + log(min_p) is at most max, XTC and typical are off), and the temperature keeps
 * only it. */
static size_t chain_reach(const bubo_sampler_params *p) {
    if (p->mirostat != 0 || p->top_n_sigma > 0.0f)
        return 0;
    const int xtc_on = p->xtc_probability > 0.0f && p->xtc_threshold <= 0.5f;
    if (p->temperature <= 0.0f && p->dynatemp_range <= 0.0f && p->typical_p >= 1.0f && !xtc_on && p->min_p <= 1.0f)
        return 1;
    if (p->top_k > 0 && p->top_k <= REACH_MAX)
        return (size_t)p->top_k;
    return 0;
}

/* ---- the sampler ------------------------------------------------------------------------- */

bubo_status bubo_sampler_create(uint32_t n_vocab, const bubo_sampler_params *params, bubo_sampler **out,
                                bubo_err *err) {
    *out = NULL;
    const bubo_sampler_params *p = params;
    if (n_vocab == 0 || n_vocab > (uint32_t)INT32_MAX)
        return bubo_set_err(err, BUBO_ERR_INVALID, "n_vocab must be in 1..%d, got %u", INT32_MAX, n_vocab);
    const struct {
        const char *name;
        float v;
    } floats[] = {
        {"repeat_penalty", p->repeat_penalty},   {"frequency_penalty", p->frequency_penalty},
        {"presence_penalty", p->presence_penalty}, {"dry_multiplier", p->dry_multiplier},
        {"dry_base", p->dry_base},               {"top_n_sigma", p->top_n_sigma},
        {"typical_p", p->typical_p},             {"top_p", p->top_p},
        {"min_p", p->min_p},                     {"xtc_probability", p->xtc_probability},
        {"xtc_threshold", p->xtc_threshold},     {"temperature", p->temperature},
        {"dynatemp_range", p->dynatemp_range},   {"dynatemp_exponent", p->dynatemp_exponent},
        {"mirostat_tau", p->mirostat_tau},       {"mirostat_eta", p->mirostat_eta},
    };
    for (size_t i = 0; i < sizeof floats / sizeof floats[0]; i++)
        if (!isfinite(floats[i].v))
            return bubo_set_err(err, BUBO_ERR_INVALID, "%s must be a finite number, got %g", floats[i].name,
                                (double)floats[i].v);
    if (p->repeat_last_n < 0 || p->dry_penalty_last_n < 0)
        return bubo_set_err(err, BUBO_ERR_INVALID,
                            "repeat_last_n and dry_penalty_last_n must be >= 0 here (got %d, %d); resolve -1 "
                            "(the context size) before creating the sampler",
                            p->repeat_last_n, p->dry_penalty_last_n);
    if (p->repeat_penalty <= 0.0f)
        return bubo_set_err(err, BUBO_ERR_INVALID, "repeat_penalty must be > 0 (1 is off), got %g",
                            (double)p->repeat_penalty);
    if (p->dry_allowed_length < 0)
        return bubo_set_err(err, BUBO_ERR_INVALID, "dry_allowed_length must be >= 0, got %d", p->dry_allowed_length);
    if (p->min_p < 0.0f || p->min_p > 1.0f)
        /* above 1 the threshold passes the best token too and would leave no candidate */
        return bubo_set_err(err, BUBO_ERR_INVALID, "min_p must be in 0..1 (0 is off), got %g", (double)p->min_p);
    if (p->min_keep < 0)
        return bubo_set_err(err, BUBO_ERR_INVALID, "min_keep must be >= 0, got %d", p->min_keep);
    if (p->mirostat < 0 || p->mirostat > 2)
        return bubo_set_err(err, BUBO_ERR_INVALID, "mirostat must be 0 (off), 1 or 2, got %d", p->mirostat);
    if (p->n_probs < 0)
        return bubo_set_err(err, BUBO_ERR_INVALID, "n_probs must be >= 0, got %d", p->n_probs);
    for (size_t i = 0; i < p->n_logit_bias; i++) {
        const bubo_logit_bias *b = &p->logit_bias[i];
        if (b->token < 0 || (uint32_t)b->token >= n_vocab)
            return bubo_set_err(err, BUBO_ERR_INVALID, "logit_bias token %d is out of range (vocabulary of %u)",
                                b->token, n_vocab);
        if (isnan(b->bias) || b->bias == INFINITY)
            return bubo_set_err(err, BUBO_ERR_INVALID, "logit_bias for token %d must be finite or -inf, got %g",
                                b->token, (double)b->bias);
    }

    bubo_sampler *s = calloc(1, sizeof *s);
    if (!s)
        return bubo_set_err(err, BUBO_ERR_NOMEM, "out of memory");
    s->n_vocab = n_vocab;
    s->p = *p;
    if ((uint32_t)s->p.n_probs > n_vocab)
        s->p.n_probs = (int32_t)n_vocab;
    s->p.logit_bias = NULL;
    s->p.dry_breakers = NULL;
    s->p.dry_breaker_lens = NULL;
    s->p.vocab_pieces = NULL;
    s->p.vocab_offsets = NULL;

    s->n_bias = p->n_logit_bias;
    s->hist_cap = (uint32_t)(p->repeat_last_n > p->dry_penalty_last_n ? p->repeat_last_n : p->dry_penalty_last_n);
    s->bias = malloc((s->n_bias ? s->n_bias : 1) * sizeof *s->bias);
    s->hist = malloc((s->hist_cap ? s->hist_cap : 1) * sizeof *s->hist);
    s->recent = malloc((s->hist_cap ? s->hist_cap : 1) * sizeof *s->recent);
    /* Only what the parameters need is allocated here, on the thread that builds the request
     * (the server's): a vocabulary-sized buffer is 0.6 MB per 150k tokens, and zeroing four of them
     * cost a one-token answer 0.1 ms of the server's CPU. The copy of the logits waits for a step
     * that needs one (a mask, a bias, a history stage). */
    const int penalties = penalties_on(&s->p);
    s->pen_count = penalties ? calloc(n_vocab, sizeof *s->pen_count) : NULL;
    s->stamp = penalties ? calloc(n_vocab, sizeof *s->stamp) : NULL;
    s->reach = chain_reach(&s->p);
    s->cand = malloc((s->reach ? s->reach : (size_t)n_vocab) * sizeof *s->cand);
    s->isa = bubo_cpu_best_isa();
    const size_t n_heap = (size_t)s->p.n_probs > s->reach ? (size_t)s->p.n_probs : s->reach;
    s->heap = malloc((n_heap + 1) * sizeof *s->heap);
    if (!s->bias || !s->hist || !s->recent || (penalties && (!s->pen_count || !s->stamp)) || !s->cand || !s->heap) {
        bubo_sampler_free(s);
        return bubo_set_err(err, BUBO_ERR_NOMEM, "out of memory for a sampler over %u tokens", n_vocab);
    }
    if (s->n_bias)
        memcpy(s->bias, p->logit_bias, s->n_bias * sizeof *s->bias);
    bubo_status st = bubo_dry_create(n_vocab, p, &s->dry, err);
    if (st != BUBO_OK) {
        bubo_sampler_free(s);
        return st;
    }
    bubo_sampler_reset(s);
    *out = s;
    return BUBO_OK;
}

void bubo_sampler_free(bubo_sampler *s) {
    if (!s)
        return;
    bubo_dry_free(s->dry);
    free(s->bias);
    free(s->hist);
    free(s->recent);
    free(s->pen_count);
    free(s->stamp);
    free(s->work);
    free(s->cand);
    free(s->heap);
    free(s);
}

uint32_t bubo_sampler_n_vocab(const bubo_sampler *s) { return s->n_vocab; }
int32_t bubo_sampler_n_probs(const bubo_sampler *s) { return s->p.n_probs; }
uint64_t bubo_sampler_seed(const bubo_sampler *s) { return s->p.seed; }
double bubo_sampler_mirostat_mu(const bubo_sampler *s) { return s->mu; }

void bubo_sampler_reset(bubo_sampler *s) {
    if (s->pen_count)
        for (uint32_t i = 0; i < s->hist_len; i++)
            s->pen_count[s->hist[i]] = 0;
    s->hist_len = 0;
    s->hist_head = 0;
    s->mu = 2.0 * (double)s->p.mirostat_tau;
    s->n_cand = 0;
    s->n_sorted = 0;
    rng_seed(s->rng, s->p.seed);
}

bubo_status bubo_sampler_accept(bubo_sampler *s, int32_t token, bubo_err *err) {
    if (token < 0 || (uint32_t)token >= s->n_vocab)
        return bubo_set_err(err, BUBO_ERR_INVALID, "token %d is out of range (vocabulary of %u)", token, s->n_vocab);
    if (s->hist_cap == 0)
        return BUBO_OK;
    const uint32_t pen_n = (uint32_t)s->p.repeat_last_n;
    if (pen_n > 0 && s->pen_count) {
        if (s->hist_len >= pen_n) { /* the token leaving the penalty window */
            uint32_t oldest = (s->hist_head + s->hist_cap - pen_n) % s->hist_cap;
            s->pen_count[s->hist[oldest]]--;
        }
        s->pen_count[token]++;
    }
    s->hist[s->hist_head] = token;
    s->hist_head = (s->hist_head + 1) % s->hist_cap;
    if (s->hist_len < s->hist_cap)
        s->hist_len++;
    return BUBO_OK;
}

bubo_status bubo_sampler_sample(bubo_sampler *s, const float *logits, const uint8_t *allowed, const double *draws,
                                bubo_token_logprob *out, bubo_token_logprob *top, bubo_err *err) {
    const uint32_t n = s->n_vocab;
    const bubo_sampler_params *p = &s->p;

    /* raw log-softmax: max, then the sum of exponentials (scan.c) */
    int bad;
    const float max = bubo_scan_max(s->isa, logits, n, &bad);
    if (bad) {
        for (uint32_t t = 0; t < n; t++)
            if (isnan(logits[t]) || logits[t] == INFINITY)
                return bubo_set_err(err, BUBO_ERR_INVALID, "logit of token %u is %g: logits must be finite or -inf",
                                    t, (double)logits[t]);
    }
    if (max == -INFINITY)
        return bubo_set_err(err, BUBO_ERR_INVALID, "every logit is -inf");
    const double log_sum = log(bubo_scan_sum_exp(s->isa, logits, n, max));

    /* the draws: XTC's coin only when XTC is on, then the pick's */
    const int xtc_on = p->mirostat == 0 && p->xtc_probability > 0.0f && p->xtc_threshold <= 0.5f;
    double xtc_coin = 1.0, pick = 0.0;
    if (draws) {
        xtc_coin = draws[0];
        pick = draws[1];
    } else {
        if (xtc_on)
            xtc_coin = rng_uniform(s->rng);
        pick = rng_uniform(s->rng);
    }

    /* stages on the whole vocabulary, on a copy when one of them is on */
    const float *row = logits;
    const int history_stages = p->mirostat == 0 && s->hist_len > 0 && (penalties_on(p) || s->dry);
    if (allowed || s->n_bias || history_stages) {
        if (!s->work && !(s->work = malloc((size_t)n * sizeof *s->work)))
            return bubo_set_err(err, BUBO_ERR_NOMEM, "out of memory for a sampler's step over %u tokens", n);
        memcpy(s->work, logits, (size_t)n * sizeof *s->work);
        if (allowed)
            for (uint32_t t = 0; t < n; t++)
                if (!allowed[t])
                    s->work[t] = -INFINITY;
        for (size_t i = 0; i < s->n_bias; i++)
            s->work[s->bias[i].token] += s->bias[i].bias;
        if (history_stages) {
            for (uint32_t i = 0; i < s->hist_len; i++)
                s->recent[i] = s->hist[(s->hist_head + s->hist_cap - 1 - i) % s->hist_cap];
            apply_penalties(s);
            if (s->dry)
                bubo_dry_apply(s->dry, s->recent, (int32_t)s->hist_len, s->work);
        }
        row = s->work;
    }

    /* the candidates: every token still allowed, or only the best the chain can reach, in order
     * (the list top-k would have left) */
    s->n_cand = 0;
    s->n_sorted = 0;
    s->probs_normalized = 0;
    if (s->reach > 0) {
        const size_t k = bubo_scan_top(s->isa, row, n, s->reach, 1, s->heap, s->heap);
        for (size_t i = 0; i < k; i++) {
            s->cand[i].id = s->heap[i].id;
            s->cand[i].logit = s->heap[i].logit;
        }
        s->n_cand = k;
        s->n_sorted = k;
    } else {
        for (uint32_t t = 0; t < n; t++) {
            if (row[t] > -INFINITY) {
                s->cand[s->n_cand].id = (int32_t)t;
                s->cand[s->n_cand].logit = row[t];
                s->n_cand++;
            }
        }
    }
    if (s->n_cand == 0)
        return bubo_set_err(err, BUBO_ERR_INVALID, "no token is allowed: the mask and the logit biases exclude all %u",
                            n);

    size_t chosen;
    if (p->mirostat == 0) {
        top_n_sigma(s);
        top_k(s);
        typical(s);
        top_p(s);
        min_p(s);
        if (xtc_on)
            xtc(s, xtc_coin);
        temperature(s);
        chosen = draw(s, pick);
    } else {
        temperature_plain(s, p->temperature);
        chosen = p->mirostat == 1 ? mirostat_v1(s, pick) : mirostat_v2(s, pick);
    }

    const int32_t token = s->cand[chosen].id;
    out->token = token;
    out->logprob = ((double)logits[token] - (double)max) - log_sum;
    if (top && p->n_probs > 0)
        raw_top(s, logits, max, log_sum, top);
    return BUBO_OK;
}

size_t bubo_sampler_n_candidates(const bubo_sampler *s) { return s->probs_normalized ? s->n_cand : 0; }

void bubo_sampler_candidates(bubo_sampler *s, int32_t *ids, float *probs) {
    if (!s->probs_normalized)
        return;
    /* p is monotone in the final logit, so logit order is probability order */
    sort_prefix(s, s->n_cand);
    for (size_t i = 0; i < s->n_cand; i++) {
        ids[i] = s->cand[i].id;
        probs[i] = s->cand[i].p;
    }
}
