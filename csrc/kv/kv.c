/* The paged KV cache: two pools of blocks (global layers, sliding-window layers), a block table
 * per sequence and pool, reference counts.
 *
 * A pool's K and V storage is one address-space reservation each (mmap, no access, nothing
 * committed), so a block keeps one fixed address for the pool's life and a view needs no more
 * than a base and a block id. Blocks are committed (made writable, which is when the kernel
 * accounts them) in chunks when the free committed blocks run out, and kept: the global pool
 * grows with use up to n_ctx, and an n_ctx larger than memory costs address space only. The
 * sliding-window pool is bounded by the window, so it is committed whole at creation.
 *
 * The prefix cache (global pool only, see kv.h): a full block can be indexed under the chained
 * hash of every token up to its end. A block's state is then one of: free (refs 0, on the free
 * list), held (refs > 0, indexed or not), cached (refs 0, indexed, on the LRU list). Exactness
 * does not rest on the hash: an indexed block keeps its tokens and its parent (the indexed block
 * before it, with the parent's generation, which grows each time that block leaves the index),
 * and a lookup checks both, so a block whose parent was evicted or rewritten can never be reached
 * again (it stays cached, unreachable, until evicted in its turn). */
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

/* A chain's hash before its first block (any odd constant: the golden ratio's bits). */
#define PREFIX_HASH_SEED 0x9e3779b97f4a7c15ull

typedef struct {
    int n_layer;               /* layers stored here */
    int32_t n_blocks;          /* capacity */
    int32_t n_committed;       /* blocks 0 .. n_committed-1 are writable memory; the rest reserved only */
    uint8_t *k;                /* [n_layer][n_blocks][n_head_kv][block_size][head_bytes_k], a reservation */
    uint8_t *v;                /* [n_layer][n_blocks][n_head_kv][block_size][head_bytes_v], a reservation */
    size_t map_bytes_k, map_bytes_v;
    int32_t *refs;             /* [n_blocks] sequences holding each block; 0 = free */
    int32_t *free_list;        /* [n_blocks] stack of free committed block ids */
    int32_t n_free;            /* committed blocks no sequence holds */
    int32_t *tables;           /* [n_seq_max][max_seq_blocks], indexed by position / block_size */
    int32_t *first;            /* [n_seq_max] first held table entry (the SWA pool releases the ones before) */
} kv_pool;

/* The index of full global blocks by content, and the LRU list of the cached (unreferenced) ones.
 * All arrays are sized at creation from the pool's block count. */
typedef struct {
    int on;                    /* 0 when a sliding-window pool exists (see kv.h): everything below is NULL */
    uint64_t hash_mask;        /* ~0; tests narrow it to force collisions */
    uint64_t *hash;            /* [n_blocks] chained hash of an indexed block */
    int32_t *parent;           /* [n_blocks] the indexed block before it in its chain, -1 for a first block */
    uint64_t *parent_gen;      /* [n_blocks] gen[parent] when the block was indexed */
    uint64_t *gen;             /* [n_blocks] bumped each time the block leaves the index */
    uint8_t *indexed;          /* [n_blocks] */
    int32_t *tokens;           /* [n_blocks][block_size] the tokens of an indexed block */
    int32_t *bucket;           /* [n_buckets] first indexed block of each hash chain, -1 if none */
    int32_t *chain_next;       /* [n_blocks] next block in the same bucket */
    uint32_t bucket_mask;      /* n_buckets - 1 (a power of two >= n_blocks) */
    int32_t *lru_prev, *lru_next; /* [n_blocks] the cached blocks, lru_head the least recently used */
    int32_t lru_head, lru_tail;
    int32_t n_cached;
    /* per sequence: its leading blocks register already went through, and the block and hash
     * that the next one chains from (an equal block indexed earlier, or the sequence's own) */
    int32_t *seq_n_reg;        /* [n_seq_max] */
    int32_t *seq_parent;       /* [n_seq_max] */
    uint64_t *seq_parent_gen;  /* [n_seq_max] */
    uint64_t *seq_hash;        /* [n_seq_max] */
    int32_t *seq_root;         /* [n_seq_max] -1 - the sequence's namespace: the parent its first block is indexed under */
    bubo_kv_prefix_stats stats;
} kv_prefix;

struct bubo_kv {
    bubo_kv_params p;
    int32_t max_seq_blocks;    /* a block table's capacity: ceil(n_ctx / block_size) */
    size_t row_bytes_k, row_bytes_v;   /* a token's K (V) for every head */
    size_t head_bytes_k, head_bytes_v; /* one head's: within a block, a head's rows follow each other */
    size_t block_bytes_k, block_bytes_v; /* one block of one layer */
    kv_pool pools[N_POOLS];
    uint8_t pool_of[BUBO_KV_MAX_LAYERS];   /* layer -> pool */
    int32_t index_in[BUBO_KV_MAX_LAYERS];  /* layer -> its index within that pool */
    int32_t *lens;             /* [n_seq_max] tokens per sequence */
    int32_t *n_new;            /* [n_seq_max] scratch of append_batch: tokens a batch adds */
    kv_prefix px;              /* the global pool's prefix index */
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

/* --- prefix index ------------------------------------------------------------------------ */

static uint64_t prefix_hash(const kv_prefix *px, uint64_t parent_hash, const int32_t *tokens, int n) {
    /* FNV-1a over the tokens from the parent's hash, then splitmix64's finalizer to spread it */
    uint64_t h = parent_hash;
    for (int i = 0; i < n; i++) h = (h ^ (uint32_t)tokens[i]) * 0x100000001b3ull;
    h ^= h >> 30, h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 27, h *= 0x94d049bb133111ebull;
    h ^= h >> 31;
    return h & px->hash_mask;
}

/* The hash a chain starts from: the seed, mixed with the namespace of a root other than -1
 * (bubo_kv_prefix_set_namespace). */
static uint64_t root_hash(const kv_prefix *px, int32_t root) {
    const uint64_t ns = (uint64_t)(-1 - (int64_t)root);
    return (PREFIX_HASH_SEED ^ (ns * 0xff51afd7ed558ccdull)) & px->hash_mask;
}

static uint32_t bucket_of(const kv_prefix *px, uint64_t h) { return (uint32_t)(h ^ (h >> 32)) & px->bucket_mask; }

static void lru_unlink(kv_prefix *px, int32_t b) {
    const int32_t prev = px->lru_prev[b], next = px->lru_next[b];
    if (prev >= 0) px->lru_next[prev] = next; else px->lru_head = next;
    if (next >= 0) px->lru_prev[next] = prev; else px->lru_tail = prev;
    px->n_cached--;
}

static void lru_push(kv_prefix *px, int32_t b) {
    px->lru_prev[b] = px->lru_tail;
    px->lru_next[b] = -1;
    if (px->lru_tail >= 0) px->lru_next[px->lru_tail] = b; else px->lru_head = b;
    px->lru_tail = b;
    px->n_cached++;
}

/* The indexed block with hash h, parent `parent` (still the same generation) and these tokens. */
static int32_t index_find(const bubo_kv *kv, uint64_t h, int32_t parent, uint64_t parent_gen, const int32_t *tokens) {
    const kv_prefix *px = &kv->px;
    const int bs = kv->p.block_size;
    for (int32_t b = px->bucket[bucket_of(px, h)]; b >= 0; b = px->chain_next[b])
        if (px->hash[b] == h && px->parent[b] == parent && (parent < 0 || px->parent_gen[b] == parent_gen) &&
            memcmp(px->tokens + (size_t)b * bs, tokens, bs * sizeof *tokens) == 0)
            return b;
    return -1;
}

static void index_add(bubo_kv *kv, int32_t b, uint64_t h, int32_t parent, uint64_t parent_gen, const int32_t *tokens) {
    kv_prefix *px = &kv->px;
    memcpy(px->tokens + (size_t)b * kv->p.block_size, tokens, kv->p.block_size * sizeof *tokens);
    px->hash[b] = h;
    px->parent[b] = parent;
    px->parent_gen[b] = parent_gen;
    px->indexed[b] = 1;
    const uint32_t k = bucket_of(px, h);
    px->chain_next[b] = px->bucket[k];
    px->bucket[k] = b;
}

/* Drop b from the index (not from the LRU list: callers do that). Its generation moves on, so
 * the blocks indexed after it no longer chain from it. */
static void index_remove(bubo_kv *kv, int32_t b) {
    kv_prefix *px = &kv->px;
    int32_t *link = &px->bucket[bucket_of(px, px->hash[b])];
    while (*link != b) link = &px->chain_next[*link];
    *link = px->chain_next[b];
    px->indexed[b] = 0;
    px->gen[b]++;
}

static int is_indexed(const bubo_kv *kv, const kv_pool *pl, int32_t b) {
    return pl == &kv->pools[POOL_GLOBAL] && kv->px.on && kv->px.indexed[b];
}

/* --- blocks ------------------------------------------------------------------------------- */

/* An unreferenced block stays cached if indexed, else goes back to the free list. */
static void release_block(bubo_kv *kv, kv_pool *pl, int32_t b) {
    if (--pl->refs[b] > 0) return;
    if (is_indexed(kv, pl, b)) lru_push(&kv->px, b);
    else pl->free_list[pl->n_free++] = b;
}

/* A free committed block, else the least recently used cached one (evicted from the index). The
 * caller made sure one exists. */
static int32_t take_block(bubo_kv *kv, kv_pool *pl) {
    int32_t b;
    if (pl->n_free > 0) {
        b = pl->free_list[--pl->n_free];
    } else {
        kv_prefix *px = &kv->px;
        b = px->lru_head;
        lru_unlink(px, b);
        index_remove(kv, b);
        px->stats.n_evicted++;
    }
    pl->refs[b] = 1;
    return b;
}

/* Blocks a pool can hand out without committing more: free committed ones, then cached ones. */
static int64_t n_reusable(const bubo_kv *kv, const kv_pool *pl) {
    return (int64_t)pl->n_free + (pl == &kv->pools[POOL_GLOBAL] ? kv->px.n_cached : 0);
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

/* Blocks a pool can still hand out: free and cached committed ones plus those not committed yet. */
static int64_t free_capacity(const bubo_kv *kv, const kv_pool *pl) {
    return n_reusable(kv, pl) + pl->n_blocks - pl->n_committed;
}

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

/* Commit blocks until n_free + n_cached >= want (want <= free capacity): cached blocks are
 * evicted before the pool takes more memory, so bubo_kv_grow_bytes is what an append commits. Fresh anonymous pages read as
 * zeros, as the calloc'd pools did: a never-written slot is never read (the mask stops at the
 * position), but a copied block must not carry stale NaN bit patterns into a comparison. On
 * failure nothing is committed beyond what already was. */
static bubo_status commit(bubo_kv *kv, kv_pool *pl, int64_t want, bubo_err *err) {
    const int64_t have = n_reusable(kv, pl);
    if (want <= have) return BUBO_OK;
    int64_t grow = want - have;
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

/* The prefix index of the global pool; only where no sliding-window pool exists (kv.h says why). */
static int prefix_alloc(bubo_kv *kv) {
    kv_prefix *px = &kv->px;
    const int32_t n = kv->pools[POOL_GLOBAL].n_blocks;
    px->hash_mask = ~0ull;
    px->lru_head = px->lru_tail = -1;
    if (has_swa(kv) || n == 0) return 1;
    px->on = 1;
    uint32_t n_buckets = 1;
    while (n_buckets < (uint32_t)n) n_buckets *= 2;
    px->bucket_mask = n_buckets - 1;
    px->hash = calloc(n, sizeof *px->hash);
    px->parent = calloc(n, sizeof *px->parent);
    px->parent_gen = calloc(n, sizeof *px->parent_gen);
    px->gen = calloc(n, sizeof *px->gen);
    px->indexed = calloc(n, sizeof *px->indexed);
    px->tokens = calloc((size_t)n * kv->p.block_size, sizeof *px->tokens);
    px->bucket = malloc(n_buckets * sizeof *px->bucket);
    px->chain_next = calloc(n, sizeof *px->chain_next);
    px->lru_prev = calloc(n, sizeof *px->lru_prev);
    px->lru_next = calloc(n, sizeof *px->lru_next);
    px->seq_n_reg = calloc(kv->p.n_seq_max, sizeof *px->seq_n_reg);
    px->seq_parent = calloc(kv->p.n_seq_max, sizeof *px->seq_parent);
    px->seq_parent_gen = calloc(kv->p.n_seq_max, sizeof *px->seq_parent_gen);
    px->seq_hash = calloc(kv->p.n_seq_max, sizeof *px->seq_hash);
    px->seq_root = malloc(kv->p.n_seq_max * sizeof *px->seq_root);
    if (!px->hash || !px->parent || !px->parent_gen || !px->gen || !px->indexed || !px->tokens || !px->bucket ||
        !px->chain_next || !px->lru_prev || !px->lru_next || !px->seq_n_reg || !px->seq_parent || !px->seq_parent_gen ||
        !px->seq_hash || !px->seq_root)
        return 0;
    for (uint32_t k = 0; k < n_buckets; k++) px->bucket[k] = -1;
    for (int s = 0; s < kv->p.n_seq_max; s++) {
        px->seq_root[s] = -1;
        px->seq_parent[s] = -1;
        px->seq_hash[s] = PREFIX_HASH_SEED & px->hash_mask;
    }
    return 1;
}

static void prefix_free(kv_prefix *px) {
    free(px->hash);
    free(px->parent);
    free(px->parent_gen);
    free(px->gen);
    free(px->indexed);
    free(px->tokens);
    free(px->bucket);
    free(px->chain_next);
    free(px->lru_prev);
    free(px->lru_next);
    free(px->seq_n_reg);
    free(px->seq_parent);
    free(px->seq_parent_gen);
    free(px->seq_hash);
    free(px->seq_root);
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
    const bubo_type_traits *tr = bubo_type_get_traits(p->type), *tr_v = bubo_type_get_traits(p->type_v);
    for (int i = 0; i < 2; i++) {
        const bubo_type t = i ? p->type_v : p->type;
        const bubo_type_traits *ti = i ? tr_v : tr;
        if (t != BUBO_TYPE_F16 && t != BUBO_TYPE_F32 && t != BUBO_TYPE_Q8_0 && t != BUBO_TYPE_Q4_0)
            return bubo_set_err(err, BUBO_ERR_INVALID, "KV cache %s type must be f16, f32, q8_0 or q4_0, not %s",
                                i ? "V" : "K", ti ? ti->name : "?");
    }
    if (p->n_layer < 1 || p->n_layer > BUBO_KV_MAX_LAYERS || p->n_seq_max < 1 || p->n_ctx < 1 || p->head_dim_k < 1 ||
        p->head_dim_v < 1 || p->n_embd_k % p->head_dim_k || p->n_embd_v % p->head_dim_v)
        return bubo_set_err(err, BUBO_ERR_INVALID, "KV cache: bad shape (n_layer %d, n_ctx %d, n_seq_max %d)",
                            p->n_layer, (int)p->n_ctx, p->n_seq_max);
    if (p->block_size < 1 || p->block_size > BUBO_KV_MAX_BLOCK_SIZE)
        return bubo_set_err(err, BUBO_ERR_INVALID, "KV cache: block_size must be 1..%d, not %d", BUBO_KV_MAX_BLOCK_SIZE,
                            p->block_size);
    if (p->head_dim_k % tr->blck_size)
        return bubo_set_err(err, BUBO_ERR_INVALID, "KV cache K type %s needs a K head dim that is a multiple of %lld, not %lld",
                            tr->name, (long long)tr->blck_size, (long long)p->head_dim_k);
    if (p->head_dim_v % tr_v->blck_size)
        return bubo_set_err(err, BUBO_ERR_INVALID, "KV cache V type %s needs a V head dim that is a multiple of %lld, not %lld",
                            tr_v->name, (long long)tr_v->blck_size, (long long)p->head_dim_v);
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
    kv->row_bytes_v = bubo_row_size(p->type_v, p->n_embd_v);
    kv->head_bytes_k = bubo_row_size(p->type, p->head_dim_k); /* head dims are whole blocks: rows = heads */
    kv->head_bytes_v = bubo_row_size(p->type_v, p->head_dim_v);
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
        commit(kv, &kv->pools[POOL_SWA], kv->pools[POOL_SWA].n_blocks, NULL) || !prefix_alloc(kv)) {
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
    prefix_free(&kv->px);
    free(kv->lens);
    free(kv->n_new);
    free(kv);
}

const bubo_kv_params *bubo_kv_get_params(const bubo_kv *kv) { return &kv->p; }

int32_t bubo_kv_seq_len(const bubo_kv *kv, int seq) {
    return seq >= 0 && seq < kv->p.n_seq_max ? kv->lens[seq] : 0;
}

int64_t bubo_kv_n_free_tokens(const bubo_kv *kv) { return free_capacity(kv, &kv->pools[POOL_GLOBAL]) * kv->p.block_size; }

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
    /* what seq holds and the free and cached committed blocks are memory already taken (an
     * append evicts cached blocks before it commits more); the SWA pool is committed whole */
    const int64_t have = blocks_for(kv, kv->lens[seq]) + n_reusable(kv, pl);
    const int64_t need = blocks_for(kv, n_tokens) - have;
    return need > 0 ? (size_t)need * (kv->block_bytes_k + kv->block_bytes_v) * pl->n_layer : 0;
}

bubo_status bubo_kv_reserve(bubo_kv *kv, int64_t n_tokens, bubo_err *err) {
    kv_pool *pl = &kv->pools[POOL_GLOBAL];
    if (pl->n_layer == 0 || n_tokens <= 0) return BUBO_OK;
    if (n_tokens > kv->p.n_ctx) n_tokens = kv->p.n_ctx;
    int64_t target = blocks_for(kv, n_tokens);
    if (target > pl->n_blocks) target = pl->n_blocks;
    if (target <= pl->n_committed) return BUBO_OK;
    return commit(kv, pl, n_reusable(kv, pl) + (target - pl->n_committed), err);
}

int32_t bubo_kv_pool_n_blocks(const bubo_kv *kv, int swa) { return kv->pools[swa ? POOL_SWA : POOL_GLOBAL].n_blocks; }

int32_t bubo_kv_pool_n_used(const bubo_kv *kv, int swa) {
    const kv_pool *pl = &kv->pools[swa ? POOL_SWA : POOL_GLOBAL];
    return pl->n_committed - (int32_t)n_reusable(kv, pl);
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

/* register starts over for seq: it re-walks the blocks, finding the indexed ones cheaply */
static void prefix_seq_reset(bubo_kv *kv, int seq) {
    kv_prefix *px = &kv->px;
    px->seq_n_reg[seq] = 0;
    px->seq_parent[seq] = px->seq_root[seq];
    px->seq_parent_gen[seq] = 0;
    px->seq_hash[seq] = root_hash(px, px->seq_root[seq]);
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
        /* last block first: a sequence's tail becomes less recently used than its head, so
         * eviction takes the ends of chains before the prefixes they hang from */
        const int32_t from = keep > pl->first[seq] ? keep : pl->first[seq];
        for (int32_t b = held_end - 1; b >= from; b--) release_block(kv, pl, table[b]);
        if (n == 0) pl->first[seq] = 0;
    }
    kv->lens[seq] = n;
    if (kv->px.on && kv->px.seq_n_reg[seq] > n / kv->p.block_size) prefix_seq_reset(kv, seq);
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
    if (kv->px.on) {
        /* dst holds src's blocks, so it holds what src registered */
        kv_prefix *px = &kv->px;
        px->seq_n_reg[dst] = px->seq_n_reg[src];
        px->seq_parent[dst] = px->seq_parent[src];
        px->seq_parent_gen[dst] = px->seq_parent_gen[src];
        px->seq_hash[dst] = px->seq_hash[src];
        px->seq_root[dst] = px->seq_root[src];
    }
    return BUBO_OK;
}

/* --- a sequence's rows, out and in ------------------------------------------------------- */

size_t bubo_kv_seq_bytes(const bubo_kv *kv, int32_t n) {
    const kv_pool *pl = &kv->pools[POOL_GLOBAL];
    return n <= 0 ? 0 : (size_t)blocks_for(kv, n) * pl->n_layer * (kv->block_bytes_k + kv->block_bytes_v);
}

int32_t bubo_kv_seq_n_shared(const bubo_kv *kv, int seq) {
    if (seq < 0 || seq >= kv->p.n_seq_max) return 0;
    const kv_pool *pl = &kv->pools[POOL_GLOBAL];
    if (pl->n_layer == 0) return 0;
    const int32_t *table = table_of(kv, pl, seq);
    int32_t n = 0;
    for (int32_t b = pl->first[seq]; b < blocks_for(kv, kv->lens[seq]); b++) n += pl->refs[table[b]] > 1;
    return n;
}

int bubo_kv_seq_last_shared(const bubo_kv *kv, int seq) {
    if (seq < 0 || seq >= kv->p.n_seq_max || kv->lens[seq] % kv->p.block_size == 0) return 0;
    const kv_pool *pl = &kv->pools[POOL_GLOBAL];
    if (pl->n_layer == 0) return 0;
    return pl->refs[table_of(kv, pl, seq)[blocks_for(kv, kv->lens[seq]) - 1]] > 1;
}

static bubo_status check_rows(const bubo_kv *kv, int seq, int32_t n, bubo_err *err) {
    if (check_seq(kv, seq, err)) return BUBO_ERR_INVALID;
    if (has_swa(kv))
        return bubo_set_err(err, BUBO_ERR_UNSUPPORTED,
                            "a cache with sliding-window layers keeps only their window: its rows cannot be saved");
    if (n <= 0 || n > kv->p.n_ctx)
        return bubo_set_err(err, BUBO_ERR_INVALID, "%d tokens: give 1 to %d", (int)n, (int)kv->p.n_ctx);
    return BUBO_OK;
}

bubo_status bubo_kv_seq_export(const bubo_kv *kv, int seq, int32_t n, uint8_t *out, size_t cap, bubo_err *err) {
    const bubo_status checked = check_rows(kv, seq, n, err);
    if (checked) return checked;
    if (n > kv->lens[seq])
        return bubo_set_err(err, BUBO_ERR_INVALID, "sequence %d holds %d tokens, not %d", seq, (int)kv->lens[seq],
                            (int)n);
    if (cap < bubo_kv_seq_bytes(kv, n))
        return bubo_set_err(err, BUBO_ERR_INVALID, "%zu bytes of room for %zu", cap, bubo_kv_seq_bytes(kv, n));
    const kv_pool *pl = &kv->pools[POOL_GLOBAL];
    const int32_t *table = table_of(kv, pl, seq);
    const int32_t nb = blocks_for(kv, n);
    for (int kind = 0; kind < 2; kind++) {
        const size_t bb = kind ? kv->block_bytes_v : kv->block_bytes_k;
        for (int il = 0; il < pl->n_layer; il++) {
            const uint8_t *base = (kind ? pl->v : pl->k) + (size_t)il * pl->n_blocks * bb;
            for (int32_t b = 0; b < nb; b++, out += bb) memcpy(out, base + (size_t)table[b] * bb, bb);
        }
    }
    return BUBO_OK;
}

bubo_status bubo_kv_seq_import(bubo_kv *kv, int seq, int32_t n, const uint8_t *in, size_t len, bubo_err *err) {
    const bubo_status checked = check_rows(kv, seq, n, err);
    if (checked) return checked;
    if (kv->lens[seq] != 0)
        return bubo_set_err(err, BUBO_ERR_INVALID, "sequence %d is not empty (%d tokens)", seq, (int)kv->lens[seq]);
    if (len != bubo_kv_seq_bytes(kv, n))
        return bubo_set_err(err, BUBO_ERR_INVALID, "%zu bytes for %d tokens: this cache's rows take %zu", len, (int)n,
                            bubo_kv_seq_bytes(kv, n));
    kv_pool *pl = &kv->pools[POOL_GLOBAL];
    const int32_t nb = blocks_for(kv, n);
    if (nb > free_capacity(kv, pl))
        return bubo_set_err(err, BUBO_ERR_NOMEM, "KV cache: %d blocks needed, %lld free", (int)nb,
                            (long long)free_capacity(kv, pl));
    bubo_status st = commit(kv, pl, nb, err);
    if (st) return st;
    int32_t *table = table_of(kv, pl, seq);
    for (int32_t b = 0; b < nb; b++) table[b] = take_block(kv, pl);
    for (int kind = 0; kind < 2; kind++) {
        const size_t bb = kind ? kv->block_bytes_v : kv->block_bytes_k;
        for (int il = 0; il < pl->n_layer; il++) {
            uint8_t *base = (kind ? pl->v : pl->k) + (size_t)il * pl->n_blocks * bb;
            for (int32_t b = 0; b < nb; b++, in += bb) memcpy(base + (size_t)table[b] * bb, in, bb);
        }
    }
    pl->first[seq] = 0;
    kv->lens[seq] = n;
    if (kv->px.on) prefix_seq_reset(kv, seq);
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
    if (need > free_capacity(kv, pl))
        return bubo_set_err(err, BUBO_ERR_INVALID,
                            "context full: the batch needs %lld more blocks of %d tokens, %lld are free; free or "
                            "truncate sequences, or use a larger n_ctx",
                            (long long)need, kv->p.block_size, (long long)free_capacity(kv, pl));
    return commit(kv, pl, need, err);
}

static void grow(bubo_kv *kv, kv_pool *pl, int s, int32_t n_new) {
    int32_t *table = table_of(kv, pl, s);
    const int32_t have = blocks_for(kv, kv->lens[s]);
    /* an indexed block is immutable: a shared one is copied as before, one only s holds leaves
     * the index before s writes into it */
    if (kv->lens[s] % kv->p.block_size && pl->refs[table[have - 1]] > 1) {
        const int32_t copy = take_block(kv, pl);
        copy_block(kv, pl, copy, table[have - 1]);
        release_block(kv, pl, table[have - 1]);
        table[have - 1] = copy;
    } else if (kv->lens[s] % kv->p.block_size && is_indexed(kv, pl, table[have - 1])) {
        index_remove(kv, table[have - 1]);
    }
    for (int32_t b = have; b < blocks_for(kv, (int64_t)kv->lens[s] + n_new); b++) table[b] = take_block(kv, pl);
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
            for (; swa->first[s] < keep; swa->first[s]++) release_block(kv, swa, table[swa->first[s]]);
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

static uint8_t *head_row(const bubo_kv *kv, int il, int seq, int32_t pos, int head, int want_v) {
    const kv_pool *pl = &kv->pools[kv->pool_of[il]];
    const int32_t b = table_of(kv, pl, seq)[pos / kv->p.block_size];
    const size_t block_bytes = want_v ? kv->block_bytes_v : kv->block_bytes_k;
    const size_t head_bytes = want_v ? kv->head_bytes_v : kv->head_bytes_k;
    return (want_v ? pl->v : pl->k) + ((size_t)kv->index_in[il] * pl->n_blocks + b) * block_bytes +
           ((size_t)head * kv->p.block_size + (size_t)(pos % kv->p.block_size)) * head_bytes;
}

uint8_t *bubo_kv_k_head(bubo_kv *kv, int il, int seq, int32_t pos, int head) { return head_row(kv, il, seq, pos, head, 0); }
uint8_t *bubo_kv_v_head(bubo_kv *kv, int il, int seq, int32_t pos, int head) { return head_row(kv, il, seq, pos, head, 1); }

void bubo_kv_get_view(const bubo_kv *kv, int il, int seq, bubo_kv_view *view) {
    const kv_pool *pl = &kv->pools[kv->pool_of[il]];
    view->type = kv->p.type;
    view->type_v = kv->p.type_v;
    view->block_size = kv->p.block_size;
    view->k = pl->k + (size_t)kv->index_in[il] * pl->n_blocks * kv->block_bytes_k;
    view->v = pl->v + (size_t)kv->index_in[il] * pl->n_blocks * kv->block_bytes_v;
    view->block_bytes_k = kv->block_bytes_k;
    view->block_bytes_v = kv->block_bytes_v;
    view->row_bytes_k = kv->head_bytes_k; /* a head's rows follow each other in a block */
    view->row_bytes_v = kv->head_bytes_v;
    view->head_bytes_k = kv->head_bytes_k;
    view->head_bytes_v = kv->head_bytes_v;
    view->head_stride_k = kv->head_bytes_k * kv->p.block_size;
    view->head_stride_v = kv->head_bytes_v * kv->p.block_size;
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

/* --- prefix cache ------------------------------------------------------------------------- */

int32_t bubo_kv_prefix_attach(bubo_kv *kv, int seq, const int32_t *tokens, int32_t n_tokens) {
    if (seq < 0 || seq >= kv->p.n_seq_max || kv->lens[seq] != 0 || n_tokens < 0) return -1;
    kv_prefix *px = &kv->px;
    if (!px->on) return 0;
    kv_pool *pl = &kv->pools[POOL_GLOBAL];
    int32_t *table = table_of(kv, pl, seq);
    const int bs = kv->p.block_size;
    int32_t n_full = n_tokens / bs;
    if (n_full > kv->max_seq_blocks) n_full = kv->max_seq_blocks;
    int32_t parent = px->seq_root[seq], k = 0;
    uint64_t h = root_hash(px, parent);
    px->stats.n_lookups++;
    for (; k < n_full; k++) {
        const int32_t *t = tokens + (size_t)k * bs;
        const uint64_t hk = prefix_hash(px, h, t, bs);
        const int32_t b = index_find(kv, hk, parent, parent >= 0 ? px->gen[parent] : 0, t);
        if (b < 0) break;
        if (pl->refs[b]++ == 0) lru_unlink(px, b);
        table[k] = b;
        parent = b;
        h = hk;
    }
    px->stats.n_hit_blocks += k;
    kv->lens[seq] = k * bs;
    /* what it attached is indexed already: register goes on from there */
    px->seq_n_reg[seq] = k;
    px->seq_parent[seq] = parent;
    px->seq_parent_gen[seq] = parent >= 0 ? px->gen[parent] : 0;
    px->seq_hash[seq] = h;
    return k * bs;
}

bubo_status bubo_kv_prefix_register(bubo_kv *kv, int seq, const int32_t *tokens, int32_t n_tokens, bubo_err *err) {
    if (check_seq(kv, seq, err)) return BUBO_ERR_INVALID;
    if (n_tokens < 0 || n_tokens > kv->lens[seq])
        return bubo_set_err(err, BUBO_ERR_INVALID, "prefix register: sequence %d holds %d tokens, cannot register %d",
                            seq, (int)kv->lens[seq], (int)n_tokens);
    kv_prefix *px = &kv->px;
    if (!px->on) return BUBO_OK;
    kv_pool *pl = &kv->pools[POOL_GLOBAL];
    int32_t *table = table_of(kv, pl, seq);
    const int bs = kv->p.block_size;
    int32_t parent = px->seq_parent[seq];
    uint64_t parent_gen = px->seq_parent_gen[seq], h = px->seq_hash[seq];
    int32_t i = px->seq_n_reg[seq];
    for (; i < n_tokens / bs; i++) {
        const int32_t *t = tokens + (size_t)i * bs;
        const int32_t b = table[i];
        const uint64_t hb = prefix_hash(px, h, t, bs);
        if (px->indexed[b]) {
            if (memcmp(px->tokens + (size_t)b * bs, t, bs * sizeof *t) != 0)
                return bubo_set_err(err, BUBO_ERR_INVALID,
                                    "prefix register: the tokens of block %d of sequence %d differ from the ones "
                                    "its rows were computed for",
                                    (int)i, seq);
            if (px->hash[b] == hb && px->parent[b] == parent && (parent < 0 || px->parent_gen[b] == parent_gen)) {
                parent = b, parent_gen = px->gen[b], h = hb;
                continue;
            }
            /* indexed under a parent that is gone (evicted, rewritten): index it again below */
            index_remove(kv, b);
        }
        const int32_t same = index_find(kv, hb, parent, parent_gen, t);
        if (same < 0) index_add(kv, b, hb, parent, parent_gen, t);
        parent = same >= 0 ? same : b;
        parent_gen = px->gen[parent];
        h = hb;
    }
    if (i > px->seq_n_reg[seq]) {
        px->seq_n_reg[seq] = i;
        px->seq_parent[seq] = parent;
        px->seq_parent_gen[seq] = parent_gen;
        px->seq_hash[seq] = h;
    }
    return BUBO_OK;
}

bubo_status bubo_kv_prefix_set_namespace(bubo_kv *kv, int seq, int32_t ns, bubo_err *err) {
    if (check_seq(kv, seq, err)) return BUBO_ERR_INVALID;
    if (ns < 0) return bubo_set_err(err, BUBO_ERR_INVALID, "prefix namespace %d: give 0 or more", (int)ns);
    if (kv->lens[seq] != 0)
        return bubo_set_err(err, BUBO_ERR_INVALID, "prefix namespace: sequence %d is not empty", seq);
    if (!kv->px.on) return BUBO_OK;
    kv->px.seq_root[seq] = -1 - ns;
    prefix_seq_reset(kv, seq);
    return BUBO_OK;
}

void bubo_kv_prefix_clear(bubo_kv *kv) {
    kv_prefix *px = &kv->px;
    if (!px->on) return;
    kv_pool *pl = &kv->pools[POOL_GLOBAL];
    for (int32_t b = px->lru_head; b >= 0; b = px->lru_next[b]) pl->free_list[pl->n_free++] = b;
    px->lru_head = px->lru_tail = -1;
    px->n_cached = 0;
    for (int32_t b = 0; b < pl->n_committed; b++)
        if (px->indexed[b]) px->indexed[b] = 0, px->gen[b]++;
    for (uint32_t k = 0; k <= px->bucket_mask; k++) px->bucket[k] = -1;
    for (int s = 0; s < kv->p.n_seq_max; s++) prefix_seq_reset(kv, s);
}

int32_t bubo_kv_prefix_n_cached(const bubo_kv *kv) { return kv->px.n_cached; }

int32_t bubo_kv_prefix_n_indexed(const bubo_kv *kv) {
    int32_t n = 0;
    if (kv->px.on)
        for (int32_t b = 0; b < kv->pools[POOL_GLOBAL].n_committed; b++) n += kv->px.indexed[b];
    return n;
}

int bubo_kv_prefix_enabled(const bubo_kv *kv) { return kv->px.on; }

void bubo_kv_prefix_get_stats(const bubo_kv *kv, bubo_kv_prefix_stats *out) { *out = kv->px.stats; }

void bubo_kv_prefix_set_hash_mask(bubo_kv *kv, uint64_t mask) {
    bubo_kv_prefix_clear(kv);
    kv->px.hash_mask = mask;
    if (kv->px.on)
        for (int s = 0; s < kv->p.n_seq_max; s++) prefix_seq_reset(kv, s);
}

/* --- consistency check (tests) ------------------------------------------------------------ */

#define CHECK(cond, ...)                                                   \
    do {                                                                   \
        if (!(cond)) {                                                     \
            free(count);                                                   \
            return bubo_set_err(err, BUBO_ERR_INVALID, __VA_ARGS__);       \
        }                                                                  \
    } while (0)

bubo_status bubo_kv_check_invariants(const bubo_kv *kv, bubo_err *err) {
    /* count[b]: how many block tables hold b; then -1 on the free list, -2 on the LRU list */
    int32_t n_max = 1;
    for (int i = 0; i < N_POOLS; i++)
        if (kv->pools[i].n_blocks > n_max) n_max = kv->pools[i].n_blocks;
    int32_t *count = calloc(n_max, sizeof *count);
    if (!count) return bubo_set_err(err, BUBO_ERR_NOMEM, "check: out of memory");
    const kv_prefix *px = &kv->px;
    for (int i = 0; i < N_POOLS; i++) {
        const kv_pool *pl = &kv->pools[i];
        const int global = i == POOL_GLOBAL;
        if (pl->n_layer == 0) continue;
        memset(count, 0, n_max * sizeof *count);
        for (int s = 0; s < kv->p.n_seq_max; s++) {
            const int32_t *table = table_of(kv, pl, s);
            for (int32_t b = pl->first[s]; b < blocks_for(kv, kv->lens[s]); b++) {
                CHECK(table[b] >= 0 && table[b] < pl->n_committed, "pool %d seq %d entry %d: block %d not committed",
                      i, s, (int)b, (int)table[b]);
                count[table[b]]++;
            }
        }
        for (int32_t b = 0; b < pl->n_committed; b++)
            CHECK(count[b] == pl->refs[b], "pool %d block %d: refs %d, held by %d tables", i, (int)b, (int)pl->refs[b],
                  (int)count[b]);
        for (int32_t j = 0; j < pl->n_free; j++) {
            const int32_t b = pl->free_list[j];
            CHECK(b >= 0 && b < pl->n_committed && count[b] == 0, "pool %d: free block %d is held or listed twice", i,
                  (int)b);
            CHECK(!global || !px->on || !px->indexed[b], "free block %d is indexed", (int)b);
            count[b] = -1;
        }
        int32_t n_lru = 0;
        if (global && px->on) {
            int32_t prev = -1;
            for (int32_t b = px->lru_head; b >= 0; prev = b, b = px->lru_next[b]) {
                CHECK(n_lru < pl->n_committed && count[b] == 0 && px->indexed[b] && px->lru_prev[b] == prev,
                      "LRU list broken at block %d", (int)b);
                count[b] = -2;
                n_lru++;
            }
            CHECK(px->lru_tail == prev, "LRU tail %d, list ends at %d", (int)px->lru_tail, (int)prev);
            CHECK(n_lru == px->n_cached, "n_cached %d, LRU list %d", (int)px->n_cached, (int)n_lru);
        }
        for (int32_t b = 0; b < pl->n_committed; b++)
            CHECK(count[b] != 0, "pool %d block %d: unreferenced but neither free nor cached", i, (int)b);
        int32_t n_held = 0;
        for (int32_t b = 0; b < pl->n_committed; b++) n_held += count[b] > 0;
        CHECK(bubo_kv_pool_n_used(kv, i == POOL_SWA) == n_held && n_held + pl->n_free + n_lru == pl->n_committed,
              "pool %d: %d used, %d held, %d free, %d cached, %d committed", i, (int)bubo_kv_pool_n_used(kv, i == POOL_SWA),
              (int)n_held, (int)pl->n_free, (int)n_lru, (int)pl->n_committed);
    }
    if (px->on) {
        const kv_pool *pl = &kv->pools[POOL_GLOBAL];
        const int bs = kv->p.block_size;
        int32_t n_in_buckets = 0, n_indexed = 0;
        for (uint32_t k = 0; k <= px->bucket_mask; k++)
            for (int32_t b = px->bucket[k]; b >= 0; b = px->chain_next[b]) {
                CHECK(n_in_buckets < pl->n_committed && px->indexed[b] && bucket_of(px, px->hash[b]) == k,
                      "bucket %u: block %d misplaced or unindexed", (unsigned)k, (int)b);
                n_in_buckets++;
            }
        for (int32_t b = 0; b < pl->n_committed; b++) {
            if (!px->indexed[b]) continue;
            n_indexed++;
            const int32_t p = px->parent[b];
            const int live = p < 0 || (px->indexed[p] && px->parent_gen[b] == px->gen[p]);
            /* a live chain hashes as register computed it; an orphan is unreachable, so any hash will do */
            if (live) {
                const uint64_t h = prefix_hash(px, p < 0 ? root_hash(px, p) : px->hash[p],
                                               px->tokens + (size_t)b * bs, bs);
                CHECK(h == px->hash[b], "block %d: hash does not chain from its parent %d", (int)b, (int)p);
            }
        }
        CHECK(n_in_buckets == n_indexed, "%d blocks indexed, %d in the buckets", (int)n_indexed, (int)n_in_buckets);
        for (int s = 0; s < kv->p.n_seq_max; s++)
            CHECK(px->seq_n_reg[s] <= kv->lens[s] / bs, "seq %d: %d blocks registered past its %d tokens", s,
                  (int)px->seq_n_reg[s], (int)kv->lens[s]);
    }
    free(count);
    return BUBO_OK;
}
#undef CHECK
