"""The native sampler chain against small Python models of llama.cpp's definitions.

Each stage runs alone (every other stage off, temperature 1) on fixed logits, and the candidates
the native sampler draws from (ids and probabilities) are compared with the Python model's. The
whole default chain is compared token for token with the Python chain given the same uniform
draws (Sampler.sample(draws=...) feeds them instead of the seeded stream); draws that land within
DRAW_MARGIN of a boundary between two tokens are skipped, since float32 vs float64 rounding may
legitimately split them differently."""

import math
from collections import Counter

import numpy as np
import pytest

from bubo._sampler import NATIVE_FIELDS, Sampler
from bubo.sampling import SamplingParams

# probabilities: float32 storage in C vs float64 here
PROB_RTOL = 2e-5
PROB_ATOL = 1e-7
# log-probabilities: the native log-sum-exp adds float exponentials (in double), about 1e-6
# relative off a float64 sum at worst; reported log-probabilities promise 1e-5
LOGPROB_ATOL = 1e-5
DRAW_MARGIN = 1e-6

NEUTRAL = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, typical_p=1.0, top_n_sigma=-1.0,
               xtc_probability=0.0, repeat_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0,
               dry_multiplier=0.0, mirostat=0)


def native(seed=1, n_ctx=None, **kw):
    return SamplingParams(**{**NEUTRAL, **kw}).to_native(n_ctx=n_ctx, seed=seed)


def fixed_logits(n=512, scale=2.0, seed=0):
    return (np.random.default_rng(seed).standard_normal(n) * scale).astype(np.float32)


# ---- the Python models (float64 unless the C arithmetic is float32 by definition) -----------------

def canon(ids, lg):
    """Descending logit, ties to the lower id: the order the native pick walks."""
    o = np.lexsort((ids, -lg))
    return ids[o], lg[o]


def softmax(lg):
    e = np.exp(lg.astype(np.float64) - float(np.max(lg)))
    return e / e.sum()


def m_top_k(ids, lg, k):
    ids, lg = canon(ids, lg)
    return (ids, lg) if k <= 0 else (ids[:k], lg[:k])


def m_top_p(ids, lg, p, min_keep=0):
    if p >= 1.0:
        return ids, lg
    ids, lg = canon(ids, lg)
    cum = np.cumsum(softmax(lg))
    for i in range(len(ids)):
        if cum[i] >= p and i + 1 >= min_keep:
            return ids[:i + 1], lg[:i + 1]
    return ids, lg


def m_min_p(ids, lg, p, min_keep=0):
    if p <= 0.0:
        return ids, lg
    ids, lg = canon(ids, lg)
    threshold = np.float32(lg[0]) + np.float32(math.log(np.float32(p)))
    keep = max(int(np.sum(lg >= threshold)), min(min_keep, len(ids)))
    return ids[:keep], lg[:keep]


def m_typical(ids, lg, p, min_keep=0):
    if p >= 1.0:
        return ids, lg
    probs = softmax(lg)
    entropy = -np.sum(probs * np.log(probs))
    score = np.abs(-np.log(probs) - entropy)
    o = np.lexsort((ids, score))
    cum = np.cumsum(probs[o])
    for i in range(len(o)):
        if cum[i] > p and (min_keep == 0 or i + 1 >= min_keep):
            return ids[o[:i + 1]], lg[o[:i + 1]]
    return ids, lg


def m_top_n_sigma(ids, lg, n):
    if n <= 0 or len(ids) <= 1:
        return ids, lg
    x = lg.astype(np.float64)
    keep = lg >= np.float32(x.max() - n * x.std())
    return ids[keep], lg[keep]


def m_xtc(ids, lg, probability, threshold, coin, min_keep=0):
    if probability <= 0 or threshold > 0.5 or len(ids) < 2 or coin > probability:
        return ids, lg
    ids, lg = canon(ids, lg)
    probs = softmax(lg)
    last = 0
    for i in range(len(ids)):
        if probs[i] >= threshold:
            last = i
        else:
            break
    if last > 0 and len(ids) - last >= min_keep:
        return ids[last:], lg[last:]
    return ids, lg


def m_temperature(ids, lg, t, dyn_range=0.0, dyn_exp=1.0):
    if dyn_range > 0:
        if len(ids) <= 1:
            return ids, lg
        lo, hi = max(0.0, t - dyn_range), t + dyn_range
        probs = softmax(lg)
        entropy = -np.sum(probs * np.log(probs))
        t = lo + (hi - lo) * (entropy / math.log(len(ids))) ** dyn_exp
    if t <= 0:
        ids, lg = canon(ids, lg)
        return ids[:1], lg[:1]
    return ids, (lg / np.float32(t)).astype(np.float32)


def m_penalties(logits, history, last_n, repeat, freq, presence):
    out = logits.copy()
    if last_n <= 0 or (repeat == 1.0 and freq == 0.0 and presence == 0.0):
        return out
    for t, c in Counter(history[-last_n:]).items():
        v = out[t]
        v = v * np.float32(repeat) if v <= 0 else v / np.float32(repeat)
        out[t] = v - (np.float32(c) * np.float32(freq) + np.float32(1.0) * np.float32(presence))
    return out


def m_dry(logits, history, pieces, breakers, mult, base, allowed, last_n):
    """DRY from its definition: naive repeat lengths instead of the Z-function."""
    out = logits.copy()
    recent = list(reversed(history))[:last_n]  # newest first
    n = len(recent)
    if mult == 0 or last_n <= 0 or n <= allowed:
        return out

    def whole(t):
        return any(b in pieces[t] for b in breakers)

    def head(i):  # tokens spanned by the rest of a breaker that recent[i] starts, or -1
        w, best = pieces[recent[i]], -1
        for b in breakers:
            if b in w:
                best = max(best, 0)
                continue
            for pos in range(len(w)):
                m = len(w) - pos
                if m < len(b) and b.startswith(w[pos:]):
                    tail, text, c = b[m:], b"", 0
                    while len(text) < len(tail) and c < i and c < 20:
                        text += pieces[recent[i - 1 - c]]
                        c += 1
                    if text.startswith(tail):
                        best = max(best, c)
        return best

    rep_limit = n
    for i in range(n):
        h = head(i)
        if h >= 0:
            rep_limit = i - h
            break
    if rep_limit < allowed:
        return out
    longest = {}
    for k in range(1, n):
        z = 0
        while k + z < n and recent[z] == recent[k + z]:
            z += 1
        length = min(z, rep_limit)
        if length >= allowed:
            t = recent[k - 1]
            longest[t] = max(longest.get(t, -1), length)
    max_exp = int(np.float32(88.7228391) / np.float32(math.log(base))) if base > 1.000001 else 0
    for t, length in longest.items():
        if not whole(t):
            e = length - allowed
            if max_exp > 0 and e > max_exp:
                e = max_exp
            out[t] = out[t] - np.float32(mult) * np.float32(base) ** np.float32(e)
    return out


def m_pick(ids, lg, u):
    """(token, probs in canon order, margin): the first token whose running mass reaches u."""
    ids, lg = canon(ids, lg)
    e = np.exp(lg.astype(np.float64) - float(lg[0]))
    cum = np.cumsum(e) / e.sum()
    i = min(int(np.searchsorted(cum, u, side="left")), len(ids) - 1)
    margin = float(np.min(np.abs(cum - u)))
    return int(ids[i]), ids, e / e.sum(), margin


def m_chain(logits, p: dict, history, draws, pieces=None):
    """llama.cpp's default chain (no mirostat) as the Python models compose it."""
    lg = logits.astype(np.float32).copy()
    for t, b in p["logit_bias"].items():
        lg[t] = lg[t] + np.float32(b)
    lg = m_penalties(lg, history, p["repeat_last_n"], p["repeat_penalty"], p["frequency_penalty"],
                     p["presence_penalty"])
    if p["dry_multiplier"] != 0:
        lg = m_dry(lg, history, pieces, p["dry_sequence_breakers"], p["dry_multiplier"], p["dry_base"],
                   p["dry_allowed_length"], p["dry_penalty_last_n"])
    ids = np.nonzero(lg > -np.inf)[0].astype(np.int32)
    lg = lg[ids]
    mk = p["min_keep"]
    ids, lg = m_top_n_sigma(ids, lg, p["top_n_sigma"])
    ids, lg = m_top_k(ids, lg, p["top_k"])
    ids, lg = m_typical(ids, lg, p["typical_p"], mk)
    ids, lg = m_top_p(ids, lg, p["top_p"], mk)
    ids, lg = m_min_p(ids, lg, p["min_p"], mk)
    ids, lg = m_xtc(ids, lg, p["xtc_probability"], p["xtc_threshold"], draws[0], mk)
    ids, lg = m_temperature(ids, lg, p["temperature"], p["dynatemp_range"], p["dynatemp_exponent"])
    return m_pick(ids, lg, draws[1])


def assert_candidates(sampler, ids, lg):
    got_ids, got_p = sampler.candidates()
    want_ids, want_lg = canon(np.asarray(ids), np.asarray(lg, dtype=np.float32))
    assert sorted(got_ids.tolist()) == sorted(want_ids.tolist())
    want = dict(zip(want_ids.tolist(), softmax(want_lg)))
    np.testing.assert_allclose(got_p, [want[i] for i in got_ids.tolist()], rtol=PROB_RTOL, atol=PROB_ATOL)
    assert np.all(np.diff(got_p) <= 0), "candidates are listed most likely first"


def run_stage(logits, draws=(0.5, 0.5), history=(), pieces=None, **kw):
    s = Sampler(len(logits), native(**kw), vocab_pieces=pieces)
    for t in history:
        s.accept(t)
    s.sample(logits, draws=draws)
    return s


def everything(logits):
    return np.arange(len(logits), dtype=np.int32), logits.astype(np.float32)


# ---- each stage alone ------------------------------------------------------------------------

def test_no_stage_is_plain_softmax():
    lg = fixed_logits()
    assert_candidates(run_stage(lg), *everything(lg))


@pytest.mark.parametrize("k", [1, 5, 40, 511, 512, 2000])
def test_top_k(k):
    lg = fixed_logits()
    assert_candidates(run_stage(lg, top_k=k), *m_top_k(*everything(lg), k))


@pytest.mark.parametrize("p,min_keep", [(0.05, 0), (0.3, 0), (0.9, 0), (0.99, 0), (0.05, 7)])
def test_top_p(p, min_keep):
    lg = fixed_logits()
    s = run_stage(lg, top_p=p, min_keep=min_keep)
    assert_candidates(s, *m_top_p(*everything(lg), p, min_keep))


@pytest.mark.parametrize("p,min_keep", [(0.05, 0), (0.3, 0), (0.9, 0), (0.9, 12)])
def test_min_p(p, min_keep):
    lg = fixed_logits()
    assert_candidates(run_stage(lg, min_p=p, min_keep=min_keep), *m_min_p(*everything(lg), p, min_keep))


@pytest.mark.parametrize("p,min_keep", [(0.1, 0), (0.5, 0), (0.95, 0), (0.1, 30)])
def test_typical(p, min_keep):
    lg = fixed_logits()
    assert_candidates(run_stage(lg, typical_p=p, min_keep=min_keep), *m_typical(*everything(lg), p, min_keep))


@pytest.mark.parametrize("n", [0.5, 1.0, 2.5])
def test_top_n_sigma(n):
    lg = fixed_logits()
    assert_candidates(run_stage(lg, top_n_sigma=n), *m_top_n_sigma(*everything(lg), n))


@pytest.mark.parametrize("threshold,coin", [(0.05, 0.0), (0.1, 0.3), (0.1, 0.9), (0.6, 0.0)])
def test_xtc(threshold, coin):
    # peaked: a few tokens above the threshold
    lg = fixed_logits(n=64, scale=1.0, seed=3)
    lg[[5, 9, 20, 33]] = [6.0, 5.5, 5.0, 4.0]
    s = run_stage(lg, xtc_probability=0.5, xtc_threshold=threshold, draws=(coin, 0.5))
    want = m_xtc(*everything(lg), 0.5, threshold, coin)
    assert_candidates(s, *want)
    if threshold == 0.05 and coin == 0.0:
        assert len(want[0]) < len(lg), "the case must exercise the removal"


@pytest.mark.parametrize("t", [0.3, 0.8, 1.7])
def test_temperature(t):
    lg = fixed_logits()
    assert_candidates(run_stage(lg, temperature=t), *m_temperature(*everything(lg), t))


@pytest.mark.parametrize("t,rng,exp", [(0.8, 0.5, 1.0), (1.0, 0.9, 2.0), (0.2, 0.5, 0.5)])
def test_dynamic_temperature(t, rng, exp):
    lg = fixed_logits()
    s = run_stage(lg, temperature=t, dynatemp_range=rng, dynatemp_exponent=exp)
    assert_candidates(s, *m_temperature(*everything(lg), t, rng, exp))


def test_logit_bias():
    lg = fixed_logits(n=64)
    bias = {3: 5.0, 10: -2.5, 20: -math.inf, 63: 0.25}
    s = run_stage(lg, logit_bias=bias)
    want = lg.copy()
    for t, b in bias.items():
        want[t] += np.float32(b)
    keep = want > -np.inf
    assert_candidates(s, np.nonzero(keep)[0], want[keep])
    assert 20 not in s.candidates()[0]


@pytest.mark.parametrize("repeat,freq,presence,last_n", [
    (1.3, 0.0, 0.0, 64), (1.0, 0.4, 0.0, 64), (1.0, 0.0, 0.7, 64), (1.2, 0.3, 0.5, 5), (0.8, -0.2, -0.1, 64)])
def test_penalties(repeat, freq, presence, last_n):
    lg = fixed_logits(n=64)
    lg[5], lg[6] = -1.5, 1.5  # both signs of a repeated token
    history = [5, 6, 7, 5, 5, 9, 11, 6, 5, 13, 2, 2]
    s = run_stage(lg, history=history, repeat_penalty=repeat, frequency_penalty=freq,
                  presence_penalty=presence, repeat_last_n=last_n)
    assert_candidates(s, *everything(m_penalties(lg, history, last_n, repeat, freq, presence)))


def test_penalty_window_slides():
    lg = fixed_logits(n=32)
    s = Sampler(32, native(repeat_penalty=1.5, frequency_penalty=0.5, repeat_last_n=4))
    history = []
    for t in [1, 2, 3, 1, 4, 5, 1, 6, 7, 8, 9]:
        s.accept(t)
        history.append(t)
        s.sample(lg, draws=(0.5, 0.5))
        assert_candidates(s, *everything(m_penalties(lg, history, 4, 1.5, 0.5, 0.0)))


# a toy vocabulary for DRY: letters, breakers, tokens that hold a breaker, halves of "foo"
DRY_PIECES = [bytes([c]) for c in b"abcdefghijklmnopqrstuvwxyz"] + [b"\n", b":", b"x:", b"fo", b"o", b"oo!", b" "]
A, B, C, D, E, NL, COLON, X_COLON, FO, O, OO, SP = 0, 1, 2, 3, 4, 26, 27, 28, 29, 30, 31, 32  # noqa: E741 - the letter o


@pytest.mark.parametrize("history,breakers", [
    ([A, B, C, D, A, B, C], ["\n", ":"]),                       # "abc" repeats: d is penalized
    ([A, B, C, D, E, A, B, C, D, E, A, B, C], ["\n"]),           # longer repeat, bigger penalty
    ([A, B, C, D, NL, A, B, C], ["\n", ":"]),                    # repeat after a breaker: reaches back to it
    ([A, B, C, D, A, B, NL, A, B, C], ["\n"]),                   # the breaker bounds the repeat
    ([A, B, COLON, A, B, COLON, A, B], ["\n", ":"]),             # a breaker token is never penalized
    ([A, B, X_COLON, A, B, X_COLON, A, B], [":"]),               # a token holding a breaker neither
    ([A, B, C, A, B, C, FO, O, A, B], ["foo"]),                 # a breaker spelled by two tokens
    ([A, B, C, A, B, C, FO, OO, A, B], ["foo"]),                # ... the second one running past it
    ([A, B, C, A, B, C, FO, A, A, B], ["foo"]),                 # an incomplete one does not break
    ([A, B, C, FO, O, A, B, C, FO, O, A, B], ["foo"]),          # the limit counts the breaker's tokens
    ([A] * 30, ["\n"]),                                         # one token repeated: exponent grows
])
@pytest.mark.parametrize("allowed", [1, 2])
def test_dry(history, breakers, allowed):
    lg = fixed_logits(n=len(DRY_PIECES), scale=1.0)
    kw = dict(dry_multiplier=0.8, dry_base=1.75, dry_allowed_length=allowed, dry_penalty_last_n=64,
              dry_sequence_breakers=breakers)
    s = run_stage(lg, history=history, pieces=DRY_PIECES, **kw)
    want = m_dry(lg, history, DRY_PIECES, [b.encode() for b in breakers], 0.8, 1.75, allowed, 64)
    assert_candidates(s, *everything(want))


def test_dry_penalizes_the_repeat():
    lg = np.zeros(len(DRY_PIECES), dtype=np.float32)
    s = run_stage(lg, history=[A, B, C, D, A, B, C], pieces=DRY_PIECES, dry_multiplier=1.0,
                  dry_allowed_length=2, dry_penalty_last_n=64)
    ids, probs = s.candidates()
    assert ids[-1] == D  # the only token that extends "a b c"
    assert probs[-1] < probs[0] * math.exp(-1.75 + 1e-3)  # 1.0 * 1.75 ** (3 - 2)


def test_dry_window_and_clamped_exponent():
    lg = fixed_logits(n=len(DRY_PIECES), scale=1.0)
    history = [A, B] * 200
    for last_n in (8, 64, 400):
        s = run_stage(lg, history=history, pieces=DRY_PIECES, dry_multiplier=0.5, dry_base=3.0,
                      dry_allowed_length=2, dry_penalty_last_n=last_n)
        want = m_dry(lg, history, DRY_PIECES, [b"\n", b":", b'"', b"*"], 0.5, 3.0, 2, last_n)
        assert_candidates(s, *everything(want))


@pytest.mark.parametrize("seed", range(6))
def test_dry_random_histories(seed):
    # few distinct tokens: long, overlapping repeats exercise every branch of the Z-function
    rng = np.random.default_rng(seed)
    history = rng.choice([A, B, C, NL], size=300, p=[0.4, 0.3, 0.25, 0.05]).tolist()
    lg = fixed_logits(n=len(DRY_PIECES), scale=1.0)
    for breakers, last_n in ((["\n"], 300), (["zz"], 120)):
        s = run_stage(lg, history=history, pieces=DRY_PIECES, dry_multiplier=0.3, dry_base=1.2,
                      dry_allowed_length=2, dry_penalty_last_n=last_n, dry_sequence_breakers=breakers)
        want = m_dry(lg, history, DRY_PIECES, [b.encode() for b in breakers], 0.3, 1.2, 2, last_n)
        assert_candidates(s, *everything(want))


def test_dry_needs_pieces_for_breakers():
    with pytest.raises(ValueError, match="pieces"):
        Sampler(10, native(dry_multiplier=0.8, dry_penalty_last_n=64))
    with pytest.raises(ValueError, match="vocab_pieces"):
        Sampler(10, native(dry_multiplier=0.8, dry_penalty_last_n=64), vocab_pieces=[b"a"] * 9)


# ---- Mirostat --------------------------------------------------------------------------------

def m_mirostat(lg, version, tau, eta, mu, u, n_vocab, temp=1.0):
    ids, lg = canon(np.arange(len(lg), dtype=np.int32), (lg / np.float32(temp)).astype(np.float32))
    probs = softmax(lg)
    if version == 1:
        m = 100
        i = np.arange(min(m - 1, len(ids) - 1))
        t = np.log((i + 2) / (i + 1))
        b = np.log(probs[i] / probs[i + 1])
        s_hat = np.sum(t * b) / np.sum(t * t)
        eps = s_hat - 1
        k = (eps * 2.0 ** mu / (1 - n_vocab ** -eps)) ** (1 / s_hat)
        keep = len(ids) if k >= len(ids) else max(1, int(k))
    else:
        surprise = -np.log2(probs)
        over = np.nonzero(surprise > mu)[0]
        keep = max(int(over[0]) if len(over) else len(ids), 1)
    tok, kept_ids, kept_p, margin = m_pick(ids[:keep], lg[:keep], u)
    p_tok = kept_p[list(kept_ids).index(tok)]
    return tok, ids[:keep], lg[:keep], mu - eta * (-math.log2(p_tok) - tau)


@pytest.mark.parametrize("version", [1, 2])
def test_mirostat(version):
    tau, eta = 3.0, 0.2
    s = Sampler(512, native(mirostat=version, mirostat_tau=tau, mirostat_eta=eta, temperature=0.9))
    assert s.mirostat_mu == pytest.approx(2 * tau)
    mu = 2 * tau
    rng = np.random.default_rng(5)
    for step in range(12):
        lg = fixed_logits(seed=100 + step, scale=2.5)
        u = float(rng.random())
        tok, _, _ = s.sample(lg, draws=(0.5, u))
        want_tok, ids, klg, mu = m_mirostat(lg, version, tau, eta, mu, u, 512, temp=0.9)
        assert_candidates(s, ids, klg)
        assert tok == want_tok
        assert s.mirostat_mu == pytest.approx(mu, rel=1e-5)
    s.reset()
    assert s.mirostat_mu == pytest.approx(2 * tau)


def test_mirostat_skips_penalties_as_llamacpp():
    lg = fixed_logits(n=64)
    s = run_stage(lg, history=[1, 2, 3], mirostat=2, mirostat_tau=20.0, repeat_penalty=3.0)
    _, ids, klg, _ = m_mirostat(lg, 2, 20.0, 0.1, 40.0, 0.5, 64)
    assert_candidates(s, ids, klg)


# ---- the default chain -----------------------------------------------------------------------

CHAIN_CASES = [
    dict(),                                                         # llama.cpp's defaults
    dict(temperature=1.3, top_k=0, top_p=0.8, min_p=0.0),
    dict(top_k=100, typical_p=0.7, min_p=0.02),
    dict(top_n_sigma=1.5, top_k=0),
    dict(xtc_probability=0.5, xtc_threshold=0.05, top_k=0, top_p=1.0, min_p=0.0),
    dict(repeat_penalty=1.3, frequency_penalty=0.2, presence_penalty=0.3, repeat_last_n=16),
    dict(dynatemp_range=0.5, min_keep=3, top_p=0.5),
    dict(logit_bias={0: 3.0, 1: -math.inf, 7: 1.0}, temperature=0.5),
]


@pytest.mark.parametrize("case", range(len(CHAIN_CASES)))
def test_chain_matches_python_given_draws(case):
    n_vocab = 300
    params = SamplingParams(**CHAIN_CASES[case]).to_native(seed=0)
    s = Sampler(n_vocab, params)
    rng = np.random.default_rng(case)
    history, checked = [], 0
    for _step in range(60):
        lg = (rng.standard_normal(n_vocab) * rng.uniform(0.5, 4.0)).astype(np.float32)
        draws = (float(rng.random()), float(rng.random()))
        want, ids, probs, margin = m_chain(lg, params, history, draws)
        tok, _, _ = s.sample(lg, draws=draws)
        got_ids, got_p = s.candidates()
        assert sorted(got_ids.tolist()) == sorted(ids.tolist())
        if margin > DRAW_MARGIN:
            assert tok == want
            checked += 1
        s.accept(tok)
        history.append(tok)
    assert checked >= 55


def test_chain_on_a_large_vocabulary():
    # qwen2.5's vocabulary size: the selection and sorted-prefix paths at scale
    lg = fixed_logits(n=151936, scale=3.0, seed=9)
    rng = np.random.default_rng(1)
    for kw in (dict(), dict(top_k=0), dict(top_k=0, top_p=1.0, min_p=0.0, temperature=2.0),
               dict(top_k=5000, typical_p=0.9)):
        params = SamplingParams(**kw).to_native(seed=0)
        s = Sampler(len(lg), params)
        for _ in range(3):
            draws = (0.5, float(rng.random()))
            want, ids, probs, margin = m_chain(lg, params, [], draws)
            tok, _, _ = s.sample(lg, draws=draws)
            assert len(s.candidates()[0]) == len(ids)
            if margin > DRAW_MARGIN:
                assert tok == want


def test_draws_pick_by_cumulative_mass():
    lg = np.log(np.array([0.1, 0.4, 0.2, 0.3], dtype=np.float32))
    s = Sampler(4, native())
    # walk order: 1 (0.4), 3 (0.3), 2 (0.2), 0 (0.1)
    for u, want in [(0.0, 1), (0.39, 1), (0.41, 3), (0.69, 3), (0.71, 2), (0.89, 2), (0.91, 0), (0.999, 0)]:
        assert s.sample(lg, draws=(0.5, u))[0] == want


def test_seeded_draws_follow_the_distribution():
    probs = np.array([0.5, 0.25, 0.15, 0.1])
    s = Sampler(4, native(seed=123))
    lg = np.log(probs).astype(np.float32)
    counts = np.bincount([s.sample(lg)[0] for _ in range(20000)], minlength=4)
    # 5 sigma of a binomial at n = 20000
    sigma = np.sqrt(20000 * probs * (1 - probs))
    assert np.all(np.abs(counts - 20000 * probs) < 5 * sigma), counts


# ---- seeds -----------------------------------------------------------------------------------

def run_seeded(seed, steps=40, **kw):
    s = Sampler(200, native(seed=seed, **{**dict(temperature=1.5, top_k=0), **kw}))
    rng = np.random.default_rng(0)
    out = []
    for _ in range(steps):
        tok = s.sample((rng.standard_normal(200)).astype(np.float32))[0]
        s.accept(tok)
        out.append(tok)
    return out


def test_seed_repeats_exactly():
    assert run_seeded(42) == run_seeded(42)
    assert run_seeded(2**64 - 1) == run_seeded(2**64 - 1)
    xtc = dict(xtc_probability=0.5, xtc_threshold=0.02)
    assert run_seeded(7, **xtc) == run_seeded(7, **xtc)


def test_different_seeds_differ():
    runs = {tuple(run_seeded(seed)) for seed in range(5)}
    assert len(runs) == 5


def test_reset_replays_the_seed():
    s = Sampler(200, native(seed=9, temperature=1.5, top_k=0, repeat_penalty=1.5))
    lg = fixed_logits(n=200)

    def run():
        out = []
        for _ in range(20):
            tok = s.sample(lg)[0]
            s.accept(tok)
            out.append(tok)
        return out

    first = run()
    s.reset()
    assert run() == first


def test_random_seed_resolved_in_python():
    a, b = SamplingParams().to_native()["seed"], SamplingParams().to_native()["seed"]
    assert 0 <= a < 2**32 and 0 <= b < 2**32
    assert SamplingParams(seed=5).to_native()["seed"] == 5
    assert Sampler(10, SamplingParams(seed=5).to_native()).seed == 5


# ---- log-probabilities -----------------------------------------------------------------------

def raw_log_softmax(lg):
    x = lg.astype(np.float64)
    m = x.max()
    return x - m - math.log(np.sum(np.exp(x - m)))


@pytest.mark.parametrize("n_probs", [1, 5, 20])
def test_top_logprobs_are_the_raw_log_softmax(n_probs):
    lg = fixed_logits(n=5000, scale=4.0)
    # stages that change the logits must not change what is reported
    s = Sampler(5000, native(n_probs=n_probs, temperature=0.3, logit_bias={17: 50.0}, top_k=3,
                             repeat_penalty=2.0, repeat_last_n=8))
    s.accept(int(np.argmax(lg)))
    want = raw_log_softmax(lg)
    order = np.lexsort((np.arange(5000), -lg))[:n_probs]
    for _ in range(3):
        tok, logprob, top = s.sample(lg)
        assert [t for t, _ in top] == order.tolist()
        np.testing.assert_allclose([p for _, p in top], want[order], rtol=0, atol=LOGPROB_ATOL)
        assert logprob == pytest.approx(want[tok], abs=LOGPROB_ATOL)
        assert tok == 17  # the bias made it the only likely choice


def test_top_logprobs_ties_and_clamp():
    lg = np.array([1.0, 3.0, 3.0, -np.inf, 2.0], dtype=np.float32)
    s = Sampler(5, native(n_probs=10))
    assert s.n_probs == 5
    _, _, top = s.sample(lg)
    assert [t for t, _ in top] == [1, 2, 4, 0, 3]
    assert top[-1][1] == -math.inf
    np.testing.assert_allclose([p for _, p in top[:4]], raw_log_softmax(lg)[[1, 2, 4, 0]],
                               atol=LOGPROB_ATOL)


def test_no_top_when_n_probs_is_zero():
    assert Sampler(8, native()).sample(fixed_logits(n=8))[2] == []


# ---- greedy, mask ----------------------------------------------------------------------------

def test_greedy_picks_argmax():
    rng = np.random.default_rng(2)
    for seed in range(3):
        s = Sampler(1000, SamplingParams(temperature=0.0, seed=seed).to_native())
        for _ in range(20):
            lg = (rng.standard_normal(1000) * 3).astype(np.float32)
            tok, logprob, _ = s.sample(lg)
            assert tok == int(np.argmax(lg))
            assert logprob == pytest.approx(raw_log_softmax(lg)[tok], abs=LOGPROB_ATOL)
            assert s.candidates()[1].tolist() == [1.0]


def test_greedy_ties_to_the_lowest_id():
    lg = np.zeros(50, dtype=np.float32)
    lg[[7, 3, 30]] = 2.0
    for t in (0.0, -1.0):
        assert Sampler(50, native(temperature=t)).sample(lg)[0] == 3


def test_greedy_after_penalties():
    lg = fixed_logits(n=100)
    first = int(np.argmax(lg))
    s = Sampler(100, native(temperature=0.0, repeat_penalty=100.0, repeat_last_n=4))
    s.accept(first)
    assert s.sample(lg)[0] == int(np.argmax(m_penalties(lg, [first], 4, 100.0, 0.0, 0.0)))


@pytest.mark.parametrize("kind", ["bool", "uint8", "ids", "ndarray_ids"])
def test_mask_excludes_tokens(kind):
    n = 100
    lg = fixed_logits(n=n, scale=3.0)
    allowed = [3, 17, 42, 99]
    mask = np.zeros(n, dtype=bool)
    mask[allowed] = True
    m = {"bool": mask, "uint8": mask.astype(np.uint8), "ids": allowed,
         "ndarray_ids": np.array(allowed)}[kind]
    s = Sampler(n, native(seed=3, n_probs=3))
    seen = set()
    for _ in range(200):
        tok, logprob, top = s.sample(lg, mask=m)
        seen.add(tok)
        assert logprob == pytest.approx(raw_log_softmax(lg)[tok], abs=LOGPROB_ATOL)  # from the raw logits
    assert seen <= set(allowed) and len(seen) > 1
    assert_candidates(s, np.array(allowed), lg[allowed])
    # greedy under a mask: the best allowed token
    g = Sampler(n, native(temperature=0.0))
    assert g.sample(lg, mask=m)[0] == allowed[int(np.argmax(lg[allowed]))]


def test_mask_excluding_everything_is_an_error():
    s = Sampler(10, native())
    with pytest.raises(ValueError, match="no token is allowed"):
        s.sample(fixed_logits(n=10), mask=[])
    with pytest.raises(ValueError, match="no token is allowed"):
        Sampler(3, native(logit_bias={0: -math.inf, 1: -math.inf, 2: -math.inf})).sample(fixed_logits(n=3))
    with pytest.raises(ValueError, match="out of range"):
        s.sample(fixed_logits(n=10), mask=[3, 10])
    with pytest.raises(ValueError, match="shape"):
        s.sample(fixed_logits(n=10), mask=np.ones(9, dtype=bool))


# ---- bad input -------------------------------------------------------------------------------

@pytest.mark.parametrize("field,value,match", [
    ("top_p", 1.5, "top_p must be in"),
    ("top_p", -0.1, "top_p must be in"),
    ("min_p", 2.0, "min_p"),
    ("typical_p", float("nan"), "typical_p must be a finite number"),
    ("temperature", float("inf"), "temperature"),
    ("repeat_penalty", 0.0, "repeat_penalty must be > 0"),
    ("repeat_penalty", -1.0, "repeat_penalty"),
    ("repeat_last_n", -2, "repeat_last_n"),
    ("dry_base", 0.5, "dry_base"),
    ("dry_allowed_length", -1, "dry_allowed_length"),
    ("dry_penalty_last_n", -5, "dry_penalty_last_n"),
    ("dry_sequence_breakers", ["\n", ""], "non-empty"),
    ("dry_sequence_breakers", "\n", "list of strings"),
    ("mirostat", 3, "mirostat must be in"),
    ("mirostat_eta", -0.1, "mirostat_eta"),
    ("xtc_probability", 1.5, "xtc_probability"),
    ("seed", -2, "seed"),
    ("n_probs", -1, "n_probs"),
    ("top_k", 1.5, "top_k must be an integer"),
    ("min_keep", -1, "min_keep"),
    ("logit_bias", {-1: 1.0}, "logit_bias keys"),
    ("logit_bias", {"a": 1.0}, "logit_bias keys"),
    ("logit_bias", {1: float("inf")}, "logit_bias\\[1\\]"),
    ("logit_bias", {1: float("nan")}, "logit_bias\\[1\\]"),
])
def test_bad_params_are_refused(field, value, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**{field: value})


def test_defaults_are_llamacpps():
    p = SamplingParams()
    assert (p.temperature, p.top_k, p.top_p, p.min_p, p.typical_p) == (0.8, 40, 0.95, 0.05, 1.0)
    assert (p.repeat_penalty, p.repeat_last_n, p.presence_penalty, p.frequency_penalty) == (1.0, 64, 0.0, 0.0)
    assert (p.dry_multiplier, p.dry_base, p.dry_allowed_length, p.dry_penalty_last_n) == (0.0, 1.75, 2, -1)
    assert p.dry_sequence_breakers == ("\n", ":", '"', "*")
    assert (p.xtc_probability, p.xtc_threshold, p.top_n_sigma) == (0.0, 0.1, -1.0)
    assert (p.mirostat, p.mirostat_tau, p.mirostat_eta, p.seed, p.n_probs, p.logit_bias) == (0, 5.0, 0.1, -1, 0, {})
    assert set(p.to_native()) == NATIVE_FIELDS


def test_context_size_windows():
    p = SamplingParams(dry_multiplier=0.8, repeat_last_n=-1)
    assert SamplingParams().to_native()["dry_penalty_last_n"] == 0  # DRY off: nothing to resolve
    with pytest.raises(ValueError, match="n_ctx"):
        SamplingParams(repeat_penalty=1.1, repeat_last_n=-1).to_native()
    n = p.to_native(n_ctx=512)
    assert n["dry_penalty_last_n"] == 512 and n["repeat_last_n"] == 0  # penalties are off
    assert SamplingParams(repeat_penalty=1.1, repeat_last_n=-1).to_native(n_ctx=100)["repeat_last_n"] == 100


def test_native_params_must_be_complete():
    p = native()
    del p["top_k"]
    with pytest.raises(ValueError, match="missing \\['top_k'\\]"):
        Sampler(10, p)
    with pytest.raises(ValueError, match="unknown \\['topk'\\]"):
        Sampler(10, {**native(), "topk": 3})


@pytest.mark.parametrize("change,match", [
    (dict(repeat_last_n=-1), "resolve -1"),
    (dict(mirostat=5), "mirostat"),
    (dict(top_p=float("nan")), "top_p must be a finite number"),
    (dict(logit_bias={10: 1.0}), "logit_bias token 10 is out of range"),
    (dict(seed=-1), "seed"),
])
def test_native_layer_refuses_bad_values(change, match):
    with pytest.raises(ValueError, match=match):
        Sampler(10, {**native(), **change})


def test_bad_logits_and_tokens():
    s = Sampler(10, native())
    with pytest.raises(ValueError, match="9 values, expected n_vocab = 10"):
        s.sample(np.zeros(9, dtype=np.float32))
    bad = np.zeros(10, dtype=np.float32)
    bad[4] = np.nan
    with pytest.raises(ValueError, match="token 4"):
        s.sample(bad)
    bad[4] = np.inf
    with pytest.raises(ValueError, match="token 4"):
        s.sample(bad)
    with pytest.raises(ValueError, match="every logit is -inf"):
        s.sample(np.full(10, -np.inf, dtype=np.float32))
    with pytest.raises(ValueError, match="out of range"):
        s.accept(10)
    with pytest.raises(ValueError, match="out of range"):
        s.accept(-1)
    with pytest.raises(ValueError, match="draws"):
        s.sample(np.zeros(10, dtype=np.float32), draws=(0.5, 1.0))


# ---- a real vocabulary ---------------------------------------------------------------------------

def test_dry_on_a_real_vocabulary(catalog_model):
    from bubo import Tokenizer
    from bubo.sampling import vocab_pieces

    tok = Tokenizer(catalog_model("smollm2:135m"))
    pieces = vocab_pieces(tok)
    text = "Name: Alice\nAge: 30\nName: Bob\nthe cat sat on the mat and the cat sat on the"
    history = tok.encode(text, add_special=False)
    lg = fixed_logits(n=tok.n_vocab, scale=2.0, seed=4)
    params = SamplingParams(dry_multiplier=0.8, top_k=0, top_p=1.0, min_p=0.0, temperature=1.0,
                            dry_penalty_last_n=-1, repeat_last_n=0)
    # " cat" + " sat" spell the second breaker: the repeat stops at it
    wants = []
    for breakers in (("\n", ":", '"', "*"), ("cat sat",)):
        p = params.replace(dry_sequence_breakers=breakers).to_native(n_ctx=256, seed=0)
        s = Sampler(tok.n_vocab, p, vocab_pieces=pieces)
        for t in history:
            s.accept(t)
        s.sample(lg, draws=(0.5, 0.5))
        want = m_dry(lg, history, pieces, p["dry_sequence_breakers"], 0.8, 1.75, 2, 256)
        assert np.any(want != lg), "the text must trigger DRY"
        assert_candidates(s, *everything(want))
        wants.append(want)
    assert np.any(wants[0] != wants[1]), "the two-token breaker must shorten the repeat"


def test_native_sampler_refuses_min_p_above_one():
    # above 1 no candidate would survive min-p; bubo.sampling refuses it, the native layer too
    from bubo._sampler import Sampler
    from bubo.sampling import SamplingParams

    native = SamplingParams(temperature=0).to_native(n_ctx=64)
    native["min_p"] = 2.0
    with pytest.raises(ValueError, match="min_p must be in 0..1"):
        Sampler(10, native)
