// `cgspn train`: classification training of any encoder on Fashion-MNIST (DESIGN §6 recipe,
// the subset the foundation needs: AdamW, warmup + cosine, clipping, label smoothing).
#pragma once
#include "config.h"
#include "../nn/encoder.h"
#include "../data/idx.h"

int cmd_train(int argc, char **argv);

typedef struct EvalResult { double top1, loss; long count; } EvalResult;

typedef struct TrainOptions {
    long stop_after;      // 0 = run to the end; n = stop after step n (of the whole run) with a
                          // checkpoint, as an interrupted run would (the schedule still spans it all)
    float *step_losses;   // NULL, or one float per step of the run: each step run here stores its
                          // loss at its 0-based index (tests compare runs with these)
} TrainOptions;

typedef struct TrainResult {
    long step, total;     // steps done at return, steps of the whole run
    EvalResult eval;      // the last evaluation
    char run_dir[1024];   // out_dir/run_name
} TrainResult;

// One training run of config c on the given splits (Fashion-MNIST layout): builds the encoder,
// resumes per c->resume (bit-exactly: the same losses and weights as a run never stopped),
// trains with AdamW + warmup/cosine, logs, evaluates, writes checkpoints every c->ckpt_every
// steps and at the end (or at o->stop_after). o may be NULL.
TrainResult classify_train(const Config *c, const FmnistSplit *train, const FmnistSplit *test,
                           const TrainOptions *o);

// Test-set accuracy without gradients; batch images at a time.
EvalResult classify_evaluate(Ctx *ctx, const Encoder *e, const FmnistSplit *split, int batch);
