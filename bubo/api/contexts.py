"""Contexts (llamay's): a prompt read once and held by the model (bubo/engine/contexts.py), forked,
written to disk, and continued by generation requests.

    POST   /v1/contexts                  {"model", "prompt" | "messages"} -> a context
    GET    /v1/contexts                  ?model=                          -> {"object": "list", "data"}
    GET    /v1/contexts/{id}             ?model=                          -> a context
    DELETE /v1/contexts/{id}             ?model=
    POST   /v1/contexts/{id}/fork        ?n= (or {"n"}), ?model=          -> its children, and fork_ms
    POST   /v1/contexts/{id}/snapshot    ?model=                          -> written to disk, memory freed

A context object: {id, object, parent, created, tokens, pages, shared_pages, spilled}. A context
belongs to its model (?model= on every route of an existing one, `model` in the body to make one;
the default model without). /v1/completions and /completion take `context_id`: the prompt
continues the context (its tokens first, their rows shared, not read again), and with
`"save": true` the context moves forward to the end of the answer. A context being made or moved
forward is in use: reading, forking or snapshotting it then is a 409. A context is its caller's
(bubo.api.callers): to another caller it does not exist (404). Errors are OpenAI's shape."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from flask import Blueprint, jsonify, request

from bubo.api import callers, offload, pipeline
from bubo.api import fields as f
from bubo.api import openapi as oa
from bubo.api.errors import ApiError
from bubo.api.fields import invalid
from bubo.api.request import config, debug_mem_available, json_body, optional_model, runtime_of, use_model
from bubo.engine import slotfile
from bubo.engine.contexts import MAX_CONTEXTS, Context, ContextError, Contexts
from bubo.engine.engine import Engine
from bubo.engine.protocol import ServingEngine
from bubo.engine.scheduler import Scheduler
from bubo.engine.types import GenerationRequest
from bubo.runtime import Runtime

blueprint = Blueprint("contexts", __name__)


def _engine(model: str) -> Engine:
    engine = use_model(model)
    if not isinstance(engine, Engine) or engine.kv is None:
        raise ApiError(501, "not_implemented", "contexts need the model's engine in this process")
    return engine


def on_contexts(engine: Engine, fn: Any, id: str | None = None) -> Any:
    """fn(the engine's Contexts) on the engine's thread; its ContextErrors as 404, 409 or 400.
    id: the context fn acts on, which must be the request's caller's (404 otherwise)."""
    who = callers.caller()

    def run(s: Scheduler) -> Any:
        if s.contexts is None:
            raise ContextError("this model keeps no contexts")
        if id is not None:
            s.contexts.owned(id, who)
        return fn(s.contexts)
    try:
        return engine.call(run)
    except ContextError as e:
        status, code = (404, "context_not_found") if e.missing else (409, "context_busy") if e.busy else \
            (400, "invalid_value")
        raise ApiError(status, code, str(e)) from None


def _folder() -> Path:
    where = config().contexts_path
    if where is None:
        raise ApiError(501, "not_implemented", "this server has no folder for context snapshots")
    return Path(where)


def _layout(engine: Engine) -> slotfile.Layout:
    kv = engine.kv
    assert kv is not None
    sha = offload.blocking(slotfile.model_sha256, runtime_of(engine).path)
    return slotfile.Layout(sha, kv.block_size, kv.type, kv.type_v)


def read_back(engine: Engine, id: str) -> None:
    """A spilled context in memory again (its file read, checked and imported)."""
    path = on_contexts(engine, lambda c: c.get(id).spilled, id)
    if path is None:
        return
    kv = engine.kv
    assert kv is not None
    try:
        tokens, rows, _ = offload.blocking(slotfile.read, Path(path), _layout(engine), kv.seq_bytes, kv.n_ctx)
    except slotfile.SlotFileError as e:
        if on_contexts(engine, lambda c: c.get(id).spilled) is None:
            return  # another request read it back meanwhile (and removed the file)
        raise ApiError(500, "internal_error", f"context {id} cannot be read back from disk: {e}") from None
    try:
        on_contexts(engine, lambda c: c.unspill(id, tokens, rows))
    except MemoryError as e:
        raise ApiError(507, "insufficient_memory", f"context {id} does not fit in the KV cache now: {e}") from None
    Path(path).unlink(missing_ok=True)  # in memory again: a later snapshot writes a new file


# --- generation from a context (/v1/completions, /completion) ------------------------------


def start(engine: ServingEngine, body: dict[str, Any]) -> tuple[list[int], int, bool] | None:
    """A request's context_id and save: None without one; else (the context's tokens, its
    sequence, save); a 409 if a request is writing it. The claim that save needs is taken by
    submit(), once the request is ready to go."""
    id = body.get("context_id")
    if id is None:
        return None
    if not isinstance(id, str) or not id:
        raise invalid("context_id must be a context's id (\"ctx_...\")")
    save = f.bool_field(body, "save", False)
    if not isinstance(engine, Engine):
        raise ApiError(501, "not_implemented", "contexts need the model's engine in this process")
    read_back(engine, id)

    def take(c: Contexts) -> tuple[list[int], int]:
        ctx = c.readable(id)
        return list(ctx.tokens), ctx.seq
    tokens, seq = on_contexts(engine, take, id)
    return tokens, seq, save


def continued(engine: ServingEngine, rt: Runtime, body: dict[str, Any], prompt: str | list[int],
              plain: Callable[[Runtime, Any], list[int]]) -> tuple[list[int], dict[str, Any], str | None]:
    """A raw completion's prompt tokens and its GenerationRequest's context fields: plain(rt,
    prompt) without a context_id; with one, the context's tokens, then the prompt's (text without
    BOS). The third item: the claimed context's id (save), to release if the request is refused."""
    got = start(engine, body)
    if got is None:
        return plain(rt, prompt), {}, None
    prefix, seq, save = got
    if isinstance(prompt, list) and not all(isinstance(t, int) for t in prompt):
        raise invalid("with context_id, prompt is text or token ids (not a mix)")
    more = pipeline.encode(rt, prompt, add_special=False) if isinstance(prompt, str) else list(prompt)
    if not prefix + more:
        raise invalid("the context is empty and so is the prompt: there is nothing to continue")
    fields: dict[str, Any] = {"context": seq}
    if save:
        fields["keep"] = seq
    return prefix + more, fields, str(body["context_id"]) if save else None


def submit(engine: ServingEngine, req: GenerationRequest, claimed: str | None, exact: bool = True) -> Any:
    """pipeline.submit; with save (claimed: the context's id) the context is claimed first (a 409
    if a request is writing it, or, exact, wrote it since this one read it: its prompt no longer
    starts with the context) and given back if the request is refused; the engine frees it when
    the request ends."""
    if claimed is not None:
        assert isinstance(engine, Engine)  # start() said so

        def claim(c: Contexts) -> None:
            ctx = c.readable(claimed)
            if ctx.seq != req.keep or (exact and req.prompt[:len(ctx.tokens)] != ctx.tokens):
                raise ContextError(f"context {claimed} moved on since this request read it: send it again",
                                   busy=True)
            c.claim(claimed)
        on_contexts(engine, claim)
    try:
        return pipeline.submit(engine, req, debug_mem_available())
    except BaseException:
        if claimed is not None:
            release(engine, claimed)
        raise


def for_chat(engine: ServingEngine, body: dict[str, Any]
             ) -> tuple[dict[str, Any], Callable[[GenerationRequest], Any]] | None:
    """A chat-shaped request's context_id (chat completions, Responses, messages): the whole
    conversation is rendered as always, and the context's rows serve the part of the prompt that
    agrees with its tokens (a context made from the conversation's first messages, or moved
    forward by an earlier turn's save); save: the context becomes this answer's end.
    None without a context_id: (the GenerationRequest's fields, its submitter) with one."""
    got = start(engine, body)
    if got is None:
        return None
    _, seq, save = got
    claimed = str(body["context_id"]) if save else None
    fields: dict[str, Any] = {"context": seq, **({"keep": seq} if save else {})}
    return fields, lambda req: submit(engine, req, claimed, exact=False)


def release(engine: ServingEngine, id: str) -> None:
    """A claim the request never used (its submission was refused)."""
    if isinstance(engine, Engine):
        try:
            on_contexts(engine, lambda c: c.release(id))
        except ApiError:
            pass


# --- routes --------------------------------------------------------------------------------


def describe(contexts: Contexts, ctx: Context) -> dict[str, Any]:
    """llamay's context object (on the engine's thread: it reads the cache's block counts)."""
    spilled = ctx.spilled is not None
    kv = contexts.kv
    return {"id": ctx.id, "object": "context", "parent": ctx.parent, "created": ctx.created,
            "tokens": len(ctx.tokens), "pages": 0 if spilled else kv.seq_blocks(ctx.seq),
            "shared_pages": 0 if spilled else kv.seq_shared_blocks(ctx.seq), "spilled": spilled}


def _context_schema() -> oa.Schema:
    return oa.obj({"id": oa.STR, "object": oa.const("context"), "parent": {"type": ["string", "null"]},
                   "created": oa.INT, "tokens": oa.NAT, "pages": oa.NAT, "shared_pages": oa.NAT, "spilled": oa.BOOL},
                  ["id", "object", "parent", "created", "tokens", "pages", "shared_pages", "spilled"])


def _doc(summary: str, op: str, ok: oa.Schema, *, body: oa.Schema | None = None, path: bool = True,
         query: list[oa.Schema] | None = None) -> Any:
    def build(d: oa.Doc) -> oa.Op:
        params = ([oa.path_param("context_id", "a context's id (ctx_...)")] if path else []) + [d.model_query(True)]
        spec: dict[str, Any] = {"operationId": op, "summary": summary, "tags": ["bubo"],
                                "parameters": params + (query or []),
                                "responses": {"200": {"description": summary, "content": {oa.JSON: {"schema": ok}}}}}
        if body is not None:
            spec["requestBody"] = oa.body(body)
        return oa.Op(spec, (400, 404, 409, 501, 503, 507))
    return build


@oa.route(blueprint, "/v1/contexts", methods=("POST",),
          doc=_doc("Read a prompt once and hold it", "context_create", _context_schema(), path=False,
                   body=oa.obj({"model": oa.STR, "prompt": {"anyOf": [oa.STR, oa.arr(oa.NAT)]},
                                "messages": oa.arr({"type": "object"})}, closed=False)))
def create() -> Any:
    body = json_body()
    model = optional_model(body)
    engine = _engine(model)
    rt = runtime_of(engine)
    if body.get("messages") is not None:
        from bubo.api.openai import chat as ch

        conv = offload.run(ch.parse_chat_request, {"messages": body.get("messages"), "tools": body.get("tools"),
                                                   "chat_template_kwargs": body.get("chat_template_kwargs")},
                           what="reading the request's fields")
        tokens = pipeline.prepare(rt, conv, config().allow_special_in_content).prompt.tokens
    else:
        from bubo.api.openai import completions as cm

        tokens = pipeline.prompt_tokens(rt, cm.prompt_of(body.get("prompt")))
    who = callers.caller()
    ctx: Context = on_contexts(engine, lambda c: c.claim(c.new(owner=who).id))
    try:
        stream = pipeline.submit(engine, GenerationRequest(tokens, read_only=True, keep=ctx.seq),
                                 debug_mem_available())
    except BaseException:
        on_contexts(engine, lambda c: c.discard(ctx.id))
        raise
    try:
        pipeline.collect(stream, None)
    except BaseException:
        on_contexts(engine, lambda c: c.discard(ctx.id))
        raise
    return jsonify(on_contexts(engine, lambda c: describe(c, c.get(ctx.id))))


@oa.route(blueprint, "/v1/contexts", doc=_doc("The model's contexts", "context_list", oa.obj(
    {"object": oa.const("list"), "data": oa.arr(_context_schema())}, ["object", "data"]), path=False))
def list_contexts() -> Any:
    engine = _engine(optional_model())
    who = callers.caller()
    return jsonify(object="list", data=on_contexts(engine, lambda c: [describe(c, x) for x in c.listed(who)]))


@oa.route(blueprint, "/v1/contexts/<context_id>", doc=_doc("A context", "context_get", _context_schema()))
def get_context(context_id: str) -> Any:
    engine = _engine(optional_model())
    return jsonify(on_contexts(engine, lambda c: describe(c, c.get(context_id)), context_id))


@oa.route(blueprint, "/v1/contexts/<context_id>", methods=("DELETE",),
          doc=_doc("Delete a context", "context_delete", oa.obj(
              {"id": oa.STR, "object": oa.const("context"), "deleted": oa.const(True)}, ["id", "object", "deleted"])))
def delete_context(context_id: str) -> Any:
    engine = _engine(optional_model())
    ctx: Context = on_contexts(engine, lambda c: c.delete(context_id), context_id)
    if ctx.spilled is not None:
        Path(ctx.spilled).unlink(missing_ok=True)
    return jsonify(id=context_id, object="context", deleted=True)


@oa.route(blueprint, "/v1/contexts/<context_id>/fork", methods=("POST",),
          doc=_doc("Fork a context n times (its blocks shared, copied on write)", "context_fork", oa.obj(
              {"object": oa.const("list"), "data": oa.arr(_context_schema()), "fork_ms": oa.number(0)},
              ["object", "data", "fork_ms"]),
              query=[{"name": "n", "in": "query", "required": False,
                      "schema": {"type": "integer", "minimum": 1, "maximum": MAX_CONTEXTS}}]))
def fork_context(context_id: str) -> Any:
    raw = request.args.get("n")
    if raw is None and request.content_length:
        raw = json_body().get("n")
    try:
        n = 1 if raw is None else int(raw)
    except (TypeError, ValueError):
        raise invalid(f"n must be an integer from 1 to {MAX_CONTEXTS}; got {raw!r}") from None
    if not 1 <= n <= MAX_CONTEXTS:
        raise invalid(f"n must be an integer from 1 to {MAX_CONTEXTS}; got {n}")
    engine = _engine(optional_model())
    read_back(engine, context_id)

    def fork(c: Contexts) -> tuple[list[dict[str, Any]], float]:
        children, seconds = c.fork(context_id, n)
        return [describe(c, x) for x in children], seconds
    data, seconds = on_contexts(engine, fork, context_id)
    return jsonify(object="list", data=data, fork_ms=seconds * 1e3)


@oa.route(blueprint, "/v1/contexts/<context_id>/snapshot", methods=("POST",),
          doc=_doc("Write a context to disk and free its memory", "context_snapshot", _context_schema()))
def snapshot_context(context_id: str) -> Any:
    engine = _engine(optional_model())
    folder = _folder()
    # claimed from the export to the spill: no request moves it forward meanwhile
    tokens, rows = on_contexts(engine, lambda c: c.export(context_id, claim=True), context_id)
    path = folder / f"{context_id}.slot"
    try:
        offload.blocking(_write, path, _layout(engine), tokens, rows)
    except BaseException as e:
        release(engine, context_id)
        if isinstance(e, OSError):
            raise ApiError(507 if e.errno == 28 else 500, "cannot_write",
                           f"context {context_id} cannot be written to disk: {e.strerror or e}") from None
        raise
    return jsonify(on_contexts(engine, lambda c: (c.spill(context_id, str(path)), describe(c, c.get(context_id)))[1]))


def _write(path: Path, layout: slotfile.Layout, tokens: list[int], rows: bytes) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    return slotfile.write(path, layout, tokens, rows)
