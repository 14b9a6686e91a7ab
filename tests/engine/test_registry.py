"""The model registry on tiny models, in-process: names, loads on demand, LRU swaps under
--models-max, unload waiting for work in flight, idle sleep, failed loads, autoload off."""

from __future__ import annotations

import contextlib

import gevent
import pytest

from bubo.api import errors
from bubo.engine import FinishEvent, GenerationRequest, NotReadyError, TokenEvent
from bubo.engine.registry import (
    EngineSettings,
    ModelNotLoadedError,
    ModelSpec,
    ModelStatus,
    Registry,
    UnknownModelError,
    implied_names,
)
from bubo.sampling import SamplingParams

from reference.tiny import write_tiny_model

GREEDY = SamplingParams(temperature=0)
SETTINGS = EngineSettings(n_ctx=256, n_threads=1, n_parallel=2)
TIMEOUT_S = 60


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("registry")
    return {"a": write_tiny_model(d / "a.gguf", "llama", types="F32"),
            "b": write_tiny_model(d / "b.gguf", "qwen2", types="F32", seed=1)}


@contextlib.contextmanager
def started(reg, **kw):
    reg.start(**kw)
    try:
        yield reg
    finally:
        reg.stop()


def registry(tiny, **kw):
    specs = [ModelSpec("a", tiny["a"], ("alpha",), SETTINGS), ModelSpec("b", tiny["b"], (), SETTINGS)]
    return Registry(specs, **kw)


def ask(engine, n=8):
    return engine.submit(GenerationRequest([1, 2, 3, 4], GREEDY, max_tokens=n, ignore_eos=True))


def answer(reg, name, n=8):
    engine = reg.acquire(name)
    try:
        events = list(ask(engine, n))
    finally:
        reg.release(reg.lookup(name))
    assert isinstance(events[-1], FinishEvent), events[-1]
    return [e.token for e in events if isinstance(e, TokenEvent)]


def wait_for(cond, what):
    with gevent.Timeout(TIMEOUT_S, AssertionError(f"timed out waiting for {what}")):
        while not cond():
            gevent.sleep(0.01)


def test_names_aliases_and_unknown_models(tiny):
    reg = registry(tiny)
    assert reg.names() == ["a", "b", "alpha", "bubo"]
    assert reg.lookup("alpha") is reg.lookup("a") is reg.lookup("bubo") is reg.default
    with pytest.raises(UnknownModelError, match="'nope' is not served here; the models are 'a', 'b'"):
        reg.lookup("nope")
    with pytest.raises(ValueError, match="two models are named 'a'"):
        Registry([ModelSpec("a", tiny["a"]), ModelSpec("b", tiny["b"], ("a",))])


def test_the_names_a_model_implies(tiny):
    """Catalog names, short names, :latest and file names answer; nothing is loaded to find them."""
    qwen = ModelSpec("qwen2.5-coder:0.5b", "qwen2.5-coder:0.5b")
    assert implied_names(qwen) == ["qwen2.5-coder", "qwen2.5-coder:latest", "qwen2.5-coder:0.5b:latest",
                                   "qwen2.5-coder:0.5b", "qwen2.5-coder-0.5b-q4_k_m"]
    # -m smollm2 (a family name): the full catalog name and the store's file name answer too
    assert implied_names(ModelSpec("smollm2", "smollm2")) == [
        "smollm2:latest", "smollm2:135m", "smollm2", "smollm2-135m-instruct-q4_1"]
    # a file: its name without .gguf; a name ending :latest: the name without it
    assert implied_names(ModelSpec("owl:latest", "/m/Owl-7B.Q4_K_M.gguf")) == ["owl", "Owl-7B.Q4_K_M"]
    reg = registry(tiny)
    for name in ("a:latest", "alpha:latest", "A", "ALPHA", "bubo:latest", "Bubo"):
        assert reg.lookup(name) is reg.lookup("a"), name
    assert reg.lookup("b:latest") is reg.lookup("b")


def test_two_models_implying_one_name(tiny):
    small = ModelSpec("qwen2.5-coder:0.5b", "qwen2.5-coder:0.5b")
    large = ModelSpec("qwen2.5-coder:1.5b", "qwen2.5-coder:1.5b")
    reg = Registry([large, small])
    # the short name means what the catalog says (the 0.5b), whichever model is first
    assert reg.lookup("qwen2.5-coder").name == reg.lookup("qwen2.5-coder:latest").name == "qwen2.5-coder:0.5b"
    assert reg.lookup("qwen2.5-coder-1.5b-q4_k_m").name == "qwen2.5-coder:1.5b"
    # a file name two models imply (the same name in two folders) means neither
    reg = Registry([ModelSpec("one", "/x/m.gguf"), ModelSpec("two", "/y/m.gguf")])
    with pytest.raises(UnknownModelError):
        reg.lookup("m")
    # an id or alias wins over a name another model implies
    reg = Registry([ModelSpec("x", "smollm2:135m"), ModelSpec("smollm2", tiny["a"])])
    assert reg.lookup("smollm2").name == "smollm2" and reg.lookup("smollm2:135m").name == "x"


def test_a_name_close_to_a_served_one_gets_did_you_mean(tiny):
    reg = Registry([ModelSpec("smollm2:135m", "smollm2:135m"), ModelSpec("gemma3:270m", "gemma3:270m")])
    with pytest.raises(UnknownModelError, match=r"'smolm2' is not served here \(did you mean 'smollm2:135m'\?\)"):
        reg.lookup("smolm2")
    assert reg.close_names("gemma:270m") == ["gemma3:270m"]
    assert reg.close_names("llama3") == []
    with pytest.raises(UnknownModelError) as e:
        reg.lookup("llama3")
    assert "did you mean" not in str(e.value)


def test_models_load_on_their_first_request_and_answer_like_a_lone_engine(tiny):
    reg = registry(tiny)
    with started(reg):
        assert [e.status for e in reg.entries] == [ModelStatus.UNLOADED] * 2
        a1 = answer(reg, "a")
        b1 = answer(reg, "b")
        assert reg.lookup("a").status is reg.lookup("b").status is ModelStatus.LOADED
        assert a1 != b1  # two different models answered
        # interleaved, and concurrent, each model gives its own answer again
        ga = [gevent.spawn(answer, reg, n) for n in ("a", "b", "alpha", "b", "a")]
        gevent.joinall(ga, raise_error=True, timeout=TIMEOUT_S)
        assert [g.value for g in ga] == [a1, b1, a1, b1, a1]


def test_models_max_swaps_the_least_recently_used_idle_model(tiny):
    reg = registry(tiny, models_max=1)
    with started(reg):
        answer(reg, "a")
        answer(reg, "b")
        a, b = reg.lookup("a"), reg.lookup("b")
        assert (a.status, b.status) == (ModelStatus.UNLOADED, ModelStatus.LOADED)
        assert a.engine is None  # its engine (and memory) is gone
        answer(reg, "a")
        assert (a.status, b.status) == (ModelStatus.LOADED, ModelStatus.UNLOADED)
        assert a.n_loads == 2


def test_a_request_waiting_for_a_swap_is_answered_once_the_busy_model_is_done(tiny):
    reg = registry(tiny, models_max=1)
    with started(reg):
        engine = reg.acquire("a")
        stream = ask(engine, 40)
        first = next(stream)  # "a" is busy: a stream is being read
        assert isinstance(first, TokenEvent)
        waiting = gevent.spawn(answer, reg, "b")
        gevent.sleep(0.3)
        # "a" must go: it takes no new request, and finishes the one in flight
        assert not waiting.ready() and reg.lookup("a").status is ModelStatus.UNLOADING
        assert reg.lookup("b").status is ModelStatus.LOADING
        rest = list(stream)
        reg.release(reg.lookup("a"))
        assert isinstance(rest[-1], FinishEvent) and rest[-1].completion_tokens == 40  # never cut
        assert len(waiting.get(timeout=TIMEOUT_S)) == 8  # answered, not dropped
        assert reg.lookup("a").status is ModelStatus.UNLOADED


def test_unload_waits_for_the_stream_in_flight(tiny):
    reg = registry(tiny)
    with started(reg):
        engine = reg.acquire("a")
        reg.release(reg.lookup("a"))
        stream = ask(engine, 40)
        assert isinstance(next(stream), TokenEvent)
        unloading = gevent.spawn(reg.unload, "a")
        gevent.sleep(0.3)
        assert not unloading.ready() and reg.lookup("a").status is ModelStatus.UNLOADING
        events = list(stream)
        assert isinstance(events[-1], FinishEvent) and events[-1].completion_tokens == 40
        unloading.get(timeout=TIMEOUT_S)
        assert reg.lookup("a").status is ModelStatus.UNLOADED and engine.stopped and engine.runtime is None
        # the next request loads it again
        assert len(answer(reg, "a")) == 8


def test_an_idle_model_sleeps_and_its_next_request_wakes_it(tiny):
    reg = registry(tiny, sleep_idle_s=0.4)
    with started(reg, sleep_poll_s=0.05):
        first = answer(reg, "a")
        a = reg.lookup("a")
        wait_for(lambda: a.status is ModelStatus.SLEEPING, "a to sleep")
        assert a.engine is None and a.info is not None  # what it was stays known
        assert answer(reg, "a") == first and a.n_loads == 2


def test_autoload_off_loads_only_when_asked(tiny):
    reg = registry(tiny, autoload=False)
    with started(reg):
        with pytest.raises(ModelNotLoadedError, match="not loaded") as refused:
            reg.acquire("b")
        # the engine says what happened; the API adds the route to use
        answer_400 = errors.from_refusal(refused.value)
        assert (answer_400.status, answer_400.code) == (400, "model_not_loaded")
        assert 'POST /models/load {"model": "b"}' in answer_400.message
        reg.load("b")
        wait_for(lambda: reg.lookup("b").status is ModelStatus.LOADED, "b to load")
        assert len(answer(reg, "b")) == 8


def test_a_broken_file_fails_and_the_others_serve(tiny, tmp_path):
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + bytes(100))
    reg = Registry([ModelSpec("a", tiny["a"], (), SETTINGS), ModelSpec("broken", str(broken), (), SETTINGS)])
    reg.check_files()
    with started(reg):
        bad = reg.lookup("broken")
        assert bad.status is ModelStatus.FAILED and "GGUF" in bad.failure
        with pytest.raises(NotReadyError, match="broken failed to load"):
            reg.acquire("broken")
        assert len(answer(reg, "a")) == 8
        # a load is tried again on request, and fails the same way
        reg.load("broken")
        wait_for(lambda: reg.lookup("broken").status is ModelStatus.FAILED, "the retry to fail")


def test_a_model_loading_at_start_answers_not_ready(tiny):
    slow = ModelSpec("a", tiny["a"], (), EngineSettings(n_ctx=256, n_threads=1, load_delay_s=1.0),
                     load_on_startup=True)
    reg = Registry([slow])
    with started(reg):
        with pytest.raises(NotReadyError, match="loading"):
            reg.acquire("a")
        wait_for(lambda: reg.lookup("a").status is ModelStatus.LOADED, "a to load")
        assert len(answer(reg, "a")) == 8


def test_the_memory_guard_covers_the_sum_of_models(tiny, monkeypatch):
    """A load that the memory available cannot hold beside the loaded models first unloads the
    least recently used idle one (whatever --models-max says); with nothing left to unload it is
    refused: for now (503, retry) or for good (507) when the machine could never hold it."""
    import os

    from bubo.engine import InsufficientMemoryError
    from bubo.engine import registry as reg_mod

    size_b = os.path.getsize(tiny["b"])
    reg = registry(tiny, models_max=0)
    with started(reg):
        answer(reg, "a")
        # b fits once a's memory is back
        a = reg.lookup("a")
        monkeypatch.setattr(reg_mod, "memory_budget",
                            lambda override=None: (1 << 40, size_b - 1 if a.engine is not None else size_b))
        answer(reg, "b")  # a had to go to make room
        assert (reg.lookup("a").status, reg.lookup("b").status) == (ModelStatus.UNLOADED, ModelStatus.LOADED)
        reg.unload("b")
        monkeypatch.setattr(reg_mod, "memory_budget", lambda override=None: (1 << 40, size_b - 1))
        with pytest.raises(InsufficientMemoryError) as e:
            reg.acquire("b")
        assert not e.value.permanent and "weights of b" in str(e.value)
        monkeypatch.setattr(reg_mod, "memory_budget", lambda override=None: (size_b - 1, 0))
        with pytest.raises(InsufficientMemoryError) as e:
            reg.acquire("b")
        assert e.value.permanent
        monkeypatch.undo()
        assert len(answer(reg, "b")) == 8


def test_a_request_for_the_model_being_swapped_out_is_answered(tiny):
    """It waits for the unload, then loads the model again, rather than reach a stopping engine."""
    reg = registry(tiny, models_max=1)
    with started(reg):
        answer(reg, "a")
        gb = gevent.spawn(answer, reg, "b")
        gevent.sleep(0)  # b's load begins: a is being dropped
        ga = gevent.spawn(answer, reg, "a")
        gevent.joinall([gb, ga], raise_error=True, timeout=TIMEOUT_S)
        assert len(gb.value) == len(ga.value) == 8
        assert reg.lookup("a").users == reg.lookup("b").users == 0


def test_a_model_kept_busy_cannot_hold_off_a_swap(tiny):
    reg = registry(tiny, models_max=1)
    with started(reg):
        answer(reg, "a")
        stop = False
        served = {"a": 0}

        def keep_busy():
            while not stop:
                answer(reg, "a", 16)
                served["a"] += 1

        workers = [gevent.spawn(keep_busy), gevent.spawn_later(0.005, keep_busy)]
        gevent.sleep(0.2)
        b = gevent.spawn(answer, reg, "b")
        assert len(b.get(timeout=TIMEOUT_S)) == 8  # the swap happened while "a" was in demand
        stop = True
        gevent.joinall(workers, raise_error=True, timeout=TIMEOUT_S)
        assert served["a"] > 0


def test_a_slow_load_is_not_put_to_sleep_as_it_ends(tiny):
    slow = ModelSpec("a", tiny["a"], (), EngineSettings(n_ctx=256, n_threads=1, load_delay_s=1.0),
                     load_on_startup=True)
    reg = Registry([slow], sleep_idle_s=0.6)
    with started(reg, sleep_poll_s=0.05):
        a = reg.lookup("a")
        wait_for(lambda: a.status is ModelStatus.LOADED, "a to load")
        gevent.sleep(0.3)
        assert a.status is ModelStatus.LOADED  # idle time counts from the end of the load
        wait_for(lambda: a.status is ModelStatus.SLEEPING, "a to sleep")


def test_load_answers_at_once_while_its_swap_waits(tiny):
    reg = registry(tiny, models_max=1)
    with started(reg):
        engine = reg.acquire("a")
        stream = ask(engine, 40)
        assert isinstance(next(stream), TokenEvent)
        with gevent.Timeout(1, AssertionError("load() waited for the swap")):
            reg.load("b")
        assert reg.lookup("b").status is ModelStatus.LOADING
        assert isinstance(list(stream)[-1], FinishEvent)
        reg.release(reg.lookup("a"))
        wait_for(lambda: reg.lookup("b").status is ModelStatus.LOADED, "b to load")
        assert reg.lookup("a").status is ModelStatus.UNLOADED


def test_start_up_checks(tiny, monkeypatch):
    from bubo.engine import registry as reg_mod

    with pytest.raises(ValueError, match="2 models load at start .* at most 1"):
        Registry([ModelSpec("a", tiny["a"], load_on_startup=True), ModelSpec("b", tiny["b"], load_on_startup=True)],
                 models_max=1)
    # a model that cannot fit in memory at start fails; the server still starts
    monkeypatch.setattr(reg_mod, "memory_budget", lambda override=None: (1 << 40, 10))
    reg = Registry([ModelSpec("a", tiny["a"], (), SETTINGS, load_on_startup=True), ModelSpec("b", tiny["b"])])
    with started(reg):
        wait_for(lambda: reg.lookup("a").status is ModelStatus.FAILED, "a to fail")
        assert "weights of a" in reg.lookup("a").failure
