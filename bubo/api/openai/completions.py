"""POST /v1/completions: OpenAI's legacy text completion (pure functions)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bubo import limits
from bubo.api import fields as f
from bubo.api.fields import invalid
from bubo.api.llamacpp.shapes import timings_json
from bubo.api.openai.chat import usage
from bubo.api.pipeline import steered
from bubo.chat.constrain import OutputSpec
from bubo.engine.types import FinishEvent
from bubo.sampling import SamplingParams


@dataclass
class CompletionRequest:
    prompt: str | list[int]
    params: SamplingParams
    max_tokens: int | None
    stop: list[str]
    stream: bool
    include_usage: bool
    logprobs: int | None  # alternatives per token, None: no logprobs
    echo: bool
    cache_prompt: bool
    output: OutputSpec | None = None


def prompt_of(value: Any, name: str = "prompt") -> str | list[int]:
    """A text, token ids, or a one-element array of either (one choice only)."""
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], (str, list)):
        value = value[0]
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        return value
    if value is None:
        raise invalid(f"{name} is required: a string or an array of token ids")
    raise invalid(f"{name} must be a string or an array of token ids (one prompt per request)")


# OpenAI's default for /v1/completions when max_tokens is absent
DEFAULT_MAX_TOKENS = 16


def parse_completion_request(body: Any) -> CompletionRequest:
    body = f.require_object(body)
    prompt = prompt_of(body.get("prompt"))
    f.check_n(body)
    if "max_tokens" in body:
        max_tokens = f.max_tokens_of(body, "max_tokens")
    else:
        max_tokens = f.server_defaults()[1] or DEFAULT_MAX_TOKENS
    lp = body.get("logprobs")
    if lp is not None and (isinstance(lp, bool) or not isinstance(lp, int)
                           or not 0 <= lp <= limits.MAX_COMPLETION_LOGPROBS):
        raise invalid(f"logprobs must be an integer from 0 to {limits.MAX_COMPLETION_LOGPROBS}, got {lp!r}")
    opts = body.get("stream_options") or {}
    if not isinstance(opts, dict):
        raise invalid("stream_options must be an object")
    return CompletionRequest(
        prompt=prompt, params=f.sampling_params(body, max(lp or 0, f.n_probs_of(body))), max_tokens=max_tokens,
        stop=f.stop_list(body.get("stop")), stream=f.bool_field(body, "stream", False),
        include_usage=bool(opts.get("include_usage")), logprobs=lp, echo=f.bool_field(body, "echo", False),
        cache_prompt=f.bool_field(body, "cache_prompt", True), output=f.output_spec(body),
    )


def completion_logprobs(entries: list[tuple[str, float, dict[str, float]]], offset: int) -> dict[str, Any]:
    """The legacy logprobs object: tokens, token_logprobs, top_logprobs, text_offset."""
    tokens, lps, tops, offsets = [], [], [], []
    pos = offset
    for text, lp, top in entries:
        tokens.append(text)
        lps.append(lp)
        tops.append(top)
        offsets.append(pos)
        pos += len(text)
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}


def completion_response(*, id: str, created: int, model: str, text: str, fin: FinishEvent,
                        logprobs: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "id": id, "object": "text_completion", "created": created, "model": model,
        "choices": [{"text": text, "index": 0, "logprobs": logprobs, "finish_reason": fin.reason, **steered(fin)}],
        "usage": usage(fin),
        "timings": timings_json(fin.timings),
    }


def completion_chunk(*, id: str, created: int, model: str, text: str, finish: str | None = None,
                     logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "id": id, "object": "text_completion", "created": created, "model": model,
        "choices": [{"text": text, "index": 0, "logprobs": logprobs, "finish_reason": finish}],
    }


def last_chunk(*, id: str, created: int, model: str, fin: FinishEvent) -> dict[str, Any]:
    """The stream's last chunk: no text, the finish_reason and the timings."""
    c = completion_chunk(id=id, created=created, model=model, text="", finish=fin.reason)
    c["choices"][0].update(steered(fin))
    c["timings"] = timings_json(fin.timings)
    return c


def usage_chunk(*, id: str, created: int, model: str, fin: FinishEvent) -> dict[str, Any]:
    """stream_options.include_usage: a chunk without choices that carries the usage."""
    c = completion_chunk(id=id, created=created, model=model, text="")
    c["choices"] = []
    c["usage"] = usage(fin)
    return c
