#include "optimizer.h"
#include "../kernels/ops.h"
#include "../kernels/error.h"
#include <math.h>

// One of the table's whole buffers (every parameter and its padding) as a 1-D tensor.
static Tensor whole(const ParamTable *t, Ctx *ctx, void *buf, DType dtype) {
    Tensor x = {0};
    tensor_set_shape(&x, 1, (int[]){(int)t->total});
    x.data = buf;
    x.device = ctx->device;
    x.dtype = dtype;
    return x;
}

StepStats optimizer_step(ParamTable *t, Ctx *ctx, Arena *scratch, const OptimizerConfig *o,
                         long step) {
    CG_CHECK(!t->shard, "", "optimizer_step: the table keeps a shard of the optimizer state; step "
             "it with optimizer_step_dist and its DistGrads");
    StepStats s = {0};
    // Global norm over every trainable gradient, accumulated in table order (deterministic).
    // When every parameter trains, one pass over the whole gradient buffer (its alignment padding
    // is zero) instead of one reduction per parameter.
    Tensor *sumsq = arena_tensor(scratch, 1, (int[]){1}, true);
    op_zero(ctx, sumsq);
    bool all = true;
    for (int i = 0; i < t->n; i++) all = all && t->params[i]->trainable;
    all = all && t->total > 0;
    if (all) {
        Tensor grads = whole(t, ctx, t->grads, DTYPE_F32);
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
        if (all) {
            // One launch over the whole buffers (padding stays zero: zero gradient, moments and
            // weight), the decay runs saying which parameters decay; the same arithmetic per
            // element as one call per parameter.
            params_decay_runs(t, ctx);
            AdamWArgs a = {s.lr, o->beta1, o->beta2, o->eps, o->weight_decay, scale, (int)(step + 1),
                           t->n_decay_runs, t->decay_ends, t->decay_on};
            Tensor value = whole(t, ctx, t->values, t->dtype), grad = whole(t, ctx, t->grads, DTYPE_F32);
            Tensor m = whole(t, ctx, t->m, DTYPE_F32), v = whole(t, ctx, t->v, DTYPE_F32);
            Tensor master = whole(t, ctx, t->masters, DTYPE_F32);
            op_adamw(ctx, &value, t->masters ? &master : NULL, &grad, &m, &v, &a);
        } else {
            for (int i = 0; i < t->n; i++) {
                Param *p = t->params[i];
                if (!p->trainable) continue;
                AdamWArgs a = {.lr = s.lr, .beta1 = o->beta1, .beta2 = o->beta2, .eps = o->eps,
                               .weight_decay = p->decay ? o->weight_decay : 0.0f,
                               .grad_scale = scale, .step = (int)(step + 1)};
                // fp32 values (an fp32 table, or kept fp32 in a bf16 one) are their own masters
                Tensor *master = p->value.dtype == DTYPE_F32 ? NULL : &p->master;
                op_adamw(ctx, &p->value, master, &p->grad, &p->m, &p->v, &a);
            }
        }
    }
    params_zero_grads(t, ctx);
    return s;
}

StepStats optimizer_step_dist(ParamTable *t, Ctx *ctx, Arena *scratch, const OptimizerConfig *o,
                              long step, DistGrads *g) {
    if (!g || g->d->world <= 1) return optimizer_step(t, ctx, scratch, o, step);
    dist_wait_grads(g);
    if (!g->zero) return optimizer_step(t, ctx, scratch, o, step);

    StepStats s = {0};
    Tensor *sumsq = arena_tensor(scratch, 1, (int[]){1}, true);
    op_zero(ctx, sumsq);
    for (int i = 0; i < g->n_seg; i++) {
        const ParamSegment *sg = &g->seg[i];
        const Param *p = t->params[sg->param];
        if (!p->trainable) continue;
        Tensor gv = dist_segment_view(&p->grad, sg->start, sg->len);
        op_sumsq(ctx, &gv, sumsq);
    }
    float ss = 0;
    tensor_download(ctx, sumsq, &ss);
    s.grad_norm = sqrtf((float)dist_sum_f64(g->d, ss, "the gradient norm (sum over the shards)"));
    s.finite = isfinite(s.grad_norm);
    s.lr = lr_schedule(&o->schedule, step);
    if (s.finite) {
        float scale = 1.0f;
        if (o->grad_clip > 0 && s.grad_norm > o->grad_clip) scale = o->grad_clip / s.grad_norm;
        // Kept-fp32 values (nn/params.h): each rank writes its shard's pieces into zeros, and
        // dist_gather_values sums the ranks' buffers (one writer per element: exact).
        params_zero_kept_f32(t, ctx);
        for (int i = 0; i < g->n_seg; i++) {
            const ParamSegment *sg = &g->seg[i];
            Param *p = t->params[sg->param];
            if (!p->trainable) {
                if (p->keep_f32 && t->values_f32) {   // unchanged: its master, written back
                    Tensor value = dist_segment_view(&p->value, sg->start, sg->len);
                    Tensor master = params_state_view(t, PARAM_STATE_MASTER, sg->param, sg->start, sg->len);
                    op_cast_colsum(ctx, &master, &value, NULL);
                }
                continue;
            }
            AdamWArgs a = {.lr = s.lr, .beta1 = o->beta1, .beta2 = o->beta2, .eps = o->eps,
                           .weight_decay = p->decay ? o->weight_decay : 0.0f,
                           .grad_scale = scale, .step = (int)(step + 1)};
            Tensor value = dist_segment_view(&p->value, sg->start, sg->len);
            Tensor grad = dist_segment_view(&p->grad, sg->start, sg->len);
            // The table keeps the shard's moments and masters only (nn/params.h, shard layout).
            Tensor m = params_state_view(t, PARAM_STATE_M, sg->param, sg->start, sg->len);
            Tensor v = params_state_view(t, PARAM_STATE_V, sg->param, sg->start, sg->len);
            Tensor master;
            if (t->masters) master = params_state_view(t, PARAM_STATE_MASTER, sg->param, sg->start, sg->len);
            op_adamw(ctx, &value, t->masters ? &master : NULL, &grad, &m, &v, &a);
        }
        dist_gather_values(g);
    }
    params_zero_grads(t, ctx);
    return s;
}

RunPlan run_plan(const Config *c, long micro_per_epoch, int accum, unsigned long long images) {
    RunPlan r;
    r.steps_per_epoch = micro_per_epoch / accum;
    CG_CHECK(r.steps_per_epoch > 0, "reduce batch_size",
             "batch_size %d exceeds the %llu training images of %s", c->batch_size, images,
             c->data_shards);
    r.total = c->max_steps > 0 ? c->max_steps : r.steps_per_epoch * c->epochs;
    r.warmup = c->warmup_epochs > 0 ? lround(c->warmup_epochs * r.steps_per_epoch) : c->warmup_steps;
    r.eval_every = c->eval_every > 0 ? c->eval_every : r.steps_per_epoch;
    double lr_scale = c->lr_scale_batch > 0 ? (double)c->batch_size / c->lr_scale_batch : 1.0;
    r.opt = (OptimizerConfig){
        .schedule = {(float)(c->lr * lr_scale), c->min_lr, r.warmup, r.total},
        .beta1 = c->beta1, .beta2 = c->beta2, .eps = c->adam_eps,
        .weight_decay = c->weight_decay, .grad_clip = c->grad_clip,
    };
    return r;
}
