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


# ---- fuzzing seeds ---------------------------------------------------------------------------


def fuzz_seeds():
    """Small, structurally rich files for the fuzzers: [(name, bytes, fields)]. Between them they
    hold every value type, strings, empty and nested arrays, same-length keys and tensor names
    (an overwrite makes a duplicate), and tensors of several types, ranks and alignments."""
    seeds = []
    kvs = [
        ("general.architecture", STRING, "llama"),
        ("k.aa", UINT32, 7), ("k.bb", INT32, -7), ("k.u8", UINT8, 1), ("k.i8", INT8, -1),
        ("k.u16", UINT16, 2), ("k.i16", INT16, -2), ("k.u64", UINT64, 3), ("k.i64", INT64, -3),
        ("k.f32", FLOAT32, 0.5), ("k.f64", FLOAT64, 0.25), ("k.bo", BOOL, True), ("k.s", STRING, "héllo"),
        ("k.e", STRING, ""),
        ("a.u32", ARRAY, (UINT32, [1, 2, 3])), ("a.f32", ARRAY, (FLOAT32, [1.0, 2.0])),
        ("a.bool", ARRAY, (BOOL, [True, False])), ("a.str", ARRAY, (STRING, ["ab", "", "cd"])),
        ("a.empty", ARRAY, (INT64, [])),
        ("a.nested", ARRAY, (ARRAY, [(UINT8, [1, 2]), (UINT8, []), (UINT8, [3])])),
        ("a.nstr", ARRAY, (ARRAY, [(STRING, ["x"]), (STRING, [])])),
    ]
    tensors = [
        ("t.f32", [4, 2], 0), ("t.f16", [8], 1), ("t.q8", [32, 2], 8), ("t.q40", [64], 2),
        ("t.i32", [2, 3, 2], 26), ("t.bf", [2], 30), ("t.i8", [1, 1, 1, 5], 24), ("t.zr", [0, 3], 0),
    ]
    tensors = [(n, ne, t, tensor_bytes(t, ne, i)) for i, (n, ne, t) in enumerate(tensors)]
    seeds.append(("rich_v3", *build(kvs, tensors)))
    seeds.append(("rich_v2", *build(kvs[:6], tensors[:3], version=2)))
    seeds.append(("align64", *build([("general.alignment", UINT32, 64)] + kvs[1:4], tensors[2:5], alignment=64)))
    seeds.append(("kquant", *build(kvs[:2], [("blk.0.attn_q.weight", [256, 2], 12, tensor_bytes(12, [256, 2])),
                                               ("blk.0.ffn_up.weight", [256, 1], 16, tensor_bytes(16, [256, 1]))])))
    deep = (UINT16, [1])
    for _ in range(7):
        deep = (ARRAY, [deep, (ARRAY, [])] if deep[0] == ARRAY else [deep])
    seeds.append(("deep", *build([("n.deep", ARRAY, deep), ("n.many", ARRAY, (ARRAY, [(INT8, [])] * 40))])))
    seeds.append(("meta_only", *build(kvs[:12], pad_data=False)))
    return seeds
