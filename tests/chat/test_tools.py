"""Forced-call grammars (bubo.chat.tools): which texts they accept, in each template format."""

from __future__ import annotations

import pytest

from bubo._grammar import Grammar, Matcher
from bubo.chat.tools import ToolSchemaError, call_grammar, prefix_rules, text_without

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "ping"}},  # no parameters: an empty object
]
W = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
P = '{"name": "ping", "arguments": {}}'


def accepts(gbnf: str, text: str) -> bool:
    m = Matcher(Grammar(gbnf))
    return m.accept_bytes(text.encode()) and m.accepting


@pytest.mark.parametrize("fmt,one,two", [
    ("hermes", f"<tool_call>\n{W}\n</tool_call>", f"<tool_call>\n{W}\n</tool_call><tool_call>\n{P}\n</tool_call>"),
    ("mistral", f"[TOOL_CALLS][{W}]", f"[TOOL_CALLS][{W}, {P}]"),
    ("llama3", W.replace('"arguments"', '"parameters"'),
     "[" + W.replace('"arguments"', '"parameters"') + ", " + P.replace('"arguments"', '"parameters"') + "]"),
    ("json", W, f"[{W}, {P}]"),
])
def test_each_format_one_call_or_several(fmt, one, two):
    assert accepts(call_grammar(fmt, TOOLS, parallel=False), one)
    assert not accepts(call_grammar(fmt, TOOLS, parallel=False), two)
    assert accepts(call_grammar(fmt, TOOLS, parallel=True), one)
    assert accepts(call_grammar(fmt, TOOLS, parallel=True), two)
    assert not accepts(call_grammar(fmt, TOOLS), "Hello!")
    assert not accepts(call_grammar(fmt, TOOLS), "")


def test_arguments_follow_the_schema_and_the_name_is_one_of_the_tools():
    g = call_grammar("json", TOOLS)
    assert not accepts(g, '{"name": "get_weather", "arguments": {}}')  # city is required
    assert not accepts(g, '{"name": "get_weather", "arguments": {"city": 3}}')
    assert not accepts(g, '{"name": "ping", "arguments": []}')  # no parameters: still an object
    assert not accepts(g, '{"name": "other", "arguments": {}}')


def test_a_named_choice_allows_only_that_function():
    g = call_grammar("hermes", TOOLS, name="ping")
    assert accepts(g, f"<tool_call>\n{P}\n</tool_call>")
    assert not accepts(g, f"<tool_call>\n{W}\n</tool_call>")
    with pytest.raises(ValueError):
        call_grammar("hermes", TOOLS, name="nope")


def test_rules_are_prefixed_but_literals_and_classes_are_not():
    assert prefix_rules('root ::= "root ws" [a-z] ws\nws ::= " "*\n', "t0-") == \
        't0-root ::= "root ws" [a-z] t0-ws\nt0-ws ::= " "*\n'
    # every name the grammar parser takes (underscores, digits first), but not a repetition's
    # counts, an escape in a literal or a comment's words
    src = 'root ::= my_rule{2,3} 2nd # root\nmy_rule ::= "\\x41\\"" [\\]a]\n2nd ::= "x"{0,}\n'
    assert prefix_rules(src, "p-") == \
        'p-root ::= p-my_rule{2,3} p-2nd # root\np-my_rule ::= "\\x41\\"" [\\]a]\np-2nd ::= "x"{0,}\n'
    m = Matcher(Grammar(prefix_rules(src, "p-"), root="p-root"))
    assert m.accept_bytes(b'A"]A"a' + b"x") and m.accepting


def test_an_unenforceable_schema_names_the_tool():
    bad = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": "string", "pattern": "(?=a)"}}}}}]
    with pytest.raises(ToolSchemaError, match="'f'.*x"):
        call_grammar("hermes", bad)


def test_text_without_a_stop_string_is_kmp_exact():
    # a stop with borders (abab...): a naive "restart after a mismatch" would miss ababac
    rules = "\n".join(text_without("abac", "t"))
    g = f'root ::= t-0 "abac"\n{rules}\n'
    for text, ok in [("abac", True), ("ababac", True), ("aabac", True), ("abaabac", True),
                     ("abacabac", False), ("xabacyabac", False)]:
        assert accepts(g, text) == ok, text


def test_optional_properties_stay_optional():
    tools = [{"type": "function", "function": {"name": "w", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["city"]}}}]
    g = call_grammar("json", tools)
    assert accepts(g, '{"name": "w", "arguments": {"city": "Oslo"}}')
    assert accepts(g, '{"name": "w", "arguments": {"city": "Oslo", "unit": "c"}}')
    assert not accepts(g, '{"name": "w", "arguments": {"city": "Oslo", "unit": "k"}}')
