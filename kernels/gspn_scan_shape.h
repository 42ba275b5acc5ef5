// The geometry of the C-GSPN scan (kernels/ops_list.h gspn_scan_fwd, gspn_scan_bwd, either
// write mode) and its checks, shared by the CPU and CUDA ops (the CUDA op's make_plan
// in kernels/cuda/gspn_scan.cu): xc (B,H,W,Cc); gates (B,H,W,G) with G = 4*(2*Cc+3) for shared weights, else
// 20*Cc; merge and dmerge 4 elements; yc, dyc and dxc xc's element count, dgates gates'; hidden
// (4,B,H,W,Cc) fp32. The backend adds its dtype and device rules.
#pragma once
#include "tensor.h"
#include "error.h"

#define GSPN_SCAN_DIRS 4   // TB, BT, LR, RL

typedef struct GspnScanDims {
    int B, H, W, Cc;
    int block;      // gates per direction: 2*Cc + 3 (shared weights) or 5*Cc
    int G;          // gates per token, GSPN_SCAN_DIRS * block
    size_t plane;   // elements of xc, B*H*W*Cc
} GspnScanDims;

// Gates a direction: lam (Cc) | u (Cc) | wt (3 shared, or 3 Cc per channel).
static inline int gspn_scan_gate_block(int Cc, int shared_w) { return shared_w ? 2 * Cc + 3 : 5 * Cc; }

static inline GspnScanDims gspn_scan_dims(const char *op, const Tensor *xc, const Tensor *gates,
                                          const Tensor *merge, int shared_w) {
    char a[64], b[64];
    CG_CHECK(xc && gates && merge, "", "op %s: xc, gates and merge are required", op);
    CG_CHECK(xc->ndim == 4, "", "op %s: xc has shape %s, expected (B, H, W, Cc)", op,
             tensor_shape_str(xc, a, sizeof a));
    GspnScanDims d = {xc->shape[0], xc->shape[1], xc->shape[2], xc->shape[3], 0, 0, xc->numel};
    d.block = gspn_scan_gate_block(d.Cc, shared_w);
    d.G = GSPN_SCAN_DIRS * d.block;
    CG_CHECK(gates->ndim == 4 && gates->shape[0] == d.B && gates->shape[1] == d.H &&
                 gates->shape[2] == d.W && gates->shape[3] == d.G,
             shared_w ? "gspn_shared_w = 1 expects G = 4*(2*Cc+3)" : "gspn_shared_w = 0 expects G = 20*Cc",
             "op %s: gates have shape %s, xc %s", op, tensor_shape_str(gates, a, sizeof a),
             tensor_shape_str(xc, b, sizeof b));
    CG_CHECK(merge->numel == GSPN_SCAN_DIRS, "", "op %s: merge has %zu elements, expected %d", op,
             merge->numel, GSPN_SCAN_DIRS);
    return d;
}

// gspn_scan_proj_fwd's gates: the (B,H,W,G) tensor gspn_scan_fwd would read, in xc's dtype and
// on its device, without data; gw (G, Cc) and gb (G, or NULL) in xc's dtype and on its device.
static inline Tensor gspn_scan_proj_gates(const char *op, const Tensor *xc, const Tensor *gw,
                                          const Tensor *gb, int shared_w) {
    char a[64];
    CG_CHECK(xc && gw, "", "op %s: xc and gw are required", op);
    CG_CHECK(xc->ndim == 4, "", "op %s: xc has shape %s, expected (B, H, W, Cc)", op,
             tensor_shape_str(xc, a, sizeof a));
    const int Cc = xc->shape[3], G = GSPN_SCAN_DIRS * gspn_scan_gate_block(Cc, shared_w);
    CG_CHECK(gw->ndim == 2 && gw->shape[0] == G && gw->shape[1] == Cc,
             shared_w ? "gspn_shared_w = 1 expects G = 4*(2*Cc+3)" : "gspn_shared_w = 0 expects G = 20*Cc",
             "op %s: gw has shape %s, expected (%d, %d)", op, tensor_shape_str(gw, a, sizeof a), G, Cc);
    CG_CHECK(!gb || gb->numel == (size_t)G, "", "op %s: gb has %zu elements, expected %d", op,
             gb ? gb->numel : 0, G);
    CG_CHECK(gw->dtype == xc->dtype && (!gb || gb->dtype == xc->dtype) && gw->device == xc->device &&
                 (!gb || gb->device == xc->device),
             "", "op %s: gw and gb must be in xc's dtype (%s) and on its device", op, dtype_name(xc->dtype));
    Tensor g = {0};
    g.ndim = 4;
    g.shape[0] = xc->shape[0];
    g.shape[1] = xc->shape[1];
    g.shape[2] = xc->shape[2];
    g.shape[3] = G;
    g.numel = (size_t)xc->shape[0] * xc->shape[1] * xc->shape[2] * G;
    g.dtype = xc->dtype;
    g.device = xc->device;
    return g;
}

// t (NULL: not given) holds as many elements as ref.
static inline void gspn_scan_check_like(const char *op, const char *name, const Tensor *t,
                                        const char *ref_name, const Tensor *ref) {
    char a[64], b[64];
    if (!t) return;
    CG_CHECK(t->numel == ref->numel, "", "op %s: %s has shape %s, %s %s: they must hold as many "
             "elements", op, name, tensor_shape_str(t, a, sizeof a), ref_name,
             tensor_shape_str(ref, b, sizeof b));
}

// hidden (NULL: not given) holds the four scans' states h_d: (4, B, H, W, Cc) fp32.
static inline void gspn_scan_check_hidden(const char *op, const Tensor *hidden, size_t plane) {
    char a[64];
    if (!hidden) return;
    CG_CHECK(hidden->numel == GSPN_SCAN_DIRS * plane && hidden->dtype == DTYPE_F32, "",
             "op %s: hidden is %s %s, expected (4, B, H, W, Cc) fp32 (%zu elements)", op,
             tensor_shape_str(hidden, a, sizeof a), dtype_name(hidden->dtype),
             GSPN_SCAN_DIRS * plane);
}
