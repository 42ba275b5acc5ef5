// The stem's convolution (kernels/cuda/conv2d_stem.h) without the column GEMM: its windows are
// C k^2 = 27 values (an RGB image, 3x3), too narrow for it (rows of 54 bytes, not 16-byte aligned;
// a K of 27 wastes most of a tensor-core tile) and too cheap to need it: 27 FMAs per output. A
// thread computes STEM_PIX output pixels: it loads their windows once into registers (rounded to
// w's dtype, as the columns hold them) and sweeps the output channels 8 at a time against the
// weight, which sits in shared memory in fp32 (a 16-byte broadcast load serves 4 channels of both
// pixels). Each output is the fp32 sum over its window in column order, then + bias, rounded once.
// Where the backward wants the columns, the block writes its rows of them as one contiguous run
// through shared memory (a row is 54 bytes: written straight, a warp's stores scatter).
#include "conv2d_stem.h"
#include "gelu.h"
#include "ln_row_stats.cuh"
#include "mma.cuh"
#include <algorithm>
#include <type_traits>

enum { STEM_THREADS = 128, STEM_PIX = 2, STEM_OV = 8 };

// Output pixel r's window: its image and the input row and column of its top-left tap.
struct StemPixel {
    size_t image;   // element offset of the image in x
    int h0, w0;
};

__device__ __forceinline__ StemPixel stem_pixel(const Conv2dShape &g, size_t r) {
    const int wo = (int)(r % (size_t)g.Wo);
    const size_t bh = r / (size_t)g.Wo;
    return {bh / (size_t)g.Ho * g.sb, (int)(bh % (size_t)g.Ho) * g.s - g.p, wo * g.s - g.p};
}

// Window value j = (c K + ky) K + kx of a pixel of an NCHW x (the columns' order), rounded to TW
// as the columns would hold it; 0 in the padding.
template <int K, typename TX, typename TW>
__device__ __forceinline__ float stem_window(const TX *__restrict__ x, const Conv2dShape &g, const StemPixel &px,
                                             int j) {
    const int h = px.h0 + j / K % K, ww = px.w0 + j % K;
    if (h < 0 || h >= g.H || ww < 0 || ww >= g.W) return 0.0f;
    return (float)(TW)(float)x[px.image + (size_t)(j / (K * K)) * g.sc + (size_t)h * g.W + ww];
}

template <int C, int K, typename TX, typename TW>
__global__ void __launch_bounds__(STEM_THREADS)
conv2d_stem_kernel(const TX *__restrict__ x, const TW *__restrict__ w, const TW *__restrict__ bias,
                   TW *__restrict__ y, TW *__restrict__ cols, Conv2dShape g) {
    constexpr int KK = C * K * K, ROWS = STEM_THREADS * STEM_PIX;
    extern __shared__ float4 stem_smem[];
    // (Cout / 8, KK, 8): w in fp32, each group of 8 output channels transposed, so that the sweep
    // below reads it at constant offsets from one base; then the bias; then the block's columns
    // (ROWS, KK) when they are kept, written out from here in one contiguous run.
    float *sw = (float *)stem_smem;
    float *sb = sw + KK * g.Cout;
    TW *scols = (TW *)(sb + g.Cout);
    for (int i = threadIdx.x; i < KK * g.Cout; i += blockDim.x) {
        const int u = i % STEM_OV, j = i / STEM_OV % KK, o = i / (STEM_OV * KK) * STEM_OV + u;
        sw[i] = (float)w[(size_t)o * KK + j];
    }
    for (int o = threadIdx.x; o < g.Cout; o += blockDim.x) sb[o] = bias ? (float)bias[o] : 0.0f;

    // The thread's pixels: rows r0 + p STEM_THREADS (a warp's stores then cover neighbouring rows).
    const size_t r_block = (size_t)blockIdx.x * ROWS, r0 = r_block + threadIdx.x;
    float win[STEM_PIX][KK];
    #pragma unroll
    for (int p = 0; p < STEM_PIX; p++) {
        const size_t r = r0 + (size_t)p * STEM_THREADS < g.rows ? r0 + (size_t)p * STEM_THREADS : g.rows - 1;
        const StemPixel px = stem_pixel(g, r);
        #pragma unroll
        for (int j = 0; j < KK; j++) win[p][j] = stem_window<K, TX, TW>(x, g, px, j);
        if (cols) {
            #pragma unroll
            for (int j = 0; j < KK; j++) scols[(p * STEM_THREADS + threadIdx.x) * KK + j] = (TW)win[p][j];
        }
    }
    __syncthreads();
    if (cols) {
        const size_t n = (g.rows - r_block < (size_t)ROWS ? g.rows - r_block : ROWS) * KK;
        for (size_t i = threadIdx.x; i < n; i += blockDim.x) cols[r_block * KK + i] = scols[i];
    }
    #pragma unroll 1
    for (int o = 0; o < g.Cout; o += STEM_OV) {
        float acc[STEM_PIX][STEM_OV];
        #pragma unroll
        for (int p = 0; p < STEM_PIX; p++)
            #pragma unroll
            for (int u = 0; u < STEM_OV; u++) acc[p][u] = 0.0f;
        const float *wg = sw + o * KK;
        #pragma unroll
        for (int j = 0; j < KK; j++) {
            const float4 w0 = *(const float4 *)(wg + j * STEM_OV);
            const float4 w1 = *(const float4 *)(wg + j * STEM_OV + 4);
            const float wv[STEM_OV] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
            #pragma unroll
            for (int p = 0; p < STEM_PIX; p++)
                #pragma unroll
                for (int u = 0; u < STEM_OV; u++) acc[p][u] = fmaf(wv[u], win[p][j], acc[p][u]);
            // A compiler barrier every 9 taps: without it the weight loads of all 27 are hoisted
            // ahead of the FMAs, and ptxas spills (95 registers with it, 255 and spills without).
            if (j % 9 == 8) asm volatile("" ::: "memory");
        }
        #pragma unroll
        for (int p = 0; p < STEM_PIX; p++) {
            const size_t r = r0 + (size_t)p * STEM_THREADS;
            if (r >= g.rows) break;
            #pragma unroll
            for (int u = 0; u < STEM_OV; u++) acc[p][u] += sb[o + u];
            store_v<STEM_OV>(y + r * g.Cout + o, acc[p]);
        }
    }
}

// ---- on tensor cores, where the columns are not kept (bf16 w and y) -----------------------------
// A warp takes 16 output pixels at a time: their windows are the A operand of m16n8k16 products
// (KS steps of 16 window values, zero past C k^2), w^T the B operand, built once per thread for all
// Cout / 8 column tiles and the whole sweep. A lane gathers its 16 window values per step
// straight from the image (rows g and g + 8 of the tile, values 2 t4, 2 t4 + 1, + 8, + 9) at
// offsets it fixes once (its window slots), rounded to bf16 as the columns hold them. Each
// output: the fp32 products' sum in the tensor cores' order, + bias, rounded once. 27 FMAs an
// output took the CUDA-core kernel above to its instruction limit (2,700 instructions a pixel);
// here a 16-pixel tile is 12 MMAs and 16 loads a lane.
enum { STEM_MMA_THREADS = 128, STEM_MMA_MAX_NT = 8 };

// A warp's 16 rows of y as conv2d_fwd writes them (bf16), staged (row pitch 72 elements: the
// MMA layout's 4-byte writes fill 32 banks), then gelu(layernorm(row)) as layernorm_fwd and
// gelu_fwd write them, to the bit: ln_fwd_short_kernel gives pack p (channels 8p .. 8p + 7) to
// lane p of 8 (Cout <= 64), sums each pack in order, then the packs by a butterfly over xor 4,
// 2, 1. Here a row has 2 lanes, lane h its packs h + 2k: stages xor 4 and 2 (k's bits) in
// registers, xor 1 a shuffle (ln_row_stats.cuh). Packs past Cout are zeros, as that kernel's idle
// lanes.
enum { STEM_POST_PITCH = 72 };
template <bool GELU>
__device__ __forceinline__ void stem_norm_gelu_rows(const bf16 *stage, const StemNormGelu &post, int cout,
                                                    bf16 *__restrict__ y, size_t row0, size_t rows) {
    const int lane = threadIdx.x % 32, r = lane / 2, h = lane % 2;
    float v[4][8];
    #pragma unroll
    for (int k = 0; k < 4; k++) {
        const int c = 8 * (h + 2 * k);
        #pragma unroll
        for (int j = 0; j < 8; j++) v[k][j] = 0.0f;
        if (c < cout) load_v<8>(stage + r * STEM_POST_PITCH + c, v[k]);
    }
    bool live[4];
    #pragma unroll
    for (int k = 0; k < 4; k++) live[k] = 8 * (h + 2 * k) < cout;
    float m, rs;   // the butterfly's last stage, xor 1, is lane ^ 1
    ln_row_stats<4, 1>(v, live, cout, post.eps, m, rs);
    if (row0 + r >= rows) return;
    #pragma unroll
    for (int k = 0; k < 4; k++) {
        const int c = 8 * (h + 2 * k);
        if (c >= cout) continue;
        float vw[8], vb[8], out[8];
        load_v<8>(post.w + c, vw);
        load_v<8>(post.b + c, vb);
        #pragma unroll
        for (int j = 0; j < 8; j++) out[j] = (v[k][j] - m) * rs * vw[j] + vb[j];
        unsigned packed[4];   // bf16 pairs, each rounded once (F2FP: round_bf16_pair)
        #pragma unroll
        for (int q = 0; q < 4; q++) {
            if (GELU) {
                round_bf16_pair(out[2 * q], out[2 * q + 1]);
                out[2 * q] = gelu_value<GELU_ERF, true>(out[2 * q]);
                out[2 * q + 1] = gelu_value<GELU_ERF, true>(out[2 * q + 1]);
            }
            packed[q] = round_bf16_pair(out[2 * q], out[2 * q + 1]);
        }
        *reinterpret_cast<uint4 *>(y + (row0 + r) * cout + c) = make_uint4(packed[0], packed[1], packed[2], packed[3]);
    }
}

// POST: y = gelu(layernorm(conv)) (stem_norm_gelu_rows; GELU false: the norm alone).
template <int C, typename TX, bool POST, bool GELU>
__global__ void __launch_bounds__(STEM_MMA_THREADS, POST ? 4 : 1)
conv2d_stem_mma_kernel(const TX *__restrict__ x, const bf16 *__restrict__ w, const bf16 *__restrict__ bias,
                       bf16 *__restrict__ y, Conv2dShape g, StemNormGelu post) {
    constexpr int K = 3, KK = C * K * K, KS = (KK + 15) / 16;
    __shared__ __align__(16) bf16 stage_all[POST ? STEM_MMA_THREADS / 32 : 1][16 * STEM_POST_PITCH];
    bf16 *stage = stage_all[POST ? threadIdx.x / 32 : 0];
    const int lane = threadIdx.x % 32, g4 = lane / 4, t4 = lane % 4, nts = g.Cout / 8;
    unsigned bw[STEM_MMA_MAX_NT][KS][2];   // w^T: rows 2 t4 (+ 1), + 8 (+ 9) of step ks, column g4
    float bv[STEM_MMA_MAX_NT][2];          // bias at columns 2 t4, 2 t4 + 1
    #pragma unroll
    for (int nt = 0; nt < STEM_MMA_MAX_NT; nt++) {
        if (nt >= nts) break;
        const bf16 *wo = w + (size_t)(nt * 8 + g4) * KK;
        #pragma unroll
        for (int ks = 0; ks < KS; ks++)
            #pragma unroll
            for (int h = 0; h < 2; h++) {
                const int j = ks * 16 + 2 * t4 + 8 * h;
                bw[nt][ks][h] = Vec<bf16, 8>::pair(j < KK ? (float)wo[j] : 0.0f, j + 1 < KK ? (float)wo[j + 1] : 0.0f);
            }
        #pragma unroll
        for (int i = 0; i < 2; i++) bv[nt][i] = bias ? (float)bias[nt * 8 + 2 * t4 + i] : 0.0f;
    }
    // The lane's window values j = ks 16 + 2 t4 + 8 h + e (the A fragment's columns), fixed for the
    // whole sweep: (c, ky, kx) as the element offset c sc + ky W + kx from a window's top-left
    // pixel, shifted left by 4 above the tap ky K + kx (15: past C k^2, always zero). A tile then
    // spends an add and a mask test on each value, not the index arithmetic of stem_window.
    int slot[KS][2][2];
    #pragma unroll
    for (int ks = 0; ks < KS; ks++)
        #pragma unroll
        for (int h = 0; h < 2; h++)
            #pragma unroll
            for (int e = 0; e < 2; e++) {
                const int j = ks * 16 + 2 * t4 + 8 * h + e, c = j / (K * K), ky = j / K % K, kx = j % K;
                slot[ks][h][e] = j < KK ? (int)((c * g.sc + (long long)ky * g.W + kx) << 4) | (ky * K + kx) : 15;
            }
    const double inv_wo = 1.0 / g.Wo, inv_ho = 1.0 / g.Ho;
    const size_t tiles = (g.rows + 15) / 16, warps = STEM_MMA_THREADS / 32;
    for (size_t tile = blockIdx.x * warps + threadIdx.x / 32; tile < tiles; tile += gridDim.x * warps) {
        const size_t r[2] = {tile * 16 + g4, tile * 16 + g4 + 8};
        unsigned a[KS][4];   // rows g4, g4 + 8 at values 2 t4 (a[0], a[1]) and 2 t4 + 8 (a[2], a[3])
        #pragma unroll
        for (int i = 0; i < 2; i++) {
            // the pixel's image, row and column: floor((t + 1/2) / n) in fp64 is exact for t < 2^31
            // (stem_mma_fits), its error far below the 1 / (2 n) margin
            const unsigned t = (unsigned)(r[i] < g.rows ? r[i] : g.rows - 1);
            const unsigned bh = (unsigned)(((double)t + 0.5) * inv_wo), b = (unsigned)(((double)bh + 0.5) * inv_ho);
            const int h0 = (int)(bh - b * (unsigned)g.Ho) * g.s - g.p, w0 = (int)(t - bh * (unsigned)g.Wo) * g.s - g.p;
            unsigned live = 0;   // bit ky K + kx: the tap lies in the image
            #pragma unroll
            for (int ky = 0; ky < K; ky++)
                #pragma unroll
                for (int kx = 0; kx < K; kx++)
                    live |= (unsigned)(h0 + ky >= 0 && h0 + ky < g.H && w0 + kx >= 0 && w0 + kx < g.W) << (ky * K + kx);
            const TX *corner = x + (long long)b * g.sb + (long long)h0 * g.W + w0;
            #pragma unroll
            for (int ks = 0; ks < KS; ks++)
                #pragma unroll
                for (int h = 0; h < 2; h++) {
                    float v[2];
                    #pragma unroll
                    for (int e = 0; e < 2; e++) {
                        const int sl = slot[ks][h][e];
                        v[e] = live >> (sl & 15) & 1 ? (float)corner[sl >> 4] : 0.0f;
                    }
                    a[ks][2 * h + i] = round_bf16_pair(v[0], v[1]);   // as the columns hold them
                }
        }
        #pragma unroll
        for (int nt = 0; nt < STEM_MMA_MAX_NT; nt++) {
            if (nt >= nts) break;
            float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            #pragma unroll
            for (int ks = 0; ks < KS; ks++)
                mma_16816_bf16(acc, a[ks][0], a[ks][1], a[ks][2], a[ks][3], bw[nt][ks][0], bw[nt][ks][1]);
            #pragma unroll
            for (int i = 0; i < 2; i++) {
                const float v[2] = {acc[2 * i] + bv[nt][0], acc[2 * i + 1] + bv[nt][1]};
                if (POST) {   // y's values (bf16) into the warp's stage, the norm reads them there
                    *reinterpret_cast<unsigned *>(stage + (g4 + 8 * i) * STEM_POST_PITCH + nt * 8 + 2 * t4) =
                        Vec<bf16, 8>::pair(v[0], v[1]);
                } else if (r[i] < g.rows) {
                    store_v<2>(y + r[i] * g.Cout + nt * 8 + 2 * t4, v);
                }
            }
        }
        if (POST) {
            __syncwarp();
            stem_norm_gelu_rows<GELU>(stage, post, g.Cout, y, tile * 16, g.rows);
            __syncwarp();   // the stage is read before the next tile writes it
        }
    }
}

// The tensor-core kernel's index ranges: pixels counted in 32 bits, a window value's offset from its
// corner in 27 (its slot, shifted left by 4), the NCHW image dense along rows and columns.
static bool stem_mma_fits(const Conv2dShape &g) {
    const long long span = (g.C - 1) * g.sc + 2LL * g.W + 2;
    return g.rows < (1ull << 31) && span < (1LL << 27) && g.sh == g.W && g.sw == 1;
}

template <int C, typename TX>
static void launch_stem_mma(Ctx *ctx, const Conv2dShape &g, const TX *x, const bf16 *w, const bf16 *b, bf16 *y,
                            const StemNormGelu *post) {
    const size_t tiles = ceil_div(g.rows, (size_t)16), per_block = STEM_MMA_THREADS / 32;
    const unsigned blocks = (unsigned)std::min(ceil_div(tiles, per_block), (size_t)cuda_ctx_of(ctx)->sm_count * 16);
    auto kernel = !post ? conv2d_stem_mma_kernel<C, TX, false, false>
                  : post->gelu ? conv2d_stem_mma_kernel<C, TX, true, true>
                               : conv2d_stem_mma_kernel<C, TX, true, false>;
    kernel<<<blocks, STEM_MMA_THREADS, 0, cuda_stream_of(ctx)>>>(x, w, b, y, g, post ? *post : StemNormGelu{});
    CUDA_CHECK_LAUNCH();
}

template <int C, typename TX, typename TW>
static void launch_stem(Ctx *ctx, const Conv2dShape &g, const TX *x, const TW *w, const TW *b, TW *y,
                        TW *cols, const StemNormGelu *post) {
    if constexpr (std::is_same<TW, bf16>::value) {
        if (!cols && stem_mma_fits(g)) {
            launch_stem_mma<C>(ctx, g, x, w, b, y, post);
            return;
        }
    }
    constexpr int K = 3, KK = C * K * K;
    const size_t smem = (size_t)(KK + 1) * g.Cout * sizeof(float) +
                        (cols ? (size_t)STEM_THREADS * STEM_PIX * KK * sizeof(TW) : 0);
    auto kernel = conv2d_stem_kernel<C, K, TX, TW>;
    if (smem > 48 * 1024) CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    const unsigned blocks = (unsigned)ceil_div(g.rows, (size_t)STEM_THREADS * STEM_PIX);
    kernel<<<blocks, STEM_THREADS, smem, cuda_stream_of(ctx)>>>(x, w, b, y, cols, g);
    CUDA_CHECK_LAUNCH();
}

// The shapes both stem kernels take: an NCHW image of 1, 3 or 4 channels, 3x3, Cout 8k up to 64
// (gspn_t/s/b: 48, 56, 64).
static bool stem_covers(const Conv2dShape &g, int nchw) {
    return nchw && g.k == 3 && (g.C == 1 || g.C == 3 || g.C == 4) && g.Cout % STEM_OV == 0 &&
           g.Cout <= 64 && g.rows > 0;
}

bool cuda_conv2d_stem(Ctx *ctx, const Conv2dShape &g, int nchw, const Tensor *x, const Tensor *w,
                      const Tensor *b, const StemNormGelu *post, Tensor *cols, Tensor *y) {
    if (!stem_covers(g, nchw) || !aligned16(y->data)) return false;
    if (post && (cols || w->dtype != DTYPE_BF16 || !aligned16(post->w) || !aligned16(post->b) || !stem_mma_fits(g)))
        return false;   // the norm and GELU follow the tensor-core kernel alone
    dispatch_dtype2(x->dtype, w->dtype, [&](auto tx, auto tw) {
        using TX = TAG_T(tx);
        using TW = TAG_T(tw);
        const TX *xp = (const TX *)x->data;
        const TW *wp = (const TW *)w->data, *bp = b ? (const TW *)b->data : nullptr;
        TW *yp = (TW *)y->data, *cp = cols ? (TW *)cols->data : nullptr;
        if (g.C == 1) launch_stem<1>(ctx, g, xp, wp, bp, yp, cp, post);
        else if (g.C == 3) launch_stem<3>(ctx, g, xp, wp, bp, yp, cp, post);
        else launch_stem<4>(ctx, g, xp, wp, bp, yp, cp, post);
    });
    return true;
}

// ---- dw and db from the columns -----------------------------------------------------------------
// dw[o, j] = sum_r dy[r, o] cols[r, j] and db[o] = sum_r dy[r, o]: (Cout, C k^2 + 1) sums over
// millions of rows, a GEMM whose K is the rows and whose N (27) leaves its tiles mostly empty. A
// block takes a run of STEM_DW_CHUNKS chunks of STEM_DW_CHUNK rows; it stages a chunk's dy and
// columns in shared memory in fp32 (contiguous runs of both; column C k^2 is the bias's column of
// ones). A thread owns STEM_DW_OV output channels times STEM_DW_JV columns, and the threads that
// own the same sums split a chunk's rows between them (pixel groups, interleaved). The groups are
// added in order in shared memory, each block writes one row of a partial matrix, and
// cuda_sum_partials adds the rows in order: deterministic. It ties the GEMM it replaces (0.377
// against 0.376 ms on gspn_t's stem at batch 128, H100; docs/gspn_hier.md).
enum { STEM_DW_THREADS = 256, STEM_DW_OV = 4, STEM_DW_JV = 7, STEM_DW_CHUNK = 64, STEM_DW_CHUNKS = 32 };

struct StemDwSplit {
    int og, jg, tiles, groups;   // channel groups, column groups, their product, pixel groups
    int jp;                      // staged columns per row: jg STEM_DW_JV
};

static StemDwSplit stem_dw_split(const Conv2dShape &g) {
    StemDwSplit s;
    s.og = g.Cout / STEM_DW_OV;
    s.jg = (int)((g.cols + 1 + STEM_DW_JV - 1) / STEM_DW_JV);
    s.tiles = s.og * s.jg;
    s.groups = STEM_DW_THREADS / s.tiles;
    s.jp = s.jg * STEM_DW_JV;
    return s;
}

// Shared memory: the staged chunk (dy (CHUNK, Cout), columns (CHUNK, jp)), then, reusing it, the
// groups' sums (groups, tiles, OV JV).
static size_t stem_dw_smem(const Conv2dShape &g, const StemDwSplit &sp) {
    const size_t chunk = (size_t)STEM_DW_CHUNK * (g.Cout + sp.jp);
    const size_t red = (size_t)sp.groups * sp.tiles * STEM_DW_OV * STEM_DW_JV;
    return (chunk > red ? chunk : red) * sizeof(float);
}

template <typename T>
__global__ void __launch_bounds__(STEM_DW_THREADS)
conv2d_stem_dw_kernel(const T *__restrict__ dy, const T *__restrict__ cols, Conv2dShape g, StemDwSplit sp,
                      float *__restrict__ partial) {
    constexpr int TILE = STEM_DW_OV * STEM_DW_JV;
    extern __shared__ float4 stem_dw_shared[];
    float *sdy = (float *)stem_dw_shared, *scol = sdy + STEM_DW_CHUNK * g.Cout, *red = sdy;
    const int kk = (int)g.cols, tile = threadIdx.x % sp.tiles, grp = threadIdx.x / sp.tiles;
    const int o0 = tile % sp.og * STEM_DW_OV, j0 = tile / sp.og * STEM_DW_JV;
    for (int i = threadIdx.x; i < STEM_DW_CHUNK * (sp.jp - kk); i += blockDim.x) {   // constant columns
        const int r = i / (sp.jp - kk), j = kk + i % (sp.jp - kk);
        scol[r * sp.jp + j] = j == kk ? 1.0f : 0.0f;
    }
    float acc[STEM_DW_OV][STEM_DW_JV];
    #pragma unroll
    for (int a = 0; a < STEM_DW_OV; a++)
        #pragma unroll
        for (int u = 0; u < STEM_DW_JV; u++) acc[a][u] = 0.0f;
    const size_t r_run = (size_t)blockIdx.x * STEM_DW_CHUNK * STEM_DW_CHUNKS;
    for (int ch = 0; ch < STEM_DW_CHUNKS; ch++) {
        const size_t ra = r_run + (size_t)ch * STEM_DW_CHUNK;
        if (ra >= g.rows) break;
        const int n = g.rows - ra < STEM_DW_CHUNK ? (int)(g.rows - ra) : STEM_DW_CHUNK;
        __syncthreads();   // the previous chunk's sums are done
        for (int i = threadIdx.x * 8; i < n * g.Cout; i += blockDim.x * 8) {   // Cout: 8k
            float v[8];
            load_v<8>(dy + ra * g.Cout + i, v);
            #pragma unroll
            for (int e = 0; e < 8; e++) sdy[i + e] = v[e];
        }
        for (int i = threadIdx.x; i < n * kk; i += blockDim.x) {   // the chunk's columns: one run
            const int r = i / kk;
            scol[r * sp.jp + i - r * kk] = (float)cols[ra * kk + i];
        }
        __syncthreads();
        if (grp < sp.groups) {
            for (int r = grp; r < n; r += sp.groups) {
                const float4 d4 = *(const float4 *)(sdy + r * g.Cout + o0);
                const float d[STEM_DW_OV] = {d4.x, d4.y, d4.z, d4.w};
                float xv[STEM_DW_JV];
                #pragma unroll
                for (int u = 0; u < STEM_DW_JV; u++) xv[u] = scol[r * sp.jp + j0 + u];
                #pragma unroll
                for (int a = 0; a < STEM_DW_OV; a++)
                    #pragma unroll
                    for (int u = 0; u < STEM_DW_JV; u++) acc[a][u] = fmaf(d[a], xv[u], acc[a][u]);
            }
        }
    }
    __syncthreads();
    if (grp < sp.groups) {
        #pragma unroll
        for (int a = 0; a < STEM_DW_OV; a++)
            #pragma unroll
            for (int u = 0; u < STEM_DW_JV; u++) red[(grp * sp.tiles + tile) * TILE + a * STEM_DW_JV + u] = acc[a][u];
    }
    __syncthreads();
    float *row = partial + (size_t)blockIdx.x * ((size_t)g.Cout * kk + g.Cout);
    for (int e = threadIdx.x; e < sp.tiles * TILE; e += blockDim.x) {
        const int t = e / TILE, a = e / STEM_DW_JV % STEM_DW_OV, u = e % STEM_DW_JV;
        const int o = t % sp.og * STEM_DW_OV + a, j = t / sp.og * STEM_DW_JV + u;
        if (j > kk) continue;
        float s = 0.0f;
        for (int q = 0; q < sp.groups; q++) s += red[(q * sp.tiles + t) * TILE + a * STEM_DW_JV + u];
        row[j < kk ? (size_t)o * kk + j : (size_t)g.Cout * kk + o] = s;
    }
}

bool cuda_conv2d_stem_dw(Ctx *ctx, const Conv2dShape &g, int nchw, const Tensor *dy, const Tensor *cols,
                         Tensor *dw, Tensor *db) {
    if (!stem_covers(g, nchw) || !aligned16(dy->data)) return false;
    const StemDwSplit sp = stem_dw_split(g);
    if (sp.groups < 1) return false;
    const unsigned blocks = (unsigned)ceil_div(g.rows, (size_t)STEM_DW_CHUNK * STEM_DW_CHUNKS);
    const size_t width = (size_t)g.Cout * g.cols + g.Cout, smem = stem_dw_smem(g, sp);
    float *partial = (float *)cuda_temp_alloc(ctx, blocks * width * sizeof(float));
    dispatch_dtype(dy->dtype, [&](auto tag) {
        using T = TAG_T(tag);
        auto kernel = conv2d_stem_dw_kernel<T>;
        if (smem > 48 * 1024)
            CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        kernel<<<blocks, STEM_DW_THREADS, smem, cuda_stream_of(ctx)>>>((const T *)dy->data, (const T *)cols->data,
                                                                       g, sp, partial);
    });
    CUDA_CHECK_LAUNCH();
    cuda_sum_partials(ctx, partial, blocks, width, (size_t)g.Cout * g.cols, dw ? (float *)dw->data : nullptr,
                      db ? (float *)db->data : nullptr);
    cuda_temp_free(ctx, partial);
    return true;
}
