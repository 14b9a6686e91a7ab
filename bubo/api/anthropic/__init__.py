"""The Anthropic dialect: /v1/messages and /v1/messages/count_tokens. Its routes and their
blueprint: routes.py (bubo/api/app.py registers it)."""
