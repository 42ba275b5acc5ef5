// GELU's formulas for every CUDA kernel that evaluates one (kernels/cpu/gelu.c's, in the same
// fp32 operations, except the erf GELU where its result is stored in bf16: a fit below), and GELU
// passes over raw device buffers, for ops that fuse a GELU with something else
// (kernels/cuda/linear.cu: the erf GELU beside a GEMM); 16-byte accesses where aligned.
#pragma once
#include <stddef.h>
#include "../ops.h"

#ifdef __CUDACC__
#define GELU_SQRT1_2     0.70710678118654752f   // 1 / sqrt(2)
#define GELU_INV_SQRT2PI 0.39894228040143268f   // 1 / sqrt(2 pi)
#define GELU_SQRT2_PI    0.79788456080286536f   // sqrt(2 / pi)
#define GELU_TANH_C      0.044715f

// Phi(-|x|), the normal tail, as e^(-x^2/2) P(u), u = 1 / (1 + 0.3 |x|), P(u) = u H(u) with H the
// degree-5 Chebyshev fit to e^(x^2/2) Phi(-|x|) / u on 0 <= |x| <= 9 (0.3 and the degree chosen
// for the smallest error; its relative error there is at most 5.4e-6). Two hardware ops (ex2, rcp)
// and a dozen others, where erff takes about 27: the erf GELU in a GEMM's epilogue is bound by
// issue on them (H100, gspn_t: linear_fwd+gelu_out 1.77 -> 1.53 ms in inference,
// linear_bwd+gelu_in 3.60 -> 3.09 ms in a step). It also has no cancellation in the negative
// tail, where 0.5 (1 + erff(x / sqrt 2)) loses the leading digits: over all 65,280 finite bf16
// inputs, two GELU outputs round to a different bf16 than the exact value does, by one ulp (the
// erff form: 197; tests/gpu/test_ops_gpu.c checks every input). Beyond |x| = 9 the tail is below 1e-19; past
// 13.2 the exponential flushes to 0 and the limits (0 and x) are exact.
#define GELU_TAIL_P     0.3f
#define GELU_HALF_LOG2E 0.72134752044448170f   // log2(e) / 2
__device__ __forceinline__ float gelu_ex2(float v) {
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(v));
    return r;
}
__device__ __forceinline__ float gelu_rcp(float v) {
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(v));
    return r;
}
// Phi(x); *gauss = e^(-x^2/2) (the density's factor, for the slope).
__device__ __forceinline__ float gelu_phi_fit(float x, float *gauss) {
    const float u = gelu_rcp(fmaf(GELU_TAIL_P, fabsf(x), 1.0f));
    const float e = gelu_ex2(x * (x * -GELU_HALF_LOG2E));
    float h = -8.340832880e-02f;
    h = fmaf(h, u, 2.354821509e-01f);
    h = fmaf(h, u, -3.989499453e-02f);
    h = fmaf(h, u, 1.570958776e-01f);
    h = fmaf(h, u, 1.103032986e-01f);
    h = fmaf(h, u, 1.204208971e-01f);
    const float tail = e * (h * u);
    *gauss = e;
    return x < 0.0f ? tail : 1.0f - tail;
}

// v rounded to the nearest bf16: what a fused kernel applies where the unfused ops store bf16
// (the pre-activation, GELU's output), so that the two agree.
__device__ __forceinline__ float round_bf16(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }
// lo and hi each rounded as round_bf16 rounds them, through one paired conversion (F2FP, on
// the ALU pipe) where two round_bf16 take two F2F on the pipe the MUFU ops of GELU's fit share;
// returns the pair as bf16x2 (lo in the low half).
__device__ __forceinline__ unsigned round_bf16_pair(float &lo, float &hi) {
    const __nv_bfloat162 p = __floats2bfloat162_rn(lo, hi);
    const unsigned u = *reinterpret_cast<const unsigned *>(&p);
    lo = __uint_as_float(u << 16);
    hi = __uint_as_float(u & 0xffff0000u);
    return u;
}

// B: the result is stored in bf16. The erf GELU then takes Phi from the fit above (its error is
// far below a bf16 rounding); in fp32 it is kernels/cpu/gelu.c's erff formula, operation for
// operation.
template <GeluKind K, bool B = false> __device__ __forceinline__ float gelu_value(float x) {
    if (K == GELU_ERF && B) {
        float e;
        return x * gelu_phi_fit(x, &e);
    }
    if (K == GELU_ERF) return 0.5f * x * (1.0f + erff(x * GELU_SQRT1_2));
    float u = GELU_SQRT2_PI * (x + GELU_TANH_C * x * x * x);
    return 0.5f * x * (1.0f + tanhf(u));
}

// dy/dx: erf:  Phi(x) + x phi(x); tanh: 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 c x^2).
template <GeluKind K, bool B = false> __device__ __forceinline__ float gelu_slope(float x) {
    if (K == GELU_ERF && B) {
        float e;
        const float phi = gelu_phi_fit(x, &e);
        return fmaf(x * GELU_INV_SQRT2PI, e, phi);
    }
    if (K == GELU_ERF)
        return 0.5f * (1.0f + erff(x * GELU_SQRT1_2)) + x * GELU_INV_SQRT2PI * expf(-0.5f * x * x);
    float u = GELU_SQRT2_PI * (x + GELU_TANH_C * x * x * x);
    float t = tanhf(u);
    return 0.5f * (1.0f + t) +
           0.5f * x * (1.0f - t * t) * GELU_SQRT2_PI * (1.0f + 3.0f * GELU_TANH_C * x * x);
}
#endif

#ifdef __cplusplus
extern "C" {
#endif
// y = gelu(pre), n elements of dtype dt on the context's stream; y may be pre (in place).
void cuda_gelu_apply(Ctx *ctx, GeluKind kind, DType dt, const void *pre, void *y, size_t n);
// g = g * gelu'(pre), in place (written, not accumulated); g and pre of dtype dt.
void cuda_dgelu_scale(Ctx *ctx, GeluKind kind, DType dt, const void *pre, void *g, size_t n);
#ifdef __cplusplus
}
#endif
