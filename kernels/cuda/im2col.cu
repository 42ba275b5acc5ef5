// CUDA: im2col and its adjoint (kernels/ops_list.h; geometry kernels/im2col_shape.h; CPU
// reference kernels/cpu/im2col.c). A column row (b, ho, wo) holds C k^2 values in (c, ky, kx)
// order. Every kernel gives a warp one row or one pixel and its lanes the contiguous run inside
// it, so index arithmetic happens once per warp, not per element.
//   NCHW input (the stem's image): a warp per row, lanes along the row's C k^2 columns.
//   Channels-last input: x holds a pixel's C channels together, the row wants them k^2 apart, so
//   IM2COL_ROWS rows at a time go through shared memory: read along channels, written along the
//   row. The backward turns dcols' rows into (ky, kx, c) order the same way (a scratch copy), then
//   a warp per input pixel gathers its taps along contiguous channels.
// Backward: a gather over the taps in (ky, kx) order: no atomics, the CPU's order.
#include "cuda_elem.cuh"
#include "../im2col_shape.h"

enum { IM2COL_THREADS = 256, IM2COL_WARPS = IM2COL_THREADS / 32, IM2COL_ROWS = 8 };

// Row r's output pixel (b, ho, wo), or an input pixel (b, h, w) with (Ho, Wo) -> (H, W).
__device__ __forceinline__ void im2col_split(size_t r, int Hn, int Wn, size_t &b, int &h, int &w) {
    w = (int)(r % (size_t)Wn);
    size_t bh = r / (size_t)Wn;
    h = (int)(bh % (size_t)Hn);
    b = bh / (size_t)Hn;
}

// The taps of input pixel (h, w): tap (ky, kx) reads it from output pixel ((h + p - ky) / s,
// (w + p - kx) / s) when both divide evenly and land in the grid. Along one axis those are
// ky = ky0 + a s with output row o0 - a (a = 0, 1, ...): found once per pixel, no division per tap.
struct Im2colTaps {
    int ky0, ho0, kx0, wo0;
};

__device__ __forceinline__ Im2colTaps im2col_taps(const Im2colShape &g, int h, int w) {
    Im2colTaps t;
    t.ky0 = (h + g.p) % g.s;
    t.ho0 = (h + g.p) / g.s;
    t.kx0 = (w + g.p) % g.s;
    t.wo0 = (w + g.p) / g.s;
    return t;
}

// Sum of f(ky, kx, ho, wo) over the pixel's taps, in (ky, kx) order.
template <typename F>
__device__ __forceinline__ float im2col_sum_taps(const Im2colShape &g, const Im2colTaps &t, F &&f) {
    float acc = 0.0f;
    for (int ky = t.ky0, ho = t.ho0; ky < g.k && ho >= 0; ky += g.s, ho--) {
        if (ho >= g.Ho) continue;
        for (int kx = t.kx0, wo = t.wo0; kx < g.k && wo >= 0; kx += g.s, wo--)
            if (wo < g.Wo) acc += f(ky, kx, ho, wo);
    }
    return acc;
}

// ---- NCHW ---------------------------------------------------------------------------------------

// cols[r, c k^2 + ky k + kx] = x[b, c, ho s + ky - p, wo s + kx - p]: a warp per row r.
template <typename T>
__global__ void im2col_nchw_kernel(const T *__restrict__ x, T *__restrict__ cols, Im2colShape g) {
    const size_t r = (size_t)blockIdx.x * IM2COL_WARPS + threadIdx.x / 32;
    if (r >= g.rows) return;
    size_t b;
    int ho, wo;
    im2col_split(r, g.Ho, g.Wo, b, ho, wo);
    const int kk = g.k * g.k;
    for (int j = threadIdx.x % 32; j < (int)g.cols; j += 32) {
        const int c = j / kk, t = j - c * kk;
        const int h = ho * g.s + t / g.k - g.p, w = wo * g.s + t % g.k - g.p;
        float v = 0.0f;
        if (h >= 0 && h < g.H && w >= 0 && w < g.W) load_v<1>(x + b * g.sb + c * g.sc + h * g.sh + w * g.sw, &v);
        store_v<1>(cols + r * g.cols + j, &v);
    }
}

// dx[b, c, h, w] += its taps: a warp per input pixel, lanes along channels.
template <typename T>
__global__ void col2im_nchw_kernel(const T *__restrict__ dcols, T *__restrict__ dx, Im2colShape g) {
    const size_t pix = (size_t)blockIdx.x * IM2COL_WARPS + threadIdx.x / 32;
    if (pix >= (size_t)g.B * g.H * g.W) return;
    size_t b;
    int h, w;
    im2col_split(pix, g.H, g.W, b, h, w);
    const Im2colTaps taps = im2col_taps(g, h, w);
    for (int c = threadIdx.x % 32; c < g.C; c += 32) {
        const float acc = im2col_sum_taps(g, taps, [&](int ky, int kx, int ho, int wo) {
            float v;
            load_v<1>(dcols + ((b * g.Ho + ho) * g.Wo + wo) * g.cols + ((size_t)c * g.k + ky) * g.k + kx, &v);
            return v;
        });
        T *p = dx + b * g.sb + c * g.sc + h * g.sh + w * g.sw;
        float prev;
        load_v<1>(p, &prev);
        prev += acc;
        store_v<1>(p, &prev);
    }
}

// ---- channels-last ------------------------------------------------------------------------------

// cols[r, c k^2 + t] = x[b, ho s + ky - p, wo s + kx - p, c] (0 in the padding), t = ky k + kx:
// a block per IM2COL_ROWS rows, a warp per (row, tap) reading along channels into shared memory.
template <typename T>
__global__ void im2col_nhwc_kernel(const T *__restrict__ x, T *__restrict__ cols, Im2colShape g) {
    extern __shared__ unsigned char im2col_smem[];
    T *sm = reinterpret_cast<T *>(im2col_smem);   // (IM2COL_ROWS, C k^2) in cols' order
    const int kk = g.k * g.k, width = (int)g.cols;
    const size_t r0 = (size_t)blockIdx.x * IM2COL_ROWS;
    const int nr = (int)min((size_t)IM2COL_ROWS, g.rows - r0);
    for (int rt = threadIdx.x / 32; rt < nr * kk; rt += IM2COL_WARPS) {
        const int rr = rt / kk, t = rt - rr * kk;
        size_t b;
        int ho, wo;
        im2col_split(r0 + rr, g.Ho, g.Wo, b, ho, wo);
        const int h = ho * g.s + t / g.k - g.p, w = wo * g.s + t % g.k - g.p;
        const bool in = h >= 0 && h < g.H && w >= 0 && w < g.W;
        const T *px = x + b * g.sb + (in ? h * g.sh + w * g.sw : 0);
        for (int c = threadIdx.x % 32; c < g.C; c += 32) {
            float v = 0.0f;
            if (in) load_v<1>(px + c, &v);
            store_v<1>(sm + rr * width + c * kk + t, &v);
        }
    }
    __syncthreads();
    T *out = cols + r0 * width;
    for (int e = threadIdx.x; e < nr * width; e += blockDim.x) out[e] = sm[e];
}

// dcolsT[r, t C + c] = dcols[r, c k^2 + t]: rows into (ky, kx, c) order, through shared memory.
template <typename T>
__global__ void im2col_rows_to_taps_kernel(const T *__restrict__ dcols, T *__restrict__ dcolsT,
                                           Im2colShape g) {
    extern __shared__ unsigned char im2col_smem[];
    T *sm = reinterpret_cast<T *>(im2col_smem);   // (IM2COL_ROWS, C k^2) in dcols' order
    const int kk = g.k * g.k, width = (int)g.cols;
    const size_t r0 = (size_t)blockIdx.x * IM2COL_ROWS;
    const int nr = (int)min((size_t)IM2COL_ROWS, g.rows - r0);
    const T *in = dcols + r0 * width;
    for (int e = threadIdx.x; e < nr * width; e += blockDim.x) sm[e] = in[e];
    __syncthreads();
    T *out = dcolsT + r0 * width;
    for (int rt = threadIdx.x / 32; rt < nr * kk; rt += IM2COL_WARPS) {
        const int rr = rt / kk, t = rt - rr * kk;
        for (int c = threadIdx.x % 32; c < g.C; c += 32)
            out[rr * width + t * g.C + c] = sm[rr * width + c * kk + t];
    }
}

// dx[b, h, w, c] += its taps in (ky, kx) order, from the (ky, kx, c) rows: a warp per input pixel.
template <typename T>
__global__ void col2im_nhwc_kernel(const T *__restrict__ dcolsT, T *__restrict__ dx, Im2colShape g) {
    const size_t pix = (size_t)blockIdx.x * IM2COL_WARPS + threadIdx.x / 32;
    if (pix >= (size_t)g.B * g.H * g.W) return;
    size_t b;
    int h, w;
    im2col_split(pix, g.H, g.W, b, h, w);
    const Im2colTaps taps = im2col_taps(g, h, w);
    T *p = dx + pix * g.C;
    for (int c = threadIdx.x % 32; c < g.C; c += 32) {
        const float acc = im2col_sum_taps(g, taps, [&](int ky, int kx, int ho, int wo) {
            float v;
            load_v<1>(dcolsT + ((b * g.Ho + ho) * g.Wo + wo) * g.cols + (size_t)(ky * g.k + kx) * g.C + c, &v);
            return v;
        });
        float prev;
        load_v<1>(p + c, &prev);
        prev += acc;
        store_v<1>(p + c, &prev);
    }
}

// ---- launches -----------------------------------------------------------------------------------

static unsigned im2col_warp_blocks(size_t items) { return (unsigned)ceil_div(items, IM2COL_WARPS); }

static unsigned im2col_row_blocks(const Im2colShape &g) { return (unsigned)ceil_div(g.rows, IM2COL_ROWS); }

static size_t im2col_row_smem(const Im2colShape &g, size_t elem) {
    size_t bytes = (size_t)IM2COL_ROWS * g.cols * elem;
    CG_CHECK(bytes <= 200 * 1024, "", "im2col: %d channels x %d^2 taps do not fit a block's shared "
             "memory (%zu bytes)", g.C, g.k, bytes);
    return bytes;
}

template <typename Kern> static void im2col_allow_smem(Kern kernel, size_t bytes) {
    if (bytes > 48 * 1024)
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}

void cuda_im2col_fwd(Ctx *ctx, const Tensor *x, int nchw, int k, int stride, int pad, Tensor *cols) {
    const char *op = "im2col_fwd";
    cuda_check_tensor(op, "x", x);
    cuda_check_tensor(op, "cols", cols);
    cuda_check_same_dtype(op, "cols", cols, "x", x);
    Im2colShape g = im2col_shape(op, x, nchw, k, stride, pad, cols);
    if (g.rows == 0) return;
    dispatch_dtype(x->dtype, [&](auto tag) {
        using T = TAG_T(tag);
        if (nchw) {
            im2col_nchw_kernel<T><<<im2col_warp_blocks(g.rows), IM2COL_THREADS, 0, cuda_stream_of(ctx)>>>(
                (const T *)x->data, (T *)cols->data, g);
        } else {
            size_t smem = im2col_row_smem(g, sizeof(T));
            im2col_allow_smem(im2col_nhwc_kernel<T>, smem);
            im2col_nhwc_kernel<T><<<im2col_row_blocks(g), IM2COL_THREADS, smem, cuda_stream_of(ctx)>>>(
                (const T *)x->data, (T *)cols->data, g);
        }
        CUDA_CHECK_LAUNCH();
    });
}

void cuda_im2col_bwd(Ctx *ctx, const Tensor *dcols, int nchw, int k, int stride, int pad, Tensor *dx) {
    const char *op = "im2col_bwd";
    cuda_check_tensor(op, "dcols", dcols);
    cuda_check_tensor(op, "dx", dx);
    cuda_check_same_dtype(op, "dcols", dcols, "dx", dx);
    Im2colShape g = im2col_shape(op, dx, nchw, k, stride, pad, dcols);
    if (g.rows == 0) return;
    const size_t pixels = (size_t)g.B * g.H * g.W;
    dispatch_dtype(dx->dtype, [&](auto tag) {
        using T = TAG_T(tag);
        if (nchw) {
            col2im_nchw_kernel<T><<<im2col_warp_blocks(pixels), IM2COL_THREADS, 0, cuda_stream_of(ctx)>>>(
                (const T *)dcols->data, (T *)dx->data, g);
        } else {
            T *dcolsT = (T *)cuda_scratch(ctx, dcols->numel * sizeof(T));
            size_t smem = im2col_row_smem(g, sizeof(T));
            im2col_allow_smem(im2col_rows_to_taps_kernel<T>, smem);
            im2col_rows_to_taps_kernel<T><<<im2col_row_blocks(g), IM2COL_THREADS, smem,
                                            cuda_stream_of(ctx)>>>((const T *)dcols->data, dcolsT, g);
            CUDA_CHECK_LAUNCH();
            col2im_nhwc_kernel<T><<<im2col_warp_blocks(pixels), IM2COL_THREADS, 0, cuda_stream_of(ctx)>>>(
                dcolsT, (T *)dx->data, g);
        }
        CUDA_CHECK_LAUNCH();
    });
}
