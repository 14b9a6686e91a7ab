"""Streamed responses: server-sent events (`return sse_response(chunks(), stream=engine_stream)`)
and newline-delimited JSON (`ndjson_response`, Ollama's streams: one object a line, no pings).

Each item of the generator becomes one event:
    dict              -> "data: {json}\\n\\n"
    str               -> "data: {str}\\n\\n"        (e.g. "[DONE]": the caller sends it)
    (name, dict|str)  -> "event: name\\ndata: ...\\n\\n" (Anthropic's named events)

The generator runs in its own greenlet and the response waits on it, so a silent stretch (a
long prompt) sends a ": ping" comment every SSE_PING_SECONDS. When the client goes away (a
write fails, or the socket reads EOF) the generator's greenlet is killed (GreenletExit inside
it: its `finally` runs, and an EventStream it was reading cancels itself) and `stream`, if
given, is cancelled: the engine frees the slot at its next step.

What a client does not read stays bounded: the generator runs at most BUFFER_BYTES ahead of the
socket (whose kernel buffer is fixed at that size too), then waits; the engine stream it no
longer reads pauses its request after bubo.engine.engine.MAX_UNREAD_EVENTS events; and the HTTP
server's write deadline (--write-timeout) closes a connection whose client reads nothing, which
ends the stream and frees its slot."""

from __future__ import annotations

import contextlib
import logging
import socket
from collections.abc import Callable, Iterator
from typing import Any

import gevent
import gevent.event
import gevent.queue
from flask import Response, has_request_context, request

from bubo.api.errors import ApiError, StreamShape, dumps, stream_error
from bubo.engine.protocol import Stream

log = logging.getLogger("bubo.api")

_END = object()
BUFFER_BYTES = 256 * 1024  # formatted events the generator may be ahead of the client


def format_event(item: Any) -> str:
    name = None
    if isinstance(item, tuple):
        name, item = item
    data = item if isinstance(item, str) else dumps(item)
    head = f"event: {name}\n" if name else ""
    return f"{head}data: {data}\n\n"


def sse_response(gen: Iterator[Any], stream: Stream | None = None, ping_seconds: float | None = None,
                 shape: StreamShape = StreamShape.OPENAI) -> Response:
    """gen's items as server-sent events; a generator that fails ends the stream with an error
    event in its dialect's shape."""
    from bubo.api.request import config

    ping = ping_seconds if ping_seconds is not None else config().sse_ping_seconds
    sock = request.environ.get("bubo.socket")
    resp = Response(_events(gen, stream, ping, sock, format_event, shape), mimetype="text/event-stream")
    resp.headers["Cache-Control"] = "no-cache"
    resp.headers["X-Accel-Buffering"] = "no"  # nginx: do not buffer the stream
    return resp


def format_line(item: Any) -> str:
    """One NDJSON line: the object's JSON (never a raw newline inside it) and "\n"."""
    return dumps(item) + "\n"


def ndjson_response(gen: Iterator[Any], stream: Stream | None = None) -> Response:
    """Newline-delimited JSON (Ollama's streams, application/x-ndjson): each item of gen, a
    dict, becomes one line. Clients parse every line as JSON, so a silent stretch sends nothing
    (no keep-alive comment); the client going away cancels `stream` as with SSE, and a generator
    that fails ends the stream with an {"error": ...} line, Ollama's in-band error."""
    sock = request.environ.get("bubo.socket")
    resp = Response(_events(gen, stream, None, sock, format_line, StreamShape.OLLAMA), mimetype="application/x-ndjson")
    resp.headers["Cache-Control"] = "no-cache"
    resp.headers["X-Accel-Buffering"] = "no"
    return resp


def _events(gen: Iterator[Any], stream: Stream | None, ping: float | None, sock: socket.socket | None,
            fmt: Callable[[Any], str], shape: StreamShape) -> Iterator[bytes]:
    q = _Buffered(BUFFER_BYTES)
    if sock is not None:
        # the kernel's buffer for this stream, fixed (autotuning lets it grow to megabytes a
        # client that reads nothing would leave full)
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, BUFFER_BYTES)

    def produce() -> None:
        try:
            for item in gen:
                q.put(fmt(item).encode("utf-8"))
        except gevent.GreenletExit:
            raise
        except Exception as e:  # noqa: BLE001 - the stream is already 200: report in-band
            log.exception("a streamed response's generator failed")
            failed = ApiError(500, "internal_error", f"internal error: {type(e).__name__}: {e}")
            q.put(fmt(stream_error(shape, failed)).encode())
        finally:
            q.put(_END, force=True)

    producer = gevent.spawn(produce)

    def gone() -> None:
        # the engine frees the slot at its next step: cancel it here, not after the producer's
        # exit has reached this response's `finally` (a few greenlet switches later)
        if stream is not None:
            stream.cancel()
        producer.kill(block=False)

    watcher = None
    try:
        watcher = _DisconnectWatch(sock, gone) if sock is not None else None
        while True:
            try:
                item = q.get(timeout=ping)
            except gevent.queue.Empty:  # only with a ping period
                yield b": ping\n\n"
                continue
            if item is _END:
                return
            yield item
    finally:
        # normal end, or GeneratorExit: the server closes the app iterator when a write fails
        if watcher is not None:
            watcher.close()
        if not producer.dead:
            producer.kill(block=False)
        if stream is not None:
            stream.cancel()


class _Buffered:
    """A queue of encoded events holding at most `most` bytes: put() waits while it is full
    (one item always fits in an empty queue); get() as gevent's Queue."""

    def __init__(self, most: int):
        self.most = most
        self.n_bytes = 0
        self._q: gevent.queue.Queue = gevent.queue.Queue()
        self._room = gevent.event.Event()
        self._room.set()

    def put(self, item: Any, force: bool = False) -> None:
        size = len(item) if isinstance(item, bytes) else 0
        while not force and self.n_bytes and self.n_bytes + size > self.most:
            self._room.clear()
            self._room.wait()
        self.n_bytes += size
        self._q.put(item)

    def get(self, timeout: float | None = None) -> Any:
        item = self._q.get(timeout=timeout)
        if isinstance(item, bytes):
            self.n_bytes -= len(item)
            self._room.set()
        return item


class _DisconnectWatch:
    """Calls on_disconnect (in a greenlet of its own) when the client closes its end (EOF on a
    read), without waiting for the next write to fail, or when the socket is closed here. Any
    bytes the client sends are left unread (peeked): a pipelined request is looked at again
    every RECHECK_SECONDS. A watcher of the hub's loop, not a greenlet that waits: most answers
    end before their client goes, and a greenlet spawned and killed per answer cost more than the
    answer's own socket work. close() it when the answer ends: a call not yet run is dropped."""

    RECHECK_SECONDS = 0.05

    def __init__(self, sock: socket.socket, on_disconnect: Callable[[], None]):
        self._sock = sock
        self._raw = getattr(sock, "_sock", sock)  # gevent's socket would wait in the hub: the OS's
        self._on_disconnect: Callable[[], None] | None = on_disconnect
        self._call: gevent.Greenlet[Any, Any] | None = None
        loop = gevent.get_hub().loop
        self._timer = loop.timer(self.RECHECK_SECONDS)
        fd = sock.fileno()
        self._io = loop.io(fd, 1) if fd >= 0 else None  # 1: readable
        if self._io is None:  # closed already
            self._gone()
        else:
            self._io.start(self._readable)

    def _readable(self) -> None:
        if self._sock.fileno() < 0:  # closed here (its number may be another connection's by now)
            eof = True
        else:
            try:
                eof = not self._raw.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
            except BlockingIOError:  # woken for nothing
                return
            except OSError:
                eof = True
        assert self._io is not None  # it called
        self._io.stop()
        if eof:
            self._gone()
        else:  # data, not EOF (a pipelined request): look again later
            self._timer.start(self._io.start, self._readable)

    def _gone(self) -> None:
        on_disconnect, self._on_disconnect = self._on_disconnect, None
        if on_disconnect is not None:
            self._call = gevent.spawn(on_disconnect)

    def close(self) -> None:
        """Idempotent."""
        self._on_disconnect = None
        if self._call is not None and not self._call.dead:
            self._call.kill(block=False)  # the answer ended before it ran
        if self._io is not None:
            self._io.stop()
            self._io.close()
        self._timer.stop()
        self._timer.close()


@contextlib.contextmanager
def cancel_on_disconnect(stream: Stream, sock: Any = None) -> Iterator[Stream]:
    """For a non-streamed answer: while the handler collects `stream`, a client that goes away
    cancels it (the slot is freed at the engine's next step; iterating the stream then stops
    without a final event). sock: the client's socket, for an answer outside a Flask request (a
    light answer's); else the request's.

        with cancel_on_disconnect(engine_stream) as events:
            for ev in events: ...
    """
    if sock is None and has_request_context():
        sock = request.environ.get("bubo.socket")
    watcher = _DisconnectWatch(sock, stream.cancel) if sock is not None else None
    try:
        yield stream
    finally:
        if watcher is not None:
            watcher.close()
