"""max_tokens cuts an answer after complete calls: every dialect returns the complete calls
(finish_reason "length", stop_reason "max_tokens", status "incomplete") and drops the cut one,
streamed and not. The engine's stream is scripted (the text a model wrote, then a "length"
finish), so the cut falls exactly where the test puts it; the prompt, the parser and the
response shapes are the server's own, on smollm2's real template and tokenizer. Also: a call
that ends the answer (parallel_tool_calls false) asks the engine to end it there."""

from __future__ import annotations

import json

import pytest

from bubo.api.app import create_app
from bubo.api.config import ServerConfig
from bubo.engine.types import FinishEvent, TokenEvent

from engines import start_engine

pytestmark = pytest.mark.models

PARIS = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
ROME = '{"name": "get_weather", "arguments": {"city": "Rome"}}'
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
ANTHROPIC_TOOLS = [{"name": "get_weather", "description": "Get the current weather in a city",
                    "input_schema": TOOLS[0]["function"]["parameters"]}]
RESPONSES_TOOLS = [{"type": "function", "name": "get_weather", "parameters": TOOLS[0]["function"]["parameters"]}]
ASK = [{"role": "user", "content": "What is the weather in Paris and in Rome?"}]


class Scripted:
    """An engine stream that sends text pieces, then a finish with the given reason."""

    def __init__(self, pieces: list[str], reason: str):
        self.events = [TokenEvent(1, p, 0.0, []) for p in pieces]
        self.events.append(FinishEvent(reason, None, 10, 0, len(pieces)))
        self.cancelled = False
        self.ended_after: int | None = None  # the piece count when end() was called
        self._i = 0

    def __iter__(self):
        return self

    def __next__(self):
        if self.cancelled or self._i >= len(self.events):
            raise StopIteration
        self._i += 1
        return self.events[self._i - 1]

    def cancel(self) -> None:
        self.cancelled = True

    def end(self) -> None:
        if self.ended_after is None:
            self.ended_after = self._i


@pytest.fixture(scope="module")
def scripted_app(catalog_model):
    engine = start_engine(catalog_model("smollm2:135m"), n_ctx=1024, n_threads=1)
    script: dict[str, Scripted] = {}

    def submit(req, mem_available=None, checked=None):
        return script["next"]

    engine.submit = submit  # type: ignore[method-assign]
    app = create_app(engine, ServerConfig(served_model_name="bubo"))
    try:
        yield app.test_client(), script
    finally:
        engine.stop("test over")


def pieces_of(text: str, n: int = 7) -> list[str]:
    return [text[i:i + n] for i in range(0, len(text), n)]


CUT = "[" + PARIS + ", " + ROME[:31]  # the model's list of two calls, cut inside the second


def sse(body: bytes) -> list[dict]:
    return [json.loads(line[6:]) for line in body.decode().splitlines()
            if line.startswith("data: ") and line != "data: [DONE]"]


@pytest.mark.parametrize("text", [CUT, "<tool_call>\n" + PARIS + "\n</tool_call>\n<tool_call>\n" + ROME[:31]])
def test_openai_chat_keeps_the_complete_calls(scripted_app, text):
    client, script = scripted_app
    body = {"model": "bubo", "messages": ASK, "tools": TOOLS, "max_tokens": 20, "parallel_tool_calls": True}
    script["next"] = Scripted(pieces_of(text), "length")
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.json
    choice = r.json["choices"][0]
    assert choice["finish_reason"] == "length"
    assert choice["message"]["content"] is None
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in choice["message"]["tool_calls"]] \
        == [("get_weather", {"city": "Paris"})]

    script["next"] = Scripted(pieces_of(text), "length")
    chunks = sse(client.post("/v1/chat/completions", json={**body, "stream": True}).data)
    deltas = [c["choices"][0]["delta"] for c in chunks if c.get("choices")]
    calls = [d["tool_calls"][0] for d in deltas if d.get("tool_calls")]
    assert calls[0]["function"]["name"] == "get_weather" and len({c["index"] for c in calls}) == 1
    assert json.loads("".join(c["function"]["arguments"] for c in calls)) == {"city": "Paris"}
    assert not "".join(d.get("content") or "" for d in deltas)
    assert [c["choices"][0]["finish_reason"] for c in chunks if c.get("choices")][-1] == "length"


def test_anthropic_and_responses_keep_the_complete_calls(scripted_app):
    client, script = scripted_app
    script["next"] = Scripted(pieces_of(CUT), "length")
    r = client.post("/v1/messages", json={"model": "bubo", "max_tokens": 20, "messages": ASK, "tools": ANTHROPIC_TOOLS,
                                          "tool_choice": {"type": "auto", "disable_parallel_tool_use": False}})
    assert r.status_code == 200, r.json
    assert r.json["stop_reason"] == "max_tokens"
    assert [(b["type"], b.get("input")) for b in r.json["content"]] == [("tool_use", {"city": "Paris"})]

    script["next"] = Scripted(pieces_of(CUT), "length")
    r = client.post("/v1/responses", json={"model": "bubo", "input": ASK[0]["content"], "tools": RESPONSES_TOOLS,
                                           "max_output_tokens": 20, "parallel_tool_calls": True})
    assert r.status_code == 200, r.json
    assert r.json["status"] == "incomplete"
    assert [(o["type"], json.loads(o["arguments"])) for o in r.json["output"]] == [("function_call", {"city": "Paris"})]


def test_a_cut_call_alone_is_dropped_not_shown_as_text(scripted_app):
    client, script = scripted_app
    script["next"] = Scripted(pieces_of(PARIS[:35]), "length")
    r = client.post("/v1/chat/completions", json={"model": "bubo", "messages": ASK, "tools": TOOLS, "max_tokens": 8})
    choice = r.json["choices"][0]
    assert choice["finish_reason"] == "length" and "tool_calls" not in choice["message"]
    assert choice["message"]["content"] == ""


def test_one_call_ends_the_answer_at_the_engine(scripted_app):
    client, script = scripted_app
    for parallel, want in ((False, [{"city": "Paris"}]), (True, [{"city": "Paris"}, {"city": "Rome"}])):
        text = PARIS + "\n" + ROME + "\nDone."
        script["next"] = s = Scripted(pieces_of(text), "stop")
        r = client.post("/v1/chat/completions", json={"model": "bubo", "messages": ASK, "tools": TOOLS,
                                                      "max_tokens": 64, "parallel_tool_calls": parallel})
        choice = r.json["choices"][0]
        assert choice["finish_reason"] == "tool_calls"
        assert [json.loads(c["function"]["arguments"]) for c in choice["message"]["tool_calls"]] == want
        if parallel:
            assert s.ended_after is None and choice["message"]["content"] == "\nDone."
        else:  # the engine was asked to end the answer once the call was whole
            assert s.ended_after == -(-len(PARIS) // 7) and choice["message"]["content"] is None
