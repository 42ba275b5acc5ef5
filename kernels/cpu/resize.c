// CPU reference: bilinear resize of a channels-last token grid (kernels/ops.h, docs/design.md#curriculum
// resolution curriculum). Exactly PyTorch F.interpolate(mode='bilinear', align_corners=False,
// antialias=False) given an output size, per axis (ATen's compute_source_index_and_lambda):
//   scale = in / out                       (fp32, as ATen computes it for fp32 tensors)
//   src   = max(scale * (dst + 0.5) - 0.5, 0)
//   i0    = min(floor(src), in - 1),  i1 = i0 + (i0 < in - 1 ? 1 : 0)
//   l1    = src - i0,  l0 = 1 - l1
// and y = l0h (l0w x[i0h,i0w] + l1w x[i0h,i1w]) + l1h (l0w x[i1h,i0w] + l1w x[i1h,i1w]).
// It upsamples and downsamples (no antialias: a shrink samples, it does not average), with any
// ratio and H != W.
#include <math.h>
#include "../ops.h"
#include "../resize_shape.h"
#include "cpu_check.h"
#include "../error.h"

// Where output coordinate `dst` reads from along one axis.
typedef struct { int i0, i1; float l0, l1; } ResizeTap;

static ResizeTap *resize_taps(int in, int out) {
    ResizeTap *taps = cg_malloc((size_t)(out > 0 ? out : 1) * sizeof(ResizeTap));
    float scale = (float)in / (float)out;
    for (int dst = 0; dst < out; dst++) {
        ResizeTap t;
        if (in == out) {   // ATen's copy shortcut (the formula gives the same)
            t = (ResizeTap){dst, dst, 1.0f, 0.0f};
        } else {
            float src = scale * ((float)dst + 0.5f) - 0.5f;
            if (src < 0.0f) src = 0.0f;
            int i0 = (int)src;
            if (i0 > in - 1) i0 = in - 1;
            float l1 = fminf(fmaxf(src - (float)i0, 0.0f), 1.0f);
            t = (ResizeTap){i0, i0 + (i0 < in - 1 ? 1 : 0), 1.0f - l1, l1};
        }
        taps[dst] = t;
    }
    return taps;
}

// x (B,H,W,C) -> y (B,H2,W2,C)
void cpu_resize_bilinear_fwd(Ctx *ctx, const Tensor *x, Tensor *y) {
    cpu_check_f32("resize_bilinear_fwd", "x", x);
    cpu_check_f32("resize_bilinear_fwd", "y", y);
    ResizeDims d = resize_dims("resize_bilinear_fwd", x, y);
    ResizeTap *th = resize_taps(d.H, d.H2), *tw = resize_taps(d.W, d.W2);
    const float *px = tensor_f32(x);
    float *py = tensor_f32(y);
    size_t C = (size_t)d.C;
    #pragma omp parallel for collapse(2)
    for (int b = 0; b < d.B; b++)
        for (int oh = 0; oh < d.H2; oh++) {
            ResizeTap h = th[oh];
            const float *row0 = px + ((size_t)b * d.H + h.i0) * d.W * C;
            const float *row1 = px + ((size_t)b * d.H + h.i1) * d.W * C;
            for (int ow = 0; ow < d.W2; ow++) {
                ResizeTap w = tw[ow];
                float *out = py + (((size_t)b * d.H2 + oh) * d.W2 + ow) * C;
                for (size_t c = 0; c < C; c++)
                    out[c] = h.l0 * (w.l0 * row0[w.i0 * C + c] + w.l1 * row0[w.i1 * C + c]) +
                             h.l1 * (w.l0 * row1[w.i0 * C + c] + w.l1 * row1[w.i1 * C + c]);
            }
        }
    free(th);
    free(tw);
}

// dx (B,H,W,C) += resize^T dy (B,H2,W2,C): each output scatters its gradient back to its four
// taps. One thread owns one (batch item, channel block) and walks the outputs in order, so
// every dx element receives its contributions in a fixed order whatever the thread count.
#define RESIZE_BWD_CHANNEL_BLOCK 32

void cpu_resize_bilinear_bwd(Ctx *ctx, const Tensor *dy, Tensor *dx) {
    if (!dx) return;
    cpu_check_f32("resize_bilinear_bwd", "dy", dy);
    cpu_check_f32("resize_bilinear_bwd", "dx", dx);
    ResizeDims d = resize_dims("resize_bilinear_bwd", dx, dy);
    ResizeTap *th = resize_taps(d.H, d.H2), *tw = resize_taps(d.W, d.W2);
    const float *pdy = tensor_f32(dy);
    float *pdx = tensor_f32(dx);
    size_t C = (size_t)d.C;
    int blocks = (d.C + RESIZE_BWD_CHANNEL_BLOCK - 1) / RESIZE_BWD_CHANNEL_BLOCK;
    #pragma omp parallel for collapse(2)
    for (int b = 0; b < d.B; b++)
        for (int blk = 0; blk < blocks; blk++) {
            size_t c0 = (size_t)blk * RESIZE_BWD_CHANNEL_BLOCK;
            size_t c1 = c0 + RESIZE_BWD_CHANNEL_BLOCK < C ? c0 + RESIZE_BWD_CHANNEL_BLOCK : C;
            for (int oh = 0; oh < d.H2; oh++) {
                ResizeTap h = th[oh];
                float *row0 = pdx + ((size_t)b * d.H + h.i0) * d.W * C;
                float *row1 = pdx + ((size_t)b * d.H + h.i1) * d.W * C;
                for (int ow = 0; ow < d.W2; ow++) {
                    ResizeTap w = tw[ow];
                    const float *g = pdy + (((size_t)b * d.H2 + oh) * d.W2 + ow) * C;
                    for (size_t c = c0; c < c1; c++) {
                        row0[w.i0 * C + c] += h.l0 * w.l0 * g[c];
                        row0[w.i1 * C + c] += h.l0 * w.l1 * g[c];
                        row1[w.i0 * C + c] += h.l1 * w.l0 * g[c];
                        row1[w.i1 * C + c] += h.l1 * w.l1 * g[c];
                    }
                }
            }
        }
    free(th);
    free(tw);
}
