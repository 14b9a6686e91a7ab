/* One prepacked tile alone: bubo_matmul_prepacked of one [rows, cols] matrix by n_tokens activation
 * rows, in a C loop (no Python around it, the output buffer reused), best of REPS calls; prints
 * G multiply-adds per second per thread. For comparing kernel variants: build libbubo twice and
 * run this against each, alternating (LD_LIBRARY_PATH picks the library).
 *
 *   cc -O2 -I csrc/include benchmarks/tile_bench.c -o /tmp/tile_bench -L bubo -lbubo
 *   LD_LIBRARY_PATH=bubo /tmp/tile_bench q4_1 1 1536 576 512
 *
 * args: type (q4_0 q4_1 q5_0 q5_1 q8_0 q4_K q6_K), threads, rows, cols, tokens (1-10: a decode
 * step's tile, e.g. a draft check); env NCOPY=n cycles through n copies of the weights (more than
 * the caches hold: the weights come from memory), REPS=n calls (default 60; more under a
 * profiler), BUBO_FORCE_ISA=avx2 the AVX2 tiles on a CPU with more. The output's FNV-1a hash is
 * printed too: a variant that keeps every output's bits prints the same hash. The weights are random values
 * quantized by bubo's own quantizer, or random valid bits for the k-quants (the speed does not
 * depend on them). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bubo/ops.h"
#include "bubo/quants.h"
#include "bubo/threadpool.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    static const struct { const char *name; bubo_type type; } types[] = {
        {"q4_0", BUBO_TYPE_Q4_0}, {"q4_1", BUBO_TYPE_Q4_1}, {"q5_0", BUBO_TYPE_Q5_0},
        {"q5_1", BUBO_TYPE_Q5_1}, {"q8_0", BUBO_TYPE_Q8_0}, {"q4_K", BUBO_TYPE_Q4_K}, {"q6_K", BUBO_TYPE_Q6_K},
    };
    const char *name = argc > 1 ? argv[1] : "q4_1";
    bubo_type type = BUBO_TYPE_COUNT;
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (!strcmp(name, types[i].name)) type = types[i].type;
    if (type == BUBO_TYPE_COUNT) {
        fprintf(stderr, "tile_bench: type %s: give one of q4_0 q4_1 q5_0 q5_1 q8_0 q4_K q6_K\n", name);
        return 2;
    }
    const int n_threads = argc > 2 ? atoi(argv[2]) : 1;
    const int rows = argc > 3 ? atoi(argv[3]) : 1536, cols = argc > 4 ? atoi(argv[4]) : 576;
    const int n_tokens = argc > 5 ? atoi(argv[5]) : 512, reps = getenv("REPS") ? atoi(getenv("REPS")) : 60;
    const int n_copies = getenv("NCOPY") ? atoi(getenv("NCOPY")) : 1;
    const int64_t blck = bubo_type_get_traits(type)->blck_size;
    if (n_threads < 1 || rows < 1 || cols < blck || cols % blck || n_tokens < 1 || n_copies < 1) {
        fprintf(stderr, "tile_bench: bad arguments\n");
        return 2;
    }
    bubo_err err;
    bubo_pool *pool = NULL;
    if (bubo_pool_create(n_threads, &pool, &err)) {
        fprintf(stderr, "tile_bench: %s\n", err.msg);
        return 1;
    }
    const bubo_isa isa = bubo_prepack_isa(type);
    const size_t row_bytes = bubo_row_size(type, cols);
    const size_t packed_bytes = (bubo_prepacked_size(type, rows, cols) + 63) / 64 * 64;
    float *wf = malloc(sizeof(float) * (size_t)cols);
    unsigned char *w = malloc(row_bytes * (size_t)rows);
    void **packed = malloc(sizeof(void *) * (size_t)n_copies);
    float *x = malloc(sizeof(float) * (size_t)cols * n_tokens), *y = malloc(sizeof(float) * (size_t)rows * n_tokens);
    const size_t scratch_bytes = bubo_matmul_scratch_size(type, cols, n_tokens);
    void *scratch = malloc(scratch_bytes ? scratch_bytes : 1);
    if (!wf || !w || !packed || !x || !y || !scratch) return 1;
    srand(1);
    for (int r = 0; r < rows; r++) {
        for (int c = 0; c < cols; c++) wf[c] = ((float)rand() / (float)RAND_MAX - 0.5f) * 0.1f;
        unsigned char *row = w + row_bytes * (size_t)r;
        if (bubo_get_from_float(type))
            bubo_get_from_float(type)(wf, row, cols);
        else /* no quantizer (the k-quants): valid bits, every f16 scale finite and small */
            for (size_t b = 0; b < row_bytes; b++) row[b] = (unsigned char)(rand() & 0x3B);
    }
    for (int i = 0; i < n_copies; i++) {
        packed[i] = aligned_alloc(64, packed_bytes);
        if (!packed[i] || bubo_matmul_prepack(isa, type, w, rows, cols, packed[i], &err)) {
            fprintf(stderr, "tile_bench: no prepacked %s kernels on this CPU\n", name);
            return 1;
        }
    }
    for (size_t i = 0; i < (size_t)cols * n_tokens; i++) x[i] = (float)rand() / (float)RAND_MAX - 0.5f;
    double best = 1e30;
    for (int it = 0; it < reps; it++) {
        const double t0 = now();
        if (bubo_matmul_prepacked(pool, isa, type, packed[it % n_copies], rows, cols, x, n_tokens, y, scratch,
                                  scratch_bytes, &err)) {
            fprintf(stderr, "tile_bench: %s\n", err.msg);
            return 1;
        }
        const double t = now() - t0;
        if (t < best) best = t;
    }
    const double macs = (double)rows * cols * n_tokens;
    unsigned hash = 2166136261u;
    const unsigned char *out = (const unsigned char *)y;
    for (size_t i = 0; i < sizeof(float) * (size_t)rows * n_tokens; i++) hash = (hash ^ out[i]) * 16777619u;
    printf("%s [%d, %d] x %d tokens, %d thread(s): %.0f us, %.1f G multiply-adds/s per thread, output %08x\n", name,
           rows, cols, n_tokens, n_threads, best * 1e6, macs / best / 1e9 / n_threads, hash);
    bubo_pool_free(pool);
    return 0;
}
