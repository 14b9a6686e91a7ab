"""The event loop only moves bytes: work whose cost grows with the request runs here, in a small
pool of worker threads, under a deadline.

    req = offload.run(parse_chat_request, body, what="reading the request's fields")

The calling greenlet waits without blocking the hub (health checks, metrics and other clients'
streams go on meanwhile). The work runs in a copy of the caller's context (Flask's request,
app and g are there). Each request has one budget, --prepare-timeout seconds of work in the pool
over all its offloaded steps (time spent waiting for a free worker does not count): past it the
request is answered with 400 `too_costly` naming the step it was in, and the work is abandoned
(it stops at its next bubo.deadline.check(); a native call it is in finishes first, and its
result is dropped). Outside a gevent hub's thread (a WSGI host without gevent) the work runs
inline, under the same cooperative checks but no deadline the caller could act on.

While the pool works, the cyclic garbage collector stands still (_CollectorPause): a job that
builds a large graph of objects (a schema of 100,000 properties and its converter's rules) makes
the collector walk all of it again and again as it grows, in whichever thread allocates, holding
the GIL for 20-50 ms each time. What the job leaves unreachable is freed by reference counting as
it ends; cycles wait for the collector, which runs again once no job is left, or once it has
stood still for a request's whole budget (jobs of several requests may follow each other without
a gap). Its first pass then walks once what the jobs made that is still alive, on whichever
thread allocates next, the event loop's included: one pass of a few milliseconds to tens (a job
that returns 300,000 containers), where it would have walked them again and again as they grew.
The collector stops every thread whichever thread runs it; only fewer live containers would
shorten that pass.
"""

from __future__ import annotations

import contextvars
import gc
import time
from collections.abc import Callable
from typing import Any, TypeVar

import gevent
import gevent.threadpool
from flask import current_app, g, has_app_context, has_request_context
from gevent.monkey import get_original

from bubo import deadline
from bubo.api.errors import ApiError
from bubo.engine.types import EngineRefusal
from bubo.errors import RequestError

T = TypeVar("T")
_thread_ident = get_original("_thread", "get_ident")
_allocate_lock = get_original("_thread", "allocate_lock")

# Worker threads: preparation is mostly Python (one GIL), so more threads than this would not go
# faster; a few let a request's native step (tokenizing a long prompt) run beside another's.
PREPARE_WORKERS = 4
DEFAULT_PREPARE_TIMEOUT_S = 5.0
# Text up to this many characters (token lists up to this many ids) is tokenized, detokenized or
# read on the event loop: under a millisecond whatever the text (the worst measured, 1,024 random
# characters on gemma3's tokenizer: 0.6 ms; a worker's hand-off costs 0.04 ms of every request)
SMALL_CHARS = 1024


class _CollectorPause:
    """The garbage collector off while jobs run (the module docstring): on with the first job,
    back on when the last one ends, or at a job's start or end once it has been off for most_s;
    then off again only after a moment with no job. A collector that something else turned off
    is left as it is."""

    def __init__(self) -> None:
        self.jobs = 0
        self.since: float | None = None  # when this turned the collector off; None: it did not
        self.clock = time.monotonic
        self._lock = _allocate_lock()  # the pools of several hubs (threads) share the collector

    def enter(self, most_s: float) -> None:
        with self._lock:
            self.jobs += 1
            if self.jobs == 1 and gc.isenabled():
                gc.disable()
                self.since = self.clock()
            else:
                self._past(most_s)

    def leave(self, most_s: float) -> None:
        with self._lock:
            self.jobs -= 1
            if self.jobs == 0 and self.since is not None:
                gc.enable()
                self.since = None
            else:
                self._past(most_s)

    def _past(self, most_s: float) -> None:
        if self.since is not None and self.clock() - self.since >= most_s:
            gc.enable()
            self.since = None


_PAUSE = _CollectorPause()


class PreparePool:
    """The worker threads of one hub (created on first use, in the hub's thread)."""

    def __init__(self, timeout_s: float = DEFAULT_PREPARE_TIMEOUT_S, workers: int = PREPARE_WORKERS):
        self.timeout_s = timeout_s
        self.workers = workers
        self._thread: int | None = None
        self._threads: gevent.threadpool.ThreadPool | None = None
        self.n_abandoned = 0  # jobs past their deadline (their requests were answered 400)

    def _pool(self) -> gevent.threadpool.ThreadPool | None:
        """The worker threads, bound to the thread that first asks (the server's hub); None in
        any other thread (a WSGI host's own threads run the work inline)."""
        me = _thread_ident()  # the OS thread's (in a monkey-patched process, threading's is the greenlet's)
        if self._thread is None:
            self._thread = me
            self._threads = gevent.threadpool.ThreadPool(self.workers, hub=gevent.get_hub())
        return self._threads if self._thread == me else None

    def run(self, fn: Callable[..., T], *args: Any, what: str, spent: list[float] | None = None, **kwargs: Any) -> T:
        """fn(*args, **kwargs) in a worker thread, within what is left of the budget (spent: the
        request's seconds of work so far, updated). ApiError 400 too_costly past it."""
        spent = spent if spent is not None else [0.0]
        left = self.timeout_s - spent[0]
        if left <= 0:
            raise too_costly(what, self.timeout_s)
        budget = deadline.Budget(left, what)
        ctx = contextvars.copy_context()

        def inner() -> T:
            with deadline.running(budget):
                return fn(*args, **kwargs)

        def job() -> tuple[bool, Any]:
            # the outcome as a value: gevent's pool would print the traceback of an exception
            # (a 400 the request answers with is no error of the server's)
            try:
                return True, ctx.run(inner)
            except BaseException as e:  # noqa: BLE001 - raised again in the caller
                if isinstance(e, _ANSWERS):
                    _shed(e)
                return False, e

        if deadline.current() is not None:
            return fn(*args, **kwargs)  # a step of a job: it runs where the job does, in its budget
        pool = self._pool()
        if pool is None:  # no hub in this thread: inline, its checks stopping it past the deadline
            try:
                return inner()
            except deadline.Abandoned:
                raise too_costly(budget.what, self.timeout_s) from None
        _PAUSE.enter(self.timeout_s)
        try:
            result = pool.spawn(job)
            while True:
                started = budget.started
                wait = left if started is None else started + left - time.monotonic()
                if wait <= 0:
                    break
                result.wait(timeout=wait)  # (a gevent.Timeout of the caller's own goes through)
                if not result.ready():
                    continue
                ok, value = result.get()
                if ok:
                    out: T = value
                    return out
                if isinstance(value, deadline.Abandoned):
                    break
                try:
                    raise value
                finally:
                    value = None  # no cycle through this frame (see _shed)
        finally:
            _PAUSE.leave(self.timeout_s)
            if budget.started is not None:
                spent[0] += min(time.monotonic() - budget.started, left)
        budget.abandoned = True
        self.n_abandoned += 1
        raise too_costly(budget.what, self.timeout_s)


# a request's own failures: they are its answer, their tracebacks are of no use to anyone
_ANSWERS = (ApiError, RequestError, EngineRefusal, deadline.Abandoned)


def _shed(e: BaseException) -> None:
    """Drop e's traceback and the exceptions it was raised from: their frames hold what the work
    built (a schema's converter with a hundred thousand rules), in a reference cycle with e that
    only a full garbage collection would free, in whichever thread, the event loop's included,
    holding the GIL all along. Freed here, in the worker, as the job ends."""
    seen = 0
    while e is not None and seen < 16:
        e.__traceback__ = None
        nxt = e.__cause__ or e.__context__
        e.__cause__ = e.__context__ = None
        e = nxt  # type: ignore[assignment]
        seen += 1


def too_costly(what: str, timeout_s: float) -> ApiError:
    return ApiError(400, "too_costly", f"{what} took longer than the {timeout_s:g} s a request may take to prepare "
                                       "(--prepare-timeout): send a smaller or simpler request")


def small(value: Any) -> bool:
    """Whether value (a text, token ids, or a list of texts and id lists) holds at most
    SMALL_CHARS characters and ids in all: work bounded by it may run inline (run's small)."""
    if isinstance(value, str):
        return len(value) <= SMALL_CHARS
    if not isinstance(value, list) or len(value) > SMALL_CHARS:
        return False
    total = 0
    for x in value:
        total += len(x) if isinstance(x, (str, list)) else 1
        if total > SMALL_CHARS:
            return False
    return True


def small_n(n: int) -> bool:
    """Whether n characters, ids or values of work are few enough to run inline (run's small)."""
    return n <= SMALL_CHARS


def run(fn: Callable[..., T], *args: Any, what: str, answer: bool = False, small: bool = False, **kwargs: Any) -> T:
    """fn in the app's preparation pool, charged to the current request's budget (see the module
    docstring); inline when there is no app or request. answer: the work writes the answer after
    it was generated, charged to a budget of its own (a long generation's answer is not refused
    for what its preparation spent). small: the caller knows the work is bounded by a small input
    (SMALL_CHARS): it runs inline, as a worker's hand-off (two thread switches and a wait for the
    GIL: about 40 us of CPU) would cost more than the work."""
    if small:
        return fn(*args, **kwargs)
    pool = current_app.config.get("BUBO_PREPARE") if has_app_context() else None
    if not isinstance(pool, PreparePool):
        return fn(*args, **kwargs)
    account = "bubo_answer_spent" if answer else "bubo_prepare_spent"
    spent: list[float] = g.setdefault(account, [0.0]) if has_request_context() else [0.0]
    return pool.run(fn, *args, what=what, spent=spent, **kwargs)


def blocking(fn: Callable[..., T], *args: Any) -> T:
    """fn(*args) in gevent's thread pool when called from a greenlet of a monkey-patched process
    (the server: the event loop must not wait for a disk); inline otherwise. Not charged to any
    budget: for file I/O (stored responses, slot files), not for work a request's size makes costly."""
    from gevent import monkey

    hub = gevent.get_hub()
    if gevent.getcurrent() is hub or not monkey.is_module_patched("socket"):
        return fn(*args)
    result: T = hub.threadpool.apply(fn, args)
    return result
