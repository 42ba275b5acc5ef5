// GELU passes over raw device buffers, for ops that fuse a GELU with something else
// (kernels/cuda/linear.cu: the erf GELU beside a GEMM). Same formulas as the gelu ops
// (kernels/cuda/gelu.cu, kernels/cpu/gelu.c), fp32 math, 16-byte accesses where aligned.
#pragma once
#include <stddef.h>
#include "../ops.h"

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
