// CPU reference: LayerNorm over the last dim (kernels/ops.h), PyTorch semantics (biased
// variance, eps inside the square root). x (N,C) is any tensor with last dim C.
#include "../ops.h"
#include "../layernorm_shape.h"
#include "cpu_check.h"
#include <math.h>

// Columns per weight/bias-gradient chunk: one thread sums a chunk over all rows in order (in
// double), so dw and db do not depend on the thread count.
enum { LAYERNORM_DW_CHUNK = 16 };

// y = (x - mean) * rstd * w + b, rstd = 1 / sqrt(var + eps). mean, rstd (N) are saved for
// backward (either may be NULL when no backward follows). w or b NULL means 1 or 0.
static void layernorm_rows(const Tensor *x, const Tensor *w, const Tensor *b, float eps, Tensor *y,
                           Tensor *mean, Tensor *rstd) {
    const char *op = "layernorm_fwd";
    const LayerNormDims d = layernorm_fwd_dims(op, x, NULL, w, b, eps, NULL, y, mean, rstd);
    const int C = d.C;
    const size_t N = d.N;
    cpu_check_f32(op, "x", x);
    cpu_check_f32(op, "y", y);
    if (w) cpu_check_f32(op, "w", w);
    if (b) cpu_check_f32(op, "b", b);
    if (mean) cpu_check_f32(op, "mean", mean);
    if (rstd) cpu_check_f32(op, "rstd", rstd);

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

// With r: h = x + r (add_fwd's numbers), then the rows of h.
void cpu_layernorm_fwd(Ctx *ctx, const Tensor *x, const Tensor *r, const Tensor *w,
                       const Tensor *b, float eps, Tensor *h, Tensor *y, Tensor *mean,
                       Tensor *rstd) {
    if (r || h) {
        const char *op = "layernorm_fwd";
        layernorm_fwd_dims(op, x, r, w, b, eps, h, y, mean, rstd);
        cpu_check_f32(op, "x", x);
        cpu_check_f32(op, "r", r);
        cpu_check_f32(op, "h", h);
        cpu_add_fwd(ctx, x, r, h);
        x = h;
    }
    layernorm_rows(x, w, b, eps, y, mean, rstd);
}

// With xhat = (x - mean) * rstd and g = dy * w:
//   dx += rstd * (g - mean_c(g) - xhat * mean_c(g * xhat));  dw += sum_n dy * xhat;  db += sum_n dy
void cpu_layernorm_bwd(Ctx *ctx, const Tensor *dy, const Tensor *x, const Tensor *w,
                       const Tensor *mean, const Tensor *rstd, Tensor *dx, Tensor *dw, Tensor *db,
                       Tensor *dx_act, Tensor *dx_sum) {
    const char *op = "layernorm_bwd";
    const LayerNormDims d = layernorm_bwd_dims(op, dy, x, w, mean, rstd, dx, dw, db, dx_act, dx_sum);
    const int C = d.C;
    const size_t N = d.N;
    const Tensor *args[] = {dy, x, w, mean, rstd, dx, dw, db, dx_act, dx_sum};
    static const char *const names[] = {"dy", "x", "w", "mean", "rstd", "dx", "dw", "db", "dx_act",
                                        "dx_sum"};
    for (int i = 0; i < (int)(sizeof args / sizeof args[0]); i++)
        if (args[i]) cpu_check_f32(op, names[i], args[i]);   // the CPU computes in fp32
    const float *pdy = tensor_f32(dy), *px = tensor_f32(x), *pw = w ? tensor_f32(w) : NULL;
    const float *pmean = tensor_f32(mean), *prstd = tensor_f32(rstd);

    if (dx) {
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
        if (dx_sum) cpu_add_bcast_bwd(ctx, dx, NULL, dx_sum);
    }
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
