// The depthwise convolution's y / dx pass on tensor cores (kernels/cuda/dwconv_mma.cu), for the
// shapes it covers: bf16 activations and weights, k = 7, images of at least 28 rows and columns,
// C a multiple of 8. kernels/cuda/dwconv.cu calls it first and falls back to its own kernel.
#pragma once
#include "cuda_elem.cuh"
#include "../dwconv_shape.h"

// How the y / dx pass reads its taps and where its result goes (dwconv.cu's kernels take the same).
enum { DW_FLIP = 1, DW_ACCUM = 2, DW_RESID = 4 };

// out (+)= bias + the k x k taps of in (mirrored with DW_FLIP) (+ in with DW_RESID). Returns
// false, launching nothing, when the shape or dtypes are not covered.
bool cuda_dwconv_mma(Ctx *ctx, const bf16 *in, const bf16 *w, const bf16 *bias, bf16 *out,
                     const DwconvShape &d, int flags);
