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
};

#endif
