"""What an answer may be: one grammar and the parser that reads it back, built once per request.

    spec = schema_spec({"type": "object", ...}, "response_format.json_schema.schema")
    c = constrain(template_source, spec=spec, thinking=True, in_think=False)
    engine.submit(GenerationRequest(tokens, grammar=c.grammar)); ... c.parser.feed(piece) ...

The pieces live beside this module: JSON Schema -> GBNF (schema.py), the grammar of forced tool
calls in the template's own call format (tools.py), the reasoning's place around a constrained
answer (thinking.py), and the parser of reasoning, content and calls (parsers.py). constrain()
composes them into GBNF text and compiles it once; a request's own grammar is validated and
converted when the request is read (the *_spec functions), never compiled twice.

Errors are ConstraintError with a stable code: "unsupported_schema" (a keyword whose constraint a
grammar cannot enforce, or a schema the grammar engine refuses), "invalid_grammar" (GBNF that does
not parse), "invalid_value" (a malformed field).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bubo._grammar import Grammar, Matcher, Vocab
from bubo.chat.parsers import OutputParser, ToolBook, template_opens_think, tool_format_of
from bubo.chat.schema import JSON_OBJECT_GBNF, SchemaError, schema_to_gbnf
from bubo.chat.thinking import answer_grammar, template_thinks
from bubo.chat.tools import ToolSchemaError, call_grammar
from bubo.errors import RequestError, UnsupportedError

__all__ = ["Constrained", "ConstraintError", "OutputSpec", "REQUIRED", "constrain", "gbnf_spec", "in_think_after",
           "json_object_spec", "schema_spec"]

REQUIRED = "required"  # tool_choice: some call, any function

UNSUPPORTED = "unsupported_schema"
INVALID_GRAMMAR = "invalid_grammar"


class ConstraintError(RequestError):
    """A request's output constraint cannot be built; code is the API's error code."""


@dataclass(frozen=True)
class OutputSpec:
    """A request's own output constraint, as GBNF text not yet compiled. where: the field it came
    from (for messages); schema: it came from a JSON Schema (its refusals are unsupported_schema)."""

    gbnf: str
    where: str
    schema: bool = False
    root: str = "root"


@dataclass
class Constrained:
    """The grammar of the whole answer (None: free text) and the parser of chat answers (None for
    raw completions: their text is content as it is)."""

    grammar: Grammar | None
    parser: OutputParser | None


def gbnf_spec(text: str, where: str = "grammar") -> OutputSpec:
    return OutputSpec(text, where)


def schema_spec(schema: Any, where: str) -> OutputSpec:
    """The grammar of a JSON Schema's instances (bubo.chat.schema); a keyword that cannot be
    enforced is an unsupported_schema error whose message names its JSON pointer."""
    if not isinstance(schema, (dict, bool)):
        raise ConstraintError("invalid_value",
                              f"{where} must be a JSON Schema (an object), not {type(schema).__name__}")
    try:
        return OutputSpec(schema_to_gbnf(schema), where, schema=True)
    except SchemaError as e:
        raise ConstraintError(UNSUPPORTED, f"{where}: {e}") from None


def json_object_spec(where: str) -> OutputSpec:
    """Any JSON object."""
    return OutputSpec(JSON_OBJECT_GBNF, where, schema=True)


def in_think_after(prompt: str) -> bool:
    """True when the rendered prompt ends inside an open <think>."""
    return template_opens_think(prompt)


def constrain(template_source: str | None, *, spec: OutputSpec | None = None,
              tools: list[dict[str, Any]] | None = None, choice: str | None = None, parallel: bool = True,
              thinking: bool = False, in_think: bool = False, chat: bool = True,
              split_reasoning: bool = True) -> Constrained:
    """The grammar and parser of an answer.

    spec: the request's own constraint; tools and choice (None: the model decides, REQUIRED: a
    call to any of tools, a name: a call to that function) with parallel (False: one call at
    most, the answer ends after it); thinking: reasoning is on; in_think: the prompt ends inside
    <think>; chat False: a raw completion (the grammar as given, no parser); split_reasoning False:
    the parser leaves the reasoning in the content, tags and all. A forced call and
    a spec together cannot both hold: the caller refuses that before."""
    if not chat:
        return Constrained(_compile(spec.gbnf, spec) if spec is not None else None, None)
    thinks = template_thinks(template_source)
    forced = choice is not None and bool(tools)
    template_format = tool_format_of(template_source)
    body: str | None = None
    if forced:
        assert tools is not None and choice is not None
        try:
            body = call_grammar(template_format or "json", tools, None if choice == REQUIRED else choice, parallel)
        except ToolSchemaError as e:
            raise ConstraintError(UNSUPPORTED, str(e)) from None
    elif spec is not None:
        body = spec.gbnf
    root = spec.root if spec is not None and not forced else "root"
    text = answer_grammar(body, root, thinking=thinking, in_think=in_think, thinks=thinks)
    if text is None:
        text = body
    grammar = None
    if text is not None:
        grammar = _compile(text, None if forced else spec, wrapped=text is not body)
    if forced:
        tool_format: str | None = template_format or "json"
    elif tools:
        tool_format = template_format or "hermes"  # the most common format, when the template shows none
    else:
        tool_format = None
    # the model chooses: a bare JSON answer that is a valid call to one of the tools is a call
    # too (small models drop the template's markers); a template whose whole answer is the call
    # (llama3) reads its own format
    book = ToolBook(tools) if tools and not forced and tool_format != "llama3" else None
    parser = OutputParser(reasoning=split_reasoning and (thinking or in_think or thinks), tool_format=tool_format,
                          in_think=in_think,
                          max_calls=None if parallel else 1, tools=book)
    return Constrained(grammar, parser)


def check_first_tokens(grammar: Grammar, vocab: Vocab, spec: OutputSpec | None) -> None:
    """The mask of the answer's first token, computed once: a grammar whose first steps already
    need more alive parses than the matcher follows (an anyOf of thousands of branches opens
    up after its first byte) is refused before the request runs, not in its stream. spec: where
    the grammar came from (None: a forced call's), which decides the error's code."""
    try:
        Matcher(grammar, vocab).mask()
    except (ValueError, UnsupportedError) as e:
        if spec is None or spec.schema:
            where = spec.where if spec is not None else "tools: a parameters schema"
            raise ConstraintError(UNSUPPORTED, f"{where}: the grammar engine refuses it: {e}") from None
        raise ConstraintError(INVALID_GRAMMAR, f"{spec.where}: {e}") from None


def _compile(text: str, spec: OutputSpec | None, wrapped: bool = False) -> Grammar:
    """Compile GBNF once, and start a matcher on it: a grammar whose first step already has more
    alive parses than the matcher follows is refused here, not when the request runs. spec None:
    a forced call's grammar (its refusals are the tools' schemas'). wrapped: the spec's GBNF sits
    inside the reasoning's grammar; if that fails, the spec alone is compiled to name the line and
    column in the request's own text."""
    try:
        grammar = Grammar(text)
        Matcher(grammar)
        return grammar
    except (ValueError, UnsupportedError) as e:
        err = e
    if spec is None:
        raise ConstraintError(UNSUPPORTED, f"tools: the grammar engine refuses a parameters schema: {err}")
    if wrapped:
        try:
            Grammar(spec.gbnf, spec.root)
        except (ValueError, UnsupportedError) as own:
            err = own
    if spec.schema:
        raise ConstraintError(UNSUPPORTED, f"{spec.where}: the grammar engine refuses it: {err}")
    raise ConstraintError(INVALID_GRAMMAR, f"{spec.where}: {err}")
