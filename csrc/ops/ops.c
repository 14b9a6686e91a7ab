/* The op tables: one bubo_ops per level, filled once by each op file, and the pick of the best. */
#include <pthread.h>

#include "ops_internal.h"

static bubo_ops tables[BUBO_ISA_COUNT];
static const bubo_ops *best;
static pthread_once_t tables_once = PTHREAD_ONCE_INIT;

static void init_tables(void) {
    for (int isa = 0; isa < BUBO_ISA_COUNT; isa++) tables[isa].isa = (bubo_isa)isa;
    bubo_register_norm(tables);
    bubo_register_rope(tables);
    bubo_register_softmax(tables);
    bubo_register_act(tables);
    bubo_register_elementwise(tables);
    bubo_register_attention(tables);
    bubo_register_rows(tables);
    best = &tables[BUBO_ISA_SCALAR];
    const bubo_isa chosen = bubo_cpu_best_isa();
    /* rms_norm stands for the whole table: every op file registers every level it builds */
    if (tables[chosen].rms_norm) best = &tables[chosen];
}

const bubo_ops *bubo_ops_for_isa(bubo_isa isa) {
    if ((unsigned)isa >= BUBO_ISA_COUNT || !bubo_cpu_supports(isa)) return NULL;
    pthread_once(&tables_once, init_tables);
    return tables[isa].rms_norm ? &tables[isa] : NULL;
}

const bubo_ops *bubo_ops_best(void) {
    pthread_once(&tables_once, init_tables);
    return best;
}
