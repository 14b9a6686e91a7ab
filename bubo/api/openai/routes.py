"""The OpenAI routes: thin wrappers that parse (chat.py, completions.py, responses.py), run the
pipeline (bubo/api/pipeline.py) and shape the events."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

from flask import Blueprint, jsonify, request

from bubo.api import callers, contexts, jsonout, offload, pipeline, receipts
from bubo.api import fields as f
from bubo.api import openapi as oa
from bubo.api.errors import ApiError, StreamShape, stream_error
from bubo.api.llamacpp.shapes import timings_json
from bubo.api.openai import chat as ch
from bubo.api.openai import completions as cm
from bubo.api.openai import responses as rs
from bubo.api.openai.stored import Stored
from bubo.api.request import (
    config,
    debug_mem_available,
    json_body,
    optional_model,
    resolve_model,
    response_store,
    runtime_of,
    small_body,
    use_model,
)
from bubo.api.sse import sse_response
from bubo.engine.types import FinishEvent, GenerationRequest, Timings, TokenEvent

blueprint = Blueprint("openai", __name__)
log = logging.getLogger("bubo.api")


# --- chat ----------------------------------------------------------------------------------


def _chat_doc(d: oa.Doc) -> oa.Op:
    chat_stream = oa.sse_data({"anyOf": [oa.ref("ChatCompletionChunk"), oa.ref("Error")]}, done=True)
    return oa.Op({
        "operationId": "chat_completions", "summary": "Chat (OpenAI)", "tags": ["OpenAI"],
        "requestBody": oa.body(oa.chat_request(d.model_field()), d.chat_example()),
        "responses": {"200": oa.ok(oa.ref("ChatCompletion"), "The answer.", chat_stream,
                                   "chat.completion.chunk events, then `data: [DONE]`; an error after the 200 is an "
                                   "event with the error object, then [DONE].")},
    }, oa.GEN_ERRORS)


@oa.route(blueprint, "/v1/chat/completions", "/chat/completions", methods=("POST",), doc=_chat_doc)
def chat_completions() -> Any:
    body = json_body()
    model = resolve_model(body)
    req = offload.run(ch.parse_chat_request, body, what="reading the request's fields", small=small_body(body))
    draft_max = f.draft_max_of(body)
    rec = receipts.ask(body)
    engine = use_model(model)
    rt, prep, stream = pipeline.start_chat(engine, req, stop=req.stop, n_probs=req.params.n_probs,
                                           context=contexts.for_chat(engine, body),
                                           draft_max=draft_max,
                                           cache_prompt=req.cache_prompt, mem_available=debug_mem_available(),
                                           specials_in_content=config().allow_special_in_content)
    id, created = f.new_id("chatcmpl-"), f.now()
    n_top = req.top_logprobs

    if not req.stream:
        out = pipeline.collect(stream, prep.parser)
        receipt = receipts.field(rec)

        def answer() -> dict[str, Any]:
            lps = [ch.token_logprobs(rt, t, n_top) for t in out.tokens] if req.logprobs else None
            return {**ch.chat_response(id=id, created=created, model=model, out=out, logprobs=lps), **receipt}

        return jsonout.built(answer, small=offload.small_n(len(out.tokens) * (1 + (n_top or 0))))

    def chunks() -> Iterator[Any]:
        c = ch.ChatChunks(id, created, model)
        yield c.role()
        try:
            for parts, ev in pipeline.run_events(stream, prep.parser, stream.end):
                lps = [ch.token_logprobs(rt, ev, n_top)] if req.logprobs and isinstance(ev, TokenEvent) else None
                yield from c.parts(parts, lps)
                if isinstance(ev, FinishEvent):
                    yield {**c.last(ev), **receipts.field(rec)}
                    if req.include_usage:
                        yield c.usage(ev)
        except ApiError as e:
            yield stream_error(StreamShape.OPENAI, e)
        yield "[DONE]"

    return sse_response(chunks(), stream=stream)


# --- prefill -------------------------------------------------------------------------------


def _prefill_doc(d: oa.Doc) -> oa.Op:
    ok = oa.obj({"object": oa.const("prefill"), "cached_tokens": oa.NAT, "timings": oa.ref("Timings")},
                ["object", "cached_tokens", "timings"])
    return oa.Op({
        "operationId": "prefill", "summary": "Read a conversation into the cache while its last message is typed",
        "tags": ["OpenAI"],
        "requestBody": oa.body(oa.chat_request(d.model_field(), model_required=False), d.chat_example()),
        "responses": {"200": {"description": "Done, or ended by a newer prefill or by a request; cached_tokens: "
                                             "the conversation's tokens the cache now holds, as far as it read",
                              "content": {oa.JSON: {"schema": ok}}}},
    }, oa.GEN_ERRORS)


@oa.route(blueprint, "/v1/prefill", "/prefill", methods=("POST",), doc=_prefill_doc)
def prefill() -> Any:
    """The body of the chat completion that will follow, its last message still being typed: the
    prompt up to just before that message's last word is read into the prefix cache (whole blocks,
    on a free slot), so that the completion reads only what is new. It answers once read, or as
    soon as a newer prefill or any other request comes in (at the end of the batch it is in)."""
    body = json_body()
    model = optional_model(body)
    req = offload.run(ch.parse_chat_request, body, what="reading the request's fields")
    engine = use_model(model)
    rt = runtime_of(engine)
    specials = config().allow_special_in_content
    full = pipeline.prepare(rt, req, specials).prompt.tokens
    cut = pipeline.prepare(rt, ch.without_last_word(req), specials).prompt.tokens
    n = 0  # what the last word, whatever it grows into, cannot change
    while n < min(len(full), len(cut)) and full[n] == cut[n]:
        n += 1
    if n == 0:
        return jsonify(object="prefill", cached_tokens=0, timings=timings_json(Timings()))
    out = pipeline.collect(pipeline.submit(engine, GenerationRequest(full[:n], prefill=True),
                                           debug_mem_available()), None)
    fin = out.finished
    return jsonify(object="prefill", cached_tokens=fin.prefilled, timings=timings_json(fin.timings))


# --- completions ---------------------------------------------------------------------------


def _completions_doc(d: oa.Doc) -> oa.Op:
    return oa.Op({
        "operationId": "completions", "summary": "Text completion (OpenAI)", "tags": ["OpenAI"],
        "requestBody": oa.body(oa.completions_request(d.model_field()),
                               {"model": d.example_model, "prompt": "The capital of France is", "max_tokens": 8}),
        "responses": {"200": oa.ok(oa.ref("TextCompletion"), "The completion.",
                                   oa.sse_data({"anyOf": [oa.ref("TextCompletionChunk"), oa.ref("Error")]}, done=True),
                                   "text_completion chunks, then `data: [DONE]`.")},
    }, oa.GEN_ERRORS)


@oa.route(blueprint, "/v1/completions", methods=("POST",), doc=_completions_doc)
def completions() -> Any:
    body = json_body()
    model = resolve_model(body)
    req = offload.run(cm.parse_completion_request, body, what="reading the request's fields", small=small_body(body))
    draft_max = f.draft_max_of(body)
    rec = receipts.ask(body)
    engine = use_model(model)
    rt = runtime_of(engine)
    tokens, ctx, claimed = contexts.continued(engine, rt, body, req.prompt, pipeline.prompt_tokens)
    gen = GenerationRequest(tokens, req.params, req.max_tokens, req.stop, req.params.n_probs, req.cache_prompt,
                            grammar=pipeline.completion_grammar(req.output, rt), draft_max=draft_max, **ctx)
    stream = contexts.submit(engine, gen, claimed)
    id, created = f.new_id("cmpl-"), f.now()
    try:  # token ids are decoded once the engine has checked them; a failure here frees the slot
        echo = (req.prompt if isinstance(req.prompt, str)
                else pipeline.offloaded(rt.tokenizer.decode, tokens, what="detokenizing the prompt")) \
            if req.echo else ""
    except BaseException:
        stream.cancel()
        raise

    def lp_entry(ev: TokenEvent) -> tuple[str, float, dict[str, float]]:
        def text(t: int) -> str:
            return rt.token_piece(t).decode("utf-8", "replace")

        return text(ev.token), ev.logprob, {text(t): lp for t, lp in ev.top[: req.logprobs or 0]}

    if not req.stream:
        out = pipeline.collect(stream, None)
        receipt = receipts.field(rec)

        def answer() -> dict[str, Any]:
            lps = cm.completion_logprobs([lp_entry(t) for t in out.tokens], len(echo)) \
                if req.logprobs is not None else None
            return {**cm.completion_response(id=id, created=created, model=model, text=echo + out.content,
                                             fin=out.finished, logprobs=lps), **receipt}

        return jsonout.built(answer, small=offload.small_n(len(echo) + len(out.tokens) * (1 + (req.logprobs or 0))))

    def chunks() -> Iterator[Any]:
        offset = 0
        if echo:
            yield cm.completion_chunk(id=id, created=created, model=model, text=echo)
            offset = len(echo)
        try:
            for parts, ev in pipeline.run_events(stream, None):
                if isinstance(ev, TokenEvent):
                    text = "".join(p.text for p in parts)
                    lps = cm.completion_logprobs([lp_entry(ev)], offset) if req.logprobs is not None else None
                    if text or lps:
                        yield cm.completion_chunk(id=id, created=created, model=model, text=text, logprobs=lps)
                    offset += len(text)
                elif isinstance(ev, FinishEvent):
                    yield {**cm.last_chunk(id=id, created=created, model=model, fin=ev), **receipts.field(rec)}
                    if req.include_usage:
                        yield cm.usage_chunk(id=id, created=created, model=model, fin=ev)
        except ApiError as e:
            yield stream_error(StreamShape.OPENAI, e)
        yield "[DONE]"

    return sse_response(chunks(), stream=stream)


# --- responses -----------------------------------------------------------------------------


def _responses_doc(d: oa.Doc) -> oa.Op:
    return oa.Op({
        "operationId": "responses", "summary": "Responses (OpenAI); stored unless store is false", "tags": ["OpenAI"],
        "requestBody": oa.body(oa.responses_request(d.model_field()),
                               {"model": d.example_model, "input": "Say hi.", "max_output_tokens": 8}),
        "responses": {"200": oa.ok(oa.ref("Response"), "The response.",
                                   oa.sse_data(oa.ref("ResponseStreamEvent"), named=True),
                                   "named events (response.created ... response.completed or response.incomplete); "
                                   "an error after the 200 is an `error` event.")},
    }, oa.GEN_ERRORS)


@oa.route(blueprint, "/v1/responses", "/responses", methods=("POST",), doc=_responses_doc)
def responses() -> Any:
    body = json_body()
    model = resolve_model(body)
    prev_id = rs.previous_id(body)
    previous = _stored(prev_id) if prev_id is not None else None
    req = offload.run(rs.parse_responses_request, body, previous, what="reading the request's fields")
    rec = receipts.ask(body)
    engine = use_model(model)
    rt, prep, stream = pipeline.start_chat(engine, req, mem_available=debug_mem_available(),
                                           context=contexts.for_chat(engine, body),
                                           specials_in_content=config().allow_special_in_content)
    id, created = f.new_id("resp_"), f.now()
    store = response_store() if req.store else None
    owner = callers.caller()

    def reasoning_tokens(text: str) -> int:
        return len(rt.tokenizer.encode(text, add_special=False)) if text else 0

    def keep(resp: dict[str, Any]) -> None:
        if store is not None:
            store.put(Stored(resp, req.items, owner))

    if not req.stream:
        out = pipeline.collect(stream, prep.parser)
        resp = {**rs.response_object(id=id, created=created, model=model, req=req, output=rs.output_items(out),
                                     fin=out.finish, reasoning_tokens=reasoning_tokens(out.reasoning)),
                **receipts.field(rec)}
        keep(resp)
        return jsonify(resp)

    def events() -> Iterator[Any]:
        r = rs.ResponseEvents(id, created, model, req)
        yield from r.start()
        reasoning = ""
        try:
            for parts, ev in pipeline.run_events(stream, prep.parser, stream.end):
                reasoning += "".join(p.text for p in parts if p.kind == "reasoning")
                yield from r.parts(parts)
                if isinstance(ev, FinishEvent):
                    end = r.end(ev, reasoning_tokens(reasoning))
                    end[-1][1]["response"].update(receipts.field(rec))
                    keep(end[-1][1]["response"])  # stored before the client reads that it is done
                    yield from end
        except ApiError as e:
            yield stream_error(StreamShape.RESPONSES, e, r.seq)
        except Exception as e:  # noqa: BLE001 - a bug: still the next sequence number (sse's fallback has none)
            log.exception("a Responses stream failed")
            yield stream_error(StreamShape.RESPONSES, ApiError(500, "internal_error",
                                                               f"internal error: {type(e).__name__}: {e}"), r.seq)

    return sse_response(events(), stream=stream, shape=StreamShape.RESPONSES)


# --- stored responses ----------------------------------------------------------------------


def _stored(id: str) -> Stored:
    """The caller's stored response (another caller's is as unknown as one never stored)."""
    rec = response_store().get(id, callers.caller())
    if rec is None:
        raise ApiError(404, "response_not_found", f"no stored response with id {id!r}: it was never stored "
                                                  "(store: false), was deleted, or was dropped as the least "
                                                  "recently used (--responses-max)")
    return rec


def _stored_doc(summary: str, operation: str, schema: oa.Schema, query: list[oa.Schema] | None = None
                ) -> Callable[[oa.Doc], oa.Op]:
    def doc(d: oa.Doc) -> oa.Op:
        return oa.Op({
            "operationId": operation, "summary": summary, "tags": ["OpenAI"],
            "parameters": [oa.path_param("response_id", "a stored response's id (resp_...)"), *(query or [])],
            "responses": {"200": {"description": summary, "content": {oa.JSON: {"schema": schema}}},
                          "404": oa.error(404, text="Code response_not_found: never stored, deleted, or dropped")},
        }, (400,) if query else ())
    return doc


@oa.route(blueprint, "/v1/responses/<response_id>", "/responses/<response_id>",
          doc=_stored_doc("A stored response", "get_response", oa.ref("Response")))
def get_response(response_id: str) -> Any:
    return jsonify(_stored(response_id).response)


@oa.route(blueprint, "/v1/responses/<response_id>", "/responses/<response_id>", methods=("DELETE",),
          doc=_stored_doc("Delete a stored response", "delete_response",
                          oa.obj({"id": oa.STR, "object": oa.const("response"), "deleted": oa.const(True)},
                                 ["id", "object", "deleted"])))
def delete_response(response_id: str) -> Any:
    if not response_store().delete(response_id, callers.caller()):
        _stored(response_id)  # the 404
    return jsonify(id=response_id, object="response", deleted=True)


@oa.route(blueprint, "/v1/responses/<response_id>/input_items", "/responses/<response_id>/input_items",
          doc=_stored_doc("A stored response's input items: its conversation up to it", "response_input_items",
                          oa.ref("ResponseItemList"), oa.item_list_params()))
def response_input_items(response_id: str) -> Any:
    return jsonify(rs.item_list(_stored(response_id).items, request.args.to_dict()))
