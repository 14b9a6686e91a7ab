/* The model's structs, shared by load.c (hyperparameters, weight binding, buffers) and
 * forward.c (the forward pass). Shapes are written (rows, cols) for y = W x: rows outputs. */
#ifndef BUBO_MODEL_INTERNAL_H
#define BUBO_MODEL_INTERNAL_H

#include "bubo/gguf.h"
#include "bubo/model.h"
#include "bubo/ops.h"
#include "bubo/threadpool.h"

/* Most tokens one attention call takes: their K/V rows are read once for all of them. */
#define ATTN_TILE_TOKENS 16

/* A weight matrix: rows of `cols` elements of `type`, in place in the mmap, or prepacked at load
 * (bubo_matmul_prepack) where this CPU has prepacked kernels for the type: then `packed` owns the
 * packed form, data points at it, and packed_isa is the level it was packed for. A matrix
 * requantized at load (bubo_model_load_as) and not packed: `owned` holds its rows. */
typedef struct {
    bubo_type type;
    const void *data;
    int64_t rows, cols;
    void *packed;
    bubo_isa packed_isa;
    void *owned;
} bubo_mat;

/* ---- weights --------------------------------------------------------------------------------- */
/* Vectors (norms, biases) are widened to f32 copies at load; matrices stay in the mmap unless
 * prepacked (see bubo_mat). */

typedef struct {
    float *attn_norm;      /* [n_embd] */
    bubo_mat wq;           /* (n_head * head_dim_k, n_embd) */
    bubo_mat wk;           /* (n_head_kv * head_dim_k, n_embd) */
    bubo_mat wv;           /* (n_head_kv * head_dim_v, n_embd) */
    bubo_mat wo;           /* (n_embd, n_head * head_dim_v) */
    float *bq, *bk, *bv;   /* [rows of wq / wk / wv] biases (qwen2), or NULL */
    float *q_norm;         /* [head_dim_k] per-head RMSNorm of q (qwen3, gemma3), or NULL */
    float *k_norm;         /* [head_dim_k] same for k, or NULL */
    float *post_attn_norm; /* [n_embd] RMSNorm of the attention output (gemma3), or NULL */
    float *ffn_norm;       /* [n_embd] */
    bubo_mat gate;         /* (n_ff, n_embd) */
    bubo_mat up;           /* (n_ff, n_embd) */
    bubo_mat down;         /* (n_embd, n_ff) */
    float *post_ffw_norm;  /* [n_embd] RMSNorm of the FFN output (gemma3), or NULL */
    /* bert: output biases and the post-LayerNorms (weight, bias) after attention and after the FFN */
    float *bo, *b_up, *b_down;
    float *attn_out_norm, *attn_out_norm_b;
    float *layer_out_norm, *layer_out_norm_b;
} bubo_layer_weights;

typedef struct {
    bubo_mat token_embd;   /* (n_vocab, n_embd): rows are looked up (and multiplied when tied) */
    float *output_norm;    /* [n_embd] */
    bubo_mat output;       /* (n_vocab, n_embd); token_embd when tied */
    float *rope_freqs;     /* [n_rot / 2] frequency divisors (llama3), or NULL */
    bubo_mat pos_embd;     /* (n_ctx_train, n_embd) learned positions (bert): rows are looked up */
    float *token_types;    /* [n_token_types][n_embd] (bert) */
    float *embd_norm, *embd_norm_b; /* [n_embd] LayerNorm of the summed embeddings (bert) */
    bubo_layer_weights layers[BUBO_MAX_LAYERS];
} bubo_weights;

/* ---- run state: activations of one chunk of at most B = BUBO_MODEL_MAX_BATCH tokens ---------- */

typedef struct {
    float *x;             /* (B, n_embd) the residual stream */
    float *xb;            /* (B, n_embd) a sublayer's normed input; at the end, the normed output rows */
    float *q;             /* (B, n_head * head_dim_k) */
    float *k;             /* (B, n_head_kv * head_dim_k) */
    float *v;             /* (B, n_head_kv * head_dim_v) */
    float *att;           /* (B, n_head * head_dim_v) attention output, heads concatenated */
    float *xb2;           /* (B, n_embd) a sublayer's output before the residual add */
    float *hb;            /* (B, n_ff) gate, then the activated product */
    float *hb2;           /* (B, n_ff) up */
    float *rope_cs;       /* (B, 2, n_rot) each token's rope angles (bubo_rope_angles): the global layers', the sliding-window layers' (if any) */
    uint8_t *mm_scratch;  /* activations quantized by bubo_matmul: the largest of any weight's need */
    size_t mm_scratch_size;
    uint8_t *q_att;       /* (n_threads, ATTN_TILE_TOKENS, group, q_att_stride) the query heads of one KV head in the cache's vec_dot_type */
    size_t q_att_stride;
    float *v_tmp;         /* (n_threads, bubo_attend_scratch_floats(ATTN_TILE_TOKENS, group, head_dim_k, head_dim_v)) attention scratch */
    uint8_t *embd_rows;   /* (B, token_embd row bytes) rows rebuilt from a prepacked token_embd, or NULL */
    float *att_part;      /* (tokens, n_head, chunks, head_dim_v + 2) attention partials of a decode step at depth, grown as needed */
    size_t att_part_floats;
    float *enc_scores;    /* (n_threads, BUBO_MODEL_MAX_BATCH) an encoder's attention scores of one query row */
} bubo_run_state;

/* An adapter's pair for one matrix (bubo_model_lora_set): A [r][cols] and B transposed, [r][rows], f32. */
typedef struct {
    int32_t r;
    float *a, *b;
    float factor; /* alpha / r */
} bubo_lora_pair;

/* The adapters' pairs, and the scratch their products share (allocated with the first pair). */
typedef struct {
    bubo_lora_pair *pairs[BUBO_MAX_LORA]; /* [n_layer * BUBO_LORA_N_MATS] each, r 0 where it has none; NULL: empty */
    float *t;      /* (B, r_max) each row's A x */
    float *u;      /* (B, widest rows) each row's term f * t[j] * B[:, j] */
    int32_t r_max; /* the rank t has room for */
} bubo_lora_state;

struct bubo_model {
    char *path;
    bubo_gguf *gguf;
    bubo_hparams hp;
    bubo_weights w;
    bubo_run_state s;
    bubo_pool *pool;
    const bubo_ops *ops;
    int32_t n_out_vocab; /* logits for tokens [0, n_out_vocab) (bubo_model_set_out_vocab) */
    int owns_pool;       /* 0 once it runs on another model's pool (bubo_model_share_pool) */
    int out_hidden;      /* decode writes normed hidden states, not logits (bubo_model_set_output_hidden) */
    int n_threads_gen;   /* threads of a one-token decode step, and of a batch (bubo_model_set_threads) */
    int n_threads_batch;
    bubo_lora_state lora;
    const float *lora_scales; /* the decode call's [n_tokens][BUBO_MAX_LORA], at its chunk's first row; NULL: none */
};

/* y [n][rows] += each row's adapters' products for layer il's matrix mat, x [n][cols] its input
 * (lora.c); nothing without adapters */
bubo_status bubo_model_lora_apply(bubo_model *m, int il, int mat, const float *x, int32_t n, float *y, bubo_err *err);
void bubo_model_lora_free(bubo_model *m);

/* ---- shared by forward.c (decoders) and encoder.c ------------------------------------------- */

/* y [n][w->rows] = W x for the n rows of x [n][w->cols], on the model's pool */
bubo_status bubo_model_matmul(bubo_model *m, const bubo_mat *w, const float *x, int32_t n, float *y, bubo_err *err);
/* several matrices that multiply the same x, x quantized once where they allow it */
bubo_status bubo_model_matmul_shared(bubo_model *m, int n_mats, const bubo_mat *const *w, const float *x, int32_t n,
                                     float *const *y, bubo_err *err);
/* fn(ctx, t) for t in [0, n), split over the pool (on the calling thread when n == 1) */
void bubo_model_run_rows(bubo_model *m, int32_t n, void *ctx, void (*fn)(const void *ctx, int32_t t));

#endif
