"""The chat page's server side without a browser: the page and its headers (its scripts inline,
under a nonce), --no-webui, --ui-config's checks. The page's Markdown is drawn in the browser:
test_webui.py checks it in Chromium."""

from __future__ import annotations

import json

import pytest
from flask import Flask

from bubo.api.app import create_app
from bubo.api.config import ServerConfig
from bubo.engine.engine import Engine
from bubo.webui import check_ui_config

HTML = {"Accept": "text/html,application/xhtml+xml"}


def _app(**cfg) -> Flask:
    return create_app(Engine("smollm2:135m"), ServerConfig(served_model_name="m", **cfg))


def test_browsers_get_the_chat_page_with_a_strict_policy():
    r = _app(ui_defaults={"temperature": 0.5, "system": "</script><b>x</b>"}).test_client().get("/", headers=HTML)
    assert r.status_code == 200 and r.content_type.startswith("text/html")
    csp = r.headers["Content-Security-Policy"]
    nonce = csp.split("'nonce-")[1].split("'")[0]
    page = r.data.decode()
    assert f'<script nonce="{nonce}">' in page and page.count("<script") == 2  # the config (JSON) and the code
    for name in ("const BuboHighlight", "const BuboMarkdown", "bubo's chat page"):  # every script, inline
        assert name in page, name
    assert "/webui/render" not in page  # nothing asked of the server per render
    assert "default-src 'none'" in csp and "connect-src 'self'" in csp
    config = page.split('id="bubo-config">')[1].split("</script>")[0]
    assert "</script>" not in config and json.loads(config)["defaults"]["system"] == "</script><b>x</b>"
    assert r.headers["Vary"] == "Accept"
    again = _app().test_client().get("/", headers=HTML).headers["Content-Security-Policy"]
    assert again != csp  # a fresh nonce each time


def test_no_webui_gives_browsers_the_short_page():
    c = _app(webui=False).test_client()
    r = c.get("/", headers=HTML)
    assert r.status_code == 200 and "bubo is running" in r.data.decode() and "bubo-config" not in r.data.decode()
    plain = _app().test_client().get("/")  # a client that does not ask for HTML: the text, as Ollama answers
    assert plain.content_type.startswith("text/plain") and plain.data.decode().startswith("bubo is running")


def test_ui_config_checks(tmp_path):
    assert check_ui_config('{"temperature": 0.2, "max_tokens": 64}') == {"temperature": 0.2, "max_tokens": 64}
    f = tmp_path / "ui.json"
    f.write_text(json.dumps({"defaults": {"system": "Be brief.", "json_schema": {"type": "object"}}}))
    assert check_ui_config(str(f)) == {"system": "Be brief.", "json_schema": '{"type": "object"}'}
    for bad, why in [('{"temprature": 1}', "unknown setting 'temprature'"), ('{"max_tokens": "9"}', "wrong type"),
                     ('{"seed": true}', "wrong type"), ("{nope", "not valid JSON"), ("[1]", "JSON object"),
                     (str(tmp_path / "missing.json"), "no file of that name")]:
        with pytest.raises(ValueError, match=why):
            check_ui_config(bad)
