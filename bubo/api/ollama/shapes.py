"""Ollama's API (/api/*): the request fields and the response shapes (pure functions).

Requests convert into what the other dialects make: a chat is a Conversation (OpenAI-shaped
template messages, tools, thinking, an output constraint from `format`), `options` are the
sampler's SamplingParams under llama-server's names (Ollama's are the same for every option
they share). Responses are Ollama's: one JSON object, or NDJSON lines whose last one has
"done": true and the timings in nanoseconds."""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from bubo import limits
from bubo.api import fields as f
from bubo.api.errors import ApiError
from bubo.api.fields import invalid
from bubo.api.pipeline import Conversation
from bubo.chat.constrain import OutputSpec
from bubo.chat.parsers import ToolCall
from bubo.engine.types import FinishEvent
from bubo.sampling import SamplingParams

# options that choose how a model is loaded or run on a GPU: Ollama reloads the model for them;
# bubo's engine is made by the server's flags (-c, -t, ...), so they are read (type-checked) and
# not applied. num_ctx is applied as a limit (see options_of).
LOAD_OPTIONS = {"numa": bool, "num_batch": int, "num_gpu": int, "main_gpu": int, "low_vram": bool, "f16_kv": bool,
                "logits_all": bool, "vocab_only": bool, "use_mmap": bool, "use_mlock": bool,
                "embedding_only": bool, "num_thread": int, "num_keep": int, "penalize_newline": bool,
                "tfs_z": float}
# Ollama's sampling options, and the SamplingParams fields bubo also reads there (llama-server's)
_SAMPLING = [n for n in SamplingParams.__dataclass_fields__ if n not in ("n_probs",)]
KEEP_ALIVE_FOREVER_S = 1e9  # a keep_alive this long (31 years) or longer is "for good"
MAX_NAME_CHARS = 200  # the store's file is NAME.gguf, written as .NAME.gguf.partial first: 255 bytes at most
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(:[A-Za-z0-9._-]+)?")  # fullmatch ("$" matches before a newline)
_DURATION_RE = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|\u00b5s|ms|s|m|h)")
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "\u00b5s": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def model_name(body: dict[str, Any]) -> str:
    """The model a request names: `model` (or `name`, which older clients send)."""
    name = body.get("model")
    if name in (None, ""):
        name = body.get("name")
    if name in (None, ""):
        raise ApiError(400, "missing_model", "model is required")
    if not isinstance(name, str):
        raise invalid(f"model must be a string, not {type(name).__name__}")
    return name


def tagged(name: str) -> str:
    """A name as Ollama lists it: `name:tag`, ":latest" when it has no tag."""
    return name if ":" in name.rsplit("/", 1)[-1] else name + ":latest"


def check_new_name(name: Any, what: str) -> str:
    if not isinstance(name, str) or not name:
        raise invalid(f"{what} is required: a model name such as mymodel:latest")
    if len(name) > MAX_NAME_CHARS:
        raise invalid(f"{what} is {len(name)} characters long; a model name has at most {MAX_NAME_CHARS}")
    if not _NAME_RE.fullmatch(name) or ".." in name:
        raise invalid(f"{what} {name!r} is not a model name: letters, digits, '.', '_' and '-', with an optional "
                      ":tag")
    return name


def timestamp(t: float | None = None) -> str:
    """RFC 3339 in UTC, as Ollama writes created_at."""
    d = datetime.fromtimestamp(time.time() if t is None else t, tz=timezone.utc)
    return d.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def keep_alive_of(value: Any) -> float | None:
    """keep_alive in seconds: a number of seconds or a Go duration ("5m", "1h30m", "300ms"); a
    negative one keeps the model loaded for good (math.inf), 0 unloads it after the request.
    None: not given (the model's setting stays as it is)."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise invalid(f"keep_alive must be a duration such as \"5m\" or a number of seconds, got {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip()
        sign = -1.0 if text.startswith("-") else 1.0
        body = text.lstrip("+-")
        try:
            seconds = sign * float(body)  # a bare number: seconds
        except ValueError:
            parts = _DURATION_RE.findall(body)
            if not body or "".join(n + u for n, u in parts) != body:
                raise invalid(f"keep_alive {value!r} is not a duration: give e.g. \"5m\", \"1h\", \"30s\", \"0\" or "
                              "\"-1\" (forever)") from None
            seconds = sign * sum(float(n) * _UNIT_S[u] for n, u in parts)
    else:
        raise invalid(f"keep_alive must be a duration such as \"5m\" or a number of seconds, got {value!r}")
    if math.isnan(seconds):
        raise invalid(f"keep_alive must be a duration, got {value!r}")
    return math.inf if seconds < 0 or seconds >= KEEP_ALIVE_FOREVER_S else seconds


# --- options -------------------------------------------------------------------------------


@dataclass
class Options:
    params: SamplingParams
    max_tokens: int | None  # num_predict
    stop: list[str]
    num_ctx: int | None


def _typed(name: str, value: Any, kind: type) -> None:
    if kind is bool:
        ok = isinstance(value, bool)
    elif kind is int:
        ok = (isinstance(value, int) and not isinstance(value, bool)) or (isinstance(value, float)
                                                                         and value.is_integer())
    else:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok:
        raise invalid(f"options.{name} must be {'true or false' if kind is bool else 'a number'}, got {value!r}")


def options_of(body: dict[str, Any], n_probs: int = 0) -> Options:
    """`options`: the sampler's fields (temperature, top_k, top_p, min_p, typical_p, seed,
    repeat_penalty, repeat_last_n, presence_penalty, frequency_penalty, mirostat*, and the other
    llama-server sampler names), num_predict (-1: no limit, -2: until the context is full),
    stop, num_ctx (most tokens of prompt and answer together; the server's context is the
    ceiling). Load options are type-checked and not applied; unknown names are ignored, as
    Ollama ignores them."""
    opts = body.get("options")
    if opts is None:
        opts = {}
    if not isinstance(opts, dict):
        raise invalid("options must be an object, e.g. {\"temperature\": 0, \"num_predict\": 64}")
    for name, kind in LOAD_OPTIONS.items():
        if opts.get(name) is not None:
            _typed(name, opts[name], kind)
    sampling = {k: v for k, v in opts.items() if k in _SAMPLING}
    try:
        params = f.sampling_params(sampling, n_probs)
    except ApiError as e:
        raise invalid(f"options: {e.message}") from None
    n = opts.get("num_predict")
    if n is None:
        max_tokens = f.server_defaults()[1]
    else:
        _typed("num_predict", n, int)
        n = int(n)
        if n in (-1, -2):
            max_tokens = None
        elif n > 0:
            max_tokens = min(n, f.INT32_MAX)
        else:
            raise invalid(f"options.num_predict must be a positive number of tokens, -1 (no limit) or -2 (until the "
                          f"context is full), got {n}")
    num_ctx = opts.get("num_ctx")
    if num_ctx is not None:
        _typed("num_ctx", num_ctx, int)
        num_ctx = int(num_ctx)
        if num_ctx <= 0:
            raise invalid(f"options.num_ctx must be a positive number of tokens, got {num_ctx}")
    stop = f.stop_list(opts.get("stop"), "options.stop")
    return Options(params, max_tokens, stop, num_ctx)


def fit_context(max_tokens: int | None, num_ctx: int | None, n_prompt: int) -> int | None:
    """max_tokens within num_ctx: the answer ends where prompt and answer fill num_ctx tokens
    (a prompt as long as num_ctx or longer keeps max_tokens: the server's context decides)."""
    if num_ctx is None or n_prompt >= num_ctx:
        return max_tokens
    room = num_ctx - n_prompt
    return room if max_tokens is None else min(max_tokens, room)


def format_of(value: Any) -> OutputSpec | None:
    """`format`: "json" (any JSON object), a JSON Schema (its instances), or ""/null (free text)."""
    if value is None or value == "":
        return None
    if value == "json":
        return f.response_format_spec({"type": "json_object"}, "format")
    if isinstance(value, dict):
        return f.schema(value, "format")
    raise invalid(f'format must be "json" or a JSON Schema object, got {value!r}')


def think_of(body: dict[str, Any], template_thinks: bool, model: str) -> tuple[bool, dict[str, Any]]:
    """`think`: true, false, or "low" / "medium" / "high" (a reasoning effort). A model whose
    template does not think refuses true, as Ollama does; false is always allowed."""
    think = body.get("think")
    if think is None:
        return f.thinking_of({})
    if isinstance(think, bool):
        if think and not template_thinks:
            raise invalid(f'"{model}" does not support thinking')
        return f.thinking_of({} if think else {"reasoning_effort": "none"})
    if think in ("low", "medium", "high"):
        if not template_thinks:
            raise invalid(f'"{model}" does not support thinking')
        return f.thinking_of({"reasoning_effort": think})
    raise invalid(f'think must be true, false, "low", "medium" or "high", got {think!r}')


def logprobs_of(body: dict[str, Any]) -> tuple[bool, int]:
    logprobs = f.bool_field(body, "logprobs", False)
    top = f.n_probs_of(body, "top_logprobs")
    if top > limits.MAX_TOP_LOGPROBS:
        raise invalid(f"top_logprobs must be at most {limits.MAX_TOP_LOGPROBS}, got {top}")
    return logprobs, top if logprobs else 0


# --- /api/chat -----------------------------------------------------------------------------


@dataclass
class ChatRequest(Conversation):
    stop: list[str]
    num_ctx: int | None
    keep_alive: float | None
    logprobs: bool
    top_logprobs: int
    think: Any = None  # the request's own think value (checked against the model later)


def _images(m: dict[str, Any], where: str) -> None:
    if m.get("images"):
        raise invalid(f"{where}.images: this model takes text only")


def chat_messages(messages: Any) -> list[dict[str, Any]]:
    """Ollama's messages as OpenAI-shaped ones (f.chat_messages' input): tool_calls' arguments
    are objects, a tool result names its tool in tool_name, an assistant's reasoning is in
    thinking."""
    if not isinstance(messages, list):
        raise ApiError(400, "missing_messages", "messages must be an array of {role, content}")
    f.counted(messages, "messages", limits.MAX_MESSAGES, "messages")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise invalid(f"{where} must be an object with role and content")
        _images(m, where)
        content = m.get("content")
        if content is not None and not isinstance(content, str):
            raise invalid(f"{where}.content must be a string")
        msg: dict[str, Any] = {"role": m.get("role"), "content": content or ""}
        if m.get("tool_calls"):
            calls = m["tool_calls"]
            if not isinstance(calls, list):
                raise invalid(f"{where}.tool_calls must be an array")
            msg["tool_calls"] = [{"type": "function", "id": c.get("id"), "function": c.get("function")}
                                 if isinstance(c, dict) else c for c in calls]
        name = m.get("tool_name", m.get("name"))
        if m.get("role") == "tool" and isinstance(name, str):
            msg["name"] = name
        if isinstance(m.get("thinking"), str) and m["thinking"]:
            msg["reasoning_content"] = m["thinking"]
        out.append(msg)
    return out


def parse_chat(body: Any) -> ChatRequest | None:
    """/api/chat's fields; None for a request without messages (Ollama's way to load a model,
    or with keep_alive 0 to unload it)."""
    body = f.require_object(body)
    raw = body.get("messages")
    if raw is None or raw == []:
        return None
    messages, prefill = f.chat_messages(chat_messages(raw))
    tools = f.chat_tools(body.get("tools")) or None
    output = format_of(body.get("format"))
    logprobs, top = logprobs_of(body)
    opts = options_of(body, top)
    return ChatRequest(
        messages=messages, prefill=prefill, tools=tools, thinking=True, template_kwargs={}, params=opts.params,
        max_tokens=opts.max_tokens, stream=f.bool_field(body, "stream", True), output=output,
        parallel_tool_calls=True, stop=opts.stop, num_ctx=opts.num_ctx,
        keep_alive=keep_alive_of(body.get("keep_alive")), logprobs=logprobs, top_logprobs=top,
        think=body.get("think"))


# --- /api/generate -------------------------------------------------------------------------


@dataclass
class GenerateRequest:
    prompt: str
    suffix: str
    system: str | None
    raw: bool
    context: list[int]
    output: OutputSpec | None
    params: SamplingParams
    max_tokens: int | None
    stop: list[str]
    num_ctx: int | None
    stream: bool
    keep_alive: float | None
    logprobs: bool
    top_logprobs: int
    think: Any = None


def parse_generate(body: Any) -> GenerateRequest:
    body = f.require_object(body)
    prompt = body.get("prompt")
    if prompt is not None and not isinstance(prompt, str):
        raise invalid("prompt must be a string")
    suffix = body.get("suffix")
    if suffix is not None and not isinstance(suffix, str):
        raise invalid("suffix must be a string")
    system = body.get("system")
    if system is not None and not isinstance(system, str):
        raise invalid("system must be a string")
    if body.get("template"):
        raise invalid("template is not supported: bubo renders prompts with the model's own chat template (send "
                      "raw: true with a prompt you formatted yourself)")
    if body.get("images"):
        raise invalid("images: this model takes text only")
    context = body.get("context")
    if context is None:
        context = []
    if not isinstance(context, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in context):
        raise invalid("context must be an array of token ids, as an earlier answer returned it")
    raw = f.bool_field(body, "raw", False)
    if raw and suffix:
        raise invalid("suffix cannot be used with raw: a raw prompt is sent as it is")
    logprobs, top = logprobs_of(body)
    opts = options_of(body, top)
    return GenerateRequest(
        prompt=prompt or "", suffix=suffix or "", system=system, raw=raw, context=list(context),
        output=format_of(body.get("format")), params=opts.params, max_tokens=opts.max_tokens, stop=opts.stop,
        num_ctx=opts.num_ctx, stream=f.bool_field(body, "stream", True),
        keep_alive=keep_alive_of(body.get("keep_alive")), logprobs=logprobs, top_logprobs=top,
        think=body.get("think"))


# --- responses -----------------------------------------------------------------------------


def done_reason(fin: FinishEvent) -> str:
    return "length" if fin.reason == "length" else "stop"


def stats(fin: FinishEvent, total_s: float, load_s: float) -> dict[str, Any]:
    """The final object's counts and durations (nanoseconds). prompt_eval_count is the whole
    prompt, its cached part included (Ollama's clients read it as the context used)."""
    t = fin.timings
    out: dict[str, Any] = {
        "total_duration": int(total_s * 1e9), "load_duration": int(load_s * 1e9),
        "prompt_eval_count": fin.prompt_tokens, "prompt_eval_duration": int(t.prompt_s * 1e9),
        "eval_count": fin.completion_tokens, "eval_duration": int(t.predicted_s * 1e9),
    }
    if t.draft_n:  # speculative decoding (bubo's own keys)
        out.update(draft_tokens=t.draft_n, draft_tokens_accepted=t.draft_n_accepted)
    return out


def tool_calls_json(calls: list[ToolCall], first: int = 0) -> list[dict[str, Any]]:
    from bubo.api.anthropic.messages import tool_input

    return [{"id": c.id, "function": {"index": first + i, "name": c.name, "arguments": tool_input(c)}}
            for i, c in enumerate(calls)]
