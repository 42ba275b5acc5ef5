// The CPU C-GSPN cores, written once for any real type. kernels/cpu/gspn_scan.c includes this
// file twice, once per precision, after defining
//   GSPN_REAL     float | double
//   GSPN_SFX      f32   | f64        (suffix of every function defined here)
//   GSPN_EXP      expf  | exp
//   GSPN_FMAX     fmaxf | fmax
//   GSPN_S_MIN    1e-7f | 1e-7       (docs/design.md#cgspn-layer step 3: w_k = a_k / max(S, 1e-7))
// and ScanDir / scan_dir / scan_token. No include guard on purpose; it undefines the names above.
#define GSPN_CAT_(a, b) a##_##b
#define GSPN_CAT(a, b) GSPN_CAT_(a, b)
#define GSPN_FN(name) GSPN_CAT(name, GSPN_SFX)
#define real GSPN_REAL

static inline real GSPN_FN(sigmoid)(real x) { return (real)1 / ((real)1 + GSPN_EXP(-x)); }

// Row-stochastic weights of one position (docs/design.md#cgspn-layer step 3). wt points at wt_{-1} of the
// channel, wt_k at wt[(k+1) * wk_stride]. Neighbour k exists when 0 <= lane + k < lanes.
// Fills a_k = sigmoid(wt_k) and w_k = a_k / max(S, 1e-7) for existing k, 0 for the others,
// and returns S = sum of the existing a_k.
static real GSPN_FN(gspn_weights)(const real *wt, int wk_stride, int lane, int lanes,
                                  real a[3], real w[3]) {
    real S = 0;
    for (int k = -1; k <= 1; k++) {
        int exists = lane + k >= 0 && lane + k < lanes;
        a[k + 1] = exists ? GSPN_FN(sigmoid)(wt[(k + 1) * wk_stride]) : (real)0;
        S += a[k + 1];
    }
    real inv = (real)1 / GSPN_FMAX(S, GSPN_S_MIN);
    for (int k = 0; k < 3; k++) w[k] = a[k] * inv;
    return S;
}

// Forward scan of direction d over one image: xc (H*W, Cc), gates (H*W, G) -> h (H*W, Cc).
static void GSPN_FN(scan_forward)(const GspnShape *sh, int d, const real *xc, const real *gates,
                                  real *h) {
    const ScanDir dir = scan_dir(d, sh->H, sh->W);
    const int Cc = sh->Cc;
    for (int s = 0; s < dir.steps; s++) {
        for (int l = 0; l < dir.lanes; l++) {
            const long t = scan_token(&dir, s, l);
            const real *lam = gates + t * sh->G + d * sh->block;
            const real *wt = lam + 2 * Cc;
            for (int c = 0; c < Cc; c++) {
                real acc = lam[c] * xc[t * Cc + c];
                if (s > 0) {
                    real a[3], w[3];
                    GSPN_FN(gspn_weights)(wt + c * sh->wc_stride, sh->wk_stride, l, dir.lanes,
                                          a, w);
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

// All four scans: h (4, B, H*W, Cc). Work is split over (direction, image): each task runs its
// scan sequentially and writes only its own memory, so results do not depend on the thread count.
void GSPN_FN(gspn_core_hidden)(const GspnShape *sh, const real *xc, const real *gates, real *h) {
    const long HW = (long)sh->H * sh->W;
    const size_t plane = (size_t)sh->B * HW * sh->Cc;
#pragma omp parallel for schedule(static)
    for (int task = 0; task < GSPN_DIRS * sh->B; task++) {
        const int d = task / sh->B, b = task % sh->B;
        GSPN_FN(scan_forward)(sh, d, xc + b * HW * sh->Cc, gates + b * HW * sh->G,
                              h + d * plane + b * HW * sh->Cc);
    }
}

void GSPN_FN(gspn_core_fwd)(const GspnShape *sh, const real *xc, const real *gates,
                            const real *merge, real *yc, real *h) {
    GSPN_FN(gspn_core_hidden)(sh, xc, gates, h);

    // Merge (docs/design.md#cgspn-layer step 5), directions summed in a fixed order.
    const size_t plane = (size_t)sh->B * sh->H * sh->W * sh->Cc;
    const long tokens = (long)sh->B * sh->H * sh->W;
#pragma omp parallel for schedule(static)
    for (long t = 0; t < tokens; t++) {
        for (int c = 0; c < sh->Cc; c++) {
            real acc = 0;
            for (int d = 0; d < GSPN_DIRS; d++) {
                const real u = gates[t * sh->G + d * sh->block + sh->Cc + c];
                acc += merge[d] * u * h[d * plane + t * sh->Cc + c];
            }
            yc[t * sh->Cc + c] = acc;
        }
    }
}

// Reverse scan of direction d over one image (docs/design.md#cgspn-layer backward): dh = dL/dh, starting from
// zero, receives the output's gradient m_d u dyc at each position and, from step s+1, the
// transposed weights: dh[s-1, l+k] += w_k[s, l] * dh[s, l].
static void GSPN_FN(scan_backward)(const GspnShape *sh, int d, real m, const real *dyc,
                                   const real *gates, real *dh) {
    const ScanDir dir = scan_dir(d, sh->H, sh->W);
    const int Cc = sh->Cc;
    for (int s = dir.steps - 1; s >= 0; s--) {
        for (int l = 0; l < dir.lanes; l++) {
            const long t = scan_token(&dir, s, l);
            const real *u = gates + t * sh->G + d * sh->block + Cc;
            for (int c = 0; c < Cc; c++) dh[t * Cc + c] += m * u[c] * dyc[t * Cc + c];
        }
        if (s == 0) break;
        for (int l = 0; l < dir.lanes; l++) {   // dh of step s is complete: push to step s-1
            const long t = scan_token(&dir, s, l);
            const real *wt = gates + t * sh->G + d * sh->block + 2 * Cc;
            for (int c = 0; c < Cc; c++) {
                real a[3], w[3];
                GSPN_FN(gspn_weights)(wt + c * sh->wc_stride, sh->wk_stride, l, dir.lanes, a, w);
                for (int k = -1; k <= 1; k++) {
                    if (l + k < 0 || l + k >= dir.lanes) continue;
                    dh[scan_token(&dir, s - 1, l + k) * Cc + c] += w[k + 1] * dh[t * Cc + c];
                }
            }
        }
    }
}

// dL/dwt from dL/dw through the normalization (docs/design.md#cgspn-layer):
// dwt_k = a_k (1 - a_k) (dw_k - sum_k' w_k' dw_k') / S for existing k (a_k = 0 for missing
// ones, so they get 0). Where the clamp max(S, 1e-7) is active, w_k = a_k / 1e-7 and the
// derivative has no cross term.
static void GSPN_FN(weights_backward)(const real a[3], const real w[3], real S, const real dw[3],
                                      real dwt[3]) {
    if (S > GSPN_S_MIN) {
        const real mean = w[0] * dw[0] + w[1] * dw[1] + w[2] * dw[2];
        for (int k = 0; k < 3; k++) dwt[k] = a[k] * ((real)1 - a[k]) * (dw[k] - mean) / S;
    } else {
        for (int k = 0; k < 3; k++) dwt[k] = a[k] * ((real)1 - a[k]) * dw[k] / GSPN_S_MIN;
    }
}

// Gate gradients of direction d over one image, from h and dh of that direction:
// dlam = xc dh, du = m h dyc, dw_k = dh h[s-1, l+k] -> dwt. dgates (H*W, G) or NULL; returns
// sum u h dyc, this image's part of dmerge[d].
static double GSPN_FN(gates_backward)(const GspnShape *sh, int d, real m, const real *dyc,
                                      const real *xc, const real *gates, const real *h,
                                      const real *dh, real *dgates) {
    const ScanDir dir = scan_dir(d, sh->H, sh->W);
    const int Cc = sh->Cc;
    double dmerge = 0.0;
    for (int s = 0; s < dir.steps; s++) {
        for (int l = 0; l < dir.lanes; l++) {
            const long t = scan_token(&dir, s, l);
            const real *lam = gates + t * sh->G + d * sh->block, *u = lam + Cc, *wt = lam + 2 * Cc;
            real *dlam = NULL, *du = NULL, *dwt = NULL;
            if (dgates) {
                dlam = dgates + t * sh->G + d * sh->block;
                du = dlam + Cc;
                dwt = dlam + 2 * Cc;
            }
            real dw_shared[3] = {0, 0, 0};   // shared_w: dL/dw summed over channels
            for (int c = 0; c < Cc; c++) {
                const long i = t * Cc + c;
                dmerge += (double)u[c] * h[i] * dyc[i];
                if (!dgates) continue;
                dlam[c] += xc[i] * dh[i];
                du[c] += m * h[i] * dyc[i];
                if (s == 0) continue;                 // h[-1] = 0: the weights have no effect
                real dw[3] = {0, 0, 0};
                for (int k = -1; k <= 1; k++) {
                    if (l + k < 0 || l + k >= dir.lanes) continue;
                    dw[k + 1] = dh[i] * h[scan_token(&dir, s - 1, l + k) * Cc + c];
                }
                if (sh->wc_stride == 0) {
                    for (int k = 0; k < 3; k++) dw_shared[k] += dw[k];
                    continue;
                }
                real a[3], w[3], g[3];
                const real S = GSPN_FN(gspn_weights)(wt + c, sh->wk_stride, l, dir.lanes, a, w);
                GSPN_FN(weights_backward)(a, w, S, dw, g);
                for (int k = 0; k < 3; k++) dwt[k * sh->wk_stride + c] += g[k];
            }
            if (dgates && s > 0 && sh->wc_stride == 0) {
                real a[3], w[3], g[3];
                const real S = GSPN_FN(gspn_weights)(wt, sh->wk_stride, l, dir.lanes, a, w);
                GSPN_FN(weights_backward)(a, w, S, dw_shared, g);
                for (int k = 0; k < 3; k++) dwt[k] += g[k];
            }
        }
    }
    return dmerge;
}

void GSPN_FN(gspn_core_bwd)(const GspnShape *sh, const real *dyc, const real *xc,
                            const real *gates, const real *merge, const real *h, real *dh,
                            double *dmerge_part, real *dxc, real *dgates, real *dmerge) {
    const long HW = (long)sh->H * sh->W;
    const size_t plane = (size_t)sh->B * HW * sh->Cc;
    const int tasks = GSPN_DIRS * sh->B;

    // dL/dh of every direction (4, B, H*W, Cc), then the local gradients from it.
    memset(dh, 0, GSPN_DIRS * plane * sizeof(real));
#pragma omp parallel for schedule(static)
    for (int task = 0; task < tasks; task++) {
        const int d = task / sh->B, b = task % sh->B;
        const size_t img = (size_t)d * plane + b * HW * sh->Cc;
        GSPN_FN(scan_backward)(sh, d, merge[d], dyc + b * HW * sh->Cc, gates + b * HW * sh->G,
                               dh + img);
        dmerge_part[task] = GSPN_FN(gates_backward)(sh, d, merge[d], dyc + b * HW * sh->Cc,
                                                    xc + b * HW * sh->Cc, gates + b * HW * sh->G,
                                                    h + img, dh + img,
                                                    dgates ? dgates + b * HW * sh->G : NULL);
    }

    // dxc = sum_d lam_d dh_d, directions in a fixed order.
    if (dxc) {
        const long tokens = (long)sh->B * HW;
#pragma omp parallel for schedule(static)
        for (long t = 0; t < tokens; t++) {
            for (int c = 0; c < sh->Cc; c++) {
                real acc = 0;
                for (int d = 0; d < GSPN_DIRS; d++)
                    acc += gates[t * sh->G + d * sh->block + c] * dh[d * plane + t * sh->Cc + c];
                dxc[t * sh->Cc + c] += acc;
            }
        }
    }
    if (dmerge) {
        for (int d = 0; d < GSPN_DIRS; d++) {
            double acc = 0.0;
            for (int b = 0; b < sh->B; b++) acc += dmerge_part[d * sh->B + b];
            dmerge[d] += (real)acc;
        }
    }
}

#undef real
#undef GSPN_FN
#undef GSPN_CAT
#undef GSPN_CAT_
#undef GSPN_REAL
#undef GSPN_SFX
#undef GSPN_EXP
#undef GSPN_FMAX
#undef GSPN_S_MIN
