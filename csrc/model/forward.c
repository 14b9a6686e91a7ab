/* The forward pass: one chunk of tokens (any sequences, any positions) through every layer.
 *
 * Follow one token t:
 *   x[t] = embed(token) * embd_scale
 *   per layer:
 *     xb   = rmsnorm(x, attn_norm)
 *     q,k,v = Wq xb (+bq), Wk xb (+bk), Wv xb (+bv); per head rmsnorm (qk-norm); RoPE on q, k
 *     k, v -> the cache at (seq, pos)
 *     att  = per head softmax(q . K[seq][window] * scale) . V[seq][window]
 *     xb2  = Wo att; [rmsnorm(xb2, post_attn_norm)]; x += xb2
 *     xb   = rmsnorm(x, ffn_norm)
 *     hb   = act(Wgate xb) * (Wup xb); xb2 = Wdown hb; [rmsnorm(xb2, post_ffw_norm)]; x += xb2
 *   logits = Wout rmsnorm(x, output_norm)   (only for the rows asked for)
 *
 * Matrix products go through bubo_matmul on the pool (each quantizes its input once and splits
 * weight rows over the threads). The per-token work that writes a product's input (the residual
 * add and norm before Q/K/V and before gate/up, SwiGLU before down) runs as that product's
 * prologue, in its pool run; the rest (bias, RoPE, cache writes) as one pool run split by token;
 * attention as one run split by (token, head). One token (decode) runs the small steps on one
 * thread. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model_internal.h"

/* ---- running per-token steps on the pool ---------------------------------------------------- */

typedef struct {
    bubo_model *m;
    bubo_kv *kv;
    int il;              /* the layer */
    int32_t n;           /* tokens in this chunk */
    const int32_t *tokens, *pos, *seq_ids;
    const int32_t *out_rows; /* [n_out] chunk rows whose logits are wanted */
    int32_t n_out;
    int attn_tile; /* tokens per attention tile (attention_tile_for), the same in every layer */
    void (*row_fn)(const void *step, int32_t t); /* the per-token step of a token run */
} step_ctx;

static void token_share(void *vctx, int ith, int nth) {
    const step_ctx *c = vctx;
    const int32_t t0 = (int32_t)((int64_t)c->n * ith / nth), t1 = (int32_t)((int64_t)c->n * (ith + 1) / nth);
    for (int32_t t = t0; t < t1; t++) c->row_fn(c, t);
}

static void run_tokens(step_ctx *c, void (*fn)(const void *, int32_t)) {
    c->row_fn = fn;
    if (c->n == 1 || bubo_pool_n_threads(c->m->pool) == 1)
        token_share(c, 0, 1);
    else
        bubo_pool_run(c->m->pool, token_share, c);
}

#define matmul bubo_model_matmul
#define matmul_shared bubo_model_matmul_shared

/* rows of any per-row step, without a step_ctx */
typedef struct {
    void *ctx;
    void (*fn)(const void *, int32_t);
    int32_t n;
} rows_ctx;

static void rows_share(void *vr, int ith, int nth) {
    const rows_ctx *r = vr;
    const int32_t t0 = (int32_t)((int64_t)r->n * ith / nth), t1 = (int32_t)((int64_t)r->n * (ith + 1) / nth);
    for (int32_t t = t0; t < t1; t++) r->fn(r->ctx, t);
}

void bubo_model_run_rows(bubo_model *m, int32_t n, void *ctx, void (*fn)(const void *, int32_t)) {
    rows_ctx r = {ctx, fn, n};
    if (n == 1 || bubo_pool_n_threads(m->pool) == 1)
        rows_share(&r, 0, 1);
    else
        bubo_pool_run(m->pool, rows_share, &r);
}

/* Matrices that multiply the same x, in one pool run with x quantized once (bubo_matmul_parts)
 * where they take their activations as one type; else one after the other. pre (NULL: none): a
 * per-token step that writes x, run in the same pool run (bubo_matmul_prologue). */
static bubo_status matmul_after(bubo_model *m, void (*pre)(const void *, int32_t), const void *pre_ctx, int n_mats,
                                const bubo_mat *const *w, const float *x, int32_t n, float *const *y, bubo_err *err) {
    bubo_matmul_part parts[BUBO_MATMUL_MAX_PARTS];
    const bubo_type vdt = bubo_type_get_traits(w[0]->type)->vec_dot_type;
    int same = n_mats <= BUBO_MATMUL_MAX_PARTS;
    for (int i = 0; i < n_mats && same; i++) {
        same = bubo_type_get_traits(w[i]->type)->vec_dot_type == vdt && w[i]->cols == w[0]->cols;
        parts[i] = (bubo_matmul_part){.type = w[i]->type, .prepacked_isa = w[i]->packed ? w[i]->packed_isa : BUBO_ISA_COUNT,
                                      .w = w[i]->data, .rows = w[i]->rows, .y = y[i]};
    }
    const bubo_matmul_prologue prologue = {pre, pre_ctx};
    if (same)
        return bubo_matmul_parts(m->pool, n_mats, parts, w[0]->cols, x, n, &prologue, m->s.mm_scratch,
                                 m->s.mm_scratch_size, err);
    if (pre) bubo_model_run_rows(m, n, (void *)pre_ctx, pre);
    for (int i = 0; i < n_mats; i++) {
        bubo_status st = matmul_after(m, NULL, NULL, 1, &w[i], x, n, &y[i], err);
        if (st) return st;
    }
    return BUBO_OK;
}

bubo_status matmul_shared(bubo_model *m, int n_mats, const bubo_mat *const *w, const float *x, int32_t n,
                          float *const *y, bubo_err *err) {
    return matmul_after(m, NULL, NULL, n_mats, w, x, n, y, err);
}

bubo_status matmul(bubo_model *m, const bubo_mat *w, const float *x, int32_t n, float *y, bubo_err *err) {
    return matmul_after(m, NULL, NULL, 1, &w, x, n, &y, err);
}

/* ---- the per-token steps ---------------------------------------------------------------------- */

/* The rope of the global (swa 0) or the sliding-window (swa 1) layers. */
static bubo_rope_params rope_params(const bubo_model *m, int swa) {
    const bubo_hparams *hp = &m->hp;
    return (bubo_rope_params){
        .mode = hp->rope_neox ? BUBO_ROPE_NEOX : BUBO_ROPE_NORMAL,
        .n_rot = hp->n_rot,
        .freq_base = swa ? hp->rope_freq_base_swa : hp->rope_freq_base,
        .freq_scale = swa ? hp->rope_freq_scale_swa : hp->rope_freq_scale,
        .freq_factors = m->w.rope_freqs,
    };
}

/* Token t's rope angles, once for every layer (and for Q and K): s.rope_cs. */
static void step_rope_angles(const void *vc, int32_t t) {
    const step_ctx *c = vc;
    const bubo_model *m = c->m;
    const size_t n_rot = (size_t)m->hp.n_rot;
    if (n_rot == 0) return;
    for (int swa = 0; swa < (m->hp.sliding_window > 0 ? 2 : 1); swa++) {
        const bubo_rope_params p = rope_params(m, swa);
        bubo_rope_angles(c->pos[t], &p, m->s.rope_cs + ((size_t)t * 2 + (size_t)swa) * n_rot);
    }
}

static void step_embed(const void *vc, int32_t t) {
    const step_ctx *c = vc;
    const bubo_model *m = c->m;
    const bubo_mat *e = &m->w.token_embd;
    float *x = m->s.x + (size_t)t * m->hp.n_embd;
    const size_t row_bytes = bubo_row_size(e->type, e->cols);
    const uint8_t *row = (const uint8_t *)e->data + (size_t)c->tokens[t] * row_bytes;
    if (e->packed) { /* a tied token_embd, prepacked: the row's blocks back first (same bits) */
        uint8_t *blocks = m->s.embd_rows + (size_t)t * row_bytes;
        bubo_type_get_traits(e->type)->prepacked_row[e->packed_isa](e->data, row_bytes, c->tokens[t], (int)e->cols, blocks);
        row = blocks;
    }
    bubo_get_to_float(e->type)(row, x, e->cols);
    if (m->hp.embd_scale != 1.0f) m->ops->scale(m->hp.n_embd, x, x, m->hp.embd_scale);
}

static void step_attn_norm(const void *vc, int32_t t) {
    const step_ctx *c = vc;
    const bubo_model *m = c->m;
    const size_t d = m->hp.n_embd;
    m->ops->rms_norm(d, m->s.xb + t * d, m->s.x + t * d, m->w.layers[c->il].attn_norm, m->hp.norm_eps);
}

/* bias, qk-norm, RoPE, then K and V into the cache */
static void step_qkv(const void *vc, int32_t t) {
    const step_ctx *c = vc;
    const bubo_model *m = c->m;
    const bubo_hparams *hp = &m->hp;
    const bubo_layer_weights *l = &m->w.layers[c->il];
    const int64_t nq = (int64_t)hp->n_head * hp->head_dim_k;
    const int64_t nk = (int64_t)hp->n_head_kv * hp->head_dim_k;
    const int64_t nv = (int64_t)hp->n_head_kv * hp->head_dim_v;
    float *q = m->s.q + t * nq, *k = m->s.k + t * nk, *v = m->s.v + t * nv;

    if (l->bq) {
        m->ops->add(nq, q, q, l->bq);
        m->ops->add(nk, k, k, l->bk);
        m->ops->add(nv, v, v, l->bv);
    }
    if (l->q_norm) {
        for (int h = 0; h < hp->n_head; h++)
            m->ops->rms_norm(hp->head_dim_k, q + h * hp->head_dim_k, q + h * hp->head_dim_k, l->q_norm, hp->norm_eps);
        for (int h = 0; h < hp->n_head_kv; h++)
            m->ops->rms_norm(hp->head_dim_k, k + h * hp->head_dim_k, k + h * hp->head_dim_k, l->k_norm, hp->norm_eps);
    }
    const int swa = hp->is_swa[c->il];
    bubo_rope_params rope = rope_params(m, swa);
    rope.angles = m->s.rope_cs + ((size_t)t * 2 + (size_t)swa) * (size_t)hp->n_rot; /* step_rope_angles' */
    m->ops->rope(q, 1, hp->n_head, hp->head_dim_k, &c->pos[t], &rope);
    m->ops->rope(k, 1, hp->n_head_kv, hp->head_dim_k, &c->pos[t], &rope);

    const bubo_kv_params *kp = bubo_kv_get_params(c->kv);
    const bubo_from_float_fn to_k = bubo_get_from_float(kp->type), to_v = bubo_get_from_float(kp->type_v);
    for (int h = 0; h < hp->n_head_kv; h++) {
        to_k(k + (size_t)h * hp->head_dim_k, bubo_kv_k_head(c->kv, c->il, c->seq_ids[t], c->pos[t], h), hp->head_dim_k);
        to_v(v + (size_t)h * hp->head_dim_v, bubo_kv_v_head(c->kv, c->il, c->seq_ids[t], c->pos[t], h), hp->head_dim_v);
    }
}

/* x += [post_attn_norm](xb2); xb = rmsnorm(x, ffn_norm) */
static void step_attn_residual(const void *vc, int32_t t) {
    const step_ctx *c = vc;
    const bubo_model *m = c->m;
    const bubo_layer_weights *l = &m->w.layers[c->il];
    const size_t d = m->hp.n_embd;
    float *x = m->s.x + t * d, *xb2 = m->s.xb2 + t * d;
    if (l->post_attn_norm) m->ops->rms_norm(d, xb2, xb2, l->post_attn_norm, m->hp.norm_eps);
    m->ops->add(d, x, x, xb2);
    m->ops->rms_norm(d, m->s.xb + t * d, x, l->ffn_norm, m->hp.norm_eps);
}

static void step_ffn_act(const void *vc, int32_t t) {
    const step_ctx *c = vc;
    const bubo_model *m = c->m;
    const size_t f = m->hp.n_ff;
    float *gate = m->s.hb + t * f, *up = m->s.hb2 + t * f;
    if (m->hp.arch == BUBO_ARCH_GEMMA3)
        m->ops->geglu(f, gate, gate, up);
    else
        m->ops->swiglu(f, gate, gate, up);
}

/* x += [post_ffw_norm](xb2), layer il's */
static void ffn_residual(const step_ctx *c, int il, int32_t t) {
    const bubo_model *m = c->m;
    const bubo_layer_weights *l = &m->w.layers[il];
    const size_t d = m->hp.n_embd;
    float *x = m->s.x + t * d, *xb2 = m->s.xb2 + t * d;
    if (l->post_ffw_norm) m->ops->rms_norm(d, xb2, xb2, l->post_ffw_norm, m->hp.norm_eps);
    m->ops->add(d, x, x, xb2);
}

static void step_ffn_residual(const void *vc, int32_t t) {
    const step_ctx *c = vc;
    ffn_residual(c, c->il, t);
}

/* A layer's input: the previous layer's FFN residual (none before the first), then the attention
 * norm. It runs as the Q/K/V product's prologue. */
static void step_layer_input(const void *vc, int32_t t) {
    const step_ctx *c = vc;
    if (c->il > 0) ffn_residual(c, c->il - 1, t);
    step_attn_norm(vc, t);
}

/* the j-th wanted row, normed, packed into xb[j] for the output product */
static void step_output_norm(const void *vc, int32_t j) {
    const step_ctx *c = vc;
    const bubo_model *m = c->m;
    const size_t d = m->hp.n_embd;
    m->ops->rms_norm(d, m->s.xb + j * d, m->s.x + (size_t)c->out_rows[j] * d, m->w.output_norm, m->hp.norm_eps);
}

/* ---- attention: one run, split by (tile of tokens, KV head, slice of its query heads) ---------- */

/* Consecutive tokens of one sequence (up to ATTN_TILE_TOKENS) and the query heads of one KV head
 * are attended together, so each K/V row is read and widened once for all of them; a decode step
 * with few tokens slices the heads so that every thread gets work. A (token, head) result does
 * not depend on the tiling or the slicing (bubo_attend_paged), only the speed does. */
/* Tokens per tile: ATTN_TILE_TOKENS, so that consecutive tokens of one sequence (a prompt, a
 * draft's check, a short turn) read each K/V row once for all of them; but a decode step of fewer
 * tokens, none of them next to another of its sequence (one token per sequence), takes one token
 * per item, so that its sequences spread over the threads (and a long one's positions,
 * attention_chunks). */
static int attention_tile_for(int32_t n, const int32_t *seq_ids) {
    if (n >= ATTN_TILE_TOKENS) return ATTN_TILE_TOKENS;
    for (int32_t t = 1; t < n; t++)
        if (seq_ids[t] == seq_ids[t - 1]) return ATTN_TILE_TOKENS;
    return 1;
}

static int64_t attention_tiles(const step_ctx *c) { return (c->n + c->attn_tile - 1) / c->attn_tile; }

static int attention_slices(const step_ctx *c, int nth) {
    const bubo_hparams *hp = &c->m->hp;
    const int group = hp->n_head / hp->n_head_kv;
    const int64_t items = attention_tiles(c) * hp->n_head_kv;
    int slices = 1;
    while (slices < group && items * slices < 2 * (int64_t)nth) slices++;
    return slices;
}

/* Token t's range of positions in layer c->il: [*begin, *end) (causal, cut by a sliding window). */
static void token_range(const step_ctx *c, int32_t t, int32_t *begin, int32_t *end) {
    const bubo_hparams *hp = &c->m->hp;
    const int window = hp->is_swa[c->il] ? hp->sliding_window : 0;
    *end = c->pos[t] + 1;
    *begin = window > 0 && *end > window ? *end - window : 0;
}

/* Tokens t0 .. t1 - 1's query heads h0 .. h1 - 1 into q_att ([token][head] rows of q_att_stride
 * bytes) as the cache's dot product takes them; an f16 cache also rounds the query to f16, as
 * llama.cpp's f16 K x f32 Q product does. q_tmp: head_dim_k floats. */
static void prepare_queries(const step_ctx *c, int32_t t0, int32_t t1, int h0, int h1, uint8_t *q_att, float *q_tmp) {
    const bubo_model *m = c->m;
    const bubo_hparams *hp = &m->hp;
    const bubo_type kv_type = bubo_kv_get_params(c->kv)->type; /* K's: the queries meet K rows */
    const bubo_from_float_fn to_q8 = bubo_type_get_traits(kv_type)->vec_dot_type == BUBO_TYPE_Q8_0
                                         ? bubo_get_from_float(BUBO_TYPE_Q8_0) : NULL;
    /* f32 -> f16 -> f32 through the kernel table (F16C where there is one: the same rounding as
     * bubo_f32_to_f16, a call per element otherwise) */
    const bubo_from_float_fn to_f16 = bubo_get_from_float(BUBO_TYPE_F16);
    const bubo_to_float_fn from_f16 = bubo_get_to_float(BUBO_TYPE_F16);
    for (int32_t t = t0; t < t1; t++)
        for (int h = h0; h < h1; h++) {
            const float *q = m->s.q + ((size_t)t * hp->n_head + h) * hp->head_dim_k;
            uint8_t *qa = q_att + ((size_t)(t - t0) * (h1 - h0) + (h - h0)) * m->s.q_att_stride;
            float *q_f32 = (float *)qa;
            if (to_q8) {
                for (int j = 0; j < hp->head_dim_k; j++) q_tmp[j] = q[j] * hp->q_scale;
                to_q8(q_tmp, qa, hp->head_dim_k);
            } else if (kv_type == BUBO_TYPE_F16) {
                for (int j = 0; j < hp->head_dim_k; j++) q_f32[j] = q[j] * hp->q_scale;
                to_f16(q_f32, q_tmp, hp->head_dim_k); /* q_tmp holds head_dim_k floats: twice the f16 row */
                from_f16(q_tmp, q_f32, hp->head_dim_k);
            } else {
                for (int j = 0; j < hp->head_dim_k; j++) q_f32[j] = q[j] * hp->q_scale;
            }
        }
}

static void attention_share(void *vctx, int ith, int nth) {
    const step_ctx *c = vctx;
    const bubo_model *m = c->m;
    const bubo_hparams *hp = &m->hp;
    const int group = hp->n_head / hp->n_head_kv; /* query heads per KV head (GQA) */
    const int slices = attention_slices(c, bubo_pool_n_threads(m->pool));
    const int tile_tokens = c->attn_tile;
    const int64_t n_items = attention_tiles(c) * hp->n_head_kv * slices;
    uint8_t *q_att = m->s.q_att + (size_t)ith * ATTN_TILE_TOKENS * group * m->s.q_att_stride; /* [tile][group] */
    float *scratch = m->s.v_tmp + (size_t)ith * bubo_attend_scratch_floats(ATTN_TILE_TOKENS, group, hp->head_dim_k, hp->head_dim_v);
    int32_t begin[ATTN_TILE_TOKENS], end[ATTN_TILE_TOKENS];

    /* items are dealt round-robin: a causal prompt's later tiles cost more than its first ones */
    for (int64_t item = ith; item < n_items; item += nth) {
        const int32_t tile = (int32_t)(item / (hp->n_head_kv * slices));
        const int kv_head = (int)(item / slices % hp->n_head_kv), slice = (int)(item % slices);
        const int h0 = kv_head * group + group * slice / slices, h1 = kv_head * group + group * (slice + 1) / slices;
        const int n_q = h1 - h0;
        const int32_t t_end = (tile + 1) * tile_tokens < c->n ? (tile + 1) * tile_tokens : c->n;
        for (int32_t t0 = tile * tile_tokens, t1; t0 < t_end; t0 = t1) {
            for (t1 = t0 + 1; t1 < t_end && c->seq_ids[t1] == c->seq_ids[t0];) t1++; /* a run of one sequence */
            for (int32_t t = t0; t < t1; t++) token_range(c, t, &begin[t - t0], &end[t - t0]);
            prepare_queries(c, t0, t1, h0, h1, q_att, scratch /* free until attend */);
            bubo_kv_view view;
            bubo_kv_get_view(c->kv, c->il, c->seq_ids[t0], &view);
            bubo_attend_paged(&view, kv_head, hp->head_dim_k, hp->head_dim_v, t1 - t0, begin, end, n_q, q_att,
                              m->s.q_att_stride, hp->kq_scale,
                              m->s.att + ((size_t)t0 * hp->n_head + h0) * hp->head_dim_v,
                              (size_t)hp->n_head * hp->head_dim_v, scratch);
        }
    }
}

/* ---- attention at depth: one token's positions split over the threads ------------------------- */

/* A decode step (one token per item) whose tokens reach past one chunk of positions
 * (BUBO_ATTEND_CHUNK) splits each token's positions: every (token, KV head, chunk) computes its
 * chunk's partial into s.att_part, and after a barrier every (token, KV head) merges its partials
 * in position order. bubo_attend_paged runs the same chunks and the same merge in one call, so a
 * token's result has the same bits either way: alone, batched, in a prompt, split or not. */

/* The most chunks any token of the step spans in layer c->il (0: no split). */
static int32_t attention_chunks(const step_ctx *c, int nth) {
    if (nth < 2 || c->attn_tile != 1) return 0;
    int32_t most = 0;
    for (int32_t t = 0; t < c->n; t++) {
        int32_t b, e;
        token_range(c, t, &b, &e);
        const int32_t n = (e - 1) / BUBO_ATTEND_CHUNK - b / BUBO_ATTEND_CHUNK + 1;
        if (n > most) most = n;
    }
    return most > 1 ? most : 0;
}

static size_t att_part_floats(const bubo_hparams *hp, int32_t n, int32_t n_chunks) {
    return (size_t)n * hp->n_head * (size_t)n_chunks * ((size_t)hp->head_dim_v + 2);
}

typedef struct {
    const step_ctx *c;
    int32_t n_chunks;
} split_ctx;

static void attention_split_share(void *vctx, int ith, int nth) {
    const split_ctx *sc = vctx;
    const step_ctx *c = sc->c;
    const bubo_model *m = c->m;
    const bubo_hparams *hp = &m->hp;
    const int group = hp->n_head / hp->n_head_kv, hdv = hp->head_dim_v;
    const size_t part = (size_t)group * ((size_t)hdv + 2); /* one partial: out [group][hdv], m, l */
    uint8_t *q_att = m->s.q_att + (size_t)ith * ATTN_TILE_TOKENS * group * m->s.q_att_stride;
    float *scratch = m->s.v_tmp + (size_t)ith * bubo_attend_scratch_floats(ATTN_TILE_TOKENS, group, hp->head_dim_k, hdv);
    const int64_t n_items = (int64_t)c->n * hp->n_head_kv * sc->n_chunks;
    for (int64_t item = ith; item < n_items; item += nth) {
        const int32_t t = (int32_t)(item / ((int64_t)hp->n_head_kv * sc->n_chunks));
        const int kv_head = (int)(item / sc->n_chunks % hp->n_head_kv);
        const int32_t ci = (int32_t)(item % sc->n_chunks);
        float *out = m->s.att_part + (size_t)item * part, *pm = out + (size_t)group * hdv, *pl = pm + group;
        int32_t b, e;
        token_range(c, t, &b, &e);
        const int32_t chunk = b / BUBO_ATTEND_CHUNK + ci;
        if (chunk > (e - 1) / BUBO_ATTEND_CHUNK) {
            for (int h = 0; h < group; h++) pm[h] = -INFINITY; /* past the token's positions */
            continue;
        }
        prepare_queries(c, t, t + 1, kv_head * group, (kv_head + 1) * group, q_att, scratch);
        bubo_kv_view view;
        bubo_kv_get_view(c->kv, c->il, c->seq_ids[t], &view);
        bubo_attend_partial(&view, kv_head, hp->head_dim_k, hdv, 1, &b, &e, chunk, group, q_att, m->s.q_att_stride,
                            hp->kq_scale, pm, pl, out, 0, scratch);
    }
    bubo_pool_barrier(m->pool);
    const int64_t n_merges = (int64_t)c->n * hp->n_head_kv;
    for (int64_t item = ith; item < n_merges; item += nth) {
        const int32_t t = (int32_t)(item / hp->n_head_kv);
        const int kv_head = (int)(item % hp->n_head_kv);
        float *out = m->s.att + ((size_t)t * hp->n_head + (size_t)kv_head * group) * hdv;
        float *ml = scratch; /* the running max and sum of the group's heads */
        for (int h = 0; h < group; h++) ml[h] = -INFINITY, ml[group + h] = 0.0f;
        for (int32_t ci = 0; ci < sc->n_chunks; ci++) {
            const float *po = m->s.att_part + (size_t)(item * sc->n_chunks + ci) * part;
            const float *pm = po + (size_t)group * hdv;
            bubo_attend_merge(1, group, hdv, ml, ml + group, out, 0, pm, pm + group, po, 0);
        }
        bubo_attend_normalize(1, group, hdv, ml + group, out, 0);
    }
}

/* step_qkv for every token, then (after a barrier: a token attends to the K/V rows the others
 * wrote) attention's run, all in one pool run. */
typedef struct {
    step_ctx *c;
    bubo_pool_fn attend;
    void *attend_ctx;
} qkv_attention_ctx;

static void qkv_attention_share(void *vctx, int ith, int nth) {
    const qkv_attention_ctx *a = vctx;
    token_share(a->c, ith, nth);
    bubo_pool_barrier(a->c->m->pool);
    a->attend(a->attend_ctx, ith, nth);
}

/* ---- one chunk -------------------------------------------------------------------------------- */

static bubo_status forward_chunk(step_ctx *c, float *logits, bubo_err *err) {
    bubo_model *m = c->m;
    const bubo_hparams *hp = &m->hp;
    bubo_run_state *s = &m->s;
    const int32_t n = c->n;
    bubo_status st;

    run_tokens(c, step_embed);
    run_tokens(c, step_rope_angles);
    for (int il = 0; il < hp->n_layer; il++) {
        const bubo_layer_weights *l = &m->w.layers[il];
        c->il = il;
        /* the per-token steps before a product run as its prologue, in its pool run */
        const bubo_mat *qkv[] = {&l->wq, &l->wk, &l->wv};
        float *qkv_out[] = {s->q, s->k, s->v};
        if ((st = matmul_after(m, step_layer_input, c, 3, qkv, s->xb, n, qkv_out, err))) return st;
        for (int k = 0; k < 3; k++)
            if ((st = bubo_model_lora_apply(m, il, BUBO_LORA_Q + k, s->xb, n, qkv_out[k], err))) return st;
        const int nth = bubo_pool_n_threads(m->pool);
        split_ctx split = {c, attention_chunks(c, nth)};
        if (split.n_chunks && att_part_floats(hp, n, split.n_chunks) > s->att_part_floats) {
            const size_t want = att_part_floats(hp, n, split.n_chunks);
            float *grown = realloc(s->att_part, want * sizeof(float));
            if (!grown) return bubo_set_err(err, BUBO_ERR_NOMEM, "out of memory for attention at depth");
            s->att_part = grown;
            s->att_part_floats = want;
        }
        if (nth == 1 || (!split.n_chunks && attention_tiles(c) * hp->n_head_kv * attention_slices(c, nth) == 1)) {
            run_tokens(c, step_qkv);
            attention_share(c, 0, 1);
        } else {
            c->row_fn = step_qkv;
            qkv_attention_ctx qa = {c, split.n_chunks ? attention_split_share : attention_share,
                                    split.n_chunks ? (void *)&split : (void *)c};
            bubo_pool_run(m->pool, qkv_attention_share, &qa);
        }
        if ((st = matmul(m, &l->wo, s->att, n, s->xb2, err)) ||
            (st = bubo_model_lora_apply(m, il, BUBO_LORA_O, s->att, n, s->xb2, err)))
            return st;
        const bubo_mat *gate_up[] = {&l->gate, &l->up};
        float *gate_up_out[] = {s->hb, s->hb2};
        if ((st = matmul_after(m, step_attn_residual, c, 2, gate_up, s->xb, n, gate_up_out, err)) ||
            (st = bubo_model_lora_apply(m, il, BUBO_LORA_GATE, s->xb, n, s->hb, err)) ||
            (st = bubo_model_lora_apply(m, il, BUBO_LORA_UP, s->xb, n, s->hb2, err)))
            return st;
        const bubo_mat *down[] = {&l->down};
        float *down_out[] = {s->xb2};
        if ((st = matmul_after(m, step_ffn_act, c, 1, down, s->hb, n, down_out, err)) ||
            (st = bubo_model_lora_apply(m, il, BUBO_LORA_DOWN, s->hb, n, s->xb2, err)))
            return st;
    }
    run_tokens(c, step_ffn_residual); /* the last layer's (c->il): the next layer's input step did the others */
    if (c->n_out == 0) return BUBO_OK;

    step_ctx out = *c;
    out.n = c->n_out;
    run_tokens(&out, step_output_norm);
    if (m->out_hidden) {
        memcpy(logits, s->xb, (size_t)c->n_out * hp->n_embd * sizeof(float));
        return BUBO_OK;
    }
    bubo_mat output = m->w.output; /* its first rows only, with an output vocabulary set */
    output.rows = bubo_model_out_vocab(m);
    if ((st = matmul(m, &output, s->xb, c->n_out, logits, err))) return st;
    if (hp->final_logit_softcap > 0.0f) {
        const float cap = hp->final_logit_softcap;
        for (size_t i = 0; i < (size_t)c->n_out * output.rows; i++) logits[i] = cap * tanhf(logits[i] / cap);
    }
    return BUBO_OK;
}

/* ---- decode ----------------------------------------------------------------------------------- */

bubo_status bubo_model_decode(bubo_model *m, bubo_kv *kv, int32_t n_tokens, const int32_t *tokens, const int32_t *pos,
                              const int32_t *seq_ids, const uint8_t *want_logits, float *logits, bubo_err *err) {
    return bubo_model_decode_lora(m, kv, n_tokens, tokens, pos, seq_ids, want_logits, NULL, logits, err);
}

bubo_status bubo_model_decode_lora(bubo_model *m, bubo_kv *kv, int32_t n_tokens, const int32_t *tokens,
                                   const int32_t *pos, const int32_t *seq_ids, const uint8_t *want_logits,
                                   const float *lora_scales, float *logits, bubo_err *err) {
    const bubo_hparams *hp = &m->hp;
    if (!hp->causal)
        return bubo_set_err(err, BUBO_ERR_INVALID, "%s is an encoder (%s): it encodes (bubo_model_encode), it does not decode",
                            m->path, hp->arch_name);
    const bubo_kv_params *kp = bubo_kv_get_params(kv);
    bubo_kv_params mine;
    bubo_model_kv_params(m, &mine);
    if (kp->n_layer != mine.n_layer || kp->n_embd_k != mine.n_embd_k || kp->n_embd_v != mine.n_embd_v ||
        kp->head_dim_k != mine.head_dim_k || kp->head_dim_v != mine.head_dim_v ||
        memcmp(kp->is_swa, mine.is_swa, sizeof kp->is_swa) ||
        kp->swa_window != mine.swa_window)
        return bubo_set_err(err, BUBO_ERR_INVALID, "this KV cache was made for another model shape (%d layers, K rows of %lld)",
                            kp->n_layer, (long long)kp->n_embd_k);
    if (n_tokens < 0) return bubo_set_err(err, BUBO_ERR_INVALID, "n_tokens must be >= 0, not %d", (int)n_tokens);
    for (int32_t t = 0; t < n_tokens; t++)
        if (tokens[t] < 0 || tokens[t] >= hp->n_vocab)
            return bubo_set_err(err, BUBO_ERR_INVALID, "batch row %d: token id %d is out of range: the vocabulary has %d tokens (0..%d)",
                                (int)t, (int)tokens[t], hp->n_vocab, hp->n_vocab - 1);
    /* the whole batch is checked here and appended chunk by chunk, so that sliding-window layers
     * release what falls out of their window between chunks (their pool holds a window plus one
     * chunk per sequence); a chunk's append cannot fail once the batch passed */
    int any_lora = 0;
    for (int32_t t = 0; lora_scales && t < n_tokens; t++)
        for (int j = 0; j < BUBO_MAX_LORA; j++) {
            const float sc = lora_scales[(size_t)t * BUBO_MAX_LORA + (size_t)j];
            if (!isfinite(sc) || fabsf(sc) > 1e6f)
                return bubo_set_err(err, BUBO_ERR_INVALID, "batch row %d: adapter %d's scale is not a finite number "
                                    "of at most 1e6", (int)t, j);
            if (sc != 0.0f && !m->lora.pairs[j])
                return bubo_set_err(err, BUBO_ERR_INVALID, "batch row %d: adapter slot %d is empty", (int)t, j);
            any_lora |= sc != 0.0f;
        }
    bubo_status st = bubo_kv_check_batch(kv, n_tokens, seq_ids, pos, err);
    if (st) return st;
    /* llama.cpp's rule: a one-token step runs on -t threads, anything larger on -tb */
    bubo_pool_set_active(m->pool, n_tokens == 1 ? bubo_model_n_threads(m) : bubo_model_n_threads_batch(m));

    /* the wanted rows of a chunk, as chunk-relative indices; the logits rows run in batch order */
    int32_t out_rows[BUBO_MODEL_MAX_BATCH];
    size_t logits_done = 0;
    /* a chunk adds at most its own length to any sequence: within the cache's n_batch */
    const int32_t chunk = kp->swa_window > 0 && !kp->swa_full && kp->n_batch < BUBO_MODEL_MAX_BATCH
                              ? kp->n_batch
                              : BUBO_MODEL_MAX_BATCH;
    for (int32_t start = 0; start < n_tokens; start += chunk) {
        const int32_t n = n_tokens - start < chunk ? n_tokens - start : chunk;
        int32_t n_out = 0;
        for (int32_t t = 0; t < n; t++)
            if (want_logits[start + t]) out_rows[n_out++] = t;
        step_ctx c = {
            .m = m,
            .kv = kv,
            .n = n,
            .tokens = tokens + start,
            .pos = pos + start,
            .seq_ids = seq_ids + start,
            .out_rows = out_rows,
            .n_out = n_out,
            .attn_tile = attention_tile_for(n, seq_ids + start),
        };
        /* after check_batch nothing can fail but a kernel refusing a shape load already checked */
        m->lora_scales = any_lora ? lora_scales + (size_t)start * BUBO_MAX_LORA : NULL;
        st = bubo_kv_append_batch(kv, n, seq_ids + start, pos + start, err);
        if (!st) st = forward_chunk(&c, logits + logits_done * bubo_model_out_width(m), err);
        m->lora_scales = NULL;
        if (st) return st;
        logits_done += n_out;
    }
    return BUBO_OK;
}
