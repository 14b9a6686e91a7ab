"""`bubo convert-lora PEFT_DIR OUT.gguf --base MODEL` (bubo/convert.py convert_lora): a PEFT
checkpoint (adapter_config.json + adapter_model.safetensors, written here with numpy and
`safetensors`) becomes the adapter GGUF that llama.cpp's converter writes, equal tensor for tensor
to one written by hand (tests/reference/lora.py), Q and K rows reordered for a llama model as its
weights were; a malformed checkpoint is an error naming the file, and nothing is written."""
from __future__ import annotations

import json
import subprocess
import sys

import gguf
import numpy as np
import pytest

from bubo.convert import ConvertError, convert_lora_file

from reference.lora import random_pairs, write_adapter
from reference.tiny import write_tiny_model

HF = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
      "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
      "ffn_down": "mlp.down_proj"}


def _hf_permute_back(b: np.ndarray, n_head: int) -> np.ndarray:
    """The inverse of llama.cpp's Q/K row order: a GGUF llama model's rows as Hugging Face has them
    (each head's first half, then its second, where the GGUF interleaves them in pairs)."""
    return b.reshape(n_head, b.shape[0] // n_head // 2, 2, *b.shape[1:]).swapaxes(1, 2).reshape(b.shape)


def _peft(folder, pairs, r, alpha, arch, n_head=4, n_head_kv=2, config=None, extra=None, drop=None):
    """pairs (GGUF order and names) as a PEFT checkpoint in folder: B of q/k in Hugging Face's row
    order for a llama model."""
    from safetensors.numpy import save_file

    folder.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for (il, name), (a, b) in pairs.items():
        if arch == "llama" and name in ("attn_q", "attn_k"):
            b = _hf_permute_back(b, n_head if name == "attn_q" else n_head_kv)
        key = f"base_model.model.model.layers.{il}.{HF[name]}"
        tensors[f"{key}.lora_A.weight"] = np.ascontiguousarray(a)
        tensors[f"{key}.lora_B.weight"] = np.ascontiguousarray(b)
    tensors.update(extra or {})
    for k in drop or ():
        tensors.pop(k)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    modules = sorted({HF[n].split(".")[1] for _, n in pairs})
    (folder / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "r": r, "lora_alpha": alpha, "target_modules": modules,
        "base_model_name_or_path": "some/model", **(config or {})}))
    return folder


def _tensors(path) -> dict[str, np.ndarray]:
    return {t.name: np.array(t.data) for t in gguf.GGUFReader(str(path)).tensors}


def _fields(path) -> dict:
    r = gguf.GGUFReader(str(path))
    return {f.name: f.contents() for f in r.fields.values() if not f.name.startswith("GGUF.")}


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_a_peft_checkpoint_converts_to_the_hand_written_adapter(tmp_path, arch):
    mp = write_tiny_model(tmp_path / "m.gguf", arch, types="F32")
    pairs = random_pairs(mp, 8, seed=3)
    src = _peft(tmp_path / "peft", pairs, 8, 16, arch)
    out = convert_lora_file(src, tmp_path / "out.gguf", mp)
    hand = write_adapter(tmp_path / "hand.gguf", mp, pairs, alpha=16.0)
    ours, theirs = _tensors(out), _tensors(hand)
    assert sorted(ours) == sorted(theirs)
    for name in theirs:
        assert np.array_equal(ours[name], theirs[name]), name
    assert _fields(out) == _fields(hand)
    # f16: the same values, rounded
    half = convert_lora_file(src, tmp_path / "half.gguf", mp, out_type="f16")
    assert all(np.array_equal(v.astype(np.float16), _tensors(half)[k]) for k, v in theirs.items())


@pytest.mark.parametrize("case, says", [
    ("no_config", "adapter_config.json"),
    ("no_weights", "adapter_model.safetensors is missing"),
    ("rslora", "use_rslora is not supported"),
    ("rank", "lora_A is [8, 64] and lora_B [64, 8]; the base's blk.0.attn_q.weight wants [4, 64]"),
    ("embeddings", "tensor base_model.model.model.embed_tokens.lora_A.weight is not a LoRA pair"),
    ("half", "has lora_A but not its other half"),
    ("layer", "the base model"),
    ("nan", "not finite"),
])
def test_a_malformed_checkpoint_names_the_file_and_writes_nothing(tmp_path, case, says):
    mp = write_tiny_model(tmp_path / "m.gguf", "qwen2", types="F32")
    pairs = random_pairs(mp, 8, mats=("attn_q",), layers=[0], seed=4)
    kw: dict = {}
    if case == "rslora":
        kw["config"] = {"use_rslora": True}
    elif case == "embeddings":
        kw["extra"] = {"base_model.model.model.embed_tokens.lora_A.weight": np.zeros((8, 4), np.float32)}
    elif case == "half":
        kw["drop"] = ["base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"]
    elif case == "layer":
        pairs = {(7, "attn_q"): pairs[(0, "attn_q")]}
    elif case == "nan":
        pairs[(0, "attn_q")][0][0, 0] = np.nan
    src = _peft(tmp_path / "peft", pairs, 4 if case == "rank" else 8, 16, "qwen2", **kw)
    if case == "no_config":
        (src / "adapter_config.json").unlink()
    elif case == "no_weights":
        (src / "adapter_model.safetensors").unlink()
    dest = tmp_path / "out.gguf"
    with pytest.raises(ConvertError) as e:
        convert_lora_file(src, dest, mp)
    assert says in str(e.value) and str(src) in str(e.value), str(e.value)
    assert not dest.exists() and [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_the_command(tmp_path):
    mp = write_tiny_model(tmp_path / "m.gguf", "llama", types="F32")
    src = _peft(tmp_path / "peft", random_pairs(mp, 4, mats=("attn_v",), seed=5), 4, 8, "llama")
    out = subprocess.run([sys.executable, "-m", "bubo", "convert-lora", str(src), str(tmp_path / "a.gguf"),
                          "--base", str(mp)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and (tmp_path / "a.gguf").is_file(), out.stderr
    (src / "adapter_config.json").write_text("{not json")
    out = subprocess.run([sys.executable, "-m", "bubo", "convert-lora", str(src), str(tmp_path / "b.gguf"),
                          "--base", str(mp)], capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "adapter_config.json" in out.stderr and not (tmp_path / "b.gguf").exists()
