// GSPN-1's gate recurrence (NVlabs/GSPN's GateRecurrent2dnoind) on the GPU
// (kernels/cuda/gate_recurrent.cu): C-callable launchers over raw device pointers, for the C ABI
// (kernels/cgspn_abi.c). The definition, the layout (N, C, H, W) and the CPU reference are
// kernels/cpu/gate_recurrent.h; planes = N * C.
//
// Element type fp32 or bf16, computed in fp32 (the state is not rounded between columns; bf16
// outputs are rounded to nearest even once). Every buffer is memory of the current device; the
// work is queued on `stream` (nothing allocated, nothing synchronized). Callers validate the
// pointers and sizes; the launchers refuse only what the kernels cannot take.
#pragma once
#include <stddef.h>
#include <cuda_runtime.h>
#include "../tensor.h"

// Rows of a plane the kernels take at most: a block's thread owns one row, or two past 1024.
#define GR_CUDA_MAX_ROWS 2048

#ifdef __cplusplus
extern "C" {
#endif
// out (planes, H, W) overwritten. Returns cudaSuccess; cudaErrorInvalidValue, launching nothing,
// for H > GR_CUDA_MAX_ROWS or a size < 1; else the launch's error (cudaGetLastError).
cudaError_t cuda_gate_recurrent_fwd(DType dtype, size_t planes, int H, int W, int chunk,
                                    const void *x, const void *b, const void *g1, const void *g2,
                                    const void *g3, void *out, cudaStream_t stream);

// The gradients of sum(dout * out), out being the forward's: each of dx, db, dg1, dg2, dg3
// written (accumulate = 0) or added into (accumulate = 1), skipped when NULL. Each element has one
// writer: deterministic, no atomics. Returns as cuda_gate_recurrent_fwd does.
cudaError_t cuda_gate_recurrent_bwd(DType dtype, size_t planes, int H, int W, int chunk,
                                    const void *dout, const void *x, const void *b, const void *g1,
                                    const void *g2, const void *g3, const void *out, int accumulate,
                                    void *dx, void *db, void *dg1, void *dg2, void *dg3,
                                    cudaStream_t stream);
#ifdef __cplusplus
}
#endif
