// The stem's convolution without the column GEMM (kernels/cuda/conv2d_stem.cu): conv2d_fwd
// straight from an NCHW image of 1, 3 or 4 channels under a 3x3 kernel, Cout a multiple of 8 (up
// to 64), and conv2d_bwd's dw and db when no dx is asked (an image's). kernels/cuda/conv2d.cu
// calls them first and falls back to its column matrix and GEMMs.
#pragma once
#include "cuda_elem.cuh"
#include "../conv2d_shape.h"

// With nchw (the op's layout flag): y (rows, Cout) = the windows of x times w (Cout, C k k) + b
// (b may be NULL); y, w and b of one dtype, x of that dtype or fp32 (rounded to w's dtype first,
// as the columns would be); cols (rows, C k k), when not NULL, receives the windows in the NCHW
// column order (conv2d.cu's). Returns false, launching nothing, when the shape is not covered.
// post non-NULL: y = gelu(layernorm(conv)) (the norm alone when post->gelu is 0), as
// conv2d_fwd, layernorm_fwd and gelu_fwd (erf) write them in turn, to the bit: bf16 w, cols NULL,
// post's fp32 w and b 16-byte aligned; else false, launching nothing.
typedef struct StemNormGelu {
    const float *w, *b;
    float eps;
    int gelu;
} StemNormGelu;
bool cuda_conv2d_stem(Ctx *ctx, const Conv2dShape &g, int nchw, const Tensor *x, const Tensor *w,
                      const Tensor *b, const StemNormGelu *post, Tensor *cols, Tensor *y);

// dw (+)= dy^T cols and db (+)= dy's column sums (either may be NULL) for the shapes
// cuda_conv2d_stem takes, from its columns; deterministic. Returns false, launching nothing, when
// the shape is not covered.
bool cuda_conv2d_stem_dw(Ctx *ctx, const Conv2dShape &g, int nchw, const Tensor *dy, const Tensor *cols,
                         Tensor *dw, Tensor *db);
