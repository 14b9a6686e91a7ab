"""The server core against a real `python -m bubo serve` process, over plain HTTP."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.api.conftest import MODEL, start_server

# the latency bound the issue sets for /health and /metrics while a generation runs
FAST_ANSWER_S = 0.100


def call(url: str, method: str = "GET", body: Any = None, headers: dict[str, str] | None = None,
         raw: bytes | None = None, timeout: float = 30) -> tuple[int, dict[str, str], bytes]:
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def call_json(url: str, method: str = "GET", body: Any = None, **kw: Any) -> tuple[int, Any]:
    status, _, data = call(url, method, body, **kw)
    return status, json.loads(data)


def assert_error(status: int, body: Any, want_status: int, code: str, type_: str) -> None:
    assert status == want_status, body
    assert set(body) == {"error"}, body
    err = body["error"]
    assert err["code"] == code and err["type"] == type_, err
    assert isinstance(err["message"], str) and err["message"], err


# --- health, ready, models ----------------------------------------------------------------


@pytest.mark.parametrize("path", ["/health", "/v1/health", "/healthz"])
def test_health(base_url, path):
    assert call_json(base_url + path) == (200, {"status": "ok"})


@pytest.mark.parametrize("path", ["/ready", "/v1/ready", "/readyz"])
def test_ready(base_url, path):
    assert call_json(base_url + path) == (200, {"status": "ready", "model": MODEL})


@pytest.mark.parametrize("path", ["/v1/models", "/models"])
def test_models_lists_served_id_and_bubo(base_url, path):
    status, body = call_json(base_url + path)
    assert status == 200 and body["object"] == "list"
    assert [m["id"] for m in body["data"]] == [MODEL, "bubo"]
    for m in body["data"]:
        assert m["object"] == "model" and m["owned_by"] == "bubo"
        assert m["context_length"] == m["max_model_len"] == m["meta"]["n_ctx"] == 2048
        assert m["architecture"]["input_modalities"] == ["text"]
