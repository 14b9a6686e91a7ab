"""Router mode against real `bubo serve` processes with two catalog models, smollm2:135m and
gemma3:270m: each request answers from the model it names (the same tokens as a server of that
model alone), interleaved and concurrent; --models-max 1 swaps them and a request waiting for a
swap is answered; unloading waits for a stream in flight and never cuts it; --sleep-idle-seconds
gives the memory back and the next request reloads; a broken file in --models-dir shows as failed
while the others serve; unknown names and bad start-up configurations are clear errors."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
from client import call, call_json

from bubo import store

from .conftest import Server
from .test_server_core import assert_error

pytestmark = pytest.mark.models

SMOL, GEMMA = "smollm2:135m", "gemma3:270m"
PROMPTS = ["The capital of France is", "Once upon a time, a fox", "def fibonacci(n):"]
N_PREDICT = 12
ROUTER_FLAGS = ("-m", SMOL, "-m", GEMMA, "-np", "2")


def complete(url: str, model: str | None, prompt: str, n: int = N_PREDICT, **extra: object) -> dict:
    body = {"prompt": prompt, "n_predict": n, "temperature": 0, "return_tokens": True, **extra}
    if model is not None:
        body["model"] = model
    status, r = call_json(url + "/completion", "POST", body, timeout=120)
    assert status == 200, r
    return r


def models(url: str) -> dict[str, dict]:
    status, r = call_json(url + "/models")
    assert status == 200, r
    return {m["id"]: m for m in r["data"]}


def status_of(url: str, name: str) -> str:
    return models(url)[name]["status"]["value"]


def wait_status(url: str, name: str, want: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while status_of(url, name) != want:
        assert time.monotonic() < deadline, f"{name} never became {want}: {models(url)[name]}"
        time.sleep(0.05)


def rss(server: Server) -> int:
    with open(f"/proc/{server.proc.pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def stream_completion(url: str, model: str, n: int, events: list, done: dict) -> None:
    """Read a streamed /completion to its end (every chunk into events), noting when it ended."""
    body = json.dumps({"model": model, "prompt": "Count: 1, 2, 3,", "n_predict": n, "temperature": 0,
                       "ignore_eos": True, "stream": True}).encode()
    req = urllib.request.Request(url + "/completion", data=body, method="POST")
    with urllib.request.urlopen(req, timeout=180) as r:
        for line in r:
            if line.startswith(b"data: "):
                events.append(json.loads(line[6:]))
    done["t"] = time.monotonic()


def start_stream(url: str, model: str, n: int) -> tuple[threading.Thread, list, dict]:
    """A streamed /completion of n tokens read in a thread, once its first chunk has come."""
    events: list = []
    done: dict = {}
    reader = threading.Thread(target=stream_completion, args=(url, model, n, events, done))
    reader.start()
    deadline = time.monotonic() + 60
    while not events:
        assert time.monotonic() < deadline, "the stream never started"
        time.sleep(0.01)
    return reader, events, done


@pytest.fixture(scope="module")
def singles(catalog_model):
    """What each model answers alone: a single-model server per model."""
    out: dict[str, dict[str, list[int]]] = {}
    for name in (SMOL, GEMMA):
        with Server("-np", "2", model=name, ctx=1024) as s:
            s.wait_ready()
            out[name] = {p: complete(s.url, None, p)["tokens"] for p in PROMPTS}
    return out


@pytest.fixture(scope="module")
def router(catalog_model):
    s = Server(*ROUTER_FLAGS, "--models-max", "2", model=None, ctx=1024)
    try:
        yield s.wait_ready()
    finally:
        s.stop()


def test_the_router_lists_every_model_and_its_status(router):
    status, r = call_json(router.url + "/v1/models")
    assert status == 200 and [m["id"] for m in r["data"]] == [SMOL, GEMMA]  # each model once
    ms = models(router.url)
    assert ms[SMOL]["status"]["value"] == "loaded"  # the default model loads at start
    assert (ms[SMOL]["aliases"], ms[GEMMA]["aliases"]) == (["bubo"], [])
    assert call_json(router.url + "/ready")[1] == {"status": "ready", "model": SMOL}


def test_every_spelling_of_each_model_answers_from_that_model(router):
    from .test_model_names import answers_as, is_refused, spellings

    for name in (SMOL, GEMMA):
        for spelling in spellings(name):
            assert answers_as(router.url, spelling) == str(store.model_path(name)), spelling
    assert answers_as(router.url, "bubo:latest") == str(store.model_path(SMOL))
    is_refused(router.url, "gemma3:27b", close=GEMMA, router=True)
    is_refused(router.url, "llama3", close=None, router=True)


def test_each_request_answers_from_the_model_it_names(router, singles):
    # interleaved, one after another
    for p in PROMPTS:
        for name in (GEMMA, SMOL):
            r = complete(router.url, name, p)
            assert r["model"] == name and r["tokens"] == singles[name][p], (name, p)
    assert status_of(router.url, GEMMA) == "loaded"  # loaded by its first request
    # the OpenAI route says which model answered
    status, r = call_json(router.url + "/v1/completions", "POST",
                          {"model": GEMMA, "prompt": PROMPTS[0], "max_tokens": 4, "temperature": 0})
    assert status == 200 and r["model"] == GEMMA
    # concurrent, both models at once
    jobs = [(name, p) for p in PROMPTS for name in (SMOL, GEMMA)] * 2
    with ThreadPoolExecutor(len(jobs)) as ex:
        got = list(ex.map(lambda job: complete(router.url, *job), jobs))
    for (name, p), r in zip(jobs, got):
        assert r["model"] == name and r["tokens"] == singles[name][p], (name, p)
    # GET routes take ?model=
    status, props = call_json(router.url + "/props?model=" + GEMMA)
    assert status == 200 and props["model_info"]["architecture"] == "gemma3"
    assert call_json(router.url + "/props")[1]["model_info"]["architecture"] == "llama"
    status, slots = call_json(router.url + "/slots?model=" + GEMMA)
    assert status == 200 and len(slots) == 2
    status, _, text = call(router.url + "/metrics")
    assert status == 200 and f'llamacpp:requests_total{{model="{GEMMA}"}}' in text.decode()


def test_unknown_models_are_404_naming_the_available_ones(router):
    for path, body in (("/v1/chat/completions", {"model": "nope", "messages": [{"role": "user", "content": "x"}]}),
                       ("/completion", {"model": "nope", "prompt": "x"}),
                       ("/models/load", {"model": "nope"}), ("/models/unload", {"model": "nope"})):
        status, r = call_json(router.url + path, "POST", body)
        assert_error(status, r, 404, "model_not_found", "invalid_request_error")
        assert f"'{SMOL}'" in r["error"]["message"] and f"'{GEMMA}'" in r["error"]["message"], path
    status, r = call_json(router.url + "/props?model=nope")
    assert status == 404 and r["error"]["code"] == "model_not_found"
    status, r = call_json(router.url + "/models/load", "POST", {})
    assert_error(status, r, 400, "invalid_value", "invalid_request_error")


def in_background(fn, *args, **kwargs) -> tuple[threading.Thread, dict]:
    out: dict = {}
    t = threading.Thread(target=lambda: out.setdefault("value", fn(*args, **kwargs)))
    t.start()
    return t, out


def test_unload_during_a_stream_waits_for_it_and_never_cuts_it(router):
    complete(router.url, GEMMA, "Hi", 2)  # loaded
    reader, events, done = start_stream(router.url, GEMMA, 120)
    unloading, out = in_background(call_json, router.url + "/models/unload", "POST", {"model": GEMMA}, timeout=180)
    seen = set()
    while reader.is_alive():
        seen.add((status_of(router.url, GEMMA), unloading.is_alive()))
        time.sleep(0.01)
    unloading.join(180)
    # while the stream went on, the model was unloading and the unload call still waiting
    assert ("unloading", True) in seen, seen
    assert out["value"] == (200, {"success": True, "model": GEMMA, "status": "unloaded"})
    assert events[-1]["stop"] is True and events[-1]["tokens_predicted"] == 120  # whole, not cut
    assert sum(1 for e in events if not e["stop"]) == 120
    assert status_of(router.url, GEMMA) == "unloaded"
    # the next request loads it again
    r = complete(router.url, GEMMA, PROMPTS[0])
    assert r["model"] == GEMMA and status_of(router.url, GEMMA) == "loaded"
    status, r = call_json(router.url + "/models/load", "POST", {"model": GEMMA})
    assert status == 200 and r["status"] == "loaded"


def test_models_max_1_swaps_and_a_request_waiting_for_the_swap_is_answered(catalog_model, singles):
    with Server(*ROUTER_FLAGS, "--models-max", "1", model=None, ctx=1024) as s:
        s.wait_ready()
        assert (status_of(s.url, SMOL), status_of(s.url, GEMMA)) == ("loaded", "unloaded")
        r = complete(s.url, GEMMA, PROMPTS[1])
        assert r["tokens"] == singles[GEMMA][PROMPTS[1]]
        assert (status_of(s.url, SMOL), status_of(s.url, GEMMA)) == ("unloaded", "loaded")
        # a long stream keeps gemma busy; a request for smollm2 waits for it, then swaps
        reader, events, done = start_stream(s.url, GEMMA, 100)
        asking, out = in_background(complete, s.url, SMOL, PROMPTS[2])
        seen = set()
        while reader.is_alive():
            ms = models(s.url)
            seen.add((ms[GEMMA]["status"]["value"], ms[SMOL]["status"]["value"], asking.is_alive()))
            time.sleep(0.01)
        asking.join(180)
        # gemma finished its stream while smollm2's request waited for the swap
        assert ("unloading", "loading", True) in seen, seen
        r = out["value"]
        assert r["model"] == SMOL and r["tokens"] == singles[SMOL][PROMPTS[2]]  # answered, not dropped
        assert events[-1]["tokens_predicted"] == 100  # gemma's stream was whole
        assert (status_of(s.url, SMOL), status_of(s.url, GEMMA)) == ("loaded", "unloaded")


def test_an_idle_model_sleeps_its_memory_away_and_wakes_on_request(catalog_model, singles):
    with Server(*ROUTER_FLAGS, "--sleep-idle-seconds", "2", model=None, ctx=1024) as s:
        s.wait_ready()
        wait_status(s.url, SMOL, "sleeping")  # the default model, loaded at start, sleeps too
        complete(s.url, GEMMA, "Hi", 2)
        assert status_of(s.url, GEMMA) == "loaded"
        awake = rss(s)
        wait_status(s.url, GEMMA, "sleeping")
        asleep = rss(s)
        # gemma3:270m's weights are 253 MB: most of it goes back to the OS
        assert awake - asleep > 150 * 1024 * 1024, (awake, asleep)
        status, props = call_json(s.url + "/props?model=" + GEMMA)
        assert status == 200 and props["is_sleeping"] is True
        assert call_json(s.url + "/ready?model=" + GEMMA)[0] == 200
        r = complete(s.url, GEMMA, PROMPTS[0])
        assert r["tokens"] == singles[GEMMA][PROMPTS[0]]
        assert status_of(s.url, GEMMA) == "loaded" and rss(s) > asleep + 150 * 1024 * 1024


def test_a_broken_file_in_the_models_dir_fails_while_the_others_serve(catalog_model, tmp_path):
    d = tmp_path / "models"
    d.mkdir()
    (d / "a-smol.gguf").symlink_to(catalog_model(SMOL))
    (d / "broken.gguf").write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 64)
    (d / "notes.txt").write_text("not a model")
    with Server("--models-dir", str(d), model=None, ctx=1024) as s:
        s.wait_ready()
        ms = models(s.url)
        assert set(ms) == {"a-smol", "broken"} and ms["a-smol"]["aliases"] == ["bubo"]
        assert ms["broken"]["status"]["value"] == "failed" and ms["broken"]["status"]["failed"] is True
        assert "broken.gguf" in ms["broken"]["status"]["error"]
        status, r = call_json(s.url + "/completion", "POST", {"model": "broken", "prompt": "x"})
        assert_error(status, r, 503, "not_ready", "server_error")
        assert "failed to load" in r["error"]["message"]
        assert complete(s.url, "a-smol", "Hi", 2)["model"] == "a-smol"
        assert s.alive()


def test_a_model_that_cannot_load_is_never_the_default(catalog_model, tmp_path):
    """A broken file that sorts first in --models-dir (or comes first on the command line) is not
    the default: the first model that loads is, and /ready says ready for it."""
    d = tmp_path / "models"
    d.mkdir()
    (d / "0-broken.gguf").write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 64)
    (d / "a-smol.gguf").symlink_to(catalog_model(SMOL))
    for flags in (("--models-dir", str(d)), ("-m", str(d / "0-broken.gguf"), "-m", str(d / "a-smol.gguf"))):
        with Server(*flags, model=None, ctx=1024) as s:
            s.wait_ready()
            assert call_json(s.url + "/ready") == (200, {"status": "ready", "model": "a-smol"})
            assert complete(s.url, None, "Hi", 2)["model"] == "a-smol"  # llama-server's route, no model
            assert complete(s.url, "bubo", PROMPTS[0])["tokens"] == complete(s.url, "a-smol", PROMPTS[0])["tokens"]
            ms = models(s.url)
            assert ms["0-broken"]["status"]["value"] == "failed"
            assert ms["a-smol"]["aliases"] == ["bubo"], ms


def start_error(*args: str) -> str:
    """Run `bubo serve` with args that must not start: its one-line error (exit status 1)."""
    p = subprocess.run([sys.executable, "-m", "bubo", "serve", "--port", "0", *args],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 1, p.stdout + p.stderr
    return p.stderr


def test_bad_configurations_stop_the_server_at_start(catalog_model, tmp_path):
    smol = str(catalog_model(SMOL))
    preset = tmp_path / "models.ini"
    preset.write_text(f"[*]\nc = 1024\n\n[smol]\nmodel = {smol}\nctx-sise = 2048\n")
    err = start_error("--models-preset", str(preset))
    assert str(preset) in err and "[smol] ctx-sise" in err and "unknown key" in err
    preset.write_text(f"[smol]\nmodel = {smol}\nnp = lots\n")
    err = start_error("--models-preset", str(preset))
    assert str(preset) in err and "[smol] np = 'lots'" in err
    preset.write_text("[*]\nc = 1024\n\n[ghost]\nc = 512\n")
    err = start_error("-m", smol, "--models-preset", str(preset))
    assert "[ghost] names no model" in err
    # two files under one name
    for sub, model in (("one", SMOL), ("two", GEMMA)):
        (tmp_path / sub).mkdir()
        (tmp_path / sub / "model.gguf").symlink_to(catalog_model(model))
    err = start_error("-m", str(tmp_path / "one" / "model.gguf"), "-m", str(tmp_path / "two" / "model.gguf"))
    assert "two models are named 'model'" in err and "one" in err and "two" in err
    err = start_error("-m", SMOL, "-m", GEMMA, "--served-model-name", "x")
    assert "--served-model-name names one model" in err


def test_a_preset_sets_names_and_settings_and_the_command_line_wins(catalog_model, tmp_path):
    smol = str(catalog_model(SMOL))
    preset = tmp_path / "models.ini"
    preset.write_text(f"[*]\nc = 512\nnp = 3\n\n[owl]\nmodel = {smol}\nalias = hoot, smol\nc = 768\n\n"
                      f"[{GEMMA}]\nnp = 1\n")
    with Server("-m", GEMMA, "--models-preset", str(preset), "-np", "2", model=None, ctx=1024) as s:
        s.wait_ready()
        ms = models(s.url)
        assert list(ms) == [GEMMA, "owl"]
        assert (ms["owl"]["aliases"], ms[GEMMA]["aliases"]) == (["hoot", "smol"], ["bubo"])
        complete(s.url, "hoot", "Hi", 2)
        for name in ("owl:latest", "hoot:latest", "OWL", "smollm2-135m-instruct-q4_1"):  # the file's name too
            assert complete(s.url, name, "Hi", 1)["model"] == name
        # -c 1024 and -np 2 on the command line win over [owl] c = 768 and [*] np = 3
        props = call_json(s.url + "/props?model=owl")[1]
        assert (props["n_ctx"], props["total_slots"]) == (1024, 2)
