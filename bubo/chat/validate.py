"""JSON Schema validation of a parsed instance: does a tool call's arguments object follow its
tool's parameters schema?

A model that drops its template's call markers and answers with a bare
`{"name": ..., "arguments": {...}}` made a call only if the arguments validate against the
named tool's schema (bubo.chat.parsers recovers such calls); this is that check. It covers the
validation keywords of JSON Schema 2020-12 (and draft-04..07 spellings: `definitions`,
boolean exclusiveMinimum, array-form `items`) with local `$ref`s; annotations and keywords it
does not know are ignored, as a validator ignores unknown keywords. `format` is checked for
date, time, date-time, email and uuid and ignored otherwise (an annotation, as the
specification's default is): a call is recovered a little more readily than a grammar would
write it, never refused for a format this check does not know. `pattern` uses Python's re, which agrees
with ECMA 262 on the patterns schemas use.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from fractions import Fraction
from typing import Any

__all__ = ["first_error", "is_valid"]

_FORMATS: dict[str, re.Pattern[str]] = {
    "date": re.compile(r"\d{4}-\d{2}-\d{2}"),
    "time": re.compile(r"\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})"),
    "date-time": re.compile(r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})"),
    "email": re.compile(r"[^@\s]+@[^@\s]+\.[^@\s]+"),
    "uuid": re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"),
}
MAX_DEPTH = 64  # $ref hops inside one instance level: a schema that refers to itself without progress


def is_valid(instance: Any, schema: Any) -> bool:
    return first_error(instance, schema) is None


def first_error(instance: Any, schema: Any) -> str | None:
    """Why instance does not validate against schema (the first reason found), or None."""
    return _Validator(schema).check(instance, schema, "", 0)


def _type_of(x: Any) -> str:
    if x is None:
        return "null"
    if isinstance(x, bool):
        return "boolean"
    if isinstance(x, int):
        return "integer"
    if isinstance(x, float):
        return "number"
    if isinstance(x, str):
        return "string"
    if isinstance(x, list):
        return "array"
    return "object" if isinstance(x, dict) else type(x).__name__


def _has_type(x: Any, t: str) -> bool:
    actual = _type_of(x)
    if t == "number":
        return actual in ("integer", "number")
    if t == "integer":
        return actual == "integer" or (actual == "number" and math.isfinite(x) and float(x).is_integer())
    return actual == t


def _equal(a: Any, b: Any) -> bool:
    """JSON equality: 1 == 1.0, but true != 1."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    na, nb = _type_of(a) in ("integer", "number"), _type_of(b) in ("integer", "number")
    if na or nb:
        return na and nb and a == b
    return type(a) is type(b) and a == b


def _format_ok(fmt: Any, s: str) -> bool:
    pat = _FORMATS.get(fmt) if isinstance(fmt, str) else None
    if pat is None or pat.fullmatch(s) is None:
        return pat is None
    if fmt in ("date", "date-time"):
        import datetime

        try:
            datetime.date.fromisoformat(s[:10])
        except ValueError:
            return False
    if fmt in ("time", "date-time"):
        clock = s[11:] if fmt == "date-time" else s
        h, m, sec = int(clock[0:2]), int(clock[3:5]), int(clock[6:8])
        return h < 24 and m < 60 and sec < 61
    return True


class _Validator:
    def __init__(self, root: Any):
        self.root = root

    def resolve(self, ref: Any) -> Any:
        if not isinstance(ref, str) or not ref.startswith("#"):
            return True  # a remote reference cannot be followed here: it constrains nothing we know
        node = self.root
        for part in ref[1:].split("/")[1:] if ref not in ("#", "#/") else []:
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                return True
        return node

    def check(self, x: Any, s: Any, at: str, hops: int) -> str | None:
        if s is True or s is None:
            return None
        if s is False:
            return f"{at or '/'}: no value is allowed here"
        if not isinstance(s, dict):
            return None
        if "$ref" in s:
            if hops >= MAX_DEPTH:
                return f"{at or '/'}: the schema refers to itself without end"
            err = self.check(x, self.resolve(s["$ref"]), at, hops + 1)
            if err:
                return err
        for check in (self.generic, self.combined, self.numeric, self.textual, self.listed, self.mapped):
            err = check(x, s, at)
            if err:
                return err
        return None

    def sub(self, x: Any, s: Any, at: str) -> str | None:
        return self.check(x, s, at, 0)

    def generic(self, x: Any, s: dict[str, Any], at: str) -> str | None:
        where = at or "/"
        t = s.get("type")
        if t is not None:
            types = t if isinstance(t, list) else [t]
            if not any(isinstance(k, str) and _has_type(x, k) for k in types):
                return f"{where}: {_type_of(x)} is not of type {' or '.join(map(str, types))}"
        if "const" in s and not _equal(x, s["const"]):
            return f"{where}: must be {s['const']!r}"
        if isinstance(s.get("enum"), list) and not any(_equal(x, v) for v in s["enum"]):
            return f"{where}: must be one of {s['enum']!r}"
        return None

    def combined(self, x: Any, s: dict[str, Any], at: str) -> str | None:
        where = at or "/"
        for branch in s.get("allOf") or []:
            err = self.sub(x, branch, at)
            if err:
                return err
        if isinstance(s.get("anyOf"), list) and not any(self.sub(x, b, at) is None for b in s["anyOf"]):
            return f"{where}: matches none of anyOf"
        if isinstance(s.get("oneOf"), list) and sum(self.sub(x, b, at) is None for b in s["oneOf"]) != 1:
            return f"{where}: must match exactly one of oneOf"
        if "not" in s and self.sub(x, s["not"], at) is None:
            return f"{where}: matches the schema of not"
        if "if" in s:
            branch = s.get("then") if self.sub(x, s["if"], at) is None else s.get("else")
            if branch is not None:
                return self.sub(x, branch, at)
        return None

    def numeric(self, x: Any, s: dict[str, Any], at: str) -> str | None:
        if _type_of(x) not in ("integer", "number"):
            return None
        where = at or "/"
        tests: list[tuple[str, Callable[[Any], bool]]] = [
            ("minimum", lambda v: x >= v), ("maximum", lambda v: x <= v)]
        for key, ok in tests:
            v = s.get(key)
            if _type_of(v) in ("integer", "number") and not ok(v):
                return f"{where}: {x} breaks {key} {v}"
        for key, bound, ok in (("exclusiveMinimum", "minimum", lambda v: x > v),
                               ("exclusiveMaximum", "maximum", lambda v: x < v)):
            v = s.get(key)
            if v is True:  # draft-04: the bound of the matching keyword is exclusive
                v = s.get(bound)
            if _type_of(v) in ("integer", "number") and not ok(v):
                return f"{where}: {x} breaks {key} {v}"
        m: Any = s.get("multipleOf")
        if _type_of(m) in ("integer", "number") and m > 0:
            if isinstance(x, int) and isinstance(m, int):  # exact, however many digits
                multiple = x % m == 0
            else:
                try:
                    q = x / m
                    multiple = math.isfinite(q) and abs(q - round(q)) < 1e-9
                except OverflowError:  # an integer past a float's range: exactly, as fractions
                    multiple = (Fraction(x) / Fraction(m)).denominator == 1
            if not multiple:
                return f"{where}: {x} is not a multiple of {m}"
        return None

    def textual(self, x: Any, s: dict[str, Any], at: str) -> str | None:
        if not isinstance(x, str):
            return None
        where = at or "/"
        n = len(x)
        if isinstance(s.get("minLength"), int) and n < s["minLength"]:
            return f"{where}: shorter than {s['minLength']} characters"
        if isinstance(s.get("maxLength"), int) and n > s["maxLength"]:
            return f"{where}: longer than {s['maxLength']} characters"
        pattern = s.get("pattern")
        if isinstance(pattern, str):
            try:
                if re.search(pattern, x) is None:
                    return f"{where}: does not match {pattern!r}"
            except re.error:
                pass  # a pattern Python cannot compile: not checked here
        if "format" in s and not _format_ok(s["format"], x):
            return f"{where}: is not a valid {s['format']}"
        return None

    def listed(self, x: Any, s: dict[str, Any], at: str) -> str | None:
        if not isinstance(x, list):
            return None
        where = at or "/"
        if isinstance(s.get("minItems"), int) and len(x) < s["minItems"]:
            return f"{where}: fewer than {s['minItems']} items"
        if isinstance(s.get("maxItems"), int) and len(x) > s["maxItems"]:
            return f"{where}: more than {s['maxItems']} items"
        if s.get("uniqueItems") is True:
            for i in range(len(x)):
                if any(_equal(x[i], x[j]) for j in range(i)):
                    return f"{where}: items are not unique"
        prefix, rest = s.get("prefixItems"), s.get("items")
        if isinstance(rest, list):  # draft-04..2019: items as an array is the prefix
            prefix, rest = rest, s.get("additionalItems")
        prefix = prefix if isinstance(prefix, list) else []
        for i, item in enumerate(x):
            schema = prefix[i] if i < len(prefix) else rest
            if schema is not None:
                err = self.sub(item, schema, f"{at}/{i}")
                if err:
                    return err
        if "contains" in s:
            n = sum(self.sub(item, s["contains"], at) is None for item in x)
            lo = s.get("minContains", 1)
            if n < (lo if isinstance(lo, int) else 1):
                return f"{where}: too few items match contains"
            if isinstance(s.get("maxContains"), int) and n > s["maxContains"]:
                return f"{where}: too many items match contains"
        return None

    def mapped(self, x: Any, s: dict[str, Any], at: str) -> str | None:
        if not isinstance(x, dict):
            return None
        where = at or "/"
        for k in s.get("required") or []:
            if isinstance(k, str) and k not in x:
                return f"{where}: {k!r} is required"
        if isinstance(s.get("minProperties"), int) and len(x) < s["minProperties"]:
            return f"{where}: fewer than {s['minProperties']} properties"
        if isinstance(s.get("maxProperties"), int) and len(x) > s["maxProperties"]:
            return f"{where}: more than {s['maxProperties']} properties"
        dep = s.get("dependentRequired")
        if isinstance(dep, dict):
            for k, needs in dep.items():
                if k in x and isinstance(needs, list) and any(n not in x for n in needs):
                    return f"{where}: {k!r} needs {needs!r}"
        props: dict[str, Any] = s["properties"] if isinstance(s.get("properties"), dict) else {}
        patterns: dict[str, Any] = s["patternProperties"] if isinstance(s.get("patternProperties"), dict) else {}
        for k, v in x.items():
            here = f"{at}/{k}"
            matched = False
            if k in props:
                matched = True
                err = self.sub(v, props[k], here)
                if err:
                    return err
            for pat, ps in patterns.items():
                try:
                    hit = re.search(pat, k) is not None
                except re.error:
                    continue
                if hit:
                    matched = True
                    err = self.sub(v, ps, here)
                    if err:
                        return err
            if not matched and "additionalProperties" in s:
                if s["additionalProperties"] is False:
                    return f"{where}: {k!r} is not an allowed property"
                err = self.sub(v, s["additionalProperties"], here)
                if err:
                    return err
            if "propertyNames" in s:
                err = self.sub(k, s["propertyNames"], here)
                if err:
                    return err
        return None
