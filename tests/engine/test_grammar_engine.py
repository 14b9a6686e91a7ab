"""Grammar-constrained generation through the engine on smollm2:135m: every answer is a sentence
of the grammar, and ends (EOG) only where the grammar accepts."""

from __future__ import annotations

import json
import re

import gevent
import pytest

from bubo._grammar import Grammar
from bubo.engine import FinishEvent, GenerationRequest, TokenEvent
from bubo.sampling import SamplingParams

from engines import start_engine

JSONISH = r'''
root   ::= "{" ws "\"name\":" ws string "," ws "\"age\":" ws number ws "}"
string ::= "\"" [a-zA-Z ]{1,20} "\""
number ::= [1-9] [0-9]{0,2}
ws     ::= [ ]?
'''


@pytest.fixture(scope="module")
def engine(catalog_model):
    e = start_engine(catalog_model("smollm2:135m"), n_ctx=2048, n_parallel=4)
    yield e
    e.stop()


def chat(engine, text):
    prompt = engine.runtime.chat_prompt([{"role": "user", "content": text}])
    return engine.tokenizer.encode(prompt, add_special=True, parse_special=True)


def answer(engine, req):
    events = list(engine.submit(req))
    assert isinstance(events[-1], FinishEvent), events[-1]
    assert all(isinstance(e, TokenEvent) for e in events[:-1])
    return "".join(e.text for e in events[:-1]), events[-1], events[:-1]


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_seeded_answers_are_sentences_of_the_grammar(engine, seed):
    req = GenerationRequest(chat(engine, "Describe a person as JSON."), SamplingParams(temperature=1.0, seed=seed),
                            max_tokens=60, grammar=Grammar(JSONISH))
    text, fin, toks = answer(engine, req)
    assert fin.reason == "stop" and engine.tokenizer.is_eog(toks[-1].token), (text, fin.reason)
    obj = json.loads(text)
    assert set(obj) == {"name", "age"} and 1 <= obj["age"] <= 999
    assert re.fullmatch(r"[a-zA-Z ]{1,20}", obj["name"])


def test_a_choice_grammar_ends_right_after_the_choice(engine):
    g = Grammar('root ::= "yes" | "no"')
    text, fin, toks = answer(engine, GenerationRequest(chat(engine, "Is water wet?"), SamplingParams(temperature=0),
                                                       max_tokens=10, grammar=g))
    assert text in ("yes", "no") and fin.reason == "stop"


def test_a_grammar_request_is_batch_invariant(engine):
    g = Grammar(JSONISH)
    req = GenerationRequest(chat(engine, "Describe a person as JSON."), SamplingParams(temperature=0.8, seed=9),
                            max_tokens=60, n_probs=3, grammar=g, cache_prompt=False)
    alone = answer(engine, req)[2]
    others = [GenerationRequest(chat(engine, q), SamplingParams(temperature=0.7, seed=i), max_tokens=50)
              for i, q in enumerate(["Tell a joke.", "Name three rivers.", "What is rust?"])]
    streams = [engine.submit(r) for r in [req, *others]]
    jobs = [gevent.spawn(list, s) for s in streams]
    gevent.joinall(jobs, raise_error=True, timeout=120)
    beside = jobs[0].value[:-1]
    assert [(e.token, e.logprob, tuple(e.top)) for e in beside] == [(e.token, e.logprob, tuple(e.top)) for e in alone]


def test_end_of_generation_only_where_the_grammar_accepts(engine):
    # "a"s then one "b": the answer may stop only after the "b"
    g = Grammar('root ::= "a" root | "a" "b"')
    text, fin, _ = answer(engine, GenerationRequest(chat(engine, "Say a."), SamplingParams(temperature=0),
                                                    max_tokens=12, grammar=g))
    assert re.fullmatch(r"a+b?", text)
    assert (fin.reason == "stop") == text.endswith("b")
    # a language with no finite sentence: "x" then "y" forever, until max_tokens
    endless = Grammar('root ::= "x" loop\nloop ::= "y" loop')
    text, fin, _ = answer(engine, GenerationRequest(chat(engine, "Go."), SamplingParams(temperature=0),
                                                    max_tokens=8, grammar=endless))
    assert fin.reason == "length" and re.fullmatch(r"xy*", text) and fin.completion_tokens == 8
