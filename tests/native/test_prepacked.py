"""Prepacked weights (bubo_matmul_prepack / bubo_matmul_prepacked, quants/legacy_tile.h,
kquant_tile.h, legacy_tile_avx2.h and kquant_tile_avx2.h): a model's Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K and Q6_K
matrices are packed once at load where this CPU's best level has the kernels (AVX-512 and AVX2,
legacy_tile_avx2.h), and every product over them must be the
same bits as over the rows in place: for every token count (the packed tile serves one token
too), ragged row groups, short and long rows, and through whole models (BUBO_NO_PREPACK=1 keeps
the rows in place)."""
import importlib.util
import pathlib

import numpy as np
import pytest
from gguf import GGMLQuantizationType as GT

from bubo import _kernels as K
from bubo import _ops
from bubo._model import KVCache, Model
from bubo._tokenizer import Tokenizer

from blocks import realistic_rows
from engines import THREADS
from reference.tiny import KQUANT_DIMS, write_tiny_model

ROOT = pathlib.Path(__file__).resolve().parents[2]
LEGACY = [GT.Q4_0, GT.Q4_1, GT.Q5_0, GT.Q5_1, GT.Q8_0]  # their rows can be rebuilt (a tied token_embd)
PREPACKED = LEGACY + [GT.Q4_K, GT.Q6_K]
# the types each level packs (the packed layout belongs to the level's tiles)
PACKED_AT = {"avx512": set(PREPACKED), "avx2": set(PREPACKED)}
PACKED_HERE = PACKED_AT.get(K.best_isa(), set())
HAS_KERNELS = bool(PACKED_HERE)


def bits(a):
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


def assert_same_in_place(native_env, logits):
    """logits() (a fresh model each call) gives the same bits prepacked (as loaded now) and with
    BUBO_NO_PREPACK=1."""
    first = logits()
    native_env.setenv("BUBO_NO_PREPACK", "1")
    second = logits()
    for a, b in zip(first, second) if isinstance(first, tuple) else [(first, second)]:
        assert np.array_equal(bits(a), bits(b))


# every level this CPU runs that packs (an AVX-512 machine checks its AVX2 tiles too)
PACKING_LEVELS = [isa for isa in K.supported_isas() if PACKED_AT.get(isa)] or [K.best_isa()]


@pytest.mark.parametrize("isa", PACKING_LEVELS)
@pytest.mark.parametrize("type_id", PREPACKED, ids=lambda t: t.name)
def test_prepacked_matmul_is_the_same_bits(type_id, isa, native_env):
    native_env.setenv("BUBO_FORCE_ISA", isa)
    blck = K.type_info(int(type_id))["blck_size"]
    packs = type_id in PACKED_AT.get(isa, set())
    assert packs == (_ops.prepack(int(type_id), np.zeros(K.row_size(int(type_id), blck), np.uint8), 1, blck)
                     is not None)
    if not packs:
        pytest.skip(f"no prepacked {type_id.name} kernels at level {isa}: "
                    "the model multiplies its rows in place")
    rng = np.random.default_rng(int(type_id))
    pool = _ops.ThreadPool(2)
    # one block, an odd count, a legacy decode step's column chunk (512 blocks) and past it
    blck = K.type_info(int(type_id))["blck_size"]
    for rows in (1, 16, 37, 300):
        for n_blocks in (1, 3, 129, 512, 513) if blck == 32 else (1, 3, 19):
            cols = blck * n_blocks
            w = np.ascontiguousarray(realistic_rows(type_id, rows, cols, int(rng.integers(1 << 30)))).view(np.uint8)
            w = w.reshape(-1)
            packed = _ops.prepack(int(type_id), w, rows, cols)
            assert packed.nbytes == (rows + 15) // 16 * 16 * K.row_size(int(type_id), cols)
            x = rng.standard_normal((70, cols)).astype(np.float32)
            # the micro tiles' widths (2, 3, 4, 5 at AVX2; 8 at AVX-512) and past them, the last count
            # that streams (one chunk of 64 tokens) and past it
            for n in (1, 2, 3, 4, 5, 7, 8, 9, 10, 11, 17, 33, 64, 65, 70):
                for p in (None, pool):
                    want = _ops.matmul(p, int(type_id), w, rows, cols, x[:n])
                    got = _ops.matmul(p, int(type_id), packed, rows, cols, x[:n], prepacked=True)
                    assert np.array_equal(bits(got), bits(want)), (rows, cols, n)
            # every row's own bytes come back from the packed form (a tied token_embd's lookups)
            row = K.row_size(int(type_id), cols)
            for r in range(rows) if type_id in LEGACY else ():
                assert np.array_equal(_ops.prepacked_row(int(type_id), packed, rows, cols, r),
                                      w[r * row:(r + 1) * row]), (rows, cols, r)
    if type_id not in LEGACY:  # a k-quant token_embd stays in place
        with pytest.raises(Exception, match="no prepacked row rebuild"):
            _ops.prepacked_row(int(type_id), packed, rows, cols, 0)
    with pytest.raises(ValueError):  # the packed form's size, not the rows'
        _ops.matmul(None, int(type_id), w, rows, cols, x[:1], prepacked=True)
    with pytest.raises(ValueError):
        _ops.prepack(int(type_id), w[:-1], rows, cols)


def test_a_lower_forced_level_packs_nothing(tmp_path, native_env):
    native_env.setenv("BUBO_FORCE_ISA", "scalar")
    for type_id in PREPACKED:
        blck = K.type_info(int(type_id))["blck_size"]
        assert _ops.prepack(int(type_id), np.zeros(K.row_size(int(type_id), blck), np.uint8), 1, blck) is None
    # a model loaded then is the model in place, bit for bit
    path = write_tiny_model(tmp_path / "q4_0.gguf", "llama", types="Q4_0")
    tokens = np.array(Tokenizer(path).encode(PROMPT, add_special=False)[:40])

    def logits():
        model = Model(path, n_threads=THREADS)
        return model.decode(KVCache(model, n_ctx=64), tokens, np.arange(40), np.zeros(40), np.ones(40, bool))

    assert_same_in_place(native_env, logits)


def test_packed_weights_keep_their_level(tmp_path, native_env):
    """A model packed for this CPU's level keeps those kernels when BUBO_FORCE_ISA lowers the level
    later (the packed layout is that level's): it goes on decoding, every packed matmul as before
    (AVX-512: a Q8_0 model, then AVX2; AVX2: Q4_K beside Q6_K, then the scalar level)."""
    if not HAS_KERNELS:
        pytest.skip(f"no prepacked kernels at this CPU's level ({K.best_isa()}): nothing was packed")
    if K.best_isa() == "avx512":
        path, lower = write_tiny_model(tmp_path / "q8_0.gguf", "llama", types="Q8_0"), "avx2"
    else:
        path, lower = write_tiny_model(tmp_path / "kquant.gguf", "llama", **KQUANT_MODEL), "scalar"
    tokens = np.array(Tokenizer(path).encode(PROMPT, add_special=False)[:8])
    model = Model(path, n_threads=THREADS)
    before = model.decode(KVCache(model, n_ctx=64), tokens, np.arange(8), np.zeros(8), np.ones(8, bool))
    native_env.setenv("BUBO_FORCE_ISA", lower)
    after = model.decode(KVCache(model, n_ctx=64), tokens, np.arange(8), np.zeros(8), np.ones(8, bool))
    assert np.isfinite(after).all() and np.argmax(after, -1).tolist() == np.argmax(before, -1).tolist()


# Q4_K beside Q6_K, at k-quant widths
KQUANT_MODEL = dict(KQUANT_DIMS, types={m: ("Q6_K" if m in ("attn_v", "output") else "Q4_K")
                                        for m in ("token_embd", "attn_q", "attn_k", "attn_v", "attn_output",
                                                  "ffn_gate", "ffn_up", "ffn_down", "output")})
PROMPT = ("The owl turned its head and watched the river, where small fish rose at dusk while the "
          "wind moved through the reeds and the first stars came out over the hills. ") * 3


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "gemma3"])
@pytest.mark.parametrize("types", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "kquant"])
def test_tiny_model_logits_prepacked_or_not(tmp_path, native_env, arch, types):
    """A 40-token prompt in one batch and then token by token: the same logits, bit for bit, with
    the weights prepacked at load and in place ("kquant": Q4_K beside Q6_K)."""
    kw = KQUANT_MODEL if types == "kquant" else dict(types=types)
    path = write_tiny_model(tmp_path / f"{arch}-{types}.gguf", arch, **kw)
    tokens = np.array(Tokenizer(path).encode(PROMPT, add_special=False)[:40])

    def logits():
        model = Model(path, n_threads=THREADS)
        whole = model.decode(KVCache(model, n_ctx=64), tokens, np.arange(40), np.zeros(40), np.ones(40, bool))
        kv = KVCache(model, n_ctx=64)
        steps = np.concatenate([model.decode(kv, tokens[i:i + 1], np.array([i]), np.zeros(1), np.ones(1, bool))
                                for i in range(40)])
        return whole, steps

    assert_same_in_place(native_env, logits)


@pytest.mark.parametrize("name", ["smollm2:135m", "qwen2.5-coder:0.5b", "gemma3:270m"])
def test_catalog_logits_prepacked_or_not(native_env, name):
    """The real models (smollm2: Q4_1 layers and a tied Q8_0 token_embd, packed for the output and
    rebuilt row by row for the lookups; qwen2.5-coder: Q5_0 and Q4_K layers and a Q8_0 output;
    gemma3: Q5_0 and Q4_K layers and a tied Q8_0 token_embd of 262,144 rows):
    64 prompt tokens and 3 more sequences, then decode steps of 4 rows, one per sequence."""
    from bubo import store
    path = str(store.pull(name))
    tokens = np.array(Tokenizer(path).encode(PROMPT, add_special=False)[:64])

    def logits():
        model = Model(path, n_threads=THREADS)
        kv = KVCache(model, n_ctx=512, n_seq_max=4)
        out = [model.decode(kv, tokens, np.arange(64), np.zeros(64), np.ones(64, bool))]
        for s in range(1, 4):  # 3 more sequences with the prompt's tail
            out.append(model.decode(kv, tokens[s:], np.arange(64 - s), np.full(64 - s, s), np.ones(64 - s, bool)))
        for i in range(8):  # decode steps of 4 rows, one per sequence
            t = tokens[i:i + 4]
            out.append(model.decode(kv, t, np.array([64, 63, 62, 61]) + i, np.arange(4), np.ones(4, bool)))
        return np.concatenate(out)

    assert_same_in_place(native_env, logits)


def test_a_long_prompt_through_a_tied_embedding(native_env):
    """smollm2's token_embd is tied and packed: 400 prompt tokens in one batch, their lookups split
    over both threads (each into its own row of scratch), against the rows in place."""
    from bubo import store
    path = str(store.pull("smollm2:135m"))
    tokens = np.array(Tokenizer(path).encode(PROMPT * 12, add_special=False)[:400])
    assert len(tokens) == 400

    def logits():
        model = Model(path, n_threads=THREADS)
        return model.decode(KVCache(model, n_ctx=512), tokens, np.arange(400), np.zeros(400), np.ones(400, bool))

    assert_same_in_place(native_env, logits)


@pytest.mark.parametrize("type_id", PREPACKED, ids=lambda t: t.name)
def test_vec_dots_of_avx2_and_avx512_are_the_same_bits(type_id):
    """Each packed type runs one float chain at both x86 levels (exact integer sums per block or
    super-block, then legacy_tile.h's or kquant_tile.h's fused multiply-adds): a row gives the same
    bits at AVX2 as at AVX-512, and both levels' packed tiles follow their vec_dots
    (test_prepacked_matmul_is_the_same_bits)."""
    if "avx512" not in K.supported_isas():
        pytest.skip("this CPU has no AVX-512 to compare AVX2 with")
    rng = np.random.default_rng(7)
    blck = K.type_info(int(type_id))["blck_size"]
    act = GT(K.type_info(int(type_id))["vec_dot_type"])
    for n_blocks in (1, 6, 35):
        cols = blck * n_blocks
        w = np.ascontiguousarray(realistic_rows(type_id, 8, cols, int(rng.integers(1 << 30)))).view(np.uint8)
        w = w.reshape(8, -1)
        for _ in range(4):
            y = K.quantize(int(act), rng.standard_normal(cols).astype(np.float32) * rng.uniform(0.1, 10))
            for r in range(8):
                a = K.vec_dot(int(type_id), w[r].tobytes(), y.tobytes(), isa="avx2")
                b = K.vec_dot(int(type_id), w[r].tobytes(), y.tobytes(), isa="avx512")
                assert np.float32(a).view(np.uint32) == np.float32(b).view(np.uint32), (n_blocks, r, a, b)


def _zen4() -> bool:
    """This CPU is an AMD Zen 4, as the benchmarks' tables name CPUs (benchmarks/results.py)."""
    spec = importlib.util.spec_from_file_location("_bench_results", ROOT / "benchmarks" / "results.py")
    assert spec is not None and spec.loader is not None
    results = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(results)
    try:
        info = open("/proc/cpuinfo").read()
    except OSError:
        return False
    return "(Zen 4," in results.cpu_label(info)


@pytest.mark.parametrize("isa", PACKING_LEVELS)
def test_prefetching_ahead_or_at_hand_is_the_same_bits(isa, native_env):
    """BUBO_PREFETCH_AHEAD (the tiles' tuned distance, or each piece as they come to it, the
    default on Zen 4) moves no output bit, for every packed type and the token counts that stream."""
    if not HAS_KERNELS:
        pytest.skip(f"no prepacked kernels at this CPU's level ({K.best_isa()})")
    assert K.prefetch_ahead() is not _zen4()  # this CPU's default
    native_env.setenv("BUBO_FORCE_ISA", isa)
    rng = np.random.default_rng(5)
    pool = _ops.ThreadPool(2)
    for type_id in PREPACKED:
        blck = K.type_info(int(type_id))["blck_size"]
        rows, cols = 300, blck * (19 if blck == 256 else 129)
        w = np.ascontiguousarray(realistic_rows(type_id, rows, cols, int(rng.integers(1 << 30)))).view(np.uint8)
        w = w.reshape(-1)
        packed = _ops.prepack(int(type_id), w, rows, cols)
        x = rng.standard_normal((64, cols)).astype(np.float32)
        want = {n: _ops.matmul(pool, int(type_id), w, rows, cols, x[:n]) for n in (1, 3, 9, 64)}
        for ahead in ("0", "1"):
            native_env.setenv("BUBO_PREFETCH_AHEAD", ahead)
            assert K.prefetch_ahead() is (ahead == "1")
            for n, y in want.items():
                got = _ops.matmul(pool, int(type_id), packed, rows, cols, x[:n], prepacked=True)
                assert np.array_equal(bits(got), bits(y)), (type_id.name, ahead, n)
