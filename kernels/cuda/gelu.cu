// CUDA: GELU, exact (erf) or tanh approximation (kernels/ops.h; CPU reference
// kernels/cpu/gelu.c, whose formulas these are, in the same fp32 operations). x, y, dy, dx in
// one dtype; elementwise, 16-byte accesses where aligned.
#include "cuda_elem.cuh"
#include "gelu.h"
#include "../elementwise_shape.h"
#include <type_traits>

template <typename T, GeluKind K> struct GeluFwdOp {
    const T *x;
    T *y;
    template <int V> __device__ void apply(size_t i) const {
        float v[V];
        load_v<V>(x + i, v);
        #pragma unroll
        for (int j = 0; j < V; j++) v[j] = gelu_value<K, std::is_same<T, bf16>::value>(v[j]);
        store_v<V>(y + i, v);
    }
};

template <typename T, GeluKind K> struct GeluBwdOp {
    const T *dy, *x;
    T *dx;
    template <int V> __device__ void apply(size_t i) const {
        float g[V], v[V], d[V];
        load_v<V>(dy + i, g);
        load_v<V>(x + i, v);
        load_v<V>(dx + i, d);
        #pragma unroll
        for (int j = 0; j < V; j++) d[j] += g[j] * gelu_slope<K, std::is_same<T, bf16>::value>(v[j]);
        store_v<V>(dx + i, d);
    }
};

void cuda_gelu_fwd(Ctx *ctx, const Tensor *x, GeluKind kind, Tensor *y) {
    gelu_check_kind("gelu_fwd", kind);
    cuda_check_tensor("gelu_fwd", "x", x);
    cuda_check_numel("gelu_fwd", "y", y, x->numel);
    cuda_check_same_dtype("gelu_fwd", "y", y, "x", x);
    bool vec = aligned16(x->data) && aligned16(y->data);
    dispatch_dtype(x->dtype, [&](auto tag) {
        using T = TAG_T(tag);
        const T *px = (const T *)x->data;
        T *py = (T *)y->data;
        if (kind == GELU_ERF) launch_map(ctx, x->numel, vec, GeluFwdOp<T, GELU_ERF>{px, py});
        else launch_map(ctx, x->numel, vec, GeluFwdOp<T, GELU_TANH>{px, py});
    });
}

// dx += dy * gelu'(x)
void cuda_gelu_bwd(Ctx *ctx, const Tensor *dy, const Tensor *x, GeluKind kind, Tensor *dx) {
    if (!dx) return;
    gelu_check_kind("gelu_bwd", kind);
    cuda_check_tensor("gelu_bwd", "x", x);
    cuda_check_numel("gelu_bwd", "dy", dy, x->numel);
    cuda_check_numel("gelu_bwd", "dx", dx, x->numel);
    cuda_check_same_dtype("gelu_bwd", "dy", dy, "x", x);
    cuda_check_same_dtype("gelu_bwd", "dx", dx, "x", x);
    bool vec = aligned16(dy->data) && aligned16(x->data) && aligned16(dx->data);
    dispatch_dtype(x->dtype, [&](auto tag) {
        using T = TAG_T(tag);
        const T *pdy = (const T *)dy->data, *px = (const T *)x->data;
        T *pdx = (T *)dx->data;
        if (kind == GELU_ERF) launch_map(ctx, x->numel, vec, GeluBwdOp<T, GELU_ERF>{pdy, px, pdx});
        else launch_map(ctx, x->numel, vec, GeluBwdOp<T, GELU_TANH>{pdy, px, pdx});
    });
}

// ---- raw-buffer passes for fused ops (kernels/cuda/gelu.h) ---------------------------------------

template <typename T, GeluKind K> struct DGeluScaleOp {
    const T *pre;
    T *g;
    template <int V> __device__ void apply(size_t i) const {
        float vg[V], vp[V];
        load_v<V>(g + i, vg);
        load_v<V>(pre + i, vp);
        #pragma unroll
        for (int j = 0; j < V; j++) vg[j] *= gelu_slope<K, std::is_same<T, bf16>::value>(vp[j]);
        store_v<V>(g + i, vg);
    }
};

extern "C" void cuda_gelu_apply(Ctx *ctx, GeluKind kind, DType dt, const void *pre, void *y,
                                size_t n) {
    gelu_check_kind("gelu_apply", kind);
    bool vec = aligned16(pre) && aligned16(y);
    dispatch_dtype(dt, [&](auto tag) {
        using T = TAG_T(tag);
        const T *px = (const T *)pre;
        T *py = (T *)y;
        if (kind == GELU_ERF) launch_map(ctx, n, vec, GeluFwdOp<T, GELU_ERF>{px, py});
        else launch_map(ctx, n, vec, GeluFwdOp<T, GELU_TANH>{px, py});
    });
}

extern "C" void cuda_dgelu_scale(Ctx *ctx, GeluKind kind, DType dt, const void *pre, void *g,
                                 size_t n) {
    gelu_check_kind("dgelu_scale", kind);
    bool vec = aligned16(pre) && aligned16(g);
    dispatch_dtype(dt, [&](auto tag) {
        using T = TAG_T(tag);
        const T *pp = (const T *)pre;
        T *pg = (T *)g;
        if (kind == GELU_ERF) launch_map(ctx, n, vec, DGeluScaleOp<T, GELU_ERF>{pp, pg});
        else launch_map(ctx, n, vec, DGeluScaleOp<T, GELU_TANH>{pp, pg});
    });
}
