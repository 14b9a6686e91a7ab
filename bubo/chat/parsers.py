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
    """One call of a function tool: its name, its arguments as JSON text (as OpenAI sends them)
    and its id (a fresh "call_..." unless the model wrote one)."""

    name: str
    arguments: str  # a JSON text, as OpenAI sends it
    id: str = ""

    def __post_init__(self) -> None:
        if not self.id:
            self.id = new_call_id()

    @property
    def parsed_arguments(self) -> dict[str, Any]:
        """The arguments as a dict (ValueError if the model wrote arguments that are no JSON
        object: only a call in the template's own markup is taken without checking them)."""
        try:
            value = json.loads(self.arguments) if self.arguments.strip() else {}
        except ValueError as e:
            raise ValueError(f"the arguments of the call to {self.name!r} are not valid JSON ({e}): "
                             f"{self.arguments!r}") from None
        if not isinstance(value, dict):
            raise ValueError(f"the arguments of the call to {self.name!r} are not a JSON object: {self.arguments!r}")
        return value

    def to_dict(self) -> dict[str, Any]:
        """OpenAI's shape: {"id", "type": "function", "function": {"name", "arguments"}}."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


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


class ToolBook:
    """The request's function tools by name: which JSON values are calls to them. A value is a
    call when it is {"name": <a tool's name>, "arguments": <an object>} ("parameters" for
    "arguments" too; the arguments may be JSON text) whose arguments validate against that
    tool's parameters schema (bubo.chat.validate), or an array of such objects."""

    KEYS = frozenset({"name", "arguments", "parameters", "id"})

    def __init__(self, tools: list[dict[str, Any]]):
        self.schemas: dict[str, Any] = {}
        for t in tools:
            fn = t["function"]
            self.schemas[fn["name"]] = fn.get("parameters") or {"type": "object"}

    def call(self, obj: Any) -> ToolCall | None:
        from bubo.chat.validate import is_valid

        if not isinstance(obj, dict) or not set(obj) <= self.KEYS or obj.get("name") not in self.schemas:
            return None
        args = obj.get("arguments", obj.get("parameters", {}))
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError:
                return None
        if not isinstance(args, dict) or not is_valid(args, self.schemas[obj["name"]]):
            return None
        return ToolCall(obj["name"], json.dumps(args, ensure_ascii=False),
                        obj["id"] if isinstance(obj.get("id"), str) else "")

    def calls(self, value: Any) -> list[ToolCall] | None:
        items = value if isinstance(value, list) else [value]
        calls = [self.call(v) for v in items]
        if not calls or any(c is None for c in calls):
            return None
        return calls  # type: ignore[return-value]

    def names_one(self, text: str) -> bool:
        """Does this (unfinished) JSON text start like a call to one of the tools?"""
        m = _CALL_HEAD.match(text)
        return m is not None and m.group(1) in self.schemas


# the start of a call object: {"name": "<name>" (in an array, or not)
_CALL_HEAD = re.compile(r'\s*(?:\[\s*)?\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"')
# a code fence that opens a JSON block: ``` and an optional "json", then the block's first character
_FENCE_JSON = re.compile(r"```([A-Za-z]*)[ \t]*\r?\n?\s*(\S?)")


def _calls_from_json(value: Any, args_key: str) -> list[ToolCall] | None:
    """The calls in a value of a template's own whole-answer format: an object or an array of them."""
    items = value if isinstance(value, list) else [value]
    calls = [_call_from_json(v, args_key) for v in items]
    if not calls or any(c is None for c in calls):
        return None
    return calls  # type: ignore[return-value]


def _json_calls(text: str, args_key: str) -> list[ToolCall] | None:
    """Every call in text: JSON values (objects or arrays of them) separated by spaces, ';' or
    ','; None if anything else is there."""
    calls: list[ToolCall] = []
    dec = json.JSONDecoder()
    i = 0
    while i < len(text):
        try:
            obj, end = dec.raw_decode(text, i)
        except ValueError:
            return None
        found = _calls_from_json(obj, args_key)
        if found is None:
            return None
        calls += found
        i = end
        while i < len(text) and text[i] in " \t\r\n;,":
            i += 1
    return calls or None


def parse_llama3_calls(text: str) -> list[ToolCall] | None:
    body = text.strip()
    if body.startswith(LLAMA3_TAG):
        body = body[len(LLAMA3_TAG):].strip()
    return _json_calls(body, "parameters")


def parse_mistral_calls(text: str) -> list[ToolCall] | None:
    body = text.strip()
    if body.startswith(MISTRAL_TAG):
        body = body[len(MISTRAL_TAG):].strip()
    return _json_calls(body, "arguments")


class _ValueEnd:
    """Finds where a JSON object or array that starts at some position of a growing text ends:
    brackets counted outside strings, scanned once however the text arrives."""

    def __init__(self, start: int):
        self.start = start
        self.pos = start
        self.open: list[str] = []  # the closing brackets due, innermost last
        self.in_str = False
        self.esc = False

    def scan(self, text: str) -> int | None:
        """The index just past the value, or None while it is unfinished."""
        for i in range(self.pos, len(text)):
            c = text[i]
            if self.in_str:
                if self.esc:
                    self.esc = False
                elif c == "\\":
                    self.esc = True
                elif c == '"':
                    self.in_str = False
            elif c == '"':
                self.in_str = True
            elif c in "{[":
                self.open.append("}" if c == "{" else "]")
            elif c in "}]":
                if self.open:
                    self.open.pop()
                if not self.open:
                    self.pos = i + 1
                    return i + 1
        self.pos = len(text)
        return None

    def closed(self, text: str) -> str:
        """The unfinished value text[start:] with the brackets it lacks at its end (a model
        that ended a call a brace short); "" when it ends inside a string (a value cut short)."""
        if self.in_str:
            return ""
        return text[self.start:] + "".join(reversed(self.open))


class OutputParser:
    """Splits streamed model text into reasoning, content and tool calls.

    reasoning: parse <think> blocks (False: everything is content). in_think: the prompt already
    opened <think>. tool_format: one of TOOL_FORMATS when the request has tools, else None.
    max_calls: the most calls an answer may make (parallel_tool_calls false: 1); once that many
    are out, the rest of the answer is dropped and `done` is set (the caller may end the
    generation there). tools: the request's tools when the model chooses (tool_choice auto):
    an answer that is JSON naming one of them with valid arguments is a call even without the
    template's markers (small models drop them), after optional whitespace and a ```json fence.
    Text that could be the start of a tag, or of such a call, is held back until the next piece
    decides it."""

    def __init__(self, reasoning: bool = True, tool_format: str | None = None, in_think: bool = False,
                 max_calls: int | None = None, tools: ToolBook | None = None):
        if tool_format is not None and tool_format not in TOOL_FORMATS:
            raise ValueError(f"unknown tool-call format {tool_format!r}; known: {', '.join(TOOL_FORMATS)}")
        self.reasoning = reasoning
        self.tool_format = tool_format
        self.book = tools
        self._buf = ""
        # states: "start" (nothing shown yet, or the reasoning just ended), "think", "content",
        # "hermes" (inside <tool_call>), "fence" (inside a ``` block that may hold a call),
        # "values" (the rest of the answer is calls as JSON values: a whole-answer format, or
        # a bare JSON answer)
        self._state = "think" if (reasoning and in_think) else "start"
        self._seen_content = False
        self._after_think = False  # a </think> ended the reasoning: the answer's leading gap goes
        self.n_calls = 0
        self.max_calls = max_calls
        self.done = False
        self._n_shown = 0
        self._cut = False
        self._gap = ""
        # the "values" state: strict (the calls must be to the book's tools, valid), a fence
        # around them, the text passed over since the last call, the values taken so far, the
        # scan of the current one
        self._strict = False
        self._fence: str | None = None  # None, or "open" (its line not yet passed), "in", "closed"
        self._held = ""
        self._n_values = 0
        self._scan: _ValueEnd | None = None
        self._in_array = False  # inside a [...] of calls

    def feed(self, text: str) -> list[Part]:
        if self.done:
            return []
        self._buf += text
        return self._limit(self._drain(final=False))

    def finish(self, cut: bool = False) -> list[Part]:
        """The answer ended: cut (by max_tokens or a full context) or not. A call the cut left
        unfinished is dropped; the complete ones before it stay."""
        if self.done:
            return []
        self._cut = cut
        return self._limit(self._drain(final=True))

    def _limit(self, parts: list[Part]) -> list[Part]:
        out = []
        for p in parts:
            if self.done:
                break
            out.append(p)
            if p.call is not None:
                self._n_shown += 1
                if self.max_calls is not None and self._n_shown >= self.max_calls:
                    self.done = True
        return out

    # --- internals ---------------------------------------------------------------------

    def _content(self, out: list[Part], text: str) -> None:
        if text:
            if not self._seen_content and self._after_think:
                text = text.lstrip()  # the gap after </think>
                if not text:
                    return
            if self.n_calls and text.isspace():
                self._gap += text  # space between or after calls is shown only if text follows
                return
            text, self._gap = self._gap + text, ""
            self._seen_content = True
            out.append(Part("content", text))

    def _calls(self, out: list[Part], calls: list[ToolCall]) -> None:
        self.n_calls += len(calls)
        out.extend(Part("tool_call", call=c) for c in calls)

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

    def _values(self, strict: bool, fence: bool = False) -> None:
        """The rest of the answer is read as calls (JSON values)."""
        self._state = "values"
        self._strict = strict
        self._fence = "open" if fence else None
        self._held = ""
        self._n_values = 0
        self._scan = None
        self._in_array = False

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
                    self._buf = lead
                    self._values(strict=False)
                    return
                if tag.startswith(lead) and not final:
                    return
            if self.tool_format == "json" and lead[:1] in ("{", "["):
                self._values(strict=False)
                return
            if self.book is not None:
                if lead[:1] in ("{", "["):
                    self._values(strict=True)
                    return
                if lead.startswith(FENCE):
                    self._values(strict=True, fence=True)
                    return
                if FENCE.startswith(lead) and not final:
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
                    self._values(strict=False)
                return
            hold = 0 if final else _partial_suffix(buf, tags)
            if len(buf) - hold > 0:
                self._content(out, buf[: len(buf) - hold])
                self._buf = buf[len(buf) - hold:]
            return
        if self._state == "fence":
            self._fence_step(out, final)
            return
        if self._state == "values":
            self._values_step(out, final)
            return
        if self._state == "hermes":
            i = buf.find(HERMES_CLOSE)
            if i >= 0:
                call = parse_hermes_call(buf[:i])
                if call is not None:
                    self._calls(out, [call])
                else:  # not a call after all: show it as the model wrote it
                    self._content(out, HERMES_OPEN + buf[: i + len(HERMES_CLOSE)])
                self._buf = buf[i + len(HERMES_CLOSE):]
                self._state = "content"
            return

    def _fenced_calls(self, body: str) -> list[ToolCall] | None:
        """The call a ```json block holds: with the request's tools known, only a valid call to
        one of them."""
        if self.book is None:
            call = parse_hermes_call(body)
            return [call] if call is not None else None
        try:
            return self.book.calls(json.loads(body))
        except ValueError:
            return None

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
        calls = self._fenced_calls(buf[m.start(2): end])
        if calls is not None:
            self._calls(out, calls)
        else:
            self._content(out, buf[: end + len(FENCE)])
        self._buf = buf[end + len(FENCE):]
        self._state = "content"

    def _values_step(self, out: list[Part], final: bool) -> None:
        """The answer as JSON values that are calls, one after another (separated by spaces,
        ',' or ';', or in a [...] list), maybe in a ```json fence. What is passed over (space,
        the fence, brackets) is held; the first value that is no call makes what was held and
        the rest content."""
        while True:
            buf = self._buf
            n = len(buf) - len(buf.lstrip())
            if not self._n_values and not self._strict:
                tag = next((t for t in (LLAMA3_TAG, MISTRAL_TAG) if buf.startswith(t, n)), None)
                if tag is not None:
                    self._pass(n + len(tag))
                    continue
            if self._n_values and buf[n:n + 1] in (",", ";"):
                n += 1
            if n:
                self._pass(n)
                continue
            if not buf:
                return
            if self._fence == "open":  # the fence's opening line, then the first value
                m = _FENCE_JSON.match(buf)
                if m is None or not m.group(2):
                    if final or (m is None and not FENCE.startswith(buf[:3])) or len(buf) > 64:
                        self._give_up(out, len(buf))
                    return
                if m.group(1) not in ("", "json", "JSON") or m.group(2) not in ("{", "["):
                    self._give_up(out, len(buf))
                    return
                self._fence = "in"
                self._pass(m.start(2))
                continue
            if self._fence == "in" and buf.startswith(FENCE):
                self._fence = "closed"  # only space may follow
                self._pass(len(FENCE))
                continue
            if self._fence == "in" and FENCE.startswith(buf) and not final:
                return  # may be the closing fence
            c = buf[0]
            if self._fence != "closed" and self._in_array and c == "]":
                self._in_array = False  # a list of calls ends
                self._pass(1)
                continue
            if self._fence != "closed" and not self._in_array and c == "[":
                self._in_array = True  # a list of calls: its items are read (and shown) one by one
                self._pass(1)
                continue
            if c != "{" or self._fence == "closed":
                self._give_up(out, len(buf))
                return
            if self._scan is None:
                self._scan = _ValueEnd(0)
            end = self._scan.scan(buf)
            if end is None:
                return
            try:
                value: Any = json.loads(buf[:end])
            except ValueError:
                value = None
            if self._strict:
                assert self.book is not None
                calls = self.book.calls(value)
            else:
                calls = _calls_from_json(value, "parameters" if self.tool_format == "llama3" else "arguments")
            if calls is None:
                self._give_up(out, end)
                return
            self._calls(out, calls)
            self._n_values += 1
            self._held = ""
            self._buf = buf[end:]
            self._scan = None
            if self.max_calls is not None and self.n_calls >= self.max_calls:
                return  # _limit ends the answer here

    def _pass(self, n: int) -> None:
        """Move the next n characters from the buffer to what is held (shown if no call comes)."""
        self._held += self._buf[:n]
        self._buf = self._buf[n:]

    def _give_up(self, out: list[Part], end: int) -> None:
        """The values state's text up to end is no call: it and what was held are content (if
        no call came yet: else the held brackets and fences go, the space before the text
        stays), the rest is read as content."""
        held = self._held if not self._n_values else self._held[len(self._held.rstrip()):]
        self._content(out, held + self._buf[:end])
        self._buf = self._buf[end:]
        self._held = ""
        self._state = "content"
        self._scan = None
        self._in_array = False

    def _flush(self, out: list[Part]) -> None:
        buf, self._buf = self._buf, ""
        if self._state == "hermes":
            # the model ended (EOG, or max_tokens) before closing the tag
            call = parse_hermes_call(buf)
            if call is not None:
                self._calls(out, [call])
            elif not self._cut:  # a cut call is dropped, an unfinished one shown
                self._content(out, HERMES_OPEN + buf)
        elif self._state == "fence":
            m = _FENCE_HEAD.match(buf)
            calls = self._fenced_calls(buf[m.start(2):]) if m is not None and m.group(2) == "{" else None
            if calls is not None:
                self._calls(out, calls)
            elif not (self._cut and m is not None and m.group(2) == "{" and self._names_call(buf[m.start(2):])):
                self._content(out, buf)
        elif self._state == "values":
            held, self._held = self._held, ""
            if not buf.strip():
                if not self._n_values:
                    self._content(out, held + buf)  # brackets, a fence: no call came
                return
            # an unfinished value: a call the cut ended is dropped; one the model ended short of
            # its closing brackets is a call when closing them makes one; anything else is shown
            if self._cut and self._names_call(buf):
                return
            healed = self._healed(buf) if not self._cut else None
            if healed:
                self._calls(out, healed)
            else:
                self._content(out, (held if not self._n_values else "") + buf)
        elif self._state == "think":
            if buf:
                out.append(Part("reasoning", buf))
        else:
            self._content(out, buf)

    def _healed(self, buf: str) -> list[ToolCall] | None:
        """The calls of an unfinished last value once its missing closing brackets are added."""
        scan = self._scan
        if scan is None or not buf.startswith("{"):
            return None
        scan.scan(buf)
        try:
            value = json.loads(scan.closed(buf))
        except ValueError:
            return None
        if self._strict:
            return self.book.calls(value) if self.book is not None else None
        return _calls_from_json(value, "parameters" if self.tool_format == "llama3" else "arguments")

    def _names_call(self, text: str) -> bool:
        """Does this unfinished JSON start like a call (to one of the request's tools, when
        they are known)?"""
        m = _CALL_HEAD.match(text)
        if m is None:
            return False
        return self.book.names_one(text) if self.book is not None else True


def parse_output(text: str, reasoning: bool = True, tool_format: str | None = None,
                 in_think: bool = False, tools: ToolBook | None = None, max_calls: int | None = None,
                 cut: bool = False) -> tuple[str, str, list[ToolCall]]:
    """(reasoning, content, tool calls) of a whole answer."""
    p = OutputParser(reasoning, tool_format, in_think, max_calls=max_calls, tools=tools)
    parts = p.feed(text) + p.finish(cut)
    return (
        "".join(x.text for x in parts if x.kind == "reasoning"),
        "".join(x.text for x in parts if x.kind == "content"),
        [x.call for x in parts if x.call is not None],
    )
