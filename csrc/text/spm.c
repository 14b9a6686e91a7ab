/* SentencePiece over one raw-text fragment, as llama.cpp's llm_tokenizer_spm_session: spaces
 * become U+2581, the text is cut into UTF-8 characters, and the adjacent pair whose
 * concatenation is the vocabulary token with the highest score is merged first (ties: leftmost
 * first), until no adjacent pair forms a token. A character left that is not a token falls back
 * to its bytes' <0xXX> tokens. */
#include <stdlib.h>
#include <string.h>

#include "text/text_internal.h"

typedef struct {
    int32_t prev, next; /* neighbours, -1 at the ends */
    uint32_t start, n;  /* byte span in the escaped text; n == 0 once merged into the left one */
} spm_symbol;

typedef struct {
    float score;
    int32_t left, right;
    uint32_t size; /* bytes of left + right when queued: a later mismatch means stale */
} spm_bigram;

static inline int bigram_before(const spm_bigram *a, const spm_bigram *b) {
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

typedef struct {
    spm_bigram *v;
    size_t n;
} spm_heap;

static void heap_push(spm_heap *h, spm_bigram b) {
    size_t i = h->n++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!bigram_before(&b, &h->v[parent])) break;
        h->v[i] = h->v[parent];
        i = parent;
    }
    h->v[i] = b;
}

static spm_bigram heap_pop(spm_heap *h) {
    spm_bigram top = h->v[0];
    spm_bigram last = h->v[--h->n];
    size_t i = 0, n = h->n;
    for (;;) {
        size_t child = 2 * i + 1;
        if (child >= n) break;
        if (child + 1 < n && bigram_before(&h->v[child + 1], &h->v[child])) child++;
        if (!bigram_before(&h->v[child], &last)) break;
        h->v[i] = h->v[child];
        i = child;
    }
    if (n > 0) h->v[i] = last;
    return top;
}

static void try_add_bigram(const bubo_tokenizer *t, const uint8_t *text, const spm_symbol *sym, spm_heap *h,
                           int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    uint32_t size = sym[left].n + sym[right].n;
    int32_t id = bubo_strmap_get(t, (const char *)text + sym[left].start, size);
    if (id < 0) return;
    heap_push(h, (spm_bigram){t->scores[id], left, right, size});
}

static void emit_symbol(const bubo_tokenizer *t, const uint8_t *text, const spm_symbol *s, bubo_tok_sink *sink) {
    int32_t id = bubo_strmap_get(t, (const char *)text + s->start, s->n);
    if (id >= 0) {
        bubo_sink_push(sink, id);
        return;
    }
    for (uint32_t k = 0; k < s->n; k++) {
        if (t->spm_byte_token[text[s->start + k]] < 0) {
            /* No byte token for it: llama.cpp stops with an exception here; SentencePiece
             * without byte fallback gives the unknown token for the character. */
            if (t->special_ids[BUBO_SPECIAL_UNK] >= 0) bubo_sink_push(sink, t->special_ids[BUBO_SPECIAL_UNK]);
            return;
        }
    }
    for (uint32_t k = 0; k < s->n; k++) bubo_sink_push(sink, t->spm_byte_token[text[s->start + k]]);
}

#define ESCAPED_SPACE "\xe2\x96\x81" /* U+2581 LOWER ONE EIGHTH BLOCK */

int bubo_spm_fragment(const bubo_tokenizer *t, const uint8_t *raw, size_t len, int prefix_space,
                      bubo_tok_sink *sink) {
    int ok = 0;
    uint8_t *text = malloc(3 * (len + 1));
    spm_symbol *sym = NULL;
    spm_heap h = {NULL, 0};
    if (!text) goto done;

    size_t n = 0;
    if (prefix_space) {
        memcpy(text, ESCAPED_SPACE, 3);
        n = 3;
    }
    for (size_t i = 0; i < len; i++) {
        if (raw[i] == ' ') {
            memcpy(text + n, ESCAPED_SPACE, 3);
            n += 3;
        } else {
            text[n++] = raw[i];
        }
    }

    /* at most one symbol per byte (a stray lead byte can cut an escaped space in pieces);
     * n - 1 seed pairs, then at most two new pairs per merge and n - 1 merges */
    sym = malloc((n + 1) * sizeof *sym);
    h.v = malloc(3 * (n + 1) * sizeof *h.v);
    if (!sym || !h.v) goto done;
    size_t n_sym = 0;
    for (size_t off = 0; off < n;) {
        size_t clen = bubo_utf8_len(text[off]);
        if (clen > n - off) clen = n - off;
        sym[n_sym] = (spm_symbol){(int32_t)n_sym - 1, -1, (uint32_t)off, (uint32_t)clen};
        off += clen;
        if (off < n) sym[n_sym].next = (int32_t)n_sym + 1;
        n_sym++;
    }
    if (n_sym == 0) {
        ok = 1;
        goto done;
    }
    for (size_t k = 1; k < n_sym; k++) try_add_bigram(t, text, sym, &h, (int32_t)k - 1, (int32_t)k);

    while (h.n > 0) {
        spm_bigram b = heap_pop(&h);
        spm_symbol *l = &sym[b.left], *r = &sym[b.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != b.size) continue;
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) sym[r->next].prev = b.left;
        try_add_bigram(t, text, sym, &h, l->prev, b.left);
        try_add_bigram(t, text, sym, &h, b.left, l->next);
    }

    for (int32_t k = 0; k >= 0; k = sym[k].next) emit_symbol(t, text, &sym[k], sink);
    ok = 1;
done:
    free(text);
    free(sym);
    free(h.v);
    return ok;
}
