"""Reasoning that follows the request, on a template that thinks (testdata/thinking_template.jinja
over smollm2:135m, whose own template does not): thinking on lets the model reason; thinking off
renders the template with thinking disabled and, when the model opens a think block anyway or the
prompt opened one, closes it through the grammar, so that no reasoning comes back. Around a JSON
schema or a forced call the grammar puts the reasoning first and the constrained part after it.
Every case is the same split streamed and not.

The few-shot history (earlier answers that reason in <think> blocks) is what makes this small
model open a block of its own."""

from __future__ import annotations

import json
from pathlib import Path

import anthropic
import jsonschema
import openai
import pytest

from .conftest import start_server

pytestmark = pytest.mark.models

TEMPLATE = Path(__file__).parent / "testdata" / "thinking_template.jinja"
FEW_SHOT = [
    {"role": "user", "content": "What is 1 + 1?"},
    {"role": "assistant", "content": "<think>\nOne plus one is two.\n</think>\n\n2"},
    {"role": "user", "content": "What is 2 + 2?"},
    {"role": "assistant", "content": "<think>\nTwo plus two is four.\n</think>\n\n4"},
    {"role": "user", "content": "What is 3 + 3?"},
    {"role": "assistant", "content": "<think>\nThree plus three is six.\n</think>\n\n6"},
    {"role": "user", "content": "What is 2 + 3?"},
]
OPEN = {"open_think": True}  # the prompt ends inside <think> (DeepSeek-R1's way)
IGNORE = {"ignore_enable_thinking": True}  # the template writes no empty block when thinking is off
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["answer"],
          "properties": {"answer": {"type": "integer", "minimum": 0, "maximum": 100}}}
JSON_FORMAT = {"type": "json_schema", "json_schema": {"name": "sum", "schema": SCHEMA, "strict": True}}
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "additionalProperties": False, "required": ["a", "b"],
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}}]


@pytest.fixture(scope="module")
def server():
    with start_server("--chat-template-file", str(TEMPLATE), "-np", "1") as s:
        yield s.wait_ready()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


def chat(client, *, off=False, kwargs=None, **kw):
    """(raw text the model wrote, reasoning, content, message) of a greedy answer, after checking
    that streaming it gives the same reasoning, content and calls."""
    extra = {"chat_template_kwargs": kwargs} if kwargs else None
    args = dict(model="bubo", messages=FEW_SHOT, max_tokens=60, temperature=0, extra_body=extra, **kw)
    if off:
        args["reasoning_effort"] = "off"
    full = client.chat.completions.create(logprobs=True, **args)
    m = full.choices[0].message
    raw = "".join(t.token for t in full.choices[0].logprobs.content)
    reasoning = (m.model_extra or {}).get("reasoning_content")
    chunks = list(client.chat.completions.create(stream=True, **args))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    s_reasoning = "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas)
    assert s_reasoning == (reasoning or "")
    assert "".join(d.content or "" for d in deltas) == (m.content or "")
    calls = {}
    for d in deltas:
        for tc in d.tool_calls or []:
            c = calls.setdefault(tc.index, {"name": "", "arguments": ""})
            c["name"] += tc.function.name or ""
            c["arguments"] += tc.function.arguments or ""
    assert list(calls.values()) == [{"name": c.function.name, "arguments": c.function.arguments}
                                    for c in m.tool_calls or []]
    return raw, reasoning, m.content, m


def test_thinking_on_the_model_reasons_in_its_own_block(client):
    raw, reasoning, content, _ = chat(client)
    assert raw.startswith("<think>") and reasoning and reasoning.strip()
    assert content and "<think>" not in content and "</think>" not in content


def test_thinking_off_renders_the_template_without_thinking(client):
    raw, reasoning, content, _ = chat(client, off=True)
    assert reasoning is None and content and not raw.startswith("<think>")


def test_thinking_off_closes_a_block_the_model_opens_anyway(client):
    # the template ignores the switch: the model opens <think> as in the history (thinking on
    # shows that it does), and the grammar closes the block at once. What the model writes after
    # the empty block is its answer (this small one goes on in its reasoning's words, and may
    # write a </think> of its own: content like any other text)
    raw_on, reasoning_on, _, _ = chat(client, kwargs=IGNORE)
    assert raw_on.startswith("<think>\n") and reasoning_on.strip()
    raw, reasoning, content, _ = chat(client, off=True, kwargs=IGNORE)
    assert raw.startswith("<think></think>")
    assert reasoning is None and content and not content.startswith("<think>")
    assert raw.removeprefix("<think></think>").strip().removesuffix("<|im_end|>").strip() == content


def test_thinking_off_closes_the_block_the_prompt_opened(client):
    raw_on, reasoning_on, _, _ = chat(client, kwargs=OPEN)
    assert not raw_on.startswith("</think>") and reasoning_on.strip()
    raw, reasoning, content, _ = chat(client, off=True, kwargs=OPEN)
    assert raw.startswith("</think>") and reasoning is None
    assert raw.removeprefix("</think>").strip().removesuffix("<|im_end|>").strip() == (content or "")


@pytest.mark.parametrize("kwargs", [None, OPEN, IGNORE], ids=["model-opens", "prompt-opens", "no-switch"])
@pytest.mark.parametrize("off", [False, True], ids=["on", "off"])
def test_a_json_schema_answer_after_the_reasoning(client, kwargs, off):
    raw, reasoning, content, m = chat(client, off=off, kwargs=kwargs, response_format=JSON_FORMAT)
    jsonschema.validate(json.loads(content), SCHEMA)  # the content is the JSON, never inside reasoning
    if off:
        assert reasoning is None and "think>" not in content
        if kwargs is OPEN:
            assert raw.startswith("</think>")
    elif kwargs is OPEN or raw.startswith("<think>"):
        assert reasoning and reasoning.strip()


@pytest.mark.parametrize("off", [False, True], ids=["on", "off"])
def test_a_forced_call_after_the_block_the_prompt_opened(client, off):
    raw, reasoning, content, m = chat(client, off=off, kwargs=OPEN, tools=TOOLS, tool_choice="required",
                                      parallel_tool_calls=False)
    assert [c.function.name for c in m.tool_calls] == ["add"] and not content
    jsonschema.validate(json.loads(m.tool_calls[0].function.arguments), TOOLS[0]["function"]["parameters"])
    if off:
        assert raw.startswith("</think>") and reasoning is None


def test_anthropic_thinking_disabled_closes_the_block(server):
    c = anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0)
    # (this SDK version has no temperature argument: sent as an extra field)
    args = dict(model="bubo", max_tokens=60, messages=FEW_SHOT,
                extra_body={"chat_template_kwargs": OPEN, "temperature": 0})
    on = c.messages.create(**args)
    assert on.content[0].type == "thinking" and on.content[0].thinking.strip()
    off = c.messages.create(thinking={"type": "disabled"}, **args)
    assert all(b.type != "thinking" for b in off.content)
    with c.messages.stream(thinking={"type": "disabled"}, **args) as s:
        streamed = s.get_final_message()
    assert [b.model_dump() for b in streamed.content] == [b.model_dump() for b in off.content]


def test_responses_reasoning_effort_none_closes_the_block(client):
    args = dict(model="bubo", input=FEW_SHOT, max_output_tokens=60, extra_body={"chat_template_kwargs": OPEN})
    on = client.responses.create(**args)
    assert [i.type for i in on.output][0] == "reasoning"
    off = client.responses.create(reasoning={"effort": "none"}, **args)
    assert all(i.type != "reasoning" for i in off.output)


def test_reasoning_format_none_leaves_the_block_in_the_content(client, server):
    """llama-server's reasoning_format: none (the request's field, or the server's flag that a
    request's own value overrides) gives the answer as the model wrote it, <think> block and all."""
    _, reasoning, content, _ = chat(client)
    args = dict(model="bubo", messages=FEW_SHOT, max_tokens=60, temperature=0)
    m = client.chat.completions.create(extra_body={"reasoning_format": "none"}, **args).choices[0].message
    assert (m.model_extra or {}).get("reasoning_content") is None
    assert m.content.startswith("<think>") and reasoning.strip() in m.content and m.content.endswith(content)
    bad = client.chat.completions.with_raw_response.create
    with pytest.raises(openai.BadRequestError, match="reasoning_format must be one of none, deepseek"):
        bad(extra_body={"reasoning_format": "xml"}, **args)
    with start_server("--chat-template-file", str(TEMPLATE), "-np", "1", "--reasoning-format", "none") as s:
        flagged = openai.OpenAI(base_url=s.wait_ready().url + "/v1", api_key="none", max_retries=0)
        assert flagged.chat.completions.create(**args).choices[0].message.content == m.content
        split = flagged.chat.completions.create(extra_body={"reasoning_format": "deepseek"}, **args).choices[0]
        assert (split.message.model_extra or {}).get("reasoning_content") == reasoning
        assert split.message.content == content
