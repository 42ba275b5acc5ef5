// CUDA: the mixer's 7x7 depthwise y / dx and dw passes on images of at most 16 rows and 9 to 16
// columns (gspn_hier's 14 x 14 stage) on tensor cores (kernels/cuda/dwconv_plane.h). On 8 columns or fewer
// one 16 x 8 tile a channel leaves most of each MMA idle, and dwconv_plane.cu's fp32 kernel is
// faster (H100, 7 x 7 x 1152: 0.048 ms a forward against 0.060). The product is dwconv_mma.cu's:
// per channel and tap row i, 16 output rows times output columns x0 .. x0 + 7 take
//   D (16 x 8) += A_i (16 x 16) B_i (16 x 8),  A_i[m][q] = in[m + i - P][x0 - P + q],
//                                              B_i[q][n] = w[i][q - n] where 0 <= q - n < K,
// one m16n8k16 bf16 MMA with fp32 sums, here with the whole image as one 16-row tile: a channel's
// 14 x 14 output is two 16 x 8 tiles, 14 MMAs, where the fp32 kernel issues about 300 warp FMAs.
//
// Blocks stay resident on one group of channels and take images in turn. Each warp builds its
// two channels' B fragments once; the staged planes' zero border (rows and columns past the image)
// is written once; the next image's pixels are loaded into registers while the current image is
// multiplied and written out, then stored channel-major into the staged planes (a fragment's
// column pairs are 32-bit words). Where nothing is added to out's prior value, each warp finishes
// its channels in registers (bias, residual, SiLU, rounded once) and writes the results as bf16
// over the image's staged pixels, which the next image's replace (the zero border stays); with
// DW_ACCUM the fp32 sums are staged channel-major (dwconv_mma.h) and finished as they go out with
// the prior value. Either way the results go out along channels (16-byte stores). The dw
// pass below is dwconv_mma.cu's dw product on the same resident blocks; where dx is written (not
// added to), it makes dx too from the dy it stages, so that the backward reads dy once (H100, 14 x
// 14 x 576: 0.081 ms for the one pass against 0.091 for the two; 128 registers, two blocks an SM,
// where held to three it spills 352 bytes).
#include "dwconv_plane.h"

enum {
    DPM_K = 7,
    DPM_P = DPM_K / 2,
    DPM_TH = 16,                      // the MMA tile's rows: the image's, then zeros
    DPM_ROWS = DPM_TH + DPM_K - 1,    // staged rows: input rows -P .. TH + P - 1
    DPM_SW = 24,                      // staged columns: input columns -P .. 20
    DPM_WORDS = DPM_SW / 2,           // 32-bit words a staged row
    DPM_PAIRS = 2,                    // y / dx: units a thread stages an image (16 x 16: 144 pairs)
};
// A block is CG channels (CG / 8 16-byte vectors a pixel, which a warp's loads and stores take
// side by side) and CG / 2 warps, 2 channels each: 16 CG threads.
// Two column tiles reach staged column 23. 12 words a row, 8 modulo 16 bf16 columns, put the 8
// rows of one fragment load (4 words each) on 8 different bank quads. Staged column s is input
// column s - P, so word m holds input columns 2m - 3 and 2m - 2: the image lies in words
// 1 .. (W + 2) / 2.
static_assert(DPM_SW >= 2 * 8 + 8 && DPM_SW % 16 == 8, "staged row width");
static_assert((int)DPM_TH >= (int)DWP_MAX_SIDE, "an image's rows in one tile");
static_assert((int)DPM_PAIRS * 128 >= (int)DWP_MAX_SIDE * ((DWP_MAX_SIDE + 2) / 2), "pairs a thread");

// A unit of staging: 8 channels of two neighbouring pixels, which become 8 staged words (channel
// c's word holds both pixels' values). A thread's units are the same for every image, so where
// they come from and go is worked out once.
struct DpmUnit {
    int src;          // the first pixel's element offset in its image, its first channel included
    int dst;          // the staged word of its first channel; -1: no unit
    unsigned flags;   // bit 0, 1: the first, second pixel lies in the image; bit 2: a dy unit
    int dst2;         // dy units of the dw pass: the first pixel's halfword in the shifted copy
};
enum { DPM_LO = 1, DPM_HI = 2, DPM_DY = 4 };

template <int U>
__device__ __forceinline__ void dpm_load(const bf16 *__restrict__ x, const bf16 *__restrict__ dy,
                                         const DpmUnit (&un)[U], int C, uint4 (&px)[U][2]) {
    #pragma unroll
    for (int u = 0; u < U; u++) {
        px[u][0] = px[u][1] = make_uint4(0, 0, 0, 0);
        if (un[u].dst < 0) continue;
        const bf16 *base = un[u].flags & DPM_DY ? dy : x;
        if (un[u].flags & DPM_LO) px[u][0] = *reinterpret_cast<const uint4 *>(base + un[u].src);
        if (un[u].flags & DPM_HI) px[u][1] = *reinterpret_cast<const uint4 *>(base + un[u].src + C);
    }
}

// Channel c of both pixels into word dst + c plane (plane: words between channels' planes; pdy for
// dy units).
template <int U>
__device__ __forceinline__ void dpm_store(unsigned *__restrict__ stage, const DpmUnit (&un)[U],
                                          const uint4 (&px)[U][2], int plane, int pdy) {
    #pragma unroll
    for (int u = 0; u < U; u++) {
        if (un[u].dst < 0) continue;
        const unsigned lo[4] = {px[u][0].x, px[u][0].y, px[u][0].z, px[u][0].w};
        const unsigned hi[4] = {px[u][1].x, px[u][1].y, px[u][1].z, px[u][1].w};
        unsigned *dst = stage + un[u].dst;
        const int stride = un[u].flags & DPM_DY ? pdy : plane;
        #pragma unroll
        for (int c = 0; c < 8; c++)
            dst[c * stride] = __byte_perm(lo[c / 2], hi[c / 2], c % 2 ? 0x7632u : 0x5410u);
    }
}

// The dy units' pixels, channel c at halfword dst2 + 2 c plane2 (and the second pixel one on), of
// the dw pass's shifted copy of dy (staged one element later than its word pairs).
template <int U>
__device__ __forceinline__ void dpm_store_shifted(unsigned short *__restrict__ dy2, const DpmUnit (&un)[U],
                                                  const uint4 (&px)[U][2], int plane2) {
    #pragma unroll
    for (int u = 0; u < U; u++) {
        if (un[u].dst < 0 || !(un[u].flags & DPM_DY)) continue;
        const unsigned lo[4] = {px[u][0].x, px[u][0].y, px[u][0].z, px[u][0].w};
        const unsigned hi[4] = {px[u][1].x, px[u][1].y, px[u][1].z, px[u][1].w};
        unsigned short *dst = dy2 + un[u].dst2;
        #pragma unroll
        for (int c = 0; c < 8; c++) {
            const int sh = c % 2 ? 16 : 0;
            dst[2 * c * plane2] = (unsigned short)(lo[c / 2] >> sh);
            dst[2 * c * plane2 + 1] = (unsigned short)(hi[c / 2] >> sh);
        }
    }
}

// A resident block's walk over its images blockIdx.y, + gridDim.y, ... (of B): each image's
// pixels, loaded into registers, are stored into the staged planes and the next image's load is
// issued (in flight until the next store); then work(b) runs on the planes, which are free again
// once every thread has returned from it. load(b) does nothing for b >= B.
template <typename Load, typename Store, typename Work>
__device__ __forceinline__ void dpm_each_image(int B, Load &&load, Store &&store, Work &&work) {
    load(blockIdx.y);
    __syncthreads();   // the zeros in before any image's words
    for (unsigned b = blockIdx.y; b < (unsigned)B; b += gridDim.y) {
        store();
        load(b + gridDim.y);
        __syncthreads();
        work(b);
        __syncthreads();   // the planes (and sums) are free for the next image
    }
}

// The y / dx product of a warp's two channels over their staged planes: tw is the first
// channel's, the second's PLANE words on, input row -P at row 0 (rows DPM_WORDS words long) and
// input columns -P, 1 - P at word 0. A_i's fragment: rows g and g + 8 (staged rows + i), the words
// of column pairs 2 t4 and 2 t4 + 8 of the tile. Four independent chains: 2 channels x 2 tiles.
template <int PLANE>
__device__ __forceinline__ void dpm_band_mma(const unsigned *tw, const unsigned (&bfrag)[2][DPM_K][2], int g,
                                             int t4, float (&acc)[2][2][4]) {
    #pragma unroll
    for (int i = 0; i < DPM_K; i++)
        #pragma unroll
        for (int cc = 0; cc < 2; cc++)
            #pragma unroll
            for (int jt = 0; jt < 2; jt++) {
                const unsigned *r0 = tw + cc * PLANE + (g + i) * DPM_WORDS + jt * 4 + t4, *r8 = r0 + 8 * DPM_WORDS;
                mma_16816_bf16(acc[cc][jt], r0[0], r8[0], r0[4], r8[4], bfrag[cc][i][0], bfrag[cc][i][1]);
            }
}

// The product's outputs finished in registers (+ bv, + the staged input pixel with DW_RESID, SiLU
// with DW_SILU, rounded once to bf16) and written over their own staged pixels, which only this
// warp's products read (the zero border stays): output (m, x), m = g + 8 (e / 2), x = jt * 8 + 2 t4
// + e % 2, at halfword 2 (cc PLANE + m DPM_WORDS) + x of t16 (the first channel's image pixel
// (0, 0)).
template <int PLANE>
__device__ __forceinline__ void dpm_finish_in_place(unsigned short *t16, const float (&acc)[2][2][4],
                                                    const float (&bv)[2], int flags, int H, int W, int g, int t4) {
    auto each_output = [&](auto &&f) {
        #pragma unroll
        for (int cc = 0; cc < 2; cc++)
            #pragma unroll
            for (int jt = 0; jt < 2; jt++)
                #pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int m = g + 8 * (e / 2), x = jt * 8 + 2 * t4 + e % 2;
                    f(cc, jt, e, m < H && x < W, 2 * (cc * PLANE + m * DPM_WORDS) + x);
                }
    };
    float v[2][2][4];
    each_output([&](int cc, int jt, int e, bool, int at) {
        v[cc][jt][e] = acc[cc][jt][e] + bv[cc];
        if (flags & DW_RESID) v[cc][jt][e] += __uint_as_float((unsigned)t16[at] << 16);
        if (flags & DW_SILU) v[cc][jt][e] = dw_silu<bf16>(v[cc][jt][e]);
    });
    __syncwarp();
    each_output([&](int cc, int jt, int e, bool in_image, int at) {   // the zero border stays
        if (in_image) t16[at] = __bfloat16_as_ushort(__float2bfloat16_rn(v[cc][jt][e]));
    });
}

// The block's finished outputs out along channels (o: the image's first pixel at the block's first
// channel): a thread per 8 channels of an output pixel, from halfword 2 (c PLANE + r DPM_WORDS) + xx
// of t16 (as dpm_finish_in_place left them).
template <int PLANE, int THREADS, int VPP>
__device__ __forceinline__ void dpm_write_out(const unsigned short *t16, bf16 *o, int H, int W, int C) {
    for (int e = threadIdx.x; e < H * W * VPP; e += THREADS) {
        const int pix = e / VPP, v8 = 8 * (e - pix * VPP), r = pix / W, xx = pix - r * W;
        const unsigned short *staged = t16 + 2 * (v8 * PLANE + r * DPM_WORDS) + xx;
        unsigned word[4];
        #pragma unroll
        for (int h = 0; h < 4; h++) word[h] = staged[4 * h * PLANE] | (unsigned)staged[2 * (2 * h + 1) * PLANE] << 16;
        *reinterpret_cast<uint4 *>(o + ((size_t)r * W + xx) * C + v8) = make_uint4(word[0], word[1], word[2], word[3]);
    }
}

// The image side both plane kernels take as a constant: gspn's 14 x 14 stage at 224 px (then the
// write-out's division by the width and the dw pass's row loop are constants; other sides: S = 0).
enum { DPM_SIDE = 14 };
template <int S> __device__ __forceinline__ int dpm_side(int runtime) { return S ? S : runtime; }

// Block (C / CG, image blocks), 16 CG threads: the block takes images blockIdx.y, + gridDim.y, ...
// U: units a thread stages an image, at most DPM_PAIRS. S > 0: the images are S x S. SUMS: the
// fp32 sums staged (flags has DW_ACCUM). PROJ (not with SUMS): the down projection's partial sums
// (DwProj, dwconv_mma.h) go out instead of the output.
// Without SUMS the kernel takes 88 registers, two blocks an SM; held to three (80 registers, 28
// bytes spilled) it measured the same (H100, 14 x 14 x 576 forward 0.042 ms either way).
template <int CG, int U, int S, bool SUMS, bool PROJ = false>
__global__ void __launch_bounds__(16 * CG, PROJ ? 2 : 0)
dwconv_plane_mma_kernel(const bf16 *__restrict__ in, const bf16 *__restrict__ w, const bf16 *__restrict__ bias,
                        bf16 *__restrict__ out, DwconvShape d, int flags, DwProj proj) {
    static_assert(!(SUMS && PROJ), "the projection reads the results from the staged planes");
    constexpr int K = DPM_K, P = DPM_P, KK = K * K;
    constexpr int THREADS = 16 * CG, VPP = CG / 8;   // VPP: 16-byte vectors a pixel
    constexpr int PLANE = dw_stage_plane(DPM_ROWS * DPM_WORDS);   // words a channel's staged plane
    constexpr int RS = dw_sum_row(16), PS = dw_sum_plane(DPM_TH, 16);
    __shared__ __align__(16) unsigned tile[CG * PLANE];          // (CG, ROWS, SW) bf16 pairs
    // SUMS: the sums (CG, TH, RS); PROJ: the block's columns of proj.w (DW_PROJ_M, CG)
    __shared__ __align__(16) float sums[SUMS ? CG * PS : PROJ ? DW_PROJ_M * CG : 1];
    unsigned short *tile16 = reinterpret_cast<unsigned short *>(tile);
    const int c0 = blockIdx.x * CG, H = dpm_side<S>(d.H), W = dpm_side<S>(d.W);
    const size_t img = (size_t)H * W * d.C;
    for (int e = threadIdx.x; e < CG * PLANE; e += THREADS) tile[e] = 0u;
    if constexpr (PROJ)
        for (int e = threadIdx.x; e < DW_PROJ_M * CG; e += THREADS)
            sums[e] = e / CG < proj.m ? __bfloat162float(proj.w[(size_t)(e / CG) * d.C + c0 + e % CG]) : 0.0f;

    // The warp's two channels' B fragments, for every image.
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
    unsigned bfrag[2][K][2];
    #pragma unroll
    for (int cc = 0; cc < 2; cc++) dw_band_fragments<K>(w + (size_t)(c0 + 2 * warp + cc) * KK, flags, g, t4, bfrag[cc]);
    float bv[2] = {0.0f, 0.0f};
    if (!SUMS && bias)
        for (int cc = 0; cc < 2; cc++) bv[cc] = __bfloat162float(bias[c0 + 2 * warp + cc]);
    // An image's pixel pairs, VPP units each: unit e is vector e % VPP of pair p = e / VPP, which
    // is word 1 + p % nm of image row p / nm (input columns 2m - 3, 2m - 2).
    const int nm = (W + 2) / 2, units = H * nm * VPP;
    DpmUnit un[U];
    #pragma unroll
    for (int u = 0; u < U; u++) {
        const int e = threadIdx.x + u * THREADS, p = e / VPP, v = e - p * VPP, r = p / nm, m = 1 + p - r * nm;
        const int x0 = 2 * m - 3;
        un[u].src = (r * W + x0) * d.C + c0 + 8 * v;
        un[u].dst = e < units ? 8 * v * PLANE + (r + P) * DPM_WORDS + m : -1;
        un[u].flags = (x0 >= 0 ? DPM_LO : 0) | (x0 + 1 < W ? DPM_HI : 0);
    }
    uint4 px[U][2];
    auto load = [&](unsigned b) {
        if (b < (unsigned)d.B) dpm_load(in + b * img, in, un, d.C, px);
    };
    auto store = [&]() { dpm_store(tile, un, px, PLANE, PLANE); };
    dpm_each_image(d.B, load, store, [&](unsigned b) {
        float acc[2][2][4] = {};
        dpm_band_mma<PLANE>(tile + 2 * warp * PLANE, bfrag, g, t4, acc);
        if constexpr (SUMS) {
            #pragma unroll
            for (int cc = 0; cc < 2; cc++)
                #pragma unroll
                for (int jt = 0; jt < 2; jt++)   // D: rows g, g + 8; columns jt * 8 + 2 t4, + 1
                    dw_put_sums(sums, 2 * warp + cc, PS, RS, g, jt * 8 + 2 * t4, acc[cc][jt]);
        } else {
            // output (m, x) is staged pixel (m + P, x + P)
            dpm_finish_in_place<PLANE>(tile16 + 2 * (2 * warp * PLANE + P * DPM_WORDS) + P, acc, bv, flags, H, W, g, t4);
        }
        __syncthreads();
        if constexpr (PROJ) {
            // A thread per pair of output pixels (xx, xx + 1), xx odd from -1: their CG results,
            // staged (r + P, xx + P) and (r + P, xx + 1 + P), are one 32-bit word a channel
            // (channels PLANE words apart), against the projection's rows, in channel order.
            float *part = proj.part + ((size_t)blockIdx.x * d.B + b) * H * W * proj.m;
            float pwr[DW_PROJ_M][CG];
            #pragma unroll
            for (int o = 0; o < DW_PROJ_M; o++)
                #pragma unroll
                for (int c = 0; c < CG; c++) pwr[o][c] = sums[o * CG + c];
            const int pairs = W / 2 + 1;   // a row's: (-1, 0) .. , past the image where W is even
            for (int e = threadIdx.x; e < H * pairs; e += THREADS) {
                const int r = e / pairs, xx = 2 * (e - r * pairs) - 1;
                const unsigned *staged = tile + (r + P) * DPM_WORDS + (xx + P) / 2;
                float s[2][DW_PROJ_M] = {};
                #pragma unroll
                for (int c = 0; c < CG; c++) {
                    const unsigned word = staged[c * PLANE];
                    const float v[2] = {__uint_as_float(word << 16), __uint_as_float(word & 0xffff0000u)};
                    #pragma unroll
                    for (int h = 0; h < 2; h++)
                        #pragma unroll
                        for (int o = 0; o < DW_PROJ_M; o++) s[h][o] = fmaf(v[h], pwr[o][c], s[h][o]);
                }
                const long long px = (long long)r * W + xx;   // -1 for the first pair's first pixel
                #pragma unroll
                for (int h = 0; h < 2; h++)
                    #pragma unroll
                    for (int o = 0; o < DW_PROJ_M; o++)
                        if (o < proj.m && xx + h >= 0 && xx + h < W) part[(px + h) * proj.m + o] = s[h][o];
            }
            return;
        }
        // Out along channels, from staged (r + P, xx + P).
        bf16 *o = out + b * img + c0;
        if constexpr (SUMS) {
            for (int e = threadIdx.x; e < H * W * VPP; e += THREADS) {
                const int pix = e / VPP, v8 = 8 * (e - pix * VPP), r = pix / W, xx = pix - r * W;
                const unsigned short *staged = tile16 + 2 * (v8 * PLANE + (r + P) * DPM_WORDS) + xx + P;
                dw_store_out8(o + ((size_t)r * W + xx) * d.C + v8, sums + v8 * PS + r * RS + xx, PS,
                              bias ? bias + c0 + v8 : nullptr, flags,
                              [&](int c) { return __uint_as_float((unsigned)staged[2 * c * PLANE] << 16); });
            }
        } else {
            dpm_write_out<PLANE, THREADS, VPP>(tile16 + 2 * P * DPM_WORDS + P, o, H, W, d.C);
        }
    });
}

template <int CG, bool SUMS, bool PROJ = false>
static void dpm_launch(Ctx *ctx, const bf16 *in, const bf16 *w, const bf16 *bias, bf16 *out,
                       const DwconvShape &d, int flags, DwProj proj = DwProj{}) {
    const bool side = d.H == DPM_SIDE && d.W == DPM_SIDE;   // 14 x 14: 112 pairs, one unit a thread
    auto kernel = side ? dwconv_plane_mma_kernel<CG, 1, DPM_SIDE, SUMS, PROJ>
                : d.H * ((d.W + 2) / 2) <= 128 ? dwconv_plane_mma_kernel<CG, 1, 0, SUMS, PROJ>
                                               : dwconv_plane_mma_kernel<CG, DPM_PAIRS, 0, SUMS, PROJ>;
    const int groups = d.C / CG;
    dim3 grid((unsigned)groups, dwp_image_blocks(ctx, kernel, 16 * CG, 0, groups, d.B));
    kernel<<<grid, 16 * CG, 0, cuda_stream_of(ctx)>>>(in, w, bias, out, d, flags, proj);
    CUDA_CHECK_LAUNCH();
}

bool cuda_dwconv_plane_mma(Ctx *ctx, const bf16 *in, const bf16 *w, const bf16 *bias, bf16 *out,
                           const DwconvShape &d, int flags, DwProj *proj) {
    if (d.k != DPM_K || d.C % 8 != 0 || d.H > DWP_MAX_SIDE || d.W > DWP_MAX_SIDE || d.W <= 8 ||
        d.B == 0 || !aligned16(in) || !aligned16(out))
        return false;
    // 16 channels a block where C allows: a warp's loads and stores then take 32 bytes of a pixel
    // (H100, 14 x 14 x 576: 0.051 ms a forward, 0.058 at 8 channels, with half the L1 wavefronts
    // of scattered 16-byte accesses).
    const bool sums = flags & DW_ACCUM;
    if (proj) {   // the projection reads the results from the staged planes
        if (sums || proj->m > DW_PROJ_M) return false;
        proj->groups = d.C % 16 == 0 ? d.C / 16 : d.C / 8;
        if (d.C % 16 == 0) dpm_launch<16, false, true>(ctx, in, w, bias, out, d, flags, *proj);
        else dpm_launch<8, false, true>(ctx, in, w, bias, out, d, flags, *proj);
        return true;
    }
    if (d.C % 16 == 0) sums ? dpm_launch<16, true>(ctx, in, w, bias, out, d, flags) : dpm_launch<16, false>(ctx, in, w, bias, out, d, flags);
    else sums ? dpm_launch<8, true>(ctx, in, w, bias, out, d, flags) : dpm_launch<8, false>(ctx, in, w, bias, out, d, flags);
    return true;
}

// ---- dw and db, and the backward in one pass ----------------------------------------------------
// dwconv_mma.cu's dw product on the same resident blocks: per channel and dy row y,
//   D (16 x 8) += A (16 x 16) B (16 x 8),  A[j][q] = dy[y][q - j + P],  B[q][i] = in[y + i - P][q],
// so that D[j][i] = dw[i][j] (j, i < K) summed over the row's 16 columns (every pair with both in
// the image counted once, the rest meeting zeros). Two dy rows an MMA, the second in A's rows
// 8 - 15 against B's eighth column (dw_grad_mma2, dwconv_mma.h), and where db is wanted a second
// MMA of the same A against ones for the bias gradient: 7 pairs for a 14 x 14 image. (The mixer's
// 7x7 has no bias; without those MMAs, H100: 14 x 14 x 576 backward 0.083 -> 0.081 ms.)
// Per image the block stages its channels' x rows (input column x at staged column x) and dy rows
// (dy row r at staged row r + P, dy column c at staged column c + DPD_OFF, so that A's column
// pairs are words for even j; odd j's come from the copy below), the next image's pixels loaded
// into registers meanwhile. Four MMA chains a warp (2 channels x even and odd rows) sum over the
// block's images; each block's sums are one row of the partial matrix (image blocks, C k^2 + C),
// added in a fixed order.
// A's pair for lane (g, t4), dy columns 2 t4 - g + P and one on, starts at staged column 2 t4 - g +
// 8: a word for even g. For odd g the block keeps a second copy of dy's rows staged one element
// later (dy column c at element c + DPD_OFF + 1 of a row, rows 0 .., no halo), where the pair is
// a word too: one shared load an A register, no permutes (the pairs from two words each and a
// byte permute took 10 loads an MMA, and the one pass at 14 x 14 was bound by its shared loads,
// H100). The copy's planes are the staged planes' size modulo 32 words and start so that a
// warp's words of the two copies (words 1 .. 7 of a row in each) lie on different banks. A staged
// dy row is DPM_WORDS long, as the y / dx pass's rows: with DX the same planes are the dx
// product's input (zero rows P above and below, dy column -P in word 1), and dx goes out as the
// y / dx pass's output does.
enum { DPD_OFF = 5 };
static_assert(3 * 128 >= (int)DWP_MAX_SIDE * ((DWP_MAX_SIDE + 1) / 2 + (DWP_MAX_SIDE + 2) / 2),
              "three units a thread stage a 16 x 16 image's x and dy");
static_assert((DPM_P + DPD_OFF) % 2 == 0, "A's pairs are words for even j");
static_assert((DPD_OFF - DPM_P) % 2 == 0, "the dx product's pairs are words");
static_assert(2 * (1 + (DWP_MAX_SIDE + 2) / 2) + 1 < 2 * DPM_WORDS,
              "the dy pairs (the last one's word 1 + (W + 2) / 2) lie in a row");

// U: units a thread loads an image (x pairs, then dy pairs, CG / 8 vectors each). S > 0: the
// images are S x S. DX: dx = the mirrored taps of dy (w, flags: DW_FLIP, DW_RESID as for the y /
// dx pass; no DW_ACCUM) goes out too. DB: db wanted.
template <int CG, int U, int S, bool DX, bool DB>
__global__ void __launch_bounds__(16 * CG)
dwconv_plane_mma_dw_kernel(const bf16 *__restrict__ dy, const bf16 *__restrict__ in, DwconvShape d,
                           float *__restrict__ partial, const bf16 *__restrict__ w, bf16 *__restrict__ dx,
                           int flags) {
    constexpr int K = DPM_K, P = DPM_P, KK = K * K, THREADS = 16 * CG, VPP = CG / 8;
    constexpr int PLANE = dw_stage_plane(DPM_ROWS * DPM_WORDS);
    // The shifted copy: DPM_TH rows a plane, PLANE modulo 32 words; its first plane starts PAD
    // words on, 16 banks from the first copy's row P.
    constexpr int PLANE2 = PLANE - (PLANE - DPM_TH * DPM_WORDS) / 32 * 32;
    constexpr int PAD = ((P * DPM_WORDS - CG * PLANE - 16) % 32 + 32) % 32;
    constexpr int WORDS = 2 * CG * PLANE + PAD + CG * PLANE2;
    __shared__ __align__(16) unsigned stage[WORDS];
    unsigned *xs = stage;                // (CG, ROWS, SW): input row r - P, column s
    unsigned *ds = stage + CG * PLANE;   // (CG, ROWS, SW): dy row r - P, column s - DPD_OFF
    unsigned *ds2 = ds + CG * PLANE + PAD;   // (CG, TH, SW): dy row r, column s - DPD_OFF - 1
    const int c0 = blockIdx.x * CG, H = dpm_side<S>(d.H), W = dpm_side<S>(d.W);
    const size_t img = (size_t)H * W * d.C;
    for (int e = threadIdx.x; e < WORDS; e += THREADS) stage[e] = 0u;

    // Units, VPP a pair: x pair p is word p % nx of input row p / nx (columns 2m, 2m + 1); dy
    // pair p (after the x pairs) word 2 + p % nd of dy row p / nd (columns 2m - 5, 2m - 4).
    const int nx = (W + 1) / 2, nd = (W + 2) / 2, xpairs = H * nx, units = (xpairs + H * nd) * VPP;
    DpmUnit un[U];
    #pragma unroll
    for (int u = 0; u < U; u++) {
        const int e = threadIdx.x + u * THREADS, p = e / VPP, v = e - p * VPP;
        const bool is_dy = p >= xpairs;
        const int q = is_dy ? p - xpairs : p, n = is_dy ? nd : nx, r = q / n;
        const int m = q - r * n + (is_dy ? 2 : 0), col = is_dy ? 2 * m - DPD_OFF : 2 * m;
        un[u].src = (r * W + col) * d.C + c0 + 8 * v;
        un[u].dst = e >= units ? -1 : (is_dy ? CG * PLANE : 0) + 8 * v * PLANE + (r + P) * DPM_WORDS + m;
        un[u].flags = (col >= 0 ? DPM_LO : 0) | (col + 1 < W ? DPM_HI : 0) | (is_dy ? DPM_DY : 0);
        un[u].dst2 = 2 * (8 * v * PLANE2 + r * DPM_WORDS) + col + DPD_OFF + 1;
    }
    uint4 px[U][2];
    auto load = [&](unsigned b) {
        if (b < (unsigned)d.B) dpm_load(in + b * img, dy + b * img, un, d.C, px);
    };
    auto store = [&]() {
        dpm_store(stage, un, px, PLANE, PLANE);
        dpm_store_shifted(reinterpret_cast<unsigned short *>(ds2), un, px, PLANE2);
    };
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
    const unsigned ones = Vec<bf16, 8>::pair(1.0f, 1.0f);
    // Per channel of the warp, this lane's word of dy row 0 holding A[g][2 t4] and A[g][2 t4 + 1]
    // (the first copy at even g, the shifted one at odd g) and of x row g (B's column i = g:
    // staged x row y + g), worked out once.
    const unsigned *drow0[2], *xrow0[2];
    #pragma unroll
    for (int cc = 0; cc < 2; cc++) {
        const int ch = 2 * warp + cc, at = 2 * t4 - g + P + DPD_OFF;
        drow0[cc] = g & 1 ? ds2 + ch * PLANE2 + (at + 1) / 2 : ds + ch * PLANE + P * DPM_WORDS + at / 2;
        xrow0[cc] = xs + ch * PLANE + g * DPM_WORDS + t4;
    }
    // DX: the warp's two channels' B fragments of the mirrored taps, for every image
    unsigned bfrag[2][DX ? K : 1][2];
    if constexpr (DX)
        #pragma unroll
        for (int cc = 0; cc < 2; cc++) dw_band_fragments<K>(w + (size_t)(c0 + 2 * warp + cc) * KK, flags, g, t4, bfrag[cc]);
    unsigned short *ds16 = reinterpret_cast<unsigned short *>(ds);
    float acc[2][2][4] = {}, acc_db[2][2][4] = {};        // per channel, per row pair parity
    dpm_each_image(d.B, load, store, [&](unsigned b) {
        // dy rows y and y + 1 (past the image: the staged zeros; their input rows reach staged row
        // 21, the last, past the image zeros too)
        auto rows2 = [&](int y, int h) {   // h = y / 2 % 2, a constant at each call
            #pragma unroll
            for (int cc = 0; cc < 2; cc++) {
                const unsigned *drow = drow0[cc] + y * DPM_WORDS;
                dw_grad_mma2_a<DB>(acc[cc][h], acc_db[cc][h], drow[0], drow[DPM_WORDS], drow[4], drow[DPM_WORDS + 4],
                                   xrow0[cc] + y * DPM_WORDS, ones);
            }
        };
        dw_each_with_parity<(S + 1) / 2>((H + 1) / 2, [&](int p, int h) { rows2(2 * p, h); });
        if constexpr (DX) {
            // dy column -P is word 1 of a staged row; dx (m, x) goes over staged dy (m + P, x + DPD_OFF)
            float dacc[2][2][4] = {};
            const float none[2] = {0.0f, 0.0f};
            dpm_band_mma<PLANE>(ds + 2 * warp * PLANE + (DPD_OFF - P) / 2, bfrag, g, t4, dacc);
            unsigned short *t16 = ds16 + 2 * (2 * warp * PLANE + P * DPM_WORDS) + DPD_OFF;
            dpm_finish_in_place<PLANE>(t16, dacc, none, flags, H, W, g, t4);
            __syncthreads();
            dpm_write_out<PLANE, THREADS, VPP>(ds16 + 2 * P * DPM_WORDS + DPD_OFF, dx + b * img + c0, H, W, d.C);
        }
    });
    float *row = partial + (size_t)blockIdx.y * ((size_t)d.C * KK + d.C);
    #pragma unroll
    for (int cc = 0; cc < 2; cc++) dw_put_partial2<K, DB>(row, d.C, c0 + 2 * warp + cc, g, t4, acc[cc], acc_db[cc]);
}

template <int CG, bool DX>
static void dpm_launch_dw(Ctx *ctx, const bf16 *dy, const bf16 *in, const DwconvShape &d, float *dw,
                          float *db, const bf16 *w, bf16 *dx, int flags) {
    const int units = d.H * ((d.W + 1) / 2 + (d.W + 2) / 2) * (CG / 8), threads = 16 * CG;
    const bool side = d.H == DPM_SIDE && d.W == DPM_SIDE;   // 14 x 14: 210 pairs, two units a thread
    auto pick = [&](auto dbc) {
        constexpr bool DB = decltype(dbc)::value;
        return side && units <= 2 * threads ? dwconv_plane_mma_dw_kernel<CG, 2, DPM_SIDE, DX, DB>
               : units <= 2 * threads      ? dwconv_plane_mma_dw_kernel<CG, 2, 0, DX, DB>
                                           : dwconv_plane_mma_dw_kernel<CG, 3, 0, DX, DB>;
    };
    auto kernel = db ? pick(std::true_type{}) : pick(std::false_type{});
    const int groups = d.C / CG;
    const unsigned blocks = dwp_image_blocks(ctx, kernel, threads, 0, groups, d.B);
    const size_t width = (size_t)d.C * DPM_K * DPM_K + d.C;
    float *partial = (float *)cuda_scratch(ctx, (size_t)blocks * width * sizeof(float));
    kernel<<<dim3((unsigned)groups, blocks), threads, 0, cuda_stream_of(ctx)>>>(dy, in, d, partial, w, dx, flags);
    CUDA_CHECK_LAUNCH();
    cuda_sum_partials(ctx, partial, blocks, width, (size_t)d.C * DPM_K * DPM_K, dw, db);
}

static bool dpm_dw_covers(const bf16 *dy, const bf16 *in, const DwconvShape &d) {
    return d.k == DPM_K && d.C % 8 == 0 && d.H <= DWP_MAX_SIDE && d.W <= DWP_MAX_SIDE && d.W > 8 && d.B > 0 &&
           aligned16(dy) && aligned16(in);
}

bool cuda_dwconv_plane_mma_dw(Ctx *ctx, const bf16 *dy, const bf16 *in, const DwconvShape &d, float *dw,
                              float *db) {
    if (!dpm_dw_covers(dy, in, d)) return false;
    if (d.C % 16 == 0) dpm_launch_dw<16, false>(ctx, dy, in, d, dw, db, nullptr, nullptr, 0);
    else dpm_launch_dw<8, false>(ctx, dy, in, d, dw, db, nullptr, nullptr, 0);
    return true;
}

bool cuda_dwconv_plane_mma_bwd(Ctx *ctx, const bf16 *dy, const bf16 *in, const bf16 *w, bf16 *dx,
                               const DwconvShape &d, int flags, float *dw, float *db) {
    if (!dpm_dw_covers(dy, in, d) || (flags & (DW_ACCUM | DW_SILU)) || !aligned16(dx)) return false;
    if (d.C % 16 == 0) dpm_launch_dw<16, true>(ctx, dy, in, d, dw, db, w, dx, flags);
    else dpm_launch_dw<8, true>(ctx, dy, in, d, dw, db, w, dx, flags);
    return true;
}
