"""The HTTP layer: the app factory, its config, errors, SSE, request helpers and the pipeline."""

from bubo.api.app import create_app
from bubo.api.config import ServerConfig
from bubo.api.errors import ApiError, anthropic_error, api_error
from bubo.api.request import json_body, resolve_model, use_model
from bubo.api.sse import cancel_on_disconnect, sse_response

__all__ = ["ApiError", "ServerConfig", "anthropic_error", "api_error", "cancel_on_disconnect", "create_app",
           "json_body", "resolve_model", "sse_response", "use_model"]
