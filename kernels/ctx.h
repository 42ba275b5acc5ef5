// Backend context handed to every op: threads on the CPU; stream and library handles on the GPU.
#pragma once
#include "tensor.h"

typedef struct Ctx {
    Device device;     // where new activations are allocated
    DType act_dtype;   // activation dtype on this device (fp32 on the CPU)
    int deterministic; // 1: reductions in a fixed order (default)
    void *cuda;        // CudaCtx* (kernels/device.h: device_open_gpu) when device == DEVICE_CUDA
    // Optional: called by kernels/dispatch.c before (end = 0) and after (end = 1) every op_*, with
    // the op's name and the bytes of its tensor arguments (each non-NULL tensor once; an output
    // that is added into is read and written, so those are counted short) for the per-op profile
    // of `cgspn bench`. NULL: no calls. Between the two, an op whose kernels multiply matrices
    // may report those products' FLOPs (end = CTX_PROFILE_FLOPS, op NULL, the FLOPs in `bytes`):
    // ctx_profile_flops.
    void (*profile)(struct Ctx *ctx, const char *op, int end, double bytes);
    void *profile_data;  // the profiler's state
} Ctx;

enum { CTX_PROFILE_FLOPS = 2 };
// Reports flops for the op being profiled (nothing without a profiler).
static inline void ctx_profile_flops(Ctx *ctx, double flops) {
    if (ctx->profile) ctx->profile(ctx, 0, CTX_PROFILE_FLOPS, flops);
}

// A CPU context. The CUDA one comes from cuda_ctx_create() (kernels/device.h: device_open_gpu).
Ctx ctx_cpu(void);
