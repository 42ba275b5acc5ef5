// Asynchronous copies into shared memory (cp.async, sm_80+; bulk copies on transaction barriers,
// sm_90) and the bulk L2 prefetch (sm_90):
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
// 16 bytes from src into dst, or 16 zero bytes where !valid (src is then not read, but must be
// an address in the tensor). L1: keep the line in L1 (.ca), where neighbouring copies read it again
// soon (a convolution's taps), else L2 only (.cg).
template <bool L1 = false>
__device__ __forceinline__ void cp_async_or_zero(void *dst, const void *src, bool valid) {
    const uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
    if constexpr (L1)
        asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(valid ? 16 : 0)
                     : "memory");
    else
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(valid ? 16 : 0)
                     : "memory");
}
// L2 prefetch of `bytes` (a multiple of 16) at a 16-byte aligned address (sm_90 bulk copy engine;
// nothing on older GPUs).
__device__ __forceinline__ void l2_prefetch(const void *src, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(src), "r"(bytes) : "memory");
#endif
}
// The bulk copy engine and its transaction barriers (sm_90): a single thread starts a copy of
// `bytes` (a multiple of 16; 16-byte aligned ends) from global into shared memory that completes
// on an mbarrier, which every thread then waits on by phase parity. An mbarrier is set up once by
// one thread (mbar_init, its arrivals: 1, the thread that starts the copy), made visible to the
// copy engine by mbar_init_fence and a block barrier.
__device__ __forceinline__ void mbar_init(uint64_t *bar, unsigned arrivals) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"((uint32_t)__cvta_generic_to_shared(bar)),
                 "r"(arrivals) : "memory");
}
__device__ __forceinline__ void mbar_init_fence() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}
// Arrives on bar expecting `bytes` more, then starts the copy that delivers them.
__device__ __forceinline__ void bulk_copy_g2s(void *dst, const void *src, uint32_t bytes, uint64_t *bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const uint32_t b = (uint32_t)__cvta_generic_to_shared(bar);
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(b), "r"(bytes) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                 ::"r"((uint32_t)__cvta_generic_to_shared(dst)), "l"(src), "r"(bytes), "r"(b) : "memory");
#endif
}
__device__ __forceinline__ void mbar_wait(uint64_t *bar, unsigned parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const uint32_t b = (uint32_t)__cvta_generic_to_shared(bar);
    uint32_t done;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, p;\n}\n" : "=r"(done) : "r"(b), "r"(parity) : "memory");
    } while (!done);
#endif
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

// A staging loop's walk over i = first, first + step, ... as (q, r) = divmod(i, div), without a
// division per element: the step's own quotient and remainder are worked out once.
struct DivWalk {
    int q, r, dq, dr;
    __device__ __forceinline__ DivWalk(int first, int step, int div)
        : q(first / div), r(first - first / div * div), dq(step / div), dr(step - step / div * div) {}
    __device__ __forceinline__ void next(int div) {
        q += dq;
        r += dr;
        if (r >= div) {
            r -= div;
            q++;
        }
    }
};
