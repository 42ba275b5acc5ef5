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

// The dw product's MMA of one dy row, 16 columns and one channel (kernels/cuda/dwconv_mma.cu): A's
// rows j = g from the staged dy row's words drow[0], [1] and [4], [5] (one word, or the halves
// of two: sel), rows g + 8 zero; B's column i = g from the staged input row's words xrow[0] and
// [4], the ones (the bias gradient's column) where g = K.
template <int K>
__device__ __forceinline__ void dw_grad_mma(float (&acc)[4], const unsigned *drow, const unsigned *xrow,
                                            unsigned sel, int g, unsigned ones) {
    const unsigned a0 = __byte_perm(drow[0], drow[1], sel), a2 = __byte_perm(drow[4], drow[5], sel);
    const unsigned b0 = g < K ? xrow[0] : ones, b1 = g < K ? xrow[4] : ones;
    mma_16816_bf16(acc, a0, 0u, a2, 0u, b0, b1);
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

// Channel c's dw and db sums, from its two chains' D fragments (rows j = g, columns i = 2 t4 and
// 2 t4 + 1; D[P][K] the bias gradient), into one row of the partial matrix (C k^2 + C).
template <int K>
__device__ __forceinline__ void dw_put_partial(float *row, int C, int c, int g, int t4,
                                               const float (&acc)[2][4]) {
    constexpr int P = K / 2, KK = K * K;
    const int i = 2 * t4;
    const float s0 = acc[0][0] + acc[1][0], s1 = acc[0][1] + acc[1][1];
    if (g < K) {
        row[(size_t)c * KK + i * K + g] = s0;
        if (i + 1 < K) row[(size_t)c * KK + (i + 1) * K + g] = s1;
    }
    if (g == P && i + 1 == K) row[(size_t)C * KK + c] = s1;
}

// out (+)= bias + the k x k taps of in (mirrored with DW_FLIP) (+ in with DW_RESID). Returns
// false, launching nothing, when the shape or dtypes are not covered.
bool cuda_dwconv_mma(Ctx *ctx, const bf16 *in, const bf16 *w, const bf16 *bias, bf16 *out,
                     const DwconvShape &d, int flags);

// dw (+)= the k x k taps' gradient, db (+)= dy's sums (either NULL: skipped), from dy and in (B, H,
// W, C) bf16; deterministic. Returns false, launching nothing, when the shape is not covered.
bool cuda_dwconv_mma_dw(Ctx *ctx, const bf16 *dy, const bf16 *in, const DwconvShape &d, float *dw,
                        float *db);
