/* Building a tokenizer from tokenizer.ggml.* metadata, with llama.cpp's defaults and fix-ups
 * (src/llama-vocab.cpp, llama_vocab::impl::load), and the getters. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/text_internal.h"

#define KEY_MODEL "tokenizer.ggml.model"
#define KEY_PRE "tokenizer.ggml.pre"
#define KEY_TOKENS "tokenizer.ggml.tokens"
#define KEY_SCORES "tokenizer.ggml.scores"
#define KEY_TOKEN_TYPE "tokenizer.ggml.token_type"
#define KEY_MERGES "tokenizer.ggml.merges"
#define KEY_ADD_BOS "tokenizer.ggml.add_bos_token"
#define KEY_ADD_EOS "tokenizer.ggml.add_eos_token"
#define KEY_ADD_PREFIX "tokenizer.ggml.add_space_prefix"
#define KEY_ADD_SEP "tokenizer.ggml.add_sep_token"
/* BertNormalizer's options and WordPiece's word limit: bubo's keys, absent in llama.cpp's files */
#define KEY_WPM_LOWERCASE "tokenizer.ggml.wordpiece.lowercase"
#define KEY_WPM_STRIP_ACCENTS "tokenizer.ggml.wordpiece.strip_accents"
#define KEY_WPM_CHINESE_CHARS "tokenizer.ggml.wordpiece.chinese_chars"
#define KEY_WPM_MAX_WORD_CHARS "tokenizer.ggml.wordpiece.max_input_chars_per_word"

/* tokenizer.ggml.token_type values (llama.cpp's llama_token_type) */
enum {
    TOKEN_TYPE_UNDEFINED = 0,
    TOKEN_TYPE_NORMAL = 1,
    TOKEN_TYPE_UNKNOWN = 2,
    TOKEN_TYPE_CONTROL = 3,
    TOKEN_TYPE_USER_DEFINED = 4,
    TOKEN_TYPE_UNUSED = 5,
    TOKEN_TYPE_BYTE = 6,
};

// ---------------------------------------------------------------------------------------------
// pre-tokenizer names -> regex family and flags (llama.cpp's table, for the families we run)

typedef struct {
    const char *name;
    bubo_pre_type pre;
    int clean_spaces; /* llama.cpp's default for BPE is 1; the names below set 0 where it does */
    int ignore_merges;
    int add_bos;
} pre_entry;

static const pre_entry pre_table[] = {
    {"default", BUBO_PRE_DEFAULT, 1, 0, 0},
    {"llama3", BUBO_PRE_LLAMA3, 1, 1, 1},
    {"llama-v3", BUBO_PRE_LLAMA3, 1, 1, 1},
    {"llama-bpe", BUBO_PRE_LLAMA3, 1, 1, 1},
    {"falcon3", BUBO_PRE_LLAMA3, 1, 1, 1},
    {"falcon-h1", BUBO_PRE_LLAMA3, 1, 1, 1},
    {"pixtral", BUBO_PRE_LLAMA3, 1, 1, 1},
    {"midm-2.0", BUBO_PRE_LLAMA3, 1, 1, 1},
    {"lfm2", BUBO_PRE_LLAMA3, 1, 1, 1},
    {"jina-v5-nano", BUBO_PRE_LLAMA3, 1, 1, 1},
    {"dbrx", BUBO_PRE_LLAMA3, 1, 0, 0},
    {"smaug-bpe", BUBO_PRE_LLAMA3, 1, 0, 0},
    {"deepseek-llm", BUBO_PRE_DEEPSEEK_LLM, 0, 0, 0},
    {"falcon", BUBO_PRE_FALCON, 1, 0, 0},
    {"mpt", BUBO_PRE_GPT2, 1, 0, 0},
    {"starcoder", BUBO_PRE_STARCODER, 1, 0, 0},
    {"gpt-2", BUBO_PRE_GPT2, 1, 0, 0},
    {"phi-2", BUBO_PRE_GPT2, 1, 0, 0},
    {"jina-es", BUBO_PRE_GPT2, 1, 0, 0},
    {"jina-de", BUBO_PRE_GPT2, 1, 0, 0},
    {"gigachat", BUBO_PRE_GPT2, 1, 0, 0},
    {"jina-v2-es", BUBO_PRE_GPT2, 1, 0, 0},
    {"jina-v2-de", BUBO_PRE_GPT2, 1, 0, 0},
    {"a.x-4.0", BUBO_PRE_GPT2, 1, 0, 0},
    {"mellum", BUBO_PRE_GPT2, 1, 0, 0},
    {"modern-bert", BUBO_PRE_GPT2, 1, 0, 0},
    {"exaone4", BUBO_PRE_GPT2, 1, 0, 0},
    {"olmo", BUBO_PRE_GPT2, 1, 0, 0},
    {"jais", BUBO_PRE_GPT2, 1, 0, 0},
    {"trillion", BUBO_PRE_GPT2, 0, 0, 0},
    {"granite-docling", BUBO_PRE_GPT2, 0, 0, 0},
    {"refact", BUBO_PRE_STARCODER, 1, 0, 0},
    {"command-r", BUBO_PRE_STARCODER, 0, 0, 0},
    {"smollm", BUBO_PRE_STARCODER, 0, 0, 0},
    {"codeshell", BUBO_PRE_STARCODER, 1, 0, 0},
    {"exaone", BUBO_PRE_STARCODER, 1, 0, 0},
    {"minerva-7b", BUBO_PRE_STARCODER, 1, 0, 0},
    {"mellum2", BUBO_PRE_STARCODER, 1, 0, 0},
    {"qwen2", BUBO_PRE_QWEN2, 0, 0, 0},
    {"deepseek-r1-qwen", BUBO_PRE_QWEN2, 0, 0, 0},
    {"kormo", BUBO_PRE_QWEN2, 0, 0, 0},
    {"f2llmv2", BUBO_PRE_QWEN2, 0, 0, 0},
    {"megrez", BUBO_PRE_QWEN2, 1, 0, 0},
    {"stablelm2", BUBO_PRE_QWEN2, 1, 0, 0},
    {"hunyuan", BUBO_PRE_QWEN2, 0, 0, 0},
    {"solar-open", BUBO_PRE_QWEN2, 0, 0, 0},
};

// ---------------------------------------------------------------------------------------------
// text-detected special tokens (llama.cpp: "auto-detect special tokens by text")

static const char *const eot_texts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>", "<EOT>",
    "_<EOT>", "[EOT]", "<\xef\xbd\x9c" "end\xe2\x96\x81" "of\xe2\x96\x81" "sentence\xef\xbd\x9c>", "<end_of_utterance>", NULL};
static const char *const eom_texts[] = {"<|eom_id|>", NULL};
static const char *const fim_pre_texts[] = {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>",
                                            "<\xef\xbd\x9c" "fim\xe2\x96\x81" "begin\xef\xbd\x9c>", "<PRE>",
                                            "\xe2\x96\x81<PRE>", "<|code_prefix|>", "<|prefix|>", NULL};
static const char *const fim_suf_texts[] = {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>",
                                            "<\xef\xbd\x9c" "fim\xe2\x96\x81" "hole\xef\xbd\x9c>", "<SUF>",
                                            "\xe2\x96\x81<SUF>", "<|code_suffix|>", "<|suffix|>", NULL};
static const char *const fim_mid_texts[] = {"<|fim_middle|>", "<fim-middle>", "<fim_middle>",
                                            "<\xef\xbd\x9c" "fim\xe2\x96\x81" "end\xef\xbd\x9c>", "<MID>",
                                            "\xe2\x96\x81<MID>", "<|code_middle|>", "<|middle|>", NULL};
static const char *const fim_pad_texts[] = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]", NULL};
static const char *const fim_rep_texts[] = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>", NULL};
static const char *const fim_sep_texts[] = {"<|file_sep|>", NULL};
static const char *const eog_texts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "<end_of_turn>",
    "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>",
    "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<\xef\xbd\x9c" "end\xe2\x96\x81" "of\xe2\x96\x81" "sentence\xef\xbd\x9c>", "[e~[", NULL};

// ---------------------------------------------------------------------------------------------
// loading

typedef struct {
    bubo_tokenizer *t;
    const bubo_gguf *g;
    bubo_err *err;
} loader;

static int32_t find_text(const bubo_tokenizer *t, const char *s) { return bubo_strmap_get(t, s, strlen(s)); }

static bubo_status array_of(loader *L, const char *key, bubo_gguf_type elem, const bubo_gguf_value **out, int required) {
    const bubo_gguf_value *v = bubo_gguf_get(L->g, key);
    *out = NULL;
    if (!v) {
        if (required) return bubo_set_err(L->err, BUBO_ERR_FORMAT, "%s: missing", key);
        return BUBO_OK;
    }
    if (v->type != BUBO_GGUF_ARRAY || v->v.arr.elem_type != elem) {
        return bubo_set_err(L->err, BUBO_ERR_FORMAT, "%s: expected an array of type %d", key, (int)elem);
    }
    *out = v;
    return BUBO_OK;
}

static uint64_t pow2_at_least(uint64_t n) {
    uint64_t c = 16;
    while (c < n) c <<= 1;
    return c;
}

static bubo_status build_token_map(loader *L) {
    bubo_tokenizer *t = L->t;
    bubo_strmap *m = &t->token_to_id;
    uint64_t cap = pow2_at_least(2ull * t->n_vocab + 1);
    m->slots = malloc(cap * sizeof *m->slots);
    if (!m->slots) return bubo_set_err(L->err, BUBO_ERR_NOMEM, "token map: out of memory");
    for (uint64_t i = 0; i < cap; i++) m->slots[i] = (bubo_strmap_slot){-1, 0};
    m->mask = cap - 1;
    for (uint32_t id = 0; id < t->n_vocab; id++) {
        const char *s = t->text + t->text_off[id];
        size_t n = t->text_len[id];
        uint64_t h = bubo_hash_bytes(s, n);
        for (uint64_t i = h & m->mask;; i = (i + 1) & m->mask) {
            int32_t other = m->slots[i].id;
            /* a repeated string maps to its last id, as llama.cpp's token_to_id[word] = i */
            if (other < 0 || (t->text_len[other] == n && memcmp(t->text + t->text_off[other], s, n) == 0)) {
                m->slots[i] = (bubo_strmap_slot){(int32_t)id, (uint32_t)(h >> 32)};
                break;
            }
        }
    }
    return BUBO_OK;
}

static bubo_status load_tokens(loader *L) {
    bubo_tokenizer *t = L->t;
    const bubo_gguf_value *tokens, *scores, *types;
    bubo_status st;
    if ((st = array_of(L, KEY_TOKENS, BUBO_GGUF_STRING, &tokens, 1))) return st;
    if (tokens->v.arr.n == 0 || tokens->v.arr.n > INT32_MAX) {
        return bubo_set_err(L->err, BUBO_ERR_FORMAT, "%s: %llu tokens", KEY_TOKENS, (unsigned long long)tokens->v.arr.n);
    }
    uint32_t n = (uint32_t)tokens->v.arr.n;
    t->n_vocab = n;

    const bubo_gguf_value *sv = bubo_gguf_get(L->g, KEY_SCORES);
    scores = NULL;
    if (sv) {
        if (sv->type != BUBO_GGUF_ARRAY || (sv->v.arr.elem_type != BUBO_GGUF_FLOAT32 && sv->v.arr.elem_type != BUBO_GGUF_INT32)) {
            return bubo_set_err(L->err, BUBO_ERR_FORMAT, "%s: expected an array of float32 or int32", KEY_SCORES);
        }
        if (sv->v.arr.n != n) {
            return bubo_set_err(L->err, BUBO_ERR_FORMAT, "%s: %llu scores for %u tokens", KEY_SCORES,
                                (unsigned long long)sv->v.arr.n, n);
        }
        scores = sv;
    }
    if ((st = array_of(L, KEY_TOKEN_TYPE, BUBO_GGUF_INT32, &types, 0))) return st;
    if (types && types->v.arr.n != n) {
        return bubo_set_err(L->err, BUBO_ERR_FORMAT, "%s: %llu token types for %u tokens", KEY_TOKEN_TYPE,
                            (unsigned long long)types->v.arr.n, n);
    }

    /* token strings, back to back; an empty one becomes "[EMPTY_<id>]" as in llama.cpp */
    uint64_t total = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t len = tokens->v.arr.items[i].v.str.len;
        total += len ? len : 32;
    }
    t->text = malloc(total + 1);
    t->text_off = malloc(n * sizeof *t->text_off);
    t->text_len = malloc(n * sizeof *t->text_len);
    t->scores = malloc(n * sizeof *t->scores);
    t->attr = malloc(n * sizeof *t->attr);
    t->eog = calloc(n, 1);
    if (!t->text || !t->text_off || !t->text_len || !t->scores || !t->attr || !t->eog) {
        return bubo_set_err(L->err, BUBO_ERR_NOMEM, "%s: out of memory for %u tokens", KEY_TOKENS, n);
    }
    uint64_t off = 0;
    for (uint32_t i = 0; i < n; i++) {
        bubo_gguf_str s = tokens->v.arr.items[i].v.str;
        if (s.len > UINT32_MAX / 2) return bubo_set_err(L->err, BUBO_ERR_FORMAT, "%s[%u]: too long", KEY_TOKENS, i);
        t->text_off[i] = off;
        if (s.len) {
            memcpy(t->text + off, s.data, s.len);
            t->text_len[i] = (uint32_t)s.len;
        } else {
            t->text_len[i] = (uint32_t)snprintf(t->text + off, 32, "[EMPTY_%u]", i);
        }
        off += t->text_len[i];

        t->scores[i] = scores ? (float)bubo_gguf_arr_f64(scores, i) : 0.0f;
        uint32_t attr = BUBO_TOKEN_ATTR_NORMAL;
        if (types) {
            switch (bubo_gguf_arr_i64(types, i)) {
            case TOKEN_TYPE_UNKNOWN: attr = BUBO_TOKEN_ATTR_UNKNOWN; break;
            case TOKEN_TYPE_UNUSED: attr = BUBO_TOKEN_ATTR_UNUSED; break;
            case TOKEN_TYPE_NORMAL: attr = BUBO_TOKEN_ATTR_NORMAL; break;
            case TOKEN_TYPE_CONTROL: attr = BUBO_TOKEN_ATTR_CONTROL; break;
            case TOKEN_TYPE_USER_DEFINED: attr = BUBO_TOKEN_ATTR_USER_DEFINED; break;
            case TOKEN_TYPE_BYTE: attr = BUBO_TOKEN_ATTR_BYTE; break;
            default: attr = BUBO_TOKEN_ATTR_UNDEFINED; break;
            }
        }
        t->attr[i] = attr;
    }
    return build_token_map(L);
}

static bubo_status load_merges(loader *L) {
    bubo_tokenizer *t = L->t;
    const bubo_gguf_value *merges;
    bubo_status st;
    if ((st = array_of(L, KEY_MERGES, BUBO_GGUF_STRING, &merges, 1))) return st;
    uint64_t n = merges->v.arr.n;
    if (n > INT32_MAX) return bubo_set_err(L->err, BUBO_ERR_FORMAT, "%s: %llu merges", KEY_MERGES, (unsigned long long)n);
    uint64_t cap = pow2_at_least(2 * n + 1);
    bubo_pairmap *m = &t->merges;
    m->keys = calloc(cap, sizeof *m->keys);
    m->rank = malloc(cap * sizeof *m->rank);
    m->result = malloc(cap * sizeof *m->result);
    if (!m->keys || !m->rank || !m->result) return bubo_set_err(L->err, BUBO_ERR_NOMEM, "%s: out of memory", KEY_MERGES);
    m->mask = cap - 1;

    char *buf = NULL;
    size_t buf_cap = 0;
    for (uint64_t i = 0; i < n; i++) {
        bubo_gguf_str s = merges->v.arr.items[i].v.str;
        /* "left right", split at the first space after the first byte (llama.cpp: find(' ', 1)) */
        const char *sp = s.len > 1 ? memchr(s.data + 1, ' ', s.len - 1) : NULL;
        int32_t left = -1, right = -1, result = -1;
        if (sp) {
            size_t nl = (size_t)(sp - s.data), nr = s.len - nl - 1;
            left = bubo_strmap_get(t, s.data, nl);
            right = bubo_strmap_get(t, sp + 1, nr);
            if (nl + nr > buf_cap) {
                buf_cap = 2 * (nl + nr);
                char *nb = realloc(buf, buf_cap);
                if (!nb) {
                    free(buf);
                    return bubo_set_err(L->err, BUBO_ERR_NOMEM, "%s: out of memory", KEY_MERGES);
                }
                buf = nb;
            }
            memcpy(buf, s.data, nl);
            memcpy(buf + nl, sp + 1, nr);
            result = bubo_strmap_get(t, buf, nl + nr);
        }
        if (left < 0 || right < 0) {
            free(buf);
            return bubo_set_err(L->err, BUBO_ERR_FORMAT, "%s[%llu]: '%.*s' does not name two tokens of the vocabulary",
                                KEY_MERGES, (unsigned long long)i, (int)(s.len > 64 ? 64 : s.len), s.data);
        }
        uint64_t key = (((uint64_t)(uint32_t)left << 32) | (uint32_t)right) + 1;
        uint64_t h = key * 0x9e3779b97f4a7c15ull;
        for (uint64_t j = (h ^ (h >> 29)) & m->mask;; j = (j + 1) & m->mask) {
            if (m->keys[j] == key) break; /* a repeated merge keeps its first rank (emplace) */
            if (m->keys[j] == 0) {
                m->keys[j] = key;
                m->rank[j] = (int32_t)i;
                m->result[j] = result;
                break;
            }
        }
    }
    free(buf);
    return BUBO_OK;
}

/* tokenizer.ggml.<role>_token_id: overrides the default when it names a token */
static void load_special_id(loader *L, const char *key, bubo_special role) {
    bubo_tokenizer *t = L->t;
    uint64_t id;
    bubo_token *slot = &t->special_ids[role];
    if (*slot >= 0 && (uint32_t)*slot >= t->n_vocab) *slot = BUBO_TOKEN_NULL; /* default out of range */
    if (bubo_gguf_get_u64(L->g, key, &id) && id < t->n_vocab) *slot = (bubo_token)id;
}

static void mark_control(bubo_tokenizer *t, int32_t id) { t->attr[id] |= BUBO_TOKEN_ATTR_CONTROL; }

/* the first text of the list that is a token (list order: llama.cpp walks a hash map, so where
 * a vocabulary has several candidates its pick is arbitrary; ours is the list's first) */
static int32_t detect(bubo_tokenizer *t, bubo_special role, const char *const *texts) {
    if (t->special_ids[role] != BUBO_TOKEN_NULL) return t->special_ids[role];
    for (const char *const *s = texts; *s; s++) {
        int32_t id = find_text(t, *s);
        if (id >= 0) {
            t->special_ids[role] = id;
            mark_control(t, id);
            return id;
        }
    }
    return BUBO_TOKEN_NULL;
}

static void fix_up_special(loader *L) {
    bubo_tokenizer *t = L->t;
    detect(t, BUBO_SPECIAL_EOT, eot_texts);
    detect(t, BUBO_SPECIAL_EOM, eom_texts);
    detect(t, BUBO_SPECIAL_FIM_PRE, fim_pre_texts);
    detect(t, BUBO_SPECIAL_FIM_SUF, fim_suf_texts);
    detect(t, BUBO_SPECIAL_FIM_MID, fim_mid_texts);
    detect(t, BUBO_SPECIAL_FIM_PAD, fim_pad_texts);
    detect(t, BUBO_SPECIAL_FIM_REP, fim_rep_texts);
    detect(t, BUBO_SPECIAL_FIM_SEP, fim_sep_texts);

    /* control tokens named "...unused..." are unused */
    for (uint32_t id = 0; id < t->n_vocab; id++) {
        if (!(t->attr[id] & BUBO_TOKEN_ATTR_CONTROL)) continue;
        const char *s = t->text + t->text_off[id];
        size_t n = t->text_len[id];
        for (size_t k = 0; k + 6 <= n; k++) {
            if (memcmp(s + k, "unused", 6) == 0) {
                t->attr[id] |= BUBO_TOKEN_ATTR_UNUSED;
                break;
            }
        }
    }

    /* end-of-generation set */
    const bubo_special eog_roles[] = {BUBO_SPECIAL_FIM_PAD, BUBO_SPECIAL_FIM_REP, BUBO_SPECIAL_FIM_SEP,
                                      BUBO_SPECIAL_EOS, BUBO_SPECIAL_EOT, BUBO_SPECIAL_EOM};
    for (size_t k = 0; k < sizeof eog_roles / sizeof eog_roles[0]; k++) {
        if (t->special_ids[eog_roles[k]] >= 0) t->eog[t->special_ids[eog_roles[k]]] = 1;
    }
    for (const char *const *s = eog_texts; *s; s++) {
        int32_t id = find_text(t, *s);
        if (id >= 0) {
            t->eog[id] = 1;
            mark_control(t, id);
        }
    }
    /* gpt-oss: these are always rendered */
    const char *const user_defined[] = {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"};
    for (size_t k = 0; k < 4; k++) {
        int32_t id = find_text(t, user_defined[k]);
        if (id >= 0) t->attr[id] = BUBO_TOKEN_ATTR_USER_DEFINED;
    }
    /* o200k_harmony / solar-open: "<|end|>" ends a message, not the generation */
    int32_t ret = find_text(t, "<|return|>"), call = find_text(t, "<|call|>"), calls = find_text(t, "<|calls|>");
    int32_t flush = find_text(t, "<|flush|>"), end = find_text(t, "<|end|>");
#define IS_EOG(id) ((id) >= 0 && t->eog[id])
    if (IS_EOG(end) && ((IS_EOG(ret) && (IS_EOG(call) || IS_EOG(calls))) || ((IS_EOG(call) || IS_EOG(calls)) && IS_EOG(flush)))) {
        t->eog[end] = 0;
        t->attr[end] = BUBO_TOKEN_ATTR_USER_DEFINED;
    }
    /* gemma4 / plamo: "</s>" is an ordinary token there */
    int32_t s_end = find_text(t, "</s>"), tool = find_text(t, "<|tool_response>"), plamo = find_text(t, "<|plamo:eos|>");
    if (IS_EOG(s_end) && (IS_EOG(tool) || IS_EOG(plamo))) {
        t->eog[s_end] = 0;
        t->attr[s_end] = BUBO_TOKEN_ATTR_NORMAL;
    }
#undef IS_EOG
}

// ---------------------------------------------------------------------------------------------
// special-token trie, in llama.cpp's search order: longest text first (ties: lower id first)

static int32_t trie_child(bubo_tokenizer *t, int32_t node, uint8_t b, int create) {
    int32_t *link = &t->trie[node].first_child;
    while (*link >= 0) {
        if (t->trie[*link].byte == b) return *link;
        link = &t->trie[*link].next_sibling;
    }
    if (!create) return -1;
    int32_t id = (int32_t)t->n_trie++;
    t->trie[id] = (bubo_trie_node){b, -1, -1, -1};
    *link = id; /* re-find the link: trie[] does not move (sized up front) */
    return id;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static bubo_status build_special(loader *L) {
    bubo_tokenizer *t = L->t;
    const uint32_t special = BUBO_TOKEN_ATTR_CONTROL | BUBO_TOKEN_ATTR_USER_DEFINED | BUBO_TOKEN_ATTR_UNKNOWN;
    size_t n_special = 0, n_bytes = 0;
    for (uint32_t id = 0; id < t->n_vocab; id++) {
        if (t->attr[id] & special) {
            n_special++;
            n_bytes += t->text_len[id];
        }
    }
    int32_t *order = t->special_order = malloc((n_special + 1) * sizeof *order);
    uint64_t *keys = malloc((n_special + 1) * sizeof *keys); /* (~length << 32 | id): sorts longest first */
    t->special_priority = malloc(t->n_vocab * sizeof *t->special_priority);
    t->trie = malloc((n_bytes + 1) * sizeof *t->trie);
    if (!order || !keys || !t->special_priority || !t->trie) {
        free(keys);
        return bubo_set_err(L->err, BUBO_ERR_NOMEM, "special tokens: out of memory");
    }
    size_t k = 0;
    for (uint32_t id = 0; id < t->n_vocab; id++) {
        t->special_priority[id] = UINT32_MAX;
        if (t->attr[id] & special) keys[k++] = ((uint64_t)(UINT32_MAX - t->text_len[id]) << 32) | id;
    }
    qsort(keys, n_special, sizeof *keys, cmp_u64);
    for (k = 0; k < n_special; k++) order[k] = (int32_t)(uint32_t)keys[k];
    free(keys);
    t->trie[0] = (bubo_trie_node){0, -1, -1, -1};
    t->n_trie = 1;
    memset(t->trie_first_byte, 0, sizeof t->trie_first_byte);
    for (k = 0; k < n_special; k++) {
        int32_t id = order[k];
        const uint8_t *s = (const uint8_t *)t->text + t->text_off[id];
        t->special_priority[id] = (uint32_t)k;
        int32_t node = 0;
        for (uint32_t j = 0; j < t->text_len[id]; j++) node = trie_child(t, node, s[j], 1);
        /* a repeated text: the one searched first wins, the later search finds nothing left */
        if (t->trie[node].token < 0) t->trie[node].token = id;
        t->trie_first_byte[s[0]] = 1;
    }
    return BUBO_OK;
}

// ---------------------------------------------------------------------------------------------
// pieces: what each token detokenizes to with special = 1 (llama.cpp's token_to_piece cache)

#define ESCAPED_SPACE "\xe2\x96\x81"

/* Appends to a piece being written; measures only when out is NULL. */
typedef struct {
    char *out;
    size_t n;
} piece_writer;

static void put(piece_writer *w, const void *s, size_t n) {
    if (w->out) memcpy(w->out + w->n, s, n);
    w->n += n;
}

static size_t make_piece(const bubo_tokenizer *t, uint32_t id, char *out) {
    const char *s = t->text + t->text_off[id];
    size_t n = t->text_len[id];
    uint32_t attr = t->attr[id];
    piece_writer w = {out, 0};
    if (attr & (BUBO_TOKEN_ATTR_UNKNOWN | BUBO_TOKEN_ATTR_CONTROL | BUBO_TOKEN_ATTR_USER_DEFINED)) {
        put(&w, s, n);
    } else if ((attr & BUBO_TOKEN_ATTR_NORMAL) && (t->model == BUBO_TOKENIZER_SPM || t->model == BUBO_TOKENIZER_WPM)) {
        /* U+2581 back to a space: SentencePiece's spaces, WordPiece's phantom space before a word */
        for (size_t i = 0; i < n;) {
            if (i + 3 <= n && memcmp(s + i, ESCAPED_SPACE, 3) == 0) {
                put(&w, " ", 1);
                i += 3;
            } else {
                put(&w, s + i++, 1);
            }
        }
    } else if (attr & BUBO_TOKEN_ATTR_NORMAL) {
        /* byte-level: each alphabet character back to its byte */
        for (size_t i = 0; i < n;) {
            uint32_t cp = bubo_utf8_decode_llama((const uint8_t *)s, n, &i);
            int b = bubo_cp_to_byte(cp);
            if (b >= 0) {
                char c = (char)b;
                put(&w, &c, 1);
            } else {
                /* what llama.cpp's llama_decode_text writes, the whole token text included */
                uint8_t u8[4];
                char hex[3];
                size_t m = bubo_utf8_encode(cp, u8);
                put(&w, "[UNK_BYTE_0x", 12);
                for (size_t j = 0; j < m; j++) {
                    snprintf(hex, sizeof hex, "%02x", u8[j]);
                    put(&w, hex, 2);
                }
                put(&w, s, n);
                put(&w, "]", 1);
            }
        }
    } else if (attr & BUBO_TOKEN_ATTR_BYTE) {
        /* "<0xXX>" */
        char hex[3] = {n > 3 ? s[3] : 0, n > 4 ? s[4] : 0, 0};
        char c = (char)strtol(hex, NULL, 16);
        put(&w, &c, 1);
    }
    /* unused, undefined: nothing, like control tokens without special */
    return w.n;
}

static bubo_status build_pieces(loader *L) {
    bubo_tokenizer *t = L->t;
    size_t total = 0;
    for (uint32_t id = 0; id < t->n_vocab; id++) total += make_piece(t, id, NULL);
    t->piece = malloc(total + 1);
    t->piece_off = malloc(t->n_vocab * sizeof *t->piece_off);
    t->piece_len = malloc(t->n_vocab * sizeof *t->piece_len);
    if (!t->piece || !t->piece_off || !t->piece_len) {
        return bubo_set_err(L->err, BUBO_ERR_NOMEM, "token pieces: out of memory");
    }
    size_t off = 0;
    for (uint32_t id = 0; id < t->n_vocab; id++) {
        size_t n = make_piece(t, id, t->piece + off);
        t->piece_off[id] = off;
        t->piece_len[id] = (uint32_t)n;
        if (n > t->max_piece_len) t->max_piece_len = n;
        off += n;
    }
    return BUBO_OK;
}

// ---------------------------------------------------------------------------------------------

static void build_byte_tables(bubo_tokenizer *t) {
    for (unsigned b = 0; b < 256; b++) {
        uint8_t u8[4];
        size_t m = bubo_utf8_encode(bubo_byte_to_cp((uint8_t)b), u8);
        t->byte_token[b] = bubo_strmap_get(t, (const char *)u8, m);
        t->byte_fallback[b][0] = t->byte_fallback[b][1] = -1;
        for (size_t j = 0; j < m; j++) t->byte_fallback[b][j] = bubo_strmap_get(t, (const char *)&u8[j], 1);

        /* SentencePiece: "<0xXX>", else the byte itself as a one-byte token */
        char hex[8];
        snprintf(hex, sizeof hex, "<0x%02X>", b);
        int32_t id = find_text(t, hex);
        if (id < 0) {
            char one = (char)b;
            id = bubo_strmap_get(t, &one, 1);
        }
        t->spm_byte_token[b] = id;
    }
}

static int contains_ci(const char *s, size_t n, const char *needle) {
    size_t m = strlen(needle);
    for (size_t i = 0; i + m <= n; i++) {
        size_t j = 0;
        while (j < m && tolower((unsigned char)s[i + j]) == needle[j]) j++;
        if (j == m) return 1;
    }
    return 0;
}

/* an optional bool: absent keeps *out; present with another type is a format error */
static bubo_status optional_bool(loader *L, const char *key, int *out) {
    if (!bubo_gguf_get(L->g, key)) return BUBO_OK;
    if (!bubo_gguf_get_bool(L->g, key, out)) return bubo_set_err(L->err, BUBO_ERR_FORMAT, "%s: expected a bool", key);
    return BUBO_OK;
}

/* WordPiece: the options default to BERT's uncased ones, as in files from llama.cpp's converter */
static bubo_status load_wordpiece(loader *L) {
    bubo_tokenizer *t = L->t;
    bubo_status st;
    t->wpm_lowercase = t->wpm_strip_accents = t->wpm_chinese_chars = 1;
    t->wpm_max_word_chars = 100;
    if ((st = optional_bool(L, KEY_WPM_LOWERCASE, &t->wpm_lowercase))) return st;
    if ((st = optional_bool(L, KEY_WPM_STRIP_ACCENTS, &t->wpm_strip_accents))) return st;
    if ((st = optional_bool(L, KEY_WPM_CHINESE_CHARS, &t->wpm_chinese_chars))) return st;
    if (bubo_gguf_get(L->g, KEY_WPM_MAX_WORD_CHARS)) {
        uint64_t n;
        if (!bubo_gguf_get_u64(L->g, KEY_WPM_MAX_WORD_CHARS, &n))
            return bubo_set_err(L->err, BUBO_ERR_FORMAT, "%s: expected an unsigned integer", KEY_WPM_MAX_WORD_CHARS);
        t->wpm_max_word_chars = n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
    }
    return BUBO_OK;
}

bubo_status bubo_tokenizer_from_gguf(const bubo_gguf *g, bubo_tokenizer **out, bubo_err *err) {
    *out = NULL;
    bubo_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return bubo_set_err(err, BUBO_ERR_NOMEM, "tokenizer: out of memory");
    loader L = {t, g, err};
    bubo_status st = BUBO_OK;

    bubo_gguf_str model;
    if (!bubo_gguf_get(g, KEY_MODEL)) {
        st = bubo_set_err(err, BUBO_ERR_FORMAT, "%s: missing", KEY_MODEL);
        goto fail;
    }
    if (!bubo_gguf_get_str(g, KEY_MODEL, &model)) {
        st = bubo_set_err(err, BUBO_ERR_FORMAT, "%s: expected a string", KEY_MODEL);
        goto fail;
    }
    for (int i = 0; i < BUBO_SPECIAL_COUNT; i++) t->special_ids[i] = BUBO_TOKEN_NULL;
    if (bubo_gguf_str_eq(model, "gpt2")) {
        t->model = BUBO_TOKENIZER_BPE;
        t->special_ids[BUBO_SPECIAL_BOS] = 11;
        t->special_ids[BUBO_SPECIAL_EOS] = 11;
        t->clean_spaces = 1;
    } else if (bubo_gguf_str_eq(model, "llama")) {
        t->model = BUBO_TOKENIZER_SPM;
        t->special_ids[BUBO_SPECIAL_BOS] = 1;
        t->special_ids[BUBO_SPECIAL_EOS] = 2;
        t->special_ids[BUBO_SPECIAL_UNK] = 0;
        t->add_space_prefix = 1;
        t->add_bos = 1;
    } else if (bubo_gguf_str_eq(model, "bert")) {
        t->model = BUBO_TOKENIZER_WPM;
        t->special_ids[BUBO_SPECIAL_BOS] = 101; /* [CLS] */
        t->special_ids[BUBO_SPECIAL_UNK] = 100;
        t->special_ids[BUBO_SPECIAL_SEP] = 102;
        t->special_ids[BUBO_SPECIAL_PAD] = 0;
        t->special_ids[BUBO_SPECIAL_MASK] = 103;
        t->add_bos = 1;
        t->add_sep = 1;
        t->clean_spaces = 1;
    } else {
        st = bubo_set_err(err, BUBO_ERR_UNSUPPORTED, "%s: '%.*s' is not supported (bubo runs gpt2, llama and bert)", KEY_MODEL,
                          (int)(model.len > 64 ? 64 : model.len), model.data);
        goto fail;
    }

    bubo_gguf_str pre;
    if (bubo_gguf_get_str(g, KEY_PRE, &pre)) {
        size_t n = pre.len < sizeof t->pre_name - 1 ? pre.len : sizeof t->pre_name - 1;
        memcpy(t->pre_name, pre.data, n);
        t->pre_name[n] = 0;
    }
    if (t->model == BUBO_TOKENIZER_BPE) {
        const pre_entry *e = NULL;
        for (size_t i = 0; i < sizeof pre_table / sizeof pre_table[0]; i++) {
            if (strcmp(pre_table[i].name, t->pre_name) == 0) e = &pre_table[i];
        }
        if (!t->pre_name[0]) {
            t->pre = BUBO_PRE_DEFAULT;
            snprintf(t->warning, sizeof t->warning, "%s is missing: using the default pre-tokenizer; generation quality may be degraded", KEY_PRE);
        } else if (!e) {
            t->pre = BUBO_PRE_GPT2;
            snprintf(t->warning, sizeof t->warning, "%s '%s' is not known: splitting words with gpt2's rule; tokens may differ from llama.cpp's", KEY_PRE, t->pre_name);
        } else {
            t->pre = e->pre;
            t->clean_spaces = e->clean_spaces;
            t->ignore_merges = e->ignore_merges;
            t->add_bos = e->add_bos;
        }
    }
    int flag;
    if (bubo_gguf_get_bool(g, KEY_ADD_PREFIX, &flag)) t->add_space_prefix = flag;

    if ((st = load_tokens(&L))) goto fail;
    if (t->model == BUBO_TOKENIZER_BPE && (st = load_merges(&L))) goto fail;
    if (t->model == BUBO_TOKENIZER_WPM && (st = load_wordpiece(&L))) goto fail;
    for (uint32_t id = 0; id < t->n_vocab; id++) {
        if (t->text_len[id] > t->max_token_len) t->max_token_len = t->text_len[id];
    }
    build_byte_tables(t);

    /* the newline token, as llama.cpp finds it (it falls back to the padding token's default,
     * which is none for these models) */
    int32_t linefeed;
    if (t->model == BUBO_TOKENIZER_SPM) {
        linefeed = t->spm_byte_token['\n'];
    } else if (t->model == BUBO_TOKENIZER_WPM) {
        linefeed = t->special_ids[BUBO_SPECIAL_PAD]; /* llama.cpp's choice; WordPiece has no newline */
    } else {
        bubo_token ids[4];
        bubo_tok_sink sink = {ids, 4, 0};
        if (!bubo_bpe_fragment(t, (const uint8_t *)"\n", 1, &sink)) {
            st = bubo_set_err(err, BUBO_ERR_NOMEM, "tokenizer: out of memory");
            goto fail;
        }
        linefeed = sink.n ? ids[0] : -1;
    }

    load_special_id(&L, "tokenizer.ggml.bos_token_id", BUBO_SPECIAL_BOS);
    load_special_id(&L, "tokenizer.ggml.eos_token_id", BUBO_SPECIAL_EOS);
    load_special_id(&L, "tokenizer.ggml.eot_token_id", BUBO_SPECIAL_EOT);
    load_special_id(&L, "tokenizer.ggml.eom_token_id", BUBO_SPECIAL_EOM);
    load_special_id(&L, "tokenizer.ggml.unknown_token_id", BUBO_SPECIAL_UNK);
    load_special_id(&L, "tokenizer.ggml.seperator_token_id", BUBO_SPECIAL_SEP); /* sic: GGUF's spelling */
    load_special_id(&L, "tokenizer.ggml.padding_token_id", BUBO_SPECIAL_PAD);
    load_special_id(&L, "tokenizer.ggml.mask_token_id", BUBO_SPECIAL_MASK);
    load_special_id(&L, "tokenizer.ggml.fim_pre_token_id", BUBO_SPECIAL_FIM_PRE);
    load_special_id(&L, "tokenizer.ggml.fim_suf_token_id", BUBO_SPECIAL_FIM_SUF);
    load_special_id(&L, "tokenizer.ggml.fim_mid_token_id", BUBO_SPECIAL_FIM_MID);
    load_special_id(&L, "tokenizer.ggml.fim_pad_token_id", BUBO_SPECIAL_FIM_PAD);
    load_special_id(&L, "tokenizer.ggml.fim_rep_token_id", BUBO_SPECIAL_FIM_REP);
    load_special_id(&L, "tokenizer.ggml.fim_sep_token_id", BUBO_SPECIAL_FIM_SEP);
    load_special_id(&L, "tokenizer.ggml.prefix_token_id", BUBO_SPECIAL_FIM_PRE); /* deprecated names */
    load_special_id(&L, "tokenizer.ggml.suffix_token_id", BUBO_SPECIAL_FIM_SUF);
    load_special_id(&L, "tokenizer.ggml.middle_token_id", BUBO_SPECIAL_FIM_MID);
    t->special_ids[BUBO_SPECIAL_LINEFEED] = linefeed;

    if (bubo_gguf_get_bool(g, KEY_ADD_BOS, &flag)) t->add_bos = flag;
    if (bubo_gguf_get_bool(g, KEY_ADD_EOS, &flag)) t->add_eos = flag;
    if (t->model == BUBO_TOKENIZER_WPM && bubo_gguf_get_bool(g, KEY_ADD_SEP, &flag)) t->add_sep = flag;
    /* WordPiece ends with [SEP] (add_sep), never with an EOS as well: gguf-py's SpecialVocab writes
     * add_eos_token = true (eos = [SEP]) for BERT, and llama.cpp's WPM tokenizer ignores it */
    if (t->model == BUBO_TOKENIZER_WPM) t->add_eos = 0;
    /* llama.cpp asserts on adding a BOS/EOS it does not have; we add nothing instead */
    if (t->special_ids[BUBO_SPECIAL_BOS] < 0) t->add_bos = 0;
    if (t->special_ids[BUBO_SPECIAL_EOS] < 0) t->add_eos = 0;
    if (t->special_ids[BUBO_SPECIAL_SEP] < 0) t->add_sep = 0;

    fix_up_special(&L);
    if ((st = build_special(&L))) goto fail;
    if ((st = build_pieces(&L))) goto fail;

    /* per-model attributes: Phi-3 strips the whitespace after its special tokens */
    bubo_gguf_str name;
    if (bubo_gguf_get_str(g, "general.name", &name) &&
        (contains_ci(name.data, name.len, "phi-3") || contains_ci(name.data, name.len, "phi3"))) {
        for (uint32_t id = 0; id < t->n_vocab; id++) {
            if (t->special_priority[id] != UINT32_MAX) t->attr[id] |= BUBO_TOKEN_ATTR_RSTRIP;
        }
        int32_t id = find_text(t, "</s>");
        if (id >= 0) t->attr[id] |= BUBO_TOKEN_ATTR_RSTRIP;
        const char *const keep[] = {"<unk>", "<s>", "<|endoftext|>"};
        for (int k = 0; k < 3; k++) {
            id = find_text(t, keep[k]);
            if (id >= 0) t->attr[id] &= ~(uint32_t)BUBO_TOKEN_ATTR_RSTRIP;
        }
    }

    *out = t;
    return BUBO_OK;
fail:
    bubo_tokenizer_free(t);
    return st;
}

void bubo_tokenizer_free(bubo_tokenizer *t) {
    if (!t) return;
    free(t->text);
    free(t->text_off);
    free(t->text_len);
    free(t->scores);
    free(t->attr);
    free(t->eog);
    free(t->piece);
    free(t->piece_off);
    free(t->piece_len);
    free(t->token_to_id.slots);
    free(t->merges.keys);
    free(t->merges.rank);
    free(t->merges.result);
    free(t->trie);
    free(t->special_order);
    free(t->special_priority);
    free(t);
}

// ---------------------------------------------------------------------------------------------
// getters

bubo_tokenizer_model bubo_tokenizer_model_type(const bubo_tokenizer *t) { return t->model; }
const char *bubo_tokenizer_model_name(const bubo_tokenizer *t) {
    switch (t->model) {
    case BUBO_TOKENIZER_BPE: return "gpt2";
    case BUBO_TOKENIZER_SPM: return "llama";
    case BUBO_TOKENIZER_WPM: return "bert";
    }
    return "";
}
const char *bubo_tokenizer_pre(const bubo_tokenizer *t) { return t->pre_name; }
const char *bubo_tokenizer_warning(const bubo_tokenizer *t) { return t->warning[0] ? t->warning : NULL; }
uint32_t bubo_tokenizer_n_vocab(const bubo_tokenizer *t) { return t->n_vocab; }
bubo_token bubo_tokenizer_special(const bubo_tokenizer *t, bubo_special role) {
    return (role >= 0 && role < BUBO_SPECIAL_COUNT) ? t->special_ids[role] : BUBO_TOKEN_NULL;
}
int bubo_tokenizer_add_bos(const bubo_tokenizer *t) { return t->add_bos; }
int bubo_tokenizer_add_eos(const bubo_tokenizer *t) { return t->add_eos; }
int bubo_tokenizer_add_sep(const bubo_tokenizer *t) { return t->add_sep; }
int bubo_tokenizer_add_space_prefix(const bubo_tokenizer *t) { return t->add_space_prefix; }

static int in_vocab(const bubo_tokenizer *t, bubo_token id) { return id >= 0 && (uint32_t)id < t->n_vocab; }

uint32_t bubo_tokenizer_attr(const bubo_tokenizer *t, bubo_token id) { return in_vocab(t, id) ? t->attr[id] : 0; }
int bubo_tokenizer_is_eog(const bubo_tokenizer *t, bubo_token id) { return in_vocab(t, id) && t->eog[id]; }
const char *bubo_tokenizer_text(const bubo_tokenizer *t, bubo_token id, size_t *len) {
    if (!in_vocab(t, id)) return NULL;
    *len = t->text_len[id];
    return t->text + t->text_off[id];
}
float bubo_tokenizer_score(const bubo_tokenizer *t, bubo_token id) { return in_vocab(t, id) ? t->scores[id] : 0.0f; }
