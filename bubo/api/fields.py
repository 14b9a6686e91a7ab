"""Request fields, validated: the rules every dialect shares, one function per field (or group).

Pure functions on JSON bodies (dicts) that raise ApiError with the reference's code; each
dialect's parse_* function (openai/, anthropic/, llamacpp/) calls them in its own order. What a
field becomes is a typed value: SamplingParams, an OutputSpec (bubo.chat.constrain), the
template's messages, ...

The rules the library's bubo.Model shares (output constraints, messages, tools, tool_choice,
thinking) live in bubo/chat/request.py, raising RequestError; their wrappers here make those
400s with the same code and message."""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from flask import current_app, has_app_context

from bubo import limits
from bubo.api import jsonin
from bubo.api.config import REASONING_FORMATS, ServerConfig
from bubo.api.errors import ApiError
from bubo.chat import request as rq
from bubo.chat.constrain import OutputSpec, schema_spec
from bubo.chat.request import INVALID
from bubo.engine.draft import MAX_DRAFT_PER_REQUEST
from bubo.errors import RequestError
from bubo.sampling import SamplingParams

FLT_MAX = 3.4028234663852886e38
INT32_MAX = 2**31 - 1

# every SamplingParams field is read from the request under its own name (llama-server's names)
_SAMPLING_FIELDS = [f for f in SamplingParams.__dataclass_fields__ if f not in ("n_probs",)]
_INT_FIELDS = [f.name for f in SamplingParams.__dataclass_fields__.values() if f.type == "int"]


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
    if isinstance(value, (Mapping, list)) and len(value) > limits.MAX_LOGIT_BIAS:
        raise invalid(f"logit_bias has {len(value):,} entries; at most {limits.MAX_LOGIT_BIAS:,} are accepted")
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
        tok = _token_id(tok)
        if bias is False:
            bias = -math.inf
        if isinstance(bias, bool) or not isinstance(bias, (int, float)):
            raise invalid(f"logit_bias[{tok}] must be a number, got {bias!r}")
        # -inf (or false) bans the token; anything else must be a C float
        if bias != -math.inf and not (math.isfinite(bias) and abs(bias) <= FLT_MAX):
            raise invalid(f"logit_bias[{tok}] = {bias!r} is out of range (a finite number of at most "
                          f"{FLT_MAX:.3g} in magnitude, or false to ban the token)")
        out[tok] = float(bias)
    return out


def _token_id(tok: object) -> int:
    """A logit_bias key: an integer (1.0 too), or its decimal digits as a string (OpenAI's object
    keys)."""
    if isinstance(tok, int) and not isinstance(tok, bool):
        return tok
    if isinstance(tok, float) and math.isfinite(tok) and tok.is_integer():
        return int(tok)
    if isinstance(tok, str) and tok.isascii() and tok.lstrip("-").isdigit() and len(tok) <= 20:
        return int(tok)
    raise invalid(f"logit_bias keys must be token ids, got {tok!r}")


def server_defaults() -> tuple[dict[str, Any], int | None]:
    """The server's defaults for requests that leave a field out: its sampling flags (--temp,
    --top-k, ...) and -n; none outside a request (a test building requests by hand)."""
    cfg = current_app.config.get("BUBO_CONFIG") if has_app_context() else None
    if isinstance(cfg, ServerConfig):
        return cfg.sampling_defaults, cfg.n_predict
    return {}, None


def sampling_params(body: Mapping[str, Any], n_probs: int = 0) -> SamplingParams:
    """The sampling fields of a request (null or absent: the server's --temp, --top-k, ... if
    given, else llama-server's defaults)."""
    given: dict[str, Any] = dict(server_defaults()[0])
    present = body.keys()  # looked up without counting as read (Body): only a field there is read
    for name in _SAMPLING_FIELDS:
        if name not in present:
            continue
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
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and abs(v) > FLT_MAX:
            raise invalid(f"{name} = {v!r} is out of range (at most {FLT_MAX:.3g} in magnitude)")
    # integers sent as floats (1.0) are accepted where an integer is meant
    for name in _INT_FIELDS:
        v = given.get(name)
        if isinstance(v, float) and v.is_integer():
            given[name] = int(v)
    try:
        return SamplingParams(n_probs=n_probs, **given)
    except (ValueError, TypeError) as e:
        raise invalid(str(e)) from None




def draft_max_of(body: Mapping[str, Any]) -> int | None:
    """llama-server's per-request speculative decoding field: `speculative.n_max` (most drafted
    tokens checked per forward pass; 0 turns drafting off for this request; absent: the
    server's). `speculative.n_min` and `speculative.p_min` are checked only: the server's
    --draft-min and --draft-p-min apply to every request."""
    n_max = body.get("speculative.n_max")
    if n_max is not None and (isinstance(n_max, bool) or not isinstance(n_max, int)
                              or not 0 <= n_max <= MAX_DRAFT_PER_REQUEST):
        raise invalid(f"speculative.n_max must be an integer from 0 (no drafting) to {MAX_DRAFT_PER_REQUEST}, "
                      f"got {n_max!r}")
    n_min = body.get("speculative.n_min")
    if n_min is not None and (isinstance(n_min, bool) or not isinstance(n_min, int)
                              or not 0 <= n_min <= (n_max if n_max is not None else MAX_DRAFT_PER_REQUEST)):
        raise invalid(f"speculative.n_min must be an integer from 0 to speculative.n_max, got {n_min!r}")
    p_min = body.get("speculative.p_min")
    if p_min is not None and (isinstance(p_min, bool) or not isinstance(p_min, (int, float)) or not 0 <= p_min <= 1):
        raise invalid(f"speculative.p_min must be a number from 0 to 1, got {p_min!r}")
    return n_max if isinstance(n_max, int) else None


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
    return server_defaults()[1]  # the server's -n, if given


def stop_list(value: Any, name: str = "stop") -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        value = [value]
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        with RequestErrors():
            limits.check_stop(value, name)
        return [s for s in value if s]
    raise invalid(f"{name} must be a string or an array of strings")


def counted(items: Any, name: str, most: int, what: str = "items") -> None:
    """400 naming the field when the list holds more than most (bubo.limits)."""
    with RequestErrors():
        limits.check_count(items, name, most, what)


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
    if v > limits.MAX_N_PROBS:
        raise invalid(f"{name} must be at most {limits.MAX_N_PROBS}, got {v}")
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
    a guess. (bubo.chat.request.output_spec, the library's too.)"""
    with RequestErrors():
        return rq.output_spec(body.get("grammar"), body.get("json_schema"), body.get("response_format"))


def constraint_error(e: RequestError) -> ApiError:
    return ApiError(400, e.code, e.message)


class RequestErrors:
    """`with RequestErrors():` turns the RequestErrors of bubo.chat.request's validators (shared
    with the library) into the API's 400s with their codes."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, e: BaseException | None, tb: object) -> None:
        if isinstance(e, RequestError):
            raise constraint_error(e) from None


def schema(value: Any, where: str) -> OutputSpec:
    """A JSON Schema field: the grammar of its instances; a keyword that cannot be enforced is a
    400 unsupported_schema whose message names its JSON pointer."""
    with RequestErrors():
        return schema_spec(value, where)


def response_format_spec(value: Any, name: str = "response_format", flat: bool = False) -> OutputSpec | None:
    """bubo.chat.request.response_format_spec, its errors as 400s."""
    with RequestErrors():
        return rq.response_format_spec(value, name, flat)


# --- thinking ------------------------------------------------------------------------------


def reasoning_format_of(body: Mapping[str, Any]) -> str | None:
    """llama-server's reasoning_format (none: the reasoning stays in the content); None: unset."""
    value = body.get("reasoning_format")
    if value is None:
        return None
    if value not in REASONING_FORMATS:
        raise invalid(f"reasoning_format must be one of {', '.join(REASONING_FORMATS)}, got {value!r}")
    return str(value)


def thinking_of(body: Mapping[str, Any]) -> tuple[bool, dict[str, Any]]:
    """(thinking on?, the chat template's extra variables) from reasoning_effort, thinking and
    chat_template_kwargs, which must agree (bubo.chat.request.thinking_of)."""
    with RequestErrors():
        return rq.thinking_of(body)


# --- messages ------------------------------------------------------------------------------


def content_text(content: Any, where: str) -> str:
    """A message's content as the text the template sees (bubo.chat.request.content_text)."""
    with RequestErrors():
        return rq.content_text(content, where)


def chat_messages(messages: Any) -> tuple[list[dict[str, Any]], str | None]:
    """OpenAI messages -> (the template's messages, the prefill) (bubo.chat.request.chat_messages),
    call arguments sent as JSON text read within the server's limits (bubo.api.jsonin)."""
    with RequestErrors():
        return rq.chat_messages(messages, jsonin.parse)


def chat_tools(tools: Any) -> list[dict[str, Any]] | None:
    with RequestErrors():
        return rq.chat_tools(tools)


def check_tools(tools: list[dict[str, Any]], field: str = "parameters") -> None:
    """Each tool has a name, no two the same, parameters that are the schema of an object
    (bubo.chat.request.check_tools)."""
    with RequestErrors():
        rq.check_tools(tools, field)


# --- tool choice --------------------------------------------------------------------------


def check_forced_call_alone(forced: str | None, grammar: OutputSpec | None) -> None:
    """A forced call beside an output constraint: a 400 rather than a broken call."""
    with RequestErrors():
        rq.check_forced_call_alone(forced, grammar)


def check_tool_choice(choice: str | None, tools: list[dict[str, Any]] | None) -> str | None:
    """None (the model decides), REQUIRED, or the name of the function to call (one of tools)."""
    with RequestErrors():
        return rq.check_tool_choice(choice, tools)


def openai_tool_choice(choice: Any, tools: list[dict[str, Any]] | None, named: str | None,
                       shape: str) -> tuple[list[dict[str, Any]] | None, str | None]:
    """OpenAI's tool_choice: (the tools to render, None / REQUIRED / the name); "none" hides the
    tools (bubo.chat.request.openai_tool_choice)."""
    with RequestErrors():
        return rq.openai_tool_choice(choice, tools, named, shape)


def lora_field(raw: Any, n_adapters: int, where: str = "lora") -> list[tuple[int, float]]:
    """llama-server's LoRA list, [{"id", "scale"}] (scale 1 when left out), as checked (id, scale)
    pairs (bubo.lora.check_scales); a 400 naming the item otherwise."""
    from bubo.lora import AdapterError, check_scales

    if not isinstance(raw, list):
        raise invalid(f'{where} must be an array of {{"id": N, "scale": X}}')
    for i, item in enumerate(raw):
        if not isinstance(item, dict) or set(item) - {"id", "scale"} or "id" not in item:
            raise invalid(f'{where}[{i}] must be {{"id": N, "scale": X}}')
    try:
        return check_scales([(item["id"], item.get("scale", 1.0)) for item in raw], n_adapters, where)
    except AdapterError as e:
        raise invalid(str(e)) from None
