"""The high-level Python API: load a model by catalog name or path, tokenize, generate, chat.

    m = bubo.Model("smollm2:135m")
    for piece in m.generate("The capital of France is", max_tokens=16, temperature=0):
        print(piece, end="")

A Model is a one-slot client of the runtime the server runs on: a Runtime (bubo/runtime.py: the
native model, tokenizer and chat template), a KV cache of one sequence, and the server's own
scheduler (bubo/engine/scheduler.py) with one slot, driven in the caller's thread instead of an
engine thread. Each token therefore comes from the same Generation (sampler, grammar, stop
strings, finish rules) as the server's, and the same prefix reuse: the slot keeps its sequence
between calls, so a call whose prompt continues the previous one's computes only what is new.

A Model is not meant to be shared between threads; the HTTP server's engine batches requests
across threads and clients.
"""

from __future__ import annotations

import collections
import contextlib
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bubo import store
from bubo._tokenizer import Tokenizer
from bubo.chat import ChatTemplate
from bubo.engine.generation import StopMatcher, text_pieces
from bubo.engine.types import (
    ErrorEvent,
    Event,
    FinishEvent,
    GenerationRequest,
    InvalidRequestError,
    TokenEvent,
    refusal_of,
)
from bubo.runtime import Runtime

if TYPE_CHECKING:
    from bubo._grammar import Grammar
    from bubo._model import Model as NativeModel
    from bubo.engine.scheduler import Task
    from bubo.sampling import SamplingParams

__all__ = ["Completion", "Model", "StopMatcher", "TextStream"]

# prompt tokens per forward pass: large enough for the matrix-matrix kernels to pay off, small
# enough that the activations stay modest (the server's -ub default)
PREFILL_CHUNK = 512

# the token stream -> text pieces rule the generation core follows (bubo.engine.generation)
_text_stream = text_pieces


@dataclass
class Completion:
    """A finished generation."""

    text: str
    tokens: list[int]  # the generated token ids (including the EOG token, if one ended it)
    finish_reason: str  # "stop" (EOG token or stop string) or "length" (max_tokens or context)
    prompt_tokens: int
    stop: str | None = None  # the stop string that ended it, if one did
    logprobs: list[float] = field(default_factory=list)  # of each generated token


class _Run:
    """One generation's events (the scheduler's sink), read by its TextStream."""

    def __init__(self, request: GenerationRequest):
        self._request = request
        self.events: collections.deque[Event] = collections.deque()
        self.started = False  # queued in the slot (at its first read)
        self.task: Task | None = None
        self.superseded = False  # a newer generation took the slot
        self.closed = False  # its reader stopped it
        self.ended = False  # its final event was read, or it was closed

    @property
    def request(self) -> GenerationRequest:
        return self._request

    @property
    def cancelled(self) -> bool:
        return self.superseded or self.closed

    @property
    def ending(self) -> bool:
        return False  # the library's reader takes the whole answer

    def push(self, event: Event) -> None:
        self.events.append(event)


class TextStream(Iterator[str]):
    """What generate() returns: an iterator of text pieces; once it is exhausted, completion()
    tells how the generation ended."""

    def __init__(self, model: Model, run: _Run):
        self._model = model
        self._run = run
        self._text: list[str] = []
        self._tokens: list[int] = []
        self._logprobs: list[float] = []
        self._finish: FinishEvent | None = None

    def __next__(self) -> str:
        while True:
            ev = self._model._next_event(self._run)
            if ev is None:
                raise StopIteration
            if isinstance(ev, TokenEvent):
                self._tokens.append(ev.token)
                self._logprobs.append(ev.logprob)
                if ev.text:
                    self._text.append(ev.text)
                    return ev.text
            elif isinstance(ev, FinishEvent):
                self._finish = ev
            elif isinstance(ev, ErrorEvent):
                raise refusal_of(ev)

    def close(self) -> None:
        """Stop the generation here (the model's slot is free for the next one)."""
        if not self._run.ended:
            self._run.closed = True
            self._run.ended = True

    def completion(self) -> Completion:
        fin = self._finish
        if fin is None:
            raise RuntimeError("the generation has not finished: read the stream to its end first")
        return Completion("".join(self._text), self._tokens, fin.reason, fin.prompt_tokens, fin.stop_string,
                          self._logprobs)


class Model:
    """A GGUF model ready to generate: `Model("smollm2:135m")` or `Model("/path/to/x.gguf")`.

    A catalog name that is not stored yet is pulled first. n_ctx is the KV cache size in tokens
    (capped at the model's training context); n_threads defaults to every CPU."""

    def __init__(self, name_or_path: str | os.PathLike[str], *, n_ctx: int = 4096,
                 n_threads: int | None = None, chat_template: str | None = None):
        if n_ctx <= 0:
            raise ValueError(f"n_ctx must be positive, got {n_ctx}")
        if n_threads is not None and n_threads <= 0:
            raise ValueError(f"n_threads must be positive (or None for every CPU), got {n_threads}")
        from bubo._model import KVCache
        from bubo.engine.engine import Engine
        from bubo.engine.scheduler import Scheduler

        self.path = store.resolve(name_or_path)
        self.name = str(name_or_path)
        self.runtime = Runtime(self.path, n_threads=n_threads, chat_template=chat_template, name=self.name)
        self.metadata: dict[str, Any] = self.runtime.metadata
        self.hparams: dict[str, Any] = self.runtime.hparams
        self.tokenizer: Tokenizer = self.runtime.tokenizer
        n_ctx_train = self.runtime.n_ctx_train
        self.n_ctx = min(n_ctx, n_ctx_train) if n_ctx_train else n_ctx
        # swa_full=False: sliding-window layers (gemma3) keep only their window's blocks
        self._kv = KVCache(self.runtime.native, self.n_ctx, swa_full=False)
        self._sched = Scheduler(self.runtime, self._kv, 1, PREFILL_CHUNK, self.n_ctx, Engine._memory_short,
                                retain=True)
        self._current: _Run | None = None

    def __repr__(self) -> str:
        return f"bubo.Model({self.name!r}, n_ctx={self.n_ctx})"

    @property
    def n_vocab(self) -> int:
        return self.runtime.n_vocab

    @property
    def _native(self) -> NativeModel:
        return self.runtime.native

    # --- text ----------------------------------------------------------------------------

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        return self.tokenizer.encode(text, add_special=add_special, parse_special=parse_special)

    def detokenize(self, ids: Iterable[int], skip_special: bool = False) -> str:
        ids = list(ids)
        self.runtime.check_ids(ids)
        return self.tokenizer.decode(ids, skip_special=skip_special)

    # --- generation ----------------------------------------------------------------------

    def generate(self, prompt: str | Sequence[int], *, max_tokens: int | None = 256,
                 stop: str | Iterable[str] = (), seed: int | None = None,
                 temperature: float | None = None, top_k: int | None = None,
                 top_p: float | None = None, min_p: float | None = None,
                 add_special: bool = True, parse_special: bool = False,
                 grammar: str | Grammar | None = None, ignore_eos: bool = False, **sampling: Any) -> TextStream:
        """Stream the continuation of `prompt` (text, or token ids used as they are) as text
        pieces. Stops at an end-of-generation token, at a stop string (which is not yielded,
        nor anything after it) or after max_tokens (None: until the context is full).

        Sampling parameters left as None take bubo.sampling.SamplingParams' defaults (those of
        llama.cpp); other SamplingParams fields can be passed by name. temperature <= 0 is greedy.
        grammar (GBNF text or a bubo._grammar.Grammar): every token keeps the text in its
        language, and the answer ends only where the text is a whole sentence of it. ignore_eos:
        generate past end-of-generation tokens (until max_tokens or a stop string)."""
        if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens <= 0):
            raise ValueError(f"max_tokens must be a positive integer (or None for no limit), got {max_tokens!r}")
        if isinstance(prompt, str):
            ids = self.tokenize(prompt, add_special=add_special, parse_special=parse_special)
        else:
            ids = list(prompt)
            self.runtime.check_ids(ids)
            ids = [int(t) for t in ids]
        if not ids:
            raise InvalidRequestError("the prompt is empty: give some text or token ids")
        if len(ids) >= self.n_ctx:
            raise InvalidRequestError(
                f"the prompt is {len(ids)} tokens but the context holds {self.n_ctx} (and needs room "
                "for at least one generated token): shorten the prompt or create the Model with a "
                f"larger n_ctx (this model was trained with {self.hparams.get('n_ctx_train')})"
            )
        stops = [stop] if isinstance(stop, str) else list(stop)
        params = _sampling_params(seed=seed, temperature=temperature, top_k=top_k, top_p=top_p,
                                  min_p=min_p, **sampling)
        if isinstance(grammar, str):
            from bubo._grammar import Grammar

            grammar = Grammar(grammar)
        req = GenerationRequest(ids, params, max_tokens, stops, ignore_eos=ignore_eos, grammar=grammar)
        return TextStream(self, self._start(req))

    def complete(self, prompt: str | Sequence[int], **kwargs: Any) -> Completion:
        """generate(), collected: the text with why it ended."""
        stream = self.generate(prompt, **kwargs)
        for _ in stream:
            pass
        return stream.completion()

    def chat(self, messages: Sequence[Mapping[str, Any]], *, tools: Sequence[Mapping[str, Any]] | None = None,
             **kwargs: Any) -> Completion:
        """Answer `messages` ([{"role": "user", "content": "..."}, ...]) with the model's chat
        template; kwargs as for generate()."""
        return self.complete(self._chat_ids(messages, tools), **kwargs)

    def chat_stream(self, messages: Sequence[Mapping[str, Any]], *,
                    tools: Sequence[Mapping[str, Any]] | None = None, **kwargs: Any) -> TextStream:
        """chat(), streamed as text pieces."""
        return self.generate(self._chat_ids(messages, tools), **kwargs)

    def _chat_ids(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None) -> list[int]:
        """The chat prompt's tokens: the template's markup as control tokens, the messages' and
        tools' own text as text (control-token text they hold included)."""
        ct = self.runtime.chat_text(messages, tools=tools)
        return self.tokenizer.encode(ct.text, add_special=True, parse_special=True, text_spans=ct.spans or None)

    def chat_prompt(self, messages: Sequence[Mapping[str, Any]], *,
                    tools: Sequence[Mapping[str, Any]] | None = None, add_generation_prompt: bool = True,
                    **template_kwargs: Any) -> str:
        """The rendered chat template. Tokenize it with parse_special=True. template_kwargs are
        extra template variables (enable_thinking, ...: a request's chat_template_kwargs)."""
        return self.runtime.chat_prompt(messages, tools=tools, add_generation_prompt=add_generation_prompt,
                                        **template_kwargs)

    @property
    def chat_template(self) -> ChatTemplate:
        return self.runtime.chat_template

    # --- the one slot ----------------------------------------------------------------------

    def _start(self, req: GenerationRequest) -> _Run:
        """req's run; it takes the slot when it is first read."""
        run = _Run(req)
        run.task = self._sched.new_task(run)  # its sampler and grammar state: errors show here
        return run

    def _begin(self, run: _Run) -> None:
        """Give run the slot: a generation still being read is superseded (its stream raises at
        its next read; the slot keeps what its sequence holds for the new one to reuse)."""
        old = self._current
        if old is not None and old is not run and not old.ended:
            old.superseded = True
        run.started = True
        assert run.task is not None
        self._sched.queue.append(run.task)
        self._current = run

    def _next_event(self, run: _Run) -> Event | None:
        """run's next event, stepping the scheduler until there is one; None once it ended."""
        while True:
            if run.superseded:
                raise RuntimeError(
                    "another generation started on this Model while this one was being read; "
                    "finish or close one generator before starting the next")
            if run.ended:
                return None
            if not run.started:
                self._begin(run)
            if run.events:
                ev = run.events.popleft()
                if not isinstance(ev, TokenEvent):
                    run.ended = True
                return ev
            try:
                worked = self._sched.step(contextlib.nullcontext())
            except BaseException:
                # what the cache holds is unknown now: start the next prompt from scratch
                self._sched.reset()
                run.ended = True
                raise
            if not worked and not run.events:
                raise RuntimeError("the generation stalled: the scheduler had no work for it")  # a bug


def _sampling_params(**kwargs: Any) -> SamplingParams:
    from bubo.sampling import SamplingParams

    given = {k: v for k, v in kwargs.items() if v is not None}
    try:
        return SamplingParams(**given)
    except TypeError as e:
        raise TypeError(f"unknown sampling parameter: {e}") from None
