// `cgspn train`: classification training of any encoder on Fashion-MNIST (DESIGN §6 recipe,
// the subset the foundation needs: AdamW, warmup + cosine, clipping, label smoothing).
#pragma once
#include "../nn/encoder.h"
#include "../data/idx.h"

int cmd_train(int argc, char **argv);

typedef struct EvalResult { double top1, loss; long count; } EvalResult;
// Test-set accuracy without gradients; batch images at a time.
EvalResult classify_evaluate(Ctx *ctx, const Encoder *e, const FmnistSplit *split, int batch);
