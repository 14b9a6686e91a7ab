"""Shared by the tests that run an in-process Engine: start one and wait until it is ready.
(tests/ is on sys.path: `from engines import start_engine`.)"""

from __future__ import annotations

import os

import gevent

from bubo import cpus
from bubo.engine.engine import Engine

READY_TIMEOUT_S = 120
# the threads of the tests' models, engines and servers: 2, or 1 where this test worker has one CPU
# (tests/conftest.py gives each of pytest-xdist's workers its share of the CPUs)
THREADS = min(2, cpus.usable())


def wait_ready(e: Engine) -> Engine:
    with gevent.Timeout(READY_TIMEOUT_S):
        while not e.ready:
            assert e.load_error is None, e.load_error
            gevent.sleep(0.02)
    return e


def start_engine(path, **kw) -> Engine:
    """An Engine on the model at path (n_threads THREADS unless given), started and ready."""
    kw.setdefault("n_threads", THREADS)
    e = Engine(str(path), **kw)
    e.start()
    return wait_ready(e)



FULL_SWEEPS = os.environ.get("BUBO_TEST_FULL_SWEEPS") == "1"


def sweep(items, suite: int) -> list:
    """The seeds (or runs) a sampled sweep over the catalog models takes: the first `suite` of them
    in the suite, which must stay under 20 minutes on 2-core machines where the 0.5b decodes at 25
    tokens/s; all of them with BUBO_TEST_FULL_SWEEPS=1."""
    items = list(items)
    return items if FULL_SWEEPS else items[:suite]
