// SiLU's formula for every CUDA kernel that evaluates one (kernels/cuda/silu.cu, the depthwise
// convolution's fused activation in dwconv.cu and dwconv_mma.cu); kernels/cpu/silu.c is the
// reference.
#pragma once

__device__ __forceinline__ float silu_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float silu_value(float x) { return x * silu_sigmoid(x); }
