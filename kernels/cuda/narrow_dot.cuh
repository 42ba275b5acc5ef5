// A product over at most 4 inputs, in one formula for every kernel that makes one: linear.cu's
// narrow kernels (the propagation's proxy channels into its gates and up projection) and
// dwconv_fwd's added input (the up projection read as the LPU loads the stream), so that both
// write the same bits.
#pragma once

// sum_k u[k] w[k] + b in fp32, k in order, one fused multiply-add each.
template <int K>
__device__ __forceinline__ float narrow_dot(const float (&u)[K], const float (&w)[K], float b) {
    float acc = 0.0f;
    #pragma unroll
    for (int k = 0; k < K; k++) acc = fmaf(u[k], w[k], acc);
    return acc + b;
}
