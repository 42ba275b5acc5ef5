// SiLU's formulas for every CUDA kernel that evaluates one (kernels/cuda/silu.cu, the depthwise
// convolution's fused activation in dwconv.cu and dwconv_mma.cu, the down projection's in
// linear.cu); kernels/cpu/silu.c is the reference.
#pragma once

// x / (1 + e^-x) with the hardware exponential and reciprocal (a few ulps of fp32, far below a
// bf16 rounding): the depthwise convolution evaluates it for every output, where expf and an IEEE
// division cost as much issue as the convolution's own write-out. For x < -87, e^-x overflows and
// the quotient is 0, the limit.
__device__ __forceinline__ float silu_value(float x) { return __fdividef(x, 1.0f + __expf(-x)); }
// silu'(x) = s (1 + x (1 - s)), s = sigmoid(x) from the hardware exponential and reciprocal (for
// x < -87 the reciprocal of the overflowed 1 + e^-x is 0: s and the slope are 0, the limits).
__device__ __forceinline__ float silu_slope(float x) {
    const float s = __fdividef(1.0f, 1.0f + __expf(-x));
    return s * (1.0f + x * (1.0f - s));
}
