"""The native sampler chain (llama.cpp's order). Defaults and validation: bubo.sampling."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

NATIVE_FIELDS: frozenset[str]
N_DRAWS: int

class Sampler:
    """One sequence's sampler; params has exactly the keys in NATIVE_FIELDS."""

    def __init__(self, n_vocab: int, params: dict[str, Any], vocab_pieces: Sequence[bytes] | None = None) -> None: ...
    @property
    def n_vocab(self) -> int: ...
    @property
    def n_probs(self) -> int: ...
    @property
    def seed(self) -> int: ...
    @property
    def mirostat_mu(self) -> float: ...
    def sample(
        self,
        logits: npt.ArrayLike,
        mask: npt.NDArray[np.bool_] | npt.NDArray[np.uint8] | Iterable[int] | None = None,
        draws: Sequence[float] | None = None,
    ) -> tuple[int, float, list[tuple[int, float]]]: ...
    def accept(self, token: int) -> None: ...
    def reset(self) -> None: ...
    def candidates(self) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.float32]]: ...
