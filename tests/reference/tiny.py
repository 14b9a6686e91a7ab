"""Tiny GGUF models of each family (llama, qwen2, qwen3, gemma3) with random weights from a fixed
seed, written with gguf.GGUFWriter, so that the C forward pass can be compared with the numpy
reference on every architecture in seconds. Each file has complete byte-level BPE tokenizer
metadata (a vocabulary trained on a few sentences), so bubo's Tokenizer loads it too.

Weights the `gguf` package can quantize (F32, F16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1) are quantized
from normal samples; the k-quants, which it cannot quantize, are written as random blocks with
their float16 scales set so the weights have the requested spread and zero mean: random bits are
as good a test of a dequantizer and a dot product as quantized normals.

Checked once with llama.cpp (build 11434, its C API, F32 KV cache) on the 29-token prompt of
tests/native/test_reference.py: with types="F32" its logits match the reference within 8e-6
(llama, qwen2, qwen3) and 3.5e-3 (gemma3, window 8: its GELU goes through a float16 table).
With quantized matrices llama.cpp also quantizes the activations to 8 bits: on these random
models that moves logits by 0.2-1.1 (spread ~60) and flips about one argmax in 30, so a tight
comparison of a C forward pass with the reference wants float weights or a float64 emulation of
the same activation quantization.
"""

from __future__ import annotations

import math
import os
from collections import Counter

import gguf
import numpy as np
from gguf import quants

QT = gguf.GGMLQuantizationType

MATRICES = ("token_embd", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down", "output")

# a mix the 64-wide models can hold (rows of 64 or 128: 32-blocks only)
MIXED_TYPES = {
    "token_embd": "Q8_0", "attn_q": "F16", "attn_k": "F16", "attn_v": "Q8_0", "attn_output": "F32",
    "ffn_gate": "Q8_0", "ffn_up": "F16", "ffn_down": "Q8_0", "output": "F16",
}
# for n_embd=256 models: rows of 256 / 512 take the 256-blocks of the k-quants
KQUANT_TYPES = {
    "token_embd": "Q4_K", "attn_q": "Q4_K", "attn_k": "Q5_0", "attn_v": "Q6_K", "attn_output": "Q4_1",
    "ffn_gate": "Q5_0", "ffn_up": "Q4_K", "ffn_down": "Q6_K", "output": "Q6_K",
}
# the n_embd=256 variant's shapes: every row length a multiple of 256
KQUANT_DIMS = dict(n_embd=256, n_head=4, n_head_kv=2, head_dim=64, n_ff=512)

# offsets of the float16 super-block scales (d, and dmin where the type has minimums) in each
# k-quant block, from ggml's block structs
_KQUANT_SCALES = {
    QT.Q2_K: (80, 82),  # scales[16] qs[64] d dmin
    QT.Q3_K: (108, None),  # hmask[32] qs[64] scales[12] d
    QT.Q4_K: (0, 2),  # d dmin scales[12] qs[128]
    QT.Q5_K: (0, 2),  # d dmin scales[12] qh[32] qs[128]
    QT.Q6_K: (208, None),  # ql[128] qh[64] scales[16] d
}

OUTPUT_GAIN = 8.0

CORPUS = (
    "The quick brown fox jumps over the lazy dog. The dog sleeps in the sun, and the fox runs "
    "into the forest. Once upon a time there was a little model that wanted to learn to speak. "
    "It read the words of the world and then it began to write them: hello world, hello there!"
)
N_MERGES = 56
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


# --- tokenizer --------------------------------------------------------------------------------

def byte_alphabet() -> list[str]:
    """GPT-2's bytes_to_unicode: the printable character byte-level BPE shows for each byte."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    chars = {b: b for b in printable}
    n = 0
    for b in range(256):
        if b not in chars:
            chars[b] = 256 + n
            n += 1
    return [chr(chars[b]) for b in range(256)]


def train_bpe(text: str, n_merges: int) -> list[tuple[str, str]]:
    """Byte-level BPE merges learned from text: words split GPT-2 style (a space joins the word
    after it), then the most frequent adjacent pair merged, n_merges times (ties: the smaller
    pair first, so the result does not depend on dict order)."""
    alphabet = byte_alphabet()
    words = Counter()
    for i, w in enumerate(text.split(" ")):
        words[tuple(alphabet[b] for b in (w if i == 0 else " " + w).encode())] += 1
    merges = []
    for _ in range(n_merges):
        pairs = Counter()
        for w, c in words.items():
            for a, b in zip(w, w[1:]):
                pairs[(a, b)] += c
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merges.append(best)
        merged = Counter()
        for w, c in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    out.append(w[i] + w[i + 1])
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            merged[tuple(out)] += c
        words = merged
    return merges


def tokenizer_metadata(n_merges: int = N_MERGES) -> tuple[list[str], list[int], list[str]]:
    """(tokens, token types, merges): 256 byte tokens, one per merge, then the special tokens."""
    merges = train_bpe(CORPUS, n_merges)
    tokens = byte_alphabet() + [a + b for a, b in merges] + list(SPECIAL_TOKENS)
    types = [int(gguf.TokenType.NORMAL)] * (len(tokens) - len(SPECIAL_TOKENS))
    types += [int(gguf.TokenType.CONTROL)] * len(SPECIAL_TOKENS)
    return tokens, types, [f"{a} {b}" for a, b in merges]


# --- weights ----------------------------------------------------------------------------------

def _random_kquant(rng: np.random.Generator, n_rows: int, n_cols: int, qtype, std: float) -> np.ndarray:
    """Random k-quant blocks whose dequantized values have mean ~0 and the given std."""
    block, nbytes = gguf.GGML_QUANT_SIZES[qtype]
    d_at, dmin_at = _KQUANT_SCALES[qtype]
    n_blocks = n_rows * n_cols // block
    raw = rng.integers(0, 256, size=(n_blocks, nbytes), dtype=np.uint8)

    def set_f16(at, values):
        raw[:, at:at + 2] = np.asarray(values, dtype=np.float16).reshape(-1, 1).view(np.uint8).reshape(-1, 2)

    def values():
        return quants.dequantize(raw, qtype).reshape(n_blocks, block).astype(np.float64)

    ones = np.ones(n_blocks)
    set_f16(d_at, ones)
    if dmin_at is not None:
        # values = d * (scale * q) - dmin * min: pick dmin per block to cancel the mean
        set_f16(dmin_at, 0 * ones)
        scaled = values().mean(axis=1)
        set_f16(d_at, 0 * ones)
        set_f16(dmin_at, ones)
        mins = -values().mean(axis=1)
        dmin = scaled / np.maximum(mins, 1e-6)
        set_f16(d_at, ones)
        set_f16(dmin_at, dmin)
    v = values()
    gain = std / max(float(v.std()), 1e-12)
    d = raw[:, d_at:d_at + 2].copy().view(np.float16).astype(np.float64).ravel()
    set_f16(d_at, d * gain)
    if dmin_at is not None:
        dm = raw[:, dmin_at:dmin_at + 2].copy().view(np.float16).astype(np.float64).ravel()
        set_f16(dmin_at, dm * gain)
    return raw.reshape(n_rows, -1)


def _add_matrix(w: gguf.GGUFWriter, rng: np.random.Generator, name: str, n_rows: int, n_cols: int,
                type_name: str, std: float) -> None:
    """A matrix of numpy shape (n_rows, n_cols) (GGUF ne = [n_cols, n_rows]) of the given type."""
    qtype = QT[type_name]
    block, _ = gguf.GGML_QUANT_SIZES[qtype]
    if n_cols % block:
        raise ValueError(f"{name}: rows of {n_cols} do not split into {type_name} blocks of {block}")
    if qtype in _KQUANT_SCALES:
        w.add_tensor(name, _random_kquant(rng, n_rows, n_cols, qtype, std),
                     raw_dtype=qtype)
        return
    x = (rng.standard_normal((n_rows, n_cols)) * std).astype(np.float32)
    if qtype == QT.F32:
        w.add_tensor(name, x)
    elif qtype == QT.F16:
        w.add_tensor(name, x.astype(np.float16))
    else:
        w.add_tensor(name, quants.quantize(x, qtype), raw_dtype=qtype)


def _add_vector(w: gguf.GGUFWriter, rng: np.random.Generator, name: str, n: int, mean: float, std: float) -> None:
    w.add_tensor(name, (mean + rng.standard_normal(n) * std).astype(np.float32))


# --- the model --------------------------------------------------------------------------------

def write_tiny_model(path, arch: str, *, seed: int = 0, n_embd: int = 64, n_head: int = 4, n_head_kv: int = 2,
                     head_dim: int = 16, n_ff: int = 128, n_layer: int | None = None, n_ctx: int = 256,
                     rope_base: float | None = None, rms_eps: float = 1e-6, sliding_window: int = 8,
                     swa_pattern: int | None = None, tied: bool | None = None,
                     types: dict[str, str] | str | None = None) -> str:
    """Write a tiny random model of `arch` (llama, qwen2, qwen3, gemma3) to path and return path.

    types: one type name for every matrix, or a dict matrix -> type name (keys of MATRICES;
    missing ones F32); default MIXED_TYPES. Norm weights and biases are F32.
    gemma3: `sliding_window` tokens for the local layers; n_layer defaults to 6 and no pattern
    key is written, so that, as in Google's files, layers 0-4 are local and layer 5 global;
    swa_pattern=k writes `gemma3.attention.sliding_window_pattern` = k (every k-th layer global).
    Tied (no output.weight) by default for gemma3 only."""
    if arch not in ("llama", "qwen2", "qwen3", "gemma3"):
        raise ValueError(f"no tiny writer for {arch!r}")
    is_gemma = arch == "gemma3"
    n_layer = n_layer if n_layer is not None else (6 if is_gemma else 3)
    tied = is_gemma if tied is None else tied
    rope_base = rope_base if rope_base is not None else (1e6 if is_gemma else 1e4)
    if isinstance(types, str):
        types = {m: types for m in MATRICES}
    types = {m: (types or MIXED_TYPES).get(m, "F32") for m in MATRICES}

    tokens, token_types, merges = tokenizer_metadata()
    n_vocab = len(tokens)
    rng = np.random.default_rng(seed)
    path = os.fspath(path)
    w = gguf.GGUFWriter(path, arch=arch)
    w.add_name(f"tiny-{arch}")
    w.add_context_length(n_ctx)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_layer_norm_rms_eps(rms_eps)
    w.add_rope_freq_base(rope_base)
    w.add_rope_dimension_count(head_dim)
    w.add_vocab_size(n_vocab)
    if is_gemma:
        w.add_sliding_window(sliding_window)
        if swa_pattern is not None:
            w.add_uint32(f"{arch}.attention.sliding_window_pattern", swa_pattern)

    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types(token_types)
    w.add_token_merges(merges)
    w.add_bos_token_id(tokens.index("<|endoftext|>"))
    w.add_eos_token_id(tokens.index("<|im_end|>"))
    w.add_add_bos_token(is_gemma)

    q_dim, kv_dim = n_head * head_dim, n_head_kv * head_dim
    # 1/sqrt(fan-in) keeps activations O(1) through the layers; a wider spread of the output
    # (or tied embedding) rows keeps the argmax of most positions clear of near-ties
    _add_matrix(w, rng, "token_embd.weight", n_vocab, n_embd, types["token_embd"], OUTPUT_GAIN / math.sqrt(n_embd))
    for il in range(n_layer):
        p = f"blk.{il}."
        _add_vector(w, rng, p + "attn_norm.weight", n_embd, 1.0, 0.1)
        _add_matrix(w, rng, p + "attn_q.weight", q_dim, n_embd, types["attn_q"], 1 / math.sqrt(n_embd))
        _add_matrix(w, rng, p + "attn_k.weight", kv_dim, n_embd, types["attn_k"], 1 / math.sqrt(n_embd))
        _add_matrix(w, rng, p + "attn_v.weight", kv_dim, n_embd, types["attn_v"], 1 / math.sqrt(n_embd))
        _add_matrix(w, rng, p + "attn_output.weight", n_embd, q_dim, types["attn_output"], 1 / math.sqrt(q_dim))
        if arch == "qwen2":
            for t, n in (("q", q_dim), ("k", kv_dim), ("v", kv_dim)):
                _add_vector(w, rng, p + f"attn_{t}.bias", n, 0.0, 0.1)
        if arch in ("qwen3", "gemma3"):
            _add_vector(w, rng, p + "attn_q_norm.weight", head_dim, 1.0, 0.1)
            _add_vector(w, rng, p + "attn_k_norm.weight", head_dim, 1.0, 0.1)
        if is_gemma:
            _add_vector(w, rng, p + "post_attention_norm.weight", n_embd, 1.0, 0.1)
        _add_vector(w, rng, p + "ffn_norm.weight", n_embd, 1.0, 0.1)
        _add_matrix(w, rng, p + "ffn_gate.weight", n_ff, n_embd, types["ffn_gate"], 1 / math.sqrt(n_embd))
        _add_matrix(w, rng, p + "ffn_up.weight", n_ff, n_embd, types["ffn_up"], 1 / math.sqrt(n_embd))
        _add_matrix(w, rng, p + "ffn_down.weight", n_embd, n_ff, types["ffn_down"], 1 / math.sqrt(n_ff))
        if is_gemma:
            _add_vector(w, rng, p + "post_ffw_norm.weight", n_embd, 1.0, 0.1)
    _add_vector(w, rng, "output_norm.weight", n_embd, 1.0, 0.1)
    if not tied:
        _add_matrix(w, rng, "output.weight", n_vocab, n_embd, types["output"], OUTPUT_GAIN / math.sqrt(n_embd))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
