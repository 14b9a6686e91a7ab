"""Tool use on qwen2.5-coder:0.5b through the `anthropic` SDK: a tool_use block (non-streamed,
and streamed as input_json_delta), then a round trip with a tool_result."""

import anthropic
import pytest

from .conftest import start_server

pytestmark = pytest.mark.models

TOOLS = [{"name": "get_weather", "description": "Get the current weather in a city",
          "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def client():
    with start_server(model="qwen2.5-coder:0.5b") as s:
        s.wait_ready()
        yield anthropic.Anthropic(base_url=s.url, api_key="none", max_retries=0, timeout=120)


def test_tool_use_round_trip(client):
    msg = client.messages.create(model="bubo", max_tokens=64, messages=ASK, tools=TOOLS, extra_body=GREEDY)
    assert msg.stop_reason == "tool_use"
    (use,) = [b for b in msg.content if b.type == "tool_use"]
    assert use.name == "get_weather" and use.input == {"city": "Paris"} and use.id.startswith("toolu_")

    with client.messages.stream(model="bubo", max_tokens=64, messages=ASK, tools=TOOLS, extra_body=GREEDY) as s:
        deltas = [ev.delta.type for ev in s if ev.type == "content_block_delta"]
        final = s.get_final_message()
    assert "input_json_delta" in deltas
    assert final.stop_reason == "tool_use" and final.content[-1].input == {"city": "Paris"}

    history = ASK + [{"role": "assistant", "content": [b.model_dump() for b in msg.content]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                                   "content": '{"temperature_c": 18, "sky": "sunny"}'}]}]
    answer = client.messages.create(model="bubo", max_tokens=48, messages=history, tools=TOOLS, extra_body=GREEDY)
    # this 0.5B model answers a tool's result by calling again: text, or a call to the tool
    assert (answer.stop_reason in ("end_turn", "max_tokens") and answer.content[0].type == "text") or \
        (answer.stop_reason == "tool_use" and answer.content[-1].name == "get_weather")
    assert answer.usage.input_tokens > msg.usage.input_tokens


def test_tool_choice_tool_forces_a_call(client):
    hello = [{"role": "user", "content": "Say hello."}]
    msg = client.messages.create(model="bubo", max_tokens=48, messages=hello, tools=TOOLS, extra_body=GREEDY,
                                 tool_choice={"type": "tool", "name": "get_weather"})
    assert msg.stop_reason == "tool_use" and msg.content[-1].name == "get_weather"
    n_forced = client.messages.count_tokens(model="bubo", messages=hello, tools=TOOLS,
                                            tool_choice={"type": "tool", "name": "get_weather"}).input_tokens
    assert n_forced == msg.usage.input_tokens


ADD = {"name": "add", "description": "Add two integers", "input_schema": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}


def test_tool_choice_any_is_one_call_with_schema_valid_input(client):
    # "Say hello." alone would get text: only the grammar makes this a call
    hello = [{"role": "user", "content": "Say hello."}]
    for seed in (1, 2, 3):
        msg = client.messages.create(model="bubo", max_tokens=64, messages=hello, tools=TOOLS + [ADD],
                                     tool_choice={"type": "any", "disable_parallel_tool_use": True},
                                     extra_body={"temperature": 0.8, "seed": seed})
        assert msg.stop_reason == "tool_use"
        (use,) = msg.content
        assert use.type == "tool_use"
        if use.name == "add":
            assert set(use.input) == {"a", "b"} and all(isinstance(v, int) for v in use.input.values())
        else:
            assert use.name == "get_weather" and isinstance(use.input["city"], str)
