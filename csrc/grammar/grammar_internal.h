/* The flattened grammar shared by the parser (parse.c) and the matcher (matcher.c).
 *
 * Like llama.cpp's llama_grammar_element: every rule is a run of elements in one array, its
 * alternatives separated by GE_ALT and closed by GE_END. A character class is a GE_CHAR or
 * GE_CHAR_NOT followed by GE_CHAR_RNG_UPPER (closing a range) and GE_CHAR_ALT (another char or
 * range) elements; a literal is one GE_CHAR per code point. Repetitions are rewritten into
 * generated rules at parse time, so the matcher knows only sequences, alternatives and
 * references. A "position" is an index into elems. */
#ifndef BUBO_GRAMMAR_INTERNAL_H
#define BUBO_GRAMMAR_INTERNAL_H

#include <stdint.h>

#include "bubo/grammar.h"

enum {
    GE_END = 0,       /* end of a rule */
    GE_ALT,           /* start of the next alternative */
    GE_RULE_REF,      /* value: rule id */
    GE_CHAR,          /* value: code point; starts a class or is one literal char */
    GE_CHAR_NOT,      /* value: code point; starts a negated class [^...] */
    GE_CHAR_RNG_UPPER,/* value: upper bound of the range whose lower bound precedes it */
    GE_CHAR_ALT,      /* value: one more code point (or range start) in the class */
    GE_CHAR_ANY,      /* '.': any code point */
};

typedef struct {
    uint32_t type;
    uint32_t value;
} gelem;

struct bubo_grammar {
    gelem *elems;          /* (n_elems) every rule, concatenated */
    uint32_t n_elems;
    uint32_t *rule_start;  /* (n_rules) position of each rule's first element */
    uint32_t n_rules;
    uint32_t root;
    /* For a position that starts a terminal (GE_CHAR, GE_CHAR_NOT, GE_CHAR_ANY), the position
     * after its class and which ASCII code points it accepts: the hot test of the mask walk. */
    uint32_t *term_next;   /* (n_elems) */
    uint64_t (*term_ascii)[2]; /* (n_elems) bit c of the 128: accepts code point c */
    /* The shortest completions (matcher.c, grammar_build_shortest): for every element position,
     * the fewest bytes that finish its alternative from there (GRAMMAR_NO_END: none); for every
     * rule, the fewest bytes of a sentence of it and the alternative that gives them. The chosen
     * alternatives never recurse (the tie is broken by derivation height), so following them
     * writes a finite text. */
    uint32_t *tail_min;    /* (n_elems) */
    uint32_t *rule_min;    /* (n_rules) */
    uint32_t *rule_alt;    /* (n_rules) position of the chosen alternative's first element */
};

#define GRAMMAR_NO_END UINT32_MAX

/* Fill tail_min, rule_min and rule_alt (called once the grammar is parsed). */
bubo_status grammar_build_shortest(bubo_grammar *g, bubo_err *err);

static inline int ge_is_end_of_alt(uint32_t type) { return type == GE_END || type == GE_ALT; }
static inline int ge_is_terminal(uint32_t type) {
    return type == GE_CHAR || type == GE_CHAR_NOT || type == GE_CHAR_ANY;
}

#endif
