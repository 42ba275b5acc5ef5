// CUDA: softmax over the last dim (kernels/ops.h; CPU reference kernels/cpu/softmax.c). One warp
// per row: one pass finds the row's max and sum of exp (online, merged across lanes in a fixed
// butterfly), a second writes exp(x - max) / sum. Backward from the saved output y.
#include "cuda_elem.cuh"

enum { SOFTMAX_WARPS = 8 };

template <typename T, int V>
__global__ void __launch_bounds__(SOFTMAX_WARPS * 32)
softmax_fwd_kernel(const T *__restrict__ x, T *__restrict__ y, size_t N, int C) {
    size_t row = (size_t)blockIdx.x * SOFTMAX_WARPS + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= N) return;
    const T *xr = x + row * C;
    T *yr = y + row * C;
    float m = -INFINITY, s = 0.0f;
    for (int c = lane * V; c < C; c += 32 * V) {
        float v[V], pm = -INFINITY, ps = 0.0f;
        load_v<V>(xr + c, v);
        #pragma unroll
        for (int j = 0; j < V; j++) pm = fmaxf(pm, v[j]);
        #pragma unroll
        for (int j = 0; j < V; j++) ps += expf(v[j] - pm);
        lse_merge(m, s, pm, ps);
    }
    warp_lse(m, s);
    float inv = 1.0f / s;
    for (int c = lane * V; c < C; c += 32 * V) {
        float v[V];
        load_v<V>(xr + c, v);
        #pragma unroll
        for (int j = 0; j < V; j++) v[j] = expf(v[j] - m) * inv;
        store_v<V>(yr + c, v);
    }
}

// dx += y * (dy - sum_c dy * y)
template <typename T, int V>
__global__ void __launch_bounds__(SOFTMAX_WARPS * 32)
softmax_bwd_kernel(const T *__restrict__ dy, const T *__restrict__ y, T *__restrict__ dx,
                   size_t N, int C) {
    size_t row = (size_t)blockIdx.x * SOFTMAX_WARPS + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= N) return;
    size_t off = row * C;
    float dot = 0.0f;
    for (int c = lane * V; c < C; c += 32 * V) {
        float g[V], p[V];
        load_v<V>(dy + off + c, g);
        load_v<V>(y + off + c, p);
        #pragma unroll
        for (int j = 0; j < V; j++) dot += g[j] * p[j];
    }
    dot = warp_sum(dot);
    for (int c = lane * V; c < C; c += 32 * V) {
        float g[V], p[V], d[V];
        load_v<V>(dy + off + c, g);
        load_v<V>(y + off + c, p);
        load_v<V>(dx + off + c, d);
        #pragma unroll
        for (int j = 0; j < V; j++) d[j] += p[j] * (g[j] - dot);
        store_v<V>(dx + off + c, d);
    }
}

void cuda_softmax_fwd(Ctx *ctx, const Tensor *x, Tensor *y) {
    cuda_check_tensor("softmax_fwd", "x", x);
    cuda_check_numel("softmax_fwd", "y", y, x->numel);
    cuda_check_same_dtype("softmax_fwd", "y", y, "x", x);
    int C = tensor_last(x);
    size_t N = tensor_rows(x);
    if (N == 0) return;
    bool vec = C % 8 == 0 && aligned16(x->data) && aligned16(y->data);
    unsigned blocks = (unsigned)ceil_div(N, SOFTMAX_WARPS);
    cudaStream_t s = cuda_stream_of(ctx);
    dispatch_dtype(x->dtype, [&](auto tag) {
        using T = TAG_T(tag);
        if (vec) softmax_fwd_kernel<T, 8><<<blocks, SOFTMAX_WARPS * 32, 0, s>>>((const T *)x->data, (T *)y->data, N, C);
        else softmax_fwd_kernel<T, 1><<<blocks, SOFTMAX_WARPS * 32, 0, s>>>((const T *)x->data, (T *)y->data, N, C);
    });
    CUDA_CHECK_LAUNCH();
}

void cuda_softmax_bwd(Ctx *ctx, const Tensor *dy, const Tensor *y, Tensor *dx) {
    if (!dx) return;
    cuda_check_tensor("softmax_bwd", "y", y);
    cuda_check_numel("softmax_bwd", "dy", dy, y->numel);
    cuda_check_numel("softmax_bwd", "dx", dx, y->numel);
    cuda_check_same_dtype("softmax_bwd", "dy", dy, "y", y);
    cuda_check_same_dtype("softmax_bwd", "dx", dx, "y", y);
    int C = tensor_last(y);
    size_t N = tensor_rows(y);
    if (N == 0) return;
    bool vec = C % 8 == 0 && aligned16(dy->data) && aligned16(y->data) && aligned16(dx->data);
    unsigned blocks = (unsigned)ceil_div(N, SOFTMAX_WARPS);
    cudaStream_t s = cuda_stream_of(ctx);
    dispatch_dtype(y->dtype, [&](auto tag) {
        using T = TAG_T(tag);
        if (vec)
            softmax_bwd_kernel<T, 8><<<blocks, SOFTMAX_WARPS * 32, 0, s>>>(
                (const T *)dy->data, (const T *)y->data, (T *)dx->data, N, C);
        else
            softmax_bwd_kernel<T, 1><<<blocks, SOFTMAX_WARPS * 32, 0, s>>>(
                (const T *)dy->data, (const T *)y->data, (T *)dx->data, N, C);
    });
    CUDA_CHECK_LAUNCH();
}
