/* Matrix-matrix tiles for the k-quants against Q8_K activations, the layout of legacy_tile.h
 * (16 weight rows in the int32 lanes, tokens broadcast) applied to 256-element super-blocks.
 *
 * Every k-quant's super-block is, per 16-element subgroup j, an unsigned q times an integer
 * scale sc[j], less an integer m[j] times the subgroup's activation sum (bsums), all under two
 * float factors of the row: value = dx * sc[j] * q - dm * m[j]. So one engine serves them and
 * each type only unpacks:
 *
 *   Q4_K: q 0..15, sc = scale[g], m = min[g] (g = j / 2), dx = d, dm = dmin
 *   Q6_K: q 0..63, sc = scale[j], m = 32 * scale[j],       dx = dm = d
 *
 *   dot += dy * (dx * sum_j sc[j] * sum(q * qy over j) - dm * sum_j m[j] * bsum[j])
 *
 * The two integer sums are exact in int32 (as in the scalar kernels); sum_j m[j] * bsum[j] is
 * one vpdpwssd per pair of subgroups, the bsums broadcast straight from the Q8_K block, or, in
 * Q4_K's prompt path (one m per 32-element group), one per pair of groups (kq_group_sums,
 * kq_group_mins): the same integer.
 *
 * Per output the float work is fixed: per super-block in ascending order, acc += float(isum) *
 * (dx * dy), then acc -= float(msum) * (dm * dy), each one fma. The AVX-512 vec_dots and rows
 * kernels of Q4_K and Q6_K run the same chain (kq_chain_step), so the tile and vec_dot give every output the same bits
 * and the matmul's results do not depend on the batch. */
#ifndef BUBO_KQUANT_TILE_H
#define BUBO_KQUANT_TILE_H

#include "tile_simd.h"

#if defined(BUBO_X86)

#define KQ_ROWS_MAX_TOKENS 8 /* tokens one kq_rows_fn call takes */

/* What a k-quant's tile may rely on (its flags): */
#define KQ_GROUPS32 1 /* one m per 32-element group (Q4_K): the mins' sums a pair of groups at a time */
#define KQ_DOT16 2    /* a subgroup's 16 products sum within int16 (Q4_K: 16 x 15 x 127 < 2^15): the
                         scale's multiply and the add are one vpdpwssd, the scale the low half of its
                         int32 lane (< 64), the sum's high half (its sign) times the zero above it */

/* One weight row x against nt (1..KQ_ROWS_MAX_TOKENS) tokens of Q8_K activations y (y_stride
 * bytes apart): s[t * s_stride] = vec_dot(x, y_t), each with vec_dot's bits; the weights are
 * unpacked once per super-block for all nt tokens. */
typedef void (*kq_rows_fn)(int n, int nt, float *restrict s, size_t s_stride, const void *restrict x,
                           const void *restrict y, size_t y_stride);

/* A kq_rows_fn body: calls the always_inline kernel fn(n, nt, ...) with nt a literal, so that
 * each width keeps its accumulators in registers. */
#define KQ_ROWS_DISPATCH(fn, nt, n, s, s_stride, x, y, y_stride)                                  \
    do {                                                                                          \
        switch (nt) {                                                                             \
        case 1: fn(n, 1, s, s_stride, x, y, y_stride); break;                                     \
        case 2: fn(n, 2, s, s_stride, x, y, y_stride); break;                                     \
        case 3: fn(n, 3, s, s_stride, x, y, y_stride); break;                                     \
        case 4: fn(n, 4, s, s_stride, x, y, y_stride); break;                                     \
        case 5: fn(n, 5, s, s_stride, x, y, y_stride); break;                                     \
        case 6: fn(n, 6, s, s_stride, x, y, y_stride); break;                                     \
        case 7: fn(n, 7, s, s_stride, x, y, y_stride); break;                                     \
        case 8: fn(n, 8, s, s_stride, x, y, y_stride); break;                                     \
        default: break;                                                                           \
        }                                                                                         \
    } while (0)

typedef struct {
    __m512i q[8][8];    /* [32-element group][dword]: lane r = 4 u8 of row r */
    __m512i sc[16];     /* [subgroup]: lane r = row r's scale (int32) */
    __m512i m_pair[8];  /* [subgroup pair]: lane r = m[2i] | m[2i+1] << 16 (int16 each) */
    __m512 dx, dm;
} packed_kq_avx512;

/* Unpacks one super-block of one row: q[256] unsigned, sc[16], m[16], and its two factors. */
typedef void (*kq_unpack_fn)(const void *block, uint8_t q[QK_K], int32_t sc[16], int16_t m[16], float *dx,
                             float *dm);

/* The panel of a prepacked group's super-block at b (see "prepacked k-quants" below) without its
 * values: the scales, mins and factors (sc, m_pair, dx, dm). */
typedef void (*kq_panel_fn)(packed_kq_avx512 *p, const uint8_t *b);

/* A type's 4 value registers of subgroup j (elements 16j..16j+15) of a prepacked group's
 * super-block at b, as kq_pack_avx512 places them at p->q[j / 2][4 * (j % 2)]: the micro tile
 * unpacks them in registers as it reads them. Storing the panel's values and loading them back
 * cost more than unpacking them again for every 8 tokens (AMD EPYC Zen 4, tile_bench.c, one
 * thread in L2: Q4_K 1 token 40 -> 72 G multiply-adds/s, 8 tokens 117 -> 142, 512 tokens
 * 136 -> 148; Q6_K 26 -> 54, 98 -> 133, 126 -> 135). */
typedef void (*kq_values_fn)(const uint8_t *b, int j, __m512i q[4]);

BUBO_TARGET_AVX512 static inline void kq_pack_avx512(packed_kq_avx512 *p, const uint8_t *x, size_t x_stride,
                                                     int n_rows, size_t block_offset, kq_unpack_fn unpack) {
    static const uint8_t zero_super_block[256] __attribute__((aligned(64)));
    uint8_t q[TILE_ROWS][QK_K] __attribute__((aligned(64)));
    int32_t sc[16][TILE_ROWS] __attribute__((aligned(64)));
    int16_t m[8][TILE_ROWS][2] __attribute__((aligned(64)));
    float dx[TILE_ROWS] __attribute__((aligned(64))), dm[TILE_ROWS] __attribute__((aligned(64)));
    for (int r = 0; r < TILE_ROWS; r++) {
        int32_t rsc[16];
        int16_t rm[16];
        if (r < n_rows) {
            unpack(x + (size_t)r * x_stride + block_offset, q[r], rsc, rm, &dx[r], &dm[r]);
        } else {
            memcpy(q[r], zero_super_block, QK_K);
            memset(rsc, 0, sizeof rsc);
            memset(rm, 0, sizeof rm);
            dx[r] = dm[r] = 0.0f;
        }
        for (int j = 0; j < 16; j++) {
            sc[j][r] = rsc[j];
            m[j / 2][r][j % 2] = rm[j];
        }
    }
    for (int g = 0; g < 8; g++) {
        __m512i z[8];
        for (int i = 0; i < 8; i++)
            z[i] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_load_si256((const __m256i *)(q[i] + 32 * g))),
                                      _mm256_load_si256((const __m256i *)(q[i + 8] + 32 * g)), 1);
        transpose_rows_avx512(z, p->q[g]);
    }
    for (int j = 0; j < 16; j++) p->sc[j] = _mm512_load_si512(sc[j]);
    for (int i = 0; i < 8; i++) p->m_pair[i] = _mm512_load_si512(m[i]);
    p->dx = _mm512_load_ps(dx);
    p->dm = _mm512_load_ps(dm);
}

/* nt tokens of one super-block, accumulated into s (from 0 when first). msum from the bsums, one
 * vpdpwssd per pair of subgroups; or, for a type whose 32-element groups share one m (gm given:
 * kq_group_mins), one per pair of groups from the tokens' group sums gs (kq_group_sums, 4 a
 * token). The values from p->q, or, with values given, from the prepacked super-block at b. */
BUBO_TARGET_AVX512 static inline __attribute__((always_inline)) void kq_micro_avx512(
    const packed_kq_avx512 *p, const int nt, int first, int n_rows, float *restrict s, size_t s_stride,
    const uint8_t *yt, size_t y_stride, const __m512i *gm, const int32_t *gs, kq_values_fn values, const uint8_t *b,
    const int flags) {
    const __mmask16 live = n_rows >= TILE_ROWS ? (__mmask16)0xFFFF : (__mmask16)((1u << n_rows) - 1);
    __m512i isum[TILE_TOKENS], msum[TILE_TOKENS];
#pragma GCC unroll 8
    for (int t = 0; t < nt; t++) isum[t] = msum[t] = _mm512_setzero_si512();
    for (int j = 0; j < 16; j++) {
        __m512i qv[4];
        const __m512i *q = qv;
        if (values)
            values(b, j, qv);
        else
            q = &p->q[j / 2][4 * (j % 2)];
#pragma GCC unroll 8
        for (int t = 0; t < nt; t++) {
            const int8_t *qy = ((const block_q8_K *)(yt + (size_t)t * y_stride))->qs + 16 * j;
            __m512i dot = _mm512_setzero_si512();
#pragma GCC unroll 4
            for (int g = 0; g < 4; g++) {
                int32_t four;
                memcpy(&four, qy + 4 * g, 4);
                dot = _mm512_dpbusd_epi32(dot, q[g], _mm512_set1_epi32(four));
            }
            /* (one vpdpwssd a step is a chain of its latency: for a few tokens, not enough chains) */
            isum[t] = (flags & KQ_DOT16) && nt >= 4 ? _mm512_dpwssd_epi32(isum[t], dot, p->sc[j])
                                                    : _mm512_add_epi32(isum[t], _mm512_mullo_epi32(dot, p->sc[j]));
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < nt; t++) {
        const block_q8_K *b = (const block_q8_K *)(yt + (size_t)t * y_stride);
        if (gm) {
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++)
                msum[t] = _mm512_dpwssd_epi32(msum[t], gm[j], _mm512_set1_epi32(gs[4 * t + j]));
        } else {
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) {
                int32_t pair;
                memcpy(&pair, &b->bsums[2 * i], 4);
                msum[t] = _mm512_dpwssd_epi32(msum[t], p->m_pair[i], _mm512_set1_epi32(pair));
            }
        }
        const __m512 dy = _mm512_set1_ps(b->d);
        __m512 acc = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(live, s + (size_t)t * s_stride);
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[t]), _mm512_mul_ps(p->dx, dy), acc);
        acc = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(msum[t]), _mm512_mul_ps(p->dm, dy), acc);
        _mm512_mask_storeu_ps(s + (size_t)t * s_stride, live, acc);
    }
}

/* The micro tile over nt (1..8) tokens with nt a literal in each case (its chains interleave). */
#define KQ_MICRO_ANY(packed, nt, first, nr, st, s_stride, yt, y_stride, gm, gs, values, b, flags)                   \
    do {                                                                                                     \
        switch (nt) {                                                                                        \
        case 1: kq_micro_avx512(packed, 1, first, nr, st, s_stride, yt, y_stride, gm, gs, values, b, flags); break; \
        case 2: kq_micro_avx512(packed, 2, first, nr, st, s_stride, yt, y_stride, gm, gs, values, b, flags); break; \
        case 3: kq_micro_avx512(packed, 3, first, nr, st, s_stride, yt, y_stride, gm, gs, values, b, flags); break; \
        case 4: kq_micro_avx512(packed, 4, first, nr, st, s_stride, yt, y_stride, gm, gs, values, b, flags); break; \
        case 5: kq_micro_avx512(packed, 5, first, nr, st, s_stride, yt, y_stride, gm, gs, values, b, flags); break; \
        case 6: kq_micro_avx512(packed, 6, first, nr, st, s_stride, yt, y_stride, gm, gs, values, b, flags); break; \
        case 7: kq_micro_avx512(packed, 7, first, nr, st, s_stride, yt, y_stride, gm, gs, values, b, flags); break; \
        case 8: kq_micro_avx512(packed, 8, first, nr, st, s_stride, yt, y_stride, gm, gs, values, b, flags); break; \
        default: break;                                                                                      \
        }                                                                                                    \
    } while (0)

/* For a type whose m_pair holds (m, m) per 32-element group (Q4_K): lane r = (m[2j], m[2j+1]) of
 * row r in gm[j] (two groups' mins, int16 each), to meet the pairs of group sums kq_group_sums
 * makes. */
BUBO_TARGET_AVX512 static inline void kq_group_mins(const packed_kq_avx512 *p, __m512i gm[4]) {
    for (int j = 0; j < 4; j++)
        gm[j] = _mm512_mask_blend_epi16(0xAAAAAAAA, p->m_pair[2 * j], p->m_pair[2 * j + 1]);
}

/* The prompt path of both tiles: chunks of TILE_CHUNK tokens, super-block by super-block, each row
 * group's panel serving the chunk's micro tiles. The panel is packed from the rows in place by
 * unpack, or, from prepacked groups, made by panel with the values by values: either unpack or
 * panel and values are given. flags: the type's KQ_ flags; with KQ_GROUPS32 the chunk's group
 * sums are made once per super-block: the same integers. */
BUBO_TARGET_AVX512 static inline __attribute__((always_inline)) void kq_prompt_avx512(
    int nb, int n_rows, int n_tokens, float *restrict s, size_t s_stride, const uint8_t *x, size_t x_stride,
    const uint8_t *y, size_t y_stride, size_t x_size, kq_unpack_fn unpack, kq_panel_fn panel, kq_values_fn values,
    const int flags) {
    packed_kq_avx512 packed __attribute__((aligned(64)));
    __m512i gm[4];
    int32_t gs[TILE_CHUNK * 4] __attribute__((aligned(64)));
    for (int t0 = 0; t0 < n_tokens; t0 += TILE_CHUNK) {
        const int nt = n_tokens - t0 < TILE_CHUNK ? n_tokens - t0 : TILE_CHUNK;
        for (int k = 0; k < nb; k++) {
            const uint8_t *yt = y + (size_t)t0 * y_stride + (size_t)k * sizeof(block_q8_K);
            if (flags & KQ_GROUPS32)
                for (int t = 0; t < nt; t++)
                    _mm_storeu_si128((__m128i *)(gs + 4 * t), kq_group_sums((const block_q8_K *)(yt + (size_t)t * y_stride)));
            for (int r0 = 0; r0 < n_rows; r0 += TILE_ROWS) {
                const int nr = n_rows - r0;
                const uint8_t *b = panel ? x + (size_t)r0 * x_stride + (size_t)k * TILE_ROWS * x_size : NULL;
                if (panel)
                    panel(&packed, b);
                else
                    kq_pack_avx512(&packed, x + (size_t)r0 * x_stride, x_stride, nr, (size_t)k * x_size, unpack);
                if (flags & KQ_GROUPS32) kq_group_mins(&packed, gm);
                float *st = s + (size_t)t0 * s_stride + r0;
                int t = 0;
                for (; t + TILE_TOKENS <= nt; t += TILE_TOKENS)
                    kq_micro_avx512(&packed, TILE_TOKENS, k == 0, nr, st + (size_t)t * s_stride, s_stride,
                                    yt + (size_t)t * y_stride, y_stride, (flags & KQ_GROUPS32) ? gm : NULL, gs + 4 * t,
                                    values, b, flags);
                /* the tail as one micro tile of a constant width (its chains interleave) */
                KQ_MICRO_ANY(&packed, nt - t, k == 0, nr, st + (size_t)t * s_stride, s_stride, yt + (size_t)t * y_stride,
                             y_stride, (flags & KQ_GROUPS32) ? gm : NULL, gs + 4 * t, values, b, flags);
            }
        }
    }
}

/* The whole tile. Below pack_min_tokens tokens (the type's measured crossover: its packing is
 * dearer than re-running the rows kernel's unpack for a few tokens) it runs `rows`, else packs. */
BUBO_TARGET_AVX512 static inline __attribute__((always_inline)) void tile_kquant_avx512(
    int n, int n_rows, int n_tokens, float *restrict s, size_t s_stride, const void *restrict vx, size_t x_stride,
    const void *restrict vy, size_t y_stride, size_t x_size, kq_unpack_fn unpack, kq_rows_fn rows,
    int pack_min_tokens, const int flags) {
    const uint8_t *x = vx, *y = vy;
    const int nb = n / QK_K;
    if (nb == 0) {
        for (int t = 0; t < n_tokens; t++) memset(s + (size_t)t * s_stride, 0, (size_t)n_rows * sizeof(float));
        return;
    }
    if (n_tokens < pack_min_tokens) {
        /* the rows kernel runs the same chain (kq_chain_step); row by row, the weights stream
         * from memory in order, which a large output matrix needs */
        for (int r = 0; r < n_rows; r++)
            for (int t0 = 0; t0 < n_tokens; t0 += KQ_ROWS_MAX_TOKENS)
                rows(n, n_tokens - t0 < KQ_ROWS_MAX_TOKENS ? n_tokens - t0 : KQ_ROWS_MAX_TOKENS,
                     &s[(size_t)t0 * s_stride + r], s_stride, x + (size_t)r * x_stride, y + (size_t)t0 * y_stride,
                     y_stride);
        return;
    }
    kq_prompt_avx512(nb, n_rows, n_tokens, s, s_stride, x, x_stride, y, y_stride, x_size, unpack, NULL, NULL, flags);
}

/* ---- prepacked k-quants ------------------------------------------------------------------------
 * As legacy_tile.h does for the 32-element types: a model's matrices are packed once at load, per
 * group of 16 rows and super-block, into a form whose values a micro tile unpacks in registers
 * with a few loads, masks and shifts (kq_values_fn: transposed into the lanes, 4-bit pairs a byte)
 * and whose scales and factors (per-row planes) make the rest of the panel (kq_panel_fn), exactly
 * as many bytes as the 16 rows' super-blocks; group g
 * starts at row 16 g's offset, the last group padded. Every token count takes the tile (one too):
 * the same bits as the rows in place (the chain is kq_chain_step's either way). */

/* Writes one super-block of a group (16 x_size bytes at b) from its panel p and the rows it came from. */
typedef void (*kq_compress_fn)(const packed_kq_avx512 *p, const uint8_t *x, size_t x_stride, int n_rows,
                               size_t block_offset, uint8_t *b);

BUBO_TARGET_AVX512 static inline __attribute__((always_inline)) void kq_prepack_avx512(
    const uint8_t *x, size_t x_stride, int64_t rows, int nb, uint8_t *dst, size_t x_size, kq_unpack_fn unpack,
    kq_compress_fn compress) {
    packed_kq_avx512 p __attribute__((aligned(64)));
    for (int64_t r0 = 0; r0 < rows; r0 += TILE_ROWS) {
        const int nr = rows - r0 < TILE_ROWS ? (int)(rows - r0) : TILE_ROWS;
        for (int k = 0; k < nb; k++) {
            kq_pack_avx512(&p, x + (size_t)r0 * x_stride, x_stride, nr, (size_t)k * x_size, unpack);
            compress(&p, x + (size_t)r0 * x_stride, x_stride, nr, (size_t)k * x_size,
                     dst + (size_t)r0 * x_stride + (size_t)k * TILE_ROWS * x_size);
        }
    }
}

/* Stores 4-bit values (the panel's q, each byte < 16) two a byte: 2048 bytes at b. */
BUBO_TARGET_AVX512 static inline void kq_store_nibbles(const packed_kq_avx512 *p, uint8_t *b) {
    const __m512i low = _mm512_set1_epi8(0x0F);
    for (int g = 0; g < 8; g++)
        for (int i = 0; i < 4; i++)
            _mm512_storeu_si512(b + 64 * (4 * g + i),
                                _mm512_or_si512(_mm512_and_si512(p->q[g][2 * i], low),
                                                _mm512_slli_epi16(_mm512_and_si512(p->q[g][2 * i + 1], low), 4)));
}

/* The low 4 bits of values q[i] (i < 4) of subgroup j, from the two stores of kq_store_nibbles
 * they come from: a kq_values_fn of the 4-bit types (and the low bits of Q6_K's). */
BUBO_TARGET_AVX512 static inline __attribute__((always_inline)) void kq_nibble_values(const uint8_t *b, int j,
                                                                                     __m512i q[4]) {
    const __m512i low = _mm512_set1_epi8(0x0F);
    for (int i = 0; i < 2; i++) {
        const __m512i z = _mm512_loadu_si512(b + 64 * (4 * (j / 2) + 2 * (j % 2) + i));
        q[2 * i] = _mm512_and_si512(z, low);
        q[2 * i + 1] = _mm512_and_si512(_mm512_srli_epi16(z, 4), low);
    }
}

BUBO_TARGET_AVX512 static inline __attribute__((always_inline)) void tile_kquant_prepacked_avx512(
    int n, int n_rows, int n_tokens, float *restrict s, size_t s_stride, const void *restrict vx, size_t x_stride,
    const void *restrict vy, size_t y_stride, size_t x_size, kq_panel_fn panel, kq_values_fn values, const int flags) {
    const uint8_t *x = vx, *y = vy;
    const int nb = n / QK_K;
    if (nb == 0) {
        for (int t = 0; t < n_tokens; t++) memset(s + (size_t)t * s_stride, 0, (size_t)n_rows * sizeof(float));
        return;
    }
    packed_kq_avx512 packed __attribute__((aligned(64)));
    const size_t group_block = (size_t)TILE_ROWS * x_size; /* one super-block of a group */
    if (n_tokens <= TILE_CHUNK) {
        /* up to one token chunk (a decode step, a draft's check, a short turn): the groups'
         * super-blocks stream in address order, each piece's scales unpacked once for every token. The
         * chunked prompt path below reuses a chunk's weights from L2 across token chunks; with one
         * chunk it has nothing to reuse and reads the weights out of order (Q6_K [151936, 1536] x 9
         * tokens from memory: 13.4 ms there, 6.1 ms here, Zen 5) */
        const size_t ahead = prefetch_distance(PREPACKED_AHEAD);
        const uint8_t *end = x + (size_t)((n_rows + TILE_ROWS - 1) / TILE_ROWS) * TILE_ROWS * x_stride;
        for (int r0 = 0; r0 < n_rows; r0 += TILE_ROWS) {
            const int nr = n_rows - r0;
            const uint8_t *xr = x + (size_t)r0 * x_stride;
            for (int k = 0; k < nb; k++) {
                const uint8_t *b = xr + (size_t)k * group_block;
                prefetch_ahead(b, group_block, end, ahead);
                touch_lines(b, group_block);
                panel(&packed, b);
                for (int t = 0; t < n_tokens; t += TILE_TOKENS)
                    KQ_MICRO_ANY(&packed, n_tokens - t < TILE_TOKENS ? n_tokens - t : TILE_TOKENS, k == 0, nr,
                                 s + (size_t)t * s_stride + r0, s_stride,
                                 y + (size_t)t * y_stride + (size_t)k * sizeof(block_q8_K), y_stride, NULL, NULL, values, b,
                                 flags);
            }
        }
        return;
    }
    kq_prompt_avx512(nb, n_rows, n_tokens, s, s_stride, x, x_stride, y, y_stride, x_size, NULL, panel, values, flags);
}

/* A k-quant's prepack and its tile over prepacked groups, NAME_prepack_avx512 and
 * NAME_tile_prepacked_avx512, from its kq_unpack_NAME_avx512 (a kq_unpack_fn), kq_compress_NAME
 * (a kq_compress_fn), kq_panel_prepacked_NAME (a kq_panel_fn) and kq_values_prepacked_NAME (a
 * kq_values_fn); FLAGS its KQ_ flags. */
#define BUBO_PREPACKED_KQUANT(NAME, BLOCK, FLAGS)                                                                                \
    BUBO_TARGET_AVX512 static void NAME##_prepack_avx512(const void *restrict x, size_t x_stride, int64_t rows, int n, \
                                                         void *restrict dst) {                                        \
        kq_prepack_avx512(x, x_stride, rows, n / QK_K, dst, sizeof(BLOCK), kq_unpack_##NAME##_avx512,                 \
                          kq_compress_##NAME);                                                                        \
    }                                                                                                                 \
    BUBO_TARGET_AVX512 static void NAME##_tile_prepacked_avx512(int n, int n_rows, int n_tokens, float *restrict s,   \
                                                                size_t s_stride, const void *restrict x,              \
                                                                size_t x_stride, const void *restrict y,              \
                                                                size_t y_stride) {                                    \
        tile_kquant_prepacked_avx512(n, n_rows, n_tokens, s, s_stride, x, x_stride, y, y_stride, sizeof(BLOCK),       \
                                     kq_panel_prepacked_##NAME, kq_values_prepacked_##NAME, FLAGS);                   \
    }

/* One super-block's step of the chain kq_micro_avx512 runs in each lane, for the AVX-512 vec_dots:
 * isum is the total of 16 int32 lanes, msum of 8. Given the same exact integer sums, a vec_dot
 * gives each output the bits the tile gives it. */
BUBO_TARGET_AVX512 static inline __m128 kq_chain_step(__m128 acc, __m512i isum, __m256i msum, float dx, float dm, float dy) {
    /* both totals in one reduction: isum folded to 8 lanes beside msum's 8 */
    __m512i h = _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_add_epi32(_mm512_castsi512_si256(isum), _mm512_extracti64x4_epi64(isum, 1))), msum, 1);
    h = _mm512_add_epi32(h, _mm512_shuffle_i32x4(h, h, _MM_SHUFFLE(2, 3, 0, 1)));
    h = _mm512_add_epi32(h, _mm512_shuffle_epi32(h, _MM_PERM_BADC));
    h = _mm512_add_epi32(h, _mm512_shuffle_epi32(h, _MM_PERM_CDAB));
    const __m128 f = _mm_cvtepi32_ps(_mm512_castsi512_si128(h));                 /* isum in lane 0 */
    const __m128 g = _mm_cvtepi32_ps(_mm512_extracti32x4_epi32(h, 2));            /* msum in lane 0 */
    acc = _mm_fmadd_ss(f, _mm_set_ss(dx * dy), acc);
    return _mm_fnmadd_ss(g, _mm_set_ss(dm * dy), acc);
}

#endif /* BUBO_X86 */

#endif
