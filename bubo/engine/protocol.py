"""What the api layer needs of an engine (bubo.engine.Engine is the one implementation; tests and
other hosts may bring their own)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

from bubo.engine.types import EngineMetrics, Event, GenerationRequest, SlotState

if TYPE_CHECKING:
    import numpy as np

    from bubo.engine.engine import CacheView, Checked, ModelInfo
    from bubo.runtime import Runtime


class Stream(Protocol):
    """A request's events, read in the greenlet that submitted it."""

    def __iter__(self) -> Iterator[Event]: ...

    def __next__(self) -> Event: ...

    def cancel(self) -> None: ...

    def end(self) -> None:
        """End the answer at the engine's next step, with its final event (a "stop")."""
        ...

    @property
    def cancelled(self) -> bool: ...


class EmbedResult(Protocol):
    """An embeddings job, waited for in the greenlet that queued it."""

    def result(self) -> np.ndarray: ...


class ServingEngine(Protocol):
    """One model's engine, as the HTTP routes use it."""

    model_name: str
    model_path: str | None
    n_ctx: int | None
    n_ctx_train: int | None
    n_threads: int
    n_parallel: int | None
    n_batch: int
    n_ubatch: int
    cache_type_k: str
    cache_type_v: str
    queue_size: int | None
    runtime: Runtime | None
    ready: bool
    load_error: str | None

    @property
    def info(self) -> ModelInfo | None: ...

    def check(self, req: GenerationRequest, *, mem_available: int | None = None) -> Checked:
        """What submit would refuse req for, and its costly state built, from any thread (the
        server calls it in its preparation pool); pass the result to submit(checked=...)."""
        ...

    def submit(self, req: GenerationRequest, *, mem_available: int | None = None,
               checked: Checked | None = None) -> Stream: ...

    def embed(self, seqs: list[list[int]], pooling: str | None = None, normalize: bool = True) -> EmbedResult:
        """An encoder's embeddings of checked token id lists (bubo.embed.tokenize)."""
        ...

    def metrics(self) -> EngineMetrics: ...

    def slots(self) -> list[SlotState]: ...

    def cache_view(self) -> CacheView: ...
