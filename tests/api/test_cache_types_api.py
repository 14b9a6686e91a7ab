"""-ctk / -ctv on the server: a quantized KV cache serves (the ready line names its types), and
the same greedy answer's first tokens as the f16 cache's; bad types are refused at start (the
one-line errors are in tests/test_cli.py)."""

from __future__ import annotations

import time

import pytest
from client import post_json

from .conftest import start_server

pytestmark = pytest.mark.models

ASK = {"prompt": "The owl sat on the branch and", "n_predict": 8, "temperature": 0, "n_probs": 1}


def test_a_server_with_a_quantized_cache_answers():
    answers = []
    for flags in ((), ("-ctk", "q8_0", "-ctv", "q4_0")):
        with start_server(*flags, "-c", "512", "-np", "1") as s:
            s.wait_ready()
            status, _, r = post_json(s.url + "/completion", ASK)
            deadline = time.monotonic() + 30  # the ready line comes from a watcher that polls
            while not any("ready:" in line for line in s.log) and time.monotonic() < deadline:
                time.sleep(0.05)
        assert status == 200 and r["content"], r
        answers.append(r)
        if flags:
            assert any("(K q8_0, V q4_0)" in line for line in s.log), s.log
    first = [[p["id"] for p in a["completion_probabilities"][:3]] for a in answers]
    assert first[0] == first[1], first
