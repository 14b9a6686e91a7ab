"""JSON Schema to GBNF: the grammar of a subset of the schema's valid instances.

The promise is one-sided and strict: every text the grammar accepts parses as JSON and validates
against the schema. The grammar may generate fewer instances than the schema allows (listed
properties only, integers without fractions, bounded digit counts, ASCII for \\w), never more. A
keyword whose constraint cannot be enforced raises SchemaError naming its JSON pointer; it is
never dropped silently. Annotations (title, description, default, examples...) are ignored, and
so is a keyword whose value constrains nothing: one that, dropped, lets no invalid instance
through (uniqueItems false, minItems 0, not false, an anyOf with a true branch, a keyword of
another type than the schema's, ...; see _Converter.noop).

Decisions:
- additionalProperties absent or true: only the listed properties are generated (each output is
  still valid; arbitrary extra keys only let a model ramble). An object schema without
  properties is any JSON object; additionalProperties given as a schema is a map (string keys,
  values of that schema) when no properties are listed.
- Nullable types are type arrays (["string", "null"]); OpenAPI's `nullable` is not JSON Schema
  (validators ignore it), so it is treated as an annotation and null is not generated for it.
- Optional properties keep declaration order, each may be absent; one whose schema is false is
  never generated.
- Whitespace between tokens is bounded (" " or a newline and up to 20 spaces/tabs) so a model
  cannot loop on it; leading whitespace before the value is not allowed.
- oneOf is enforced only when its branches provably cannot both match (disjoint types or a
  required discriminator property with disjoint const/enum values); otherwise it is refused:
  anyOf would let an instance match two branches.
- format is an assertion for the formats JSON Schema defines (a validator that checks formats
  checks them): each is enforced by a grammar of its syntax or of a plain subset of it (FORMATS:
  hostnames of letter-led labels, IPv6 literals in URIs in full form, ...), except regex and
  draft 3's color, style, phone and utc-millisec, which are refused. Any other value (OpenAPI's
  password, binary, int32...) is no format JSON Schema defines: no JSON Schema validator can
  check it, so it constrains nothing and is an annotation, as `nullable` is.
- multipleOf a divisor of 1 (1, 0.5, 0.25...) is enforced by generating integers only (each is a
  multiple); other values are refused.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable
from fractions import Fraction
from typing import Any

from bubo import deadline

__all__ = ["SchemaError", "schema_to_gbnf", "JSON_OBJECT_GBNF", "MAX_DIGITS"]

MAX_DIGITS = 15  # integral and fractional digits of an unbounded number (a float's precision)
# What one schema may expand to: the grammar's text (an enum of 100,000 values is about 2 MB) and
# its rules; past either, SchemaError at "/" (the conversion stops there, its cost bounded by them).
MAX_GRAMMAR_BYTES = 8 * 1024 * 1024
MAX_RULES = 100_000
# characters of a "pattern": Python's re.compile (which checks it) walks every code point of a
# character range, one C call that no deadline stops (1.6 ms for each [ -\uffff], 5 ms with (?i))
MAX_PATTERN_CHARS = 1024
WS_RULE = '| " " | "\\n" [ \\t]{0,20}'

# JSON-string content: any char but '"', '\\' and control chars, or an escape. \u escapes of
# UTF-16 surrogates are left out so that one unit is always exactly one character (minLength).
CHAR_RULE = ('[^"\\\\\\x7F\\x00-\\x1F] | "\\\\" (["\\\\/bfnrt] | "u" ([0-9a-cA-CefEF] [0-9a-fA-F]{3} '
             '| [dD] [0-7] [0-9a-fA-F]{2}))')

PRIMITIVES = {
    "ws": WS_RULE,
    "char": CHAR_RULE,
    "string": '"\\"" char* "\\"" ws',
    "boolean": '("true" | "false") ws',
    "null": '"null" ws',
    "integral": '"0" | [1-9] [0-9]{0,' + str(MAX_DIGITS - 1) + '}',
    "integer": '"-"? integral ws',
    "number": '"-"? integral ("." [0-9]{1,' + str(MAX_DIGITS) + '})? ([eE] [-+]? [0-9]{1,3})? ws',
    "value": "object | array | string | number | boolean | null",
    "object": '"{" ws (string ":" ws value ("," ws string ":" ws value)*)? "}" ws',
    "array": '"[" ws (value ("," ws value)*)? "]" ws',
}
PRIMITIVE_DEPS = {
    "string": ["char", "ws"], "boolean": ["ws"], "null": ["ws"], "integer": ["integral", "ws"],
    "number": ["integral", "ws"], "object": ["string", "value", "ws"], "array": ["value", "ws"],
    "value": ["object", "array", "string", "number", "boolean", "null"],
}


def _ipv6() -> str:
    """RFC 3986's IPv6address: six groups and ls32, or at most seven groups around one "::"."""
    h, ls32 = "format-h16", "format-ls32"
    alts = [f'({h} ":"){{6}} {ls32}']
    tails = [f'({h} ":"){{{n}}} {ls32}' for n in (5, 4, 3, 2)] + [f'{h} ":" {ls32}', ls32, h, ""]
    for before, tail in enumerate(tails):  # at most `before` groups ahead of "::"
        head = "" if before == 0 else f"{h}?" if before == 1 else f'(({h} ":"){{0,{before - 1}}} {h})?'
        alts.append(f'{head} "::" {tail}'.strip())
    return " | ".join(f"({a})" for a in alts)


# 2 digits 00-99 of a year divisible by 4, for 29 February
_LEAP = ('[0-9] [0-9] ("0" [48] | [2468] [048] | [13579] [26]) | ("0" [48] | [2468] [048] | [13579] [26]) "00"')
# years 0001-9999: RFC 3339 allows 0000, but validators (Python's date among them) do not
_YEAR = '([1-9] [0-9]{3} | "0" [1-9] [0-9]{2} | "00" [1-9] [0-9] | "000" [1-9])'
FORMATS = {
    "date": (_YEAR + ' "-" (("0" [13578] | "1" [02]) "-" ("0" [1-9] | [12] [0-9] | "3" [01]) '
             '| ("0" [469] | "11") "-" ("0" [1-9] | [12] [0-9] | "30") '
             '| "02-" ("0" [1-9] | "1" [0-9] | "2" [0-8])) | (' + _LEAP + ') "-02-29"'),
    "time": ('([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ("." [0-9]{1,6})? '
             '("Z" | [+-] ([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9])'),
    "date-time": 'format-date "T" format-time',
    "uuid": '[0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{12}',
    "email": ('[a-zA-Z0-9_%+-]{1,32} ("." [a-zA-Z0-9_%+-]{1,32}){0,3} "@" '
              '[a-zA-Z0-9] [a-zA-Z0-9-]{0,30} ("." [a-zA-Z0-9] [a-zA-Z0-9-]{0,30}){0,3} "." [a-zA-Z]{2,10}'),
    "idn-email": "format-email",  # ASCII addresses are internationalized ones too
    # RFC 1123 names of 1-4 labels (at most 243 characters), each led by a letter (a top-level
    # label is never all digits) with single hyphens inside (IDNA refuses "--" at 3-4)
    "hostname": 'format-label ("." format-label){0,3}',
    "idn-hostname": "format-hostname",
    "ipv4": 'format-octet ("." format-octet){3}',
    "ipv6": _ipv6(),
    # RFC 3339 appendix A (ISO 8601 durations)
    "duration": '"P" (format-dur-date | format-dur-time | format-dur-n "W")',
    # RFC 3986 (an IP literal host in full form only); ASCII URIs are IRIs too
    "uri": '[a-zA-Z] [a-zA-Z0-9+.-]* ":" format-uri-hier? format-uri-tail',
    "uri-reference": 'format-uri | (format-uri-rooted | (format-uri-char | "@")+ format-uri-path)? format-uri-tail',
    "iri": "format-uri",
    "iri-reference": "format-uri-reference",
    # RFC 6570 with variable names of name characters only and prefixes below 1000 (validators
    # refuse dotted or %-escaped names and longer prefixes)
    "uri-template": '(format-ut-literal | "{" [+#./;?&]? format-ut-var ("," format-ut-var)* "}")*',
    # RFC 6901; relative: draft-bhutton-relative-json-pointer without index manipulation, and no
    # digit after a 0 (jsonschema's check refuses 100)
    "json-pointer": '("/" (format-jp-char | "~" [01])*)*',
    "relative-json-pointer": '("0" | [1-9]{1,9} "0"?) ("#" | format-json-pointer)',
    "ip-address": "format-ipv4",  # draft 3's names
    "host-name": "format-hostname",
}
# formats JSON Schema defines (up to 2020-12, draft 3's included) that no grammar here enforces:
# refused; any other format that FORMATS lacks is no JSON Schema format, an annotation
REFUSED_FORMATS = {"regex", "color", "style", "phone", "utc-millisec"}
# rules the formats refer to (rule format-NAME)
FORMAT_PARTS = {
    "label": '[a-zA-Z] [a-zA-Z0-9]{0,19} ("-" [a-zA-Z0-9]{1,19}){0,2}',
    "octet": '"25" [0-5] | "2" [0-4] [0-9] | "1" [0-9] [0-9] | [1-9] [0-9] | [0-9]',
    "h16": "[0-9a-fA-F]{1,4}",
    "ls32": 'format-h16 ":" format-h16 | format-ipv4',
    "dur-n": "[0-9]{1,9}",
    "dur-date": '(format-dur-n "D" | format-dur-month | format-dur-n "Y" format-dur-month?) format-dur-time?',
    "dur-month": 'format-dur-n "M" (format-dur-n "D")?',
    "dur-time": ('"T" (format-dur-n "H" (format-dur-n "M" (format-dur-n "S")?)? | format-dur-n "M" (format-dur-n "S")? '
                 '| format-dur-n "S")'),
    "uri-char": "[a-zA-Z0-9._~!$&'()*+,;=-] | \"%\" [0-9a-fA-F]{2}",  # unreserved, sub-delims, %-escapes
    "uri-pchar": "format-uri-char | [:@]",
    "uri-hier": "format-uri-rooted | format-uri-pchar+ format-uri-path",
    "uri-rooted": '"//" format-uri-authority format-uri-path | "/" (format-uri-pchar+ format-uri-path)?',
    "uri-authority": ('((format-uri-char | ":")* "@")? (format-uri-char* | "[" format-h16 (":" format-h16){7} "]") '
                      '(":" [0-9]{0,5})?'),
    "uri-path": '("/" format-uri-pchar*)*',
    "uri-tail": '("?" format-uri-query)? ("#" format-uri-query)?',
    "uri-query": "(format-uri-pchar | [/?])*",
    "ut-literal": '[!#$&()*+,./0-9:;=?@A-Z\\x5B\\x5D_a-z~-] | "%" [0-9a-fA-F]{2}',
    "ut-var": '[a-zA-Z0-9_]+ (":" [1-9] [0-9]{0,2} | "*")?',
    "jp-char": "",  # set below: any JSON-string unit but "/" and "~" (charset_gbnf)
}


ANNOTATIONS = {"title", "description", "examples", "default", "$schema", "$id", "$comment", "deprecated",
               "readOnly", "writeOnly", "contentEncoding", "contentMediaType", "contentSchema", "discriminator",
               "$anchor", "$dynamicAnchor", "$recursiveAnchor", "$vocabulary", "strict", "name",
               "nullable"}  # OpenAPI's; JSON Schema validators ignore it, so null is not generated
DEFS = {"$defs", "definitions"}
TYPE_KEYWORDS = {
    "object": {"properties", "required", "additionalProperties"},
    "array": {"items", "prefixItems", "minItems", "maxItems", "additionalItems"},
    "string": {"minLength", "maxLength", "format", "pattern"},
    "number": {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"},
}
SUPPORTED = set().union(*TYPE_KEYWORDS.values()) | {"type", "enum", "const", "anyOf", "oneOf", "allOf",
                                                    "$ref"} | DEFS
# the type whose instances a keyword constrains ("number": integers too): beside a type that
# excludes it, the keyword constrains nothing
KEYWORD_TYPE = {k: t for t, kws in TYPE_KEYWORDS.items() for k in kws} | dict.fromkeys(
    ("uniqueItems", "contains", "minContains", "maxContains", "unevaluatedItems"), "array") | dict.fromkeys(
    ("minProperties", "maxProperties", "patternProperties", "propertyNames", "dependentRequired",
     "dependentSchemas", "dependencies", "unevaluatedProperties"), "object")
TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")


class SchemaError(ValueError):
    """A schema whose constraints a grammar cannot enforce; pointer: where (a JSON pointer)."""

    def __init__(self, pointer: str, reason: str):
        super().__init__(f"{pointer or '/'}: {reason}")
        self.pointer = pointer or "/"
        self.reason = reason


def _ptr(pointer: str, *keys: Any) -> str:
    for k in keys:
        pointer += "/" + str(k).replace("~", "~0").replace("/", "~1")
    return pointer


def _count_bounds(schema: dict[str, Any], ptr: str, suffix: str, what: str) -> tuple[int, int | None]:
    """(min, max) of minItems/maxItems or minLength/maxLength (suffix "Items" or "Length"): each a
    non-negative integer, max absent (None) or not below min."""
    lo_key, hi_key = "min" + suffix, "max" + suffix
    lo, hi = schema.get(lo_key, 0), schema.get(hi_key)
    for k, v in ((lo_key, lo), (hi_key, hi)):
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
            raise SchemaError(_ptr(ptr, k), "must be a non-negative integer")
    if hi is not None and hi < lo:
        raise SchemaError(_ptr(ptr, hi_key), f"{hi_key} < {lo_key} admits no {what}")
    return lo, hi


def literal(text: str) -> str:
    """A GBNF string literal matching exactly text."""
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02X}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def json_literal(value: Any) -> str:
    return literal(json.dumps(value, ensure_ascii=False, separators=(",", ":")))


# how deep literal_alternatives nests its groups before it lists what is left as it is
MAX_TRIE_DEPTH = 200


def literal_alternatives(texts: list[str]) -> str:
    """A GBNF expression matching exactly one of texts, factored into a trie (shared prefixes
    once, then a group of what follows): the matcher follows one parse per prefix instead of one
    per text, so an enum of 100,000 values is as cheap to follow as a word."""
    words = sorted(set(texts))
    if len(words) == 1:
        return literal(words[0])
    return _trie(words, 0)


def _trie(words: list[str], depth: int) -> str:
    """words sorted and distinct (one may be "")."""
    deadline.check()
    if depth > MAX_TRIE_DEPTH:
        body = " | ".join(literal(w) for w in words if w)
        return f"({body})?" if "" in words else f"({body})"
    alts = []
    rest = [w for w in words if w]
    i = 0
    while i < len(rest):
        j = i + 1
        while j < len(rest) and rest[j][0] == rest[i][0]:
            j += 1
        group = rest[i:j]
        if len(group) == 1:
            alts.append(literal(group[0]))
        else:
            prefix = os.path.commonprefix(group)
            alts.append(f"{literal(prefix)} {_trie([w[len(prefix):] for w in group], depth + 1)}")
        i = j
    body = " | ".join(alts)
    if "" in words:
        return f"({body})?"
    return body if len(alts) == 1 else f"({body})"


# --- integer ranges ------------------------------------------------------------------------


def _same_length_range(lo: str, hi: str) -> str:
    """Digit strings of one length between lo and hi inclusive (lo <= hi)."""
    if not lo:
        return ""
    if lo == hi:
        return literal(lo)
    n = len(lo) - 1
    rest = f" [0-9]{{{n}}}" if n else ""
    if lo[0] == hi[0]:
        return f'"{lo[0]}" ({_same_length_range(lo[1:], hi[1:])})'
    if lo[1:] == "0" * n and hi[1:] == "9" * n:
        return f"[{lo[0]}-{hi[0]}]{rest}"
    alts = []
    if lo[1:] == "0" * n:
        first = int(lo[0])
    else:
        alts.append(f'"{lo[0]}" ({_same_length_range(lo[1:], "9" * n)})')
        first = int(lo[0]) + 1
    last = int(hi[0]) if hi[1:] == "9" * n else int(hi[0]) - 1
    if first <= last:
        alts.append(f"[{first}-{last}]{rest}")
    if hi[1:] != "9" * n:
        alts.append(f'"{hi[0]}" ({_same_length_range("0" * n, hi[1:])})')
    return " | ".join(alts)


def natural_range(lo: int, hi: int | None) -> str:
    """Decimal naturals (no leading zeros) in [lo, hi]; hi None: up to MAX_DIGITS digits."""
    assert lo >= 0 and (hi is None or hi >= lo)
    top_len = len(str(hi)) if hi is not None else max(MAX_DIGITS, len(str(lo)))
    alts = []
    for n in range(len(str(lo)), top_len + 1):
        a = lo if n == len(str(lo)) else 10 ** (n - 1)
        b = hi if hi is not None and n == len(str(hi)) else 10 ** n - 1
        alts.append("(" + _same_length_range(str(a), str(b)) + ")")
    return " | ".join(alts)


def integer_range(lo: int | None, hi: int | None) -> str:
    alts = []
    if hi is None or hi >= 0:
        alts.append(natural_range(max(lo or 0, 0) if lo is not None else 0, hi))
    if lo is None or lo < 0:
        mag_lo = 1 if hi is None or hi >= 0 else -hi
        mag_hi = None if lo is None else -lo
        alts.append('"-" (' + natural_range(mag_lo, mag_hi) + ")")
    return " | ".join(f"({a})" for a in alts)


# --- regular expressions (the `pattern` subset) --------------------------------------------

MAX_UNICODE = 0x10FFFF
Ranges = list[tuple[int, int]]
_DIGIT = [(0x30, 0x39)]
_WORD = [(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)]
_SPACE = [(0x09, 0x0D), (0x20, 0x20)]


def _normalize(ranges: Ranges) -> Ranges:
    out: Ranges = []
    for a, b in sorted(ranges):
        if out and a <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _complement(ranges: Ranges, top: int = MAX_UNICODE) -> Ranges:
    out, at = [], 0
    for a, b in _normalize(ranges):
        if a > at:
            out.append((at, a - 1))
        at = b + 1
    if at <= top:
        out.append((at, top))
    return out


def _class_char(c: int) -> str:
    if c < 0x20 or c == 0x7F or chr(c) in "\\]^-[\"":
        return f"\\x{c:02X}" if c < 0x100 else f"\\u{c:04X}"
    return chr(c)


def charset_gbnf(ranges: Ranges) -> str:
    """GBNF for one JSON-string unit decoding to a char in ranges: raw where JSON allows a raw
    char, an escape for '"', '\\\\' and control characters."""
    ranges = _normalize(ranges)
    # surrogates are no characters of UTF-8 text
    raw = _complement(_complement(ranges) + [(0x00, 0x1F), (0x22, 0x22), (0x5C, 0x5C), (0x7F, 0x7F),
                                             (0xD800, 0xDFFF)])
    raw = [(a, b) for a, b in raw if a <= b]
    alts = []
    if raw:
        alts.append("[" + "".join(_class_char(a) if a == b else f"{_class_char(a)}-{_class_char(b)}"
                                  for a, b in raw) + "]")
    short = {0x22: '\\"', 0x5C: "\\\\", 0x08: "\\b", 0x0C: "\\f", 0x0A: "\\n", 0x0D: "\\r", 0x09: "\\t"}
    for c in [*range(0x20), 0x22, 0x5C, 0x7F]:
        if any(a <= c <= b for a, b in ranges) and (c in short or c < 0x20):
            alts.append(literal(short.get(c, f"\\u{c:04x}")))
    if not alts:
        raise ValueError("empty character class")
    return alts[0] if len(alts) == 1 else "(" + " | ".join(alts) + ")"


FORMAT_PARTS["jp-char"] = charset_gbnf(_complement([(0x2F, 0x2F), (0x7E, 0x7E)]))


_REPEAT = re.compile(r"\{(\d+)(,(\d*))?\}")


class _Regex:
    """A recursive-descent parser of the pattern subset, straight to GBNF over JSON-string units."""

    def __init__(self, pattern: str, pointer: str):
        self.s, self.i, self.pointer = pattern, 0, pointer

    def fail(self, why: str) -> SchemaError:
        return SchemaError(self.pointer, f"pattern {self.s!r} at offset {self.i}: {why}")

    def peek(self) -> str:
        return self.s[self.i] if self.i < len(self.s) else ""

    def top(self) -> str:
        """Top-level alternatives, each anchored by its own ^ and $ or padded with any chars."""
        alts = []
        while True:
            start = self.peek() == "^"
            if start:
                self.i += 1
            seq = self.sequence(top=True)
            end = self.peek() == "$"
            if end:
                self.i += 1
            body = " ".join(x for x in [("" if start else "char*"), seq, ("" if end else "char*")] if x)
            alts.append("(" + (body or '""') + ")")
            if self.peek() == "|":
                self.i += 1
                continue
            if self.i < len(self.s):
                raise self.fail("unexpected character" if self.peek() != ")" else "unbalanced ')'")
            return " | ".join(alts)

    def alternation(self) -> str:
        alts = [self.sequence()]
        while self.peek() == "|":
            self.i += 1
            alts.append(self.sequence())
        return "(" + " | ".join(a or '""' for a in alts) + ")"

    def sequence(self, top: bool = False) -> str:
        items = []
        while self.i < len(self.s) and self.peek() not in "|)":
            if self.peek() == "$":
                if top and (self.i + 1 == len(self.s) or self.s[self.i + 1] == "|"):
                    break
                raise self.fail("'$' is supported only at the end")
            if self.peek() == "^":
                raise self.fail("'^' is supported only at the start")
            items.append(self.quantified(self.atom()))
        return " ".join(items)

    def quantified(self, atom: str) -> str:
        c = self.peek()
        if c in ("*", "+", "?"):
            self.i += 1
            out = atom + c
        elif c == "{" and (m := _REPEAT.match(self.s, self.i)) is not None:
            self.i = m.end()
            lo, hi = int(m.group(1)), (m.group(3) if m.group(2) else m.group(1))
            if hi and int(hi) < lo:
                raise self.fail("{m,n} with n < m")
            out = f"{atom}{{{lo},{hi}}}" if m.group(2) else f"{atom}{{{lo}}}"
        else:
            return atom
        if self.peek() == "?":  # lazy: the same language
            self.i += 1
        if self.peek() in ("*", "+", "?") or self.s.startswith("{", self.i) and self.s[self.i + 1:self.i + 2].isdigit():
            raise self.fail("nested quantifier")
        return out

    def atom(self) -> str:
        c = self.peek()
        if c == "(":
            self.i += 1
            if self.s.startswith("?:", self.i):
                self.i += 2
            elif self.peek() == "?":
                raise self.fail("lookaround and named groups are not supported")
            inner = self.alternation()
            if self.peek() != ")":
                raise self.fail("unbalanced '('")
            self.i += 1
            return inner
        if c == "[":
            return charset_gbnf(self.char_class())
        if c == ".":
            self.i += 1
            return charset_gbnf(_complement([(0x0A, 0x0A)]))
        if c == "\\":
            return charset_gbnf(self.escape(in_class=False))
        if c in "*+?{":
            raise self.fail("quantifier without an atom")
        self.i += 1
        return charset_gbnf([(ord(c), ord(c))])

    def escape(self, in_class: bool) -> Ranges:
        self.i += 1
        c = self.peek()
        self.i += 1
        classes = {"d": _DIGIT, "w": _WORD, "s": _SPACE}
        if c in classes:
            return classes[c]
        if c in "DWS":  # Python's \D excludes non-ASCII digits too: stay inside ASCII
            return _complement(classes[c.lower()], 0x7F)
        simple = {"n": 0x0A, "t": 0x09, "r": 0x0D, "f": 0x0C, "v": 0x0B, "0": 0}
        if c in simple:
            return [(simple[c], simple[c])]
        if c in ("x", "u"):
            n = 2 if c == "x" else 4
            h = self.s[self.i:self.i + n]
            if not re.fullmatch(f"[0-9a-fA-F]{{{n}}}", h):
                raise self.fail(f"bad \\{c} escape")
            self.i += n
            return [(int(h, 16), int(h, 16))]
        if c and not c.isalnum():
            return [(ord(c), ord(c))]
        if c == "b" and in_class:
            return [(8, 8)]
        raise self.fail(f"escape \\{c} is not supported")

    def char_class(self) -> Ranges:
        self.i += 1
        negate = self.peek() == "^"
        if negate:
            self.i += 1
        ranges: Ranges = []
        shorthand = False
        first = True
        while True:
            c = self.peek()
            if not c:
                raise self.fail("unterminated '['")
            if c == "]" and not first:
                self.i += 1
                break
            first = False
            if c == "\\":
                got = self.escape(in_class=True)
                if len(got) != 1 or got[0][0] != got[0][1]:
                    ranges += got
                    shorthand = True
                    continue
                lo = got[0][0]
            elif c == "[" and self.s.startswith("[:", self.i):
                raise self.fail("POSIX classes are not supported")
            else:
                self.i += 1
                lo = ord(c)
            if self.peek() == "-" and self.i + 1 < len(self.s) and self.s[self.i + 1] != "]":
                self.i += 1
                if self.peek() == "\\":
                    got = self.escape(in_class=True)
                    if len(got) != 1 or got[0][0] != got[0][1]:
                        raise self.fail("a range ends in a class escape")
                    hi = got[0][0]
                else:
                    hi = ord(self.peek())
                    self.i += 1
                if hi < lo:
                    raise self.fail("range out of order")
                ranges.append((lo, hi))
            else:
                ranges.append((lo, lo))
        if negate:
            # [^\d] would admit non-ASCII digits that Python's re refuses: stay inside ASCII then
            return _complement(ranges, 0x7F if shorthand else MAX_UNICODE)
        return ranges


# --- the converter -------------------------------------------------------------------------


_RULE_CHARS = re.compile(r"[^a-zA-Z0-9-]+")


def _numbered(base: str, n: int) -> str:
    return base if n == 1 else f"{base}-{n}"


def _number_of(base: str, name: str) -> int | None:
    """n where name is _numbered(base, n), else None."""
    if name == base:
        return 1
    rest = name[len(base) + 1:] if name.startswith(base + "-") else ""
    return int(rest) if rest.isdigit() and rest[0] != "0" and int(rest) >= 2 else None


class _Converter:
    def __init__(self, root_schema: Any):
        self.root = root_schema
        self.rules: dict[str, str] = {}
        self.refs: dict[str, str] = {}  # "$ref" -> rule name
        self.trivial_memo: dict[int, tuple[Any, bool]] = {}  # id -> (the schema, so the id stays its own; trivial?)
        # allOf merged once per schema object (a definition used by many allOf: once): id -> (the
        # schema, its merge); $ref chains followed once per reference
        self.merged: dict[int, tuple[Any, tuple[Any, str]]] = {}
        self.derefs: dict[str, tuple[Any, str]] = {}
        # add()'s search for a rule's name, kept as indexes: each base's first free number (names
        # are never taken back, so it only grows) and the names of each body
        self.free_from: dict[str, int] = {}
        self.by_body: dict[str, set[str]] = {}
        self.size = 0  # the grammar's bytes so far
    # rules

    def use(self, name: str) -> str:
        if name in self.rules:
            return name
        if name in PRIMITIVES:
            self.rules[name] = PRIMITIVES[name]
            for dep in PRIMITIVE_DEPS.get(name, []):
                self.use(dep)
        elif name.startswith("format-"):
            key = name[len("format-"):]
            body = self.rules[name] = FORMATS[key] if key in FORMATS else FORMAT_PARTS[key]
            for dep in re.findall(r"format-[a-z0-9-]+", body):
                self.use(dep)
        return name

    def add(self, name: str, body: str) -> str:
        """A rule named after name: the first of name, name-2, name-3, ... that is free or already
        has this body (then it is that rule)."""
        base = _RULE_CHARS.sub("-", name).strip("-") or "r"
        n = self.free_from.get(base, 1)
        while self._taken(_numbered(base, n)):
            n += 1
        self.free_from[base] = n
        for other in self.by_body.get(body, ()):
            k = _number_of(base, other)
            if k is not None and k < n and other not in PRIMITIVES and not other.startswith("format-"):
                n = k
        name = _numbered(base, n)
        if name not in self.rules:
            self.set(name, body)
            self.grew(len(name) + len(body))
        return name

    def _taken(self, name: str) -> bool:
        return name in self.rules or name in PRIMITIVES or name.startswith("format-")

    def set(self, name: str, body: str) -> None:
        """Give rule name its body (a new rule's, or a reference's once its target is converted)."""
        old = self.rules.get(name)
        if old is not None:
            self.by_body[old].discard(name)
        self.rules[name] = body
        self.by_body.setdefault(body, set()).add(name)

    def grew(self, n: int) -> None:
        """n more bytes of grammar: past the limits the schema is refused (its cost is bounded)."""
        self.size += n + 6
        if self.size > MAX_GRAMMAR_BYTES or len(self.rules) > MAX_RULES:
            raise SchemaError("/", f"the schema expands to a grammar of more than {MAX_RULES:,} rules or "
                                   f"{MAX_GRAMMAR_BYTES // 2**20} MiB: simplify it (fewer alternatives or "
                                   "properties, smaller enums)")
        deadline.check()

    # keywords that constrain nothing

    def strip(self, schema: dict[str, Any]) -> dict[str, Any]:
        """schema without its keywords whose values constrain nothing (noop)."""
        drop = [k for k in schema if self.noop(k, schema)]
        return {k: v for k, v in schema.items() if k not in drop} if drop else schema

    def noop(self, key: str, schema: dict[str, Any]) -> bool:
        """Whether schema[key] constrains nothing: without it, the schema admits no instance that it
        refuses with it. Each value is judged against the schema as written (before any drop)."""
        applies_to, types = KEYWORD_TYPE.get(key), _declared(schema)
        if applies_to is not None and types is not None and not _widen({applies_to}) & _widen(types):
            return True  # no instance of the schema's types is one this keyword looks at
        rule = NOOPS.get(key)
        return rule is not None and rule(self, schema[key], schema)

    def trivial(self, schema: Any) -> bool:
        """Whether schema admits every instance: true, or annotations and no-ops only."""
        if not isinstance(schema, dict):
            return schema is True
        if id(schema) not in self.trivial_memo:
            verdict = all(_is_annotation(k) or self.noop(k, schema) for k in schema)
            self.trivial_memo[id(schema)] = (schema, verdict)
        return self.trivial_memo[id(schema)][1]

    def all_strings(self, schema: Any) -> bool:
        """Whether schema admits every string (propertyNames that constrain nothing)."""
        if not isinstance(schema, dict):
            return schema is True
        types = _declared(schema)
        if "type" in schema and (types is None or "string" not in types):
            return False
        as_string = {**schema, "type": "string"}  # the other types' keywords constrain no string
        return all(k == "type" or _is_annotation(k) or self.noop(k, as_string) for k in as_string)

    # schemas

    def visit(self, schema: Any, ptr: str, name: str) -> str:
        """A GBNF expression (usually a rule name) for the instances of schema, ending in ws."""
        deadline.check()
        if schema is True or schema == {}:
            return self.use("value")
        if schema is False:
            raise SchemaError(ptr, "false admits no instance")
        if not isinstance(schema, dict):
            raise SchemaError(ptr, f"a schema must be an object or a boolean, not {type(schema).__name__}")
        schema = self.strip(schema)
        for key in schema:
            if key == "not" and self.trivial(schema[key]):
                raise SchemaError(_ptr(ptr, key), "not of a schema that admits everything admits no instance")
            if key not in SUPPORTED and not _is_annotation(key):
                raise SchemaError(_ptr(ptr, key), f"keyword {key!r} cannot be enforced by a grammar")
        keys = {k for k in schema if k in SUPPORTED and k not in DEFS}

        if "$ref" in keys:
            if keys != {"$ref"}:
                raise SchemaError(_ptr(ptr, sorted(keys - {"$ref"})[0]), "keywords beside $ref are not supported")
            return self.ref(schema["$ref"], _ptr(ptr, "$ref"))
        if "allOf" in keys:
            return self.visit(*self.merge_all_of(schema, ptr), name)
        for key in ("anyOf", "oneOf"):
            if key in keys:
                return self.union(schema, key, ptr, name)
        if "const" in keys or "enum" in keys:
            return self.enum(schema, ptr, name)

        types = schema.get("type")
        if types is None:
            types = [t for t, kws in TYPE_KEYWORDS.items() if kws & keys] or None
            if types is None:
                return self.use("value")
        if isinstance(types, str):
            types = [types]
        if not isinstance(types, list) or not types or any(t not in TYPES for t in types):
            raise SchemaError(_ptr(ptr, "type"), f"type must be one of {', '.join(TYPES)} or an array of them")
        # keywords of the other types do not constrain these instances: nothing to enforce
        alts = [self.typed(t, schema, ptr, name if len(types) == 1 else f"{name}-{t}") for t in types]
        return alts[0] if len(alts) == 1 else self.add(name, " | ".join(alts))

    def typed(self, t: str, schema: dict[str, Any], ptr: str, name: str) -> str:
        if t == "object":
            return self.object(schema, ptr, name)
        if t == "array":
            return self.array(schema, ptr, name)
        if t == "string":
            return self.string(schema, ptr, name)
        if t in ("number", "integer"):
            return self.number(t, schema, ptr, name)
        return self.use(t)

    def ref(self, ref: Any, ptr: str) -> str:
        if not _local(ref):
            raise SchemaError(ptr, f"only local references (#/...) are supported, not {ref!r}")
        if ref in self.refs:
            return self.refs[ref]
        target = self.resolve(ref, ptr)
        name = self.add("ref-" + (ref.rsplit("/", 1)[-1] or "root"), f"pending {ref}")
        self.refs[ref] = name
        body = self.visit(target, ref[1:], name + "-body")
        self.set(name, body)
        return name

    def resolve(self, ref: str, ptr: str) -> Any:
        node = self.root
        for part in ref[1:].split("/")[1:] if ref != "#" else []:
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                raise SchemaError(ptr, f"reference {ref!r} points at nothing")
        return node

    def deref(self, schema: Any, ptr: str) -> tuple[Any, str]:
        """Where schema's $ref chain ends (schema itself when it is no bare $ref)."""
        if not (isinstance(schema, dict) and set(schema) - ANNOTATIONS == {"$ref"}):
            return schema, ptr
        first = schema["$ref"]
        if isinstance(first, str) and first in self.derefs:
            return self.derefs[first]
        seen = set()
        while isinstance(schema, dict) and set(schema) - ANNOTATIONS == {"$ref"}:
            ref = schema["$ref"]
            if not _local(ref) or ref in seen:
                raise SchemaError(_ptr(ptr, "$ref"), f"cannot resolve {ref!r}")
            seen.add(ref)
            if ref in self.derefs:
                schema, ptr = self.derefs[ref]
                break
            schema, ptr = self.resolve(ref, _ptr(ptr, "$ref")), ref[1:]
            deadline.check()
        self.derefs[first] = (schema, ptr)
        return schema, ptr

    def merge_all_of(self, schema: dict[str, Any], ptr: str) -> tuple[Any, str]:
        """allOf of object schemas as one object schema (siblings are one more branch), and where
        it is (a single branch that constrains: that branch). Once per schema object: a definition
        that many allOf name (nested, even) is merged once."""
        memo = self.merged.get(id(schema))
        if memo is not None and memo[0] is schema:
            return memo[1]
        out = self._merge_all_of(schema, ptr)
        self.merged[id(schema)] = (schema, out)
        return out

    def _merge_all_of(self, schema: dict[str, Any], ptr: str) -> tuple[Any, str]:
        deadline.check()
        branches = schema["allOf"]
        if not isinstance(branches, list) or not branches:
            raise SchemaError(_ptr(ptr, "allOf"), "must be a non-empty array")
        siblings = {k: v for k, v in schema.items() if k != "allOf"}
        # a branch that admits everything constrains nothing
        live = [(i, b) for i, b in enumerate(branches) if not self.trivial(self.deref(b, _ptr(ptr, "allOf", i))[0])]
        if all(_is_annotation(k) for k in siblings) and len(live) <= 1:
            # allOf: [one] is that one (a $ref stays one: recursion goes by rules)
            return (live[0][1], _ptr(ptr, "allOf", live[0][0])) if live else (siblings, ptr)
        parts = [(siblings, ptr)] + [self.deref(b, _ptr(ptr, "allOf", i)) for i, b in live]
        merged: dict[str, Any] = {"type": "object", "properties": {}, "required": []}
        required: set[str] = set()
        closed = None
        for part, p in parts:
            if not isinstance(part, dict):
                raise SchemaError(p, "allOf branches must be object schemas")
            part = self.strip(part)
            if "allOf" in part:
                part, p = self.merge_all_of(part, p)
            for k, v in part.items():
                if _is_annotation(k):
                    continue
                if k == "type":
                    if v != "object":
                        raise SchemaError(_ptr(p, k), "allOf is supported for object schemas only")
                elif k == "properties":
                    if not isinstance(v, dict):
                        raise SchemaError(_ptr(p, k), "must be an object")
                    for pk, pv in v.items():
                        if pk in merged["properties"] and merged["properties"][pk] != pv:
                            raise SchemaError(_ptr(p, k, pk), "allOf branches constrain this property differently")
                        merged["properties"][pk] = pv
                elif k == "required":
                    if not isinstance(v, list) or not all(isinstance(r, str) for r in v):
                        raise SchemaError(_ptr(p, k), "must be an array of strings")
                    for r in v:
                        if r not in required:
                            required.add(r)
                            merged["required"].append(r)
                elif k == "additionalProperties":
                    if v is False:
                        closed = (set(part.get("properties", {})), _ptr(p, k))
                    elif v is not True:
                        raise SchemaError(_ptr(p, k), "a schema for additionalProperties inside allOf is not supported")
                else:
                    raise SchemaError(_ptr(p, k), "allOf is supported for object schemas only")
        if closed is not None:
            extra = set(merged["properties"]) - closed[0]
            if extra:
                raise SchemaError(closed[1], f"forbids properties that other allOf branches add: {sorted(extra)}")
            merged["additionalProperties"] = False
        return merged, ptr

    def union(self, schema: dict[str, Any], key: str, ptr: str, name: str) -> str:
        branches = schema[key]
        if not isinstance(branches, list) or not branches:
            raise SchemaError(_ptr(ptr, key), "must be a non-empty array")
        rest = {k for k in schema if k != key and not _is_annotation(k)}
        if rest:
            raise SchemaError(_ptr(ptr, sorted(rest)[0]), f"keywords beside {key} are not supported")
        live = [(i, b) for i, b in enumerate(branches) if b is not False]  # false matches nothing
        if not live:
            raise SchemaError(_ptr(ptr, key), "every branch is false: admits no instance")
        if key == "oneOf" and len(live) > 1:
            self.check_disjoint(live, _ptr(ptr, key))
        alts = [self.visit(b, _ptr(ptr, key, i), f"{name}-{i}") for i, b in live]
        return alts[0] if len(alts) == 1 else self.add(name, " | ".join(alts))

    def check_disjoint(self, branches: list[tuple[int, Any]], ptr: str) -> None:
        """branches: (index, schema), none false."""
        resolved = [self.deref(b, _ptr(ptr, i))[0] for i, b in branches]
        resolved = [self.strip(s) if isinstance(s, dict) else s for s in resolved]
        # a branch's grammar generates only the types it names or implies ({"minLength": 1}:
        # strings), but it admits every type it does not exclude ({"minLength": 1} admits 5)
        generated, admitted = [_generated(s) for s in resolved], [_admitted(s) for s in resolved]
        if _apart(generated, admitted):
            return
        # same-typed values told apart by const/enum
        values = [_values(s) for s in resolved]
        if _disjoint(values):
            return
        # objects told apart by a required discriminator property
        if all(isinstance(s, dict) and _generated(s) == {"object"} for s in resolved):
            common = set.intersection(*[set(s.get("required", [])) for s in resolved])
            for prop in sorted(common):
                vals = [_values(self.deref((s.get("properties") or {}).get(prop, {}), ptr)[0]) for s in resolved]
                if _disjoint(vals):
                    return
        raise SchemaError(ptr, "oneOf branches that may match the same instance cannot be enforced "
                               "(give them disjoint types or a required const discriminator, or use anyOf)")

    def enum(self, schema: dict[str, Any], ptr: str, name: str) -> str:
        if "const" in schema:
            values, where = [schema["const"]], _ptr(ptr, "const")
            if "enum" in schema:
                if schema["const"] not in schema["enum"]:
                    raise SchemaError(where, "const is not among enum")
        else:
            values, where = schema["enum"], _ptr(ptr, "enum")
            if not isinstance(values, list) or not values:
                raise SchemaError(where, "enum must be a non-empty array")
        others = {k for k in schema if not _is_annotation(k)} - {"const", "enum", "type"}
        if others:
            raise SchemaError(_ptr(ptr, sorted(others)[0]), "keywords beside enum/const are not supported")
        if "type" in schema:
            t = schema["type"]
            allowed = {t} if isinstance(t, str) else set(t)
            if "number" in allowed:
                allowed.add("integer")
            values = [v for v in values if _json_type(v) in allowed]
            if not values:
                raise SchemaError(where, "no value matches type")
        body = literal_alternatives([json.dumps(v, ensure_ascii=False, separators=(",", ":")) for v in values])
        return self.add(name, f"({body}) {self.use('ws')}")

    def object(self, schema: dict[str, Any], ptr: str, name: str) -> str:
        props = schema.get("properties", {})
        required = schema.get("required", [])
        extra = schema.get("additionalProperties", True)
        if not isinstance(props, dict):
            raise SchemaError(_ptr(ptr, "properties"), "must be an object")
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            raise SchemaError(_ptr(ptr, "required"), "must be an array of strings")
        ws = self.use("ws")
        if not props and not required:
            if extra is False:
                return self.add(name, f'"{{" {ws} "}}" {ws}')
            if extra is True:
                return self.use("object")
            value = self.visit(extra, _ptr(ptr, "additionalProperties"), f"{name}-value")
            kv = self.add(f"{name}-kv", f'{self.use("string")} ":" {ws} {value}')
            return self.add(name, f'"{{" {ws} ({kv} ("," {ws} {kv})*)? "}}" {ws}')
        # a property whose schema is false must be absent: it is not generated (required: refused)
        wanted = set(required)
        items = [(k, v) for k, v in props.items() if v is not False or k in wanted]
        for r in dict.fromkeys(required):
            if r not in props:
                if extra is False:
                    raise SchemaError(_ptr(ptr, "required"), f"{r!r} is required but additionalProperties is false")
                items.append((r, True if extra is True else extra))
        kvs = []
        for key, sub in items:
            where = _ptr(ptr, "properties", key) if key in props else _ptr(ptr, "additionalProperties")
            value = self.visit(sub, where, f"{name}-{key}")
            kvs.append((self.add(f"{name}-{key}-kv", f'{json_literal(key)} {ws} ":" {ws} {value}'), key in wanted))

        # rest(i, first): properties i.. given whether none was written yet (no comma before);
        # built from the last property back (a recursion would be as deep as the properties)
        rest: dict[tuple[int, bool], str] = {(len(kvs), True): "", (len(kvs), False): ""}
        # (i, first) is asked for when no property before i is required; (i, not first) when i > 0
        first_required = next((i for i, (_, req) in enumerate(kvs) if req), len(kvs))
        for i in range(len(kvs) - 1, -1, -1):
            kv, req = kvs[i]
            for first in (False, True):
                if (first and i > first_required) or (not first and i == 0):
                    continue
                sep = "" if first else f'"," {ws} '
                take = f"{sep}{kv} {rest[(i + 1, False)]}".strip()
                body = take if req else f"{take} | {rest[(i + 1, first)] or chr(34) * 2}"
                rest[(i, first)] = self.add(f"{name}-rest{i}{'-first' if first else ''}", body)

        return self.add(name, f'"{{" {ws} {rest[(0, True)]} "}}" {ws}')

    def array(self, schema: dict[str, Any], ptr: str, name: str) -> str:
        ws = self.use("ws")
        prefix = schema.get("prefixItems", [])
        items = schema.get("items", True)
        items_ptr = _ptr(ptr, "items")
        if isinstance(items, list):  # draft 7 tuples
            prefix, items, items_ptr = items, schema.get("additionalItems", True), _ptr(ptr, "additionalItems")
        elif "additionalItems" in schema:
            raise SchemaError(_ptr(ptr, "additionalItems"), "additionalItems needs items as an array")
        lo, hi = _count_bounds(schema, ptr, "Items", "array")
        if not isinstance(prefix, list):
            raise SchemaError(_ptr(ptr, "prefixItems"), "must be an array")
        seq = [self.visit(s, _ptr(ptr, "prefixItems", i), f"{name}-{i}") for i, s in enumerate(prefix)]
        q = len(seq) if hi is None else min(len(seq), hi)
        seq = seq[:q]
        n_lo = max(lo - q, 0)
        n_hi = 0 if q < len(prefix) else (None if hi is None else hi - q)
        if items is False:
            if n_lo > 0:
                raise SchemaError(items_ptr, "forbids the items that minItems requires")
            n_hi = 0
        item = self.visit(items, items_ptr, f"{name}-item") if n_hi != 0 else ""
        if seq:
            body = f' "," {ws} '.join(seq)
            if item:
                body += f' ("," {ws} {item}){_rep(n_lo, n_hi)}'
            inner = body  # shorter prefixes are valid too; the longest one is enough
        elif item:
            if n_lo == 0:
                inner = f'({item} ("," {ws} {item}){_rep(0, None if n_hi is None else n_hi - 1)})?' \
                    if n_hi != 1 else f"({item})?"
            else:
                inner = f'{item} ("," {ws} {item}){_rep(n_lo - 1, None if n_hi is None else n_hi - 1)}'
        else:
            inner = ""
        return self.add(name, f'"[" {ws} {inner} "]" {ws}')

    def string(self, schema: dict[str, Any], ptr: str, name: str) -> str:
        lo, hi = _count_bounds(schema, ptr, "Length", "string")
        fmt, pattern = schema.get("format"), schema.get("pattern")
        if fmt is not None and pattern is not None:
            raise SchemaError(_ptr(ptr, "pattern"), "pattern beside format is not supported")
        ws = self.use("ws")
        if fmt is not None:
            if not isinstance(fmt, str):
                raise SchemaError(_ptr(ptr, "format"), "must be a string")
            if fmt not in FORMATS:  # one JSON Schema defines (the others constrain nothing: dropped)
                raise SchemaError(_ptr(ptr, "format"), f"format {fmt!r} cannot be enforced by a grammar "
                                                       f"(enforced: {', '.join(FORMATS)})")
            if "minLength" in schema or "maxLength" in schema:
                raise SchemaError(_ptr(ptr, "minLength" if "minLength" in schema else "maxLength"),
                                  "lengths beside format are not supported")
            return self.add(name, f'"\\"" {self.use("format-" + fmt)} "\\"" {ws}')
        if pattern is not None:
            if not isinstance(pattern, str):
                raise SchemaError(_ptr(ptr, "pattern"), "must be a string")
            if len(pattern) > MAX_PATTERN_CHARS:
                raise SchemaError(_ptr(ptr, "pattern"), f"has {len(pattern):,} characters; a pattern may have at most "
                                                        f"{MAX_PATTERN_CHARS:,}")
            if "minLength" in schema or "maxLength" in schema:
                raise SchemaError(_ptr(ptr, "minLength" if "minLength" in schema else "maxLength"),
                                  "lengths beside pattern are not supported")
            try:
                re.compile(pattern)
            except re.error as e:
                raise SchemaError(_ptr(ptr, "pattern"), f"not a valid regular expression: {e}") from None
            self.use("char")
            body = _Regex(pattern, _ptr(ptr, "pattern")).top()
            return self.add(name, f'"\\"" ({body}) "\\"" {ws}')
        if lo == 0 and hi is None:
            return self.use("string")
        return self.add(name, f'"\\"" {self.use("char")}{_rep(lo, hi)} "\\"" {ws}')

    def number(self, t: str, schema: dict[str, Any], ptr: str, name: str) -> str:
        if "multipleOf" in schema:
            _check_divides_one(schema["multipleOf"], _ptr(ptr, "multipleOf"))
            t = "integer"  # each integer is a multiple of a divisor of 1
        lo, lo_x, hi, hi_x = _bounds(schema, ptr)
        if lo is None and hi is None:
            return self.use(t)
        if lo is not None and hi is not None and (lo > hi or lo == hi and (lo_x or hi_x)):
            raise SchemaError(ptr, "the bounds admit no number")
        ws = self.use("ws")
        if t == "integer":
            ilo = None if lo is None else (math.floor(lo) + 1 if lo_x and lo == math.floor(lo) else math.ceil(lo))
            ihi = None if hi is None else (math.ceil(hi) - 1 if hi_x and hi == math.ceil(hi) else math.floor(hi))
            if ilo is not None and ihi is not None and ilo > ihi:
                raise SchemaError(ptr, "the bounds admit no integer")
            return self.add(name, f"({integer_range(ilo, ihi)}) {ws}")
        for k, v in (("minimum", lo), ("maximum", hi)):
            if v is not None and v != math.floor(v):
                raise SchemaError(_ptr(ptr, k), "only integral bounds are enforced on a number")
        return self.add(name, f"({number_range(lo, lo_x, hi, hi_x)}) {ws}")


def _finite(v: Any) -> bool:
    """A JSON number that is finite as a float (an integer past 1.8e308 is not: math.isfinite
    would raise OverflowError for it)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:
        return False


def _bounds(schema: dict[str, Any], ptr: str) -> tuple[Any, bool, Any, bool]:
    """(lower, exclusive?, upper, exclusive?) from draft 4 (boolean exclusive*) or later forms."""
    def num(k: str) -> Any:
        v = schema.get(k)
        if v is not None and not _finite(v):
            raise SchemaError(_ptr(ptr, k), "must be a finite number")
        return v

    lo, lo_x, hi, hi_x = num("minimum"), False, num("maximum"), False
    for side, k in (("lo", "exclusiveMinimum"), ("hi", "exclusiveMaximum")):
        v = schema.get(k)
        if v is None or v is False:
            continue
        if v is True:
            if (lo if side == "lo" else hi) is None:
                raise SchemaError(_ptr(ptr, k), "true needs the matching minimum/maximum")
            lo_x, hi_x = (True, hi_x) if side == "lo" else (lo_x, True)
            continue
        v = num(k)
        if side == "lo" and (lo is None or v >= lo):
            lo, lo_x = v, True
        elif side == "hi" and (hi is None or v <= hi):
            hi, hi_x = v, True
    return lo, lo_x, hi, hi_x


def _nonneg_range(lo: int, lo_x: bool, hi: int | None, hi_x: bool) -> str:
    """Non-negative decimals x (integral part, optional fraction, no exponent) with lo <(=) x <(=) hi,
    lo and hi integers."""
    frac = f'("." [0-9]{{1,{MAX_DIGITS}}})?'
    nonzero_frac = f'"." "0"{{0,{MAX_DIGITS - 1}}} [1-9] [0-9]{{0,{MAX_DIGITS - 1}}}'
    zero_frac = f'("." "0"{{1,{MAX_DIGITS}}})?'
    alts = []
    a = lo + 1 if lo_x else lo  # integral parts taking any fraction
    b = None if hi is None else hi - 1
    if b is None or a <= b:
        alts.append(f"({natural_range(a, b)}) {frac}")
    if lo_x and (hi is None or lo < hi):
        alts.append(f"({natural_range(lo, lo)}) {nonzero_frac}")
    if hi is not None and not hi_x and hi >= a:
        alts.append(f"({natural_range(hi, hi)}) {zero_frac}")
    assert alts, "empty ranges are refused before (SchemaError: the bounds admit no number)"
    return " | ".join(f"({x})" for x in alts)


def number_range(lo: Any, lo_x: bool, hi: Any, hi_x: bool) -> str:
    alts = []
    lo = None if lo is None else int(lo)
    hi = None if hi is None else int(hi)
    if hi is None or hi > 0 or hi == 0 and not hi_x:
        if lo is None or lo < 0:
            alts.append(_nonneg_range(0, False, hi, hi_x))
        else:
            alts.append(_nonneg_range(lo, lo_x, hi, hi_x))
    if lo is None or lo < 0:
        # x = -m, m > 0; m < -lo (or <=), m > -hi when hi < 0
        if hi is None or hi >= 0:
            m_lo, m_lo_x = 0, True
        else:
            m_lo, m_lo_x = -hi, hi_x
        alts.append('"-" (' + _nonneg_range(m_lo, m_lo_x, None if lo is None else -lo, lo_x) + ")")
    return " | ".join(f"({a})" for a in alts)


def _rep(lo: int, hi: int | None) -> str:
    if hi is None:
        return "*" if lo == 0 else ("+" if lo == 1 else f"{{{lo},}}")
    if lo == hi:
        return f"{{{lo}}}"
    return "?" if (lo, hi) == (0, 1) else f"{{{lo},{hi}}}"


def _json_type(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int) or isinstance(v, float) and v.is_integer():
        return "integer"
    if isinstance(v, float):
        return "number"
    names: dict[type, str] = {str: "string", list: "array", dict: "object"}
    return names[type(v)]


def _disjoint(sets: list[set[str] | None]) -> bool:
    """Every set known (not None) and no two of them share an element."""
    seen: set[str] = set()
    for s in sets:
        if s is None or not seen.isdisjoint(s):
            return False
        seen |= s
    return True


def _values(s: Any) -> set[str] | None:
    if not isinstance(s, dict):
        return None
    if "const" in s:
        return {json.dumps(s["const"], sort_keys=True)}
    if isinstance(s.get("enum"), list):
        return {json.dumps(v, sort_keys=True) for v in s["enum"]}
    return None


def _check_divides_one(v: Any, ptr: str) -> None:
    """multipleOf v is enforced when every integer is a multiple: v = 1/n (n a power of two, as
    binary floating point divides exactly; 0.1 is no such number)."""
    if not _finite(v) or v <= 0:
        raise SchemaError(ptr, "must be a positive number")
    f = Fraction(v)
    if f.numerator != 1 or f.denominator > 2 ** 64:
        raise SchemaError(ptr, f"multipleOf {v} cannot be enforced by a grammar (a divisor of 1 can: 1, 0.5, 0.25...)")


def _local(ref: Any) -> bool:
    """A reference to a JSON pointer in this document ("#foo", an anchor, is not followed)."""
    return isinstance(ref, str) and (ref == "#" or ref.startswith("#/"))


def _is_annotation(key: str) -> bool:
    return key in ANNOTATIONS or key in DEFS or key.startswith("x-")


def _declared(s: dict[str, Any]) -> set[str] | None:
    """The types s names in `type` (None: none, or not valid)."""
    t = s.get("type")
    ts = [t] if isinstance(t, str) else t
    if isinstance(ts, list) and ts and all(isinstance(x, str) and x in TYPES for x in ts):
        return set(ts)
    return None


def _widen(types: set[str]) -> set[str]:
    """An integer is a number: the types whose instances types admits."""
    return types | {"integer"} if "number" in types else types


def _admitted(s: Any) -> set[str] | None:
    """The types of the instances s may admit (None: any)."""
    if s is False:
        return set()
    if not isinstance(s, dict):
        return None
    if "type" in s:
        return _declared(s)
    if "const" in s:
        return {_json_type(s["const"])}
    if isinstance(s.get("enum"), list):
        return {_json_type(v) for v in s["enum"]}
    return None


def _generated(s: Any) -> set[str] | None:
    """The types of the instances s's grammar generates (None: not known): those it admits, or
    those its keywords imply."""
    known = _admitted(s)
    if known is not None or not isinstance(s, dict) or {"anyOf", "oneOf", "allOf", "$ref"} & set(s):
        return known
    return {t for t, kws in TYPE_KEYWORDS.items() if kws & set(s)} or None


def _apart(generated: list[set[str] | None], admitted: list[set[str] | None]) -> bool:
    """No branch generates an instance of a type that another branch admits."""
    gen, adm = [g for g in generated if g is not None], [a for a in admitted if a is not None]
    if len(gen) < len(generated) or len(adm) < len(admitted):
        return False
    # how many branches admit each type: branch i generates t apart from the others when no
    # branch but i itself admits t (a handful of types: linear in the branches)
    admitting: dict[str, int] = {}
    wide_adm = [_widen(a) for a in adm]
    for a in wide_adm:
        for t in a:
            admitting[t] = admitting.get(t, 0) + 1
    return all(admitting.get(t, 0) - (t in wide_adm[i]) == 0 for i, g in enumerate(gen) for t in _widen(g))


# --- keyword values that constrain nothing (_Converter.noop) ----------------------------------

Noop = Callable[[_Converter, Any, dict[str, Any]], bool]


def _nat(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _required(s: dict[str, Any]) -> set[str]:
    r = s.get("required")
    return {x for x in r if isinstance(x, str)} if isinstance(r, list) else set()


def _may_have(s: dict[str, Any], key: str) -> bool:
    """Whether an instance of s may have property key."""
    props = s.get("properties")
    props = props if isinstance(props, dict) else {}
    if props.get(key) is False:
        return False
    return key in props or s.get("additionalProperties") is not False or bool(s.get("patternProperties"))


def _compiles(pattern: Any) -> bool:
    """A valid regular expression of at most MAX_PATTERN_CHARS (a longer one: not looked at)."""
    if isinstance(pattern, str) and len(pattern) > MAX_PATTERN_CHARS:
        return False
    try:
        re.compile(pattern)
    except (re.error, TypeError):
        return False
    return True


def _noop_min_properties(c: _Converter, v: Any, s: dict[str, Any]) -> bool:
    return _nat(v) and v <= len(_required(s))  # the required properties are that many


def _noop_max_properties(c: _Converter, v: Any, s: dict[str, Any]) -> bool:
    # additionalProperties false: no instance has more properties than are listed
    props = s.get("properties", {})
    closed = s.get("additionalProperties") is False and not s.get("patternProperties")
    return _nat(v) and closed and isinstance(props, dict) and len(props) <= v


def _noop_unique_items(c: _Converter, v: Any, s: dict[str, Any]) -> bool:
    # an array of at most one item has no two equal items
    return v is False or v is True and _nat(s.get("maxItems")) and s["maxItems"] <= 1


def _noop_contains(c: _Converter, v: Any, s: dict[str, Any]) -> bool:
    # minContains 0: every array holds, unless maxContains bounds the matches
    return _nat(s.get("minContains")) and s["minContains"] == 0 and "maxContains" not in s


def _noop_min_contains(c: _Converter, v: Any, s: dict[str, Any]) -> bool:
    return "contains" not in s or _noop_contains(c, s["contains"], s)  # without contains, ignored


def _noop_additional_items(c: _Converter, v: Any, s: dict[str, Any]) -> bool:
    # ignored unless items is an array (draft 2019-09 and before; 2020-12 has no such keyword)
    return c.trivial(v) or not isinstance(s.get("items"), list)


def _noop_unevaluated_items(c: _Converter, v: Any, s: dict[str, Any]) -> bool:
    # items (a schema) or additionalItems beside array items evaluate every item
    items = s.get("items")
    return c.trivial(v) or "items" in s and (not isinstance(items, list) or "additionalItems" in s)


def _noop_unevaluated_properties(c: _Converter, v: Any, s: dict[str, Any]) -> bool:
    return c.trivial(v) or "additionalProperties" in s  # it evaluates every property


def _noop_pattern_properties(c: _Converter, v: Any, s: dict[str, Any]) -> bool:
    # schemas that admit everything only take names away from additionalProperties
    return isinstance(v, dict) and all(_compiles(k) and c.trivial(x) for k, x in v.items())


def _noop_dependent_required(c: _Converter, v: Any, s: dict[str, Any]) -> bool:
    # each name required anyway, or the property that would require them never there
    req = _required(s)
    return isinstance(v, dict) and all(
        isinstance(names, list) and all(isinstance(n, str) for n in names)
        and (set(names) <= req | {key} or not _may_have(s, key)) for key, names in v.items())


def _noop_dependent_schemas(c: _Converter, v: Any, s: dict[str, Any]) -> bool:
    return isinstance(v, dict) and all(c.trivial(x) or not _may_have(s, key) for key, x in v.items())


def _noop_dependencies(c: _Converter, v: Any, s: dict[str, Any]) -> bool:
    # draft 4-7: an array as dependentRequired, a schema as dependentSchemas
    return isinstance(v, dict) and all(
        (_noop_dependent_required if isinstance(x, list) else _noop_dependent_schemas)(c, {key: x}, s)
        for key, x in v.items())


def _noop_not(c: _Converter, v: Any, s: dict[str, Any]) -> bool:
    # not false; or not a schema of other types than this one's (not {} admits nothing: refused)
    types, other = _declared(s), _admitted(v)
    return v is False or types is not None and other is not None and not _widen(types) & _widen(other)


def _noop_conditional(c: _Converter, v: Any, s: dict[str, Any]) -> bool:
    # if, then and else together: then unless if is false, else unless if is true, admit everything
    if "if" not in s:
        return True  # then and else alone are ignored
    cond = s["if"]
    then_ok = "then" not in s or cond is False or c.trivial(s["then"])
    else_ok = "else" not in s or c.trivial(cond) or c.trivial(s["else"])
    return then_ok and else_ok


def _noop_one_of(c: _Converter, v: Any, s: dict[str, Any]) -> bool:
    live = [b for b in v if b is not False] if isinstance(v, list) else []  # false matches nothing
    return len(live) == 1 and c.trivial(live[0])


NOOPS: dict[str, Noop] = {
    "minItems": lambda c, v, s: _nat(v) and v == 0,
    "minLength": lambda c, v, s: _nat(v) and v == 0,
    "minProperties": _noop_min_properties,
    "maxProperties": _noop_max_properties,
    "uniqueItems": _noop_unique_items,
    "contains": _noop_contains,
    "minContains": _noop_min_contains,
    "maxContains": lambda c, v, s: "contains" not in s,
    "items": lambda c, v, s: c.trivial(v),
    "prefixItems": lambda c, v, s: v == [],
    "additionalItems": _noop_additional_items,
    "unevaluatedItems": _noop_unevaluated_items,
    "properties": lambda c, v, s: v == {},
    "required": lambda c, v, s: v == [],
    "additionalProperties": lambda c, v, s: c.trivial(v),  # absent is true
    "unevaluatedProperties": _noop_unevaluated_properties,
    "patternProperties": _noop_pattern_properties,
    "propertyNames": lambda c, v, s: c.all_strings(v),  # property names are strings
    "dependentRequired": _noop_dependent_required,
    "dependentSchemas": _noop_dependent_schemas,
    "dependencies": _noop_dependencies,
    "not": _noop_not,
    "if": _noop_conditional,
    "then": _noop_conditional,
    "else": _noop_conditional,
    "anyOf": lambda c, v, s: isinstance(v, list) and any(c.trivial(b) for b in v),
    "oneOf": _noop_one_of,
    "allOf": lambda c, v, s: isinstance(v, list) and bool(v) and all(c.trivial(b) for b in v),
    "exclusiveMinimum": lambda c, v, s: v is False,  # draft 4's boolean form
    "exclusiveMaximum": lambda c, v, s: v is False,
    "pattern": lambda c, v, s: v == "",
    # a format JSON Schema does not define: no validator checks it (module docstring)
    "format": lambda c, v, s: isinstance(v, str) and v not in FORMATS and v not in REFUSED_FORMATS,
}


def schema_to_gbnf(schema: Any) -> str:
    """GBNF text (root rule `root`) whose sentences are JSON instances valid under schema; raises
    SchemaError (with a JSON pointer) for what a grammar cannot enforce."""
    deadline.doing("converting a JSON schema to a grammar")
    c = _Converter(schema)
    try:
        top = c.visit(schema, "", "root")
    except RecursionError:
        raise SchemaError("/", "the schema nests too deeply or refers to itself without progress "
                               "(a $ref cycle through allOf)") from None
    if top != "root":
        c.rules["root"] = top
    order = ["root"] + sorted(k for k in c.rules if k != "root")
    return "\n".join(f"{k} ::= {c.rules[k]}" for k in order) + "\n"


JSON_OBJECT_GBNF = schema_to_gbnf({"type": "object"})
