"""The OpenAI dialect: /v1/chat/completions, /v1/completions, /v1/responses."""

from bubo.api.openai.routes import blueprint

__all__ = ["blueprint"]
