"""The reasoning and tool-call parser, on strings: whole and cut into every possible pair of pieces
(a streamed answer must parse as the whole one does)."""

import json

import pytest

from bubo.chat.parsers import OutputParser, parse_output, tool_format_of


def parse_streamed(text, step, **kw):
    p = OutputParser(**kw)
    parts = []
    for i in range(0, len(text), step):
        parts += p.feed(text[i:i + step])
    parts += p.finish()
    return (
        "".join(x.text for x in parts if x.kind == "reasoning"),
        "".join(x.text for x in parts if x.kind == "content"),
        [(c.call.name, json.loads(c.call.arguments)) for c in parts if c.call is not None],
    )


CASES = [
    # (text, kwargs, reasoning, content, calls)
    ("<think>Let me see.</think>\n\nHi there!", {}, "Let me see.", "Hi there!", []),
    ("Hi <think>there", {}, "", "Hi <think>there", []),
    (" blue, green", {}, "", " blue, green", []),  # a prefill's continuation keeps its space
    ("<think>unfinished", {}, "unfinished", "", []),
    ("so the answer is</think>42", {"in_think": True}, "so the answer is", "42", []),
    ("<think>x</think>y", {"reasoning": False}, "", "<think>x</think>y", []),
    ("plain text < with a lone bracket <", {}, "", "plain text < with a lone bracket <", []),
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
     {"tool_format": "hermes"}, "", "", [("get_weather", {"city": "Paris"})]),
    ('I will check.<tool_call>{"name": "a", "arguments": {}}</tool_call>\n'
     '<tool_call>{"name": "b", "arguments": {"x": 1}}</tool_call>',
     {"tool_format": "hermes"}, "", "I will check.", [("a", {}), ("b", {"x": 1})]),
    ('<tool_call>{"name": "f", "arguments": {"q": "é"}}', {"tool_format": "hermes"}, "", "", [("f", {"q": "é"})]),
    ("<tool_call>not json</tool_call>", {"tool_format": "hermes"}, "", "<tool_call>not json</tool_call>", []),
    ('<think>need weather</think><tool_call>{"name": "w", "arguments": {"c": "X"}}</tool_call>',
     {"tool_format": "hermes"}, "need weather", "", [("w", {"c": "X"})]),
    ('```json\n{\n  "name": "get_weather",\n  "arguments": {"city": "Paris"}\n}\n```', {"tool_format": "hermes"},
     "", "", [("get_weather", {"city": "Paris"})]),
    ('Try:\n```python\nprint(1)\n```\nDone.', {"tool_format": "hermes"},
     "", "Try:\n```python\nprint(1)\n```\nDone.", []),
    ('```json\n{"a": 1}\n```', {"tool_format": "hermes"}, "", '```json\n{"a": 1}\n```', []),
    ('```json\n{"name": "f", "arguments": {}}', {"tool_format": "hermes"}, "", "", [("f", {})]),
    ('{"name": "get_weather", "parameters": {"city": "Oslo"}}', {"tool_format": "llama3"}, "", "",
     [("get_weather", {"city": "Oslo"})]),
    ('<|python_tag|>{"name": "a", "parameters": {}}; {"name": "b", "parameters": {"y": 2}}',
     {"tool_format": "llama3"}, "", "", [("a", {}), ("b", {"y": 2})]),
    ("{not a call", {"tool_format": "llama3"}, "", "{not a call", []),
    ('[TOOL_CALLS][{"name": "m", "arguments": {"k": [1, 2]}}]', {"tool_format": "mistral"}, "", "",
     [("m", {"k": [1, 2]})]),
    ('Sure. [TOOL_CALLS][{"name": "m", "arguments": {}}]', {"tool_format": "mistral"}, "", "Sure. ", [("m", {})]),
    ("no calls here", {"tool_format": "mistral"}, "", "no calls here", []),
]


@pytest.mark.parametrize("text,kw,reasoning,content,calls", CASES)
def test_parse_whole_and_streamed(text, kw, reasoning, content, calls):
    r, c, tc = parse_output(text, **kw)
    assert (r, c, [(x.name, json.loads(x.arguments)) for x in tc]) == (reasoning, content, calls)
    for step in (1, 2, 3, 7):
        assert parse_streamed(text, step, **kw) == (reasoning, content, calls), step


def test_content_is_released_before_the_end():
    p = OutputParser(tool_format="hermes")
    assert [x.text for x in p.feed("Hello wor")] == ["Hello wor"]
    assert [x.text for x in p.feed("ld <tool")] == ["ld "]  # "<tool" could open a call: held back
    assert [x.text for x in p.feed("s are")] == ["<tools are"]
    assert p.finish() == []


def test_call_ids_are_unique_and_formats_detected():
    _, _, calls = parse_output('<tool_call>{"name": "a", "arguments": {}}</tool_call>' * 2, tool_format="hermes")
    assert calls[0].id != calls[1].id and calls[0].id.startswith("call_")
    assert tool_format_of("{% for t in tools %}<tool_call>{% endfor %}") == "hermes"
    assert tool_format_of("[TOOL_CALLS] ...") == "mistral"
    assert tool_format_of("<|python_tag|>") == "llama3"
    assert tool_format_of("{{ messages }}") is None


def test_max_calls_drops_later_calls():
    text = '<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>{"name": "b", "arguments": {}}</tool_call>'
    p = OutputParser(tool_format="hermes", max_calls=1)
    parts = p.feed(text) + p.finish()
    assert [x.call.name for x in parts if x.call] == ["a"]


@pytest.mark.parametrize("fmt,text,want", [
    ("hermes", '<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call><tool_call>\n'
               '{"name": "b", "arguments": {}}\n</tool_call>', [("a", {"x": 1}), ("b", {})]),
    ("mistral", '[TOOL_CALLS][{"name": "c", "arguments": {}}, {"name": "d", "arguments": {"z": [1]}}]',
     [("c", {}), ("d", {"z": [1]})]),
    ("llama3", '{"name": "e", "parameters": {"w": "v"}}', [("e", {"w": "v"})]),
    ("json", '{"name": "f", "arguments": {"q": null}}\n{"name": "g", "arguments": {} }',
     [("f", {"q": None}), ("g", {})]),
])
def test_what_a_forced_call_grammar_writes_parses(fmt, text, want):
    # the texts are sentences of bubo.chat.tools.call_grammar (tests/chat/test_tools.py checks that)
    for step in (1, 3, len(text)):  # streamed in pieces or whole: the same calls
        p = OutputParser(reasoning=False, tool_format=fmt)
        parts = [x for i in range(0, len(text), step) for x in p.feed(text[i:i + step])] + p.finish()
        assert [(x.call.name, json.loads(x.call.arguments)) for x in parts] == want
        assert all(x.kind == "tool_call" for x in parts)


@pytest.mark.parametrize("call", [
    ("hermes", '<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>'),
    ("json", '{"name": "a", "arguments": {}}'),
    ("llama3", '{"name": "a", "parameters": {}}'),
    ("mistral", '[TOOL_CALLS][{"name": "a", "arguments": {}}]'),
])
def test_a_forced_call_after_the_open_think_block(call):
    # what bubo.chat.thinking.answer_grammar lets a forced call be when the prompt opened <think>:
    # the calls are read after the reasoning in every format, not only in the tag-led ones
    fmt, written = call
    text = f"about the weather</think>\n\n{written}"
    for step in (1, len(text)):
        p = OutputParser(reasoning=True, tool_format=fmt, in_think=True)
        parts = [x for i in range(0, len(text), step) for x in p.feed(text[i:i + step])] + p.finish()
        assert "".join(x.text for x in parts if x.kind == "reasoning") == "about the weather"
        assert [x.call.name for x in parts if x.call] == ["a"]
        assert not [x for x in parts if x.kind == "content"]


def test_one_think_block_only():
    # after the reasoning, a second <think> is content (the block is read at the answer's start)
    p = OutputParser(reasoning=True)
    parts = p.feed("<think>a</think>\n<think>b</think>") + p.finish()
    assert [(x.kind, x.text) for x in parts] == [("reasoning", "a"), ("content", "<think>b</think>")]
