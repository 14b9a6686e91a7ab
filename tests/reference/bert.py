"""A float64 numpy BERT encoder, written from the architecture (Devlin et al. 2019; Hugging Face's
BertModel) and reading the checkpoint's own safetensors weights: the oracle for bubo's encoder.

    h0 = LayerNorm(word[ids] + position[0..n) + token_type[0])
    per layer:  a = MultiHead(h) with softmax(Q K^T / sqrt(d_head)) V, no mask (one sequence)
                h = LayerNorm(h + a W_o + b_o)
                h = LayerNorm(h + gelu_erf(h W_i + b_i) W_o2 + b_o2)
    pooled:     mean / [CLS] row / last row, then L2-normalised
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from bubo.convert import read_safetensors

ERF_CLIP = 4.0  # 1 - erf(4) = 1.5e-8: past it the GELU is x or 0 to within 1e-7


def _erf(x: np.ndarray) -> np.ndarray:
    """erf by its Maclaurin series on [-4, 4] (70 terms: the remainder and the cancellation both
    stay under 1e-9), the sign outside: vectorized, where math.erf would be called per element."""
    z = np.clip(x, -ERF_CLIP, ERF_CLIP)
    z2 = z * z
    term = z.copy()  # (-1)^n z^(2n+1) / n!
    total = z.copy()
    for n in range(1, 70):
        term = term * (-z2) / n
        total += term / (2 * n + 1)
    return np.where(np.abs(x) > ERF_CLIP, np.sign(x), total * (2.0 / math.sqrt(math.pi)))


def _layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * w + b


class BertReference:
    def __init__(self, src: Path):
        self.config = json.loads((Path(src) / "config.json").read_text())
        raw = read_safetensors(Path(src) / "model.safetensors")
        self.w = {k: v.astype(np.float64) for k, v in raw.items() if v.dtype.kind == "f"}
        self.n_layer = int(self.config["num_hidden_layers"])
        self.n_head = int(self.config["num_attention_heads"])
        self.eps = float(self.config.get("layer_norm_eps", 1e-12))

    def _lin(self, x: np.ndarray, name: str) -> np.ndarray:
        # torch's Linear: weight [out, in]
        return x @ self.w[name + ".weight"].T + self.w[name + ".bias"]

    def hidden(self, ids: list[int]) -> np.ndarray:
        """Last hidden states [n, hidden] of one sequence of token ids."""
        w, n = self.w, len(ids)
        h = w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][:n]
        h = h + w["embeddings.token_type_embeddings.weight"][0]
        h = _layer_norm(h, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], self.eps)
        d = h.shape[1]
        hd = d // self.n_head
        for il in range(self.n_layer):
            p = f"encoder.layer.{il}."
            q = self._lin(h, p + "attention.self.query").reshape(n, self.n_head, hd).transpose(1, 0, 2)
            k = self._lin(h, p + "attention.self.key").reshape(n, self.n_head, hd).transpose(1, 0, 2)
            v = self._lin(h, p + "attention.self.value").reshape(n, self.n_head, hd).transpose(1, 0, 2)
            s = q @ k.transpose(0, 2, 1) / math.sqrt(hd)
            s = np.exp(s - s.max(axis=-1, keepdims=True))
            s /= s.sum(axis=-1, keepdims=True)
            a = (s @ v).transpose(1, 0, 2).reshape(n, d)
            ln = p + "attention.output.LayerNorm"
            h = h + self._lin(a, p + "attention.output.dense")
            h = _layer_norm(h, w[ln + ".weight"], w[ln + ".bias"], self.eps)
            u = self._lin(h, p + "intermediate.dense")
            u = 0.5 * u * (1.0 + _erf(u / math.sqrt(2.0)))
            h = _layer_norm(h + self._lin(u, p + "output.dense"),
                            w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"], self.eps)
        return h

    def embed(self, ids: list[int], pooling: str = "mean", normalize: bool = True) -> np.ndarray:
        h = self.hidden(ids)
        vec = {"mean": lambda: h.mean(axis=0), "cls": lambda: h[0], "last": lambda: h[-1]}[pooling]()
        return vec / np.linalg.norm(vec) if normalize else vec
