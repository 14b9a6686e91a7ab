/* Mutation fuzzer for the GGUF reader, meant to be built with -fsanitize=address,undefined
 * (tests/native/test_gguf_asan.py does). It reads seed files from a directory, each X.gguf with
 * an optional X.fields beside it ("offset size kind" per line, written by ggufbuild.py), and
 * feeds bubo_gguf_open_buffer:
 *
 *   1. every seed as is (must load),
 *   2. every prefix of every seed,
 *   3. every 4- and 8-byte structural field of every seed set to every edge value,
 *   4. nesting bombs and wide arrays built here,
 *   5. -n random mutations: edge values aimed at fields, byte and bit flips, truncations,
 *      span deletions and duplications, splices of two seeds.
 *
 * Each input sits in its own exact-size heap block, so a read one byte past the end is an ASan
 * report. When a file loads, every key, value, array element, tensor byte range and lookup is
 * touched and checked against the buffer, and the memory the handle keeps is bounded by a small
 * multiple of the input size. Exit status 0 means no sanitizer report and no failed check.
 *
 * usage: fuzz_gguf [-n random_cases] [-s seed] corpus_dir
 *        fuzz_gguf -c file...   (open each real file through the mmap path and touch it all, then
 *                                parse its metadata alone from an exact-size copy) */
#define _POSIX_C_SOURCE 200809L

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bubo/gguf.h"

#if defined(__SANITIZE_ADDRESS__)
/* from <sanitizer/allocator_interface.h>, which not every toolchain installs; libasan has it */
size_t __sanitizer_get_current_allocated_bytes(void);
#define HAVE_ALLOC_STATS 1
#endif

/* The handle may keep at most this many bytes per input byte, plus a constant: kv and tensor
 * tables and parsed string-array items are each a few times their smallest encoding. */
#define RETAINED_PER_INPUT_BYTE 8
#define RETAINED_SLACK (64 * 1024)

#define MAX_SEEDS 64
#define MAX_FIELDS 4096

typedef struct {
    uint64_t offset, size;
    char kind[32];
} field;

typedef struct {
    char name[256];
    uint8_t *data;
    size_t size;
    field fields[MAX_FIELDS];
    int n_fields;
} seed;

static seed seeds[MAX_SEEDS];
static int n_seeds;

static struct {
    uint64_t cases, loaded, by_status[8];
} stats;

static volatile uint64_t sink; /* keeps the reads of touch() from being optimized away */

static void die(const char *fmt, const char *what) {
    fprintf(stderr, "fuzz_gguf: ");
    fprintf(stderr, fmt, what);
    fprintf(stderr, "\n");
    exit(2);
}

#define CHECK(cond, ...)                                     \
    do {                                                     \
        if (!(cond)) {                                       \
            fprintf(stderr, "fuzz_gguf: check failed: " __VA_ARGS__); \
            fprintf(stderr, " [%s]\n", #cond);               \
            abort();                                         \
        }                                                    \
    } while (0)

/* ---- random numbers (splitmix64: deterministic for a given -s) --------------------------- */

static uint64_t rng_state;
static uint64_t rnd(void) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}
static uint64_t below(uint64_t n) { return n ? rnd() % n : 0; }

/* ---- touching a loaded file -------------------------------------------------------------- */

static int inside(const bubo_gguf *g, const void *p, uint64_t n) {
    const uint8_t *b = bubo_gguf_base(g), *q = p;
    uint64_t size = bubo_gguf_file_size(g);
    return q >= b && (uint64_t)(q - b) <= size && n <= size - (uint64_t)(q - b);
}

static void touch_bytes(const bubo_gguf *g, const char *p, uint64_t n) {
    CHECK(inside(g, p, n), "a string of %llu bytes lies outside the buffer", (unsigned long long)n);
    uint64_t s = 0;
    for (uint64_t i = 0; i < n; i++) s += (uint8_t)p[i];
    sink += s;
}

static void touch_value(const bubo_gguf *g, const bubo_gguf_value *v, int depth) {
    CHECK(depth <= BUBO_GGUF_MAX_ARRAY_DEPTH, "value nested %d deep", depth);
    switch (v->type) {
    case BUBO_GGUF_STRING: touch_bytes(g, v->v.str.data, v->v.str.len); break;
    case BUBO_GGUF_ARRAY:
        if (v->v.arr.elem_type == BUBO_GGUF_STRING || v->v.arr.elem_type == BUBO_GGUF_ARRAY) {
            CHECK(v->v.arr.n == 0 || v->v.arr.items, "array of %llu items without items", (unsigned long long)v->v.arr.n);
            for (uint64_t j = 0; j < v->v.arr.n; j++) {
                CHECK(v->v.arr.items[j].type == v->v.arr.elem_type, "item %llu has the wrong type", (unsigned long long)j);
                touch_value(g, &v->v.arr.items[j], depth + 1);
            }
        } else {
            for (uint64_t j = 0; j < v->v.arr.n; j++)
                sink += bubo_gguf_arr_u64(v, j) + (uint64_t)bubo_gguf_arr_i64(v, j) + (bubo_gguf_arr_f64(v, j) > 0);
            sink += bubo_gguf_arr_u64(v, v->v.arr.n); /* one past the end: must answer 0, not read */
        }
        break;
    default: sink += v->v.u64; break;
    }
}

/* A NUL-terminated copy of s, if s holds no NUL (else the C lookup cannot name it). */
static int cstr(bubo_gguf_str s, char *out, size_t cap) {
    if (s.len >= cap || memchr(s.data, 0, s.len)) return 0;
    memcpy(out, s.data, s.len);
    out[s.len] = 0;
    return 1;
}

static void touch(const bubo_gguf *g) {
    char name[512];
    uint64_t size = bubo_gguf_file_size(g);
    uint64_t align = bubo_gguf_alignment(g);
    CHECK(align && !(align & (align - 1)), "alignment %llu", (unsigned long long)align);
    CHECK(bubo_gguf_data_offset(g) % align == 0, "data offset unaligned");
    CHECK(bubo_gguf_version(g) == 2 || bubo_gguf_version(g) == 3, "version");

    for (uint64_t i = 0; i < bubo_gguf_n_kv(g); i++) {
        const bubo_gguf_kv *kv = bubo_gguf_kv_at(g, i);
        touch_bytes(g, kv->key.data, kv->key.len);
        touch_value(g, &kv->value, 0);
        if (cstr(kv->key, name, sizeof name)) {
            CHECK(bubo_gguf_get(g, name) == &kv->value, "lookup of key %llu", (unsigned long long)i);
            uint64_t u;
            int64_t s;
            double d;
            int b;
            bubo_gguf_str str;
            sink += bubo_gguf_get_u64(g, name, &u) + bubo_gguf_get_i64(g, name, &s) + bubo_gguf_get_f64(g, name, &d) +
                    bubo_gguf_get_bool(g, name, &b) + bubo_gguf_get_str(g, name, &str);
        }
    }
    CHECK(bubo_gguf_kv_at(g, bubo_gguf_n_kv(g)) == NULL, "kv past the end");

    for (uint64_t i = 0; i < bubo_gguf_n_tensors(g); i++) {
        const bubo_gguf_tensor *t = bubo_gguf_tensor_at(g, i);
        touch_bytes(g, t->name.data, t->name.len);
        CHECK(t->n_dims <= BUBO_GGUF_MAX_DIMS, "n_dims %u", t->n_dims);
        CHECK(t->offset % align == 0, "tensor %llu unaligned", (unsigned long long)i);
        CHECK(inside(g, t->data, t->nbytes), "tensor %llu data outside the buffer", (unsigned long long)i);
        if (t->nbytes) {
            const uint8_t *d = t->data;
            CHECK(d == bubo_gguf_base(g) + bubo_gguf_data_offset(g) + t->offset, "tensor %llu data pointer",
                  (unsigned long long)i);
            sink += d[0] + d[t->nbytes - 1];
            for (uint64_t j = 0; j < i; j++) { /* inputs are small: the quadratic check is fine here */
                const bubo_gguf_tensor *o = bubo_gguf_tensor_at(g, j);
                CHECK(!o->nbytes || o->offset >= t->offset + t->nbytes || t->offset >= o->offset + o->nbytes,
                      "tensors %llu and %llu overlap", (unsigned long long)j, (unsigned long long)i);
            }
        }
        if (cstr(t->name, name, sizeof name))
            CHECK(bubo_gguf_find_tensor(g, name) == t, "lookup of tensor %llu", (unsigned long long)i);
    }
    CHECK(bubo_gguf_tensor_at(g, bubo_gguf_n_tensors(g)) == NULL, "tensor past the end");
    CHECK(bubo_gguf_get(g, "no such key \x01") == NULL && bubo_gguf_find_tensor(g, "no such tensor \x01") == NULL,
          "phantom lookup");
    bubo_err err;
    bubo_status st = bubo_gguf_check_supported(g, &err);
    CHECK(st == BUBO_OK || st == BUBO_ERR_UNSUPPORTED, "check_supported status %d", st);
    (void)size;
}

/* One case: the bytes in their own exact-size block, parsed, touched, freed. */
static void run_case(const uint8_t *data, size_t size) {
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf) die("out of memory for a %s", "case");
    if (size) memcpy(buf, data, size);
#ifdef HAVE_ALLOC_STATS
    size_t before = __sanitizer_get_current_allocated_bytes();
#endif
    bubo_gguf *g = NULL;
    bubo_err err;
    err.msg[0] = 0;
    bubo_status st = bubo_gguf_open_buffer(buf, size, &g, &err);
    stats.cases++;
    stats.by_status[st < 8 ? st : 7]++;
    if (st == BUBO_OK) {
        CHECK(g != NULL, "OK without a handle");
#ifdef HAVE_ALLOC_STATS
        size_t kept = __sanitizer_get_current_allocated_bytes() - before;
        CHECK(kept <= RETAINED_PER_INPUT_BYTE * size + RETAINED_SLACK, "a %zu-byte file keeps %zu bytes", size, kept);
#endif
        stats.loaded++;
        touch(g);
        bubo_gguf_close(g);
    } else {
        CHECK(g == NULL, "a failed open returned a handle");
        CHECK(err.msg[0] != 0, "status %d without a message", st);
        CHECK(memchr(err.msg, 0, sizeof err.msg) != NULL, "unterminated message");
    }
    free(buf);
}

/* ---- seeds ------------------------------------------------------------------------------- */

static uint8_t *read_file(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc(n > 0 ? (size_t)n : 1);
    if (!b || fread(b, 1, (size_t)n, f) != (size_t)n) die("cannot read %s", path);
    fclose(f);
    *size = (size_t)n;
    return b;
}

static int by_name(const void *a, const void *b) { return strcmp(((const seed *)a)->name, ((const seed *)b)->name); }

static void load_seeds(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) die("cannot open corpus directory %s", dir);
    struct dirent *e;
    char path[4096];
    while ((e = readdir(d))) {
        size_t n = strlen(e->d_name);
        if (n < 6 || strcmp(e->d_name + n - 5, ".gguf") || n >= sizeof seeds[0].name) continue;
        if (n_seeds == MAX_SEEDS) die("more than %s seeds", "MAX_SEEDS");
        seed *s = &seeds[n_seeds++];
        snprintf(s->name, sizeof s->name, "%s", e->d_name);
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (!(s->data = read_file(path, &s->size))) die("cannot read %s", path);
        snprintf(path, sizeof path, "%s/%.*s.fields", dir, (int)(n - 5), e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        unsigned long long off, sz;
        char kind[32];
        while (s->n_fields < MAX_FIELDS && fscanf(f, "%llu %llu %31s", &off, &sz, kind) == 3) {
            if (off + sz > s->size) die("field past the end of its seed in %s", path);
            field *fl = &s->fields[s->n_fields++];
            fl->offset = off;
            fl->size = sz;
            snprintf(fl->kind, sizeof fl->kind, "%s", kind);
        }
        fclose(f);
    }
    closedir(d);
    if (!n_seeds) die("no .gguf seeds in %s", dir);
    qsort(seeds, (size_t)n_seeds, sizeof seeds[0], by_name); /* readdir order is not stable */
}

/* ---- mutations --------------------------------------------------------------------------- */

static const uint64_t edges64[] = {0, 1, 2, 3, 7, 8, 31, 32, 33, 63, 64, 255, 256, 4095, 4096,
                                   0x7fffffffULL, 0x80000000ULL, 0xffffffffULL, 0x100000000ULL, 0x100000001ULL,
                                   1ULL << 62, (1ULL << 63) - 1, 1ULL << 63, (1ULL << 63) + 1, ~0ULL - 1, ~0ULL};
static const uint32_t edges32[] = {0, 1, 2, 4, 5, 8, 9, 12, 13, 16, 23, 29, 30, 31, 38, 39, 40, 41, 42, 255,
                                   0x80000000u, 0xffffffffu};
#define N_EDGES64 (sizeof edges64 / sizeof edges64[0])
#define N_EDGES32 (sizeof edges32 / sizeof edges32[0])

static int structural(const field *f) { return (f->size == 4 || f->size == 8) && strcmp(f->kind, "tensor_data"); }

static void put(uint8_t *b, size_t size, uint64_t off, uint64_t width, uint64_t v) {
    if (off + width > size) return;
    for (uint64_t i = 0; i < width; i++) b[off + i] = (uint8_t)(v >> (8 * i));
}

static uint64_t hostile(const field *f, size_t size) {
    uint64_t left = size > f->offset + f->size ? size - f->offset - f->size : 0;
    uint64_t v;
    switch (below(10)) {
    case 0: v = size; break;
    case 1: v = left; break;
    case 2: v = left / (1 + below(24)); break;
    case 3: v = below(size + 64); break;
    default: v = f->size == 4 ? edges32[below(N_EDGES32)] : edges64[below(N_EDGES64)]; break;
    }
    return v + (below(5) == 0 ? 1 : 0) - (below(5) == 0 ? 1 : 0);
}

/* Mutate s into out (capacity cap); returns the new size. */
static size_t mutate(const seed *s, uint8_t *out, size_t cap) {
    size_t n = s->size < cap ? s->size : cap;
    memcpy(out, s->data, n);
    int rounds = 1 + (int)(below(4) == 0) + (int)(below(8) == 0);
    for (int r = 0; r < rounds; r++) {
        uint64_t op = below(100);
        if (op < 45 && s->n_fields) {
            const field *f = &s->fields[below((uint64_t)s->n_fields)];
            if (structural(f)) put(out, n, f->offset, f->size, hostile(f, n));
        } else if (op < 60 && n) {
            for (uint64_t k = 1 + below(8); k--;) out[below(n)] = (uint8_t)rnd();
        } else if (op < 70 && n) {
            for (uint64_t k = 1 + below(4); k--;) out[below(n)] ^= (uint8_t)(1u << below(8));
        } else if (op < 78) {
            uint64_t at = s->n_fields ? s->fields[below((uint64_t)s->n_fields)].offset + below(3) : below(n + 1);
            if (at > 0) at -= 1;
            if (at < n) n = (size_t)at;
        } else if (op < 86 && s->n_fields > 1) { /* copy a field over another of the same width */
            const field *a = &s->fields[below((uint64_t)s->n_fields)], *b = &s->fields[below((uint64_t)s->n_fields)];
            if (a->size == b->size && a->offset + a->size <= n && b->offset + b->size <= n)
                memmove(out + b->offset, out + a->offset, a->size);
        } else if (op < 93 && n) { /* delete or duplicate a span */
            size_t i = (size_t)below(n), len = 1 + (size_t)below(64);
            if (i + len > n) len = n - i;
            if (below(2)) {
                memmove(out + i, out + i + len, n - i - len);
                n -= len;
            } else if (n + len <= cap) {
                memmove(out + i + len, out + i, n - i);
                n += len;
            }
        } else { /* splice: this seed's head, another seed's tail */
            const seed *o = &seeds[below((uint64_t)n_seeds)];
            size_t head = (size_t)below(n + 1), from = (size_t)below(o->size + 1), tail = o->size - from;
            if (head + tail > cap) tail = cap - head;
            memcpy(out + head, o->data + from, tail);
            n = head + tail;
        }
    }
    return n;
}

/* An array nested `depth` deep, each level claiming `count` elements. */
static size_t nesting_bomb(uint8_t *out, size_t cap, uint64_t depth, uint64_t count) {
    size_t n = 0;
    if (cap < 64 + depth * 12) return 0;
    memcpy(out, "GGUF", 4);
    put(out, cap, 4, 4, 3);
    put(out, cap, 8, 8, 0);
    put(out, cap, 16, 8, 1);
    n = 24;
    put(out, cap, n, 8, 4), n += 8;
    memcpy(out + n, "bomb", 4), n += 4;
    put(out, cap, n, 4, BUBO_GGUF_ARRAY), n += 4;
    for (uint64_t d = 1; d < depth; d++) {
        put(out, cap, n, 4, BUBO_GGUF_ARRAY), n += 4;
        put(out, cap, n, 8, count), n += 8;
    }
    put(out, cap, n, 4, BUBO_GGUF_UINT8), n += 4;
    put(out, cap, n, 8, 1), n += 8;
    out[n++] = 1;
    return n;
}

/* -c: real files. bubo_gguf_open must accept each; the copy of everything before the data
 * section must parse up to the tensor extents (and fail there if any tensor has bytes). */
static int check_files(int n, char **paths) {
    for (int i = 0; i < n; i++) {
        bubo_gguf *g;
        bubo_err err;
        if (bubo_gguf_open(paths[i], &g, &err)) {
            fprintf(stderr, "fuzz_gguf: %s: %s\n", paths[i], err.msg);
            return 1;
        }
        touch(g);
        uint64_t head = bubo_gguf_data_offset(g), n_kv = bubo_gguf_n_kv(g), n_tensors = bubo_gguf_n_tensors(g);
        if (head > bubo_gguf_file_size(g)) head = bubo_gguf_file_size(g);
        uint8_t *copy = malloc(head);
        if (!copy) die("out of memory for %s", paths[i]);
        memcpy(copy, bubo_gguf_base(g), head);
        bubo_gguf_close(g);
        run_case(copy, head);
        free(copy);
        printf("fuzz_gguf: %s: %llu keys, %llu tensors, metadata %llu bytes\n", paths[i], (unsigned long long)n_kv,
               (unsigned long long)n_tensors, (unsigned long long)head);
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 2 && !strcmp(argv[1], "-c")) return check_files(argc - 2, argv + 2);
    uint64_t n_random = 200000, rng_seed = 1;
    const char *dir = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-n") && i + 1 < argc) n_random = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "-s") && i + 1 < argc) rng_seed = strtoull(argv[++i], NULL, 10);
        else dir = argv[i];
    }
    if (!dir) die("usage: fuzz_gguf [-n random_cases] [-s seed] corpus_dir%s", "");
    rng_state = rng_seed;
    load_seeds(dir);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);

    size_t cap = 1 << 16;
    for (int i = 0; i < n_seeds; i++)
        if (seeds[i].size * 2 + 64 > cap) cap = seeds[i].size * 2 + 64;
    uint8_t *scratch = malloc(cap);
    if (!scratch) die("out of %s", "memory");

    for (int i = 0; i < n_seeds; i++) {
        const seed *s = &seeds[i];
        bubo_gguf *g;
        bubo_err err;
        if (bubo_gguf_open_buffer(s->data, s->size, &g, &err)) {
            fprintf(stderr, "fuzz_gguf: seed %s does not load: %s\n", s->name, err.msg);
            return 1;
        }
        bubo_gguf_close(g);
        for (size_t cut = 0; cut <= s->size; cut++) run_case(s->data, cut);
        for (int k = 0; k < s->n_fields; k++) {
            const field *f = &s->fields[k];
            if (!structural(f)) continue;
            size_t n_edges = f->size == 4 ? N_EDGES32 : N_EDGES64;
            for (size_t e = 0; e < n_edges + 2; e++) {
                uint64_t v = e < n_edges ? (f->size == 4 ? edges32[e] : edges64[e])
                                         : (e == n_edges ? s->size : s->size - f->offset - f->size);
                memcpy(scratch, s->data, s->size);
                put(scratch, s->size, f->offset, f->size, v);
                run_case(scratch, s->size);
            }
        }
    }

    static const uint64_t depths[] = {1, 2, 7, 8, 9, 10, 100, 100000};
    static const uint64_t counts[] = {1, 2, 1ULL << 40, ~0ULL};
    size_t bomb_cap = 64 + 100000 * 12;
    uint8_t *bomb = malloc(bomb_cap);
    if (!bomb) die("out of %s", "memory");
    for (size_t d = 0; d < sizeof depths / sizeof depths[0]; d++)
        for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++)
            run_case(bomb, nesting_bomb(bomb, bomb_cap, depths[d], counts[c]));
    free(bomb);

    for (uint64_t i = 0; i < n_random; i++) {
        const seed *s = &seeds[below((uint64_t)n_seeds)];
        run_case(scratch, mutate(s, scratch, cap));
    }
    free(scratch);

    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    printf("fuzz_gguf: %d seeds, %llu cases in %.2f s: %llu loaded, %llu format errors, %llu unsupported, "
           "%llu other; allocation bound %s\n",
           n_seeds, (unsigned long long)stats.cases, secs, (unsigned long long)stats.loaded,
           (unsigned long long)stats.by_status[BUBO_ERR_FORMAT], (unsigned long long)stats.by_status[BUBO_ERR_UNSUPPORTED],
           (unsigned long long)(stats.cases - stats.loaded - stats.by_status[BUBO_ERR_FORMAT] -
                                stats.by_status[BUBO_ERR_UNSUPPORTED]),
#ifdef HAVE_ALLOC_STATS
           "checked"
#else
           "not checked (no ASan allocator)"
#endif
    );
    for (int i = 0; i < n_seeds; i++) free(seeds[i].data);
    return 0;
}
