"""Ollama's routes (/api/*), on the same server and models as the other dialects: chat and
generate (NDJSON streams unless "stream": false), the model routes (version, tags, show, ps) and
the store's (pull, delete, copy). Errors are Ollama's {"error": "..."} (bubo.api.errors picks
the shape by path)."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator
from typing import Any

from flask import Blueprint, Response, jsonify, request

import bubo
from bubo import embed as embedding
from bubo import store
from bubo._grammar import Grammar
from bubo.api import embeddings as emb
from bubo.api import fields as f
from bubo.api import jsonout, offload, pipeline
from bubo.api import openapi as oa
from bubo.api.config import is_loopback
from bubo.api.errors import ApiError, StreamShape, stream_error
from bubo.api.fields import invalid
from bubo.api.ollama import models as om
from bubo.api.ollama import openapi as od
from bubo.api.ollama import shapes as sh
from bubo.api.openai.chat import logprob_entry
from bubo.api.pipeline import Conversation, Output
from bubo.api.request import config, debug_mem_available, json_body, models, runtime_of, use_model
from bubo.api.sse import ndjson_response
from bubo.chat import fim
from bubo.chat.parsers import OutputParser, Part
from bubo.chat.thinking import template_thinks
from bubo.engine.protocol import ServingEngine, Stream
from bubo.engine.registry import UnknownModelError, did_you_mean
from bubo.engine.types import FinishEvent, GenerationRequest, TokenEvent
from bubo.runtime import Runtime
from bubo.sampling import SamplingParams

log = logging.getLogger("bubo.api")
blueprint = Blueprint("ollama", __name__)
oa.components(blueprint, od.shapes)


def served(name: str) -> str:
    """The registry's name for a request's model (any name it answers to: the registry's
    lookup). 404 in Ollama's words when no model is called that."""
    reg = models()
    try:
        reg.lookup(name)
        return name
    except UnknownModelError as e:
        listed = ", ".join(f"'{sh.tagged(n)}'" for n in reg.names())
        raise ApiError(404, "model_not_found",
                       f"model '{name}' not found{did_you_mean(e.close)}; this server serves {listed}") from None


def _keep_alive(name: str, seconds: float | None) -> None:
    if seconds is not None and _may_set_keep_alive(name, seconds):
        models().keep_alive(name, seconds)


def _may_set_keep_alive(name: str, seconds: float) -> bool:
    """A keep_alive that shortens how long the model stays loaded (0: unload it now) changes it
    for every client: only a caller allowed to manage models may (one with an API key, or on
    loopback when the server has no keys). Any caller may lengthen it. Refused: a note in the
    log, and the request goes on as if it had none."""
    reg = models()
    entry = reg.lookup(name)
    now = entry.idle_limit(reg.sleep_idle_s)
    if seconds >= (math.inf if now is None else now):
        return True
    if config().api_keys or is_loopback(request.remote_addr or ""):
        return True
    log.info("keep_alive %g s from %s for %s ignored: only a client with an API key, or on this machine, may "
             "shorten how long a model stays loaded", seconds, request.remote_addr, entry.name)
    return False


def _loaded(name: str, seconds: float | None, key: str) -> Any:
    """A request without a prompt: Ollama's way to load a model (or, with keep_alive 0, to
    unload it): answered at once with done_reason load or unload."""
    body: dict[str, Any] = {"model": sh.tagged(name), "created_at": sh.timestamp()}
    if key == "message":
        body["message"] = {"role": "assistant", "content": ""}
    else:
        body["response"] = ""
    if seconds == 0:
        if _may_set_keep_alive(name, seconds):
            models().unload(name, sleeping=True)
            return jsonify({**body, "done_reason": "unload", "done": True})
        seconds = None  # refused (and logged): a load
    use_model(name)
    _keep_alive(name, seconds)
    return jsonify({**body, "done_reason": "load", "done": True})


# --- chat and generate ---------------------------------------------------------------------


class _Lines:
    """Engine events -> Ollama's objects: text under `key` ("message" for chat, "response" for
    generate), reasoning as thinking, tool calls as they complete, log probabilities with the
    text they made; the last object has done, done_reason and the counts."""

    def __init__(self, rt: Runtime, name: str, key: str, n_logprobs: int | None, t0: float, load_s: float):
        self.rt, self.name, self.key = rt, sh.tagged(name), key
        self.n_logprobs = n_logprobs  # None: no logprobs
        self.t0, self.load_s = t0, load_s
        self.pending: list[dict[str, Any]] = []  # log probabilities not sent yet
        self.n_calls = 0

    def logprob(self, ev: TokenEvent) -> None:
        if self.n_logprobs is not None:
            top = [(self.rt.token_piece(t), lp) for t, lp in ev.top[: self.n_logprobs]]
            self.pending.append(logprob_entry(self.rt.token_piece(ev.token), ev.logprob, top))

    def _body(self, content: str, reasoning: str, calls: list[Any]) -> dict[str, Any]:
        out: dict[str, Any] = {"model": self.name, "created_at": sh.timestamp()}
        if self.key == "message":
            msg: dict[str, Any] = {"role": "assistant", "content": content}
            if reasoning:
                msg["thinking"] = reasoning
            if calls:
                msg["tool_calls"] = sh.tool_calls_json(calls, self.n_calls)
                self.n_calls += len(calls)
            out["message"] = msg
        else:
            out["response"] = content
            if reasoning:
                out["thinking"] = reasoning
        if self.pending:
            out["logprobs"], self.pending = self.pending, []
        return out

    def chunk(self, parts: list[Part]) -> dict[str, Any] | None:
        content = "".join(p.text for p in parts if p.kind == "content")
        reasoning = "".join(p.text for p in parts if p.kind == "reasoning")
        calls = [p.call for p in parts if p.call is not None]
        if not (content or reasoning or calls):
            return None
        return {**self._body(content, reasoning, calls), "done": False}

    def final(self, fin: FinishEvent, extra: dict[str, Any] | None = None, out: Output | None = None) -> dict[str, Any]:
        if out is None:
            body = self._body("", "", [])
        else:
            body = self._body(out.content, out.reasoning, out.tool_calls)
        return {**body, "done": True, "done_reason": sh.done_reason(fin),
                **sh.stats(fin, time.monotonic() - self.t0, self.load_s), **(extra or {})}


def _respond(stream: Stream, parser: OutputParser | None, lines: _Lines, as_stream: bool,
             extra: Any = None) -> Any:
    """The answer: one object (as_stream False) or NDJSON lines. extra(out tokens) -> the final
    object's additional fields (generate's context)."""
    def more(tokens: list[int]) -> dict[str, Any]:
        return extra(tokens) if extra is not None else {}

    if not as_stream:
        out = pipeline.collect(stream, parser)

        def answer() -> dict[str, Any]:
            for t in out.tokens:
                lines.logprob(t)
            return lines.final(out.finished, more([t.token for t in out.tokens]), out)

        return jsonout.built(answer)

    def gen() -> Iterator[Any]:
        ids: list[int] = []
        try:
            for parts, ev in pipeline.run_events(stream, parser, stream.end):
                if isinstance(ev, TokenEvent):
                    ids.append(ev.token)
                    lines.logprob(ev)
                    line = lines.chunk(parts)
                    if line is not None:
                        yield line
                elif isinstance(ev, FinishEvent):
                    line = lines.chunk(parts)
                    if line is not None:
                        yield line
                    yield lines.final(ev, more(ids))
        except ApiError as e:
            yield stream_error(StreamShape.OLLAMA, e)

    return ndjson_response(gen(), stream=stream)


def _thinking(body: dict[str, Any], rt: Runtime, name: str) -> tuple[bool, dict[str, Any]]:
    return sh.think_of(body, template_thinks(rt.chat_template_source), sh.tagged(name))


def _submit(engine: ServingEngine, tokens: list[int], params: SamplingParams, max_tokens: int | None,
            num_ctx: int | None, stop: list[str], grammar: Grammar | None) -> Stream:
    gen = GenerationRequest(tokens, params, sh.fit_context(max_tokens, num_ctx, len(tokens)), stop, params.n_probs,
                            grammar=grammar)
    return pipeline.submit(engine, gen, debug_mem_available())


def _engine(name: str, keep_alive: float | None, t0: float) -> tuple[ServingEngine, Runtime, float]:
    """The model's engine and runtime (loaded first if need be), the seconds that took, and the
    request's keep_alive applied."""
    engine = use_model(name)
    load_s = time.monotonic() - t0
    _keep_alive(name, keep_alive)
    return engine, runtime_of(engine), load_s


def _chat_doc(d: oa.Doc) -> oa.Op:
    return oa.Op({
        "operationId": "ollama_chat", "summary": "Chat (Ollama)", "tags": [od.TAG],
        "requestBody": oa.body(od.chat_request(d), {"model": d.example_model, "stream": False,
                                                    "messages": [{"role": "user", "content": "Say hi."}],
                                                    "options": {"num_predict": 8}}),
        "responses": {"200": od.ok("OllamaChat", "The answer; NDJSON lines unless stream is false, the last with "
                                   "\"done\": true and the counts; an error after the 200 is an "
                                   "{\"error\"} line.")},
    }, od.GEN_ERRORS, ollama=True)


@oa.route(blueprint, "/api/chat", methods=("POST",), doc=_chat_doc)
def chat() -> Any:
    t0 = time.monotonic()
    body = json_body()
    name = served(sh.model_name(body))
    req = offload.run(sh.parse_chat, body, what="reading the request's fields")
    if req is None:
        return _loaded(name, sh.keep_alive_of(body.get("keep_alive")), "message")
    engine, rt, load_s = _engine(name, req.keep_alive, t0)
    req.thinking, req.template_kwargs = _thinking(body, rt, name)
    prep = pipeline.prepare(rt, req, config().allow_special_in_content)
    stream = _submit(engine, prep.prompt.tokens, req.params, req.max_tokens, req.num_ctx, req.stop, prep.grammar)
    lines = _Lines(rt, name, "message", req.top_logprobs if req.logprobs else None, t0, load_s)
    return _respond(stream, prep.parser, lines, req.stream)


def _generate_doc(d: oa.Doc) -> oa.Op:
    return oa.Op({
        "operationId": "ollama_generate", "summary": "Generate from a prompt (Ollama)", "tags": [od.TAG],
        "requestBody": oa.body(od.generate_request(d), {"model": d.example_model, "prompt": "Say hi.", "stream": False,
                                                        "options": {"num_predict": 8}}),
        "responses": {"200": od.ok("OllamaGenerate", "The answer, as /api/chat's but under response.")},
    }, od.GEN_ERRORS, ollama=True)


@oa.route(blueprint, "/api/generate", methods=("POST",), doc=_generate_doc)
def generate() -> Any:
    t0 = time.monotonic()
    body = json_body()
    name = served(sh.model_name(body))
    req = offload.run(sh.parse_generate, body, what="reading the request's fields")
    if not (req.prompt or req.suffix or req.context):
        return _loaded(name, req.keep_alive, "response")
    engine, rt, load_s = _engine(name, req.keep_alive, t0)
    parser: OutputParser | None = None
    if req.suffix:  # fill in the middle
        tokens = pipeline.offloaded(fim.fim_prompt, rt, req.prompt, req.suffix, name=sh.tagged(name),
                                    what="tokenizing the prompt")
        grammar = pipeline.completion_grammar(req.output, rt)
    elif req.raw:
        tokens = pipeline.encode(rt, req.prompt, add_special=not req.context)
        grammar = pipeline.completion_grammar(req.output, rt)
    else:
        thinking, kwargs = _thinking(body, rt, name)
        messages = ([{"role": "system", "content": req.system}] if req.system else []) + \
            [{"role": "user", "content": req.prompt}]
        conv = Conversation(messages, None, None, thinking, kwargs, req.params, req.max_tokens, req.stream,
                            output=req.output)
        prep = pipeline.prepare(rt, conv, config().allow_special_in_content)
        tokens, grammar, parser = prep.prompt.tokens, prep.grammar, prep.parser
        lead = rt.tokenizer.encode("", add_special=True, parse_special=False)  # BOS, if the model adds one
        if req.context and lead and tokens[: len(lead)] == lead:
            tokens = tokens[len(lead):]  # the context already starts with it
    tokens = req.context + tokens
    stream = _submit(engine, tokens, req.params, req.max_tokens, req.num_ctx, req.stop, grammar)
    lines = _Lines(rt, name, "response", req.top_logprobs if req.logprobs else None, t0, load_s)
    return _respond(stream, parser, lines, req.stream, lambda ids: {"context": tokens + ids})


# --- models --------------------------------------------------------------------------------


def _version_doc(d: oa.Doc) -> oa.Op:
    return oa.Op({
        "operationId": "ollama_version", "summary": "bubo's version (Ollama)", "tags": [od.TAG],
        "responses": {"200": {"description": "The version",
                              "content": {oa.JSON: {"schema": oa.obj({"version": oa.STR}, ["version"])}}}},
    }, ollama=True)


@oa.route(blueprint, "/api/version", doc=_version_doc)
def version() -> Any:
    return jsonify(version=bubo.__version__)


def _tags_doc(d: oa.Doc) -> oa.Op:
    return oa.Op({
        "operationId": "ollama_tags", "summary": "The served models (Ollama)", "tags": [od.TAG],
        "responses": {"200": {"description": "Every name a request may use, tagged",
                              "content": {oa.JSON: {"schema": oa.ref("OllamaTags")}}}},
    }, ollama=True)


@oa.route(blueprint, "/api/tags", doc=_tags_doc)
def tags() -> Any:
    return jsonify(om.tags(models()))


def _show_doc(d: oa.Doc) -> oa.Op:
    named = oa.obj({"model": od.model_field(d), "name": oa.desc(oa.STR, "older clients' name for model")}, closed=False)
    return oa.Op({
        "operationId": "ollama_show", "summary": "A model's details, template and metadata (Ollama)", "tags": [od.TAG],
        "requestBody": oa.body(named, {"model": d.example_model}),
        "responses": {"200": {"description": "What the model's GGUF file says",
                              "content": {oa.JSON: {"schema": oa.ref("OllamaShow")}}}},
    }, (400, 404, 413), ollama=True)


@oa.route(blueprint, "/api/show", methods=("POST",), doc=_show_doc)
def show() -> Any:
    body = json_body()
    name = served(sh.model_name(body))
    reg = models()
    return jsonify(om.show(reg.lookup(name), config().sampling_defaults, reg.adapter_of(name)))


def _ps_doc(d: oa.Doc) -> oa.Op:
    return oa.Op({
        "operationId": "ollama_ps", "summary": "The loaded models (Ollama)", "tags": [od.TAG],
        "responses": {"200": {"description": "Loaded models, with when they unload",
                              "content": {oa.JSON: {"schema": oa.ref("OllamaRunning")}}}},
    }, ollama=True)


@oa.route(blueprint, "/api/ps", doc=_ps_doc)
def ps() -> Any:
    return jsonify(om.ps(models()))


# --- the store -----------------------------------------------------------------------------


def _catalog(name: str) -> store.CatalogModel:
    base = name[: -len(":latest")] if name.endswith(":latest") else name
    try:
        canonical = store.catalog_name(base)
    except store.UnknownModelError:
        canonical = None
    if canonical is None:
        known = ", ".join(store.CATALOG)
        raise ApiError(404, "model_not_found", f"pull model manifest: '{name}' is not in bubo's catalog ({known})")
    return store.CATALOG[canonical]


def _pull_doc(d: oa.Doc) -> oa.Op:
    store_name = oa.obj({"model": oa.desc(oa.STR, "a catalog name (bubo list --catalog)"), "name": oa.STR,
                         "stream": oa.BOOL,
                         "insecure": oa.BOOL}, closed=False)
    return oa.Op({
        "operationId": "ollama_pull", "summary": "Download a catalog model into the store (Ollama)", "tags": [od.TAG],
        "requestBody": oa.body(store_name, {"model": "smollm2:135m", "stream": False}),
        "responses": {"200": od.ok("OllamaProgress", "Progress lines, the last {\"status\": \"success\"}; "
                                   "stream false: that last one")},
    }, (400, 404, 413, 500), ollama=True)


@oa.route(blueprint, "/api/pull", methods=("POST",), doc=_pull_doc)
def pull() -> Any:
    body = json_body()
    model = _catalog(sh.model_name(body))
    as_stream = f.bool_field(body, "stream", True)
    f.bool_field(body, "insecure", False)
    progress = om.PullProgress(model)
    job = om.pull_in_thread(model, progress)

    def lines() -> Iterator[dict[str, Any]]:
        sent = 0
        yield {"status": "pulling manifest"}
        try:
            while True:
                done = job.wait(timeout=0.25) is not None or job.ready()
                while sent < len(progress.events):
                    yield progress.events[sent]
                    sent += 1
                if done:
                    break
            job.get()
        except (store.StoreError, OSError) as e:
            yield {"error": f"pull of {model.name} failed: {e}"}
            return
        yield {"status": "verifying sha256 digest"}
        yield {"status": "writing manifest"}
        yield {"status": "success"}

    if as_stream:
        return ndjson_response(lines())
    every = list(lines())  # waits for the pull
    last = every[-1]
    if "error" in last:
        raise ApiError(500, "pull_failed", last["error"])
    return jsonify(last)


def _stored(name: str) -> store.StoredModel | None:
    """The stored model a name means: a catalog name (a family name: its default tag), the file
    name of another .gguf in the store, with or without ".gguf" and ":latest"."""
    stored = store.stored_models()
    names = [name] + ([name[: -len(":latest")]] if name.endswith(":latest") else [])
    for n in list(names):
        try:
            canonical = store.catalog_name(n)
        except store.UnknownModelError:
            canonical = None
        names += [c for c in (canonical, n + ".gguf") if c]
    return next((m for n in names for m in stored if m.name == n), None)


def _served_paths() -> set[str]:
    out = set()
    for e in models().entries:
        p = om.entry_path(e)
        if p is not None:
            out.add(str(p.resolve()))
    return out


def _delete_doc(d: oa.Doc) -> oa.Op:
    return oa.Op({
        "operationId": "ollama_delete", "summary": "Delete a stored model (Ollama)", "tags": [od.TAG],
        "requestBody": oa.body(oa.obj({"model": oa.STR, "name": oa.STR}, closed=False), {"model": "nothing:here"}),
        "responses": {"200": {"description": "Deleted (no body)"}},
    }, (400, 404, 413), ollama=True)


@oa.route(blueprint, "/api/delete", methods=("DELETE",), doc=_delete_doc)
def delete() -> Any:
    body = json_body()
    name = sh.model_name(body)
    found = _stored(name)
    if found is None:
        raise ApiError(404, "model_not_found", f"model '{name}' not found in the store ({store.models_dir()})")
    if str(found.path.resolve()) in _served_paths():
        raise invalid(f"model '{name}' is the file this server serves ({found.path}): stop serving it before "
                      "deleting it")
    try:
        store.remove(found.path.name if found.name.endswith(".gguf") else found.name)
    except store.UnknownModelError:
        raise ApiError(404, "model_not_found", f"model '{name}' not found in the store") from None
    return Response(status=200)


def _copy_doc(d: oa.Doc) -> oa.Op:
    return oa.Op({
        "operationId": "ollama_copy", "summary": "A stored model under another name (Ollama)", "tags": [od.TAG],
        "description": "A hard link in the store: no bytes are written. Where none can be made (the model's file "
        "is on another filesystem) the copy is refused (400) unless the server was started with "
        "--allow-copy; then the file is copied if the store's disk has room for it and 1 GiB more "
        "(507 insufficient_storage otherwise).",
        "requestBody": oa.body(oa.obj({"source": oa.STR, "destination": oa.STR}, ["source", "destination"],
                                      closed=False),
                               {"source": "nothing:here", "destination": "copy:latest"}),
        "responses": {"200": {"description": "Copied (no body)"}},
    }, (400, 404, 413, 507), ollama=True)


@oa.route(blueprint, "/api/copy", methods=("POST",), doc=_copy_doc)
def copy() -> Any:
    body = json_body()
    source = body.get("source")
    if not isinstance(source, str) or not source:
        raise invalid("source is required: the name of a stored or served model")
    destination = sh.check_new_name(body.get("destination"), "destination")
    if destination.endswith(":latest"):
        destination = destination[: -len(":latest")]  # the same name, as Ollama reads it
    found = _stored(source)
    path = found.path if found is not None else None
    if path is None:
        try:
            path = om.entry_path(models().lookup(served(source)))
        except ApiError:
            path = None
    if path is None:
        raise ApiError(404, "model_not_found", f"model '{source}' not found")
    if _stored(destination) is not None:
        raise invalid(f"destination '{destination}' already names a stored model: delete it first, or pick "
                      "another name")
    try:
        om.copy(path, destination, allow_copy=config().allow_copy)
    except FileExistsError:
        raise invalid(f"destination '{destination}' already names a stored model") from None
    except om.CopyRefused as e:
        raise invalid(str(e)) from None
    except store.NoRoomError as e:
        raise ApiError(507, "insufficient_storage", str(e)) from None
    return Response(status=200)


# --- not here --------------------------------------------------------------------------------


def _embed_doc(d: oa.Doc) -> oa.Op:
    emb_in = {"anyOf": [oa.STR, oa.arr({"anyOf": [oa.STR, oa.arr(oa.NAT, minItems=1)]},
                                       maxItems=2048)]}  # "" or []: none
    return oa.Op({
        "operationId": "ollama_embed", "summary": "Embeddings (Ollama; 501 for a text-generation model)",
        "tags": [od.TAG],
        "requestBody": oa.body(oa.obj({"model": od.model_field(d), "input": emb_in, "truncate": oa.OPT_BOOL,
                                       "keep_alive": {},
                                       "dimensions": {"type": ["integer", "null"], "minimum": 1}, "options": {}},
                                      ["model", "input"], closed=False),
                               {"model": d.example_model, "input": ["hello", "world"]}),
        "responses": {"200": oa.ok(oa.obj({"model": oa.STR, "embeddings": oa.arr(oa.arr(oa.NUM)),
                                           "total_duration": oa.NAT,
                                           "load_duration": oa.NAT, "prompt_eval_count": oa.NAT}, ["model",
                                                                                                   "embeddings"]),
                                   "One L2-normalised vector per input"),
                      "501": oa.error(501, text="The model makes no embeddings", ollama=True)},
    }, (400, 404, 413, 500), ollama=True)


@oa.route(blueprint, "/api/embed", methods=("POST",), doc=_embed_doc)
def embed() -> Any:
    t0 = time.monotonic()
    body = json_body()
    name = served(sh.model_name(body))
    engine, rt, load_s = _embedder(name, body, t0)
    return emb.ollama_embed(body, sh.tagged(name), t0, load_s, engine, rt)


def _embeddings_doc(d: oa.Doc) -> oa.Op:
    return oa.Op({
        "operationId": "ollama_embeddings", "summary": "One embedding, not normalised (Ollama's older route)",
        "tags": [od.TAG],
        "requestBody": oa.body(oa.obj({"model": od.model_field(d), "prompt": oa.STR, "keep_alive": {}, "options": {}},
                                      ["model", "prompt"], closed=False), {"model": d.example_model,
                                                                           "prompt": "hello"}),
        "responses": {"200": oa.ok(oa.obj({"embedding": oa.arr(oa.NUM)}, ["embedding"]), "The vector"),
                      "501": oa.error(501, text="The model makes no embeddings", ollama=True)},
    }, (400, 404, 413, 500), ollama=True)


@oa.route(blueprint, "/api/embeddings", methods=("POST",), doc=_embeddings_doc)
def embeddings_legacy() -> Any:
    """Ollama's older route: `prompt` (one string) -> `embedding`, not normalised."""
    t0 = time.monotonic()
    body = json_body()
    name = served(sh.model_name(body))
    prompt = body.get("prompt")
    if not isinstance(prompt, str):
        raise invalid("'prompt' must be a string")
    engine, rt, _ = _embedder(name, body, t0)
    if prompt == "":  # as Ollama: no embedding for an empty prompt
        return jsonify({"embedding": []})
    out = emb.run(engine, rt, [prompt], truncate=True, normalize=False)
    vector = emb.vectors_of(out)[0]
    return jsonout.built_arrays({}, "embedding", len(vector), 1, lambda: vector)


def _embedder(name: str, body: dict[str, Any], t0: float) -> tuple[ServingEngine, Runtime, float]:
    """The embedding model's engine; 501 for a text-generation model, whose keep_alive the
    request then leaves as it was (keep_alive 0 must not unload a model it could not use)."""
    keep_alive = sh.keep_alive_of(body.get("keep_alive"))
    engine = use_model(name)
    load_s = time.monotonic() - t0
    rt = runtime_of(engine)
    if not embedding.is_encoder(rt):
        raise ApiError(501, "not_implemented", f"model '{sh.tagged(name)}' does not support embeddings: it is a "
                                               f"text-generation model ({rt.hparams.get('arch')}); pull and serve an "
                                               "embedding model such as all-minilm:l6-v2")
    _keep_alive(name, keep_alive)
    return engine, rt, load_s


def _not_here_doc(d: oa.Doc) -> dict[str, oa.Op]:
    out = {}
    for path, op_id in (("/api/create", "ollama_create"), ("/api/push", "ollama_push"),
                        ("/api/blobs/{digest}", "ollama_blobs")):
        op: oa.Schema = {"operationId": op_id, "summary": "Not implemented: bubo creates and publishes no models",
                         "tags": [od.TAG], "responses": {"501": oa.error(501, text="Not implemented", ollama=True)}}
        if "{digest}" in path:
            op["parameters"] = [{"name": "digest", "in": "path", "required": True, "schema": oa.STR}]
        out[f"post {path}"] = oa.Op(op, ollama=True)
    return out


@oa.route(blueprint, "/api/create", "/api/push", methods=("POST",), doc=_not_here_doc)
def not_here() -> Any:
    raise ApiError(501, "not_implemented", "bubo does not create or publish models (no Modelfile parser, no "
                                           "registry to push to): pull catalog models with /api/pull, or serve a "
                                           "GGUF file with bubo serve -m FILE")


@oa.route(blueprint, "/api/blobs/<digest>", methods=("HEAD", "POST"), doc=_not_here_doc)
def blobs(digest: str) -> Any:
    """Ollama's blob upload (HEAD asks whether one is there): none is, as nothing is created."""
    return not_here()

