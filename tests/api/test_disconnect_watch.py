"""The watch on a client's socket while its answer is made (bubo.api.sse._DisconnectWatch): the
client's EOF calls the answer off once; bytes it sends (a pipelined request) are not EOF and are
left unread; a socket closed here counts as gone; an answer that ends first drops the call."""

from __future__ import annotations

import socket

import gevent
import pytest

from bubo.api.errors import StreamShape
from bubo.api.sse import _DisconnectWatch, _events, format_event

pytestmark = pytest.mark.quick


def pair() -> tuple[socket.socket, socket.socket]:
    a, b = socket.socketpair()
    a.setblocking(False)
    return a, b


def watch(sock: socket.socket) -> tuple[_DisconnectWatch, list[int]]:
    hits: list[int] = []
    return _DisconnectWatch(sock, lambda: hits.append(1)), hits


def called(hits: list[int]) -> None:
    with gevent.Timeout(5):
        while not hits:
            gevent.sleep(0.005)


def test_the_clients_eof_calls_once():
    a, b = pair()
    w, hits = watch(a)
    gevent.sleep(0.02)
    assert hits == []
    b.close()
    called(hits)
    gevent.sleep(0.1)
    assert hits == [1]
    w.close()
    w.close()  # idempotent
    a.close()


def test_bytes_are_not_eof_are_left_unread_and_are_looked_at_again():
    a, b = pair()
    w, hits = watch(a)
    b.sendall(b"GET /health HTTP/1.1\r\n\r\n")
    gevent.sleep(0.02)
    assert hits == []
    assert w._io is not None and not w._io.active and w._timer.active  # not woken again at once, for ever
    assert a.recv(100) == b"GET /health HTTP/1.1\r\n\r\n"  # peeked only
    b.close()
    called(hits)  # seen once the timer has started the watch again
    assert hits == [1]
    w.close()
    a.close()


def test_an_answer_that_ends_first_drops_a_call_not_yet_run():
    a, b = pair()
    w, hits = watch(a)
    b.close()
    w._readable()  # as the loop calls it on the EOF: the call is spawned
    w.close()  # and the answer ends before it runs
    gevent.sleep(0.05)
    assert hits == []
    a.close()


def test_a_socket_closed_here_counts_as_gone():
    a, b = pair()
    w, hits = watch(a)
    a.close()  # its number may be another connection's when the loop next looks
    w._readable()
    gevent.sleep(0.02)
    assert hits == [1]
    w.close()
    b.close()
    c, d = pair()  # closed before the watch starts
    c.close()
    w, hits = watch(c)
    gevent.sleep(0.02)
    assert hits == [1]
    w.close()
    d.close()


def test_a_stream_to_a_closed_socket_ends_and_stops_its_producer():
    a, b = pair()
    a.close()
    made = []

    def endless():
        while True:
            made.append(1)
            yield {"n": len(made)}

    events = _events(endless(), None, None, a, format_event, StreamShape.OPENAI)
    with gevent.Timeout(10):
        n = sum(1 for _ in events)
    gevent.sleep(0.05)
    assert n <= len(made)
    stopped_at = len(made)
    gevent.sleep(0.05)
    assert len(made) == stopped_at  # the producer is gone, not parked on a full buffer
    b.close()
