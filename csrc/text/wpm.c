/* WordPiece (tokenizer.ggml.model = "bert") over one raw-text fragment, as Hugging Face's BERT
 * tokenizer runs it (tokenizers: BertNormalizer, BertPreTokenizer, WordPiece):
 *
 *   1. normalise, code point by code point: clean_text drops controls, format characters,
 *      U+0000 and U+FFFD and makes white space a space; handle_chinese_chars puts spaces around
 *      CJK ideographs; strip_accents takes the canonical decomposition and drops the Mn marks;
 *      lowercase is full Unicode lowercasing (U+0130 gives two code points);
 *   2. split into words at white space, each punctuation character a word of its own;
 *   3. per word: one unknown token if it has more than max_input_chars_per_word code points,
 *      else the longest vocabulary piece from the start, then the longest from where it ended,
 *      and so on; one unknown token for the whole word if some position has no piece.
 *
 * The vocabulary is in llama.cpp's "phantom space" form: a word-initial piece `the` is stored
 * as "\u2581the", a continuation `##ing` as "ing". So the first lookup of a word is U+2581 and
 * the text, the later ones the text alone.
 *
 * Where llama.cpp's llm_tokenizer_wpm differs from HF, this follows HF: llama.cpp has no word
 * length limit, always lowercases (one code point each) whatever the model's options, and
 * decomposes with its own NFD table but keeps combining marks that are in the input as such.
 * The Unicode data is gen_wordpiece.py's (see there for the code points that HF's older tables
 * treat otherwise). */
#include <stdlib.h>
#include <string.h>

#include "text/text_internal.h"
#include "text/wordpiece_tables.h"

#define PHANTOM_SPACE "\xe2\x96\x81" /* U+2581 */

#define HANGUL_FIRST 0xAC00u
#define HANGUL_LAST 0xD7A3u

static uint32_t wpm_class(uint32_t cp) {
    if (cp < 128) return bubo_wpm_ascii_class[cp];
    /* the last run starting at or before cp (run 0 starts at 0) */
    size_t lo = 0, hi = BUBO_WPM_N_CLASS_RUNS;
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if ((bubo_wpm_class_runs[mid] >> 8) <= cp) lo = mid;
        else hi = mid;
    }
    return bubo_wpm_class_runs[lo] & 0xFFu;
}

/* index of cp in the sorted keys[0..n), or -1 */
static long map_find(const uint32_t *keys, size_t n, uint32_t cp) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (keys[mid] < cp) lo = mid + 1;
        else hi = mid;
    }
    return lo < n && keys[lo] == cp ? (long)lo : -1;
}

// ---------------------------------------------------------------------------------------------
// 1. BertNormalizer

static int push_lower(const bubo_tokenizer *t, bubo_u32vec *out, uint32_t cp) {
    if (!t->wpm_lowercase) return bubo_u32vec_push(out, cp);
    if (cp < 128) return bubo_u32vec_push(out, cp >= 'A' && cp <= 'Z' ? cp + 32 : cp);
    long k = map_find(bubo_wpm_lower_keys, BUBO_WPM_N_LOWER, cp);
    if (k < 0) return bubo_u32vec_push(out, cp);
    const uint32_t v = bubo_wpm_lower_vals[k];
    for (uint32_t j = 0; j < (v & 7u); j++) {
        if (!bubo_u32vec_push(out, bubo_wpm_lower_pool[(v >> 3) + j])) return 0;
    }
    return 1;
}

/* strip_accents then lowercase, as HF applies them one after the other to the whole text */
static int push_normalized(const bubo_tokenizer *t, bubo_u32vec *out, uint32_t cp, uint32_t cls) {
    if (t->wpm_strip_accents && cp >= 128) {
        if (cls == BUBO_WPM_MARK) return 1;
        if (cp >= HANGUL_FIRST && cp <= HANGUL_LAST) { /* Unicode 3.12: leading, vowel, trailing jamo */
            const uint32_t s = cp - HANGUL_FIRST, trail = 0x11A7u + s % 28;
            if (!push_lower(t, out, 0x1100u + s / 588) || !push_lower(t, out, 0x1161u + (s % 588) / 28)) return 0;
            return trail == 0x11A7u || push_lower(t, out, trail);
        }
        long k = map_find(bubo_wpm_strip_keys, BUBO_WPM_N_STRIP, cp);
        if (k >= 0) {
            const uint32_t v = bubo_wpm_strip_vals[k];
            for (uint32_t j = 0; j < (v & 7u); j++) {
                if (!push_lower(t, out, bubo_wpm_strip_pool[(v >> 3) + j])) return 0;
            }
            return 1;
        }
    }
    return push_lower(t, out, cp);
}

static int normalize(const bubo_tokenizer *t, const uint8_t *text, size_t len, bubo_u32vec *out) {
    for (size_t i = 0; i < len;) {
        /* invalid UTF-8 decodes to U+FFFD, which clean_text drops */
        const uint32_t cp = bubo_utf8_decode_llama(text, len, &i);
        const uint32_t cls = wpm_class(cp);
        int ok;
        if (cls == BUBO_WPM_DROP) {
            ok = 1;
        } else if (cls == BUBO_WPM_SPACE) {
            ok = bubo_u32vec_push(out, ' ');
        } else if (cls == BUBO_WPM_CHINESE && t->wpm_chinese_chars) {
            ok = bubo_u32vec_push(out, ' ') && push_normalized(t, out, cp, cls) && bubo_u32vec_push(out, ' ');
        } else {
            ok = push_normalized(t, out, cp, cls);
        }
        if (!ok) return 0;
    }
    return 1;
}

// ---------------------------------------------------------------------------------------------
// 3. WordPiece

typedef struct {
    uint8_t *buf;  /* PHANTOM_SPACE, then the word's UTF-8 */
    uint32_t *off; /* (n + 1) byte offset of each code point in buf; off[0] = 3 */
    size_t cap;    /* code points buf and off have room for */
} word_scratch;

static void push_unk(const bubo_tokenizer *t, bubo_tok_sink *sink) {
    /* llama.cpp pushes its unknown id even when there is none; a vocabulary without one gives
     * nothing for the word */
    if (t->special_ids[BUBO_SPECIAL_UNK] >= 0) bubo_sink_push(sink, t->special_ids[BUBO_SPECIAL_UNK]);
}

static int wordpiece(const bubo_tokenizer *t, const uint32_t *cps, size_t n, word_scratch *w, bubo_tok_sink *sink) {
    if (n > t->wpm_max_word_chars) {
        push_unk(t, sink);
        return 1;
    }
    if (n > w->cap) {
        size_t cap = n > 2 * w->cap ? n : 2 * w->cap;
        uint8_t *buf = realloc(w->buf, 3 + 4 * cap);
        if (!buf) return 0;
        w->buf = buf;
        uint32_t *off = realloc(w->off, (cap + 1) * sizeof *off);
        if (!off) return 0;
        w->off = off;
        w->cap = cap;
    }
    memcpy(w->buf, PHANTOM_SPACE, 3);
    w->off[0] = 3;
    for (size_t j = 0; j < n; j++) w->off[j + 1] = w->off[j] + (uint32_t)bubo_utf8_encode(cps[j], w->buf + w->off[j]);

    const size_t first = sink->n;
    for (size_t start = 0; start < n;) {
        const uint32_t from = start == 0 ? 0 : w->off[start]; /* the first piece with its phantom space */
        int32_t id = -1;
        size_t end = n;
        /* A continuation that starts with U+2581 would find a word-initial piece ("##\u2581a" is
         * not in a BERT vocabulary, "\u2581a" is a stored "a"): HF finds nothing there, nor do
         * we. (llama.cpp looks it up and takes the word-initial piece.) */
        if (start > 0 && cps[start] == 0x2581u) end = start;
        for (; end > start; end--) {
            const uint32_t nbytes = w->off[end] - from;
            if (nbytes > t->max_token_len) continue;
            id = bubo_strmap_get(t, (const char *)w->buf + from, nbytes);
            if (id >= 0) break;
        }
        if (id < 0) { /* no piece here: the whole word is unknown */
            sink->n = first;
            push_unk(t, sink);
            return 1;
        }
        bubo_sink_push(sink, id);
        start = end;
    }
    return 1;
}

int bubo_wpm_fragment(const bubo_tokenizer *t, const uint8_t *text, size_t len, bubo_tok_sink *sink) {
    bubo_u32vec norm = {NULL, 0, 0};
    word_scratch w = {NULL, NULL, 0};
    int ok = normalize(t, text, len, &norm);

    /* 2. BertPreTokenizer: words end at white space; punctuation is a word of its own */
    for (size_t k = 0, start = 0; ok && k <= norm.n; k++) {
        const uint32_t cls = k < norm.n ? wpm_class(norm.v[k]) : BUBO_WPM_SPACE;
        if (cls != BUBO_WPM_SPACE && cls != BUBO_WPM_PUNCT) continue;
        if (k > start) ok = wordpiece(t, norm.v + start, k - start, &w, sink);
        if (ok && cls == BUBO_WPM_PUNCT) ok = wordpiece(t, norm.v + k, 1, &w, sink);
        start = k + 1;
    }
    bubo_u32vec_free(&norm);
    free(w.buf);
    free(w.off);
    return ok;
}
