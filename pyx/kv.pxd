# Mirrors csrc/include/bubo/kv.h
from libc.stdint cimport int32_t, int64_t, uint8_t, uint64_t

from common cimport bubo_status, bubo_err
from quants cimport bubo_type

cdef extern from "bubo/kv.h" nogil:
    int BUBO_KV_MAX_BLOCK_SIZE
    int BUBO_KV_MAX_LAYERS

    ctypedef struct bubo_kv:
        pass

    ctypedef struct bubo_kv_params:
        int n_layer
        int64_t n_embd_k
        int64_t n_embd_v
        int64_t head_dim_k
        int64_t head_dim_v
        int32_t n_ctx
        int n_seq_max
        int block_size
        bubo_type type
        bubo_type type_v
        int32_t swa_window
        int32_t n_batch
        int swa_full
        uint8_t is_swa[512]

    ctypedef struct bubo_kv_view:
        bubo_type type
        bubo_type type_v
        int block_size
        const uint8_t *k
        const uint8_t *v
        size_t block_bytes_k, block_bytes_v
        size_t row_bytes_k, row_bytes_v
        size_t head_bytes_k, head_bytes_v
        size_t head_stride_k, head_stride_v
        const int32_t *table

    bubo_status bubo_kv_create(const bubo_kv_params *p, bubo_kv **out, bubo_err *err)
    void bubo_kv_free(bubo_kv *kv)
    const bubo_kv_params *bubo_kv_get_params(const bubo_kv *kv)
    int32_t bubo_kv_seq_len(const bubo_kv *kv, int seq)
    int64_t bubo_kv_n_free_tokens(const bubo_kv *kv)
    size_t bubo_kv_nbytes(const bubo_kv *kv)
    size_t bubo_kv_committed_bytes(const bubo_kv *kv)
    int32_t bubo_kv_pool_n_committed(const bubo_kv *kv, int swa)
    size_t bubo_kv_token_bytes(const bubo_kv *kv)
    size_t bubo_kv_grow_bytes(const bubo_kv *kv, int seq, int64_t n_tokens)
    bubo_status bubo_kv_reserve(bubo_kv *kv, int64_t n_tokens, bubo_err *err)
    int32_t bubo_kv_pool_n_blocks(const bubo_kv *kv, int swa)
    int32_t bubo_kv_pool_n_used(const bubo_kv *kv, int swa)
    int32_t bubo_kv_seq_n_blocks(const bubo_kv *kv, int seq, int swa)
    bubo_status bubo_kv_truncate(bubo_kv *kv, int seq, int32_t n, bubo_err *err)
    bubo_status bubo_kv_fork(bubo_kv *kv, int src, int dst, bubo_err *err)
    size_t bubo_kv_seq_bytes(const bubo_kv *kv, int32_t n)
    int32_t bubo_kv_seq_n_shared(const bubo_kv *kv, int seq)
    int bubo_kv_seq_last_shared(const bubo_kv *kv, int seq)
    bubo_status bubo_kv_seq_export(const bubo_kv *kv, int seq, int32_t n, uint8_t *out, size_t cap, bubo_err *err)
    bubo_status bubo_kv_seq_import(bubo_kv *kv, int seq, int32_t n, const uint8_t *inp, size_t len, bubo_err *err)
    bubo_status bubo_kv_clear(bubo_kv *kv, int seq, bubo_err *err)
    bubo_status bubo_kv_append_batch(bubo_kv *kv, int32_t n_tokens, const int32_t *seq_ids, const int32_t *pos,
                                     bubo_err *err)
    bubo_status bubo_kv_check_batch(bubo_kv *kv, int32_t n_tokens, const int32_t *seq_ids, const int32_t *pos,
                                    bubo_err *err)

    ctypedef struct bubo_kv_prefix_stats:
        int64_t n_lookups
        int64_t n_hit_blocks
        int64_t n_evicted

    int32_t bubo_kv_prefix_attach(bubo_kv *kv, int seq, const int32_t *tokens, int32_t n_tokens)
    bubo_status bubo_kv_prefix_register(bubo_kv *kv, int seq, const int32_t *tokens, int32_t n_tokens, bubo_err *err)
    bubo_status bubo_kv_prefix_set_namespace(bubo_kv *kv, int seq, int32_t ns, bubo_err *err)
    void bubo_kv_prefix_clear(bubo_kv *kv)
    int32_t bubo_kv_prefix_n_cached(const bubo_kv *kv)
    int32_t bubo_kv_prefix_n_indexed(const bubo_kv *kv)
    int bubo_kv_prefix_enabled(const bubo_kv *kv)
    void bubo_kv_prefix_get_stats(const bubo_kv *kv, bubo_kv_prefix_stats *out)
    void bubo_kv_prefix_set_hash_mask(bubo_kv *kv, uint64_t mask)
    bubo_status bubo_kv_check_invariants(const bubo_kv *kv, bubo_err *err)
