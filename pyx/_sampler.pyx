# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""The native sampler chain (llama.cpp's order). Defaults and validation live in bubo.sampling;
this module takes every field explicitly."""

from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.stdlib cimport malloc, free

import numpy as np

from common cimport *
from sampler cimport *

include "status.pxi"

# The keys Sampler's params must have, no more, no less (SamplingParams.to_native() makes them).
NATIVE_FIELDS = frozenset({
    "temperature", "dynatemp_range", "dynatemp_exponent",
    "top_k", "top_p", "min_p", "typical_p", "top_n_sigma", "min_keep",
    "xtc_probability", "xtc_threshold",
    "repeat_penalty", "repeat_last_n", "presence_penalty", "frequency_penalty",
    "dry_multiplier", "dry_base", "dry_allowed_length", "dry_penalty_last_n", "dry_sequence_breakers",
    "mirostat", "mirostat_tau", "mirostat_eta",
    "seed", "n_probs", "logit_bias",
})

N_DRAWS = BUBO_SAMPLER_N_DRAWS


cdef class Sampler:
    """Sampler(n_vocab, params, vocab_pieces=None): one sequence's sampler.

    params: a dict with exactly the keys in NATIVE_FIELDS (bubo.sampling.SamplingParams.to_native()).
    vocab_pieces: every token's text (list of bytes, n_vocab of them); needed when DRY is on with
    sequence breakers."""
    cdef bubo_sampler *s
    cdef bubo_token_logprob *_top
    cdef int32_t _n_probs
    cdef object _mask_buf
    cdef bint _busy

    def __cinit__(self, n_vocab, dict params, vocab_pieces=None):
        missing = NATIVE_FIELDS - params.keys()
        extra = params.keys() - NATIVE_FIELDS
        if missing or extra:
            raise ValueError(f"sampler params: missing {sorted(missing)}, unknown {sorted(extra)}")
        if not 0 < n_vocab <= 0x7fffffff:
            raise ValueError(f"n_vocab must be in 1..2147483647, got {n_vocab}")
        seed = params["seed"]
        if not 0 <= seed < 2 ** 64:
            raise ValueError(f"seed must be in 0..2**64-1 here, got {seed} (SamplingParams resolves -1)")

        cdef bubo_sampler_params p
        p.temperature = params["temperature"]
        p.dynatemp_range = params["dynatemp_range"]
        p.dynatemp_exponent = params["dynatemp_exponent"]
        p.top_k = params["top_k"]
        p.top_p = params["top_p"]
        p.min_p = params["min_p"]
        p.typical_p = params["typical_p"]
        p.top_n_sigma = params["top_n_sigma"]
        p.min_keep = params["min_keep"]
        p.xtc_probability = params["xtc_probability"]
        p.xtc_threshold = params["xtc_threshold"]
        p.repeat_penalty = params["repeat_penalty"]
        p.repeat_last_n = params["repeat_last_n"]
        p.presence_penalty = params["presence_penalty"]
        p.frequency_penalty = params["frequency_penalty"]
        p.dry_multiplier = params["dry_multiplier"]
        p.dry_base = params["dry_base"]
        p.dry_allowed_length = params["dry_allowed_length"]
        p.dry_penalty_last_n = params["dry_penalty_last_n"]
        p.mirostat = params["mirostat"]
        p.mirostat_tau = params["mirostat_tau"]
        p.mirostat_eta = params["mirostat_eta"]
        p.seed = <uint64_t>seed
        p.n_probs = params["n_probs"]

        bias = params["logit_bias"]
        bias_items = list(bias.items() if isinstance(bias, dict) else bias)
        breakers = [bytes(b) for b in params["dry_sequence_breakers"]]
        cdef Py_ssize_t i, n_bias = len(bias_items), n_breakers = len(breakers)
        cdef bubo_logit_bias *bias_c = <bubo_logit_bias *>malloc((n_bias + 1) * sizeof(bubo_logit_bias))
        cdef const char **brk = <const char **>malloc((n_breakers + 1) * sizeof(char *))
        cdef size_t *brk_len = <size_t *>malloc((n_breakers + 1) * sizeof(size_t))
        cdef const uint64_t[::1] offsets
        cdef const uint8_t[::1] text
        cdef bubo_err err
        cdef bubo_status st
        cdef uint32_t nv = n_vocab
        try:
            if bias_c == NULL or brk == NULL or brk_len == NULL:
                raise MemoryError()
            for i, (tok, b) in enumerate(bias_items):
                if not -0x80000000 <= tok <= 0x7fffffff:
                    raise ValueError(f"logit_bias token {tok} is out of range (vocabulary of {n_vocab})")
                bias_c[i].token = tok
                bias_c[i].bias = b
            p.logit_bias = bias_c
            p.n_logit_bias = n_bias
            for i in range(n_breakers):
                brk[i] = breakers[i]
                brk_len[i] = len(breakers[i])
            p.dry_breakers = brk
            p.dry_breaker_lens = brk_len
            p.n_dry_breakers = n_breakers
            p.vocab_pieces = NULL
            p.vocab_offsets = NULL
            if vocab_pieces is not None:
                pieces = [bytes(x) for x in vocab_pieces]
                if len(pieces) != n_vocab:
                    raise ValueError(f"vocab_pieces has {len(pieces)} entries, the vocabulary {n_vocab}")
                offsets = np.concatenate(([0], np.cumsum([len(x) for x in pieces]))).astype(np.uint64)
                text = np.frombuffer(b"".join(pieces) + b"\0", dtype=np.uint8)
                p.vocab_pieces = <const char *>&text[0]
                p.vocab_offsets = &offsets[0]
            with nogil:
                st = bubo_sampler_create(nv, &p, &self.s, &err)
            check_status(st, &err, "sampler")
        finally:
            free(bias_c)
            free(brk)
            free(brk_len)
        self._n_probs = bubo_sampler_n_probs(self.s)
        self._top = <bubo_token_logprob *>malloc((self._n_probs + 1) * sizeof(bubo_token_logprob))
        if self._top == NULL:
            raise MemoryError()
        self._mask_buf = None  # made at the first mask given as ids (most requests have none)

    def __dealloc__(self):
        if self.s != NULL:
            bubo_sampler_free(self.s)
            self.s = NULL
        free(self._top)
        self._top = NULL

    cdef bubo_sampler *_s(self) except NULL:
        if self.s == NULL:
            raise ValueError("Sampler is not initialized")
        return self.s

    @property
    def n_vocab(self):
        return bubo_sampler_n_vocab(self._s())

    @property
    def n_probs(self):
        """How many alternatives sample() reports (n_probs clamped to n_vocab)."""
        return self._n_probs

    @property
    def seed(self):
        return bubo_sampler_seed(self._s())

    @property
    def mirostat_mu(self):
        """Mirostat's current maximum surprise (2 * tau after reset)."""
        return bubo_sampler_mirostat_mu(self._s())

    cdef object _mask(self, mask, uint32_t n):
        """mask as a contiguous uint8 array of n (the caller's own when it already is one), or None."""
        if mask is None:
            return None
        if isinstance(mask, np.ndarray) and mask.dtype in (np.bool_, np.uint8):
            if mask.shape != (n,):
                raise ValueError(f"mask must have shape ({n},), got {mask.shape}")
            return np.ascontiguousarray(mask).view(np.uint8)
        ids = np.asarray(mask, dtype=np.int64).reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= n):
            bad = ids[(ids < 0) | (ids >= n)][0]
            raise ValueError(f"mask token {bad} is out of range (vocabulary of {n})")
        if self._mask_buf is None:
            self._mask_buf = np.zeros(n, dtype=np.uint8)
        else:
            self._mask_buf[:] = 0
        self._mask_buf[ids] = 1
        return self._mask_buf

    def sample(self, logits, mask=None, draws=None):
        """The next token: (token, logprob, top).

        logits: n_vocab floats. mask: None, a bool/uint8 array of n_vocab (False excludes a token),
        or a sequence of the allowed ids. draws: None, or BUBO_SAMPLER_N_DRAWS uniforms in [0, 1)
        (XTC's coin, the pick) used instead of the seeded stream. logprob and top (n_probs pairs
        (token, logprob), best first) come from the raw logits' log-softmax. Does not record the
        token: call accept()."""
        cdef bubo_sampler *s = self._s()
        cdef uint32_t n = bubo_sampler_n_vocab(s)
        cdef const float[::1] lv = np.ascontiguousarray(logits, dtype=np.float32).reshape(-1)
        if lv.shape[0] != n:
            raise ValueError(f"logits has {lv.shape[0]} values, expected n_vocab = {n}")
        cdef const uint8_t[::1] mv
        cdef const uint8_t *mp = NULL
        m = self._mask(mask, n)
        if m is not None:
            mv = m  # holds the array for the call
            mp = &mv[0]
        cdef double d[BUBO_SAMPLER_N_DRAWS]
        cdef const double *dp = NULL
        if draws is not None:
            dl = [float(x) for x in draws]
            if len(dl) != BUBO_SAMPLER_N_DRAWS or not all(0.0 <= x < 1.0 for x in dl):
                raise ValueError(f"draws must be {BUBO_SAMPLER_N_DRAWS} numbers in [0, 1), got {draws!r}")
            for i in range(BUBO_SAMPLER_N_DRAWS):
                d[i] = dl[i]
            dp = d
        if self._busy:
            raise RuntimeError("Sampler is in use by another thread")
        self._busy = True
        cdef bubo_token_logprob out
        cdef bubo_err err
        cdef bubo_status st
        try:
            with nogil:
                st = bubo_sampler_sample(s, &lv[0], mp, dp, &out, self._top, &err)
        finally:
            self._busy = False
        check_status(st, &err, None)
        cdef int32_t k
        top = [(self._top[k].token, self._top[k].logprob) for k in range(self._n_probs)]
        return out.token, out.logprob, top

    def accept(self, int64_t token):
        """Record an emitted token in the history that penalties and DRY read."""
        cdef bubo_err err
        if not -0x80000000 <= token <= 0x7fffffff:
            raise ValueError(f"token {token} is out of range (vocabulary of {self.n_vocab})")
        check_status(bubo_sampler_accept(self._s(), <int32_t>token, &err), &err, None)

    def reset(self):
        """Forget the history, restore Mirostat's mu, reseed with the same seed."""
        bubo_sampler_reset(self._s())

    def candidates(self):
        """(ids int32, probs float32) the last sample() drew from, most likely first."""
        cdef bubo_sampler *s = self._s()
        cdef size_t n = bubo_sampler_n_candidates(s)
        ids = np.empty(n, dtype=np.int32)
        probs = np.empty(n, dtype=np.float32)
        cdef int32_t[::1] iv = ids
        cdef float[::1] pv = probs
        if n:
            bubo_sampler_candidates(s, &iv[0], &pv[0])
        return ids, probs
