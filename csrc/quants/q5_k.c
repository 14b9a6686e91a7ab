/* placeholder: to be written */
#include "quants_internal.h"

void bubo_register_q5_k(bubo_type_traits *table) { (void)table; }
