"""/v1/messages and /v1/messages/count_tokens on the real server (smollm2:135m), driven by the
official `anthropic` SDK and plain HTTP."""

import json
import urllib.error
import urllib.request

import anthropic
import pytest
from client import call

pytestmark = pytest.mark.models

MSGS = [{"role": "user", "content": "Name three colors."}]
# this SDK version has no temperature argument: sent as an extra field
GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def client(base_url):
    return anthropic.Anthropic(base_url=base_url, api_key="none", max_retries=0, timeout=120)


def post(base_url, path, body):
    status, _, data = call(base_url + path, "POST", body)
    return status, data.decode()

def test_message_and_its_stream_agree(client):
    msg = client.messages.create(model="bubo", max_tokens=24, messages=MSGS, extra_body=GREEDY,
                                 system="You are brief.")
    assert msg.type == "message" and msg.role == "assistant" and msg.model == "bubo"
    assert msg.stop_reason in ("end_turn", "max_tokens")
    assert [b.type for b in msg.content] == ["text"] and msg.content[0].text
    assert msg.usage.output_tokens <= 24 and msg.usage.input_tokens > 0

    with client.messages.stream(model="bubo", max_tokens=24, messages=MSGS, extra_body=GREEDY,
                                system="You are brief.") as stream:
        kinds = [ev.type for ev in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "content_block_start" in kinds and "message_delta" in kinds
    assert final.content[0].text == msg.content[0].text
    assert final.stop_reason == msg.stop_reason and final.usage.output_tokens == msg.usage.output_tokens

    count = client.messages.count_tokens(model="bubo", messages=MSGS, system="You are brief.")
    assert count.input_tokens == msg.usage.input_tokens


def test_stop_sequence_and_max_tokens(client):
    base = client.messages.create(model="bubo", max_tokens=16, messages=MSGS, extra_body=GREEDY)
    word = base.content[0].text.split()[1]
    cut = client.messages.create(model="bubo", max_tokens=16, messages=MSGS, extra_body=GREEDY, stop_sequences=[word])
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == word
    short = client.messages.create(model="bubo", max_tokens=2, messages=MSGS, extra_body=GREEDY)
    assert short.stop_reason == "max_tokens" and short.usage.output_tokens == 2


def test_count_tokens_beyond_the_context(client):
    long = [{"role": "user", "content": "word " * 3000}]
    assert client.messages.count_tokens(model="bubo", messages=long).input_tokens > 2048


@pytest.mark.parametrize("path,body,status,code", [
    ("/v1/messages", {"max_tokens": 5, "messages": MSGS}, 400, "missing_model"),
    ("/v1/messages", {"model": "nope", "max_tokens": 5, "messages": MSGS}, 404, "model_not_found"),
    ("/v1/messages", {"model": "bubo", "max_tokens": 5}, 400, "missing_messages"),
    ("/v1/messages", {"model": "bubo", "messages": MSGS}, 400, "invalid_value"),
    ("/v1/messages", {"model": "bubo", "max_tokens": 5,
                      "messages": [{"role": "user", "content": "word " * 3000}]}, 400, "context_length_exceeded"),
    ("/v1/messages/count_tokens", {"model": "bubo", "messages": MSGS, "stream": True}, 400, "invalid_value"),
    ("/v1/messages", {"model": "bubo", "max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}]},
     400, "invalid_value"),
])
def test_errors_in_anthropic_shape(base_url, path, body, status, code):
    got, raw = post(base_url, path, body)
    err = json.loads(raw)
    assert got == status and err["type"] == "error" and err["error"]["code"] == code, raw
    assert err["error"]["type"] == ("not_found_error" if status == 404 else "invalid_request_error")
    assert err["request_id"]


def test_sdk_raises_on_unknown_model(client):
    with pytest.raises(anthropic.NotFoundError):
        client.messages.create(model="nope", max_tokens=2, messages=MSGS)


def test_malformed_json_in_anthropic_shape(base_url):
    req = urllib.request.Request(base_url + "/v1/messages", data=b"{nope", method="POST",
                                 headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=30)
    body = json.loads(e.value.read())
    assert e.value.code == 400 and body["type"] == "error" and body["error"]["code"] == "parse_error"


def test_thinking_block_from_a_prefill(client):
    msgs = MSGS + [{"role": "assistant", "content": "<think>"}]
    msg = client.messages.create(model="bubo", max_tokens=12, messages=msgs, extra_body=GREEDY)
    assert [b.type for b in msg.content] == ["thinking"] and msg.content[0].thinking
    with client.messages.stream(model="bubo", max_tokens=12, messages=msgs, extra_body=GREEDY) as s:
        for _ in s:
            pass
        final = s.get_final_message()
    assert final.content[0].type == "thinking" and final.content[0].thinking == msg.content[0].thinking
