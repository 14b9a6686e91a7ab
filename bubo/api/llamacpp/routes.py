"""llama-server's generating route, POST /completion (it needs no model field)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from flask import Blueprint, jsonify

from bubo.api import dialect as d
from bubo.api.errors import ApiError
from bubo.api.llamacpp import completion as nc
from bubo.api.request import config, json_body, ready_engine
from bubo.api.sse import sse_response
from bubo.engine.types import GenerationRequest, TokenEvent

blueprint = Blueprint("llamacpp", __name__)


def _tokens(engine: Any, prompt: str | list[Any]) -> list[int]:
    if isinstance(prompt, str) or all(isinstance(t, int) for t in prompt):
        return d.prompt_tokens(engine, prompt)
    # a mix: the first text gets BOS as a plain prompt would, the later ones none
    ids: list[int] = []
    for item in prompt:
        if isinstance(item, str):
            ids += d.encode(engine, item, add_special=not ids)
        else:
            ids += d.prompt_tokens(engine, [item])
    if not ids:
        raise d.invalid("prompt is empty")
    return ids


@blueprint.post("/completion")
@blueprint.post("/completions")  # llama-server's alias; /v1/completions is OpenAI's
def completion() -> Any:
    body = json_body()
    req = nc.parse_native_request(body)
    engine = ready_engine()
    model = config().served_model_name
    tokens = _tokens(engine, req.prompt)
    gen = GenerationRequest(tokens, req.params, req.n_predict, req.stop, req.n_probs, req.cache_prompt,
                            req.ignore_eos, req.grammar)
    stream = d.submit(engine, gen)

    def probs_of(ev: TokenEvent) -> dict[str, Any]:
        top = [(t, d.token_piece(engine, t), lp) for t, lp in ev.top[: req.n_probs]]
        return nc.probability(ev.token, d.token_piece(engine, ev.token), ev.logprob, top)

    if not req.stream:
        out = d.collect(stream, None)
        ids = [t.token for t in out.tokens]
        return jsonify(nc.native_response(
            model=model, content=out.content, fin=out.finish, tokens=ids if req.return_tokens else None,
            probs=[probs_of(t) for t in out.tokens] if req.n_probs else None,
            prompt_text=req.prompt if isinstance(req.prompt, str) else engine.tokenizer.decode(tokens),
            settings=nc.generation_settings(req, engine.n_ctx)))

    def chunks() -> Iterator[Any]:
        n = 0
        try:
            for parts, ev in d.run_events(stream, None):
                if isinstance(ev, TokenEvent):
                    n += 1
                    yield nc.native_chunk(content="".join(p.text for p in parts),
                                          tokens=[ev.token] if req.return_tokens else None, n_predicted=n,
                                          n_prompt=len(tokens), probs=[probs_of(ev)] if req.n_probs else None)
                else:
                    yield nc.native_response(
                        model=model, content="", fin=ev, tokens=None, probs=None,
                        prompt_text="", settings=nc.generation_settings(req, engine.n_ctx))
        except ApiError as e:
            yield d.stream_error(e)

    return sse_response(chunks(), stream=stream)
