"""The Python examples cannot go stale: every ```python block between the markers
(<!-- python-api --> and <!-- /python-api -->) of README.md and docs/python.md runs here as it
is written, each in a fresh namespace, on the real catalog models it names."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.models

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PYTHON_DOC = ROOT / "docs" / "python.md"
START, END = "<!-- python-api -->", "<!-- /python-api -->"


def section(path: Path) -> str:
    text = path.read_text(encoding="utf-8")
    assert text.count(START) == 1 and text.count(END) == 1, f"{path.name} needs one {START} ... {END} section"
    start, end = text.index(START), text.index(END)
    assert start < end
    return text[start + len(START):end]


def examples(path: Path) -> list[tuple[int, str]]:
    """(line in the file, code) of each ```python block in its section."""
    text = path.read_text(encoding="utf-8")
    offset = text.index(START) + len(START)
    out = []
    for m in re.finditer(r"^```python[ \t]*\n(.*?)^```[ \t]*$", section(path), re.S | re.M):
        line = text.count("\n", 0, offset + m.start(1)) + 1
        out.append((line, m.group(1)))
    return out


EXAMPLES = [(path, line, code) for path in (README, PYTHON_DOC) for line, code in examples(path)]


def test_the_sections_show_the_api():
    """docs/python.md's examples cover what it promises: loading, streaming, completing, chat,
    structured output, tool calls, the context manager; the README's show the library at all."""
    code = "\n".join(c for _, c in examples(PYTHON_DOC))
    assert len(examples(PYTHON_DOC)) >= 4
    for needle in ("bubo.Model(", ".generate(", ".complete(", ".chat(", ".chat_stream(", "json_schema=",
                   "response_format=", "grammar=", "tools=", "tool_choice=", ".tool_calls", "with bubo.Model(",
                   ".close()"):
        assert needle in code, needle
    assert "bubo.Model(" in "\n".join(c for _, c in examples(README))


@pytest.mark.parametrize("path,line,code", EXAMPLES, ids=[f"{p.name}:{line}" for p, line, _ in EXAMPLES])
def test_example_runs(path, line, code, capsys):
    # padded so that a traceback names the file's own line
    exec(compile("\n" * (line - 1) + code, str(path), "exec"), {"__name__": "__readme__"})
    assert capsys.readouterr().out  # every example shows something
