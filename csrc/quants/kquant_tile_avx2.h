/* Prepacked k-quant tiles for AVX2 (no VNNI): kquant_tile.h's engine with 8 weight rows in the
 * int32 lanes of a ymm register, tokens broadcast, for CPUs whose best level is AVX2.
 *
 * A prepacked group (16 rows, one super-block: 16 x the block's bytes, as at AVX-512, so that
 * bubo_prepacked_size and the matmul's 16-row split hold) is two halves of 8 rows: the values of
 * half 0, those of half 1, then each half's scales and factors. In a half, register m of the
 * values holds 4 consecutive elements of each of the 8 rows per dword (row r in
 * bytes 4r..4r+3), two k-steps per byte in the low and high nibbles: one vpmaddubsw multiplies
 * 4 elements of 8 rows by one token's 4 activations broadcast. The int16 pair sums of a scale's
 * elements add up in int16 while they cannot overflow (|q8_K| <= 127: 8 products of 4-bit
 * values, 2 of 6-bit ones), then one vpmaddwd by the (scale, scale) pair of each row widens and
 * scales them: fewer multiplies per value than the row-major vec_dot, and no horizontal sums.
 *
 * The chain is kquant_tile.h's, per lane: per super-block in ascending order,
 * acc += float(isum) * (dx * dy), then acc -= float(msum) * (dm * dy), with isum and msum the
 * exact integer sums; the AVX2 vec_dots of Q4_K and Q6_K run it too (kq_chain_step_avx2), so the
 * rows in place and the packed tile give every output the same bits (and the AVX-512 ones). */
#ifndef BUBO_KQUANT_TILE_AVX2_H
#define BUBO_KQUANT_TILE_AVX2_H

#include "tile_simd.h"

#if defined(BUBO_X86)

#define KQ2_ROWS 8    /* rows per half group: one per int32 lane of a ymm */
/* Tokens per micro tile, their int16 and int32 sums in registers: 4 for the legacy types
 * (legacy_tile_avx2.h), 5 for the half tiles of Q4_K and Q6_K, whose sums still fit in the 16 ymm
 * registers at 5 (Q6_K's steps past its pair_tokens: a draft check of 4 tokens and the pending one
 * reads its weights once; a group's last rows where fewer than 16). */
#define KQ2_TOKENS 4
#define KQ2_KTOKENS 5
/* A whole group at once (both halves, 16 rows: each token's broadcast activations serve both
 * halves' weights) takes up to a type's pair_tokens tokens (kq2_tile_prepacked; at most 4, as
 * KQ2_MICRO2_DISPATCH): decode steps of up to that many tokens, and every token count where the
 * type's whole-group tile is the faster one (pair_all), pair_tokens at a time. In a loop alone,
 * a broadcast per vpmaddubsw halves its rate; in the tile (benchmarks/tile_bench.c, [1024, 1536]
 * in L2, AMD EPYC Zen 5 at AVX2) steps of 1-3 tokens run 1.05-1.1x as fast this way. Q4_K's draft
 * checks of 6-10 tokens as 4 + 4 + ... instead of half tiles of 5 (Zen 4 at AVX2, [8960, 1536]
 * from memory, 2 threads): 6 tokens 79 -> 88 G multiply-adds/s per thread, 8 tokens 81 -> 85. */

/* How far ahead a streamed step prefetches (measured on an AMD EPYC, AVX2: 8 KiB streamed the
 * packed Q6_K rows as fast as the rows in place, 4 KiB and none did not; on a Zen 4 the piece at
 * hand is faster still: bubo_config's prefetch_ahead, tile_simd.h). */
#ifndef KQ2_AHEAD
#define KQ2_AHEAD 8192
#endif

/* One half group's scales and factors for one super-block, unpacked once for all its tokens. */
typedef struct {
    __m256i sc[16];    /* per unit of int16 sums (Q4_K: a 32-element group, Q6_K: 16 elements):
                          lane r = row r's scale as an int16 pair (scale, scale) */
    __m256i m_pair[8];   /* Q6_K (KQ2_FINISH): per subgroup pair i: lane r = (m[2i], m[2i+1]) of row
                            r, int16 each */
    __m256i m_groups[4]; /* Q4_K instead (one m per 32-element group): per pair of groups j: lane r
                            = (m[2j], m[2j+1]) of row r, int16 each, as kq_group_sums pairs them */
    __m256 dx, dm;
} kq2_panel;

/* A type's unpacking of half h's scales from the group's super-block at gb (its layout: the two
 * halves' values, then their scales and factors). */
typedef void (*kq2_panel_fn)(kq2_panel *p, const uint8_t *gb, int h);

/* Writes row rr (0..15) of a group's super-block at gb from the row's block. */
typedef void (*kq2_pack_row_fn)(uint8_t *gb, int rr, const void *block);

/* A prepack (bubo_prepack_fn) over a type's kq2_pack_row_fn: group by group, super-block by
 * super-block, the padding rows left zero. */
static inline void kq2_prepack(const void *restrict vx, size_t x_stride, int64_t rows, int n, void *restrict vdst,
                               size_t x_size, kq2_pack_row_fn pack_row) {
    const uint8_t *x = vx;
    uint8_t *dst = vdst;
    for (int64_t r0 = 0; r0 < rows; r0 += TILE_ROWS)
        for (int k = 0; k < n / QK_K; k++) {
            uint8_t *gb = dst + (size_t)r0 * x_stride + (size_t)k * TILE_ROWS * x_size;
            memset(gb, 0, TILE_ROWS * x_size);
            for (int rr = 0; rr < TILE_ROWS && r0 + rr < rows; rr++)
                pack_row(gb, rr, x + (size_t)(r0 + rr) * x_stride + (size_t)k * x_size);
        }
}

/* One super-block's step of the chain for a scalar output, for the AVX2 vec_dots: the same
 * operations as the tile's lanes. */
BUBO_TARGET_AVX2 static inline __m128 kq_chain_step_avx2(__m128 acc, int32_t isum, int32_t msum, float dx, float dm,
                                                         float dy) {
    acc = _mm_fmadd_ss(_mm_cvtsi32_ss(_mm_setzero_ps(), isum), _mm_set_ss(dx * dy), acc);
    return _mm_fnmadd_ss(_mm_cvtsi32_ss(_mm_setzero_ps(), msum), _mm_set_ss(dm * dy), acc);
}

/* Keeps v in a register as computed here: GCC reassociates a chain of integer adds into a tree
 * whose leaves (every vpmaddubsw of a micro tile) are all live at once, and spills them; after
 * this, each add waits for the one before, as written. */
#define KQ2_KEEP(v) __asm__("" : "+x"(v))

/* 4 bytes at p, broadcast to every dword */
BUBO_TARGET_AVX2 static inline __m256i kq2_bcast4(const int8_t *p) {
    int32_t four;
    memcpy(&four, p, 4);
    return _mm256_set1_epi32(four);
}

/* dword r (r < 8) = v[r] as an int16 pair (v, v), from 8 int8 or uint8 values widened to int32 */
BUBO_TARGET_AVX2 static inline __m256i kq2_pair(__m256i v32) {
    return _mm256_or_si256(_mm256_and_si256(v32, _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32(v32, 16));
}

/* One step of a whole group's small unsigned values (kq2_micro2_*, legacy2_micro2): lo0, hi0 hold
 * 8 rows of half 0 (per dword 4 elements, then the next 4), lo1, hi1 those of half 1; token t's 8
 * activations at a[t] (4 for lo, then 4 for hi) go into its int16 sums acc0[t] and acc1[t], each
 * broadcast serving both halves. */
BUBO_TARGET_AVX2 static inline __attribute__((always_inline)) void kq2_step2(__m256i lo0, __m256i lo1, __m256i hi0,
                                                                             __m256i hi1, const int nt,
                                                                             const int8_t *const *a, __m256i *acc0,
                                                                             __m256i *acc1) {
#pragma GCC unroll 4
    for (int t = 0; t < nt; t++) {
        const __m256i y = kq2_bcast4(a[t]);
        acc0[t] = _mm256_add_epi16(acc0[t], _mm256_maddubs_epi16(lo0, y));
        KQ2_KEEP(acc0[t]);
        acc1[t] = _mm256_add_epi16(acc1[t], _mm256_maddubs_epi16(lo1, y));
        KQ2_KEEP(acc1[t]);
    }
#pragma GCC unroll 4
    for (int t = 0; t < nt; t++) {
        const __m256i y = kq2_bcast4(a[t] + 4);
        acc0[t] = _mm256_add_epi16(acc0[t], _mm256_maddubs_epi16(hi0, y));
        KQ2_KEEP(acc0[t]);
        acc1[t] = _mm256_add_epi16(acc1[t], _mm256_maddubs_epi16(hi1, y));
        KQ2_KEEP(acc1[t]);
    }
}

/* kq2_step2 of 4-bit values: z0 and z1 hold 8 rows each, per dword 4 elements in the low nibbles
 * and the next 4 in the high. */
BUBO_TARGET_AVX2 static inline __attribute__((always_inline)) void kq2_nibbles2(__m256i z0, __m256i z1, const int nt,
                                                                                const int8_t *const *a, __m256i *acc0,
                                                                                __m256i *acc1) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    kq2_step2(_mm256_and_si256(z0, m4), _mm256_and_si256(z1, m4), _mm256_and_si256(_mm256_srli_epi16(z0, 4), m4),
              _mm256_and_si256(_mm256_srli_epi16(z1, 4), m4), nt, a, acc0, acc1);
}

/* The lanes' mask for a half group with n live rows (n may exceed 8). */
BUBO_TARGET_AVX2 static inline __m256i kq2_live(int n) {
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n > 8 ? 8 : n), idx);
}

/* Dword j of v in every dword of out[j]: a broadcast made in registers from one load (in the
 * tile, 1-2 loads and shuffles per token run faster than a broadcast load per pair of bsums). */
BUBO_TARGET_AVX2 static inline __attribute__((always_inline)) void kq2_dwords4(__m128i v, __m256i out[4]) {
    const __m256i w = _mm256_broadcastsi128_si256(v);
    out[0] = _mm256_shuffle_epi32(w, 0x00);
    out[1] = _mm256_shuffle_epi32(w, 0x55);
    out[2] = _mm256_shuffle_epi32(w, 0xAA);
    out[3] = _mm256_shuffle_epi32(w, 0xFF);
}

/* A micro tile's 8 outputs of one token, loaded and stored: plainly where all 8 rows are there
 * (whole: a literal 1 in the whole-group tiles; else every lane of live set), with the masked forms
 * only for a half group's last rows (the legacy tiles' as well, legacy_tile_avx2.h). On AMD's cores
 * a masked store costs several plain ones: the plain forms cut q4_K [8960, 1536] x 2-5 tokens from
 * memory by 10-12% (2 threads, AMD EPYC Zen 4 at AVX2), and q4_K and q6_K [1536, 1536] x 512 in L2
 * by 15% and 10%. */
BUBO_TARGET_AVX2 static inline int kq2_all_live(__m256i live, const int whole) {
    return whole || _mm256_movemask_ps(_mm256_castsi256_ps(live)) == 0xFF;
}

BUBO_TARGET_AVX2 static inline __m256 kq2_load_out(const float *p, __m256i live, const int whole) {
    return kq2_all_live(live, whole) ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, live);
}

BUBO_TARGET_AVX2 static inline void kq2_store_out(float *p, __m256i live, const int whole, __m256 v) {
    if (kq2_all_live(live, whole))
        _mm256_storeu_ps(p, v);
    else
        _mm256_maskstore_ps(p, live, v);
}

/* The chain's step for nt tokens of one super-block (isum, msum per token, msum already summed),
 * into s (whole: kq2_load_out's). */
#define KQ2_STORE(p, nt, first, live, whole, s, s_stride, yt, y_stride, isum, msum)                        \
    do {                                                                                                   \
        _Pragma("GCC unroll 8") for (int t_ = 0; t_ < (nt); t_++) {                                        \
            const block_q8_K *b_ = (const block_q8_K *)((yt) + (size_t)t_ * (y_stride));                   \
            const __m256 dy_ = _mm256_set1_ps(b_->d);                                                      \
            float *st_ = (s) + (size_t)t_ * (s_stride);                                                    \
            __m256 acc_ = (first) ? _mm256_setzero_ps() : kq2_load_out(st_, (live), (whole));              \
            acc_ = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t_]), _mm256_mul_ps((p)->dx, dy_), acc_);       \
            acc_ = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(msum[t_]), _mm256_mul_ps((p)->dm, dy_), acc_);      \
            kq2_store_out(st_, (live), (whole), acc_);                                                     \
        }                                                                                                  \
    } while (0)

/* The chain's step for nt tokens of one super-block, into s, msum from the panel's m_pair (one
 * pair of int16 factors per pair of bsums; whole: kq2_load_out's). */
#define KQ2_FINISH(p, nt, first, live, whole, s, s_stride, yt, y_stride, isum, msum)                       \
    do {                                                                                                   \
        _Pragma("GCC unroll 8") for (int t_ = 0; t_ < (nt); t_++) {                                        \
            const block_q8_K *b_ = (const block_q8_K *)((yt) + (size_t)t_ * (y_stride));                   \
            __m256i bs_[8];                                                                                \
            kq2_dwords4(_mm_loadu_si128((const __m128i *)b_->bsums), bs_);                                 \
            kq2_dwords4(_mm_loadu_si128((const __m128i *)(b_->bsums + 8)), bs_ + 4);                       \
            _Pragma("GCC unroll 8") for (int i_ = 0; i_ < 8; i_++)                                          \
                msum[t_] = _mm256_add_epi32(msum[t_], _mm256_madd_epi16((p)->m_pair[i_], bs_[i_]));        \
        }                                                                                                  \
        KQ2_STORE(p, nt, first, live, whole, s, s_stride, yt, y_stride, isum, msum);                       \
    } while (0)

/* A type's micro tile: nt (1..KQ2_KTOKENS) tokens of one half group's super-block (its values at
 * b), accumulated into s (from 0 when first). */
typedef void (*kq2_micro_fn)(const kq2_panel *p, const uint8_t *b, int nt, int first, __m256i live, float *s,
                             size_t s_stride, const uint8_t *yt, size_t y_stride);

/* A type's micro tile of a whole group (all 16 rows live): nt (1..its pair_tokens) tokens of the
 * group's super-block at gb (half h's values at gb + h * values, its panel p[h]), into s's 16
 * outputs per token. Each output's chain is the half micro tile's, step for step. */
typedef void (*kq2_micro2_fn)(const kq2_panel *p, const uint8_t *gb, size_t values, int nt, int first, float *s,
                              size_t s_stride, const uint8_t *yt, size_t y_stride);

/* One group's super-block k (gb: its bytes; rows_left: the matrix's rows from the group's first)
 * against nt tokens (yt: their block k; st: their outputs at the group's first row): both halves at
 * once by micro2, pair_tokens at a time, where pair and the group is whole; else half by half, each
 * half's panel serving KQ2_KTOKENS tokens a micro tile. */
BUBO_TARGET_AVX2 static inline __attribute__((always_inline)) void kq2_group_step(
    const uint8_t *gb, int rows_left, int k, int nt, const int pair, float *st, size_t s_stride, const uint8_t *yt,
    size_t y_stride, size_t values, kq2_panel_fn panel, kq2_micro_fn micro, kq2_micro2_fn micro2, const int pair_tokens,
    kq2_panel *p, kq2_panel *p2) {
    if (pair && rows_left >= TILE_ROWS) {
        panel(&p2[0], gb, 0);
        panel(&p2[1], gb, 1);
        for (int t = 0; t < nt; t += pair_tokens)
            micro2(p2, gb, values, nt - t < pair_tokens ? nt - t : pair_tokens, k == 0, st + (size_t)t * s_stride, s_stride,
                   yt + (size_t)t * y_stride, y_stride);
        return;
    }
    for (int h = 0; h < 2 && KQ2_ROWS * h < rows_left; h++) {
        const __m256i live = kq2_live(rows_left - KQ2_ROWS * h);
        panel(p, gb, h);
        for (int t = 0; t < nt; t += KQ2_KTOKENS)
            micro(p, gb + (size_t)h * values, nt - t < KQ2_KTOKENS ? nt - t : KQ2_KTOKENS, k == 0, live,
                  st + (size_t)t * s_stride + KQ2_ROWS * h, s_stride, yt + (size_t)t * y_stride, y_stride);
    }
}

/* The tile over prepacked groups. Up to one chunk of TILE_CHUNK tokens (a decode step, a draft's
 * check, a short turn), each group's super-blocks in address order: the weights stream once, the
 * next piece prefetched, each panel serving every token (micro2 for up to pair_tokens tokens, and
 * for any count where pair_all). More tokens go in chunks of TILE_CHUNK, super-block by
 * super-block (a super-block's panels serving the chunk's micro tiles, the chunk's activations of
 * one super-block in L1, the chunk's weights in L2 for the next chunk; micro2 where pair_all).
 * values: the bytes of a half's values (the second half's follow the first's); x_size: the
 * block's bytes. */
BUBO_TARGET_AVX2 static inline __attribute__((always_inline)) void kq2_tile_prepacked(
    int n, int n_rows, int n_tokens, float *restrict s, size_t s_stride, const void *restrict vx, size_t x_stride,
    const void *restrict vy, size_t y_stride, size_t x_size, size_t values, kq2_panel_fn panel, kq2_micro_fn micro,
    kq2_micro2_fn micro2, const int pair_tokens, const int pair_all) {
    const uint8_t *x = vx, *y = vy;
    const int nb = n / QK_K;
    if (nb == 0) {
        for (int t = 0; t < n_tokens; t++) memset(s + (size_t)t * s_stride, 0, (size_t)n_rows * sizeof(float));
        return;
    }
    kq2_panel p __attribute__((aligned(32)));
    kq2_panel p2[2] __attribute__((aligned(32)));
    const size_t group_block = (size_t)TILE_ROWS * x_size;
    if (n_tokens <= TILE_CHUNK) {
        const int pair = n_tokens <= pair_tokens || pair_all;
        const uint8_t *end = x + (size_t)((n_rows + TILE_ROWS - 1) / TILE_ROWS) * TILE_ROWS * x_stride;
        const size_t ahead = prefetch_distance(KQ2_AHEAD);
        for (int r0 = 0; r0 < n_rows; r0 += TILE_ROWS) {
            const uint8_t *xr = x + (size_t)r0 * x_stride;
            for (int k = 0; k < nb; k++) {
                prefetch_ahead(xr + (size_t)k * group_block, group_block, end, ahead);
                /* in address order: the panel reads the scales, at the piece's end, first */
                touch_lines(xr + (size_t)k * group_block, group_block);
                kq2_group_step(xr + (size_t)k * group_block, n_rows - r0, k, n_tokens, pair, s + r0, s_stride,
                               y + (size_t)k * sizeof(block_q8_K), y_stride, values, panel, micro, micro2, pair_tokens, &p,
                               p2);
            }
        }
        return;
    }
    for (int t0 = 0; t0 < n_tokens; t0 += TILE_CHUNK) {
        const int nt = n_tokens - t0 < TILE_CHUNK ? n_tokens - t0 : TILE_CHUNK;
        for (int k = 0; k < nb; k++)
            for (int r0 = 0; r0 < n_rows; r0 += TILE_ROWS)
                kq2_group_step(x + (size_t)r0 * x_stride + (size_t)k * group_block, n_rows - r0, k, nt, pair_all,
                               s + (size_t)t0 * s_stride + r0, s_stride, y + (size_t)t0 * y_stride + (size_t)k * sizeof(block_q8_K),
                               y_stride, values, panel, micro, micro2, pair_tokens, &p, p2);
    }
}

/* A micro tile's body for nt a literal in each case (its accumulators in registers). */
#define KQ2_MICRO_DISPATCH(fn, p, b, nt, first, live, s, s_stride, yt, y_stride) \
    do {                                                                          \
        switch (nt) {                                                             \
        case 1: fn(p, b, 1, first, live, s, s_stride, yt, y_stride); break;       \
        case 2: fn(p, b, 2, first, live, s, s_stride, yt, y_stride); break;       \
        case 3: fn(p, b, 3, first, live, s, s_stride, yt, y_stride); break;       \
        case 4: fn(p, b, 4, first, live, s, s_stride, yt, y_stride); break;       \
        case 5: fn(p, b, 5, first, live, s, s_stride, yt, y_stride); break;       \
        default: break;                                                           \
        }                                                                         \
    } while (0)

/* A whole group's micro tile for nt a literal in each case, up to most (the type's pair_tokens). */
#define KQ2_MICRO2_DISPATCH(fn, most, p, gb, values, nt, first, s, s_stride, yt, y_stride) \
    do {                                                                                   \
        switch (nt) {                                                                      \
        case 1: fn(p, gb, values, 1, first, s, s_stride, yt, y_stride); break;             \
        case 2: fn(p, gb, values, 2, first, s, s_stride, yt, y_stride); break;             \
        case 3: fn(p, gb, values, 3, first, s, s_stride, yt, y_stride); break;             \
        case 4:                                                                            \
            if ((most) >= 4) fn(p, gb, values, 4, first, s, s_stride, yt, y_stride);       \
            break;                                                                         \
        default: break;                                                                    \
        }                                                                                  \
    } while (0)

#endif /* BUBO_X86 */

#endif
