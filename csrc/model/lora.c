/* LoRA adapters beside the weights (bubo/model.h): for a matrix W with input x, each adapter whose
 * row scale is nonzero adds scale * alpha / r * B (A x) to W x.
 *
 * Per product and adapter: the chunk rows with a nonzero scale are gathered (x), t = A x and
 * u = B t run as f32 matrix products on the pool (bubo_matmul: a row's result does not depend on
 * the other rows, so a batch that mixes adapters gives each row its own bits), then each row adds
 * its scale times u. The base weights are never touched. */
#include <stdlib.h>
#include <string.h>

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
    if (!s->x) {
        s->x = malloc((size_t)(B * wide) * sizeof(float));
        s->u = malloc((size_t)(B * wide) * sizeof(float));
        s->rows = malloc((size_t)B * sizeof(int32_t));
        if (!s->x || !s->u || !s->rows) {
            free(s->x), free(s->u), free(s->rows);
            s->x = s->u = NULL, s->rows = NULL;
            return bubo_set_err(err, BUBO_ERR_NOMEM, "out of memory for the adapters' scratch");
        }
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
    memcpy(cb, b, (size_t)(w->rows * r) * sizeof(float));
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
    free(m->lora.x), free(m->lora.t), free(m->lora.u), free(m->lora.rows);
    memset(&m->lora, 0, sizeof m->lora);
}

bubo_status bubo_model_lora_apply(bubo_model *m, int il, int mat, const float *x, int32_t n, float *y, bubo_err *err) {
    if (!m->lora_scales) return BUBO_OK;
    bubo_lora_state *s = &m->lora;
    const bubo_mat *w = matrix(m, il, mat);
    const int64_t cols = w->cols, rows = w->rows;
    for (int j = 0; j < BUBO_MAX_LORA; j++) {
        if (!s->pairs[j]) continue;
        const bubo_lora_pair *p = &s->pairs[j][(size_t)il * BUBO_LORA_N_MATS + (size_t)mat];
        if (p->r == 0) continue;
        int32_t k = 0;
        for (int32_t t = 0; t < n; t++)
            if (m->lora_scales[(size_t)t * BUBO_MAX_LORA + (size_t)j] != 0.0f) s->rows[k++] = t;
        if (k == 0) continue;
        for (int32_t i = 0; i < k; i++)
            memcpy(s->x + (size_t)i * (size_t)cols, x + (size_t)s->rows[i] * (size_t)cols, (size_t)cols * sizeof(float));
        bubo_status st = bubo_matmul(m->pool, BUBO_TYPE_F32, p->a, p->r, cols, s->x, k, s->t, NULL, 0, err);
        if (!st) st = bubo_matmul(m->pool, BUBO_TYPE_F32, p->b, rows, p->r, s->t, k, s->u, NULL, 0, err);
        if (st) return st;
        for (int32_t i = 0; i < k; i++) {
            const int32_t t = s->rows[i];
            const float f = m->lora_scales[(size_t)t * BUBO_MAX_LORA + (size_t)j] * p->factor;
            float *yt = y + (size_t)t * (size_t)rows;
            const float *ut = s->u + (size_t)i * (size_t)rows;
            for (int64_t e = 0; e < rows; e++) yt[e] += f * ut[e];
        }
    }
    return BUBO_OK;
}
