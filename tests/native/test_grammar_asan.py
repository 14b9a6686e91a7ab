"""Build tests/native/c/grammar_asan.c with AddressSanitizer and UBSan straight from the grammar
engine's sources and run it: an out-of-bounds access, a leak or undefined behaviour fails the test.
A second program (written out below) runs the shortest completions the same way: every prefix
of a corpus, into buffers of exactly the announced length, and the refusal of one byte less."""

import pathlib
import shutil
import subprocess

import pytest

pytestmark = pytest.mark.slow  # a sweep or a build: the whole suite runs it, the quick tier does not

ROOT = pathlib.Path(__file__).resolve().parents[2]


def build_and_run(tmp_path, main_src, name):
    exe = tmp_path / name
    srcs = [main_src, *sorted((ROOT / "csrc/grammar").glob("*.c")), ROOT / "csrc/util/err.c"]
    subprocess.run(["gcc", "-std=gnu11", "-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-g", "-O1",
                    "-Wall", "-Wextra", "-Wno-unused-parameter",
                    f"-I{ROOT / 'csrc/include'}", f"-I{ROOT / 'csrc'}", *map(str, srcs), "-lm", "-o", str(exe)],
                   check=True)
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_grammar_under_sanitizers(tmp_path):
    build_and_run(tmp_path, ROOT / "tests/native/c/grammar_asan.c", "grammar_asan")


SHORTEST_C = r'''
#include <stdint.h>
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

/* shortest_len, then shortest() into a heap buffer of exactly that many bytes (one more would
 * be written out of bounds), one byte less refused, and the completion finishes the text. */
static size_t check_state(const bubo_grammar_matcher *m, const char *what) {
    bubo_err err;
    size_t len = bubo_grammar_matcher_shortest_len(m), n = 0;
    if (len == SIZE_MAX) {
        uint8_t one;
        CHECK(bubo_grammar_matcher_shortest(m, &one, 1, &n, &err) == BUBO_OK && n == SIZE_MAX, "%s: none", what);
        return len;
    }
    uint8_t *buf = malloc(len ? len : 1);
    CHECK(bubo_grammar_matcher_shortest(m, len ? buf : NULL, len, &n, &err) == BUBO_OK && n == len,
          "%s: shortest wrote %zu, announced %zu", what, n, len);
    if (len > 0) {
        size_t n2 = 0;
        CHECK(bubo_grammar_matcher_shortest(m, buf, len - 1, &n2, &err) == BUBO_ERR_INVALID,
              "%s: a buffer one byte short is accepted", what);
    }
    bubo_grammar_matcher *c = NULL;
    CHECK(bubo_grammar_matcher_clone(m, &c, &err) == BUBO_OK, "%s: clone", what);
    if (c) {
        bool ok = false;
        bubo_status st = bubo_grammar_matcher_accept_bytes(c, buf, len, &ok, &err);
        CHECK(st == BUBO_OK && ok && bubo_grammar_matcher_accepting(c), "%s: the completion does not finish it", what);
        CHECK(bubo_grammar_matcher_shortest_len(c) == 0, "%s: left %zu after the completion", what,
              bubo_grammar_matcher_shortest_len(c));
        bubo_grammar_matcher_free(c);
    }
    free(buf);
    return len;
}

/* every prefix of every text (cut at each byte); full: the texts are sentences of the grammar,
 * so no prefix needs more bytes than the rest of its text */
static void check_prefixes(const char *grammar, const char *const *texts, int full) {
    bubo_grammar *g = NULL;
    bubo_err err;
    if (bubo_grammar_parse(grammar, strlen(grammar), "root", &g, &err) != BUBO_OK) {
        CHECK(0, "parse failed: %s", err.msg);
        return;
    }
    for (const char *const *t = texts; *t; t++) {
        size_t n = strlen(*t);
        for (size_t cut = 0; cut <= n; cut++) {
            bubo_grammar_matcher *m = NULL;
            CHECK(bubo_grammar_matcher_create(g, NULL, &m, &err) == BUBO_OK, "create");
            if (!m) continue;
            bool ok = false;
            CHECK(bubo_grammar_matcher_accept_bytes(m, (const uint8_t *)*t, cut, &ok, &err) == BUBO_OK && ok,
                  "'%s' cut at %zu is refused", *t, cut);
            size_t len = check_state(m, *t);
            CHECK(len != SIZE_MAX && (!full || len <= n - cut), "'%s' cut at %zu: %zu left", *t, cut, len);
            bubo_grammar_matcher_free(m);
        }
    }
    bubo_grammar_free(g);
}

/* random bytes from the start state: the shortest completions of every state met */
static void fuzz(const char *grammar, unsigned seed) {
    bubo_grammar *g = NULL;
    bubo_err err;
    if (bubo_grammar_parse(grammar, strlen(grammar), "root", &g, &err) != BUBO_OK) {
        CHECK(0, "parse failed: %s", err.msg);
        return;
    }
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int walk = 0; walk < 40; walk++) {
        bubo_grammar_matcher *m = NULL;
        if (bubo_grammar_matcher_create(g, NULL, &m, &err) != BUBO_OK) break;
        for (int step = 0; step < 60; step++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            uint8_t b = (uint8_t)(s >> 56);
            if (b & 1) b = (uint8_t)"ab0 \"{}[]:,-.eu\\xyz"[(s >> 40) % 20];
            bool ok = false;
            if (bubo_grammar_matcher_accept_bytes(m, &b, 1, &ok, &err) != BUBO_OK) break;
            if (ok) check_state(m, grammar);
        }
        bubo_grammar_matcher_free(m);
    }
    bubo_grammar_free(g);
}

static void check_none(const char *grammar, const char *prefix) {
    bubo_grammar *g = NULL;
    bubo_err err;
    if (bubo_grammar_parse(grammar, strlen(grammar), "root", &g, &err) != BUBO_OK) {
        CHECK(0, "parse failed: %s", err.msg);
        return;
    }
    bubo_grammar_matcher *m = NULL;
    if (bubo_grammar_matcher_create(g, NULL, &m, &err) == BUBO_OK) {
        bool ok = false;
        CHECK(bubo_grammar_matcher_accept_bytes(m, (const uint8_t *)prefix, strlen(prefix), &ok, &err) == BUBO_OK && ok,
              "'%s' refused", prefix);
        CHECK(check_state(m, grammar) == SIZE_MAX, "'%s' on '%s' has a completion", prefix, grammar);
        bubo_grammar_matcher_free(m);
    }
    bubo_grammar_free(g);
}

static const char *JSON =
    "root   ::= ws value\n"
    "value  ::= object | array | string | number | (\"true\" | \"false\" | \"null\") ws\n"
    "object ::= \"{\" ws ( string \":\" ws value (\",\" ws string \":\" ws value)* )? \"}\" ws\n"
    "array  ::= \"[\" ws ( value (\",\" ws value)* )? \"]\" ws\n"
    "string ::= \"\\\"\" ( [^\"\\\\\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4}) )* \"\\\"\" ws\n"
    "number ::= \"-\"? (\"0\" | [1-9] [0-9]*) (\".\" [0-9]+)? ([eE] [-+]? [0-9]+)? ws\n"
    "ws ::= [ \\t\\n\\r]*\n";

int main(void) {
    static const char *const json_texts[] = {
        "{\"a\": [1, 2.5e-3, true, null, {\"b\": \"c\\n\\u00e9\"}]}", " \"\xc3\xa9\xe4\xb8\xad\xf0\x9f\x98\x80\" ",
        "[[[]]]", NULL};
    check_prefixes(JSON, json_texts, 1);
    static const char *const utf8_texts[] = {"\xce\xb1\xce\xb2\xe4\xb8\xad\xc3\xa9x!",
                                             "\xcf\x89\xf0\x9f\x98\x80\xc3\xa9\xf4\x8f\xbf\xbf!", NULL};
    check_prefixes("root ::= [\xce\xb1-\xcf\x89]+ [^\\x00-\\x7F] \"\xc3\xa9\" . \"!\"", utf8_texts, 1);
    static const char *const nest_texts[] = {"(()())", "((((()))))", "", NULL};
    check_prefixes("root ::= \"(\" root \")\" root | \"\"", nest_texts, 1);
    static const char *const rep_texts[] = {"aabbbcdcff", "aaaabbbccceefg", NULL};
    check_prefixes("root ::= \"a\"{2,4} \"b\"{3} (\"c\" \"d\"?){1,} \"e\"* \"f\"+ \"g\"?", rep_texts, 1);
    static const char *const big_texts[] = {"aaaa", NULL};
    check_prefixes("root ::= \"a\"{4000}", big_texts, 0);
    static const char *const opt_texts[] = {"xxxxy", "y", NULL};
    check_prefixes("root ::= \"x\"{0,4000} \"y\"", opt_texts, 1);
    static const char *const surr_texts[] = {"\xee\x80\x80\xed\x9f\xb5", NULL};
    check_prefixes("root ::= [^\\x00-\\uD7FF] [\\uD7F0-\\uD7FF] [^\\x00-\\uFFFF]?", surr_texts, 1);
    static const char *const any_texts[] = {"\xf4\x8f\xbf\xbfz", "\xe0\xa0\x80z", "\xed\x9f\xbfz", NULL};
    check_prefixes("root ::= . .? \"z\"", any_texts, 1);
    check_none("root ::= \"a\" x\nx ::= \"b\" x", "abb");
    check_none("root ::= [^\\x00-\\U0010FFFF]", "");
    check_none("root ::= \"q\" \"\\uDFFF\" | \"r\"", "q");
    fuzz(JSON, 1);
    fuzz("root ::= (\"x\" (\"y\" | \"z\")*){1,2} . [^a-z]{2,3} | [\xce\xb1-\xcf\x89]+ \"!\"", 2);
    /* a chain whose lengths shorten step by step while being settled */
    {
        enum { N = 300 };
        size_t cap = 64 * N + 64 * N, n = 0;
        char *text = malloc(cap);
        n += (size_t)snprintf(text + n, cap - n, "root ::= r%d\nr0 ::= \"a\"\nz0 ::= \"zzz\"\n", N - 1);
        for (int i = 1; i < N; i++)
            n += (size_t)snprintf(text + n, cap - n, "r%d ::= \"a\" r%d | \"b\" r%d | z%d\nz%d ::= \"zz\" z%d\n",
                                  i, i - 1, i > 1 ? i - 2 : 0, i, i, i - 1);
        bubo_grammar *g = NULL;
        bubo_err err;
        CHECK(bubo_grammar_parse(text, n, "root", &g, &err) == BUBO_OK, "chain: %s", err.msg);
        if (g) {
            bubo_grammar_matcher *m = NULL;
            if (bubo_grammar_matcher_create(g, NULL, &m, &err) == BUBO_OK) {
                size_t len = check_state(m, "chain");
                CHECK(len == (size_t)(N / 2 + 1), "chain: %zu", len);
                bubo_grammar_matcher_free(m);
            }
            bubo_grammar_free(g);
        }
        free(text);
    }
    if (failures) {
        fprintf(stderr, "%d failures\n", failures);
        return 1;
    }
    printf("ok\n");
    return 0;
}
'''


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_shortest_under_sanitizers(tmp_path):
    src = tmp_path / "shortest_asan.c"
    src.write_text(SHORTEST_C)
    build_and_run(tmp_path, src, "shortest_asan")
