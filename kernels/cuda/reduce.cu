// The last step of every deterministic whole-tensor reduction (losses, sumsq): per-block or
// per-row fp32 partials, written by the op's first kernel in scratch, are added here by one
// block in double, in a fixed order, so a result is bitwise the same on every run.
#include "cuda_colsum.cuh"

enum { FINISH_THREADS = 1024 };

// out[0] (+)= scale * sum part[0..n): thread t adds part[t], part[t + 1024], ... in order, then
// the block tree adds the threads.
__global__ void finish_sum_kernel(const float *part, size_t n, double scale, float *out,
                                  int accumulate) {
    double s = 0;
    for (size_t i = threadIdx.x; i < n; i += blockDim.x) s += (double)part[i];
    s = block_sum(s);
    if (threadIdx.x == 0) out[0] = (accumulate ? out[0] : 0.0f) + (float)(s * scale);
}

void cuda_finish_sum(Ctx *ctx, const float *part, size_t n, double scale, float *out,
                     bool accumulate) {
    finish_sum_kernel<<<1, FINISH_THREADS, 0, cuda_stream_of(ctx)>>>(part, n, scale, out,
                                                                     accumulate ? 1 : 0);
    CUDA_CHECK_LAUNCH();
}

// One thread per column; the ranges are added in order, in double.
__global__ void colsum_finish_kernel(const float *partial, unsigned splits, size_t P, float *out) {
    size_t c = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (c >= P) return;
    double s = 0;
    for (unsigned k = 0; k < splits; k++) s += (double)partial[(size_t)k * P + c];
    out[c] += (float)s;
}

void cuda_colsum_finish(Ctx *ctx, const float *partial, unsigned splits, size_t P, float *out) {
    colsum_finish_kernel<<<(unsigned)ceil_div(P, 256), 256, 0, cuda_stream_of(ctx)>>>(partial, splits,
                                                                                    P, out);
    CUDA_CHECK_LAUNCH();
}
