"""The Host check (bubo.api.auth.check_host): a request under a name the server does not answer
to is refused on every route, the chat page included, before its key or body is looked at, so a
web page whose host name was pointed at this machine (DNS rebinding) reaches nothing."""

from __future__ import annotations

import pytest

from bubo.api.app import create_app
from bubo.api.auth import host_allowed, host_name
from bubo.api.config import ServerConfig
from bubo.engine.engine import Engine

REBOUND = "attacker.example:8080"


def _app(**cfg):
    engine = Engine("smollm2:135m")  # never started: no model is needed to be refused
    return create_app(engine, ServerConfig(served_model_name="bubo", **cfg))


def _routes(app):
    """(method, path) of every route, with its variables filled in."""
    out = []
    for rule in app.url_map.iter_rules():
        path = rule.rule
        for arg in rule.arguments:
            path = path.replace(f"<{arg}>", "x").replace(f"<path:{arg}>", "x")
        for method in sorted((rule.methods or set()) - {"HEAD", "OPTIONS"}):
            out.append((method, path))
    return out


@pytest.mark.parametrize("host,bind,allow,keyed,ok", [
    ("127.0.0.1:8080", "127.0.0.1", [], False, True),
    ("localhost:8080", "127.0.0.1", [], False, True),
    ("LOCALHOST", "127.0.0.1", [], False, True),
    ("[::1]:8080", "127.0.0.1", [], False, True),
    ("app.localhost:8080", "127.0.0.1", [], False, True),  # *.localhost is loopback in every browser
    ("192.0.2.7:8080", "127.0.0.1", [], False, True),  # an address: no page can be rebound to it
    ("[fd00::2]:8080", "0.0.0.0", [], False, True),
    ("my-box.lan:8080", "0.0.0.0", ["my-box.lan"], False, True),
    ("my-box.lan.", "127.0.0.1", ["MY-BOX.lan"], False, True),
    ("my-box.lan", "my-box.lan", [], False, True),  # the bind address itself
    (REBOUND, "127.0.0.1", [], False, False),
    (REBOUND, "0.0.0.0", [], False, False),  # a public address without a key: the same
    (REBOUND, "0.0.0.0", [], True, True),  # with a key: a rebound page cannot send it
    (REBOUND, "127.0.0.1", [], True, True),  # the same behind a proxy that forwards Host
    ("api.example.com", "127.0.0.1", [".example.com"], False, True),
    ("example.com", "127.0.0.1", [".example.com"], False, True),
    ("evilexample.com", "127.0.0.1", [".example.com"], False, False),
    (REBOUND, "127.0.0.1", ["*"], False, True),
    ("localhost.attacker.example", "127.0.0.1", [], False, False),
    ("127.0.0.1.attacker.example", "127.0.0.1", [], False, False),
    (None, "127.0.0.1", [], False, True),  # no Host at all: no browser sends that
])
def test_which_names_are_answered(host, bind, allow, keyed, ok):
    assert host_allowed(host, bind, allow, keyed) is ok


def test_host_names_lose_port_and_brackets():
    assert host_name("Example.COM:80") == "example.com"
    assert host_name("[::1]:8080") == "::1"
    assert host_name("::1") == "::1"  # no brackets: an address with colons, not a port


def test_every_route_refuses_a_rebound_name_in_its_own_error_shape():
    app = _app()
    c = app.test_client()
    routes = _routes(app)
    assert len(routes) > 40
    for method, path in routes:
        r = c.open(path, method=method, headers={"Host": REBOUND}, json={"model": "bubo"})
        assert r.status_code == 403, (method, path, r.status_code, r.data[:200])
        body = r.json
        if path.startswith("/api/") or path == "/v1/systemone":  # Ollama's shape
            assert "attacker.example" in body["error"] and "--host-allow" in body["error"], (path, body)
        elif path.startswith("/v1/messages"):
            assert body["type"] == "error" and body["error"]["code"] == "forbidden_host", (path, body)
        elif path == "/mcp":  # a JSON-RPC error
            assert body["error"]["code"] == -32600 and body["error"]["data"]["code"] == "forbidden_host", body
        else:
            assert body["error"]["code"] == "forbidden_host", (path, body)
    # the chat page too
    r = c.get("/", headers={"Host": REBOUND})
    assert r.status_code == 403 and r.json["error"]["code"] == "forbidden_host"


def test_the_default_names_and_the_configured_ones_are_answered():
    c = _app(host_allow=["my-box.lan"]).test_client()
    for host in ("localhost", "127.0.0.1:8080", "[::1]:8080", "my-box.lan:8080", "MY-BOX.LAN", "192.0.2.7"):
        r = c.get("/health", headers={"Host": host})
        assert (r.status_code, r.json) == (200, {"status": "ok"}), host
    assert c.get("/", headers={"Host": "localhost:8080"}).status_code == 200  # the chat page
    assert c.get("/health", headers={"Host": "other.lan"}).status_code == 403
    # with a key: any name (a rebound page cannot send the key), the key still required
    keyed = _app(api_keys=["k"]).test_client()
    assert keyed.get("/health", headers={"Host": "gpu-box.example", "Authorization": "Bearer k"}).status_code == 200
    assert keyed.get("/health", headers={"Host": "gpu-box.example"}).status_code == 401
