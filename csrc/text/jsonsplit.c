/* bubo_json_split: see bubo/jsonsplit.h. Two passes over the text: the first finds every array or
 * object of LARGE characters or more (its brackets); the second walks the text again and, inside
 * each large one, cuts runs of its own members at its own commas. */
#include <stdlib.h>
#include <string.h>

#include "bubo/jsonsplit.h"

typedef struct {
    int64_t open, close;
} span;

/* The character position of byte i: the characters (bytes that are not UTF-8 continuation
 * bytes) in s[0, i), counted on from *counted, where *chars of them were. */
static inline int64_t count_to(const unsigned char *s, size_t *counted, int64_t *chars, size_t i) {
    int64_t n = 0;
    for (size_t k = *counted; k < i; k++) n += (s[k] & 0xC0) != 0x80;
    *chars += n;
    *counted = i;
    return *chars;
}

typedef struct {
    void *data;
    size_t n, cap, size;
} grow;

static int grow_push(grow *g, const void *item) {
    if (g->n == g->cap) {
        size_t cap = g->cap ? 2 * g->cap : 16;
        void *data = realloc(g->data, cap * g->size);
        if (!data) return 0;
        g->data = data;
        g->cap = cap;
    }
    memcpy((char *)g->data + g->n * g->size, item, g->size);
    g->n++;
    return 1;
}

static int by_open(const void *x, const void *y) {
    int64_t a = ((const span *)x)->open, b = ((const span *)y)->open;
    return (a > b) - (a < b);
}

/* One walk over the text's bytes: at(ctx, byte, position) for each bracket and comma outside the
 * strings, with its character position. A string is skipped to its closing quote (memchr: the
 * first quote not escaped, that is not after an odd run of backslashes); positions are counted
 * only up to where one is needed. Returns the position of an unterminated string's quote, or -1;
 * *stopped when at() returned 0. Inlined into each pass, so that at() is a direct call. */
typedef int (*visit)(void *ctx, unsigned char c, int64_t pos);

static inline __attribute__((always_inline)) int64_t walk(const unsigned char *s, size_t len, visit at, void *ctx,
                                                          int *stopped) {
    size_t counted = 0; /* characters are counted in s[0, counted) */
    int64_t chars = 0;
#define POS(i) (count_to(s, &counted, &chars, (i)))
    *stopped = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = s[i];
        if (c == '"') {
            size_t j = i + 1;
            for (;;) {
                const unsigned char *q = j < len ? memchr(s + j, '"', len - j) : NULL;
                if (!q) return POS(i);
                size_t k = (size_t)(q - s), back = 0;
                while (k - back > i + 1 && s[k - back - 1] == '\\') back++;
                j = k + 1;
                if (back % 2 == 0) break;
            }
            i = j - 1;
        } else if (c == '[' || c == ']' || c == '{' || c == '}' || c == ',') {
            if (!at(ctx, c, POS(i))) {
                *stopped = 1;
                return -1;
            }
        }
    }
#undef POS
    return -1;
}

/* ---- pass 1: the large containers ---- */

typedef struct {
    int64_t *open;  /* positions of the open brackets, innermost last */
    char *kind;     /* '[' or '{' */
    int depth, max_depth;
    int64_t large;
    grow spans;
    int why;
    int64_t where;
} find_state;

static int find_at(void *ctx, unsigned char c, int64_t pos) {
    find_state *st = ctx;
    if (c == '[' || c == '{') {
        if (st->depth == st->max_depth) {
            st->why = BUBO_JSON_TOO_DEEP;
            st->where = pos;
            return 0;
        }
        st->open[st->depth] = pos;
        st->kind[st->depth] = (char)c;
        st->depth++;
    } else if (c == ']' || c == '}') {
        if (st->depth == 0 || st->kind[st->depth - 1] != (c == ']' ? '[' : '{')) {
            st->why = BUBO_JSON_UNMATCHED;
            st->where = pos;
            return 0;
        }
        st->depth--;
        span sp = {st->open[st->depth], pos};
        if (pos - sp.open + 1 >= st->large && !grow_push(&st->spans, &sp)) {
            st->why = -1; /* out of memory */
            return 0;
        }
    }
    return 1;
}

/* ---- pass 2: the pieces ---- */

typedef struct {
    int depth;         /* nesting depth of this large container (1: the text's own value) */
    int64_t run_start; /* where the run being gathered starts; -1 right after a large member */
    int64_t last_comma;
} frame;

typedef struct {
    const span *spans;
    size_t n_spans, next; /* the next large container, in the order of their open brackets */
    int64_t run;
    int depth;
    frame *frames;
    int n_frames;
    grow pieces;
} cut_state;

static int emit(cut_state *st, int64_t kind, int64_t a, int64_t b) {
    bubo_json_piece p = {kind, a, b};
    return grow_push(&st->pieces, &p);
}

static int cut_at(void *ctx, unsigned char c, int64_t pos) {
    cut_state *st = ctx;
    frame *top = st->n_frames ? &st->frames[st->n_frames - 1] : NULL;
    if (c == '[' || c == '{') {
        st->depth++;
        if (st->next < st->n_spans && st->spans[st->next].open == pos) {
            /* a large member: the members gathered before it are a run, up to their last comma */
            if (top && top->run_start >= 0 && top->last_comma >= top->run_start &&
                !emit(st, BUBO_JSON_RUN, top->run_start, top->last_comma))
                return 0;
            if (top) top->run_start = -1;
            if (!emit(st, BUBO_JSON_OPEN, pos, st->spans[st->next].close)) return 0;
            frame f = {st->depth, pos + 1, -1};
            st->frames[st->n_frames++] = f;
            st->next++;
        }
    } else if (c == ']' || c == '}') {
        if (top && top->depth == st->depth) {
            if (top->run_start >= 0 && pos > top->run_start && !emit(st, BUBO_JSON_RUN, top->run_start, pos))
                return 0;
            if (!emit(st, BUBO_JSON_CLOSE, pos, pos)) return 0;
            st->n_frames--; /* the parent's run_start is -1 since this one opened */
        }
        st->depth--;
    } else if (top && top->depth == st->depth) { /* one of its own commas */
        if (top->run_start < 0) {
            top->run_start = pos + 1; /* the comma after a large member */
        } else {
            top->last_comma = pos;
            if (pos - top->run_start >= st->run) {
                if (!emit(st, BUBO_JSON_RUN, top->run_start, pos)) return 0;
                top->run_start = pos + 1;
            }
        }
    }
    return 1;
}

bubo_status bubo_json_split(const char *text, size_t len, int64_t large, int64_t run, int max_depth,
                            bubo_json_piece **pieces, size_t *n, int *why, int64_t *where, bubo_err *err) {
    *pieces = NULL;
    *n = 0;
    *why = BUBO_JSON_SPLIT_OK;
    *where = -1;
    if (large < 1 || run < 1 || max_depth < 1)
        return bubo_set_err(err, BUBO_ERR_INVALID, "large, run and max_depth must be at least 1");
    const unsigned char *s = (const unsigned char *)text;
    bubo_status status = BUBO_OK;
    find_state fs = {0};
    cut_state cs = {0};
    fs.open = malloc(sizeof(int64_t) * (size_t)max_depth);
    fs.kind = malloc((size_t)max_depth);
    fs.max_depth = max_depth;
    fs.large = large;
    fs.spans.size = sizeof(span);
    cs.pieces.size = sizeof(bubo_json_piece);
    if (!fs.open || !fs.kind) goto nomem;

    int stopped;
    int64_t quote = walk(s, len, find_at, &fs, &stopped);
    if (stopped && fs.why < 0) goto nomem;
    if (stopped) {
        *why = fs.why;
        *where = fs.where;
        goto done;
    }
    if (quote >= 0) {
        *why = BUBO_JSON_UNTERMINATED_STRING;
        *where = quote;
        goto done;
    }
    if (fs.depth > 0) {
        *why = BUBO_JSON_UNCLOSED;
        *where = fs.open[fs.depth - 1];
        goto done;
    }
    if (fs.spans.n == 0) goto done;

    qsort(fs.spans.data, fs.spans.n, sizeof(span), by_open);
    cs.spans = fs.spans.data;
    cs.n_spans = fs.spans.n;
    cs.run = run;
    cs.frames = malloc(sizeof(frame) * (size_t)max_depth);
    if (!cs.frames) goto nomem;
    walk(s, len, cut_at, &cs, &stopped);
    if (stopped) goto nomem; /* the first pass checked the rest: only an allocation fails here */
    *pieces = cs.pieces.data;
    *n = cs.pieces.n;
    cs.pieces.data = NULL;
    goto done;

nomem:
    status = bubo_set_err(err, BUBO_ERR_NOMEM, "out of memory splitting a JSON text of %zu bytes", len);
done:
    free(fs.open);
    free(fs.kind);
    free(fs.spans.data);
    free(cs.frames);
    free(cs.pieces.data);
    return status;
}
