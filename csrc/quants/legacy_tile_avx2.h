/* Prepacked tiles of the legacy 32-element blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) for CPUs whose
 * best level is AVX2 (no VNNI).
 *
 * The groups have legacy_tile.h's layout, byte for byte (its prepack comment): per 16 rows and
 * block, the values as the AVX-512 panel's unsigned bytes, then the 16 rows' d and m. A 64-byte
 * piece of it is one zmm of 16 rows; its first 32 bytes are rows 0-7 and its last 32 rows 8-15,
 * so a half group of 8 rows reads one ymm per piece: dword r = 4 elements of row r. The groups
 * are written here by an 8 x 8 dword transpose per half group and block, and a row is rebuilt
 * from them in plain C.
 *
 * One vpmaddubsw multiplies 4 elements of 8 rows by one token's 4 activations broadcast. The
 * unsigned 4- and 5-bit values add up their int16 pair sums while they cannot overflow (8 of
 * them for 4 bits: 8 x 2 x 15 x 127 < 2^15; 4 for 5 bits), then one vpmaddwd by ones widens them.
 * Q8_0's unsigned bytes (x + 128) would saturate vpmaddubsw, so its panel holds |x| and x, and
 * the token's bytes take x's sign (vpsignb): the exact sum(x * qy), no offset to take off.
 *
 * The chain per output is legacy_tile.h's: blocks in ascending order,
 * acc = fma(float(isum), dx * dy, acc) and, with a min, acc = fma(m, s, acc), with isum the
 * block's exact integer dot product. The AVX2 vec_dots of these types run it too
 * (vec_dot_legacy_chain_avx2), so the rows in place, the packed tile at any token count and the
 * AVX-512 kernels give every output the same bits. */
#ifndef BUBO_LEGACY_TILE_AVX2_H
#define BUBO_LEGACY_TILE_AVX2_H

#include "kquant_tile_avx2.h"
#include "legacy_simd.h"
#include "legacy_tile.h"

#if defined(BUBO_X86)

/* ---- the groups ------------------------------------------------------------------ */

/* Row r's own blocks from the groups at `packed` (the inverse of prepack_legacy_avx2 below). Element e
 * of row r is byte e % 4 of dword r % 16 of the block's panel register e / 4. */
static inline void prepacked_row_legacy_portable(const uint8_t *packed, size_t x_stride, int64_t r, int nb, uint8_t *dst,
                                                 size_t x_size, int nbits, int with_m) {
    const uint8_t *g0 = packed + (size_t)(r / TILE_ROWS) * TILE_ROWS * x_stride;
    const int lane = (int)(r % TILE_ROWS);
    const size_t qb = prepacked_q_bytes(nbits);
    for (int k = 0; k < nb; k++) {
        const uint8_t *b = g0 + (size_t)k * TILE_ROWS * x_size;
        uint8_t u[32];
        for (int e = 0; e < 32; e++) {
            const int g = e / 4, at = 4 * lane + e % 4;
            if (nbits == 8) {
                u[e] = b[64 * g + at];
                continue;
            }
            u[e] = (uint8_t)((b[64 * (g / 2) + at] >> (4 * (g % 2))) & 0x0F);
            if (nbits == 5) u[e] |= (uint8_t)(((b[256 + 8 * g + at / 8] >> (at % 8)) & 1) << 4);
        }
        uint8_t *o = dst + (size_t)k * x_size;
        memcpy(o, b + qb + 2 * lane, 2);
        o += 2;
        if (with_m) {
            memcpy(o, b + qb + 32 + 2 * lane, 2);
            o += 2;
        }
        if (nbits == 8) {
            for (int j = 0; j < 32; j++) o[j] = u[j] ^ 0x80;
            continue;
        }
        if (nbits == 5) {
            uint32_t qh = 0;
            for (int j = 0; j < 32; j++) qh |= (uint32_t)(u[j] >> 4) << j;
            memcpy(o, &qh, 4);
            o += 4;
        }
        for (int j = 0; j < 16; j++) o[j] = (uint8_t)((u[j] & 0x0F) | (u[j + 16] & 0x0F) << 4);
    }
}

/* The same groups from AVX2: per half group and block, the 8 rows' values (one ymm each, element
 * order) transposed as 8 x 8 dwords into the panel's registers, then stored as the layout has them. */
BUBO_TARGET_AVX2 static inline __attribute__((always_inline)) void prepack_legacy_avx2(
    const uint8_t *x, size_t x_stride, int64_t rows, int nb, uint8_t *dst, size_t x_size, int nbits, int with_m) {
    const size_t qb = prepacked_q_bytes(nbits), head = 2 + (with_m ? 2 : 0);
    const __m256i low = _mm256_set1_epi8(0x0F);
    for (int64_t r0 = 0; r0 < rows; r0 += TILE_ROWS) {
        const int nr = rows - r0 < TILE_ROWS ? (int)(rows - r0) : TILE_ROWS;
        for (int k = 0; k < nb; k++) {
            uint8_t *b = dst + (size_t)r0 * x_stride + (size_t)k * TILE_ROWS * x_size;
            uint16_t d[TILE_ROWS] = {0}, m[TILE_ROWS] = {0};
            for (int h = 0; h < 2; h++) {
                __m256i v[8], t[8], u[8], q[8];
                for (int i = 0; i < 8; i++) {
                    const int r = KQ2_ROWS * h + i;
                    if (r >= nr) {
                        v[i] = _mm256_setzero_si256();
                        continue;
                    }
                    const uint8_t *blk = x + (size_t)(r0 + r) * x_stride + (size_t)k * x_size;
                    memcpy(&d[r], blk, 2);
                    if (with_m) memcpy(&m[r], blk + 2, 2);
                    if (nbits == 8)
                        v[i] = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(blk + head)), _mm256_set1_epi8((char)0x80));
                    else if (nbits == 5)
                        v[i] = _mm256_or_si256(nibbles_avx2(blk + head + 4),
                                               _mm256_and_si256(bits_to_bytes_avx2(blk + head), _mm256_set1_epi8(0x10)));
                    else
                        v[i] = nibbles_avx2(blk + head);
                }
                for (int i = 0; i < 8; i += 2) { /* per 128-bit lane: dwords of rows i, i+1 interleaved */
                    t[i] = _mm256_unpacklo_epi32(v[i], v[i + 1]);
                    t[i + 1] = _mm256_unpackhi_epi32(v[i], v[i + 1]);
                }
                for (int a = 0; a < 2; a++) { /* u[4a + j]: dword j (and j + 4) of rows 4a .. 4a+3 */
                    u[4 * a + 0] = _mm256_unpacklo_epi64(t[4 * a + 0], t[4 * a + 2]);
                    u[4 * a + 1] = _mm256_unpackhi_epi64(t[4 * a + 0], t[4 * a + 2]);
                    u[4 * a + 2] = _mm256_unpacklo_epi64(t[4 * a + 1], t[4 * a + 3]);
                    u[4 * a + 3] = _mm256_unpackhi_epi64(t[4 * a + 1], t[4 * a + 3]);
                }
                for (int j = 0; j < 4; j++) {
                    q[j] = _mm256_permute2x128_si256(u[j], u[4 + j], 0x20);
                    q[j + 4] = _mm256_permute2x128_si256(u[j], u[4 + j], 0x31);
                }
                if (nbits == 8) {
                    for (int g = 0; g < 8; g++) _mm256_storeu_si256((__m256i *)(b + 64 * g + 32 * h), q[g]);
                    continue;
                }
                for (int i = 0; i < 4; i++)
                    _mm256_storeu_si256((__m256i *)(b + 64 * i + 32 * h),
                                        _mm256_or_si256(_mm256_and_si256(q[2 * i], low),
                                                        _mm256_slli_epi16(_mm256_and_si256(q[2 * i + 1], low), 4)));
                if (nbits == 5)
                    for (int g = 0; g < 8; g++) {
                        const uint32_t hi = (uint32_t)_mm256_movemask_epi8(_mm256_slli_epi16(q[g], 3));
                        memcpy(b + 256 + 8 * g + 4 * h, &hi, 4);
                    }
            }
            memcpy(b + qb, d, sizeof d);
            if (with_m) memcpy(b + qb + 32, m, sizeof m);
        }
    }
}

/* ---- the tile ----------------------------------------------------------------------------------- */

/* Decode steps of up to this many tokens take a whole group at once
 * (legacy2_micro2): in the tile alone (benchmarks/tile_bench.c, [4864, 896] in cache, AMD EPYC
 * Zen 5 at AVX2) Q4_0 and Q4_1 run 1.9x as fast at 1 token and 1.7x at 2 as half by half through
 * a panel (1.1x from memory), Q5_0 and Q5_1 1.6x and 1.4x, Q8_0 1.65x and 1.55x (1.2x from
 * memory). */
#define LEGACY2_PAIR_TOKENS 2

/* One half group's panel: up to TILE_PROMPT_PANEL blocks of 8 rows (TILE_PANEL in a streamed step). q: the unsigned values (Q8_0: x);
 * ax: Q8_0's |x|. */
typedef struct {
    __m256i q[TILE_PROMPT_PANEL][8];
    __m256i ax[TILE_PROMPT_PANEL][8];
    __m256 d[TILE_PROMPT_PANEL], m[TILE_PROMPT_PANEL];
} legacy2_panel;

/* Blocks k0 .. k0+kp-1 of half h of the group at g. */
BUBO_TARGET_AVX2 static inline __attribute__((always_inline)) void legacy2_unpack(legacy2_panel *p, const uint8_t *g,
                                                                                  int h, int k0, int kp, size_t x_size,
                                                                                  int nbits, int with_m) {
    const size_t qb = prepacked_q_bytes(nbits);
    const __m256i low = _mm256_set1_epi8(0x0F);
    for (int k = 0; k < kp; k++) {
        const uint8_t *b = g + (size_t)(k0 + k) * TILE_ROWS * x_size;
        if (nbits == 8) {
            for (int i = 0; i < 8; i++) {
                const __m256i x = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(b + 64 * i + 32 * h)),
                                                   _mm256_set1_epi8((char)0x80));
                p->q[k][i] = x;
                p->ax[k][i] = _mm256_sign_epi8(x, x);
            }
        } else {
            for (int i = 0; i < 4; i++) {
                const __m256i z = _mm256_loadu_si256((const __m256i *)(b + 64 * i + 32 * h));
                p->q[k][2 * i] = _mm256_and_si256(z, low);
                p->q[k][2 * i + 1] = _mm256_and_si256(_mm256_srli_epi16(z, 4), low);
            }
            if (nbits == 5)
                for (int i = 0; i < 8; i++)
                    p->q[k][i] = _mm256_or_si256(
                        p->q[k][i], _mm256_and_si256(bits_to_bytes_avx2(b + 256 + 8 * i + 4 * h), _mm256_set1_epi8(0x10)));
        }
        p->d[k] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + qb + 16 * h)));
        if (with_m) p->m[k] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + qb + 32 + 16 * h)));
    }
}

/* sum(qy) of one block's 32 int8 values. */
BUBO_TARGET_AVX2 static inline int sum_q8_block_avx2(const int8_t *qs) {
    const __m256i qy = _mm256_loadu_si256((const __m256i *)qs);
    const __m256i sad = _mm256_sad_epu8(_mm256_xor_si256(qy, _mm256_set1_epi8((char)0x80)), _mm256_setzero_si256());
    const __m128i s2 = _mm_add_epi64(_mm256_castsi256_si128(sad), _mm256_extracti128_si256(sad, 1));
    return (int)(_mm_cvtsi128_si64(s2) + _mm_extract_epi64(s2, 1)) - 32 * 128;
}

/* dy and off * sum(qy) of nt tokens' Q8_0 blocks k0 .. k0+kp-1: token j's block k0 + k at
 * [j * stride + k] (off 0: Q8_0 weights, whose sum needs no offset). */
BUBO_TARGET_AVX2 static inline void legacy2_side_fill(float *d, int32_t *off_sum, int stride, const uint8_t *y,
                                                      size_t y_stride, int nt, int k0, int kp, int off) {
    for (int j = 0; j < nt; j++) {
        const block_q8_0 *b = (const block_q8_0 *)(y + (size_t)j * y_stride) + k0;
        for (int k = 0; k < kp; k++) {
            d[j * stride + k] = _cvtsh_ss(b[k].d);
            off_sum[j * stride + k] = off ? off * sum_q8_block_avx2(b[k].qs) : 0;
        }
    }
}

/* One micro tile: nt (1..KQ2_TOKENS, a literal at each call) tokens by the panel's 8 rows, kp
 * blocks from the activations' block offset y_block_offset; accumulated into s (from 0 when
 * first). */
BUBO_TARGET_AVX2 static inline __attribute__((always_inline)) void legacy2_micro(
    const legacy2_panel *p, const int nt, int kp, int first, __m256i live, float *restrict s, size_t s_stride,
    const uint8_t *yt, size_t y_stride, size_t y_block_offset, int nbits, int with_min, side_view side) {
    const __m256i ones = _mm256_set1_epi16(1);
    const size_t y_size = with_min ? sizeof(block_q8_1) : sizeof(block_q8_0);
    __m256 acc[KQ2_TOKENS];
#pragma GCC unroll 4
    for (int t = 0; t < nt; t++) acc[t] = first ? _mm256_setzero_ps() : kq2_load_out(s + (size_t)t * s_stride, live, 0);
    for (int k = 0; k < kp; k++) {
        const int8_t *qy[KQ2_TOKENS];
        __m256i isum[KQ2_TOKENS];
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++) {
            const uint8_t *yb = yt + (size_t)t * y_stride + y_block_offset + (size_t)k * y_size;
            qy[t] = with_min ? ((const block_q8_1 *)yb)->qs : ((const block_q8_0 *)yb)->qs;
            isum[t] = _mm256_setzero_si256();
        }
        if (nbits == 8) {
#pragma GCC unroll 8
            for (int g = 0; g < 8; g++)
#pragma GCC unroll 4
                for (int t = 0; t < nt; t++) {
                    isum[t] = _mm256_add_epi32(
                        isum[t], _mm256_madd_epi16(_mm256_maddubs_epi16(p->ax[k][g], _mm256_sign_epi8(kq2_bcast4(qy[t] + 4 * g), p->q[k][g])),
                                                   ones));
                    KQ2_KEEP(isum[t]);
                }
        } else {
            /* 4 bits: all 8 registers' int16 sums; 5 bits: 4 at a time */
            const int run = nbits == 4 ? 8 : 4;
#pragma GCC unroll 2
            for (int g0 = 0; g0 < 8; g0 += run) {
                __m256i s16[KQ2_TOKENS];
#pragma GCC unroll 4
                for (int t = 0; t < nt; t++) s16[t] = _mm256_setzero_si256();
#pragma GCC unroll 8
                for (int g = g0; g < g0 + run; g++)
#pragma GCC unroll 4
                    for (int t = 0; t < nt; t++) {
                        s16[t] = _mm256_add_epi16(s16[t], _mm256_maddubs_epi16(p->q[k][g], kq2_bcast4(qy[t] + 4 * g)));
                        KQ2_KEEP(s16[t]);
                    }
#pragma GCC unroll 4
                for (int t = 0; t < nt; t++) isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(s16[t], ones));
            }
        }
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++) {
            if (with_min) {
                const block_q8_1 *b = (const block_q8_1 *)(yt + (size_t)t * y_stride + y_block_offset + (size_t)k * y_size);
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), _mm256_mul_ps(p->d[k], _mm256_set1_ps(b->d)), acc[t]);
                acc[t] = _mm256_fmadd_ps(p->m[k], _mm256_set1_ps(b->s), acc[t]);
            } else {
                const __m256i sum = _mm256_sub_epi32(isum[t], _mm256_set1_epi32(side.off_sum[t * side.stride + k]));
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(p->d[k], _mm256_set1_ps(side.d[t * side.stride + k])),
                                         acc[t]);
            }
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < nt; t++) kq2_store_out(s + (size_t)t * s_stride, live, 0, acc[t]);
}

/* legacy2_micro with nt a literal in each case. */
BUBO_TARGET_AVX2 static inline __attribute__((always_inline)) void legacy2_micro_any(
    const legacy2_panel *p, int nt, int kp, int first, __m256i live, float *restrict s, size_t s_stride,
    const uint8_t *yt, size_t y_stride, size_t y_block_offset, int nbits, int with_min, side_view side) {
#define LEGACY2_MICRO(w)                                                                                           \
    case w:                                                                                                        \
        legacy2_micro(p, w, kp, first, live, s, s_stride, yt, y_stride, y_block_offset, nbits, with_min, side);    \
        break;
    switch (nt) {
        LEGACY2_MICRO(1) LEGACY2_MICRO(2) LEGACY2_MICRO(3) LEGACY2_MICRO(4)
    default: break;
    }
#undef LEGACY2_MICRO
}

/* A decode step of nt (1..LEGACY2_PAIR_TOKENS, a literal at each call) tokens over kp blocks of a
 * whole group (16 rows), unpacked in registers as they are read instead of into a panel, each
 * token's broadcast activations serving both halves; into s's 16 outputs per token. Each output's
 * chain is legacy2_micro's, step for step: the same bits (5-bit values' int16 sums widened every
 * 4 registers, 8-bit ones' every register, as there). */
BUBO_TARGET_AVX2 static inline __attribute__((always_inline)) void legacy2_micro2(
    const uint8_t *xr, int k0, int kp, size_t x_size, const int nt, int first, float *restrict s, size_t s_stride,
    const uint8_t *yt, size_t y_stride, size_t y_block_offset, int nbits, int with_min, side_view side) {
    const __m256i ones = _mm256_set1_epi16(1);
    const size_t y_size = with_min ? sizeof(block_q8_1) : sizeof(block_q8_0), qb = prepacked_q_bytes(nbits);
    __m256 acc0[LEGACY2_PAIR_TOKENS], acc1[LEGACY2_PAIR_TOKENS];
#pragma GCC unroll 2
    for (int t = 0; t < nt; t++) {
        acc0[t] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(s + (size_t)t * s_stride);
        acc1[t] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(s + (size_t)t * s_stride + KQ2_ROWS);
    }
    for (int k = 0; k < kp; k++) {
        const uint8_t *b = xr + (size_t)(k0 + k) * TILE_ROWS * x_size;
        const int8_t *qy[LEGACY2_PAIR_TOKENS];
        __m256i s0[LEGACY2_PAIR_TOKENS], s1[LEGACY2_PAIR_TOKENS], i0[LEGACY2_PAIR_TOKENS], i1[LEGACY2_PAIR_TOKENS];
#pragma GCC unroll 2
        for (int t = 0; t < nt; t++) {
            const uint8_t *yb = yt + (size_t)t * y_stride + y_block_offset + (size_t)k * y_size;
            qy[t] = with_min ? ((const block_q8_1 *)yb)->qs : ((const block_q8_0 *)yb)->qs;
            s0[t] = s1[t] = i0[t] = i1[t] = _mm256_setzero_si256();
        }
        if (nbits == 8) { /* |x| times y with x's sign, as legacy2_micro: one register g of 4 elements at a time */
#pragma GCC unroll 8
            for (int g = 0; g < 8; g++) {
                const __m256i x0 = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(b + 64 * g)),
                                                    _mm256_set1_epi8((char)0x80));
                const __m256i x1 = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(b + 64 * g + 32)),
                                                    _mm256_set1_epi8((char)0x80));
                const __m256i ax0 = _mm256_sign_epi8(x0, x0), ax1 = _mm256_sign_epi8(x1, x1);
#pragma GCC unroll 2
                for (int t = 0; t < nt; t++) {
                    const __m256i y = kq2_bcast4(qy[t] + 4 * g);
                    i0[t] = _mm256_add_epi32(i0[t], _mm256_madd_epi16(_mm256_maddubs_epi16(ax0, _mm256_sign_epi8(y, x0)), ones));
                    KQ2_KEEP(i0[t]);
                    i1[t] = _mm256_add_epi32(i1[t], _mm256_madd_epi16(_mm256_maddubs_epi16(ax1, _mm256_sign_epi8(y, x1)), ones));
                    KQ2_KEEP(i1[t]);
                }
            }
        }
#pragma GCC unroll 4
        for (int i = 0; i < 4 && nbits != 8; i++) { /* register i of each half: elements 8i..8i+3 low, 8i+4..8i+7 high */
            const int8_t *a[LEGACY2_PAIR_TOKENS];
#pragma GCC unroll 2
            for (int t = 0; t < nt; t++) a[t] = qy[t] + 8 * i;
            const __m256i z0 = _mm256_loadu_si256((const __m256i *)(b + 64 * i));
            const __m256i z1 = _mm256_loadu_si256((const __m256i *)(b + 64 * i + 32));
            if (nbits == 4) {
                kq2_nibbles2(z0, z1, nt, a, s0, s1);
            } else { /* 5 bits: each value's fifth bit from the group's bit planes (register g = 2i, 2i + 1) */
                const __m256i m4 = _mm256_set1_epi8(0x0F), m5 = _mm256_set1_epi8(0x10);
                const __m256i h0l = _mm256_and_si256(bits_to_bytes_avx2(b + 256 + 16 * i), m5);
                const __m256i h1l = _mm256_and_si256(bits_to_bytes_avx2(b + 256 + 16 * i + 4), m5);
                const __m256i h0h = _mm256_and_si256(bits_to_bytes_avx2(b + 256 + 16 * i + 8), m5);
                const __m256i h1h = _mm256_and_si256(bits_to_bytes_avx2(b + 256 + 16 * i + 12), m5);
                kq2_step2(_mm256_or_si256(_mm256_and_si256(z0, m4), h0l), _mm256_or_si256(_mm256_and_si256(z1, m4), h1l),
                          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(z0, 4), m4), h0h),
                          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(z1, 4), m4), h1h), nt, a, s0, s1);
            }
            if (i == 3 || (nbits == 5 && i == 1)) { /* the int16 sums widened before they could overflow: 4-bit
                                                      values' after all 8 registers, 5-bit ones' every 4 */
#pragma GCC unroll 2
                for (int t = 0; t < nt; t++) {
                    i0[t] = _mm256_add_epi32(i0[t], _mm256_madd_epi16(s0[t], ones));
                    i1[t] = _mm256_add_epi32(i1[t], _mm256_madd_epi16(s1[t], ones));
                    s0[t] = s1[t] = _mm256_setzero_si256();
                }
            }
        }
        const __m256 d0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + qb)));
        const __m256 d1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + qb + 16)));
        const __m256 m0 = with_min ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + qb + 32))) : d0;
        const __m256 m1 = with_min ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + qb + 48))) : d1;
#pragma GCC unroll 2
        for (int t = 0; t < nt; t++) {
            if (with_min) {
                const block_q8_1 *yb = (const block_q8_1 *)(yt + (size_t)t * y_stride + y_block_offset + (size_t)k * y_size);
                const __m256 dy = _mm256_set1_ps(yb->d), sy = _mm256_set1_ps(yb->s);
                acc0[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i0[t]), _mm256_mul_ps(d0, dy), acc0[t]);
                acc1[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i1[t]), _mm256_mul_ps(d1, dy), acc1[t]);
                acc0[t] = _mm256_fmadd_ps(m0, sy, acc0[t]);
                acc1[t] = _mm256_fmadd_ps(m1, sy, acc1[t]);
            } else {
                const __m256i off = _mm256_set1_epi32(side.off_sum[t * side.stride + k]);
                const __m256 dy = _mm256_set1_ps(side.d[t * side.stride + k]);
                acc0[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(i0[t], off)), _mm256_mul_ps(d0, dy), acc0[t]);
                acc1[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(i1[t], off)), _mm256_mul_ps(d1, dy), acc1[t]);
            }
        }
    }
#pragma GCC unroll 2
    for (int t = 0; t < nt; t++) {
        _mm256_storeu_ps(s + (size_t)t * s_stride, acc0[t]);
        _mm256_storeu_ps(s + (size_t)t * s_stride + KQ2_ROWS, acc1[t]);
    }
}

/* The tile over prepacked groups. Up to one chunk of TILE_CHUNK tokens (a decode step, a draft's
 * check, a short turn) streams each group's panels in address order (steps of 1-2 tokens a whole
 * group's blocks at once, without a panel), prefetching KQ2_AHEAD bytes on, each panel serving
 * every token, the activations' side data filled once per column chunk of stream_side_blocks
 * blocks; more tokens go in chunks of TILE_CHUNK tokens, panel by panel, each half group's panel
 * unpacked once for the chunk. */
BUBO_TARGET_AVX2 static inline __attribute__((always_inline)) void tile_legacy_prepacked_avx2(
    int n, int n_rows, int n_tokens, float *restrict s, size_t s_stride, const void *restrict vx, size_t x_stride,
    const void *restrict vy, size_t y_stride, size_t x_size, int nbits, int with_min, int off) {
    const uint8_t *x = vx, *y = vy;
    const int nb = n / QK8_0;
    if (nb == 0) {
        for (int t = 0; t < n_tokens; t++) memset(s + (size_t)t * s_stride, 0, (size_t)n_rows * sizeof(float));
        return;
    }
    const size_t y_size = with_min ? sizeof(block_q8_1) : sizeof(block_q8_0);
    const size_t group_block = (size_t)TILE_ROWS * x_size;
    legacy2_panel p __attribute__((aligned(32)));
    if (n_tokens <= TILE_CHUNK) {
        q8_0_stream_side side;
        const int cb = stream_side_blocks(n_tokens);
        const uint8_t *end = x + (size_t)((n_rows + TILE_ROWS - 1) / TILE_ROWS) * TILE_ROWS * x_stride;
        const size_t ahead = prefetch_distance(KQ2_AHEAD);
        for (int c0 = 0; c0 < nb; c0 += cb) {
            const int c1 = nb - c0 < cb ? nb : c0 + cb;
            if (!with_min) legacy2_side_fill(side.d, side.off_sum, cb, y, y_stride, n_tokens, c0, c1 - c0, off);
            for (int r0 = 0; r0 < n_rows; r0 += TILE_ROWS) {
                const uint8_t *xr = x + (size_t)r0 * x_stride;
                for (int k0 = c0; k0 < c1; k0 += TILE_PANEL) {
                    const int kp = c1 - k0 < TILE_PANEL ? c1 - k0 : TILE_PANEL;
                    prefetch_ahead(xr + (size_t)k0 * group_block, (size_t)kp * group_block, end, ahead);
                    if (n_tokens >= 1 && n_tokens <= LEGACY2_PAIR_TOKENS && r0 + TILE_ROWS <= n_rows) {
                        const side_view sv = {side.d + (k0 - c0), side.off_sum + (k0 - c0), cb};
                        if (n_tokens == 1)
                            legacy2_micro2(xr, k0, kp, x_size, 1, k0 == 0, s + r0, s_stride, y, y_stride,
                                           (size_t)k0 * y_size, nbits, with_min, sv);
                        else
                            legacy2_micro2(xr, k0, kp, x_size, 2, k0 == 0, s + r0, s_stride, y, y_stride,
                                           (size_t)k0 * y_size, nbits, with_min, sv);
                        continue;
                    }
                    for (int h = 0; h < 2 && r0 + KQ2_ROWS * h < n_rows; h++) {
                        const int rh = r0 + KQ2_ROWS * h;
                        legacy2_unpack(&p, xr, h, k0, kp, x_size, nbits, with_min);
                        for (int t = 0; t < n_tokens; t += KQ2_TOKENS)
                            legacy2_micro_any(&p, n_tokens - t < KQ2_TOKENS ? n_tokens - t : KQ2_TOKENS, kp, k0 == 0,
                                              kq2_live(n_rows - rh), s + (size_t)t * s_stride + rh, s_stride,
                                              y + (size_t)t * y_stride, y_stride, (size_t)k0 * y_size, nbits, with_min,
                                              (side_view){side.d + t * cb + (k0 - c0), side.off_sum + t * cb + (k0 - c0), cb});
                    }
                }
            }
        }
        return;
    }
    q8_0_side_avx512 side;
    /* equal panels of at most TILE_PROMPT_PANEL blocks, as the AVX-512 tile cuts them */
    const int n_panels = (nb + TILE_PROMPT_PANEL - 1) / TILE_PROMPT_PANEL, panel = (nb + n_panels - 1) / n_panels;
    for (int t0 = 0; t0 < n_tokens; t0 += TILE_CHUNK) {
        const int nt = n_tokens - t0 < TILE_CHUNK ? n_tokens - t0 : TILE_CHUNK;
        const uint8_t *yc = y + (size_t)t0 * y_stride;
        for (int k0 = 0; k0 < nb; k0 += panel) {
            const int kp = nb - k0 < panel ? nb - k0 : panel;
            if (!with_min)
                legacy2_side_fill(&side.d[0][0], &side.off_sum[0][0], TILE_PROMPT_PANEL, yc, y_stride, nt, k0, kp, off);
            for (int r0 = 0; r0 < n_rows; r0 += KQ2_ROWS) {
                const int h = r0 % TILE_ROWS ? 1 : 0;
                const __m256i live = kq2_live(n_rows - r0);
                legacy2_unpack(&p, x + (size_t)(r0 - KQ2_ROWS * h) * x_stride, h, k0, kp, x_size, nbits, with_min);
                float *st = s + (size_t)t0 * s_stride + r0;
                int j = 0;
                for (; j + KQ2_TOKENS <= nt; j += KQ2_TOKENS)
                    legacy2_micro(&p, KQ2_TOKENS, kp, k0 == 0, live, st + (size_t)j * s_stride, s_stride,
                                  yc + (size_t)j * y_stride, y_stride, (size_t)k0 * y_size, nbits, with_min,
                                  (side_view){&side.d[j][0], &side.off_sum[j][0], TILE_PROMPT_PANEL});
                if (j < nt)
                    legacy2_micro_any(&p, nt - j, kp, k0 == 0, live, st + (size_t)j * s_stride, s_stride,
                                      yc + (size_t)j * y_stride, y_stride, (size_t)k0 * y_size, nbits, with_min,
                                      (side_view){&side.d[j][0], &side.off_sum[j][0], TILE_PROMPT_PANEL});
            }
        }
    }
}

/* ---- vec_dot in the tile's order -------------------------------------------------------------- */

/* One block x . y -> int32 lanes whose total is the block's integer dot product, offset taken off. */
typedef __m256i (*legacy_dot1_avx2_fn)(const void *x, const void *y);

/* dot(row x, token y) over nb blocks: the tile's chain per lane (blocks ascending, one fma per
 * block with dx * dy, then with a min one fma of m * s), the integer sums 4 blocks at a time. */
BUBO_TARGET_AVX2 static inline __attribute__((always_inline)) float vec_dot_legacy_chain_avx2(
    int nb, const uint8_t *x, size_t x_size, const uint8_t *y, legacy_dot1_avx2_fn dot, int with_min) {
    const size_t y_size = with_min ? sizeof(block_q8_1) : sizeof(block_q8_0);
    __m128 acc = _mm_setzero_ps();
    int32_t sums[4] __attribute__((aligned(16)));
    for (int k0 = 0; k0 < nb; k0 += 4) {
        const int kb = nb - k0 < 4 ? nb - k0 : 4;
        if (kb == 4) {
            const __m256i f = fold_4blocks_avx2(dot(x + (size_t)k0 * x_size, y + (size_t)k0 * y_size),
                                                dot(x + (size_t)(k0 + 1) * x_size, y + (size_t)(k0 + 1) * y_size),
                                                dot(x + (size_t)(k0 + 2) * x_size, y + (size_t)(k0 + 2) * y_size),
                                                dot(x + (size_t)(k0 + 3) * x_size, y + (size_t)(k0 + 3) * y_size));
            _mm_store_si128((__m128i *)sums, _mm_add_epi32(_mm256_castsi256_si128(f), _mm256_extracti128_si256(f, 1)));
        } else {
            for (int j = 0; j < kb; j++) sums[j] = bubo_hsum_i32x8(dot(x + (size_t)(k0 + j) * x_size, y + (size_t)(k0 + j) * y_size));
        }
        for (int j = 0; j < kb; j++) {
            const uint8_t *xb = x + (size_t)(k0 + j) * x_size, *yb = y + (size_t)(k0 + j) * y_size;
            bubo_f16 dx;
            memcpy(&dx, xb, sizeof dx);
            const float dy = with_min ? ((const block_q8_1 *)yb)->d : _cvtsh_ss(((const block_q8_0 *)yb)->d);
            acc = _mm_fmadd_ss(_mm_cvtsi32_ss(_mm_setzero_ps(), sums[j]), _mm_set_ss(_cvtsh_ss(dx) * dy), acc);
            if (with_min) {
                bubo_f16 m;
                memcpy(&m, xb + sizeof(bubo_f16), sizeof m);
                acc = _mm_fmadd_ss(_mm_set_ss(_cvtsh_ss(m)), _mm_set_ss(((const block_q8_1 *)yb)->s), acc);
            }
        }
    }
    return _mm_cvtss_f32(acc);
}

/* A type's prepack, tile over prepacked groups and row rebuild at AVX2: NAME_prepack_avx2,
 * NAME_tile_prepacked_avx2, NAME_prepacked_row_avx2. NBITS, WITH_MIN and OFF as the tile takes them. */
#define BUBO_PREPACKED_LEGACY_AVX2(NAME, BLOCK, NBITS, WITH_MIN, OFF)                                              \
    BUBO_TARGET_AVX2 static void NAME##_prepack_avx2(const void *restrict x, size_t x_stride, int64_t rows, int n,  \
                                                     void *restrict dst) {                                         \
        prepack_legacy_avx2(x, x_stride, rows, n / QK8_0, dst, sizeof(BLOCK), NBITS, WITH_MIN);                    \
    }                                                                                                              \
    BUBO_TARGET_AVX2 static void NAME##_tile_prepacked_avx2(int n, int n_rows, int n_tokens, float *restrict s,   \
                                                            size_t s_stride, const void *restrict x,               \
                                                            size_t x_stride, const void *restrict y,               \
                                                            size_t y_stride) {                                     \
        tile_legacy_prepacked_avx2(n, n_rows, n_tokens, s, s_stride, x, x_stride, y, y_stride, sizeof(BLOCK), NBITS, \
                                   WITH_MIN, OFF);                                                                 \
    }                                                                                                              \
    static void NAME##_prepacked_row_avx2(const void *restrict packed, size_t x_stride, int64_t r, int n,          \
                                          void *restrict dst) {                                                    \
        prepacked_row_legacy_portable(packed, x_stride, r, n / QK8_0, dst, sizeof(BLOCK), NBITS, WITH_MIN);        \
    }

#endif /* BUBO_X86 */

#endif
