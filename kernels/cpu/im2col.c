// CPU reference: im2col and its adjoint (kernels/ops.h, geometry in kernels/im2col_shape.h).
// Backward gathers: input (b, h, w, c) sums the columns of the output pixels whose window holds
// it, taps in (ky, kx) order, so each element is written by one thread in a fixed order.
#include "../ops.h"
#include "../im2col_shape.h"
#include "cpu_check.h"

void cpu_im2col_fwd(Ctx *ctx, const Tensor *x, int nchw, int k, int stride, int pad, Tensor *cols) {
    (void)ctx;
    cpu_check_f32("im2col_fwd", "x", x);
    cpu_check_f32("im2col_fwd", "cols", cols);
    Im2colShape g = im2col_shape("im2col_fwd", x, nchw, k, stride, pad, cols);
    const float *X = tensor_f32(x);
    float *Y = tensor_f32(cols);
    #pragma omp parallel for schedule(static)
    for (long long r = 0; r < (long long)g.rows; r++) {
        int wo = (int)(r % g.Wo), ho = (int)((r / g.Wo) % g.Ho), b = (int)(r / ((long long)g.Wo * g.Ho));
        float *row = Y + (size_t)r * g.cols;
        for (int c = 0; c < g.C; c++)
            for (int ky = 0; ky < k; ky++)
                for (int kx = 0; kx < k; kx++) {
                    int h = ho * stride + ky - pad, w = wo * stride + kx - pad;
                    row[((size_t)c * k + ky) * k + kx] =
                        h < 0 || h >= g.H || w < 0 || w >= g.W
                            ? 0.0f : X[b * g.sb + c * g.sc + h * g.sh + w * g.sw];
                }
    }
}

void cpu_im2col_bwd(Ctx *ctx, const Tensor *dcols, int nchw, int k, int stride, int pad, Tensor *dx) {
    (void)ctx;
    cpu_check_f32("im2col_bwd", "dcols", dcols);
    cpu_check_f32("im2col_bwd", "dx", dx);
    Im2colShape g = im2col_shape("im2col_bwd", dx, nchw, k, stride, pad, dcols);
    const float *D = tensor_f32(dcols);
    float *X = tensor_f32(dx);
    #pragma omp parallel for schedule(static)
    for (long long i = 0; i < (long long)dx->numel; i++) {
        long long b = i / g.sb, rem = i % g.sb;
        int c = (int)(rem / g.sc % g.C), h = (int)(rem / g.sh % g.H), w = (int)(rem / g.sw % g.W);
        float acc = 0.0f;
        for (int ky = 0; ky < k; ky++) {
            int hs = h + pad - ky;
            if (hs < 0 || hs % stride) continue;
            int ho = hs / stride;
            if (ho >= g.Ho) continue;
            for (int kx = 0; kx < k; kx++) {
                int ws = w + pad - kx;
                if (ws < 0 || ws % stride) continue;
                int wo = ws / stride;
                if (wo >= g.Wo) continue;
                acc += D[(((size_t)b * g.Ho + ho) * g.Wo + wo) * g.cols + ((size_t)c * k + ky) * k + kx];
            }
        }
        X[i] += acc;
    }
}
