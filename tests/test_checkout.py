"""Running from a source checkout (`pip install .`, then `python -m bubo ...` in the checkout):
Python finds the checkout's bubo/ first, whose native modules were never built there, so the
installed copy runs. When the checkout's Python sources differ from that copy's (an edit not
reinstalled), bubo says so on stderr rather than silently running the old code."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _installed() -> Path | None:
    """The installed copy's bubo/ when it is a regular install (its .py files beside its native
    modules); None for an editable install, which runs the checkout's own sources."""
    spec = importlib.util.find_spec("bubo._gguf")
    if spec is None or spec.origin is None:
        return None
    where = Path(spec.origin).parent
    return where if (where / "__init__.py").is_file() and where.resolve() != (ROOT / "bubo").resolve() else None


def _import_from(checkout: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", "import bubo; print(bubo.__path__[0])"], cwd=checkout,
                          capture_output=True, text=True, timeout=120)


def test_a_checkout_that_differs_from_the_installed_copy_says_so(tmp_path):
    installed = _installed()
    if installed is None:
        pytest.skip("bubo is installed editable here: the checkout's sources are what runs")
    checkout = tmp_path / "checkout"
    shutil.copytree(installed, checkout / "bubo", ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    same = _import_from(checkout)
    assert same.returncode == 0, same.stderr
    assert same.stdout.strip() == str(installed) and "differ" not in same.stderr  # the same sources: quiet
    (checkout / "bubo" / "limits.py").write_text((installed / "limits.py").read_text() + "\n# an edit\n")
    edited = _import_from(checkout)
    assert edited.returncode == 0, edited.stderr
    assert edited.stdout.strip() == str(installed)  # the installed copy still runs ...
    assert "differ from the installed copy" in edited.stderr and str(checkout) in edited.stderr  # ... and it says so
