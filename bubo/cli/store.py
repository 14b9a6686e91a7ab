"""`bubo pull | list | rm | convert`: the model store (bubo/store.py) from the command line."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from bubo import store
from bubo.cli.flags import EXIT_ERROR
from bubo.gguf import GGUFFile


def pull(args: argparse.Namespace) -> int:
    print(store.pull(args.name, force=args.force))
    return 0


def convert(args: argparse.Namespace) -> int:
    from bubo.convert import convert_file

    print(convert_file(Path(args.src), Path(args.out), out_type=args.out_type))
    return 0


def convert_lora(args: argparse.Namespace) -> int:
    from bubo.convert import convert_lora_file

    print(convert_lora_file(Path(args.src), Path(args.out), store.resolve(args.base), out_type=args.out_type))
    return 0


def list_models(args: argparse.Namespace) -> int:
    rows = [("NAME", "SIZE", "ARCH", "QUANT", "CONTEXT", "PATH")]
    for m in store.stored_models():
        arch, quant, ctx = describe(m.path)
        rows.append((m.name, f"{m.size / 1e6:.0f} MB", arch, quant, ctx, str(m.path)))
    for a in store.stored_adapters():  # served as base+name beside the model they record as their base
        rows.append((a.name, f"{a.path.stat().st_size / 1e6:.0f} MB", f"LoRA of {a.base_name or '?'}", "-", "-",
                     str(a.path)))
    if len(rows) == 1:
        print(f"no models stored in {store.models_dir()}; get one with `bubo pull {store.DEFAULT_MODEL}`",
              file=sys.stderr)
        return 0
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1])
    return 0


def describe(path: Any) -> tuple[str, str, str]:
    """(architecture, quantization, context length) from the GGUF metadata; '?' for what cannot
    be read (list shows a broken file rather than failing)."""
    try:
        with GGUFFile(path) as f:
            md = f.metadata
    except Exception:  # noqa: BLE001 - list shows a broken file rather than failing
        return "?", "?", "?"
    arch = str(md.get("general.architecture", "?"))
    ft = md.get("general.file_type")
    quant = store.FILE_TYPE_NAMES.get(ft, f"type {ft}") if isinstance(ft, int) else "?"
    ctx = md.get(f"{arch}.context_length")
    return arch, quant, str(ctx) if ctx is not None else "?"




def rm(args: argparse.Namespace) -> int:
    status = 0
    for name in args.names:
        try:
            removed = store.remove(name)
        except store.UnknownModelError as e:
            print(f"bubo rm: error: {e}", file=sys.stderr)
            status = EXIT_ERROR
            continue
        print(f"deleted '{removed.name}'")
    return status
