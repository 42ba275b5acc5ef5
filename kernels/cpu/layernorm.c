// CPU reference: LayerNorm over the last dim (kernels/ops.h), PyTorch semantics (biased
// variance, eps inside the square root). x (N,C) is any tensor with last dim C.
#include "../ops.h"
#include "cpu_check.h"
#include <math.h>

// Columns per weight/bias-gradient chunk: one thread sums a chunk over all rows in order (in
// double), so dw and db do not depend on the thread count.
enum { LAYERNORM_DW_CHUNK = 16 };

// y = (x - mean) * rstd * w + b, rstd = 1 / sqrt(var + eps). mean, rstd (N) are saved for
// backward (either may be NULL when no backward follows). w or b NULL means 1 or 0.
void cpu_layernorm_fwd(Ctx *ctx, const Tensor *x, const Tensor *w, const Tensor *b, float eps,
                       Tensor *y, Tensor *mean, Tensor *rstd) {
    cpu_check_f32("layernorm_fwd", "x", x);
    int C = tensor_last(x);
    size_t N = tensor_rows(x);
    cpu_check_same("layernorm_fwd", "y", y, "x", x);
    if (w) cpu_check_numel("layernorm_fwd", "w", w, (size_t)C);
    if (b) cpu_check_numel("layernorm_fwd", "b", b, (size_t)C);
    if (mean) cpu_check_numel("layernorm_fwd", "mean", mean, N);
    if (rstd) cpu_check_numel("layernorm_fwd", "rstd", rstd, N);
    CG_CHECK(eps >= 0.0f, "layernorm eps is usually 1e-6 (timm ViT) or 1e-5",
             "op layernorm_fwd: eps = %g is negative", eps);

    const float *px = tensor_f32(x), *pw = w ? tensor_f32(w) : NULL, *pb = b ? tensor_f32(b) : NULL;
    float *py = tensor_f32(y);
    float *pmean = mean ? tensor_f32(mean) : NULL, *prstd = rstd ? tensor_f32(rstd) : NULL;
    #pragma omp parallel for schedule(static)
    for (size_t n = 0; n < N; n++) {
        const float *xr = px + n * C;
        float *yr = py + n * C;
        double s = 0;
        for (int c = 0; c < C; c++) s += xr[c];
        double mu = s / C, v = 0;
        for (int c = 0; c < C; c++) v += (xr[c] - mu) * (xr[c] - mu);
        float m = (float)mu, r = (float)(1.0 / sqrt(v / C + eps));
        for (int c = 0; c < C; c++) {
            float xhat = (xr[c] - m) * r;
            yr[c] = xhat * (pw ? pw[c] : 1.0f) + (pb ? pb[c] : 0.0f);
        }
        if (pmean) pmean[n] = m;
        if (prstd) prstd[n] = r;
    }
}

void cpu_add_layernorm_fwd(Ctx *ctx, const Tensor *x, const Tensor *r, const Tensor *w,
                           const Tensor *b, float eps, Tensor *h, Tensor *y, Tensor *mean,
                           Tensor *rstd) {
    cpu_check_f32("add_layernorm_fwd", "x", x);
    cpu_check_same("add_layernorm_fwd", "r", r, "x", x);
    cpu_check_same("add_layernorm_fwd", "h", h, "x", x);
    CG_CHECK(h->data != x->data && h->data != r->data, "", "op add_layernorm_fwd: h must not alias "
             "x or r");
    cpu_add_fwd(ctx, x, r, h);
    cpu_layernorm_fwd(ctx, h, w, b, eps, y, mean, rstd);
}

// With xhat = (x - mean) * rstd and g = dy * w:
//   dx += rstd * (g - mean_c(g) - xhat * mean_c(g * xhat));  dw += sum_n dy * xhat;  db += sum_n dy
void cpu_layernorm_bwd(Ctx *ctx, const Tensor *dy, const Tensor *x, const Tensor *w,
                       const Tensor *mean, const Tensor *rstd, Tensor *dx, Tensor *dw, Tensor *db,
                       Tensor *dx_act, Tensor *dx_sum) {
    CG_CHECK(dx || (!dx_act && !dx_sum), "", "op layernorm_bwd: dx_act and dx_sum hand dx on: "
             "they need dx");
    cpu_check_f32("layernorm_bwd", "x", x);
    int C = tensor_last(x);
    size_t N = tensor_rows(x);
    cpu_check_same("layernorm_bwd", "dy", dy, "x", x);
    if (w) cpu_check_numel("layernorm_bwd", "w", w, (size_t)C);
    CG_CHECK(mean && rstd, "run layernorm_fwd with mean and rstd tensors before its backward",
             "op layernorm_bwd: needs the mean and rstd saved by the forward pass");
    cpu_check_numel("layernorm_bwd", "mean", mean, N);
    cpu_check_numel("layernorm_bwd", "rstd", rstd, N);
    const float *pdy = tensor_f32(dy), *px = tensor_f32(x), *pw = w ? tensor_f32(w) : NULL;
    const float *pmean = tensor_f32(mean), *prstd = tensor_f32(rstd);

    if (dx) {
        cpu_check_same("layernorm_bwd", "dx", dx, "x", x);
        float *pdx = tensor_f32(dx);
        #pragma omp parallel for schedule(static)
        for (size_t n = 0; n < N; n++) {
            const float *xr = px + n * C, *dyr = pdy + n * C;
            float m = pmean[n], r = prstd[n];
            double sum_g = 0, sum_gx = 0;
            for (int c = 0; c < C; c++) {
                float g = dyr[c] * (pw ? pw[c] : 1.0f);
                sum_g += g;
                sum_gx += g * ((xr[c] - m) * r);
            }
            float mean_g = (float)(sum_g / C), mean_gx = (float)(sum_gx / C);
            float *dxr = pdx + n * C;
            for (int c = 0; c < C; c++) {
                float g = dyr[c] * (pw ? pw[c] : 1.0f);
                float xhat = (xr[c] - m) * r;
                dxr[c] += r * (g - mean_g - xhat * mean_gx);
            }
        }
        // the hand-off of the final dx: a copy, and its column sums
        if (dx_act) cpu_scale_fwd(ctx, dx, 1.0f, dx_act);
        if (dx_sum) {
            cpu_check_numel("layernorm_bwd", "dx_sum", dx_sum, (size_t)C);
            cpu_add_bcast_bwd(ctx, dx, NULL, dx_sum);
        }
    }
    if (dw) CG_CHECK(w, "", "op layernorm_bwd: dw given but the layer has no weight w");
    if (dw) cpu_check_numel("layernorm_bwd", "dw", dw, (size_t)C);
    if (db) cpu_check_numel("layernorm_bwd", "db", db, (size_t)C);
    if (dw || db) {
        float *pdw = dw ? tensor_f32(dw) : NULL, *pdb = db ? tensor_f32(db) : NULL;
        int chunks = (C + LAYERNORM_DW_CHUNK - 1) / LAYERNORM_DW_CHUNK;
        #pragma omp parallel for schedule(static)
        for (int ch = 0; ch < chunks; ch++) {
            int c0 = ch * LAYERNORM_DW_CHUNK;
            int c1 = c0 + LAYERNORM_DW_CHUNK < C ? c0 + LAYERNORM_DW_CHUNK : C;
            double sw[LAYERNORM_DW_CHUNK] = {0}, sb[LAYERNORM_DW_CHUNK] = {0};
            for (size_t n = 0; n < N; n++) {
                const float *xr = px + n * C, *dyr = pdy + n * C;
                float m = pmean[n], r = prstd[n];
                for (int c = c0; c < c1; c++) {
                    sw[c - c0] += dyr[c] * ((xr[c] - m) * r);
                    sb[c - c0] += dyr[c];
                }
            }
            for (int c = c0; c < c1; c++) {
                if (pdw) pdw[c] += (float)sw[c - c0];
                if (pdb) pdb[c] += (float)sb[c - c0];
            }
        }
    }
}
