"""POST /v1/responses: OpenAI's Responses API (pure functions). A response is stored (unless
`store` is false: bubo/api/openai/stored.py) with its conversation's items, and
previous_response_id continues from it: its items, then the new input, are the conversation."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from bubo import limits
from bubo.api import fields as f
from bubo.api.errors import ApiError
from bubo.api.fields import invalid
from bubo.api.openai.chat import cache_details, draft_details
from bubo.api.openai.stored import Stored
from bubo.api.pipeline import Conversation, Output, steered
from bubo.api.request import with_fields
from bubo.chat.parsers import Part, ToolCall
from bubo.engine.types import FinishEvent


@dataclass
class ResponsesRequest(Conversation):
    echo: dict[str, Any]  # request fields the response repeats (instructions, tools, ...)
    items: list[dict[str, Any]]  # the conversation's items: a previous response's, then input's
    store: bool  # keep the response (GET /v1/responses/{id}, previous_response_id)


_ITEM_ID_PREFIX = {"message": "msg_", "function_call": "fc_", "function_call_output": "fco_", "reasoning": "rs_"}


def input_items(body: dict[str, Any]) -> list[dict[str, Any]]:
    """`input` as items (a string is one user message), each with an id (its own, or a new one),
    as a stored response and GET /v1/responses/{id}/input_items keep them. Shapes only: the
    messages they make are checked by chat_messages."""
    items = body.get("input")
    if items is None or items == "" or items == []:
        raise ApiError(400, "missing_messages", "input is required: a string or a non-empty array of items")
    if isinstance(items, str):
        return [{"type": "message", "id": f.new_id("msg_"), "role": "user",
                 "content": [{"type": "input_text", "text": items}]}]
    if not isinstance(items, list):
        raise invalid("input must be a string or an array of items")
    f.counted(items, "input", limits.MAX_MESSAGES, "items")
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise invalid(f"input[{i}] must be an object")
        kind = item.get("type", "message")
        if not isinstance(kind, str) or kind not in _ITEM_ID_PREFIX:
            raise invalid(f"input[{i}] has an unsupported type {kind!r}")
        given = item.get("id")
        item = {**item, "type": kind,
                "id": given if isinstance(given, str) and given else f.new_id(_ITEM_ID_PREFIX[kind])}
        if kind == "message" and isinstance(item.get("content"), str):  # as OpenAI lists it: one text part
            part = "output_text" if item.get("role") == "assistant" else "input_text"
            item["content"] = [{"type": part, "text": item["content"]}]
        out.append(item)
    return out


def items_messages(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Items (input_items') as OpenAI chat messages: a function call joins the assistant turn
    before it (its text, or the calls made beside it); earlier reasoning is not shown again."""
    msgs: list[dict[str, Any]] = []
    for item in items:
        kind = item["type"]
        if kind == "message":
            msgs.append({"role": item.get("role"), "content": item.get("content")})
        elif kind == "function_call":
            call = {"id": item.get("call_id"), "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments") or "{}"}}
            if msgs and msgs[-1]["role"] == "assistant":
                msgs[-1].setdefault("tool_calls", []).append(call)  # one assistant turn
            else:
                msgs.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            out = item.get("output")
            msgs.append({"role": "tool", "tool_call_id": item.get("call_id"),
                         "content": out if isinstance(out, (str, list)) else json.dumps(out)})
    return msgs


def previous_id(body: dict[str, Any]) -> str | None:
    """previous_response_id: None, or the id of the response to continue."""
    prev = body.get("previous_response_id")
    if prev is None:
        return None
    if not isinstance(prev, str) or not prev:
        raise invalid("previous_response_id must be the id of a stored response (\"resp_...\")")
    return prev


def _tools(tools: Any) -> list[dict[str, Any]] | None:
    """Responses tools ({type: function, name, parameters, strict}) in the chat format. The
    schema is used as sent whatever strict says: a forced call's grammar (bubo.chat.constrain)
    enforces it as written, so with strict absent or null optional properties stay optional."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise invalid("tools must be an array")
    out = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or t.get("type") != "function":
            kind = t.get("type") if isinstance(t, dict) else None
            raise invalid(f"tools[{i}]: only function tools are supported (got type {kind!r})")
        schema = t.get("parameters")
        fn = {"name": t.get("name"), "description": t.get("description") or "",
              "parameters": {"type": "object", "properties": {}} if schema is None else schema}
        out.append({"type": "function", "function": fn})
    f.check_tools(out)
    return out or None


def parse_responses_request(body: Any, previous: Stored | None = None) -> ResponsesRequest:
    """The request; previous: the stored response it continues (previous_response_id), whose
    conversation and output come before `input` (its instructions do not: they are the request's own)."""
    body = f.require_object(body)
    previous_id(body)  # checked (the route looked it up)
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise invalid("instructions must be a string")
    items = (previous.history() if previous is not None else []) + input_items(body)
    system = [{"role": "system", "content": instructions}] if instructions is not None else []
    messages, prefill = f.chat_messages(system + items_messages(items))
    max_tokens = f.max_tokens_of(body, "max_output_tokens")
    text = body.get("text")
    output = f.response_format_spec(text.get("format"), "text.format", flat=True) if isinstance(text, dict) else None
    reasoning = body.get("reasoning")
    fields = with_fields(body)  # its lookups count as the body's (X-Bubo-Ignored-Fields)
    if reasoning is not None:
        if not isinstance(reasoning, dict):
            raise invalid("reasoning must be an object like {\"effort\": \"low\"}")
        if reasoning.get("effort") is not None:
            if body.get("reasoning_effort") is not None and body["reasoning_effort"] != reasoning["effort"]:
                raise invalid("reasoning.effort and reasoning_effort disagree: send one")
            fields["reasoning_effort"] = reasoning["effort"]
    thinking, kwargs = f.thinking_of(fields)
    tools = _tools(body.get("tools"))
    choice = body.get("tool_choice")
    named = choice.get("name") if isinstance(choice, dict) and choice.get("type") == "function" else None
    tools, forced = f.openai_tool_choice(choice, tools, named, '{"type": "function", "name": ...}')
    f.check_forced_call_alone(forced, output)
    metadata = body.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise invalid("metadata must be an object (the response repeats it)")
    return ResponsesRequest(
        messages=messages, prefill=prefill, tools=tools, thinking=thinking, template_kwargs=kwargs,
        params=f.sampling_params(body), max_tokens=max_tokens, stream=f.bool_field(body, "stream", False),
        tool_choice=forced, parallel_tool_calls=f.bool_field(body, "parallel_tool_calls", False), output=output,
        items=items, store=f.bool_field(body, "store", True),
        echo={"instructions": instructions, "max_output_tokens": max_tokens,
              "previous_response_id": previous.id if previous is not None else None,
              "tools": body.get("tools") or [], "temperature": body.get("temperature"),
              "top_p": body.get("top_p"), "metadata": body.get("metadata") or {}},
    )


# --- shapes --------------------------------------------------------------------------------


def usage(fin: FinishEvent, reasoning_tokens: int) -> dict[str, Any]:
    return {
        "input_tokens": fin.prompt_tokens,
        "input_tokens_details": cache_details(fin, "cached_tokens"),
        "output_tokens": fin.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens,
                                  **draft_details(fin).get("completion_tokens_details", {})},
        "total_tokens": fin.prompt_tokens + fin.completion_tokens,
    }


def reasoning_item(id: str, text: str, status: str = "completed") -> dict[str, Any]:
    return {"type": "reasoning", "id": id, "summary": [], "content": [{"type": "reasoning_text", "text": text}],
            "status": status}


def message_item(id: str, text: str, status: str = "completed") -> dict[str, Any]:
    done = status == "completed"
    content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}] if done else []
    return {"type": "message", "id": id, "status": status, "role": "assistant", "content": content}


def call_item(id: str, call: ToolCall, status: str = "completed") -> dict[str, Any]:
    return {"type": "function_call", "id": id, "call_id": call.id, "name": call.name,
            "arguments": call.arguments if status == "completed" else "", "status": status}


def response_object(*, id: str, created: int, model: str, req: ResponsesRequest, output: list[dict[str, Any]],
                    fin: FinishEvent | None, reasoning_tokens: int = 0) -> dict[str, Any]:
    status = "in_progress" if fin is None else ("incomplete" if fin.reason == "length" else "completed")
    return {
        "id": id, "object": "response", "created_at": created, "status": status,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "model": model, "output": output, "parallel_tool_calls": req.parallel_tool_calls, "tool_choice": "auto",
        "store": req.store,
        "text": {"format": {"type": "text"}},
        **req.echo,
        "usage": usage(fin, reasoning_tokens) if fin is not None else None,
        **(steered(fin) if fin is not None else {}),
    }


def output_items(out: Output) -> list[dict[str, Any]]:
    items = []
    if out.reasoning:
        items.append(reasoning_item(f.new_id("rs_"), out.reasoning))
    if out.content or not (out.reasoning or out.tool_calls):
        items.append(message_item(f.new_id("msg_"), out.content))
    items += [call_item(f.new_id("fc_"), c) for c in out.tool_calls]
    return items


class ResponseEvents:
    """The events of a streamed response, each with its sequence_number: response.created and
    .in_progress, per output item its added/delta/done events, then response.completed (or
    .incomplete) with the whole response, as the SDK's stream helper rebuilds it."""

    def __init__(self, id: str, created: int, model: str, req: ResponsesRequest):
        self.id, self.created, self.model, self.req = id, created, model, req
        self.seq = 0
        self.items: list[dict[str, Any]] = []  # finished output items
        self.open: dict[str, Any] | None = None  # the item being streamed
        self.text = ""

    def _ev(self, kind: str, **fields: Any) -> tuple[str, dict[str, Any]]:
        ev = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return (kind, ev)

    def _response(self, fin: FinishEvent | None, reasoning_tokens: int = 0) -> dict[str, Any]:
        return response_object(id=self.id, created=self.created, model=self.model, req=self.req,
                               output=list(self.items), fin=fin, reasoning_tokens=reasoning_tokens)

    def start(self) -> list[tuple[str, dict[str, Any]]]:
        return [self._ev("response.created", response=self._response(None)),
                self._ev("response.in_progress", response=self._response(None))]

    def _close(self) -> list[tuple[str, dict[str, Any]]]:
        item, self.open = self.open, None
        if item is None:
            return []
        idx = len(self.items)
        evs = []
        if item["type"] == "reasoning":
            item = reasoning_item(item["id"], self.text)
            evs.append(self._ev("response.reasoning_text.done", item_id=item["id"], output_index=idx,
                                content_index=0, text=self.text))
        else:
            item = message_item(item["id"], self.text)
            part = item["content"][0]
            evs.append(self._ev("response.output_text.done", item_id=item["id"], output_index=idx,
                                content_index=0, text=self.text, logprobs=[]))
            evs.append(self._ev("response.content_part.done", item_id=item["id"], output_index=idx,
                                content_index=0, part=part))
        self.items.append(item)
        evs.append(self._ev("response.output_item.done", output_index=idx, item=item))
        return evs

    def _begin(self, kind: str) -> list[tuple[str, dict[str, Any]]]:
        evs = self._close()
        idx = len(self.items)
        self.text = ""
        if kind == "reasoning":
            self.open = reasoning_item(f.new_id("rs_"), "", "in_progress")
            self.open["content"] = []
            return evs + [self._ev("response.output_item.added", output_index=idx, item=self.open)]
        self.open = message_item(f.new_id("msg_"), "", "in_progress")
        return evs + [self._ev("response.output_item.added", output_index=idx, item=self.open),
                      self._ev("response.content_part.added", item_id=self.open["id"], output_index=idx,
                               content_index=0, part={"type": "output_text", "text": "", "annotations": [],
                                                      "logprobs": []})]

    def parts(self, parts: list[Part]) -> list[tuple[str, dict[str, Any]]]:
        evs: list[tuple[str, dict[str, Any]]] = []
        for p in parts:
            if p.kind in ("reasoning", "content"):
                kind = "reasoning" if p.kind == "reasoning" else "message"
                if self.open is None or self.open["type"] != kind:
                    evs += self._begin(kind)
                self.text += p.text
                name = "response.reasoning_text.delta" if kind == "reasoning" else "response.output_text.delta"
                extra: dict[str, Any] = {} if kind == "reasoning" else {"logprobs": []}
                assert self.open is not None
                evs.append(self._ev(name, item_id=self.open["id"], output_index=len(self.items), content_index=0,
                                    delta=p.text, **extra))
            elif p.call is not None:
                evs += self._close()
                idx = len(self.items)
                item_id = f.new_id("fc_")
                evs.append(self._ev("response.output_item.added", output_index=idx,
                                    item=call_item(item_id, p.call, "in_progress")))
                evs.append(self._ev("response.function_call_arguments.delta", item_id=item_id, output_index=idx,
                                    delta=p.call.arguments))
                evs.append(self._ev("response.function_call_arguments.done", item_id=item_id, output_index=idx,
                                    name=p.call.name, arguments=p.call.arguments))
                item = call_item(item_id, p.call)
                self.items.append(item)
                evs.append(self._ev("response.output_item.done", output_index=idx, item=item))
        return evs

    def end(self, fin: FinishEvent, reasoning_tokens: int) -> list[tuple[str, dict[str, Any]]]:
        evs = self._close()
        if not self.items:  # nothing was said: an empty message, as a non-streamed answer has
            evs += self._begin("message") + self._close()
        resp = self._response(fin, reasoning_tokens)
        kind = "response.incomplete" if resp["status"] == "incomplete" else "response.completed"
        return evs + [self._ev(kind, response=resp)]


# --- stored responses ----------------------------------------------------------------------

MAX_LIST_LIMIT = 100


def item_list(items: list[dict[str, Any]], args: dict[str, str]) -> dict[str, Any]:
    """GET /v1/responses/{id}/input_items: a page of items (?limit=1..100, default 20; ?order=desc,
    the default, or asc; ?after=ITEM_ID, the page after that item) as OpenAI's cursor list."""
    order = args.get("order", "desc")
    if order not in ("asc", "desc"):
        raise invalid(f"order must be asc or desc; got {order!r}")
    raw = args.get("limit", "20")
    try:
        limit = int(raw)
    except ValueError:
        raise invalid(f"limit must be an integer from 1 to {MAX_LIST_LIMIT}; got {raw!r}") from None
    if not 1 <= limit <= MAX_LIST_LIMIT:
        raise invalid(f"limit must be an integer from 1 to {MAX_LIST_LIMIT}; got {limit}")
    seq = items[::-1] if order == "desc" else list(items)
    ids = [it.get("id") for it in seq]
    after = args.get("after")
    if after is not None:
        if after not in ids:
            raise invalid(f"after: no item {after!r} among this response's input items")
        seq = seq[ids.index(after) + 1:]
    page = seq[:limit]
    return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None, "has_more": len(seq) > len(page)}
