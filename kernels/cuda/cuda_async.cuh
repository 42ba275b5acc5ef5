// Asynchronous copies into shared memory (cp.async, sm_80+) and the bulk L2 prefetch (sm_90):
// the kernels that stage the next piece of work while computing the current one.
#pragma once
#include <stdint.h>

// No L2 cache-policy hints on cp.async: fractional policies there are miscompiled by ptxas before
// 13.4.59 (triton-lang/triton#11660; this project's machines have 13.0) and faulted here with
// "illegal instruction".
template <int BYTES>
__device__ __forceinline__ void cp_async(void *dst, const void *src) {
    const uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
    if constexpr (BYTES == 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src) : "memory");
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(d), "l"(src), "n"(BYTES)
                     : "memory");
}
// L2 prefetch of `bytes` (a multiple of 16) at a 16-byte aligned address (sm_90 bulk copy engine;
// nothing on older GPUs).
__device__ __forceinline__ void l2_prefetch(const void *src, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(src), "r"(bytes) : "memory");
#endif
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }
