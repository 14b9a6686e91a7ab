"""The GGUF reader against gguf.GGUFReader (an independent implementation; the tests open it
through reference.reader, which gives the same fields and tensors faster) on files written by
gguf.GGUFWriter and by hand, and its errors on malformed input."""

from __future__ import annotations

import os
import pathlib
import struct

import gguf
import numpy as np
import pytest

import bubo
from bubo.errors import GGUFError, UnsupportedError
from bubo.gguf import SUPPORTED_ARCHITECTURES, GGUFFile, TensorInfo, check_model_file

import ggufbuild as gb
from ggufbuild import ARRAY, BOOL, FLOAT32, FLOAT64, INT8, INT16, INT32, INT64, STRING, UINT8, UINT16, UINT32, UINT64
from reference.reader import Reader, reader

Q = gguf.GGMLQuantizationType
VT = gguf.GGUFValueType
MAX_DEPTH = 8  # BUBO_GGUF_MAX_ARRAY_DEPTH


# ---- comparing with gguf.GGUFReader ---------------------------------------------------------


def flatten(v):
    if isinstance(v, list):
        return [x for item in v for x in flatten(item)]
    return [v]


def reader_value(field):
    """A ReaderField's value; nested arrays come back flattened (GGUFReader flattens them)."""
    return field.contents()


def assert_same_as_reader(f: GGUFFile, source) -> gguf.GGUFReader:
    r = reader(source)
    md = f.metadata
    # GGUFReader adds the header fields as pseudo-keys
    fields = {k: v for k, v in r.fields.items() if not k.startswith("GGUF.")}
    assert list(md) == list(fields)
    for key, field in fields.items():
        mine = md[key]
        if isinstance(mine, list) and any(isinstance(x, list) for x in mine):
            mine = flatten(mine)
        theirs = reader_value(field)
        assert mine == theirs, key
        assert type(mine) is type(theirs) or field.types[-1] in (VT.FLOAT32, VT.BOOL), key
    assert f.data_offset == r.data_offset
    assert f.alignment == r.alignment
    assert len(f.tensors) == len(r.tensors)
    for mine, theirs in zip(f.tensors, r.tensors):
        assert mine.name == theirs.name
        assert mine.type == int(theirs.tensor_type)
        assert mine.type_name.lower() == theirs.tensor_type.name.lower()
        assert mine.shape == tuple(int(x) for x in theirs.shape)
        assert f.data_offset + mine.offset == theirs.data_offset
        assert mine.nbytes == theirs.n_bytes
        data = f.tensor_data(mine.name)
        assert data.tobytes() == theirs.data.tobytes(), mine.name
    return r


# ---- files written by gguf.GGUFWriter -------------------------------------------------------

SCALARS = {
    "t.u8": (VT.UINT8, 255), "t.i8": (VT.INT8, -128), "t.u16": (VT.UINT16, 65535), "t.i16": (VT.INT16, -32768),
    "t.u32": (VT.UINT32, 2**32 - 1), "t.i32": (VT.INT32, -(2**31)), "t.u64": (VT.UINT64, 2**64 - 1),
    "t.i64": (VT.INT64, -(2**63)), "t.f32": (VT.FLOAT32, 0.1), "t.f64": (VT.FLOAT64, -1e300),
    "t.bool.true": (VT.BOOL, True), "t.bool.false": (VT.BOOL, False),
    "t.str": (VT.STRING, "héllo wörld ✓ \U0001f989"), "t.str.empty": (VT.STRING, ""),
}
ARRAYS = {
    "a.u8": (VT.UINT8, [0, 1, 255]), "a.i8": (VT.INT8, [-1, 2]), "a.u16": (VT.UINT16, [65535]),
    "a.i16": (VT.INT16, [-5, 5]), "a.u32": (VT.UINT32, [1, 2, 3]), "a.i32": (VT.INT32, [-(2**31), 7]),
    "a.u64": (VT.UINT64, [2**64 - 1, 0]), "a.i64": (VT.INT64, [-(2**63)]), "a.f32": (VT.FLOAT32, [0.5, -2.25, 1e-3]),
    "a.f64": (VT.FLOAT64, [3.141592653589793]), "a.bool": (VT.BOOL, [True, False, True]),
    "a.str": (VT.STRING, ["a", "", "ünï", "tok en"]),
}


def quantized(qtype, shape):
    """Blocks of qtype for a tensor of this (numpy-order) shape: quantized by the gguf package
    where it can, else random bytes (k-quants have no Python quantizer; the reader never looks
    inside blocks)."""
    rng = np.random.default_rng(int(qtype))
    try:
        return gguf.quants.quantize(rng.standard_normal(shape).astype(np.float32), qtype)
    except NotImplementedError:
        blck, size = gguf.GGML_QUANT_SIZES[qtype]
        byte_shape = (*shape[:-1], shape[-1] // blck * size)
        return rng.integers(0, 256, byte_shape, dtype=np.uint8)


def writer_tensors():
    rng = np.random.default_rng(0)
    return {
        "f32.2d": (rng.standard_normal((3, 5)).astype(np.float32), None),
        "f16.1d": (rng.standard_normal(7).astype(np.float16), None),
        "i8": (np.arange(-4, 4, dtype=np.int8), None),
        "i16": (np.arange(6, dtype=np.int16).reshape(2, 3), None),
        "i32.3d": (np.arange(24, dtype=np.int32).reshape(2, 3, 4), None),
        "i64": (np.array([-(2**62), 5], dtype=np.int64), None),
        "f64": (np.array([1.5, -2.5], dtype=np.float64), None),
        "bf16": (quantized(Q.BF16, (2, 8)), Q.BF16),
        "q8_0": (quantized(Q.Q8_0, (3, 64)), Q.Q8_0),
        "q4_K.3d": (quantized(Q.Q4_K, (2, 2, 256)), Q.Q4_K),
        "q6_K": (quantized(Q.Q6_K, (1, 512)), Q.Q6_K),
    }


def write_with_writer(path, *, alignment=None, arch="llama", tensors=None, kv=True):
    w = gguf.GGUFWriter(str(path), arch)
    if alignment is not None:
        w.add_custom_alignment(alignment)
    if kv:
        for key, (vt, v) in SCALARS.items():
            w.add_key_value(key, v, vt)
        for key, (vt, v) in ARRAYS.items():
            w.add_key_value(key, v, VT.ARRAY, sub_type=vt)
        w.add_array("n.nested", [[1, 2], [3], [4, 5, 6]])
        w.add_array("n.nested.str", [["a", "b"], ["c"]])
        w.add_array("n.nested3", [[[1.5], [2.5, 3.5]], [[4.5]]])
    for name, (data, raw) in (writer_tensors() if tensors is None else tensors).items():
        w.add_tensor(name, data, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def writer_file(tmp_path_factory):
    return write_with_writer(tmp_path_factory.mktemp("gguf") / "all.gguf", alignment=64)


def test_writer_file_matches_reader(writer_file):
    with GGUFFile(writer_file) as f:
        assert f.version == 3
        assert f.alignment == 64
        assert f.data_offset % 64 == 0
        assert_same_as_reader(f, writer_file)


def test_the_tests_faster_reader_reads_what_gguf_reads(writer_file):
    """tests/reference/reader.py's Reader (plain array views of the mapping) gives the gguf
    package's own GGUFReader's fields, parts and tensors, every value type included."""
    theirs, ours = gguf.GGUFReader(writer_file), Reader(writer_file)
    assert list(ours.fields) == list(theirs.fields)
    for a, b in zip(theirs.fields.values(), ours.fields.values(), strict=True):
        assert (b.offset, b.types, b.data) == (a.offset, a.types, a.data), a.name
        assert b.contents() == a.contents(), a.name
        assert all(x.dtype == y.dtype and np.array_equal(x, y) for x, y in zip(a.parts, b.parts, strict=True)), a.name
    assert len(ours.tensors) == len(theirs.tensors) > 0
    for a, b in zip(theirs.tensors, ours.tensors, strict=True):
        assert (b.name, b.tensor_type, list(b.shape), b.data_offset) == (a.name, a.tensor_type, list(a.shape),
                                                                          a.data_offset)
        assert b.data.dtype == a.data.dtype and np.array_equal(b.data, a.data), a.name


def test_metadata_values(writer_file):
    md = GGUFFile(writer_file).metadata
    assert md["general.architecture"] == "llama"
    assert md["general.alignment"] == 64
    for key, (vt, v) in SCALARS.items():
        expected = np.float32(v).item() if vt == VT.FLOAT32 else v
        assert md[key] == expected and type(md[key]) is type(expected), key
    for key, (vt, v) in ARRAYS.items():
        expected = np.array(v, dtype=np.float32).tolist() if vt == VT.FLOAT32 else v
        assert md[key] == expected, key
        assert all(type(x) is type(y) for x, y in zip(md[key], expected)), key
    assert md["n.nested"] == [[1, 2], [3], [4, 5, 6]]
    assert md["n.nested.str"] == [["a", "b"], ["c"]]
    assert md["n.nested3"] == [[[1.5], [2.5, 3.5]], [[4.5]]]
    assert GGUFFile(writer_file).metadata is not md  # each file builds its own
    f = GGUFFile(writer_file)
    assert f.metadata is f.metadata  # built once


def test_tensor_infos_and_views(writer_file):
    f = GGUFFile(writer_file)
    tensors = writer_tensors()
    assert [t.name for t in f.tensors] == list(tensors)
    for name, (data, raw) in tensors.items():
        info = f.tensor(name)
        assert isinstance(info, TensorInfo)
        assert f.tensor(name) == info
        view = f.tensor_data(name)
        assert not view.flags.writeable
        if raw is None:  # plain dtypes come back as themselves, numpy order
            assert info.shape == tuple(reversed(data.shape))
            assert view.dtype == data.dtype and view.shape == data.shape
            np.testing.assert_array_equal(view, data)
        else:  # bf16 bits / quantized blocks: uint16 or bytes, last axis = one row
            assert view.tobytes() == data.tobytes()
            assert view.shape[:-1] == data.shape[:-1]
        assert info.nbytes == data.nbytes
        assert info.offset % 64 == 0
    assert f.tensor("q4_K.3d").shape == (256, 2, 2)
    assert f.tensor("q4_K.3d").type_name == "q4_K"
    assert f.tensor_data("q4_K.3d").shape == (2, 2, 144)
    assert f.tensor_data("bf16").dtype == np.uint16
    assert f.tensor("bf16").type_name == "bf16"


def test_views_do_not_copy_and_outlive_close(writer_file):
    f = GGUFFile(writer_file)
    a = f.tensor_data("f32.2d")
    b = f.tensor_data("f32.2d")
    assert np.shares_memory(a, b)
    with pytest.raises(ValueError):
        a[0, 0] = 1.0
    expected = a.copy()
    f.close()
    del f
    np.testing.assert_array_equal(a, expected)  # the mapping lives while a view does


def test_closed_file_and_context_manager(writer_file):
    with GGUFFile(writer_file) as f:
        assert not f.closed
        assert f.tensor("i8").shape == (8,)
    assert f.closed
    for touch in (lambda: f.metadata, lambda: f.tensors, lambda: f.version, lambda: f.alignment,
                  lambda: f.data_offset, lambda: f.tensor("i8"), lambda: f.tensor_data("i8"),
                  lambda: f.check_supported()):
        with pytest.raises(ValueError, match="closed"):
            touch()
    f.close()  # twice is fine
    assert "closed" in repr(f)


def test_missing_tensor_is_keyerror(writer_file):
    f = GGUFFile(writer_file)
    with pytest.raises(KeyError):
        f.tensor("nope")
    with pytest.raises(KeyError):
        f.tensor_data("nope")


def test_path_types(writer_file):
    assert GGUFFile(pathlib.Path(writer_file)).path == str(writer_file)
    assert GGUFFile(os.fsencode(writer_file)).path == str(writer_file)
    with pytest.raises(TypeError):
        GGUFFile(3)
    assert bubo.GGUFFile is GGUFFile


def test_from_bytes(writer_file):
    raw = pathlib.Path(writer_file).read_bytes()
    for data in (raw, bytearray(raw), memoryview(raw), np.frombuffer(raw, np.uint8)):
        f = GGUFFile.from_bytes(data)
        assert f.path is None
        assert_same_as_reader(f, writer_file)
    buf = bytearray(raw)
    f = GGUFFile.from_bytes(buf)
    view = f.tensor_data("f32.2d")
    with pytest.raises(BufferError):  # the file holds the buffer; it cannot move under the view
        buf.extend(b"x")
    del f
    with pytest.raises(BufferError):
        buf.extend(b"x")
    del view
    buf.extend(b"x")
    with pytest.raises(TypeError):
        GGUFFile.from_bytes("not bytes")


def test_default_alignment_and_no_tensors(tmp_path):
    p = write_with_writer(tmp_path / "a.gguf", tensors={})
    f = GGUFFile(p)
    assert f.alignment == 32 and f.tensors == []
    assert_same_as_reader(f, p)


def test_metadata_only_without_padding(tmp_path):
    # vocab-only files end right after the metadata: the data section is empty and past the end
    p = tmp_path / "vocab.gguf"
    w = gguf.GGUFWriter(str(p), "llama")
    w.add_array("tokenizer.ggml.tokens", ["a", "b"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    f = GGUFFile(p)
    assert f.metadata["tokenizer.ggml.tokens"] == ["a", "b"]
    assert f.data_offset >= p.stat().st_size and f.data_offset % 32 == 0


def test_big_endian_file_is_refused(tmp_path):
    p = tmp_path / "be.gguf"
    w = gguf.GGUFWriter(str(p), "llama", endianess=gguf.GGUFEndian.BIG)
    w.add_uint32("x", 1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    with pytest.raises(UnsupportedError, match="big-endian") as e:
        GGUFFile(p)
    assert str(p) in str(e.value)


# ---- files written by hand ------------------------------------------------------------------

HAND_KVS = [
    ("general.architecture", STRING, "llama"),
    ("e.str", STRING, ""),
    ("e.arr.u32", ARRAY, (UINT32, [])),
    ("e.arr.str", ARRAY, (STRING, [])),
    ("e.arr.arr", ARRAY, (ARRAY, [])),
    ("e.nested.empty", ARRAY, (ARRAY, [(INT8, []), (INT8, [-1])])),
    ("n.deep", ARRAY, (ARRAY, [(ARRAY, [(STRING, ["x", ""])]), (ARRAY, [])])),
    ("s.u8", UINT8, 200), ("s.i8", INT8, -100), ("s.u16", UINT16, 60000), ("s.i16", INT16, -30000),
    ("s.u32", UINT32, 4_000_000_000), ("s.i32", INT32, -2_000_000_000), ("s.u64", UINT64, 2**63 + 5),
    ("s.i64", INT64, -(2**62)), ("s.f32", FLOAT32, 2.5), ("s.f64", FLOAT64, 1e-300), ("s.b", BOOL, True),
    ("a.b", ARRAY, (BOOL, [False, True])), ("a.f64", ARRAY, (FLOAT64, [1.0, -0.0])),
]
HAND_EXPECTED = {
    "general.architecture": "llama", "e.str": "", "e.arr.u32": [], "e.arr.str": [], "e.arr.arr": [],
    "e.nested.empty": [[], [-1]], "n.deep": [[["x", ""]], []],
    "s.u8": 200, "s.i8": -100, "s.u16": 60000, "s.i16": -30000, "s.u32": 4_000_000_000, "s.i32": -2_000_000_000,
    "s.u64": 2**63 + 5, "s.i64": -(2**62), "s.f32": 2.5, "s.f64": 1e-300, "s.b": True, "a.b": [False, True],
    "a.f64": [1.0, -0.0],
}


def hand_tensors():
    specs = [("tok_embd.weight", [64, 3], 8), ("norm", [5], 0), ("t3", [2, 3, 4], 26), ("q4", [32, 1, 2], 2),
             ("empty", [0, 4], 0), ("i8.4d", [1, 2, 1, 3], 24)]
    return [(name, ne, t, gb.tensor_bytes(t, ne, seed=i)) for i, (name, ne, t) in enumerate(specs)]


@pytest.mark.parametrize("version", [2, 3])
def test_hand_built_file(version, tmp_path):
    raw, _ = gb.build(HAND_KVS, hand_tensors(), version=version)
    f = GGUFFile.from_bytes(raw)
    assert f.version == version
    assert f.metadata == HAND_EXPECTED
    assert [type(v) for v in f.metadata.values()] == [type(v) for v in HAND_EXPECTED.values()]
    for name, ne, t, data in hand_tensors():
        info = f.tensor(name)
        assert info.shape == tuple(ne) and info.type == t and info.nbytes == len(data)
        assert f.tensor_data(name).tobytes() == data
    assert f.tensor_data("t3").shape == (4, 3, 2)
    assert f.tensor_data("q4").shape == (2, 1, 18)
    assert f.tensor_data("empty").shape == (4, 0)
    assert f.tensor_data("i8.4d").shape == (3, 1, 2, 1)
    # the oracle agrees on everything it can represent (it flattens nested arrays)
    p = tmp_path / "hand.gguf"
    p.write_bytes(raw)
    assert_same_as_reader(f, p)


def test_custom_alignment_hand_built():
    tensors = [("a", [3], 0, gb.tensor_bytes(0, [3])), ("b", [5], 0, gb.tensor_bytes(0, [5], 1))]
    raw, _ = gb.build([("general.alignment", UINT32, 256)], tensors, alignment=256)
    f = GGUFFile.from_bytes(raw)
    assert f.alignment == 256 and f.data_offset == 256
    assert [t.offset for t in f.tensors] == [0, 256]
    assert f.tensor_data("b").tobytes() == tensors[1][3]


def test_v1_is_refused(tmp_path):
    p = tmp_path / "v1.gguf"
    p.write_bytes(gb.build_v1())
    with pytest.raises(UnsupportedError, match="version 1") as e:
        GGUFFile(p)
    assert str(p) in str(e.value)


@pytest.mark.parametrize("version,exc,words", [(0, GGUFError, "version is 0"), (4, UnsupportedError, "version 4"),
                                               (0x02000000, UnsupportedError, "big-endian"),
                                               (12345, UnsupportedError, "version 12345")])
def test_bad_versions(tmp_path, version, exc, words):
    raw, _ = gb.build(HAND_KVS[:1], version=version)
    p = tmp_path / "v.gguf"
    p.write_bytes(raw)
    with pytest.raises(exc, match=words) as e:
        GGUFFile(p)
    assert str(p) in str(e.value)


# ---- not GGUF at all ------------------------------------------------------------------------


def bad_path_cases(tmp_path):
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    text = tmp_path / "notes.txt"
    text.write_text("hello, this is not a model\n")
    short = tmp_path / "short.gguf"
    short.write_bytes(b"GGUF\x03\x00")
    header_only = tmp_path / "header.gguf"
    header_only.write_bytes(b"GGUF" + struct.pack("<IQ", 3, 0))
    tiny = tmp_path / "tiny.gguf"
    tiny.write_bytes(b"GG")
    return [
        (tmp_path / "missing.gguf", "No such file"),
        (tmp_path, "directory"),
        (empty, "empty file"),
        (text, "not a GGUF file"),
        (short, "truncated header"),
        (header_only, "truncated header"),
        (tiny, "only 2 bytes"),
    ]


def test_bad_paths(tmp_path):
    for path, words in bad_path_cases(tmp_path):
        with pytest.raises(GGUFError) as e:
            GGUFFile(path)
        assert str(path) in str(e.value), path
        assert words in str(e.value), (path, str(e.value))
        assert not isinstance(e.value, UnsupportedError)


# ---- malformed structure: each error says what and where -------------------------------------


def kv_file(*kvs, tensors=(), **kw):
    return gb.build(list(kvs), list(tensors), **kw)[0]


def one_tensor(name="w", ne=(4,), ttype=0):
    return (name, list(ne), ttype, gb.tensor_bytes(ttype, list(ne)))


def patch(raw: bytes, fields, kind: str, fmt: str, value, nth: int = 0) -> bytes:
    f = [x for x in fields if x.kind == kind][nth]
    out = bytearray(raw)
    struct.pack_into(fmt, out, f.offset, value)
    return bytes(out)


def error_of(raw) -> str:
    with pytest.raises(GGUFError) as e:
        GGUFFile.from_bytes(raw)
    return str(e.value)


def test_error_messages_name_the_problem():
    arch = ("general.architecture", STRING, "llama")

    msg = error_of(kv_file(arch, ("k", UINT32, 1), ("k", UINT32, 2)))
    assert "key 'k'" in msg and "duplicate key (entries 1 and 2)" in msg

    msg = error_of(kv_file(arch, tensors=[one_tensor("w"), one_tensor("w")]))
    assert "duplicate tensor name 'w' (tensors 0 and 1)" in msg

    raw, fields = gb.build([arch], [one_tensor("a", (8,)), one_tensor("b", (8,))])
    msg = error_of(patch(raw, fields, "tensor_offset", "<Q", 16, nth=1))
    assert "tensor 1 'b'" in msg and "not a multiple of the alignment 32" in msg
    msg = error_of(patch(raw, fields, "tensor_offset", "<Q", 0, nth=1))
    assert "tensor 1 'b'" in msg and "overlaps tensor 0 'a'" in msg
    msg = error_of(patch(raw, fields, "tensor_offset", "<Q", 1 << 40, nth=1))
    assert "tensor 1 'b'" in msg and "runs past the end of the file" in msg
    msg = error_of(patch(raw, fields, "ne", "<Q", 2**64 - 1, nth=0))
    assert "tensor 0 'a'" in msg and "ne[0] is negative" in msg
    msg = error_of(patch(raw, fields, "ne", "<Q", 2**62, nth=0))
    assert "tensor 0 'a'" in msg and ("overflows" in msg or "past the end" in msg)
    msg = error_of(patch(raw, fields, "n_dims", "<I", 5, nth=1))
    assert "tensor 1 'b'" in msg and "n_dims is 5, at most 4" in msg
    msg = error_of(patch(raw, fields, "tensor_type", "<I", 4, nth=0))  # Q4_2: retired, undefined
    assert "tensor 0 'a'" in msg and "unknown tensor type id 4" in msg

    msg = error_of(kv_file(arch, tensors=[one_tensor("q", (32, 2), 8)])[:-40])
    assert "tensor 0 'q'" in msg and "past the end" in msg

    raw, fields = gb.build([arch], [one_tensor("q", (64, 2), 8)])
    msg = error_of(patch(raw, fields, "ne", "<Q", 48, nth=0))
    assert "tensor 0 'q'" in msg and "ne[0] = 48 is not a multiple of the q8_0 block size 32" in msg

    msg = error_of(kv_file(arch, ("general.alignment", UINT32, 48)))
    assert "key 'general.alignment'" in msg and "48 is not a nonzero power of two" in msg
    msg = error_of(kv_file(arch, ("general.alignment", UINT32, 0)))
    assert "0 is not a nonzero power of two" in msg
    msg = error_of(kv_file(arch, ("general.alignment", UINT64, 32)))
    assert "must be a uint32, not uint64" in msg

    raw, fields = gb.build([arch, ("b", BOOL, True)])
    msg = error_of(patch(raw, fields, "scalar", "<B", 2))
    assert "key 'b'" in msg and "bool value is 2" in msg

    raw, fields = gb.build([arch, ("s", STRING, "abc")])
    msg = error_of(patch(raw, fields, "str_len", "<Q", 2**63, nth=1))
    assert "key 's'" in msg and "string length 9223372036854775808 exceeds" in msg

    raw, fields = gb.build([arch, ("a", ARRAY, (UINT64, [1, 2]))])
    msg = error_of(patch(raw, fields, "arr_len", "<Q", 2**61))
    assert "key 'a'" in msg and "array of 2305843009213693952 uint64" in msg
    msg = error_of(patch(raw, fields, "arr_type", "<I", 13))
    assert "unknown array element type 13" in msg

    raw, fields = gb.build([arch, ("x", UINT8, 1)])
    msg = error_of(patch(raw, fields, "value_type", "<I", 99, nth=1))
    assert "key 'x'" in msg and "unknown value type 99" in msg
    msg = error_of(patch(raw, fields, "n_kv", "<Q", 2**40))
    assert "n_kv is 1099511627776" in msg
    msg = error_of(patch(raw, fields, "n_tensors", "<Q", 2**40))
    assert "n_tensors is 1099511627776" in msg


def nest(depth, leaf=(UINT8, [1])):
    v = leaf
    for _ in range(depth - 1):
        v = (ARRAY, [v])
    return v


def test_nesting_depth_limit():
    ok = GGUFFile.from_bytes(kv_file(("n", ARRAY, nest(MAX_DEPTH))))
    v = ok.metadata["n"]
    for _ in range(MAX_DEPTH - 1):
        v = v[0]
    assert v == [1]
    msg = error_of(kv_file(("n", ARRAY, nest(MAX_DEPTH + 1))))
    assert "key 'n'" in msg and f"nested more than {MAX_DEPTH} deep" in msg


def test_truncated_everywhere_names_an_offset():
    raw, fields = gb.build(HAND_KVS, hand_tensors())
    data_start = next(f.offset for f in fields if f.kind == "data_start")
    for cut in range(0, data_start - 1):
        msg = error_of(raw[:cut])
        assert "byte" in msg or "past the end" in msg, (cut, msg)


def test_invalid_utf8_raises_naming_the_key():
    f = GGUFFile.from_bytes(kv_file(("tok", ARRAY, (STRING, ["ok", b"\xff\xfe"]))))
    with pytest.raises(GGUFError, match=r"element 1 of key 'tok' is not valid UTF-8"):
        _ = f.metadata
    f = GGUFFile.from_bytes(kv_file(("bad\xff".encode("latin-1"), UINT8, 1)))
    with pytest.raises(GGUFError, match=r"key 0 is not valid UTF-8"):
        _ = f.metadata
    f = GGUFFile.from_bytes(kv_file(("s", STRING, b"\xc3")))
    with pytest.raises(GGUFError, match=r"the value of key 's' is not valid UTF-8"):
        _ = f.metadata
    f = GGUFFile.from_bytes(kv_file(tensors=[(b"w\x80", [4], 0, bytes(16))]))
    with pytest.raises(GGUFError, match=r"the name of tensor 0 is not valid UTF-8"):
        _ = f.tensors


# ---- supported types and architectures -------------------------------------------------------


def iq_file(arch="llama"):
    ne = [256, 2]
    tensors = [("blk.0.attn_q.weight", ne, 16, gb.tensor_bytes(16, ne))]
    return kv_file(("general.architecture", STRING, arch), tensors=tensors)


def test_unsupported_types_parse_and_check_supported_names_them():
    f = GGUFFile.from_bytes(iq_file())
    assert f.tensor("blk.0.attn_q.weight").type_name == "iq2_xxs"
    assert f.tensor_data("blk.0.attn_q.weight").shape == (2, 66)
    with pytest.raises(UnsupportedError) as e:
        f.check_supported()
    assert str(e.value) == "<bytes>: tensor 'blk.0.attn_q.weight' has type iq2_xxs, which bubo does not run"


def test_check_model_file(tmp_path):
    p = tmp_path / "iq.gguf"
    p.write_bytes(iq_file())
    with pytest.raises(UnsupportedError, match="iq2_xxs, which bubo does not run") as e:
        check_model_file(GGUFFile(p))
    assert str(p) in str(e.value)

    p.write_bytes(iq_file("gpt2"))
    with pytest.raises(UnsupportedError, match="architecture 'gpt2' is not supported") as e:
        check_model_file(GGUFFile(p))
    assert str(p) in str(e.value)

    p.write_bytes(kv_file(("x", UINT8, 1)))
    with pytest.raises(UnsupportedError, match="no general.architecture") as e:
        check_model_file(GGUFFile(p))
    assert str(p) in str(e.value)

    for arch in SUPPORTED_ARCHITECTURES:  # no tensors: nothing unsupported to run
        assert check_model_file(GGUFFile.from_bytes(kv_file(("general.architecture", STRING, arch)))) == arch


# ---- the real catalog models ----------------------------------------------------------------

CATALOG = ["smollm2:135m", "gemma3:270m", "qwen2.5-coder:0.5b"]


@pytest.fixture(scope="module", params=CATALOG)
def real_model(request):
    from bubo import store

    path = store.pull(request.param)
    return path, GGUFFile(path), reader(path)


@pytest.mark.models
def test_real_model_matches_reader(real_model):
    path, f, r = real_model
    assert f.path == str(path)
    md = f.metadata
    fields = {k: v for k, v in r.fields.items() if not k.startswith("GGUF.")}
    assert list(md) == list(fields)
    for key, field in fields.items():
        assert md[key] == field.contents(), key
    assert f.version == r.fields["GGUF.version"].contents()
    assert f.alignment == r.alignment and f.data_offset == r.data_offset
    assert md["general.architecture"] in SUPPORTED_ARCHITECTURES
    assert len(f.tensors) == len(r.tensors) > 0
    for mine, theirs in zip(f.tensors, r.tensors):
        assert (mine.name, mine.type, mine.shape, f.data_offset + mine.offset, mine.nbytes) == (
            theirs.name, int(theirs.tensor_type), tuple(int(x) for x in theirs.shape), theirs.data_offset,
            theirs.n_bytes), mine.name
        assert mine.type_name.lower() == theirs.tensor_type.name.lower()
    # a few tensors' bytes: first, last, the largest, one of each type
    by_type = {}
    for t in r.tensors:
        by_type.setdefault(int(t.tensor_type), t)
    sample = {r.tensors[0].name: r.tensors[0], r.tensors[-1].name: r.tensors[-1],
              max(r.tensors, key=lambda t: t.n_bytes).name: max(r.tensors, key=lambda t: t.n_bytes)}
    sample.update({t.name: t for t in by_type.values()})
    for name, theirs in sample.items():
        view = f.tensor_data(name)
        assert view.nbytes == theirs.n_bytes
        assert np.array_equal(view.view(np.uint8).reshape(-1), theirs.data.view(np.uint8).reshape(-1)), name
        assert view.shape == theirs.data.shape or view.dtype == np.uint8, name


@pytest.mark.models
def test_real_model_views_share_the_mapping(real_model):
    path, f, _ = real_model
    name = max(f.tensors, key=lambda t: t.nbytes).name
    a, b = f.tensor_data(name), f.tensor_data(name)
    assert np.shares_memory(a, b)
    assert not a.flags.writeable and not a.flags.owndata
    # the view is the file's bytes in place: compare with a plain read at the same offset
    info = f.tensor(name)
    with open(path, "rb") as fh:
        fh.seek(f.data_offset + info.offset)
        head = fh.read(64)
    assert a.view(np.uint8).reshape(-1)[:64].tobytes() == head


@pytest.mark.models
def test_catalog_models_pass_the_model_check(real_model):
    """Every tensor type of the three catalog models has kernels, and their architectures are
    the ones bubo runs."""
    path, f, _ = real_model
    arch = check_model_file(f)
    assert arch in SUPPORTED_ARCHITECTURES
    assert {t.type_name for t in f.tensors} <= {"f32", "f16", "q4_1", "q5_0", "q8_0", "q4_K", "q6_K"}
