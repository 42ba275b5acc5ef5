// CUDA: an MLP onto the fp32 residual stream in one kernel, its hidden activation kept on chip
// (kernels/cuda/mlp_fused.h): y = res + fc2(gelu_erf(fc1(x))), where no backward follows. Apart,
// fc1 + GELU writes the hidden activation (4 C bf16 an element of x) and fc2 reads it back: 16
// bytes an element of C, the largest pass of a gspn_hier block at 56^2 and 28^2. gspn_t/s/b's
// widths there (96, 112, 128; 192, 224, 256) run here; from 14^2 on (384 and more) fc2's sums
// (C / 2 registers a thread) no longer fit beside fc1's, and the two ops run (docs/gspn_hier.md).
//
// Hopper's warpgroup MMAs (wgmma, sm_90a; the instruction wrappers are CUTLASS's cute/arch, so
// the Makefile builds this file for sm_90a with CUTLASS and other builds take the two ops). A
// block takes 128 rows, a warpgroup of 128 threads 64 of them; two blocks are resident per SM up
// to 128 channels (128 registers a thread), one from 192 (up to 254). It stages its x rows once,
// then walks the hidden units 64 at a time:
// - fc1's chunk, 64 x 64 a warpgroup: x and the chunk of w1 from shared memory (m64n64k16);
// - bias (fc1's biases staged in shared memory once a block), the pre-activation rounded to bf16,
//   the erf GELU (kernels/cuda/gelu.h), rounded to bf16 as the unfused path stores h. A warpgroup
//   MMA's accumulator layout is its register A operand's layout, so these values are fc2's A as
//   they stand;
// - fc2 adds h w2[:, chunk]^T into the warpgroup's 64 x C sums (m64nCk16, A from registers, the
//   chunk of w2 from shared memory), left running while the next chunk's copies land.
// The weights are first laid out per chunk in shared memory's layout (mlp_weight_chunks_kernel), so
// that a chunk of w1 and w2 is one bulk copy (the copy engine, on a transaction barrier) into one
// of two buffers, the next while the current one computes, one block barrier a chunk. Every block
// reads all the weights; as 16-byte cp.async pieces those reads kept L2 at 71% of its throughput
// (Nsight Compute, H100) and the kernel slower than its products. The end: + b2, + res, fp32 out.
// The values are the unfused path's up to the order of the fp32 sums.
//
// With the block's second LayerNorm in front (NORM): the block stages x as layernorm(res) itself,
// summed as layernorm.cu's kernels sum at these widths (mlp_norm_rows), so x is the separate
// norm's to the bit; res is read here and again at the end (from L2), and the norm's bf16 output
// never goes to memory.
//
// Shared memory holds each operand in the MMAs' canonical K-major layout without swizzle
// (kernels/cuda/wgmma_core.cuh).
#include "mlp_fused.h"
#include "wgmma_core.cuh"
#include "cuda_async.cuh"
#include "gelu.h"
#include "ln_row_stats.cuh"
#include <utility>

#ifdef CGSPN_HAVE_CUTLASS

namespace {

enum { MLPF_ROWS = 128, MLPF_THREADS = 256, MLPF_CHUNK = 64 };

namespace gmma = cute::SM90::GMMA;
template <int C> struct Fc2Op;   // fc2's instruction: 64 x C x 16, A from registers
template <> struct Fc2Op<96> { using T = gmma::MMA_64x96x16_F32BF16BF16_RS<gmma::Major::K, gmma::Major::K>; };
template <> struct Fc2Op<112> { using T = gmma::MMA_64x112x16_F32BF16BF16_RS<gmma::Major::K, gmma::Major::K>; };
template <> struct Fc2Op<128> { using T = gmma::MMA_64x128x16_F32BF16BF16_RS<gmma::Major::K, gmma::Major::K>; };
template <> struct Fc2Op<192> { using T = gmma::MMA_64x192x16_F32BF16BF16_RS<gmma::Major::K, gmma::Major::K>; };
template <> struct Fc2Op<224> { using T = gmma::MMA_64x224x16_F32BF16BF16_RS<gmma::Major::K, gmma::Major::K>; };
template <> struct Fc2Op<256> { using T = gmma::MMA_64x256x16_F32BF16BF16_RS<gmma::Major::K, gmma::Major::K>; };
using Fc1Op = gmma::MMA_64x64x16_F32BF16BF16_SS<gmma::Major::K, gmma::Major::K>;

// scale: Zero for the first k-step (the sums start from the product; no instruction but a warpgroup
// MMA may define an accumulator while the MMAs run, or ptxas serializes them), One after.
template <size_t... I>
__device__ __forceinline__ void fc1_mma(uint64_t da, uint64_t db, float (&d)[sizeof...(I)],
                                        gmma::ScaleOut scale, std::index_sequence<I...>) {
    Fc1Op::fma(da, db, d[I]..., scale);
}
template <int C, size_t... I>
__device__ __forceinline__ void fc2_mma(const unsigned (&a)[4], uint64_t db, float (&d)[sizeof...(I)],
                                        std::index_sequence<I...>) {
    Fc2Op<C>::T::fma(a[0], a[1], a[2], a[3], db, d[I]...);
}
// The weights by chunk of 64 hidden units, each as a block of shared memory holds it: chunk j is
// w1's rows 64 j .. 64 j + 63 (64 x C, K = C), then w2's columns 64 j .. 64 j + 63 (C x 64, K =
// 64), both in the core-matrix layout: 128 C elements. A thread a 16-byte piece.
__global__ void mlp_weight_chunks_kernel(const bf16 *__restrict__ w1, const bf16 *__restrict__ w2,
                                         bf16 *__restrict__ wc, int C, int H) {
    const int per_chunk = 16 * C, e = blockIdx.x * blockDim.x + threadIdx.x;   // pieces a chunk
    if (e >= H / MLPF_CHUNK * per_chunk) return;
    const int j = e / per_chunk, q = e % per_chunk;
    bf16 *dst = wc + (size_t)j * 128 * C;
    const bf16 *src;
    if (q < 8 * C) {   // w1: 64 rows of C / 8 pieces
        const int r = q / (C / 8), p = q % (C / 8);
        dst += core_at(r, p * 8, C);
        src = w1 + (size_t)(MLPF_CHUNK * j + r) * C + p * 8;
    } else {           // w2: C rows of 8 pieces
        const int r = (q - 8 * C) / 8, p = (q - 8 * C) % 8;
        dst += 64 * C + core_at(r, p * 8, MLPF_CHUNK);
        src = w2 + (size_t)r * H + MLPF_CHUNK * j + p * 8;
    }
    *reinterpret_cast<uint4 *>(dst) = *reinterpret_cast<const uint4 *>(src);
}

// x's rows as layernorm(res) into xs, rows past n as zeros, bitwise as layernorm_fwd writes them
// at these widths: ln_fwd_short_kernel (C <= 128) and ln_fwd_kernel (to 256) give pack p (channels
// 8p .. 8p + 7) of a row to lane p of L = 16 or 32, sum each pack in order, then the packs by a
// butterfly over xor L/2, ..., 2, 1. Here a row has 4 lanes, lane q its packs q + 4m (m < L/4): the
// butterfly's stages over m's bits run in registers and the last two (xor 2, 1) as shuffles
// (ln_row_stats.cuh), so every sum is the same to the bit.
// The lanes of a row are lane % 8 apart by 8, so 8 consecutive lanes hold 8 consecutive rows: each
// 16-byte store of a pack fills one core matrix (no bank conflicts), each 32-byte load is a whole
// sector. A warp takes two groups of 8 rows, all its loads in flight at once.
template <int C>
__device__ __forceinline__ void mlp_norm_rows(const float *__restrict__ res, const float *__restrict__ lnw,
                                              const float *__restrict__ lnb, float eps, bf16 *xs, int row0,
                                              int rows) {
    constexpr int L = C <= 128 ? 16 : 32, NPK = L / 4, GROUPS = MLPF_ROWS / 8 / (MLPF_THREADS / 32);
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, q = lane / 8;
    float v[GROUPS][NPK][8];
    #pragma unroll
    for (int u = 0; u < GROUPS; u++) {
        const int r = (warp + u * (MLPF_THREADS / 32)) * 8 + lane % 8;
        #pragma unroll
        for (int k = 0; k < NPK; k++) {
            const int c = 8 * (q + 4 * k);
            #pragma unroll
            for (int j = 0; j < 8; j++) v[u][k][j] = 0.0f;
            if (c < C && r < rows) load_v<8>(res + (size_t)(row0 + r) * C + c, v[u][k]);
        }
    }
    bool live[NPK];
    #pragma unroll
    for (int k = 0; k < NPK; k++) live[k] = 8 * (q + 4 * k) < C;
    #pragma unroll
    for (int u = 0; u < GROUPS; u++) {
        const int r = (warp + u * (MLPF_THREADS / 32)) * 8 + lane % 8;
        float m, rs;   // the butterfly's last stages: xor 2 is lane ^ 16, xor 1 lane ^ 8
        ln_row_stats<NPK, 16, 8>(v[u], live, C, eps, m, rs);
        #pragma unroll
        for (int k = 0; k < NPK; k++) {
            const int c = 8 * (q + 4 * k);
            if (c >= C) continue;
            float vw[8], vb[8], out[8];
            load_v<8>(lnw + c, vw);
            load_v<8>(lnb + c, vb);
            #pragma unroll
            for (int j = 0; j < 8; j++) out[j] = r < rows ? (v[u][k][j] - m) * rs * vw[j] + vb[j] : 0.0f;
            Vec<bf16, 8>::of(out).store(xs + core_at(r, c, C));
        }
    }
}

// C: the model width (x's and y's columns), H: hidden units (a multiple of MLPF_CHUNK). NORM: x
// is layernorm(res) with lnw, lnb and eps (x itself unused).
template <int C, bool NORM>
__global__ void __launch_bounds__(MLPF_THREADS, C <= 128 ? 2 : 1)
mlp_fused_kernel(const bf16 *__restrict__ x, const bf16 *__restrict__ wc, const bf16 *__restrict__ b1,
                 const bf16 *__restrict__ b2, const float *__restrict__ res, float *__restrict__ y, int n,
                 int H, const float *__restrict__ lnw, const float *__restrict__ lnb, float eps) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int NT = C / 8, KS = C / 16, CHUNK = 128 * C;   // a chunk's elements (wc)
    extern __shared__ __align__(128) unsigned char mlpf_smem[];
    bf16 *xs = reinterpret_cast<bf16 *>(mlpf_smem);   // (128, C)
    bf16 *ws = xs + MLPF_ROWS * C;                      // 2 chunks: w1's (64, C), then w2's (C, 64)
    uint64_t *full = reinterpret_cast<uint64_t *>(ws + 2 * CHUNK);   // a transaction barrier a buffer
    unsigned *b1s = reinterpret_cast<unsigned *>(full + 2);            // b1 as bf16 pairs
    const int wg = threadIdx.x / 128, warp = threadIdx.x % 128 / 32, lane = threadIdx.x % 32;
    const int g4 = lane / 4, t4 = lane % 4;
    const int row0 = blockIdx.x * MLPF_ROWS, rows = min(MLPF_ROWS, n - row0), chunks = H / MLPF_CHUNK;

    // the first chunk, then x's rows (past n: zeros, their sums never written)
    if (threadIdx.x == 0) {
        mbar_init(&full[0], 1);
        mbar_init(&full[1], 1);
        mbar_init_fence();
        bulk_copy_g2s(ws, wc, CHUNK * sizeof(bf16), &full[0]);
    }
    // fc1's biases, read at every chunk: from shared memory (as 8 global loads a chunk a thread they
    // drew 12% of the stall samples, Nsight Compute on an H100)
    for (int i = threadIdx.x; i < H / 2; i += blockDim.x) b1s[i] = reinterpret_cast<const unsigned *>(b1)[i];
    if constexpr (NORM) {
        mlp_norm_rows<C>(res, lnw, lnb, eps, xs, row0, rows);
    } else {
        for (int e = threadIdx.x; e < MLPF_ROWS * (C / 8); e += blockDim.x) {
            const int r = e / (8 * (C / 8)) * 8 + e % 8, p = e / 8 % (C / 8);
            bf16 *d = xs + core_at(r, p * 8, C);
            if (r < rows) cp_async<16>(d, x + (size_t)(row0 + r) * C + p * 8);
            else *reinterpret_cast<uint4 *>(d) = make_uint4(0, 0, 0, 0);
        }
        cp_async_commit();
    }

    float acc[NT * 4];   // the warpgroup's 64 x C sums: n-tile t, rows g4 and g4 + 8 of the warp's 16
    #pragma unroll
    for (int i = 0; i < NT * 4; i++) acc[i] = 0.0f;
    fence_regs(acc);   // the zeros set here, before any MMA runs
    const unsigned xdesc = core_desc_lo(xs + wg * 64 * C);

    for (int j = 0; j < chunks; j++) {
        if (j == 0) {   // x (and the barriers' set-up) in shared memory for every warp
            cp_async_wait<0>();
            fence_async_shared();
        }
        cute::warpgroup_wait<0>();   // chunk j - 1's fc2 is done with its buffer
        // every warp done with chunk j - 1, whose buffer then takes chunk j + 1 while chunk j
        // computes: one block barrier a chunk
        __syncthreads();
        if (j + 1 < chunks && threadIdx.x == 0)
            bulk_copy_g2s(ws + (j + 1) % 2 * CHUNK, wc + (size_t)(j + 1) * CHUNK, CHUNK * sizeof(bf16),
                          &full[(j + 1) % 2]);
        mbar_wait(&full[j % 2], j / 2 % 2);   // chunk j has landed
        const bf16 *w1c = ws + j % 2 * CHUNK, *w2c = w1c + 64 * C;
        // fc1: h (64 x 64) = x (64 x C) w1c^T; k-step ks starts two core matrices (256 bytes) on.
        float hacc[32];
        const unsigned w1desc = core_desc_lo(w1c);
        cute::warpgroup_arrive();
        #pragma unroll
        for (int ks = 0; ks < KS; ks++)
            fc1_mma(core_desc<C>(xdesc + 16 * ks), core_desc<C>(w1desc + 16 * ks), hacc,
                    ks ? gmma::ScaleOut::One : gmma::ScaleOut::Zero, std::make_index_sequence<32>{});
        cute::warpgroup_commit_batch();
        cute::warpgroup_wait<0>();
        fence_regs(hacc);
        // bias, pre rounded, GELU rounded: the A fragments of fc2's chunk (k-step kk: n-tiles 2kk, 2kk+1)
        unsigned ha[4][4];
        #pragma unroll
        for (int t = 0; t < 8; t++) {   // this chunk's fc1 biases: columns 8 t + 2 t4, + 1
            const unsigned bias = b1s[(j * MLPF_CHUNK + t * 8 + 2 * t4) / 2];
            const float bb0 = __uint_as_float(bias << 16), bb1 = __uint_as_float(bias & 0xffff0000u);
            float v[4];
            #pragma unroll
            for (int q = 0; q < 4; q++) v[q] = hacc[4 * t + q] + (q % 2 ? bb1 : bb0);
            round_bf16_pair(v[0], v[1]);
            round_bf16_pair(v[2], v[3]);
            #pragma unroll
            for (int q = 0; q < 4; q++) v[q] = gelu_value<GELU_ERF, true>(v[q]);
            ha[t / 2][2 * (t % 2)] = round_bf16_pair(v[0], v[1]);       // row g4
            ha[t / 2][2 * (t % 2) + 1] = round_bf16_pair(v[2], v[3]);   // row g4 + 8
        }
        // fc2: acc (64 x C) += h (64 x 64) w2c^T, left running
        const unsigned w2desc = core_desc_lo(w2c);
        fence_regs(acc);
        cute::warpgroup_arrive();
        #pragma unroll
        for (int kk = 0; kk < 4; kk++)
            fc2_mma<C>(ha[kk], core_desc<MLPF_CHUNK>(w2desc + 16 * kk), acc, std::make_index_sequence<NT * 4>{});
        cute::warpgroup_commit_batch();
    }
    cute::warpgroup_wait<0>();
    fence_regs(acc);
    // y = res + (acc + b2), fp32
    #pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        const int col = nt * 8 + 2 * t4;
        const float bb0 = __bfloat162float(b2[col]), bb1 = __bfloat162float(b2[col + 1]);
        #pragma unroll
        for (int i = 0; i < 2; i++) {
            const int r = wg * 64 + warp * 16 + g4 + 8 * i;
            if (r >= rows) continue;
            const size_t o = (size_t)(row0 + r) * C + col;
            const float2 rv = *reinterpret_cast<const float2 *>(res + o);
            float2 out;
            out.x = rv.x + (acc[4 * nt + 2 * i] + bb0);
            out.y = rv.y + (acc[4 * nt + 2 * i + 1] + bb1);
            *reinterpret_cast<float2 *>(y + o) = out;
        }
    }
#endif
}

template <int C>
bool launch(Ctx *ctx, const bf16 *x, const MlpFusedNorm *norm, const bf16 *w1, const bf16 *b1,
            const bf16 *w2, const bf16 *b2, const float *res, float *y, int n, int H) {
    const size_t chunk = (size_t)128 * C * sizeof(bf16);
    const size_t smem = (size_t)MLPF_ROWS * C * sizeof(bf16) + 2 * chunk + 2 * sizeof(uint64_t) +
                        (size_t)H * sizeof(bf16);   // x, two weight chunks, their barriers, b1
    bf16 *wc = (bf16 *)cuda_temp_alloc(ctx, (size_t)H / MLPF_CHUNK * chunk);
    const int pieces = H / MLPF_CHUNK * 16 * C;
    mlp_weight_chunks_kernel<<<(unsigned)((pieces + 255) / 256), 256, 0, cuda_stream_of(ctx)>>>(
        w1, w2, wc, C, H);
    CUDA_CHECK_LAUNCH();
    auto kernel = norm ? mlp_fused_kernel<C, true> : mlp_fused_kernel<C, false>;
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    kernel<<<(unsigned)((n + MLPF_ROWS - 1) / MLPF_ROWS), MLPF_THREADS, smem, cuda_stream_of(ctx)>>>(
        x, wc, b1, b2, res, y, n, H, norm ? norm->w : nullptr, norm ? norm->b : nullptr,
        norm ? norm->eps : 0.0f);
    CUDA_CHECK_LAUNCH();
    cuda_temp_free(ctx, wc);
    return true;
}

}  // namespace

bool cuda_mlp_fused_fwd(Ctx *ctx, const bf16 *x, const MlpFusedNorm *norm, const bf16 *w1,
                        const bf16 *b1, const bf16 *w2, const bf16 *b2, const float *res, float *y,
                        int n, int c, int h) {
    if (n <= 0 || !b1 || !b2 || ((uintptr_t)b1 & 3) != 0 || h % MLPF_CHUNK != 0 ||
        cuda_ctx_of(ctx)->cc != 90 || (norm ? !aligned16(norm->w) || !aligned16(norm->b) : !aligned16(x)) ||
        !aligned16(w1) || !aligned16(w2) || !aligned16(res) || !aligned16(y))
        return false;
    switch (c) {
    case 96: return launch<96>(ctx, x, norm, w1, b1, w2, b2, res, y, n, h);
    case 112: return launch<112>(ctx, x, norm, w1, b1, w2, b2, res, y, n, h);
    case 128: return launch<128>(ctx, x, norm, w1, b1, w2, b2, res, y, n, h);
    case 192: return launch<192>(ctx, x, norm, w1, b1, w2, b2, res, y, n, h);
    case 224: return launch<224>(ctx, x, norm, w1, b1, w2, b2, res, y, n, h);
    case 256: return launch<256>(ctx, x, norm, w1, b1, w2, b2, res, y, n, h);   // one block an SM
    default: return false;
    }
}

#else   // built without CUTLASS, or not for sm_90a: the caller runs the two ops

bool cuda_mlp_fused_fwd(Ctx *, const bf16 *, const MlpFusedNorm *, const bf16 *, const bf16 *,
                        const bf16 *, const bf16 *, const float *, float *, int, int, int) {
    return false;
}

#endif
