# Mirrors csrc/include/bubo/model.h
from libc.stdint cimport int32_t, int64_t, uint8_t

from common cimport bubo_status, bubo_err
from kv cimport bubo_kv, bubo_kv_params

cdef extern from "bubo/model.h" nogil:
    ctypedef enum bubo_arch:
        BUBO_ARCH_LLAMA
        BUBO_ARCH_QWEN2
        BUBO_ARCH_QWEN3
        BUBO_ARCH_GEMMA3
        BUBO_ARCH_BERT

    ctypedef enum bubo_pooling:
        BUBO_POOLING_UNSPECIFIED
        BUBO_POOLING_NONE
        BUBO_POOLING_MEAN
        BUBO_POOLING_CLS
        BUBO_POOLING_LAST

    int BUBO_MAX_LAYERS
    int BUBO_MODEL_MAX_BATCH

    ctypedef struct bubo_hparams:
        bubo_arch arch
        char arch_name[32]
        int n_layer
        int n_embd
        int n_head
        int n_head_kv
        int head_dim_k
        int head_dim_v
        int n_ff
        int n_vocab
        int n_ctx_train
        int n_rot
        int rope_neox
        float rope_freq_base
        float rope_freq_scale
        float rope_freq_base_swa
        float rope_freq_scale_swa
        float norm_eps
        int sliding_window
        uint8_t is_swa[512]
        float embd_scale
        float q_scale
        float kq_scale
        float final_logit_softcap
        int tied_output
        int causal
        int n_token_types
        bubo_pooling pooling

    ctypedef struct bubo_model:
        pass

    bubo_status bubo_model_load(const char *path, int n_threads, bubo_model **out, bubo_err *err)
    bubo_status bubo_model_load_as(const char *path, int n_threads, int requant, bubo_model **out, bubo_err *err)
    void bubo_model_free(bubo_model *m)
    const bubo_hparams *bubo_model_hparams(const bubo_model *m)
    int bubo_model_n_threads(const bubo_model *m)
    int bubo_model_n_threads_batch(const bubo_model *m)
    int bubo_model_active_threads(const bubo_model *m)
    bubo_status bubo_model_set_threads(bubo_model *m, int n_gen, int n_batch, bubo_err *err)
    void bubo_model_kv_params(const bubo_model *m, bubo_kv_params *p)
    bubo_status bubo_model_set_out_vocab(bubo_model *m, int32_t n_out_vocab, bubo_err *err)
    int32_t bubo_model_out_vocab(const bubo_model *m)
    bubo_status bubo_model_share_pool(bubo_model *m, bubo_model *other, bubo_err *err)
    void bubo_model_set_output_hidden(bubo_model *m, int on)
    int32_t bubo_model_out_width(const bubo_model *m)
    bubo_status bubo_model_encode(bubo_model *m, int64_t n_tokens, const int32_t *tokens, int32_t n_seqs,
                                  const int32_t *seq_lens, float *out, bubo_err *err)
    bubo_status bubo_model_decode(bubo_model *m, bubo_kv *kv, int32_t n_tokens, const int32_t *tokens,
                                  const int32_t *pos, const int32_t *seq_ids, const uint8_t *want_logits,
                                  float *logits, bubo_err *err)
    enum: BUBO_MAX_LORA
    bubo_status bubo_model_lora_set(bubo_model *m, int slot, int il, int mat, int32_t r, const float *a,
                                    const float *b, float factor, bubo_err *err)
    void bubo_model_lora_clear(bubo_model *m, int slot)
    bubo_status bubo_model_decode_lora(bubo_model *m, bubo_kv *kv, int32_t n_tokens, const int32_t *tokens,
                                       const int32_t *pos, const int32_t *seq_ids, const uint8_t *want_logits,
                                       const float *lora_scales, float *logits, bubo_err *err)
