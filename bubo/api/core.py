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
from bubo.api import errors, jsonout, offload, pipeline
from bubo.api import fields as f
from bubo.api.errors import ApiError
from bubo.api.llamacpp.shapes import prometheus, slots_json
from bubo.api.request import (
    config,
    debug_mem_available,
    json_body,
    models,
    optional_model,
    resolve_model,
    runtime_of,
    use_model,
)
from bubo.api.sse import cancel_on_disconnect, sse_response
from bubo.engine.engine import ModelInfo
from bubo.engine.registry import ModelEntry, ModelStatus
from bubo.engine.types import EngineMetrics, EngineRefusal, FinishEvent, GenerationRequest, TokenEvent
from bubo.runtime import Runtime

blueprint = Blueprint("core", __name__)
debug_blueprint = Blueprint("debug", __name__, url_prefix="/debug")

STARTED = int(time.time())

NOT_IMPLEMENTED = ["/v1/rerank", "/v1/reranking", "/rerank", "/sdapi/v1/<path:rest>"]


def _route(*paths: str, methods: tuple[str, ...] = ("GET",)) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        for p in paths:
            blueprint.add_url_rule(p, fn.__name__ + p, fn, methods=list(methods))
        return fn
    return deco


def _entry(name: str) -> ModelEntry:
    return models().lookup(name)


def _info(entry: ModelEntry) -> ModelInfo | None:
    eng = entry.engine
    return eng.info if eng is not None and eng.info is not None else entry.info


def _not_ready(entry: ModelEntry) -> ApiError:
    status = entry.status
    if status is ModelStatus.FAILED:  # trying again does not help: no Retry-After
        return ApiError(503, "not_ready", f"the model {entry.name} failed to load: {entry.failure}")
    retry = {"Retry-After": str(errors.LOADING_RETRY_AFTER_SECONDS)}
    if status is ModelStatus.LOADING:
        return ApiError(503, "not_ready", f"the model {entry.name} is loading; try again when /ready says ready",
                        headers=retry)
    return ApiError(503, "not_ready", f"the model {entry.name} is {status.value}", headers=retry)


# --- health and readiness ----------------------------------------------------------------


@_route("/health", "/v1/health", "/healthz")
def health() -> Any:
    return jsonify(status="ok")


@_route("/ready", "/v1/ready", "/readyz")
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


def _model_json(name: str, entry: ModelEntry) -> dict[str, Any]:
    info = _info(entry)
    eng = entry.engine
    n_ctx = info.n_ctx if info is not None else (eng.n_ctx if eng is not None else entry.spec.settings.n_ctx)
    n_ctx_train = info.n_ctx_train if info is not None else None
    out: dict[str, Any] = {
        "id": name,
        "object": "model",
        "created": STARTED,
        "owned_by": "bubo",
        "context_length": n_ctx,
        "max_model_len": n_ctx,
        "meta": {"n_ctx": n_ctx, "n_ctx_train": n_ctx_train},
        "architecture": {"input_modalities": ["text"]},
        "status": _status_json(entry),
    }
    if name != entry.name:
        out["alias_of"] = entry.name
    else:
        out["aliases"] = list(entry.spec.aliases)
        out["path"] = entry.spec.source
    return out


@_route("/v1/models", "/models")
def list_models() -> Any:
    """Every name a request may use (model ids first, then aliases), each with its model's
    context and status (unloaded, loading, loaded, unloading, sleeping, failed)."""
    reg = models()
    return jsonify(object="list", data=[_model_json(n, reg.lookup(n)) for n in reg.names()])


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


@_route("/models/load", methods=("POST",))
def load_model() -> Any:
    """Start loading a model (a failed one tries again); answers at once: GET /models shows when
    it is loaded. Loading past --models-max first unloads the least recently used idle model."""
    return _manage(models().load)


@_route("/models/unload", methods=("POST",))
def unload_model() -> Any:
    """Unload a model once its requests in flight have ended (it waits for them; new requests
    wait for the unload); answers when its memory is released."""
    return _manage(models().unload)


@_route("/props")
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


@_route("/slots", "/v1/slots")
def slots() -> Any:
    if not config().slots_enabled:
        raise ApiError(501, "not_implemented", "the /slots endpoint is turned off (--no-slots)")
    eng = _entry(optional_model()).engine
    out = slots_json(eng.slots()) if eng is not None and eng.ready else []
    if request.args.get("fail_on_no_slot") in ("1", "true") and all(s["is_processing"] for s in out):
        raise ApiError(503, "no_slot_available", "every slot is busy")
    return jsonify(out)


@_route("/metrics", "/v1/metrics")
def metrics() -> Any:
    """llama-server's metrics; with several models and no ?model=, every model's, labelled."""
    reg = models()
    if reg.is_router and not request.args.get("model"):
        per = [({"model": e.name}, e.engine.metrics() if e.engine is not None else _zero()) for e in reg.entries]
    else:
        eng = _entry(optional_model()).engine
        per = [({}, eng.metrics() if eng is not None else _zero())]
    return Response(prometheus(per), mimetype="text/plain; version=0.0.4")


def _zero() -> EngineMetrics:
    return EngineMetrics()


# --- tokens and templates -----------------------------------------------------------------


@_route("/tokenize", methods=("POST",))
def tokenize() -> Any:
    body = json_body()
    rt = runtime_of(use_model(optional_model(body)))
    content = body.get("content")
    if not isinstance(content, str):
        raise ApiError(400, "invalid_request", 'tokenize needs "content": a string')
    # llama-server's defaults: no BOS unless asked, special tokens parsed
    add_special = f.bool_field(body, "add_special", False)
    parse_special = f.bool_field(body, "parse_special", True)
    with_pieces = f.bool_field(body, "with_pieces", False)
    return offload.run(_tokenized, rt, content, add_special, parse_special, with_pieces, what="tokenizing the content")


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


@_route("/detokenize", methods=("POST",))
def detokenize() -> Any:
    body = json_body()
    rt = runtime_of(use_model(optional_model(body)))
    return offload.run(_detokenized, rt, body.get("tokens"), what="detokenizing the tokens")


def _detokenized(rt: Runtime, ids: Any) -> Any:
    if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise ApiError(400, "invalid_request", 'detokenize needs "tokens": a list of token ids')
    try:
        rt.check_ids(ids)
    except ValueError as e:
        raise ApiError(400, "invalid_request", str(e)) from None
    return jsonify(content=rt.tokenizer.decode(ids))


@_route("/apply-template", methods=("POST",))
def apply_template() -> Any:
    """The prompt text a chat body becomes, rendered by the same code as /v1/chat/completions
    (validation, content parts, tool-call arguments, chat_template_kwargs, prefill)."""
    from bubo.api.openai.chat import apply_template_json

    body = json_body()
    rt = runtime_of(use_model(optional_model(body)))
    return jsonout.built(apply_template_json, rt, body, config().allow_special_in_content,
                         what="rendering the chat template")


# --- paths that exist but do nothing on a text model --------------------------------------


def _not_implemented(rest: str = "") -> Any:
    raise ApiError(501, "not_implemented", f"{request.path} is not implemented for a text model")


for _p in NOT_IMPLEMENTED:
    blueprint.add_url_rule(_p, "not_implemented" + _p, _not_implemented, methods=["GET", "POST"])


# --- debug hooks --------------------------------------------------------------------------


@debug_blueprint.route("/prompt", methods=["POST"])
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


@debug_blueprint.route("/cache", methods=["GET"])
def debug_cache() -> Any:
    engine = use_model(optional_model())
    try:
        view = engine.cache_view()
    except EngineRefusal as e:
        raise errors.from_refusal(e) from None
    return jsonify(n_ctx=view.n_ctx, block_size=view.block_size, used_blocks=view.used_blocks,
                   cached_blocks=view.cached_blocks,
                   slots=[{"id": i, "n_tokens": len(toks), "tokens": toks} for i, toks in view.slots])


@debug_blueprint.route("/settings", methods=["GET"])
def debug_settings() -> Any:
    cfg = dataclasses.asdict(config())
    cfg["api_keys"] = [f"<{len(cfg['api_keys'])} keys>"] if cfg["api_keys"] else []
    entry = _entry(optional_model())
    eng = entry.engine
    return jsonify(config=cfg, model=entry.spec.source, model_path=eng.model_path if eng is not None else None,
                   n_ctx=eng.n_ctx if eng is not None else None,
                   n_threads=eng.n_threads if eng is not None else None)
