// Until `cgspn bench gemm` exists: the bf16 GEMM benchmark alone (kernels/cuda/gemm_bench.cu).
#include <stdio.h>
#include "../kernels/cuda/gemm_bench.h"

int main(void) { return cuda_bench_gemm(stdout); }
