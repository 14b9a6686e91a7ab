"""LoRA adapters: the GGUF files llama.cpp's convert_lora_to_gguf.py writes, read and checked
against the model they adapt, then handed to the native forward pass (bubo/_model.pyx lora_set),
which adds scale * alpha / r * B (A x) beside each adapted matrix's W x (the weights are never
rewritten).

    adapter = read_adapter("my-lora.gguf")       # AdapterError for a file that is not one
    check_adapter(adapter, model, model_meta)     # AdapterError naming the first tensor that does not fit
    install(model, slot, adapter)                 # then decode(..., lora_scales) uses slot

An adapter file: general.type = "adapter", adapter.type = "lora", adapter.lora.alpha, and for any
of a layer's matrices blk.N.NAME.weight.lora_a [r, cols] and .lora_b [rows, r] (numpy order) in
F32, F16, BF16 or Q8_0. general.architecture must be the model's; general.base_model.0.name, when
both files name a model, must name the model's (general.name)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bubo.errors import BuboError

# the matrices an adapter may pair with, in the native side's order (bubo/_model.pyx LORA_MATS)
MATS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
TYPES = ("F32", "F16", "BF16", "Q8_0")
MAX_SCALE = 1e6  # the native side refuses a larger one
_NAME = re.compile(r"blk\.(\d+)\.([a-z_]+)\.weight\.lora_([ab])")


class AdapterError(BuboError, ValueError):
    """An adapter file that cannot be used (with this model)."""


@dataclass
class Adapter:
    path: str
    alpha: float
    arch: str
    base_name: str | None
    # (layer, index in MATS) -> (A float32 [r, cols], B float32 [rows, r])
    pairs: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """The file's name without .gguf: how a request or a listing names it."""
        return Path(self.path).name.removesuffix(".gguf")

    @property
    def ranks(self) -> list[int]:
        return sorted({a.shape[0] for a, _ in self.pairs.values()})


def _f32(f: Any, info: Any) -> np.ndarray:
    from bubo import _kernels

    data = f.tensor_data(info.name)
    kind = info.type_name.upper()
    if kind == "F32":
        out = np.array(data, dtype=np.float32)
    elif kind == "F16":
        out = data.astype(np.float32)
    elif kind == "BF16":
        out = (np.asarray(data, dtype=np.uint32) << 16).view(np.float32)
    else:
        out = _kernels.dequantize(info.type, data)
    return out.reshape(tuple(reversed(info.shape)))


def read_adapter(path: str | Path) -> Adapter:
    """The adapter in a GGUF file; AdapterError naming what is wrong."""
    from bubo.gguf import GGUFFile

    where = str(path)
    try:
        f = GGUFFile(where)
    except (OSError, ValueError) as e:
        raise AdapterError(f"{where}: not a readable GGUF file: {e}") from None
    with f:
        meta = f.metadata
        if meta.get("general.type") != "adapter" or meta.get("adapter.type") != "lora":
            raise AdapterError(f"{where}: not a LoRA adapter (general.type {meta.get('general.type')!r}, "
                               f"adapter.type {meta.get('adapter.type')!r}; a LoRA adapter has adapter and lora)")
        alpha = meta.get("adapter.lora.alpha")
        if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not np.isfinite(alpha):
            raise AdapterError(f"{where}: adapter.lora.alpha is missing or not a number")
        arch = meta.get("general.architecture")
        if not isinstance(arch, str):
            raise AdapterError(f"{where}: no general.architecture")
        base = meta.get("general.base_model.0.name")
        halves: dict[tuple[int, int], dict[str, np.ndarray]] = {}
        for info in f.tensors:
            m = _NAME.fullmatch(info.name)
            if m is None or m.group(2) not in MATS:
                raise AdapterError(f"{where}: tensor {info.name} is not a LoRA pair of a layer's matrix "
                                   f"(blk.N.{{{','.join(MATS)}}}.weight.lora_a/lora_b)")
            if info.type_name.upper() not in TYPES or len(info.shape) != 2:
                raise AdapterError(f"{where}: tensor {info.name} is {info.type_name} of {len(info.shape)} dimensions; "
                                   f"give a 2-D {', '.join(TYPES)} tensor")
            arr = _f32(f, info)
            if not np.isfinite(arr).all():
                raise AdapterError(f"{where}: tensor {info.name} holds values that are not finite")
            halves.setdefault((int(m.group(1)), MATS.index(m.group(2))), {})[m.group(3)] = arr
    adapter = Adapter(where, float(alpha), arch, base if isinstance(base, str) else None)
    for (il, mat), pair in sorted(halves.items()):
        name = f"blk.{il}.{MATS[mat]}.weight"
        if set(pair) != {"a", "b"}:
            raise AdapterError(f"{where}: {name} has lora_{next(iter(pair))} but not its other half")
        a, b = pair["a"], pair["b"]
        if a.shape[0] != b.shape[1] or a.shape[0] < 1:
            raise AdapterError(f"{where}: {name}: lora_a is {list(a.shape)} and lora_b {list(b.shape)}; their "
                               "rank (lora_a's rows, lora_b's columns) must agree")
        adapter.pairs[(il, mat)] = (np.ascontiguousarray(a), np.ascontiguousarray(b))
    if not adapter.pairs:
        raise AdapterError(f"{where}: the adapter has no tensors")
    return adapter


def _plain(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def names_base(base_name: str | None, model_name: Any) -> bool:
    """Whether an adapter's recorded base model name is the model's general.name (letter case and
    punctuation aside)."""
    return isinstance(base_name, str) and isinstance(model_name, str) and _plain(base_name) == _plain(model_name)


def check_adapter(adapter: Adapter, model: Any, meta: dict[str, Any]) -> None:
    """AdapterError unless the adapter fits the model (bubo._model.Model; meta: its GGUF metadata):
    the architecture, the base model's name when both name one, and each pair's shapes (the
    first tensor that does not fit is named)."""
    _check(adapter, int(model.hparams["n_layer"]), model.matrix_shape, meta)


def check_adapter_file(adapter: Adapter, model_path: str | Path) -> None:
    """check_adapter against a model file not loaded (its metadata and tensor shapes)."""
    from bubo.gguf import GGUFFile

    with GGUFFile(str(model_path)) as f:
        meta = f.metadata
        shapes = {t.name: tuple(reversed(t.shape)) for t in f.tensors}
    n_layer = meta.get(f"{meta.get('general.architecture')}.block_count")

    def shape_of(il: int, mat: int) -> tuple[int, int]:
        rows, cols = shapes.get(f"blk.{il}.{MATS[mat]}.weight", (0, 0))
        return rows, cols
    _check(adapter, n_layer if isinstance(n_layer, int) else 0, shape_of, meta)


def _check(adapter: Adapter, n_layer: int, shape_of: Callable[[int, int], tuple[int, int]],
           meta: dict[str, Any]) -> None:
    where = adapter.path
    arch = meta.get("general.architecture")
    if adapter.arch != arch:
        raise AdapterError(f"{where}: an adapter of a {adapter.arch} model; this model is {arch}")
    own = meta.get("general.name")
    if adapter.base_name and isinstance(own, str) and not names_base(adapter.base_name, own):
        raise AdapterError(f"{where}: an adapter of {adapter.base_name!r}; this model is {own!r}")
    for (il, mat), (a, b) in adapter.pairs.items():
        name = f"blk.{il}.{MATS[mat]}.weight"
        if il >= n_layer:
            raise AdapterError(f"{where}: {name}.lora_a: the model has {n_layer} layers (0..{n_layer - 1})")
        rows, cols = shape_of(il, mat)
        if a.shape[1] != cols:
            raise AdapterError(f"{where}: {name}.lora_a is {list(a.shape)}; the model's {name} takes {cols} inputs")
        if b.shape[0] != rows:
            raise AdapterError(f"{where}: {name}.lora_b is {list(b.shape)}; the model's {name} has {rows} outputs")


def check_scales(pairs: Sequence[tuple[Any, Any]], n_adapters: int, where: str = "lora") -> list[tuple[int, float]]:
    """(adapter id, scale) pairs checked: each id one of the n adapters', each scale a finite number
    of at most 1e6 (AdapterError naming the pair as where[i]); a later pair of an id replaces an
    earlier one."""
    out: dict[int, float] = {}
    for i, (id, scale) in enumerate(pairs):
        if not isinstance(id, int) or isinstance(id, bool) or not 0 <= id < n_adapters:
            said = f"adapters 0..{n_adapters - 1}" if n_adapters else "no adapters"
            raise AdapterError(f"{where}[{i}].id {id!r}: this model has {said}")
        if not isinstance(scale, (int, float)) or isinstance(scale, bool) or not math.isfinite(scale) \
                or abs(scale) > MAX_SCALE:
            raise AdapterError(f"{where}[{i}].scale must be a finite number of at most 1e6; got {scale!r}")
        out[id] = float(scale)
    return list(out.items())


def install(model: Any, slot: int, adapter: Adapter) -> None:
    """The adapter's pairs in the model's slot (what was there before is cleared first)."""
    model.lora_clear(slot)
    for (il, mat), (a, b) in adapter.pairs.items():
        model.lora_set(slot, il, mat, a, b, adapter.alpha / a.shape[0])
