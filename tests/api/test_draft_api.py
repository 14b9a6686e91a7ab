"""Speculative decoding as the API shows it: drafted and kept tokens in llama-server's timings,
OpenAI's usage (completion_tokens_details: accepted/rejected prediction tokens), Anthropic's
usage and /metrics; `speculative.n_max` per request (0: off; out of range: 400); the flags
(--no-draft, --draft-max, --spec-type, --model-draft, --draft-p-min) and their bad values; a
draft model the server cannot use stops it at start with one line naming why."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import urllib.error
import urllib.request

import pytest
from client import post_json

from .conftest import start_server

pytestmark = pytest.mark.models

REPO = pathlib.Path(__file__).resolve().parents[2]
POEM = ("The owl sat still upon the bough, and watched the river run below; the moon was bright, the night "
        "was cold, the wind was soft, the hour was old.")
COPY = [{"role": "user", "content": "Copy this text exactly, twice:\n\n" + POEM}]


def post(url: str, body: dict) -> tuple[int, dict]:
    status, _, answer = post_json(url, body)
    return status, answer


def test_usage_timings_and_metrics_report_drafts(base_url):
    status, r = post(base_url + "/v1/chat/completions", {"model": "bubo", "messages": COPY, "max_tokens": 96,
                                                         "temperature": 0})
    assert status == 200
    t = r["timings"]
    assert 0 < t["draft_n_accepted"] <= t["draft_n"]
    details = r["usage"]["completion_tokens_details"]
    assert details == {"accepted_prediction_tokens": t["draft_n_accepted"],
                       "rejected_prediction_tokens": t["draft_n"] - t["draft_n_accepted"]}
    status, plain = post(base_url + "/v1/chat/completions", {"model": "bubo", "messages": COPY, "max_tokens": 96,
                                                             "temperature": 0, "speculative.n_max": 0})
    assert status == 200 and plain["choices"][0]["message"] == r["choices"][0]["message"]
    assert "draft_n" not in plain["timings"] and "completion_tokens_details" not in plain["usage"]
    status, m = post(base_url + "/v1/messages", {"model": "bubo", "messages": COPY, "max_tokens": 96,
                                                 "temperature": 0})
    assert status == 200 and 0 < m["usage"]["draft_tokens_accepted"] <= m["usage"]["draft_tokens"]
    status, c = post(base_url + "/completion", {"prompt": POEM + "\n" + POEM[:40], "n_predict": 48,
                                                "temperature": 0})
    assert status == 200 and c["timings"]["draft_n_accepted"] > 0
    with urllib.request.urlopen(base_url + "/metrics", timeout=30) as resp:
        metrics = resp.read().decode()
    drafted = next(float(line.split()[-1]) for line in metrics.splitlines()
                   if line.startswith("llamacpp:n_drafted_total"))
    kept = next(float(line.split()[-1]) for line in metrics.splitlines()
                if line.startswith("llamacpp:n_drafted_accepted_total"))
    assert drafted >= t["draft_n"] and 0 < kept <= drafted


@pytest.mark.parametrize("field,value", [("speculative.n_max", -1), ("speculative.n_max", 65),
                                         ("speculative.n_max", "8"), ("speculative.n_min", -2),
                                         ("speculative.p_min", 1.5)])
def test_draft_fields_out_of_range_are_400(base_url, field, value):
    for path, body in (("/v1/chat/completions", {"model": "bubo", "messages": COPY}),
                       ("/completion", {"prompt": "hi"}), ("/v1/completions", {"model": "bubo", "prompt": "hi"})):
        status, r = post(base_url + path, {**body, "max_tokens": 2, field: value})
        assert status == 400, (path, r)
        assert field in json.dumps(r)


def test_no_draft_server_drafts_nothing():
    with start_server("--no-draft", "-np", "1") as s:
        s.wait_ready()
        _, r = post(s.url + "/v1/chat/completions", {"model": "bubo", "messages": COPY, "max_tokens": 48,
                                                     "temperature": 0})
    assert "draft_n" not in r["timings"]


@pytest.mark.parametrize("flags,why", [(["--draft-max", "0"], "--draft-max 0: give at least 1"),
                                       (["--draft-min", "20"], "--draft-min 20: give 0..16"),
                                       (["--spec-type", "eagle"], "--spec-type eagle: not supported"),
                                       (["--spec-type", "draft-simple"], "a draft type needs a draft model"),
                                       (["-md", "x.gguf"], "--model-draft x.gguf: no such file"),
                                       (["-md", "nosuch:7b"], "--model-draft nosuch:7b: unknown model"),
                                       (["-md", "smollm2:135m", "--draft-p-min", "1.5"],
                                        "--draft-p-min 1.5: give 0..1"),
                                       (["-md", "smollm2:135m", "--no-draft"], "--no-draft and --model-draft"),
                                       (["-md", "smollm2:135m", "--draft-requant", "q4_k"],
                                        "--draft-requant q4_k: give one of q4_0"),
                                       (["--draft-requant", "q4_0"], "for a draft model's weights (--model-draft)"),
                                       (["-devd", "cuda0"], "-devd: not supported")])
def test_bad_draft_flags_are_one_line_at_start(flags, why):
    r = subprocess.run([sys.executable, "-m", "bubo", "serve", "-m", "smollm2:135m", "--port", "0", *flags],
                       capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode in (1, 2) and len(r.stderr.splitlines()) == 1, r.stderr
    assert why in r.stderr


@pytest.mark.parametrize("draft,why", [("smollm2:135m", "differ in tokenizer.ggml.pre: 'smollm' against 'qwen2'"),
                                       ("qwen2.5-coder:1.5b", "is larger than the target")])
def test_a_draft_model_that_cannot_draft_stops_the_server_at_start(catalog_model, draft, why):
    catalog_model(draft)
    r = subprocess.run([sys.executable, "-m", "bubo", "serve", "-m", "qwen2.5-coder:0.5b", "--port", "0", "-md", draft],
                       capture_output=True, text=True, timeout=120, cwd=REPO)
    assert r.returncode == 1, r.stderr
    last = r.stderr.splitlines()[-1]
    assert last.startswith("bubo serve: error: the model qwen2.5-coder:0.5b cannot be served: DraftModelError") and \
        why in last, r.stderr


def test_a_server_with_a_draft_model_reports_its_drafts(catalog_model):
    catalog_model("qwen2.5-coder:0.5b")
    ask = {"prompt": "def is_prime(n: int) -> bool:\n", "n_predict": 64, "temperature": 0}
    with start_server("-md", "qwen2.5-coder:0.5b", "-np", "2", model="qwen2.5-coder:1.5b") as s:
        s.wait_ready()
        _, r = post(s.url + "/completion", ask)
        _, off = post(s.url + "/completion", {**ask, "speculative.n_max": 0})
    assert any("drafts by qwen2.5-coder:0.5b" in line and "weights as q4_0" in line for line in s.log), s.log
    assert r["content"] == off["content"]
    assert 0 < r["timings"]["draft_n_accepted"] <= r["timings"]["draft_n"]
    assert "draft_n" not in off["timings"]
