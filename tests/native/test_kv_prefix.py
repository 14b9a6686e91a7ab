"""The prefix cache of the paged KV cache (kv.h): full blocks indexed by their tokens, attached by
later sequences, cached on an LRU list when no sequence holds them.

Rows are checked by logits: a sequence that attached cached blocks and decoded the rest of its
prompt must give bit-identical logits to a fresh cache that decoded the whole prompt. Prefill of
32 rows or more currently runs a different matmul kernel than smaller batches (another change is
making them agree); until then every decode here runs in chunks of at most CHUNK < 32 rows, which
give identical rows whatever the chunking (a row's arithmetic does not depend on its batch)."""
import pathlib
import shutil
import subprocess

import numpy as np
import pytest

from bubo._model import KVCache, Model

from engines import THREADS
from reference.tiny import write_tiny_model

BLOCK = 8
CHUNK = 16


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    path = write_tiny_model(tmp_path_factory.mktemp("prefix") / "llama.gguf", "llama", types="F32")
    return Model(path, n_threads=THREADS)


def _cache(model, n_ctx=128, n_seq_max=4, block_size=BLOCK, **kw):
    return KVCache(model, n_ctx=n_ctx, n_seq_max=n_seq_max, block_size=block_size, type="f32", **kw)


def _decode(model, kv, seq, tokens):
    """Append tokens to seq in chunks of at most CHUNK; the logits of the last one."""
    start = kv.seq_len(seq)
    out = None
    for i in range(0, len(tokens), CHUNK):
        t = np.asarray(tokens[i:i + CHUNK], dtype=np.int32)
        pos = np.arange(start + i, start + i + len(t))
        out = model.decode(kv, t, pos, np.full(len(t), seq), np.ones(len(t), bool))
    return out[-1]


def _fresh(model, tokens):
    """The last logits of tokens decoded from scratch in a cache of its own."""
    kv = _cache(model, n_ctx=max(len(tokens), 1), n_seq_max=1)
    return _decode(model, kv, 0, tokens)


def _tokens(rng, model, n):
    return [int(t) for t in rng.integers(0, model.n_vocab, n)]


def _request(model, kv, seq, prompt):
    """What the engine does: attach the cached prefix (not the last token: its logits are needed),
    decode the rest, register the prompt. Returns (attached tokens, last logits)."""
    k = kv.prefix_attach(seq, prompt[:-1])
    logits = _decode(model, kv, seq, prompt[k:])
    kv.prefix_register(seq, prompt)
    kv._check()
    return k, logits


def test_two_sequences_share_a_three_block_prefix(llama):
    rng = np.random.default_rng(1)
    system = _tokens(rng, llama, 3 * BLOCK)
    a, b = system + _tokens(rng, llama, 5), system + _tokens(rng, llama, 7)
    kv = _cache(llama)
    assert kv.prefix_enabled
    k, logits_a = _request(llama, kv, 0, a)
    assert k == 0 and kv.n_indexed_blocks == 3 and kv.n_cached_blocks == 0
    held = kv.blocks_in_use()
    k, logits_b = _request(llama, kv, 1, b)
    assert k == 3 * BLOCK
    # b took one new block for its 7 own tokens; the three of the prefix are shared
    assert kv.blocks_in_use() == held + 1 and kv.seq_blocks(1) == 4
    assert np.array_equal(logits_b, _fresh(llama, b))
    assert np.array_equal(logits_a, _fresh(llama, a))
    assert kv.prefix_stats() == {"lookups": 2, "hit_blocks": 3, "evicted": 0}
    # a numpy int32 array does as well as a list
    kv.free(1)
    assert kv.prefix_attach(1, np.asarray(b[:-1], dtype=np.int32)) == 3 * BLOCK


def test_partial_blocks_are_never_attached_and_n_tokens_bounds_the_match(llama):
    rng = np.random.default_rng(2)
    prompt = _tokens(rng, llama, 2 * BLOCK + 4)
    kv = _cache(llama)
    _decode(llama, kv, 0, prompt)
    kv.prefix_register(0, prompt)
    # the 4 tokens of the third block are not a full block: only two are indexed
    assert kv.n_indexed_blocks == 2
    for n, want in [(len(prompt), 2 * BLOCK), (2 * BLOCK, 2 * BLOCK), (2 * BLOCK - 1, BLOCK), (BLOCK, BLOCK),
                    (BLOCK - 1, 0), (0, 0)]:
        assert kv.prefix_attach(1, prompt[:n]) == want, n
        assert kv.seq_len(1) == want
        kv.free(1)
    # a prompt of exactly three blocks, all cached, attaches two: its last token must be decoded
    longer = prompt + _tokens(rng, llama, BLOCK - 4)
    _decode(llama, kv, 0, longer[len(prompt):])
    kv.prefix_register(0, longer)
    assert kv.n_indexed_blocks == 3
    k, logits = _request(llama, kv, 1, longer)
    assert k == 2 * BLOCK
    assert np.array_equal(logits, _fresh(llama, longer))
    # a different first token matches nothing
    assert kv.prefix_attach(2, [prompt[0] + 1] + prompt[1:]) == 0


def test_attach_and_register_check_their_arguments(llama):
    kv = _cache(llama)
    prompt = list(range(2 * BLOCK))
    _decode(llama, kv, 0, prompt)
    with pytest.raises(ValueError, match="empty sequence"):
        kv.prefix_attach(0, prompt)
    with pytest.raises(ValueError):
        kv.prefix_attach(4, prompt)
    with pytest.raises(ValueError, match="cannot register"):
        kv.prefix_register(0, prompt + [1])
    kv.prefix_register(0, prompt)
    kv.prefix_register(1, [])  # nothing to register in an empty sequence
    # tokens other than the ones an indexed block it holds was computed for
    kv.fork(0, 1)
    kv.truncate(1, BLOCK)
    with pytest.raises(ValueError, match="differ"):
        kv.prefix_register(1, [prompt[0] ^ 1] + prompt[1:BLOCK])
    kv._check()


def test_eviction_takes_the_least_recently_used_and_never_a_held_block(llama):
    rng = np.random.default_rng(3)
    # 8 blocks in the pool, all committed at once (the pool is smaller than one commit chunk)
    kv = _cache(llama, n_ctx=8 * BLOCK)
    p1, p2, p3 = (_tokens(rng, llama, 2 * BLOCK) for _ in range(3))
    for p in (p1, p2):
        _decode(llama, kv, 0, p)
        kv.prefix_register(0, p)
        kv.free(0)
    _request(llama, kv, 1, p3)  # p3 stays held by sequence 1
    # touching p1 makes p2 the least recently used
    assert kv.prefix_attach(0, p1) == 2 * BLOCK
    kv.free(0)
    assert (kv.n_cached_blocks, kv.blocks_in_use()) == (4, 2)
    assert kv.n_free_tokens == 6 * BLOCK  # cached blocks count as free
    # 3 blocks: the 2 free ones, then p2's last block (a sequence's tail goes before its head)
    _decode(llama, kv, 2, _tokens(rng, llama, 3 * BLOCK))
    assert kv.prefix_stats()["evicted"] == 1 and kv.n_cached_blocks == 3
    kv._check()
    for p, want in [(p1, 2 * BLOCK), (p2, BLOCK), (p3, 2 * BLOCK)]:
        assert kv.prefix_attach(3, p) == want
        kv.free(3)
    # those attaches made p2's first block, then p3's blocks, the most recently used: p1 goes next
    _decode(llama, kv, 2, _tokens(rng, llama, 2 * BLOCK))
    assert kv.prefix_stats()["evicted"] == 3
    assert kv.prefix_attach(3, p1) == 0
    assert kv.prefix_attach(0, p2) == BLOCK
    kv.free(0)
    # p3 is held: with p2 evicted too the pool is full, and a held block is never taken
    _decode(llama, kv, 2, _tokens(rng, llama, BLOCK))
    assert kv.n_cached_blocks == 0 and kv.blocks_in_use() == 8
    with pytest.raises(ValueError, match="context full"):
        _decode(llama, kv, 2, _tokens(rng, llama, 1))
    kv._check()
    kv.free(2)
    k, logits = _request(llama, kv, 3, p3)
    assert k == BLOCK  # p3[:-1] reaches into its second block only partly
    assert np.array_equal(logits, _fresh(llama, p3))


def test_a_hash_collision_never_attaches_a_wrong_block(llama):
    rng = np.random.default_rng(4)
    kv = _cache(llama, n_ctx=256)
    kv._prefix_hash_mask(0)  # every block hashes to 0: only the stored tokens and parents tell them apart
    x, y, z, w = (_tokens(rng, llama, BLOCK) for _ in range(4))
    _request(llama, kv, 0, x + y + [1])
    _request(llama, kv, 1, w + [1])
    assert kv.n_indexed_blocks == 3
    # z after x: x's block only
    assert kv.prefix_attach(2, x + z) == BLOCK
    kv.free(2)
    # y after w: y is indexed after x, not after w
    assert kv.prefix_attach(2, w + y) == BLOCK
    kv.free(2)
    # a wrong token anywhere in the block
    assert kv.prefix_attach(2, x[:-1] + [x[-1] ^ 1] + y) == 0
    k, logits = _request(llama, kv, 3, x + y + z + [2])
    assert k == 2 * BLOCK
    assert np.array_equal(logits, _fresh(llama, x + y + z + [2]))


def test_a_block_whose_parent_was_rewritten_is_unreachable_even_when_hashes_collide(llama):
    """y was indexed after x. Sequence 0 then rewrites x's block (it was its only holder) and
    registers it under its new tokens x2 in the same block: y's recorded parent is that block,
    but from an earlier generation, so y after x2 does not match."""
    rng = np.random.default_rng(9)
    kv = _cache(llama)
    kv._prefix_hash_mask(0)
    x, y = _tokens(rng, llama, BLOCK), _tokens(rng, llama, BLOCK)
    _request(llama, kv, 0, x + y + [1])
    kv.truncate(0, BLOCK // 2)
    assert kv.n_cached_blocks == 1  # y
    x2 = x[:BLOCK // 2] + _tokens(rng, llama, BLOCK // 2)
    _decode(llama, kv, 0, x2[BLOCK // 2:])
    kv.prefix_register(0, x2)
    k, logits = _request(llama, kv, 1, x2 + y + [1])
    assert k == BLOCK
    assert np.array_equal(logits, _fresh(llama, x2 + y + [1]))


def test_cached_blocks_are_evicted_before_the_pool_takes_more_memory(llama):
    """grow_bytes counts cached blocks as free, so an append must reuse them rather than commit:
    the memory guard that read grow_bytes == 0 was told the truth."""
    rng = np.random.default_rng(10)
    kv = _cache(llama, n_ctx=1024)
    n = 256  # one commit chunk (KV_GROW_MIN_TOKENS)
    _request(llama, kv, 0, _tokens(rng, llama, n))
    kv.free(0)
    committed = kv.committed_blocks()
    assert kv.n_cached_blocks == n // BLOCK == committed < kv.pool_blocks()
    assert kv.grow_bytes(1, n) == 0
    _request(llama, kv, 1, _tokens(rng, llama, n))
    assert kv.committed_blocks() == committed
    assert kv.prefix_stats()["evicted"] == n // BLOCK
    # past what the cached blocks cover, the pool grows
    assert kv.grow_bytes(0, n) > 0
    _decode(llama, kv, 0, _tokens(rng, llama, n))
    assert kv.committed_blocks() > committed


@pytest.mark.parametrize("shared", [False, True])
def test_writing_into_an_indexed_block_keeps_the_cached_rows(llama, shared):
    """Truncate to mid-block, then append other tokens: a shared indexed block is copied first,
    one held only by the writer leaves the index. Either way no sequence attaches changed rows."""
    rng = np.random.default_rng(5)
    prompt = _tokens(rng, llama, 3 * BLOCK + 1)
    kv = _cache(llama)
    _request(llama, kv, 0, prompt)
    if shared:
        assert kv.prefix_attach(1, prompt) == 3 * BLOCK
    kv.truncate(0, 2 * BLOCK + 3)
    other = prompt[:2 * BLOCK + 3] + _tokens(rng, llama, BLOCK)
    _decode(llama, kv, 0, other[2 * BLOCK + 3:])
    kv._check()
    assert kv.n_indexed_blocks == (3 if shared else 2)
    kv.prefix_register(0, other)
    k, logits = _request(llama, kv, 2, prompt)
    assert k == (3 if shared else 2) * BLOCK
    assert np.array_equal(logits, _fresh(llama, prompt))
    # the rewritten block is indexed under its new tokens
    k, logits = _request(llama, kv, 3, other + [7])
    assert k == 3 * BLOCK
    assert np.array_equal(logits, _fresh(llama, other + [7]))


def test_clear_fork_and_prefix_clear(llama):
    rng = np.random.default_rng(6)
    prompt = _tokens(rng, llama, 2 * BLOCK + 4)
    kv = _cache(llama)
    _request(llama, kv, 0, prompt)
    kv.fork(0, 1)
    assert kv.blocks_in_use() == 3
    kv.free(0)
    assert kv.blocks_in_use() == 3 and kv.n_cached_blocks == 0  # sequence 1 holds them all
    # the fork continues: its partial last block is copied, and its registration goes on from src's
    branch = prompt + _tokens(rng, llama, 2 * BLOCK)
    _decode(llama, kv, 1, branch[len(prompt):])
    kv.prefix_register(1, branch)
    assert kv.n_indexed_blocks == 4
    kv.free(1)
    # the partly filled block of the first prompt was never indexed, so it went free
    assert kv.blocks_in_use() == 0 and kv.n_cached_blocks == 4
    k, logits = _request(llama, kv, 2, branch + [3])
    assert k == 4 * BLOCK
    assert np.array_equal(logits, _fresh(llama, branch + [3]))
    kv.free(2)
    free = kv.n_free_tokens
    kv.prefix_clear()
    kv._check()
    assert kv.n_cached_blocks == kv.n_indexed_blocks == 0 and kv.n_free_tokens == free
    assert kv.prefix_attach(2, branch) == 0


def test_used_blocks_return_to_baseline_after_requests(llama):
    rng = np.random.default_rng(7)
    system = _tokens(rng, llama, 4 * BLOCK + 3)
    kv = _cache(llama, n_ctx=512)
    total = kv.pool_blocks() * BLOCK
    assert kv.blocks_in_use() == 0 and kv.n_free_tokens == total
    committed = None
    for r in range(6):
        seq = r % 2
        prompt = system + _tokens(rng, llama, 3 + r)
        k, logits = _request(llama, kv, seq, prompt)
        assert k == (0 if r == 0 else 4 * BLOCK)
        reply = _tokens(rng, llama, 5)
        _decode(llama, kv, seq, reply)
        kv.prefix_register(seq, prompt + reply)
        kv.free(seq)
        kv._check()
        assert kv.blocks_in_use() == 0 and kv.n_free_tokens == total
        # a repeated prefix takes no more memory
        committed = committed or kv.committed_blocks()
        assert kv.committed_blocks() == committed
    assert kv.grow_bytes(0, 4 * BLOCK) == 0
    assert kv.prefix_stats()["hit_blocks"] == 5 * 4


def test_a_sliding_window_pool_shares_no_prefix(tmp_path):
    path = write_tiny_model(tmp_path / "gemma3.gguf", "gemma3", types="F32", sliding_window=BLOCK)
    model = Model(path, n_threads=THREADS)
    prompt = list(range(3, 3 + 3 * BLOCK + 1))
    kv = _cache(model, swa_full=False)
    assert not kv.prefix_enabled
    k, _ = _request(model, kv, 0, prompt)
    assert kv.n_indexed_blocks == 0
    k, _ = _request(model, kv, 1, prompt)
    assert k == 0 and kv.prefix_stats()["lookups"] == 0
    # with every layer in the global pool the window is a mask only: sharing works and is exact
    kv = _cache(model, swa_full=True)
    assert kv.prefix_enabled
    _request(model, kv, 0, prompt)
    k, logits = _request(model, kv, 1, prompt)
    assert k == 3 * BLOCK
    assert np.array_equal(logits, _fresh(model, prompt))


@pytest.mark.parametrize("seed, hash_mask", [(8, None), (9, None), (10, 0), (11, 3)])
def test_random_operations_keep_every_invariant(llama, seed, hash_mask):
    """Random requests over few distinct tokens (so prefixes are shared often) in a pool small
    enough to evict: after each operation the C checker sees consistent reference counts, lists
    and index, what attach returns was registered before, and logits equal a fresh decode. A
    narrowed hash (every block in one or four buckets) makes collisions the rule."""
    rng = np.random.default_rng(seed)
    block = 4
    kv = _cache(llama, n_ctx=24 * block, n_seq_max=3, block_size=block)
    if hash_mask is not None:
        kv._prefix_hash_mask(hash_mask)
    n_ctx = kv.n_ctx
    stems = [_tokens(rng, llama, 3 * block) for _ in range(3)]
    alphabet = _tokens(rng, llama, 3)
    seqs = {s: [] for s in range(3)}
    registered = set()  # every token prefix, at a block boundary, that was ever registered
    reference = {}

    def check_logits(tokens, logits):
        key = tuple(tokens)
        if key not in reference:
            reference[key] = _fresh(llama, tokens)
        assert np.array_equal(logits, reference[key]), len(tokens)

    def register(s):
        kv.prefix_register(s, seqs[s])
        for i in range(block, len(seqs[s]) + 1, block):
            registered.add(tuple(seqs[s][:i]))

    def append(s, new):
        """Decode new tokens onto s; False (cache unchanged) when the pool is full."""
        used = kv.blocks_in_use()
        try:
            logits = _decode(llama, kv, s, new)
        except ValueError as e:
            assert "context full" in str(e)
            assert kv.blocks_in_use() == used
            return False
        seqs[s] += new
        check_logits(seqs[s], logits)
        register(s)
        return True

    for _step in range(600):
        s = int(rng.integers(3))
        op = rng.choice(["request", "extend", "truncate", "fork", "free", "prefix_clear"],
                        p=[0.3, 0.3, 0.15, 0.1, 0.13, 0.02])
        if op == "request":
            kv.free(s)
            seqs[s] = []
            prompt = stems[int(rng.integers(3))][:int(rng.integers(1, 3 * block + 1))]
            prompt = prompt + [alphabet[i] for i in rng.integers(0, 3, int(rng.integers(1, 2 * block)))]
            k = kv.prefix_attach(s, prompt[:-1])
            assert k % block == 0 and k <= len(prompt) - 1 and (k == 0 or tuple(prompt[:k]) in registered)
            seqs[s] = prompt[:k]
            if not append(s, prompt[k:]):
                kv.free(s)
                seqs[s] = []
        elif op == "extend" and seqs[s]:
            n = min(int(rng.integers(1, 2 * block)), n_ctx - len(seqs[s]))
            if n > 0:
                append(s, [alphabet[i] for i in rng.integers(0, 3, n)])
        elif op == "truncate" and seqs[s]:
            n = int(rng.integers(0, len(seqs[s]) + 1))
            kv.truncate(s, n)
            seqs[s] = seqs[s][:n]
        elif op == "fork":
            d = int(rng.integers(3))
            kv.fork(s, d)
            seqs[d] = list(seqs[s])
        elif op == "free":
            kv.free(s)
            seqs[s] = []
        elif op == "prefix_clear":
            kv.prefix_clear()
            registered.clear()
        kv._check()
        for t in range(3):
            assert kv.seq_len(t) == len(seqs[t])
        assert kv.n_free_tokens == (kv.pool_blocks() - kv.blocks_in_use()) * block
    stats = kv.prefix_stats()
    # the walk did exercise sharing and eviction
    assert stats["hit_blocks"] > 50 and stats["evicted"] > 20, stats


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_random_walk_under_sanitizers(tmp_path):
    """tests/native/c/kv_prefix_asan.c: 20000 random operations on the C API, every row checked
    against its sequence's tokens, kv.c under AddressSanitizer and UBSan (the kernels it links
    for bubo_row_size are built plainly: they are not under test here and slow to instrument)."""
    root = pathlib.Path(__file__).resolve().parents[2]
    inc = [f"-I{root / 'csrc/include'}", f"-I{root / 'csrc'}"]
    plain = [*sorted((root / "csrc/quants").glob("*.c")), *sorted((root / "csrc/cpu").glob("*.c"))]
    subprocess.run(["gcc", "-std=gnu11", "-O0", "-c", *inc, *map(str, plain)], cwd=tmp_path, check=True)
    exe = tmp_path / "kv_prefix_asan"
    sanitized = [root / "tests/native/c/kv_prefix_asan.c", root / "csrc/kv/kv.c", root / "csrc/util/err.c"]
    subprocess.run(["gcc", "-std=gnu11", "-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-g", "-O1",
                    *inc, *map(str, sanitized), *map(str, sorted(tmp_path.glob("*.o"))), "-lm", "-lpthread",
                    "-o", str(exe)], check=True)
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr


def test_a_namespace_attaches_only_its_own_blocks(llama):
    """Rows computed differently from the same tokens (another adapter, another caller) live in
    namespaces of their own: a sequence attaches only what its namespace registered."""
    rng = np.random.default_rng(11)
    prompt = _tokens(rng, llama, 4 * BLOCK + 3)
    kv = _cache(llama)
    kv.prefix_namespace(0, 5)
    assert _request(llama, kv, 0, prompt)[0] == 0
    for seq, ns, attached in ((1, 0, 0), (2, 6, 0), (3, 5, 4 * BLOCK)):
        kv.prefix_namespace(seq, ns)
        assert kv.prefix_attach(seq, prompt[:-1]) == attached, (seq, ns)
    kv.free(1)
    with pytest.raises(ValueError, match="not empty"):
        kv.prefix_namespace(3, 0)
    with pytest.raises(ValueError, match="0 or more"):
        kv.prefix_namespace(1, -1)
    kv._check()
