// Runs the attention benchmark (kernels/cuda/attention.h: cuda_bench_attention) until the CLI has
// `cgspn bench attention`: build/tests/gpu/bench_attention on the GPU machine.
#include "../../kernels/cuda/attention.h"

int main(void) { return cuda_bench_attention(stdout); }
