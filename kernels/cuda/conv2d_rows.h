// The stem's second convolution without the column matrix (kernels/cuda/conv2d_rows.cu): conv2d_fwd
// of a channels-last bf16 map, 3x3, stride 2, padding 1, where no backward follows (cols NULL), at
// gspn_t's stem widths (48 -> 96 channels) on images up to 112 columns. kernels/cuda/conv2d.cu
// calls it first and falls back to its column matrix and GEMM; returns false, launching nothing,
// where it does not apply.
#pragma once
#include "cuda_elem.cuh"
#include "../conv2d_shape.h"

// wt: the weight as (Cout, 3, 3, C), the taps-major order of conv2d.cu's channels-last columns.
bool cuda_conv2d_rows(Ctx *ctx, const Conv2dShape &g, int nchw, const Tensor *x, const void *wt,
                      const Tensor *b, Tensor *cols, Tensor *y);
