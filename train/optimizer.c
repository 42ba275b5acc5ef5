#include "optimizer.h"
#include "../kernels/ops.h"
#include <math.h>

StepStats optimizer_step(ParamTable *t, Ctx *ctx, Arena *scratch, const OptimizerConfig *o,
                         long step) {
    StepStats s = {0};
    // Global norm over every trainable gradient, accumulated in table order (deterministic).
    // When every parameter trains, one pass over the whole gradient buffer (its alignment padding
    // is zero) instead of one reduction per parameter.
    Tensor *sumsq = arena_tensor(scratch, 1, (int[]){1}, true);
    op_zero(ctx, sumsq);
    bool all = true;
    for (int i = 0; i < t->n; i++) all = all && t->params[i]->trainable;
    if (all && t->total > 0) {
        Tensor grads = {0};
        tensor_set_shape(&grads, 1, (int[]){(int)t->total});
        grads.data = t->grads;
        grads.device = ctx->device;
        grads.dtype = DTYPE_F32;
        op_sumsq(ctx, &grads, sumsq);
    } else {
        for (int i = 0; i < t->n; i++)
            if (t->params[i]->trainable) op_sumsq(ctx, &t->params[i]->grad, sumsq);
    }
    float ss = 0;
    tensor_download(ctx, sumsq, &ss);
    s.grad_norm = sqrtf(ss);
    s.finite = isfinite(s.grad_norm);
    s.lr = lr_schedule(&o->schedule, step);
    if (s.finite) {
        float scale = 1.0f;
        if (o->grad_clip > 0 && s.grad_norm > o->grad_clip) scale = o->grad_clip / s.grad_norm;
        for (int i = 0; i < t->n; i++) {
            Param *p = t->params[i];
            if (!p->trainable) continue;
            AdamWArgs a = {s.lr, o->beta1, o->beta2, o->eps, p->decay ? o->weight_decay : 0.0f,
                           scale, (int)(step + 1)};
            op_adamw(ctx, &p->value, p->master.data ? &p->master : NULL, &p->grad, &p->m, &p->v, &a);
        }
    }
    params_zero_grads(t, ctx);
    return s;
}
