// CPU reference: depthwise convolution, channels-last, stride 1, zero padding k/2 (kernels/ops.h).
//   y[b,h,w,c] = b[c] + sum_{i,j} w[c,i,j] x[b, h+i-p, w+j-p, c],  p = k/2
// Backward: dx[b,h,w,c] = sum_{i,j} w[c,i,j] dy[b, h-i+p, w-j+p, c] (the taps mirrored);
// dw[c,i,j] = sum over pixels of dy[b,h,w,c] x[b, h+i-p, w+j-p, c]; db[c] = sum of dy[.., c].
// Rows (b, h) go to threads for y and dx; dw and db go by channel, every channel summing its
// pixels in one fixed order, so the result does not depend on the thread count.
#include "../ops.h"
#include "cpu_check.h"
#include "../dwconv_shape.h"
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

// The shape and its checks: kernels/dwconv_shape.h (both backends); the CPU also wants fp32.
static DwconvShape dw_shape(const char *op, const Tensor *x, const Tensor *w) {
    cpu_check_f32(op, "x", x);
    cpu_check_f32(op, "w", w);
    return dwconv_shape(op, x, w);
}

// out[b,h,w,c] += sum_{i,j} w[c,i,j] in[b, h + d(i), w + d(j), c], d(i) = i - p, or p - i when
// mirror (the backward's taps): y = b + taps(x), dx += mirrored taps(dy).
static void add_taps(const DwconvShape *s, const float *in, const float *Wt, bool mirror, float *out) {
    int kk = s->k * s->k;
    #pragma omp parallel for schedule(static)
    for (int bh = 0; bh < s->B * s->H; bh++) {
        int bi = bh / s->H, h = bh % s->H;
        for (int wx = 0; wx < s->W; wx++) {
            float *o = out + ((size_t)bh * s->W + wx) * s->C;
            for (int i = 0; i < s->k; i++) {
                int hh = mirror ? h - i + s->p : h + i - s->p;
                if (hh < 0 || hh >= s->H) continue;
                for (int j = 0; j < s->k; j++) {
                    int ww = mirror ? wx - j + s->p : wx + j - s->p;
                    if (ww < 0 || ww >= s->W) continue;
                    const float *v = in + (((size_t)bi * s->H + hh) * s->W + ww) * s->C;
                    for (int c = 0; c < s->C; c++) o[c] += Wt[(size_t)c * kk + i * s->k + j] * v[c];
                }
            }
        }
    }
}

void cpu_dwconv_fwd(Ctx *ctx, const Tensor *x, const Tensor *u, const Tensor *uw, const Tensor *ub,
                    const Tensor *w, const Tensor *b, int flags, Tensor *mid, Tensor *y) {
    DwconvShape s = dw_shape("dwconv_fwd", x, w);
    dwconv_check_flags("dwconv_fwd", flags, true);
    cpu_check_same("dwconv_fwd", "y", y, "x", x);
    CG_CHECK(y->data != x->data, "", "op dwconv_fwd: y is x (the taps read neighbours of what they write)");
    if (b) cpu_check_numel("dwconv_fwd", "b", b, (size_t)s.C);
    // The added input: x' = x + u uw^T + ub as linear_fwd onto res = x makes it, into mid or a
    // buffer of its own; the convolution then reads x'.
    Tensor added = *x;
    if (u) {
        dwconv_added_input("dwconv_fwd", &s, x, u, uw, ub, w, mid, y);
        added.data = mid ? mid->data : cg_malloc(x->numel * sizeof(float));
        cpu_linear_fwd(ctx, u, uw, ub, &(LinearFwdOpts){.res = x}, &added);
        x = &added;
    }
    float *Y = tensor_f32(y);
    const float *X = tensor_f32(x);
    for (size_t px = 0; px < y->numel / (size_t)s.C; px++)
        for (int c = 0; c < s.C; c++)
            Y[px * s.C + c] = (b ? tensor_f32(b)[c] : 0.0f) +
                              (flags & DWCONV_RESIDUAL ? X[px * s.C + c] : 0.0f);
    add_taps(&s, X, tensor_f32(w), false, Y);
    if (flags & DWCONV_SILU) cpu_silu_fwd(ctx, y, y);   // the activation's own formula, in place
    if (u && !mid) free(added.data);
}

// The two ops through a buffer of x's shape: the reference the fused backends are held to.
void cpu_dwconv_silu_proj_fwd(Ctx *ctx, const Tensor *x, const Tensor *w, const Tensor *b,
                              const Tensor *pw, const Tensor *pb, Tensor *y) {
    const char *op = "dwconv_silu_proj_fwd";
    DwconvShape s = dw_shape(op, x, w);
    dwconv_proj_check(op, &s, x, w, pw, pb, y);
    Tensor v = *x;   // silu(dwconv(x)) (B,H,W,C)
    v.data = cg_malloc(x->numel * sizeof(float));
    v.grad = NULL;
    cpu_dwconv_fwd(ctx, x, NULL, NULL, NULL, w, b, DWCONV_SILU, NULL, &v);
    cpu_linear_fwd(ctx, &v, pw, pb, NULL, y);
    free(v.data);
}

// The two ops: the reference the fused backends are held to.
void cpu_dwconv_layernorm_fwd(Ctx *ctx, const Tensor *x, const Tensor *w, const Tensor *b,
                              const Tensor *ln_w, const Tensor *ln_b, float eps, Tensor *h, Tensor *y) {
    dwconv_layernorm_check("dwconv_layernorm_fwd", x, w, b, ln_w, ln_b, eps, h, y);
    cpu_dwconv_fwd(ctx, x, NULL, NULL, NULL, w, b, DWCONV_RESIDUAL, NULL, h);
    cpu_layernorm_fwd(ctx, h, NULL, ln_w, ln_b, eps, NULL, y, NULL, NULL);
}

void cpu_dwconv_bwd(Ctx *ctx, const Tensor *dy, const Tensor *x, const Tensor *w, int flags,
                    Tensor *dx, Tensor *dw, Tensor *db) {
    (void)ctx;
    DwconvShape s = dw_shape("dwconv_bwd", x, w);
    dwconv_check_flags("dwconv_bwd", flags, false);
    cpu_check_same("dwconv_bwd", "dy", dy, "x", x);
    const float *DY = tensor_f32(dy), *X = tensor_f32(x);
    int kk = s.k * s.k;
    if (dx) {
        cpu_check_same("dwconv_bwd", "dx", dx, "x", x);
        CG_CHECK(dx->data != dy->data, "", "op dwconv_bwd: dx is dy (the taps read neighbours of what they write)");
        float *DX = tensor_f32(dx);
        if (flags & DWCONV_WRITE_DX) memset(DX, 0, dx->numel * sizeof(float));
        if (flags & DWCONV_RESIDUAL)
            for (size_t i = 0; i < dx->numel; i++) DX[i] += DY[i];
        add_taps(&s, DY, tensor_f32(w), true, DX);
    }
    if (dw) cpu_check_f32("dwconv_bwd", "dw", dw), cpu_check_numel("dwconv_bwd", "dw", dw, (size_t)s.C * kk);
    if (db) cpu_check_f32("dwconv_bwd", "db", db), cpu_check_numel("dwconv_bwd", "db", db, (size_t)s.C);
    if (!dw && !db) return;
    #pragma omp parallel for schedule(static)
    for (int c = 0; c < s.C; c++) {
        double gb = 0, gw[DWCONV_MAX_K * DWCONV_MAX_K] = {0};
        for (int bi = 0; bi < s.B; bi++)
            for (int h = 0; h < s.H; h++)
                for (int wx = 0; wx < s.W; wx++) {
                    float g = DY[(((size_t)bi * s.H + h) * s.W + wx) * s.C + c];
                    gb += g;
                    for (int i = 0; i < s.k; i++) {
                        int hh = h + i - s.p;
                        if (hh < 0 || hh >= s.H) continue;
                        for (int j = 0; j < s.k; j++) {
                            int ww = wx + j - s.p;
                            if (ww < 0 || ww >= s.W) continue;
                            gw[i * s.k + j] += (double)g * X[(((size_t)bi * s.H + hh) * s.W + ww) * s.C + c];
                        }
                    }
                }
        if (dw)
            for (int t = 0; t < kk; t++) tensor_f32(dw)[(size_t)c * kk + t] += (float)gw[t];
        if (db) tensor_f32(db)[c] += (float)gb;
    }
}
