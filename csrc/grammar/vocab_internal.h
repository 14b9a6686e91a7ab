/* The vocabulary's byte trie (vocab.c builds it, matcher.c walks it). */
#ifndef BUBO_GRAMMAR_VOCAB_INTERNAL_H
#define BUBO_GRAMMAR_VOCAB_INTERNAL_H

#include <stdint.h>

#include "bubo/grammar.h"

/* Nodes in depth-first preorder, so a walk is a loop over the array: a node's first child is the
 * next node, and skipping a subtree is a jump to subtree_end. The root (empty path) is implicit. */
typedef struct {
    uint32_t subtree_end; /* index of the first node after this node's subtree */
    uint32_t tok_begin;   /* sorted_ids[tok_begin .. tok_end): tokens whose bytes end here */
    uint32_t tok_end;
    uint16_t depth;       /* bytes on the path from the root, this node's included (>= 1) */
    uint8_t byte;         /* the byte on the edge into this node */
} trie_node;

struct bubo_grammar_vocab {
    char *pieces;          /* every token's bytes, concatenated */
    uint64_t *offsets;     /* (n_vocab + 1) token i is pieces[offsets[i] .. offsets[i + 1]) */
    uint32_t n_vocab;
    uint32_t *sorted_ids;  /* (n_vocab) ids of non-empty tokens in byte order */
    trie_node *nodes;      /* (n_nodes) */
    uint32_t n_nodes;
    uint32_t max_len;      /* longest token, in bytes */
    uint32_t n_sorted;     /* non-empty tokens */
    /* The bytes met anywhere in a node's subtree, its own edge included: ASCII bytes as a
     * 128-bit set, and flags. A state that loops to itself on every one of them (and, if the
     * subtree has non-ASCII bytes, on every character, the paths being valid UTF-8) accepts
     * the whole subtree without walking it. */
    uint64_t (*subtree_ascii)[2]; /* (n_nodes) */
    uint8_t *subtree_flags;       /* (n_nodes) SUBTREE_HIGH | SUBTREE_BAD_UTF8 */
};

#define SUBTREE_HIGH 1     /* some byte >= 0x80 in the subtree */
#define SUBTREE_BAD_UTF8 2 /* some path from the root into the subtree is not a UTF-8 prefix */

/* The tokens whose bytes end in node i's subtree are sorted_ids[nodes[i].tok_begin .. this). */
static inline uint32_t trie_subtree_tok_end(const bubo_grammar_vocab *v, uint32_t i) {
    uint32_t e = v->nodes[i].subtree_end;
    return e < v->n_nodes ? v->nodes[e].tok_begin : v->n_sorted;
}

#endif
