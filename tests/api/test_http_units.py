"""The HTTP layer's own parts (bubo.api.http): the request's header block read by hand gives
what Python's email parser gives (pywsgi's own reader, which the framing checks were written
against), and a small answer leaves in one send."""

from __future__ import annotations

import http.client
import io
import socket

import pytest
from gevent import pywsgi

from bubo.api.http import ONE_SEND_BYTES, Handler, _Headers, read_headers

BLOCKS = [
    b"Host: a\r\nContent-Length: 5\r\n\r\n",
    b"Host:   a  \r\nX-A: b\tc\r\nx-a: second\r\n\r\n",  # spaces kept at the end; a repeated name
    b"Host: a\nX: y\n\n",  # bare LF line ends
    b"X: \xe9\xff\r\n\r\n",  # latin-1 values
    b"Content-Type: application/json; charset=utf-8\r\nTransfer-Encoding: chunked\r\n\r\n",
    b"\r\n",  # no header at all
]
# folded, without a colon, a stray CR, a multipart type, no blank line, a non-token name, an empty name
ODD = [b"Host: a\r\n folded\r\n\r\n", b"Host a\r\n\r\n", b"Host: a\rb\r\n\r\n",
       b"Content-Type: multipart/form-data\r\n\r\n", b"Content-Type: message/http\r\n\r\n", b"Host: a\r\n",
       b"H\xe9: x\r\n\r\n", b": empty\r\n\r\n", b"Host : a\r\n\r\n"]


def _same(a, b) -> None:
    assert list(a._headers) == list(b._headers)
    assert list(a.headers) == list(b.headers)
    assert a.typeheader == b.typeheader and a.status == b.status
    for name in ("host", "HOST", "x-a", "content-length", "transfer-encoding", "missing"):
        assert a.get(name) == b.get(name) and a.getheader(name, "-") == b.getheader(name, "-")


@pytest.mark.parametrize("block", BLOCKS)
def test_plain_header_blocks_read_as_the_email_parser_reads_them(block):
    ours, theirs = read_headers(io.BytesIO(block)), pywsgi.headers_factory(io.BytesIO(block))
    assert isinstance(ours, _Headers)
    _same(ours, theirs)
    del ours["x-a"], theirs["x-a"]
    _same(ours, theirs)


@pytest.mark.parametrize("block", ODD)
def test_other_header_blocks_go_to_the_email_parser(block):
    ours, theirs = read_headers(io.BytesIO(block)), pywsgi.headers_factory(io.BytesIO(block))
    assert not isinstance(ours, _Headers)
    _same(ours, theirs)
    assert [type(d) for d in ours.defects] == [type(d) for d in theirs.defects]


def test_a_header_line_too_long_and_too_many_headers():
    long = b"X: " + b"a" * 70000 + b"\r\n\r\n"
    assert read_headers(io.BytesIO(long)).status == pywsgi.headers_factory(io.BytesIO(long)).status == "Line too long"
    many = b"".join(b"X%d: y\r\n" % i for i in range(101)) + b"\r\n"
    with pytest.raises(http.client.HTTPException, match="more than 100 headers"):
        read_headers(io.BytesIO(many))


class _Sent:
    """A handler's sends, recorded: _write_with_headers with finalize_headers' outcome given."""

    def __init__(self, cls, chunked: bool):
        self.h = cls.__new__(cls)
        self.h.status = b"200 OK"
        self.h.response_headers = [(b"Content-Type", b"application/json"), (b"Content-Length", b"12")]
        self.h.response_use_chunked = chunked
        self.h.finalize_headers = lambda: None
        self.h.response_length = 0
        self.sends: list[bytes] = []

        def sendall(data) -> None:
            self.sends.append(bytes(data))
            self.h.response_length += len(data)
        self.h._sendall = sendall


@pytest.mark.parametrize("chunked", [False, True])
@pytest.mark.parametrize("size", [0, 12, 4096, ONE_SEND_BYTES, ONE_SEND_BYTES + 1])
def test_an_answers_first_write_is_one_send_with_pywsgis_bytes(chunked, size):
    """Status line, headers and first part in one send (pywsgi's two sends wake the client twice,
    and with Nagle's algorithm wait for its delayed ACK), the same bytes and length as pywsgi's;
    a first part past ONE_SEND_BYTES goes as pywsgi sends it, uncopied."""
    data = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    ours, theirs = _Sent(Handler, chunked), _Sent(pywsgi.WSGIHandler, chunked)
    ours.h._write_with_headers(data)
    pywsgi.WSGIHandler._write_with_headers(theirs.h, data)
    assert b"".join(ours.sends) == b"".join(theirs.sends)
    assert ours.h.response_length == theirs.h.response_length and ours.h.headers_sent
    assert len(ours.sends) == (1 if size <= ONE_SEND_BYTES else len(theirs.sends))


def test_a_small_answer_is_one_send(base_url):
    """And in a running server: one recv holds the whole answer, on a kept-alive connection too."""
    host, port = base_url.rsplit("/", 1)[-1].split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        for _ in range(3):  # on a kept-alive connection too
            s.sendall(f"GET /health HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
            data = s.recv(65536)
            head, _, body = data.partition(b"\r\n\r\n")
            fields = dict(ln.split(b":", 1) for ln in head.split(b"\r\n")[1:])
            length = int({k.lower(): v for k, v in fields.items()}[b"content-length"])
            assert head.startswith(b"HTTP/1.1 200") and len(body) == length > 0, data
