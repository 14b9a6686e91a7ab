"""The high-level Python API: load a model by catalog name or path, tokenize, generate, chat.

    with bubo.Model("smollm2:135m") as m:
        for piece in m.generate("The capital of France is", max_tokens=16, temperature=0):
            print(piece, end="")
        c = m.chat([{"role": "user", "content": "Weather in Paris?"}], tools=[...], tool_choice="required")
        c.tool_calls[0].name, c.tool_calls[0].parsed_arguments

A Model is a one-slot client of the runtime the server runs on: a Runtime (bubo/runtime.py: the
native model, tokenizer and chat template), a KV cache of one sequence, and the server's own
scheduler (bubo/engine/scheduler.py) with one slot, driven in the caller's thread instead of an
engine thread. Each token therefore comes from the same Generation (sampler, grammar, stop
strings, finish rules) as the server's, and the same prefix reuse: the slot keeps its sequence
between calls, so a call whose prompt continues the previous one's computes only what is new.

A chat request is read by the server's own rules (bubo/chat/request.py: messages, tools,
tool_choice, output constraints, thinking) and prepared by its own code (bubo/chat/prepare.py:
the template, constrain()'s grammar and output parser, the tokens), so chat() answers what
POST /v1/chat/completions answers: the same tokens, the same content, reasoning and tool calls.

Errors: bad arguments raise ValueError (bubo.errors.RequestError for the fields the server
shares, with the server's message) or TypeError, naming the parameter. A Model is not meant to be
shared between threads; the HTTP server's engine batches requests across threads and clients.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import sys
import weakref
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from bubo import embed as embedding
from bubo import limits, store
from bubo._grammar import Grammar
from bubo._tokenizer import Tokenizer
from bubo.chat import ChatTemplate
from bubo.chat.parsers import Part, ToolCall
from bubo.chat.request import assistant_message, chat_finish_reason
from bubo.engine.contexts import Contexts
from bubo.engine.draft import DEFAULT_DRAFT, MAX_DRAFT_PER_REQUEST, DraftConfig, DraftModel
from bubo.engine.generation import LENGTH, StopMatcher, text_pieces
from bubo.engine.types import (
    ErrorEvent,
    Event,
    FinishEvent,
    GenerationRequest,
    InvalidRequestError,
    Timings,
    TokenEvent,
    refusal_of,
)
from bubo.runtime import Runtime
from bubo.sampling import SamplingOptions, SamplingParams

if sys.version_info >= (3, 11):
    from typing import Unpack
else:  # pragma: no cover - Python 3.10
    from typing_extensions import Unpack

if TYPE_CHECKING:
    from bubo._model import KVCache
    from bubo._model import Model as NativeModel
    from bubo.chat.parsers import OutputParser
    from bubo.engine.scheduler import Scheduler, Task

__all__ = ["ChatCompletion", "ChatStream", "Completion", "Model", "StopMatcher", "TextStream", "ToolCall"]

# prompt tokens per forward pass: large enough for the matrix-matrix kernels to pay off, small
# enough that the activations stay modest (the server's -ub default)
PREFILL_CHUNK = 512
LIBRARY_CONTEXTS = 16  # Model.context: the KV cache's sequences after the slot's

# the token stream -> text pieces rule the generation core follows (bubo.engine.generation)
_text_stream = text_pieces

# every SamplingParams field is a keyword of generate(), complete(), chat() and chat_stream(),
# typed once in bubo.sampling.SamplingOptions (tests/test_fields.py checks them)
SAMPLING_FIELDS = tuple(f.name for f in dataclasses.fields(SamplingParams))

# the OpenAI shape of a named tool_choice, for the error message
_NAMED_CHOICE = '{"type": "function", "function": {"name": ...}}'


@dataclass
class Completion:
    """A finished generation.

    text: the generated text (for chat(), the answer as the model wrote it, markup included);
    finish_reason: "stop" (an end-of-generation token or a stop string), "length" (max_tokens
    or a full context) or, for chat(), "tool_calls" (the answer is tool calls);
    logprobs: each generated token's log probability; top_logprobs: with n_probs > 0, each
    token's n_probs best (token id, log probability); steered_to_fit: a grammar-constrained
    answer was steered to a short ending to fit max_tokens (bubo.engine.fit); it is complete."""

    text: str
    tokens: list[int]  # the generated token ids (including the EOG token, if one ended it)
    finish_reason: str
    prompt_tokens: int
    stop: str | None = None  # the stop string that ended it, if one did
    logprobs: list[float] = field(default_factory=list)  # of each generated token
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    cached_tokens: int = 0  # prompt tokens reused from the previous call's sequence
    steered_to_fit: bool = False
    # the prompt's and the generation's token counts and times (not part of the answer: == ignores them)
    timings: Timings = field(default_factory=Timings, compare=False)


@dataclass
class ChatCompletion(Completion):
    """A chat answer, parsed as the server parses it: content (the text without reasoning or
    call markup), reasoning_content (a thinking template's <think> block), tool_calls (when
    tools were given; finish_reason "tool_calls" unless max_tokens cut the answer)."""

    content: str = ""
    reasoning_content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)

    @property
    def message(self) -> dict[str, Any]:
        """The answer as OpenAI's assistant message: append it to the messages to go on (with
        the tool results as {"role": "tool", "tool_call_id": ..., "content": ...} messages)."""
        return assistant_message(self.reasoning_content, self.content, self.tool_calls)


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
        self.model_closed = False  # Model.close() ran
        self.ending = False  # the reader has the answer (its one tool call): finish at the next step
        self.backlogged = False  # the caller's thread reads each event as it comes

    @property
    def request(self) -> GenerationRequest:
        return self._request

    @property
    def cancelled(self) -> bool:
        return self.superseded or self.closed

    def push(self, event: Event) -> None:
        self.events.append(event)


class TextStream(Iterator[str]):
    """What generate() returns: an iterator of text pieces; once it is exhausted, completion()
    tells how the generation ended. close() stops it early."""

    def __init__(self, model: Model, run: _Run):
        self._model = model
        self._run = run
        self._text: list[str] = []
        self._tokens: list[int] = []
        self._logprobs: list[float] = []
        self._top: list[list[tuple[int, float]]] = []
        self._finish: FinishEvent | None = None

    def __next__(self) -> str:
        while True:
            ev = self._model._next_event(self._run)
            if ev is None:
                raise StopIteration
            text = self._record(ev)
            if text:
                return text

    def _record(self, ev: Event) -> str:
        """Keep what ev tells; its text ("" for the final event)."""
        if isinstance(ev, TokenEvent):
            self._tokens.append(ev.token)
            self._logprobs.append(ev.logprob)
            if self._run.request.n_probs:
                self._top.append(list(ev.top))
            self._text.append(ev.text)
            return ev.text
        if isinstance(ev, FinishEvent):
            self._finish = ev
            return ""
        assert isinstance(ev, ErrorEvent)
        raise refusal_of(ev)

    def close(self) -> None:
        """Stop the generation here (the model's slot is free for the next one)."""
        if not self._run.ended:
            self._run.closed = True
            self._run.ended = True

    def _finished(self) -> FinishEvent:
        if self._finish is None:
            raise RuntimeError("the generation has not finished: read the stream to its end first")
        return self._finish

    def completion(self) -> Completion:
        """How the generation ended (RuntimeError before the stream is read to its end)."""
        fin = self._finished()
        return Completion("".join(self._text), self._tokens, fin.reason, fin.prompt_tokens, fin.stop_string,
                          self._logprobs, self._top, fin.cached_tokens, fin.steered, fin.timings)


class ChatStream(TextStream):
    """What chat_stream() returns: an iterator of the answer's content, as text pieces (no
    reasoning, no tool-call markup: what the server streams as delta.content). parts() gives
    every parsed piece instead (bubo.chat.parsers.Part: kind "reasoning", "content" or
    "tool_call" with its call), as the server streams them; iterate one or the other. Once it
    is exhausted, completion() is the whole ChatCompletion (content, reasoning_content,
    tool_calls, finish_reason)."""

    def __init__(self, model: Model, run: _Run, parser: OutputParser):
        super().__init__(model, run)
        self._parser = parser
        self._pending: collections.deque[Part] = collections.deque()
        self._content: list[str] = []
        self._reasoning: list[str] = []
        self._calls: list[ToolCall] = []

    def __next__(self) -> str:
        while True:
            part = self._next_part()
            if part is None:
                raise StopIteration
            if part.kind == "content":
                return part.text

    def parts(self) -> Iterator[Part]:
        """The answer's parsed parts as they come: reasoning and content text, and each tool call
        once it is whole."""
        while (part := self._next_part()) is not None:
            yield part

    def _next_part(self) -> Part | None:
        while not self._pending:
            ev = self._model._next_event(self._run)
            if ev is None:
                return None
            text = self._record(ev)
            if isinstance(ev, TokenEvent):
                parts = self._parser.feed(text)
                if self._parser.done:
                    self._run.ending = True  # the answer's one call is whole: finish it (pipeline.run_events)
            else:
                assert isinstance(ev, FinishEvent)
                parts = self._parser.finish(cut=ev.reason == LENGTH)
            for p in parts:
                if p.kind == "reasoning":
                    self._reasoning.append(p.text)
                elif p.kind == "content":
                    self._content.append(p.text)
                elif p.call is not None:
                    self._calls.append(p.call)
                self._pending.append(p)
        return self._pending.popleft()

    def completion(self) -> ChatCompletion:
        base = super().completion()
        return ChatCompletion(**{f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
                              | {"finish_reason": chat_finish_reason(base.finish_reason, len(self._calls))},
                              content="".join(self._content), reasoning_content="".join(self._reasoning),
                              tool_calls=list(self._calls))


@dataclass
class _Loaded:
    """What a Model holds until close(): the runtime, its KV cache and the one-slot scheduler
    (neither for an encoder, which only embeds)."""

    runtime: Runtime
    kv: KVCache | None
    sched: Scheduler | None


class Context:
    """A prompt read once and kept by its Model (Model.context, Model.load_context):
    generate(..., context=c) continues it without reading it again. fork() makes another that
    shares its KV rows (copied only where one of them writes); save(path) writes it to a file
    Model.load_context reads back; close() frees it."""

    def __init__(self, model: Model, id: str):
        self.model = model
        self.id = id

    @property
    def tokens(self) -> list[int]:
        return list(self.model._contexts().get(self.id).tokens)

    def __len__(self) -> int:
        return len(self.model._contexts().get(self.id).tokens)

    def fork(self) -> Context:
        (child,), _ = self.model._contexts().fork(self.id, 1)
        return Context(self.model, child.id)

    def save(self, path: str | os.PathLike[str]) -> int:
        """Write the context to path (a temporary name, then renamed); returns the bytes written."""
        from pathlib import Path

        from bubo.engine import slotfile

        tokens, rows = self.model._contexts().export(self.id)
        return slotfile.write(Path(path), self.model._layout(), tokens, rows)

    def close(self) -> None:
        """Free the context's memory (its forks keep theirs)."""
        contexts = self.model._sched.contexts if not self.model.closed else None
        if contexts is not None and self.id in contexts.by_id:
            contexts.delete(self.id)

    def __repr__(self) -> str:
        return f"<bubo.Context {self.id} of {self.model.name}>"


class Model:
    """A GGUF model ready to generate: `Model("smollm2:135m")` or `Model("/path/to/x.gguf")`.

    A catalog name that is not stored yet is pulled first. n_ctx is the KV cache size in tokens
    (capped at the model's training context); n_threads defaults to every CPU; chat_template:
    Jinja source that replaces the file's own. draft: speculative decoding (True: prompt-lookup
    drafts, bubo.engine.draft.DEFAULT_DRAFT; False: off; a draft model's catalog name or path,
    which must share this model's vocabulary and be smaller, e.g. "qwen2.5-coder:0.5b" for
    "qwen2.5-coder:1.5b"; or a DraftConfig); it never changes an answer (greedy or seeded: the
    same tokens and log-probabilities), only how many forward passes it takes. The generation
    calls' draft_max keyword sets it per call (0: no drafting for that call). cache_type_k and
    cache_type_v: how the KV cache stores K and V rows ("f16", "f32" or "q8_0", and "q4_0" for V;
    q8_0 takes about half of f16's memory, for logits a little off f16's). lora: LoRA adapters
    (bubo/lora.py: llama.cpp's adapter GGUF files), each a path (scale 1) or (path, scale): their
    scales apply to every call (set_lora changes them; a call's lora= applies its own instead).

    A Model is a context manager: `with bubo.Model(...) as m:` closes it at the end of the
    block (close(): the native model and its KV cache are let go; later calls raise).

    Sampling, in generate(), complete(), chat() and chat_stream(): sampling= a
    bubo.sampling.SamplingParams, and/or its fields as keywords (bubo.sampling.SamplingOptions:
    temperature, top_k, top_p, min_p, ..., seed, n_probs, logit_bias) over it, with the server's
    meaning; a keyword left out or None takes the default (llama.cpp's). temperature <= 0 is
    greedy; seed None or -1 draws a random seed."""

    def __init__(self, name_or_path: str | os.PathLike[str], *, n_ctx: int = 4096,
                 n_threads: int | None = None, chat_template: str | None = None,
                 draft: bool | str | os.PathLike[str] | DraftConfig = True, cache_type_k: str = "f16",
                 cache_type_v: str = "f16",
                 lora: Sequence[str | os.PathLike[str] | tuple[str | os.PathLike[str], float]] = ()):
        from bubo.engine.memory import check_cache_type

        check_cache_type(cache_type_k, "cache_type_k", k=True)
        check_cache_type(cache_type_v, "cache_type_v", k=False)
        if isinstance(n_ctx, bool) or not isinstance(n_ctx, int) or n_ctx <= 0:
            raise ValueError(f"n_ctx must be a positive integer, got {n_ctx!r}")
        if n_threads is not None and (isinstance(n_threads, bool) or not isinstance(n_threads, int)
                                      or n_threads <= 0):
            raise ValueError(f"n_threads must be a positive integer (or None for every CPU), got {n_threads!r}")
        from bubo._model import KVCache
        from bubo.engine.memory import memory_short
        from bubo.engine.scheduler import Scheduler

        self.path = store.resolve(name_or_path)
        self.name = str(name_or_path)
        runtime = Runtime(self.path, n_threads=n_threads, chat_template=chat_template, name=self.name)
        if lora:
            runtime.load_adapters([(str(a[0]), float(a[1])) if isinstance(a, tuple) else (str(a), 1.0)
                                   for a in lora])
        self.metadata: dict[str, Any] = runtime.metadata
        self.hparams: dict[str, Any] = runtime.hparams
        n_ctx_train = runtime.n_ctx_train
        self.n_ctx = min(n_ctx, n_ctx_train) if n_ctx_train else n_ctx
        self._current: _Run | None = None
        self._runs: weakref.WeakSet[_Run] = weakref.WeakSet()  # every run not yet collected: close() ends them
        if embedding.is_encoder(runtime):  # an encoder embeds only: no cache, no scheduler
            self._loaded: _Loaded | None = _Loaded(runtime, None, None)
            return
        # swa_full=False: sliding-window layers (gemma3) keep only their window's blocks
        # contexts (Model.context) are the cache's sequences after the slot's; a sliding-window cache
        # commits its window pool per sequence, so it keeps none
        n_seq = 1 if runtime.hparams.get("sliding_window") else 1 + LIBRARY_CONTEXTS
        kv = KVCache(runtime.native, self.n_ctx, n_seq_max=n_seq, swa_full=False, type=cache_type_k,
                     type_v=cache_type_v)
        if isinstance(draft, (str, os.PathLike)):
            draft = DraftConfig(model=str(draft))
        if not isinstance(draft, (bool, DraftConfig)):
            raise TypeError("draft must be True, False, a draft model's name or path, or a "
                            f"bubo.engine.draft.DraftConfig, not {type(draft).__name__}")
        config = DEFAULT_DRAFT if draft is True else (draft or None)
        draft_model = None
        if config is not None and config.model is not None and (kv.sliding_window == 0 or kv.swa_full):
            draft_model = DraftModel.load(config, runtime, self.n_ctx, 1, PREFILL_CHUNK)
        sched = Scheduler(runtime, kv, 1, PREFILL_CHUNK, self.n_ctx, memory_short, retain=True, draft=config,
                          draft_model=draft_model)
        self._loaded = _Loaded(runtime, kv, sched)

    def __repr__(self) -> str:
        return f"bubo.Model({self.name!r}, n_ctx={self.n_ctx}{', closed' if self.closed else ''})"

    # --- lifetime --------------------------------------------------------------------------

    def __enter__(self) -> Model:
        self._live()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Let go of the native model, its KV cache and the scheduler: their memory is freed now
        (unless the caller still holds the runtime, tokenizer or a generation's own objects).
        A stream of this model raises at its next read; every later call raises RuntimeError.
        Closing twice is fine."""
        if self._loaded is None:
            return
        for run in list(self._runs):
            if not run.ended:
                run.model_closed = True
                run.ended = True
            run.task = None  # its Generation holds the runtime, and the task holds the run: a cycle
        self._runs.clear()
        self._current = None
        self._loaded = None

    @property
    def closed(self) -> bool:
        return self._loaded is None

    def _live(self) -> _Loaded:
        if self._loaded is None:
            raise RuntimeError(f"this Model ({self.name}) was closed: create a new bubo.Model to use it again")
        return self._loaded

    @property
    def runtime(self) -> Runtime:
        """The Runtime (native model, tokenizer, chat template) this Model runs on."""
        return self._live().runtime

    @property
    def tokenizer(self) -> Tokenizer:
        return self._live().runtime.tokenizer

    @property
    def n_vocab(self) -> int:
        return self.runtime.n_vocab

    @property
    def _native(self) -> NativeModel:
        return self.runtime.native

    @property
    def is_encoder(self) -> bool:
        """An embedding model (bert): embed() only, no text generation."""
        return embedding.is_encoder(self.runtime)

    @property
    def _sched(self) -> Scheduler:
        sched = self._live().sched
        if sched is None:
            raise embedding.EncoderOnlyError(self.name, str(self.hparams.get("arch")), " (Model.embed)")
        return sched

    @property
    def _kv(self) -> KVCache:
        kv = self._live().kv
        if kv is None:
            raise embedding.EncoderOnlyError(self.name, str(self.hparams.get("arch")), " (Model.embed)")
        return kv

    # --- embeddings ----------------------------------------------------------------------

    def embed(self, texts: str | Sequence[str] | Sequence[Sequence[int]], *, pooling: str | None = None,
              normalize: bool = True, truncate: bool = False) -> np.ndarray:
        """Embeddings: float32 [len(texts), dim] for a list (of texts, or of token id lists),
        [dim] for one text. An encoder (all-minilm:l6-v2) or a decoder (its final normed hidden
        states). pooling: "mean", "cls" or "last" (None: the model file's, else cls for an
        encoder and last for a decoder); L2-normalised unless normalize is False. A text longer
        than the model takes raises embed.TooLongError (a ValueError) unless truncate, which cuts
        it to fit."""
        embedding.check_pooling(pooling)
        single = isinstance(texts, str)
        items: list[str | Sequence[int]] = [texts] if isinstance(texts, str) else list(texts)
        for i, item in enumerate(items):
            if not isinstance(item, (str, Sequence, np.ndarray)) or isinstance(item, (bytes, bytearray)):
                raise TypeError(f"texts[{i}] must be a str or a list of token ids, not {type(item).__name__}")
        runtime = self.runtime
        seqs, _ = embedding.tokenize(runtime, items, embedding.max_tokens(runtime, self.n_ctx), truncate)
        vectors = embedding.embed_ids(runtime, seqs, pooling, normalize)
        return vectors[0] if single else vectors

    # --- text ----------------------------------------------------------------------------

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, not {type(text).__name__}")
        return self.tokenizer.encode(text, add_special=add_special, parse_special=parse_special)

    def detokenize(self, ids: Iterable[int], skip_special: bool = False) -> str:
        ids = list(ids)
        self.runtime.check_ids(ids)
        return self.tokenizer.decode(ids, skip_special=skip_special)

    # --- generation ----------------------------------------------------------------------

    def generate(self, prompt: str | Sequence[int], *, max_tokens: int | None = 256,
                 stop: str | Iterable[str] = (), grammar: str | Grammar | None = None,
                 json_schema: dict[str, Any] | bool | None = None, response_format: dict[str, Any] | None = None,
                 ignore_eos: bool = False, add_special: bool = True, parse_special: bool = False,
                 draft_max: int | None = None, context: Context | None = None, save: bool = False,
                 lora: Mapping[int | str, float] | None = None,
                 sampling: SamplingParams | None = None, **options: Unpack[SamplingOptions]) -> TextStream:
        """Stream the continuation of `prompt` (text, or token ids used as they are) as text
        pieces. context: a Context of this Model (Model.context) that the prompt continues (its
        tokens first, their rows shared, not read again; text is then tokenized without BOS);
        save: the context moves forward to the end of the answer. Stops at an end-of-generation
        token, at a stop string (which is not yielded, nor anything after it) or after max_tokens
        (None: until the context is full).

        Output constraints, one at most (as the server's /completion and /v1/completions):
        grammar (GBNF text, or a compiled bubo._grammar.Grammar), json_schema (a JSON Schema:
        the text is one of its instances) or response_format ({"type": "json_object"},
        {"type": "json_schema", "json_schema": {"schema": {...}}} or {"type": "text"}). The
        answer keeps to it token by token and ends only where it is whole (within max_tokens:
        bubo.engine.fit). A schema keyword no grammar can enforce raises RequestError
        (code "unsupported_schema"), naming its JSON pointer as the server does.
        ignore_eos: generate past end-of-generation tokens (until max_tokens or a stop string).
        add_special / parse_special: how text is tokenized (BOS; special-token text as tokens).
        lora: this call's adapter scales ({id or name: scale}; the others 0), instead of the Model's.
        Sampling keywords: see Model (None: SamplingParams' default)."""
        params = _sampling_params(sampling, options)
        n_probs = params.n_probs
        grammar = self._raw_grammar(grammar, json_schema, response_format)
        if context is None:
            if save:
                raise ValueError("save=True needs a context to move forward")
            ids = self._prompt_ids(prompt, add_special, parse_special)
            return TextStream(self, self._start(self._request(ids, params, max_tokens, stop, n_probs, grammar,
                                                              ignore_eos, draft_max, lora)))
        ctx = self._context_of(context)
        ids = ctx.tokens + (self._prompt_ids(prompt, False, parse_special) if prompt else [])
        req = self._request(ids, params, max_tokens, stop, n_probs, grammar, ignore_eos, draft_max, lora)
        # no claim: a Model runs one generation at a time, in the caller's thread
        req = dataclasses.replace(req, context=ctx.seq, keep=ctx.seq if save else None)
        return TextStream(self, self._start(req))

    def complete(self, prompt: str | Sequence[int], *, max_tokens: int | None = 256,
                 stop: str | Iterable[str] = (), grammar: str | Grammar | None = None,
                 json_schema: dict[str, Any] | bool | None = None, response_format: dict[str, Any] | None = None,
                 ignore_eos: bool = False, add_special: bool = True, parse_special: bool = False,
                 draft_max: int | None = None, context: Context | None = None, save: bool = False,
                 lora: Mapping[int | str, float] | None = None,
                 sampling: SamplingParams | None = None, **options: Unpack[SamplingOptions]) -> Completion:
        """generate(), collected: the text with why it ended (a Completion). The same keywords."""
        stream = self.generate(prompt, max_tokens=max_tokens, stop=stop, grammar=grammar, json_schema=json_schema,
                               response_format=response_format, ignore_eos=ignore_eos, add_special=add_special,
                               parse_special=parse_special, draft_max=draft_max, context=context, save=save,
                               lora=lora, sampling=sampling, **options)
        for _ in stream:
            pass
        return stream.completion()

    def chat(self, messages: Sequence[Mapping[str, Any]], *, tools: Sequence[dict[str, Any]] | None = None,
             tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None,
             parallel_tool_calls: bool = False, thinking: bool | None = None,
             chat_template_kwargs: Mapping[str, Any] | None = None,
             max_tokens: int | None = 256, stop: str | Iterable[str] = (), grammar: str | None = None,
             json_schema: dict[str, Any] | bool | None = None, response_format: dict[str, Any] | None = None,
             draft_max: int | None = None, lora: Mapping[int | str, float] | None = None,
             sampling: SamplingParams | None = None, **options: Unpack[SamplingOptions]) -> ChatCompletion:
        """Answer `messages` with the model's chat template, as POST /v1/chat/completions does.

        messages: OpenAI's ([{"role": "user", "content": "..."}, ...]; roles system, developer,
        user, assistant, tool; content a string or a list of text parts; an assistant message's
        tool_calls with arguments as JSON text or a dict). A last assistant message is a
        prefill: the answer continues its text.
        tools: OpenAI function tools ([{"type": "function", "function": {"name", "description",
        "parameters"}}]); the answer's calls come back parsed in ChatCompletion.tool_calls
        (finish_reason "tool_calls"), their markup left out of content. tool_choice: "auto"
        (None: the model decides), "none" (the tools are not shown), "required" (the answer is a
        call, by a grammar) or {"type": "function", "function": {"name": ...}} (a call to that
        one). parallel_tool_calls: False (the default, as the server's) ends the answer after
        its first call; True allows several.
        thinking: False turns a thinking template's reasoning off (True or None: on, unless
        chat_template_kwargs' enable_thinking says otherwise); the reasoning comes back in
        reasoning_content. chat_template_kwargs: extra template variables.
        grammar (GBNF text), json_schema, response_format: the answer's own constraint, as for
        generate() (after the reasoning, for a thinking model); not beside a forced tool_choice.
        Sampling keywords: see Model. Returns a ChatCompletion (text is the raw answer;
        content, reasoning_content and tool_calls its parsed parts; message its OpenAI
        assistant message)."""
        params = _sampling_params(sampling, options)
        n_probs = params.n_probs
        stream = self._chat(messages, params, tools=tools, tool_choice=tool_choice,
                            parallel_tool_calls=parallel_tool_calls, thinking=thinking,
                            chat_template_kwargs=chat_template_kwargs, max_tokens=max_tokens, stop=stop,
                            grammar=grammar, json_schema=json_schema, response_format=response_format,
                            n_probs=n_probs, draft_max=draft_max, lora=lora)
        for _ in stream.parts():
            pass
        return stream.completion()

    def chat_stream(self, messages: Sequence[Mapping[str, Any]], *, tools: Sequence[dict[str, Any]] | None = None,
                    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None,
                    parallel_tool_calls: bool = False, thinking: bool | None = None,
                    chat_template_kwargs: Mapping[str, Any] | None = None,
                    max_tokens: int | None = 256, stop: str | Iterable[str] = (), grammar: str | None = None,
                    json_schema: dict[str, Any] | bool | None = None, response_format: dict[str, Any] | None = None,
                    draft_max: int | None = None, lora: Mapping[int | str, float] | None = None,
                    sampling: SamplingParams | None = None, **options: Unpack[SamplingOptions]) -> ChatStream:
        """chat(), streamed: a ChatStream, whose iteration yields the answer's content as text
        pieces (no reasoning, no tool-call markup; text that could still become a call is held
        back until it is decided, as the server's stream holds it). stream.parts() yields the
        parsed parts instead (reasoning, content and each tool call once it is whole). Once the
        stream is exhausted, stream.completion() is the ChatCompletion chat() would return,
        tool_calls included. The same keywords as chat()."""
        params = _sampling_params(sampling, options)
        n_probs = params.n_probs
        return self._chat(messages, params, tools=tools, tool_choice=tool_choice,
                          parallel_tool_calls=parallel_tool_calls, thinking=thinking,
                          chat_template_kwargs=chat_template_kwargs, max_tokens=max_tokens, stop=stop,
                          grammar=grammar, json_schema=json_schema, response_format=response_format,
                          n_probs=n_probs, draft_max=draft_max, lora=lora)

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

    # --- requests ------------------------------------------------------------------------

    def _raw_grammar(self, grammar: str | Grammar | None, json_schema: Any, response_format: Any) -> Grammar | None:
        """A raw completion's grammar, as the server's completions build it (bubo.chat.prepare)."""
        from bubo.chat.prepare import completion_grammar
        from bubo.chat.request import check_one_output, output_spec

        if isinstance(grammar, Grammar):
            check_one_output(grammar, json_schema, response_format)
            return grammar
        return completion_grammar(output_spec(grammar, json_schema, response_format), self.runtime)

    def _prompt_ids(self, prompt: str | Sequence[int], add_special: bool, parse_special: bool) -> list[int]:
        if isinstance(prompt, str):
            return self.tokenize(prompt, add_special=add_special, parse_special=parse_special)
        given: Any = prompt  # a list, a tuple, a numpy array, ...
        if not isinstance(given, Sequence) and not hasattr(given, "__array__"):
            raise TypeError(f"prompt must be text (str) or a sequence of token ids, not {type(given).__name__}")
        ids: list[int] = list(given)
        self.runtime.check_ids(ids)
        return [int(t) for t in ids]

    def _request(self, ids: list[int], params: SamplingParams, max_tokens: int | None, stop: str | Iterable[str],
                 n_probs: int | None, grammar: Grammar | None, ignore_eos: bool = False,
                 draft_max: int | None = None, lora: Mapping[int | str, float] | None = None) -> GenerationRequest:
        self._generative()
        if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int)
                                       or max_tokens <= 0):
            raise ValueError(f"max_tokens must be a positive integer (or None for no limit), got {max_tokens!r}")
        if draft_max is not None and (isinstance(draft_max, bool) or not isinstance(draft_max, int)
                                      or not 0 <= draft_max <= MAX_DRAFT_PER_REQUEST):
            raise ValueError(f"draft_max must be an integer from 0 (no drafting) to {MAX_DRAFT_PER_REQUEST} "
                             f"(or None: the Model's), got {draft_max!r}")
        if not ids:
            raise InvalidRequestError("the prompt is empty: give some text or token ids")
        if len(ids) >= self.n_ctx:
            raise InvalidRequestError(
                f"the prompt is {len(ids)} tokens but the context holds {self.n_ctx} (and needs room "
                "for at least one generated token): shorten the prompt or create the Model with a "
                f"larger n_ctx (this model was trained with {self.hparams.get('n_ctx_train')})"
            )
        return GenerationRequest(ids, params, max_tokens, _stop_list(stop), n_probs or 0, ignore_eos=ignore_eos,
                                 grammar=grammar, draft_max=draft_max,
                                 lora=self.runtime.lora_in_force(None if lora is None else self._lora_ids(lora)))

    @property
    def lora(self) -> list[dict[str, Any]]:
        """The LoRA adapters: [{"id", "name", "path", "scale"}], scale the one every call uses."""
        return [{"id": a.id, "name": a.name, "path": a.path, "scale": a.scale} for a in self.runtime.adapters]

    def set_lora(self, scales: Mapping[int | str, float]) -> None:
        """Every call's adapter scales from now on ({id or name: scale}; an adapter left out: 0)."""
        given = dict(self._lora_ids(scales))
        for a in self.runtime.adapters:
            a.scale = given.get(a.id, 0.0)

    def _lora_ids(self, scales: Mapping[int | str, float]) -> list[tuple[int, float]]:
        from bubo.lora import AdapterError, check_scales

        by_name = {a.name: a.id for a in self.runtime.adapters}
        pairs: list[tuple[Any, Any]] = []
        for key, scale in dict(scales).items():
            if isinstance(key, str):
                if key not in by_name:
                    raise AdapterError(f"no adapter named {key!r}: the adapters are {', '.join(by_name) or 'none'}")
                key = by_name[key]
            pairs.append((key, scale))
        return check_scales(pairs, len(self.runtime.adapters), "lora")

    def _generative(self) -> None:
        """EncoderOnlyError for an embedding model, before anything reads a chat template."""
        if self._live().sched is None:
            raise embedding.EncoderOnlyError(self.name, str(self.hparams.get("arch")), " (Model.embed)")

    def _chat(self, messages: Sequence[Mapping[str, Any]], params: SamplingParams, *,
              tools: Sequence[dict[str, Any]] | None, tool_choice: Any, parallel_tool_calls: bool,
              thinking: bool | None, chat_template_kwargs: Mapping[str, Any] | None, max_tokens: int | None,
              stop: str | Iterable[str], grammar: str | None, json_schema: Any, response_format: Any,
              n_probs: int | None, draft_max: int | None = None,
              lora: Mapping[int | str, float] | None = None) -> ChatStream:
        """The server's chat request, read by its rules (bubo.chat.request) in its order and
        prepared by its code (bubo.chat.prepare)."""
        self._generative()
        from bubo.chat.prepare import prepare_chat
        from bubo.chat.request import (
            chat_messages,
            chat_tools,
            check_forced_call_alone,
            openai_tool_choice,
            output_spec,
            thinking_of,
        )

        runtime = self.runtime
        if isinstance(grammar, Grammar):
            raise TypeError("chat() takes grammar as GBNF text (str), not a compiled Grammar: the answer's grammar "
                            "is built around it (the reasoning's place, for a thinking template)")
        msgs, prefill = chat_messages(_json_list(messages))
        spec = output_spec(grammar, json_schema, response_format)
        if thinking is not None and not isinstance(thinking, bool):
            raise TypeError(f"thinking must be True, False or None, not {thinking!r}")
        if chat_template_kwargs is not None and not isinstance(chat_template_kwargs, Mapping):
            raise TypeError(f"chat_template_kwargs must be a mapping, not {type(chat_template_kwargs).__name__}")
        body: dict[str, Any] = {"chat_template_kwargs": dict(chat_template_kwargs or {})}
        if thinking is not None:
            body["thinking"] = {"type": "enabled" if thinking else "disabled"}
        thinks, template_kwargs = thinking_of(body)
        checked = chat_tools(_json_list(tools) if tools is not None else None)
        named = (tool_choice.get("function") or {}).get("name") if isinstance(tool_choice, dict) else None
        checked, forced = openai_tool_choice(tool_choice, checked, named, _NAMED_CHOICE)
        if not isinstance(parallel_tool_calls, bool):
            raise TypeError(f"parallel_tool_calls must be True or False, not {parallel_tool_calls!r}")
        check_forced_call_alone(forced, spec)
        prep = prepare_chat(runtime, msgs, prefill=prefill, tools=checked, template_kwargs=template_kwargs,
                            output=spec, tool_choice=forced, parallel_tool_calls=parallel_tool_calls,
                            thinking=thinks)
        assert prep.parser is not None  # a chat answer always has one
        req = self._request(prep.prompt.tokens, params, max_tokens, stop, n_probs, prep.grammar, draft_max=draft_max,
                            lora=lora)
        return ChatStream(self, self._start(req), prep.parser)

    # --- contexts ----------------------------------------------------------------------------

    def context(self, prompt: str | Sequence[int], *, add_special: bool = True,
                parse_special: bool = False) -> Context:
        """Read prompt (text, or token ids) once and keep it: a Context that generate(...,
        context=) continues without reading it again, that fork() shares, and that save() writes.
        A Model keeps at most 16 (close() frees one); a model with sliding-window layers none."""
        ids = self._prompt_ids(prompt, add_special, parse_special)
        if not ids:
            raise InvalidRequestError("the prompt is empty: give some text or token ids")
        contexts = self._contexts()
        ctx = contexts.new()
        ctx.writer = True
        try:
            req = GenerationRequest(ids, read_only=True, keep=ctx.seq, lora=self.runtime.lora_in_force())
            stream = TextStream(self, self._start(req))
            for _ in stream:
                pass
            stream.completion()
        except BaseException:
            contexts.discard(ctx.id)
            raise
        return Context(self, ctx.id)

    def load_context(self, path: str | os.PathLike[str]) -> Context:
        """A Context from a file Context.save() wrote (for this model and cache types); ValueError
        naming what is wrong with any other file (another model, damaged, truncated)."""
        from pathlib import Path

        from bubo.engine import slotfile

        kv = self._kv
        tokens, rows, _ = slotfile.read(Path(path), self._layout(), kv.seq_bytes, self.n_ctx)
        contexts = self._contexts()
        ctx = contexts.new()
        try:
            kv.prefix_namespace(ctx.seq, 0)  # rows of the base model (a file says nothing of adapters)
            if tokens:
                kv.import_rows(ctx.seq, len(tokens), rows)
        except BaseException:
            contexts.discard(ctx.id)
            raise
        ctx.tokens = tokens
        return Context(self, ctx.id)

    def _contexts(self) -> Contexts:
        self._generative()
        contexts = self._sched.contexts
        if contexts is None:
            raise ValueError(f"{self.name} has sliding-window layers: its cache keeps no contexts")
        return contexts

    def _context_of(self, context: Context) -> Any:
        if not isinstance(context, Context) or context.model is not self:
            raise TypeError("context must be a Context of this Model (Model.context)")
        return self._contexts().readable(context.id)

    def _layout(self) -> Any:
        from bubo.engine import slotfile

        kv = self._kv
        return slotfile.Layout(slotfile.model_sha256(str(self.path)), kv.block_size, kv.type, kv.type_v)

    # --- the one slot ----------------------------------------------------------------------

    def run_request(self, req: GenerationRequest, stop_after: int | None = None
                    ) -> tuple[list[int], list[float], str | None]:
        """Run an engine request as it is (bubo.receipts reruns a server's so): its generated
        token ids, their log-probabilities, and why it ended ("stop" or "length"; None when
        stop_after tokens came first and it was stopped there). Refusals raise as generate()'s."""
        self._generative()
        if not req.prompt:
            raise InvalidRequestError("the prompt is empty")
        self.runtime.check_ids(req.prompt)
        if len(req.prompt) >= self.n_ctx:
            raise InvalidRequestError(f"the prompt is {len(req.prompt)} tokens but the context holds {self.n_ctx}")
        run = self._start(req)
        tokens: list[int] = []
        logprobs: list[float] = []
        while (ev := self._next_event(run)) is not None:
            if isinstance(ev, TokenEvent):
                tokens.append(ev.token)
                logprobs.append(ev.logprob)
                if stop_after is not None and len(tokens) >= stop_after:
                    run.closed = run.ended = True
                    return tokens, logprobs, None
            elif isinstance(ev, FinishEvent):
                return tokens, logprobs, ev.reason
            else:
                raise refusal_of(ev)
        return tokens, logprobs, None

    def _start(self, req: GenerationRequest) -> _Run:
        """req's run; it takes the slot when it is first read."""
        run = _Run(req)
        run.task = self._sched.new_task(run)  # its sampler and grammar state: errors show here
        self._runs.add(run)
        return run

    def _begin(self, run: _Run) -> None:
        """Give run the slot: a generation still being read is superseded (its stream raises at
        its next read; the slot keeps what its sequence holds for the new one to reuse)."""
        old = self._current
        if old is not None and old is not run and not old.ended:
            old.superseded = True
        run.started = True
        assert run.task is not None
        self._sched.add(run.task)  # never refused: the library's scheduler is never closed
        self._current = run

    def _next_event(self, run: _Run) -> Event | None:
        """run's next event, stepping the scheduler until there is one; None once it ended."""
        while True:
            if run.model_closed:
                raise RuntimeError(f"this Model ({self.name}) was closed: its unfinished generations ended with it")
            if run.superseded:
                raise RuntimeError(
                    "another generation started on this Model while this one was being read; "
                    "finish or close one generator before starting the next")
            if run.ended:
                return None
            sched = self._sched
            if not run.started:
                self._begin(run)
            if run.events:
                ev = run.events.popleft()
                if not isinstance(ev, TokenEvent):
                    run.ended = True
                return ev
            try:
                worked = sched.step()
            except BaseException:
                # what the cache holds is unknown now: start the next prompt from scratch
                sched.reset()
                run.ended = True
                raise
            if not worked and not run.events:
                raise RuntimeError("the generation stalled: the scheduler had no work for it")  # a bug


def _sampling_params(sampling: SamplingParams | None, options: Mapping[str, Any]) -> SamplingParams:
    """A call's sampling: its SamplingParams (or the defaults) with the keyword options given
    over it (None: left as is); TypeError for an unknown keyword, ValueError for a bad value."""
    from bubo import sampling as sp  # (looked up at the call: tests put a fake SamplingParams in its place)

    if sampling is not None and not isinstance(sampling, sp.SamplingParams):
        raise TypeError(f"sampling must be a bubo.sampling.SamplingParams, not {type(sampling).__name__}")
    return sp.from_options(options, sampling)


def _stop_list(stop: str | Iterable[str]) -> list[str]:
    """Stop strings: one, or an iterable of them (empty ones ignored, as the server does)."""
    if isinstance(stop, str):
        return [stop] if stop else []
    if stop is None or not isinstance(stop, Iterable):
        raise TypeError(f"stop must be a string or a list of strings, not {type(stop).__name__}")
    out = list(stop)
    for s in out:
        if not isinstance(s, str):
            raise TypeError(f"stop must be a string or a list of strings; it holds {s!r}")
    limits.check_stop(out)
    return [s for s in out if s]


def _json_list(value: Any) -> Any:
    """A sequence of mappings as the list of dicts the server's validators read (what is not one
    is left for them to refuse, naming the field)."""
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Sequence):
        return value
    return [dict(v) if isinstance(v, Mapping) and not isinstance(v, dict) else v for v in value]
