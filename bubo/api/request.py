"""Request helpers shared by every route: the JSON body, the model name, the app's engine."""

from __future__ import annotations

import json
import os
from typing import Any

from flask import current_app, request

from bubo.api.config import ServerConfig
from bubo.api.errors import ApiError


def config() -> ServerConfig:
    return current_app.config["BUBO_CONFIG"]


def engine() -> Any:
    return current_app.config["BUBO_ENGINE"]


def ready_engine() -> Any:
    """The engine as the routes submit to it (see GuardedEngine), or a 503 not_ready while the
    model loads (or after it failed to load)."""
    eng = engine()
    if not eng.ready:
        if eng.load_error:
            raise ApiError(503, "not_ready", f"the model {eng.model_name} failed to load: {eng.load_error}")
        raise ApiError(503, "not_ready", f"the model {eng.model_name} is loading; try again when /ready says ready")
    return GuardedEngine(eng, debug_mem_available())


def debug_mem_available() -> int | None:
    """BUBO_DEBUG_MEM_AVAILABLE (bytes): the memory guard's "available now" figure, honoured
    only with the debug hooks on, so that a test can produce the 503 path at will."""
    if not config().debug_routes_enabled:
        return None
    raw = os.environ.get("BUBO_DEBUG_MEM_AVAILABLE", "").strip()
    return int(raw) if raw.isdigit() else None


# a full queue drains at the speed of generation: seconds, not the memory guard's minutes
QUEUE_RETRY_AFTER_SECONDS = 1


class GuardedEngine:
    """The engine, whose submit turns the memory guard's refusals into the reference's errors:
    507 insufficient_memory_permanent (never fits: no Retry-After), 503 insufficient_memory
    (not now: Retry-After, from ApiError), and a full wait queue into 503 queue_full with
    Retry-After. Every route submits through it, whatever its dialect;
    everything else is the engine's own."""

    def __init__(self, eng: Any, mem_available: int | None):
        self._engine = eng
        self._mem_available = mem_available

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def submit(self, req: Any) -> Any:
        from bubo.engine import InsufficientMemoryError, QueueFullError

        try:
            return self._engine.submit(req, mem_available=self._mem_available)
        except QueueFullError as e:
            raise ApiError(503, "queue_full", str(e), headers={"Retry-After": str(QUEUE_RETRY_AFTER_SECONDS)}) from None
        except InsufficientMemoryError as e:
            if e.permanent:
                raise ApiError(507, "insufficient_memory_permanent", str(e)) from None
            raise ApiError(503, "insufficient_memory", str(e)) from None


def json_body() -> dict[str, Any]:
    """The request's JSON object. 413 over the size limit (Flask's MAX_CONTENT_LENGTH), 400
    parse_error for invalid UTF-8, malformed JSON or a body that is not an object. The
    Content-Type is not checked: curl's default form type is common."""
    raw = request.get_data(cache=True)
    if not raw.strip():
        raise ApiError(400, "parse_error", "the request body is empty: send a JSON object")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ApiError(400, "parse_error", f"the request body is not valid UTF-8 (byte {e.start}: {e.reason})") from None
    try:
        body = json.loads(text)
    except json.JSONDecodeError as e:
        raise ApiError(400, "parse_error", f"the request body is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    if not isinstance(body, dict):
        raise ApiError(400, "parse_error", f"the request body must be a JSON object, not {type(body).__name__}")
    return body


def resolve_model(body: dict[str, Any]) -> str:
    """The model name of a request that must name one: 400 missing_model when absent (or
    null/empty), 404 model_not_found (naming the served id) when not served here."""
    cfg = config()
    name = body.get("model")
    served = cfg.served_model_name
    if name is None or name == "":
        raise ApiError(400, "missing_model", f'the request has no model: add "model": "{served}" (or "bubo")')
    if not isinstance(name, str):
        raise ApiError(400, "invalid_type", f"model must be a string, not {type(name).__name__}")
    if name not in cfg.model_names:
        others = ", ".join(f"'{n}'" for n in cfg.model_names[1:])
        raise ApiError(404, "model_not_found",
                       f"model '{name}' is not served by this process; it serves '{served}' (also {others})")
    return name


def submit(req: Any) -> Any:
    """engine.submit(req), its refusals as API errors: 503 not_ready while loading, 400
    context_length_exceeded naming both lengths, 503/507 from the memory guard, 400
    invalid_request for bad token ids."""
    from bubo.engine import ContextLengthError, NotReadyError

    eng = ready_engine()
    try:
        return eng.submit(req)
    except NotReadyError as e:
        raise ApiError(503, "not_ready", str(e)) from None
    except ContextLengthError as e:
        raise ApiError(400, "context_length_exceeded", str(e)) from None
    except ValueError as e:
        raise ApiError(400, "invalid_request", str(e)) from None
