// CUDA: the mixer's 7x7 depthwise y / dx pass on images of at most 16 rows and 9 to 16 columns
// (gspn_hier's 14 x 14 stage) on tensor cores (kernels/cuda/dwconv_plane.h). On 8 columns or fewer
// one 16 x 8 tile a channel leaves most of each MMA idle, and dwconv_plane.cu's fp32 kernel is
// faster (H100, 7 x 7 x 1152: 0.048 ms a forward against 0.060). The product is dwconv_mma.cu's:
// per channel and tap row i, 16 output rows times output columns x0 .. x0 + 7 take
//   D (16 x 8) += A_i (16 x 16) B_i (16 x 8),  A_i[m][q] = in[m + i - P][x0 - P + q],
//                                              B_i[q][n] = w[i][q - n] where 0 <= q - n < K,
// one m16n8k16 bf16 MMA with fp32 sums, here with the whole image as one 16-row tile: a channel's
// 14 x 14 output is two 16 x 8 tiles, 14 MMAs, where the fp32 kernel issues about 300 warp FMAs.
//
// Blocks stay resident on one group of 8 channels and take images in turn. Each warp builds its
// two channels' B fragments once; the staged planes' zero border (rows and columns past the image)
// is written once; the next image's pixels are loaded into registers while the current image is
// multiplied and written out, then stored channel-major into the staged planes (a fragment's
// column pairs are 32-bit words). The sums go out through shared memory along channels (16-byte
// stores), with the bias, the residual, the prior value and SiLU as the DW_* flags ask.
#include "dwconv_plane.h"

enum {
    DPM_K = 7,
    DPM_P = DPM_K / 2,
    DPM_TH = 16,                      // the MMA tile's rows: the image's, then zeros
    DPM_ROWS = DPM_TH + DPM_K - 1,    // staged rows: input rows -P .. TH + P - 1
    DPM_SW = 24,                      // staged columns: input columns -P .. 20
    DPM_WORDS = DPM_SW / 2,           // 32-bit words a staged row
    DPM_PAIRS = 2,                    // pixel pairs a thread loads an image (16 x 16: 144 pairs)
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

// Floats a row of the sums' staging: 16 pixels of CG channels, plus 4 (the 8 rows one fragment
// store writes spread over the banks; rows stay 16-byte aligned).
template <int CG> __host__ __device__ constexpr int dpm_sum_stride() { return 16 * CG + 4; }

// Block (C / CG, image blocks), 16 CG threads: the block takes images blockIdx.y, + gridDim.y, ...
// U: units (below) a thread loads an image, at most DPM_PAIRS.
template <int CG, int U>
__global__ void __launch_bounds__(16 * CG)
dwconv_plane_mma_kernel(const bf16 *__restrict__ in, const bf16 *__restrict__ w, const bf16 *__restrict__ bias,
                        bf16 *__restrict__ out, DwconvShape d, int flags) {
    constexpr int K = DPM_K, P = DPM_P, KK = K * K, STRIDE = dpm_sum_stride<CG>(), TX = 2;
    constexpr int THREADS = 16 * CG, VPP = CG / 8;   // VPP: 16-byte vectors a pixel
    constexpr int PLANE = DPM_ROWS * DPM_WORDS;      // words a channel's staged plane
    __shared__ __align__(16) unsigned tile[CG * PLANE];    // (CG, ROWS, SW) bf16 pairs
    __shared__ __align__(16) float sums[DPM_TH * STRIDE];  // (TH, 16, CG), rows padded
    const unsigned short *tile16 = reinterpret_cast<const unsigned short *>(tile);
    const int c0 = blockIdx.x * CG;
    const size_t img = (size_t)d.H * d.W * d.C;
    for (int e = threadIdx.x; e < CG * PLANE; e += THREADS) tile[e] = 0u;

    // The warp's two channels' B fragments, for every image.
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
    unsigned bfrag[2][K][2];
    #pragma unroll
    for (int cc = 0; cc < 2; cc++) dw_band_fragments<K>(w + (size_t)(c0 + 2 * warp + cc) * KK, flags, g, t4, bfrag[cc]);
    // An image's pixel pairs, VPP vectors each: unit e is vector e % VPP of pair p = e / VPP, which
    // is word 1 + p % nm of image row p / nm.
    const int nm = (d.W + 2) / 2, units = d.H * nm * VPP;
    uint4 px[U][2];
    auto load = [&](unsigned b) {
        #pragma unroll
        for (int u = 0; u < U; u++) {
            const int e = threadIdx.x + u * THREADS, p = e / VPP, v = e - p * VPP, r = p / nm;
            const int x0 = 2 * (p - r * nm) - 1;
            #pragma unroll
            for (int q = 0; q < 2; q++) {
                px[u][q] = make_uint4(0, 0, 0, 0);
                if (b < (unsigned)d.B && e < units && x0 + q >= 0 && x0 + q < d.W)
                    px[u][q] = *reinterpret_cast<const uint4 *>(in + b * img + ((size_t)r * d.W + x0 + q) * d.C + c0 + 8 * v);
            }
        }
    };
    auto store = [&]() {   // channel c of both pixels: one word's halves
        #pragma unroll
        for (int u = 0; u < U; u++) {
            const int e = threadIdx.x + u * THREADS, p = e / VPP, v = e - p * VPP, r = p / nm;
            const int m = 1 + p - r * nm;
            if (e >= units) break;
            const unsigned lo[4] = {px[u][0].x, px[u][0].y, px[u][0].z, px[u][0].w};
            const unsigned hi[4] = {px[u][1].x, px[u][1].y, px[u][1].z, px[u][1].w};
            unsigned *dst = tile + 8 * v * PLANE + (r + P) * DPM_WORDS + m;
            #pragma unroll
            for (int c = 0; c < 8; c++)
                dst[c * PLANE] = __byte_perm(lo[c / 2], hi[c / 2], c % 2 ? 0x7632u : 0x5410u);
        }
    };
    load(blockIdx.y);
    __syncthreads();   // the zeros in before any image's words
    for (unsigned b = blockIdx.y; b < (unsigned)d.B; b += gridDim.y) {
        store();
        load(b + gridDim.y);   // in flight until the next image's store
        __syncthreads();
        // A_i's fragment: rows g and g + 8 (staged rows + i), the words of column pairs 2 t4 and
        // 2 t4 + 8 of the tile. Four independent chains: 2 channels x TX tiles.
        float acc[2][TX][4] = {};
        #pragma unroll
        for (int i = 0; i < K; i++)
            #pragma unroll
            for (int cc = 0; cc < 2; cc++) {
                const unsigned *tw = tile + (2 * warp + cc) * PLANE;
                #pragma unroll
                for (int jt = 0; jt < TX; jt++) {
                    const int wd = jt * 4 + t4;
                    const unsigned a0 = tw[(g + i) * DPM_WORDS + wd], a1 = tw[(g + 8 + i) * DPM_WORDS + wd];
                    const unsigned a2 = tw[(g + i) * DPM_WORDS + wd + 4], a3 = tw[(g + 8 + i) * DPM_WORDS + wd + 4];
                    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                        : "+f"(acc[cc][jt][0]), "+f"(acc[cc][jt][1]), "+f"(acc[cc][jt][2]), "+f"(acc[cc][jt][3])
                        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(bfrag[cc][i][0]), "r"(bfrag[cc][i][1]));
                }
            }
        // D's fragment: rows g and g + 8, columns jt * 8 + 2 t4 and + 1.
        #pragma unroll
        for (int cc = 0; cc < 2; cc++)
            #pragma unroll
            for (int jt = 0; jt < TX; jt++) {
                const int c = 2 * warp + cc, col = jt * 8 + 2 * t4;
                sums[g * STRIDE + col * CG + c] = acc[cc][jt][0];
                sums[g * STRIDE + (col + 1) * CG + c] = acc[cc][jt][1];
                sums[(g + 8) * STRIDE + col * CG + c] = acc[cc][jt][2];
                sums[(g + 8) * STRIDE + (col + 1) * CG + c] = acc[cc][jt][3];
            }
        __syncthreads();
        // Out along channels: a thread per 8 channels of an output pixel.
        bf16 *o = out + b * img + c0;
        for (int e = threadIdx.x; e < d.H * d.W * VPP; e += THREADS) {
            const int pix = e / VPP, v8 = 8 * (e - pix * VPP), r = pix / d.W, xx = pix - r * d.W;
            const float4 *s4 = reinterpret_cast<const float4 *>(sums + r * STRIDE + xx * CG + v8);
            const float4 lo = s4[0], hi = s4[1];
            float v[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
            bf16 *p = o + ((size_t)r * d.W + xx) * d.C + v8;
            float prior[8], bv[8];
            if (flags & DW_ACCUM) load_v<8>(p, prior);
            if (bias) load_v<8>(bias + c0 + v8, bv);
            #pragma unroll
            for (int c = 0; c < 8; c++) {
                if (bias) v[c] += bv[c];
                if (flags & DW_RESID)   // staged (r + P, xx + P) of channel v8 + c
                    v[c] += __uint_as_float((unsigned)tile16[2 * ((v8 + c) * PLANE + (r + P) * DPM_WORDS) + xx + P] << 16);
                if (flags & DW_ACCUM) v[c] += prior[c];
                if (flags & DW_SILU) v[c] = dw_silu<bf16>(v[c]);
            }
            store_v<8>(p, v);
        }
        __syncthreads();   // the planes and the sums are free for the next image
    }
}

template <int CG>
static void dpm_launch(Ctx *ctx, const bf16 *in, const bf16 *w, const bf16 *bias, bf16 *out,
                       const DwconvShape &d, int flags) {
    auto kernel = d.H * ((d.W + 2) / 2) <= 128 ? dwconv_plane_mma_kernel<CG, 1> : dwconv_plane_mma_kernel<CG, DPM_PAIRS>;
    const int groups = d.C / CG;
    dim3 grid((unsigned)groups, dwp_image_blocks(ctx, kernel, 16 * CG, 0, groups, d.B));
    kernel<<<grid, 16 * CG, 0, cuda_stream_of(ctx)>>>(in, w, bias, out, d, flags);
    CUDA_CHECK_LAUNCH();
}

bool cuda_dwconv_plane_mma(Ctx *ctx, const bf16 *in, const bf16 *w, const bf16 *bias, bf16 *out,
                           const DwconvShape &d, int flags) {
    if (d.k != DPM_K || d.C % 8 != 0 || d.H > DWP_MAX_SIDE || d.W > DWP_MAX_SIDE || d.W <= 8 ||
        d.B == 0 || !aligned16(in) || !aligned16(out))
        return false;
    // 16 channels a block where C allows: a warp's loads and stores then take 32 bytes of a pixel
    // (H100, 14 x 14 x 576: 0.051 ms a forward, 0.058 at 8 channels, with half the L1 wavefronts
    // of scattered 16-byte accesses).
    if (d.C % 16 == 0) dpm_launch<16>(ctx, in, w, bias, out, d, flags);
    else dpm_launch<8>(ctx, in, w, bias, out, d, flags);
    return true;
}
