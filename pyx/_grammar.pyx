# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""GBNF grammars (llama.cpp's syntax) with token-level masks: Grammar, Vocab (the token byte
trie, one per tokenizer), Matcher (one generation's state)."""

from libc.stdint cimport int32_t, uint8_t, uint32_t, uint64_t
from libc.stdlib cimport malloc, free

import numpy as np

from common cimport *
from grammar cimport *

include "status.pxi"

MAX_REPEAT = BUBO_GRAMMAR_MAX_REPEAT
MAX_NESTING = BUBO_GRAMMAR_MAX_NESTING
MAX_STACKS = BUBO_GRAMMAR_MAX_STACKS
MAX_DEPTH = BUBO_GRAMMAR_MAX_DEPTH


cdef class Grammar:
    """Grammar(text, root="root"): a parsed GBNF grammar. A syntax error raises ValueError whose
    message names line and column."""
    cdef bubo_grammar *g
    cdef readonly str root
    cdef readonly str text  # the GBNF source (a grammar is wrapped by rewriting it: bubo.chat.thinking)

    def __cinit__(self, text, str root="root"):
        cdef bytes data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        cdef bytes root_b = root.encode("utf-8")
        cdef bubo_err err
        cdef const char *p = data
        cdef size_t n = len(data)
        cdef const char *r = root_b
        cdef int st
        with nogil:
            st = bubo_grammar_parse(p, n, r, &self.g, &err)
        check_status(st, &err, None)
        self.root = root
        self.text = data.decode("utf-8", "replace")

    def __dealloc__(self):
        bubo_grammar_free(self.g)

    @property
    def n_rules(self):
        """Rules after groups and repetitions became rules of their own."""
        return bubo_grammar_n_rules(self.g)


cdef class Vocab:
    """Vocab(pieces): the byte trie of a vocabulary, pieces[i] the bytes of token i. Tokens with
    no bytes (give control tokens b"") are never allowed by a mask."""
    cdef bubo_grammar_vocab *v

    def __cinit__(self, pieces):
        cdef Py_ssize_t n = len(pieces)
        if not 0 < n <= 0x7fffffff:
            raise ValueError(f"a vocabulary has 1..2147483647 tokens, got {n}")
        blob = b"".join(pieces)
        offsets = np.zeros(n + 1, dtype=np.uint64)
        np.cumsum(np.fromiter((len(p) for p in pieces), dtype=np.uint64, count=n), out=offsets[1:])
        cdef const uint64_t[::1] off = offsets
        cdef const char *b = blob
        cdef bubo_err err
        check_status(bubo_grammar_vocab_create(b, &off[0], <uint32_t>n, &self.v, &err), &err, None)

    def __dealloc__(self):
        bubo_grammar_vocab_free(self.v)

    @staticmethod
    def from_tokenizer(tokenizer):
        """The vocabulary of a bubo.Tokenizer: each token's text without special rendering, so
        control and unused tokens have no bytes and no grammar ever allows them."""
        return Vocab([tokenizer.token_to_piece(i, False) for i in range(tokenizer.n_vocab)])

    def __len__(self):
        return bubo_grammar_vocab_n(self.v)

    @property
    def n_nodes(self):
        """Nodes of the byte trie."""
        return bubo_grammar_vocab_n_nodes(self.v)


cdef class Matcher:
    """Matcher(grammar, vocab=None): the state of one text matched against grammar, at its
    start. vocab is needed for accept_token() and mask()."""
    cdef bubo_grammar_matcher *m
    cdef readonly Grammar grammar
    cdef readonly Vocab vocab

    def __cinit__(self, Grammar grammar not None, Vocab vocab=None, *, _clone_of=None):
        cdef bubo_err err
        cdef Matcher src
        self.grammar = grammar
        self.vocab = vocab
        if _clone_of is not None:
            src = <Matcher?>_clone_of
            check_status(bubo_grammar_matcher_clone(src.m, &self.m, &err), &err, None)
        else:
            check_status(bubo_grammar_matcher_create(grammar.g, vocab.v if vocab is not None else NULL,
                                                     &self.m, &err), &err, None)

    def __dealloc__(self):
        bubo_grammar_matcher_free(self.m)

    def clone(self):
        """An independent copy of this state."""
        return Matcher(self.grammar, self.vocab, _clone_of=self)

    def accept_bytes(self, data):
        """Consume data (bytes; may end inside a UTF-8 character). True if it keeps the text
        valid; False leaves the state unchanged."""
        cdef const uint8_t[::1] view = memoryview(data).cast("B") if len(data) else None
        cdef const uint8_t *p = &view[0] if view is not None else NULL
        cdef size_t n = len(data)
        cdef bint ok
        cdef cbool accepted = False
        cdef bubo_err err
        cdef int st
        with nogil:
            st = bubo_grammar_matcher_accept_bytes(self.m, p, n, &accepted, &err)
        check_status(st, &err, None)
        return bool(accepted)

    def accept_token(self, int32_t token):
        """Consume token's bytes. False (state unchanged) if the grammar does not allow it; a
        control token (no bytes) is never allowed."""
        cdef cbool accepted = False
        cdef bubo_err err
        cdef int st
        with nogil:
            st = bubo_grammar_matcher_accept_token(self.m, token, &accepted, &err)
        check_status(st, &err, None)
        return bool(accepted)

    def mask(self, out=None):
        """uint8 array over the vocabulary: 1 where the token's bytes can all be consumed now.
        End-of-generation tokens are the caller's: allow them iff .accepting. out: an array to
        fill (uint8, len(vocab)) instead of a new one."""
        if self.vocab is None:
            raise ValueError("Matcher has no vocab: mask() needs one")
        n = len(self.vocab)
        if out is None:
            out = np.empty(n, dtype=np.uint8)
        cdef uint8_t[::1] mv = out
        if mv.shape[0] != n:
            raise ValueError(f"out has {mv.shape[0]} entries, the vocabulary {n}")
        cdef bubo_err err
        cdef int st
        with nogil:
            st = bubo_grammar_matcher_mask(self.m, &mv[0], &err)
        check_status(st, &err, None)
        return out

    @property
    def accepting(self):
        """The text so far is a complete sentence of the grammar."""
        return bool(bubo_grammar_matcher_accepting(self.m))

    def shortest(self):
        """The bytes of one shortest text that finishes the text so far as a sentence of the
        grammar (b"" when it is one already), or None when nothing can finish it."""
        cdef size_t n = bubo_grammar_matcher_shortest_len(self.m)
        if n == <size_t>-1:
            return None
        cdef bytearray buf = bytearray(n + 1)
        cdef uint8_t *p = buf
        cdef size_t got = 0
        cdef bubo_err err
        check_status(bubo_grammar_matcher_shortest(self.m, p, n + 1, &got, &err), &err, None)
        return bytes(buf[:got])

    @property
    def shortest_len(self):
        """len(shortest()) without writing it; None when nothing can finish the text."""
        cdef size_t n = bubo_grammar_matcher_shortest_len(self.m)
        return None if n == <size_t>-1 else n

    @property
    def n_stacks(self):
        """Alive parse stacks (diagnostics)."""
        return bubo_grammar_matcher_n_stacks(self.m)
