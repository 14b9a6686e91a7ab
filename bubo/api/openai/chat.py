"""POST /v1/chat/completions: the request's fields and the response's shapes (pure functions)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from bubo import limits
from bubo.api import fields as f
from bubo.api.fields import invalid
from bubo.api.llamacpp.shapes import timings_json
from bubo.api.pipeline import Conversation, Output, render_chat, steered
from bubo.chat.parsers import Part, ToolCall
from bubo.chat.prepare import Prompt
from bubo.chat.request import assistant_message, chat_finish_reason
from bubo.engine.types import FinishEvent, TokenEvent
from bubo.runtime import Runtime


@dataclass
class ChatRequest(Conversation):
    """A validated chat request, before rendering (which needs the model)."""

    stop: list[str]
    include_usage: bool
    logprobs: bool
    top_logprobs: int
    cache_prompt: bool = True
    extra: dict[str, Any] = field(default_factory=dict)


def cut_last_word(text: str) -> str:
    """text up to the whitespace before its last word (which may still grow)."""
    body = text.rstrip()
    i = max(body.rfind(" "), body.rfind("\n"), body.rfind("\t"))
    return body[:i] if i > 0 else ""


def without_last_word(conv: ChatRequest) -> ChatRequest:
    """conv with its last message (or its assistant prefill) cut before its last word: the part
    of a prompt still being typed that its next keystrokes cannot change."""
    if conv.prefill is not None:
        return dataclasses.replace(conv, prefill=cut_last_word(conv.prefill))
    last = dict(conv.messages[-1])
    if isinstance(last.get("content"), str):
        last["content"] = cut_last_word(last["content"])
    return dataclasses.replace(conv, messages=[*conv.messages[:-1], last])


def parse_chat_request(body: Any) -> ChatRequest:
    """Every validation rule of the reference, in its order: messages, n, limits, thinking."""
    body = f.require_object(body)
    messages, prefill = f.chat_messages(body.get("messages"))
    f.check_n(body)
    output = f.output_spec(body)
    max_tokens = f.max_tokens_of(body, "max_completion_tokens", "max_tokens")
    thinking, kwargs = f.thinking_of(body)
    tools = f.chat_tools(body.get("tools"))
    choice = body.get("tool_choice")
    fn = choice.get("function") if isinstance(choice, dict) else None
    named = fn.get("name") if isinstance(fn, dict) else None
    tools, forced = f.openai_tool_choice(choice, tools, named, '{"type": "function", "function": {"name": ...}}')
    logprobs = f.bool_field(body, "logprobs", False)
    top_logprobs = f.n_probs_of(body, "top_logprobs")
    if top_logprobs > limits.MAX_TOP_LOGPROBS:
        raise invalid(f"top_logprobs must be at most {limits.MAX_TOP_LOGPROBS}, got {top_logprobs}")
    n_probs = max(top_logprobs if logprobs else 0, f.n_probs_of(body))
    opts = body.get("stream_options")
    if opts is not None and not isinstance(opts, dict):
        raise invalid("stream_options must be an object")
    f.check_forced_call_alone(forced, output)
    return ChatRequest(
        messages=messages, prefill=prefill, tools=tools, thinking=thinking, template_kwargs=kwargs,
        params=f.sampling_params(body, n_probs), max_tokens=max_tokens,
        stop=f.stop_list(body.get("stop")), stream=f.bool_field(body, "stream", False),
        include_usage=bool((opts or {}).get("include_usage")), logprobs=logprobs, top_logprobs=top_logprobs,
        cache_prompt=f.bool_field(body, "cache_prompt", True),
        parallel_tool_calls=f.bool_field(body, "parallel_tool_calls", False), tool_choice=forced, output=output,
        reasoning_format=f.reasoning_format_of(body),
    )


# --- shapes --------------------------------------------------------------------------------


def usage(fin: FinishEvent) -> dict[str, Any]:
    return {
        "prompt_tokens": fin.prompt_tokens,
        "completion_tokens": fin.completion_tokens,
        "total_tokens": fin.prompt_tokens + fin.completion_tokens,
        "prompt_tokens_details": cache_details(fin, "cached_tokens"),
        "prompt_tokens_per_second": fin.timings.prompt_per_second,
        "completion_tokens_per_second": fin.timings.predicted_per_second,
        **draft_details(fin),
    }


def draft_details(fin: FinishEvent) -> dict[str, Any]:
    """Speculative decoding's drafted tokens in OpenAI's words for predicted tokens: those the
    answer kept and those it refused (absent when nothing was drafted)."""
    t = fin.timings
    if not t.draft_n:
        return {}
    return {"completion_tokens_details": {"accepted_prediction_tokens": t.draft_n_accepted,
                                          "rejected_prediction_tokens": t.draft_n - t.draft_n_accepted}}


def cache_details(fin: FinishEvent, key: str) -> dict[str, Any]:
    """{key: prompt tokens reused from the prefix cache}, plus cache_miss_reason (bubo's own
    field) when some prompt tokens that could have been reused were not."""
    out: dict[str, Any] = {key: fin.cached_tokens}
    miss = fin.timings.cache_miss
    if miss:
        out["cache_miss_reason"] = miss
    return out


def finish_reason(fin: FinishEvent, n_calls: int) -> str:
    """"tool_calls" when the answer made calls, but "length" when max_tokens cut it (its
    complete calls are kept, the cut one dropped): bubo.chat.request.chat_finish_reason."""
    return chat_finish_reason(fin.reason, n_calls)


def tool_call_json(call: ToolCall) -> dict[str, Any]:
    return call.to_dict()


def logprob_entry(piece: bytes, logprob: float, top: list[tuple[bytes, float]]) -> dict[str, Any]:
    """OpenAI's per-token log probability: the token's text, its bytes, its alternatives."""
    def one(b: bytes, lp: float) -> dict[str, Any]:
        return {"token": b.decode("utf-8", "replace"), "logprob": lp, "bytes": list(b)}

    return {**one(piece, logprob), "top_logprobs": [one(b, lp) for b, lp in top]}


def chat_response(*, id: str, created: int, model: str, out: Output,
                  logprobs: list[dict[str, Any]] | None) -> dict[str, Any]:
    fin = out.finish
    assert fin is not None
    message = assistant_message(out.reasoning, out.content, out.tool_calls)
    return {
        "id": id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [{
            "index": 0,
            "message": message,
            "logprobs": {"content": logprobs} if logprobs is not None else None,
            "finish_reason": finish_reason(fin, len(out.tool_calls)),
            **steered(fin),
        }],
        "usage": usage(fin),
        "timings": timings_json(fin.timings),
    }


class ChatChunks:
    """The chunks of a streamed chat answer: the role chunk, one chunk per parsed part, the last
    chunk with finish_reason and timings, the usage chunk."""

    def __init__(self, id: str, created: int, model: str):
        self.id, self.created, self.model = id, created, model
        self.n_calls = 0

    def _chunk(self, delta: dict[str, Any], finish: str | None = None,
               logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        return {
            "id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
            "choices": [{"index": 0, "delta": delta,
                         "logprobs": {"content": logprobs} if logprobs else None,
                         "finish_reason": finish}],
        }

    def role(self) -> dict[str, Any]:
        return self._chunk({"role": "assistant", "content": None})

    def parts(self, parts: list[Part], logprobs: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
        chunks = []
        for p in parts:
            if p.kind == "reasoning":
                chunks.append(self._chunk({"reasoning_content": p.text}))
            elif p.kind == "content":
                chunks.append(self._chunk({"content": p.text}))
            elif p.call is not None:
                i = self.n_calls
                self.n_calls += 1
                # the call's id, type and name first, its arguments after, as OpenAI streams them
                chunks.append(self._chunk({"tool_calls": [{"index": i, "id": p.call.id, "type": "function",
                                                           "function": {"name": p.call.name, "arguments": ""}}]}))
                chunks.append(self._chunk({"tool_calls": [{"index": i,
                                                           "function": {"arguments": p.call.arguments}}]}))
        if logprobs:
            if chunks:
                chunks[-1]["choices"][0]["logprobs"] = {"content": logprobs}
            else:
                chunks.append(self._chunk({}, logprobs=logprobs))
        return chunks

    def last(self, fin: FinishEvent) -> dict[str, Any]:
        c = self._chunk({}, finish_reason(fin, self.n_calls))
        c["choices"][0].update(steered(fin))
        c["timings"] = timings_json(fin.timings)
        return c

    def usage(self, fin: FinishEvent) -> dict[str, Any]:
        return {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                "choices": [], "usage": usage(fin)}


def token_logprobs(runtime: Runtime, ev: TokenEvent, n_top: int) -> dict[str, Any]:
    top = [(runtime.token_piece(t), lp) for t, lp in ev.top[:n_top]]
    return logprob_entry(runtime.token_piece(ev.token), ev.logprob, top)


def render_request(runtime: Runtime, req: ChatRequest, specials_in_content: bool = False) -> Prompt:
    """The prompt a chat request becomes (what /apply-template shows, what generation runs):
    the converted messages through the model's template, a prefill appended (a forced call is a
    grammar on the answer, not prompt text)."""
    return render_chat(runtime, req.messages, req.tools, req.template_kwargs, req.prefill, specials_in_content)


def apply_template(runtime: Runtime, body: Any, specials_in_content: bool = False) -> str:
    """What POST /apply-template answers: the prompt text a chat body becomes, exactly as
    /v1/chat/completions renders it (stream is ignored; model is not needed)."""
    return render_request(runtime, parse_chat_request(body), specials_in_content).text


def apply_template_json(runtime: Runtime, body: Any, specials_in_content: bool = False) -> dict[str, Any]:
    """/apply-template's answer: {"prompt": text}, and "text_spans" ([start, end] characters)
    where the prompt holds control-token text from the request, which is tokenized as text."""
    prompt = render_request(runtime, parse_chat_request(body), specials_in_content)
    out: dict[str, Any] = {"prompt": prompt.text}
    if prompt.spans:
        out["text_spans"] = [list(s) for s in prompt.spans]
    return out
