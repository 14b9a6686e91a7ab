"""The Anthropic dialect: /v1/messages and /v1/messages/count_tokens."""

from bubo.api.anthropic.routes import blueprint

__all__ = ["blueprint"]
