// One optimizer step over the parameter table: global gradient norm, clipping, AdamW with
// per-parameter decay, the warmup + cosine schedule; then gradients are zeroed.
#pragma once
#include "../nn/params.h"
#include "../nn/schedule.h"
#include "../kernels/arena.h"
#include "../dist/grads.h"
#include "config.h"

typedef struct OptimizerConfig {
    LrSchedule schedule;
    float beta1, beta2, eps, weight_decay;
    float grad_clip;          // 0 = no clipping
} OptimizerConfig;

typedef struct StepStats {
    float lr, grad_norm;
    int finite;               // 0 when the gradient norm is NaN/Inf (the step was not applied)
} StepStats;

// step is 0-based (the schedule's step); AdamW's bias correction uses step + 1.
StepStats optimizer_step(ParamTable *t, Ctx *ctx, Arena *scratch, const OptimizerConfig *o,
                         long step);

// The data-parallel step (dist/grads.h): waits for the gradient averaging, then
//   zero = 0: optimizer_step on the averaged gradient, the same on every rank;
//   zero = 1: the global norm from every rank's shard (sums of squares added in rank order,
//             the same on every rank), AdamW on this rank's shard only (elementwise, so each
//             element is updated exactly as optimizer_step would), then the all-gather of the
//             updated values.
// g == NULL or a world of one: optimizer_step itself.
StepStats optimizer_step_dist(ParamTable *t, Ctx *ctx, Arena *scratch, const OptimizerConfig *o,
                              long step, DistGrads *g);

// A run's step plan from its config (cgspn train and distill): micro_per_epoch micro-batches of
// the training loader per epoch, accum of them per optimizer step; images names the training set
// in the error when one step needs more than it has. Steps per epoch, total (max_steps or
// epochs), the evaluation interval (eval_every or once per epoch) and AdamW with warmup (steps
// or epochs) + cosine at lr scaled by batch_size / lr_scale_batch.
typedef struct RunPlan {
    long steps_per_epoch, total, warmup, eval_every;
    OptimizerConfig opt;
} RunPlan;
RunPlan run_plan(const Config *c, long micro_per_epoch, int accum, unsigned long long images);
