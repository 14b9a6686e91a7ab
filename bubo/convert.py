"""Converting a Hugging Face BERT checkpoint (safetensors + tokenizer files) to GGUF.

The file is laid out as llama.cpp's converter lays out BERT (architecture ``bert``, its tensor
names, the WordPiece vocabulary in llama.cpp's "phantom space" form: ``##ing`` is stored as
``ing`` and a word-initial ``the`` as ``\u2581the``), so that llama-server reads the same file.
The tokenizer's normalisation flags, which llama.cpp does not store, go under
``tokenizer.ggml.wordpiece.*``:

- ``lowercase``, ``strip_accents``, ``chinese_chars`` (bool): BERT's basic tokenizer, as the
  checkpoint's tokenizer.json (its BertNormalizer) says;
- ``max_input_chars_per_word`` (u32): a longer word is one [UNK].

The weights are read with numpy (a safetensors file is a JSON header and raw little-endian
arrays); ``gguf`` writes the file. Matrices are stored as F16 (``f16``, the default), F32 or
Q8_0; vectors (norms, biases) always as F32.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np

_SAFETENSORS_DTYPES = {"F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32}
OUT_TYPES = ("f32", "f16", "q8_0")

# llama.cpp's llama_pooling_type
POOLING_MEAN, POOLING_CLS, POOLING_LAST = 1, 2, 3

TOKEN_NORMAL, TOKEN_CONTROL = 1, 3  # llama.cpp's token types
PHANTOM_SPACE = "\u2581"


class ConvertError(ValueError):
    """The checkpoint is not one this converter understands."""


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of a safetensors file as a numpy array (copies, not views of a mapping)."""
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise ConvertError(f"{path}: not a safetensors file (too short)")
        (n,) = struct.unpack("<Q", raw)
        if n > 100 << 20:
            raise ConvertError(f"{path}: safetensors header of {n} bytes is implausible")
        header = json.loads(f.read(n))
        data = f.read()
    out: dict[str, np.ndarray] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = _SAFETENSORS_DTYPES.get(info["dtype"])
        if dtype is None:
            raise ConvertError(f"{path}: tensor {name} has dtype {info['dtype']}, which is not supported")
        begin, end = info["data_offsets"]
        arr = np.frombuffer(data[begin:end], dtype=np.dtype(dtype).newbyteorder("<"))
        out[name] = arr.reshape(info["shape"]).copy()
    return out


def _phantom(token: str) -> str:
    if token.startswith("[") and token.endswith("]"):
        return token
    if token.startswith("##"):
        return token[2:]
    return PHANTOM_SPACE + token


def _load_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConvertError(f"{path} is missing") from None


def _pooling(src: Path) -> int:
    cfg_path = src / "1_Pooling" / "config.json"
    if not cfg_path.is_file():
        return POOLING_CLS  # a plain BertModel: its [CLS] row, as transformers' pipelines do
    cfg = _load_json(cfg_path)
    if cfg.get("pooling_mode_mean_tokens"):
        return POOLING_MEAN
    if cfg.get("pooling_mode_cls_token"):
        return POOLING_CLS
    if cfg.get("pooling_mode_lasttoken"):
        return POOLING_LAST
    raise ConvertError(f"{cfg_path}: pooling {cfg} is not supported (mean, cls, last token are)")


def convert_bert(src: Path, dest: Path, out_type: str = "f16", name: str = "") -> None:
    """Write the GGUF of the BERT checkpoint in directory `src` to `dest` (overwritten)."""
    import gguf  # the writer; imported here so that importing bubo does not need it

    if out_type not in OUT_TYPES:
        raise ConvertError(f"out_type must be one of {OUT_TYPES}, not {out_type!r}")
    config = _load_json(src / "config.json")
    if config.get("model_type") != "bert":
        raise ConvertError(f"{src}: model_type {config.get('model_type')!r} is not bert")
    if config.get("hidden_act", "gelu") != "gelu" or config.get("position_embedding_type", "absolute") != "absolute":
        raise ConvertError(f"{src}: only gelu activations and absolute positions are supported")
    tok = _load_json(src / "tokenizer.json")
    if tok.get("model", {}).get("type") != "WordPiece":
        raise ConvertError(f"{src}/tokenizer.json: model {tok.get('model', {}).get('type')!r} is not WordPiece")
    vocab: dict[str, int] = tok["model"]["vocab"]
    tokens = [""] * len(vocab)
    for text, i in vocab.items():
        tokens[i] = text
    if any(t == "" for t in tokens):
        raise ConvertError(f"{src}/tokenizer.json: the vocabulary's ids are not 0..{len(vocab) - 1}")
    specials = {t["id"] for t in tok.get("added_tokens", []) if t.get("special")}
    norm = tok.get("normalizer") or {}
    lowercase = bool(norm.get("lowercase", True))
    strip = norm.get("strip_accents")
    strip_accents = lowercase if strip is None else bool(strip)

    def special_id(text: str) -> int:
        if text not in vocab:
            raise ConvertError(f"{src}: the vocabulary has no {text}")
        return vocab[text]

    weights = read_safetensors(src / "model.safetensors")
    prefix = "bert." if any(k.startswith("bert.") for k in weights) else ""

    def w(key: str) -> np.ndarray:
        try:
            return weights[prefix + key].astype(np.float32)
        except KeyError:
            raise ConvertError(f"{src}/model.safetensors has no tensor {prefix + key}") from None

    n_layer = int(config["num_hidden_layers"])
    arch = "bert"
    writer = gguf.GGUFWriter(str(dest), arch)
    writer.add_name(name or config.get("_name_or_path", "bert"))
    writer.add_file_type({"f32": 0, "f16": 1, "q8_0": 7}[out_type])
    writer.add_context_length(int(config["max_position_embeddings"]))
    writer.add_embedding_length(int(config["hidden_size"]))
    writer.add_feed_forward_length(int(config["intermediate_size"]))
    writer.add_block_count(n_layer)
    writer.add_head_count(int(config["num_attention_heads"]))
    writer.add_layer_norm_eps(float(config.get("layer_norm_eps", 1e-12)))
    writer.add_causal_attention(False)
    writer.add_pooling_type(gguf.PoolingType(_pooling(src)))

    writer.add_tokenizer_model("bert")
    writer.add_token_list([_phantom(t) for t in tokens])
    writer.add_token_type_count(int(config.get("type_vocab_size", 2)))
    writer.add_token_types([TOKEN_CONTROL if i in specials else TOKEN_NORMAL for i in range(len(tokens))])
    writer.add_bos_token_id(special_id("[CLS]"))
    writer.add_eos_token_id(special_id("[SEP]"))
    writer.add_sep_token_id(special_id("[SEP]"))
    writer.add_unk_token_id(special_id("[UNK]"))
    writer.add_pad_token_id(special_id("[PAD]"))
    writer.add_mask_token_id(special_id("[MASK]"))
    writer.add_add_bos_token(True)
    writer.add_add_sep_token(True)
    writer.add_bool("tokenizer.ggml.wordpiece.lowercase", lowercase)
    writer.add_bool("tokenizer.ggml.wordpiece.strip_accents", strip_accents)
    writer.add_bool("tokenizer.ggml.wordpiece.chinese_chars", bool(norm.get("handle_chinese_chars", True)))
    writer.add_uint32("tokenizer.ggml.wordpiece.max_input_chars_per_word",
                      int(tok["model"].get("max_input_chars_per_word", 100)))

    def matrix(gguf_name: str, arr: np.ndarray, lookup: bool = False) -> None:
        # rows that are looked up (embeddings) stay F16 under q8_0: they are not multiplied
        kind = "f16" if lookup and out_type == "q8_0" else out_type
        if kind == "f32":
            writer.add_tensor(gguf_name, arr.astype(np.float32))
        elif kind == "f16":
            writer.add_tensor(gguf_name, arr.astype(np.float16))
        else:
            q = gguf.quants.quantize(arr.astype(np.float32), gguf.GGMLQuantizationType.Q8_0)
            writer.add_tensor(gguf_name, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)

    def vector(gguf_name: str, arr: np.ndarray) -> None:
        writer.add_tensor(gguf_name, arr.astype(np.float32))

    matrix("token_embd.weight", w("embeddings.word_embeddings.weight"), lookup=True)
    matrix("position_embd.weight", w("embeddings.position_embeddings.weight"), lookup=True)
    vector("token_types.weight", w("embeddings.token_type_embeddings.weight"))
    vector("token_embd_norm.weight", w("embeddings.LayerNorm.weight"))
    vector("token_embd_norm.bias", w("embeddings.LayerNorm.bias"))
    for il in range(n_layer):
        hf, blk = f"encoder.layer.{il}.", f"blk.{il}."
        pairs = [
            ("attention.self.query", "attn_q"), ("attention.self.key", "attn_k"),
            ("attention.self.value", "attn_v"), ("attention.output.dense", "attn_output"),
            ("intermediate.dense", "ffn_up"), ("output.dense", "ffn_down"),
        ]
        for hf_name, g_name in pairs:
            matrix(f"{blk}{g_name}.weight", w(f"{hf}{hf_name}.weight"))
            vector(f"{blk}{g_name}.bias", w(f"{hf}{hf_name}.bias"))
        for hf_name, g_name in [("attention.output.LayerNorm", "attn_output_norm"), ("output.LayerNorm", "layer_output_norm")]:
            vector(f"{blk}{g_name}.weight", w(f"{hf}{hf_name}.weight"))
            vector(f"{blk}{g_name}.bias", w(f"{hf}{hf_name}.bias"))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
