"""What goes into the engine and what comes out of it: the seam between api/ and engine/.

No JSON, no HTTP and no dialect below this line. Every route converts its request into one
GenerationRequest and turns the events of its EventStream into its own response shape. The
engine's refusals and failures carry a Reason (an enum); what status code, error code and error
type a reason becomes in each dialect is decided in bubo/api/errors.py. Timings, slot states and
metrics are dataclasses; llama-server's names for them are made in bubo/api/llamacpp/."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from bubo.sampling import SamplingParams

if TYPE_CHECKING:
    from bubo._grammar import Grammar


class Reason(enum.Enum):
    """Why the engine refused a request or ended it without a FinishEvent."""

    CONTEXT_EXCEEDED = "context_exceeded"  # the prompt does not fit in the context
    MEMORY_SHORT = "memory_short"  # the KV cache cannot take the memory now: retry later
    MEMORY_NEVER = "memory_never"  # the request needs more memory than the machine can ever give
    QUEUE_FULL = "queue_full"  # every slot busy and the wait queue full
    NOT_READY = "not_ready"  # the model is loading, failed to load, or was stopped
    MODEL_UNKNOWN = "model_unknown"  # no model of that name is served
    MODEL_NOT_LOADED = "model_not_loaded"  # the model is not loaded and will not be loaded on demand
    CANCELLED = "cancelled"  # the reader cancelled the stream
    SHUTTING_DOWN = "shutting_down"  # the engine stopped before the request ended
    INVALID_REQUEST = "invalid_request"  # token ids out of range, an empty prompt, ...
    GRAMMAR_STUCK = "grammar_stuck"  # the grammar allows no token here, or its state outgrew its bounds
    NO_TOKEN = "no_token"  # the request's logit_bias bans every token its grammar (or the vocabulary) allows
    INTERNAL = "internal"  # a bug: a step failed unexpectedly


@dataclass
class GenerationRequest:
    """One generation. prompt is token ids, used as they are (render and tokenize first).

    max_tokens None: until an end-of-generation token or a full context. n_probs > 0 fills
    TokenEvent.top with that many (token, logprob) alternatives. cache_prompt False starts the
    cache from scratch (no prefix reuse). ignore_eos: generate past end-of-generation tokens, until
    max_tokens or a stop string (benchmarks use it to fix the answer's length). grammar: each
    token is sampled among those that keep the text a prefix of the grammar's language, and the
    end-of-generation token only where the text is a whole sentence of it."""

    prompt: list[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    max_tokens: int | None = None
    stop: list[str] = field(default_factory=list)
    n_probs: int = 0
    cache_prompt: bool = True
    ignore_eos: bool = False  # end-of-generation tokens get a -inf bias (llama-server's ignore_eos)
    grammar: Grammar | None = None  # every token keeps the text in this grammar's language
    draft_max: int | None = None  # most drafted tokens per pass (0: no drafting; None: the engine's)
    # these tokens' log-probabilities at each step (TokenEvent.probs_of): the raw distribution's, as
    # n_probs' (the decision API reads the next token's over its options' letters)
    probs_of: tuple[int, ...] = ()
    # read the prompt into the prefix cache and generate nothing (POST /v1/prefill): its whole KV
    # blocks only; it yields to every other request (ended, with a FinishEvent, at the next step
    # after one is queued) and to a newer prefill
    prefill: bool = False
    read_only: bool = False  # read the prompt (all of it) and generate nothing: a context's making
    # a context's KV sequence (bubo.engine.contexts) the request starts from: its prompt begins
    # with the context's tokens, whose rows are shared rather than read again
    context: int | None = None
    keep: int | None = None  # the context sequence this request's sequence becomes when it ends
    caller: str | None = None  # who sent it (a named API key's caller: bubo.api.callers); /slots shows it
    # LoRA adapters: (the runtime's adapter index, scale) pairs, scale nonzero (bubo/lora.py)
    lora: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class Timings:
    """How long one request took, and how much of its prompt came from the cache.

    prompt_n is the prompt tokens computed (not cached_n, which came from the cache); queue_s is
    the wait for a slot; cache_miss says why prompt tokens that could have come from the prefix
    cache did not (None: everything reusable was reused)."""

    cached_n: int = 0
    prompt_n: int = 0
    prompt_s: float = 0.0
    predicted_n: int = 0
    predicted_s: float = 0.0
    queue_s: float = 0.0
    cache_miss: str | None = None
    draft_n: int = 0  # drafted tokens checked (speculative decoding)
    draft_n_accepted: int = 0  # ... of which the answer kept

    @property
    def prompt_per_second(self) -> float:
        return self.prompt_n / self.prompt_s if self.prompt_n and self.prompt_s > 0 else 0.0

    @property
    def predicted_per_second(self) -> float:
        return self.predicted_n / self.predicted_s if self.predicted_n and self.predicted_s > 0 else 0.0


@dataclass
class TokenEvent:
    """One sampled token.

    text is the UTF-8-safe piece to show now: it may be "" (an incomplete UTF-8 character, or
    text held back because it could start a stop string) and it may carry text held back from
    earlier tokens. A stop string and everything after it never appear in any text.
    Every sampled token gets an event, the end-of-generation token included (its own text,
    e.g. "<|im_end|>", is never shown: its event carries only text flushed at the end, usually "").
    The number of TokenEvents is FinishEvent.completion_tokens."""

    token: int
    text: str
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)
    probs_of: tuple[float, ...] = ()  # GenerationRequest.probs_of's log-probabilities, in its order


@dataclass
class FinishEvent:
    """The last event of a successful generation.

    reason: "stop" (an end-of-generation token or a stop string) or "length" (max_tokens, or
    the context is full, or the memory for more is short). steered: the grammar steered the
    answer to a short ending so that it ends within max_tokens (bubo.engine.fit)."""

    reason: str
    stop_string: str | None
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    timings: Timings = field(default_factory=Timings)
    steered: bool = False
    prefilled: int = 0  # a prefill's: its prompt's tokens the prefix cache holds, in whole blocks, as far as it read


@dataclass
class ErrorEvent:
    """The last event of a failed generation: why (a Reason) and a message for the client."""

    reason: Reason
    message: str


Event = TokenEvent | FinishEvent | ErrorEvent


class SlotPhase(enum.Enum):
    IDLE = "idle"
    PROMPT = "prompt"  # reading its prompt
    GENERATING = "generating"


@dataclass(frozen=True)
class SlotState:
    """One slot as it is now (or, when idle, the last request it served: task_id, counts and
    params stay; phase is IDLE)."""

    id: int
    n_ctx: int
    phase: SlotPhase
    task_id: int = -1
    n_prompt: int = 0
    n_prompt_processed: int = 0  # prompt tokens computed so far (not from the cache)
    n_prompt_cached: int = 0
    n_decoded: int = 0
    n_remain: int = -1  # tokens left before max_tokens; -1: no limit
    n_cache: int = 0  # tokens the slot's KV sequence holds
    params: SamplingParams | None = None
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    cache_prompt: bool = True
    caller: str | None = None  # whose request the slot serves or served last (or restored into it)

    @property
    def processing(self) -> bool:
        return self.phase is not SlotPhase.IDLE


@dataclass(frozen=True)
class HistogramSnapshot:
    """Cumulative bucket counts [(upper bound, count), ..., (inf, count)], their sum and count."""

    buckets: list[tuple[float, int]]
    sum: float
    count: int


@dataclass(frozen=True)
class EngineMetrics:
    """Counters since start and gauges now. Read from another thread while the engine runs, the
    figures are a snapshot that may be one step stale, never torn."""

    requests_total: int = 0
    prompt_tokens_total: int = 0
    prompt_tokens_cached_total: int = 0
    prompt_seconds_total: float = 0.0
    tokens_predicted_total: int = 0
    tokens_predicted_seconds_total: float = 0.0
    n_decode_total: int = 0
    n_tokens_max: int = 0
    n_preemptions_total: int = 0
    n_drafted_total: int = 0
    n_drafted_accepted_total: int = 0
    requests_processing: int = 0
    requests_deferred: int = 0
    kv_cache_tokens: int = 0
    kv_cache_usage_ratio: float = 0.0
    kv_cache_used_blocks: int = 0
    kv_cache_cached_blocks: int = 0
    prompt_tokens_seconds: float = 0.0
    predicted_tokens_seconds: float = 0.0
    n_busy_slots_per_decode: float = 0.0
    prefix_cache_hit_ratio: float = 0.0
    time_to_first_token_seconds: HistogramSnapshot = field(
        default_factory=lambda: HistogramSnapshot([(float("inf"), 0)], 0.0, 0))
    queue_wait_seconds: HistogramSnapshot = field(
        default_factory=lambda: HistogramSnapshot([(float("inf"), 0)], 0.0, 0))


# --- refusals: raised by Engine.submit, each with its reason ---------------------------------


class EngineRefusal(Exception):
    """The engine would not take a request. reason says why; the message is for the client."""

    reason: Reason = Reason.INTERNAL

    @property
    def message(self) -> str:
        return str(self)


class ContextLengthError(EngineRefusal, ValueError):
    """The prompt does not fit in the context (with room for one generated token)."""

    reason = Reason.CONTEXT_EXCEEDED

    def __init__(self, prompt_tokens: int, n_ctx: int):
        self.prompt_tokens = prompt_tokens
        self.n_ctx = n_ctx
        super().__init__(
            f"the prompt is {prompt_tokens} tokens but the context holds {n_ctx} tokens "
            "(and needs room for at least one generated token): shorten the prompt"
        )


class InvalidRequestError(EngineRefusal, ValueError):
    """Token ids out of range, an empty prompt, a bad max_tokens: what the API's validation
    should have caught; the engine checks it again because the library submits directly."""

    reason = Reason.INVALID_REQUEST


class NoTokenError(EngineRefusal, ValueError):
    """The request's logit_bias bans every token that could come first (every token its grammar
    allows there, or the whole vocabulary): known before it runs."""

    reason = Reason.NO_TOKEN


class NotReadyError(EngineRefusal, RuntimeError):
    """The model is still loading (loading), failed to load, or was unloaded."""

    reason = Reason.NOT_READY

    def __init__(self, message: str, loading: bool = False):
        super().__init__(message)
        self.loading = loading


class InsufficientMemoryError(EngineRefusal, RuntimeError):
    """The request's KV cache does not fit in memory.

    permanent: it needs more than the machine has at all (less what this process holds already):
    no use retrying (Reason.MEMORY_NEVER). Otherwise it needs more than is available now
    (Reason.MEMORY_SHORT): worth retrying once memory is freed."""

    def __init__(self, needed: int, limit: int, permanent: bool, n_tokens: int, what: str | None = None):
        self.needed = needed
        self.limit = limit
        self.permanent = permanent
        self.n_tokens = n_tokens
        gib = 1024 ** 3
        if what is None:
            what = f"{needed / gib:.2f} GiB more KV cache ({n_tokens} tokens of prompt and max_tokens)"
        if permanent:
            msg = (f"the request needs {what} but this computer can give at most {limit / gib:.2f} GiB: "
                   "shorten the prompt or lower max_tokens")
        else:
            msg = (f"the request needs {what} but only {limit / gib:.2f} GiB is available now: free memory, "
                   "then send the request again")
        super().__init__(msg)

    @property
    def reason(self) -> Reason:  # type: ignore[override]
        return Reason.MEMORY_NEVER if self.permanent else Reason.MEMORY_SHORT


class QueueFullError(EngineRefusal, RuntimeError):
    """Every slot is busy and queue_size requests already wait (llama-server's --queue-size
    behaviour: refuse rather than pile up)."""

    reason = Reason.QUEUE_FULL

    def __init__(self, n_slots: int, queue_size: int):
        self.n_slots = n_slots
        self.queue_size = queue_size
        super().__init__(f"the server is busy: all {n_slots} slots are generating and {queue_size} "
                         "requests are waiting, as many as may; try again shortly")


class GenerationError(EngineRefusal, RuntimeError):
    """A generation ended without finishing (the library raises what its stream ended with)."""


class GenerationValueError(EngineRefusal, ValueError):
    """A generation ended on its input: the context, its grammar, a token id."""


class GenerationMemoryError(EngineRefusal, MemoryError):
    """A generation ended because the KV cache could not take more memory."""


def refusal_of(event: ErrorEvent) -> EngineRefusal:
    """An ErrorEvent as an exception of the matching builtin kind (MemoryError, ValueError or
    RuntimeError), its reason kept."""
    kind: type[EngineRefusal]
    if event.reason in (Reason.MEMORY_SHORT, Reason.MEMORY_NEVER):
        kind = GenerationMemoryError
    elif event.reason in (Reason.CONTEXT_EXCEEDED, Reason.INVALID_REQUEST, Reason.GRAMMAR_STUCK, Reason.NO_TOKEN):
        kind = GenerationValueError
    else:
        kind = GenerationError
    err = kind(event.message)
    err.reason = event.reason
    return err
