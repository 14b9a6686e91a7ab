"""The bert encoder (csrc/model/encoder.c) and bubo.Model.embed against a float64 numpy BERT
written from the architecture (tests/reference/bert.py), on the catalog's all-minilm:l6-v2 (F16
weights, converted from the checkpoint's F32 safetensors, which the reference reads).

Tokenization is bubo's own WordPiece (tests/native/test_wordpiece.py holds it to the model's
tokenizer.json); the reference embeds the same ids, so this file checks the forward pass,
pooling, truncation and batching."""
import numpy as np
import pytest

import bubo
from bubo import embed as embedding
from bubo._model import KVCache
from bubo._model import Model as NativeModel

from engines import THREADS
from reference.bert import BertReference
from reference.reader import reader
from reference.tiny import write_tiny_model

# at least 50 varied sentences: plain, accents, CJK, emoji, code, numbers, punctuation
SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "A man is playing a guitar on the street corner.",
    "Machine learning models need a lot of data to train well.",
    "How do I reset my password?",
    "The weather in Paris is lovely in the spring.",
    "Café au lait, crème brûlée and a croissant, s'il vous plaît.",
    "Zürich, München und Köln sind große Städte.",
    "ÉCOLE NORMALE SUPÉRIEURE",
    "São Paulo é a maior cidade do Brasil.",
    "El niño comió una manzana en la mañana.",
    "Ångström, Øresund and Łódź have letters English lacks.",
    "Straße and STRASSE are the same word in German.",
    "東京は日本の首都です。",
    "我喜欢吃北京烤鸭。",
    "서울은 한국의 수도입니다.",
    "Москва — столица России.",
    "Η Αθήνα είναι η πρωτεύουσα της Ελλάδας.",
    "مرحبا بالعالم",
    "I love pizza 🍕 and ice cream 🍦!",
    "Family: 👨‍👩‍👧‍👦 and flags 🇫🇷🇯🇵",
    "def add(a, b):\n    return a + b",
    "SELECT name, age FROM users WHERE age > 21 ORDER BY name;",
    "https://example.com/path?query=1&lang=en#section",
    "Email me at someone@example.org before 5:30 p.m.",
    "The price rose from $3.50 to $4.75 (a 35.7% increase).",
    "3.14159 is approximately pi; e is about 2.71828.",
    "“Curly quotes” — and an em-dash… with an ellipsis.",
    "Tabs\tand\nnewlines\r\nin the middle.",
    "   leading and trailing spaces   ",
    "UPPERCASE lowercase MiXeD cAsE",
    "antidisestablishmentarianism is a very long word",
    "Pneumonoultramicroscopicsilicovolcanoconiosis.",
    "The mitochondria is the powerhouse of the cell.",
    "Photosynthesis converts light energy into chemical energy.",
    "The stock market fell sharply after the announcement.",
    "Interest rates were raised by the central bank.",
    "The cat sat on the mat.",
    "A dog chased the ball across the park.",
    "She sells seashells by the seashore.",
    "To be, or not to be, that is the question.",
    "All happy families are alike; each unhappy family is unhappy in its own way.",
    "It was the best of times, it was the worst of times.",
    "Call me Ishmael.",
    "Python 3.11 added faster CPython and better error messages.",
    "Rust's borrow checker prevents data races at compile time.",
    "The Eiffel Tower is 330 metres tall.",
    "Mount Everest is the highest mountain above sea level.",
    "Water boils at 100 degrees Celsius at sea level.",
    "a",
    "",
    "?!?!...,,,;;;",
    "[CLS] a literal special token [SEP] in the text",
]
LONG = [
    "word " * 700,
    ("The history of the city spans many centuries, with wars, trade and art shaping it. " * 40),
    "日本語の文章はとても長いです。" * 60,
]

PARAPHRASES = [
    ("A man is playing a guitar.", "Someone is strumming a guitar."),
    ("The cat sat on the mat.", "A cat was sitting on a rug."),
    ("How do I reset my password?", "I forgot my password, how can I change it?"),
    ("The stock market crashed today.", "Share prices fell sharply today."),
    ("She is cooking dinner in the kitchen.", "A woman is preparing a meal in the kitchen."),
    ("The children are playing football in the park.", "Kids are playing soccer at the park."),
]


@pytest.fixture(scope="module")
def minilm(minilm_gguf):
    m = bubo.Model(minilm_gguf, n_threads=THREADS)
    yield m
    m.close()


@pytest.fixture(scope="module")
def reference(minilm_source):
    return BertReference(minilm_source)


def _cos(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def test_file_says_what_it_is(minilm):
    hp = minilm.hparams
    assert (hp["arch"], hp["n_layer"], hp["n_embd"], hp["n_head"], hp["n_ctx_train"]) == ("bert", 6, 384, 12, 512)
    assert hp["causal"] is False and hp["pooling"] == "mean" and hp["n_token_types"] == 2
    assert minilm.is_encoder


def test_agrees_with_float64_reference(minilm, reference):
    """Every sentence (the long ones truncated at 512 tokens, [SEP] kept) within cosine 0.9999 of
    the float64 reference on the same ids; in one batch, as the server runs them."""
    texts = SENTENCES + LONG
    assert len(texts) >= 50
    rt = minilm.runtime
    seqs, cut = embedding.tokenize(rt, texts, 512, truncate=True)
    assert cut == [False] * len(SENTENCES) + [True] * len(LONG)
    assert all(len(s) == 512 and s[-1] == 102 and s[0] == 101 for s in seqs[len(SENTENCES):])
    ours = minilm.embed(texts, truncate=True)
    assert ours.shape == (len(texts), 384) and ours.dtype == np.float32
    worst = 1.0
    for text, ids, vec in zip(texts, seqs, ours):
        cos = _cos(vec, reference.embed(ids))
        worst = min(worst, cos)
        assert cos > 0.9999, (text[:60], len(ids), cos)
    print(f"worst cosine against the float64 reference over {len(texts)} inputs: {worst:.7f}")


@pytest.mark.parametrize("pooling", ["mean", "cls", "last"])
def test_pooling_and_normalisation(minilm, reference, pooling):
    ids = minilm.tokenize("Pooling picks the rows that make one vector.")
    ref = reference.embed(ids, pooling, normalize=False)
    raw = minilm.embed([ids], pooling=pooling, normalize=False)[0]
    assert _cos(raw, ref) > 0.9999
    assert abs(np.linalg.norm(raw) / np.linalg.norm(ref) - 1) < 1e-3  # not normalised: the raw length
    unit = minilm.embed([ids], pooling=pooling)[0]
    assert abs(np.linalg.norm(unit) - 1) < 1e-5
    np.testing.assert_allclose(unit, raw / np.linalg.norm(raw), atol=1e-6)


def test_batch_of_64_equals_one_by_one(minilm):
    """Batch invariance: an input's vector has the same bits alone, beside 63 others, or beside a
    full 512-token input in its pass."""
    texts = [SENTENCES[i % len(SENTENCES)] + f" (variant {i})" for i in range(64)]
    batched = minilm.embed(texts)
    single = np.stack([minilm.embed(t) for t in texts])
    np.testing.assert_array_equal(batched, single)
    with_long = minilm.embed([LONG[0]] + texts[:3], truncate=True)
    np.testing.assert_array_equal(with_long[1:], single[:3])


def test_thread_count_does_not_change_a_vector(minilm_gguf, minilm):
    texts = SENTENCES[:8] + LONG[:1]
    with bubo.Model(minilm_gguf, n_threads=3) as three:
        np.testing.assert_array_equal(three.embed(texts, truncate=True), minilm.embed(texts, truncate=True))


def test_paraphrases_score_above_unrelated(minilm):
    a = minilm.embed([p[0] for p in PARAPHRASES])
    b = minilm.embed([p[1] for p in PARAPHRASES])
    sims = a @ b.T  # normalised: dot products are cosines
    for i in range(len(PARAPHRASES)):
        unrelated = np.delete(sims[i], i)
        assert sims[i, i] > unrelated.max() + 0.1, (PARAPHRASES[i], sims[i, i], unrelated.max())
    assert np.diag(sims).min() > 0.6


def test_too_long_refused_unless_truncated(minilm):
    with pytest.raises(embedding.TooLongError, match="700|702"):
        minilm.embed("word " * 700)
    vec = minilm.embed("word " * 700, truncate=True)
    assert vec.shape == (384,)


def test_empty_string_is_cls_sep(minilm):
    assert minilm.tokenize("") == [101, 102]
    assert abs(np.linalg.norm(minilm.embed("")) - 1) < 1e-5


def test_bad_input(minilm):
    with pytest.raises(ValueError, match="pooling"):
        minilm.embed("x", pooling="max")
    with pytest.raises(TypeError):
        minilm.embed([b"bytes"])
    with pytest.raises(ValueError, match="out of range"):
        minilm.embed([[101, 10**6, 102]])
    with pytest.raises(ValueError, match="empty"):
        minilm.embed([[]])
    with pytest.raises(ValueError, match="7592.9"):  # a float is no token id
        minilm.embed([[101, 7592.9, 102]])
    np.testing.assert_array_equal(minilm.embed([np.array([101, 7592, 102])]), minilm.embed([[101, 7592, 102]]))


def test_encoder_does_not_generate(minilm):
    with pytest.raises(embedding.EncoderOnlyError, match="embedding model"):
        minilm.generate("Hello", max_tokens=4)
    with pytest.raises(embedding.EncoderOnlyError):
        minilm.chat([{"role": "user", "content": "hi"}])


def test_native_encode_checks(minilm_gguf, tmp_path):
    m = NativeModel(minilm_gguf, 1)
    with pytest.raises(ValueError, match="1..512"):
        m.encode(np.full(513, 1000), [513])
    with pytest.raises(ValueError, match="1..512"):
        m.encode(np.zeros(0), [0])
    with pytest.raises(ValueError, match="out of range"):
        m.encode([101, 30522, 102], [3])
    with pytest.raises(ValueError, match="sum"):
        m.encode([101, 102], [3])
    with pytest.raises(ValueError, match="1..512"):  # a negative length cannot hide an overrun
        m.encode([101, 102, 103], [5, -2])
    with pytest.raises(ValueError, match="1..512"):
        m.encode([], [1, -1])
    with pytest.raises(ValueError, match="is an encoder"):
        m.decode(KVCache(m, n_ctx=8), [101], [0], [0], [True])
    dec = NativeModel(write_tiny_model(tmp_path / "tiny.gguf", "llama", types="F32"), 1)
    with pytest.raises(ValueError, match="decoder"):
        dec.encode([1, 2], [2])


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_decoder_hidden_rows_are_what_the_output_multiplies(tmp_path, arch):
    """A decoder's embeddings are its final normed hidden rows: times the output matrix (read
    with the gguf package) they give decode's own logits."""
    path = write_tiny_model(tmp_path / f"{arch}.gguf", arch, types="F32")
    m = NativeModel(path, 2)
    n = 12
    tokens, pos, seq = np.arange(3, 3 + n), np.arange(n), np.zeros(n)
    logits = m.decode(KVCache(m, n_ctx=n, type="f32"), tokens, pos, seq, np.ones(n, bool))
    m.output_hidden = True
    hidden = m.decode(KVCache(m, n_ctx=n, type="f32"), tokens, pos, seq, np.ones(n, bool))
    m.output_hidden = False
    assert hidden.shape == (n, m.hparams["n_embd"])
    gguf_file = reader(path)
    t = {t.name: t for t in gguf_file.tensors}
    out = np.asarray((t.get("output.weight") or t["token_embd.weight"]).data, dtype=np.float64)
    mine = hidden.astype(np.float64) @ out.T
    if m.hparams["final_logit_softcap"]:
        cap = m.hparams["final_logit_softcap"]
        mine = cap * np.tanh(mine / cap)
    spread = logits.max(1) - logits.min(1)
    assert (np.abs(mine - logits).max(1) / spread).max() < 1e-4
    # and the library's pooling over them (its cache is f16, as the library's default)
    m.output_hidden = True
    hidden16 = m.decode(KVCache(m, n_ctx=n, type="f16"), tokens, pos, seq, np.ones(n, bool))
    m.output_hidden = False
    with bubo.Model(path, n_threads=THREADS, draft=False) as lib:
        ids = [int(x) for x in tokens]
        np.testing.assert_allclose(lib.embed([ids], pooling="last", normalize=False)[0], hidden16[-1], atol=1e-6)
        np.testing.assert_allclose(lib.embed([ids], pooling="mean", normalize=False)[0], hidden16.mean(0),
                                   atol=1e-6)
        np.testing.assert_allclose(lib.embed([ids], pooling="cls", normalize=False)[0], hidden16[0], atol=1e-6)
