"""Errors of the generating routes that need a server of their own: 503 not_ready while the
model loads, and the API key through both SDKs (Bearer for openai, x-api-key for anthropic)."""


import anthropic
import openai
import pytest
from client import call_json

from .conftest import start_server

pytestmark = pytest.mark.models

MSGS = [{"role": "user", "content": "Hi"}]
ROUTES = [
    ("/v1/chat/completions", {"model": "bubo", "messages": MSGS}),
    ("/v1/completions", {"model": "bubo", "prompt": "Hi"}),
    ("/v1/responses", {"model": "bubo", "input": "Hi"}),
    ("/completion", {"prompt": "Hi"}),
    ("/v1/messages", {"model": "bubo", "max_tokens": 4, "messages": MSGS}),
    ("/v1/messages/count_tokens", {"model": "bubo", "messages": MSGS}),
]


def post(url, body, headers=None):
    return call_json(url, "POST", body, headers=headers, timeout=30)

def test_not_ready_while_the_model_loads():
    # a debug hook holds the model back, so every route is asked while it loads
    with start_server("--debug-hooks", env={"BUBO_DEBUG_LOAD_DELAY_S": "60"}) as s:
        for path, body in ROUTES:
            status, err = post(s.url + path, body)
            code = err["error"]["code"]
            assert (status, code) == (503, "not_ready"), path
            assert (err.get("type") == "error") == path.startswith("/v1/messages"), path


def test_api_key_through_both_sdks():
    with start_server("--api-key", "sesame") as s:
        s.wait_ready(headers={"Authorization": "Bearer sesame"})
        ok = openai.OpenAI(base_url=s.url + "/v1", api_key="sesame", max_retries=0)
        assert ok.completions.create(model="bubo", prompt="Hi", max_tokens=1).usage.completion_tokens == 1
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=s.url + "/v1", api_key="wrong", max_retries=0).completions.create(
                model="bubo", prompt="Hi", max_tokens=1)
        # the anthropic SDK sends x-api-key
        ok_a = anthropic.Anthropic(base_url=s.url, api_key="sesame", max_retries=0)
        assert ok_a.messages.count_tokens(model="bubo", messages=MSGS).input_tokens > 0
        with pytest.raises(anthropic.AuthenticationError):
            anthropic.Anthropic(base_url=s.url, api_key="wrong", max_retries=0).messages.count_tokens(
                model="bubo", messages=MSGS)
