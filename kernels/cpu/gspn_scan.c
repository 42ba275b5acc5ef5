// C-GSPN propagation, CPU fp32 reference (docs/design.md#cgspn-layer steps 3-5; contract in kernels/ops.h).
//
// xc (B,H,W,Cc), gates (B,H,W,G), merge (4) -> yc (B,H,W,Cc) = sum_d m_d * u_d * h_d, where h_d
// is the scan of direction d in (TB, BT, LR, RL), each in the original frame:
//   h[pos] = lam[pos] * xc[pos] + sum_k w_k[pos] * h[prev(pos) shifted by k along the other axis]
// with w_k the row-stochastic weights over the neighbours that exist.
//
// The four directions share one code path: a ScanDir maps (step s, lane l) to a token, where the
// step runs along the scan axis in scan order and the lane along the neighbour axis. The
// neighbour k in {-1, 0, +1} of (s, l) is (s-1, l+k). Work is split over (direction, image):
// each task runs its scan sequentially and writes only its own memory, so results do not
// depend on the thread count.
//
// The loops live in gspn_scan_impl.h, compiled here for float and for double (the C ABI's fp64
// path, kernels/cgspn_abi.c); this file adds the op's Tensor checks and buffers.
#include <math.h>
#include <string.h>
#include "gspn_scan.h"
#include "../ops.h"
#include "../error.h"
#include "../gspn_scan_shape.h"
#include "cpu_check.h"

// One scan direction over one image of H x W tokens.
typedef struct ScanDir {
    int steps, lanes;          // along the scan axis, along the neighbour axis
    long first;                // token of (s=0, l=0), counted within the image
    long step_stride;          // tokens from step s to step s+1 (negative for BT, RL)
    long lane_stride;          // tokens from lane l to lane l+1
} ScanDir;

static ScanDir scan_dir(int d, int H, int W) {
    switch (d) {
    case GSPN_TB: return (ScanDir){.steps = H, .lanes = W, .first = 0,
                                   .step_stride = W, .lane_stride = 1};
    case GSPN_BT: return (ScanDir){.steps = H, .lanes = W, .first = (long)(H - 1) * W,
                                   .step_stride = -W, .lane_stride = 1};
    case GSPN_LR: return (ScanDir){.steps = W, .lanes = H, .first = 0,
                                   .step_stride = 1, .lane_stride = W};
    default:      return (ScanDir){.steps = W, .lanes = H, .first = W - 1,
                                   .step_stride = -1, .lane_stride = W};   // GSPN_RL
    }
}

static inline long scan_token(const ScanDir *dir, int s, int l) {
    return dir->first + s * dir->step_stride + l * dir->lane_stride;
}

GspnShape gspn_shape_make(int B, int H, int W, int Cc, int shared_w) {
    GspnShape sh = {.B = B, .H = H, .W = W, .Cc = Cc};
    if (shared_w) {
        sh.block = 2 * Cc + 3;
        sh.wk_stride = 1;
        sh.wc_stride = 0;
    } else {
        sh.block = 5 * Cc;
        sh.wk_stride = Cc;
        sh.wc_stride = 1;
    }
    sh.G = GSPN_DIRS * sh.block;
    return sh;
}

#define GSPN_REAL float
#define GSPN_SFX f32
#define GSPN_EXP expf
#define GSPN_FMAX fmaxf
#define GSPN_S_MIN 1e-7f
#include "gspn_scan_impl.h"

#define GSPN_REAL double
#define GSPN_SFX f64
#define GSPN_EXP exp
#define GSPN_FMAX fmax
#define GSPN_S_MIN 1e-7
#include "gspn_scan_impl.h"

// ---- the op on Tensors -----------------------------------------------------------------------

// The shared checks (kernels/gspn_scan_shape.h), then the CPU's rule: fp32 on the host.
static GspnShape gspn_shape(const char *op, const Tensor *xc, const Tensor *gates,
                            const Tensor *merge, int shared_w) {
    const GspnScanDims d = gspn_scan_dims(op, xc, gates, merge, shared_w);
    cpu_check_f32(op, "xc", xc);
    cpu_check_f32(op, "gates", gates);
    cpu_check_f32(op, "merge", merge);
    return gspn_shape_make(d.B, d.H, d.W, d.Cc, shared_w);
}

// t (NULL: not given) is host fp32 with ref's element count.
static void check_like(const char *op, const char *name, const Tensor *t, const char *ref_name,
                       const Tensor *ref) {
    if (!t) return;
    gspn_scan_check_like(op, name, t, ref_name, ref);
    cpu_check_f32(op, name, t);
}

void cpu_gspn_scan_fwd(Ctx *ctx, const Tensor *xc, const Tensor *gates, const Tensor *merge,
                       int shared_w, Tensor *yc, Tensor *hidden) {
    const char *op = "gspn_scan_fwd";
    const GspnShape sh = gspn_shape(op, xc, gates, merge, shared_w);
    CG_CHECK(yc, "", "op %s: yc is required", op);
    check_like(op, "yc", yc, "xc", xc);
    const size_t plane = xc->numel;
    gspn_scan_check_hidden(op, hidden, plane);

    float *h = hidden ? tensor_f32(hidden) : cg_malloc(GSPN_DIRS * plane * sizeof(float));
    gspn_core_fwd_f32(&sh, tensor_f32(xc), tensor_f32(gates), tensor_f32(merge), tensor_f32(yc), h);
    if (!hidden) free(h);
}

// The backward, accumulating; op names the caller in messages.
static void scan_bwd(const char *op, const Tensor *dyc, const Tensor *xc, const Tensor *gates,
                     const Tensor *merge, int shared_w, const Tensor *hidden, Tensor *dxc,
                     Tensor *dgates, Tensor *dmerge) {
    const GspnShape sh = gspn_shape(op, xc, gates, merge, shared_w);
    CG_CHECK(dyc, "", "op %s: dyc is required", op);
    check_like(op, "dyc", dyc, "xc", xc);
    check_like(op, "dxc", dxc, "xc", xc);
    check_like(op, "dgates", dgates, "gates", gates);
    check_like(op, "dmerge", dmerge, "merge", merge);
    const size_t plane = xc->numel;
    gspn_scan_check_hidden(op, hidden, plane);
    if (!dxc && !dgates && !dmerge) return;

    const float *x = tensor_f32(xc), *g = tensor_f32(gates);

    // h saved by the forward, or recomputed by the same scan.
    float *h_own = NULL;
    const float *h = hidden ? tensor_f32(hidden) : NULL;
    if (!h) {
        h_own = cg_malloc(GSPN_DIRS * plane * sizeof(float));
        gspn_core_hidden_f32(&sh, x, g, h_own);
        h = h_own;
    }
    float *dh = cg_malloc(GSPN_DIRS * plane * sizeof(float));
    double *dmerge_part = cg_malloc((size_t)GSPN_DIRS * sh.B * sizeof(double));
    gspn_core_bwd_f32(&sh, tensor_f32(dyc), x, g, tensor_f32(merge), h, dh, dmerge_part,
                      dxc ? tensor_f32(dxc) : NULL, dgates ? tensor_f32(dgates) : NULL,
                      dmerge ? tensor_f32(dmerge) : NULL);
    free(dmerge_part);
    free(dh);
    free(h_own);
}

// GSPN_SCAN_WRITE_GRADS: the reference writes by zeroing, then accumulating: the same values as
// the GPU's direct writes.
void cpu_gspn_scan_bwd(Ctx *ctx, const Tensor *dyc, const Tensor *xc, const Tensor *gates,
                       const Tensor *merge, int shared_w, const Tensor *hidden, int flags,
                       Tensor *dxc, Tensor *dgates, Tensor *dmerge) {
    const char *op = "gspn_scan_bwd";
    if (flags & GSPN_SCAN_WRITE_GRADS) {
        check_like(op, "dxc", dxc, "xc", xc);
        check_like(op, "dgates", dgates, "gates", gates);
        if (dxc) memset(tensor_f32(dxc), 0, dxc->numel * sizeof(float));
        if (dgates) memset(tensor_f32(dgates), 0, dgates->numel * sizeof(float));
    }
    scan_bwd(op, dyc, xc, gates, merge, shared_w, hidden, dxc, dgates, dmerge);
}
