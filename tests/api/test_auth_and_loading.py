"""A server with API keys (from --api-key-file and BUBO_ARG_API_KEY) and a slow model load."""

from __future__ import annotations

import json
import time

import pytest
from client import call, call_json

from bubo.api.logs import plural

from .conftest import start_server
from .test_server_core import assert_error
from engines import THREADS

KEY_FLAG, KEY_FILE = "k-from-variable", "k-from-file"
LOAD_DELAY_S = 3  # the debug hook widens the loading window so /ready can be seen saying not_ready

ROUTES = [("GET", "/health"), ("GET", "/v1/health"), ("GET", "/healthz"), ("GET", "/ready"),
          ("GET", "/v1/ready"), ("GET", "/readyz"), ("GET", "/v1/models"), ("GET", "/models"),
          ("GET", "/props"), ("GET", "/slots"), ("GET", "/v1/slots"), ("GET", "/metrics"),
          ("GET", "/v1/metrics"), ("POST", "/tokenize"), ("POST", "/detokenize"), ("POST", "/apply-template"),
          ("POST", "/v1/embeddings"), ("GET", "/nope"), ("POST", "/debug/prompt"), ("GET", "/debug/cache")]


@pytest.fixture(scope="module")
def keyed(tmp_path_factory):
    f = tmp_path_factory.mktemp("keys") / "keys.txt"
    f.write_text(f"# the keys\n\n{KEY_FILE}\n")
    s = start_server("--debug-hooks", "--api-key-file", str(f),
                     env={"BUBO_ARG_API_KEY": KEY_FLAG, "BUBO_DEBUG_LOAD_DELAY_S": str(LOAD_DELAY_S)})
    try:
        # at once, while the model loads: health answers, ready and model routes say not_ready
        auth = {"Authorization": f"Bearer {KEY_FLAG}"}
        s.loading = {p: call_json(s.url + p, headers=auth) for p in ("/health", "/ready", "/props")}
        s.loading["/tokenize"] = call_json(s.url + "/tokenize", "POST", {"content": "x"}, headers=auth)
        s.wait_ready(auth)
        yield s
    finally:
        s.stop()


def test_ready_is_503_not_ready_while_the_model_loads(keyed):
    assert keyed.loading["/health"] == (200, {"status": "ok"})
    for path in ("/ready", "/props", "/tokenize"):
        status, body = keyed.loading[path]
        assert_error(status, body, 503, "not_ready", "server_error")
        assert "loading" in body["error"]["message"]
    assert keyed.first_ready_status == 503  # wait_ready saw it too, before 200
    assert call_json(keyed.url + "/ready", headers={"x-api-key": KEY_FILE})[0] == 200


@pytest.mark.parametrize("method,path", ROUTES)
def test_every_route_needs_the_key(keyed, method, path):
    body = {"content": "x"} if method == "POST" else None
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"x-api-key": "wrong"},
                    {"Authorization": KEY_FLAG}, {"Authorization": "Basic " + KEY_FLAG}):
        status, hdrs, data = call(keyed.url + path, method, body, headers=headers)
        assert_error(status, json.loads(data), 401, "invalid_api_key", "authentication_error")
        assert hdrs["WWW-Authenticate"] == "Bearer"


@pytest.mark.parametrize("headers", [{"Authorization": f"Bearer {KEY_FLAG}"}, {"Authorization": f"bearer {KEY_FILE}"},
                                     {"x-api-key": KEY_FLAG}, {"X-Api-Key": KEY_FILE},
                                     {"Authorization": "Bearer placeholder", "x-api-key": KEY_FILE}])
def test_both_headers_and_every_key_are_accepted(keyed, headers):
    assert call_json(keyed.url + "/health", headers=headers) == (200, {"status": "ok"})
    status, body = call_json(keyed.url + "/v1/models", headers=headers)
    assert status == 200 and body["data"][0]["aliases"] == ["bubo"]
    assert call_json(keyed.url + "/nope", headers=headers)[0] == 404


def test_debug_hooks_need_a_loopback_host():
    # on a non-loopback address /debug/* does not exist; 0.0.0.0 is not loopback
    with start_server("--debug-hooks", "--host", "0.0.0.0") as s:
        s.url = s.url.replace("0.0.0.0", "127.0.0.1")
        s.wait_ready()
        status, body = call_json(s.url + "/debug/cache")
        assert_error(status, body, 404, "not_found", "invalid_request_error")
        assert any("--debug-hooks ignored" in line for line in s.log)


def test_startup_log_says_address_model_context_threads_docs(keyed):
    deadline = time.monotonic() + 10
    while not any("ready:" in line for line in keyed.log) and time.monotonic() < deadline:
        time.sleep(0.05)
    log = "".join(keyed.log)
    assert f"listening on {keyed.url}" in log
    assert "as 'smollm2:135m' (also: bubo)" in log
    assert f"{plural(THREADS, 'thread')}; context 2048;" in log and "context 2048 tokens (trained 8192)" in log
    assert "API key required" in log
    assert f"the routes: {keyed.url}/openapi.json" in log


def test_sigterm_stops_the_server_cleanly():
    s = start_server()
    try:
        s.wait_ready()
        s.proc.terminate()
        assert s.proc.wait(20) == 0
        time.sleep(0.1)  # the drain thread reads the last lines
        assert any("bubo serve: stopped" in line for line in s.log), "".join(s.log)
    finally:
        s.stop()
