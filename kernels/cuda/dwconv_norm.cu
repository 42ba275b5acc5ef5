// CUDA: the LPU and the LayerNorm after it in one pass (dwconv_layernorm_fwd, kernels/ops_list.h;
// CPU reference kernels/cpu/dwconv.c): h = x + b + the 3x3 taps of x on the fp32 stream, y =
// layernorm(h) in bf16. Apart, the LPU writes h and the norm reads it back: 4 C bytes a pixel of
// the 14 C the two move. The LPU's kernels take a group of channels a block, which a row's
// statistics cannot wait for; here a pixel's channels are one group of lanes.
//
// Lanes: a pixel is L lanes (32, 16 or 8: C / 4 L their float4 chunks, NCH of them), lane q taking
// channels 4 (q + L j) .. + 3 of chunk j, so that a chunk's loads and stores are contiguous along
// the pixel's channels and the weights' shared-memory reads meet every bank once. A block of 8
// warps takes P = 8 (32 / L) neighbouring pixels of a row and walks down a run of rows; the 3 x 3
// windows' other reads come from L1 (the row's neighbours, the rows above) or L2.
// The order of a value's terms: (b + x) + the taps in row-major order, as the CPU's; the row's
// sums (the lane's values in chunk order, then a butterfly over its L lanes) and rstd = 1 /
// sqrt(var + eps) as layernorm.cu forms them, in another order. Deterministic.
#include "cuda_elem.cuh"
#include "../dwconv_shape.h"
#include <type_traits>

namespace {

enum { DWN_THREADS = 256, DWN_WARPS = DWN_THREADS / 32, DWN_TAPS = 9 };

// Shared memory: the taps (9, C), the bias (C), the norm's weight and bias (C each), fp32.
__host__ __device__ constexpr size_t dwn_smem(int C) { return (size_t)(DWN_TAPS + 3) * C * sizeof(float); }

__device__ __forceinline__ void fma4(float4 &a, const float4 w, const float4 v) {
    a.x = fmaf(w.x, v.x, a.x);
    a.y = fmaf(w.y, v.y, a.y);
    a.z = fmaf(w.z, v.z, a.z);
    a.w = fmaf(w.w, v.w, a.w);
}

// Block (ceil(W / P), row runs, B), DWN_THREADS: rows y0 .. y0 + rows - 1 of image blockIdx.z.
// WREG: the lane's taps held in registers (NCH <= 2), else read from shared memory a pixel.
template <int L, int NCH, bool WREG>
__global__ void __launch_bounds__(DWN_THREADS, 2)
dwconv_norm_kernel(const float *__restrict__ x, const bf16 *__restrict__ w, const bf16 *__restrict__ b,
                   const float *__restrict__ lnw, const float *__restrict__ lnb, float eps, float *__restrict__ h,
                   bf16 *__restrict__ y, int H, int W, int rows) {
    constexpr int C = 4 * L * NCH, PPW = 32 / L, P = DWN_WARPS * PPW;
    extern __shared__ __align__(16) float dwn_sm[];
    float4 *taps = reinterpret_cast<float4 *>(dwn_sm);   // (9 + 3, C / 4): taps, bias, lnw, lnb
    for (int e = threadIdx.x; e < (DWN_TAPS + 3) * C; e += DWN_THREADS) {
        const int t = e / C, c = e - t * C;
        float v;
        if (t < DWN_TAPS) v = __bfloat162float(w[(size_t)c * DWN_TAPS + t]);
        else if (t == DWN_TAPS) v = b ? __bfloat162float(b[c]) : 0.0f;
        else if (t == DWN_TAPS + 1) v = lnw ? lnw[c] : 1.0f;
        else v = lnb ? lnb[c] : 0.0f;
        dwn_sm[e] = v;
    }
    __syncthreads();
    const int lane = threadIdx.x % 32, q = lane % L;
    // a pixel past the image's last column makes that column's values and stores nothing: every
    // lane stays for the warp's shuffles
    const int xcol = blockIdx.x * P + (threadIdx.x / 32) * PPW + lane / L;
    const bool stores = xcol < W;
    const int xc = stores ? xcol : W - 1;
    const int y0 = blockIdx.y * rows, y1 = min(H, y0 + rows);
    const size_t img = (size_t)blockIdx.z * H * W;
    float4 wr[WREG ? DWN_TAPS : 1][WREG ? NCH : 1];
    if constexpr (WREG)
        #pragma unroll
        for (int t = 0; t < DWN_TAPS; t++)
            #pragma unroll
            for (int j = 0; j < NCH; j++) wr[t][j] = taps[t * (C / 4) + q + L * j];
    auto tap = [&](int t, int j) {
        if constexpr (WREG) return wr[t][j];
        else return taps[t * (C / 4) + q + L * j];
    };

    for (int yy = y0; yy < y1; yy++) {
        const size_t pix = img + (size_t)yy * W + xc;
        const float4 *xp = reinterpret_cast<const float4 *>(x + pix * C) + q;
        float4 acc[NCH];
        #pragma unroll
        for (int j = 0; j < NCH; j++) {   // b + x
            const float4 bv = taps[DWN_TAPS * (C / 4) + q + L * j], xv = __ldg(xp + L * j);
            acc[j] = make_float4(bv.x + xv.x, bv.y + xv.y, bv.z + xv.z, bv.w + xv.w);
        }
        #pragma unroll
        for (int i = 0; i < 3; i++) {
            const int r = yy + i - 1;
            if (r < 0 || r >= H) continue;
            #pragma unroll
            for (int k = 0; k < 3; k++) {
                const int cx = xc + k - 1;
                if (cx < 0 || cx >= W) continue;
                const float4 *src = reinterpret_cast<const float4 *>(x + (img + (size_t)r * W + cx) * C) + q;
                #pragma unroll
                for (int j = 0; j < NCH; j++) fma4(acc[j], tap(3 * i + k, j), __ldg(src + L * j));
            }
        }
        float4 *hp = reinterpret_cast<float4 *>(h + pix * C) + q;
        float s = 0.0f;
        #pragma unroll
        for (int j = 0; j < NCH; j++) {
            if (stores) hp[L * j] = acc[j];
            s += ((acc[j].x + acc[j].y) + acc[j].z) + acc[j].w;
        }
        #pragma unroll
        for (int o = L / 2; o >= 1; o /= 2) s += __shfl_xor_sync(0xffffffffu, s, o);
        const float m = s / (float)C;
        float d2 = 0.0f;
        #pragma unroll
        for (int j = 0; j < NCH; j++) {
            const float a = acc[j].x - m, bb = acc[j].y - m, c = acc[j].z - m, d = acc[j].w - m;
            d2 += a * a + bb * bb + c * c + d * d;
        }
        #pragma unroll
        for (int o = L / 2; o >= 1; o /= 2) d2 += __shfl_xor_sync(0xffffffffu, d2, o);
        const float rs = 1.0f / sqrtf(d2 / (float)C + eps);
        uint2 *yp = reinterpret_cast<uint2 *>(y + pix * C) + q;
        #pragma unroll
        for (int j = 0; j < NCH; j++) {
            const float4 gw = taps[(DWN_TAPS + 1) * (C / 4) + q + L * j], gb = taps[(DWN_TAPS + 2) * (C / 4) + q + L * j];
            const float v[4] = {(acc[j].x - m) * rs * gw.x + gb.x, (acc[j].y - m) * rs * gw.y + gb.y,
                                (acc[j].z - m) * rs * gw.z + gb.z, (acc[j].w - m) * rs * gw.w + gb.w};
            if (stores) Vec<bf16, 4>::of(v).store(reinterpret_cast<bf16 *>(yp + L * j));
        }
    }
}

template <int L, int NCH>
void dwn_launch(Ctx *ctx, const DwconvShape &s, const float *x, const bf16 *w, const bf16 *b, const float *lnw,
                const float *lnb, float eps, float *h, bf16 *y) {
    constexpr int P = DWN_WARPS * (32 / L);
    auto kernel = dwconv_norm_kernel<L, NCH, (NCH <= 2)>;
    const size_t smem = dwn_smem(4 * L * NCH);
    if (smem > 48 * 1024)
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    // Runs of rows: whole images where their bands fill the GPU four times, else shorter runs
    // (each re-reads two halo rows).
    const size_t bands = (size_t)(s.W + P - 1) / P * s.B, want = (size_t)cuda_ctx_of(ctx)->sm_count * 4;
    const size_t more = (want + bands - 1) / bands;
    const int runs = bands >= want ? 1 : more < (size_t)s.H ? (int)more : s.H;
    const int rows = (s.H + runs - 1) / runs;
    dim3 grid((unsigned)((s.W + P - 1) / P), (unsigned)((s.H + rows - 1) / rows), (unsigned)s.B);
    kernel<<<grid, DWN_THREADS, smem, cuda_stream_of(ctx)>>>(x, w, b, lnw, lnb, eps, h, y, s.H, s.W, rows);
    CUDA_CHECK_LAUNCH();
}

// The lane layout for C channels (L, NCH above), or false where none is built.
bool dwn_dispatch(Ctx *ctx, const DwconvShape &s, const float *x, const bf16 *w, const bf16 *b, const float *lnw,
                  const float *lnb, float eps, float *h, bf16 *y) {
    bool done = false;
    auto try_l = [&](auto lc) {
        constexpr int L = decltype(lc)::value;
        if (done || s.C % (4 * L) != 0) return;
        const int nch = s.C / (4 * L);
        auto go = [&](auto nc) {
            if (nch != decltype(nc)::value) return;
            dwn_launch<L, decltype(nc)::value>(ctx, s, x, w, b, lnw, lnb, eps, h, y);
            done = true;
        };
        go(std::integral_constant<int, 1>{});
        go(std::integral_constant<int, 2>{});
        go(std::integral_constant<int, 3>{});
        go(std::integral_constant<int, 4>{});
        go(std::integral_constant<int, 6>{});
        go(std::integral_constant<int, 8>{});
    };
    try_l(std::integral_constant<int, 32>{});
    try_l(std::integral_constant<int, 16>{});
    try_l(std::integral_constant<int, 8>{});
    return done;
}

}  // namespace

// One pass where it applies (3x3, fp32 x and h, bf16 w, b and y, fp32 norm weights, C = 4 L NCH
// with L 32, 16 or 8 and NCH 1, 2, 3, 4, 6 or 8: gspn_t/s/b's widths, 16-byte aligned buffers),
// else the two ops.
extern "C" void cuda_dwconv_layernorm_fwd(Ctx *ctx, const Tensor *x, const Tensor *w, const Tensor *b,
                                          const Tensor *ln_w, const Tensor *ln_b, float eps, Tensor *h,
                                          Tensor *y) {
    const char *op = "dwconv_layernorm_fwd";
    cuda_check_tensor(op, "x", x);
    cuda_check_tensor(op, "w", w);
    cuda_check_tensor(op, "h", h);
    cuda_check_tensor(op, "y", y);
    const DwconvShape s = dwconv_layernorm_check(op, x, w, b, ln_w, ln_b, eps, h, y);
    if (b) cuda_check_tensor(op, "b", b);
    if (ln_w) cuda_check_tensor(op, "ln_w", ln_w);
    if (ln_b) cuda_check_tensor(op, "ln_b", ln_b);
    if (x->numel == 0) return;
    if (s.k == 3 && x->dtype == DTYPE_F32 && y->dtype == DTYPE_BF16 && w->dtype == DTYPE_BF16 &&
        (!b || b->dtype == DTYPE_BF16) && (!ln_w || ln_w->dtype == DTYPE_F32) &&
        (!ln_b || ln_b->dtype == DTYPE_F32) && aligned16(x->data) && aligned16(h->data) && aligned16(y->data) &&
        dwn_dispatch(ctx, s, (const float *)x->data, (const bf16 *)w->data, b ? (const bf16 *)b->data : nullptr,
                     ln_w ? (const float *)ln_w->data : nullptr, ln_b ? (const float *)ln_b->data : nullptr, eps,
                     (float *)h->data, (bf16 *)y->data))
        return;
    cuda_dwconv_fwd(ctx, x, NULL, NULL, NULL, w, b, DWCONV_RESIDUAL, NULL, h);
    cuda_layernorm_fwd(ctx, h, NULL, ln_w, ln_b, eps, NULL, y, NULL, NULL);
}
