"""Embeddings routes: OpenAI's POST /v1/embeddings, llama-server's /embedding and /embeddings
(Ollama's /api/embed and /api/embeddings live with the Ollama routes and share this parsing).

They answer for an encoder (an embedding model such as all-minilm:l6-v2); for a text-generation
model they keep the 501 not_implemented of the reference. All the inputs of one request go to the
engine as one job: one batch through the encoder.

Decisions where the peers differ or are silent:
- an empty string is embedded (an encoder sees [CLS] [SEP]), as llama-server does; an empty
  list, or an input that tokenizes to nothing, is 400;
- an input longer than the model's context is 400 context_length_exceeded (llama-server refuses
  it too, with a 500); `"truncate": true` in the body cuts it to fit instead, as Ollama's
  /api/embed does by default;
- `dimensions` must equal the model's width: none of the served encoders was trained to be cut
  short (Matryoshka), so a smaller one is 400 rather than a silently worse vector.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from flask import Blueprint

from bubo import embed as embedding
from bubo.api import errors, jsonout, offload
from bubo.api import openapi as oa
from bubo.api.errors import ApiError
from bubo.api.fields import invalid
from bubo.api.light import Plain, light
from bubo.api.request import json_body, optional_model, runtime_of, use_model
from bubo.engine.protocol import ServingEngine
from bubo.engine.types import EngineRefusal
from bubo.runtime import Runtime

blueprint = Blueprint("embeddings", __name__)

MAX_INPUTS = 2048  # OpenAI's limit on inputs per request
# tokens one request may ask for: 128 full-length inputs, about a minute of a 2-core machine (a
# client that goes away stops its request at the next forward pass)
MAX_REQUEST_TOKENS = 65536


def _is_ids(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in value)


def parse_inputs(value: Any, field: str = "input") -> list[str | list[int]]:
    """A string, a list of strings, a list of token ids, or a list of such lists: one item each."""
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list):
        raise invalid(f"'{field}' must be a string, a list of strings, a list of token ids or a list of token id "
                      f"lists, not {type(value).__name__ if value is not None else 'null'}")
    if not value:
        raise invalid(f"'{field}' must not be empty")
    if _is_ids(value):
        return [list(value)]
    if len(value) > MAX_INPUTS:
        raise invalid(f"'{field}' has {len(value)} items; at most {MAX_INPUTS} per request")
    items: list[str | list[int]] = []
    for i, x in enumerate(value):
        if isinstance(x, str):
            items.append(x)
        elif _is_ids(x) and x:
            items.append(list(x))
        else:
            raise invalid(f"'{field}[{i}]' must be a string or a non-empty list of token ids")
    return items


def _bool(body: dict[str, Any], key: str, default: bool) -> bool:
    v = body.get(key, default)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise invalid(f"'{key}' must be a boolean")
    return v


def encoder_of(name: str) -> tuple[ServingEngine, Runtime]:
    """The model's engine and runtime when it is an embedding model; 501 for a text model."""
    engine = use_model(name)
    rt = runtime_of(engine)
    if not embedding.is_encoder(rt):
        raise ApiError(501, "not_implemented", f"the model {name} is a text-generation model "
                                               f"({rt.hparams.get('arch')}): it does not serve embeddings; serve an "
                                               "embedding model (bubo serve -m all-minilm:l6-v2 --embedding)")
    return engine, rt


def run(engine: ServingEngine, rt: Runtime, items: Sequence[str | list[int]], truncate: bool,
        normalize: bool = True) -> embedding.Embedded:
    """Tokenize, check and embed one request's inputs (one job on the engine thread)."""
    try:
        seqs, cut = offload.run(embedding.tokenize, rt, items, embedding.max_tokens(rt), truncate,
                                what="tokenizing the inputs", small=offload.small(list(items)))
    except embedding.TooLongError as e:
        raise ApiError(400, "context_length_exceeded", str(e)) from None
    except EngineRefusal as e:
        raise errors.from_refusal(e) from None
    total = sum(len(s) for s in seqs)
    if total > MAX_REQUEST_TOKENS:
        raise invalid(f"the inputs have {total} tokens; one request takes at most {MAX_REQUEST_TOKENS}: split them "
                      "over several requests")
    try:
        vectors = engine.embed(seqs, None, normalize).result()
    except EngineRefusal as e:
        raise errors.from_refusal(e) from None
    return embedding.Embedded(vectors, [len(s) for s in seqs], cut)


def _dimensions(body: dict[str, Any], width: int) -> None:
    dims = body.get("dimensions")
    if dims is None:
        return
    if isinstance(dims, bool) or not isinstance(dims, int) or dims < 1:
        raise invalid("'dimensions' must be a positive integer")
    if dims != width:
        raise invalid(f"'dimensions' {dims}: this model's embeddings have {width} dimensions and it was not trained "
                      "to be cut shorter; leave 'dimensions' out")


def _encode(vec: np.ndarray, fmt: str) -> Any:
    if fmt == "base64":
        return base64.b64encode(np.asarray(vec, dtype="<f4").tobytes()).decode("ascii")
    return vec


def vectors_of(out: embedding.Embedded) -> np.ndarray:
    """The vectors as orjson writes them: float32, C-contiguous."""
    return np.ascontiguousarray(out.vectors, dtype=np.float32)


def _embedding_shapes(d: oa.Doc) -> tuple[oa.Schema, oa.Schema, tuple[int, ...]]:
    """(the input field, the 501 of a text model, the errors) of the embedding routes."""
    ids = oa.arr(oa.NAT, minItems=1)
    emb_input = oa.desc({"anyOf": [oa.STR, ids, oa.arr({"anyOf": [oa.STR, ids]}, minItems=1, maxItems=2048)]},
                        "a text, token ids, or a list of texts and token id lists (at most 2048)")
    not_embedding = oa.error(501, text="Code not_implemented: the model is a text-generation model")
    emb_errors = (400, 404, 413, 500, 507) if d.router else (400, 413, 500, 507)
    return emb_input, not_embedding, emb_errors


def _openai_doc(d: oa.Doc) -> oa.Op:
    emb_input, not_embedding, emb_errors = _embedding_shapes(d)
    return oa.Op({
        "operationId": "embeddings", "summary": "Embeddings of texts or token ids (OpenAI)", "tags": ["OpenAI"],
        "requestBody": oa.body(oa.obj({"input": emb_input, "model": d.optional_model_field(),
                                       "encoding_format": {"enum": ["float", "base64", None]},
                                       "dimensions": {"type": ["integer", "null"],
                                                      "minimum": 1}, "truncate": oa.OPT_BOOL,
                                       "user": oa.STR}, ["input"], closed=False),
                               {"input": ["Hello world", "Goodbye"]}),
        "responses": {"200": oa.ok(oa.obj({
            "object": oa.STR, "model": oa.STR,
            "data": oa.arr(oa.obj({"object": oa.STR, "index": oa.NAT, "embedding": {"anyOf": [oa.arr(oa.NUM), oa.STR]},
                                   "truncated": {"type": "boolean"}}, ["object", "index", "embedding"])),
            "usage": oa.obj({"prompt_tokens": oa.NAT, "total_tokens": oa.NAT}, ["prompt_tokens", "total_tokens"]),
        }, ["object", "data", "model", "usage"]), "One vector per input, L2-normalised (base64: little-endian "
                                   "float32)"), "501": not_embedding},
    }, emb_errors)


@oa.route(blueprint, "/v1/embeddings", methods=("POST",), doc=_openai_doc)
def openai_embeddings() -> Any:
    body = json_body()
    name = optional_model(body)
    if "input" not in body:
        raise invalid("'input' is required")
    items = offload.run(parse_inputs, body["input"], what="reading the inputs", small=offload.small(body["input"]))
    fmt, truncate = _openai_fields(body)
    engine, rt = encoder_of(name)
    _dimensions(body, int(rt.hparams["n_embd"]))
    out = run(engine, rt, items, truncate)
    return jsonout.built_arrays(*_openai_answer(name, fmt, out))


@light(openai_embeddings, "POST")
def _openai_light(plain: Plain) -> bytes | None:
    """One short text's vector from the default model, named or not (a base+adapter name is
    Flask's), asked with the route's fields only."""
    body, reg = plain.body, plain.registry
    assert body is not None
    given = body.get("model")
    if reg.is_router or (isinstance(given, str) and reg.adapter_of(given) is not None):
        return None
    text = body.get("input")
    if not isinstance(text, str) or not offload.small(text):
        return None
    engine = plain.engine()
    rt = engine.runtime if engine is not None else None
    if engine is None or rt is None or not embedding.is_encoder(rt):
        return None
    try:
        fmt, truncate = _openai_fields(body)
        _dimensions(body, int(rt.hparams["n_embd"]))
    except ApiError:
        return None
    if body.unread():
        return None
    plain.commit()  # the checks and the job's errors (a text too long, a refusal) are its answer from here
    out = run(engine, rt, [text], truncate)
    head, key, _, width, data = _openai_answer(reg.default.name, fmt, out)
    return jsonout.array_bytes(head, key, data(), width)


def _openai_fields(body: dict[str, Any]) -> tuple[str, bool]:
    """(encoding_format, truncate) of an OpenAI embeddings request."""
    fmt = body.get("encoding_format", "float")
    if fmt is None:
        fmt = "float"
    if fmt not in ("float", "base64"):
        raise invalid(f"'encoding_format' must be \"float\" or \"base64\", not {fmt!r}")
    return fmt, _bool(body, "truncate", False)


def _openai_answer(name: str, fmt: str, out: embedding.Embedded) -> tuple[
        dict[str, Any], str, int, int, Callable[[], list[dict[str, Any]]]]:
    """The answer's head, key, items, values per item and items' maker (jsonout.built_arrays's)."""
    vectors = vectors_of(out)

    def data() -> list[dict[str, Any]]:
        items = []
        for i, vec in enumerate(vectors):
            item: dict[str, Any] = {"object": "embedding", "index": i, "embedding": _encode(vec, fmt)}
            if out.truncated[i]:
                item["truncated"] = True
            items.append(item)
        return items

    n_tokens = sum(out.n_tokens)
    head = {"object": "list", "model": name, "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}}
    return head, "data", len(vectors), vectors.shape[1], data


def _normalize_of(body: dict[str, Any]) -> bool:
    """llama-server's embd_normalize: 2 (Euclidean, the default) or -1 (none); the others (max
    absolute, taxicab, p-norms) are refused rather than done differently."""
    v = body.get("embd_normalize", 2)
    if isinstance(v, bool) or not isinstance(v, int) or v not in (-1, 2):
        raise invalid("'embd_normalize' must be 2 (Euclidean, the default) or -1 (none); bubo does not do "
                      "max-absolute, taxicab or p-norm normalisation")
    return v == 2


def _llama_doc(d: oa.Doc) -> oa.Op:
    emb_input, not_embedding, emb_errors = _embedding_shapes(d)
    return oa.Op({
        "operationId": "embedding", "summary": "Embeddings (llama-server)", "tags": ["llama-server"],
        "requestBody": oa.body(oa.obj({"content": emb_input, "input": emb_input, "model": d.optional_model_field(),
                                       "embd_normalize": {"enum": [-1, 2]}, "truncate": oa.OPT_BOOL}, closed=False),
                               {"content": "Hello world"}),
        "responses": {"200": oa.ok(oa.arr(oa.obj({"index": oa.NAT, "embedding": oa.arr(oa.arr(oa.NUM))}, ["index",
                                                                                                          "embedding"])),
                                   "One entry per input: its pooled vector as a list of one row"),
                      "501": not_embedding},
    }, emb_errors)


@oa.route(blueprint, "/embedding", "/embeddings", methods=("POST",), doc=_llama_doc)
def llama_embeddings() -> Any:
    body = json_body()
    name = optional_model(body)
    key = "content" if body.get("content") is not None or "input" not in body else "input"
    if body.get(key) is None:
        raise invalid("'content' is required")
    items = offload.run(parse_inputs, body[key], key, what="reading the inputs", small=offload.small(body[key]))
    normalize = _normalize_of(body)
    truncate = _bool(body, "truncate", False)
    engine, rt = encoder_of(name)
    out = run(engine, rt, items, truncate, normalize)
    # llama-server's shape: one entry per input, its pooled vector as a list of one row
    vectors = vectors_of(out)
    return jsonout.built_arrays(None, "", len(vectors), vectors.shape[1],
                                lambda: [{"index": i, "embedding": vectors[i:i + 1]} for i in range(len(vectors))])


def ollama_embed(body: dict[str, Any], name: str, t0: float, load_s: float, engine: ServingEngine,
                 rt: Runtime) -> Any:
    """Ollama's /api/embed answer: `input` (a string or a list of strings), `truncate` (default
    true), `dimensions`."""
    if "input" not in body:
        raise invalid("'input' is required")
    truncate = _bool(body, "truncate", True)
    _dimensions(body, int(rt.hparams["n_embd"]))
    value = body["input"]
    # Ollama answers an empty string or an empty list with no embeddings, not an error
    vectors = np.zeros((0, int(rt.hparams["n_embd"])), dtype=np.float32)
    n_tokens = 0
    if not (value == "" or value == []):
        items = offload.run(parse_inputs, value, what="reading the inputs", small=offload.small(value))
        out = run(engine, rt, items, truncate)
        vectors = vectors_of(out)
        n_tokens = sum(out.n_tokens)
    total_ns = int((time.monotonic() - t0) * 1e9)
    return jsonout.built_arrays({"model": name, "total_duration": total_ns, "load_duration": int(load_s * 1e9),
                                 "prompt_eval_count": n_tokens}, "embeddings", len(vectors), vectors.shape[1],
                                lambda: vectors)
