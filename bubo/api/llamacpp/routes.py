"""llama-server's generating routes, POST /completion and /infill (it needs no model field; with several
models, `model` picks one and the default model answers without it)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from flask import Blueprint

from bubo.api import callers, contexts, jsonout, offload, pipeline, receipts
from bubo.api import fields as f
from bubo.api import openapi as oa
from bubo.api.errors import ApiError, StreamShape, stream_error
from bubo.api.fields import invalid
from bubo.api.light import Plain, light
from bubo.api.llamacpp import completion as nc
from bubo.api.request import COMPILED_FIELDS, json_body, optional_model, runtime_of, small_body, use_model, with_fields
from bubo.api.sse import sse_response
from bubo.chat.fim import fim_prompt, fim_tokens, no_fim
from bubo.engine.protocol import ServingEngine
from bubo.engine.types import FinishEvent, GenerationRequest, TokenEvent
from bubo.runtime import Runtime

blueprint = Blueprint("llamacpp", __name__)


def _tokens(rt: Runtime, prompt: str | list[Any]) -> list[int]:
    if isinstance(prompt, str):
        return pipeline.prompt_tokens(rt, prompt)
    return pipeline.offloaded(_mixed_tokens, rt, prompt, what="tokenizing the prompt")


def _mixed_tokens(rt: Runtime, prompt: list[Any]) -> list[int]:
    if all(isinstance(t, int) for t in prompt):
        return pipeline.prompt_tokens(rt, [int(t) for t in prompt])
    # a mix: the first text gets BOS as a plain prompt would, the later ones none
    ids: list[int] = []
    for item in prompt:
        if isinstance(item, str):
            ids += pipeline.encode(rt, item, add_special=not ids)
        else:
            ids += pipeline.prompt_tokens(rt, [item])
    if not ids:
        raise invalid("prompt is empty")
    return ids


def _completion_doc(d: oa.Doc) -> oa.Op:
    return oa.Op({
        "operationId": "completion", "summary": "Text completion (llama-server)", "tags": ["llama-server"],
        "requestBody": oa.body(oa.native_completion_request(), {"prompt": "The capital of France is", "n_predict": 8}),
        "responses": {"200": oa.ok(oa.ref("Completion"), "The completion.",
                                   oa.sse_data({"anyOf": [oa.ref("CompletionChunk"), oa.ref("Completion"),
                                                          oa.ref("Error")]}),
                                   "a chunk per token, then the final object with \"stop\": true (no [DONE]).")},
    }, oa.GEN_ERRORS)


# /completions: llama-server's alias; /v1/completions is OpenAI's
@oa.route(blueprint, "/completion", "/completions", methods=("POST",), doc=_completion_doc)
def completion() -> Any:
    body = json_body()
    req = offload.run(nc.parse_native_request, body, what="reading the request's fields", small=small_body(body))
    draft_max = f.draft_max_of(body)
    rec = receipts.ask(body)
    model = optional_model(body)
    engine = use_model(model)
    rt = runtime_of(engine)
    tokens, ctx, claimed = contexts.continued(engine, rt, body, req.prompt, _tokens)
    # token ids are decoded for the answer once the engine has taken them (it checks them)
    return _answer(req, model, engine, rt, tokens, req.prompt if isinstance(req.prompt, str) else None, draft_max,
                   ctx, claimed, rec)


@light(completion, "POST")
def _completion_light(plain: Plain) -> bytes | None:
    """A short text prompt's answer of at most a few hundred tokens from the default model, not
    streamed, asked with the fields parse_native_request reads and no others (a receipt, a
    context, drafting's, a grammar, probabilities or a model's name are Flask's), from a server
    without adapters, signing key, debug hooks or defaults of its own for the request's fields
    (sampling flags, -n: read from the app's context, which a light answer has none of): the
    route's steps, beneath Flask's request. All of its work is bounded by offload.SMALL_CHARS, as
    the work Flask's route runs inline is: the body's fields read (small_body), the engine's
    check (no DRY matching of every token's text; prompt, stop strings and biases within it) and
    the answer written (its prompt and its tokens)."""
    body, reg = plain.body, plain.registry
    assert body is not None
    config = plain.config["BUBO_CONFIG"]
    if (reg.is_router or config.debug_routes_enabled or "BUBO_SIGNER" in plain.config or config.sampling_defaults
            or config.n_predict is not None or not offload.small_n(plain.size)
            or not COMPILED_FIELDS.isdisjoint(body.keys())):
        return None
    try:
        req = nc.parse_native_request(body)
    except ApiError:
        return None
    if (body.unread() or req.stream or req.n_probs or req.output is not None or not isinstance(req.prompt, str)
            or req.params.matches_token_text or req.n_predict is None or req.n_predict < 1):
        return None
    # the prompt's tokens are at most its UTF-8 bytes and a BOS
    prompt_n = len(req.prompt.encode("utf-8", "surrogatepass")) + 1
    if not offload.small_n(prompt_n + len(req.params.logit_bias or {}) + sum(len(x) for x in req.stop)
                           + req.n_predict):
        return None
    engine = plain.engine()
    rt = engine.runtime if engine is not None else None
    if engine is None or rt is None or rt.adapters:
        return None
    plain.commit()  # from here its errors are its answer (a prompt too long, a full queue)
    tokens = pipeline.prompt_tokens(rt, req.prompt)
    gen = GenerationRequest(tokens, req.params, req.n_predict, req.stop, req.n_probs, req.cache_prompt,
                            req.ignore_eos)
    stream = pipeline.submit_unnamed(engine, gen, plain.config["BUBO_CALLERS"], plain.record)
    out = pipeline.collect(stream, None, plain.socket)
    answer = nc.native_response(model=reg.default.name, content=out.content, fin=out.finished,
                                tokens=[t.token for t in out.tokens] if req.return_tokens else None, probs=None,
                                prompt_text=req.prompt, settings=nc.generation_settings(req, engine.n_ctx or 0))
    return jsonout.response(answer, small=True).get_data()  # the route's bytes (jsonout.built's, small)


def _infill_doc(d: oa.Doc) -> oa.Op:
    infill = oa.obj({"input_prefix": oa.STR, "input_suffix": oa.STR,
                     "input_extra": oa.desc(oa.arr(oa.obj({"filename": oa.STR, "text": oa.STR}, ["text"],
                                                          closed=False)),
                                            "other files, written before the prefix (repository context)"),
                     **{k: v for k, v in oa.native_completion_request()["properties"].items() if k != "prompt"},
                     "prompt": oa.desc(oa.STR, "text after the middle marker: the answer continues it")}, closed=False)
    return oa.Op({
        "operationId": "infill", "summary": "Fill in the middle (llama-server)", "tags": ["llama-server"],
        "requestBody": oa.body(infill, {"input_prefix": "def add(a, b):\n    ", "input_suffix": "\n",
                                        "n_predict": 8}),
        "responses": {"200": oa.ok(oa.ref("Completion"), "The completion, as /completion gives it.",
                                   oa.sse_data({"anyOf": [oa.ref("CompletionChunk"), oa.ref("Completion"),
                                                          oa.ref("Error")]}),
                                   "as /completion streams."),
                      "501": oa.error(501, text="Code not_implemented: the model has no fill-in-the-middle tokens")},
    }, oa.GEN_ERRORS)


@oa.route(blueprint, "/infill", methods=("POST",), doc=_infill_doc)
def infill() -> Any:
    """llama-server's fill-in-the-middle: input_prefix, input_suffix, input_extra (other files,
    [{"filename", "text"}]) and prompt (text after the middle marker, which the answer continues),
    with every /completion field; answered as /completion answers. A model without
    fill-in-the-middle tokens is a 501 not_implemented naming it."""
    body = json_body()
    texts = {}
    for key in ("input_prefix", "input_suffix", "prompt"):
        v = body.get(key)
        if v is not None and not isinstance(v, str):
            raise invalid(f"{key} must be a string")
        texts[key] = v or ""
    extra = body.get("input_extra")
    files: list[tuple[str, str]] = []  # llama-server always writes the repository context
    if extra is not None:
        if not isinstance(extra, list):
            raise invalid('input_extra must be an array of {"filename": ..., "text": ...}')
        for i, chunk in enumerate(extra):
            if not isinstance(chunk, dict) or not isinstance(chunk.get("text"), str) \
                    or not isinstance(chunk.get("filename", ""), str):
                raise invalid(f'input_extra[{i}] must be {{"filename": "...", "text": "..."}}')
            files.append((chunk.get("filename") or "", chunk["text"]))
    req = offload.run(nc.parse_native_request, with_fields(body, prompt=texts["prompt"]),
                      what="reading the request's fields")
    draft_max = f.draft_max_of(body)
    rec = receipts.ask(body)
    model = optional_model(body)
    engine = use_model(model)
    rt = runtime_of(engine)
    if fim_tokens(rt) is None:  # as llama-server: the route is there, the model cannot do it
        raise ApiError(501, "not_implemented", no_fim(model))
    tokens = pipeline.offloaded(fim_prompt, rt, texts["input_prefix"], texts["input_suffix"], files=files,
                                middle=texts["prompt"], name=model, what="tokenizing the prompt")
    return _answer(req, model, engine, rt, tokens, texts["prompt"], draft_max, rec=rec)


def _answer(req: nc.NativeRequest, model: str, engine: ServingEngine, rt: Runtime, tokens: list[int],
            prompt_text: str | None, draft_max: int | None, ctx: dict[str, Any] | None = None,
            claimed: str | None = None, rec: receipts.Recorder | None = None) -> Any:
    """Generate from tokens and answer in /completion's shape (one object, or SSE chunks); ctx:
    the request's context fields (bubo.api.contexts.continued); rec: its receipt's (receipts.ask)."""
    gen = GenerationRequest(tokens, req.params, req.n_predict, req.stop, req.n_probs, req.cache_prompt,
                            req.ignore_eos, pipeline.completion_grammar(req.output, rt),
                            draft_max=draft_max, **(ctx or {}))
    stream = contexts.submit(engine, gen, claimed)
    n_ctx = engine.n_ctx or 0

    def probs_of(ev: TokenEvent) -> dict[str, Any]:
        top = [(t, rt.token_piece(t), lp) for t, lp in ev.top[: req.n_probs]]
        return nc.probability(ev.token, rt.token_piece(ev.token), ev.logprob, top)

    if not req.stream:
        out = pipeline.collect(stream, None)
        receipt = receipts.field(rec)

        def answer() -> dict[str, Any]:
            ids = [t.token for t in out.tokens]
            return {**nc.native_response(
                model=model, content=out.content, fin=out.finished, tokens=ids if req.return_tokens else None,
                probs=[probs_of(t) for t in out.tokens] if req.n_probs else None,
                prompt_text=prompt_text if prompt_text is not None else rt.tokenizer.decode(tokens),
                settings=nc.generation_settings(req, n_ctx)), **receipt}

        return jsonout.built(answer, small=offload.small_n(len(tokens) + len(out.tokens) * (1 + req.n_probs)))

    def chunks() -> Iterator[Any]:
        n = 0
        try:
            for parts, ev in pipeline.run_events(stream, None):
                if isinstance(ev, TokenEvent):
                    n += 1
                    yield nc.native_chunk(content="".join(p.text for p in parts),
                                          tokens=[ev.token] if req.return_tokens else None, n_predicted=n,
                                          n_prompt=len(tokens), probs=[probs_of(ev)] if req.n_probs else None)
                elif isinstance(ev, FinishEvent):
                    yield {**nc.native_response(
                        model=model, content="", fin=ev, tokens=None, probs=None,
                        prompt_text="", settings=nc.generation_settings(req, n_ctx)), **receipts.field(rec)}
        except ApiError as e:
            yield stream_error(StreamShape.OPENAI, e)

    return sse_response(chunks(), stream=stream)


# --- slot files ------------------------------------------------------------------------------


def _slot_action_doc(d: oa.Doc) -> oa.Op:
    done = oa.obj({"id_slot": oa.NAT, "filename": oa.STR, "n_saved": oa.NAT, "n_written": oa.NAT,
                   "n_restored": oa.NAT, "n_read": oa.NAT, "n_erased": oa.NAT,
                   "timings": oa.obj({"save_ms": oa.number(0), "restore_ms": oa.number(0)})}, ["id_slot"])
    errors: tuple[int, ...] = (400, 404, 409, 501, 503, 507)
    return oa.Op({
        "operationId": "slot_action", "summary": "Save a slot to a file, restore it, or erase it (llama-server)",
        "tags": ["llama-server"],
        "parameters": [{"name": "id_slot", "in": "path", "required": True, "schema": {"type": "integer"}},
                       {"name": "action", "in": "query", "required": True,
                        "schema": oa.enum("save", "restore", "erase")}, d.model_query()],
        "requestBody": oa.body(oa.obj({"filename": oa.STR}, closed=False), {"filename": "chat.bin"}),
        "responses": {"200": {"description": "n_saved and n_written; n_restored and n_read; or n_erased",
                              "content": {oa.JSON: {"schema": done}}}},
    }, errors)


MAX_NAME_CHARS = 255


def _slot_file_name(name: Any) -> str:
    """A plain file name inside the slot folder: no path separators, no `..`, nothing absolute,
    not hidden (a leading dot), no control characters."""
    if not isinstance(name, str) or not name:
        raise invalid("filename is required: a plain file name inside the --slot-save-path folder")
    if len(name) > MAX_NAME_CHARS:
        raise invalid(f"filename is longer than {MAX_NAME_CHARS} characters")
    if "/" in name or "\\" in name or name.startswith(".") or any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise invalid(f"filename {name!r} must be a plain name inside the --slot-save-path folder: no "
                      "path separators, no leading dot, no control characters")
    return name


def slot_folder(root: str, caller: str | None) -> Path:
    """Where a caller's slot files are: the folder itself for the unnamed caller (llama-server's
    files), `.callers/NAME` in it for a named one (a file name cannot start with a dot: no caller
    reaches another's files)."""
    return Path(root) if caller is None else Path(root) / ".callers" / caller


@oa.route(blueprint, "/slots/<int:id_slot>", "/v1/slots/<int:id_slot>", methods=("POST",), doc=_slot_action_doc)
def slot_action(id_slot: int) -> Any:
    """save: what the idle slot holds (its whole KV blocks) to FILENAME in --slot-save-path;
    restore: a saved file's tokens and rows into the idle slot (and the prefix cache, so that a
    prompt starting with them reads only what follows); erase: forget what the slot holds. Each
    caller has its own files (slot_folder), and saves or erases only a slot that holds its own
    conversation (or nothing): to another caller the slot holds nothing (404)."""
    import time

    from flask import jsonify, request

    from bubo.api.request import config
    from bubo.engine import slotfile
    from bubo.engine.engine import Engine
    from bubo.engine.scheduler import Scheduler, SlotError

    folder = config().slot_save_path
    if folder is None:
        raise ApiError(501, "not_implemented", "slot files are off: start the server with --slot-save-path DIR")
    action = request.args.get("action")
    if action not in ("save", "restore", "erase"):
        raise invalid(f"action must be save, restore or erase; got {action!r}")
    body = json_body() if action != "erase" else {}
    name = _slot_file_name(body.get("filename")) if action != "erase" else ""
    engine = use_model(optional_model(body))
    if not isinstance(engine, Engine) or engine.kv is None:
        raise ApiError(501, "not_implemented", "slot files need the model's engine in this process")
    kv = engine.kv
    who = callers.caller()

    def on_engine(fn: Any) -> Any:
        try:
            return engine.call(fn)
        except SlotError as e:
            raise ApiError(409 if e.busy else 400, "slot_busy" if e.busy else "invalid_value", str(e)) from None

    def mine(s: Scheduler) -> None:
        """Another caller's conversation in the slot: as if it held nothing of this caller's."""
        owner, holds = s.slot_owner(id_slot)
        if holds and owner != who:
            raise ApiError(404, "not_found", f"slot {id_slot} holds no conversation of this caller's")

    t0 = time.perf_counter()
    if action == "erase":
        def erase(s: Scheduler) -> int:
            mine(s)
            return s.erase_slot(id_slot)
        n = on_engine(erase)
        return jsonify(id_slot=id_slot, n_erased=n)
    path = slot_folder(folder, who) / name
    rt = runtime_of(engine)
    layout = slotfile.Layout(offload.blocking(slotfile.model_sha256, rt.path), kv.block_size, kv.type, kv.type_v)
    if action == "save":
        def save(s: Scheduler) -> tuple[list[int], bytes]:
            mine(s)
            return s.save_slot(id_slot)
        tokens, rows = on_engine(save)
        try:
            n_written = offload.blocking(_write_slot, path, layout, tokens, rows)
        except OSError as e:
            raise ApiError(507 if e.errno == 28 else 500, "cannot_write",
                           f"slot file {name!r} cannot be written: {e.strerror or e}") from None
        return jsonify(id_slot=id_slot, filename=name, n_saved=len(tokens), n_written=n_written,
                       timings={"save_ms": (time.perf_counter() - t0) * 1e3})
    try:
        tokens, rows, n_read = offload.blocking(slotfile.read, path, layout, kv.seq_bytes, kv.n_ctx)
    except slotfile.SlotFileError as e:
        if e.missing:
            raise ApiError(404, "not_found", f"no slot file {name!r} in the --slot-save-path folder") from None
        raise ApiError(400, "invalid_slot_file", str(e)) from None
    try:
        def restore(s: Scheduler) -> int:
            mine(s)  # another caller's conversation is not this caller's to replace
            return s.restore_slot(id_slot, tokens, rows, who)
        n = on_engine(restore)
    except MemoryError as e:
        raise ApiError(507, "insufficient_memory",
                       f"slot file {name!r} does not fit in the KV cache now: {e}") from None
    except ValueError as e:
        raise ApiError(400, "invalid_slot_file", f"slot file {name!r}: {e}") from None
    return jsonify(id_slot=id_slot, filename=name, n_restored=n, n_read=n_read,
                   timings={"restore_ms": (time.perf_counter() - t0) * 1e3})


def _write_slot(path: Path, layout: Any, tokens: list[int], rows: bytes) -> int:
    from bubo.engine import slotfile

    path.parent.mkdir(parents=True, exist_ok=True)
    return slotfile.write(path, layout, tokens, rows)
