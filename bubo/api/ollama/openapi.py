"""The shapes of the Ollama routes in the server's OpenAPI document (their declarations are in
bubo/api/ollama/routes.py, beside each route).

Streams are NDJSON (application/x-ndjson): the schema given for that media type is the schema of
one line."""

from __future__ import annotations

from bubo import limits
from bubo.api import openapi as oa
from bubo.api.ollama.shapes import LOAD_OPTIONS
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
GEN_ERRORS = oa.GEN_ERRORS


def options() -> Schema:
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


def common(model: Schema) -> dict[str, Schema]:
    return {
        "model": model, "stream": desc(BOOL, "default true: NDJSON lines; false: one object"),
        "options": options(),
        "format": desc({"anyOf": [enum("", "json"), JSON_SCHEMA_FIELD, {"type": "null"}]},
                       '"json": a JSON object; a JSON Schema: its instances'),
        "keep_alive": desc({"type": ["string", "number", "null"]},
                           'how long the model stays loaded once idle: "5m", "1h", seconds; 0 unloads it after the '
                           "request, a negative value keeps it; absent: as it is"),
        "think": desc({"anyOf": [BOOL, enum("low", "medium", "high"), {"type": "null"}]},
                      "true on a model whose template does not think is a 400"),
        "logprobs": BOOL,
        "top_logprobs": {"type": ["integer", "null"], "minimum": 0, "maximum": limits.MAX_TOP_LOGPROBS},
    }


def shapes() -> dict[str, Schema]:
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


def ok(name: str, text: str, stream: bool = True) -> Schema:
    content: Schema = {JSON: {"schema": ref(name)}}
    if stream:
        content[NDJSON] = {"schema": desc({"anyOf": [ref(name), ref("OllamaError")]}, "one line")}
    return {"description": text, "content": content}


def model_field(d: oa.Doc) -> Schema:
    """A served name, as given or with :latest."""
    tagged = [n if ":" in n else n + ":latest" for n in d.names]
    return desc({"type": "string", "enum": sorted(set(d.names) | set(tagged))},
                "a served name, as given or with :latest; another name is a 404")


def _message() -> Schema:
    return obj({"role": enum("system", "user", "assistant", "tool"), "content": STR,
                "images": desc(arr(STR), "a 400 on a text model"),
                "tool_calls": arr(obj({"function": obj({"name": STR, "arguments": ANY_OBJECT}, ["name"],
                                                       closed=False)}, ["function"], closed=False)),
                "tool_name": desc(STR, "tool messages: the tool that answered"),
                "thinking": desc(STR, "assistant messages: their reasoning")}, ["role"], closed=False)


def chat_request(d: oa.Doc) -> Schema:
    model = model_field(d)
    return obj({**common(model), "messages": desc(arr(_message(), maxItems=limits.MAX_MESSAGES),
                                                  "none or []: load the model (keep_alive 0: "
                                                  "unload it) and answer at once"),
                "tools": arr(FUNCTION_TOOL, maxItems=limits.MAX_TOOLS)}, ["model"], closed=False)


def generate_request(d: oa.Doc) -> Schema:
    model = model_field(d)
    return obj({**common(model), "prompt": STR,
                "suffix": desc(STR, "fill in the middle between prompt and suffix (models with FIM tokens)"),
                "system": STR, "raw": desc(BOOL, "the prompt as it is, no chat template"),
                "context": desc(arr(NAT), "an earlier answer's context: the conversation so far"),
                "template": desc(STR, "a 400: bubo renders with the model's own template"),
                "images": desc(arr(STR), "a 400 on a text model")}, ["model"], closed=False)
