// `cgspn train`: classification training of any encoder (ViT, C-GSPN, hybrid) on a shard set
// (data/loader.h), with the docs/design.md#classification recipe: AdamW (no decay on biases, norms, 1-D params),
// lr scaled by batch / lr_scale_batch, warmup + cosine per step, clipping, gradient
// accumulation, label smoothing and mixup/cutmix soft targets, RandAugment and random erasing
// (the loader), stochastic depth, an EMA of the weights; checkpoints that resume bit-exactly,
// on_nonfinite = stop | skip, and SIGINT/SIGTERM finishing the step with a checkpoint.
// `cgspn eval`: top-1/top-5 of given weights on the validation split.
#pragma once
#include "config.h"
#include "loop.h"   // TrainStatus
#include "../nn/encoder.h"
#include "../data/loader.h"

int cmd_train(int argc, char **argv);
int cmd_eval(int argc, char **argv);

typedef struct EvalResult {
    double top1, top5, loss;
    long count;
    long graph_batches;   // batches replayed as a CUDA graph (this rank's)
} EvalResult;

typedef struct TrainOptions {
    long stop_after;      // 0 = run to the end; n = stop after step n (of the whole run) with a
                          // checkpoint, as an interrupted run would (the schedule still spans it all)
    float *step_losses;   // NULL, or one float per step of the run: each step run here stores its
                          // loss at its 0-based index (tests compare runs with these)
    long nonfinite_at;    // test hook: the input images of this 1-based step are multiplied by
                          // NaN, so its loss and gradients are not finite (0 = never)
    struct Dist *dist;    // the process group to train across (NULL: dist_process(), which is a
                          // world of one unless a launcher started this process; dist/dist.h)
} TrainOptions;


typedef struct TrainResult {
    TrainStatus status;
    long step, total;     // steps done at return, steps of the whole run
    long skipped;         // steps whose update was skipped (on_nonfinite = skip), whole run
    long nonfinite_step;  // the 1-based step that stopped the run (TRAIN_NONFINITE)
    EvalResult eval;      // the last evaluation of the trained weights
    EvalResult eval_ema;  // and of their EMA (count 0 when ema_decay = 0)
    long graph_steps;     // steps run from a captured CUDA graph (cuda_graph; captures included)
    char run_dir[1024];   // out_dir/run_name
} TrainResult;

// One training run of config c on the shards of c->data_shards (train_split, val_split):
// builds the encoder, resumes per c->resume (bit-exactly: the same losses and weights as a run
// never stopped), trains, logs, evaluates, writes checkpoints every c->ckpt_every steps and at
// the end (or at o->stop_after, or on a signal). o may be NULL.
TrainResult classify_train(const Config *c, const TrainOptions *o);

// Top-1/top-5 accuracy and cross-entropy of the encoder (no gradients) over one pass of an eval
// loader (loader_open with train = 0), from its first batch. graph (cuda_graph): on a GPU the
// batches' forward is replayed as a CUDA graph after the first (train/step_graph.h; the same bits).
EvalResult classify_evaluate(Ctx *ctx, const Encoder *e, Loader *val, bool graph);
// The same over the ranks of a data-parallel run: each rank evaluates its slice of every batch
// (val opened with dp_loader_open) and the counts and loss sums are added over ranks.
struct DataParallel;
EvalResult classify_evaluate_dp(Ctx *ctx, const Encoder *e, Loader *val, struct DataParallel *dp,
                                bool graph);
