// CUDA: token layout ops — prefix tokens (class token), token slices, mean over tokens
// (kernels/ops.h; CPU reference kernels/cpu/tokens.c). Shapes and their checks:
// kernels/tokens_shape.h. Token tensors share the activation dtype; the prefix is a parameter
// (its own dtype) and its gradient is fp32, summed over the batch in a fixed order.
#include "cuda_colsum.cuh"
#include "../tokens_shape.h"

// Copies (or adds, ACC) rows of C between two token tensors: for r < rows, with b = r / Nr and
// n = r % Nr, dst row b * dN + dOff + n (+)= src row b * sN + sOff + n. sN = 0 broadcasts a
// (Nr, C) source over the batch (the prefix).
template <typename TS, typename TD, bool ACC> struct TokenRowsOp {
    const TS *src;
    TD *dst;
    IndexDiv C, Nr;
    size_t sN, sOff, dN, dOff;
    template <int V> __device__ void apply(size_t i) const {
        size_t r = C.div(i), c = i - r * C.m, b = Nr.div(r), n = r - b * Nr.m;
        size_t si = (b * sN + sOff + n) * C.m + c, di = (b * dN + dOff + n) * C.m + c;
        float v[V];
        load_v<V>(src + si, v);
        if (ACC) {
            float d[V];
            load_v<V>(dst + di, d);
            #pragma unroll
            for (int j = 0; j < V; j++) v[j] += d[j];
        }
        store_v<V>(dst + di, v);
    }
};

template <bool ACC>
static void token_rows(Ctx *ctx, const Tensor *src, Tensor *dst, size_t rows, size_t Nr,
                       size_t C, size_t sN, size_t sOff, size_t dN, size_t dOff) {
    size_t n = rows * C;
    bool vec = C % 8 == 0 && aligned16(src->data) && aligned16(dst->data);
    dispatch_dtype2(src->dtype, dst->dtype, [&](auto ts, auto td) {
        using TS = TAG_T(ts);
        using TD = TAG_T(td);
        launch_map(ctx, n, vec,
                   TokenRowsOp<TS, TD, ACC>{(const TS *)src->data, (TD *)dst->data, index_div(C, n),
                                            index_div(Nr, rows), sN, sOff, dN, dOff});
    });
}

// ---- prefix tokens ------------------------------------------------------------------------------

// prefix (P, C), x (B, N, C) -> y (B, P+N, C)
void cuda_concat_prefix_fwd(Ctx *ctx, const Tensor *prefix, const Tensor *x, Tensor *y) {
    const char *op = "concat_prefix_fwd";
    cuda_check_tensor(op, "prefix", prefix);
    cuda_check_tensor(op, "x", x);
    cuda_check_tensor(op, "y", y);
    TokenDims dx, dy;
    const size_t P = concat_prefix_dims(op, prefix, x, y, &dx, &dy), C = dx.C;
    cuda_check_same_dtype(op, "y", y, "x", x);
    token_rows<false>(ctx, prefix, y, dy.B * P, P, C, 0, 0, dy.N, 0);
    token_rows<false>(ctx, x, y, dx.B * dx.N, dx.N, C, dx.N, 0, dy.N, P);
}

// dprefix[p, c] += sum over b of dy[b, p, c]
template <typename T> struct PrefixGradRows {
    const T *dy;
    size_t stride;   // elements per batch item of dy
    template <int V> __device__ void row(size_t b, size_t i, float *acc) const {
        float v[V];
        load_v<V>(dy + b * stride + i, v);
        #pragma unroll
        for (int j = 0; j < V; j++) acc[j] += v[j];
    }
};

// dprefix (P, C) += sum over b of dy[b, :P]; dx (B, N, C) += dy[:, P:]
void cuda_concat_prefix_bwd(Ctx *ctx, const Tensor *dy, Tensor *dprefix, Tensor *dx) {
    const char *op = "concat_prefix_bwd";
    if (!dprefix && !dx) return;
    cuda_check_tensor(op, "dy", dy);
    if (dprefix) cuda_check_f32(op, "dprefix", dprefix);
    if (dx) cuda_check_tensor(op, "dx", dx);
    TokenDims d;
    const size_t P = concat_prefix_bwd_dims(op, dy, dprefix, dx, &d), C = d.C, N = d.N - P;
    if (dprefix) {
        bool vec = (P * C) % 8 == 0 && (d.N * C) % 8 == 0 && aligned16(dy->data) &&
                   aligned16(dprefix->data);
        dispatch_dtype(dy->dtype, [&](auto tag) {
            using T = TAG_T(tag);
            launch_colsum(ctx, d.B, P * C, vec, PrefixGradRows<T>{(const T *)dy->data, d.N * C},
                          tensor_f32(dprefix));
        });
    }
    if (dx) {
        cuda_check_same_dtype(op, "dx", dx, "dy", dy);
        token_rows<true>(ctx, dy, dx, d.B * N, N, C, d.N, P, N, 0);
    }
}

// ---- token slices ----------------------------------------------------------------------------------

// x (B, N, C) -> y (B, count, C) = x[:, start:start+count]
void cuda_slice_tokens_fwd(Ctx *ctx, const Tensor *x, int start, Tensor *y) {
    const char *op = "slice_tokens_fwd";
    cuda_check_tensor(op, "x", x);
    cuda_check_tensor(op, "y", y);
    TokenDims dx, dy;
    slice_tokens_dims(op, "x", x, "y", y, start, &dx, &dy);
    cuda_check_same_dtype(op, "y", y, "x", x);
    token_rows<false>(ctx, x, y, dy.B * dy.N, dy.N, dy.C, dx.N, (size_t)start, dy.N, 0);
}

// dx[:, start:start+count] += dy
void cuda_slice_tokens_bwd(Ctx *ctx, const Tensor *dy, int start, Tensor *dx) {
    const char *op = "slice_tokens_bwd";
    if (!dx) return;
    cuda_check_tensor(op, "dy", dy);
    cuda_check_tensor(op, "dx", dx);
    TokenDims dX, dd;
    slice_tokens_dims(op, "dx", dx, "dy", dy, start, &dX, &dd);
    cuda_check_same_dtype(op, "dx", dx, "dy", dy);
    token_rows<true>(ctx, dy, dx, dd.B * dd.N, dd.N, dd.C, dd.N, 0, dX.N, (size_t)start);
}

// ---- mean over tokens ---------------------------------------------------------------------------------

// One thread per (b, V channels): adds the N tokens in order.
template <typename T, int V>
__global__ void mean_tokens_fwd_kernel(const T *__restrict__ x, T *__restrict__ y, size_t B,
                                       size_t N, size_t C) {
    size_t i = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) * V;   // over (B, C)
    if (i >= B * C) return;
    size_t b = i / C, c = i % C;
    const T *xb = x + b * N * C + c;
    float s[V];
    #pragma unroll
    for (int j = 0; j < V; j++) s[j] = 0.0f;
    for (size_t n = 0; n < N; n++) {
        float v[V];
        load_v<V>(xb + n * C, v);
        #pragma unroll
        for (int j = 0; j < V; j++) s[j] += v[j];
    }
    #pragma unroll
    for (int j = 0; j < V; j++) s[j] /= (float)N;
    store_v<V>(y + i, s);
}

// x (B, N, C) -> y (B, C)
void cuda_mean_tokens_fwd(Ctx *ctx, const Tensor *x, Tensor *y) {
    const char *op = "mean_tokens_fwd";
    cuda_check_tensor(op, "x", x);
    cuda_check_tensor(op, "y", y);
    const TokenDims d = mean_tokens_dims(op, "x", x, "y", y);
    cuda_check_same_dtype(op, "y", y, "x", x);
    if (y->numel == 0) return;
    bool vec = d.C % 8 == 0 && aligned16(x->data) && aligned16(y->data);
    cudaStream_t s = cuda_stream_of(ctx);
    dispatch_dtype(x->dtype, [&](auto tag) {
        using T = TAG_T(tag);
        if (vec)
            mean_tokens_fwd_kernel<T, 8><<<(unsigned)ceil_div(y->numel / 8, 128), 128, 0, s>>>(
                (const T *)x->data, (T *)y->data, d.B, d.N, d.C);
        else
            mean_tokens_fwd_kernel<T, 1><<<(unsigned)ceil_div(y->numel, 128), 128, 0, s>>>(
                (const T *)x->data, (T *)y->data, d.B, d.N, d.C);
    });
    CUDA_CHECK_LAUNCH();
}

// dx[b, n, c] += dy[b, c] / N
template <typename T> struct MeanTokensBwdOp {
    const T *dy;
    T *dx;
    IndexDiv C, NC;   // C and N*C
    float inv_n;
    template <int V> __device__ void apply(size_t i) const {
        size_t b = NC.div(i), c = C.mod(i);
        float g[V], d[V];
        load_v<V>(dy + b * C.m + c, g);
        load_v<V>(dx + i, d);
        #pragma unroll
        for (int j = 0; j < V; j++) d[j] += g[j] * inv_n;
        store_v<V>(dx + i, d);
    }
};

void cuda_mean_tokens_bwd(Ctx *ctx, const Tensor *dy, Tensor *dx) {
    const char *op = "mean_tokens_bwd";
    if (!dx) return;
    cuda_check_tensor(op, "dx", dx);
    cuda_check_tensor(op, "dy", dy);
    const TokenDims d = mean_tokens_dims(op, "dx", dx, "dy", dy);
    cuda_check_same_dtype(op, "dx", dx, "dy", dy);
    bool vec = d.C % 8 == 0 && aligned16(dy->data) && aligned16(dx->data);
    dispatch_dtype(dx->dtype, [&](auto tag) {
        using T = TAG_T(tag);
        launch_map(ctx, dx->numel, vec,
                   MeanTokensBwdOp<T>{(const T *)dy->data, (T *)dx->data, index_div(d.C, dx->numel),
                                      index_div(d.N * d.C, dx->numel), 1.0f / (float)d.N});
    });
}
