"""JSON from clients, parsed within limits: no input makes the server fail.

Python's json module follows nesting by recursion (100,000 `[` end in a RecursionError), turns
integers of any length into int (past 4,300 digits that raises), accepts NaN and Infinity, and
lets lone UTF-16 surrogates ("\\ud800") through as str, which no UTF-8 text can hold. parse()
refuses all of these with JSONInputError, whose message names the limit and, for a string, where
it is (a JSON path such as `messages[0].content`)."""

from __future__ import annotations

import json
import re
from typing import Any

MAX_DEPTH = 128  # nesting of arrays and objects: far past any request's or schema's
MAX_NUMBER_CHARS = 100  # an integer of more digits means nothing to any field


class JSONInputError(ValueError):
    """The JSON text is malformed or outside the limits. surrogate: the text is valid JSON, but a
    string holds a lone surrogate (a value error rather than a syntax error)."""

    def __init__(self, message: str, surrogate: bool = False):
        super().__init__(message)
        self.message = message
        self.surrogate = surrogate


def _int(text: str) -> int:
    if len(text) > MAX_NUMBER_CHARS:
        raise JSONInputError(f"a number has {len(text)} digits; at most {MAX_NUMBER_CHARS} are accepted")
    return int(text)


def _float(text: str) -> float:
    if len(text) > MAX_NUMBER_CHARS:
        raise JSONInputError(f"a number has {len(text)} characters; at most {MAX_NUMBER_CHARS} are accepted")
    return float(text)


def _constant(name: str) -> Any:
    raise JSONInputError(f"{name} is not JSON (numbers must be finite)")


# a \u escape of a UTF-16 surrogate: only where the text holds one can a string hold a lone one
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_LONG_NUMBER = re.compile(r"[-+0-9.eE]{" + str(MAX_NUMBER_CHARS + 1) + ",}")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_BRACKET = re.compile(r"[\[\]{}]")


def parse(text: str) -> Any:
    """The value of a JSON text, checked as the module docstring says."""
    # Python's own number parsing unless the text holds a run of number characters long enough
    # to matter (a hook per number is slow on a body of millions of them)
    long = _LONG_NUMBER.search(text) is not None
    try:
        value = json.loads(text, parse_int=_int if long else None, parse_float=_float if long else None,
                           parse_constant=_constant)
    except RecursionError:
        raise JSONInputError(f"the JSON nests arrays and objects deeper than {MAX_DEPTH} levels") from None
    except json.JSONDecodeError as e:
        raise JSONInputError(f"{e.msg} at line {e.lineno} column {e.colno}") from None
    _check_depth(text)
    if _SURROGATE_ESCAPE.search(text) is not None:
        check(value)
    return value


def _check_depth(text: str) -> None:
    """The nesting of a valid JSON text, read off its brackets outside strings (no walk over
    its values: a body of millions of numbers costs what its brackets cost)."""
    depth = 0
    for m in _BRACKET.finditer(_STRING.sub("", text)):
        if m.group() in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                raise JSONInputError(f"the JSON nests arrays and objects deeper than {MAX_DEPTH} levels")
        else:
            depth -= 1


def check(value: Any) -> None:
    """Depth and strings of a parsed value: iteratively, over containers (the depth is what is
    being checked); the path of what is wrong is built only then, from each container's parent."""
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
        _text(value, "")
        return
    while stack:
        v, depth, parent, key = stack.pop()
        seen.append((parent, key))
        me = len(seen) - 1
        if depth > MAX_DEPTH:
            raise JSONInputError(f"the JSON nests arrays and objects deeper than {MAX_DEPTH} levels "
                                 f"(at {_printable(path(me)) or 'the top'})")
        items = v.items() if isinstance(v, dict) else enumerate(v)
        for k, item in items:
            if isinstance(k, str):
                _text(k, f"a key in {path(me) or 'the top object'}")
            if isinstance(item, (dict, list)):
                stack.append((item, depth + 1, me, k))
            elif isinstance(item, str):
                _text(item, path(me, k))


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
