// The GPU half of the device interface (kernels/device.h): facts about the GPU, copies on the
// context's stream, timing events and page-locked host memory.
#include "cuda_common.h"
#include <string.h>

extern "C" void cuda_device_props(int device, char *name, size_t name_n, int *sm_count,
                                  size_t *total_bytes) {
    struct cudaDeviceProp p;
    CUDA_CHECK(cudaGetDeviceProperties(&p, device));
    snprintf(name, name_n, "%s", p.name);
    *sm_count = p.multiProcessorCount;
    *total_bytes = p.totalGlobalMem;
}

static cudaMemPool_t default_pool(const Ctx *ctx) {
    cudaMemPool_t pool;
    CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, ((const CudaCtx *)ctx->cuda)->device));
    return pool;
}

extern "C" void cuda_pool_reserved(const Ctx *ctx, size_t *now, size_t *peak) {
    cudaMemPool_t pool = default_pool(ctx);
    uint64_t cur = 0, high = 0;
    CUDA_CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &cur));
    CUDA_CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemHigh, &high));
    *now = (size_t)cur;
    *peak = (size_t)high;
}

// The high-water mark can only be set to 0, which the pool takes as "from now".
extern "C" void cuda_pool_reset_peak(Ctx *ctx) {
    uint64_t zero = 0;
    CUDA_CHECK(cudaMemPoolSetAttribute(default_pool(ctx), cudaMemPoolAttrReservedMemHigh, &zero));
}

extern "C" void cuda_copy(Ctx *ctx, void *dst, const void *src, size_t bytes) {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, cuda_stream_of(ctx)));
}

extern "C" void cuda_synchronize(Ctx *ctx) { CUDA_CHECK(cudaStreamSynchronize(cuda_stream_of(ctx))); }

extern "C" void *cuda_event_create(void) {
    cudaEvent_t e;
    CUDA_CHECK(cudaEventCreate(&e));
    return (void *)e;
}

extern "C" void cuda_event_record(void *event, Ctx *ctx) {
    CUDA_CHECK(cudaEventRecord((cudaEvent_t)event, cuda_stream_of(ctx)));
}

extern "C" void cuda_event_wait(void *event) { CUDA_CHECK(cudaEventSynchronize((cudaEvent_t)event)); }

extern "C" double cuda_event_ms(void *from, void *to) {
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, (cudaEvent_t)from, (cudaEvent_t)to));
    return ms;
}

extern "C" void cuda_event_destroy(void *event) { CUDA_CHECK(cudaEventDestroy((cudaEvent_t)event)); }

// Thread-local capture: another thread's CUDA calls (the loader's uploads) do not invalidate it.
// The side streams join through the fork/join events the ops already record.
extern "C" void cuda_graph_begin(Ctx *ctx) {
    CUDA_CHECK(cudaStreamBeginCapture(cuda_stream_of(ctx), cudaStreamCaptureModeThreadLocal));
}

extern "C" void *cuda_graph_end(Ctx *ctx) {
    cudaGraph_t graph = NULL;
    cudaError_t err = cudaStreamEndCapture(cuda_stream_of(ctx), &graph);
    if (err != cudaSuccess)
        cg_fail(__FILE__, __LINE__, "an op in the captured pass waited on the host or used another "
                "stream; set cuda_graph = 0 to run the steps op by op",
                "cudaStreamEndCapture failed (%s)", cudaGetErrorString(err));
    cudaGraphExec_t exec = NULL;
    CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    CUDA_CHECK(cudaGraphDestroy(graph));
    return (void *)exec;
}

extern "C" unsigned long cuda_buffer_moves(const Ctx *ctx) {
    return ((const CudaCtx *)ctx->cuda)->moves;
}

extern "C" void cuda_graph_launch(void *exec, Ctx *ctx) {
    CUDA_CHECK(cudaGraphLaunch((cudaGraphExec_t)exec, cuda_stream_of(ctx)));
}

extern "C" void cuda_graph_destroy(void *exec) { CUDA_CHECK(cudaGraphExecDestroy((cudaGraphExec_t)exec)); }

extern "C" void *cuda_pinned_alloc(size_t bytes) {
    void *p = NULL;
    if (cuda_device_count() > 0 && cudaMallocHost(&p, bytes) == cudaSuccess) return p;
    (void)cudaGetLastError();
    return NULL;
}

extern "C" bool cuda_pinned_free(void *p) {
    struct cudaPointerAttributes a;
    if (p && cuda_device_count() > 0 && cudaPointerGetAttributes(&a, p) == cudaSuccess &&
        a.type == cudaMemoryTypeHost) {
        CUDA_CHECK(cudaFreeHost(p));
        return true;
    }
    (void)cudaGetLastError();   // not page-locked: it came from malloc
    return false;
}
