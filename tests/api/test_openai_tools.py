"""Tool calls on qwen2.5-coder:0.5b (Hermes/Qwen format) through the `openai` SDK: the call
parsed out of the answer (non-streamed and streamed), and a round trip with the tool's result."""

import json

import openai
import pytest

import bubo
from bubo.api.fields import chat_messages

from .conftest import start_server

pytestmark = pytest.mark.models

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def qwen():
    with start_server(model="qwen2.5-coder:0.5b") as s:
        yield s.wait_ready()


@pytest.fixture(scope="module")
def client(qwen):
    return openai.OpenAI(base_url=qwen.url + "/v1", api_key="none", max_retries=0, timeout=120)


def test_tool_call_streamed_and_not(client):
    r = client.chat.completions.create(model="bubo", messages=ASK, tools=TOOLS, temperature=0, max_tokens=64)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
    assert json.loads(call.function.arguments) == {"city": "Paris"}

    chunks = list(client.chat.completions.create(model="bubo", messages=ASK, tools=TOOLS, temperature=0,
                                                 max_tokens=64, stream=True))
    deltas = [c.choices[0].delta.tool_calls for c in chunks if c.choices and c.choices[0].delta.tool_calls]
    first, rest = deltas[0][0], [d[0] for d in deltas[1:]]
    assert first.index == 0 and first.id and first.type == "function" and first.function.name == "get_weather"
    assert all(d.index == 0 and d.id is None for d in rest)
    args = first.function.arguments + "".join(d.function.arguments for d in rest)
    assert json.loads(args) == {"city": "Paris"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert not "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def test_tool_round_trip(client):
    r = client.chat.completions.create(model="bubo", messages=ASK, tools=TOOLS, temperature=0, max_tokens=64)
    msg = r.choices[0].message
    call = msg.tool_calls[0]
    history = ASK + [msg.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": '{"temperature_c": 18, "sky": "sunny"}'}]
    # the call and its result are rendered where the model expects them: the server's prompt is
    # the converted messages through the model's own template
    messages, prefill = chat_messages(history)
    assert prefill is None
    model = bubo.Model("qwen2.5-coder:0.5b", n_ctx=256, n_threads=1)
    prompt = model.chat_prompt(messages, tools=TOOLS, enable_thinking=True)
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in prompt
    assert '<tool_response>\n{"temperature_c": 18, "sky": "sunny"}\n</tool_response>' in prompt
    answer = client.chat.completions.create(model="bubo", messages=history, tools=TOOLS, temperature=0,
                                            max_tokens=48)
    # this 0.5B model answers a tool's result by calling again: text, or a call to the tool
    c = answer.choices[0]
    assert (c.finish_reason in ("stop", "length") and c.message.content) or \
        (c.finish_reason == "tool_calls" and c.message.tool_calls[0].function.name == "get_weather")
    assert answer.usage.prompt_tokens == len(model.tokenize(prompt, parse_special=True))


def test_responses_function_call_round_trip(client):
    tools = [{"type": "function", "name": "get_weather", "description": "Get the current weather in a city",
              "parameters": TOOLS[0]["function"]["parameters"]}]
    r = client.responses.create(model="bubo", input="What is the weather in Paris?", tools=tools,
                                temperature=0, max_output_tokens=64)
    (call,) = [o for o in r.output if o.type == "function_call"]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    with client.responses.stream(model="bubo", input="What is the weather in Paris?", tools=tools,
                                 temperature=0, max_output_tokens=64) as s:
        kinds = [ev.type for ev in s]
        final = s.get_final_response()
    assert "response.function_call_arguments.done" in kinds
    assert [o.type for o in final.output] == [o.type for o in r.output]
    answer = client.responses.create(model="bubo", tools=tools, temperature=0, max_output_tokens=32, input=[
        {"role": "user", "content": "What is the weather in Paris?"},
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": '{"temperature_c": 18}'}])
    assert answer.usage.input_tokens > r.usage.input_tokens and answer.output


def test_tool_choice_forces_a_call(client):
    hello = [{"role": "user", "content": "Say hello."}]
    free = client.chat.completions.create(model="bubo", messages=hello, tools=TOOLS, temperature=0, max_tokens=32)
    assert free.choices[0].finish_reason != "tool_calls"  # left to itself, the model just answers
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        r = client.chat.completions.create(model="bubo", messages=hello, tools=TOOLS, temperature=0, max_tokens=48,
                                           tool_choice=choice)
        assert r.choices[0].finish_reason == "tool_calls", choice
        assert r.choices[0].message.tool_calls[0].function.name == "get_weather"
        json.loads(r.choices[0].message.tool_calls[0].function.arguments)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="bubo", messages=hello, tools=TOOLS, max_tokens=4,
                                       tool_choice={"type": "function", "function": {"name": "nope"}})


ADD = {"type": "function", "function": {"name": "add", "description": "Add two integers", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}


@pytest.mark.parametrize("parallel", [False, True])
def test_a_streamed_required_call_rebuilds_to_the_non_streamed_one(client, parallel):
    # the SDK's own stream accumulator: what a client rebuilds from the deltas
    ask = [{"role": "user", "content": "What is the weather in Paris, and what is 2 + 3?"}]
    kw = dict(model="bubo", messages=ask, tools=TOOLS + [ADD], tool_choice="required", temperature=0.8,
              max_tokens=96, parallel_tool_calls=parallel)
    for seed in (1, 2, 3):
        whole = client.chat.completions.create(seed=seed, **kw).choices[0]
        with client.chat.completions.stream(seed=seed, **kw) as s:
            streamed = s.get_final_completion().choices[0]
        assert whole.finish_reason == streamed.finish_reason == "tool_calls"
        assert whole.message.content in (None, "") and streamed.message.content in (None, "")
        calls = [(c.function.name, c.function.arguments) for c in whole.message.tool_calls]
        assert calls == [(c.function.name, c.function.arguments) for c in streamed.message.tool_calls]
        assert parallel or len(calls) == 1
        for _, args in calls:
            json.loads(args)


def test_tool_choice_none_hides_the_tools_and_never_calls(client):
    kw = dict(model="bubo", messages=ASK, tools=TOOLS, max_tokens=48)
    shown = client.chat.completions.create(**kw, temperature=0)
    assert shown.choices[0].finish_reason == "tool_calls"  # offered the tool, the model calls it
    for seed in (0, 1, 2, 3):
        r = client.chat.completions.create(**kw, temperature=0.8 if seed else 0, seed=seed, tool_choice="none")
        assert not r.choices[0].message.tool_calls and r.choices[0].message.content
        assert r.usage.prompt_tokens < shown.usage.prompt_tokens  # the tools are not in the prompt


def test_responses_required_and_named_choices_call(client):
    tools = [{"type": "function", "name": t["function"]["name"], "description": t["function"]["description"],
              "parameters": t["function"]["parameters"]} for t in TOOLS + [ADD]]
    for choice, want in (("required", None), ({"type": "function", "name": "add"}, "add")):
        r = client.responses.create(model="bubo", input="Say hello.", tools=tools, tool_choice=choice,
                                    parallel_tool_calls=False, temperature=0, max_output_tokens=64)
        (call,) = r.output
        assert call.type == "function_call" and (want is None or call.name == want)
        args = json.loads(call.arguments)
        assert set(args) == ({"a", "b"} if call.name == "add" else {"city"})
