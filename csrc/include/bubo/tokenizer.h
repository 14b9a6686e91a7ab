/* Tokenizers, as llama.cpp runs them: byte-level BPE (tokenizer.ggml.model = "gpt2") with the
 * pre-tokenizer named by tokenizer.ggml.pre, and SentencePiece (tokenizer.ggml.model = "llama");
 * and WordPiece ("bert") as Hugging Face's BERT tokenizer runs it (normaliser options from
 * tokenizer.ggml.wordpiece.*, BERT's uncased defaults when absent).
 *
 * A bubo_tokenizer is built from an open GGUF file and copies everything it needs, so the file
 * may be closed afterwards. It is immutable once built: tokenize, detokenize and the getters may
 * run on one tokenizer from several threads at once (each call keeps its scratch to itself).
 * A bubo_detokenizer (streaming) belongs to one thread at a time and must not outlive its
 * tokenizer. */
#ifndef BUBO_TOKENIZER_H
#define BUBO_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "bubo/common.h"
#include "bubo/gguf.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef int32_t bubo_token;
#define BUBO_TOKEN_NULL (-1)

typedef enum {
    BUBO_TOKENIZER_BPE = 1, /* "gpt2": byte-level BPE with merges */
    BUBO_TOKENIZER_SPM = 2, /* "llama": SentencePiece scores, byte fallback */
    BUBO_TOKENIZER_WPM = 3, /* "bert": WordPiece, longest match first, BERT's normaliser */
} bubo_tokenizer_model;

/* Token attributes: the same bits as llama.cpp's llama_token_attr, derived from
 * tokenizer.ggml.token_type and the same text-based fix-ups llama.cpp applies. */
enum {
    BUBO_TOKEN_ATTR_UNDEFINED = 0,
    BUBO_TOKEN_ATTR_UNKNOWN = 1 << 0,
    BUBO_TOKEN_ATTR_UNUSED = 1 << 1,
    BUBO_TOKEN_ATTR_NORMAL = 1 << 2,
    BUBO_TOKEN_ATTR_CONTROL = 1 << 3,
    BUBO_TOKEN_ATTR_USER_DEFINED = 1 << 4,
    BUBO_TOKEN_ATTR_BYTE = 1 << 5,
    BUBO_TOKEN_ATTR_NORMALIZED = 1 << 6,
    BUBO_TOKEN_ATTR_LSTRIP = 1 << 7,
    BUBO_TOKEN_ATTR_RSTRIP = 1 << 8,
    BUBO_TOKEN_ATTR_SINGLE_WORD = 1 << 9,
};

/* Special token roles; an absent one is BUBO_TOKEN_NULL. */
typedef enum {
    BUBO_SPECIAL_BOS = 0,
    BUBO_SPECIAL_EOS,
    BUBO_SPECIAL_EOT,
    BUBO_SPECIAL_EOM,
    BUBO_SPECIAL_UNK,
    BUBO_SPECIAL_SEP,
    BUBO_SPECIAL_PAD,
    BUBO_SPECIAL_MASK,
    BUBO_SPECIAL_FIM_PRE,
    BUBO_SPECIAL_FIM_SUF,
    BUBO_SPECIAL_FIM_MID,
    BUBO_SPECIAL_FIM_PAD,
    BUBO_SPECIAL_FIM_REP,
    BUBO_SPECIAL_FIM_SEP,
    BUBO_SPECIAL_LINEFEED,
    BUBO_SPECIAL_COUNT
} bubo_special;

typedef struct bubo_tokenizer bubo_tokenizer;

/* Build from tokenizer.ggml.* metadata. Missing tokens array, scores/token types shorter than
 * the vocabulary, merges naming tokens not in the vocabulary, a bad value type ->
 * BUBO_ERR_FORMAT; an unknown tokenizer.ggml.model -> BUBO_ERR_UNSUPPORTED. Each message names
 * the key. An unknown tokenizer.ggml.pre is not an error: the gpt2 rule is used and
 * bubo_tokenizer_warning says so. */
bubo_status bubo_tokenizer_from_gguf(const bubo_gguf *g, bubo_tokenizer **out, bubo_err *err);
void bubo_tokenizer_free(bubo_tokenizer *t);

bubo_tokenizer_model bubo_tokenizer_model_type(const bubo_tokenizer *t);
const char *bubo_tokenizer_model_name(const bubo_tokenizer *t); /* "gpt2", "llama" or "bert" */
const char *bubo_tokenizer_pre(const bubo_tokenizer *t);        /* tokenizer.ggml.pre, "" if absent */
const char *bubo_tokenizer_warning(const bubo_tokenizer *t);    /* NULL, or why results may differ */
uint32_t bubo_tokenizer_n_vocab(const bubo_tokenizer *t);
bubo_token bubo_tokenizer_special(const bubo_tokenizer *t, bubo_special role);
int bubo_tokenizer_add_bos(const bubo_tokenizer *t);
int bubo_tokenizer_add_eos(const bubo_tokenizer *t);
int bubo_tokenizer_add_sep(const bubo_tokenizer *t); /* WordPiece: SEP ends the text ([CLS] text [SEP]) */
int bubo_tokenizer_add_space_prefix(const bubo_tokenizer *t);
/* 0 (UNDEFINED) for an id outside the vocabulary. */
uint32_t bubo_tokenizer_attr(const bubo_tokenizer *t, bubo_token id);
/* 1 if generating this token ends generation (EOS, EOT, EOM and llama.cpp's text-detected set). */
int bubo_tokenizer_is_eog(const bubo_tokenizer *t, bubo_token id);
/* The vocabulary string of a token (not NUL-terminated); NULL for an id outside the vocabulary. */
const char *bubo_tokenizer_text(const bubo_tokenizer *t, bubo_token id, size_t *len);
float bubo_tokenizer_score(const bubo_tokenizer *t, bubo_token id);

/* tokenize flags */
#define BUBO_TOKENIZE_ADD_SPECIAL 1u   /* BOS/EOS (WordPiece: CLS/SEP) as the model's metadata asks */
#define BUBO_TOKENIZE_PARSE_SPECIAL 2u /* the text of control tokens becomes those tokens */

/* Tokenize len bytes of text (UTF-8; invalid bytes are handled as llama.cpp does). On BUBO_OK,
 * *n_tokens is the number of tokens the text gives and the first min(*n_tokens, cap) of them
 * are in out: when *n_tokens > cap, call again with a buffer that large. */
bubo_status bubo_tokenize(const bubo_tokenizer *t, const char *text, size_t len, unsigned flags,
                          bubo_token *out, size_t cap, size_t *n_tokens, bubo_err *err);

/* bubo_tokenize, where the n_spans byte ranges [spans[2i], spans[2i+1]) (sorted, not overlapping,
 * within len) are plain text even with BUBO_TOKENIZE_PARSE_SPECIAL: a control or unknown token
 * never matches inside them, and no special token crosses one of their ends. The text around and
 * between them is split into fragments exactly as bubo_tokenize splits it (a chat prompt whose
 * message contents hold control-token text: the template's markup stays control tokens, the
 * contents' text stays text). */
bubo_status bubo_tokenize_spans(const bubo_tokenizer *t, const char *text, size_t len, unsigned flags,
                                const size_t *spans, size_t n_spans, bubo_token *out, size_t cap,
                                size_t *n_tokens, bubo_err *err);

/* The bytes a token stands for (not NUL-terminated, possibly a fragment of a UTF-8 character);
 * with special == 0 control and unknown tokens give "". NULL for an id outside the vocabulary.
 * The pointer stays valid while the tokenizer lives. */
const char *bubo_token_piece(const bubo_tokenizer *t, bubo_token id, int special, size_t *len);

/* detokenize flags */
#define BUBO_DETOK_REMOVE_SPECIAL 1u /* drop a leading BOS / trailing EOS the model adds itself */
#define BUBO_DETOK_RENDER_SPECIAL 2u /* write the text of control and unknown tokens */
#define BUBO_DETOK_CONTINUATION 4u   /* streaming only: the ids continue a sequence, so the first
                                        piece keeps its leading space (SentencePiece) */

/* The text of a whole sequence, as llama_detokenize gives it: SentencePiece drops the space it
 * prefixed to the first piece, and BPE models whose tokenizer cleans up spaces (" ," -> ",")
 * get that clean-up. Raw bytes: a sequence may end inside a UTF-8 character. On BUBO_OK,
 * *n_bytes is the length and the first min(*n_bytes, cap) bytes are in out. An id outside the
 * vocabulary -> BUBO_ERR_INVALID. */
bubo_status bubo_detokenize(const bubo_tokenizer *t, const bubo_token *ids, size_t n,
                            unsigned flags, char *out, size_t cap, size_t *n_bytes, bubo_err *err);

/* Streaming detokenizer: fed one token at a time, it gives back only whole UTF-8 characters;
 * the bytes of a character split across tokens are held back until it completes. Invalid
 * sequences come out as U+FFFD (one per maximal invalid subpart, as Python's "replace"), so
 * the output is always valid UTF-8. It does no space clean-up (as llama-server's streamed
 * text): for models without clean-up, the concatenated output equals bubo_detokenize's. */
typedef struct bubo_detokenizer bubo_detokenizer;

/* flags: BUBO_DETOK_RENDER_SPECIAL, BUBO_DETOK_CONTINUATION */
bubo_status bubo_detokenizer_create(const bubo_tokenizer *t, unsigned flags, bubo_detokenizer **out,
                                    bubo_err *err);
void bubo_detokenizer_free(bubo_detokenizer *d);
/* The text completed by this token; valid until the next call on d. */
bubo_status bubo_detokenizer_feed(bubo_detokenizer *d, bubo_token id, const char **text, size_t *len,
                                  bubo_err *err);
/* End of stream: a held-back incomplete character comes out as U+FFFD; d starts over. */
void bubo_detokenizer_flush(bubo_detokenizer *d, const char **text, size_t *len);

#ifdef __cplusplus
}
#endif
#endif
