// The geometry of LayerNorm (kernels/ops_list.h layernorm_fwd, layernorm_bwd) and its checks,
// shared by the CPU and CUDA ops so both accept and refuse the same shapes: x any tensor whose
// last dim is C, read as (N, C) with N = its rows; y, r, h, dy, dx and dx_act hold x's element
// count; w, b, dw, db and dx_sum C; mean and rstd N. Each backend adds its dtype and device rules
// (the CPU computes in fp32; the CUDA kernels take the mixes kernels/ops.h names).
#pragma once
#include "tensor.h"
#include "error.h"

typedef struct LayerNormDims {
    size_t N;   // rows of x
    int C;      // the normalized (last) dim
} LayerNormDims;

// t (which must not be NULL) has exactly n elements, in any shape.
static inline void layernorm_check_numel(const char *op, const char *name, const Tensor *t,
                                         size_t n) {
    char buf[64];
    CG_CHECK(t != NULL, "", "op %s: %s is NULL", op, name);
    CG_CHECK(t->numel == n, "", "op %s: %s has shape %s (%zu elements), expected %zu elements",
             op, name, tensor_shape_str(t, buf, sizeof buf), t->numel, n);
}

// The forward's arguments; r and h (the residual added to x and the sum) may be NULL together.
static inline LayerNormDims layernorm_fwd_dims(const char *op, const Tensor *x, const Tensor *r,
                                               const Tensor *w, const Tensor *b, float eps,
                                               const Tensor *h, const Tensor *y,
                                               const Tensor *mean, const Tensor *rstd) {
    CG_CHECK(x != NULL, "", "op %s: x is NULL", op);
    LayerNormDims d = {tensor_rows(x), tensor_last(x)};
    layernorm_check_numel(op, "y", y, x->numel);
    if (r || h) {
        layernorm_check_numel(op, "r", r, x->numel);
        layernorm_check_numel(op, "h", h, x->numel);
        CG_CHECK(h->data != x->data && h->data != r->data, "", "op %s: h must not alias x or r", op);
    }
    if (w) layernorm_check_numel(op, "w", w, (size_t)d.C);
    if (b) layernorm_check_numel(op, "b", b, (size_t)d.C);
    if (mean) layernorm_check_numel(op, "mean", mean, d.N);
    if (rstd) layernorm_check_numel(op, "rstd", rstd, d.N);
    CG_CHECK(eps >= 0.0f, "layernorm eps is usually 1e-6 (timm ViT) or 1e-5",
             "op %s: eps = %g is negative", op, eps);
    return d;
}

// The backward's arguments (dx, dw, db, dx_act, dx_sum may each be NULL: not wanted).
static inline LayerNormDims layernorm_bwd_dims(const char *op, const Tensor *dy, const Tensor *x,
                                               const Tensor *w, const Tensor *mean,
                                               const Tensor *rstd, const Tensor *dx,
                                               const Tensor *dw, const Tensor *db,
                                               const Tensor *dx_act, const Tensor *dx_sum) {
    CG_CHECK(dx || (!dx_act && !dx_sum), "", "op %s: dx_act and dx_sum hand dx on: they need dx",
             op);
    CG_CHECK(x != NULL, "", "op %s: x is NULL", op);
    LayerNormDims d = {tensor_rows(x), tensor_last(x)};
    layernorm_check_numel(op, "dy", dy, x->numel);
    if (w) layernorm_check_numel(op, "w", w, (size_t)d.C);
    CG_CHECK(mean && rstd, "run layernorm_fwd with mean and rstd tensors before its backward",
             "op %s: needs the mean and rstd saved by the forward pass", op);
    layernorm_check_numel(op, "mean", mean, d.N);
    layernorm_check_numel(op, "rstd", rstd, d.N);
    if (dx) layernorm_check_numel(op, "dx", dx, x->numel);
    CG_CHECK(!dw || w, "", "op %s: dw given but the layer has no weight w", op);
    if (dw) layernorm_check_numel(op, "dw", dw, (size_t)d.C);
    if (db) layernorm_check_numel(op, "db", db, (size_t)d.C);
    if (dx_act) layernorm_check_numel(op, "dx_act", dx_act, x->numel);
    if (dx_sum) layernorm_check_numel(op, "dx_sum", dx_sum, (size_t)d.C);
    return d;
}
