"""The HTTP layer: the app factory, its config, errors, SSE and request helpers."""

from bubo.api.app import create_app
from bubo.api.config import ServerConfig
from bubo.api.errors import ApiError, anthropic_error, api_error
from bubo.api.request import json_body, ready_engine, resolve_model, submit
from bubo.api.sse import cancel_on_disconnect, sse_response

__all__ = ["ApiError", "ServerConfig", "anthropic_error", "api_error", "cancel_on_disconnect", "create_app",
           "json_body", "ready_engine", "resolve_model", "sse_response", "submit"]
