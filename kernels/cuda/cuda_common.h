// Shared by every .cu file: the CUDA context and the check macros (each names call, file, line).
#pragma once
#include <stdio.h>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cublasLt.h>
#include "../ctx.h"
#include "../error.h"

// The hint a failed CUDA call gives: a call that a CUDA graph's capture refuses (a wait on the
// host, another stream) names the switch that runs the steps op by op.
static inline const char *cuda_error_hint(cudaError_t e) {
    switch (e) {
    case cudaErrorStreamCaptureUnsupported: case cudaErrorStreamCaptureInvalidated:
    case cudaErrorStreamCaptureImplicit: case cudaErrorStreamCaptureUnjoined:
    case cudaErrorStreamCaptureIsolation: case cudaErrorStreamCaptureUnmatched:
    case cudaErrorStreamCaptureMerge: case cudaErrorStreamCaptureWrongThread:
        return "an op of the step cannot be captured as a CUDA graph: set cuda_graph = 0 to run "
               "the steps op by op";
    default:
        return "check the GPU is visible (nvidia-smi) and has memory";
    }
}

#define CUDA_CHECK(call)                                                                     \
    do {                                                                                     \
        cudaError_t err_ = (call);                                                           \
        if (err_ != cudaSuccess)                                                             \
            cg_fail(__FILE__, __LINE__, cuda_error_hint(err_), "CUDA error %s in %s (%s:%d)", \
                    cudaGetErrorString(err_), #call, __FILE__, __LINE__);                    \
    } while (0)

#define CUBLAS_CHECK(call)                                                                   \
    do {                                                                                     \
        cublasStatus_t st_ = (call);                                                         \
        if (st_ != CUBLAS_STATUS_SUCCESS)                                                    \
            cg_fail(__FILE__, __LINE__, "", "cuBLAS error %d in %s (%s:%d)", (int)st_, #call, \
                    __FILE__, __LINE__);                                                     \
    } while (0)

// Checks the last kernel launch (configuration errors); execution errors surface at the next sync.
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

#define CUDA_SIDE_STREAMS 4
#define CUDA_MAX_RELEASES 8

struct Ctx;
typedef void (*CudaRelease)(struct Ctx *ctx);

typedef struct CudaCtx {
    int device;
    int sm_count;
    int cc;                                    // compute capability, major * 10 + minor (90: H100)
    cudaStream_t stream;                       // the main stream every op runs on
    cudaStream_t side[CUDA_SIDE_STREAMS];      // for concurrent work (the four scan directions)
    cudaEvent_t fork, join[CUDA_SIDE_STREAMS];
    cublasLtHandle_t lt;
    void *workspace;                           // cuBLASLt workspace
    size_t workspace_bytes;
    struct CudaGemmCache *gemm;                // cuBLASLt plans per shape (kernels/cuda/gemm.cu)
    void *attn;                                // CudaAttnState (kernels/cuda/attention.cu), lazily
    CudaRelease releases[CUDA_MAX_RELEASES];   // modules' state to free in cuda_ctx_destroy
    int n_releases;
    void *scratch;                             // cuda_scratch(): grows, never shrinks
    size_t scratch_bytes;
    unsigned long moves;                       // times a growing buffer (the scratch, attention's
                                               // workspace) moved: a graph captured before
                                               // replays the old address (cuda_graph_current)
} CudaCtx;

#ifdef __cplusplus
extern "C" {
#endif
// A context on GPU `device` with its streams and handles; act_dtype as requested.
Ctx cuda_ctx_create(int device, DType act_dtype);
void cuda_ctx_destroy(Ctx *ctx);
// Number of CUDA devices (0 when no driver or GPU).
int cuda_device_count(void);
void *cuda_malloc(size_t bytes);    // checked, names the size on failure
void cuda_free(void *p);
// A module that keeps lazily created state in the context registers its release function once;
// cuda_ctx_destroy calls them in reverse order (so the context links without every module).
void cuda_ctx_on_destroy(Ctx *ctx, CudaRelease release);
// Scratch memory for the op running now (reduction partials, lookup tables): at least `bytes`,
// 256-byte aligned, valid for work queued on the context's main stream until the next
// cuda_scratch call, which may move it. An op asks once per call and carves what it needs.
// Growing frees the old buffer in stream order (cudaFreeAsync), so queued kernels that still
// read it finish first; no cudaMalloc per call.
void *cuda_scratch(Ctx *ctx, size_t bytes);
// A temporary of its own for the op running now (where scratch is taken by what the op calls),
// from the stream-ordered pool on the context's main stream; cuda_temp_free returns it in stream
// order.
void *cuda_temp_alloc(Ctx *ctx, size_t bytes);
void cuda_temp_free(Ctx *ctx, void *p);
// Under compute-sanitizer (CGSPN_SANITIZE=1, which tools/sanitize_gpu.sh sets): zeroes `bytes` at p
// on the context's stream before a library (cuBLASLt, CUTLASS, cuDNN) writes them there. initcheck
// does not see those libraries' stores on Hopper and reports every later read of their outputs
// (the results match the CPU's, so they are written); the zeroing marks the bytes written. A
// no-op otherwise.
void cuda_sanitize_mark_written(Ctx *ctx, void *p, size_t bytes);

// The GPU half of kernels/device.h (kernels/cuda/cuda_ctx.cu, kernels/cuda/cuda_device.cu);
// kernels/device.c routes to them.
void cuda_upload(Ctx *ctx, void *dst, const void *host, size_t bytes);
void cuda_download(Ctx *ctx, void *host, const void *src, size_t bytes);
void cuda_device_props(int device, char *name, size_t name_n, int *sm_count, size_t *total_bytes);
// What the context's device's stream-ordered pool has reserved: now and its high-water mark
// since the last cuda_pool_reset_peak.
void cuda_pool_reserved(const Ctx *ctx, size_t *now, size_t *peak);
void cuda_pool_reset_peak(Ctx *ctx);
void cuda_copy(Ctx *ctx, void *dst, const void *src, size_t bytes);
void cuda_synchronize(Ctx *ctx);
void *cuda_event_create(void);                 // a cudaEvent_t behind a pointer
void cuda_event_record(void *event, Ctx *ctx);
void cuda_event_wait(void *event);
double cuda_event_ms(void *from, void *to);
void cuda_event_destroy(void *event);
void cuda_graph_begin(Ctx *ctx);
void *cuda_graph_end(Ctx *ctx);                 // a cudaGraphExec_t behind a pointer
unsigned long cuda_buffer_moves(const Ctx *ctx); // CudaCtx.moves
void cuda_graph_launch(void *exec, Ctx *ctx);
void cuda_graph_destroy(void *exec);
void *cuda_pinned_alloc(size_t bytes);         // NULL when page-locked memory is not available
bool cuda_pinned_free(void *p);                // false: p is not page-locked (the caller frees it)
#ifdef __cplusplus
}
#endif

static inline CudaCtx *cuda_ctx_of(Ctx *ctx) { return (CudaCtx *)ctx->cuda; }
static inline cudaStream_t cuda_stream_of(Ctx *ctx) { return cuda_ctx_of(ctx)->stream; }
