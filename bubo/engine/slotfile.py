"""Slot files: a KV sequence's tokens and their K and V rows in a file (the server's slot actions
and context snapshots, and the library's Context.save / Model.load_context).

    BUBOSLOT | version (u32 LE) | header length (u32 LE) | header (UTF-8 JSON) | tokens (i32 LE) | rows

The header names the model (its file's sha256) and the cache's layout (block size, K and V
types, bytes of the rows), the token count, and the sha256 of tokens and rows together. A file
is read back only when every part checks out: a file of another model or cache layout, one
truncated anywhere, or one with any byte changed is refused with a SlotFileError naming what is
wrong, before anything reaches the cache. A file is written under a temporary name in the same
folder, flushed, then renamed: a crash leaves the old file or the new one, never half of one."""

from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

MAGIC = b"BUBOSLOT"
VERSION = 1
MAX_HEADER_BYTES = 64 * 1024
_PREFIX = struct.Struct("<8sII")
T = TypeVar("T")


class SlotFileError(ValueError):
    """A slot file that cannot be used (missing: there is none of that name)."""

    def __init__(self, message: str, missing: bool = False):
        super().__init__(message)
        self.missing = missing


@dataclass(frozen=True)
class Layout:
    """What must agree between a slot file and the cache it goes into."""

    model_sha256: str
    block_size: int
    type_k: str
    type_v: str


def _digest(tokens: bytes, rows: bytes) -> str:
    h = hashlib.sha256(tokens)
    h.update(rows)
    return h.hexdigest()


def write(path: Path, layout: Layout, tokens: list[int], rows: bytes) -> int:
    """Write the file (temporary name, flush, rename); returns its size in bytes."""
    tok = struct.pack(f"<{len(tokens)}i", *tokens)
    header = json.dumps({"model_sha256": layout.model_sha256, "block_size": layout.block_size,
                         "type_k": layout.type_k, "type_v": layout.type_v, "n_tokens": len(tokens),
                         "rows_bytes": len(rows), "sha256": _digest(tok, rows)}).encode()
    # a name of its own in the same folder (two saves of one file at once each write their own),
    # renamed over the file when whole
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    tmp = Path(name)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(_PREFIX.pack(MAGIC, VERSION, len(header)))
            f.write(header)
            f.write(tok)
            f.write(rows)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return _PREFIX.size + len(header) + len(tok) + len(rows)


def read(path: Path, layout: Layout, rows_bytes: Callable[[int], int], max_tokens: int) -> tuple[list[int], bytes, int]:
    """(tokens, rows, bytes read) of a file that checks out for this layout; rows_bytes(n): the
    bytes n tokens' rows take in this cache; max_tokens: the most the cache holds."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            data = f.read(size + 1)
    except FileNotFoundError:
        raise SlotFileError(f"no slot file {path.name!r}", missing=True) from None
    except OSError as e:
        raise SlotFileError(f"slot file {path.name!r} cannot be read: {e.strerror or e}") from None
    where = f"slot file {path.name!r}"
    if len(data) < _PREFIX.size:
        raise SlotFileError(f"{where} is truncated: {len(data)} bytes, shorter than its fixed header")
    magic, version, n_header = _PREFIX.unpack_from(data)
    if magic != MAGIC:
        raise SlotFileError(f"{where} is not a bubo slot file")
    if version != VERSION:
        raise SlotFileError(f"{where} has version {version}; this bubo reads version {VERSION}")
    if n_header > MAX_HEADER_BYTES or _PREFIX.size + n_header > len(data):
        raise SlotFileError(f"{where} is truncated or damaged: its header does not fit in it")
    try:
        head = json.loads(data[_PREFIX.size:_PREFIX.size + n_header])
        fields = (str(head["model_sha256"]), int(head["block_size"]), str(head["type_k"]), str(head["type_v"]),
                  int(head["n_tokens"]), int(head["rows_bytes"]), str(head["sha256"]))
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        raise SlotFileError(f"{where} is damaged: its header is not what bubo writes") from None
    sha, block, type_k, type_v, n, n_rows, digest = fields
    if sha != layout.model_sha256:
        raise SlotFileError(f"{where} was saved from another model (sha256 {sha[:12]}..., this one "
                            f"{layout.model_sha256[:12]}...)")
    if (block, type_k, type_v) != (layout.block_size, layout.type_k, layout.type_v):
        raise SlotFileError(f"{where} was saved from a cache of another layout (blocks of {block}, K {type_k}, "
                            f"V {type_v}; this one: {layout.block_size}, {layout.type_k}, {layout.type_v})")
    if not 0 <= n <= max_tokens:
        raise SlotFileError(f"{where} holds {n} tokens; this cache holds at most {max_tokens}")
    if n_rows != (rows_bytes(n) if n else 0):
        raise SlotFileError(f"{where} is damaged: {n_rows} bytes of rows for {n} tokens")
    start = _PREFIX.size + n_header
    if len(data) != start + 4 * n + n_rows:
        raise SlotFileError(f"{where} is truncated or damaged: {len(data)} bytes where {start + 4 * n + n_rows} "
                            "were written")
    tok, rows = data[start:start + 4 * n], data[start + 4 * n:]
    if _digest(tok, rows) != digest:
        raise SlotFileError(f"{where} is damaged: its contents do not match their checksum")
    return list(struct.unpack(f"<{n}i", tok)), rows, len(data)


_SHA256: dict[tuple[str, int, int], str] = {}


def model_sha256(path: str) -> str:
    """The model file's sha256 (computed once per file and modification)."""
    st = os.stat(path)
    key = (path, st.st_size, st.st_mtime_ns)
    if key not in _SHA256:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
        _SHA256[key] = h.hexdigest()
    return _SHA256[key]
