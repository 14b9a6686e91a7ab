"""Command line: python -m bubo serve | run | pull | list | bench."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bubo", description="local LLM inference server")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("serve", help="start the HTTP server (not implemented yet)")
    pull = sub.add_parser("pull", help="download a catalog model into the cache")
    pull.add_argument("name")
    sub.add_parser("list", help="list catalog models and whether they are cached")
    args = parser.parse_args(argv)
    if args.command == "pull":
        from bubo import store

        print(store.pull(args.name))
        return 0
    if args.command == "list":
        from bubo import store

        for name, path in store.list_models():
            print(f"{name:24s} {path or '(not downloaded)'}")
        return 0
    print(f"bubo {args.command}: not implemented yet", file=sys.stderr)
    return 2
