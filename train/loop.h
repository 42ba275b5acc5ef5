// The training loop of cgspn train, distill and curriculum (whose stages are distill runs). The
// command supplies the step (forward and backward of one global batch) and what it keeps beside
// the weights; the loop does the rest the same way for every command:
//   - the optimizer step, or its discard on a non-finite loss or gradient norm (on_nonfinite =
//     stop: no checkpoint of it, the newest one stays the last good state; skip: counted);
//   - SIGINT / SIGTERM: the step finishes on every rank, a checkpoint is written, the run stops
//     (a second signal ends the process at once);
//   - checkpoints every ckpt_every steps, every ckpt_minutes of wall time, at the end and at
//     stop_after;
//   - evaluation every eval_every steps and at the end;
//   - the progress line and metrics.jsonl (ms/step leaves out evaluation and checkpoint time).
// Ranks agree on everything that decides a step's course: the step's loss, and flags for a stop
// request and a due checkpoint, reduced in the same collective as the loss (LoopFlag).
#pragma once
#include "config.h"
#include "data_parallel.h"
#include "optimizer.h"
#include "runlog.h"

typedef enum {
    TRAIN_DONE = 0,        // every step of the run is done
    TRAIN_STOPPED,         // stopped at stop_after, with a checkpoint
    TRAIN_INTERRUPTED,     // SIGINT/SIGTERM: the step finished, a checkpoint was written
    TRAIN_NONFINITE,       // on_nonfinite = stop hit a NaN/Inf (no checkpoint of it written)
} TrainStatus;

// What every rank sets before a step and the step's collective averages (> 0: some rank set it).
typedef enum { LOOP_FLAG_STOP, LOOP_FLAG_CKPT, LOOP_FLAGS } LoopFlag;

// The log window: losses of the updates since the last log line, and the run's skipped updates.
// A checkpoint stores it, so a resumed run prints the same lines.
typedef struct LoopWindow {
    double loss_sum;
    long loss_n;
    long skipped;
} LoopWindow;

typedef struct LoopStepResult {
    double loss;   // the global batch's mean loss, the same on every rank (NaN/Inf: not finite)
    long epoch;    // 0-based epoch of the step's data
} LoopStepResult;

typedef struct LoopHooks {
    void *self;
    // Forward and backward of 0-based step `step`, the gradients reduced over ranks
    // (dp_backward). flags (LOOP_FLAGS): this rank's in, their mean over ranks out.
    LoopStepResult (*step)(void *self, long step, float *flags);
    // After an applied update (NULL: nothing), e.g. the EMA and the sums of logged parts.
    void (*updated)(void *self, long step);
    // At a log line (NULL: nothing): prints what the command adds below the line and appends
    // its metrics at keys[*n], vals[*n] (*n grows; at most LOOP_EXTRA_METRICS), resetting its
    // sums; n_updates is the window's count of applied updates.
    void (*log)(void *self, long n_updates, const char **keys, double *vals, int *n);
    // Evaluation after step `step` (1-based; NULL: none).
    void (*eval)(void *self, long step);
    // A checkpoint after step `step` (1-based) with the window to store.
    void (*save)(void *self, long step, const LoopWindow *w);
} LoopHooks;

#define LOOP_EXTRA_METRICS 32

typedef struct LoopSpec {
    const Config *c;                  // on_nonfinite, ckpt_every, ckpt_minutes, log_every
    Ctx *ctx;
    DataParallel *dp;
    RunLog *log;
    ParamTable *params;
    Arena *arena;                     // the step's; AdamW's scratch
    const OptimizerConfig *opt;
    long first, total, eval_every;    // 0-based first step, steps of the whole run
    long stop_after;                  // 0, or stop after this step (1-based) with a checkpoint
    float *step_losses;               // NULL, or each step's loss at its 0-based index
    int images_per_step;              // the global batch
    double flops_step, peak_flops;    // per step, of all ranks: MFU (or GFLOP/s when the peak is
                                      // unknown); flops_step 0: no such column
    const ParamTable *const *tables;  // the memory plan printed after the first step
    int n_tables;
} LoopSpec;

typedef struct LoopResult {
    TrainStatus status;
    long step;             // steps done (1-based count) at return
    long skipped;          // updates skipped over the whole run
    long nonfinite_step;   // the 1-based step that stopped the run (TRAIN_NONFINITE)
} LoopResult;

// Runs steps s->first .. s->total - 1 from the log window w (a resumed checkpoint's, or zeros).
LoopResult loop_run(const LoopSpec *s, const LoopHooks *h, LoopWindow w);
