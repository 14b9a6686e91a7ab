"""Fill-in-the-middle prompts: code before and after a gap, and the model writes the gap.

Models trained for it (Qwen2.5-Coder, StarCoder, CodeLlama, DeepSeek-Coder, ...) have control
tokens that mark the prefix, the suffix and where the middle starts. GGUF files often do not
name them in metadata, so they are found by their text, as llama.cpp's vocabulary loader does.
The prompt is prefix-suffix-middle order (PSM), the order these models were trained on:

    [BOS] [repo and files] <fim_prefix> PREFIX <fim_suffix> SUFFIX <fim_middle> [PROMPT]

llama-server's /infill writes repository context before the prefix (the repository's name,
each `input_extra` file after a file-separator token, then the current file's marker), when
the model has those tokens; Ollama's `suffix` sends the plain prompt. The request's text is
tokenized as plain text: control-token text inside code stays text."""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bubo.errors import RequestError
from bubo.runtime import Runtime

# the texts each role's token has in the vocabularies llama.cpp knows
PREFIX_TEXTS = ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<PRE>", "\u2581<PRE>")
SUFFIX_TEXTS = ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<SUF>", "\u2581<SUF>")
MIDDLE_TEXTS = ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<MID>", "\u2581<MID>")
_REPO = ("<|repo_name|>", "<repo_name>", "<reponame>")
_FILE_SEP = ("<|file_sep|>", "<file_sep>", "<filename>")
# /infill's repository context, as llama-server writes it
REPO_NAME = "myproject\n"
CURRENT_FILE = "filename\n"
SNIPPET = "\n\n--- snippet ---\n\n"  # between extra files, for a model without a file separator
# the metadata keys of newer GGUF files, which win over the texts
_KEYS = {"prefix": "tokenizer.ggml.fim_pre_token_id", "suffix": "tokenizer.ggml.fim_suf_token_id",
         "middle": "tokenizer.ggml.fim_mid_token_id", "repo": "tokenizer.ggml.fim_rep_token_id",
         "file_sep": "tokenizer.ggml.fim_sep_token_id"}


@dataclass(frozen=True)
class FimTokens:
    prefix: int
    suffix: int
    middle: int
    repo: int | None = None
    file_sep: int | None = None


_found: weakref.WeakKeyDictionary[Runtime, FimTokens | None] = weakref.WeakKeyDictionary()


def _one_token(rt: Runtime, texts: Sequence[str]) -> int | None:
    """The id of the control token whose text is one of texts, if the vocabulary has one."""
    for text in texts:
        ids = rt.tokenizer.encode(text, add_special=False, parse_special=True)
        if len(ids) == 1 and rt.token_piece(ids[0]) == text.encode():
            plain = rt.tokenizer.encode(text, add_special=False, parse_special=False)
            if plain != ids:  # a control token, not ordinary text that happens to be one token
                return ids[0]
    return None


def fim_tokens(rt: Runtime) -> FimTokens | None:
    """The model's fill-in-the-middle tokens; None when it has none (it cannot fill in)."""
    if rt in _found:
        return _found[rt]
    meta = getattr(rt, "metadata", None) or {}
    found: dict[str, int | None] = {}
    for role, texts in (("prefix", PREFIX_TEXTS), ("suffix", SUFFIX_TEXTS), ("middle", MIDDLE_TEXTS), ("repo", _REPO),
                        ("file_sep", _FILE_SEP)):
        given = meta.get(_KEYS[role]) if isinstance(meta, dict) else None
        found[role] = int(given) if isinstance(given, int) and 0 <= given < rt.n_vocab else _one_token(rt, texts)
    pre, suf, mid = found["prefix"], found["suffix"], found["middle"]
    out = None
    if pre is not None and suf is not None and mid is not None:
        out = FimTokens(pre, suf, mid, found["repo"], found["file_sep"])
    _found[rt] = out
    return out


def vocab_has_fim(meta: Mapping[str, Any], tokens: Sequence[str]) -> bool:
    """Whether a model file can fill in the middle, from its metadata alone (no model loaded):
    the metadata's FIM token ids, else each role's text among the vocabulary's tokens."""
    have = None
    for role, texts in (("prefix", PREFIX_TEXTS), ("suffix", SUFFIX_TEXTS), ("middle", MIDDLE_TEXTS)):
        if isinstance(meta.get(_KEYS[role]), int):
            continue
        have = set(tokens) if have is None else have
        if not any(t in have for t in texts):
            return False
    return True


def no_fim(name: str) -> str:
    """What a model without fill-in-the-middle tokens cannot do."""
    return (f"the model {name} has no fill-in-the-middle tokens (<|fim_prefix|>, <|fim_suffix|>, <|fim_middle|> "
            "or the like): it cannot fill in code between a prefix and a suffix")


def fim_prompt(rt: Runtime, prefix: str, suffix: str, *, files: Sequence[tuple[str, str]] | None = None,
               middle: str = "", name: str = "model") -> list[int]:
    """The token ids of a fill-in-the-middle prompt (see the module's docstring). files None: the
    plain prompt (Ollama's `suffix`); a list, even empty: repository context laid out as
    llama-server's /infill lays it out, each (file name, text) of `input_extra` after the
    repository name and the current file's marker last. A model without the tokens is a
    RequestError naming it."""
    fim = fim_tokens(rt)
    if fim is None:
        raise RequestError("invalid_value", no_fim(name))

    def text(s: str) -> list[int]:
        try:
            return rt.tokenizer.encode(s, add_special=False, parse_special=False) if s else []
        except UnicodeEncodeError as e:
            raise RequestError("invalid_value", f"the text holds {e.object[e.start:e.end]!r}, a lone UTF-16 "
                                                "surrogate that is not valid Unicode text") from None

    ids = rt.tokenizer.encode("", add_special=True, parse_special=False)  # BOS, if the model wants one
    if files is not None:
        if fim.repo is not None:
            ids += [fim.repo] + text(REPO_NAME)
        for fname, body in files:
            ids += [fim.file_sep] + text((fname or "tmp") + "\n") if fim.file_sep is not None else text(SNIPPET)
            ids += text(body)
        if fim.file_sep is not None:
            ids += [fim.file_sep] + text(CURRENT_FILE)
    ids += [fim.prefix] + text(prefix) + [fim.suffix] + text(suffix) + [fim.middle] + text(middle)
    return ids
