"""`GET /` (what is running, for a person; the chat page for a browser) and `GET /openapi.json`
(the server's own description, assembled from its routes' declarations: bubo/api/openapi.py).

`GET /` needs no API key (as llama-server's and Ollama's `/`): a browser must be able to open it
before it has a key. Without a valid key on a server that has keys, it says only that bubo is
running, that a key is needed and where the description is; the model names are for clients
with the key, as on every other route."""

from __future__ import annotations

import html
import re
from typing import Any

from flask import Blueprint, Response, current_app, jsonify, request

import bubo
from bubo.api import errors
from bubo.api import openapi as oa
from bubo.api.auth import check_api_key
from bubo.api.config import ServerConfig
from bubo.api.request import config, models
from bubo.engine.registry import DEFAULT_NAME, Registry

blueprint = Blueprint("about", __name__)

# routes that answer without an API key (the app's auth hook skips them)
PUBLIC_PATHS = frozenset({"/"})


def _openapi_doc(d: oa.Doc) -> oa.Op:
    return oa.Op({
        "operationId": "openapi", "summary": "This description (OpenAPI 3.1)", "tags": ["bubo"],
        "responses": {"200": {"description": "The OpenAPI document of this server",
                              "content": {oa.JSON: {"schema": oa.ANY_OBJECT}}}},
    })


@oa.route(blueprint, "/openapi.json", doc=_openapi_doc)
def openapi_json() -> Any:
    return jsonify(oa.document(current_app, config(), models()))


def _has_key(cfg: ServerConfig) -> bool:
    try:
        check_api_key(cfg.api_keys)
    except errors.ApiError:
        return False
    return True


def about_lines(cfg: ServerConfig, reg: Registry,
                show_models: bool) -> tuple[list[str], list[tuple[str, str]], str]:
    """(the lines that say what runs, the routes as (method path, summary), the paths that answer
    501)."""
    lines = [f"bubo is running (version {bubo.__version__})."]
    if not show_models:
        lines.append("An API key is required: send 'Authorization: Bearer KEY' (or 'x-api-key: KEY').")
    elif reg.is_router:
        lines.append("Models: " + ", ".join(f"{e.name} ({e.status.value})" for e in reg.entries)
                     + f"; '{DEFAULT_NAME}' names {reg.default.name}.")
    else:
        e = reg.default
        others = [n for n in reg.names() if n != e.name]
        lines.append(f"Model: {e.name} ({e.status.value})" + (f", also named {', '.join(others)}." if others else "."))
    lines.append("API description (OpenAPI 3.1): GET /openapi.json"
                 + (" (with the key)." if cfg.api_keys else "."))
    routes: dict[str, str] = {}  # "METHOD /path" -> summary
    aliases: dict[str, list[str]] = {}
    unimplemented: list[str] = []
    for path, ops in oa.document(current_app, cfg, reg)["paths"].items():
        for method, op in ops.items():
            summary: str = op["summary"]
            if op["operationId"].startswith("not_implemented"):
                if path not in unimplemented:
                    unimplemented.append(path)
                continue
            alias = re.search(r" \(alias of (\S+)\)$", summary)
            if alias:
                aliases.setdefault(f"{method.upper()} {alias.group(1)}", []).append(path)
            else:
                routes[f"{method.upper()} {path}"] = summary
    out = [(r, s + (f" (also {', '.join(aliases[r])})" if r in aliases else "")) for r, s in routes.items()]
    return lines, out, "Not implemented for a text model (501): " + ", ".join(unimplemented)


def _about_doc(d: oa.Doc) -> oa.Op:
    return oa.Op({
        "operationId": "about", "summary": "What is running", "tags": ["bubo"],
        "description": "Plain text for a client that does not ask for HTML (bubo is running, the models it "
        "serves and where this description is); for a browser (Accept: text/html) the chat page, "
        "or with --no-webui a small HTML page saying the same as the text. Needs no API key; "
        "without a valid key on a server that has keys, it names no model.",
        "responses": {"200": {"description": "bubo is running",
                              "content": {"text/plain": {"schema": oa.STR}, "text/html": {"schema": oa.STR}}}},
    }, public=True)


@oa.route(blueprint, "/", doc=_about_doc)
def about() -> Any:
    """What is running, for a person: plain text, or a small page for a browser. No key needed."""
    cfg, reg = config(), models()
    show = _has_key(cfg)
    lines, routes, unimplemented = about_lines(cfg, reg, show)
    browser = any(m == "text/html" and q > 0 for m, q in request.accept_mimetypes)
    if browser and cfg.webui:
        from bubo.webui import page

        chat = page()
        chat.headers["Vary"] = "Accept"
        return chat
    if browser:
        items = "".join(f"<li><code>{html.escape(r)}</code> {html.escape(s)}</li>" for r, s in routes)
        body = ("<!doctype html><html><head><meta charset=\"utf-8\"><title>bubo</title></head><body>"
                + "".join(f"<p>{html.escape(line)}</p>" for line in lines)
                + f"<p><a href=\"/openapi.json\">/openapi.json</a></p><h2>Routes</h2><ul>{items}</ul>"
                + f"<p>{html.escape(unimplemented)}</p></body></html>")
        resp = Response(body, mimetype="text/html")
    else:
        width = max(len(r) for r, _ in routes)
        text = ("\n".join(lines) + "\n\nRoutes:\n" + "".join(f"  {r.ljust(width)}  {s}\n" for r, s in routes)
                + "\n" + unimplemented + "\n")
        resp = Response(text, mimetype="text/plain")
    resp.headers["Vary"] = "Accept"
    return resp
