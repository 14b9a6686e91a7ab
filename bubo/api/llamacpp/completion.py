"""POST /completion: llama-server's native completion (pure functions).

The response as llama-server gives it: content, stop, stop_type (eos | limit | word),
stopping_word, tokens_predicted, tokens_evaluated, tokens_cached, truncated, timings, and on
request the generated token ids (return_tokens) and completion_probabilities (n_probs)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bubo.api import fields as f
from bubo.api.fields import invalid
from bubo.api.llamacpp.shapes import timings_json
from bubo.api.pipeline import steered
from bubo.chat.constrain import OutputSpec
from bubo.engine.types import FinishEvent
from bubo.sampling import SamplingParams


@dataclass
class NativeRequest:
    prompt: str | list[int]
    params: SamplingParams
    n_predict: int | None
    stop: list[str]
    stream: bool
    n_probs: int
    return_tokens: bool
    cache_prompt: bool
    ignore_eos: bool = False
    output: OutputSpec | None = None  # grammar or json_schema


def native_prompt(value: Any) -> str | list[int]:
    """A text, token ids, or a mix of both in one array (texts tokenized without BOS later)."""
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], (str, list)):
        value = value[0]
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and all(
            isinstance(t, str) or (isinstance(t, int) and not isinstance(t, bool)) for t in value):
        return value
    if value is None:
        raise invalid("prompt is required: a string or an array of token ids")
    raise invalid("prompt must be a string, an array of token ids, or an array mixing token ids and strings")


def parse_native_request(body: Any) -> NativeRequest:
    body = f.require_object(body)
    prompt = native_prompt(body.get("prompt"))
    n_predict = f.max_tokens_of(body, "n_predict", "max_tokens")
    n_probs = f.n_probs_of(body)
    return NativeRequest(
        prompt=prompt, params=f.sampling_params(body, n_probs), n_predict=n_predict,
        stop=f.stop_list(body.get("stop")), stream=f.bool_field(body, "stream", False), n_probs=n_probs,
        return_tokens=f.bool_field(body, "return_tokens", False), cache_prompt=f.bool_field(body, "cache_prompt", True),
        ignore_eos=f.bool_field(body, "ignore_eos", False),
        output=f.output_spec(body),
    )


def stop_type(fin: FinishEvent) -> str:
    if fin.stop_string is not None:
        return "word"
    return "eos" if fin.reason == "stop" else "limit"


def probability(token: int, piece: bytes, logprob: float, top: list[tuple[int, bytes, float]]) -> dict[str, Any]:
    """One completion_probabilities entry (llama-server's logprob form)."""
    def one(t: int, b: bytes, lp: float) -> dict[str, Any]:
        return {"id": t, "token": b.decode("utf-8", "replace"), "bytes": list(b), "logprob": lp}

    return {**one(token, piece, logprob), "top_logprobs": [one(*x) for x in top]}


def native_response(*, model: str, content: str, fin: FinishEvent, tokens: list[int] | None,
                    probs: list[dict[str, Any]] | None, prompt_text: str, settings: dict[str, Any]) -> dict[str, Any]:
    body: dict[str, Any] = {
        "index": 0,
        "content": content,
        "tokens": tokens if tokens is not None else [],
        "id_slot": 0,
        "stop": True,
        "model": model,
        "tokens_predicted": fin.completion_tokens,
        "tokens_evaluated": fin.prompt_tokens,
        "generation_settings": settings,
        "prompt": prompt_text,
        "has_new_line": "\n" in content,
        "truncated": False,
        "stop_type": stop_type(fin),
        **steered(fin),
        "stopping_word": fin.stop_string or "",
        "tokens_cached": fin.prompt_tokens + fin.completion_tokens,
        "timings": timings_json(fin.timings),
        "usage": {"prompt_tokens": fin.prompt_tokens, "completion_tokens": fin.completion_tokens,
                  "total_tokens": fin.prompt_tokens + fin.completion_tokens},
    }
    if probs is not None:
        body["completion_probabilities"] = probs
    return body


def native_chunk(*, content: str, tokens: list[int] | None, n_predicted: int, n_prompt: int,
                 probs: list[dict[str, Any]] | None) -> dict[str, Any]:
    body: dict[str, Any] = {"index": 0, "content": content, "tokens": tokens if tokens is not None else [],
                            "stop": False, "id_slot": 0, "tokens_predicted": n_predicted,
                            "tokens_evaluated": n_prompt}
    if probs is not None:
        body["completion_probabilities"] = probs
    return body


def generation_settings(req: NativeRequest, n_ctx: int) -> dict[str, Any]:
    p = req.params
    return {
        "n_ctx": n_ctx, "n_predict": req.n_predict if req.n_predict is not None else -1,
        "temperature": p.temperature, "top_k": p.top_k, "top_p": p.top_p, "min_p": p.min_p,
        "typical_p": p.typical_p, "top_n_sigma": p.top_n_sigma, "xtc_probability": p.xtc_probability,
        "xtc_threshold": p.xtc_threshold, "repeat_penalty": p.repeat_penalty, "repeat_last_n": p.repeat_last_n,
        "presence_penalty": p.presence_penalty, "frequency_penalty": p.frequency_penalty,
        "dry_multiplier": p.dry_multiplier, "dry_base": p.dry_base, "dry_allowed_length": p.dry_allowed_length,
        "dry_penalty_last_n": p.dry_penalty_last_n, "mirostat": p.mirostat, "mirostat_tau": p.mirostat_tau,
        "mirostat_eta": p.mirostat_eta, "seed": p.seed, "n_probs": req.n_probs, "stop": req.stop,
        "stream": req.stream, "cache_prompt": req.cache_prompt,
    }
