/* GBNF grammars (llama.cpp's syntax) matched incrementally, with token-level masks.
 *
 *   bubo_grammar          a parsed grammar: rules flattened into one element array (immutable,
 *                         shareable between threads).
 *   bubo_grammar_vocab    a tokenizer's token bytes as a byte trie, built once per tokenizer and
 *                         shared by every matcher (immutable).
 *   bubo_grammar_matcher  one generation's state: the set of grammar stacks that the text so far
 *                         leaves alive, plus a UTF-8 sequence that a token may have left unfinished.
 *
 * A matcher borrows its grammar and vocab: both must outlive it. A matcher is not thread-safe;
 * clone it to branch. Memory is bounded: a state may hold at most BUBO_GRAMMAR_MAX_STACKS stacks
 * of at most BUBO_GRAMMAR_MAX_DEPTH frames; an advance that would exceed either fails with
 * BUBO_ERR_UNSUPPORTED rather than growing without end. */
#ifndef BUBO_GRAMMAR_H
#define BUBO_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "bubo/common.h"

#ifdef __cplusplus
extern "C" {
#endif

#define BUBO_GRAMMAR_MAX_REPEAT 4096          /* largest m or n in x{m,n} */
#define BUBO_GRAMMAR_MAX_NESTING 256          /* parentheses nested this deep are refused */
#define BUBO_GRAMMAR_MAX_ELEMENTS (1u << 20)  /* a grammar after repetitions are expanded */
#define BUBO_GRAMMAR_MAX_STACKS 4096          /* alive stacks in one state */
#define BUBO_GRAMMAR_MAX_DEPTH 2048           /* frames in one stack (nesting of the text) */
#define BUBO_GRAMMAR_MAX_WORK 65536           /* stack expansions in one advance */

typedef struct bubo_grammar bubo_grammar;
typedef struct bubo_grammar_vocab bubo_grammar_vocab;
typedef struct bubo_grammar_matcher bubo_grammar_matcher;

/* Parse GBNF text (len bytes, UTF-8) whose start rule is `root`. A syntax error, an undefined
 * rule, a missing root, left recursion or a grammar over the bounds above gives
 * BUBO_ERR_INVALID with "line L col C: ..." in err. */
bubo_status bubo_grammar_parse(const char *text, size_t len, const char *root, bubo_grammar **out,
                               bubo_err *err);
void bubo_grammar_free(bubo_grammar *g);
uint32_t bubo_grammar_n_rules(const bubo_grammar *g);

/* The byte trie of a vocabulary: token i is pieces[offsets[i] .. offsets[i+1]) (n_vocab + 1
 * offsets). A token with no bytes (control tokens) is never allowed by a mask. */
bubo_status bubo_grammar_vocab_create(const char *pieces, const uint64_t *offsets, uint32_t n_vocab,
                                      bubo_grammar_vocab **out, bubo_err *err);
void bubo_grammar_vocab_free(bubo_grammar_vocab *v);
uint32_t bubo_grammar_vocab_n(const bubo_grammar_vocab *v);
uint32_t bubo_grammar_vocab_n_nodes(const bubo_grammar_vocab *v);

/* vocab may be NULL for a matcher fed only bytes (no accept_token, no mask). */
bubo_status bubo_grammar_matcher_create(const bubo_grammar *g, const bubo_grammar_vocab *vocab,
                                        bubo_grammar_matcher **out, bubo_err *err);
bubo_status bubo_grammar_matcher_clone(const bubo_grammar_matcher *m, bubo_grammar_matcher **out,
                                       bubo_err *err);
void bubo_grammar_matcher_free(bubo_grammar_matcher *m);

/* Consume n bytes: *accepted is true if every byte keeps the text valid (the state advances),
 * false otherwise (the state is left unchanged). The bytes may end inside a UTF-8 character. */
bubo_status bubo_grammar_matcher_accept_bytes(bubo_grammar_matcher *m, const uint8_t *bytes, size_t n,
                                              bool *accepted, bubo_err *err);
/* accept_bytes with the token's bytes; a token with no bytes is never accepted. */
bubo_status bubo_grammar_matcher_accept_token(bubo_grammar_matcher *m, int32_t token, bool *accepted,
                                              bubo_err *err);
/* mask[i] = 1 if token i's bytes can all be consumed from this state, else 0 (n_vocab entries).
 * End-of-generation tokens are the caller's: allow them iff bubo_grammar_matcher_accepting(). */
bubo_status bubo_grammar_matcher_mask(bubo_grammar_matcher *m, uint8_t *mask, bubo_err *err);
/* The text so far is a complete sentence of the grammar (no unfinished UTF-8 character). */
bool bubo_grammar_matcher_accepting(const bubo_grammar_matcher *m);
/* The fewest bytes that finish the text so far as a sentence of the grammar (0 when it is one
 * already; SIZE_MAX when nothing can finish it). */
size_t bubo_grammar_matcher_shortest_len(const bubo_grammar_matcher *m);
/* Write one such shortest completion (cap bytes at least shortest_len) and its length to *n
 * (SIZE_MAX when there is none). Where a class leaves a choice, a letter, then a digit, then
 * printable ASCII, then the smallest character is written. */
bubo_status bubo_grammar_matcher_shortest(const bubo_grammar_matcher *m, uint8_t *out, size_t cap, size_t *n,
                                          bubo_err *err);
/* Alive stacks in the current state (diagnostics and tests). */
size_t bubo_grammar_matcher_n_stacks(const bubo_grammar_matcher *m);

#ifdef __cplusplus
}
#endif
#endif
