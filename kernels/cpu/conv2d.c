// CPU reference: conv2d (kernels/ops_list.h, geometry in kernels/conv2d_shape.h) as im2col and the
// linear op. The column matrix keeps PyTorch's weight order, column c k^2 + ky k + kx, so the
// weight (Cout, C, k, k) is the GEMM's (Cout, C k^2) as it is. Backward: dcols = dy w, then every
// input element gathers the columns of the output pixels whose window holds it, taps in (ky, kx)
// order, so each element is written by one thread in a fixed order.
#include "../ops.h"
#include "../conv2d_shape.h"
#include "cpu_check.h"
#include <stdlib.h>
#include <string.h>

static void im2col(const Conv2dShape *g, const float *X, float *Y) {
    const int k = g->k;
    #pragma omp parallel for schedule(static)
    for (long long r = 0; r < (long long)g->rows; r++) {
        int wo = (int)(r % g->Wo), ho = (int)((r / g->Wo) % g->Ho), b = (int)(r / ((long long)g->Wo * g->Ho));
        float *row = Y + (size_t)r * g->cols;
        for (int c = 0; c < g->C; c++)
            for (int ky = 0; ky < k; ky++)
                for (int kx = 0; kx < k; kx++) {
                    int h = ho * g->s + ky - g->p, w = wo * g->s + kx - g->p;
                    row[((size_t)c * k + ky) * k + kx] =
                        h < 0 || h >= g->H || w < 0 || w >= g->W
                            ? 0.0f : X[b * g->sb + c * g->sc + h * g->sh + w * g->sw];
                }
    }
}

// dx (+)= the adjoint of im2col applied to dcols.
static void col2im(const Conv2dShape *g, const float *D, float *X, size_t numel, bool write) {
    const int k = g->k;
    #pragma omp parallel for schedule(static)
    for (long long i = 0; i < (long long)numel; i++) {
        long long b = i / g->sb, rem = i % g->sb;
        int c = (int)(rem / g->sc % g->C), h = (int)(rem / g->sh % g->H), w = (int)(rem / g->sw % g->W);
        float acc = 0.0f;
        for (int ky = 0; ky < k; ky++) {
            int hs = h + g->p - ky;
            if (hs < 0 || hs % g->s) continue;
            int ho = hs / g->s;
            if (ho >= g->Ho) continue;
            for (int kx = 0; kx < k; kx++) {
                int ws = w + g->p - kx;
                if (ws < 0 || ws % g->s) continue;
                int wo = ws / g->s;
                if (wo >= g->Wo) continue;
                acc += D[(((size_t)b * g->Ho + ho) * g->Wo + wo) * g->cols + ((size_t)c * k + ky) * k + kx];
            }
        }
        X[i] = write ? acc : X[i] + acc;
    }
}

// A host fp32 matrix (rows, cols) over data.
static Tensor host_matrix(float *data, size_t rows, size_t cols) {
    Tensor t = {0};
    tensor_set_shape(&t, 2, (int[]){(int)rows, (int)cols});
    t.dtype = DTYPE_F32;
    t.device = DEVICE_CPU;
    t.data = data;
    return t;
}

static float *host_alloc(size_t n) {
    float *p = calloc(n ? n : 1, sizeof(float));
    CG_CHECK(p != NULL, "", "conv2d: out of host memory for %zu floats", n);
    return p;
}

void cpu_conv2d_fwd(Ctx *ctx, const Tensor *x, const Tensor *w, const Tensor *b, int nchw,
                    int stride, int pad, const Conv2dFwdOpts *opts, Tensor *cols, Tensor *y) {
    const char *op = "conv2d_fwd";
    conv2d_check_opts(op, opts, cols);
    cpu_check_f32(op, "x", x);
    cpu_check_f32(op, "w", w);
    cpu_check_f32(op, "y", y);
    Conv2dShape g = conv2d_shape(op, "x", x, w, nchw, stride, pad);
    conv2d_check_out(op, "y", &g, y, true);
    if (b) {
        cpu_check_f32(op, "b", b);
        conv2d_check_bias(op, &g, b);
    }
    if (cols) {
        cpu_check_f32(op, "cols", cols);
        conv2d_check_cols(op, &g, cols);
    }
    float *C = cols ? tensor_f32(cols) : host_alloc(g.rows * g.cols);
    im2col(&g, tensor_f32(x), C);
    Tensor cm = host_matrix(C, g.rows, g.cols), wm = tensor_view(w, 2, (int[]){g.Cout, (int)g.cols});
    Tensor ym = tensor_view(y, 2, (int[]){(int)g.rows, g.Cout});
    cpu_linear_fwd(ctx, &cm, &wm, b, NULL, &ym);
    if (!cols) free(C);
    if (opts && opts->ln) {   // the norm into a buffer, then the GELU (or a copy) back into y
        Tensor z = *y;
        z.data = host_alloc(y->numel);
        z.grad = NULL;
        cpu_layernorm_fwd(ctx, y, NULL, opts->ln_w, opts->ln_b, opts->ln_eps, NULL, &z, NULL, NULL);
        if (opts->gelu_out) cpu_gelu_fwd(ctx, &z, opts->gelu_kind, y);
        else memcpy(y->data, z.data, y->numel * sizeof(float));
        free(z.data);
    }
}

void cpu_conv2d_bwd(Ctx *ctx, const Tensor *dy, const Tensor *cols, const Tensor *w, int nchw,
                    int stride, int pad, int flags, Tensor *dx, Tensor *dw, Tensor *db) {
    const char *op = "conv2d_bwd";
    cpu_check_f32(op, "dy", dy);
    cpu_check_f32(op, "cols", cols);
    cpu_check_f32(op, "w", w);
    Conv2dShape g = dx ? conv2d_shape(op, "dx", dx, w, nchw, stride, pad) : conv2d_weight_shape(op, w);
    conv2d_check_out(op, "dy", &g, dy, dx != NULL);
    conv2d_check_cols(op, &g, cols);
    if (dx) cpu_check_f32(op, "dx", dx);
    if (dw) cpu_check_numel(op, "dw", dw, (size_t)g.Cout * g.cols);
    if (db) {
        cpu_check_f32(op, "db", db);
        conv2d_check_bias(op, &g, db);
    }
    Tensor wm = tensor_view(w, 2, (int[]){g.Cout, (int)g.cols});
    Tensor dym = tensor_view(dy, 2, (int[]){(int)g.rows, g.Cout});
    Tensor cm = tensor_view(cols, 2, (int[]){(int)g.rows, (int)g.cols});
    Tensor dwm;
    if (dw) dwm = tensor_view(dw, 2, (int[]){g.Cout, (int)g.cols});
    if (dx) {   // dcols = dy w, then its adjoint into dx
        float *D = host_alloc(g.rows * g.cols);
        Tensor dc = host_matrix(D, g.rows, g.cols);
        cpu_linear_bwd(ctx, &dym, &cm, &wm, 0, NULL, &dc, dw ? &dwm : NULL, db);
        col2im(&g, D, tensor_f32(dx), dx->numel, flags & CONV2D_WRITE_DX);
        free(D);
    } else if (dw || db) {
        cpu_linear_bwd(ctx, &dym, &cm, &wm, 0, NULL, NULL, dw ? &dwm : NULL, db);
    }
}
