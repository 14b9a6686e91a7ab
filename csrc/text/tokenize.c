/* Text -> tokens: special tokens first, then the model's tokenizer on the text between them
 * (llama_vocab::impl::tokenize and tokenizer_st_partition). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "text/text_internal.h"

/* llama.cpp trims with C isspace() around LSTRIP/RSTRIP tokens */
static int c_isspace(uint8_t c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

enum { RAW = 0, TOKEN = 1, STRIPPED = 2 };

typedef struct {
    uint8_t *state;   /* (len) RAW, TOKEN or STRIPPED per byte */
    int32_t *token_at; /* (len) the token starting at this byte, -1 elsewhere */
} partition;

/* The special token of highest search priority (longest text) that occurs at pos and is at
 * most max_len bytes long; -1 if none. */
static int32_t best_match(const bubo_tokenizer *t, const uint8_t *s, size_t len, size_t pos, size_t max_len,
                          uint32_t skipped) {
    int32_t node = 0, best = -1;
    for (size_t k = pos; k < len && k - pos < max_len; k++) {
        int32_t c = t->trie[node].first_child;
        while (c >= 0 && t->trie[c].byte != s[k]) c = t->trie[c].next_sibling;
        if (c < 0) break;
        node = c;
        int32_t id = t->trie[node].token;
        if (id >= 0 && !(t->attr[id] & skipped)) best = id; /* deeper is longer is searched first */
    }
    return best;
}

/* min-heap of (search priority << 32 | position) */
typedef struct {
    uint64_t *v;
    size_t n;
} occ_heap;

static void occ_push(occ_heap *h, uint64_t x) {
    size_t i = h->n++;
    while (i > 0 && h->v[(i - 1) / 2] > x) {
        h->v[i] = h->v[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h->v[i] = x;
}

static uint64_t occ_pop(occ_heap *h) {
    uint64_t top = h->v[0], last = h->v[--h->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n) break;
        if (c + 1 < h->n && h->v[c + 1] < h->v[c]) c++;
        if (h->v[c] >= last) break;
        h->v[i] = h->v[c];
        i = c;
    }
    if (h->n > 0) h->v[i] = last;
    return top;
}

/* llama.cpp searches each special token in turn, longest first, through the text not yet
 * claimed, left to right, each occurrence becoming a token (tokenizer_st_partition). Same
 * result without a pass over the text per special token: take the occurrences in that order
 * (search priority, then position) from a heap holding, per position, its best occurrence not
 * yet tried, and accept one if its bytes are all unclaimed. A position already claimed is done
 * with (its other occurrences all cover it); one whose occurrence ran into a claimed byte
 * further on offers its next shorter occurrence. */
/* The longest special token at pos within max_len bytes that may stand there: none that would
 * cross the end of pos's region (plain span or not), and no control or unknown token inside a
 * plain span. region_end NULL: the text is one region. */
static int32_t match_at(const bubo_tokenizer *t, const uint8_t *s, size_t len, size_t pos, size_t max_len,
                        uint32_t skipped, const uint8_t *plain, const uint32_t *region_end) {
    if (region_end) {
        if (region_end[pos] - pos < max_len) max_len = region_end[pos] - pos;
        if (plain[pos]) skipped |= BUBO_TOKEN_ATTR_CONTROL | BUBO_TOKEN_ATTR_UNKNOWN;
    }
    return best_match(t, s, len, pos, max_len, skipped);
}

static int find_special(const bubo_tokenizer *t, const uint8_t *s, size_t len, int parse_special, partition *p,
                        const uint8_t *plain, const uint32_t *region_end) {
    const uint32_t skipped = parse_special ? 0 : (BUBO_TOKEN_ATTR_CONTROL | BUBO_TOKEN_ATTR_UNKNOWN);
    occ_heap h = {NULL, 0};
    size_t cap = 0;
    for (size_t pos = 0; pos < len; pos++) {
        if (!t->trie_first_byte[s[pos]]) continue;
        int32_t id = match_at(t, s, len, pos, SIZE_MAX, skipped, plain, region_end);
        if (id < 0) continue;
        if (h.n == cap) {
            cap = cap ? 2 * cap : 64;
            uint64_t *grown = realloc(h.v, cap * sizeof *h.v);
            if (!grown) {
                free(h.v);
                return 0;
            }
            h.v = grown;
        }
        h.v[h.n++] = ((uint64_t)t->special_priority[id] << 32) | pos; /* heapified below */
    }
    /* positions were appended in increasing order, per priority not: make it a heap */
    for (size_t i = h.n / 2; i-- > 0;) {
        uint64_t x = h.v[i];
        size_t k = i;
        for (;;) {
            size_t c = 2 * k + 1;
            if (c >= h.n) break;
            if (c + 1 < h.n && h.v[c + 1] < h.v[c]) c++;
            if (h.v[c] >= x) break;
            h.v[k] = h.v[c];
            k = c;
        }
        h.v[k] = x;
    }

    while (h.n > 0) {
        uint64_t top = occ_pop(&h);
        size_t pos = (uint32_t)top;
        if (p->state[pos] != RAW) continue;
        int32_t id = t->special_order[top >> 32];
        size_t n = t->text_len[id], k;
        for (k = pos; k < pos + n && p->state[k] == RAW; k++) {}
        if (k < pos + n) { /* runs into a token found earlier: a shorter one may still fit */
            int32_t next = match_at(t, s, len, pos, n - 1, skipped, plain, region_end);
            if (next >= 0) occ_push(&h, ((uint64_t)t->special_priority[next] << 32) | pos);
            continue;
        }
        for (k = pos; k < pos + n; k++) p->state[k] = TOKEN;
        p->token_at[pos] = id;
        if (t->attr[id] & BUBO_TOKEN_ATTR_LSTRIP) {
            for (k = pos; k > 0 && p->state[k - 1] == RAW && c_isspace(s[k - 1]); k--) p->state[k - 1] = STRIPPED;
        }
        if (t->attr[id] & BUBO_TOKEN_ATTR_RSTRIP) {
            for (k = pos + n; k < len && p->state[k] == RAW && c_isspace(s[k]); k++) p->state[k] = STRIPPED;
        }
    }
    free(h.v);
    return 1;
}

bubo_status bubo_tokenize(const bubo_tokenizer *t, const char *text, size_t len, unsigned flags, bubo_token *out,
                          size_t cap, size_t *n_tokens, bubo_err *err) {
    return bubo_tokenize_spans(t, text, len, flags, NULL, 0, out, cap, n_tokens, err);
}

bubo_status bubo_tokenize_spans(const bubo_tokenizer *t, const char *text, size_t len, unsigned flags,
                                const size_t *spans, size_t n_spans, bubo_token *out, size_t cap,
                                size_t *n_tokens, bubo_err *err) {
    *n_tokens = 0;
    if (len >= (1u << 30)) return bubo_set_err(err, BUBO_ERR_INVALID, "tokenize: %zu bytes of text is more than 1 GiB", len);
    for (size_t i = 0; i < n_spans; i++) {
        const size_t a = spans[2 * i], b = spans[2 * i + 1];
        if (a > b || b > len || (i > 0 && a < spans[2 * i - 1]))
            return bubo_set_err(err, BUBO_ERR_INVALID,
                                "tokenize: plain-text span %zu [%zu, %zu) is not sorted, or not within %zu bytes", i,
                                a, b, len);
    }
    const uint8_t *s = (const uint8_t *)text;
    const int add_special = (flags & BUBO_TOKENIZE_ADD_SPECIAL) != 0;
    const int parse_special = (flags & BUBO_TOKENIZE_PARSE_SPECIAL) != 0;
    bubo_tok_sink sink = {out, cap, 0};
    partition p = {calloc(len + 1, 1), malloc((len + 1) * sizeof(int32_t))};
    uint8_t *plain = NULL;
    uint32_t *region_end = NULL;
    if (!p.state || !p.token_at) goto nomem;
    for (size_t i = 0; i < len; i++) p.token_at[i] = -1;
    if (n_spans > 0 && len > 0) {
        plain = calloc(len, 1);
        region_end = malloc(len * sizeof *region_end);
        if (!plain || !region_end) goto nomem;
        for (size_t i = 0; i < n_spans; i++) memset(plain + spans[2 * i], 1, spans[2 * i + 1] - spans[2 * i]);
        region_end[len - 1] = (uint32_t)len;
        for (size_t i = len - 1; i-- > 0;) region_end[i] = plain[i] == plain[i + 1] ? region_end[i + 1] : (uint32_t)(i + 1);
    }
    if (!find_special(t, s, len, parse_special, &p, plain, region_end)) goto nomem;

    if (add_special && t->add_bos) bubo_sink_push(&sink, t->special_ids[BUBO_SPECIAL_BOS]);
    /* SentencePiece puts a space before the text at the start and after each special token */
    int prev_special = 1;
    for (size_t i = 0; i < len;) {
        if (p.state[i] == STRIPPED) {
            i++;
        } else if (p.state[i] == TOKEN) {
            bubo_sink_push(&sink, p.token_at[i]);
            i += t->text_len[p.token_at[i]];
            prev_special = 1;
        } else {
            size_t j = i;
            while (j < len && p.state[j] == RAW) j++;
            int ok;
            switch (t->model) {
            case BUBO_TOKENIZER_SPM:
                ok = bubo_spm_fragment(t, s + i, j - i, t->add_space_prefix && prev_special, &sink);
                break;
            case BUBO_TOKENIZER_WPM: ok = bubo_wpm_fragment(t, s + i, j - i, &sink); break;
            default: ok = bubo_bpe_fragment(t, s + i, j - i, &sink); break;
            }
            if (!ok) goto nomem;
            prev_special = 0;
            i = j;
        }
    }
    if (add_special && t->add_eos) bubo_sink_push(&sink, t->special_ids[BUBO_SPECIAL_EOS]);
    if (add_special && t->add_sep) bubo_sink_push(&sink, t->special_ids[BUBO_SPECIAL_SEP]); /* BERT's [SEP] */

    free(p.state);
    free(p.token_at);
    free(plain);
    free(region_end);
    *n_tokens = sink.n;
    return BUBO_OK;
nomem:
    free(p.state);
    free(p.token_at);
    free(plain);
    free(region_end);
    return bubo_set_err(err, BUBO_ERR_NOMEM, "tokenize: out of memory for %zu bytes of text", len);
}
