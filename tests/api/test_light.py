"""Light routes (bubo.api.light): a plain GET /health, POST /tokenize, /v1/embeddings or
/completion is answered beneath Flask, with the bytes Flask would answer (a completion's, but for
what it says of its run: its times, its cached tokens, its slot); anything else goes through
Flask as before."""

from __future__ import annotations

import contextlib
import io
import json
import socket
from collections.abc import Iterator
from typing import Any

import pytest
from gevent import pywsgi
from werkzeug.test import EnvironBuilder, run_wsgi_app

from bubo.api import light
from bubo.api.app import create_app
from bubo.api.config import ServerConfig
from bubo.engine.engine import Engine
from bubo.engine.registry import ModelSpec, Registry

from engines import start_engine


def _started(path: Any) -> Iterator[Engine]:
    e = start_engine(path, n_ctx=512, n_threads=1)
    try:
        yield e
    finally:
        e.stop("test over")


@pytest.fixture(scope="module")
def engine(catalog_model) -> Iterator[Engine]:
    yield from _started(catalog_model("smollm2:135m"))


@pytest.fixture(scope="module")
def app(engine):
    return create_app(engine, ServerConfig(served_model_name="bubo", aliases=["smol"]))


@pytest.fixture(autouse=True)
def no_light_answer_fails(caplog):
    """A light answer that raises is logged and left to Flask: each test fails on it too."""
    yield
    failed = [r.getMessage() for r in caplog.get_records("call")
              if r.name == "bubo.api" and "light answer" in r.getMessage()]
    assert not failed, failed


@contextlib.contextmanager
def flask_only(app) -> Iterator[None]:
    routes: light.LightRoutes = app.wsgi_app
    table, routes.table = routes.table, {}
    try:
        yield
    finally:
        routes.table = table


def answered(app, method: str, path: str, **kw: Any) -> tuple[tuple[Any, ...], bool]:
    """(status, headers but Date, body) of the request, and whether Flask answered it."""
    routes: light.LightRoutes = app.wsgi_app
    calls = []
    inner = routes.flask

    def counted(environ, start_response):
        calls.append(environ["PATH_INFO"])
        return inner(environ, start_response)

    routes.flask = counted
    try:
        r = app.test_client().open(path, method=method, **kw)
        data = r.get_data()
        r.close()  # as the server does once the answer is written
    finally:
        routes.flask = inner
    headers = sorted((k, v) for k, v in r.headers.items() if k != "Date")
    return (r.status, headers, data), bool(calls)


def same_both_ways(app, method: str, path: str, **kw: Any) -> tuple[bool, bytes]:
    """Whether the light path answered, and the answer's body; fails unless Flask alone answers
    with the same status, headers and bytes."""
    got, by_flask = answered(app, method, path, **kw)
    with flask_only(app):
        want, _ = answered(app, method, path, **kw)
    assert got == want, (method, path, kw)
    return not by_flask, got[2]


@pytest.mark.parametrize("path", ["/health", "/v1/health", "/healthz"])
def test_health_is_light(app, path):
    assert same_both_ways(app, "GET", path) == (True, b'{"status":"ok"}\n')


TEXTS = ["Hello world", "", " ", "naïve café 🦉 — «quotes» \"and\" \\ back\nslash\t\u2028",
         "<|im_start|>user\nhi<|im_end|>", "x" * 1024]


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("fields", [{}, {"add_special": True}, {"parse_special": False}, {"parse_special": None},
                                    {"add_special": False, "parse_special": True, "with_pieces": False}])
def test_tokenize_is_light_with_the_routes_fields(app, engine, text, fields):
    body = {"content": text, **fields}
    light_answered, data = same_both_ways(app, "POST", "/tokenize", json=body)
    assert light_answered
    add_special = fields.get("add_special") is True
    parse_special = fields.get("parse_special") is not False  # null: the default
    want = engine.runtime.tokenizer.encode(text, add_special=add_special, parse_special=parse_special)
    assert json.loads(data) == {"tokens": want}


@pytest.mark.parametrize("body", [
    {"content": "Hello", "with_pieces": True},  # pieces: Flask
    {"content": "Hello", "model": "bubo"},  # a model's name
    {"content": "Hello", "model": "nope"},
    {"content": "Hello", "typo": 1},  # X-Bubo-Ignored-Fields
    {"content": 3},  # the route's 400
    {"content": "Hello", "add_special": "yes"},
    {},
    {"content": "x" * 1025},  # past offload.SMALL_CHARS: Flask (the preparation pool)
])
def test_tokenize_that_is_not_plain_goes_through_flask(app, body):
    light_answered, _ = same_both_ways(app, "POST", "/tokenize", json=body)
    assert not light_answered


# what a completion's answer says of its run, not of the request: its times
_RUN_FIELDS = ("timings",)


def _completion_both_ways(app, body: dict[str, Any]) -> tuple[bool, dict[str, Any] | None]:
    """Whether the light path answered, and the answer; fails unless Flask alone gives the same
    status, headers (the length aside) and JSON, but for the fields of the run (_RUN_FIELDS)."""
    def comparable(got: tuple[Any, ...]) -> tuple[Any, ...]:
        status, headers, data = got
        assert dict(headers)["Content-Length"] == str(len(data))
        value = json.loads(data)
        if isinstance(value, dict):
            for key in _RUN_FIELDS:
                value.pop(key, None)
        return status, [(k, v) for k, v in headers if k != "Content-Length"], value

    got, by_flask = answered(app, "POST", "/completion", json=body)
    with flask_only(app):
        want, _ = answered(app, "POST", "/completion", json=body)
    assert comparable(got) == comparable(want), body
    return not by_flask, json.loads(got[2])


@pytest.mark.parametrize("body", [
    {"prompt": "The capital of France is", "n_predict": 4, "temperature": 0},
    {"prompt": "Hello", "n_predict": 3, "temperature": 0, "return_tokens": True, "stop": ["\n", "."]},
    {"prompt": "Once upon a time", "n_predict": 3, "temperature": 0.8, "seed": 7, "top_k": 5, "cache_prompt": False},
    {"prompt": "naïve café 🦉", "n_predict": 1, "temperature": 0},  # (no seed: each answer would draw its own)
    {"prompt": "Count: one, two,", "n_predict": 2, "ignore_eos": True, "min_p": 0.1, "temperature": 0},
    {"prompt": "", "n_predict": 2},  # its 400s, answered by the light answer: an empty prompt,
    {"prompt": "1" * 980, "n_predict": 1},  # one past the context (a token per digit)
])
def test_a_plain_completion_is_light_with_flasks_answer(app, body):
    light_answered, answer = _completion_both_ways(app, body)
    assert light_answered
    assert app.config["BUBO_MODELS"].default.users == 0  # let go
    assert answer is not None
    if body["prompt"] and len(body["prompt"]) < 512:
        assert answer["model"] == "bubo" and answer["stop"] is True
    else:  # its error (an empty prompt, one past the context)
        assert answer["error"]["code"] in ("invalid_value", "context_length_exceeded")


@pytest.mark.parametrize("body", [
    {"prompt": "Hello", "n_predict": 2, "stream": True},  # a stream: Flask's SSE
    {"prompt": "Hello", "n_predict": 2, "model": "bubo"},  # a model's name
    {"prompt": "Hello", "n_predict": 2, "n_probs": 2},
    {"prompt": "Hello", "n_predict": 2, "json_schema": {"type": "object"}},  # a grammar
    {"prompt": "Hello", "n_predict": 2, "receipt": False},
    {"prompt": "Hello", "n_predict": 2, "speculative.n_max": 2},  # drafting's
    {"prompt": "Hello", "n_predict": 2, "lora": [{"id": 0, "scale": 1.0}]},
    {"prompt": "Hello", "n_predict": 2, "context_id": "c1"},
    {"prompt": "Hello", "n_predict": 2, "grammar": ""},  # a field compiled in the preparation pool
    {"prompt": "Hello", "n_predict": 2, "dry_multiplier": 0.8},  # DRY: every token's text (the pool)
    {"prompt": "Hello"},  # no n_predict: an answer of any length
    {"prompt": "Hello", "n_predict": 1100},  # an answer too long to write on the event loop
    {"prompt": [1, 2, 3], "n_predict": 2},  # token ids
    {"prompt": "Hello", "n_predict": 2, "typo": 1},  # X-Bubo-Ignored-Fields
    {"prompt": "Hello", "n_predict": "two"},  # the route's 400s
    {"prompt": "Hello", "n_predict": 0},
    {"prompt": "x" * 1025, "n_predict": 1},  # past offload.SMALL_CHARS: Flask (the preparation pool)
])
def test_a_completion_that_is_not_plain_goes_through_flask(app, body):
    _, by_flask = answered(app, "POST", "/completion", json=body)
    assert by_flask


@pytest.mark.parametrize("config", [{"n_predict": 5}, {"sampling_defaults": {"temperature": 0.2}},
                                    {"debug_hooks": True}])
def test_a_server_with_defaults_of_its_own_answers_completions_through_flask(engine, config):
    """A server's -n and sampling flags are read in the app's context, which a light answer has not."""
    app = create_app(engine, ServerConfig(served_model_name="bubo", **config))
    _, by_flask = answered(app, "POST", "/completion", json={"prompt": "Hello", "n_predict": 2, "temperature": 0})
    assert by_flask


def test_a_light_completion_counts_its_tokens_for_the_log_line_and_the_unnamed_caller(app):
    counts = app.config["BUBO_CALLERS"]
    before = counts.counts["-"].generated_tokens if "-" in counts.counts else 0
    environ = _environ("/completion", data=b'{"prompt": "One, two,", "n_predict": 3, "temperature": 0}')
    out = app.wsgi_app(environ, lambda status, headers: None)
    assert isinstance(out, light._Counted)  # answered light
    record = environ["bubo.log"]
    assert record["model"] == "bubo" and record["prompt_tokens"] > 0 and record["generated_tokens"] == 3
    assert counts.counts["-"].running == 0  # the generation's hold given back
    out.close()
    assert counts.counts["-"].generated_tokens == before + 3


@pytest.mark.parametrize("by_flask", [False, True])
def test_a_client_gone_before_its_completion_is_answered_stops_the_generation(app, by_flask):
    """The answer's wait watches the client's socket (environ["bubo.socket"]), light or not: a
    client whose end is closed cancels its job within a step, and the slot is free for the next."""
    mine, theirs = socket.socketpair()
    theirs.close()  # gone: the first look at the socket reads its end
    body = b'{"prompt": "Count: one, two,", "n_predict": 400, "ignore_eos": true, "temperature": 0}'
    environ = _environ("/completion", data=body, **{"bubo.socket": mine})
    try:
        with flask_only(app) if by_flask else contextlib.nullcontext():
            out = app.wsgi_app(environ, lambda status, headers: None)
            assert isinstance(out, light._Counted) != by_flask  # answered the way asked
            b"".join(out)
            out.close()
    finally:
        mine.close()
    assert environ["bubo.log"]["generated_tokens"] <= 4, environ["bubo.log"]  # not 400
    assert app.config["BUBO_MODELS"].default.users == 0
    # the next answer is whole
    ok = app.test_client().post("/completion", json={"prompt": "One, two,", "n_predict": 3, "temperature": 0})
    assert ok.status_code == 200 and ok.json["tokens_predicted"] == 3, ok.json


@pytest.mark.parametrize("data", [
    b"", b"{", b"[1, 2]", b'"text"', b"\xff\xfe", b'{"content": "a", "content": "b"}', b'{"content": "\\ud800"}',
    b'{"content": NaN}', b"[" * 200, b"\xef\xbb\xbf{}",
    # a field given twice: the last counts, but the one before must pass jsonin's checks too
    b'{"content": 1.' + b"0" * 200 + b', "content": "hi"}',
    b'{"content": ' + b"[" * 200 + b"]" * 200 + b', "content": "hi"}',
])
def test_a_body_that_is_not_plain_json_goes_through_flask(app, data):
    same_both_ways(app, "POST", "/tokenize", data=data, content_type="application/json")


def test_requests_that_are_not_plain_go_through_flask(app):
    cases = [
        ("GET", "/health?x=1", {}),  # a query string
        ("GET", "/health", {"headers": {"Origin": "http://example.com"}}),
        ("GET", "/health", {"headers": {"Host": "attacker.example"}}),  # refused: DNS rebinding
        ("GET", "/health", {"data": b"{}"}),  # a GET with a body
        ("POST", "/tokenize", {"data": b'{"content": "hi"}', "headers": {"Transfer-Encoding": "chunked"}}),
        ("POST", "/tokenize", {"json": {"content": "hi"}, "headers": {"Origin": "http://localhost"}}),
        ("POST", "/health", {}),  # 405
        ("HEAD", "/health", {}),
    ]
    for method, path, kw in cases:
        light_answered, _ = same_both_ways(app, method, path, **kw)
        assert not light_answered, (method, path, kw)


def test_with_keys_draining_or_a_model_not_loaded_every_request_goes_through_flask(engine):
    keyed = create_app(engine, ServerConfig(served_model_name="bubo", api_keys=["k"]))
    for headers in ({}, {"Authorization": "Bearer k"}):
        assert same_both_ways(keyed, "GET", "/health", headers=headers)[0] is False
        assert same_both_ways(keyed, "POST", "/tokenize", json={"content": "hi"}, headers=headers)[0] is False
    cfg = ServerConfig(served_model_name="bubo")
    draining = create_app(engine, cfg)
    cfg.draining = True
    assert same_both_ways(draining, "GET", "/health")[0] is False
    loading = create_app(Engine("smollm2:135m"), ServerConfig(served_model_name="bubo"))  # never started
    assert same_both_ways(loading, "GET", "/health")[0] is True  # no model needed
    assert same_both_ways(loading, "POST", "/tokenize", json={"content": "hi"})[0] is False  # Flask's 503


def test_a_request_answered_light_counts_for_the_unnamed_caller_and_holds_no_model(app):
    counts = app.config["BUBO_CALLERS"]
    entry = app.config["BUBO_MODELS"].default
    before = counts.counts["-"].requests if "-" in counts.counts else 0
    assert same_both_ways(app, "POST", "/tokenize", json={"content": "hi"})[0]
    assert counts.counts["-"].requests == before + 2  # once light, once by Flask
    assert entry.users == 0


def test_create_apps_hooks_are_the_ones_the_light_path_stands_in_for(app):
    """A hook added to create_app must be taught to bubo.api.light (STANDS_IN_FOR), or light
    answers would skip it."""
    assert light.as_built(app)


def test_an_app_with_a_hook_of_its_own_answers_every_request_through_flask(engine):
    app = create_app(engine, ServerConfig(served_model_name="bubo"))
    seen = []

    @app.before_request
    def mine() -> None:
        seen.append(1)

    c = app.test_client()
    assert c.get("/health").status_code == 200 and c.post("/tokenize", json={"content": "hi"}).status_code == 200
    assert seen == [1, 1]
    assert not light.as_built(app)


def _environ(path: str = "/tokenize", method: str = "POST", data: bytes = b"", **env: Any) -> dict[str, Any]:
    """A request's environ as pywsgi makes it (its input says where the body ends)."""
    environ = EnvironBuilder(path, method=method, data=data, content_type="application/json").get_environ()
    environ["wsgi.input_terminated"] = True
    environ.update(env)
    return environ


def _run(wsgi: Any, environ: dict[str, Any]) -> tuple[str, dict[str, str], bytes]:
    body, status, headers = run_wsgi_app(wsgi, environ, buffered=True)
    return status, {k: v for k, v in headers.items() if k != "Date"}, b"".join(body)


class _Broken(io.RawIOBase):
    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        raise OSError("the connection was reset")


def _pywsgi_input(data: bytes, length: int) -> Any:
    """pywsgi's input over a socket whose client sent data and no more (a read past it fails)."""
    return pywsgi.Input(io.BufferedReader(io.BytesIO(data)), length)  # type: ignore[no-untyped-call]


@pytest.mark.parametrize("stream", [_Broken, lambda: _pywsgi_input(b'{"content": "hi"}', 40)])  # it fails; it is cut
def test_a_body_that_cannot_be_read_whole_gets_flasks_answer(app, stream):
    got, want = (_run(wsgi, _environ(**{"wsgi.input": stream(), "CONTENT_LENGTH": "40"}))
                 for wsgi in (app.wsgi_app, app.wsgi_app.flask))
    assert got == want
    assert got[0].startswith("400") and json.loads(got[2])["error"]["code"] == "bad_request", got
    assert got[1]["Connection"] == "close"


def test_a_content_length_of_other_digits_goes_through_flask(app):
    def environ() -> dict[str, Any]:
        return _environ(data=b'{"content": "hi"}', CONTENT_LENGTH="\u00b2")  # a digit to str.isdigit, not to int

    assert _run(app.wsgi_app, environ()) == _run(app.wsgi_app.flask, environ())


def test_a_light_answer_logs_its_model_holds_it_and_counts_once_written(app):
    counts = app.config["BUBO_CALLERS"]
    entry = app.config["BUBO_MODELS"].default
    before = counts.counts["-"].requests if "-" in counts.counts else 0
    entry.last_used = 0.0
    environ = _environ(data=b'{"content": "hi"}')
    out = app.wsgi_app(environ, lambda status, headers: None)
    assert isinstance(out, light._Counted)  # answered light
    assert environ["bubo.log"]["model"] == "bubo"  # the log line names it
    assert entry.last_used > 0 and entry.users == 0  # acquired (idle sleep sees it used), and let go
    assert (counts.counts["-"].requests if "-" in counts.counts else 0) == before
    out.close()  # pywsgi, once the answer is written
    assert counts.counts["-"].requests == before + 1


def test_health_names_a_problem_of_the_responses_store(app):
    store = app.config["BUBO_RESPONSES"]
    for problem in ("the store cannot be written", "a path with a lone surrogate \udcff"):
        store.problem = problem
        try:
            light_answered, data = same_both_ways(app, "GET", "/health")
        finally:
            store.problem = None
        assert light_answered and json.loads(data)["details"]["responses_store"] == problem


def test_in_debug_mode_every_request_goes_through_flask(app):
    app.debug = True  # jsonify indents
    try:
        assert same_both_ways(app, "GET", "/health")[0] is False
    finally:
        app.debug = False


def test_receivers_of_flasks_request_signals_get_every_request(app):
    from flask import request_started

    seen = []

    def started(sender: Any, **extra: Any) -> None:
        seen.append(1)

    request_started.connect(started, app)
    try:
        assert same_both_ways(app, "GET", "/health")[0] is False
    finally:
        request_started.disconnect(started, app)
    assert seen == [1, 1]
    assert same_both_ways(app, "GET", "/health")[0] is True


def test_a_hook_cannot_be_added_once_a_light_request_was_answered(engine):
    app = create_app(engine, ServerConfig(served_model_name="bubo"))
    assert app.test_client().get("/health").status_code == 200
    with pytest.raises(AssertionError):  # Flask's own refusal after its first request
        app.before_request(lambda: None)


def test_a_view_put_in_a_routes_place_answers(engine):
    app = create_app(engine, ServerConfig(served_model_name="bubo"))
    app.view_functions["core.health"] = lambda: {"status": "mine"}
    assert app.test_client().get("/health").json == {"status": "mine"}


@pytest.fixture(scope="module")
def encoder(catalog_model) -> Iterator[Engine]:
    yield from _started(catalog_model("all-minilm:l6-v2"))


@pytest.fixture(scope="module")
def encoder_app(encoder):
    return create_app(encoder, ServerConfig(served_model_name="minilm", aliases=["emb"]))


@contextlib.contextmanager
def embeds_counted(engine: Engine) -> Iterator[list[int]]:
    """The engine's embedding jobs, counted while the block runs."""
    calls: list[int] = []
    inner = engine.embed

    def counted(*args: Any, **kw: Any) -> Any:
        calls.append(1)
        return inner(*args, **kw)

    engine.embed = counted  # type: ignore[method-assign]
    try:
        yield calls
    finally:
        del engine.embed


def same_work_both_ways(app, engine: Engine, body: dict[str, Any]) -> tuple[bool, bytes]:
    """same_both_ways for POST /v1/embeddings, which must also embed as many times both ways."""
    with embeds_counted(engine) as light_calls:
        got, by_flask = answered(app, "POST", "/v1/embeddings", json=body)
    with flask_only(app), embeds_counted(engine) as flask_calls:
        want, _ = answered(app, "POST", "/v1/embeddings", json=body)
    assert got == want, body
    assert len(light_calls) == len(flask_calls), body  # no job twice
    assert app.config["BUBO_MODELS"].default.users == 0  # let go
    return not by_flask, got[2]


@pytest.mark.parametrize("body", [
    {"input": "The owl hunts at night."}, {"input": "", "model": "minilm"}, {"input": "naïve 🦉", "model": "emb"},
    {"input": "x", "model": "not-served"},  # one model: the name is not looked at, as llama-server does
    {"input": "Hello", "encoding_format": "base64"},  # what the openai SDK asks for by default
    {"input": "Hello", "encoding_format": None, "truncate": True, "dimensions": 384, "model": None},
    {"input": "a " * 512, "truncate": True},  # past the context (514 tokens of 512): cut, and said so
    {"input": "a " * 512},  # its 400 context_length_exceeded, answered by the light answer
])
def test_one_short_input_to_v1_embeddings_is_light(encoder_app, encoder, body):
    light_answered, data = same_work_both_ways(encoder_app, encoder, body)
    assert light_answered
    answer = json.loads(data)
    if "error" in answer:
        assert answer["error"]["code"] == "context_length_exceeded"
        return
    assert answer["model"] == "minilm" and len(answer["data"]) == 1 and answer["usage"]["prompt_tokens"] > 0
    assert answer["data"][0].get("truncated", False) is (len(body["input"]) > 1000)  # the one past the context


@pytest.mark.parametrize("body", [
    {"input": ["a", "b"]}, {"input": [1, 2, 3]}, {"input": "Hello", "user": "me"},  # X-Bubo-Ignored-Fields
    {"input": "Hello", "dimensions": 100}, {"input": "Hello", "encoding_format": "int8"}, {"input": None}, {},
    {"input": "Hello", "truncate": "yes"}, {"input": "x" * 1025},
])
def test_v1_embeddings_that_are_not_plain_go_through_flask(encoder_app, encoder, body):
    assert same_work_both_ways(encoder_app, encoder, body)[0] is False


def test_v1_embeddings_on_a_text_model_is_flasks_501(app):
    light_answered, data = same_both_ways(app, "POST", "/v1/embeddings", json={"input": "Hello"})
    assert not light_answered and json.loads(data)["error"]["code"] == "not_implemented"


def test_with_several_models_v1_embeddings_goes_through_flask(encoder):
    reg = Registry([ModelSpec("minilm", encoder.model_name), ModelSpec("other", "/nowhere/other.gguf")])
    reg.entries[0].engine = encoder  # loaded: the default model
    app = create_app(reg, ServerConfig(served_model_name="minilm"))
    for body in ({"input": "Hello"}, {"input": "Hello", "model": "minilm"}, {"input": "Hello", "model": "other"}):
        assert same_work_both_ways(app, encoder, body)[0] is False


def test_an_embedding_job_that_fails_is_answered_once(encoder_app, encoder, caplog):
    """Once the job is queued, its failure is the light answer's 500, as Flask's: not a second job."""
    def broken(*args: Any, **kw: Any) -> Any:
        raise RuntimeError("the forward pass failed")

    encoder.embed = broken  # type: ignore[method-assign]
    try:
        got, by_flask = answered(encoder_app, "POST", "/v1/embeddings", json={"input": "Hello"})
        with flask_only(encoder_app):
            want, _ = answered(encoder_app, "POST", "/v1/embeddings", json={"input": "Hello"})
    finally:
        del encoder.embed
    assert got == want and not by_flask
    assert got[0].startswith("500") and json.loads(got[2])["error"]["code"] == "internal_error"
    assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == \
        ["unexpected error in POST /v1/embeddings"] * 2  # once each way
