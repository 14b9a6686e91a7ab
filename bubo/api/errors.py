"""The one place error bodies are made.

OpenAI shape, every route but the two Anthropic ones:
    {"error": {"message": ..., "type": ..., "code": ...}}
Anthropic shape, /v1/messages and /v1/messages/count_tokens:
    {"type": "error", "error": {"type": ..., "message": ..., "code": ...}, "request_id": ...}

Handlers raise ApiError; the app turns it (and every other failure: unknown path, wrong method,
oversized body, an unexpected exception) into the right shape for the path."""

from __future__ import annotations

import json
import uuid
from typing import Any

from flask import Response

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
RETRY_AFTER_SECONDS = 5


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


def openai_type(status: int) -> str:
    return _OPENAI_TYPE.get(status, "server_error" if status >= 500 else "invalid_request_error")


def anthropic_type(status: int) -> str:
    return _ANTHROPIC_TYPE.get(status, "api_error" if status >= 500 else "invalid_request_error")


def _json(status: int, body: dict[str, Any], headers: dict[str, str] | None) -> Response:
    resp = Response(json.dumps(body, ensure_ascii=False, separators=(",", ":")), status=status, mimetype="application/json")
    for k, v in (headers or {}).items():
        resp.headers[k] = v
    return resp


def api_error(status: int, code: str, message: str, type: str | None = None,
              headers: dict[str, str] | None = None) -> Response:
    """An error response in the OpenAI shape."""
    body = {"error": {"message": message, "type": type or openai_type(status), "code": code}}
    return _json(status, body, headers)


def anthropic_error(status: int, code: str, message: str, type: str | None = None,
                    headers: dict[str, str] | None = None) -> Response:
    """An error response in the Anthropic shape, the stable code in error.code."""
    body = {
        "type": "error",
        "error": {"type": type or anthropic_type(status), "message": message, "code": code},
        "request_id": "req_" + uuid.uuid4().hex[:24],
    }
    return _json(status, body, headers)


def is_anthropic_path(path: str) -> bool:
    return any(path == p or path.startswith(p + "/") for p in ANTHROPIC_PATHS)


def error_response(path: str, err: ApiError) -> Response:
    """err in the shape of the route at path. A type given for the other shape is not reused."""
    if is_anthropic_path(path):
        return anthropic_error(err.status, err.code, err.message, None, err.headers)
    return api_error(err.status, err.code, err.message, err.type, err.headers)
