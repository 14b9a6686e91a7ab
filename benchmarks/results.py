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
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


# AMD's cores by CPU family and model (/proc/cpuinfo), the first match: the architecture a table's
# speed belongs to (a family and model not listed: none named).
AMD_CORES = [(23, range(0x00, 0x30), "Zen"), (23, range(0x30, 0x100), "Zen 2"),
             (25, range(0x10, 0x20), "Zen 4"), (25, range(0x60, 0xB0), "Zen 4"), (25, range(0x00, 0x100), "Zen 3"),
             (26, range(0x00, 0x80), "Zen 5")]


def cpu_label(info: str) -> str:
    """A CPU as a table names it, from /proc/cpuinfo's text: its model name, then (for AMD) its
    core and the best vector level it has (a table run at a lower level says so in its title):
    "AMD EPYC (Zen 5, AVX-512 VNNI)", "AMD EPYC (Zen 3, AVX2)", "Intel(R) Xeon(R) Processor
    (AVX-512 VNNI, AMX)"."""
    fields: dict[str, str] = {}
    for line in info.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), " ".join(value.split()))
    name = fields.get("model name", "unknown CPU")
    flags = set(fields.get("flags", "").split())
    parts = []
    if fields.get("vendor_id") == "AuthenticAMD" and fields.get("cpu family", "").isdigit() \
            and fields.get("model", "").isdigit():
        family, model = int(fields["cpu family"]), int(fields["model"])
        parts += [core for f, models, core in AMD_CORES if f == family and model in models][:1]
    if "avx512_vnni" in flags:
        parts.append("AVX-512 VNNI")
    elif "avx512f" in flags:
        parts.append("AVX-512")
    elif "avx2" in flags:
        parts.append("AVX2")
    if "amx_tile" in flags:
        parts.append("AMX")
    return f"{name} ({', '.join(parts)})" if parts else name


def cpu_name() -> str:
    """This machine's CPU as the tables name it (cpu_label) and its core count."""
    try:
        with open("/proc/cpuinfo") as f:
            info = f.read()
    except OSError:
        return "unknown CPU"
    cores = sum(1 for line in info.splitlines() if line.split(":")[0].strip() == "processor")
    label = cpu_label(info)
    return f"{label}, {cores} CPUs" if cores else label


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
    command = "python " + shlex.join(["benchmarks/" + Path(sys.argv[0]).name, *sys.argv[1:]])
    for table in parse_tables(tee.buf.getvalue()):
        print(f"saved {save(benchmark, table, command=command)}", file=sys.stderr)


def add_save_flag(parser: Any) -> None:
    parser.add_argument("--save", action="store_true",
                        help="also write the tables to benchmarks/results/ (benchmarks/report.py makes "
                             "docs/benchmarks.md from them)")
