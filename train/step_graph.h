// A training step's forward, loss and backward, or an evaluation batch's forward, as one CUDA
// graph (kernels/device.h), captured on a step after the first and replayed from then on: the
// host's kernel launches drop out of the step (`cgspn bench classify`'s `step g` and `infer g`
// columns). A replay repeats the captured kernels with their arguments, addresses included, so
// what a step changes is written where the capture read it: the batch into the tape's first
// tensors (a reset arena places them where it did) and drop-path's step into a device word
// (EncoderDropPath.step_at); the output (the loss, the logits) is read where the capture wrote it. The graph is captured again when an input lands elsewhere or changes shape,
// or when a buffer the graph used has moved (device_graph_current). The replayed kernels are the
// eager step's, so a run gives the same bits either way.
//
// What the caller keeps eager (the step's ops or order change): several ranks (the gradient
// all-reduce runs while backward does), gradient accumulation, MESA, a test's NaN injection.
#pragma once
#include "../nn/tape.h"
#include "../kernels/device.h"

enum { STEP_GRAPH_MAX_INPUTS = 8 };

typedef struct StepGraph {
    Ctx *ctx;
    bool on;                  // the config asks for it and the context is a GPU's
    bool warm;                // a step of `warm_inputs`' shapes has run eagerly: plans, scratch and
                              // workspaces are sized for them
    Tensor warm_inputs[STEP_GRAPH_MAX_INPUTS];
    DeviceGraph *g;
    int n_inputs;
    Tensor inputs[STEP_GRAPH_MAX_INPUTS];   // the captured step's (addresses and shapes)
    Tensor out;               // the captured step's output
    int64_t *step_at;         // drop-path's step on the device (NULL when off)
    long replayed;            // steps run from a graph in this process (their captures included)
} StepGraph;

void step_graph_init(StepGraph *sg, Ctx *ctx, bool on);
void step_graph_free(StepGraph *sg);

// Writes step to the device word the forward reads it from; returns that word (NULL when off,
// and the forward takes the step by value).
const int64_t *step_graph_set_step(StepGraph *sg, int64_t step);

// The step's work on the inputs given to step_graph_run (a training step: forward, loss and
// backward); returns its output, kept (tape_keep): it is read after the backward.
typedef Tensor *(*StepGraphBody)(void *self);

// One step: a replay when the graph fits the inputs (uploaded by the caller), else a capture
// (then a replay of it), else body run eagerly: on the first step and whenever the inputs' shapes
// differ from the last eager step's (a capture cannot allocate what new shapes need: cuBLASLt's
// trial buffers, a larger scratch). Returns the step's output, queued on the context's stream:
// read it (tensor_download) before the next step.
const Tensor *step_graph_run(StepGraph *sg, Tensor *const *inputs, int n_inputs,
                             StepGraphBody body, void *self);
