// The depthwise convolution on tensor cores (kernels/cuda/dwconv_mma.cu), for the shapes it
// covers: the y / dx pass for bf16 activations and weights, k = 7, images of at least 14 rows and
// columns, C a multiple of 8; the dw / db pass for bf16 activations, k = 7, C a multiple of 8.
// kernels/cuda/dwconv.cu calls them first and falls back to its own kernels.
#pragma once
#include "cuda_elem.cuh"
#include "silu.h"
#include "mma.cuh"
#include "../dwconv_shape.h"
#include <type_traits>

// How the y / dx pass reads its taps and where its result goes (dwconv.cu's kernels take the same).
// DW_SILU: silu of the sum, the sum first rounded to the output's dtype (dwconv_fwd's DWCONV_SILU).
enum { DW_FLIP = 1, DW_ACCUM = 2, DW_RESID = 4, DW_SILU = 8 };

// The output value of a sum under DW_SILU: silu of it as read back from T (dw_silu<float>: exact).
template <typename T> __device__ __forceinline__ float dw_silu(float v) {
    if constexpr (std::is_same<T, bf16>::value) v = __bfloat162float(__float2bfloat16_rn(v));
    return silu_value(v);
}

// The y / dx pass's B_i fragments (tap rows i = 0 .. K - 1) of one channel: B_i[q][n] = w[i][q - n]
// where 0 <= q - n < K, else 0 (the taps mirrored with DW_FLIP), this lane's (q, n = g) for
// q = 2 t4, 2 t4 + 1 and those + 8, the lower q in the low half. wc: the channel's K x K taps.
template <int K>
__device__ __forceinline__ void dw_band_fragments(const bf16 *__restrict__ wc, int flags, int g, int t4,
                                                  unsigned (&bfrag)[K][2]) {
    #pragma unroll
    for (int i = 0; i < K; i++) {
        float v[4];
        #pragma unroll
        for (int e = 0; e < 4; e++) {
            const int j = 2 * t4 + (e & 1) + (e >> 1) * 8 - g;
            const int tap = flags & DW_FLIP ? (K - 1 - i) * K + (K - 1 - j) : i * K + j;
            v[e] = j >= 0 && j < K ? __bfloat162float(wc[tap]) : 0.0f;
        }
        bfrag[i][0] = Vec<bf16, 8>::pair(v[0], v[1]);
        bfrag[i][1] = Vec<bf16, 8>::pair(v[2], v[3]);
    }
}

// Words between two channels' staged input planes of `words` words: 2 modulo 4, so that the two
// 8-channel halves of a pixel, which neighbouring lanes stage, fall on opposite halves of the banks.
__host__ __device__ constexpr int dw_stage_plane(int words) { return words + (6 - words % 4) % 4; }

// The y / dx passes' sums, staged channel-major between the MMAs and the write-out: channel c's
// plane of rows RS floats long, planes PS floats apart. A fragment's two columns are one 8-byte
// store; RS = 8 modulo 16 puts a half-warp's 16 stores (rows g .. g + 3, columns 2 t4) on the 32
// banks, and PS = 2 modulo 4 puts channels c and c + 8, which neighbouring write-out lanes read,
// on opposite halves of the banks. (Along channels, (row, pixel, channel), the four lanes t4 of
// a store met on one bank.)
__host__ __device__ constexpr int dw_sum_row(int cols) { return (cols + 7) / 16 * 16 + 8; }
__host__ __device__ constexpr int dw_sum_plane(int rows, int cols) { return rows * dw_sum_row(cols) + 2; }

// Channel c's D fragment (rows g and g + 8, columns col and col + 1) into the staged sums.
__device__ __forceinline__ void dw_put_sums(float *sums, int c, int ps, int rs, int g, int col,
                                            const float (&acc)[4]) {
    // st.shared.v2 written out: from float2 stores nvcc made two 4-byte stores of the first pair
    const unsigned s = (unsigned)__cvta_generic_to_shared(sums + c * ps + g * rs + col);
    asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(s), "f"(acc[0]), "f"(acc[1]));
    asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(s + 32 * rs), "f"(acc[2]), "f"(acc[3]));
}

// The write-out of 8 channels of one output pixel at p: sums (the first channel's, channels ps
// apart) + bias (+ resid(c) with DW_RESID) (+ the prior value with DW_ACCUM), SiLU with DW_SILU,
// rounded once.
template <typename Resid>
__device__ __forceinline__ void dw_store_out8(bf16 *p, const float *sums, int ps, const bf16 *bias8,
                                              int flags, Resid &&resid) {
    float v[8], prior[8], bv[8];
    #pragma unroll
    for (int c = 0; c < 8; c++) v[c] = sums[c * ps];
    if (flags & DW_ACCUM) load_v<8>(p, prior);
    if (bias8) load_v<8>(bias8, bv);
    #pragma unroll
    for (int c = 0; c < 8; c++) {
        if (bias8) v[c] += bv[c];
        if (flags & DW_RESID) v[c] += resid(c);
        if (flags & DW_ACCUM) v[c] += prior[c];
        if (flags & DW_SILU) v[c] = dw_silu<bf16>(v[c]);
    }
    store_v<8>(p, v);
}

// The dw product's MMAs of two dy rows y and y + 1, 16 columns and one channel
// (kernels/cuda/dwconv_mma.cu): A's rows j = g from dy row y's staged words drow[0], [1] and [4],
// [5] (one word, or the halves of two: sel), rows 8 + j from dy row y + 1's (drow2); B's column
// i = g from input row y + i - P's staged words xrow[0] and [4]. D[j][i] then adds dw[i][j] of
// row y (i < K) and D[8 + j][i] dw[i - 1][j] of row y + 1 (i >= 1): one MMA for two rows, B's
// eight columns all used (input rows y - P .. y + P + 1). A second MMA against ones adds both
// rows' dy into Db[P][.] and Db[8 + P][.] (A's row P is dy unshifted): the bias gradient, where
// DB (the mixer's 7x7 has no bias: then neither the MMA nor its sums).
// dw_grad_mma2_a: the same from A's registers, however the caller made them.
template <bool DB>
__device__ __forceinline__ void dw_grad_mma2_a(float (&acc)[4], float (&acc_db)[4], unsigned a0, unsigned a1,
                                               unsigned a2, unsigned a3, const unsigned *xrow, unsigned ones) {
    mma_16816_bf16(acc, a0, a1, a2, a3, xrow[0], xrow[4]);
    if constexpr (DB) mma_16816_bf16(acc_db, a0, a1, a2, a3, ones, ones);
}
template <bool DB>
__device__ __forceinline__ void dw_grad_mma2(float (&acc)[4], float (&acc_db)[4], const unsigned *drow,
                                             const unsigned *drow2, const unsigned *xrow, unsigned sel,
                                             unsigned ones) {
    dw_grad_mma2_a<DB>(acc, acc_db, __byte_perm(drow[0], drow[1], sel), __byte_perm(drow2[0], drow2[1], sel),
                       __byte_perm(drow[4], drow[5], sel), __byte_perm(drow2[4], drow2[5], sel), xrow, ones);
}

// f(i, i % 2) for i = 0 .. n - 1, the parity a constant at each call (it picks one of two MMA
// chains): fully unrolled when N > 0 (n is then N), else a loop over pairs.
template <int N, typename F>
__device__ __forceinline__ void dw_each_with_parity(int n, F &&f) {
    if constexpr (N > 0) {
        #pragma unroll
        for (int i = 0; i < N; i++) f(i, i % 2);
    } else {
        #pragma unroll 1
        for (int i = 0; i < n; i += 2) {
            f(i, 0);
            if (i + 1 < n) f(i + 1, 1);
        }
    }
}

// Channel c's dw and db sums from dw_grad_mma2's fragments, each of two chains (this lane: D[g][2 t4],
// D[g][2 t4 + 1], D[g + 8][2 t4], D[g + 8][2 t4 + 1]), into one row of the partial matrix
// (C k^2 + C): dw[i][j] = D[j][i] + D[8 + j][i + 1], whose second term for i = 2 t4 + 1 the next
// lane holds. Every lane of the warp calls it (a shuffle).
template <int K, bool DB>
__device__ __forceinline__ void dw_put_partial2(float *row, int C, int c, int g, int t4,
                                                const float (&acc)[2][4], const float (&acc_db)[2][4]) {
    constexpr int P = K / 2, KK = K * K;
    const int i = 2 * t4;
    float s[4];
    #pragma unroll
    for (int e = 0; e < 4; e++) s[e] = acc[0][e] + acc[1][e];
    const float next = __shfl_down_sync(0xffffffffu, s[2], 1);   // D[g + 8][2 t4 + 2] (t4 < 3)
    // Db[P][.] + Db[8 + P][.]; without DB a zero, so that the partial matrix is written everywhere
    const float db = DB ? (acc_db[0][0] + acc_db[1][0]) + (acc_db[0][2] + acc_db[1][2]) : 0.0f;
    if (g < K) {
        row[(size_t)c * KK + i * K + g] = s[0] + s[3];
        if (i + 1 < K) row[(size_t)c * KK + (i + 1) * K + g] = s[1] + next;
    }
    if (g == P && t4 == 0) row[(size_t)C * KK + c] = db;
}

// A y / dx pass's down projection in place of its output (dwconv_silu_proj_fwd): w (m, C) bf16,
// m <= DW_PROJ_M. Each block adds its CG channels of every output pixel, as the pass would have
// stored them, against w's rows, into part (C / CG, B H W, m) fp32 by channel group; the pass
// sets groups (C / CG) for the sum that follows (dw_proj_sum). The write-out always forms
// DW_PROJ_M sums (rows past m are zeros) from the weights held in registers: with m a run-time
// bound, each pixel reloaded them from shared memory behind a branch per channel and output.
// DW_PROJ_M is the proxy width of every gspn_hier model; wider projections run as the two ops.
enum { DW_PROJ_M = 2 };
struct DwProj {
    const bf16 *w;
    int m;
    float *part;   // at least C / 8 * B H W * m floats
    int groups;    // set by the pass
};

// out (+)= bias + the k x k taps of in (mirrored with DW_FLIP) (+ in with DW_RESID); with proj,
// its partial sums instead of out (no DW_ACCUM). Returns false, launching nothing, when the shape
// or dtypes are not covered.
bool cuda_dwconv_mma(Ctx *ctx, const bf16 *in, const bf16 *w, const bf16 *bias, bf16 *out,
                     const DwconvShape &d, int flags, DwProj *proj = nullptr);

// The backward in one pass over dy and in, where dx is written: dx = the mirrored taps of dy (flags:
// DW_FLIP, DW_RESID; not DW_ACCUM), dw (+)= and db (+)= as cuda_dwconv_mma_dw. Returns false,
// launching nothing, when the shape or flags are not covered.
bool cuda_dwconv_mma_bwd(Ctx *ctx, const bf16 *dy, const bf16 *in, const bf16 *w, bf16 *dx,
                         const DwconvShape &d, int flags, float *dw, float *db);

// dw (+)= the k x k taps' gradient, db (+)= dy's sums (either NULL: skipped), from dy and in (B, H,
// W, C) bf16; deterministic. Returns false, launching nothing, when the shape is not covered.
bool cuda_dwconv_mma_dw(Ctx *ctx, const bf16 *dy, const bf16 *in, const DwconvShape &d, float *dw,
                        float *db);
