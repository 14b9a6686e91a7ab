"""Shared by the tests that run an in-process Engine: start one and wait until it is ready.
(tests/ is on sys.path: `from engines import start_engine`.)"""

from __future__ import annotations

import gevent

from bubo.engine import Engine

READY_TIMEOUT_S = 120


def wait_ready(e: Engine) -> Engine:
    with gevent.Timeout(READY_TIMEOUT_S):
        while not e.ready:
            assert e.load_error is None, e.load_error
            gevent.sleep(0.02)
    return e


def start_engine(path, **kw) -> Engine:
    """An Engine on the model at path (n_threads 2 unless given), started and ready."""
    kw.setdefault("n_threads", 2)
    e = Engine(str(path), **kw)
    e.start()
    return wait_ready(e)
