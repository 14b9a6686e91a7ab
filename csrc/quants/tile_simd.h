/* Shared by the SIMD tiles (legacy_tile.h, kquant_tile.h): weight rows in the int32 lanes of a
 * register, tokens broadcast. The sizes below are what one micro tile and one packing hold. */
#ifndef BUBO_TILE_SIMD_H
#define BUBO_TILE_SIMD_H

#include "bubo/cpu.h"
#include "quants_internal.h"

#if defined(BUBO_X86)

#define TILE_ROWS 16   /* weight rows per register: one per int32 lane */
#define TILE_TOKENS 8  /* tokens per micro tile: 8 accumulators beside the weight registers */
#define TILE_CHUNK 64  /* tokens one packing of a row group serves */

static const uint8_t tile_zero_block[64] __attribute__((aligned(64)));

/* Prepacked weights (legacy_tile.h, kquant_tile.h) stream in address order through a step of up to
 * TILE_CHUNK tokens (a decode step, a draft's check, a short turn), group after group and block
 * after block: each piece read prefetches the piece PREPACKED_AHEAD
 * bytes further on, up to the stream's end. (A fixed distance: the next row group's same blocks,
 * as the in-place kernels prefetch, lie a whole row group away, 40+ KiB for long rows, and would
 * be evicted from L1 before their turn.) Where bubo_config's prefetch_ahead is off (AMD Zen 4),
 * the distance is 0: each piece's lines are asked for all at once as the tile comes to it, which
 * streams faster there than any distance ahead or no prefetch at all (csrc/cpu/cpu.c). */
#ifndef PREPACKED_AHEAD
#define PREPACKED_AHEAD 4096
#endif
/* A tile's prefetch distance for this run: tuned, or 0 (the piece at hand) where bubo_config says. */
static inline size_t prefetch_distance(size_t tuned) { return bubo_config_get()->prefetch_ahead ? tuned : 0; }
static inline void prefetch_ahead(const uint8_t *cur, size_t len, const uint8_t *end, size_t ahead) {
    uintptr_t a = ((uintptr_t)cur + ahead) & ~(uintptr_t)63;
    uintptr_t to = (uintptr_t)cur + ahead + len;
    if (to > (uintptr_t)end) to = (uintptr_t)end;
    for (; a < to; a += 64) _mm_prefetch((const char *)a, _MM_HINT_T0);
}

/* Reads each cache line of [p, p + len) once, in address order: a piece's lines asked of memory
 * as demand loads, ahead of the arithmetic that reads them in another order (the k-quant tiles
 * read a piece's scales, at its end, first). AMD EPYC Zen 4, qwen2.5-coder:1.5b tg64 at 2 threads:
 * 41-43 t/s without, 45-47 with; at the AVX2 level 25-30 t/s without, 33-35 with (the next piece's
 * lines touched instead: 27). */
static inline void touch_lines(const uint8_t *p, size_t len) {
    for (uintptr_t a = (uintptr_t)p; a < (uintptr_t)p + len; a = (a & ~(uintptr_t)63) + 64)
        (void)*(volatile const uint8_t *)a;
}

/* A Q8_K block's activation sums per 32 elements (two bsums each: |sum| <= 32 x 127 fits int16),
 * dword j = the int16 pair (groups 2j, 2j + 1): for the k-quants whose 32-element groups share one
 * min (Q4_K), one vpmaddwd / vpdpwssd per two groups (kquant_tile.h, kquant_tile_avx2.h). */
static inline __m128i kq_group_sums(const block_q8_K *b) {
    const __m128i ones = _mm_set1_epi16(1);
    const __m128i lo = _mm_madd_epi16(_mm_loadu_si128((const __m128i *)b->bsums), ones);
    const __m128i hi = _mm_madd_epi16(_mm_loadu_si128((const __m128i *)(b->bsums + 8)), ones);
    return _mm_packs_epi32(lo, hi);
}

/* Transposes 8 registers of [row i | row i+8] (32 bytes each) into q[g] = dword g of rows 0..15. */
BUBO_TARGET_AVX512 static inline void transpose_rows_avx512(const __m512i z[8], __m512i q[8]) {
    __m512i t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm512_unpacklo_epi32(z[i], z[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(z[i], z[i + 1]);
    }
    /* per 128-bit lane now: rows (i, i+1) interleaved; u[4h + j] holds dword j (of the lane's 4)
     * of rows 4h..4h+3 */
    for (int h = 0; h < 2; h++) {
        u[4 * h + 0] = _mm512_unpacklo_epi64(t[4 * h + 0], t[4 * h + 2]);
        u[4 * h + 1] = _mm512_unpackhi_epi64(t[4 * h + 0], t[4 * h + 2]);
        u[4 * h + 2] = _mm512_unpacklo_epi64(t[4 * h + 1], t[4 * h + 3]);
        u[4 * h + 3] = _mm512_unpackhi_epi64(t[4 * h + 1], t[4 * h + 3]);
    }
    /* u[j] lanes (128-bit): [dword j rows 0-3 | dword j+4 rows 0-3 | j rows 8-11 | j+4 rows 8-11],
     * u[4+j] the same for rows 4-7 and 12-15 */
    const __m512i lo = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
    const __m512i hi = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
    for (int j = 0; j < 4; j++) {
        q[j] = _mm512_permutex2var_epi64(u[j], lo, u[4 + j]);
        q[j + 4] = _mm512_permutex2var_epi64(u[j], hi, u[4 + j]);
    }
}

/* z[p] = the int32 lane sums of items 2p (lanes 0-7) and 2p+1 (lanes 8-15) -> lane k = the total of
 * item k (k = 0..15): 16 blocks of one row for vec_dot, or one block of 16 rows for the row kernels. */
BUBO_TARGET_AVX512 static inline __m512i sum_16_blocks_avx512(const __m512i z[8]) {
    __m512i t[4], u[2];
    for (int a = 0; a < 4; a++) /* per 128-bit lane: [z0.0+z0.2, z1.0+z1.2, z0.1+z0.3, z1.1+z1.3] */
        t[a] = _mm512_add_epi32(_mm512_unpacklo_epi32(z[2 * a], z[2 * a + 1]), _mm512_unpackhi_epi32(z[2 * a], z[2 * a + 1]));
    for (int b = 0; b < 2; b++) /* per 128-bit lane L: the 4 dwords of z[4b + i] in L summed, in dword i */
        u[b] = _mm512_add_epi32(_mm512_unpacklo_epi64(t[2 * b], t[2 * b + 1]), _mm512_unpackhi_epi64(t[2 * b], t[2 * b + 1]));
    /* block 2p = lanes 0,1 of z[p], block 2p+1 = lanes 2,3: lane 4c + i now holds block
     * (c & 1) + 2i + 8 (c >> 1) */
    const __m512i sums = _mm512_add_epi32(_mm512_shuffle_i32x4(u[0], u[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                          _mm512_shuffle_i32x4(u[0], u[1], _MM_SHUFFLE(3, 1, 3, 1)));
    const __m512i order = _mm512_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15);
    return _mm512_permutexvar_epi32(order, sums);
}

#endif /* BUBO_X86 */

#endif
