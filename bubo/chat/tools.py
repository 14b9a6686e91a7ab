"""Grammars that force an answer to be tool calls, written in the chat template's own call
format (the one bubo.chat.parsers reads back), each call's arguments following its tool's
parameter schema (bubo.chat.schema).

tool_choice "required" or a named function is enforced by such a grammar rather than by a
prompt prefix: a prefix only starts a call, and a small model may still end it with text that
is no call, or with arguments its schema refuses."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from bubo.chat.parsers import HERMES_CLOSE, HERMES_OPEN, MISTRAL_TAG
from bubo.chat.schema import SchemaError, literal, schema_to_gbnf

# "json": the call format of a template that teaches none (a bare {"name", "arguments"} object)
FORCED_FORMATS = ("hermes", "mistral", "llama3", "json")

# a GBNF token: a string literal, a character class, a {m,n} repetition, a rule name (the
# grammar parser's word characters), a comment, or anything else (operators, spaces); only rule
# names are renamed when one grammar's rules are embedded beside another's
_GBNF_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|\[(?:[^\]\\]|\\.)*\]|\{[^}]*\}|[A-Za-z0-9_-]+|#[^\n]*|.', re.S)
_GBNF_NAME = re.compile(r"[A-Za-z0-9_-]+")


class ToolSchemaError(ValueError):
    """A tool's parameters schema has a keyword the grammar cannot enforce."""

    def __init__(self, tool: str, message: str):
        super().__init__(f"tools: the parameters of function {tool!r}: {message}")
        self.tool = tool


def prefix_rules(gbnf: str, prefix: str) -> str:
    """The same grammar with every rule name prefixed (root becomes prefix + "root"), so that
    several schemas' rules can live in one grammar."""
    return "".join(prefix + t if _GBNF_NAME.fullmatch(t) else t for t in _GBNF_TOKEN.findall(gbnf))


def _args_key(tool_format: str) -> str:
    return "parameters" if tool_format == "llama3" else "arguments"


def _class_escape(c: str) -> str:
    return "\\" + c if c in "\\]^-[" else c


def text_without(stop: str, rule: str) -> list[str]:
    """Rules rule-0 .. rule-(n-1) whose sentences (from rule-0) are the texts that do not contain
    stop: a KMP automaton, state k = how much of stop the text's end matches."""
    n = len(stop)
    fail = [0] * (n + 1)  # fail[k]: the longest proper border of stop[:k]
    for k in range(2, n + 1):
        j = fail[k - 1]
        while j and stop[j] != stop[k - 1]:
            j = fail[j]
        fail[k] = j + 1 if stop[j] == stop[k - 1] else 0

    def step(k: int, c: str) -> int:
        while k and stop[k] != c:
            k = fail[k]
        return k + 1 if stop[k] == c else 0

    rules = []
    for k in range(n):
        alts, special = [], sorted(set(stop))
        for c in special:
            to = step(k, c)
            if to < n:  # reaching n would be stop itself
                alts.append(f"{literal(c)} {rule}-{to}")
        alts.append(f"[^{''.join(_class_escape(c) for c in special)}] {rule}-0")
        rules.append(f"{rule}-{k} ::= ({' | '.join(alts)})?")
    return rules


def call_grammar(tool_format: str, tools: list[dict[str, Any]], name: str | None = None,
                 parallel: bool = False) -> str:
    """GBNF for an answer that is one call (parallel False) or one or more calls (True) to the
    function `name`, or to any of tools when name is None. tools are OpenAI function tools.
    A <think> block before the calls is bubo.chat.thinking's (answer_grammar)."""
    if tool_format not in FORCED_FORMATS:
        raise ValueError(f"unknown tool-call format {tool_format!r}; known: {', '.join(FORCED_FORMATS)}")
    chosen = [t["function"] for t in tools if name is None or t["function"]["name"] == name]
    if not chosen:
        raise ValueError(f"no tool is named {name!r}")
    rules: list[str] = []
    alts = []
    for i, fn in enumerate(chosen):
        schema = fn.get("parameters")
        if schema is None:
            schema = {"type": "object", "properties": {}}
        try:
            args = schema_to_gbnf(schema)
        except SchemaError as e:
            raise ToolSchemaError(fn["name"], str(e)) from None
        rules.append(prefix_rules(args, f"t{i}-"))
        head = '{"name": ' + json.dumps(fn["name"], ensure_ascii=False) + f', "{_args_key(tool_format)}": '
        alts.append(f"{literal(head)} t{i}-root \"}}\"")
    rules.append("call-json ::= " + " | ".join(alts))
    if tool_format == "hermes":
        # as the Qwen2.5 / Hermes templates write a call: the tags on their own lines
        rules.append(f"call ::= {literal(HERMES_OPEN + chr(10))} call-json {literal(chr(10) + HERMES_CLOSE)}")
        more = "call"  # back to back: a newline between would be content between the calls
        top = "call"
    elif tool_format == "mistral":
        rules.append("call ::= call-json")
        more = '", " call'
        top = f"{literal(MISTRAL_TAG + '[')} calls \"]\""
    else:  # llama3, json: a bare object; several are a JSON array, whose "]" is a natural end
        rules.append("call ::= call-json")
        more = '", " call'
        top = 'call | "[" calls "]"' if parallel else "calls"
    rules.append(f"calls ::= call ({more})*" if parallel else "calls ::= call")
    if tool_format == "hermes":
        top = "calls"
    return f"root ::= {top}\n" + "\n".join(rules) + "\n"


# --- the generic tool prompt -----------------------------------------------------------------

GENERIC_TOOL_PROMPT = """You can call these functions:
{tools}

To call a function, answer with only a JSON object and nothing else: {{"name": <the function's \
name>, "arguments": <its arguments, a JSON object that follows its parameters schema>}}. To call \
several, answer with a JSON array of such objects. If no function helps, answer normally."""


def generic_tool_messages(messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]]
                          ) -> list[dict[str, Any]]:
    """The conversation for a chat template that does not show tools (it renders the same text
    with or without them): the tools described in a system message, in the call format bubo
    reads back without markers (a bare JSON object, bubo.chat.parsers.ToolBook), and earlier
    calls written as the model would have written them."""
    listed = "\n".join(json.dumps({"name": t["function"]["name"],
                                   "description": t["function"].get("description") or "",
                                   "parameters": t["function"].get("parameters") or {"type": "object"}},
                                  ensure_ascii=False) for t in tools)
    prompt = GENERIC_TOOL_PROMPT.format(tools=listed)
    out = [dict(m) for m in messages]
    for m in out:
        calls = m.get("tool_calls")
        if m.get("role") == "assistant" and calls:
            written = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]} for c in calls]
            text = json.dumps(written[0] if len(written) == 1 else written, ensure_ascii=False)
            m["content"] = (m["content"] + "\n" if isinstance(m.get("content"), str) and m["content"] else "") + text
            del m["tool_calls"]
    if out and out[0].get("role") == "system" and isinstance(out[0].get("content"), str):
        out[0]["content"] = out[0]["content"] + "\n\n" + prompt
    else:
        out.insert(0, {"role": "system", "content": prompt})
    return out
