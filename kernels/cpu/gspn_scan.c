// C-GSPN propagation, CPU fp32 reference (DESIGN §5 steps 3-5; contract in kernels/ops.h).
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
#include <math.h>
#include "../ops.h"
#include "../../nn/error.h"

enum { GSPN_TB, GSPN_BT, GSPN_LR, GSPN_RL, GSPN_DIRS };

// Where the normalization clamps S (DESIGN §5 step 3: w_k = a_k / max(S, 1e-7)).
#define GSPN_S_MIN 1e-7f

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

// Sizes and the gate layout of ops.h. Within a token's gates, direction d's block starts at
// d * block and holds lam (Cc) | u (Cc) | raw weights; the raw weight wt_k of channel c is at
// 2*Cc + (k+1) * wk_stride + c * wc_stride.
typedef struct GspnShape {
    int B, H, W, Cc, G;
    int block;                 // gates per direction
    int wk_stride, wc_stride;  // per channel: Cc, 1; shared: 1, 0
} GspnShape;

static GspnShape gspn_shape(const Tensor *xc, const Tensor *gates, const Tensor *merge,
                            int shared_w) {
    char a[64], b[64];
    CG_CHECK(xc->ndim == 4, "", "gspn_scan: xc must be (B, H, W, Cc), got %s",
             tensor_shape_str(xc, a, sizeof a));
    GspnShape sh = {.B = xc->shape[0], .H = xc->shape[1], .W = xc->shape[2], .Cc = xc->shape[3]};
    if (shared_w) {
        sh.block = 2 * sh.Cc + 3;
        sh.wk_stride = 1;
        sh.wc_stride = 0;
    } else {
        sh.block = 5 * sh.Cc;
        sh.wk_stride = sh.Cc;
        sh.wc_stride = 1;
    }
    sh.G = GSPN_DIRS * sh.block;
    CG_CHECK(gates->ndim == 4 && gates->shape[0] == sh.B && gates->shape[1] == sh.H &&
             gates->shape[2] == sh.W && gates->shape[3] == sh.G,
             shared_w ? "gspn_shared_w = 1 expects G = 4*(2*Cc+3)" : "gspn_shared_w = 0 expects G = 20*Cc",
             "gspn_scan: gates %s do not match xc %s",
             tensor_shape_str(gates, a, sizeof a), tensor_shape_str(xc, b, sizeof b));
    CG_CHECK(merge->numel == GSPN_DIRS, "", "gspn_scan: merge has %zu elements, expected 4",
             merge->numel);
    CG_CHECK(xc->dtype == DTYPE_F32 && gates->dtype == DTYPE_F32 && merge->dtype == DTYPE_F32,
             "", "gspn_scan: the CPU kernel takes fp32 tensors");
    return sh;
}

static void check_like(const char *what, const Tensor *t, const Tensor *ref) {
    char a[64], b[64];
    if (!t) return;
    CG_CHECK(t->numel == ref->numel && t->dtype == DTYPE_F32, "",
             "gspn_scan: %s %s does not match %s", what, tensor_shape_str(t, a, sizeof a),
             tensor_shape_str(ref, b, sizeof b));
}

static inline float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

// Row-stochastic weights of one position (DESIGN §5 step 3). wt points at wt_{-1} of the
// channel, wt_k at wt[(k+1) * wk_stride]. Neighbour k exists when 0 <= lane + k < lanes.
// Fills a_k = sigmoid(wt_k) and w_k = a_k / max(S, 1e-7) for existing k, 0 for the others,
// and returns S = sum of the existing a_k.
static float gspn_weights(const float *wt, int wk_stride, int lane, int lanes,
                          float a[3], float w[3]) {
    float S = 0.0f;
    for (int k = -1; k <= 1; k++) {
        int exists = lane + k >= 0 && lane + k < lanes;
        a[k + 1] = exists ? sigmoidf(wt[(k + 1) * wk_stride]) : 0.0f;
        S += a[k + 1];
    }
    float inv = 1.0f / fmaxf(S, GSPN_S_MIN);
    for (int k = 0; k < 3; k++) w[k] = a[k] * inv;
    return S;
}

// Forward scan of direction d over one image: xc (H*W, Cc), gates (H*W, G) -> h (H*W, Cc).
static void scan_forward(const GspnShape *sh, int d, const float *xc, const float *gates,
                         float *h) {
    const ScanDir dir = scan_dir(d, sh->H, sh->W);
    const int Cc = sh->Cc;
    for (int s = 0; s < dir.steps; s++) {
        for (int l = 0; l < dir.lanes; l++) {
            const long t = scan_token(&dir, s, l);
            const float *lam = gates + t * sh->G + d * sh->block;
            const float *wt = lam + 2 * Cc;
            for (int c = 0; c < Cc; c++) {
                float acc = lam[c] * xc[t * Cc + c];
                if (s > 0) {
                    float a[3], w[3];
                    gspn_weights(wt + c * sh->wc_stride, sh->wk_stride, l, dir.lanes, a, w);
                    for (int k = -1; k <= 1; k++) {
                        if (l + k < 0 || l + k >= dir.lanes) continue;
                        acc += w[k + 1] * h[scan_token(&dir, s - 1, l + k) * Cc + c];
                    }
                }
                h[t * Cc + c] = acc;
            }
        }
    }
}

// All four scans: h (4, B, H*W, Cc).
static void scan_forward_all(const GspnShape *sh, const float *xc, const float *gates, float *h) {
    const long HW = (long)sh->H * sh->W;
    const size_t plane = (size_t)sh->B * HW * sh->Cc;
#pragma omp parallel for schedule(static)
    for (int task = 0; task < GSPN_DIRS * sh->B; task++) {
        const int d = task / sh->B, b = task % sh->B;
        scan_forward(sh, d, xc + b * HW * sh->Cc, gates + b * HW * sh->G,
                     h + d * plane + b * HW * sh->Cc);
    }
}

void cpu_gspn_scan_fwd(Ctx *ctx, const Tensor *xc, const Tensor *gates, const Tensor *merge,
                       int shared_w, Tensor *yc, Tensor *hidden) {
    const GspnShape sh = gspn_shape(xc, gates, merge, shared_w);
    check_like("yc", yc, xc);
    const size_t plane = xc->numel;
    CG_CHECK(!hidden || (hidden->numel == GSPN_DIRS * plane && hidden->dtype == DTYPE_F32), "",
             "gspn_scan: hidden must be (4, B, H, W, Cc) fp32");

    float *h = hidden ? tensor_f32(hidden) : cg_malloc(GSPN_DIRS * plane * sizeof(float));
    scan_forward_all(&sh, tensor_f32(xc), tensor_f32(gates), h);

    // Merge (DESIGN §5 step 5), directions summed in a fixed order.
    const float *g = tensor_f32(gates), *m = tensor_f32(merge);
    float *y = tensor_f32(yc);
    const long tokens = (long)sh.B * sh.H * sh.W;
#pragma omp parallel for schedule(static)
    for (long t = 0; t < tokens; t++) {
        for (int c = 0; c < sh.Cc; c++) {
            float acc = 0.0f;
            for (int d = 0; d < GSPN_DIRS; d++) {
                const float u = g[t * sh.G + d * sh.block + sh.Cc + c];
                acc += m[d] * u * h[d * plane + t * sh.Cc + c];
            }
            y[t * sh.Cc + c] = acc;
        }
    }
    if (!hidden) free(h);
}

// Reverse scan of direction d over one image (DESIGN §5 backward): dh = dL/dh, starting from
// zero, receives the output's gradient m_d u dyc at each position and, from step s+1, the
// transposed weights: dh[s-1, l+k] += w_k[s, l] * dh[s, l].
static void scan_backward(const GspnShape *sh, int d, float m, const float *dyc,
                          const float *gates, float *dh) {
    const ScanDir dir = scan_dir(d, sh->H, sh->W);
    const int Cc = sh->Cc;
    for (int s = dir.steps - 1; s >= 0; s--) {
        for (int l = 0; l < dir.lanes; l++) {
            const long t = scan_token(&dir, s, l);
            const float *u = gates + t * sh->G + d * sh->block + Cc;
            for (int c = 0; c < Cc; c++) dh[t * Cc + c] += m * u[c] * dyc[t * Cc + c];
        }
        if (s == 0) break;
        for (int l = 0; l < dir.lanes; l++) {   // dh of step s is complete: push to step s-1
            const long t = scan_token(&dir, s, l);
            const float *wt = gates + t * sh->G + d * sh->block + 2 * Cc;
            for (int c = 0; c < Cc; c++) {
                float a[3], w[3];
                gspn_weights(wt + c * sh->wc_stride, sh->wk_stride, l, dir.lanes, a, w);
                for (int k = -1; k <= 1; k++) {
                    if (l + k < 0 || l + k >= dir.lanes) continue;
                    dh[scan_token(&dir, s - 1, l + k) * Cc + c] += w[k + 1] * dh[t * Cc + c];
                }
            }
        }
    }
}

// dL/dwt from dL/dw through the normalization (DESIGN §5):
// dwt_k = a_k (1 - a_k) (dw_k - sum_k' w_k' dw_k') / S for existing k (a_k = 0 for missing
// ones, so they get 0). Where the clamp max(S, 1e-7) is active, w_k = a_k / 1e-7 and the
// derivative has no cross term.
static void weights_backward(const float a[3], const float w[3], float S, const float dw[3],
                             float dwt[3]) {
    if (S > GSPN_S_MIN) {
        const float mean = w[0] * dw[0] + w[1] * dw[1] + w[2] * dw[2];
        for (int k = 0; k < 3; k++) dwt[k] = a[k] * (1.0f - a[k]) * (dw[k] - mean) / S;
    } else {
        for (int k = 0; k < 3; k++) dwt[k] = a[k] * (1.0f - a[k]) * dw[k] / GSPN_S_MIN;
    }
}

// Gate gradients of direction d over one image, from h and dh of that direction:
// dlam = xc dh, du = m h dyc, dw_k = dh h[s-1, l+k] -> dwt. dgates (H*W, G) or NULL; returns
// sum u h dyc, this image's part of dmerge[d].
static double gates_backward(const GspnShape *sh, int d, float m, const float *dyc,
                             const float *xc, const float *gates, const float *h,
                             const float *dh, float *dgates) {
    const ScanDir dir = scan_dir(d, sh->H, sh->W);
    const int Cc = sh->Cc;
    double dmerge = 0.0;
    for (int s = 0; s < dir.steps; s++) {
        for (int l = 0; l < dir.lanes; l++) {
            const long t = scan_token(&dir, s, l);
            const float *lam = gates + t * sh->G + d * sh->block, *u = lam + Cc, *wt = lam + 2 * Cc;
            float *dlam = NULL, *du = NULL, *dwt = NULL;
            if (dgates) {
                dlam = dgates + t * sh->G + d * sh->block;
                du = dlam + Cc;
                dwt = dlam + 2 * Cc;
            }
            float dw_shared[3] = {0.0f, 0.0f, 0.0f};   // shared_w: dL/dw summed over channels
            for (int c = 0; c < Cc; c++) {
                const long i = t * Cc + c;
                dmerge += (double)u[c] * h[i] * dyc[i];
                if (!dgates) continue;
                dlam[c] += xc[i] * dh[i];
                du[c] += m * h[i] * dyc[i];
                if (s == 0) continue;                 // h[-1] = 0: the weights have no effect
                float dw[3] = {0.0f, 0.0f, 0.0f};
                for (int k = -1; k <= 1; k++) {
                    if (l + k < 0 || l + k >= dir.lanes) continue;
                    dw[k + 1] = dh[i] * h[scan_token(&dir, s - 1, l + k) * Cc + c];
                }
                if (sh->wc_stride == 0) {
                    for (int k = 0; k < 3; k++) dw_shared[k] += dw[k];
                    continue;
                }
                float a[3], w[3], g[3];
                const float S = gspn_weights(wt + c, sh->wk_stride, l, dir.lanes, a, w);
                weights_backward(a, w, S, dw, g);
                for (int k = 0; k < 3; k++) dwt[k * sh->wk_stride + c] += g[k];
            }
            if (dgates && s > 0 && sh->wc_stride == 0) {
                float a[3], w[3], g[3];
                const float S = gspn_weights(wt, sh->wk_stride, l, dir.lanes, a, w);
                weights_backward(a, w, S, dw_shared, g);
                for (int k = 0; k < 3; k++) dwt[k] += g[k];
            }
        }
    }
    return dmerge;
}

void cpu_gspn_scan_bwd(Ctx *ctx, const Tensor *dyc, const Tensor *xc, const Tensor *gates,
                       const Tensor *merge, int shared_w, const Tensor *hidden,
                       Tensor *dxc, Tensor *dgates, Tensor *dmerge) {
    const GspnShape sh = gspn_shape(xc, gates, merge, shared_w);
    check_like("dyc", dyc, xc);
    check_like("dxc", dxc, xc);
    check_like("dgates", dgates, gates);
    check_like("dmerge", dmerge, merge);
    const size_t plane = xc->numel;
    CG_CHECK(!hidden || (hidden->numel == GSPN_DIRS * plane && hidden->dtype == DTYPE_F32), "",
             "gspn_scan: hidden must be (4, B, H, W, Cc) fp32");
    if (!dxc && !dgates && !dmerge) return;

    const float *x = tensor_f32(xc), *g = tensor_f32(gates), *m = tensor_f32(merge);
    const float *dy = tensor_f32(dyc);
    const long HW = (long)sh.H * sh.W;
    const int tasks = GSPN_DIRS * sh.B;

    // h saved by the forward, or recomputed by the same scan.
    float *h_own = NULL;
    const float *h = hidden ? tensor_f32(hidden) : NULL;
    if (!h) {
        h_own = cg_malloc(GSPN_DIRS * plane * sizeof(float));
        scan_forward_all(&sh, x, g, h_own);
        h = h_own;
    }

    // dL/dh of every direction (4, B, H*W, Cc), then the local gradients from it.
    float *dh = cg_calloc(GSPN_DIRS * plane, sizeof(float));
    double *dmerge_part = cg_calloc((size_t)tasks, sizeof(double));
    float *dg = dgates ? tensor_f32(dgates) : NULL;
#pragma omp parallel for schedule(static)
    for (int task = 0; task < tasks; task++) {
        const int d = task / sh.B, b = task % sh.B;
        const size_t img = (size_t)d * plane + b * HW * sh.Cc;
        scan_backward(&sh, d, m[d], dy + b * HW * sh.Cc, g + b * HW * sh.G, dh + img);
        dmerge_part[task] = gates_backward(&sh, d, m[d], dy + b * HW * sh.Cc,
                                           x + b * HW * sh.Cc, g + b * HW * sh.G, h + img,
                                           dh + img, dg ? dg + b * HW * sh.G : NULL);
    }

    // dxc = sum_d lam_d dh_d, directions in a fixed order.
    if (dxc) {
        float *dx = tensor_f32(dxc);
        const long tokens = (long)sh.B * HW;
#pragma omp parallel for schedule(static)
        for (long t = 0; t < tokens; t++) {
            for (int c = 0; c < sh.Cc; c++) {
                float acc = 0.0f;
                for (int d = 0; d < GSPN_DIRS; d++)
                    acc += g[t * sh.G + d * sh.block + c] * dh[d * plane + t * sh.Cc + c];
                dx[t * sh.Cc + c] += acc;
            }
        }
    }
    if (dmerge) {
        float *dm = tensor_f32(dmerge);
        for (int d = 0; d < GSPN_DIRS; d++) {
            double acc = 0.0;
            for (int b = 0; b < sh.B; b++) acc += dmerge_part[d * sh.B + b];
            dm[d] += (float)acc;
        }
    }
    free(dmerge_part);
    free(dh);
    free(h_own);
}
