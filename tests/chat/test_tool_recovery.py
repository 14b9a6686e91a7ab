"""Calls recovered when a model drops its template's markers (a bare JSON answer that names a
given tool with valid arguments), one call unless more are asked for, complete calls kept when a
cut ends the answer, and the generic tool prompt of templates that show no tools."""

from __future__ import annotations

import json

import pytest

from bubo.chat.parsers import OutputParser, ToolBook, parse_output
from bubo.chat.tools import call_grammar, generic_tool_messages
from bubo.chat.validate import first_error

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"enum": ["c", "f"]}},
                   "required": ["city"], "additionalProperties": False}}}
ADD = {"type": "function", "function": {
    "name": "add", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                                  "required": ["a", "b"]}}}
BOOK = ToolBook([WEATHER, ADD])
PARIS = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
ROME = '{"name": "get_weather", "arguments": {"city": "Rome"}}'


def run(text: str, *, pieces: int = 1, cut: bool = False, **kw) -> tuple[str, list[tuple[str, dict]], bool]:
    """(content, calls, done) of text fed in pieces of `pieces` characters."""
    kw.setdefault("tool_format", "hermes")
    kw.setdefault("tools", BOOK)
    p = OutputParser(**kw)
    parts = []
    for i in range(0, len(text), pieces):
        parts += p.feed(text[i:i + pieces])
    parts += p.finish(cut)
    content = "".join(x.text for x in parts if x.kind == "content")
    calls = [(x.call.name, json.loads(x.call.arguments)) for x in parts if x.call is not None]
    return content, calls, p.done


@pytest.mark.parametrize("text", [
    PARIS,
    "  \n" + PARIS + "\n",
    "```json\n" + PARIS + "\n```",
    "```\n" + PARIS + "\n```\n",
    "```json\n{\n  \"name\": \"get_weather\",\n  \"arguments\": {\n    \"city\": \"Paris\"\n  }\n}\n```",
    '{"name": "get_weather", "parameters": {"city": "Paris"}}',
    '{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}',
    "[" + PARIS + "]",
])
@pytest.mark.parametrize("pieces", [1, 3, 1000])
def test_a_bare_json_call_is_a_call_streamed_or_not(text, pieces):
    content, calls, _ = run(text, pieces=pieces)
    assert (content, calls) == ("", [("get_weather", {"city": "Paris"})])


@pytest.mark.parametrize("text", [
    '{"name": "get_time", "arguments": {}}',  # no such tool
    '{"name": "get_weather", "arguments": {"town": "Paris"}}',  # invalid: additionalProperties false
    '{"name": "get_weather", "arguments": {}}',  # invalid: city is required
    '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "k"}}',  # invalid enum value
    '{"name": "add", "arguments": {"a": 1, "b": "2"}}',  # b is no integer
    '{"name": "get_weather", "arguments": {"city": "Paris"}, "why": "x"}',  # not a call object
    '{"answer": 42}',
    '[1, 2, 3]',
    "```json\n{\"name\": \"get_time\", \"arguments\": {}}\n```",
    "```python\nprint('hi')\n```",
    PARIS + " is what I would call.",  # text after the call: the whole answer is no call
    "The call would be " + PARIS,
])
@pytest.mark.parametrize("pieces", [1, 1000])
def test_anything_else_stays_content_unchanged(text, pieces):
    content, calls, _ = run(text, pieces=pieces, max_calls=None)
    if text.startswith(PARIS + " "):  # a valid call, then text: the call, then the text
        assert calls == [("get_weather", {"city": "Paris"})] and content == " is what I would call."
        return
    assert (content, calls) == (text, [])


def test_nothing_leaks_as_content_before_the_call_is_decided():
    p = OutputParser(tool_format="hermes", tools=BOOK)
    shown = []
    for ch in "```json\n" + PARIS[:-1]:
        shown += p.feed(ch)
    assert shown == []  # held back while it could still be a call
    parts = p.feed("}") + p.feed("\n```") + p.finish()
    assert [x.kind for x in parts] == ["tool_call"]


def test_without_the_book_a_bare_json_answer_is_content():
    content, calls, _ = run(PARIS, tools=None)
    assert (content, calls) == (PARIS, [])


def test_one_call_by_default_ends_the_answer():
    for text in (PARIS + "\n" + ROME, "[" + PARIS + ", " + ROME + "]",
                 "<tool_call>\n" + PARIS + "\n</tool_call>\n<tool_call>\n" + ROME + "\n</tool_call>"):
        content, calls, done = run(text, max_calls=1)
        assert (content, calls, done) == ("", [("get_weather", {"city": "Paris"})], True), text
        content, calls, done = run(text)
        assert calls == [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Rome"})] and not done


def test_the_answer_after_the_call_is_dropped_once_done():
    p = OutputParser(tool_format="hermes", tools=BOOK, max_calls=1)
    parts = p.feed("<tool_call>\n" + PARIS + "\n</tool_call> and some text")
    assert [x.kind for x in parts] == ["tool_call"] and p.done
    assert p.feed("more") == [] and p.finish() == []


@pytest.mark.parametrize("text,fmt,tools", [
    (PARIS + "\n" + ROME[:30], "hermes", BOOK),
    ("[" + PARIS + ", " + ROME[:30], "hermes", BOOK),
    ("```json\n[" + PARIS + ", " + ROME[:25], "hermes", BOOK),
    ("<tool_call>\n" + PARIS + "\n</tool_call>\n<tool_call>\n" + ROME[:30], "hermes", None),
    ("[" + PARIS + ", " + ROME[:30], "json", None),
    ("[TOOL_CALLS][" + PARIS + ", " + ROME[:30], "mistral", None),
    ("<|python_tag|>" + PARIS.replace("arguments", "parameters") + "; " + ROME[:30], "llama3", None),
])
def test_a_cut_keeps_the_complete_calls_and_drops_the_cut_one(text, fmt, tools):
    for pieces in (1, 1000):
        content, calls, _ = run(text, pieces=pieces, cut=True, tool_format=fmt, tools=tools)
        assert (content, calls) == ("", [("get_weather", {"city": "Paris"})]), (text, pieces)


def test_a_cut_answer_that_is_no_call_stays_content():
    content, calls, _ = run('{"answer": "it is a long', cut=True)
    assert (content, calls) == ('{"answer": "it is a long', [])
    content, calls, _ = run('{"name": "get_time", "arguments": {"x"', cut=True)  # no such tool
    assert calls == [] and content == '{"name": "get_time", "arguments": {"x"'


def test_a_call_a_brace_short_at_the_end_is_healed_but_not_one_cut_in_a_string():
    assert run(PARIS[:-1])[:2] == ("", [("get_weather", {"city": "Paris"})])
    assert run(PARIS[:-8]) == (PARIS[:-8], [], False)  # ends inside "Paris": shown as written
    assert run(PARIS[:-1], cut=True)[:2] == ("", [])  # cut: dropped


def test_space_between_and_after_calls_is_no_content():
    content, calls, _ = run("<tool_call>\n" + PARIS + "\n</tool_call>\n\n", tools=None)
    assert (content, len(calls)) == ("", 1)
    content, _, _ = run("<tool_call>\n" + PARIS + "\n</tool_call>\nDone.", tools=None)
    assert content == "\nDone."


def test_parse_output_agrees_with_the_stream():
    for text in (PARIS, "```json\n" + PARIS + "\n```", '{"answer": 1}'):
        r, c, calls = parse_output(text, tool_format="hermes", tools=BOOK)
        assert (c, [(x.name, json.loads(x.arguments)) for x in calls]) == run(text)[:2]


def test_the_parallel_json_format_is_a_list_with_a_natural_end():
    g = call_grammar("json", [WEATHER, ADD], parallel=True)
    assert 'root ::= call | "[" calls "]"' in g
    from bubo._grammar import Grammar, Matcher

    m = Matcher(Grammar(g))
    assert m.accept_bytes(("[" + PARIS + ", " + ROME + "]").encode()) and m.accepting
    one = Matcher(Grammar(call_grammar("json", [WEATHER, ADD], parallel=False)))
    assert one.accept_bytes(PARIS.encode()) and one.accepting and not one.accept_bytes(b"\n")


def test_the_generic_tool_prompt():
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "18C"}]
    out = generic_tool_messages(msgs, [WEATHER, ADD])
    assert out[0]["role"] == "system" and out[0]["content"].startswith("Be brief.\n\n")
    assert '"name": "get_weather"' in out[0]["content"] and '"name": "add"' in out[0]["content"]
    assert out[2] == {"role": "assistant", "content": PARIS}  # the earlier call as the model writes one
    assert out[3] == msgs[3] and msgs[2]["tool_calls"]  # the request's messages are not changed
    assert generic_tool_messages(msgs[1:2], [WEATHER])[0]["role"] == "system"


@pytest.mark.parametrize("instance,schema,ok", [
    ({"a": 1}, {"type": "object", "properties": {"a": {"type": "integer"}}}, True),
    ({"a": 1.0}, {"type": "object", "properties": {"a": {"type": "integer"}}}, True),
    ({"a": True}, {"type": "object", "properties": {"a": {"type": "integer"}}}, False),
    ({"a": "x"}, {"properties": {"a": {"minLength": 2}}}, False),
    ([1, 1], {"uniqueItems": True}, False),
    ([1, 1], {"uniqueItems": False}, True),
    ({"d": "2024-02-30"}, {"properties": {"d": {"format": "date"}}}, False),
    ({"d": "2024-02-29"}, {"properties": {"d": {"format": "date"}}}, True),
    ({"n": {"n": {"v": 1}}}, {"$defs": {"t": {"type": "object", "properties": {"n": {"$ref": "#/$defs/t"},
                                                                                 "v": {"type": "string"}}}},
                              "$ref": "#/$defs/t"}, False),
    ({"x": 3}, {"properties": {"x": {"oneOf": [{"type": "integer"}, {"type": "number"}]}}}, False),
    ({"x": 3}, {"properties": {"x": {"not": {"type": "string"}}}}, True),
    ({"k": 1}, {"additionalProperties": False, "patternProperties": {"^k": {"type": "integer"}}}, True),
    ({"kind": "a"}, {"if": {"properties": {"kind": {"const": "a"}}}, "then": {"required": ["v"]}}, False),
    # integers past a float's range, as a model may write them: exact, not an OverflowError
    ({"x": 10 ** 400}, {"properties": {"x": {"multipleOf": 3}}}, False),
    ({"x": 3 * 10 ** 400}, {"properties": {"x": {"multipleOf": 3}}}, True),
])
def test_the_validator_agrees_with_jsonschema(instance, schema, ok):
    import jsonschema

    v = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    assert v.is_valid(instance) == ok
    assert (first_error(instance, schema) is None) == ok


@pytest.mark.models
def test_a_template_that_shows_no_tools_gets_the_generic_prompt_and_says_so_once(catalog_model, caplog):
    import logging

    from bubo.runtime import Runtime

    smol = Runtime(catalog_model("smollm2:135m"), n_threads=1)
    ask = [{"role": "user", "content": "Weather in Paris?"}]
    with caplog.at_level(logging.INFO, logger="bubo.runtime"):
        with_tools = smol.chat_text(ask, tools=[WEATHER]).text
        again = smol.chat_text(ask, tools=[WEATHER, ADD]).text
    assert sum("generic tool prompt" in r.getMessage() for r in caplog.records) == 1
    assert not smol.template_shows_tools()
    # smollm2's own template renders the same text with or without tools; bubo's section lists them
    assert smol.chat_prompt(ask, tools=[WEATHER]) == smol.chat_prompt(ask)
    assert '"name": "get_weather"' in with_tools and "To call a function, answer with only a JSON object" in with_tools
    assert '"name": "add"' in again and with_tools != smol.chat_text(ask).text
    qwen = Runtime(catalog_model("qwen2.5-coder:0.5b"), n_threads=1)
    assert qwen.template_shows_tools()
    assert "To call a function, answer with only" not in qwen.chat_text(ask, tools=[WEATHER]).text
