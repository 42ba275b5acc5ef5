// The depthwise convolution on small images (kernels/cuda/dwconv_plane.cu), images of at most
// DWP_MAX_SIDE rows and columns (gspn_hier's 14 x 14 and 7 x 7 stages), C a multiple of 8: the
// mixer's 7x7 (bf16 activations and weights) and the LPU's 3x3 (fp32 activations). A block stages
// a whole image's channel group in shared memory once and every thread works from there.
// kernels/cuda/dwconv.cu calls these before the tensor-core pass and its own kernels.
#pragma once
#include "dwconv_mma.h"   // the DW_* flags and dw_silu

enum { DWP_MAX_SIDE = 16 };

// out (+)= bias + the k x k taps of in (mirrored with DW_FLIP) (+ in with DW_RESID), the flags as
// for cuda_dwconv_mma. Returns false, launching nothing, when the shape or dtypes are not covered
// (7x7: bf16 in and w; 3x3: fp32 in).
template <typename T, typename TW>
bool cuda_dwconv_plane(Ctx *ctx, const T *in, const TW *w, const TW *bias, T *out, const DwconvShape &d,
                       int flags);

// dw (+)= the 7 x 7 taps' gradient, db (+)= dy's sums (either NULL: skipped), bf16 dy and in;
// deterministic. Returns false, launching nothing, when the shape is not covered.
bool cuda_dwconv_plane_dw(Ctx *ctx, const bf16 *dy, const bf16 *in, const DwconvShape &d,
                          float *dw, float *db);

// The 3x3 backward in one pass over dy and in (fp32): dx (= or += with DW_ACCUM; + dy with
// DW_RESID), dw += and db += (either NULL: skipped); deterministic. Returns false, launching
// nothing, when the shape or dtypes are not covered.
template <typename T, typename TW>
bool cuda_dwconv_plane_bwd(Ctx *ctx, const T *dy, const T *in, const TW *w, T *dx, const DwconvShape &d,
                           int flags, float *dw, float *db);
