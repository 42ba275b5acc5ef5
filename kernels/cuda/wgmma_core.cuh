// Hopper's warpgroup MMAs (wgmma, sm_90a) on operands in shared memory's canonical K-major layout
// without swizzle, for the kernels built with CUTLASS's cute/arch wrappers (kernels/cuda/mlp_fused.cu,
// kernels/cuda/conv2d_taps.cu): 8 x 8 core matrices (8 rows of 16 bytes, 128 contiguous bytes), a
// row group's core matrices along K next to each other: element (r, k) of a (rows, K) operand at
// ((r / 8) (K / 8) + k / 8) 64 + (r % 8) 8 + k % 8.
#pragma once
#ifdef CGSPN_HAVE_CUTLASS
#include "cute/arch/mma_sm90_gmma.hpp"
#include "cute/arch/mma_sm90_gmma_ext.hpp"
#include "cuda_elem.cuh"

// Offset of element (r, k) of a (rows, K) operand in the core-matrix layout above.
__device__ __forceinline__ int core_at(int r, int k, int K) {
    return ((r / 8) * (K / 8) + k / 8) * 64 + (r % 8) * 8 + k % 8;
}

// The descriptor of a K-major operand in that layout, from smem address `s` (its first row group
// and k): core matrices 128 bytes apart along K (leading offset), row groups K / 8 of them
// (stride offset), no swizzle. Fields in 16-byte units. Kept as its low word (address and leading
// offset; a k-step adds 16 to it) and built at each MMA with the high word, a constant of K: the
// 64-bit descriptors of every k-step, hoisted out of a loop, spill where registers are short.
__device__ __forceinline__ unsigned core_desc_lo(const bf16 *s) {
    return ((unsigned)__cvta_generic_to_shared(s) >> 4 & 0x3fff) | (128 >> 4) << 16;
}
template <int K> __device__ __forceinline__ uint64_t core_desc(unsigned lo) {
    return (uint64_t)((K / 8) * 128 >> 4) << 32 | lo;
}

// wgmma reads shared memory through the async proxy: make the generic and cp.async writes visible
// to it.
__device__ __forceinline__ void fence_async_shared() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Accumulator registers the MMAs in flight own: no instruction around is moved across this.
template <int N> __device__ __forceinline__ void fence_regs(float (&r)[N]) {
    #pragma unroll
    for (int i = 0; i < N; i++) cute::warpgroup_fence_operand(r[i]);
}
#endif
