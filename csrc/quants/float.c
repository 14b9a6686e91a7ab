/* placeholder: to be written */
#include "quants_internal.h"

void bubo_register_float(bubo_type_traits *table) { (void)table; }

float bubo_f16_to_f32(bubo_f16 h) { (void)h; return 0.0f; }
bubo_f16 bubo_f32_to_f16(float f) { (void)f; return 0; }
float bubo_bf16_to_f32(bubo_bf16 h) { (void)h; return 0.0f; }
bubo_bf16 bubo_f32_to_bf16(float f) { (void)f; return 0; }
