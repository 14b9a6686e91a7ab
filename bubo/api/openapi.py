"""The server's own description (OpenAPI 3.1, served at `GET /openapi.json` by bubo/api/about.py).

Each route declares its operation where it is registered: `route(blueprint, *paths, methods=...,
doc=...)` registers the view and keeps its declaration, a function of the document being built
(Doc: the config, the model names, router or not) that gives the operation (Op: the OpenAPI
object, the errors the route answers, which error shape). document() assembles the routes an app
has (the /debug/* routes only with --debug-hooks on a loopback address) with the shared
component schemas below and each blueprint's own (components()). tests/api/test_openapi.py
checks that every registered route is declared, validates the document, and runs schemathesis
against a real server with it.

The schemas come from the same names and limits the validators use (bubo/api/fields.py,
bubo.sampling.SamplingParams, bubo/api/errors.py). Request bodies describe what the routes accept
(a field the server ignores is allowed too: an unknown field is not an error); responses describe
the shapes the routes return, exactly (`additionalProperties: false`), with every error status and
the shape of each dialect's errors. A streamed answer (`"stream": true`) is `text/event-stream`:
its `schema` describes one event (`event`, `data`), the data's JSON in `contentSchema`, as OpenAPI
3.2's `itemSchema` does."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from flask import Blueprint, Flask

import bubo
from bubo import limits
from bubo.api import errors
from bubo.api import fields as f
from bubo.api.config import REASONING_FORMATS, ServerConfig
from bubo.api.openai.completions import DEFAULT_MAX_TOKENS
from bubo.chat import request as rq
from bubo.engine.draft import MAX_DRAFT_PER_REQUEST
from bubo.engine.registry import DEFAULT_NAME, Registry
from bubo.sampling import FLT_TRUE_MIN, SamplingParams

INT32_MAX = f.INT32_MAX
FLT_MAX = f.FLT_MAX
UINT64_MAX = 2**64 - 1

JSON = "application/json"
SSE = "text/event-stream"
METRICS_TYPE = "text/plain; version=0.0.4"

Schema = dict[str, Any]


# --- schema helpers --------------------------------------------------------------------------


def ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def obj(props: dict[str, Schema], required: tuple[str, ...] | list[str] = (), *, closed: bool = True,
        **extra: Any) -> Schema:
    """An object schema; closed: no other properties (every response shape), open: other fields
    are ignored (every request body)."""
    out: Schema = {"type": "object", "properties": props}
    if required:
        out["required"] = list(required)
    if closed:
        out["additionalProperties"] = False
    out.update(extra)
    return out


def arr(items: Schema, **extra: Any) -> Schema:
    return {"type": "array", "items": items, **extra}


def nullable(s: Schema) -> Schema:
    return {"anyOf": [s, {"type": "null"}]}


def const(v: Any) -> Schema:
    return {"const": v}


def enum(*values: Any) -> Schema:
    return {"enum": list(values)}


def desc(s: Schema, text: str) -> Schema:
    return {**s, "description": text}


STR: Schema = {"type": "string"}
INT: Schema = {"type": "integer"}
NUM: Schema = {"type": "number"}
BOOL: Schema = {"type": "boolean"}
NAT: Schema = {"type": "integer", "minimum": 0}
OPT_BOOL: Schema = {"type": ["boolean", "null"]}
ANY_OBJECT: Schema = {"type": "object"}


def number(lo: float = -FLT_MAX, hi: float = FLT_MAX) -> Schema:
    """A sampling number: a finite double that fits the native sampler's C float."""
    return {"type": ["number", "null"], "minimum": lo, "maximum": hi}


def integer(lo: int, hi: int) -> Schema:
    return {"type": ["integer", "null"], "minimum": lo, "maximum": hi}


# --- request fields (bubo/api/fields.py, bubo.sampling.SamplingParams) -----------------------

# every SamplingParams field a request may set, under llama-server's names, with the bounds its
# declaration gives (bubo.sampling: SamplingParams._validate checks them; fields.sampling_params
# also |x| <= FLT_MAX); absent or null: the server's default (its --temp, --top-k, ... flags,
# else llama-server's; GET /props lists them)
BIAS: Schema = {"anyOf": [{"type": "number", "minimum": -FLT_MAX, "maximum": FLT_MAX}, const(False)]}
# the fields that are not numbers: their shapes
_SAMPLING_SHAPES: dict[str, Schema] = {
    "dry_sequence_breakers": {"type": ["array", "null"], "items": {"type": "string", "minLength": 1},
                              "maxItems": limits.MAX_DRY_BREAKERS},
    "logit_bias": {"anyOf": [
        {"type": "object", "propertyNames": {"pattern": "^[0-9]+$"},
         "additionalProperties": BIAS, "maxProperties": limits.MAX_LOGIT_BIAS},
        arr({"type": "array", "prefixItems": [NAT, BIAS], "minItems": 2,
             "maxItems": 2}, maxItems=limits.MAX_LOGIT_BIAS),
        {"type": "null"},
    ]},
}
_SAMPLING_NOTES = {"logit_bias": "{token id: bias} (OpenAI) or [[token id, bias], ...] (llama-server); a bias of "
                                 "false bans the token. A token id outside the vocabulary is a 400."}


def _sampling_field(fld: dataclasses.Field[Any]) -> Schema:
    """A SamplingParams field's schema, from its declaration."""
    meta = fld.metadata
    if fld.name in _SAMPLING_SHAPES:
        schema = _SAMPLING_SHAPES[fld.name]
    elif fld.type == "int":
        schema = integer(meta["lo"], meta["hi"])
    else:
        lo = FLT_TRUE_MIN if meta["positive"] else meta["lo"]
        schema = number(-FLT_MAX if lo is None else lo, FLT_MAX if meta["hi"] is None else meta["hi"])
    text = _SAMPLING_NOTES.get(fld.name, meta["doc"])
    return desc(schema, text) if text else schema


SAMPLING: dict[str, Schema] = {fld.name: _sampling_field(fld) for fld in dataclasses.fields(SamplingParams)
                               if fld.name != "n_probs"}  # n_probs: its own field (n_probs_of)

MAX_TOKENS: Schema = desc(
    {"anyOf": [{"type": "integer", "minimum": 1, "maximum": INT32_MAX}, const(-1), {"type": "null"}]},
    "the most tokens to generate; -1 or null: until the model stops or the context is full; absent: the "
    "server's -n if it has one, else the same")
STOP: Schema = desc({"anyOf": [{"type": "string", "maxLength": limits.MAX_STOP_CHARS},
                               arr({"type": "string", "maxLength": limits.MAX_STOP_CHARS}, maxItems=limits.MAX_STOP),
                               {"type": "null"}]},
                    f"the answer ends before the first of these texts (at most {limits.MAX_STOP} strings of at most "
                    f"{limits.MAX_STOP_CHARS} characters)")
REASONING_EFFORT: Schema = {"enum": [*rq.REASONING_EFFORTS, None]}
THINKING: Schema = desc(
    {"anyOf": [obj({"type": enum("enabled", "disabled", "adaptive"), "budget_tokens": {}}, ["type"], closed=False),
               {"type": "null"}]},
    "thinking is on unless a field turns it off")
TEMPLATE_KWARGS: Schema = desc(
    {"type": ["object", "null"],
     "properties": {"enable_thinking": BOOL, "reasoning_effort": REASONING_EFFORT},
     "propertyNames": {"not": {"enum": sorted(rq.RESERVED_TEMPLATE_KWARGS)}}},
    "extra variables of the chat template; reasoning_effort, thinking and these must agree on whether the "
    "model thinks (else a 400 naming them)")

TEXT_PART: Schema = obj({"type": enum("text", "input_text", "output_text"), "text": STR}, ["type", "text"],
                        closed=False)
CONTENT: Schema = desc({"anyOf": [STR, arr({"anyOf": [STR, TEXT_PART]}), {"type": "null"}]},
                       "text, or text parts (joined); image, audio and file parts are a 400 on a text model")

JSON_SCHEMA_FIELD: Schema = desc(
    {"type": "object"},
    "a JSON Schema; the answer is constrained to its instances. A keyword that cannot be enforced is a 400 "
    "unsupported_schema naming its JSON pointer")
RESPONSE_FORMAT: Schema = desc(
    {"anyOf": [
        obj({"type": const("text")}, ["type"], closed=False),
        obj({"type": const("json_object"), "schema": nullable(JSON_SCHEMA_FIELD)}, ["type"], closed=False),
        obj({"type": const("json_schema"),
             "json_schema": obj({"name": STR, "schema": JSON_SCHEMA_FIELD, "strict": OPT_BOOL, "description": STR},
                                ["schema"], closed=False)},
            ["type", "json_schema"], closed=False),
        obj({"type": const("json_schema"), "schema": JSON_SCHEMA_FIELD}, ["type", "schema"], closed=False),
        {"type": "null"},
    ]},
    "json_object: any JSON object (or the instances of its schema); json_schema: the instances of "
    "json_schema.schema (enforced whatever strict says). One of grammar, json_schema, response_format")
OUTPUT_FIELDS: dict[str, Schema] = {
    "grammar": desc({"type": ["string", "null"]}, "GBNF rules (llama.cpp's); a syntax error is a 400 invalid_grammar"),
    "json_schema": desc(nullable(JSON_SCHEMA_FIELD), "llama-server's: the answer is an instance of this schema"),
}

# llama-server's per-request speculative decoding fields (fields.draft_max_of), dotted names
SPECULATIVE: dict[str, Schema] = {
    "speculative.n_max": desc(integer(0, MAX_DRAFT_PER_REQUEST),
                              "most drafted tokens checked per step; 0: no drafting for this request"),
    "speculative.n_min": desc(integer(0, MAX_DRAFT_PER_REQUEST), "at most speculative.n_max (checked only)"),
    "speculative.p_min": desc({"type": ["number", "null"], "minimum": 0, "maximum": 1}, "checked only"),
}

FUNCTION_TOOL: Schema = obj({
    "type": const("function"),
    "function": obj({"name": {"type": "string", "minLength": 1}, "description": STR,
                     "parameters": desc({"type": "object"}, "the JSON Schema of the arguments, an object"),
                     "strict": OPT_BOOL}, ["name"], closed=False),
}, ["function"], closed=False)
TOOLS_NOTE = f"at most {limits.MAX_TOOLS} tools; tool names must be unique"


def sampling_props() -> dict[str, Schema]:
    return dict(SAMPLING)


def chat_message() -> Schema:
    call = obj({"id": {"type": ["string", "null"]}, "type": const("function"),
                "function": obj({"name": STR, "arguments": {"anyOf": [STR, ANY_OBJECT]}}, ["name"], closed=False)},
               ["function"], closed=False)
    return obj({
        "role": enum(*rq.ROLES),
        "content": CONTENT,
        "name": STR,
        "tool_calls": desc({"anyOf": [arr(call), {"type": "null"}]}, "assistant messages: the calls it made"),
        "reasoning_content": desc(STR, "assistant messages: the reasoning shown to the template"),
        "tool_call_id": desc({"type": ["string", "integer", "null"]}, "tool messages: the call answered"),
    }, ["role"], closed=False)


CONTEXT_FIELDS: dict[str, Schema] = {
    "context_id": desc(STR, "a context of this model (POST /v1/contexts) that the prompt continues (its tokens "
                            "first, not read again); unknown: 404, in use: 409"),
    "save": desc(OPT_BOOL, "with context_id: the context moves forward to the end of the answer"),
}
# on a chat-shaped route the conversation is rendered whole; the context serves what agrees with it
CHAT_CONTEXT_FIELDS: dict[str, Schema] = {
    "context_id": desc(STR, "a context of this model (POST /v1/contexts) whose rows serve the part of the "
                            "rendered conversation that agrees with its tokens; unknown: 404, in use: 409"),
    "save": CONTEXT_FIELDS["save"],
}


def chat_request(model: Schema, model_required: bool = True, speculative: bool = True) -> Schema:
    tool_choice: Schema = {"anyOf": [
        enum("none", "auto", "required"),
        obj({"type": const("function"), "function": obj({"name": STR}, ["name"], closed=False)}, ["function"],
            closed=False),
        {"type": "null"}]}
    props: dict[str, Schema] = {
        "model": model,
        "messages": desc(arr(chat_message(), minItems=1, maxItems=limits.MAX_MESSAGES),
                         "a final assistant message is a prefill: the answer continues it"),
        "max_tokens": MAX_TOKENS,
        "max_completion_tokens": desc(MAX_TOKENS, "wins over max_tokens when both are given"),
        "stream": OPT_BOOL,
        "stream_options": {"type": ["object", "null"], "properties": {"include_usage": {}}},
        "stop": STOP,
        "n": desc({"enum": [1, None]}, "only 1 (else 400 unsupported_n)"),
        "logprobs": OPT_BOOL,
        "top_logprobs": integer(0, limits.MAX_TOP_LOGPROBS),
        "n_probs": integer(0, INT32_MAX),
        "tools": desc({"anyOf": [arr(FUNCTION_TOOL, maxItems=limits.MAX_TOOLS), {"type": "null"}]}, TOOLS_NOTE),
        "tool_choice": desc(tool_choice, "required or a named function force a call (not beside an output "
                                         "constraint); none hides the tools"),
        "parallel_tool_calls": desc(OPT_BOOL, "default false: the answer ends after its first call"),
        "response_format": RESPONSE_FORMAT,
        **OUTPUT_FIELDS,
        "reasoning_effort": REASONING_EFFORT,
        "thinking": THINKING,
        "reasoning_format": desc({"enum": [*REASONING_FORMATS, None]},
                                 "none: a thinking model's <think> block stays in the content; the others put it in "
                                 "reasoning_content (default: the server's --reasoning-format)"),
        "chat_template_kwargs": TEMPLATE_KWARGS,
        "cache_prompt": desc(OPT_BOOL, "default true: reuse the cached prefix"),
        **CHAT_CONTEXT_FIELDS,
        "receipt": RECEIPT_FIELD,
        "lora": LORA_FIELD,
        **sampling_props(),
        **(SPECULATIVE if speculative else {}),
    }
    return obj(props, ["model", "messages"] if model_required else ["messages"], closed=False)


def completions_request(model: Schema) -> Schema:
    return obj({
        "model": model,
        "prompt": desc({"anyOf": [STR, arr(NAT, minItems=1),
                                  arr({"anyOf": [STR, arr(NAT, minItems=1)]}, minItems=1, maxItems=1)]},
                       "text or token ids (a one-element array of either: one prompt per request)"),
        "max_tokens": desc(MAX_TOKENS, f"absent: the server's -n, else {DEFAULT_MAX_TOKENS}"),
        "stream": OPT_BOOL,
        "stream_options": {"type": ["object", "null"], "properties": {"include_usage": {}}},
        "stop": STOP,
        "n": desc({"enum": [1, None]}, "only 1"),
        "logprobs": desc(integer(0, limits.MAX_COMPLETION_LOGPROBS), "alternatives per token"),
        "n_probs": integer(0, INT32_MAX),
        "echo": OPT_BOOL,
        "cache_prompt": OPT_BOOL,
        "response_format": RESPONSE_FORMAT,
        **CONTEXT_FIELDS,
        **OUTPUT_FIELDS,
        "receipt": RECEIPT_FIELD,
        "lora": LORA_FIELD,
        **sampling_props(),
        **SPECULATIVE,
    }, ["model", "prompt"], closed=False)


def responses_request(model: Schema) -> Schema:
    item = {"anyOf": [
        obj({"type": const("message"), "role": enum(*rq.ROLES), "content": CONTENT}, ["role"], closed=False),
        obj({"type": const("function_call"), "call_id": STR, "name": STR, "arguments": STR},
            ["type", "name"], closed=False),
        obj({"type": const("function_call_output"), "call_id": STR, "output": {}}, ["type"], closed=False),
        obj({"type": const("reasoning")}, ["type"], closed=False),
    ]}
    tool = obj({"type": const("function"), "name": {"type": "string", "minLength": 1}, "description": STR,
                "parameters": {"type": ["object", "null"]}, "strict": OPT_BOOL}, ["type", "name"], closed=False)
    fmt = {"anyOf": [
        obj({"type": const("text")}, ["type"], closed=False),
        obj({"type": const("json_object"), "schema": nullable(JSON_SCHEMA_FIELD)}, ["type"], closed=False),
        obj({"type": const("json_schema"), "name": STR, "schema": JSON_SCHEMA_FIELD, "strict": OPT_BOOL},
            ["type", "schema"], closed=False),
        {"type": "null"}]}
    return obj({
        "model": model,
        "input": desc({"anyOf": [{"type": "string", "minLength": 1},
                                 arr(item, minItems=1, maxItems=limits.MAX_MESSAGES)]},
                      "a user message, or items: messages, function calls and their outputs"),
        "instructions": {"type": ["string", "null"]},
        "max_output_tokens": MAX_TOKENS,
        "stream": OPT_BOOL,
        "text": {"type": ["object", "null"], "properties": {"format": fmt}},
        "reasoning": {"type": ["object", "null"], "properties": {"effort": REASONING_EFFORT}},
        "reasoning_effort": REASONING_EFFORT,
        "thinking": THINKING,
        "chat_template_kwargs": TEMPLATE_KWARGS,
        "tools": desc({"anyOf": [arr(tool, maxItems=limits.MAX_TOOLS), {"type": "null"}]}, TOOLS_NOTE),
        "tool_choice": {"anyOf": [enum("none", "auto", "required"),
                                  obj({"type": const("function"), "name": STR}, ["type", "name"], closed=False),
                                  {"type": "null"}]},
        "parallel_tool_calls": OPT_BOOL,
        "previous_response_id": desc({"type": ["string", "null"]},
                                     "continue from this stored response: its conversation and output come "
                                     "before input (its instructions do not); unknown: 404"),
        "store": desc(OPT_BOOL, "keep the response (default true): GET /v1/responses/{id}, previous_response_id"),
        "metadata": desc({"type": ["object", "null"]}, "echoed in the response"),
        "receipt": RECEIPT_FIELD,
        "lora": LORA_FIELD,
        **CHAT_CONTEXT_FIELDS,
        **sampling_props(),
    }, ["model", "input"], closed=False)


def messages_request(model: Schema, count_only: bool = False) -> Schema:
    text_block = obj({"type": const("text"), "text": STR}, ["type", "text"], closed=False)
    blocks_text = {"anyOf": [STR, arr(text_block), {"type": "null"}]}
    block = {"anyOf": [
        text_block,
        obj({"type": const("thinking"), "thinking": {"type": ["string", "null"]}, "signature": STR},
            ["type"], closed=False),
        obj({"type": const("redacted_thinking")}, ["type"], closed=False),
        obj({"type": const("tool_use"), "id": STR, "name": STR, "input": ANY_OBJECT}, ["type", "name"], closed=False),
        obj({"type": const("tool_result"), "tool_use_id": STR, "content": blocks_text}, ["type"], closed=False),
    ]}
    message = obj({"role": enum("user", "assistant"), "content": {"anyOf": [STR, arr(block)]}},
                  ["role", "content"], closed=False)
    tool = obj({"name": {"type": "string", "minLength": 1}, "description": STR,
                "input_schema": desc({"type": ["object", "null"]}, "the JSON Schema of the input, an object")},
               ["name"], closed=False)
    choice = {"anyOf": [obj({"type": enum("auto", "any", "none"), "disable_parallel_tool_use": OPT_BOOL}, ["type"],
                            closed=False),
                        obj({"type": const("tool"), "name": STR, "disable_parallel_tool_use": OPT_BOOL},
                            ["type", "name"], closed=False),
                        {"type": "null"}]}
    props: dict[str, Schema] = {
        "model": model,
        "messages": desc(arr(message, minItems=1, maxItems=limits.MAX_MESSAGES),
                         "user and assistant turns; tool_use blocks in assistant turns, "
                                                   "tool_result blocks in user turns; a final assistant turn is a "
                                                   "prefill"),
        "system": blocks_text,
        "tools": desc({"anyOf": [arr(tool, maxItems=limits.MAX_TOOLS), {"type": "null"}]}, TOOLS_NOTE),
        "tool_choice": choice,
        "thinking": THINKING,
        "reasoning_effort": REASONING_EFFORT,
        "chat_template_kwargs": TEMPLATE_KWARGS,
    }
    props.update({"stop_sequences": STOP, **sampling_props()})  # validated by count_tokens too
    if count_only:
        props["stream"] = desc({"enum": [False, None]}, "count_tokens does not stream (400)")
        return obj(props, ["model", "messages"], closed=False)
    props.update({
        "max_tokens": desc({"anyOf": [{"type": "integer", "minimum": 1, "maximum": INT32_MAX}, const(-1)]},
                           "required; -1: until the model stops or the context is full"),
        "stream": OPT_BOOL,
        "receipt": RECEIPT_FIELD,
        "lora": LORA_FIELD,
        **CHAT_CONTEXT_FIELDS,
    })
    return obj(props, ["model", "messages", "max_tokens"], closed=False)


def native_completion_request() -> Schema:
    return obj({
        "model": desc(STR, "with several models, picks one (404 if not served); else ignored"),
        "prompt": desc({"anyOf": [STR, arr({"anyOf": [STR, NAT]}, minItems=1),
                                  arr({"anyOf": [STR, arr({"anyOf": [STR, NAT]}, minItems=1)]}, minItems=1,
                                      maxItems=1)]},
                       "text, token ids, or both mixed in one array"),
        "n_predict": desc(MAX_TOKENS, "wins over max_tokens"),
        "max_tokens": MAX_TOKENS,
        "stream": OPT_BOOL,
        "stop": STOP,
        "n_probs": integer(0, INT32_MAX),
        "return_tokens": OPT_BOOL,
        "cache_prompt": OPT_BOOL,
        "ignore_eos": OPT_BOOL,
        "response_format": RESPONSE_FORMAT,
        **CONTEXT_FIELDS,
        **OUTPUT_FIELDS,
        "receipt": RECEIPT_FIELD,
        "lora": LORA_FIELD,
        **sampling_props(),
        **SPECULATIVE,
    }, ["prompt"], closed=False)


# --- response shapes ---------------------------------------------------------------------------


def _timings() -> Schema:
    return obj({
        "cache_n": NAT, "prompt_n": NAT, "prompt_ms": NUM, "prompt_per_token_ms": NUM, "prompt_per_second": NUM,
        "predicted_n": NAT, "predicted_ms": NUM, "predicted_per_token_ms": NUM, "predicted_per_second": NUM,
        "queue_ms": NUM, "cache_miss": desc({"type": ["string", "null"]}, "why reusable prompt tokens were not reused"),
        "draft_n": desc(NAT, "speculative decoding: tokens drafted (present when some were)"),
        "draft_n_accepted": desc(NAT, "speculative decoding: drafted tokens the answer kept"),
    }, ["cache_n", "prompt_n", "prompt_ms", "prompt_per_token_ms", "prompt_per_second", "predicted_n",
        "predicted_ms", "predicted_per_token_ms", "predicted_per_second", "queue_ms", "cache_miss"])


def _cache_details() -> Schema:
    return obj({"cached_tokens": NAT, "cache_miss_reason": STR}, ["cached_tokens"])


DRAFT_DETAILS: dict[str, Schema] = {
    "accepted_prediction_tokens": desc(NAT, "speculative decoding: drafted tokens the answer kept"),
    "rejected_prediction_tokens": desc(NAT, "speculative decoding: drafted tokens it refused"),
}


def _usage() -> Schema:
    return obj({"prompt_tokens": NAT, "completion_tokens": NAT, "total_tokens": NAT,
                "prompt_tokens_details": ref("CacheDetails"), "prompt_tokens_per_second": NUM,
                "completion_tokens_per_second": NUM,
                "completion_tokens_details": desc(obj(DRAFT_DETAILS, list(DRAFT_DETAILS)),
                                                  "present when tokens were drafted (speculative decoding)")},
               ["prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details",
                "prompt_tokens_per_second", "completion_tokens_per_second"])


RECEIPT_FIELD: Schema = desc(OPT_BOOL, "true: the answer carries a receipt (the last chunk of a stream) that `bubo "
                                       "verify-receipt` reruns bit for bit; a request without a seed gets one")
RECEIPT: Schema = desc(ref("Receipt"), "with receipt: true in the request")
LORA_FIELD: Schema = desc({"type": "array", "items": {"type": "object", "properties": {
    "id": {"type": "integer", "minimum": 0}, "scale": {"type": "number", "minimum": -1e6, "maximum": 1e6}},
    "required": ["id"], "additionalProperties": False}},
    "LoRA adapters for this request alone (llama-server's): each adapter's id (GET /lora-adapters) and scale "
    "(default 1); the others 0. Without it, the adapters' global scales")
STEERED: Schema = desc(const(True), "present when the grammar steered the answer to a short ending so that it ends "
                                    "within its token budget")
BYTES: Schema = arr({"type": "integer", "minimum": 0, "maximum": 255})


def _token_logprob() -> Schema:
    one = {"token": STR, "logprob": NUM, "bytes": BYTES}
    return obj({**one, "top_logprobs": arr(obj(one, list(one)))}, [*one, "top_logprobs"])


def _tool_call() -> Schema:
    return obj({"id": STR, "type": const("function"),
                "function": obj({"name": STR, "arguments": desc(STR, "JSON text")}, ["name", "arguments"])},
               ["id", "type", "function"])


def _chat_completion() -> Schema:
    message = obj({"role": const("assistant"), "reasoning_content": STR, "content": {"type": ["string", "null"]},
                   "tool_calls": arr(ref("ToolCall"), minItems=1)}, ["role", "content"])
    choice = obj({"index": const(0), "message": message,
                  "logprobs": nullable(obj({"content": arr(ref("TokenLogprob"))}, ["content"])),
                  "finish_reason": enum("stop", "length", "tool_calls"), "steered_to_fit": STEERED},
                 ["index", "message", "logprobs", "finish_reason"])
    return obj({"id": {"type": "string", "pattern": "^chatcmpl-"}, "object": const("chat.completion"),
                "created": INT, "model": STR, "choices": arr(choice, minItems=1, maxItems=1),
                "usage": ref("ChatUsage"), "timings": ref("Timings"), "receipt": RECEIPT},
               ["id", "object", "created", "model", "choices", "usage", "timings"])


def _chat_chunk() -> Schema:
    call_delta = obj({"index": NAT, "id": STR, "type": const("function"),
                      "function": obj({"name": STR, "arguments": STR}, ["arguments"])}, ["index", "function"])
    delta = obj({"role": const("assistant"), "content": {"type": ["string", "null"]}, "reasoning_content": STR,
                 "tool_calls": arr(call_delta, minItems=1, maxItems=1)})
    choice = obj({"index": const(0), "delta": delta,
                  "logprobs": nullable(obj({"content": arr(ref("TokenLogprob"))}, ["content"])),
                  "finish_reason": {"enum": ["stop", "length", "tool_calls", None]}, "steered_to_fit": STEERED},
                 ["index", "delta", "logprobs", "finish_reason"])
    return obj({"id": {"type": "string", "pattern": "^chatcmpl-"}, "object": const("chat.completion.chunk"),
                "created": INT, "model": STR,
                "choices": desc(arr(choice, maxItems=1), "empty in the usage chunk (stream_options.include_usage)"),
                "timings": desc(ref("Timings"), "in the chunk with the finish_reason"),
                "usage": desc(ref("ChatUsage"), "in the usage chunk"), "receipt": RECEIPT},
               ["id", "object", "created", "model", "choices"])


def _completion_logprobs() -> Schema:
    return obj({"tokens": arr(STR), "token_logprobs": arr(NUM),
                "top_logprobs": arr({"type": "object", "additionalProperties": NUM}), "text_offset": arr(NAT)},
               ["tokens", "token_logprobs", "top_logprobs", "text_offset"])


def _text_completion(chunk: bool) -> Schema:
    finish: Schema = {"enum": ["stop", "length", None]} if chunk else enum("stop", "length")
    choice = obj({"text": STR, "index": const(0), "logprobs": nullable(ref("CompletionLogprobs")),
                  "finish_reason": finish, "steered_to_fit": STEERED},
                 ["text", "index", "logprobs", "finish_reason"])
    props: dict[str, Schema] = {"id": {"type": "string", "pattern": "^cmpl-"}, "object": const("text_completion"),
                                "created": INT, "model": STR, "choices": arr(choice, maxItems=1),
                                "usage": ref("ChatUsage"), "timings": ref("Timings"), "receipt": RECEIPT}
    if chunk:
        props["choices"] = desc(arr(choice, maxItems=1), "empty in the usage chunk")
        return obj(props, ["id", "object", "created", "model", "choices"])
    props["choices"] = arr(choice, minItems=1, maxItems=1)
    return obj(props, [k for k in props if k != "receipt"])


def _response_items() -> dict[str, Schema]:
    status = enum("completed", "in_progress")
    reasoning = obj({"type": const("reasoning"), "id": {"type": "string", "pattern": "^rs_"}, "summary": arr({}),
                     "content": arr(obj({"type": const("reasoning_text"), "text": STR}, ["type", "text"])),
                     "status": status}, ["type", "id", "summary", "content", "status"])
    text_part = obj({"type": const("output_text"), "text": STR, "annotations": arr({}), "logprobs": arr({})},
                    ["type", "text", "annotations", "logprobs"])
    message = obj({"type": const("message"), "id": {"type": "string", "pattern": "^msg_"}, "status": status,
                   "role": const("assistant"), "content": arr(text_part)},
                  ["type", "id", "status", "role", "content"])
    call = obj({"type": const("function_call"), "id": {"type": "string", "pattern": "^fc_"}, "call_id": STR,
                "name": STR, "arguments": STR, "status": status},
               ["type", "id", "call_id", "name", "arguments", "status"])
    listed = obj({"id": STR, "type": enum("message", "function_call", "function_call_output", "reasoning")},
                 ["id", "type"], closed=False)
    items = obj({"object": const("list"), "data": arr(listed), "first_id": {"type": ["string", "null"]},
                 "last_id": {"type": ["string", "null"]}, "has_more": BOOL},
                ["object", "data", "first_id", "last_id", "has_more"])
    return {"ReasoningItem": reasoning, "OutputTextPart": text_part, "MessageItem": message, "FunctionCallItem": call,
            "ResponseItemList": items}


def _response() -> Schema:
    usage = obj({"input_tokens": NAT, "input_tokens_details": ref("CacheDetails"), "output_tokens": NAT,
                 "output_tokens_details": obj({"reasoning_tokens": NAT, **DRAFT_DETAILS}, ["reasoning_tokens"]),
                 "total_tokens": NAT},
                ["input_tokens", "input_tokens_details", "output_tokens", "output_tokens_details", "total_tokens"])
    props: dict[str, Schema] = {
        "id": {"type": "string", "pattern": "^resp_"}, "object": const("response"), "created_at": INT,
        "status": enum("completed", "incomplete", "in_progress"), "error": {"type": "null"},
        "incomplete_details": nullable(obj({"reason": const("max_output_tokens")}, ["reason"])),
        "model": STR,
        "output": arr({"anyOf": [ref("ReasoningItem"), ref("MessageItem"), ref("FunctionCallItem")]}),
        "parallel_tool_calls": BOOL, "tool_choice": const("auto"),
        "text": obj({"format": obj({"type": const("text")}, ["type"])}, ["format"]),
        "instructions": {"type": ["string", "null"]}, "max_output_tokens": {"type": ["integer", "null"]},
        "tools": desc({"type": "array"}, "the request's tools, as sent"),
        "temperature": {"type": ["number", "null"]}, "top_p": {"type": ["number", "null"]},
        "metadata": desc({"type": "object"}, "the request's metadata, as sent"),
        "store": BOOL, "previous_response_id": {"type": ["string", "null"]},
        "usage": desc(nullable(usage), "null while in progress"), "steered_to_fit": STEERED, "receipt": RECEIPT,
    }
    return obj(props, [k for k in props if k not in ("steered_to_fit", "receipt")])


def _response_event() -> Schema:
    """One event of a streamed response (each with its sequence_number)."""
    base = {"type": STR, "sequence_number": NAT}
    where = {"item_id": STR, "output_index": NAT}
    item = {"anyOf": [ref("ReasoningItem"), ref("MessageItem"), ref("FunctionCallItem")]}
    kinds: list[Schema] = [
        obj({**base, "type": enum("response.created", "response.in_progress", "response.completed",
                                  "response.incomplete"), "response": ref("Response")},
            ["type", "sequence_number", "response"]),
        obj({**base, "type": enum("response.output_item.added", "response.output_item.done"),
             "output_index": NAT, "item": item}, ["type", "sequence_number", "output_index", "item"]),
        obj({**base, **where, "type": enum("response.content_part.added", "response.content_part.done"),
             "content_index": NAT, "part": ref("OutputTextPart")},
            ["type", "sequence_number", "item_id", "output_index", "content_index", "part"]),
        obj({**base, **where, "type": const("response.output_text.delta"), "content_index": NAT, "delta": STR,
             "logprobs": arr({})}, ["type", "sequence_number", "item_id", "output_index", "content_index", "delta"]),
        obj({**base, **where, "type": const("response.output_text.done"), "content_index": NAT, "text": STR,
             "logprobs": arr({})}, ["type", "sequence_number", "item_id", "output_index", "content_index", "text"]),
        obj({**base, **where, "type": const("response.reasoning_text.delta"), "content_index": NAT, "delta": STR},
            ["type", "sequence_number", "item_id", "output_index", "content_index", "delta"]),
        obj({**base, **where, "type": const("response.reasoning_text.done"), "content_index": NAT, "text": STR},
            ["type", "sequence_number", "item_id", "output_index", "content_index", "text"]),
        obj({**base, **where, "type": const("response.function_call_arguments.delta"), "delta": STR},
            ["type", "sequence_number", "item_id", "output_index", "delta"]),
        obj({**base, **where, "type": const("response.function_call_arguments.done"), "name": STR,
             "arguments": STR}, ["type", "sequence_number", "item_id", "output_index", "name", "arguments"]),
        obj({**base, "type": const("error"), "code": STR, "message": STR, "param": {"type": "null"}},
            ["type", "sequence_number", "code", "message", "param"]),
    ]
    return {"oneOf": kinds}


def _anthropic_shapes() -> dict[str, Schema]:
    usage = obj({"input_tokens": NAT, "output_tokens": NAT, "cache_read_input_tokens": NAT,
                 "cache_creation_input_tokens": NAT,
                 "draft_tokens": desc(NAT, "speculative decoding: tokens drafted (bubo's own; present when some "
                                           "were)"),
                 "draft_tokens_accepted": desc(NAT, "speculative decoding: drafted tokens the answer kept")},
                ["input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"])
    thinking = obj({"type": const("thinking"), "thinking": STR, "signature": STR}, ["type", "thinking", "signature"])
    text = obj({"type": const("text"), "text": STR}, ["type", "text"])
    tool_use = obj({"type": const("tool_use"), "id": STR, "name": STR, "input": ANY_OBJECT},
                   ["type", "id", "name", "input"])
    block = {"anyOf": [thinking, text, tool_use]}
    stop_reason = enum("end_turn", "max_tokens", "stop_sequence", "tool_use")
    message = obj({"id": {"type": "string", "pattern": "^msg_"}, "type": const("message"), "role": const("assistant"),
                   "model": STR, "content": arr(block, minItems=1), "stop_reason": stop_reason,
                   "stop_sequence": {"type": ["string", "null"]}, "usage": usage, "steered_to_fit": STEERED,
                   "receipt": RECEIPT},
                  ["id", "type", "role", "model", "content", "stop_reason", "stop_sequence", "usage"])
    start_msg = obj({"id": {"type": "string", "pattern": "^msg_"}, "type": const("message"),
                     "role": const("assistant"), "model": STR, "content": arr({}, maxItems=0),
                     "stop_reason": {"type": "null"}, "stop_sequence": {"type": "null"},
                     "usage": obj({"input_tokens": NAT, "output_tokens": NAT}, ["input_tokens", "output_tokens"])},
                    ["id", "type", "role", "model", "content", "stop_reason", "stop_sequence", "usage"])
    delta = {"anyOf": [obj({"type": const("thinking_delta"), "thinking": STR}, ["type", "thinking"]),
                       obj({"type": const("text_delta"), "text": STR}, ["type", "text"]),
                       obj({"type": const("input_json_delta"), "partial_json": STR}, ["type", "partial_json"])]}
    event = {"oneOf": [
        obj({"type": const("message_start"), "message": start_msg}, ["type", "message"]),
        obj({"type": const("ping")}, ["type"]),
        obj({"type": const("content_block_start"), "index": NAT,
             "content_block": {"anyOf": [obj({"type": const("thinking"), "thinking": const(""),
                                              "signature": const("")}, ["type", "thinking", "signature"]),
                                         obj({"type": const("text"), "text": const("")}, ["type", "text"]),
                                         obj({"type": const("tool_use"), "id": STR, "name": STR,
                                              "input": obj({}, [])}, ["type", "id", "name", "input"])]}},
            ["type", "index", "content_block"]),
        obj({"type": const("content_block_delta"), "index": NAT, "delta": delta}, ["type", "index", "delta"]),
        obj({"type": const("content_block_stop"), "index": NAT}, ["type", "index"]),
        obj({"type": const("message_delta"),
             "delta": obj({"stop_reason": stop_reason, "stop_sequence": {"type": ["string", "null"]},
                           "steered_to_fit": STEERED}, ["stop_reason", "stop_sequence"]),
             "usage": obj({"output_tokens": NAT}, ["output_tokens"]), "receipt": RECEIPT}, ["type", "delta", "usage"]),
        obj({"type": const("message_stop")}, ["type"]),
        obj({"type": const("error"), "error": ref("AnthropicErrorObject")}, ["type", "error"]),
    ]}
    return {"Message": message, "MessageStreamEvent": event, "AnthropicUsage": usage}


def _native_shapes() -> dict[str, Schema]:
    prob_one = {"id": NAT, "token": STR, "bytes": BYTES, "logprob": NUM}
    prob = obj({**prob_one, "top_logprobs": arr(obj(prob_one, list(prob_one)))}, [*prob_one, "top_logprobs"])
    settings_props: dict[str, Schema] = {
        "n_ctx": NAT, "n_predict": INT, "temperature": NUM, "top_k": INT, "top_p": NUM, "min_p": NUM,
        "typical_p": NUM, "top_n_sigma": NUM, "xtc_probability": NUM, "xtc_threshold": NUM, "repeat_penalty": NUM,
        "repeat_last_n": INT, "presence_penalty": NUM, "frequency_penalty": NUM, "dry_multiplier": NUM,
        "dry_base": NUM, "dry_allowed_length": INT, "dry_penalty_last_n": INT, "mirostat": INT,
        "mirostat_tau": NUM, "mirostat_eta": NUM, "seed": INT, "n_probs": NAT, "stop": arr(STR), "stream": BOOL,
        "cache_prompt": BOOL}
    final_props: dict[str, Schema] = {
        "index": const(0), "content": STR, "tokens": arr(NAT), "id_slot": const(0), "stop": const(True),
        "model": STR, "tokens_predicted": NAT, "tokens_evaluated": NAT,
        "generation_settings": obj(settings_props, list(settings_props)),
        "prompt": STR, "has_new_line": BOOL, "truncated": const(False), "stop_type": enum("eos", "limit", "word"),
        "steered_to_fit": STEERED, "stopping_word": STR, "tokens_cached": NAT, "timings": ref("Timings"),
        "usage": obj({"prompt_tokens": NAT, "completion_tokens": NAT, "total_tokens": NAT},
                     ["prompt_tokens", "completion_tokens", "total_tokens"]),
        "completion_probabilities": desc(arr(ref("TokenProbability")), "with n_probs > 0"),
        "receipt": RECEIPT,
    }
    final = obj(final_props, [k for k in final_props if k not in ("steered_to_fit", "completion_probabilities",
                                                                   "receipt")])
    chunk_props: dict[str, Schema] = {
        "index": const(0), "content": STR, "tokens": arr(NAT), "stop": const(False), "id_slot": const(0),
        "tokens_predicted": NAT, "tokens_evaluated": NAT, "completion_probabilities": arr(ref("TokenProbability"))}
    chunk = obj(chunk_props, [k for k in chunk_props if k != "completion_probabilities"])
    return {"TokenProbability": prob, "Completion": final, "CompletionChunk": chunk}


def _core_shapes() -> dict[str, Schema]:
    status = obj({"value": enum("unloaded", "loading", "loaded", "unloading", "sleeping", "failed"),
                  "failed": const(True), "error": STR}, ["value"])
    model = obj({
        "id": STR, "object": const("model"), "created": INT, "owned_by": const("bubo"),
        "context_length": {"type": ["integer", "null"]}, "max_model_len": {"type": ["integer", "null"]},
        "meta": obj({"n_ctx": {"type": ["integer", "null"]}, "n_ctx_train": {"type": ["integer", "null"]}},
                    ["n_ctx", "n_ctx_train"]),
        "architecture": obj({"input_modalities": arr(const("text"))}, ["input_modalities"]),
        "status": status,
        "aliases": desc(arr(STR), "the model's other names (\"bubo\" on the default model)"),
        "path": desc(STR, "its file or catalog name"),
    }, ["id", "object", "created", "owned_by", "context_length", "max_model_len", "meta", "architecture", "status",
        "aliases", "path"])
    sampling_out: dict[str, Schema] = {}
    for name, s in SAMPLING.items():
        t = s.get("type")
        if name == "dry_sequence_breakers":
            sampling_out[name] = arr(STR)
        elif name == "logit_bias":
            sampling_out[name] = desc({"type": "object", "additionalProperties": {"anyOf": [NUM, const(False)]}},
                                      "{token id: bias}; false: the token is banned")
        else:
            sampling_out[name] = INT if isinstance(t, list) and "integer" in t else NUM
    sampling_out["n_probs"] = NAT
    defaults = {**sampling_out, "n_predict": desc(INT, "the server's -n; -1: none")}
    params = obj(defaults, list(defaults))
    slot_params = obj({**sampling_out, "n_predict": INT, "stop": arr(STR), "cache_prompt": BOOL},
                      [*sampling_out, "n_predict", "stop", "cache_prompt"])
    slot = obj({
        "id": NAT, "n_ctx": NAT, "is_processing": BOOL,
        "state": desc(enum(0, 2, 4), "0 idle, 2 reading its prompt, 4 generating"),
        "id_task": INT, "n_prompt_tokens": NAT, "n_prompt_tokens_processed": NAT, "n_prompt_tokens_cache": NAT,
        "cache_n": NAT, "params": desc({"anyOf": [slot_params, obj({}, [])]}, "{} for a slot never used"),
        "next_token": obj({"has_next_token": BOOL, "n_decoded": NAT, "n_remain": INT},
                          ["has_next_token", "n_decoded", "n_remain"]),
    }, ["id", "n_ctx", "is_processing", "state", "id_task", "n_prompt_tokens", "n_prompt_tokens_processed",
        "n_prompt_tokens_cache", "cache_n", "params", "next_token"])
    props_props: dict[str, Schema] = {
        "model": STR, "model_alias": STR, "model_path": STR,
        "template": {"type": ["string", "null"]}, "chat_template": {"type": ["string", "null"]},
        "bos_token": STR, "eos_token": STR,
        "model_info": obj({"architecture": STR, "name": {"type": ["string", "null"]},
                           "n_ctx_train": {"type": ["integer", "null"]}, "n_vocab": NAT,
                           "n_embd": {"type": ["integer", "null"]}, "n_layer": {"type": ["integer", "null"]}},
                          ["architecture", "name", "n_ctx_train", "n_vocab", "n_embd", "n_layer"]),
        "default_generation_settings": obj({"id": const(0), "n_ctx": NAT, "params": ref("SamplingSettings")},
                                           ["id", "n_ctx", "params"]),
        "total_slots": NAT, "n_ctx": NAT, "n_batch": NAT, "n_ubatch": NAT,
        "queue_size": {"type": ["integer", "null"]},
        "modalities": obj({"vision": const(False), "audio": const(False)}, ["vision", "audio"]),
        "build_info": STR, "is_sleeping": BOOL,
    }
    return {
        "ModelStatus": status, "Model": model,
        "ModelList": obj({"object": const("list"), "data": arr(ref("Model"))}, ["object", "data"]),
        "SamplingSettings": params, "Slot": slot, "Props": obj(props_props, list(props_props)),
    }


def _error_shapes() -> dict[str, Schema]:
    openai_types = sorted(set(errors._OPENAI_TYPE.values()) | {"server_error"})
    anthropic_types = sorted(set(errors._ANTHROPIC_TYPE.values()) | {"api_error"})
    code = desc(STR, "the stable error code (see each response)")
    err = obj({"message": STR, "type": enum(*openai_types), "code": code}, ["message", "type", "code"])
    a_err = obj({"type": enum(*anthropic_types), "message": STR, "code": code}, ["type", "message", "code"])
    return {
        "Error": obj({"error": err}, ["error"]),
        "AnthropicErrorObject": a_err,
        "AnthropicError": obj({"type": const("error"), "error": ref("AnthropicErrorObject"),
                               "request_id": {"type": "string", "pattern": "^req_"}}, ["type", "error", "request_id"]),
    }


def schemas() -> dict[str, Schema]:
    out: dict[str, Schema] = {
        **_error_shapes(),
        "Timings": _timings(), "CacheDetails": _cache_details(), "ChatUsage": _usage(),
        "TokenLogprob": _token_logprob(), "ToolCall": _tool_call(),
        "ChatCompletion": _chat_completion(), "ChatCompletionChunk": _chat_chunk(),
        "CompletionLogprobs": _completion_logprobs(),
        "TextCompletion": _text_completion(chunk=False), "TextCompletionChunk": _text_completion(chunk=True),
        **_response_items(), "Response": _response(), "ResponseStreamEvent": _response_event(),
        **_anthropic_shapes(), **_native_shapes(), **_core_shapes(), "Receipt": _receipt(),
    }
    return out


def _receipt() -> Schema:
    """bubo.receipts' shape (checked against a real receipt in tests/api/test_receipts.py)."""
    ids = arr(NAT)
    sha = {"type": "string", "pattern": "^[0-9a-f]{64}$"}
    props: dict[str, Schema] = {
        "version": const(1), "bubo": STR, "created": INT,
        "model": obj({"name": STR, "path": STR, "sha256": sha}, ["name", "path", "sha256"]),
        "kernel_level": enum("scalar", "avx2", "avx512", "neon"),
        "cache": obj({"type_k": STR, "type_v": STR, "n_ctx": NAT}, ["type_k", "type_v", "n_ctx"]),
        "prompt_tokens": ids,
        "sampling": desc({"type": "object"}, "every sampling parameter in force, the seed included"),
        "max_tokens": {"type": ["integer", "null"]}, "stop": arr(STR), "ignore_eos": BOOL,
        "grammar": nullable(obj({"gbnf": STR, "root": STR}, ["gbnf", "root"])),
        "output_tokens": ids, "logprobs_sha256": sha, "finish_reason": enum("stop", "length"),
        "ended_early": desc(BOOL, "the answer was ended after its one tool call (tokens sampled meanwhile included)"),
        "signature": desc(obj({"algorithm": const("ed25519"), "public_key": STR,
                               "fields": {"type": "object", "additionalProperties": sha}, "value": STR},
                              ["algorithm", "public_key", "fields", "value"]),
                          "with serve --sign-key: over the sha256 of each field"),
    }
    return obj(props, [k for k in props if k != "signature"])


# --- responses ----------------------------------------------------------------------------------

# what each status means, and its codes (bubo/api/errors.py, the routes)
_STATUS_TEXT = {
    400: "The request is not valid. Codes: parse_error (the body is not a JSON object), invalid_value (a field of "
         "the wrong type or out of range), missing_model, missing_messages, unsupported_n, invalid_grammar, "
         "unsupported_schema, context_length_exceeded, model_not_loaded (--no-models-autoload), invalid_request, "
         "invalid_type, bad_request (the body could not be read), too_costly (preparing the request took longer "
         "than --prepare-timeout), no_token_allowed (logit_bias bans every token the answer could start with).",
    401: "No valid API key: send `Authorization: Bearer KEY` or `x-api-key: KEY`. Code invalid_api_key; "
         "header WWW-Authenticate: Bearer.",
    403: "Codes: forbidden_host (the Host header names a host this server does not answer to: it answers to its "
         "bind address, loopback names, IP addresses and --host-allow), forbidden_origin (a request that changes "
         "something from a web page of another origin, its Origin header, that --cors does not allow).",
    404: "Code model_not_found: the model is not served here (the message names the served ones).",
    409: "Code slot_busy: the slot is serving a request; try again once it is idle.",
    413: "Code request_too_large: the body is larger than the server's limit; the connection closes.",
    500: "Code internal_error: a bug (the message says which exception).",
    501: "Code not_implemented.",
    503: "Codes: not_ready (the model is loading: Retry-After: 2; or its load failed), insufficient_memory "
         "(Retry-After: 5), "
         "queue_full (Retry-After: 1), shutting_down (Retry-After: 5, Connection: close), no_slot_available, "
         "cancelled.",
    507: "Code insufficient_memory_permanent: the request needs more memory than this machine has "
         "(insufficient_storage on /api/copy: the store's disk has no room for the copy; cannot_write: a slot "
         "file's disk is full).",
}
_RETRY_AFTER = {"Retry-After": {"description": "seconds to wait before trying again (memory, queue, shutdown)",
                                "schema": {"type": "string", "pattern": "^[0-9]+$"}}}


def error(status: int, anthropic: bool = False, text: str | None = None, ollama: bool = False,
          shape: str | None = None) -> Schema:
    """A status's error response, in the route's shape (shape: a component's name, else by the flags)."""
    shape = shape or ("AnthropicError" if anthropic else "OllamaError" if ollama else "Error")
    out: Schema = {"description": text or _STATUS_TEXT[status], "content": {JSON: {"schema": ref(shape)}}}
    if status == 503:
        out["headers"] = _RETRY_AFTER
    if status == 401:
        out["headers"] = {"WWW-Authenticate": {"schema": const("Bearer")}}
    return out


def ok(schema: Schema, text: str, stream: Schema | None = None, stream_text: str = "") -> Schema:
    content: Schema = {JSON: {"schema": schema}}
    if stream is not None:
        content[SSE] = {"schema": stream}
    return {"description": text + (f" With \"stream\": true, {stream_text}" if stream is not None else ""),
            "content": content}


def sse_data(json_schema: Schema, done: bool = False, named: bool = False) -> Schema:
    """One server-sent event whose data is JSON (or `[DONE]`, with done); named: each event has
    an `event:` line naming its type."""
    data = {"type": "string", "contentMediaType": JSON, "contentSchema": json_schema}
    event: Schema = {"type": "object", "required": ["data"], "properties": {"data": data}}
    if named:
        event["required"] = ["event", "data"]
        event["properties"]["event"] = STR
    else:  # no event: line, so the event's type is "message" (the SSE default)
        event["properties"]["event"] = const("message")
    if done:
        event = {"type": "object", "required": ["data"],
                 "if": {"properties": {"data": const("[DONE]")}},
                 "then": {"properties": {"event": const("message")}},
                 "else": event}
    return event


def path_param(name: str, text: str) -> Schema:
    return {"name": name, "in": "path", "required": True, "schema": STR, "description": text}


def item_list_params() -> list[Schema]:
    """A cursor list's query: limit, order, after."""
    return [{"name": "limit", "in": "query", "required": False, "schema": {"type": "integer", "minimum": 1,
                                                                            "maximum": 100, "default": 20}},
            {"name": "order", "in": "query", "required": False, "schema": {**enum("asc", "desc"), "default": "desc"}},
            {"name": "after", "in": "query", "required": False, "schema": STR,
             "description": "the page after this item's id"}]


def text_ok(text: str, media: str, example: str | None = None) -> Schema:
    m: Schema = {"schema": STR}
    if example is not None:
        m["example"] = example
    return {"description": text, "content": {media: m}}


# --- the document ---------------------------------------------------------------------------------


class Doc:
    """The document being assembled, for one server: its config, the model names its requests
    may use, whether it is a router, and its paths so far. A route's declaration (route()) is a
    function of it."""

    def __init__(self, config: ServerConfig, names: list[str], router: bool, debug: bool):
        self.config, self.names, self.router, self.debug = config, names, router, debug
        self.keys = bool(config.api_keys)
        self.paths: dict[str, dict[str, Schema]] = {}
        self.example_model = DEFAULT_NAME if DEFAULT_NAME in names else names[0]

    def add(self, paths: tuple[str, ...], method: str, op: Op) -> None:
        """op at each path (the later ones aliases of the first)."""
        for i, path in enumerate(paths):
            o = dict(op.spec)
            o["operationId"] = op.spec["operationId"] + ("" if i == 0 else "_" + slug(path))
            if i:
                o["summary"] = f"{op.spec['summary']} (alias of {paths[0]})"
            responses = dict(o["responses"])
            # every route: 503 shutting_down while the server drains, 403 forbidden_host for a Host
            # the server does not answer to (and forbidden_origin for a web page of another origin)
            wanted = set(op.errors) | {403, 503}
            if self.keys and not op.public:
                wanted.add(401)
            for status in sorted(wanted):
                responses.setdefault(str(status), error(status, op.anthropic, ollama=op.ollama, shape=op.error_shape))
            o["responses"] = responses
            if op.public and self.keys:
                o["security"] = []
            self.paths.setdefault(path, {})[method] = o

    def model_field(self) -> Schema:
        return {"type": "string", "enum": list(self.names),
                "description": f"one of the served names ('{DEFAULT_NAME}' names the default model); any other "
                               "is a 404 model_not_found, none a 400 missing_model"}

    def optional_model_field(self) -> Schema:
        if self.router:
            return desc({"type": "string", "enum": list(self.names)},
                        "the model to use (default: the first one); another name is a 404")
        return desc(STR, "ignored: this server serves one model")

    def model_query(self, checked: bool = False) -> Schema:
        if self.router:
            text = "the model (default: the first one); a name not served is a 404 model_not_found"
        elif checked:
            text = "checked: a name not served is a 404 model_not_found"
        else:
            text = "ignored: this server serves one model"
        return {"name": "model", "in": "query", "required": False, "schema": STR, "description": text}

    def chat_example(self) -> Schema:
        return {"model": self.example_model, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8}


@dataclass(frozen=True)
class Op:
    """One operation: its OpenAPI object, and the error statuses it answers beyond those every
    route answers (403 and 503; 401 with API keys), in which error shape."""

    spec: Schema
    errors: tuple[int, ...] = ()
    anthropic: bool = False
    public: bool = False  # answers without an API key
    ollama: bool = False
    error_shape: str | None = None  # the component its errors have, when not one of the above (MCP's)


# a route's declaration: its operation for every method, or one per method ("post"), or one per
# method and path ("post /api/create": that path's own operation, not an alias of the first)
Build = Callable[[Doc], Op | dict[str, Op]]


@dataclass(frozen=True)
class Declared:
    paths: tuple[str, ...]  # Flask's form (/sdapi/v1/<path:rest>)
    methods: tuple[str, ...]
    build: Build


def route(blueprint: Blueprint, *paths: str, methods: tuple[str, ...] = ("GET",),
          doc: Build) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register the view at paths (the first is the route's name; the others are its aliases)
    with its OpenAPI declaration, from which /openapi.json is assembled."""

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        for p in paths:
            blueprint.add_url_rule(p, fn.__name__, fn, methods=list(methods))
        fn.openapi = Declared(paths, methods, doc)  # type: ignore[attr-defined]
        return fn
    return deco


def declared(fn: Callable[..., Any]) -> Declared | None:
    decl = getattr(fn, "openapi", None)
    return decl if isinstance(decl, Declared) else None


def components(blueprint: Blueprint, shapes: Callable[[], dict[str, Schema]]) -> None:
    """The component schemas a blueprint's operations refer to beyond the shared ones."""
    blueprint.openapi_components = shapes  # type: ignore[attr-defined]


def openapi_path(rule: str) -> str:
    """A Flask rule in OpenAPI's form: /sdapi/v1/<path:rest> -> /sdapi/v1/{rest}."""
    return re.sub(r"<(?:[a-z]+:)?([a-z_]+)>", r"{\1}", rule)


def slug(path: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in path).strip("_")


def body(schema: Schema, example: Schema | None = None) -> Schema:
    media: Schema = {"schema": schema}
    if example is not None:
        media["example"] = example
    return {"required": True, "content": {JSON: media}}


GEN_ERRORS = (400, 404, 413, 500, 503, 507)


def document(app: Flask, config: ServerConfig, registry: Registry | None = None) -> Schema:
    """The OpenAPI 3.1 document of this app's routes (each route's declaration, see route()),
    for a server with this config (and these models)."""
    names = registry.names() if registry is not None else config.model_names
    router = registry.is_router if registry is not None else False
    d = Doc(config, names, router, config.debug_routes_enabled)
    views: list[Callable[..., Any]] = []
    for view in app.view_functions.values():
        if declared(view) is not None and view not in views:
            views.append(view)
    for view in views:
        decl = declared(view)
        assert decl is not None
        built = decl.build(d)
        paths = tuple(openapi_path(p) for p in decl.paths)
        for method in (m.lower() for m in decl.methods if m not in ("HEAD", "OPTIONS")):
            if isinstance(built, Op):
                d.add(paths, method, built)
                continue
            if method in built:
                d.add(paths, method, built[method])
            for path in paths:
                if f"{method} {path}" in built:
                    d.add((path,), method, built[f"{method} {path}"])
    shapes = schemas()
    for bp in app.blueprints.values():
        extra = getattr(bp, "openapi_components", None)
        if extra is not None:
            shapes.update(extra())
    doc: Schema = {
        "openapi": "3.1.0",
        "info": {"title": "bubo", "version": bubo.__version__, "description": DESCRIPTION,
                 "license": {"name": "MIT", "identifier": "MIT"}},
        "tags": [{"name": "OpenAI"}, {"name": "Anthropic"}, {"name": "llama-server"}, {"name": "Ollama"},
                 {"name": "bubo"}],
        "paths": d.paths,
        "components": {"schemas": shapes},
    }
    if d.keys:
        doc["components"]["securitySchemes"] = {
            "bearer": {"type": "http", "scheme": "bearer"},
            "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key"},
        }
        doc["security"] = [{"bearer": []}, {"apiKey": []}]
    return doc


def undeclared(app: Flask) -> list[str]:
    """The app's routes (METHOD path) that no declaration covers."""
    out = []
    for rule in app.url_map.iter_rules():
        if rule.endpoint == "static":
            continue
        decl = declared(app.view_functions[rule.endpoint])
        for m in sorted((rule.methods or set()) - {"HEAD", "OPTIONS"}):
            if decl is None or rule.rule not in decl.paths or m not in decl.methods:
                out.append(f"{m} {rule.rule}")
    return out


DESCRIPTION = """\
bubo, a local LLM inference server: OpenAI (chat completions, completions, Responses), Anthropic
(Messages) and llama-server routes over the same engine.

This document describes this server as it runs: its routes, the model names its requests may
use, and, when it has API keys, the 401 answers. Every operation also answers HEAD (for GET) and
OPTIONS (CORS preflight, without a key). An unknown path is a 404 not_found, a method a path does
not take a 405 method_not_allowed with an Allow header, both in the OpenAI error shape.

Errors: the OpenAI shape `{"error": {"message", "type", "code"}}` on every route but
/v1/messages and /v1/messages/count_tokens, which answer Anthropic's `{"type": "error",
"error": {"type", "message", "code"}, "request_id"}`; `code` is the stable code. A stream that
already answered 200 reports an error in-band, in its dialect's shape. Refusals made before a
request reaches a route (malformed framing: 400 bad_request; headers too slow: 408
request_timeout; too many connections: 503 too_many_connections) use the OpenAI shape on every
path and close the connection.

Request bodies are JSON objects (the Content-Type is not checked); unknown fields are ignored.
Limits beyond types: depth 128, numbers of at most 100 characters, no lone surrogates (400).
"""
