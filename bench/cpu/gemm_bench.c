// GFLOP/s of cpu_sgemm on the shapes of the Fashion-MNIST ViT (128 images x 49 tokens = 6272
// rows, width 64, MLP 256, qkv 192), forward and both backward products of linear.
// Build and run: make build/bench/cpu/gemm_bench && ./build/bench/cpu/gemm_bench   (OMP_NUM_THREADS=n;
// GEMM_BASELINE=1 measures the non-AVX2 fallback kernel)
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include "../../kernels/cpu/gemm.h"

static double now_s(void) { return omp_get_wtime(); }

static void bench(const char *what, int ta, int tb, int M, int N, int K) {
    int lda = ta ? M : K, ldb = tb ? K : N;
    float *A = malloc(sizeof(float) * (size_t)M * K), *B = malloc(sizeof(float) * (size_t)K * N);
    float *C = malloc(sizeof(float) * (size_t)M * N);
    for (size_t i = 0; i < (size_t)M * K; i++) A[i] = (float)(i % 13) * 0.01f;
    for (size_t i = 0; i < (size_t)K * N; i++) B[i] = (float)(i % 7) * 0.02f;
    cpu_sgemm(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C, N);   // warm up (buffers, clones)
    int reps = 0;
    double t0 = now_s(), t = 0;
    while (t < 1.0) {
        cpu_sgemm(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 1.0f, C, N);
        reps++;
        t = now_s() - t0;
    }
    double gflops = 2.0 * M * N * K * reps / t / 1e9;
    printf("%-34s ta=%d tb=%d M=%5d N=%5d K=%5d  %7.3f ms  %6.1f GFLOP/s\n", what, ta, tb, M, N,
           K, 1e3 * t / reps, gflops);
    free(A);
    free(B);
    free(C);
}

int main(void) {
    if (getenv("GEMM_BASELINE")) cpu_sgemm_use_baseline(1);
    printf("threads: %d, kernel: %s\n", omp_get_max_threads(), cpu_sgemm_kernel_name());
    bench("qkv fwd   x(6272,64) w(192,64)^T", 0, 1, 6272, 192, 64);
    bench("fc2 fwd   x(6272,256) w(64,256)^T", 0, 1, 6272, 64, 256);
    bench("fc1 fwd   x(6272,64) w(256,64)^T", 0, 1, 6272, 256, 64);
    bench("qkv dx    dy(6272,192) w(192,64)", 0, 0, 6272, 64, 192);
    bench("fc2 dx    dy(6272,64) w(64,256)", 0, 0, 6272, 256, 64);
    bench("qkv dw    dy^T(192,6272) x(6272,64)", 1, 0, 192, 64, 6272);
    bench("fc2 dw    dy^T(64,6272) x(6272,256)", 1, 0, 64, 256, 6272);
    bench("square    (1024,1024)x(1024,1024)", 0, 0, 1024, 1024, 1024);
    return 0;
}
