"""A chat answer made ready to generate on a runtime: the template rendered, the answer's grammar
and parser built, the prompt tokenized. The server's pipeline (bubo/api/pipeline.py, which turns
the errors into its 400s) and the library's bubo.Model (bubo/llm.py, which raises them) both run
prepare_chat, so that one request becomes the same tokens and the same grammar in both.

    messages, prefill = chat_messages(openai_messages)           # bubo.chat.request
    prep = prepare_chat(runtime, messages, prefill=prefill, tools=tools, output=spec)
    GenerationRequest(prep.prompt.tokens, params, grammar=prep.grammar); prep.parser.feed(...)

Errors: RequestError (bubo.errors; ConstraintError for a grammar that cannot be built) and
ChatTemplateError (bubo.chat; the template failed, or the model has none), both ValueErrors.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bubo import deadline
from bubo.chat.constrain import OutputSpec, check_first_tokens, constrain, in_think_after
from bubo.chat.request import INVALID
from bubo.errors import RequestError

if TYPE_CHECKING:
    from bubo._grammar import Grammar
    from bubo.chat.parsers import OutputParser
    from bubo.runtime import Runtime

__all__ = ["Prepared", "Prompt", "completion_grammar", "encode", "prepare_chat", "render_chat"]


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


def encode(runtime: Runtime, text: str, add_special: bool = True,
           spans: list[tuple[int, int]] | None = None) -> list[int]:
    """Tokenize request text (special-token text parsed, as llama-server does, but for the
    spans, which stay plain text). JSON can carry a lone UTF-16 surrogate ("\\ud800") that no
    UTF-8 text holds: a RequestError, not a crash."""
    try:
        return runtime.tokenizer.encode(text, add_special=add_special, parse_special=True,
                                        text_spans=spans or None)
    except UnicodeEncodeError as e:
        raise RequestError(INVALID, f"the request's text holds {e.object[e.start:e.end]!r} at character {e.start} "
                                    "of the prompt, a lone UTF-16 surrogate that is not valid Unicode text") from None


def render_chat(runtime: Runtime, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                template_kwargs: Mapping[str, Any], prefill: str | None, specials_in_content: bool = False) -> Prompt:
    """The prompt: the template's rendering, then the prefill. Control-token text that came
    from the request (messages, tools, the prefill) is tokenized as text (Runtime.chat_text),
    unless specials_in_content (the server's --allow-special-in-content)."""
    deadline.doing("rendering the chat template")
    rendered = runtime.chat_text(messages, tools=tools, specials_in_content=specials_in_content, **template_kwargs)
    deadline.doing("tokenizing the prompt")
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


def prepare_chat(runtime: Runtime, messages: list[dict[str, Any]], *, prefill: str | None = None,
                 tools: list[dict[str, Any]] | None = None, template_kwargs: Mapping[str, Any] | None = None,
                 output: OutputSpec | None = None, tool_choice: str | None = None,
                 parallel_tool_calls: bool = False, thinking: bool = True,
                 specials_in_content: bool = False, split_reasoning: bool = True) -> Prepared:
    """Render, constrain, tokenize. messages and prefill as bubo.chat.request.chat_messages
    makes them, tools checked (chat_tools), tool_choice None / REQUIRED / a function's name,
    output the answer's own constraint (output_spec; not beside a forced call), thinking and
    template_kwargs as thinking_of makes them. split_reasoning False: a <think> block stays in the
    content as the model wrote it (llama-server's reasoning_format none)."""
    prompt = render_chat(runtime, messages, tools, template_kwargs or {}, prefill, specials_in_content)
    deadline.doing("building the answer's grammar")
    c = constrain(runtime.chat_template_source, spec=output, tools=tools, choice=tool_choice,
                  parallel=parallel_tool_calls, thinking=thinking, in_think=prompt.in_think,
                  split_reasoning=split_reasoning)
    if c.grammar is not None:
        check_first_tokens(c.grammar, runtime.grammar_vocab(), output if tool_choice is None else None)
    return Prepared(prompt, c.grammar, c.parser)


def completion_grammar(spec: OutputSpec | None, runtime: Runtime | None = None) -> Grammar | None:
    """A raw completion's grammar (compiled once, its first step checked on runtime's
    vocabulary), or None."""
    if spec is None:
        return None
    grammar = constrain(None, spec=spec, chat=False).grammar
    if grammar is not None and runtime is not None:
        check_first_tokens(grammar, runtime.grammar_vocab(), spec)
    return grammar
