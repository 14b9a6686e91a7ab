"""The Ollama routes in the server's OpenAPI document (bubo/api/openapi.py calls add_paths).

Streams are NDJSON (application/x-ndjson): the schema given for that media type is the schema of
one line."""

from __future__ import annotations

from typing import Any

from bubo import limits
from bubo.api import openapi as oa
from bubo.api.ollama.shapes import LOAD_OPTIONS, MAX_TOP_LOGPROBS
from bubo.api.openapi import (
    ANY_OBJECT,
    BOOL,
    FUNCTION_TOOL,
    JSON,
    JSON_SCHEMA_FIELD,
    NAT,
    NUM,
    STR,
    Schema,
    arr,
    const,
    desc,
    enum,
    obj,
    ref,
)

NDJSON = "application/x-ndjson"
TAG = "Ollama"
GEN_ERRORS = (400, 404, 413, 500, 503, 507)


def _options() -> Schema:
    props: dict[str, Schema] = {k: v for k, v in oa.SAMPLING.items()}
    props["num_predict"] = desc({"type": ["integer", "null"], "minimum": -2, "maximum": oa.INT32_MAX},
                                "the most tokens to generate; -1: no limit, -2: until the context is full; 0 and "
                                "other negatives are a 400")
    props["num_ctx"] = desc({"type": ["integer", "null"], "minimum": 1},
                            "prompt and answer together end within this many tokens (the server's -c is the "
                            "ceiling: a larger value does not reload the model)")
    props["stop"] = oa.STOP
    for name, kind in LOAD_OPTIONS.items():
        t = {bool: "boolean", int: "integer", float: "number"}[kind]
        props[name] = desc({"type": [t, "null"]}, "read and not applied: the server's flags make the engine")
    return desc(obj(props, closed=False), "Ollama's options; unknown names are ignored, as Ollama ignores them")


def _common(model: Schema) -> dict[str, Schema]:
    return {
        "model": model, "stream": desc(BOOL, "default true: NDJSON lines; false: one object"),
        "options": _options(),
        "format": desc({"anyOf": [enum("", "json"), JSON_SCHEMA_FIELD, {"type": "null"}]},
                       '"json": a JSON object; a JSON Schema: its instances'),
        "keep_alive": desc({"type": ["string", "number", "null"]},
                           'how long the model stays loaded once idle: "5m", "1h", seconds; 0 unloads it after the '
                           "request, a negative value keeps it; absent: as it is"),
        "think": desc({"anyOf": [BOOL, enum("low", "medium", "high"), {"type": "null"}]},
                      "true on a model whose template does not think is a 400"),
        "logprobs": BOOL,
        "top_logprobs": {"type": ["integer", "null"], "minimum": 0, "maximum": MAX_TOP_LOGPROBS},
    }


def _shapes() -> dict[str, Schema]:
    one = {"token": STR, "logprob": NUM, "bytes": oa.BYTES}
    logprob = obj({**one, "top_logprobs": arr(obj(one, list(one)))}, [*one, "top_logprobs"])
    call = obj({"id": STR, "function": obj({"index": NAT, "name": STR, "arguments": desc({}, "JSON: an object")},
                                           ["index", "name", "arguments"])}, ["function"])
    message = obj({"role": const("assistant"), "content": STR, "thinking": STR, "tool_calls": arr(call)},
                  ["role", "content"])
    final: dict[str, Schema] = {
        "done_reason": desc(enum("stop", "length", "load", "unload"), "in the last object"),
        "total_duration": NAT, "load_duration": NAT, "prompt_eval_count": NAT, "prompt_eval_duration": NAT,
        "eval_count": NAT, "eval_duration": NAT,
        "draft_tokens": desc(NAT, "speculative decoding: tokens drafted (bubo's own)"),
        "draft_tokens_accepted": NAT, "logprobs": arr(ref("OllamaLogprob"))}
    head = {"model": STR, "created_at": STR, "done": BOOL}
    details = obj({"parent_model": STR, "format": STR, "family": STR,
                   "families": {"type": ["array", "null"], "items": STR}, "parameter_size": STR,
                   "quantization_level": STR},
                  ["parent_model", "format", "family", "families", "parameter_size", "quantization_level"])
    tag = obj({"name": STR, "model": STR, "modified_at": STR, "size": NAT, "digest": STR,
               "details": ref("OllamaDetails")}, ["name", "model", "modified_at", "size", "digest", "details"])
    running = obj({"name": STR, "model": STR, "size": NAT, "digest": STR, "details": ref("OllamaDetails"),
                   "expires_at": STR, "size_vram": NAT, "context_length": NAT},
                  ["name", "model", "size", "digest", "details", "expires_at", "size_vram", "context_length"])
    return {
        "OllamaError": obj({"error": STR}, ["error"]),
        "OllamaLogprob": logprob,
        "OllamaChat": obj({**head, "message": message, **final}, ["model", "created_at", "message", "done"]),
        "OllamaGenerate": obj({**head, "response": STR, "thinking": STR,
                               "context": desc(arr(NAT), "in the last object: prompt and answer's tokens"), **final},
                              ["model", "created_at", "response", "done"]),
        "OllamaDetails": details,
        "OllamaTags": obj({"models": arr(tag)}, ["models"]),
        "OllamaRunning": obj({"models": arr(running)}, ["models"]),
        "OllamaShow": obj({"license": STR, "modelfile": STR, "parameters": STR, "template": STR,
                           "details": ref("OllamaDetails"), "model_info": ANY_OBJECT, "capabilities": arr(STR),
                           "modified_at": STR},
                          ["license", "modelfile", "parameters", "template", "details", "model_info",
                           "capabilities", "modified_at"]),
        "OllamaProgress": obj({"status": STR, "digest": STR, "total": NAT, "completed": NAT}, ["status"]),
    }


def _ok(name: str, text: str, stream: bool = True) -> Schema:
    content: Schema = {JSON: {"schema": ref(name)}}
    if stream:
        content[NDJSON] = {"schema": desc({"anyOf": [ref(name), ref("OllamaError")]}, "one line")}
    return {"description": text, "content": content}


def add_paths(d: Any, names: list[str], example_model: str) -> dict[str, Schema]:
    """Add the /api/* paths to the document being built (bubo.api.openapi._Doc); returns the
    component schemas they refer to."""
    tagged = [n if ":" in n else n + ":latest" for n in names]
    model = desc({"type": "string", "enum": sorted(set(names) | set(tagged))},
                 "a served name, as given or with :latest; another name is a 404")
    message = obj({"role": enum("system", "user", "assistant", "tool"), "content": STR,
                   "images": desc(arr(STR), "a 400 on a text model"),
                   "tool_calls": arr(obj({"function": obj({"name": STR, "arguments": ANY_OBJECT}, ["name"],
                                                          closed=False)}, ["function"], closed=False)),
                   "tool_name": desc(STR, "tool messages: the tool that answered"),
                   "thinking": desc(STR, "assistant messages: their reasoning")}, ["role"], closed=False)
    chat = obj({**_common(model), "messages": desc(arr(message, maxItems=limits.MAX_MESSAGES),
                                                   "none or []: load the model (keep_alive 0: "
                                                                 "unload it) and answer at once"),
                "tools": arr(FUNCTION_TOOL, maxItems=limits.MAX_TOOLS)}, ["model"], closed=False)
    gen = obj({**_common(model), "prompt": STR,
               "suffix": desc(STR, "fill in the middle between prompt and suffix (models with FIM tokens)"),
               "system": STR, "raw": desc(BOOL, "the prompt as it is, no chat template"),
               "context": desc(arr(NAT), "an earlier answer's context: the conversation so far"),
               "template": desc(STR, "a 400: bubo renders with the model's own template"),
               "images": desc(arr(STR), "a 400 on a text model")}, ["model"], closed=False)
    hello = [{"role": "user", "content": "Say hi."}]
    d.add(("/api/chat",), "post", {
        "operationId": "ollama_chat", "summary": "Chat (Ollama)", "tags": [TAG],
        "requestBody": oa._body(chat, {"model": example_model, "messages": hello, "stream": False,
                                       "options": {"num_predict": 8}}),
        "responses": {"200": _ok("OllamaChat", "The answer; NDJSON lines unless stream is false, the last with "
                                               "\"done\": true and the counts; an error after the 200 is an "
                                               "{\"error\"} line.")},
    }, GEN_ERRORS, ollama=True)
    d.add(("/api/generate",), "post", {
        "operationId": "ollama_generate", "summary": "Generate from a prompt (Ollama)", "tags": [TAG],
        "requestBody": oa._body(gen, {"model": example_model, "prompt": "Say hi.", "stream": False,
                                      "options": {"num_predict": 8}}),
        "responses": {"200": _ok("OllamaGenerate", "The answer, as /api/chat's but under response.")},
    }, GEN_ERRORS, ollama=True)
    d.add(("/api/version",), "get", {
        "operationId": "ollama_version", "summary": "bubo's version (Ollama)", "tags": [TAG],
        "responses": {"200": {"description": "The version",
                              "content": {JSON: {"schema": obj({"version": STR}, ["version"])}}}},
    }, ollama=True)
    d.add(("/api/tags",), "get", {
        "operationId": "ollama_tags", "summary": "The served models (Ollama)", "tags": [TAG],
        "responses": {"200": {"description": "Every name a request may use, tagged",
                              "content": {JSON: {"schema": ref("OllamaTags")}}}},
    }, ollama=True)
    d.add(("/api/ps",), "get", {
        "operationId": "ollama_ps", "summary": "The loaded models (Ollama)", "tags": [TAG],
        "responses": {"200": {"description": "Loaded models, with when they unload",
                              "content": {JSON: {"schema": ref("OllamaRunning")}}}},
    }, ollama=True)
    named = obj({"model": model, "name": desc(STR, "older clients' name for model")}, closed=False)
    d.add(("/api/show",), "post", {
        "operationId": "ollama_show", "summary": "A model's details, template and metadata (Ollama)", "tags": [TAG],
        "requestBody": oa._body(named, {"model": example_model}),
        "responses": {"200": {"description": "What the model's GGUF file says",
                              "content": {JSON: {"schema": ref("OllamaShow")}}}},
    }, (400, 404, 413), ollama=True)
    store_name = obj({"model": desc(STR, "a catalog name (bubo list --catalog)"), "name": STR, "stream": BOOL,
                      "insecure": BOOL}, closed=False)
    d.add(("/api/pull",), "post", {
        "operationId": "ollama_pull", "summary": "Download a catalog model into the store (Ollama)", "tags": [TAG],
        "requestBody": oa._body(store_name, {"model": "smollm2:135m", "stream": False}),
        "responses": {"200": _ok("OllamaProgress", "Progress lines, the last {\"status\": \"success\"}; "
                                                   "stream false: that last one")},
    }, (400, 404, 413, 500), ollama=True)
    d.add(("/api/delete",), "delete", {
        "operationId": "ollama_delete", "summary": "Delete a stored model (Ollama)", "tags": [TAG],
        "requestBody": oa._body(obj({"model": STR, "name": STR}, closed=False), {"model": "nothing:here"}),
        "responses": {"200": {"description": "Deleted (no body)"}},
    }, (400, 404, 413), ollama=True)
    d.add(("/api/copy",), "post", {
        "operationId": "ollama_copy", "summary": "A stored model under another name (Ollama)", "tags": [TAG],
        "description": "A hard link in the store: no bytes are written. Where none can be made (the model's file "
                       "is on another filesystem) the copy is refused (400) unless the server was started with "
                       "--allow-copy; then the file is copied if the store's disk has room for it and 1 GiB more "
                       "(507 insufficient_storage otherwise).",
        "requestBody": oa._body(obj({"source": STR, "destination": STR}, ["source", "destination"], closed=False),
                                {"source": "nothing:here", "destination": "copy:latest"}),
        "responses": {"200": {"description": "Copied (no body)"}},
    }, (400, 404, 413, 507), ollama=True)
    emb_in = {"anyOf": [STR, arr({"anyOf": [STR, arr(NAT, minItems=1)]}, maxItems=2048)]}  # "" or []: none
    d.add(("/api/embed",), "post", {
        "operationId": "ollama_embed", "summary": "Embeddings (Ollama; 501 for a text-generation model)",
        "tags": [TAG],
        "requestBody": oa._body(obj({"model": model, "input": emb_in, "truncate": oa.OPT_BOOL, "keep_alive": {},
                                     "dimensions": {"type": ["integer", "null"], "minimum": 1}, "options": {}},
                                    ["model", "input"], closed=False),
                                {"model": example_model, "input": ["hello", "world"]}),
        "responses": {"200": oa._ok(obj({"model": STR, "embeddings": arr(arr(NUM)), "total_duration": NAT,
                                         "load_duration": NAT, "prompt_eval_count": NAT}, ["model", "embeddings"]),
                                    "One L2-normalised vector per input"),
                      "501": oa._error(501, text="The model makes no embeddings", ollama=True)},
    }, (400, 404, 413, 500), ollama=True)
    d.add(("/api/embeddings",), "post", {
        "operationId": "ollama_embeddings", "summary": "One embedding, not normalised (Ollama's older route)",
        "tags": [TAG],
        "requestBody": oa._body(obj({"model": model, "prompt": STR, "keep_alive": {}, "options": {}},
                                    ["model", "prompt"], closed=False), {"model": example_model, "prompt": "hello"}),
        "responses": {"200": oa._ok(obj({"embedding": arr(NUM)}, ["embedding"]), "The vector"),
                      "501": oa._error(501, text="The model makes no embeddings", ollama=True)},
    }, (400, 404, 413, 500), ollama=True)
    for path, op_id in (("/api/create", "ollama_create"), ("/api/push", "ollama_push"),
                        ("/api/blobs/{digest}", "ollama_blobs")):
        op: Schema = {"operationId": op_id, "summary": "Not implemented: bubo creates and publishes no models",
                      "tags": [TAG], "responses": {"501": oa._error(501, text="Not implemented", ollama=True)}}
        if "{digest}" in path:
            op["parameters"] = [{"name": "digest", "in": "path", "required": True, "schema": STR}]
        d.add((path,), "post", op, ollama=True)
    return _shapes()

