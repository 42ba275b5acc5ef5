// Data parallelism inside the training loops: the machinery `cgspn train`,
// `cgspn distill` and `cgspn curriculum` share, so each loop reads as the single-process loop
// with a handful of dp_* calls. A world of one (no launcher) takes the same calls, which then
// reduce to the single-process behaviour exactly (no collective, the same optimizer step).
//
// What a step does across W ranks (dist/grads.h for the collectives):
//   data      batch_size is global: each optimizer step takes batch_size images over all ranks
//             and accumulation micro-batches; rank r reads its slice of every global micro-batch
//             (data/loader.h), so per-rank micro-batch = batch_size / (accum_steps * W) and the
//             ranks read disjoint slices of every epoch. Logged img/s counts the global batch.
//   backward  dp_backward runs the tape's backward; on the last micro-batch of a step each
//             parameter is reported as soon as its gradient is final (nn/tape.h), so a gradient
//             bucket's all-reduce (or reduce-scatter, zero = 1) starts while backward continues.
//   step      dp_optimizer_step waits for the buckets and runs AdamW: on the averaged gradient
//             (zero = 0), or on this rank's shard followed by the all-gather of the updated
//             values (zero = 1); the gradient norm for clipping is global either way.
//   losses    dp_mean averages a per-rank value over ranks (host collective, rank order), so the
//             logged loss is the global batch's and every rank takes the same decisions.
//   logs      rank 0 alone writes the run folder (config.cfg, metrics.jsonl) and prints; main
//             sends other ranks' stdout to /dev/null (stderr stays: errors name their rank).
//   ckpts     dp_save: rank 0 prepares RUN/step_N.tmp; with zero = 1 every rank writes its
//             optimizer shard there and rank 0 writes SHARDS once all are durable; then rank 0
//             writes the weights, the state (moments only when not sharded), the config and
//             COMPLETE, and renames. dp_load restores any checkpoint on any world size.
#pragma once
#include "checkpoint.h"
#include "config.h"
#include "optimizer.h"
#include "runlog.h"
#include "../data/loader.h"
#include "../dist/ckpt_shard.h"
#include "../nn/tape.h"

typedef struct DataParallel {
    Dist *d;            // the process group (dist_process(), or a test's)
    DistGrads *g;       // buckets and the ZeRO-1 shard over the trained parameter table
    int zero;           // in effect (0 in a world of one)
    int rank, world;
    bool overlap;       // launch buckets during backward (default); false: all after it (the
                        // benchmark's comparison)
} DataParallel;

// After params_alloc of the table the optimizer steps. d NULL: dist_process(). With zero = 1
// across ranks the table keeps only this rank's shard of the moments and masters from here on
// (dist/README.md, "ZeRO-1 memory layout"); weights loaded later still land whole in the values.
void dp_open(DataParallel *p, Dist *d, ParamTable *params, Ctx *ctx, const Config *c);
void dp_close(DataParallel *p);
static inline bool dp_main(const DataParallel *p) { return p->rank == 0; }

// The split's loader for this rank: global_batch images per batch over all ranks, this rank's
// slice of each (global_batch must divide by the world size; the message says so otherwise).
Loader *dp_loader_open(const DataParallel *p, const Config *c, int train, int global_batch,
                       bool pinned);
// Rank 0: runlog_open; other ranks: the run folder's name only (nothing written).
void dp_runlog_open(const DataParallel *p, RunLog *log, const Config *c, const char *command);

// tape_backward(t, loss); last = this is the step's last micro-batch (its gradients are final
// afterwards), when each parameter's bucket launches as soon as backward has finished it.
void dp_backward(DataParallel *p, Tape *t, Tensor *loss, bool last);
// optimizer_step_dist: waits for the gradient averaging, steps, zeroes the gradients.
StepStats dp_optimizer_step(DataParallel *p, ParamTable *t, Ctx *ctx, Arena *scratch,
                            const OptimizerConfig *o, long step);

// A step whose update is skipped (a non-finite loss): waits for the gradient collectives under
// way and zeroes the gradients, leaving the next step to start clean.
void dp_discard_step(DataParallel *p, ParamTable *t, Ctx *ctx);

// The mean over ranks of x (each rank's value weighted equally: equal batch slices), summed in
// rank order: the same double on every rank.
double dp_mean(DataParallel *p, double x, const char *what);
// The same for n floats at once (one collective).
void dp_mean_f32(DataParallel *p, float *x, int n, const char *what);
// The sum over ranks (counts of an evaluation).
double dp_sum(DataParallel *p, double x, const char *what);

// A checkpoint of the whole job, as described above: ckpt_save on rank 0 plus the ranks'
// optimizer shards. Every rank calls it; every rank stops with the message when any part
// failed (the previous checkpoints stay intact). saved (may be NULL): the folder written.
void dp_save(DataParallel *p, const char *run_dir, const CkptOptions *o, const Config *c,
             const ParamTable *params, const ParamTable *ema, Ctx *ctx, const CkptState *s,
             char *saved, size_t saved_n);
// ckpt_load on every rank, then the optimizer state from the shard files when the checkpoint
// was written with zero = 1 (any world size: pieces are matched by name and range). Stops with
// the message on error.
void dp_load(DataParallel *p, const char *ckpt_dir, const Config *c, ParamTable *params,
             ParamTable *ema, Ctx *ctx, CkptState *s);
