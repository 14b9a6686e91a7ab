"""Light routes: the plain case of a few routes whose work outside the engine is small (GET
/health, POST /tokenize of a short text, POST /v1/embeddings of one, POST /completion of a short
text prompt, not streamed), answered beneath Flask's per-request machinery.

Flask's request context, URL matching, hooks and Response object cost about 0.1 ms of CPU per
request: more than the whole work of these routes but a completion's, and, on the one thread
that serves every connection, what bounds how many health checks or tokenizations a second the
server answers (a fifth of a one-token completion's CPU outside the engine).

A light answer is declared beside its route's Flask view (light(view)) and is a function of the
request's JSON body and the app; it returns the answer's bytes, or None for anything that is not
its plain case. The request goes to Flask, which answers it as it always does, whenever it is not
plain:
  - the server is shutting down, has API keys, or its Host header is refused (the app's _auth);
  - an Origin header (the app's CORS and foreign-origin checks), a query string;
  - a body that is chunked, over LIGHT_BODY_BYTES, not a JSON object, or (the answer's call)
    holds a field it does not take as given: a typo (X-Bubo-Ignored-Fields), a value of another
    type (the route's 400), a model's name where the route would look it up, a text long enough
    for the preparation pool;
  - the default model is not loaded (loading, sleeping, failed);
  - the app has a hook the light path does not stand in for (an embedding program's own), a
    receiver of Flask's request signals, a view of its own in the route's place, or JSON settings
    of its own (debug mode's indented JSON included).
So a light answer is the answer Flask would give, byte for byte but for the Date header
(tests/api/test_light.py sends the same requests both ways). Once a light answer has queued work
(Plain.commit), its errors are its answer, written by Flask's error shapes (bubo.api.errors), so
that the work is not done twice; no error shape lives here.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from flask import Flask, signals
from flask.json.provider import DefaultJSONProvider

from bubo.api import callers
from bubo.api.auth import host_allowed
from bubo.api.config import ServerConfig
from bubo.api.errors import ApiError, error_response, internal
from bubo.api.request import Body, declared_length, json_object
from bubo.engine.protocol import ServingEngine
from bubo.engine.registry import ModelEntry, ModelStatus, Registry
from bubo.runtime import Runtime

log = logging.getLogger("bubo.api")

LIGHT_BODY_BYTES = 16 * 1024  # a body past this goes through Flask (its work may be offloaded)

# the app's hooks (bubo.api.app.create_app) and what a light answer does in their place, for a
# plain request: _auth lets it in and names no caller; _count counts it for the unnamed caller
# once it is written; _ignored and _cors add no header; _release lets go of the model it used
STANDS_IN_FOR = {"before_request": ("_auth",), "after_request": ("_cors", "_ignored", "_count"),
                 "teardown_request": ("_release",)}


class Plain:
    """A plain request, as a light answer sees it: its JSON body (None for a GET) and the app's
    default model, held until the answer is written."""

    def __init__(self, config: Mapping[str, Any], body: Body | None, record: dict[str, Any], sock: Any = None,
                 size: int = 0):
        self.config = config  # the app's (BUBO_MODELS, BUBO_RESPONSES, ...)
        self.registry: Registry = config["BUBO_MODELS"]
        self.body = body  # its lookups counted, as a route's (an unread field: not plain)
        self.size = size  # the body's bytes
        self.record = record  # the request's log fields (environ["bubo.log"])
        self.socket = sock  # the client's (environ["bubo.socket"]): an answer that waits watches it
        self.held: list[ModelEntry] = []
        self.committed = False

    def commit(self) -> None:
        """From here the request is the light answer's: its work has effects (a job queued on
        the engine) that asking Flask would repeat, so what it raises is its answer, in Flask's
        shapes (an ApiError as the route's error, anything else as the 500 of an unexpected one).
        Before, a light answer returns None for whatever is not plain."""
        self.committed = True

    def engine(self) -> ServingEngine | None:
        """The default model's engine when it is loaded now (no wait, no load), else None."""
        reg = self.registry
        entry = reg.default
        if reg.stopped or entry.status is not ModelStatus.LOADED:
            return None
        engine = reg.acquire(entry.name)  # loaded: counts a user and returns at once
        self.held.append(entry)
        self.record["model"] = entry.name
        return engine

    def runtime(self) -> Runtime | None:
        """The default model's runtime when it is loaded now, else None."""
        engine = self.engine()
        return engine.runtime if engine is not None else None

    def release(self) -> None:
        for entry in self.held:
            self.registry.release(entry)
        self.held.clear()


Answer = Callable[[Plain], "bytes | None"]

_ANSWERS: dict[Callable[..., Any], tuple[str, Answer]] = {}  # a Flask view -> (its method, its light answer)


def light(view: Callable[..., Any], method: str = "GET") -> Callable[[Answer], Answer]:
    """Declare the decorated function as view's light answer for its route's paths and method
    (POST: the body is read and parsed first)."""
    def register(answer: Answer) -> Answer:
        _ANSWERS[view] = (method, answer)
        return answer
    return register


class LightRoutes:
    """The app's WSGI callable (Flask's wsgi_app, wrapped): light answers for plain requests,
    Flask for the rest."""

    def __init__(self, app: Flask, config: ServerConfig):
        self.app = app
        self.config = config
        self.flask = app.wsgi_app
        # (method, path) -> (the light answer, the route's endpoint, its view)
        self.table: dict[tuple[str, str], tuple[Answer, str, Callable[..., Any]]] = {}
        for rule in app.url_map.iter_rules():
            view = app.view_functions.get(rule.endpoint)
            entry = _ANSWERS.get(view) if view is not None else None
            if entry is not None and view is not None and not rule.arguments:
                self.table[(entry[0], rule.rule)] = (entry[1], rule.endpoint, view)
        self.checked = False

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        route = self.table.get((environ.get("REQUEST_METHOD", ""), environ.get("PATH_INFO", "")))
        if route is None or not self._plain(environ, route):
            return self.flask(environ, start_response)
        raw = b""
        body = None
        if environ["REQUEST_METHOD"] == "POST":
            n = int(environ["CONTENT_LENGTH"])
            try:
                raw = environ["wsgi.input"].read(n)
            except OSError:  # late, or cut: Flask finds it short of its length, and answers as it does
                return self._flask(environ, start_response, b"")
            done = environ.get("bubo.body_read")
            if done is not None:
                done()  # the HTTP server: at work now, not waiting on the client
            body = _object(raw) if len(raw) == n else None
            if body is None:
                return self._flask(environ, start_response, raw)
        plain = Plain(self.app.config, body, environ.setdefault("bubo.log", {}), environ.get("bubo.socket"), len(raw))
        error: ApiError | None = None
        try:
            data = route[0](plain)
        except Exception as e:
            data = None
            if plain.committed:  # its work ran: its error is its answer (else Flask answers)
                error = e if isinstance(e, ApiError) else internal(e)
            if not isinstance(e, ApiError):  # committed: as the app's handler of an unexpected exception logs it
                log.exception("unexpected error in %s %s" if plain.committed else "the light answer of %s %s failed",
                              environ["REQUEST_METHOD"], environ["PATH_INFO"])
        finally:
            plain.release()
        if error is not None:
            environ[callers.ENVIRON] = None  # the unnamed caller (_auth's callers.identify, with no keys)
            data = b"".join(error_response(environ["PATH_INFO"], error)(environ, start_response))
        elif data is not None:
            environ[callers.ENVIRON] = None
            start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(data)))])
        else:
            return self._flask(environ, start_response, raw)
        return _Counted(data, self.app.config["BUBO_CALLERS"], environ["bubo.log"])

    def _flask(self, environ: dict[str, Any], start_response: Callable[..., Any], raw: bytes) -> Iterable[bytes]:
        """Flask's answer, given again the body read here: read to its Content-Length, as Flask
        reads it from the server (a body cut short is one Flask could not read)."""
        environ["wsgi.input"] = io.BytesIO(raw)
        environ.pop("wsgi.input_terminated", None)
        return self.flask(environ, start_response)

    def _plain(self, environ: dict[str, Any], route: tuple[Answer, str, Callable[..., Any]]) -> bool:
        config, app = self.config, self.app
        if config.draining or config.api_keys or environ.get("QUERY_STRING") or "HTTP_ORIGIN" in environ:
            return False
        if not host_allowed(environ.get("HTTP_HOST"), config.host, config.host_allow, False):
            return False
        if "HTTP_TRANSFER_ENCODING" in environ:
            return False
        if environ["REQUEST_METHOD"] == "POST":
            limit = app.config.get("MAX_CONTENT_LENGTH")  # Flask's 413 past it
            if declared_length(environ, LIGHT_BODY_BYTES if limit is None else min(LIGHT_BODY_BYTES, limit)) is None:
                return False
        elif (environ.get("CONTENT_LENGTH") or "") not in ("", "0"):
            return False
        if app.debug or app.view_functions.get(route[1]) is not route[2] or _signalled(app):
            return False  # jsonify indents; a view replaced; a receiver of Flask's request signals
        if not self.checked:
            self.checked = True
            if not as_built(app):
                log.info("the app has hooks or settings of its own: every request goes through Flask")
                self.table = {}
                return False
            app._got_first_request = True  # as Flask's first request does: no hook may be added from now
        return True


def _signalled(app: Flask) -> bool:
    """Whether a receiver listens to Flask's request signals from app (a light answer sends none)."""
    return any(signal.receivers and any(True for _ in signal.receivers_for(app)) for signal in _REQUEST_SIGNALS)


_REQUEST_SIGNALS = (signals.request_started, signals.request_finished, signals.got_request_exception,
                    signals.request_tearing_down)


def as_built(app: Flask) -> bool:
    """Whether app's hooks are create_app's and no others (STANDS_IN_FOR), and its JSON is
    written as create_app set it (jsonout's bytes)."""
    tables: dict[str, dict[Any, list[Any]]] = {
        "before_request": app.before_request_funcs, "after_request": app.after_request_funcs,
        "teardown_request": app.teardown_request_funcs}
    for kind, table in tables.items():
        if any(fns for scope, fns in table.items() if scope is not None):
            return False  # a blueprint's own
        if sorted(getattr(fn, "__name__", "") for fn in table.get(None, ())) != sorted(STANDS_IN_FOR[kind]):
            return False
    others = (app.url_value_preprocessors, app.url_default_functions)
    if app.teardown_appcontext_funcs or any(fns for table in others for fns in table.values()):
        return False
    js = app.json
    return type(js) is DefaultJSONProvider and not js.sort_keys and not js.ensure_ascii and js.compact is not False


def _object(raw: bytes) -> Body | None:
    """The body's JSON object, read as Flask's routes read it (bubo.api.jsonin), or None: Flask
    says what is wrong with it."""
    try:
        return Body(json_object(raw))
    except ApiError:
        return None


class _Counted(list[bytes]):
    """A light answer's body: once written (pywsgi closes it), the request counts for the
    unnamed caller, as _count counts a request Flask answered."""

    def __init__(self, data: bytes, counts: callers.Callers, record: dict[str, Any]):
        super().__init__([data])
        self.counts = counts
        self.record = record

    def close(self) -> None:
        self.counts.finished(None, self.record)
