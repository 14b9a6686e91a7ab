"""What goes into the engine and what comes out of it: the seam between api/ and engine/.

No JSON and no dialect below this line: every route converts its request into one
GenerationRequest and turns the events of its EventStream into its own response shape."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bubo.sampling import SamplingParams


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
    grammar: Any = None  # a bubo._grammar.Grammar: every token keeps the text in its language


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


@dataclass
class FinishEvent:
    """The last event of a successful generation.

    reason: "stop" (an end-of-generation token or a stop string) or "length" (max_tokens, or
    the context is full). timings has llama-server's keys: prompt_n, prompt_ms,
    prompt_per_token_ms, prompt_per_second, predicted_n, predicted_ms, predicted_per_token_ms,
    predicted_per_second, cache_n; and queue_ms (the wait for a slot) and cache_miss (why
    prompt tokens that could have come from the prefix cache did not, or None)."""

    reason: str
    stop_string: str | None
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    timings: dict[str, Any]


@dataclass
class ErrorEvent:
    """The last event of a failed generation: an HTTP status with the reference's error code."""

    status: int
    code: str
    message: str


Event = TokenEvent | FinishEvent | ErrorEvent


class ContextLengthError(ValueError):
    """The prompt does not fit in the context (with room for one generated token): a 400
    context_length_exceeded, raised by Engine.submit."""

    def __init__(self, prompt_tokens: int, n_ctx: int):
        self.prompt_tokens = prompt_tokens
        self.n_ctx = n_ctx
        super().__init__(
            f"the prompt is {prompt_tokens} tokens but the context holds {n_ctx} tokens "
            "(and needs room for at least one generated token): shorten the prompt"
        )


class NotReadyError(RuntimeError):
    """The model is still loading (or failed to load): a 503 not_ready, raised by Engine.submit."""


class InsufficientMemoryError(RuntimeError):
    """The request's KV cache does not fit in memory: raised by Engine.submit.

    permanent: it needs more than the machine has at all (less what this process holds already):
    a 507 insufficient_memory_permanent, no use retrying. Otherwise it needs more than is
    available now: a 503 insufficient_memory, worth retrying once memory is freed."""

    def __init__(self, needed: int, limit: int, permanent: bool, n_tokens: int):
        self.needed = needed
        self.limit = limit
        self.permanent = permanent
        self.n_tokens = n_tokens
        gib = 1024 ** 3
        if permanent:
            what = (f"the request needs {needed / gib:.2f} GiB more KV cache ({n_tokens} tokens of prompt "
                    f"and max_tokens) but this computer can give at most {limit / gib:.2f} GiB: "
                    "shorten the prompt or lower max_tokens")
        else:
            what = (f"the request needs {needed / gib:.2f} GiB more KV cache ({n_tokens} tokens of prompt "
                    f"and max_tokens) but only {limit / gib:.2f} GiB is available now: free memory, "
                    "then send the request again")
        super().__init__(what)


class QueueFullError(RuntimeError):
    """Every slot is busy and queue_size requests already wait: a 503 with Retry-After, raised
    by Engine.submit (llama-server's --queue-size behaviour: refuse rather than pile up)."""

    def __init__(self, n_slots: int, queue_size: int):
        self.n_slots = n_slots
        self.queue_size = queue_size
        super().__init__(f"the server is busy: all {n_slots} slots are generating and {queue_size} "
                         f"requests are waiting (--queue-size {queue_size}); try again shortly")
