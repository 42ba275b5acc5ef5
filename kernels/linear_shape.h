// The geometry of the linear ops (kernels/ops_list.h linear_*) and its checks, shared by the CPU
// and CUDA ops so both accept and refuse the same shapes: w (M, K), PyTorch's (out, in); x any
// tensor whose last dim is K, read as (N, K) with N = its rows. Each backend adds its dtype rules.
#pragma once
#include "tensor.h"
#include "error.h"

typedef struct LinearDims {
    size_t N;   // rows of x
    int K, M;   // inputs, outputs
} LinearDims;

static inline LinearDims linear_dims(const char *op, const Tensor *x, const Tensor *w) {
    char xs[64], ws[64];
    CG_CHECK(w->ndim == 2, "", "op %s: w must be (out, in), got rank %d", op, w->ndim);
    LinearDims d = {0, w->shape[1], w->shape[0]};
    CG_CHECK(tensor_last(x) == d.K, "", "op %s: x %s has last dim %d, w %s takes %d inputs", op,
             tensor_shape_str(x, xs, sizeof xs), tensor_last(x), tensor_shape_str(w, ws, sizeof ws),
             d.K);
    CG_CHECK(d.K > 0 && d.M > 0, "", "op %s: w %s has an empty dimension", op,
             tensor_shape_str(w, ws, sizeof ws));
    d.N = tensor_rows(x);
    return d;
}
