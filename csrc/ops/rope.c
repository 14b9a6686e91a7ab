/* Rotary position embedding over x [n_tokens][n_heads][head_dim], in place.
 *
 * Pair i (i < n_rot/2) of each head turns by theta_i = pos * freq_scale * base^(-2i/n_rot) / ff_i:
 *   normal (llama):       (x[2i], x[2i+1])
 *   neox (qwen2, gemma):  (x[i],  x[i + n_rot/2])
 * Dims from n_rot on pass through. The angles follow ggml's CPU rope cache step by step (a running
 * f32 product by base^(-2/n_rot), then freq_scale * theta / ff, then cosf/sinf), so bubo turns
 * by exactly llama.cpp's angles. They are computed once per token and chunk of pairs, by the same
 * scalar code for every level, and reused across heads (a caller may compute them once for many
 * calls: bubo_rope_angles, p->angles); only the rotation is vectorized. */
#include "ops_internal.h"

#define ROPE_CHUNK 64 /* pairs whose cos/sin sit on the stack at once */

/* Rotate pairs [i0, i0 + len) of one head by the angles c[k], s[k] of pair i0 + k. */
typedef void (*rope_rotate_fn)(float *head, const float *c, const float *s, int i0, int len, int n_pairs,
                               bubo_rope_mode mode);

static inline void rotate_pair(float *a, float *b, float c, float s) {
    const float x0 = *a, x1 = *b;
    *a = x0 * c - x1 * s;
    *b = x0 * s + x1 * c;
}

static void rotate_scalar(float *head, const float *c, const float *s, int i0, int len, int n_pairs,
                          bubo_rope_mode mode) {
    for (int k = 0; k < len; k++) {
        const int i = i0 + k;
        if (mode == BUBO_ROPE_NEOX)
            rotate_pair(&head[i], &head[i + n_pairs], c[k], s[k]);
        else
            rotate_pair(&head[2 * i], &head[2 * i + 1], c[k], s[k]);
    }
}

/* The angles of pairs [i0, i0 + len) of token pos, theta running on from pair i0's (*theta). */
static inline void rope_chunk_angles(const bubo_rope_params *p, float theta_scale, float *theta, int i0, int len,
                                     float *c, float *s) {
    for (int k = 0; k < len; k++) {
        const float ff = p->freq_factors ? p->freq_factors[i0 + k] : 1.0f;
        const float angle = p->freq_scale * (*theta / ff);
        c[k] = cosf(angle);
        s[k] = sinf(angle);
        *theta *= theta_scale;
    }
}

void bubo_rope_angles(int32_t pos, const bubo_rope_params *p, float *cs) {
    const int n_pairs = p->n_rot / 2;
    float theta = (float)pos;
    rope_chunk_angles(p, powf(p->freq_base, -2.0f / (float)p->n_rot), &theta, 0, n_pairs, cs, cs + n_pairs);
}

static inline void rope_driver(rope_rotate_fn rotate, float *x, int64_t n_tokens, int n_heads, int head_dim,
                               const int32_t *pos, const bubo_rope_params *p) {
    const int n_pairs = p->n_rot / 2;
    const float theta_scale = powf(p->freq_base, -2.0f / (float)p->n_rot);
    float c[ROPE_CHUNK], s[ROPE_CHUNK];
    if (p->angles && n_tokens == 1) { /* computed by the caller (bubo_rope_angles) */
        for (int i0 = 0; i0 < n_pairs; i0 += ROPE_CHUNK) {
            const int len = n_pairs - i0 < ROPE_CHUNK ? n_pairs - i0 : ROPE_CHUNK;
            for (int h = 0; h < n_heads; h++)
                rotate(x + (int64_t)h * head_dim, p->angles + i0, p->angles + n_pairs + i0, i0, len, n_pairs, p->mode);
        }
        return;
    }
    for (int64_t t = 0; t < n_tokens; t++) {
        float *xt = x + t * (int64_t)n_heads * head_dim;
        float theta = (float)pos[t];
        for (int i0 = 0; i0 < n_pairs; i0 += ROPE_CHUNK) {
            const int len = n_pairs - i0 < ROPE_CHUNK ? n_pairs - i0 : ROPE_CHUNK;
            rope_chunk_angles(p, theta_scale, &theta, i0, len, c, s);
            for (int h = 0; h < n_heads; h++) rotate(xt + (int64_t)h * head_dim, c, s, i0, len, n_pairs, p->mode);
        }
    }
}

static void rope_scalar(float *x, int64_t n_tokens, int n_heads, int head_dim, const int32_t *pos,
                        const bubo_rope_params *p) {
    rope_driver(rotate_scalar, x, n_tokens, n_heads, head_dim, pos, p);
}

/* Normal mode in registers: with cc = (c0 c0 c1 c1 ..) and ss = (-s0 s0 -s1 s1 ..),
 * y = x * cc + swap_pairs(x) * ss. */
#if defined(BUBO_X86)

BUBO_TARGET_AVX2 static void rotate_avx2(float *head, const float *c, const float *s, int i0, int len, int n_pairs,
                                         bubo_rope_mode mode) {
    int k = 0;
    if (mode == BUBO_ROPE_NEOX) {
        float *lo = head + i0, *hi = head + i0 + n_pairs;
        for (; k + 8 <= len; k += 8) {
            __m256 vc = _mm256_loadu_ps(c + k), vs = _mm256_loadu_ps(s + k);
            __m256 x0 = _mm256_loadu_ps(lo + k), x1 = _mm256_loadu_ps(hi + k);
            _mm256_storeu_ps(lo + k, _mm256_fmsub_ps(x0, vc, _mm256_mul_ps(x1, vs)));
            _mm256_storeu_ps(hi + k, _mm256_fmadd_ps(x0, vs, _mm256_mul_ps(x1, vc)));
        }
    } else {
        const __m256 sign = _mm256_setr_ps(-1, 1, -1, 1, -1, 1, -1, 1);
        float *xp = head + 2 * i0;
        for (; k + 4 <= len; k += 4) {
            __m128 c4 = _mm_loadu_ps(c + k), s4 = _mm_loadu_ps(s + k);
            __m256 cc = _mm256_set_m128(_mm_unpackhi_ps(c4, c4), _mm_unpacklo_ps(c4, c4));
            __m256 ss = _mm256_mul_ps(_mm256_set_m128(_mm_unpackhi_ps(s4, s4), _mm_unpacklo_ps(s4, s4)), sign);
            __m256 v = _mm256_loadu_ps(xp + 2 * k);
            _mm256_storeu_ps(xp + 2 * k, _mm256_fmadd_ps(v, cc, _mm256_mul_ps(_mm256_permute_ps(v, 0xB1), ss)));
        }
    }
    rotate_scalar(head, c + k, s + k, i0 + k, len - k, n_pairs, mode);
}

static void rope_avx2(float *x, int64_t n_tokens, int n_heads, int head_dim, const int32_t *pos,
                      const bubo_rope_params *p) {
    rope_driver(rotate_avx2, x, n_tokens, n_heads, head_dim, pos, p);
}

BUBO_TARGET_AVX512 static void rotate_avx512(float *head, const float *c, const float *s, int i0, int len, int n_pairs,
                                             bubo_rope_mode mode) {
    int k = 0;
    if (mode == BUBO_ROPE_NEOX) {
        float *lo = head + i0, *hi = head + i0 + n_pairs;
        for (; k + 16 <= len; k += 16) {
            __m512 vc = _mm512_loadu_ps(c + k), vs = _mm512_loadu_ps(s + k);
            __m512 x0 = _mm512_loadu_ps(lo + k), x1 = _mm512_loadu_ps(hi + k);
            _mm512_storeu_ps(lo + k, _mm512_fmsub_ps(x0, vc, _mm512_mul_ps(x1, vs)));
            _mm512_storeu_ps(hi + k, _mm512_fmadd_ps(x0, vs, _mm512_mul_ps(x1, vc)));
        }
    } else {
        const __m512i dup = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
        const __m512 sign = _mm512_setr_ps(-1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1);
        float *xp = head + 2 * i0;
        for (; k + 8 <= len; k += 8) {
            __m512 cc = _mm512_permutexvar_ps(dup, _mm512_castps256_ps512(_mm256_loadu_ps(c + k)));
            __m512 ss = _mm512_mul_ps(_mm512_permutexvar_ps(dup, _mm512_castps256_ps512(_mm256_loadu_ps(s + k))), sign);
            __m512 v = _mm512_loadu_ps(xp + 2 * k);
            _mm512_storeu_ps(xp + 2 * k, _mm512_fmadd_ps(v, cc, _mm512_mul_ps(_mm512_permute_ps(v, 0xB1), ss)));
        }
    }
    rotate_scalar(head, c + k, s + k, i0 + k, len - k, n_pairs, mode);
}

static void rope_avx512(float *x, int64_t n_tokens, int n_heads, int head_dim, const int32_t *pos,
                        const bubo_rope_params *p) {
    rope_driver(rotate_avx512, x, n_tokens, n_heads, head_dim, pos, p);
}

#endif

#if defined(BUBO_ARM64)

static void rotate_neon(float *head, const float *c, const float *s, int i0, int len, int n_pairs,
                        bubo_rope_mode mode) {
    int k = 0;
    if (mode == BUBO_ROPE_NEOX) {
        float *lo = head + i0, *hi = head + i0 + n_pairs;
        for (; k + 4 <= len; k += 4) {
            float32x4_t vc = vld1q_f32(c + k), vs = vld1q_f32(s + k);
            float32x4_t x0 = vld1q_f32(lo + k), x1 = vld1q_f32(hi + k);
            vst1q_f32(lo + k, vfmsq_f32(vmulq_f32(x0, vc), x1, vs));
            vst1q_f32(hi + k, vfmaq_f32(vmulq_f32(x1, vc), x0, vs));
        }
    } else {
        const float sign_v[4] = {-1, 1, -1, 1};
        const float32x4_t sign = vld1q_f32(sign_v);
        float *xp = head + 2 * i0;
        for (; k + 2 <= len; k += 2) {
            float32x2_t c2 = vld1_f32(c + k), s2 = vld1_f32(s + k);
            float32x4_t cc = vzip1q_f32(vcombine_f32(c2, c2), vcombine_f32(c2, c2));
            float32x4_t ss = vmulq_f32(vzip1q_f32(vcombine_f32(s2, s2), vcombine_f32(s2, s2)), sign);
            float32x4_t v = vld1q_f32(xp + 2 * k);
            vst1q_f32(xp + 2 * k, vfmaq_f32(vmulq_f32(vrev64q_f32(v), ss), v, cc));
        }
    }
    rotate_scalar(head, c + k, s + k, i0 + k, len - k, n_pairs, mode);
}

static void rope_neon(float *x, int64_t n_tokens, int n_heads, int head_dim, const int32_t *pos,
                      const bubo_rope_params *p) {
    rope_driver(rotate_neon, x, n_tokens, n_heads, head_dim, pos, p);
}

#endif

void bubo_register_rope(bubo_ops *tables) {
    tables[BUBO_ISA_SCALAR].rope = rope_scalar;
#if defined(BUBO_X86)
    tables[BUBO_ISA_AVX2].rope = rope_avx2;
    tables[BUBO_ISA_AVX512].rope = rope_avx512;
#endif
#if defined(BUBO_ARM64)
    tables[BUBO_ISA_NEON].rope = rope_neon;
#endif
}
