// The geometry of conv2d (kernels/ops_list.h), shared by the CPU and CUDA ops: the input's layout,
// the output grid, the column matrix and the checks, so both backends read a tensor the same way.
#pragma once
#include "tensor.h"
#include "error.h"
#include "elementwise_shape.h"   // gelu_check_kind (and ops.h: Conv2dFwdOpts)

typedef struct Conv2dShape {
    int B, C, H, W, k, s, p, Ho, Wo, Cout;
    long long sb, sc, sh, sw;   // element strides of x along b, c, h, w
    size_t rows, cols;          // of the column matrix: B*Ho*Wo, C*k*k
} Conv2dShape;

// The weight (Cout, C, k, k): Cout, C and k of a shape, the rest zero.
static inline Conv2dShape conv2d_weight_shape(const char *op, const Tensor *w) {
    char buf[64];
    CG_CHECK(w->ndim == 4 && w->shape[2] == w->shape[3] && w->shape[2] >= 1, "",
             "op %s: w has shape %s, expected (Cout, C, k, k)", op, tensor_shape_str(w, buf, sizeof buf));
    Conv2dShape g = {0};
    g.Cout = w->shape[0];
    g.C = w->shape[1];
    g.k = w->shape[2];
    g.cols = (size_t)g.C * g.k * g.k;
    return g;
}

// x (B,H,W,C), or (B,C,H,W) with nchw: the input or its gradient, `name` in the messages.
static inline Conv2dShape conv2d_shape(const char *op, const char *name, const Tensor *x,
                                       const Tensor *w, int nchw, int stride, int pad) {
    char buf[64];
    Conv2dShape g = conv2d_weight_shape(op, w);
    CG_CHECK(x->ndim == 4, "", "op %s: %s has shape %s, expected (B, H, W, C) or (B, C, H, W)", op,
             name, tensor_shape_str(x, buf, sizeof buf));
    const int C = nchw ? x->shape[1] : x->shape[3];
    CG_CHECK(C == g.C, "", "op %s: %s has %d channels, w takes %d", op, name, C, g.C);
    g.B = x->shape[0];
    g.H = nchw ? x->shape[2] : x->shape[1];
    g.W = nchw ? x->shape[3] : x->shape[2];
    g.s = stride, g.p = pad;
    CG_CHECK(stride >= 1 && pad >= 0 && g.H + 2 * pad >= g.k && g.W + 2 * pad >= g.k,
             "a kernel that fits the padded image", "op %s: kernel %d, stride %d, padding %d on a "
             "%dx%d grid", op, g.k, stride, pad, g.H, g.W);
    g.Ho = (g.H + 2 * pad - g.k) / stride + 1;
    g.Wo = (g.W + 2 * pad - g.k) / stride + 1;
    g.sb = (long long)g.C * g.H * g.W;
    g.sc = nchw ? (long long)g.H * g.W : 1;
    g.sh = nchw ? g.W : (long long)g.W * g.C;
    g.sw = nchw ? 1 : g.C;
    g.rows = (size_t)g.B * g.Ho * g.Wo;
    return g;
}

// y or dy: (B,Ho,Wo,Cout) given the geometry, else (rows, Cout) with rows taken from it.
static inline void conv2d_check_out(const char *op, const char *name, Conv2dShape *g,
                                    const Tensor *y, bool geometry) {
    char buf[64];
    if (geometry)
        CG_CHECK(y->ndim == 4 && y->shape[0] == g->B && y->shape[1] == g->Ho &&
                     y->shape[2] == g->Wo && y->shape[3] == g->Cout, "",
                 "op %s: %s has shape %s, expected (%d, %d, %d, %d)", op, name,
                 tensor_shape_str(y, buf, sizeof buf), g->B, g->Ho, g->Wo, g->Cout);
    else
        CG_CHECK(y->ndim >= 1 && tensor_last(y) == g->Cout, "", "op %s: %s has shape %s, w has %d "
                 "outputs", op, name, tensor_shape_str(y, buf, sizeof buf), g->Cout);
    if (!geometry) g->rows = tensor_rows(y);
}

static inline void conv2d_check_cols(const char *op, const Conv2dShape *g, const Tensor *cols) {
    CG_CHECK(cols->numel == g->rows * g->cols, "", "op %s: cols has %zu elements, expected %zu x %zu",
             op, cols->numel, g->rows, g->cols);
}

static inline void conv2d_check_bias(const char *op, const Conv2dShape *g, const Tensor *b) {
    CG_CHECK(b->numel == (size_t)g->Cout, "", "op %s: b has %zu elements, w has %d outputs", op,
             b->numel, g->Cout);
}

// The fusions (the norm's weights checked by the norm, or the kernel that fuses it).
static inline void conv2d_check_opts(const char *op, const Conv2dFwdOpts *o, const Tensor *cols) {
    if (!o) return;
    CG_CHECK(o->ln || !o->gelu_out, "", "op %s: gelu_out comes only after the LayerNorm (ln)", op);
    CG_CHECK(!o->ln || !cols, "keep cols NULL where the norm is fused: no backward follows",
             "op %s: ln with cols", op);
    if (o->gelu_out) gelu_check_kind(op, o->gelu_kind);
}
