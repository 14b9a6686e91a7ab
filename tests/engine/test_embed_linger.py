"""An encoder's thread lingers for clients in step (bubo.engine.engine.linger_for, Engine._linger):
how many jobs it waits for, and that it is woken once they are queued, or at stop, never lost."""

from __future__ import annotations

from bubo.engine.engine import Engine, linger_for
from bubo.engine.streams import EmbedJob, allocate_lock, start_new_thread


def test_linger_for_waits_only_where_clients_run_concurrently():
    # the last batch (4 jobs) ended at 10.0; a pass takes 0.008 s
    assert linger_for([10.001], 10.0, 4, 10.002, 0.008) == 4  # its clients come back: wait for all four
    assert linger_for([9.99, 9.995], 10.0, 2, 10.001, 0.008) == 4  # two waited through it, two come back
    assert linger_for([10.001], 10.0, 1, 10.002, 0.008) == 0  # a lone client's next request: no wait
    assert linger_for([9.99], 10.0, 1, 10.001, 0.008) == 2  # one waited while the other's ran: two clients
    assert linger_for([10.02], 10.0, 4, 10.02, 0.008) == 0  # idle for longer than a pass: no wait
    assert linger_for([10.001], 0.0, 0, 10.002, 0.0) == 0  # the first batch


def _lingering(e: Engine, jobs: list[EmbedJob], want: int):
    """e._linger(jobs, ..., want) on a thread of its own; the lock it releases when it returns."""
    done = allocate_lock()
    done.acquire()

    def run() -> None:
        try:
            e._linger(jobs, 2, want, 60.0)
        finally:
            done.release()

    start_new_thread(run, ())
    return done


def test_the_thread_is_woken_when_the_jobs_it_waits_for_are_queued_and_at_stop():
    e = Engine("never-loaded.gguf")  # not started: its queue and locks only
    jobs = [EmbedJob([[1, 2]], None, True)]
    done = _lingering(e, jobs, 3)
    assert not done.acquire(timeout=0.3)  # nothing queued yet: it waits
    e._queue(EmbedJob([[3]], None, True))
    assert not done.acquire(timeout=0.3)  # one of the two it waits for: no wake-up
    e._queue(EmbedJob([[4]], None, True))
    assert done.acquire(timeout=30)  # both: it took them and returned, long before its 60 s
    assert len(jobs) == 3 and not e._jobs and e._wake_jobs == 1

    jobs = [EmbedJob([[1, 2]], None, True)]
    done = _lingering(e, jobs, 5)
    assert not done.acquire(timeout=0.3)
    e._stopping = True
    e._signal()  # as stop() does
    assert done.acquire(timeout=30) and len(jobs) == 1 and e._wake_jobs == 1
