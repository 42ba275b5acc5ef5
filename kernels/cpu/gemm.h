// Single-precision matrix multiply for the CPU backend (linear, attention, patch embed).
#pragma once

// C = alpha * op(A) op(B) + beta * C, all matrices row-major (last index contiguous):
//   op(A) is (M, K): A itself stored (M, K) with row stride lda >= K when transa == 0,
//                    or A^T with A stored (K, M), lda >= M, when transa != 0;
//   op(B) is (K, N): B stored (K, N), ldb >= N, or B^T with B stored (N, K), ldb >= K;
//   C is (M, N) with row stride ldc >= N.
// beta == 0 overwrites C without reading it (NaN or garbage in C does not leak through).
// K == 0 or alpha == 0 just scales C by beta.
//
// Deterministic: every C element sums its K products in the same order whatever the thread
// count. OpenMP-parallel over tiles of C; called from inside a parallel region (attention's
// loop over batch and heads) it runs on the calling thread. Packing buffers are kept per
// calling thread and grow to the largest call (a few MB at most: rows are blocked).
void cpu_sgemm(int transa, int transb, int M, int N, int K, float alpha,
               const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc);

// The micro-kernel in use ("avx2+fma 6x16" or "baseline 6x16"), for logs and benches.
const char *cpu_sgemm_kernel_name(void);
// Tests only: 1 forces the baseline kernel even where AVX2 is available (results differ only
// by rounding: the AVX2 kernel fuses multiply and add).
void cpu_sgemm_use_baseline(int on);
