// A channels-last bf16 3x3 stride-2 convolution as nine tap products on warpgroup MMAs, without the
// column matrix (kernels/cuda/conv2d_taps.cu): conv2d_fwd where no backward follows (cols NULL), of
// at most 64 input channels (a multiple of 8) into 96, 112 or 128 outputs: the second stem
// convolution at widths 112 and 128 (56 -> 112; 64 -> 128, gspn_s's and gspn_b's). kernels/cuda/conv2d.cu calls it before its
// column matrix and GEMM; it returns false, launching nothing, where it does not apply (another
// shape, an unaligned pointer, a GPU other than sm_90, a build without CUTLASS).
#pragma once
#include "cuda_elem.cuh"
#include "../conv2d_shape.h"

// wt: the weight as (Cout, 3, 3, C), the taps-major order of conv2d.cu's channels-last columns.
bool cuda_conv2d_taps(Ctx *ctx, const Conv2dShape &g, int nchw, const Tensor *x, const void *wt,
                      const Tensor *b, Tensor *cols, Tensor *y);
