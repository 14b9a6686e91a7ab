/* Every NEON kernel against the scalar reference, on arm64 (under qemu-user on x86-64 hosts).
 *
 * Built by tests/native/test_neon.py with aarch64-linux-gnu-gcc from the same csrc/ files as
 * the library, once for baseline armv8-a and once with +dotprod, and run under qemu-aarch64.
 * The NEON matrix-matrix tiles (vec_dot_tile) are checked pair by pair against the scalar
 * vec_dot, on a tile with rows, tokens and strides that are not multiples of anything.
 * Tolerances match tests/native/test_quants.py: dequantization within an ulp or two, the dot
 * product within 2e-6 of sum |w_i a_i|, activation quantization within one step. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

int main(void) {
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
