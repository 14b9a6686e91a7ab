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
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

from bubo._grammar import Grammar
from bubo.api import errors
from bubo.api.fields import constraint_error, invalid
from bubo.chat.constrain import ConstraintError, OutputSpec, check_first_tokens, constrain, in_think_after
from bubo.chat.parsers import OutputParser, Part, ToolCall
from bubo.engine.generation import LENGTH
from bubo.engine.protocol import ServingEngine, Stream
from bubo.engine.types import EngineRefusal, Event, FinishEvent, GenerationRequest, Reason, TokenEvent
from bubo.runtime import Runtime
from bubo.sampling import SamplingParams


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


@dataclass
class Prompt:
    text: str
    tokens: list[int]
    in_think: bool  # the prompt ends inside <think>
    spans: list[tuple[int, int]] = field(default_factory=list)  # control-token text from the request: plain


@dataclass
class Prepared:
    """A chat request ready to submit: its prompt, the grammar of its answer and the parser
    that reads the answer back into reasoning, content and tool calls."""

    prompt: Prompt
    grammar: Grammar | None
    parser: OutputParser | None


# --- prepare -----------------------------------------------------------------------------


def render_chat(runtime: Runtime, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                template_kwargs: Mapping[str, Any], prefill: str | None, specials_in_content: bool = False) -> Prompt:
    """The prompt: the template's rendering, then the prefill. Control-token text that came
    from the request (messages, tools, the prefill) is tokenized as text (Runtime.chat_text),
    unless specials_in_content (the server's --allow-special-in-content)."""
    from bubo.chat import ChatTemplateError

    try:
        rendered = runtime.chat_text(messages, tools=tools, specials_in_content=specials_in_content,
                                     **template_kwargs)
    except ChatTemplateError as e:
        raise invalid(str(e)) from None
    text, spans = rendered.text, list(rendered.spans)
    in_think = in_think_after(text)
    if prefill:
        if not specials_in_content:
            spans += [(len(text) + a, len(text) + b) for a, b in runtime.control_spans(prefill)]
        text += prefill
        # the prefill may open (or close) the reasoning itself
        seg = ("<think>" if in_think else "") + prefill
        in_think = seg.rfind("<think>") > seg.rfind("</think>")
    return Prompt(text, encode(runtime, text, spans=spans), in_think, spans)


def prepare(runtime: Runtime, conv: Conversation, specials_in_content: bool = False) -> Prepared:
    """Render, constrain, tokenize: a Conversation made ready to submit."""
    prompt = render_chat(runtime, conv.messages, conv.tools, conv.template_kwargs, conv.prefill,
                         specials_in_content)
    try:
        c = constrain(runtime.chat_template_source, spec=conv.output, tools=conv.tools, choice=conv.tool_choice,
                      parallel=conv.parallel_tool_calls, thinking=conv.thinking, in_think=prompt.in_think)
        if c.grammar is not None:
            check_first_tokens(c.grammar, runtime.grammar_vocab(), conv.output if conv.tool_choice is None else None)
    except ConstraintError as e:
        raise constraint_error(e) from None
    return Prepared(prompt, c.grammar, c.parser)


def completion_grammar(spec: OutputSpec | None, runtime: Runtime | None = None) -> Grammar | None:
    """A raw completion's grammar (compiled once), or None."""
    if spec is None:
        return None
    try:
        grammar = constrain(None, spec=spec, chat=False).grammar
        if grammar is not None and runtime is not None:
            check_first_tokens(grammar, runtime.grammar_vocab(), spec)
        return grammar
    except ConstraintError as e:
        raise constraint_error(e) from None


def encode(runtime: Runtime, text: str, add_special: bool = True,
           spans: list[tuple[int, int]] | None = None) -> list[int]:
    """Tokenize request text (special-token text parsed, as llama-server does, but for the
    spans, which stay plain text). JSON can carry a lone UTF-16 surrogate ("\\ud800") that no
    UTF-8 text holds: a 400, not a crash."""
    try:
        return runtime.tokenizer.encode(text, add_special=add_special, parse_special=True,
                                        text_spans=spans or None)
    except UnicodeEncodeError as e:
        raise invalid(f"the request's text holds {e.object[e.start:e.end]!r} at character {e.start} of the "
                      f"prompt, a lone UTF-16 surrogate that is not valid Unicode text") from None


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
    """engine.submit, its refusals as the API's errors (bubo.api.errors.from_reason)."""
    try:
        return engine.submit(req, mem_available=mem_available)
    except EngineRefusal as e:
        raise errors.from_refusal(e) from None


def start_chat(engine: ServingEngine, conv: Conversation, *, stop: list[str] | None = None, n_probs: int = 0,
               cache_prompt: bool = True, mem_available: int | None = None,
               specials_in_content: bool = False) -> tuple[Runtime, Prepared, Stream]:
    """prepare + submit for a chat-shaped route: (the runtime, the prepared prompt, its stream)."""
    rt = engine.runtime
    if rt is None:
        raise errors.from_reason(Reason.NOT_READY, f"the model {engine.model_name} is not loaded")
    prep = prepare(rt, conv, specials_in_content)
    req = GenerationRequest(prep.prompt.tokens, conv.params, conv.max_tokens, list(stop or []), n_probs, cache_prompt,
                            grammar=prep.grammar)
    return rt, prep, submit(engine, req, mem_available)


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


def collect(stream: Stream, parser: OutputParser | None) -> Output:
    """A non-streamed answer: the engine stream's events, gathered. A client that goes away
    meanwhile cancels the stream (its slot is freed at the engine's next step); run_events then
    raises for an answer nobody will read."""
    from bubo.api.sse import cancel_on_disconnect

    out = Output()
    try:
        with cancel_on_disconnect(stream) as events:
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
