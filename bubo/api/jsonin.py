"""JSON from clients, parsed within limits: no input makes the server fail.

Python's json module follows nesting by recursion (100,000 `[` end in a RecursionError), turns
integers of any length into int (past 4,300 digits that raises), accepts NaN and Infinity, and
lets lone UTF-16 surrogates ("\\ud800") through as str, which no UTF-8 text can hold. parse()
refuses all of these with JSONInputError, whose message names the limit and, for a string, where
it is (a JSON path such as `messages[0].content`).

It also bounds what one call of the C parser may cost: json.loads holds the GIL from start to end
(a 16 MB body of small values takes 150-300 ms, during which no other thread runs), so a body
holds at most MAX_VALUES values, counted before it is parsed. The checks after the parse (depth,
strings) walk the values in Python, calling bubo.deadline.check() now and then: in a worker
thread, a loop that lets the others run."""

from __future__ import annotations

import json
import re
import sys
from typing import Any

from bubo import deadline

MAX_DEPTH = 128  # nesting of arrays and objects: far past any request's or schema's
MAX_NUMBER_CHARS = 100  # an integer of more digits means nothing to any field
# values in one body (members of arrays and objects, counted by the commas and colons between
# them): more than any request needs (a prompt of token ids longer than any context here, an enum
# of 100,000 values, logit_bias at its maximum), and what json.loads parses in about 50 ms on a
# slow core, the time the event loop may wait for it
MAX_VALUES = 500_000


class JSONInputError(ValueError):
    """The JSON text is malformed or outside the limits. surrogate: the text is valid JSON, but a
    string holds a lone surrogate (a value error rather than a syntax error)."""

    def __init__(self, message: str, surrogate: bool = False):
        super().__init__(message)
        self.message = message
        self.surrogate = surrogate


_BIG = 10 ** MAX_NUMBER_CHARS  # an integer this large has more digits than are accepted


def _int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_NUMBER_CHARS:
        raise JSONInputError(f"a number has {len(text)} digits; at most {MAX_NUMBER_CHARS} are accepted")
    return int(text)


def _float(text: str) -> float:
    if len(text) > MAX_NUMBER_CHARS:
        raise JSONInputError(f"a number has {len(text)} characters; at most {MAX_NUMBER_CHARS} are accepted")
    return float(text)


def _too_long(n: int) -> JSONInputError:
    return JSONInputError(f"a number has {len(str(abs(n)))} digits; at most {MAX_NUMBER_CHARS} are accepted")


def _constant(name: str) -> Any:
    raise JSONInputError(f"{name} is not JSON (numbers must be finite)")


# a \u escape of a UTF-16 surrogate: only where the text holds one can a string hold a lone one
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SCAN_CHUNK = 1 << 16  # characters scanned between deadline checks


def parse(text: str) -> Any:
    """The value of a JSON text, checked as the module docstring says."""
    # the members of arrays and objects are separated by commas and colons: their count bounds
    # the values (commas in strings count too; only past the limit are strings told apart)
    if text.count(",") + text.count(":") >= MAX_VALUES and _separators(text) >= MAX_VALUES:
        raise JSONInputError(f"the JSON holds more than {MAX_VALUES:,} values; at most {MAX_VALUES:,} are accepted")
    deadline.check()
    # integers: Python's own parser, which refuses more than 4,300 digits (the walk below the
    # length past MAX_NUMBER_CHARS), unless this Python has no such limit (3.10 before 3.10.7, or
    # PYTHONINTMAXSTRDIGITS=0): then a hook per integer; a hook per number with a fraction or an
    # exponent (few in a request), whose length nothing else would bound
    try:
        if text.startswith("\ufeff"):  # json.loads's own check, which the decoder does not make
            raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", text, 0)
        value = _decoder().decode(text)
    except RecursionError:
        raise JSONInputError(f"the JSON nests arrays and objects deeper than {MAX_DEPTH} levels") from None
    except json.JSONDecodeError as e:
        raise JSONInputError(f"{e.msg} at line {e.lineno} column {e.colno}") from None
    except JSONInputError:
        raise  # NaN or Infinity (_constant)
    except ValueError:  # an integer past Python's 4,300 digits
        raise JSONInputError(f"a number has more than 4300 digits; at most {MAX_NUMBER_CHARS} are accepted") from None
    check(value, strings="\\u" in text and _SURROGATE_ESCAPE.search(text) is not None)
    return value


def _decoder() -> json.JSONDecoder:
    """json's decoder with parse's hooks, made once per setting of the integer limit (json.loads
    with hooks makes one per call: a few microseconds of a small request's time)."""
    limited = getattr(sys, "get_int_max_str_digits", lambda: 0)() > 0
    decoder = _DECODERS.get(limited)
    if decoder is None:
        decoder = _DECODERS[limited] = json.JSONDecoder(parse_constant=_constant, parse_float=_float,
                                                        parse_int=None if limited else _int)
    return decoder


_DECODERS: dict[bool, json.JSONDecoder] = {}


def _separators(text: str) -> int:
    """The commas and colons of a JSON text outside its strings, counted a chunk at a time (a
    loop that lets other threads run, unlike one regular expression over 16 MB)."""
    # an escaped backslash or quote ends no string: out of the way first (valid JSON has no
    # backslash outside a string; for invalid JSON the count only decides which error it gets)
    text = text.replace("\\\\", "__").replace('\\"', "__")
    n, inside = 0, False
    for start in range(0, len(text), _SCAN_CHUNK):
        for i, part in enumerate(text[start:start + _SCAN_CHUNK].split('"')):
            if i:
                inside = not inside
            if not inside:
                n += part.count(",") + part.count(":")
        deadline.check()
    return n


def check(value: Any, strings: bool = True) -> None:
    """Depth and (with strings) the strings of a parsed value: iteratively, over containers (the
    depth is what is being checked); the path of what is wrong is built only then, from each
    container's parent."""
    # (container, depth, parent index, key in the parent)
    stack: list[tuple[Any, int, int, Any]] = [(value, 1, -1, None)]
    seen: list[tuple[int, Any]] = []  # parent index and key of each container taken off the stack

    def path(i: int, key: Any = None) -> str:
        keys = [] if key is None else [key]
        while i >= 0:
            parent, k = seen[i]
            if k is not None:
                keys.append(k)
            i = parent
        out = ""
        for k in reversed(keys):
            out += f"[{k}]" if isinstance(k, int) else (f".{k}" if out else str(k))
        return out

    if isinstance(value, str):
        if strings:
            _text(value, "")
        return
    if type(value) is int and not -_BIG < value < _BIG:
        raise _too_long(value)
    if not isinstance(value, (dict, list)):
        return
    n = 0
    while stack:
        v, depth, parent, key = stack.pop()
        seen.append((parent, key))
        me = len(seen) - 1
        if depth > MAX_DEPTH:
            raise JSONInputError(f"the JSON nests arrays and objects deeper than {MAX_DEPTH} levels "
                                 f"(at {_printable(path(me)) or 'the top'})")
        n += len(v)
        if n > 4096:
            n = 0
            deadline.check()
        items = v.items() if isinstance(v, dict) else enumerate(v)
        for k, item in items:
            if strings and isinstance(k, str):
                _text(k, f"a key in {path(me) or 'the top object'}")
            if isinstance(item, (dict, list)):
                stack.append((item, depth + 1, me, k))
            elif strings and isinstance(item, str):
                _text(item, path(me, k))
            elif type(item) is int and not -_BIG < item < _BIG:
                raise _too_long(item)


def _text(s: str, path: str) -> None:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:
        where = _printable(path) or "a string"
        bad = s[e.start:e.end].encode("unicode_escape").decode("ascii")
        raise JSONInputError(f"{where} holds a lone UTF-16 surrogate ({bad}) at character {e.start}, which is not "
                             "valid Unicode text", surrogate=True) from None


def _printable(path: str) -> str:
    path = path.encode("utf-8", "backslashreplace").decode("utf-8")
    return path if len(path) <= 80 else path[:77] + "..."
