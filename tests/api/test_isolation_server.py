"""Nothing one request sends stalls, starves or breaks another, against a real `bubo serve`
(smollm2:135m, 4 slots, --prepare-timeout 2, --write-timeout 3):

- while a costly request runs (schemas that used to expand exponentially, quadratically or
  recursively, 16 MB inputs, lists past their maxima),
  /health answers in under 100 ms and another client's stream keeps flowing (its largest gap
  between tokens bounded by a multiple of its own gap alone), and the costly request ends with
  its answer (a 400 where it asks too much) within its deadline;
- SIGTERM is honoured while a request is being prepared.
(A request that bans every token, and clients that do not read, are test_isolation_clients.py's:
they hold no latency to a bound, and run beside other tests.)
"""

from __future__ import annotations

import gc
import http.client
import json
import os
import statistics
import threading
import time
import urllib.parse

import pytest

from .conftest import Server

pytestmark = [pytest.mark.slow, pytest.mark.models, pytest.mark.exclusive]  # latencies against bounds

KEY = "isolation-key"
AUTH = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
PREPARE_S = 2.0
WRITE_S = 3.0
HEALTH_LIMIT_S = 0.1
DEADLINE_SLACK_S = 1.5  # a deadline is met within this much more (a shared, noisy machine)


@pytest.fixture(scope="module")
def srv():
    # -ub 128: a new request's prompt is read 128 tokens a step, beside the other slots' tokens
    # (the gaps measured here are what waiting for a preparation costs, not a long prompt's chunk)
    # the machine's two cores (the module is `exclusive`: its tests, and this server, have them all)
    s = Server("-np", "4", "-ub", "128", "--no-draft", "--api-key", KEY, "--prepare-timeout", str(PREPARE_S),
               "--write-timeout", str(WRITE_S), "--max-connections", "48", ctx=2048,
               threads=min(2, os.cpu_count() or 1))
    try:
        yield s.wait_ready({"Authorization": f"Bearer {KEY}"})
    finally:
        s.stop()


def addr(s: Server) -> tuple[str, int]:
    u = urllib.parse.urlsplit(s.url)
    return u.hostname or "127.0.0.1", u.port or 80


def post(s: Server, path: str, body: object, timeout: float = 120) -> tuple[int, object, float]:
    """(status, the JSON answer, seconds it took)."""
    status, raw, took = post_raw(s, path, body, timeout)
    return status, json.loads(raw), took


def post_raw(s: Server, path: str, body: object, timeout: float = 120) -> tuple[int, bytes, float]:
    """(status, the answer's bytes, seconds it took): parsing a large answer holds this process's
    GIL, which would delay the probes measured meanwhile."""
    c = http.client.HTTPConnection(*addr(s), timeout=timeout)
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    t0 = time.monotonic()
    c.request("POST", path, body=data, headers=AUTH)
    r = c.getresponse()
    raw = r.read()
    took = time.monotonic() - t0
    c.close()
    return r.status, raw, took


class Watch:
    """A long greedy stream read as it comes (each token's arrival time) and /health asked every
    20 ms on a kept-alive connection (each answer's latency), in two threads."""

    def __init__(self, s: Server):
        self.s = s
        self.tokens: list[float] = []
        self.health: list[tuple[float, float]] = []  # (when asked, seconds to answer)
        self.failures: list[str] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._stream, daemon=True),
                        threading.Thread(target=self._probe, daemon=True)]

    def __enter__(self) -> Watch:
        for t in self.threads:
            t.start()
        deadline = time.monotonic() + 60
        while len(self.tokens) < 40:
            assert time.monotonic() < deadline and not self.failures, self.failures
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)

    def _stream(self) -> None:
        body = {"prompt": "Once upon a time", "n_predict": 1800, "ignore_eos": True, "stream": True,
                "temperature": 0}
        c = http.client.HTTPConnection(*addr(self.s), timeout=60)
        c.request("POST", "/completion", body=json.dumps(body), headers=AUTH)
        r = c.getresponse()
        while not self.stop.is_set():
            line = r.fp.readline()
            if not line:
                if not self.stop.is_set():
                    self.failures.append("the stream ended early")
                break
            if line.startswith(b"data: ") and b'"content"' in line:
                self.tokens.append(time.monotonic())
        c.close()

    def _probe(self) -> None:
        c = http.client.HTTPConnection(*addr(self.s), timeout=30)
        while not self.stop.is_set():
            t0 = time.monotonic()
            c.request("GET", "/health", headers=AUTH)
            r = c.getresponse()
            r.read()
            if r.status != 200:
                self.failures.append(f"/health {r.status}")
            self.health.append((t0, time.monotonic() - t0))
            time.sleep(0.02)
        c.close()

    def gaps(self, t0: float, t1: float) -> list[float]:
        return [b - a for a, b in zip(self.tokens, self.tokens[1:]) if t0 <= b <= t1 + 0.05]


def while_streaming(s: Server, costly) -> tuple[object, dict[str, float]]:
    """Run costly() beside a stream and the /health probe; check neither waited for it. (The
    client's own pauses must not count: its garbage collector is off meanwhile, and the costly
    bodies are serialized before.) A bound missed once is measured again, costly() run a second
    time: what a request does to the server happens again, a pause of the shared machine (another
    guest's work on its cores) seldom does; the second measure is the one checked."""
    gc.collect()
    gc.disable()
    try:
        out, stats = _while_streaming(s, costly)
        if not _within_bounds(stats):
            out, stats = _while_streaming(s, costly)
    finally:
        gc.enable()
    assert stats["health_max"] < HEALTH_LIMIT_S, stats
    # the stream shares the machine's two cores with the costly work, so it slows down; it does
    # not wait for it: no gap longer than a small multiple of its own pace
    assert stats["gap_max"] < _gap_limit(stats), stats
    return out, stats


def _gap_limit(stats: dict[str, float]) -> float:
    return 0.25 + 25 * stats["gap_alone"]


def _within_bounds(stats: dict[str, float]) -> bool:
    return stats["health_max"] < HEALTH_LIMIT_S and stats["gap_max"] < _gap_limit(stats)


def _while_streaming(s: Server, costly) -> tuple[object, dict[str, float]]:
    with Watch(s) as w:
        time.sleep(0.3)
        alone = statistics.median(w.gaps(0, time.monotonic()))
        t0 = time.monotonic()
        out = costly()
        t1 = time.monotonic()
        time.sleep(0.1)
        during = [lat for t, lat in w.health if t0 <= t <= t1]
        gaps = w.gaps(t0, t1)
        assert not w.failures, w.failures
        assert w.tokens[-1] >= t1, "the stream stopped during the costly request"
    stats = {"health_max": max(during, default=0.0), "gap_max": max(gaps, default=0.0), "gap_alone": alone,
             "seconds": t1 - t0}
    print("while streaming:", {k: round(v * 1000, 1) for k, v in stats.items()}, "ms")  # -s shows them
    return out, stats


# --- the costly requests ----------------------------------------------------------------------


def doubling_all_of(depth: int) -> dict:
    defs: dict = {"d0": {"type": "object", "properties": {"a": {"type": "string", "maxLength": 8}}, "required": ["a"]}}
    for i in range(1, depth + 1):
        defs[f"d{i}"] = {"allOf": [{"$ref": f"#/$defs/d{i - 1}"}, {"$ref": f"#/$defs/d{i - 1}"}]}
    return {"$defs": defs, "$ref": f"#/$defs/d{depth}"}


def inline_all_of(depth: int) -> dict:
    node: dict = {"type": "object", "properties": {"n": {"type": "integer", "maximum": 9}}, "required": ["n"]}
    for _ in range(depth):
        node = {"allOf": [node, json.loads(json.dumps(node))]}
    return node


def many_required(n: int) -> dict:
    return {"type": "object", "properties": {f"k{i}": {"type": "integer"} for i in range(n)},
            "required": [f"k{i}" for i in range(n)]}


def one_of(n: int) -> dict:
    return {"oneOf": [{"type": "object", "properties": {"t": {"const": i}}, "required": ["t"]} for i in range(n)]}


HI = [{"role": "user", "content": "Hi"}]
SCHEMA_CASES = {  # (route, the body, made when the test runs, the status it gets)
    "allOf doubling 40 deep, chat response_format": (
        "/v1/chat/completions", lambda: {"model": "bubo", "messages": HI, "max_tokens": 8, "response_format": {
            "type": "json_schema", "json_schema": {"name": "x", "schema": doubling_all_of(40)}}}, 200),
    "allOf doubling 20 deep, forced tool call": (
        "/v1/chat/completions", lambda: {"model": "bubo", "messages": HI, "max_tokens": 8,
                                         "tool_choice": "required", "tools": [{"type": "function", "function": {
                                             "name": "f", "parameters": doubling_all_of(20)}}]}, 200),
    "allOf nested inline 10 deep, llama-server json_schema": (
        "/completion", lambda: {"prompt": "x", "n_predict": 4, "json_schema": inline_all_of(10)}, 200),
    "required 100,000 names, /completion json_schema": (
        "/completion", lambda: {"prompt": "x", "n_predict": 4, "json_schema": many_required(100_000)}, 400),
    "oneOf 5,000 objects, Responses text.format": (
        "/v1/responses", lambda: {"model": "bubo", "input": "Hi", "max_output_tokens": 8, "text": {"format": {
            "type": "json_schema", "name": "x", "schema": one_of(5000)}}}, 400),
    "allOf doubling 30 deep, Ollama format": (
        "/api/chat", lambda: {"model": "bubo", "messages": HI, "stream": False, "format": doubling_all_of(30),
                              "options": {"num_predict": 8}}, 200),
}


@pytest.mark.parametrize("case", list(SCHEMA_CASES))
def test_a_costly_schema_stalls_nobody(srv, case):
    path, make, want = SCHEMA_CASES[case]
    data = json.dumps(make()).encode()
    (status, r, took), _ = while_streaming(srv, lambda: post(srv, path, data))
    assert status == want, r
    assert took < PREPARE_S + DEADLINE_SLACK_S + (5 if want == 200 else 0)  # a 200 also generates its answer
    if want == 400:
        code = r["error"] if path.startswith("/api/") else r["error"]["code"]
        assert code in ("unsupported_schema", "too_costly"), r


def test_large_inputs_stall_nobody_and_work_past_the_deadline_is_a_400(srv):
    text = "hello world, " * 1_250_000  # 16 MB
    plain, pieces = (json.dumps({"content": text, "with_pieces": w}).encode() for w in (False, True))
    (status, raw, _), _ = while_streaming(srv, lambda: post_raw(srv, "/tokenize", plain))
    if status == 400 and b"too_costly" in raw:
        # its work takes 0.6-1 s of the 2 s here: past them, the shared machine ran at a third of
        # its pace meanwhile (once on CI), which a second try seldom meets
        (status, raw, _), _ = while_streaming(srv, lambda: post_raw(srv, "/tokenize", plain))
    assert status == 200 and raw.count(b",") > 2_000_000, raw[:300]
    # the same with every token's piece: more work than the deadline allows
    (status, r, took), _ = while_streaming(srv, lambda: post(srv, "/tokenize", pieces))
    assert status == 400 and r["error"]["code"] == "too_costly", r
    assert "--prepare-timeout" in r["error"]["message"]
    assert took < PREPARE_S + DEADLINE_SLACK_S + 1.0  # + reading the 16 MB body
    # an embeddings input of 16 MB on a text model: read off the loop, then 501
    inputs = json.dumps({"input": [text[:4000]] * 2000}).encode()
    (status, r, _), _ = while_streaming(srv, lambda: post(srv, "/v1/embeddings", inputs))
    assert status == 400 and "at most 2048" not in r["error"]["message"] or status == 501, r


@pytest.mark.parametrize("field,make,words", [
    ("stop", lambda: [f"s{i}" for i in range(100_000)], "stop has 100,000 strings; at most 64"),
    ("dry_sequence_breakers", lambda: [f"b{i}" for i in range(40_000)],
     "dry_sequence_breakers has 40,000 strings; at most 64"),
    ("logit_bias", lambda: {str(i): -1 for i in range(70_000)}, "logit_bias has 70,000 entries; at most 65,536"),
])
def test_lists_past_their_maximum_are_refused_naming_the_field(srv, field, make, words):
    data = json.dumps({"model": "bubo", "messages": HI, "max_tokens": 4, "dry_multiplier": 0.8, field: make()}).encode()
    (status, r, _), _ = while_streaming(srv, lambda: post(srv, "/v1/chat/completions", data))
    assert status == 400 and words in r["error"]["message"], r


def test_tools_and_messages_past_their_maximum_are_refused(srv):
    tools = [{"type": "function", "function": {"name": f"f{i}", "parameters": {"type": "object"}}} for i in range(129)]
    status, r, _ = post(srv, "/v1/chat/completions", {"model": "bubo", "messages": HI, "tools": tools})
    assert status == 400 and "tools has 129 tools; at most 128" in r["error"]["message"], r
    status, r, _ = post(srv, "/v1/messages", {"model": "bubo", "max_tokens": 4, "messages": HI * 10_001})
    assert status == 400 and r["type"] == "error" and "messages has 10,001 messages" in r["error"]["message"], r


# --- the drain ----------------------------------------------------------------------------------


def test_sigterm_is_honoured_while_a_request_is_being_prepared():
    """The loop handles the signal whatever a worker is doing: the drain ends the request being
    prepared (a 16 MB text's pieces, seconds of work under a long --prepare-timeout) within the
    drain timeout, and the process exits."""
    import signal

    s = Server("--prepare-timeout", "120", "--drain-timeout", "2", ctx=512)
    try:
        s.wait_ready()
        text = "hello world, " * 1_250_000
        done: dict[str, object] = {}

        def costly() -> None:
            try:
                c = http.client.HTTPConnection(*addr(s), timeout=60)
                c.request("POST", "/tokenize", body=json.dumps({"content": text, "with_pieces": True}),
                          headers={"Content-Type": "application/json"})
                done["status"] = c.getresponse().status
            except OSError as e:
                done["error"] = e

        t = threading.Thread(target=costly)
        t.start()
        time.sleep(1.5)  # the body is in; its pieces are being made in a worker
        t0 = time.monotonic()
        s.proc.send_signal(signal.SIGTERM)
        s.proc.wait(30)
        took = time.monotonic() - t0
        t.join(30)
        assert s.proc.returncode == 0, "".join(s.log[-20:])
        assert took < 2 + DEADLINE_SLACK_S + 2, took  # the drain timeout, and the stop's own second
        assert "draining" in "".join(s.log)
    finally:
        s.stop()
