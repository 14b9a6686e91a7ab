"""The Anthropic request conversion and response/event shapes, as pure functions against
expected JSON (tests/api/testdata/), as ollama tests its converter."""

import json
from pathlib import Path

import pytest

from bubo.api.anthropic.messages import MessageEvents, message_response, parse_messages_request, stop_reason
from bubo.api.errors import ApiError
from bubo.api.pipeline import Output
from bubo.chat.parsers import Part, ToolCall
from bubo.engine.types import FinishEvent

DATA = Path(__file__).parent / "testdata"
CASES = json.loads((DATA / "anthropic_requests.json").read_text())
FIN = FinishEvent("stop", None, 13, 4, 3)


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_request(case):
    if "error" in case:
        with pytest.raises(ApiError) as e:
            parse_messages_request(case["body"])
        assert [e.value.status, e.value.code] == case["error"]
        return
    req = parse_messages_request(case["body"])
    for key, want in case["expect"].items():
        assert getattr(req, key) == want, key


def test_count_tokens_needs_no_max_tokens_and_refuses_stream():
    assert parse_messages_request({"model": "m", "messages": [{"role": "user", "content": "x"}]},
                                  count_only=True).max_tokens is None
    with pytest.raises(ApiError):
        parse_messages_request({"model": "m", "stream": True, "messages": [{"role": "user", "content": "x"}]},
                               count_only=True)


def test_message_and_events():
    call = ToolCall("f", '{"a": 1}', "call_x")
    out = Output(reasoning="hmm", content="Hi!", tool_calls=[call], finish=FIN)
    assert message_response(id="msg_1", model="bubo", out=out) == json.loads(
        (DATA / "anthropic_message.json").read_text())
    m = MessageEvents("msg_1", "bubo")
    evs = m.start(13) + m.parts([Part("reasoning", "hmm"), Part("content", "Hi")]) + m.parts(
        [Part("content", "!"), Part("tool_call", call=call)]) + m.end(FIN)
    assert [list(e) for e in evs] == json.loads((DATA / "anthropic_events.json").read_text())


@pytest.mark.parametrize("fin,n_calls,want", [
    (FinishEvent("stop", None, 1, 0, 1), 0, "end_turn"),
    (FinishEvent("stop", "END", 1, 0, 1), 0, "stop_sequence"),
    (FinishEvent("length", None, 1, 0, 1), 0, "max_tokens"),
    (FinishEvent("stop", None, 1, 0, 1), 1, "tool_use"),
])
def test_stop_reason(fin, n_calls, want):
    assert stop_reason(fin, n_calls) == want
