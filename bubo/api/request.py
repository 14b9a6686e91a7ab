"""Request helpers shared by every route: the JSON body, the model a request names, its engine.

A route that generates names its model (`resolve_model`: OpenAI and Anthropic bodies must; the
llama-server routes may, in `model`, or on GET routes in `?model=`), then takes the model's engine
with `use_model`: the registry (bubo/engine/registry.py) loads the model first if it is not
loaded, or waits while it is swapped in, and keeps it loaded until the request ends (the app's
teardown releases it; a stream still being read keeps its engine busy on its own)."""

from __future__ import annotations

import os
from typing import Any, cast

from flask import current_app, g, request
from werkzeug.exceptions import ClientDisconnected

from bubo.api import errors, jsonin, offload
from bubo.api.config import ServerConfig
from bubo.api.errors import ApiError
from bubo.api.openai.stored import ResponseStore
from bubo.engine.protocol import ServingEngine
from bubo.engine.registry import DEFAULT_NAME, ModelEntry, Registry, UnknownModelError, did_you_mean
from bubo.engine.types import EngineRefusal
from bubo.runtime import Runtime

# a body up to this size is parsed on the event loop (well under a millisecond); a larger one in
# the preparation pool (bubo.api.offload)
INLINE_JSON_BYTES = 64 * 1024


def config() -> ServerConfig:
    cfg: ServerConfig = current_app.config["BUBO_CONFIG"]
    return cfg


def response_store() -> ResponseStore:
    """The Responses API's stored responses (bubo/api/openai/stored.py)."""
    rs: ResponseStore = current_app.config["BUBO_RESPONSES"]
    return rs


def models() -> Registry:
    reg: Registry = current_app.config["BUBO_MODELS"]
    return reg


class Body(dict[str, Any]):
    """A request's JSON object that notes which of its fields the route read (get, [], in, pop),
    so that the fields no route reads (a typo: "max_token", "temprature") can be named: the
    X-Bubo-Ignored-Fields header and a -v log line (app.py). Only lookups count: a copy made with
    with_fields shares the notes; a copy made otherwise is read unnoted."""

    def __init__(self, fields: dict[str, Any], read: set[str] | None = None):
        super().__init__(fields)
        self.read: set[str] = read if read is not None else set()

    def __getitem__(self, key: str) -> Any:
        self.read.add(key)
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        self.read.add(key)
        return super().get(key, default)

    def __contains__(self, key: object) -> bool:
        if isinstance(key, str):
            self.read.add(key)
        return super().__contains__(key)

    def pop(self, key: str, *default: Any) -> Any:
        self.read.add(key)
        return super().pop(key, *default)

    def unread(self) -> list[str]:
        return [k for k in self if k not in self.read]


def with_fields(body: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """body with some fields set, as a copy whose lookups count as the original's (Body)."""
    copy = {**body, **changes}
    return Body(copy, body.read) if isinstance(body, Body) else copy


def json_body() -> dict[str, Any]:
    """The request's JSON object. 413 over the size limit (Flask's MAX_CONTENT_LENGTH), 400
    parse_error for invalid UTF-8, malformed JSON or a body that is not an object. The
    Content-Type is not checked: curl's default form type is common."""
    raw = _body_bytes()
    if len(raw) > INLINE_JSON_BYTES:
        parsed = offload.run(json_object, raw, what="reading the request's JSON")
    else:
        parsed = json_object(raw)
    body = Body(parsed)
    g.setdefault("bubo_bodies", []).append(body)
    g.bubo_body_bytes = len(raw)  # a chunked body's bytes cannot be read twice
    return body


# fields whose reading compiles what they hold (a JSON schema's patterns: re.compile walks every
# code point of a character range, 65,536 for one class), however short the body
COMPILED_FIELDS = frozenset({"grammar", "json_schema", "response_format", "tools", "functions", "format"})


def small_body(body: dict[str, Any]) -> bool:
    """Whether reading body's fields may run on the event loop: json_body read at most
    offload.SMALL_CHARS bytes, and none of COMPILED_FIELDS is there (looked up without counting
    as read)."""
    return offload.small_n(g.get("bubo_body_bytes", offload.SMALL_CHARS + 1)) and \
        COMPILED_FIELDS.isdisjoint(body.keys())


def ignored_fields() -> list[str]:
    """The request body's fields that no lookup of the route read (in the body's order)."""
    bodies: list[Body] = g.get("bubo_bodies") or []
    if not bodies:
        return []
    read = set().union(*(b.read for b in bodies))
    return [k for k in bodies[0] if k not in read]


def json_value() -> Any:
    """The request's JSON, whatever its kind (a route whose body is an array); json_body's errors."""
    return _json_value(_body_bytes(), "JSON")


def json_object(raw: bytes) -> dict[str, Any]:
    """The JSON object raw holds (json_body's parse, and its errors)."""
    body = _json_value(raw, "JSON object")
    if not isinstance(body, dict):
        raise ApiError(400, "parse_error", f"the request body must be a JSON object, not {type(body).__name__}")
    return body


def _json_value(raw: bytes, kind: str) -> Any:
    if not raw.strip():
        raise ApiError(400, "parse_error", f"the request body is empty: send a {kind}")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ApiError(400, "parse_error",
                       f"the request body is not valid UTF-8 (byte {e.start}: {e.reason})") from None
    try:
        body = jsonin.parse(text, raw)
    except jsonin.JSONInputError as e:
        if e.surrogate:
            raise ApiError(400, "invalid_value", f"the request body: {e.message}") from None
        raise ApiError(400, "parse_error", f"the request body is not valid JSON: {e.message}") from None
    return body


def _body_bytes() -> bytes:
    """The request's body. A chunked body is counted against the size limit as it arrives (413,
    and the connection closes, past it); a body that cannot be read (a malformed chunk, or one
    that did not arrive in time) is a 400 that closes the connection."""
    env = request.environ
    limit = config().max_body_bytes
    try:
        if env.get("HTTP_TRANSFER_ENCODING", "").strip().lower() == "chunked":
            raw: bytes = env["wsgi.input"].read(limit + 1)
            if len(raw) > limit:
                raise ApiError(413, "request_too_large",
                               f"the request body is larger than the limit of {limit} bytes",
                               headers={"Connection": "close"})
        else:
            raw = _sized_body(env)
        done = env.get("bubo.body_read")
        if done is not None:
            done()  # the HTTP server: this connection is at work now, not waiting on its client
        return raw
    except (OSError, ClientDisconnected) as e:
        why = "it did not arrive in time, or the client went away" if isinstance(e, ClientDisconnected) else str(e)
        raise ApiError(400, "bad_request", f"the request body could not be read: {why}",
                       headers={"Connection": "close"}) from None


def _sized_body(env: dict[str, Any]) -> bytes:
    """A body of a Content-Length within the limit, read from the server's input as it is (at
    the request's end, the server reports EOF), once per request; else werkzeug's reading of it
    (its 413 past MAX_CONTENT_LENGTH). One read, not werkzeug's stream of limits: a tenth of a
    small request's reading. A body cut short, or that does not come, is ClientDisconnected, as
    werkzeug reports it."""
    cached = env.get("bubo.body")
    if cached is not None:
        return cast(bytes, cached)
    n = declared_length(env, current_app.config.get("MAX_CONTENT_LENGTH"))
    if n is None or not env.get("wsgi.input_terminated"):
        return request.get_data(cache=True)
    try:
        raw: bytes = env["wsgi.input"].read(n)
    except (OSError, ValueError) as e:
        raise ClientDisconnected() from e
    if len(raw) != n:
        raise ClientDisconnected()
    env["bubo.body"] = raw
    return raw


def declared_length(env: dict[str, Any], most: int | None) -> int | None:
    """The request's Content-Length when it is plain ASCII digits and at most `most` (None: no
    bound); else None (absent, malformed, or past it: werkzeug's reading and its errors)."""
    length = env.get("CONTENT_LENGTH") or ""
    if not (length.isascii() and length.isdigit()):
        return None
    n = int(length)
    return n if most is None or n <= most else None


def _unknown(name: str) -> ApiError:
    reg = models()
    hint = did_you_mean(reg.close_names(name))
    if not reg.is_router:
        served = reg.default.name
        others = ", ".join(f"'{n}'" for n in reg.names()[1:])
        return ApiError(404, "model_not_found",
                        f"model '{name}' is not served by this process{hint}; it serves '{served}' (also {others})")
    ids = ", ".join(f"'{e.name}'" for e in reg.entries)
    return ApiError(404, "model_not_found", f"model '{name}' is not served by this process{hint}; it serves {ids} "
                                            f"('{DEFAULT_NAME}' names '{reg.default.name}')")


def _check_name(name: Any) -> str:
    if not isinstance(name, str):
        raise ApiError(400, "invalid_type", f"model must be a string, not {type(name).__name__}")
    try:
        models().lookup(name)
    except UnknownModelError:
        raise _unknown(name) from None
    return name


def resolve_model(body: dict[str, Any]) -> str:
    """The model name of a request that must name one: 400 missing_model when absent (or
    null/empty), 404 model_not_found (naming the served models) when not served here."""
    name = body.get("model")
    if name is None or name == "":
        raise ApiError(400, "missing_model", f'the request has no model: add "model": "{models().default.name}" '
                                             f'(or "{DEFAULT_NAME}")')
    return _check_name(name)


def optional_model(body: dict[str, Any] | None = None) -> str:
    """The model of a route where naming one is optional (llama-server's routes: `model` in the
    body, or `?model=` on a GET route); the default model when absent. With one model, both are
    ignored, as llama-server does (/props checks `?model=` itself), but for a base+adapter name,
    which picks the adapter."""
    reg = models()
    if not reg.is_router:
        given = body.get("model") if body is not None else request.args.get("model")
        return given if isinstance(given, str) and reg.adapter_of(given) is not None else reg.default.name
    name = request.args.get("model") or None
    if name is None and body is not None:
        given = body.get("model")
        name = given if given not in (None, "") else None
    return _check_name(name) if name is not None else reg.default.name


def use_model(name: str) -> ServingEngine:
    """The loaded engine of model `name` (loaded, or waited for, first), held until this request
    ends. Its refusals as API errors: 503 not_ready (loading at start, or its load failed), 400
    model_not_loaded (autoload off), 503/507 when it cannot fit in memory."""
    reg = models()
    try:
        engine = reg.acquire(name)
    except EngineRefusal as e:
        raise errors.from_refusal(e) from None
    held: list[ModelEntry] = g.setdefault("bubo_held", [])
    entry = reg.lookup(name)
    held.append(entry)
    g.bubo_adapter = reg.adapter_of(name)  # a base+adapter name: that adapter at scale 1 (pipeline.lora_asked)
    request.environ.setdefault("bubo.log", {})["model"] = entry.name  # the request's log line
    return engine


def release_models() -> None:
    """The request ended: the models it used may be unloaded again (the app's teardown)."""
    held: list[ModelEntry] = g.pop("bubo_held", [])
    reg = current_app.config.get("BUBO_MODELS")
    if isinstance(reg, Registry):
        for entry in held:
            reg.release(entry)


def runtime_of(engine: ServingEngine) -> Runtime:
    rt = engine.runtime
    if rt is None:
        raise errors.not_ready(f"the model {engine.model_name} is not loaded")
    return rt


def debug_mem_available() -> int | None:
    """BUBO_DEBUG_MEM_AVAILABLE (bytes): the memory guard's "available now" figure, honoured
    only with the debug hooks on, so that a test can produce the 503 path at will."""
    if not config().debug_routes_enabled:
        return None
    raw = os.environ.get("BUBO_DEBUG_MEM_AVAILABLE", "").strip()
    return int(raw) if raw.isdigit() else None
