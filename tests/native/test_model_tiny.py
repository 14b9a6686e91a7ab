"""The C forward pass against the float64 numpy reference (tests/reference) on tiny random models
of every family the model loader knows: llama, qwen2 (QKV bias), qwen3 (QK-norm), gemma3 (window
8, shorter than the 40-token prompt, so local and global layers both matter).

With float weights (F32) nothing is quantized on the C side but the f16 KV cache (here f32, so
not even that): the logits must agree to float32 rounding. With quantized weights the C side also
rounds every activation to 8 bits, as llama.cpp does, so the bound is a fraction of the logit
spread and the argmax may differ only where the reference's top two are closer than twice the
row's largest deviation (the only way a bounded error can swap them), at a few positions."""
import numpy as np
import pytest

from bubo._model import KVCache, Model
from bubo._tokenizer import Tokenizer

from engines import THREADS
from reference import load
from reference.tiny import KQUANT_DIMS, KQUANT_TYPES, write_tiny_model

ARCHS = ["llama", "qwen2", "qwen3", "gemma3"]
PROMPT = ("The quick brown fox jumps over the lazy dog, and the dog sleeps in the sun while "
          "the fox runs home to the old house by the river.")
# float weights: |C - reference| / logit spread per row (float32 products, float32 softmax)
FLOAT_SPREAD_FRACTION = 1e-4
# quantized weights: 8-bit activations move logits by a few percent of the spread on these
# random models (measured: at most 0.021; the reference's docstring measures llama.cpp doing the
# same), and swap the argmax at a few near ties (measured: at most 3 positions of 67)
QUANT_SPREAD_FRACTION = 0.04
MAX_ARGMAX_SWAPS = 0.1


def _run(path, n_threads=THREADS, kv_type="f32", batch=None):
    model = Model(path, n_threads=n_threads)
    tokens = Tokenizer(path).encode(PROMPT, add_special=False)
    n = len(tokens)
    assert n >= 36, n
    kv = KVCache(model, n_ctx=n, type=kv_type)
    if batch is None:
        return tokens, model.decode(kv, tokens, np.arange(n), np.zeros(n), np.ones(n, bool))
    rows = []
    for i in range(0, n, batch):
        k = min(batch, n - i)
        rows.append(model.decode(kv, tokens[i:i + k], np.arange(i, i + k), np.zeros(k), np.ones(k, bool)))
    return tokens, np.concatenate(rows)


def _compare(ours, theirs, fraction):
    spread = theirs.max(1) - theirs.min(1)
    rel = np.abs(ours - theirs).max(1) / spread
    assert rel.max() < fraction, f"worst row differs by {rel.max():.3g} of its spread"
    top2 = np.sort(theirs, 1)[:, -2:]
    swapped = np.flatnonzero(ours.argmax(1) != theirs.argmax(1))
    for i in swapped:
        deviation = np.abs(ours[i] - theirs[i]).max()
        assert top2[i, 1] - top2[i, 0] <= 2 * deviation, (i, top2[i], deviation)
    assert len(swapped) <= MAX_ARGMAX_SWAPS * len(ours), swapped


@pytest.mark.parametrize("arch", ARCHS)
def test_float_weights_match_reference(tmp_path, arch):
    path = write_tiny_model(tmp_path / f"{arch}.gguf", arch, types="F32")
    tokens, ours = _run(path)
    theirs = load(path).logits(tokens)
    _compare(ours, theirs, FLOAT_SPREAD_FRACTION)
    assert (ours.argmax(1) == theirs.argmax(1)).all()


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("variant", ["mixed", "kquant"])
def test_quantized_weights_match_reference(tmp_path, arch, variant):
    kw = {} if variant == "mixed" else dict(KQUANT_DIMS, types=KQUANT_TYPES)
    path = write_tiny_model(tmp_path / f"{arch}-{variant}.gguf", arch, **kw)
    tokens, ours = _run(path, kv_type="f16")
    theirs = load(path).logits(tokens)
    _compare(ours, theirs, QUANT_SPREAD_FRACTION)


@pytest.mark.parametrize("arch", ARCHS)
def test_chunked_prompt_equals_whole_for_float_weights(tmp_path, arch):
    """Float weights: the prompt in chunks of 5 (through the cache) equals the prompt in one
    batch to float rounding, on every family (gemma3's window crosses chunk boundaries)."""
    path = write_tiny_model(tmp_path / f"{arch}.gguf", arch, types="F32")
    _, whole = _run(path)
    _, chunked = _run(path, batch=5)
    np.testing.assert_allclose(chunked, whole, rtol=0, atol=1e-4 * float(whole.max() - whole.min()))


def test_sliding_window_matters(tmp_path):
    """gemma3's local layers see only the last 8 tokens: a model whose window covers the whole
    prompt gives different logits past position 8, and the same ones before."""
    narrow = write_tiny_model(tmp_path / "w8.gguf", "gemma3", types="F32", sliding_window=8)
    wide = write_tiny_model(tmp_path / "w64.gguf", "gemma3", types="F32", sliding_window=64)
    _, a = _run(narrow)
    _, b = _run(wide)
    np.testing.assert_allclose(a[:8], b[:8], rtol=0, atol=1e-4 * float(a.max() - a.min()))
    assert np.abs(a[9:] - b[9:]).max(1).min() > 1e-3


@pytest.mark.parametrize("arch", ["qwen2", "gemma3"])  # gemma3: the logit softcap on the kept columns
@pytest.mark.parametrize("variant", ["F32", "mixed", "kquant"])
def test_an_output_vocabulary_gives_the_first_columns_bit_for_bit(tmp_path, arch, variant):
    """Model.out_vocab (a draft model's trimmed output product) computes only the first rows of
    the output matrix, prepacked or not: the same bits as the full product's first columns."""
    kw = {"F32": dict(types="F32"), "mixed": {}, "kquant": dict(KQUANT_DIMS, types=KQUANT_TYPES)}[variant]
    path = write_tiny_model(tmp_path / f"{arch}-{variant}.gguf", arch, **kw)
    tokens, full = _run(path)
    model = Model(path, n_threads=THREADS)
    n_vocab = model.n_vocab
    for asked, got in ((1, 16), (17, 32), (n_vocab - 1, n_vocab), (0, n_vocab)):
        model.out_vocab = asked
        assert model.out_vocab == min(got, n_vocab)
        kv = KVCache(model, n_ctx=len(tokens), type="f32")
        n = len(tokens)
        part = model.decode(kv, tokens, np.arange(n), np.zeros(n), np.ones(n, bool))
        assert part.shape == (n, model.out_vocab)
        assert np.array_equal(part, full[:, :model.out_vocab])
    with pytest.raises(Exception, match="n_out_vocab must be >= 0"):
        model.out_vocab = -1


def test_two_models_on_one_thread_pool_give_their_own_logits(tmp_path):
    """Model.share_pool (a draft model on its target's workers): each model's logits stay its own,
    bit for bit, whichever decodes in between; a pool of another size is refused."""
    a_path = write_tiny_model(tmp_path / "a.gguf", "qwen2")
    b_path = write_tiny_model(tmp_path / "b.gguf", "llama")
    tokens, a_alone = _run(a_path)
    b_tokens, b_alone = _run(b_path)
    assert list(b_tokens) == list(tokens)  # the tiny models share a vocabulary
    a, b = Model(a_path, n_threads=2), Model(b_path, n_threads=2)  # two: a pool of another size is refused
    b.share_pool(a)
    n = len(tokens)
    kv_a, kv_b = KVCache(a, n_ctx=n, type="f32"), KVCache(b, n_ctx=n, type="f32")
    out_a, out_b = [], []
    for i in range(n):  # interleaved, a row at a time, as drafting and checking alternate
        one = (tokens[i:i + 1], [i], [0], [True])
        out_a.append(a.decode(kv_a, *one))
        out_b.append(b.decode(kv_b, *one))
    assert np.array_equal(np.concatenate(out_a), a_alone)
    assert np.array_equal(np.concatenate(out_b), b_alone)
    with pytest.raises(Exception, match="share_pool: 1 threads against 2"):
        Model(b_path, n_threads=1).share_pool(a)
    del a  # b keeps its pool's owner alive
    kv_b2 = KVCache(b, n_ctx=n, type="f32")
    assert np.array_equal(b.decode(kv_b2, tokens, np.arange(n), np.zeros(n), np.ones(n, bool)), b_alone)


def test_a_prompt_runs_on_the_batch_threads_and_a_token_on_the_others(tmp_path):
    """n_threads_batch (llama.cpp's -tb): a step of several tokens runs on that many threads, a
    one-token step on n_threads, out of one pool of the larger count; the logits are the same
    bits as on either count alone (the products do not depend on the thread count)."""
    path = write_tiny_model(tmp_path / "m.gguf", "qwen2")
    tokens, alone = _run(path, n_threads=1)
    assert np.array_equal(_run(path, n_threads=2)[1], alone)
    model = Model(path, n_threads=1, n_threads_batch=2)
    assert (model.hparams["n_threads"], model.hparams["n_threads_batch"]) == (1, 2)
    n = len(tokens)
    kv = KVCache(model, n_ctx=n, type="f32")
    head = model.decode(kv, tokens[:-1], np.arange(n - 1), np.zeros(n - 1), np.ones(n - 1, bool))
    assert model.active_threads == 2
    last = model.decode(kv, tokens[-1:], [n - 1], [0], [True])
    assert model.active_threads == 1
    assert np.array_equal(np.concatenate([head, last]), alone)
    with pytest.raises(ValueError, match="threads must be at least 1"):
        Model(path, n_threads=1, n_threads_batch=-1)
