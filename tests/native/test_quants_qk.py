"""k-quant kernels (Q8_K activations): the edge cases test_quants.py does not reach.

- the Q8_K quantizer against a numpy oracle, byte for byte, in every variant (all variants
  round half to even, so they agree exactly, not only within a step), bsums included.
"""

import numpy as np
import pytest

from bubo import _kernels as K

Q8_K = 15
Q8_K_AMAX_MIN = np.float32(1e-36)  # as csrc/quants/q8_k.c: smaller blocks quantize to zeros
ISAS = K.supported_isas()


def q8_K_fields(raw: np.ndarray):
    """(d, qs, bsums) of a uint8 array of Q8_K blocks."""
    blocks = raw.reshape(-1, 292)
    d = blocks[:, :4].copy().view(np.float32)[:, 0]
    qs = blocks[:, 4:260].view(np.int8)
    bsums = blocks[:, 260:].copy().view(np.int16)
    return d, qs, bsums


def q8_K_oracle(x: np.ndarray):
    """d = amax / 127 and q = round-half-even(x * (127 / amax)), in float32 as the kernels; a block
    with amax below Q8_K_AMAX_MIN is all zeros."""
    blocks = x.reshape(-1, 256).astype(np.float32)
    amax = np.abs(blocks).max(axis=1)
    zero = amax < Q8_K_AMAX_MIN
    with np.errstate(divide="ignore", over="ignore"):  # the zero blocks' lanes, discarded
        iscale = np.where(zero, np.float32(0), np.float32(127) / amax).astype(np.float32)
    q = np.rint(blocks * iscale[:, None]).astype(np.int8)
    d = np.where(zero, np.float32(0), amax / np.float32(127)).astype(np.float32)
    return d, q, q.reshape(-1, 16, 16).sum(axis=2, dtype=np.int16)


@pytest.mark.parametrize("isa", ISAS)
def test_q8_K_quantizer_matches_oracle(isa):
    rng = np.random.default_rng(5)
    x = (rng.standard_normal(256 * 12) * 10.0 ** rng.uniform(-3, 3, size=256 * 12)).astype(np.float32)
    x[:256] = 0                                   # all-zero block
    x[256:512] = np.linspace(-1, 1, 256)          # ties at half steps
    x[512:768] = np.float32(1e-30)                # tiny but nonzero
    x[768:1024] = rng.choice([-3e4, 3e4], 256)    # every element at +-amax
    x[1024] = -1e6                                # one outlier
    x[1280:1536] = np.float32(1e-37)              # 127 / amax would overflow: zeros
    x[1536:1792] = np.float32(2e-36)              # just above that
    d, qs, bsums = q8_K_fields(K.quantize(Q8_K, x, isa))
    d_ref, qs_ref, bsums_ref = q8_K_oracle(x)
    np.testing.assert_array_equal(d, d_ref)
    np.testing.assert_array_equal(qs, qs_ref)
    np.testing.assert_array_equal(bsums, bsums_ref)
    assert qs.min() >= -127 and qs.max() <= 127
    assert d[0] == 0 and not qs[0].any() and not bsums[0].any()


def test_q8_K_dequantize():
    rng = np.random.default_rng(6)
    x = rng.standard_normal(512).astype(np.float32)
    raw = K.quantize(Q8_K, x, "scalar")
    d, qs, _ = q8_K_fields(raw)
    np.testing.assert_array_equal(K.dequantize(Q8_K, raw.tobytes(), "scalar"),
                                  (d[:, None] * qs.astype(np.float32)).reshape(-1))
