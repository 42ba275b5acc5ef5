// Training steps replayed as a CUDA graph (train/step_graph.h).
#include "step_graph.h"
#include "../kernels/error.h"
#include <string.h>

void step_graph_init(StepGraph *sg, Ctx *ctx, bool on) {
    memset(sg, 0, sizeof *sg);
    sg->ctx = ctx;
    sg->on = on && ctx->device == DEVICE_CUDA;
    if (sg->on) sg->step_at = device_alloc(ctx, sizeof(int64_t));
}

void step_graph_free(StepGraph *sg) {
    device_graph_free(sg->g);
    if (sg->step_at) device_free(sg->ctx, sg->step_at);
    memset(sg, 0, sizeof *sg);
}

const int64_t *step_graph_set_step(StepGraph *sg, int64_t step) {
    if (!sg->on) return NULL;
    device_upload(sg->ctx, sg->step_at, &step, sizeof step);
    return sg->step_at;
}

// Whether inputs have the dtypes and shapes of have[0..n) (and their addresses, when `at`).
static bool same(const Tensor *have, Tensor *const *inputs, int n, bool at) {
    for (int i = 0; i < n; i++) {
        const Tensor *a = &have[i], *b = inputs[i];
        if ((at && a->data != b->data) || a->dtype != b->dtype || !tensor_same_shape(a, b))
            return false;
    }
    return true;
}

const Tensor *step_graph_run(StepGraph *sg, Tensor *const *inputs, int n_inputs,
                             StepGraphBody body, void *self) {
    CG_CHECK(n_inputs <= STEP_GRAPH_MAX_INPUTS, "", "step_graph_run: %d inputs, at most %d",
             n_inputs, STEP_GRAPH_MAX_INPUTS);
    if (!sg->on || !sg->warm || n_inputs != sg->n_inputs ||
        !same(sg->warm_inputs, inputs, n_inputs, false)) {
        const Tensor *out = body(self);   // eager: it sizes what a capture needs
        sg->warm = sg->on;
        sg->n_inputs = n_inputs;
        for (int i = 0; i < n_inputs; i++) sg->warm_inputs[i] = *inputs[i];
        return out;
    }
    if (!sg->g || !device_graph_current(sg->g) || !same(sg->inputs, inputs, n_inputs, true)) {
        device_graph_free(sg->g);
        device_graph_begin(sg->ctx);
        const Tensor *out = body(self);
        sg->g = device_graph_end(sg->ctx);
        sg->out = *out;
        for (int i = 0; i < n_inputs; i++) sg->inputs[i] = *inputs[i];
    }
    device_graph_launch(sg->g);   // a capture records the step; this runs it
    sg->replayed++;
    return &sg->out;
}
