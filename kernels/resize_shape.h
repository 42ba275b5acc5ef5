// The shapes of resize_bilinear (kernels/ops_list.h), shared by the CPU and CUDA ops: a grid
// x (B,H,W,C) and its resize y (B,H2,W2,C), every side at least 1. A backend adds its device
// and dtype rules.
#pragma once
#include "tensor.h"
#include "error.h"

typedef struct { int B, H, W, H2, W2, C; } ResizeDims;

static inline ResizeDims resize_dims(const char *op, const Tensor *x, const Tensor *y) {
    char a[64], b[64];
    CG_CHECK(x->ndim == 4 && y->ndim == 4 && x->shape[0] == y->shape[0] &&
                 x->shape[3] == y->shape[3] && x->shape[1] > 0 && x->shape[2] > 0 &&
                 y->shape[1] > 0 && y->shape[2] > 0, "",
             "op %s: expected grids (B,H,W,C) -> (B,H2,W2,C) with H, W, H2, W2 >= 1, got %s -> %s",
             op, tensor_shape_str(x, a, sizeof a), tensor_shape_str(y, b, sizeof b));
    ResizeDims d = {x->shape[0], x->shape[1], x->shape[2], y->shape[1], y->shape[2], x->shape[3]};
    return d;
}
