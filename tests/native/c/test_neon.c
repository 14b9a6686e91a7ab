/* Every NEON kernel against the scalar reference, on arm64 (under qemu-user on x86-64 hosts).
 *
 * Built by tests/native/test_neon.py with aarch64-linux-gnu-gcc from the same csrc/ files as
 * the library, once for baseline armv8-a and once with +dotprod, and run under qemu-aarch64.
 * The NEON matrix-matrix tiles (vec_dot_tile) are checked pair by pair against the scalar
 * vec_dot, on a tile with rows, tokens and strides that are not multiples of anything. Paged
 * attention's NEON level must give the scalar level's bits (f16 and q8_0 caches, head sizes 64
 * and 128, windows that cut the position groups and span several chunks). The encoder's float ops
 * (LayerNorm, strided dot products and weighted sums) within a few ulps of the scalar level.
 * Tolerances match tests/native/test_quants.py: dequantization within an ulp or two, the dot
 * product within 2e-6 of sum |w_i a_i|, activation quantization within one step. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bubo/cpu.h"
#include "bubo/kv.h"
#include "bubo/ops.h"
#include "bubo/quants.h"

#define DEQUANT_RTOL 1e-6
#define DOT_RTOL 2e-6

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}
static float rnd_normal(void) { /* sum of uniforms: close enough to a bell for kernel tests */
    float s = 0;
    for (int i = 0; i < 12; i++) s += (rnd() & 0xffff) / 65536.0f;
    return s - 6.0f;
}

/* Offsets of the f16 scale fields per block (random bits there could be inf or nan). */
static int scale_offsets(int type, int *off) {
    switch (type) {
    case BUBO_TYPE_Q4_0: case BUBO_TYPE_Q5_0: case BUBO_TYPE_Q8_0: off[0] = 0; return 1;
    case BUBO_TYPE_Q4_1: case BUBO_TYPE_Q5_1: case BUBO_TYPE_Q4_K: case BUBO_TYPE_Q5_K:
        off[0] = 0; off[1] = 2; return 2;
    case BUBO_TYPE_Q2_K: off[0] = 80; off[1] = 82; return 2;
    case BUBO_TYPE_Q3_K: off[0] = 108; return 1;
    case BUBO_TYPE_Q6_K: off[0] = 208; return 1;
    default: return 0;
    }
}

static void random_row(int type, const bubo_type_traits *t, uint8_t *row, int n) {
    if (type == BUBO_TYPE_F32) {
        for (int i = 0; i < n; i++) ((float *)row)[i] = rnd_normal();
        return;
    }
    if (type == BUBO_TYPE_F16 || type == BUBO_TYPE_BF16) {
        for (int i = 0; i < n; i++)
            ((uint16_t *)row)[i] = type == BUBO_TYPE_F16 ? bubo_f32_to_f16(rnd_normal())
                                                         : bubo_f32_to_bf16(rnd_normal());
        return;
    }
    size_t nb = n / t->blck_size;
    for (size_t i = 0; i < nb * t->type_size; i++) row[i] = (uint8_t)rnd();
    int off[2];
    int k = scale_offsets(type, off);
    for (size_t b = 0; b < nb; b++)
        for (int j = 0; j < k; j++) {
            float s = 0.002f + 0.05f * (rnd() & 0xffff) / 65536.0f;
            if (rnd() & 1) s = -s;
            bubo_f16 h = bubo_f32_to_f16(s);
            memcpy(row + b * t->type_size + off[j], &h, 2);
        }
}

static int failures = 0, checks = 0;
#define FAIL(...) do { printf("FAIL: " __VA_ARGS__); printf("\n"); failures++; } while (0)

/* A TILE_ROWS x TILE_TOKENS tile of n elements through the NEON vec_dot_tile, against the scalar
 * vec_dot of each pair; weight rows, activation rows and outputs padded to odd strides. */
enum { TILE_N_MAX = 512, TILE_ROWS = 19, TILE_TOKENS = 11, TILE_PAD = 13 };
static int check_tile(int type, const bubo_type_traits *t, const bubo_type_traits *vt, int n) {
    static uint8_t w[TILE_ROWS][TILE_N_MAX * 4 + TILE_PAD], y[TILE_TOKENS][TILE_N_MAX * 4 + TILE_PAD];
    static float s[TILE_TOKENS][TILE_ROWS + 3], deq[TILE_N_MAX], act[TILE_TOKENS][TILE_N_MAX];
    if (!t->vec_dot_tile[BUBO_ISA_NEON]) {
        FAIL("%s has no NEON vec_dot_tile", t->name);
        return 0;
    }
    for (int r = 0; r < TILE_ROWS; r++) random_row(type, t, w[r], n);
    for (int k = 0; k < TILE_TOKENS; k++) {
        for (int i = 0; i < n; i++) act[k][i] = rnd_normal();
        vt->from_float[BUBO_ISA_SCALAR](act[k], y[k], n);
    }
    for (int k = 0; k < TILE_TOKENS; k++)
        for (int r = 0; r < TILE_ROWS + 3; r++) s[k][r] = NAN;
    t->vec_dot_tile[BUBO_ISA_NEON](n, TILE_ROWS, TILE_TOKENS, &s[0][0], TILE_ROWS + 3, w, sizeof w[0], y, sizeof y[0]);
    for (int r = 0; r < TILE_ROWS; r++) {
        t->to_float[BUBO_ISA_SCALAR](w[r], deq, n);
        for (int k = 0; k < TILE_TOKENS; k++) {
            float want = 0;
            t->vec_dot[BUBO_ISA_SCALAR](n, &want, w[r], y[k]);
            double sum_abs = 0;
            for (int i = 0; i < n; i++) sum_abs += fabs((double)deq[i] * act[k][i]);
            checks++;
            if (!(fabs((double)s[k][r] - want) <= DOT_RTOL * sum_abs + 1e-6)) {
                FAIL("%s vec_dot_tile neon [%d][%d] %.9g vs scalar vec_dot %.9g", t->name, k, r, s[k][r], want);
                return 0;
            }
        }
    }
    for (int k = 0; k < TILE_TOKENS; k++)
        for (int r = TILE_ROWS; r < TILE_ROWS + 3; r++)
            if (!isnan(s[k][r])) {
                FAIL("%s vec_dot_tile neon wrote outside its tile", t->name);
                return 0;
            }
    return 1;
}

/* One cache layer of n_pos positions (blocks of 16 in reversed table order, 2 KV heads), 3 query
 * heads of 2 tokens: NEON against scalar, bit for bit. */
static int check_attention(bubo_type type, int hd) {
    enum { N_POS = 600, BS = 16, N_KV = 2, N_Q = 3, N_TOK = 2 };
    const bubo_type_traits *t = bubo_type_get_traits(type);
    /* the queries as attention takes them: f32 rows against f16 K, q8_0 rows against q8_0 K */
    const bubo_type q_type = type == BUBO_TYPE_Q8_0 ? BUBO_TYPE_Q8_0 : BUBO_TYPE_F32;
    const bubo_type_traits *qt = bubo_type_get_traits(q_type);
    const size_t head_bytes = bubo_row_size(type, hd), row_bytes = N_KV * head_bytes;
    const int n_blocks = (N_POS + BS - 1) / BS;
    uint8_t *k = calloc((size_t)n_blocks * BS, row_bytes), *v = calloc((size_t)n_blocks * BS, row_bytes);
    const size_t q_stride = bubo_row_size(q_type, hd);
    uint8_t *q = calloc((size_t)N_TOK * N_Q, q_stride);
    float *x = malloc(sizeof(float) * hd);
    int32_t table[(N_POS + BS - 1) / BS];
    for (int b = 0; b < n_blocks; b++) table[b] = n_blocks - 1 - b;
    for (int r = 0; r < n_blocks * BS * N_KV; r++) {
        for (int i = 0; i < hd; i++) x[i] = rnd_normal();
        t->from_float[BUBO_ISA_SCALAR](x, k + (size_t)r * head_bytes, hd);
        for (int i = 0; i < hd; i++) x[i] = rnd_normal();
        t->from_float[BUBO_ISA_SCALAR](x, v + (size_t)r * head_bytes, hd);
    }
    for (int r = 0; r < N_TOK * N_Q; r++) {
        for (int i = 0; i < hd; i++) x[i] = rnd_normal() * 0.3f;
        qt->from_float[BUBO_ISA_SCALAR](x, q + (size_t)r * q_stride, hd);
    }
    bubo_kv_view view = {.type = type, .type_v = type, .block_size = BS, .k = k, .v = v,
                         .block_bytes_k = BS * row_bytes, .block_bytes_v = BS * row_bytes, .row_bytes_k = row_bytes,
                         .row_bytes_v = row_bytes, .head_bytes_k = head_bytes, .head_bytes_v = head_bytes,
                         .head_stride_k = head_bytes, .head_stride_v = head_bytes, .table = table};
    const int32_t begin[N_TOK] = {3, 0}, end[N_TOK] = {599, 277};
    float *scratch = malloc(sizeof(float) * bubo_attend_scratch_floats(N_TOK, N_Q, hd, hd));
    float *o0 = calloc((size_t)N_TOK * N_Q * hd, sizeof(float)), *o1 = calloc((size_t)N_TOK * N_Q * hd, sizeof(float));
    int ok = 1;
    for (int kv_head = 0; kv_head < N_KV; kv_head++) {
        bubo_attend_paged_isa(BUBO_ISA_SCALAR, &view, kv_head, hd, hd, N_TOK, begin, end, N_Q, q, q_stride, 0.125f,
                              o0, (size_t)N_Q * hd, scratch);
        bubo_attend_paged_isa(BUBO_ISA_NEON, &view, kv_head, hd, hd, N_TOK, begin, end, N_Q, q, q_stride, 0.125f,
                              o1, (size_t)N_Q * hd, scratch);
        checks++;
        if (memcmp(o0, o1, sizeof(float) * N_TOK * N_Q * hd) != 0) {
            FAIL("%s attention neon (head size %d, KV head %d) differs from scalar", t->name, hd, kv_head);
            ok = 0;
            break;
        }
    }
    free(k), free(v), free(q), free(x), free(scratch), free(o0), free(o1);
    return ok;
}

/* The encoder's float ops (LayerNorm, strided dot products and weighted sums) at the NEON level
 * against the scalar one: f32 lanes against double or eight-way sums, each within 2 n ulps of the
 * sum of its terms' magnitudes. The rows' elements past n hold NaN: a read past a row's end
 * shows. */
static int check_encoder_ops(void) {
    enum { LEN = 100, ROWS = 23, STRIDE = 131 };
    const bubo_ops *s = bubo_ops_for_isa(BUBO_ISA_SCALAR), *v = bubo_ops_for_isa(BUBO_ISA_NEON);
    static float x[STRIDE * ROWS], w[LEN], b[LEN], y0[LEN], y1[LEN], o0[ROWS], o1[ROWS];
    for (int i = 0; i < LEN; i++) w[i] = rnd_normal(), b[i] = rnd_normal();
    for (int n = 1; n <= LEN; n += 11) {
        for (int j = 0; j < ROWS; j++)
            for (int i = 0; i < STRIDE; i++) x[j * STRIDE + i] = i < n ? rnd_normal() * 3.0f + 1.5f : NAN;
        /* LayerNorm: the centered values carry the mean's rounding, max |x| / spread ulps */
        double mean = 0, var = 0, amax = 0;
        for (int i = 0; i < n; i++) mean += x[i], amax = fmax(amax, fabs(x[i]));
        mean /= n;
        for (int i = 0; i < n; i++) var += (x[i] - mean) * (x[i] - mean);
        const double cond = 1 + amax / sqrt(var / n + 1e-5);
        s->layer_norm(n, y0, x, w, b, 1e-5f);
        v->layer_norm(n, y1, x, w, b, 1e-5f);
        for (int i = 0; i < n; i++, checks++)
            if (!(fabs((double)y0[i] - y1[i]) <= 2.0 * n * FLT_EPSILON * (cond * fabs(w[i]) + fabs(y0[i])))) {
                FAIL("layer_norm neon n=%d element %d: %g vs scalar %g", n, i, y1[i], y0[i]);
                return 0;
            }
        s->dot_rows(ROWS, n, w, x, STRIDE, o0);
        v->dot_rows(ROWS, n, w, x, STRIDE, o1);
        for (int j = 0; j < ROWS; j++, checks++) {
            double mag = 0;
            for (int i = 0; i < n; i++) mag += fabs((double)w[i] * x[(size_t)j * STRIDE + i]);
            if (!(fabs((double)o0[j] - o1[j]) <= 2.0 * n * FLT_EPSILON * mag + 1e-30)) {
                FAIL("dot_rows neon n=%d row %d: %g vs scalar %g", n, j, o1[j], o0[j]);
                return 0;
            }
        }
        s->sum_rows(ROWS, n, b, x, STRIDE, y0);
        v->sum_rows(ROWS, n, b, x, STRIDE, y1);
        for (int i = 0; i < n; i++, checks++) {
            double mag = 0;
            for (int j = 0; j < ROWS; j++) mag += fabs((double)b[j] * x[(size_t)j * STRIDE + i]);
            if (!(fabs((double)y0[i] - y1[i]) <= 2.0 * ROWS * FLT_EPSILON * mag + 1e-30)) {
                FAIL("sum_rows neon n=%d element %d: %g vs scalar %g", n, i, y1[i], y0[i]);
                return 0;
            }
        }
    }
    return 1;
}

int main(void) {
    for (int hd = 64; hd <= 128; hd += 64)
        if (check_attention(BUBO_TYPE_F16, hd) && check_attention(BUBO_TYPE_Q8_0, hd))
            printf("ok attention neon, head size %d\n", hd);
    if (check_encoder_ops()) printf("ok encoder ops neon\n");

    enum { N = 2048, ROWS = 8 };
    static uint8_t row[N * 8], act[N * 8], act2[N * 8];
    static float x[N], y0[N], y1[N], a[N];

    for (int type = 0; type < BUBO_TYPE_COUNT; type++) {
        const bubo_type_traits *t = bubo_type_get_traits(type);
        if (!t) continue;
        const char *nm = t->name;
        /* activation quantizers: NEON vs scalar within one step */
        if (t->from_float[BUBO_ISA_NEON] && t->from_float[BUBO_ISA_SCALAR] && t->to_float[BUBO_ISA_SCALAR]) {
            for (int r = 0; r < ROWS; r++) {
                float mag = powf(10.0f, (float)(rnd() % 5) - 2.0f);
                for (int i = 0; i < N; i++) x[i] = rnd_normal() * mag;
                if (r == 0) memset(x, 0, sizeof(float) * t->blck_size);
                t->from_float[BUBO_ISA_SCALAR](x, act, N);
                t->from_float[BUBO_ISA_NEON](x, act2, N);
                t->to_float[BUBO_ISA_SCALAR](act, y0, N);
                t->to_float[BUBO_ISA_SCALAR](act2, y1, N);
                for (int b = 0; b < N / t->blck_size; b++) {
                    float amax = 0;
                    for (int i = 0; i < t->blck_size; i++) amax = fmaxf(amax, fabsf(x[b * t->blck_size + i]));
                    float step = amax / 127.0f;
                    for (int i = 0; i < t->blck_size; i++) {
                        int k = b * t->blck_size + i;
                        checks++;
                        if (fabsf(y0[k] - y1[k]) > step * 1.0001f + 1e-30f) {
                            FAIL("%s from_float neon element %d: %g vs scalar %g", nm, k, y1[k], y0[k]);
                            goto next_type;
                        }
                    }
                }
            }
            printf("ok %s from_float neon\n", nm);
        }
        if (!t->supported) continue;
        const bubo_type_traits *vt = bubo_type_get_traits(t->vec_dot_type);
        int n = t->blck_size == 1 ? N : (int)(N / t->blck_size) * (int)t->blck_size;
        /* f32 -> f32 is a memcpy at every level: only the scalar entry exists */
        if (!t->to_float[BUBO_ISA_NEON] && type != BUBO_TYPE_F32) FAIL("%s has no NEON to_float", nm);
        if (!t->vec_dot[BUBO_ISA_NEON]) FAIL("%s has no NEON vec_dot", nm);
        for (int r = 0; r < ROWS; r++) {
            random_row(type, t, row, n);
            if (t->to_float[BUBO_ISA_NEON]) {
                t->to_float[BUBO_ISA_SCALAR](row, y0, n);
                t->to_float[BUBO_ISA_NEON](row, y1, n);
                float amax = 0;
                for (int i = 0; i < n; i++) amax = fmaxf(amax, fabsf(y0[i]));
                for (int i = 0; i < n; i++) {
                    checks++;
                    if (fabsf(y0[i] - y1[i]) > DEQUANT_RTOL * fabsf(y0[i]) + 1e-6f * amax) {
                        FAIL("%s to_float neon element %d: %g vs scalar %g", nm, i, y1[i], y0[i]);
                        goto next_type;
                    }
                }
            }
            if (t->vec_dot[BUBO_ISA_NEON]) {
                float mag = powf(10.0f, (float)(rnd() % 5) - 2.0f);
                for (int i = 0; i < n; i++) a[i] = rnd_normal() * mag;
                vt->from_float[BUBO_ISA_SCALAR](a, act, n);
                float s0 = 0, s1 = 0;
                t->vec_dot[BUBO_ISA_SCALAR](n, &s0, row, act);
                t->vec_dot[BUBO_ISA_NEON](n, &s1, row, act);
                t->to_float[BUBO_ISA_SCALAR](row, y0, n);
                double sum_abs = 0;
                for (int i = 0; i < n; i++) sum_abs += fabs((double)y0[i] * a[i]);
                checks++;
                if (fabs((double)s0 - s1) > DOT_RTOL * sum_abs + 1e-6) {
                    FAIL("%s vec_dot neon %.9g vs scalar %.9g (sum|w*a| %.6g)", nm, s1, s0, sum_abs);
                    goto next_type;
                }
            }
        }
        printf("ok %s to_float+vec_dot neon\n", nm);
        if (!check_tile(type, t, vt, n < 512 ? n : 512)) goto next_type;
        printf("ok %s vec_dot_tile neon\n", nm);
    next_type:;
    }
    printf("%d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}
