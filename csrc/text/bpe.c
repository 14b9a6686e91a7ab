/* Byte-level BPE over one raw-text fragment, as llama.cpp's llm_tokenizer_bpe_session:
 * pre-tokenize into words, show each byte of a word as its GPT-2 alphabet character, then merge
 * adjacent symbols lowest rank first (ties: leftmost first) until no pair has a merge.
 *
 * Symbols carry token ids rather than strings: every merge names two vocabulary tokens (checked
 * at load), so "is there a merge for these two strings" is "is there a merge for these two ids",
 * a lookup in a (left id, right id) hash map. */
#include <stdlib.h>

#include "text/text_internal.h"

typedef struct {
    int32_t prev, next; /* neighbours in the word, -1 at the ends */
    uint32_t start, n;  /* byte span in the word; n == 0 once merged into the left neighbour */
    int32_t id;         /* token of the span, -1 if the span is not a token */
} bpe_symbol;

typedef struct {
    int32_t rank;
    int32_t left, right;
    uint32_t size;  /* bytes of left + right when queued: a later mismatch means stale */
    int32_t result; /* token of the merged span, -1 if it is not a token */
} bpe_bigram;

typedef struct {
    bpe_symbol *sym;
    bpe_bigram *heap;
    size_t n_heap;
    uint8_t *enc; /* the word in the byte-level alphabet (ignore_merges lookups) */
    size_t cap;   /* bytes of word the buffers hold */
} bpe_scratch;

static int scratch_reserve(bpe_scratch *s, size_t n) {
    if (n <= s->cap) return 1;
    size_t cap = n < 256 ? 256 : n;
    bpe_symbol *sym = realloc(s->sym, cap * sizeof *sym);
    if (!sym) return 0;
    s->sym = sym;
    /* n - 1 seeds, then at most two new pairs per merge and at most n - 1 merges */
    bpe_bigram *heap = realloc(s->heap, 3 * cap * sizeof *heap);
    if (!heap) return 0;
    s->heap = heap;
    uint8_t *enc = realloc(s->enc, 2 * cap);
    if (!enc) return 0;
    s->enc = enc;
    s->cap = cap;
    return 1;
}

// ---------------------------------------------------------------------------------------------
// min-heap on (rank, left)

static inline int bigram_before(const bpe_bigram *a, const bpe_bigram *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
}

static void heap_push(bpe_scratch *s, bpe_bigram b) {
    size_t i = s->n_heap++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!bigram_before(&b, &s->heap[parent])) break;
        s->heap[i] = s->heap[parent];
        i = parent;
    }
    s->heap[i] = b;
}

static bpe_bigram heap_pop(bpe_scratch *s) {
    bpe_bigram top = s->heap[0];
    bpe_bigram last = s->heap[--s->n_heap];
    size_t i = 0, n = s->n_heap;
    for (;;) {
        size_t child = 2 * i + 1;
        if (child >= n) break;
        if (child + 1 < n && bigram_before(&s->heap[child + 1], &s->heap[child])) child++;
        if (!bigram_before(&s->heap[child], &last)) break;
        s->heap[i] = s->heap[child];
        i = child;
    }
    if (n > 0) s->heap[i] = last;
    return top;
}

// ---------------------------------------------------------------------------------------------

static inline const int32_t *find_merge(const bubo_pairmap *m, int32_t left, int32_t right) {
    uint64_t key = (((uint64_t)(uint32_t)left << 32) | (uint32_t)right) + 1;
    uint64_t h = key * 0x9e3779b97f4a7c15ull;
    for (uint64_t i = (h ^ (h >> 29)) & m->mask;; i = (i + 1) & m->mask) {
        if (m->keys[i] == key) return &m->rank[i];
        if (m->keys[i] == 0) return NULL;
    }
}

static void try_add_bigram(const bubo_tokenizer *t, bpe_scratch *s, int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const bpe_symbol *l = &s->sym[left], *r = &s->sym[right];
    if (l->id < 0 || r->id < 0) return;
    const int32_t *rank = find_merge(&t->merges, l->id, r->id);
    if (!rank) return;
    /* result[] sits at the same slot as rank[] */
    int32_t result = t->merges.result[rank - t->merges.rank];
    heap_push(s, (bpe_bigram){*rank, left, right, l->n + r->n, result});
}

static void emit_span_bytes(const bubo_tokenizer *t, const uint8_t *w, uint32_t start, uint32_t n,
                            bubo_tok_sink *sink) {
    /* a span that is not a token: llama.cpp looks up each byte of its alphabet text alone */
    for (uint32_t k = start; k < start + n; k++) {
        for (int j = 0; j < 2; j++) {
            int32_t id = t->byte_fallback[w[k]][j];
            if (id >= 0) bubo_sink_push(sink, id);
        }
    }
}

static int bpe_word(const bubo_tokenizer *t, const uint8_t *w, size_t n, bpe_scratch *s, bubo_tok_sink *sink) {
    if (!scratch_reserve(s, n)) return 0;

    if (t->ignore_merges) {
        size_t m = 0;
        for (size_t k = 0; k < n; k++) m += bubo_utf8_encode(bubo_byte_to_cp(w[k]), s->enc + m);
        int32_t id = bubo_strmap_get(t, (const char *)s->enc, m);
        if (id >= 0) {
            bubo_sink_push(sink, id);
            return 1;
        }
    }

    bpe_symbol *sym = s->sym;
    for (size_t k = 0; k < n; k++) {
        sym[k] = (bpe_symbol){(int32_t)k - 1, k + 1 < n ? (int32_t)k + 1 : -1, (uint32_t)k, 1, t->byte_token[w[k]]};
    }
    s->n_heap = 0;
    for (size_t k = 1; k < n; k++) try_add_bigram(t, s, (int32_t)k - 1, (int32_t)k);

    while (s->n_heap > 0) {
        bpe_bigram b = heap_pop(s);
        bpe_symbol *l = &sym[b.left], *r = &sym[b.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != b.size) continue;
        l->id = b.result;
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) sym[r->next].prev = b.left;
        try_add_bigram(t, s, l->prev, b.left);
        try_add_bigram(t, s, b.left, l->next);
    }

    for (int32_t k = 0; k >= 0; k = sym[k].next) {
        if (sym[k].id >= 0) {
            bubo_sink_push(sink, sym[k].id);
        } else {
            emit_span_bytes(t, w, sym[k].start, sym[k].n, sink);
        }
    }
    return 1;
}

int bubo_bpe_fragment(const bubo_tokenizer *t, const uint8_t *text, size_t len, bubo_tok_sink *sink) {
    int ok = 0;
    /* code points as llama.cpp decodes them, re-encoded: invalid bytes become U+FFFD there too */
    uint32_t *cps = malloc((len + 1) * sizeof *cps);
    uint32_t *offs = malloc((len + 1) * sizeof *offs);
    uint8_t *flags = malloc(len + 1);
    uint8_t *u8 = malloc(3 * len + 1);
    bubo_u32vec words = {0}, tmp = {0};
    bpe_scratch s = {0};
    if (!cps || !offs || !flags || !u8) goto done;

    size_t n = 0, m = 0;
    for (size_t i = 0; i < len;) {
        uint32_t cp = bubo_utf8_decode_llama(text, len, &i);
        cps[n] = cp;
        flags[n] = bubo_uc_flags(cp);
        offs[n] = (uint32_t)m;
        m += bubo_utf8_encode(cp, u8 + m);
        n++;
    }
    offs[n] = (uint32_t)m;

    bubo_cpview v = {cps, flags, n};
    if (!bubo_pretokenize(t->pre, &v, &words, &tmp)) goto done;
    size_t at = 0;
    for (size_t i = 0; i < words.n; i++) {
        size_t end = at + words.v[i];
        if (!bpe_word(t, u8 + offs[at], offs[end] - offs[at], &s, sink)) goto done;
        at = end;
    }
    ok = 1;
done:
    free(cps);
    free(offs);
    free(flags);
    free(u8);
    bubo_u32vec_free(&words);
    bubo_u32vec_free(&tmp);
    free(s.sym);
    free(s.heap);
    free(s.enc);
    return ok;
}
