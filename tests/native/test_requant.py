"""Weights requantized at load (Model(path, requant=...), what a draft model loads with) against
the gguf package: a file whose matrices the package dequantized and quantized again gives the
same logits bit for bit as the original file requantized by bubo's loader.

Which matrices: those of the layers and an untied output whose rows take more bytes in their own
type than in the requant type (F32, F16, Q8_0, Q6_K, Q5_0, Q4_1 to Q4_0; Q4_K, already 4.5 bits,
and token_embd stay). The real qwen2.5-coder 0.5b agreed bit for bit too when this was written."""
import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGUFReader, GGUFValueType, GGUFWriter, Keys
from gguf import GGMLQuantizationType as QT
from gguf.quants import dequantize, quantize

from bubo._model import REQUANT_TYPES, KVCache, Model

from engines import THREADS
from reference.tiny import KQUANT_DIMS, KQUANT_TYPES, write_tiny_model

LAYER_MATRICES = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def row_bytes(qtype: QT, cols: int) -> int:
    block, size = GGML_QUANT_SIZES[qtype]
    return cols // block * size


def requantized_copy(src: str, dst: str, qtype: QT) -> list[str]:
    """dst: src with every layer matrix and an untied output whose rows are wider than in qtype
    rewritten in qtype by the gguf package; the names rewritten."""
    r = GGUFReader(src)
    w = GGUFWriter(dst, r.fields[Keys.General.ARCHITECTURE].contents())
    for field in r.fields.values():
        if field.name == Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        kind = field.types[0]
        w.add_key_value(field.name, field.contents(), kind,
                        sub_type=field.types[-1] if kind == GGUFValueType.ARRAY else None)
    changed = []
    for t in r.tensors:
        data, kind = t.data, t.tensor_type
        base = t.name.split(".")[-2] if t.name.startswith("blk.") else t.name.split(".")[0]
        cols = int(t.shape[0])
        if (base in LAYER_MATRICES or base == "output") and t.name.endswith(".weight") and len(t.shape) == 2 \
                and row_bytes(qtype, cols) < row_bytes(kind, cols):
            data, kind = quantize(dequantize(data, kind), qtype), qtype
            changed.append(t.name)
        if kind in (QT.F32, QT.F16):
            w.add_tensor(t.name, data)
        else:
            w.add_tensor(t.name, data, raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return changed


def logits(path: str, requant: str | None = None) -> np.ndarray:
    m = Model(path, n_threads=THREADS, requant=requant)
    n = 40
    toks = (np.arange(n) * 7 + 3) % m.n_vocab
    return m.decode(KVCache(m, 64), toks, np.arange(n), np.zeros(n), np.ones(n, bool))


@pytest.mark.parametrize("arch,types,dims", [
    ("qwen2", KQUANT_TYPES, KQUANT_DIMS),  # Q4_K, Q5_0, Q6_K, Q4_1; an untied Q6_K output
    ("llama", None, {}),  # F16, Q8_0, F32 matrices; an untied F16 output
    ("gemma3", "Q8_0", {}),  # tied: the output is token_embd, which stays
])
def test_requantized_at_load_is_the_gguf_packages_requantization(tmp_path, arch, types, dims):
    src = write_tiny_model(tmp_path / "m.gguf", arch, types=types, **dims)
    oracle = str(tmp_path / "q4_0.gguf")
    changed = requantized_copy(src, oracle, QT.Q4_0)
    assert changed and not any(n.startswith("token_embd") for n in changed)
    if arch == "qwen2":  # the Q4_K matrices stay as they are
        assert not any(n.endswith(("attn_q.weight", "ffn_up.weight")) for n in changed), changed
    ours, theirs, plain = logits(src, "q4_0"), logits(oracle), logits(src)
    assert np.array_equal(ours, theirs)
    assert not np.array_equal(ours, plain)  # the requantized weights were used
    # a requant type no narrower than every matrix changes nothing
    if arch == "gemma3":
        assert np.array_equal(logits(src, "q8_0"), plain)


def test_a_type_weights_cannot_be_requantized_to_is_refused(tmp_path):
    src = write_tiny_model(tmp_path / "m.gguf", "llama")
    assert "q4_0" in REQUANT_TYPES
    for bad in ("q4_K", "f16", "nonsense"):
        with pytest.raises(ValueError, match="cannot be requantized"):
            Model(src, n_threads=1, requant=bad)


def test_requantized_weights_left_unpacked_are_the_same(tmp_path, native_env):
    """BUBO_NO_PREPACK=1: the requantized copies are multiplied in place (and freed with the model)."""
    src = write_tiny_model(tmp_path / "m.gguf", "qwen2", types=KQUANT_TYPES, **KQUANT_DIMS)
    packed = logits(src, "q4_0")
    native_env.setenv("BUBO_NO_PREPACK", "1")
    assert np.array_equal(logits(src, "q4_0"), packed)
