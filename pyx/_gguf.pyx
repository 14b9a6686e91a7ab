# cython: language_level=3
"""GGUF files through the C reader: metadata as Python values, tensor infos, and tensor bytes
as read-only numpy views of the mapping (no copy)."""

import os
from collections import namedtuple

import numpy as np

from cpython.buffer cimport PyBuffer_FillInfo, PyBuffer_Release, PyObject_GetBuffer, PyBUF_SIMPLE, PyBUF_WRITABLE
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport uint8_t, uint64_t, int64_t

from common cimport *
from gguf cimport *

include "status.pxi"

from quants cimport bubo_type_traits, bubo_type_get_traits


TensorInfo = namedtuple("TensorInfo", ["name", "type", "type_name", "shape", "offset", "nbytes"])
TensorInfo.__doc__ = """One tensor of a GGUF file. type is the GGML type id, type_name its name ("q4_K");
shape is in GGUF order (ne[0], the fastest-varying dimension, first); offset is from the start of the
data section; nbytes is the tensor's extent in the file."""

# numpy dtype of each metadata array element type (little-endian, as stored)
cdef dict _ARRAY_DTYPES = {
    BUBO_GGUF_UINT8: np.dtype("u1"), BUBO_GGUF_INT8: np.dtype("i1"),
    BUBO_GGUF_UINT16: np.dtype("<u2"), BUBO_GGUF_INT16: np.dtype("<i2"),
    BUBO_GGUF_UINT32: np.dtype("<u4"), BUBO_GGUF_INT32: np.dtype("<i4"),
    BUBO_GGUF_UINT64: np.dtype("<u8"), BUBO_GGUF_INT64: np.dtype("<i8"),
    BUBO_GGUF_FLOAT32: np.dtype("<f4"), BUBO_GGUF_FLOAT64: np.dtype("<f8"),
    BUBO_GGUF_BOOL: np.dtype("?"),
}

# numpy dtype of each unquantized tensor type id (BF16 as its raw bits); all others are bytes
cdef dict _TENSOR_DTYPES = {
    0: np.dtype("<f4"), 1: np.dtype("<f2"), 30: np.dtype("<u2"),
    24: np.dtype("i1"), 25: np.dtype("<i2"), 26: np.dtype("<i4"), 27: np.dtype("<i8"),
    28: np.dtype("<f8"),
}


cdef class _Mapping:
    """Owns one bubo_gguf handle and the bytes under it (the mmap, or the caller's buffer).

    Exports the whole file as a read-only buffer; every numpy view made from it holds a reference,
    so the mapping lives until the last view and the GGUFFile are gone, whatever close() did."""
    cdef bubo_gguf *g
    cdef Py_buffer src
    cdef bint has_src

    def __dealloc__(self):
        if self.g != NULL:
            bubo_gguf_close(self.g)
            self.g = NULL
        if self.has_src:
            PyBuffer_Release(&self.src)
            self.has_src = False

    def __getbuffer__(self, Py_buffer *view, int flags):
        if flags & PyBUF_WRITABLE:
            raise BufferError("a GGUF mapping is read-only")
        PyBuffer_FillInfo(view, self, <void *>bubo_gguf_base(self.g), <Py_ssize_t>bubo_gguf_file_size(self.g),
                          1, flags)

    def __releasebuffer__(self, Py_buffer *view):
        pass


cdef class GGUFFile:
    """A GGUF model file, mapped read-only and validated on open.

    GGUFFile(path) maps a file; GGUFFile.from_bytes(data) parses a bytes-like object. Malformed
    input raises GGUFError (UnsupportedError for a well-formed file bubo does not read), naming
    the file and what is wrong where. Strings (keys, values, tensor names) are decoded as strict
    UTF-8: an invalid one raises GGUFError naming it when .metadata or .tensors is built."""
    cdef _Mapping _map
    cdef object _path
    cdef object _metadata
    cdef list _tensors
    cdef dict _by_name

    def __init__(self, path):
        path = os.fspath(path)
        cdef bytes bpath = os.fsencode(path)
        self._path = os.fsdecode(path)
        if b"\0" in bpath:
            raise GGUFError(f"{self._path!r}: path contains a NUL byte")
        cdef _Mapping m = _Mapping()
        cdef bubo_err err
        cdef const char *cpath = bpath
        cdef bubo_status st
        with nogil:
            st = bubo_gguf_open(cpath, &m.g, &err)
        check_status(st, &err, self._path)
        self._map = m

    @staticmethod
    def from_bytes(data):
        """Parse a bytes-like object (bytes, bytearray, memoryview, numpy array...). The file
        keeps a reference to it (a bytearray cannot be resized while the file is open)."""
        cdef GGUFFile f = GGUFFile.__new__(GGUFFile)
        cdef _Mapping m = _Mapping()
        PyObject_GetBuffer(data, &m.src, PyBUF_SIMPLE)
        m.has_src = True
        cdef bubo_err err
        cdef bubo_status st
        with nogil:
            st = bubo_gguf_open_buffer(m.src.buf, <uint64_t>m.src.len, &m.g, &err)
        check_status(st, &err, "<bytes>")
        f._map = m
        return f

    cdef bubo_gguf *_g(self) except NULL:
        if self._map is None:
            raise ValueError("I/O operation on a closed GGUF file")
        return self._map.g

    cdef str _name(self):
        return self._path if self._path is not None else "<bytes>"

    def close(self):
        """Drop this file's reference to the mapping; tensor views made from it stay valid."""
        self._map = None
        self._metadata = None
        self._tensors = None
        self._by_name = None

    @property
    def closed(self):
        return self._map is None

    def __enter__(self):
        self._g()
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        if self._map is None:
            return f"<GGUFFile {self._name()!r} closed>"
        g = self._g()
        return (f"<GGUFFile {self._name()!r} v{bubo_gguf_version(g)} {bubo_gguf_n_kv(g)} keys "
                f"{bubo_gguf_n_tensors(g)} tensors>")

    @property
    def path(self):
        """The path it was opened from (None for from_bytes)."""
        return self._path

    @property
    def version(self):
        return bubo_gguf_version(self._g())

    @property
    def alignment(self):
        return bubo_gguf_alignment(self._g())

    @property
    def data_offset(self):
        """File offset of the data section, where tensor offsets start."""
        return bubo_gguf_data_offset(self._g())

    @property
    def file_size(self):
        return bubo_gguf_file_size(self._g())

    # ---- metadata ----

    cdef str _decode(self, bubo_gguf_str s, what):
        try:
            return PyUnicode_DecodeUTF8(s.data, <Py_ssize_t>s.len, NULL)
        except UnicodeDecodeError as e:
            raise GGUFError(f"{self._name()}: {what} is not valid UTF-8 ({e.reason} at byte {e.start})") from None

    cdef object _value(self, const bubo_gguf_value *v, str key):
        cdef bubo_gguf_type t = v.type
        cdef uint64_t j, n
        cdef const uint8_t *base
        if t == BUBO_GGUF_UINT8 or t == BUBO_GGUF_UINT16 or t == BUBO_GGUF_UINT32 or t == BUBO_GGUF_UINT64:
            return v.v.u64
        if t == BUBO_GGUF_INT8 or t == BUBO_GGUF_INT16 or t == BUBO_GGUF_INT32 or t == BUBO_GGUF_INT64:
            return v.v.i64
        if t == BUBO_GGUF_FLOAT32 or t == BUBO_GGUF_FLOAT64:
            return v.v.f64
        if t == BUBO_GGUF_BOOL:
            return bool(v.v.b)
        if t == BUBO_GGUF_STRING:
            return self._decode(v.v.str, f"the value of key {key!r}")
        # an array
        n = v.v.arr.n
        elem = v.v.arr.elem_type
        if elem == BUBO_GGUF_STRING:
            return [self._decode(v.v.arr.items[j].v.str, f"element {j} of key {key!r}") for j in range(n)]
        if elem == BUBO_GGUF_ARRAY:
            return [self._value(&v.v.arr.items[j], key) for j in range(n)]
        base = bubo_gguf_base(self._map.g)
        return np.frombuffer(self._map, dtype=_ARRAY_DTYPES[elem], count=<Py_ssize_t>n,
                             offset=<Py_ssize_t>(<const uint8_t *>v.v.arr.data - base)).tolist()

    @property
    def metadata(self):
        """dict key -> int | float | bool | str | list (nested lists for nested arrays), in file
        order; built once."""
        cdef bubo_gguf *g = self._g()
        cdef uint64_t i
        cdef const bubo_gguf_kv *kv
        if self._metadata is None:
            md = {}
            for i in range(bubo_gguf_n_kv(g)):
                kv = bubo_gguf_kv_at(g, i)
                key = self._decode(kv.key, f"key {i}")
                md[key] = self._value(&kv.value, key)
            self._metadata = md
        return self._metadata

    # ---- tensors ----

    cdef list _build_tensors(self):
        cdef bubo_gguf *g = self._g()
        cdef uint64_t i
        cdef const bubo_gguf_tensor *t
        cdef const bubo_type_traits *tr
        if self._tensors is None:
            tensors = []
            for i in range(bubo_gguf_n_tensors(g)):
                t = bubo_gguf_tensor_at(g, i)
                tr = bubo_type_get_traits(t.type)
                name = self._decode(t.name, f"the name of tensor {i}")
                shape = tuple([t.ne[d] for d in range(t.n_dims)])
                tensors.append(TensorInfo(name, t.type, tr.name.decode("ascii"), shape, t.offset, t.nbytes))
            self._by_name = {info.name: info for info in tensors}
            self._tensors = tensors
        return self._tensors

    @property
    def tensors(self):
        """list of TensorInfo, in file order."""
        return list(self._build_tensors())

    def tensor(self, str name):
        """TensorInfo of the tensor called name; KeyError if there is none."""
        self._build_tensors()
        return self._by_name[name]

    def tensor_data(self, str name):
        """A read-only numpy view of a tensor's bytes in the mapping, shaped in numpy order
        (reversed GGUF order). F32/F16/F64/I8..I64 as their dtypes, BF16 as uint16 bits; block-
        quantized types as uint8 with the last axis the bytes of one row. The view keeps the
        mapping alive after close()."""
        info = self.tensor(name)
        cdef bubo_gguf *g = self._g()
        cdef const bubo_type_traits *tr = bubo_type_get_traits(info.type)
        cdef uint64_t offset = bubo_gguf_data_offset(g) + info.offset
        if offset > bubo_gguf_file_size(g):  # only an empty tensor past the end of a padless file
            offset = bubo_gguf_file_size(g)
        outer = tuple(reversed(info.shape[1:]))
        dtype = _TENSOR_DTYPES.get(info.type)
        if dtype is not None:
            shape = tuple(reversed(info.shape))
        else:
            dtype = np.dtype("u1")
            shape = outer + ((info.shape[0] // tr.blck_size) * tr.type_size,)
        arr = np.frombuffer(self._map, dtype=dtype, count=info.nbytes // dtype.itemsize, offset=offset)
        return arr.reshape(shape)

    def check_supported(self):
        """Raise UnsupportedError naming the first tensor whose type bubo has no kernels for."""
        cdef bubo_err err
        cdef bubo_gguf *g = self._g()
        check_status(bubo_gguf_check_supported(g, &err), &err, self._name())
