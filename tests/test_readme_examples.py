"""The README's Python API section cannot go stale: every ```python block between its markers
(<!-- python-api --> and <!-- /python-api -->) runs here as it is written, each in a fresh
namespace, on the real catalog models it names."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.models

README = Path(__file__).resolve().parents[1] / "README.md"
START, END = "<!-- python-api -->", "<!-- /python-api -->"


def section() -> str:
    text = README.read_text(encoding="utf-8")
    assert text.count(START) == 1 and text.count(END) == 1, f"README.md needs one {START} ... {END} section"
    start, end = text.index(START), text.index(END)
    assert start < end
    return text[start + len(START):end]


def examples() -> list[tuple[int, str]]:
    """(line in README.md, code) of each ```python block in the section."""
    text = README.read_text(encoding="utf-8")
    offset = text.index(START) + len(START)
    out = []
    for m in re.finditer(r"^```python[ \t]*\n(.*?)^```[ \t]*$", section(), re.S | re.M):
        line = text.count("\n", 0, offset + m.start(1)) + 1
        out.append((line, m.group(1)))
    return out


EXAMPLES = examples()


def test_the_section_shows_the_api():
    """The examples cover what the section promises: loading, streaming, completing, chat,
    structured output, tool calls, the context manager."""
    code = "\n".join(c for _, c in EXAMPLES)
    assert len(EXAMPLES) >= 4
    for needle in ("bubo.Model(", ".generate(", ".complete(", ".chat(", ".chat_stream(", "json_schema=",
                   "response_format=", "grammar=", "tools=", "tool_choice=", ".tool_calls", "with bubo.Model(",
                   ".close()"):
        assert needle in code, needle


@pytest.mark.parametrize("line,code", EXAMPLES, ids=[f"README.md:{line}" for line, _ in EXAMPLES])
def test_example_runs(line, code, capsys):
    # padded so that a traceback names the README's own line
    exec(compile("\n" * (line - 1) + code, str(README), "exec"), {"__name__": "__readme__"})
    assert capsys.readouterr().out  # every example shows something
