/* A prompt's attention alone: bubo_attend_paged over the tiles of an n-token prompt (16 tokens
 * and the query heads of one KV head per call, as the forward pass deals them out) of one layer,
 * after `depth` positions already in the cache, in a C loop; best of --reps passes; prints the
 * f32 multiply-adds per second (QK and PV: 2 x head_dim per position and query head) and the
 * time per pass. For comparing variants: build libbubo twice, run this against each, alternating.
 *
 *   cc -O2 -I csrc/include benchmarks/attention_bench.c -o /tmp/attention_bench -L bubo -lbubo
 *   LD_LIBRARY_PATH=bubo /tmp/attention_bench 512 0 f16
 *
 * args: prompt tokens, depth, K/V type (f16 f32 q8_0), reps; smollm2's shape: head_dim 64, 3 query
 * heads per KV head, or env HEAD_DIM and NQ (qwen2.5-coder:1.5b: 128 and 6). The rows are random
 * (the speed does not depend on them); the output's FNV-1a hash is printed (a variant that keeps
 * every output's bits prints the same). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bubo/kv.h"
#include "bubo/ops.h"
#include "bubo/quants.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    const int n_prompt = argc > 1 ? atoi(argv[1]) : 512, depth = argc > 2 ? atoi(argv[2]) : 0;
    const char *tname = argc > 3 ? argv[3] : "f16";
    const int reps = argc > 4 ? atoi(argv[4]) : 20;
    const bubo_type type = !strcmp(tname, "f32") ? BUBO_TYPE_F32 : !strcmp(tname, "q8_0") ? BUBO_TYPE_Q8_0 : BUBO_TYPE_F16;
    enum { TILE = 16, BS = 32 };
    const int HD = getenv("HEAD_DIM") ? atoi(getenv("HEAD_DIM")) : 64, NQ = getenv("NQ") ? atoi(getenv("NQ")) : 3;
    if (HD < 1 || NQ < 1 || (type == BUBO_TYPE_Q8_0 && HD % 32) || n_prompt < 1 || depth < 0 || reps < 1) {
        fprintf(stderr, "attention_bench: bad arguments (HEAD_DIM %d, NQ %d: positive, HEAD_DIM a multiple of 32 "
                        "for q8_0)\n", HD, NQ);
        return 2;
    }
    const int n_pos = depth + n_prompt, n_blocks = (n_pos + BS - 1) / BS;
    const size_t head_bytes = bubo_row_size(type, HD);
    const size_t block_bytes = (size_t)BS * head_bytes; /* one KV head's blocks */
    uint8_t *k = malloc(block_bytes * n_blocks), *v = malloc(block_bytes * n_blocks);
    int32_t *table = malloc(sizeof(int32_t) * n_blocks);
    float *row = malloc(sizeof(float) * HD);
    srand(1);
    for (int p = 0; p < n_pos; p++) {
        for (int j = 0; j < HD; j++) row[j] = (float)rand() / RAND_MAX - 0.5f;
        bubo_get_from_float(type)(row, k + (size_t)p * head_bytes, HD);
        for (int j = 0; j < HD; j++) row[j] = (float)rand() / RAND_MAX - 0.5f;
        bubo_get_from_float(type)(row, v + (size_t)p * head_bytes, HD);
    }
    for (int b = 0; b < n_blocks; b++) table[b] = b;
    const bubo_kv_view view = {.type = type, .type_v = type, .block_size = BS, .k = k, .v = v,
                               .block_bytes_k = block_bytes, .block_bytes_v = block_bytes,
                               .row_bytes_k = head_bytes, .row_bytes_v = head_bytes, .head_bytes_k = head_bytes,
                               .head_bytes_v = head_bytes, .head_stride_k = block_bytes, .head_stride_v = block_bytes,
                               .table = table};
    /* the queries as the forward pass gives them: f32 rows for f16/f32 K, q8_0 rows for q8_0 K */
    const size_t q_stride = type == BUBO_TYPE_Q8_0 ? bubo_row_size(BUBO_TYPE_Q8_0, HD) : HD * sizeof(float);
    uint8_t *q = malloc(q_stride * NQ * n_prompt);
    for (int r = 0; r < NQ * n_prompt; r++) {
        for (int j = 0; j < HD; j++) row[j] = (float)rand() / RAND_MAX - 0.5f;
        if (type == BUBO_TYPE_Q8_0) bubo_get_from_float(BUBO_TYPE_Q8_0)(row, q + r * q_stride, HD);
        else memcpy(q + r * q_stride, row, sizeof(float) * HD);
    }
    float *out = malloc(sizeof(float) * HD * NQ * n_prompt);
    /* 64-byte aligned, as the model's scratch is */
    float *scratch = aligned_alloc(64, (sizeof(float) * bubo_attend_scratch_floats(TILE, NQ, HD, HD) + 63) & ~(size_t)63);
    double macs = 0;
    for (int t = 0; t < n_prompt; t++) macs += 2.0 * HD * NQ * (depth + t + 1);
    double best = 1e9;
    for (int r = 0; r < reps; r++) {
        const double t0 = now();
        for (int t0k = 0; t0k < n_prompt; t0k += TILE) {
            const int n = n_prompt - t0k < TILE ? n_prompt - t0k : TILE;
            int32_t begin[TILE], end[TILE];
            for (int i = 0; i < n; i++) begin[i] = 0, end[i] = depth + t0k + i + 1;
            bubo_attend_paged(&view, 0, HD, HD, n, begin, end, NQ, q + (size_t)t0k * NQ * q_stride, q_stride, 0.125f,
                              out + (size_t)t0k * NQ * HD, NQ * HD, scratch);
        }
        const double dt = now() - t0;
        if (dt < best) best = dt;
    }
    unsigned hash = 2166136261u;
    const unsigned char *bytes = (const unsigned char *)out;
    for (size_t i = 0; i < sizeof(float) * HD * NQ * n_prompt; i++) hash = (hash ^ bytes[i]) * 16777619u;
    printf("%s prompt %d depth %d: %.1f us per pass, %.1f G f32 multiply-adds/s (output %08x)\n", tname, n_prompt,
           depth, best * 1e6, macs / best * 1e-9, hash);
    return 0;
}
