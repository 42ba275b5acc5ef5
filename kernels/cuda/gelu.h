// GELU's formulas (kernels/cpu/gelu.c's, in the same fp32 operations), for every CUDA kernel that
// evaluates one, and GELU passes over raw device buffers, for ops that fuse a GELU with something
// else (kernels/cuda/linear.cu: the erf GELU beside a GEMM); 16-byte accesses where aligned.
#pragma once
#include <stddef.h>
#include "../ops.h"

#ifdef __CUDACC__
#define GELU_SQRT1_2     0.70710678118654752f   // 1 / sqrt(2)
#define GELU_INV_SQRT2PI 0.39894228040143268f   // 1 / sqrt(2 pi)
#define GELU_SQRT2_PI    0.79788456080286536f   // sqrt(2 / pi)
#define GELU_TANH_C      0.044715f

template <GeluKind K> __device__ __forceinline__ float gelu_value(float x) {
    if (K == GELU_ERF) return 0.5f * x * (1.0f + erff(x * GELU_SQRT1_2));
    float u = GELU_SQRT2_PI * (x + GELU_TANH_C * x * x * x);
    return 0.5f * x * (1.0f + tanhf(u));
}

// dy/dx: erf:  Phi(x) + x phi(x); tanh: 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 c x^2).
template <GeluKind K> __device__ __forceinline__ float gelu_slope(float x) {
    if (K == GELU_ERF)
        return 0.5f * (1.0f + erff(x * GELU_SQRT1_2)) + x * GELU_INV_SQRT2PI * expf(-0.5f * x * x);
    float u = GELU_SQRT2_PI * (x + GELU_TANH_C * x * x * x);
    float t = tanhf(u);
    return 0.5f * (1.0f + t) +
           0.5f * x * (1.0f - t * t) * GELU_SQRT2_PI * (1.0f + 3.0f * GELU_TANH_C * x * x);
}
#endif

#ifdef __cplusplus
extern "C" {
#endif
// y = gelu(pre), n elements of dtype dt on the context's stream; y may be pre (in place).
void cuda_gelu_apply(Ctx *ctx, GeluKind kind, DType dt, const void *pre, void *y, size_t n);
// g = g * gelu'(pre), in place (written, not accumulated); g and pre of dtype dt.
void cuda_dgelu_scale(Ctx *ctx, GeluKind kind, DType dt, const void *pre, void *g, size_t n);
#ifdef __cplusplus
}
#endif
