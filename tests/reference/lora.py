"""Random LoRA adapters in llama.cpp's GGUF layout (convert_lora_to_gguf.py's keys and tensor
names), written with the `gguf` package for a given model file, as no public adapter of the
catalog models can be fetched here."""

from __future__ import annotations

import os

import gguf
import numpy as np

from .reader import reader

MATS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def matrix_shapes(model_path) -> tuple[str, str | None, int, dict[str, tuple[int, int]]]:
    """(architecture, general.name, layers, matrix name -> (rows, cols)) of a model file (a real
    model's reader is opened once per process: reference.reader)."""
    r = reader(model_path)

    def value(key):
        f = r.fields.get(key)
        return None if f is None else f.contents()
    arch = value("general.architecture")
    n_layer = int(value(f"{arch}.block_count"))
    shapes = {}
    for t in r.tensors:
        parts = t.name.split(".")
        if t.name.startswith("blk.0.") and parts[2] in MATS and parts[3] == "weight":
            shapes[parts[2]] = (int(t.shape[1]), int(t.shape[0]))  # GGUF (ne0 = cols, ne1 = rows)
    return arch, value("general.name"), n_layer, shapes


def random_pairs(model_path, rank: int, mats=MATS, layers=None, seed: int = 0, std: float = 0.05
                 ) -> dict[tuple[int, str], tuple[np.ndarray, np.ndarray]]:
    """(layer, matrix) -> (A [rank, cols], B [rows, rank]) float32, for mats of every layer (or layers)."""
    _, _, n_layer, shapes = matrix_shapes(model_path)
    rng = np.random.default_rng(seed)
    out = {}
    for il in (range(n_layer) if layers is None else layers):
        for name in mats:
            rows, cols = shapes[name]
            a = rng.normal(0, 1 / np.sqrt(cols), (rank, cols)).astype(np.float32)
            b = rng.normal(0, std, (rows, rank)).astype(np.float32)
            out[(il, name)] = (a, b)
    return out


def write_adapter(path, model_path, pairs, alpha: float = 16.0, dtype: str = "F32", base_name: str | None = "same",
                  arch: str | None = None, extra: dict | None = None, adapter_type: str = "lora") -> str:
    """pairs as a GGUF LoRA adapter of model_path's architecture at path (dtype: F32, F16, BF16 or
    Q8_0); base_name "same" records the model's general.name, None records none."""
    model_arch, model_name, _, _ = matrix_shapes(model_path)
    path = os.fspath(path)
    w = gguf.GGUFWriter(path, arch=arch or model_arch)
    w.add_type(gguf.GGUFType.ADAPTER)
    w.add_string(gguf.Keys.Adapter.TYPE, adapter_type)
    w.add_float32(gguf.Keys.Adapter.LORA_ALPHA, alpha)
    if base_name is not None:
        w.add_uint32(gguf.Keys.General.BASE_MODEL_COUNT, 1)
        w.add_string(gguf.Keys.General.BASE_MODEL_NAME.format(id=0),
                     model_name if base_name == "same" else base_name)
    qtype = getattr(gguf.GGMLQuantizationType, dtype)
    for (il, name), (a, b) in pairs.items():
        for half, arr in (("a", a), ("b", b)):
            tname = f"blk.{il}.{name}.weight.lora_{half}"
            if dtype == "F32" or (dtype == "Q8_0" and arr.shape[1] % 32):  # a row of whole blocks, or F32
                w.add_tensor(tname, np.ascontiguousarray(arr, dtype=np.float32))
            elif dtype == "F16":
                w.add_tensor(tname, np.ascontiguousarray(arr, dtype=np.float16))
            else:
                data = gguf.quants.quantize(np.ascontiguousarray(arr, dtype=np.float32), qtype).view(np.uint8)
                w.add_tensor(tname, data, raw_dtype=qtype)
    for name, arr in (extra or {}).items():
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def as_read(pairs, dtype: str) -> dict:
    """pairs as the file holds them (rounded to dtype), float32."""
    if dtype == "F32":
        return pairs
    qtype = getattr(gguf.GGMLQuantizationType, dtype)
    out = {}
    for key, (a, b) in pairs.items():
        out[key] = tuple(x if dtype == "Q8_0" and x.shape[1] % 32 else
                         gguf.quants.dequantize(gguf.quants.quantize(x.astype(np.float32), qtype), qtype)
                         .reshape(x.shape).astype(np.float32) for x in (a, b))
    return out
