// The depthwise convolution on small images (kernels/cuda/dwconv_plane.cu), images of at most
// DWP_MAX_SIDE rows and columns (gspn_hier's 14 x 14 and 7 x 7 stages), C a multiple of 8: the
// mixer's 7x7 (bf16 activations and weights) and the LPU's 3x3 (fp32 activations). A block stages
// a whole image's channel group in shared memory once and every thread works from there; the
// LPU's backward stages tiles of rows the same way, on images of any height.
// kernels/cuda/dwconv.cu calls these before the tensor-core pass and its own kernels.
#pragma once
#include "dwconv_mma.h"   // the DW_* flags and dw_silu

enum { DWP_MAX_SIDE = 16 };
// The 3x3 backward's widest rows: it stages tiles of rows (any height), a thread a column.
enum { DWP_BWD_MAX_W = 128 };

// dwconv_fwd's added input as the fp32 kernels read it (dwconv.cu's rows kernel and the plane
// kernel below): the input is x' = x + u uw^T + ub (narrow_dot.cuh: linear_fwd's bits onto res),
// u (B,H,W,DW_ADDED_K), uw (C,DW_ADDED_K), ub (C) or NULL; x' also goes to mid when it is set.
// The kernels take the proxy width of every gspn_hier model (2); dwconv.cu runs any other width as
// the two ops.
enum { DW_ADDED_K = 2 };
template <typename TW> struct DwAdded {
    const TW *u, *w, *b;   // u NULL: no added input
    float *mid;
};

// Blocks of `threads` threads and `smem` bytes for a grid of `groups` channel groups: as many per
// group as fit on the SMs at once (each block then loops over images, staging the next while it
// computes the current one), at most one per image.
template <typename Kern>
static inline unsigned dwp_image_blocks(Ctx *ctx, Kern kernel, int threads, size_t smem, int groups, int B) {
    if (smem > 48 * 1024)
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    int per_sm = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
    const long resident = (long)cuda_ctx_of(ctx)->sm_count * (per_sm > 0 ? per_sm : 1);
    long per_group = resident / groups;   // one wave: a second, partial one would idle most SMs
    if (per_group > B) per_group = B;
    if (per_group > 65535) per_group = 65535;
    return (unsigned)(per_group > 0 ? per_group : 1);
}

// out (+)= bias + the k x k taps of in (mirrored with DW_FLIP) (+ in with DW_RESID), the flags as
// for cuda_dwconv_mma; in is x' when add.u is set (fp32 in only). Returns false, launching nothing, when the shape or dtypes are not covered
// (7x7: bf16 in and w; 3x3: fp32 in).
template <typename T, typename TW>
bool cuda_dwconv_plane(Ctx *ctx, const T *in, const TW *w, const TW *bias, T *out, const DwconvShape &d,
                       int flags, const DwAdded<TW> &add);

// The mixer's 7x7 y / dx pass on tensor cores (kernels/cuda/dwconv_plane_mma.cu): bf16 in, w and
// bias, at most 16 rows and 9 to 16 columns, C a multiple of 8, flags as for cuda_dwconv_mma;
// with proj, the down projection's partial sums instead of out (as cuda_dwconv_mma's). Returns
// false, launching nothing, when the shape is not covered (cuda_dwconv_plane calls it first).
bool cuda_dwconv_plane_mma(Ctx *ctx, const bf16 *in, const bf16 *w, const bf16 *bias, bf16 *out,
                           const DwconvShape &d, int flags, DwProj *proj = nullptr);

// Its dw and db on tensor cores, for the same shapes: dw (+)= the 7 x 7 taps' gradient, db (+)=
// dy's sums (either NULL: skipped), deterministic. Returns false, launching nothing, when the shape
// is not covered.
bool cuda_dwconv_plane_mma_dw(Ctx *ctx, const bf16 *dy, const bf16 *in, const DwconvShape &d, float *dw,
                              float *db);

// The mixer's 7x7 on 7 x 7 images, a thread per channel and image (kernels/cuda/dwconv_image7.cu):
// bf16 in, w and bias, any C, flags as for cuda_dwconv_mma (with proj, as cuda_dwconv_mma's:
// its partial sums instead of out, C a multiple of 32, no DW_ACCUM); and its dw and db, as
// cuda_dwconv_plane_dw. They return false, launching nothing, on other shapes (cuda_dwconv_plane
// and cuda_dwconv_plane_dw call them first).
bool cuda_dwconv_image7(Ctx *ctx, const bf16 *in, const bf16 *w, const bf16 *bias, bf16 *out,
                        const DwconvShape &d, int flags, DwProj *proj = nullptr);
bool cuda_dwconv_image7_dw(Ctx *ctx, const bf16 *dy, const bf16 *in, const DwconvShape &d, float *dw,
                           float *db);

// The backward in one pass over dy and in, for the same shapes: dx = the mirrored taps of dy (flags:
// DW_FLIP, DW_RESID; written, not added to), dw and db as above. Returns false, launching nothing,
// when the shape or flags are not covered.
bool cuda_dwconv_plane_mma_bwd(Ctx *ctx, const bf16 *dy, const bf16 *in, const bf16 *w, bf16 *dx,
                               const DwconvShape &d, int flags, float *dw, float *db);

// dw (+)= the 7 x 7 taps' gradient, db (+)= dy's sums (either NULL: skipped), bf16 dy and in;
// deterministic. Returns false, launching nothing, when the shape is not covered.
bool cuda_dwconv_plane_dw(Ctx *ctx, const bf16 *dy, const bf16 *in, const DwconvShape &d,
                          float *dw, float *db);

// The 3x3 backward in one pass over dy and in (fp32), on rows of at most DWP_BWD_MAX_W columns
// (gspn_hier's LPUs at every stage): dx (= or += with DW_ACCUM; + dy with DW_RESID), dw += and
// db += (either NULL: skipped); deterministic. Returns false, launching nothing, when the shape or
// dtypes are not covered.
template <typename T, typename TW>
bool cuda_dwconv_plane_bwd(Ctx *ctx, const T *dy, const T *in, const TW *w, T *dx, const DwconvShape &d,
                           int flags, float *dw, float *db);
