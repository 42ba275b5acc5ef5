// `make bench-gspn`: runs cuda_bench_gspn until `cgspn bench gspn` calls it.
#include "../kernels/cuda/gspn_bench.h"

int main(void) { return cuda_bench_gspn(stdout); }
