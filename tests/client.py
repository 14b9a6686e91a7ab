"""The tests' one HTTP client (tests/ is on sys.path: `from client import call, post_json`):
urllib, error statuses returned rather than raised, JSON bodies sent with their Content-Type."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any


def call(url: str, method: str = "GET", body: Any = None, headers: dict[str, str] | None = None,
         raw: bytes | None = None, timeout: float = 120) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body bytes) of one request: body sent as JSON, or raw as it is."""
    hdrs = dict(headers or {})
    data = raw
    if raw is None and body is not None:
        data = json.dumps(body).encode()
        hdrs.setdefault("Content-Type", "application/json")
    req = urllib.request.Request(url, data=data, method=method, headers=hdrs)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def call_json(url: str, method: str = "GET", body: Any = None, **kw: Any) -> tuple[int, Any]:
    """(status, the JSON answer)."""
    status, _, data = call(url, method, body, **kw)
    return status, json.loads(data)


def post_json(url: str, body: Any, headers: dict[str, str] | None = None,
              timeout: float = 120) -> tuple[int, dict[str, str], Any]:
    """POST body as JSON: (status, headers, the JSON answer), error statuses included."""
    status, hdrs, data = call(url, "POST", body, headers=headers, timeout=timeout)
    return status, hdrs, json.loads(data)


def get_json(url: str, headers: dict[str, str] | None = None, timeout: float = 30) -> Any:
    """GET's JSON answer; a status other than 200 is an AssertionError naming it."""
    status, _, data = call(url, headers=headers, timeout=timeout)
    assert status == 200, (status, data[:500])
    return json.loads(data)
