"""`bubo serve` as a user meets it: a model that cannot be served stops the process with one line
on stderr and exit status 1; llama-server's flags people type by habit are accepted with a note
or refused in one line naming the flag; -c 0 is the trained context; --temp/--top-k/.../-n are
the defaults of requests that leave them out; one log line per request (text or JSON), polled
routes only with -v, nothing with --log-disable; 503 while loading carries Retry-After;
--version; `bubo` alone prints its help."""

from __future__ import annotations

import json
import logging
import pathlib
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from client import get_json
from client import post_json as post

from bubo import store
from bubo.api import logs
from bubo.api.logs import plural
from bubo.cli.flags import HABIT_NOTES, HABIT_REFUSED

from .conftest import start_server
from engines import THREADS

REPO = pathlib.Path(__file__).resolve().parents[2]


def bubo(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bubo", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=REPO)


def get(url: str) -> dict:
    return get_json(url)

# --- models that cannot be served --------------------------------------------------------


@pytest.fixture(scope="module")
def bad_models(tmp_path_factory) -> dict[str, tuple[str, str]]:
    d = tmp_path_factory.mktemp("bad")
    (d / "text.gguf").write_text("hello, not a model\n")
    (d / "empty.gguf").write_bytes(b"")
    (d / "folder").mkdir()
    return {  # -m value: (what stderr must name, why)
        "missing": (str(d / "missing.gguf"), "no such file"),
        "not gguf": (str(d / "text.gguf"), "not a GGUF file"),
        "empty": (str(d / "empty.gguf"), "GGUF"),
        "unknown name": ("nosuchmodel:7b", "unknown model 'nosuchmodel:7b'"),
        "folder": (str(d / "folder"), "a folder, not a model file"),
    }


@pytest.mark.parametrize("case", ["missing", "not gguf", "empty", "unknown name", "folder"])
def test_a_model_that_cannot_be_served_exits_1_with_one_line(bad_models, case):
    model, why = bad_models[case]
    r = bubo("serve", "-m", model, "--port", "0")
    assert r.returncode == 1, (r.stdout, r.stderr)
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("bubo serve: error: ") and why in lines[0], lines[0]
    assert "listening" not in r.stdout  # it never looked healthy


def test_unsupported_model_file_exits_1(tmp_path):
    """A GGUF file of an architecture bubo does not run: named at start, exit 1."""
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "other.gguf"
    w = gguf.GGUFWriter(str(path), "mamba")
    w.add_block_count(1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    r = bubo("serve", "-m", str(path), "--port", "0")
    assert r.returncode == 1 and len(r.stderr.splitlines()) == 1, r.stderr
    assert "mamba" in r.stderr


# --- flags -----------------------------------------------------------------------------------


@pytest.mark.parametrize("flags,names", [
    (["-c", "-3"], "-c -3: give 0 (the trained context)"),
    (["-t", "0"], "-t 0: give a positive number of threads"),
    (["-n", "0"], "-n 0: give a positive number of tokens"),
    (["--temp", "nan"], "--temp nan"),
    (["--top-p", "7"], "--top-p 7"),
    (["-np", "0"], "--parallel 0"),
    (["--log-format", "xml"], "--log-format"),
])
def test_bad_values_name_the_flag_typed(flags, names):
    r = bubo("serve", "-m", "smollm2:135m", "--port", "0", *flags)
    assert r.returncode in (1, 2) and len(r.stderr.splitlines()) == 1, r.stderr
    assert names in r.stderr, r.stderr
    assert "n_ctx" not in r.stderr and "n_threads" not in r.stderr


@pytest.mark.parametrize("flags,value", [(f, v) for fl, v, _ in HABIT_REFUSED for f in fl[:1]])
def test_llama_server_flags_without_a_meaning_here_are_refused_in_one_line(flags, value):
    r = bubo("serve", flags, *(["x"] if value else []))
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and r.stderr.startswith(f"bubo serve: error: {flags}: not supported: "), r.stderr


def test_unknown_flags_are_one_line():
    r = bubo("serve", "--no-such-flag")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--no-such-flag" in r.stderr


@pytest.mark.parametrize("args,rc,hint", [
    (["serve", "--prot", "8080"], 2, "did you mean --port?"),
    (["serve", "--temprature", "0.5"], 2, "did you mean --temp?"),
    (["serv"], 2, "did you mean serve?"),
    (["serve", "-m", "smolm2"], 1, "did you mean smollm2?"),
    (["run", "qwen2.5-coder:0.5c", "hi"], 1, "did you mean qwen2.5-coder:0.5b?"),
    (["pull", "gemma:270m"], 1, "did you mean gemma3:270m?"),
])
def test_a_mistyped_flag_command_or_model_gets_did_you_mean(args, rc, hint):
    r = bubo(*args)
    assert r.returncode == rc and r.stderr.count("\n") == 1 and hint in r.stderr, r.stderr


def test_long_flags_are_never_taken_by_a_prefix():
    # argparse would take --chat-templ for --chat-template-file, and --thread for --threads
    for flag in ("--chat-templ", "--thread", "--n-gpu"):
        r = bubo("serve", flag, "1")
        assert r.returncode == 2 and "unrecognized arguments" in r.stderr, (flag, r.stderr)


def test_chat_template_names_a_built_in_template():
    r = bubo("serve", "-m", "smollm2:135m", "--chat-template", "lama3")
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert "--chat-template lama3: no built-in chat template named 'lama3': did you mean llama3?" in r.stderr
    assert "chatml, command-r," in r.stderr and "mistral-v7" in r.stderr  # every name, in order
    r = bubo("serve", "-m", "smollm2:135m", "--chat-template", "chatml", "--chat-template-file", "t.jinja")
    assert r.returncode == 1 and "give one of them" in r.stderr, r.stderr


def test_a_port_in_use_is_one_line_naming_it():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = bubo("serve", "-m", str(store.pull("smollm2:135m")), "--port", str(port), "-c", "512")
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith(f"bubo serve: error: port {port} on 127.0.0.1 is already in use"), r.stderr
    assert "--port" in r.stderr and "Errno" not in r.stderr


def test_version_and_help():
    r = bubo("--version")
    assert r.returncode == 0 and r.stdout.startswith("bubo ") and r.stdout.split()[1][0].isdigit()
    r = bubo()
    assert r.returncode == 0 and "usage: bubo" in r.stdout and "serve" in r.stdout and not r.stderr


@pytest.fixture(scope="module")
def habits():
    """A server started with every accepted habit flag, -c 0 and sampling defaults."""
    accepted = []
    for flags, value, _ in HABIT_NOTES:
        accepted += [flags[0], "99"] if value else [flags[0]]
    accepted += ["-fa", "on"]  # llama-server's newer form takes a value
    accepted += ["--cache-reuse", "256", "-lv", "3", "--chat-template", "llama3", "-tb", "2"]
    with start_server(*accepted, "--temp", "0", "--top-k", "1", "-n", "7", "-np", "1", ctx=0) as s:
        yield s.wait_ready()


@pytest.mark.models
def test_habit_flags_are_accepted_with_a_note_each(habits):
    log = "".join(habits.log)
    for flags, _, note in HABIT_NOTES:
        assert f"{flags[0]}: accepted, {note}" in log
    assert "--cache-reuse 256: accepted; bubo reuses the longest cached prefix" in log
    assert habits.alive()


@pytest.mark.models
def test_chat_template_name_renders_as_llama_cpp_does(habits):
    oracle = json.loads((REPO / "tests" / "data" / "oracle" / "chat_templates.json").read_text())
    conv = oracle["conversations"][0]
    _, _, r = post(habits.url + "/apply-template", {"messages": conv["messages"]})
    assert r["prompt"] == oracle["renderings"]["llama3"][0]


@pytest.mark.models
@pytest.mark.parametrize("path,body", [
    ("/v1/chat/completions", {"model": "bubo", "messages": [{"role": "user", "content": "hi"}]}),
    ("/v1/completions", {"model": "bubo", "prompt": "hi"}),
    ("/completion", {"prompt": "hi"}),
    ("/v1/messages", {"model": "bubo", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}),
    ("/v1/responses", {"model": "bubo", "input": "hi", "max_output_tokens": 2}),
    ("/api/chat", {"model": "bubo", "messages": [{"role": "user", "content": "hi"}], "stream": False}),
    ("/api/generate", {"model": "bubo", "prompt": "hi", "stream": False}),
])
def test_request_fields_no_route_reads_are_named(habits, path, body):
    status, headers, _ = post(habits.url + path, {**body, "max_token": 5, "temprature": 0})
    assert status == 200 and headers.get("X-Bubo-Ignored-Fields") == "max_token, temprature", headers
    status, headers, _ = post(habits.url + path, body)
    assert status == 200 and "X-Bubo-Ignored-Fields" not in headers, headers


@pytest.mark.models
def test_c_0_is_the_trained_context(habits):
    props = get(habits.url + "/props")
    trained = store.pull("smollm2:135m")
    assert props["default_generation_settings"]["n_ctx"] == 8192, trained  # smollm2's trained context


@pytest.mark.models
def test_sampling_flags_are_the_defaults_of_requests_that_leave_them_out(habits):
    params = get(habits.url + "/props")["default_generation_settings"]["params"]
    assert params["temperature"] == 0 and params["top_k"] == 1 and params["n_predict"] == 7
    msgs = [{"role": "user", "content": "Tell me a story about a fox."}]
    _, _, plain = post(habits.url + "/v1/chat/completions", {"model": "bubo", "messages": msgs})
    _, _, greedy = post(habits.url + "/v1/chat/completions",
                        {"model": "bubo", "messages": msgs, "temperature": 0, "max_tokens": 7})
    assert plain["usage"]["completion_tokens"] == 7 and plain["choices"][0]["finish_reason"] == "length"
    assert plain["choices"][0]["message"] == greedy["choices"][0]["message"]
    # a request's own value wins over the server's
    _, _, longer = post(habits.url + "/v1/chat/completions", {"model": "bubo", "messages": msgs, "max_tokens": 12})
    assert longer["usage"]["completion_tokens"] == 12
    _, _, raw = post(habits.url + "/completion", {"prompt": "Once upon a time"})
    assert raw["tokens_predicted"] == 7


# --- the log -------------------------------------------------------------------------------


def wait_for(server, text: str, timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        log = "".join(server.log)
        if text in log:
            return log
        time.sleep(0.05)
    raise AssertionError(f"{text!r} not in the log:\n" + "".join(server.log))


@pytest.mark.models
def test_start_up_lines_and_one_line_per_request(habits):
    log = "".join(habits.log)
    assert f"bubo serve: chat page: {habits.url}/ (open it in a browser)" in log
    wait_for(habits, "bubo serve: ready:")  # said by a watcher that polls: maybe after /health answers
    ready = next(line for line in habits.log if line.startswith("bubo serve: ready:"))
    threads = plural(THREADS, "thread") + (" (2 for prompts)" if THREADS != 2 else "")  # -tb 2
    for part in ("weights ", " MiB", "KV cache ", "context 8192 tokens", "1 slot;", threads, " s;"):
        assert part in ready, ready
    post(habits.url + "/v1/chat/completions", {"model": "bubo", "messages": [{"role": "user", "content": "hi"}]})
    log = wait_for(habits, "POST /v1/chat/completions 200")
    line = next(x for x in log.splitlines() if "POST /v1/chat/completions 200" in x)
    assert "model=smollm2:135m" in line and "generated=7" in line and " ms" in line
    prompt = int(line.split("prompt=")[1].split()[0])
    assert prompt > 5
    urllib.request.urlopen(habits.url + "/health").read()
    post(habits.url + "/v1/chat/completions", {"model": "nope", "messages": []})
    log = wait_for(habits, "POST /v1/chat/completions 404")
    assert "GET /health" not in log  # polled routes only with -v


@pytest.mark.models
def test_json_log_format_verbose_and_log_disable():
    with start_server("--log-format", "json", "--log-verbosity", "4", "-np", "1") as s:  # as -v
        s.wait_ready()
        post(s.url + "/v1/chat/completions", {"model": "bubo", "max_tokens": 3, "temprature": 0,
                                              "messages": [{"role": "user", "content": "hi"}]})
        wait_for(s, '"path": "/v1/chat/completions"')
        wait_for(s, "POST /v1/chat/completions: fields no route reads: temprature")  # -v names a typo
        wait_for(s, '"path": "/ready"')  # -v: polled routes too
        wait_for(s, '"weights_bytes"')  # the ready line: said by a watcher that polls, maybe after /ready
        records = [json.loads(line) for line in s.log if line.strip()]
    req = next(r for r in records if r.get("path") == "/v1/chat/completions")
    assert req["method"] == "POST" and req["status"] == "200" and req["model"] == "smollm2:135m"
    assert req["generated_tokens"] == 3 and req["prompt_tokens"] > 0 and req["ms"] > 0 and req["level"] == "info"
    assert any(r["msg"].startswith("listening on http://") and r.get("url") for r in records)
    assert any(r.get("weights_bytes", 0) > 0 and r.get("kv_bytes", 0) > 0 for r in records)


def test_log_verbosity_is_llama_cpps_threshold():
    levels = [logs.level_of(False, n) for n in (0, 1, 2, 3, 4, 9)]
    assert levels == [logging.ERROR, logging.ERROR, logging.WARNING, logging.INFO, logging.DEBUG, logging.DEBUG]
    assert logs.level_of(False, None) == logging.INFO and logs.level_of(True, None) == logging.DEBUG
    assert logs.level_of(True, 1) == logging.DEBUG  # -v wins


@pytest.mark.models
def test_log_verbosity_1_keeps_the_start_up_lines_and_drops_the_request_lines():
    with start_server("-lv", "1", "-np", "1") as s:
        s.wait_ready()
        post(s.url + "/v1/chat/completions", {"model": "bubo", "max_tokens": 2, "max_token": 1,
                                              "messages": [{"role": "user", "content": "hi"}]})
        wait_for(s, "bubo serve: ready:")
        time.sleep(0.3)
        log = "".join(s.log)
    assert "listening on http://" in log and "POST /v1/chat/completions" not in log and " INFO " not in log


class Writes:
    """A stream that keeps each write apart."""

    def __init__(self) -> None:
        self.writes: list[str] = []

    def write(self, s: str) -> int:
        self.writes.append(s)
        return len(s)

    def flush(self) -> None:
        pass


def test_a_startup_line_is_one_write(monkeypatch):
    """A start-up line goes out with its newline in one write: a log record that another thread
    writes to the same pipe (`2>&1`) cannot land inside it. print wrote the two apart, and once a
    JSON ready line and the engine's debug record came out joined on one line."""
    out = Writes()
    writes = out.writes
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(logs._State, "fmt", "json")
    monkeypatch.setattr(logs._State, "disabled", False)
    logs.say("ready: m.gguf", weights_bytes=1)
    assert len(writes) == 1 and writes[0].endswith("\n") and writes[0].count("\n") == 1, writes
    assert json.loads(writes[0])["weights_bytes"] == 1


@pytest.fixture
def process_logging(monkeypatch):
    """logs.setup() changes the process's logging: put it back after the test."""
    root = logging.getLogger()
    saved = (root.handlers[:], root.level, logs._State.handler, logs._State.fmt, logs._State.disabled)
    noisy = {name: logging.getLogger(name).level for name in ("werkzeug", "geventwebsocket")}
    factory = logging.getLogRecordFactory()  # importing ray sets one of its own, process-wide
    logging.setLogRecordFactory(logging.LogRecord)
    monkeypatch.setattr(logging, "_srcfile", logging._srcfile)
    for flag in ("logThreads", "logProcesses", "logMultiprocessing"):
        monkeypatch.setattr(logging, flag, getattr(logging, flag))
    yield
    root.handlers[:], level, logs._State.handler, logs._State.fmt, logs._State.disabled = saved
    root.setLevel(level)
    for name, was in noisy.items():
        logging.getLogger(name).setLevel(was)
    logging.disable(logging.NOTSET)
    logging.setLogRecordFactory(factory)


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_a_request_line_is_written_as_logging_writes_it(monkeypatch, process_logging, fmt):
    """With setup()'s handler alone, a request line is written without a LogRecord: the same
    text as logging's own path (taken once a filter is on the handler), and logging's path
    whenever an embedding program adds a handler of its own."""
    err = Writes()
    out = err.writes
    monkeypatch.setattr(sys, "stderr", err)
    now = 1_765_100_000.25
    monkeypatch.setattr(time, "time", lambda: now)
    monkeypatch.setattr(time, "time_ns", lambda: int(now * 1e9))
    logs.setup(fmt=fmt)
    fields = {"method": "POST", "path": "/v1/chat/completions", "status": "200", "model": "smollm2:135m",
              "prompt_tokens": 25, "generated_tokens": 7, "ms": 431.2, "client": "127.0.0.1", "other": 1}
    handler = logs._State.handler
    assert handler is not None and logs._alone(logging.INFO) is handler
    logs.request_line(dict(fields))
    handler.addFilter(lambda record: True)  # logging's own path from here
    assert logs._alone(logging.INFO) is None
    logs.request_line(dict(fields))
    assert len(out) == 2 and out[0] == out[1] and out[0].endswith("\n") and out[0].count("\n") == 1, out
    if fmt == "json":
        record = json.loads(out[0])
        assert record["ts"].endswith(".250Z") and record["generated_tokens"] == 7 and "other" not in record
    else:
        assert " INFO bubo.request: POST /v1/chat/completions 200 model=smollm2:135m prompt=25 generated=7 431 ms " \
               "client=127.0.0.1\n" in out[0]
    handler.filters.clear()
    logging.setLogRecordFactory(lambda *args, **kwargs: logging.LogRecord(*args, **kwargs))
    assert logs._alone(logging.INFO) is None  # a record factory of another library's: logging's path
    logging.setLogRecordFactory(logging.LogRecord)
    seen: list[logging.LogRecord] = []
    mine = logging.Handler()
    mine.emit = seen.append  # type: ignore[method-assign]
    logs.log.addHandler(mine)
    try:
        assert logs._alone(logging.INFO) is None
        logs.request_line(dict(fields))
    finally:
        logs.log.removeHandler(mine)
    assert len(seen) == 1 and seen[0].getMessage().startswith("POST /v1/chat/completions 200 model=smollm2:135m")
    assert len(out) == 3 and out[2] == out[0]  # and the root's handler still writes it


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.models
def test_log_disable_prints_nothing():
    """--log-disable: no start-up lines and no request log (a fatal error still says why)."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "bubo", "serve", "-m", str(store.pull("smollm2:135m")),
                             "--port", str(port), "--log-disable", "-c", "512", "-t", "2", "-ngl", "9"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(url + "/ready", timeout=5).read()
                break
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.1)
        status, _, _ = post(url + "/v1/chat/completions", {"model": "bubo", "max_tokens": 2,
                                                           "messages": [{"role": "user", "content": "hi"}]})
        assert status == 200
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=40)
    assert proc.returncode == 0 and out == "" and err == "", (out, err)


@pytest.mark.models
def test_503_while_loading_carries_retry_after():
    with start_server("--debug-hooks", "-np", "1", env={"BUBO_DEBUG_LOAD_DELAY_S": "3"}) as s:
        status, headers, body = post(s.url + "/v1/chat/completions",
                                     {"model": "bubo", "messages": [{"role": "user", "content": "hi"}]})
        assert status == 503 and body["error"]["code"] == "not_ready", body
        assert headers.get("Retry-After") == "2"
        try:
            urllib.request.urlopen(s.url + "/ready", timeout=10)
            raise AssertionError("/ready answered 200 while loading")
        except urllib.error.HTTPError as e:
            assert e.code == 503 and e.headers.get("Retry-After") == "2"
        s.wait_ready()
