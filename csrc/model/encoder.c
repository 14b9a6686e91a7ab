/* The encoder forward pass (bert): sequences packed into one chunk, attention both ways within
 * each sequence, no KV cache.
 *
 * Follow one token t of a sequence, at position p:
 *   x[t] = LayerNorm(tok_embd[token] + pos_embd[p] + token_types[0], embd_norm)
 *   per layer (post-LayerNorm):
 *     q,k,v = Wq x + bq, Wk x + bk, Wv x + bv
 *     att   = per head softmax(q . K[its sequence] / sqrt(head_dim)) . V[its sequence]
 *     x     = LayerNorm(x + Wo att + bo, attn_out_norm)
 *     x     = LayerNorm(x + Wdown gelu(Wup x + b_up) + b_down, layer_out_norm)
 *   out[t] = x[t]
 *
 * GELU is the exact (erf) one BERT was trained with. Matrix products go through bubo_matmul as the
 * decoder's do, LayerNorm and the elementwise steps through the level's op table; the per-token
 * steps and attention (one item per query row and head) are split over the pool. */
#include <string.h>

#include "model_internal.h"

typedef struct {
    bubo_model *m;
    int il;
    int32_t n;              /* tokens in the chunk */
    const int32_t *tokens;  /* [n] */
    const int32_t *pos;     /* [n] position of each token in its sequence */
    const int32_t *seq_beg; /* [n] chunk row of the first token of each token's sequence */
    const int32_t *seq_len; /* [n] length of each token's sequence */
} enc_ctx;

static void enc_embed(const void *vc, int32_t t) {
    const enc_ctx *c = vc;
    const bubo_model *m = c->m;
    const int64_t d = m->hp.n_embd;
    float *x = m->s.x + (size_t)t * d, *tmp = m->s.xb2 + (size_t)t * d;
    const bubo_mat *e = &m->w.token_embd, *p = &m->w.pos_embd;
    bubo_get_to_float(e->type)((const uint8_t *)e->data + (size_t)c->tokens[t] * bubo_row_size(e->type, d), x, d);
    bubo_get_to_float(p->type)((const uint8_t *)p->data + (size_t)c->pos[t] * bubo_row_size(p->type, d), tmp, d);
    m->ops->add(d, x, x, tmp);
    m->ops->add(d, x, x, m->w.token_types); /* type 0: one segment */
    m->ops->layer_norm(d, x, x, m->w.embd_norm, m->w.embd_norm_b, m->hp.norm_eps);
}

static void enc_qkv_bias(const void *vc, int32_t t) {
    const enc_ctx *c = vc;
    const bubo_model *m = c->m;
    const bubo_layer_weights *l = &m->w.layers[c->il];
    const int64_t d = m->hp.n_embd;
    float *q = m->s.q + (size_t)t * d, *k = m->s.k + (size_t)t * d, *v = m->s.v + (size_t)t * d;
    m->ops->add(d, q, q, l->bq);
    m->ops->add(d, k, k, l->bk);
    m->ops->add(d, v, v, l->bv);
}

/* x = LayerNorm(x + xb2 + bias, norm) */
static void residual_norm(const bubo_model *m, int32_t t, const float *bias, const float *w, const float *b) {
    const int64_t d = m->hp.n_embd;
    float *x = m->s.x + (size_t)t * d, *xb2 = m->s.xb2 + (size_t)t * d;
    m->ops->add(d, xb2, xb2, bias);
    m->ops->add(d, x, x, xb2);
    m->ops->layer_norm(d, x, x, w, b, m->hp.norm_eps);
}

static void enc_attn_residual(const void *vc, int32_t t) {
    const enc_ctx *c = vc;
    const bubo_layer_weights *l = &c->m->w.layers[c->il];
    residual_norm(c->m, t, l->bo, l->attn_out_norm, l->attn_out_norm_b);
}

static void enc_ffn_act(const void *vc, int32_t t) {
    const enc_ctx *c = vc;
    const bubo_model *m = c->m;
    const int64_t f = m->hp.n_ff;
    float *h = m->s.hb + (size_t)t * f;
    m->ops->add(f, h, h, m->w.layers[c->il].b_up);
    m->ops->gelu_erf(f, h, h);
}

static void enc_ffn_residual(const void *vc, int32_t t) {
    const enc_ctx *c = vc;
    const bubo_layer_weights *l = &c->m->w.layers[c->il];
    residual_norm(c->m, t, l->b_down, l->layer_out_norm, l->layer_out_norm_b);
}

/* one item: query row t, head h, over every token of t's sequence */
static void enc_attention_share(void *vc, int ith, int nth) {
    const enc_ctx *c = vc;
    const bubo_model *m = c->m;
    const bubo_hparams *hp = &m->hp;
    const int hd = hp->head_dim_k, d = hp->n_embd;
    float *scores = m->s.enc_scores + (size_t)ith * BUBO_MODEL_MAX_BATCH;
    const int64_t n_items = (int64_t)c->n * hp->n_head;
    for (int64_t item = ith; item < n_items; item += nth) {
        const int32_t t = (int32_t)(item / hp->n_head);
        const int h = (int)(item % hp->n_head);
        const int32_t b = c->seq_beg[t], len = c->seq_len[t];
        const size_t head = (size_t)b * (size_t)d + (size_t)h * (size_t)hd;
        m->ops->dot_rows(len, hd, m->s.q + (size_t)t * d + (size_t)h * hd, m->s.k + head, d, scores);
        m->ops->softmax(len, scores, hp->kq_scale, NULL);
        m->ops->sum_rows(len, hd, scores, m->s.v + head, d, m->s.att + (size_t)t * d + (size_t)h * hd);
    }
}

static bubo_status encode_chunk(enc_ctx *c, float *out, bubo_err *err) {
    bubo_model *m = c->m;
    bubo_run_state *s = &m->s;
    const int32_t n = c->n;
    bubo_status st;
    bubo_model_run_rows(m, n, c, enc_embed);
    for (int il = 0; il < m->hp.n_layer; il++) {
        const bubo_layer_weights *l = &m->w.layers[il];
        c->il = il;
        const bubo_mat *qkv[] = {&l->wq, &l->wk, &l->wv};
        float *qkv_out[] = {s->q, s->k, s->v};
        if ((st = bubo_model_matmul_shared(m, 3, qkv, s->x, n, qkv_out, err))) return st;
        bubo_model_run_rows(m, n, c, enc_qkv_bias);
        if (bubo_pool_n_threads(m->pool) == 1)
            enc_attention_share(c, 0, 1);
        else
            bubo_pool_run(m->pool, enc_attention_share, c);
        if ((st = bubo_model_matmul(m, &l->wo, s->att, n, s->xb2, err))) return st;
        bubo_model_run_rows(m, n, c, enc_attn_residual);
        if ((st = bubo_model_matmul(m, &l->up, s->x, n, s->hb, err))) return st;
        bubo_model_run_rows(m, n, c, enc_ffn_act);
        if ((st = bubo_model_matmul(m, &l->down, s->hb, n, s->xb2, err))) return st;
        bubo_model_run_rows(m, n, c, enc_ffn_residual);
    }
    memcpy(out, s->x, (size_t)n * m->hp.n_embd * sizeof(float));
    return BUBO_OK;
}

bubo_status bubo_model_encode(bubo_model *m, int64_t n_tokens, const int32_t *tokens, int32_t n_seqs,
                              const int32_t *seq_lens, float *out, bubo_err *err) {
    const bubo_hparams *hp = &m->hp;
    if (hp->causal)
        return bubo_set_err(err, BUBO_ERR_INVALID, "%s is a decoder (%s): it decodes through a KV cache, it does not encode",
                            m->path, hp->arch_name);
    if (n_seqs < 0) return bubo_set_err(err, BUBO_ERR_INVALID, "n_seqs must be >= 0, not %d", (int)n_seqs);
    const int32_t max_len = hp->n_ctx_train < BUBO_MODEL_MAX_BATCH ? hp->n_ctx_train : BUBO_MODEL_MAX_BATCH;
    /* every length first (the tokens they cover must exist), then every token */
    int64_t total = 0;
    for (int32_t i = 0; i < n_seqs; i++) {
        if (seq_lens[i] < 1 || seq_lens[i] > max_len)
            return bubo_set_err(err, BUBO_ERR_INVALID, "sequence %d has %d tokens: an encoder takes 1..%d", (int)i, (int)seq_lens[i],
                                (int)max_len);
        total += seq_lens[i];
    }
    if (total != n_tokens)
        return bubo_set_err(err, BUBO_ERR_INVALID, "the sequences' lengths sum to %lld, but there are %lld tokens",
                            (long long)total, (long long)n_tokens);
    for (int64_t t = 0; t < n_tokens; t++)
        if (tokens[t] < 0 || tokens[t] >= hp->n_vocab)
            return bubo_set_err(err, BUBO_ERR_INVALID, "token %lld: id %d is out of range: the vocabulary has %d tokens",
                                (long long)t, (int)tokens[t], hp->n_vocab);
    bubo_pool_set_active(m->pool, bubo_model_n_threads_batch(m)); /* an encode is a batch (-tb) */
    int32_t pos[BUBO_MODEL_MAX_BATCH], beg[BUBO_MODEL_MAX_BATCH], len[BUBO_MODEL_MAX_BATCH];
    int64_t done = 0;
    for (int32_t i = 0; i < n_seqs;) {
        /* as many whole sequences as fit in one chunk */
        int32_t n = 0;
        for (; i < n_seqs && n + seq_lens[i] <= BUBO_MODEL_MAX_BATCH; i++) {
            for (int32_t j = 0; j < seq_lens[i]; j++) {
                pos[n + j] = j;
                beg[n + j] = n;
                len[n + j] = seq_lens[i];
            }
            n += seq_lens[i];
        }
        enc_ctx c = {.m = m, .n = n, .tokens = tokens + done, .pos = pos, .seq_beg = beg, .seq_len = len};
        bubo_status st = encode_chunk(&c, out + done * hp->n_embd, err);
        if (st) return st;
        done += n;
    }
    return BUBO_OK;
}
