// CPU reference: token layout ops — prefix tokens (class token), token slices, mean over tokens
// (kernels/ops.h). A token tensor is (B, N, C): B = shape[0], C = last dim, N = the rest, so a
// (B, H, W, C) grid counts as N = H*W tokens.
#include "../ops.h"
#include "../error.h"

typedef struct { size_t B, N, C; } TokenDims;

static TokenDims token_dims(const Tensor *t) {
    TokenDims d = {(size_t)t->shape[0], 0, (size_t)tensor_last(t)};
    CG_CHECK(t->ndim >= 2, "", "token tensor of rank %d, expected (B, N, C)", t->ndim);
    d.N = d.B > 0 && d.C > 0 ? t->numel / (d.B * d.C) : 0;
    return d;
}

// prefix (P, C), x (B, N, C) -> y (B, P+N, C)
void cpu_concat_prefix_fwd(Ctx *ctx, const Tensor *prefix, const Tensor *x, Tensor *y) {
    TokenDims dx = token_dims(x), dy = token_dims(y);
    size_t P = tensor_rows(prefix), C = dx.C;
    CG_CHECK(dy.B == dx.B && dy.C == C && (size_t)tensor_last(prefix) == C && dy.N == P + dx.N,
             "", "op concat_prefix_fwd: prefix %zu x %d, x %zu x %zu x %zu, y %zu x %zu x %zu",
             P, tensor_last(prefix), dx.B, dx.N, dx.C, dy.B, dy.N, dy.C);
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
    TokenDims d = token_dims(dy);
    size_t C = d.C, P;
    if (dprefix) P = tensor_rows(dprefix);
    else if (dx) P = d.N - token_dims(dx).N;
    else return;
    size_t N = d.N - P;
    CG_CHECK(P <= d.N && (!dx || (token_dims(dx).N == N && dx->numel == d.B * N * C)), "",
             "op concat_prefix_bwd: %zu prefix tokens of %zu", P, d.N);
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
    TokenDims dx = token_dims(x), dy = token_dims(y);
    CG_CHECK(dx.B == dy.B && dx.C == dy.C && start >= 0 && (size_t)start + dy.N <= dx.N, "",
             "op slice_tokens_fwd: tokens %d..%zu of %zu", start, (size_t)start + dy.N, dx.N);
    const float *px = tensor_f32(x);
    float *py = tensor_f32(y);
    size_t row = dy.N * dy.C;
    #pragma omp parallel for
    for (size_t b = 0; b < dy.B; b++)
        memcpy(py + b * row, px + (b * dx.N + (size_t)start) * dx.C, row * sizeof(float));
}

// dx[:, start:start+count] += dy
void cpu_slice_tokens_bwd(Ctx *ctx, const Tensor *dy, int start, Tensor *dx) {
    if (!dx) return;
    TokenDims dd = token_dims(dy), dX = token_dims(dx);
    CG_CHECK(dd.B == dX.B && dd.C == dX.C && start >= 0 && (size_t)start + dd.N <= dX.N, "",
             "op slice_tokens_bwd: tokens %d..%zu of %zu", start, (size_t)start + dd.N, dX.N);
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
    TokenDims d = token_dims(x);
    CG_CHECK(y->numel == d.B * d.C && d.N > 0, "",
             "op mean_tokens_fwd: x %zu x %zu x %zu, y has %zu elements", d.B, d.N, d.C, y->numel);
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
    if (!dx) return;
    TokenDims d = token_dims(dx);
    CG_CHECK(dy->numel == d.B * d.C && d.N > 0, "",
             "op mean_tokens_bwd: dx %zu x %zu x %zu, dy has %zu elements", d.B, d.N, d.C,
             dy->numel);
    const float *pdy = tensor_f32(dy);
    float *pdx = tensor_f32(dx);
    float inv_n = 1.0f / (float)d.N;
    #pragma omp parallel for collapse(3)
    for (size_t b = 0; b < d.B; b++)
        for (size_t n = 0; n < d.N; n++)
            for (size_t c = 0; c < d.C; c++) pdx[(b * d.N + n) * d.C + c] += pdy[b * d.C + c] * inv_n;
}
