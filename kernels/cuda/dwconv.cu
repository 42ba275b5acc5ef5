// CUDA: depthwise convolution, channels-last, stride 1, zero padding k/2 (kernels/ops.h; CPU
// reference kernels/cpu/dwconv.c). y and dx: sliding windows along image rows (below); dw: the
// same windows summed per thread, then a fixed-order reduction; db: a column sum of dy
// (cuda_colsum.cuh). Deterministic throughout.
#include "cuda_colsum.cuh"

typedef struct DwDims { int B, H, W, C, k, p; } DwDims;

static DwDims dw_dims(const char *op, const Tensor *x, const Tensor *w) {
    cuda_check_tensor(op, "x", x);
    cuda_check_tensor(op, "w", w);
    char buf[64];
    CG_CHECK(x->ndim == 4, "", "op %s: x has shape %s, expected (B, H, W, C)", op,
             tensor_shape_str(x, buf, sizeof buf));
    DwDims d = {x->shape[0], x->shape[1], x->shape[2], x->shape[3], w->shape[w->ndim - 1], 0};
    CG_CHECK(d.k % 2 == 1 && d.k <= 7 && w->numel == (size_t)d.C * d.k * d.k,
             "a depthwise weight is (C, 1, k, k), k odd, at most 7",
             "op %s: w has shape %s for %d channels", op, tensor_shape_str(w, buf, sizeof buf), d.C);
    d.p = d.k / 2;
    return d;
}

// ---- y and dx: rows of pixels through a sliding window ------------------------------------------
// A thread owns one channel c (adjacent threads adjacent channels: every load and store is
// coalesced) and DW_SEG consecutive pixels of one image row. It keeps the k x k weights and the
// k x k input window in registers and slides the window one column per output: k loads and k^2
// FMAs per output instead of k^2 loads. FLIP = false: y = b + sum_{i,j} w[i][j] in[h+i-p, w+j-p];
// true: dx += sum_{i,j} w[k-1-i][k-1-j] dy[h+i-p, w+j-p], the adjoint (dy correlated with the
// flipped kernel), added to dx's prior value and rounded once.
enum { DW_TX = 32, DW_TY = 8, DW_SEG = 16 };

template <typename T> __device__ __forceinline__ float dw_load(const T *p) {
    float v;
    load_v<1>(p, &v);
    return v;
}

// The k x k window of one channel of img (an image's (H,W,C) plane at channel c) around row h:
// win[i][j] = img[h+i-P, x+j-P], 0 outside. dw_window_start loads columns 1..K-1 for the output
// column x0 (column 0 is dropped by the first advance); dw_window_advance moves it to column x.
template <int K, typename T>
__device__ __forceinline__ void dw_window_start(float (&win)[K][K], const T *img, const DwDims &d,
                                                int h, int x0) {
    constexpr int P = K / 2;
    #pragma unroll
    for (int i = 0; i < K; i++) {
        int hh = h + i - P;
        bool row_in = hh >= 0 && hh < d.H;
        #pragma unroll
        for (int j = 1; j < K; j++) {
            int ww = x0 - 1 + j - P;   // a row narrower than the kernel ends inside the window
            win[i][j] = row_in && ww >= 0 && ww < d.W ? dw_load(img + ((size_t)hh * d.W + ww) * d.C) : 0.0f;
        }
    }
}

template <int K, typename T>
__device__ __forceinline__ void dw_window_advance(float (&win)[K][K], const T *img, const DwDims &d,
                                                  int h, int x) {
    constexpr int P = K / 2;
    int ww = x + P;   // the window's new column
    #pragma unroll
    for (int i = 0; i < K; i++) {
        #pragma unroll
        for (int j = 0; j < K - 1; j++) win[i][j] = win[i][j + 1];
        int hh = h + i - P;
        win[i][K - 1] = hh >= 0 && hh < d.H && ww < d.W ? dw_load(img + ((size_t)hh * d.W + ww) * d.C) : 0.0f;
    }
}

template <int K, bool FLIP, typename T, typename TW>
__global__ void __launch_bounds__(DW_TX * DW_TY)
dwconv_rows_kernel(const T *in, const TW *w, const TW *bias, T *out, DwDims d, int segs) {
    int c = blockIdx.x * DW_TX + threadIdx.x;
    long long job = (long long)blockIdx.y * DW_TY + threadIdx.y;   // (b, h, segment)
    if (c >= d.C || job >= (long long)d.B * d.H * segs) return;
    int seg = (int)(job % segs);
    long long bh = job / segs;
    int h = (int)(bh % d.H), b = (int)(bh / d.H);
    int w0 = seg * DW_SEG, w1 = min(w0 + DW_SEG, d.W);
    float wr[K][K], win[K][K];
    #pragma unroll
    for (int i = 0; i < K; i++)
        #pragma unroll
        for (int j = 0; j < K; j++)
            wr[i][j] = (float)w[(size_t)c * K * K + (FLIP ? (K - 1 - i) * K + (K - 1 - j) : i * K + j)];
    const T *img = in + (size_t)b * d.H * d.W * d.C + c;
    dw_window_start<K>(win, img, d, h, w0);
    float b0 = !FLIP && bias ? (float)bias[c] : 0.0f;
    for (int x = w0; x < w1; x++) {
        dw_window_advance<K>(win, img, d, h, x);
        float acc = b0;
        #pragma unroll
        for (int i = 0; i < K; i++)
            #pragma unroll
            for (int j = 0; j < K; j++) acc = fmaf(wr[i][j], win[i][j], acc);
        T *o = out + (((size_t)b * d.H + h) * d.W + x) * d.C + c;
        if (FLIP) acc += dw_load(o);
        store_v<1>(o, &acc);
    }
}

// ---- dw: per-thread sums of dy x the shifted input, then a fixed-order reduction ---------------
// A thread owns channel c and the image rows r = (b, h) of its split with r % DW_TY == its row
// phase; along each row it slides the k x k window of x and adds dy[b,h,x,c] * win into k^2
// register sums (dy read once per pixel). The DW_TY phases are added in order in shared memory,
// one tap at a time, into partial[split][c*k*k + tap]; cuda_sum_partials adds the splits in order.
// No atomics: the result is a function of the shape alone.
template <int K, typename T>
__global__ void __launch_bounds__(DW_TX * DW_TY)
dwconv_dw_kernel(const T *dy, const T *x, DwDims d, int rows_per_split, float *partial) {
    __shared__ float sm[DW_TY][DW_TX];
    int c = blockIdx.x * DW_TX + threadIdx.x;
    int r0 = blockIdx.y * rows_per_split, r1 = min(r0 + rows_per_split, d.B * d.H);
    float acc[K][K];
    #pragma unroll
    for (int i = 0; i < K; i++)
        #pragma unroll
        for (int j = 0; j < K; j++) acc[i][j] = 0.0f;
    if (c < d.C) {
        for (int r = r0 + threadIdx.y; r < r1; r += DW_TY) {
            int h = r % d.H, b = r / d.H;
            const T *img = x + (size_t)b * d.H * d.W * d.C + c;
            const T *g = dy + ((size_t)r * d.W) * d.C + c;
            float win[K][K];
            dw_window_start<K>(win, img, d, h, 0);
            for (int xc = 0; xc < d.W; xc++) {
                dw_window_advance<K>(win, img, d, h, xc);
                float gv = dw_load(g + (size_t)xc * d.C);
                #pragma unroll
                for (int i = 0; i < K; i++)
                    #pragma unroll
                    for (int j = 0; j < K; j++) acc[i][j] = fmaf(gv, win[i][j], acc[i][j]);
            }
        }
    }
    #pragma unroll
    for (int t = 0; t < K * K; t++) {
        sm[threadIdx.y][threadIdx.x] = acc[t / K][t % K];
        __syncthreads();
        if (threadIdx.y == 0 && c < d.C) {
            float s = sm[0][threadIdx.x];
            #pragma unroll
            for (int y = 1; y < DW_TY; y++) s += sm[y][threadIdx.x];
            partial[(size_t)blockIdx.y * d.C * K * K + (size_t)c * K * K + t] = s;
        }
        __syncthreads();
    }
}

// K as a template argument (the window and the weights live in registers).
template <typename F> static void dispatch_k(int k, F &&f) {
    switch (k) {
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 3: f(std::integral_constant<int, 3>{}); break;
    case 5: f(std::integral_constant<int, 5>{}); break;
    default: f(std::integral_constant<int, 7>{}); break;   // dw_dims allows odd k <= 7
    }
}

template <bool FLIP, typename T, typename TW>
static void launch_rows(Ctx *ctx, const T *in, const TW *w, const TW *bias, T *out, DwDims d) {
    int segs = (d.W + DW_SEG - 1) / DW_SEG;
    long long jobs = (long long)d.B * d.H * segs;
    dim3 block(DW_TX, DW_TY), grid((unsigned)ceil_div((size_t)d.C, (size_t)DW_TX),
                                   (unsigned)ceil_div((size_t)jobs, (size_t)DW_TY));
    CG_CHECK(grid.y <= 65535, "", "dwconv: %lld row segments exceed the grid", jobs);
    dispatch_k(d.k, [&](auto kc) {
        dwconv_rows_kernel<decltype(kc)::value, FLIP, T, TW>
            <<<grid, block, 0, cuda_stream_of(ctx)>>>(in, w, bias, out, d, segs);
    });
    CUDA_CHECK_LAUNCH();
}

void cuda_dwconv_fwd(Ctx *ctx, const Tensor *x, const Tensor *w, const Tensor *b, Tensor *y) {
    const char *op = "dwconv_fwd";
    DwDims d = dw_dims(op, x, w);
    cuda_check_numel(op, "y", y, x->numel);
    cuda_check_same_dtype(op, "y", y, "x", x);
    if (b) {
        cuda_check_numel(op, "b", b, (size_t)d.C);
        cuda_check_same_dtype(op, "b", b, "w", w);
    }
    dispatch_dtype2(x->dtype, w->dtype, [&](auto tx, auto tw) {
        using T = TAG_T(tx);
        using TW = TAG_T(tw);
        launch_rows<false>(ctx, (const T *)x->data, (const TW *)w->data,
                           b ? (const TW *)b->data : nullptr, (T *)y->data, d);
    });
}

void cuda_dwconv_bwd(Ctx *ctx, const Tensor *dy, const Tensor *x, const Tensor *w, Tensor *dx,
                     Tensor *dw, Tensor *db) {
    const char *op = "dwconv_bwd";
    DwDims d = dw_dims(op, x, w);
    cuda_check_numel(op, "dy", dy, x->numel);
    cuda_check_same_dtype(op, "dy", dy, "x", x);
    size_t R = (size_t)d.B * d.H * d.W, kk = (size_t)d.k * d.k;
    if (dx) {
        cuda_check_numel(op, "dx", dx, x->numel);
        cuda_check_same_dtype(op, "dx", dx, "x", x);
        dispatch_dtype2(x->dtype, w->dtype, [&](auto tx, auto tw) {
            using T = TAG_T(tx);
            using TW = TAG_T(tw);
            launch_rows<true>(ctx, (const T *)dy->data, (const TW *)w->data, (const TW *)nullptr,
                              (T *)dx->data, d);
        });
    }
    if (dw) {
        cuda_check_f32(op, "dw", dw);
        cuda_check_numel(op, "dw", dw, (size_t)d.C * kk);
        // splits of the B*H image rows: enough blocks to fill the GPU, at least 2 rows per phase
        size_t rows = (size_t)d.B * d.H, chunks = ceil_div((size_t)d.C, (size_t)DW_TX);
        size_t want = ceil_div((size_t)1024, chunks), most = ceil_div(rows, (size_t)2 * DW_TY);
        size_t splits = want < most ? want : most;
        if (splits < 1) splits = 1;
        int rows_per_split = (int)ceil_div(rows, splits);
        splits = ceil_div(rows, (size_t)rows_per_split);
        size_t P = (size_t)d.C * kk;
        float *partial = (float *)cuda_scratch(ctx, splits * P * sizeof(float));
        dim3 block(DW_TX, DW_TY), grid((unsigned)chunks, (unsigned)splits);
        dispatch_dtype(x->dtype, [&](auto tx) {
            using T = TAG_T(tx);
            dispatch_k(d.k, [&](auto kc) {
                dwconv_dw_kernel<decltype(kc)::value, T><<<grid, block, 0, cuda_stream_of(ctx)>>>(
                    (const T *)dy->data, (const T *)x->data, d, rows_per_split, partial);
            });
        });
        CUDA_CHECK_LAUNCH();
        cuda_sum_partials(ctx, partial, (unsigned)splits, P, P, tensor_f32(dw), nullptr);
    }
    if (db) {
        cuda_check_f32(op, "db", db);
        cuda_check_numel(op, "db", db, (size_t)d.C);
        bool vec = d.C % 8 == 0 && aligned16(dy->data) && aligned16(db->data);
        dispatch_dtype(dy->dtype, [&](auto tx) {
            using T = TAG_T(tx);
            launch_colsum(ctx, R, (size_t)d.C, vec, ColsumRows<T>{(const T *)dy->data, (size_t)d.C},
                          tensor_f32(db));
        });
    }
}
