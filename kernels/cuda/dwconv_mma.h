// The depthwise convolution on tensor cores (kernels/cuda/dwconv_mma.cu), for the shapes it
// covers: the y / dx pass for bf16 activations and weights, k = 7, images of at least 28 rows and
// columns, C a multiple of 8; the dw / db pass for bf16 activations, k = 7, C a multiple of 8.
// kernels/cuda/dwconv.cu calls them first and falls back to its own kernels.
#pragma once
#include "cuda_elem.cuh"
#include "../dwconv_shape.h"

// How the y / dx pass reads its taps and where its result goes (dwconv.cu's kernels take the same).
enum { DW_FLIP = 1, DW_ACCUM = 2, DW_RESID = 4 };

// out (+)= bias + the k x k taps of in (mirrored with DW_FLIP) (+ in with DW_RESID). Returns
// false, launching nothing, when the shape or dtypes are not covered.
bool cuda_dwconv_mma(Ctx *ctx, const bf16 *in, const bf16 *w, const bf16 *bias, bf16 *out,
                     const DwconvShape &d, int flags);

// dw (+)= the k x k taps' gradient, db (+)= dy's sums (either NULL: skipped), from dy and in (B, H,
// W, C) bf16; deterministic. Returns false, launching nothing, when the shape is not covered.
bool cuda_dwconv_mma_dw(Ctx *ctx, const bf16 *dy, const bf16 *in, const DwconvShape &d, float *dw,
                        float *db);
