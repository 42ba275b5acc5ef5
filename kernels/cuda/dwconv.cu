// CUDA: depthwise convolution, channels-last, stride 1, zero padding k/2 (kernels/ops.h; CPU
// reference kernels/cpu/dwconv.c). Every kernel works on tiles: a block stages one image's
// TH x TW pixels (plus the k-1 halo) of CG channels in shared memory as fp32, with 16-byte loads,
// then computes from there. y and dx share one kernel (dx is dy correlated with the mirrored
// taps); dw and db come from a second kernel that walks a run of images per block and keeps its
// k^2 + 1 sums in registers, then a fixed-order reduction. Deterministic throughout.
#include "cuda_elem.cuh"
#include "../dwconv_shape.h"

typedef DwconvShape DwDims;   // kernels/dwconv_shape.h: the geometry and checks both backends share

static DwDims dw_dims(const char *op, const Tensor *x, const Tensor *w) {
    cuda_check_tensor(op, "x", x);
    cuda_check_tensor(op, "w", w);
    return dwconv_shape(op, x, w);
}

// ---- tiles ------------------------------------------------------------------------------------
// A block owns CG channels (a group) of a TH x TW tile of one image. Thread (c, pair) owns channel
// c and the tile's columns 2 pair and 2 pair + 1, down all TH rows: per input row it reads k + 1
// staged values and serves both columns (k^2 FMAs per output against (k + 1)(TH + k - 1) / (2 TH)
// shared loads). TH is a template argument (7 for images of at most 7 rows, else 14) so that
// the rows unroll and every sum stays in a register. CG grows (16, 32, 64) until the block has
// about 256 threads; a pixel's CG channels are one 16-byte load (bf16, CG = 16) or more, or
// narrower loads where C is not a multiple of 8.
enum { DW_THREADS = 256, DW_PAIRS = 14, DW_CG_MIN = 16, DW_CG_MAX = 64 };

typedef struct DwTile {
    int th, tw, pairs, cg, stride;   // stride: floats per staged pixel (cg, padded for CG = 16)
    int tiles_y, tiles_x, groups;
} DwTile;

static DwTile dw_tile(const DwDims &d) {
    DwTile t;
    t.th = d.H <= 7 ? 7 : 14;
    t.pairs = d.W < 2 * DW_PAIRS ? (d.W + 1) / 2 : DW_PAIRS;
    t.tw = 2 * t.pairs;
    t.cg = DW_CG_MIN;
    while (t.cg < DW_CG_MAX && 2 * t.cg * t.pairs <= DW_THREADS && t.cg < d.C) t.cg *= 2;
    // With CG = 16 a warp spans two pairs, 2 * 16 floats apart: one bank. 8 floats of padding
    // per pixel put the second pair on the other half of the banks.
    t.stride = t.cg == DW_CG_MIN ? t.cg + 8 : t.cg;
    t.tiles_y = (d.H + t.th - 1) / t.th;
    t.tiles_x = (d.W + t.tw - 1) / t.tw;
    t.groups = (d.C + t.cg - 1) / t.cg;
    return t;
}

// Stages img[h0 .. h0+rows) x [w0 .. w0+cols) x [c0 .. c0+cg) (one image's (H,W,C) plane, zero
// outside it) into s[(r * cols + col) * stride + c] as fp32, V channels per load (C a multiple of
// V and img aligned to V elements: dw_vec).
template <int V, typename T>
__device__ __forceinline__ void dw_stage_v(float *s, const T *img, const DwDims &d, const DwTile &t,
                                           int c0, int h0, int w0, int rows, int cols) {
    const int per = t.cg / V, total = rows * cols * per;
    #pragma unroll 4
    for (int q = threadIdx.x; q < total; q += blockDim.x) {
        int pix = q / per, v = q - pix * per;
        int r = pix / cols, col = pix - r * cols;
        int hh = h0 + r, ww = w0 + col, c = c0 + v * V;
        float val[V];
        if (hh >= 0 && hh < d.H && ww >= 0 && ww < d.W && c < d.C)
            load_v<V>(img + ((size_t)hh * d.W + ww) * d.C + c, val);
        else
            for (int j = 0; j < V; j++) val[j] = 0.0f;
        Vec<float, V>::of(val).store(s + pix * t.stride + v * V);
    }
}

template <typename T>
__device__ __forceinline__ void dw_stage(float *s, const T *img, const DwDims &d, const DwTile &t,
                                         int c0, int h0, int w0, int rows, int cols, int vec) {
    switch (vec) {
    case 8: dw_stage_v<8>(s, img, d, t, c0, h0, w0, rows, cols); break;
    case 4: dw_stage_v<4>(s, img, d, t, c0, h0, w0, rows, cols); break;
    case 2: dw_stage_v<2>(s, img, d, t, c0, h0, w0, rows, cols); break;
    default: dw_stage_v<1>(s, img, d, t, c0, h0, w0, rows, cols); break;
    }
}

// ---- y and dx -----------------------------------------------------------------------------------
// out[b,h,w,c] (+)= bias[c] + sum_{i,j} w'[i][j] in[b, h+i-p, w+j-p, c] (+ in[b,h,w,c]); w' = w,
// or w mirrored in both axes for dx (dy correlated with the mirrored taps is the adjoint).
// DW_RESID: in's own value added (the residual's identity path, from the staged tile);
// DW_ACCUM: added to out's prior value; either way rounded once.
enum { DW_FLIP = 1, DW_ACCUM = 2, DW_RESID = 4 };

// Blocks per SM the compiler keeps the registers to: a 3x3 thread holds 9 weights and its sums,
// a 7x7 one 49 (ptxas: no spills at these counts).
template <int K> constexpr int dw_min_blocks() { return K <= 3 ? 4 : K <= 5 ? 3 : 2; }

template <int K, int TH, typename T, typename TW>
__global__ void __launch_bounds__(DW_THREADS, dw_min_blocks<K>())
dwconv_tile_kernel(const T *in, const TW *w, const TW *bias, T *out, DwDims d, DwTile t,
                   int flags, int vec) {
    extern __shared__ float tile[];   // (TH + K - 1, tw + K - 1, stride)
    constexpr int P = K / 2, ROWS = TH + K - 1;
    const int group = blockIdx.x % t.groups, tx = blockIdx.x / t.groups, ty = blockIdx.y;
    const int b = blockIdx.z, cols = t.tw + K - 1;
    const int c0 = group * t.cg, y0 = ty * TH, x0 = tx * t.tw;
    const T *img = in + (size_t)b * d.H * d.W * d.C;
    dw_stage(tile, img, d, t, c0, y0 - P, x0 - P, ROWS, cols, vec);

    const int cl = threadIdx.x % t.cg, pair = threadIdx.x / t.cg, c = c0 + cl;
    float wr[K][K];
    #pragma unroll
    for (int i = 0; i < K; i++)
        #pragma unroll
        for (int j = 0; j < K; j++) {
            int tap = flags & DW_FLIP ? (K - 1 - i) * K + (K - 1 - j) : i * K + j;
            wr[i][j] = c < d.C ? load_or(w, (size_t)c * K * K + tap, 0.0f) : 0.0f;
        }
    __syncthreads();
    float acc[TH][2];
    #pragma unroll
    for (int h = 0; h < TH; h++) acc[h][0] = acc[h][1] = 0.0f;
    const float *col = tile + 2 * pair * t.stride + cl;
    // Staged row r is tap row i of output row r - i.
    #pragma unroll
    for (int r = 0; r < ROWS; r++) {
        float v[K + 1];
        #pragma unroll
        for (int j = 0; j <= K; j++) v[j] = col[(r * cols + j) * t.stride];
        #pragma unroll
        for (int i = 0; i < K; i++) {
            const int h = r - i;
            if (h < 0 || h >= TH) continue;
            #pragma unroll
            for (int j = 0; j < K; j++) {
                acc[h][0] = fmaf(wr[i][j], v[j], acc[h][0]);
                acc[h][1] = fmaf(wr[i][j], v[j + 1], acc[h][1]);
            }
        }
    }
    if (c >= d.C) return;
    const float b0 = bias ? load_or(bias, (size_t)c, 0.0f) : 0.0f;
    T *o = out + (size_t)b * d.H * d.W * d.C + c;
    #pragma unroll
    for (int h = 0; h < TH; h++) {
        const int hh = y0 + h;
        if (hh >= d.H) break;
        #pragma unroll
        for (int e = 0; e < 2; e++) {
            const int ww = x0 + 2 * pair + e;
            if (ww >= d.W) continue;
            T *p = o + ((size_t)hh * d.W + ww) * d.C;
            float s = acc[h][e] + b0;
            if (flags & DW_RESID) s += tile[((h + P) * cols + 2 * pair + e + P) * t.stride + cl];
            if (flags & DW_ACCUM) s += load_or(p, 0, 0.0f);
            store_v<1>(p, &s);
        }
    }
}

// ---- dw and db ----------------------------------------------------------------------------------
// Block (group, tile, split) walks the images of its split: it stages x's tile with its halo and
// dy's tile, and thread (c, pair) adds dy[h, w] x[h+i-p, w+j-p] over its two columns into k^2
// register sums, and dy into a (k^2 + 1)-th. After the last image the pairs' sums are added in
// pair order in shared memory, and the block writes its row of the partial matrix
// (tiles * splits, C k^2 + C): columns c k^2 + tap for dw, C k^2 + c for db.
template <int K, int TH, typename T>
__global__ void __launch_bounds__(DW_THREADS, dw_min_blocks<K>())
dwconv_dw_tile_kernel(const T *dy, const T *x, DwDims d, DwTile t, int imgs_per_split, int vec,
                      float *partial) {
    extern __shared__ float sm[];   // x tile (TH + K - 1, tw + K - 1, stride), dy tile (TH, tw, stride)
    constexpr int P = K / 2, ROWS = TH + K - 1, KK = K * K;
    const int group = blockIdx.x % t.groups, tx = blockIdx.x / t.groups, ty = blockIdx.y;
    const int split = blockIdx.z, cols = t.tw + K - 1;
    const int c0 = group * t.cg, y0 = ty * TH, x0 = tx * t.tw;
    float *xs = sm, *gs = sm + ROWS * cols * t.stride;
    const int cl = threadIdx.x % t.cg, pair = threadIdx.x / t.cg;
    float acc[K][K], accb = 0.0f;
    #pragma unroll
    for (int i = 0; i < K; i++)
        #pragma unroll
        for (int j = 0; j < K; j++) acc[i][j] = 0.0f;
    const int b0 = split * imgs_per_split, b1 = min(b0 + imgs_per_split, d.B);
    const size_t plane = (size_t)d.H * d.W * d.C;
    for (int b = b0; b < b1; b++) {
        __syncthreads();   // the previous image's reads are done
        dw_stage(xs, x + b * plane, d, t, c0, y0 - P, x0 - P, ROWS, cols, vec);
        dw_stage(gs, dy + b * plane, d, t, c0, y0, x0, TH, t.tw, vec);
        __syncthreads();
        const float *xc = xs + 2 * pair * t.stride + cl, *gc = gs + 2 * pair * t.stride + cl;
        // g[i]: the thread's two dy values of row r - i, the row whose tap row i is staged row r
        // (0 outside the tile). A sliding window, so the row loop need not unroll: the k^2 sums,
        // the window and one staged row fit in registers.
        float g[K][2];
        #pragma unroll
        for (int i = 0; i < K; i++) g[i][0] = g[i][1] = 0.0f;
        #pragma unroll 1
        for (int r = 0; r < ROWS; r++) {
            #pragma unroll
            for (int i = K - 1; i > 0; i--) g[i][0] = g[i - 1][0], g[i][1] = g[i - 1][1];
            g[0][0] = r < TH ? gc[r * t.tw * t.stride] : 0.0f;
            g[0][1] = r < TH ? gc[(r * t.tw + 1) * t.stride] : 0.0f;
            accb += g[0][0] + g[0][1];
            float v[K + 1];
            #pragma unroll
            for (int j = 0; j <= K; j++) v[j] = xc[(r * cols + j) * t.stride];
            #pragma unroll
            for (int i = 0; i < K; i++)
                #pragma unroll
                for (int j = 0; j < K; j++)
                    acc[i][j] = fmaf(g[i][0], v[j], fmaf(g[i][1], v[j + 1], acc[i][j]));
        }
    }
    __syncthreads();
    float *red = sm;   // (pairs, KK + 1, cg)
    #pragma unroll
    for (int q = 0; q < KK; q++) red[(pair * (KK + 1) + q) * t.cg + cl] = acc[q / K][q % K];
    red[(pair * (KK + 1) + KK) * t.cg + cl] = accb;
    __syncthreads();
    const size_t width = (size_t)d.C * KK + d.C;
    float *row = partial + ((size_t)split * t.tiles_y * t.tiles_x + ty * t.tiles_x + tx) * width;
    for (int q = threadIdx.x; q < (KK + 1) * t.cg; q += blockDim.x) {
        const int tap = q / t.cg, cq = q - tap * t.cg, c = c0 + cq;
        if (c >= d.C) continue;
        float s = 0.0f;
        for (int p = 0; p < t.pairs; p++) s += red[(p * (KK + 1) + tap) * t.cg + cq];
        row[tap < KK ? (size_t)c * KK + tap : (size_t)d.C * KK + c] = s;
    }
}

// ---- launches ---------------------------------------------------------------------------------

// f(K, TH) as template arguments (the sums and the weights live in registers).
template <typename F> static void dispatch_k_th(int k, int th, F &&f) {
    auto with_th = [&](auto kc) {
        if (th == 7) f(kc, std::integral_constant<int, 7>{});
        else f(kc, std::integral_constant<int, 14>{});
    };
    switch (k) {
    case 1: with_th(std::integral_constant<int, 1>{}); break;
    case 3: with_th(std::integral_constant<int, 3>{}); break;
    case 5: with_th(std::integral_constant<int, 5>{}); break;
    default: with_th(std::integral_constant<int, 7>{}); break;   // odd k <= DWCONV_MAX_K = 7
    }
}

// Allows a kernel the dynamic shared memory it asks for (above the 48 KiB default), and asks for
// the largest shared-memory carveout: the tiles, not L1, hold what the blocks reuse, and several
// blocks per SM overlap one's loads with another's arithmetic.
template <typename Kern> static void dw_allow_smem(Kern kernel, size_t bytes) {
    if (bytes > 48 * 1024)
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                    (int)cudaSharedmemCarveoutMaxShared));
}

// Channels per staging load: the widest of 8, 4, 2 that divides C and to whose bytes both
// tensors are aligned (a tensor's pixels then all are); 1 otherwise.
static int dw_vec(const DwDims &d, size_t elem, const void *a, const void *b) {
    for (int v = 8; v > 1; v /= 2) {
        uintptr_t align = (uintptr_t)(v * elem) - 1;
        if (d.C % v == 0 && ((uintptr_t)a & align) == 0 && ((uintptr_t)b & align) == 0) return v;
    }
    return 1;
}

template <typename T, typename TW>
static void launch_tiles(Ctx *ctx, const T *in, const TW *w, const TW *bias, T *out, DwDims d,
                         int flags) {
    DwTile t = dw_tile(d);
    int vec = dw_vec(d, sizeof(T), in, in);
    CG_CHECK(t.tiles_y <= 65535 && d.B <= 65535, "", "dwconv: image %dx%d x %d images exceed the grid",
             d.H, d.W, d.B);
    dim3 grid((unsigned)(t.groups * t.tiles_x), (unsigned)t.tiles_y, (unsigned)d.B);
    dispatch_k_th(d.k, t.th, [&](auto kc, auto thc) {
        constexpr int K = decltype(kc)::value, TH = decltype(thc)::value;
        size_t smem = (size_t)(TH + K - 1) * (t.tw + K - 1) * t.stride * sizeof(float);
        auto kernel = dwconv_tile_kernel<K, TH, T, TW>;
        dw_allow_smem(kernel, smem);
        kernel<<<grid, t.cg * t.pairs, smem, cuda_stream_of(ctx)>>>(in, w, bias, out, d, t, flags, vec);
    });
    CUDA_CHECK_LAUNCH();
}

void cuda_dwconv_fwd(Ctx *ctx, const Tensor *x, const Tensor *w, const Tensor *b, int flags,
                     Tensor *y) {
    const char *op = "dwconv_fwd";
    DwDims d = dw_dims(op, x, w);
    cuda_check_numel(op, "y", y, x->numel);
    cuda_check_same_dtype(op, "y", y, "x", x);
    CG_CHECK(y->data != x->data, "", "op dwconv_fwd: y is x (the taps read neighbours of what they write)");
    if (b) {
        cuda_check_numel(op, "b", b, (size_t)d.C);
        cuda_check_same_dtype(op, "b", b, "w", w);
    }
    if (x->numel == 0) return;
    dispatch_dtype2(x->dtype, w->dtype, [&](auto tx, auto tw) {
        using T = TAG_T(tx);
        using TW = TAG_T(tw);
        launch_tiles(ctx, (const T *)x->data, (const TW *)w->data, b ? (const TW *)b->data : nullptr,
                     (T *)y->data, d, flags & DWCONV_RESIDUAL ? DW_RESID : 0);
    });
}

// dw and db: the tile kernel's partial rows, then their fixed-order column sums.
template <typename T>
static void launch_dw(Ctx *ctx, const T *dy, const T *x, DwDims d, float *dw, float *db) {
    DwTile t = dw_tile(d);
    const int KK = d.k * d.k;
    // Splits of the batch: enough blocks for several waves of a large GPU.
    int blocks = t.groups * t.tiles_x * t.tiles_y;
    int want = (4 * cuda_ctx_of(ctx)->sm_count + blocks - 1) / blocks;
    int splits = want < d.B ? want : d.B;
    int per = (d.B + splits - 1) / splits;
    splits = (d.B + per - 1) / per;
    size_t width = (size_t)d.C * KK + d.C, parts = (size_t)splits * t.tiles_y * t.tiles_x;
    float *partial = (float *)cuda_scratch(ctx, parts * width * sizeof(float));
    int vec = dw_vec(d, sizeof(T), dy, x);
    dim3 grid((unsigned)(t.groups * t.tiles_x), (unsigned)t.tiles_y, (unsigned)splits);
    dispatch_k_th(d.k, t.th, [&](auto kc, auto thc) {
        constexpr int K = decltype(kc)::value, TH = decltype(thc)::value;
        size_t tiles = ((size_t)(TH + K - 1) * (t.tw + K - 1) + (size_t)TH * t.tw) * t.stride;
        size_t red = (size_t)t.pairs * (K * K + 1) * t.cg;
        size_t smem = (tiles > red ? tiles : red) * sizeof(float);
        auto kernel = dwconv_dw_tile_kernel<K, TH, T>;
        dw_allow_smem(kernel, smem);
        kernel<<<grid, t.cg * t.pairs, smem, cuda_stream_of(ctx)>>>(dy, x, d, t, per, vec, partial);
    });
    CUDA_CHECK_LAUNCH();
    cuda_sum_partials(ctx, partial, (unsigned)parts, width, (size_t)d.C * KK, dw, db);
}

void cuda_dwconv_bwd(Ctx *ctx, const Tensor *dy, const Tensor *x, const Tensor *w, int flags,
                     Tensor *dx, Tensor *dw, Tensor *db) {
    const char *op = "dwconv_bwd";
    DwDims d = dw_dims(op, x, w);
    cuda_check_numel(op, "dy", dy, x->numel);
    cuda_check_same_dtype(op, "dy", dy, "x", x);
    if (dw) {
        cuda_check_f32(op, "dw", dw);
        cuda_check_numel(op, "dw", dw, (size_t)d.C * d.k * d.k);
    }
    if (db) {
        cuda_check_f32(op, "db", db);
        cuda_check_numel(op, "db", db, (size_t)d.C);
    }
    if (dx) {
        cuda_check_numel(op, "dx", dx, x->numel);
        cuda_check_same_dtype(op, "dx", dx, "x", x);
        CG_CHECK(dx->data != dy->data, "", "op dwconv_bwd: dx is dy (the taps read neighbours of what they write)");
    }
    if (x->numel == 0) return;
    if (dx)
        dispatch_dtype2(x->dtype, w->dtype, [&](auto tx, auto tw) {
            using T = TAG_T(tx);
            using TW = TAG_T(tw);
            launch_tiles(ctx, (const T *)dy->data, (const TW *)w->data, (const TW *)nullptr,
                         (T *)dx->data, d,
                         DW_FLIP | (flags & DWCONV_WRITE_DX ? 0 : DW_ACCUM) |
                             (flags & DWCONV_RESIDUAL ? DW_RESID : 0));
        });
    if (dw || db)
        dispatch_dtype(x->dtype, [&](auto tx) {
            using T = TAG_T(tx);
            launch_dw(ctx, (const T *)dy->data, (const T *)x->data, d, dw ? tensor_f32(dw) : nullptr,
                      db ? tensor_f32(db) : nullptr);
        });
}
