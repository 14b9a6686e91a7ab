"""A numpy forward pass for the decoder-only families bubo runs, written from the architectures'
descriptions (the Llama, Qwen2, Qwen3 and Gemma 3 papers / model cards and their Hugging Face
modeling code), not from bubo's C code: it is the oracle the C forward pass is tested against.

Weights come from a GGUF file through the `gguf` package (GGUFReader + gguf.quants.dequantize),
hyperparameters from its metadata. One sequence, all positions, causal; no KV cache.

Precision: weights are dequantized to float32 (which holds every dequantized value exactly);
activations, norms, RoPE, attention and every matrix product run in float64 (numpy upcasts the
float32 weights inside each product). The output matrix, often the largest tensor, is kept
quantized and dequantized in row chunks while the logits are computed.

GGUF conventions this relies on (from llama.cpp's converter, which wrote the files):
- a matrix is stored with ne = [n_in, n_out], i.e. numpy shape (n_out, n_in): y = x @ W.T;
- llama's Q and K rows are permuted by the converter so that RoPE rotates adjacent pairs
  (x[2i], x[2i+1]) ("normal" RoPE); qwen2, qwen3 and gemma3 keep Hugging Face's layout, where
  RoPE rotates (x[i], x[i + n_rot/2]) ("NeoX" RoPE, rotate_half);
- gemma's RMSNorm multiplies by (1 + w); the converter already stored w + 1, so the weights are
  applied as stored (adding 1 again misses llama.cpp's gemma3:270m logits by ~160).

How close it is to llama.cpp (build 11434), measured once with its C API on the catalog models
with every weight written back as F32 (so llama.cpp multiplies in float without quantizing the
activations) and an F32 KV cache: max |logit diff| 3.4e-5 on smollm2:135m and 1.3e-5 on
qwen2.5-coder:0.5b; 9.6e-2 on gemma3:270m (logit spread 197), of which all but 7.5e-3 is
llama.cpp's GELU, which goes through a float16 table. On the quantized files llama.cpp quantizes
the activations of every product to 8 bits, which moves its logprobs by ~0.1-0.5 nat from these.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import gguf
import numpy as np
from gguf import quants

from .reader import reader

SUPPORTED_ARCHS = ("llama", "qwen2", "qwen3", "gemma3")
NEOX_ARCHS = ("qwen2", "qwen3", "gemma3")

# rows of the output matrix dequantized at a time: bounds the float32/float64 temporaries
OUTPUT_CHUNK_ROWS = 16384


@dataclass
class HParams:
    arch: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int  # key/query head size
    head_dim_v: int  # value head size
    n_ff: int
    n_vocab: int
    rms_eps: float
    n_rot: int  # leading dims of each head that RoPE rotates
    rope_neox: bool
    rope_base: float
    rope_base_swa: float  # RoPE base of the sliding-window layers
    rope_freq_scale: float  # linear RoPE scaling: positions are multiplied by this
    sliding_window: int  # 0: none
    swa_layers: list[bool] = field(default_factory=list)  # per layer: sliding-window attention
    attn_scale: float = 0.0
    embd_scale: float = 1.0
    final_logit_softcap: float = 0.0  # 0: none


def _field(reader: gguf.GGUFReader, key: str, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


def read_hparams(reader: gguf.GGUFReader) -> HParams:
    arch = _field(reader, "general.architecture")
    if arch not in SUPPORTED_ARCHS:
        raise NotImplementedError(f"reference forward pass: architecture {arch!r} not written")

    def kv(name, default=None):
        v = _field(reader, f"{arch}.{name}", default)
        if v is None:
            raise KeyError(f"{arch}.{name} missing")
        return v

    n_embd = int(kv("embedding_length"))
    n_head = int(kv("attention.head_count"))
    n_head_kv = int(kv("attention.head_count_kv", n_head))
    head_dim = int(kv("attention.key_length", n_embd // n_head))
    head_dim_v = int(kv("attention.value_length", head_dim))
    n_layer = int(kv("block_count"))
    emb = next(t for t in reader.tensors if t.name == "token_embd.weight")

    scaling_type = _field(reader, f"{arch}.rope.scaling.type", "none")
    if scaling_type not in ("none", "linear"):
        raise NotImplementedError(f"reference forward pass: RoPE scaling {scaling_type!r} not written")
    scaling_factor = float(_field(reader, f"{arch}.rope.scaling.factor", 1.0) or 1.0)
    freq_scale = 1.0 / scaling_factor if scaling_type == "linear" else 1.0

    sliding_window = int(_field(reader, f"{arch}.attention.sliding_window", 0) or 0)
    swa_layers = [False] * n_layer
    if arch == "gemma3" and sliding_window > 0:
        # Gemma 3: five local (sliding-window) layers, then one global layer, repeated; a file may
        # state the pattern as a period or as one flag per layer
        pattern = _field(reader, f"{arch}.attention.sliding_window_pattern", 6)
        if isinstance(pattern, list):
            swa_layers = [bool(p) for p in pattern]
        else:
            period = int(pattern)
            swa_layers = [period == 0 or (il % period) < period - 1 for il in range(n_layer)]

    hp = HParams(
        arch=arch,
        n_layer=n_layer,
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim=head_dim,
        head_dim_v=head_dim_v,
        n_ff=int(kv("feed_forward_length")),
        n_vocab=int(emb.shape[1]),
        rms_eps=float(kv("attention.layer_norm_rms_epsilon")),
        n_rot=int(kv("rope.dimension_count", head_dim)),
        rope_neox=arch in NEOX_ARCHS,
        rope_base=float(kv("rope.freq_base", 10000.0)),
        # Gemma 3's local layers use RoPE base 10000 unless the file says otherwise
        rope_base_swa=float(_field(reader, f"{arch}.rope.freq_base_swa", 10000.0)),
        rope_freq_scale=freq_scale,
        sliding_window=sliding_window,
        swa_layers=swa_layers,
        final_logit_softcap=float(_field(reader, f"{arch}.final_logit_softcapping", 0.0) or 0.0),
    )
    # Gemma 3 scales queries by query_pre_attn_scalar**-0.5, which is head_dim for the sizes
    # GGUF files describe (27B's n_embd/n_head is the exception and has its own key upstream)
    hp.attn_scale = 1.0 / math.sqrt(hp.head_dim)
    if arch == "gemma3":
        hp.embd_scale = math.sqrt(n_embd)
    return hp


# --- the operations, each written from its definition ----------------------------------------

def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(mean(x^2) + eps) * w over the last axis."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def rope(x: np.ndarray, pos: np.ndarray, n_rot: int, base: float, neox: bool, freq_scale: float = 1.0,
         freq_factors: np.ndarray | None = None) -> np.ndarray:
    """Rotary position embedding of x [T, H, D]: pair i of the first n_rot dims turns by angle
    pos * freq_scale * base^(-2i/n_rot) (divided by freq_factors[i] where the model has them).
    Normal mode pairs (2i, 2i+1); NeoX mode pairs (i, i + n_rot/2)."""
    half = n_rot // 2
    inv_freq = base ** (-np.arange(half, dtype=np.float64) * 2.0 / n_rot)
    if freq_factors is not None:
        inv_freq = inv_freq / freq_factors.astype(np.float64)
    theta = (pos.astype(np.float64) * freq_scale)[:, None] * inv_freq[None, :]  # [T, half]
    cos = np.cos(theta)[:, None, :]
    sin = np.sin(theta)[:, None, :]
    out = x.copy()
    if neox:
        a, b = x[..., :half], x[..., half:n_rot]
        out[..., :half] = a * cos - b * sin
        out[..., half:n_rot] = a * sin + b * cos
    else:
        a, b = x[..., 0:n_rot:2], x[..., 1:n_rot:2]
        out[..., 0:n_rot:2] = a * cos - b * sin
        out[..., 1:n_rot:2] = a * sin + b * cos
    return out


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, window: int) -> np.ndarray:
    """Causal multi-head attention with grouped KV heads. q [T, H, D], k [T, Hkv, D],
    v [T, Hkv, Dv] -> [T, H * Dv]. window > 0: query at position i sees keys j with
    i - window < j <= i (the last `window` positions, itself included)."""
    n_tok, n_head, _ = q.shape
    group = n_head // k.shape[1]
    kh = np.repeat(k, group, axis=1)  # query head h reads KV head h // group
    vh = np.repeat(v, group, axis=1)
    scores = np.einsum("ihd,jhd->hij", q, kh) * scale
    i = np.arange(n_tok)[:, None]
    j = np.arange(n_tok)[None, :]
    visible = j <= i
    if window > 0:
        visible &= (i - j) < window
    scores = np.where(visible[None], scores, -np.inf)
    scores -= scores.max(axis=-1, keepdims=True)
    p = np.exp(scores)
    p /= p.sum(axis=-1, keepdims=True)
    out = np.einsum("hij,jhd->ihd", p, vh)
    return out.reshape(n_tok, -1)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    z = logits.astype(np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


# --- weights ----------------------------------------------------------------------------------

def dequantize_tensor(t, rows: np.ndarray | slice | None = None) -> np.ndarray:
    """A GGUF tensor (or some of its rows) as float32, numpy shape (rows, ne0) for matrices."""
    data = t.data if rows is None else t.data[rows]
    out = quants.dequantize(data, t.tensor_type).astype(np.float32, copy=False)
    if rows is None:
        return out.reshape(tuple(int(n) for n in reversed(t.shape)))
    return out.reshape(-1, int(t.shape[0]))


@dataclass
class Layer:
    attn_norm: np.ndarray
    wq: np.ndarray  # (n_head * head_dim, n_embd)
    wk: np.ndarray  # (n_head_kv * head_dim, n_embd)
    wv: np.ndarray  # (n_head_kv * head_dim_v, n_embd)
    wo: np.ndarray  # (n_embd, n_head * head_dim_v)
    ffn_norm: np.ndarray
    w_gate: np.ndarray  # (n_ff, n_embd)
    w_up: np.ndarray  # (n_ff, n_embd)
    w_down: np.ndarray  # (n_embd, n_ff)
    bq: np.ndarray | None = None  # qwen2's QKV biases
    bk: np.ndarray | None = None
    bv: np.ndarray | None = None
    bo: np.ndarray | None = None
    q_norm: np.ndarray | None = None  # (head_dim,) qwen3 and gemma3: RMSNorm of each head
    k_norm: np.ndarray | None = None
    post_attn_norm: np.ndarray | None = None  # gemma3: norms on the sublayer outputs
    post_ffn_norm: np.ndarray | None = None


class RefModel:
    def __init__(self, path: str):
        self.path = str(path)
        self.reader = reader(self.path)
        self.hp = read_hparams(self.reader)
        self.tensors = {t.name: t for t in self.reader.tensors}
        hp = self.hp

        def w(name):
            return dequantize_tensor(self.tensors[name])

        def opt(name):
            return w(name) if name in self.tensors else None

        self.layers: list[Layer] = []
        for il in range(hp.n_layer):
            p = f"blk.{il}."
            self.layers.append(Layer(
                attn_norm=w(p + "attn_norm.weight"),
                wq=w(p + "attn_q.weight"), wk=w(p + "attn_k.weight"), wv=w(p + "attn_v.weight"),
                wo=w(p + "attn_output.weight"),
                ffn_norm=w(p + "ffn_norm.weight"),
                w_gate=w(p + "ffn_gate.weight"), w_up=w(p + "ffn_up.weight"), w_down=w(p + "ffn_down.weight"),
                bq=opt(p + "attn_q.bias"), bk=opt(p + "attn_k.bias"), bv=opt(p + "attn_v.bias"),
                bo=opt(p + "attn_output.bias"),
                q_norm=opt(p + "attn_q_norm.weight"), k_norm=opt(p + "attn_k_norm.weight"),
                post_attn_norm=opt(p + "post_attention_norm.weight"),
                post_ffn_norm=opt(p + "post_ffw_norm.weight"),
            ))
        self.output_norm = w("output_norm.weight")
        # Llama 3's RoPE scaling arrives as per-frequency divisors
        self.rope_freqs = opt("rope_freqs.weight")
        self.token_embd = self.tensors["token_embd.weight"]
        # no output matrix: the embeddings are tied
        self.output = self.tensors.get("output.weight", self.token_embd)
        # LoRA: (layer, matrix name) -> [(A [r, n_in], B [n_out, r], scale * alpha / r)], in float64
        self.lora: dict[tuple[int, str], list[tuple[np.ndarray, np.ndarray, float]]] = {}

    def add_lora(self, pairs: dict, alpha: float, scale: float) -> None:
        """An adapter's pairs ((layer, matrix name) -> (A, B)) at scale: each adapted product
        gains scale * alpha / r * B (A x), computed in float64."""
        for key, (a, b) in pairs.items():
            coef = scale * alpha / a.shape[0]
            self.lora.setdefault(key, []).append((a.astype(np.float64), b.astype(np.float64), coef))

    def matmul(self, x: np.ndarray, w: np.ndarray, il: int | None = None, name: str | None = None) -> np.ndarray:
        """x [T, n_in] (float64) times the weight w (n_out, n_in) -> [T, n_out], in float64, plus
        layer il's adapters of that matrix (add_lora).
        (w @ x.T).T runs BLAS on w's rows as stored: 2-3x faster than x @ w.T with mixed types."""
        y = (w.astype(np.float64) @ x.T).T
        for a, b, coef in self.lora.get((il, name), ()):  # type: ignore[arg-type]
            y = y + coef * ((x @ a.T) @ b.T)
        return y

    @property
    def n_vocab(self) -> int:
        return self.hp.n_vocab

    def hidden(self, tokens) -> np.ndarray:
        """The final-normed hidden states [n_tokens, n_embd] (float64) of one causal sequence
        starting at position 0."""
        hp = self.hp
        tokens = np.asarray(tokens, dtype=np.int64)
        if tokens.ndim != 1 or len(tokens) == 0:
            raise ValueError("tokens: a non-empty 1-D sequence")
        if tokens.min() < 0 or tokens.max() >= hp.n_vocab:
            raise ValueError(f"token id out of range [0, {hp.n_vocab})")
        n_tok = len(tokens)
        pos = np.arange(n_tok)

        x = dequantize_tensor(self.token_embd, tokens).astype(np.float64) * hp.embd_scale
        for il, L in enumerate(self.layers):
            swa = hp.swa_layers[il] if hp.swa_layers else False
            base = hp.rope_base_swa if swa else hp.rope_base
            # linear RoPE scaling stretches the global layers only on models with local ones
            freq_scale = 1.0 if swa else hp.rope_freq_scale

            # --- attention
            h = rms_norm(x, L.attn_norm, hp.rms_eps)
            q = self.matmul(h, L.wq, il, "attn_q")
            k = self.matmul(h, L.wk, il, "attn_k")
            v = self.matmul(h, L.wv, il, "attn_v")
            if L.bq is not None:
                q, k, v = q + L.bq, k + L.bk, v + L.bv
            q = q.reshape(n_tok, hp.n_head, hp.head_dim)
            k = k.reshape(n_tok, hp.n_head_kv, hp.head_dim)
            v = v.reshape(n_tok, hp.n_head_kv, hp.head_dim_v)
            if L.q_norm is not None:
                q = rms_norm(q, L.q_norm, hp.rms_eps)
                k = rms_norm(k, L.k_norm, hp.rms_eps)
            q = rope(q, pos, hp.n_rot, base, hp.rope_neox, freq_scale, self.rope_freqs)
            k = rope(k, pos, hp.n_rot, base, hp.rope_neox, freq_scale, self.rope_freqs)
            att = attention(q, k, v, hp.attn_scale, hp.sliding_window if swa else 0)
            o = self.matmul(att, L.wo, il, "attn_output")
            if L.bo is not None:
                o = o + L.bo
            if L.post_attn_norm is not None:
                o = rms_norm(o, L.post_attn_norm, hp.rms_eps)
            x = x + o

            # --- feed-forward: act(gate) * up, then down
            h = rms_norm(x, L.ffn_norm, hp.rms_eps)
            gate = self.matmul(h, L.w_gate, il, "ffn_gate")
            up = self.matmul(h, L.w_up, il, "ffn_up")
            act = gelu_tanh(gate) if hp.arch == "gemma3" else silu(gate)
            f = self.matmul(act * up, L.w_down, il, "ffn_down")
            if L.post_ffn_norm is not None:
                f = rms_norm(f, L.post_ffn_norm, hp.rms_eps)
            x = x + f

        return rms_norm(x, self.output_norm, hp.rms_eps)

    def logits(self, tokens, rows=None) -> np.ndarray:
        """Logits [n_rows, n_vocab] (float64) of one causal sequence starting at position 0:
        every position, or only the positions in `rows` (an index or slice, e.g. [-1])."""
        hp = self.hp
        x = self.hidden(tokens)
        if rows is not None:
            x = x[rows]
        out = np.empty((x.shape[0], hp.n_vocab), dtype=np.float64)
        for r0 in range(0, hp.n_vocab, OUTPUT_CHUNK_ROWS):
            r1 = min(r0 + OUTPUT_CHUNK_ROWS, hp.n_vocab)
            out[:, r0:r1] = self.matmul(x, dequantize_tensor(self.output, slice(r0, r1)))
        if hp.final_logit_softcap > 0:
            out = hp.final_logit_softcap * np.tanh(out / hp.final_logit_softcap)
        return out

    def logprobs(self, tokens, rows=None) -> np.ndarray:
        return log_softmax(self.logits(tokens, rows))


def load(path) -> RefModel:
    return RefModel(path)
