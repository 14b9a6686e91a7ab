"""The Anthropic routes: /v1/messages and /v1/messages/count_tokens (errors in Anthropic's
shape: the app picks it by path)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from flask import Blueprint, jsonify

from bubo.api import dialect as d
from bubo.api.anthropic import messages as am
from bubo.api.errors import ApiError
from bubo.api.request import json_body, ready_engine, resolve_model
from bubo.api.sse import sse_response
from bubo.engine.types import FinishEvent, GenerationRequest

blueprint = Blueprint("anthropic", __name__)


@blueprint.post("/v1/messages")
def messages() -> Any:
    body = json_body()
    model = resolve_model(body)
    req = am.parse_messages_request(body)
    engine = ready_engine()
    prompt = d.render_chat(engine, req.messages, req.tools, req.template_kwargs, req.prefill)
    grammar, parser = d.constrain(engine, req, prompt.in_think)
    stream = d.submit(engine, GenerationRequest(prompt.tokens, req.params, req.max_tokens, req.stop, grammar=grammar))
    id = d.new_id("msg_")

    if not req.stream:
        return jsonify(am.message_response(id=id, model=model, out=d.collect(stream, parser)))

    def events() -> Iterator[Any]:
        m = am.MessageEvents(id, model)
        yield from m.start(len(prompt.tokens))
        try:
            for parts, ev in d.run_events(stream, parser):
                yield from m.parts(parts)
                if isinstance(ev, FinishEvent):
                    yield from m.end(ev)
        except ApiError as e:
            yield ("error", {"type": "error", "error": {"type": "api_error" if e.status >= 500 else "invalid_request_error",
                                                        "message": e.message, "code": e.code}})

    return sse_response(events(), stream=stream)


@blueprint.post("/v1/messages/count_tokens")
def count_tokens() -> Any:
    body = json_body()
    resolve_model(body)
    req = am.parse_messages_request(body, count_only=True)
    engine = ready_engine()
    prompt = d.render_chat(engine, req.messages, req.tools, req.template_kwargs, req.prefill)
    return jsonify({"input_tokens": len(prompt.tokens)})
