// GSPN-1's one-direction gate recurrence (NVlabs/GSPN's GateRecurrent2dnoind) on the CPU: raw-
// pointer cores for the C ABI (kernels/cgspn_abi.c), in fp32 and fp64. They check nothing,
// allocate nothing and never exit; callers validate the sizes and own every buffer.
//
// Every (n, c) plane of H x W is scanned left to right along W in runs of `chunk` columns (the
// last run may be shorter), the state restarting at each run's first column:
//   out[h][w] = b[h][w] x[h][w] + g1[h][w] out[h-1][w-1] + g2[h][w] out[h][w-1]
//                               + g3[h][w] out[h+1][w-1],
// out outside the plane or left of the run's first column being 0. Layout: (N, C, H, W), dense,
// element (n, c, h, w) at ((n * C + c) * H + h) * W + w; planes = N * C.
#pragma once
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

// out (planes, H, W) overwritten.
void gate_recurrent_fwd_f32(size_t planes, int H, int W, int chunk, const float *x, const float *b,
                            const float *g1, const float *g2, const float *g3, float *out);
void gate_recurrent_fwd_f64(size_t planes, int H, int W, int chunk, const double *x, const double *b,
                            const double *g1, const double *g2, const double *g3, double *out);

// The gradients of sum(dout * out), added (+=) into dx, db, dg1, dg2, dg3 (each skipped when
// NULL); out is the forward's. dh (planes * H * W) is workspace, overwritten.
void gate_recurrent_bwd_f32(size_t planes, int H, int W, int chunk, const float *x, const float *b,
                            const float *g1, const float *g2, const float *g3, const float *out,
                            const float *dout, float *dh, float *dx, float *db, float *dg1,
                            float *dg2, float *dg3);
void gate_recurrent_bwd_f64(size_t planes, int H, int W, int chunk, const double *x, const double *b,
                            const double *g1, const double *g2, const double *g3, const double *out,
                            const double *dout, double *dh, double *dx, double *db, double *dg1,
                            double *dg2, double *dg3);

#ifdef __cplusplus
}
#endif
