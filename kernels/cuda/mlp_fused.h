// An MLP onto the fp32 residual stream in one kernel (kernels/cuda/mlp_fused.cu), where no backward
// follows: y (n, c) = res + (gelu_erf(x w1^T + b1) w2^T + b2), x (n, c), w1 (h, c), w2 (c, h), b1, b2
// bf16, res and y fp32; the pre-activation and GELU's output rounded to bf16 as the unfused ops
// store them. Returns false, launching nothing, where it does not apply (c not one of gspn_t/s/b's
// widths at 56^2 and 28^2: 96, 112, 128, 192, 224, 256; h not a multiple of 64; an unaligned pointer; a GPU other than
// sm_90, or a build without CUTLASS): the caller runs the two ops.
// norm non-NULL (x then unused): x is layernorm(res) with its fp32 w and b (both given, 16-byte
// aligned), rounded to bf16: layernorm_fwd's values to the bit.
#pragma once
#include "cuda_elem.cuh"

typedef struct MlpFusedNorm {
    const float *w, *b;
    float eps;
} MlpFusedNorm;

bool cuda_mlp_fused_fwd(Ctx *ctx, const bf16 *x, const MlpFusedNorm *norm, const bf16 *w1,
                        const bf16 *b1, const bf16 *w2, const bf16 *b2, const float *res, float *y,
                        int n, int c, int h);
