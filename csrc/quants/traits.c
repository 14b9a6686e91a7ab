/* The one table of type traits: names and block sizes for every GGUF type id, and the kernels
 * of the types bubo runs, filled once by each family's bubo_register_* function. */
#include <pthread.h>

#include "quants_internal.h"

static bubo_type_traits table[BUBO_TYPE_COUNT];
static pthread_once_t table_once = PTHREAD_ONCE_INIT;

static void set_layout(bubo_type t, const char *name, int64_t blck, size_t size) {
    table[t].name = name;
    table[t].blck_size = blck;
    table[t].type_size = size;
}

static void init_table(void) {
    /* Every type GGUF defines, so that a file with tensors bubo does not run still parses and
     * the error can name the type: the types bubo runs from their block structs (bubo/quants.h),
     * the others from GGUF's sizes (they have no struct here). */
    set_layout(BUBO_TYPE_F32, "f32", 1, sizeof(float));
    set_layout(BUBO_TYPE_F16, "f16", 1, sizeof(bubo_f16));
    set_layout(BUBO_TYPE_Q4_0, "q4_0", QK4_0, sizeof(block_q4_0));
    set_layout(BUBO_TYPE_Q4_1, "q4_1", QK4_1, sizeof(block_q4_1));
    set_layout(BUBO_TYPE_Q5_0, "q5_0", QK5_0, sizeof(block_q5_0));
    set_layout(BUBO_TYPE_Q5_1, "q5_1", QK5_1, sizeof(block_q5_1));
    set_layout(BUBO_TYPE_Q8_0, "q8_0", QK8_0, sizeof(block_q8_0));
    set_layout(BUBO_TYPE_Q8_1, "q8_1", QK8_1, sizeof(block_q8_1));
    set_layout(BUBO_TYPE_Q2_K, "q2_K", QK_K, sizeof(block_q2_K));
    set_layout(BUBO_TYPE_Q3_K, "q3_K", QK_K, sizeof(block_q3_K));
    set_layout(BUBO_TYPE_Q4_K, "q4_K", QK_K, sizeof(block_q4_K));
    set_layout(BUBO_TYPE_Q5_K, "q5_K", QK_K, sizeof(block_q5_K));
    set_layout(BUBO_TYPE_Q6_K, "q6_K", QK_K, sizeof(block_q6_K));
    set_layout(BUBO_TYPE_Q8_K, "q8_K", QK_K, sizeof(block_q8_K));
    set_layout(BUBO_TYPE_IQ2_XXS, "iq2_xxs", 256, 66);
    set_layout(BUBO_TYPE_IQ2_XS, "iq2_xs", 256, 74);
    set_layout(BUBO_TYPE_IQ3_XXS, "iq3_xxs", 256, 98);
    set_layout(BUBO_TYPE_IQ1_S, "iq1_s", 256, 50);
    set_layout(BUBO_TYPE_IQ4_NL, "iq4_nl", 32, 18);
    set_layout(BUBO_TYPE_IQ3_S, "iq3_s", 256, 110);
    set_layout(BUBO_TYPE_IQ2_S, "iq2_s", 256, 82);
    set_layout(BUBO_TYPE_IQ4_XS, "iq4_xs", 256, 136);
    set_layout(BUBO_TYPE_I8, "i8", 1, 1);
    set_layout(BUBO_TYPE_I16, "i16", 1, 2);
    set_layout(BUBO_TYPE_I32, "i32", 1, 4);
    set_layout(BUBO_TYPE_I64, "i64", 1, 8);
    set_layout(BUBO_TYPE_F64, "f64", 1, 8);
    set_layout(BUBO_TYPE_IQ1_M, "iq1_m", 256, 56);
    set_layout(BUBO_TYPE_BF16, "bf16", 1, sizeof(bubo_bf16));
    set_layout(BUBO_TYPE_TQ1_0, "tq1_0", 256, 54);
    set_layout(BUBO_TYPE_TQ2_0, "tq2_0", 256, 66);
    set_layout(BUBO_TYPE_MXFP4, "mxfp4", 32, 17);
    set_layout(BUBO_TYPE_NVFP4, "nvfp4", 64, 36);
    set_layout(BUBO_TYPE_Q1_0, "q1_0", 128, 18);

    bubo_register_float(table);
    bubo_register_q4(table);
    bubo_register_q5(table);
    bubo_register_q8(table);
    bubo_register_q2_k(table);
    bubo_register_q3_k(table);
    bubo_register_q4_k(table);
    bubo_register_q5_k(table);
    bubo_register_q6_k(table);
    bubo_register_q8_k(table);
}

const bubo_type_traits *bubo_type_get_traits(int type) {
    if (type < 0 || type >= BUBO_TYPE_COUNT) return NULL;
    pthread_once(&table_once, init_table);
    return table[type].name ? &table[type] : NULL;
}

/* Best variant: the CPU's level (or the given one), else each lower level down to scalar. NEON is
 * only ever present on arm64 and the x86 levels only on x86-64, so one walk serves both. */
#define PICK_FROM(field, from)                                                    \
    const bubo_type_traits *t = bubo_type_get_traits(type);                       \
    if (!t) return NULL;                                                          \
    static const bubo_isa walk[] = {BUBO_ISA_AVX512, BUBO_ISA_AVX2, BUBO_ISA_NEON}; \
    const bubo_isa best = (from);                                                 \
    int started = 0;                                                              \
    for (int i = 0; i < 3; i++) {                                                 \
        if (walk[i] == best) started = 1;                                         \
        if (started && t->field[walk[i]] && bubo_cpu_supports(walk[i]))           \
            return t->field[walk[i]];                                             \
    }                                                                             \
    return t->field[BUBO_ISA_SCALAR];

#define PICK_BEST(field) PICK_FROM(field, bubo_cpu_best_isa())

bubo_to_float_fn bubo_get_to_float(bubo_type type) { PICK_BEST(to_float) }
bubo_from_float_fn bubo_get_from_float(bubo_type type) { PICK_BEST(from_float) }
bubo_vec_dot_fn bubo_get_vec_dot(bubo_type type) { PICK_BEST(vec_dot) }
bubo_vec_dot_tile_fn bubo_get_vec_dot_tile(bubo_type type) { PICK_BEST(vec_dot_tile) }
bubo_to_float_fn bubo_get_to_float_isa(bubo_type type, bubo_isa isa) { PICK_FROM(to_float, isa) }
bubo_vec_dot_fn bubo_get_vec_dot_isa(bubo_type type, bubo_isa isa) { PICK_FROM(vec_dot, isa) }

bubo_isa bubo_prepack_isa(bubo_type type) {
    const bubo_type_traits *t = bubo_type_get_traits(type);
    const bubo_isa best = bubo_cpu_best_isa();
    return t && t->prepack[best] && t->vec_dot_tile_prepacked[best] ? best : BUBO_ISA_COUNT;
}

size_t bubo_prepacked_size(bubo_type type, int64_t rows, int64_t n) {
    if (rows < 0) return 0;
    return bubo_row_size(type, n) * (size_t)((rows + 15) / 16 * 16);
}

size_t bubo_row_size(bubo_type type, int64_t n) {
    const bubo_type_traits *t = bubo_type_get_traits(type);
    if (!t || n < 0 || n % t->blck_size) return 0;
    return (size_t)(n / t->blck_size) * t->type_size;
}
