"""A large JSON text parsed in pieces (bubo.api.jsonin._pieces, bubo._jsonsplit): the value of
one call of json's parser, every call of it reading a bounded run of the text, and for malformed
text an error at the same place with json's message (a bracket or string that never closes is
named by the split itself)."""

from __future__ import annotations

import json
import random

import pytest

from bubo import _jsonsplit
from bubo.api import jsonin

SIZES = ((1, 1), (3, 5), (20, 10), (50, 1))  # (large, run): cut everywhere, and less
SPLIT_NAMES = ("Unmatched", "Unclosed", "Unterminated string")


def outcome(parse, text):
    """("ok", the value as JSON text: its keys' order and its numbers' types count), or the error."""
    try:
        return "ok", json.dumps(parse(text))
    except json.JSONDecodeError as e:
        return "error", e.msg, e.pos
    except jsonin.JSONInputError as e:
        return "input", e.message
    except RecursionError:
        return "recursion",
    except ValueError:  # an integer past Python's 4,300 digits
        return "digits",


def whole(text):
    return jsonin._decoder().decode(text)


def pieces(large, run):
    return lambda text: jsonin._pieces(text, large, run)


SCALARS = [1, -2.5, 0, "s", 'a"b\\', "é€😀", "\u2028", True, False, None, 10 ** 30, "", "x,y:[z]{"]


def value(rng, depth=0):
    r = rng.random()
    if depth > 5 or r < 0.35:
        return rng.choice(SCALARS)
    if r < 0.7:
        return [value(rng, depth + 1) for _ in range(rng.randint(0, 8))]
    return {rng.choice(["k", "a", "é", 'b"', "", f"k{rng.randint(0, 9)}"]): value(rng, depth + 1)
            for _ in range(rng.randint(0, 8))}


def text_of(rng, v):
    return json.dumps(v, ensure_ascii=rng.random() < 0.5, indent=rng.choice([None, None, 1, "\t"]),
                      separators=rng.choice([None, (",", ":"), (" , ", " : ")]))


EDITS = ["", ",", "]", "}", "[", "{", '"', ":", " ", "x", "1", "\\", "\n", "tru", ",,", '"k":', "NaN", "1e999999"]


def mutated(rng, text):
    for _ in range(rng.randint(1, 3)):
        i = rng.randint(0, len(text))
        op = rng.random()
        if op < 0.4:
            text = text[:i] + rng.choice(EDITS) + text[i:]
        elif op < 0.8:
            text = text[:i] + text[i + rng.randint(1, 3):]
        else:
            text = text[:i] + rng.choice(EDITS) + text[i + 1:]
    return text


@pytest.mark.parametrize("seed", range(4))
def test_the_pieces_give_jsons_value_or_its_error(seed):
    rng = random.Random(seed)
    split_named = 0
    for _ in range(400):
        text = text_of(rng, value(rng))
        if rng.random() < 0.6:
            text = mutated(rng, text)
        want = outcome(whole, text)
        for large, run in SIZES:
            got = outcome(pieces(large, run), text)
            if got[0] == "error" and got[1].startswith(SPLIT_NAMES) and want[0] != "ok":
                split_named += 1  # a bracket or string that never closes, named where the split finds it
                continue
            assert got == want, (text, large, run)
    assert split_named  # the corpus holds such texts


CASES = [
    "[" + " " * 40 + "]",  # a large container that is empty
    "{" + "\n" * 40 + "}",
    "[" + "1, " * 30 + "]",  # a comma after the last member
    '{"a": [' + "1," * 30 + '1], "b": 2,}',
    '{"a": 1, "a": [' + "2," * 30 + '2], "b": 3, "a": 4}',  # the last of a repeated key, in the first one's place
    '{"a": 1, "b": 0, "a": [' + "2," * 30 + "2]}",
    '{"a": [' + "2," * 30 + '2], "b": 0, "a": 1}',
    '{"z": 0, "y": [' + "2," * 30 + '2], "x": 1, "w": {' + '"v": 1,' * 30 + '"u": 2}}',
    "[" + "1, " * 30 + "[" + "2," * 30 + "2]]",
    "[" + "1, " * 30 + "2 [" + "2," * 30 + "2]]",  # no comma before a large member
    "[[" + "2," * 30 + "2] 3, 4]",  # nor after it
    '{"k" [' + "2," * 30 + "2]}",
    '{"k": 1 "j": [' + "2," * 30 + "2]}",
    '{k: [' + "2," * 30 + "2]}",
    '{"k\\u00e9\\n": [' + "2," * 30 + "2]}",
    '{"k\\x": [' + "2," * 30 + "2]}",
    "  [" + "1," * 30 + "1]  ",
    "[" + "1," * 30 + "1] [1]",  # extra data after the text's value
    "1 [" + "1," * 30 + "1]",  # and before a large one
    '"é😀" [' + "1," * 30 + "1]",
    "[" + "1," * 30 + ",1]",
    "[,1," + "1," * 30 + "1]",
    '["é😀", ' + "1," * 30 + "tru]",  # an error inside a run, after text of several bytes a character
    "[" * 200 + "]" * 200,
    "[" * 129 + "]" * 129,
    "[[" + "1," * 30 + "NaN]]",
    "[" + "1," * 30 + "1" * 5000 + "]",
]


@pytest.mark.parametrize("text", CASES, ids=range(len(CASES)))
def test_edges_of_the_pieces(text):
    want = outcome(whole, text)
    for large, run in SIZES:
        got = outcome(pieces(large, run), text)
        if text.startswith("[" * (jsonin.MAX_DEPTH + 2)):  # parse's own bound, before any parser runs
            assert got == ("input", "the JSON nests arrays and objects deeper than 128 levels"), got
        else:
            assert got == want, (large, run)


def test_brackets_and_strings_that_do_not_close_are_named():
    assert outcome(jsonin._pieces, '["é", "x]') == ("error", "Unterminated string starting at", 6)
    assert outcome(pieces(1, 1), "[1, 2}") == ("error", "Unmatched '}'", 5)
    assert outcome(pieces(1, 1), "[1, {2]") == ("error", "Unmatched ']'", 6)
    assert outcome(pieces(1, 1), "[1, [2]") == ("error", "Unclosed '['", 0)
    assert outcome(pieces(1, 1), '"a\\"') == ("error", "Unterminated string starting at", 0)
    with pytest.raises(jsonin.JSONInputError, match="line 1 column 5"):  # through parse: where it is
        jsonin.parse("[1, " + "[" * 2 + "2" * jsonin.SPLIT_CHARS + "]")


def test_the_split_counts_characters_not_bytes():
    text = '["é😀", ["\\"é", {"ü": 1}], "\\\\", 2]'
    ascii_text = "".join(c if c.isascii() else "x" for c in text)  # the same characters, a byte each
    pieces, why, where = _jsonsplit.split(text.encode(), 1, 1, 10)
    assert (pieces, why, where) == _jsonsplit.split(ascii_text.encode(), 1, 1, 10)
    assert [(k, text[a], text[b]) for k, a, b in pieces] == [
        (0, "[", "]"), (1, '"', ","), (0, "[", "]"), (1, '"', ","), (0, "{", "}"), (1, '"', "}"), (2, "}", "}"),
        (2, "]", "]"), (1, " ", ","), (1, " ", "]"), (2, "]", "]")]
    assert _jsonsplit.split(b"[[[]]]", 1, 1, 2) == ([], _jsonsplit.TOO_DEEP, 2)
    assert _jsonsplit.split(b"", 1, 1, 2) == ([], 0, -1)
    assert _jsonsplit.split(b"[1, 2]", 100, 100, 2) == ([], 0, -1)  # nothing large: one call
    with pytest.raises(ValueError):
        _jsonsplit.split(b"[]", 0, 1, 2)


def test_large_means_at_least_large_characters_and_a_run_ends_at_run_characters():
    # "[1]" is 3 characters: large at 3 cuts it, at 4 it is one piece
    assert _jsonsplit.split(b"[1]", 3, 1, 2)[0] == [(0, 0, 2), (1, 1, 2), (2, 2, 2)]
    assert _jsonsplit.split(b"[1]", 4, 1, 2)[0] == []
    # a run ends at the first of its own commas run or more characters past its start
    assert _jsonsplit.split(b"[11,2,3]", 1, 2, 2)[0] == [(0, 0, 7), (1, 1, 3), (1, 4, 7), (2, 7, 7)]
    assert _jsonsplit.split(b"[11,2,3]", 1, 3, 2)[0] == [(0, 0, 7), (1, 1, 5), (1, 6, 7), (2, 7, 7)]


def test_a_large_body_is_parsed_a_bounded_run_at_a_time(monkeypatch):
    schema = {"type": "object", "properties": {f"k{i}": {"type": "integer"} for i in range(30_000)},
              "required": [f"k{i}" for i in range(30_000)]}
    value = {"prompt": "x" * 100, "tokens": [[i, i + 1] for i in range(20_000)], "json_schema": schema}
    text = json.dumps(value)
    assert len(text) > 4 * jsonin.SPLIT_CHARS
    read: list[int] = []
    decoder = jsonin._decoder()
    real = decoder.decode
    monkeypatch.setattr(decoder, "decode", lambda s: read.append(len(s)) or real(s))
    assert jsonin.parse(text) == value
    assert len(read) > 10 and max(read) <= 2 * jsonin.RUN_CHARS + 2, (len(read), max(read))
    # below SPLIT_CHARS: one call
    read.clear()
    assert jsonin.parse(json.dumps(value["tokens"][:100])) == value["tokens"][:100]
    assert len(read) == 1
