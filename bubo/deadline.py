"""Cooperative deadlines for work a request causes (schema conversion, template rendering, long
lists): the server runs such work in a worker thread under a Budget (bubo.api.offload); once the
request has been answered with its timeout error, the work stops at its next check() instead of
running on for nobody.

    with deadline.running(budget):       # the worker thread, around the whole job
        ...
        deadline.doing("rendering the chat template")   # what a timeout names
        for item in long_list:
            deadline.check()              # raises Abandoned once the budget is spent

Outside a budget (the library, a test) doing() and check() cost a context lookup and do nothing
else. check() also lets other threads run now and then: a worker that holds the GIL in a tight
loop gives it up at least every YIELD_S, so the engine thread and the event loop keep their pace.
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
import time
from collections.abc import Iterator
from typing import Any


def _original_sleep() -> Any:
    """The OS's sleep, which lets go of the GIL, even in a process gevent has monkey-patched
    (where time.sleep would switch greenlets in a worker thread's own hub). Without gevent.monkey
    loaded nothing is patched, and the library never loads it."""
    monkey = sys.modules.get("gevent.monkey")
    return monkey.get_original("time", "sleep") if monkey is not None else time.sleep


_sleep = _original_sleep()

YIELD_S = 0.002  # the longest a checking loop keeps the GIL before it lets others run
# how long it lets them: sleep(0) gives the GIL back, but the sleeper often takes it again before
# a waiting thread wakes up
YIELD_PAUSE_S = 0.0001


class Abandoned(BaseException):
    """The request this work was for has been answered (its budget ran out): stop. A
    BaseException, so that no `except Exception` on the way turns it into an answer."""


class Budget:
    """One job's deadline. abandoned is set by the thread that waits for the job when it gives
    up; what says what the job was doing last (for the timeout's message)."""

    __slots__ = ("seconds", "deadline", "abandoned", "what", "started", "_yielded")

    def __init__(self, seconds: float, what: str = "preparing the request"):
        self.seconds = seconds
        self.deadline = float("inf")  # the clock starts when a worker takes the job (running())
        self.abandoned = False
        self.what = what
        self.started: float | None = None  # when a worker took the job
        self._yielded = 0.0

    def expired(self) -> bool:
        return self.abandoned or time.monotonic() > self.deadline


_current: contextvars.ContextVar[Budget | None] = contextvars.ContextVar("bubo_budget", default=None)


@contextlib.contextmanager
def running(budget: Budget) -> Iterator[Budget]:
    """Run the body under budget (in the thread that does the work)."""
    token = _current.set(budget)
    budget.started = budget._yielded = time.monotonic()
    budget.deadline = budget.started + budget.seconds
    try:
        yield budget
    finally:
        _current.reset(token)


def current() -> Budget | None:
    return _current.get()


def doing(what: str) -> None:
    """Name the step the current job is in (a timeout's message says it)."""
    b = _current.get()
    if b is not None:
        b.what = what
        check()


def check() -> None:
    """Raise Abandoned when the current job's budget is spent; now and then let other threads
    run. Free outside a budget."""
    b = _current.get()
    if b is None:
        return
    now = time.monotonic()
    if b.abandoned or now > b.deadline:
        b.abandoned = True
        raise Abandoned(b.what)
    if now - b._yielded > YIELD_S:
        b._yielded = now
        _sleep(YIELD_PAUSE_S)  # releases the GIL long enough for a waiting thread to take it


def let_go(items: list[Any]) -> None:
    """Empty a long list a slice at a time from its end, letting other threads run between
    slices: freeing millions of objects in one go holds the GIL as long as making them did."""
    while items:
        del items[-65536:]
        if items:
            _sleep(YIELD_PAUSE_S)
