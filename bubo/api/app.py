"""The app factory: `create_app(engine, config)` builds the Flask app that `python -m bubo serve`
runs on gevent's WSGI server (any WSGI host can mount it).

Everything that is not a route lives here: auth before every route, CORS, the body size limit,
and the error shapes of every failure (unknown path, wrong method, oversized body, malformed
JSON, an unexpected exception: never a bare 500 page)."""

from __future__ import annotations

import importlib
import inspect
import json
import logging
from pathlib import Path
from typing import Any

from flask import Flask, request
from werkzeug.exceptions import HTTPException

from bubo.api import callers
from bubo.api.auth import check_api_key, check_host
from bubo.api.config import ServerConfig
from bubo.api.errors import ApiError, error_response, internal
from bubo.api.light import LightRoutes
from bubo.api.offload import PreparePool
from bubo.api.openai.stored import ResponseStore
from bubo.api.request import ignored_fields, release_models
from bubo.engine.engine import Engine
from bubo.engine.registry import Registry

log = logging.getLogger("bubo.api")

# the other engineer's dialects; each module exposes `blueprint`
DIALECTS = ("bubo.api.openai.routes", "bubo.api.anthropic.routes", "bubo.api.llamacpp.routes", "bubo.api.ollama.routes",
            "bubo.api.embeddings", "bubo.api.decision", "bubo.api.contexts", "bubo.api.mcp", "bubo.api.lora")

# what a page's requests may send (MCP's transport headers among them)
CORS_HEADERS = "Authorization, Content-Type, x-api-key, anthropic-version, Mcp-Session-Id, MCP-Protocol-Version"
_HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}


def _foreign_origin(config: ServerConfig) -> bool:
    """A request that changes something (not GET, HEAD or OPTIONS), sent by a web page from
    another origin than this server's and not allowed by --cors. Browsers name the page's origin
    in Origin; other clients send none. Without this a page the user visits could make the
    browser pull models, delete them or run generations here (a form or a no-cors fetch needs no
    preflight, and bodies of any content type are read)."""
    origin = request.headers.get("Origin")
    if not origin or request.method in ("GET", "HEAD", "OPTIONS"):
        return False
    if "*" in config.cors_origins or origin in config.cors_origins:
        return False
    return origin != f"{request.scheme}://{request.host}"  # the server's own pages (the chat page)


MAX_NAMED_FIELDS = 20  # X-Bubo-Ignored-Fields names at most this many, each cut to NAME_CHARS
NAME_CHARS = 64


def header_names(names: list[str]) -> str:
    """Field names for a header: printable ASCII, anything else escaped as JSON escapes it (a
    name is any text a client sent, control characters and lone surrogates included), a bounded
    number of bounded names."""
    shown = []
    for n in names[:MAX_NAMED_FIELDS]:
        text = json.dumps(n[:NAME_CHARS], ensure_ascii=True)[1:-1].replace("\x7f", "\\u007f")
        shown.append(text + ("..." if len(n) > NAME_CHARS else ""))
    more = len(names) - MAX_NAMED_FIELDS
    return ", ".join(shown) + (f" (and {more} more)" if more > 0 else "")


class _App(Flask):
    """Flask, less a check per call: its routes and hooks are plain functions (none is a
    coroutine), so ensure_sync has nothing to wrap (Flask asks inspect about each of them on
    every request: six calls per request, a tenth of a light request's time in the app)."""

    def ensure_sync(self, func: Any) -> Any:
        return func


def create_app(models: Engine | Registry, config: ServerConfig | None = None) -> Flask:
    """The app serving one engine (its names: config's served_model_name, aliases and "bubo"), or
    every model of a registry (router mode)."""
    from bubo.api import about, core

    if isinstance(models, Registry):
        registry = models
        config = config or ServerConfig(served_model_name=registry.default.name)
    else:
        config = config or ServerConfig(served_model_name=models.model_name)
        registry = Registry.single(models, config.served_model_name, config.model_names[1:])
    app = _App("bubo", static_folder=None)  # no static files: no /static route
    app.config["BUBO_MODELS"] = registry
    app.config["BUBO_CONFIG"] = config
    app.config["MAX_CONTENT_LENGTH"] = config.max_body_bytes
    app.config["BUBO_CALLERS"] = callers.Callers(config.caller_max_slots)  # bubo.api.callers
    app.config["BUBO_PREPARE"] = PreparePool(config.prepare_timeout_s)  # bubo.api.offload
    app.config["BUBO_RESPONSES"] = ResponseStore(Path(config.responses_path) if config.responses_path else None,
                                                  config.responses_max)
    if config.sign_key is not None:
        from bubo.receipts import Signer

        app.config["BUBO_SIGNER"] = Signer(config.sign_key)  # bubo.api.receipts
    app.json.ensure_ascii = False  # type: ignore[attr-defined]
    app.json.sort_keys = False  # type: ignore[attr-defined]

    app.register_blueprint(core.blueprint)
    app.register_blueprint(about.blueprint)  # GET / and GET /openapi.json
    if config.debug_routes_enabled:
        app.register_blueprint(core.debug_blueprint)

    for name in DIALECTS:
        if name == "bubo.api.mcp" and not config.mcp:
            continue  # --no-mcp
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name is None or not (name + ".").startswith(e.name + "."):
                raise  # the dialect exists but something it imports is missing: say so
            continue
        app.register_blueprint(module.blueprint)

    @app.before_request
    def _auth() -> None:
        if config.draining:
            raise ApiError(503, "shutting_down", "the server is shutting down: send the request to another one, or "
                                                 "again once it is back", headers={"Connection": "close",
                                                                                   "Retry-After": "5"})
        check_host(config.host, config.host_allow, bool(config.api_keys))
        if request.path not in about.PUBLIC_PATHS:
            callers.identify(check_api_key(config.api_keys), config.caller_names)
        if _foreign_origin(config):
            raise ApiError(403, "forbidden_origin",
                           f"a web page at {request.headers.get('Origin')} may not send {request.method} requests to "
                           "this server: start it with --cors ORIGIN to allow that page")

    @app.teardown_request
    def _release(_: BaseException | None) -> None:
        release_models()

    @app.after_request
    def _count(resp: Any) -> Any:
        """Once the response is written (a stream's last chunk included): the request counts for
        its caller, and the generations it still holds for --caller-max-slots end."""
        environ = request.environ
        record = environ.setdefault("bubo.log", {})
        # not a refused key's, nor a public page's, nor a route run for an MCP tool (its /mcp request counts)
        who, known = callers.caller(), callers.ENVIRON in environ and callers.INNER not in environ
        counts = app.config["BUBO_CALLERS"]

        def closed() -> None:
            callers.release_all(environ)
            if known:
                counts.finished(who, record)
        resp.call_on_close(closed)
        return resp

    @app.after_request
    def _ignored(resp: Any) -> Any:
        """A request's fields that no lookup of its route read (a typo, or a field bubo does not
        take): named in X-Bubo-Ignored-Fields and, with -v, in the log. Only on success: a
        refused request stops reading at its first error."""
        unread = ignored_fields() if resp.status_code < 400 else []
        if unread:
            named = header_names(unread)
            resp.headers["X-Bubo-Ignored-Fields"] = named
            log.debug("%s %s: fields no route reads: %s", request.method, request.path, named)
        return resp

    @app.after_request
    def _cors(resp: Any) -> Any:
        origin = request.headers.get("Origin")
        if origin and config.cors_origins and ("*" in config.cors_origins or origin in config.cors_origins):
            resp.headers["Access-Control-Allow-Origin"] = origin
            resp.headers["Vary"] = "Origin"
            resp.headers["Access-Control-Allow-Headers"] = CORS_HEADERS
            resp.headers["Access-Control-Allow-Methods"] = "GET, POST, DELETE, OPTIONS"
            resp.headers["Access-Control-Expose-Headers"] = "Mcp-Session-Id"  # a page's MCP client keeps its session
        return resp

    @app.errorhandler(ApiError)
    def _api_error(err: ApiError) -> Any:
        return error_response(request.path, err)

    @app.errorhandler(HTTPException)
    def _http_error(err: HTTPException) -> Any:
        status = err.code or 500
        code = _HTTP_CODES.get(status, "http_error")
        if status == 404:
            msg = f"no route {request.method} {request.path}: see the API reference for the routes"
        elif status == 405:
            allowed = ", ".join(m for m in (err.valid_methods or []) if m not in ("HEAD", "OPTIONS"))  # type: ignore[attr-defined]
            msg = f"{request.path} does not take {request.method}; it takes {allowed}"
        elif status == 413:
            msg = f"the request body is larger than the limit of {config.max_body_bytes} bytes"
        else:
            msg = err.description or str(err)
        out = error_response(request.path, ApiError(status, code, msg))
        if status == 405 and getattr(err, "valid_methods", None):
            out.headers["Allow"] = ", ".join(err.valid_methods)  # type: ignore[attr-defined]
        if status == 413:
            # the rest of the body is unread: the connection cannot carry another request
            out.headers["Connection"] = "close"
        return out

    @app.errorhandler(Exception)
    def _unexpected(err: Exception) -> Any:
        log.exception("unexpected error in %s %s", request.method, request.path)
        return error_response(request.path, internal(err))

    _no_coroutines(app)
    app.wsgi_app = LightRoutes(app, config)  # type: ignore[method-assign]  # bubo.api.light
    return app


def _no_coroutines(app: Flask) -> None:
    """_App.ensure_sync wraps nothing: a coroutine route or hook added one day would be called
    and never awaited. Refused here, at start."""
    hooks: list[Any] = [*app.view_functions.values(), *app.teardown_appcontext_funcs]
    for table in (app.before_request_funcs, app.after_request_funcs, app.teardown_request_funcs):
        hooks += [fn for fns in table.values() for fn in fns]
    hooks += [fn for by_code in app.error_handler_spec.values() for by_class in by_code.values()
              for fn in by_class.values()]
    bad = [getattr(fn, "__qualname__", repr(fn)) for fn in hooks if inspect.iscoroutinefunction(fn)]
    if bad:
        raise TypeError(f"coroutine routes or hooks, which bubo's app does not run: {', '.join(bad)}")
