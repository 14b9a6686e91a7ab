"""`bubo verify-receipt FILE` and `bubo receipt-key FILE` (bubo.receipts)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from bubo import receipts

# set in the process verify-receipt starts again at the receipt's kernel level: it does not start a third
AT_LEVEL = "BUBO_RECEIPT_AT_LEVEL"
EXIT_CANNOT = 2


def verify_receipt(args: argparse.Namespace) -> int:
    """Rerun the receipt at its kernel level (this process starts again with BUBO_FORCE_ISA set
    to it when it runs another) and print the verdict: 0 verified, 1 differs (where first),
    2 cannot be run here (the level, the model file, a malformed receipt)."""
    if args.threads is not None and args.threads < 1:
        print(f"bubo verify-receipt: error: -t {args.threads}: give a positive number of threads", file=sys.stderr)
        return EXIT_CANNOT
    try:
        receipt = receipts.load(args.file)
    except receipts.ReceiptError as e:
        print(f"bubo verify-receipt: error: {e}", file=sys.stderr)
        return EXIT_CANNOT
    level = receipt.get("kernel_level")
    if isinstance(level, str) and level in receipts.levels_here() and not os.environ.get(AT_LEVEL):
        from bubo import _kernels

        if _kernels.best_isa() != level:
            argv = [sys.executable, "-m", "bubo", "verify-receipt", args.file]
            for flag, value in (("-m", args.model), ("--public-key", args.public_key), ("-t", args.threads)):
                if value is not None:
                    argv += [flag, str(value)]
            sys.stdout.flush()
            sys.stderr.flush()
            os.execve(sys.executable, argv, {**os.environ, "BUBO_FORCE_ISA": level, AT_LEVEL: "1"})
    try:
        verdict = receipts.verify(receipt, model=args.model, public_key=args.public_key, n_threads=args.threads)
    except Exception as e:  # noqa: BLE001 - whatever stops the rerun here is "cannot" (exit 2), never "differs"
        verdict = receipts.Verdict("cannot", str(e) or type(e).__name__)
    if verdict.status == "cannot":
        print(f"bubo verify-receipt: error: {verdict.message}", file=sys.stderr)
    else:
        print(verdict.message if verdict.ok else f"differs: {verdict.message}")
    return verdict.exit_code


def receipt_key(args: argparse.Namespace) -> int:
    """A new key pair: FILE (the private key, for serve --sign-key) and FILE.pub (for
    verify-receipt --public-key). An existing file is never replaced."""
    path = Path(args.file)
    for p in (path, path.with_name(path.name + ".pub")):
        if p.exists():
            raise ValueError(f"{p} exists: give another name, or remove it first")
    try:
        private, public = receipts.receipt_key(path)
    except receipts.ReceiptError as e:
        raise ValueError(str(e)) from None
    print(f"private key: {private} (serve --sign-key {private})")
    print(f"public key:  {public} (verify-receipt --public-key {public})")
    return 0
