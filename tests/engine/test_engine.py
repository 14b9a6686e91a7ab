"""The engine thread on smollm2:135m: events, one slot, prefix reuse, cancel, context limits."""

from __future__ import annotations

import gevent
import pytest

import bubo
from bubo.api.errors import from_event
from bubo.api.llamacpp.shapes import slots_json, timings_json
from bubo.engine import (
    ContextLengthError,
    ErrorEvent,
    FinishEvent,
    GenerationRequest,
    InsufficientMemoryError,
    NotReadyError,
    Reason,
    TokenEvent,
)
from bubo.engine.engine import Engine
from bubo.sampling import SamplingParams

from engines import THREADS, start_engine, wait_ready

N_CTX = 512
GREEDY = SamplingParams(temperature=0)


@pytest.fixture(scope="module")
def engine(catalog_model):
    e = Engine(str(catalog_model("smollm2:135m")), n_ctx=N_CTX, n_threads=THREADS)
    with pytest.raises(NotReadyError):
        e.submit(GenerationRequest([1, 2, 3]))
    e.start()
    wait_ready(e)
    yield e
    e.stop()


def ids(engine, text):
    return engine.tokenizer.encode(text, add_special=True, parse_special=True)


def run(engine, req):
    events = list(engine.submit(req))
    assert events and isinstance(events[-1], FinishEvent), events[-1:]
    assert all(isinstance(e, TokenEvent) for e in events[:-1])
    return events[:-1], events[-1]


def wait_idle(engine):
    with gevent.Timeout(30):
        while engine.busy or engine.metrics().requests_deferred:
            gevent.sleep(0.005)


def test_events_are_tokens_then_one_finish_and_match_the_python_api(engine):
    prompt = "The capital of France is"
    toks, fin = run(engine, GenerationRequest(ids(engine, prompt), GREEDY, max_tokens=12, n_probs=3))
    want = bubo.Model(engine.model_path, n_ctx=N_CTX, n_threads=THREADS).complete(prompt, max_tokens=12, temperature=0)
    assert "".join(t.text for t in toks) == want.text
    assert [t.token for t in toks] == want.tokens
    assert fin.reason == "length" and fin.stop_string is None
    assert fin.completion_tokens == len(toks) == 12
    assert fin.prompt_tokens == len(ids(engine, prompt))
    for t in toks:
        assert len(t.top) == 3 and t.top[0][0] == t.token  # greedy: the chosen token ranks first
        assert t.logprob == pytest.approx(t.top[0][1]) and t.logprob <= 0
    tm = timings_json(fin.timings)
    assert tm["prompt_n"] + tm["cache_n"] == fin.prompt_tokens and tm["predicted_n"] == 12
    assert set(tm) == {"prompt_n", "prompt_ms", "prompt_per_token_ms", "prompt_per_second", "predicted_n",
                       "predicted_ms", "predicted_per_token_ms", "predicted_per_second", "cache_n",
                       "queue_ms", "cache_miss"}


def test_stop_string_is_cut_and_reported(engine):
    prompt = "The capital of France is"
    full = "".join(t.text for t in run(engine, GenerationRequest(ids(engine, prompt), GREEDY, max_tokens=12))[0])
    stop = full[8:11]  # a stop string from the middle of the greedy answer
    toks, fin = run(engine, GenerationRequest(ids(engine, prompt), GREEDY, max_tokens=12, stop=[stop]))
    text = "".join(t.text for t in toks)
    assert text == full[: full.index(stop)]
    assert fin.reason == "stop" and fin.stop_string == stop
    assert fin.completion_tokens == len(toks) < 12


def test_end_of_generation_token_ends_with_stop(engine):
    chat = engine.runtime.chat_prompt([{"role": "user", "content": "Say hi."}])
    toks, fin = run(engine, GenerationRequest(ids(engine, chat), GREEDY, max_tokens=200))
    assert fin.reason == "stop" and fin.stop_string is None
    assert engine.tokenizer.is_eog(toks[-1].token)
    assert "<|im_end|>" not in "".join(t.text for t in toks)


def test_prefix_reuse_reports_cached_tokens(engine):
    # the prefix cache works in whole KV blocks: a prompt reuses every full block it shares
    bs = engine.kv.block_size
    a = ids(engine, "Once upon a time, in a land far away, there lived a dragon who guarded a golden "
                    "egg in a cave above the sea, and every winter the villagers below climbed the "
                    "cliffs to bring it bread, salt and stories of the world, which it loved more than gold. "
                    "One spring a girl named Mira came alone, carrying no bread at all, only a question "
                    "about the stars that nobody in the village could answer, and the dragon, who")
    assert len(a) > 2 * bs
    b = a + engine.tokenizer.encode(" liked", add_special=False)
    _, f1 = run(engine, GenerationRequest(a, GREEDY, max_tokens=4, cache_prompt=False))
    assert f1.cached_tokens == 0 and timings_json(f1.timings)["prompt_n"] == len(a)
    assert timings_json(f1.timings)["cache_miss"] == "cache_prompt is false"
    _, f2 = run(engine, GenerationRequest(b, GREEDY, max_tokens=4))
    # a's full blocks were cached (whatever was generated after them)
    assert f2.cached_tokens == len(a) // bs * bs and timings_json(f2.timings)["cache_n"] == f2.cached_tokens
    assert timings_json(f2.timings)["prompt_n"] == len(b) - f2.cached_tokens
    # the same prompt again: every full block but the one the last token needs
    toks3, f3 = run(engine, GenerationRequest(b, GREEDY, max_tokens=4))
    assert f3.cached_tokens == (len(b) - 1) // bs * bs and timings_json(f3.timings)["cache_miss"] is None
    _, f4 = run(engine, GenerationRequest(b, GREEDY, max_tokens=4, cache_prompt=False))
    assert f4.cached_tokens == 0
    assert engine.metrics().prompt_tokens_cached_total >= f2.cached_tokens + f3.cached_tokens


def test_one_slot_serialises_requests(engine):
    prompt = ids(engine, "List the planets of the solar system:")
    solo = "".join(t.text for t in run(engine, GenerationRequest(prompt, GREEDY, max_tokens=24, cache_prompt=False))[0])
    a = engine.submit(GenerationRequest(prompt, GREEDY, max_tokens=24, cache_prompt=False))
    b = engine.submit(GenerationRequest(prompt, GREEDY, max_tokens=24, cache_prompt=False))
    first = next(a)
    assert isinstance(first, TokenEvent)
    m = engine.metrics()
    assert m.requests_processing == 1 and m.requests_deferred == 1
    assert slots_json(engine.slots())[0]["is_processing"]
    texts = {}

    def read(name, stream, head=""):
        evs = list(stream)
        texts[name] = head + "".join(e.text for e in evs if isinstance(e, TokenEvent))

    gevent.joinall([gevent.spawn(read, "b", b), gevent.spawn(read, "a", a, first.text)], raise_error=True)
    assert texts == {"a": solo, "b": solo}
    wait_idle(engine)
    assert engine.metrics().requests_deferred == 0 and not slots_json(engine.slots())[0]["is_processing"]


def test_cancel_frees_the_slot_within_one_step(engine):
    long = engine.submit(GenerationRequest(ids(engine, "Count: 1, 2, 3,"), GREEDY, max_tokens=None))
    for _ in range(3):
        assert isinstance(next(long), TokenEvent)
    before = engine.metrics().tokens_predicted_total
    long.cancel()
    n_at_cancel = slots_json(engine.slots())[0]["next_token"]["n_decoded"]
    assert list(long) == []  # a cancelled stream ends without a final event
    wait_idle(engine)
    generated = engine.metrics().tokens_predicted_total - before
    assert generated <= n_at_cancel + 1  # the step running at cancel() may finish, no more
    assert generated < N_CTX // 2  # far from running to the full context
    # the slot serves the next request at once, and correctly
    toks, fin = run(engine, GenerationRequest(ids(engine, "The capital of France is"), GREEDY, max_tokens=3))
    assert fin.completion_tokens == 3


def test_cancel_while_queued_skips_the_request(engine):
    p = ids(engine, "Hello")
    a = engine.submit(GenerationRequest(p, GREEDY, max_tokens=8))
    b = engine.submit(GenerationRequest(p, GREEDY, max_tokens=8))
    b.cancel()
    requests_before = engine.metrics().requests_total
    assert isinstance(list(a)[-1], FinishEvent)
    wait_idle(engine)
    assert list(b) == []
    assert engine.metrics().requests_total - requests_before <= 1


def test_context_length(engine):
    with pytest.raises(ContextLengthError) as e:
        engine.submit(GenerationRequest([1] * N_CTX))
    assert (e.value.prompt_tokens, e.value.n_ctx) == (N_CTX, N_CTX)
    assert str(N_CTX) in str(e.value)
    # two tokens of room: two generated tokens fill the cache, and a third is sampled from the
    # last one's logits (it is never decoded), then "length"
    toks, fin = run(engine, GenerationRequest([1] * (N_CTX - 2), GREEDY, max_tokens=None))
    assert fin.reason == "length" and fin.completion_tokens == 3


def test_bad_requests_are_refused_at_submit(engine):
    with pytest.raises(ValueError, match="empty"):
        engine.submit(GenerationRequest([]))
    with pytest.raises(ValueError, match="out of range"):
        engine.submit(GenerationRequest([engine.tokenizer.n_vocab]))
    with pytest.raises(ValueError, match="max_tokens"):
        engine.submit(GenerationRequest([1], max_tokens=0))


def test_waiting_does_not_block_the_hub(engine):
    """While the reader waits for a long generation, other greenlets keep running."""
    stream = engine.submit(GenerationRequest(ids(engine, "Once upon a time"), GREEDY, max_tokens=40))
    ticks = []

    def ticker():
        for _ in range(10):
            ticks.append(1)
            gevent.sleep(0.001)

    t = gevent.spawn(ticker)
    events = list(stream)
    t.join()
    assert len(ticks) == 10 and isinstance(events[-1], FinishEvent)


def test_default_context_is_the_trained_one_capped_by_memory(monkeypatch):
    from bubo.engine import memory as mem

    md = {"general.architecture": "llama", "llama.context_length": 8192, "llama.block_count": 30,
          "llama.attention.head_count": 9, "llama.attention.head_count_kv": 3, "llama.embedding_length": 576}
    per_token = 2 * 30 * 3 * 64 * int(mem.KV_TYPES["f16"])  # K and V, f16
    monkeypatch.setattr(mem, "available_memory", lambda info=None: 1 << 40)
    assert mem.context_size(md, None) == (8192, 8192)
    assert mem.context_size(md, 1000) == (8192, 1000)
    # past the trained context when asked (llama-server does too): the guard checks each request
    assert mem.context_size(md, 100000) == (8192, 100000)
    # room for 3000 tokens in half the memory: rounded down to a multiple of 256
    monkeypatch.setattr(mem, "available_memory", lambda info=None: int(3000 * per_token / mem.KV_MEMORY_SHARE))
    assert mem.context_size(md, None) == (8192, 2816)
    # a q8_0 cache (K and V) takes 34/32 bytes a value: 5647 tokens fit
    assert mem.context_size(md, None, mem.KV_TYPES["q8_0"]) == (8192, 5632)


def test_cancel_from_another_greenlet_wakes_the_reader(engine):
    stream = engine.submit(GenerationRequest(ids(engine, "Count: 1, 2, 3,"), GREEDY, max_tokens=None))
    assert isinstance(next(stream), TokenEvent)
    got = []

    def reader():
        for ev in stream:
            got.append(ev)

    r = gevent.spawn(reader)
    gevent.sleep(0.1)
    stream.cancel()
    r.join(timeout=5)
    assert r.dead and r.successful()
    assert all(isinstance(e, TokenEvent) for e in got)
    wait_idle(engine)


def test_killing_the_reader_cancels_the_stream(engine):
    stream = engine.submit(GenerationRequest(ids(engine, "Count: 1, 2, 3,"), GREEDY, max_tokens=None))
    r = gevent.spawn(lambda: list(stream))
    gevent.sleep(0.1)
    r.kill()
    assert stream.cancelled
    wait_idle(engine)
    assert not engine.busy


def test_logit_bias_out_of_range_is_refused_at_submit(engine):
    with pytest.raises(ValueError, match="logit_bias token"):
        engine.submit(GenerationRequest([1], SamplingParams(logit_bias={engine.tokenizer.n_vocab: 1.0})))


def test_a_failing_request_ends_with_an_error_event_and_the_engine_goes_on(engine, monkeypatch):
    def broken(plan):
        raise RuntimeError("boom")

    monkeypatch.setattr(engine._sched, "_run", broken)
    events = list(engine.submit(GenerationRequest([1, 2], GREEDY, max_tokens=2)))
    assert len(events) == 1 and isinstance(events[0], ErrorEvent)
    err = from_event(events[0])
    assert events[0].reason is Reason.INTERNAL and (err.status, err.code) == (500, "internal_error")
    assert "boom" in events[0].message
    monkeypatch.undo()
    _, fin = run(engine, GenerationRequest([1, 2], GREEDY, max_tokens=2))
    assert fin.completion_tokens == 2


SMOLLM2_TOKEN_BYTES = 30 * 2 * 3 * 64 * 2  # K and V of 30 layers, 3 KV heads of 64, f16


def test_the_memory_guard_counts_what_the_cache_still_needs(engine):
    prompt = ids(engine, "Hello")
    n, need = engine.kv_bytes_needed(GenerationRequest(prompt, GREEDY, max_tokens=N_CTX * 10))
    assert n == N_CTX  # capped at the context
    assert need <= N_CTX * SMOLLM2_TOKEN_BYTES
    # after a request the cache keeps what it took: a repeat needs nothing more
    req = GenerationRequest(prompt, GREEDY, max_tokens=4)
    assert isinstance(list(engine.submit(req))[-1], FinishEvent)
    assert engine.kv_bytes_needed(req)[1] == 0
    # None: the prompt alone (the answer stops when memory would run short)
    assert engine.kv_bytes_needed(GenerationRequest(prompt, GREEDY, max_tokens=None))[0] == len(prompt)


@pytest.fixture(scope="module")
def roomy(catalog_model):
    """A fresh engine with a context its cache has not taken yet (not taken whole at load either)."""
    from bubo.engine import memory as mem

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(mem, "KV_RESERVE_FRACTION", 0.0)
        e = start_engine(catalog_model("smollm2:135m"), n_ctx=8192)
    yield e
    e.stop()


def test_a_small_cache_is_taken_at_load_and_keeps_several_conversations(catalog_model):
    """A cache small beside free memory is committed whole at load, so the prefix cache keeps
    freed conversations until the context is in use: A, then B, then A again finds A cached
    (when the pool grew with use, B's prefill evicted A's blocks rather than take more memory)."""
    e = start_engine(catalog_model("smollm2:135m"), n_ctx=1024)
    try:
        kv = e.kv
        assert kv.committed_blocks() * kv.block_size == 1024
        words = "harbour ledger tide lamp keeper north quay rope salt chart".split()
        prompts = {name: ids(e, f"Conversation {name}. " + " ".join(words[(i * k) % 10] for i in range(300)))
                   for name, k in (("A", 3), ("B", 7))}
        assert all(300 < len(p) < 480 for p in prompts.values()), {k: len(v) for k, v in prompts.items()}
        cached = []
        for name in "ABA":
            events = list(e.submit(GenerationRequest(prompts[name], GREEDY, max_tokens=2)))
            cached.append(events[-1].cached_tokens)
        assert cached[0] == 0 and cached[1] < 64
        assert cached[2] >= len(prompts["A"]) - kv.block_size, cached
    finally:
        e.stop()


def test_the_memory_guard_refuses_now_or_forever(roomy, monkeypatch):
    from bubo.engine import memory as mem

    engine = roomy
    big = GenerationRequest(ids(engine, "Hi"), GREEDY, max_tokens=4096)
    n, need = engine.kv_bytes_needed(big)
    assert need > 0
    with pytest.raises(InsufficientMemoryError) as e:
        engine.submit(big, mem_available=mem.MEM_SAFETY_MARGIN + need - 1)
    assert not e.value.permanent and e.value.needed == need and e.value.n_tokens == n
    assert "send the request again" in str(e.value)
    # nothing was queued: a request that fits runs at once
    stream = engine.submit(big, mem_available=mem.MEM_SAFETY_MARGIN + need)
    stream.cancel()
    # a machine smaller than the request, whatever is free
    monkeypatch.setattr(mem, "meminfo", lambda: {"MemTotal": mem.rss() + need // 2})
    monkeypatch.setattr(mem, "cgroup_limit", lambda: None)
    with pytest.raises(InsufficientMemoryError) as e:
        engine.submit(big, mem_available=1 << 40)
    assert e.value.permanent and "at most" in str(e.value)


def test_memory_budget_reads_the_machine(monkeypatch):
    from bubo.engine import memory as mem

    monkeypatch.setattr(mem, "meminfo", lambda: {"MemTotal": 16 << 30, "MemAvailable": 10 << 30})
    monkeypatch.setattr(mem, "rss", lambda: 1 << 30)
    monkeypatch.setattr(mem, "cgroup_limit", lambda: None)
    assert mem.memory_budget() == (15 << 30, (10 << 30) - mem.MEM_SAFETY_MARGIN)
    assert mem.memory_budget(100) == (15 << 30, 0)
    # a cgroup limit below the machine bounds both
    monkeypatch.setattr(mem, "cgroup_limit", lambda: (4 << 30, 3 << 30))
    assert mem.memory_budget() == (3 << 30, (1 << 30) - mem.MEM_SAFETY_MARGIN)
    # and the real machine answers something plausible
    monkeypatch.undo()
    ceiling, available = mem.memory_budget()
    assert ceiling is not None and available is not None and 0 <= available <= ceiling + mem.rss()


def test_an_answer_without_max_tokens_ends_where_memory_runs_short(catalog_model, monkeypatch):
    from bubo.engine import memory as mem

    # a cache that is small beside free memory is taken whole at load: keep this one growing with use
    monkeypatch.setattr(mem, "KV_RESERVE_FRACTION", 0.0)
    e = start_engine(catalog_model("smollm2:135m"), n_ctx=8192)
    try:
        tok = e.tokenizer
        no_eog = {t: float("-inf") for t in range(tok.n_vocab) if tok.is_eog(t)}
        req = GenerationRequest(ids(e, "Count: 1, 2, 3,"), SamplingParams(temperature=0, logit_bias=no_eog))
        stream = e.submit(req, mem_available=1 << 40)
        first = next(stream)
        # the prompt took the first chunk of the cache; from now on nothing more is available
        monkeypatch.setattr(mem, "memory_budget", lambda override=None: (1 << 40, 0))
        with gevent.Timeout(120):
            events = [first, *stream]
        assert isinstance(events[-1], FinishEvent) and events[-1].reason == "length"
        kv = e.kv
        fin = events[-1]
        # it stopped exactly where the cache would have had to grow, far short of the context:
        # the last token it sampled would have been the first of an uncommitted block
        assert fin.prompt_tokens + fin.completion_tokens - 1 == kv.committed_blocks() * kv.block_size < e.n_ctx
    finally:
        e.stop()
