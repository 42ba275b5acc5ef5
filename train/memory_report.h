// The memory a run holds on its device, in the parts docs/memory.md names: parameters (values
// and gradients), fp32 master weights, optimizer state (AdamW moments), activations (the step's
// arena: activations, their gradients, tape scratch) and workspaces (the rest the process holds:
// the GPU libraries' workspaces, the pool of per-op temporaries, input batches). The commands
// print the plan after the first step, when the arena's placement is fixed (it is the same every
// step: kernels/arena.h), and the measured peak on every progress line.
#pragma once
#include "../kernels/arena.h"
#include "../nn/params.h"
#include <stdio.h>

typedef struct MemoryPlan {
    size_t params, masters, optimizer, activations, workspaces;
    size_t total;   // the sum: the planned peak
} MemoryPlan;

// tables: every parameter table the run holds on the device (model, EMA, frozen teacher,
// adaptors); arena: the step's. workspaces = what device_memory_use holds beyond the rest.
MemoryPlan memory_plan(const Ctx *ctx, const ParamTable *const *tables, int n_tables,
                       const Arena *arena);
// "memory plan: 13.52 GiB = parameters 0.65 + masters 0.33 + optimizer 0.65 + activations
// 11.60 + workspaces 0.29 GiB (per device)"; MiB when the total is under 1 GiB.
void memory_plan_print(FILE *f, const MemoryPlan *m);
// "13.52 GiB", or "61.3 MiB" under 1 GiB; returns buf.
const char *format_bytes(size_t bytes, char *buf, size_t n);
// The header's line, before the first step: "memory: parameters 0.65 + masters 0.33 + optimizer
// 0.65 GiB held; activations and workspaces are planned in the first step (per device)".
void memory_header_print(FILE *f, const MemoryPlan *m);
// The measured peak since the last call (device_memory_use), and a new measuring window.
size_t memory_peak_take(Ctx *ctx);
