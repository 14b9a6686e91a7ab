/* The paged KV cache.
 *
 * Storage is a pool of fixed-size blocks of block_size tokens; each block holds, for every layer,
 * the K and V rows of its tokens (all KV heads of a token in one row). A sequence is a block
 * table: its token i (which is also its position i) lives in block table[i / block_size] at
 * slot i % block_size. Blocks carry reference counts, so a fork shares every block of its
 * parent and copies a shared block only when it writes into it (copy on write: only ever the
 * partly filled last block). Truncation drops whole blocks past the new end.
 *
 * Sliding-window layers (is_swa, window swa_window) live in a second pool of their own, with
 * their own block tables and reference counts. A token at pos attends to pos - window + 1 .. pos,
 * so when a sequence grows from length L, every SWA block wholly before L - window + 1 is released
 * (the table keeps its absolute indexing; first_block marks where the held part starts). One
 * append adds at most n_batch tokens to a sequence, so a sequence holds at most
 * ceil((window + n_batch - 1) / block_size) + 1 SWA blocks, and the SWA pool has that many per
 * sequence: its memory is bounded by the window, not by n_ctx. Truncating a sequence to n tokens
 * is refused when its SWA layers already dropped a position the next token (at n) would attend
 * to; truncating to 0 (clearing) is always allowed. swa_full keeps the old layout instead (every
 * layer in the global pool, nothing released, any truncation works; the window is then only a mask),
 * for a caller that reuses prompt prefixes by truncation and has no fallback yet.
 *
 * Memory: each pool's storage is reserved as address space at creation and committed (taken from
 * the OS) in chunks as blocks are first needed, then kept until the cache is freed. The global
 * pool thus grows with use up to its n_ctx capacity, and an n_ctx far larger than memory is
 * allowed; running out shows as BUBO_ERR_NOMEM from append_batch/check_batch, nothing changed.
 * (Under Linux's default overcommit the kernel refuses only what it can tell is impossible;
 * a caller that must not be OOM-killed compares bubo_kv_grow_bytes with the memory available.)
 * The sliding-window pool, bounded by the window, is committed whole at creation.
 *
 * Prefix cache (the model is vLLM's automatic prefix caching): a full block of the global pool
 * can be indexed by the chained hash of every token up to its end (bubo_kv_prefix_register), and a
 * new sequence starts from the longest indexed run of blocks matching its prompt, whichever
 * sequence computed them (bubo_kv_prefix_attach). A match is exact, never probabilistic: each
 * indexed block keeps its tokens and its parent block, and a lookup verifies both. An indexed block
 * is immutable: a sequence that would write into it (truncate to mid-block, then append) copies it
 * when shared and takes it out of the index when it is its only holder. A block no sequence holds
 * stays cached while indexed, on a least-recently-used list; an append takes free committed blocks
 * first, then evicts cached ones from the least recently used on, and only then commits more memory,
 * so cached blocks count as free in bubo_kv_n_free_tokens and bubo_kv_grow_bytes, and the cache
 * never makes the pool take memory that grow_bytes did not announce. bubo_kv_pool_n_used counts the
 * blocks sequences hold only. Releasing a sequence releases its last block first, so its tail is
 * evicted before the prefix it hangs from.
 * A cache with a separate sliding-window pool (some is_swa layer, swa_full == 0) shares no prefixes
 * (attach attaches nothing, register does nothing): that pool has already released the window of a
 * finished sequence's early blocks, which a sequence attaching them would need for its next token.
 * With swa_full every layer lives in the global pool and sharing works.
 *
 * Nothing here runs the model: bubo_model_decode (model.h) validates a batch, reserves its
 * blocks through bubo_kv_append_batch, writes rows with bubo_kv_k_row/v_row and attends over
 * bubo_kv_view. */
#ifndef BUBO_KV_H
#define BUBO_KV_H

#include <stddef.h>
#include <stdint.h>

#include "bubo/common.h"
#include "bubo/quants.h"

#ifdef __cplusplus
extern "C" {
#endif

#define BUBO_KV_MAX_BLOCK_SIZE 256
#define BUBO_KV_MAX_LAYERS 512

typedef struct bubo_kv bubo_kv;

typedef struct {
    int n_layer;
    int64_t n_embd_k;   /* K row: n_head_kv * head_dim_k elements per token and layer */
    int64_t n_embd_v;   /* V row: n_head_kv * head_dim_v */
    int64_t head_dim_k; /* a multiple of the storage type's block (32 for Q8_0 and Q4_0) */
    int64_t head_dim_v;
    int32_t n_ctx;      /* most tokens one sequence may hold; the pool has ceil(n_ctx / block_size) blocks */
    int n_seq_max;      /* sequence ids 0 .. n_seq_max-1 */
    int block_size;     /* tokens per block, 1 .. BUBO_KV_MAX_BLOCK_SIZE */
    bubo_type type;     /* K rows: F16 (default), F32, Q8_0 or Q4_0 */
    bubo_type type_v;   /* V rows: the same choices */
    int32_t swa_window; /* tokens a sliding-window layer sees (0: no such layers) */
    int32_t n_batch;    /* most tokens one append may add to one sequence when swa_window > 0 */
    int swa_full;       /* keep every block of the sliding-window layers too, in the global pool */
    uint8_t is_swa[BUBO_KV_MAX_LAYERS]; /* layer il is a sliding-window layer */
} bubo_kv_params;

bubo_status bubo_kv_create(const bubo_kv_params *p, bubo_kv **out, bubo_err *err);
void bubo_kv_free(bubo_kv *kv);
const bubo_kv_params *bubo_kv_get_params(const bubo_kv *kv);

int32_t bubo_kv_seq_len(const bubo_kv *kv, int seq);
/* Blocks of the global pool no sequence holds (free, cached or not committed yet), times block_size. */
int64_t bubo_kv_n_free_tokens(const bubo_kv *kv);
/* Bytes of K and V storage of both pools at full capacity (reserved address space). */
size_t bubo_kv_nbytes(const bubo_kv *kv);
/* Bytes of K and V storage committed so far (both pools). */
size_t bubo_kv_committed_bytes(const bubo_kv *kv);
/* Blocks of the global (swa = 0) or sliding-window pool committed so far. */
int32_t bubo_kv_pool_n_committed(const bubo_kv *kv, int swa);
/* K and V bytes one token takes in the global pool (all its layers). */
size_t bubo_kv_token_bytes(const bubo_kv *kv);
/* Bytes the cache would still have to commit for seq to hold n_tokens (capped at n_ctx), counting
 * the blocks seq holds and the free and cached committed ones as already there. 0 for a bad seq. */
size_t bubo_kv_grow_bytes(const bubo_kv *kv, int seq, int64_t n_tokens);
/* Commit the global pool ahead of use until n_tokens (capped at n_ctx) of it are committed, so
 * that freed prefix blocks stay cached until that much is in use (an append takes a free committed
 * block before it evicts a cached one). BUBO_ERR_NOMEM, nothing more committed, when the OS says no. */
bubo_status bubo_kv_reserve(bubo_kv *kv, int64_t n_tokens, bubo_err *err);
/* Blocks of the global (swa = 0) or sliding-window (swa = 1) pool: in the pool, held by anyone,
 * held by seq. The SWA pool has 0 blocks when the cache has no sliding-window layers. */
int32_t bubo_kv_pool_n_blocks(const bubo_kv *kv, int swa);
int32_t bubo_kv_pool_n_used(const bubo_kv *kv, int swa);
int32_t bubo_kv_seq_n_blocks(const bubo_kv *kv, int seq, int swa);

/* Keep the first n tokens of seq (n <= its length); blocks past them are released. Refused
 * (BUBO_ERR_INVALID, nothing changed) when 0 < n and the SWA layers no longer hold position
 * n - window + 1. */
bubo_status bubo_kv_truncate(bubo_kv *kv, int seq, int32_t n, bubo_err *err);
/* dst becomes a copy of src sharing its blocks (dst's previous contents are released). */
bubo_status bubo_kv_fork(bubo_kv *kv, int src, int dst, bubo_err *err);

/* A sequence's rows, out and in (slot files). The bytes of the first n tokens: every layer's K
 * blocks, then every layer's V blocks, whole blocks (blocks_for(n) per layer). Only a cache
 * without a sliding-window pool (BUBO_ERR_UNSUPPORTED otherwise). Import fills an empty sequence
 * (fresh blocks, its prefix registration started over) and fails, changing nothing, when the
 * pool has no room or the bytes are not exactly seq_bytes(n). */
size_t bubo_kv_seq_bytes(const bubo_kv *kv, int32_t n);
/* Global-pool blocks of seq that another sequence holds too (a fork's shared pages). */
int32_t bubo_kv_seq_n_shared(const bubo_kv *kv, int seq);
/* Whether seq's last block is partly filled and held by another sequence too (its next append
 * copies it: one more block). */
int bubo_kv_seq_last_shared(const bubo_kv *kv, int seq);
bubo_status bubo_kv_seq_export(const bubo_kv *kv, int seq, int32_t n, uint8_t *out, size_t cap, bubo_err *err);
bubo_status bubo_kv_seq_import(bubo_kv *kv, int seq, int32_t n, const uint8_t *in, size_t len, bubo_err *err);
/* Release every block of seq. */
bubo_status bubo_kv_clear(bubo_kv *kv, int seq, bubo_err *err);

/* Append a batch: token t of seq_ids[t] goes at position pos[t]. Each sequence's tokens must
 * continue it (the first at pos == its length, each next at pos + 1). Releases the SWA blocks
 * that fell out of the window, allocates the blocks, copies a shared last block that will be
 * written, and grows each length. All or nothing: on BUBO_ERR_INVALID (a bad sequence id, a
 * position gap, a sequence past n_ctx, more than n_batch tokens for one sequence of a cache with
 * SWA layers, not enough free blocks) or BUBO_ERR_NOMEM (blocks could not be committed) nothing changed. The rows are then written by the caller. */
bubo_status bubo_kv_append_batch(bubo_kv *kv, int32_t n_tokens, const int32_t *seq_ids, const int32_t *pos,
                                 bubo_err *err);
/* What append_batch checks, for a batch the caller will append in pieces of at most n_batch
 * tokens per sequence (each piece then cannot fail): ids, positions, n_ctx and the global pool.
 * Commits the global blocks the batch needs (BUBO_ERR_NOMEM when it cannot); changes nothing else. */
bubo_status bubo_kv_check_batch(bubo_kv *kv, int32_t n_tokens, const int32_t *seq_ids, const int32_t *pos,
                                bubo_err *err);

/* Where token pos of seq keeps KV head `head`'s K (or V) row in layer il (head_dim elements in
 * the cache's type); the token must be reserved. A block holds its tokens head by head: each
 * head's rows of the block follow each other, so that attention, which reads one head at a time,
 * reads memory in order (one head's slice of a row holding every head was a strided read, about
 * a third as fast from memory). */
uint8_t *bubo_kv_k_head(bubo_kv *kv, int il, int seq, int32_t pos, int head);
uint8_t *bubo_kv_v_head(bubo_kv *kv, int il, int seq, int32_t pos, int head);

/* What attention needs to read one sequence of one layer in place. Token i's K row of KV head h:
 * k + table[i / block_size] * block_bytes_k + h * head_stride_k + (i % block_size) * row_bytes_k
 * (a cache: row_bytes_k = head_bytes_k, head_stride_k = block_size * head_bytes_k; a layout with
 * every head of a token side by side has row_bytes_k = n_head_kv * head_bytes_k and
 * head_stride_k = head_bytes_k). For a sliding-window layer only the entries from the window's
 * start on are valid. */
typedef struct {
    bubo_type type;   /* K rows */
    bubo_type type_v; /* V rows */
    int block_size;
    const uint8_t *k, *v;           /* the layer's block pools */
    size_t block_bytes_k, block_bytes_v;
    size_t row_bytes_k, row_bytes_v;     /* from one token to the next, within a block and head */
    size_t head_bytes_k, head_bytes_v;   /* one KV head's row */
    size_t head_stride_k, head_stride_v; /* from one KV head to the next, within a block */
    const int32_t *table;           /* the sequence's block table */
} bubo_kv_view;

void bubo_kv_get_view(const bubo_kv *kv, int il, int seq, bubo_kv_view *view);

/* --- prefix cache (global pool; see the top of this file) --- */

/* seq must be empty. Attaches to seq the longest run of indexed blocks whose tokens are
 * tokens[0 .. k * block_size) with k * block_size <= n_tokens (holding them: a cached block
 * leaves the LRU list), sets seq's length to k * block_size and returns it. Returns -1 (nothing
 * changed) for a bad seq, a non-empty seq or n_tokens < 0; 0 for a cache that shares no prefixes.
 * A caller that needs the logits of the prompt's last token passes n_tokens = its length - 1. */
int32_t bubo_kv_prefix_attach(bubo_kv *kv, int seq, const int32_t *tokens, int32_t n_tokens);
/* tokens are seq's tokens 0 .. n_tokens-1, with their rows written (n_tokens <= seq's length).
 * Indexes every full block among them not indexed yet, chaining from the one before; where an
 * equal block (same tokens after the same indexed parent) is indexed already, that one is kept
 * and seq's copy stays unindexed. Cheap to call after every step: seq remembers how many leading
 * blocks were registered (kept by attach and fork, cut back by truncate), so pass the same tokens
 * each time. BUBO_ERR_INVALID for a bad seq, n_tokens past its length, or tokens that differ from
 * an indexed block seq holds. No-op for a cache that shares no prefixes. */
bubo_status bubo_kv_prefix_register(bubo_kv *kv, int seq, const int32_t *tokens, int32_t n_tokens, bubo_err *err);
/* Drops the whole index: cached blocks become free, held ones writable again. */
void bubo_kv_prefix_clear(bubo_kv *kv);
/* The namespace of the empty sequence seq's chain (0, the default, until set again): its blocks
 * are indexed under it and it attaches only blocks indexed under the same one, so that rows
 * computed differently (another adapter, another caller) are never shared. BUBO_ERR_INVALID for a
 * bad seq, a non-empty one or ns < 0. */
bubo_status bubo_kv_prefix_set_namespace(bubo_kv *kv, int seq, int32_t ns, bubo_err *err);
/* Blocks that are indexed and held by no sequence (reusable by attach, evictable by append). */
int32_t bubo_kv_prefix_n_cached(const bubo_kv *kv);
/* Blocks indexed, held or not. */
int32_t bubo_kv_prefix_n_indexed(const bubo_kv *kv);
/* 1 when this cache shares prefixes (no separate sliding-window pool). */
int bubo_kv_prefix_enabled(const bubo_kv *kv);

typedef struct {
    int64_t n_lookups;    /* attach calls on a cache that shares prefixes */
    int64_t n_hit_blocks; /* blocks those calls attached */
    int64_t n_evicted;    /* cached blocks evicted to make room */
} bubo_kv_prefix_stats;

void bubo_kv_prefix_get_stats(const bubo_kv *kv, bubo_kv_prefix_stats *out);

/* For tests: block hashes are ANDed with mask (0: every block collides), after clearing the index. */
void bubo_kv_prefix_set_hash_mask(bubo_kv *kv, uint64_t mask);
/* For tests: BUBO_ERR_INVALID, naming the first broken one, unless reference counts equal the
 * block tables' holdings, every committed block is exactly one of held, free, cached, used + free
 * + cached == committed in each pool, and the index and LRU list are consistent. O(pool). */
bubo_status bubo_kv_check_invariants(const bubo_kv *kv, bubo_err *err);

#ifdef __cplusplus
}
#endif
#endif
