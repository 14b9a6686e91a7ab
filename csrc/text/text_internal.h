/* Internals shared by the tokenizer sources: code point classes, UTF-8 as llama.cpp reads it,
 * the hash maps, and the tokenizer object itself. Not installed; not part of the C API. */
#ifndef BUBO_TEXT_INTERNAL_H
#define BUBO_TEXT_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "bubo/tokenizer.h"
#include "text/unicode_tables.h"

// ---------------------------------------------------------------------------------------------
// Code point classes (generated table; the bit values are fixed by csrc/text/gen_unicode.py)

#define BUBO_UC_NUMBER 0x01u     /* \p{N} */
#define BUBO_UC_LETTER 0x02u     /* \p{L} */
#define BUBO_UC_SEPARATOR 0x04u  /* \p{Z} */
#define BUBO_UC_MARK 0x08u       /* \p{M} */
#define BUBO_UC_PUNCT 0x10u      /* \p{P} */
#define BUBO_UC_SYMBOL 0x20u     /* \p{S} */
#define BUBO_UC_CONTROL 0x40u    /* \p{C} */
#define BUBO_UC_WHITESPACE 0x80u /* \s: the White_Space property */

#define BUBO_MAX_CODEPOINT 0x110000u

static inline uint8_t bubo_uc_flags(uint32_t cp) {
    if (cp >= BUBO_MAX_CODEPOINT) return 0;
    return bubo_uc_stage2[((uint32_t)bubo_uc_stage1[cp >> BUBO_UC_BLOCK_SHIFT] << BUBO_UC_BLOCK_SHIFT) |
                          (cp & ((1u << BUBO_UC_BLOCK_SHIFT) - 1))];
}

// ---------------------------------------------------------------------------------------------
// UTF-8

#define BUBO_REPLACEMENT_CHAR 0xFFFDu

/* Length of the UTF-8 sequence a byte starts, from its high nibble only (no validation), as
 * llama.cpp splits SentencePiece input: continuation bytes count as 1. */
static inline size_t bubo_utf8_len(uint8_t lead) {
    static const uint8_t lookup[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return lookup[lead >> 4];
}

/* Decode one code point at s[*i] the way llama.cpp does (lead byte and continuation bytes are
 * checked, overlong forms are accepted); an invalid sequence gives U+FFFD and consumes 1 byte. */
uint32_t bubo_utf8_decode_llama(const uint8_t *s, size_t n, size_t *i);
/* Encode cp (<= 0x10FFFF) into out[0..3]; returns the length. */
size_t bubo_utf8_encode(uint32_t cp, uint8_t *out);
/* Length of the longest prefix of s[0..n) made of whole, valid UTF-8 sequences and maximal
 * invalid subparts, stopping before a trailing sequence that is valid so far but incomplete. */
size_t bubo_utf8_complete_prefix(const uint8_t *s, size_t n);
/* Append s[0..n) to out with every maximal invalid subpart replaced by U+FFFD; out must have
 * room for 3 * n bytes. Returns the bytes written. */
size_t bubo_utf8_sanitize(const uint8_t *s, size_t n, uint8_t *out);

/* GPT-2's byte-level alphabet: each byte value is shown as one printable code point. */
uint32_t bubo_byte_to_cp(uint8_t b);
/* Inverse of bubo_byte_to_cp; -1 for a code point that no byte maps to. */
int bubo_cp_to_byte(uint32_t cp);

// ---------------------------------------------------------------------------------------------
// Growable arrays for per-call scratch (never shared between calls)

typedef struct {
    uint32_t *v;
    size_t n, cap;
} bubo_u32vec;

int bubo_u32vec_reserve(bubo_u32vec *a, size_t cap); /* 0 on allocation failure */
static inline int bubo_u32vec_push(bubo_u32vec *a, uint32_t x) {
    if (a->n == a->cap && !bubo_u32vec_reserve(a, a->cap ? 2 * a->cap : 64)) return 0;
    a->v[a->n++] = x;
    return 1;
}
void bubo_u32vec_free(bubo_u32vec *a);

// ---------------------------------------------------------------------------------------------
// Hash maps (open addressing, linear probing, power-of-two capacity, built once at load)

uint64_t bubo_hash_bytes(const void *p, size_t n);

/* byte string -> token id; the strings live in the tokenizer's text arena. A slot keeps 32
 * more bits of the hash, so a probe that misses rarely touches the strings. */
typedef struct {
    int32_t id;   /* -1: empty */
    uint32_t tag; /* hash >> 32 */
} bubo_strmap_slot;

typedef struct {
    bubo_strmap_slot *slots;
    uint64_t mask;
} bubo_strmap;

/* (left id, right id) -> BPE merge rank and the id of the merged token (-1 if not in vocab) */
typedef struct {
    uint64_t *keys; /* (left << 32 | right) + 1; 0 = empty */
    int32_t *rank;
    int32_t *result;
    uint64_t mask;
} bubo_pairmap;

// ---------------------------------------------------------------------------------------------
// Pre-tokenizers: llama.cpp's regex lists, one hand-written splitter per regex

typedef enum {
    BUBO_PRE_DEFAULT = 0,  /* llama.cpp's fallback list when tokenizer.ggml.pre is absent or "default" */
    BUBO_PRE_GPT2,         /* gpt-2, phi-2, mpt, olmo, ... */
    BUBO_PRE_LLAMA3,       /* llama3, llama-bpe, dbrx, smaug-bpe, ... */
    BUBO_PRE_QWEN2,        /* qwen2, stablelm2, megrez, ... */
    BUBO_PRE_STARCODER,    /* starcoder, smollm, refact, command-r, ... */
    BUBO_PRE_FALCON,       /* falcon */
    BUBO_PRE_DEEPSEEK_LLM, /* deepseek-llm */
} bubo_pre_type;

/* Code points of one text fragment, with their class flags */
typedef struct {
    const uint32_t *cps;
    const uint8_t *flags;
    size_t n;
} bubo_cpview;

/* Split v into words; appends their lengths in code points (summing to v->n) to words, using
 * tmp as scratch. 0 on allocation failure. */
int bubo_pretokenize(bubo_pre_type pre, const bubo_cpview *v, bubo_u32vec *words, bubo_u32vec *tmp);

// ---------------------------------------------------------------------------------------------
// The tokenizer

/* A node of the byte trie of special token texts (control, user-defined, unknown). */
typedef struct {
    uint8_t byte;
    int32_t first_child; /* -1: none */
    int32_t next_sibling;
    int32_t token; /* token ending here, or -1 */
} bubo_trie_node;

struct bubo_tokenizer {
    bubo_tokenizer_model model;
    bubo_pre_type pre;
    char pre_name[64];
    char warning[256]; /* "" when none */

    uint32_t n_vocab;
    char *text;         /* all token strings, back to back */
    uint64_t *text_off; /* (n_vocab) */
    uint32_t *text_len; /* (n_vocab) */
    float *scores;      /* (n_vocab) */
    uint32_t *attr;     /* (n_vocab) BUBO_TOKEN_ATTR_* */
    uint8_t *eog;       /* (n_vocab) 1 if it ends generation */

    /* what each token detokenizes to, with special = 1 (llama.cpp's piece cache) */
    char *piece;
    uint64_t *piece_off; /* (n_vocab) */
    uint32_t *piece_len; /* (n_vocab) */
    size_t max_piece_len;

    bubo_strmap token_to_id;
    bubo_pairmap merges;

    /* byte-level BPE: the token of byte b's alphabet character, and when there is none, the
     * tokens llama.cpp falls back to (the single bytes of that character's UTF-8) */
    int32_t byte_token[256];
    int32_t byte_fallback[256][2];
    /* SentencePiece: the token for a byte that is not in the vocabulary as text */
    int32_t spm_byte_token[256];

    /* special tokens, searched longest first: special_order[k] is the k-th searched,
     * special_priority[id] its rank k (UINT32_MAX for ordinary tokens) */
    bubo_trie_node *trie;
    size_t n_trie;
    uint8_t trie_first_byte[256]; /* 1 if some special text starts with this byte */
    int32_t *special_order;       /* (n_special) */
    uint32_t *special_priority;   /* (n_vocab) */

    bubo_token special_ids[BUBO_SPECIAL_COUNT];
    int add_bos, add_eos, add_space_prefix;
    int ignore_merges; /* a word that is a token as a whole skips the merges (llama3) */
    int clean_spaces;  /* detokenize removes " ," " ." ... as llama.cpp's clean-up */
    int add_sep;       /* WordPiece: add_special ends the text with SEP */

    /* WordPiece: BertNormalizer's options (tokenizer.ggml.wordpiece.*) and the word limit */
    int wpm_lowercase, wpm_strip_accents, wpm_chinese_chars;
    uint32_t wpm_max_word_chars; /* a longer word (in code points) is one unknown token */
    uint32_t max_token_len;      /* bytes of the longest token text */
};

/* tokenize helpers */
typedef struct {
    bubo_token *out;
    size_t cap;
    size_t n;
} bubo_tok_sink;

static inline void bubo_sink_push(bubo_tok_sink *s, bubo_token id) {
    if (s->n < s->cap) s->out[s->n] = id;
    s->n++;
}

int32_t bubo_strmap_get(const bubo_tokenizer *t, const char *s, size_t n);

/* Byte-level BPE / SentencePiece / WordPiece over one raw-text fragment (SentencePiece:
 * prefix_space puts a space before it). 0 on allocation failure. */
int bubo_bpe_fragment(const bubo_tokenizer *t, const uint8_t *text, size_t len, bubo_tok_sink *sink);
int bubo_spm_fragment(const bubo_tokenizer *t, const uint8_t *text, size_t len, int prefix_space,
                      bubo_tok_sink *sink);
int bubo_wpm_fragment(const bubo_tokenizer *t, const uint8_t *text, size_t len, bubo_tok_sink *sink);

// ---------------------------------------------------------------------------------------------
// WordPiece code point classes (generated table; the values are fixed by gen_wordpiece.py)

#define BUBO_WPM_OTHER 0
#define BUBO_WPM_DROP 1    /* clean_text removes it: controls, format, private use, U+0000, U+FFFD */
#define BUBO_WPM_SPACE 2   /* White_Space: clean_text makes it a space, the pre-tokenizer splits */
#define BUBO_WPM_PUNCT 3   /* BERT's punctuation: a word of its own */
#define BUBO_WPM_MARK 4    /* Mn: strip_accents drops it */
#define BUBO_WPM_CHINESE 5 /* a CJK ideograph: spaced apart */

#endif
