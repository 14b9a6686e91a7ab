"""The HTTP server under the app: gevent's WSGI server with limits a hostile client cannot get
around.

Per connection:
  - keepalive_s: waiting for a request, before the first one and between them;
  - header_s: from a request's first byte to the end of its headers (408, then closed);
  - a body must arrive before min(timeout_s, header_s + its length / MIN_BODY_RATE) seconds have
    passed since its headers, and no read may wait more than header_s for a byte;
  - write_s: an answer's write that cannot go on (the client does not read: its socket is full)
    for this long closes the connection (a stream being written ends, its generation with it);
    the next request on a connection is read only once the last answer has been sent (none of it
    left in its socket's send queue), so a client that pipelines requests without reading holds
    one answer at most;
  - at most max_connections open: a new connection beyond it closes the connection that has
    waited longest for its client (idle, still sending its headers or its body, or not reading
    the answer being written to it); if every one is working on a request, the newcomer gets 503
    and is closed.
Framing is strict: more than one Content-Length, Content-Length beside Transfer-Encoding, a
Transfer-Encoding other than chunked, or a malformed length is a 400 and the connection is
closed; a response that closes the connection (413, a malformed chunk) does not read the rest of
the body first.
"""

from __future__ import annotations

import dataclasses
import email.errors
import email.parser
import errno
import fcntl
import http.client
import json
import logging
import re
import resource
import socket
import struct
import time
from typing import Any, cast

import gevent
from gevent import pywsgi
from gevent.socket import wait_write

from bubo.api import errors, logs

log = logging.getLogger("bubo.http")

MIN_BODY_RATE = 64 * 1024  # bytes per second a body must at least arrive at, after header_s
FD_HEADROOM = 256  # file descriptors kept free below the limit (models, logs, the engine's files)
DEFAULT_MAX_CONNECTIONS = 4096
ONE_SEND_BYTES = 256 * 1024  # an answer's first part at most this long goes out with its headers
LINGER_S = 1.0  # after an answer that leaves a body unread: how long its rest is read and dropped

# What Python's header parser reports of a multipart Content-Type, whose body it never sees:
# nothing wrong with the header lines.
_MULTIPART_DEFECTS = (email.errors.NoBoundaryInMultipartDefect, email.errors.StartBoundaryNotFoundDefect,
                      email.errors.CloseBoundaryNotFoundDefect, email.errors.MultipartInvariantViolationDefect)


def _left_over(msg: Any) -> bool:
    """Whether the header parser stopped before the blank line: a defect other than a multipart
    type's, or text it kept as a payload (for a message/* Content-Type, in the message it parsed
    from what followed)."""
    if any(not isinstance(d, _MULTIPART_DEFECTS) for d in getattr(msg, "defects", None) or ()):
        return True
    payload = msg.get_payload() if hasattr(msg, "get_payload") else None
    if isinstance(payload, list):
        return any(list(part.items()) or _left_over(part) for part in payload)
    return bool(payload)


# a header field's name (RFC 9110's token)
_FIELD_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
# a header line read by hand (read_headers): a name, a colon, a value with no CR or LF in it
_PLAIN_LINE = re.compile(b"(" + _FIELD_NAME.pattern.encode("ascii") + rb"):([^\r\n]*)\r?\n")
MAX_HEADER_LINE = 65536  # http.client's limits, which pywsgi's parser applies
MAX_HEADERS = 100


class _Headers:
    """A request's header fields as pywsgi reads them (its OldMessage's calls), from plain lines:
    the values Python's email parser gives those lines, without its cost (a quarter of a light
    request's time in the HTTP layer)."""

    status = ""
    defects: tuple[Any, ...] = ()

    def __init__(self, fields: list[tuple[str, str]]):
        self._headers = fields
        self._first: dict[str, str] = {}  # a lower-case name -> its first field's value
        for k, v in reversed(fields):
            self._first[k.lower()] = v

    def get(self, name: str, default: Any = None) -> Any:
        return self._first.get(name.lower(), default)

    getheader = get

    def __delitem__(self, name: str) -> None:
        name = name.lower()
        self._headers = [(k, v) for k, v in self._headers if k.lower() != name]
        self._first.pop(name, None)

    def items(self) -> list[tuple[str, str]]:
        return list(self._headers)

    def get_payload(self) -> None:
        return None

    @property
    def headers(self) -> Any:
        return (f"{k}: {v}\r\n" for k, v in self._headers)

    @property
    def typeheader(self) -> str | None:
        return self.get("content-type")  # type: ignore[no-any-return]


def read_headers(fp: Any) -> Any:
    """The header block after a request line, read as http.client reads it (lines of at most
    MAX_HEADER_LINE bytes, at most MAX_HEADERS of them, up to an empty line or the end). Plain
    lines ("Name: value", no folding, no stray CR) become _Headers; anything else, and a
    multipart or message/* Content-Type (whose defects the email parser reports and _left_over
    weighs), goes to Python's email parser as pywsgi sends it, whose defects _check_framing then
    refuses."""
    lines: list[bytes] = []
    while True:
        line = fp.readline(MAX_HEADER_LINE + 1)
        if len(line) > MAX_HEADER_LINE:
            msg = pywsgi.OldMessage()
            msg.status = "Line too long"  # pywsgi's answer: 400
            return msg
        lines.append(line)
        if len(lines) > MAX_HEADERS:
            raise http.client.HTTPException(f"got more than {MAX_HEADERS} headers")
        if line in (b"\r\n", b"\n", b""):
            break
    fields: list[tuple[str, str]] = []
    for line in lines[:-1]:
        m = _PLAIN_LINE.fullmatch(line)
        if m is None:
            break
        value = m.group(2).decode("latin-1").lstrip(" \t")
        if m.group(1).lower() == b"content-type" and value.lower().startswith(("multipart/", "message/")):
            break
        fields.append((m.group(1).decode("latin-1"), value))
    else:
        if lines[-1] != b"":  # cut off before its blank line: the email parser's reading of it
            return _Headers(fields)
    return email.parser.Parser(_class=pywsgi.OldMessage).parsestr(b"".join(lines).decode("iso-8859-1"))


def _response(status: str, code: str, type_: str, message: str, extra: str = "", path: str | None = None) -> bytes:
    """A whole response that closes the connection, in the error shape of the route at path
    (OpenAI's when no request line was read)."""
    body = json.dumps(errors.body_for(_route(path), int(status.split()[0]), code, message, type_)).encode("ascii")
    return (f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n{extra}Connection: close\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode("ascii") + body


def _route(path: str | None) -> str | None:
    """A request target's path, without its query."""
    return path.split("?", 1)[0] if isinstance(path, str) else None


_REFUSED = _response("503 Service Unavailable", "too_many_connections", "server_error",
                     "too many open connections: try again shortly", "Retry-After: 1\r\n")


def _timeout(path: str | None) -> bytes:
    return _response("408 Request Timeout", "request_timeout", "invalid_request_error",
                     "the request headers did not arrive in time", path=path)


def _bad_request(why: str, path: str | None = None) -> bytes:
    return _response("400 Bad Request", "bad_request", "invalid_request_error", why, path=path)


@dataclasses.dataclass
class Limits:
    keepalive_s: float = 15.0
    header_s: float = 10.0
    timeout_s: float = 600.0  # llama-server's -to: the longest a request's body may take
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    write_s: float = 30.0  # how long a write may wait for its client to read


DRAIN_POLL_S = 0.02  # how often a pipelining client's unread answer is looked at


SIOCOUTQNSD = 0x894B  # Linux: the bytes of a TCP socket's send queue not sent yet (TIOCOUTQ adds unacknowledged ones)


_DATE: list[Any] = [None, b""]  # (the second, its Date header's value)


def _http_date() -> bytes:
    """The Date header's value for now (RFC 9110's IMF-fixdate), made once a second."""
    now = int(time.time())
    if _DATE[0] != now:
        _DATE[:] = [now, pywsgi.format_date_time(now)]
    return cast(bytes, _DATE[1])


def _unsent(sock: Any) -> int:
    """Bytes in the socket's send queue not sent yet (the client's window is full: it does not
    read); 0 where it cannot be told (not Linux, not TCP). Bytes sent and not yet acknowledged
    do not count: an ordinary client acknowledges them with its next request."""
    try:
        buf = fcntl.ioctl(sock.fileno(), SIOCOUTQNSD, b"\0\0\0\0")
    except (OSError, ValueError):
        return 0
    return int(struct.unpack("i", buf)[0])


def raise_fd_limit() -> int:
    """Raise the soft limit on open files to the hard one; returns the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft


def connection_cap(requested: int | None, fd_limit: int) -> int:
    """The connection cap: as asked, or the default, kept FD_HEADROOM below the fd limit."""
    cap = requested if requested is not None else DEFAULT_MAX_CONNECTIONS
    return max(1, min(cap, fd_limit - FD_HEADROOM))


IDLE, RECEIVING, WORKING, WRITING = "idle", "receiving", "working", "writing"


class _Conn:
    __slots__ = ("handler", "phase", "since")

    def __init__(self, handler: Handler):
        self.handler = handler
        # idle (between requests), receiving (a request's headers or body) or writing (an answer
        # its client does not read): it waits for its client and may be closed for a newcomer;
        # working: the app has the request
        self.phase = IDLE
        self.since = time.monotonic()

    @property
    def waiting(self) -> bool:
        return self.phase != WORKING


class Server(pywsgi.WSGIServer):  # type: ignore[misc]  # gevent has no type information
    """WSGIServer whose handlers follow `limits`; conns are the connections open now."""

    # connections accepted per wake-up before the handlers run: gevent's default (100) lets a
    # flood open that many sockets past the cap before any handler can close the oldest (151 open
    # against a cap of 40 on a slow 2-core machine); a few at a time keeps the cap close
    max_accept = 4

    def __init__(self, *args: Any, limits: Limits | None = None, **kwargs: Any):
        kwargs.setdefault("handler_class", Handler)
        super().__init__(*args, **kwargs)
        self.limits = limits or Limits()
        self.conns: dict[Handler, _Conn] = {}
        self.n_refused = 0
        self.n_evicted = 0

    def make_room(self, newcomer: Handler) -> bool:
        """Room for newcomer under the cap: close the connections that have waited longest for
        a request, as many as needed. False when every other connection is working."""
        excess = len(self.conns) - self.limits.max_connections
        if excess <= 0:
            return True
        waiting = sorted((c for h, c in self.conns.items() if c.waiting and h is not newcomer),
                         key=lambda c: c.since)
        if len(waiting) < excess:
            return False
        for c in waiting[:excess]:
            c.handler.drop()
            self.n_evicted += 1
        return True


class _Input(pywsgi.Input):  # type: ignore[misc]
    """The request body: read piece by piece, each piece within header_s and the whole within
    its deadline (a slow client's body fails; a large one sent steadily does not); not read to its
    end once the response closes the connection."""

    __slots__ = ("abandoned", "deadline", "gap_s", "complete")

    PIECE = 64 * 1024

    def _discard(self) -> None:
        if not getattr(self, "abandoned", False):
            super()._discard()

    def read(self, length: int | None = None) -> bytes:
        if length is not None and length < 0:
            length = None
        pieces: list[bytes] = []
        n = 0
        while length is None or n < length:
            want = self.PIECE if length is None else min(self.PIECE, length - n)
            piece = self._timed(super().read, want)
            if not piece:
                break
            pieces.append(piece)
            n += len(piece)
        return b"".join(pieces)

    def readline(self, size: int | None = None) -> bytes:
        return self._timed(super().readline, size)

    def _timed(self, read: Any, size: int | None) -> bytes:
        if getattr(self, "complete", False) or (
                not self.chunked_input and self.position >= (self.content_length or 0)):
            return b""  # the whole body is in: no deadline applies to reading its end again
        gap = getattr(self, "gap_s", 0.0)
        if not gap:
            data: bytes = read(size)
        else:
            left = getattr(self, "deadline", 0.0) - time.monotonic()
            if left <= 0:
                raise pywsgi._InvalidClientInput("the request body did not arrive in time")
            try:
                with gevent.Timeout(min(left, gap)):
                    data = read(size)
            except gevent.Timeout:
                raise pywsgi._InvalidClientInput("the request body did not arrive in time") from None
        if not data and size != 0:
            self.complete = True
        return data


class Handler(pywsgi.WSGIHandler):  # type: ignore[misc]
    """Hands the client socket to the app (environ["bubo.socket"]) so that an SSE response can
    see the client leave (EOF) without waiting for its next write to fail; applies the server's
    limits (the module docstring)."""

    _raw_headers: list[tuple[str, str]] = []
    _header_timer: gevent.Timeout | None = None  # the header clock while it runs
    _clocks: tuple[gevent.Timeout, gevent.Timeout] | None = None
    _dropped = False
    wsgi_input: Any = None
    provided_date: Any = None  # pywsgi's: the app's own Date header

    # --- the connection ----------------------------------------------------------------

    def handle(self) -> None:
        # pywsgi writes the headers and the body in separate sends: with Nagle's algorithm the
        # body waits for the client's delayed ACK of the headers, 40 ms on Linux, per response
        try:
            self.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass  # not TCP (a Unix socket)
        server: Server = self.server
        server.conns[self] = _Conn(self)
        try:
            if not server.make_room(self):
                server.n_refused += 1
                self._send_raw(_REFUSED)
                self._linger()
                return
            super().handle()
            body = self.__dict__.get("wsgi_input")
            if isinstance(body, _Input) and getattr(body, "abandoned", False):
                self._linger()  # the unread body: drained a moment so the client reads the answer
        except OSError:
            pass  # the client went away (or the connection was closed for a newcomer)
        finally:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None
            for clock in self._clocks or ():
                clock.close()
            server.conns.pop(self, None)

    def drop(self) -> None:
        """Close this connection from another greenlet (it is waiting for its client)."""
        self._dropped = True
        sock = getattr(self, "socket", None)
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _linger(self) -> None:
        """Close gently: stop writing, read and drop what the client still sends for a moment,
        so that its read of our response is not cut by a reset."""
        sock = getattr(self, "socket", None)
        if sock is None:
            return
        try:
            sock.shutdown(socket.SHUT_WR)
            with gevent.Timeout(LINGER_S):
                while sock.recv(65536):
                    pass
        except (OSError, gevent.Timeout):
            pass

    def _send_raw(self, data: bytes) -> None:
        try:
            self.socket.sendall(data)
        except OSError:
            pass

    def _phase(self, phase: str) -> None:
        conn = self.server.conns.get(self)
        if conn is not None:
            conn.phase = phase
            conn.since = time.monotonic()

    def _sendall(self, data: bytes | bytearray) -> None:
        """pywsgi's write, with the write deadline: a send that cannot go on for write_s (the
        client does not read) fails, and the connection counts as waiting meanwhile."""
        try:
            self._send_within(data)
        except OSError as ex:
            self.status = f"socket error: {ex}"
            code: int | None = getattr(self, "code", None)
            if code and code > 0:
                self.code = -code
            raise
        self.response_length += len(data)

    def _write_with_headers(self, data: bytes) -> None:
        """pywsgi's first write, in one send: the status line, the headers and the first part of
        the body (a whole JSON answer; a stream's first chunk). pywsgi sends the headers alone,
        then the body: two system calls and two wake-ups of the client per small answer. A large
        first part goes on its own, as pywsgi sends it (no copy of it)."""
        if len(data) > ONE_SEND_BYTES:
            super()._write_with_headers(data)
            return
        self.headers_sent = True
        self.finalize_headers()
        out = bytearray(b"HTTP/1.1 ")
        out += cast(bytes, self.status)  # latin-1 bytes, as pywsgi's start_response left it
        out += b"\r\n"
        for name, value in self.response_headers:
            out += name
            out += b": "
            out += value
            out += b"\r\n"
        out += b"\r\n"
        if data and self.response_use_chunked:
            out += b"%x\r\n" % len(data)
            out += data
            out += b"\r\n"
        elif data:
            out += data
        self._sendall(out)

    def finalize_headers(self) -> None:
        if self.provided_date is None:  # pywsgi's Date header, written once a second
            self.response_headers.append((b"Date", _http_date()))
            self.provided_date = True
        super().finalize_headers()

    def _send_within(self, data: bytes | bytearray) -> None:
        raw = getattr(self.socket, "_sock", None) or self.socket
        view = memoryview(data)
        blocked = False
        try:
            while view:
                if self._dropped:  # errno EPIPE: pywsgi closes the connection without logging an error
                    raise BrokenPipeError(errno.EPIPE, "the connection was closed for another one")
                try:
                    n = raw.send(view)
                except BlockingIOError:
                    n = 0
                if n:
                    view = view[n:]
                    continue
                if not blocked:
                    blocked = True
                    self._phase(WRITING)
                wait_write(raw.fileno(), timeout=self.server.limits.write_s,
                           timeout_exc=BrokenPipeError(errno.EPIPE, "the client did not read its answer in time"))
        finally:
            if blocked:
                self._phase(WORKING)

    def _drained(self) -> bool:
        """Wait until the last answer has been sent (none of it left in this socket's send queue:
        the client's window took it), for up to write_s; False if it was not (the client reads
        nothing: close)."""
        if _unsent(self.socket) == 0:
            return True
        self._phase(WRITING)
        deadline = time.monotonic() + self.server.limits.write_s
        while _unsent(self.socket) > 0:
            if self._dropped or time.monotonic() > deadline:
                return False
            gevent.sleep(DRAIN_POLL_S)
        return True

    # --- a request -----------------------------------------------------------------------

    def read_requestline(self) -> str:
        limits: Limits = self.server.limits
        self.path = None  # a keep-alive connection's last request's: its errors' shape is not this one's
        if not self._drained():
            return ""  # its last answer is still unread: no next one
        self._phase(IDLE)
        if self._clocks is None:  # the connection's two timers, armed again for each request
            # each raises an exception of its own class: a timer that raised itself would hold the
            # handler's frame in its traceback, and the handler the timer (a cycle per connection)
            self._clocks = (gevent.Timeout(limits.keepalive_s, _IdleTimeout),
                            gevent.Timeout(limits.header_s, _HeaderTimeout))
        idle, headers = self._clocks
        idle.start()
        try:
            if not self.rfile.peek(1):
                return ""  # the client closed the connection
        except (_IdleTimeout, OSError, ValueError):
            return ""  # idle too long, or closed for a newcomer: close
        finally:
            idle.cancel()
        if self._dropped:
            return ""
        # a request has begun: its line and headers must come within header_s
        self._phase(RECEIVING)
        self._header_timer = headers
        headers.start()
        try:
            line: str = super().read_requestline()
        except _HeaderTimeout:
            self._timed_out()
            return ""
        if not line or self._dropped:
            self._header_timer.cancel()
            return ""
        return line

    def read_request(self, raw_requestline: str) -> bool:
        try:
            ok: bool = super().read_request(raw_requestline)
        except _HeaderTimeout:
            raise _Framing("") from None
        finally:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None
        if self._dropped:
            raise _Framing("the connection was closed")  # its headers may be cut: run nothing
        self._check_framing()
        if not (self.content_length or self.headers.get("transfer-encoding")):
            self._phase(WORKING)  # no body to wait for: the request is at work from here
        else:
            self._phase(RECEIVING)  # its body's wait starts now (an idle wait before does not count)
        return ok

    def MessageClass(self, fp: Any, *args: Any) -> Any:  # noqa: N802 - pywsgi's name
        msg = read_headers(fp)
        self._raw_headers = list(getattr(msg, "_headers", []))  # before pywsgi drops a Content-Length
        return msg

    def _check_framing(self) -> None:
        if not isinstance(self.headers, _Headers):  # read_headers' plain lines passed these checks as read
            if _left_over(self.headers):
                # a line that is no header field ends Python's header parser early: what follows it
                # would be read as the body, or as the next request
                raise _Framing("a header line is malformed")
            for k, v in self._raw_headers:
                if not _FIELD_NAME.fullmatch(k):
                    raise _Framing(f"a header name is malformed: {k[:40]!r}")
                if "\n" in v or "\r" in v:
                    raise _Framing("folded header lines are not accepted")
        names = [k.lower() for k, _ in self._raw_headers]
        n_cl, n_te = names.count("content-length"), names.count("transfer-encoding")
        if n_cl > 1:
            raise _Framing("more than one Content-Length header")
        if n_te > 1:
            raise _Framing("more than one Transfer-Encoding header")
        if n_cl and n_te:
            raise _Framing("Content-Length and Transfer-Encoding together")
        if n_te and self.headers.get("transfer-encoding", "").strip().lower() != "chunked":
            raise _Framing("only Transfer-Encoding: chunked is accepted")
        if n_cl and not self.headers.get("content-length", "").strip().isdigit():
            raise _Framing("Content-Length is not a number")

    def handle_one_request(self) -> Any:
        result = super().handle_one_request()
        # pywsgi's own answers to a request line or header block it cannot read have no body:
        # the same in the error shape (a request line it could not read has no route)
        if isinstance(result, tuple) and result[1] == pywsgi._BAD_REQUEST_RESPONSE:
            return ("400", _bad_request("the request line or a header could not be read"))
        if isinstance(result, tuple) and result[1] == pywsgi._REQUEST_TOO_LONG_RESPONSE:
            return ("414", _response("414 URI Too Long", "uri_too_long", "invalid_request_error",
                                     "the request line is too long"))
        return result

    def _handle_client_error(self, ex: BaseException) -> Any:
        if isinstance(ex, _Framing):
            path = getattr(self, "path", None)
            if not ex.why:  # the header deadline
                return ("408", _timeout(path))
            log.info("bad request framing from %s: %s", self.client_address, ex.why)
            return ("400", _bad_request(ex.why, path))
        return super()._handle_client_error(ex)

    def _timed_out(self) -> None:
        self._send_raw(_timeout(getattr(self, "path", None)))
        self.close_connection = True

    def get_environ(self) -> dict[str, Any]:
        env: dict[str, Any] = super().get_environ()
        env["bubo.socket"] = self.socket
        env["bubo.body_read"] = lambda: self._phase(WORKING)  # the app has the whole body: at work
        old: Any = self.wsgi_input
        limits: Limits = self.server.limits
        body = _Input(old.rfile, old.content_length, socket=old.socket, chunked_input=old.chunked_input)
        length = old.content_length or 0
        body.deadline = time.monotonic() + min(limits.timeout_s, limits.header_s + length / MIN_BODY_RATE)
        if old.chunked_input:
            body.deadline = time.monotonic() + limits.timeout_s
        body.gap_s = limits.header_s
        body.abandoned = False
        self.wsgi_input = body
        if env.get("wsgi.input") is old:
            env["wsgi.input"] = body
        return env

    def start_response(self, status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        if any(k.lower() == "connection" and v.lower() == "close" for k, v in headers):
            # the rest of the body is not read: the connection ends with this response
            self.close_connection = True
            body = getattr(self, "wsgi_input", None)
            if isinstance(body, _Input):
                body.abandoned = True
        return super().start_response(status, headers, exc_info)

    def log_request(self) -> None:
        """One line per answered request (bubo.api.logs), once its response is written: the
        model and token counts the app put in the environ (environ["bubo.log"])."""
        env = getattr(self, "environ", None) or {}
        raw = self.status or b"-"
        status = (raw.decode("latin-1") if isinstance(raw, bytes) else str(raw)).split(" ", 1)[0]
        fields: dict[str, Any] = dict(env.get("bubo.log") or {})
        fields.update(method=self.command or "-", path=env.get("PATH_INFO") or self.path or "-", status=status,
                      ms=round(((self.time_finish or time.time()) - self.time_start) * 1000, 1),
                      client=self.client_address[0] if isinstance(self.client_address, tuple) else "-")
        logs.request_line(fields)


class _HeaderTimeout(BaseException):
    pass


class _IdleTimeout(BaseException):
    pass


class _Framing(ValueError):
    def __init__(self, why: str):
        super().__init__(why or "the request headers did not arrive in time")
        self.why = why
