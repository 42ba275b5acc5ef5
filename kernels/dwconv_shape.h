// The geometry of the depthwise convolution (kernels/ops_list.h dwconv_fwd/bwd) and its checks,
// shared by the CPU and CUDA ops so both accept and refuse the same shapes: x (B,H,W,C), w
// (C,1,k,k) (or any shape of C*k*k elements whose last dim is k), k odd, at most DWCONV_MAX_K
// (the CUDA kernels keep a k x k window in registers), padding k/2; y and dx x's shape; b (C).
#pragma once
#include "tensor.h"
#include "error.h"
#include "ops.h"
#include "layernorm_shape.h"

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

// dwconv_fwd's added input (u set): x' = x + u uw^T + ub, u (B,H,W,Ku) with Ku at most
// DWCONV_MAX_KU, uw (C, Ku), ub (C) or NULL, all three in w's dtype; mid (if set) x's shape and
// dtype, neither x nor y. Returns Ku.
#define DWCONV_MAX_KU 4
static inline int dwconv_added_input(const char *op, const DwconvShape *s, const Tensor *x,
                                     const Tensor *u, const Tensor *uw, const Tensor *ub,
                                     const Tensor *w, const Tensor *mid, const Tensor *y) {
    char us[64], ws[64];
    const int ku = tensor_last(u);
    CG_CHECK(u->ndim == 4 && u->shape[0] == s->B && u->shape[1] == s->H && u->shape[2] == s->W &&
                 ku >= 1 && ku <= DWCONV_MAX_KU && uw->ndim == 2 && uw->shape[0] == s->C &&
                 uw->shape[1] == ku && (!ub || ub->numel == (size_t)s->C),
             "the added input is a product over at most 4 inputs: u (B,H,W,Ku), uw (C,Ku), ub (C)",
             "op %s: u %s and uw %s for x of %d channels", op, tensor_shape_str(u, us, sizeof us),
             tensor_shape_str(uw, ws, sizeof ws), s->C);
    CG_CHECK(u->dtype == w->dtype && uw->dtype == w->dtype && (!ub || ub->dtype == w->dtype), "",
             "op %s: u, uw and ub must be in w's dtype (%s)", op, dtype_name(w->dtype));
    CG_CHECK(!mid || (mid->numel == x->numel && mid->dtype == x->dtype && mid->data != x->data &&
                      mid->data != y->data),
             "", "op %s: mid must have x's shape and dtype and be neither x nor y", op);
    return ku;
}

// dwconv_silu_proj_fwd's projection: pw (M, C) with 1 <= M <= DWCONV_PROJ_MAX and pb (M) or NULL,
// both in w's dtype; y (B,H,W,M) in x's dtype. Returns M.
static inline int dwconv_proj_check(const char *op, const DwconvShape *s, const Tensor *x,
                                    const Tensor *w, const Tensor *pw, const Tensor *pb,
                                    const Tensor *y) {
    char ps[64], ys[64];
    const int m = pw->ndim == 2 ? pw->shape[0] : 0;
    CG_CHECK(m >= 1 && m <= DWCONV_PROJ_MAX && pw->shape[1] == s->C && (!pb || pb->numel == (size_t)m),
             "the projection is pw (M, C) with M at most 4, pb (M)",
             "op %s: pw %s for x of %d channels", op, tensor_shape_str(pw, ps, sizeof ps), s->C);
    CG_CHECK(pw->dtype == w->dtype && (!pb || pb->dtype == w->dtype), "",
             "op %s: pw and pb must be in w's dtype (%s)", op, dtype_name(w->dtype));
    CG_CHECK(y->ndim == 4 && y->shape[0] == s->B && y->shape[1] == s->H && y->shape[2] == s->W &&
                 y->shape[3] == m && y->dtype == x->dtype,
             "", "op %s: y has shape %s, expected (%d, %d, %d, %d) in x's dtype", op,
             tensor_shape_str(y, ys, sizeof ys), s->B, s->H, s->W, m);
    return m;
}

// dwconv_layernorm_fwd's arguments: x and w as dwconv_fwd's, b (C) or NULL, h x's shape and dtype,
// aliasing neither x nor y, and the norm's (ln_w, ln_b, eps, y) as layernorm_fwd takes them for
// h. Returns the geometry.
static inline DwconvShape dwconv_layernorm_check(const char *op, const Tensor *x, const Tensor *w,
                                                 const Tensor *b, const Tensor *ln_w,
                                                 const Tensor *ln_b, float eps, const Tensor *h,
                                                 const Tensor *y) {
    DwconvShape s = dwconv_shape(op, x, w);
    CG_CHECK(h->numel == x->numel && h->dtype == x->dtype && h->data != x->data &&
                 y->data != x->data && y->data != h->data, "",
             "op %s: h (x's shape and dtype) and y must alias neither x nor each other", op);
    CG_CHECK(!b || b->numel == (size_t)s.C, "", "op %s: b has %zu values for %d channels", op,
             b ? b->numel : 0, s.C);
    layernorm_fwd_dims(op, h, NULL, ln_w, ln_b, eps, NULL, y, NULL, NULL);
    return s;
}
