"""llama-server's native generating route: /completion."""

from bubo.api.llamacpp.routes import blueprint

__all__ = ["blueprint"]
