"""JSON from clients, parsed within limits: no input makes the server fail.

Python's json module follows nesting by recursion (100,000 `[` end in a RecursionError), turns
integers of any length into int (past 4,300 digits that raises), accepts NaN and Infinity, and
lets lone UTF-16 surrogates ("\\ud800") through as str, which no UTF-8 text can hold. parse()
refuses all of these with JSONInputError, whose message names the limit and, for a string, where
it is (a JSON path such as `messages[0].content`).

It also bounds what one call of the C parser may cost: json.loads holds the GIL from start to end
(4 MB of small values takes 60 ms here, during which no other thread runs). A body holds at most
MAX_VALUES values, counted before it is parsed, and a text of SPLIT_CHARS or more is parsed in
pieces: bubo._jsonsplit finds its large arrays and objects without the GIL and cuts them into runs
of whole members of about RUN_CHARS; each run is one call of the parser, the text between them
(commas, the keys of large members) is checked here, and bubo.deadline.check() between the calls
lets the other threads run. The value, and the message of an error inside a run, are json's. (A
member that is no array or object, a long string, is still read in one call: a 16 MB string in
about 10 ms.) The checks after the parse (depth, strings) walk the values in Python the same way."""

from __future__ import annotations

import json
import re
import sys
from typing import Any

from bubo import _jsonsplit, deadline

MAX_DEPTH = 128  # nesting of arrays and objects: far past any request's or schema's
MAX_NUMBER_CHARS = 100  # an integer of more digits means nothing to any field
# values in one body (members of arrays and objects, counted by the commas and colons between
# them): more than any request needs (a prompt of token ids longer than any context here, an enum
# of 100,000 values, logit_bias at its maximum), and what json.loads parses in about 50 ms on a
# slow core, the time the event loop may wait for it
MAX_VALUES = 500_000
# a text this long is parsed in pieces, runs of about RUN_CHARS (a few milliseconds each); an array
# or object shorter than RUN_CHARS is parsed whole, inside a run
SPLIT_CHARS = 256 * 1024
RUN_CHARS = 64 * 1024


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


def parse(text: str, utf8: bytes | None = None) -> Any:
    """The value of a JSON text, checked as the module docstring says; utf8: the text's UTF-8
    bytes where the caller has them (a request's body), which a large text's split reads."""
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
        value = _decoder().decode(text) if len(text) < SPLIT_CHARS else _pieces(text, utf8=utf8)
    except RecursionError:
        raise JSONInputError(f"the JSON nests arrays and objects deeper than {MAX_DEPTH} levels") from None
    except json.JSONDecodeError as e:
        raise JSONInputError(f"{e.msg} at line {e.lineno} column {e.colno}") from None
    except JSONInputError:
        raise  # NaN or Infinity (_constant)
    except ValueError:  # an integer past Python's 4,300 digits
        raise JSONInputError(f"a number has more than 4300 digits; at most {MAX_NUMBER_CHARS} are accepted") from None
    check(value, strings="\\u" in text and _surrogate_escape(text))
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


def _pieces(text: str, large: int = RUN_CHARS, run: int = RUN_CHARS, utf8: bytes | None = None) -> Any:
    """parse's value of text, read a run of members at a time (the module docstring): the value
    of one call of the decoder, or for malformed text a JSONDecodeError (or JSONInputError), at
    the same place and with json's message where the error is inside a run."""
    if utf8 is None:
        utf8 = text.encode("utf-8", "surrogatepass")
    pieces, why, where = _jsonsplit.split(utf8, large, run, MAX_DEPTH + 1)
    if why:
        raise _unsplit(text, why, where)
    decoder = _decoder()
    if not pieces:  # no large array or object: one call
        return decoder.decode(text)
    first = _skip(text, 0)
    if first != pieces[0][1]:  # a value before the first large one, which is extra data
        _, end = decoder.raw_decode(text, first)
        raise json.JSONDecodeError("Extra data", text, _skip(text, end))
    stack: list[_Open] = []
    for kind, a, b in pieces:
        if kind == _jsonsplit.OPEN:
            opened = _Open(text, a)
            if stack:
                stack[-1].add(opened.value, stack[-1].glue_before(a, decoder))
            stack.append(opened)
        elif kind == _jsonsplit.RUN:
            stack[-1].run(a, b, decoder)
            deadline.check()
        else:
            done = stack.pop()
            done.close(a)
            if stack:
                stack[-1].pos, stack[-1].first = a + 1, False
                continue
            end = _skip(text, a + 1)
            if end != len(text):
                raise json.JSONDecodeError("Extra data", text, end)
            return done.value
    raise AssertionError("the pieces of a JSON text end inside it")  # the split closes what it opens


_WHITESPACE = re.compile(r"[ \t\n\r]*")


def _skip(text: str, i: int) -> int:
    m = _WHITESPACE.match(text, i)
    return m.end() if m else i


class _Open:
    """A large array or object being read (_pieces): its value so far, and how far its text is
    read (pos: the next character not read; first: no member read yet)."""

    def __init__(self, text: str, at: int):
        self.text, self.is_object = text, text[at] == "{"
        self.value: Any = {} if self.is_object else []
        self.pos, self.first = at + 1, True

    def add(self, value: Any, key: str | None) -> None:
        if self.is_object:
            self.value[key] = value
        else:
            self.value.append(value)

    def glue_before(self, at: int, decoder: json.JSONDecoder) -> str | None:
        """Read the text up to a large member at `at`: the comma before it, and in an object its
        key and colon; the key."""
        text = self.text
        i = self._comma()
        key = None
        if self.is_object:
            if text[i:i + 1] != '"':
                raise json.JSONDecodeError("Expecting property name enclosed in double quotes", text, i)
            key, i = decoder.raw_decode(text, i)  # a string: it starts with a quote
            i = _skip(text, i)
            if text[i:i + 1] != ":":
                raise json.JSONDecodeError("Expecting ':' delimiter", text, i)
            i = _skip(text, i + 1)
        if i != at:  # a member with no comma after it
            _, end = decoder.raw_decode(text, i)
            raise json.JSONDecodeError("Expecting ',' delimiter", text, _skip(text, end))
        return key

    def run(self, a: int, b: int, decoder: json.JSONDecoder) -> None:
        """Read the members in text[a:b]: a is just past this one's bracket or one of its commas,
        b at one of its commas or its closing bracket."""
        if not self.first:
            self._comma()  # its own comma, at a - 1
        opener, closer = ("{", "}") if self.is_object else ("[", "]")
        try:
            part = decoder.decode(opener + self.text[a:b] + closer)
        except json.JSONDecodeError as e:  # the same place in the whole text
            raise json.JSONDecodeError(e.msg, self.text, a - 1 + e.pos) from None
        if not part and (not self.first or self.text[b] == ","):  # only whitespace before or after a comma
            raise self._trailing(_skip(self.text, a))
        if self.is_object:
            self.value.update(part)
        else:
            self.value.extend(part)
        self.pos, self.first = b, False

    def close(self, at: int) -> None:
        i = _skip(self.text, self.pos)
        if i != at and self.text[i] == ",":
            raise self._trailing(_skip(self.text, i + 1))
        if i != at:
            raise json.JSONDecodeError("Expecting ',' delimiter", self.text, i)

    def _comma(self) -> int:
        """Past the comma before the next member (none before the first): where it starts."""
        i = _skip(self.text, self.pos)
        if self.first:
            return i
        if self.text[i:i + 1] != ",":
            raise json.JSONDecodeError("Expecting ',' delimiter", self.text, i)
        return _skip(self.text, i + 1)

    def _trailing(self, at: int) -> json.JSONDecodeError:
        msg = "Expecting property name enclosed in double quotes" if self.is_object else "Expecting value"
        return json.JSONDecodeError(msg, self.text, at)


def _unsplit(text: str, why: int, where: int) -> json.JSONDecodeError | JSONInputError:
    """The error for a text whose brackets or strings do not close (_jsonsplit's why)."""
    if why == _jsonsplit.TOO_DEEP:
        return JSONInputError(f"the JSON nests arrays and objects deeper than {MAX_DEPTH} levels")
    if why == _jsonsplit.UNTERMINATED_STRING:
        return json.JSONDecodeError("Unterminated string starting at", text, where)
    if why == _jsonsplit.UNMATCHED:
        return json.JSONDecodeError(f"Unmatched '{text[where]}'", text, where)
    return json.JSONDecodeError(f"Unclosed '{text[where]}'", text, where)


def _surrogate_escape(text: str) -> bool:
    """Whether text holds a \\u escape of a surrogate, searched a chunk at a time (one search
    over 16 MB holds the GIL for 15 ms); chunks overlap by the escape's length less one."""
    for start in range(0, len(text), _SCAN_CHUNK):
        if _SURROGATE_ESCAPE.search(text, max(start - 3, 0), start + _SCAN_CHUNK):
            return True
        deadline.check()
    return False


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
