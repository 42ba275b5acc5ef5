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
    // of `cgspn bench`. NULL: no calls.
    void (*profile)(struct Ctx *ctx, const char *op, int end, double bytes);
    void *profile_data;  // the profiler's state
} Ctx;

// A CPU context. The CUDA one comes from cuda_ctx_create() (kernels/device.h: device_open_gpu).
Ctx ctx_cpu(void);
