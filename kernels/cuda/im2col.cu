// CUDA: im2col and its adjoint (kernels/ops_list.h; geometry kernels/im2col_shape.h; CPU
// reference kernels/cpu/im2col.c). Forward, channels-last input: one thread per (output pixel,
// channel) writes that channel's k*k columns, so a warp reads 32 neighbouring channels of each
// tap (a column's taps are c*k*k + ky*k + kx: neighbouring columns lie C apart in x); NCHW
// input (the stem's image): one thread per column-matrix element. Backward: one thread per input
// element (a gather over the taps in (ky, kx) order: no atomics, the CPU's order).
#include "cuda_elem.cuh"
#include "../im2col_shape.h"

template <typename T> struct Im2colOp {
    const T *x;
    T *cols;
    Im2colShape g;
    template <int V> __device__ void apply(size_t i) const {
        size_t r = i / g.cols, col = i % g.cols;
        int kx = (int)(col % g.k), ky = (int)(col / g.k % g.k), c = (int)(col / ((size_t)g.k * g.k));
        int wo = (int)(r % g.Wo), ho = (int)(r / g.Wo % g.Ho);
        long long b = (long long)(r / ((size_t)g.Wo * g.Ho));
        int h = ho * g.s + ky - g.p, w = wo * g.s + kx - g.p;
        float v = 0.0f;
        if (h >= 0 && h < g.H && w >= 0 && w < g.W) load_v<1>(x + b * g.sb + c * g.sc + h * g.sh + w * g.sw, &v);
        store_v<1>(cols + i, &v);
    }
};

// Channels-last: item i = (row r, channel c), r = (b, ho, wo).
template <typename T> struct Im2colNhwcOp {
    const T *x;
    T *cols;
    Im2colShape g;
    template <int V> __device__ void apply(size_t i) const {
        size_t r = i / (size_t)g.C;
        int c = (int)(i - r * (size_t)g.C);
        int wo = (int)(r % (size_t)g.Wo);
        size_t bh = r / (size_t)g.Wo;
        int ho = (int)(bh % (size_t)g.Ho);
        long long b = (long long)(bh / (size_t)g.Ho);
        const T *xb = x + b * g.sb + c;
        T *out = cols + r * g.cols + (size_t)c * g.k * g.k;
        for (int ky = 0; ky < g.k; ky++) {
            int h = ho * g.s + ky - g.p;
            for (int kx = 0; kx < g.k; kx++) {
                int w = wo * g.s + kx - g.p;
                float v = 0.0f;
                if (h >= 0 && h < g.H && w >= 0 && w < g.W) load_v<1>(xb + h * g.sh + w * g.sw, &v);
                store_v<1>(out + ky * g.k + kx, &v);
            }
        }
    }
};

template <typename T> struct Col2imOp {
    const T *dcols;
    T *dx;
    Im2colShape g;
    template <int V> __device__ void apply(size_t i) const {
        long long b = (long long)i / g.sb, rem = (long long)i % g.sb;
        int c = (int)(rem / g.sc % g.C), h = (int)(rem / g.sh % g.H), w = (int)(rem / g.sw % g.W);
        float acc = 0.0f;
        for (int ky = 0; ky < g.k; ky++) {
            int hs = h + g.p - ky;
            if (hs < 0 || hs % g.s) continue;
            int ho = hs / g.s;
            if (ho >= g.Ho) continue;
            for (int kx = 0; kx < g.k; kx++) {
                int ws = w + g.p - kx;
                if (ws < 0 || ws % g.s) continue;
                int wo = ws / g.s;
                if (wo >= g.Wo) continue;
                float v;
                load_v<1>(dcols + (((size_t)b * g.Ho + ho) * g.Wo + wo) * g.cols +
                              ((size_t)c * g.k + ky) * g.k + kx, &v);
                acc += v;
            }
        }
        float prev;
        load_v<1>(dx + i, &prev);
        prev += acc;
        store_v<1>(dx + i, &prev);
    }
};

void cuda_im2col_fwd(Ctx *ctx, const Tensor *x, int nchw, int k, int stride, int pad, Tensor *cols) {
    const char *op = "im2col_fwd";
    cuda_check_tensor(op, "x", x);
    cuda_check_tensor(op, "cols", cols);
    cuda_check_same_dtype(op, "cols", cols, "x", x);
    Im2colShape g = im2col_shape(op, x, nchw, k, stride, pad, cols);
    dispatch_dtype(x->dtype, [&](auto tag) {
        using T = TAG_T(tag);
        if (nchw)
            launch_map(ctx, cols->numel, false, Im2colOp<T>{(const T *)x->data, (T *)cols->data, g});
        else
            launch_map(ctx, g.rows * (size_t)g.C, false,
                       Im2colNhwcOp<T>{(const T *)x->data, (T *)cols->data, g});
    });
}

void cuda_im2col_bwd(Ctx *ctx, const Tensor *dcols, int nchw, int k, int stride, int pad, Tensor *dx) {
    const char *op = "im2col_bwd";
    cuda_check_tensor(op, "dcols", dcols);
    cuda_check_tensor(op, "dx", dx);
    cuda_check_same_dtype(op, "dcols", dcols, "dx", dx);
    Im2colShape g = im2col_shape(op, dx, nchw, k, stride, pad, dcols);
    dispatch_dtype(dx->dtype, [&](auto tag) {
        using T = TAG_T(tag);
        launch_map(ctx, dx->numel, false, Col2imOp<T>{(const T *)dcols->data, (T *)dx->data, g});
    });
}
