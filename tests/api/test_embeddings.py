"""Embeddings over HTTP, on a real `bubo serve --embedding` of all-minilm:l6-v2: the openai SDK's
embeddings.create (float and base64 equal, and equal to the library's Model.embed), llama-server's
/embedding and /embeddings, Ollama's /api/embed through the official client, and bad input (400
in each API's shape); a chat request to the encoder and --embedding with a chat model refused
with clear errors."""

from __future__ import annotations

import base64
import subprocess
import sys
from collections.abc import Iterator

import numpy as np
import ollama
import openai
import pytest
from client import post_json

import bubo

from .conftest import Server
from engines import THREADS

pytestmark = pytest.mark.models

MODEL = "all-minilm:l6-v2"
TEXTS = ["The cat sat on the mat.", "A cat was sitting on a rug.", "Interest rates rose again this quarter."]


@pytest.fixture(scope="module")
def srv(minilm_gguf) -> Iterator[Server]:
    s = Server("--embedding", model=MODEL, ctx=512)
    try:
        yield s.wait_ready()
    finally:
        s.stop()


@pytest.fixture(scope="module")
def client(srv: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0)


@pytest.fixture(scope="module")
def library(minilm_gguf) -> Iterator[bubo.Model]:
    with bubo.Model(minilm_gguf, n_threads=THREADS) as m:
        yield m


def test_openai_sdk_float_and_base64_agree_with_the_library(client: openai.OpenAI, library: bubo.Model) -> None:
    res = client.embeddings.create(model=MODEL, input=TEXTS)
    assert res.model == MODEL and [d.index for d in res.data] == [0, 1, 2]
    vecs = np.array([d.embedding for d in res.data], dtype=np.float32)
    assert vecs.shape == (3, 384)
    np.testing.assert_allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(vecs, library.embed(TEXTS), atol=1e-6)
    n_tokens = sum(len(library.tokenize(t)) for t in TEXTS)
    assert res.usage.prompt_tokens == res.usage.total_tokens == n_tokens
    # the SDK asks for base64 by default when numpy is present and decodes it; ask explicitly too
    raw = client.embeddings.with_raw_response.create(model=MODEL, input=TEXTS, encoding_format="base64").http_response
    b64 = [np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in raw.json()["data"]]
    np.testing.assert_array_equal(np.stack(b64), vecs)
    cos = vecs @ vecs.T
    assert cos[0, 1] > cos[0, 2] + 0.2  # the paraphrase is nearer than the unrelated sentence


def test_one_string_and_token_ids(client: openai.OpenAI, library: bubo.Model) -> None:
    one = client.embeddings.create(model=MODEL, input=TEXTS[0]).data
    assert len(one) == 1
    ids = library.tokenize(TEXTS[0])
    by_ids = client.embeddings.create(model=MODEL, input=ids).data
    by_lists = client.embeddings.create(model=MODEL, input=[ids, ids]).data
    np.testing.assert_allclose(one[0].embedding, by_ids[0].embedding, atol=1e-6)
    assert len(by_lists) == 2
    np.testing.assert_allclose(by_lists[1].embedding, one[0].embedding, atol=1e-6)


def test_dimensions_and_truncation(srv: Server) -> None:
    status, _, body = post_json(srv.url + "/v1/embeddings", {"input": "x", "dimensions": 384})
    assert status == 200
    status, _, body = post_json(srv.url + "/v1/embeddings", {"input": "x", "dimensions": 128})
    assert status == 400 and "384 dimensions" in body["error"]["message"]
    long = "word " * 700
    status, _, body = post_json(srv.url + "/v1/embeddings", {"input": long})
    assert status == 400 and body["error"]["code"] == "context_length_exceeded"
    assert "702 tokens" in body["error"]["message"] and "512" in body["error"]["message"]
    status, _, body = post_json(srv.url + "/v1/embeddings", {"input": [long, "short"], "truncate": True})
    assert status == 200
    assert body["data"][0]["truncated"] is True and "truncated" not in body["data"][1]
    assert body["usage"]["prompt_tokens"] == 512 + 3


def test_empty_string_is_embedded(srv: Server) -> None:
    status, _, body = post_json(srv.url + "/v1/embeddings", {"input": ""})
    assert status == 200 and body["usage"]["prompt_tokens"] == 2  # [CLS] [SEP], as llama-server


@pytest.mark.parametrize("body, words", [
    ({"input": []}, "must not be empty"),
    ({}, "'input' is required"),
    ({"input": 5}, "must be a string"),
    ({"input": [1.5]}, "'input[0]'"),
    ({"input": ["a", None]}, "'input[1]'"),
    ({"input": [[]]}, "'input[0]'"),
    ({"input": [[101, 999999, 102]]}, "out of range"),
    ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
    ({"input": "x", "dimensions": "many"}, "dimensions"),
    ({"input": "x", "truncate": "yes"}, "truncate"),
    ({"input": ["x"] * 2049}, "at most 2048"),
])
def test_bad_input_is_400(srv: Server, body: dict, words: str) -> None:
    status, _, answer = post_json(srv.url + "/v1/embeddings", body)
    assert status == 400, answer
    assert words in answer["error"]["message"] and answer["error"]["type"] == "invalid_request_error"


def test_llama_server_routes(srv: Server, library: bubo.Model) -> None:
    want = library.embed(TEXTS)
    for path in ("/embedding", "/embeddings"):
        status, _, body = post_json(srv.url + path, {"content": TEXTS})
        assert status == 200
        assert [e["index"] for e in body] == [0, 1, 2]
        np.testing.assert_allclose(np.array([e["embedding"][0] for e in body]), want, atol=1e-6)
    status, _, body = post_json(srv.url + "/embedding", {"content": TEXTS[0], "embd_normalize": -1})
    raw = np.array(body[0]["embedding"][0])
    assert abs(np.linalg.norm(raw) - 1) > 0.01
    np.testing.assert_allclose(raw / np.linalg.norm(raw), want[0], atol=1e-5)
    status, _, body = post_json(srv.url + "/embedding", {"content": "x", "embd_normalize": 1})
    assert status == 400 and "embd_normalize" in body["error"]["message"]


def test_ollama_client(srv: Server, library: bubo.Model) -> None:
    c = ollama.Client(host=srv.url)
    res = c.embed(model=MODEL, input=TEXTS)
    np.testing.assert_allclose(np.array(res.embeddings), library.embed(TEXTS), atol=1e-6)
    assert res.prompt_eval_count == sum(len(library.tokenize(t)) for t in TEXTS)
    long = c.embed(model=MODEL, input="word " * 700)  # Ollama truncates by default
    assert len(long.embeddings[0]) == 384
    with pytest.raises(ollama.ResponseError) as e:
        c.embed(model=MODEL, input="word " * 700, truncate=False)
    assert e.value.status_code == 400
    legacy = c.embeddings(model=MODEL, prompt=TEXTS[0])
    vec = np.array(legacy.embedding)
    np.testing.assert_allclose(vec / np.linalg.norm(vec), library.embed(TEXTS[0]), atol=1e-5)


@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}),
    ("/v1/completions", {"model": MODEL, "prompt": "hi"}),
    ("/completion", {"prompt": "hi"}),
    ("/v1/messages", {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}),
    ("/api/generate", {"model": MODEL, "prompt": "hi", "stream": False}),
])
def test_text_generation_on_the_encoder_is_a_clear_400(srv: Server, path: str, body: dict) -> None:
    status, _, answer = post_json(srv.url + path, body)
    assert status == 400, answer
    message = answer["error"] if isinstance(answer["error"], str) else answer["error"]["message"]
    assert "embedding model" in message and "/v1/embeddings" in message


def test_embedding_flag_with_a_chat_model_is_refused(catalog_model) -> None:
    path = catalog_model("smollm2:135m")
    proc = subprocess.run([sys.executable, "-m", "bubo", "serve", "-m", str(path), "--embedding", "--port", "0"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "--embedding" in proc.stderr and "text-generation model" in proc.stderr


EXCHANGES = [
    ("/v1/embeddings", {"input": TEXTS}), ("/v1/embeddings", {"input": [[101, 102], "x"], "encoding_format": "base64"}),
    ("/v1/embeddings", {"input": "word " * 700, "truncate": True}), ("/v1/embeddings", {"input": []}),
    ("/v1/embeddings", {"input": "x", "dimensions": 2}), ("/embedding", {"content": TEXTS[0]}),
    ("/embeddings", {"input": TEXTS, "embd_normalize": -1}), ("/embedding", {"content": 3}),
    ("/api/embed", {"model": MODEL, "input": TEXTS}), ("/api/embed", {"model": MODEL, "input": []}),
    ("/api/embed", {"model": MODEL, "input": {}}), ("/api/embeddings", {"model": MODEL, "prompt": "x"}),
    ("/api/embeddings", {"model": MODEL, "prompt": ""}), ("/api/embeddings", {"model": MODEL}),
]


def test_answers_are_as_documented(srv: Server) -> None:
    """Every answer (200s and 400s) of the embedding routes against the server's /openapi.json;
    the suite's schemathesis run covers them only on a text model, where they are 501."""
    import json
    import urllib.request

    from .test_openapi import check_response

    with urllib.request.urlopen(srv.url + "/openapi.json", timeout=30) as r:
        doc = json.loads(r.read())
    for path, body in EXCHANGES:
        req = urllib.request.Request(srv.url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                status, ctype, raw = r.status, r.headers["Content-Type"], r.read()
        except urllib.error.HTTPError as e:
            status, ctype, raw = e.code, e.headers["Content-Type"], e.read()
        assert status in (200, 400), (path, body, status, raw[:200])
        check_response(doc, path, "post", status, ctype, raw)
