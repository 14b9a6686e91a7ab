"""The code is typed and linted: mypy (strict, the whole bubo package: pyproject.toml) and ruff
pass, and the api layer types the engine, model, runtime, tokenizer and grammar it handles
(`Any` is for JSON only)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

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
