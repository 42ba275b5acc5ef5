// The stem's second convolution at gspn_s's and gspn_b's widths on warpgroup MMAs, without the
// column matrix (kernels/cuda/conv2d_taps.h). Through the columns, 64 -> 128 channels at 112^2
// (batch 128) writes and reads back 9 C bf16 values an output pixel, 0.46 GB, and took 0.49 ms;
// its input and output are 0.31 GB. A 3x3 stride-2 convolution is nine products, one a tap: for
// tap (ky, kx), output pixel (yo, xo) times input pixel (2 yo + ky - 1, 2 xo + kx - 1), K = the C
// input channels (zero-padded to 64), N = Cout.
//
// A block stays resident (one an SM) with the weight in shared memory, tap by tap (Cout x 64, the
// core-matrix layout of kernels/cuda/wgmma_core.cuh), and walks tiles of 128 output pixels (rows
// of y): two warpgroups of 64 pixels, each tap's four m64nCoutk16 products into 64 x Cout fp32
// sums. A tap's A operand is its 128 input pixels' channels, gathered by cp.async 16 bytes a piece
// (zeros in the padding and past C) through L1 (the nine taps read each input line about 2.25
// times; through L2 alone it ran at 77% of L2's throughput, Nsight Compute on an H100, and at 38%
// with L1 hitting half of them) into one of STAGES buffers, two taps ahead of the products:
// the buffer of tap q - 2 is refilled once every warp has waited on that tap's products, while tap
// q - 1's may still run. After the ninth tap: + bias, rounded once to bf16, as the column path
// rounds its GEMM's sums (here in another order).
#include "conv2d_taps.h"

#ifdef CGSPN_HAVE_CUTLASS

#include "cuda_async.cuh"
#include "wgmma_core.cuh"
#include <utility>

namespace {

enum { TAPS_M = 128, TAPS_THREADS = 256, TAPS_K = 64, TAPS_STAGES = 4, TAPS = 9 };

namespace gmma = cute::SM90::GMMA;
template <int CO> struct TapsOp;   // 64 x Cout x 16, both operands from shared memory
template <> struct TapsOp<112> { using T = gmma::MMA_64x112x16_F32BF16BF16_SS<gmma::Major::K, gmma::Major::K>; };
template <> struct TapsOp<128> { using T = gmma::MMA_64x128x16_F32BF16BF16_SS<gmma::Major::K, gmma::Major::K>; };

template <int CO, size_t... I>
__device__ __forceinline__ void taps_mma(uint64_t da, uint64_t db, float (&d)[sizeof...(I)], gmma::ScaleOut scale,
                                         std::index_sequence<I...>) {
    TapsOp<CO>::T::fma(da, db, d[I]..., scale);
}

// A thread's four pixels of a tile (its pieces of a tap's buffer: rows r0 + 32 i, piece p = its
// channels 8 p .. 8 p + 7): where the pixel's window starts (image offset in elements, top-left
// input row and column), or none past the last row of y.
struct TapsPixels {
    long long img[4];
    int y0[4], x0[4];
};

__device__ __forceinline__ void taps_pixels(const Conv2dShape &g, long long tile, int r0, TapsPixels &px) {
    #pragma unroll
    for (int i = 0; i < 4; i++) {
        const long long row = tile * TAPS_M + r0 + 32 * i;
        if (row >= (long long)g.rows) {
            px.img[i] = 0, px.y0[i] = -1 << 20, px.x0[i] = 0;   // every tap out of the image: zeros
            continue;
        }
        const int xo = (int)(row % g.Wo);
        const long long bh = row / g.Wo;
        px.img[i] = bh / g.Ho * g.sb;
        px.y0[i] = (int)(bh % g.Ho) * 2 - 1;
        px.x0[i] = xo * 2 - 1;
    }
}

// Tap (ky, kx)'s A operand of the tile into buf (128 x 64, core-matrix layout).
template <int C>
__device__ __forceinline__ void taps_gather(const bf16 *__restrict__ x, const Conv2dShape &g, const TapsPixels &px,
                                            int tap, int r0, int p, bf16 *buf) {
    const int ky = tap / 3, kx = tap % 3;
    #pragma unroll
    for (int i = 0; i < 4; i++) {
        const int yi = px.y0[i] + ky, xi = px.x0[i] + kx, r = r0 + 32 * i;
        const bool in = p < C / 8 && yi >= 0 && yi < g.H && xi >= 0 && xi < g.W;
        const bf16 *src = in ? x + px.img[i] + ((long long)yi * g.W + xi) * C + 8 * p : x;
        cp_async_or_zero<true>(buf + core_at(r, 8 * p, TAPS_K), src, in);
    }
}

// C input channels (a multiple of 8, at most 64), CO outputs. wt (CO, 3, 3, C), bias CO values.
template <int C, int CO>
__global__ void __launch_bounds__(TAPS_THREADS, 1)
conv2d_taps_kernel(const bf16 *__restrict__ x, const bf16 *__restrict__ wt, const bf16 *__restrict__ bias,
                   bf16 *__restrict__ y, Conv2dShape g) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int WTAP = CO * TAPS_K, ABUF = TAPS_M * TAPS_K, NT = CO / 8;
    extern __shared__ __align__(128) unsigned char taps_smem[];
    bf16 *ws = reinterpret_cast<bf16 *>(taps_smem);   // (9, CO, 64)
    bf16 *as = ws + TAPS * WTAP;                        // (STAGES, 128, 64)
    float *sb = reinterpret_cast<float *>(as + TAPS_STAGES * ABUF);
    const int wg = threadIdx.x / 128, warp = threadIdx.x % 128 / 32, lane = threadIdx.x % 32;
    const int g4 = lane / 4, t4 = lane % 4;
    const int r0 = threadIdx.x / 64 * 8 + threadIdx.x % 8, p = threadIdx.x / 8 % 8;   // its pieces
    const long long tiles = ((long long)g.rows + TAPS_M - 1) / TAPS_M;
    const long long my_tiles = blockIdx.x < tiles ? (tiles - 1 - blockIdx.x) / gridDim.x + 1 : 0;
    const long long total = my_tiles * TAPS;   // taps this block multiplies

    // the weight, zeros past C (one commit group with the first tap's gather)
    for (int e = threadIdx.x; e < TAPS * CO * 8; e += TAPS_THREADS) {
        const int tap = e / (CO * 8), n = e / 8 % CO, q = e % 8;
        cp_async_or_zero(ws + tap * WTAP + core_at(n, 8 * q, TAPS_K),
                         q < C / 8 ? wt + ((size_t)n * TAPS + tap) * C + 8 * q : wt, q < C / 8);
    }
    for (int o = threadIdx.x; o < CO; o += TAPS_THREADS) sb[o] = __bfloat162float(bias[o]);

    // the gathers run TAPS_STAGES - 2 taps ahead of the products: tap gq of tile gt
    TapsPixels px;
    long long gq = 0;
    int gtap = 0;
    taps_pixels(g, blockIdx.x, r0, px);
    auto gather_next = [&]() {
        if (gq < total) {
            taps_gather<C>(x, g, px, gtap, r0, p, as + gq % TAPS_STAGES * ABUF);
            if (++gtap == TAPS) {
                gtap = 0;
                if (gq + 1 < total) taps_pixels(g, blockIdx.x + (gq + 1) / TAPS * gridDim.x, r0, px);
            }
        }
        gq++;
        cp_async_commit();
    };
    for (int s = 0; s < TAPS_STAGES - 2; s++) gather_next();

    float acc[NT * 4];   // the warpgroup's 64 x CO sums: n-tile t, rows g4 and g4 + 8 of the warp's 16
    #pragma unroll
    for (int i = 0; i < NT * 4; i++) acc[i] = 0.0f;
    fence_regs(acc);
    int tap = 0;
    long long tile = blockIdx.x;
    for (long long q = 0; q < total; q++) {
        cp_async_wait<TAPS_STAGES - 3>();   // this thread's pieces of tap q
        cute::warpgroup_wait<1>();          // tap q - 2's products: its buffer is free
        fence_async_shared();
        __syncthreads();                    // every thread's pieces of tap q in, every warp past q - 2
        gather_next();                      // tap q + STAGES - 2 into the buffer of q - 2
        const unsigned adesc = core_desc_lo(as + q % TAPS_STAGES * ABUF + wg * 64 * TAPS_K);
        const unsigned bdesc = core_desc_lo(ws + tap * WTAP);
        fence_regs(acc);
        cute::warpgroup_arrive();
        #pragma unroll
        for (int ks = 0; ks < TAPS_K / 16; ks++)
            taps_mma<CO>(core_desc<TAPS_K>(adesc + 16 * ks), core_desc<TAPS_K>(bdesc + 16 * ks), acc,
                         tap || ks ? gmma::ScaleOut::One : gmma::ScaleOut::Zero, std::make_index_sequence<NT * 4>{});
        cute::warpgroup_commit_batch();
        if (++tap < TAPS) continue;
        // the tile's nine taps: + bias, rounded once, out as bf16 pairs
        tap = 0;
        cute::warpgroup_wait<0>();
        fence_regs(acc);
        #pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            const int col = nt * 8 + 2 * t4;
            #pragma unroll
            for (int i = 0; i < 2; i++) {
                const long long row = tile * TAPS_M + wg * 64 + warp * 16 + g4 + 8 * i;
                if (row >= (long long)g.rows) continue;
                *reinterpret_cast<__nv_bfloat162 *>(y + row * CO + col) =
                    __floats2bfloat162_rn(acc[4 * nt + 2 * i] + sb[col], acc[4 * nt + 2 * i + 1] + sb[col + 1]);
            }
        }
        fence_regs(acc);
        tile += gridDim.x;
    }
    cute::warpgroup_wait<0>();
#endif
}

template <int C, int CO>
bool launch(Ctx *ctx, const Conv2dShape &g, const bf16 *x, const bf16 *wt, const bf16 *b, bf16 *y) {
    const size_t smem = ((size_t)TAPS * CO * TAPS_K + (size_t)TAPS_STAGES * TAPS_M * TAPS_K) * sizeof(bf16) +
                        CO * sizeof(float);
    auto kernel = conv2d_taps_kernel<C, CO>;
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    const long long tiles = ((long long)g.rows + TAPS_M - 1) / TAPS_M, sms = cuda_ctx_of(ctx)->sm_count;
    kernel<<<(unsigned)(tiles < sms ? tiles : sms), TAPS_THREADS, smem, cuda_stream_of(ctx)>>>(x, wt, b, y, g);
    CUDA_CHECK_LAUNCH();
    return true;
}

}  // namespace

bool cuda_conv2d_taps(Ctx *ctx, const Conv2dShape &g, int nchw, const Tensor *x, const void *wt,
                      const Tensor *b, Tensor *cols, Tensor *y) {
    if (nchw || cols || !b || g.k != 3 || g.s != 2 || g.p != 1 || x->dtype != DTYPE_BF16 ||
        y->dtype != DTYPE_BF16 || b->dtype != DTYPE_BF16 || cuda_ctx_of(ctx)->cc != 90 || g.rows == 0 ||
        !aligned16(x->data) || !aligned16(wt) || !aligned16(y->data))
        return false;
    const bf16 *xd = (const bf16 *)x->data, *wd = (const bf16 *)wt, *bd = (const bf16 *)b->data;
    bf16 *yd = (bf16 *)y->data;
    if (g.C == 56 && g.Cout == 112) return launch<56, 112>(ctx, g, xd, wd, bd, yd);
    if (g.C == 64 && g.Cout == 128) return launch<64, 128>(ctx, g, xd, wd, bd, yd);
    return false;
}

#else   // built without CUTLASS, or not for sm_90a: the caller takes the columns

bool cuda_conv2d_taps(Ctx *, const Conv2dShape &, int, const Tensor *, const void *, const Tensor *, Tensor *,
                      Tensor *) {
    return false;
}

#endif
