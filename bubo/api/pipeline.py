"""The request pipeline every generating route runs:

    body -> dialect parse (pure: JSON -> a typed request, bubo.api.fields' validators)
         -> prepare (render the chat template, build the grammar and output parser, tokenize)
         -> submit (the engine; its refusals become the dialect's errors, bubo.api.errors)
         -> dialect shape (events -> parts -> JSON / SSE chunks)

Chat-shaped routes (chat completions, Responses, Anthropic messages) parse into a Conversation;
prepare() turns it into a Prepared prompt with its grammar and parser. Raw completions tokenize
their prompt with prompt_tokens() and take their grammar from constrain(..., chat=False).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import KW_ONLY, dataclass, field, replace
from typing import Any, TypeVar

from flask import g, has_request_context, request

from bubo._grammar import Grammar
from bubo.api import callers, errors, offload, receipts
from bubo.api.fields import RequestErrors, invalid, lora_field
from bubo.chat import prepare as prep
from bubo.chat.constrain import OutputSpec
from bubo.chat.parsers import OutputParser, Part, ToolCall
from bubo.chat.prepare import Prepared as Prepared
from bubo.chat.prepare import Prompt as Prompt
from bubo.engine.generation import LENGTH
from bubo.engine.protocol import ServingEngine, Stream
from bubo.engine.types import EngineRefusal, Event, FinishEvent, GenerationRequest, Reason, TokenEvent
from bubo.runtime import Runtime
from bubo.sampling import SamplingParams

T = TypeVar("T")


@dataclass
class Conversation:
    """What every chat-shaped route (chat completions, Responses, Anthropic messages) validates its
    body into before rendering, which needs the model; each dialect's request adds its own fields."""

    messages: list[dict[str, Any]]  # for the template, tool-call arguments as objects
    prefill: str | None  # a final assistant message: the answer continues it
    tools: list[dict[str, Any]] | None
    thinking: bool
    template_kwargs: dict[str, Any]
    params: SamplingParams
    max_tokens: int | None
    stream: bool
    _: KW_ONLY
    tool_choice: str | None = None  # REQUIRED or a function name: the answer must be a call
    parallel_tool_calls: bool = False  # one call at most: the answer ends after it
    output: OutputSpec | None = None  # the answer's own constraint (grammar, response_format, text.format)
    reasoning_format: str | None = None  # the request's (llama-server's field); None: the server's


# --- prepare (bubo.chat.prepare, shared with the library; its errors become 400s here) -------


def render_chat(runtime: Runtime, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                template_kwargs: Mapping[str, Any], prefill: str | None, specials_in_content: bool = False) -> Prompt:
    """The prompt: the template's rendering, then the prefill (bubo.chat.prepare.render_chat).
    Control-token text that came from the request is tokenized as text, unless
    specials_in_content (the server's --allow-special-in-content)."""
    return offloaded(prep.render_chat, runtime, messages, tools, template_kwargs, prefill, specials_in_content,
                     what="rendering the chat template")


def prepare(runtime: Runtime, conv: Conversation, specials_in_content: bool = False) -> Prepared:
    """Render, constrain, tokenize: a Conversation made ready to submit. Its reasoning goes apart
    from the content unless the request's reasoning_format, else the server's, is "none"."""
    fmt = conv.reasoning_format
    if fmt is None and has_request_context():
        from bubo.api.request import config

        fmt = config().reasoning_format
    return offloaded(prep.prepare_chat, runtime, conv.messages, prefill=conv.prefill, tools=conv.tools,
                     template_kwargs=conv.template_kwargs, output=conv.output, tool_choice=conv.tool_choice,
                     parallel_tool_calls=conv.parallel_tool_calls, thinking=conv.thinking,
                     specials_in_content=specials_in_content, split_reasoning=fmt != "none",
                     what="rendering the chat template")


def completion_grammar(spec: OutputSpec | None, runtime: Runtime | None = None) -> Grammar | None:
    """A raw completion's grammar (compiled once), or None."""
    if spec is None:
        return None
    return offloaded(prep.completion_grammar, spec, runtime, what="compiling the grammar")


def encode(runtime: Runtime, text: str, add_special: bool = True,
           spans: list[tuple[int, int]] | None = None) -> list[int]:
    """Tokenize request text (special-token text parsed, as llama-server does, but for the
    spans, which stay plain text); a lone UTF-16 surrogate is a 400, not a crash."""
    return offloaded(prep.encode, runtime, text, add_special, spans, what="tokenizing the prompt",
                     small=offload.small(text))


def _guarded(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """fn with its RequestErrors and template failures as 400s (_PrepareErrors)."""
    with _PrepareErrors():
        return fn(*args, **kwargs)


def offloaded(fn: Callable[..., T], *args: Any, what: str, small: bool = False, **kwargs: Any) -> T:
    """fn in the preparation pool (bubo.api.offload), its RequestErrors and template failures as
    400s: a route's own step whose cost grows with the request (inline where small)."""
    value: T = offload.run(_guarded, fn, *args, what=what, small=small, **kwargs)
    return value


class _PrepareErrors(RequestErrors):
    """`with _PrepareErrors():` RequestErrors as 400s with their codes (bubo.api.fields), and a
    template that fails (or a model without one) as 400 invalid_value."""

    def __exit__(self, kind: object, e: BaseException | None, tb: object) -> None:
        from bubo.chat import ChatTemplateError, NoChatTemplateError

        if isinstance(e, NoChatTemplateError) and e.encoder:
            raise invalid(str(e) + errors.EMBEDDING_ROUTES) from None
        if isinstance(e, ChatTemplateError):
            raise invalid(str(e)) from None
        super().__exit__(kind, e, tb)


def prompt_tokens(runtime: Runtime, prompt: str | list[int], name: str = "prompt") -> list[int]:
    """A raw prompt's tokens: text is tokenized as llama-server does (BOS added, special-token
    text parsed), token ids are used as they are (the engine checks them against the vocabulary:
    one check, for the library and the server alike)."""
    ids = encode(runtime, prompt) if isinstance(prompt, str) else list(prompt)
    if not ids:
        raise invalid(f"{name} is empty: give some text or token ids")
    return ids


# --- submit --------------------------------------------------------------------------------


def submit(engine: ServingEngine, req: GenerationRequest, mem_available: int | None = None) -> Stream:
    """engine.submit, its refusals as the API's errors (bubo.api.errors.from_reason). In a
    request: the generation is its caller's (bubo.api.callers: 429 past --caller-max-slots), the
    stream counts its tokens into the request's log line (bubo.api.logs), and a request that asked
    for a receipt has it recorded (bubo.api.receipts: a seed of its own when it had none)."""
    if not has_request_context():
        return _submit(engine, req, mem_available)
    who = callers.caller()
    if who is not None:
        req = replace(req, caller=who)
    rt = engine.runtime
    asked = lora_asked(rt) if rt is not None else ()
    if asked:
        req = replace(req, lora=asked)
    rec = receipts.recorder()
    if rec is not None:
        req = rec.submitted(engine, req)
    # a prefill yields to every request (it is ended when one comes): it holds no slot of its caller's
    hold = callers.take() if not req.prefill else None
    return _held(engine, req, mem_available, hold, request.environ.setdefault("bubo.log", {}), rec)


def submit_unnamed(engine: ServingEngine, req: GenerationRequest, counts: callers.Callers,
                   record: dict[str, Any]) -> Stream:
    """submit() for a request answered outside a Flask request (a light answer, bubo.api.light)
    from the unnamed caller, with no receipt and no adapter asked: the generation is the unnamed
    caller's (429 past --caller-max-slots), and its stream counts its tokens into record."""
    return _held(engine, req, None, counts.take(None), record, None)


def _held(engine: ServingEngine, req: GenerationRequest, mem_available: int | None, hold: callers.Hold | None,
          record: dict[str, Any], rec: receipts.Recorder | None) -> Stream:
    """_submit with the caller's hold given back if it is refused; the stream counts its tokens
    into record (and rec's receipt)."""
    try:
        stream = _submit(engine, req, mem_available)
    except BaseException:
        if hold is not None:
            hold.release()
        raise
    record["prompt_tokens"] = record.get("prompt_tokens", 0) + len(req.prompt)
    record.setdefault("generated_tokens", 0)
    return _Watched(stream, record, hold, rec)


def lora_asked(rt: Runtime) -> tuple[tuple[int, float], ...]:
    """The adapters in force for this request's generation (bubo.api.lora): its body's `lora`
    field, else the global scales; a 400 for a field that names no adapter of the model."""
    bodies = g.get("bubo_bodies") or []
    raw = bodies[0].get("lora") if bodies else None
    named = g.get("bubo_adapter")  # the request named a base+adapter model
    if raw is None and named is not None:
        raw = [{"id": a.id, "scale": 1.0} for a in rt.adapters if a.name == named][:1]
    return rt.lora_in_force(None if raw is None else lora_field(raw, len(rt.adapters)))


def _submit(engine: ServingEngine, req: GenerationRequest, mem_available: int | None) -> Stream:
    try:
        # bounded by the prompt and the request's lists (the stop strings' trie), unless it starts
        # a grammar's matcher or DRY's matching of every token's text
        small = req.grammar is None and not req.params.matches_token_text and offload.small_n(
            len(req.prompt) + len(req.params.logit_bias or {}) + len(req.probs_of) + sum(len(s) for s in req.stop))
        checked = offload.run(engine.check, req, mem_available=mem_available,
                              what="building the request's sampler and grammar state", small=small)
        return engine.submit(req, mem_available=mem_available, checked=checked)
    except EngineRefusal as e:
        raise errors.from_refusal(e) from None


class _Watched:
    """A request's stream as its route reads it: each token counted into the request's log record
    and, when it asked for a receipt, recorded (receipts.Recorder); the caller's hold
    (--caller-max-slots) given back once the stream has ended."""

    def __init__(self, stream: Stream, record: dict[str, Any], hold: callers.Hold | None,
                 rec: receipts.Recorder | None):
        self._stream = stream
        self._record = record
        self._hold = hold
        self._rec = rec

    def __iter__(self) -> Iterator[Event]:
        return self

    def __next__(self) -> Event:
        try:
            ev = next(self._stream)
        except BaseException:
            self._ended()
            raise
        if isinstance(ev, TokenEvent):
            self._record["generated_tokens"] += 1
        else:  # its final event, or its error
            self._ended()
        if self._rec is not None:
            self._rec.saw(ev)
        return ev

    def _ended(self) -> None:
        """Its share of the request's hold given back, once."""
        if self._hold is not None:
            hold, self._hold = self._hold, None
            hold.release()

    def cancel(self) -> None:
        self._ended()
        self._stream.cancel()

    def end(self) -> None:
        if self._rec is not None:
            self._rec.ended_early = True
        self._stream.end()

    @property
    def cancelled(self) -> bool:
        return self._stream.cancelled


def start_chat(engine: ServingEngine, conv: Conversation, *, stop: list[str] | None = None, n_probs: int = 0,
               cache_prompt: bool = True, mem_available: int | None = None,
               specials_in_content: bool = False, draft_max: int | None = None,
               context: tuple[dict[str, Any], Callable[[GenerationRequest], Stream]] | None = None
               ) -> tuple[Runtime, Prepared, Stream]:
    """prepare + submit for a chat-shaped route: (the runtime, the prepared prompt, its stream).
    context: the request's context fields and how to submit it (bubo.api.contexts.for_chat)."""
    rt = engine.runtime
    if rt is None:
        raise errors.from_reason(Reason.NOT_READY, f"the model {engine.model_name} is not loaded")
    prep = prepare(rt, conv, specials_in_content)
    req = GenerationRequest(prep.prompt.tokens, conv.params, conv.max_tokens, list(stop or []), n_probs, cache_prompt,
                            grammar=prep.grammar, draft_max=draft_max, **(context[0] if context else {}))
    return rt, prep, (context[1](req) if context else submit(engine, req, mem_available))


# --- events -> parts -------------------------------------------------------------------------


@dataclass
class Output:
    """A whole answer, collected from its events through the parser."""

    reasoning: str = ""
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    tokens: list[TokenEvent] = field(default_factory=list)
    finish: FinishEvent | None = None

    @property
    def finished(self) -> FinishEvent:
        assert self.finish is not None, "collect() raises rather than return an unfinished answer"
        return self.finish


def run_events(events: Iterable[Event], parser: OutputParser | None,
               end: Callable[[], None] | None = None) -> Iterator[tuple[list[Part], Event]]:
    """(parts, event) per event: the parsed parts its text released (the FinishEvent carries the
    parser's rest; a cut answer's unfinished call is dropped). An ErrorEvent raises its ApiError;
    a stream that ends without a final event (cancelled) raises too. end: the stream's end(),
    called once the parser has every call the answer may make (parallel_tool_calls false)."""
    for ev in events:
        if isinstance(ev, TokenEvent):
            parts = parser.feed(ev.text) if parser else ([Part("content", ev.text)] if ev.text else [])
            if end is not None and parser is not None and parser.done:
                end()
                end = None
            yield parts, ev
        elif isinstance(ev, FinishEvent):
            yield (parser.finish(cut=ev.reason == LENGTH) if parser else []), ev
            return
        else:
            raise errors.from_event(ev)
    raise errors.from_reason(Reason.CANCELLED, "the generation was cancelled before it finished")


def collect(stream: Stream, parser: OutputParser | None, sock: Any = None) -> Output:
    """A non-streamed answer: the engine stream's events, gathered. A client that goes away
    meanwhile cancels the stream (its slot is freed at the engine's next step); run_events then
    raises for an answer nobody will read. sock: the client's, outside a Flask request."""
    from bubo.api.sse import cancel_on_disconnect

    out = Output()
    try:
        with cancel_on_disconnect(stream, sock) as events:
            gather(out, run_events(events, parser, stream.end))
    finally:
        stream.cancel()  # nothing once the stream ended; else (an error here) its slot is freed
    return out


def steered(fin: FinishEvent) -> dict[str, bool]:
    """bubo's own response field, present when the grammar steered a constrained answer to a
    short ending so that it ends within max_tokens (bubo.engine.fit): the answer is complete
    and parses, and is shorter than the model would have made it."""
    return {"steered_to_fit": True} if fin.steered else {}


def gather(out: Output, items: Iterable[tuple[list[Part], Event]]) -> None:
    for parts, ev in items:
        for p in parts:
            if p.kind == "reasoning":
                out.reasoning += p.text
            elif p.kind == "content":
                out.content += p.text
            elif p.call is not None:
                out.tool_calls.append(p.call)
        if isinstance(ev, TokenEvent):
            out.tokens.append(ev)
        elif isinstance(ev, FinishEvent):
            out.finish = ev
