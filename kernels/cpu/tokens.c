// CPU reference: token layout ops — prefix tokens (class token), token slices, mean over tokens
// (kernels/ops.h). Shapes and their checks: kernels/tokens_shape.h; this backend's rule: fp32 on
// the host.
#include "../ops.h"
#include "../tokens_shape.h"
#include "cpu_check.h"

// prefix (P, C), x (B, N, C) -> y (B, P+N, C)
void cpu_concat_prefix_fwd(Ctx *ctx, const Tensor *prefix, const Tensor *x, Tensor *y) {
    const char *op = "concat_prefix_fwd";
    cpu_check_f32(op, "prefix", prefix);
    cpu_check_f32(op, "x", x);
    cpu_check_f32(op, "y", y);
    TokenDims dx, dy;
    const size_t P = concat_prefix_dims(op, prefix, x, y, &dx, &dy), C = dx.C;
    const float *pp = tensor_f32(prefix), *px = tensor_f32(x);
    float *py = tensor_f32(y);
    #pragma omp parallel for collapse(2)
    for (size_t b = 0; b < dy.B; b++)
        for (size_t n = 0; n < dy.N; n++) {
            const float *src = n < P ? pp + n * C : px + (b * dx.N + n - P) * C;
            memcpy(py + (b * dy.N + n) * C, src, C * sizeof(float));
        }
}

// dprefix (P, C) += sum over b of dy[b, :P]; dx (B, N, C) += dy[:, P:]
void cpu_concat_prefix_bwd(Ctx *ctx, const Tensor *dy, Tensor *dprefix, Tensor *dx) {
    const char *op = "concat_prefix_bwd";
    if (!dprefix && !dx) return;
    cpu_check_f32(op, "dy", dy);
    if (dprefix) cpu_check_f32(op, "dprefix", dprefix);
    if (dx) cpu_check_f32(op, "dx", dx);
    TokenDims d;
    const size_t P = concat_prefix_bwd_dims(op, dy, dprefix, dx, &d), C = d.C, N = d.N - P;
    const float *pdy = tensor_f32(dy);
    if (dprefix) {
        float *pdp = tensor_f32(dprefix);
        #pragma omp parallel for
        for (size_t i = 0; i < P * C; i++) {   // i = token * C + channel within the prefix
            double s = 0;
            for (size_t b = 0; b < d.B; b++) s += pdy[b * d.N * C + i];
            pdp[i] += (float)s;
        }
    }
    if (dx) {
        float *pdx = tensor_f32(dx);
        #pragma omp parallel for collapse(2)
        for (size_t b = 0; b < d.B; b++)
            for (size_t i = 0; i < N * C; i++) pdx[b * N * C + i] += pdy[(b * d.N + P) * C + i];
    }
}

// x (B, N, C) -> y (B, count, C) = x[:, start:start+count]
void cpu_slice_tokens_fwd(Ctx *ctx, const Tensor *x, int start, Tensor *y) {
    const char *op = "slice_tokens_fwd";
    cpu_check_f32(op, "x", x);
    cpu_check_f32(op, "y", y);
    TokenDims dx, dy;
    slice_tokens_dims(op, "x", x, "y", y, start, &dx, &dy);
    const float *px = tensor_f32(x);
    float *py = tensor_f32(y);
    size_t row = dy.N * dy.C;
    #pragma omp parallel for
    for (size_t b = 0; b < dy.B; b++)
        memcpy(py + b * row, px + (b * dx.N + (size_t)start) * dx.C, row * sizeof(float));
}

// dx[:, start:start+count] += dy
void cpu_slice_tokens_bwd(Ctx *ctx, const Tensor *dy, int start, Tensor *dx) {
    const char *op = "slice_tokens_bwd";
    if (!dx) return;
    cpu_check_f32(op, "dy", dy);
    cpu_check_f32(op, "dx", dx);
    TokenDims dX, dd;
    slice_tokens_dims(op, "dx", dx, "dy", dy, start, &dX, &dd);
    const float *pdy = tensor_f32(dy);
    float *pdx = tensor_f32(dx);
    size_t row = dd.N * dd.C;
    #pragma omp parallel for collapse(2)
    for (size_t b = 0; b < dd.B; b++)
        for (size_t i = 0; i < row; i++)
            pdx[(b * dX.N + (size_t)start) * dX.C + i] += pdy[b * row + i];
}

// x (B, N, C) -> y (B, C) = mean over the N tokens (summed in order, in double)
void cpu_mean_tokens_fwd(Ctx *ctx, const Tensor *x, Tensor *y) {
    const char *op = "mean_tokens_fwd";
    cpu_check_f32(op, "x", x);
    cpu_check_f32(op, "y", y);
    TokenDims d = mean_tokens_dims(op, "x", x, "y", y);
    const float *px = tensor_f32(x);
    float *py = tensor_f32(y);
    #pragma omp parallel for collapse(2)
    for (size_t b = 0; b < d.B; b++)
        for (size_t c = 0; c < d.C; c++) {
            double s = 0;
            for (size_t n = 0; n < d.N; n++) s += px[(b * d.N + n) * d.C + c];
            py[b * d.C + c] = (float)(s / (double)d.N);
        }
}

// dx[b, n, c] += dy[b, c] / N
void cpu_mean_tokens_bwd(Ctx *ctx, const Tensor *dy, Tensor *dx) {
    const char *op = "mean_tokens_bwd";
    if (!dx) return;
    cpu_check_f32(op, "dy", dy);
    cpu_check_f32(op, "dx", dx);
    TokenDims d = mean_tokens_dims(op, "dx", dx, "dy", dy);
    const float *pdy = tensor_f32(dy);
    float *pdx = tensor_f32(dx);
    float inv_n = 1.0f / (float)d.N;
    #pragma omp parallel for collapse(3)
    for (size_t b = 0; b < d.B; b++)
        for (size_t n = 0; n < d.N; n++)
            for (size_t c = 0; c < d.C; c++) pdx[(b * d.N + n) * d.C + c] += pdy[b * d.C + c] * inv_n;
}
