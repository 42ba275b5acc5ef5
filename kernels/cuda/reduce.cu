// The last step of every deterministic whole-tensor reduction (losses, sumsq): per-block or
// per-row fp32 partials, written by the op's first kernel in scratch, are added here by one
// block in double, in a fixed order, so a result is bitwise the same on every run.
#include "cuda_elem.cuh"

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

// Column sums of a (parts, width) fp32 partial matrix. Block (32, SUMP_PHASES): thread (x, y)
// adds parts y, y + SUMP_PHASES, ... of column blockIdx.x * 32 + x in order, in double; the
// phases are then added in order. Columns below n0 go to out0, the rest to out1 (either may be
// NULL: not wanted).
enum { SUMP_PHASES = 16 };

__global__ void sum_partials_kernel(const float *part, unsigned parts, size_t width, size_t n0,
                                    float *out0, float *out1) {
    __shared__ double sm[SUMP_PHASES][32];
    size_t i = (size_t)blockIdx.x * 32 + threadIdx.x;
    double s = 0;
    if (i < width)
        for (unsigned k = threadIdx.y; k < parts; k += SUMP_PHASES) s += (double)part[(size_t)k * width + i];
    sm[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y != 0 || i >= width) return;
    double t = sm[0][threadIdx.x];
    for (int y = 1; y < SUMP_PHASES; y++) t += sm[y][threadIdx.x];
    float *o = i < n0 ? (out0 ? out0 + i : nullptr) : (out1 ? out1 + (i - n0) : nullptr);
    if (o) *o += (float)t;
}

void cuda_sum_partials(Ctx *ctx, const float *part, unsigned parts, size_t width, size_t n0,
                       float *out0, float *out1) {
    if (width == 0) return;
    dim3 block(32, SUMP_PHASES);
    sum_partials_kernel<<<(unsigned)ceil_div(width, 32), block, 0, cuda_stream_of(ctx)>>>(
        part, parts, width, n0, out0, out1);
    CUDA_CHECK_LAUNCH();
}
