"""`bubo serve`: its flags as ServeOptions, then bubo.api.serve.serve."""

from __future__ import annotations

import argparse
import dataclasses
import os

from bubo import sampling
from bubo.api.options import ServeOptions
from bubo.api.serve import serve as run_server
from bubo.cli.flags import csv

# flags given as comma-separated text, lists in ServeOptions
LIST_FLAGS = ("alias", "api_key", "cors_origins", "host_allow")


def options(args: argparse.Namespace) -> ServeOptions:
    """The serve flags as ServeOptions: comma-separated flags split, every -m listed (a model in
    BUBO_ARG_MODEL counts as one -m), the llama-server flags taken by habit as notes."""
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(ServeOptions) if hasattr(args, f.name)}
    for name in LIST_FLAGS:
        given[name] = csv(given.get(name))
    models = list(getattr(args, "models", None) or [])
    if not models and os.environ.get("BUBO_ARG_MODEL"):
        models = [args.model]
    given["models"] = models
    given["notes"] = list(getattr(args, "habit_notes", None) or [])
    given["sampling"] = {f.name: getattr(args, f.name) for f in sampling.flagged()
                         if getattr(args, f.name, None) is not None}
    return ServeOptions(**given)


def serve(args: argparse.Namespace) -> int:
    return run_server(options(args))
