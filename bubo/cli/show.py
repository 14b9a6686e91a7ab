"""`bubo show`: a model's card (architecture, parameters, template, license), as `ollama show`."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from bubo import store
from bubo.cli.chat import ModelCard, parameters_text


def show(args: argparse.Namespace) -> int:
    given = args.name
    store.stored_models()  # adopts models stored at the legacy location
    if Path(given).is_file():
        path, name = Path(given), given
    elif (canonical := store.catalog_name(given)) is not None:
        if not store.is_stored(canonical):
            raise FileNotFoundError(f"{canonical} is not stored; get it with `bubo pull {canonical}`")
        path, name = store.model_path(canonical), canonical
    elif given.endswith(".gguf") and os.sep not in given and (store.models_dir() / given).is_file():
        path, name = store.models_dir() / given, given
    else:
        path, name = store.resolve(given), given  # raises: no such file, or not a catalog name
    card = ModelCard.read(path, name)
    if args.template:
        if card.template is None:
            raise ValueError(f"{name} has no chat template (a base model)")
        print(card.template)
    elif args.license:
        if card.license is None:
            raise ValueError(f"{name}'s file names no license")
        print(card.license)
    elif args.parameters:
        print(parameters_text({}, header=False))
    else:
        print(card.full())
    return 0
