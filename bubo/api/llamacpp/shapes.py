"""llama-server's names for what the engine reports: the `timings` object, the `/slots` JSON and
the Prometheus text of `/metrics` (`llamacpp:` metrics). The engine's dataclasses
(bubo.engine.types) in, JSON and text out."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from bubo.engine.types import EngineMetrics, HistogramSnapshot, SlotPhase, SlotState, Timings

# llama-server's slot states
_SLOT_STATE = {SlotPhase.IDLE: 0, SlotPhase.PROMPT: 2, SlotPhase.GENERATING: 4}


def timings_json(t: Timings) -> dict[str, Any]:
    """llama-server's timings keys, and bubo's queue_ms and cache_miss."""
    return {
        "cache_n": t.cached_n,
        "prompt_n": t.prompt_n,
        "prompt_ms": t.prompt_s * 1e3,
        "prompt_per_token_ms": t.prompt_s * 1e3 / t.prompt_n if t.prompt_n else 0.0,
        "prompt_per_second": t.prompt_per_second,
        "predicted_n": t.predicted_n,
        "predicted_ms": t.predicted_s * 1e3,
        "predicted_per_token_ms": t.predicted_s * 1e3 / t.predicted_n if t.predicted_n else 0.0,
        "predicted_per_second": t.predicted_per_second,
        "queue_ms": t.queue_s * 1e3,
        "cache_miss": t.cache_miss,
        # speculative decoding, as llama-server reports it
        **({"draft_n": t.draft_n, "draft_n_accepted": t.draft_n_accepted} if t.draft_n else {}),
    }


def slot_params(s: SlotState) -> dict[str, Any]:
    """A slot's sampling settings as llama-server lists them ({} for a slot never used)."""
    if s.params is None:
        return {}
    params = dataclasses.asdict(s.params)
    params.update(n_predict=s.max_tokens if s.max_tokens is not None else -1, stop=list(s.stop),
                  cache_prompt=s.cache_prompt)
    # a banned token's -inf bias has no JSON number: it shows as false, as a request bans it
    params["logit_bias"] = {str(t): (b if math.isfinite(b) else False) for t, b in s.params.logit_bias.items()}
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in params.items()}


def slots_json(states: list[SlotState]) -> list[dict[str, Any]]:
    """GET /slots: every slot as llama-server shows it."""
    return [{
        "id": s.id,
        "n_ctx": s.n_ctx,
        "is_processing": s.processing,
        "state": _SLOT_STATE[s.phase],
        "id_task": s.task_id,
        "n_prompt_tokens": s.n_prompt,
        "n_prompt_tokens_processed": s.n_prompt_processed,
        "n_prompt_tokens_cache": s.n_prompt_cached,
        "cache_n": s.n_cache,
        "params": slot_params(s),
        "next_token": {"has_next_token": s.processing, "n_decoded": s.n_decoded, "n_remain": s.n_remain},
        **({"caller": s.caller} if s.caller is not None else {}),  # a named key's caller (bubo.api.callers)
    } for s in states]


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
    ("n_preemptions_total", "counter",
     "Requests that gave their slot back when the KV cache was full (resumed later)."),
    ("kv_cache_used_blocks", "gauge", "KV cache blocks held by slots."),
    ("kv_cache_cached_blocks", "gauge", "KV cache blocks no slot holds, kept for the prefix cache."),
    ("prefix_cache_hit_ratio", "gauge", "Prompt tokens reused from the prefix cache / prompt tokens, since start."),
    ("time_to_first_token_seconds", "histogram", "Time from a request's arrival to its first token."),
    ("queue_wait_seconds", "histogram", "Time a request waited for a slot."),
]


def _num(v: float) -> str:
    return str(int(v)) if isinstance(v, (bool, int)) else repr(float(v))


def _le(bound: float) -> str:
    return "+Inf" if math.isinf(bound) else str(bound)


def prometheus(per_model: list[tuple[dict[str, str], EngineMetrics]]) -> str:
    """The Prometheus text exposition of one or several models' metrics, each model's samples
    with its labels ({} for one model: llama-server's unlabelled series)."""
    lines: list[str] = []
    for name, kind, help_ in METRICS:
        full = "llamacpp:" + name
        lines += [f"# HELP {full} {help_}", f"# TYPE {full} {kind}"]
        for model_labels, m in per_model:
            value = getattr(m, name)
            if isinstance(value, HistogramSnapshot):
                for le, n in value.buckets:
                    lines.append(f"{full}_bucket{labels({**model_labels, 'le': _le(le)})} {n}")
                lines += [f"{full}_sum{labels(model_labels)} {_num(float(value.sum))}",
                          f"{full}_count{labels(model_labels)} {value.count}"]
            else:
                lines.append(f"{full}{labels(model_labels)} {_num(value)}")
    return "\n".join(lines) + "\n"


def labels(given: dict[str, str]) -> str:
    """A sample's {k="v",...}, its values escaped ("" for none)."""
    if not given:
        return ""
    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in given.items())
    return "{" + inner + "}"


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
