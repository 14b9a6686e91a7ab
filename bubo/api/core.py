"""The server's own routes: health, ready, models, props, slots, metrics, tokenize, detokenize,
apply-template, the 501 paths, and /debug/* (only with --debug-hooks on a loopback address)."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from flask import Blueprint, Response, jsonify, request

import bubo
from bubo.api.errors import ApiError
from bubo.api.request import config, engine, json_body, ready_engine, resolve_model, submit
from bubo.api.sse import cancel_on_disconnect, sse_response

blueprint = Blueprint("core", __name__)
debug_blueprint = Blueprint("debug", __name__, url_prefix="/debug")

STARTED = int(time.time())

NOT_IMPLEMENTED = ["/v1/embeddings", "/v1/rerank", "/v1/reranking", "/rerank", "/infill",
                   "/sdapi/v1/<path:rest>"]


def _route(*paths: str, methods: tuple[str, ...] = ("GET",)) -> Any:
    def deco(f: Any) -> Any:
        for p in paths:
            blueprint.add_url_rule(p, f.__name__ + p, f, methods=list(methods))
        return f
    return deco


# --- health and readiness ----------------------------------------------------------------


@_route("/health", "/v1/health", "/healthz")
def health() -> Any:
    return jsonify(status="ok")


@_route("/ready", "/v1/ready", "/readyz")
def ready() -> Any:
    ready_engine()
    return jsonify(status="ready", model=config().served_model_name)


# --- models and properties ----------------------------------------------------------------


@_route("/v1/models", "/models")
def models() -> Any:
    eng = engine()
    n_ctx = eng.n_ctx
    data = [{
        "id": name,
        "object": "model",
        "created": STARTED,
        "owned_by": "bubo",
        "context_length": n_ctx,
        "max_model_len": n_ctx,
        "meta": {"n_ctx": n_ctx, "n_ctx_train": eng.n_ctx_train},
        "architecture": {"input_modalities": ["text"]},
    } for name in config().model_names]
    return jsonify(object="list", data=data)


@_route("/props")
def props() -> Any:
    if request.args.get("model"):
        resolve_model({"model": request.args["model"]})
    eng = ready_engine()
    from bubo.sampling import SamplingParams

    tok = eng.tokenizer
    md = eng.metadata
    arch = md.get("general.architecture", "")

    def text_of(i: int | None) -> str:
        return tok.token_text(i).decode("utf-8", "replace") if i is not None else ""

    defaults = {k: (list(v) if isinstance(v, tuple) else v)
                for k, v in dataclasses.asdict(SamplingParams()).items()}
    cfg = config()
    return jsonify({
        "model": cfg.served_model_name,
        "model_alias": cfg.served_model_name,
        "model_path": eng.model_path,
        "template": eng.chat_template,
        "chat_template": eng.chat_template,
        "bos_token": text_of(tok.bos_id),
        "eos_token": text_of(tok.eos_id),
        "model_info": {
            "architecture": arch,
            "name": md.get("general.name"),
            "n_ctx_train": eng.n_ctx_train,
            "n_vocab": tok.n_vocab,
            "n_embd": md.get(f"{arch}.embedding_length"),
            "n_layer": md.get(f"{arch}.block_count"),
        },
        "default_generation_settings": {"id": 0, "n_ctx": eng.n_ctx, "params": defaults},
        "total_slots": eng.n_parallel,
        "n_ctx": eng.n_ctx,
        "n_batch": eng.n_batch,
        "n_ubatch": eng.n_ubatch,
        "queue_size": eng.queue_size,
        "modalities": {"vision": False, "audio": False},
        "build_info": f"bubo {bubo.__version__}",
        "is_sleeping": False,
    })


# --- slots and metrics --------------------------------------------------------------------


@_route("/slots", "/v1/slots")
def slots() -> Any:
    if not config().slots_enabled:
        raise ApiError(501, "not_implemented", "the /slots endpoint is turned off (--no-slots)")
    eng = engine()
    if not eng.ready:
        return jsonify([])
    out = eng.slots()
    if request.args.get("fail_on_no_slot") in ("1", "true") and all(s["is_processing"] for s in out):
        raise ApiError(503, "no_slot_available", "every slot is busy")
    return jsonify(out)


# (name, type, help): llama-server's names, under the llamacpp: prefix
METRICS = [
    ("requests_total", "counter", "Requests started since start."),
    ("prompt_tokens_total", "counter", "Prompt tokens processed (not counting those reused from the cache)."),
    ("prompt_tokens_cached_total", "counter", "Prompt tokens reused from the slot's cache."),
    ("prompt_seconds_total", "counter", "Prompt processing time, seconds."),
    ("tokens_predicted_total", "counter", "Generated tokens."),
    ("tokens_predicted_seconds_total", "counter", "Generation time, seconds."),
    ("n_decode_total", "counter", "Decode calls (batches)."),
    ("n_tokens_max", "counter", "Largest number of tokens the slot's cache has held."),
    ("n_drafted_total", "counter", "Speculative decoding: draft tokens proposed."),
    ("n_drafted_accepted_total", "counter", "Speculative decoding: draft tokens accepted."),
    ("prompt_tokens_seconds", "gauge", "Average prompt throughput, tokens/s."),
    ("predicted_tokens_seconds", "gauge", "Average generation throughput, tokens/s."),
    ("n_busy_slots_per_decode", "gauge", "Average busy slots per decode call."),
    ("kv_cache_usage_ratio", "gauge", "KV cache usage (1 = full): blocks held by slots or kept for the prefix cache."),
    ("kv_cache_tokens", "gauge", "Tokens in the KV cache."),
    ("requests_processing", "gauge", "Requests being processed."),
    ("requests_deferred", "gauge", "Requests waiting for a slot."),
    ("n_preemptions_total", "counter", "Requests that gave their slot back when the KV cache was full (resumed later)."),
    ("kv_cache_used_blocks", "gauge", "KV cache blocks held by slots."),
    ("kv_cache_cached_blocks", "gauge", "KV cache blocks no slot holds, kept for the prefix cache."),
    ("prefix_cache_hit_ratio", "gauge", "Prompt tokens reused from the prefix cache / prompt tokens, since start."),
    ("time_to_first_token_seconds", "histogram", "Time from a request's arrival to its first token."),
    ("queue_wait_seconds", "histogram", "Time a request waited for a slot."),
]


@_route("/metrics", "/v1/metrics")
def metrics() -> Any:
    eng = engine()
    values = eng.metrics() if eng.ready else {}
    lines = []
    for name, kind, help_ in METRICS:
        full = "llamacpp:" + name
        lines += [f"# HELP {full} {help_}", f"# TYPE {full} {kind}"]
        if kind == "histogram":
            h = values.get(name) or {"buckets": [("+Inf", 0)], "sum": 0.0, "count": 0}
            lines += [f'{full}_bucket{{le="{le}"}} {n}' for le, n in h["buckets"]]
            lines += [f"{full}_sum {_num(float(h['sum']))}", f"{full}_count {h['count']}"]
        else:
            lines.append(f"{full} {_num(values.get(name, 0))}")
    return Response("\n".join(lines) + "\n", mimetype="text/plain; version=0.0.4")


def _num(v: Any) -> str:
    return str(int(v)) if isinstance(v, bool) or (isinstance(v, int)) else repr(float(v))


# --- tokens and templates -----------------------------------------------------------------


def _bool(body: dict[str, Any], key: str, default: bool) -> bool:
    v = body.get(key, default)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise ApiError(400, "invalid_type", f"{key} must be true or false, not {v!r}")
    return v


@_route("/tokenize", methods=("POST",))
def tokenize() -> Any:
    body = json_body()
    eng = ready_engine()
    content = body.get("content")
    if not isinstance(content, str):
        raise ApiError(400, "invalid_request", 'tokenize needs "content": a string')
    # llama-server's defaults: no BOS unless asked, special tokens parsed
    ids = eng.tokenizer.encode(content, add_special=_bool(body, "add_special", False),
                               parse_special=_bool(body, "parse_special", True))
    if not _bool(body, "with_pieces", False):
        return jsonify(tokens=ids)
    out = []
    for i in ids:
        raw = eng.tokenizer.token_to_piece(i, special=True)
        try:
            piece: Any = raw.decode("utf-8")
        except UnicodeDecodeError:
            piece = list(raw)  # a piece of a UTF-8 character: its bytes, as llama-server gives them
        out.append({"id": i, "piece": piece})
    return jsonify(tokens=out)


@_route("/detokenize", methods=("POST",))
def detokenize() -> Any:
    body = json_body()
    eng = ready_engine()
    ids = body.get("tokens")
    if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise ApiError(400, "invalid_request", 'detokenize needs "tokens": a list of token ids')
    try:
        text = eng.model.detokenize(ids)
    except ValueError as e:
        raise ApiError(400, "invalid_request", str(e)) from None
    return jsonify(content=text)


@_route("/apply-template", methods=("POST",))
def apply_template() -> Any:
    """The prompt text a chat body becomes, rendered by the same code as /v1/chat/completions
    (validation, content parts, tool-call arguments, chat_template_kwargs, prefill)."""
    from bubo.api.openai.chat import apply_template as render

    body = json_body()
    return jsonify(prompt=render(ready_engine(), body))


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
    from bubo.engine import FinishEvent, GenerationRequest, TokenEvent
    from bubo.sampling import SamplingParams

    body = json_body()
    eng = ready_engine()
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        ids = eng.tokenizer.encode(prompt, add_special=True, parse_special=True)
    elif isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        ids = prompt
    else:
        raise ApiError(400, "invalid_request", '"prompt" must be text or a list of token ids')
    try:
        params = SamplingParams(temperature=float(body.get("temperature", 0.0)), seed=int(body.get("seed", 0)))
        max_tokens = body.get("max_tokens")
        if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens <= 0):
            raise ValueError(f"max_tokens must be a positive integer or null, got {max_tokens!r}")
        stop = list(body.get("stop") or [])
        n_probs = int(body.get("n_probs", 0))
    except (ValueError, TypeError) as e:
        raise ApiError(400, "invalid_request", str(e)) from None
    stream = submit(GenerationRequest(ids, params, max_tokens, stop, n_probs, body.get("cache_prompt") is not False))

    def event_dict(ev: Any) -> dict[str, Any]:
        d = dataclasses.asdict(ev)
        d["event"] = {TokenEvent: "token", FinishEvent: "finish"}.get(type(ev), "error")
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
    return jsonify(ready_engine().cache_view())


@debug_blueprint.route("/settings", methods=["GET"])
def debug_settings() -> Any:
    cfg = dataclasses.asdict(config())
    cfg["api_keys"] = [f"<{len(cfg['api_keys'])} keys>"] if cfg["api_keys"] else []
    eng = engine()
    return jsonify(config=cfg, model=eng.model_name, model_path=eng.model_path, n_ctx=eng.n_ctx,
                   n_threads=eng.n_threads)
