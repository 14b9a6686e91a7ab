"""The issue's must-show: 40 JSON Schemas of real-world shape (tests/chat/testdata/schemas.json),
5 seeded generations each on qwen2.5-coder:0.5b through one in-process Engine, every answer
parsed and validated with the `jsonschema` package. An answer cut by max_tokens is a failure.
(The suite runs 1 seed of the 5, BUBO_TEST_FULL_SWEEPS=1 all 5: engines.sweep.)"""

from __future__ import annotations

import json
from pathlib import Path

import gevent
import jsonschema
import pytest

from bubo._grammar import Grammar
from bubo.chat.schema import schema_to_gbnf
from bubo.engine import FinishEvent, GenerationRequest, TokenEvent
from bubo.sampling import SamplingParams

from engines import start_engine, sweep

CASES = json.loads((Path(__file__).parent / "testdata" / "schemas.json").read_text())
SEEDS = sweep([11, 22, 33, 44, 55], 1)
MAX_TOKENS = 200  # every test schema has instances far shorter: running out is the model's ramble, a failure
pytestmark = [pytest.mark.slow, pytest.mark.models]

PARALLEL = 32
TEMPERATURE = 0.8  # seeds that differ should give answers that differ
FORMATS = jsonschema.Draft202012Validator.FORMAT_CHECKER  # 2020-12 formats (RFC 3339 time), checked


@pytest.fixture(scope="module")
def engine(catalog_model):
    # every generation at once: one batch of PARALLEL rows decodes far faster than its rows one by one
    e = start_engine(catalog_model("qwen2.5-coder:0.5b"), n_ctx=PARALLEL * 512, n_parallel=PARALLEL)
    yield e
    e.stop()


def generate(engine, tokens, grammar, seed):
    events = list(engine.submit(GenerationRequest(tokens, SamplingParams(temperature=TEMPERATURE, seed=seed),
                                                  max_tokens=MAX_TOKENS, grammar=grammar)))
    fin = events[-1]
    assert isinstance(fin, FinishEvent), fin
    return "".join(e.text for e in events if isinstance(e, TokenEvent)), fin


def test_forty_schemas_five_seeds_each_validate(engine):
    assert len(CASES) == 40
    jobs = []
    for case in CASES:
        grammar = Grammar(schema_to_gbnf(case["schema"]))
        prompt = engine.runtime.chat_prompt([{"role": "user", "content": case["prompt"] + " Reply in JSON."}])
        tokens = engine.tokenizer.encode(prompt, add_special=True, parse_special=True)
        jobs += [(case, seed, gevent.spawn(generate, engine, tokens, grammar, seed)) for seed in SEEDS]
    gevent.joinall([job for _, _, job in jobs], raise_error=True)
    failures = []
    for case, seed, job in jobs:
        validator = jsonschema.Draft202012Validator(case["schema"], format_checker=FORMATS)
        text, fin = job.value
        if fin.reason != "stop":
            failures.append(f"{case['name']} seed {seed}: finish {fin.reason} after {fin.completion_tokens} "
                            f"tokens: {text[:120]!r}")
            continue
        try:
            value = json.loads(text)
        except ValueError as e:
            failures.append(f"{case['name']} seed {seed}: not JSON ({e}): {text!r}")
            continue
        errors = [e.message for e in validator.iter_errors(value)]
        if errors:
            failures.append(f"{case['name']} seed {seed}: {errors[0]}: {text!r}")
    assert not failures, f"{len(failures)} of {len(CASES) * len(SEEDS)} generations failed:\n" + "\n".join(failures)
