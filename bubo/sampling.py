"""Sampling parameters: llama.cpp's defaults and their validation.

The native sampler (bubo._sampler.Sampler) takes every field explicitly; this module is where the
defaults live. A typical use:

    params = SamplingParams(temperature=0.7, seed=42)
    sampler = Sampler(n_vocab, params.to_native(n_ctx=4096), vocab_pieces=pieces)
"""

from __future__ import annotations

import dataclasses
import math
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bubo.limits import MAX_DRY_BREAKERS, MAX_LOGIT_BIAS

if TYPE_CHECKING:
    from bubo._tokenizer import Tokenizer

__all__ = ["SamplingParams", "vocab_pieces"]

# the smallest positive C float (the native sampler's floats): a smaller positive double is 0 there
FLT_TRUE_MIN = 1.401298464324817e-45
# llama.cpp truncates longer breakers to this many bytes
DRY_MAX_BREAKER_LEN = 40


@dataclass(frozen=True)
class SamplingParams:
    """One request's sampling settings, with llama.cpp's (llama-server's) defaults.

    Stage order: logit bias; repeat/presence/frequency penalties over the last repeat_last_n
    tokens; DRY; top-n-sigma; top-k; typical; top-p; min-p; XTC; temperature. With mirostat 1 or
    2, Mirostat (after temperature) replaces the penalties, DRY and the filters, as in llama.cpp.

    Disabled values, as llama.cpp: top_k <= 0, top_p = 1, min_p = 0, typical_p = 1,
    top_n_sigma <= 0, xtc_probability = 0 (or xtc_threshold > 0.5), repeat_penalty = 1,
    presence/frequency_penalty = 0, dry_multiplier = 0, repeat_last_n / dry_penalty_last_n = 0.
    -1 for repeat_last_n / dry_penalty_last_n means the context size (to_native(n_ctx=...)).
    temperature <= 0 is greedy. seed -1 draws a random seed in to_native()."""

    temperature: float = 0.8
    dynatemp_range: float = 0.0
    dynatemp_exponent: float = 1.0
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    typical_p: float = 1.0
    top_n_sigma: float = -1.0
    min_keep: int = 0
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = -1
    dry_sequence_breakers: tuple[str, ...] = ("\n", ":", '"', "*")
    mirostat: int = 0
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    seed: int = -1
    n_probs: int = 0
    logit_bias: Mapping[int, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # a list is accepted and kept as a tuple, a mapping as a dict copy: the params do not change
        if isinstance(self.dry_sequence_breakers, str) or not isinstance(self.dry_sequence_breakers, Sequence):
            raise ValueError(
                f"dry_sequence_breakers must be a list of strings, got {self.dry_sequence_breakers!r}")
        object.__setattr__(self, "dry_sequence_breakers", tuple(self.dry_sequence_breakers))
        if not isinstance(self.logit_bias, Mapping):
            raise ValueError(f"logit_bias must be a mapping token id -> bias, got {type(self.logit_bias).__name__}")
        object.__setattr__(self, "logit_bias", dict(self.logit_bias))
        self._validate()

    def replace(self, **changes: Any) -> SamplingParams:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    # ---- validation ------------------------------------------------------------------------

    def _validate(self) -> None:
        def number(name: str, lo: float | None = None, hi: float | None = None, why: str = "") -> float:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ValueError(f"{name} must be a finite number, got {v!r}")
            if (lo is not None and v < lo) or (hi is not None and v > hi):
                rng = f"[{lo if lo is not None else '-inf'}, {hi if hi is not None else 'inf'}]"
                raise ValueError(f"{name} must be in {rng}, got {v!r}{': ' + why if why else ''}")
            return v

        def integer(name: str, lo: int | None = None, hi: int | None = None, why: str = "") -> int:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise ValueError(f"{name} must be an integer, got {v!r}")
            if (lo is not None and v < lo) or (hi is not None and v > hi):
                rng = f"[{lo if lo is not None else '-inf'}, {hi if hi is not None else 'inf'}]"
                raise ValueError(f"{name} must be in {rng}, got {v!r}{': ' + why if why else ''}")
            return v

        i32 = 2**31 - 1
        number("temperature", why="<= 0 is greedy")
        number("dynatemp_range", 0.0, why="the temperature varies in [temperature - range, temperature + range]")
        number("dynatemp_exponent", 0.0)
        integer("top_k", -i32, i32, why="<= 0 keeps every token")
        number("top_p", 0.0, 1.0, why="a probability mass; 1 is off")
        number("min_p", 0.0, 1.0, why="a fraction of the best token's probability; 0 is off")
        number("typical_p", 0.0, 1.0, why="a probability mass; 1 is off")
        number("top_n_sigma", why="<= 0 is off")
        integer("min_keep", 0, i32)
        number("xtc_probability", 0.0, 1.0, why="the chance that XTC acts at a step")
        number("xtc_threshold", 0.0, 1.0, why="a probability; above 0.5 XTC is off")
        number("repeat_penalty", 0.0, why="the logit of a repeated token is divided (or multiplied) by it; 1 is off")
        if self.repeat_penalty < FLT_TRUE_MIN:  # smaller is 0 as the native sampler's C float
            raise ValueError(f"repeat_penalty must be > 0 (at least {FLT_TRUE_MIN:.4g}, the smallest C float): "
                             "a logit is divided by it (1 is off)")
        integer("repeat_last_n", -1, i32, why="-1 is the context size, 0 is off")
        number("presence_penalty")
        number("frequency_penalty")
        number("dry_multiplier", 0.0, why="0 is off")
        number("dry_base", 1.0, why="the penalty grows as dry_base ** (repeat length - dry_allowed_length)")
        integer("dry_allowed_length", 0, i32)
        integer("dry_penalty_last_n", -1, i32, why="-1 is the context size, 0 is off")
        if len(self.dry_sequence_breakers) > MAX_DRY_BREAKERS:
            raise ValueError(f"dry_sequence_breakers has {len(self.dry_sequence_breakers):,} strings; at most "
                             f"{MAX_DRY_BREAKERS} are accepted")
        for b in self.dry_sequence_breakers:
            if not isinstance(b, str) or not b:
                raise ValueError(f"dry_sequence_breakers must be non-empty strings, got {b!r}")
        integer("mirostat", 0, 2, why="0 is off, 1 is Mirostat, 2 is Mirostat 2.0")
        number("mirostat_tau", 0.0, why="the target surprise in bits")
        number("mirostat_eta", 0.0, why="the learning rate")
        integer("seed", -1, 2**64 - 1, why="-1 is a random seed")
        integer("n_probs", 0, i32)
        if len(self.logit_bias) > MAX_LOGIT_BIAS:
            raise ValueError(f"logit_bias has {len(self.logit_bias):,} entries; at most {MAX_LOGIT_BIAS:,} "
                             "are accepted")
        for tok, bias in self.logit_bias.items():
            if isinstance(tok, bool) or not isinstance(tok, int) or tok < 0:
                raise ValueError(f"logit_bias keys must be token ids (integers >= 0), got {tok!r}")
            if isinstance(bias, bool) or not isinstance(bias, (int, float)) or math.isnan(bias) or bias == math.inf:
                raise ValueError(f"logit_bias[{tok}] must be a finite number or -inf (a ban), got {bias!r}")

    # ---- the native form -------------------------------------------------------------------

    def resolved_seed(self) -> int:
        """The seed to use: seed itself, or a fresh random one when it is -1."""
        return secrets.randbits(32) if self.seed == -1 else self.seed

    def to_native(self, n_ctx: int | None = None, seed: int | None = None) -> dict[str, Any]:
        """The dict bubo._sampler.Sampler takes: every field, -1 windows resolved to n_ctx, a
        random seed drawn for -1 (pass seed= to fix the one already reported to a client)."""

        def window(name: str, active: bool) -> int:
            v: int = getattr(self, name)
            if v != -1:
                return v
            if not active:
                return 0
            if n_ctx is None:
                raise ValueError(f"{name} = -1 means the context size: pass to_native(n_ctx=...)")
            return n_ctx

        dry_on = self.dry_multiplier != 0.0 and self.mirostat == 0
        pen_on = self.mirostat == 0 and (
            self.repeat_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0)
        return {
            "temperature": float(self.temperature),
            "dynatemp_range": float(self.dynatemp_range),
            "dynatemp_exponent": float(self.dynatemp_exponent),
            "top_k": int(self.top_k),
            "top_p": float(self.top_p),
            "min_p": float(self.min_p),
            "typical_p": float(self.typical_p),
            "top_n_sigma": float(self.top_n_sigma),
            "min_keep": int(self.min_keep),
            "xtc_probability": float(self.xtc_probability),
            "xtc_threshold": float(self.xtc_threshold),
            "repeat_penalty": float(self.repeat_penalty),
            "repeat_last_n": window("repeat_last_n", pen_on),
            "presence_penalty": float(self.presence_penalty),
            "frequency_penalty": float(self.frequency_penalty),
            "dry_multiplier": float(self.dry_multiplier),
            "dry_base": float(self.dry_base),
            "dry_allowed_length": int(self.dry_allowed_length),
            "dry_penalty_last_n": window("dry_penalty_last_n", dry_on),
            "dry_sequence_breakers": [b.encode("utf-8")[:DRY_MAX_BREAKER_LEN] for b in self.dry_sequence_breakers],
            "mirostat": int(self.mirostat),
            "mirostat_tau": float(self.mirostat_tau),
            "mirostat_eta": float(self.mirostat_eta),
            "seed": self.resolved_seed() if seed is None else int(seed),
            "n_probs": int(self.n_probs),
            "logit_bias": {int(t): float(b) for t, b in self.logit_bias.items()},
        }


def vocab_pieces(tokenizer: Tokenizer) -> list[bytes]:
    """Every token's text as DRY matches sequence breakers against it (special tokens rendered)."""
    return [tokenizer.token_to_piece(i, True) for i in range(tokenizer.n_vocab)]
