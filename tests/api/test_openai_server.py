"""/v1/chat/completions and /v1/completions on the real server (smollm2:135m), driven by the
official `openai` SDK and plain HTTP."""

import json
import urllib.error
import urllib.request

import openai
import pytest
from client import call

pytestmark = pytest.mark.models

MSGS = [{"role": "user", "content": "Name three colors."}]
# the same prompt served from the slot's cache repeats its logits (the engine's decode is
# batch-invariant); JSON's float printing is the only difference left
LOGPROB_TOL = 1e-6


@pytest.fixture(scope="module")
def client(base_url):
    return openai.OpenAI(base_url=base_url + "/v1", api_key="none", max_retries=0, timeout=120)


def post(base_url, path, body):
    status, headers, data = call(base_url + path, "POST", body)
    return status, headers, data.decode()

def test_chat_streamed_equals_non_streamed(client):
    full = client.chat.completions.create(model="bubo", messages=MSGS, max_tokens=24, temperature=0)
    choice = full.choices[0]
    assert full.object == "chat.completion" and full.model == "bubo"
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    u = full.usage
    assert u.completion_tokens <= 24 and u.total_tokens == u.prompt_tokens + u.completion_tokens
    assert full.model_extra["timings"]["predicted_n"] == u.completion_tokens

    chunks = list(client.chat.completions.create(model="bubo", messages=MSGS, max_tokens=24, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == choice.message.content
    last = [c for c in chunks if c.choices][-1]
    assert last.choices[0].finish_reason == choice.finish_reason
    assert last.choices[0].delta.content is None and "timings" in last.model_extra
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == u.completion_tokens
    # the same prompt again: its prefix comes from the slot's cache
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens > 0


def test_chat_stream_ends_with_done_and_no_usage_by_default(base_url):
    status, headers, raw = post(base_url, "/v1/chat/completions",
                                {"model": "bubo", "messages": MSGS, "max_tokens": 4, "stream": True})
    assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
    events = [line[len("data: "):] for line in raw.split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["choices"] for c in chunks)  # no usage chunk without include_usage
    assert chunks[-1]["choices"][0]["finish_reason"] == "length" and chunks[-1]["choices"][0]["delta"] == {}


def test_chat_stop_string_prefill_and_logprobs(client):
    base = client.chat.completions.create(model="bubo", messages=MSGS, max_tokens=16, temperature=0)
    text = base.choices[0].message.content
    cut = text.split()[1]
    r = client.chat.completions.create(model="bubo", messages=MSGS, max_tokens=16, temperature=0, stop=[cut])
    assert r.choices[0].finish_reason == "stop" and cut not in r.choices[0].message.content
    assert text.startswith(r.choices[0].message.content)
    # a final assistant message is continued, not answered: given the answer's first tokens as a
    # prefill, the greedy continuation is the rest of the same answer
    first = client.chat.completions.create(model="bubo", messages=MSGS, max_tokens=16, temperature=0,
                                           logprobs=True).choices[0].logprobs.content
    prefill = "".join(t.token for t in first[:3])
    assert text.startswith(prefill)
    pre = client.chat.completions.create(model="bubo", max_tokens=8, temperature=0,
                                         messages=MSGS + [{"role": "assistant", "content": prefill}])
    cont = pre.choices[0].message.content
    assert cont and text[len(prefill):].startswith(cont)
    lp = client.chat.completions.create(model="bubo", messages=MSGS, max_tokens=4, temperature=0, logprobs=True,
                                        top_logprobs=2)
    content = lp.choices[0].logprobs.content
    assert len(content) == lp.usage.completion_tokens
    assert all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in content)
    # greedy: the chosen token is the most likely one
    assert content[0].token == content[0].top_logprobs[0].token


@pytest.mark.parametrize("body,status,code", [
    ({"messages": MSGS}, 400, "missing_model"),
    ({"model": "nope", "messages": MSGS}, 404, "model_not_found"),
    ({"model": "bubo"}, 400, "missing_messages"),
    ({"model": "bubo", "messages": MSGS, "n": 3}, 400, "unsupported_n"),
    ({"model": "bubo", "messages": MSGS, "max_tokens": 0}, 400, "invalid_value"),
    ({"model": "bubo", "messages": [{"role": "user", "content": "word " * 3000}]}, 400, "context_length_exceeded"),
    # bad input the engine would choke on is refused before it gets there
    ({"model": "bubo", "messages": MSGS, "logit_bias": {"999999": -100}}, 400, "invalid_value"),
    ({"model": "bubo", "messages": [{"role": "user", "content": "\ud800"}]}, 400, "invalid_value"),
    ({"model": "bubo", "messages": MSGS, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "properties": {"a": {"type": "array", "uniqueItems": True}}}}}}, 400,
     "unsupported_schema"),
])
def test_chat_errors(base_url, body, status, code):
    got, _, raw = post(base_url, "/v1/chat/completions", body)
    err = json.loads(raw)["error"]
    assert (got, err["code"]) == (status, code), raw
    assert err["type"] == "invalid_request_error" and err["message"]


def test_chat_errors_through_the_sdk(client):
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=MSGS, max_tokens=2)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="bubo", messages=MSGS, n=2)
    assert e.value.code == "unsupported_n"


def test_completions_streamed_equals_non_streamed(client):
    full = client.completions.create(model="bubo", prompt="The capital of France is", max_tokens=12, temperature=0)
    assert full.object == "text_completion" and full.choices[0].text
    streamed = list(client.completions.create(model="bubo", prompt="The capital of France is", max_tokens=12,
                                              temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in streamed) == full.choices[0].text
    assert streamed[-1].choices[0].finish_reason == full.choices[0].finish_reason
    lp = client.completions.create(model="bubo", prompt="The capital of France is", max_tokens=3, temperature=0,
                                   logprobs=2)
    assert len(lp.choices[0].logprobs.tokens) == 3 and "".join(lp.choices[0].logprobs.tokens) == lp.choices[0].text


def test_reasoning_is_parsed_out_streamed_and_not(client):
    # smollm2's template knows no thinking: a prefill that opens <think> puts the answer inside
    # it, so every generated token is reasoning (the model never closes the tag in 12 tokens)
    msgs = MSGS + [{"role": "assistant", "content": "<think>"}]
    full = client.chat.completions.create(model="bubo", messages=msgs, max_tokens=12, temperature=0)
    m = full.choices[0].message
    assert m.model_extra["reasoning_content"] and not m.content
    chunks = list(client.chat.completions.create(model="bubo", messages=msgs, max_tokens=12, temperature=0,
                                                 stream=True))
    deltas = [c.choices[0].delta for c in chunks]
    assert "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas) == m.model_extra[
        "reasoning_content"]
    # thinking off: the grammar closes the block the prefill opened at once, and what follows is
    # the answer (bubo.chat.thinking)
    off = client.chat.completions.create(model="bubo", messages=msgs, max_tokens=12, temperature=0,
                                         reasoning_effort="off", logprobs=True)
    raw = "".join(t.token for t in off.choices[0].logprobs.content)
    assert raw.startswith("</think>") and "reasoning_content" not in off.choices[0].message.model_extra
    assert (off.choices[0].message.content or "") == raw.removeprefix("</think>").strip().removesuffix("<|im_end|>")


def test_thinking_fields_that_disagree(base_url):
    status, _, raw = post(base_url, "/v1/chat/completions", {
        "model": "bubo", "messages": MSGS, "reasoning_effort": "off",
        "chat_template_kwargs": {"enable_thinking": True}})
    err = json.loads(raw)["error"]
    assert status == 400 and "reasoning_effort" in err["message"] and "enable_thinking" in err["message"]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/v1/responses", "/completion"])
def test_malformed_json(base_url, path):
    req = urllib.request.Request(base_url + path, data=b'{"model": "bubo", "messages": [', method="POST",
                                 headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=30)
    assert e.value.code == 400 and json.loads(e.value.read())["error"]["code"] == "parse_error"


def test_client_that_goes_away_frees_the_slot(base_url, client):
    import http.client
    import time
    from urllib.parse import urlparse

    u = urlparse(base_url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    conn.request("POST", "/v1/chat/completions", json.dumps(
        {"model": "bubo", "messages": MSGS, "max_tokens": 1500, "stream": True,
         "logit_bias": {"0": -100, "2": -100, "4": -100}}),  # no end-of-generation token: it runs on
        {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    assert resp.read(6) == b"data: "  # the stream is running
    conn.sock.close()
    conn.close()
    for _ in range(600):  # the engine stops at its next step; poll its state
        with urllib.request.urlopen(base_url + "/slots", timeout=10) as r:
            slot = json.loads(r.read())[0]
        if not slot["is_processing"]:
            break
        time.sleep(0.05)
    assert not slot["is_processing"]
    assert slot["next_token"]["n_decoded"] < 1500
    # and the next request is served normally
    r = client.chat.completions.create(model="bubo", messages=MSGS, max_tokens=3, temperature=0)
    assert r.usage.completion_tokens == 3


def test_sdk_stream_helper_rebuilds_the_completion(client):
    full = client.chat.completions.create(model="bubo", messages=MSGS, max_tokens=16, temperature=0)
    try:
        with client.chat.completions.stream(model="bubo", messages=MSGS, max_tokens=16, temperature=0) as s:
            for _ in s:
                pass
            final = s.get_final_completion()
    except openai.LengthFinishReasonError as e:  # newer SDKs refuse a cut answer, and carry what they rebuilt
        assert full.choices[0].finish_reason == "length"
        final = e.completion
    assert final.choices[0].message.content == full.choices[0].message.content
    assert final.choices[0].finish_reason == full.choices[0].finish_reason


def test_streamed_logprobs_equal_non_streamed(client):
    kw = dict(model="bubo", messages=MSGS, max_tokens=6, temperature=0, logprobs=True, top_logprobs=2)
    full = client.chat.completions.create(**kw).choices[0].logprobs.content
    chunks = list(client.chat.completions.create(**kw, stream=True))
    streamed = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert [(t.token, t.bytes) for t in streamed] == [(t.token, t.bytes) for t in full]
    assert all(abs(a.logprob - b.logprob) <= LOGPROB_TOL for a, b in zip(streamed, full, strict=True))


def test_apply_template_function_matches_the_generated_prompt(client, base_url):
    # the function /apply-template can share: its prompt is the one chat generation runs on
    # (run here on the library's runtime: the same Runtime type the server's engine holds)
    import bubo
    from bubo.api.openai.chat import apply_template

    model = bubo.Model("smollm2:135m", n_ctx=256, n_threads=1)
    body = {"messages": [{"role": "system", "content": [{"type": "text", "text": "Be brief."}]}] + MSGS +
            [{"role": "assistant", "content": "Red,"}], "stream": True}
    text = apply_template(model.runtime, body)
    assert text.endswith("<|im_start|>assistant\nRed,")
    r = client.chat.completions.create(model="bubo", messages=body["messages"], max_tokens=1)
    assert r.usage.prompt_tokens == len(model.tokenize(text, parse_special=True))


def test_completions_streamed_logprobs(client):
    kw = dict(model="bubo", prompt="The capital of France is", max_tokens=4, temperature=0, logprobs=2)
    full = client.completions.create(**kw).choices[0].logprobs
    chunks = list(client.completions.create(**kw, stream=True))
    streamed = [c.choices[0].logprobs for c in chunks if c.choices and c.choices[0].logprobs]
    assert [t for lp in streamed for t in lp.tokens] == full.tokens
    assert [o for lp in streamed for o in lp.text_offset] == full.text_offset
