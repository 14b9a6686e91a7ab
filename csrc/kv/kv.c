/* The paged KV cache: a pool of blocks, a block table per sequence, reference counts. */
#include <stdlib.h>
#include <string.h>

#include "bubo/kv.h"

struct bubo_kv {
    bubo_kv_params p;
    int32_t n_blocks;          /* blocks in the pool: ceil(n_ctx / block_size) */
    int32_t max_seq_blocks;    /* a block table's capacity (same as n_blocks) */
    size_t row_bytes_k, row_bytes_v;
    size_t block_bytes_k, block_bytes_v; /* one block of one layer */
    uint8_t *k;                /* [n_layer][n_blocks][block_size][row_bytes_k] */
    uint8_t *v;                /* [n_layer][n_blocks][block_size][row_bytes_v] */
    int32_t *refs;             /* [n_blocks] sequences holding each block; 0 = free */
    int32_t *free_list;        /* [n_blocks] stack of free block ids */
    int32_t n_free;
    int32_t *tables;           /* [n_seq_max][max_seq_blocks] */
    int32_t *lens;             /* [n_seq_max] tokens per sequence */
    int32_t *n_new;            /* [n_seq_max] scratch of append_batch: tokens a batch adds */
};

static int32_t blocks_for(const bubo_kv *kv, int64_t n_tokens) {
    return (int32_t)((n_tokens + kv->p.block_size - 1) / kv->p.block_size);
}

static int32_t *table_of(const bubo_kv *kv, int seq) { return kv->tables + (size_t)seq * kv->max_seq_blocks; }

static void release_block(bubo_kv *kv, int32_t b) {
    if (--kv->refs[b] == 0) kv->free_list[kv->n_free++] = b;
}

static int32_t take_block(bubo_kv *kv) {
    const int32_t b = kv->free_list[--kv->n_free];
    kv->refs[b] = 1;
    return b;
}

static void copy_block(bubo_kv *kv, int32_t dst, int32_t src) {
    for (int il = 0; il < kv->p.n_layer; il++) {
        uint8_t *k = kv->k + (size_t)il * kv->n_blocks * kv->block_bytes_k;
        uint8_t *v = kv->v + (size_t)il * kv->n_blocks * kv->block_bytes_v;
        memcpy(k + (size_t)dst * kv->block_bytes_k, k + (size_t)src * kv->block_bytes_k, kv->block_bytes_k);
        memcpy(v + (size_t)dst * kv->block_bytes_v, v + (size_t)src * kv->block_bytes_v, kv->block_bytes_v);
    }
}

bubo_status bubo_kv_create(const bubo_kv_params *p, bubo_kv **out, bubo_err *err) {
    *out = NULL;
    const bubo_type_traits *tr = bubo_type_get_traits(p->type);
    if (p->type != BUBO_TYPE_F16 && p->type != BUBO_TYPE_F32 && p->type != BUBO_TYPE_Q8_0)
        return bubo_set_err(err, BUBO_ERR_INVALID, "KV cache type must be f16, f32 or q8_0, not %s", tr ? tr->name : "?");
    if (p->n_layer < 1 || p->n_seq_max < 1 || p->n_ctx < 1 || p->head_dim_k < 1 || p->head_dim_v < 1 ||
        p->n_embd_k % p->head_dim_k || p->n_embd_v % p->head_dim_v)
        return bubo_set_err(err, BUBO_ERR_INVALID, "KV cache: bad shape (n_layer %d, n_ctx %d, n_seq_max %d)",
                            p->n_layer, (int)p->n_ctx, p->n_seq_max);
    if (p->block_size < 1 || p->block_size > BUBO_KV_MAX_BLOCK_SIZE)
        return bubo_set_err(err, BUBO_ERR_INVALID, "KV cache: block_size must be 1..%d, not %d", BUBO_KV_MAX_BLOCK_SIZE,
                            p->block_size);
    if (p->head_dim_k % tr->blck_size || p->head_dim_v % tr->blck_size)
        return bubo_set_err(err, BUBO_ERR_INVALID, "KV cache type %s needs head dims that are multiples of %lld (K %lld, V %lld)",
                            tr->name, (long long)tr->blck_size, (long long)p->head_dim_k, (long long)p->head_dim_v);

    bubo_kv *kv = calloc(1, sizeof *kv);
    if (!kv) return bubo_set_err(err, BUBO_ERR_NOMEM, "KV cache: out of memory");
    kv->p = *p;
    kv->n_blocks = blocks_for(kv, p->n_ctx);
    kv->max_seq_blocks = kv->n_blocks;
    kv->row_bytes_k = bubo_row_size(p->type, p->n_embd_k);
    kv->row_bytes_v = bubo_row_size(p->type, p->n_embd_v);
    kv->block_bytes_k = kv->row_bytes_k * p->block_size;
    kv->block_bytes_v = kv->row_bytes_v * p->block_size;
    const size_t k_bytes = kv->block_bytes_k * kv->n_blocks * p->n_layer;
    const size_t v_bytes = kv->block_bytes_v * kv->n_blocks * p->n_layer;
    /* zeroed: a never-written slot is never read (the mask stops at the position), but a copied
     * block must not carry stale NaN bit patterns into a test's comparison */
    kv->k = calloc(1, k_bytes);
    kv->v = calloc(1, v_bytes);
    kv->refs = calloc(kv->n_blocks, sizeof *kv->refs);
    kv->free_list = malloc(kv->n_blocks * sizeof *kv->free_list);
    kv->tables = calloc((size_t)p->n_seq_max * kv->max_seq_blocks, sizeof *kv->tables);
    kv->lens = calloc(p->n_seq_max, sizeof *kv->lens);
    kv->n_new = calloc(p->n_seq_max, sizeof *kv->n_new);
    if (!kv->k || !kv->v || !kv->refs || !kv->free_list || !kv->tables || !kv->lens || !kv->n_new) {
        bubo_kv_free(kv);
        return bubo_set_err(err, BUBO_ERR_NOMEM, "KV cache: cannot allocate %zu bytes for %d tokens",
                            k_bytes + v_bytes, (int)p->n_ctx);
    }
    /* a stack: the lowest ids come out first */
    for (int32_t b = 0; b < kv->n_blocks; b++) kv->free_list[b] = kv->n_blocks - 1 - b;
    kv->n_free = kv->n_blocks;
    *out = kv;
    return BUBO_OK;
}

void bubo_kv_free(bubo_kv *kv) {
    if (!kv) return;
    free(kv->k);
    free(kv->v);
    free(kv->refs);
    free(kv->free_list);
    free(kv->tables);
    free(kv->lens);
    free(kv->n_new);
    free(kv);
}

const bubo_kv_params *bubo_kv_get_params(const bubo_kv *kv) { return &kv->p; }

int32_t bubo_kv_seq_len(const bubo_kv *kv, int seq) {
    return seq >= 0 && seq < kv->p.n_seq_max ? kv->lens[seq] : 0;
}

int64_t bubo_kv_n_free_tokens(const bubo_kv *kv) { return (int64_t)kv->n_free * kv->p.block_size; }

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
    int32_t *table = table_of(kv, seq);
    for (int32_t b = blocks_for(kv, n); b < blocks_for(kv, kv->lens[seq]); b++) release_block(kv, table[b]);
    kv->lens[seq] = n;
    return BUBO_OK;
}

bubo_status bubo_kv_clear(bubo_kv *kv, int seq, bubo_err *err) { return bubo_kv_truncate(kv, seq, 0, err); }

bubo_status bubo_kv_fork(bubo_kv *kv, int src, int dst, bubo_err *err) {
    if (check_seq(kv, src, err) || check_seq(kv, dst, err)) return BUBO_ERR_INVALID;
    if (src == dst) return BUBO_OK;
    bubo_kv_clear(kv, dst, NULL);
    const int32_t n_b = blocks_for(kv, kv->lens[src]);
    const int32_t *from = table_of(kv, src);
    int32_t *to = table_of(kv, dst);
    for (int32_t b = 0; b < n_b; b++) {
        to[b] = from[b];
        kv->refs[from[b]]++;
    }
    kv->lens[dst] = kv->lens[src];
    return BUBO_OK;
}

/* Make room for n_new[s] more tokens of every sequence s; all or nothing. */
static bubo_status reserve(bubo_kv *kv, const int32_t *n_new, bubo_err *err) {
    /* count first, so that a refusal changes nothing */
    int64_t need = 0;
    for (int s = 0; s < kv->p.n_seq_max; s++) {
        if (n_new[s] <= 0) continue;
        const int64_t end = (int64_t)kv->lens[s] + n_new[s];
        if (end > kv->p.n_ctx)
            return bubo_set_err(err, BUBO_ERR_INVALID,
                                "context full: sequence %d would hold %lld tokens, the cache holds at most %d per "
                                "sequence; use a larger n_ctx or a shorter prompt",
                                s, (long long)end, (int)kv->p.n_ctx);
        const int32_t have = blocks_for(kv, kv->lens[s]);
        need += blocks_for(kv, end) - have;
        /* writing into a shared, partly filled last block copies it */
        if (kv->lens[s] % kv->p.block_size && kv->refs[table_of(kv, s)[have - 1]] > 1) need++;
    }
    if (need > kv->n_free)
        return bubo_set_err(err, BUBO_ERR_INVALID,
                            "context full: the batch needs %lld more blocks of %d tokens, %d are free; free or "
                            "truncate sequences, or use a larger n_ctx",
                            (long long)need, kv->p.block_size, (int)kv->n_free);

    for (int s = 0; s < kv->p.n_seq_max; s++) {
        if (n_new[s] <= 0) continue;
        int32_t *table = table_of(kv, s);
        const int32_t have = blocks_for(kv, kv->lens[s]);
        if (kv->lens[s] % kv->p.block_size && kv->refs[table[have - 1]] > 1) {
            const int32_t copy = take_block(kv);
            copy_block(kv, copy, table[have - 1]);
            release_block(kv, table[have - 1]);
            table[have - 1] = copy;
        }
        const int32_t end = kv->lens[s] + n_new[s];
        for (int32_t b = have; b < blocks_for(kv, end); b++) table[b] = take_block(kv);
        kv->lens[s] = end;
    }
    return BUBO_OK;
}

uint8_t *bubo_kv_k_row(bubo_kv *kv, int il, int seq, int32_t pos) {
    const int32_t b = table_of(kv, seq)[pos / kv->p.block_size];
    return kv->k + ((size_t)il * kv->n_blocks + b) * kv->block_bytes_k + (size_t)(pos % kv->p.block_size) * kv->row_bytes_k;
}

uint8_t *bubo_kv_v_row(bubo_kv *kv, int il, int seq, int32_t pos) {
    const int32_t b = table_of(kv, seq)[pos / kv->p.block_size];
    return kv->v + ((size_t)il * kv->n_blocks + b) * kv->block_bytes_v + (size_t)(pos % kv->p.block_size) * kv->row_bytes_v;
}

void bubo_kv_get_view(const bubo_kv *kv, int il, int seq, bubo_kv_view *view) {
    view->type = kv->p.type;
    view->block_size = kv->p.block_size;
    view->k = kv->k + (size_t)il * kv->n_blocks * kv->block_bytes_k;
    view->v = kv->v + (size_t)il * kv->n_blocks * kv->block_bytes_v;
    view->block_bytes_k = kv->block_bytes_k;
    view->block_bytes_v = kv->block_bytes_v;
    view->row_bytes_k = kv->row_bytes_k;
    view->row_bytes_v = kv->row_bytes_v;
    view->head_bytes_k = bubo_row_size(kv->p.type, kv->p.head_dim_k);
    view->head_bytes_v = bubo_row_size(kv->p.type, kv->p.head_dim_v);
    view->table = table_of(kv, seq);
}

bubo_status bubo_kv_append_batch(bubo_kv *kv, int32_t n_tokens, const int32_t *seq_ids, const int32_t *pos,
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
    return reserve(kv, n_new, err);
}
