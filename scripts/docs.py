#!/usr/bin/env python3
"""Write the parts of the docs that are derived from the code, or check them (--check):

    docs/sampling.md   the table of sampling fields, from bubo.sampling.SamplingParams'
                       declarations (type, bounds, default, doc, flag)

    python scripts/docs.py            # rewrite them
    python scripts/docs.py --check    # exit 1 (and say which) if one is stale
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SAMPLING_DOC = ROOT / "docs" / "sampling.md"
START, END = "<!-- sampling-table -->", "<!-- /sampling-table -->"


def _bound(v: float | None, kind: str) -> str:
    if v is None:
        return "-inf" if kind == "lo" else "inf"
    if v == 2**64 - 1:
        return "2^64 - 1"
    if v == 2**31 - 1:
        return "2^31 - 1"
    if v == -(2**31 - 1):
        return "-(2^31 - 1)"
    return f"{v:g}"


def sampling_table() -> str:
    from bubo.sampling import SamplingParams

    rows = ["| field | flag | default | range | what it does |", "| --- | --- | --- | --- | --- |"]
    for f in dataclasses.fields(SamplingParams):
        meta = f.metadata
        flag = ", ".join(f"`{x}`" for x in (meta["short"], meta["flag"]) if x) or "-"
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        span = "-"
        if f.type in ("int", "float"):
            lo = "> 0" if meta["positive"] else _bound(meta["lo"], "lo")
            span = f"{lo} .. {_bound(meta['hi'], 'hi')}"
        shown = f"{default:g}" if isinstance(default, float) else repr(default)
        rows.append(f"| `{f.name}` | {flag} | `{shown}` | {span} | {meta['doc']} |")
    return "\n".join(rows) + "\n"


def _replace(text: str, block: str) -> str:
    a, b = text.index(START) + len(START), text.index(END)
    return text[:a] + "\n" + block + text[b:]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true", help="say which files are stale instead of writing them")
    args = p.parse_args(argv)
    text = SAMPLING_DOC.read_text(encoding="utf-8")
    new = _replace(text, sampling_table())
    if args.check:
        if new != text:
            print(f"{SAMPLING_DOC.relative_to(ROOT)} is stale: run python scripts/docs.py", file=sys.stderr)
            return 1
        return 0
    if new != text:
        tmp = SAMPLING_DOC.with_suffix(".md.tmp")
        tmp.write_text(new, encoding="utf-8")
        tmp.replace(SAMPLING_DOC)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
