// `cgspn bench gemm`: bf16 linear GEMMs through the CUDA ops (kernels/cuda/gemm_bench.cu), in
// TFLOP/s against the measured H100 bf16 dense peak. Plain C header (no CUDA includes), so the
// CLI can call it.
#pragma once
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif
// Prints one table (device, date, then per shape and product: ms, TFLOP/s, percent of peak) to
// out. Returns 0, or 1 when no GPU is visible.
int cuda_bench_gemm(FILE *out);
#ifdef __cplusplus
}
#endif
