"""JSON from clients, parsed within limits: no input makes the server fail.

Python's json module follows nesting by recursion (100,000 `[` end in a RecursionError), turns
integers of any length into int (past 4,300 digits that raises), accepts NaN and Infinity, and
lets lone UTF-16 surrogates ("\\ud800") through as str, which no UTF-8 text can hold. parse()
refuses all of these with JSONInputError, whose message names the limit and, for a string, where
it is (a JSON path such as `messages[0].content`)."""

from __future__ import annotations

import json
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


def parse(text: str) -> Any:
    """The value of a JSON text, checked as the module docstring says."""
    try:
        value = json.loads(text, parse_int=_int, parse_float=_float, parse_constant=_constant)
    except RecursionError:
        raise JSONInputError(f"the JSON nests arrays and objects deeper than {MAX_DEPTH} levels") from None
    except json.JSONDecodeError as e:
        raise JSONInputError(f"{e.msg} at line {e.lineno} column {e.colno}") from None
    check(value)
    return value


def check(value: Any) -> None:
    """Depth and strings of a parsed value (iteratively: the depth is what is being checked)."""
    stack: list[tuple[Any, str, int]] = [(value, "", 1)]
    while stack:
        v, path, depth = stack.pop()
        if isinstance(v, str):
            _text(v, path)
            continue
        if not isinstance(v, (dict, list)):
            continue
        if depth > MAX_DEPTH:
            raise JSONInputError(f"the JSON nests arrays and objects deeper than {MAX_DEPTH} levels "
                                 f"(at {_printable(path) or 'the top'})")
        if isinstance(v, dict):
            for k, item in v.items():
                where = f"{path}.{k}" if path else str(k)
                _text(k, f"a key in {path or 'the top object'}")
                stack.append((item, where, depth + 1))
        else:
            stack.extend((item, f"{path}[{i}]", depth + 1) for i, item in enumerate(v))


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
