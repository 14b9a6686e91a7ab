"""The preparation pool (bubo.api.offload): work runs in a worker thread while the hub keeps
serving, within one budget per request; past it the request gets 400 too_costly naming the step
it was in, and the work stops at its next deadline check."""

from __future__ import annotations

import gc
import threading
import time

import gevent
import pytest
from flask import Flask, current_app, g

from bubo import deadline
from bubo.api import offload
from bubo.api.errors import ApiError
from bubo.api.offload import PreparePool


def spin(seconds: float, what: str, log: list[str]) -> str:
    """Python work that checks its deadline, as the converters do."""
    deadline.doing(what)
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end:
            deadline.check()
        return "done"
    finally:
        log.append(f"stopped after {seconds}")


def test_the_hub_goes_on_while_a_job_runs_and_the_job_runs_elsewhere():
    pool = PreparePool(timeout_s=5)
    ticks = []

    def ticker():
        while True:
            ticks.append(time.monotonic())
            gevent.sleep(0.01)

    t = gevent.spawn(ticker)
    hub_thread = threading.get_ident()
    ran_in: list[int] = []
    assert pool.run(lambda: ran_in.append(threading.get_ident()) or spin(0.4, "spinning", []), what="x") == "done"
    t.kill()
    assert ran_in and ran_in[0] != hub_thread
    gaps = [b - a for a, b in zip(ticks, ticks[1:])]
    assert len(ticks) > 10 and max(gaps) < 0.2, max(gaps)


def test_past_its_budget_a_request_gets_too_costly_and_the_work_stops():
    pool = PreparePool(timeout_s=0.3)
    log: list[str] = []
    t0 = time.monotonic()
    with pytest.raises(ApiError) as e:
        pool.run(spin, 5.0, "converting the schema", log, what="reading the fields")
    assert time.monotonic() - t0 < 1.5
    assert (e.value.status, e.value.code) == (400, "too_costly")
    assert "converting the schema took longer than the 0.3 s" in e.value.message
    assert "--prepare-timeout" in e.value.message
    gevent.sleep(0.3)
    assert log == ["stopped after 5.0"]  # abandoned at its next check, not run to its end
    assert pool.n_abandoned == 1


def test_one_budget_for_all_of_a_requests_steps():
    pool = PreparePool(timeout_s=0.5)
    spent = [0.0]
    assert pool.run(spin, 0.3, "step one", [], what="one", spent=spent) == "done"
    with pytest.raises(ApiError) as e:
        pool.run(spin, 0.3, "step two", [], what="two", spent=spent)
    assert e.value.code == "too_costly" and "step two" in e.value.message


def test_waiting_for_a_worker_does_not_count():
    pool = PreparePool(timeout_s=0.4, workers=1)
    first = gevent.spawn(pool.run, spin, 0.3, "first", [], what="first")
    gevent.sleep(0.05)
    assert pool.run(spin, 0.3, "second", [], what="second") == "done"  # waited ~0.25 s for the worker
    assert first.get() == "done"


def test_errors_are_the_requests_own_and_the_flask_context_is_there():
    app = Flask("t")
    app.config["BUBO_PREPARE"] = PreparePool(timeout_s=2)
    app.config["MARK"] = "here"

    def fails():
        raise ApiError(400, "invalid_value", f"bad field ({current_app.config['MARK']})")

    with app.test_request_context("/x"):
        with pytest.raises(ApiError) as e:
            offload.run(fails, what="reading the fields")
        assert e.value.message == "bad field (here)"
        assert offload.run(lambda: current_app.config["MARK"], what="x") == "here"
        assert g.bubo_prepare_spent[0] >= 0.0
    # no app: inline
    assert offload.run(lambda: 7, what="x") == 7


def test_small_work_runs_inline_and_large_work_in_a_worker():
    """A step its caller knows is small (offload.small: at most SMALL_CHARS characters and ids)
    runs in the calling thread, as a hand-off would cost more than the work; anything larger, or
    of another shape, goes to a worker."""
    app = Flask("t")
    app.config["BUBO_PREPARE"] = PreparePool(timeout_s=2)
    here = threading.get_ident()
    n = offload.SMALL_CHARS
    assert offload.small("x" * n) and not offload.small("x" * (n + 1))
    assert offload.small([1] * n) and not offload.small([1] * (n + 1))
    assert offload.small(["ab"] * (n // 2)) and not offload.small(["ab"] * (n // 2) + ["c"])
    assert offload.small([[1, 2]] * (n // 2)) and not offload.small([[1, 2]] * (n // 2 + 1))
    assert not offload.small({"a": 1}) and not offload.small(None)
    assert offload.small_n(n) and not offload.small_n(n + 1)

    def where() -> int:
        return threading.get_ident()

    def run() -> None:
        with app.test_request_context("/x"):
            assert offload.run(where, what="x", small=True) == here
            assert offload.run(where, what="x") != here

    gevent.spawn(run).get(timeout=10)


def test_the_collector_stands_still_while_jobs_run():
    pool = PreparePool(timeout_s=5)
    assert gc.isenabled()
    assert pool.run(gc.isenabled, what="x") is False
    assert gc.isenabled()  # back on as the last job ends
    # two jobs of two requests overlap: on only once both ended
    first = gevent.spawn(pool.run, lambda: spin(0.3, "first", []) and gc.isenabled(), what="first")
    gevent.sleep(0.1)
    assert pool.run(gc.isenabled, what="second") is False
    assert not gc.isenabled()
    assert first.get() is False
    assert gc.isenabled()
    # a job that fails, or runs past its budget, ends the pause all the same
    def refuse() -> None:
        raise ApiError(400, "invalid_value", "no")

    with pytest.raises(ApiError):
        pool.run(refuse, what="x")
    with pytest.raises(ApiError):
        PreparePool(timeout_s=0.1).run(spin, 1.0, "spinning", [], what="x")
    assert gc.isenabled()
    # a caller killed or timed out while it waits: the same
    waiting = gevent.spawn(pool.run, spin, 0.5, "killed", [], what="x")
    gevent.sleep(0.1)
    assert not gc.isenabled()
    waiting.kill()
    assert gc.isenabled()
    with pytest.raises(gevent.Timeout), gevent.Timeout(0.1):
        pool.run(spin, 0.5, "timed out", [], what="x")
    assert gc.isenabled() and offload._PAUSE.jobs == 0
    # a collector turned off by someone else stays off
    gc.disable()
    try:
        assert pool.run(gc.isenabled, what="x") is False
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_the_collector_runs_again_after_a_whole_budget_of_jobs_without_a_gap():
    pause = offload._CollectorPause()
    now = [100.0]
    pause.clock = lambda: now[0]
    try:
        pause.enter(5.0)
        assert not gc.isenabled()
        now[0] += 3.0
        pause.enter(5.0)  # a second request's job
        pause.leave(5.0)
        assert not gc.isenabled()
        now[0] += 2.0  # off for 5 s, jobs still running: on at the next start or end
        pause.enter(5.0)
        assert gc.isenabled()
        pause.leave(5.0)
        pause.enter(5.0)
        assert gc.isenabled()  # not off again while jobs run
        pause.leave(5.0)
        pause.leave(5.0)
        assert gc.isenabled() and pause.jobs == 0
        pause.enter(5.0)  # after a moment with no job: off again
        assert not gc.isenabled()
        pause.leave(5.0)
        assert gc.isenabled()
    finally:
        gc.enable()
