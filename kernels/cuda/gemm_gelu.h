// The erf GELU fused into a linear layer's GEMM (kernels/cuda/gemm_gelu.cu, CUTLASS on sm_90),
// for kernels/cuda/linear.cu's erf-GELU ops; bf16 row-major tensors, fp32 accumulation. Each
// returns false, launching nothing, when it does not apply (built without CUTLASS, a GPU other than
// sm_90, a width not a multiple of 8, an unaligned pointer, or a shape CUTLASS refuses): the caller
// then runs its unfused path.
#pragma once
#include "cuda_elem.cuh"

// pre (n, m) = x (n, k) w^T + b, rounded; y (n, m) = gelu_erf(pre). w (m, k), b (m); pre NULL:
// not written.
bool cuda_gemm_gelu_erf_fwd(Ctx *ctx, const bf16 *x, const bf16 *w, const bf16 *b, bf16 *pre, bf16 *y,
                            int n, int k, int m);

// dpre (n, k) = round(dy (n, m) w (m, k)) * gelu_erf'(pre (n, k)), written.
bool cuda_gemm_dgelu_erf_bwd(Ctx *ctx, const bf16 *dy, const bf16 *w, const bf16 *pre, bf16 *dpre,
                             int n, int m, int k);
