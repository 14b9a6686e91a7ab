"""One request's failure is its own: a sampling step that cannot go on ends that request (before
it runs where that can be known), the others in the same batch go on; a stream its reader leaves
unread pauses its request and resumes it when read."""

from __future__ import annotations

import gevent
import pytest

from bubo._grammar import Grammar
from bubo.engine import ErrorEvent, FinishEvent, GenerationRequest, Reason, TokenEvent
from bubo.engine.streams import MAX_UNREAD_EVENTS
from bubo.engine.types import NoTokenError
from bubo.sampling import SamplingParams

from engines import start_engine

GREEDY = SamplingParams(temperature=0)


@pytest.fixture(scope="module")
def engine(catalog_model):
    e = start_engine(catalog_model("smollm2:135m"), n_ctx=1024, n_parallel=4, draft=None)
    yield e
    e.stop()


def ids(engine, text):
    return engine.tokenizer.encode(text, add_special=True, parse_special=True)


def banned_all_but(engine, keep):
    return {t: float("-inf") for t in range(engine.runtime.n_vocab) if t not in keep}


def test_a_ban_of_every_first_token_is_refused_before_it_runs(engine):
    a = engine.tokenizer.encode("a", add_special=False)[0]
    req = GenerationRequest(ids(engine, "x"), SamplingParams(temperature=0, logit_bias=banned_all_but(engine, {a})),
                            max_tokens=3, grammar=Grammar('root ::= "yes"'))
    with pytest.raises(NoTokenError, match="bans every token the grammar allows to start the answer") as e:
        engine.submit(req)
    assert e.value.reason is Reason.NO_TOKEN
    everything = GenerationRequest(ids(engine, "x"), SamplingParams(logit_bias=banned_all_but(engine, set())),
                                   max_tokens=3)
    with pytest.raises(NoTokenError, match="every token the vocabulary holds"):
        engine.submit(everything)


def test_a_request_that_runs_out_of_tokens_ends_alone(engine):
    """The grammar wants "a" then "b"; every token but "a" is banned: the second step has none.
    Three greedy requests in the same batches finish as they would alone."""
    a = engine.tokenizer.encode("a", add_special=False)[0]
    prompts = ["Tell me a story about owls.", "The capital of France is", "1, 2, 3, 4,"]
    alone = [[ev.token for ev in engine.submit(GenerationRequest(ids(engine, p), GREEDY, max_tokens=40))
              if isinstance(ev, TokenEvent)] for p in prompts]
    streams = [engine.submit(GenerationRequest(ids(engine, p), GREEDY, max_tokens=40)) for p in prompts]
    bad = engine.submit(GenerationRequest(ids(engine, "x"), SamplingParams(temperature=0, logit_bias=banned_all_but(
        engine, {a})), max_tokens=5, grammar=Grammar('root ::= "a" "b"')))

    def read(stream):
        return list(stream)

    jobs = [gevent.spawn(read, s) for s in [*streams, bad]]
    gevent.joinall(jobs, timeout=120)
    *good, failed = [j.get() for j in jobs]
    assert [ev.text for ev in failed[:-1]] == ["a"]
    assert isinstance(failed[-1], ErrorEvent) and failed[-1].reason is Reason.NO_TOKEN
    assert "after 1 generated token" in failed[-1].message
    for events, want in zip(good, alone):
        assert isinstance(events[-1], FinishEvent), events[-1]
        assert [ev.token for ev in events if isinstance(ev, TokenEvent)] == want
    assert engine.submit(GenerationRequest(ids(engine, "Hi"), GREEDY, max_tokens=2))  # still serving


def test_an_unread_stream_pauses_its_request_and_goes_on_once_read(engine):
    stream = engine.submit(GenerationRequest(ids(engine, "Once upon a time"), GREEDY, max_tokens=400,
                                             ignore_eos=True))
    with gevent.Timeout(60):
        while not stream.backlogged:
            gevent.sleep(0.01)
    gevent.sleep(0.5)  # it would make some 100 tokens meanwhile if it went on
    slot = next(s for s in engine.slots() if s.phase.value != "idle")
    assert MAX_UNREAD_EVENTS <= slot.n_decoded <= MAX_UNREAD_EVENTS + 20, slot.n_decoded
    # another request is served meanwhile
    other = list(engine.submit(GenerationRequest(ids(engine, "Hi"), GREEDY, max_tokens=4)))
    assert isinstance(other[-1], FinishEvent)
    events = list(stream)  # read: it resumes, to its end
    assert isinstance(events[-1], FinishEvent) and events[-1].completion_tokens == 400
