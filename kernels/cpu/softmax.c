// CPU reference: softmax over the last dim (kernels/ops.h). x (N,C) is any tensor with last
// dim C. Stable: exp(x - max) never overflows, and the row sum is at least 1.
#include "../ops.h"
#include "cpu_check.h"
#include <math.h>

// y = exp(x - max) / sum exp(x - max), per row.
void cpu_softmax_fwd(Ctx *ctx, const Tensor *x, Tensor *y) {
    cpu_check_f32("softmax_fwd", "x", x);
    cpu_check_same("softmax_fwd", "y", y, "x", x);
    int C = tensor_last(x);
    size_t N = tensor_rows(x);
    const float *px = tensor_f32(x);
    float *py = tensor_f32(y);
    #pragma omp parallel for schedule(static)
    for (size_t n = 0; n < N; n++) {
        const float *xr = px + n * C;
        float *yr = py + n * C;
        float mx = -INFINITY;
        for (int c = 0; c < C; c++) mx = xr[c] > mx ? xr[c] : mx;
        double sum = 0;
        for (int c = 0; c < C; c++) {
            yr[c] = expf(xr[c] - mx);
            sum += yr[c];
        }
        float inv = (float)(1.0 / sum);
        for (int c = 0; c < C; c++) yr[c] *= inv;
    }
}

// From the saved output y: dx += y * (dy - sum_c dy * y), per row.
void cpu_softmax_bwd(Ctx *ctx, const Tensor *dy, const Tensor *y, Tensor *dx) {
    if (!dx) return;
    cpu_check_f32("softmax_bwd", "y", y);
    cpu_check_same("softmax_bwd", "dy", dy, "y", y);
    cpu_check_same("softmax_bwd", "dx", dx, "y", y);
    int C = tensor_last(y);
    size_t N = tensor_rows(y);
    const float *pdy = tensor_f32(dy), *py = tensor_f32(y);
    float *pdx = tensor_f32(dx);
    #pragma omp parallel for schedule(static)
    for (size_t n = 0; n < N; n++) {
        const float *dyr = pdy + n * C, *yr = py + n * C;
        double dot = 0;
        for (int c = 0; c < C; c++) dot += (double)dyr[c] * yr[c];
        float *dxr = pdx + n * C;
        for (int c = 0; c < C; c++) dxr[c] += yr[c] * (dyr[c] - (float)dot);
    }
}
