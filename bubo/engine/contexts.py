"""Contexts: KV sequences a model keeps between requests (POST /v1/contexts), named by id.

The KV cache has more sequences than slots: a slot's are 0..n_slots-1, the contexts' the ones
after. A context is made by a request that reads its prompt in a slot and forks the slot's
sequence into the context's when it ends (GenerationRequest.keep); a request that starts from
a context forks the context's sequence into its slot (GenerationRequest.context), so both hold
the same blocks and only what either writes past them is new (kv.c copies a shared, partly
filled last block when it is written). Forking a context is the same fork into another context's
sequence: no block is copied. A context can be written to a file and its memory freed (spilled),
and read back.

Everything here runs on the engine's thread (the scheduler calls it at admission and at a
request's end; the server through Engine.call)."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

from bubo._model import KVCache

MAX_CONTEXTS = 64  # per model: each is one more sequence of the KV cache (a block table, no memory)


class ContextError(ValueError):
    """A context operation that cannot be done: unknown id (missing), in use by a request that
    writes it (busy), or none left (full)."""

    def __init__(self, message: str, *, missing: bool = False, busy: bool = False):
        super().__init__(message)
        self.missing, self.busy = missing, busy


@dataclass
class Context:
    id: str
    seq: int
    created: int
    parent: str | None = None
    tokens: list[int] = field(default_factory=list)
    writer: bool = False  # a request is making it, or moving it forward (save): not to be read or forked
    spilled: str | None = None  # the file it was written to; its memory is free until read back
    owner: str | None = None  # the caller that made it (the server's named keys; None: the unnamed caller)
    ns: int = 0  # the prefix-cache namespace its rows were computed in (Scheduler.namespace: caller and adapters)


class Contexts:
    def __init__(self, kv: KVCache, first_seq: int):
        self.kv = kv
        self.by_id: dict[str, Context] = {}
        self._free = list(range(kv.n_seq_max - 1, first_seq - 1, -1))  # a stack: the lowest first
        self.capacity = len(self._free)
        # contexts discarded while a request was writing them: their sequence is freed when it ends
        self._dying: dict[int, Context] = {}

    def get(self, id: str) -> Context:
        ctx = self.by_id.get(id)
        if ctx is None:
            raise _missing(id)
        return ctx

    def owned(self, id: str, owner: str | None) -> Context:
        """The context, if owner made it; another's is missing to owner, as one never made."""
        ctx = self.get(id)
        if ctx.owner != owner:
            raise _missing(id)
        return ctx

    def new(self, parent: str | None = None, owner: str | None = None) -> Context:
        if not self._free:
            raise ContextError(f"this model holds {self.capacity} contexts already: delete one first")
        ctx = Context("ctx_" + uuid.uuid4().hex[:24], self._free.pop(), int(time.time()), parent, owner=owner)
        self.by_id[ctx.id] = ctx
        return ctx

    def readable(self, id: str) -> Context:
        """The context, in memory and not being written (to start from, fork or snapshot)."""
        ctx = self.get(id)
        if ctx.writer:
            raise ContextError(f"context {id} is in use by a request that writes it: try again when it ends",
                               busy=True)
        if ctx.spilled is not None:
            raise ContextError(f"context {id} is spilled to disk: read it back first", missing=False)
        return ctx

    def claim(self, id: str) -> Context:
        """Mark the context as being written (a request with save); busy if it already is."""
        ctx = self.readable(id)
        ctx.writer = True
        return ctx

    def release(self, id: str) -> None:
        ctx = self.by_id.get(id)
        if ctx is not None:
            ctx.writer = False

    def fork(self, id: str, n: int) -> tuple[list[Context], float]:
        """n children sharing the context's blocks; (them, the seconds the forks took)."""
        parent = self.readable(id)
        if n > len(self._free):
            raise ContextError(f"{n} forks: this model has room for {len(self._free)} more contexts "
                               f"(at most {self.capacity})")
        t0 = time.perf_counter()
        out = []
        for _ in range(n):
            child = self.new(parent.id, parent.owner)
            self.kv.fork(parent.seq, child.seq)
            child.ns = parent.ns
            child.tokens = list(parent.tokens)
            out.append(child)
        return out, time.perf_counter() - t0

    def delete(self, id: str) -> Context:
        ctx = self.get(id)
        if ctx.writer:
            raise ContextError(f"context {id} is in use by a request that writes it", busy=True)
        self.kv.free(ctx.seq)
        del self.by_id[id]
        self._free.append(ctx.seq)
        return ctx

    def discard(self, id: str) -> None:
        """Forget a context whose making failed. While its request may still run (writer), its
        sequence is freed only once that request ends (ended()), so that no new context gets it
        meanwhile."""
        ctx = self.by_id.pop(id, None)
        if ctx is None:
            return
        if ctx.writer:
            self._dying[ctx.seq] = ctx
        else:
            self.kv.free(ctx.seq)
            self._free.append(ctx.seq)

    def ended(self, seq: int) -> None:
        """The request writing seq's context is over (the scheduler's word, however it ended)."""
        dying = self._dying.pop(seq, None)
        if dying is not None:
            self.kv.free(seq)
            self._free.append(seq)
            return
        ctx = self.by_seq(seq)
        if ctx is not None:
            ctx.writer = False

    def kept(self, seq: int, tokens: list[int], slot_seq: int, ns: int = 0) -> None:
        """A request's end with keep: the context's sequence becomes the slot's (shared blocks,
        and the slot's namespace ns)."""
        ctx = self.by_seq(seq)
        if ctx is None:  # deleted meanwhile: nothing to keep
            return
        self.kv.fork(slot_seq, seq)
        ctx.ns = ns
        if self.kv.seq_len(seq) > len(tokens):  # rows of a draft the answer refused, not yet dropped
            self.kv.truncate(seq, len(tokens))
        ctx.tokens = list(tokens)
        ctx.spilled = None

    def by_seq(self, seq: int) -> Context | None:
        return next((c for c in self.by_id.values() if c.seq == seq), None)

    def export(self, id: str, claim: bool = False) -> tuple[list[int], bytes]:
        """(tokens, rows); claim: the context stays claimed (a snapshot, until spill or release)."""
        ctx = self.claim(id) if claim else self.readable(id)
        rows = self.kv.export_rows(ctx.seq, len(ctx.tokens)) if ctx.tokens else b""
        return list(ctx.tokens), rows

    def spill(self, id: str, path: str) -> None:
        """The claimed context's memory freed: it lives in the file at path now."""
        ctx = self.get(id)
        self.kv.free(ctx.seq)
        ctx.spilled, ctx.writer = path, False

    def unspill(self, id: str, tokens: list[int], rows: bytes) -> Context:
        ctx = self.get(id)
        if ctx.spilled is None:
            return ctx
        self.kv.prefix_namespace(ctx.seq, ctx.ns)  # its rows' namespace, whatever the sequence held before
        if tokens:
            self.kv.import_rows(ctx.seq, len(tokens), rows)
        ctx.tokens, ctx.spilled = list(tokens), None
        return ctx

    def listed(self, owner: str | None = None) -> list[Context]:
        """owner's contexts, oldest first."""
        return sorted((c for c in self.by_id.values() if c.owner == owner), key=lambda c: (c.created, c.id))


def _missing(id: str) -> ContextError:
    return ContextError(f"no context {id!r} on this model (deleted, or never made here)", missing=True)
