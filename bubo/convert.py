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
arrays); ``gguf`` writes the file. Matrices are stored as F16 (``f16``, the default) or F32;
vectors (norms, biases) always as F32. There is no Q8_0: measured on all-MiniLM-L6-v2 against the
float64 reference (tests/native/test_bert.py's 55 inputs), Q8_0 matrices (with their 8-bit
activations) leave 3 of 55 embeddings below cosine 0.999 (the worst 0.9982), where F16 stays
above 0.999999.

A checkpoint this converter does not understand (not BERT, files missing or malformed, tensors
missing or of the wrong shape) raises ConvertError, naming the file and what is wrong.
`convert_bert` writes where it is told; `convert_file` writes beside the destination and renames
into place only once the file is complete, so a failure leaves no half-written file.
"""

from __future__ import annotations

import json
import math
import os
import re
import secrets
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bubo.errors import BuboError

_SAFETENSORS_DTYPES = {"F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32}
OUT_TYPES = ("f32", "f16")

# llama.cpp's llama_pooling_type
POOLING_MEAN, POOLING_CLS, POOLING_LAST = 1, 2, 3

TOKEN_NORMAL, TOKEN_CONTROL = 1, 3  # llama.cpp's token types
PHANTOM_SPACE = "\u2581"


class ConvertError(BuboError, ValueError):
    """The checkpoint is not one this converter understands."""


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of a safetensors file as a numpy array (copies, not views of a mapping);
    BF16 tensors come back as float32."""
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        raise ConvertError(f"{path} is missing") from None
    with f:
        file_size = os.fstat(f.fileno()).st_size
        raw = f.read(8)
        if len(raw) != 8:
            raise ConvertError(f"{path}: not a safetensors file (too short)")
        (n,) = struct.unpack("<Q", raw)
        if n > min(100 << 20, file_size - 8):
            raise ConvertError(f"{path}: safetensors header of {n} bytes is implausible (the file has {file_size})")
        try:
            header = json.loads(f.read(n))
        except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
            raise ConvertError(f"{path}: the safetensors header is not JSON ({e})") from None
        if not isinstance(header, dict):
            raise ConvertError(f"{path}: the safetensors header is not a JSON object")
        base = 8 + n
        out: dict[str, np.ndarray] = {}
        for name, info in header.items():
            if name == "__metadata__":
                continue
            try:
                dtype_name = str(info["dtype"])
                shape = [int(d) for d in info["shape"]]
                begin, end = (int(x) for x in info["data_offsets"])
            except (KeyError, TypeError, ValueError):
                raise ConvertError(f"{path}: tensor {name}'s entry {info!r} is malformed") from None
            dtype: np.dtype[Any]
            if dtype_name == "BF16":
                dtype = np.dtype("<u2")
            elif dtype_name in _SAFETENSORS_DTYPES:
                dtype = np.dtype(_SAFETENSORS_DTYPES[dtype_name]).newbyteorder("<")
            else:
                raise ConvertError(f"{path}: tensor {name} has dtype {dtype_name}, which is not supported")
            count = math.prod(shape)
            if any(d < 0 for d in shape) or begin < 0 or end - begin != count * dtype.itemsize \
                    or base + end > file_size:
                raise ConvertError(f"{path}: tensor {name} (shape {shape}, bytes {begin}..{end}) does not fit "
                                   f"the file ({file_size} bytes)")
            arr = np.empty(count, dtype=dtype)
            f.seek(base + begin)
            if f.readinto(arr.data.cast("B")) != end - begin:
                raise ConvertError(f"{path}: tensor {name} is truncated")
            if dtype_name == "BF16":  # the high half of a float32
                arr = (arr.astype(np.uint32) << 16).view(np.float32)
            out[name] = arr.reshape(shape)
    return out


def _phantom(token: str) -> str:
    if token.startswith("[") and token.endswith("]"):
        return token
    if token.startswith("##"):
        return token[2:]
    return PHANTOM_SPACE + token


def _checkpoint(src: Path, out_type: str, what: str) -> Path:
    """A converter's source folder and output type, checked (ConvertError naming what it wants)."""
    if out_type not in OUT_TYPES:
        raise ConvertError(f"out_type must be one of {OUT_TYPES}, not {out_type!r}")
    if not Path(src).is_dir():
        raise ConvertError(f"{src} is not a directory ({what})")
    return Path(src)


def _load_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConvertError(f"{path} is missing") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        raise ConvertError(f"{path} is not JSON ({e})") from None


def _load_object(path: Path) -> dict[str, Any]:
    obj = _load_json(path)
    if not isinstance(obj, dict):
        raise ConvertError(f"{path} is not a JSON object")
    return obj


def _pooling(src: Path) -> int:
    cfg_path = src / "1_Pooling" / "config.json"
    if not cfg_path.is_file():
        return POOLING_CLS  # a plain BertModel: its [CLS] row, as transformers' pipelines do
    cfg = _load_object(cfg_path)
    if cfg.get("pooling_mode_mean_tokens"):
        return POOLING_MEAN
    if cfg.get("pooling_mode_cls_token"):
        return POOLING_CLS
    if cfg.get("pooling_mode_lasttoken"):
        return POOLING_LAST
    raise ConvertError(f"{cfg_path}: pooling {cfg} is not supported (mean, cls, last token are)")


def convert_bert(src: Path, dest: Path, out_type: str = "f16", name: str = "") -> None:
    """Write the GGUF of the BERT checkpoint in directory `src` to `dest` (overwritten).

    Everything is read and checked before `dest` is opened: a ConvertError leaves it untouched.
    An error while writing can leave it partly written (see convert_file)."""
    import gguf  # the writer; imported here so that importing bubo does not need it

    src = _checkpoint(src, out_type, "a BERT checkpoint: config.json, tokenizer.json, model.safetensors")
    if not (src / "config.json").is_file():
        raise ConvertError(f"{src} is not a BERT checkpoint: it has no config.json")
    config = _load_object(src / "config.json")
    if config.get("model_type") != "bert":
        raise ConvertError(f"{src}: model_type {config.get('model_type')!r} is not bert")
    if config.get("hidden_act", "gelu") != "gelu" or config.get("position_embedding_type", "absolute") != "absolute":
        raise ConvertError(f"{src}: only gelu activations and absolute positions are supported")

    def cfg_int(key: str, default: int | None = None) -> int:
        value = config.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ConvertError(f"{src}/config.json: {key} is {value!r}, not a positive integer")
        return value

    n_layer, n_embd, n_ff = cfg_int("num_hidden_layers"), cfg_int("hidden_size"), cfg_int("intermediate_size")
    n_head, n_ctx = cfg_int("num_attention_heads"), cfg_int("max_position_embeddings")
    n_types = cfg_int("type_vocab_size", 2)
    if n_embd % n_head:
        raise ConvertError(f"{src}/config.json: hidden_size {n_embd} is not a multiple of num_attention_heads {n_head}")

    tok = _load_object(src / "tokenizer.json")
    wp = tok.get("model")
    if not isinstance(wp, dict) or wp.get("type") != "WordPiece":
        kind = wp.get("type") if isinstance(wp, dict) else wp
        raise ConvertError(f"{src}/tokenizer.json: model {kind!r} is not WordPiece")
    vocab = wp.get("vocab")
    if not isinstance(vocab, dict) or not vocab:
        raise ConvertError(f"{src}/tokenizer.json: the WordPiece model has no vocabulary")
    slots: list[str | None] = [None] * len(vocab)
    for text, i in vocab.items():
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < len(slots) or slots[i] is not None:
            raise ConvertError(f"{src}/tokenizer.json: the vocabulary's ids are not 0..{len(vocab) - 1}")
        slots[i] = text
    tokens = [t for t in slots if t is not None]
    specials = {t.get("id") for t in tok.get("added_tokens") or [] if isinstance(t, dict) and t.get("special")}
    norm = tok.get("normalizer") or {}
    if not isinstance(norm, dict) or norm.get("type", "BertNormalizer") != "BertNormalizer":
        raise ConvertError(f"{src}/tokenizer.json: normalizer {norm!r} is not BERT's (BertNormalizer)")
    lowercase = bool(norm.get("lowercase", True))
    strip = norm.get("strip_accents")
    strip_accents = lowercase if strip is None else bool(strip)

    def special_id(text: str) -> int:
        if text not in vocab:
            raise ConvertError(f"{src}: the vocabulary has no {text}")
        return int(vocab[text])

    weights = read_safetensors(src / "model.safetensors")
    prefix = "bert." if any(k.startswith("bert.") for k in weights) else ""

    def w(key: str, *shape: int) -> np.ndarray:
        try:
            arr = weights[prefix + key]
        except KeyError:
            raise ConvertError(f"{src}/model.safetensors has no tensor {prefix + key}") from None
        if arr.shape != shape:
            raise ConvertError(f"{src}/model.safetensors: {prefix + key} has shape {list(arr.shape)}, "
                               f"config.json and the vocabulary make it {list(shape)}")
        return arr.astype(np.float32)

    # every tensor is read and checked before the file is opened
    n_vocab = len(tokens)
    tensors: list[tuple[str, np.ndarray, str]] = [  # (GGUF name, values, matrix | lookup | vector)
        ("token_embd.weight", w("embeddings.word_embeddings.weight", n_vocab, n_embd), "lookup"),
        ("position_embd.weight", w("embeddings.position_embeddings.weight", n_ctx, n_embd), "lookup"),
        ("token_types.weight", w("embeddings.token_type_embeddings.weight", n_types, n_embd), "vector"),
        ("token_embd_norm.weight", w("embeddings.LayerNorm.weight", n_embd), "vector"),
        ("token_embd_norm.bias", w("embeddings.LayerNorm.bias", n_embd), "vector"),
    ]
    for il in range(n_layer):
        hf, blk = f"encoder.layer.{il}.", f"blk.{il}."
        linear = [
            ("attention.self.query", "attn_q", n_embd, n_embd), ("attention.self.key", "attn_k", n_embd, n_embd),
            ("attention.self.value", "attn_v", n_embd, n_embd),
            ("attention.output.dense", "attn_output", n_embd, n_embd),
            ("intermediate.dense", "ffn_up", n_ff, n_embd), ("output.dense", "ffn_down", n_embd, n_ff),
        ]
        for hf_name, g_name, n_out, n_in in linear:
            tensors.append((f"{blk}{g_name}.weight", w(f"{hf}{hf_name}.weight", n_out, n_in), "matrix"))
            tensors.append((f"{blk}{g_name}.bias", w(f"{hf}{hf_name}.bias", n_out), "vector"))
        for hf_name, g_name in [("attention.output.LayerNorm", "attn_output_norm"),
                                ("output.LayerNorm", "layer_output_norm")]:
            tensors.append((f"{blk}{g_name}.weight", w(f"{hf}{hf_name}.weight", n_embd), "vector"))
            tensors.append((f"{blk}{g_name}.bias", w(f"{hf}{hf_name}.bias", n_embd), "vector"))
    pooling = _pooling(src)
    ids = {t: special_id(t) for t in ("[CLS]", "[SEP]", "[UNK]", "[PAD]", "[MASK]")}

    writer = gguf.GGUFWriter(str(dest), "bert")
    try:
        writer.add_name(name or str(config.get("_name_or_path") or src.resolve().name))
        writer.add_file_type({"f32": 0, "f16": 1}[out_type])
        writer.add_context_length(n_ctx)
        writer.add_embedding_length(n_embd)
        writer.add_feed_forward_length(n_ff)
        writer.add_block_count(n_layer)
        writer.add_head_count(n_head)
        writer.add_layer_norm_eps(float(config.get("layer_norm_eps", 1e-12)))
        writer.add_causal_attention(False)
        writer.add_pooling_type(gguf.PoolingType(pooling))

        writer.add_tokenizer_model("bert")
        writer.add_token_list([_phantom(t) for t in tokens])
        writer.add_token_type_count(n_types)
        writer.add_token_types([TOKEN_CONTROL if i in specials else TOKEN_NORMAL for i in range(n_vocab)])
        writer.add_bos_token_id(ids["[CLS]"])
        writer.add_eos_token_id(ids["[SEP]"])
        writer.add_sep_token_id(ids["[SEP]"])
        writer.add_unk_token_id(ids["[UNK]"])
        writer.add_pad_token_id(ids["[PAD]"])
        writer.add_mask_token_id(ids["[MASK]"])
        writer.add_add_bos_token(True)
        writer.add_add_sep_token(True)
        writer.add_bool("tokenizer.ggml.wordpiece.lowercase", lowercase)
        writer.add_bool("tokenizer.ggml.wordpiece.strip_accents", strip_accents)
        writer.add_bool("tokenizer.ggml.wordpiece.chinese_chars", bool(norm.get("handle_chinese_chars", True)))
        writer.add_uint32("tokenizer.ggml.wordpiece.max_input_chars_per_word",
                          int(wp.get("max_input_chars_per_word", 100)))

        for gguf_name, arr, role in tensors:
            kind = "f32" if role == "vector" else out_type
            writer.add_tensor(gguf_name, arr.astype(np.float32 if kind == "f32" else np.float16))

        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:
        writer.close()


# the converters a catalog entry can name (bubo.store.Conversion.converter)
CONVERTERS: dict[str, Callable[..., None]] = {"bert": convert_bert}


def convert_file(src: Path, dest: Path, out_type: str = "f16", name: str = "", converter: str = "bert") -> Path:
    """Convert checkpoint directory `src` to the GGUF file `dest`, written to a temporary file
    beside it, flushed to disk and renamed into place only when complete: on any failure (a
    ConvertError, a full disk, ^C) `dest` is as it was and nothing is left behind."""
    src, dest = Path(src), Path(dest)
    if converter not in CONVERTERS:
        raise ConvertError(f"unknown converter {converter!r} (known: {', '.join(CONVERTERS)})")
    return write_atomically(dest, lambda tmp: CONVERTERS[converter](src, tmp, out_type=out_type, name=name))


def write_atomically(dest: Path, write: Callable[[Path], None]) -> Path:
    """write(a temporary path beside dest), flushed and renamed to dest once whole; on any failure
    dest is as it was and nothing is left behind."""
    if dest.is_dir():
        raise ConvertError(f"{dest} is a directory, not a file name")
    if not dest.parent.is_dir():
        raise FileNotFoundError(f"{dest.parent} (where {dest.name} would go) is not a directory")
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}-{secrets.token_hex(4)}.partial")
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))  # the umask applies, as to dest
    try:
        write(tmp)
        fsync_file(tmp)
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest


# --- LoRA adapters: PEFT checkpoints to llama.cpp's adapter GGUF -------------------------------

# Hugging Face's module names -> the GGUF matrix names (bubo.lora.MATS)
PEFT_MODULES = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
                "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down"}
_PEFT_KEY = re.compile(r"(?:base_model\.model\.)?(?:model\.)?layers\.(\d+)\.(?:self_attn|mlp)\.([a-z_]+)\."
                       r"lora_([AB])(?:\.default)?\.weight")
# the architectures whose converter permutes Q and K rows for RoPE (llama.cpp's LlamaModel does): B's rows follow
_PERMUTED = ("llama",)


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's reordering of a Q or K matrix's rows (each head's halves interleaved)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def convert_lora(src: Path, dest: Path, base: Path, out_type: str = "f32") -> None:
    """Write the GGUF LoRA adapter of the PEFT checkpoint in directory src (adapter_config.json,
    adapter_model.safetensors) for the base model's GGUF file `base` to dest, as llama.cpp's
    convert_lora_to_gguf.py lays it out. Everything is read and checked first: a ConvertError,
    naming the file and what is wrong, leaves dest untouched."""
    import gguf

    from bubo.gguf import GGUFFile

    src = _checkpoint(src, out_type, "a PEFT checkpoint: adapter_config.json, adapter_model.safetensors")
    config = _load_object(src / "adapter_config.json")
    where = src / "adapter_config.json"
    for key in ("use_rslora", "use_dora"):
        if config.get(key):
            raise ConvertError(f"{where}: {key} is not supported (plain LoRA: scale alpha / r)")
    for key in ("rank_pattern", "alpha_pattern"):
        if config.get(key):
            raise ConvertError(f"{where}: {key} is not supported (one rank and one alpha for every matrix)")
    r, alpha = config.get("r"), config.get("lora_alpha")
    if isinstance(r, bool) or not isinstance(r, int) or r <= 0:
        raise ConvertError(f"{where}: r is {r!r}, not a positive integer")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha):
        raise ConvertError(f"{where}: lora_alpha is {alpha!r}, not a number")
    try:
        with GGUFFile(str(base)) as f:
            meta = f.metadata
            shapes = {t.name: tuple(reversed(t.shape)) for t in f.tensors}
    except (OSError, ValueError) as e:
        raise ConvertError(f"{base}: not a readable GGUF model: {e}") from None
    arch = str(meta.get("general.architecture"))
    heads, heads_kv = meta.get(f"{arch}.attention.head_count"), meta.get(f"{arch}.attention.head_count_kv")
    n_head = heads if isinstance(heads, int) else 0
    n_head_kv = heads_kv if isinstance(heads_kv, int) else n_head
    weights = src / "adapter_model.safetensors"
    tensors = read_safetensors(weights)
    halves: dict[tuple[int, str], dict[str, np.ndarray]] = {}
    for key, arr in tensors.items():
        m = _PEFT_KEY.fullmatch(key)
        if m is None or m.group(2) not in PEFT_MODULES:
            raise ConvertError(f"{weights}: tensor {key} is not a LoRA pair of a layer's "
                               f"{'/'.join(PEFT_MODULES)} (embeddings and the output head are not supported)")
        halves.setdefault((int(m.group(1)), PEFT_MODULES[m.group(2)]), {})[m.group(3)] = arr.astype(np.float32)
    if not halves:
        raise ConvertError(f"{weights}: no LoRA tensors")
    out: list[tuple[str, np.ndarray]] = []
    for (il, mat), pair in sorted(halves.items()):
        name = f"blk.{il}.{mat}.weight"
        if set(pair) != {"A", "B"}:
            raise ConvertError(f"{weights}: layer {il}'s {mat} has lora_{next(iter(pair))} but not its other half")
        a, b = pair["A"], pair["B"]
        if name not in shapes:
            raise ConvertError(f"{weights}: layer {il}'s {mat}: the base model {base} has no {name}")
        rows, cols = shapes[name]
        if a.ndim != 2 or b.ndim != 2 or a.shape != (r, cols) or b.shape != (rows, r):
            raise ConvertError(f"{weights}: layer {il}'s {mat}: lora_A is {list(a.shape)} and lora_B "
                               f"{list(b.shape)}; the base's {name} wants [{r}, {cols}] and [{rows}, {r}]")
        if not (np.isfinite(a).all() and np.isfinite(b).all()):
            raise ConvertError(f"{weights}: layer {il}'s {mat} holds values that are not finite")
        if arch in _PERMUTED and mat in ("attn_q", "attn_k"):
            heads = n_head if mat == "attn_q" else n_head_kv
            if heads <= 0 or rows % (2 * heads):
                raise ConvertError(f"{base}: no head count that divides {name}'s {rows} rows ({arch}.attention."
                                   f"head_count{'_kv' if mat == 'attn_k' else ''})")
            b = _permute(b, heads)
        out += [(name + ".lora_a", a), (name + ".lora_b", b)]
    writer = gguf.GGUFWriter(str(dest), arch)
    try:
        writer.add_type(gguf.GGUFType.ADAPTER)
        writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
        writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(alpha))
        base_name = meta.get("general.name")
        if isinstance(base_name, str):
            writer.add_uint32(gguf.Keys.General.BASE_MODEL_COUNT, 1)
            writer.add_string(gguf.Keys.General.BASE_MODEL_NAME.format(id=0), base_name)
        for gguf_name, arr in out:
            writer.add_tensor(gguf_name, np.ascontiguousarray(arr, dtype=np.float32 if out_type == "f32"
                                                              else np.float16))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:
        writer.close()


def convert_lora_file(src: Path, dest: Path, base: Path, out_type: str = "f32") -> Path:
    """convert_lora, written beside dest and renamed into place only when whole."""
    return write_atomically(Path(dest), lambda tmp: convert_lora(Path(src), tmp, Path(base), out_type))


def fsync_file(path: Path) -> None:
    """Flush a written file's data to the disk (before it is renamed into place)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
