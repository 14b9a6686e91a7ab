"""Bad input never reaches a 500: every request field of the generating routes, given values of
the wrong type or range, gets a 4xx in its route's error shape (or is ignored, when unknown)."""

import json

import pytest
from client import call

pytestmark = pytest.mark.models

MSGS = [{"role": "user", "content": "hi"}]
BASES = {
    "/v1/chat/completions": {"model": "bubo", "messages": MSGS, "max_tokens": 1},
    "/v1/responses": {"model": "bubo", "input": "hi", "max_output_tokens": 1},
    "/completion": {"prompt": "hi", "n_predict": 1},
    "/v1/messages": {"model": "bubo", "messages": MSGS, "max_tokens": 1},
}
FIELDS = ["messages", "prompt", "input", "max_tokens", "n_predict", "max_output_tokens", "temperature", "top_k",
          "seed", "stop", "stop_sequences", "stream", "stream_options", "tools", "logit_bias", "n_probs",
          "top_logprobs", "system", "instructions", "thinking", "reasoning", "reasoning_effort",
          "chat_template_kwargs", "n", "response_format", "dry_sequence_breakers", "return_tokens", "model"]
# mostly values that are wrong for every field, so few requests generate: the test stays quick
VALUES = ["x", [1], {"type": 5}, 1e300, [{"role": "user", "content": [5]}]]


def post(url, body):
    status, _, data = call(url, "POST", body, timeout=60)
    return status, (json.loads(data) if status >= 400 else None)

@pytest.mark.parametrize("path", list(BASES))
def test_wrong_types_are_client_errors(base_url, path):
    failures = []
    for field in FIELDS:
        for value in VALUES:
            body = {**BASES[path], field: value}
            status, err = post(base_url + path, body)
            if status >= 500:
                failures.append((field, value, status, err))
            elif status >= 400:
                anthropic = path.startswith("/v1/messages")
                assert (err.get("type") == "error") == anthropic and err["error"]["message"], (field, value, err)
    assert not failures
