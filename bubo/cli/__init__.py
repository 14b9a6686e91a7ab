"""Command line: python -m bubo serve | ray-serve | run | pull | list | show | rm | ps | convert | bench |
verify-receipt | receipt-key.

Flags follow llama.cpp's names (-m/--model, -p/--prompt, -n/--n-predict, -c/--ctx-size,
-t/--threads, ...). Every flag can also come from an environment variable BUBO_ARG_<LONG NAME>
(BUBO_ARG_MODEL, BUBO_ARG_CTX_SIZE, ...); a flag on the command line wins over its variable.
Errors are one line on stderr and a non-zero exit (BUBO_DEBUG=1 shows the traceback).

One module per command: serve (and ray_serve), run (and its chat, chat.py), store (pull, list,
rm, convert), show, ps, bench, receipts (verify-receipt, receipt-key); flags.py is the parser.
This package is the top layer: nothing under bubo/ imports it."""

from __future__ import annotations

import importlib
import os
import sys

from bubo.cli.flags import EXIT_ERROR, EXIT_INTERRUPTED, build_parser

# command -> (module, function): imported when the command runs
COMMANDS = {"serve": ("serve", "serve"), "ray-serve": ("ray_serve", "ray_serve"), "run": ("run", "run"),
            "pull": ("store", "pull"), "list": ("store", "list_models"), "rm": ("store", "rm"),
            "convert": ("store", "convert"), "convert-lora": ("store", "convert_lora"), "show": ("show", "show"),
            "ps": ("ps", "ps"),
            "bench": ("bench", "bench_command"), "verify-receipt": ("receipts", "verify_receipt"),
            "receipt-key": ("receipts", "receipt_key")}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        parser.print_help()
        return 0
    if argv[0] == "ray-serve":
        # ray-serve's own flags, and `bubo serve`'s for the replicas (checked here, before a cluster starts)
        args, serve_argv = parser.parse_known_args(argv)
        args.serve_args = parser.parse_args(["serve", *serve_argv])
        args.serve_argv = serve_argv
    else:
        args = parser.parse_args(argv)
    try:
        module, name = COMMANDS[args.command]
        command = getattr(importlib.import_module(f"bubo.cli.{module}"), name)
        return int(command(args))
    except KeyboardInterrupt:
        print("\nbubo: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # `bubo run ... | head`: the reader left; say nothing
        sys.stderr.close()
        return EXIT_ERROR
    except Exception as e:
        if os.environ.get("BUBO_DEBUG"):
            raise
        msg = str(e) or type(e).__name__
        print(f"bubo {args.command}: error: {msg}", file=sys.stderr)
        return EXIT_ERROR

