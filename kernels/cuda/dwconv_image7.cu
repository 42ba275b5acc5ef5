// CUDA: the mixer's 7x7 on 7 x 7 images (gspn_hier's last stage at 224 px), bf16 (kernels/cuda/
// dwconv_plane.h). An image of one channel is 49 values and its taps 49: a thread holds both in
// registers and makes every output from them, with the taps that meet the zero padding left out at
// compile time (1369 products an image and channel where all 49 taps would take 2401).
// dwconv_plane.cu's kernels, which took these images before, staged them and made every tap of
// the padding: 0.048 ms forward and 0.123 backward at 7 x 7 x 1152 against 0.022 and 0.060 (H100).
//
// A block is 32 channels (a warp's loads take 64 contiguous bytes of a pixel) times DWI_SLOTS
// image slots; each thread walks images slot, slot + slots, ... of its block's run.
// - y / dx: the block's taps (32 x 49, contiguous) come through shared memory once; the thread's
//   image in, then its 49 outputs (bias, residual, prior value, SiLU as the DW_* flags ask,
//   rounded once). With the down projection (dwconv_silu_proj_fwd, DwProj): the outputs, rounded
//   as the pass would store them, go into the warp's image tile in shared memory (a row of 32
//   channels a pixel), and each lane then takes pixels lane and lane + 32 and adds their 32
//   channels against the projection's rows, in channel order: one partial sum a pixel and group
//   of 32 channels, where the two ops wrote and read back the 1.5 C_s channels.
// - dw / db: the thread adds dy[y][x] in[y + i - P][x + j - P] into its 49 sums (and dy into
//   db) over its images; the block's slots are added in slot order in shared memory into one row
//   of the partial matrix (runs, C k^2 + C), which cuda_sum_partials adds in run order.
// Deterministic.
#include "dwconv_plane.h"

enum { DWI_S = 7, DWI_K = 7, DWI_P = DWI_K / 2, DWI_N = DWI_S * DWI_S, DWI_KK = DWI_K * DWI_K,
       DWI_LANES = 32, DWI_SLOTS = 4, DWI_THREADS = DWI_LANES * DWI_SLOTS };

// The images a thread of run `run` walks: b0, b0 + step, ... < b1.
struct DwiImages {
    int b0, b1, step;
};
__device__ __forceinline__ DwiImages dwi_images(int B, int per_run) {
    const int first = blockIdx.y * per_run;
    return {first + (int)threadIdx.y, min(first + per_run, B), DWI_SLOTS};
}

// One image of one channel (element c of pixel 0 at p, pixels C apart) into registers.
__device__ __forceinline__ void dwi_load(const bf16 *__restrict__ p, int C, float (&v)[DWI_S][DWI_S]) {
    #pragma unroll
    for (int r = 0; r < DWI_S; r++)
        #pragma unroll
        for (int q = 0; q < DWI_S; q++) v[r][q] = __bfloat162float(p[(size_t)(r * DWI_S + q) * C]);
}

// f(i, j, r, q) for every tap (i, j) of output (y, xo) that meets input pixel (r, q) of the image
// (y and xo constants after unrolling: the padding's taps are not made).
template <typename F> __device__ __forceinline__ void dwi_each_tap(int y, int xo, F &&f) {
    #pragma unroll
    for (int i = 0; i < DWI_K; i++) {
        const int r = y + i - DWI_P;
        if (r < 0 || r >= DWI_S) continue;
        #pragma unroll
        for (int j = 0; j < DWI_K; j++) {
            const int q = xo + j - DWI_P;
            if (q >= 0 && q < DWI_S) f(i, j, r, q);
        }
    }
}

// The projecting kernel's image tile of a warp: pixel p's 32 channels (bf16 bits) at row p, rows
// DWI_TILE_ROW halfwords apart (80 bytes: eight lanes' 16-byte loads of eight rows meet every bank
// once).
enum { DWI_TILE_ROW = 40 };

// Block (ceil(C / 32), runs), (32, DWI_SLOTS): out (+)= bias + the taps of in (mirrored with
// DW_FLIP) (+ in with DW_RESID), SiLU with DW_SILU (dwconv_mma.h's flags). PROJ: the partial sums
// of proj instead of out, group blockIdx.x (C a multiple of 32).
template <bool PROJ>
__global__ void __launch_bounds__(DWI_THREADS)
dwconv_image7_kernel(const bf16 *__restrict__ in, const bf16 *__restrict__ w, const bf16 *__restrict__ bias,
                     bf16 *__restrict__ out, int B, int C, int per_run, int flags, DwProj proj) {
    constexpr int K = DWI_K;
    __shared__ float ws[DWI_KK][DWI_LANES];   // tap t of the block's channel c at ws[t][c]
    // PROJ: the block's columns of proj.w (DW_PROJ_M, 32), and each warp's image tile
    __shared__ __align__(16) float pws[PROJ ? DW_PROJ_M : 1][DWI_LANES];
    __shared__ __align__(16) unsigned short vt[PROJ ? DWI_SLOTS : 1][PROJ ? DWI_N * DWI_TILE_ROW : 1];
    const int c0 = blockIdx.x * DWI_LANES, c = c0 + threadIdx.x;
    for (int e = threadIdx.y * DWI_LANES + threadIdx.x; e < DWI_LANES * DWI_KK; e += DWI_THREADS) {
        const int cc = e / DWI_KK, t = e - cc * DWI_KK;   // w's rows are contiguous: coalesced
        ws[flags & DW_FLIP ? DWI_KK - 1 - t : t][cc] = c0 + cc < C ? __bfloat162float(w[(size_t)c0 * DWI_KK + e]) : 0.0f;
    }
    if constexpr (PROJ)
        for (int e = threadIdx.y * DWI_LANES + threadIdx.x; e < DW_PROJ_M * DWI_LANES; e += DWI_THREADS)
            pws[e / DWI_LANES][e % DWI_LANES] =
                e / DWI_LANES < proj.m ? __bfloat162float(proj.w[(size_t)(e / DWI_LANES) * C + c0 + e % DWI_LANES]) : 0.0f;
    __syncthreads();
    if (!PROJ && c >= C) return;
    float tap[K][K];
    #pragma unroll
    for (int i = 0; i < K; i++)
        #pragma unroll
        for (int j = 0; j < K; j++) tap[i][j] = ws[i * K + j][threadIdx.x];
    const float bv = bias ? __bfloat162float(bias[c]) : 0.0f;
    const DwiImages im = dwi_images(B, per_run);
    for (int b = im.b0; b < im.b1; b += im.step) {
        const size_t at = (size_t)b * DWI_N * C + c;
        float x[DWI_S][DWI_S];
        dwi_load(in + at, C, x);
        #pragma unroll
        for (int y = 0; y < DWI_S; y++)
            #pragma unroll
            for (int xo = 0; xo < DWI_S; xo++) {
                float sum = 0.0f;
                dwi_each_tap(y, xo, [&](int i, int j, int r, int q) { sum = fmaf(tap[i][j], x[r][q], sum); });
                float v = sum + bv;
                if (flags & DW_RESID) v += x[y][xo];
                if constexpr (PROJ) {
                    if (flags & DW_SILU) v = dw_silu<bf16>(v);
                    vt[threadIdx.y][(y * DWI_S + xo) * DWI_TILE_ROW + threadIdx.x] = __bfloat16_as_ushort(__float2bfloat16_rn(v));
                    continue;
                }
                bf16 *p = out + at + (size_t)(y * DWI_S + xo) * C;
                if (flags & DW_ACCUM) v += __bfloat162float(*p);
                if (flags & DW_SILU) v = dw_silu<bf16>(v);
                *p = __float2bfloat16_rn(v);
            }
        if constexpr (PROJ) {
            __syncwarp();
            // pixel p = lane (+ 32): its 32 channels against the projection's rows, in channel order
            float *part = proj.part + ((size_t)blockIdx.x * B + b) * DWI_N * proj.m;
            for (int p = threadIdx.x; p < DWI_N; p += DWI_LANES) {
                const uint4 *row = reinterpret_cast<const uint4 *>(&vt[threadIdx.y][p * DWI_TILE_ROW]);
                float s[DW_PROJ_M] = {};
                #pragma unroll
                for (int q = 0; q < DWI_LANES / 8; q++) {
                    const uint4 u = row[q];
                    const unsigned wd[4] = {u.x, u.y, u.z, u.w};
                    #pragma unroll
                    for (int h = 0; h < 8; h++) {
                        const float v = __uint_as_float(h % 2 ? wd[h / 2] & 0xffff0000u : wd[h / 2] << 16);
                        #pragma unroll
                        for (int o = 0; o < DW_PROJ_M; o++) s[o] = fmaf(v, pws[o][8 * q + h], s[o]);
                    }
                }
                #pragma unroll
                for (int o = 0; o < DW_PROJ_M; o++)
                    if (o < proj.m) part[p * proj.m + o] = s[o];
            }
            __syncwarp();   // the tile is free for the warp's next image
        }
    }
}

// Block (ceil(C / 32), runs), (32, DWI_SLOTS): the run's dw and db sums into row blockIdx.y of
// partial (runs, C k^2 + C).
__global__ void __launch_bounds__(DWI_THREADS)
dwconv_image7_dw_kernel(const bf16 *__restrict__ dy, const bf16 *__restrict__ in, int B, int C, int per_run,
                        float *__restrict__ partial) {
    constexpr int K = DWI_K;
    __shared__ float red[DWI_SLOTS][DWI_KK + 1][DWI_LANES];   // a slot's sums, db last
    const int c0 = blockIdx.x * DWI_LANES, c = c0 + threadIdx.x;
    float acc[K][K] = {}, accb = 0.0f;
    const DwiImages im = dwi_images(B, per_run);
    for (int b = c < C ? im.b0 : im.b1; b < im.b1; b += im.step) {
        const size_t at = (size_t)b * DWI_N * C + c;
        float x[DWI_S][DWI_S];
        dwi_load(in + at, C, x);
        #pragma unroll
        for (int y = 0; y < DWI_S; y++) {
            float g[DWI_S];
            #pragma unroll
            for (int xo = 0; xo < DWI_S; xo++) g[xo] = __bfloat162float(dy[at + (size_t)(y * DWI_S + xo) * C]);
            #pragma unroll
            for (int xo = 0; xo < DWI_S; xo++) {
                accb += g[xo];
                dwi_each_tap(y, xo, [&](int i, int j, int r, int q) { acc[i][j] = fmaf(g[xo], x[r][q], acc[i][j]); });
            }
        }
    }
    #pragma unroll
    for (int t = 0; t < DWI_KK; t++) red[threadIdx.y][t][threadIdx.x] = acc[t / K][t % K];
    red[threadIdx.y][DWI_KK][threadIdx.x] = accb;
    __syncthreads();
    // The block's row: dw of its channels (contiguous, c k^2 + t), then their db.
    float *row = partial + (size_t)blockIdx.y * ((size_t)C * DWI_KK + C);
    const int chans = min(DWI_LANES, C - c0);
    for (int e = threadIdx.y * DWI_LANES + threadIdx.x; e < chans * (DWI_KK + 1); e += DWI_THREADS) {
        const bool is_db = e >= chans * DWI_KK;
        const int cc = is_db ? e - chans * DWI_KK : e / DWI_KK, t = is_db ? DWI_KK : e - cc * DWI_KK;
        float sum = 0.0f;
        #pragma unroll
        for (int s = 0; s < DWI_SLOTS; s++) sum += red[s][t][cc];
        row[is_db ? (size_t)C * DWI_KK + c0 + cc : (size_t)c0 * DWI_KK + e] = sum;
    }
}

// Images a run: as many runs as fit on the SMs at once (dwp_image_blocks), at least one image a slot.
template <typename Kern> static int dwi_per_run(Ctx *ctx, Kern kernel, const DwconvShape &d) {
    const int groups = (d.C + DWI_LANES - 1) / DWI_LANES;
    const int runs = (int)dwp_image_blocks(ctx, kernel, DWI_THREADS, 0, groups, d.B);
    const int per_run = (d.B + runs - 1) / runs;
    return per_run < DWI_SLOTS ? DWI_SLOTS : per_run;
}

static bool dwi_covers(const DwconvShape &d) { return d.k == DWI_K && d.H == DWI_S && d.W == DWI_S && d.B > 0 && d.C > 0; }

bool cuda_dwconv_image7(Ctx *ctx, const bf16 *in, const bf16 *w, const bf16 *bias, bf16 *out,
                        const DwconvShape &d, int flags, DwProj *proj) {
    if (!dwi_covers(d) || (proj && (d.C % DWI_LANES != 0 || proj->m > DW_PROJ_M || (flags & DW_ACCUM))))
        return false;
    auto kernel = proj ? dwconv_image7_kernel<true> : dwconv_image7_kernel<false>;
    const int per_run = dwi_per_run(ctx, kernel, d);
    dim3 grid((unsigned)((d.C + DWI_LANES - 1) / DWI_LANES), (unsigned)((d.B + per_run - 1) / per_run));
    kernel<<<grid, dim3(DWI_LANES, DWI_SLOTS), 0, cuda_stream_of(ctx)>>>(in, w, bias, out, d.B, d.C, per_run, flags,
                                                                         proj ? *proj : DwProj{});
    CUDA_CHECK_LAUNCH();
    if (proj) proj->groups = d.C / DWI_LANES;
    return true;
}

bool cuda_dwconv_image7_dw(Ctx *ctx, const bf16 *dy, const bf16 *in, const DwconvShape &d, float *dw,
                           float *db) {
    if (!dwi_covers(d)) return false;
    const int per_run = dwi_per_run(ctx, dwconv_image7_dw_kernel, d);
    const unsigned runs = (unsigned)((d.B + per_run - 1) / per_run);
    const size_t width = (size_t)d.C * DWI_KK + d.C;
    float *partial = (float *)cuda_scratch(ctx, (size_t)runs * width * sizeof(float));
    dim3 grid((unsigned)((d.C + DWI_LANES - 1) / DWI_LANES), runs);
    dwconv_image7_dw_kernel<<<grid, dim3(DWI_LANES, DWI_SLOTS), 0, cuda_stream_of(ctx)>>>(dy, in, d.B, d.C, per_run,
                                                                                          partial);
    CUDA_CHECK_LAUNCH();
    cuda_sum_partials(ctx, partial, runs, width, (size_t)d.C * DWI_KK, dw, db);
    return true;
}
