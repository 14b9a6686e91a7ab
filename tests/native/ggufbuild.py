"""Write GGUF bytes field by field, recording where every field lies, so tests can build files
gguf.GGUFWriter refuses to write (v1/v2 headers, empty arrays, invalid UTF-8, hostile counts)
and fuzzers can aim at the structure. Independent of bubo."""

from __future__ import annotations

import struct
from dataclasses import dataclass

UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = range(13)

SCALAR_FMT = {
    UINT8: "<B", INT8: "<b", UINT16: "<H", INT16: "<h", UINT32: "<I", INT32: "<i", FLOAT32: "<f",
    BOOL: "<?", UINT64: "<Q", INT64: "<q", FLOAT64: "<d",
}

# (block size, bytes per block) of the tensor types the tests write
TYPE_LAYOUT = {0: (1, 4), 1: (1, 2), 2: (32, 18), 8: (32, 34), 12: (256, 144), 16: (256, 66), 24: (1, 1),
               26: (1, 4), 30: (1, 2)}


@dataclass(frozen=True)
class Field:
    offset: int
    size: int
    kind: str  # "version", "n_kv", "key_len", "value_type", "arr_len", "ne", "tensor_offset", ...


class GGUFBytes:
    def __init__(self) -> None:
        self.buf = bytearray()
        self.fields: list[Field] = []

    def put(self, kind: str, fmt: str, value) -> None:
        self.fields.append(Field(len(self.buf), struct.calcsize(fmt), kind))
        self.buf += struct.pack(fmt, value)

    def put_str(self, kind: str, s: bytes | str) -> None:
        data = s.encode() if isinstance(s, str) else s
        self.put(kind + "_len", "<Q", len(data))
        self.fields.append(Field(len(self.buf), len(data), kind))
        self.buf += data

    def put_value(self, vtype: int, v) -> None:
        """v: a Python scalar; bytes/str for STRING; (elem_type, [items]) for ARRAY."""
        if vtype == STRING:
            self.put_str("str", v)
        elif vtype == ARRAY:
            etype, items = v
            self.put("arr_type", "<I", etype)
            self.put("arr_len", "<Q", len(items))
            for item in items:
                self.put_value(etype, item)
        else:
            self.put("scalar", SCALAR_FMT[vtype], v)

    def pad_to(self, alignment: int) -> None:
        self.buf += bytes(-len(self.buf) % alignment)


def build(kvs=(), tensors=(), *, version: int = 3, alignment: int = 32, pad_data: bool = True):
    """GGUF bytes and their fields. kvs: (key, value_type, value); tensors: (name, ne, type id,
    data bytes), laid out in order, each at the next multiple of `alignment` (which the caller
    also states in a general.alignment kv when it is not 32)."""
    w = GGUFBytes()
    w.buf += b"GGUF"
    w.put("version", "<I", version)
    w.put("n_tensors", "<Q", len(tensors))
    w.put("n_kv", "<Q", len(kvs))
    for key, vtype, value in kvs:
        w.put_str("key", key)
        w.put("value_type", "<I", vtype)
        w.put_value(vtype, value)
    offset = 0
    for name, ne, ttype, data in tensors:
        w.put_str("tensor_name", name)
        w.put("n_dims", "<I", len(ne))
        for n in ne:
            w.put("ne", "<Q", n)
        w.put("tensor_type", "<I", ttype)
        w.put("tensor_offset", "<Q", offset)
        offset += len(data) + (-len(data) % alignment)
    if tensors or pad_data:
        w.pad_to(alignment)
    data_start = len(w.buf)
    for _, _, _, data in tensors:
        w.fields.append(Field(len(w.buf), len(data), "tensor_data"))
        w.buf += data
        w.pad_to(alignment)
    w.fields.append(Field(data_start, 0, "data_start"))
    return bytes(w.buf), w.fields


def build_v1(n_tensors: int = 0, n_kv: int = 1) -> bytes:
    """A GGUF v1 header (32-bit counts) and one u32 key, as v1 wrote strings (u32 lengths)."""
    out = b"GGUF" + struct.pack("<III", 1, n_tensors, n_kv)
    out += struct.pack("<I", 5) + b"a.key" + struct.pack("<II", UINT32, 7)
    return out


def tensor_bytes(ttype: int, ne, seed: int = 0) -> bytes:
    """Deterministic bytes of the right size for a tensor of this type and shape."""
    blck, size = TYPE_LAYOUT[ttype]
    n = 1
    for d in ne[1:]:
        n *= d
    nbytes = n * (ne[0] // blck) * size if ne else size
    return bytes((i * 131 + seed * 7 + 3) & 0xFF for i in range(nbytes))
