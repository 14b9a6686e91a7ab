"""The benchmarks' result files: each script given --save writes the tables it printed to
benchmarks/results/<benchmark>/<cpu>--<table>.json (the newest run of a table on a CPU replaces
the one before; git keeps the history), and benchmarks/report.py writes docs/benchmarks.md from
them, as llama.cpp's compare-llama-bench writes its tables from saved runs.

    with results.saving("bench_llamacpp", args.save):
        ... print the tables as usual ...
"""

from __future__ import annotations

import contextlib
import datetime
import io
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def cpu_name() -> str:
    """This machine's CPU as /proc/cpuinfo names it (and its core count)."""
    name = "unknown CPU"
    cores = 0
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and name == "unknown CPU":
                    name = " ".join(value.split())
                if key.strip() == "processor":
                    cores += 1
    except OSError:
        pass
    return f"{name}, {cores} CPUs" if cores else name


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:80] or "table"


def parse_tables(text: str) -> list[dict[str, Any]]:
    """Every markdown table in text: {"title", "columns", "rows"}, the title the nearest heading
    (# ... or **...**) above it."""
    out: list[dict[str, Any]] = []
    title = ""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        if line.startswith("#") or (line.startswith("**") and line.endswith("**")):
            title = line.strip("#* ").strip()
        if line.startswith("|") and i + 1 < len(lines) and re.match(r"^\|[\s:|-]+\|$", lines[i + 1].strip()):
            columns = [c.strip() for c in line.strip("|").split("|")]
            rows = []
            i += 2
            while i < len(lines) and lines[i].strip().startswith("|"):
                rows.append([c.strip() for c in lines[i].strip().strip("|").split("|")])
                i += 1
            out.append({"title": title, "columns": columns, "rows": rows})
            continue
        i += 1
    return out


def save(benchmark: str, table: dict[str, Any], *, command: str, cpu: str | None = None,
         date: str | None = None) -> Path:
    """One table's result file (written to a temporary name, then renamed)."""
    cpu = cpu or cpu_name()
    record = {"benchmark": benchmark, "title": table["title"], "cpu": cpu, "command": command,
              "date": date or datetime.date.today().isoformat(), "columns": table["columns"], "rows": table["rows"]}
    folder = RESULTS / benchmark
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{slug(cpu)}--{slug(table['title'] or benchmark)}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path


class _Tee(io.TextIOBase):
    def __init__(self, out: Any):
        self.out = out
        self.buf = io.StringIO()

    def write(self, s: str) -> int:
        self.buf.write(s)
        return int(self.out.write(s))

    def flush(self) -> None:
        self.out.flush()


@contextlib.contextmanager
def saving(benchmark: str, enabled: bool) -> Iterator[None]:
    """With enabled, every table the block prints is saved when it ends without an error."""
    if not enabled:
        yield
        return
    tee = _Tee(sys.stdout)
    old, sys.stdout = sys.stdout, tee  # type: ignore[assignment]
    try:
        yield
    finally:
        sys.stdout = old
    command = "python " + " ".join(["benchmarks/" + Path(sys.argv[0]).name, *sys.argv[1:]])
    for table in parse_tables(tee.buf.getvalue()):
        print(f"saved {save(benchmark, table, command=command)}", file=sys.stderr)


def add_save_flag(parser: Any) -> None:
    parser.add_argument("--save", action="store_true",
                        help="also write the tables to benchmarks/results/ (benchmarks/report.py makes "
                             "docs/benchmarks.md from them)")
