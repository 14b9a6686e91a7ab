/* Tokens -> text: pieces, whole sequences (llama_vocab::impl::detokenize) and the streaming
 * detokenizer that never splits a UTF-8 character. */
#include <stdlib.h>
#include <string.h>

#include "text/text_internal.h"

static int in_vocab(const bubo_tokenizer *t, bubo_token id) { return id >= 0 && (uint32_t)id < t->n_vocab; }

const char *bubo_token_piece(const bubo_tokenizer *t, bubo_token id, int special, size_t *len) {
    if (!in_vocab(t, id)) return NULL;
    const char *p = t->piece + t->piece_off[id];
    *len = (!special && (t->attr[id] & (BUBO_TOKEN_ATTR_UNKNOWN | BUBO_TOKEN_ATTR_CONTROL))) ? 0 : t->piece_len[id];
    return p;
}

/* llama.cpp's clean_up_tokenization_spaces, on the whole text in place; returns the new length */
static size_t clean_spaces(char *text, size_t total) {
    /* " ?", " !", " .", " ," lose the space */
    size_t total1 = total;
    total = total ? 1 : 0;
    for (size_t i = 1; i < total1; ++i) {
        const char x = text[i];
        if (text[i - 1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ',')) total--;
        text[total++] = x;
    }
    /* " ' " -> "'" */
    size_t total2 = total;
    total = total ? 1 : 0;
    for (size_t i = 1; i < total2; ++i) {
        const char x = text[i];
        if (x == '\'' && i + 1 < total2 && text[i - 1] == ' ' && text[i + 1] == ' ') {
            total--;          /* the space before */
            text[++i] = '\0'; /* the space after (and what the next step sees as "before") */
        }
        text[total++] = x;
    }
    /* " 's", " 'm", " 're", " 've" lose the space (" 't", " 'd", " 'll" keep it) */
    size_t total3 = total;
    total = total ? 1 : 0;
    for (size_t i = 1; i < total3; ++i) {
        const char x = text[i];
        if (text[i - 1] == ' ' && x == '\'' && i + 1 < total3) {
            const char x1 = text[i + 1];
            if (x1 == 's' || x1 == 'm') {
                total--;
            } else if (i + 2 < total3) {
                const char x2 = text[i + 2];
                if ((x1 == 'r' && x2 == 'e') || (x1 == 'v' && x2 == 'e')) total--;
            }
        }
        text[total++] = x;
    }
    return total;
}

bubo_status bubo_detokenize(const bubo_tokenizer *t, const bubo_token *ids, size_t n, unsigned flags, char *out,
                            size_t cap, size_t *n_bytes, bubo_err *err) {
    *n_bytes = 0;
    for (size_t i = 0; i < n; i++) {
        if (!in_vocab(t, ids[i])) {
            return bubo_set_err(err, BUBO_ERR_INVALID, "detokenize: token %d at position %zu is not in the vocabulary (%u tokens)",
                                ids[i], i, t->n_vocab);
        }
    }
    /* SentencePiece prefixed a space to the text: take it off the first piece */
    int remove_space = t->add_space_prefix;
    if ((flags & BUBO_DETOK_REMOVE_SPECIAL) && t->add_bos && n > 0 && ids[0] == t->special_ids[BUBO_SPECIAL_BOS]) {
        remove_space = 0; /* as llama.cpp: after a removed BOS the space stays */
        ids++;
        n--;
    }
    if ((flags & BUBO_DETOK_REMOVE_SPECIAL) && t->add_eos && n > 0 && ids[n - 1] == t->special_ids[BUBO_SPECIAL_EOS]) n--;

    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        size_t len;
        const char *p = bubo_token_piece(t, ids[i], (flags & BUBO_DETOK_RENDER_SPECIAL) != 0, &len);
        if (remove_space && len > 0 && p[0] == ' ') {
            p++;
            len--;
        }
        remove_space = 0;
        if (total + len <= cap) memcpy(out + total, p, len);
        total += len;
    }
    /* the clean-up needs the whole text: when it does not fit, report the size before it */
    if (t->clean_spaces && total <= cap) total = clean_spaces(out, total);
    *n_bytes = total;
    return BUBO_OK;
}

// ---------------------------------------------------------------------------------------------
// streaming

struct bubo_detokenizer {
    const bubo_tokenizer *t;
    unsigned flags;
    int remove_space;  /* the first piece still has to lose its SentencePiece space */
    uint8_t *joined;   /* held-back bytes + the new piece: (3 + max_piece_len) */
    size_t n_held;     /* bytes of an incomplete character at the start of joined (<= 3) */
    uint8_t *out;      /* what feed/flush return: (3 * (3 + max_piece_len)) */
};

static void stream_reset(bubo_detokenizer *d) {
    d->remove_space = !(d->flags & BUBO_DETOK_CONTINUATION) && d->t->add_space_prefix;
    d->n_held = 0;
}

bubo_status bubo_detokenizer_create(const bubo_tokenizer *t, unsigned flags, bubo_detokenizer **out, bubo_err *err) {
    *out = NULL;
    bubo_detokenizer *d = calloc(1, sizeof *d);
    size_t cap = 3 + t->max_piece_len;
    if (d) {
        d->joined = malloc(cap);
        d->out = malloc(3 * cap);
    }
    if (!d || !d->joined || !d->out) {
        bubo_detokenizer_free(d);
        return bubo_set_err(err, BUBO_ERR_NOMEM, "detokenizer: out of memory");
    }
    d->t = t;
    d->flags = flags;
    stream_reset(d);
    *out = d;
    return BUBO_OK;
}

void bubo_detokenizer_free(bubo_detokenizer *d) {
    if (!d) return;
    free(d->joined);
    free(d->out);
    free(d);
}

bubo_status bubo_detokenizer_feed(bubo_detokenizer *d, bubo_token id, const char **text, size_t *len, bubo_err *err) {
    *text = (const char *)d->out;
    *len = 0;
    size_t n;
    const char *p = bubo_token_piece(d->t, id, (d->flags & BUBO_DETOK_RENDER_SPECIAL) != 0, &n);
    if (!p) {
        return bubo_set_err(err, BUBO_ERR_INVALID, "detokenizer: token %d is not in the vocabulary (%u tokens)", id,
                            d->t->n_vocab);
    }
    if (d->remove_space && n > 0 && p[0] == ' ') {
        p++;
        n--;
    }
    d->remove_space = 0;
    memcpy(d->joined + d->n_held, p, n);
    size_t total = d->n_held + n;
    size_t done = bubo_utf8_complete_prefix(d->joined, total);
    *len = bubo_utf8_sanitize(d->joined, done, d->out);
    d->n_held = total - done;
    memmove(d->joined, d->joined + done, d->n_held);
    return BUBO_OK;
}

void bubo_detokenizer_flush(bubo_detokenizer *d, const char **text, size_t *len) {
    *text = (const char *)d->out;
    *len = bubo_utf8_sanitize(d->joined, d->n_held, d->out);
    stream_reset(d);
}
