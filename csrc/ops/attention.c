/* Attention of a tile of tokens of one sequence, each with the query heads that share one KV head,
 * over that sequence of the paged KV cache.
 *
 * The blocks are read where they lie (no gather into a contiguous K/V copy). Softmax is online
 * (Milakov & Gimelshein 2018; as llama.cpp's CPU flash attention does it): a running maximum m,
 * denominator l and weighted sum of V, rescaled by exp(m_old - m_new) when the maximum rises.
 *
 * Batch invariance. The positions are taken in groups of BUBO_ATTEND_GROUP aligned to absolute
 * positions (group g holds g*16 .. g*16+15; the window start kv_begin and the end kv_end may cut
 * the first and last group). A group's scores go through one vectorised exp, one max and one sum
 * in a fixed lane order (lane = position % 16), then one merge into (m, l, out). So the result of
 * a (token, head) is a function of its query, its positions and their K/V rows only: never of the
 * block size, the blocks a sequence holds, the batch, or which other tokens and heads share the
 * call (each runs exactly the same operations; sharing only saves reading and widening the rows). That
 * matters more than it seems: these quantized models amplify a last-bit difference in layer 0
 * into logit changes of ~1 (measured on smollm2:135m) through the int8 activation blocks.
 *
 * Chunks. The positions are also cut into chunks of BUBO_ATTEND_CHUNK, aligned the same way: each
 * chunk's softmax runs from a fresh state (its own max, sum and weighted V sum: a "partial"), and
 * a token's partials are merged in ascending chunk order (bubo_attend_merge), then normalized. A
 * decode step at depth computes the chunks of one token on different threads and merges them
 * after (model/forward.c); a prompt runs them one after the other here: the same operations in the
 * same order, so the same bits. Within one chunk (contexts up to BUBO_ATTEND_CHUNK) nothing is merged.
 *
 * Scores. A group's K rows are prepared once for every token and head that meets them (an f16 or
 * f32 row widened; a q8_0 row's quants copied and its block scales laid out position by position),
 * and the level's scores kernel gives each query head the group's 16 scores at once: per position
 * a 16-lane vector of partial sums, then the 16 vectors reduced together, position p's lanes into
 * lane p (a transpose as it adds: no horizontal sum per score). The lanes and the order of the
 * adds are those of one scalar formula per position, so every level gives the same bits:
 *   widened rows: lane l sums the products of elements l, l + 16, l + 32, l + 48 of each 64 as the
 *   AVX-512 f16 x f32 vec_dot of ggml does, then the lanes in sum16_tree's order;
 *   q8_0 rows against q8_0 queries: each 32-element block's products summed exactly as integers
 *   (the transpose adds integers, so its order does not matter), times (K scale x query scale) of
 *   the block (exact: two f16 values), the blocks added in order with fused multiply-adds.
 * A q4_0 K row (or a head size the kernels do not take) goes through the kernel table's vec_dot,
 * one score at a time. V rows (their own storage type, view->type_v) are widened once per group by
 * that type's to_float.
 * The group step (exp, max, sum, rescale, the weighted sum of V) has a scalar, AVX2, AVX-512 and
 * NEON variant; all sum the 16 lanes in the same tree order (i + 8, then + 4, + 2, + 1) and
 * accumulate V and merge the sums with fused multiply-adds (written out: gnu11 lets the compiler
 * contract a * b + c in the FMA-enabled levels only), so they differ at most where exp rounds
 * subnormals. At AVX-512 a call of many rows (a prompt's tile) runs the group step in phases: the
 * scores of every token, then the softmax of 16 rows at a time (rows in the lanes for the max and
 * the sum, the same operations per row), then the V sums; a decode step runs it per token. */
#include <math.h>

#include "ops_internal.h"
#include "quants/reduce16.h"

#define G BUBO_ATTEND_GROUP
/* the kernels hold a group's positions in the 16 lanes of one register (an AVX-512 vector, two
 * AVX2 ones, four NEON ones), reduced in sum16_tree's order, and chunks are whole groups */
_Static_assert(G == 16, "the attention kernels assume groups of 16 positions");
_Static_assert(BUBO_ATTEND_CHUNK % G == 0, "a chunk is a whole number of groups");
/* rows (tokens x heads) of a call from which a level with a two-half group step runs it in phases */
#define ATTEND_ROWS_SPLIT 8
/* how many groups ahead attend_range asks for a group's rows (1, 2 and 4 measured within noise of
 * each other for a decode step at depth 4096) */
#define ATTEND_PREFETCH 2

/* One group's merge, for the n_q heads of one token. scores [n_q][G] (lanes lo .. hi-1 valid),
 * vrows [G][hdv] (the same lanes), m, l [n_q] running max and sum, out [n_q] rows of hdv at out_stride. */
typedef struct {
    int n_q, hdv, lo, hi;
    float *scores; /* the AVX-512 step overwrites each head's scores with its weights */
    const float *vrows;
    float *m, *l, *p; /* p [G]: scratch for one head's weights */
    float *out;
    size_t out_stride;
} attend_group;

/* A group's K rows, prepared once for all the tokens and heads that meet them (see attend_range):
 * widened rows kf [G][hdk], or a q8_0 row's quants kq [G][hdk] and its block scales kw
 * [hdk / 32][G] (a block's scales of the 16 positions side by side). Lanes past the group's
 * positions hold rows of no meaning (finite) whose scores are never read. */
typedef struct {
    int hdk;
    const float *kf;
    const int8_t *kq;
    const float *kw;
} attend_keys;

/* The 16 scores of a group for each of n_q query heads (rows q_stride bytes apart), times kq_scale:
 * s [n_q][G]. */
typedef void (*scores_fn)(const attend_keys *k, const uint8_t *q, size_t q_stride, int n_q, float kq_scale, float *s);

/* A q8_0 query head's block scales, widened. */
static inline float q8_scale(const uint8_t *q, int block) {
    bubo_f16 d;
    memcpy(&d, q + (size_t)block * sizeof(block_q8_0), sizeof d);
    return bubo_f16_to_f32(d);
}

#if defined(BUBO_X86)
/* The same, converted by F16C in place (the scalar conversion's bits; no call, which at the vector
 * levels would also spill every live vector register around it). */
BUBO_TARGET_AVX2 static inline float q8_scale_f16c(const uint8_t *q, int block) {
    bubo_f16 d;
    memcpy(&d, q + (size_t)block * sizeof(block_q8_0), sizeof d);
    return _cvtsh_ss(d);
}
#endif

static inline const int8_t *q8_quants(const uint8_t *q, int block) {
    return (const int8_t *)(q + (size_t)block * sizeof(block_q8_0) + sizeof(bubo_f16));
}

/* Running max of head h raised to m_new: the rescale factor of its old sum, or 1 for none.
 * A first group (m = -inf) has nothing to rescale. */
static inline float group_rescale(const attend_group *g, int h, float m_new) {
    const float m = g->m[h];
    g->m[h] = m_new;
    return m_new > m && m != -INFINITY ? vm_exp_lanewise(m - m_new) : 1.0f;
}

/* ---- scalar ----------------------------------------------------------------------------------- */

static float sum16_tree(const float *p) {
    float a[8];
    for (int i = 0; i < 8; i++) a[i] = p[i] + p[i + 8];
    for (int i = 0; i < 4; i++) a[i] += a[i + 4];
    return (a[0] + a[2]) + (a[1] + a[3]);
}

/* The score of one widened K row against n f32 queries (rows q_stride floats apart), for head_dim_k
 * a multiple of 16, summed as ggml's AVX-512 f16 x f32 vec_dot sums:
 * four accumulators of 16 lanes take the four 16-element chunks of each 64 elements, a chunk past
 * the last whole 64 goes to the first; then (acc0 + acc1) + (acc2 + acc3) lane by lane, and the
 * lanes in the tree order of sum16_tree. Every level keeps exactly these lanes and this order
 * with fused multiply-adds, so all give the same bits. (One long chain per lane moved gemma3's
 * greedy path off llama.cpp's in test_model_catalog: its scores are that sensitive.) */
static void score_row_scalar(int hdk, const float *k, const float *q, size_t q_stride, int n, float kq_scale,
                             float *s, size_t s_stride) {
    for (int r = 0; r < n; r++) {
        const float *qr = q + (size_t)r * q_stride;
        float acc[4][G] = {{0}};
        int j0 = 0;
        for (; j0 + 4 * G <= hdk; j0 += 4 * G)
            for (int u = 0; u < 4; u++)
                for (int l = 0; l < G; l++) acc[u][l] = fmaf(qr[j0 + G * u + l], k[j0 + G * u + l], acc[u][l]);
        for (; j0 < hdk; j0 += G)
            for (int l = 0; l < G; l++) acc[0][l] = fmaf(qr[j0 + l], k[j0 + l], acc[0][l]);
        float lanes[G];
        for (int l = 0; l < G; l++) lanes[l] = (acc[0][l] + acc[1][l]) + (acc[2][l] + acc[3][l]);
        s[(size_t)r * s_stride] = sum16_tree(lanes) * kq_scale;
    }
}

static void scores_scalar(const attend_keys *k, const uint8_t *q, size_t q_stride, int n_q, float kq_scale,
                          float *s) {
    for (int i = 0; i < G; i++)
        score_row_scalar(k->hdk, k->kf + (size_t)i * k->hdk, (const float *)q, q_stride / sizeof(float), n_q, kq_scale,
                         s + i, G);
}

/* q8_0 rows against q8_0 queries, head_dim_k a multiple of 64: the formula every level follows. */
static void scores_q8_scalar(const attend_keys *k, const uint8_t *q, size_t q_stride, int n_q, float kq_scale,
                             float *s) {
    const int hdk = k->hdk;
    for (int h = 0; h < n_q; h++) {
        const uint8_t *qh = q + (size_t)h * q_stride;
        for (int i = 0; i < G; i++) {
            const int8_t *kr = k->kq + (size_t)i * hdk;
            float acc = 0.0f;
            for (int b = 0; b < hdk / QK8_0; b++) {
                const int8_t *qs = q8_quants(qh, b);
                int32_t isum = 0;
                for (int j = 0; j < QK8_0; j++) isum += (int32_t)qs[j] * kr[QK8_0 * b + j];
                const float sc = k->kw[(size_t)b * G + i] * q8_scale(qh, b);
                acc = b == 0 ? (float)isum * sc : fmaf((float)isum, sc, acc);
            }
            s[(size_t)h * G + i] = acc * kq_scale;
        }
    }
}

static void group_scalar(const attend_group *g) {
    for (int h = 0; h < g->n_q; h++) {
        const float *s = g->scores + (size_t)h * G;
        float mg = -INFINITY;
        for (int i = g->lo; i < g->hi; i++) mg = fmaxf(mg, s[i]);
        const float m_new = fmaxf(g->m[h], mg);
        for (int i = 0; i < G; i++) g->p[i] = i >= g->lo && i < g->hi ? vm_exp_lanewise(s[i] - m_new) : 0.0f;
        const float c = group_rescale(g, h, m_new);
        float *out = g->out + (size_t)h * g->out_stride;
        g->l[h] = fmaf(g->l[h], c, sum16_tree(g->p));
        for (int j = 0; j < g->hdv; j++) {
            float acc = out[j] * c;
            for (int i = g->lo; i < g->hi; i++) acc = fmaf(g->p[i], g->vrows[(size_t)i * g->hdv + j], acc);
            out[j] = acc;
        }
    }
}

/* ---- AVX2 ------------------------------------------------------------------------------------- */
#if defined(BUBO_X86)

/* 16 positions' lane sums a[p] (lanes i + 8 already added: sum16_tree's first step) -> their
 * scores, position p in lane p of out[p / 8], each summed as sum16_tree: (i, i + 4), then
 * (0 + 2) + (1 + 3). The adds transpose the lanes as they go: 8 + 4 + 2 + 1 adds per 8 positions. */
BUBO_TARGET_AVX2 static inline void reduce16_avx2(const __m256 *a, __m256 *out) {
    for (int o = 0; o < 2; o++) {
        const __m256 *x = a + 8 * o;
        __m256 b[4], c[2];
        for (int k = 0; k < 4; k++) /* 128-bit lane 0: position 2k's a[i] + a[i + 4], lane 1: 2k + 1's */
            b[k] = _mm256_add_ps(_mm256_permute2f128_ps(x[2 * k], x[2 * k + 1], 0x20),
                                 _mm256_permute2f128_ps(x[2 * k], x[2 * k + 1], 0x31));
        for (int k = 0; k < 2; k++) /* per 128-bit lane: (b0 + b2, b1 + b3) of two positions */
            c[k] = _mm256_add_ps(_mm256_shuffle_ps(b[2 * k], b[2 * k + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                                 _mm256_shuffle_ps(b[2 * k], b[2 * k + 1], _MM_SHUFFLE(3, 2, 3, 2)));
        const __m256 r = _mm256_add_ps(_mm256_shuffle_ps(c[0], c[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                       _mm256_shuffle_ps(c[0], c[1], _MM_SHUFFLE(3, 1, 3, 1)));
        out[o] = _mm256_permutevar8x32_ps(r, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)); /* r: 0 2 4 6 1 3 5 7 */
    }
}

/* scores_avx2's steps for 64 dimensions (halves 1: one product per accumulator) or 128 (halves 2:
 * two), the query's first 64 in 8 registers: half the general loop's loads at 64, a quarter fewer
 * at 128 (a prompt's attention 1.39x and 1.15-1.3x as fast on Zen 5 for smollm2's and
 * qwen2.5-coder:1.5b's heads) */
BUBO_TARGET_AVX2 static inline __attribute__((always_inline)) void scores_qreg_avx2(const attend_keys *k, const uint8_t *q,
                                                                                 size_t q_stride, int n_q, float kq_scale,
                                                                                 float *s, const int halves) {
    const __m256 zero = _mm256_setzero_ps();
    for (int h = 0; h < n_q; h++) {
        const float *qr = (const float *)(q + (size_t)h * q_stride);
        __m256 qv[4][2];
#pragma GCC unroll 4
        for (int u = 0; u < 4; u++)
            for (int x = 0; x < 2; x++) qv[u][x] = _mm256_loadu_ps(qr + G * u + 8 * x);
        __m256 a[G];
#pragma GCC unroll 16
        for (int i = 0; i < G; i++) {
            const float *kr = k->kf + (size_t)i * 4 * G * halves;
            __m256 lanes[2];
#pragma GCC unroll 2
            for (int x = 0; x < 2; x++) {
                __m256 p[4];
#pragma GCC unroll 4
                for (int u = 0; u < 4; u++) {
                    const int j = G * u + 8 * x;
                    p[u] = _mm256_fmadd_ps(qv[u][x], _mm256_loadu_ps(kr + j), zero);
                    if (halves == 2)
                        p[u] = _mm256_fmadd_ps(_mm256_loadu_ps(qr + 4 * G + j), _mm256_loadu_ps(kr + 4 * G + j), p[u]);
                }
                lanes[x] = _mm256_add_ps(_mm256_add_ps(p[0], p[1]), _mm256_add_ps(p[2], p[3]));
            }
            a[i] = _mm256_add_ps(lanes[0], lanes[1]);
        }
        __m256 r[2];
        reduce16_avx2(a, r);
        for (int o = 0; o < 2; o++) _mm256_storeu_ps(s + (size_t)h * G + 8 * o, _mm256_mul_ps(r[o], _mm256_set1_ps(kq_scale)));
    }
}

BUBO_TARGET_AVX2 static void scores_avx2(const attend_keys *k, const uint8_t *q, size_t q_stride, int n_q,
                                          float kq_scale, float *s) {
    const int hdk = k->hdk;
    if (hdk == 4 * G) {
        scores_qreg_avx2(k, q, q_stride, n_q, kq_scale, s, 1);
        return;
    }
    if (hdk == 8 * G) {
        scores_qreg_avx2(k, q, q_stride, n_q, kq_scale, s, 2);
        return;
    }
    for (int h = 0; h < n_q; h++) {
        const float *qr = (const float *)(q + (size_t)h * q_stride);
        __m256 a[G];
        for (int i = 0; i < G; i++) {
            const float *kr = k->kf + (size_t)i * hdk;
            __m256 acc[4][2]; /* [accumulator][lanes 0-7, 8-15] */
            for (int u = 0; u < 4; u++) acc[u][0] = acc[u][1] = _mm256_setzero_ps();
            int j0 = 0;
            for (; j0 + 4 * G <= hdk; j0 += 4 * G)
                for (int u = 0; u < 4; u++)
                    for (int x = 0; x < 2; x++) {
                        const int j = j0 + G * u + 8 * x;
                        acc[u][x] = _mm256_fmadd_ps(_mm256_loadu_ps(qr + j), _mm256_loadu_ps(kr + j), acc[u][x]);
                    }
            for (; j0 < hdk; j0 += G)
                for (int x = 0; x < 2; x++)
                    acc[0][x] = _mm256_fmadd_ps(_mm256_loadu_ps(qr + j0 + 8 * x), _mm256_loadu_ps(kr + j0 + 8 * x), acc[0][x]);
            __m256 lanes[2];
            for (int x = 0; x < 2; x++)
                lanes[x] = _mm256_add_ps(_mm256_add_ps(acc[0][x], acc[1][x]), _mm256_add_ps(acc[2][x], acc[3][x]));
            a[i] = _mm256_add_ps(lanes[0], lanes[1]);
        }
        __m256 r[2];
        reduce16_avx2(a, r);
        for (int o = 0; o < 2; o++) _mm256_storeu_ps(s + (size_t)h * G + 8 * o, _mm256_mul_ps(r[o], _mm256_set1_ps(kq_scale)));
    }
}

/* 8 positions' 8 int32 words -> each position's sum, position p in lane p (exact). */
BUBO_TARGET_AVX2 static inline __m256i sums8_avx2(const __m256i *w) {
    __m256i a[4], b[2];
    for (int k = 0; k < 4; k++) /* each 128-bit half: positions 2k, 2k + 1's words (0 + 2, 1 + 3) */
        a[k] = _mm256_add_epi32(_mm256_unpacklo_epi32(w[2 * k], w[2 * k + 1]), _mm256_unpackhi_epi32(w[2 * k], w[2 * k + 1]));
    for (int k = 0; k < 2; k++) /* each half: positions 4k .. 4k + 3, the half's 4 words each */
        b[k] = _mm256_add_epi32(_mm256_unpacklo_epi64(a[2 * k], a[2 * k + 1]), _mm256_unpackhi_epi64(a[2 * k], a[2 * k + 1]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(b[0], b[1], 0x20), _mm256_permute2x128_si256(b[0], b[1], 0x31));
}

/* The q8_0 formula: a block's products summed exactly, 4 to a word by maddubs (|q| against k signed
 * as q; both within +-127, so a pair stays inside int16) and madd, then 8 words by sums8_avx2. */
BUBO_TARGET_AVX2 static void scores_q8_avx2(const attend_keys *k, const uint8_t *q, size_t q_stride, int n_q,
                                             float kq_scale, float *s) {
    const int hdk = k->hdk;
    const __m256i ones = _mm256_set1_epi16(1);
    for (int h = 0; h < n_q; h++) {
        const uint8_t *qh = q + (size_t)h * q_stride;
        __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
        for (int b = 0; b < hdk / QK8_0; b++) {
            const __m256i qs = _mm256_loadu_si256((const __m256i *)q8_quants(qh, b)), aq = _mm256_abs_epi8(qs);
            const __m256 dq = _mm256_set1_ps(q8_scale_f16c(qh, b));
            __m256i w[G];
            for (int i = 0; i < G; i++) {
                const __m256i ks = _mm256_loadu_si256((const __m256i *)(k->kq + (size_t)i * hdk + QK8_0 * b));
                w[i] = _mm256_madd_epi16(_mm256_maddubs_epi16(aq, _mm256_sign_epi8(ks, qs)), ones);
            }
            for (int o = 0; o < 2; o++) {
                const __m256 f = _mm256_cvtepi32_ps(sums8_avx2(w + 8 * o));
                const __m256 sc = _mm256_mul_ps(_mm256_loadu_ps(k->kw + (size_t)b * G + 8 * o), dq);
                acc[o] = b == 0 ? _mm256_mul_ps(f, sc) : _mm256_fmadd_ps(f, sc, acc[o]);
            }
        }
        for (int o = 0; o < 2; o++) _mm256_storeu_ps(s + (size_t)h * G + 8 * o, _mm256_mul_ps(acc[o], _mm256_set1_ps(kq_scale)));
    }
}

BUBO_TARGET_AVX2 static void group_avx2(const attend_group *g) {
    const __m256i lane0 = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), lane8 = _mm256_add_epi32(lane0, _mm256_set1_epi32(8));
    const __m256i lo = _mm256_set1_epi32(g->lo - 1), hi = _mm256_set1_epi32(g->hi);
    const __m256 valid0 = _mm256_castsi256_ps(_mm256_and_si256(_mm256_cmpgt_epi32(lane0, lo), _mm256_cmpgt_epi32(hi, lane0)));
    const __m256 valid8 = _mm256_castsi256_ps(_mm256_and_si256(_mm256_cmpgt_epi32(lane8, lo), _mm256_cmpgt_epi32(hi, lane8)));
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    for (int h = 0; h < g->n_q; h++) {
        const float *s = g->scores + (size_t)h * G;
        const __m256 s0 = _mm256_blendv_ps(ninf, _mm256_loadu_ps(s), valid0);
        const __m256 s8 = _mm256_blendv_ps(ninf, _mm256_loadu_ps(s + 8), valid8);
        const float m_new = fmaxf(g->m[h], vm_hmax_avx2(_mm256_max_ps(s0, s8)));
        const __m256 mv = _mm256_set1_ps(m_new);
        const __m256 p0 = _mm256_and_ps(valid0, vm_exp_avx2(_mm256_sub_ps(s0, mv)));
        const __m256 p8 = _mm256_and_ps(valid8, vm_exp_avx2(_mm256_sub_ps(s8, mv)));
        _mm256_storeu_ps(g->p, p0);
        _mm256_storeu_ps(g->p + 8, p8);
        const float c = group_rescale(g, h, m_new);
        g->l[h] = fmaf(g->l[h], c, bubo_hsum_f32x8(_mm256_add_ps(p0, p8)));
        float *out = g->out + (size_t)h * g->out_stride;
        const __m256 cv = _mm256_set1_ps(c);
        int j = 0;
        for (; j + 32 <= g->hdv; j += 32) { /* four independent accumulators, as in the AVX-512 level */
            __m256 acc[4];
            for (int u = 0; u < 4; u++) acc[u] = _mm256_mul_ps(_mm256_loadu_ps(out + j + 8 * u), cv);
            for (int i = g->lo; i < g->hi; i++) {
                const __m256 pi = _mm256_set1_ps(g->p[i]);
                const float *vr = g->vrows + (size_t)i * g->hdv + j;
                for (int u = 0; u < 4; u++) acc[u] = _mm256_fmadd_ps(pi, _mm256_loadu_ps(vr + 8 * u), acc[u]);
            }
            for (int u = 0; u < 4; u++) _mm256_storeu_ps(out + j + 8 * u, acc[u]);
        }
        for (; j + 8 <= g->hdv; j += 8) {
            __m256 acc = _mm256_mul_ps(_mm256_loadu_ps(out + j), cv);
            for (int i = g->lo; i < g->hi; i++)
                acc = _mm256_fmadd_ps(_mm256_set1_ps(g->p[i]), _mm256_loadu_ps(g->vrows + (size_t)i * g->hdv + j), acc);
            _mm256_storeu_ps(out + j, acc);
        }
        for (; j < g->hdv; j++) {
            float acc = out[j] * c;
            for (int i = g->lo; i < g->hi; i++) acc = fmaf(g->p[i], g->vrows[(size_t)i * g->hdv + j], acc);
            out[j] = acc;
        }
    }
}

/* ---- AVX-512 ---------------------------------------------------------------------------------- */

BUBO_TARGET_AVX512 static void scores_avx512(const attend_keys *k, const uint8_t *q, size_t q_stride, int n_q,
                                              float kq_scale, float *s) {
    const int hdk = k->hdk;
    if (hdk == 4 * G) { /* the common head size, unrolled: the query and the 16 sums stay in registers */
        const __m512 zero = _mm512_setzero_ps();
        for (int h = 0; h < n_q; h++) {
            const float *qr = (const float *)(q + (size_t)h * q_stride);
            const __m512 q0 = _mm512_loadu_ps(qr), q1 = _mm512_loadu_ps(qr + G), q2 = _mm512_loadu_ps(qr + 2 * G),
                         q3 = _mm512_loadu_ps(qr + 3 * G);
            __m512 v[G];
#pragma GCC unroll 16
            for (int i = 0; i < G; i++) {
                const float *kr = k->kf + (size_t)i * hdk;
                v[i] = _mm512_add_ps(_mm512_add_ps(_mm512_fmadd_ps(q0, _mm512_loadu_ps(kr), zero),
                                                   _mm512_fmadd_ps(q1, _mm512_loadu_ps(kr + G), zero)),
                                     _mm512_add_ps(_mm512_fmadd_ps(q2, _mm512_loadu_ps(kr + 2 * G), zero),
                                                   _mm512_fmadd_ps(q3, _mm512_loadu_ps(kr + 3 * G), zero)));
            }
            _mm512_storeu_ps(s + (size_t)h * G, _mm512_mul_ps(reduce16_avx512(v), _mm512_set1_ps(kq_scale)));
        }
        return;
    }
    if (hdk == 8 * G) { /* the general loop's steps for 128 dimensions, the query in registers: half
                           its loads (attention 1.6x as fast for qwen2.5-coder:1.5b's heads on Zen 5) */
        const __m512 zero = _mm512_setzero_ps();
        for (int h = 0; h < n_q; h++) {
            const float *qr = (const float *)(q + (size_t)h * q_stride);
            __m512 qv[8];
#pragma GCC unroll 8
            for (int u = 0; u < 8; u++) qv[u] = _mm512_loadu_ps(qr + G * u);
            __m512 v[G];
#pragma GCC unroll 16
            for (int i = 0; i < G; i++) {
                const float *kr = k->kf + (size_t)i * hdk;
                __m512 acc[4];
#pragma GCC unroll 4
                for (int u = 0; u < 4; u++)
                    acc[u] = _mm512_fmadd_ps(qv[4 + u], _mm512_loadu_ps(kr + 4 * G + G * u),
                                             _mm512_fmadd_ps(qv[u], _mm512_loadu_ps(kr + G * u), zero));
                v[i] = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
            }
            _mm512_storeu_ps(s + (size_t)h * G, _mm512_mul_ps(reduce16_avx512(v), _mm512_set1_ps(kq_scale)));
        }
        return;
    }
    for (int h = 0; h < n_q; h++) {
        const float *qr = (const float *)(q + (size_t)h * q_stride);
        __m512 v[G];
        for (int i = 0; i < G; i++) {
            const float *kr = k->kf + (size_t)i * hdk;
            __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
            int j0 = 0;
            for (; j0 + 4 * G <= hdk; j0 += 4 * G)
                for (int u = 0; u < 4; u++)
                    acc[u] = _mm512_fmadd_ps(_mm512_loadu_ps(qr + j0 + G * u), _mm512_loadu_ps(kr + j0 + G * u), acc[u]);
            for (; j0 < hdk; j0 += G) acc[0] = _mm512_fmadd_ps(_mm512_loadu_ps(qr + j0), _mm512_loadu_ps(kr + j0), acc[0]);
            v[i] = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
        }
        _mm512_storeu_ps(s + (size_t)h * G, _mm512_mul_ps(reduce16_avx512(v), _mm512_set1_ps(kq_scale)));
    }
}

/* 16 positions' 16 int32 words (words 0-7 one block, 8-15 the next) -> each position's two block
 * sums, position p in lane p of out[0] (the first block) and out[1] (exact). */
BUBO_TARGET_AVX512 static inline void block_sums16_avx512(const __m512i *w, __m512i *out) {
    __m512i a[8], b[4], c[2];
    for (int k = 0; k < 8; k++) /* each 128-bit lane: positions 2k, 2k + 1's words (0 + 2, 1 + 3) */
        a[k] = _mm512_add_epi32(_mm512_unpacklo_epi32(w[2 * k], w[2 * k + 1]), _mm512_unpackhi_epi32(w[2 * k], w[2 * k + 1]));
    for (int k = 0; k < 4; k++) /* each 128-bit lane: positions 4k .. 4k + 3, the lane's 4 words each */
        b[k] = _mm512_add_epi32(_mm512_unpacklo_epi64(a[2 * k], a[2 * k + 1]), _mm512_unpackhi_epi64(a[2 * k], a[2 * k + 1]));
    for (int k = 0; k < 2; k++) /* 128-bit lanes: positions 8k .. 8k + 3's blocks 0, 1, then 8k + 4 .. 8k + 7's */
        c[k] = _mm512_add_epi32(_mm512_shuffle_i32x4(b[2 * k], b[2 * k + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                                _mm512_shuffle_i32x4(b[2 * k], b[2 * k + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    out[0] = _mm512_shuffle_i32x4(c[0], c[1], _MM_SHUFFLE(2, 0, 2, 0));
    out[1] = _mm512_shuffle_i32x4(c[0], c[1], _MM_SHUFFLE(3, 1, 3, 1));
}

/* The q8_0 formula with VNNI, a 64-element chunk (two blocks) at a time: vpdpbusd takes K as
 * unsigned (k ^ 0x80 = k + 128) against the query's signed quants, starting from -128 x (the sum of
 * each query word), so each word's sum is the exact integer; block_sums16_avx512 adds the words. */
BUBO_TARGET_AVX512 static void scores_q8_avx512(const attend_keys *k, const uint8_t *q, size_t q_stride, int n_q,
                                                 float kq_scale, float *s) {
    const int hdk = k->hdk;
    const __m512i bias = _mm512_set1_epi8((char)0x80);
    for (int h = 0; h < n_q; h++) {
        const uint8_t *qh = q + (size_t)h * q_stride;
        __m512 acc = _mm512_setzero_ps();
        for (int c = 0; c < hdk / 64; c++) {
            const __m512i qs = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)q8_quants(qh, 2 * c))),
                                                  _mm256_loadu_si256((const __m256i *)q8_quants(qh, 2 * c + 1)), 1);
            const __m512i init = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), bias, qs));
            __m512i w[G], sums[2];
            for (int i = 0; i < G; i++)
                w[i] = _mm512_dpbusd_epi32(init, _mm512_xor_si512(_mm512_loadu_si512(k->kq + (size_t)i * hdk + 64 * c), bias), qs);
            block_sums16_avx512(w, sums);
            for (int o = 0; o < 2; o++) {
                const int b = 2 * c + o;
                const __m512 f = _mm512_cvtepi32_ps(sums[o]);
                const __m512 sc = _mm512_mul_ps(_mm512_loadu_ps(k->kw + (size_t)b * G), _mm512_set1_ps(q8_scale_f16c(qh, b)));
                acc = b == 0 ? _mm512_mul_ps(f, sc) : _mm512_fmadd_ps(f, sc, acc);
            }
        }
        _mm512_storeu_ps(s + (size_t)h * G, _mm512_mul_ps(acc, _mm512_set1_ps(kq_scale)));
    }
}

/* The weighted V sums of heads h0 .. h0 + nb - 1 (weights w [n_q][G], rescale factors cv): each V
 * chunk is loaded once for all of them; per element the same steps as one head alone (out x c,
 * then one fused multiply-add per position in order). nb is a constant where it is inlined. */
BUBO_TARGET_AVX512 __attribute__((always_inline)) static inline void vsum_avx512(const attend_group *g, const float *w,
                                                                                  int h0, const int nb,
                                                                                  const __m512 *cv) {
    /* four independent accumulators (64 floats) per head per pass: one chain would wait on its latency */
    for (int j0 = 0; j0 < g->hdv; j0 += 64) {
        __mmask16 k[4];
        __m512 acc[4][4];
        for (int u = 0; u < 4; u++) {
            const int left = g->hdv - j0 - 16 * u;
            k[u] = left >= 16 ? (__mmask16)0xffff : left > 0 ? (__mmask16)((1u << left) - 1u) : 0;
        }
        for (int b = 0; b < nb; b++)
            for (int u = 0; u < 4; u++)
                acc[b][u] = _mm512_mul_ps(_mm512_maskz_loadu_ps(k[u], g->out + (size_t)(h0 + b) * g->out_stride + j0 + 16 * u), cv[b]);
        for (int i = g->lo; i < g->hi; i++) {
            const float *vr = g->vrows + (size_t)i * g->hdv + j0;
            __m512 v[4];
            for (int u = 0; u < 4; u++) v[u] = _mm512_maskz_loadu_ps(k[u], vr + 16 * u);
            for (int b = 0; b < nb; b++) {
                const __m512 pi = _mm512_set1_ps(w[(size_t)(h0 + b) * G + i]);
                for (int u = 0; u < 4; u++) acc[b][u] = _mm512_fmadd_ps(pi, v[u], acc[b][u]);
            }
        }
        for (int b = 0; b < nb; b++)
            for (int u = 0; u < 4; u++)
                _mm512_mask_storeu_ps(g->out + (size_t)(h0 + b) * g->out_stride + j0 + 16 * u, k[u], acc[b][u]);
    }
}

/* The softmax half of a group step for up to 16 rows (n rows of scores [n][G], row i's lanes
 * valid[i]; a row without any keeps its max and sum): each row's weights replace its scores, its
 * running max m and sum l are updated and c gets the factor its weighted V sum is to be rescaled
 * by. Per row the operations of the one-row step: max (exact in any order), the weights' exp,
 * their sum in sum16_tree's order (reduce16_avx512, rows in the lanes), c = exp(m - m_new) as
 * vm_exp_lanewise gives it where the max rose (1 elsewhere, and for a first group), then
 * l = fma(l, c, sum). */
BUBO_TARGET_AVX512 static void softmax16_avx512(int n, const uint16_t *valid, float *scores, float *m, float *l,
                                                 float *c) {
    const __mmask16 rows = n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1);
    __m512 v[G];
    for (int i = 0; i < G; i++)
        v[i] = i < n ? _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), valid[i], scores + (size_t)i * G)
                     : _mm512_set1_ps(-INFINITY);
    const __m512 m_old = _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), rows, m);
    const __m512 m_new = _mm512_max_ps(m_old, reduce16_max_avx512(v));
    for (int i = 0; i < G; i++) {
        const __m512 mi = _mm512_permutexvar_ps(_mm512_set1_epi32(i), m_new);
        v[i] = _mm512_maskz_mov_ps(i < n ? valid[i] : 0, vm_exp_avx512(_mm512_sub_ps(v[i], mi)));
        if (i < n) _mm512_storeu_ps(scores + (size_t)i * G, v[i]);
    }
    const __m512 sum = reduce16_avx512(v);
    /* rose: m_new > m, and m was not -inf (a first group has nothing to rescale) */
    const __mmask16 rose = _mm512_cmp_ps_mask(m_new, m_old, _CMP_GT_OQ) &
                           _mm512_cmp_ps_mask(m_old, _mm512_set1_ps(-INFINITY), _CMP_NEQ_OQ);
    const __m512 cf = _mm512_mask_blend_ps(rose, _mm512_set1_ps(1.0f), vm_exp_lanewise_avx512(_mm512_sub_ps(m_old, m_new)));
    const __m512 l_new = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(rows, l), cf, sum);
    _mm512_mask_storeu_ps(m, rows, m_new);
    _mm512_mask_storeu_ps(l, rows, l_new);
    _mm512_mask_storeu_ps(c, rows, cf);
}

/* The weighted V half: out = out x c + the weights' sum of V, heads in threes (12 accumulators and
 * 4 V vectors in registers). */
BUBO_TARGET_AVX512 static void vsum_heads_avx512(const attend_group *g, const float *c) {
    for (int h0 = 0; h0 < g->n_q; h0 += 3) {
        const int nb = g->n_q - h0 < 3 ? g->n_q - h0 : 3;
        __m512 cv[3];
        for (int b = 0; b < nb; b++) cv[b] = _mm512_set1_ps(c[h0 + b]);
        if (nb == 3) vsum_avx512(g, g->scores, h0, 3, cv);
        else if (nb == 2) vsum_avx512(g, g->scores, h0, 2, cv);
        else vsum_avx512(g, g->scores, h0, 1, cv);
    }
}

/* The whole group step of one token's heads (a call with few rows: a decode step), the same
 * operations as softmax16_avx512 and vsum_heads_avx512 give each row: per head the max, the
 * weights, c = vm_exp_lanewise(m - m_new) where the max rose, l = fma(l, c, sum), then the V sums. */
BUBO_TARGET_AVX512 static void group_avx512(const attend_group *g) {
    const __mmask16 valid = (__mmask16)(((1u << g->hi) - 1u) & ~((1u << g->lo) - 1u));
    float *w = g->scores; /* each head's weights replace its scores */
    for (int h0 = 0; h0 < g->n_q; h0 += 3) { /* heads in threes: 12 accumulators and 4 V vectors in registers */
        const int nb = g->n_q - h0 < 3 ? g->n_q - h0 : 3;
        __m512 cv[3];
        for (int b = 0; b < nb; b++) {
            const int h = h0 + b;
            const __m512 s = _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), valid, g->scores + (size_t)h * G);
            const float m_new = fmaxf(g->m[h], _mm512_reduce_max_ps(s)); /* max is exact in any order */
            const __m512 p = _mm512_maskz_mov_ps(valid, vm_exp_avx512(_mm512_sub_ps(s, _mm512_set1_ps(m_new))));
            _mm512_storeu_ps(w + (size_t)h * G, p);
            const float c = group_rescale(g, h, m_new);
            /* the tree order of sum16_tree: halves, then quarters, then pairs */
            __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(p), _mm512_extractf32x8_ps(p, 1));
            g->l[h] = fmaf(g->l[h], c, bubo_hsum_f32x8(s8));
            cv[b] = _mm512_set1_ps(c);
        }
        if (nb == 3) vsum_avx512(g, w, h0, 3, cv);
        else if (nb == 2) vsum_avx512(g, w, h0, 2, cv);
        else vsum_avx512(g, w, h0, 1, cv);
    }
}
#endif /* BUBO_X86 */

/* ---- NEON ------------------------------------------------------------------------------------- */
#if defined(BUBO_ARM64)

static void score_row_neon(int hdk, const float *k, const float *q, size_t q_stride, int n, float kq_scale, float *s,
                           size_t s_stride) {
    for (int r = 0; r < n; r++) {
        const float *qr = q + (size_t)r * q_stride;
        float32x4_t acc[4][4]; /* [accumulator][lanes 0-3 .. 12-15] */
        for (int u = 0; u < 4; u++)
            for (int w = 0; w < 4; w++) acc[u][w] = vdupq_n_f32(0.0f);
        int j0 = 0;
        for (; j0 + 4 * G <= hdk; j0 += 4 * G)
            for (int u = 0; u < 4; u++)
                for (int w = 0; w < 4; w++) {
                    const int j = j0 + G * u + 4 * w;
                    acc[u][w] = vfmaq_f32(acc[u][w], vld1q_f32(qr + j), vld1q_f32(k + j));
                }
        for (; j0 < hdk; j0 += G)
            for (int w = 0; w < 4; w++) acc[0][w] = vfmaq_f32(acc[0][w], vld1q_f32(qr + j0 + 4 * w), vld1q_f32(k + j0 + 4 * w));
        float32x4_t a[4];
        for (int w = 0; w < 4; w++) a[w] = vaddq_f32(vaddq_f32(acc[0][w], acc[1][w]), vaddq_f32(acc[2][w], acc[3][w]));
        const float32x4_t h = vaddq_f32(vaddq_f32(a[0], a[2]), vaddq_f32(a[1], a[3]));
        const float32x2_t d = vadd_f32(vget_low_f32(h), vget_high_f32(h));
        s[(size_t)r * s_stride] = (vget_lane_f32(d, 0) + vget_lane_f32(d, 1)) * kq_scale;
    }
}

static void scores_neon(const attend_keys *k, const uint8_t *q, size_t q_stride, int n_q, float kq_scale, float *s) {
    for (int i = 0; i < G; i++)
        score_row_neon(k->hdk, k->kf + (size_t)i * k->hdk, (const float *)q, q_stride / sizeof(float), n_q, kq_scale,
                       s + i, G);
}

static void group_neon(const attend_group *g) {
    for (int h = 0; h < g->n_q; h++) {
        const float *s = g->scores + (size_t)h * G;
        float sv[G];
        for (int i = 0; i < G; i++) sv[i] = i >= g->lo && i < g->hi ? s[i] : -INFINITY;
        float32x4_t x[4];
        for (int k = 0; k < 4; k++) x[k] = vld1q_f32(sv + 4 * k);
        const float mg = vmaxvq_f32(vmaxq_f32(vmaxq_f32(x[0], x[1]), vmaxq_f32(x[2], x[3])));
        const float m_new = fmaxf(g->m[h], mg);
        for (int k = 0; k < 4; k++) {
            uint32x4_t keep = vcgtq_f32(x[k], vdupq_n_f32(-INFINITY));
            x[k] = vreinterpretq_f32_u32(vandq_u32(keep, vreinterpretq_u32_f32(vm_exp_neon(vsubq_f32(x[k], vdupq_n_f32(m_new))))));
            vst1q_f32(g->p + 4 * k, x[k]);
        }
        const float c = group_rescale(g, h, m_new);
        /* the tree order of sum16_tree: (i, i + 8), then (i, i + 4), (i, i + 2), (i, i + 1) */
        const float32x4_t q = vaddq_f32(vaddq_f32(x[0], x[2]), vaddq_f32(x[1], x[3]));
        const float32x2_t d = vadd_f32(vget_low_f32(q), vget_high_f32(q));
        g->l[h] = fmaf(g->l[h], c, vget_lane_f32(d, 0) + vget_lane_f32(d, 1));
        float *out = g->out + (size_t)h * g->out_stride;
        int j = 0;
        for (; j + 4 <= g->hdv; j += 4) {
            float32x4_t acc = vmulq_n_f32(vld1q_f32(out + j), c);
            for (int i = g->lo; i < g->hi; i++) acc = vfmaq_n_f32(acc, vld1q_f32(g->vrows + (size_t)i * g->hdv + j), g->p[i]);
            vst1q_f32(out + j, acc);
        }
        for (; j < g->hdv; j++) {
            float acc = out[j] * c;
            for (int i = g->lo; i < g->hi; i++) acc = fmaf(g->p[i], g->vrows[(size_t)i * g->hdv + j], acc);
            out[j] = acc;
        }
    }
}
#endif /* BUBO_ARM64 */

/* ---- the driver ------------------------------------------------------------------------------- */

typedef void (*group_fn)(const attend_group *g);
/* A group step in two halves: the softmax of up to 16 rows at once (softmax16_avx512), then the V
 * sums of one token's heads (vsum_heads_avx512); c: the rows' rescale factors. */
typedef void (*softmax_fn)(int n, const uint16_t *valid, float *scores, float *m, float *l, float *c);
typedef void (*vsum_fn)(const attend_group *g, const float *c);

/* Every level has group, the whole step for one token's heads. A level with softmax and vsum too
 * runs a call of many rows (ATTEND_ROWS_SPLIT or more: a prompt's tile) in phases: a group's
 * scores for every token, then the softmax of all their rows, 16 at a time, then every token's V
 * sums, so that each phase has many independent rows instead of one token's chain of dependent
 * steps. Both give each row the same operations, so the same bits. */
typedef struct bubo_attend_level {
    group_fn group;
    softmax_fn softmax;
    vsum_fn vsum;
    scores_fn scores, scores_q8;
    bubo_isa isa; /* the kernel table's level for the rows' conversions and vec_dot */
} attend_level;

/* Each level's kernels, registered in the op tables (bubo_ops.attend) that ops.c fills once. */
static const attend_level level_scalar = {group_scalar, NULL, NULL, scores_scalar, scores_q8_scalar, BUBO_ISA_SCALAR};
#if defined(BUBO_X86)
static const attend_level level_avx2 = {group_avx2, NULL, NULL, scores_avx2, scores_q8_avx2, BUBO_ISA_AVX2};
static const attend_level level_avx512 = {group_avx512, softmax16_avx512, vsum_heads_avx512, scores_avx512,
                                          scores_q8_avx512, BUBO_ISA_AVX512};
#elif defined(BUBO_ARM64)
static const attend_level level_neon = {group_neon, NULL, NULL, scores_neon, scores_q8_scalar, BUBO_ISA_NEON};
#endif

void bubo_register_attention(bubo_ops *tables) {
    tables[BUBO_ISA_SCALAR].attend = &level_scalar;
#if defined(BUBO_X86)
    tables[BUBO_ISA_AVX2].attend = &level_avx2;
    tables[BUBO_ISA_AVX512].attend = &level_avx512;
#elif defined(BUBO_ARM64)
    tables[BUBO_ISA_NEON].attend = &level_neon;
#endif
}

/* The kernels of a level (a level this build or CPU lacks: the scalar ones). */
static const attend_level *level_for_isa(bubo_isa isa) {
    const bubo_ops *ops = bubo_ops_for_isa(isa);
    return ops && ops->attend ? ops->attend : &level_scalar;
}

/* How a cache's K rows meet the queries: widened (f16, f32), as q8_0 blocks, or one vec_dot per
 * score (q4_0, and head sizes the kernels do not take). The choice depends on the cache type and
 * head size only, never on the batch. */
typedef enum { KEYS_WIDEN, KEYS_Q8, KEYS_VEC_DOT } keys_mode;

static keys_mode keys_for(const bubo_kv_view *view, int head_dim_k) {
    if ((view->type == BUBO_TYPE_F16 || view->type == BUBO_TYPE_F32) && head_dim_k % G == 0) return KEYS_WIDEN;
    if (view->type == BUBO_TYPE_Q8_0 && head_dim_k % (4 * G) == 0) return KEYS_Q8;
    return KEYS_VEC_DOT;
}

size_t bubo_attend_scratch_floats(int n_tok, int n_q, int head_dim_k, int head_dim_v) {
    const size_t n_rows = (size_t)n_tok * n_q;
    /* V rows, scores, m and l, p, the group's K rows (widened: G x hdk floats, the most), the rows'
     * rescale factors, one partial */
    return (size_t)G * head_dim_v + n_rows * (G + 2) + G + (size_t)G * head_dim_k + n_rows +
           n_rows * ((size_t)head_dim_v + 2);
}

/* Token t's lanes of the group at g0: [*lo, *hi), empty when *lo >= *hi. */
static inline void token_lanes(int32_t g0, int32_t begin, int32_t end, int *lo, int *hi) {
    *lo = begin > g0 ? (begin - g0 < G ? begin - g0 : G) : 0;
    *hi = end < g0 + G ? (end > g0 ? end - g0 : 0) : G;
}

/* KV head `head`'s K (V) row in slot `slot` of block `block`. */
static inline const uint8_t *view_k_row(const bubo_kv_view *view, size_t block, size_t slot, int head) {
    return view->k + block * view->block_bytes_k + slot * view->row_bytes_k + (size_t)head * view->head_stride_k;
}

static inline const uint8_t *view_v_row(const bubo_kv_view *view, size_t block, size_t slot, int head) {
    return view->v + block * view->block_bytes_v + slot * view->row_bytes_v + (size_t)head * view->head_stride_v;
}

/* Row i of the group's keys from a stored q8_0 row: its quants into kq [i], its block scales into
 * lane i of kw [block]. */
static void keys_q8_row(const uint8_t *row, int head_dim_k, int i, int8_t *kq, float *kw) {
    const block_q8_0 *blocks = (const block_q8_0 *)row;
    for (int b = 0; b < head_dim_k / QK8_0; b++) {
        bubo_f16 d;
        memcpy(&d, &blocks[b].d, sizeof d);
        memcpy(kq + (size_t)i * head_dim_k + QK8_0 * b, blocks[b].qs, QK8_0);
        kw[(size_t)b * G + i] = bubo_f16_to_f32(d);
    }
}

/* The partial of every token over positions [from, to) (cut to its own range), from a fresh state:
 * m, l [n_rows] and out unnormalized; a token with no position there keeps m = -inf, l = 0, out 0.
 * scratch: the first part of bubo_attend_scratch_floats (all but the chunk partial's rows). */
static void attend_range(const attend_level *level, const bubo_kv_view *view, int kv_head, int head_dim_k,
                         int head_dim_v, int n_tok, const int32_t *kv_begin, const int32_t *kv_end, int32_t from,
                         int32_t to, int n_q, const void *q, size_t q_stride, float kq_scale, float *m, float *l,
                         float *out, size_t out_tok_stride, float *scratch) {
    const bubo_vec_dot_fn vec_dot = bubo_get_vec_dot_isa(view->type, level->isa);
    const bubo_to_float_fn to_float_k = bubo_get_to_float_isa(view->type, level->isa);
    const bubo_to_float_fn to_float = bubo_get_to_float_isa(view->type_v, level->isa);
    const keys_mode mode = keys_for(view, head_dim_k);
    const int bs = view->block_size;
    const int n_rows = n_tok * n_q; /* row t * n_q + h: token t, head h */

    float *vrows = scratch;                         /* [G][head_dim_v] the group's V rows, widened */
    float *scores = vrows + (size_t)G * head_dim_v; /* [n_rows][G] */
    float *p = scores + (size_t)n_rows * G + 2 * (size_t)n_rows; /* [G] (after the m, l the layout keeps) */
    float *kbuf = p + G;                            /* [G][head_dim_k] floats: the group's K rows */
    attend_keys keys = {.hdk = head_dim_k, .kf = kbuf, .kq = (const int8_t *)kbuf,
                        .kw = kbuf + (size_t)G * head_dim_k / 4};
    const scores_fn scores_group = mode == KEYS_Q8 ? level->scores_q8 : level->scores;
    float *c = kbuf + (size_t)G * head_dim_k; /* [n_rows] the rows' rescale factors (in phases) */
    const int phased = level->softmax && n_rows >= ATTEND_ROWS_SPLIT;
    /* a prompt's tile over a cache's head-by-head layout (a head's rows of a block follow each
     * other): a group within one block widens its V rows, and K rows where they are widened, in one
     * conversion each (the same elements, the same values; 3-8% less time for a 512-token prompt's
     * attention, benchmarks/attention_bench.c). A decode step at depth, whose rows come from
     * memory, measured 3-4% slower so: it keeps a row at a time. */
    const int bulk = n_rows >= ATTEND_ROWS_SPLIT && view->row_bytes_k == view->head_bytes_k &&
                     view->row_bytes_v == view->head_bytes_v;
    int32_t first = to, last = from;
    for (int t = 0; t < n_tok; t++) {
        const int32_t b = kv_begin[t] > from ? kv_begin[t] : from, e = kv_end[t] < to ? kv_end[t] : to;
        if (b < e && b < first) first = b;
        if (b < e && e > last) last = e;
        for (int h = 0; h < n_q; h++) {
            m[t * n_q + h] = -INFINITY;
            l[t * n_q + h] = 0.0f;
            for (int j = 0; j < head_dim_v; j++) out[(size_t)t * out_tok_stride + (size_t)h * head_dim_v + j] = 0.0f;
        }
    }
    if (mode != KEYS_VEC_DOT) memset(kbuf, 0, (size_t)G * head_dim_k * sizeof(float)); /* lanes no position fills */
    attend_group g = {.n_q = n_q, .hdv = head_dim_v, .vrows = vrows, .p = p, .out_stride = head_dim_v};

    for (int32_t g0 = first - first % G; g0 < last; g0 += G) {
        int glo = G, ghi = 0; /* the lanes some token attends to */
        for (int t = 0; t < n_tok; t++) {
            int lo, hi;
            token_lanes(g0, kv_begin[t] > from ? kv_begin[t] : from, kv_end[t] < to ? kv_end[t] : to, &lo, &hi);
            if (lo < hi && lo < glo) glo = lo;
            if (lo < hi && hi > ghi) ghi = hi;
        }
        /* the K and V rows of the group after next, asked for ahead (rows from memory: a decode
         * step at depth; a head's rows of a block run in order only block_size rows long) */
        for (int32_t pos = g0 + ATTEND_PREFETCH * G; pos < g0 + (ATTEND_PREFETCH + 1) * G && pos < last; pos++) {
            const size_t pb = (size_t)view->table[pos / bs], ps = (size_t)(pos % bs);
            const uint8_t *kr = view_k_row(view, pb, ps, kv_head), *vr = view_v_row(view, pb, ps, kv_head);
            for (size_t o = 0; o < view->head_bytes_k; o += 64) __builtin_prefetch(kr + o);
            for (size_t o = 0; o < view->head_bytes_v; o += 64) __builtin_prefetch(vr + o);
        }
        size_t block = (size_t)view->table[(g0 + glo) / bs], slot = (size_t)((g0 + glo) % bs);
        const int run = bulk && slot + (size_t)(ghi - glo) <= (size_t)bs; /* the group in one block */
        if (run) {
            to_float(view_v_row(view, block, slot, kv_head), vrows + (size_t)glo * head_dim_v, (ghi - glo) * head_dim_v);
            if (mode == KEYS_WIDEN)
                to_float_k(view_k_row(view, block, slot, kv_head), kbuf + (size_t)glo * head_dim_k, (ghi - glo) * head_dim_k);
        }
        /* row by row: what the run did not widen */
        for (int i = glo; i < ghi && !(run && mode == KEYS_WIDEN); i++, slot++) {
            if (slot == (size_t)bs) block = (size_t)view->table[(g0 + i) / bs], slot = 0;
            const uint8_t *k = view_k_row(view, block, slot, kv_head);
            if (!run) to_float(view_v_row(view, block, slot, kv_head), vrows + (size_t)i * head_dim_v, head_dim_v);
            if (mode == KEYS_WIDEN) {
                to_float_k(k, kbuf + (size_t)i * head_dim_k, head_dim_k);
                continue;
            }
            if (mode == KEYS_Q8) {
                keys_q8_row(k, head_dim_k, i, (int8_t *)kbuf, kbuf + (size_t)G * head_dim_k / 4);
                continue;
            }
            const int32_t pos = g0 + i;
            for (int t = 0; t < n_tok; t++) {
                if (pos < kv_begin[t] || pos >= kv_end[t]) continue;
                const uint8_t *qt = (const uint8_t *)q + (size_t)t * n_q * q_stride;
                for (int h = 0; h < n_q; h++) {
                    float sc;
                    vec_dot(head_dim_k, &sc, k, qt + (size_t)h * q_stride);
                    scores[(size_t)(t * n_q + h) * G + i] = sc * kq_scale;
                }
            }
        }
        /* phase 0: scores (not phased: all of the step per token), 1: the rows' softmax, 2: V sums */
        for (int phase = 0; phase < (phased ? 3 : 1); phase++) {
            if (phase == 1) {
                for (int r0 = 0; r0 < n_rows; r0 += 16) {
                    const int nr = n_rows - r0 < 16 ? n_rows - r0 : 16;
                    uint16_t valid[16];
                    for (int i = 0; i < nr; i++) {
                        const int t = (r0 + i) / n_q;
                        int lo, hi;
                        token_lanes(g0, kv_begin[t] > from ? kv_begin[t] : from, kv_end[t] < to ? kv_end[t] : to, &lo, &hi);
                        valid[i] = lo < hi ? (uint16_t)(((1u << hi) - 1u) & ~((1u << lo) - 1u)) : 0;
                    }
                    level->softmax(nr, valid, scores + (size_t)r0 * G, m + r0, l + r0, c + r0);
                }
                continue;
            }
            for (int t = 0; t < n_tok; t++) {
                token_lanes(g0, kv_begin[t] > from ? kv_begin[t] : from, kv_end[t] < to ? kv_end[t] : to, &g.lo, &g.hi);
                if (g.lo >= g.hi) continue;
                if (phase == 0 && mode != KEYS_VEC_DOT)
                    scores_group(&keys, (const uint8_t *)q + (size_t)t * n_q * q_stride, q_stride, n_q, kq_scale,
                                 scores + (size_t)t * n_q * G);
                g.scores = scores + (size_t)t * n_q * G;
                g.m = m + t * n_q;
                g.l = l + t * n_q;
                g.out = out + (size_t)t * out_tok_stride;
                if (!phased) level->group(&g);
                else if (phase == 2) level->vsum(&g, c + t * n_q);
            }
        }
    }
}

__attribute__((always_inline)) static inline void attend_merge(int n_tok, int n_q, int head_dim_v, float *m, float *l,
                                                              float *out, size_t out_tok_stride, const float *pm,
                                                              const float *pl, const float *pout,
                                                              size_t pout_tok_stride) {
    for (int t = 0; t < n_tok; t++)
        for (int h = 0; h < n_q; h++) {
            const int r = t * n_q + h;
            if (pm[r] == -INFINITY) continue; /* no position of this token in the partial */
            float *o = out + (size_t)t * out_tok_stride + (size_t)h * head_dim_v;
            const float *po = pout + (size_t)t * pout_tok_stride + (size_t)h * head_dim_v;
            if (m[r] == -INFINITY) { /* the first partial: taken as it is */
                m[r] = pm[r];
                l[r] = pl[r];
                for (int j = 0; j < head_dim_v; j++) o[j] = po[j];
                continue;
            }
            const float m_new = fmaxf(m[r], pm[r]);
            const float a = m[r] < m_new ? vm_exp_lanewise(m[r] - m_new) : 1.0f;
            const float b = pm[r] < m_new ? vm_exp_lanewise(pm[r] - m_new) : 1.0f;
            m[r] = m_new;
            l[r] = fmaf(l[r], a, pl[r] * b);
            for (int j = 0; j < head_dim_v; j++) o[j] = fmaf(o[j], a, po[j] * b);
        }
}

#if defined(BUBO_X86)
/* The same steps with the FMA unit doing fmaf (the same IEEE operation, libm's software fmaf
 * otherwise: a call per element). */
BUBO_TARGET_AVX2 static void attend_merge_fma(int n_tok, int n_q, int head_dim_v, float *m, float *l, float *out,
                                              size_t out_tok_stride, const float *pm, const float *pl,
                                              const float *pout, size_t pout_tok_stride) {
    attend_merge(n_tok, n_q, head_dim_v, m, l, out, out_tok_stride, pm, pl, pout, pout_tok_stride);
}
#endif

void bubo_attend_merge(int n_tok, int n_q, int head_dim_v, float *m, float *l, float *out, size_t out_tok_stride,
                       const float *pm, const float *pl, const float *pout, size_t pout_tok_stride) {
#if defined(BUBO_X86)
    if (bubo_ops_best()->isa != BUBO_ISA_SCALAR) {
        attend_merge_fma(n_tok, n_q, head_dim_v, m, l, out, out_tok_stride, pm, pl, pout, pout_tok_stride);
        return;
    }
#endif
    attend_merge(n_tok, n_q, head_dim_v, m, l, out, out_tok_stride, pm, pl, pout, pout_tok_stride);
}

void bubo_attend_normalize(int n_tok, int n_q, int head_dim_v, const float *l, float *out, size_t out_tok_stride) {
    for (int r = 0; r < n_tok * n_q; r++) {
        const float inv_l = 1.0f / l[r];
        float *o = out + (size_t)(r / n_q) * out_tok_stride + (size_t)(r % n_q) * head_dim_v;
        for (int j = 0; j < head_dim_v; j++) o[j] *= inv_l;
    }
}

void bubo_attend_partial_isa(bubo_isa isa, const bubo_kv_view *view, int kv_head, int head_dim_k, int head_dim_v,
                             int n_tok, const int32_t *kv_begin, const int32_t *kv_end, int32_t chunk, int n_q,
                             const void *q, size_t q_stride, float kq_scale, float *m, float *l, float *out,
                             size_t out_tok_stride, float *scratch) {
    attend_range(level_for_isa(isa), view, kv_head, head_dim_k, head_dim_v, n_tok, kv_begin, kv_end, chunk * BUBO_ATTEND_CHUNK,
                 (chunk + 1) * BUBO_ATTEND_CHUNK, n_q, q, q_stride, kq_scale, m, l, out, out_tok_stride, scratch);
}

static void attend_paged(const attend_level *level, const bubo_kv_view *view, int kv_head, int head_dim_k,
                         int head_dim_v, int n_tok, const int32_t *kv_begin, const int32_t *kv_end, int n_q,
                         const void *q, size_t q_stride, float kq_scale, float *out, size_t out_tok_stride,
                         float *scratch) {
    const int n_rows = n_tok * n_q;
    float *m = scratch + (size_t)G * head_dim_v + (size_t)n_rows * G, *l = m + n_rows; /* the running max and sum */
    float *part = scratch + bubo_attend_scratch_floats(n_tok, n_q, head_dim_k, head_dim_v) -
                  (size_t)n_rows * ((size_t)head_dim_v + 2); /* one chunk's partial: out [n_rows][hdv], m, l */
    float *pm = part + (size_t)n_rows * head_dim_v, *pl = pm + n_rows;
    int32_t first = kv_begin[0], last = kv_end[0];
    for (int t = 1; t < n_tok; t++) {
        if (kv_begin[t] < first) first = kv_begin[t];
        if (kv_end[t] > last) last = kv_end[t];
    }
    const int32_t c0 = first / BUBO_ATTEND_CHUNK, c1 = (last - 1) / BUBO_ATTEND_CHUNK;
    if (c0 == c1) { /* one chunk: its partial is the result, before normalizing */
        attend_range(level, view, kv_head, head_dim_k, head_dim_v, n_tok, kv_begin, kv_end, c0 * BUBO_ATTEND_CHUNK,
                     (c0 + 1) * BUBO_ATTEND_CHUNK, n_q, q, q_stride, kq_scale, m, l, out, out_tok_stride, scratch);
    } else {
        for (int r = 0; r < n_rows; r++) m[r] = -INFINITY, l[r] = 0.0f;
        for (int32_t c = c0; c <= c1; c++) {
            attend_range(level, view, kv_head, head_dim_k, head_dim_v, n_tok, kv_begin, kv_end, c * BUBO_ATTEND_CHUNK,
                         (c + 1) * BUBO_ATTEND_CHUNK, n_q, q, q_stride, kq_scale, pm, pl, part,
                         (size_t)n_q * head_dim_v, scratch);
            bubo_attend_merge(n_tok, n_q, head_dim_v, m, l, out, out_tok_stride, pm, pl, part, (size_t)n_q * head_dim_v);
        }
    }
    bubo_attend_normalize(n_tok, n_q, head_dim_v, l, out, out_tok_stride);
}

void bubo_attend_paged_isa(bubo_isa isa, const bubo_kv_view *view, int kv_head, int head_dim_k, int head_dim_v,
                           int n_tok, const int32_t *kv_begin, const int32_t *kv_end, int n_q, const void *q,
                           size_t q_stride, float kq_scale, float *out, size_t out_tok_stride, float *scratch) {
    attend_paged(level_for_isa(isa), view, kv_head, head_dim_k, head_dim_v, n_tok, kv_begin, kv_end, n_q, q, q_stride,
                 kq_scale, out, out_tok_stride, scratch);
}

/* The best level's kernels: the op table picked once (bubo_ops_best). */
void bubo_attend_paged(const bubo_kv_view *view, int kv_head, int head_dim_k, int head_dim_v, int n_tok,
                       const int32_t *kv_begin, const int32_t *kv_end, int n_q, const void *q, size_t q_stride,
                       float kq_scale, float *out, size_t out_tok_stride, float *scratch) {
    attend_paged(bubo_ops_best()->attend, view, kv_head, head_dim_k, head_dim_v, n_tok, kv_begin, kv_end, n_q, q,
                 q_stride, kq_scale, out, out_tok_stride, scratch);
}

void bubo_attend_partial(const bubo_kv_view *view, int kv_head, int head_dim_k, int head_dim_v, int n_tok,
                         const int32_t *kv_begin, const int32_t *kv_end, int32_t chunk, int n_q, const void *q,
                         size_t q_stride, float kq_scale, float *m, float *l, float *out, size_t out_tok_stride,
                         float *scratch) {
    attend_range(bubo_ops_best()->attend, view, kv_head, head_dim_k, head_dim_v, n_tok, kv_begin, kv_end,
                 chunk * BUBO_ATTEND_CHUNK, (chunk + 1) * BUBO_ATTEND_CHUNK, n_q, q, q_stride, kq_scale, m, l, out,
                 out_tok_stride, scratch);
}
