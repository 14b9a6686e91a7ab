# Mirrors csrc/include/bubo/grammar.h
from libc.stdint cimport int32_t, uint8_t, uint32_t, uint64_t
from libcpp cimport bool as cbool

from common cimport bubo_status, bubo_err

cdef extern from "bubo/grammar.h" nogil:
    enum:
        BUBO_GRAMMAR_MAX_REPEAT
        BUBO_GRAMMAR_MAX_NESTING
        BUBO_GRAMMAR_MAX_STACKS
        BUBO_GRAMMAR_MAX_DEPTH

    ctypedef struct bubo_grammar:
        pass
    ctypedef struct bubo_grammar_vocab:
        pass
    ctypedef struct bubo_grammar_matcher:
        pass

    bubo_status bubo_grammar_parse(const char *text, size_t len, const char *root, bubo_grammar **out,
                                   bubo_err *err)
    void bubo_grammar_free(bubo_grammar *g)
    uint32_t bubo_grammar_n_rules(const bubo_grammar *g)

    bubo_status bubo_grammar_vocab_create(const char *pieces, const uint64_t *offsets, uint32_t n_vocab,
                                          bubo_grammar_vocab **out, bubo_err *err)
    void bubo_grammar_vocab_free(bubo_grammar_vocab *v)
    uint32_t bubo_grammar_vocab_n(const bubo_grammar_vocab *v)
    uint32_t bubo_grammar_vocab_n_nodes(const bubo_grammar_vocab *v)

    bubo_status bubo_grammar_matcher_create(const bubo_grammar *g, const bubo_grammar_vocab *vocab,
                                            bubo_grammar_matcher **out, bubo_err *err)
    bubo_status bubo_grammar_matcher_clone(const bubo_grammar_matcher *m, bubo_grammar_matcher **out,
                                           bubo_err *err)
    void bubo_grammar_matcher_free(bubo_grammar_matcher *m)
    bubo_status bubo_grammar_matcher_accept_bytes(bubo_grammar_matcher *m, const uint8_t *bytes, size_t n,
                                                  cbool *accepted, bubo_err *err)
    bubo_status bubo_grammar_matcher_accept_token(bubo_grammar_matcher *m, int32_t token, cbool *accepted,
                                                  bubo_err *err)
    bubo_status bubo_grammar_matcher_mask(bubo_grammar_matcher *m, uint8_t *mask, bubo_err *err)
    cbool bubo_grammar_matcher_accepting(const bubo_grammar_matcher *m)
    size_t bubo_grammar_matcher_n_stacks(const bubo_grammar_matcher *m)
    size_t bubo_grammar_matcher_shortest_len(const bubo_grammar_matcher *m)
    bubo_status bubo_grammar_matcher_shortest(const bubo_grammar_matcher *m, uint8_t *out, size_t cap, size_t *n,
                                              bubo_err *err)
