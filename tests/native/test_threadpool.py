"""The persistent thread pool: every thread index runs once per run, barriers inside a run hold,
idle workers that went to sleep wake up, and concurrent callers are serialized."""
import threading
import time

import pytest

from bubo import _ops


@pytest.mark.parametrize("n_threads", [1, 2, 3, 4])
def test_many_runs_every_thread_once_barriers_hold(n_threads):
    pool = _ops.ThreadPool(n_threads)
    assert pool.n_threads == n_threads
    n_runs = 3000
    calls, errors = _ops.pool_probe(pool, n_runs)
    assert calls.tolist() == [n_runs] * n_threads
    assert errors.tolist() == [0] * n_threads


def test_parked_workers_wake_up():
    """Pauses longer than the spin phase send the workers to sleep on the condition variable."""
    pool = _ops.ThreadPool(3)
    for _ in range(20):
        time.sleep(0.005)
        calls, errors = _ops.pool_probe(pool, 1)
        assert calls.tolist() == [1, 1, 1] and errors.tolist() == [0, 0, 0]


def test_concurrent_callers_are_serialized():
    pool = _ops.ThreadPool(2)
    results = []

    def hammer():
        results.append(_ops.pool_probe(pool, 500))

    threads = [threading.Thread(target=hammer) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 3
    for calls, errors in results:
        assert calls.tolist() == [500, 500] and errors.tolist() == [0, 0]


def test_create_and_free_repeatedly():
    for n in range(1, 9):
        pool = _ops.ThreadPool(n)
        assert _ops.pool_probe(pool, 3)[0].tolist() == [3] * n
        del pool


@pytest.mark.parametrize("n_threads", [0, -1, 513])
def test_rejects_bad_thread_counts(n_threads):
    with pytest.raises(ValueError):
        _ops.ThreadPool(n_threads)


def test_runs_on_fewer_threads_than_the_pool_has():
    """set_active (llama.cpp's -t against -tb): a run uses the first n threads; the others stay
    idle. Switching the count between runs, many times over, loses no run and runs none twice."""
    pool = _ops.ThreadPool(4)
    assert (pool.capacity, pool.n_threads) == (4, 4)
    for n in [1, 3, 2, 4, 2, 1, 4, 3] * 50:
        pool.set_active(n)
        assert pool.n_threads == n
        calls, errors = _ops.pool_probe(pool, 7)
        assert errors.tolist() == [0, 0, 0, 0]
        assert calls.tolist() == [7 if i < n else 0 for i in range(4)], n
    pool.set_active(0)
    assert pool.n_threads == 1  # clamped
    pool.set_active(99)
    assert pool.n_threads == 4
