"""The sampler's fast paths against references.

- The raw log-softmax (float exponentials summed in double over 16 fixed lanes, csrc/sample/scan.c)
  against float64 numpy, on random rows with large ranges, -inf, ties and awkward lengths, and on
  real smollm2 logits; at every instruction-set level the machine has, with the same bits at each.
- The chain started from the few best candidates it can reach (top-k's list, or one token for
  greedy) against the same chain over every token, which top-n-sigma with a huge n forces (it reads
  every candidate and keeps them all): the same tokens over many seeded draws, the same candidates
  and probabilities, bit for bit."""

import json
import math
from pathlib import Path

import numpy as np
import pytest

from bubo._kernels import supported_isas
from bubo._model import KVCache, Model
from bubo._sampler import Sampler
from bubo.sampling import SamplingParams

from engines import THREADS

# what a reported log-probability promises against a float64 log-softmax
LOGPROB_ATOL = 1e-5
# top-n-sigma threshold max - n * std far below any logit: keeps every candidate, but makes the
# chain list them all
KEEP_ALL_SIGMA = 1e30

SMOLLM2_VOCAB = 49152
QWEN_VOCAB = 151936


def levels():
    return supported_isas()


def native(seed=1, **kw):
    return SamplingParams(**kw).to_native(seed=seed)


def float64_log_softmax(row):
    x = row.astype(np.float64)
    m = x.max()
    return x - m - math.log(np.sum(np.exp(x - m)))


def canon_order(row):
    """Descending logit, ties to the lower id."""
    return np.lexsort((np.arange(len(row)), -row))


def random_rows():
    rng = np.random.default_rng(5)
    rows = []
    for n in (1, 15, 16, 17, 1000, SMOLLM2_VOCAB, QWEN_VOCAB):
        for scale in (1.0, 30.0, 3000.0):
            rows.append((rng.standard_normal(n) * scale).astype(np.float32))
    tied = np.zeros(QWEN_VOCAB, dtype=np.float32)  # the sum is n_vocab: log 151936 ~ 11.9
    rows.append(tied)
    ninf = (rng.standard_normal(SMOLLM2_VOCAB) * 5).astype(np.float32)
    ninf[rng.random(SMOLLM2_VOCAB) < 0.5] = -np.inf
    rows.append(ninf)
    wide = rng.uniform(-1e6, 1e6, SMOLLM2_VOCAB + 3).astype(np.float32)  # one term dominates
    rows.append(wide)
    near = (1e4 + rng.standard_normal(1003)).astype(np.float32)  # large values, small differences
    rows.append(near)
    return rows


@pytest.fixture(scope="module")
def smollm2_rows(catalog_model):
    """Real logits: one row per position of a prompt and llama.cpp's greedy continuation of it."""
    oracle = json.loads((Path(__file__).parent.parent / "data" / "oracle" / "llamacpp.json").read_text())
    g = oracle["models"]["smollm2:135m"]["greedy"][0]
    prompt = (g["prompt_ids"] + g["ids"])[:12]
    model = Model(catalog_model("smollm2:135m"), n_threads=THREADS)
    kv = KVCache(model, n_ctx=len(prompt))
    n = len(prompt)
    return list(model.decode(kv, prompt, np.arange(n), [0] * n, [True] * n))


@pytest.fixture(params=levels())
def level(request, native_env):
    """Samplers created under this fixture use the given instruction-set level (read at creation)."""
    native_env.setenv("BUBO_FORCE_ISA", request.param)
    return request.param


def check_log_softmax(row, n_probs=None):
    n = len(row)
    k = n if n_probs is None else n_probs
    s = Sampler(n, native(temperature=0.0, n_probs=k))
    tok, logprob, top = s.sample(row)
    want = float64_log_softmax(row)
    order = canon_order(row)[:k]
    assert [t for t, _ in top] == order.tolist()
    got = np.array([p for _, p in top])
    finite = np.isfinite(want[order])
    assert np.array_equal(np.isfinite(got), finite)
    np.testing.assert_allclose(got[finite], want[order][finite], rtol=0, atol=LOGPROB_ATOL)
    assert tok == int(order[0])
    assert logprob == pytest.approx(want[tok], abs=LOGPROB_ATOL)
    return got


def test_log_softmax_matches_float64_on_random_rows(level):
    for row in random_rows():
        # every token's log-probability on the smaller rows, the best 64 on the large ones
        check_log_softmax(row, None if len(row) <= SMOLLM2_VOCAB + 3 else 64)


def test_log_softmax_matches_float64_on_smollm2_logits(level, smollm2_rows):
    for row in smollm2_rows:
        assert row.shape == (SMOLLM2_VOCAB,)
        check_log_softmax(row)


def test_levels_give_the_same_bits(native_env, smollm2_rows):
    rows = random_rows()[::3] + smollm2_rows[:3]
    results = {}
    for name in levels():
        native_env.setenv("BUBO_FORCE_ISA", name)
        out = []
        for row in rows:
            s = Sampler(len(row), native(seed=3, n_probs=8))
            out.append(s.sample(row))
            out.append(s.sample(row))
        results[name] = out
    first = results[levels()[0]]
    for name, out in results.items():
        assert out == first, name  # tokens and log-probabilities compared exactly


# ---- the chain from the reachable candidates vs the chain over every token -----------------------

CHAINS = [
    dict(),  # llama.cpp's defaults: top-k 40, top-p 0.95, min-p 0.05, temperature 0.8
    dict(temperature=0.0),
    dict(temperature=0.0, top_k=0),
    dict(temperature=-1.0, top_k=0, top_p=1.0, min_p=0.0),
    dict(top_k=3, temperature=1.5),
    dict(top_k=1000, top_p=1.0, min_p=0.0, temperature=2.0),
    dict(top_k=100, typical_p=0.7),
    dict(top_k=60, xtc_probability=0.5, xtc_threshold=0.05, temperature=1.2),
    dict(top_k=40, dynatemp_range=0.5, min_keep=5),
    dict(temperature=0.0, logit_bias={5: 4.0, 6: -math.inf}),
    dict(repeat_penalty=1.3, presence_penalty=0.5, repeat_last_n=16, temperature=0.9),
    dict(temperature=0.0, repeat_penalty=1.5, repeat_last_n=8),
]


def pair(n_vocab, kw, seed):
    fast = native(seed=seed, **kw)
    full = dict(fast, top_n_sigma=KEEP_ALL_SIGMA)
    return Sampler(n_vocab, fast), Sampler(n_vocab, full)


def assert_same_step(a, b, row, mask=None):
    got, want = a.sample(row, mask=mask), b.sample(row, mask=mask)
    assert got == want
    (ia, pa), (ib, pb) = a.candidates(), b.candidates()
    assert np.array_equal(ia, ib) and np.array_equal(pa, pb)
    return got[0]


@pytest.mark.parametrize("case", range(len(CHAINS)))
def test_reachable_chain_matches_the_full_chain(case):
    n = SMOLLM2_VOCAB
    rng = np.random.default_rng(100 + case)
    a, b = pair(n, CHAINS[case], seed=case)
    for step in range(40):
        row = (rng.standard_normal(n) * rng.uniform(0.5, 6.0)).astype(np.float32)
        if step % 4 == 1:  # many ties: the order among equal logits is by id
            row = np.round(row * 2) / 2
        tok = assert_same_step(a, b, row)
        a.accept(tok)
        b.accept(tok)


def test_reachable_chain_on_smollm2_logits_over_many_seeds(smollm2_rows):
    for seed in range(25):
        for kw in (dict(), dict(temperature=0.0), dict(temperature=1.0, top_k=10)):
            a, b = pair(SMOLLM2_VOCAB, kw, seed)
            for row in smollm2_rows:
                assert_same_step(a, b, row)


def test_reachable_chain_with_a_mask_and_fewer_tokens_than_top_k():
    n = QWEN_VOCAB
    rng = np.random.default_rng(7)
    row = (rng.standard_normal(n) * 3).astype(np.float32)
    for allowed in ([17], [3, 9000, 151935], list(range(0, n, 5000)), list(range(100))):
        mask = np.zeros(n, dtype=bool)
        mask[allowed] = True
        for kw in (dict(), dict(temperature=0.0), dict(top_k=200, temperature=3.0)):
            a, b = pair(n, kw, seed=len(allowed))
            for _ in range(5):
                tok = assert_same_step(a, b, row, mask=mask)
                assert tok in allowed


def test_greedy_is_the_argmax_after_whole_vocabulary_stages():
    n = SMOLLM2_VOCAB
    rng = np.random.default_rng(11)
    s = Sampler(n, native(temperature=0.0, top_k=0, logit_bias={42: 2.5}))
    for _ in range(20):
        row = (rng.standard_normal(n) * 4).astype(np.float32)
        biased = row.copy()
        biased[42] += np.float32(2.5)
        tok, logprob, _ = s.sample(row)
        assert tok == int(canon_order(biased)[0])
        # the log-probability is the raw row's, not the biased one's
        assert logprob == pytest.approx(float64_log_softmax(row)[tok], abs=LOGPROB_ATOL)
        assert s.candidates()[1].tolist() == [1.0]
