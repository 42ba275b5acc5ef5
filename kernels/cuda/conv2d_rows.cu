// The stem's second convolution on tensor cores without the column matrix (kernels/cuda/conv2d_rows.h).
// Through the columns, a 3x3 stride-2 convolution of 48 channels writes 9 C = 432 bf16 values a
// output pixel and reads them back (3.4x the input, at 112^2 x 48: 0.39 ms of gspn_t's 7.4 ms
// inference against a 0.08 ms roofline). Here a block stays resident (one an SM) with the weight
// in shared memory (conv2d.cu's taps-major copy, padded to a pitch of 9 C + 8: ldmatrix without
// bank conflicts) and walks tiles of two output rows: the tile's five input rows are copied in
// once (cp.async, the next tile's while the current one computes), split by column parity so that
// a stride-2 window's pixels are consecutive (pitch C + 8: ldmatrix without bank conflicts), and
// each warp makes 16 output pixels x Cout by m16n8k16 MMAs whose A fragments ldmatrix gathers
// straight from the rows: k = (tap, channel), 16 channels of one tap a step. The sums are fp32 in
// another order than the GEMM's, + bias, rounded once to bf16, as the column path rounds them.
#include "conv2d_rows.h"
#include "cuda_async.cuh"
#include "mma.cuh"

namespace {

enum { ROWS_THREADS = 224, ROWS_WARPS = 7, ROWS_MAX_W = 112 };

// The geometry of a tile buffer: 5 input rows x 2 column parities x (W / 2 + 1) x (C + 8).
template <int C> struct RowsTile {
    static constexpr int PITCH = C + 8, IDX = ROWS_MAX_W / 2 + 1, ELEMS = 5 * 2 * IDX * PITCH;
    // input row r of the tile, column s = xcol + 1 (0: the left padding)
    static __device__ __forceinline__ int at(int r, int s) { return ((r * 2 + (s & 1)) * IDX + (s >> 1)) * PITCH; }
};

// The five input rows 4 hp - 1 .. 4 hp + 3 of image b into buf, columns s = 0 .. 2 Wo (input
// columns -1 .. 2 Wo - 1); rows and columns past the image as zeros (the padding). cp.async 16
// bytes a piece (the caller commits).
template <int C>
__device__ void rows_stage(const bf16 *__restrict__ x, const Conv2dShape &g, int b, int hp, bf16 *buf) {
    using Tl = RowsTile<C>;
    constexpr int PIECES = C / 8;
    const int per_row = (2 * g.Wo + 1) * PIECES;
    for (int e = threadIdx.x; e < 5 * per_row; e += ROWS_THREADS) {
        const int r = e / per_row, q = e % per_row, s = q / PIECES, p = q % PIECES;
        const int xr = 4 * hp - 1 + r;
        bf16 *dst = buf + Tl::at(r, s) + p * 8;
        if (s == 0 || s > g.W || xr < 0 || xr >= g.H) *reinterpret_cast<uint4 *>(dst) = make_uint4(0, 0, 0, 0);
        else cp_async<16>(dst, x + (((size_t)b * g.H + xr) * g.W + (s - 1)) * C + p * 8);
    }
}

template <int C, int COUT>
__global__ void __launch_bounds__(ROWS_THREADS, 1)
conv2d_rows_kernel(const bf16 *__restrict__ x, const bf16 *__restrict__ wt_g, const bf16 *__restrict__ bias,
                   bf16 *__restrict__ y, Conv2dShape g) {
    using Tl = RowsTile<C>;
    constexpr int K = 9 * C, WP = K + 8, NT = COUT / 8;   // WP: the weight's row pitch (no bank conflicts)
    extern __shared__ __align__(16) unsigned char rows_smem[];
    bf16 *wt = reinterpret_cast<bf16 *>(rows_smem);   // (COUT, WP)
    bf16 *tiles = wt + COUT * WP;                      // 2 tile buffers
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g4 = lane / 4, t4 = lane % 4;
    const int pairs = (g.Ho + 1) / 2, ntiles = g.B * pairs;

    for (int e = threadIdx.x; e < COUT * (K / 8); e += ROWS_THREADS) {
        const int n = e / (K / 8), p = e % (K / 8);
        cp_async<16>(wt + n * WP + p * 8, wt_g + (size_t)n * K + p * 8);
    }
    int tile = blockIdx.x, cur = 0;
    if (tile < ntiles) rows_stage<C>(x, g, tile / pairs, tile % pairs, tiles);
    cp_async_commit();

    // this lane's ldmatrix rows: pixel p of the tile (A: row lane % 16, k half lane / 16)
    const int pa = warp * 16 + lane % 16, pclamp = pa < 2 * g.Wo ? pa : 2 * g.Wo - 1;
    const int orow = pclamp / g.Wo, wo = pclamp % g.Wo, khalf = 8 * (lane / 16);
    // B: n row lane % 8 + 8 (lane / 16), k half 8 (lane / 8 % 2)
    const int nb = lane % 8 + 8 * (lane / 16), kb = 8 * (lane / 8 % 2);
    for (; tile < ntiles; tile += gridDim.x) {
        const int next = tile + gridDim.x;
        if (next < ntiles) rows_stage<C>(x, g, next / pairs, next % pairs, tiles + (cur ^ 1) * Tl::ELEMS);
        cp_async_commit();
        cp_async_wait<1>();   // the weight and this tile are in
        __syncthreads();
        const bf16 *buf = tiles + cur * Tl::ELEMS;
        float acc[NT][4];
        #pragma unroll
        for (int nt = 0; nt < NT; nt++)
            #pragma unroll
            for (int i = 0; i < 4; i++) acc[nt][i] = 0.0f;
        if (warp * 16 < 2 * g.Wo) {
            #pragma unroll
            for (int tap = 0; tap < 9; tap++) {
                const int ky = tap / 3, kx = tap % 3;
                const bf16 *arow = buf + Tl::at(2 * orow + ky, 2 * wo + kx) + khalf;
                #pragma unroll
                for (int c0 = 0; c0 < C; c0 += 16) {
                    unsigned a[4];
                    ldmatrix_x4(a, arow + c0);
                    const bf16 *brow = wt + nb * WP + tap * C + c0 + kb;
                    #pragma unroll
                    for (int np = 0; np < NT / 2; np++) {
                        unsigned bw[4];
                        ldmatrix_x4(bw, brow + np * 16 * WP);
                        mma_16816_bf16(acc[2 * np], a[0], a[1], a[2], a[3], bw[0], bw[1]);
                        mma_16816_bf16(acc[2 * np + 1], a[0], a[1], a[2], a[3], bw[2], bw[3]);
                    }
                }
            }
        }
        // + bias, rounded to bf16: rows g4 and g4 + 8 of the warp's 16 pixels
        const int b = tile / pairs, hp = tile % pairs;
        #pragma unroll
        for (int i = 0; i < 2; i++) {
            const int p = warp * 16 + g4 + 8 * i, ho = 2 * hp + p / g.Wo;
            if (p >= 2 * g.Wo || ho >= g.Ho) continue;
            bf16 *yp = y + (((size_t)b * g.Ho + ho) * g.Wo + p % g.Wo) * COUT + 2 * t4;
            #pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                const float b0 = bias ? __bfloat162float(bias[nt * 8 + 2 * t4]) : 0.0f;
                const float b1 = bias ? __bfloat162float(bias[nt * 8 + 2 * t4 + 1]) : 0.0f;
                *reinterpret_cast<unsigned *>(yp + nt * 8) =
                    Vec<bf16, 8>::pair(acc[nt][2 * i] + b0, acc[nt][2 * i + 1] + b1);
            }
        }
        __syncthreads();   // every warp done with this buffer before it takes the tile after next
        cur ^= 1;
    }
}

template <int C, int COUT>
void launch_rows(Ctx *ctx, const Conv2dShape &g, const bf16 *x, const bf16 *wt, const bf16 *b, bf16 *y) {
    constexpr int K = 9 * C;
    const size_t smem = (size_t)COUT * (K + 8) * sizeof(bf16) + 2 * (size_t)RowsTile<C>::ELEMS * sizeof(bf16);
    auto kernel = conv2d_rows_kernel<C, COUT>;
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    const int ntiles = g.B * ((g.Ho + 1) / 2), sms = cuda_ctx_of(ctx)->sm_count;
    kernel<<<(unsigned)(ntiles < sms ? ntiles : sms), ROWS_THREADS, smem, cuda_stream_of(ctx)>>>(x, wt, b, y, g);
    CUDA_CHECK_LAUNCH();
}

}  // namespace

bool cuda_conv2d_rows(Ctx *ctx, const Conv2dShape &g, int nchw, const Tensor *x, const void *wt,
                      const Tensor *b, Tensor *cols, Tensor *y) {
    if (nchw || cols || g.k != 3 || g.s != 2 || g.p != 1 || x->dtype != DTYPE_BF16 || y->dtype != DTYPE_BF16 ||
        g.W > ROWS_MAX_W || 2 * g.Wo > ROWS_WARPS * 16 || g.rows == 0 || cuda_ctx_of(ctx)->cc < 80 ||
        !aligned16(x->data) || !aligned16(wt) || ((uintptr_t)y->data & 3) != 0)
        return false;
    if (g.C == 48 && g.Cout == 96) {
        launch_rows<48, 96>(ctx, g, (const bf16 *)x->data, (const bf16 *)wt,
                            b ? (const bf16 *)b->data : nullptr, (bf16 *)y->data);
        return true;
    }
    return false;
}
