# Mirrors csrc/include/bubo/tokenizer.h
from libc.stdint cimport int32_t, uint32_t

from common cimport bubo_status, bubo_err
from gguf cimport bubo_gguf

cdef extern from "bubo/tokenizer.h" nogil:
    ctypedef int32_t bubo_token
    enum:
        BUBO_TOKEN_NULL

    ctypedef enum bubo_tokenizer_model:
        BUBO_TOKENIZER_BPE
        BUBO_TOKENIZER_SPM
        BUBO_TOKENIZER_WPM

    enum:
        BUBO_TOKEN_ATTR_UNDEFINED
        BUBO_TOKEN_ATTR_UNKNOWN
        BUBO_TOKEN_ATTR_UNUSED
        BUBO_TOKEN_ATTR_NORMAL
        BUBO_TOKEN_ATTR_CONTROL
        BUBO_TOKEN_ATTR_USER_DEFINED
        BUBO_TOKEN_ATTR_BYTE
        BUBO_TOKEN_ATTR_NORMALIZED
        BUBO_TOKEN_ATTR_LSTRIP
        BUBO_TOKEN_ATTR_RSTRIP
        BUBO_TOKEN_ATTR_SINGLE_WORD

    ctypedef enum bubo_special:
        BUBO_SPECIAL_BOS
        BUBO_SPECIAL_EOS
        BUBO_SPECIAL_EOT
        BUBO_SPECIAL_EOM
        BUBO_SPECIAL_UNK
        BUBO_SPECIAL_SEP
        BUBO_SPECIAL_PAD
        BUBO_SPECIAL_MASK
        BUBO_SPECIAL_FIM_PRE
        BUBO_SPECIAL_FIM_SUF
        BUBO_SPECIAL_FIM_MID
        BUBO_SPECIAL_FIM_PAD
        BUBO_SPECIAL_FIM_REP
        BUBO_SPECIAL_FIM_SEP
        BUBO_SPECIAL_LINEFEED
        BUBO_SPECIAL_COUNT

    ctypedef struct bubo_tokenizer:
        pass

    bubo_status bubo_tokenizer_from_gguf(const bubo_gguf *g, bubo_tokenizer **out, bubo_err *err)
    void bubo_tokenizer_free(bubo_tokenizer *t)

    bubo_tokenizer_model bubo_tokenizer_model_type(const bubo_tokenizer *t)
    const char *bubo_tokenizer_model_name(const bubo_tokenizer *t)
    const char *bubo_tokenizer_pre(const bubo_tokenizer *t)
    const char *bubo_tokenizer_warning(const bubo_tokenizer *t)
    uint32_t bubo_tokenizer_n_vocab(const bubo_tokenizer *t)
    bubo_token bubo_tokenizer_special(const bubo_tokenizer *t, bubo_special role)
    int bubo_tokenizer_add_bos(const bubo_tokenizer *t)
    int bubo_tokenizer_add_eos(const bubo_tokenizer *t)
    int bubo_tokenizer_add_sep(const bubo_tokenizer *t)
    int bubo_tokenizer_add_space_prefix(const bubo_tokenizer *t)
    uint32_t bubo_tokenizer_attr(const bubo_tokenizer *t, bubo_token id)
    int bubo_tokenizer_is_eog(const bubo_tokenizer *t, bubo_token id)
    const char *bubo_tokenizer_text(const bubo_tokenizer *t, bubo_token id, size_t *len)
    float bubo_tokenizer_score(const bubo_tokenizer *t, bubo_token id)

    enum:
        BUBO_TOKENIZE_ADD_SPECIAL
        BUBO_TOKENIZE_PARSE_SPECIAL
    bubo_status bubo_tokenize(const bubo_tokenizer *t, const char *text, size_t len, unsigned flags,
                              bubo_token *out, size_t cap, size_t *n_tokens, bubo_err *err)
    bubo_status bubo_tokenize_spans(const bubo_tokenizer *t, const char *text, size_t len, unsigned flags,
                                    const size_t *spans, size_t n_spans, bubo_token *out, size_t cap,
                                    size_t *n_tokens, bubo_err *err)

    const char *bubo_token_piece(const bubo_tokenizer *t, bubo_token id, int special, size_t *len)

    enum:
        BUBO_DETOK_REMOVE_SPECIAL
        BUBO_DETOK_RENDER_SPECIAL
        BUBO_DETOK_CONTINUATION
    bubo_status bubo_detokenize(const bubo_tokenizer *t, const bubo_token *ids, size_t n, unsigned flags,
                                char *out, size_t cap, size_t *n_bytes, bubo_err *err)

    ctypedef struct bubo_detokenizer:
        pass
    bubo_status bubo_detokenizer_create(const bubo_tokenizer *t, unsigned flags, bubo_detokenizer **out,
                                        bubo_err *err)
    void bubo_detokenizer_free(bubo_detokenizer *d)
    bubo_status bubo_detokenizer_feed(bubo_detokenizer *d, bubo_token id, const char **text, size_t *len,
                                      bubo_err *err)
    void bubo_detokenizer_flush(bubo_detokenizer *d, const char **text, size_t *len)
