/* Tensor element types, quantized block layouts and the kernel table.
 *
 * Type ids and block layouts are GGUF's (ggml's), so tensor bytes are used straight from the
 * mmap. Each block family lives in one file under csrc/quants/ with its scalar reference and its
 * AVX2, AVX-512 and NEON variants side by side; csrc/quants/traits.c gathers them into one table.
 *
 * A matrix-vector product quantizes the activations once into the weight type's vec_dot_type
 * (Q8_0, Q8_1 or Q8_K; F32 for the float types) and then calls vec_dot per weight row. A
 * matrix-matrix product (prompt processing) calls vec_dot_tile on a tile of weight rows by a tile
 * of tokens, which loads each weight block once for several tokens. */
#ifndef BUBO_QUANTS_H
#define BUBO_QUANTS_H

#include <stddef.h>
#include <stdint.h>

#include "bubo/cpu.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    BUBO_TYPE_F32 = 0,
    BUBO_TYPE_F16 = 1,
    BUBO_TYPE_Q4_0 = 2,
    BUBO_TYPE_Q4_1 = 3,
    BUBO_TYPE_Q5_0 = 6,
    BUBO_TYPE_Q5_1 = 7,
    BUBO_TYPE_Q8_0 = 8,
    BUBO_TYPE_Q8_1 = 9,
    BUBO_TYPE_Q2_K = 10,
    BUBO_TYPE_Q3_K = 11,
    BUBO_TYPE_Q4_K = 12,
    BUBO_TYPE_Q5_K = 13,
    BUBO_TYPE_Q6_K = 14,
    BUBO_TYPE_Q8_K = 15,
    BUBO_TYPE_IQ2_XXS = 16,
    BUBO_TYPE_IQ2_XS = 17,
    BUBO_TYPE_IQ3_XXS = 18,
    BUBO_TYPE_IQ1_S = 19,
    BUBO_TYPE_IQ4_NL = 20,
    BUBO_TYPE_IQ3_S = 21,
    BUBO_TYPE_IQ2_S = 22,
    BUBO_TYPE_IQ4_XS = 23,
    BUBO_TYPE_I8 = 24,
    BUBO_TYPE_I16 = 25,
    BUBO_TYPE_I32 = 26,
    BUBO_TYPE_I64 = 27,
    BUBO_TYPE_F64 = 28,
    BUBO_TYPE_IQ1_M = 29,
    BUBO_TYPE_BF16 = 30,
    BUBO_TYPE_TQ1_0 = 34,
    BUBO_TYPE_TQ2_0 = 35,
    BUBO_TYPE_MXFP4 = 39,
    BUBO_TYPE_NVFP4 = 40,
    BUBO_TYPE_Q1_0 = 41,
    BUBO_TYPE_COUNT = 42
} bubo_type;

#define QK4_0 32
#define QK4_1 32
#define QK5_0 32
#define QK5_1 32
#define QK8_0 32
#define QK8_1 32
#define QK_K 256
#define K_SCALE_SIZE 12

typedef uint16_t bubo_f16;  /* IEEE half, stored bits */
typedef uint16_t bubo_bf16; /* bfloat16, stored bits */

/* ---- legacy 32-element blocks ---------------------------------------------------------- */

typedef struct {
    bubo_f16 d;            /* scale */
    uint8_t qs[QK4_0 / 2]; /* nibbles: element j in low nibble of qs[j], j+16 in high; value (q-8)*d */
} block_q4_0;
_Static_assert(sizeof(block_q4_0) == 18, "block_q4_0 size");

typedef struct {
    bubo_f16 d;            /* scale */
    bubo_f16 m;            /* min: value q*d + m */
    uint8_t qs[QK4_1 / 2]; /* nibbles, as q4_0 */
} block_q4_1;
_Static_assert(sizeof(block_q4_1) == 20, "block_q4_1 size");

typedef struct {
    bubo_f16 d;            /* scale */
    uint8_t qh[4];         /* 5th bit of each of the 32 elements (little-endian uint32) */
    uint8_t qs[QK5_0 / 2]; /* low 4 bits, as q4_0; value (q-16)*d */
} block_q5_0;
_Static_assert(sizeof(block_q5_0) == 22, "block_q5_0 size");

typedef struct {
    bubo_f16 d;            /* scale */
    bubo_f16 m;            /* min: value q*d + m */
    uint8_t qh[4];         /* 5th bits */
    uint8_t qs[QK5_1 / 2]; /* low 4 bits */
} block_q5_1;
_Static_assert(sizeof(block_q5_1) == 24, "block_q5_1 size");

typedef struct {
    bubo_f16 d;        /* scale */
    int8_t qs[QK8_0];  /* value q*d */
} block_q8_0;
_Static_assert(sizeof(block_q8_0) == 34, "block_q8_0 size");

/* Activations for the q4_1 / q5_1 (min-carrying) weights. Not a file format: f32 fields, as
 * the gguf package's table sizes it (40 bytes). */
typedef struct {
    float d;          /* scale */
    float s;          /* d * sum(qs): lets the dot product fold in the weight's min */
    int8_t qs[QK8_1]; /* value q*d */
} block_q8_1;
_Static_assert(sizeof(block_q8_1) == 40, "block_q8_1 size");

/* ---- k-quants: 256-element super-blocks ------------------------------------------------- */

typedef struct {
    uint8_t scales[QK_K / 16]; /* per 16 elements: low nibble scale, high nibble min (4 bits each) */
    uint8_t qs[QK_K / 4];      /* 2-bit quants */
    bubo_f16 d;                /* super-block scale for the scales */
    bubo_f16 dmin;             /* super-block scale for the mins */
} block_q2_K;
_Static_assert(sizeof(block_q2_K) == 84, "block_q2_K size");

typedef struct {
    uint8_t hmask[QK_K / 8];        /* high bit of each 3-bit quant */
    uint8_t qs[QK_K / 4];           /* low 2 bits */
    uint8_t scales[K_SCALE_SIZE];   /* 16 6-bit scales, packed */
    bubo_f16 d;                     /* super-block scale */
} block_q3_K;
_Static_assert(sizeof(block_q3_K) == 110, "block_q3_K size");

typedef struct {
    bubo_f16 d;                     /* super-block scale for the scales */
    bubo_f16 dmin;                  /* super-block scale for the mins */
    uint8_t scales[K_SCALE_SIZE];   /* 8 6-bit scales and 8 6-bit mins, packed */
    uint8_t qs[QK_K / 2];           /* 4-bit quants */
} block_q4_K;
_Static_assert(sizeof(block_q4_K) == 144, "block_q4_K size");

typedef struct {
    bubo_f16 d;                     /* super-block scale for the scales */
    bubo_f16 dmin;                  /* super-block scale for the mins */
    uint8_t scales[K_SCALE_SIZE];   /* as q4_K */
    uint8_t qh[QK_K / 8];           /* 5th bits */
    uint8_t qs[QK_K / 2];           /* low 4 bits */
} block_q5_K;
_Static_assert(sizeof(block_q5_K) == 176, "block_q5_K size");

typedef struct {
    uint8_t ql[QK_K / 2];      /* low 4 bits */
    uint8_t qh[QK_K / 4];      /* high 2 bits */
    int8_t scales[QK_K / 16];  /* 8-bit scales per 16 elements */
    bubo_f16 d;                /* super-block scale */
} block_q6_K;
_Static_assert(sizeof(block_q6_K) == 210, "block_q6_K size");

/* Activations for the k-quants. */
typedef struct {
    float d;                 /* scale */
    int8_t qs[QK_K];         /* value q*d */
    int16_t bsums[QK_K / 16]; /* sum of qs per 16 elements */
} block_q8_K;
_Static_assert(sizeof(block_q8_K) == 292, "block_q8_K size");

/* ---- the kernel table ------------------------------------------------------------------- */

/* Dequantize n elements (a multiple of the block size) of x into y. */
typedef void (*bubo_to_float_fn)(const void *restrict x, float *restrict y, int64_t n);
/* Quantize n floats (a multiple of the block size) into blocks of this type. */
typedef void (*bubo_from_float_fn)(const float *restrict x, void *restrict y, int64_t n);
/* *s = dot(x, y) over n elements; x in the weight type, y in its vec_dot_type. */
typedef void (*bubo_vec_dot_fn)(int n, float *restrict s, const void *restrict x, const void *restrict y);
/* s[t * s_stride + r] = dot(x row r, y row t) for r < n_rows, t < n_tokens (n_rows, n_tokens >= 0,
 * any values: the kernel handles its own edges):
 *   x  n_rows weight rows of n elements in the weight type, x_stride bytes apart
 *   y  n_tokens activation rows of n elements in its vec_dot_type, y_stride bytes apart
 *   s  outputs: the rows of one token are contiguous, tokens s_stride floats apart
 * Each output is computed by the same operations in the same order wherever it sits in the tile
 * and whatever the tile's shape, so a caller's tiling never changes a result; the order may
 * differ from vec_dot's (the results agree within float rounding). */
typedef void (*bubo_vec_dot_tile_fn)(int n, int n_rows, int n_tokens, float *restrict s, size_t s_stride,
                                     const void *restrict x, size_t x_stride, const void *restrict y,
                                     size_t y_stride);

/* Rewrites `rows` weight rows of n elements (x_stride bytes apart) into the prepacked layout of
 * this level's vec_dot_tile_prepacked, at dst: bubo_prepacked_size(type, rows, n) bytes, rows padded
 * to a multiple of 16, row group g at byte 16 g x_stride (see quants/legacy_tile.h). */
typedef void (*bubo_prepack_fn)(const void *restrict x, size_t x_stride, int64_t rows, int n, void *restrict dst);
/* Writes row r's original bytes (bubo_row_size(type, n) of them) from its prepacked form at packed. */
typedef void (*bubo_prepacked_row_fn)(const void *restrict packed, size_t x_stride, int64_t r, int n, void *restrict dst);

typedef struct {
    const char *name;       /* "q4_K" ... as ggml spells it */
    int64_t blck_size;      /* elements per block */
    size_t type_size;       /* bytes per block */
    int supported;          /* bubo runs tensors of this type */
    bubo_type vec_dot_type; /* the activation type vec_dot takes */
    /* One entry per bubo_isa; NULL where that variant does not exist. */
    bubo_to_float_fn to_float[BUBO_ISA_COUNT];
    bubo_from_float_fn from_float[BUBO_ISA_COUNT];
    bubo_vec_dot_fn vec_dot[BUBO_ISA_COUNT];
    /* Present exactly where vec_dot is: a SIMD tile, or vec_dot looped over the tile. */
    bubo_vec_dot_tile_fn vec_dot_tile[BUBO_ISA_COUNT];
    /* Where a level has them: weights packed once (prepack), and the tile that reads them (the same
     * bits as vec_dot_tile on the rows in place, for every token count). */
    bubo_prepack_fn prepack[BUBO_ISA_COUNT];
    bubo_vec_dot_tile_fn vec_dot_tile_prepacked[BUBO_ISA_COUNT];
    bubo_prepacked_row_fn prepacked_row[BUBO_ISA_COUNT];
} bubo_type_traits;

/* Traits of a type id (NULL for an id GGUF does not define). */
const bubo_type_traits *bubo_type_get_traits(int type);
/* The best variant this CPU runs (falls back to the next lower level, then scalar). */
bubo_to_float_fn bubo_get_to_float(bubo_type type);
bubo_from_float_fn bubo_get_from_float(bubo_type type);
bubo_vec_dot_fn bubo_get_vec_dot(bubo_type type);
bubo_vec_dot_tile_fn bubo_get_vec_dot_tile(bubo_type type);
/* The same from a given level down (a caller that runs at one level, and reads no environment:
 * the calls above read BUBO_FORCE_ISA each time). */
bubo_to_float_fn bubo_get_to_float_isa(bubo_type type, bubo_isa isa);
bubo_vec_dot_fn bubo_get_vec_dot_isa(bubo_type type, bubo_isa isa);
/* The level whose prepacked kernels weights of this type are packed for: this CPU's best level
 * (BUBO_FORCE_ISA respected) where it has them, else BUBO_ISA_COUNT (nothing is packed). The layout
 * belongs to that level, with no fallback to another: packed weights keep their level's kernels
 * even if BUBO_FORCE_ISA changes later (set it before loading a model). */
bubo_isa bubo_prepack_isa(bubo_type type);
/* Bytes of the prepacked form of rows x n (rows rounded up to 16); 0 if n is not whole blocks. */
size_t bubo_prepacked_size(bubo_type type, int64_t rows, int64_t n);
/* Bytes of one row of n elements; 0 if n is not a multiple of the block size. */
size_t bubo_row_size(bubo_type type, int64_t n);

/* Half and bfloat16 conversion (scalar; exact, round-to-nearest-even). */
float bubo_f16_to_f32(bubo_f16 h);
bubo_f16 bubo_f32_to_f16(float f);
float bubo_bf16_to_f32(bubo_bf16 h);
bubo_bf16 bubo_f32_to_bf16(float f);

#ifdef __cplusplus
}
#endif
#endif
