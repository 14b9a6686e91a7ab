"""GBNF grammars (llama.cpp's syntax) with token-level masks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

MAX_REPEAT: int
MAX_NESTING: int
MAX_STACKS: int
MAX_DEPTH: int

class Grammar:
    """A parsed GBNF grammar; a syntax error raises ValueError naming line and column."""

    root: str
    text: str  # the GBNF source
    def __init__(self, text: str | bytes, root: str = "root") -> None: ...
    @property
    def n_rules(self) -> int: ...

class Vocab:
    """The byte trie of a vocabulary (pieces[i]: token i's bytes; b"" is never allowed)."""

    def __init__(self, pieces: Sequence[bytes]) -> None: ...
    @staticmethod
    def from_tokenizer(tokenizer: Any) -> Vocab: ...
    def __len__(self) -> int: ...
    @property
    def n_nodes(self) -> int: ...

class Matcher:
    """One text's state against a grammar; vocab is needed for accept_token() and mask()."""

    grammar: Grammar
    vocab: Vocab | None
    def __init__(self, grammar: Grammar, vocab: Vocab | None = None) -> None: ...
    def clone(self) -> Matcher: ...
    def accept_bytes(self, data: bytes | bytearray | memoryview) -> bool: ...
    def accept_token(self, token: int) -> bool: ...
    def mask(self, out: npt.NDArray[np.uint8] | None = None) -> npt.NDArray[np.uint8]: ...
    @property
    def accepting(self) -> bool: ...
    @property
    def n_stacks(self) -> int: ...
    def shortest(self) -> bytes | None: ...
    @property
    def shortest_len(self) -> int | None: ...
