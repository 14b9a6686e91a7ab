/* LoRA adapters beside the weights (bubo/model.h): for a matrix W with input x, each adapter whose
 * row scale is nonzero adds scale * alpha / r * B (A x) to W x.
 *
 * Per product and adapter, one run over the chunk's rows (on the pool, or the calling thread for
 * one row): a row with a nonzero scale takes t = A x (r f32 dot products, the CPU's best kernel),
 * then adds f * t[j] * B[:, j] for j in order (B is kept transposed, so each term is a scale and an
 * add over a contiguous row, the op table's). A row's arithmetic never depends on the other rows:
 * a batch that mixes adapters gives each row its own bits. The base weights are never touched. */
#include <stdlib.h>
#include <string.h>

#include "bubo/quants.h"
#include "model_internal.h"

#define MAX_RANK 4096

static int64_t widest(const bubo_hparams *hp) {
    int64_t w = hp->n_embd;
    const int64_t dims[] = {hp->n_ff, (int64_t)hp->n_head * hp->head_dim_k, (int64_t)hp->n_head * hp->head_dim_v,
                            (int64_t)hp->n_head_kv * hp->head_dim_k, (int64_t)hp->n_head_kv * hp->head_dim_v};
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
        if (dims[i] > w) w = dims[i];
    return w;
}

static const bubo_mat *matrix(const bubo_model *m, int il, int mat) {
    const bubo_layer_weights *l = &m->w.layers[il];
    const bubo_mat *mats[BUBO_LORA_N_MATS] = {&l->wq, &l->wk, &l->wv, &l->wo, &l->gate, &l->up, &l->down};
    return mats[mat];
}

bubo_status bubo_model_lora_set(bubo_model *m, int slot, int il, int mat, int32_t r, const float *a, const float *b,
                                float factor, bubo_err *err) {
    const bubo_hparams *hp = &m->hp;
    if (!hp->causal) return bubo_set_err(err, BUBO_ERR_INVALID, "%s is an encoder: it takes no adapters", m->path);
    if (slot < 0 || slot >= BUBO_MAX_LORA)
        return bubo_set_err(err, BUBO_ERR_INVALID, "adapter slot %d: give 0..%d", slot, BUBO_MAX_LORA - 1);
    if (il < 0 || il >= hp->n_layer)
        return bubo_set_err(err, BUBO_ERR_INVALID, "layer %d: the model has %d layers", il, hp->n_layer);
    if (mat < 0 || mat >= BUBO_LORA_N_MATS) return bubo_set_err(err, BUBO_ERR_INVALID, "matrix %d is not one of q, k, v, o, gate, up, down", mat);
    if (r < 1 || r > MAX_RANK) return bubo_set_err(err, BUBO_ERR_INVALID, "rank %d: give 1..%d", (int)r, MAX_RANK);
    const bubo_mat *w = matrix(m, il, mat);
    if (!w->data || w->rows <= 0) return bubo_set_err(err, BUBO_ERR_INVALID, "layer %d has no such matrix", il);
    bubo_lora_state *s = &m->lora;
    const int64_t B = BUBO_MODEL_MAX_BATCH, wide = widest(hp);
    if (!s->u) {
        s->u = malloc((size_t)(B * wide) * sizeof(float));
        if (!s->u) return bubo_set_err(err, BUBO_ERR_NOMEM, "out of memory for the adapters' scratch");
    }
    if (r > s->r_max) {
        float *t = realloc(s->t, (size_t)(B * r) * sizeof(float));
        if (!t) return bubo_set_err(err, BUBO_ERR_NOMEM, "out of memory for a rank-%d adapter", (int)r);
        s->t = t, s->r_max = r;
    }
    if (!s->pairs[slot]) {
        s->pairs[slot] = calloc((size_t)hp->n_layer * BUBO_LORA_N_MATS, sizeof(bubo_lora_pair));
        if (!s->pairs[slot]) return bubo_set_err(err, BUBO_ERR_NOMEM, "out of memory for an adapter");
    }
    float *ca = malloc((size_t)(r * w->cols) * sizeof(float)), *cb = malloc((size_t)(w->rows * r) * sizeof(float));
    if (!ca || !cb) {
        free(ca), free(cb);
        return bubo_set_err(err, BUBO_ERR_NOMEM, "out of memory for an adapter's rank-%d pair", (int)r);
    }
    memcpy(ca, a, (size_t)(r * w->cols) * sizeof(float));
    for (int64_t e = 0; e < w->rows; e++) /* B transposed: column j of B is row j here */
        for (int32_t j = 0; j < r; j++) cb[(size_t)j * (size_t)w->rows + (size_t)e] = b[(size_t)e * (size_t)r + (size_t)j];
    bubo_lora_pair *p = &s->pairs[slot][(size_t)il * BUBO_LORA_N_MATS + (size_t)mat];
    free(p->a), free(p->b);
    *p = (bubo_lora_pair){.r = r, .a = ca, .b = cb, .factor = factor};
    return BUBO_OK;
}

void bubo_model_lora_clear(bubo_model *m, int slot) {
    if (slot < 0 || slot >= BUBO_MAX_LORA || !m->lora.pairs[slot]) return;
    for (size_t i = 0; i < (size_t)m->hp.n_layer * BUBO_LORA_N_MATS; i++) {
        free(m->lora.pairs[slot][i].a);
        free(m->lora.pairs[slot][i].b);
    }
    free(m->lora.pairs[slot]);
    m->lora.pairs[slot] = NULL;
}

void bubo_model_lora_free(bubo_model *m) {
    for (int i = 0; i < BUBO_MAX_LORA; i++) bubo_model_lora_clear(m, i);
    free(m->lora.t), free(m->lora.u);
    memset(&m->lora, 0, sizeof m->lora);
}

typedef struct {
    const bubo_model *m;
    const bubo_lora_pair *p;
    int slot;
    const float *x;
    float *y;
    int64_t cols, rows;
    bubo_vec_dot_fn dot;
} lora_rows;

static void lora_row(const void *vc, int32_t t) {
    const lora_rows *c = vc;
    const bubo_model *m = c->m;
    const float scale = m->lora_scales[(size_t)t * BUBO_MAX_LORA + (size_t)c->slot];
    if (scale == 0.0f) return;
    const bubo_lora_pair *p = c->p;
    float *tmp = m->lora.t + (size_t)t * (size_t)m->lora.r_max;
    float *u = m->lora.u + (size_t)t * (size_t)c->rows;
    const float *xt = c->x + (size_t)t * (size_t)c->cols;
    float *yt = c->y + (size_t)t * (size_t)c->rows;
    for (int32_t j = 0; j < p->r; j++) c->dot((int)c->cols, &tmp[j], p->a + (size_t)j * (size_t)c->cols, xt);
    const float f = scale * p->factor;
    for (int32_t j = 0; j < p->r; j++) {
        m->ops->scale(c->rows, u, p->b + (size_t)j * (size_t)c->rows, f * tmp[j]);
        m->ops->add(c->rows, yt, yt, u);
    }
}

bubo_status bubo_model_lora_apply(bubo_model *m, int il, int mat, const float *x, int32_t n, float *y, bubo_err *err) {
    (void)err;
    if (!m->lora_scales) return BUBO_OK;
    const bubo_mat *w = matrix(m, il, mat);
    for (int j = 0; j < BUBO_MAX_LORA; j++) {
        if (!m->lora.pairs[j]) continue;
        const bubo_lora_pair *p = &m->lora.pairs[j][(size_t)il * BUBO_LORA_N_MATS + (size_t)mat];
        if (p->r == 0) continue;
        int any = 0;
        for (int32_t t = 0; t < n && !any; t++) any = m->lora_scales[(size_t)t * BUBO_MAX_LORA + (size_t)j] != 0.0f;
        if (!any) continue;
        lora_rows c = {m, p, j, x, y, w->cols, w->rows, bubo_get_vec_dot(BUBO_TYPE_F32)};
        bubo_model_run_rows(m, n, &c, lora_row);
    }
    return BUBO_OK;
}
