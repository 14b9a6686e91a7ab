/* The matmul driver: y[t][r] = dot(W[r], x[t]) for weights of any block type.
 *
 * One pool run, two phases:
 *   1. the activations are quantized once into the weight type's vec_dot_type (Q8_0, Q8_K ...),
 *      the blocks of all tokens split evenly over the threads (rows of x are contiguous and a
 *      whole number of blocks, so the blocks of all tokens form one array). Float weights have
 *      vec_dot_type F32: there is nothing to do and the activations are read in place. With a
 *      prologue (the per-token step that writes x: a norm, SwiGLU) the tokens are split instead,
 *      and each thread runs the step on its tokens, then quantizes their rows while they are in
 *      its cache.
 *   2. after a barrier, the weight rows are split over the threads in whole tiles of ROW_TILE
 *      rows, and each thread hands its rows, ROW_CHUNK at a time, with all the tokens to the
 *      type's vec_dot_tile. The tile picks its own method by the token count (AVX-512): one
 *      token (the legacy types) or up to 3-4 (the k-quants) take a rows kernel that unpacks each
 *      weight block once for all the tokens; more take the packed matrix-matrix tile (see
 *      quants/legacy_tile.h), which for up to one chunk of 64 tokens (a decode step, a draft's
 *      check, a short turn) streams a row group's weights in order with the next group
 *      prefetched, and for longer prompts keeps the chunk's weights in L2 across the token chunks
 *      and the quantized activations, shared by both threads, in L2/L3.
 *
 * Prepacked weights (bubo_matmul_prepacked): a model's Q4_0 ... Q8_0, Q4_K and Q6_K matrices are packed
 * once at load into the tiles' own layout (quants/legacy_tile.h, quants/kquant_tile.h; where AVX2 is
 * the best level, the legacy types into the same layout for quants/legacy_tile_avx2.h, and Q4_K and
 * Q6_K into quants/kquant_tile_avx2.h's), so the tile
 * unpacks instead of transposing, and takes every token count, one included; the same bits as the
 * rows in place.
 *
 * Batch invariance: every kernel of one type and ISA computes each y element with the same
 * operations in the same order (exact per-block integer sums, then one fixed float chain over the
 * blocks; vec_dot included), so y[t][r] depends only on W[r] and x[t]: not on the thread count,
 * the number of tokens in the batch, or the token's position in it. A request's logits are the
 * same bits alone, beside other sequences, or prefilled in chunks of any size; forks,
 * truncate-and-reappend and continuous batching are exact. */
#include <limits.h>

#include "ops_internal.h"

#define ROW_TILE 16   /* the split granularity: 16 f32 outputs fill a cache line and a tile's register */
#define ROW_CHUNK 256 /* weight rows per tile call: ~250 KiB of Q4 at 2k columns, in L2 */

typedef struct {
    bubo_vec_dot_tile_fn vec_dot_tile;
    const uint8_t *w;
    size_t w_row_bytes;
    int64_t rows, tiles; /* tiles: ceil(rows / ROW_TILE) */
    float *y;
} matmul_part;

typedef struct {
    bubo_pool *pool;
    bubo_from_float_fn from_float; /* NULL: the activations are already the vec_dot_type */
    int n_parts;
    matmul_part parts[BUBO_MATMUL_MAX_PARTS]; /* matrices that share x: their tiles split as one */
    int64_t cols, n_tokens;
    bubo_matmul_prologue prologue; /* fn NULL: none */
    const float *x;
    uint8_t *scratch;  /* where from_float writes xq */
    const uint8_t *xq; /* [n_tokens][xq_row_bytes]: the activations as vec_dot takes them */
    size_t xq_row_bytes;
    int64_t xq_blck_size; /* elements per activation block */
    size_t xq_type_size;  /* bytes per activation block */
} matmul_task;

static void quantize_share(const matmul_task *t, int ith, int nth) {
    const int64_t n_blocks = t->n_tokens * t->cols / t->xq_blck_size;
    const int64_t b0 = n_blocks * ith / nth, b1 = n_blocks * (ith + 1) / nth;
    if (b1 > b0)
        t->from_float(t->x + b0 * t->xq_blck_size, t->scratch + (size_t)b0 * t->xq_type_size, (b1 - b0) * t->xq_blck_size);
}

/* The prologue's rows split by token, each token's row quantized by the thread that ran its step. */
static void prologue_share(const matmul_task *t, int ith, int nth) {
    const int64_t t0 = t->n_tokens * ith / nth, t1 = t->n_tokens * (ith + 1) / nth;
    for (int64_t tok = t0; tok < t1; tok++) t->prologue.fn(t->prologue.ctx, (int32_t)tok);
    if (t->from_float && t1 > t0)
        t->from_float(t->x + t0 * t->cols, t->scratch + (size_t)t0 * t->xq_row_bytes, (t1 - t0) * t->cols);
}

static void matmul_share(void *vtask, int ith, int nth) {
    const matmul_task *t = vtask;
    if (t->prologue.fn || t->from_float) {
        if (t->prologue.fn)
            prologue_share(t, ith, nth);
        else
            quantize_share(t, ith, nth);
        if (nth > 1) bubo_pool_barrier(t->pool); /* every thread reads every token's activations */
    }

    /* the parts' tiles in a row, split evenly: a thread's share may run from one part into the next */
    int64_t n_tiles = 0;
    for (int i = 0; i < t->n_parts; i++) n_tiles += t->parts[i].tiles;
    const int64_t g0 = n_tiles * ith / nth, g1 = n_tiles * (ith + 1) / nth;
    const int cols = (int)t->cols;
    int64_t base = 0;
    for (int i = 0; i < t->n_parts; base += t->parts[i].tiles, i++) {
        const matmul_part *p = &t->parts[i];
        const int64_t lo = g0 > base ? g0 - base : 0, hi = g1 - base < p->tiles ? g1 - base : p->tiles;
        if (lo >= hi) continue;
        const int64_t r0 = lo * ROW_TILE, r1 = hi * ROW_TILE < p->rows ? hi * ROW_TILE : p->rows;
        for (int64_t rc = r0; rc < r1; rc += ROW_CHUNK) {
            const int64_t n_rows = r1 - rc < ROW_CHUNK ? r1 - rc : ROW_CHUNK;
            p->vec_dot_tile(cols, (int)n_rows, (int)t->n_tokens, p->y + rc, (size_t)p->rows,
                            p->w + (size_t)rc * p->w_row_bytes, p->w_row_bytes, t->xq, t->xq_row_bytes);
        }
    }
}

size_t bubo_matmul_scratch_size(bubo_type type, int64_t cols, int64_t n_tokens) {
    const bubo_type_traits *traits = bubo_type_get_traits(type);
    if (!traits || !traits->supported || traits->vec_dot_type == BUBO_TYPE_F32 || n_tokens < 0) return 0;
    return bubo_row_size(traits->vec_dot_type, cols) * (size_t)n_tokens;
}

/* The level's prepacked kernels of a type, or NULL where the level has none or the CPU lacks it. */
static const bubo_type_traits *prepacked_traits(bubo_isa isa, bubo_type type) {
    const bubo_type_traits *t = bubo_type_get_traits(type);
    if (!t || isa < 0 || isa >= BUBO_ISA_COUNT || !bubo_cpu_supports(isa)) return NULL;
    return t->prepack[isa] && t->vec_dot_tile_prepacked[isa] ? t : NULL;
}

/* One part's checks and kernel; the first part also sets the activations' type (*vdt) that every
 * other part must share. */
static bubo_status part_setup(const bubo_matmul_part *in, int64_t cols, bubo_type *vdt, matmul_part *out,
                              bubo_err *err) {
    const int prepacked = in->prepacked_isa != BUBO_ISA_COUNT;
    const bubo_type_traits *traits = bubo_type_get_traits(in->type);
    if (!traits) return bubo_set_err(err, BUBO_ERR_INVALID, "matmul: unknown type id %d", (int)in->type);
    if (!traits->supported) return bubo_set_err(err, BUBO_ERR_UNSUPPORTED, "matmul: type %s is not supported", traits->name);
    if (in->rows < 0) return bubo_set_err(err, BUBO_ERR_INVALID, "matmul: bad shape rows=%lld", (long long)in->rows);
    const bubo_type_traits *act = bubo_type_get_traits(traits->vec_dot_type);
    if (cols % traits->blck_size || cols % act->blck_size)
        return bubo_set_err(err, BUBO_ERR_INVALID, "matmul: cols=%lld is not a multiple of the %s block (%lld) and %s block (%lld)",
                            (long long)cols, traits->name, (long long)traits->blck_size, act->name, (long long)act->blck_size);
    if (*vdt == BUBO_TYPE_COUNT) *vdt = traits->vec_dot_type;
    if (traits->vec_dot_type != *vdt)
        return bubo_set_err(err, BUBO_ERR_INVALID, "matmul: the parts take their activations as different types");
    if (prepacked && !prepacked_traits(in->prepacked_isa, in->type))
        return bubo_set_err(err, BUBO_ERR_UNSUPPORTED, "matmul: no prepacked kernels for type %d at level %d on this CPU",
                            (int)in->type, (int)in->prepacked_isa);
    *out = (matmul_part){
        .vec_dot_tile = prepacked ? traits->vec_dot_tile_prepacked[in->prepacked_isa] : bubo_get_vec_dot_tile(in->type),
        .w = in->w,
        .w_row_bytes = bubo_row_size(in->type, cols),
        .rows = in->rows,
        .tiles = (in->rows + ROW_TILE - 1) / ROW_TILE,
        .y = in->y,
    };
    if (!out->vec_dot_tile)
        return bubo_set_err(err, BUBO_ERR_UNSUPPORTED, "matmul: type %s has no %sdot product kernel", traits->name,
                            prepacked ? "prepacked " : "");
    return BUBO_OK;
}

bubo_status bubo_matmul_parts(bubo_pool *pool, int n_parts, const bubo_matmul_part *parts, int64_t cols,
                              const float *x, int64_t n_tokens, const bubo_matmul_prologue *prologue, void *scratch,
                              size_t scratch_size, bubo_err *err) {
    if (n_parts < 1 || n_parts > BUBO_MATMUL_MAX_PARTS || !parts)
        return bubo_set_err(err, BUBO_ERR_INVALID, "matmul: %d parts (1 to %d)", n_parts, BUBO_MATMUL_MAX_PARTS);
    if (cols < 0 || n_tokens < 0 || cols > INT_MAX || n_tokens > INT_MAX)
        return bubo_set_err(err, BUBO_ERR_INVALID, "matmul: bad shape cols=%lld n_tokens=%lld", (long long)cols,
                            (long long)n_tokens);
    matmul_task task = {.pool = pool, .n_parts = n_parts, .cols = cols, .n_tokens = n_tokens, .x = x};
    if (prologue) task.prologue = *prologue;
    bubo_type vdt = BUBO_TYPE_COUNT;
    int64_t rows = 0;
    for (int i = 0; i < n_parts; i++) {
        bubo_status st = part_setup(&parts[i], cols, &vdt, &task.parts[i], err);
        if (st) return st;
        rows += parts[i].rows;
    }
    if (rows == 0 || n_tokens == 0) {
        for (int64_t tok = 0; tok < n_tokens && task.prologue.fn; tok++) task.prologue.fn(task.prologue.ctx, (int32_t)tok);
        return BUBO_OK;
    }
    for (int i = 0; i < n_parts; i++)
        if (!x || (parts[i].rows > 0 && (!parts[i].w || !parts[i].y)))
            return bubo_set_err(err, BUBO_ERR_INVALID, "matmul: NULL buffer");
    const bubo_type_traits *act = bubo_type_get_traits(vdt);
    task.xq_row_bytes = bubo_row_size(vdt, cols);
    if (vdt == BUBO_TYPE_F32) {
        task.xq = (const uint8_t *)x;
    } else {
        const size_t needed = bubo_row_size(vdt, cols) * (size_t)n_tokens;
        if (!scratch || scratch_size < needed)
            return bubo_set_err(err, BUBO_ERR_INVALID, "matmul: scratch of %zu bytes, %zu needed", scratch_size, needed);
        task.from_float = bubo_get_from_float(vdt);
        if (!task.from_float)
            return bubo_set_err(err, BUBO_ERR_UNSUPPORTED, "matmul: no quantizer for the %s activations", act->name);
        task.scratch = scratch;
        task.xq = scratch;
        task.xq_blck_size = act->blck_size;
        task.xq_type_size = act->type_size;
    }
    if (pool && bubo_pool_n_threads(pool) > 1)
        bubo_pool_run(pool, matmul_share, &task);
    else
        matmul_share(&task, 0, 1);
    return BUBO_OK;
}

/* prepacked_isa: BUBO_ISA_COUNT for weights in place, else the level they were packed for. */
static bubo_status matmul_run(bubo_pool *pool, bubo_type type, const void *w, int64_t rows, int64_t cols,
                              const float *x, int64_t n_tokens, float *y, void *scratch, size_t scratch_size,
                              bubo_isa prepacked_isa, bubo_err *err) {
    const bubo_matmul_part part = {.type = type, .prepacked_isa = prepacked_isa, .w = w, .rows = rows, .y = y};
    return bubo_matmul_parts(pool, 1, &part, cols, x, n_tokens, NULL, scratch, scratch_size, err);
}

bubo_status bubo_matmul(bubo_pool *pool, bubo_type type, const void *w, int64_t rows, int64_t cols,
                        const float *x, int64_t n_tokens, float *y, void *scratch, size_t scratch_size,
                        bubo_err *err) {
    return matmul_run(pool, type, w, rows, cols, x, n_tokens, y, scratch, scratch_size, BUBO_ISA_COUNT, err);
}

bubo_status bubo_matmul_prepacked(bubo_pool *pool, bubo_isa isa, bubo_type type, const void *w, int64_t rows,
                                  int64_t cols, const float *x, int64_t n_tokens, float *y, void *scratch,
                                  size_t scratch_size, bubo_err *err) {
    if (!prepacked_traits(isa, type))
        return bubo_set_err(err, BUBO_ERR_UNSUPPORTED, "matmul: no prepacked kernels for type %d at level %d on this CPU",
                            (int)type, (int)isa);
    return matmul_run(pool, type, w, rows, cols, x, n_tokens, y, scratch, scratch_size, isa, err);
}

static bubo_status prepack_check(bubo_isa isa, bubo_type type, const void *w, int64_t rows, int64_t cols,
                                 const void *dst, bubo_err *err) {
    if (!prepacked_traits(isa, type))
        return bubo_set_err(err, BUBO_ERR_UNSUPPORTED, "matmul: no prepacked kernels for type %d at level %d on this CPU",
                            (int)type, (int)isa);
    if (rows < 0 || cols <= 0 || cols > INT_MAX || bubo_row_size(type, cols) == 0 || !w || !dst)
        return bubo_set_err(err, BUBO_ERR_INVALID, "matmul_prepack: bad shape rows=%lld cols=%lld", (long long)rows,
                            (long long)cols);
    return BUBO_OK;
}

bubo_status bubo_matmul_prepack(bubo_isa isa, bubo_type type, const void *w, int64_t rows, int64_t cols, void *dst,
                                bubo_err *err) {
    bubo_status st = prepack_check(isa, type, w, rows, cols, dst, err);
    if (!st) bubo_type_get_traits(type)->prepack[isa](w, bubo_row_size(type, cols), rows, (int)cols, dst);
    return st;
}

bubo_status bubo_prepacked_row(bubo_isa isa, bubo_type type, const void *packed, int64_t rows, int64_t cols,
                               int64_t r, void *dst, bubo_err *err) {
    bubo_status st = prepack_check(isa, type, packed, rows, cols, dst, err);
    if (st) return st;
    const bubo_prepacked_row_fn fn = bubo_type_get_traits(type)->prepacked_row[isa];
    if (!fn) return bubo_set_err(err, BUBO_ERR_UNSUPPORTED, "matmul: type %d has no prepacked row rebuild", (int)type);
    if (r < 0 || r >= rows) return bubo_set_err(err, BUBO_ERR_INVALID, "prepacked_row: row %lld of %lld", (long long)r, (long long)rows);
    fn(packed, bubo_row_size(type, cols), r, (int)cols, dst);
    return BUBO_OK;
}
