"""The thread-to-greenlet plumbing: how what an engine thread computes reaches the greenlets
that read it, without ever blocking the gevent hub. The engine thread pushes; a reader's greenlet
waits on an Event that the thread sets through a libev/libuv async watcher of the reader's own hub
(thread-safe to send). The thread and its locks are the unpatched ones (gevent.monkey.get_original),
so the engine stays a real thread in a monkey-patched process.

EventStream is a generation request's events (TokenEvent ... FinishEvent or ErrorEvent), with
backpressure: a reader that falls behind pauses its request. EmbedJob is one embeddings request
through an encoder's thread."""

from __future__ import annotations

import collections
import time
from collections.abc import Callable

import gevent
import gevent.event
import numpy as np
from gevent.monkey import get_original

from bubo.engine.types import Event, GenerationRequest, TokenEvent

start_new_thread, allocate_lock, get_ident = get_original("_thread", ["start_new_thread", "allocate_lock",
                                                                       "get_ident"])


# a stream whose reader leaves this many events unread pauses its request (the scheduler gives it
# no token) until it has read half of them: what one unread answer can hold in memory (with 100 top
# probabilities per token, an event is a few kilobytes)
MAX_UNREAD_EVENTS = 64


class EventStream:
    """The events of one request. Iterate it in the greenlet (or thread) that submitted it.

    cancel() (or killing the greenlet that waits on it) ends it: the engine stops the request
    at its next step and frees the slot; iteration then stops without a final event. Read a
    stream to its final event or cancel it: until then it holds a watcher in the reader's hub
    (and counts as open: a model with open streams is not unloaded)."""

    def __init__(self, request: GenerationRequest):
        self._request = request
        self._lock = allocate_lock()
        self._events: collections.deque[Event] = collections.deque()
        self._cancelled = False
        self._ending = False
        self._done = False  # a final event was taken by the reader
        self._closed = False  # the watcher is gone: the engine must not send any more
        self._on_close: Callable[[], None] | None = None
        self._on_drain: Callable[[], None] | None = None
        self._backlogged = False  # MAX_UNREAD_EVENTS unread, and not yet half of them read since
        self._hub = gevent.get_hub()
        self._wake = gevent.event.Event()
        self._watcher = self._hub.loop.async_()
        self._watcher.start(self._wake.set)

    @property
    def request(self) -> GenerationRequest:
        return self._request

    def on_close(self, callback: Callable[[], None]) -> None:
        """Call callback (in the reader's thread) once the stream is read to its end or cancelled."""
        self._on_close = callback

    def on_drain(self, callback: Callable[[], None]) -> None:
        """Call callback (in the reader's thread) when a backlogged stream's reader has caught up."""
        self._on_drain = callback

    @property
    def backlogged(self) -> bool:
        """The reader has left MAX_UNREAD_EVENTS events unread, and has not read half of them
        since: its request pauses (and resumes only once it has, not at every event read)."""
        return self._backlogged

    # --- the engine's side (engine thread) ---------------------------------------------

    def push(self, event: Event) -> None:
        with self._lock:
            if self._closed:
                return
            self._events.append(event)
            if len(self._events) >= MAX_UNREAD_EVENTS:
                self._backlogged = True
            self._watcher.send()

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    @property
    def ending(self) -> bool:
        return self._ending

    # --- the reader's side -------------------------------------------------------------

    def __iter__(self) -> EventStream:
        return self

    def __next__(self) -> Event:
        try:
            while True:
                if self._done or self._cancelled:
                    raise StopIteration
                self._wake.clear()
                with self._lock:
                    event = self._events.popleft() if self._events else None
                    resumed = self._backlogged and len(self._events) <= MAX_UNREAD_EVENTS // 2
                    if resumed:
                        self._backlogged = False
                if resumed and self._on_drain is not None:
                    self._on_drain()  # the engine may be waiting with this request paused
                if event is not None:
                    if not isinstance(event, TokenEvent):
                        self._done = True
                        self._close()
                    return event
                self._wake.wait()
        except StopIteration:
            raise
        except BaseException:
            # the reader was killed (GreenletExit: its client went away) or interrupted
            self.cancel()
            raise

    def end(self) -> None:
        """End the answer here: the engine finishes it at its next step (reason "stop", as an
        end-of-generation token would) and sends its final event. Tokens sampled meanwhile
        still come; the reader that asked for the end ignores them."""
        self._ending = True

    def cancel(self) -> None:
        """Stop the request: the engine frees the slot at its next step. Idempotent."""
        if self._done:
            return
        self._cancelled = True
        self._close()
        if get_ident() == self._hub.thread_ident:
            self._wake.set()  # a reader waiting in another greenlet stops now

    def _close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        on_close, self._on_close = self._on_close, None
        if on_close is not None:
            on_close()
        # the watcher belongs to the reader's hub: close it from the reader's thread only
        if get_ident() == self._hub.thread_ident:
            self._watcher.stop()
            self._watcher.close()


class Call:
    """Work handed to an engine's thread, whose result a greenlet waits for without blocking the
    hub: the thread calls finish() (a value, or the error), which wakes the greenlet waiting in
    result(). A reader that stops waiting (its client went away) leaves it cancelled: the
    thread may skip it. fn: a function of the scheduler to run between two steps (a slot saved
    to or restored from a file); None for work the thread knows how to do (EmbedJob)."""

    def __init__(self, fn: Callable[..., object] | None = None):
        self.fn = fn
        self._value: object = None
        self._error: BaseException | None = None
        self._done = False
        self._closed = False
        self.cancelled = False
        self._lock = allocate_lock()
        self._wake = gevent.event.Event()
        self._watcher = gevent.get_hub().loop.async_()
        self._watcher.start(self._wake.set)

    @property
    def done(self) -> bool:
        return self._done

    def finish(self, value: object = None, error: BaseException | None = None) -> None:
        """The engine's side: the result, or why there is none (the first one counts)."""
        with self._lock:
            if self._done:
                return
            self._value, self._error, self._done = value, error, True
            if not self._closed:
                self._watcher.send()

    def result(self) -> object:
        """The reader's side: wait (without blocking the hub) for the value, or raise the error."""
        try:
            while True:
                self._wake.clear()
                with self._lock:
                    if self._done:
                        break
                self._wake.wait()
        finally:
            with self._lock:
                self.cancelled = not self._done
                if not self._closed:
                    self._closed = True
                    self._watcher.close()
        if self._error is not None:
            raise self._error
        return self._value


class EmbedJob(Call):
    """One embeddings request on its way through an encoder's engine thread: the thread runs it
    and wakes the greenlet waiting in result(). A reader that stops waiting (its client went
    away) cancels it: the thread skips it, or drops it between passes."""

    def __init__(self, seqs: list[list[int]], pooling: str | None, normalize: bool):
        super().__init__()
        self.seqs, self.pooling, self.normalize = seqs, pooling, normalize
        self.n_tokens = sum(len(s) for s in seqs)
        self.queued_at = time.monotonic()  # when it joined the engine's queue
        self.answered_at = 0.0  # when the engine thread answered it (0: not yet)

    def finish(self, value: object = None, error: BaseException | None = None) -> None:
        if not self.answered_at:
            self.answered_at = time.monotonic()  # before its reader can send its next request
        super().finish(value, error)

    def result(self) -> np.ndarray:
        vectors = super().result()
        assert isinstance(vectors, np.ndarray)
        return vectors
