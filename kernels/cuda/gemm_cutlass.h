// Linear layers' GEMMs with a fused epilogue (kernels/cuda/gemm_cutlass.cu, CUTLASS on sm_90): the
// erf GELU, and a product onto the fp32 stream, for kernels/cuda/linear.cu's ops; bf16 row-major
// operands, fp32 accumulation. Each
// returns false, launching nothing, when it does not apply (built without CUTLASS, a GPU other than
// sm_90, a width not a multiple of 8, an unaligned pointer, or a shape CUTLASS refuses): the caller
// then runs its unfused path (or, for the product onto the stream, cuBLASLt's).
#pragma once
#include "cuda_elem.cuh"

// pre (n, m) = x (n, k) w^T + b, rounded; y (n, m) = gelu_erf(pre). w (m, k), b (m); pre NULL:
// not written.
bool cuda_gemm_gelu_erf_fwd(Ctx *ctx, const bf16 *x, const bf16 *w, const bf16 *b, bf16 *pre, bf16 *y,
                            int n, int k, int m);

// y (n, m) = res (n, m) + (x (n, k) w^T + b), res and y fp32 (a linear onto the fp32 residual
// stream), the sum in fp32.
bool cuda_gemm_residual_fwd(Ctx *ctx, const bf16 *x, const bf16 *w, const bf16 *b, const float *res,
                            float *y, int n, int k, int m);

// dpre (n, k) = round(dy (n, m) w (m, k)) * gelu_erf'(pre (n, k)), written.
bool cuda_gemm_dgelu_erf_bwd(Ctx *ctx, const bf16 *dy, const bf16 *w, const bf16 *pre, bf16 *dpre,
                             int n, int m, int k);
