"""POST /v1/prefill on the real server (smollm2:135m, one slot): a conversation read into the
cache while its last message is typed; the completion that follows answers the same tokens and
reads only what is new; a prefill yields to a request within one batch, and to a newer prefill."""

import threading
import time

import pytest
from client import call_json

pytestmark = pytest.mark.models

BLOCK = 32
DOC = " ".join(f"Line {i}: the river ferryman works near the old mill and sells bread to travellers."
               for i in range(40))


def chat(base_url, messages, **kw):
    status, out = call_json(base_url + "/v1/chat/completions", "POST",
                            {"model": "bubo", "messages": messages, "max_tokens": 12, "temperature": 0, **kw})
    assert status == 200, out
    return out


def test_a_completion_after_a_prefill_answers_the_same_and_reads_only_what_is_new(base_url):
    typed = [{"role": "system", "content": "Answer in one sentence."},
             {"role": "user", "content": DOC + "\n\nWhat does it"}]
    final = [typed[0], {"role": "user", "content": DOC + "\n\nWhat does it say about bread?"}]
    cold = chat(base_url, final, cache_prompt=False)
    status, pre = call_json(base_url + "/v1/prefill", "POST", {"model": "bubo", "messages": typed})
    assert status == 200 and pre["object"] == "prefill", pre
    kept = pre["cached_tokens"]
    n_prompt = cold["usage"]["prompt_tokens"]
    assert kept % BLOCK == 0 and n_prompt - 2 * BLOCK < kept < n_prompt
    warm = chat(base_url, final)
    assert warm["choices"][0]["message"] == cold["choices"][0]["message"]
    assert warm["usage"]["completion_tokens"] == cold["usage"]["completion_tokens"]
    # its own new tokens only: everything the prefill kept came from the cache
    assert warm["timings"]["cache_n"] >= kept and warm["timings"]["prompt_n"] <= n_prompt - kept


def test_a_prefill_yields_to_a_request_within_one_batch_and_to_a_newer_prefill(base_url):
    status, props = call_json(base_url + "/props")
    step = min(props["n_batch"], props["n_ubatch"], 512)
    long_doc = " ".join(f"Entry {i}: a blue bicycle was borrowed from the museum guard on a windy {i % 7}th day."
                        for i in range(64))
    typed = [{"role": "user", "content": long_doc + "\n\nWho borrowed"}]
    answers: dict[str, dict] = {}

    def prefill(name, messages):
        answers[name] = call_json(base_url + "/v1/prefill", "POST", {"model": "bubo", "messages": messages})[1]

    first = threading.Thread(target=prefill, args=("first", typed))
    first.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # until the prefill is reading (the slot is busy)
        status, slots = call_json(base_url + "/slots")
        if any(s["is_processing"] for s in slots):
            break
        time.sleep(0.005)
    other = [{"role": "user", "content": "Name a color."}]
    real = chat(base_url, other)
    first.join(60)
    got = answers["first"]
    t = got["timings"]
    # ended early: it had read part of its prompt, in whole blocks (read alone, it reads all of it)
    prefill("whole", typed)
    len_whole = answers["whole"]["cached_tokens"]
    assert got["cached_tokens"] % BLOCK == 0 and got["cached_tokens"] < len_whole
    batches = max(-(-t["prompt_n"] // step), 1)
    per_batch_ms = t["prompt_ms"] / batches
    # the request waited for the batch in progress at most (engine timings: admitted after its queue time)
    assert real["timings"]["queue_ms"] <= 2 * per_batch_ms + 50, (real["timings"], t)
    alone = chat(base_url, other, cache_prompt=False)
    assert real["choices"][0]["message"] == alone["choices"][0]["message"]

    # a newer prefill ends the older one, which answers with what it read (a text of its own)
    fresh = [{"role": "user", "content": long_doc.replace("Entry", "Item") + "\n\nWho borrowed"}]
    a = threading.Thread(target=prefill, args=("a", fresh))
    a.start()
    time.sleep(0.05)
    prefill("b", [{"role": "user", "content": long_doc + "\n\nWhat was"}])
    a.join(60)
    assert answers["a"]["object"] == answers["b"]["object"] == "prefill"
    assert answers["b"]["cached_tokens"] > 0
    prefill("a, alone", fresh)
    assert answers["a"]["cached_tokens"] < answers["a, alone"]["cached_tokens"]


def test_a_prefill_shorter_than_a_block_keeps_nothing_and_bad_bodies_are_400s(base_url):
    status, out = call_json(base_url + "/v1/prefill", "POST", {"messages": [{"role": "user", "content": "Hi"}]})
    assert status == 200 and out["cached_tokens"] == 0  # under one whole block before the last word
    for body in ({}, {"messages": []}, {"messages": [{"role": "robot", "content": "x"}]}):
        status, out = call_json(base_url + "/v1/prefill", "POST", body)
        assert status == 400 and out["error"]["type"] == "invalid_request_error", body
