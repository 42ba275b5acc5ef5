// CUDA: an MLP onto the fp32 residual stream in one kernel, its hidden activation kept on chip
// (kernels/cuda/mlp_fused.h): y = res + fc2(gelu_erf(fc1(x))), where no backward follows. Apart,
// fc1 + GELU writes the hidden activation (4 C bf16 an element of x) and fc2 reads it back: 16
// bytes an element of C, the largest pass of a gspn_hier block at 56^2. From 28^2 on (C of 192
// and more) the two ops are faster: the sums no longer fit two blocks an SM, and warps that split
// a row group's columns read the weights from L2 twice as often (docs/gspn_hier.md).
//
// A block takes 128 rows (8 warps of 16); two blocks are resident per SM (the warp's sums fit 128
// registers a thread up to 128 channels), so one block's loads of x and stores of y run under the
// other's products. It stages its x rows once, then walks the hidden units
// 64 at a time: fc1's chunk (16 x 64 a warp, m16n8k16 MMAs from x and the chunk of w1, both in
// shared memory), bias, the pre-activation rounded to bf16, the erf GELU (kernels/cuda/gelu.h),
// rounded to bf16 as the unfused path stores h; those values are already the A fragments of fc2's
// chunk (an MMA's accumulator layout is its A layout), so fc2 adds h w2[:, chunk]^T into the
// warp's 16 x C sums in registers. The chunks of w1 and w2 come in by cp.async into two buffers,
// the next while the current one computes, one barrier a chunk. The end: + b2, + res, fp32 out. The values are the unfused path's up to
// the order of the fp32 sums.
#include "mlp_fused.h"
#include "cuda_async.cuh"
#include "gelu.h"
#include "mma.cuh"

namespace {

enum { MLPF_ROWS = 128, MLPF_THREADS = 256, MLPF_CHUNK = 64, MLPF_PAD = 8 };


// Starts copying rows [r0, r0 + n) of a (rows, cols) bf16 matrix, columns [c0, c0 + w), into
// dst (n, w + MLPF_PAD) (16-byte pieces; w a multiple of 8).
__device__ __forceinline__ void stage_rows(bf16 *dst, const bf16 *src, size_t ld, int n, int w) {
    const int pieces = w / 8, ldd = w + MLPF_PAD;
    for (int e = threadIdx.x; e < n * pieces; e += blockDim.x) {
        const int r = e / pieces, p = e - r * pieces;
        cp_async<16>(dst + r * ldd + p * 8, src + (size_t)r * ld + p * 8);
    }
}

// C: the model width (x's and y's columns), H: hidden units (a multiple of MLPF_CHUNK).
template <int C>
__global__ void __launch_bounds__(MLPF_THREADS, 2)
mlp_fused_kernel(const bf16 *__restrict__ x, const bf16 *__restrict__ w1, const bf16 *__restrict__ b1,
                 const bf16 *__restrict__ w2, const bf16 *__restrict__ b2, const float *__restrict__ res,
                 float *__restrict__ y, int n, int H) {
    constexpr int NT = C / 8, KS = C / 16, LDX = C + MLPF_PAD, LDW2 = MLPF_CHUNK + MLPF_PAD;
    extern __shared__ __align__(16) unsigned char mlpf_smem[];
    bf16 *xs = reinterpret_cast<bf16 *>(mlpf_smem);      // (128, C)
    bf16 *w1s = xs + MLPF_ROWS * LDX;                      // 2 x (64, C): w1's rows of the chunk
    bf16 *w2s = w1s + 2 * MLPF_CHUNK * LDX;                // 2 x (C, 64): w2's columns of the chunk
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g4 = lane / 4, t4 = lane % 4;
    const int row0 = blockIdx.x * MLPF_ROWS, rows = min(MLPF_ROWS, n - row0), chunks = H / MLPF_CHUNK;

    // x's rows (past n: zeros, their sums never written), then the first two chunks.
    for (int e = threadIdx.x; e < MLPF_ROWS * (C / 8); e += blockDim.x) {
        const int r = e / (C / 8), p = e - r * (C / 8);
        if (r < rows) cp_async<16>(xs + r * LDX + p * 8, x + (size_t)(row0 + r) * C + p * 8);
        else *reinterpret_cast<uint4 *>(xs + r * LDX + p * 8) = make_uint4(0, 0, 0, 0);
    }
    stage_rows(w1s, w1, C, MLPF_CHUNK, C);
    stage_rows(w2s, w2, H, C, MLPF_CHUNK);
    cp_async_commit();

    float acc[NT][4];   // the warp's 16 rows of fc2's sums: rows g4, g4 + 8 at columns 8 nt + 2 t4
    #pragma unroll
    for (int nt = 0; nt < NT; nt++) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
    const bf16 *xw = xs + warp * 16 * LDX;
    // ldmatrix rows (mma.cuh): A (16 x 16) and two B tiles (n8 x k16)
    const int a_row = lane % 16, a_col = 8 * (lane / 16);
    const int b_row = lane % 8 + 8 * (lane / 16), b_col = 8 * (lane / 8 % 2);

    for (int j = 0; j < chunks; j++) {
        cp_async_wait<0>();
        // chunk j (and, first, x) in shared memory for every warp, and every warp done with chunk
        // j - 1, whose buffer then takes chunk j + 1 while chunk j computes: one barrier a chunk
        __syncthreads();
        if (j + 1 < chunks) {
            const int nb = (j + 1) % 2;
            stage_rows(w1s + nb * MLPF_CHUNK * LDX, w1 + (size_t)(j + 1) * MLPF_CHUNK * C, C, MLPF_CHUNK, C);
            stage_rows(w2s + nb * C * LDW2, w2 + (size_t)(j + 1) * MLPF_CHUNK, H, C, MLPF_CHUNK);
            cp_async_commit();
        }
        const bf16 *w1c = w1s + (j % 2) * MLPF_CHUNK * LDX, *w2c = w2s + (j % 2) * C * LDW2;
        // fc1: h (16 x 64) = x (16 x C) w1c^T, 8 n-tiles of 8 hidden units
        float hacc[8][4];
        #pragma unroll
        for (int t = 0; t < 8; t++) hacc[t][0] = hacc[t][1] = hacc[t][2] = hacc[t][3] = 0.0f;
        #pragma unroll
        for (int ks = 0; ks < KS; ks++) {
            unsigned a[4];
            ldmatrix_x4(a, xw + a_row * LDX + ks * 16 + a_col);
            #pragma unroll
            for (int tp = 0; tp < 4; tp++) {   // two n-tiles a load
                unsigned b[4];
                ldmatrix_x4(b, w1c + (tp * 16 + b_row) * LDX + ks * 16 + b_col);
                mma_16816_bf16(hacc[2 * tp], a[0], a[1], a[2], a[3], b[0], b[1]);
                mma_16816_bf16(hacc[2 * tp + 1], a[0], a[1], a[2], a[3], b[2], b[3]);
            }
        }
        // bias, pre rounded, GELU rounded: the A fragments of fc2's chunk (k-step kk: n-tiles 2kk, 2kk+1)
        unsigned ha[4][4];
        #pragma unroll
        for (int t = 0; t < 8; t++) {
            const int col = j * MLPF_CHUNK + t * 8 + 2 * t4;
            const float bb0 = __bfloat162float(b1[col]), bb1 = __bfloat162float(b1[col + 1]);
            float v[4];
            #pragma unroll
            for (int q = 0; q < 4; q++)
                v[q] = round_bf16(gelu_value<GELU_ERF, true>(round_bf16(hacc[t][q] + (q % 2 ? bb1 : bb0))));
            ha[t / 2][2 * (t % 2)] = Vec<bf16, 8>::pair(v[0], v[1]);       // row g4
            ha[t / 2][2 * (t % 2) + 1] = Vec<bf16, 8>::pair(v[2], v[3]);   // row g4 + 8
        }
        // fc2: acc (16 x C) += h (16 x 64) w2c^T
        #pragma unroll
        for (int kk = 0; kk < 4; kk++)
            #pragma unroll
            for (int tp = 0; tp < NT / 2; tp++) {
                unsigned b[4];
                ldmatrix_x4(b, w2c + (tp * 16 + b_row) * LDW2 + kk * 16 + b_col);
                mma_16816_bf16(acc[2 * tp], ha[kk][0], ha[kk][1], ha[kk][2], ha[kk][3], b[0], b[1]);
                mma_16816_bf16(acc[2 * tp + 1], ha[kk][0], ha[kk][1], ha[kk][2], ha[kk][3], b[2], b[3]);
            }
    }
    // y = res + (acc + b2), fp32
    #pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        const int col = nt * 8 + 2 * t4;
        const float bb0 = __bfloat162float(b2[col]), bb1 = __bfloat162float(b2[col + 1]);
        #pragma unroll
        for (int i = 0; i < 2; i++) {
            const int r = warp * 16 + g4 + 8 * i;
            if (r >= rows) continue;
            const size_t o = (size_t)(row0 + r) * C + col;
            const float2 rv = *reinterpret_cast<const float2 *>(res + o);
            float2 out;
            out.x = rv.x + (acc[nt][2 * i] + bb0);
            out.y = rv.y + (acc[nt][2 * i + 1] + bb1);
            *reinterpret_cast<float2 *>(y + o) = out;
        }
    }
}

template <int C>
bool launch(Ctx *ctx, const bf16 *x, const bf16 *w1, const bf16 *b1, const bf16 *w2, const bf16 *b2,
            const float *res, float *y, int n, int H) {
    constexpr int LDX = C + MLPF_PAD, LDW2 = MLPF_CHUNK + MLPF_PAD;
    const size_t smem = ((size_t)MLPF_ROWS * LDX + 2 * (size_t)MLPF_CHUNK * LDX + 2 * (size_t)C * LDW2) * sizeof(bf16);
    int optin = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, cuda_ctx_of(ctx)->device));
    if (smem > (size_t)optin) return false;
    auto kernel = mlp_fused_kernel<C>;
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    kernel<<<(unsigned)((n + MLPF_ROWS - 1) / MLPF_ROWS), MLPF_THREADS, smem, cuda_stream_of(ctx)>>>(
        x, w1, b1, w2, b2, res, y, n, H);
    CUDA_CHECK_LAUNCH();
    return true;
}

}  // namespace

bool cuda_mlp_fused_fwd(Ctx *ctx, const bf16 *x, const bf16 *w1, const bf16 *b1, const bf16 *w2,
                        const bf16 *b2, const float *res, float *y, int n, int c, int h) {
    if (n <= 0 || !b1 || !b2 || h % MLPF_CHUNK != 0 || cuda_ctx_of(ctx)->cc < 80 || !aligned16(x) ||
        !aligned16(w1) || !aligned16(w2) || !aligned16(res) || !aligned16(y))
        return false;
    switch (c) {
    case 96: return launch<96>(ctx, x, w1, b1, w2, b2, res, y, n, h);
    case 112: return launch<112>(ctx, x, w1, b1, w2, b2, res, y, n, h);
    case 128: return launch<128>(ctx, x, w1, b1, w2, b2, res, y, n, h);
    default: return false;
    }
}
