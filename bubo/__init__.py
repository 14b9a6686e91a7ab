"""bubo: a local LLM inference server on hand-written C kernels for GGUF models."""

from bubo.errors import BuboError, GGUFError, UnsupportedError
from bubo.gguf import GGUFFile, TensorInfo
from bubo._tokenizer import Detokenizer, Tokenizer
from bubo.llm import Completion, Model

__version__ = "0.1.0"

__all__ = [
    "BuboError",
    "Completion",
    "Detokenizer",
    "GGUFError",
    "GGUFFile",
    "Model",
    "TensorInfo",
    "Tokenizer",
    "UnsupportedError",
    "__version__",
]
