"""Batch invariance: a token's matmul outputs, and so a request's logits, are the same bits
whatever batch it runs in (alone, beside other tokens or sequences, at any position, in prompt
chunks of any size), on every ISA level this CPU runs. Each kernel family of one type and ISA (the
packed tile, the few-token kernels, vec_dot) sums every dot product in one canonical order; these
tests compare float32 bits, with no tolerance."""
import numpy as np
import pytest
from gguf import GGMLQuantizationType as GT
from test_matmul import SUPPORTED_TYPES

from bubo import _kernels as K
from bubo import _ops
from bubo._model import KVCache, Model
from bubo._tokenizer import Tokenizer

from blocks import realistic_rows
from engines import THREADS
from reference.tiny import KQUANT_DIMS, write_tiny_model

ISAS = K.supported_isas()
# every decode step width (each kernel and tail width up to two micro tiles), around the old tile
# threshold (32), past a 64-token chunk
BATCH_SIZES = list(range(1, 18)) + [31, 32, 33, 64, 65, 100]
ROWS = 37  # two full 16-row registers and a ragged one
TYPE_NAMES = {t: K.type_info(t)["name"] for t in SUPPORTED_TYPES}


def bits(a):
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


def block_of(type_id):
    info = K.type_info(type_id)
    return max(info["blck_size"], K.type_info(info["vec_dot_type"])["blck_size"])


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("type_id", SUPPORTED_TYPES, ids=lambda t: TYPE_NAMES[t])
def test_matmul_row_does_not_depend_on_its_batch(type_id, isa, native_env):
    """Every token of every sub-batch (random members, random order, sizes in BATCH_SIZES) gets
    exactly the outputs it gets alone, for one block, an odd block count and longer rows."""
    native_env.setenv("BUBO_FORCE_ISA", isa)
    rng = np.random.default_rng(type_id * 31 + ISAS.index(isa))
    pool = _ops.ThreadPool(2)
    blck = block_of(type_id)
    # legacy: past 512 blocks (16384 columns) a decode step takes its rows in column chunks
    for n_blocks in (1, 3, 9, 129, 513) if blck == 32 else (1, 3, 5):
        cols = blck * n_blocks
        w = np.ascontiguousarray(realistic_rows(GT(type_id), ROWS, cols, int(rng.integers(1 << 30)))).view(np.uint8)
        w = w.reshape(-1)
        x = rng.standard_normal((max(BATCH_SIZES), cols)).astype(np.float32)
        alone = np.stack([_ops.matmul(None, type_id, w, ROWS, cols, x[t:t + 1])[0] for t in range(len(x))])
        for n in BATCH_SIZES:
            members = rng.permutation(len(x))[:n]
            got = _ops.matmul(pool, type_id, w, ROWS, cols, x[members])
            assert np.array_equal(bits(got), bits(alone[members])), (cols, n)
        # the whole batch, in order: a prompt chunk against its tokens one at a time
        assert np.array_equal(bits(_ops.matmul(pool, type_id, w, ROWS, cols, x)), bits(alone)), cols


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("type_id", SUPPORTED_TYPES, ids=lambda t: TYPE_NAMES[t])
def test_vec_dot_equals_tile(type_id, isa):
    """vec_dot and vec_dot_tile of one level give each (row, token) the same bits."""
    if isa not in K.type_info(type_id)["vec_dot_tile"]:
        pytest.skip(f"{TYPE_NAMES[type_id]} has no {isa} kernels")
    rng = np.random.default_rng(type_id)
    blck = block_of(type_id)
    n = blck * 3
    w = np.ascontiguousarray(realistic_rows(GT(type_id), 19, n, 1)).view(np.uint8).reshape(19, -1)
    x = rng.standard_normal((65, n)).astype(np.float32)
    vdt = K.type_info(type_id)["vec_dot_type"]
    y = x.view(np.uint8).reshape(65, -1) if vdt == 0 else np.stack([K.quantize(vdt, row) for row in x])
    # the few-token kernels, every tail width, the tile streaming up to one chunk of 64 tokens, and
    # the chunked tile past it
    for n_tokens in (*range(1, 10), 16, 33, 64, 65):
        tile = K.vec_dot_tile(type_id, n, w, y[:n_tokens], isa=isa)
        pairs = np.array([[K.vec_dot(type_id, wr.tobytes(), yt.tobytes(), isa=isa) for wr in w] for yt in y[:n_tokens]],
                         np.float32)
        assert np.array_equal(bits(tile), bits(pairs)), n_tokens


# ---- whole models ------------------------------------------------------------------------------

PROMPT = ("The quick brown fox jumps over the lazy dog, and the dog sleeps in the sun while the fox runs "
          "home to the old house by the river, where an owl watches the water and waits for night.")
N_PROMPT = 70


def prefill(model, kv, tokens, chunks, seq=0):
    """Logits of every token, the prompt fed in chunks of the given sizes."""
    out, i = [], 0
    for k in chunks:
        out.append(model.decode(kv, tokens[i:i + k], np.arange(i, i + k), np.full(k, seq), np.ones(k, bool)))
        i += k
    assert i == len(tokens)
    return np.concatenate(out)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "gemma3"])
@pytest.mark.parametrize("types", ["Q4_0", "Q4_1", "Q8_0", "kquant"])
def test_tiny_model_logits_do_not_depend_on_batching(tmp_path, arch, types):
    """A 70-token prompt: in one batch, token by token, in chunks 13/40/17, and interleaved token
    by token with another sequence's prompt in one batch: the same logits, bit for bit."""
    kw = dict(KQUANT_DIMS, types={m: ("Q6_K" if m in ("attn_v", "ffn_down", "output") else "Q4_K")
                                  for m in ("token_embd", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate",
                                            "ffn_up", "ffn_down", "output")}) if types == "kquant" else dict(
        types=types)
    path = write_tiny_model(tmp_path / f"{arch}-{types}.gguf", arch, **kw)
    model = Model(path, n_threads=THREADS)
    text = Tokenizer(path).encode(PROMPT, add_special=False)
    assert len(text) >= N_PROMPT, len(text)
    tokens = np.array(text[:N_PROMPT])
    other = np.array(text[::-1][:N_PROMPT])

    def cache():
        return KVCache(model, n_ctx=4 * N_PROMPT, n_seq_max=2)

    whole = prefill(model, cache(), tokens, [N_PROMPT])
    assert np.array_equal(bits(prefill(model, cache(), tokens, [1] * N_PROMPT)), bits(whole))
    assert np.array_equal(bits(prefill(model, cache(), tokens, [13, 40, 17])), bits(whole))

    kv = cache()
    prefill(model, kv, other[:5], [5], seq=1)  # the other sequence is 5 tokens ahead
    # alternate the two sequences' tokens; the other's last 5 come after the prompt's last
    entries = [(0, i, tokens[i]) for i in range(N_PROMPT)] + [(1, i, other[i]) for i in range(5, N_PROMPT)]
    entries.sort(key=lambda e: (e[1] - 5 * e[0] + 0.5 * e[0]))
    seq, pos, batch = (np.array(c) for c in zip(*entries))
    mixed = model.decode(kv, batch, pos, seq, np.ones(len(batch), bool))
    assert np.array_equal(bits(mixed[seq == 0]), bits(whole))
    alone_other = prefill(model, cache(), other, [N_PROMPT], seq=0)
    assert np.array_equal(bits(mixed[seq == 1]), bits(alone_other[5:]))


def test_smollm2_logits_do_not_depend_on_chunking():
    """The real Q4_1 model: a 100-token prompt in one chunk, one token at a time, in chunks of 37."""
    from bubo import store
    path = str(store.pull("smollm2:135m"))
    model = Model(path, n_threads=THREADS)
    text = "Owls are birds of prey with large eyes and silent flight. " * 12
    tokens = np.array(Tokenizer(path).encode(text, add_special=False)[:100])
    assert len(tokens) == 100

    def run(chunks):
        return prefill(model, KVCache(model, n_ctx=100), tokens, chunks)

    whole = run([100])
    assert np.array_equal(bits(run([1] * 100)), bits(whole))
    assert np.array_equal(bits(run([37, 37, 26])), bits(whole))


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_attention_split_over_threads_is_the_same_bits(tmp_path, arch):
    """Past one chunk of positions (BUBO_ATTEND_CHUNK), a decode step splits each token's
    positions over the threads and merges the chunks' partials in position order; a prompt runs
    the same chunks in one call. A 2,600-token sequence (3 chunks; gemma3's local layers have a
    window of 8, which crosses chunk ends too): its last 40 tokens' logits from the whole prompt in
    one batch, decoded one at a time on 2 threads (split), on 1 thread (not split), in steps of
    2-15 tokens (a draft's check, a short turn: tiled, each K/V row read once for the step), and
    beside another sequence at another depth, one or four tokens of each a step, are the same
    bits."""
    chunk = _ops.ATTEND_CHUNK
    n, tail = 2600, 40
    assert n - tail > 2 * chunk
    # F32 weights: no int8 activation blocks that could hide a last-bit difference of the attention
    path = write_tiny_model(tmp_path / f"{arch}.gguf", arch, n_ctx=4096, types="F32")
    two, one = Model(path, n_threads=2), Model(path, n_threads=1)
    rng = np.random.default_rng(7)
    tokens = rng.integers(0, two.n_vocab, n).astype(np.int32)
    other = rng.integers(0, two.n_vocab, n).astype(np.int32)

    whole = two.decode(KVCache(two, n_ctx=n), tokens, np.arange(n), np.zeros(n), np.ones(n, bool))[-tail:]

    def one_by_one(model):
        kv = KVCache(model, n_ctx=n)
        model.decode(kv, tokens[:n - tail], np.arange(n - tail), np.zeros(n - tail), np.zeros(n - tail, bool))
        return np.concatenate([model.decode(kv, tokens[i:i + 1], np.array([i]), np.zeros(1), np.ones(1, bool))
                               for i in range(n - tail, n)])

    assert np.array_equal(bits(one_by_one(two)), bits(whole))
    assert np.array_equal(bits(one_by_one(one)), bits(whole))
    kv = KVCache(two, n_ctx=n)
    two.decode(kv, tokens[:n - tail], np.arange(n - tail), np.zeros(n - tail), np.zeros(n - tail, bool))
    steps, i = [], n - tail
    for k in (2, 3, 5, 8, 15, 7):
        steps.append(two.decode(kv, tokens[i:i + k], np.arange(i, i + k), np.zeros(k), np.ones(k, bool)))
        i += k
    assert i == n
    assert np.array_equal(bits(np.concatenate(steps)), bits(whole))
    # two sequences per step: this one and another 1,500 positions behind it
    lag = 1500

    def both() -> KVCache:
        """A cache holding both sequences' prompts but their last `tail` tokens."""
        kv = KVCache(two, n_ctx=2 * n, n_seq_max=2)  # (the blocks of both sequences)
        two.decode(kv, tokens[:n - tail], np.arange(n - tail), np.zeros(n - tail), np.zeros(n - tail, bool))
        two.decode(kv, other[:n - tail - lag], np.arange(n - tail - lag), np.ones(n - tail - lag),
                   np.zeros(n - tail - lag, bool))
        return kv

    kv = both()
    rows = [two.decode(kv, np.array([tokens[i], other[i - lag]]), np.array([i, i - lag]), np.array([0, 1]),
                       np.ones(2, bool)) for i in range(n - tail, n)]
    assert np.array_equal(bits(np.stack([r[0] for r in rows])), bits(whole))
    alone = two.decode(KVCache(two, n_ctx=n), other[:n - lag], np.arange(n - lag), np.zeros(n - lag),
                       np.ones(n - lag, bool))[-tail:]
    assert np.array_equal(bits(np.stack([r[1] for r in rows])), bits(alone))
    # several tokens of each sequence per step (two drafts checked together; past 16 tokens in all,
    # a tile's end falls inside the second run): one attention tile holds both sequences' runs,
    # each run attended on its own
    kv = both()
    mine, theirs, i = [], [], n - tail
    for k in (4, 10, 3, 9, 14):
        out = two.decode(kv, np.concatenate([tokens[i:i + k], other[i - lag:i - lag + k]]),
                         np.concatenate([np.arange(i, i + k), np.arange(i - lag, i - lag + k)]),
                         np.array([0] * k + [1] * k), np.ones(2 * k, bool))
        mine.append(out[:k])
        theirs.append(out[k:])
        i += k
    assert i == n
    assert np.array_equal(bits(np.concatenate(mine)), bits(whole))
    assert np.array_equal(bits(np.concatenate(theirs)), bits(alone))
