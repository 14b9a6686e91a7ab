"""An independent numpy reference for bubo's forward pass (forward.py) and writers of tiny GGUF
test models (tiny.py). Depends on numpy and the `gguf` package only, never on bubo."""

from .forward import HParams, RefModel, load, log_softmax

__all__ = ["HParams", "RefModel", "load", "log_softmax"]
