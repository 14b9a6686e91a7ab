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
from typing import TYPE_CHECKING, Any, TypedDict

from bubo.limits import MAX_DRY_BREAKERS, MAX_LOGIT_BIAS

if TYPE_CHECKING:
    from bubo._tokenizer import Tokenizer

__all__ = ["SamplingOptions", "SamplingParams", "vocab_pieces"]

# the smallest positive C float (the native sampler's floats): a smaller positive double is 0 there
FLT_TRUE_MIN = 1.401298464324817e-45
# llama.cpp truncates longer breakers to this many bytes
DRY_MAX_BREAKER_LEN = 40


I32 = 2**31 - 1
U64 = 2**64 - 1


def _field(default: Any, doc: str = "", lo: float | None = None, hi: float | None = None, flag: str | None = None,
           short: str | None = None, positive: bool = False) -> Any:
    """A sampling field's declaration: its default, its one-line doc, its bounds (None: none; the
    native sampler's C float or int32 range beyond them), llama.cpp's command-line flag for it
    (None: no flag) and its short form; positive: more than 0 as a C float (at least FLT_TRUE_MIN).
    The validator, the OpenAPI document, the command line's flags and the library's keywords are
    derived from these (tests/test_fields.py checks that they agree)."""
    meta = {"doc": doc, "lo": lo, "hi": hi, "flag": flag, "short": short, "positive": positive}
    if isinstance(default, dict):
        return field(default_factory=dict, metadata=meta)
    return field(default=default, metadata=meta)


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

    temperature: float = _field(0.8, "randomness; <= 0 is greedy", flag="--temp")
    dynatemp_range: float = _field(0.0, "the temperature varies in [temperature - range, temperature + range]",
                                   0.0, flag="--dynatemp-range")
    dynatemp_exponent: float = _field(1.0, "how the dynamic temperature follows the entropy", 0.0,
                                      flag="--dynatemp-exp")
    top_k: int = _field(40, "keep the k likeliest tokens; <= 0 keeps every token", -I32, I32, flag="--top-k")
    top_p: float = _field(0.95, "keep the likeliest tokens that make up this probability; 1 is off", 0.0, 1.0,
                          flag="--top-p")
    min_p: float = _field(0.05, "drop tokens less likely than this fraction of the likeliest; 0 is off", 0.0, 1.0,
                          flag="--min-p")
    typical_p: float = _field(1.0, "locally typical sampling's probability mass; 1 is off", 0.0, 1.0,
                              flag="--typical")
    top_n_sigma: float = _field(-1.0, "keep tokens within n standard deviations of the best logit; <= 0 is off",
                                flag="--top-nsigma")
    min_keep: int = _field(0, "the fewest tokens each filter keeps", 0, I32)
    xtc_probability: float = _field(0.0, "the chance that XTC acts at a step; 0 is off", 0.0, 1.0,
                                    flag="--xtc-probability")
    xtc_threshold: float = _field(0.1, "XTC removes the likeliest tokens above this probability; above 0.5 XTC is "
                                       "off", 0.0, 1.0, flag="--xtc-threshold")
    repeat_penalty: float = _field(1.0, "a repeated token's logit is divided (or multiplied) by it; 1 is off", 0.0,
                                   flag="--repeat-penalty", positive=True)
    repeat_last_n: int = _field(64, "tokens the penalties look back on; -1 is the context size, 0 is off", -1, I32,
                                flag="--repeat-last-n")
    presence_penalty: float = _field(0.0, "subtracted from a token's logit once it is present; 0 is off",
                                     flag="--presence-penalty")
    frequency_penalty: float = _field(0.0, "subtracted from a token's logit per time it is present; 0 is off",
                                      flag="--frequency-penalty")
    dry_multiplier: float = _field(0.0, "DRY's strength against repeated sequences; 0 is off", 0.0,
                                   flag="--dry-multiplier")
    dry_base: float = _field(1.75, "the DRY penalty grows as dry_base ** (repeat length - dry_allowed_length)", 1.0,
                             flag="--dry-base")
    dry_allowed_length: int = _field(2, "repeats this long or shorter are not penalised by DRY", 0, I32,
                                     flag="--dry-allowed-length")
    dry_penalty_last_n: int = _field(-1, "tokens DRY looks back on; -1 is the context size, 0 is off", -1, I32,
                                     flag="--dry-penalty-last-n")
    dry_sequence_breakers: tuple[str, ...] = _field(("\n", ":", '"', "*"), "texts that end a sequence DRY matches")
    mirostat: int = _field(0, "0 is off, 1 is Mirostat, 2 is Mirostat 2.0", 0, 2, flag="--mirostat")
    mirostat_tau: float = _field(5.0, "Mirostat's target surprise in bits", 0.0, flag="--mirostat-ent")
    mirostat_eta: float = _field(0.1, "Mirostat's learning rate", 0.0, flag="--mirostat-lr")
    seed: int = _field(-1, "the random seed; -1 is a random seed", -1, U64, flag="--seed", short="-s")
    n_probs: int = _field(0, "the most likely tokens reported with each generated token", 0, I32)
    logit_bias: Mapping[int, float] = _field({}, "added to token ids' logits; -inf bans a token")

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
        numbers = _NUMBERS if type(self) is SamplingParams else _numbers(type(self), check_all=True)
        for f, default in numbers:
            if getattr(self, f.name) is not default:  # a default is checked once, below the class
                self._check_number(f)
        if len(self.dry_sequence_breakers) > MAX_DRY_BREAKERS:
            raise ValueError(f"dry_sequence_breakers has {len(self.dry_sequence_breakers):,} strings; at most "
                             f"{MAX_DRY_BREAKERS} are accepted")
        for b in self.dry_sequence_breakers:
            if not isinstance(b, str) or not b:
                raise ValueError(f"dry_sequence_breakers must be non-empty strings, got {b!r}")
        if len(self.logit_bias) > MAX_LOGIT_BIAS:
            raise ValueError(f"logit_bias has {len(self.logit_bias):,} entries; at most {MAX_LOGIT_BIAS:,} "
                             "are accepted")
        for tok, bias in self.logit_bias.items():
            if isinstance(tok, bool) or not isinstance(tok, int) or tok < 0:
                raise ValueError(f"logit_bias keys must be token ids (integers >= 0), got {tok!r}")
            if isinstance(bias, bool) or not isinstance(bias, (int, float)) or math.isnan(bias) or bias == math.inf:
                raise ValueError(f"logit_bias[{tok}] must be a finite number or -inf (a ban), got {bias!r}")

    def _check_number(self, f: dataclasses.Field[Any]) -> None:
        """A numeric field within its declared bounds (see _field)."""
        name, v, meta = f.name, getattr(self, f.name), f.metadata
        if f.type == "int" and (isinstance(v, bool) or not isinstance(v, int)):
            raise ValueError(f"{name} must be an integer, got {v!r}")
        if f.type == "float" and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)):
            raise ValueError(f"{name} must be a finite number, got {v!r}")
        lo, hi, why = meta["lo"], meta["hi"], meta["doc"]
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            rng = f"[{lo if lo is not None else '-inf'}, {hi if hi is not None else 'inf'}]"
            raise ValueError(f"{name} must be in {rng}, got {v!r}{': ' + why if why else ''}")
        if meta["positive"] and v < FLT_TRUE_MIN:  # smaller is 0 as the native sampler's C float
            raise ValueError(f"{name} must be > 0 (at least {FLT_TRUE_MIN:.4g}, the smallest C float): {why}")

    # ---- the native form -------------------------------------------------------------------

    def resolved_seed(self) -> int:
        """The seed to use: seed itself, or a fresh random one when it is -1."""
        return secrets.randbits(32) if self.seed == -1 else self.seed

    @property
    def matches_token_text(self) -> bool:
        """DRY is on with sequence breakers: the sampler is built with every token's text to
        match them against (work over the whole vocabulary for each request)."""
        return self.dry_multiplier > 0 and bool(self.dry_sequence_breakers)

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


# the numeric fields and their defaults: a field left at its default is checked once, here, not
# per request (a tenth of a small request's reading)
def _numbers(cls: type, check_all: bool = False) -> tuple[tuple[dataclasses.Field[Any], object], ...]:
    """cls's numeric fields, each with its default (check_all: with a value no field holds)."""
    return tuple((f, object() if check_all else f.default) for f in dataclasses.fields(cls)
                 if f.type in ("float", "int"))


_NUMBERS = _numbers(SamplingParams)
_DEFAULTS = SamplingParams()
for _f, _ in _NUMBERS:
    _DEFAULTS._check_number(_f)


class SamplingOptions(TypedDict, total=False):
    """SamplingParams' fields as keyword arguments (bubo.Model's generate, complete, chat and
    chat_stream take them as **options): absent or None takes the field's default. Its keys and
    types are the dataclass's (tests/test_fields.py checks them)."""

    temperature: float | None
    dynatemp_range: float | None
    dynatemp_exponent: float | None
    top_k: int | None
    top_p: float | None
    min_p: float | None
    typical_p: float | None
    top_n_sigma: float | None
    min_keep: int | None
    xtc_probability: float | None
    xtc_threshold: float | None
    repeat_penalty: float | None
    repeat_last_n: int | None
    presence_penalty: float | None
    frequency_penalty: float | None
    dry_multiplier: float | None
    dry_base: float | None
    dry_allowed_length: int | None
    dry_penalty_last_n: int | None
    dry_sequence_breakers: Sequence[str] | None
    mirostat: int | None
    mirostat_tau: float | None
    mirostat_eta: float | None
    seed: int | None
    n_probs: int | None
    logit_bias: Mapping[int, float] | None


def flagged() -> list[dataclasses.Field[Any]]:
    """The fields with a command-line flag (llama.cpp's names: --temp, --top-k, ...)."""
    return [f for f in dataclasses.fields(SamplingParams) if f.metadata["flag"]]


def from_options(options: Mapping[str, Any], base: SamplingParams | None = None) -> SamplingParams:
    """SamplingParams from keyword options (SamplingOptions; None values are left out) over base
    (None: the defaults). TypeError for a name that is not a field, ValueError for a value out of
    range, both naming it."""
    names = SamplingParams.__dataclass_fields__
    unknown = [k for k in options if k not in names]
    if unknown:
        raise TypeError(f"unexpected keyword argument {unknown[0]!r}: the sampling keywords are SamplingParams' "
                        f"fields ({', '.join(names)})")
    given = {k: v for k, v in options.items() if v is not None}
    return base.replace(**given) if base is not None else SamplingParams(**given)


def vocab_pieces(tokenizer: Tokenizer) -> list[bytes]:
    """Every token's text as DRY matches sequence breakers against it (special tokens rendered)."""
    return [tokenizer.token_to_piece(i, True) for i in range(tokenizer.n_vocab)]
