/* A decoder-only transformer loaded from GGUF: hyperparameters from the metadata, weights bound
 * in place in the mmap by llama.cpp's tensor names, and the forward pass over a batch.
 *
 * Families: llama (SmolLM2, Llama 2/3, Mistral), qwen2 (QKV bias), qwen3 (QK-norm), gemma3
 * (scaled embedding, QK-norm, post-attention and post-FFN norms, GELU, sliding-window layers with
 * their own RoPE base). Norm weights are used as stored: the GGUF converter already folded
 * gemma's (1 + w) into them.
 *
 * And one encoder family, bert (BERT, MiniLM, sentence-transformers' models): learned absolute
 * positions and token types, post-LayerNorm blocks with biases, GELU, attention both ways within
 * each sequence and no KV cache: bubo_model_encode gives every token's last hidden state. */
#ifndef BUBO_MODEL_H
#define BUBO_MODEL_H

#include <stdint.h>

#include "bubo/common.h"
#include "bubo/kv.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    BUBO_ARCH_LLAMA = 0,
    BUBO_ARCH_QWEN2 = 1,
    BUBO_ARCH_QWEN3 = 2,
    BUBO_ARCH_GEMMA3 = 3,
    BUBO_ARCH_BERT = 4,
} bubo_arch;

/* How a sequence's rows become one embedding (llama.cpp's llama_pooling_type values). */
typedef enum {
    BUBO_POOLING_UNSPECIFIED = -1,
    BUBO_POOLING_NONE = 0,
    BUBO_POOLING_MEAN = 1,
    BUBO_POOLING_CLS = 2,
    BUBO_POOLING_LAST = 3,
} bubo_pooling;

#define BUBO_MAX_LAYERS 512

typedef struct {
    bubo_arch arch;
    char arch_name[32];
    int n_layer;
    int n_embd;
    int n_head, n_head_kv;
    int head_dim_k, head_dim_v;
    int n_ff;
    int n_vocab;              /* rows of token_embd */
    int n_ctx_train;
    int n_rot;                /* rotated dims per head */
    int rope_neox;            /* 1: rotate (x[i], x[i + n_rot/2]); 0: adjacent pairs */
    float rope_freq_base, rope_freq_scale;         /* global layers */
    float rope_freq_base_swa, rope_freq_scale_swa; /* sliding-window layers */
    float norm_eps;
    int sliding_window;       /* 0: none */
    uint8_t is_swa[BUBO_MAX_LAYERS];
    float embd_scale;         /* token embeddings are multiplied by it (gemma: sqrt(n_embd)) */
    float q_scale;            /* queries multiplied by it before the cache's dot product */
    float kq_scale;           /* scores multiplied by it after */
    float final_logit_softcap; /* 0: none; else logits = c * tanh(logits / c) */
    int tied_output;          /* output weights are token_embd */
    int causal;               /* 1: a decoder (bubo_model_decode); 0: an encoder (bubo_model_encode) */
    int n_token_types;        /* rows of token_types (encoders), else 0 */
    bubo_pooling pooling;     /* the file's {arch}.pooling_type, or BUBO_POOLING_UNSPECIFIED */
} bubo_hparams;

typedef struct bubo_model bubo_model;

/* Tokens per forward step: larger batches are split into chunks of at most this many. */
#define BUBO_MODEL_MAX_BATCH 512

/* n_threads >= 1: the model's own thread pool. Errors name the file and the tensor or key. */
bubo_status bubo_model_load(const char *path, int n_threads, bubo_model **out, bubo_err *err);
/* As bubo_model_load, and every matrix of the layers (and an untied output) whose rows take more
 * bytes in its own type than in `requant` is rewritten in `requant` at load: dequantized, then
 * quantized by the type's reference quantizer. For a draft model, whose weights only guess what
 * the target checks: fewer bytes read per pass, no answer changed. token_embd keeps its type.
 * requant: a block type with a quantizer and a dot product (q4_0 ...), or BUBO_TYPE_COUNT: none. */
bubo_status bubo_model_load_as(const char *path, int n_threads, int requant, bubo_model **out, bubo_err *err);
void bubo_model_free(bubo_model *m);
const bubo_hparams *bubo_model_hparams(const bubo_model *m);
/* The threads of a one-token decode step (llama.cpp's -t). */
int bubo_model_n_threads(const bubo_model *m);
/* The threads of a decode step of several tokens, prompts included, and of an encode (-tb). */
int bubo_model_n_threads_batch(const bubo_model *m);
/* Decode steps of one token use n_gen threads, larger ones n_batch (llama.cpp's -t and -tb), both
 * within the thread count the model was loaded with (its pool's); by default both are that count.
 * BUBO_ERR_INVALID outside 1..that count. */
bubo_status bubo_model_set_threads(bubo_model *m, int n_gen, int n_batch, bubo_err *err);
/* The threads the model's pool runs on now: those of its last step (or its pool's whole count). */
int bubo_model_active_threads(const bubo_model *m);

/* Logits for the first n_out_vocab tokens only (0: every token): the output product reads only
 * their rows of the output matrix, and decode writes [n_out][n_out_vocab]. For a draft model,
 * whose guesses need not cover the rare tokens at the end of a BPE vocabulary: the output matrix
 * is a large share of a small model's weights. n_out_vocab is rounded up to a multiple of 16
 * (capped at n_vocab); BUBO_ERR_INVALID for a negative one. */
bubo_status bubo_model_set_out_vocab(bubo_model *m, int32_t n_out_vocab, bubo_err *err);

/* m runs its work on other's thread pool from now on (its own is freed): two models that never
 * decode at the same time, a draft model and its target, then share one set of workers, kept warm
 * between them, instead of two pools whose idle workers contend for the same cores. other must
 * outlive m. BUBO_ERR_INVALID unless both have the same thread count. */
bubo_status bubo_model_share_pool(bubo_model *m, bubo_model *other, bubo_err *err);
int32_t bubo_model_out_vocab(const bubo_model *m);

/* The cache shape this model needs (layers, row widths, head dims); the caller sets n_ctx,
 * n_seq_max, block_size and type. */
void bubo_model_kv_params(const bubo_model *m, bubo_kv_params *p);

/* Run n_tokens tokens through the model and the cache.
 *   tokens, pos, seq_ids [n_tokens]; want_logits [n_tokens] nonzero where a row's logits are
 *   wanted; logits [n_out][n_vocab] for the n_out wanted rows in batch order (n_vocab: the
 *   model's, or what bubo_model_set_out_vocab set).
 * A sequence's tokens must continue it: its first token in the batch at pos == its length in the
 * cache, each next one at pos + 1. Everything is checked before anything runs: a bad token id,
 * sequence id or position, or a full context is BUBO_ERR_INVALID and leaves the cache as it was.
 * Not thread-safe for one model (its scratch buffers are shared). */
bubo_status bubo_model_decode(bubo_model *m, bubo_kv *kv, int32_t n_tokens, const int32_t *tokens, const int32_t *pos,
                              const int32_t *seq_ids, const uint8_t *want_logits, float *logits, bubo_err *err);

/* ---- LoRA adapters ----------------------------------------------------------------------------
 * Up to BUBO_MAX_LORA adapters sit beside the weights, which are never rewritten: for a layer's
 * matrix W (q, k, v, o, gate, up, down), an adapter's pair A [r][cols] and B [rows][r] adds
 * scale * factor * B (A x) to W x, where factor is the pair's alpha / r and scale the batch row's
 * own (bubo_model_decode_lora): rows with different adapters and scales share one batch, and a
 * row's result does not depend on the others. A scale of 0 skips the pair (the row's bits are the
 * base model's). The products run on the pool as f32 matrix products, after the base one. */
#define BUBO_MAX_LORA 8
typedef enum {
    BUBO_LORA_Q, BUBO_LORA_K, BUBO_LORA_V, BUBO_LORA_O, BUBO_LORA_GATE, BUBO_LORA_UP, BUBO_LORA_DOWN, BUBO_LORA_N_MATS
} bubo_lora_mat;

/* Adapter slot's pair for layer il's matrix mat: a [r][cols], b [rows][r], copied (rows and cols
 * the matrix's). BUBO_ERR_INVALID for a slot, layer, matrix or rank out of range (r from 1 to
 * 4096), a matrix the model lacks; BUBO_ERR_NOMEM. Not while the model decodes. */
bubo_status bubo_model_lora_set(bubo_model *m, int slot, int il, int mat, int32_t r, const float *a, const float *b,
                                float factor, bubo_err *err);
/* Forget adapter slot's pairs (nothing for an empty slot). */
void bubo_model_lora_clear(bubo_model *m, int slot);

/* bubo_model_decode with adapters: lora_scales [n_tokens][BUBO_MAX_LORA], each row's scale of each
 * slot (NULL: none, as bubo_model_decode). A nonzero scale of an empty slot is BUBO_ERR_INVALID. */
bubo_status bubo_model_decode_lora(bubo_model *m, bubo_kv *kv, int32_t n_tokens, const int32_t *tokens,
                                   const int32_t *pos, const int32_t *seq_ids, const uint8_t *want_logits,
                                   const float *lora_scales, float *logits, bubo_err *err);

/* Decode writes each wanted row's final normed hidden state ([n_out][n_embd], what the output
 * matrix would multiply) instead of its logits while on: the embeddings of a decoder. */
void bubo_model_set_output_hidden(bubo_model *m, int on);
/* The width of one output row of decode: n_embd with hidden output on, else the logits' vocab. */
int32_t bubo_model_out_width(const bubo_model *m);

/* Run an encoder over n_seqs sequences laid end to end in tokens [n_tokens] (sequence i has
 * seq_lens[i] tokens, positions 0.., token type 0), each attending to all of its own tokens and to
 * no other sequence's; out [n_tokens][n_embd] gets every token's last hidden state. Sequences are
 * packed into forward passes of at most BUBO_MODEL_MAX_BATCH tokens, never split. Everything is
 * checked before anything runs: a sequence of fewer than 1 or more than n_ctx_train (or
 * BUBO_MODEL_MAX_BATCH) tokens, lengths that do not sum to n_tokens, a bad token id, or a decoder
 * model is BUBO_ERR_INVALID. Not thread-safe for one model. */
bubo_status bubo_model_encode(bubo_model *m, int64_t n_tokens, const int32_t *tokens, int32_t n_seqs,
                              const int32_t *seq_lens, float *out, bubo_err *err);

#ifdef __cplusplus
}
#endif
#endif
