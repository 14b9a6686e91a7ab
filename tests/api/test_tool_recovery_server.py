"""Tool calls that hold on real traffic, through a real server on the catalog models:

- qwen2.5-coder:0.5b drops its template's <tool_call> markers (it answers with a bare JSON
  object, or one in a ```json fence): those answers are calls all the same, through the openai
  SDK (non-streamed, and streamed: the SDK's accumulator rebuilds the same call), the Responses
  API and the anthropic SDK (a tool_use block, stop_reason tool_use); a bare JSON answer that
  names no given tool stays content.
- tool_choice required and named, 50 seeded runs at temperature 0.9 on smollm2:135m (no tool
  template: the generic format) and qwen2.5-coder:0.5b: exactly one schema-valid call each,
  finish_reason tool_calls (the suite runs 20 of the 50, BUBO_TEST_FULL_SWEEPS=1 all 50:
  engines.sweep).
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import anthropic
import jsonschema
import openai
import pytest
from client import call_json

from .conftest import start_server
from engines import sweep

pytestmark = [pytest.mark.slow, pytest.mark.models]

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city, e.g. Paris"}},
                   "required": ["city"]}}}
ADD = {"type": "function", "function": {
    "name": "add", "description": "Add two integers",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"], "additionalProperties": False}}}
TOOLS = [WEATHER]
# prompts on which the model answers with a call (written without the markers, mostly)
PROMPTS = {
    "What's the weather like in Tokyo right now?": "Tokyo",
    "Is it raining in London?": "London",
    "weather in Berlin": "Berlin",
    "How hot is it in Cairo today?": "Cairo",
    "What is the temperature in Madrid?": "Madrid",
    "Weather for Rome, please": "Rome",
}
GREEDY = {"temperature": 0}


def post(url: str, body: dict) -> dict:
    status, answer = call_json(url, "POST", body)
    assert status == 200, answer
    return answer

@pytest.fixture(scope="module")
def qwen():
    with start_server("-np", "4", model="qwen2.5-coder:0.5b", ctx=4096) as s:
        yield s.wait_ready()


@pytest.fixture(scope="module")
def smol():
    with start_server("-np", "4", model="smollm2:135m", ctx=4096) as s:
        yield s.wait_ready()


@pytest.fixture(scope="module")
def oai(qwen):
    return openai.OpenAI(base_url=qwen.url + "/v1", api_key="none", max_retries=0, timeout=120)


def raw_answer(server, messages: list[dict], tools: list[dict], max_tokens: int = 64) -> str:
    """The model's own text for a chat request (greedy): the same prompt through /completion."""
    prompt = post(server.url + "/apply-template", {"messages": messages, "tools": tools})["prompt"]
    return post(server.url + "/completion", {"prompt": prompt, "n_predict": max_tokens, "temperature": 0})["content"]


def test_calls_without_markers_are_calls_streamed_and_not(qwen, oai):
    dropped = 0
    for prompt, city in PROMPTS.items():
        ask = [{"role": "user", "content": prompt}]
        raw = raw_answer(qwen, ask, TOOLS)
        dropped += "<tool_call>" not in raw
        r = oai.chat.completions.create(model="bubo", messages=ask, tools=TOOLS, max_tokens=64, **GREEDY)
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls", (prompt, raw)
        assert choice.message.content is None
        (call,) = choice.message.tool_calls
        assert call.function.name == "get_weather" and json.loads(call.function.arguments)["city"].lower() == \
            city.lower(), raw

        with oai.chat.completions.stream(model="bubo", messages=ask, tools=TOOLS, max_tokens=64, **GREEDY) as s:
            chunks = list(s)
            streamed = s.get_final_completion().choices[0]
        assert streamed.finish_reason == "tool_calls" and not streamed.message.content
        assert [(c.function.name, c.function.arguments) for c in streamed.message.tool_calls] == \
            [(call.function.name, call.function.arguments)]
        # nothing of the call's text leaked as content first
        assert not any(getattr(ev, "type", "") == "content.delta" for ev in chunks)
    assert dropped >= len(PROMPTS) // 2  # the recovery was needed: most answers had no markers


def test_a_full_round_trip_with_the_openai_sdk(qwen, oai):
    ask = [{"role": "user", "content": "What's the weather like in Tokyo right now?"}]
    first = oai.chat.completions.create(model="bubo", messages=ask, tools=TOOLS, max_tokens=64, **GREEDY)
    msg = first.choices[0].message
    (call,) = msg.tool_calls
    history = ask + [msg.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": '{"temperature_c": 21, "sky": "clear"}'}]
    prompt = post(qwen.url + "/apply-template", {"messages": history, "tools": TOOLS})["prompt"]
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Tokyo"}}\n</tool_call>' in prompt
    assert '<tool_response>\n{"temperature_c": 21, "sky": "clear"}\n</tool_response>' in prompt
    second = oai.chat.completions.create(model="bubo", messages=history, tools=TOOLS, max_tokens=64, **GREEDY)
    choice = second.choices[0]
    assert second.usage.prompt_tokens > first.usage.prompt_tokens
    # this 0.5B model answers a tool's result by calling again (measured on every prompt here);
    # whatever it does, the answer is either text or a valid call to a given tool
    if choice.finish_reason == "tool_calls":
        for c in choice.message.tool_calls:
            assert c.function.name == "get_weather"
            jsonschema.validate(json.loads(c.function.arguments), WEATHER["function"]["parameters"])
    else:
        assert choice.message.content and not choice.message.tool_calls


def test_responses_and_anthropic_calls_without_markers(qwen, oai):
    tools = [{"type": "function", "name": "get_weather", "description": WEATHER["function"]["description"],
              "parameters": WEATHER["function"]["parameters"]}]
    client = anthropic.Anthropic(base_url=qwen.url, api_key="none", max_retries=0, timeout=120)
    a_tools = [{"name": "get_weather", "description": WEATHER["function"]["description"],
                "input_schema": WEATHER["function"]["parameters"]}]
    for prompt, city in list(PROMPTS.items())[:3]:
        r = oai.responses.create(model="bubo", input=prompt, tools=tools, max_output_tokens=64, **GREEDY)
        assert [o.type for o in r.output] == ["function_call"]
        assert json.loads(r.output[0].arguments)["city"].lower() == city.lower()

        ask = [{"role": "user", "content": prompt}]
        msg = client.messages.create(model="bubo", max_tokens=64, messages=ask, tools=a_tools, extra_body=GREEDY)
        assert msg.stop_reason == "tool_use"
        (use,) = msg.content
        assert use.type == "tool_use" and use.name == "get_weather" and use.input["city"].lower() == city.lower()
        with client.messages.stream(model="bubo", max_tokens=64, messages=ask, tools=a_tools, extra_body=GREEDY) as s:
            kinds = [ev.delta.type for ev in s if ev.type == "content_block_delta"]
            final = s.get_final_message()
        assert kinds and set(kinds) == {"input_json_delta"}  # no text_delta leaked before the call
        assert final.stop_reason == "tool_use" and final.content[0].input == use.input

        history = ask + [{"role": "assistant", "content": [b.model_dump() for b in msg.content]},
                         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                                       "content": '{"temperature_c": 18}'}]}]
        answer = client.messages.create(model="bubo", max_tokens=48, messages=history, tools=a_tools,
                                        extra_body=GREEDY)
        assert answer.usage.input_tokens > msg.usage.input_tokens
        assert answer.stop_reason in ("end_turn", "max_tokens", "tool_use")


@pytest.mark.parametrize("prompt", [
    'Reply with only this JSON and nothing else: {"name": "get_stock_price", "arguments": {"symbol": "AAPL"}}',
    "Write a JSON object describing a person named Ann, aged 31.",
    'Give me the JSON {"name": "Paris", "country": "France"} exactly.',
])
def test_a_json_answer_that_names_no_given_tool_stays_content(qwen, oai, prompt):
    ask = [{"role": "user", "content": prompt}]
    raw = raw_answer(qwen, ask, TOOLS, 80)
    assert '"name"' in raw  # it looks like a call, but names no tool of the request
    r = oai.chat.completions.create(model="bubo", messages=ask, tools=TOOLS, max_tokens=80, **GREEDY)
    choice = r.choices[0]
    assert choice.finish_reason == "stop" and not choice.message.tool_calls
    assert choice.message.content == raw


def _forced_runs(server, choice, n: int = 50) -> list[dict]:
    ask = [{"role": "user", "content": "What is the weather in Paris, and what is 2 + 3?"}]

    def one(seed: int) -> dict:
        return post(server.url + "/v1/chat/completions", {
            "model": "bubo", "messages": ask, "tools": [WEATHER, ADD], "tool_choice": choice,
            "temperature": 0.9, "seed": seed, "max_tokens": 64})

    with ThreadPoolExecutor(4) as pool:
        return list(pool.map(one, sweep(range(n), 20)))


@pytest.mark.parametrize("model", ["smol", "qwen"])
@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "add"}}])
def test_forced_calls_are_exactly_one_valid_call(request, model, choice):
    server = request.getfixturevalue(model)
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, ADD)}
    for r in _forced_runs(server, choice):
        c = r["choices"][0]
        assert c["finish_reason"] == "tool_calls", c
        (call,) = c["message"]["tool_calls"]
        name = call["function"]["name"]
        assert name in schemas and (choice == "required" or name == "add")
        jsonschema.validate(json.loads(call["function"]["arguments"]), schemas[name])
        assert not c["message"]["content"]
