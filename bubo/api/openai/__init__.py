"""The OpenAI dialect: /v1/chat/completions, /v1/completions, /v1/responses. Its routes
and their blueprint: routes.py (bubo/api/app.py registers it)."""
