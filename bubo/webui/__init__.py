"""The chat page bubo serves at `/` to browsers (`--no-webui` turns it off): one HTML document
with its style and script inline, built from page.html, page.css and page.js beside this file
(no build step, nothing fetched from elsewhere: it works offline), and POST /webui/render, the
Markdown rendering it asks the server for (render.py, in worker processes under a time budget:
workers.py).

`--ui-config` gives the page's defaults for new conversations (system prompt, sampling settings,
a JSON schema, tools)."""

from __future__ import annotations

import functools
import json
import secrets
from pathlib import Path
from typing import Any

from flask import Blueprint, Response, jsonify

from bubo.api import openapi as oa
from bubo.api.errors import ApiError
from bubo.api.fields import invalid
from bubo.api.request import config, json_body
from bubo.webui.render import MAX_TEXT, code_css
from bubo.webui.workers import renderer

blueprint = Blueprint("webui", __name__)

HERE = Path(__file__).parent
# the settings a conversation has, and what --ui-config may set for new ones
SETTINGS: dict[str, type | tuple[type, ...]] = {
    "system": str, "temperature": (int, float), "top_p": (int, float), "top_k": int, "min_p": (int, float),
    "max_tokens": int, "seed": int, "json_schema": (dict, str), "tools": (list, str)}
# what an import takes at most (a bigger file is refused with a clear message, nothing changes)
IMPORT_LIMITS = {"bytes": 20 * 1024 * 1024, "conversations": 2000, "messages": 50000}


def check_ui_config(raw: Any) -> dict[str, Any]:
    """--ui-config's JSON (text, or the path of a file holding it): {"defaults": {setting: value}}
    or the settings themselves. A ValueError names what is wrong."""
    if isinstance(raw, str):
        text = raw
        if not raw.lstrip().startswith(("{", "[")):
            try:
                text = Path(raw).read_text(encoding="utf-8")
            except OSError as e:
                raise ValueError(f"--ui-config {raw}: not JSON, and no file of that name ({e.strerror})") from None
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"--ui-config: not valid JSON: {e}") from None
    if not isinstance(raw, dict):
        raise ValueError("--ui-config must be a JSON object: {\"defaults\": {\"temperature\": 0.7, ...}}")
    defaults = raw.get("defaults", raw) if set(raw) <= {"defaults"} else raw
    if not isinstance(defaults, dict):
        raise ValueError("--ui-config: defaults must be an object")
    out: dict[str, Any] = {}
    for k, v in defaults.items():
        kind = SETTINGS.get(k)
        if kind is None:
            raise ValueError(f"--ui-config: unknown setting {k!r}; the settings are {', '.join(SETTINGS)}")
        if isinstance(v, bool) or not isinstance(v, kind):
            raise ValueError(f"--ui-config: {k} has the wrong type ({type(v).__name__})")
        out[k] = json.dumps(v) if isinstance(v, (dict, list)) else v
    return out


@functools.lru_cache(maxsize=1)
def _parts() -> tuple[str, str, str]:
    return ((HERE / "page.html").read_text(encoding="utf-8"), (HERE / "page.css").read_text(encoding="utf-8"),
            (HERE / "page.js").read_text(encoding="utf-8"))


def _script_json(value: Any) -> str:
    """JSON that cannot end the <script> element it sits in."""
    return json.dumps(value).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def page() -> Response:
    """The chat page, with this server's defaults; a fresh nonce lets only its own script run."""
    html, css, js = _parts()
    nonce = secrets.token_urlsafe(16)
    cfg = {"defaults": config().ui_defaults, "settings": list(SETTINGS), "limits": IMPORT_LIMITS,
           "render_max": MAX_TEXT}
    body = (html.replace("{{CSS}}", css + "\n" + code_css()).replace("{{NONCE}}", nonce)
            .replace("{{CONFIG}}", _script_json(cfg)).replace("{{JS}}", js))
    resp = Response(body, mimetype="text/html")
    resp.headers["Content-Security-Policy"] = (
        f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'unsafe-inline'; connect-src 'self'; "
        "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
    resp.headers["X-Content-Type-Options"] = "nosniff"
    resp.headers["Cache-Control"] = "no-cache"
    return resp


def _render_doc(d: oa.Doc) -> oa.Op:
    return oa.Op({
        "operationId": "webui_render", "summary": "Markdown to HTML, as the chat page at / shows answers",
        "tags": ["bubo"],
        "requestBody": oa.body(oa.obj({"text": oa.STR}, ["text"], closed=False), {"text": "# Hi\n\n`code`"}),
        "responses": {"200": {"description": "The HTML (raw HTML in the text escaped, code highlighted). A "
                              "rendering that takes longer than its budget (2 s) is stopped and "
                              "made again without highlighting, then as the escaped text: "
                              "`rendering` says which",
                              "content": {oa.JSON: {"schema": oa.obj({"html": oa.STR, "rendering": {
                                  "enum": ["highlighted", "plain_code", "text"]}}, ["html", "rendering"])}}}},
    }, (400, 413))


@oa.route(blueprint, "/webui/render", methods=("POST",), doc=_render_doc)
def render_markdown() -> Any:
    """{"text": Markdown} -> {"html": ...}: what the chat page shows of an answer."""
    body = json_body()
    text = body.get("text")
    if not isinstance(text, str):
        raise invalid("text must be a string")
    if len(text) > MAX_TEXT:
        raise ApiError(413, "request_too_large", f"text is {len(text)} characters; a render takes at most {MAX_TEXT}")
    html, how = renderer().render(text)
    return jsonify(html=html, rendering=how)
