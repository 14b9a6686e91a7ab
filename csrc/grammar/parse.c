/* GBNF parser: llama.cpp's grammar-parser syntax into the flat element array of grammar_internal.h.
 *
 * Recursive descent, one function per production as in llama.cpp (parse_space, parse_name,
 * parse_char, parse_sequence, parse_alternates, parse_rule). Recursion is bounded by the
 * parenthesis nesting (BUBO_GRAMMAR_MAX_NESTING); every other walk is iterative, so no input
 * can overflow the C stack. Every error names "line L col C" of the offending byte. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar_internal.h"

// ---------------------------------------------------------------------------------------------
// growable arrays

typedef struct {
    gelem *v;
    uint32_t n, cap;
} elemvec;

typedef struct {
    char *name;          /* NUL-terminated; generated rules are "base_N" like llama.cpp's */
    elemvec body;        /* the rule's elements (with GE_ALT and the closing GE_END) */
    int defined;
    const char *first_ref; /* where it was first referenced (for "undefined rule") */
} rule;

typedef struct {
    const char *src, *end;
    bubo_err *err;
    bubo_status status;
    rule *rules;
    uint32_t n_rules, cap_rules;
    uint32_t *map;       /* open addressing over user rule names: rule id + 1, 0 = empty */
    uint32_t map_cap;
    uint32_t n_named;
    uint64_t n_elems;    /* all rules together, bounded by BUBO_GRAMMAR_MAX_ELEMENTS */
    int depth;
} parser;

static void where(const parser *P, const char *at, int *line, int *col) {
    *line = 1;
    *col = 1;
    for (const char *p = P->src; p < at && p < P->end; p++) {
        if (*p == '\n') {
            (*line)++;
            *col = 1;
        } else if (((unsigned char)*p & 0xC0) != 0x80) {
            (*col)++; /* columns count characters, not UTF-8 bytes */
        }
    }
}

/* Record the first error (later ones are consequences) and return NULL to unwind. */
static const char *fail(parser *P, const char *at, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
static const char *fail(parser *P, const char *at, const char *fmt, ...) {
    if (P->status != BUBO_OK) return NULL;
    char what[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    int line, col;
    where(P, at, &line, &col);
    P->status = bubo_set_err(P->err, BUBO_ERR_INVALID, "grammar: line %d col %d: %s", line, col, what);
    return NULL;
}

static const char *nomem(parser *P) {
    if (P->status == BUBO_OK) P->status = bubo_set_err(P->err, BUBO_ERR_NOMEM, "grammar: out of memory");
    return NULL;
}

static int push(parser *P, elemvec *v, uint32_t type, uint32_t value, const char *at) {
    if (P->n_elems >= BUBO_GRAMMAR_MAX_ELEMENTS) {
        fail(P, at, "grammar too large: more than %u elements after expanding repetitions",
             BUBO_GRAMMAR_MAX_ELEMENTS);
        return 0;
    }
    if (v->n == v->cap) {
        uint32_t cap = v->cap ? v->cap * 2 : 8;
        gelem *nv = realloc(v->v, cap * sizeof *nv);
        if (!nv) {
            nomem(P);
            return 0;
        }
        v->v = nv;
        v->cap = cap;
    }
    v->v[v->n++] = (gelem){type, value};
    P->n_elems++;
    return 1;
}

// ---------------------------------------------------------------------------------------------
// symbols

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

/* A new rule (no name in the map); returns its id or UINT32_MAX. */
static uint32_t new_rule(parser *P, const char *name, size_t len) {
    if (P->n_rules == P->cap_rules) {
        uint32_t cap = P->cap_rules ? P->cap_rules * 2 : 16;
        rule *nr = realloc(P->rules, cap * sizeof *nr);
        if (!nr) return nomem(P), UINT32_MAX;
        P->rules = nr;
        P->cap_rules = cap;
    }
    rule *r = &P->rules[P->n_rules];
    memset(r, 0, sizeof *r);
    r->name = malloc(len + 1);
    if (!r->name) return nomem(P), UINT32_MAX;
    memcpy(r->name, name, len);
    r->name[len] = 0;
    return P->n_rules++;
}

/* A generated rule for a group or repetition inside rule `base`, named like llama.cpp's. */
static uint32_t generate_rule(parser *P, uint32_t base) {
    char name[96];
    int n = snprintf(name, sizeof name, "%.60s_%u", P->rules[base].name, P->n_rules);
    return new_rule(P, name, (size_t)n < sizeof name ? (size_t)n : sizeof name - 1);
}

static uint32_t symbol_id(parser *P, const char *name, size_t len) {
    if (2 * (P->n_named + 1) > P->map_cap) {
        uint32_t cap = P->map_cap ? P->map_cap * 2 : 64;
        uint32_t *nm = calloc(cap, sizeof *nm);
        if (!nm) return nomem(P), UINT32_MAX;
        for (uint32_t i = 0; i < P->map_cap; i++) {
            uint32_t id = P->map[i];
            if (!id) continue;
            const char *s = P->rules[id - 1].name;
            uint32_t h = (uint32_t)hash_bytes(s, strlen(s)) & (cap - 1);
            while (nm[h]) h = (h + 1) & (cap - 1);
            nm[h] = id;
        }
        free(P->map);
        P->map = nm;
        P->map_cap = cap;
    }
    uint32_t h = (uint32_t)hash_bytes(name, len) & (P->map_cap - 1);
    for (; P->map[h]; h = (h + 1) & (P->map_cap - 1)) {
        const char *s = P->rules[P->map[h] - 1].name;
        if (strlen(s) == len && memcmp(s, name, len) == 0) return P->map[h] - 1;
    }
    uint32_t id = new_rule(P, name, len);
    if (id == UINT32_MAX) return id;
    P->map[h] = id + 1;
    P->n_named++;
    return id;
}

// ---------------------------------------------------------------------------------------------
// lexical pieces

static int is_word_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
}

static const char *parse_space(parser *P, const char *p, int newline_ok) {
    while (p < P->end) {
        char c = *p;
        if (c == ' ' || c == '\t') {
            p++;
        } else if (c == '#') {
            while (p < P->end && *p != '\n' && *p != '\r') p++;
        } else if (newline_ok && (c == '\n' || c == '\r')) {
            p++;
        } else {
            break;
        }
    }
    return p;
}

static const char *parse_name(parser *P, const char *p) {
    const char *q = p;
    while (q < P->end && is_word_char(*q)) q++;
    if (q == p) return fail(P, p, "expected a rule name");
    return q;
}

static const char *parse_hex(parser *P, const char *p, int n, uint32_t *cp) {
    uint32_t v = 0;
    for (int i = 0; i < n; i++, p++) {
        if (p >= P->end) return fail(P, p, "expected %d hex digits, input ended", n);
        char c = *p;
        uint32_t d;
        if (c >= '0' && c <= '9') d = (uint32_t)(c - '0');
        else if (c >= 'a' && c <= 'f') d = (uint32_t)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') d = (uint32_t)(c - 'A' + 10);
        else return fail(P, p, "expected %d hex digits in escape", n);
        v = v << 4 | d;
    }
    if (v > 0x10FFFF) return fail(P, p - n, "code point U+%X is beyond U+10FFFF", v);
    *cp = v;
    return p;
}

/* One character of a literal or class: an escape or one UTF-8 encoded code point. */
static const char *parse_char(parser *P, const char *p, uint32_t *cp) {
    if (p >= P->end) return fail(P, p, "unexpected end of input");
    if (*p == '\\') {
        if (p + 1 >= P->end) return fail(P, p, "unexpected end of input after '\\'");
        switch (p[1]) {
        case 'x': return parse_hex(P, p + 2, 2, cp);
        case 'u': return parse_hex(P, p + 2, 4, cp);
        case 'U': return parse_hex(P, p + 2, 8, cp);
        case 't': *cp = '\t'; return p + 2;
        case 'r': *cp = '\r'; return p + 2;
        case 'n': *cp = '\n'; return p + 2;
        case '\\': case '"': case '[': case ']':
            *cp = (unsigned char)p[1];
            return p + 2;
        default:
            return fail(P, p, "unknown escape '\\%c'", p[1]);
        }
    }
    const unsigned char *s = (const unsigned char *)p;
    unsigned char c = s[0];
    int n;
    uint32_t v, min;
    if (c < 0x80) { n = 1; v = c; min = 0; }
    else if ((c & 0xE0) == 0xC0) { n = 2; v = c & 0x1F; min = 0x80; }
    else if ((c & 0xF0) == 0xE0) { n = 3; v = c & 0x0F; min = 0x800; }
    else if ((c & 0xF8) == 0xF0) { n = 4; v = c & 0x07; min = 0x10000; }
    else return fail(P, p, "invalid UTF-8 byte 0x%02X", c);
    if (P->end - p < n) return fail(P, p, "truncated UTF-8 sequence");
    for (int i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80) return fail(P, p, "invalid UTF-8 sequence");
        v = v << 6 | (s[i] & 0x3F);
    }
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return fail(P, p, "invalid UTF-8 sequence");
    *cp = v;
    return p + n;
}

static const char *parse_int(parser *P, const char *p, uint32_t *out) {
    const char *q = p;
    uint64_t v = 0;
    while (q < P->end && *q >= '0' && *q <= '9') {
        v = v * 10 + (uint64_t)(*q - '0');
        if (v > BUBO_GRAMMAR_MAX_REPEAT)
            return fail(P, p, "repetition count exceeds %u", BUBO_GRAMMAR_MAX_REPEAT);
        q++;
    }
    if (q == p) return fail(P, p, "expected an integer");
    *out = (uint32_t)v;
    return q;
}

// ---------------------------------------------------------------------------------------------
// productions

static const char *parse_alternates(parser *P, const char *p, uint32_t rule_id, int nested);

/* Rewrite the last symbol of `out` (from `sym_start`) as min..max repetitions (max UINT32_MAX:
 * unbounded). The symbol becomes one rule reference first, so that x{m,n} costs m + 1 references
 * and n - m small rules however large x is (llama.cpp copies x instead). */
static int repeat(parser *P, uint32_t rule_id, elemvec *out, uint32_t sym_start, uint32_t min, uint32_t max,
                  const char *at) {
    if (sym_start == out->n) {
        fail(P, at, "expected an item before a repetition operator");
        return 0;
    }
    gelem sym = out->v[sym_start];
    if (!(out->n - sym_start == 1 && sym.type == GE_RULE_REF)) {
        uint32_t id = generate_rule(P, rule_id);
        if (id == UINT32_MAX) return 0;
        rule *r = &P->rules[id];
        r->defined = 1;
        for (uint32_t i = sym_start; i < out->n; i++)
            if (!push(P, &r->body, out->v[i].type, out->v[i].value, at)) return 0;
        if (!push(P, &r->body, GE_END, 0, at)) return 0;
        sym = (gelem){GE_RULE_REF, id};
    }
    P->n_elems -= out->n - sym_start;
    out->n = sym_start;
    for (uint32_t i = 0; i < min; i++)
        if (!push(P, out, GE_RULE_REF, sym.value, at)) return 0;
    if (max == UINT32_MAX) {
        /* rec ::= sym rec | (empty) */
        uint32_t rec = generate_rule(P, rule_id);
        if (rec == UINT32_MAX) return 0;
        elemvec *b = &P->rules[rec].body;
        P->rules[rec].defined = 1;
        if (!push(P, b, GE_RULE_REF, sym.value, at) || !push(P, b, GE_RULE_REF, rec, at) ||
            !push(P, b, GE_ALT, 0, at) || !push(P, b, GE_END, 0, at) || !push(P, out, GE_RULE_REF, rec, at))
            return 0;
    } else if (max > min) {
        /* opt_i ::= sym opt_{i+1} | (empty), the last one without opt_{i+1}: nested optionals. */
        uint32_t next = UINT32_MAX;
        for (uint32_t i = 0; i < max - min; i++) {
            uint32_t opt = generate_rule(P, rule_id);
            if (opt == UINT32_MAX) return 0;
            elemvec *b = &P->rules[opt].body;
            P->rules[opt].defined = 1;
            if (!push(P, b, GE_RULE_REF, sym.value, at)) return 0;
            if (next != UINT32_MAX && !push(P, b, GE_RULE_REF, next, at)) return 0;
            if (!push(P, b, GE_ALT, 0, at) || !push(P, b, GE_END, 0, at)) return 0;
            next = opt;
        }
        if (!push(P, out, GE_RULE_REF, next, at)) return 0;
    }
    return 1;
}

static const char *parse_sequence(parser *P, const char *p, uint32_t rule_id, elemvec *out, int nested) {
    uint32_t sym_start = out->n;
    while (p && p < P->end) {
        const char *at = p;
        char c = *p;
        if (c == '"') {
            p++;
            sym_start = out->n;
            while (1) {
                if (p >= P->end) return fail(P, at, "unterminated string literal");
                if (*p == '"') break;
                uint32_t cp;
                if (!(p = parse_char(P, p, &cp))) return NULL;
                if (!push(P, out, GE_CHAR, cp, at)) return NULL;
            }
            p = parse_space(P, p + 1, nested);
        } else if (c == '[') {
            p++;
            uint32_t start_type = GE_CHAR;
            if (p < P->end && *p == '^') {
                p++;
                start_type = GE_CHAR_NOT;
            }
            sym_start = out->n;
            while (1) {
                if (p >= P->end) return fail(P, at, "unterminated character class");
                if (*p == ']') break;
                uint32_t lo, hi;
                const char *char_at = p;
                if (!(p = parse_char(P, p, &lo))) return NULL;
                if (!push(P, out, sym_start < out->n ? GE_CHAR_ALT : start_type, lo, at)) return NULL;
                if (p + 1 < P->end && p[0] == '-' && p[1] != ']') {
                    if (!(p = parse_char(P, p + 1, &hi))) return NULL;
                    if (hi < lo) return fail(P, char_at, "character range is backwards (U+%X > U+%X)", lo, hi);
                    if (!push(P, out, GE_CHAR_RNG_UPPER, hi, at)) return NULL;
                }
            }
            if (sym_start == out->n) return fail(P, at, "empty character class");
            p = parse_space(P, p + 1, nested);
        } else if (is_word_char(c)) {
            const char *name_end = parse_name(P, p);
            if (!name_end) return NULL;
            uint32_t id = symbol_id(P, p, (size_t)(name_end - p));
            if (id == UINT32_MAX) return NULL;
            if (!P->rules[id].first_ref) P->rules[id].first_ref = p;
            sym_start = out->n;
            if (!push(P, out, GE_RULE_REF, id, at)) return NULL;
            p = parse_space(P, name_end, nested);
        } else if (c == '(') {
            p = parse_space(P, p + 1, 1);
            uint32_t sub = generate_rule(P, rule_id);
            if (sub == UINT32_MAX) return NULL;
            P->rules[sub].defined = 1;
            if (!(p = parse_alternates(P, p, sub, 1))) return NULL;
            sym_start = out->n;
            if (!push(P, out, GE_RULE_REF, sub, at)) return NULL;
            if (p >= P->end || *p != ')') return fail(P, p, "expected ')' to close the group");
            p = parse_space(P, p + 1, nested);
        } else if (c == '.') {
            sym_start = out->n;
            if (!push(P, out, GE_CHAR_ANY, 0, at)) return NULL;
            p = parse_space(P, p + 1, nested);
        } else if (c == '*' || c == '+' || c == '?') {
            uint32_t min = c == '+' ? 1 : 0, max = c == '?' ? 1 : UINT32_MAX;
            if (!repeat(P, rule_id, out, sym_start, min, max, at)) return NULL;
            sym_start = out->n; /* "a**" has nothing left to repeat, as in llama.cpp */
            p = parse_space(P, p + 1, nested);
        } else if (c == '{') {
            uint32_t min, max;
            p = parse_space(P, p + 1, nested);
            if (!(p = parse_int(P, p, &min))) return NULL;
            p = parse_space(P, p, nested);
            if (p < P->end && *p == '}') {
                max = min;
            } else if (p < P->end && *p == ',') {
                p = parse_space(P, p + 1, nested);
                if (p < P->end && *p >= '0' && *p <= '9') {
                    const char *max_at = p;
                    if (!(p = parse_int(P, p, &max))) return NULL;
                    if (max < min) return fail(P, max_at, "repetition {%u,%u}: max is below min", min, max);
                    p = parse_space(P, p, nested);
                } else {
                    max = UINT32_MAX;
                }
                if (p >= P->end || *p != '}') return fail(P, p, "expected '}' to close the repetition");
            } else {
                return fail(P, p, "expected ',' or '}' in the repetition");
            }
            if (!repeat(P, rule_id, out, sym_start, min, max, at)) return NULL;
            sym_start = out->n;
            p = parse_space(P, p + 1, nested);
        } else {
            break;
        }
    }
    return p;
}

static const char *parse_alternates(parser *P, const char *p, uint32_t rule_id, int nested) {
    if (++P->depth > BUBO_GRAMMAR_MAX_NESTING)
        return fail(P, p, "groups nested deeper than %d", BUBO_GRAMMAR_MAX_NESTING);
    elemvec body = {0};
    p = parse_sequence(P, p, rule_id, &body, nested);
    while (p && p < P->end && *p == '|') {
        if (!push(P, &body, GE_ALT, 0, p)) {
            p = NULL;
            break;
        }
        p = parse_space(P, p + 1, 1);
        p = parse_sequence(P, p, rule_id, &body, nested);
    }
    if (p && !push(P, &body, GE_END, 0, p)) p = NULL;
    P->depth--;
    /* rules may have moved (realloc) while parsing nested groups: index, do not hold pointers */
    free(P->rules[rule_id].body.v);
    P->rules[rule_id].body = body;
    return p;
}

static const char *parse_rule(parser *P, const char *p) {
    const char *name_end = parse_name(P, p);
    if (!name_end) return NULL;
    uint32_t id = symbol_id(P, p, (size_t)(name_end - p));
    if (id == UINT32_MAX) return NULL;
    if (P->rules[id].defined) return fail(P, p, "rule '%s' is defined twice", P->rules[id].name);
    P->rules[id].defined = 1;
    const char *q = parse_space(P, name_end, 0);
    if (P->end - q < 3 || memcmp(q, "::=", 3) != 0) return fail(P, q, "expected '::=' after rule name");
    q = parse_space(P, q + 3, 1);
    if (!(q = parse_alternates(P, q, id, 0))) return NULL;
    if (q < P->end && *q == '\r') q += (q + 1 < P->end && q[1] == '\n') ? 2 : 1;
    else if (q < P->end && *q == '\n') q++;
    else if (q < P->end) {
        int n = 1; /* quote the whole character, not one byte of it */
        while (q + n < P->end && n < 4 && ((unsigned char)q[n] & 0xC0) == 0x80) n++;
        return fail(P, q, "expected newline or end of input, got '%.*s'", n, q);
    }
    return parse_space(P, q, 1);
}

// ---------------------------------------------------------------------------------------------
// checks and flattening

/* Left recursion (a rule reaching itself through a nullable prefix) would make the matcher's
 * expansion loop forever; refuse it here. One iterative depth-first walk computes which rules
 * match the empty string and finds the cycle: it follows a reference only while everything
 * before it in the alternative is nullable, so a rule met again while still open is exactly
 * left recursion. */
static bubo_status check_left_recursion(parser *P, const bubo_grammar *g, uint8_t *nullable) {
    uint32_t n = g->n_rules;
    uint8_t *state = calloc(n, 1); /* 0 unvisited, 1 open, 2 done */
    uint32_t *fr_rule = malloc(n * sizeof *fr_rule), *fr_pos = malloc(n * sizeof *fr_pos);
    bubo_status st = BUBO_OK;
    if (!state || !fr_rule || !fr_pos) {
        st = bubo_set_err(P->err, BUBO_ERR_NOMEM, "grammar: out of memory");
        goto done;
    }
    for (uint32_t start = 0; start < n && st == BUBO_OK; start++) {
        if (state[start]) continue;
        uint32_t top = 0;
        fr_rule[0] = start;
        fr_pos[0] = g->rule_start[start];
        state[start] = 1;
        while (1) {
            uint32_t r = fr_rule[top], pos = fr_pos[top];
            gelem e = g->elems[pos];
            if (ge_is_end_of_alt(e.type)) {
                nullable[r] = 1; /* every element of this alternative was nullable */
                if (e.type == GE_ALT) {
                    fr_pos[top] = pos + 1;
                    continue;
                }
            } else if (e.type == GE_RULE_REF) {
                uint32_t s = e.value;
                if (state[s] == 1) {
                    st = bubo_set_err(P->err, BUBO_ERR_INVALID,
                                      "grammar: left recursion: rule '%s' can reach itself through '%s' "
                                      "without consuming a character",
                                      P->rules[s].name, P->rules[r].name);
                    goto done;
                }
                if (state[s] == 0) {
                    state[s] = 1;
                    top++;
                    fr_rule[top] = s;
                    fr_pos[top] = g->rule_start[s];
                    continue; /* come back to this reference when s is done */
                }
                if (nullable[s]) {
                    fr_pos[top] = pos + 1;
                    continue;
                }
                /* s consumes a character: skip to the next alternative */
            }
            if (e.type != GE_END) {
                while (!ge_is_end_of_alt(g->elems[pos].type)) pos++;
                if (g->elems[pos].type == GE_ALT) {
                    fr_pos[top] = pos + 1;
                    continue;
                }
            }
            state[r] = 2;
            if (top == 0) break;
            top--;
        }
    }
done:
    free(state);
    free(fr_rule);
    free(fr_pos);
    return st;
}

static void build_terminal_tables(bubo_grammar *g) {
    for (uint32_t pos = 0; pos < g->n_elems; pos++) {
        uint32_t type = g->elems[pos].type;
        if (!ge_is_terminal(type)) continue;
        int positive = type != GE_CHAR_NOT;
        uint64_t bits[2] = {0, 0};
        uint32_t q = pos;
        do {
            uint32_t lo = g->elems[q].value, hi = lo;
            if (g->elems[q].type == GE_CHAR_ANY) {
                lo = 0;
                hi = 0x10FFFF;
                q += 1;
            } else if (g->elems[q + 1].type == GE_CHAR_RNG_UPPER) {
                hi = g->elems[q + 1].value;
                q += 2;
            } else {
                q += 1;
            }
            for (uint32_t c = lo; c <= hi && c < 128; c++) bits[c >> 6] |= 1ull << (c & 63);
        } while (g->elems[q].type == GE_CHAR_ALT);
        if (!positive) {
            bits[0] = ~bits[0];
            bits[1] = ~bits[1];
        }
        g->term_next[pos] = q;
        g->term_ascii[pos][0] = bits[0];
        g->term_ascii[pos][1] = bits[1];
    }
}

void bubo_grammar_free(bubo_grammar *g) {
    if (!g) return;
    free(g->elems);
    free(g->rule_start);
    free(g->term_next);
    free(g->term_ascii);
    free(g->tail_min);
    free(g->rule_min);
    free(g->rule_alt);
    free(g);
}

uint32_t bubo_grammar_n_rules(const bubo_grammar *g) { return g->n_rules; }

bubo_status bubo_grammar_parse(const char *text, size_t len, const char *root, bubo_grammar **out,
                               bubo_err *err) {
    *out = NULL;
    if (!text || !root) return bubo_set_err(err, BUBO_ERR_INVALID, "grammar: NULL text or root");
    parser P = {.src = text, .end = text + len, .err = err, .status = BUBO_OK};
    bubo_grammar *g = NULL;
    uint8_t *nullable = NULL;

    const char *p = parse_space(&P, text, 1);
    while (p && p < P.end) p = parse_rule(&P, p);
    if (P.status != BUBO_OK) goto done;

    for (uint32_t i = 0; i < P.n_rules; i++)
        if (!P.rules[i].defined) {
            fail(&P, P.rules[i].first_ref, "undefined rule '%s'", P.rules[i].name);
            goto done;
        }
    uint32_t root_id = UINT32_MAX;
    size_t root_len = strlen(root);
    for (uint32_t h = 0; P.map_cap && h < P.map_cap; h++)
        if (P.map[h] && strlen(P.rules[P.map[h] - 1].name) == root_len &&
            memcmp(P.rules[P.map[h] - 1].name, root, root_len) == 0)
            root_id = P.map[h] - 1;
    if (root_id == UINT32_MAX) {
        P.status = bubo_set_err(err, BUBO_ERR_INVALID, "grammar: no rule '%s' (the root)", root);
        goto done;
    }

    g = calloc(1, sizeof *g);
    if (!g) goto oom;
    g->n_rules = P.n_rules;
    g->n_elems = (uint32_t)P.n_elems;
    g->root = root_id;
    g->elems = malloc((size_t)g->n_elems * sizeof *g->elems);
    g->rule_start = malloc((size_t)g->n_rules * sizeof *g->rule_start);
    g->term_next = calloc(g->n_elems, sizeof *g->term_next);
    g->term_ascii = calloc(g->n_elems, sizeof *g->term_ascii);
    nullable = calloc(g->n_rules, 1);
    if (!g->elems || !g->rule_start || !g->term_next || !g->term_ascii || !nullable) goto oom;
    uint32_t at = 0;
    for (uint32_t i = 0; i < P.n_rules; i++) {
        g->rule_start[i] = at;
        memcpy(g->elems + at, P.rules[i].body.v, P.rules[i].body.n * sizeof *g->elems);
        at += P.rules[i].body.n;
    }
    build_terminal_tables(g);
    if ((P.status = check_left_recursion(&P, g, nullable)) == BUBO_OK &&
        (P.status = grammar_build_shortest(g, err)) == BUBO_OK) {
        *out = g;
        g = NULL;
    }
    goto done;

oom:
    P.status = bubo_set_err(err, BUBO_ERR_NOMEM, "grammar: out of memory");
done: /* the parser's own tables go either way; g is NULL once it is the caller's */
    free(nullable);
    bubo_grammar_free(g);
    for (uint32_t i = 0; i < P.n_rules; i++) {
        free(P.rules[i].name);
        free(P.rules[i].body.v);
    }
    free(P.rules);
    free(P.map);
    return P.status;
}
