"""GET /openapi.json and GET /: the document is valid OpenAPI 3.1, names every route of the app
and nothing else, its bounds are the validators' bounds, and a real server's answers (errors,
JSON, server-sent events) are what it says: checked by hand here and by schemathesis (no 500, no
undocumented status, content type or shape) against smollm2:135m."""

from __future__ import annotations

import json
import math
import re
import urllib.request
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest
import schemathesis
from client import call
from flask import Flask
from openapi_spec_validator import validate as validate_spec

from bubo import limits
from bubo.api import about, openapi
from bubo.api import fields as f
from bubo.api.app import create_app
from bubo.api.config import ServerConfig
from bubo.api.errors import ApiError
from bubo.engine.engine import Engine
from bubo.engine.registry import ModelSpec, Registry

from .conftest import Server, start_server

pytestmark = pytest.mark.models

HTTP_METHODS = {"get", "post", "put", "patch", "delete"}


# --- helpers --------------------------------------------------------------------------------------


def _app(**cfg: Any) -> Flask:
    engine = Engine("smollm2:135m")  # never started: the model is loading
    return create_app(engine, ServerConfig(served_model_name="my-model", aliases=["alias-a"], **cfg))


def _router_app(**cfg: Any) -> Flask:
    reg = Registry([ModelSpec("one", "/nowhere/one.gguf"), ModelSpec("two", "/nowhere/two.gguf", aliases=("deux",))])
    return create_app(reg, ServerConfig(served_model_name="one", **cfg))


def _doc(app: Flask, headers: dict[str, str] | None = None) -> dict[str, Any]:
    r = app.test_client().get("/openapi.json", headers=headers or {})
    assert r.status_code == 200, r.data
    doc: dict[str, Any] = r.json
    return doc


def _content_schema(validator: Any, schema: Any, instance: Any, parent: dict[str, Any]) -> Iterator[Any]:
    """contentSchema for contentMediaType application/json (jsonschema treats both as annotations):
    the string's JSON must match it. The server-sent events' data are checked with it."""
    if parent.get("contentMediaType") != "application/json" or not isinstance(instance, str):
        return
    try:
        parsed = strict_json(instance)
    except ValueError as e:
        yield jsonschema.ValidationError(f"not JSON: {e}: {instance[:200]!r}")
        return
    yield from validator.descend(parsed, schema, schema_path="contentSchema")


_Validator = jsonschema.validators.extend(jsonschema.Draft202012Validator, {"contentSchema": _content_schema})


def check(doc: dict[str, Any], schema: dict[str, Any], instance: Any) -> None:
    """instance against a schema of doc (its $refs into doc's components)."""
    _Validator({**schema, "components": doc["components"]}).validate(instance)


def response_spec(doc: dict[str, Any], path: str, method: str, status: int) -> dict[str, Any]:
    responses = doc["paths"][path][method]["responses"]
    assert str(status) in responses, f"{method.upper()} {path}: {status} is not documented ({sorted(responses)})"
    spec: dict[str, Any] = responses[str(status)]
    return spec


def check_response(doc: dict[str, Any], path: str, method: str, status: int, content_type: str, body: bytes) -> None:
    """A response (status, Content-Type, body) as the document describes it."""
    spec = response_spec(doc, path, method, status)
    media = content_type.split(";")[0].strip()
    documented = {m.split(";")[0].strip(): v for m, v in spec["content"].items()}
    assert media in documented, f"{method.upper()} {path} {status}: {content_type} is not among {list(documented)}"
    schema = documented[media]["schema"]
    if media == "application/x-ndjson":  # the documented schema is one line's
        lines = body.decode().split("\n")
        assert lines[-1] == "" and len(lines) > 1, "NDJSON ends every line, the last one too, with \\n"
        for line in lines[:-1]:
            check(doc, schema, strict_json(line))
    elif media == openapi.SSE:
        events = sse_events(body.decode())
        assert events, "an empty stream"
        for ev in events:
            check(doc, schema, ev)
    elif media == openapi.JSON:
        check(doc, schema, strict_json(body))
    else:
        check(doc, schema, body.decode())


def strict_json(text: str | bytes) -> Any:
    """JSON as RFC 8259 has it: no NaN or Infinity (Python's json would take them)."""
    def bad(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=bad)


def sse_events(text: str) -> list[dict[str, str]]:
    """The events of an SSE body as {"event"?, "data"} (comments skipped)."""
    out = []
    for block in text.split("\n\n"):
        ev: dict[str, str] = {}
        for line in block.split("\n"):
            if not line or line.startswith(":"):
                continue
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            ev[name] = ev[name] + "\n" + value if name in ev else value
        if ev:
            out.append(ev)
    return out


def flask_rule(path: str) -> str:
    return re.sub(r"<(?:[a-z]+:)?([a-z_]+)>", r"{\1}", path)


def app_routes(app: Flask) -> set[tuple[str, str]]:
    """(path in OpenAPI's form, method) of every route, without the methods Flask adds (HEAD,
    OPTIONS)."""
    return {(flask_rule(r.rule), m.lower()) for r in app.url_map.iter_rules()
            for m in (r.methods or ()) if m not in ("HEAD", "OPTIONS")}


def doc_routes(doc: dict[str, Any]) -> set[tuple[str, str]]:
    return {(p, m) for p, ops in doc["paths"].items() for m in ops if m in HTTP_METHODS}


CONFIGS = {
    "one model": lambda: _app(),
    "api keys": lambda: _app(api_keys=["sekret"]),
    "debug hooks": lambda: _app(debug_hooks=True),
    "no slots": lambda: _app(slots_enabled=False),
    "router": lambda: _router_app(),
    "router, keys, debug": lambda: _router_app(api_keys=["sekret"], debug_hooks=True),
}
KEY = {"Authorization": "Bearer sekret"}


# --- the document ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(CONFIGS))
def test_document_is_valid_openapi_and_names_every_route(name):
    app = CONFIGS[name]()
    doc = _doc(app, KEY)
    validate_spec(doc)
    assert doc["openapi"] == "3.1.0"
    assert app_routes(app) == doc_routes(doc)
    ids = [op["operationId"] for ops in doc["paths"].values() for op in ops.values()]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("name", list(CONFIGS))
def test_every_route_is_declared_where_it_is_registered(name):
    app = CONFIGS[name]()
    assert openapi.undeclared(app) == []
    # a route registered without its declaration is named
    app.add_url_rule("/v1/undeclared", "undeclared", lambda: "", methods=["POST"])
    assert openapi.undeclared(app) == ["POST /v1/undeclared"]


def test_debug_routes_only_when_the_server_has_them():
    assert not any(p.startswith("/debug/") for p in _doc(_app())["paths"])
    assert {"/debug/prompt", "/debug/cache", "/debug/settings"} <= set(_doc(_app(debug_hooks=True))["paths"])


def test_401_and_security_only_with_keys():
    plain, keyed = _doc(_app()), _doc(_app(api_keys=["sekret"]), KEY)
    assert "security" not in plain and "securitySchemes" not in plain["components"]
    assert not any("401" in op["responses"] for ops in plain["paths"].values() for op in ops.values())
    assert keyed["security"] == [{"bearer": []}, {"apiKey": []}]
    for path, ops in keyed["paths"].items():
        for method, op in ops.items():
            if path in about.PUBLIC_PATHS:
                assert op["security"] == [] and "401" not in op["responses"]
            else:
                assert "401" in op["responses"], (method, path)


def test_model_names_are_the_served_ones():
    doc = _doc(_app())
    body = doc["paths"]["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body["properties"]["model"]["enum"] == ["my-model", "alias-a", "bubo"]
    doc = _doc(_router_app())
    body = doc["paths"]["/v1/messages"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body["properties"]["model"]["enum"] == ["one", "two", "deux", "bubo"]


def test_sampling_fields_are_the_validators():
    assert set(openapi.SAMPLING) == set(f._SAMPLING_FIELDS)


def _bounds(schema: dict[str, Any]) -> list[tuple[Any, bool]]:
    """(value, accepted?) at and past each bound of a numeric schema."""
    out: list[tuple[Any, bool]] = []
    is_int = "integer" in schema["type"]
    step = (lambda v: 1) if is_int else (lambda v: max(abs(v) * 1e-6, 1e-9))
    if "minimum" in schema:
        lo = schema["minimum"]
        out += [(lo, True), (lo - step(lo), False)]
    if "exclusiveMinimum" in schema:
        lo = schema["exclusiveMinimum"]
        out += [(lo, False), (lo + step(lo), True)]
    if "maximum" in schema:
        hi = schema["maximum"]
        out += [(hi, True), (hi + step(hi), False)]
    return out


@pytest.mark.parametrize("name", [n for n, s in openapi.SAMPLING.items() if "type" in s and
                                  ("integer" in s["type"] or "number" in s["type"])])
def test_sampling_bounds_are_the_validators(name):
    schema = openapi.SAMPLING[name]
    cases = _bounds(schema)
    assert cases, f"{name} has no bounds"
    for value, accepted in cases:
        if isinstance(value, float) and not math.isfinite(value):
            continue
        if accepted:
            f.sampling_params({name: value})
        else:
            with pytest.raises(ApiError) as e:
                f.sampling_params({name: value})
            assert e.value.status == 400, (name, value)


def test_max_tokens_bounds_are_the_validators():
    ok = [1, openapi.INT32_MAX, -1, None, 8.0]
    bad = [0, -2, openapi.INT32_MAX + 1, True, "8", 1.5]
    schema = openapi.MAX_TOKENS
    for v in ok:
        f.max_tokens_of({"max_tokens": v}, "max_tokens")
        jsonschema.Draft202012Validator(schema).validate(v)
    for v in bad:
        with pytest.raises(ApiError):
            f.max_tokens_of({"max_tokens": v}, "max_tokens")
        assert not jsonschema.Draft202012Validator(schema).is_valid(v), v


class _Reads(dict):  # type: ignore[type-arg]
    """A request body that records every top-level field the route looks up."""

    seen: set[str]

    def get(self, key: Any, default: Any = None) -> Any:
        self.seen.add(key)
        return super().get(key, default)

    def __getitem__(self, key: Any) -> Any:
        self.seen.add(key)
        return super().__getitem__(key)

    def __contains__(self, key: Any) -> bool:
        self.seen.add(key)
        return super().__contains__(key)


# the routes whose handlers read every field before they need the model (a loading model stops
# the others at use_model, before their fields are read)
READ_BEFORE_THE_MODEL = ["/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages",
                         "/v1/messages/count_tokens", "/completion", "/infill", "/models/load", "/models/unload",
                         "/api/chat", "/api/generate"]


@pytest.mark.parametrize("path", READ_BEFORE_THE_MODEL)
def test_every_field_a_route_reads_is_documented(path, monkeypatch):
    """A field added to a route but not to the document fails here."""
    from bubo.api import core, request
    from bubo.api.anthropic import routes as anthropic_routes
    from bubo.api.llamacpp import routes as llamacpp_routes
    from bubo.api.ollama import routes as ollama_routes
    from bubo.api.openai import routes as openai_routes

    seen: set[str] = set()
    original = request.json_body

    def recording() -> dict[str, Any]:
        body = _Reads(original())
        body.seen = seen
        return body

    for module in (core, openai_routes, anthropic_routes, llamacpp_routes, ollama_routes):
        monkeypatch.setattr(module, "json_body", recording)
    app = _app()
    doc = _doc(app)
    op = doc["paths"][path]["post"]
    media = op["requestBody"]["content"]["application/json"]
    if path == "/models/unload":
        body = {"model": "nope"}  # unloading the loading model would wait for its load
    else:
        body = media["example"]
    app.test_client().post(path, data=json.dumps(body))
    assert seen, "the route read nothing"
    documented = set(media["schema"]["properties"])
    assert seen <= documented, f"{path} reads fields the document does not name: {sorted(seen - documented)}"


def test_other_bounds_are_the_validators():
    from bubo.api.openai.chat import parse_chat_request
    from bubo.api.openai.completions import parse_completion_request

    chat = {"messages": [{"role": "user", "content": "hi"}]}
    top = limits.MAX_TOP_LOGPROBS
    parse_chat_request({**chat, "logprobs": True, "top_logprobs": top})
    with pytest.raises(ApiError):
        parse_chat_request({**chat, "logprobs": True, "top_logprobs": top + 1})
    lp = limits.MAX_COMPLETION_LOGPROBS
    parse_completion_request({"prompt": "x", "logprobs": lp})
    with pytest.raises(ApiError):
        parse_completion_request({"prompt": "x", "logprobs": lp + 1})
    n_max = openapi.SPECULATIVE["speculative.n_max"]["maximum"]
    f.draft_max_of({"speculative.n_max": n_max})
    for bad in (n_max + 1, -1):
        with pytest.raises(ApiError):
            f.draft_max_of({"speculative.n_max": bad})


# --- answers checked against the document, without a model ----------------------------------------


def _call(client: Any, path: str, method: str, headers: dict[str, str] | None = None, body: Any = None) -> Any:
    concrete = path.replace("{rest}", "txt2img").replace("{digest}", "sha256-0")
    if method == "get":
        return client.get(concrete, headers=headers or {})
    return client.open(concrete, method=method.upper(), headers=headers or {},
                       data=json.dumps(body if body is not None else {}))


def test_every_operation_without_a_key_is_a_documented_401():
    app = _app(api_keys=["sekret"], debug_hooks=True)
    doc = _doc(app, KEY)
    c = app.test_client()
    for path, ops in doc["paths"].items():
        for method in ops:
            r = _call(c, path, method)
            if path in about.PUBLIC_PATHS:
                assert r.status_code == 200
                continue
            assert r.status_code == 401, (method, path, r.status_code)
            assert r.headers["WWW-Authenticate"] == "Bearer"
            check_response(doc, path, method, 401, r.content_type, r.data)
            if path.startswith("/v1/messages"):
                assert r.json["type"] == "error"


def test_every_operation_while_the_model_loads_is_documented():
    """A never-started engine: every route answers something the document describes (503
    not_ready where the model is needed, 400 for an empty body, 501 ...)."""
    app = _app(debug_hooks=True)
    doc = _doc(app)
    c = app.test_client()
    seen = set()
    for path, ops in doc["paths"].items():
        if path == "/models/unload":
            continue  # it waits for the load to end, which never comes here
        for method, op in ops.items():
            example = None
            if "requestBody" in op:
                example = op["requestBody"]["content"]["application/json"].get("example")
            for body in ([example] if example is not None else []) + [{}]:
                r = _call(c, path, method, body=body)
                check_response(doc, path, method, r.status_code, r.content_type, r.data)
                seen.add(r.status_code)
    assert {200, 400, 501, 503} <= seen


def test_too_large_a_body_and_the_anthropic_shape():
    app = _app(max_body_bytes=64)
    doc = _doc(app)
    c = app.test_client()
    big = {"model": "bubo", "messages": [{"role": "user", "content": "x" * 100}], "max_tokens": 8}
    for path in ("/v1/chat/completions", "/v1/messages", "/completion", "/tokenize"):
        r = c.post(path, data=json.dumps(big))
        assert r.status_code == 413
        check_response(doc, path, "post", 413, r.content_type, r.data)
    r = c.post("/v1/messages", data=json.dumps({"model": "bubo", "max_tokens": 1, "messages": []}))
    assert r.status_code == 400 and r.json["type"] == "error"
    check_response(doc, "/v1/messages", "post", 400, r.content_type, r.data)
    with pytest.raises(jsonschema.ValidationError):  # and the other shape is not taken for it
        check(doc, response_spec(doc, "/v1/messages", "post", 400)["content"]["application/json"]["schema"],
              {"error": {"message": "m", "type": "invalid_request_error", "code": "c"}})


# --- GET / ------------------------------------------------------------------------------------------


def test_root_says_what_runs_as_text_or_html():
    c = _app().test_client()
    r = c.get("/", headers={"Accept": "*/*"})
    assert r.status_code == 200 and r.mimetype == "text/plain"
    text = r.get_data(as_text=True)
    assert text.startswith("bubo ") and "is running" in text
    assert "my-model" in text and "alias-a" in text and "/openapi.json" in text
    assert "POST /v1/chat/completions" in text and "GET /health" in text
    browser = {"Accept": "text/html,application/xhtml+xml,*/*;q=0.8"}
    r = c.get("/", headers=browser)  # the chat page (tests/webui)
    assert r.mimetype == "text/html" and r.headers["Vary"] == "Accept" and 'id="bubo-config"' in r.get_data(True)
    r = _app(webui=False).test_client().get("/", headers=browser)
    assert r.mimetype == "text/html" and r.headers["Vary"] == "Accept"
    page = r.get_data(as_text=True)
    assert page.startswith("<!doctype html>") and "my-model" in page and 'href="/openapi.json"' in page


def test_root_needs_no_key_and_names_models_only_with_one():
    app = _app(api_keys=["sekret"])
    c = app.test_client()
    r = c.get("/")
    assert r.status_code == 200
    text = r.get_data(as_text=True)
    assert "is running" in text and "API key is required" in text and "my-model" not in text
    assert "my-model" in c.get("/", headers=KEY).get_data(as_text=True)
    assert "my-model" not in c.get("/", headers={"Authorization": "Bearer wrong"}).get_data(as_text=True)
    assert c.get("/openapi.json").status_code == 401  # the description needs the key, as every other route
    assert c.get("/health").status_code == 401


def test_root_lists_router_models_with_their_status():
    text = _router_app().test_client().get("/").get_data(as_text=True)
    assert "one (unloaded)" in text and "two (unloaded)" in text


# --- a real server -------------------------------------------------------------------------------

# generation is bounded so that the run fits CI: a case whose answer would run until the model
# stops (the field absent, -1, null, or larger) is sent with this many tokens instead
TOKENS = 1
# the token-limit fields of each generating route, the first present one counts
LIMITS = {
    "/v1/chat/completions": ("max_completion_tokens", "max_tokens"),
    "/chat/completions": ("max_completion_tokens", "max_tokens"),
    "/v1/completions": ("max_tokens",),
    "/v1/responses": ("max_output_tokens",),
    "/responses": ("max_output_tokens",),
    "/v1/messages": ("max_tokens",),
    "/completion": ("n_predict", "max_tokens"),
    "/completions": ("n_predict", "max_tokens"),
    "/debug/prompt": ("max_tokens",),
    "/infill": ("n_predict", "max_tokens"),
}
OLLAMA_GENERATING = {"/api/chat", "/api/generate"}  # their limit is options.num_predict
REQUIRED_LIMIT = {"/v1/messages"}  # absent is a 400 there, not a long answer


def bound_generation(path: str, body: Any) -> None:
    """Cap a generating request's tokens at TOKENS where the value would allow more (the case
    stays one the document allows: a smaller valid limit); invalid values are left for the
    server to refuse."""
    if path in OLLAMA_GENERATING and isinstance(body, dict):
        body.pop("keep_alive", None)  # 0 would unload the model the other cases use (test_ollama covers it)
        opts = body.setdefault("options", {})
        if isinstance(opts, dict):
            v = opts.get("num_predict")
            if v is None or (isinstance(v, int) and not isinstance(v, bool) and (v in (-1, -2) or v > TOKENS)):
                opts["num_predict"] = TOKENS
        return
    names = LIMITS.get(path)
    if not names or not isinstance(body, dict):
        return
    for name in names:
        if name in body:
            v = body[name]
            if v is None or (v == -1 and not isinstance(v, bool)) or (
                    isinstance(v, int) and not isinstance(v, bool) and TOKENS < v <= openapi.INT32_MAX):
                body[name] = TOKENS
            return
    if path not in REQUIRED_LIMIT:
        body[names[0]] = TOKENS


@pytest.fixture(scope="module")
def live() -> Iterator[Server]:
    with start_server("--debug-hooks", "-np", "1", ctx=512) as s:
        yield s.wait_ready()


@pytest.fixture(scope="module")
def live_doc(live: Server) -> dict[str, Any]:
    with urllib.request.urlopen(live.url + "/openapi.json", timeout=10) as r:
        doc: dict[str, Any] = json.load(r)
    return doc


@pytest.fixture(scope="module")
def api_schema(live: Server) -> Any:
    from schemathesis.config import SchemathesisConfig

    config = SchemathesisConfig.from_dict({
        "seed": 20250601,
        "generation": {"max-examples": 5, "deterministic": True, "database": "none", "no-shrink": True},
        # the coverage phase (every field's boundary and wrong-typed values) took 46 of the run's 54 s;
        # test_hostile.py's sweep sends odd values in every field of every generating route instead
        "phases": {"examples": {"enabled": True}, "coverage": {"enabled": False}, "fuzzing": {"enabled": True},
                   "stateful": {"enabled": False}},
        "request-timeout": 60,
        # 501 is by design (embeddings, rerank, ... on a text model); a 500, or a 503 on this idle
        # server with its model loaded, is a failure
        "checks": {"not_a_server_error": {"expected-statuses": ["2XX", "3XX", "4XX", 501]}},
    })
    return schemathesis.openapi.from_url(live.url + "/openapi.json", config=config)


st_schema = schemathesis.pytest.from_fixture("api_schema")
CHECKS = [schemathesis.checks.not_a_server_error, schemathesis.checks.status_code_conformance,
          schemathesis.checks.content_type_conformance, schemathesis.checks.response_schema_conformance]


# routes that change what the server or the store holds: tested on their own (test_ollama.py for the
# store's, with a store of the test's own)
STATE_CHANGING = {"/models/unload", "/api/pull", "/api/delete", "/api/copy"}


def _skipped(ctx: Any) -> bool:
    """An alias path runs its route's handler with the same document (the route check above
    covers that it is there), and unloading the model is a state change the other cases would
    trip over (their 503s are right, and documented): test_unload_and_reload_are_as_documented."""
    op = ctx.operation
    return "(alias of" in op.definition.raw.get("summary", "") or op.path in STATE_CHANGING


@st_schema.exclude(_skipped).parametrize()
def test_schemathesis(case: Any) -> None:
    bound_generation(case.path, case.body)
    case.call_and_validate(checks=CHECKS)


def _post(server: Server, path: str, body: dict[str, Any] | None = None) -> tuple[int, str, bytes]:
    """(status, Content-Type, body) of a POST (a GET without body)."""
    status, headers, data = call(server.url + path, "POST" if body is not None else "GET", body, timeout=60)
    return status, headers["Content-Type"], data

CHAT = {"model": "bubo", "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 6, "seed": 1}
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
# the richest answers of each generating route, streamed and not: logprobs, usage, tool calls, ...
RICH = [
    ("/v1/chat/completions", {**CHAT, "logprobs": True, "top_logprobs": 2, "stream_options": {"include_usage": True}}),
    ("/v1/chat/completions", {**CHAT, "tools": [WEATHER], "tool_choice": "required", "max_tokens": 40}),
    ("/v1/chat/completions", {**CHAT, "response_format": {"type": "json_object"}, "max_tokens": 3}),
    ("/v1/completions", {"model": "bubo", "prompt": "Once", "max_tokens": 4, "logprobs": 2, "echo": True,
                         "stream_options": {"include_usage": True}}),
    ("/v1/responses", {"model": "bubo", "input": "Say hi.", "max_output_tokens": 6, "instructions": "Be brief."}),
    ("/v1/responses", {"model": "bubo", "input": "Weather in Paris?", "max_output_tokens": 40,
                       "tools": [{"type": "function", "name": "get_weather",
                                  "parameters": WEATHER["function"]["parameters"]}],  # type: ignore[index]
                       "tool_choice": "required"}),
    ("/v1/messages", {"model": "bubo", "max_tokens": 6, "messages": [{"role": "user", "content": "Say hi."}],
                      "stop_sequences": ["\n"]}),
    ("/v1/messages", {"model": "bubo", "max_tokens": 40, "messages": [{"role": "user", "content": "Paris?"}],
                      "tools": [{"name": "get_weather", "input_schema": WEATHER["function"]["parameters"]}],  # type: ignore[index]
                      "tool_choice": {"type": "any"}}),
    ("/completion", {"prompt": "Once", "n_predict": 4, "n_probs": 2, "return_tokens": True}),
    ("/debug/prompt", {"prompt": "Once", "max_tokens": 3}),
    ("/api/chat", {"model": "bubo", "messages": [{"role": "user", "content": "Say hi."}], "logprobs": True,
                   "top_logprobs": 2, "options": {"num_predict": 6, "seed": 1}}),
    ("/api/chat", {"model": "bubo", "messages": [{"role": "user", "content": "Weather in Paris?"}],
                   "tools": [WEATHER], "format": {"type": "object", "properties": {"a": {"type": "integer"}}},
                   "options": {"num_predict": 12, "temperature": 0}}),
    ("/api/generate", {"model": "bubo", "prompt": "Once", "raw": True, "options": {"num_predict": 4}}),
]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("i", range(len(RICH)), ids=[f"{p}-{n}" for n, (p, _) in enumerate(RICH)])
def test_rich_answers_are_as_documented(live, live_doc, i, stream):
    path, body = RICH[i]
    status, ctype, data = _post(live, path, {**body, "stream": stream})
    assert status == 200, data[:500]
    streamed = "application/x-ndjson" if path.startswith("/api/") else openapi.SSE
    assert ctype.startswith(streamed if stream else openapi.JSON)
    check_response(live_doc, path, "post", status, ctype, data)


def test_core_answers_are_as_documented(live, live_doc):
    """The GET routes after a request that banned a token (a -inf bias) and set every
    sampling field: /slots shows its params."""
    body = {**CHAT, "logit_bias": {"42": False}, "dry_sequence_breakers": ["\n"], "mirostat": 0}
    assert _post(live, "/v1/chat/completions", body)[0] == 200
    for path in ("/", "/openapi.json", "/health", "/ready", "/v1/models", "/props", "/slots", "/metrics",
                 "/debug/cache", "/debug/settings"):
        with urllib.request.urlopen(live.url + path, timeout=10) as r:
            data = r.read()
            check_response(live_doc, path, "get", r.status, r.headers["Content-Type"], data)
        if path == "/slots":
            assert strict_json(data)[0]["params"]["logit_bias"] == {"42": False}
    for path, body in (("/tokenize", {"content": "Hello", "with_pieces": True}), ("/detokenize", {"tokens": [1, 2]}),
                       ("/apply-template", {"messages": [{"role": "user", "content": "<|im_end|>"}]}),
                       ("/v1/messages/count_tokens", {"model": "bubo", "messages": [{"role": "user",
                                                                                     "content": "Hi"}]})):
        status, ctype, data = _post(live, path, body)
        check_response(live_doc, path, "post", status, ctype, data)


def test_unload_and_reload_are_as_documented(live, live_doc):
    """POST /models/unload (kept out of the schemathesis run): the model goes, the routes that
    need it answer the documented 503, the next request loads it again."""
    def call(method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
        status, ctype, data = _post(live, path, body)
        check_response(live_doc, path, method, status, ctype, data)
        return status, strict_json(data)

    assert call("post", "/models/unload", {"model": "bubo"}) == (200, {"success": True, "model": "smollm2:135m",
                                                                       "status": "unloaded"})
    for path in ("/ready", "/props"):
        status, body = call("get", path)
        assert status == 503 and body["error"]["code"] == "not_ready"
    status, body = call("post", "/models/unload", {"model": "nope"})
    assert status == 404 and body["error"]["code"] == "model_not_found"
    status, body = call("post", "/v1/chat/completions", {**CHAT, "max_tokens": 2})
    assert status == 200 and body["usage"]["completion_tokens"] <= 2
    assert call("get", "/ready")[0] == 200
    assert call("post", "/models/load", {"model": "bubo"})[1]["status"] == "loaded"
