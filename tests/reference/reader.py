"""The gguf package's GGUFReader, faster to open, and opened once per real model and process.

GGUFReader cuts every piece of the file it parses (each token of a vocabulary: its length and its
bytes) as a view of its numpy memmap, and numpy finalizes each memmap view in Python: for the
262,144 tokens of gemma3:270m that is ten seconds, paid by every test that opened the file. Here
the pieces are plain array views of the same mapping (the same bytes, parsed by gguf's own code:
3-4x faster to open), and a real model's reader is kept for the process, which the tests only
read."""

from __future__ import annotations

import functools
import os
from typing import Any

import gguf
import numpy as np

KEEP_BYTES = 16 << 20  # files at least this large (real models) are opened once per process


class Reader(gguf.GGUFReader):
    def _get(self, offset: int, dtype: Any, count: int = 1, override_order: Any = None) -> np.ndarray:
        plain = self.__dict__.get("_plain")
        if plain is None:
            plain = self._plain = self.data.view(np.ndarray)
        count = int(count)
        arr = plain[offset:offset + np.dtype(dtype).itemsize * count].view(dtype=dtype)[:count]
        return arr.view(arr.dtype.newbyteorder(self.byte_order if override_order is None else override_order))


def reader(path: str | os.PathLike[str]) -> gguf.GGUFReader:
    """A GGUFReader of the file: the process's one for a real model (unchanged since it was
    opened), a new one for a small file."""
    path = os.fspath(path)
    st = os.stat(path)
    if st.st_size < KEEP_BYTES:
        return Reader(path)
    return _kept(path, st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=3)  # a real model's parsed vocabulary: hundreds of MB
def _kept(path: str, mtime_ns: int, size: int) -> gguf.GGUFReader:
    return Reader(path)
