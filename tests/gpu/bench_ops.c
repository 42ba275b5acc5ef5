// Bandwidth of the memory-bound CUDA ops (kernels/cuda/ops_bench.cu) on the GPU present:
//   make build/tests/gpu/bench_ops && ./build/tests/gpu/bench_ops
#include <stdio.h>
#include "../../kernels/cuda/cuda_common.h"

int main(void) { return cuda_bench_ops(stdout); }
