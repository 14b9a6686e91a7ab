/* The byte trie of a vocabulary: sort the tokens by their bytes, then each token adds the nodes
 * for the bytes past its common prefix with the previous one. Built once per tokenizer. */
#include <stdlib.h>
#include <string.h>

#include "grammar/vocab_internal.h"

#define MAX_TOKEN_BYTES 65535 /* trie_node.depth is 16 bits */

typedef struct {
    const char *bytes;
    uint32_t len;
    uint32_t id;
} token_key; /* what the sort compares, so that the comparator needs no global context */

static int cmp_tokens(const void *pa, const void *pb) {
    const token_key *a = pa, *b = pb;
    int c = memcmp(a->bytes, b->bytes, a->len < b->len ? a->len : b->len);
    if (c) return c;
    if (a->len != b->len) return a->len < b->len ? -1 : 1;
    return a->id < b->id ? -1 : a->id > b->id; /* equal bytes: by id, so the order is total */
}

/* A UTF-8 validator (Unicode's table 3-7): continuation bytes still due and the range the next
 * one must fall in. It rejects exactly what the matcher rejects, at the same byte. */
#define UTF8_INVALID 0xFF
typedef struct {
    uint8_t left, lo, hi;
} utf8_dec;

static utf8_dec utf8_step(utf8_dec s, uint8_t b) {
    const utf8_dec bad = {UTF8_INVALID, 0, 0};
    if (s.left == UTF8_INVALID) return bad;
    if (s.left > 0) {
        if (b < s.lo || b > s.hi) return bad;
        return (utf8_dec){(uint8_t)(s.left - 1), 0x80, 0xBF};
    }
    if (b < 0x80) return s;
    if (b >= 0xC2 && b <= 0xDF) return (utf8_dec){1, 0x80, 0xBF};
    if (b == 0xE0) return (utf8_dec){2, 0xA0, 0xBF};
    if (b == 0xED) return (utf8_dec){2, 0x80, 0x9F};
    if (b >= 0xE1 && b <= 0xEF) return (utf8_dec){2, 0x80, 0xBF};
    if (b == 0xF0) return (utf8_dec){3, 0x90, 0xBF};
    if (b == 0xF4) return (utf8_dec){3, 0x80, 0x8F};
    if (b >= 0xF1 && b <= 0xF3) return (utf8_dec){3, 0x80, 0xBF};
    return bad;
}

void bubo_grammar_vocab_free(bubo_grammar_vocab *v) {
    if (!v) return;
    free(v->pieces);
    free(v->offsets);
    free(v->sorted_ids);
    free(v->nodes);
    free(v->subtree_ascii);
    free(v->subtree_flags);
    free(v);
}

uint32_t bubo_grammar_vocab_n(const bubo_grammar_vocab *v) { return v->n_vocab; }
uint32_t bubo_grammar_vocab_n_nodes(const bubo_grammar_vocab *v) { return v->n_nodes; }

bubo_status bubo_grammar_vocab_create(const char *pieces, const uint64_t *offsets, uint32_t n_vocab,
                                      bubo_grammar_vocab **out, bubo_err *err) {
    *out = NULL;
    if (!offsets || n_vocab == 0 || offsets[0] != 0)
        return bubo_set_err(err, BUBO_ERR_INVALID, "grammar vocab: offsets must start at 0 (n_vocab %u)", n_vocab);
    uint64_t total = offsets[n_vocab];
    for (uint32_t i = 0; i < n_vocab; i++) {
        if (offsets[i + 1] < offsets[i])
            return bubo_set_err(err, BUBO_ERR_INVALID, "grammar vocab: offsets decrease at token %u", i);
        if (offsets[i + 1] - offsets[i] > MAX_TOKEN_BYTES)
            return bubo_set_err(err, BUBO_ERR_INVALID, "grammar vocab: token %u is longer than %d bytes", i,
                                MAX_TOKEN_BYTES);
    }
    bubo_grammar_vocab *v = calloc(1, sizeof *v);
    if (!v) return bubo_set_err(err, BUBO_ERR_NOMEM, "grammar vocab: out of memory");
    v->n_vocab = n_vocab;
    v->pieces = malloc(total ? total : 1);
    v->offsets = malloc((n_vocab + 1) * sizeof *v->offsets);
    v->sorted_ids = malloc(n_vocab * sizeof *v->sorted_ids);
    if (!v->pieces || !v->offsets || !v->sorted_ids) goto oom;
    if (total) memcpy(v->pieces, pieces, total);
    memcpy(v->offsets, offsets, (n_vocab + 1) * sizeof *offsets);

    uint32_t n_sorted = 0;
    uint64_t n_nodes_max = 0;
    for (uint32_t i = 0; i < n_vocab; i++) {
        uint64_t len = offsets[i + 1] - offsets[i];
        if (len == 0) continue; /* control tokens: never in a mask */
        v->sorted_ids[n_sorted++] = i;
        n_nodes_max += len;
        if (len > v->max_len) v->max_len = (uint32_t)len;
    }
    if (n_nodes_max >= UINT32_MAX) {
        bubo_grammar_vocab_free(v);
        return bubo_set_err(err, BUBO_ERR_INVALID, "grammar vocab: too many bytes");
    }
    token_key *keys = malloc((n_sorted ? n_sorted : 1) * sizeof *keys);
    if (!keys) goto oom;
    for (uint32_t k = 0; k < n_sorted; k++) {
        uint32_t id = v->sorted_ids[k];
        keys[k] = (token_key){v->pieces + v->offsets[id], (uint32_t)(v->offsets[id + 1] - v->offsets[id]), id};
    }
    qsort(keys, n_sorted, sizeof *keys, cmp_tokens);
    for (uint32_t k = 0; k < n_sorted; k++) v->sorted_ids[k] = keys[k].id;
    free(keys);

    v->nodes = malloc((n_nodes_max ? n_nodes_max : 1) * sizeof *v->nodes);
    uint32_t *path = malloc(((size_t)v->max_len + 1) * sizeof *path); /* node index at each depth */
    if (!v->nodes || !path) {
        free(path);
        goto oom;
    }
    uint32_t n = 0, path_len = 0;
    const char *prev = NULL;
    uint64_t prev_len = 0;
    for (uint32_t k = 0; k < n_sorted; k++) {
        uint32_t id = v->sorted_ids[k];
        const char *s = v->pieces + v->offsets[id];
        uint64_t len = v->offsets[id + 1] - v->offsets[id];
        uint64_t common = 0;
        while (common < len && common < prev_len && s[common] == prev[common]) common++;
        /* close the nodes of the previous path below the common prefix */
        while (path_len > common) v->nodes[path[--path_len]].subtree_end = n;
        for (uint64_t d = common; d < len; d++) {
            v->nodes[n] = (trie_node){.depth = (uint16_t)(d + 1), .byte = (uint8_t)s[d], .tok_begin = k, .tok_end = k};
            path[path_len++] = n++;
        }
        trie_node *end = &v->nodes[path[len - 1]];
        if (end->tok_begin == end->tok_end) end->tok_begin = k; /* sorted: same bytes are adjacent */
        end->tok_end = k + 1;
        prev = s;
        prev_len = len;
    }
    while (path_len > 0) v->nodes[path[--path_len]].subtree_end = n;
    free(path);
    v->n_nodes = n;
    v->n_sorted = n_sorted;
    v->subtree_ascii = calloc(n ? n : 1, sizeof *v->subtree_ascii);
    v->subtree_flags = calloc(n ? n : 1, 1);
    utf8_dec *dec = malloc(((size_t)v->max_len + 1) * sizeof *dec); /* decoder state at each depth */
    if (!v->subtree_ascii || !v->subtree_flags || !dec) {
        free(dec);
        goto oom;
    }
    dec[0] = (utf8_dec){0, 0, 0};
    for (uint32_t i = 0; i < n; i++) { /* preorder: the parent's state is dec[depth - 1] */
        uint8_t b = v->nodes[i].byte;
        dec[v->nodes[i].depth] = utf8_step(dec[v->nodes[i].depth - 1], b);
        if (b >= 128) v->subtree_flags[i] |= SUBTREE_HIGH;
        if (dec[v->nodes[i].depth].left == UTF8_INVALID) v->subtree_flags[i] |= SUBTREE_BAD_UTF8;
    }
    free(dec);
    for (uint32_t i = n; i-- > 0;) { /* children come after their parent: fill bottom-up */
        uint8_t b = v->nodes[i].byte;
        if (b < 128) v->subtree_ascii[i][b >> 6] |= 1ull << (b & 63);
        for (uint32_t j = i + 1; j < v->nodes[i].subtree_end; j = v->nodes[j].subtree_end) {
            v->subtree_ascii[i][0] |= v->subtree_ascii[j][0];
            v->subtree_ascii[i][1] |= v->subtree_ascii[j][1];
            v->subtree_flags[i] |= v->subtree_flags[j];
        }
    }
    *out = v;
    return BUBO_OK;
oom:
    bubo_grammar_vocab_free(v);
    return bubo_set_err(err, BUBO_ERR_NOMEM, "grammar vocab: out of memory");
}
