"""llama-server's native generating routes: /completion and /infill. Their blueprint: routes.py
(bubo/api/app.py registers it)."""
