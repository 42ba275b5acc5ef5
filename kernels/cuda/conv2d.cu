// CUDA conv2d (kernels/ops_list.h; geometry kernels/conv2d_shape.h; CPU reference
// kernels/cpu/conv2d.c) as im2col and the linear op's cuBLASLt GEMMs; the stem on a few-channel
// image (its forward, and dw and db) runs without the GEMMs (conv2d_stem.cu), and so does gspn_t's
// second stem convolution where no columns are kept (conv2d_rows.cu). The column matrix
// is this file's alone, so its order is chosen for the copies:
//   NCHW input (the stem's image): PyTorch's order, column c k^2 + ky k + kx; the GEMM takes the
//   weight (Cout, C k^2) as stored. A warp per row, lanes along the row.
//   Channels-last input: column (ky k + kx) C + c, so a window is k^2 runs of C contiguous
//   channels in both x and cols: im2col is a straight copy and col2im gathers contiguous runs (no
//   pass through shared memory, no reordered copy of dcols). The GEMM takes the weight as
//   (Cout, k, k, C): a copy permuted per call (gspn_t's largest, 768 x 3456, is 5 MB in bf16),
//   and dw comes back in that order into a temporary that is added to dw permuted back.
// x may be fp32 where w is bf16 (the fp32 stream into a downsampling): im2col rounds it into
// cols, and dx is then fp32, its taps summed in fp32 from dcols (no cast pass either way).
// Backward: dcols = dy w written by the GEMM (beta 0) into a temporary, then a thread per (input
// pixel, V channels) gathers its taps in (ky, kx) order: no atomics, the CPU's order.
#include "cuda_gemm.h"
#include "conv2d_stem.h"
#include "conv2d_rows.h"
#include "conv2d_taps.h"
#include "../ops.h"
#include "../conv2d_shape.h"
#include "../layernorm_shape.h"
#include <limits.h>

enum { CONV_THREADS = 256, CONV_WARPS = CONV_THREADS / 32 };

// Row r's output pixel (b, ho, wo), or an input pixel (b, h, w) with (Ho, Wo) -> (H, W).
__device__ __forceinline__ void conv_split(size_t r, int Hn, int Wn, size_t &b, int &h, int &w) {
    w = (int)(r % (size_t)Wn);
    size_t bh = r / (size_t)Wn;
    h = (int)(bh % (size_t)Hn);
    b = bh / (size_t)Hn;
}

// The taps of input pixel (h, w): tap (ky, kx) reads it from output pixel ((h + p - ky) / s,
// (w + p - kx) / s) when both divide evenly and land in the grid. Along one axis those are
// ky = ky0 + a s with output row o0 - a (a = 0, 1, ...): found once per pixel, no division per tap.
struct ConvTaps {
    int ky0, ho0, kx0, wo0;
};

__device__ __forceinline__ ConvTaps conv_taps(const Conv2dShape &g, int h, int w) {
    ConvTaps t;
    t.ky0 = (h + g.p) % g.s;
    t.ho0 = (h + g.p) / g.s;
    t.kx0 = (w + g.p) % g.s;
    t.wo0 = (w + g.p) / g.s;
    return t;
}

// Sum of f(ky, kx, ho, wo) (V values into acc) over the pixel's taps, in (ky, kx) order.
template <int V, typename F>
__device__ __forceinline__ void conv_sum_taps(const Conv2dShape &g, const ConvTaps &t, float *acc, F &&f) {
    #pragma unroll
    for (int j = 0; j < V; j++) acc[j] = 0.0f;
    for (int ky = t.ky0, ho = t.ho0; ky < g.k && ho >= 0; ky += g.s, ho--) {
        if (ho >= g.Ho) continue;
        for (int kx = t.kx0, wo = t.wo0; kx < g.k && wo >= 0; kx += g.s, wo--) {
            if (wo >= g.Wo) continue;
            float v[V];
            f(ky, kx, ho, wo, v);
            #pragma unroll
            for (int j = 0; j < V; j++) acc[j] += v[j];
        }
    }
}

// dst[0..V) = acc (write) or dst + acc, rounded once.
template <int V, typename T>
__device__ __forceinline__ void conv_put(T *dst, const float *acc, bool write) {
    float v[V];
    if (write) {
        #pragma unroll
        for (int j = 0; j < V; j++) v[j] = acc[j];
    } else {
        load_v<V>(dst, v);
        #pragma unroll
        for (int j = 0; j < V; j++) v[j] += acc[j];
    }
    store_v<V>(dst, v);
}

// ---- NCHW ---------------------------------------------------------------------------------------

// cols[r, c k^2 + ky k + kx] = x[b, c, ho s + ky - p, wo s + kx - p]: a warp per row r.
template <typename TX, typename TC>
__global__ void im2col_nchw_kernel(const TX *__restrict__ x, TC *__restrict__ cols, Conv2dShape g) {
    const size_t r = (size_t)blockIdx.x * CONV_WARPS + threadIdx.x / 32;
    if (r >= g.rows) return;
    size_t b;
    int ho, wo;
    conv_split(r, g.Ho, g.Wo, b, ho, wo);
    const int kk = g.k * g.k;
    for (int j = threadIdx.x % 32; j < (int)g.cols; j += 32) {
        const int c = j / kk, t = j - c * kk;
        const int h = ho * g.s + t / g.k - g.p, w = wo * g.s + t % g.k - g.p;
        float v = 0.0f;
        if (h >= 0 && h < g.H && w >= 0 && w < g.W) load_v<1>(x + b * g.sb + c * g.sc + h * g.sh + w * g.sw, &v);
        store_v<1>(cols + r * g.cols + j, &v);
    }
}

// dx[b, c, h, w] (+)= its taps: a warp per input pixel, lanes along channels.
template <typename TG, typename TX>
__global__ void col2im_nchw_kernel(const TG *__restrict__ dcols, TX *__restrict__ dx, Conv2dShape g,
                                   bool write) {
    const size_t pix = (size_t)blockIdx.x * CONV_WARPS + threadIdx.x / 32;
    if (pix >= (size_t)g.B * g.H * g.W) return;
    size_t b;
    int h, w;
    conv_split(pix, g.H, g.W, b, h, w);
    const ConvTaps taps = conv_taps(g, h, w);
    for (int c = threadIdx.x % 32; c < g.C; c += 32) {
        float acc;
        conv_sum_taps<1>(g, taps, &acc, [&](int ky, int kx, int ho, int wo, float *v) {
            load_v<1>(dcols + ((b * g.Ho + ho) * g.Wo + wo) * g.cols + ((size_t)c * g.k + ky) * g.k + kx, v);
        });
        conv_put<1>(dx + b * g.sb + c * g.sc + h * g.sh + w * g.sw, &acc, write);
    }
}

// ---- channels-last ------------------------------------------------------------------------------
// Channels are handled V at a time (V = 8: one 16-byte load of bf16, two of fp32) where C is a
// multiple of 8 and the tensors are 16-byte aligned (conv_vec), else one at a time.

// cols[r, t C + c] = x[b, ho s + ky - p, wo s + kx - p, c] (0 in the padding), t = ky k + kx: a
// thread per (row, tap, V channels); consecutive threads copy consecutive channels.
template <int V, typename TX, typename TC>
__global__ void im2col_nhwc_kernel(const TX *__restrict__ x, TC *__restrict__ cols, Conv2dShape g,
                                   size_t items) {
    const int cv = g.C / V, kk = g.k * g.k;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < items;
         i += (size_t)gridDim.x * blockDim.x) {
        const int c = (int)(i % (size_t)cv) * V;
        const size_t rt = i / (size_t)cv, r = rt / (size_t)kk;
        const int t = (int)(rt - r * kk);
        size_t b;
        int ho, wo;
        conv_split(r, g.Ho, g.Wo, b, ho, wo);
        const int h = ho * g.s + t / g.k - g.p, w = wo * g.s + t % g.k - g.p;
        float v[V];
        if (h >= 0 && h < g.H && w >= 0 && w < g.W) {
            load_v<V>(x + b * g.sb + h * g.sh + w * g.sw + c, v);
        } else {
            #pragma unroll
            for (int j = 0; j < V; j++) v[j] = 0.0f;
        }
        store_v<V>(cols + r * g.cols + (size_t)t * g.C + c, v);
    }
}

// dx[b, h, w, c] (+)= its taps in (ky, kx) order, from dcols' (ky, kx, c) rows: a thread per
// (input pixel, V channels).
template <int V, typename TG, typename TX>
__global__ void col2im_nhwc_kernel(const TG *__restrict__ dcols, TX *__restrict__ dx, Conv2dShape g,
                                   size_t items, bool write) {
    const int cv = g.C / V;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < items;
         i += (size_t)gridDim.x * blockDim.x) {
        const int c = (int)(i % (size_t)cv) * V;
        const size_t pix = i / (size_t)cv;
        size_t b;
        int h, w;
        conv_split(pix, g.H, g.W, b, h, w);
        float acc[V];
        conv_sum_taps<V>(g, conv_taps(g, h, w), acc, [&](int ky, int kx, int ho, int wo, float *v) {
            load_v<V>(dcols + ((b * g.Ho + ho) * g.Wo + wo) * g.cols + (size_t)(ky * g.k + kx) * g.C + c, v);
        });
        conv_put<V>(dx + pix * g.C + c, acc, write);
    }
}

// ---- the weight in the channels-last columns' order -------------------------------------------

// wt[o, t, c] = w[o, c, t], t = ky k + kx.
template <typename T>
__global__ void weight_to_taps_kernel(const T *__restrict__ w, T *__restrict__ wt, int Cout, int C, int kk) {
    const size_t n = (size_t)Cout * C * kk;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const int c = (int)(i % C), t = (int)(i / C % kk);
        const size_t o = i / ((size_t)C * kk);
        wt[i] = w[(o * C + c) * kk + t];
    }
}

// dw[o, c, t] += dwt[o, t, c]: a thread per element of dw (each written once).
__global__ void dw_from_taps_kernel(const float *__restrict__ dwt, float *__restrict__ dw, int Cout, int C, int kk) {
    const size_t n = (size_t)Cout * C * kk;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const int t = (int)(i % kk), c = (int)(i / kk % C);
        const size_t o = i / ((size_t)C * kk);
        dw[i] += dwt[(o * kk + t) * C + c];
    }
}

// ---- launches -----------------------------------------------------------------------------------

static bool conv_vec(const Conv2dShape &g, const void *a, const void *b) {
    return g.C % 8 == 0 && aligned16(a) && aligned16(b);
}

// A (rows, cols) matrix of dtype dt over device memory p.
static Tensor device_matrix(void *p, DType dt, size_t rows, size_t cols) {
    Tensor t;
    memset(&t, 0, sizeof t);
    const int shape[2] = {(int)rows, (int)cols};
    tensor_set_shape(&t, 2, shape);
    t.dtype = dt;
    t.device = DEVICE_CUDA;
    t.data = p;
    return t;
}

// cols (dtype dt) = the windows of x, in this file's order for the layout.
static void launch_im2col(Ctx *ctx, const Conv2dShape &g, int nchw, const Tensor *x, DType dt, void *cols) {
    cudaStream_t st = cuda_stream_of(ctx);
    dispatch_dtype2(x->dtype, dt, [&](auto tx, auto tc) {
        using TX = TAG_T(tx);
        using TC = TAG_T(tc);
        if (nchw) {
            im2col_nchw_kernel<TX, TC><<<(unsigned)ceil_div(g.rows, CONV_WARPS), CONV_THREADS, 0, st>>>(
                (const TX *)x->data, (TC *)cols, g);
        } else {
            auto go = [&](auto vc) {
                constexpr int V = decltype(vc)::value;
                const size_t items = g.rows * (size_t)(g.k * g.k) * (size_t)(g.C / V);
                im2col_nhwc_kernel<V, TX, TC><<<grid_stride_blocks(ctx, items, CONV_THREADS), CONV_THREADS, 0, st>>>(
                    (const TX *)x->data, (TC *)cols, g, items);
            };
            if (conv_vec(g, x->data, cols)) go(std::integral_constant<int, 8>{});
            else go(std::integral_constant<int, 1>{});
        }
        CUDA_CHECK_LAUNCH();
    });
}

// dx (+)= the adjoint of launch_im2col applied to dcols (dtype dt).
static void launch_col2im(Ctx *ctx, const Conv2dShape &g, int nchw, const void *dcols, DType dt, Tensor *dx,
                          bool write) {
    cudaStream_t st = cuda_stream_of(ctx);
    const size_t pixels = (size_t)g.B * g.H * g.W;
    dispatch_dtype2(dt, dx->dtype, [&](auto tg, auto tx) {
        using TG = TAG_T(tg);
        using TX = TAG_T(tx);
        if (nchw) {
            col2im_nchw_kernel<TG, TX><<<(unsigned)ceil_div(pixels, CONV_WARPS), CONV_THREADS, 0, st>>>(
                (const TG *)dcols, (TX *)dx->data, g, write);
        } else {
            auto go = [&](auto vc) {
                constexpr int V = decltype(vc)::value;
                const size_t items = pixels * (size_t)(g.C / V);
                col2im_nhwc_kernel<V, TG, TX><<<grid_stride_blocks(ctx, items, CONV_THREADS), CONV_THREADS, 0, st>>>(
                    (const TG *)dcols, (TX *)dx->data, g, items, write);
            };
            if (conv_vec(g, dcols, dx->data)) go(std::integral_constant<int, 8>{});
            else go(std::integral_constant<int, 1>{});
        }
        CUDA_CHECK_LAUNCH();
    });
}

// The weight as the GEMM reads it: w itself (NCHW), or a permuted copy in a temporary (freed by
// the caller when it differs from w).
static void *gemm_weight(Ctx *ctx, const Conv2dShape &g, int nchw, const Tensor *w) {
    if (nchw) return w->data;
    void *wt = cuda_temp_alloc(ctx, w->numel * dtype_size(w->dtype));
    const int kk = g.k * g.k;
    dispatch_dtype(w->dtype, [&](auto tag) {
        using T = TAG_T(tag);
        weight_to_taps_kernel<T><<<grid_stride_blocks(ctx, w->numel, CONV_THREADS), CONV_THREADS, 0,
                                   cuda_stream_of(ctx)>>>((const T *)w->data, (T *)wt, g.Cout, g.C, kk);
    });
    CUDA_CHECK_LAUNCH();
    return wt;
}

// The CUDA op's dtype rules beside the shared geometry: everything on the GPU; cols, y (dy) and b
// in w's dtype; x (dx) in w's or fp32; the column matrix within the GEMM's int range.
static void check_dtypes(const char *op, const Conv2dShape &g, const Tensor *w, const Tensor *x,
                         const Tensor *cols, const Tensor *y, const char *yname, const Tensor *b) {
    cuda_check_tensor(op, "w", w);
    if (x) {
        cuda_check_tensor(op, "x", x);
        CG_CHECK(x->dtype == w->dtype || x->dtype == DTYPE_F32, "x is in w's dtype or fp32",
                 "op %s: x is %s, w %s", op, dtype_name(x->dtype), dtype_name(w->dtype));
    }
    if (cols) {
        cuda_check_tensor(op, "cols", cols);
        cuda_check_same_dtype(op, "cols", cols, "w", w);
    }
    cuda_check_tensor(op, yname, y);
    cuda_check_same_dtype(op, yname, y, "w", w);
    if (b) {
        cuda_check_tensor(op, "b", b);
        cuda_check_same_dtype(op, "b", b, "w", w);
    }
    CG_CHECK(g.rows <= INT_MAX && g.cols <= INT_MAX, "reduce batch_size",
             "op %s: a %zu x %zu column matrix exceeds the GEMM's int range", op, g.rows, g.cols);
}

// The convolution alone: the stem's kernels (the image's, conv2d_stem.cu; the second,
// conv2d_rows.cu at gspn_t's widths, conv2d_taps.cu at gspn_s's and gspn_b's) where they apply,
// else the columns and the GEMM.
static void conv2d_plain(Ctx *ctx, const Conv2dShape &g, const Tensor *x, const Tensor *w, const Tensor *b,
                         int nchw, Tensor *cols, Tensor *y) {
    if (cuda_conv2d_stem(ctx, g, nchw, x, w, b, NULL, cols, y)) return;
    const DType dt = w->dtype;
    void *wg = gemm_weight(ctx, g, nchw, w);
    if (!cuda_conv2d_rows(ctx, g, nchw, x, wg, b, cols, y) && !cuda_conv2d_taps(ctx, g, nchw, x, wg, b, cols, y)) {
        void *cd = cols ? cols->data : cuda_temp_alloc(ctx, g.rows * g.cols * dtype_size(dt));
        launch_im2col(ctx, g, nchw, x, dt, cd);
        Tensor cm = device_matrix(cd, dt, g.rows, g.cols), wm = device_matrix(wg, dt, g.Cout, g.cols);
        Tensor ym = device_matrix(y->data, dt, g.rows, g.Cout);
        cuda_linear_fwd(ctx, &cm, &wm, b, NULL, &ym);
        if (!cols) cuda_temp_free(ctx, cd);
    }
    if (wg != w->data) cuda_temp_free(ctx, wg);
}

// With opts' norm (and GELU): the stem's tensor-core kernel makes all three where it applies
// (kernels/cuda/conv2d_stem.h: fp32 norm weights, both given), else the convolution, then
// layernorm_fwd into a buffer and gelu_fwd (or a copy) back into y.
extern "C" void cuda_conv2d_fwd(Ctx *ctx, const Tensor *x, const Tensor *w, const Tensor *b, int nchw,
                                int stride, int pad, const Conv2dFwdOpts *opts, Tensor *cols, Tensor *y) {
    const char *op = "conv2d_fwd";
    cuda_check_tensor(op, "x", x);
    cuda_check_tensor(op, "w", w);
    Conv2dShape g = conv2d_shape(op, "x", x, w, nchw, stride, pad);
    check_dtypes(op, g, w, x, cols, y, "y", b);
    conv2d_check_out(op, "y", &g, y, true);
    if (b) conv2d_check_bias(op, &g, b);
    if (cols) conv2d_check_cols(op, &g, cols);
    conv2d_check_opts(op, opts, cols);
    const bool ln = opts && opts->ln;
    if (ln) {
        layernorm_fwd_dims(op, y, NULL, opts->ln_w, opts->ln_b, opts->ln_eps, NULL, y, NULL, NULL);
        if (opts->ln_w) cuda_check_tensor(op, "ln_w", opts->ln_w);
        if (opts->ln_b) cuda_check_tensor(op, "ln_b", opts->ln_b);
    }
    if (g.rows == 0) return;
    if (ln && opts->ln_w && opts->ln_b && opts->ln_w->dtype == DTYPE_F32 && opts->ln_b->dtype == DTYPE_F32 &&
        (!opts->gelu_out || opts->gelu_kind == GELU_ERF)) {
        const StemNormGelu post = {tensor_f32(opts->ln_w), tensor_f32(opts->ln_b), opts->ln_eps, opts->gelu_out};
        if (cuda_conv2d_stem(ctx, g, nchw, x, w, b, &post, cols, y)) return;
    }
    conv2d_plain(ctx, g, x, w, b, nchw, cols, y);
    if (!ln) return;
    Tensor z = *y;   // the norm's output
    z.data = cuda_temp_alloc(ctx, y->numel * dtype_size(y->dtype));
    z.grad = NULL;
    cuda_layernorm_fwd(ctx, y, NULL, opts->ln_w, opts->ln_b, opts->ln_eps, NULL, &z, NULL, NULL);
    if (opts->gelu_out) cuda_gelu_fwd(ctx, &z, opts->gelu_kind, y);
    else CUDA_CHECK(cudaMemcpyAsync(y->data, z.data, y->numel * dtype_size(y->dtype), cudaMemcpyDeviceToDevice,
                                    cuda_stream_of(ctx)));
    cuda_temp_free(ctx, z.data);
}

extern "C" void cuda_conv2d_bwd(Ctx *ctx, const Tensor *dy, const Tensor *cols, const Tensor *w, int nchw,
                                int stride, int pad, int flags, Tensor *dx, Tensor *dw, Tensor *db) {
    const char *op = "conv2d_bwd";
    cuda_check_tensor(op, "w", w);
    if (dx) cuda_check_tensor(op, "dx", dx);
    Conv2dShape g = dx ? conv2d_shape(op, "dx", dx, w, nchw, stride, pad) : conv2d_weight_shape(op, w);
    cuda_check_tensor(op, "dy", dy);
    conv2d_check_out(op, "dy", &g, dy, dx != NULL);
    check_dtypes(op, g, w, dx, cols, dy, "dy", NULL);
    conv2d_check_cols(op, &g, cols);
    if (dw) cuda_check_numel(op, "dw", dw, (size_t)g.Cout * g.cols);
    if (dw) cuda_check_f32(op, "dw", dw);
    if (db) {
        cuda_check_f32(op, "db", db);
        conv2d_check_bias(op, &g, db);
    }
    if (g.rows == 0 || (!dx && !dw && !db)) return;
    if (!dx && cuda_conv2d_stem_dw(ctx, g, nchw, dy, cols, dw, db)) return;
    const DType dt = w->dtype;
    cudaStream_t st = cuda_stream_of(ctx);
    // dw in the columns' order: dw itself (NCHW), or a zeroed temporary added permuted below.
    float *dwt = NULL;
    Tensor dwm;
    if (dw && !nchw) {
        dwt = (float *)cuda_temp_alloc(ctx, dw->numel * sizeof(float));
        CUDA_CHECK(cudaMemsetAsync(dwt, 0, dw->numel * sizeof(float), st));
    }
    if (dw) dwm = device_matrix(dwt ? (void *)dwt : dw->data, DTYPE_F32, g.Cout, g.cols);
    Tensor dym = device_matrix(dy->data, dt, g.rows, g.Cout), cm = device_matrix(cols->data, dt, g.rows, g.cols);
    // dw's product does not read w: the weight's permuted copy is made only for dx.
    void *wg = dx ? gemm_weight(ctx, g, nchw, w) : w->data;
    Tensor wm = device_matrix(wg, dt, g.Cout, g.cols);
    if (dx) {
        void *dc = cuda_temp_alloc(ctx, g.rows * g.cols * dtype_size(dt));
        Tensor dcm = device_matrix(dc, dt, g.rows, g.cols);
        cuda_linear_bwd(ctx, &dym, &cm, &wm, LINEAR_WRITE_DX, NULL, &dcm, dw ? &dwm : NULL, db);
        launch_col2im(ctx, g, nchw, dc, dt, dx, flags & CONV2D_WRITE_DX);
        cuda_temp_free(ctx, dc);
    } else {
        cuda_linear_bwd(ctx, &dym, &cm, &wm, 0, NULL, NULL, dw ? &dwm : NULL, db);
    }
    if (dwt) {
        dw_from_taps_kernel<<<grid_stride_blocks(ctx, dw->numel, CONV_THREADS), CONV_THREADS, 0, st>>>(
            dwt, (float *)dw->data, g.Cout, g.C, g.k * g.k);
        CUDA_CHECK_LAUNCH();
        cuda_temp_free(ctx, dwt);
    }
    if (wg != w->data) cuda_temp_free(ctx, wg);
}
