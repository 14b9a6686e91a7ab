"""The code is typed and linted: mypy (strict, the whole bubo package: pyproject.toml) and ruff
pass, and the api layer types the engine, model, runtime, tokenizer and grammar it handles
(`Any` is for JSON only)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *cmd], cwd=ROOT, capture_output=True, text=True, timeout=900)


def test_mypy_strict_passes():
    # mypy and ruff come with the test extra (pip install ".[test]")
    p = _run("mypy")
    assert p.returncode == 0, p.stdout + p.stderr


def test_ruff_passes():
    p = _run("ruff", "check", "bubo", "tests", "benchmarks", "scripts", "wheels")
    assert p.returncode == 0, p.stdout + p.stderr


# a parameter, attribute or variable named for one of these objects, annotated Any
_ANY = re.compile(r"\b(engine|eng|model|runtime|rt|tokenizer|tok|grammar|registry|reg)\s*:\s*Any\b")


def test_the_api_layer_has_no_any_for_engines_models_tokenizers_or_grammars():
    offenders = []
    for path in sorted((ROOT / "bubo" / "api").rglob("*.py")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if _ANY.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def test_mypy_passes_without_the_optional_extras():
    """Without the ray and receipts extras installed mypy must pass too: every module an extra
    brings is declared optional for mypy (missing imports are Any), and the modules that use ray
    keep no `type: ignore` that only ray's own types make needed. (Checked by hand in an environment
    without the extra; here, that the configuration says so for every import.)"""
    import ast

    tomllib = pytest.importorskip("tomllib", reason="tomllib is Python 3.11's")
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    optional = {m for o in config["overrides"] if o.get("ignore_missing_imports") for m in o["module"]}
    relaxed = {m for o in config["overrides"] if o.get("warn_unused_ignores") is False for m in o["module"]}
    extra = {"ray", "aiohttp", "starlette", "cryptography"}  # what pip install ".[ray,receipts]" adds
    users = []
    for path in sorted((ROOT / "bubo").rglob("*.py")):
        tree = ast.parse(path.read_text())
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module and not n.level}
        used = {n for n in names if n.split(".")[0] in extra}
        if used:
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            if any(n.split(".")[0] != "cryptography" for n in used):  # ray's users: their ignores are relaxed
                users.append(module)
            for n in used:
                top = n.split(".")[0]
                assert top in optional and f"{top}.*" in optional, f"{module} imports {n}: not optional for mypy"
    assert users, "no module imports the ray extra: this test checks nothing"
    for module in users:
        package = module.rsplit(".", 1)[0]
        assert module in relaxed or f"{package}.*" in relaxed, f"{module}: its ignores for ray's types would be unused"
