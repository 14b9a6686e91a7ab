"""Serving under load, against real `python -m bubo serve` processes with parallel slots: many
streaming clients at once (each answer equal to the same request alone), clients that vanish at
random points, the wait queue's bound, and what /slots, /props and /metrics say."""

from __future__ import annotations

import http.client
import json
import random
import socket
import threading
import time
from typing import Any
from urllib.parse import urlsplit

import pytest
from client import call, call_json

from .conftest import MODEL, start_server
from .test_server_core import FAST_ANSWER_S, assert_error

QUESTIONS = [
    "What is the capital of France?", "Write a haiku about the sea.", "Explain photosynthesis briefly.",
    "List three prime numbers.", "Who wrote Hamlet?", "Why is the sky blue?", "Name a famous painting.",
    "Describe a cat in two sentences.",
]


@pytest.fixture(scope="module")
def four_slots():
    with start_server("-np", "4", ctx=4096) as s:
        yield s.wait_ready()


def chat_body(question: str, **kw: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": question}], "temperature": 0,
            "max_tokens": 32, "logprobs": True, **kw}


def stream_chat(url: str, body: dict[str, Any]) -> list[tuple[str, float]]:
    """(token, logprob) of every streamed token of a chat completion."""
    u = urlsplit(url)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=120)
    c.request("POST", "/v1/chat/completions", json.dumps({**body, "stream": True}),
              {"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200, r.read()
    out, done = [], False
    for raw in r:
        line = raw.decode().strip()
        if line == "data: [DONE]":
            done = True
            break
        if line.startswith("data: "):
            chunk = json.loads(line[6:])
            for ch in chunk.get("choices", []):
                for lp in ((ch.get("logprobs") or {}).get("content") or []):
                    out.append((lp["token"], lp["logprob"]))
    c.close()
    assert done
    return out


def slots(url: str) -> list[dict[str, Any]]:
    status, body = call_json(url + "/slots")
    assert status == 200
    return body


def metrics(url: str) -> dict[str, float]:
    status, _, data = call(url + "/metrics")
    assert status == 200
    out = {}
    for line in data.decode().splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def wait_all_idle(url: str, limit_s: float = 60) -> dict[str, float]:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        m = metrics(url)
        if (not any(s["is_processing"] for s in slots(url)) and m["llamacpp:requests_deferred"] == 0
                and m["llamacpp:requests_processing"] == 0):
            return m
        time.sleep(0.02)
    raise AssertionError(f"slots stayed busy: {slots(url)}")


def test_eight_streaming_clients_on_four_slots_answer_as_if_alone(four_slots):
    url = four_slots.url
    bodies = [chat_body(q, max_tokens=24 + 4 * i) for i, q in enumerate(QUESTIONS)]
    alone = [stream_chat(url, b) for b in bodies]
    assert all(len(a) > 4 for a in alone)

    results: dict[int, Any] = {}
    health: list[float] = []
    stop = threading.Event()

    def client(i: int) -> None:
        try:
            results[i] = stream_chat(url, bodies[i])
        except BaseException as e:  # noqa: BLE001 - reported below
            results[i] = e

    def prober() -> None:
        u = urlsplit(url)
        c = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
        while not stop.is_set():
            best = float("inf")
            for _ in range(3):  # best of 3: a CI machine can stall any single request
                t0 = time.perf_counter()
                c.request("GET", "/health")
                r = c.getresponse()
                r.read()
                assert r.status == 200
                best = min(best, time.perf_counter() - t0)
            health.append(best)
            time.sleep(0.02)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(bodies))]
    probe = threading.Thread(target=prober)
    probe.start()
    for t in threads:
        t.start()
    # the slots come to run side by side (a request sharing a prompt prefix with one being read
    # waits until those blocks are cached, so on a slow machine the first poll may see one slot)
    deadline, busiest = time.monotonic() + 30, 0
    while busiest < 2 and time.monotonic() < deadline and any(t.is_alive() for t in threads):
        during = slots(url)
        busiest = max(busiest, sum(s["is_processing"] for s in during))
        time.sleep(0.05)
    for t in threads:
        t.join(300)
    stop.set()
    probe.join(30)
    for i, a in enumerate(alone):
        assert not isinstance(results[i], BaseException), results[i]
        assert results[i] == a, f"client {i} differs from its request alone"
    assert len(during) == 4 and busiest >= 2
    assert health and max(health) < FAST_ANSWER_S, max(health)
    m = wait_all_idle(url)
    assert m["llamacpp:kv_cache_used_blocks"] == 0


def test_fifty_clients_that_vanish_leave_every_slot_idle_and_no_block_held(four_slots):
    url = four_slots.url
    base = wait_all_idle(url)
    u = urlsplit(url)
    rng = random.Random(5)
    long_q = " ".join(f"Item {i} weighs {i * 3} grams and costs {i * 7} cents." for i in range(150))

    def vanish(i: int) -> None:
        q = long_q if i % 3 == 0 else QUESTIONS[i % len(QUESTIONS)]
        body = json.dumps(chat_body(q, max_tokens=200, stream=i % 2 == 0, logprobs=False)).encode()
        s = socket.create_connection((u.hostname, u.port), timeout=30)
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        # drop while queued, in the prompt, or while generating
        time.sleep(rng.uniform(0.0, 1.2))
        if rng.random() < 0.5:
            s.settimeout(5)
            try:
                s.recv(1)  # the first byte: a streamed answer is then mid-generation
            except TimeoutError:
                pass  # still queued
        s.close()

    threads = []
    for i in range(50):
        t = threading.Thread(target=vanish, args=(i,))
        t.start()
        threads.append(t)
        time.sleep(rng.uniform(0.0, 0.1))
    for t in threads:
        t.join(60)
    m = wait_all_idle(url)
    assert m["llamacpp:kv_cache_used_blocks"] == base["llamacpp:kv_cache_used_blocks"] == 0
    assert all(s["cache_n"] == 0 for s in slots(url))
    # and it still serves
    assert len(stream_chat(url, chat_body("Say hello.", max_tokens=4))) == 4


def test_a_full_queue_answers_503_with_retry_after():
    with start_server("-np", "1", "--queue-size", "2") as srv:
        url = srv.wait_ready().url
        u = urlsplit(url)
        held = []
        try:
            for _ in range(3):  # one generating, two waiting
                c = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
                c.request("POST", "/completion", json.dumps({"prompt": "Count: 1, 2, 3,", "n_predict": 2000,
                                                             "stream": True}),
                          {"Content-Type": "application/json"})
                held.append(c)
            deadline = time.monotonic() + 30
            while metrics(url)["llamacpp:requests_deferred"] < 2:
                assert time.monotonic() < deadline
                time.sleep(0.01)
            status, headers, data = call(url + "/v1/completions", "POST",
                                         {"model": MODEL, "prompt": "Hi", "max_tokens": 2})
            assert_error(status, json.loads(data), 503, "queue_full", "server_error")
            assert int(headers["Retry-After"]) >= 1
        finally:
            for c in held:
                c.close()
        wait_all_idle(url)
        # with the queue drained a request goes through again
        status, _, _ = call(url + "/v1/completions", "POST", {"model": MODEL, "prompt": "Hi", "max_tokens": 2})
        assert status == 200


def test_slots_props_and_metrics_describe_the_slots(four_slots):
    url = four_slots.url
    s = slots(url)
    assert [x["id"] for x in s] == [0, 1, 2, 3] and all(x["n_ctx"] == 4096 for x in s)
    status, props = call_json(url + "/props")
    assert status == 200 and props["total_slots"] == 4 and props["n_ctx"] == 4096
    # a shared prefix shows in usage, with the cache hit ratio and the latency histograms
    system = " ".join(f"Guideline {i}: be precise about topic {i}." for i in range(60))
    usages = []
    for q in QUESTIONS[:3]:
        body = {"model": MODEL, "messages": [{"role": "system", "content": system}, {"role": "user", "content": q}],
                "max_tokens": 2, "temperature": 0}
        status, out = call_json(url + "/v1/chat/completions", "POST", body)
        assert status == 200
        usages.append(out["usage"])
    assert usages[1]["prompt_tokens_details"]["cached_tokens"] >= 300
    assert "cache_miss_reason" not in usages[1]["prompt_tokens_details"], usages[1]
    text = call(url + "/metrics")[2].decode()
    for name in ("time_to_first_token_seconds", "queue_wait_seconds"):
        assert f"# TYPE llamacpp:{name} histogram" in text
        assert f'llamacpp:{name}_bucket{{le="+Inf"}}' in text and f"llamacpp:{name}_count" in text
    m = metrics(url)
    assert 0 < m["llamacpp:prefix_cache_hit_ratio"] <= 1
    assert (m['llamacpp:time_to_first_token_seconds_bucket{le="+Inf"}']
            == m["llamacpp:time_to_first_token_seconds_count"] >= 3)


def test_no_slots_turns_the_endpoint_off():
    with start_server("--no-slots", "-np", "2") as srv:
        url = srv.wait_ready().url
        status, body = call_json(url + "/slots")
        assert_error(status, body, 501, "not_implemented", "server_error")
        assert call_json(url + "/props")[1]["total_slots"] == 2


def test_ignore_eos_generates_to_n_predict(four_slots):
    # a chat prompt whose answer ends at once ("<|im_end|>") without ignore_eos
    prompt = "<|im_start|>user\nSay OK.<|im_end|>\n<|im_start|>assistant\nOK"
    status, plain = call_json(four_slots.url + "/completion", "POST", {"prompt": prompt, "n_predict": 40,
                                                                        "temperature": 0})
    assert status == 200 and plain["tokens_predicted"] < 40 and plain["stop_type"] == "eos"
    status, forced = call_json(four_slots.url + "/completion", "POST", {"prompt": prompt, "n_predict": 40,
                                                                         "temperature": 0, "ignore_eos": True})
    assert status == 200 and forced["tokens_predicted"] == 40 and forced["stop_type"] == "limit"
