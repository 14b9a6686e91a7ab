"""The chat page bubo serves at `/` to browsers (`--no-webui` turns it off): one HTML document
with its style and script inline, built from page.html, page.css and the scripts beside this file
(highlight.js and markdown.js, which draw answers as Markdown in the browser as they stream, and
page.js): no build step, nothing fetched from elsewhere, no request to the server per render.

`--ui-config` gives the page's defaults for new conversations (system prompt, sampling settings,
a JSON schema, tools)."""

from __future__ import annotations

import functools
import json
import secrets
from pathlib import Path
from typing import Any

from flask import Response

from bubo.api.request import config

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


SCRIPTS = ("highlight.js", "markdown.js", "page.js")  # in this order: page.js uses the other two


@functools.lru_cache(maxsize=1)
def _parts() -> tuple[str, str, str]:
    js = "\n".join((HERE / name).read_text(encoding="utf-8") for name in SCRIPTS)
    return (HERE / "page.html").read_text(encoding="utf-8"), (HERE / "page.css").read_text(encoding="utf-8"), js


def _script_json(value: Any) -> str:
    """JSON that cannot end the <script> element it sits in."""
    return json.dumps(value).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def page() -> Response:
    """The chat page, with this server's defaults; a fresh nonce lets only its own script run."""
    html, css, js = _parts()
    nonce = secrets.token_urlsafe(16)
    cfg = {"defaults": config().ui_defaults, "settings": list(SETTINGS), "limits": IMPORT_LIMITS}
    body = (html.replace("{{CSS}}", css).replace("{{NONCE}}", nonce)
            .replace("{{CONFIG}}", _script_json(cfg)).replace("{{JS}}", js))
    resp = Response(body, mimetype="text/html")
    resp.headers["Content-Security-Policy"] = (
        f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'unsafe-inline'; connect-src 'self'; "
        "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
    resp.headers["X-Content-Type-Options"] = "nosniff"
    resp.headers["Cache-Control"] = "no-cache"
    return resp
