# cython: language_level=3
"""The native tokenizers (byte-level BPE, SentencePiece) as llama.cpp runs them, and WordPiece as
Hugging Face's BERT tokenizer runs it."""

import os
import warnings

from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_SIMPLE
from cpython.bytes cimport PyBytes_FromStringAndSize
from libc.stdint cimport int32_t, uint32_t, uint64_t
from libc.stdlib cimport malloc, free

from common cimport *
from gguf cimport *
from tokenizer cimport *

include "status.pxi"

TOKEN_ATTR_UNDEFINED = BUBO_TOKEN_ATTR_UNDEFINED
TOKEN_ATTR_UNKNOWN = BUBO_TOKEN_ATTR_UNKNOWN
TOKEN_ATTR_UNUSED = BUBO_TOKEN_ATTR_UNUSED
TOKEN_ATTR_NORMAL = BUBO_TOKEN_ATTR_NORMAL
TOKEN_ATTR_CONTROL = BUBO_TOKEN_ATTR_CONTROL
TOKEN_ATTR_USER_DEFINED = BUBO_TOKEN_ATTR_USER_DEFINED
TOKEN_ATTR_BYTE = BUBO_TOKEN_ATTR_BYTE
TOKEN_ATTR_NORMALIZED = BUBO_TOKEN_ATTR_NORMALIZED
TOKEN_ATTR_LSTRIP = BUBO_TOKEN_ATTR_LSTRIP
TOKEN_ATTR_RSTRIP = BUBO_TOKEN_ATTR_RSTRIP
TOKEN_ATTR_SINGLE_WORD = BUBO_TOKEN_ATTR_SINGLE_WORD

cdef dict _SPECIAL_ROLES = {
    "bos": BUBO_SPECIAL_BOS, "eos": BUBO_SPECIAL_EOS, "eot": BUBO_SPECIAL_EOT, "eom": BUBO_SPECIAL_EOM,
    "unk": BUBO_SPECIAL_UNK, "sep": BUBO_SPECIAL_SEP, "pad": BUBO_SPECIAL_PAD, "mask": BUBO_SPECIAL_MASK,
    "fim_pre": BUBO_SPECIAL_FIM_PRE, "fim_suf": BUBO_SPECIAL_FIM_SUF, "fim_mid": BUBO_SPECIAL_FIM_MID,
    "fim_pad": BUBO_SPECIAL_FIM_PAD, "fim_rep": BUBO_SPECIAL_FIM_REP, "fim_sep": BUBO_SPECIAL_FIM_SEP,
    "linefeed": BUBO_SPECIAL_LINEFEED,
}


cdef object _role_id(const bubo_tokenizer *t, bubo_special role):
    cdef bubo_token id = bubo_tokenizer_special(t, role)
    return None if id == BUBO_TOKEN_NULL else id


cdef list _ids_list(const bubo_token *ids, size_t n):
    """The ids as a list, made a slice at a time with the GIL let go between slices: a 16 MB text
    has millions of tokens, and one loop making them all would hold every other thread (the
    server's event loop) for some 80 ms."""
    cdef list out = []
    cdef size_t start = 0, stop, i
    while start < n:
        stop = min(start + 65536, n)
        out.extend([ids[i] for i in range(start, stop)])
        start = stop
        if start < n:
            with nogil:
                pass
    return out


cdef class Tokenizer:
    """The tokenizer of a GGUF model file.

    Tokenizer(path) reads tokenizer.ggml.* from the file and closes it; Tokenizer.from_bytes(data)
    reads a GGUF image in memory. Bad or missing metadata raises GGUFError (UnsupportedError for
    a tokenizer model other than "gpt2", "llama" and "bert") naming the file and the key. An unknown
    tokenizer.ggml.pre is not an error: a warning says which rule is used instead."""
    cdef bubo_tokenizer *t
    cdef object _name

    def __init__(self, path):
        if self.t != NULL:
            raise RuntimeError("Tokenizer is already initialized")
        path = os.fspath(path)
        cdef bytes bpath = os.fsencode(path)
        self._name = os.fsdecode(path)
        if b"\0" in bpath:
            raise GGUFError(f"{self._name!r}: path contains a NUL byte")
        cdef const char *cpath = bpath
        cdef bubo_gguf *g = NULL
        cdef bubo_err err
        cdef bubo_status st
        with nogil:
            st = bubo_gguf_open(cpath, &g, &err)
        check_status(st, &err, self._name)
        self._build(g)

    @staticmethod
    def from_bytes(data, name="<bytes>"):
        """Build from a GGUF image held in a bytes-like object (not kept once built)."""
        cdef Tokenizer self = Tokenizer.__new__(Tokenizer)
        self._name = name
        cdef Py_buffer buf
        cdef bubo_gguf *g = NULL
        cdef bubo_err err
        cdef bubo_status st
        PyObject_GetBuffer(data, &buf, PyBUF_SIMPLE)
        try:
            with nogil:
                st = bubo_gguf_open_buffer(buf.buf, <uint64_t>buf.len, &g, &err)
            check_status(st, &err, self._name)
            self._build(g)
        finally:
            PyBuffer_Release(&buf)
        return self

    cdef _build(self, bubo_gguf *g):
        cdef bubo_err err
        cdef bubo_status st
        with nogil:
            st = bubo_tokenizer_from_gguf(g, &self.t, &err)
            bubo_gguf_close(g)
        check_status(st, &err, self._name)
        cdef const char *warning = bubo_tokenizer_warning(self.t)
        if warning != NULL:
            # Cython frames are not on Python's stack: level 1 is the caller's line
            warnings.warn(f"{self._name}: {warning.decode('utf-8', 'replace')}", RuntimeWarning, stacklevel=1)

    def __dealloc__(self):
        if self.t != NULL:
            bubo_tokenizer_free(self.t)
            self.t = NULL

    cdef const bubo_tokenizer *_t(self) except NULL:
        if self.t == NULL:
            raise ValueError("Tokenizer is not initialized")
        return self.t

    # ---- tokenize / detokenize ------------------------------------------------------------

    def encode(self, text, bint add_special=True, bint parse_special=False, text_spans=None):
        """Token ids of text (str, or bytes taken as UTF-8). add_special: BOS/EOS as the model's
        metadata asks (WordPiece: [CLS] and [SEP]); parse_special: the text of control tokens
        ("<|im_start|>", "[MASK]") becomes those tokens instead of plain text, except inside
        text_spans: (start, end) ranges of text (characters of a str, bytes of bytes), sorted and
        not overlapping, that stay plain text (a chat prompt: what came from the messages)."""
        cdef const bubo_tokenizer *t = self._t()
        cdef bytes data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        cdef const char *s = data
        cdef size_t n = len(data)
        cdef size_t n_spans = 0, i
        cdef size_t *spans = NULL
        cdef list bounds
        if text_spans:
            bounds = _byte_spans(text, text_spans)
            n_spans = len(bounds) // 2
            spans = <size_t *>malloc(len(bounds) * sizeof(size_t))
            if spans == NULL:
                raise MemoryError()
            for i in range(len(bounds)):
                spans[i] = bounds[i]
        cdef unsigned flags = (BUBO_TOKENIZE_ADD_SPECIAL if add_special else 0) | \
                              (BUBO_TOKENIZE_PARSE_SPECIAL if parse_special else 0)
        # a token covers at least one byte of text, but for BOS/EOS and the rare token per
        # invalid byte: guess, then ask again with the exact count
        cdef size_t cap = n + 8, n_tokens = 0
        cdef bubo_token *out = NULL
        cdef bubo_err err
        cdef bubo_status st
        try:
            while True:
                free(out)
                out = <bubo_token *>malloc(cap * sizeof(bubo_token))
                if out == NULL:
                    raise MemoryError()
                with nogil:
                    st = bubo_tokenize_spans(t, s, n, flags, spans, n_spans, out, cap, &n_tokens, &err)
                check_status(st, &err, None)
                if n_tokens <= cap:
                    return _ids_list(out, n_tokens)
                cap = n_tokens
        finally:
            free(out)
            free(spans)

    def decode(self, ids, bint skip_special=False):
        """The text of a sequence, as llama.cpp detokenizes it. skip_special: drop the BOS/EOS the
        model adds and leave out control tokens; otherwise their text is written. Bytes that do
        not form UTF-8 (a sequence cut inside a character) become U+FFFD."""
        cdef const bubo_tokenizer *t = self._t()
        cdef list seq = list(ids)
        cdef size_t n = len(seq), i
        cdef bubo_token *buf = <bubo_token *>malloc((n + 1) * sizeof(bubo_token))
        if buf == NULL:
            raise MemoryError()
        cdef unsigned flags = (BUBO_DETOK_REMOVE_SPECIAL if skip_special else BUBO_DETOK_RENDER_SPECIAL)
        cdef size_t cap = 8 * n + 64, n_bytes = 0
        cdef char *out = NULL
        cdef bubo_err err
        cdef bubo_status st
        try:
            for i in range(n):
                buf[i] = _as_token(seq[i])
            while True:
                free(out)
                out = <char *>malloc(cap)
                if out == NULL:
                    raise MemoryError()
                with nogil:
                    st = bubo_detokenize(t, buf, n, flags, out, cap, &n_bytes, &err)
                check_status(st, &err, None)
                if n_bytes <= cap:
                    return out[:n_bytes].decode("utf-8", "replace")
                cap = n_bytes
        finally:
            free(buf)
            free(out)

    def token_to_piece(self, id, bint special=True):
        """The bytes token id stands for (possibly part of a UTF-8 character). special=False gives
        b"" for control and unknown tokens."""
        cdef size_t n = 0
        cdef const char *p = bubo_token_piece(self._t(), _as_token(id), special, &n)
        if p == NULL:
            raise ValueError(f"token {id} is not in the vocabulary ({self.n_vocab} tokens)")
        return PyBytes_FromStringAndSize(p, n)

    def detokenizer(self, bint skip_special=False, bint continuation=False):
        """A streaming Detokenizer over this tokenizer (see Detokenizer)."""
        return Detokenizer(self, skip_special, continuation)

    # ---- vocabulary -----------------------------------------------------------------------

    def token_text(self, id):
        """The vocabulary string of token id, as stored (U+2581 for spaces in SentencePiece,
        the byte-level alphabet in BPE)."""
        cdef size_t n = 0
        cdef const char *p = bubo_tokenizer_text(self._t(), _as_token(id), &n)
        if p == NULL:
            raise ValueError(f"token {id} is not in the vocabulary ({self.n_vocab} tokens)")
        return PyBytes_FromStringAndSize(p, n)

    def token_score(self, id):
        self._check_id(id)
        return bubo_tokenizer_score(self.t, _as_token(id))

    def token_attr(self, id):
        """TOKEN_ATTR_* bits of token id (llama.cpp's llama_token_attr)."""
        self._check_id(id)
        return bubo_tokenizer_attr(self.t, _as_token(id))

    def is_special(self, id):
        """True for control, user-defined and unknown tokens: those matched as whole tokens in
        text (user-defined always, the others with parse_special)."""
        return (self.token_attr(id) & (BUBO_TOKEN_ATTR_CONTROL | BUBO_TOKEN_ATTR_USER_DEFINED |
                                       BUBO_TOKEN_ATTR_UNKNOWN)) != 0

    def is_control(self, id):
        return (self.token_attr(id) & BUBO_TOKEN_ATTR_CONTROL) != 0

    def is_eog(self, id):
        """True if generating this token ends generation (EOS, EOT, ...)."""
        self._check_id(id)
        return bubo_tokenizer_is_eog(self.t, _as_token(id)) != 0

    cdef _check_id(self, id):
        cdef bubo_token tid = _as_token(id)
        if tid < 0 or <uint32_t>tid >= bubo_tokenizer_n_vocab(self._t()):
            raise ValueError(f"token {id} is not in the vocabulary ({self.n_vocab} tokens)")

    def special_id(self, str role):
        """The id of a special role ("bos", "eos", "eot", "eom", "unk", "sep", "pad", "mask",
        "fim_pre", "fim_suf", "fim_mid", "fim_pad", "fim_rep", "fim_sep", "linefeed"), or None."""
        if role not in _SPECIAL_ROLES:
            raise ValueError(f"unknown special role {role!r}; one of {', '.join(_SPECIAL_ROLES)}")
        return _role_id(self._t(), _SPECIAL_ROLES[role])

    @property
    def n_vocab(self):
        return bubo_tokenizer_n_vocab(self._t())

    @property
    def model(self):
        """tokenizer.ggml.model: "gpt2" (byte-level BPE), "llama" (SentencePiece) or "bert"
        (WordPiece)."""
        return bubo_tokenizer_model_name(self._t()).decode()

    @property
    def pre(self):
        """tokenizer.ggml.pre as written in the file ("" if absent)."""
        return bubo_tokenizer_pre(self._t()).decode("utf-8", "replace")

    @property
    def warning(self):
        """Why tokens may differ from llama.cpp's (an unknown pre-tokenizer), or None."""
        cdef const char *w = bubo_tokenizer_warning(self._t())
        return None if w == NULL else w.decode("utf-8", "replace")

    @property
    def bos_id(self):
        return _role_id(self._t(), BUBO_SPECIAL_BOS)

    @property
    def eos_id(self):
        return _role_id(self._t(), BUBO_SPECIAL_EOS)

    @property
    def eot_id(self):
        return _role_id(self._t(), BUBO_SPECIAL_EOT)

    @property
    def pad_id(self):
        return _role_id(self._t(), BUBO_SPECIAL_PAD)

    @property
    def unk_id(self):
        return _role_id(self._t(), BUBO_SPECIAL_UNK)

    @property
    def add_bos(self):
        return bubo_tokenizer_add_bos(self._t()) != 0

    @property
    def add_eos(self):
        return bubo_tokenizer_add_eos(self._t()) != 0

    @property
    def add_sep(self):
        """WordPiece: add_special ends the text with the separator ([SEP])."""
        return bubo_tokenizer_add_sep(self._t()) != 0

    @property
    def add_space_prefix(self):
        return bubo_tokenizer_add_space_prefix(self._t()) != 0

    def __repr__(self):
        if self.t == NULL:
            return "<Tokenizer (uninitialized)>"
        return f"<Tokenizer {self.model}/{self.pre or '-'} n_vocab={self.n_vocab} from {self._name}>"


cdef bubo_token _as_token(object id) except? -2:
    if not isinstance(id, int):
        id = int(id)  # numpy integers
    if id < -2**31 or id >= 2**31:
        raise ValueError(f"token {id} is not in the vocabulary")
    return <bubo_token>id


cdef class Detokenizer:
    """Streaming detokenizer: feed(id) returns the text completed by that token, holding back the
    bytes of a character split across tokens until it is whole; flush() ends the stream (a
    character that never completed comes out as U+FFFD) and starts a new one.

    skip_special leaves out control tokens' text. continuation: the ids continue a sequence
    (generated tokens after a prompt), so a SentencePiece model's first piece keeps its
    leading space; without it, the output concatenates to Tokenizer.decode(ids)."""
    cdef bubo_detokenizer *d
    cdef Tokenizer tokenizer  # keeps the C tokenizer alive while d points at it

    def __init__(self, Tokenizer tokenizer not None, bint skip_special=False, bint continuation=False):
        cdef unsigned flags = (0 if skip_special else BUBO_DETOK_RENDER_SPECIAL) | \
                              (BUBO_DETOK_CONTINUATION if continuation else 0)
        cdef bubo_err err
        if self.d != NULL:
            raise RuntimeError("Detokenizer is already initialized")
        check_status(bubo_detokenizer_create(tokenizer._t(), flags, &self.d, &err), &err, None)
        self.tokenizer = tokenizer

    def __dealloc__(self):
        if self.d != NULL:
            bubo_detokenizer_free(self.d)
            self.d = NULL

    cdef bubo_detokenizer *_d(self) except NULL:
        if self.d == NULL:
            raise ValueError("Detokenizer is not initialized")
        return self.d

    def feed(self, id):
        cdef const char *text = NULL
        cdef size_t n = 0
        cdef bubo_err err
        check_status(bubo_detokenizer_feed(self._d(), _as_token(id), &text, &n, &err), &err, None)
        return text[:n].decode("utf-8")

    def flush(self):
        cdef const char *text = NULL
        cdef size_t n = 0
        bubo_detokenizer_flush(self._d(), &text, &n)
        return text[:n].decode("utf-8")


def _byte_spans(text, spans):
    """[start0, end0, start1, ...] in bytes of UTF-8 for (start, end) ranges of text: characters of
    a str (counted piece by piece between the bounds, in one pass), bytes of bytes."""
    cdef list flat = []
    cdef Py_ssize_t prev = -1
    for a, b in spans:
        if not (0 <= a <= b <= len(text)) or a < prev:
            raise ValueError(f"text_spans must be sorted (start, end) ranges within the text, not overlapping; got {(a, b)!r}")
        flat.append(a)
        flat.append(b)
        prev = b
    if not isinstance(text, str):
        return flat
    cdef list out = []
    cdef Py_ssize_t at = 0, nbytes = 0
    for c in flat:
        nbytes += len(text[at:c].encode("utf-8"))
        at = c
        out.append(nbytes)
    return out
