"""KV cache storage types against the f16 cache, on the catalog models and a real text (bubo's
design notes, tests/data/kv_text.md): N_CHUNKS chunks of 512 tokens, each decoded from an empty cache
as llama-perplexity does its chunks, every position's logits compared. The figures (mean
KL-divergence of each type's next-token distribution from the f16 cache's, the share of positions
whose top token is the same, the largest logit difference) are printed as the test runs; an f32
cache against f16 shows how far these quantized models move for differences in the last bits
alone (their int8 activation blocks amplify them), the floor the others stand on.

Measured (Intel Xeon, AVX-512), mean KL / same top token:
  smollm2:135m        f32 0.0047 / -,  q8_0 0.0065 / 94%,  V q4_0 0.020,  K q4_0 0.17 / 70%
  qwen2.5-coder:0.5b  f32 0.0015 / -,  q8_0 0.017 / 92%,   V q4_0 0.010,  K q4_0 1.9 / 36%
so q8_0 holds (K and V) and q4_0 holds for V rows only: -ctk q4_0 is refused (bubo.engine.engine)."""
import pathlib

import numpy as np
import pytest

from bubo._model import KVCache, Model
from bubo._tokenizer import Tokenizer

from engines import THREADS

pytestmark = [pytest.mark.slow, pytest.mark.models]

TEXT = (pathlib.Path(__file__).resolve().parents[1] / "data" / "kv_text.md").read_text(encoding="utf-8")
CHUNK = 512
N_CHUNKS = 1  # the suite's (the figures below were measured on 2; the bounds are a few times them)
# (K type, V type) -> the most mean KL-divergence from the f16 cache allowed (a few times the
# measured figure: the machines' levels differ in their last bits), and the least share of the
# same top token
BOUNDS = {("f32", "f32"): (0.02, 0.9), ("q8_0", "q8_0"): (0.06, 0.85), ("f16", "q4_0"): (0.08, 0.8)}


def _log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True, dtype=np.float64)).astype(np.float32)


def _compare(a, b, rows=32):
    """Each position's KL-divergence of b's next-token distribution from a's, the number of
    positions with the same top token, the largest logit difference. In float32 with float64 sums
    (its rounding, about 1e-6, is far below the bounds), a few rows at a time (whole copies of
    512 x 152k logits cost seconds each)."""
    kl, same, diff = [], 0, 0.0
    for i in range(0, len(a), rows):
        x, y = a[i:i + rows], b[i:i + rows]
        la, lb = _log_softmax(x), _log_softmax(y)
        kl.append((np.exp(la) * (la - lb)).sum(-1, dtype=np.float64))
        same += int((x.argmax(-1) == y.argmax(-1)).sum())
        diff = max(diff, float(np.abs(x - y).max()))
    return np.concatenate(kl), same, diff


@pytest.mark.parametrize("name", ["smollm2:135m", "qwen2.5-coder:0.5b"])
def test_cache_types_against_f16(catalog_model, capsys, name):
    path = str(catalog_model(name))
    tokens = np.array(Tokenizer(path).encode(TEXT, add_special=False), np.int32)
    assert len(tokens) >= N_CHUNKS * CHUNK, len(tokens)
    model = Model(path, n_threads=THREADS)

    def logits(chunk, type_k, type_v):
        kv = KVCache(model, CHUNK, type=type_k, type_v=type_v)
        t = tokens[chunk * CHUNK:(chunk + 1) * CHUNK]
        return model.decode(kv, t, np.arange(CHUNK), np.zeros(CHUNK), np.ones(CHUNK, bool))

    base = [logits(c, "f16", "f16") for c in range(N_CHUNKS)]
    lines = []
    for (type_k, type_v), (kl_max, top_min) in BOUNDS.items():
        kl, same, diff = [], 0, 0.0
        for c in range(N_CHUNKS):
            k, n, d = _compare(base[c], logits(c, type_k, type_v))
            kl.append(k)
            same += n
            diff = max(diff, d)
        mean_kl = float(np.concatenate(kl).mean())
        lines.append(f"{name} K {type_k} V {type_v} against f16: mean KL {mean_kl:.4f}, same top token "
                     f"{same / (N_CHUNKS * CHUNK):.1%}, largest logit difference {diff:.2f}")
        assert mean_kl <= kl_max and same / (N_CHUNKS * CHUNK) >= top_min, lines[-1]
    with capsys.disabled():
        print("\n" + "\n".join(lines))
