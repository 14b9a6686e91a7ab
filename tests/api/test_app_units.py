"""The app layer without a model: resolve_model, error shapes, SSE framing and pings."""

from __future__ import annotations

import json

import gevent
import pytest
from flask import Flask

from bubo.api.app import create_app
from bubo.api.config import ServerConfig
from bubo.api.errors import ApiError, StreamShape, anthropic_error, api_error, error_response
from bubo.api.request import resolve_model
from bubo.api.sse import _events, format_event, format_line
from bubo.engine.engine import Engine


@pytest.fixture
def app() -> Flask:
    engine = Engine("smollm2:135m")  # never started: the model is "loading"
    cfg = ServerConfig(served_model_name="my-model", aliases=["alias-a", "bubo"])
    app = create_app(engine, cfg)

    @app.route("/boom")
    def boom():
        raise RuntimeError("kaput")

    @app.route("/v1/messages/boom", methods=["POST"])
    def boom_anthropic():
        raise ApiError(503, "memory_pressure", "low memory")

    return app


def test_resolve_model(app):
    with app.app_context():
        for name in ("my-model", "alias-a", "bubo"):
            assert resolve_model({"model": name}) == name
        for body in ({}, {"model": None}, {"model": ""}):
            with pytest.raises(ApiError) as e:
                resolve_model(body)
            assert (e.value.status, e.value.code) == (400, "missing_model")
        with pytest.raises(ApiError) as e:
            resolve_model({"model": "nope"})
        assert (e.value.status, e.value.code) == (404, "model_not_found")
        assert "'nope'" in e.value.message and "'my-model'" in e.value.message
        with pytest.raises(ApiError) as e:
            resolve_model({"model": 3})
        assert e.value.status == 400


def test_served_names_have_no_duplicates():
    assert ServerConfig(served_model_name="bubo", aliases=["x", "x"]).model_names == ["bubo", "x"]


def test_loading_engine_answers_not_ready(app):
    c = app.test_client()
    assert c.get("/health").json == {"status": "ok"}
    r = c.get("/ready")
    assert r.status_code == 503 and r.json["error"]["code"] == "not_ready"
    assert c.get("/slots").json == []
    assert c.get("/metrics").status_code == 200


def test_unexpected_exception_is_a_500_in_the_error_shape(app):
    r = app.test_client().get("/boom")
    assert r.status_code == 500
    assert r.json == {"error": {"message": "internal error: RuntimeError: kaput", "type": "server_error",
                                "code": "internal_error"}}


def test_anthropic_paths_get_the_anthropic_shape(app):
    c = app.test_client()
    r = c.post("/v1/messages/boom")
    assert r.status_code == 503 and r.headers["Retry-After"] == "5"
    body = r.json
    assert body["type"] == "error" and body["request_id"].startswith("req_")
    assert body["error"] == {"type": "overloaded_error", "message": "low memory", "code": "memory_pressure"}
    r = c.post("/v1/messages/count_tokens/nope")
    assert r.status_code == 404 and r.json["error"]["type"] == "not_found_error"


def test_error_helpers():
    with Flask("t").app_context():
        r = api_error(507, "insufficient_memory_permanent", "too big")
        assert r.json["error"]["type"] == "server_error" and "Retry-After" not in r.headers
        r = anthropic_error(401, "invalid_api_key", "no")
        assert r.json["error"]["type"] == "authentication_error"
        r = error_response("/v1/chat/completions", ApiError(503, "insufficient_memory", "later"))
        assert r.headers["Retry-After"] == "5" and r.json["error"]["type"] == "server_error"


def test_sse_framing():
    assert format_event({"a": "é"}) == 'data: {"a":"é"}\n\n'
    assert format_event("[DONE]") == "data: [DONE]\n\n"
    assert format_event(("message_stop", {"type": "message_stop"})) == \
        'event: message_stop\ndata: {"type":"message_stop"}\n\n'


class _Stream:
    cancelled = False

    def cancel(self):
        self.cancelled = True


def test_sse_pings_during_silence_and_cancels_at_the_end():
    def slow():
        gevent.sleep(0.35)
        yield {"n": 1}
        yield "[DONE]"

    stream = _Stream()
    out = list(_events(slow(), stream, 0.1, None, format_event, StreamShape.OPENAI))
    assert out[:2] == [b": ping\n\n", b": ping\n\n"]
    assert out[-2:] == [b'data: {"n":1}\n\n', b"data: [DONE]\n\n"]
    assert stream.cancelled  # harmless once finished; frees the slot when the client left early


def test_ndjson_lines_and_an_in_band_error():
    def failing():
        yield {"text": "a\nb", "done": False}
        raise RuntimeError("boom")

    out = list(_events(failing(), _Stream(), None, None, format_line, StreamShape.OLLAMA))
    assert out[0] == b'{"text":"a\\nb","done":false}\n'  # the newline travels escaped: one object a line
    assert json.loads(out[1]) == {"error": "internal error: RuntimeError: boom"} and out[1].endswith(b"\n")


def test_sse_closing_kills_the_producer():
    finished = []

    def endless():
        try:
            while True:
                gevent.sleep(0.01)
                yield {"x": 1}
        finally:
            finished.append(True)

    stream = _Stream()
    it = _events(endless(), stream, 1.0, None, format_event, StreamShape.OPENAI)
    assert next(it) == b'data: {"x":1}\n\n'
    it.close()  # what the WSGI server does when a write to the client fails
    gevent.sleep(0.05)
    assert finished == [True] and stream.cancelled


def test_sse_reports_a_failing_generator_in_band():
    def bad():
        yield {"ok": 1}
        raise KeyError("x")

    out = list(_events(bad(), None, 1.0, None, format_event, StreamShape.OPENAI))
    assert out[0] == b'data: {"ok":1}\n\n' and b'"code":"internal_error"' in out[1]
    # each dialect's stream ends in its own error shape: Anthropic's is a named error event
    out = list(_events(bad(), None, 1.0, None, format_event, StreamShape.ANTHROPIC))
    name, data = out[1].decode().split("\n")[:2]
    assert name == "event: error"
    err = json.loads(data.removeprefix("data: "))
    assert err["type"] == "error" and err["error"]["type"] == "api_error" and "KeyError" in err["error"]["message"]


def test_cors_only_for_configured_origins():
    engine = Engine("smollm2:135m")
    c = create_app(engine, ServerConfig(cors_origins=["http://ok.example"])).test_client()
    r = c.get("/health", headers={"Origin": "http://ok.example"})
    assert r.headers["Access-Control-Allow-Origin"] == "http://ok.example"
    r = c.get("/health", headers={"Origin": "http://evil.example"})
    assert "Access-Control-Allow-Origin" not in r.headers
    c = create_app(engine, ServerConfig()).test_client()
    assert "Access-Control-Allow-Origin" not in c.get("/health", headers={"Origin": "http://ok.example"}).headers


def test_preflight_needs_no_key():
    engine = Engine("smollm2:135m")
    c = create_app(engine, ServerConfig(api_keys=["k"], cors_origins=["*"])).test_client()
    r = c.options("/tokenize", headers={"Origin": "http://a.example", "Access-Control-Request-Method": "POST"})
    assert r.status_code == 200 and r.headers["Access-Control-Allow-Origin"] == "http://a.example"
    assert c.post("/tokenize", json={"content": "x"}).status_code == 401


def test_requests_from_foreign_web_pages_are_refused():
    """A page from another origin cannot make the browser change anything here (pull, delete,
    generate); the server's own page, clients without Origin, GETs and --cors origins can."""
    c = create_app(Engine("smollm2:135m"), ServerConfig(cors_origins=["http://ok.example"])).test_client()
    body = json.dumps({"model": "x"})
    r = c.post("/api/pull", data=body, headers={"Origin": "http://evil.example"})
    assert r.status_code == 403 and "--cors" in r.json["error"]  # Ollama's shape on /api/
    r = c.post("/tokenize", data=body, headers={"Origin": "null"})
    assert r.status_code == 403 and r.json["error"]["code"] == "forbidden_origin"
    assert c.delete("/api/delete", data=body, headers={"Origin": "http://evil.example"}).status_code == 403
    hi = json.dumps({"content": "hi"})
    # the server's own origin (the test client's host), a --cors one, and no Origin (not a page) pass the
    # check: the model is still loading
    for headers in ({"Origin": "http://localhost"}, {"Origin": "http://ok.example"}, {}):
        assert c.post("/tokenize", data=hi, headers=headers).status_code == 503
    assert c.get("/health", headers={"Origin": "http://evil.example"}).status_code == 200


def test_only_the_blob_route_takes_head():
    """Ollama's HEAD /api/blobs/<digest> asks whether a blob is there (501: none ever is); its other
    routes of model creation take POST only."""
    c = create_app(Engine("smollm2:135m"), ServerConfig()).test_client()
    assert c.head("/api/create").status_code == 405 and c.head("/api/push").status_code == 405
    assert c.head("/api/blobs/sha256-00").status_code == 501 and c.post("/api/blobs/sha256-00").status_code == 501
    assert c.post("/api/create", json={}).status_code == 501


def test_ignored_field_names_in_a_header_are_printable_and_bounded():
    from bubo.api.app import MAX_NAMED_FIELDS, header_names

    assert header_names(["max_token", "temprature"]) == "max_token, temprature"
    odd = header_names(["\u00c6\x1d", "d\udb1d\udf65", "a\r\nX-Evil: 1", "\x7f", "x" * 100])
    assert odd.isascii() and all(32 <= ord(c) < 127 for c in odd), odd  # no control character, no CR/LF
    assert odd.startswith("\\u00c6\\u001d, d\\udb1d\\udf65, a\\r\\nX-Evil: 1, \\u007f, " + "x" * 64 + "...")
    many = header_names([f"f{i}" for i in range(MAX_NAMED_FIELDS + 5)])
    assert many.endswith(f"f{MAX_NAMED_FIELDS - 1} (and 5 more)")


def test_a_coroutine_route_is_refused_at_start():
    """The app skips Flask's per-call coroutine check (its routes and hooks are plain functions):
    a coroutine among them would never run, so the app refuses it when built."""
    from bubo.api.app import _no_coroutines

    app = Flask("t")

    @app.get("/plain")
    def plain() -> str:
        return "ok"

    _no_coroutines(app)

    @app.before_request
    async def hook() -> None:
        pass

    with pytest.raises(TypeError, match="hook"):
        _no_coroutines(app)


def test_a_small_body_is_read_inline_unless_it_holds_a_schema(app):
    """request.small_body: at most offload.SMALL_CHARS bytes as json_body read them (a chunked
    body counts what arrived: it cannot be read twice) and no field whose reading compiles what
    it holds; looking does not count those fields as read."""
    from bubo.api import offload
    from bubo.api.request import json_body, small_body

    def judged(data: bytes, chunked: bool = False) -> bool:
        # chunked: the body as pywsgi hands it over, unframed, once (a second read gives b"")
        headers = {"Transfer-Encoding": "chunked"} if chunked else {}
        with app.test_request_context("/completion", method="POST", data=data, headers=headers,
                                      content_type="application/json"):
            body = json_body()
            small = small_body(body)
            assert not body.read  # nothing looked up yet
            return small

    assert judged(b'{"prompt": "hi", "n_predict": 1}')
    assert not judged(b'{"prompt": "hi", "json_schema": {"type": "string"}}')
    assert not judged(b'{"messages": [], "tools": []}')
    assert not judged(json.dumps({"prompt": "x" * offload.SMALL_CHARS}).encode())
    assert not judged(json.dumps({"prompt": "x" * offload.SMALL_CHARS}).encode(), chunked=True)


class _Input:
    """A server's body input as pywsgi's reports it: read(n) gives what arrived, or fails."""

    def __init__(self, data: bytes, error: BaseException | None = None):
        self.data, self.error, self.reads = data, error, 0

    def read(self, n: int = -1) -> bytes:
        self.reads += 1
        if self.error is not None:
            raise self.error
        out, self.data = self.data[:n], self.data[n:]
        return out


@pytest.mark.parametrize("arrived,error,want", [
    (b'{"prompt": "hi"}', None, 200),
    (b'{"prompt": "hi"', None, 400),  # cut short: one byte of 16 never came
    (b"", OSError("timed out"), 400),  # the server's read deadline
    (b"", ValueError("I/O operation on closed file"), 400),
], ids=["whole", "cut short", "read deadline", "closed"])
def test_a_body_of_a_known_length_is_read_once_from_the_servers_input(app, arrived, error, want):
    """request._sized_body: a Content-Length body from a server that ends its input (pywsgi's
    wsgi.input_terminated) is read in one call; what cannot be read whole is the 400 that closes
    the connection (as werkzeug's reading reports it); a second look gives the same bytes."""
    from bubo.api.request import _body_bytes

    given = _Input(arrived, error)
    with app.test_request_context("/completion", method="POST", content_length=16, content_type="application/json",
                                  environ_overrides={"wsgi.input": given, "wsgi.input_terminated": True}):
        try:
            raw = _body_bytes()
        except ApiError as e:
            assert want == 400 and e.status == 400 and e.code == "bad_request", e
            assert "could not be read: it did not arrive in time" in e.message and e.headers == {"Connection": "close"}
            return
        assert want == 200 and raw == b'{"prompt": "hi"}'
        assert _body_bytes() == raw and given.reads == 1
