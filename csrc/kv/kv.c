/* The paged KV cache: two pools of blocks (global layers, sliding-window layers), a block table
 * per sequence and pool, reference counts.
 *
 * A pool's K and V storage is one address-space reservation each (mmap, no access, nothing
 * committed), so a block keeps one fixed address for the pool's life and a view needs no more
 * than a base and a block id. Blocks are committed (made writable, which is when the kernel
 * accounts them) in chunks when the free committed blocks run out, and kept: the global pool
 * grows with use up to n_ctx, and an n_ctx larger than memory costs address space only. The
 * sliding-window pool is bounded by the window, so it is committed whole at creation. */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS, MAP_NORESERVE */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "bubo/kv.h"

#ifndef MAP_NORESERVE
#define MAP_NORESERVE 0
#endif

enum { POOL_GLOBAL, POOL_SWA, N_POOLS };

/* The least the global pool commits at once, in tokens: few enough mprotect calls per prompt,
 * little memory past what a request asked for (smollm2: 6 MiB). */
#define KV_GROW_MIN_TOKENS 256

typedef struct {
    int n_layer;               /* layers stored here */
    int32_t n_blocks;          /* capacity */
    int32_t n_committed;       /* blocks 0 .. n_committed-1 are writable memory; the rest reserved only */
    uint8_t *k;                /* [n_layer][n_blocks][block_size][row_bytes_k], a reservation */
    uint8_t *v;                /* [n_layer][n_blocks][block_size][row_bytes_v], a reservation */
    size_t map_bytes_k, map_bytes_v;
    int32_t *refs;             /* [n_blocks] sequences holding each block; 0 = free */
    int32_t *free_list;        /* [n_blocks] stack of free committed block ids */
    int32_t n_free;            /* committed blocks no sequence holds */
    int32_t *tables;           /* [n_seq_max][max_seq_blocks], indexed by position / block_size */
    int32_t *first;            /* [n_seq_max] first held table entry (the SWA pool releases the ones before) */
} kv_pool;

struct bubo_kv {
    bubo_kv_params p;
    int32_t max_seq_blocks;    /* a block table's capacity: ceil(n_ctx / block_size) */
    size_t row_bytes_k, row_bytes_v;
    size_t block_bytes_k, block_bytes_v; /* one block of one layer */
    kv_pool pools[N_POOLS];
    uint8_t pool_of[BUBO_KV_MAX_LAYERS];   /* layer -> pool */
    int32_t index_in[BUBO_KV_MAX_LAYERS];  /* layer -> its index within that pool */
    int32_t *lens;             /* [n_seq_max] tokens per sequence */
    int32_t *n_new;            /* [n_seq_max] scratch of append_batch: tokens a batch adds */
};

static int32_t blocks_for(const bubo_kv *kv, int64_t n_tokens) {
    return (int32_t)((n_tokens + kv->p.block_size - 1) / kv->p.block_size);
}

static int32_t *table_of(const bubo_kv *kv, const kv_pool *pl, int seq) {
    return pl->tables + (size_t)seq * kv->max_seq_blocks;
}

static int has_swa(const bubo_kv *kv) { return kv->pools[POOL_SWA].n_layer > 0; }

/* The first block a sequence of len tokens still needs in the SWA pool: the one holding the
 * window's start for its next token (at position len). */
static int32_t swa_keep_block(const bubo_kv *kv, int64_t len) {
    const int64_t keep_from = len - kv->p.swa_window + 1;
    return keep_from > 0 ? (int32_t)(keep_from / kv->p.block_size) : 0;
}

static void release_block(kv_pool *pl, int32_t b) {
    if (--pl->refs[b] == 0) pl->free_list[pl->n_free++] = b;
}

static int32_t take_block(kv_pool *pl) {
    const int32_t b = pl->free_list[--pl->n_free];
    pl->refs[b] = 1;
    return b;
}

static void copy_block(const bubo_kv *kv, kv_pool *pl, int32_t dst, int32_t src) {
    for (int il = 0; il < pl->n_layer; il++) {
        uint8_t *k = pl->k + (size_t)il * pl->n_blocks * kv->block_bytes_k;
        uint8_t *v = pl->v + (size_t)il * pl->n_blocks * kv->block_bytes_v;
        memcpy(k + (size_t)dst * kv->block_bytes_k, k + (size_t)src * kv->block_bytes_k, kv->block_bytes_k);
        memcpy(v + (size_t)dst * kv->block_bytes_v, v + (size_t)src * kv->block_bytes_v, kv->block_bytes_v);
    }
}

static size_t pool_bytes(const bubo_kv *kv, const kv_pool *pl) {
    return (kv->block_bytes_k + kv->block_bytes_v) * pl->n_blocks * pl->n_layer;
}

/* Blocks a pool can still hand out: free committed ones plus those not committed yet. */
static int64_t free_capacity(const kv_pool *pl) { return (int64_t)pl->n_free + pl->n_blocks - pl->n_committed; }

static size_t committed_bytes(const bubo_kv *kv, const kv_pool *pl) {
    return (kv->block_bytes_k + kv->block_bytes_v) * pl->n_committed * pl->n_layer;
}

static uint8_t *reserve_space(size_t bytes) {
    void *p = mmap(NULL, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

/* Make blocks [from, to) of every layer of one reservation writable. Ranges are widened to whole
 * pages; a page shared with a neighbour that is already writable stays so. */
static int commit_range(uint8_t *base, size_t map_bytes, int n_layer, int32_t n_blocks, size_t block_bytes,
                        int32_t from, int32_t to) {
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    for (int il = 0; il < n_layer; il++) {
        size_t lo = ((size_t)il * n_blocks + from) * block_bytes;
        size_t hi = ((size_t)il * n_blocks + to) * block_bytes;
        lo -= lo % page;
        hi = hi + page - 1 - (hi + page - 1) % page;
        if (hi > map_bytes) hi = map_bytes;
        if (mprotect(base + lo, hi - lo, PROT_READ | PROT_WRITE)) return 0;
    }
    return 1;
}

/* Commit blocks until n_free >= want (want <= free capacity). Fresh anonymous pages read as
 * zeros, as the calloc'd pools did: a never-written slot is never read (the mask stops at the
 * position), but a copied block must not carry stale NaN bit patterns into a comparison. On
 * failure nothing is committed beyond what already was. */
static bubo_status commit(bubo_kv *kv, kv_pool *pl, int64_t want, bubo_err *err) {
    if (want <= pl->n_free) return BUBO_OK;
    int64_t grow = want - pl->n_free;
    const int64_t grow_min = (KV_GROW_MIN_TOKENS + kv->p.block_size - 1) / kv->p.block_size;
    if (grow < grow_min) grow = grow_min;
    if (grow > pl->n_blocks - pl->n_committed) grow = pl->n_blocks - pl->n_committed;
    const int32_t from = pl->n_committed, to = (int32_t)(from + grow);
    if (!commit_range(pl->k, pl->map_bytes_k, pl->n_layer, pl->n_blocks, kv->block_bytes_k, from, to) ||
        !commit_range(pl->v, pl->map_bytes_v, pl->n_layer, pl->n_blocks, kv->block_bytes_v, from, to)) {
        /* pages made writable before the failure stay so, unused: a later commit covers them again */
        return bubo_set_err(err, BUBO_ERR_NOMEM,
                            "KV cache: out of memory growing to %d of %d blocks (%zu more bytes); use a smaller "
                            "context or free memory",
                            (int)to, (int)pl->n_blocks, (kv->block_bytes_k + kv->block_bytes_v) * (size_t)grow * pl->n_layer);
    }
    /* a stack: the lowest new ids come out first */
    for (int32_t b = to - 1; b >= from; b--) pl->free_list[pl->n_free++] = b;
    pl->n_committed = to;
    return BUBO_OK;
}

static int pool_alloc(bubo_kv *kv, kv_pool *pl, int32_t n_blocks) {
    pl->n_blocks = pl->n_layer > 0 ? n_blocks : 0;
    if (pl->n_blocks == 0) return 1;
    pl->map_bytes_k = kv->block_bytes_k * pl->n_blocks * pl->n_layer;
    pl->map_bytes_v = kv->block_bytes_v * pl->n_blocks * pl->n_layer;
    pl->k = reserve_space(pl->map_bytes_k);
    pl->v = reserve_space(pl->map_bytes_v);
    pl->refs = calloc(pl->n_blocks, sizeof *pl->refs);
    pl->free_list = malloc(pl->n_blocks * sizeof *pl->free_list);
    pl->tables = calloc((size_t)kv->p.n_seq_max * kv->max_seq_blocks, sizeof *pl->tables);
    pl->first = calloc(kv->p.n_seq_max, sizeof *pl->first);
    return pl->k && pl->v && pl->refs && pl->free_list && pl->tables && pl->first;
}

bubo_status bubo_kv_create(const bubo_kv_params *p, bubo_kv **out, bubo_err *err) {
    *out = NULL;
    const bubo_type_traits *tr = bubo_type_get_traits(p->type);
    if (p->type != BUBO_TYPE_F16 && p->type != BUBO_TYPE_F32 && p->type != BUBO_TYPE_Q8_0)
        return bubo_set_err(err, BUBO_ERR_INVALID, "KV cache type must be f16, f32 or q8_0, not %s", tr ? tr->name : "?");
    if (p->n_layer < 1 || p->n_layer > BUBO_KV_MAX_LAYERS || p->n_seq_max < 1 || p->n_ctx < 1 || p->head_dim_k < 1 ||
        p->head_dim_v < 1 || p->n_embd_k % p->head_dim_k || p->n_embd_v % p->head_dim_v)
        return bubo_set_err(err, BUBO_ERR_INVALID, "KV cache: bad shape (n_layer %d, n_ctx %d, n_seq_max %d)",
                            p->n_layer, (int)p->n_ctx, p->n_seq_max);
    if (p->block_size < 1 || p->block_size > BUBO_KV_MAX_BLOCK_SIZE)
        return bubo_set_err(err, BUBO_ERR_INVALID, "KV cache: block_size must be 1..%d, not %d", BUBO_KV_MAX_BLOCK_SIZE,
                            p->block_size);
    if (p->head_dim_k % tr->blck_size || p->head_dim_v % tr->blck_size)
        return bubo_set_err(err, BUBO_ERR_INVALID, "KV cache type %s needs head dims that are multiples of %lld (K %lld, V %lld)",
                            tr->name, (long long)tr->blck_size, (long long)p->head_dim_k, (long long)p->head_dim_v);
    int n_swa = 0;
    for (int il = 0; il < p->n_layer; il++) n_swa += p->is_swa[il] && !p->swa_full;
    if (p->swa_window < 0 || (n_swa > 0 && (p->swa_window < 1 || p->n_batch < 1)))
        return bubo_set_err(err, BUBO_ERR_INVALID, "KV cache: %d sliding-window layers need swa_window >= 1 and n_batch >= 1 "
                            "(got %d and %d)", n_swa, (int)p->swa_window, (int)p->n_batch);

    bubo_kv *kv = calloc(1, sizeof *kv);
    if (!kv) return bubo_set_err(err, BUBO_ERR_NOMEM, "KV cache: out of memory");
    kv->p = *p;
    kv->max_seq_blocks = blocks_for(kv, p->n_ctx);
    kv->row_bytes_k = bubo_row_size(p->type, p->n_embd_k);
    kv->row_bytes_v = bubo_row_size(p->type, p->n_embd_v);
    kv->block_bytes_k = kv->row_bytes_k * p->block_size;
    kv->block_bytes_v = kv->row_bytes_v * p->block_size;
    for (int il = 0; il < p->n_layer; il++) {
        kv->pool_of[il] = p->is_swa[il] && !p->swa_full ? POOL_SWA : POOL_GLOBAL;
        kv->index_in[il] = kv->pools[kv->pool_of[il]].n_layer++;
    }
    /* the global pool is shared: n_ctx tokens in all; the SWA pool holds each sequence's window
     * plus one append (see kv.h), or its whole n_ctx where that is less */
    int64_t swa_per_seq = 0;
    if (n_swa > 0) {
        swa_per_seq = blocks_for(kv, (int64_t)p->swa_window + p->n_batch - 1) + 1;
        if (swa_per_seq > kv->max_seq_blocks) swa_per_seq = kv->max_seq_blocks;
    }
    kv->lens = calloc(p->n_seq_max, sizeof *kv->lens);
    kv->n_new = calloc(p->n_seq_max, sizeof *kv->n_new);
    if (!kv->lens || !kv->n_new || !pool_alloc(kv, &kv->pools[POOL_GLOBAL], kv->max_seq_blocks) ||
        !pool_alloc(kv, &kv->pools[POOL_SWA], (int32_t)(swa_per_seq * p->n_seq_max)) ||
        commit(kv, &kv->pools[POOL_SWA], kv->pools[POOL_SWA].n_blocks, NULL)) {
        const size_t bytes = pool_bytes(kv, &kv->pools[POOL_GLOBAL]) + pool_bytes(kv, &kv->pools[POOL_SWA]);
        bubo_kv_free(kv);
        return bubo_set_err(err, BUBO_ERR_NOMEM, "KV cache: cannot allocate %zu bytes for %d tokens", bytes, (int)p->n_ctx);
    }
    *out = kv;
    return BUBO_OK;
}

void bubo_kv_free(bubo_kv *kv) {
    if (!kv) return;
    for (int i = 0; i < N_POOLS; i++) {
        kv_pool *pl = &kv->pools[i];
        if (pl->k) munmap(pl->k, pl->map_bytes_k);
        if (pl->v) munmap(pl->v, pl->map_bytes_v);
        free(pl->refs);
        free(pl->free_list);
        free(pl->tables);
        free(pl->first);
    }
    free(kv->lens);
    free(kv->n_new);
    free(kv);
}

const bubo_kv_params *bubo_kv_get_params(const bubo_kv *kv) { return &kv->p; }

int32_t bubo_kv_seq_len(const bubo_kv *kv, int seq) {
    return seq >= 0 && seq < kv->p.n_seq_max ? kv->lens[seq] : 0;
}

int64_t bubo_kv_n_free_tokens(const bubo_kv *kv) { return free_capacity(&kv->pools[POOL_GLOBAL]) * kv->p.block_size; }

size_t bubo_kv_nbytes(const bubo_kv *kv) {
    return pool_bytes(kv, &kv->pools[POOL_GLOBAL]) + pool_bytes(kv, &kv->pools[POOL_SWA]);
}

size_t bubo_kv_committed_bytes(const bubo_kv *kv) {
    return committed_bytes(kv, &kv->pools[POOL_GLOBAL]) + committed_bytes(kv, &kv->pools[POOL_SWA]);
}

int32_t bubo_kv_pool_n_committed(const bubo_kv *kv, int swa) { return kv->pools[swa ? POOL_SWA : POOL_GLOBAL].n_committed; }

size_t bubo_kv_token_bytes(const bubo_kv *kv) {
    return (kv->row_bytes_k + kv->row_bytes_v) * kv->pools[POOL_GLOBAL].n_layer;
}

size_t bubo_kv_grow_bytes(const bubo_kv *kv, int seq, int64_t n_tokens) {
    const kv_pool *pl = &kv->pools[POOL_GLOBAL];
    if (seq < 0 || seq >= kv->p.n_seq_max || pl->n_layer == 0) return 0;
    if (n_tokens > kv->p.n_ctx) n_tokens = kv->p.n_ctx;
    /* what seq holds and the free committed blocks are memory already taken; the SWA pool is
     * committed whole */
    const int64_t have = blocks_for(kv, kv->lens[seq]) + pl->n_free;
    const int64_t need = blocks_for(kv, n_tokens) - have;
    return need > 0 ? (size_t)need * (kv->block_bytes_k + kv->block_bytes_v) * pl->n_layer : 0;
}

int32_t bubo_kv_pool_n_blocks(const bubo_kv *kv, int swa) { return kv->pools[swa ? POOL_SWA : POOL_GLOBAL].n_blocks; }

int32_t bubo_kv_pool_n_used(const bubo_kv *kv, int swa) {
    const kv_pool *pl = &kv->pools[swa ? POOL_SWA : POOL_GLOBAL];
    return pl->n_committed - pl->n_free;
}

int32_t bubo_kv_seq_n_blocks(const bubo_kv *kv, int seq, int swa) {
    const kv_pool *pl = &kv->pools[swa ? POOL_SWA : POOL_GLOBAL];
    if (seq < 0 || seq >= kv->p.n_seq_max || pl->n_layer == 0) return 0;
    return blocks_for(kv, kv->lens[seq]) - pl->first[seq];
}

static bubo_status check_seq(const bubo_kv *kv, int seq, bubo_err *err) {
    if (seq < 0 || seq >= kv->p.n_seq_max)
        return bubo_set_err(err, BUBO_ERR_INVALID, "sequence id %d is out of range: this cache holds %d sequences (0..%d)",
                            seq, kv->p.n_seq_max, kv->p.n_seq_max - 1);
    return BUBO_OK;
}

bubo_status bubo_kv_truncate(bubo_kv *kv, int seq, int32_t n, bubo_err *err) {
    if (check_seq(kv, seq, err)) return BUBO_ERR_INVALID;
    if (n < 0 || n > kv->lens[seq])
        return bubo_set_err(err, BUBO_ERR_INVALID, "cannot truncate sequence %d of %d tokens to %d", seq,
                            (int)kv->lens[seq], (int)n);
    if (n > 0 && has_swa(kv) && swa_keep_block(kv, n) < kv->pools[POOL_SWA].first[seq])
        return bubo_set_err(err, BUBO_ERR_INVALID,
                            "cannot truncate sequence %d of %d tokens to %d: its sliding-window layers (window %d) "
                            "no longer hold the positions before %d that the next token would attend to; truncate "
                            "to 0 or to at least %d tokens, or re-run the prompt",
                            seq, (int)kv->lens[seq], (int)n, (int)kv->p.swa_window,
                            (int)(kv->pools[POOL_SWA].first[seq] * kv->p.block_size),
                            (int)(kv->pools[POOL_SWA].first[seq] * kv->p.block_size + kv->p.swa_window - 1));
    const int32_t keep = blocks_for(kv, n), held_end = blocks_for(kv, kv->lens[seq]);
    for (int i = 0; i < N_POOLS; i++) {
        kv_pool *pl = &kv->pools[i];
        if (pl->n_layer == 0) continue;
        int32_t *table = table_of(kv, pl, seq);
        for (int32_t b = keep > pl->first[seq] ? keep : pl->first[seq]; b < held_end; b++) release_block(pl, table[b]);
        if (n == 0) pl->first[seq] = 0;
    }
    kv->lens[seq] = n;
    return BUBO_OK;
}

bubo_status bubo_kv_clear(bubo_kv *kv, int seq, bubo_err *err) { return bubo_kv_truncate(kv, seq, 0, err); }

bubo_status bubo_kv_fork(bubo_kv *kv, int src, int dst, bubo_err *err) {
    if (check_seq(kv, src, err) || check_seq(kv, dst, err)) return BUBO_ERR_INVALID;
    if (src == dst) return BUBO_OK;
    bubo_kv_clear(kv, dst, NULL);
    const int32_t n_b = blocks_for(kv, kv->lens[src]);
    for (int i = 0; i < N_POOLS; i++) {
        kv_pool *pl = &kv->pools[i];
        if (pl->n_layer == 0) continue;
        const int32_t *from = table_of(kv, pl, src);
        int32_t *to = table_of(kv, pl, dst);
        for (int32_t b = pl->first[src]; b < n_b; b++) {
            to[b] = from[b];
            pl->refs[from[b]]++;
        }
        pl->first[dst] = pl->first[src];
    }
    kv->lens[dst] = kv->lens[src];
    return BUBO_OK;
}

/* Blocks pool pl needs to add n_new[s] tokens to every sequence s (new blocks, plus a copy of a
 * shared, partly filled last block that will be written). */
static int64_t blocks_needed(const bubo_kv *kv, const kv_pool *pl, const int32_t *n_new) {
    int64_t need = 0;
    for (int s = 0; s < kv->p.n_seq_max; s++) {
        if (n_new[s] <= 0) continue;
        const int32_t have = blocks_for(kv, kv->lens[s]);
        need += blocks_for(kv, (int64_t)kv->lens[s] + n_new[s]) - have;
        if (kv->lens[s] % kv->p.block_size && pl->refs[table_of(kv, pl, s)[have - 1]] > 1) need++;
    }
    return need;
}

/* Checks n_ctx and the global pool's capacity, then commits the blocks the batch needs, so that
 * appending it (in pieces) cannot fail. */
static bubo_status check_global(bubo_kv *kv, const int32_t *n_new, bubo_err *err) {
    for (int s = 0; s < kv->p.n_seq_max; s++) {
        const int64_t end = (int64_t)kv->lens[s] + n_new[s];
        if (n_new[s] > 0 && end > kv->p.n_ctx)
            return bubo_set_err(err, BUBO_ERR_INVALID,
                                "context full: sequence %d would hold %lld tokens, the cache holds at most %d per "
                                "sequence; use a larger n_ctx or a shorter prompt",
                                s, (long long)end, (int)kv->p.n_ctx);
    }
    kv_pool *pl = &kv->pools[POOL_GLOBAL];
    const int64_t need = pl->n_layer > 0 ? blocks_needed(kv, pl, n_new) : 0;
    if (need > free_capacity(pl))
        return bubo_set_err(err, BUBO_ERR_INVALID,
                            "context full: the batch needs %lld more blocks of %d tokens, %lld are free; free or "
                            "truncate sequences, or use a larger n_ctx",
                            (long long)need, kv->p.block_size, (long long)free_capacity(pl));
    return commit(kv, pl, need, err);
}

static void grow(bubo_kv *kv, kv_pool *pl, int s, int32_t n_new) {
    int32_t *table = table_of(kv, pl, s);
    const int32_t have = blocks_for(kv, kv->lens[s]);
    if (kv->lens[s] % kv->p.block_size && pl->refs[table[have - 1]] > 1) {
        const int32_t copy = take_block(pl);
        copy_block(kv, pl, copy, table[have - 1]);
        release_block(pl, table[have - 1]);
        table[have - 1] = copy;
    }
    for (int32_t b = have; b < blocks_for(kv, (int64_t)kv->lens[s] + n_new); b++) table[b] = take_block(pl);
}

/* Make room for n_new[s] more tokens of every sequence s; all or nothing. */
static bubo_status reserve(bubo_kv *kv, const int32_t *n_new, bubo_err *err) {
    /* check first, so that a refusal changes nothing */
    bubo_status st = check_global(kv, n_new, err);
    if (st) return st;
    kv_pool *swa = &kv->pools[POOL_SWA];
    if (has_swa(kv)) {
        for (int s = 0; s < kv->p.n_seq_max; s++)
            if (n_new[s] > kv->p.n_batch)
                return bubo_set_err(err, BUBO_ERR_INVALID,
                                    "one append may add at most %d tokens to a sequence of a cache with "
                                    "sliding-window layers, not %d (sequence %d); append it in pieces",
                                    (int)kv->p.n_batch, (int)n_new[s], s);
        /* Out-of-window blocks go first, so the new ones can reuse them. Each sequence then holds
         * at most the per-sequence share the pool was sized for, and a copy on write replaces an
         * entry: the pool cannot run out. The check stays, so a broken invariant refuses rather
         * than overruns, and the released blocks were dead either way. */
        for (int s = 0; s < kv->p.n_seq_max; s++) {
            if (n_new[s] <= 0) continue;
            const int32_t keep = swa_keep_block(kv, kv->lens[s]);
            int32_t *table = table_of(kv, swa, s);
            for (; swa->first[s] < keep; swa->first[s]++) release_block(swa, table[swa->first[s]]);
        }
        const int64_t need = blocks_needed(kv, swa, n_new);
        if (need > swa->n_free)
            return bubo_set_err(err, BUBO_ERR_INVALID, "KV cache: the sliding-window pool needs %lld blocks, %d are free",
                                (long long)need, (int)swa->n_free);
    }
    for (int s = 0; s < kv->p.n_seq_max; s++) {
        if (n_new[s] <= 0) continue;
        for (int i = 0; i < N_POOLS; i++)
            if (kv->pools[i].n_layer > 0) grow(kv, &kv->pools[i], s, n_new[s]);
        kv->lens[s] += n_new[s];
    }
    return BUBO_OK;
}

static uint8_t *row(const bubo_kv *kv, int il, int seq, int32_t pos, int want_v) {
    const kv_pool *pl = &kv->pools[kv->pool_of[il]];
    const int32_t b = table_of(kv, pl, seq)[pos / kv->p.block_size];
    const size_t block_bytes = want_v ? kv->block_bytes_v : kv->block_bytes_k;
    const size_t row_bytes = want_v ? kv->row_bytes_v : kv->row_bytes_k;
    return (want_v ? pl->v : pl->k) + ((size_t)kv->index_in[il] * pl->n_blocks + b) * block_bytes +
           (size_t)(pos % kv->p.block_size) * row_bytes;
}

uint8_t *bubo_kv_k_row(bubo_kv *kv, int il, int seq, int32_t pos) { return row(kv, il, seq, pos, 0); }
uint8_t *bubo_kv_v_row(bubo_kv *kv, int il, int seq, int32_t pos) { return row(kv, il, seq, pos, 1); }

void bubo_kv_get_view(const bubo_kv *kv, int il, int seq, bubo_kv_view *view) {
    const kv_pool *pl = &kv->pools[kv->pool_of[il]];
    view->type = kv->p.type;
    view->block_size = kv->p.block_size;
    view->k = pl->k + (size_t)kv->index_in[il] * pl->n_blocks * kv->block_bytes_k;
    view->v = pl->v + (size_t)kv->index_in[il] * pl->n_blocks * kv->block_bytes_v;
    view->block_bytes_k = kv->block_bytes_k;
    view->block_bytes_v = kv->block_bytes_v;
    view->row_bytes_k = kv->row_bytes_k;
    view->row_bytes_v = kv->row_bytes_v;
    view->head_bytes_k = bubo_row_size(kv->p.type, kv->p.head_dim_k);
    view->head_bytes_v = bubo_row_size(kv->p.type, kv->p.head_dim_v);
    view->table = table_of(kv, pl, seq);
}

/* Count each sequence's tokens into kv->n_new, checking ids and positions. */
static bubo_status count_batch(bubo_kv *kv, int32_t n_tokens, const int32_t *seq_ids, const int32_t *pos,
                               bubo_err *err) {
    int32_t *n_new = kv->n_new;
    for (int s = 0; s < kv->p.n_seq_max; s++) n_new[s] = 0;
    for (int32_t t = 0; t < n_tokens; t++) {
        const int s = seq_ids[t];
        if (check_seq(kv, s, err)) return BUBO_ERR_INVALID;
        const int32_t expected = kv->lens[s] + n_new[s];
        if (pos[t] != expected)
            return bubo_set_err(err, BUBO_ERR_INVALID,
                                "batch row %d: position %d does not continue sequence %d, which holds %d tokens%s; "
                                "the next position must be %d (truncate the sequence to rewrite earlier positions)",
                                (int)t, (int)pos[t], s, (int)kv->lens[s], n_new[s] ? " plus earlier rows of this batch" : "",
                                (int)expected);
        n_new[s]++;
    }
    return BUBO_OK;
}

bubo_status bubo_kv_check_batch(bubo_kv *kv, int32_t n_tokens, const int32_t *seq_ids, const int32_t *pos,
                                bubo_err *err) {
    bubo_status st = count_batch(kv, n_tokens, seq_ids, pos, err);
    return st ? st : check_global(kv, kv->n_new, err);
}

bubo_status bubo_kv_append_batch(bubo_kv *kv, int32_t n_tokens, const int32_t *seq_ids, const int32_t *pos,
                                 bubo_err *err) {
    bubo_status st = count_batch(kv, n_tokens, seq_ids, pos, err);
    return st ? st : reserve(kv, kv->n_new, err);
}
