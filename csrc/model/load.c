/* Loading a model: hyperparameters from the GGUF metadata, weights bound by tensor name, and the
 * run state sized once for the largest chunk. The rules per family follow llama.cpp's loader
 * (src/llama-model.cpp, src/models/<arch>.cpp), so that the same file means the same model. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "model_internal.h"

/* ---- metadata ---------------------------------------------------------------------------------- */

typedef struct {
    const bubo_model *m;
    bubo_err *err;
} loader;

static bubo_status key_u32(loader *L, const char *suffix, int required, uint32_t dflt, int *out) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", L->m->hp.arch_name, suffix);
    uint64_t v;
    if (bubo_gguf_get_u64(L->m->gguf, key, &v)) {
        if (v > INT32_MAX)
            return bubo_set_err(L->err, BUBO_ERR_FORMAT, "%s: key '%s' = %llu is out of range", L->m->path, key,
                                (unsigned long long)v);
        *out = (int)v;
        return BUBO_OK;
    }
    if (bubo_gguf_get(L->m->gguf, key))
        return bubo_set_err(L->err, BUBO_ERR_UNSUPPORTED, "%s: key '%s' is not one unsigned integer (per-layer arrays are not supported)",
                            L->m->path, key);
    if (required) return bubo_set_err(L->err, BUBO_ERR_FORMAT, "%s: key '%s' is missing", L->m->path, key);
    *out = (int)dflt;
    return BUBO_OK;
}

static bubo_status key_f32(loader *L, const char *suffix, int required, float dflt, float *out) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", L->m->hp.arch_name, suffix);
    double v;
    if (bubo_gguf_get_f64(L->m->gguf, key, &v)) {
        *out = (float)v;
        return BUBO_OK;
    }
    if (required) return bubo_set_err(L->err, BUBO_ERR_FORMAT, "%s: key '%s' is missing", L->m->path, key);
    *out = dflt;
    return BUBO_OK;
}

/* bert: no RoPE (learned positions), LayerNorm, attention both ways; its own causal flag must
 * not say otherwise */
static bubo_status load_bert_hparams(loader *L, bubo_hparams *hp) {
    const bubo_model *m = L->m;
    bubo_status st;
    if (hp->n_head_kv != hp->n_head || hp->n_embd % hp->n_head)
        return bubo_set_err(L->err, BUBO_ERR_FORMAT, "%s: bert needs n_embd (%d) a multiple of the heads (%d), as many KV heads",
                            m->path, hp->n_embd, hp->n_head);
    hp->head_dim_k = hp->head_dim_v = hp->n_embd / hp->n_head;
    hp->n_rot = 0;
    hp->rope_freq_base = hp->rope_freq_base_swa = 10000.0f;
    hp->rope_freq_scale = hp->rope_freq_scale_swa = 1.0f;
    if ((st = key_f32(L, "attention.layer_norm_epsilon", 1, 0, &hp->norm_eps))) return st;
    char key[128];
    snprintf(key, sizeof key, "%s.attention.causal", hp->arch_name);
    const bubo_gguf_value *causal = bubo_gguf_get(m->gguf, key);
    if (causal && !(causal->type == BUBO_GGUF_BOOL && !causal->v.b))
        return bubo_set_err(L->err, BUBO_ERR_UNSUPPORTED, "%s: key '%s' must be false for bert (a causal bert is not supported)",
                            m->path, key);
    hp->causal = 0;
    hp->embd_scale = hp->q_scale = 1.0f;
    hp->kq_scale = 1.0f / sqrtf((float)hp->head_dim_k);
    hp->final_logit_softcap = 0.0f;
    hp->sliding_window = 0;
    memset(hp->is_swa, 0, sizeof hp->is_swa);
    if (hp->n_ctx_train > BUBO_MODEL_MAX_BATCH)
        return bubo_set_err(L->err, BUBO_ERR_UNSUPPORTED, "%s: bert.context_length %d: bubo encodes sequences of at most %d tokens",
                            m->path, hp->n_ctx_train, BUBO_MODEL_MAX_BATCH);
    return BUBO_OK;
}

static bubo_status load_hparams(loader *L, bubo_hparams *hp) {
    const bubo_model *m = L->m;
    bubo_gguf_str arch;
    if (!bubo_gguf_get_str(m->gguf, "general.architecture", &arch))
        return bubo_set_err(L->err, BUBO_ERR_FORMAT, "%s: key 'general.architecture' is missing", m->path);
    static const struct {
        const char *name;
        bubo_arch arch;
    } known[] = {{"llama", BUBO_ARCH_LLAMA}, {"qwen2", BUBO_ARCH_QWEN2}, {"qwen3", BUBO_ARCH_QWEN3}, {"gemma3", BUBO_ARCH_GEMMA3},
               {"bert", BUBO_ARCH_BERT}};
    int found = 0;
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (bubo_gguf_str_eq(arch, known[i].name)) {
            hp->arch = known[i].arch;
            snprintf(hp->arch_name, sizeof hp->arch_name, "%s", known[i].name);
            found = 1;
        }
    if (!found)
        return bubo_set_err(L->err, BUBO_ERR_UNSUPPORTED,
                            "%s: architecture '%.*s' is not supported (bubo runs llama, qwen2, qwen3, gemma3, bert)", m->path,
                            (int)(arch.len > 64 ? 64 : arch.len), arch.data);

    bubo_status st;
    if ((st = key_u32(L, "block_count", 1, 0, &hp->n_layer)) || (st = key_u32(L, "embedding_length", 1, 0, &hp->n_embd)) ||
        (st = key_u32(L, "feed_forward_length", 1, 0, &hp->n_ff)) ||
        (st = key_u32(L, "attention.head_count", 1, 0, &hp->n_head)) ||
        (st = key_u32(L, "attention.head_count_kv", 0, (uint32_t)hp->n_head, &hp->n_head_kv)) ||
        (st = key_u32(L, "context_length", 1, 0, &hp->n_ctx_train)))
        return st;
    if (hp->n_layer < 1 || hp->n_layer > BUBO_MAX_LAYERS)
        return bubo_set_err(L->err, BUBO_ERR_UNSUPPORTED, "%s: %s.block_count = %d (bubo runs 1..%d layers)", m->path,
                            hp->arch_name, hp->n_layer, BUBO_MAX_LAYERS);
    if (hp->n_head < 1 || hp->n_head_kv < 1 || hp->n_head % hp->n_head_kv || hp->n_embd < 1 || hp->n_ff < 1)
        return bubo_set_err(L->err, BUBO_ERR_FORMAT, "%s: bad attention shape: %d heads, %d KV heads, n_embd %d, n_ff %d",
                            m->path, hp->n_head, hp->n_head_kv, hp->n_embd, hp->n_ff);
    int pooling;
    if ((st = key_u32(L, "pooling_type", 0, (uint32_t)BUBO_POOLING_UNSPECIFIED, &pooling))) return st;
    hp->pooling = pooling >= BUBO_POOLING_NONE && pooling <= BUBO_POOLING_LAST ? (bubo_pooling)pooling : BUBO_POOLING_UNSPECIFIED;
    hp->causal = 1;
    if (hp->arch == BUBO_ARCH_BERT) return load_bert_hparams(L, hp);
    if ((st = key_u32(L, "attention.key_length", 0, (uint32_t)(hp->n_embd / hp->n_head), &hp->head_dim_k)) ||
        (st = key_u32(L, "attention.value_length", 0, (uint32_t)(hp->n_embd / hp->n_head), &hp->head_dim_v)) ||
        (st = key_u32(L, "rope.dimension_count", 0, (uint32_t)hp->head_dim_k, &hp->n_rot)))
        return st;
    if (hp->head_dim_k < 1 || hp->head_dim_v < 1 || hp->n_rot % 2 || hp->n_rot > hp->head_dim_k)
        return bubo_set_err(L->err, BUBO_ERR_FORMAT, "%s: bad head shape: key length %d, value length %d, rope dims %d",
                            m->path, hp->head_dim_k, hp->head_dim_v, hp->n_rot);
    if ((st = key_f32(L, "attention.layer_norm_rms_epsilon", 1, 0, &hp->norm_eps)) ||
        (st = key_f32(L, "rope.freq_base", 0, 10000.0f, &hp->rope_freq_base)))
        return st;

    /* RoPE scaling: linear only (a frequency scale); YaRN and friends change the angles and the
     * attention magnitude, which this forward pass does not do, so such a file is refused. */
    char key[128];
    snprintf(key, sizeof key, "%s.rope.scaling.type", hp->arch_name);
    bubo_gguf_str scaling;
    if (bubo_gguf_get_str(m->gguf, key, &scaling) && !bubo_gguf_str_eq(scaling, "none") &&
        !bubo_gguf_str_eq(scaling, "linear"))
        return bubo_set_err(L->err, BUBO_ERR_UNSUPPORTED, "%s: key '%s' = '%.*s': only linear RoPE scaling is supported",
                            m->path, key, (int)(scaling.len > 32 ? 32 : scaling.len), scaling.data);
    float factor;
    if ((st = key_f32(L, "rope.scaling.factor", 0, 0.0f, &factor))) return st;
    if (factor == 0.0f && (st = key_f32(L, "rope.scale_linear", 0, 0.0f, &factor))) return st;
    hp->rope_freq_scale = factor == 0.0f ? 1.0f : 1.0f / factor;
    hp->rope_freq_base_swa = hp->rope_freq_base;
    hp->rope_freq_scale_swa = hp->rope_freq_scale;

    hp->rope_neox = hp->arch != BUBO_ARCH_LLAMA;
    hp->embd_scale = 1.0f;
    hp->q_scale = 1.0f;
    hp->kq_scale = 1.0f / sqrtf((float)hp->head_dim_k);
    hp->final_logit_softcap = 0.0f;
    hp->sliding_window = 0;
    memset(hp->is_swa, 0, sizeof hp->is_swa);

    if (hp->arch == BUBO_ARCH_GEMMA3) {
        hp->embd_scale = sqrtf((float)hp->n_embd);
        /* gemma's query_pre_attn_scalar: head_dim, except the 27B (62 layers) uses n_embd / n_head */
        hp->q_scale = hp->n_layer == 62 ? 1.0f / sqrtf((float)(hp->n_embd / hp->n_head)) : 1.0f / sqrtf((float)hp->head_dim_k);
        hp->kq_scale = 1.0f;
        if ((st = key_f32(L, "final_logit_softcapping", 0, 0.0f, &hp->final_logit_softcap))) return st;
        if ((st = key_u32(L, "attention.sliding_window", 0, 0, &hp->sliding_window))) return st;
        if (hp->sliding_window > 0) {
            /* which layers slide: an explicit per-layer array, else every layer but each n-th
             * (n from the key, 6 by default: five local layers, then a global one) */
            snprintf(key, sizeof key, "%s.attention.sliding_window_pattern", hp->arch_name);
            const bubo_gguf_value *pat = bubo_gguf_get(m->gguf, key);
            if (pat && pat->type == BUBO_GGUF_ARRAY) {
                if (pat->v.arr.n != (uint64_t)hp->n_layer || pat->v.arr.elem_type == BUBO_GGUF_STRING ||
                    pat->v.arr.elem_type == BUBO_GGUF_ARRAY)
                    return bubo_set_err(L->err, BUBO_ERR_FORMAT, "%s: key '%s' must hold one flag per layer (%d)", m->path,
                                        key, hp->n_layer);
                for (int il = 0; il < hp->n_layer; il++) hp->is_swa[il] = bubo_gguf_arr_u64(pat, il) != 0;
            } else {
                int n_pattern;
                if ((st = key_u32(L, "attention.sliding_window_pattern", 0, 6, &n_pattern))) return st;
                for (int il = 0; il < hp->n_layer; il++)
                    hp->is_swa[il] = n_pattern == 0 || il % n_pattern < n_pattern - 1;
            }
            /* local layers keep their own base and no scaling, as llama.cpp's defaults */
            if ((st = key_f32(L, "rope.freq_base_swa", 0, 10000.0f, &hp->rope_freq_base_swa))) return st;
            hp->rope_freq_scale_swa = 1.0f;
        }
    }
    return BUBO_OK;
}

/* ---- weights ----------------------------------------------------------------------------------- */

static const bubo_gguf_tensor *find(loader *L, const char *name) {
    return bubo_gguf_find_tensor(L->m->gguf, name);
}

/* A 2-D weight of shape (rows, cols), i.e. GGUF ne = [cols, rows]. */
static bubo_status bind_mat(loader *L, const char *name, int64_t rows, int64_t cols, int required, bubo_mat *out) {
    const bubo_gguf_tensor *t = find(L, name);
    memset(out, 0, sizeof *out);
    if (!t) {
        if (!required) return BUBO_OK;
        return bubo_set_err(L->err, BUBO_ERR_FORMAT, "%s: tensor '%s' is missing", L->m->path, name);
    }
    if (t->n_dims != 2 || t->ne[0] != cols || t->ne[1] != rows)
        return bubo_set_err(L->err, BUBO_ERR_FORMAT, "%s: tensor '%s' has shape [%lld, %lld] (%u dims), expected [%lld, %lld]",
                            L->m->path, name, (long long)t->ne[0], (long long)t->ne[1], t->n_dims, (long long)cols,
                            (long long)rows);
    const bubo_type_traits *tr = bubo_type_get_traits((int)t->type);
    const bubo_type_traits *act = tr ? bubo_type_get_traits(tr->vec_dot_type) : NULL;
    if (!tr || !tr->supported || !act || cols % tr->blck_size || cols % act->blck_size)
        return bubo_set_err(L->err, BUBO_ERR_UNSUPPORTED, "%s: tensor '%s' of type %s with rows of %lld cannot be multiplied",
                            L->m->path, name, tr ? tr->name : "?", (long long)cols);
    out->type = (bubo_type)t->type;
    out->data = t->data;
    out->rows = rows;
    out->cols = cols;
    return BUBO_OK;
}

/* A table of rows x n elements (GGUF ne = [n, rows], or a 1-D [n] when rows is 1), widened to an
 * owned f32 copy. */
static bubo_status load_floats(loader *L, const char *name, int64_t n, int64_t rows, int required, float **out) {
    const bubo_gguf_tensor *t = find(L, name);
    *out = NULL;
    if (!t) {
        if (!required) return BUBO_OK;
        return bubo_set_err(L->err, BUBO_ERR_FORMAT, "%s: tensor '%s' is missing", L->m->path, name);
    }
    int64_t n_el = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) n_el *= t->ne[d];
    if (t->ne[0] != n || n_el != n * rows)
        return bubo_set_err(L->err, BUBO_ERR_FORMAT, "%s: tensor '%s' has %lld elements ([%lld, ...]), expected [%lld, %lld]",
                            L->m->path, name, (long long)n_el, (long long)t->ne[0], (long long)n, (long long)rows);
    const bubo_type_traits *tr = bubo_type_get_traits((int)t->type);
    if (!tr || !tr->supported || n % tr->blck_size)
        return bubo_set_err(L->err, BUBO_ERR_UNSUPPORTED, "%s: tensor '%s' has type %s, which bubo cannot read here",
                            L->m->path, name, tr ? tr->name : "?");
    float *v = malloc((size_t)(n * rows) * sizeof *v);
    if (!v) return bubo_set_err(L->err, BUBO_ERR_NOMEM, "%s: out of memory", L->m->path);
    const size_t row_bytes = bubo_row_size((bubo_type)t->type, n);
    for (int64_t r = 0; r < rows; r++)
        bubo_get_to_float((bubo_type)t->type)((const uint8_t *)t->data + (size_t)r * row_bytes, v + r * n, n);
    *out = v;
    return BUBO_OK;
}

/* A 1-D vector of n elements, widened to an owned f32 copy. */
static bubo_status load_vec(loader *L, const char *name, int64_t n, int required, float **out) {
    return load_floats(L, name, n, 1, required, out);
}

/* bert, in llama.cpp's names: token_embd, position_embd, token_types, token_embd_norm; per
 * block attn_q/k/v/output, attn_output_norm, ffn_up/down, layer_output_norm, each with a bias */
static bubo_status bind_bert_weights(loader *L, bubo_model *m) {
    bubo_hparams *hp = &m->hp;
    bubo_weights *w = &m->w;
    bubo_status st;
    const int64_t d = hp->n_embd, f = hp->n_ff;
    const bubo_gguf_tensor *tt = find(L, "token_types.weight");
    if (!tt) return bubo_set_err(L->err, BUBO_ERR_FORMAT, "%s: tensor 'token_types.weight' is missing", m->path);
    if (tt->n_dims != 2 || tt->ne[0] != d || tt->ne[1] < 1 || tt->ne[1] > 16)
        return bubo_set_err(L->err, BUBO_ERR_FORMAT, "%s: tensor 'token_types.weight' has shape [%lld, %lld], expected [%lld, 1..16]",
                            m->path, (long long)tt->ne[0], (long long)tt->ne[1], (long long)d);
    hp->n_token_types = (int)tt->ne[1];
    hp->tied_output = 0;
    const bubo_gguf_tensor *pe = find(L, "position_embd.weight");
    if (pe && (pe->n_dims != 2 || pe->ne[1] < hp->n_ctx_train))
        return bubo_set_err(L->err, BUBO_ERR_FORMAT, "%s: tensor 'position_embd.weight' has fewer rows than context_length %d",
                            m->path, hp->n_ctx_train);
    if ((st = bind_mat(L, "position_embd.weight", pe ? pe->ne[1] : hp->n_ctx_train, d, 1, &w->pos_embd)) ||
        (st = load_floats(L, "token_types.weight", d, hp->n_token_types, 1, &w->token_types)) ||
        (st = load_vec(L, "token_embd_norm.weight", d, 1, &w->embd_norm)) ||
        (st = load_vec(L, "token_embd_norm.bias", d, 1, &w->embd_norm_b)))
        return st;
    char name[96];
#define NAME(fmt) (snprintf(name, sizeof name, "blk.%d." fmt, il), name)
    for (int il = 0; il < hp->n_layer; il++) {
        bubo_layer_weights *l = &w->layers[il];
        if ((st = bind_mat(L, NAME("attn_q.weight"), d, d, 1, &l->wq)) ||
            (st = bind_mat(L, NAME("attn_k.weight"), d, d, 1, &l->wk)) ||
            (st = bind_mat(L, NAME("attn_v.weight"), d, d, 1, &l->wv)) ||
            (st = bind_mat(L, NAME("attn_output.weight"), d, d, 1, &l->wo)) ||
            (st = bind_mat(L, NAME("ffn_up.weight"), f, d, 1, &l->up)) ||
            (st = bind_mat(L, NAME("ffn_down.weight"), d, f, 1, &l->down)) ||
            (st = load_vec(L, NAME("attn_q.bias"), d, 1, &l->bq)) ||
            (st = load_vec(L, NAME("attn_k.bias"), d, 1, &l->bk)) ||
            (st = load_vec(L, NAME("attn_v.bias"), d, 1, &l->bv)) ||
            (st = load_vec(L, NAME("attn_output.bias"), d, 1, &l->bo)) ||
            (st = load_vec(L, NAME("ffn_up.bias"), f, 1, &l->b_up)) ||
            (st = load_vec(L, NAME("ffn_down.bias"), d, 1, &l->b_down)) ||
            (st = load_vec(L, NAME("attn_output_norm.weight"), d, 1, &l->attn_out_norm)) ||
            (st = load_vec(L, NAME("attn_output_norm.bias"), d, 1, &l->attn_out_norm_b)) ||
            (st = load_vec(L, NAME("layer_output_norm.weight"), d, 1, &l->layer_out_norm)) ||
            (st = load_vec(L, NAME("layer_output_norm.bias"), d, 1, &l->layer_out_norm_b)))
            return st;
        if (find(L, NAME("ffn_gate.weight")))
            return bubo_set_err(L->err, BUBO_ERR_UNSUPPORTED, "%s: tensor '%s' (a gated FFN) is not used by bert", m->path, name);
    }
#undef NAME
    return BUBO_OK;
}

static bubo_status bind_weights(loader *L, bubo_model *m) {
    const bubo_hparams *hp = &m->hp;
    bubo_weights *w = &m->w;
    bubo_status st;
    const bubo_gguf_tensor *emb = find(L, "token_embd.weight");
    if (!emb) return bubo_set_err(L->err, BUBO_ERR_FORMAT, "%s: tensor 'token_embd.weight' is missing", m->path);
    if (emb->n_dims != 2 || emb->ne[0] != hp->n_embd || emb->ne[1] < 1 || emb->ne[1] > INT32_MAX)
        return bubo_set_err(L->err, BUBO_ERR_FORMAT, "%s: tensor 'token_embd.weight' has shape [%lld, %lld], expected [%d, n_vocab]",
                            m->path, (long long)emb->ne[0], (long long)emb->ne[1], hp->n_embd);
    m->hp.n_vocab = (int)emb->ne[1];
    const int64_t n_vocab = m->hp.n_vocab, n_embd = hp->n_embd;

    if ((st = bind_mat(L, "token_embd.weight", n_vocab, n_embd, 1, &w->token_embd))) return st;
    if (hp->arch == BUBO_ARCH_BERT) return bind_bert_weights(L, m);
    if ((st = load_vec(L, "output_norm.weight", n_embd, 1, &w->output_norm))) return st;
    if ((st = bind_mat(L, "output.weight", n_vocab, n_embd, 0, &w->output))) return st;
    m->hp.tied_output = w->output.data == NULL;
    if (m->hp.tied_output) w->output = w->token_embd;
    if ((st = load_vec(L, "rope_freqs.weight", hp->n_rot / 2, 0, &w->rope_freqs))) return st;

    const int64_t q_rows = (int64_t)hp->n_head * hp->head_dim_k;
    const int64_t k_rows = (int64_t)hp->n_head_kv * hp->head_dim_k;
    const int64_t v_rows = (int64_t)hp->n_head_kv * hp->head_dim_v;
    const int64_t o_cols = (int64_t)hp->n_head * hp->head_dim_v;
    const int qk_norm = hp->arch == BUBO_ARCH_QWEN3 || hp->arch == BUBO_ARCH_GEMMA3;
    const int post_norms = hp->arch == BUBO_ARCH_GEMMA3;
    const int bias = hp->arch == BUBO_ARCH_QWEN2;
    char name[96];
#define NAME(fmt) (snprintf(name, sizeof name, "blk.%d." fmt, il), name)
    for (int il = 0; il < hp->n_layer; il++) {
        bubo_layer_weights *l = &w->layers[il];
        if ((st = load_vec(L, NAME("attn_norm.weight"), n_embd, 1, &l->attn_norm)) ||
            (st = bind_mat(L, NAME("attn_q.weight"), q_rows, n_embd, 1, &l->wq)) ||
            (st = bind_mat(L, NAME("attn_k.weight"), k_rows, n_embd, 1, &l->wk)) ||
            (st = bind_mat(L, NAME("attn_v.weight"), v_rows, n_embd, 1, &l->wv)) ||
            (st = bind_mat(L, NAME("attn_output.weight"), n_embd, o_cols, 1, &l->wo)) ||
            (st = load_vec(L, NAME("attn_q.bias"), q_rows, bias, &l->bq)) ||
            (st = load_vec(L, NAME("attn_k.bias"), k_rows, bias, &l->bk)) ||
            (st = load_vec(L, NAME("attn_v.bias"), v_rows, bias, &l->bv)) ||
            (st = load_vec(L, NAME("attn_q_norm.weight"), hp->head_dim_k, qk_norm, &l->q_norm)) ||
            (st = load_vec(L, NAME("attn_k_norm.weight"), hp->head_dim_k, qk_norm, &l->k_norm)) ||
            (st = load_vec(L, NAME("post_attention_norm.weight"), n_embd, post_norms, &l->post_attn_norm)) ||
            (st = load_vec(L, NAME("ffn_norm.weight"), n_embd, 1, &l->ffn_norm)) ||
            (st = bind_mat(L, NAME("ffn_gate.weight"), hp->n_ff, n_embd, 1, &l->gate)) ||
            (st = bind_mat(L, NAME("ffn_up.weight"), hp->n_ff, n_embd, 1, &l->up)) ||
            (st = bind_mat(L, NAME("ffn_down.weight"), n_embd, hp->n_ff, 1, &l->down)) ||
            (st = load_vec(L, NAME("post_ffw_norm.weight"), n_embd, post_norms, &l->post_ffw_norm)))
            return st;
        /* a family that does not use them must not have them silently ignored */
        if (!qk_norm && (l->q_norm || l->k_norm))
            return bubo_set_err(L->err, BUBO_ERR_UNSUPPORTED, "%s: tensor 'blk.%d.attn_q_norm.weight' is not used by %s",
                                m->path, il, hp->arch_name);
    }
#undef NAME
    return BUBO_OK;
}

/* ---- run state ------------------------------------------------------------------------------- */

static size_t mat_scratch(const bubo_mat *w) { return bubo_matmul_scratch_size(w->type, w->cols, BUBO_MODEL_MAX_BATCH); }

static bubo_status alloc_state(bubo_model *m, bubo_err *err) {
    const bubo_hparams *hp = &m->hp;
    bubo_run_state *s = &m->s;
    const size_t B = BUBO_MODEL_MAX_BATCH;
    const int n_threads = bubo_pool_capacity(m->pool); /* every thread a run may use: scratch for each */
    size_t mm = mat_scratch(&m->w.output);
    for (int il = 0; il < hp->n_layer; il++) {
        const bubo_layer_weights *l = &m->w.layers[il];
        const bubo_mat *mats[] = {&l->wq, &l->wk, &l->wv, &l->wo, &l->gate, &l->up, &l->down};
        for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++)
            if (mat_scratch(mats[i]) > mm) mm = mat_scratch(mats[i]);
    }
    s->mm_scratch_size = mm;
    /* a query head as f32 or as q8_0 blocks (smaller): f32 bounds both; rows stay 64-byte aligned */
    s->q_att_stride = ((size_t)hp->head_dim_k * sizeof(float) + 63) & ~(size_t)63;
#define ALLOC(ptr, n) ((ptr) = aligned_alloc(64, (((n) * sizeof *(ptr)) + 63) & ~(size_t)63))
    ALLOC(s->x, B * hp->n_embd);
    ALLOC(s->xb, B * hp->n_embd);
    ALLOC(s->xb2, B * hp->n_embd);
    ALLOC(s->q, B * hp->n_head * hp->head_dim_k);
    ALLOC(s->k, B * hp->n_head_kv * hp->head_dim_k);
    ALLOC(s->v, B * hp->n_head_kv * hp->head_dim_v);
    ALLOC(s->att, B * hp->n_head * hp->head_dim_v);
    ALLOC(s->hb, B * hp->n_ff);
    ALLOC(s->hb2, B * hp->n_ff);
    ALLOC(s->rope_cs, B * 2 * (size_t)(hp->n_rot > 0 ? hp->n_rot : 1));
    ALLOC(s->mm_scratch, mm + 1);
    ALLOC(s->q_att, (size_t)n_threads * ATTN_TILE_TOKENS * (hp->n_head / hp->n_head_kv) * s->q_att_stride);
    ALLOC(s->v_tmp, (size_t)n_threads * bubo_attend_scratch_floats(ATTN_TILE_TOKENS, hp->n_head / hp->n_head_kv, (int)hp->head_dim_k, (int)hp->head_dim_v));
    if (m->w.token_embd.packed) ALLOC(s->embd_rows, B * bubo_row_size(m->w.token_embd.type, m->w.token_embd.cols));
    if (!hp->causal) ALLOC(s->enc_scores, (size_t)n_threads * B);
#undef ALLOC
    if (!s->x || !s->xb || !s->xb2 || !s->q || !s->k || !s->v || !s->att || !s->hb || !s->hb2 || !s->rope_cs || !s->mm_scratch ||
        !s->q_att || !s->v_tmp || (m->w.token_embd.packed && !s->embd_rows) || (!hp->causal && !s->enc_scores))
        return bubo_set_err(err, BUBO_ERR_NOMEM, "%s: out of memory for the activations", m->path);
    return BUBO_OK;
}

/* ---- prepacked weights ------------------------------------------------------------------------ */
/* Every matrix the forward pass multiplies is packed once where this CPU has prepacked kernels for
 * its type, which saves each matmul its unpacking: the same bits, faster (bubo_matmul_prepacked).
 * token_embd is packed only when it is also the output (tied); its lookups then rebuild the row's
 * blocks first (the level's prepacked_row). The mmap'd pages of the originals are given back. The
 * packed form costs the same memory, but anonymous (not shared with other processes, not evictable
 * without swap). Packed matrices keep the level they were packed for (bubo_prepack_isa: set
 * BUBO_FORCE_ISA before loading). BUBO_NO_PREPACK=1 keeps every matrix in place. */

typedef struct {
    const bubo_mat *w;
    bubo_prepack_fn fn; /* the level's, called directly: the shape is checked once in prepack_mat */
    size_t row_bytes;
    uint8_t *dst;
} prepack_task;

static void prepack_share(void *vt, int ith, int nth) {
    const prepack_task *t = vt;
    const int64_t groups = (t->w->rows + 15) / 16;
    const int64_t r0 = groups * ith / nth * 16, r1e = groups * (ith + 1) / nth * 16;
    const int64_t r1 = r1e < t->w->rows ? r1e : t->w->rows;
    if (r1 > r0)
        t->fn((const uint8_t *)t->w->data + (size_t)r0 * t->row_bytes, t->row_bytes, r1 - r0, (int)t->w->cols,
              t->dst + (size_t)r0 * t->row_bytes);
}

/* A matrix's original pages go back to the file (a private read-only mapping: never lost). */
static void give_back(const void *data, size_t bytes) {
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    const uintptr_t from = ((uintptr_t)data + page - 1) & ~(page - 1);
    const uintptr_t to = ((uintptr_t)data + bytes) & ~(page - 1);
    if (to > from) madvise((void *)from, to - from, MADV_DONTNEED);
}

/* Weights that a decode step streams through: in 2 MiB pages where the kernel gives them for the
 * asking (transparent huge pages in "madvise" mode, the default of many distributions). A stream
 * over 4 KiB pages takes a page walk every 4 KiB, and the hardware prefetchers stop at each page's
 * end: qwen2.5-coder 1.5b decodes 1.1x as fast on an AMD EPYC Zen 5 (42 -> 46 tokens/s at 2
 * threads), the resident memory unchanged. */
#define HUGE_PAGE ((size_t)2 << 20)
static void *huge_alloc(size_t size) {
    if (size < HUGE_PAGE) return aligned_alloc(64, size);
    void *p = NULL;
    if (posix_memalign(&p, HUGE_PAGE, size)) return NULL;
#if defined(MADV_HUGEPAGE)
    /* advice, refused or not: the whole 2 MiB pieces of [p, p + size) come as huge pages, the
     * tail past the last one as 4 KiB pages (no memory beyond size is taken) */
    madvise(p, size, MADV_HUGEPAGE);
#endif
    return p;
}

static bubo_status prepack_mat(bubo_model *m, bubo_mat *w, bubo_err *err) {
    const bubo_isa isa = bubo_prepack_isa(w->type);
    if (!w->data || w->packed || w->cols > INT_MAX || isa == BUBO_ISA_COUNT) return BUBO_OK;
    const bubo_prepack_fn fn = bubo_type_get_traits(w->type)->prepack[isa];
    const size_t size = (bubo_prepacked_size(w->type, w->rows, w->cols) + 63) & ~(size_t)63;
    uint8_t *dst = huge_alloc(size);
    if (!dst) return bubo_set_err(err, BUBO_ERR_NOMEM, "%s: out of memory for the prepacked weights", m->path);
    prepack_task t = {w, fn, bubo_row_size(w->type, w->cols), dst};
    if (bubo_pool_n_threads(m->pool) > 1)
        bubo_pool_run(m->pool, prepack_share, &t);
    else
        prepack_share(&t, 0, 1);
    if (w->owned) { /* a requantized copy: not needed once packed */
        free(w->owned);
        w->owned = NULL;
    } else {
        give_back(w->data, t.row_bytes * (size_t)w->rows);
    }
    w->data = dst;
    w->packed = dst;
    w->packed_isa = isa;
    return BUBO_OK;
}

static bubo_status prepack_weights(bubo_model *m, bubo_err *err) {
    if (bubo_config_get()->no_prepack) return BUBO_OK;
    bubo_status st = BUBO_OK;
    for (int il = 0; il < m->hp.n_layer && !st; il++) {
        bubo_layer_weights *l = &m->w.layers[il];
        bubo_mat *mats[] = {&l->wq, &l->wk, &l->wv, &l->wo, &l->gate, &l->up, &l->down};
        for (size_t i = 0; i < sizeof mats / sizeof mats[0] && !st; i++) st = prepack_mat(m, mats[i], err);
    }
    if (!st && !m->hp.tied_output) st = prepack_mat(m, &m->w.output, err);
    /* a tied output is token_embd: packed too where its rows can be rebuilt for the lookup */
    const bubo_isa embd_isa = bubo_prepack_isa(m->w.token_embd.type);
    if (!st && m->hp.tied_output && embd_isa != BUBO_ISA_COUNT &&
        bubo_type_get_traits(m->w.token_embd.type)->prepacked_row[embd_isa]) {
        st = prepack_mat(m, &m->w.token_embd, err);
        m->w.output = m->w.token_embd;
    }
    return st;
}

static void free_prepacked(bubo_model *m) {
    for (int il = 0; il < BUBO_MAX_LAYERS; il++) {
        bubo_layer_weights *l = &m->w.layers[il];
        bubo_mat *mats[] = {&l->wq, &l->wk, &l->wv, &l->wo, &l->gate, &l->up, &l->down};
        for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++) {
            free(mats[i]->packed);
            free(mats[i]->owned);
        }
    }
    free(m->w.token_embd.packed);
    if (!m->hp.tied_output) { /* tied: the same buffer */
        free(m->w.output.packed);
        free(m->w.output.owned);
    }
}

/* ---- requantized weights (bubo_model_load_as) ------------------------------------------------ */
/* Before packing: a matrix whose rows are narrower in the requant type is dequantized row by row
 * and quantized again into an owned copy, the rows split over the threads; its original pages go
 * back to the file. The copy is the same bits on every CPU (dequantizing is exact, the quantizer
 * is the scalar reference). */

typedef struct {
    const bubo_mat *w;
    bubo_to_float_fn to_float;
    bubo_from_float_fn from_float;
    size_t src_row, dst_row;
    uint8_t *dst;
    int failed; /* a thread could not allocate its row buffer (set atomically) */
} requant_task;

static void requant_share(void *vt, int ith, int nth) {
    requant_task *t = vt;
    const int64_t r0 = t->w->rows * ith / nth, r1 = t->w->rows * (ith + 1) / nth;
    if (r1 <= r0) return;
    float *row = malloc((size_t)t->w->cols * sizeof *row);
    if (!row) {
        __atomic_store_n(&t->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    for (int64_t r = r0; r < r1; r++) {
        t->to_float((const uint8_t *)t->w->data + (size_t)r * t->src_row, row, t->w->cols);
        t->from_float(row, t->dst + (size_t)r * t->dst_row, t->w->cols);
    }
    free(row);
}

static bubo_status requant_mat(bubo_model *m, bubo_mat *w, bubo_type type, bubo_err *err) {
    if (!w->data || w->type == type) return BUBO_OK;
    const bubo_type_traits *to = bubo_type_get_traits(type);
    const size_t src_row = bubo_row_size(w->type, w->cols), dst_row = bubo_row_size(type, w->cols);
    const bubo_to_float_fn to_float = bubo_get_to_float(w->type);
    if (!dst_row || dst_row >= src_row || !to_float || w->cols % bubo_type_get_traits(to->vec_dot_type)->blck_size)
        return BUBO_OK; /* not narrower there, or its rows do not split into the type's blocks */
    uint8_t *dst = aligned_alloc(64, (dst_row * (size_t)w->rows + 63) & ~(size_t)63);
    if (!dst) return bubo_set_err(err, BUBO_ERR_NOMEM, "%s: out of memory for the requantized weights", m->path);
    requant_task t = {w, to_float, to->from_float[BUBO_ISA_SCALAR], src_row, dst_row, dst, 0};
    if (bubo_pool_n_threads(m->pool) > 1)
        bubo_pool_run(m->pool, requant_share, &t);
    else
        requant_share(&t, 0, 1);
    if (t.failed) {
        free(dst);
        return bubo_set_err(err, BUBO_ERR_NOMEM, "%s: out of memory requantizing the weights", m->path);
    }
    give_back(w->data, src_row * (size_t)w->rows);
    w->data = w->owned = dst;
    w->type = type;
    return BUBO_OK;
}

static bubo_status requant_weights(bubo_model *m, bubo_type type, bubo_err *err) {
    bubo_status st = BUBO_OK;
    for (int il = 0; il < m->hp.n_layer && !st; il++) {
        bubo_layer_weights *l = &m->w.layers[il];
        bubo_mat *mats[] = {&l->wq, &l->wk, &l->wv, &l->wo, &l->gate, &l->up, &l->down};
        for (size_t i = 0; i < sizeof mats / sizeof mats[0] && !st; i++) st = requant_mat(m, mats[i], type, err);
    }
    if (!st && !m->hp.tied_output) st = requant_mat(m, &m->w.output, type, err);
    return st;
}

/* ---- load / free ----------------------------------------------------------------------------- */

bubo_status bubo_model_load(const char *path, int n_threads, bubo_model **out, bubo_err *err) {
    return bubo_model_load_as(path, n_threads, BUBO_TYPE_COUNT, out, err);
}

bubo_status bubo_model_load_as(const char *path, int n_threads, int requant, bubo_model **out, bubo_err *err) {
    *out = NULL;
    if (n_threads < 1 || n_threads > BUBO_POOL_MAX_THREADS)
        return bubo_set_err(err, BUBO_ERR_INVALID, "n_threads must be 1..%d, not %d", BUBO_POOL_MAX_THREADS, n_threads);
    if (requant != BUBO_TYPE_COUNT) {
        const bubo_type_traits *t = bubo_type_get_traits(requant);
        if (!t || !t->supported || !t->from_float[BUBO_ISA_SCALAR] || !bubo_get_vec_dot_tile((bubo_type)requant) ||
            t->vec_dot_type == BUBO_TYPE_F32)
            return bubo_set_err(err, BUBO_ERR_INVALID, "weights cannot be requantized to type %s (a block type "
                                "such as q4_0 is needed)", t ? t->name : "?");
    }
    bubo_model *m = calloc(1, sizeof *m);
    if (!m) return bubo_set_err(err, BUBO_ERR_NOMEM, "out of memory");
    m->path = strdup(path);
    bubo_status st = m->path ? BUBO_OK : bubo_set_err(err, BUBO_ERR_NOMEM, "out of memory");
    if (!st) st = bubo_gguf_open(path, &m->gguf, err);
    if (!st && (st = bubo_gguf_check_supported(m->gguf, err))) {
        char inner[BUBO_ERR_MSG_LEN];
        snprintf(inner, sizeof inner, "%s", err ? err->msg : "");
        bubo_set_err(err, st, "%s: %s", path, inner);
    }
    loader L = {m, err};
    if (!st) st = load_hparams(&L, &m->hp);
    if (!st) st = bind_weights(&L, m);
    if (!st) st = bubo_pool_create(n_threads, &m->pool, err);
    if (!st) m->owns_pool = 1;
    if (!st && requant != BUBO_TYPE_COUNT) st = requant_weights(m, (bubo_type)requant, err);
    if (!st) st = prepack_weights(m, err);
    if (!st) st = alloc_state(m, err);
    if (st) {
        bubo_model_free(m);
        return st;
    }
    m->ops = bubo_ops_best();
    *out = m;
    return BUBO_OK;
}

void bubo_model_free(bubo_model *m) {
    if (!m) return;
    if (m->owns_pool) bubo_pool_free(m->pool);
    bubo_model_lora_free(m);
    free_prepacked(m);
    for (int il = 0; il < BUBO_MAX_LAYERS; il++) {
        bubo_layer_weights *l = &m->w.layers[il];
        float *vecs[] = {l->attn_norm, l->bq, l->bk, l->bv, l->q_norm, l->k_norm, l->post_attn_norm, l->ffn_norm, l->post_ffw_norm,
                         l->bo, l->b_up, l->b_down, l->attn_out_norm, l->attn_out_norm_b, l->layer_out_norm, l->layer_out_norm_b};
        for (size_t i = 0; i < sizeof vecs / sizeof vecs[0]; i++) free(vecs[i]);
    }
    free(m->w.output_norm);
    free(m->w.rope_freqs);
    free(m->w.token_types);
    free(m->w.embd_norm);
    free(m->w.embd_norm_b);
    bubo_run_state *s = &m->s;
    void *bufs[] = {s->x, s->xb, s->xb2, s->q, s->k, s->v, s->att, s->hb, s->hb2, s->rope_cs, s->mm_scratch, s->q_att, s->v_tmp,
                    s->embd_rows, s->att_part, s->enc_scores};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    bubo_gguf_close(m->gguf);
    free(m->path);
    free(m);
}

const bubo_hparams *bubo_model_hparams(const bubo_model *m) { return &m->hp; }
int32_t bubo_model_out_vocab(const bubo_model *m) { return m->n_out_vocab > 0 ? m->n_out_vocab : m->hp.n_vocab; }
void bubo_model_set_output_hidden(bubo_model *m, int on) { m->out_hidden = on != 0; }
int32_t bubo_model_out_width(const bubo_model *m) { return m->out_hidden ? m->hp.n_embd : bubo_model_out_vocab(m); }

bubo_status bubo_model_share_pool(bubo_model *m, bubo_model *other, bubo_err *err) {
    if (m == other || m->pool == other->pool) return BUBO_OK;
    if (bubo_pool_capacity(m->pool) != bubo_pool_capacity(other->pool))
        return bubo_set_err(err, BUBO_ERR_INVALID, "share_pool: %d threads against %d", bubo_pool_capacity(m->pool),
                            bubo_pool_capacity(other->pool));
    if (m->owns_pool) bubo_pool_free(m->pool);
    m->pool = other->pool;
    m->owns_pool = 0;
    return BUBO_OK;
}

bubo_status bubo_model_set_out_vocab(bubo_model *m, int32_t n_out_vocab, bubo_err *err) {
    if (n_out_vocab < 0) return bubo_set_err(err, BUBO_ERR_INVALID, "n_out_vocab must be >= 0, not %d", (int)n_out_vocab);
    /* whole groups of 16 rows: a prepacked matrix's first rows are then a prefix of its data */
    int32_t n = (n_out_vocab + 15) / 16 * 16;
    m->n_out_vocab = n == 0 || n >= m->hp.n_vocab ? 0 : n;
    return BUBO_OK;
}
int bubo_model_n_threads(const bubo_model *m) { return m->n_threads_gen ? m->n_threads_gen : bubo_pool_capacity(m->pool); }
int bubo_model_n_threads_batch(const bubo_model *m) {
    return m->n_threads_batch ? m->n_threads_batch : bubo_pool_capacity(m->pool);
}

int bubo_model_active_threads(const bubo_model *m) { return bubo_pool_n_threads(m->pool); }

bubo_status bubo_model_set_threads(bubo_model *m, int n_gen, int n_batch, bubo_err *err) {
    const int cap = bubo_pool_capacity(m->pool);
    if (n_gen < 1 || n_gen > cap || n_batch < 1 || n_batch > cap)
        return bubo_set_err(err, BUBO_ERR_INVALID, "threads %d (decode) and %d (batch): give 1..%d, the threads the "
                            "model was loaded with", n_gen, n_batch, cap);
    m->n_threads_gen = n_gen;
    m->n_threads_batch = n_batch;
    return BUBO_OK;
}

void bubo_model_kv_params(const bubo_model *m, bubo_kv_params *p) {
    memset(p, 0, sizeof *p);
    p->n_layer = m->hp.n_layer;
    p->n_embd_k = (int64_t)m->hp.n_head_kv * m->hp.head_dim_k;
    p->n_embd_v = (int64_t)m->hp.n_head_kv * m->hp.head_dim_v;
    p->head_dim_k = m->hp.head_dim_k;
    p->head_dim_v = m->hp.head_dim_v;
    p->n_ctx = m->hp.n_ctx_train;
    p->n_seq_max = 1;
    p->block_size = 32;
    p->type = p->type_v = BUBO_TYPE_F16;
    /* decode appends at most one chunk per sequence at a time */
    p->n_batch = BUBO_MODEL_MAX_BATCH;
    if (m->hp.sliding_window > 0)
        for (int il = 0; il < m->hp.n_layer; il++) p->is_swa[il] = m->hp.is_swa[il];
    for (int il = 0; il < m->hp.n_layer; il++)
        if (p->is_swa[il]) p->swa_window = (int32_t)m->hp.sliding_window;
}
