"""With swa_full=False, gemma3's sliding-window layers keep only their window in the KV cache
(csrc/kv/kv.c: a second block pool whose blocks are released once they fall out of the window),
and decode is unchanged:
token by token over 70 tokens the logits still match the float64 numpy reference while each
sequence holds at most ceil((window + block_size) / block_size) + 1 sliding-window blocks. Forks
share those blocks; truncation below a released block is refused, above it works."""
import math

import numpy as np
import pytest

from bubo._model import KVCache, Model
from bubo._tokenizer import Tokenizer

from engines import THREADS
from reference import load
from reference.tiny import write_tiny_model

WINDOW = 8
BLOCK = 4
PROMPT = ("The quick brown fox jumps over the lazy dog, and the dog sleeps in the sun while "
          "the fox runs home to the old house by the river. The old dog wakes up and runs to the river.")
# float weights, f32 cache: |C - reference| / logit spread per row (as test_model_tiny.py)
FLOAT_SPREAD_FRACTION = 1e-4
# one token per append: the window plus one token spans at most this many blocks
MAX_SWA_BLOCKS = math.ceil((WINDOW + BLOCK) / BLOCK) + 1


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    path = write_tiny_model(tmp_path_factory.mktemp("swa") / "gemma3.gguf", "gemma3", types="F32",
                            sliding_window=WINDOW)
    tokens = Tokenizer(path).encode(PROMPT, add_special=False)
    assert len(tokens) >= 64, len(tokens)
    return path, Model(path, n_threads=THREADS), tokens, load(path)


def _close(ours, theirs):
    rel = np.abs(ours - theirs).max(1) / (theirs.max(1) - theirs.min(1))
    assert rel.max() < FLOAT_SPREAD_FRACTION, f"worst row differs by {rel.max():.3g} of its spread"


def _step(model, kv, seq, token, pos):
    return model.decode(kv, [token], [pos], [seq], [True])[0]


def test_token_by_token_matches_reference_with_window_sized_pool(gemma):
    _, model, tokens, ref = gemma
    n = len(tokens)
    kv = KVCache(model, n_ctx=n, block_size=BLOCK, type="f32", n_batch=1, swa_full=False)
    full = KVCache(model, n_ctx=n, block_size=BLOCK, type="f32", swa_full=True)
    assert kv.sliding_window == WINDOW
    # the sliding-window pool is sized by the window, the global one by n_ctx
    assert kv.pool_blocks(swa=True) == math.ceil(WINDOW / BLOCK) + 1 < kv.pool_blocks() == math.ceil(n / BLOCK)
    assert kv.nbytes < full.nbytes
    rows = []
    for i, t in enumerate(tokens):
        rows.append(_step(model, kv, 0, t, i))
        # exactly the blocks from the one holding token i's window start (i - WINDOW + 1) on:
        # one fewer would have read a released block, one more is memory the window never needs
        assert kv.seq_blocks(0, swa=True) == math.ceil((i + 1) / BLOCK) - max(0, i - WINDOW + 1) // BLOCK
        assert kv.seq_blocks(0, swa=True) <= MAX_SWA_BLOCKS
        assert kv.blocks_in_use(swa=True) == kv.seq_blocks(0, swa=True)
        assert kv.seq_blocks(0) == math.ceil((i + 1) / BLOCK)
    ours = np.stack(rows)
    theirs = ref.logits(tokens)
    _close(ours, theirs)
    assert (ours.argmax(1) == theirs.argmax(1)).all()


def test_whole_prompt_in_small_chunks_matches_reference(gemma):
    """One decode call of the whole prompt runs in chunks of n_batch rows, releasing
    out-of-window blocks between them."""
    _, model, tokens, ref = gemma
    n = len(tokens)
    kv = KVCache(model, n_ctx=n + 1, block_size=BLOCK, type="f32", n_batch=5, swa_full=False)
    ours = model.decode(kv, tokens, np.arange(n), np.zeros(n), np.ones(n, bool))
    _close(ours, ref.logits(tokens))
    assert kv.seq_len(0) == n
    assert kv.seq_blocks(0, swa=True) <= math.ceil((WINDOW + 5 - 1) / BLOCK) + 1
    # the window survived the chunking: the next token continues exactly
    _close(_step(model, kv, 0, tokens[0], n)[None], ref.logits(tokens + [tokens[0]], rows=[-1]))


def test_fork_shares_window_blocks_and_both_branches_stay_exact(gemma):
    _, model, tokens, ref = gemma
    n_prefix = 30
    # the global pool is shared by the sequences: room for both branches
    kv = KVCache(model, n_ctx=2 * len(tokens), n_seq_max=2, block_size=BLOCK, type="f32", n_batch=1,
                 swa_full=False)
    for i in range(n_prefix):
        _step(model, kv, 0, tokens[i], i)
    held = kv.blocks_in_use(swa=True)
    kv.fork(0, 1)
    assert kv.blocks_in_use(swa=True) == held == kv.seq_blocks(1, swa=True)
    branch = [tokens[n_prefix:], tokens[5:5 + len(tokens) - n_prefix]]
    rows = [[], []]
    for j in range(len(branch[0])):
        for s in (0, 1):
            rows[s].append(_step(model, kv, s, branch[s][j], n_prefix + j))
            assert kv.seq_blocks(s, swa=True) <= MAX_SWA_BLOCKS
        assert kv.blocks_in_use(swa=True) <= 2 * MAX_SWA_BLOCKS
    for s in (0, 1):
        seq = tokens[:n_prefix] + branch[s]
        _close(np.stack(rows[s]), ref.logits(seq, rows=slice(n_prefix, None)))


def test_truncate_within_window_works_below_it_is_refused(gemma):
    _, model, tokens, ref = gemma
    n = 30
    kv = KVCache(model, n_ctx=len(tokens), block_size=BLOCK, type="f32", n_batch=1, swa_full=False)
    for i in range(n):
        _step(model, kv, 0, tokens[i], i)
    # the next token at 29 attends from 22 on; blocks before the one holding 30 - 8 = 22 are gone
    kv.truncate(0, n - 1)
    assert kv.seq_len(0) == n - 1
    other = tokens[40]
    _close(_step(model, kv, 0, other, n - 1)[None], ref.logits(tokens[:n - 1] + [other], rows=[-1]))
    with pytest.raises(ValueError, match="sliding-window"):
        kv.truncate(0, 12)
    assert kv.seq_len(0) == n  # a refusal changes nothing
    _close(_step(model, kv, 0, tokens[n], n)[None], ref.logits(tokens[:n - 1] + [other, tokens[n]], rows=[-1]))
    # clearing always works and the sequence starts over exactly
    kv.truncate(0, 0)
    assert kv.blocks_in_use(swa=True) == kv.blocks_in_use() == 0
    again = np.stack([_step(model, kv, 0, t, i) for i, t in enumerate(tokens[:12])])
    _close(again, ref.logits(tokens[:12]))


def test_models_without_sliding_window_have_no_swa_pool(tmp_path):
    path = write_tiny_model(tmp_path / "llama.gguf", "llama", types="F32")
    kv = KVCache(Model(path, n_threads=1), n_ctx=64, block_size=BLOCK)
    assert kv.sliding_window == 0 and kv.pool_blocks(swa=True) == 0
    assert kv.pool_blocks() == 16


def test_n_batch_is_checked(gemma):
    _, model, _, _ = gemma
    for bad in (0, 513):
        with pytest.raises(ValueError, match="n_batch"):
            KVCache(model, n_ctx=16, n_batch=bad)


def test_batched_sequences_at_every_block_phase(gemma):
    """Four sequences, each one token further into its blocks, decode one token each per batch:
    a block one releases in a batch is taken by another in the same batch and written before
    anyone attends, so reading a released block would show in the logits."""
    _, model, tokens, ref = gemma
    n_seq, n_steps = 4, 44
    texts = [tokens[3 * s:] for s in range(n_seq)]
    kv = KVCache(model, n_ctx=n_seq * n_steps, n_seq_max=n_seq, block_size=BLOCK, type="f32", n_batch=1,
                 swa_full=False)
    assert kv.pool_blocks(swa=True) == n_seq * (math.ceil(WINDOW / BLOCK) + 1)
    rows = [[] for _ in range(n_seq)]
    for step in range(n_steps):
        active = [s for s in range(n_seq) if step - s >= 0 and step - s < n_steps - n_seq]
        pos = [step - s for s in active]
        out = model.decode(kv, [texts[s][p] for s, p in zip(active, pos)], pos, active, np.ones(len(active), bool))
        for s, row in zip(active, out):
            rows[s].append(row)
            assert kv.seq_blocks(s, swa=True) <= MAX_SWA_BLOCKS
    for s in range(n_seq):
        _close(np.stack(rows[s]), ref.logits(texts[s][:len(rows[s])]))


def test_swa_full_keeps_every_block_so_any_truncation_works(gemma):
    """The default (what bubo.llm's prefix reuse needs until it falls back from a refusal)."""
    _, model, tokens, ref = gemma
    kv = KVCache(model, n_ctx=len(tokens), block_size=BLOCK, type="f32")
    assert kv.swa_full and kv.pool_blocks(swa=True) == 0
    n = 30
    model.decode(kv, tokens[:n], np.arange(n), np.zeros(n), np.zeros(n, bool))
    kv.truncate(0, 12)
    assert kv.seq_blocks(0) == 3
    _close(_step(model, kv, 0, tokens[40], 12)[None], ref.logits(tokens[:12] + [tokens[40]], rows=[-1]))
