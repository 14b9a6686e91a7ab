/* Shared by the SIMD tiles (legacy_tile.h, kquant_tile.h): weight rows in the int32 lanes of a
 * register, tokens broadcast. The sizes below are what one micro tile and one packing hold. */
#ifndef BUBO_TILE_SIMD_H
#define BUBO_TILE_SIMD_H

#include "quants_internal.h"

#if defined(BUBO_X86)

#define TILE_ROWS 16   /* weight rows per register: one per int32 lane */
#define TILE_TOKENS 8  /* tokens per micro tile: 8 accumulators beside the weight registers */
#define TILE_CHUNK 64  /* tokens one packing of a row group serves */

static const uint8_t tile_zero_block[64] __attribute__((aligned(64)));

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

#endif /* BUBO_X86 */

#endif
