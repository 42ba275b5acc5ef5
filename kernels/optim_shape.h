// The arguments of the optimizer ops (kernels/ops_list.h: sumsq, adamw) and their refusals,
// shared by the CPU and CUDA ops so both accept and refuse the same calls. A backend adds its own
// device and dtype rules (the CPU keeps fp32 parameters; the GPU takes bf16 ones through a master
// copy).
#pragma once
#include "ops.h"
#include "error.h"

// sumsq's result is one fp32 scalar.
static inline void sumsq_check(const char *op, const Tensor *sumsq) {
    CG_CHECK(sumsq->numel == 1, "", "op %s: the result holds 1 element, got %zu", op, sumsq->numel);
}

// grad, m, v (and master, when given) hold param's element count; step is 1-based; decay runs come
// with their arrays (in the backend's memory: the CPU checks where they end).
static inline void adamw_check(const char *op, const Tensor *param, const Tensor *master,
                               const Tensor *grad, const Tensor *m, const Tensor *v,
                               const AdamWArgs *args) {
    const size_t n = param->numel;
    CG_CHECK(grad->numel == n && m->numel == n && v->numel == n && (!master || master->numel == n),
             "", "op %s: param %zu, grad %zu, m %zu, v %zu, master %zu elements", op, n, grad->numel,
             m->numel, v->numel, master ? master->numel : n);
    CG_CHECK(args->step >= 1, "", "op %s: step is 1-based, got %d", op, args->step);
    const int runs = args->n_decay_runs > 0 ? args->n_decay_runs : 0;
    CG_CHECK(runs == 0 || (args->decay_ends && args->decay_on), "",
             "op %s: %d decay runs without their arrays", op, runs);
}
