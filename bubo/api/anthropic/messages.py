"""POST /v1/messages and /v1/messages/count_tokens: Anthropic's Messages API (pure functions).

Requests convert into the same template messages as OpenAI chat (tool_use blocks become an
assistant's tool_calls, tool_result blocks become tool messages), so one template rendering
serves both dialects."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from bubo import limits
from bubo.api import fields as f
from bubo.api import jsonin
from bubo.api.errors import ApiError
from bubo.api.fields import invalid
from bubo.api.pipeline import Conversation, Output, steered
from bubo.chat.constrain import REQUIRED
from bubo.chat.parsers import Part, ToolCall
from bubo.engine.types import FinishEvent


@dataclass
class MessagesRequest(Conversation):
    stop: list[str]


def _blocks_text(blocks: Any, where: str) -> str:
    """A system prompt or tool result: a string or text blocks."""
    if blocks is None or isinstance(blocks, str):
        return blocks or ""
    if not isinstance(blocks, list):
        raise invalid(f"{where} must be a string or an array of text blocks")
    texts = []
    for i, b in enumerate(blocks):
        if not isinstance(b, dict) or b.get("type") != "text" or not isinstance(b.get("text"), str):
            kind = b.get("type") if isinstance(b, dict) else type(b).__name__
            if kind in ("image", "document"):
                raise invalid(f"{where}[{i}] is of type {kind!r}: images are not supported by this model")
            raise invalid(f"{where}[{i}] must be a text block {{\"type\": \"text\", \"text\": ...}}")
        texts.append(b["text"])
    return "\n".join(texts)


def anthropic_messages(body: dict[str, Any]) -> tuple[list[dict[str, Any]], str | None]:
    """Anthropic messages (and system) -> (template messages, prefill)."""
    msgs = body.get("messages")
    if msgs is None or (isinstance(msgs, list) and not msgs):
        raise ApiError(400, "missing_messages", "messages is required: a non-empty array of messages")
    if not isinstance(msgs, list):
        raise ApiError(400, "missing_messages", "messages must be a non-empty array of messages")
    f.counted(msgs, "messages", limits.MAX_MESSAGES, "messages")
    out: list[dict[str, Any]] = []
    system = _blocks_text(body.get("system"), "system")
    if system:
        out.append({"role": "system", "content": system})
    for i, m in enumerate(msgs):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            raise invalid(f"{where}.role must be user or assistant")
        role, content = m["role"], m.get("content")
        if isinstance(content, str):
            out.append({"role": role, "content": content})
            continue
        if not isinstance(content, list):
            raise invalid(f"{where}.content must be a string or an array of content blocks")
        texts: list[str] = []
        calls: list[dict[str, Any]] = []
        thinking = ""
        for j, b in enumerate(content):
            kind = b.get("type") if isinstance(b, dict) else None
            w = f"{where}.content[{j}]"
            if kind == "text":
                if not isinstance(b.get("text"), str):
                    raise invalid(f"{w}.text must be a string")
                texts.append(b["text"])
            elif kind == "thinking" and role == "assistant":
                if not isinstance(b.get("thinking") or "", str):
                    raise invalid(f"{w}.thinking must be a string")
                thinking += b.get("thinking") or ""
            elif kind == "redacted_thinking":
                continue
            elif kind == "tool_use" and role == "assistant":
                if not isinstance(b.get("name"), str):
                    raise invalid(f"{w}.name must be a string")
                calls.append({"id": b.get("id"), "type": "function",
                              "function": {"name": b["name"], "arguments": b.get("input") or {}}})
            elif kind == "tool_result" and role == "user":
                if texts:  # text before the result is its own user turn
                    out.append({"role": "user", "content": "\n".join(texts)})
                    texts = []
                out.append({"role": "tool", "tool_call_id": str(b.get("tool_use_id", "")),
                            "content": _blocks_text(b.get("content"), f"{w}.content")})
            elif kind in ("image", "document"):
                raise invalid(f"{w} is of type {kind!r}: images are not supported by this model")
            else:
                raise invalid(f"{w} has an unsupported type {kind!r}")
        if texts or calls or not content:
            msg: dict[str, Any] = {"role": role, "content": "\n".join(texts)}
            if calls:
                msg["tool_calls"] = calls
            if thinking:
                msg["reasoning_content"] = thinking
            out.append(msg)
    prefill = None
    if out and out[-1]["role"] == "assistant" and not out[-1].get("tool_calls"):
        prefill = out.pop()["content"]
        if not any(m["role"] != "system" for m in out):
            raise ApiError(400, "missing_messages", "messages holds only an assistant prefill: add a user message")
    return out, prefill


def anthropic_tools(tools: Any, tool_choice: Any) -> list[dict[str, Any]] | None:
    """Anthropic tools ({name, description, input_schema}) as the OpenAI function tools templates know."""
    if tools is None or (isinstance(tool_choice, dict) and tool_choice.get("type") == "none"):
        return None
    if not isinstance(tools, list):
        raise invalid("tools must be an array of {name, description, input_schema}")
    out = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict):
            raise invalid(f"tools[{i}] must be an object {{name, description, input_schema}}")
        schema = t.get("input_schema")
        fn = {"name": t.get("name"), "description": t.get("description") or "",
              "parameters": {"type": "object", "properties": {}} if schema is None else schema}
        out.append({"type": "function", "function": fn})
    f.check_tools(out, "input_schema")
    return out or None


def parse_messages_request(body: Any, count_only: bool = False) -> MessagesRequest:
    body = f.require_object(body)
    if count_only and body.get("stream"):
        raise invalid("count_tokens does not stream: remove stream")
    messages, prefill = anthropic_messages(body)
    if count_only:
        max_tokens = None
    else:
        if body.get("max_tokens") is None:
            raise invalid("max_tokens is required: the most tokens to generate, a positive integer")
        max_tokens = f.max_tokens_of(body, "max_tokens")
    thinking, kwargs = f.thinking_of(body)
    stop = f.stop_list(body.get("stop_sequences"), "stop_sequences")
    tools = anthropic_tools(body.get("tools"), body.get("tool_choice"))
    choice = body.get("tool_choice")
    kind = choice.get("type") if isinstance(choice, dict) else None
    if choice is None or kind in ("auto", "none"):
        forced = None
    elif kind == "any":
        forced = f.check_tool_choice(REQUIRED, tools)
    elif kind == "tool" and isinstance(choice.get("name"), str):
        forced = f.check_tool_choice(choice["name"], tools)
    else:
        raise invalid('tool_choice must be {"type": "auto"}, {"type": "any"}, {"type": "tool", "name": ...} '
                      'or {"type": "none"}')
    return MessagesRequest(
        messages=messages, prefill=prefill, tools=tools, tool_choice=forced,
        thinking=thinking, template_kwargs=kwargs, params=f.sampling_params(body), max_tokens=max_tokens,
        stop=stop, stream=f.bool_field(body, "stream", False),
        # one call unless the request asks for several (disable_parallel_tool_use: false), as
        # llama-server reads a Messages request
        parallel_tool_calls=(isinstance(body.get("tool_choice"), dict)
                             and body["tool_choice"].get("disable_parallel_tool_use") is False),
    )


# --- shapes --------------------------------------------------------------------------------


def stop_reason(fin: FinishEvent, n_calls: int) -> str:
    """"tool_use" when the answer made calls, but "max_tokens" when max_tokens cut it (its
    complete calls are kept, the cut one dropped)."""
    if fin.reason == "length":
        return "max_tokens"
    if n_calls:
        return "tool_use"
    return "stop_sequence" if fin.stop_string is not None else "end_turn"


def usage(fin: FinishEvent) -> dict[str, Any]:
    # input_tokens counts the whole prompt (as count_tokens and message_start do), the cached part included
    out: dict[str, Any] = {"input_tokens": fin.prompt_tokens, "output_tokens": fin.completion_tokens,
                           "cache_read_input_tokens": fin.cached_tokens, "cache_creation_input_tokens": 0}
    if fin.timings.draft_n:  # speculative decoding (bubo's own keys)
        out.update(draft_tokens=fin.timings.draft_n, draft_tokens_accepted=fin.timings.draft_n_accepted)
    return out


def tool_input(call: ToolCall) -> Any:
    try:
        return jsonin.parse(call.arguments)
    except jsonin.JSONInputError:
        return {}


def tool_id(call: ToolCall) -> str:
    return call.id.replace("call_", "toolu_", 1) if call.id.startswith("call_") else call.id


def message_response(*, id: str, model: str, out: Output) -> dict[str, Any]:
    fin = out.finish
    assert fin is not None
    content: list[dict[str, Any]] = []
    if out.reasoning:
        content.append({"type": "thinking", "thinking": out.reasoning, "signature": ""})
    if out.content or not (out.reasoning or out.tool_calls):
        content.append({"type": "text", "text": out.content})
    for c in out.tool_calls:
        content.append({"type": "tool_use", "id": tool_id(c), "name": c.name, "input": tool_input(c)})
    return {
        "id": id, "type": "message", "role": "assistant", "model": model, "content": content,
        "stop_reason": stop_reason(fin, len(out.tool_calls)), "stop_sequence": fin.stop_string,
        "usage": usage(fin), **steered(fin),
    }


class MessageEvents:
    """The named events of a streamed message: message_start, then per content block its
    content_block_start, deltas and content_block_stop, then message_delta and message_stop."""

    def __init__(self, id: str, model: str):
        self.id, self.model = id, model
        self.index = -1
        self.open: str | None = None  # the kind of the open block
        self.n_calls = 0

    def start(self, input_tokens: int) -> list[tuple[str, dict[str, Any]]]:
        msg: dict[str, Any] = {"id": self.id, "type": "message", "role": "assistant", "model": self.model,
                               "content": [],
               "stop_reason": None, "stop_sequence": None,
               "usage": {"input_tokens": input_tokens, "output_tokens": 0}}
        return [("message_start", {"type": "message_start", "message": msg}), ("ping", {"type": "ping"})]

    def _close(self) -> list[tuple[str, dict[str, Any]]]:
        if self.open is None:
            return []
        self.open = None
        return [("content_block_stop", {"type": "content_block_stop", "index": self.index})]

    def _begin(self, block: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        ev = self._close()
        self.index += 1
        self.open = block["type"]
        return ev + [("content_block_start", {"type": "content_block_start", "index": self.index,
                                              "content_block": block})]

    def parts(self, parts: list[Part]) -> list[tuple[str, dict[str, Any]]]:
        evs: list[tuple[str, dict[str, Any]]] = []
        for p in parts:
            if p.kind == "reasoning":
                if self.open != "thinking":
                    evs += self._begin({"type": "thinking", "thinking": "", "signature": ""})
                evs.append(("content_block_delta", {"type": "content_block_delta", "index": self.index,
                                                    "delta": {"type": "thinking_delta", "thinking": p.text}}))
            elif p.kind == "content":
                if self.open != "text":
                    evs += self._begin({"type": "text", "text": ""})
                evs.append(("content_block_delta", {"type": "content_block_delta", "index": self.index,
                                                    "delta": {"type": "text_delta", "text": p.text}}))
            elif p.call is not None:
                self.n_calls += 1
                evs += self._begin({"type": "tool_use", "id": tool_id(p.call), "name": p.call.name, "input": {}})
                evs.append(("content_block_delta", {"type": "content_block_delta", "index": self.index,
                                                    "delta": {"type": "input_json_delta",
                                                              "partial_json": json.dumps(tool_input(p.call))}}))
        return evs

    def end(self, fin: FinishEvent) -> list[tuple[str, dict[str, Any]]]:
        evs = self._close()
        if self.index < 0:  # nothing was said: an empty text block, as a non-streamed answer has
            evs += self._begin({"type": "text", "text": ""}) + self._close()
        evs.append(("message_delta", {"type": "message_delta",
                                      "delta": {"stop_reason": stop_reason(fin, self.n_calls),
                                                "stop_sequence": fin.stop_string, **steered(fin)},
                                      "usage": {"output_tokens": fin.completion_tokens}}))
        evs.append(("message_stop", {"type": "message_stop"}))
        return evs
