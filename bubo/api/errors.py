"""The one place error bodies are made, and engine reasons become HTTP errors.

OpenAI shape, every route but the two Anthropic ones:
    {"error": {"message": ..., "type": ..., "code": ...}}
Anthropic shape, /v1/messages and /v1/messages/count_tokens:
    {"type": "error", "error": {"type": ..., "message": ..., "code": ...}, "request_id": ...}
Ollama shape, every route under /api/ (its clients read the one string):
    {"error": ...}

Handlers raise ApiError; the app turns it (and every other failure: unknown path, wrong method,
oversized body, an unexpected exception) into the right shape for the path. The engine's
refusals and failed streams carry a Reason (bubo.engine.types); from_reason() gives each its
status, code and headers, and stream_error() the in-band event a stream that already sent its
200 ends with, in each dialect's shape."""

from __future__ import annotations

import enum
import json
import uuid
from typing import Any

from flask import Response

from bubo.embed import EncoderOnlyError
from bubo.engine.registry import ModelNotLoadedError
from bubo.engine.types import EngineRefusal, ErrorEvent, NotReadyError, QueueFullError, Reason

# the reference's table: the OpenAI type of each status
_OPENAI_TYPE = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
}
# Anthropic's error types (https://docs.anthropic.com/en/api/errors)
_ANTHROPIC_TYPE = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    422: "invalid_request_error",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}
ANTHROPIC_PATHS = ("/v1/messages",)  # and everything under it (count_tokens)
OLLAMA_PREFIX = "/api/"  # Ollama's routes
OLLAMA_PATHS = ("/v1/systemone",)  # Ollama's outside /api/: its decision API
MCP_PATH = "/mcp"  # the Model Context Protocol's: JSON-RPC errors
RETRY_AFTER_SECONDS = 5
# a full queue drains at the speed of generation: seconds, not the memory guard's minutes
QUEUE_RETRY_AFTER_SECONDS = 1
# a model loading: the catalog's load in about a second (a larger one, or a pull, takes longer)
LOADING_RETRY_AFTER_SECONDS = 2

# each engine reason: (status, code, Retry-After seconds or None)
_REASONS: dict[Reason, tuple[int, str, int | None]] = {
    Reason.CONTEXT_EXCEEDED: (400, "context_length_exceeded", None),
    Reason.MEMORY_SHORT: (503, "insufficient_memory", RETRY_AFTER_SECONDS),
    Reason.MEMORY_NEVER: (507, "insufficient_memory_permanent", None),
    Reason.QUEUE_FULL: (503, "queue_full", QUEUE_RETRY_AFTER_SECONDS),
    Reason.NOT_READY: (503, "not_ready", LOADING_RETRY_AFTER_SECONDS),
    Reason.CANCELLED: (503, "cancelled", None),
    Reason.SHUTTING_DOWN: (503, "shutting_down", None),
    Reason.INVALID_REQUEST: (400, "invalid_value", None),  # a field out of range (token ids, logit_bias)
    Reason.GRAMMAR_STUCK: (400, "invalid_grammar", None),
    Reason.NO_TOKEN: (400, "no_token_allowed", None),
    Reason.MODEL_UNKNOWN: (404, "model_not_found", None),
    Reason.MODEL_NOT_LOADED: (400, "model_not_loaded", None),
    Reason.INTERNAL: (500, "internal_error", None),
}


class ApiError(Exception):
    """An HTTP error with the reference's stable code. type defaults from the status."""

    def __init__(self, status: int, code: str, message: str, type: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.type = type
        self.headers = dict(headers or {})
        if code in ("insufficient_memory", "memory_pressure"):
            self.headers.setdefault("Retry-After", str(RETRY_AFTER_SECONDS))


def from_reason(reason: Reason, message: str) -> ApiError:
    """The API error of an engine refusal or a failed stream."""
    status, code, retry = _REASONS[reason]
    return ApiError(status, code, message, headers={"Retry-After": str(retry)} if retry is not None else None)


def from_refusal(e: EngineRefusal) -> ApiError:
    """The API error of an engine refusal: the engine's words, and the flag or route to use."""
    return from_reason(e.reason, e.message + _hint(e))


def _hint(e: EngineRefusal) -> str:
    if isinstance(e, QueueFullError):
        return f" (the server's --queue-size is {e.queue_size})"
    if isinstance(e, ModelNotLoadedError):
        return f' (--no-models-autoload): POST /models/load {{"model": "{e.name}"}} first'
    if isinstance(e, NotReadyError) and e.loading:
        return "; try again when /ready says ready"
    if isinstance(e, EncoderOnlyError):
        return EMBEDDING_ROUTES
    return ""


# where an embedding model's vectors are asked for (the hint of a generation asked of one)
EMBEDDING_ROUTES = " (POST /v1/embeddings, /embedding or /api/embed)"


def not_ready(message: str, failed: bool = False) -> ApiError:
    """503 not_ready: the model is loading, unloaded or asleep (Retry-After, as every not_ready the
    engine reports), or its load failed (failed: trying again does not help, no Retry-After)."""
    if failed:
        return ApiError(503, "not_ready", message)
    return from_reason(Reason.NOT_READY, message)


def from_event(ev: ErrorEvent) -> ApiError:
    return from_reason(ev.reason, ev.message)


def openai_type(status: int) -> str:
    return _OPENAI_TYPE.get(status, "server_error" if status >= 500 else "invalid_request_error")


def anthropic_type(status: int) -> str:
    return _ANTHROPIC_TYPE.get(status, "api_error" if status >= 500 else "invalid_request_error")


def dumps(body: Any) -> str:
    """JSON text for a response that cannot fail on its strings: text with a lone surrogate (from
    a client's input, quoted in a message) goes out escaped."""
    text = json.dumps(body, ensure_ascii=False, separators=(",", ":"))
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = json.dumps(body, ensure_ascii=True, separators=(",", ":"))
    return text


def _json(status: int, body: dict[str, Any], headers: dict[str, str] | None) -> Response:
    resp = Response(dumps(body), status=status, mimetype="application/json")
    for k, v in (headers or {}).items():
        resp.headers[k] = v
    return resp


def openai_body(status: int, code: str, message: str, type: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type or openai_type(status), "code": code}}


def anthropic_body(status: int, code: str, message: str, type: str | None = None) -> dict[str, Any]:
    return {"type": "error", "error": {"type": type or anthropic_type(status), "message": message, "code": code}}


def api_error(status: int, code: str, message: str, type: str | None = None,
              headers: dict[str, str] | None = None) -> Response:
    """An error response in the OpenAI shape."""
    return _json(status, openai_body(status, code, message, type), headers)


def anthropic_error(status: int, code: str, message: str, type: str | None = None,
                    headers: dict[str, str] | None = None) -> Response:
    """An error response in the Anthropic shape, the stable code in error.code."""
    body = anthropic_body(status, code, message, type)
    body["request_id"] = "req_" + uuid.uuid4().hex[:24]
    return _json(status, body, headers)


def is_anthropic_path(path: str) -> bool:
    return any(path == p or path.startswith(p + "/") for p in ANTHROPIC_PATHS)


def is_ollama_path(path: str) -> bool:
    return path.startswith(OLLAMA_PREFIX) or path in OLLAMA_PATHS


def body_for(path: str | None, status: int, code: str, message: str, type: str | None = None) -> dict[str, Any]:
    """An error body in the shape of the route at path (None, before a request line was read:
    OpenAI's)."""
    if path is not None and is_anthropic_path(path):
        return anthropic_body(status, code, message)
    if path is not None and is_ollama_path(path):
        return {"error": message}
    if path == MCP_PATH:  # a JSON-RPC error (bubo.api.mcp): the request was refused before it was read
        return {"jsonrpc": "2.0", "id": None,
                "error": {"code": -32603 if status >= 500 else -32600, "message": message,
                          "data": {"status": status, "code": code}}}
    return openai_body(status, code, message, type)


def internal(err: BaseException) -> ApiError:
    """The 500 answer to an exception no route expected (the caller logs it)."""
    return ApiError(500, "internal_error", f"internal error: {type(err).__name__}: {err}")


def error_response(path: str, err: ApiError) -> Response:
    """err in the shape of the route at path (body_for). A type given for the other shape is not
    reused."""
    body = body_for(path, err.status, err.code, err.message, err.type)
    if is_anthropic_path(path):
        body["request_id"] = "req_" + uuid.uuid4().hex[:24]
    return _json(err.status, body, err.headers)


class StreamShape(enum.Enum):
    """How a stream that already sent its 200 reports an error, in-band."""

    OPENAI = "openai"  # chat completions, completions, /completion: a data event with the error object
    RESPONSES = "responses"  # an "error" event with code, message and the sequence number
    ANTHROPIC = "anthropic"  # an "error" event with Anthropic's error object
    OLLAMA = "ollama"  # an NDJSON line {"error": message}


def stream_error(shape: StreamShape, err: ApiError, sequence_number: int = 0) -> Any:
    """The SSE item (see bubo.api.sse) that ends a stream with err."""
    if shape is StreamShape.ANTHROPIC:
        return ("error", anthropic_body(err.status, err.code, err.message))
    if shape is StreamShape.OLLAMA:
        return {"error": err.message}
    if shape is StreamShape.RESPONSES:
        return ("error", {"type": "error", "code": err.code, "message": err.message, "param": None,
                          "sequence_number": sequence_number})
    return openai_body(err.status, err.code, err.message)
