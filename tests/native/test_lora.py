"""LoRA adapters in the native forward pass (bubo/lora.py, csrc/model/lora.c) against the float64
numpy reference of the adapted model (tests/reference: the base dequantized with `gguf`, plus
scale * alpha / r * B (A x) in float64), on every architecture's tiny model and on smollm2:135m and
qwen2.5-coder:0.5b; a scale of 0 is the base bit for bit; two adapters at once; a batch that mixes
adapters gives each row the bits it gets alone; every malformed adapter is refused, naming what is
wrong. No public adapter of the catalog models can be fetched here: the adapters are random, written
in llama.cpp's layout (tests/reference/lora.py)."""
from __future__ import annotations

import numpy as np
import pytest

from bubo import lora
from bubo._model import MAX_LORA, KVCache, Model
from bubo._tokenizer import Tokenizer
from bubo.gguf import GGUFFile

from engines import THREADS
from reference import load
from reference.lora import MATS, as_read, random_pairs, write_adapter
from reference.tiny import write_tiny_model

PROMPT = ("The quick brown fox jumps over the lazy dog, and the dog sleeps in the sun while "
          "the fox runs home to the old house by the river.")
FLOAT_SPREAD_FRACTION = 1e-4  # float weights: float32 rounding (as test_model_tiny)
QUANT_SPREAD_FRACTION = 0.05  # quantized real models: 8-bit activations (as test_model_reference)
MIN_EFFECT = 0.1  # the adapters move logits by at least this fraction of the spread: a test that can fail


def _meta(path) -> dict:
    with GGUFFile(str(path)) as f:
        return f.metadata


def _adapted(model_path, adapters, n_threads=THREADS):
    """A Model with adapters [(path, ...)] installed in slots 0.."""
    m = Model(str(model_path), n_threads=n_threads)
    for slot, path in enumerate(adapters):
        a = lora.read_adapter(path)
        lora.check_adapter(a, m, _meta(model_path))
        lora.install(m, slot, a)
    return m


def _decode(m, tokens, scales=None):
    n = len(tokens)
    kv = KVCache(m, n_ctx=max(n, 64), type="f32")
    rows = None if scales is None else np.tile(np.asarray(scales, np.float32), (n, 1))
    return m.decode(kv, tokens, np.arange(n), np.zeros(n), np.ones(n, bool), lora_scales=rows)


def _scales(**given) -> list[float]:
    out = [0.0] * MAX_LORA
    for slot, s in given.items():
        out[int(slot[1:])] = s
    return out


def _relative(ours, theirs):
    spread = theirs.max(1) - theirs.min(1)
    return float((np.abs(ours - theirs).max(1) / spread).max())


def _reference(model_path, adapters, tokens, rows=None):
    """(the adapted reference's logits, the base reference's): adapters [(pairs, alpha, scale)]."""
    ref = load(model_path)
    base = ref.logits(tokens, rows)
    for pairs, alpha, scale in adapters:
        ref.add_lora(pairs, alpha, scale)
    return ref.logits(tokens, rows), base


@pytest.mark.parametrize("arch, dtype, rank", [("llama", "F32", 4), ("qwen2", "F16", 8), ("qwen3", "BF16", 16),
                                               ("gemma3", "Q8_0", 32)])
def test_adapted_logits_match_the_reference(tmp_path, arch, dtype, rank):
    mp = write_tiny_model(tmp_path / "m.gguf", arch, types="F32")
    pairs = random_pairs(mp, rank, seed=1)
    ap = write_adapter(tmp_path / "a.gguf", mp, pairs, alpha=2.0 * rank, dtype=dtype)
    tokens = Tokenizer(mp).encode(PROMPT, add_special=False)
    ours = _decode(_adapted(mp, [ap]), tokens, _scales(s0=0.7))
    theirs, base = _reference(mp, [(as_read(pairs, dtype), 2.0 * rank, 0.7)], tokens)
    assert _relative(ours, theirs) < FLOAT_SPREAD_FRACTION
    assert _relative(base, theirs) > MIN_EFFECT


def test_two_adapters_at_once_a_subset_and_scale_zero(tmp_path):
    mp = write_tiny_model(tmp_path / "m.gguf", "qwen2", types="Q8_0")
    every = random_pairs(mp, 8, seed=2)
    some = random_pairs(mp, 4, mats=("attn_q", "attn_v", "ffn_down"), layers=[0, 2], seed=3, std=0.2)
    a0 = write_adapter(tmp_path / "every.gguf", mp, every, alpha=8.0)
    a1 = write_adapter(tmp_path / "some.gguf", mp, some, alpha=4.0)
    tokens = Tokenizer(mp).encode(PROMPT, add_special=False)
    m = _adapted(mp, [a0, a1])
    both = _decode(m, tokens, _scales(s0=0.5, s1=-1.5))
    theirs, base = _reference(mp, [(every, 8.0, 0.5), (some, 4.0, -1.5)], tokens)
    assert _relative(both, theirs) < QUANT_SPREAD_FRACTION and _relative(base, theirs) > MIN_EFFECT
    # quantized base: the C side's 8-bit activations; the adapters' own products are f32 beside it
    plain = _decode(Model(str(mp), n_threads=THREADS), tokens)
    assert np.array_equal(_decode(m, tokens, _scales()), plain)  # scale 0: the base, bit for bit
    assert np.array_equal(_decode(m, tokens), plain)


def test_a_batch_mixing_adapters_gives_each_row_its_own_bits(tmp_path):
    mp = write_tiny_model(tmp_path / "m.gguf", "llama")
    a0 = write_adapter(tmp_path / "a0.gguf", mp, random_pairs(mp, 8, seed=4), alpha=8.0)
    a1 = write_adapter(tmp_path / "a1.gguf", mp, random_pairs(mp, 4, mats=("ffn_up",), seed=5), alpha=4.0)
    m = _adapted(mp, [a0, a1], n_threads=2)
    tokens = Tokenizer(mp).encode(PROMPT, add_special=False)[:20]
    sets = [_scales(), _scales(s0=1.0), _scales(s0=0.25, s1=2.0), _scales(s1=1.0)]
    alone = [_decode(m, tokens, s) for s in sets]
    # the four sequences' prompts in one batch, interleaved token by token
    n, k = len(tokens), len(sets)
    kv = KVCache(m, n_ctx=256, n_seq_max=k, type="f32")
    order = [(t, q) for t in range(n) for q in range(k)]
    got = m.decode(kv, [tokens[t] for t, _ in order], [t for t, _ in order], [q for _, q in order],
                   np.ones(n * k, bool), lora_scales=np.array([sets[q] for _, q in order], np.float32))
    for q in range(k):
        assert np.array_equal(got[q::k], alone[q]), q
    assert not np.array_equal(alone[0], alone[1]) and not np.array_equal(alone[1], alone[2])


@pytest.mark.models
@pytest.mark.parametrize("name, mats", [("smollm2:135m", MATS), ("qwen2.5-coder:0.5b", ("attn_q", "attn_v", "ffn_up"))])
def test_real_models_adapted_match_the_reference(tmp_path, catalog_model, name, mats):
    mp = catalog_model(name)
    pairs = random_pairs(mp, 16, mats=mats, seed=6, std=0.02)
    ap = write_adapter(tmp_path / "a.gguf", mp, pairs, alpha=32.0, dtype="F16")
    tokens = Tokenizer(str(mp)).encode(PROMPT)[:8]
    m = _adapted(mp, [ap])
    m.output_hidden = True  # the final normed hidden rows: what the (unadapted) output matrix multiplies
    ours, plain = _decode(m, tokens, _scales(s0=1.0))[-2:], _decode(m, tokens)[-2:]
    ref = load(mp)  # (the reference's own base costs a second pass: the C side's base shows the effect)
    ref.add_lora(as_read(pairs, "F16"), 32.0, 1.0)
    theirs = ref.hidden(tokens)[-2:]
    assert _relative(ours, theirs) < QUANT_SPREAD_FRACTION
    assert _relative(plain, theirs) > MIN_EFFECT


def _bad(tmp_path, mp, **kw):
    pairs = kw.pop("pairs", None) or random_pairs(mp, 4, mats=("attn_q",), seed=7)
    return write_adapter(tmp_path / "bad.gguf", mp, pairs, **kw)


@pytest.mark.parametrize("case, says", [
    ("not_lora", "not a LoRA adapter"),
    ("other_arch", "an adapter of a qwen2 model; this model is llama"),
    ("other_base", "an adapter of 'some-other-model'"),
    ("half", "has lora_a but not its other half"),
    ("rank", "their rank"),
    ("cols", "blk.0.attn_q.weight.lora_a is [4, 32]; the model's blk.0.attn_q.weight takes 64 inputs"),
    ("rows", "blk.0.attn_q.weight.lora_b is [32, 4]; the model's blk.0.attn_q.weight has 64 outputs"),
    ("layer", "blk.9.attn_q.weight.lora_a: the model has 3 layers"),
    ("stray", "tensor token_embd.weight.lora_a is not a LoRA pair"),
    ("nan", "not finite"),
    ("not_gguf", "not a readable GGUF file"),
])
def test_every_malformed_adapter_is_refused_naming_what_is_wrong(tmp_path, case, says):
    mp = write_tiny_model(tmp_path / "m.gguf", "llama", types="F32")
    rng = np.random.default_rng(0)
    a4, b4 = (rng.normal(size=(4, 64)).astype(np.float32), rng.normal(size=(64, 4)).astype(np.float32))
    if case == "not_lora":
        path = _bad(tmp_path, mp, adapter_type="control_vector")
    elif case == "other_arch":
        path = _bad(tmp_path, mp, arch="qwen2")
    elif case == "other_base":
        path = _bad(tmp_path, mp, base_name="some-other-model")
    elif case == "half":
        path = _bad(tmp_path, mp, pairs={(0, "attn_q"): (a4, b4)},
                    extra={"blk.1.attn_k.weight.lora_a": a4})
    elif case == "rank":
        path = _bad(tmp_path, mp, pairs={(0, "attn_q"): (a4, rng.normal(size=(64, 5)).astype(np.float32))})
    elif case == "cols":
        path = _bad(tmp_path, mp, pairs={(0, "attn_q"): (a4[:, :32].copy(), b4)})
    elif case == "rows":
        path = _bad(tmp_path, mp, pairs={(0, "attn_q"): (a4, b4[:32].copy())})
    elif case == "layer":
        path = _bad(tmp_path, mp, pairs={(9, "attn_q"): (a4, b4)})
    elif case == "stray":
        path = _bad(tmp_path, mp, extra={"token_embd.weight.lora_a": a4})
    elif case == "nan":
        a4[1, 2] = np.nan
        path = _bad(tmp_path, mp, pairs={(0, "attn_q"): (a4, b4)})
    else:
        path = tmp_path / "bad.gguf"
        path.write_bytes(b"GGUF\x03\x00\x00\x00truncated")
    m = Model(str(mp), n_threads=1)
    with pytest.raises(lora.AdapterError, match=None) as e:
        lora.check_adapter(lora.read_adapter(path), m, _meta(mp))
    assert says in str(e.value) and str(path) in str(e.value), str(e.value)


def test_the_native_side_refuses_what_it_cannot_use(tmp_path):
    mp = write_tiny_model(tmp_path / "m.gguf", "llama", types="F32")
    m = Model(str(mp), n_threads=1)
    a, b = np.ones((4, 64), np.float32), np.ones((64, 4), np.float32)
    for args, says in (((MAX_LORA, 0, 0, a, b, 1.0), "slot"), ((0, 7, 0, a, b, 1.0), "layer"),
                       ((0, 0, 0, a[:, :8], b, 1.0), "must be [r, 64]")):
        with pytest.raises(ValueError, match=None) as e:
            m.lora_set(*args)
        assert says in str(e.value), str(e.value)
    tokens = [5, 6, 7]
    with pytest.raises(ValueError, match="slot 3 is empty"):
        _decode(m, tokens, _scales(s3=1.0))
    m.lora_set(0, 0, 0, a, b, 1.0)
    with pytest.raises(ValueError, match="not a finite number"):
        _decode(m, tokens, _scales(s0=float("inf")))
