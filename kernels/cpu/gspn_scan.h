// C-GSPN propagation on the CPU: raw-pointer cores shared by the op (kernels/cpu/gspn_scan.c,
// cpu_gspn_scan_fwd/bwd on Tensors) and the C ABI (kernels/cgspn_abi.c, fp32 and fp64).
//
// The cores are written once (kernels/cpu/gspn_scan_impl.h) and compiled for float (_f32) and
// double (_f64). They check nothing, allocate nothing and never exit: callers validate the shapes
// and own every buffer. Layouts are those of kernels/ops.h; plane = B*H*W*Cc elements.
#pragma once
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

enum { GSPN_TB, GSPN_BT, GSPN_LR, GSPN_RL, GSPN_DIRS };

// Sizes and the gate layout of ops.h. Within a token's gates, direction d's block starts at
// d * block and holds lam (Cc) | u (Cc) | raw weights; the raw weight wt_k of channel c is at
// 2*Cc + (k+1) * wk_stride + c * wc_stride.
typedef struct GspnShape {
    int B, H, W, Cc, G;
    int block;                 // gates per direction
    int wk_stride, wc_stride;  // per channel: Cc, 1; shared: 1, 0
} GspnShape;

// The layout for these sizes (no checks: G = 20*Cc or 4*(2*Cc+3) must fit an int).
GspnShape gspn_shape_make(int B, int H, int W, int Cc, int shared_w);

// h (4, B,H,W, Cc) of the four scans.
void gspn_core_hidden_f32(const GspnShape *sh, const float *xc, const float *gates, float *h);
void gspn_core_hidden_f64(const GspnShape *sh, const double *xc, const double *gates, double *h);

// yc (B,H,W,Cc) = sum_d m_d u_d h_d (overwritten), h (4*plane) receives the scans.
void gspn_core_fwd_f32(const GspnShape *sh, const float *xc, const float *gates,
                       const float *merge, float *yc, float *h);
void gspn_core_fwd_f64(const GspnShape *sh, const double *xc, const double *gates,
                       const double *merge, double *yc, double *h);

// Accumulates (+=) into dxc (plane), dgates (B*H*W*G), dmerge (4), each skipped when NULL.
// h is the forward's (4*plane). Workspace: dh (4*plane, overwritten), dmerge_part (4*B).
void gspn_core_bwd_f32(const GspnShape *sh, const float *dyc, const float *xc,
                       const float *gates, const float *merge, const float *h, float *dh,
                       double *dmerge_part, float *dxc, float *dgates, float *dmerge);
void gspn_core_bwd_f64(const GspnShape *sh, const double *dyc, const double *xc,
                       const double *gates, const double *merge, const double *h, double *dh,
                       double *dmerge_part, double *dxc, double *dgates, double *dmerge);

#ifdef __cplusplus
}
#endif
