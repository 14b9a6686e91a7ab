"""Embeddings: texts (or token ids) to one vector each, from an encoder or a decoder.

    vectors = embed_ids(runtime, [[101, 7592, 102], ...], pooling="mean")   # float32 [n, n_embd]

An encoder (bert) runs all the sequences through bubo_model_encode: packed into forward passes of
up to 512 tokens, each attending only to itself. A decoder runs each sequence through a KV cache
of its own with the model's hidden-state output on (the final normed rows: what the output
matrix would multiply). Pooling: "mean" (over the sequence's tokens), "cls" (its first row),
"last" (its last row); by default the file's {arch}.pooling_type, else "cls" for an encoder and
"last" for a decoder. L2-normalised unless normalize is False.

Inputs longer than the model takes (an encoder's context_length, a decoder's n_ctx) are refused
(TooLongError), unless truncate: then they are cut to fit, keeping a trailing [SEP] where the
tokenizer added one, and flagged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from bubo.engine.types import InvalidRequestError

if TYPE_CHECKING:
    from bubo.runtime import Runtime

POOLINGS = ("mean", "cls", "last")


class EncoderOnlyError(InvalidRequestError):
    """Text generation asked of an encoder, which only embeds."""

    def __init__(self, name: str, arch: str, hint: str = ""):
        super().__init__(f"the model {name} is an embedding model ({arch}): it does not generate text; "
                         f"ask it for embeddings{hint}")


class TooLongError(InvalidRequestError):
    """An input has more tokens than the model takes, and truncation is off."""

    def __init__(self, index: int, n_tokens: int, limit: int):
        self.index, self.n_tokens, self.limit = index, n_tokens, limit
        super().__init__(f"input {index} has {n_tokens} tokens, more than this model takes ({limit}); shorten it, "
                         "or ask for truncation")


@dataclass
class Embedded:
    """vectors [n, dim] float32, and per input: its tokens (after truncation) and whether it was cut."""

    vectors: np.ndarray
    n_tokens: list[int] = field(default_factory=list)
    truncated: list[bool] = field(default_factory=list)


def is_encoder(runtime: Runtime) -> bool:
    return not runtime.hparams.get("causal", True)


def default_pooling(runtime: Runtime) -> str:
    own = runtime.hparams.get("pooling")
    if own in POOLINGS:
        return str(own)
    return "cls" if is_encoder(runtime) else "last"


def check_pooling(pooling: str | None) -> None:
    if pooling is not None and pooling not in POOLINGS:
        raise ValueError(f"pooling must be one of {', '.join(POOLINGS)}, not {pooling!r}")


def max_tokens(runtime: Runtime, n_ctx: int | None = None) -> int:
    """The most tokens one input may have: an encoder's trained context, a decoder's n_ctx."""
    if is_encoder(runtime):
        return int(runtime.hparams["n_ctx_train"])
    return int(n_ctx or runtime.hparams["n_ctx_train"])


def tokenize(runtime: Runtime, inputs: Sequence[str | Sequence[int]], limit: int,
             truncate: bool = False) -> tuple[list[list[int]], list[bool]]:
    """Token ids of each input: a text is tokenized with the model's special tokens ([CLS] ...
    [SEP]; special-token texts in it are read as those tokens, as llama-server does), a list of
    ids is taken as it is (checked against the vocabulary). InvalidRequestError for an input
    with no tokens; TooLongError past limit unless truncate."""
    tok = runtime.tokenizer
    sep = tok.special_id("sep")
    out: list[list[int]] = []
    cut: list[bool] = []
    for i, item in enumerate(inputs):
        if isinstance(item, str):
            ids = tok.encode(item, add_special=True, parse_special=True)
        else:
            runtime.check_ids(item, f"input {i}: token id")  # ints only: 7592.9 is no token id
            ids = [int(t) for t in item]
        if not ids:
            raise InvalidRequestError(f"input {i} is empty: it has no tokens to embed")
        was_cut = len(ids) > limit
        if was_cut:
            if not truncate:
                raise TooLongError(i, len(ids), limit)
            if isinstance(item, str) and sep is not None and ids[-1] == sep and limit > 1:
                ids = ids[: limit - 1] + [sep]
            else:
                ids = ids[:limit]
        out.append(ids)
        cut.append(was_cut)
    return out, cut


def pool(hidden: np.ndarray, pooling: str) -> np.ndarray:
    """One vector from a sequence's rows [n, dim]."""
    if pooling == "mean":
        return np.asarray(hidden.mean(axis=0, dtype=np.float64), dtype=np.float32)
    return np.asarray(hidden[0 if pooling == "cls" else -1], dtype=np.float32)


def normalize_rows(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors.astype(np.float64), axis=1, keepdims=True)
    return (vectors / np.where(norms > 0, norms, 1.0)).astype(np.float32)


def embed_ids(runtime: Runtime, seqs: Sequence[Sequence[int]], pooling: str | None = None,
              normalize: bool = True) -> np.ndarray:
    """The pooled (and normalised) vectors [len(seqs), n_embd] of sequences already checked by
    tokenize. An encoder's sequences share forward passes; a decoder's run one by one."""
    check_pooling(pooling)
    how = pooling or default_pooling(runtime)
    dim = int(runtime.hparams["n_embd"])
    if not seqs:
        return np.zeros((0, dim), dtype=np.float32)
    native = runtime.native
    if is_encoder(runtime):
        lens = np.array([len(s) for s in seqs], dtype=np.int32)
        hidden = native.encode(np.concatenate([np.asarray(s, dtype=np.int32) for s in seqs]), lens)
        starts = np.concatenate([[0], np.cumsum(lens)[:-1]])
        vectors = np.stack([pool(hidden[b:b + n], how) for b, n in zip(starts, lens)])
    else:
        vectors = np.stack([_decoder_hidden(runtime, list(s), how) for s in seqs])
    return normalize_rows(vectors) if normalize else vectors


def _decoder_hidden(runtime: Runtime, ids: list[int], pooling: str) -> np.ndarray:
    """A decoder's pooled hidden state of one sequence, through a KV cache of its own."""
    from bubo._model import KVCache

    native = runtime.native
    kv = KVCache(native, len(ids), swa_full=False)
    want = np.ones(len(ids), dtype=bool) if pooling == "mean" else np.zeros(len(ids), dtype=bool)
    if pooling == "cls":
        want[0] = True
    elif pooling == "last":
        want[-1] = True
    native.output_hidden = True
    try:
        rows = native.decode(kv, np.asarray(ids, dtype=np.int32), np.arange(len(ids), dtype=np.int32),
                             np.zeros(len(ids), dtype=np.int32), want)
    finally:
        native.output_hidden = False
    return pool(rows, pooling)
