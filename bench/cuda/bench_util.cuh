// Shared by the CUDA micro-benchmarks that time ops against the copy bandwidth (ops, dwconv):
// filled device tensors, event timing, and the device-to-device copy reference.
#pragma once
#include "../../kernels/cuda/cuda_elem.cuh"

#define BENCH_COPY_BYTES (1ull << 30)

template <typename T>
__global__ void bench_fill_kernel(T *p, size_t n, uint32_t seed, float lo, float hi) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 16;
        h *= 0x85ebca6bu;
        h ^= h >> 13;
        float u = (h >> 8) * (1.0f / 16777216.0f);
        float v = lo + (hi - lo) * u;
        Vec<T, 1>::of(&v).store(p + i);
    }
}

static inline Tensor bench_tensor(Ctx *ctx, size_t rows, int cols, DType dt, uint32_t seed, float lo, float hi) {
    Tensor t;
    memset(&t, 0, sizeof t);
    int shape[2] = {(int)rows, cols};
    tensor_set_shape(&t, cols > 0 ? 2 : 1, shape);
    t.dtype = dt;
    t.device = DEVICE_CUDA;
    t.data = cuda_malloc(tensor_bytes(&t));
    dispatch_dtype(dt, [&](auto tag) {
        using T = TAG_T(tag);
        bench_fill_kernel<T><<<1024, 256, 0, cuda_stream_of(ctx)>>>((T *)t.data, t.numel, seed, lo, hi);
    });
    CUDA_CHECK_LAUNCH();
    return t;
}

// Milliseconds per call of f, after one warm-up call.
template <typename F> static inline double bench_ms(Ctx *ctx, int iters, F f) {
    cudaStream_t s = cuda_stream_of(ctx);
    cudaEvent_t a, b;
    CUDA_CHECK(cudaEventCreate(&a));
    CUDA_CHECK(cudaEventCreate(&b));
    f();
    CUDA_CHECK(cudaStreamSynchronize(s));
    CUDA_CHECK(cudaEventRecord(a, s));
    for (int i = 0; i < iters; i++) f();
    CUDA_CHECK(cudaEventRecord(b, s));
    CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    CUDA_CHECK(cudaEventDestroy(a));
    CUDA_CHECK(cudaEventDestroy(b));
    return ms / iters;
}

// GB/s of a 1 GiB device-to-device cudaMemcpy, counting bytes read and written; *ms its time.
static inline double bench_copy_gbs(Ctx *ctx, double *ms) {
    CudaCtx *c = cuda_ctx_of(ctx);
    void *src = cuda_malloc(BENCH_COPY_BYTES), *dst = cuda_malloc(BENCH_COPY_BYTES);
    CUDA_CHECK(cudaMemsetAsync(src, 1, BENCH_COPY_BYTES, c->stream));
    *ms = bench_ms(ctx, 10, [&] {
        CUDA_CHECK(cudaMemcpyAsync(dst, src, BENCH_COPY_BYTES, cudaMemcpyDeviceToDevice, c->stream));
    });
    cuda_free(src);
    cuda_free(dst);
    return 2.0 * BENCH_COPY_BYTES / (*ms * 1e-3) / 1e9;
}
