"""Reasoning and tool-call parsing: a model's raw text back into reasoning, content and calls.

One streaming parser serves every route: `OutputParser.feed(piece)` returns the parts that are
safe to show now, `finish()` the rest. A non-streamed answer is the same parser's parts joined,
so a streamed answer and a non-streamed one agree by construction.

Formats (the answer's shape, chosen from the chat template's source):
- reasoning: `<think>...</think>` (Qwen3, DeepSeek-R1 and most others); generic, and a template
  that opens the tag itself in the prompt starts the parser inside it.
- "hermes": `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (Hermes, Qwen2.5/3); as
  llama.cpp's Hermes parser, also the same JSON in a ```json fence (small Qwen2.5-Coder models
  write their calls so).
- "llama3": the whole answer is `{"name": ..., "parameters": {...}}`, optionally after
  `<|python_tag|>` (Llama 3.1/3.2).
- "mistral": `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`.
- "json": the whole answer is `{"name": ..., "arguments": {...}}` objects, one a line: what a
  forced call (bubo.chat.tools) writes for a template that teaches no format of its own.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass
from typing import Any

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
HERMES_OPEN = "<tool_call>"
HERMES_CLOSE = "</tool_call>"
FENCE = "```"
LLAMA3_TAG = "<|python_tag|>"
MISTRAL_TAG = "[TOOL_CALLS]"

TOOL_FORMATS = ("hermes", "llama3", "mistral", "json")

# a code fence's opening line: ``` and an optional language, then the block's first character
_FENCE_HEAD = re.compile(r"```(?:([A-Za-z]+)\s+|\s+|(?=[^A-Za-z\s]))(\S)")


@dataclass
class ToolCall:
    name: str
    arguments: str  # a JSON text, as OpenAI sends it
    id: str = ""

    def __post_init__(self) -> None:
        if not self.id:
            self.id = new_call_id()


@dataclass
class Part:
    """One piece of parsed output: kind is "reasoning", "content" or "tool_call" (then call)."""

    kind: str
    text: str = ""
    call: ToolCall | None = None


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


def tool_format_of(template_source: str | None) -> str | None:
    """The tool-call format a chat template teaches its model, or None if it shows none."""
    src = template_source or ""
    if HERMES_OPEN in src:
        return "hermes"
    if MISTRAL_TAG in src:
        return "mistral"
    if LLAMA3_TAG in src or "ipython" in src:
        return "llama3"
    return None


def template_opens_think(prompt: str) -> bool:
    """True when the rendered prompt ends inside an open <think> (the model writes only the
    reasoning's rest and the closing tag)."""
    tail = prompt.rstrip()
    return tail.endswith(THINK_OPEN)


def _partial_suffix(buf: str, tags: tuple[str, ...]) -> int:
    """Length of the longest suffix of buf that is a proper prefix of one of tags."""
    best = 0
    for tag in tags:
        for n in range(min(len(tag) - 1, len(buf)), best, -1):
            if buf.endswith(tag[:n]):
                best = n
                break
    return best


def _call_from_json(obj: Any, args_key: str) -> ToolCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get(args_key, obj.get("arguments", obj.get("parameters", {})))
    if isinstance(args, str):
        text = args  # already JSON text (some models write it so)
    else:
        text = json.dumps(args if args is not None else {}, ensure_ascii=False)
    return ToolCall(obj["name"], text, obj["id"] if isinstance(obj.get("id"), str) else "")


def parse_hermes_call(body: str) -> ToolCall | None:
    try:
        return _call_from_json(json.loads(body.strip()), "arguments")
    except ValueError:
        return None


def parse_llama3_calls(text: str) -> list[ToolCall] | None:
    body = text.strip()
    if body.startswith(LLAMA3_TAG):
        body = body[len(LLAMA3_TAG):].strip()
    # several calls may be separated by ';'
    calls = []
    dec = json.JSONDecoder()
    i = 0
    while i < len(body):
        try:
            obj, end = dec.raw_decode(body, i)
        except ValueError:
            return None
        call = _call_from_json(obj, "parameters")
        if call is None:
            return None
        calls.append(call)
        i = end
        while i < len(body) and body[i] in " \t\r\n;":
            i += 1
    return calls or None


def parse_mistral_calls(text: str) -> list[ToolCall] | None:
    body = text.strip()
    if body.startswith(MISTRAL_TAG):
        body = body[len(MISTRAL_TAG):].strip()
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    items = obj if isinstance(obj, list) else [obj]
    calls = [_call_from_json(o, "arguments") for o in items]
    if not calls or any(c is None for c in calls):
        return None
    return calls  # type: ignore[return-value]


class OutputParser:
    """Splits streamed model text into reasoning, content and tool calls.

    reasoning: parse <think> blocks (False: everything is content). in_think: the prompt already
    opened <think>. tool_format: one of TOOL_FORMATS when the request has tools, else None.
    Text that could be the start of a tag is held back until the next piece decides it."""

    def __init__(self, reasoning: bool = True, tool_format: str | None = None, in_think: bool = False,
                 max_calls: int | None = None):
        if tool_format is not None and tool_format not in TOOL_FORMATS:
            raise ValueError(f"unknown tool-call format {tool_format!r}; known: {', '.join(TOOL_FORMATS)}")
        self.reasoning = reasoning
        self.tool_format = tool_format
        self._buf = ""
        # states: "start" (nothing shown yet, or the reasoning just ended), "think", "content",
        # "hermes" (inside <tool_call>), "whole" (the rest of the answer is a llama3/mistral/json
        # call list, parsed at the end)
        self._state = "think" if (reasoning and in_think) else "start"
        self._seen_content = False
        self._after_think = False  # a </think> ended the reasoning: the answer's leading gap goes
        self.n_calls = 0
        self.max_calls = max_calls  # parallel_tool_calls false: 1; later calls are dropped
        self._n_shown = 0

    def feed(self, text: str) -> list[Part]:
        self._buf += text
        return self._limit(self._drain(final=False))

    def finish(self) -> list[Part]:
        return self._limit(self._drain(final=True))

    def _limit(self, parts: list[Part]) -> list[Part]:
        if self.max_calls is None:
            return parts
        out = []
        for p in parts:
            if p.call is not None:
                if self._n_shown >= self.max_calls:
                    continue
                self._n_shown += 1
            out.append(p)
        return out

    # --- internals ---------------------------------------------------------------------

    def _content(self, out: list[Part], text: str) -> None:
        if text:
            if not self._seen_content and self._after_think:
                text = text.lstrip()  # the gap after </think>
                if not text:
                    return
            self._seen_content = True
            out.append(Part("content", text))

    def _drain(self, final: bool) -> list[Part]:
        out: list[Part] = []
        while True:
            before = (self._state, len(self._buf))
            self._step(out, final)
            if (self._state, len(self._buf)) == before:
                break
        if final:
            self._flush(out)
        return out

    def _step(self, out: list[Part], final: bool) -> None:
        buf = self._buf
        if self._state == "start":
            lead = buf.lstrip()
            if not lead and not final:
                return
            if self.reasoning and not self._after_think:
                if lead.startswith(THINK_OPEN):
                    self._buf = lead[len(THINK_OPEN):]
                    self._state = "think"
                    return
                if THINK_OPEN.startswith(lead) and not final:
                    return  # could still become <think>
            if self.tool_format in ("llama3", "mistral"):
                tag = LLAMA3_TAG if self.tool_format == "llama3" else MISTRAL_TAG
                if lead.startswith(tag) or (self.tool_format == "llama3" and lead.startswith("{")):
                    self._state = "whole"
                    return
                if tag.startswith(lead) and not final:
                    return
            if self.tool_format == "json" and lead.startswith("{"):
                self._state = "whole"
                return
            self._state = "content"
            return
        if self._state == "think":
            i = buf.find(THINK_CLOSE)
            if i >= 0:
                if buf[:i]:
                    out.append(Part("reasoning", buf[:i]))
                self._buf = buf[i + len(THINK_CLOSE):]
                self._state = "start"  # the answer after the reasoning: content, or calls
                self._after_think = True
                return
            hold = 0 if final else _partial_suffix(buf, (THINK_CLOSE,))
            if len(buf) - hold > 0:
                out.append(Part("reasoning", buf[: len(buf) - hold]))
                self._buf = buf[len(buf) - hold:]
            return
        if self._state == "content":
            tags: tuple[str, ...] = ()
            if self.tool_format == "hermes":
                tags = (HERMES_OPEN, FENCE)
            elif self.tool_format == "mistral":
                tags = (MISTRAL_TAG,)
            elif self.tool_format == "llama3":
                tags = (LLAMA3_TAG,)
            hits = [(buf.find(t), t) for t in tags if buf.find(t) >= 0]
            if hits:
                i, tag = min(hits)
                self._content(out, buf[:i])
                if tag == HERMES_OPEN:
                    self._buf = buf[i + len(tag):]
                    self._state = "hermes"
                elif tag == FENCE:
                    self._buf = buf[i:]
                    self._state = "fence"
                else:
                    self._buf = buf[i:]
                    self._state = "whole"
                return
            hold = 0 if final else _partial_suffix(buf, tags)
            if len(buf) - hold > 0:
                self._content(out, buf[: len(buf) - hold])
                self._buf = buf[len(buf) - hold:]
            return
        if self._state == "fence":
            self._fence_step(out, final)
            return
        if self._state == "hermes":
            i = buf.find(HERMES_CLOSE)
            if i >= 0:
                call = parse_hermes_call(buf[:i])
                if call is not None:
                    self.n_calls += 1
                    out.append(Part("tool_call", call=call))
                else:  # not a call after all: show it as the model wrote it
                    self._content(out, HERMES_OPEN + buf[: i + len(HERMES_CLOSE)])
                self._buf = buf[i + len(HERMES_CLOSE):]
                self._state = "content"
            return

    def _fence_step(self, out: list[Part], final: bool) -> None:
        """Inside a ``` block: a JSON object in it may be a call; any other block is content."""
        buf = self._buf
        m = _FENCE_HEAD.match(buf)
        if m is None:
            if final or len(buf) > 64:  # no block start after all
                self._content(out, buf[: len(FENCE)])
                self._buf = buf[len(FENCE):]
                self._state = "content"
            return
        if m.group(2) != "{" or (m.group(1) or "json") != "json":
            self._content(out, buf[: m.start(2)])
            self._buf = buf[m.start(2):]
            self._state = "content"
            return
        end = buf.find(FENCE, m.start(2))
        if end < 0:
            return  # the block goes on
        call = parse_hermes_call(buf[m.start(2): end])
        if call is not None:
            self.n_calls += 1
            out.append(Part("tool_call", call=call))
        else:
            self._content(out, buf[: end + len(FENCE)])
        self._buf = buf[end + len(FENCE):]
        self._state = "content"

    def _flush(self, out: list[Part]) -> None:
        buf, self._buf = self._buf, ""
        if self._state == "hermes":
            # the model ended (EOG) before closing the tag
            call = parse_hermes_call(buf)
            if call is not None:
                self.n_calls += 1
                out.append(Part("tool_call", call=call))
            else:
                self._content(out, HERMES_OPEN + buf)
        elif self._state == "fence":
            m = _FENCE_HEAD.match(buf)
            call = parse_hermes_call(buf[m.start(2):]) if m is not None and m.group(2) == "{" else None
            if call is not None:
                self.n_calls += 1
                out.append(Part("tool_call", call=call))
            else:
                self._content(out, buf)
        elif self._state == "whole":
            parse = parse_mistral_calls if self.tool_format == "mistral" else parse_llama3_calls
            calls = parse(buf)
            if calls:
                self.n_calls += len(calls)
                out.extend(Part("tool_call", call=c) for c in calls)
            else:
                self._content(out, buf)
        elif self._state == "think":
            if buf:
                out.append(Part("reasoning", buf))
        else:
            self._content(out, buf)


def parse_output(text: str, reasoning: bool = True, tool_format: str | None = None,
                 in_think: bool = False) -> tuple[str, str, list[ToolCall]]:
    """(reasoning, content, tool calls) of a whole answer."""
    p = OutputParser(reasoning, tool_format, in_think)
    parts = p.feed(text) + p.finish()
    return (
        "".join(x.text for x in parts if x.kind == "reasoning"),
        "".join(x.text for x in parts if x.kind == "content"),
        [x.call for x in parts if x.call is not None],
    )
