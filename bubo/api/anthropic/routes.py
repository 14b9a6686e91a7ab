"""The Anthropic routes: /v1/messages and /v1/messages/count_tokens (errors in Anthropic's
shape: the app picks it by path)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from flask import Blueprint, jsonify

from bubo.api import contexts, offload, pipeline, receipts
from bubo.api import fields as f
from bubo.api import openapi as oa
from bubo.api.anthropic import messages as am
from bubo.api.errors import ApiError, StreamShape, stream_error
from bubo.api.request import config, debug_mem_available, json_body, resolve_model, runtime_of, use_model
from bubo.api.sse import sse_response
from bubo.engine.types import FinishEvent

blueprint = Blueprint("anthropic", __name__)


def _messages_doc(d: oa.Doc) -> oa.Op:
    return oa.Op({
        "operationId": "messages", "summary": "Messages (Anthropic)", "tags": ["Anthropic"],
        "requestBody": oa.body(oa.messages_request(d.model_field()), {"model": d.example_model, "max_tokens": 8,
                                                                      "messages": [{"role": "user",
                                                                                    "content": "Say hi."}]}),
        "responses": {"200": oa.ok(oa.ref("Message"), "The message.", oa.sse_data(oa.ref("MessageStreamEvent"),
                                                                                  named=True),
                                   "named events: message_start, ping, content_block_start/delta/stop, "
                                   "message_delta, message_stop; an error after the 200 is an `error` event.")},
    }, oa.GEN_ERRORS, anthropic=True)


@oa.route(blueprint, "/v1/messages", methods=("POST",), doc=_messages_doc)
def messages() -> Any:
    body = json_body()
    model = resolve_model(body)
    req = offload.run(am.parse_messages_request, body, what="reading the request's fields")
    rec = receipts.ask(body)
    engine = use_model(model)
    _, prep, stream = pipeline.start_chat(engine, req, stop=req.stop, mem_available=debug_mem_available(),
                                          context=contexts.for_chat(engine, body),
                                          specials_in_content=config().allow_special_in_content)
    id = f.new_id("msg_")

    if not req.stream:
        out = pipeline.collect(stream, prep.parser)
        return jsonify({**am.message_response(id=id, model=model, out=out), **receipts.field(rec)})

    def events() -> Iterator[Any]:
        m = am.MessageEvents(id, model)
        yield from m.start(len(prep.prompt.tokens))
        try:
            for parts, ev in pipeline.run_events(stream, prep.parser, stream.end):
                yield from m.parts(parts)
                if isinstance(ev, FinishEvent):
                    end = m.end(ev)
                    end[-2][1].update(receipts.field(rec))  # message_delta: the last event with a content
                    yield from end
        except ApiError as e:
            yield stream_error(StreamShape.ANTHROPIC, e)

    return sse_response(events(), stream=stream, shape=StreamShape.ANTHROPIC)


def _count_tokens_doc(d: oa.Doc) -> oa.Op:
    return oa.Op({
        "operationId": "count_tokens", "summary": "The prompt's tokens for a Messages request (Anthropic)",
        "tags": ["Anthropic"],
        "requestBody": oa.body(oa.messages_request(d.model_field(), count_only=True),
                               {"model": d.example_model, "messages": [{"role": "user", "content": "Say hi."}]}),
        "responses": {"200": {"description": "The token count of the rendered prompt (it may exceed the context)",
                              "content": {oa.JSON: {"schema": oa.obj({"input_tokens": oa.NAT}, ["input_tokens"])}}}},
    }, (400, 404, 413, 507), anthropic=True)


@oa.route(blueprint, "/v1/messages/count_tokens", methods=("POST",), doc=_count_tokens_doc)
def count_tokens() -> Any:
    body = json_body()
    model = resolve_model(body)
    req = offload.run(am.parse_messages_request, body, count_only=True, what="reading the request's fields")
    rt = runtime_of(use_model(model))
    prompt = pipeline.render_chat(rt, req.messages, req.tools, req.template_kwargs, req.prefill,
                                  config().allow_special_in_content)
    return jsonify({"input_tokens": len(prompt.tokens)})
