"""The server's own routes: health, ready, models (and router mode's load/unload), props, slots,
metrics, tokenize, detokenize, apply-template, the 501 paths, and /debug/* (only with
--debug-hooks on a loopback address).

With several models, llama-server's GET routes take `?model=` (the default model without it)
and the POST routes a `model` field; GET routes never load a model."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

from flask import Blueprint, Response, jsonify, request

import bubo
from bubo import deadline
from bubo.api import callers, errors, jsonout, offload, pipeline
from bubo.api import fields as f
from bubo.api import openapi as oa
from bubo.api.errors import ApiError
from bubo.api.light import Plain, light
from bubo.api.llamacpp.shapes import prometheus, slots_json
from bubo.api.request import (
    config,
    debug_mem_available,
    json_body,
    models,
    optional_model,
    resolve_model,
    response_store,
    runtime_of,
    use_model,
)
from bubo.api.sse import cancel_on_disconnect, sse_response
from bubo.engine.engine import ModelInfo
from bubo.engine.registry import DEFAULT_NAME, ModelEntry, ModelStatus, adapter_files
from bubo.engine.types import EngineMetrics, EngineRefusal, FinishEvent, GenerationRequest, TokenEvent
from bubo.runtime import Runtime

blueprint = Blueprint("core", __name__)
debug_blueprint = Blueprint("debug", __name__)

STARTED = int(time.time())

NOT_IMPLEMENTED = ["/v1/rerank", "/v1/reranking", "/rerank", "/sdapi/v1/<path:rest>"]


def _route(*paths: str, methods: tuple[str, ...] = ("GET",),
           doc: oa.Build) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    return oa.route(blueprint, *paths, methods=methods, doc=doc)


def _entry(name: str) -> ModelEntry:
    return models().lookup(name)


def _info(entry: ModelEntry) -> ModelInfo | None:
    eng = entry.engine
    return eng.info if eng is not None and eng.info is not None else entry.info


def _not_ready(entry: ModelEntry) -> ApiError:
    status = entry.status
    if status is ModelStatus.FAILED:
        return errors.not_ready(f"the model {entry.name} failed to load: {entry.failure}", failed=True)
    if status is ModelStatus.LOADING:
        return errors.not_ready(f"the model {entry.name} is loading; try again when /ready says ready")
    return errors.not_ready(f"the model {entry.name} is {status.value}")


# --- health and readiness ----------------------------------------------------------------


def _health_doc(d: oa.Doc) -> oa.Op:
    return oa.Op({
        "operationId": "health", "summary": "Liveness", "tags": ["bubo"],
        "responses": {"200": {"description": "The server is up (details: what works in a lesser way)",
                              "content": {oa.JSON: {"schema": oa.obj({
                                  "status": oa.const("ok"),
                                  "details": oa.obj({"responses_store": oa.desc(oa.STR, "why stored responses are "
                                                                                "kept in memory only")})},
                                  ["status"])}}}},
    })


@_route("/health", "/v1/health", "/healthz", doc=_health_doc)
def health() -> Any:
    return jsonout.response(_health(response_store().problem))


@light(health)
def _health_light(plain: Plain) -> bytes:
    return jsonout.encode(_health(plain.config["BUBO_RESPONSES"].problem))


def _health(problem: str | None) -> dict[str, Any]:
    return {"status": "ok", "details": {"responses_store": problem}} if problem else {"status": "ok"}


def _ready_doc(d: oa.Doc) -> oa.Op:
    ready_ok = oa.obj({"status": oa.const("ready"), "model": oa.STR, "sleeping": oa.const(True)}, ["status", "model"])
    return oa.Op({
        "operationId": "ready", "summary": "Readiness: the model can answer now", "tags": ["bubo"],
        "parameters": [d.model_query()],
        "responses": {"200": {"description": "Loaded, or sleeping (it reloads on its next request)",
                              "content": {oa.JSON: {"schema": ready_ok}}},
                      "503": oa.error(503, text="Code not_ready: loading, unloaded, or its load failed "
                                      "(or shutting_down)")},
    }, (404,) if d.router else ())


@_route("/ready", "/v1/ready", "/readyz", doc=_ready_doc)
def ready() -> Any:
    """200 when the model (?model=, else the default one) can answer now: loaded, or sleeping
    (it reloads on its next request)."""
    name = optional_model()
    entry = _entry(name)
    if entry.status is ModelStatus.LOADED:
        return jsonify(status="ready", model=name)
    if entry.status is ModelStatus.SLEEPING:
        return jsonify(status="ready", model=name, sleeping=True)
    raise _not_ready(entry)


# --- models and properties ----------------------------------------------------------------


def _status_json(entry: ModelEntry) -> dict[str, Any]:
    out: dict[str, Any] = {"value": entry.status.value}
    if entry.status is ModelStatus.FAILED:
        out["failed"] = True
        out["error"] = entry.failure
    return out


def _model_json(entry: ModelEntry, default: bool) -> dict[str, Any]:
    info = _info(entry)
    eng = entry.engine
    n_ctx = info.n_ctx if info is not None else (eng.n_ctx if eng is not None else entry.spec.settings.n_ctx)
    n_ctx_train = info.n_ctx_train if info is not None else None
    out: dict[str, Any] = {
        "id": entry.name,
        "object": "model",
        "created": STARTED,
        "owned_by": "bubo",
        "context_length": n_ctx,
        "max_model_len": n_ctx,
        "meta": {"n_ctx": n_ctx, "n_ctx_train": n_ctx_train},
        "architecture": {"input_modalities": ["text"]},
        "status": _status_json(entry),
        "aliases": list(dict.fromkeys([*entry.spec.aliases, *([DEFAULT_NAME] if default else [])])),
        "path": entry.spec.source,
    }
    return out


def _models_doc(d: oa.Doc) -> oa.Op:
    return oa.Op({
        "operationId": "list_models", "summary": "The served models, each once with its aliases",
        "tags": ["OpenAI", "llama-server"],
        "responses": {"200": {"description": "Every model, with the names a request may use for it",
                              "content": {oa.JSON: {"schema": oa.ref("ModelList")}}}},
    })


@_route("/v1/models", "/models", doc=_models_doc)
def list_models() -> Any:
    """Every model once (its id, its aliases: "bubo" on the default one), with its context and
    status (unloaded, loading, loaded, unloading, sleeping, failed). A request may also use the
    names a model implies (its catalog name, short name, :latest, file name: registry.implied_names)."""
    reg = models()
    default = reg.default
    adapters = [{**_model_json(e, False), "id": name, "aliases": [], "parent": e.name,
                 "adapter": {"name": a, "path": adapter_files(e.spec)[a]}} for name, e, a in reg.adapter_models()]
    return jsonify(object="list", data=[_model_json(e, e is default) for e in reg.entries] + adapters)


def _model_field(body: dict[str, Any]) -> str:
    name = body.get("model")
    if not isinstance(name, str) or not name:
        raise f.invalid('the body needs "model": the name of one of the models GET /models lists')
    return name


def _manage(action: Callable[[str], ModelEntry]) -> Any:
    body = json_body()
    name = _model_field(body)
    try:
        models().lookup(name)
        entry = action(name)
    except EngineRefusal as e:
        raise errors.from_refusal(e) from None
    return jsonify(success=True, model=entry.name, status=entry.status.value)


def _manage_shapes() -> tuple[oa.Schema, oa.Schema]:
    """(request, answer) of /models/load and /models/unload."""
    manage = oa.obj({"model": oa.desc({"type": "string", "minLength": 1}, "one of the names GET /models lists")},
                    ["model"], closed=False)
    manage_ok = oa.obj({"success": oa.const(True), "model": oa.STR,
                        "status": oa.enum("unloaded", "loading", "loaded", "unloading", "sleeping", "failed")},
                       ["success", "model", "status"])
    return manage, manage_ok


def _load_doc(d: oa.Doc) -> oa.Op:
    manage, manage_ok = _manage_shapes()
    return oa.Op({
        "operationId": "load_model", "summary": "Start loading a model (answers at once)", "tags": ["llama-server"],
        "requestBody": oa.body(manage, {"model": d.example_model}),
        "responses": {"200": {"description": "Loading (or loaded): GET /models shows when it is loaded",
                              "content": {oa.JSON: {"schema": manage_ok}}}},
    }, (400, 404, 413, 507))


@_route("/models/load", methods=("POST",), doc=_load_doc)
def load_model() -> Any:
    """Start loading a model (a failed one tries again); answers at once: GET /models shows when
    it is loaded. Loading past --models-max first unloads the least recently used idle model."""
    return _manage(models().load)


def _unload_doc(d: oa.Doc) -> oa.Op:
    manage, manage_ok = _manage_shapes()
    return oa.Op({
        "operationId": "unload_model", "summary": "Unload a model once its requests in flight end",
        "tags": ["llama-server"], "requestBody": oa.body(manage, {"model": d.example_model}),
        "responses": {"200": {"description": "Unloaded: its memory is released (it loads again on its next "
                              "request unless --no-models-autoload)",
                              "content": {oa.JSON: {"schema": manage_ok}}}},
    }, (400, 404, 413))


@_route("/models/unload", methods=("POST",), doc=_unload_doc)
def unload_model() -> Any:
    """Unload a model once its requests in flight have ended (it waits for them; new requests
    wait for the unload); answers when its memory is released."""
    return _manage(models().unload)


def _props_doc(d: oa.Doc) -> oa.Op:
    return oa.Op({
        "operationId": "props", "summary": "Model name, template and default settings", "tags": ["llama-server"],
        "parameters": [d.model_query(checked=True)],
        "responses": {"200": {"description": "The model's properties",
                              "content": {oa.JSON: {"schema": oa.ref("Props")}}},
                      "503": oa.error(503, text="Code not_ready: the model is not loaded (or shutting_down)")},
    }, (404,))


@_route("/props", doc=_props_doc)
def props() -> Any:
    if not models().is_router and request.args.get("model"):
        resolve_model({"model": request.args["model"]})  # checked, as it always was; the answer names the model
    name = optional_model()
    entry = _entry(name)
    info = _info(entry)
    if info is None or entry.status not in (ModelStatus.LOADED, ModelStatus.SLEEPING):
        raise _not_ready(entry)
    from bubo.sampling import SamplingParams

    s = entry.spec.settings
    eng = entry.engine
    n_batch, n_ubatch, queue_size = ((eng.n_batch, eng.n_ubatch, eng.queue_size) if eng is not None
                                     else (s.n_batch, s.n_ubatch, s.queue_size))
    given, n_predict = f.server_defaults()
    defaults: dict[str, Any] = {k: (list(v) if isinstance(v, tuple) else v)
                                for k, v in dataclasses.asdict(SamplingParams(**given)).items()}
    defaults["n_predict"] = n_predict if n_predict is not None else -1
    return jsonify({
        "model": name,
        "model_alias": name,
        "model_path": info.path,
        "template": info.chat_template,
        "chat_template": info.chat_template,
        "bos_token": info.bos_token,
        "eos_token": info.eos_token,
        "model_info": {
            "architecture": info.architecture,
            "name": info.name,
            "n_ctx_train": info.n_ctx_train,
            "n_vocab": info.n_vocab,
            "n_embd": info.n_embd,
            "n_layer": info.n_layer,
        },
        "default_generation_settings": {"id": 0, "n_ctx": info.n_ctx, "params": defaults},
        "total_slots": info.n_parallel,
        "n_ctx": info.n_ctx,
        "n_batch": n_batch,
        "n_ubatch": n_ubatch,
        "queue_size": queue_size,
        "modalities": {"vision": False, "audio": False},
        "build_info": f"bubo {bubo.__version__}",
        "is_sleeping": entry.status is ModelStatus.SLEEPING,
    })


# --- slots and metrics --------------------------------------------------------------------


def _slots_doc(d: oa.Doc) -> oa.Op:
    slot_params = [d.model_query(),
                   {"name": "fail_on_no_slot", "in": "query", "required": False, "schema": oa.STR,
                    "description": "1 or true: a 503 no_slot_available when every slot is busy"}]
    slot_responses: oa.Schema = {"200": {"description": "Every slot (none while the model is not loaded)",
                                         "content": {oa.JSON: {"schema": oa.arr(oa.ref("Slot"))}}}}
    if not d.config.slots_enabled:
        slot_responses = {"501": oa.error(501, text="Code not_implemented: /slots is turned off (--no-slots)")}
    return oa.Op({
        "operationId": "slots", "summary": "The slots' state", "tags": ["llama-server"],
        "parameters": slot_params, "responses": slot_responses,
    }, (404,) if d.router else ())


@_route("/slots", "/v1/slots", doc=_slots_doc)
def slots() -> Any:
    if not config().slots_enabled:
        raise ApiError(501, "not_implemented", "the /slots endpoint is turned off (--no-slots)")
    eng = _entry(optional_model()).engine
    out = slots_json(eng.slots()) if eng is not None and eng.ready else []
    if config().caller_names:  # each slot's caller is shown; what another caller asked for is not
        who = callers.caller()
        for s in out:
            if s.get("caller") != who and s.get("params"):
                s["params"] = {}
    if request.args.get("fail_on_no_slot") in ("1", "true") and all(s["is_processing"] for s in out):
        raise ApiError(503, "no_slot_available", "every slot is busy")
    return jsonify(out)


def _metrics_doc(d: oa.Doc) -> oa.Op:
    return oa.Op({
        "operationId": "metrics", "summary": "Prometheus metrics (llamacpp: names)", "tags": ["llama-server"],
        "parameters": [d.model_query()],
        "responses": {"200": oa.text_ok("The Prometheus text exposition; with several models and no ?model=, every "
                                        "model's series with a model label", oa.METRICS_TYPE)},
    }, (404,) if d.router else ())


@_route("/metrics", "/v1/metrics", doc=_metrics_doc)
def metrics() -> Any:
    """llama-server's metrics; with several models and no ?model=, every model's, labelled."""
    reg = models()
    if reg.is_router and not request.args.get("model"):
        per = [({"model": e.name}, e.engine.metrics() if e.engine is not None else _zero()) for e in reg.entries]
    else:
        eng = _entry(optional_model()).engine
        per = [({}, eng.metrics() if eng is not None else _zero())]
    text = prometheus(per)
    if config().caller_names:  # a server with named callers: each one's series (bubo.api.callers)
        text += callers.of_app().prometheus()
    return Response(text, mimetype="text/plain; version=0.0.4")


def _zero() -> EngineMetrics:
    return EngineMetrics()


# --- tokens and templates -----------------------------------------------------------------


def _tokenize_doc(d: oa.Doc) -> oa.Op:
    tok_req = oa.obj({"content": oa.STR, "add_special": oa.OPT_BOOL, "parse_special": oa.OPT_BOOL,
                      "with_pieces": oa.OPT_BOOL,
                      "model": d.optional_model_field()}, ["content"], closed=False)
    piece = oa.obj({"id": oa.NAT, "piece": oa.desc({"anyOf": [oa.STR, oa.BYTES]},
                                                   "the text, or the bytes of a partial UTF-8 "
                                                   "character")}, ["id", "piece"])
    return oa.Op({
        "operationId": "tokenize", "summary": "Text to token ids", "tags": ["llama-server"],
        "requestBody": oa.body(tok_req, {"content": "Hello world"}),
        "responses": {"200": {"description": "The token ids (with with_pieces, each with its text)",
                              "content": {oa.JSON: {"schema": oa.obj({"tokens": {"anyOf": [oa.arr(oa.NAT),
                                                                                           oa.arr(piece)]}},
                                                                     ["tokens"])}}}},
    }, (400, 404, 413, 507) if d.router else (400, 413))


@_route("/tokenize", methods=("POST",), doc=_tokenize_doc)
def tokenize() -> Any:
    body = json_body()
    rt = runtime_of(use_model(optional_model(body)))
    content, add_special, parse_special, with_pieces = _tokenize_fields(body)
    return offload.run(_tokenized, rt, content, add_special, parse_special, with_pieces, what="tokenizing the content",
                       small=offload.small(content) and not with_pieces)


@light(tokenize, "POST")
def _tokenize_light(plain: Plain) -> bytes | None:
    """A short text's ids (no pieces) on the default model, asked with the route's fields only."""
    assert plain.body is not None
    try:
        content, add_special, parse_special, with_pieces = _tokenize_fields(plain.body)
    except ApiError:
        return None
    if plain.body.unread() or with_pieces or not offload.small(content):
        return None
    rt = plain.runtime()
    if rt is None:
        return None
    ids = rt.tokenizer.encode(content, add_special=add_special, parse_special=parse_special)
    return jsonout.encode({"tokens": ids})


def _tokenize_fields(body: dict[str, Any]) -> tuple[str, bool, bool, bool]:
    """(content, add_special, parse_special, with_pieces), with llama-server's defaults: no BOS
    unless asked, special tokens parsed."""
    content = body.get("content")
    if not isinstance(content, str):
        raise ApiError(400, "invalid_request", 'tokenize needs "content": a string')
    return (content, f.bool_field(body, "add_special", False), f.bool_field(body, "parse_special", True),
            f.bool_field(body, "with_pieces", False))


def _tokenized(rt: Runtime, content: str, add_special: bool, parse_special: bool, with_pieces: bool) -> Any:
    ids = rt.tokenizer.encode(content, add_special=add_special, parse_special=parse_special)
    try:
        return _token_listing(rt, ids, with_pieces)
    finally:
        deadline.let_go(ids)  # a 16 MB text's millions of ids, freed without holding the other threads


def _token_listing(rt: Runtime, ids: list[int], with_pieces: bool) -> Any:
    if not with_pieces:
        return jsonout.listing({}, "tokens", len(ids), lambda a, b: ids[a:b])

    def pieces(a: int, b: int) -> list[dict[str, Any]]:
        out = []
        for i in ids[a:b]:
            raw = rt.token_piece(i)
            try:
                piece: Any = raw.decode("utf-8")
            except UnicodeDecodeError:
                piece = list(raw)  # a piece of a UTF-8 character: its bytes, as llama-server gives them
            out.append({"id": i, "piece": piece})
        return out

    return jsonout.listing({}, "tokens", len(ids), pieces)


def _detokenize_doc(d: oa.Doc) -> oa.Op:
    return oa.Op({
        "operationId": "detokenize", "summary": "Token ids to text", "tags": ["llama-server"],
        "requestBody": oa.body(oa.obj({"tokens": oa.arr(oa.NAT), "model": d.optional_model_field()}, ["tokens"],
                                      closed=False),
                               {"tokens": [1, 2, 3]}),
        "responses": {"200": {"description": "The text",
                              "content": {oa.JSON: {"schema": oa.obj({"content": oa.STR}, ["content"])}}}},
    }, (400, 404, 413, 507) if d.router else (400, 413))


@_route("/detokenize", methods=("POST",), doc=_detokenize_doc)
def detokenize() -> Any:
    body = json_body()
    rt = runtime_of(use_model(optional_model(body)))
    ids = body.get("tokens")
    return offload.run(_detokenized, rt, ids, what="detokenizing the tokens",
                       small=offload.small(ids))


def _detokenized(rt: Runtime, ids: Any) -> Any:
    if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise ApiError(400, "invalid_request", 'detokenize needs "tokens": a list of token ids')
    try:
        rt.check_ids(ids)
    except ValueError as e:
        raise ApiError(400, "invalid_request", str(e)) from None
    return jsonify(content=rt.tokenizer.decode(ids))


def _apply_template_doc(d: oa.Doc) -> oa.Op:
    return oa.Op({
        "operationId": "apply_template", "summary": "A chat request rendered into its prompt text",
        "tags": ["llama-server"],
        "requestBody": oa.body(oa.chat_request(d.optional_model_field(), model_required=False, speculative=False),
                               {"messages": [{"role": "user", "content": "Say hi."}]}),
        "responses": {"200": {"description": "The prompt exactly as /v1/chat/completions renders it (stream is "
                              "ignored)",
                              "content": {oa.JSON: {"schema": oa.obj({
                                  "prompt": oa.STR,
                                  "text_spans": oa.desc(oa.arr(oa.arr(oa.NAT, minItems=2, maxItems=2)),
                                                        "[start, end) characters of control-token text from the "
                                                        "request, tokenized as plain text")}, ["prompt"])}}}},
    }, (400, 404, 413, 507) if d.router else (400, 413))


@_route("/apply-template", methods=("POST",), doc=_apply_template_doc)
def apply_template() -> Any:
    """The prompt text a chat body becomes, rendered by the same code as /v1/chat/completions
    (validation, content parts, tool-call arguments, chat_template_kwargs, prefill)."""
    from bubo.api.openai.chat import apply_template_json

    body = json_body()
    rt = runtime_of(use_model(optional_model(body)))
    return jsonout.built(apply_template_json, rt, body, config().allow_special_in_content,
                         what="rendering the chat template")


# --- paths that exist but do nothing on a text model --------------------------------------


def _not_implemented_doc(d: oa.Doc) -> dict[str, oa.Op]:
    out = {}
    for path in map(oa.openapi_path, NOT_IMPLEMENTED):
        for method in ("get", "post"):
            op: oa.Schema = {"operationId": f"not_implemented_{method}_{oa.slug(path)}",
                             "summary": "Not implemented for a text model", "tags": ["bubo"],
                             "responses": {"501": oa.error(501, text="Code not_implemented: not for a text model")}}
            if "{rest}" in path:
                op["parameters"] = [{"name": "rest", "in": "path", "required": True, "schema": oa.STR}]
            out[f"{method} {path}"] = oa.Op(op)
    return out


@_route(*NOT_IMPLEMENTED, methods=("GET", "POST"), doc=_not_implemented_doc)
def not_implemented(rest: str = "") -> Any:
    raise ApiError(501, "not_implemented", f"{request.path} is not implemented for a text model")


# --- debug hooks --------------------------------------------------------------------------


def _debug_prompt_doc(d: oa.Doc) -> oa.Op:
    event = {"type": "object", "required": ["event"], "properties": {"event": oa.enum("token", "finish", "error")}}
    prompt_req = oa.obj({"prompt": {"anyOf": [oa.STR, oa.arr(oa.NAT)]}, "max_tokens": {"type": ["integer", "null"],
                                                                                       "minimum": 1},
                         "temperature": oa.NUM, "seed": oa.INT, "stop": {"anyOf": [oa.arr(oa.STR), {"type": "null"}]},
                         "n_probs": oa.NAT, "cache_prompt": oa.OPT_BOOL, "stream": oa.OPT_BOOL,
                         "model": d.optional_model_field()}, ["prompt"], closed=False)
    return oa.Op({
        "operationId": "debug_prompt", "summary": "Generate from a raw prompt (--debug-hooks; not an API)",
        "tags": ["debug"], "requestBody": oa.body(prompt_req, {"prompt": "Hello", "max_tokens": 4}),
        "responses": {"200": oa.ok(oa.obj({"content": oa.STR, "events": oa.arr(event)}, ["content", "events"]),
                                   "Every event of the generation.", oa.sse_data(event, done=True),
                                   "each event, then [DONE].")},
    }, (400, 404, 413, 500, 507) if d.router else (400, 413, 500, 507))


@oa.route(debug_blueprint, "/debug/prompt", methods=("POST",), doc=_debug_prompt_doc)
def debug_prompt() -> Any:
    """Generate from a raw prompt (text, or token ids) straight through Engine.submit; streams
    each event with "stream": true. For tests and diagnosis, not an API."""
    from bubo.sampling import SamplingParams

    body = json_body()
    engine = use_model(optional_model(body))
    rt = runtime_of(engine)
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        ids = rt.tokenizer.encode(prompt, add_special=True, parse_special=True)
    elif isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        ids = prompt
    else:
        raise ApiError(400, "invalid_request", '"prompt" must be text or a list of token ids')
    try:
        temperature = float(body.get("temperature", 0.0))
        if not abs(temperature) <= f.FLT_MAX:
            raise ValueError(f"temperature must be a finite number, got {body.get('temperature')!r}")
        params = SamplingParams(temperature=temperature, seed=int(body.get("seed", 0)))
        max_tokens = body.get("max_tokens")
        if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens <= 0):
            raise ValueError(f"max_tokens must be a positive integer or null, got {max_tokens!r}")
    except (ValueError, TypeError, OverflowError) as e:
        raise ApiError(400, "invalid_request", str(e)) from None
    stop = f.stop_list(body.get("stop"))
    n_probs = f.n_probs_of(body)
    req = GenerationRequest(ids, params, max_tokens, stop, n_probs, body.get("cache_prompt") is not False)
    stream = pipeline.submit(engine, req, debug_mem_available())

    def event_dict(ev: Any) -> dict[str, Any]:
        d = dataclasses.asdict(ev)
        d["event"] = {TokenEvent: "token", FinishEvent: "finish"}.get(type(ev), "error")
        if isinstance(ev, FinishEvent):
            from bubo.api.llamacpp.shapes import timings_json

            d["timings"] = timings_json(ev.timings)
        elif d["event"] == "error":
            err = errors.from_event(ev)
            d.update(reason=ev.reason.value, status=err.status, code=err.code)
        return d

    if body.get("stream"):
        def chunks() -> Any:
            for ev in stream:
                yield event_dict(ev)
            yield "[DONE]"
        return sse_response(chunks(), stream=stream)
    with cancel_on_disconnect(stream):
        events = [event_dict(ev) for ev in stream]
    if not events or events[-1]["event"] == "token":
        raise ApiError(499, "client_closed_request", "the client went away")  # nobody reads this
    return jsonify(content="".join(e.get("text", "") for e in events if e["event"] == "token"), events=events)


def _debug_cache_doc(d: oa.Doc) -> oa.Op:
    cache = oa.obj({"n_ctx": oa.NAT, "block_size": oa.NAT, "used_blocks": oa.NAT, "cached_blocks": oa.NAT,
                    "slots": oa.arr(oa.obj({"id": oa.NAT, "n_tokens": oa.NAT, "tokens": oa.arr(oa.NAT)},
                                           ["id", "n_tokens", "tokens"]))},
                   ["n_ctx", "block_size", "used_blocks", "cached_blocks", "slots"])
    return oa.Op({
        "operationId": "debug_cache", "summary": "The KV cache's blocks and slots (--debug-hooks)", "tags": ["debug"],
        "parameters": [d.model_query()],
        "responses": {"200": {"description": "What the cache holds", "content": {oa.JSON: {"schema": cache}}}},
    }, (404, 507) if d.router else ())


@oa.route(debug_blueprint, "/debug/cache", doc=_debug_cache_doc)
def debug_cache() -> Any:
    engine = use_model(optional_model())
    try:
        view = engine.cache_view()
    except EngineRefusal as e:
        raise errors.from_refusal(e) from None
    return jsonify(n_ctx=view.n_ctx, block_size=view.block_size, used_blocks=view.used_blocks,
                   cached_blocks=view.cached_blocks,
                   slots=[{"id": i, "n_tokens": len(toks), "tokens": toks} for i, toks in view.slots])


def _debug_settings_doc(d: oa.Doc) -> oa.Op:
    settings = oa.obj({"config": oa.ANY_OBJECT, "model": oa.STR, "model_path": {"type": ["string", "null"]},
                       "n_ctx": {"type": ["integer", "null"]}, "n_threads": {"type": ["integer", "null"]}},
                      ["config", "model", "model_path", "n_ctx", "n_threads"])
    return oa.Op({
        "operationId": "debug_settings", "summary": "The server's settings (--debug-hooks)", "tags": ["debug"],
        "parameters": [d.model_query()],
        "responses": {"200": {"description": "The settings", "content": {oa.JSON: {"schema": settings}}}},
    }, (404,) if d.router else ())


@oa.route(debug_blueprint, "/debug/settings", doc=_debug_settings_doc)
def debug_settings() -> Any:
    cfg = dataclasses.asdict(config())
    cfg["api_keys"] = [f"<{len(cfg['api_keys'])} keys>"] if cfg["api_keys"] else []
    entry = _entry(optional_model())
    eng = entry.engine
    return jsonify(config=cfg, model=entry.spec.source, model_path=eng.model_path if eng is not None else None,
                   n_ctx=eng.n_ctx if eng is not None else None,
                   n_threads=eng.n_threads if eng is not None else None)
