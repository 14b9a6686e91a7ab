"""A chat template that fails to render (here one given with --chat-template-file that refuses
every request, as a hostile or broken GGUF template might) is a 400 in each route's error shape
with the template's own message, never a 500, and the server keeps serving."""

import urllib.error
import urllib.request

import pytest
from client import call_json

from .conftest import start_server

pytestmark = pytest.mark.models

REFUSING = "{{ raise_exception('this template refuses every request') }}"
ESCAPING = "{{ messages.__class__.__mro__[1].__subclasses__() }}"  # the sandbox must stop this
MSGS = [{"role": "user", "content": "Say hi."}]


def post(url, body):
    return call_json(url, "POST", body, timeout=60)

@pytest.mark.parametrize("template,needle", [(REFUSING, "refuses every request"), (ESCAPING, "")])
def test_template_failure_is_a_400(tmp_path, template, needle):
    path = tmp_path / "template.jinja"
    path.write_text(template)
    server = start_server("--chat-template-file", str(path)).wait_ready()
    try:
        status, body = post(server.url + "/v1/chat/completions", {"model": "bubo", "messages": MSGS})
        assert status == 400, body
        assert body["error"]["type"] == "invalid_request_error"
        assert needle in body["error"]["message"]
        status, body = post(server.url + "/v1/messages", {"model": "bubo", "max_tokens": 8, "messages": MSGS})
        assert status == 400, body
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
        status, body = post(server.url + "/apply-template", {"messages": MSGS})
        assert status == 400, body
        # a raw prompt needs no template: the server still generates
        status, body = post(server.url + "/completion", {"prompt": "Hello", "n_predict": 2})
        assert status == 200, body
        with urllib.request.urlopen(server.url + "/health", timeout=10) as r:
            assert r.status == 200
    finally:
        server.stop()
