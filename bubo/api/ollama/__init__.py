"""Ollama's API (/api/chat, /api/generate, /api/tags, ...): see routes.py."""

from bubo.api.ollama.routes import blueprint

__all__ = ["blueprint"]
