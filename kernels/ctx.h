// Backend context handed to every op: threads on the CPU; stream and library handles on the GPU.
#pragma once
#include "../nn/tensor.h"

typedef struct Ctx {
    Device device;     // where new activations are allocated
    DType act_dtype;   // activation dtype on this device (fp32 on the CPU)
    int deterministic; // 1: reductions in a fixed order (default)
    void *cuda;        // CudaCtx* (kernels/cuda/cuda_ctx.h) when device == DEVICE_CUDA
} Ctx;

// A CPU context. The CUDA one comes from cuda_ctx_create() (kernels/cuda/cuda_ctx.h).
Ctx ctx_cpu(void);
