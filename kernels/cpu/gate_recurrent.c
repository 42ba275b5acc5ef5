// GSPN-1's gate recurrence on the CPU (kernels/cpu/gate_recurrent.h): the cores of
// gate_recurrent_impl.h for float and for double. Planes run in parallel (OpenMP); each is one
// thread's, so results do not depend on the thread count.
#include "gate_recurrent.h"

#define GR_REAL float
#define GR_SFX f32
#include "gate_recurrent_impl.h"

#define GR_REAL double
#define GR_SFX f64
#include "gate_recurrent_impl.h"
