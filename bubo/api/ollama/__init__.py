"""Ollama's API (/api/chat, /api/generate, /api/tags, ...): see routes.py."""
