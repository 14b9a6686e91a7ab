"""Structure-aware fuzzing of the GGUF reader through GGUFFile.from_bytes.

The seeds come from ggufbuild, which records where every field lies, so mutations aim at the
fields that matter: counts, lengths, type ids, dimensions, offsets. Every case must either load
(and then every accessor works and the tensors lie inside the file without overlapping) or raise
GGUFError; a crash takes the test run down with it. Deterministic: one fixed seed."""

from __future__ import annotations

import random
import struct
from collections import Counter

import numpy as np

from bubo.errors import GGUFError
from bubo.gguf import GGUFFile

import ggufbuild as gb
from ggufbuild import ARRAY, UINT8

SEED = 0x6767_7566
RANDOM_CASES = 100_000

# Values aimed at 8-byte count/length/offset/ne fields: edges of every width and the file size.
U64_EDGES = [0, 1, 2, 3, 7, 8, 31, 32, 33, 63, 64, 255, 256, 4095, 4096, 2**31 - 1, 2**31, 2**32 - 1, 2**32,
             2**32 + 1, 2**62, 2**63 - 1, 2**63, 2**63 + 1, 2**64 - 2, 2**64 - 1]
U32_EDGES = [0, 1, 2, 4, 5, 8, 9, 12, 13, 16, 23, 29, 30, 31, 38, 39, 40, 41, 42, 255, 2**31, 2**32 - 1]


def exercise(data: bytes) -> str:
    """Load and touch everything; return "ok", "rejected" (GGUFError at open) or "bad-utf8"."""
    try:
        f = GGUFFile.from_bytes(data)
    except GGUFError:
        return "rejected"
    size = len(data)
    assert f.version in (2, 3)
    assert f.alignment > 0 and f.alignment & (f.alignment - 1) == 0
    assert f.data_offset % f.alignment == 0
    try:
        md = f.metadata
        tensors = f.tensors
    except GGUFError as e:
        assert "not valid UTF-8" in str(e)
        return "bad-utf8"
    assert isinstance(md, dict)
    extents = []
    for t in tensors:
        assert f.tensor(t.name) == t
        assert len(t.shape) <= 4 and all(n >= 0 for n in t.shape)
        assert t.offset % f.alignment == 0
        if t.nbytes:
            assert f.data_offset + t.offset + t.nbytes <= size
            extents.append((t.offset, t.offset + t.nbytes))
        view = f.tensor_data(t.name)
        assert view.nbytes == t.nbytes and not view.flags.writeable
        flat = view.reshape(-1).view(np.uint8)
        if flat.size:  # the first and last byte are the file's
            start = f.data_offset + t.offset
            assert flat[0] == data[start] and flat[-1] == data[start + t.nbytes - 1]
    extents.sort()
    for (_, end), (start, _) in zip(extents, extents[1:]):
        assert end <= start, "overlapping tensors were accepted"
    try:
        f.check_supported()
    except GGUFError:
        pass
    f.close()
    return "ok"


def pack_field(buf: bytearray, field: gb.Field, value: int) -> None:
    fmt = {1: "<B", 2: "<H", 4: "<I", 8: "<Q"}.get(field.size)
    if fmt and field.offset + field.size <= len(buf):  # earlier mutations may have cut it off
        struct.pack_into(fmt, buf, field.offset, value % (1 << (8 * field.size)))


def field_value(rng: random.Random, field: gb.Field, size: int) -> int:
    """A hostile value for a field: an edge, the file size, the bytes left after the field, or
    an off-by-one of any of these."""
    left = size - field.offset - field.size
    if field.size == 4:
        base = rng.choice(U32_EDGES + [rng.randrange(64)])
    elif field.kind == "tensor_offset":
        base = rng.choice(U64_EDGES + [size, size // 2, rng.randrange(0, size + 64, 32), rng.randrange(size + 64)])
    else:
        base = rng.choice(U64_EDGES + [size, left, left // 8, left // 12, left // 13, left // 24,
                                       rng.randrange(size + 1)])
    return (base + rng.choice([0, 0, 0, 1, -1])) % (1 << (8 * field.size))


def mutate(rng: random.Random, raw: bytes, fields) -> bytes:
    buf = bytearray(raw)
    interesting = [f for f in fields if f.size in (4, 8) and f.kind not in ("tensor_data", "data_start")]
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        op = rng.random()
        if op < 0.45 and interesting:  # a hostile number in a structural field
            f = rng.choice(interesting)
            pack_field(buf, f, field_value(rng, f, len(buf)))
        elif op < 0.60:  # random bytes anywhere
            for _ in range(rng.randint(1, 8)):
                if buf:
                    buf[rng.randrange(len(buf))] = rng.randrange(256)
        elif op < 0.70:  # single bit flips
            for _ in range(rng.randint(1, 4)):
                if buf:
                    buf[rng.randrange(len(buf))] ^= 1 << rng.randrange(8)
        elif op < 0.78:  # truncate near a field boundary
            f = rng.choice(fields)
            buf = buf[: max(0, f.offset + rng.choice([-1, 0, 1, f.size]))]
        elif op < 0.86:  # one field copied over another of the same width (duplicate names, offsets)
            same = [(a, b) for a, b in ((rng.choice(fields), rng.choice(fields)) for _ in range(8))
                    if a.size == b.size and a is not b and a.offset + a.size <= len(buf)
                    and b.offset + b.size <= len(buf)]
            if same:
                a, b = same[0]
                buf[b.offset : b.offset + b.size] = buf[a.offset : a.offset + a.size]
        elif op < 0.93:  # delete or duplicate a span
            i = rng.randrange(len(buf) + 1)
            j = min(len(buf), i + rng.randint(1, 64))
            buf = buf[:i] + buf[j:] if rng.random() < 0.5 else buf[:j] + buf[i:j] + buf[j:]
        else:  # grow or shrink the tail (padding, data section)
            buf = (buf + bytes(rng.randint(1, 300)) if rng.random() < 0.5
                   else buf[: max(0, len(buf) - rng.randint(1, 300))])
    return bytes(buf)


def nesting_bomb(rng: random.Random) -> bytes:
    """A key whose value nests arrays `depth` deep, each one element, or whose inner count lies."""
    depth = rng.choice([2, 7, 8, 9, 10, 64, 1000, 100_000])
    levels = [struct.pack("<IQ", ARRAY, rng.choice([1, 1, 1, 2, 2**40])) for _ in range(depth - 1)]
    inner = b"".join(levels) + struct.pack("<IQ", UINT8, 1) + b"\x01"
    kv = struct.pack("<Q", 4) + b"bomb" + struct.pack("<I", ARRAY) + inner
    return b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + kv


def wide_bomb(rng: random.Random) -> bytes:
    """Many empty arrays, honestly counted or with a count far beyond the bytes."""
    n = rng.choice([0, 1, 1000, 5000])
    claimed = rng.choice([n, n + 1, 2**60, (2**64 - 1) // 12 + 1])
    body = struct.pack("<IQ", ARRAY, claimed) + struct.pack("<IQ", UINT8, 0) * n
    kv = struct.pack("<Q", 4) + b"wide" + struct.pack("<I", ARRAY) + body
    return b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + kv


def test_fuzz_gguf_from_bytes():
    rng = random.Random(SEED)
    seeds = gb.fuzz_seeds()
    outcomes = Counter()

    # every truncation point of every seed: each field's start, end and one byte into it
    for _, raw, fields in seeds:
        cuts = {0, len(raw) - 1}
        for f in fields:
            cuts.update((f.offset, f.offset + 1, f.offset + f.size - 1, f.offset + f.size))
        for cut in sorted(c for c in cuts if 0 <= c < len(raw)):
            outcomes[exercise(raw[:cut])] += 1
        assert exercise(raw) == "ok"

    # every structural field of every seed set to every edge value
    for _, raw, fields in seeds:
        for f in fields:
            if f.size not in (4, 8) or f.kind in ("tensor_data", "data_start"):
                continue
            for v in U32_EDGES if f.size == 4 else U64_EDGES + [len(raw), len(raw) - f.offset - f.size]:
                buf = bytearray(raw)
                pack_field(buf, f, v)
                outcomes[exercise(bytes(buf))] += 1

    for _ in range(200):
        outcomes[exercise(nesting_bomb(rng))] += 1
        outcomes[exercise(wide_bomb(rng))] += 1

    for _ in range(RANDOM_CASES):
        _, raw, fields = rng.choice(seeds)
        outcomes[exercise(mutate(rng, raw, fields))] += 1

    total = sum(outcomes.values())
    print(f"gguf fuzz: {total} cases, {dict(outcomes)}")
    assert total >= 10_000
    # the mutations must reach past the header: a good share loads, a good share is refused
    assert outcomes["ok"] > total // 20 and outcomes["rejected"] > total // 4
