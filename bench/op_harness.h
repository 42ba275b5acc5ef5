// Runs the cases of bench/op_cases.h on one backend: their tensors filled as the case says, the
// phases run, results read back, a phase timed with the bytes its ops move.
#pragma once
#include "op_cases.h"

typedef struct CaseTensors {
    Ctx *ctx;
    DType mode;
    Tensor *t[OPC_MAX_ARGS];    // NULL where the argument is absent
    float *init[OPC_MAX_ARGS];  // the starting values, as stored (bf16-rounded where so), or NULL
} CaseTensors;

enum { PHASE_FWD = 1, PHASE_BWD = 2, PHASE_BOTH = 3 };

// Makes c's tensors on ctx in mode (DTYPE_F32 or DTYPE_BF16) from seed. On the CPU every tensor is
// fp32 holding the values the mode's dtype stores, so the reference sees what the GPU sees.
// keep_init: remember the starting values (case_tensors_reset, finite differences).
void case_tensors_make(CaseTensors *ct, const OpCase *c, Ctx *ctx, DType mode, uint64_t seed,
                       int keep_init);
// Every argument but the inputs back to its starting values (needs keep_init).
void case_tensors_reset(CaseTensors *ct, const OpCase *c);
void case_tensors_free(CaseTensors *ct);
// Runs the phases (PHASE_*) of c on ct's tensors.
void case_run(const OpCase *c, CaseTensors *ct, int phases);
// In bf16 mode, rounds the CPU's activation-dtype results to bf16, as the GPU stores what its
// forward hands its backward.
void case_round_results(const OpCase *c, CaseTensors *ct);
// Argument i as host fp32 (free it).
float *case_download(const CaseTensors *ct, int i);

// Mean ms of a phase over reps after a warm-up call, and the bytes it must move: its ops' tensor
// arguments (kernels/ctx.h's count, each once), those it adds into twice (read and written); and
// the FLOPs its ops report. GPU only.
double case_time_ms(const OpCase *c, CaseTensors *ct, int phase, int reps, double *bytes,
                    double *flops);
