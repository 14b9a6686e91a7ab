"""The OpenAI request validation and response shapes, as pure functions against expected JSON
(tests/api/testdata/); no server, no model."""

import json
from pathlib import Path

import pytest

from bubo.api.errors import ApiError
from bubo.api.openai.chat import ChatChunks, chat_response, parse_chat_request
from bubo.api.openai.completions import parse_completion_request
from bubo.api.pipeline import Output
from bubo.chat.parsers import Part, ToolCall
from bubo.engine.types import FinishEvent, Timings

DATA = Path(__file__).parent / "testdata"
CHAT_CASES = json.loads((DATA / "chat_requests.json").read_text())


@pytest.mark.parametrize("case", CHAT_CASES, ids=[c["name"] for c in CHAT_CASES])
def test_chat_request(case):
    if "error" in case:
        with pytest.raises(ApiError) as e:
            parse_chat_request(case["body"])
        assert [e.value.status, e.value.code] == case["error"]
        for word in case.get("message_has", []):
            assert word in e.value.message
        return
    req = parse_chat_request(case["body"])
    for key, want in case["expect"].items():
        assert getattr(req, key) == want, key


def test_chat_request_sampling_fields():
    req = parse_chat_request({"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": 0,
                              "top_k": 5.0, "min_p": 0.1, "repeat_penalty": 1.1, "seed": 7, "logit_bias": {"12": -100},
                              "logprobs": True, "top_logprobs": 3, "dry_multiplier": 0.5, "unknown_field": 1})
    p = req.params
    assert (p.temperature, p.top_k, p.min_p, p.repeat_penalty, p.seed, p.n_probs, p.dry_multiplier) == (
        0, 5, 0.1, 1.1, 7, 3, 0.5)
    assert p.logit_bias == {12: -100.0}


FIN = FinishEvent("stop", None, 13, 4, 3, Timings(cached_n=4, prompt_n=9, prompt_s=0.125, predicted_n=3,
                                                   predicted_s=0.25, queue_s=0.5))


def test_chat_response_shape():
    out = Output(reasoning="hmm", content="Hi!", finish=FIN)
    body = chat_response(id="chatcmpl-1", created=5, model="bubo", out=out, logprobs=None)
    assert body == json.loads((DATA / "chat_response.json").read_text())


def test_chat_response_tool_calls():
    out = Output(content="", tool_calls=[ToolCall("get_weather", '{"city": "Paris"}', "call_a")], finish=FIN)
    body = chat_response(id="chatcmpl-1", created=5, model="bubo", out=out, logprobs=None)
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"] == {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]}


def test_chat_chunks_shape():
    c = ChatChunks("chatcmpl-1", 5, "bubo")
    chunks = [c.role()]
    chunks += c.parts([Part("reasoning", "hmm"), Part("content", "Hi"),
                       Part("tool_call", call=ToolCall("f", "{}", "call_b"))])
    chunks += [c.last(FIN), c.usage(FIN)]
    assert chunks == json.loads((DATA / "chat_chunks.json").read_text())


def test_completion_request():
    req = parse_completion_request({"model": "m", "prompt": ["The capital"], "stream": True})
    assert (req.prompt, req.max_tokens, req.stream) == ("The capital", 16, True)
    assert parse_completion_request({"model": "m", "prompt": [1, 2, 3], "max_tokens": -1}).max_tokens is None
    for bad in ({"model": "m"}, {"model": "m", "prompt": 5}, {"model": "m", "prompt": "x", "logprobs": 9}):
        with pytest.raises(ApiError) as e:
            parse_completion_request(bad)
        assert e.value.status == 400


def test_responses_input_items():
    from bubo.api.openai.responses import parse_responses_request

    req = parse_responses_request({"model": "m", "instructions": "Be brief.", "max_output_tokens": 50,
                                   "reasoning": {"effort": "low"}, "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "function_call", "call_id": "c1", "name": "w", "arguments": '{"city": "X"}'},
        {"type": "function_call", "call_id": "c2", "name": "w", "arguments": '{"city": "Y"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "1"},
        {"type": "function_call_output", "call_id": "c2", "output": "2"}],
        "tools": [{"type": "function", "name": "w", "parameters": {"type": "object"}, "strict": None}]})
    assert req.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "w", "arguments": {"city": "X"}}},
            {"id": "c2", "type": "function", "function": {"name": "w", "arguments": {"city": "Y"}}}]},
        {"role": "tool", "content": "1", "tool_call_id": "c1"},
        {"role": "tool", "content": "2", "tool_call_id": "c2"}]
    assert req.tools == [{"type": "function", "function": {"name": "w", "description": "",
                                                           "parameters": {"type": "object"}}}]
    assert (req.max_tokens, req.thinking, req.template_kwargs["reasoning_effort"]) == (50, True, "low")
    for bad, code in (({"input": []}, "missing_messages"),
                      ({"input": "x", "previous_response_id": 5}, "invalid_value"),
                      ({"input": "x", "tools": [{"type": "web_search"}]}, "invalid_value"),
                      ({"input": "x", "text": {"format": {"type": "json_schema"}}}, "invalid_value"),
                      ({"input": "x", "text": {"format": {"type": "json_schema", "name": "n",
                                                          "schema": {"type": "object", "not": {}}}}},
                       "unsupported_schema")):
        with pytest.raises(ApiError) as e:
            parse_responses_request({"model": "m", **bad})
        assert e.value.code == code
