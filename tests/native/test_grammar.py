"""The GBNF engine (bubo._grammar): parsing and its errors, acceptance of strings for a corpus of
grammars, UTF-8 split across tokens, and token masks checked against a brute force over the
whole vocabulary of each catalog model."""

import json
import random
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bubo._grammar import MAX_DEPTH, MAX_NESTING, MAX_REPEAT, Grammar, Matcher, Vocab
from bubo.errors import UnsupportedError

JSON_GBNF = r'''
root   ::= ws value
value  ::= object | array | string | number | ("true" | "false" | "null") ws

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws

string ::=
  "\"" (
    [^"\\\x00-\x1F] |
    "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}) # escapes
  )* "\"" ws

number ::= "-"? ("0" | [1-9] [0-9]*) ("." [0-9]+)? ([eE] [-+]? [0-9]+)? ws

ws ::= [ \t\n\r]*
'''

ARITH_GBNF = r'''
root  ::= expr
expr  ::= term (ws [-+] ws term)*
term  ::= factor (ws [*/] ws factor)*
factor ::= number | "(" ws expr ws ")" | "-" factor
number ::= [0-9]+ ("." [0-9]+)?
ws    ::= " "?
'''

LIST_GBNF = r'''
root ::= item ("\n" item)* "\n"?
item ::= "- " [a-z]+ (", " [a-z]+){0,2}
'''


def accepts(grammar, text, root="root"):
    """text (str or bytes) is a complete sentence of grammar."""
    g = grammar if isinstance(grammar, Grammar) else Grammar(grammar, root)
    m = Matcher(g)
    data = text.encode() if isinstance(text, str) else text
    return m.accept_bytes(data) and m.accepting


def random_walk(m, rng, pieces, steps, stop_p):
    """Bytes of a walk that picks a random allowed token each step (pieces: the token bytes),
    stopping with probability stop_p where the matcher accepts, or after steps tokens. A dead end
    (nothing allowed, not accepting) fails the test."""
    out = b""
    for _ in range(steps):
        allowed = np.nonzero(m.mask())[0]
        if m.accepting and (allowed.size == 0 or rng.random() < stop_p):
            break
        if allowed.size == 0:
            pytest.fail(f"dead end after {out!r}: not accepting and no token allowed")
        t = int(rng.choice(list(allowed)))
        assert m.accept_token(t)
        out += pieces[t]
    return out


def prefix_ok(grammar, text):
    m = Matcher(grammar if isinstance(grammar, Grammar) else Grammar(grammar))
    return m.accept_bytes(text.encode() if isinstance(text, str) else text)


# ---------------------------------------------------------------------------------------------
# acceptance corpus

CORPUS = [
    # (grammar, accepted, rejected)
    (ARITH_GBNF, ["1", "1+2", "(1 + 2) * 3", "-(4/2.5)", "((((7))))", "1 - -2"],
     ["", "1+", "(1", "1 2", "+1", "1..2", "()", "1 +  2"]),
    (JSON_GBNF, ['{}', '[]', '{"a": [1, 2.5e-3, true, null, {"b": "c\\n\\u00e9"}]}', ' "x" ', '-0.5E+10',
                 '[[[[[]]]]]', '"\u00e9\u4e2d\U0001F600"'],
     ['{', '{"a"}', '[1,]', '01', '"\x01"', 'tru', '{"a":1,}', '"\\x"', "'a'", '1.', '.5']),
    (LIST_GBNF, ["- a", "- ab, cd\n- e\n", "- a, b, c"], ["- a, b, c, d", "-a", "- A", "- a\n\n- b"]),
    # nested repetition
    ('root ::= ("a" ("b" | "c")* ";")+', ["a;", "abcb;a;", "a;a;a;"], ["", ";", "ab", "abd;"]),
    ('root ::= ( ("x"{2})* "y" )?', ["", "y", "xxy", "xxxxy"], ["xy", "xxxy", "yy"]),
    # bounds
    ('root ::= "a"{3}', ["aaa"], ["aa", "aaaa"]),
    ('root ::= "a"{2,}', ["aa", "aaaaaaa"], ["", "a"]),
    ('root ::= "a"{1,3} "b"{0,2}', ["a", "aab", "aaabb"], ["", "aaaa", "abbb", "b"]),
    ('root ::= "ab"{0,2}', ["", "ab", "abab"], ["a", "ababab", "aba"]),
    ('root ::= [0-9]{ 2 , 4 }', ["12", "1234"], ["1", "12345"]),
    # UTF-8 classes
    ("root ::= [α-ω]+", ["αβγ", "ω"], ["", "a", "Α", "αa"]),
    ("root ::= [一-鿿]+ \"。\"", ["中文。", "字。"], ["中文", "abc。", "。"]),
    ("root ::= [😀-🙏]*", ["", "😀🙏😃"], ["🚀", "☺"]),
    ('root ::= [^a-z"]+', ["ABC", "é中😀", "1 2"], ["abc", "A\"", ""]),
    ('root ::= [^α-ω]', ["a", "Ω", "中"], ["α", "ψ"]),
    ("root ::= .+", ["anything at all 中😀", "\n"], [""]),
    # escapes
    (r'root ::= "\x41\u00e9\U0001F600\t\n\r\\\""', ['A\u00e9\U0001F600\t\n\r\\"'], ["A"]),
    (r'root ::= [\x00-\x1F\]\[\\]+', ["\x01\x1f]", "[\\"], ["a", " "]),
    (r'root ::= [\u0391-\u03A9]', ["Α", "Ω"], ["α"]),
    # comments, newlines inside parentheses, rules used before their definition
    ('# a comment\nroot ::= (\n  a |   # first\n  b\n) # trailing\na ::= "a"\nb ::= "b"\n', ["a", "b"], ["ab", ""]),
    ("root ::= x\r\nx ::= \"x\"\r\n", ["x"], ["xx"]),
    # empty alternatives
    ('root ::= "a" | ', ["", "a"], ["aa"]),
    # a dash at the end of a class is a character
    ("root ::= [a-]+", ["a-a", "-"], ["b"]),
]


@pytest.mark.parametrize("grammar,good,bad", CORPUS, ids=range(len(CORPUS)))
def test_corpus(grammar, good, bad):
    g = Grammar(grammar)
    for s in good:
        assert accepts(g, s), s
    for s in bad:
        assert not accepts(g, s), s


def test_rejection_leaves_state_unchanged():
    g = Grammar(ARITH_GBNF)
    m = Matcher(g)
    assert m.accept_bytes(b"1+")
    assert not m.accept_bytes(b"2)")  # "2" fits, ")" does not: all or nothing
    assert not m.accepting
    assert m.accept_bytes(b"2") and m.accepting


def test_clone_is_independent():
    g = Grammar(JSON_GBNF)
    m = Matcher(g)
    assert m.accept_bytes(b'{"a": ')
    c = m.clone()
    assert c.accept_bytes(b"1}") and c.accepting
    assert not m.accepting
    assert m.accept_bytes(b'"s"}') and m.accepting
    assert not c.accept_bytes(b'"')


def test_utf8_split_across_bytes():
    g = Grammar("root ::= [α-ω] \"中\" [😀-🙏]")
    text = "β中😀".encode()
    m = Matcher(g)
    for i in range(len(text)):
        assert m.accept_bytes(text[i:i + 1]), i
        assert m.accepting == (i == len(text) - 1)
    # a lead byte that cannot start any allowed character is refused at once
    m = Matcher(g)
    assert not m.accept_bytes(b"a")
    assert not m.accept_bytes("Ω".encode()[:1] + b"\x00")
    assert not m.accept_bytes(b"\x80")  # a continuation byte with nothing to continue
    assert not m.accept_bytes(b"\xce\xce")  # a lead byte where a continuation is due


def test_invalid_utf8_never_matches():
    g = Grammar("root ::= .*")
    for bad in [b"\xc0\x80", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xf8", b"\xff", b"\xe0\x80\x80"]:
        assert not Matcher(g).accept_bytes(bad), bad
    m = Matcher(g)
    assert m.accept_bytes(b"\xe4\xb8")  # the start of a character is fine, but not complete
    assert not m.accepting
    assert m.accept_bytes(b"\xad") and m.accepting


@pytest.mark.parametrize("cls", ["[α-ω]", "[^α-ω]", "[^\\x00-\\U0010FFFF]", "[^a-z\\u0080-\\u07FF]",
                                 "[\\u0800-\\u0801]", "[^\\u0000-\\uD7FF\\uE000-\\U0010FFFF]", ".", "[😀]"])
def test_partial_characters_are_exact(cls):
    """A prefix of a character is accepted iff some completion of it is: pruning on partial
    characters never keeps a dead stack nor drops a live one."""
    g = Grammar(f"root ::= {cls}")
    # every lead byte and, for 3- and 4-byte leads, every second byte
    for lead in range(0xC0, 0x100):
        n = 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4
        seconds = [None] if n == 2 else range(0x80, 0xC0)
        for second in seconds:
            prefix = bytes([lead]) if second is None else bytes([lead, second])
            got = Matcher(g).accept_bytes(prefix)
            want = False
            for tail in range(0x80, 0xC0):
                rest = n - len(prefix) - 1
                cand = prefix + bytes([tail]) + b"\x80" * rest
                cand2 = prefix + bytes([tail]) + b"\xbf" * rest
                for c in (cand, cand2):
                    try:
                        ch = c.decode()
                    except UnicodeDecodeError:
                        continue
                    want = want or accepts(g, ch)
                # a range of code points with this prefix: both ends decide for these classes
            assert got == want, (cls, prefix.hex())


# ---------------------------------------------------------------------------------------------
# errors

SYNTAX_ERRORS = [
    ("root ::= \"abc", 1, 10, "unterminated string"),
    ("root ::= [a-z", 1, 10, "unterminated character class"),
    ("root ::= []", 1, 10, "empty character class"),
    ("root ::= (\"a\"", 1, 14, "expected ')'"),
    ("root \"a\"", 1, 6, "expected '::='"),
    ("root ::= \"a\"\n  ::= \"b\"", 2, 3, "expected a rule name"),
    ("root ::= \"a\" )", 1, 14, "expected newline"),
    ("root ::= *", 1, 10, "expected an item"),
    ("root ::= \"a\"{", 1, 14, "expected an integer"),
    ("root ::= \"a\"{2,1}", 1, 16, "max is below min"),
    ("root ::= \"a\"{2 3}", 1, 16, "expected ',' or '}'"),
    ("root ::= \"a\"{2,3", 1, 17, "expected '}'"),
    ("root ::= \"\\q\"", 1, 11, "unknown escape"),
    ("root ::= \"\\x4\"", 1, 14, "hex digits"),
    ("root ::= \"\\U00110000\"", 1, 13, "beyond U+10FFFF"),
    ("root ::= [z-a]", 1, 11, "backwards"),
    ("\n\nroot ::= foo", 3, 10, "undefined rule 'foo'"),
    ("root ::= \"a\"\nroot ::= \"b\"", 2, 1, "defined twice"),
    ("root ::= \"a\"{5000}", 1, 14, "exceeds 4096"),
    ("root ::= " + "(" * (MAX_NESTING + 1) + "\"a\"" + ")" * (MAX_NESTING + 1), 1, 10 + MAX_NESTING, "nested deeper"),
    ("root ::= \"中文\" é", 1, 15, "expected newline or end of input, got 'é'"),
]


@pytest.mark.parametrize("text,line,col,what", SYNTAX_ERRORS, ids=[e[3] for e in SYNTAX_ERRORS])
def test_syntax_errors_name_line_and_column(text, line, col, what):
    with pytest.raises(ValueError) as e:
        Grammar(text)
    msg = str(e.value)
    assert f"line {line} col {col}:" in msg, msg
    assert what in msg, msg


@pytest.mark.parametrize("text,what", [
    ("root ::= root \"a\" | \"a\"", "left recursion"),
    ("root ::= a\na ::= b? root \"x\"\nb ::= \"b\"", "left recursion"),
    ("root ::= (\"a\"?)*", "left recursion"),
    ("x ::= \"x\"", "no rule 'root'"),
    ("", "no rule 'root'"),
])
def test_grammar_errors(text, what):
    with pytest.raises(ValueError, match=re.escape(what)):
        Grammar(text)


def test_other_root_and_repetition_limit():
    g = Grammar('a ::= "x" b\nb ::= "y"', root="a")
    assert accepts(g, "xy")
    Grammar(f'root ::= "a"{{{MAX_REPEAT}}}')  # the limit itself is fine
    big = Grammar('root ::= ("a"{0,4096}){0,4096} "b"')  # wrapped in rules: no blow-up
    assert big.n_rules < 10000


def test_explosive_grammar_is_refused_not_oom():
    # 4097 ways to stand at the start: one parse per copy that the next "a" could be
    with pytest.raises(UnsupportedError, match="ambiguous"):
        Matcher(Grammar('root ::= ("a"?){0,4096} "b"'))
    assert accepts('root ::= ("a"?){0,30} "b"', "a" * 30 + "b")
    # nested nullable repetitions (found by test_grammar_shortest's random grammars): every way to
    # match nothing is a parse to expand
    with pytest.raises(UnsupportedError, match="ambiguous"):
        Matcher(Grammar('root ::= (r1{0,2}){2,4}\nr1 ::= (""){0,2}\n'))
    # nesting grows one frame per "(": refused past MAX_DEPTH, not grown without end
    m = Matcher(Grammar('root ::= "(" root ")" | "x"'))
    with pytest.raises(UnsupportedError, match="deeper"):
        for _ in range(MAX_DEPTH + 10):
            m.accept_bytes(b"(")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(list('ab"[]()|*+?{},.^-\\x: \n#=:') + ["::=", "root", "\\u", "é", "9"]),
                max_size=40).map("".join))
def test_fuzz_parser_never_crashes(body):
    for text in (body, "root ::= " + body):
        try:
            g = Grammar(text)
        except ValueError as e:
            assert re.search(r"line \d+ col \d+|no rule|left recursion", str(e)), str(e)
            continue
        m = Matcher(g)
        m.accept_bytes(b"ab")


# ---------------------------------------------------------------------------------------------
# property tests against references

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**12, 10**12) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=4),
    max_leaves=12)

JSON = Grammar(JSON_GBNF)


@settings(max_examples=200, deadline=None)
@given(json_values, st.sampled_from([None, 0, 2]), st.booleans())
def test_generated_json_is_accepted(value, indent, ascii_only):
    text = json.dumps(value, indent=indent, ensure_ascii=ascii_only)
    m = Matcher(JSON)
    data = text.encode()
    assert m.accept_bytes(data), text
    assert m.accepting


def _json_ok(text):
    def no_constants(name):
        raise ValueError(name)
    try:
        json.loads(text, parse_constant=no_constants)
    except (ValueError, RecursionError):
        return False
    return True


@settings(max_examples=400, deadline=None)
@given(json_values, st.data())
def test_json_mutations_agree_with_python_json(value, data):
    text = json.dumps(value, ensure_ascii=False)
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, len(text)))
        op = data.draw(st.sampled_from(["insert", "delete", "replace"]))
        ch = data.draw(st.sampled_from(list('{}[],:"\\ 0123456789.eE-+tfnrul\u00e9\x01\n')))
        if op == "insert":
            text = text[:i] + ch + text[i:]
        elif op == "delete":
            text = text[:i] + text[i + 1:]
        else:
            text = text[:i] + ch + text[i + 1:]
    assert accepts(JSON, text) == _json_ok(text), repr(text)


def arith_strings():
    number = st.from_regex(r"\A[0-9]{1,3}(\.[0-9]{1,2})?\Z")
    return st.recursive(
        number,
        lambda e: st.tuples(e, st.sampled_from(["+", "-", "*", "/", " + ", " * "]), e).map("".join)
        | e.map(lambda x: f"({x})") | e.map(lambda x: f"( {x} )") | number.map(lambda x: "-" + x),
        max_leaves=10)


ARITH = Grammar(ARITH_GBNF)


@settings(max_examples=200, deadline=None)
@given(arith_strings())
def test_generated_arithmetic_is_accepted(text):
    assert accepts(ARITH, text), text
    # every proper prefix is a live state
    m = Matcher(ARITH)
    for b in text.encode():
        assert m.accept_bytes(bytes([b]))


# Regular grammars beside the Python regular expression for the same language: an independent
# recogniser for random strings, and a judge of strings generated by walking the grammar's masks.
REGULAR = [
    ('root ::= "- " [a-z]+ (", " [a-z]+){0,2} ("\n- " [a-z]+ (", " [a-z]+){0,2})*',
     r"- [a-z]+(, [a-z]+){0,2}(\n- [a-z]+(, [a-z]+){0,2})*", "- ,\nabz"),
    ('root ::= ("a" ("b" | "c")* ";")+', r"(a[bc]*;)+", "abc;d"),
    ('root ::= [0-9]{2,4} ("." [0-9]{1,2})?', r"[0-9]{2,4}(\.[0-9]{1,2})?", "0123456789.a"),
    ('root ::= ([α-ω] | [^a-zα-ω])* "z"', r"[^a-z]*z", "azyαω中 \n\x00"),
    ('root ::= "x"{0,3} "y"? "x"{2}', r"x{0,3}y?x{2}", "xy"),
    ('root ::= ("ab" | "a")* "b"', r"(ab|a)*b", "ab"),
    (r'root ::= [^"\\]* ("\\" . [^"\\]*)*', r'[^"\\]*(\\.[^"\\]*)*', 'a"\\中\n'),
]


@pytest.mark.parametrize("gbnf,regex,alphabet", REGULAR, ids=range(len(REGULAR)))
def test_regular_grammars_agree_with_re(gbnf, regex, alphabet):
    g = Grammar(gbnf)
    pattern = re.compile(regex, re.DOTALL)

    @settings(max_examples=150, deadline=None, database=None)
    @given(st.text(alphabet=alphabet, max_size=14))
    def random_strings(text):
        assert accepts(g, text) == (pattern.fullmatch(text) is not None), repr(text)

    random_strings()
    # strings generated by the grammar itself: a random walk over single-byte tokens
    single_bytes = [bytes([b]) for b in range(256)]
    vocab = Vocab(single_bytes)
    rng = random.Random(7)
    for _ in range(60):
        m = Matcher(g, vocab)
        out = random_walk(m, rng, single_bytes, 40, 0.25)
        if m.accepting:
            assert pattern.fullmatch(out.decode()), out


# ---------------------------------------------------------------------------------------------
# masks against brute force

def brute_force_mask(m, pieces):
    """Token i is allowed iff a clone of the state accepts its bytes one by one."""
    out = np.zeros(len(pieces), dtype=np.uint8)
    for i, p in enumerate(pieces):
        if not p:
            continue
        c = m.clone()
        if all(c.accept_bytes(p[k:k + 1]) for k in range(len(p))):
            out[i] = 1
    return out


def test_mask_small_vocab_with_duplicates_and_utf8():
    pieces = [b"", b"a", b"ab", b"ab", b"b", b"\xce", b"\xb1", b"\xce\xb1", b"\xce\xb1\xce", b"abc", b"c", b"",
              b"\xb1b", b"\xff", b"ba"]
    v = Vocab(pieces)
    g = Grammar('root ::= ("a" | "b" | "α")+ "c"?')
    m = Matcher(g, v)
    for step in [b"", b"a", b"\xce", b"\xb1", b"c"]:
        assert m.accept_bytes(step)
        assert (m.mask() == brute_force_mask(m, pieces)).all(), step
    assert m.accepting
    assert not m.mask().any()  # after "c" nothing more


def test_accept_token():
    pieces = [b"", b"{", b'"', b"}", b'"}', b"x"]
    m = Matcher(Grammar(JSON_GBNF), Vocab(pieces))
    assert not m.accept_token(0)  # no bytes: a control token is never allowed
    assert not m.accept_token(3)  # "}" cannot start JSON
    assert m.accept_token(1)  # {
    assert m.accept_token(4)  # '"}': a key that starts with "}"
    assert m.accept_token(2)  # closes the key
    assert not m.accept_token(3)  # the key needs a value
    assert not m.accepting
    with pytest.raises(ValueError):
        m.accept_token(6)


CATALOG = ["smollm2:135m", "gemma3:270m", "qwen2.5-coder:0.5b"]

MASK_STATES = [
    (JSON_GBNF, ['', '{', '{"na', '{"name": ', '{"a": [1, 2.', '{"k": "\u00e9\u4e2d', '{"k": "\xe4'.encode("latin-1"),
                 '[true, {"x": null}, -0']),
    (ARITH_GBNF, ["", "12", "(3 + ", "4.", "((1)) *"]),
    # text whose class leaves out a block of characters: whole subtrees of the trie loop on ASCII
    # but not on every character, so the walk must split them
    ('root ::= "<" ([^<>\u4e00-\u6fff\u0400-\u04ff] | "\u4e2d")* ">"', ["<", "<ab \u00e9"]),
]


@pytest.fixture(scope="module", params=CATALOG)
def model_vocab(request):
    import bubo
    from bubo import store
    tok = bubo.Tokenizer(store.pull(request.param))
    pieces = [tok.token_to_piece(i, False) for i in range(tok.n_vocab)]
    return request.param, tok, pieces, Vocab.from_tokenizer(tok)


def test_masks_match_brute_force_on_catalog_vocabularies(model_vocab):
    name, tok, pieces, vocab = model_vocab
    assert len(vocab) == tok.n_vocab
    for text, prefixes in MASK_STATES:
        g = Grammar(text)
        for prefix in prefixes:
            data = prefix if isinstance(prefix, bytes) else prefix.encode()
            if isinstance(prefix, bytes):  # '\xe4' in latin-1: the lead byte of a 3-byte character
                data = b'{"k": "' + b"\xe4"
            m = Matcher(g, vocab)
            assert m.accept_bytes(data), (name, data)
            got = m.mask()
            want = brute_force_mask(m, pieces)
            diff = np.nonzero(got != want)[0]
            assert diff.size == 0, (name, data, [(int(i), pieces[i], int(got[i])) for i in diff[:5]])
            assert got.any(), (name, data)
            # control tokens never
            for i in range(min(tok.n_vocab, 300)):
                if tok.is_control(i):
                    assert got[i] == 0


def test_masked_generation_always_parses(model_vocab):
    """Pick random allowed tokens until the matcher accepts: the text is valid JSON."""
    name, tok, pieces, vocab = model_vocab
    rng = random.Random(1234)
    g = Grammar('root ::= "{" ws "\\"k\\":" ws value ws "}"\n' + JSON_GBNF.replace("root   ::= ws value\n", ""))
    for _ in range(3):
        m = Matcher(g, vocab)
        out = random_walk(m, rng, pieces, 60, 0.2)
        if m.accepting:
            json.loads(out.decode())
        else:  # ran out of steps: the text must still be a live prefix
            assert Matcher(g).accept_bytes(out)


def test_none_for_a_native_object_is_a_type_error():
    """A matcher without a grammar (or a detokenizer without a tokenizer) would read its native
    handle out of None: refused as a TypeError before anything is read."""
    from bubo._tokenizer import Detokenizer

    with pytest.raises(TypeError):
        Matcher(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Detokenizer(None)  # type: ignore[arg-type]
