// CUDA: the 7x7 depthwise convolution on small images (kernels/cuda/dwconv_plane.h). On a 14 x 14
// or 7 x 7 image the strip kernels of dwconv.cu and the tensor-core pass spend most of their time
// on halos, staging and too few threads per image; here a block stages one image's whole channel
// group once (its rows, with zero columns either side) and then reads nothing from global memory.
// Blocks stay resident and take images in turn, copying the next image into a second buffer
// (cp.async) while they compute the current one.
//
// y / dx (7x7 on images of at most 8 columns; wider ones go to dwconv_plane_mma.cu's tensor-core
// kernel, 7 x 7 ones to dwconv_image7.cu's): a thread owns one channel and CW neighbouring
// columns, holds its 49 taps in registers and sweeps down the image: input row r (CW + 6 pixels
// from shared memory) feeds output rows r - 3 .. r + 3, whose sums it keeps as a ring of K rows;
// row r - 3 is complete after row r and is written at once. 98 fused multiply-adds (CW = 2) per
// 8 shared-memory loads.
//
// dw / db (7x7 on images of at most 8 columns; wider ones: dwconv_plane_mma.cu; 7 x 7:
// dwconv_image7.cu): a thread owns a channel pair and one tap row i, and for every dy pixel adds
// dy times the 7 input pixels of row y + i - 3 that its taps meet, the window sliding along the
// row (one new word a pixel, both channels in it). Its 14 sums run over the block's images, then
// a fixed-order reduction over blocks (kernels/cuda/reduce.cu). Deterministic.
//
// The LPU's 3x3 on the fp32 stream takes the same staged planes: its forward on small images,
// its backward (dx, dw and db in one pass) on tiles of rows at every gspn_hier stage.
#include "dwconv_plane.h"
#include "../dwconv_tile_rows.h"
#include "cuda_async.cuh"
#include "narrow_dot.cuh"
#include <algorithm>
#include <type_traits>
#include <utility>

enum { DWP_K = 7, DWP_THREADS = 256 };
// The 3x3 backward: CG * W threads a block (8 channels at DWP_BWD_MAX_W columns), its four planes
// within DWP_BWD_SMEM bytes: one large block an SM, tiles of many rows. H100, bench dwconv's LPU
// backward (gspn_t, gspn_b): at most 256 threads and 72 KB (three blocks an SM) 0.219 / 0.337 ms
// at 56^2 and 0.113 / 0.152 at 28^2; at most 1024 threads and 150 KB 0.188 / 0.255 and 0.088 /
// 0.113 (a tile's halo rows are fewer, and the block's barriers hold up fewer rows of work).
enum { DWP_BWD_THREADS = 8 * DWP_BWD_MAX_W, DWP_BWD_SMEM = 150 * 1024 };

__host__ __device__ static size_t dwp_align16(size_t bytes) { return (bytes + 15) / 16 * 16; }

// Starts copying one image's CG channels (img: the image at its first channel) into plane (H, sw,
// CG), input column x at staged column x + off (16-byte cp.async; the caller commits and waits).
// Staged columns outside the image are left as they are. blockDim.x is a multiple of the vectors
// a pixel (every block here is CG threads a column or a channel pair).
template <int CG, typename T>
__device__ __forceinline__ void dwp_stage(const T *__restrict__ img, const DwconvShape &d, int sw, int off,
                                          T *__restrict__ plane) {
    constexpr int EPV = 16 / sizeof(T), VPP = CG / EPV;   // elements a vector, vectors a pixel
    const int part = threadIdx.x % VPP;
    DivWalk p(threadIdx.x / VPP, blockDim.x / VPP, d.W);   // pixel px's row and column
    for (int px = threadIdx.x / VPP; px < d.H * d.W; px += blockDim.x / VPP, p.next(d.W))
        cp_async<16>(plane + ((size_t)p.q * sw + p.r + off) * CG + part * EPV,
                     img + (size_t)px * d.C + part * EPV);
}

// Starts copying one image's u (n elements, KU a pixel) into us, a pixel a copy (the caller
// commits and waits).
template <int KU, typename TW>
__device__ __forceinline__ void dwp_stage_u(const TW *__restrict__ u, int n, TW *__restrict__ us) {
    for (int e = threadIdx.x * KU; e < n; e += blockDim.x * KU) cp_async<KU * sizeof(TW)>(us + e, u + e);
}

__device__ __forceinline__ float dwp_f(float v) { return v; }
__device__ __forceinline__ float dwp_f(bf16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float dwp_lo(unsigned w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float dwp_hi(unsigned w) { return __uint_as_float(w & 0xffff0000u); }

// f(std::integral_constant<int, 0>{}), ..., f(<N - 1>): a loop whose index is a constant in each copy.
template <typename F, int... I>
__device__ __forceinline__ void dwp_unroll_seq(F &f, std::integer_sequence<int, I...>) {
    (f(std::integral_constant<int, I>{}), ...);
}
template <int N, typename F> __device__ __forceinline__ void dwp_unroll(F &&f) {
    dwp_unroll_seq(f, std::make_integer_sequence<int, N>{});
}

// ---- y and dx -----------------------------------------------------------------------------------
// Block (C / CG, image blocks), CG * ceil(W / CW) threads: thread t is channel t % CG of columns
// (t / CG) CW .. + CW - 1; the block takes images blockIdx.y, + gridDim.y, ... through two staged
// planes, copying image b + 2 gridDim.y into the plane image b leaves while image b + gridDim.y is
// computed. Output row y takes input rows y - P .. y + P through tap rows 0 .. K - 1; its sums sit
// in ring slot y mod K. The step loop unrolls K times, so every slot is a constant.
// KU = DW_ADDED_K: dwconv_fwd's added input (DwAdded, fp32 in). Each image's u is staged beside
// its plane (KU values a pixel, one copy each); a thread adds u uw^T + ub to the window pixels it
// reads that lie in the image, keeps its own columns of x' as a ring of K rows for the residual,
// and writes them to mid. KU = 0: none. (x' made once a pixel in the plane by a pass of its own
// before the sweep took longer: gspn_b's 14^2 calls 0.057 -> 0.065 ms.)
template <int K, int CG, int CW, int KU, typename T, typename TW>
__global__ void __launch_bounds__(DWP_THREADS, K >= 5 ? 2 : 3)
dwconv_plane_kernel(const T *__restrict__ in, const TW *__restrict__ w, const TW *__restrict__ bias,
                    T *__restrict__ out, DwconvShape d, int flags, DwAdded<TW> add) {
    constexpr int P = K / 2, KK = K * K, NW = CW + K - 1, VPP = CG * (int)sizeof(T) / 16;
    extern __shared__ __align__(16) unsigned char dwp_smem[];
    const int sw = d.W + 2 * P;
    const size_t plane_elems = dwp_align16((size_t)d.H * sw * CG * sizeof(T)) / sizeof(T);
    T *planes = reinterpret_cast<T *>(dwp_smem);                      // 2 x (H, sw, CG)
    float *ws = reinterpret_cast<float *>(planes + 2 * plane_elems);   // (KK, CG)
    const int uimg = d.H * d.W * KU;                                   // u's elements an image
    TW *us = reinterpret_cast<TW *>(ws + KK * CG);                     // 2 x (H, W, KU)
    const int c0 = blockIdx.x * CG;
    const size_t img = (size_t)d.H * d.W * d.C;
    auto stage = [&](unsigned b, int buf) {
        if (b >= (unsigned)d.B) return;
        dwp_stage<CG>(in + b * img + c0, d, sw, P, planes + buf * plane_elems);
        if constexpr (KU > 0) dwp_stage_u<KU>(add.u + (size_t)b * uimg, uimg, us + buf * uimg);
    };
    stage(blockIdx.y, 0);
    cp_async_commit();
    stage(blockIdx.y + gridDim.y, 1);
    cp_async_commit();
    for (int e = threadIdx.x; e < 2 * d.H * 2 * P * VPP; e += blockDim.x) {   // the zero columns
        const int v = e % VPP, col = e / VPP % (2 * P), r = e / VPP / (2 * P) % d.H, buf = e / VPP / (2 * P) / d.H;
        const int s = col < P ? col : d.W + col;
        reinterpret_cast<uint4 *>(planes + buf * plane_elems + ((size_t)r * sw + s) * CG)[v] = make_uint4(0, 0, 0, 0);
    }
    for (int e = threadIdx.x; e < CG * KK; e += blockDim.x) {   // w's CG rows are contiguous
        const int c = e / KK, tap = e - c * KK;
        ws[(flags & DW_FLIP ? KK - 1 - tap : tap) * CG + c] = load_or(w, (size_t)c0 * KK + e, 0.0f);
    }
    const int c = threadIdx.x % CG, x0 = threadIdx.x / CG * CW;
    const bool live = x0 < d.W;
    float aw[KU > 0 ? KU : 1], ab = 0.0f;   // the added input's weights for channel c0 + c
    if constexpr (KU > 0) {
        #pragma unroll
        for (int k = 0; k < KU; k++) aw[k] = load_or(add.w, (size_t)(c0 + c) * KU + k, 0.0f);
        ab = load_or(add.b, (size_t)(c0 + c), 0.0f);
    }
    cp_async_wait<1>();
    __syncthreads();   // the first image, the zero columns and the taps in shared memory
    float tap[KK];
    #pragma unroll
    for (int t = 0; t < KK; t++) tap[t] = ws[t * CG + c];
    const float bv = load_or(bias, (size_t)(c0 + c), 0.0f);
    int buf = 0;
    for (unsigned b = blockIdx.y; b < (unsigned)d.B; b += gridDim.y, buf ^= 1) {
        if (live) {
            const T *pc = planes + buf * plane_elems + x0 * CG + c;   // pixel (r, x0 + q): pc[(r sw + q) CG]
            const TW *uc0 = us + buf * uimg + (x0 - P) * KU;          // u of pixel (r, x0 - P + q)
            float *mi = KU > 0 && add.mid ? add.mid + b * img + c0 + c : nullptr;
            T *o = out + b * img + c0 + c;
            float acc[K][CW], ctr[KU > 0 ? K : 1][CW];   // ctr: x' of the thread's columns, slot r mod K
            #pragma unroll
            for (int s = 0; s < K; s++)
                #pragma unroll
                for (int q = 0; q < CW; q++) acc[s][q] = 0.0f;
            // Step r: input row r (if r < H; `whole`: known to be) into the ring, then output row
            // r - P out. Output row y's slot is y mod K, a constant in each copy (U = r mod K).
            auto step = [&](int r, auto uc, auto whole) {
                constexpr int U = decltype(uc)::value % K;
                if (decltype(whole)::value || r < d.H) {
                    float win[NW];
                    #pragma unroll
                    for (int q = 0; q < NW; q++) win[q] = dwp_f(pc[(r * sw + q) * CG]);
                    if constexpr (KU > 0) {
                        #pragma unroll
                        for (int q = 0; q < NW; q++) {
                            const int xx = x0 - P + q;
                            if (xx < 0 || xx >= d.W) continue;   // zero padding stays zero
                            const Vec<TW, KU> up = Vec<TW, KU>::load(uc0 + (r * d.W + q) * KU);
                            float uv[KU];
                            #pragma unroll
                            for (int k = 0; k < KU; k++) uv[k] = up.get(k);
                            win[q] = win[q] + narrow_dot<KU>(uv, aw, ab);
                        }
                        #pragma unroll
                        for (int q = 0; q < CW; q++) {
                            ctr[U][q] = win[q + P];
                            if (mi && x0 + q < d.W) mi[((size_t)r * d.W + x0 + q) * d.C] = win[q + P];
                        }
                    }
                    #pragma unroll
                    for (int j = 0; j < K; j++)   // j outermost: consecutive FMAs feed different sums
                        #pragma unroll
                        for (int i = 0; i < K; i++)
                            #pragma unroll
                            for (int q = 0; q < CW; q++)
                                acc[(U - i + P + K) % K][q] = fmaf(tap[i * K + j], win[q + j], acc[(U - i + P + K) % K][q]);
                }
                constexpr int s = (U - P + K) % K;
                const int y = r - P;
                if (y >= 0) {
                    #pragma unroll
                    for (int q = 0; q < CW; q++) {
                        const int xx = x0 + q;
                        if (xx >= d.W) break;
                        T *p = o + ((size_t)y * d.W + xx) * d.C;
                        float v = acc[s][q] + bv;
                        if (flags & DW_RESID) {
                            if constexpr (KU > 0) v += ctr[s][q];
                            else v += dwp_f(pc[(y * sw + q + P) * CG]);
                        }
                        if (flags & DW_ACCUM) v += dwp_f(*p);
                        if (flags & DW_SILU) v = dw_silu<T>(v);
                        store_v<1>(p, &v);
                    }
                }
                #pragma unroll
                for (int q = 0; q < CW; q++) acc[s][q] = 0.0f;
            };
            int t0 = 0;
            for (; t0 + K <= d.H; t0 += K)   // whole rounds of K input rows: no branch on r
                dwp_unroll<K>([&](auto uc) { step(t0 + decltype(uc)::value, uc, std::true_type{}); });
            const int steps = d.H + P;   // the rest: rows up to H - 1, then P steps that only finish rows
            dwp_unroll<K + P>([&](auto uc) {
                if (t0 + decltype(uc)::value < steps) step(t0 + decltype(uc)::value, uc, std::false_type{});
            });
        }
        cp_async_wait<0>();   // image b + gridDim.y's copies are in
        __syncthreads();      // and every thread is done with plane buf: one barrier an image
        stage(b + 2 * gridDim.y, buf);
        cp_async_commit();
    }
}

template <int K, int CG, int CW, int KU, typename T, typename TW>
static void dwp_launch_rows(Ctx *ctx, const T *in, const TW *w, const TW *bias, T *out,
                            const DwconvShape &d, int flags, const DwAdded<TW> &add) {
    const int threads = CG * ((d.W + CW - 1) / CW), groups = d.C / CG;
    const size_t smem = 2 * dwp_align16((size_t)d.H * (d.W + K - 1) * CG * sizeof(T)) + (size_t)K * K * CG * 4 +
                        2 * (size_t)d.H * d.W * KU * sizeof(TW);
    auto kernel = dwconv_plane_kernel<K, CG, CW, KU, T, TW>;
    dim3 grid((unsigned)groups, dwp_image_blocks(ctx, kernel, threads, smem, groups, d.B));
    kernel<<<grid, threads, smem, cuda_stream_of(ctx)>>>(in, w, bias, out, d, flags, add);
    CUDA_CHECK_LAUNCH();
}

// Channels a block: the widest group dividing C (a warp's loads span up to 32 consecutive
// channels); CW = 1 on odd widths up to 8 (no idle column), else 2: at most 8 x 32 threads.
template <int K, int KU, typename T, typename TW>
static void dwp_launch_rows_cg(Ctx *ctx, const T *in, const TW *w, const TW *bias, T *out,
                               const DwconvShape &d, int flags, const DwAdded<TW> &add) {
    auto go = [&](auto cgc) {
        constexpr int CG = decltype(cgc)::value;
        if (d.W % 2 == 1 && d.W <= 8) dwp_launch_rows<K, CG, 1, KU>(ctx, in, w, bias, out, d, flags, add);
        else dwp_launch_rows<K, CG, 2, KU>(ctx, in, w, bias, out, d, flags, add);
    };
    if (d.C % 32 == 0) go(std::integral_constant<int, 32>{});
    else if (d.C % 16 == 0) go(std::integral_constant<int, 16>{});
    else go(std::integral_constant<int, 8>{});
}

template <typename T, typename TW>
bool cuda_dwconv_plane(Ctx *ctx, const T *in, const TW *w, const TW *bias, T *out, const DwconvShape &d,
                       int flags, const DwAdded<TW> &add) {
    if (d.C % 8 != 0 || d.H > DWP_MAX_SIDE || d.W > DWP_MAX_SIDE || d.B == 0 || !aligned16(in) ||
        !aligned16(out))
        return false;
    if constexpr (std::is_same<T, bf16>::value && std::is_same<TW, bf16>::value) {
        if (d.k != 7 || add.u) return false;
        if (cuda_dwconv_image7(ctx, in, w, bias, out, d, flags)) return true;      // 7 x 7
        if (cuda_dwconv_plane_mma(ctx, in, w, bias, out, d, flags)) return true;   // 9 to 16 columns
        dwp_launch_rows_cg<7, 0>(ctx, in, w, bias, out, d, flags, add);   // the mixer
        return true;
    } else if constexpr (std::is_same<T, float>::value) {
        if (d.k != 3) return false;
        if (add.u) dwp_launch_rows_cg<3, DW_ADDED_K>(ctx, in, w, bias, out, d, flags, add);
        else dwp_launch_rows_cg<3, 0>(ctx, in, w, bias, out, d, flags, add);   // the LPU on the fp32 stream
        return true;
    }
    return false;
}
template bool cuda_dwconv_plane(Ctx *, const bf16 *, const bf16 *, const bf16 *, bf16 *, const DwconvShape &, int,
                                const DwAdded<bf16> &);
template bool cuda_dwconv_plane(Ctx *, const bf16 *, const float *, const float *, bf16 *, const DwconvShape &, int,
                                const DwAdded<float> &);
template bool cuda_dwconv_plane(Ctx *, const float *, const bf16 *, const bf16 *, float *, const DwconvShape &, int,
                                const DwAdded<bf16> &);
template bool cuda_dwconv_plane(Ctx *, const float *, const float *, const float *, float *, const DwconvShape &, int,
                                const DwAdded<float> &);

// ---- dx, dw and db in one pass (3x3 on the fp32 stream) -----------------------------------------
// Block (C / CG, item blocks), CG * W threads: thread t is channel t % CG of column t / CG. An item
// is a tile of at most TH rows of one image (ceil(H / TH) tiles an image, the last one partial).
// The block stages a tile's x and dy rows with P rows either side (zeros past the image) and P
// zero columns either side, so that
//   dx[y][x]  = sum_{i,j} w[i][j] dy[y - i + P][x - j + P]  (+ dy[y][x]) (+ dx's prior value)
//   dw[i][j] += dy[y][x] in[y + i - P][x + j - P],   db += dy[y][x]
// read them without a branch. A thread sweeps its column down the tile with its window's K staged
// rows of dy and x as a ring in registers (staged row s in slot s mod K): a new row of each a
// step, 2K shared loads an output where the whole window was 2K^2 (the step loop unrolls K times,
// so every slot is a constant). Blocks stay resident and take items in turn, staging the next
// while they compute the current one. A thread's dw and db sums run over the block's items, then
// add in column order (shared memory) into the block's row of the partial matrix (item blocks,
// C k^2 + C).
template <int K, int CG, typename T, typename TW>
__global__ void __launch_bounds__(DWP_BWD_THREADS)
dwconv_plane_bwd_kernel(const T *__restrict__ dy, const T *__restrict__ in, const TW *__restrict__ w,
                        T *__restrict__ dx, DwconvShape d, int TH, int flags, float *__restrict__ partial) {
    constexpr int P = K / 2, KK = K * K, VPP = CG * (int)sizeof(T) / 16;
    extern __shared__ __align__(16) unsigned char dwp_smem[];
    const int sw = d.W + 2 * P, tiles = (d.H + TH - 1) / TH;
    const unsigned items = (unsigned)d.B * tiles;
    const size_t plane_elems = dwp_align16((size_t)(TH + 2 * P) * sw * CG * sizeof(T)) / sizeof(T);
    T *planes = reinterpret_cast<T *>(dwp_smem);   // 2 x [in, dy] (TH + 2P, sw, CG)
    const int c0 = blockIdx.x * CG, c = threadIdx.x % CG, xx = threadIdx.x / CG;
    const size_t img = (size_t)d.H * d.W * d.C;
    for (size_t e = threadIdx.x; e < 4 * plane_elems * sizeof(T) / 16; e += blockDim.x)
        reinterpret_cast<uint4 *>(dwp_smem)[e] = make_uint4(0, 0, 0, 0);   // the zero border, once
    __syncthreads();
    // Item it into set as kernels/dwconv_tile_rows.h plans it: image rows y0 - P .. y0 + TH + P - 1
    // at staged rows 0 .., those past the image as zeros (written only where an image has several
    // tiles: one tile's stay from the start).
    auto stage = [&](unsigned it, int set) {
        const int b = it / tiles, y0 = (it - b * tiles) * TH;
        const DwTileRows tr = dw_tile_rows(y0, TH, P, d.H);
        T *xs = planes + 2 * set * plane_elems, *gs = xs + plane_elems;
        DwconvShape rows = d;
        rows.H = tr.r1 - tr.r0;
        const size_t src = b * img + (size_t)tr.r0 * d.W * d.C + c0, dst = (size_t)tr.dst * sw * CG;
        dwp_stage<CG>(in + src, rows, sw, P, xs + dst);
        dwp_stage<CG>(dy + src, rows, sw, P, gs + dst);
        if (tiles == 1) return;
        for (int e = threadIdx.x; e < (tr.top + tr.bottom) * d.W * VPP; e += blockDim.x) {
            const int v = e % VPP, px = e / VPP, zr = px / d.W;
            const size_t at = ((size_t)dw_tile_zero_row(tr, TH, P, zr) * sw + px - zr * d.W + P) * CG;
            reinterpret_cast<uint4 *>(xs + at)[v] = make_uint4(0, 0, 0, 0);
            reinterpret_cast<uint4 *>(gs + at)[v] = make_uint4(0, 0, 0, 0);
        }
    };
    if (blockIdx.y < items) stage(blockIdx.y, 0);
    cp_async_commit();
    float wr[KK], acc[KK], accb = 0.0f;
    #pragma unroll
    for (int t = 0; t < KK; t++) wr[t] = load_or(w, (size_t)(c0 + c) * KK + t, 0.0f), acc[t] = 0.0f;
    int buf = 0;
    for (unsigned it = blockIdx.y; it < items; it += gridDim.y, buf ^= 1) {
        const unsigned nt = it + gridDim.y;
        if (nt < items) stage(nt, buf ^ 1);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        const int b = it / tiles, y0 = (it - b * tiles) * TH, rows = min(TH, d.H - y0);
        // Staged (s, xx + j) is image pixel (y0 + s - P, xx + j - P): rows y .. y + 2P, columns
        // xx .. xx + 2P are the window around (y0 + y, xx).
        const T *xs = planes + 2 * buf * plane_elems + (size_t)xx * CG + c, *gs = xs + plane_elems;
        T *o = dx + b * img + ((size_t)y0 * d.W + xx) * d.C + c0 + c;
        float g[K][K], xv[K][K];   // staged row s of dy and x in slot s mod K
        auto row_in = [&](int s, auto slot) {
            constexpr int S = decltype(slot)::value;
            #pragma unroll
            for (int j = 0; j < K; j++) {
                g[S][j] = dwp_f(gs[((size_t)s * sw + j) * CG]);
                xv[S][j] = dwp_f(xs[((size_t)s * sw + j) * CG]);
            }
        };
        dwp_unroll<K - 1>([&](auto sc) { row_in(decltype(sc)::value, sc); });
        auto step = [&](int y, auto uc) {   // U = y mod K
            constexpr int U = decltype(uc)::value % K;
            row_in(y + K - 1, std::integral_constant<int, (U + K - 1) % K>{});
            float sum = 0.0f;
            #pragma unroll
            for (int i = 0; i < K; i++)   // dy's image row y - i + P: staged row y + K - 1 - i
                #pragma unroll
                for (int j = 0; j < K; j++) sum = fmaf(wr[i * K + j], g[(U + K - 1 - i) % K][K - 1 - j], sum);
            const float gc = g[(U + P) % K][P];
            if (flags & DW_RESID) sum += gc;
            T *p = o + (size_t)y * d.W * d.C;
            if (flags & DW_ACCUM) sum += dwp_f(*p);
            store_v<1>(p, &sum);
            #pragma unroll
            for (int i = 0; i < K; i++)
                #pragma unroll
                for (int j = 0; j < K; j++) acc[i * K + j] = fmaf(gc, xv[(U + i) % K][j], acc[i * K + j]);
            accb += gc;
        };
        int y = 0;
        for (; y + K <= rows; y += K)   // whole rounds of K rows: no branch on y
            dwp_unroll<K>([&](auto uc) { step(y + decltype(uc)::value, uc); });
        dwp_unroll<K - 1>([&](auto uc) {
            if (y + decltype(uc)::value < rows) step(y + decltype(uc)::value, uc);
        });
        __syncthreads();
    }
    float *red = reinterpret_cast<float *>(dwp_smem);   // (W, KK + 1, CG), over the planes
    #pragma unroll
    for (int t = 0; t < KK; t++) red[((size_t)xx * (KK + 1) + t) * CG + c] = acc[t];
    red[((size_t)xx * (KK + 1) + KK) * CG + c] = accb;
    __syncthreads();
    float *row = partial + (size_t)blockIdx.y * ((size_t)d.C * KK + d.C);
    for (int e = threadIdx.x; e < (KK + 1) * CG; e += blockDim.x) {
        const int t = e / CG, cc = e - t * CG;
        float sum = 0.0f;
        for (int q = 0; q < d.W; q++) sum += red[((size_t)q * (KK + 1) + t) * CG + cc];
        row[t < KK ? (size_t)(c0 + cc) * KK + t : (size_t)d.C * KK + c0 + cc] = sum;
    }
}

// Shared memory a block's four planes at TH rows a tile.
template <typename T> static size_t dwp_bwd_planes(const DwconvShape &d, int CG, int TH) {
    return 4 * dwp_align16((size_t)(TH + d.k - 1) * (d.W + d.k - 1) * CG * sizeof(T));
}

template <int CG, typename T, typename TW>
static void dwp_launch_bwd(Ctx *ctx, const T *dy, const T *in, const TW *w, T *dx, const DwconvShape &d,
                           int flags, float *dw, float *db) {
    constexpr int K = 3;
    // Rows a tile: the fewest tiles an image whose planes fit DWP_BWD_SMEM (gspn_t: a whole 14 x 14
    // image at 32 channels, 28 x 28 at 32 in tiles of 7 rows, 56 x 56 at 16 in tiles of 8).
    int tiles = 1;
    while (tiles < d.H && dwp_bwd_planes<T>(d, CG, (d.H + tiles - 1) / tiles) > DWP_BWD_SMEM) tiles++;
    const int TH = (d.H + tiles - 1) / tiles, threads = CG * d.W, groups = d.C / CG;
    const size_t smem = std::max(dwp_bwd_planes<T>(d, CG, TH), (size_t)d.W * (K * K + 1) * CG * sizeof(float));
    auto kernel = dwconv_plane_bwd_kernel<K, CG, T, TW>;
    const int per_image = (d.H + TH - 1) / TH;
    const unsigned blocks = dwp_image_blocks(ctx, kernel, threads, smem, groups, d.B * per_image);
    const size_t width = (size_t)d.C * K * K + d.C;
    float *partial = (float *)cuda_scratch(ctx, (size_t)blocks * width * sizeof(float));
    kernel<<<dim3((unsigned)groups, blocks), threads, smem, cuda_stream_of(ctx)>>>(dy, in, w, dx, d, TH, flags,
                                                                                    partial);
    CUDA_CHECK_LAUNCH();
    cuda_sum_partials(ctx, partial, blocks, width, (size_t)d.C * K * K, dw, db);
}

template <typename T, typename TW>
bool cuda_dwconv_plane_bwd(Ctx *ctx, const T *dy, const T *in, const TW *w, T *dx, const DwconvShape &d,
                           int flags, float *dw, float *db) {
    if constexpr (std::is_same<T, float>::value) {   // the LPU on the fp32 stream
        if (d.k != 3 || d.C % 8 != 0 || d.W > DWP_BWD_MAX_W || d.B == 0 || !aligned16(dy) || !aligned16(in))
            return false;
        // Channels a block: the widest group dividing C that keeps CG * W within DWP_BWD_THREADS.
        if (d.C % 32 == 0 && 32 * d.W <= DWP_BWD_THREADS) dwp_launch_bwd<32>(ctx, dy, in, w, dx, d, flags, dw, db);
        else if (d.C % 16 == 0 && 16 * d.W <= DWP_BWD_THREADS) dwp_launch_bwd<16>(ctx, dy, in, w, dx, d, flags, dw, db);
        else dwp_launch_bwd<8>(ctx, dy, in, w, dx, d, flags, dw, db);
        return true;
    }
    return false;
}
template bool cuda_dwconv_plane_bwd(Ctx *, const bf16 *, const bf16 *, const bf16 *, bf16 *, const DwconvShape &, int, float *, float *);
template bool cuda_dwconv_plane_bwd(Ctx *, const bf16 *, const bf16 *, const float *, bf16 *, const DwconvShape &, int, float *, float *);
template bool cuda_dwconv_plane_bwd(Ctx *, const float *, const float *, const bf16 *, float *, const DwconvShape &, int, float *, float *);
template bool cuda_dwconv_plane_bwd(Ctx *, const float *, const float *, const float *, float *, const DwconvShape &, int, float *, float *);

// ---- dw and db ----------------------------------------------------------------------------------
// Block (C / 2CP, image blocks), K * CP threads: thread t is channel pair t % CP and tap row
// i = t / CP; images as in the y kernel, through two staged pairs of planes. Staged x rows are swx
// pixels apart, swx odd where a warp holds several tap rows (32 / CP), which then read different
// banks. Every dy pixel is counted in row i when input row y + i - P is in the image; db from
// tap row P, whose input row is always y. Each block's sums are one row of the partial matrix
// (image blocks, C k^2 + C), added in a fixed order.
template <int K, int CP>
__global__ void __launch_bounds__(K * 32)
dwconv_plane_dw_kernel(const bf16 *__restrict__ dy, const bf16 *__restrict__ in, DwconvShape d,
                       int swx, float *__restrict__ partial) {
    constexpr int P = K / 2, KK = K * K, CG = 2 * CP;
    extern __shared__ __align__(16) unsigned char dwp_smem[];
    const size_t xs_words = (size_t)d.H * swx * CP, set_words = xs_words + (size_t)d.H * d.W * CP;
    unsigned *sets = reinterpret_cast<unsigned *>(dwp_smem);   // 2 x [x (H, swx, CP), dy (H, W, CP)]
    const int c0 = blockIdx.x * CG, p = threadIdx.x % CP, i = threadIdx.x / CP;
    const size_t img = (size_t)d.H * d.W * d.C;
    auto stage = [&](unsigned b, unsigned *set) {
        dwp_stage<CG>(in + b * img + c0, d, swx, 0, reinterpret_cast<bf16 *>(set));
        dwp_stage<CG>(dy + b * img + c0, d, d.W, 0, reinterpret_cast<bf16 *>(set + xs_words));
    };
    if (blockIdx.y < (unsigned)d.B) stage(blockIdx.y, sets);
    cp_async_commit();
    float acc[K][2], accb[2] = {0.0f, 0.0f};
    #pragma unroll
    for (int j = 0; j < K; j++) acc[j][0] = acc[j][1] = 0.0f;
    int buf = 0;
    for (unsigned b = blockIdx.y; b < (unsigned)d.B; b += gridDim.y, buf ^= 1) {
        const unsigned nb = b + gridDim.y;
        if (nb < (unsigned)d.B) stage(nb, sets + (buf ^ 1) * set_words);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        const unsigned *xs = sets + buf * set_words, *ds = xs + xs_words;
        for (int y = 0; y < d.H; y++) {
            const int r = y + i - P;
            if (r < 0 || r >= d.H) continue;
            const unsigned *dr = ds + (size_t)y * d.W * CP + p;
            const unsigned *xr = xs + (size_t)r * swx * CP + p;   // input column c: xr[c CP]
            float2 win[K];   // input columns x - P .. x + P in slots (x + j) mod K
            #pragma unroll
            for (int j = 0; j < K - 1; j++) {
                const unsigned v = j >= P && j - P < d.W ? xr[(j - P) * CP] : 0u;
                win[j] = make_float2(dwp_lo(v), dwp_hi(v));
            }
            auto step = [&](int x, auto uc) {   // dy pixel x; its window slots (x + j) mod K
                constexpr int U = decltype(uc)::value;
                const unsigned nw = x + P < d.W ? xr[(x + P) * CP] : 0u, gw = dr[x * CP];
                win[(U + K - 1) % K] = make_float2(dwp_lo(nw), dwp_hi(nw));
                const float g0 = dwp_lo(gw), g1 = dwp_hi(gw);
                #pragma unroll
                for (int j = 0; j < K; j++) {
                    acc[j][0] = fmaf(g0, win[(U + j) % K].x, acc[j][0]);
                    acc[j][1] = fmaf(g1, win[(U + j) % K].y, acc[j][1]);
                }
                if (i == P) accb[0] += g0, accb[1] += g1;
            };
            int x0 = 0;
            for (; x0 + K <= d.W; x0 += K)   // whole rounds of K pixels: no branch on x
                dwp_unroll<K>([&](auto uc) { step(x0 + decltype(uc)::value, uc); });
            dwp_unroll<K - 1>([&](auto uc) {
                if (x0 + decltype(uc)::value < d.W) step(x0 + decltype(uc)::value, uc);
            });
        }
        __syncthreads();
    }
    float *row = partial + (size_t)blockIdx.y * ((size_t)d.C * KK + d.C);
    #pragma unroll
    for (int e = 0; e < 2; e++) {
        const int c = c0 + 2 * p + e;
        #pragma unroll
        for (int j = 0; j < K; j++) row[(size_t)c * KK + i * K + j] = acc[j][e];
        if (i == P) row[(size_t)d.C * KK + c] = accb[e];
    }
}

template <int CP>
static void dwp_launch_dw(Ctx *ctx, const bf16 *dy, const bf16 *in, const DwconvShape &d, float *dw,
                          float *db) {
    const int threads = DWP_K * CP, groups = d.C / (2 * CP);
    const int swx = CP < 32 ? d.W | 1 : d.W;
    const size_t smem = 2 * ((size_t)d.H * swx + (size_t)d.H * d.W) * CP * 4;
    auto kernel = dwconv_plane_dw_kernel<DWP_K, CP>;
    const unsigned blocks = dwp_image_blocks(ctx, kernel, threads, smem, groups, d.B);
    const size_t width = (size_t)d.C * DWP_K * DWP_K + d.C;
    float *partial = (float *)cuda_scratch(ctx, (size_t)blocks * width * sizeof(float));
    kernel<<<dim3((unsigned)groups, blocks), threads, smem, cuda_stream_of(ctx)>>>(dy, in, d, swx, partial);
    CUDA_CHECK_LAUNCH();
    cuda_sum_partials(ctx, partial, blocks, width, (size_t)d.C * DWP_K * DWP_K, dw, db);
}

bool cuda_dwconv_plane_dw(Ctx *ctx, const bf16 *dy, const bf16 *in, const DwconvShape &d, float *dw,
                          float *db) {
    if (cuda_dwconv_image7_dw(ctx, dy, in, d, dw, db)) return true;
    if (d.k != DWP_K || d.C % 16 != 0 || d.H > DWP_MAX_SIDE || d.W > DWP_MAX_SIDE || d.B == 0 ||
        !aligned16(dy) || !aligned16(in))
        return false;
    // Channel pairs a block: the widest group dividing C / 2 (a warp is then one tap row).
    if (d.C % 64 == 0) dwp_launch_dw<32>(ctx, dy, in, d, dw, db);
    else if (d.C % 32 == 0) dwp_launch_dw<16>(ctx, dy, in, d, dw, db);
    else dwp_launch_dw<8>(ctx, dy, in, d, dw, db);
    return true;
}
