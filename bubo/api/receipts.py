"""The generating routes' "receipt": true (bubo.receipts): the request gets a seed when it has
none, its engine request and the events of its answer are recorded where it is submitted
(pipeline.submit), and the route puts the receipt in its response (in a stream: its last chunk),
signed when the server has a key (--sign-key)."""

from __future__ import annotations

import dataclasses
import logging
import secrets
from collections.abc import Mapping
from typing import Any

from flask import current_app, has_request_context, request

import bubo
from bubo import receipts
from bubo.api import offload
from bubo.api.fields import bool_field
from bubo.engine.protocol import ServingEngine
from bubo.engine.types import Event, FinishEvent, GenerationRequest, TokenEvent

ENVIRON = "bubo.receipt"
log = logging.getLogger("bubo.api")


def ask(body: Mapping[str, Any]) -> Recorder | None:
    """Read the request's "receipt" field (a boolean; 400 otherwise): true records this request's
    generation for its receipt, in the Recorder returned (the route gives it to field() at the end:
    a stream's last chunk is made after the request's context has gone)."""
    if not bool_field(body, "receipt", False):
        return None
    rec = Recorder(current_app.config.get("BUBO_SIGNER"))
    request.environ[ENVIRON] = rec
    return rec


def recorder() -> Recorder | None:
    if not has_request_context():
        return None
    rec: Recorder | None = request.environ.get(ENVIRON)
    return rec


class Recorder:
    """One request's generation, as its receipt needs it."""

    def __init__(self, signer: receipts.Signer | None) -> None:
        self.signer = signer
        self.engine: ServingEngine | None = None
        self.req: GenerationRequest | None = None
        self.tokens: list[int] = []
        self.logprobs: list[float] = []
        self.finish: FinishEvent | None = None
        self.ended_early = False

    def submitted(self, engine: ServingEngine, req: GenerationRequest) -> GenerationRequest:
        """req with a seed of its own (a fresh one for -1, which the receipt records), kept with
        its engine. A request that generates twice is recorded by its last generation."""
        if req.params.seed == -1:
            req = dataclasses.replace(req, params=req.params.replace(seed=secrets.randbits(32)))
        self.engine, self.req = engine, req
        self.tokens, self.logprobs, self.finish, self.ended_early = [], [], None, False
        return req

    def saw(self, ev: Event) -> None:
        """An event of the request's stream, as the route reads it (pipeline.submit's stream)."""
        if isinstance(ev, TokenEvent):
            self.tokens.append(ev.token)
            self.logprobs.append(ev.logprob)
        elif isinstance(ev, FinishEvent):
            self.finish = ev

    def receipt(self) -> dict[str, Any] | None:
        """The receipt, once the answer has finished (None before, or without a generation)."""
        if self.engine is None or self.req is None or self.finish is None:
            return None
        eng, req = self.engine, self.req
        from bubo import _kernels
        from bubo.engine.slotfile import model_sha256

        path = eng.model_path or ""
        try:
            sha = offload.blocking(model_sha256, path)
        except OSError as e:  # the file went away since it was loaded: no receipt can name it
            log.warning("no receipt: the model file %s cannot be read (%s)", path, e.strerror or e)
            return None
        made = receipts.Made(
            model_name=offload.blocking(receipts.model_name, eng.model_name, sha), model_path=path, model_sha256=sha,
            kernel_level=_kernels.best_isa(), cache_type_k=eng.cache_type_k, cache_type_v=eng.cache_type_v,
            n_ctx=eng.n_ctx or 0, prompt=list(req.prompt), params=req.params, max_tokens=req.max_tokens,
            stop=list(req.stop), ignore_eos=req.ignore_eos,
            grammar=(req.grammar.text, req.grammar.root) if req.grammar is not None else None,
            tokens=self.tokens, logprobs=self.logprobs, finish_reason=self.finish.reason,
            ended_early=self.ended_early)
        return receipts.make(made, bubo.__version__, self.signer)


def field(rec: Recorder | None) -> dict[str, Any]:
    """{"receipt": ...} for a response whose request asked for one (ask()), else {}."""
    made = rec.receipt() if rec is not None else None
    return {"receipt": made} if made is not None else {}
