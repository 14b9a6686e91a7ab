"""Every name of a served model answers on every dialect's routes: its id, its catalog name, its
short name (family without tag), Ollama's `:latest`, its file name without .gguf, its aliases,
"bubo" for the default model, and any of these in other letter case. A name that matches none is
a 404 model_not_found with a "did you mean" when a served name is close. The router's side (two
models, the same spellings, each answered by the model it means) is in test_router.py."""

from __future__ import annotations

from typing import Any

import pytest
from client import call_json

from bubo import store

from .conftest import MODEL
from .test_server_core import assert_error

pytestmark = pytest.mark.models

MESSAGES = [{"role": "user", "content": "Hi"}]


def asks(name: str) -> list[tuple[str, str, Any]]:
    """(method, path, body) of one small request naming `name` on each dialect's routes."""
    return [
        ("POST", "/v1/chat/completions", {"model": name, "messages": MESSAGES, "max_tokens": 1}),  # OpenAI
        ("POST", "/v1/completions", {"model": name, "prompt": "Hi", "max_tokens": 1}),
        ("POST", "/v1/messages", {"model": name, "messages": MESSAGES, "max_tokens": 1}),  # Anthropic
        ("POST", "/completion", {"model": name, "prompt": "Hi", "n_predict": 1}),  # llama-server
        ("GET", f"/props?model={name}", None),
        ("POST", "/api/generate", {"model": name, "prompt": "Hi", "stream": False,  # Ollama
                                   "options": {"num_predict": 1}}),
        ("POST", "/api/chat", {"model": name, "messages": MESSAGES, "stream": False, "options": {"num_predict": 1}}),
        ("POST", "/api/show", {"model": name}),
    ]


def answers_as(url: str, name: str) -> str:
    """Every route answers a request naming `name` (a chat route may refuse a model without a
    chat template, a base model: after finding it); the model file that /props says answered it."""
    for method, path, body in asks(name):
        status, r = call_json(url + path, method, body, timeout=120)
        assert status == 200 or (status == 400 and "no chat template" in str(r)), (name, path, r)
    return str(call_json(url + f"/props?model={name}")[1]["model_path"])


LLAMA_SERVER = ("/completion", "/props")


def is_refused(url: str, name: str, close: str | None, router: bool = False) -> None:
    """Every route answers 404 model_not_found, in its dialect's error shape, with "did you mean
    'close'" when close is given (and no guess when it is None). With one model, llama-server's
    routes answer from it whatever the request names, as llama-server's do: only a router's are asked."""
    for method, path, body in asks(name):
        if path.startswith(LLAMA_SERVER) and not router:
            continue
        status, r = call_json(url + path, method, body)
        assert status == 404, (name, path, r)
        msg = r["error"]["message"] if isinstance(r["error"], dict) else r["error"]  # Ollama: a string
        if r.get("type") == "error":  # Anthropic's shape
            assert r["error"]["type"] == "not_found_error", r
        elif isinstance(r["error"], dict):
            assert_error(status, r, 404, "model_not_found", "invalid_request_error")
        assert (f"did you mean '{close}'" in msg) if close else ("did you mean" not in msg), (path, msg)


def spellings(catalog_name: str) -> list[str]:
    """A catalog model's names as people and clients write them."""
    entry = store.CATALOG[catalog_name]
    return [catalog_name, entry.family, f"{entry.family}:latest", entry.filename.removesuffix(".gguf"),
            catalog_name.upper()]


def test_every_spelling_of_the_one_model_answers_on_every_route(base_url):
    path = store.model_path(MODEL)
    for name in [*spellings(MODEL), "bubo", "bubo:latest"]:
        assert answers_as(base_url, name) == str(path), name


def test_a_name_close_to_the_models_gets_did_you_mean(base_url):
    is_refused(base_url, "smolm2", close=MODEL)
    is_refused(base_url, "smollm2:1.7b", close=MODEL)
    is_refused(base_url, "gpt-4o", close=None)


def test_the_ollama_client_lists_the_model_once_and_finds_it_by_its_short_name(base_url):
    ollama = pytest.importorskip("ollama")
    client = ollama.Client(host=base_url)
    assert [m.model for m in client.list().models] == [MODEL]
    assert client.show("smollm2").modelinfo["general.architecture"] == "llama"
    with pytest.raises(ollama.ResponseError, match="did you mean"):
        client.show("smolm2")
