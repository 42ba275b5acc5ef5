// GPU time of one step by op and by phase: a CUDA event pair around every dispatched op
// (Ctx.profile, kernels/dispatch.c) and a named mark at the start of each phase, all on the
// context's main stream. Used by `cgspn bench vit` (per-op table) and `cgspn bench distill
// --profile` (1 GPU against N GPUs). On the CPU every call is a no-op (op_profile_start: NULL).
#pragma once
#include "../kernels/ctx.h"
#include <stdio.h>

typedef struct OpProfile OpProfile;

typedef struct OpTotal {
    const char *name;
    int calls;
    double ms;
    double bytes;   // of the calls' tensor arguments (kernels/ctx.h's profile hook)
    double flops;   // of their matrix products, as the ops report them (ctx_profile_flops); 0: none
} OpTotal;

enum { OP_PROFILE_MAX_PHASES = 16 };

typedef struct OpPhase {
    const char *name;
    double ms;      // from its mark to the next one (the last: to op_profile_stop)
    double op_ms;   // of that, inside ops; the rest is gaps and waits on other streams
    int ops;
} OpPhase;

// Installs the hook on ctx (which must stay alive until op_profile_stop). NULL off the GPU.
OpProfile *op_profile_start(Ctx *ctx);
// Starts a phase named `phase` (a string that outlives the profile) at this point of the stream.
void op_profile_mark(OpProfile *p, const char *phase);
// Ends the last phase, waits for the stream and removes the hook.
void op_profile_stop(OpProfile *p);
void op_profile_free(OpProfile *p);

// Total ms from the first mark (or op) to the stop.
double op_profile_total_ms(const OpProfile *p);
// Per op name, largest total first; returns how many (at most max).
int op_profile_totals(const OpProfile *p, OpTotal *out, int max);
// The phases in order; returns how many.
int op_profile_phases(const OpProfile *p, OpPhase *out, int max);
// The op table against step_ms, with the part of the step outside ops; per op its GB/s over the
// bytes of its tensor arguments (each tensor once: what a memory-bound op must move at least,
// so ops that add into an output show low), that as a percent of copy_gbs (the device's copy
// bandwidth), the TFLOP/s of the products it reports, and its roofline: the longer of its bytes
// at copy_gbs and its FLOPs at peak_tflops, as a percent of its time (the columns need copy_gbs
// and peak_tflops > 0). CGSPN_PROFILE_CALLS=op,op,... adds a row for every call of those ops (by
// their order in the step): which of an op's shapes takes the time.
void op_profile_print(FILE *out, const OpProfile *p, double step_ms, double copy_gbs,
                      double peak_tflops);
// Every timed call in order (name and ms), `per_line` to a line: for short profiles (one block).
void op_profile_print_calls(FILE *out, const OpProfile *p, int per_line);
