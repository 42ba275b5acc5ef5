#include "ctx.h"

Ctx ctx_cpu(void) { return (Ctx){.device = DEVICE_CPU, .act_dtype = DTYPE_F32, .deterministic = 1}; }
