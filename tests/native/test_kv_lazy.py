"""The lazily committed KV pool: a cache reserves its whole context as address space and takes
memory from the OS in chunks as blocks are first needed. The logits must not notice: a cache that
grows chunk by chunk, one whose blocks all come back in another order after a clear, and one
whose blocks are a different size all give the same logits. Running out of memory is a clean
MemoryError that changes nothing."""

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from bubo._model import KVCache, Model

from engines import THREADS

pytestmark = pytest.mark.models

GROW_MIN_TOKENS = 256  # csrc/kv/kv.c KV_GROW_MIN_TOKENS
# smollm2:135m: 30 layers, K and V, 3 KV heads of 64, f16
SMOLLM2_TOKEN_BYTES = 30 * 2 * 3 * 64 * 2
N_PROMPT = 600  # crosses two chunk boundaries


@pytest.fixture(scope="module")
def smollm(catalog_model):
    return Model(catalog_model("smollm2:135m"), n_threads=THREADS)


def _prompt(model, n):
    rng = np.random.default_rng(7)
    return rng.integers(10, model.n_vocab, size=n).astype(np.int32)


def _decode_all(model, kv, prompt, chunk):
    """The prompt in batches of chunk tokens; the logits of every row."""
    out = []
    for start in range(0, len(prompt), chunk):
        part = prompt[start:start + chunk]
        out.append(model.decode(kv, part, np.arange(start, start + len(part)), [0] * len(part), [True] * len(part)))
    return np.concatenate(out)


def test_a_context_past_memory_costs_address_space_only(smollm):
    kv = KVCache(smollm, 4_000_000)
    assert kv.token_bytes == SMOLLM2_TOKEN_BYTES
    assert kv.nbytes == 4_000_000 * SMOLLM2_TOKEN_BYTES  # ~92 GB reserved
    assert kv.committed_bytes == 0 and kv.committed_blocks() == 0
    assert kv.n_free_tokens == 4_000_000
    assert kv.grow_bytes(0, 100) == 4 * 32 * SMOLLM2_TOKEN_BYTES  # 4 blocks of 32
    assert kv.grow_bytes(0, 10**9) == kv.nbytes  # capped at n_ctx

    p = _prompt(smollm, 40)
    smollm.decode(kv, p, np.arange(40), [0] * 40, [False] * 39 + [True])
    assert kv.committed_blocks() == GROW_MIN_TOKENS // 32
    assert kv.committed_bytes == GROW_MIN_TOKENS * SMOLLM2_TOKEN_BYTES
    assert kv.blocks_in_use() == 2 and kv.n_free_tokens == 4_000_000 - 64
    # what the cache already took counts as there
    assert kv.grow_bytes(0, GROW_MIN_TOKENS) == 0
    assert kv.grow_bytes(0, GROW_MIN_TOKENS + 1) == 32 * SMOLLM2_TOKEN_BYTES
    # memory is kept once taken
    kv.free(0)
    assert kv.committed_bytes == GROW_MIN_TOKENS * SMOLLM2_TOKEN_BYTES and kv.blocks_in_use() == 0


def test_growing_and_reused_pools_give_the_same_logits(smollm):
    prompt = _prompt(smollm, N_PROMPT)
    grown = KVCache(smollm, 1024)
    first = _decode_all(smollm, grown, prompt, 100)
    assert grown.committed_blocks() == 768 // 32  # three chunks of 256 tokens

    # after a clear every block comes from the free list, in another order than the first time
    grown.free(0)
    again = _decode_all(smollm, grown, prompt, 100)
    assert grown.committed_blocks() == 768 // 32
    np.testing.assert_array_equal(first, again)

    # other block boundaries, one big chunk: the attention reads the same rows
    other = KVCache(smollm, N_PROMPT, block_size=7)
    np.testing.assert_array_equal(first, _decode_all(smollm, other, prompt, 100))
    assert other.committed_blocks() == other.pool_blocks()  # the whole (smaller) pool


def test_growing_past_a_fork_copies_on_write(smollm):
    prompt = _prompt(smollm, 300)
    kv = KVCache(smollm, 2048, n_seq_max=2)
    smollm.decode(kv, prompt[:250], np.arange(250), [0] * 250, [False] * 250)
    kv.fork(0, 1)
    tail = prompt[250:]
    a = smollm.decode(kv, tail, np.arange(250, 300), [0] * 50, [True] * 50)
    b = smollm.decode(kv, tail, np.arange(250, 300), [1] * 50, [True] * 50)
    np.testing.assert_array_equal(a, b)
    ref = KVCache(smollm, 2048)
    np.testing.assert_array_equal(a, _decode_all(smollm, ref, prompt, 250)[250:])


def test_running_out_of_memory_is_a_clean_memory_error(catalog_model):
    # RLIMIT_DATA bounds writable private memory, which is what committing KV blocks takes: with
    # 64 MiB of headroom, 100 tokens fit and 8,000 (~176 MiB) cannot
    code = textwrap.dedent(f"""
        import resource
        import numpy as np
        from bubo._model import KVCache, Model

        m = Model({str(catalog_model("smollm2:135m"))!r}, n_threads=1)
        kv = KVCache(m, 100_000)
        p = np.random.default_rng(1).integers(10, m.n_vocab, size=8100).astype(np.int32)
        m.decode(kv, p[:99], np.arange(99), [0] * 99, [False] * 99)
        before = m.decode(kv, p[99:100], [99], [0], [True])
        data = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmData:")) * 1024
        resource.setrlimit(resource.RLIMIT_DATA, (data + (64 << 20), resource.RLIM_INFINITY))
        committed = kv.committed_bytes
        try:
            m.decode(kv, p[100:8100], np.arange(100, 8100), [0] * 8000, [False] * 8000)
        except MemoryError as e:
            print("MemoryError:", e)
        else:
            raise SystemExit("8,000 tokens fit in 64 MiB?")
        assert kv.seq_len(0) == 100 and kv.committed_bytes == committed, (kv.seq_len(0), kv.committed_bytes)
        # the cache still works: the next token goes on from the 100 it holds
        kv.truncate(0, 99)
        again = m.decode(kv, p[99:100], [99], [0], [True])
        assert np.array_equal(before, again)
        print("ok")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "MemoryError: KV cache: out of memory" in r.stdout and r.stdout.strip().endswith("ok")


def test_reserve_takes_the_pool_ahead_of_use_up_to_the_context(smollm):
    kv = KVCache(smollm, 1000)
    kv.reserve(100)  # whole blocks, at least one grow chunk
    assert kv.committed_blocks() == GROW_MIN_TOKENS // 32
    kv.reserve(10**9)  # capped at n_ctx: 1000 tokens are 32 blocks (the last one partly)
    assert kv.committed_blocks() == 32 and kv.committed_bytes == 32 * 32 * SMOLLM2_TOKEN_BYTES
    assert kv.grow_bytes(0, 1000) == 0
    kv.reserve(500)  # never gives back
    assert kv.committed_blocks() == 32
    # the logits do not notice: the same as a cache grown with use
    p = _prompt(smollm, 300)
    grown = KVCache(smollm, 1000)
    np.testing.assert_array_equal(_decode_all(smollm, kv, p, 64), _decode_all(smollm, grown, p, 64))



def test_rows_exported_and_imported_continue_as_the_original(smollm):
    # a sequence's rows to bytes and back into another cache (slot files): the continuation's
    # logits are the original's, bit for bit; the bytes are whole blocks of every layer's K and V
    prompt = _prompt(smollm, 300)
    kv = KVCache(smollm, 2048, n_seq_max=2)
    smollm.decode(kv, prompt[:250], np.arange(250), [0] * 250, [False] * 250)
    rows = kv.export_rows(0, 250)
    assert len(rows) == kv.seq_bytes(250) == 8 * 32 * SMOLLM2_TOKEN_BYTES  # 250 tokens: 8 blocks
    want = smollm.decode(kv, prompt[250:], np.arange(250, 300), [0] * 50, [True] * 50)

    other = KVCache(smollm, 2048, n_seq_max=2)
    other.import_rows(1, 250, rows)
    assert other.seq_len(1) == 250 and other.blocks_in_use() == 8
    assert other.export_rows(1, 250) == rows
    got = smollm.decode(other, prompt[250:], np.arange(250, 300), [1] * 50, [True] * 50)
    np.testing.assert_array_equal(got, want)
    other._check()

    # refused, changing nothing: a sequence not empty, bytes of the wrong size, a cache too small
    with pytest.raises(ValueError, match="not empty"):
        other.import_rows(1, 250, rows)
    with pytest.raises(ValueError, match="bytes for 250 tokens"):
        other.import_rows(0, 250, rows[:-1])
    with pytest.raises(ValueError, match="holds 300 tokens"):
        other.export_rows(1, 301)
    small = KVCache(smollm, 128)
    with pytest.raises(ValueError):  # more tokens than its context
        small.import_rows(0, 250, rows)
    assert small.seq_len(0) == 0 and small.blocks_in_use() == 0
    full = KVCache(smollm, 512, n_seq_max=2)  # 16 blocks, 13 of them taken by another sequence
    long = _prompt(smollm, 400)
    smollm.decode(full, long, np.arange(400), [0] * 400, [False] * 400)
    with pytest.raises(MemoryError):
        full.import_rows(1, 250, rows)
    assert full.seq_len(1) == 0 and full.blocks_in_use() == 13
    full._check()
