// The device's copy bandwidth for host-side benches (bench/cuda/kernel_bench.h).
#include "kernel_bench.h"
#include "bench_util.cuh"

double cuda_bench_copy_gbs(void) {
    if (cuda_device_count() == 0) return 0;
    Ctx ctx = cuda_ctx_create(0, DTYPE_BF16);
    double ms, gbs = bench_copy_gbs(&ctx, &ms);
    cuda_ctx_destroy(&ctx);
    return gbs;
}
