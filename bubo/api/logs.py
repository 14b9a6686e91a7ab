"""The server's output: the start-up lines on stdout, the log (one line per request, warnings,
errors) on stderr, as text or as JSON lines (`--log-format json`), more with `-v`, none with
`--log-disable` (a fatal error still says why on stderr: that is the exit's reason, not a log).

    bubo serve: listening on http://127.0.0.1:8080              (stdout, `say`)
    2026-12-01 21:40:27 INFO bubo.request: POST /v1/chat/completions 200 model=smollm2:135m
        prompt=25 generated=12 431 ms                          (stderr, one line per request)

Routes that are polled (/health, /ready, /metrics, /slots, /props, /v1/models) log at DEBUG:
shown with -v, so that a health check every second does not fill the log."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any, cast

log = logging.getLogger("bubo.request")

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
POLLED = frozenset({"/health", "/ready", "/metrics", "/slots", "/props", "/v1/models", "/models", "/"})
# the fields of a request's line, in order (JSON: keys of their own)
REQUEST_FIELDS = ("method", "path", "status", "model", "prompt_tokens", "generated_tokens", "ms", "client", "caller")


class _State:
    fmt = "text"
    disabled = False
    handler: logging.StreamHandler[Any] | None = None  # setup()'s, on the root logger


def level_of(verbose: bool, verbosity: int | None) -> int:
    """The log's level: -v is DEBUG; llama.cpp's --log-verbosity N is a threshold (0 or 1: errors,
    2: warnings, 3: the usual INFO lines, 4 or more: DEBUG). The start-up lines on stdout (`say`)
    are llama.cpp's level 0, "generic output": always shown (but with --log-disable)."""
    if verbose or (verbosity is not None and verbosity >= 4):
        return logging.DEBUG
    if verbosity is None or verbosity == 3:
        return logging.INFO
    return logging.WARNING if verbosity == 2 else logging.ERROR


def setup(*, verbose: bool = False, disabled: bool = False, fmt: str = "text", verbosity: int | None = None) -> None:
    """Configure the process's logging (once, at start)."""
    if fmt not in ("text", "json"):
        raise ValueError(f"--log-format {fmt}: give text or json")
    _State.fmt = fmt
    _State.disabled = disabled
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter(TEXT_FORMAT, "%Y-%m-%d %H:%M:%S"))
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    _State.handler = handler
    root.setLevel(level_of(verbose, verbosity))
    # neither format shows the caller's file and line, thread or process: not looked up for each
    # record (the logging HOWTO's "Optimization"; a fifth of a light request's log line)
    logging._srcfile = None
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    for noisy in ("werkzeug", "geventwebsocket"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    logging.disable(logging.CRITICAL if disabled else logging.NOTSET)


class TextFormatter(logging.Formatter):
    """logging's Formatter, with the time's text made once a second (a line per request)."""

    _cached: tuple[int, str] = (-1, "")  # (a second, its text), replaced as one

    def line(self, created: float, levelname: str, name: str, msg: str, fields: dict[str, Any]) -> str:
        """format()'s text of a record made at `created` with no exception, made without the
        record: the format's fields (TEXT_FORMAT's) filled from these."""
        asctime = self.formatTime(cast(logging.LogRecord, _Stamp(created)), self.datefmt)
        return self._style._fmt % {"asctime": asctime, "levelname": levelname, "name": name, "message": msg}

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802 - logging's name
        if datefmt is None:  # the text ends in milliseconds
            return super().formatTime(record, datefmt)
        second, text = self._cached
        if second != int(record.created):
            text = super().formatTime(record, datefmt)
            self._cached = (int(record.created), text)
        return text


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts (ISO 8601, UTC), level, logger, msg, and a request line's
    fields (method, path, status, model, prompt_tokens, generated_tokens, ms, client, caller)."""

    def format(self, record: logging.LogRecord) -> str:
        exc = self.formatException(record.exc_info) if record.exc_info else None
        return self._json(record.created, record.levelname, record.name, record.getMessage(), record.__dict__, exc)

    def line(self, created: float, levelname: str, name: str, msg: str, fields: dict[str, Any]) -> str:
        """format()'s text of a record made at `created` with these fields and no exception,
        made without the record."""
        return self._json(created, levelname, name, msg, fields, None)

    @staticmethod
    def _json(created: float, levelname: str, name: str, msg: str, fields: dict[str, Any], exc: str | None) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created)) + f".{_Stamp(created).msecs:03d}Z",
            "level": levelname.lower(), "logger": name, "msg": msg,
        }
        for key in REQUEST_FIELDS:
            if key in fields:
                out[key] = fields[key]
        if exc:
            out["exc"] = exc
        return json.dumps(out, ensure_ascii=False)


class _Stamp:
    """What Formatter.formatTime reads of a record: its time and, as a LogRecord counts them, its
    milliseconds."""

    __slots__ = ("created", "msecs")

    def __init__(self, created: float):
        self.created = created
        self.msecs = int((created - int(created)) * 1000)


def plural(n: int, word: str) -> str:
    """"1 thread", "2 threads", "0 slots": a count and its noun, as a person writes them."""
    return f"{n} {word}{'' if n == 1 else 's'}"


def say(msg: str, **fields: Any) -> None:
    """A start-up or life-cycle line on stdout ("bubo serve: ..."; JSON with --log-format json)."""
    if _State.disabled:
        return
    if _State.fmt == "json":
        line = json.dumps({"ts": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "level": "info",
                           "logger": "bubo.serve", "msg": msg, **fields}, ensure_ascii=False)
    else:
        line = f"bubo serve: {msg}"
    write_line(sys.stdout, line)


def write_line(stream: Any, line: str) -> None:
    """One line in one write (print writes the text and its newline apart: a log record that another
    thread writes to the same pipe, as with `2>&1`, could land between them, on the same line)."""
    stream.write(line + "\n")
    stream.flush()


def request_line(fields: dict[str, Any]) -> None:
    """Log one finished request: `fields` has REQUEST_FIELDS (model and token counts when the
    request generated)."""
    level = logging.DEBUG if fields.get("path") in POLLED else logging.INFO
    if not log.isEnabledFor(level):
        return
    parts = [str(fields.get("method", "-")), str(fields.get("path", "-")), str(fields.get("status", "-"))]
    if fields.get("model"):
        parts.append(f"model={fields['model']}")
    if fields.get("prompt_tokens") is not None:
        parts.append(f"prompt={fields['prompt_tokens']} generated={fields.get('generated_tokens', 0)}")
    parts.append(f"{fields.get('ms', 0):.0f} ms")
    if fields.get("client"):
        parts.append(f"client={fields['client']}")
    if fields.get("caller"):
        parts.append(f"caller={fields['caller']}")  # a named key's (bubo.api.callers)
    msg, extra = " ".join(parts), {k: fields[k] for k in REQUEST_FIELDS if k in fields}
    handler = _alone(level)
    if handler is None:
        log.log(level, msg, extra=extra)
        return
    # the line setup()'s handler would write, written as it writes it, without the LogRecord
    # and the walk through logging's loggers and filters: most of a light request's log line
    handler.acquire()
    try:
        line = cast(_Formatter, handler.formatter).line(time.time(), logging.getLevelName(level), log.name, msg, extra)
        stream = handler.stream
        stream.write(line + handler.terminator)
        if not getattr(stream, "line_buffering", False):  # stderr's own write flushed the line
            stream.flush()
    except Exception:  # noqa: BLE001 - as StreamHandler.emit: the handler says so on stderr, the server goes on
        handler.handleError(log.makeRecord(log.name, level, "", 0, msg, (), None, extra=extra))
    finally:
        handler.release()


_Formatter = TextFormatter | JsonFormatter


def _alone(level: int) -> logging.StreamHandler[Any] | None:
    """setup()'s handler when a request line at this level would reach it and no other handler,
    filter or record factory: the process's logging as setup() left it (an embedding program that
    configures logging of its own gets logging's own path)."""
    handler = _State.handler
    if (handler is None or handler.filters or level < handler.level or log.filters
            or type(handler.formatter) not in (TextFormatter, JsonFormatter)
            or (isinstance(handler.formatter, TextFormatter) and handler.formatter._fmt != TEXT_FORMAT)
            or logging.getLogRecordFactory() is not logging.LogRecord):
        return None
    node = log
    while node.parent is not None:  # the loggers between the request log and the root
        if node.handlers or not node.propagate:
            return None
        node = node.parent
    return handler if node.handlers == [handler] else None
