"""Answers that fit max_tokens: 40 real-world schemas (recursive trees, long arrays, long
strings, unions, formats; tests/api/testdata/real_schemas.json), each with a prompt that asks
for far more than fits, x 5 seeds on qwen2.5-coder:0.5b at max_tokens 64: every answer parses
and validates (jsonschema, formats checked), because the grammar steers the answer to a short
ending when the tokens left get close to what it needs to finish (bubo.engine.fit); the
response says so (steered_to_fit) and such an answer ends with the end-of-generation token
(finish_reason "stop"). (The suite runs 1 seed of the 5, BUBO_TEST_FULL_SWEEPS=1 all 5:
engines.sweep.)"""

from __future__ import annotations

import json
import pathlib
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import pytest
from client import call_json

from .conftest import start_server
from engines import sweep

pytestmark = [pytest.mark.slow, pytest.mark.models]

SCHEMAS = json.loads((pathlib.Path(__file__).parent / "testdata" / "real_schemas.json").read_text())
SEEDS = sweep(range(5), 1)
MAX_TOKENS = 64


def post(url: str, body: dict) -> dict:
    status, answer = call_json(url, "POST", body, timeout=300)
    assert status == 200, answer
    return answer

@pytest.fixture(scope="module")
def qwen():
    with start_server("-np", "32", model="qwen2.5-coder:0.5b", ctx=16384) as s:
        yield s.wait_ready()


def test_the_schemas_are_forty_real_ones():
    assert len(SCHEMAS) == 40 and len({s["name"] for s in SCHEMAS}) == 40
    text = json.dumps(SCHEMAS)
    assert text.count('"$ref"') >= 6  # recursive ones among them
    for s in SCHEMAS:
        jsonschema.Draft202012Validator.check_schema(s["schema"])


def test_every_answer_parses_and_validates_within_max_tokens(qwen):
    def one(job: tuple[dict, int]) -> tuple[dict, int, dict]:
        entry, seed = job
        body = {"model": "bubo", "messages": [{"role": "user", "content": entry["prompt"]}],
                "response_format": {"type": "json_schema",
                                    "json_schema": {"name": entry["name"], "schema": entry["schema"]}},
                "max_tokens": MAX_TOKENS, "temperature": 0.8, "seed": seed}
        return entry, seed, post(qwen.url + "/v1/chat/completions", body)

    jobs = [(entry, seed) for entry in SCHEMAS for seed in SEEDS]
    with ThreadPoolExecutor(32) as pool:  # one batch of 32 decodes far faster than 32 one by one
        results = list(pool.map(one, jobs))
    steered = 0
    for entry, seed, r in results:
        choice = r["choices"][0]
        where = f"{entry['name']} seed {seed}: {choice['message']['content']!r}"
        assert r["usage"]["completion_tokens"] <= MAX_TOKENS, where
        value = json.loads(choice["message"]["content"])
        validator = jsonschema.Draft202012Validator(entry["schema"],
                                                    format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
        errors = [e.message for e in validator.iter_errors(value)]
        assert not errors, (where, errors)
        steered += bool(choice.get("steered_to_fit"))
        if choice.get("steered_to_fit"):  # a steered answer ends with its end-of-generation token
            assert choice["finish_reason"] == "stop", where
    # the prompts ask for far more than 64 tokens: most answers had to be steered to their end
    assert steered >= len(results) // 2, steered
