/* Matrix-matrix tiles for the legacy 32-element blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0): the
 * prompt-processing kernels behind bubo_vec_dot_tile_fn.
 *
 * Layout: 16 weight rows sit in the 16 int32 lanes of one register and each token's activations
 * are broadcast 4 bytes at a time, so one vpdpbusd does 4 elements of 16 rows, a weight register
 * serves every token of the tile and an activation load every row of it. The weights of 16 rows
 * by a panel of blocks (up to TILE_PROMPT_PANEL in a prompt, TILE_PANEL in a streamed step of up to
 * TILE_CHUNK tokens) are unpacked once per chunk of TILE_CHUNK tokens into unsigned bytes,
 * transposed so that lane r holds row r:
 *
 *   packed.q[k][g]   lane r = elements 4g..4g+3 of block k of row r (u8)
 *   packed.d[k]      lane r = the row's scale of block k;  packed.m[k] its min (Q4_1, Q5_1)
 *
 * vpdpbusd multiplies unsigned by signed bytes: the weights are the unsigned side (Q8_0 shifted by
 * +128, the nibble types as stored, 0..15 or 0..31) and the activations (int8) the signed one. The
 * shift comes off as off * sum(qy) per block, exact in int32, before the one conversion to float:
 *
 *   Q4_0, Q5_0, Q8_0 (Q8_0 activations): dot += dx * dy * (sum(u * qy) - off * sum(qy))
 *   Q4_1, Q5_1       (Q8_1 activations): dot += dx * dy * sum(q * qy) + mx * sy
 *
 * with off = 8, 16, 128. The results land as 16 contiguous floats per token (s[t][r0..r0+15]),
 * which is the output layout, so a panel's partial sums go back to s and come again for the next
 * panel without any transpose. The micro tile takes one weight register at a time against all its
 * tokens, so their integer sums are TILE_TOKENS independent vpdpbusd chains. Every output takes
 * the same operations in the same order (blocks in ascending order, one fma per block) wherever
 * it sits and whatever the tile shape: padded rows
 * are computed and not stored, the token tail runs the same code with fewer tokens. The one-token
 * kernel (rows_legacy_avx512) and the type's AVX-512 vec_dot run that chain too, so an output's bits
 * do not depend on the batch it came in: the matmul's batch invariance rests on this. */
#ifndef BUBO_LEGACY_TILE_H
#define BUBO_LEGACY_TILE_H

#include "legacy_simd.h"
#include "tile_simd.h"

#if defined(BUBO_X86)

#define TILE_PANEL 8   /* a streamed step's blocks unpacked at once: 256 elements, 4.5 KiB packed, in L1 */
/* A prompt's panels: at most this many blocks (13.5 KiB packed), the row cut into equal panels, so
 * that each output is loaded and stored once per panel (576 columns: one panel of 18 blocks, not
 * 8 + 8 + 2; 1536: 24 + 24). Measured on the AMD EPYC Zen 5: 16 and 32 no better. */
#define TILE_PROMPT_PANEL 24
/* fewer tokens: rows_legacy_avx512, no packing (same bits either way). Packing a block costs about
 * what the rows kernel spends per token on it, so from 2 tokens the tile is cheaper (measured). */
#define TILE_PACK_MIN_TOKENS 2

typedef struct {
    __m512i q[TILE_PROMPT_PANEL][8];
    __m512 d[TILE_PROMPT_PANEL];
    __m512 m[TILE_PROMPT_PANEL];
} packed_panel_avx512;

/* The activations a tile needs per (token, block) beyond the int8 values: Q8_0 stores an f16
 * scale and no sum, so both are computed once per chunk and panel and shared by all row groups.
 * Q8_1 stores d and s as f32, read in place. */
typedef struct {
    float d[TILE_CHUNK][TILE_PROMPT_PANEL];
    int32_t off_sum[TILE_CHUNK][TILE_PROMPT_PANEL]; /* off * sum(qy) */
} q8_0_side_avx512;

/* The same for a streamed step (up to one chunk of TILE_CHUNK tokens: a decode step, a draft's
 * check, a short turn), filled once per column chunk of stream_side_blocks(n_tokens) blocks for
 * all the tokens (token j's block c0 + k at [j * that + k]), so that every row group reads it
 * instead of recomputing it. */
#define TILE_STREAM_SIDE 4096 /* entries: a whole row of up to 16384 columns for up to 8 tokens, 2048 for 64 */
_Static_assert(TILE_STREAM_SIDE / TILE_CHUNK >= TILE_PANEL, "a streamed step's column chunk holds a panel");
typedef struct {
    float d[TILE_STREAM_SIDE];
    int32_t off_sum[TILE_STREAM_SIDE];
} q8_0_stream_side;

static inline int stream_side_blocks(int n_tokens) {
    return TILE_STREAM_SIDE / (n_tokens > TILE_TOKENS ? n_tokens : TILE_TOKENS);
}

/* Where a micro tile reads its tokens' side data: token j, panel block k at [j * stride + k]. */
typedef struct {
    const float *d;
    const int32_t *off_sum;
    int stride;
} side_view;

/* Unpacks 16 rows x kp blocks (from block k0) into packed; rows at or past n_rows read a zero
 * block and get scale 0. */
typedef void (*tile_pack_fn)(packed_panel_avx512 *packed, const uint8_t *x, size_t x_stride, int n_rows,
                             int k0, int kp);

/* The f16 pair at the start of block k of 16 rows: d (low half) and, for Q4_1/Q5_1, m. */
BUBO_TARGET_AVX512 static inline __m512i gather_block_heads_avx512(const uint8_t *x, size_t x_stride, int n_rows,
                                                                   size_t block_offset) {
    const __mmask16 live = n_rows >= TILE_ROWS ? (__mmask16)0xFFFF : (__mmask16)((1u << n_rows) - 1);
    const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                           _mm512_set1_epi32((int)x_stride));
    return _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), live, idx, x + block_offset, 1);
}

BUBO_TARGET_AVX512 static inline __m512 f16_low_halves_avx512(__m512i v) {
    return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v));
}

/* Row i's address of block k, or the zero block past the last row. */
static inline const uint8_t *tile_block(const uint8_t *x, size_t x_stride, int n_rows, int i, size_t block_offset) {
    return i < n_rows ? x + (size_t)i * x_stride + block_offset : tile_zero_block;
}

/* One micro tile: rows of `packed`, nt tokens (t in the chunk), kp blocks from k0; accumulates
 * into s (starting from 0 at the first panel). */
BUBO_TARGET_AVX512 static inline __attribute__((always_inline)) void tile_micro_avx512(
    const packed_panel_avx512 *packed, const int nt, int kp, int first, int n_rows, float *restrict s,
    size_t s_stride, const uint8_t *yt, size_t y_stride, size_t y_block_offset, int with_min,
    side_view side) {
    const __mmask16 live = n_rows >= TILE_ROWS ? (__mmask16)0xFFFF : (__mmask16)((1u << n_rows) - 1);
    __m512 acc[TILE_TOKENS];
#pragma GCC unroll 8
    for (int j = 0; j < nt; j++)
        acc[j] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(live, s + (size_t)j * s_stride);
    const size_t y_size = with_min ? sizeof(block_q8_1) : sizeof(block_q8_0);
    const size_t qs_offset = with_min ? offsetof(block_q8_1, qs) : offsetof(block_q8_0, qs);
    for (int k = 0; k < kp; k++) {
        /* the integer sums: one weight register at a time against every token (nt independent
         * chains: a token's 8 products in one chain would wait on vpdpbusd's latency) */
        const uint8_t *yk = yt + y_block_offset + (size_t)k * y_size;
        __m512i sum[TILE_TOKENS];
#pragma GCC unroll 8
        for (int j = 0; j < nt; j++) sum[j] = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int g = 0; g < 8; g++) {
            const __m512i w = packed->q[k][g];
#pragma GCC unroll 8
            for (int j = 0; j < nt; j++) {
                int32_t four;
                memcpy(&four, yk + (size_t)j * y_stride + qs_offset + 4 * g, 4);
                sum[j] = _mm512_dpbusd_epi32(sum[j], w, _mm512_set1_epi32(four));
            }
        }
#pragma GCC unroll 8
        for (int j = 0; j < nt; j++) {
            const uint8_t *yb = yk + (size_t)j * y_stride;
            if (with_min) {
                const block_q8_1 *b = (const block_q8_1 *)yb;
                acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[j]), _mm512_mul_ps(packed->d[k], _mm512_set1_ps(b->d)), acc[j]);
                acc[j] = _mm512_fmadd_ps(packed->m[k], _mm512_set1_ps(b->s), acc[j]);
            } else {
                const __m512i si = _mm512_sub_epi32(sum[j], _mm512_set1_epi32(side.off_sum[j * side.stride + k]));
                acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(si), _mm512_mul_ps(packed->d[k], _mm512_set1_ps(side.d[j * side.stride + k])), acc[j]);
            }
        }
    }
#pragma GCC unroll 8
    for (int j = 0; j < nt; j++) _mm512_mask_storeu_ps(s + (size_t)j * s_stride, live, acc[j]);
}

/* ---- vec_dot in the tile's order ------------------------------------------------------------
 * The AVX-512 vec_dot of every type with a tile computes each output exactly as a lane of the tile
 * does (the integer block sums are exact in any order; the float chain is the same one), so a
 * token's results do not depend on whether its batch went through the tile or not. */

/* Two blocks x0 . y0 and x1 . y1 (at any addresses) -> int32 lane sums (x0 . y0 in lanes 0-7, x1 . y1
 * in 8-15) whose total per block is the block's integer dot product, offset already taken off. */
typedef __m512i (*legacy_dot2_fn)(const void *x0, const void *x1, const void *y0, const void *y1);

/* The same for the rows kernel, which brings one activation block (in both halves of a) to 16
 * rows: the weights as the tile's unsigned bytes, sum(u * qy) per block, the offset off * sum(qy)
 * taken off once per block for all 16 rows instead of per row. */
typedef __m512i (*legacy_udot2_fn)(const void *x0, const void *x1, __m512i a);

/* dot(row x, token y) over nb blocks: per block, the exact integer sum, then one fma into the
 * running sum with dx * dy (and, with_min, one fma of m * s), blocks in ascending order: the
 * chain of tile_micro_avx512. */
BUBO_TARGET_AVX512 static inline __attribute__((always_inline)) float vec_dot_legacy_avx512(
    int nb, const uint8_t *x, size_t x_size, const uint8_t *y, legacy_dot2_fn dot2, int with_min) {
    const size_t y_size = with_min ? sizeof(block_q8_1) : sizeof(block_q8_0);
    float sums[16] __attribute__((aligned(64)));
    __m128 acc = _mm_setzero_ps();
    for (int k0 = 0; k0 < nb; k0 += 16) {
        const int kb = nb - k0 < 16 ? nb - k0 : 16;
        __m512i z[8];
        for (int p = 0; p < 8; p++) {
            /* past an odd block count, the last block again, in a lane nobody reads */
            const int k = k0 + (2 * p < kb ? 2 * p : kb - 1), k1 = k0 + (2 * p + 1 < kb ? 2 * p + 1 : kb - 1);
            z[p] = dot2(x + (size_t)k * x_size, x + (size_t)k1 * x_size, y + (size_t)k * y_size, y + (size_t)k1 * y_size);
        }
        _mm512_store_ps(sums, _mm512_cvtepi32_ps(sum_16_blocks_avx512(z)));
        for (int j = 0; j < kb; j++) {
            const uint8_t *xb = x + (size_t)(k0 + j) * x_size, *yb = y + (size_t)(k0 + j) * y_size;
            bubo_f16 dx;
            memcpy(&dx, xb, sizeof dx);
            float dy;
            if (with_min) {
                dy = ((const block_q8_1 *)yb)->d;
            } else {
                bubo_f16 dy16;
                memcpy(&dy16, yb, sizeof dy16);
                dy = _cvtsh_ss(dy16);
            }
            acc = _mm_fmadd_ss(_mm_set_ss(sums[j]), _mm_set_ss(_cvtsh_ss(dx) * dy), acc);
            if (with_min) {
                bubo_f16 m;
                memcpy(&m, xb + sizeof(bubo_f16), sizeof m);
                acc = _mm_fmadd_ss(_mm_set_ss(_cvtsh_ss(m)), _mm_set_ss(((const block_q8_1 *)yb)->s), acc);
            }
        }
    }
    return _mm_cvtss_f32(acc);
}

/* sum(qy) of one block's 32 int8 values. */
BUBO_TARGET_AVX512 static inline int sum_q8_block_avx512(__m256i qy) {
    const __m256i sad = _mm256_sad_epu8(_mm256_xor_si256(qy, _mm256_set1_epi8((char)0x80)), _mm256_setzero_si256());
    const __m128i s2 = _mm_add_epi64(_mm256_castsi256_si128(sad), _mm256_extracti128_si256(sad, 1));
    return (int)(_mm_cvtsi128_si64(s2) + _mm_extract_epi64(s2, 1)) - 32 * 128;
}

/* 16 rows read side by side are 16 short streams, which the hardware prefetchers do not follow:
 * while the group at xr (nr rows left from it) works on blocks k..k_end-1 of nb, fetch the same
 * share of the next row group, one contiguous range. */
static inline void prefetch_next_group(const uint8_t *xr, size_t x_stride, int nr, int k, int k_end, int nb) {
    if (nr <= TILE_ROWS) return;
    const size_t span = (size_t)(nr - TILE_ROWS < TILE_ROWS ? nr - TILE_ROWS : TILE_ROWS) * x_stride;
    const uintptr_t next = (uintptr_t)(xr + (size_t)TILE_ROWS * x_stride);
    const uintptr_t from = (next + span * (size_t)k / (size_t)nb) & ~(uintptr_t)63;
    const uintptr_t to = next + span * (size_t)k_end / (size_t)nb;
    for (uintptr_t a = from; a < to; a += 64) _mm_prefetch((const char *)a, _MM_HINT_T0);
}

/* The tile for a few tokens: the same chain per (row, token) as tile_micro_avx512 (16 rows in the
 * lanes of one accumulator, one fma per block), but each block's 16 integer sums come from a
 * reduction tree over untransposed rows instead of a packing, which only pays off when many
 * tokens share it. */
BUBO_TARGET_AVX512 static inline __attribute__((always_inline)) void rows_legacy_avx512(
    int nb, int n_rows, int n_tokens, float *restrict s, size_t s_stride, const uint8_t *x, size_t x_stride,
    size_t x_size, const uint8_t *y, size_t y_stride, legacy_udot2_fn udot2, int with_min, int off_q) {
    const size_t y_size = with_min ? sizeof(block_q8_1) : sizeof(block_q8_0);
    for (int r0 = 0; r0 < n_rows; r0 += TILE_ROWS) {
        const int nr = n_rows - r0;
        const __mmask16 live = nr >= TILE_ROWS ? (__mmask16)0xFFFF : (__mmask16)((1u << nr) - 1);
        const uint8_t *xr = x + (size_t)r0 * x_stride;
        for (int t = 0; t < n_tokens; t++) {
            const uint8_t *yt = y + (size_t)t * y_stride;
            __m512 acc = _mm512_setzero_ps();
            for (int k = 0; k < nb; k++) {
                const size_t off = (size_t)k * x_size;
                const uint8_t *yb = yt + (size_t)k * y_size;
                if (t == 0) prefetch_next_group(xr, x_stride, nr, k, k + 1, nb);
                const __m256i qy = _mm256_loadu_si256((const __m256i *)(with_min ? ((const block_q8_1 *)yb)->qs
                                                                                  : ((const block_q8_0 *)yb)->qs));
                const __m512i a = _mm512_broadcast_i64x4(qy);
                __m512i z[8];
#pragma GCC unroll 8
                for (int p = 0; p < 8; p++)
                    z[p] = udot2(tile_block(xr, x_stride, nr, 2 * p, off), tile_block(xr, x_stride, nr, 2 * p + 1, off), a);
                __m512i isum_i = sum_16_blocks_avx512(z);
                if (!with_min) /* sum(qy) through the unsigned sum of qy + 128, as the tile */
                    isum_i = _mm512_sub_epi32(isum_i, _mm512_set1_epi32(off_q * sum_q8_block_avx512(qy)));
                const __m512 isum = _mm512_cvtepi32_ps(isum_i);
                const __m512i heads = gather_block_heads_avx512(xr, x_stride, nr, off);
                if (with_min) {
                    const block_q8_1 *b = (const block_q8_1 *)yb;
                    acc = _mm512_fmadd_ps(isum, _mm512_mul_ps(f16_low_halves_avx512(heads), _mm512_set1_ps(b->d)), acc);
                    acc = _mm512_fmadd_ps(f16_low_halves_avx512(_mm512_srli_epi32(heads, 16)), _mm512_set1_ps(b->s), acc);
                } else {
                    const float dy = _cvtsh_ss(((const block_q8_0 *)yb)->d);
                    acc = _mm512_fmadd_ps(isum, _mm512_mul_ps(f16_low_halves_avx512(heads), _mm512_set1_ps(dy)), acc);
                }
            }
            _mm512_mask_storeu_ps(s + (size_t)t * s_stride + r0, live, acc);
        }
    }
}

/* off * sum(qy) and dy of nt tokens' blocks k0..k0+kp-1, for the tile's Q8_0 activations:
 * token j's block k0 + k at [j * stride + k]. */
BUBO_TARGET_AVX512 static inline void q8_0_side_fill_avx512(float *d, int32_t *off_sum, int stride, const uint8_t *y,
                                                            size_t y_stride, int nt, int k0, int kp, int off) {
    for (int j = 0; j < nt; j++) {
        const block_q8_0 *b = (const block_q8_0 *)(y + (size_t)j * y_stride) + k0;
        for (int k = 0; k < kp; k++) {
            d[j * stride + k] = _cvtsh_ss(b[k].d);
            off_sum[j * stride + k] = off * sum_q8_block_avx512(_mm256_loadu_si256((const __m256i *)b[k].qs));
        }
    }
}

/* One micro tile of any width 1..TILE_TOKENS, each width a constant for tile_micro_avx512, so that
 * a width's chains interleave in registers instead of running one token at a time. */
BUBO_TARGET_AVX512 static inline __attribute__((always_inline)) void tile_micro_any_avx512(
    const packed_panel_avx512 *packed, int nt, int kp, int first, int n_rows, float *restrict s, size_t s_stride,
    const uint8_t *yt, size_t y_stride, size_t y_block_offset, int with_min, side_view side) {
#define MICRO(w)                                                                                              \
    case w:                                                                                                   \
        tile_micro_avx512(packed, w, kp, first, n_rows, s, s_stride, yt, y_stride, y_block_offset, with_min,  \
                          side);                                                                              \
        break;
    switch (nt) {
        MICRO(1) MICRO(2) MICRO(3) MICRO(4) MICRO(5) MICRO(6) MICRO(7) MICRO(8)
    default: break;
    }
#undef MICRO
}

/* The whole tile. x_size: weight block bytes; with_min: Q8_1 activations (else Q8_0, offset off);
 * prepacked: x holds prepacked groups (below) and `pack` unpacks them, for every token count. */
BUBO_TARGET_AVX512 static inline __attribute__((always_inline)) void tile_legacy_any_avx512(
    int n, int n_rows, int n_tokens, float *restrict s, size_t s_stride, const void *restrict vx, size_t x_stride,
    const void *restrict vy, size_t y_stride, tile_pack_fn pack, legacy_udot2_fn udot2, size_t x_size, int with_min,
    int off, int prepacked) {
    const uint8_t *x = vx, *y = vy;
    const int nb = n / QK8_0;
    if (nb == 0) {
        for (int t = 0; t < n_tokens; t++) memset(s + (size_t)t * s_stride, 0, (size_t)n_rows * sizeof(float));
        return;
    }
    if (!prepacked && n_tokens < TILE_PACK_MIN_TOKENS) {
        rows_legacy_avx512(nb, n_rows, n_tokens, s, s_stride, x, x_stride, x_size, y, y_stride, udot2, with_min, off);
        return;
    }
    const size_t y_size = with_min ? sizeof(block_q8_1) : sizeof(block_q8_0);
    packed_panel_avx512 packed __attribute__((aligned(64)));
    if (n_tokens <= TILE_CHUNK) {
        /* up to one token chunk (a decode step, a draft's check, a short turn): each weight serves
         * that chunk's micro tiles only, so the weights' memory traffic is the cost. A row group's
         * panels in turn (its 16 rows stream in order) while the next group is prefetched, as
         * rows_legacy_avx512 does, each panel serving every token; long rows go in column chunks
         * of stream_side_blocks blocks, the activations' side data filled once per chunk (the
         * chain per output is the same: blocks ascending). The chunked prompt path below reuses a
         * panel across token chunks; with one chunk it would read the weights out of order (Q4_0
         * [8960, 1536] x 9 tokens from memory: 548 us there, 360 us here, Zen 5) */
        q8_0_stream_side side;
        const int cb = stream_side_blocks(n_tokens);
        const uint8_t *end = x + (size_t)((n_rows + TILE_ROWS - 1) / TILE_ROWS) * TILE_ROWS * x_stride;
        const size_t ahead = prefetch_distance(PREPACKED_AHEAD);
        for (int c0 = 0; c0 < nb; c0 += cb) {
            const int c1 = nb - c0 < cb ? nb : c0 + cb;
            if (!with_min) q8_0_side_fill_avx512(side.d, side.off_sum, cb, y, y_stride, n_tokens, c0, c1 - c0, off);
            for (int r0 = 0; r0 < n_rows; r0 += TILE_ROWS) {
                const int nr = n_rows - r0;
                const uint8_t *xr = x + (size_t)r0 * x_stride;
                for (int k0 = c0; k0 < c1; k0 += TILE_PANEL) {
                    const int kp = c1 - k0 < TILE_PANEL ? c1 - k0 : TILE_PANEL;
                    if (prepacked)
                        prefetch_ahead(xr + (size_t)k0 * TILE_ROWS * x_size, (size_t)kp * TILE_ROWS * x_size, end, ahead);
                    else
                        prefetch_next_group(xr, x_stride, nr, k0, k0 + kp, nb);
                    pack(&packed, xr, x_stride, nr, k0, kp);
                    for (int j = 0; j < n_tokens; j += TILE_TOKENS)
                        tile_micro_any_avx512(&packed, n_tokens - j < TILE_TOKENS ? n_tokens - j : TILE_TOKENS, kp, k0 == 0, nr,
                                              s + (size_t)j * s_stride + r0, s_stride, y + (size_t)j * y_stride, y_stride,
                                              (size_t)k0 * y_size, with_min,
                                              (side_view){side.d + j * cb + (k0 - c0), side.off_sum + j * cb + (k0 - c0), cb});
                }
            }
        }
        return;
    }
    q8_0_side_avx512 side;
    /* the row cut into equal panels of at most TILE_PROMPT_PANEL blocks */
    const int n_panels = (nb + TILE_PROMPT_PANEL - 1) / TILE_PROMPT_PANEL, panel = (nb + n_panels - 1) / n_panels;
    for (int t0 = 0; t0 < n_tokens; t0 += TILE_CHUNK) {
        const int nt = n_tokens - t0 < TILE_CHUNK ? n_tokens - t0 : TILE_CHUNK;
        for (int k0 = 0; k0 < nb; k0 += panel) {
            const int kp = nb - k0 < panel ? nb - k0 : panel;
            if (!with_min)
                q8_0_side_fill_avx512(&side.d[0][0], &side.off_sum[0][0], TILE_PROMPT_PANEL, y + (size_t)t0 * y_stride, y_stride,
                                      nt, k0, kp, off);
            for (int r0 = 0; r0 < n_rows; r0 += TILE_ROWS) {
                const int nr = n_rows - r0;
                pack(&packed, x + (size_t)r0 * x_stride, x_stride, nr, k0, kp);
                const uint8_t *yt = y + (size_t)t0 * y_stride;
                float *st = s + (size_t)t0 * s_stride + r0;
                int j = 0;
                for (; j + TILE_TOKENS <= nt; j += TILE_TOKENS)
                    tile_micro_avx512(&packed, TILE_TOKENS, kp, k0 == 0, nr, st + (size_t)j * s_stride, s_stride,
                                      yt + (size_t)j * y_stride, y_stride, (size_t)k0 * y_size, with_min,
                                      (side_view){&side.d[j][0], &side.off_sum[j][0], TILE_PROMPT_PANEL});
                if (j < nt)
                    tile_micro_any_avx512(&packed, nt - j, kp, k0 == 0, nr, st + (size_t)j * s_stride, s_stride,
                                          yt + (size_t)j * y_stride, y_stride, (size_t)k0 * y_size, with_min,
                                          (side_view){&side.d[j][0], &side.off_sum[j][0], TILE_PROMPT_PANEL});
            }
        }
    }
}

/* The tile of weight rows in place. */
BUBO_TARGET_AVX512 static inline __attribute__((always_inline)) void tile_legacy_avx512(
    int n, int n_rows, int n_tokens, float *restrict s, size_t s_stride, const void *restrict vx, size_t x_stride,
    const void *restrict vy, size_t y_stride, tile_pack_fn pack, legacy_udot2_fn udot2, size_t x_size, int with_min,
    int off) {
    tile_legacy_any_avx512(n, n_rows, n_tokens, s, s_stride, vx, x_stride, vy, y_stride, pack, udot2, x_size, with_min,
                           off, 0);
}

/* ---- prepacked weights -------------------------------------------------------------------------
 * A matrix multiplied many times (a model's weights) can be packed once, at load: each group of 16
 * rows becomes, block after block, what `pack` makes of that block (the panel's bytes; for 4- and
 * 5-bit types two low nibbles a byte, and for 5-bit types the fifth bits as 8 byte masks of 64
 * bits), then the 16 rows' d and, with a min, m as f16. That is exactly the bytes of the 16 rows'
 * blocks (288 for Q4_0, 320 for Q4_1, 352 for Q5_0, 384 for Q5_1, 544 for Q8_0), so group g still
 * starts at row 16 g's offset; the last group is padded to 16 rows. Unpacking a panel from it is a few
 * loads, masks and shifts instead of a transpose and a gather, and every token count takes the
 * tile (one token too): the panel holds the same values either way, so the results are the same
 * bits as from the rows in place. */

/* Bytes of the values of one block of a group (nbits 4, 5 or 8); d and m follow. */
static inline size_t prepacked_q_bytes(int nbits) { return nbits == 8 ? 512 : nbits == 5 ? 320 : 256; }

BUBO_TARGET_AVX512 static inline __attribute__((always_inline)) void prepack_legacy_avx512(
    const uint8_t *x, size_t x_stride, int64_t rows, int nb, uint8_t *dst, tile_pack_fn pack, size_t x_size,
    int nbits, int with_m) {
    packed_panel_avx512 p __attribute__((aligned(64)));
    const size_t qb = prepacked_q_bytes(nbits);
    const __m512i low = _mm512_set1_epi8(0x0F);
    for (int64_t r0 = 0; r0 < rows; r0 += TILE_ROWS) {
        const int nr = rows - r0 < TILE_ROWS ? (int)(rows - r0) : TILE_ROWS;
        uint8_t *g = dst + (size_t)r0 * x_stride;
        for (int k = 0; k < nb; k++) {
            pack(&p, x + (size_t)r0 * x_stride, x_stride, nr, k, 1);
            uint8_t *b = g + (size_t)k * TILE_ROWS * x_size;
            if (nbits < 8) {
                for (int i = 0; i < 4; i++)
                    _mm512_storeu_si512(b + 64 * i, _mm512_or_si512(_mm512_and_si512(p.q[0][2 * i], low),
                                                                    _mm512_slli_epi16(_mm512_and_si512(p.q[0][2 * i + 1], low), 4)));
                if (nbits == 5)
                    for (int i = 0; i < 8; i++) {
                        const uint64_t hi = _mm512_test_epi8_mask(p.q[0][i], _mm512_set1_epi8(0x10));
                        memcpy(b + 256 + 8 * i, &hi, 8);
                    }
            } else {
                for (int i = 0; i < 8; i++) _mm512_storeu_si512(b + 64 * i, p.q[0][i]);
            }
            _mm256_storeu_si256((__m256i *)(b + qb), _mm512_cvtps_ph(p.d[0], _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
            if (with_m)
                _mm256_storeu_si256((__m256i *)(b + qb + 32),
                                    _mm512_cvtps_ph(p.m[0], _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        }
    }
}

/* The panel of blocks k0 .. k0+kp-1 of the prepacked group at g (a tile_pack_fn's work). */
BUBO_TARGET_AVX512 static inline __attribute__((always_inline)) void unpack_prepacked_avx512(
    packed_panel_avx512 *p, const uint8_t *g, int k0, int kp, size_t x_size, int nbits, int with_m) {
    const size_t qb = prepacked_q_bytes(nbits);
    const __m512i low = _mm512_set1_epi8(0x0F);
    for (int k = 0; k < kp; k++) {
        const uint8_t *b = g + (size_t)(k0 + k) * TILE_ROWS * x_size;
        if (nbits < 8) {
            for (int i = 0; i < 4; i++) {
                const __m512i z = _mm512_loadu_si512(b + 64 * i);
                p->q[k][2 * i] = _mm512_and_si512(z, low);
                p->q[k][2 * i + 1] = _mm512_and_si512(_mm512_srli_epi16(z, 4), low);
            }
            if (nbits == 5)
                for (int i = 0; i < 8; i++) {
                    uint64_t hi;
                    memcpy(&hi, b + 256 + 8 * i, 8);
                    p->q[k][i] = _mm512_mask_add_epi8(p->q[k][i], (__mmask64)hi, p->q[k][i], _mm512_set1_epi8(0x10));
                }
        } else {
            for (int i = 0; i < 8; i++) p->q[k][i] = _mm512_loadu_si512(b + 64 * i);
        }
        p->d[k] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(b + qb)));
        if (with_m) p->m[k] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(b + qb + 32)));
    }
}

/* Row r's original blocks (the type's own bytes) from the prepacked groups at `packed`: the inverse
 * of prepack_legacy_avx512, for the rows a model also looks up (a tied token_embd). Lane r % 16 of
 * a block's panel holds the row's values in element order, dword i = elements 4i .. 4i+3. */
BUBO_TARGET_AVX512 static inline __attribute__((always_inline)) void prepacked_row_avx512(
    const uint8_t *packed, size_t x_stride, int64_t r, int nb, uint8_t *dst, size_t x_size, int nbits, int with_m) {
    const uint8_t *g = packed + (size_t)(r / TILE_ROWS) * TILE_ROWS * x_stride;
    const int lane = (int)(r % TILE_ROWS);
    const size_t qb = prepacked_q_bytes(nbits);
    packed_panel_avx512 p __attribute__((aligned(64)));
    uint8_t bytes[64] __attribute__((aligned(64)));
    for (int k = 0; k < nb; k++) {
        unpack_prepacked_avx512(&p, g, k, 1, x_size, nbits, with_m);
        uint8_t q[32];
        for (int i = 0; i < 8; i++) {
            _mm512_store_si512(bytes, p.q[0][i]);
            memcpy(q + 4 * i, bytes + 4 * lane, 4);
        }
        const uint8_t *b = g + (size_t)k * TILE_ROWS * x_size;
        uint8_t *o = dst + (size_t)k * x_size;
        memcpy(o, b + qb + 2 * lane, 2); /* d, then m: the stored f16 bits */
        o += 2;
        if (with_m) {
            memcpy(o, b + qb + 32 + 2 * lane, 2);
            o += 2;
        }
        if (nbits == 8) {
            for (int j = 0; j < 32; j++) o[j] = q[j] ^ 0x80;
            continue;
        }
        if (nbits == 5) {
            uint32_t qh = 0;
            for (int j = 0; j < 32; j++) qh |= (uint32_t)(q[j] >> 4) << j;
            memcpy(o, &qh, 4);
            o += 4;
        }
        for (int j = 0; j < 16; j++) o[j] = (uint8_t)((q[j] & 0x0F) | (q[j + 16] & 0x0F) << 4);
    }
}

/* A type's prepack, its unpack (a tile_pack_fn), its tile over prepacked groups and its row rebuild:
 * NAME_prepack_avx512, NAME_unpack_avx512, NAME_tile_prepacked_avx512, NAME_prepacked_row_avx512. PACK, UDOT2, WITH_MIN and OFF as tile_legacy_avx512
 * takes them; NBITS: the bits of a value (4, 5 or 8). */
#define BUBO_PREPACKED_LEGACY(NAME, BLOCK, PACK, UDOT2, NBITS, WITH_MIN, OFF)                                        \
    BUBO_TARGET_AVX512 static void NAME##_prepack_avx512(const void *restrict x, size_t x_stride, int64_t rows, int n, \
                                                         void *restrict dst) {                                        \
        prepack_legacy_avx512(x, x_stride, rows, n / QK8_0, dst, PACK, sizeof(BLOCK), NBITS, WITH_MIN);            \
    }                                                                                                                 \
    BUBO_TARGET_AVX512 static inline __attribute__((always_inline)) void NAME##_unpack_avx512(                       \
        packed_panel_avx512 *p, const uint8_t *x, size_t x_stride, int n_rows, int k0, int kp) {                      \
        (void)x_stride;                                                                                               \
        (void)n_rows;                                                                                                 \
        unpack_prepacked_avx512(p, x, k0, kp, sizeof(BLOCK), NBITS, WITH_MIN);                                     \
    }                                                                                                                 \
    BUBO_TARGET_AVX512 static void NAME##_tile_prepacked_avx512(int n, int n_rows, int n_tokens, float *restrict s,   \
                                                                size_t s_stride, const void *restrict x,              \
                                                                size_t x_stride, const void *restrict y,              \
                                                                size_t y_stride) {                                    \
        tile_legacy_any_avx512(n, n_rows, n_tokens, s, s_stride, x, x_stride, y, y_stride, NAME##_unpack_avx512,      \
                               UDOT2, sizeof(BLOCK), WITH_MIN, OFF, 1);                                               \
    }                                                                                                                 \
    BUBO_TARGET_AVX512 static void NAME##_prepacked_row_avx512(const void *restrict packed, size_t x_stride,          \
                                                               int64_t r, int n, void *restrict dst) {                \
        prepacked_row_avx512(packed, x_stride, r, n / QK8_0, dst, sizeof(BLOCK), NBITS, WITH_MIN);                   \
    }

#endif /* BUBO_X86 */

#endif
