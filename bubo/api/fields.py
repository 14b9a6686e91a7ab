"""Request fields, validated: the rules every dialect shares, one function per field (or group).

Pure functions on JSON bodies (dicts) that raise ApiError with the reference's code; each
dialect's parse_* function (openai/, anthropic/, llamacpp/) calls them in its own order. What a
field becomes is a typed value: SamplingParams, an OutputSpec (bubo.chat.constrain), the
template's messages, ..."""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from bubo.api import jsonin
from bubo.api.errors import ApiError
from bubo.chat.constrain import REQUIRED, ConstraintError, OutputSpec, gbnf_spec, json_object_spec, schema_spec
from bubo.sampling import SamplingParams

# the code of a 400 for a field of the wrong type or out of range (the reference's table has
# no name for it; OpenAI's own API says "invalid_value")
INVALID = "invalid_value"

FLT_MAX = 3.4028234663852886e38
INT32_MAX = 2**31 - 1

REASONING_EFFORTS = ("off", "none", "minimal", "low", "medium", "high", "xhigh", "max")
# template variables the server sets itself
RESERVED_TEMPLATE_KWARGS = {"messages", "tools", "add_generation_prompt", "bos_token", "eos_token",
                            "specials_in_content"}

# every SamplingParams field is read from the request under its own name (llama-server's names)
_SAMPLING_FIELDS = [f for f in SamplingParams.__dataclass_fields__ if f not in ("n_probs",)]


def invalid(message: str) -> ApiError:
    return ApiError(400, INVALID, message)


def new_id(prefix: str) -> str:
    return prefix + uuid.uuid4().hex[:24]


def now() -> int:
    return int(time.time())


def require_object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise invalid(f"the request body must be a JSON object, got {type(body).__name__}")
    return body


# --- sampling and limits -------------------------------------------------------------------


def _logit_bias(value: Any) -> dict[int, float]:
    """OpenAI's {"token id": bias} or llama-server's [[id, bias], ...] (bias false: a ban)."""
    out: dict[int, float] = {}
    items: Iterable[Any]
    if isinstance(value, Mapping):
        items = value.items()
    elif isinstance(value, list):
        items = value
    else:
        raise invalid("logit_bias must be an object {token id: bias} or a list of [token id, bias]")
    for item in items:
        if not isinstance(item, (list, tuple)) or len(item) != 2:
            raise invalid(f"logit_bias entries must be [token id, bias] pairs, got {item!r}")
        tok, bias = item
        try:
            tok = int(tok)
        except (TypeError, ValueError):
            raise invalid(f"logit_bias keys must be token ids, got {tok!r}") from None
        if bias is False:
            bias = -math.inf
        if isinstance(bias, bool) or not isinstance(bias, (int, float)):
            raise invalid(f"logit_bias[{tok}] must be a number, got {bias!r}")
        out[tok] = float(bias)
    return out


def sampling_params(body: Mapping[str, Any], n_probs: int = 0) -> SamplingParams:
    """The sampling fields of a request (null or absent: llama-server's default)."""
    given: dict[str, Any] = {}
    for name in _SAMPLING_FIELDS:
        v = body.get(name)
        if v is None:
            continue
        if name == "logit_bias":
            v = _logit_bias(v)
        elif name == "seed" and isinstance(v, int) and not isinstance(v, bool) and v < -1:
            raise invalid(f"seed must be -1 (random) or a non-negative integer, got {v}")
        given[name] = v
    for name, v in given.items():
        # the native sampler holds these as C floats: a larger double would become inf there
        if isinstance(v, float) and math.isfinite(v) and abs(v) > FLT_MAX:
            raise invalid(f"{name} = {v!r} is out of range (at most {FLT_MAX:.3g} in magnitude)")
    # integers sent as floats (1.0) are accepted where an integer is meant
    for name in ("top_k", "repeat_last_n", "dry_allowed_length", "dry_penalty_last_n", "mirostat", "min_keep", "seed"):
        v = given.get(name)
        if isinstance(v, float) and v.is_integer():
            given[name] = int(v)
    try:
        return SamplingParams(n_probs=n_probs, **given)
    except (ValueError, TypeError) as e:
        raise invalid(str(e)) from None


def max_tokens_of(body: Mapping[str, Any], *names: str) -> int | None:
    """The first of names present: -1 or null keeps the default (None: until the model stops
    or the context is full); any other value must be a positive integer."""
    for name in names:
        if name not in body:
            continue
        v = body[name]
        if v is None or (v == -1 and not isinstance(v, bool)):
            return None
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int) or not 0 < v <= INT32_MAX:
            raise invalid(f"{name} must be a positive integer (at most {INT32_MAX}), or -1 or null for the default; "
                          f"got {body[name]!r}")
        return v
    return None


def stop_list(value: Any, name: str = "stop") -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value] if value else []
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        return [s for s in value if s]
    raise invalid(f"{name} must be a string or an array of strings")


def check_n(body: Mapping[str, Any]) -> None:
    n = body.get("n")
    if n is not None and (isinstance(n, bool) or n != 1):
        raise ApiError(400, "unsupported_n", f"only n = 1 is supported, got n = {n!r}")


def n_probs_of(body: Mapping[str, Any], name: str = "n_probs") -> int:
    v = body.get(name)
    if v is None:
        return 0
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise invalid(f"{name} must be a non-negative integer, got {v!r}")
    return v


def bool_field(body: Mapping[str, Any], name: str, default: bool) -> bool:
    v = body.get(name)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise invalid(f"{name} must be true or false, got {v!r}")
    return v


def output_spec(body: Mapping[str, Any]) -> OutputSpec | None:
    """The one output constraint of a request, validated and converted (not compiled): llama-server's
    `grammar` (GBNF), its `json_schema` (a schema), or `response_format` (json_object or
    json_schema, see response_format_spec). Two of them together is a 400: which one wins would be
    a guess."""
    text = body.get("grammar")
    fields = (("grammar", text not in (None, "")),
              ("json_schema", body.get("json_schema") is not None),
              ("response_format", body.get("response_format") not in (None, {"type": "text"})))
    given = [name for name, present in fields if present]
    if len(given) > 1:
        raise invalid(f"give {given[0]} or {given[1]}, not both")
    if body.get("json_schema") is not None:
        return schema(body["json_schema"], "json_schema")
    if body.get("response_format") is not None:
        return response_format_spec(body["response_format"])
    if text is None or text == "":
        return None
    if not isinstance(text, str):
        raise invalid(f"grammar must be a string of GBNF rules, not {type(text).__name__}")
    return gbnf_spec(text)


def constraint_error(e: ConstraintError) -> ApiError:
    return ApiError(400, e.code, e.message)


def schema(value: Any, where: str) -> OutputSpec:
    """A JSON Schema field: the grammar of its instances; a keyword that cannot be enforced is a
    400 unsupported_schema whose message names its JSON pointer."""
    try:
        return schema_spec(value, where)
    except ConstraintError as e:
        raise constraint_error(e) from None


def response_format_spec(value: Any, name: str = "response_format", flat: bool = False) -> OutputSpec | None:
    """None for plain text; json_object: any JSON object (or, as llama-server allows, the
    instances of its `schema`); json_schema: the instances of the schema, from
    {"json_schema": {"name", "schema", "strict"}} (chat) or {"name", "schema", "strict"} (Responses'
    text.format, flat) or, as llama-server also takes, {"schema"} beside the type. The schema is
    enforced whatever `strict` says."""
    kinds = '{"type": "text"}, {"type": "json_object"} or {"type": "json_schema", ...}'
    if value is None:
        return None
    if not isinstance(value, dict):
        raise invalid(f"{name} must be {kinds}")
    kind = value.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        if value.get("schema") is not None:
            return schema(value["schema"], f"{name}.schema")
        return json_object_spec(name)
    if kind == "json_schema":
        spec: Any = value
        where = name
        if not flat and ("json_schema" in value or "schema" not in value):
            spec, where = value.get("json_schema"), f"{name}.json_schema"
            if not isinstance(spec, dict):
                raise invalid(f'{where} must be an object like {{"name": ..., "schema": {{...}}}}')
        if spec.get("schema") is None:
            raise invalid(f"{where}.schema is required")
        return schema(spec["schema"], f"{where}.schema")
    raise invalid(f"{name} must be {kinds}")


# --- thinking ------------------------------------------------------------------------------


def thinking_of(body: Mapping[str, Any]) -> tuple[bool, dict[str, Any]]:
    """(thinking on?, the chat template's extra variables) from reasoning_effort, thinking and
    chat_template_kwargs, which must agree. Thinking is on unless a field turns it off."""
    kwargs = body.get("chat_template_kwargs")
    if kwargs is None:
        kwargs = {}
    if not isinstance(kwargs, dict):
        raise invalid("chat_template_kwargs must be an object")
    reserved = sorted(set(kwargs) & RESERVED_TEMPLATE_KWARGS)
    if reserved:
        raise invalid(f"chat_template_kwargs.{reserved[0]} is set by the server (from the request's own fields); "
                      "leave it out")
    said: dict[str, bool] = {}  # field -> thinking on?
    effort = body.get("reasoning_effort")
    if effort is not None:
        if effort not in REASONING_EFFORTS:
            raise invalid(f"reasoning_effort must be one of {', '.join(REASONING_EFFORTS)}; got {effort!r}")
        said["reasoning_effort"] = effort not in ("off", "none")
    thinking = body.get("thinking")
    if thinking is not None:
        kind = thinking.get("type") if isinstance(thinking, dict) else None
        if kind not in ("enabled", "disabled", "adaptive"):
            raise invalid('thinking must be {"type": "enabled"} or {"type": "disabled"}')
        said["thinking"] = kind != "disabled"
    if "enable_thinking" in kwargs:
        if not isinstance(kwargs["enable_thinking"], bool):
            raise invalid("chat_template_kwargs.enable_thinking must be true or false")
        said["chat_template_kwargs.enable_thinking"] = kwargs["enable_thinking"]
    kw_effort = kwargs.get("reasoning_effort")
    if kw_effort is not None:
        if kw_effort not in REASONING_EFFORTS:
            raise invalid(f"chat_template_kwargs.reasoning_effort must be one of {', '.join(REASONING_EFFORTS)}")
        said["chat_template_kwargs.reasoning_effort"] = kw_effort not in ("off", "none")
        if effort is not None and kw_effort != effort:
            raise ApiError(400, INVALID, f"reasoning_effort ({effort!r}) and chat_template_kwargs.reasoning_effort "
                                         f"({kw_effort!r}) disagree: send one, or the same value in both")
    if len(set(said.values())) > 1:
        on = [k for k, v in said.items() if v]
        off = [k for k, v in said.items() if not v]
        raise ApiError(400, INVALID, f"{' and '.join(on)} turn thinking on but {' and '.join(off)} turn it off: "
                                     "these fields must agree")
    enabled = next(iter(said.values()), True)
    extra = dict(kwargs)
    extra["enable_thinking"] = enabled
    if effort is not None and "reasoning_effort" not in extra:
        extra["reasoning_effort"] = effort
    return enabled, extra


# --- messages ------------------------------------------------------------------------------


def content_text(content: Any, where: str) -> str:
    """A message's content as the text the template sees: a string, an array of text parts
    (joined), or null (empty)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for i, part in enumerate(content):
            if isinstance(part, str):
                texts.append(part)
                continue
            if not isinstance(part, dict):
                raise invalid(f"{where}.content[{i}] must be an object with a type")
            kind = part.get("type")
            if kind in ("text", "input_text", "output_text"):
                if not isinstance(part.get("text"), str):
                    raise invalid(f"{where}.content[{i}].text must be a string")
                texts.append(part["text"])
            elif kind in ("image_url", "input_image", "image", "input_audio", "file", "input_file", "document"):
                raise invalid(f"{where}.content[{i}] is of type {kind!r}, but this model takes text only")
            else:
                raise invalid(f"{where}.content[{i}] has an unknown type {kind!r}")
        return "\n".join(texts) if len(texts) > 1 and all(texts) else "".join(texts)
    raise invalid(f"{where}.content must be a string, an array of parts or null")


ROLES = ("system", "developer", "user", "assistant", "tool")


def chat_messages(messages: Any) -> tuple[list[dict[str, Any]], str | None]:
    """OpenAI messages -> (the template's messages, the prefill). A final assistant message is a
    prefill: it is not rendered as a finished turn; the answer continues its text."""
    if messages is None:
        raise ApiError(400, "missing_messages", "messages is required: a non-empty array of messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "missing_messages", "messages must be a non-empty array of messages")
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise invalid(f"{where} must be an object with role and content")
        role = m.get("role")
        if role not in ROLES:
            raise invalid(f"{where}.role must be one of {', '.join(ROLES)}; got {role!r}")
        msg: dict[str, Any] = {"role": "system" if role == "developer" else role,
                               "content": content_text(m.get("content"), where)}
        if role == "assistant" and m.get("tool_calls"):
            msg["tool_calls"] = _template_tool_calls(m["tool_calls"], where)
        if role == "assistant" and isinstance(m.get("reasoning_content"), str):
            msg["reasoning_content"] = m["reasoning_content"]
        if role == "tool":
            if m.get("tool_call_id") is not None:
                msg["tool_call_id"] = str(m["tool_call_id"])
            if isinstance(m.get("name"), str):
                msg["name"] = m["name"]
        out.append(msg)
    prefill = None
    if out[-1]["role"] == "assistant" and not out[-1].get("tool_calls"):
        prefill = out.pop()["content"]
        if not out:
            raise ApiError(400, "missing_messages", "messages holds only an assistant prefill: add a user message")
    return out, prefill


def _template_tool_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    """tool_calls as templates expect them: arguments as an object (OpenAI sends JSON text)."""
    if not isinstance(calls, list):
        raise invalid(f"{where}.tool_calls must be an array")
    out = []
    for j, c in enumerate(calls):
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise invalid(f'{where}.tool_calls[{j}] must be {{"type": "function", "function": '
                          '{"name": ..., "arguments": ...}}')
        args = fn.get("arguments")
        if isinstance(args, str):
            try:
                args = jsonin.parse(args) if args.strip() else {}
            except jsonin.JSONInputError as e:
                raise invalid(f"{where}.tool_calls[{j}].function.arguments is not valid JSON: {e.message}") from None
        out.append({"id": c.get("id"), "type": "function", "function": {"name": fn["name"], "arguments": args}})
    return out


def chat_tools(tools: Any) -> list[dict[str, Any]] | None:
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise invalid("tools must be an array of {\"type\": \"function\", \"function\": {...}}")
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(fn, dict):
            raise invalid(f'tools[{i}] must be {{"type": "function", "function": '
                          '{"name": ..., "parameters": ...}}')
    check_tools(tools)
    return tools or None


def check_tools(tools: list[dict[str, Any]], field: str = "parameters") -> None:
    """Tools (OpenAI function tools, as every dialect's tools become) that a call can name:
    each has a name, no two the same, and parameters that are the schema of an object (a
    call's arguments are one). field: the dialect's name for the schema, for the message."""
    seen: dict[str, int] = {}
    for i, t in enumerate(tools):
        fn = t["function"]
        name = fn.get("name")
        if not isinstance(name, str) or not name.strip():
            raise invalid(f"tools[{i}] has no name: every tool needs one (a non-empty string)")
        if name in seen:
            raise invalid(f"tools[{i}] is named {name!r}, as tools[{seen[name]}] is: tool names must be unique")
        seen[name] = i
        schema = fn.get("parameters")
        if schema is None:
            continue
        kind = schema.get("type", "object") if isinstance(schema, dict) else None
        if not isinstance(schema, dict) or not (kind == "object" or (isinstance(kind, list) and "object" in kind)):
            got = f"type {kind!r}" if isinstance(schema, dict) else type(schema).__name__
            raise invalid(f"tools[{i}] ({name!r}): {field} must be the JSON Schema of an object (a call's "
                          f"arguments are a JSON object), not {got}")


# --- tool choice --------------------------------------------------------------------------


def check_forced_call_alone(forced: str | None, grammar: OutputSpec | None) -> None:
    """A forced call (tool_choice required or named) is a grammar of the template's call format; a
    grammar or response_format constrains the same tokens to something else, so the two together
    cannot both hold: a 400 rather than a broken call."""
    if forced is not None and grammar is not None:
        raise invalid("tool_choice forces a tool call, which grammar/response_format would constrain to something "
                      "else: send one of them")


def check_tool_choice(choice: str | None, tools: list[dict[str, Any]] | None) -> str | None:
    """None (the model decides), REQUIRED, or the name of the function to call (one of tools)."""
    if choice is None:
        return None
    if not tools:
        raise invalid("tool_choice asks for a tool call, but the request has no tools")
    if choice != REQUIRED:
        names = [t["function"]["name"] for t in tools]
        if choice not in names:
            raise invalid(f"tool_choice names the function {choice!r}, which is not in tools ({', '.join(names)})")
    return choice


def openai_tool_choice(choice: Any, tools: list[dict[str, Any]] | None, named: str | None,
                       shape: str) -> tuple[list[dict[str, Any]] | None, str | None]:
    """OpenAI's tool_choice ("none", "auto", "required" or a named function; named: the name the
    dialect's object form gave, or None): (the tools to render, None / REQUIRED / the name). "none"
    hides the tools. shape: the dialect's object form, for the error."""
    if choice == "none":
        return None, None
    if choice is None or choice == "auto":
        return tools, None
    if choice == "required":
        return tools, check_tool_choice(REQUIRED, tools)
    if isinstance(named, str):
        return tools, check_tool_choice(named, tools)
    raise invalid(f'tool_choice must be "none", "auto", "required" or {shape}')
