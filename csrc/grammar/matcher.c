/* The matcher: llama.cpp's set of grammar stacks, advanced one byte at a time.
 *
 * A stack is a list of positions (top last). The top is always a terminal (a class to match
 * next); the frames below are where to continue when the rule above finishes. An empty stack
 * means the root rule is complete. Advancing by a code point keeps the stacks whose top accepts
 * it, moves each past its class and expands rule references at the new top until every top is a
 * terminal again (expand()). Bytes that end inside a UTF-8 character are held in the state and
 * only prune the stacks whose class cannot contain any character starting with them.
 *
 * The mask walks the vocabulary's byte trie depth-first with one stack set per depth; a node
 * whose set comes out empty skips its whole subtree (vocab.c builds the trie, this file walks it).
 * Two things make a 150k-token walk cost tens of microseconds rather than tens of milliseconds:
 *   - stack sets are interned and their byte transitions memoized (a lazily built DFA, bounded,
 *     kept across mask() calls), so most nodes cost one table load;
 *   - a state that loops back to itself on every byte (and every character) met in a subtree
 *     accepts the whole subtree's tokens at once: inside a JSON string that is nearly all of it. */
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar_internal.h"
#include "grammar/vocab_internal.h"

// ---------------------------------------------------------------------------------------------
// stack sets

typedef struct {
    uint32_t *frames;     /* (n_frames) every stack's positions, concatenated */
    size_t n_frames, cap_frames;
    uint32_t *off, *len;  /* (n) stack i is frames[off[i] .. off[i] + len[i]), top last */
    uint32_t *hash;       /* (n) for deduplication */
    size_t n, cap;
    /* An unfinished UTF-8 character: its bits so far, continuation bytes still due, and the
     * smallest code point its length may encode (overlong forms are invalid). */
    uint32_t utf8_value, utf8_min;
    uint32_t utf8_left;
    /* Every alive stack accepts every completion of the unfinished character, and every
     * completion is valid UTF-8: its exact bits no longer matter and are dropped (utf8_value 0),
     * so the thousands of CJK prefixes inside a JSON string are one state, not thousands. */
    uint32_t utf8_any;
} stackset;

#define DEDUP_SLOTS (2 * BUBO_GRAMMAR_MAX_STACKS) /* power of two, at least twice the stacks */

typedef struct {
    stackset work;        /* stacks waiting to be expanded */
    uint32_t *slot_stamp, *slot_index; /* (DEDUP_SLOTS) open addressing; a slot is live iff its stamp is current */
    uint32_t stamp;
    uint32_t *saved;      /* (BUBO_GRAMMAR_MAX_DEPTH) the stack being expanded, minus its top */
} workspace;

/* Transitions between the stack sets met while walking the trie, memoized: a DFA built lazily.
 * Inside a JSON string almost every byte leads from a state back to the same state, so after
 * the first few hundred transitions the walk over a 150k-token trie is one table load per node.
 * The cache belongs to one matcher and lives across mask() calls (the states of one generation
 * repeat); it is bounded and emptied (buffers kept) when it fills. */
#define DFA_MAX_STATES 2048
#define DFA_MAX_STACKS_PER_STATE 64 /* larger sets are rare and costly to compare: not cached */
#define DFA_MAX_FRAMES (1u << 20)     /* frames held by all cached states together (4 MiB) */
#define DFA_INDEX_SLOTS (2 * DFA_MAX_STATES)
#define NO_STATE (-1)
#define TRANS_UNKNOWN (-1) /* memset(0xFF) */
#define TRANS_DEAD (-2)

typedef struct {
    stackset *states;     /* (cap_states = DFA_MAX_STATES) interned sets; buffers reused after a flush */
    uint32_t *state_hash; /* (DFA_MAX_STATES) */
    uint32_t n_states, cap_states;
    size_t n_frames;      /* frames in the cached states, bounded by DFA_MAX_FRAMES */
    int32_t *trans;       /* (DFA_MAX_STATES * 256) next state id, TRANS_UNKNOWN or TRANS_DEAD */
    uint32_t *index;      /* (DFA_INDEX_SLOTS) open addressing on state_hash: id + 1, 0 empty */
    uint64_t (*loop_ascii)[2]; /* (DFA_MAX_STATES) ASCII bytes that lead from the state to itself */
    uint8_t *loop_known;  /* (DFA_MAX_STATES) LOOP_*_KNOWN: loop_ascii, loop_utf8 are computed */
    uint8_t *loop_utf8;   /* (DFA_MAX_STATES) every non-ASCII character leads from the state to itself */
    uint8_t *seen;        /* (DFA_MAX_STATES) scratch of cache_loops, all 0 between calls */
} dfa_cache;

struct bubo_grammar_matcher {
    const bubo_grammar *g;
    const bubo_grammar_vocab *vocab;
    stackset state;
    stackset tmp[2];      /* accept_bytes builds here, then swaps into state */
    stackset *levels;     /* (vocab->max_len + 1) the mask walk's set at each trie depth */
    const stackset **level_set; /* (n_levels) the set in use at each depth: levels[d] or a cached one */
    int32_t *level_id;    /* (n_levels) its id in the cache, or NO_STATE */
    uint32_t n_levels;
    workspace ws;
    dfa_cache cache;
};

static void set_free(stackset *s) {
    free(s->frames);
    free(s->off);
    free(s->len);
    free(s->hash);
    memset(s, 0, sizeof *s);
}

static void set_clear(stackset *s) {
    s->n = 0;
    s->n_frames = 0;
    s->utf8_left = 0;
    s->utf8_value = 0;
    s->utf8_min = 0;
    s->utf8_any = 0;
}

static bubo_status reserve_frames(stackset *s, size_t need, bubo_err *err) {
    if (need <= s->cap_frames) return BUBO_OK;
    size_t cap = s->cap_frames ? s->cap_frames : 64;
    while (cap < need) cap *= 2;
    uint32_t *f = realloc(s->frames, cap * sizeof *f);
    if (!f) return bubo_set_err(err, BUBO_ERR_NOMEM, "grammar: out of memory");
    s->frames = f;
    s->cap_frames = cap;
    return BUBO_OK;
}

static bubo_status reserve_stacks(stackset *s, size_t need, bubo_err *err) {
    if (need <= s->cap) return BUBO_OK;
    size_t cap = s->cap ? s->cap * 2 : 16;
    while (cap < need) cap *= 2;
    uint32_t *o = realloc(s->off, cap * sizeof *o);
    if (o) s->off = o;
    uint32_t *l = realloc(s->len, cap * sizeof *l);
    if (l) s->len = l;
    uint32_t *h = realloc(s->hash, cap * sizeof *h);
    if (h) s->hash = h;
    if (!o || !l || !h) return bubo_set_err(err, BUBO_ERR_NOMEM, "grammar: out of memory");
    s->cap = cap;
    return BUBO_OK;
}

/* Append a stack of len frames: prefix[0..prefix_len) then up to two more positions. */
static bubo_status set_push(stackset *s, const uint32_t *prefix, uint32_t prefix_len, const uint32_t *extra,
                            uint32_t n_extra, bubo_err *err) {
    uint32_t len = prefix_len + n_extra;
    if (len > BUBO_GRAMMAR_MAX_DEPTH)
        return bubo_set_err(err, BUBO_ERR_UNSUPPORTED,
                            "grammar: the text nests deeper than %d rules", BUBO_GRAMMAR_MAX_DEPTH);
    bubo_status st;
    if ((st = reserve_frames(s, s->n_frames + len, err)) != BUBO_OK) return st;
    if ((st = reserve_stacks(s, s->n + 1, err)) != BUBO_OK) return st;
    /* prefix may point into s->frames, which reserve_frames may have moved: callers pass
     * prefixes from other sets only */
    if (prefix_len) memcpy(s->frames + s->n_frames, prefix, prefix_len * sizeof *prefix);
    if (n_extra) memcpy(s->frames + s->n_frames + prefix_len, extra, n_extra * sizeof *extra);
    s->off[s->n] = (uint32_t)s->n_frames;
    s->len[s->n] = len;
    s->n_frames += len;
    s->n++;
    return BUBO_OK;
}

static bubo_status set_copy(stackset *dst, const stackset *src, bubo_err *err) {
    bubo_status st;
    if ((st = reserve_frames(dst, src->n_frames, err)) != BUBO_OK) return st;
    if ((st = reserve_stacks(dst, src->n, err)) != BUBO_OK) return st;
    if (src->n_frames) memcpy(dst->frames, src->frames, src->n_frames * sizeof *src->frames);
    if (src->n) { /* NULL buffers of an empty set are not memcpy's to touch */
        memcpy(dst->off, src->off, src->n * sizeof *src->off);
        memcpy(dst->len, src->len, src->n * sizeof *src->len);
        memcpy(dst->hash, src->hash, src->n * sizeof *src->hash);
    }
    dst->n = src->n;
    dst->n_frames = src->n_frames;
    dst->utf8_value = src->utf8_value;
    dst->utf8_left = src->utf8_left;
    dst->utf8_min = src->utf8_min;
    dst->utf8_any = src->utf8_any;
    return BUBO_OK;
}

static void set_swap(stackset *a, stackset *b) {
    stackset t = *a;
    *a = *b;
    *b = t;
}

static uint32_t hash_frames(const uint32_t *f, uint32_t n) {
    uint32_t h = 2166136261u ^ n;
    for (uint32_t i = 0; i < n; i++) h = (h ^ f[i]) * 16777619u;
    return h;
}

// ---------------------------------------------------------------------------------------------
// expansion

static void ws_begin(workspace *ws) {
    if (++ws->stamp == 0) { /* wrapped: every old stamp could look current again */
        memset(ws->slot_stamp, 0, DEDUP_SLOTS * sizeof *ws->slot_stamp);
        ws->stamp = 1;
    }
}

/* Move a fully expanded stack from the work list into out, unless out already has it. */
static bubo_status emit(workspace *ws, stackset *out, const uint32_t *f, uint32_t n, bubo_err *err) {
    uint32_t h = hash_frames(f, n);
    uint32_t slot = h & (DEDUP_SLOTS - 1);
    for (; ws->slot_stamp[slot] == ws->stamp; slot = (slot + 1) & (DEDUP_SLOTS - 1)) {
        uint32_t i = ws->slot_index[slot];
        if (out->hash[i] == h && out->len[i] == n && (n == 0 || memcmp(out->frames + out->off[i], f, n * sizeof *f) == 0))
            return BUBO_OK;
    }
    if (out->n >= BUBO_GRAMMAR_MAX_STACKS)
        return bubo_set_err(err, BUBO_ERR_UNSUPPORTED,
                            "grammar: more than %d alive parses at once (the grammar is too ambiguous)",
                            BUBO_GRAMMAR_MAX_STACKS);
    bubo_status st = set_push(out, f, n, NULL, 0, err);
    if (st != BUBO_OK) return st;
    out->hash[out->n - 1] = h;
    ws->slot_stamp[slot] = ws->stamp;
    ws->slot_index[slot] = (uint32_t)(out->n - 1);
    return BUBO_OK;
}

/* Expand every stack of ws->work (whose tops may be rule references or nothing) into out, where
 * every top is a terminal or the stack is empty. Iterative: no C recursion however deep the
 * grammar; left recursion was refused at parse time, so this terminates. */
static bubo_status expand(const bubo_grammar *g, workspace *ws, stackset *out, bubo_err *err) {
    stackset *w = &ws->work;
    uint32_t budget = BUBO_GRAMMAR_MAX_WORK;
    bubo_status st;
    while (w->n > 0) {
        if (budget-- == 0)
            return bubo_set_err(err, BUBO_ERR_UNSUPPORTED,
                                "grammar: one character opens more than %d parses (the grammar is too ambiguous)",
                                BUBO_GRAMMAR_MAX_WORK);
        /* pop the last stack; its frames stay valid until the next push overwrites them */
        w->n--;
        uint32_t off = w->off[w->n], len = w->len[w->n];
        w->n_frames = off;
        const uint32_t *f = w->frames + off;
        if (len == 0 || g->elems[f[len - 1]].type != GE_RULE_REF) {
            if ((st = emit(ws, out, f, len, err)) != BUBO_OK) return st;
            continue;
        }
        uint32_t top = f[len - 1];
        uint32_t rule_id = g->elems[top].value;
        /* pushes below overwrite the popped frames: keep the base (all but the top) aside */
        uint32_t base_len = len - 1;
        memcpy(ws->saved, f, (size_t)base_len * sizeof *f);
        uint32_t extra[2], n_extra = 0;
        if (!ge_is_end_of_alt(g->elems[top + 1].type)) extra[n_extra++] = top + 1;
        for (uint32_t pos = g->rule_start[rule_id];; pos++) {
            uint32_t n = n_extra;
            if (!ge_is_end_of_alt(g->elems[pos].type)) extra[n++] = pos;
            if ((st = set_push(w, ws->saved, base_len, extra, n, err)) != BUBO_OK) return st;
            while (!ge_is_end_of_alt(g->elems[pos].type)) pos++;
            if (g->elems[pos].type == GE_END) break;
        }
    }
    return BUBO_OK;
}

// ---------------------------------------------------------------------------------------------
// matching one character

static int class_accepts_range(const bubo_grammar *g, uint32_t pos, uint32_t lo, uint32_t hi);

static inline int class_accepts(const bubo_grammar *g, uint32_t pos, uint32_t cp) {
    if (cp < 128) return (int)((g->term_ascii[pos][cp >> 6] >> (cp & 63)) & 1);
    return class_accepts_range(g, pos, cp, cp);
}

/* The range [*a, *b] a class lists at q (a single character or a CHAR_RNG_UPPER pair); returns
 * the position of the class's next entry. */
static uint32_t next_range(const gelem *e, uint32_t q, uint32_t *a, uint32_t *b) {
    *a = *b = e[q].value;
    if (e[q + 1].type == GE_CHAR_RNG_UPPER) {
        *b = e[q + 1].value;
        return q + 2;
    }
    return q + 1;
}

/* Do the ranges listed by the class at pos (its polarity aside) cover all of [lo, hi]? Walk
 * cur upward through ranges that contain it, until past hi or stuck. */
static int class_lists_all(const bubo_grammar *g, uint32_t pos, uint32_t lo, uint32_t hi) {
    const gelem *e = g->elems;
    if (e[pos].type == GE_CHAR_ANY) return 1;
    uint32_t cur = lo;
    while (1) {
        int moved = 0;
        uint32_t q = pos;
        do {
            uint32_t a, b;
            q = next_range(e, q, &a, &b);
            if (a <= cur && cur <= b) {
                if (b >= hi) return 1;
                cur = b + 1;
                moved = 1;
            }
        } while (e[q].type == GE_CHAR_ALT);
        if (!moved) return 0;
    }
}

/* Does some range listed by the class at pos meet [lo, hi]? */
static int class_lists_some(const bubo_grammar *g, uint32_t pos, uint32_t lo, uint32_t hi) {
    const gelem *e = g->elems;
    if (e[pos].type == GE_CHAR_ANY) return 1;
    uint32_t q = pos;
    do {
        uint32_t a, b;
        q = next_range(e, q, &a, &b);
        if (a <= hi && b >= lo) return 1;
    } while (e[q].type == GE_CHAR_ALT);
    return 0;
}

/* Does the class at pos accept some code point in [lo, hi]? */
static int class_accepts_range(const bubo_grammar *g, uint32_t pos, uint32_t lo, uint32_t hi) {
    if (g->elems[pos].type == GE_CHAR_NOT) return !class_lists_all(g, pos, lo, hi);
    return class_lists_some(g, pos, lo, hi);
}

/* Does it accept every code point in [lo, hi]? */
static int class_accepts_every(const bubo_grammar *g, uint32_t pos, uint32_t lo, uint32_t hi) {
    if (g->elems[pos].type == GE_CHAR_NOT) return !class_lists_some(g, pos, lo, hi);
    return class_lists_all(g, pos, lo, hi);
}

/* Could the class at pos accept a character whose UTF-8 encoding starts with the bytes held in
 * (value, left, min)? Surrogates and code points beyond U+10FFFF are not characters. */
static int class_accepts_prefix(const bubo_grammar *g, uint32_t pos, uint32_t value, uint32_t left,
                                uint32_t min) {
    uint32_t lo = value << (6 * left), hi = lo | ((1u << (6 * left)) - 1);
    if (lo < min) lo = min;
    if (hi > 0x10FFFF) hi = 0x10FFFF;
    if (lo > hi) return 0;
    if (lo < 0xD800 && class_accepts_range(g, pos, lo, hi < 0xD7FF ? hi : 0xD7FF)) return 1;
    if (hi > 0xDFFF && class_accepts_range(g, pos, lo > 0xE000 ? lo : 0xE000, hi)) return 1;
    return 0;
}

/* out = in advanced by one byte. out ends up empty when the byte kills every stack. */
static bubo_status advance_byte(const bubo_grammar *g, workspace *ws, const stackset *in, uint8_t byte,
                                stackset *out, bubo_err *err) {
    set_clear(out);
    uint32_t value, left, min;
    if (in->utf8_left == 0) {
        if (byte < 0x80) {
            value = byte;
            left = 0;
            min = 0;
        } else if ((byte & 0xE0) == 0xC0) {
            value = byte & 0x1F, left = 1, min = 0x80;
        } else if ((byte & 0xF0) == 0xE0) {
            value = byte & 0x0F, left = 2, min = 0x800;
        } else if ((byte & 0xF8) == 0xF0) {
            value = byte & 0x07, left = 3, min = 0x10000;
        } else {
            return BUBO_OK; /* a continuation byte with nothing to continue, or 0xF8.. */
        }
    } else {
        if ((byte & 0xC0) != 0x80) return BUBO_OK;
        value = in->utf8_value << 6 | (byte & 0x3F);
        left = in->utf8_left - 1;
        min = in->utf8_min;
    }
    int any = in->utf8_left != 0 && in->utf8_any;

    bubo_status st;
    ws_begin(ws);
    if (left > 0) {
        /* mid-character: keep (unchanged) the stacks that may still match it */
        for (size_t i = 0; i < in->n; i++) {
            uint32_t n = in->len[i];
            if (n == 0) continue;
            const uint32_t *f = in->frames + in->off[i];
            if (!any && !class_accepts_prefix(g, f[n - 1], value, left, min)) continue;
            if ((st = set_push(out, f, n, NULL, 0, err)) != BUBO_OK) return st;
            out->hash[out->n - 1] = in->hash[i];
        }
        if (out->n == 0) return BUBO_OK;
        out->utf8_value = any ? 0 : value; /* once dropped, the bits stay dropped */
        out->utf8_left = left;
        out->utf8_min = min;
        out->utf8_any = any;
        uint32_t lo = value << (6 * left), hi = lo | ((1u << (6 * left)) - 1);
        if (!any && lo >= min && hi <= 0x10FFFF && (hi < 0xD800 || lo > 0xDFFF)) {
            int every = 1;
            for (size_t i = 0; i < out->n && every; i++)
                every = class_accepts_every(g, out->frames[out->off[i] + out->len[i] - 1], lo, hi);
            if (every) {
                out->utf8_any = 1;
                out->utf8_value = 0;
            }
        }
        return BUBO_OK;
    }
    uint32_t cp = value;
    if (!any && (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))) return BUBO_OK;

    stackset *w = &ws->work;
    set_clear(w);
    for (size_t i = 0; i < in->n; i++) {
        uint32_t n = in->len[i];
        if (n == 0) continue;
        const uint32_t *f = in->frames + in->off[i];
        uint32_t top = f[n - 1];
        if (!any && !class_accepts(g, top, cp)) continue;
        uint32_t next = g->term_next[top];
        uint32_t extra = next;
        int keep = !ge_is_end_of_alt(g->elems[next].type);
        if ((st = set_push(w, f, n - 1, &extra, keep ? 1 : 0, err)) != BUBO_OK) return st;
    }
    return expand(g, ws, out, err);
}

// ---------------------------------------------------------------------------------------------
// transition cache

/* Order-independent: the same stacks in another order are the same state. */
static uint32_t set_hash(const stackset *s) {
    uint32_t h = s->utf8_value * 2654435761u ^ s->utf8_left * 40503u ^ s->utf8_min ^ s->utf8_any ^ (uint32_t)s->n * 97u;
    for (size_t i = 0; i < s->n; i++) {
        uint32_t x = s->hash[i] * 0x9E3779B1u;
        h += x ^ (x >> 15);
    }
    return h;
}

static int set_equal(const stackset *a, const stackset *b) {
    if (a->n != b->n || a->utf8_value != b->utf8_value || a->utf8_left != b->utf8_left || a->utf8_min != b->utf8_min ||
        a->utf8_any != b->utf8_any)
        return 0;
    for (size_t i = 0; i < a->n; i++) { /* both are deduplicated: a subset of equal size is equal */
        size_t j = 0;
        for (; j < b->n; j++)
            if (a->hash[i] == b->hash[j] && a->len[i] == b->len[j] &&
                (a->len[i] == 0 || memcmp(a->frames + a->off[i], b->frames + b->off[j], a->len[i] * sizeof *a->frames) == 0))
                break;
        if (j == b->n) return 0;
    }
    return 1;
}

static void cache_flush(dfa_cache *c) {
    /* keep the buffers for reuse, but not more than the bound: drop the big ones */
    for (uint32_t i = 0; i < c->cap_states; i++)
        if (c->states[i].cap_frames > DFA_MAX_FRAMES / DFA_MAX_STATES) set_free(&c->states[i]);
    c->n_states = 0;
    c->n_frames = 0;
    if (c->index) memset(c->index, 0, DFA_INDEX_SLOTS * sizeof *c->index);
}

static void cache_free(dfa_cache *c) {
    for (uint32_t i = 0; i < c->cap_states; i++) set_free(&c->states[i]);
    free(c->states);
    free(c->state_hash);
    free(c->trans);
    free(c->index);
    free(c->loop_ascii);
    free(c->loop_known);
    free(c->loop_utf8);
    free(c->seen);
    memset(c, 0, sizeof *c);
}

/* The id of a set equal to s, adding a copy of s if there is room; NO_STATE if s is not cached. */
static bubo_status cache_intern(dfa_cache *c, const stackset *s, int32_t *id, bubo_err *err) {
    *id = NO_STATE;
    if (s->n > DFA_MAX_STACKS_PER_STATE) return BUBO_OK;
    if (!c->trans) {
        c->trans = malloc((size_t)DFA_MAX_STATES * 256 * sizeof *c->trans);
        c->state_hash = malloc(DFA_MAX_STATES * sizeof *c->state_hash);
        c->index = calloc(DFA_INDEX_SLOTS, sizeof *c->index);
        /* all slots at once: the mask walk holds pointers to states while adding more */
        c->states = calloc(DFA_MAX_STATES, sizeof *c->states);
        c->cap_states = c->states ? DFA_MAX_STATES : 0;
        c->loop_ascii = malloc(DFA_MAX_STATES * sizeof *c->loop_ascii);
        c->loop_known = malloc(DFA_MAX_STATES);
        c->loop_utf8 = malloc(DFA_MAX_STATES);
        c->seen = calloc(DFA_MAX_STATES, 1);
        if (!c->trans || !c->state_hash || !c->index || !c->states || !c->loop_ascii || !c->loop_known ||
            !c->loop_utf8 || !c->seen) return bubo_set_err(err, BUBO_ERR_NOMEM, "grammar: out of memory");
    }
    uint32_t h = set_hash(s);
    uint32_t slot = h & (DFA_INDEX_SLOTS - 1);
    for (; c->index[slot]; slot = (slot + 1) & (DFA_INDEX_SLOTS - 1)) {
        uint32_t k = c->index[slot] - 1;
        if (c->state_hash[k] == h && set_equal(&c->states[k], s)) {
            *id = (int32_t)k;
            return BUBO_OK;
        }
    }
    if (c->n_states == DFA_MAX_STATES || c->n_frames + s->n_frames > DFA_MAX_FRAMES)
        return BUBO_OK; /* full: walk on uncached */
    uint32_t k = c->n_states;
    bubo_status st = set_copy(&c->states[k], s, err);
    if (st != BUBO_OK) return st;
    c->state_hash[k] = h;
    c->n_frames += s->n_frames;
    memset(c->trans + (size_t)k * 256, 0xFF, 256 * sizeof *c->trans);
    c->loop_known[k] = 0;
    c->index[slot] = k + 1;
    c->n_states++;
    *id = (int32_t)k;
    return BUBO_OK;
}

/* The state reached from cached state pid by byte (cached itself when there is room): its id,
 * TRANS_DEAD, or NO_STATE with the set left in scratch. */
static bubo_status cache_step(const bubo_grammar *g, workspace *ws, dfa_cache *c, int32_t pid, uint8_t byte,
                              stackset *scratch, int32_t *out, bubo_err *err) {
    int32_t t = c->trans[(size_t)pid * 256 + byte];
    if (t != TRANS_UNKNOWN) {
        *out = t;
        return BUBO_OK;
    }
    bubo_status st = advance_byte(g, ws, &c->states[pid], byte, scratch, err);
    if (st != BUBO_OK) return st;
    if (scratch->n == 0) {
        *out = c->trans[(size_t)pid * 256 + byte] = TRANS_DEAD;
        return BUBO_OK;
    }
    if ((st = cache_intern(c, scratch, out, err)) != BUBO_OK) return st;
    if (*out != NO_STATE) c->trans[(size_t)pid * 256 + byte] = *out;
    return BUBO_OK;
}

/* Which ASCII bytes lead from a cached state back to itself (cache_loops_ascii), and whether
 * every non-ASCII character does (cache_loops_utf8): the conditions under which the mask walk
 * takes a whole subtree at once. Computed on demand, for subtrees worth it. */
#define LOOP_ASCII_KNOWN 1
#define LOOP_UTF8_KNOWN 2
#define LOOP_MIN_SUBTREE 32  /* smaller subtrees are walked: the loop test would cost more */
#define LOOP_MAX_PARTIALS 64 /* distinct unfinished-character states cache_loops_utf8 may visit */

/* Does every continuation of the unfinished character in state t (each byte in [lo, hi], then
 * any continuation bytes) stay alive and end back in state home? Partial states whose bits were
 * dropped (utf8_any) are shared by thousands of prefixes: each is checked once (c->seen). */
static bubo_status utf8_returns(const bubo_grammar *g, workspace *ws, dfa_cache *c, int32_t t, uint8_t lo,
                                uint8_t hi, int32_t home, stackset *scratch, int *ok, int32_t *seen_list,
                                uint32_t *n_seen, bubo_err *err) {
    if (t < 0) {
        *ok = 0;
        return BUBO_OK;
    }
    if (c->seen[t]) return BUBO_OK;
    if (*n_seen == LOOP_MAX_PARTIALS) { /* prefixes matter (a class like [α-ω]): no shortcut */
        *ok = 0;
        return BUBO_OK;
    }
    c->seen[t] = 1;
    seen_list[(*n_seen)++] = t;
    uint32_t left = c->states[t].utf8_left;
    for (uint32_t b = lo; b <= hi && *ok; b++) {
        int32_t u;
        bubo_status st = cache_step(g, ws, c, t, (uint8_t)b, scratch, &u, err);
        if (st != BUBO_OK) return st;
        if (left == 1) {
            if (u != home) *ok = 0;
        } else if ((st = utf8_returns(g, ws, c, u, 0x80, 0xBF, home, scratch, ok, seen_list, n_seen, err)) != BUBO_OK) {
            return st;
        }
    }
    return BUBO_OK;
}

static bubo_status cache_loops_ascii(const bubo_grammar *g, workspace *ws, dfa_cache *c, int32_t id,
                                     stackset *scratch, bubo_err *err) {
    uint64_t loop[2] = {0, 0};
    for (uint32_t b = 0; b < 128; b++) {
        int32_t t;
        bubo_status st = cache_step(g, ws, c, id, (uint8_t)b, scratch, &t, err);
        if (st != BUBO_OK) return st;
        if (t == id) loop[b >> 6] |= 1ull << (b & 63);
    }
    c->loop_ascii[id][0] = loop[0];
    c->loop_ascii[id][1] = loop[1];
    c->loop_known[id] |= LOOP_ASCII_KNOWN;
    return BUBO_OK;
}

static bubo_status cache_loops_utf8(const bubo_grammar *g, workspace *ws, dfa_cache *c, int32_t id,
                                    stackset *scratch, bubo_err *err) {
    bubo_status st = BUBO_OK;
    int ok = c->states[id].utf8_left == 0;
    /* the lead bytes and the range of the byte after each (Unicode's table 3-7) */
    static const struct { uint8_t first, last, lo, hi; } leads[] = {
        {0xC2, 0xDF, 0x80, 0xBF}, {0xE0, 0xE0, 0xA0, 0xBF}, {0xE1, 0xEC, 0x80, 0xBF}, {0xED, 0xED, 0x80, 0x9F},
        {0xEE, 0xEF, 0x80, 0xBF}, {0xF0, 0xF0, 0x90, 0xBF}, {0xF1, 0xF3, 0x80, 0xBF}, {0xF4, 0xF4, 0x80, 0x8F},
    };
    int32_t seen_list[LOOP_MAX_PARTIALS];
    uint32_t n_seen = 0;
    for (size_t k = 0; k < sizeof leads / sizeof *leads && ok; k++) {
        for (uint32_t b = leads[k].first; b <= leads[k].last && ok; b++) {
            int32_t t;
            if ((st = cache_step(g, ws, c, id, (uint8_t)b, scratch, &t, err)) != BUBO_OK) break;
            if ((st = utf8_returns(g, ws, c, t, leads[k].lo, leads[k].hi, id, scratch, &ok, seen_list, &n_seen, err)) !=
                BUBO_OK)
                break;
        }
        if (st != BUBO_OK) break;
    }
    for (uint32_t k = 0; k < n_seen; k++) c->seen[seen_list[k]] = 0;
    if (st != BUBO_OK) return st;
    c->loop_utf8[id] = (uint8_t)ok;
    c->loop_known[id] |= LOOP_UTF8_KNOWN;
    return BUBO_OK;
}

// ---------------------------------------------------------------------------------------------
// matcher

static bubo_status ws_init(workspace *ws, bubo_err *err) {
    ws->slot_stamp = calloc(DEDUP_SLOTS, sizeof *ws->slot_stamp);
    ws->slot_index = malloc(DEDUP_SLOTS * sizeof *ws->slot_index);
    ws->saved = malloc(BUBO_GRAMMAR_MAX_DEPTH * sizeof *ws->saved);
    ws->stamp = 0;
    if (!ws->slot_stamp || !ws->slot_index || !ws->saved) return bubo_set_err(err, BUBO_ERR_NOMEM, "grammar: out of memory");
    return BUBO_OK;
}

void bubo_grammar_matcher_free(bubo_grammar_matcher *m) {
    if (!m) return;
    set_free(&m->state);
    set_free(&m->tmp[0]);
    set_free(&m->tmp[1]);
    for (uint32_t i = 0; i < m->n_levels; i++) set_free(&m->levels[i]);
    free(m->levels);
    free(m->level_set);
    free(m->level_id);
    cache_free(&m->cache);
    set_free(&m->ws.work);
    free(m->ws.slot_stamp);
    free(m->ws.slot_index);
    free(m->ws.saved);
    free(m);
}

static bubo_status matcher_alloc(const bubo_grammar *g, const bubo_grammar_vocab *vocab,
                                 bubo_grammar_matcher **out, bubo_err *err) {
    bubo_grammar_matcher *m = calloc(1, sizeof *m);
    if (!m) return bubo_set_err(err, BUBO_ERR_NOMEM, "grammar: out of memory");
    m->g = g;
    m->vocab = vocab;
    bubo_status st = ws_init(&m->ws, err);
    if (st != BUBO_OK) {
        bubo_grammar_matcher_free(m);
        return st;
    }
    *out = m;
    return BUBO_OK;
}

bubo_status bubo_grammar_matcher_create(const bubo_grammar *g, const bubo_grammar_vocab *vocab,
                                        bubo_grammar_matcher **out, bubo_err *err) {
    *out = NULL;
    if (!g) return bubo_set_err(err, BUBO_ERR_INVALID, "grammar matcher: NULL grammar");
    bubo_grammar_matcher *m = NULL;
    bubo_status st = matcher_alloc(g, vocab, &m, err);
    if (st != BUBO_OK) return st;
    /* the start state: the root rule's alternatives, expanded */
    stackset *w = &m->ws.work;
    set_clear(w);
    uint32_t pos = g->rule_start[g->root];
    ws_begin(&m->ws);
    while (st == BUBO_OK) {
        if (!ge_is_end_of_alt(g->elems[pos].type)) st = set_push(w, NULL, 0, &pos, 1, err);
        else st = set_push(w, NULL, 0, NULL, 0, err);
        while (!ge_is_end_of_alt(g->elems[pos].type)) pos++;
        if (g->elems[pos].type == GE_END) break;
        pos++;
    }
    if (st == BUBO_OK) st = expand(g, &m->ws, &m->state, err);
    if (st != BUBO_OK) {
        bubo_grammar_matcher_free(m);
        return st;
    }
    *out = m;
    return BUBO_OK;
}

bubo_status bubo_grammar_matcher_clone(const bubo_grammar_matcher *src, bubo_grammar_matcher **out,
                                       bubo_err *err) {
    *out = NULL;
    bubo_grammar_matcher *m = NULL;
    bubo_status st = matcher_alloc(src->g, src->vocab, &m, err);
    if (st != BUBO_OK) return st;
    if ((st = set_copy(&m->state, &src->state, err)) != BUBO_OK) {
        bubo_grammar_matcher_free(m);
        return st;
    }
    *out = m;
    return BUBO_OK;
}

bool bubo_grammar_matcher_accepting(const bubo_grammar_matcher *m) {
    if (m->state.utf8_left) return false;
    for (size_t i = 0; i < m->state.n; i++)
        if (m->state.len[i] == 0) return true;
    return false;
}

size_t bubo_grammar_matcher_n_stacks(const bubo_grammar_matcher *m) { return m->state.n; }

bubo_status bubo_grammar_matcher_accept_bytes(bubo_grammar_matcher *m, const uint8_t *bytes, size_t n,
                                              bool *accepted, bubo_err *err) {
    *accepted = false;
    const stackset *src = &m->state;
    int which = 0;
    for (size_t i = 0; i < n; i++) {
        stackset *dst = &m->tmp[which];
        bubo_status st = advance_byte(m->g, &m->ws, src, bytes[i], dst, err);
        if (st != BUBO_OK) return st;
        if (dst->n == 0) return BUBO_OK;
        src = dst;
        which ^= 1;
    }
    if (n > 0) set_swap(&m->state, &m->tmp[which ^ 1]);
    *accepted = true;
    return BUBO_OK;
}

bubo_status bubo_grammar_matcher_accept_token(bubo_grammar_matcher *m, int32_t token, bool *accepted,
                                              bubo_err *err) {
    *accepted = false;
    if (!m->vocab) return bubo_set_err(err, BUBO_ERR_INVALID, "grammar matcher: no vocabulary");
    if (token < 0 || (uint32_t)token >= m->vocab->n_vocab)
        return bubo_set_err(err, BUBO_ERR_INVALID, "grammar matcher: token %d outside 0..%u", token,
                            m->vocab->n_vocab - 1);
    uint64_t a = m->vocab->offsets[token], b = m->vocab->offsets[token + 1];
    if (a == b) return BUBO_OK;
    return bubo_grammar_matcher_accept_bytes(m, (const uint8_t *)m->vocab->pieces + a, (size_t)(b - a), accepted, err);
}

bubo_status bubo_grammar_matcher_mask(bubo_grammar_matcher *m, uint8_t *mask, bubo_err *err) {
    const bubo_grammar_vocab *v = m->vocab;
    if (!v) return bubo_set_err(err, BUBO_ERR_INVALID, "grammar matcher: no vocabulary");
    memset(mask, 0, v->n_vocab);
    uint32_t n_levels = v->max_len + 1;
    if (m->n_levels < n_levels) {
        stackset *l = realloc(m->levels, n_levels * sizeof *l);
        if (l) {
            memset(l + m->n_levels, 0, (n_levels - m->n_levels) * sizeof *l);
            m->levels = l;
            m->n_levels = n_levels;
        }
        const stackset **ls = realloc(m->level_set, n_levels * sizeof *ls);
        if (ls) m->level_set = ls;
        int32_t *li = realloc(m->level_id, n_levels * sizeof *li);
        if (li) m->level_id = li;
        if (!l || !ls || !li) return bubo_set_err(err, BUBO_ERR_NOMEM, "grammar: out of memory");
    }
    dfa_cache *c = &m->cache;
    if (c->n_states > DFA_MAX_STATES / 2 || c->n_frames > DFA_MAX_FRAMES / 2)
        cache_flush(c); /* room for this walk's new states */
    bubo_status st;
    /* level d: the set after the first d bytes of the current node's path */
    if ((st = cache_intern(c, &m->state, &m->level_id[0], err)) != BUBO_OK) return st;
    m->level_set[0] = m->level_id[0] != NO_STATE ? &c->states[m->level_id[0]] : &m->state;
    const trie_node *nodes = v->nodes;
    uint32_t i = 0;
    while (i < v->n_nodes) {
        const trie_node *nd = &nodes[i];
        uint32_t d = nd->depth;
        int32_t pid = m->level_id[d - 1];
        int32_t cid = NO_STATE;
        if (pid != NO_STATE && !(v->subtree_flags[i] & SUBTREE_BAD_UTF8) &&
            nd->subtree_end - i >= LOOP_MIN_SUBTREE && c->states[pid].utf8_left == 0) {
            int high = v->subtree_flags[i] & SUBTREE_HIGH;
            if (!(c->loop_known[pid] & LOOP_ASCII_KNOWN) &&
                (st = cache_loops_ascii(m->g, &m->ws, c, pid, &m->levels[d], err)) != BUBO_OK)
                return st;
            const uint64_t *loop = c->loop_ascii[pid], *bytes = v->subtree_ascii[i];
            int fits = !(bytes[0] & ~loop[0]) && !(bytes[1] & ~loop[1]);
            if (fits && high && !(c->loop_known[pid] & LOOP_UTF8_KNOWN) &&
                (st = cache_loops_utf8(m->g, &m->ws, c, pid, &m->levels[d], err)) != BUBO_OK)
                return st;
            if (fits && (!high || c->loop_utf8[pid])) {
                /* every path below stays in this state: all of the subtree's tokens fit */
                for (uint32_t k = nd->tok_begin, e = trie_subtree_tok_end(v, i); k < e; k++) mask[v->sorted_ids[k]] = 1;
                i = nd->subtree_end;
                continue;
            }
        }
        if (pid != NO_STATE) {
            int32_t t = c->trans[(size_t)pid * 256 + nd->byte];
            if (t == TRANS_DEAD) {
                i = nd->subtree_end;
                continue;
            }
            cid = t; /* TRANS_UNKNOWN == NO_STATE: computed below */
        }
        if (cid == NO_STATE) {
            stackset *here = &m->levels[d];
            if ((st = advance_byte(m->g, &m->ws, m->level_set[d - 1], nd->byte, here, err)) != BUBO_OK) return st;
            if (here->n == 0) {
                if (pid != NO_STATE) c->trans[(size_t)pid * 256 + nd->byte] = TRANS_DEAD;
                i = nd->subtree_end;
                continue;
            }
            if ((st = cache_intern(c, here, &cid, err)) != BUBO_OK) return st;
            if (pid != NO_STATE && cid != NO_STATE) c->trans[(size_t)pid * 256 + nd->byte] = cid;
            m->level_set[d] = cid != NO_STATE ? &c->states[cid] : here;
        } else {
            m->level_set[d] = &c->states[cid];
        }
        m->level_id[d] = cid;
        for (uint32_t k = nd->tok_begin; k < nd->tok_end; k++) mask[v->sorted_ids[k]] = 1;
        i++;
    }
    return BUBO_OK;
}

// ---------------------------------------------------------------------------------------------
// shortest completions
//
// The fewest bytes that finish a rule are a fixpoint over the rules (a sentence of a rule is as
// short as its shortest alternative, an alternative the sum of its elements), computed once per
// grammar by a Dijkstra-like search over the alternatives (grammar_build_shortest). Ties are
// broken by derivation height, so the alternative chosen for a rule only references rules of
// smaller height: following the choices from any position writes a finite text. A stack's
// fewest bytes are then the sum of its frames' tails; the matcher's, the least over its stacks.

static inline int in_surrogates(uint32_t cp) { return cp >= 0xD800 && cp <= 0xDFFF; }

/* The smallest character in [lo, hi] the class at pos accepts, or GRAMMAR_NO_END. */
static uint32_t class_smallest(const bubo_grammar *g, uint32_t pos, uint32_t lo, uint32_t hi) {
    const gelem *e = g->elems;
    if (hi > 0x10FFFF) hi = 0x10FFFF;
    uint32_t best = GRAMMAR_NO_END;
    if (e[pos].type == GE_CHAR_ANY) {
        best = in_surrogates(lo) ? 0xE000 : lo;
    } else if (e[pos].type == GE_CHAR_NOT) {
        uint32_t cur = lo; /* climb past every listed range (and the surrogates) that holds cur */
        for (int moved = 1; moved && cur <= hi;) {
            moved = 0;
            uint32_t q = pos;
            do {
                uint32_t a, b;
                q = next_range(e, q, &a, &b);
                if (a <= cur && cur <= b) {
                    cur = b + 1;
                    moved = 1;
                }
            } while (e[q].type == GE_CHAR_ALT);
            if (!moved && in_surrogates(cur)) {
                cur = 0xE000;
                moved = 1;
            }
        }
        best = cur;
    } else {
        uint32_t q = pos;
        do {
            uint32_t a, b;
            q = next_range(e, q, &a, &b);
            if (a < lo) a = lo;
            if (b > hi) b = hi;
            if (in_surrogates(a)) a = 0xE000;
            if (a <= b && a < best) best = a;
        } while (e[q].type == GE_CHAR_ALT);
    }
    return best <= hi ? best : GRAMMAR_NO_END;
}

/* The character a shortest completion writes for the class at pos: a readable one where the
 * class allows it (a letter, a digit, printable ASCII), else the smallest. */
static uint32_t term_pick(const bubo_grammar *g, uint32_t pos) {
    static const uint8_t pref[][2] = {{'a', 'z'}, {'A', 'Z'}, {'0', '9'}, {0x20, 0x7E}, {0x00, 0x7F}};
    const uint64_t *bits = g->term_ascii[pos];
    for (size_t k = 0; k < sizeof pref / sizeof *pref; k++)
        for (uint32_t c = pref[k][0]; c <= pref[k][1]; c++)
            if ((bits[c >> 6] >> (c & 63)) & 1) return c;
    return class_smallest(g, pos, 0x80, 0x10FFFF);
}

static uint32_t utf8_len(uint32_t cp) { return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4; }

static uint32_t utf8_put(uint32_t cp, uint8_t *b) {
    if (cp < 0x80) {
        b[0] = (uint8_t)cp;
        return 1;
    }
    uint32_t n = utf8_len(cp);
    static const uint8_t lead[5] = {0, 0, 0xC0, 0xE0, 0xF0};
    for (uint32_t i = n - 1; i > 0; i--, cp >>= 6) b[i] = (uint8_t)(0x80 | (cp & 0x3F));
    b[0] = (uint8_t)(lead[n] | cp);
    return n;
}

static uint32_t add_len(uint64_t a, uint64_t b) {
    uint64_t s = a + b;
    return (a == GRAMMAR_NO_END || b == GRAMMAR_NO_END || s >= GRAMMAR_NO_END) ? GRAMMAR_NO_END : (uint32_t)s;
}

/* The fewest bytes of the element at pos (a terminal or a rule reference), given rule_min. */
static uint32_t elem_min(const bubo_grammar *g, const uint32_t *term_min, uint32_t pos) {
    return g->elems[pos].type == GE_RULE_REF ? g->rule_min[g->elems[pos].value] : term_min[pos];
}

static uint32_t elem_next(const bubo_grammar *g, uint32_t pos) {
    return g->elems[pos].type == GE_RULE_REF ? pos + 1 : g->term_next[pos];
}

/* The search below takes alternatives in the order of (fewest bytes, derivation height,
 * position): a binary heap of alternative ids over these keys. */
typedef struct {
    const uint32_t *len, *h, *pos; /* (n_alts) each */
} alt_keys;

static int alt_before(const alt_keys *k, uint32_t a, uint32_t b) {
    if (k->len[a] != k->len[b]) return k->len[a] < k->len[b];
    if (k->h[a] != k->h[b]) return k->h[a] < k->h[b];
    return k->pos[a] < k->pos[b];
}

static void heap_push(uint32_t *heap, uint32_t *n, const alt_keys *k, uint32_t a) {
    uint32_t i = (*n)++;
    for (; i > 0 && alt_before(k, a, heap[(i - 1) / 2]); i = (i - 1) / 2) heap[i] = heap[(i - 1) / 2];
    heap[i] = a;
}

static uint32_t heap_pop(uint32_t *heap, uint32_t *n, const alt_keys *k) {
    uint32_t top = heap[0], last = heap[--*n], i = 0;
    for (uint32_t c; (c = 2 * i + 1) < *n; i = c) {
        if (c + 1 < *n && alt_before(k, heap[c + 1], heap[c])) c++;
        if (!alt_before(k, heap[c], last)) break;
        heap[i] = heap[c];
    }
    heap[i] = last;
    return top;
}

/* Knuth's generalization of Dijkstra's algorithm to grammars: an alternative becomes a
 * candidate once every rule it references is settled (its length is then the sum of its
 * elements'), and the candidate with the least (length, height) settles its rule. A sum is never
 * less than its parts and the height of an alternative is one more than its references', so a
 * rule settles after every rule its chosen alternative references: the choices never recurse,
 * and the lengths are the least fixpoint. Each alternative enters the heap at most once:
 * O((alternatives + references) log alternatives), whatever the order of the rules (a worklist
 * that re-evaluated a rule whenever a reference got shorter took quadratic time on chains whose
 * lengths improve one step at a time). */
bubo_status grammar_build_shortest(bubo_grammar *g, bubo_err *err) {
    uint32_t nr = g->n_rules, ne = g->n_elems, na = 0;
    for (uint32_t p = 0; p < ne; p++) na += ge_is_end_of_alt(g->elems[p].type); /* one per alternative */
    bubo_status st = BUBO_OK;
    g->tail_min = malloc((size_t)(ne + 1) * sizeof *g->tail_min);
    g->rule_min = malloc((size_t)nr * sizeof *g->rule_min);
    g->rule_alt = malloc((size_t)nr * sizeof *g->rule_alt);
    uint32_t *height = malloc((size_t)nr * sizeof *height); /* GRAMMAR_NO_END: not settled */
    uint32_t *term_min = malloc((size_t)(ne + 1) * sizeof *term_min);
    uint32_t *occ_start = calloc((size_t)nr + 2, sizeof *occ_start); /* CSR: the alternatives referencing each rule */
    uint32_t *occ = NULL;
    size_t alt_bytes = (size_t)(na ? na : 1) * sizeof(uint32_t);
    uint32_t *alt_rule = malloc(alt_bytes), *alt_pos = malloc(alt_bytes), *alt_len = malloc(alt_bytes);
    uint32_t *alt_h = malloc(alt_bytes), *alt_need = malloc(alt_bytes), *heap = malloc(alt_bytes);
    if (!g->tail_min || !g->rule_min || !g->rule_alt || !height || !term_min || !occ_start || !alt_rule ||
        !alt_pos || !alt_len || !alt_h || !alt_need || !heap)
        goto oom;
    for (uint32_t p = 0; p < ne; p++) {
        uint32_t t = g->elems[p].type;
        if (ge_is_terminal(t)) {
            uint32_t cp = term_pick(g, p);
            term_min[p] = cp == GRAMMAR_NO_END ? GRAMMAR_NO_END : utf8_len(cp);
        } else if (t == GE_RULE_REF) {
            occ_start[g->elems[p].value + 2]++; /* shifted by one more: the fill below advances [q + 1] */
        }
    }
    for (uint32_t r = 0; r < nr; r++) occ_start[r + 2] += occ_start[r + 1];
    occ = malloc((size_t)(occ_start[nr + 1] ? occ_start[nr + 1] : 1) * sizeof *occ);
    if (!occ) goto oom;
    /* every alternative: its terminals' bytes now, its references still to settle */
    uint32_t a = 0;
    for (uint32_t r = 0; r < nr; r++) {
        g->rule_min[r] = GRAMMAR_NO_END;
        g->rule_alt[r] = g->rule_start[r];
        height[r] = GRAMMAR_NO_END;
        for (uint32_t p = g->rule_start[r];; p++) {
            if (a == na) goto bad_layout;
            alt_rule[a] = r;
            alt_pos[a] = p;
            alt_len[a] = 0;
            alt_h[a] = 1;
            alt_need[a] = 0;
            for (; p < ne && !ge_is_end_of_alt(g->elems[p].type); p = elem_next(g, p)) {
                if (g->elems[p].type == GE_RULE_REF) {
                    occ[occ_start[g->elems[p].value + 1]++] = a;
                    alt_need[a]++;
                } else {
                    alt_len[a] = add_len(alt_len[a], term_min[p]);
                }
            }
            if (p >= ne) goto bad_layout;
            a++;
            if (g->elems[p].type == GE_END) break;
        }
    }
    if (a != na) goto bad_layout;
    /* occ_start[q + 1] advanced to the end of q's references, which is where q + 1's start */
    alt_keys keys = {alt_len, alt_h, alt_pos};
    uint32_t n_heap = 0;
    for (a = 0; a < na; a++)
        if (alt_need[a] == 0 && alt_len[a] != GRAMMAR_NO_END) heap_push(heap, &n_heap, &keys, a);
    while (n_heap) {
        a = heap_pop(heap, &n_heap, &keys);
        uint32_t r = alt_rule[a];
        if (height[r] != GRAMMAR_NO_END) continue; /* settled by an earlier candidate */
        g->rule_min[r] = alt_len[a];
        g->rule_alt[r] = alt_pos[a];
        height[r] = alt_h[a];
        for (uint32_t k = occ_start[r]; k < occ_start[r + 1]; k++) {
            uint32_t b = occ[k];
            if (height[alt_rule[b]] != GRAMMAR_NO_END) continue; /* its rule is settled already */
            alt_len[b] = add_len(alt_len[b], alt_len[a]);
            if (alt_h[b] < height[r] + 1) alt_h[b] = height[r] + 1;
            if (--alt_need[b] == 0 && alt_len[b] != GRAMMAR_NO_END) heap_push(heap, &n_heap, &keys, b);
        }
    }
    /* every alternative's tails, from its end backwards (an end-of-alt position's tail is 0) */
    for (uint32_t p = 0; p < ne; p++)
        if (ge_is_end_of_alt(g->elems[p].type)) g->tail_min[p] = 0;
    for (uint32_t p = ne; p-- > 0;) {
        uint32_t t = g->elems[p].type;
        if (ge_is_terminal(t) || t == GE_RULE_REF) g->tail_min[p] = add_len(elem_min(g, term_min, p), g->tail_min[elem_next(g, p)]);
    }
    goto done;
bad_layout:
    st = bubo_set_err(err, BUBO_ERR_INVALID, "grammar: a rule does not end where the next starts");
    goto done;
oom:
    st = bubo_set_err(err, BUBO_ERR_NOMEM, "grammar: out of memory");
done:
    free(height);
    free(term_min);
    free(occ_start);
    free(occ);
    free(alt_rule);
    free(alt_pos);
    free(alt_len);
    free(alt_h);
    free(alt_need);
    free(heap);
    return st;
}

/* The character that completes the unfinished one of s on the class at top (its smallest), or
 * GRAMMAR_NO_END. */
static uint32_t partial_pick(const bubo_grammar *g, const stackset *s, uint32_t top) {
    uint32_t left = s->utf8_left;
    uint32_t lo = s->utf8_value << (6 * left), hi = lo | ((1u << (6 * left)) - 1);
    if (lo < s->utf8_min) lo = s->utf8_min;
    return lo <= hi ? class_smallest(g, top, lo, hi) : GRAMMAR_NO_END;
}

/* The fewest bytes that finish stack i of s. */
static uint32_t stack_min(const bubo_grammar *g, const stackset *s, size_t i) {
    uint32_t n = s->len[i];
    const uint32_t *f = s->frames + s->off[i];
    if (n == 0) return s->utf8_left ? GRAMMAR_NO_END : 0;
    uint32_t top = f[n - 1], sum;
    if (s->utf8_left) {
        if (!s->utf8_any && partial_pick(g, s, top) == GRAMMAR_NO_END) return GRAMMAR_NO_END;
        sum = add_len(s->utf8_left, g->tail_min[g->term_next[top]]);
    } else {
        sum = g->tail_min[top];
    }
    for (uint32_t k = 0; k + 1 < n; k++) sum = add_len(sum, g->tail_min[f[k]]);
    return sum;
}

static size_t best_stack(const bubo_grammar *g, const stackset *s, uint32_t *len) {
    size_t best = SIZE_MAX;
    *len = GRAMMAR_NO_END;
    for (size_t i = 0; i < s->n; i++) {
        uint32_t m = stack_min(g, s, i);
        if (m < *len) {
            *len = m;
            best = i;
        }
    }
    return best;
}

size_t bubo_grammar_matcher_shortest_len(const bubo_grammar_matcher *m) {
    uint32_t len;
    best_stack(m->g, &m->state, &len);
    return len == GRAMMAR_NO_END ? SIZE_MAX : len;
}

bubo_status bubo_grammar_matcher_shortest(const bubo_grammar_matcher *m, uint8_t *out, size_t cap, size_t *n,
                                          bubo_err *err) {
    const bubo_grammar *g = m->g;
    const stackset *s = &m->state;
    uint32_t len;
    size_t i = best_stack(g, s, &len);
    *n = SIZE_MAX;
    if (len == GRAMMAR_NO_END) return BUBO_OK;
    if (cap < len) return bubo_set_err(err, BUBO_ERR_INVALID, "grammar: %zu bytes given for a completion of %u", cap, len);
    *n = len;
    uint32_t depth = s->len[i];
    if (depth == 0) return BUBO_OK;
    const uint32_t *f = s->frames + s->off[i];
    size_t cap_todo = depth + 64, n_todo = 0, w = 0;
    uint32_t *todo = malloc(cap_todo * sizeof *todo);
    if (!todo) return bubo_set_err(err, BUBO_ERR_NOMEM, "grammar: out of memory");
    for (uint32_t k = 0; k + 1 < depth; k++) todo[n_todo++] = f[k];
    uint32_t top = f[depth - 1], pos = top;
    uint8_t b[4];
    if (s->utf8_left) { /* finish the unfinished character first */
        if (s->utf8_any) {
            memset(b, 0x80, sizeof b); /* every continuation is accepted */
        } else {
            uint32_t k = utf8_put(partial_pick(g, s, top), b);
            memmove(b, b + k - s->utf8_left, s->utf8_left);
        }
        memcpy(out, b, s->utf8_left);
        w = s->utf8_left;
        pos = g->term_next[top];
    }
    bubo_status st = BUBO_OK;
    for (;;) {
        while (!ge_is_end_of_alt(g->elems[pos].type)) {
            if (g->elems[pos].type == GE_RULE_REF) {
                if (n_todo == cap_todo) {
                    uint32_t *t = realloc(todo, 2 * cap_todo * sizeof *t);
                    if (!t) {
                        st = bubo_set_err(err, BUBO_ERR_NOMEM, "grammar: out of memory");
                        goto done;
                    }
                    todo = t;
                    cap_todo *= 2;
                }
                todo[n_todo++] = pos + 1;
                pos = g->rule_alt[g->elems[pos].value];
            } else {
                uint32_t k = utf8_put(term_pick(g, pos), b);
                if (w + k > len) {
                    st = bubo_set_err(err, BUBO_ERR_INVALID, "grammar: the shortest completion outgrew its length");
                    goto done;
                }
                memcpy(out + w, b, k);
                w += k;
                pos = g->term_next[pos];
            }
        }
        if (n_todo == 0) break;
        pos = todo[--n_todo];
    }
    if (w != len) st = bubo_set_err(err, BUBO_ERR_INVALID, "grammar: the shortest completion has %zu bytes, not %u", w, len);
done:
    free(todo);
    return st;
}
