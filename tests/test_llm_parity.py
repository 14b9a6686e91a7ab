"""The library's bubo.Model does what the server does: grammar, json_schema and response_format
constrain complete() and chat(); tools come back as parsed calls (qwen2.5-coder:0.5b calls
get_weather on its own; tool_choice required on smollm2:135m, whose template knows no tools, gives
a valid call); a thinking template's reasoning is split off; and for the same greedy request the
library's answer is the server's (a real `bubo serve` process), errors included. A Model is a
context manager whose close() frees the native model and KV cache at once. The signatures list
every sampling field by name (no **kwargs), for IDEs."""

from __future__ import annotations

import dataclasses
import gc
import inspect
import json
import typing
from pathlib import Path

import jsonschema
import pytest
from api.conftest import start_server
from client import post_json

import bubo
from bubo.llm import SAMPLING_FIELDS, ChatCompletion, ChatStream, Model
from bubo.sampling import SamplingParams

from engines import THREADS
from reference.tiny import write_tiny_model

pytestmark = pytest.mark.models

GREEDY = {"temperature": 0}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city, e.g. Paris"}},
                   "required": ["city"]}}}
ADD = {"type": "function", "function": {
    "name": "add", "description": "Add two integers",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"], "additionalProperties": False}}}
PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
          "properties": {"name": {"type": "string", "maxLength": 20},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120}}}
TOKYO = [{"role": "user", "content": "What's the weather like in Tokyo right now?"}]
PARIS = [{"role": "user", "content": "Is it cold in Paris today?"}]
WHO = [{"role": "user", "content": "Describe a person as JSON with their name and age."}]
THINKING_TEMPLATE = Path(__file__).parent / "api" / "testdata" / "thinking_template.jinja"
FEW_SHOT = [
    {"role": "user", "content": "What is 1 + 1?"},
    {"role": "assistant", "content": "<think>\nOne plus one is two.\n</think>\n\n2"},
    {"role": "user", "content": "What is 2 + 2?"},
    {"role": "assistant", "content": "<think>\nTwo plus two is four.\n</think>\n\n4"},
    {"role": "user", "content": "What is 2 + 3?"},
]
SUM = {"type": "object", "additionalProperties": False, "required": ["answer"],
       "properties": {"answer": {"type": "integer", "minimum": 0, "maximum": 100}}}


@pytest.fixture(scope="module")
def smollm2():
    with bubo.Model("smollm2:135m", n_ctx=2048, n_threads=THREADS) as m:
        yield m


@pytest.fixture(scope="module")
def qwen():
    with bubo.Model("qwen2.5-coder:0.5b", n_ctx=2048, n_threads=THREADS) as m:
        yield m


@pytest.fixture(scope="module")
def thinker():
    """smollm2 under a template that thinks (the server's tests/api/testdata one)."""
    with bubo.Model("smollm2:135m", n_ctx=2048, n_threads=THREADS, chat_template=THINKING_TEMPLATE.read_text()) as m:
        yield m


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny random model (tests/reference/tiny.py) with a ChatML template: whatever it would
    write, its answers must keep to their grammar."""
    path = write_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny.gguf", "llama", types="F32", n_ctx=1024)
    with bubo.Model(path, n_ctx=1024, n_threads=1, chat_template=THINKING_TEMPLATE.read_text()) as m:
        yield m


def post(url: str, body: dict) -> tuple[int, dict]:
    status, _, answer = post_json(url, body)
    return status, answer

def server_chat(url: str, **body) -> dict:
    status, r = post(url + "/v1/chat/completions", {"model": "bubo", **body})
    assert status == 200, r
    return r


def assert_same_answer(c: ChatCompletion, r: dict, parallel: bool = False) -> None:
    """The library's ChatCompletion is the server's chat.completion: the same parts, the same
    finish, the same number of tokens (call ids are fresh on both sides). parallel: the request's
    parallel_tool_calls."""
    choice = r["choices"][0]
    msg = choice["message"]
    assert c.content == (msg["content"] or "")
    assert c.reasoning_content == (msg.get("reasoning_content") or "")
    assert [(t.name, t.arguments) for t in c.tool_calls] == [
        (t["function"]["name"], t["function"]["arguments"]) for t in msg.get("tool_calls") or []]
    assert c.finish_reason == choice["finish_reason"]
    if c.tool_calls and not parallel:
        # the answer ends once its call is whole: each side at the step where its reader's end()
        # reaches the engine thread, a step or two after the call on either side (a loaded
        # machine delays either reader); the answers above are the same
        assert abs(len(c.tokens) - r["usage"]["completion_tokens"]) <= 3, (len(c.tokens), r["usage"])
    else:
        assert len(c.tokens) == r["usage"]["completion_tokens"]
    assert c.prompt_tokens == r["usage"]["prompt_tokens"]
    shape = {k: v for k, v in c.message.items() if k != "tool_calls"}
    assert shape == {k: v for k, v in msg.items() if k != "tool_calls"}


# --- the signatures -----------------------------------------------------------------------


@pytest.mark.parametrize("method", ["generate", "complete", "chat", "chat_stream"])
def test_every_parameter_is_a_typed_keyword(method):
    """Every parameter but the prompt is keyword-only and typed; the sampling keywords are typed
    once, in SamplingOptions (tests/test_fields.py checks them against SamplingParams)."""
    fn = getattr(Model, method)
    sig = inspect.signature(fn)
    kinds = {p.kind for p in sig.parameters.values()}
    assert inspect.Parameter.VAR_POSITIONAL not in kinds
    hints = typing.get_type_hints(fn, include_extras=True)  # every annotation resolves (what an IDE shows)
    assert SAMPLING_FIELDS == tuple(f.name for f in dataclasses.fields(SamplingParams))
    assert list(typing.get_type_hints(typing.get_args(hints["options"])[0])) == list(SAMPLING_FIELDS)
    for name in ("max_tokens", "stop", "grammar", "json_schema", "response_format", "sampling"):
        assert sig.parameters[name].kind is inspect.Parameter.KEYWORD_ONLY
    if method.startswith("chat"):
        for name in ("tools", "tool_choice", "parallel_tool_calls", "thinking", "chat_template_kwargs"):
            assert sig.parameters[name].kind is inspect.Parameter.KEYWORD_ONLY
        assert sig.parameters["parallel_tool_calls"].default is False
    # generate and complete take the same keywords, chat and chat_stream too
    twin = {"generate": "complete", "complete": "generate", "chat": "chat_stream", "chat_stream": "chat"}[method]
    assert list(sig.parameters) == list(inspect.signature(getattr(Model, twin)).parameters)
    twin_hints = typing.get_type_hints(getattr(Model, twin), include_extras=True)
    assert {k: v for k, v in hints.items() if k != "return"} == {k: v for k, v in twin_hints.items() if k != "return"}


def test_sampling_keywords_reach_the_sampler(smollm2):
    """A sampling keyword changes the answer as the server's field does (a logit bias bans the
    greedy token; n_probs fills top_logprobs)."""
    plain = smollm2.complete("The capital of France is", max_tokens=4, **GREEDY)
    banned = smollm2.complete("The capital of France is", max_tokens=4, logit_bias={plain.tokens[0]: float("-inf")},
                              **GREEDY)
    assert banned.tokens[0] != plain.tokens[0]
    # a SamplingParams does the same, and keywords given beside it win
    given = SamplingParams(logit_bias={plain.tokens[0]: float("-inf")}, **GREEDY)
    assert smollm2.complete("The capital of France is", max_tokens=4, sampling=given).tokens == banned.tokens
    assert smollm2.complete("The capital of France is", max_tokens=4, sampling=given, logit_bias={}).tokens == \
        plain.tokens
    probs = smollm2.complete("The capital of France is", max_tokens=3, n_probs=5, **GREEDY)
    assert len(probs.top_logprobs) == 3 and all(len(t) == 5 for t in probs.top_logprobs)
    assert probs.top_logprobs[0][0][0] == plain.tokens[0]
    seeded = [smollm2.complete("Once upon a time", max_tokens=12, temperature=1.0, seed=7, top_k=50,
                               dry_multiplier=0.5, dry_sequence_breakers=["\n"]).tokens for _ in range(2)]
    assert seeded[0] == seeded[1]


# --- constrained answers ------------------------------------------------------------------


def test_json_schema_constrains_complete_and_chat(smollm2, qwen):
    c = smollm2.complete("A person, as JSON:", json_schema=PERSON, max_tokens=40, **GREEDY)
    jsonschema.validate(json.loads(c.text), PERSON)
    assert c.finish_reason == "stop"
    a = qwen.chat(WHO, json_schema=PERSON, max_tokens=40, **GREEDY)
    jsonschema.validate(json.loads(a.content), PERSON)
    assert a.content == a.text and a.tool_calls == [] and a.finish_reason == "stop"


def test_response_format_constrains(qwen, smollm2):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    a = qwen.chat(WHO, response_format=fmt, max_tokens=40, **GREEDY)
    jsonschema.validate(json.loads(a.content), PERSON)
    b = smollm2.chat(WHO, response_format={"type": "json_object"}, max_tokens=40, **GREEDY)
    assert isinstance(json.loads(b.content), dict)
    c = smollm2.complete("Some JSON:", response_format={"type": "json_object"}, max_tokens=30, **GREEDY)
    assert isinstance(json.loads(c.text), dict)
    # {"type": "text"} is no constraint: the same answer as none
    assert smollm2.chat(WHO, response_format={"type": "text"}, max_tokens=12, **GREEDY).text == \
        smollm2.chat(WHO, max_tokens=12, **GREEDY).text


def test_grammar_constrains(smollm2):
    g = 'root ::= ("yes" | "no") "."'
    c = smollm2.complete("Is the sky blue? Answer:", grammar=g, max_tokens=8, **GREEDY)
    assert c.text in ("yes.", "no.") and c.finish_reason == "stop"
    a = smollm2.chat([{"role": "user", "content": "Is the sky blue?"}], grammar=g, max_tokens=8, **GREEDY)
    assert a.content in ("yes.", "no.")
    from bubo._grammar import Grammar

    compiled = Grammar(g)
    assert smollm2.complete("Is the sky blue? Answer:", grammar=compiled, max_tokens=8, **GREEDY).text == c.text


def test_constraints_hold_on_a_random_model(tiny):
    """A random tiny model writes anything; the grammar keeps every answer valid and whole
    within max_tokens."""
    for seed in range(3):
        c = tiny.complete("x", json_schema=PERSON, max_tokens=48, temperature=1.0, seed=seed)
        jsonschema.validate(json.loads(c.text), PERSON)
        a = tiny.chat(WHO, json_schema=SUM, thinking=False, max_tokens=24, temperature=1.0, seed=seed)
        jsonschema.validate(json.loads(a.content), SUM)
        assert a.reasoning_content == ""
        t = tiny.chat(PARIS, tools=[WEATHER, ADD], tool_choice="required", thinking=False, max_tokens=48,
                      temperature=1.0, seed=seed)
        assert len(t.tool_calls) == 1 and t.finish_reason == "tool_calls"
        call = t.tool_calls[0]
        schema = {"get_weather": WEATHER, "add": ADD}[call.name]["function"]["parameters"]
        jsonschema.validate(call.parsed_arguments, schema)


# --- tools --------------------------------------------------------------------------------


def test_qwen_answers_a_weather_question_with_a_parsed_call(qwen):
    c = qwen.chat(TOKYO, tools=[WEATHER], max_tokens=64, **GREEDY)
    assert isinstance(c, ChatCompletion)
    assert [t.name for t in c.tool_calls] == ["get_weather"]
    call = c.tool_calls[0]
    assert call.parsed_arguments == {"city": "Tokyo"} and json.loads(call.arguments) == {"city": "Tokyo"}
    assert call.id.startswith("call_")
    assert c.finish_reason == "tool_calls" and c.content == ""
    assert "get_weather" in c.text  # the raw answer keeps what the model wrote
    assert c.message == {"role": "assistant", "content": None, "tool_calls": [call.to_dict()]}


def round_trip(qwen) -> list[dict]:
    """A weather question, the model's call (its message as the library gives it) and the tool's
    result: the messages of the turn after the call."""
    c = qwen.chat(TOKYO, tools=[WEATHER], max_tokens=64, **GREEDY)
    return TOKYO + [c.message, {"role": "tool", "tool_call_id": c.tool_calls[0].id,
                                "content": json.dumps({"city": "Tokyo", "temperature_c": 21, "sky": "sunny"})}]


def test_a_tool_round_trip(qwen):
    """The call's message goes back with the tool's result (arguments as JSON text, as OpenAI
    sends them): the template sees the arguments as an object, as the server renders them.
    (What the 0.5B model then answers is another call: tests/api/test_tool_recovery_server.py.)"""
    msgs = round_trip(qwen)
    assert isinstance(msgs[1]["tool_calls"][0]["function"]["arguments"], str)
    as_object = [msgs[0], {"role": "assistant", "content": "", "tool_calls": [
        {"id": msgs[2]["tool_call_id"], "type": "function",
         "function": {"name": "get_weather", "arguments": {"city": "Tokyo"}}}]}, msgs[2]]
    prompt = qwen.chat_prompt(as_object, tools=[WEATHER])
    assert '"arguments": {"city": "Tokyo"}' in prompt and "temperature_c" in prompt
    answer = qwen.chat(msgs, tools=[WEATHER], max_tokens=40, **GREEDY)
    assert answer.prompt_tokens == len(qwen.tokenize(prompt, parse_special=True))
    assert answer.finish_reason in ("stop", "tool_calls")


def test_tool_choice_required_on_smollm2_gives_a_valid_call(smollm2):
    c = smollm2.chat(PARIS, tools=[WEATHER, ADD], tool_choice="required", max_tokens=48, **GREEDY)
    assert len(c.tool_calls) == 1 and c.finish_reason == "tool_calls" and c.content == ""
    call = c.tool_calls[0]
    schema = {"get_weather": WEATHER, "add": ADD}[call.name]["function"]["parameters"]
    jsonschema.validate(call.parsed_arguments, schema)
    named = smollm2.chat(PARIS, tools=[WEATHER, ADD], max_tokens=48, **GREEDY,
                         tool_choice={"type": "function", "function": {"name": "add"}})
    assert [t.name for t in named.tool_calls] == ["add"]
    jsonschema.validate(named.tool_calls[0].parsed_arguments, ADD["function"]["parameters"])
    several = smollm2.chat(PARIS, tools=[WEATHER], tool_choice="required", parallel_tool_calls=True, max_tokens=64,
                           **GREEDY)
    assert several.tool_calls and all(t.name == "get_weather" for t in several.tool_calls)
    # "none": the tools are not shown and no call is read back
    none = smollm2.chat(PARIS, tools=[WEATHER], tool_choice="none", max_tokens=16, **GREEDY)
    assert none.tool_calls == [] and none.text == smollm2.chat(PARIS, max_tokens=16, **GREEDY).text


def test_chat_stream_yields_content_and_ends_with_the_calls(qwen, thinker):
    s = qwen.chat_stream(TOKYO, tools=[WEATHER], max_tokens=64, **GREEDY)
    assert isinstance(s, ChatStream)
    assert list(s) == []  # the answer is a call: no content
    c = s.completion()
    assert [t.name for t in c.tool_calls] == ["get_weather"] and c.finish_reason == "tool_calls"
    whole = qwen.chat(TOKYO, tools=[WEATHER], max_tokens=64, **GREEDY)
    assert (c.text, c.tool_calls[0].arguments) == (whole.text, whole.tool_calls[0].arguments)
    # a thinking answer: iteration is the content, parts() the reasoning and content as they come
    kw = dict(chat_template_kwargs={"open_think": True}, max_tokens=40, **GREEDY)
    s = thinker.chat_stream(FEW_SHOT, **kw)
    pieces = list(s)
    c = s.completion()
    assert "".join(pieces) == c.content and c.reasoning_content
    s = thinker.chat_stream(FEW_SHOT, **kw)
    parts = list(s.parts())
    assert "".join(p.text for p in parts if p.kind == "reasoning") == c.reasoning_content
    assert "".join(p.text for p in parts if p.kind == "content") == c.content
    assert thinker.chat(FEW_SHOT, **kw) == s.completion()


def test_thinking_splits_the_reasoning(thinker):
    on = thinker.chat(FEW_SHOT, chat_template_kwargs={"open_think": True}, json_schema=SUM, max_tokens=60, **GREEDY)
    assert on.reasoning_content.strip() and "</think>" in on.text
    jsonschema.validate(json.loads(on.content), SUM)
    off = thinker.chat(FEW_SHOT, thinking=False, max_tokens=20, **GREEDY)
    assert off.reasoning_content == "" and "<think>" not in off.content
    assert "<think>\n\n</think>" in thinker.chat_prompt(FEW_SHOT, enable_thinking=False)


# --- the same answers as the server ---------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2_server():
    with start_server("-np", "1") as s:
        yield s.wait_ready().url


@pytest.fixture(scope="module")
def qwen_server():
    with start_server("-np", "1", model="qwen2.5-coder:0.5b") as s:
        yield s.wait_ready().url


@pytest.fixture(scope="module")
def thinking_server():
    with start_server("--chat-template-file", str(THINKING_TEMPLATE), "-np", "1") as s:
        yield s.wait_ready().url


def test_qwen_chat_equals_the_servers(qwen, qwen_server):
    for msgs, kw in [(TOKYO, {"tools": [WEATHER]}),
                     (round_trip(qwen), {"tools": [WEATHER]}),
                     (WHO, {"response_format": {"type": "json_schema", "json_schema": {"schema": PERSON}}}),
                     (PARIS, {"tools": [WEATHER], "tool_choice": {"type": "function",
                                                                  "function": {"name": "get_weather"}}})]:
        r = server_chat(qwen_server, messages=msgs, max_tokens=48, **kw, **GREEDY)
        assert_same_answer(qwen.chat(msgs, max_tokens=48, **kw, **GREEDY), r, kw.get("parallel_tool_calls", False))


def test_smollm2_chat_and_completion_equal_the_servers(smollm2, smollm2_server):
    for msgs, kw in [(PARIS, {"tools": [WEATHER, ADD], "tool_choice": "required"}),
                     (PARIS, {"tools": [WEATHER], "tool_choice": "required", "parallel_tool_calls": True}),
                     (WHO, {"json_schema": PERSON}),
                     (PARIS, {"grammar": 'root ::= "It is " ("cold" | "warm") "."'})]:
        r = server_chat(smollm2_server, messages=msgs, max_tokens=48, **kw, **GREEDY)
        assert_same_answer(smollm2.chat(msgs, max_tokens=48, **kw, **GREEDY), r, kw.get("parallel_tool_calls", False))
    status, r = post(smollm2_server + "/completion", {"prompt": "A person, as JSON:", "json_schema": PERSON,
                                                      "n_predict": 40, "return_tokens": True, **GREEDY})
    assert status == 200, r
    c = smollm2.complete("A person, as JSON:", json_schema=PERSON, max_tokens=40, **GREEDY)
    assert (c.tokens, c.text) == (r["tokens"], r["content"])


def test_thinking_chat_equals_the_servers(thinker, thinking_server):
    for kw in [{"chat_template_kwargs": {"open_think": True}, "response_format": {"type": "json_object"}},
               {"chat_template_kwargs": {"open_think": True}}]:
        r = server_chat(thinking_server, messages=FEW_SHOT, max_tokens=40, **kw, **GREEDY)
        c = thinker.chat(FEW_SHOT, max_tokens=40, **kw, **GREEDY)
        assert c.reasoning_content
        assert_same_answer(c, r)
    r = server_chat(thinking_server, messages=FEW_SHOT, max_tokens=20, reasoning_effort="off", **GREEDY)
    assert_same_answer(thinker.chat(FEW_SHOT, thinking=False, max_tokens=20, **GREEDY), r)


def test_refusals_carry_the_servers_code_and_message(smollm2, smollm2_server):
    cases = [
        {"json_schema": {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}},
        {"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "object", "minProperties": 2}}}},
        {"grammar": "root ::= ("},
        {"json_schema": {"type": "object"}, "grammar": 'root ::= "x"'},
        {"tools": [WEATHER, WEATHER]},
        {"tools": [{"type": "function", "function": {"parameters": {"type": "object"}}}]},
        {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
        {"tool_choice": "required"},
        {"tools": [WEATHER], "tool_choice": "sometimes"},
        {"tools": [WEATHER], "tool_choice": "required", "json_schema": PERSON},
        {"chat_template_kwargs": {"enable_thinking": "yes"}},
    ]
    for kw in cases:
        status, r = post(smollm2_server + "/v1/chat/completions", {"model": "bubo", "messages": PARIS, **kw})
        assert status == 400, (kw, r)
        with pytest.raises(bubo.RequestError) as e:
            smollm2.chat(PARIS, **kw)
        assert isinstance(e.value, ValueError)
        assert (e.value.code, str(e.value)) == (r["error"]["code"], r["error"]["message"]), kw


# --- errors -------------------------------------------------------------------------------


def test_bad_input_is_a_clear_error_naming_the_parameter(smollm2):
    m = smollm2
    with pytest.raises(ValueError, match="give grammar or json_schema, not both"):
        m.complete("x", grammar='root ::= "a"', json_schema={"type": "object"})
    with pytest.raises(ValueError, match="give json_schema or response_format, not both"):
        m.chat(PARIS, json_schema={"type": "object"}, response_format={"type": "json_object"})
    from bubo._grammar import Grammar

    with pytest.raises(ValueError, match="give grammar or response_format, not both"):
        m.complete("x", grammar=Grammar('root ::= "a"'), response_format={"type": "json_object"})
    with pytest.raises(TypeError, match="chat.. takes grammar as GBNF text"):
        m.chat(PARIS, grammar=Grammar('root ::= "a"'))
    with pytest.raises(ValueError, match="^json_schema: /uniqueItems: keyword 'uniqueItems' cannot be enforced"):
        m.complete("x", json_schema={"type": "array", "uniqueItems": True})
    with pytest.raises(ValueError, match="^json_schema must be a JSON Schema"):
        m.complete("x", json_schema="object")
    with pytest.raises(ValueError, match="response_format must be"):
        m.complete("x", response_format={"type": "yaml"})
    with pytest.raises(ValueError, match="^grammar: "):
        m.complete("x", grammar="root ::= (")
    with pytest.raises(ValueError, match="temperature must be a finite number"):
        m.chat(PARIS, temperature="hot")
    with pytest.raises(ValueError, match=r"top_p must be in \[0.0, 1.0\]"):
        m.complete("x", top_p=2)
    with pytest.raises(TypeError, match="unexpected keyword argument 'temprature'"):
        m.chat(PARIS, temprature=0.5)
    with pytest.raises(ValueError, match="max_tokens must be a positive integer"):
        m.chat(PARIS, max_tokens=0)
    with pytest.raises(TypeError, match="stop must be a string or a list of strings"):
        m.complete("x", stop=[1])
    with pytest.raises(ValueError, match="messages must be a non-empty array"):
        m.chat([])
    with pytest.raises(ValueError, match=r"messages\[0\].role must be one of"):
        m.chat([{"role": "owl", "content": "hoo"}])
    with pytest.raises(ValueError, match="tools must be an array"):
        m.chat(PARIS, tools={"get_weather": WEATHER})
    with pytest.raises(ValueError, match=r"tools\[0\] has no name"):
        m.chat(PARIS, tools=[{"type": "function", "function": {}}])
    with pytest.raises(ValueError, match=r"tools\[0\] \('f'\): parameters must be the JSON Schema of an object"):
        m.chat(PARIS, tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}])
    with pytest.raises(ValueError, match="tool_choice names the function 'nope', which is not in tools"):
        m.chat(PARIS, tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}})
    with pytest.raises(ValueError, match="tool_choice forces a tool call"):
        m.chat(PARIS, tools=[WEATHER], tool_choice="required", grammar='root ::= "x"')
    with pytest.raises(TypeError, match="parallel_tool_calls must be True or False"):
        m.chat(PARIS, tools=[WEATHER], parallel_tool_calls="yes")
    with pytest.raises(TypeError, match="thinking must be True, False or None"):
        m.chat(PARIS, thinking="on")
    with pytest.raises(ValueError, match="enable_thinking turn thinking on but thinking turn it off"):
        m.chat(PARIS, thinking=False, chat_template_kwargs={"enable_thinking": True})
    with pytest.raises(TypeError, match="prompt must be text"):
        m.complete(3.5)


# --- the context manager and close() -------------------------------------------------------


def _native_objects() -> tuple[int, int]:
    from bubo import _model

    objs = gc.get_objects()
    return sum(type(o) is _model.Model for o in objs), sum(type(o) is _model.KVCache for o in objs)


def test_close_frees_the_native_model_at_once(tmp_path):
    path = write_tiny_model(tmp_path / "tiny.gguf", "llama", types="F32")
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()  # freed by reference counting, not by a later collection
    try:
        before = _native_objects()
        with Model(path, n_ctx=128, n_threads=1) as m:
            assert not m.closed and _native_objects() == (before[0] + 1, before[1] + 1)
            assert len(m.complete([1, 2, 3], max_tokens=4, ignore_eos=True, **GREEDY).tokens) == 4
            reading = m.generate([1, 2, 3], max_tokens=8, ignore_eos=True, **GREEDY)
            next(reading)
            unread = m.generate([4, 5], max_tokens=8)
            finished = m.generate([1, 2, 3], max_tokens=2, ignore_eos=True, **GREEDY)
            text = "".join(finished)  # (this one supersedes `reading`)
        assert m.closed and "closed" in repr(m)
        assert _native_objects() == before
    finally:
        if was_enabled:
            gc.enable()
    m.close()  # twice is fine
    for call in (lambda: m.complete("x"), lambda: m.chat(PARIS), lambda: m.tokenize("x"), lambda: m.n_vocab,
                 lambda: next(reading), lambda: next(unread), lambda: m.generate("x"), lambda: m.runtime):
        with pytest.raises(RuntimeError, match=r"this Model \(.*tiny.gguf\) was closed"):
            call()
    assert list(finished) == [] and finished.completion().text == text  # it had ended: it stays readable
    assert m.n_ctx == 128 and m.hparams["arch"] == "llama"  # what it was stays readable


def test_the_context_manager_closes_on_an_error(tmp_path):
    path = write_tiny_model(tmp_path / "tiny.gguf", "llama", types="F32")
    with pytest.raises(ValueError, match="max_tokens"), Model(path, n_ctx=64, n_threads=1) as m:
        m.complete("x", max_tokens=-1)
    assert m.closed
    with pytest.raises(RuntimeError, match="was closed"), m:
        pass


def test_the_package_exports_the_results():
    from bubo.chat.parsers import ToolCall

    assert bubo.ChatCompletion is ChatCompletion and issubclass(bubo.ChatCompletion, bubo.Completion)
    assert bubo.ToolCall is ToolCall and issubclass(bubo.RequestError, ValueError)
