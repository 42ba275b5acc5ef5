// The geometry of the depthwise convolution (kernels/ops_list.h dwconv_fwd/bwd) and its checks,
// shared by the CPU and CUDA ops so both accept and refuse the same shapes: x (B,H,W,C), w
// (C,1,k,k) (or any shape of C*k*k elements whose last dim is k), k odd, at most DWCONV_MAX_K
// (the CUDA kernels keep a k x k window in registers), padding k/2; y and dx x's shape; b (C).
#pragma once
#include "tensor.h"
#include "error.h"
#include "ops.h"

#define DWCONV_MAX_K 7

typedef struct DwconvShape {
    int B, H, W, C, k, p;
} DwconvShape;

static inline DwconvShape dwconv_shape(const char *op, const Tensor *x, const Tensor *w) {
    char buf[64];
    CG_CHECK(x->ndim == 4, "", "op %s: x has shape %s, expected (B, H, W, C)", op,
             tensor_shape_str(x, buf, sizeof buf));
    DwconvShape s = {x->shape[0], x->shape[1], x->shape[2], x->shape[3], w->shape[w->ndim - 1], 0};
    CG_CHECK(s.k % 2 == 1 && s.k <= DWCONV_MAX_K && w->numel == (size_t)s.C * s.k * s.k,
             "a depthwise weight is (C, 1, k, k), k odd, at most 7",
             "op %s: w has shape %s for %d channels", op, tensor_shape_str(w, buf, sizeof buf), s.C);
    s.p = s.k / 2;
    return s;
}

// The flags (kernels/ops.h) each op takes: dwconv_fwd DWCONV_RESIDUAL or DWCONV_SILU, not both;
// dwconv_bwd DWCONV_RESIDUAL and DWCONV_WRITE_DX.
static inline void dwconv_check_flags(const char *op, int flags, bool fwd) {
    const int known = fwd ? DWCONV_RESIDUAL | DWCONV_SILU : DWCONV_RESIDUAL | DWCONV_WRITE_DX;
    CG_CHECK((flags & ~known) == 0 && (flags & (DWCONV_RESIDUAL | DWCONV_SILU)) !=
                                          (DWCONV_RESIDUAL | DWCONV_SILU),
             "dwconv_fwd takes DWCONV_RESIDUAL or DWCONV_SILU, dwconv_bwd DWCONV_RESIDUAL and "
             "DWCONV_WRITE_DX", "op %s: flags %d", op, flags);
}
