"""bubo: a local LLM inference server on hand-written C kernels for GGUF models."""

from bubo.errors import BuboError, GGUFError, UnsupportedError
from bubo.gguf import GGUFFile

__version__ = "0.1.0"

__all__ = ["BuboError", "GGUFError", "UnsupportedError", "__version__"]
