// Shared by the memory-bound CUDA ops (elementwise, norms, losses, optimizer): element types,
// 16-byte vector access, dtype dispatch, warp/block sums, launch shapes and argument checks.
//
// Every op reads each tensor's own dtype (fp32 or bf16, kernels/ops.h precision rules) and
// computes in fp32. A kernel handles V elements per access: V = 8 is one 16-byte load for bf16
// (two for fp32) and is used when every pointer is 16-byte aligned and the row length is a
// multiple of 8; V = 1 is the scalar path (odd channel counts, unaligned views, tails).
#pragma once
#include <stdint.h>
#include <math.h>
#include <type_traits>
#include "cuda_common.h"
#include "../ops.h"

typedef __nv_bfloat16 bf16;

// ---- element access ------------------------------------------------------------------------

// V elements of T held as raw bits (what one vector load brings in), read and written as fp32.
template <typename T, int V> struct Vec;

template <> struct Vec<float, 1> {
    float a;
    static __device__ __forceinline__ Vec load(const float *p) { return Vec{*p}; }
    __device__ __forceinline__ float get(int) const { return a; }
    static __device__ __forceinline__ Vec of(const float *v) { return Vec{v[0]}; }
    __device__ __forceinline__ void store(float *p) const { *p = a; }
};

template <> struct Vec<bf16, 1> {
    unsigned short a;
    static __device__ __forceinline__ Vec load(const bf16 *p) {
        return Vec{*reinterpret_cast<const unsigned short *>(p)};
    }
    __device__ __forceinline__ float get(int) const { return __uint_as_float((unsigned)a << 16); }
    static __device__ __forceinline__ Vec of(const float *v) {
        return Vec{__bfloat16_as_ushort(__float2bfloat16_rn(v[0]))};
    }
    __device__ __forceinline__ void store(bf16 *p) const {
        *reinterpret_cast<unsigned short *>(p) = a;
    }
};

template <> struct Vec<float, 8> {
    float4 a, b;
    static __device__ __forceinline__ Vec load(const float *p) {
        const float4 *q = reinterpret_cast<const float4 *>(p);
        return Vec{q[0], q[1]};
    }
    __device__ __forceinline__ float get(int j) const {   // j is a constant after unrolling
        const float4 &h = j < 4 ? a : b;
        int k = j & 3;
        return k == 0 ? h.x : k == 1 ? h.y : k == 2 ? h.z : h.w;
    }
    static __device__ __forceinline__ Vec of(const float *v) {
        return Vec{make_float4(v[0], v[1], v[2], v[3]), make_float4(v[4], v[5], v[6], v[7])};
    }
    __device__ __forceinline__ void store(float *p) const {
        float4 *q = reinterpret_cast<float4 *>(p);
        q[0] = a;
        q[1] = b;
    }
};

template <> struct Vec<bf16, 8> {
    uint4 a;
    static __device__ __forceinline__ Vec load(const bf16 *p) {
        return Vec{*reinterpret_cast<const uint4 *>(p)};
    }
    __device__ __forceinline__ float get(int j) const {
        unsigned w = j < 2 ? a.x : j < 4 ? a.y : j < 6 ? a.z : a.w;
        return __uint_as_float((j & 1) ? (w & 0xffff0000u) : (w << 16));
    }
    static __device__ __forceinline__ unsigned pair(float lo, float hi) {
        return (unsigned)__bfloat16_as_ushort(__float2bfloat16_rn(lo)) |
               ((unsigned)__bfloat16_as_ushort(__float2bfloat16_rn(hi)) << 16);
    }
    static __device__ __forceinline__ Vec of(const float *v) {
        return Vec{make_uint4(pair(v[0], v[1]), pair(v[2], v[3]), pair(v[4], v[5]), pair(v[6], v[7]))};
    }
    __device__ __forceinline__ void store(bf16 *p) const { *reinterpret_cast<uint4 *>(p) = a; }
};

// 4 and 2 elements (an 8- or 16-byte load): the widths a row whose length is a multiple of 4 or 2
// but not of 8 still allows (e.g. channel counts 108, 162).
template <> struct Vec<float, 4> {
    float4 a;
    static __device__ __forceinline__ Vec load(const float *p) {
        return Vec{*reinterpret_cast<const float4 *>(p)};
    }
    __device__ __forceinline__ float get(int j) const {
        return j == 0 ? a.x : j == 1 ? a.y : j == 2 ? a.z : a.w;
    }
    static __device__ __forceinline__ Vec of(const float *v) {
        return Vec{make_float4(v[0], v[1], v[2], v[3])};
    }
    __device__ __forceinline__ void store(float *p) const { *reinterpret_cast<float4 *>(p) = a; }
};

template <> struct Vec<float, 2> {
    float2 a;
    static __device__ __forceinline__ Vec load(const float *p) {
        return Vec{*reinterpret_cast<const float2 *>(p)};
    }
    __device__ __forceinline__ float get(int j) const { return j == 0 ? a.x : a.y; }
    static __device__ __forceinline__ Vec of(const float *v) { return Vec{make_float2(v[0], v[1])}; }
    __device__ __forceinline__ void store(float *p) const { *reinterpret_cast<float2 *>(p) = a; }
};

template <> struct Vec<bf16, 4> {
    uint2 a;
    static __device__ __forceinline__ Vec load(const bf16 *p) {
        return Vec{*reinterpret_cast<const uint2 *>(p)};
    }
    __device__ __forceinline__ float get(int j) const {
        unsigned w = j < 2 ? a.x : a.y;
        return __uint_as_float((j & 1) ? (w & 0xffff0000u) : (w << 16));
    }
    static __device__ __forceinline__ Vec of(const float *v) {
        return Vec{make_uint2(Vec<bf16, 8>::pair(v[0], v[1]), Vec<bf16, 8>::pair(v[2], v[3]))};
    }
    __device__ __forceinline__ void store(bf16 *p) const { *reinterpret_cast<uint2 *>(p) = a; }
};

template <> struct Vec<bf16, 2> {
    unsigned a;
    static __device__ __forceinline__ Vec load(const bf16 *p) {
        return Vec{*reinterpret_cast<const unsigned *>(p)};
    }
    __device__ __forceinline__ float get(int j) const {
        return __uint_as_float(j ? (a & 0xffff0000u) : (a << 16));
    }
    static __device__ __forceinline__ Vec of(const float *v) { return Vec{Vec<bf16, 8>::pair(v[0], v[1])}; }
    __device__ __forceinline__ void store(bf16 *p) const { *reinterpret_cast<unsigned *>(p) = a; }
};

// v[0..V) = p[0..V) as fp32.
template <int V, typename T> __device__ __forceinline__ void load_v(const T *p, float *v) {
    Vec<T, V> q = Vec<T, V>::load(p);
    #pragma unroll
    for (int j = 0; j < V; j++) v[j] = q.get(j);
}

// p[0..V) = v[0..V), rounded to nearest even for bf16.
template <int V, typename T> __device__ __forceinline__ void store_v(T *p, const float *v) {
    Vec<T, V>::of(v).store(p);
}

// One element of a tensor whose pointer may be NULL (then `dflt`).
template <typename T> __device__ __forceinline__ float load_or(const T *p, size_t i, float dflt) {
    return p ? Vec<T, 1>::load(p + i).get(0) : dflt;
}

// ---- dtype dispatch ------------------------------------------------------------------------

template <typename T> struct DTypeTag { using type = T; };

// Calls f(DTypeTag<T>{}) with T the C++ element type of dt (a generic lambda picks it up with
// `using T = typename decltype(tag)::type;`).
template <typename F> inline void dispatch_dtype(DType dt, F &&f) {
    if (dt == DTYPE_F32) f(DTypeTag<float>{});
    else f(DTypeTag<bf16>{});
}

template <typename F> inline void dispatch_dtype2(DType a, DType b, F &&f) {
    dispatch_dtype(a, [&](auto ta) { dispatch_dtype(b, [&](auto tb) { f(ta, tb); }); });
}

template <typename F> inline void dispatch_dtype3(DType a, DType b, DType c, F &&f) {
    dispatch_dtype(a, [&](auto ta) {
        dispatch_dtype2(b, c, [&](auto tb, auto tc) { f(ta, tb, tc); });
    });
}

#define TAG_T(tag) typename decltype(tag)::type

// ---- reductions ------------------------------------------------------------------------------
// Butterfly sums: every lane ends with the same value, added in the same order on every run.

template <typename A> __device__ __forceinline__ A warp_sum(A v) {
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Online softmax normalizer: (max m, sum s of exp(x - m)), merged with another pair. A lane that
// saw no element holds (-inf, 0) and contributes nothing.
__device__ __forceinline__ void lse_merge(float &m, float &s, float m2, float s2) {
    float nm = fmaxf(m, m2);
    if (nm == -INFINITY) return;
    s = (m == -INFINITY ? 0.0f : s * expf(m - nm)) + (m2 == -INFINITY ? 0.0f : s2 * expf(m2 - nm));
    m = nm;
}

__device__ __forceinline__ void warp_lse(float &m, float &s) {
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
        lse_merge(m, s, m2, s2);
    }
}

// Sum over the block (blockDim.x a multiple of 32); the result is valid in thread 0. The order
// is fixed by the thread layout. Call at most once per kernel (it owns one shared array).
template <typename A> __device__ __forceinline__ A block_sum(A v) {
    __shared__ A part[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    v = warp_sum(v);
    if (lane == 0) part[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < warps ? part[lane] : A(0);
        v = warp_sum(v);
    }
    return v;
}

// Host side: out[0] (+)= scale * sum of part[0..n) (one block, in double, fixed order).
// kernels/cuda/reduce.cu.
void cuda_finish_sum(Ctx *ctx, const float *part, size_t n, double scale, float *out,
                     bool accumulate);

// Host side: column sums of a (parts, width) fp32 partial matrix, in a fixed order, added to
// out0[i] for i < n0 and to out1[i - n0] for the rest (either NULL: skipped).
// kernels/cuda/reduce.cu.
void cuda_sum_partials(Ctx *ctx, const float *part, unsigned parts, size_t width, size_t n0,
                       float *out0, float *out1);

// ---- launch shapes ----------------------------------------------------------------------------

enum { ELEM_THREADS = 256 };

static inline bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

static inline size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }

// Blocks for a grid-stride loop over `work` items: enough to fill the GPU, no more.
static inline unsigned grid_stride_blocks(Ctx *ctx, size_t work, int threads) {
    size_t fill = (size_t)cuda_ctx_of(ctx)->sm_count * (2048 / threads);
    size_t need = ceil_div(work, (size_t)threads);
    size_t b = need < fill ? need : fill;
    return (unsigned)(b ? b : 1);
}

// Elementwise over n elements: f.apply<V>(i) handles elements i..i+V-1. Vector packs first,
// then the scalar tail.
template <int V, typename F> __global__ void map_kernel(size_t n, F f) {
    size_t tid = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    size_t stride = (size_t)gridDim.x * blockDim.x, packs = n / V;
    for (size_t p = tid; p < packs; p += stride) f.template apply<V>(p * V);
    if (V > 1)
        for (size_t i = packs * V + tid; i < n; i += stride) f.template apply<1>(i);
}

// Runs f over n elements on the context's stream; vec: every pointer f touches is 16-byte
// aligned and every row f sees has a multiple of 8 elements.
template <typename F> void launch_map(Ctx *ctx, size_t n, bool vec, const F &f) {
    if (n == 0) return;
    cudaStream_t s = cuda_stream_of(ctx);
    if (vec)
        map_kernel<8><<<grid_stride_blocks(ctx, ceil_div(n, 8), ELEM_THREADS), ELEM_THREADS, 0, s>>>(n, f);
    else
        map_kernel<1><<<grid_stride_blocks(ctx, n, ELEM_THREADS), ELEM_THREADS, 0, s>>>(n, f);
    CUDA_CHECK_LAUNCH();
}

// i % m and i / m in 32 bits when the tensor is small enough (the common case), else 64.
struct IndexDiv {
    size_t m;
    bool small;   // every index < 2^32
    __device__ __forceinline__ size_t div(size_t i) const {
        return small ? (size_t)((uint32_t)i / (uint32_t)m) : i / m;
    }
    __device__ __forceinline__ size_t mod(size_t i) const {
        return small ? (size_t)((uint32_t)i % (uint32_t)m) : i % m;
    }
};

static inline IndexDiv index_div(size_t m, size_t max_index) {
    return IndexDiv{m ? m : 1, max_index < 0xffffffffull && m < 0xffffffffull};
}

// ---- argument checks (a wrong tensor stops with the op, the argument and what was expected) ----

static inline void cuda_check_tensor(const char *op, const char *name, const Tensor *t) {
    CG_CHECK(t != NULL, "", "op %s: %s is NULL", op, name);
    CG_CHECK(t->device == DEVICE_CUDA, "every tensor of a GPU op lives on the GPU",
             "op %s: %s is on the CPU", op, name);
    CG_CHECK(t->dtype == DTYPE_F32 || t->dtype == DTYPE_BF16, "", "op %s: %s has dtype %d", op,
             name, (int)t->dtype);
}

// t is fp32 (LayerNorm statistics, losses, parameter gradients, optimizer moments).
static inline void cuda_check_f32(const char *op, const char *name, const Tensor *t) {
    cuda_check_tensor(op, name, t);
    CG_CHECK(t->dtype == DTYPE_F32, "statistics, losses, parameter gradients and optimizer "
             "moments are fp32 (kernels/ops.h precision rules)",
             "op %s: %s is %s, expected fp32", op, name, dtype_name(t->dtype));
}

static inline void cuda_check_numel(const char *op, const char *name, const Tensor *t, size_t n) {
    cuda_check_tensor(op, name, t);
    char buf[64];
    CG_CHECK(t->numel == n, "", "op %s: %s has shape %s (%zu elements), expected %zu", op, name,
             tensor_shape_str(t, buf, sizeof buf), t->numel, n);
}

static inline void cuda_check_same_dtype(const char *op, const char *name, const Tensor *t,
                                         const char *ref_name, const Tensor *ref) {
    CG_CHECK(t->dtype == ref->dtype, "activations and their gradients share one dtype",
             "op %s: %s is %s but %s is %s", op, name, dtype_name(t->dtype), ref_name,
             dtype_name(ref->dtype));
}
