"""`bubo run`: one answer, or an interactive chat (bubo/cli/chat.py), as `ollama run`."""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from bubo import sampling, store
from bubo.cli.chat import Session, check_option
from bubo.cli.flags import EXIT_INTERRUPTED, EXIT_USAGE, check_cache_flags, given_as
from bubo.gguf import GGUFFile
from bubo.llm import Model

# the flags that set the session's options (bubo.cli.chat.OPTIONS, Ollama's names): (dest, flag,
# option): every sampling field's flag, under the field's name, and -n as num_predict
_RUN_OPTIONS = [(f.name, f.metadata["flag"], f.name) for f in sampling.flagged()] + [
    ("n_predict", "--n-predict", "num_predict")]


def run(args: argparse.Namespace) -> int:
    """One answer (a prompt given, or piped to stdin), or an interactive chat (bubo/cli/chat.py)."""
    typed = getattr(args, "typed_flags", None) or {}
    words = list(args.prompt_args)
    if "model" in typed:  # -m: every positional word is the prompt
        model_name = args.model
        words = [args.model_arg, *words] if args.model_arg is not None else words
    else:
        model_name = args.model_arg if args.model_arg is not None else args.model
    if not model_name:
        print(f"bubo run: error: no model: give one, as in `bubo run {store.DEFAULT_MODEL} [PROMPT]` (or -m MODEL)",
              file=sys.stderr)
        return EXIT_USAGE
    options: dict[str, Any] = {}
    for dest, long, name in _RUN_OPTIONS:
        value = getattr(args, dest)
        if value is None or (dest == "n_predict" and value == -1):
            continue
        try:
            check_option(name, value)
        except ValueError as e:
            raise ValueError(f"{given_as(args, dest, long, value)}: {e}") from None
        options[name] = value
    if args.ctx_size < 0:
        raise ValueError(f"{given_as(args, 'ctx_size', '--ctx-size', args.ctx_size)}: give 0 (the trained "
                         "context) or a positive number of tokens")
    if args.threads is not None and args.threads <= 0:
        raise ValueError(f"{given_as(args, 'threads', '--threads', args.threads)}: give a positive number of "
                         "threads (leave the flag out for every CPU)")
    check_cache_flags(args)
    if args.raw and args.chat:
        raise ValueError("--raw and --chat: give one (chat is the default when the model has a chat template)")
    if words and "prompt" in typed:
        raise ValueError(f"{typed['prompt']}: give the prompt once, as PROMPT or with {typed['prompt']}")

    path = store.resolve(model_name)  # a catalog model not stored yet is pulled here
    name = (None if os.path.isfile(model_name) else store.catalog_name(model_name)) or model_name
    n_ctx = args.ctx_size or _trained_context(path, given_as(args, "ctx_size", "--ctx-size", 0))
    prompt = _run_prompt(args, words)
    t0 = time.perf_counter()
    model = Model(name, n_ctx=n_ctx, n_threads=args.threads, cache_type_k=args.cache_type_k or "f16",
                  cache_type_v=args.cache_type_v or "f16")
    load_s = time.perf_counter() - t0
    has_template = model.runtime.chat_template_source is not None
    chat = has_template and not args.raw
    if args.system and not chat:
        why = ("--raw leaves the chat template out" if has_template
               else f"{name} has no chat template (a base model)")
        raise ValueError(f"--system: a system message needs the chat template, and {why}; put the text in the "
                         "prompt")
    session = Session(model, name, chat=chat, system=args.system or None, options=options, verbose=args.verbose,
                      load_s=load_s)
    if prompt is None:
        return session.repl()
    return 0 if session.answer(prompt) else EXIT_INTERRUPTED


def _trained_context(path: Any, given: str) -> int:
    with GGUFFile(path) as f:
        md = f.metadata
    n = md.get(f"{md.get('general.architecture')}.context_length")
    if not isinstance(n, int) or n <= 0:
        raise ValueError(f"{given}: {path} does not record the context it was trained with: give a size (-c 4096)")
    return n


def _run_prompt(args: argparse.Namespace, words: list[str]) -> str | None:
    """The prompt to answer, or None for an interactive chat. Text piped to stdin is read as the
    prompt; with a PROMPT too, the stdin text comes first, then a blank line, then PROMPT (Ollama
    puts stdin first as well). `-p -` reads the prompt from stdin, a terminal's too."""
    prompt: str | None = " ".join(words) if words else args.prompt
    if prompt == "-" and not words:
        text = sys.stdin.read()
        if not text.strip():
            raise ValueError(f"{given_as(args, 'prompt', '--prompt', '-')}: stdin gave no text")
        return text.rstrip("\n")
    if not sys.stdin.isatty():
        text = sys.stdin.read().rstrip("\n")
        if text:
            prompt = text if prompt is None else f"{text}\n\n{prompt}"
        elif prompt is None:
            raise ValueError("no prompt: stdin is not a terminal and gave no text; give PROMPT (or -p)")
    if prompt is not None and not prompt.strip():
        raise ValueError("the prompt is empty")
    return prompt
