"""The OpenAI routes: thin wrappers that validate (chat.py, completions.py), submit to the
engine and shape the events."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from flask import Blueprint, jsonify

from bubo.api import dialect as d
from bubo.api.errors import ApiError
from bubo.api.openai import chat as ch
from bubo.api.openai import completions as cm
from bubo.api.openai import responses as rs
from bubo.api.request import json_body, ready_engine, resolve_model
from bubo.api.sse import sse_response
from bubo.engine.types import FinishEvent, GenerationRequest, TokenEvent

blueprint = Blueprint("openai", __name__)


# --- chat ----------------------------------------------------------------------------------


@blueprint.post("/v1/chat/completions")
@blueprint.post("/chat/completions")
def chat_completions() -> Any:
    body = json_body()
    model = resolve_model(body)
    req = ch.parse_chat_request(body)
    engine = ready_engine()
    prompt = ch.render_request(engine, req)
    grammar, parser = d.constrain(engine, req, prompt.in_think)
    gen = GenerationRequest(prompt.tokens, req.params, req.max_tokens, req.stop, req.params.n_probs,
                            req.cache_prompt, grammar=grammar)
    stream = d.submit(engine, gen)
    id, created = d.new_id("chatcmpl-"), d.now()
    n_top = req.top_logprobs

    if not req.stream:
        out = d.collect(stream, parser)
        lps = [ch.token_logprobs(engine, t, n_top) for t in out.tokens] if req.logprobs else None
        return jsonify(ch.chat_response(id=id, created=created, model=model, out=out, logprobs=lps))

    def chunks() -> Iterator[Any]:
        c = ch.ChatChunks(id, created, model)
        yield c.role()
        try:
            for parts, ev in d.run_events(stream, parser):
                lps = [ch.token_logprobs(engine, ev, n_top)] if req.logprobs and isinstance(ev, TokenEvent) else None
                yield from c.parts(parts, lps)
                if isinstance(ev, FinishEvent):
                    yield c.last(ev)
                    if req.include_usage:
                        yield c.usage(ev)
        except ApiError as e:
            yield d.stream_error(e)
        yield "[DONE]"

    return sse_response(chunks(), stream=stream)


# --- completions ---------------------------------------------------------------------------


@blueprint.post("/v1/completions")
def completions() -> Any:
    body = json_body()
    model = resolve_model(body)
    req = cm.parse_completion_request(body)
    engine = ready_engine()
    tokens = d.prompt_tokens(engine, req.prompt)
    gen = GenerationRequest(tokens, req.params, req.max_tokens, req.stop, req.params.n_probs, req.cache_prompt,
                            grammar=d.grammar_of(body))
    stream = d.submit(engine, gen)
    id, created = d.new_id("cmpl-"), d.now()
    echo = (req.prompt if isinstance(req.prompt, str) else engine.tokenizer.decode(tokens)) if req.echo else ""

    def lp_entry(ev: TokenEvent) -> tuple[str, float, dict[str, float]]:
        def text(t: int) -> str:
            return d.token_piece(engine, t).decode("utf-8", "replace")

        return text(ev.token), ev.logprob, {text(t): lp for t, lp in ev.top[: req.logprobs or 0]}

    if not req.stream:
        out = d.collect(stream, None)
        lps = cm.completion_logprobs([lp_entry(t) for t in out.tokens], len(echo)) if req.logprobs is not None else None
        return jsonify(cm.completion_response(id=id, created=created, model=model, text=echo + out.content,
                                              fin=out.finish, logprobs=lps))

    def chunks() -> Iterator[Any]:
        offset = 0
        if echo:
            yield cm.completion_chunk(id=id, created=created, model=model, text=echo)
            offset = len(echo)
        try:
            for parts, ev in d.run_events(stream, None):
                if isinstance(ev, TokenEvent):
                    text = "".join(p.text for p in parts)
                    lps = cm.completion_logprobs([lp_entry(ev)], offset) if req.logprobs is not None else None
                    if text or lps:
                        yield cm.completion_chunk(id=id, created=created, model=model, text=text, logprobs=lps)
                    offset += len(text)
                else:
                    last = cm.completion_chunk(id=id, created=created, model=model, text="", finish=ev.reason)
                    last["timings"] = ev.timings
                    yield last
                    if req.include_usage:
                        u = cm.completion_chunk(id=id, created=created, model=model, text="")
                        u["choices"] = []
                        u["usage"] = ch.usage(ev)
                        yield u
        except ApiError as e:
            yield d.stream_error(e)
        yield "[DONE]"

    return sse_response(chunks(), stream=stream)


# --- responses -----------------------------------------------------------------------------


@blueprint.post("/v1/responses")
@blueprint.post("/responses")
def responses() -> Any:
    body = json_body()
    model = resolve_model(body)
    req = rs.parse_responses_request(body)
    engine = ready_engine()
    prompt = d.render_chat(engine, req.messages, req.tools, req.template_kwargs, req.prefill)
    grammar, parser = d.constrain(engine, req, prompt.in_think)
    stream = d.submit(engine, GenerationRequest(prompt.tokens, req.params, req.max_tokens, grammar=grammar))
    id, created = d.new_id("resp_"), d.now()

    def reasoning_tokens(text: str) -> int:
        return len(engine.tokenizer.encode(text, add_special=False)) if text else 0

    if not req.stream:
        out = d.collect(stream, parser)
        return jsonify(rs.response_object(id=id, created=created, model=model, req=req, output=rs.output_items(out),
                                          fin=out.finish, reasoning_tokens=reasoning_tokens(out.reasoning)))

    def events() -> Iterator[Any]:
        r = rs.ResponseEvents(id, created, model, req)
        yield from r.start()
        reasoning = ""
        try:
            for parts, ev in d.run_events(stream, parser):
                reasoning += "".join(p.text for p in parts if p.kind == "reasoning")
                yield from r.parts(parts)
                if isinstance(ev, FinishEvent):
                    yield from r.end(ev, reasoning_tokens(reasoning))
        except ApiError as e:
            yield ("error", {"type": "error", "code": e.code, "message": e.message, "param": None,
                             "sequence_number": r.seq})

    return sse_response(events(), stream=stream)
