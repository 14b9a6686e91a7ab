"""benchmarks/kl.py's own parts on a tiny model: the exact copy holds every tensor as the gguf
package dequantizes it, under the same metadata, written whole; bubo's measure is 0 for a model
against itself and small but above 0 for the quantized model against its exact copy. (The
comparison with llama.cpp needs llama-perplexity: the script itself.)"""

from __future__ import annotations

import pathlib
import sys

import gguf
import numpy as np

from reference import tiny

BENCH = pathlib.Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))  # kl.py imports its neighbours as a script does; only while it loads
try:
    import kl
finally:
    sys.path.remove(str(BENCH))


def test_the_exact_copy_and_the_measure(tmp_path, monkeypatch):
    monkeypatch.setenv("BUBO_HOME", str(tmp_path / "home"))
    path = pathlib.Path(tiny.write_tiny_model(tmp_path / "tiny.gguf", "llama"))
    exact = kl.f32_copy(path)
    assert exact.parent == tmp_path / "home" / "peers" / "f32" and not list(exact.parent.glob("*.part"))
    r, e = gguf.GGUFReader(path), gguf.GGUFReader(exact)

    def fields(reader):
        return {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}

    theirs, mine = fields(r), fields(e)
    assert mine.pop("general.file_type", 0) == 0  # every tensor F32
    theirs.pop("general.file_type", None)
    assert mine == theirs
    assert [t.name for t in e.tensors] == [t.name for t in r.tensors]
    assert any(t.tensor_type != gguf.GGMLQuantizationType.F32 for t in r.tensors)
    for a, b in zip(r.tensors, e.tensors):
        assert b.tensor_type == gguf.GGMLQuantizationType.F32 and list(b.shape) == list(a.shape), a.name
        assert np.array_equal(gguf.quants.dequantize(a.data, a.tensor_type).reshape(-1), b.data.reshape(-1)), a.name
    assert kl.f32_copy(path) == exact  # written once

    rng = np.random.default_rng(0)
    pieces = [rng.integers(1, 200, 32).astype(np.int32) for _ in range(2)]
    same, n = kl.bubo_kl(exact, exact, pieces, threads=1)
    assert same == 0.0 and n == 2 * 15  # positions 16..30 of each chunk
    moved, _ = kl.bubo_kl(path, exact, pieces, threads=1)
    assert 0.0 < moved < 0.5, moved
