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

// Channels are handled V at a time (V = 8: one 16-byte load of bf16, two of fp32) where C is a
// multiple of 8 and the tensors are 16-byte aligned (im2col_vec), else one at a time.

// cols[r, c k^2 + t] = x[b, ho s + ky - p, wo s + kx - p, c] (0 in the padding), t = ky k + kx:
// a block per IM2COL_ROWS rows; a thread per (row, tap, V channels) reads along channels into
// shared memory, then the rows go out whole.
template <int V, typename T>
__global__ void im2col_nhwc_kernel(const T *__restrict__ x, T *__restrict__ cols, Im2colShape g) {
    extern __shared__ __align__(16) unsigned char im2col_smem[];
    T *sm = reinterpret_cast<T *>(im2col_smem);   // (IM2COL_ROWS, C k^2) in cols' order
    __shared__ long long row_base[IM2COL_ROWS];   // x's offset of (b, 0, 0, 0)
    __shared__ int row_h[IM2COL_ROWS], row_w[IM2COL_ROWS];   // the taps' top-left input pixel
    const int kk = g.k * g.k, width = (int)g.cols, cv = g.C / V;
    const size_t r0 = (size_t)blockIdx.x * IM2COL_ROWS;
    const int nr = (int)min((size_t)IM2COL_ROWS, g.rows - r0);
    if (threadIdx.x < nr) {
        size_t b;
        int ho, wo;
        im2col_split(r0 + threadIdx.x, g.Ho, g.Wo, b, ho, wo);
        row_base[threadIdx.x] = (long long)b * g.sb;
        row_h[threadIdx.x] = ho * g.s - g.p;
        row_w[threadIdx.x] = wo * g.s - g.p;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < nr * kk * cv; e += blockDim.x) {   // e = (row, tap, vector)
        const int q = e % cv, rt = e / cv, rr = rt / kk, t = rt - rr * kk;
        const int h = row_h[rr] + t / g.k, w = row_w[rr] + t % g.k, c = q * V;
        float v[V];
        if (h >= 0 && h < g.H && w >= 0 && w < g.W) load_v<V>(x + row_base[rr] + h * g.sh + w * g.sw + c, v);
        else
            #pragma unroll
            for (int j = 0; j < V; j++) v[j] = 0.0f;
        #pragma unroll
        for (int j = 0; j < V; j++) store_v<1>(sm + rr * width + (c + j) * kk + t, &v[j]);
    }
    __syncthreads();
    T *out = cols + r0 * width;
    for (int e = threadIdx.x; e < nr * width / V; e += blockDim.x) {
        float v[V];
        load_v<V>(sm + e * V, v);
        store_v<V>(out + e * V, v);
    }
}

// dcolsT[r, t C + c] = dcols[r, c k^2 + t]: rows into (ky, kx, c) order, through shared memory.
template <int V, typename T>
__global__ void im2col_rows_to_taps_kernel(const T *__restrict__ dcols, T *__restrict__ dcolsT,
                                           Im2colShape g) {
    extern __shared__ __align__(16) unsigned char im2col_smem[];
    T *sm = reinterpret_cast<T *>(im2col_smem);   // (IM2COL_ROWS, C k^2) in dcols' order
    const int kk = g.k * g.k, width = (int)g.cols, cv = g.C / V;
    const size_t r0 = (size_t)blockIdx.x * IM2COL_ROWS;
    const int nr = (int)min((size_t)IM2COL_ROWS, g.rows - r0);
    const T *in = dcols + r0 * width;
    for (int e = threadIdx.x; e < nr * width / V; e += blockDim.x) {
        float v[V];
        load_v<V>(in + e * V, v);
        store_v<V>(sm + e * V, v);
    }
    __syncthreads();
    T *out = dcolsT + r0 * width;
    for (int e = threadIdx.x; e < nr * kk * cv; e += blockDim.x) {   // e = (row, tap, vector)
        const int q = e % cv, rt = e / cv, rr = rt / kk, t = rt - rr * kk, c = q * V;
        float v[V];
        #pragma unroll
        for (int j = 0; j < V; j++) load_v<1>(sm + rr * width + (c + j) * kk + t, &v[j]);
        store_v<V>(out + rr * width + t * g.C + c, v);
    }
}

// dx[b, h, w, c] += its taps in (ky, kx) order, from the (ky, kx, c) rows: a thread per (input
// pixel, V channels).
template <int V, typename T>
__global__ void col2im_nhwc_kernel(const T *__restrict__ dcolsT, T *__restrict__ dx, Im2colShape g,
                                   size_t items) {
    const int cv = g.C / V;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < items;
         i += (size_t)gridDim.x * blockDim.x) {
        const int c = (int)(i % (size_t)cv) * V;
        const size_t pix = i / (size_t)cv;
        size_t b;
        int h, w;
        im2col_split(pix, g.H, g.W, b, h, w);
        const Im2colTaps taps = im2col_taps(g, h, w);
        float acc[V];
        #pragma unroll
        for (int j = 0; j < V; j++) acc[j] = 0.0f;
        for (int ky = taps.ky0, ho = taps.ho0; ky < g.k && ho >= 0; ky += g.s, ho--) {
            if (ho >= g.Ho) continue;
            for (int kx = taps.kx0, wo = taps.wo0; kx < g.k && wo >= 0; kx += g.s, wo--) {
                if (wo >= g.Wo) continue;
                float v[V];
                load_v<V>(dcolsT + ((b * g.Ho + ho) * g.Wo + wo) * g.cols + (size_t)(ky * g.k + kx) * g.C + c, v);
                #pragma unroll
                for (int j = 0; j < V; j++) acc[j] += v[j];
            }
        }
        T *p = dx + pix * g.C + c;
        float prev[V];
        load_v<V>(p, prev);
        #pragma unroll
        for (int j = 0; j < V; j++) prev[j] += acc[j];
        store_v<V>(p, prev);
    }
}

// ---- launches -----------------------------------------------------------------------------------

static unsigned im2col_warp_blocks(size_t items) { return (unsigned)ceil_div(items, IM2COL_WARPS); }

// 8 channels a thread where C is a multiple of 8 and both tensors are 16-byte aligned (a row of
// C k^2 values then is too).
static bool im2col_vec(const Im2colShape &g, const void *a, const void *b) {
    return g.C % 8 == 0 && aligned16(a) && aligned16(b);
}

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
            auto go = [&](auto vc) {
                auto kernel = im2col_nhwc_kernel<decltype(vc)::value, T>;
                im2col_allow_smem(kernel, smem);
                kernel<<<im2col_row_blocks(g), IM2COL_THREADS, smem, cuda_stream_of(ctx)>>>(
                    (const T *)x->data, (T *)cols->data, g);
            };
            if (im2col_vec(g, x->data, cols->data)) go(std::integral_constant<int, 8>{});
            else go(std::integral_constant<int, 1>{});
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
            auto go = [&](auto vc) {
                constexpr int V = decltype(vc)::value;
                auto kernel = im2col_rows_to_taps_kernel<V, T>;
                im2col_allow_smem(kernel, smem);
                kernel<<<im2col_row_blocks(g), IM2COL_THREADS, smem, cuda_stream_of(ctx)>>>(
                    (const T *)dcols->data, dcolsT, g);
                CUDA_CHECK_LAUNCH();
                const size_t items = pixels * (size_t)(g.C / V);
                col2im_nhwc_kernel<V, T><<<grid_stride_blocks(ctx, items, IM2COL_THREADS), IM2COL_THREADS,
                                           0, cuda_stream_of(ctx)>>>(dcolsT, (T *)dx->data, g, items);
            };
            if (im2col_vec(g, dcols->data, dx->data) && aligned16(dcolsT)) go(std::integral_constant<int, 8>{});
            else go(std::integral_constant<int, 1>{});
        }
        CUDA_CHECK_LAUNCH();
    });
}
