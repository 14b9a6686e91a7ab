"""The native model on the real catalog models: llama.cpp's greedy tokens, and the cache
operations (batching, fork, truncate) against plain one-sequence decoding.

Near ties. These small quantized models are ill-conditioned: storing the KV cache as f32 instead
of f16 moves a top log-probability by up to ~0.15 nat on some prompts (measured on smollm2:135m),
and llama.cpp's own attention rounds its V accumulator to f16 at every token. Where our greedy
choice and llama.cpp's part, the two tokens must be within NEAR_TIE_NATS of each other in our
logits or in llama.cpp's reported log-probabilities; the continuation after that point is not
compared (it legitimately differs). Every other step must match exactly.

Greedy agreement alone says little on such models (a flip of which near tie falls which way
decides it), so the test also bounds the distance of the distributions: over llama.cpp's top-5
tokens at every compared step, our log-probabilities must be within MEAN_LOGPROB_NATS on average
and MAX_LOGPROB_NATS at worst. For scale, measured over these prompts teacher-forced along llama.cpp's
greedy tokens: an exact float64 forward pass (tests/reference) is itself 0.05-0.12 nat from
llama.cpp on average on smollm2 and qwen2.5 (worst 0.52) and 0.08-0.18 on gemma3 (worst 1.6),
because llama.cpp quantizes every activation to 8 bits (as bubo does) and runs gemma's GELU from
an f16 table. bubo lands in the same ranges; a wrong RoPE, norm or mask moves them by nats."""
import json
from pathlib import Path

import numpy as np
import pytest

from bubo._model import KVCache, Model

from engines import THREADS

ORACLE = json.loads((Path(__file__).parent.parent / "data" / "oracle" / "llamacpp.json").read_text())["models"]

NEAR_TIE_NATS = 0.15
MEAN_LOGPROB_NATS = 0.3
MAX_LOGPROB_NATS = 1.75
# Batches below the matmul's tile threshold (32 tokens) run the same arithmetic per token as one
# token alone, and attention updates its softmax per token: batched, forked and re-appended
# sequences must give bit-identical logits.


@pytest.fixture(scope="module")
def smollm(catalog_model):
    return Model(catalog_model("smollm2:135m"), n_threads=THREADS)


def _log_softmax(row):
    row = row.astype(np.float64)
    z = row - row.max()
    return z - np.log(np.exp(z).sum())


def _greedy(model, kv, prompt, n_steps, seq=0):
    """Prompt in one batch, then n_steps greedy tokens; returns the ids and each step's logits."""
    n = len(prompt)
    logits = model.decode(kv, prompt, np.arange(n), [seq] * n, [False] * (n - 1) + [True])[0]
    ids, rows = [], []
    for i in range(n_steps):
        tok = int(np.argmax(logits))
        ids.append(tok)
        rows.append(logits)
        if i + 1 < n_steps:
            logits = model.decode(kv, [tok], [n + i], [seq], [True])[0]
    return ids, rows


def _check_against_llamacpp(name, model, prompts):
    accepted = []
    for g in prompts:
        kv = KVCache(model, n_ctx=len(g["prompt_ids"]) + len(g["ids"]))
        ids, rows = _greedy(model, kv, g["prompt_ids"], len(g["ids"]))
        deltas = []
        for i, (ours, theirs) in enumerate(zip(ids, g["ids"])):
            lp = _log_softmax(rows[i])
            deltas += [abs(lp[t] - want) for t, want in g["top_logprobs"][i]]
            if ours == theirs:
                continue
            our_gap = lp[ours] - lp[theirs]
            top = dict(g["top_logprobs"][i])
            their_gap = top[theirs] - top[ours] if ours in top else np.inf
            assert min(our_gap, their_gap) <= NEAR_TIE_NATS, (
                f"{name} prompt {g['prompt']!r}: step {i} we chose {ours}, llama.cpp {theirs}; "
                f"gaps {our_gap:.3f} (ours) {their_gap:.3f} (llama.cpp) exceed {NEAR_TIE_NATS}")
            accepted.append((g["prompt"], i, round(float(min(our_gap, their_gap)), 4)))
            break
        assert np.mean(deltas) <= MEAN_LOGPROB_NATS and max(deltas) <= MAX_LOGPROB_NATS, (
            f"{name} prompt {g['prompt']!r}: top-5 log-probabilities differ from llama.cpp's by "
            f"{np.mean(deltas):.3f} on average, {max(deltas):.3f} at worst")
    return accepted


@pytest.mark.parametrize("name,n_prompts", [("smollm2:135m", 8), ("gemma3:270m", 4), ("qwen2.5-coder:0.5b", 3)])
def test_greedy_matches_llamacpp(catalog_model, name, n_prompts):
    model = Model(catalog_model(name), n_threads=THREADS)
    accepted = _check_against_llamacpp(name, model, ORACLE[name]["greedy"][:n_prompts])
    print(f"{name}: near-tie divergences accepted (prompt, step, gap): {accepted}")


def test_hparams(smollm):
    hp = smollm.hparams
    assert (hp["arch"], hp["n_layer"], hp["n_embd"], hp["n_head"], hp["n_head_kv"], hp["head_dim"]) == (
        "llama", 30, 576, 9, 3, 64)
    assert hp["n_vocab"] == smollm.n_vocab == 49152
    assert hp["rope_freq_base"] == 100000.0 and hp["tied_output"]


def test_gemma3_hparams(catalog_model):
    hp = Model(catalog_model("gemma3:270m"), n_threads=1).hparams
    assert hp["arch"] == "gemma3" and hp["sliding_window"] == 512
    # five local layers, then a global one, as llama.cpp's default pattern of 6
    assert hp["swa_layers"] == [i for i in range(18) if i % 6 != 5]
    assert hp["embd_scale"] == pytest.approx(640 ** 0.5)


PROMPTS = [
    [38634, 314, 260, 3575, 282],
    [504, 2365, 6354, 1467, 1535, 30, 378],
    [19556, 28],
    [1206, 253, 655, 30, 378, 1797, 314, 282, 260, 1099, 5260],
]


def test_batched_equals_one_by_one(smollm):
    """4 sequences of different lengths, prompt and then 3 decode steps, all in one batch per step,
    against each sequence decoded alone."""
    alone = []
    for p in PROMPTS:
        kv = KVCache(smollm, n_ctx=64)
        rows = [smollm.decode(kv, p, np.arange(len(p)), [0] * len(p), [True] * len(p))]
        for step in range(3):
            rows.append(smollm.decode(kv, [100 + step], [len(p) + step], [0], [True]))
        alone.append(np.concatenate(rows))

    kv = KVCache(smollm, n_ctx=64, n_seq_max=4, block_size=4)
    toks = [t for p in PROMPTS for t in p]
    pos = [i for p in PROMPTS for i in range(len(p))]
    seqs = [s for s, p in enumerate(PROMPTS) for _ in p]
    out = smollm.decode(kv, toks, pos, seqs, [True] * len(toks))
    together = [[] for _ in PROMPTS]
    at = 0
    for s, p in enumerate(PROMPTS):
        together[s].append(out[at:at + len(p)])
        at += len(p)
    for step in range(3):
        out = smollm.decode(kv, [100 + step] * 4, [len(p) + step for p in PROMPTS], [0, 1, 2, 3], [True] * 4)
        for s in range(4):
            together[s].append(out[s:s + 1])
    for s in range(4):
        np.testing.assert_array_equal(np.concatenate(together[s]), alone[s])
        assert kv.seq_len(s) == len(PROMPTS[s]) + 3


def test_fork_continues_as_parent(smollm):
    prompt = PROMPTS[3]  # 11 tokens: with blocks of 4, the fork shares a partly filled block
    kv = KVCache(smollm, n_ctx=64, n_seq_max=2, block_size=4)
    smollm.decode(kv, prompt, np.arange(len(prompt)), [0] * len(prompt), [False] * len(prompt))
    kv.fork(0, 1)
    assert kv.seq_len(1) == len(prompt)
    free_before = kv.n_free_tokens
    # the child writes first: copy on write must leave the parent's block intact
    child = [smollm.decode(kv, [200 + i], [len(prompt) + i], [1], [True]) for i in range(4)]
    assert kv.n_free_tokens < free_before
    parent = [smollm.decode(kv, [200 + i], [len(prompt) + i], [0], [True]) for i in range(4)]
    ref = KVCache(smollm, n_ctx=64)
    smollm.decode(ref, prompt, np.arange(len(prompt)), [0] * len(prompt), [False] * len(prompt))
    alone = [smollm.decode(ref, [200 + i], [len(prompt) + i], [0], [True]) for i in range(4)]
    for a, b, c in zip(child, parent, alone):
        np.testing.assert_array_equal(a, c)
        np.testing.assert_array_equal(b, c)


def test_truncate_and_reappend(smollm):
    prompt = PROMPTS[3]
    kv = KVCache(smollm, n_ctx=64, block_size=4)
    first = smollm.decode(kv, prompt, np.arange(len(prompt)), [0] * len(prompt), [True] * len(prompt))
    smollm.decode(kv, [7, 8, 9], [11, 12, 13], [0] * 3, [False] * 3)
    kv.truncate(0, 6)
    assert kv.seq_len(0) == 6
    again = smollm.decode(kv, prompt[6:], np.arange(6, len(prompt)), [0] * 5, [True] * 5)
    np.testing.assert_array_equal(again, first[6:])
    kv.free(0)
    assert kv.seq_len(0) == 0 and kv.n_free_tokens == 64


@pytest.mark.parametrize("kv_type", ["f32", "q8_0"])
def test_cache_types_agree_with_f16(smollm, kv_type):
    """The storage type changes rounding only: logits stay close to the f16 cache's, and the top
    token differs only at near ties of the f16 cache's logits, closer than f16's own rounding moves
    a logit (the largest difference between the f16 and the f32 cache: 0.95 on this prompt, where
    q8_0 moved the top token at gaps 0.009 and 0.45, measured on an AMD EPYC at AVX2)."""
    prompt = PROMPTS[3]
    n = len(prompt)

    def run(kv):
        return smollm.decode(kv, prompt, np.arange(n), [0] * n, [True] * n)

    ref = run(KVCache(smollm, n_ctx=32))
    kv = KVCache(smollm, n_ctx=32, type=kv_type)
    assert kv.type == kv_type
    out = run(kv)
    spread = ref.max() - ref.min()
    assert np.abs(out - ref).max() < 0.05 * spread
    f16_rounding = np.abs(run(KVCache(smollm, n_ctx=32, type="f32")) - ref).max()
    top2 = np.sort(ref, 1)[:, -2:]
    for i in np.flatnonzero(out.argmax(1) != ref.argmax(1)):
        assert top2[i, 1] - top2[i, 0] < f16_rounding, (i, top2[i], f16_rounding)


def test_long_batch_is_split(smollm):
    """A batch longer than the model's chunk (512) gives the same logits as the same tokens sent
    as the two batches it is split into (512 + 8: the 8-token tail takes the decode kernels, the
    512 the prompt tiles, in both runs)."""
    rng = np.random.default_rng(0)
    n, half = 520, 512
    toks = rng.integers(0, smollm.n_vocab, n).astype(np.int32)
    want = np.arange(n) % 97 == 0
    want[-1] = True
    kv = KVCache(smollm, n_ctx=n)
    whole = smollm.decode(kv, toks, np.arange(n), np.zeros(n), want)
    kv2 = KVCache(smollm, n_ctx=n)
    a = smollm.decode(kv2, toks[:half], np.arange(half), np.zeros(half), want[:half])
    b = smollm.decode(kv2, toks[half:], np.arange(half, n), np.zeros(n - half), want[half:])
    np.testing.assert_array_equal(whole, np.concatenate([a, b]))


# ---- bad input -----------------------------------------------------------------------------------

def test_token_out_of_range(smollm):
    kv = KVCache(smollm, n_ctx=16)
    with pytest.raises(ValueError, match="token id 49152 is out of range"):
        smollm.decode(kv, [1, 49152], [0, 1], [0, 0], [True, True])
    with pytest.raises(ValueError, match="out of range"):
        smollm.decode(kv, [-1], [0], [0], [True])
    assert kv.seq_len(0) == 0


def test_prompt_longer_than_context(smollm):
    kv = KVCache(smollm, n_ctx=8)
    with pytest.raises(ValueError, match="context full.*larger n_ctx"):
        smollm.decode(kv, list(range(9)), list(range(9)), [0] * 9, [True] * 9)
    assert kv.seq_len(0) == 0 and kv.n_free_tokens >= 8
    smollm.decode(kv, list(range(8)), list(range(8)), [0] * 8, [True] * 8)  # exactly full is fine


def test_position_gap(smollm):
    kv = KVCache(smollm, n_ctx=16)
    with pytest.raises(ValueError, match="position 1 does not continue sequence 0.*must be 0"):
        smollm.decode(kv, [1, 2], [1, 2], [0, 0], [True, True])
    smollm.decode(kv, [1, 2], [0, 1], [0, 0], [False, True])
    with pytest.raises(ValueError, match="must be 2"):
        smollm.decode(kv, [3], [3], [0], [True])
    with pytest.raises(ValueError, match="must be 3"):
        smollm.decode(kv, [3, 4], [2, 4], [0, 0], [True, True])
    assert kv.seq_len(0) == 2


def test_bad_arguments(smollm):
    kv = KVCache(smollm, n_ctx=16)
    with pytest.raises(ValueError, match="same length"):
        smollm.decode(kv, [1, 2], [0], [0, 0], [True, True])
    with pytest.raises(ValueError, match="sequence id 3 is out of range"):
        smollm.decode(kv, [1], [0], [3], [True])
    with pytest.raises(ValueError, match="truncate"):
        kv.truncate(0, 5)
    with pytest.raises(ValueError, match="KV cache K type must be f16, f32, q8_0 or q4_0, not q4_1"):
        KVCache(smollm, n_ctx=16, type="q4_1")
    with pytest.raises(ValueError, match="KV cache V type must be f16, f32, q8_0 or q4_0, not q5_0"):
        KVCache(smollm, n_ctx=16, type_v="q5_0")
    with pytest.raises(ValueError, match="unknown KV cache type 'q9'"):
        KVCache(smollm, n_ctx=16, type="q9")
    with pytest.raises(ValueError, match="block_size"):
        KVCache(smollm, n_ctx=16, block_size=0)
    other = Model(smollm.path, n_threads=1)
    with pytest.raises(ValueError, match="another model"):
        other.decode(kv, [1], [0], [0], [True])
    assert smollm.decode(kv, [], [], [], []).shape == (0, smollm.n_vocab)
