"""Parallel slots on smollm2:135m: continuous batching, batch invariance, the prefix cache across
requests, preemption, the wait queue and its bound, cancellation of queued requests."""

from __future__ import annotations

import gevent
import pytest

from bubo.api.llamacpp.shapes import slots_json, timings_json
from bubo.engine import FinishEvent, GenerationRequest, QueueFullError, TokenEvent
from bubo.engine.engine import Engine
from bubo.sampling import SamplingParams

from engines import start_engine

GREEDY = SamplingParams(temperature=0)
SEEDED = SamplingParams(temperature=0.9, top_k=40, top_p=0.95, seed=1234)

QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain photosynthesis in one sentence.",
    "List three prime numbers.",
    "Who wrote Hamlet?",
    "Why is the sky blue?",
    "Name a famous painting.",
    "What is two plus two?",
    "Describe a cat.",
    "What does a compiler do?",
    "Give me a synonym for happy.",
    "How many legs does a spider have?",
    "What is the boiling point of water?",
    "Translate 'hello' into Spanish.",
    "What is the largest planet?",
    "Suggest a name for a dog.",
    "What is a noun?",
    "Where do penguins live?",
    "What color is chlorophyll?",
    "Name an ocean.",
]


def start(catalog_model, **kw) -> Engine:
    return start_engine(catalog_model("smollm2:135m"), **kw)


@pytest.fixture(scope="module")
def engine(catalog_model):
    # ubatch 64: prompts are read in chunks that share steps with the other slots' decode rows
    e = start(catalog_model, n_ctx=4096, n_parallel=8, n_ubatch=64)
    yield e
    e.stop()


def chat_ids(engine, question, system="You are a helpful assistant."):
    text = engine.runtime.chat_prompt([{"role": "system", "content": system}, {"role": "user", "content": question}])
    return engine.tokenizer.encode(text, add_special=True, parse_special=True)


def collect(stream):
    events = list(stream)
    assert events and isinstance(events[-1], FinishEvent), events[-1:]
    assert all(isinstance(e, TokenEvent) for e in events[:-1])
    return events[:-1], events[-1]


def together(engine, reqs):
    """Submit every request at once and read them all concurrently."""
    streams = [engine.submit(r) for r in reqs]
    jobs = [gevent.spawn(collect, s) for s in streams]
    gevent.joinall(jobs, raise_error=True, timeout=300)
    assert all(j.successful() for j in jobs)
    return [j.value for j in jobs]


def wait_idle(engine):
    with gevent.Timeout(30):
        while engine.busy or engine.metrics().requests_deferred:
            gevent.sleep(0.005)


def signature(toks):
    """Everything a client sees of a generation, bit for bit (floats compared exactly)."""
    return [(t.token, t.text, t.logprob, tuple(t.top)) for t in toks]


def neighbours(engine, n):
    """n other requests of different lengths: short questions and long prompts that take
    several prefill chunks while the target generates."""
    long_text = " ".join(f"Fact {i}: the number {i} squared is {i * i}." for i in range(40))
    out = []
    for i in range(n):
        q = QUESTIONS[i % len(QUESTIONS)]
        if i % 2:
            q = long_text[: 300 + 250 * i] + " " + q
        out.append(GenerationRequest(chat_ids(engine, q), SEEDED.replace(seed=100 + i), max_tokens=40 + 7 * i,
                                     n_probs=2))
    return out


@pytest.mark.parametrize("params", [SEEDED, GREEDY], ids=["seeded", "greedy"])
def test_a_request_gives_the_same_bits_alone_and_beside_1_3_7_others(engine, params):
    target = GenerationRequest(chat_ids(engine, "Tell me a short story about a robot who learns to paint."),
                               params, max_tokens=48, n_probs=5, cache_prompt=False)
    alone, fin = collect(engine.submit(target))
    assert len(alone) == fin.completion_tokens > 8
    for n in (1, 3, 7):
        before = engine.metrics().n_decode_total
        results = together(engine, [target, *neighbours(engine, n)])
        toks, fin2 = results[0]
        assert signature(toks) == signature(alone), f"beside {n} others"
        assert fin2.reason == fin.reason and fin2.completion_tokens == fin.completion_tokens
        m = engine.metrics()
        # the requests really shared steps: fewer decode calls than rows of all of them alone
        assert m.n_busy_slots_per_decode > 1
        assert m.n_decode_total - before < sum(f.completion_tokens for _, f in results)
    wait_idle(engine)


def test_a_shared_system_prompt_is_read_once_for_twenty_questions(engine):
    system = " ".join(f"Rule {i}: always answer question {i} with care, citing source {i * 7 % 13}."
                      for i in range(120))
    prompts = [chat_ids(engine, q, system=system) for q in QUESTIONS]
    shared = 0
    for a, b in zip(prompts[0], prompts[1]):
        if a != b:
            break
        shared += 1
    assert shared >= 2000, shared
    bs = engine.kv.block_size
    fins = []
    for p in prompts:
        _, fin = collect(engine.submit(GenerationRequest(p, GREEDY, max_tokens=4)))
        fins.append(fin)
    assert fins[0].cached_tokens < shared
    for fin in fins[1:]:
        # every full block of the shared prefix comes from the cache
        assert fin.cached_tokens >= shared // bs * bs, (fin.cached_tokens, shared)
        assert timings_json(fin.timings)["prompt_n"] == fin.prompt_tokens - fin.cached_tokens
    m = engine.metrics()
    assert m.prefix_cache_hit_ratio > 0
    wait_idle(engine)


def test_a_shared_history_sent_at_once_is_read_once(engine):
    """Four requests that start with the same long history, sent together: one slot reads it,
    the others wait for its blocks to be cached and read only their own question; the answers are
    those each gets alone."""
    wait_idle(engine)
    system = " ".join(f"Entry {i}: the lamp in room {i} was lit at {i % 12 + 1} o'clock by keeper {i * 5 % 17}."
                      for i in range(90))
    prompts = [chat_ids(engine, q, system=system) for q in QUESTIONS[:4]]
    shared = next(i for i, (a, b) in enumerate(zip(prompts[0], prompts[1])) if a != b)
    bs = engine.kv.block_size
    assert shared >= 1500, shared
    results = together(engine, [GenerationRequest(p, GREEDY, max_tokens=6) for p in prompts])
    fins = [fin for _, fin in results]
    readers = [f for f in fins if f.cached_tokens < shared // bs * bs]
    assert len(readers) == 1, [(f.prompt_tokens, f.cached_tokens) for f in fins]
    assert sum(f.prompt_tokens - f.cached_tokens for f in fins) < shared + 4 * (len(prompts[0]) - shared + bs)
    # the reader's answer and a waiter's (each alone reads its whole prompt again: 1,600 tokens)
    first = next(i for i, f in enumerate(fins) if f in readers)
    for i in (first, (first + 1) % len(prompts)):
        alone, _ = collect(engine.submit(GenerationRequest(prompts[i], GREEDY, max_tokens=6, cache_prompt=False)))
        assert [t.token for t in results[i][0]] == [t.token for t in alone]
    wait_idle(engine)


def test_slots_give_back_every_block_and_the_prefix_cache_keeps_them(engine):
    wait_idle(engine)
    base = engine.metrics()
    together(engine, neighbours(engine, 5))
    wait_idle(engine)
    m = engine.metrics()
    assert m.kv_cache_used_blocks == base.kv_cache_used_blocks == 0
    assert m.kv_cache_cached_blocks > 0
    assert all(not s["is_processing"] and s["cache_n"] == 0 for s in slots_json(engine.slots()))


def test_slots_report_their_task(engine):
    wait_idle(engine)
    stream = engine.submit(GenerationRequest(chat_ids(engine, "Count to fifty."), GREEDY, max_tokens=200,
                                             stop=["END"]))
    first = next(stream)
    assert isinstance(first, TokenEvent)
    busy = [s for s in slots_json(engine.slots()) if s["is_processing"]]
    assert len(slots_json(engine.slots())) == 8 and len(busy) == 1
    s = busy[0]
    assert s["state"] == 4 and s["params"]["n_predict"] == 200 and s["params"]["stop"] == ["END"]
    assert s["n_prompt_tokens"] > 0 and s["next_token"]["n_decoded"] >= 1
    stream.cancel()
    wait_idle(engine)


def test_a_full_cache_preempts_the_newest_and_answers_stay_exact(catalog_model):
    # 4 slots but room for ~2 answers at a time: the newest give their blocks back and resume
    e = start(catalog_model, n_ctx=384, n_parallel=4, n_ubatch=64)
    try:
        reqs = [GenerationRequest(chat_ids(e, q), GREEDY, max_tokens=120, n_probs=1, ignore_eos=True)
                for q in QUESTIONS[:4]]
        alone = [collect(e.submit(r)) for r in reqs]
        both = together(e, reqs)
        for (a, fa), (b, fb) in zip(alone, both):
            assert signature(a) == signature(b)
            assert fa.reason == fb.reason
        assert e.metrics().n_preemptions_total > 0
        wait_idle(e)
        assert e.metrics().kv_cache_used_blocks == 0
    finally:
        e.stop()


def test_queue_bound_refuses_past_it_and_a_cancelled_queued_request_never_starts(catalog_model):
    e = start(catalog_model, n_ctx=1024, n_parallel=1, queue_size=2)
    try:
        prompt = chat_ids(e, "Count from one to one hundred in words.")
        a = e.submit(GenerationRequest(prompt, GREEDY, max_tokens=400))
        assert isinstance(next(a), TokenEvent)  # a holds the one slot
        b = e.submit(GenerationRequest(prompt, GREEDY, max_tokens=4))
        c = e.submit(GenerationRequest(prompt, GREEDY, max_tokens=4))
        with pytest.raises(QueueFullError):
            e.submit(GenerationRequest(prompt, GREEDY, max_tokens=4))
        assert e.metrics().requests_deferred == 2
        started = e.metrics().requests_total
        b.cancel()
        assert e.metrics().requests_deferred == 1
        # a place freed: one more may wait
        d = e.submit(GenerationRequest(prompt, GREEDY, max_tokens=4))
        a.cancel()
        collect(c)
        collect(d)
        wait_idle(e)
        # b never took a slot: only c and d started after a
        assert e.metrics().requests_total == started + 2
    finally:
        e.stop()


def test_a_long_prompt_never_stalls_a_generating_slot_for_more_than_one_chunk(catalog_model):
    e = start(catalog_model, n_ctx=4096, n_parallel=2, n_ubatch=128)
    try:
        a = e.submit(GenerationRequest(chat_ids(e, "Count slowly."), GREEDY, max_tokens=400, ignore_eos=True))
        assert isinstance(next(a), TokenEvent)
        long_prompt = chat_ids(e, " ".join(f"Note {i}: nothing happened on day {i}." for i in range(150)))
        assert len(long_prompt) > 1500
        b = e.submit(GenerationRequest(long_prompt, GREEDY, max_tokens=2, cache_prompt=False))
        steps_before = e.metrics().n_decode_total
        seen_a = 0
        b_first = gevent.spawn(next, b)
        while not b_first.ready():
            assert isinstance(next(a), TokenEvent)
            seen_a += 1
        steps = e.metrics().n_decode_total - steps_before
        n_chunks = -(-len(long_prompt) // (128 - 1))  # the chunks share each step with a's row
        # a got a token from every step that read a chunk of b's prompt (give or take the step
        # running when b arrived and the one that sampled b's first token)
        assert steps >= n_chunks and seen_a >= n_chunks - 2, (seen_a, steps, n_chunks)
        a.cancel()
        collect(b)
    finally:
        e.stop()
