"""The library's bubo.Model and the server are one generation core, not two that agree by luck:
the same tokens for the same greedy, seeded, penalised and grammar-constrained requests (the
server a real process on smollm2:135m, the library in this one), and both run every token
through the same Generation (bubo/engine/generation.py) in the same Scheduler."""

from __future__ import annotations

import gevent
import pytest
from client import call_json

import bubo
from bubo.engine import FinishEvent, GenerationRequest, TokenEvent
from bubo.engine import generation as gen_mod
from bubo.engine.engine import Engine
from bubo.engine.scheduler import Scheduler
from bubo.sampling import SamplingParams

from engines import THREADS
from reference.tiny import write_tiny_model

pytestmark = pytest.mark.models

PROMPT = "The old lighthouse keeper looked at the sea and said"
GRAMMAR = 'root ::= "The answer is " [0-9]+ ("." | "!")'
CASES = [
    ("greedy", dict(temperature=0)),
    ("seeded", dict(temperature=0.9, seed=42)),
    ("seeded, top-k and min-p", dict(temperature=1.2, seed=7, top_k=20, min_p=0.1)),
    ("penalties and DRY", dict(temperature=0.7, seed=3, repeat_penalty=1.3, presence_penalty=0.5,
                               dry_multiplier=0.8)),
]


@pytest.fixture(scope="module")
def library():
    return bubo.Model("smollm2:135m", n_ctx=2048, n_threads=THREADS)


def server_tokens(url, **body):
    status, r = call_json(url + "/completion", "POST", {"return_tokens": True, **body})
    assert status == 200, r
    return r["tokens"], r["content"]


@pytest.mark.parametrize("name,sampling", CASES, ids=[c[0] for c in CASES])
def test_library_and_server_sample_the_same_tokens(base_url, library, name, sampling):
    want, text = server_tokens(base_url, prompt=PROMPT, n_predict=32, **sampling)
    got = library.complete(PROMPT, max_tokens=32, **sampling)
    assert got.tokens == want and got.text == text
    # and again, now that both hold the prompt in their caches
    assert library.complete(PROMPT, max_tokens=32, **sampling).tokens == want
    assert server_tokens(base_url, prompt=PROMPT, n_predict=32, **sampling)[0] == want


def test_library_and_server_agree_under_a_grammar(base_url, library):
    want, text = server_tokens(base_url, prompt="Q: what is 6 times 7?\nA:", n_predict=16, temperature=0.8,
                               seed=11, grammar=GRAMMAR)
    got = library.complete("Q: what is 6 times 7?\nA:", max_tokens=16, temperature=0.8, seed=11, grammar=GRAMMAR)
    assert got.tokens == want and got.text == text and text.startswith("The answer is ")


def test_library_chat_and_the_chat_route_agree(base_url, library):
    msgs = [{"role": "user", "content": "Write one sentence about owls."}]
    status, r = call_json(base_url + "/v1/chat/completions", "POST",
                          {"model": "bubo", "messages": msgs, "max_tokens": 40, "temperature": 0.8, "seed": 5})
    assert status == 200, r
    got = library.chat(msgs, max_tokens=40, temperature=0.8, seed=5)
    assert got.text == r["choices"][0]["message"]["content"]
    assert len(got.tokens) == r["usage"]["completion_tokens"]


def test_both_run_the_same_generation_core(tmp_path, monkeypatch):
    """One Generation.step for the library and the engine: the tokens both produce pass through it."""
    path = write_tiny_model(tmp_path / "tiny.gguf", "llama", types="F32")
    seen: list[str] = []
    step = gen_mod.Generation.step

    def counting(self, *args, **kwargs):
        seen.append(self.runtime.name)
        return step(self, *args, **kwargs)

    monkeypatch.setattr(gen_mod.Generation, "step", counting)
    lib = bubo.Model(path, n_ctx=128, n_threads=1)
    assert isinstance(lib._sched, Scheduler)
    c = lib.complete([1, 2, 3], max_tokens=6, temperature=0, ignore_eos=True)
    assert len(seen) == len(c.tokens) == 6

    e = Engine(path, n_ctx=128, n_threads=1, n_parallel=1)
    e.start()
    try:
        with gevent.Timeout(60):
            while not e.ready:
                assert e.load_error is None
                gevent.sleep(0.01)
        events = list(e.submit(GenerationRequest([1, 2, 3], SamplingParams(temperature=0), max_tokens=6,
                                                 ignore_eos=True)))
    finally:
        e.stop()
    assert isinstance(events[-1], FinishEvent)
    assert [ev.token for ev in events if isinstance(ev, TokenEvent)] == c.tokens
    assert len(seen) == 12 and seen[6:] == [e.model_name] * 6
