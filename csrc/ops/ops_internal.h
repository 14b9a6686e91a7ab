/* Shared by the op files: each fills its ops' entries of the per-level tables in its
 * bubo_register_* function, and ops.c calls them all once. */
#ifndef BUBO_OPS_INTERNAL_H
#define BUBO_OPS_INTERNAL_H

#include "bubo/ops.h"
#include "vmath.h"

/* tables[BUBO_ISA_COUNT], one per level; a level this architecture lacks stays unfilled. */
void bubo_register_norm(bubo_ops *tables);
void bubo_register_rope(bubo_ops *tables);
void bubo_register_softmax(bubo_ops *tables);
void bubo_register_act(bubo_ops *tables);
void bubo_register_elementwise(bubo_ops *tables);
void bubo_register_attention(bubo_ops *tables);
void bubo_register_rows(bubo_ops *tables);

#endif
