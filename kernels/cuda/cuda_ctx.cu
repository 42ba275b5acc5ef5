// The CUDA context: device selection, streams, cuBLASLt handle, tensor copies.
#include "cuda_common.h"
#include "../ops.h"
#include "../alloc_count.h"
#include <stdlib.h>
#include <string.h>

extern "C" int cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();   // clear the sticky "no driver" error
        return 0;
    }
    return n;
}

extern "C" void *cuda_malloc(size_t bytes) {
    void *p = NULL;
    cudaError_t err = cudaMalloc(&p, bytes ? bytes : 1);
    if (err != cudaSuccess) {
        size_t free_b = 0, total_b = 0;
        cudaMemGetInfo(&free_b, &total_b);
        cg_fail(__FILE__, __LINE__, "reduce batch_size, or use precision = bf16",
                "cudaMalloc of %.2f GiB failed (%s); %.2f of %.2f GiB free", bytes / 1073741824.0,
                cudaGetErrorString(err), free_b / 1073741824.0, total_b / 1073741824.0);
    }
    alloc_count_add(DEVICE_CUDA, p, bytes ? bytes : 1);
    return p;
}

extern "C" void cuda_free(void *p) {
    if (!p) return;
    alloc_count_remove(DEVICE_CUDA, p);
    CUDA_CHECK(cudaFree(p));
}

// Rounded up to whole MiB and at least doubled, so a sequence of growing requests reallocates
// only a few times.
extern "C" void *cuda_scratch(Ctx *ctx, size_t bytes) {
    CudaCtx *c = cuda_ctx_of(ctx);
    if (bytes <= c->scratch_bytes && c->scratch) return c->scratch;
    size_t want = bytes > 2 * c->scratch_bytes ? bytes : 2 * c->scratch_bytes;
    want = (want + (1u << 20) - 1) / (1u << 20) * (1u << 20);
    if (want == 0) want = 1u << 20;
    if (c->scratch) CUDA_CHECK(cudaFreeAsync(c->scratch, c->stream));
    c->moves++;
    void *p = NULL;
    cudaError_t err = cudaMallocAsync(&p, want, c->stream);
    if (err != cudaSuccess) {
        size_t free_b = 0, total_b = 0;
        cudaMemGetInfo(&free_b, &total_b);
        cg_fail(__FILE__, __LINE__, "reduce batch_size, or use precision = bf16",
                "scratch allocation of %.2f MiB failed (%s); %.2f of %.2f GiB free",
                want / 1048576.0, cudaGetErrorString(err), free_b / 1073741824.0,
                total_b / 1073741824.0);
    }
    c->scratch = p;
    c->scratch_bytes = want;
    return p;
}

extern "C" void *cuda_temp_alloc(Ctx *ctx, size_t bytes) {
    void *p = NULL;
    CUDA_CHECK(cudaMallocAsync(&p, bytes ? bytes : 1, cuda_stream_of(ctx)));
    return p;
}

extern "C" void cuda_temp_free(Ctx *ctx, void *p) { CUDA_CHECK(cudaFreeAsync(p, cuda_stream_of(ctx))); }

extern "C" void cuda_sanitize_mark_written(Ctx *ctx, void *p, size_t bytes) {
    static int on = -1;
    if (on < 0) {
        const char *e = getenv("CGSPN_SANITIZE");
        on = e && e[0] && strcmp(e, "0") != 0;
    }
    if (on && p && bytes) CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, cuda_stream_of(ctx)));
}

extern "C" Ctx cuda_ctx_create(int device, DType act_dtype) {
    CudaCtx *c = (CudaCtx *)cg_calloc(1, sizeof(CudaCtx));
    c->device = device;
    CUDA_CHECK(cudaSetDevice(device));
    CUDA_CHECK(cudaDeviceGetAttribute(&c->sm_count, cudaDevAttrMultiProcessorCount, device));
    int major = 0, minor = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    c->cc = major * 10 + minor;
    CUDA_CHECK(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&c->fork, cudaEventDisableTiming));
    for (int i = 0; i < CUDA_SIDE_STREAMS; i++) {
        CUDA_CHECK(cudaStreamCreateWithFlags(&c->side[i], cudaStreamNonBlocking));
        CUDA_CHECK(cudaEventCreateWithFlags(&c->join[i], cudaEventDisableTiming));
    }
    // The stream-ordered pool (per-op temporaries, cuda_scratch) keeps what it has reserved
    // between steps, as PyTorch's caching allocator does: no allocation from the driver per step,
    // and device_memory_use reads its high-water mark as torch reports peak reserved memory.
    cudaMemPool_t pool;
    CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
    uint64_t keep = UINT64_MAX;
    CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
    CUBLAS_CHECK(cublasLtCreate(&c->lt));
    // CGSPN_GEMM_WORKSPACE_MB: cuBLASLt's workspace (default 32 MiB); the heuristic only offers
    // algorithms (split-k among them) whose workspace fits.
    const char *ws = getenv("CGSPN_GEMM_WORKSPACE_MB");
    c->workspace_bytes = (size_t)(ws && atoi(ws) > 0 ? atoi(ws) : 32) << 20;
    c->workspace = cuda_malloc(c->workspace_bytes);
    Ctx ctx = {DEVICE_CUDA, act_dtype, 1, c};
    return ctx;
}

extern "C" void cuda_ctx_on_destroy(Ctx *ctx, CudaRelease release) {
    CudaCtx *c = cuda_ctx_of(ctx);
    CG_CHECK(c->n_releases < CUDA_MAX_RELEASES, "", "too many CUDA context release hooks");
    c->releases[c->n_releases++] = release;
}

extern "C" void cuda_ctx_destroy(Ctx *ctx) {
    CudaCtx *c = cuda_ctx_of(ctx);
    if (!c) return;
    if (c->scratch) CUDA_CHECK(cudaFreeAsync(c->scratch, c->stream));
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
    for (int i = c->n_releases - 1; i >= 0; i--) c->releases[i](ctx);
    cuda_free(c->workspace);
    cublasLtDestroy(c->lt);
    for (int i = 0; i < CUDA_SIDE_STREAMS; i++) {
        cudaStreamDestroy(c->side[i]);
        cudaEventDestroy(c->join[i]);
    }
    cudaEventDestroy(c->fork);
    cudaStreamDestroy(c->stream);
    free(c);
    ctx->cuda = NULL;
}

extern "C" void cuda_upload(Ctx *ctx, void *dst, const void *host, size_t bytes) {
    CUDA_CHECK(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, cuda_stream_of(ctx)));
    CUDA_CHECK(cudaStreamSynchronize(cuda_stream_of(ctx)));
}

extern "C" void cuda_download(Ctx *ctx, void *host, const void *src, size_t bytes) {
    CUDA_CHECK(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, cuda_stream_of(ctx)));
    CUDA_CHECK(cudaStreamSynchronize(cuda_stream_of(ctx)));
}
