"""bubo: a local LLM inference server on hand-written C kernels for GGUF models."""


def _use_installed_build() -> None:
    """Run from a source checkout (`pip install .` then `python -m bubo serve` in the same
    folder), Python finds the checkout's bubo/ first, and its native modules were never built
    there: they live in the installed copy. Point this package's path at that copy, which holds
    the same sources, built. An editable install finds its native modules and never gets here."""
    import importlib.util
    import os
    import sys
    from importlib.machinery import PathFinder

    try:
        if importlib.util.find_spec("bubo._gguf") is not None:
            return
    except ImportError:
        pass
    checkout = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    others = [p for p in sys.path if os.path.realpath(p or os.curdir) != os.path.realpath(checkout)]
    spec = PathFinder.find_spec("bubo", others)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            f"bubo's native modules are not built in {checkout}: install bubo first (pip install .)")
    installed = list(spec.submodule_search_locations)
    if _sources_differ(os.path.join(checkout, "bubo"), installed[0]):
        print(f"bubo: this checkout's Python sources ({checkout}) differ from the installed copy's "
              f"({installed[0]}), which is what runs: reinstall (pip install .), or use an editable "
              "install (docs/development.md)", file=sys.stderr)
    __path__[:] = installed


def _sources_differ(here: str, there: str) -> bool:
    """Whether the .py files under here and there differ (names or bytes)."""
    import filecmp
    import os

    def sources(root: str) -> set[str]:
        return {os.path.relpath(os.path.join(d, f), root) for d, _, files in os.walk(root) for f in files
                if f.endswith(".py")}

    mine, theirs = sources(here), sources(there)
    if mine != theirs:
        return True
    return not all(filecmp.cmp(os.path.join(here, f), os.path.join(there, f), shallow=False) for f in mine)


_use_installed_build()

from bubo._tokenizer import Detokenizer, Tokenizer
from bubo.errors import BuboError, GGUFError, RequestError, UnsupportedError
from bubo.gguf import GGUFFile, TensorInfo
from bubo.llm import ChatCompletion, Completion, Context, Model, ToolCall

__version__ = "0.1.0"

__all__ = [
    "BuboError",
    "ChatCompletion",
    "Completion",
    "Context",
    "Detokenizer",
    "GGUFError",
    "GGUFFile",
    "Model",
    "RequestError",
    "TensorInfo",
    "Tokenizer",
    "ToolCall",
    "UnsupportedError",
    "__version__",
]
