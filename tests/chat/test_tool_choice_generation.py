"""The issue's must-show for tool_choice: 50 seeded runs with "required" on qwen2.5-coder:0.5b
(Hermes calls) and on smollm2:135m (whose template knows no tools: bare JSON calls) all yield
a call whose arguments validate against its tool's schema (jsonschema); a named choice always
calls that function. The request path is the routes' own: pipeline.prepare (render, grammar,
parser), one in-process Engine per model, the seeds submitted together. (The suite runs 20 of the
50 "required" runs, BUBO_TEST_FULL_SWEEPS=1 all 50: engines.sweep.)"""

from __future__ import annotations

import json

import gevent
import jsonschema
import pytest

from bubo.api import pipeline
from bubo.chat.constrain import REQUIRED
from bubo.engine import GenerationRequest
from bubo.sampling import SamplingParams

from engines import start_engine, sweep

pytestmark = [pytest.mark.slow, pytest.mark.models]

N_RUNS = 50
N_PARALLEL = 5
MAX_TOKENS = 160  # every call below fits in far fewer; a cut call is a failure
TEMPERATURE = 0.8  # seeds that differ should give calls that differ

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city", "parameters": {
        "type": "object", "properties": {
            "city": {"type": "string", "maxLength": 40},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "add", "description": "Add two integers", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"], "additionalProperties": False}}},
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
MESSAGES = [{"role": "user", "content": "What is the weather like in Paris, and what is 2 + 3?"}]


@pytest.fixture(scope="module", params=["qwen2.5-coder:0.5b", "smollm2:135m"])
def engine(request, catalog_model):
    e = start_engine(catalog_model(request.param), n_ctx=2048, n_parallel=N_PARALLEL)
    yield e
    e.stop()


def answer(engine, seed, choice, parallel=False, tools=TOOLS):
    """(calls, content, finish) of one chat request, as the chat route runs it."""
    conv = pipeline.Conversation(MESSAGES, None, tools, True, {}, SamplingParams(temperature=TEMPERATURE, seed=seed),
                                 MAX_TOKENS, False, tool_choice=choice, parallel_tool_calls=parallel)
    prep = pipeline.prepare(engine.runtime, conv)
    stream = engine.submit(GenerationRequest(prep.prompt.tokens, conv.params, max_tokens=MAX_TOKENS,
                                             grammar=prep.grammar))
    out = pipeline.Output()
    pipeline.gather(out, pipeline.run_events(stream, prep.parser))
    return out


def run_all(engine, seeds, choice, parallel=False, tools=TOOLS):
    jobs = [gevent.spawn(answer, engine, s, choice, parallel, tools) for s in seeds]
    gevent.joinall(jobs, raise_error=True)
    return [j.value for j in jobs]


def check_calls(out, seed, want_name=None, exactly_one=True):
    """A failure's description, or None."""
    if out.finish.reason != "stop":
        return f"seed {seed}: finish {out.finish.reason}: {out.content!r}"
    if not out.tool_calls or (exactly_one and len(out.tool_calls) != 1):
        return f"seed {seed}: {len(out.tool_calls)} calls, content {out.content!r}"
    if out.content.strip():
        return f"seed {seed}: content beside the call: {out.content!r}"
    for call in out.tool_calls:
        if want_name is not None and call.name != want_name:
            return f"seed {seed}: called {call.name}, not {want_name}"
        try:
            jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])
        except (ValueError, KeyError, jsonschema.ValidationError) as e:
            return f"seed {seed}: {call.name}({call.arguments}): {e}"
    return None


def test_required_always_calls_with_valid_arguments(engine):
    outs = run_all(engine, sweep(range(N_RUNS), 20), REQUIRED)
    failures = [f for s, o in enumerate(outs) if (f := check_calls(o, s)) is not None]
    assert not failures, f"{len(failures)} of {N_RUNS} runs failed:\n" + "\n".join(failures)


def test_a_named_choice_always_calls_that_function(engine):
    for name in ("add", "get_weather"):
        outs = run_all(engine, range(1000, 1000 + N_PARALLEL), name)
        failures = [f for s, o in enumerate(outs) if (f := check_calls(o, s, want_name=name)) is not None]
        assert not failures, "\n".join(failures)


def test_parallel_calls_allow_several(engine):
    outs = run_all(engine, range(2000, 2000 + N_PARALLEL), REQUIRED, parallel=True)
    failures = [f for s, o in enumerate(outs) if (f := check_calls(o, s, exactly_one=False)) is not None]
    assert not failures, "\n".join(failures)


def test_none_never_calls(engine):
    # tool_choice "none" is tools=None by the time a route renders (chat.parse_chat_request)
    for out in run_all(engine, range(3000, 3000 + N_PARALLEL), None, tools=None):
        assert out.tool_calls == [] and out.content
