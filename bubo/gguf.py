"""GGUF model files: the native reader (GGUFFile, TensorInfo) and the policy of which models
bubo runs."""

from __future__ import annotations

from bubo._gguf import GGUFFile, TensorInfo
from bubo.errors import UnsupportedError

__all__ = ["GGUFFile", "TensorInfo", "SUPPORTED_ARCHITECTURES", "check_model_file"]

# general.architecture values that bubo has a forward pass for
SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "qwen3", "gemma3", "bert")


def check_model_file(f: GGUFFile) -> str:
    """Return the file's architecture if bubo can run it: a known general.architecture and
    every tensor of a block type bubo has kernels for. Otherwise raise UnsupportedError naming
    the file and what is missing."""
    name = f.path if f.path is not None else "<bytes>"
    arch = f.metadata.get("general.architecture")
    if arch is None:
        raise UnsupportedError(f"{name}: no general.architecture key; not a model file bubo can run")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise UnsupportedError(
            f"{name}: architecture {arch!r} is not supported; bubo runs {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    f.check_supported()
    return arch
