/* The grammar engine under AddressSanitizer and UBSan (tests/native/test_grammar_asan.py builds
 * and runs it): a corpus of grammars and strings, masks against a brute force over a synthetic
 * vocabulary, every error path, the state bounds, and a seeded fuzz of the parser and matcher.
 * Prints "ok" when every check passed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bubo/grammar.h"

static int failures = 0;
#define CHECK(cond, ...)                                            \
    do {                                                            \
        if (!(cond)) {                                              \
            failures++;                                             \
            fprintf(stderr, "%s:%d: ", __FILE__, __LINE__);         \
            fprintf(stderr, __VA_ARGS__);                           \
            fprintf(stderr, "\n");                                  \
        }                                                           \
    } while (0)

static const char *JSON =
    "root   ::= ws value\n"
    "value  ::= object | array | string | number | (\"true\" | \"false\" | \"null\") ws\n"
    "object ::= \"{\" ws ( string \":\" ws value (\",\" ws string \":\" ws value)* )? \"}\" ws\n"
    "array  ::= \"[\" ws ( value (\",\" ws value)* )? \"]\" ws\n"
    "string ::= \"\\\"\" ( [^\"\\\\\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4}) )* \"\\\"\" ws\n"
    "number ::= \"-\"? (\"0\" | [1-9] [0-9]*) (\".\" [0-9]+)? ([eE] [-+]? [0-9]+)? ws\n"
    "ws ::= [ \\t\\n\\r]*\n";

static const char *ARITH =
    "root  ::= expr\n"
    "expr  ::= term (ws [-+] ws term)*\n"
    "term  ::= factor (ws [*/] ws factor)*\n"
    "factor ::= number | \"(\" ws expr ws \")\" | \"-\" factor\n"
    "number ::= [0-9]+ (\".\" [0-9]+)?\n"
    "ws    ::= \" \"?\n";

static bubo_grammar *parse(const char *text) {
    bubo_grammar *g = NULL;
    bubo_err err;
    bubo_status st = bubo_grammar_parse(text, strlen(text), "root", &g, &err);
    CHECK(st == BUBO_OK, "parse failed: %s", err.msg);
    return g;
}

static int accepts(const bubo_grammar *g, const char *s) {
    bubo_grammar_matcher *m;
    bubo_err err;
    if (bubo_grammar_matcher_create(g, NULL, &m, &err) != BUBO_OK) return -1;
    bool ok = false;
    bubo_status st = bubo_grammar_matcher_accept_bytes(m, (const uint8_t *)s, strlen(s), &ok, &err);
    int r = st == BUBO_OK && ok && bubo_grammar_matcher_accepting(m);
    bubo_grammar_matcher_free(m);
    return r;
}

static void test_corpus(void) {
    struct {
        const char *grammar;
        const char *good[6];
        const char *bad[6];
    } cases[] = {
        {JSON, {"{}", "[1, 2.5e3, true]", "{\"a\": {\"b\": \"\xc3\xa9\\n\"}}", " null "},
         {"{", "[1,]", "01", "\"\x01\"", "{\"a\" 1}"}},
        {ARITH, {"1+2", "(1 + 2) * 3", "-(4/2.5)"}, {"1+", "(1", "()"}},
        {"root ::= [\xce\xb1-\xcf\x89]+ \"!\"", {"\xce\xb1\xce\xb2!"}, {"a!", "!"}},
        {"root ::= [^a-z]{2,3}", {"AB", "\xe4\xb8\xad\xe6\x96\x87"}, {"A", "ab", "ABCD"}},
        {"root ::= (\"x\" (\"y\" | \"z\")*){1,2} .", {"xa", "xyzx\xf0\x9f\x98\x80"}, {"x", "xxxa"}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        bubo_grammar *g = parse(cases[c].grammar);
        if (!g) continue;
        for (int i = 0; i < 6 && cases[c].good[i]; i++)
            CHECK(accepts(g, cases[c].good[i]) == 1, "case %zu should accept '%s'", c, cases[c].good[i]);
        for (int i = 0; i < 6 && cases[c].bad[i]; i++)
            CHECK(accepts(g, cases[c].bad[i]) == 0, "case %zu should reject '%s'", c, cases[c].bad[i]);
        bubo_grammar_free(g);
    }
}

static void test_errors(void) {
    const char *bad[] = {
        "root ::= \"abc", "root ::= [a-z", "root ::= []", "root ::= (\"a\"", "root \"a\"", "root ::= *",
        "root ::= \"a\"{", "root ::= \"a\"{2,1}", "root ::= \"\\q\"", "root ::= \"\\x4", "root ::= foo",
        "root ::= \"a\"\nroot ::= \"b\"", "root ::= \"a\"{5000}", "root ::= root \"a\"", "x ::= \"x\"", "",
        "root ::= (\"a\"?)*", "root ::= \"\xff\"", "root ::= \"\xe4\xb8\"", "root ::= [\\U00110000]",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        bubo_grammar *g = NULL;
        bubo_err err = {{0}};
        bubo_status st = bubo_grammar_parse(bad[i], strlen(bad[i]), "root", &g, &err);
        CHECK(st == BUBO_ERR_INVALID && g == NULL && err.msg[0], "bad grammar %zu was accepted", i);
    }
    /* deep nesting refused, not a stack overflow */
    size_t depth = 100000;
    char *deep = malloc(2 * depth + 32);
    strcpy(deep, "root ::= ");
    size_t n = strlen(deep);
    memset(deep + n, '(', depth);
    memcpy(deep + n + depth, "\"a\"", 3);
    memset(deep + n + depth + 3, ')', depth);
    deep[n + 2 * depth + 3] = 0;
    bubo_grammar *g = NULL;
    bubo_err err;
    CHECK(bubo_grammar_parse(deep, strlen(deep), "root", &g, &err) == BUBO_ERR_INVALID, "deep nesting accepted");
    free(deep);
    /* a long chain of rules: the left-recursion walk and the expansion are iterative */
    size_t n_rules = 20000;
    char *chain = malloc(n_rules * 32 + 64);
    char *p = chain;
    p += sprintf(p, "root ::= r0\n");
    for (size_t i = 0; i + 1 < n_rules; i++) p += sprintf(p, "r%zu ::= r%zu\n", i, i + 1);
    p += sprintf(p, "r%zu ::= \"z\"\n", n_rules - 1);
    CHECK(bubo_grammar_parse(chain, (size_t)(p - chain), "root", &g, &err) == BUBO_OK, "chain: %s", err.msg);
    if (g) {
        bubo_grammar_matcher *m;
        bubo_status st = bubo_grammar_matcher_create(g, NULL, &m, &err);
        /* 20000 frames deep: refused by the depth bound, not by a crash */
        CHECK(st == BUBO_ERR_UNSUPPORTED || st == BUBO_OK, "chain matcher: %s", err.msg);
        if (st == BUBO_OK) bubo_grammar_matcher_free(m);
        bubo_grammar_free(g);
    }
    free(chain);
}

static void test_bounds(void) {
    bubo_grammar *g = parse("root ::= (\"a\"?){0,4096} \"b\"");
    bubo_grammar_matcher *m = NULL;
    bubo_err err;
    CHECK(bubo_grammar_matcher_create(g, NULL, &m, &err) == BUBO_ERR_UNSUPPORTED, "explosion not refused");
    bubo_grammar_free(g);
    g = parse("root ::= \"(\" root \")\" | \"x\"");
    CHECK(bubo_grammar_matcher_create(g, NULL, &m, &err) == BUBO_OK, "create");
    bubo_status st = BUBO_OK;
    for (int i = 0; i < BUBO_GRAMMAR_MAX_DEPTH + 10 && st == BUBO_OK; i++) {
        bool ok;
        st = bubo_grammar_matcher_accept_bytes(m, (const uint8_t *)"(", 1, &ok, &err);
    }
    CHECK(st == BUBO_ERR_UNSUPPORTED, "depth not bounded");
    bubo_grammar_matcher_free(m);
    bubo_grammar_free(g);
}

// ---------------------------------------------------------------------------------------------
// masks against brute force on a synthetic vocabulary

typedef struct {
    char *pieces;
    uint64_t *offsets;
    uint32_t n;
} vocab_bytes;

static void add_piece(vocab_bytes *v, const char *s, size_t len) {
    memcpy(v->pieces + v->offsets[v->n], s, len);
    v->offsets[v->n + 1] = v->offsets[v->n] + len;
    v->n++;
}

static vocab_bytes make_vocab(void) {
    vocab_bytes v;
    v.pieces = malloc(1 << 20);
    v.offsets = malloc(sizeof *v.offsets * 60000);
    v.offsets[0] = 0;
    v.n = 0;
    add_piece(&v, "", 0);
    for (int b = 1; b < 256; b++) {
        char c = (char)b;
        add_piece(&v, &c, 1);
    }
    const char *alpha = "{}[]\",: 0123456789.-eEtrufalsn\\\n+*/()ab";
    size_t na = strlen(alpha);
    for (size_t i = 0; i < na; i++)
        for (size_t j = 0; j < na; j++) {
            char s[3] = {alpha[i], alpha[j], alpha[(i * 7 + j) % na]};
            add_piece(&v, s, 2);
            add_piece(&v, s, 3);
        }
    const char *extra[] = {"\xe4\xb8", "\xad", "\xe4\xb8\xad", "\xad\xe6", "\x96\x87\"", "\xf0\x9f\x98", "\x80}",
                           "true", "false", "null", "\": \"", "\"}", "123", "\\u00e9", "", "ab"};
    for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++) add_piece(&v, extra[i], strlen(extra[i]));
    add_piece(&v, "ab", 2); /* a duplicate */
    /* CJK: subtrees of the trie big enough for the walk to take them whole, some of them cut by
     * a token that ends mid-character or continues with a quote */
    for (uint32_t cp = 0x4E00; cp < 0x4F00; cp++) {
        char s[8] = {(char)(0xE0 | (cp >> 12)), (char)(0x80 | ((cp >> 6) & 0x3F)), (char)(0x80 | (cp & 0x3F)), 'x', '"'};
        add_piece(&v, s, 3);
        if (cp % 3 == 0) add_piece(&v, s, 4);
        if (cp % 17 == 0) add_piece(&v, s, 5);
        if (cp % 5 == 0) add_piece(&v, s, 2);
    }
    return v;
}

static void check_masks(const char *grammar, const char *const *prefixes, size_t n_prefixes,
                        const bubo_grammar_vocab *voc, const vocab_bytes *vb) {
    bubo_grammar *g = parse(grammar);
    uint8_t *mask = malloc(vb->n);
    bubo_err err;
    size_t n_allowed = 0;
    for (size_t k = 0; k < n_prefixes; k++) {
        bubo_grammar_matcher *m;
        CHECK(bubo_grammar_matcher_create(g, voc, &m, &err) == BUBO_OK, "create");
        bool ok;
        bubo_grammar_matcher_accept_bytes(m, (const uint8_t *)prefixes[k], strlen(prefixes[k]), &ok, &err);
        CHECK(ok, "prefix '%s' refused", prefixes[k]);
        for (int round = 0; round < 2; round++) { /* the second mask comes from the transition cache */
            CHECK(bubo_grammar_matcher_mask(m, mask, &err) == BUBO_OK, "mask: %s", err.msg);
            for (uint32_t t = 0; t < vb->n; t++) {
                bubo_grammar_matcher *c;
                bubo_grammar_matcher_clone(m, &c, &err);
                bool all = vb->offsets[t + 1] > vb->offsets[t];
                for (uint64_t b = vb->offsets[t]; b < vb->offsets[t + 1] && all; b++)
                    bubo_grammar_matcher_accept_bytes(c, (const uint8_t *)vb->pieces + b, 1, &all, &err);
                n_allowed += all;
                CHECK(mask[t] == all, "grammar prefix '%s' token %u: mask %d brute force %d", prefixes[k], t, mask[t], all);
                bubo_grammar_matcher_free(c);
            }
        }
        bubo_grammar_matcher_free(m);
    }
    CHECK(n_allowed > 10 * n_prefixes, "masks allow almost nothing (%zu): the check would be vacuous", n_allowed);
    free(mask);
    bubo_grammar_free(g);
}

static void test_masks(void) {
    vocab_bytes vb = make_vocab();
    bubo_grammar_vocab *voc;
    bubo_err err;
    CHECK(bubo_grammar_vocab_create(vb.pieces, vb.offsets, vb.n, &voc, &err) == BUBO_OK, "vocab: %s", err.msg);
    const char *json_prefixes[] = {"", "{", "{\"a", "{\"a\": ", "[1, 2.", "{\"k\": \"\xe4\xb8", "[tr"};
    check_masks(JSON, json_prefixes, sizeof json_prefixes / sizeof *json_prefixes, voc, &vb);
    const char *arith_prefixes[] = {"", "1", "(3 + ", "4."};
    check_masks(ARITH, arith_prefixes, sizeof arith_prefixes / sizeof *arith_prefixes, voc, &vb);
    const char *text_prefixes[] = {"<", "<ab", "<\xe4\xb8"};
    check_masks("root ::= \"<\" ([^<>\\u4e80-\\u4eff] | \"\\u4e90\")* \">\"", text_prefixes,
                sizeof text_prefixes / sizeof *text_prefixes, voc, &vb);
    bubo_grammar_vocab_free(voc);
    free(vb.pieces);
    free(vb.offsets);
}

// ---------------------------------------------------------------------------------------------
// fuzz

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 11);
}

/* mask == brute force (a clone accepting each token's bytes one by one) for the state of m */
static int mask_matches_brute_force(bubo_grammar_matcher *m, const bubo_grammar_vocab *voc, const vocab_bytes *vb,
                                    uint8_t *mask) {
    bubo_err err;
    if (bubo_grammar_matcher_mask(m, mask, &err) != BUBO_OK) return 1; /* a bound was hit: refused, fine */
    for (uint32_t t = 0; t < vb->n; t++) {
        bubo_grammar_matcher *c;
        if (bubo_grammar_matcher_clone(m, &c, &err) != BUBO_OK) return 0;
        bool all = vb->offsets[t + 1] > vb->offsets[t];
        for (uint64_t b = vb->offsets[t]; b < vb->offsets[t + 1] && all; b++)
            if (bubo_grammar_matcher_accept_bytes(c, (const uint8_t *)vb->pieces + b, 1, &all, &err) != BUBO_OK) all = false;
        bubo_grammar_matcher_free(c);
        if (mask[t] != all) return 0;
    }
    return 1;
}

static void test_fuzz(void) {
    vocab_bytes vb = make_vocab();
    bubo_grammar_vocab *voc;
    bubo_err verr;
    CHECK(bubo_grammar_vocab_create(vb.pieces, vb.offsets, vb.n, &voc, &verr) == BUBO_OK, "vocab");
    uint8_t *mask = malloc(vb.n);
    const char *seeds[] = {JSON, ARITH, "root ::= [a-c]{1,3} (\"x\" | [^y])* \"\\u00e9\"?\n",
                           "root ::= a b\na ::= \"a\"+ | \n b ::= ( \"b\" # c\n | . ){2,}\n"};
    const char *tokens[] = {"(", ")", "[", "]", "\"", "|", "*", "+", "?", "{", "}", ",", "::=", "\n", "\\", "^",
                            "-", "#", "x", "root", "\xe4\xb8", "\xff", "{0,4096}", "{99999}", " "};
    char buf[4096];
    bubo_err err;
    int parsed = 0;
    for (int it = 0; it < 6000; it++) {
        const char *seed = seeds[rnd() % 4];
        size_t n = strlen(seed);
        if (n >= sizeof buf - 64) n = sizeof buf - 64;
        memcpy(buf, seed, n);
        int n_mut = 1 + rnd() % 4;
        for (int k = 0; k < n_mut; k++) {
            size_t at = rnd() % (n + 1);
            int op = rnd() % 3;
            if (op == 0 && n > 0 && at < n) { /* delete a run */
                size_t len = 1 + rnd() % 4;
                if (at + len > n) len = n - at;
                memmove(buf + at, buf + at + len, n - at - len);
                n -= len;
            } else { /* insert a token */
                const char *t = tokens[rnd() % (sizeof tokens / sizeof *tokens)];
                size_t len = strlen(t);
                if (n + len >= sizeof buf) continue;
                memmove(buf + at + len, buf + at, n - at);
                memcpy(buf + at, t, len);
                n += len;
            }
        }
        bubo_grammar *g = NULL;
        bubo_status st = bubo_grammar_parse(buf, n, "root", &g, &err);
        if (st != BUBO_OK) {
            CHECK(g == NULL && strstr(err.msg, "grammar"), "error without message");
            continue;
        }
        parsed++;
        bubo_grammar_matcher *m;
        if (bubo_grammar_matcher_create(g, voc, &m, &err) == BUBO_OK) {
            for (int k = 0; k < 16; k++) {
                uint8_t bytes[3] = {(uint8_t)rnd(), (uint8_t)(rnd() % 128), (uint8_t)rnd()};
                bool ok;
                if (bubo_grammar_matcher_accept_bytes(m, bytes, 1 + rnd() % 3, &ok, &err) != BUBO_OK) break;
                if (k % 4 == 0 && bubo_grammar_matcher_mask(m, mask, &err) != BUBO_OK) break;
            }
            if (parsed % 8 == 0)
                CHECK(mask_matches_brute_force(m, voc, &vb, mask), "fuzz grammar %d: mask differs from brute force", it);
            bubo_grammar_matcher_free(m);
        }
        bubo_grammar_free(g);
    }
    CHECK(parsed > 100, "fuzz parsed only %d grammars", parsed);
    free(mask);
    bubo_grammar_vocab_free(voc);
    free(vb.pieces);
    free(vb.offsets);
}

int main(void) {
    test_corpus();
    test_errors();
    test_bounds();
    test_masks();
    test_fuzz();
    if (failures) {
        printf("%d failures\n", failures);
        return 1;
    }
    printf("ok\n");
    return 0;
}
