"""What the generating dialects share: request fields -> GenerationRequest parts, chat messages
-> the template's input, and the event stream -> parsed output.

Pure functions on JSON bodies (dicts), each raising ApiError with the reference's code; the
blueprints in openai/, anthropic/ and llamacpp/ are thin wrappers around them."""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

from bubo.api.errors import ApiError
from bubo.chat.parsers import OutputParser, Part, ToolCall
from bubo.engine.types import ErrorEvent, FinishEvent, TokenEvent
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
    parallel_tool_calls: bool = True
    grammar: Any = None  # the output constraint (grammar, response_format, text.format), a Grammar

# the code of a 400 for a field of the wrong type or out of range (the reference's table has
# no name for it; OpenAI's own API says "invalid_value")
INVALID = "invalid_value"

FLT_MAX = 3.4028234663852886e38
INT32_MAX = 2**31 - 1

REASONING_EFFORTS = ("off", "none", "minimal", "low", "medium", "high", "xhigh", "max")

# every SamplingParams field is read from the request under its own name (llama-server's names)
_SAMPLING_FIELDS = [f for f in SamplingParams.__dataclass_fields__ if f not in ("n_probs",)]


def invalid(message: str) -> ApiError:
    return ApiError(400, INVALID, message)


def new_id(prefix: str) -> str:
    return prefix + uuid.uuid4().hex[:24]


def now() -> int:
    return int(time.time())


def require_object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise invalid(f"the request body must be a JSON object, got {type(body).__name__}")
    return body


# --- sampling and limits -------------------------------------------------------------------


def _logit_bias(value: Any) -> dict[int, float]:
    """OpenAI's {"token id": bias} or llama-server's [[id, bias], ...] (bias false: a ban)."""
    out: dict[int, float] = {}
    items: Iterable[Any]
    if isinstance(value, Mapping):
        items = value.items()
    elif isinstance(value, list):
        items = value
    else:
        raise invalid("logit_bias must be an object {token id: bias} or a list of [token id, bias]")
    for item in items:
        if not isinstance(item, (list, tuple)) or len(item) != 2:
            raise invalid(f"logit_bias entries must be [token id, bias] pairs, got {item!r}")
        tok, bias = item
        try:
            tok = int(tok)
        except (TypeError, ValueError):
            raise invalid(f"logit_bias keys must be token ids, got {tok!r}") from None
        if bias is False:
            bias = -math.inf
        if isinstance(bias, bool) or not isinstance(bias, (int, float)):
            raise invalid(f"logit_bias[{tok}] must be a number, got {bias!r}")
        out[tok] = float(bias)
    return out


def sampling_params(body: Mapping[str, Any], n_probs: int = 0) -> SamplingParams:
    """The sampling fields of a request (null or absent: llama-server's default)."""
    given: dict[str, Any] = {}
    for name in _SAMPLING_FIELDS:
        v = body.get(name)
        if v is None:
            continue
        if name == "logit_bias":
            v = _logit_bias(v)
        elif name == "seed" and isinstance(v, int) and not isinstance(v, bool) and v < -1:
            raise invalid(f"seed must be -1 (random) or a non-negative integer, got {v}")
        given[name] = v
    for name, v in given.items():
        # the native sampler holds these as C floats: a larger double would become inf there
        if isinstance(v, float) and math.isfinite(v) and abs(v) > FLT_MAX:
            raise invalid(f"{name} = {v!r} is out of range (at most {FLT_MAX:.3g} in magnitude)")
    # integers sent as floats (1.0) are accepted where an integer is meant
    for name in ("top_k", "repeat_last_n", "dry_allowed_length", "dry_penalty_last_n", "mirostat", "min_keep", "seed"):
        v = given.get(name)
        if isinstance(v, float) and v.is_integer():
            given[name] = int(v)
    try:
        return SamplingParams(n_probs=n_probs, **given)
    except (ValueError, TypeError) as e:
        raise invalid(str(e)) from None


def max_tokens_of(body: Mapping[str, Any], *names: str) -> int | None:
    """The first of names present: -1 or null keeps the default (None: until the model stops
    or the context is full); any other value must be a positive integer."""
    for name in names:
        if name not in body:
            continue
        v = body[name]
        if v is None or (v == -1 and not isinstance(v, bool)):
            return None
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int) or not 0 < v <= INT32_MAX:
            raise invalid(f"{name} must be a positive integer (at most {INT32_MAX}), or -1 or null for the default; "
                          f"got {body[name]!r}")
        return v
    return None


def stop_list(value: Any, name: str = "stop") -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value] if value else []
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        return [s for s in value if s]
    raise invalid(f"{name} must be a string or an array of strings")


def check_n(body: Mapping[str, Any]) -> None:
    n = body.get("n")
    if n is not None and (isinstance(n, bool) or n != 1):
        raise ApiError(400, "unsupported_n", f"only n = 1 is supported, got n = {n!r}")


def n_probs_of(body: Mapping[str, Any], name: str = "n_probs") -> int:
    v = body.get(name)
    if v is None:
        return 0
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise invalid(f"{name} must be a non-negative integer, got {v!r}")
    return v


def bool_field(body: Mapping[str, Any], name: str, default: bool) -> bool:
    v = body.get(name)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise invalid(f"{name} must be true or false, got {v!r}")
    return v


def grammar_of(body: Mapping[str, Any]) -> Any:
    """The one output constraint of a request, parsed (a bubo._grammar.Grammar), or None: llama-server's
    `grammar` (GBNF; a syntax error is a 400 naming line and column), its `json_schema` (a schema), or
    `response_format` (json_object or json_schema, see response_format_grammar). Two of them
    together is a 400: which one wins would be a guess."""
    from bubo._grammar import Grammar

    text = body.get("grammar")
    given = [name for name, present in (("grammar", text not in (None, "")),
                                        ("json_schema", body.get("json_schema") is not None),
                                        ("response_format", body.get("response_format") not in (None, {"type": "text"})))
             if present]
    if len(given) > 1:
        raise invalid(f"give {given[0]} or {given[1]}, not both")
    if body.get("json_schema") is not None:
        return schema_grammar(body["json_schema"], "json_schema")
    if body.get("response_format") is not None:
        return response_format_grammar(body["response_format"])
    if text is None or text == "":
        return None
    if not isinstance(text, str):
        raise invalid(f"grammar must be a string of GBNF rules, not {type(text).__name__}")
    try:
        return Grammar(text)
    except ValueError as e:
        raise ApiError(400, "invalid_grammar", f"grammar: {e}") from None


def schema_grammar(schema: Any, where: str) -> Any:
    """The grammar of a JSON Schema's instances (bubo.chat.schema); a keyword that cannot be
    enforced is a 400 `unsupported_schema` whose message names its JSON pointer."""
    from bubo._grammar import Grammar
    from bubo.chat.schema import SchemaError, schema_to_gbnf
    from bubo.errors import UnsupportedError

    if not isinstance(schema, (dict, bool)):
        raise invalid(f"{where} must be a JSON Schema (an object), not {type(schema).__name__}")
    try:
        return Grammar(schema_to_gbnf(schema))
    except SchemaError as e:
        raise ApiError(400, "unsupported_schema", f"{where}: {e}") from None
    except (ValueError, UnsupportedError) as e:  # the engine's limits: repetition counts, a $ref cycle, ...
        raise ApiError(400, "unsupported_schema", f"{where}: the grammar engine refuses it: {e}") from None


def response_format_grammar(value: Any, name: str = "response_format", flat: bool = False) -> Any:
    """None for plain text; json_object: any JSON object (or, as llama-server allows, the
    instances of its `schema`); json_schema: the instances of the schema, from
    {"json_schema": {"name", "schema", "strict"}} (chat) or {"name", "schema", "strict"} (Responses'
    text.format, flat) or, as llama-server also takes, {"schema"} beside the type. The schema is
    enforced whatever `strict` says."""
    from bubo._grammar import Grammar
    from bubo.chat.schema import JSON_OBJECT_GBNF

    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        if value.get("schema") is not None:
            return schema_grammar(value["schema"], f"{name}.schema")
        return Grammar(JSON_OBJECT_GBNF)
    if kind == "json_schema":
        spec, where = value, name
        if not flat and ("json_schema" in value or "schema" not in value):
            spec, where = value.get("json_schema"), f"{name}.json_schema"
            if not isinstance(spec, dict):
                raise invalid(f'{where} must be an object like {{"name": ..., "schema": {{...}}}}')
        if spec.get("schema") is None:
            raise invalid(f"{where}.schema is required")
        return schema_grammar(spec["schema"], f"{where}.schema")
    raise invalid(f'{name} must be {{"type": "text"}}, {{"type": "json_object"}} or {{"type": "json_schema", ...}}')


# --- thinking ------------------------------------------------------------------------------


def thinking_of(body: Mapping[str, Any]) -> tuple[bool, dict[str, Any]]:
    """(thinking on?, the chat template's extra variables) from reasoning_effort, thinking and
    chat_template_kwargs, which must agree. Thinking is on unless a field turns it off."""
    kwargs = body.get("chat_template_kwargs")
    if kwargs is None:
        kwargs = {}
    if not isinstance(kwargs, dict):
        raise invalid("chat_template_kwargs must be an object")
    said: dict[str, bool] = {}  # field -> thinking on?
    effort = body.get("reasoning_effort")
    if effort is not None:
        if effort not in REASONING_EFFORTS:
            raise invalid(f"reasoning_effort must be one of {', '.join(REASONING_EFFORTS)}; got {effort!r}")
        said["reasoning_effort"] = effort not in ("off", "none")
    thinking = body.get("thinking")
    if thinking is not None:
        kind = thinking.get("type") if isinstance(thinking, dict) else None
        if kind not in ("enabled", "disabled", "adaptive"):
            raise invalid('thinking must be {"type": "enabled"} or {"type": "disabled"}')
        said["thinking"] = kind != "disabled"
    if "enable_thinking" in kwargs:
        if not isinstance(kwargs["enable_thinking"], bool):
            raise invalid("chat_template_kwargs.enable_thinking must be true or false")
        said["chat_template_kwargs.enable_thinking"] = kwargs["enable_thinking"]
    kw_effort = kwargs.get("reasoning_effort")
    if kw_effort is not None:
        if kw_effort not in REASONING_EFFORTS:
            raise invalid(f"chat_template_kwargs.reasoning_effort must be one of {', '.join(REASONING_EFFORTS)}")
        said["chat_template_kwargs.reasoning_effort"] = kw_effort not in ("off", "none")
        if effort is not None and kw_effort != effort:
            raise ApiError(400, INVALID, f"reasoning_effort ({effort!r}) and chat_template_kwargs.reasoning_effort "
                                         f"({kw_effort!r}) disagree: send one, or the same value in both")
    if len(set(said.values())) > 1:
        on = [k for k, v in said.items() if v]
        off = [k for k, v in said.items() if not v]
        raise ApiError(400, INVALID, f"{' and '.join(on)} turn thinking on but {' and '.join(off)} turn it off: "
                                     "these fields must agree")
    enabled = next(iter(said.values()), True)
    extra = dict(kwargs)
    extra["enable_thinking"] = enabled
    if effort is not None and "reasoning_effort" not in extra:
        extra["reasoning_effort"] = effort
    return enabled, extra


# --- messages ------------------------------------------------------------------------------


def content_text(content: Any, where: str) -> str:
    """A message's content as the text the template sees: a string, an array of text parts
    (joined), or null (empty)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for i, part in enumerate(content):
            if isinstance(part, str):
                texts.append(part)
                continue
            if not isinstance(part, dict):
                raise invalid(f"{where}.content[{i}] must be an object with a type")
            kind = part.get("type")
            if kind in ("text", "input_text", "output_text"):
                if not isinstance(part.get("text"), str):
                    raise invalid(f"{where}.content[{i}].text must be a string")
                texts.append(part["text"])
            elif kind in ("image_url", "input_image", "image", "input_audio", "file", "input_file", "document"):
                raise invalid(f"{where}.content[{i}] is of type {kind!r}, but this model takes text only")
            else:
                raise invalid(f"{where}.content[{i}] has an unknown type {kind!r}")
        return "\n".join(texts) if len(texts) > 1 and all(texts) else "".join(texts)
    raise invalid(f"{where}.content must be a string, an array of parts or null")


ROLES = ("system", "developer", "user", "assistant", "tool")


def chat_messages(messages: Any) -> tuple[list[dict[str, Any]], str | None]:
    """OpenAI messages -> (the template's messages, the prefill). A final assistant message is a
    prefill: it is not rendered as a finished turn; the answer continues its text."""
    if messages is None:
        raise ApiError(400, "missing_messages", "messages is required: a non-empty array of messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "missing_messages", "messages must be a non-empty array of messages")
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise invalid(f"{where} must be an object with role and content")
        role = m.get("role")
        if role not in ROLES:
            raise invalid(f"{where}.role must be one of {', '.join(ROLES)}; got {role!r}")
        msg: dict[str, Any] = {"role": "system" if role == "developer" else role,
                               "content": content_text(m.get("content"), where)}
        if role == "assistant" and m.get("tool_calls"):
            msg["tool_calls"] = _template_tool_calls(m["tool_calls"], where)
        if role == "assistant" and isinstance(m.get("reasoning_content"), str):
            msg["reasoning_content"] = m["reasoning_content"]
        if role == "tool":
            if m.get("tool_call_id") is not None:
                msg["tool_call_id"] = str(m["tool_call_id"])
            if isinstance(m.get("name"), str):
                msg["name"] = m["name"]
        out.append(msg)
    prefill = None
    if out[-1]["role"] == "assistant" and not out[-1].get("tool_calls"):
        prefill = out.pop()["content"]
        if not out:
            raise ApiError(400, "missing_messages", "messages holds only an assistant prefill: add a user message")
    return out, prefill


def _template_tool_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    """tool_calls as templates expect them: arguments as an object (OpenAI sends JSON text)."""
    if not isinstance(calls, list):
        raise invalid(f"{where}.tool_calls must be an array")
    out = []
    for j, c in enumerate(calls):
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise invalid(f"{where}.tool_calls[{j}] must be {{\"type\": \"function\", \"function\": {{\"name\": ..., \"arguments\": ...}}}}")
        args = fn.get("arguments")
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError:
                raise invalid(f"{where}.tool_calls[{j}].function.arguments is not valid JSON") from None
        out.append({"id": c.get("id"), "type": "function", "function": {"name": fn["name"], "arguments": args}})
    return out


def chat_tools(tools: Any) -> list[dict[str, Any]] | None:
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise invalid("tools must be an array of {\"type\": \"function\", \"function\": {...}}")
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise invalid(f"tools[{i}] must be {{\"type\": \"function\", \"function\": {{\"name\": ..., \"parameters\": ...}}}}")
    return tools or None


# --- rendering (needs the engine's model and tokenizer) ------------------------------------


@dataclass
class ChatPrompt:
    text: str
    tokens: list[int]
    in_think: bool  # the prompt ends inside <think>


def render_chat(engine: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                template_kwargs: Mapping[str, Any], prefill: str | None) -> ChatPrompt:
    """The prompt: the template's rendering, then the prefill."""
    from bubo.chat import ChatTemplateError
    from bubo.chat.parsers import template_opens_think

    try:
        text = engine.model.chat_prompt(messages, tools=tools, **template_kwargs)
    except ChatTemplateError as e:
        raise invalid(str(e)) from None
    in_think = template_opens_think(text)
    if prefill:
        text += prefill
        # the prefill may open (or close) the reasoning itself
        seg = ("<think>" if in_think else "") + prefill
        in_think = seg.rfind("<think>") > seg.rfind("</think>")
    tokens = encode(engine, text)
    return ChatPrompt(text, tokens, in_think)


def encode(engine: Any, text: str, add_special: bool = True) -> list[int]:
    """Tokenize request text (special-token text parsed, as llama-server does). JSON can carry
    a lone UTF-16 surrogate ("\\ud800") that no UTF-8 text holds: a 400, not a crash."""
    try:
        return engine.tokenizer.encode(text, add_special=add_special, parse_special=True)
    except UnicodeEncodeError as e:
        raise invalid(f"the request's text holds {e.object[e.start:e.end]!r} at character {e.start} of the "
                      f"prompt, a lone UTF-16 surrogate that is not valid Unicode text") from None


REQUIRED = "required"  # tool_choice: some call, any function


def check_forced_call_alone(forced: str | None, grammar: Any) -> None:
    """A forced call (tool_choice required or named) is a grammar of the template's call format; a
    grammar or response_format constrains the same tokens to something else, so the two together
    cannot both hold: a 400 rather than a broken call."""
    if forced is not None and grammar is not None:
        raise invalid("tool_choice forces a tool call, which grammar/response_format would constrain to something "
                      "else: send one of them")


def check_tool_choice(choice: str | None, tools: list[dict[str, Any]] | None) -> str | None:
    """None (the model decides), REQUIRED, or the name of the function to call (one of tools)."""
    if choice is None:
        return None
    if not tools:
        raise invalid("tool_choice asks for a tool call, but the request has no tools")
    if choice != REQUIRED:
        names = [t["function"]["name"] for t in tools]
        if choice not in names:
            raise invalid(f"tool_choice names the function {choice!r}, which is not in tools ({', '.join(names)})")
    return choice


def tool_format(engine: Any, tools: Any) -> str | None:
    """The template's tool-call format (hermes when the template shows none: the most common)."""
    from bubo.chat.parsers import tool_format_of

    return (tool_format_of(engine.chat_template) or "hermes") if tools else None


def forced_format(engine: Any) -> str:
    """The format a forced call is written in: the template's own, or a bare JSON object for a
    template that teaches none (the parser then reads exactly that)."""
    from bubo.chat.parsers import tool_format_of

    return tool_format_of(engine.chat_template) or "json"


def forced_grammar(engine: Any, tools: Any, choice: str | None, parallel_tool_calls: bool = True,
                   in_think: bool = False, thinking: bool = False) -> Any:
    """The grammar that makes the answer a call (tool_choice REQUIRED: to any of tools; a name:
    to that function), or None when the model decides; in_think: the prompt opened <think>,
    which the answer closes first (thinking: after reasoning, else at once). A parameters schema
    the grammar cannot enforce is a 400 unsupported_schema naming the tool and the keyword's
    pointer."""
    from bubo.chat.tools import ToolSchemaError, call_grammar

    if choice is None or not tools:
        return None
    try:
        text = call_grammar(forced_format(engine), tools, None if choice == REQUIRED else choice, parallel_tool_calls)
    except ToolSchemaError as e:
        raise ApiError(400, "unsupported_schema", str(e)) from None
    return answer_constraint(engine, None, text, thinking, in_think)


def answer_constraint(engine: Any, grammar: Any, forced: str | None, thinking: bool, in_think: bool) -> Any:
    """The grammar of the whole chat answer: the request's own (a compiled Grammar) or a forced
    call's (GBNF), with the reasoning's place around it (bubo.chat.thinking: thinking off closes
    a think block at once, on puts it before the constrained part); None: no constraint."""
    from bubo._grammar import Grammar
    from bubo.chat.thinking import answer_grammar, template_thinks
    from bubo.errors import UnsupportedError

    body, root = (grammar.text, grammar.root) if grammar is not None else (forced, "root")
    text = answer_grammar(body, root, thinking=thinking, in_think=in_think,
                          thinks=template_thinks(engine.chat_template))
    if text is None:
        if grammar is not None or forced is None:
            return grammar
        text = forced
    try:
        return Grammar(text)
    except (ValueError, UnsupportedError) as e:  # the engine's limits: repetition counts, a $ref cycle, ...
        code, what = ("unsupported_schema", "tools: the grammar engine refuses a parameters schema") if grammar is None \
            else ("invalid_grammar", "grammar: the grammar engine refuses the answer's grammar")
        raise ApiError(400, code, f"{what}: {e}") from None


def constrain(engine: Any, req: Conversation, in_think: bool) -> tuple[Any, OutputParser]:
    """(grammar, parser) of a chat-shaped answer: the request's own constraint, else the forced
    call's grammar, with the reasoning's place around it; the parser reads what that grammar
    lets the model write."""
    forced = forced_grammar(engine, req.tools, req.tool_choice, req.parallel_tool_calls, in_think, req.thinking)
    grammar = forced if forced is not None else answer_constraint(engine, req.grammar, None, req.thinking, in_think)
    parser = output_parser(engine, req.thinking, req.tools, in_think, req.parallel_tool_calls, forced is not None)
    return grammar, parser


def openai_tool_choice(choice: Any, tools: list[dict[str, Any]] | None, named: str | None,
                       shape: str) -> tuple[list[dict[str, Any]] | None, str | None]:
    """OpenAI's tool_choice ("none", "auto", "required" or a named function; named: the name the
    dialect's object form gave, or None): (the tools to render, None / REQUIRED / the name). "none"
    hides the tools. shape: the dialect's object form, for the error."""
    if choice == "none":
        return None, None
    if choice is None or choice == "auto":
        return tools, None
    if choice == "required":
        return tools, check_tool_choice(REQUIRED, tools)
    if isinstance(named, str):
        return tools, check_tool_choice(named, tools)
    raise invalid(f'tool_choice must be "none", "auto", "required" or {shape}')


def output_parser(engine: Any, thinking: bool, tools: Any, in_think: bool, parallel_tool_calls: bool = True,
                  forced: bool = False) -> OutputParser:
    """The parser of a chat answer: <think> when thinking is on, when the prompt opened one, or
    when the template thinks (thinking off: the grammar lets only an empty block through, which
    yields nothing); with tools, the template's tool-call format, or forced_format when a
    grammar makes the answer calls."""
    from bubo.chat.thinking import template_thinks

    return OutputParser(reasoning=thinking or in_think or template_thinks(engine.chat_template),
                        tool_format=forced_format(engine) if forced and tools else tool_format(engine, tools),
                        in_think=in_think, max_calls=None if parallel_tool_calls else 1)


# --- output --------------------------------------------------------------------------------


@dataclass
class Output:
    """A whole answer, collected from its events through the parser."""

    reasoning: str = ""
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    tokens: list[TokenEvent] = field(default_factory=list)
    finish: FinishEvent | None = None


def run_events(events: Iterable[Any], parser: OutputParser | None) -> Iterator[tuple[list[Part], Any]]:
    """(parts, event) per event: the parsed parts its text released (the FinishEvent carries the
    parser's rest). An ErrorEvent raises ApiError."""
    for ev in events:
        if isinstance(ev, ErrorEvent):
            raise ApiError(ev.status, ev.code, ev.message)
        if isinstance(ev, TokenEvent):
            parts = parser.feed(ev.text) if parser else ([Part("content", ev.text)] if ev.text else [])
            yield parts, ev
        elif isinstance(ev, FinishEvent):
            yield (parser.finish() if parser else []), ev
            return
    raise ApiError(503, "cancelled", "the generation was cancelled before it finished")


def collect(stream: Any, parser: OutputParser | None) -> Output:
    """A non-streamed answer: the engine stream's events, gathered. A client that goes away
    meanwhile cancels the stream (its slot is freed at the engine's next step); run_events then
    raises for an answer nobody will read."""
    from bubo.api.sse import cancel_on_disconnect

    out = Output()
    with cancel_on_disconnect(stream) as events:
        _gather(out, run_events(events, parser))
    return out


def _gather(out: Output, items: Iterable[Any]) -> None:
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
        else:
            out.finish = ev


def usage_numbers(fin: FinishEvent) -> dict[str, Any]:
    t = fin.timings
    return {
        "prompt_tokens_per_second": t.get("prompt_per_second", 0.0),
        "completion_tokens_per_second": t.get("predicted_per_second", 0.0),
    }


def token_piece(engine: Any, token: int) -> bytes:
    return engine.tokenizer.token_to_piece(int(token), True)


# --- submitting ----------------------------------------------------------------------------


def prompt_tokens(engine: Any, prompt: str | list[int], name: str = "prompt") -> list[int]:
    """A raw prompt's tokens: text is tokenized as llama-server does (BOS added, special-token
    text parsed), token ids are checked against the vocabulary and used as they are."""
    if isinstance(prompt, str):
        ids = encode(engine, prompt)
    else:
        n = engine.tokenizer.n_vocab
        for i, t in enumerate(prompt):
            if not 0 <= t < n:
                raise invalid(f"{name}[{i}] = {t} is not a token id of this model (0..{n - 1})")
        ids = list(prompt)
    if not ids:
        raise invalid(f"{name} is empty: give some text or token ids")
    return ids


def submit(engine: Any, req: Any) -> Any:
    """engine.submit, its refusals as the reference's errors."""
    from bubo.engine.types import ContextLengthError, NotReadyError

    n_vocab = engine.tokenizer.n_vocab
    for tok in req.params.logit_bias:
        if tok >= n_vocab:
            raise invalid(f"logit_bias names token {tok}, but this model's ids are 0..{n_vocab - 1}")
    try:
        return engine.submit(req)
    except ContextLengthError as e:
        raise ApiError(400, "context_length_exceeded", str(e)) from None
    except NotReadyError as e:
        raise ApiError(503, "not_ready", str(e)) from None


def stream_error(err: ApiError) -> dict[str, Any]:
    """An error after a stream's 200 went out: reported in-band, in the OpenAI shape."""
    return {"error": {"message": err.message, "type": "server_error" if err.status >= 500 else "invalid_request_error",
                      "code": err.code}}
