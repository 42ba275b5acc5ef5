// The 7x7 depthwise convolution on small images (kernels/cuda/dwconv_plane.cu): bf16 activations
// and weights, images of at most DWP_MAX_SIDE rows and columns (gspn_hier's 14 x 14 and 7 x 7
// stages), C a multiple of 8. A block stages a whole image's channel group in shared memory once
// and every thread works from there. kernels/cuda/dwconv.cu calls these before the tensor-core
// pass and its own kernels.
#pragma once
#include "dwconv_mma.h"   // the DW_* flags and dw_silu

enum { DWP_MAX_SIDE = 16 };

// out (+)= bias + the 7 x 7 taps of in (mirrored with DW_FLIP) (+ in with DW_RESID), the flags as
// for cuda_dwconv_mma. Returns false, launching nothing, when the shape is not covered.
bool cuda_dwconv_plane(Ctx *ctx, const bf16 *in, const bf16 *w, const bf16 *bias, bf16 *out,
                       const DwconvShape &d, int flags);

// dw (+)= the 7 x 7 taps' gradient, db (+)= dy's sums (either NULL: skipped), deterministic.
// Returns false, launching nothing, when the shape is not covered.
bool cuda_dwconv_plane_dw(Ctx *ctx, const bf16 *dy, const bf16 *in, const DwconvShape &d,
                          float *dw, float *db);
