"""A chat request's fields, validated into typed values: the rules the server's dialects and the
library's bubo.Model share, so that the same request means the same thing in both.

    spec = output_spec(grammar=None, json_schema=None, response_format={"type": "json_object"})
    messages, prefill = chat_messages([{"role": "user", "content": "Hi"}])
    tools = chat_tools([...]); tools, choice = openai_tool_choice("required", tools, None, shape)

Pure functions on plain values (the server's JSON bodies, the library's keyword arguments) that
raise RequestError (a ValueError) with the server's error code and a message naming the field;
bubo/api/fields.py turns those into 400s (the API's wrappers of these functions live there).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from bubo.chat.constrain import REQUIRED, OutputSpec, gbnf_spec, json_object_spec, schema_spec
from bubo.chat.parsers import ToolCall
from bubo.errors import RequestError
from bubo.limits import MAX_MESSAGES, MAX_TOOLS, check_count

__all__ = ["INVALID", "REASONING_EFFORTS", "RESERVED_TEMPLATE_KWARGS", "ROLES", "assistant_message",
           "chat_finish_reason", "chat_messages", "chat_tools", "check_forced_call_alone", "check_one_output",
           "check_tool_choice", "check_tools", "content_text", "openai_tool_choice", "output_spec",
           "response_format_spec", "thinking_of"]

# the code of a field of the wrong type or out of range (the reference's table has no name for
# it; OpenAI's own API says "invalid_value")
INVALID = "invalid_value"

REASONING_EFFORTS = ("off", "none", "minimal", "low", "medium", "high", "xhigh", "max")
# template variables set from the request's own fields
RESERVED_TEMPLATE_KWARGS = {"messages", "tools", "add_generation_prompt", "bos_token", "eos_token",
                            "specials_in_content"}
ROLES = ("system", "developer", "user", "assistant", "tool")


def invalid(message: str) -> RequestError:
    return RequestError(INVALID, message)


# --- the answer's own constraint -------------------------------------------------------------


def check_one_output(grammar: Any, json_schema: Any, response_format: Any) -> None:
    """At most one output constraint: which of two would win is a guess. An empty grammar and
    response_format {"type": "text"} are none."""
    fields = (("grammar", grammar is not None and not (isinstance(grammar, str) and grammar == "")),
              ("json_schema", json_schema is not None),
              ("response_format", response_format is not None and response_format != {"type": "text"}))
    given = [name for name, present in fields if present]
    if len(given) > 1:
        raise invalid(f"give {given[0]} or {given[1]}, not both")


def output_spec(grammar: Any, json_schema: Any, response_format: Any) -> OutputSpec | None:
    """The one output constraint of a request, validated and converted (not compiled): a GBNF
    `grammar`, a `json_schema` (llama-server's: the schema itself), or OpenAI's `response_format`
    (see response_format_spec). A schema keyword a grammar cannot enforce is an
    "unsupported_schema" error (bubo.chat.constrain.ConstraintError) naming its JSON pointer."""
    check_one_output(grammar, json_schema, response_format)
    if json_schema is not None:
        return schema_spec(json_schema, "json_schema")
    if response_format is not None:
        return response_format_spec(response_format)
    if grammar is None or grammar == "":
        return None
    if not isinstance(grammar, str):
        raise invalid(f"grammar must be a string of GBNF rules, not {type(grammar).__name__}")
    return gbnf_spec(grammar)


def response_format_spec(value: Any, name: str = "response_format", flat: bool = False) -> OutputSpec | None:
    """None for plain text; json_object: any JSON object (or, as llama-server allows, the
    instances of its `schema`); json_schema: the instances of the schema, from
    {"json_schema": {"name", "schema", "strict"}} (chat) or {"name", "schema", "strict"} (Responses'
    text.format, flat) or, as llama-server also takes, {"schema"} beside the type. The schema is
    enforced whatever `strict` says."""
    kinds = '{"type": "text"}, {"type": "json_object"} or {"type": "json_schema", ...}'
    if value is None:
        return None
    if not isinstance(value, dict):
        raise invalid(f"{name} must be {kinds}")
    kind = value.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        if value.get("schema") is not None:
            return schema_spec(value["schema"], f"{name}.schema")
        return json_object_spec(name)
    if kind == "json_schema":
        spec: Any = value
        where = name
        if not flat and ("json_schema" in value or "schema" not in value):
            spec, where = value.get("json_schema"), f"{name}.json_schema"
            if not isinstance(spec, dict):
                raise invalid(f'{where} must be an object like {{"name": ..., "schema": {{...}}}}')
        if spec.get("schema") is None:
            raise invalid(f"{where}.schema is required")
        return schema_spec(spec["schema"], f"{where}.schema")
    raise invalid(f"{name} must be {kinds}")


# --- thinking ------------------------------------------------------------------------------


def thinking_of(body: Mapping[str, Any]) -> tuple[bool, dict[str, Any]]:
    """(thinking on?, the chat template's extra variables) from reasoning_effort, thinking and
    chat_template_kwargs, which must agree. Thinking is on unless a field turns it off."""
    kwargs = body.get("chat_template_kwargs")
    if kwargs is None:
        kwargs = {}
    if not isinstance(kwargs, dict):
        raise invalid("chat_template_kwargs must be an object")
    reserved = sorted(set(kwargs) & RESERVED_TEMPLATE_KWARGS)
    if reserved:
        raise invalid(f"chat_template_kwargs.{reserved[0]} is set by the server (from the request's own fields); "
                      "leave it out")
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
            raise invalid(f"reasoning_effort ({effort!r}) and chat_template_kwargs.reasoning_effort "
                          f"({kw_effort!r}) disagree: send one, or the same value in both")
    if len(set(said.values())) > 1:
        on = [k for k, v in said.items() if v]
        off = [k for k, v in said.items() if not v]
        raise invalid(f"{' and '.join(on)} turn thinking on but {' and '.join(off)} turn it off: "
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


def chat_messages(messages: Any,
                  parse_json: Callable[[str], Any] = json.loads) -> tuple[list[dict[str, Any]], str | None]:
    """OpenAI messages -> (the template's messages, the prefill). A final assistant message is a
    prefill: it is not rendered as a finished turn; the answer continues its text. parse_json
    reads a call's arguments sent as JSON text (the server's parser has limits; a ValueError is
    the field's error)."""
    if messages is None:
        raise RequestError("missing_messages", "messages is required: a non-empty array of messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("missing_messages", "messages must be a non-empty array of messages")
    check_count(messages, "messages", MAX_MESSAGES, "messages")
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
            msg["tool_calls"] = _template_tool_calls(m["tool_calls"], where, parse_json)
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
            raise RequestError("missing_messages", "messages holds only an assistant prefill: add a user message")
    return out, prefill


def _template_tool_calls(calls: Any, where: str, parse_json: Callable[[str], Any]) -> list[dict[str, Any]]:
    """tool_calls as templates expect them: arguments as an object (OpenAI sends JSON text)."""
    if not isinstance(calls, list):
        raise invalid(f"{where}.tool_calls must be an array")
    out = []
    for j, c in enumerate(calls):
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise invalid(f'{where}.tool_calls[{j}] must be {{"type": "function", "function": '
                          '{"name": ..., "arguments": ...}}')
        args = fn.get("arguments")
        if isinstance(args, str):
            try:
                args = parse_json(args) if args.strip() else {}
            except ValueError as e:
                why = getattr(e, "message", None) or str(e)
                raise invalid(f"{where}.tool_calls[{j}].function.arguments is not valid JSON: {why}") from None
        out.append({"id": c.get("id"), "type": "function", "function": {"name": fn["name"], "arguments": args}})
    return out


# --- tools ---------------------------------------------------------------------------------


def chat_tools(tools: Any) -> list[dict[str, Any]] | None:
    """OpenAI chat's function tools, checked (check_tools); None for none."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise invalid("tools must be an array of {\"type\": \"function\", \"function\": {...}}")
    check_count(tools, "tools", MAX_TOOLS, "tools")
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(fn, dict):
            raise invalid(f'tools[{i}] must be {{"type": "function", "function": '
                          '{"name": ..., "parameters": ...}}')
    check_tools(tools)
    return tools or None


def check_tools(tools: list[dict[str, Any]], field: str = "parameters") -> None:
    """Tools (OpenAI function tools, as every dialect's tools become) that a call can name:
    each has a name, no two the same, and parameters that are the schema of an object (a
    call's arguments are one). field: the dialect's name for the schema, for the message."""
    check_count(tools, "tools", MAX_TOOLS, "tools")
    seen: dict[str, int] = {}
    for i, t in enumerate(tools):
        fn = t["function"]
        name = fn.get("name")
        if not isinstance(name, str) or not name.strip():
            raise invalid(f"tools[{i}] has no name: every tool needs one (a non-empty string)")
        if name in seen:
            raise invalid(f"tools[{i}] is named {name!r}, as tools[{seen[name]}] is: tool names must be unique")
        seen[name] = i
        schema = fn.get("parameters")
        if schema is None:
            continue
        kind = schema.get("type", "object") if isinstance(schema, dict) else None
        if not isinstance(schema, dict) or not (kind == "object" or (isinstance(kind, list) and "object" in kind)):
            got = f"type {kind!r}" if isinstance(schema, dict) else type(schema).__name__
            raise invalid(f"tools[{i}] ({name!r}): {field} must be the JSON Schema of an object (a call's "
                          f"arguments are a JSON object), not {got}")


def check_forced_call_alone(forced: str | None, grammar: OutputSpec | None) -> None:
    """A forced call (tool_choice required or named) is a grammar of the template's call format; a
    grammar or response_format constrains the same tokens to something else, so the two together
    cannot both hold: refused rather than a broken call."""
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


# --- the answer ----------------------------------------------------------------------------


def chat_finish_reason(reason: str, n_calls: int) -> str:
    """OpenAI's finish_reason of a chat answer: "tool_calls" when it made calls, but "length" when
    max_tokens cut it (its complete calls are kept, the cut one dropped)."""
    return "tool_calls" if n_calls and reason != "length" else reason


def assistant_message(reasoning: str, content: str, tool_calls: list[ToolCall]) -> dict[str, Any]:
    """OpenAI's assistant message of an answer (what a client appends to its messages to go on)."""
    message: dict[str, Any] = {"role": "assistant"}
    if reasoning:
        message["reasoning_content"] = reasoning
    message["content"] = content if (content or not tool_calls) else None
    if tool_calls:
        message["tool_calls"] = [c.to_dict() for c in tool_calls]
    return message
