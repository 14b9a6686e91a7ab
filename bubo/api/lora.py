"""LoRA adapters over HTTP, as llama-server has them (bubo/lora.py reads them; serve --lora,
--lora-scaled, --lora-init-without-apply load them with the model):

    GET  /lora-adapters   ?model=                        -> [{"id", "path", "scale"}]
    POST /lora-adapters   [{"id", "scale"}], ?model=     -> the global scales: an adapter left out is 0

A generating request's `"lora": [{"id", "scale"}]` applies those adapters at those scales to it
alone (others 0); without it the global scales apply. Requests with different adapters share a
batch, each row with its own; the prefix cache keeps each adapter set's blocks apart."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, jsonify, request

from bubo.api import openapi as oa
from bubo.api.fields import lora_field
from bubo.api.request import json_value, optional_model, runtime_of, use_model
from bubo.runtime import Runtime

blueprint = Blueprint("lora", __name__)


def _listing(rt: Runtime) -> list[dict[str, Any]]:
    return [{"id": a.id, "path": a.path, "scale": a.scale} for a in rt.adapters]


def _doc(d: oa.Doc) -> dict[str, oa.Op]:
    item = oa.obj({"id": oa.NAT, "path": oa.STR, "scale": {"type": "number"}}, ["id", "path", "scale"])
    listed = oa.Op({"operationId": "lora_adapters", "summary": "The model's LoRA adapters and their global scales",
                    "tags": ["llama-server"], "parameters": [d.model_query()],
                    "responses": {"200": {"description": "The adapters", "content": {oa.JSON: {
                        "schema": oa.arr(item)}}}}}, (404,) if d.router else ())
    scales = oa.arr(oa.obj({"id": oa.NAT, "scale": {"type": "number"}}, ["id"]))
    set_ = oa.Op({"operationId": "lora_adapters_set", "summary": "Set the adapters' global scales (left out: 0)",
                  "tags": ["llama-server"], "parameters": [d.model_query()],
                  "requestBody": {"required": True, "content": {oa.JSON: {"schema": scales,
                                                                          "example": [{"id": 0, "scale": 0.5}]}}},
                  "responses": {"200": {"description": "Set", "content": {oa.JSON: {"schema": oa.obj(
                      {"success": oa.const(True)}, ["success"])}}}}}, (400, 404) if d.router else (400,))
    return {"get": listed, "post": set_}


@oa.route(blueprint, "/lora-adapters", methods=("GET", "POST"), doc=_doc)
def lora_adapters() -> Any:
    rt = runtime_of(use_model(optional_model()))
    if request.method == "GET":
        return jsonify(_listing(rt))
    given = dict(lora_field(json_value(), len(rt.adapters), "the body"))
    for a in rt.adapters:
        a.scale = given.get(a.id, 0.0)
    return jsonify(success=True)

