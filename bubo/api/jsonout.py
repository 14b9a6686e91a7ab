"""JSON answers that may be large (a 16 MB text's tokens, 2,048 embeddings, logprobs for every
token), written in slices so that no single call of the C encoder holds the GIL for long.

json.dumps of a million values takes a few hundred milliseconds in one C call, during which no
other thread runs: the event loop stops moving bytes. response() encodes a large list a slice at
a time (bubo.deadline.check() between slices: in a worker thread, the other threads run), and
gives the same bytes as Flask's jsonify (compact separators, non-ASCII text as it is, a final
newline). Run it in the preparation pool (bubo.api.offload) for an answer whose size grows with
the request.

Vectors (embeddings) go through arrays(): orjson writes a float32 vector 25 times as fast as
json's float repr, each value as the shortest text that reads back as the same float32 (half the
bytes of the float64 repr of the same value).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import orjson
from flask import Response

from bubo import deadline
from bubo.api import offload

SLICE_VALUES = 16384  # values encoded in one call of the C encoder (a few milliseconds)
CHUNK_BYTES = 256 * 1024  # the body's pieces
_SMALL_LIST = 256  # a list this short whose items are small is encoded in one call
_SAMPLES = 8  # items of a long list looked at to judge the size of its items


def response(value: Any, status: int = 200, small: bool = False) -> Response:
    """A JSON response holding value, encoded in slices; small: the caller knows value holds
    far fewer than SLICE_VALUES values (built()'s small), encoded in one call without counting them."""
    return _response(_chunks(value, small), status)


def _chunks(value: Any, small: bool = False) -> list[bytes]:
    write = _whole if small else _encode
    try:
        return write(value, ascii=False)
    except UnicodeEncodeError:  # a lone surrogate quoted from a request: escaped instead
        return write(value, ascii=True)


def _whole(value: Any, ascii: bool) -> list[bytes]:
    return [(_dumps(value, ascii) + "\n").encode("utf-8")]


def encode(value: Any) -> bytes:
    """A small value's JSON as response() writes it (Flask's jsonify's bytes), in one piece: a
    value of texts, integers, booleans and nulls, which orjson writes as json does (it writes a
    float in another form: 1e-07 as 1e-7)."""
    try:
        return orjson.dumps(value, option=orjson.OPT_APPEND_NEWLINE)
    except orjson.JSONEncodeError:  # a lone surrogate, an integer past 64 bits
        return b"".join(_chunks(value))


def _response(chunks: list[bytes], status: int) -> Response:
    # the body stays in chunks (joined, 100 MB would be one more long call); its length is known
    resp = Response(chunks, status=status, mimetype="application/json")
    resp.headers["Content-Length"] = str(sum(len(c) for c in chunks))
    return resp


def _encode(value: Any, ascii: bool) -> list[bytes]:
    out: list[str] = []
    _parts(value, out, ascii)
    out.append("\n")
    return _chunked(out)


def _chunked(parts: list[str]) -> list[bytes]:
    """The parts as UTF-8, joined into chunks of about CHUNK_BYTES characters."""
    chunks: list[bytes] = []
    group: list[str] = []
    size = 0
    for p in parts:
        group.append(p)
        size += len(p)
        if size >= CHUNK_BYTES:
            chunks.append("".join(group).encode("utf-8"))
            group, size = [], 0
            deadline.check()
    if group:
        chunks.append("".join(group).encode("utf-8"))
    return chunks


def listing(head: dict[str, Any], key: str, n: int, items: Callable[[int, int], list[Any]]) -> Response:
    """The response {**head, key: [item 0, ..., item n-1]}, the list made and encoded a slice at
    a time by items(start, stop): millions of items are never all alive at once (building them,
    and freeing them again, would each be one long hold of the GIL)."""
    out = [_dumps(head, False)[:-1] + ("," if head else "") + _dumps(key, False) + ":["]
    step = 4096
    for start in range(0, n, step):
        if start:
            out.append(",")
        out.append(_dumps(items(start, min(start + step, n)), False)[1:-1])
        deadline.check()
    out.append("]}\n")
    return _response(_chunked(out), 200)


def arrays(head: dict[str, Any] | None, key: str, items: Sequence[Any] | np.ndarray,
           values_per_item: int) -> Response:
    """The response {**head, key: items}, or the list items itself where head is None, whose
    items hold numpy float32 vectors (a vector, or dicts and lists around them): written by
    orjson, a slice of about SLICE_VALUES values per call (a NaN or an infinity as null, which
    JSON has no number for). The head's text is escaped to ASCII (a lone surrogate cannot fail)."""
    return _response(_array_chunks(head, key, items, values_per_item), 200)


def array_bytes(head: dict[str, Any] | None, key: str, items: Sequence[Any] | np.ndarray,
                values_per_item: int) -> bytes:
    """arrays()'s body, in one piece: for a few items."""
    return b"".join(_array_chunks(head, key, items, values_per_item))


def _array_chunks(head: dict[str, Any] | None, key: str, items: Sequence[Any] | np.ndarray,
                  values_per_item: int) -> list[bytes]:
    out = ["[" if head is None else _dumps(head, True)[:-1] + ("," if head else "") + _dumps(key, True) + ":["]
    step = max(1, SLICE_VALUES // max(1, values_per_item))
    for start in range(0, len(items), step):
        if start:
            out.append(",")
        out.append(orjson.dumps(items[start:start + step], option=orjson.OPT_SERIALIZE_NUMPY)[1:-1].decode())
        deadline.check()
    out.append("]\n" if head is None else "]}\n")
    return _chunked(out)


def _dumps(value: Any, ascii: bool) -> str:
    return _ENCODERS[ascii].encode(value)


# json.dumps with arguments makes an encoder per call: a third of a small value's time
_ENCODERS = {a: json.JSONEncoder(ensure_ascii=a, separators=(",", ":")) for a in (False, True)}


def _size(value: Any, cap: int) -> int:
    """The values in value (containers and scalars), counted up to cap."""
    if isinstance(value, dict):
        items: Any = value.values()
    elif isinstance(value, list):
        items = value
    else:
        return 1
    n = 1
    for x in items:
        n += _size(x, cap - n)
        if n >= cap:
            return cap
    return n


def _parts(value: Any, out: list[str], ascii: bool) -> None:
    if isinstance(value, list) and (len(value) > _SMALL_LIST or _size(value, SLICE_VALUES) >= SLICE_VALUES):
        each = max(_size(value[i], SLICE_VALUES) for i in range(0, len(value), max(1, len(value) // _SAMPLES)))
        out.append("[")
        if each * 16 <= SLICE_VALUES:  # small items (numbers, short objects): slices of many
            per = SLICE_VALUES // each
            for i in range(0, len(value), per):
                if i:
                    out.append(",")
                out.append(_dumps(value[i:i + per], ascii)[1:-1])
                deadline.check()
        else:
            for i, x in enumerate(value):
                if i:
                    out.append(",")
                _parts(x, out, ascii)
        out.append("]")
    elif isinstance(value, dict) and _size(value, SLICE_VALUES) >= SLICE_VALUES:
        out.append("{")
        for i, (k, x) in enumerate(value.items()):
            if i:
                out.append(",")
            out.append(_dumps(str(k), ascii) + ":")
            _parts(x, out, ascii)
        out.append("}")
    else:
        out.append(_dumps(value, ascii))
        deadline.check()


def built(fn: Callable[..., Any], *args: Any, what: str = "writing the answer", small: bool = False,
          **kwargs: Any) -> Response:
    """The JSON response of fn(*args, **kwargs), both built in the preparation pool
    (bubo.api.offload): for an answer whose size grows with the request; small: the caller knows
    it is small (offload.small_n of its tokens and values): built on the event loop."""
    return _written(lambda: response(fn(*args, **kwargs), small=small), what, small)


def built_arrays(head: dict[str, Any] | None, key: str, n_items: int, values_per_item: int,
                 items: Callable[[], Sequence[Any] | np.ndarray]) -> Response:
    """arrays(head, key, items(), values_per_item) of n_items items, the items made (base64
    included) and written on the event loop when they are one slice of values, in the
    preparation pool past that."""
    return _written(lambda: arrays(head, key, items(), values_per_item), "writing the answer",
                    n_items * values_per_item <= SLICE_VALUES)


def _written(job: Callable[[], Response], what: str, small: bool) -> Response:
    out: Response = offload.run(job, what=what, answer=True, small=small)
    return out
