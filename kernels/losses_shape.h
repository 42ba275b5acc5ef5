// The shapes of the losses (kernels/ops_list.h: cross_entropy, mse, token_kl) and their refusals,
// for both backends (kernels/cpu/losses.c, kernels/cuda/losses.cu). A loss and its dloss are
// 1-element tensors; the row-wise losses read their inputs as (rows, last dim). A backend adds its
// own device and dtype rules.
#pragma once
#include "tensor.h"
#include "error.h"

static inline void loss_check_scalar(const char *op, const char *name, const Tensor *t) {
    CG_CHECK(t->numel == 1, "", "op %s: %s holds 1 element, got %zu", op, name, t->numel);
}

// n elements (a NULL t passes: not wanted).
static inline void loss_check_numel(const char *op, const char *name, const Tensor *t, size_t n) {
    char buf[64];
    if (t)
        CG_CHECK(t->numel == n, "", "op %s: %s has shape %s (%zu elements), expected %zu", op, name,
                 tensor_shape_str(t, buf, sizeof buf), t->numel, n);
}

// cross_entropy_fwd: logits, targets, probs (B, K) with B > 0. Returns B; *K the classes.
static inline size_t cross_entropy_dims(const char *op, const Tensor *logits, const Tensor *targets,
                                        const Tensor *probs, const Tensor *loss, size_t *K) {
    const size_t B = tensor_rows(logits);
    *K = (size_t)tensor_last(logits);
    CG_CHECK(B > 0, "", "op %s: empty batch", op);
    loss_check_numel(op, "targets", targets, logits->numel);
    loss_check_numel(op, "probs", probs, logits->numel);
    loss_check_scalar(op, "loss", loss);
    return B;
}

// cross_entropy_bwd: probs, targets, dlogits of one size. Returns the rows B.
static inline size_t cross_entropy_bwd_dims(const char *op, const Tensor *dloss, const Tensor *probs,
                                            const Tensor *targets, const Tensor *dlogits) {
    loss_check_scalar(op, "dloss", dloss);
    loss_check_numel(op, "targets", targets, probs->numel);
    loss_check_numel(op, "dlogits", dlogits, probs->numel);
    return tensor_rows(probs);
}

// mse_fwd / mse_bwd: a and b (and da, db) of n > 0 elements, any shapes. Returns n.
static inline size_t mse_dims(const char *op, const Tensor *a, const Tensor *b, const Tensor *da,
                              const Tensor *db) {
    const size_t n = a->numel;
    CG_CHECK(n > 0, "", "op %s: empty tensors", op);
    loss_check_numel(op, "b", b, n);
    loss_check_numel(op, "da", da, n);
    loss_check_numel(op, "db", db, n);
    return n;
}

// token_kl_fwd / token_kl_bwd: s and t (N, C) with N > 0 and one last dim (ds, dt: s's size).
// Returns N; *C the last dim.
static inline size_t token_kl_dims(const char *op, const Tensor *s, const Tensor *t, const Tensor *ds,
                                   const Tensor *dt, size_t *C) {
    const size_t N = tensor_rows(s);
    *C = (size_t)tensor_last(s);
    loss_check_numel(op, "t", t, s->numel);
    CG_CHECK((size_t)tensor_last(t) == *C && N > 0, "", "op %s: s %zu x %zu, t has last dim %d", op, N,
             *C, tensor_last(t));
    loss_check_numel(op, "ds", ds, s->numel);
    loss_check_numel(op, "dt", dt, s->numel);
    return N;
}
