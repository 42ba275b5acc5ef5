// The geometry of im2col (kernels/ops.h), shared by the CPU and CUDA ops: the input's layout,
// the output grid and the checks, so both backends read a tensor the same way.
#pragma once
#include "tensor.h"
#include "error.h"

typedef struct Im2colShape {
    int B, C, H, W, k, s, p, Ho, Wo;
    long long sb, sc, sh, sw;   // element strides of x along b, c, h, w
    size_t rows, cols;          // of the column matrix: B*Ho*Wo, C*k*k
} Im2colShape;

static inline Im2colShape im2col_shape(const char *op, const Tensor *x, int nchw, int k,
                                       int stride, int pad, const Tensor *cols) {
    char buf[64];
    CG_CHECK(x->ndim == 4, "", "op %s: x has shape %s, expected (B, H, W, C) or (B, C, H, W)", op,
             tensor_shape_str(x, buf, sizeof buf));
    Im2colShape g;
    g.B = x->shape[0];
    g.C = nchw ? x->shape[1] : x->shape[3];
    g.H = nchw ? x->shape[2] : x->shape[1];
    g.W = nchw ? x->shape[3] : x->shape[2];
    g.k = k, g.s = stride, g.p = pad;
    CG_CHECK(k >= 1 && stride >= 1 && pad >= 0 && g.H + 2 * pad >= k && g.W + 2 * pad >= k,
             "a kernel that fits the padded image", "op %s: kernel %d, stride %d, padding %d on a "
             "%dx%d grid", op, k, stride, pad, g.H, g.W);
    g.Ho = (g.H + 2 * pad - k) / stride + 1;
    g.Wo = (g.W + 2 * pad - k) / stride + 1;
    g.sb = (long long)g.C * g.H * g.W;
    g.sc = nchw ? (long long)g.H * g.W : 1;
    g.sh = nchw ? g.W : (long long)g.W * g.C;
    g.sw = nchw ? 1 : g.C;
    g.rows = (size_t)g.B * g.Ho * g.Wo;
    g.cols = (size_t)g.C * k * k;
    CG_CHECK(cols->numel == g.rows * g.cols, "", "op %s: cols has %zu elements, expected %zu x %zu",
             op, cols->numel, g.rows, g.cols);
    return g;
}
