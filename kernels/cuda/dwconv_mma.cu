// CUDA: the depthwise convolution's y / dx pass on tensor cores (kernels/cuda/dwconv_mma.h).
// Along a row, a depthwise convolution is a banded (Toeplitz) matrix product per channel. For tap
// row i, 16 output rows times output columns x0 .. x0 + 7 of one channel take
//   D (16 x 8) += A_i (16 x 16) B_i (16 x 8),  A_i[m][q] = in[row m + i - P][x0 - P + q],
//                                              B_i[q][n] = w[i][q - n] where 0 <= q - n < K, else 0,
// one m16n8k16 bf16 MMA with fp32 sums (products of two bf16 values are exact in fp32). At k = 7
// that is 7 MMAs per 16 x 8 tile, 44% of whose products lie in the band: still several times the
// rate of fp32 FMAs, which bound the 7x7 kernels of dwconv.cu.
//
// A block owns CG channels (16 where C allows, else 8) of MMA_TH output rows across the whole
// width. It stages their TH + K - 1 input rows channel-major in shared memory (a fragment's column
// pairs are then 32-bit words), each warp loads its channel's K B fragments (built once a call,
// dw_band_frag_kernel) and runs every column tile, and the results go out along channels (16-byte
// stores). Where nothing is added to out's prior value, a warp finishes each tile in registers
// (bias, residual, SiLU, rounded once) and writes it as bf16 into its channel's staged rows, over
// columns no later tile reads, so shared memory holds the input rows alone: three blocks an SM,
// whose staging, products and write-out overlap. With DW_ACCUM (and where it measured faster) the
// fp32 sums are staged channel-major (dwconv_mma.h) and finished as they go out, a warp per
// channel, two blocks an SM.
//
// The dw pass is the same product with the roles turned (dwconv_mma_dw_kernel below): the taps
// become the 7 x 8 result of one MMA per dy row and 16 columns, summed in registers over a run
// of images. Where dx is written and rows are at most 32 columns, that kernel makes dx too from
// the dy it stages (the backward in one pass, below).
#include "dwconv_mma.h"

enum { MMA_TH = 16, MMA_CG = 8, MMA_K = 7 };   // MMA_CG: the smallest channel group
// Threads of a block of CG channels. Every phase of a block (staging, products, write-out) waits on
// latency. With the fp32 sums staged (SUMS), two blocks fill the shared memory, and at half a warp
// per channel they left the 56 x 56 pass at 16 warps an SM (H100, 56 x 56 x 144 forward: 0.221 ->
// 0.206 ms): a warp per channel. Without them, blocks of 8 warps: two channels a warp at 16
// channels, one at 8 (mma_launch_flags says where the staged sums stay), three blocks an SM. Four
// (32 warps) held a thread to 64 registers, where the tile loop spilled or ran one chain of
// dependent MMAs; three leave 85 and take two chains (H100, forward, against four blocks, one
// chain and mma_stage's earlier flat index: 56 x 56 x 144 0.171 -> 0.129 ms, 56 x 56 x 192 0.235
// -> 0.178, 28 x 28 x 288 0.077 -> 0.080; three blocks alone: 0.134, 0.185, 0.083).
__host__ __device__ constexpr int mma_threads(int cg, bool sums) { return sums ? 32 * cg : 256; }
__host__ __device__ constexpr int mma_blocks_per_sm(bool sums) { return sums ? 2 : 3; }

// a / b for 0 <= a < 2^22 and 0 < b < 2^10, from b's fp32 reciprocal (inv_b = 1 / b): a + 1/2 lies
// at least 1 / (2 b) from a multiple of b, far beyond the product's rounding (a few 2^-24 of a
// quotient below 2^12). An integer division by a value known only at run time is about 20
// instructions, and the staging and write-out loops below take one per element they move. (Their
// shared-memory caps keep staged rows below 200 columns and blocks below 2^16 elements.)
__device__ __forceinline__ int mma_div(int a, float inv_b) { return (int)(((float)a + 0.5f) * inv_b); }

// Staged row width (bf16 elements) of at least `need` (a multiple of 8), 8 modulo 16: a row is
// then 4 modulo 8 words, so the 8 rows of one fragment load (4 words each) fall on 8 different
// bank quads.
__host__ __device__ constexpr int mma_row_width(int need) { return need % 16 == 8 ? need : need + 8; }

// Elements between two channels' staged planes of `rows` rows `width` (even) wide.
__host__ __device__ constexpr int mma_plane(int rows, int width) { return 2 * dw_stage_plane(rows * width / 2); }

// Stages rows y_first .. y_first + nrows - 1 of one image's CG channels from img (the image at
// its first channel) into dst channel-major as bf16 bits, channel c's rows cstride elements apart
// (cstride and sw even): staged pixel (r, s) is (y_first + r, s - off), zero outside the image. A
// unit is a pair of neighbouring staged pixels and 8 channels: two 16-byte loads, one 32-bit store
// per channel (shared-memory stores, not loads, bound the staging). A thread keeps one unit of a
// row and walks rows rpp apart (rpp: the rows a block's threads cover at once), so its column
// bounds, source and destination are set up once and a row costs a pointer step; it issues the
// loads of MMA_STAGE_U rows before any store: one memory latency per batch, not per row. (A flat
// index over (row, unit) took about 100 instructions a unit, 18 of them its loads, permutes and
// stores: H100, Nsight Compute, 56 x 56 x 144, where the y / dx pass went from 65.6 M to 50.7 M
// instructions.)
// A block of THREADS threads: CG / 8 units a pixel pair, which a warp's loads take side by side.
enum { MMA_STAGE_U = 4 };
template <int CG, int THREADS>
__device__ __forceinline__ void mma_stage(const bf16 *__restrict__ img, const DwconvShape &d,
                                          int y_first, int nrows, int sw, int off,
                                          unsigned short *__restrict__ dst, size_t cstride) {
    constexpr int VPP = CG / 8;
    const int pairs = sw / 2, upr = pairs * VPP;          // sw even: a pair never straddles two rows
    const int rpp = THREADS >= upr ? THREADS / upr : 1;   // rows a pass of the block
    unsigned *__restrict__ dst32 = reinterpret_cast<unsigned *>(dst);
    const size_t cstride32 = cstride / 2, row_step = (size_t)rpp * d.W * d.C;
    for (int e = threadIdx.x; e < rpp * upr; e += THREADS) {
        const int r0 = e / upr, u = e - r0 * upr, j = u / VPP, vec = u - j * VPP, xx = 2 * j - off;
        const bool in0 = xx >= 0 && xx < d.W, in1 = xx + 1 >= 0 && xx + 1 < d.W;
        const bf16 *src = img + ((ptrdiff_t)(y_first + r0) * d.W + xx) * d.C + 8 * vec;
        unsigned *dp = dst32 + 8 * vec * cstride32 + (size_t)r0 * pairs + j;
        for (int r = r0; r < nrows; r += MMA_STAGE_U * rpp) {
            uint4 v[MMA_STAGE_U][2];
            #pragma unroll
            for (int k = 0; k < MMA_STAGE_U; k++) {
                const int rr = r + k * rpp, yy = y_first + rr;
                const bool row_in = rr < nrows && yy >= 0 && yy < d.H;
                const bf16 *p = src + k * row_step;
                v[k][0] = row_in && in0 ? *reinterpret_cast<const uint4 *>(p) : make_uint4(0, 0, 0, 0);
                v[k][1] = row_in && in1 ? *reinterpret_cast<const uint4 *>(p + d.C) : make_uint4(0, 0, 0, 0);
            }
            #pragma unroll
            for (int k = 0; k < MMA_STAGE_U; k++) {
                if (r + k * rpp >= nrows) break;
                unsigned *q = dp + (size_t)k * rpp * pairs;
                const unsigned lo[4] = {v[k][0].x, v[k][0].y, v[k][0].z, v[k][0].w};
                const unsigned hi[4] = {v[k][1].x, v[k][1].y, v[k][1].z, v[k][1].w};
                #pragma unroll
                for (int c = 0; c < 8; c++)   // channel c of both pixels: the word's halves
                    q[c * cstride32] = __byte_perm(lo[c / 2], hi[c / 2], c % 2 ? 0x7632u : 0x5410u);
            }
            src += MMA_STAGE_U * row_step;
            dp += (size_t)MMA_STAGE_U * rpp * pairs;
        }
    }
}

// Every channel's B fragments (dw_band_fragments), built once a call rather than by each of the
// many blocks that share a channel (28 scattered tap loads and their index arithmetic a lane and
// channel: a sixth of the y / dx pass's instructions at 56 x 56, H100): word e of tap row i for
// lane l of channel c at frag[((c K + i) 2 + e) 32 + l], so that a warp takes a channel's 2 K words
// as 2 K rows of 128 bytes.
template <int K>
__global__ void dw_band_frag_kernel(const bf16 *__restrict__ w, int C, int flags, unsigned *__restrict__ frag) {
    const int e = blockIdx.x * blockDim.x + threadIdx.x;   // (channel, lane)
    if (e >= C * 32) return;
    const int c = e / 32, lane = e % 32;
    unsigned bfrag[K][2];
    dw_band_fragments<K>(w + (size_t)c * K * K, flags, lane / 4, lane % 4, bfrag);
    #pragma unroll
    for (int i = 0; i < K; i++)
        #pragma unroll
        for (int h = 0; h < 2; h++) frag[((size_t)c * K * 2 + i * 2 + h) * 32 + lane] = bfrag[i][h];
}

// The y / dx pass's staged row width (bf16 elements) for tiles_x column tiles: their reach.
__host__ __device__ constexpr int mma_tile_width(int tiles_x) { return mma_row_width(tiles_x * 8 + 8); }

// The y / dx product of one channel over every column tile, from its staged planes ts (staged
// pixel (r, s): input (y0 - P + r, s - P); rows sw bf16 wide), its B fragments at fc (frag's words
// of the channel for this lane, dw_band_frag_kernel). bv: the bias, added where the tile is
// finished in registers. SUMS: the sums go to the staged fp32 sums (channel c, planes ps, rows rs);
// else each tile is finished (bias, residual, SiLU, rounded once) and written as bf16 to staged
// (m, x), a column no later tile reads. TWO: two chains of MMAs (tap rows 0 .. K / 2 and the
// rest) issued in turn, where the registers allow (more than 64 a thread): one chain of K
// dependent MMAs left each warp waiting on the previous MMA's sums between MMAs.
template <int K, int TX, bool SUMS, bool TWO>
__device__ __forceinline__ void mma_channel_tiles(unsigned short *ts, int sw, int tiles_x, const unsigned *__restrict__ fc,
                                                  float bv, int flags, float *sums, int c, int ps, int rs, int g, int t4) {
    constexpr int P = K / 2;
    unsigned bfrag[K][2];
    #pragma unroll
    for (int i = 0; i < K; i++) bfrag[i][0] = __ldg(fc + 64 * i), bfrag[i][1] = __ldg(fc + 64 * i + 32);
    unsigned *tw = reinterpret_cast<unsigned *>(ts);
    const int half = sw / 2;   // 32-bit words per staged row
    // A_i's fragment: rows g and g + 8 (staged rows + i), the words of column pairs 2 t4 and
    // 2 t4 + 8 of the tile. A tile's second word is the next tile's first: each is read once.
    unsigned a_lo[K][2];
    #pragma unroll
    for (int i = 0; i < K; i++) a_lo[i][0] = tw[(g + i) * half + t4], a_lo[i][1] = tw[(g + 8 + i) * half + t4];
    auto column_tile = [&](int jt) {
        constexpr int KH = TWO ? (K + 1) / 2 : K;
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f}, acc2[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        const int wcol = jt * 4 + t4;   // the word of columns jt * 8 + 2 t4, + 1
        #pragma unroll
        for (int n = 0; n < K; n++) {
            const int i = !TWO ? n : n % 2 ? KH + n / 2 : n / 2;
            const unsigned a2 = tw[(g + i) * half + wcol + 4], a3 = tw[(g + 8 + i) * half + wcol + 4];
            mma_16816_bf16(TWO && n % 2 ? acc2 : acc, a_lo[i][0], a_lo[i][1], a2, a3, bfrag[i][0], bfrag[i][1]);
            a_lo[i][0] = a2, a_lo[i][1] = a3;
        }
        if constexpr (TWO)
            #pragma unroll
            for (int e = 0; e < 4; e++) acc[e] += acc2[e];
        if constexpr (SUMS) {
            dw_put_sums(sums, c, ps, rs, g, jt * 8 + 2 * t4, acc);   // D: rows g, g + 8; columns 2 t4, + 1
        } else {
            // Output (m, x) for m = g, g + 8 and x = jt * 8 + 2 t4, + 1: its residual is staged
            // (m + P, x + P), which other lanes' results of this tile overwrite; its result goes
            // to staged (m, x), a column no later tile reads (their A starts at column jt * 8 + 8).
            float v[4];
            #pragma unroll
            for (int e = 0; e < 4; e++) {
                v[e] = acc[e] + bv;
                if (flags & DW_RESID)
                    v[e] += __uint_as_float((unsigned)ts[(g + 8 * (e / 2) + P) * sw + jt * 8 + 2 * t4 + e % 2 + P] << 16);
                if (flags & DW_SILU) v[e] = dw_silu<bf16>(v[e]);
            }
            __syncwarp();
            tw[g * half + wcol] = Vec<bf16, 8>::pair(v[0], v[1]);
            tw[(g + 8) * half + wcol] = Vec<bf16, 8>::pair(v[2], v[3]);
        }
    };
    if constexpr (TX > 0) {
        #pragma unroll
        for (int jt = 0; jt < TX; jt++) column_tile(jt);
    } else {
        #pragma unroll 1
        for (int jt = 0; jt < tiles_x; jt++) column_tile(jt);
    }
}

// The block's finished rows y0 .. (at most MMA_TH) out along channels, a thread per 8 channels of
// an output pixel, from staged (r, xx) of tile (CG channels tplane apart, rows sw wide; o: the
// image at the block's first channel).
template <int THREADS, int VPP>
__device__ __forceinline__ void mma_write_out(const unsigned short *tile, int tplane, int sw, bf16 *o,
                                              const DwconvShape &d, int y0) {
    const float inv_w = 1.0f / d.W;
    for (int e = threadIdx.x; e < MMA_TH * d.W * VPP; e += THREADS) {
        const int pix = e / VPP, v8 = 8 * (e - pix * VPP), r = mma_div(pix, inv_w), xx = pix - r * d.W, yy = y0 + r;
        if (yy >= d.H) break;   // e grows with r
        const unsigned short *res = tile + (size_t)v8 * tplane + r * sw + xx;
        unsigned word[4];
        #pragma unroll
        for (int h = 0; h < 4; h++) word[h] = res[2 * h * tplane] | (unsigned)res[(2 * h + 1) * tplane] << 16;
        *reinterpret_cast<uint4 *>(o + ((size_t)yy * d.W + xx) * d.C + v8) = make_uint4(word[0], word[1], word[2], word[3]);
    }
}

// TX > 0: tiles_x is TX, so every shared-memory offset below is a constant and the tile loop
// unrolls (at 56 x 56, index arithmetic was 40 of the loop's 62 instructions a tile); TX = 0: the
// arguments' tiles_x and sw. SUMS: the fp32 sums staged (see above). PROJ: the down projection's
// partial sums (DwProj) go out instead of the output, from the bf16 results in the staged planes
// (no SUMS: the projection adds nothing to a prior value).
template <int K, int CG, int TX, bool SUMS, bool PROJ = false>
__global__ void __launch_bounds__(mma_threads(CG, SUMS), mma_blocks_per_sm(SUMS))
dwconv_mma_kernel(const bf16 *__restrict__ in, const unsigned *__restrict__ frag, const bf16 *__restrict__ bias,
                  bf16 *__restrict__ out, DwconvShape d, int flags, int tiles_x_arg, int sw_arg, DwProj proj) {
    constexpr int P = K / 2, ROWS = MMA_TH + K - 1, THREADS = mma_threads(CG, SUMS), VPP = CG / 8;
    const int tiles_x = TX ? TX : tiles_x_arg, sw = TX ? mma_tile_width(TX) : sw_arg;
    extern __shared__ __align__(16) unsigned char mma_smem[];
    const int tplane = mma_plane(ROWS, sw), rs = dw_sum_row(tiles_x * 8), ps = dw_sum_plane(MMA_TH, tiles_x * 8);
    unsigned short *tile = reinterpret_cast<unsigned short *>(mma_smem);   // (CG, ROWS, sw) bf16 bits
    float *sums = reinterpret_cast<float *>(mma_smem + (size_t)CG * tplane * 2);   // SUMS: (CG, TH, rs)
    const int c0 = blockIdx.x * CG, y0 = blockIdx.y * MMA_TH;
    const size_t plane = (size_t)d.H * d.W * d.C, b = blockIdx.z;
    static_assert(!(PROJ && SUMS), "the projection reads the results finished in the staged planes");
    float *pws = sums;   // PROJ: the block's columns of proj.w (DW_PROJ_M, CG), after the planes
    if constexpr (PROJ)
        for (int e = threadIdx.x; e < DW_PROJ_M * CG; e += THREADS)
            pws[e] = e / CG < proj.m ? __bfloat162float(proj.w[(size_t)(e / CG) * d.C + c0 + e % CG]) : 0.0f;
    // Staged pixel (r, s) is input (y0 - P + r, s - P).
    mma_stage<CG, THREADS>(in + b * plane + c0, d, y0 - P, ROWS, sw, P, tile, (size_t)tplane);
    __syncthreads();
    const int lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
    for (int c = threadIdx.x / 32; c < CG; c += THREADS / 32)
        mma_channel_tiles<K, TX, SUMS, (65536 / (THREADS * mma_blocks_per_sm(SUMS)) > 64)>(
            tile + (size_t)c * tplane, sw, tiles_x, frag + (size_t)(c0 + c) * K * 2 * 32 + lane,
            !SUMS && bias ? __bfloat162float(bias[c0 + c]) : 0.0f, flags, sums, c, ps, rs, g, t4);
    __syncthreads();
    if constexpr (PROJ) {
        // A thread per pair of output pixels (xx, xx + 1) of the block's rows: their CG results
        // (staged (r, xx) and (r, xx + 1), one 32-bit word a channel, channels tplane apart)
        // against the projection's rows, in channel order.
        float *part = proj.part + ((size_t)blockIdx.x * d.B + b) * d.H * d.W * proj.m;
        float pwr[DW_PROJ_M][CG];
        #pragma unroll
        for (int o = 0; o < DW_PROJ_M; o++)
            #pragma unroll
            for (int c = 0; c < CG; c++) pwr[o][c] = pws[o * CG + c];
        // Rows rpp apart a thread (as mma_stage walks them).
        const int rows = min(MMA_TH, d.H - y0), pairs = (d.W + 1) / 2;   // an odd width's last pair has one pixel
        const int rpp = THREADS >= pairs ? THREADS / pairs : 1;
        for (int e = threadIdx.x; e < rpp * pairs; e += THREADS) {
            const int r0 = e / pairs, xx = 2 * (e - r0 * pairs);
            for (int r = r0; r < rows; r += rpp) {
                const int yy = y0 + r;
                float s[2][DW_PROJ_M] = {};
                #pragma unroll
                for (int c = 0; c < CG; c++) {
                    const unsigned word = *reinterpret_cast<const unsigned *>(tile + (size_t)c * tplane + r * sw + xx);
                    const float v[2] = {__uint_as_float(word << 16), __uint_as_float(word & 0xffff0000u)};
                    #pragma unroll
                    for (int h = 0; h < 2; h++)
                        #pragma unroll
                        for (int o = 0; o < DW_PROJ_M; o++) s[h][o] = fmaf(v[h], pwr[o][c], s[h][o]);
                }
                float *pp = part + ((size_t)yy * d.W + xx) * proj.m;
                if (proj.m == DW_PROJ_M && xx + 1 < d.W && ((uintptr_t)pp & 15) == 0) {
                    static_assert(DW_PROJ_M == 2, "a pair's sums are one 16-byte store");
                    *reinterpret_cast<float4 *>(pp) = make_float4(s[0][0], s[0][1], s[1][0], s[1][1]);
                    continue;
                }
                #pragma unroll
                for (int h = 0; h < 2; h++)
                    #pragma unroll
                    for (int o = 0; o < DW_PROJ_M; o++)
                        if (o < proj.m && xx + h < d.W) pp[h * proj.m + o] = s[h][o];
            }
        }
        return;
    }
    // Out along channels: a thread per 8 channels of an output pixel of the block's rows.
    bf16 *o = out + b * plane + c0;
    if constexpr (!SUMS) {
        mma_write_out<THREADS, VPP>(tile, tplane, sw, o, d, y0);   // the results at staged (r, xx)
        return;
    }
    const float inv_w = 1.0f / d.W;
    for (int e = threadIdx.x; e < MMA_TH * d.W * VPP; e += THREADS) {
        const int pix = e / VPP, v8 = 8 * (e - pix * VPP), r = mma_div(pix, inv_w), xx = pix - r * d.W, yy = y0 + r;
        if (yy >= d.H) break;   // e grows with r
        const unsigned short *resid = tile + (size_t)v8 * tplane + (r + P) * sw + xx + P;   // staged (r + P, xx + P)
        dw_store_out8(o + ((size_t)yy * d.W + xx) * d.C + v8, sums + v8 * ps + r * rs + xx, ps,
                      bias ? bias + c0 + v8 : nullptr, flags,
                      [&](int c) { return __uint_as_float((unsigned)resid[c * tplane] << 16); });
    }
}

template <int CG, bool SUMS, bool PROJ = false>
static bool mma_launch(Ctx *ctx, const bf16 *in, const bf16 *w, const bf16 *bias, bf16 *out,
                       const DwconvShape &d, int flags, DwProj proj = DwProj{}) {
    const int tiles_x = (d.W + 7) / 8, sw = mma_tile_width(tiles_x);
    const size_t smem = (size_t)CG * mma_plane(MMA_TH + MMA_K - 1, sw) * 2 +
                        (SUMS ? (size_t)CG * dw_sum_plane(MMA_TH, tiles_x * 8) * sizeof(float) : 0) +
                        (PROJ ? (size_t)DW_PROJ_M * CG * sizeof(float) : 0);
    // the blocks an SM the kernel is built for: 228 KB of shared memory an SM, 1 KB of each block the system's
    if (smem > (size_t)(228 / mma_blocks_per_sm(SUMS) - 1) * 1024 || (d.H + MMA_TH - 1) / MMA_TH > 65535 ||
        d.B > 65535)
        return false;
    // the grids of gspn's stages at 224 px (56 and 28 columns) with constant offsets
    auto kernel = tiles_x == 7 ? dwconv_mma_kernel<MMA_K, CG, 7, SUMS, PROJ>
                : tiles_x == 4 ? dwconv_mma_kernel<MMA_K, CG, 4, SUMS, PROJ> : dwconv_mma_kernel<MMA_K, CG, 0, SUMS, PROJ>;
    if (smem > 48 * 1024)
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    unsigned *frag = (unsigned *)cuda_temp_alloc(ctx, (size_t)d.C * MMA_K * 2 * 32 * sizeof(unsigned));
    dw_band_frag_kernel<MMA_K><<<(unsigned)((d.C * 32 + 255) / 256), 256, 0, cuda_stream_of(ctx)>>>(w, d.C, flags, frag);
    CUDA_CHECK_LAUNCH();
    dim3 grid((unsigned)(d.C / CG), (unsigned)((d.H + MMA_TH - 1) / MMA_TH), (unsigned)d.B);
    kernel<<<grid, mma_threads(CG, SUMS), smem, cuda_stream_of(ctx)>>>(in, frag, bias, out, d, flags, tiles_x, sw, proj);
    CUDA_CHECK_LAUNCH();
    cuda_temp_free(ctx, frag);
    return true;
}

template <int CG>
static bool mma_launch_flags(Ctx *ctx, const bf16 *in, const bf16 *w, const bf16 *bias, bf16 *out,
                             const DwconvShape &d, int flags, DwProj *proj) {
    // The sums staged with DW_ACCUM alone. 8 channels at 56 columns took them too while the pass
    // ran four blocks an SM (H100, 56 x 56 x 168 forward: 0.244 ms against 0.275 finished in
    // registers); at three, finished in registers is the faster (0.246 -> 0.241 ms; gspn_s's fused
    // 7x7 and projection 1.92 -> 1.89 ms over 22 calls).
    const bool sums = flags & DW_ACCUM;
    if (proj) {   // no DW_ACCUM (cuda_dwconv_mma)
        if (sums || !mma_launch<CG, false, true>(ctx, in, w, bias, out, d, flags, *proj)) return false;
        proj->groups = d.C / CG;
        return true;
    }
    return sums ? mma_launch<CG, true>(ctx, in, w, bias, out, d, flags)
                : mma_launch<CG, false>(ctx, in, w, bias, out, d, flags);
}

bool cuda_dwconv_mma(Ctx *ctx, const bf16 *in, const bf16 *w, const bf16 *bias, bf16 *out,
                     const DwconvShape &d, int flags, DwProj *proj) {
    // Below 14 x 14 the fp32 kernel of dwconv.cu is as fast: a block's staging, sums and write-out
    // run one after another, and small grids give too few blocks to overlap them.
    if (d.k != MMA_K || d.C % MMA_CG != 0 || d.H < 14 || d.W < 14 || !aligned16(in) || !aligned16(out) ||
        (proj && proj->m > DW_PROJ_M))
        return false;
    // 16 channels a block where C allows and two blocks fit an SM: a warp's loads and stores then
    // take 32 bytes of a pixel, not 16 (H100, 56 x 56 x 144: 0.284 -> 0.249 ms a forward).
    if (d.C % 16 == 0 && mma_launch_flags<16>(ctx, in, w, bias, out, d, flags, proj)) return true;
    return mma_launch_flags<MMA_CG>(ctx, in, w, bias, out, d, flags, proj);
}

// ---- dw and db ----------------------------------------------------------------------------------
// dw[i][j] = sum over images, rows y and columns x of dy[y][x] in[y + i - P][x + j - P]. With the
// column shift put on dy, 16 columns x0 .. x0 + 15 of dy row y and one channel take
//   D (16 x 8) += A (16 x 16) B (16 x 8),  A[j][q] = dy[y][x0 + q - j + P],
//                                          B[q][i] = in[y + i - P][x0 + q],
// so that D[j][i] = dw[i][j] (j, i < K); every (dy, input) pair with both in the image is counted
// once, the others meet zeros. A's rows 8 .. 15 take the next dy row, against B's eighth column
// (dw_grad_mma2, kernels/cuda/dwconv_mma.h: one MMA for two dy rows, and where db is wanted one
// against ones for the bias gradient). A block owns MMA_CG channels and MMA_TH dy rows of a run of
// images; per image it stages those dy rows and their TH + K - 1 input rows channel-major, and each warp adds
// MMA_CG / 4 channels' products into registers. Its sums are then one row of the partial matrix
// (runs * row blocks, C k^2 + C) that dwconv.cu's dw kernels write, added in a fixed order.
// dy is staged from column x - DWM_OFF, so that (P + DWM_OFF) is even: A's column pairs are
// 32-bit words for even j and two words' halves (one byte permute) for odd j.
// Channels a warp: 16 CG threads for CG channels. (One, 32 CG threads, took longer on an H100:
// 28 x 28 x 288 backward 0.263 against 0.251 ms.)
enum { DWM_OFF = 5, DWM_CPW = 2 };
__host__ __device__ constexpr int mma_dw_threads(int cg) { return 32 * cg / DWM_CPW; }

// Staged dy row width (bf16 elements) of the dw pass for tiles_x tiles of 16 columns: A's reach
// with the shift (tiles * 16 + 10), even.
__host__ __device__ constexpr int mma_dw_dy_width(int tiles_x) { return tiles_x * 16 + 16; }

// The backward in one pass, where dx is written (not added to): the same kernel with DX makes dx
// too from one staging of dy. It then stages dy rows y0 - P .. y0 + TH + P - 1 (zeros past the
// image), mma_bwd_dy_width wide: the dw product reads dy rows y0 .. (staged rows P ..), and the
// dx product (the y / dx pass's, mma_channel_tiles) reads the same planes one word in, where
// staged pixel (r, s) is dy (y0 - P + r, s - P) as the y / dx pass stages its input. Each warp
// runs its two channels' dw products first, then their dx tiles over the same planes (whose
// results go over columns no later tile reads), and the block writes dx out as the y / dx pass
// writes y. At 16 channels a block the planes take 68 KB at 28 columns (two blocks of 8 warps an
// SM) and 113 KB at 56; there (H100, one call against the two passes: `bench dwconv` backward
// 56 x 56 x 144 0.371 -> 0.391 ms, x 192 0.499 -> 0.554) the one pass loses what the dw pass's
// four blocks an SM overlap, and at 28 it gains (28 x 28 x 288 0.196 -> 0.182, x 384 0.253 ->
// 0.241); at 8 channels a block it lost at both (0.553 and 0.225 at 144 and 288). So it runs
// on rows of at most 32 columns at 16 channels a block.
enum { MMA_BWD_MAX_W = 32, MMA_BWD_CG = 16, MMA_BWD_BLOCKS = 2 };

// Staged dy row width of the one pass: the dw product's reach (mma_dw_dy_width) and the dx
// product's (mma_tile_width's, two columns on), 8 modulo 16 for the dx product's fragment loads.
__host__ __device__ constexpr int mma_bwd_dy_width(int tiles16, int tiles8) {
    return mma_row_width(mma_dw_dy_width(tiles16) > tiles8 * 8 + 16 ? mma_dw_dy_width(tiles16) : tiles8 * 8 + 16);
}
static_assert((DWM_OFF - MMA_K / 2) % 2 == 0, "the dx product's staged input starts on a word");

// TX16 > 0: the dw product's 16-column tiles (the tile loop unrolls, its offsets constants); TX8
// (DX): the dx product's 8-column tiles; 0: the arguments. DX: frag holds the mirrored taps' B
// fragments (dw_band_frag_kernel with DW_FLIP), flags DW_FLIP (and DW_RESID) for dx. DB: db wanted.
template <int K, int CG, int TX16, int TX8, bool DX, bool DB>
__global__ void __launch_bounds__(mma_dw_threads(CG), DX ? MMA_BWD_BLOCKS : 4)
dwconv_mma_dw_kernel(const bf16 *__restrict__ dy, const bf16 *__restrict__ in, DwconvShape d,
                     int tiles_x_arg, int swx_arg, int swd_arg, int per, float *__restrict__ partial,
                     const unsigned *__restrict__ frag, bf16 *__restrict__ dx, int flags, int tiles8_arg) {
    constexpr int P = K / 2, ROWS = MMA_TH + K - 1, KK = K * K, THREADS = mma_dw_threads(CG), VPP = CG / 8;
    static_assert((P + DWM_OFF) % 2 == 0, "dy's staging offset must make A's pairs even for j even");
    const int tiles_x = TX16 ? TX16 : tiles_x_arg, swx = TX16 ? mma_row_width(TX16 * 16) : swx_arg,
              swd = !TX16 ? swd_arg : DX ? mma_bwd_dy_width(TX16, TX8) : mma_dw_dy_width(TX16);
    constexpr int DROW0 = DX ? P : 0, DROWS = DX ? ROWS : MMA_TH;   // dy row y0's staged row; staged rows
    extern __shared__ __align__(16) unsigned char mma_smem[];
    const int xplane = mma_plane(ROWS, swx), dplane = mma_plane(DROWS, swd);
    unsigned short *xs = reinterpret_cast<unsigned short *>(mma_smem);   // (CG, ROWS, swx) bf16 bits
    unsigned short *ds = xs + (size_t)CG * xplane;                       // (CG, DROWS, swd)
    const int c0 = blockIdx.x * CG, y0 = blockIdx.y * MMA_TH;
    const int b0 = blockIdx.z * per, b1 = min(d.B, b0 + per);
    const size_t plane = (size_t)d.H * d.W * d.C;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
    const int rows = min(MMA_TH, d.H - y0);
    const unsigned ones = Vec<bf16, 8>::pair(1.0f, 1.0f);
    const unsigned sel = g & 1 ? 0x5432u : 0x3210u;   // A's pair: one word, or the halves of two
    // Per channel of the warp, the words of dy row y0 this lane reads for tile 0: dy's A[g][2 t4]
    // (word (jt 16 + 2 t4 - g + P + DWM_OFF) / 2 of a row, the sum never negative) and B's column
    // i = g, input row y + g - P, staged row r + g.
    const unsigned *drow0[DWM_CPW], *xrow0[DWM_CPW];
    #pragma unroll
    for (int cc = 0; cc < DWM_CPW; cc++) {
        const int c = warp * DWM_CPW + cc;
        drow0[cc] = reinterpret_cast<const unsigned *>(ds + (size_t)c * dplane + DROW0 * swd) +
                    ((2 * t4 - g + P + DWM_OFF) >> 1);
        xrow0[cc] = reinterpret_cast<const unsigned *>(xs + (size_t)c * xplane + g * swx) + t4;
    }
    float acc[DWM_CPW][2][4] = {}, acc_db[DWM_CPW][2][4] = {};   // per channel, per tile parity
    // Rows in pairs: an odd count stages one more (zero) dy row and the input row it reaches.
    const int pair_rows = rows + (rows & 1);
    for (int b = b0; b < b1; b++) {
        // Input rows y0 - P .. y0 + TH + P - 1 (xs), dy rows y0 .. y0 + TH - 1 from column -DWM_OFF (ds;
        // with DX from row y0 - P, every row the dx tiles reach). (only the rows the block's dy rows
        // reach: fewer in a short image; rows past the image are zeros)
        mma_stage<CG, THREADS>(in + b * plane + c0, d, y0 - P, pair_rows + K - 1, swx, 0, xs, (size_t)xplane);
        mma_stage<CG, THREADS>(dy + b * plane + c0, d, y0 - DROW0, DX ? ROWS : pair_rows, swd, DWM_OFF, ds,
                               (size_t)dplane);
        __syncthreads();
        for (int r = 0; r < rows; r += 2) {
            // 2 channels x 2 tile parities (h = jt % 2, a constant at each call): 8 MMA chains
            auto tile = [&](int jt, int h) {
                #pragma unroll
                for (int cc = 0; cc < DWM_CPW; cc++) {
                    const unsigned *drow = drow0[cc] + r * (swd / 2) + jt * 8;
                    dw_grad_mma2<DB>(acc[cc][h], acc_db[cc][h], drow, drow + swd / 2,
                                 xrow0[cc] + r * (swx / 2) + jt * 8, sel, ones);
                }
            };
            dw_each_with_parity<TX16>(tiles_x, tile);
        }
        if constexpr (DX) {
            #pragma unroll 1
            for (int cc = 0; cc < DWM_CPW; cc++) {
                const int c = warp * DWM_CPW + cc;
                mma_channel_tiles<K, TX8, false, true>(ds + (size_t)c * dplane + (DWM_OFF - P), swd,
                                                       TX8 ? TX8 : tiles8_arg,
                                                       frag + (size_t)(c0 + c) * K * 2 * 32 + lane, 0.0f, flags,
                                                       nullptr, c, 0, 0, g, t4);
            }
            __syncthreads();
            mma_write_out<THREADS, VPP>(ds + (DWM_OFF - P), dplane, swd, dx + b * plane + c0, d, y0);
        }
        __syncthreads();
    }
    float *row = partial + ((size_t)blockIdx.z * gridDim.y + blockIdx.y) * ((size_t)d.C * KK + d.C);
    #pragma unroll
    for (int cc = 0; cc < DWM_CPW; cc++)
        dw_put_partial2<K, DB>(row, d.C, c0 + warp * DWM_CPW + cc, g, t4, acc[cc], acc_db[cc]);
}

// The dw pass (DX false: w, dx and flags unused) or the backward in one pass.
template <int CG, bool DX>
static bool mma_launch_dw(Ctx *ctx, const bf16 *dy, const bf16 *in, const DwconvShape &d, float *dw, float *db,
                          const bf16 *w, bf16 *dx, int flags) {
    const int tiles_x = (d.W + 15) / 16, tiles8 = (d.W + 7) / 8, swx = mma_row_width(tiles_x * 16),
              swd = DX ? mma_bwd_dy_width(tiles_x, tiles8) : mma_dw_dy_width(tiles_x);
    const size_t smem = (size_t)CG * (mma_plane(MMA_TH + MMA_K - 1, swx) + mma_plane(DX ? MMA_TH + MMA_K - 1 : MMA_TH, swd)) * 2;
    const int hblocks = (d.H + MMA_TH - 1) / MMA_TH, groups = d.C / CG, threads = mma_dw_threads(CG);
    // DX: the blocks an SM the kernel is built for (228 KB of shared memory an SM, 1 KB of each block the system's)
    if (smem > (DX ? (size_t)(228 / MMA_BWD_BLOCKS - 1) * 1024 : (size_t)100 * 1024) || hblocks > 65535) return false;
    // Runs of images: two blocks for every one an SM holds at once (shared memory, 2048 threads),
    // each summing as many images as that leaves.
    const size_t per_sm = std::min<size_t>(2048 / threads, DX ? (size_t)MMA_BWD_BLOCKS : (size_t)227 * 1024 / smem);
    const size_t want = (size_t)cuda_ctx_of(ctx)->sm_count * per_sm * 2, base = (size_t)groups * hblocks;
    int runs = (int)((want + base - 1) / base);
    if (runs > d.B) runs = d.B;
    const int per = (d.B + runs - 1) / runs;
    runs = (d.B + per - 1) / per;
    if (runs > 65535) return false;
    auto pick = [&](auto dbc) {   // the grids of gspn's stages at 224 px with constant offsets
        constexpr bool DB = decltype(dbc)::value;
        if constexpr (DX)
            return tiles_x == 2 && tiles8 == 4 ? dwconv_mma_dw_kernel<MMA_K, CG, 2, 4, DX, DB>
                                               : dwconv_mma_dw_kernel<MMA_K, CG, 0, 0, DX, DB>;
        else
            return tiles_x == 4   ? dwconv_mma_dw_kernel<MMA_K, CG, 4, 0, DX, DB>
                   : tiles_x == 2 ? dwconv_mma_dw_kernel<MMA_K, CG, 2, 0, DX, DB>
                                  : dwconv_mma_dw_kernel<MMA_K, CG, 0, 0, DX, DB>;
    };
    auto kernel = db ? pick(std::true_type{}) : pick(std::false_type{});
    if (smem > 48 * 1024)
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    unsigned *frag = nullptr;
    if (DX) {
        frag = (unsigned *)cuda_temp_alloc(ctx, (size_t)d.C * MMA_K * 2 * 32 * sizeof(unsigned));
        dw_band_frag_kernel<MMA_K><<<(unsigned)((d.C * 32 + 255) / 256), 256, 0, cuda_stream_of(ctx)>>>(w, d.C, flags, frag);
        CUDA_CHECK_LAUNCH();
    }
    const size_t width = (size_t)d.C * MMA_K * MMA_K + d.C, parts = (size_t)runs * hblocks;
    float *partial = (float *)cuda_scratch(ctx, parts * width * sizeof(float));
    dim3 grid((unsigned)groups, (unsigned)hblocks, (unsigned)runs);
    kernel<<<grid, threads, smem, cuda_stream_of(ctx)>>>(dy, in, d, tiles_x, swx, swd, per, partial, frag, dx, flags,
                                                        tiles8);
    CUDA_CHECK_LAUNCH();
    if (frag) cuda_temp_free(ctx, frag);
    cuda_sum_partials(ctx, partial, (unsigned)parts, width, (size_t)d.C * MMA_K * MMA_K, dw, db);
    return true;
}

bool cuda_dwconv_mma_dw(Ctx *ctx, const bf16 *dy, const bf16 *in, const DwconvShape &d, float *dw,
                        float *db) {
    // 8 channels a block: 16 (two blocks an SM) took the same time on an H100 (56 x 56 x 144
    // backward 0.540 against 0.536 ms).
    if (d.k != MMA_K || d.C % MMA_CG != 0 || !aligned16(dy) || !aligned16(in)) return false;
    return mma_launch_dw<MMA_CG, false>(ctx, dy, in, d, dw, db, nullptr, nullptr, 0);
}

bool cuda_dwconv_mma_bwd(Ctx *ctx, const bf16 *dy, const bf16 *in, const bf16 *w, bf16 *dx,
                         const DwconvShape &d, int flags, float *dw, float *db) {
    if (d.k != MMA_K || d.C % MMA_BWD_CG != 0 || d.H < 14 || d.W < 14 || d.W > MMA_BWD_MAX_W ||
        (flags & (DW_ACCUM | DW_SILU)) || !aligned16(dy) || !aligned16(in) || !aligned16(dx))
        return false;
    return mma_launch_dw<MMA_BWD_CG, true>(ctx, dy, in, d, dw, db, w, dx, flags);
}
