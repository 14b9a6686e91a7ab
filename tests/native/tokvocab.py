"""Tiny GGUF tokenizers written with gguf.GGUFWriter, for the edge cases real vocabularies do not
isolate: merge order, score order, byte fallback, the unknown token, special-token matching,
bad metadata. Independent of bubo."""

from __future__ import annotations

import os
import tempfile

import gguf

TT = gguf.TokenType

# GPT-2's byte-level alphabet, written out the way the reference does it (bytes_to_unicode)
_PRINTABLE = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))


def byte_alphabet() -> list[str]:
    """BYTE_CHAR[b] is the character byte-level BPE shows for byte b."""
    cs = {b: b for b in _PRINTABLE}
    n = 0
    for b in range(256):
        if b not in cs:
            cs[b] = 256 + n
            n += 1
    return [chr(cs[b]) for b in range(256)]


BYTE_CHAR = byte_alphabet()


def bl(text: str) -> str:
    """text in the byte-level alphabet, as BPE vocabularies store it ("Ġhello" for " hello")."""
    return "".join(BYTE_CHAR[b] for b in text.encode("utf-8"))


def write_gguf(kv: dict) -> bytes:
    """A GGUF image holding only the given metadata: key -> (GGUFValueType, value)."""
    fd, path = tempfile.mkstemp(suffix=".gguf")
    os.close(fd)
    try:
        w = gguf.GGUFWriter(path, arch="llama")
        for key, (vtype, value) in kv.items():
            if vtype == gguf.GGUFValueType.ARRAY:
                w.add_array(key, value)
            else:
                w.add_key_value(key, value, vtype)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        with open(path, "rb") as f:
            return f.read()
    finally:
        os.unlink(path)


VT = gguf.GGUFValueType


def bpe_kv(extra_tokens: list[str], merges: list[str], pre: str | None = "gpt-2", types: dict[str, int] | None = None,
           **more) -> dict:
    """A byte-level BPE vocabulary: the 256 alphabet characters, then extra_tokens (given in the
    byte-level alphabet already), with the given merges and per-token types."""
    tokens = BYTE_CHAR + extra_tokens
    types = types or {}
    if not merges:
        # GGUFWriter does not write empty arrays; a merge of bytes 00 01 changes no test text
        merges = [BYTE_CHAR[0] + " " + BYTE_CHAR[1]]
    kv = {
        "tokenizer.ggml.model": (VT.STRING, "gpt2"),
        "tokenizer.ggml.tokens": (VT.ARRAY, tokens),
        "tokenizer.ggml.token_type": (VT.ARRAY, [int(types.get(t, TT.NORMAL)) for t in tokens]),
        "tokenizer.ggml.merges": (VT.ARRAY, merges),
    }
    if pre is not None:
        kv["tokenizer.ggml.pre"] = (VT.STRING, pre)
    kv.update(more)
    return kv


def spm_kv(pieces: list[tuple[str, float, int]], byte_tokens: bool = True, **more) -> dict:
    """A SentencePiece vocabulary: <unk> <s> </s>, optionally the 256 <0xXX> byte tokens, then
    pieces as (text, score, token type)."""
    tokens = [("<unk>", 0.0, TT.UNKNOWN), ("<s>", 0.0, TT.CONTROL), ("</s>", 0.0, TT.CONTROL)]
    if byte_tokens:
        tokens += [(f"<0x{b:02X}>", 0.0, TT.BYTE) for b in range(256)]
    tokens += pieces
    kv = {
        "tokenizer.ggml.model": (VT.STRING, "llama"),
        "tokenizer.ggml.tokens": (VT.ARRAY, [t for t, _, _ in tokens]),
        "tokenizer.ggml.scores": (VT.ARRAY, [float(s) for _, s, _ in tokens]),
        "tokenizer.ggml.token_type": (VT.ARRAY, [int(k) for _, _, k in tokens]),
    }
    kv.update(more)
    return kv


WPM_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def wpm_kv(vocab: list[str], **more) -> dict:
    """A WordPiece vocabulary laid out as llama.cpp's converter (and bubo.convert) lay out BERT's:
    [PAD] [UNK] [CLS] [SEP] [MASK] (control tokens, ids 0-4), then vocab given in vocab.txt form
    ("the", "##ing"), stored in the "phantom space" form ("\u2581the", "ing")."""
    tokens = WPM_SPECIALS + [t[2:] if t.startswith("##") else "\u2581" + t for t in vocab]
    kv = {
        "tokenizer.ggml.model": (VT.STRING, "bert"),
        "tokenizer.ggml.tokens": (VT.ARRAY, tokens),
        "tokenizer.ggml.token_type": (VT.ARRAY, [int(TT.CONTROL)] * 5 + [int(TT.NORMAL)] * len(vocab)),
        "tokenizer.ggml.padding_token_id": (VT.UINT32, 0),
        "tokenizer.ggml.unknown_token_id": (VT.UINT32, 1),
        "tokenizer.ggml.bos_token_id": (VT.UINT32, 2),
        "tokenizer.ggml.eos_token_id": (VT.UINT32, 3),
        "tokenizer.ggml.seperator_token_id": (VT.UINT32, 3),
        "tokenizer.ggml.mask_token_id": (VT.UINT32, 4),
    }
    kv.update(more)
    return kv
