// Helpers for the GPU tests: copies of CPU test tensors on the GPU (fp32 or bf16), results
// back as fp32, and relative-error comparison against the CPU reference.
#pragma once
#include "../testlib.h"
#include "../../kernels/ops.h"
#include "../../kernels/cuda/cuda_common.h"

// Rounds a CPU fp32 tensor's values to bf16 precision in place, so the CPU reference sees
// exactly the inputs the bf16 GPU op sees.
static inline void gpu_test_round_to_bf16(Tensor *t) {
    float *p = t->data;
    for (size_t i = 0; i < t->numel; i++) p[i] = bf16_to_f32(f32_to_bf16(p[i]));
}

// A GPU copy of a CPU fp32 tensor in dtype (values converted); free with gpu_test_free.
static inline Tensor *gpu_test_upload(Ctx *ctx, const Tensor *host, DType dtype) {
    Tensor *d = calloc(1, sizeof(Tensor));
    *d = *host;
    d->grad = NULL;
    d->dtype = dtype;
    d->device = DEVICE_CUDA;
    d->data = cuda_malloc(tensor_bytes(d));
    tensor_upload_f32(ctx, d, host->data);
    return d;
}

// A zeroed GPU tensor of host's shape in dtype.
static inline Tensor *gpu_test_zeros(Ctx *ctx, const Tensor *host, DType dtype) {
    Tensor *d = calloc(1, sizeof(Tensor));
    *d = *host;
    d->grad = NULL;
    d->dtype = dtype;
    d->device = DEVICE_CUDA;
    d->data = cuda_malloc(tensor_bytes(d));
    op_zero(ctx, d);
    return d;
}

// Every byte of a device buffer set to `byte` (0xff: NaN in fp32 and bf16, so an element an op
// fails to write shows), complete before the call returns. The library's stream does not wait
// for the legacy default stream (cudaStreamNonBlocking), so a plain cudaMemset could land after
// the op under test when the GPU is busy: each test memset goes through here.
static inline void gpu_test_memset(void *p, int byte, size_t bytes) {
    CUDA_CHECK(cudaMemset(p, byte, bytes));
    CUDA_CHECK(cudaDeviceSynchronize());
}

static inline void gpu_test_free(Tensor *d) {
    if (!d) return;
    cuda_free(d->data);
    free(d);
}

// Relative error ||gpu - cpu|| / ||cpu|| of a GPU tensor against a CPU fp32 one; printed.
static inline double gpu_test_compare(Ctx *ctx, const char *what, const Tensor *gpu,
                                      const Tensor *cpu) {
    float *h = tensor_to_host_f32(ctx, gpu);
    double err = test_rel_err(h, cpu->data, cpu->numel);
    printf("    %-36s %s rel err %.2e\n", what, dtype_name(gpu->dtype), err);
    free(h);
    return err;
}

// CGSPN_GPU_TEST_SMALL=1 (tools/sanitize_gpu.sh): tests whose full shapes take minutes under
// compute-sanitizer run fewer, smaller shapes that still reach every kernel path.
static inline bool gpu_test_small(void) {
    const char *s = getenv("CGSPN_GPU_TEST_SMALL");
    return s && s[0] && strcmp(s, "0") != 0;
}

// Fails the calling test when no GPU is visible: make test-gpu is meant for a GPU machine,
// and a GPU test that passes without one would prove nothing.
#define GPU_TEST_REQUIRE_DEVICE()                                                        \
    do {                                                                                 \
        if (cuda_device_count() == 0) fail_msg("no CUDA device visible (make test-gpu "  \
                                               "runs on a GPU machine)");                \
    } while (0)
