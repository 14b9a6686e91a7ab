# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""The native model and its paged KV cache: Model(path) loads a GGUF file, KVCache(model, n_ctx)
holds the keys and values of its sequences, model.decode(kv, ...) runs a batch and returns the
logits of the rows asked for."""
import os

import numpy as np

from bubo import cpus

from libc.stdint cimport int32_t, uint8_t, uint64_t

from common cimport *
from quants cimport bubo_type, bubo_type_traits, bubo_type_get_traits, BUBO_TYPE_COUNT
from kv cimport *
from model cimport *

include "status.pxi"


cdef int _type_id(str name) except -1:
    cdef int i
    cdef const bubo_type_traits *t
    for i in range(BUBO_TYPE_COUNT):
        t = bubo_type_get_traits(i)
        if t != NULL and t.name.decode() == name:
            return i
    raise ValueError(f"unknown KV cache type {name!r} (use 'f16', 'f32', 'q8_0' or 'q4_0')")


# the types a model's weights can be requantized to at load (Model(requant=...))
REQUANT_TYPES = ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0")


# the file's pooling_type (llama.cpp's llama_pooling_type); None when the file does not say
_POOLING_NAMES = {0: "none", 1: "mean", 2: "cls", 3: "last"}


MAX_LORA = BUBO_MAX_LORA
# the matrices an adapter may pair with, in bubo_lora_mat's order, by their GGUF names
LORA_MATS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


cdef class Model:
    """A GGUF model on the native forward pass. n_threads 0 means every CPU this process may run on
    (bubo.cpus.usable); n_threads_batch (0: n_threads) the threads of a step of several tokens, a
    prompt's (llama.cpp's -tb): the pool has the larger of the two, a one-token step uses n_threads."""
    cdef bubo_model *m
    cdef readonly str path
    cdef readonly dict hparams
    cdef object _pool_owner  # the model whose thread pool this one runs on (share_pool)
    cdef bint _hidden

    def __cinit__(self, path, int n_threads=0, requant=None, int n_threads_batch=0):
        self.path = os.fsdecode(os.fspath(path))
        cdef bytes bpath = os.fsencode(self.path)
        if b"\0" in bpath:
            raise ValueError("path contains a NUL byte")
        if n_threads == 0:
            n_threads = cpus.usable()
        if n_threads_batch == 0:
            n_threads_batch = n_threads
        if n_threads < 1 or n_threads_batch < 1:
            raise ValueError(f"threads must be at least 1, got {n_threads} and {n_threads_batch} for batches")
        cdef int rq = BUBO_TYPE_COUNT
        if requant is not None:
            if requant not in REQUANT_TYPES:
                raise ValueError(f"weights cannot be requantized to {requant!r} (use {', '.join(REQUANT_TYPES)})")
            rq = _type_id(requant)
        cdef bubo_err err
        cdef const char *cpath = bpath
        cdef bubo_status st
        with nogil:
            st = bubo_model_load_as(cpath, max(n_threads, n_threads_batch), rq, &self.m, &err)
        check_status(st, &err, None)
        check_status(bubo_model_set_threads(self.m, n_threads, n_threads_batch, &err), &err, None)
        cdef const bubo_hparams *hp = bubo_model_hparams(self.m)
        self.hparams = {
            "arch": hp.arch_name.decode(),
            "n_layer": hp.n_layer,
            "n_embd": hp.n_embd,
            "n_head": hp.n_head,
            "n_head_kv": hp.n_head_kv,
            "head_dim": hp.head_dim_k,
            "head_dim_v": hp.head_dim_v,
            "n_ff": hp.n_ff,
            "n_vocab": hp.n_vocab,
            "n_ctx_train": hp.n_ctx_train,
            "n_rot": hp.n_rot,
            "rope_neox": bool(hp.rope_neox),
            "rope_freq_base": hp.rope_freq_base,
            "rope_freq_scale": hp.rope_freq_scale,
            "rope_freq_base_swa": hp.rope_freq_base_swa,
            "norm_eps": hp.norm_eps,
            "sliding_window": hp.sliding_window,
            "swa_layers": [i for i in range(hp.n_layer) if hp.is_swa[i]],
            "embd_scale": hp.embd_scale,
            "final_logit_softcap": hp.final_logit_softcap,
            "tied_output": bool(hp.tied_output),
            "causal": bool(hp.causal),
            "n_token_types": hp.n_token_types,
            "pooling": _POOLING_NAMES.get(<int>hp.pooling),
            "n_threads": bubo_model_n_threads(self.m),
            "n_threads_batch": bubo_model_n_threads_batch(self.m),
        }

    def __dealloc__(self):
        bubo_model_free(self.m)

    @property
    def n_vocab(self):
        return bubo_model_hparams(self.m).n_vocab

    def __repr__(self):
        return f"Model({self.path!r}, arch={self.hparams['arch']!r}, n_layer={self.hparams['n_layer']})"

    @property
    def active_threads(self):
        """The threads the last step ran on: n_threads for one token, n_threads_batch for more."""
        return bubo_model_active_threads(self.m)

    def share_pool(self, Model other not None):
        """Run on other's thread pool from now on (this model's own is let go): for a draft model
        and its target, which never decode at the same time. Both must have the same thread
        count (ValueError otherwise); other is kept alive as long as this model."""
        cdef bubo_err err
        check_status(bubo_model_share_pool(self.m, other.m, &err), &err, None)
        self._pool_owner = other

    @property
    def out_vocab(self):
        """Logits come for tokens 0 .. out_vocab - 1 (n_vocab unless set lower)."""
        return bubo_model_out_vocab(self.m)

    @out_vocab.setter
    def out_vocab(self, n):
        """Logits for the first n tokens only (rounded up to a multiple of 16; 0 or >= n_vocab:
        every token): a draft model's output product then reads only their rows."""
        cdef bubo_err err
        check_status(bubo_model_set_out_vocab(self.m, int(n), &err), &err, None)

    @property
    def output_hidden(self):
        """True while decode returns normed hidden states [n_out, n_embd] instead of logits."""
        return self._hidden

    @output_hidden.setter
    def output_hidden(self, bint on):
        bubo_model_set_output_hidden(self.m, on)
        self._hidden = on

    def encode(self, tokens, seq_lens):
        """An encoder's last hidden states: tokens (int32) holds the sequences end to end,
        seq_lens their lengths. Returns float32 [len(tokens), n_embd]. ValueError for a decoder,
        an empty or too long sequence, a token id out of range."""
        cdef int32_t[::1] tok = np.ascontiguousarray(tokens, dtype=np.int32).reshape(-1)
        cdef int32_t[::1] lens = np.ascontiguousarray(seq_lens, dtype=np.int32).reshape(-1)
        cdef Py_ssize_t n = tok.shape[0], n_seqs = lens.shape[0]
        if n_seqs > 0x7fffffff:
            raise ValueError("too many sequences")
        out = np.empty((n, bubo_model_hparams(self.m).n_embd), dtype=np.float32)
        if n_seqs == 0 and n == 0:
            return out
        cdef float *op = NULL
        cdef float[:, ::1] o
        if n > 0:
            o = out
            op = &o[0, 0]
        cdef int32_t *tp = &tok[0] if n > 0 else NULL
        cdef int32_t *lp = &lens[0] if n_seqs > 0 else NULL
        cdef bubo_err err
        cdef bubo_status st
        with nogil:
            st = bubo_model_encode(self.m, <int64_t>n, tp, <int32_t>n_seqs, lp, op, &err)
        check_status(st, &err, None)
        return out

    def lora_set(self, int slot, int layer, int mat, a, b, float factor):
        """Adapter slot's pair for a layer's matrix (mat: LORA_MATS' index): a float32 [r, cols] and
        b [rows, r] (copied), factor alpha / r. ValueError for shapes that are not the matrix's."""
        an = np.ascontiguousarray(a, dtype=np.float32)
        bn = np.ascontiguousarray(b, dtype=np.float32)
        rows, cols = self.matrix_shape(layer, mat)
        # the C side copies rows * r and r * cols floats: the shapes must be the matrix's
        if an.ndim != 2 or bn.ndim != 2 or an.shape[0] < 1 or bn.shape[1] != an.shape[0] or \
                an.shape[1] != cols or bn.shape[0] != rows:
            raise ValueError(f"layer {layer} {LORA_MATS[mat]}: a must be [r, {cols}] and b [{rows}, r]; got a "
                             f"{an.shape}, b {bn.shape}")
        cdef float[:, ::1] av = an
        cdef float[:, ::1] bv = bn
        r = an.shape[0]
        cdef bubo_err err
        cdef bubo_status st
        st = bubo_model_lora_set(self.m, slot, layer, mat, <int32_t>r, &av[0, 0], &bv[0, 0], factor, &err)
        check_status(st, &err, None)

    def lora_clear(self, int slot):
        bubo_model_lora_clear(self.m, slot)

    def matrix_shape(self, int layer, int mat):
        """(rows, cols) of a layer's matrix for y = W x (mat: LORA_MATS' index)."""
        if not 0 <= mat < len(LORA_MATS):
            raise ValueError(f"matrix {mat}: give 0..{len(LORA_MATS) - 1}")
        hp = self.hparams
        nq = hp["n_head"] * hp["head_dim"]
        nk = hp["n_head_kv"] * hp["head_dim"]
        nv = hp["n_head_kv"] * hp["head_dim_v"]
        no = hp["n_head"] * hp["head_dim_v"]
        d, ff = hp["n_embd"], hp["n_ff"]
        return ((nq, d), (nk, d), (nv, d), (d, no), (ff, d), (ff, d), (d, ff))[mat]

    def decode(self, KVCache kv not None, tokens, pos, seq_ids, logits_rows, lora_scales=None):
        """Run a batch: tokens, pos, seq_ids (int32, one entry per row) and logits_rows (bool: which
        rows get logits); lora_scales (float32 [rows, MAX_LORA], or None) each row's adapter scales.
        Returns float32 [n_out, out_vocab] (n_embd with output_hidden), the wanted rows in batch
        order."""
        if kv.model is not self:
            raise ValueError("this KV cache belongs to another model")
        cdef int32_t[::1] tok = np.ascontiguousarray(tokens, dtype=np.int32).reshape(-1)
        cdef int32_t[::1] p = np.ascontiguousarray(pos, dtype=np.int32).reshape(-1)
        cdef int32_t[::1] sq = np.ascontiguousarray(seq_ids, dtype=np.int32).reshape(-1)
        want_arr = np.ascontiguousarray(logits_rows, dtype=np.bool_).reshape(-1)
        cdef uint8_t[::1] want = want_arr.view(np.uint8)
        cdef Py_ssize_t n = tok.shape[0]
        if p.shape[0] != n or sq.shape[0] != n or want.shape[0] != n:
            raise ValueError(f"tokens, pos, seq_ids and logits_rows must have the same length "
                             f"(got {n}, {p.shape[0]}, {sq.shape[0]}, {want.shape[0]})")
        if n > 0x7fffffff:
            raise ValueError("batch too large")
        cdef Py_ssize_t n_out = int(want_arr.sum())
        out = np.empty((n_out, bubo_model_out_width(self.m)), dtype=np.float32)
        if n == 0:
            return out
        cdef float[:, ::1] o = out
        cdef float *op = &o[0, 0] if n_out > 0 else NULL
        cdef float[:, ::1] ls
        cdef const float *lp = NULL
        if lora_scales is not None:
            ls = np.ascontiguousarray(lora_scales, dtype=np.float32)
            if ls.shape[0] != n or ls.shape[1] != BUBO_MAX_LORA:
                raise ValueError(f"lora_scales must be [{n}, {BUBO_MAX_LORA}]; got "
                                 f"[{ls.shape[0]}, {ls.shape[1]}]")
            lp = &ls[0, 0]
        cdef bubo_err err
        cdef bubo_status st
        with nogil:
            st = bubo_model_decode_lora(self.m, kv.kv, <int32_t>n, &tok[0], &p[0], &sq[0], &want[0], lp, op, &err)
        check_status(st, &err, None)
        return out


cdef class KVCache:
    """The paged KV cache of one model: n_ctx tokens at most per sequence (the global pool holds
    ceil(n_ctx / block_size) blocks, shared by n_seq_max sequences), stored as f16, f32 or q8_0.
    With swa_full=False, sliding-window layers have a pool of their own that keeps each
    sequence's window plus n_batch tokens only (model.decode then runs a batch in chunks of at
    most n_batch rows), and truncate refuses to go below what they released. swa_full=True (the
    default, until bubo.llm falls back from that refusal) keeps every block, as before.
    The global pool is address space until used: memory is taken in chunks as blocks are first
    needed and kept (committed_bytes), so n_ctx may exceed memory; when the OS refuses more,
    decode raises MemoryError and the cache is unchanged.
    Prefix cache (global pool only, so not with swa_full=False): prefix_register indexes a
    sequence's full blocks by their tokens, prefix_attach starts a new sequence from the longest
    cached run; blocks no sequence holds stay cached (n_cached_blocks, counted as free) until an
    append evicts them, least recently used first, before the pool takes more memory."""
    cdef bubo_kv *kv
    cdef readonly Model model

    def __cinit__(self, Model model not None, int n_ctx, int n_seq_max=1, int block_size=32, str type="f16",
                  int n_batch=BUBO_MODEL_MAX_BATCH, bint swa_full=True, type_v=None):
        if n_batch < 1 or n_batch > BUBO_MODEL_MAX_BATCH:
            raise ValueError(f"n_batch must be 1..{BUBO_MODEL_MAX_BATCH}, not {n_batch}")
        cdef bubo_kv_params p
        bubo_model_kv_params(model.m, &p)
        p.n_ctx = n_ctx
        p.n_batch = n_batch
        p.swa_full = swa_full
        p.n_seq_max = n_seq_max
        p.block_size = block_size
        p.type = <bubo_type>_type_id(type)
        p.type_v = <bubo_type>_type_id(type if type_v is None else type_v)
        cdef bubo_err err
        cdef bubo_status st
        with nogil:
            st = bubo_kv_create(&p, &self.kv, &err)
        check_status(st, &err, None)
        self.model = model

    def __dealloc__(self):
        bubo_kv_free(self.kv)

    @property
    def n_ctx(self):
        return bubo_kv_get_params(self.kv).n_ctx

    @property
    def n_seq_max(self):
        return bubo_kv_get_params(self.kv).n_seq_max

    @property
    def block_size(self):
        return bubo_kv_get_params(self.kv).block_size

    @property
    def type(self):
        return bubo_type_get_traits(bubo_kv_get_params(self.kv).type).name.decode()

    @property
    def type_v(self):
        return bubo_type_get_traits(bubo_kv_get_params(self.kv).type_v).name.decode()

    @property
    def n_free_tokens(self):
        return bubo_kv_n_free_tokens(self.kv)

    @property
    def nbytes(self):
        """Bytes of K and V storage at full capacity, both pools (reserved, not all taken)."""
        return bubo_kv_nbytes(self.kv)

    @property
    def committed_bytes(self):
        """Bytes of K and V storage taken from the OS so far (kept once taken)."""
        return bubo_kv_committed_bytes(self.kv)

    @property
    def token_bytes(self):
        """K and V bytes one token takes in the global pool."""
        return bubo_kv_token_bytes(self.kv)

    def grow_bytes(self, int seq, long long n_tokens):
        """Bytes the cache would still take from the OS for seq to hold n_tokens (capped at n_ctx)."""
        self._check_seq(seq)
        return bubo_kv_grow_bytes(self.kv, seq, n_tokens)

    def reserve(self, long long n_tokens):
        """Commit the global pool ahead of use up to n_tokens (capped at n_ctx): freed prefix blocks
        then stay cached until that much is in use. MemoryError when the OS refuses."""
        cdef bubo_err err
        check_status(bubo_kv_reserve(self.kv, n_tokens, &err), &err, None)

    def committed_blocks(self, bint swa=False):
        """Blocks of the global (or sliding-window) pool taken from the OS so far."""
        return bubo_kv_pool_n_committed(self.kv, swa)

    @property
    def sliding_window(self):
        return bubo_kv_get_params(self.kv).swa_window

    @property
    def swa_full(self):
        return bool(bubo_kv_get_params(self.kv).swa_full)

    def pool_blocks(self, bint swa=False):
        """Blocks in the global (or sliding-window) pool."""
        return bubo_kv_pool_n_blocks(self.kv, swa)

    def blocks_in_use(self, bint swa=False):
        """Blocks of the global (or sliding-window) pool some sequence holds."""
        return bubo_kv_pool_n_used(self.kv, swa)

    def seq_blocks(self, int seq, bint swa=False):
        """Blocks seq holds in the global (or sliding-window) pool."""
        self._check_seq(seq)
        return bubo_kv_seq_n_blocks(self.kv, seq, swa)

    cdef int _check_seq(self, int seq) except -1:
        if seq < 0 or seq >= bubo_kv_get_params(self.kv).n_seq_max:
            raise ValueError(f"sequence id {seq} is out of range: this cache holds "
                             f"{bubo_kv_get_params(self.kv).n_seq_max} sequences")
        return 0

    def seq_len(self, int seq):
        self._check_seq(seq)
        return bubo_kv_seq_len(self.kv, seq)

    def truncate(self, int seq, int n):
        """Keep the first n tokens of seq. ValueError when the sliding-window layers already
        dropped a position the next token would attend to (n = 0 always works)."""
        cdef bubo_err err
        check_status(bubo_kv_truncate(self.kv, seq, n, &err), &err, None)

    def fork(self, int src, int dst):
        """dst becomes a copy of src (sharing its blocks; dst's old contents are dropped)."""
        cdef bubo_err err
        check_status(bubo_kv_fork(self.kv, src, dst, &err), &err, None)

    def seq_shared_blocks(self, int seq):
        """seq's blocks that another sequence holds too (shared by a fork, copied when written)."""
        return bubo_kv_seq_n_shared(self.kv, seq)

    def seq_last_shared(self, int seq):
        """Whether seq's last block is partly filled and shared (its next append copies it)."""
        return bool(bubo_kv_seq_last_shared(self.kv, seq))

    def seq_bytes(self, int n):
        """Bytes export_rows gives for n tokens (whole blocks of every layer's K and V)."""
        return bubo_kv_seq_bytes(self.kv, n)

    def export_rows(self, int seq, int n):
        """The K and V rows of seq's first n tokens, as bytes (slot files). ValueError for a
        cache with sliding-window layers (they keep only their window)."""
        cdef size_t size = bubo_kv_seq_bytes(self.kv, n) if n > 0 else 0
        out = bytearray(size)
        cdef unsigned char[::1] view = out if size else bytearray(1)
        cdef bubo_err err
        cdef bubo_status st
        with nogil:
            st = bubo_kv_seq_export(self.kv, seq, n, &view[0], size, &err)
        check_status(st, &err, None)
        return bytes(out)

    def import_rows(self, int seq, int n, const unsigned char[::1] data):
        """Fill the empty sequence seq with n tokens' rows from export_rows' bytes (of a cache of
        the same model and types). ValueError for the wrong size or a sequence not empty,
        MemoryError without room; nothing changes then."""
        cdef size_t size = data.shape[0]
        cdef const unsigned char *p = &data[0] if size else NULL
        cdef bubo_err err
        cdef bubo_status st
        with nogil:
            st = bubo_kv_seq_import(self.kv, seq, n, p, size, &err)
        check_status(st, &err, None)

    def free(self, int seq):
        """Drop every token of seq."""
        cdef bubo_err err
        check_status(bubo_kv_clear(self.kv, seq, &err), &err, None)

    # --- prefix cache (kv.h): full blocks indexed by their tokens, shared across sequences

    @staticmethod
    def _tokens(tokens):
        arr = np.ascontiguousarray(tokens, dtype=np.int32).reshape(-1)
        if arr.shape[0] > 0x7fffffff:
            raise ValueError("too many tokens")
        return arr

    def prefix_attach(self, int seq, tokens):
        """seq (empty) starts with the longest run of cached full blocks that begins tokens, as
        many tokens as fit in len(tokens); returns that length (a multiple of block_size). Pass
        the prompt without its last token when that token's logits are needed. ValueError when
        seq is not empty. 0 for a cache with a sliding-window pool (swa_full=False)."""
        self._check_seq(seq)
        cdef int32_t[::1] t = KVCache._tokens(tokens)
        cdef int32_t n = <int32_t>t.shape[0]
        cdef const int32_t *tp = &t[0] if n > 0 else NULL
        cdef int32_t got
        with nogil:
            got = bubo_kv_prefix_attach(self.kv, seq, tp, n)
        if got < 0:
            raise ValueError(f"prefix_attach needs an empty sequence; sequence {seq} holds "
                             f"{bubo_kv_seq_len(self.kv, seq)} tokens")
        return got

    def prefix_namespace(self, int seq, int ns):
        """The namespace of the empty sequence seq (0 by default): it attaches and registers only
        blocks of its namespace. For rows computed differently from the same tokens (an adapter)."""
        cdef bubo_err err
        cdef bubo_status st = bubo_kv_prefix_set_namespace(self.kv, seq, ns, &err)
        check_status(st, &err, None)

    def prefix_register(self, int seq, tokens):
        """Index the full blocks of tokens (seq's tokens from 0, rows written) so that later
        prompts can attach them. Cheap to call after every step with the same growing tokens."""
        cdef int32_t[::1] t = KVCache._tokens(tokens)
        cdef int32_t n = <int32_t>t.shape[0]
        cdef const int32_t *tp = &t[0] if n > 0 else NULL
        cdef bubo_err err
        cdef bubo_status st
        with nogil:
            st = bubo_kv_prefix_register(self.kv, seq, tp, n, &err)
        check_status(st, &err, None)

    def prefix_clear(self):
        """Forget every cached prefix (cached blocks become free)."""
        with nogil:
            bubo_kv_prefix_clear(self.kv)

    @property
    def n_cached_blocks(self):
        """Blocks that are indexed and held by no sequence."""
        return bubo_kv_prefix_n_cached(self.kv)

    @property
    def n_indexed_blocks(self):
        """Blocks that are indexed, held or not."""
        return bubo_kv_prefix_n_indexed(self.kv)

    @property
    def prefix_enabled(self):
        """Whether this cache shares prefixes (False with a sliding-window pool)."""
        return bool(bubo_kv_prefix_enabled(self.kv))

    def prefix_stats(self):
        """{"lookups", "hit_blocks", "evicted"} since the cache was made."""
        cdef bubo_kv_prefix_stats st
        bubo_kv_prefix_get_stats(self.kv, &st)
        return {"lookups": st.n_lookups, "hit_blocks": st.n_hit_blocks, "evicted": st.n_evicted}

    def _prefix_hash_mask(self, uint64_t mask):
        """Tests: clear the index and AND every block hash with mask (0: all collide)."""
        bubo_kv_prefix_set_hash_mask(self.kv, mask)

    def _check(self):
        """Tests: raise ValueError naming the first broken invariant of the pools and the index."""
        cdef bubo_err err
        cdef bubo_status st
        with nogil:
            st = bubo_kv_check_invariants(self.kv, &err)
        check_status(st, &err, None)
