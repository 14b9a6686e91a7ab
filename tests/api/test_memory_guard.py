"""The memory guard on a real server: a context far larger than this machine's memory is allowed
(its KV cache is taken from the OS only as it fills); a request that could never fit is a 507
insufficient_memory_permanent without Retry-After, one that cannot fit now (the available figure
pinned by a debug hook) a 503 insufficient_memory with Retry-After: 5; small requests still run."""

import json
import urllib.error
import urllib.request

import pytest
from client import post_json as post

from bubo.engine.memory import MEM_SAFETY_MARGIN, memory_budget

from .conftest import start_server

pytestmark = pytest.mark.models

# smollm2:135m: 30 layers x 2 (K, V) x 3 KV heads x 64 dims x 2 bytes = 23,040 bytes a token, so
# this context is ~92 GB of f16 KV cache: past any machine these tests run on
HUGE_CTX = 4_000_000
HUGE_MAX_TOKENS = 3_000_000
SMOLLM2_TOKEN_BYTES = 30 * 2 * 3 * 64 * 2
MSGS = [{"role": "user", "content": "Say hi."}]



@pytest.fixture(scope="module")
def huge():
    ceiling, _ = memory_budget()
    assert ceiling is not None and HUGE_MAX_TOKENS * SMOLLM2_TOKEN_BYTES > ceiling, "this machine has ~70 GB free?"
    with start_server(ctx=HUGE_CTX) as s:
        yield s.wait_ready()


def test_a_request_that_can_never_fit_is_507_openai_shape(huge):
    status, headers, body = post(huge.url + "/v1/chat/completions",
                                 {"model": "bubo", "messages": MSGS, "max_tokens": HUGE_MAX_TOKENS})
    assert status == 507, body
    assert "Retry-After" not in headers
    err = body["error"]
    assert err["code"] == "insufficient_memory_permanent" and err["type"] == "server_error"
    assert "GiB" in err["message"] and "max_tokens" in err["message"]


def test_a_request_that_can_never_fit_is_507_anthropic_shape(huge):
    status, headers, body = post(huge.url + "/v1/messages",
                                 {"model": "bubo", "messages": MSGS, "max_tokens": HUGE_MAX_TOKENS})
    assert status == 507, body
    assert "Retry-After" not in headers
    assert body["type"] == "error" and body["error"]["code"] == "insufficient_memory_permanent"
    assert body["request_id"].startswith("req_")


def test_small_requests_still_run_on_the_huge_context(huge):
    status, _, body = post(huge.url + "/v1/chat/completions",
                           {"model": "bubo", "messages": MSGS, "max_tokens": 8, "temperature": 0})
    assert status == 200, body
    assert body["usage"]["completion_tokens"] >= 1
    # no max_tokens: admitted for its prompt, ends by itself (or when memory would run short)
    status, _, body = post(huge.url + "/v1/messages", {"model": "bubo", "messages": MSGS, "max_tokens": 8})
    assert status == 200, body
    status, _, body = post(huge.url + "/completion", {"prompt": "Once upon a time", "n_predict": 4})
    assert status == 200 and body["tokens_predicted"] == 4, body
    status, _, body = post(huge.url + "/completion", {"prompt": "Once", "n_predict": HUGE_MAX_TOKENS})
    assert status == 507 and body["error"]["code"] == "insufficient_memory_permanent", body
    slots = json.loads(urllib.request.urlopen(huge.url + "/slots", timeout=10).read())
    assert slots[0]["n_ctx"] == HUGE_CTX
    assert huge.alive()


def test_a_request_that_cannot_fit_now_is_503_with_retry_after():
    # the debug hook pins "available now" 50 MiB past the guard's margin: 8 tokens of smollm2 KV
    # fit, 8,000 (~176 MiB) do not, yet would on this machine (the last test)
    env = {"BUBO_DEBUG_MEM_AVAILABLE": str(MEM_SAFETY_MARGIN + 50 * 1024 * 1024)}
    with start_server("--debug-hooks", env=env, ctx=16384) as s:
        s.wait_ready()
        for path in ("/v1/chat/completions", "/v1/messages"):
            status, headers, body = post(s.url + path, {"model": "bubo", "messages": MSGS, "max_tokens": 8000})
            assert status == 503, body
            assert headers.get("Retry-After") == "5"
            err = body["error"]
            assert err["code"] == "insufficient_memory" and "send the request again" in err["message"]
        status, _, body = post(s.url + "/v1/chat/completions",
                               {"model": "bubo", "messages": MSGS, "max_tokens": 8})
        assert status == 200, body


def test_the_override_needs_the_debug_hooks():
    env = {"BUBO_DEBUG_MEM_AVAILABLE": "0"}
    with start_server(env=env, ctx=16384) as s:
        s.wait_ready()
        status, _, body = post(s.url + "/v1/chat/completions",
                               {"model": "bubo", "messages": MSGS, "max_tokens": 8000, "stop": ["."]})
        assert status == 200, body
