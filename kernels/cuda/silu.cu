// CUDA: SiLU (kernels/ops.h; CPU reference kernels/cpu/silu.c, same fp32 formulas). x, y, dy, dx
// in one dtype; elementwise, 16-byte accesses where aligned.
#include "cuda_elem.cuh"
#include "silu.h"

template <typename T> struct SiluFwdOp {
    const T *x;
    T *y;
    template <int V> __device__ void apply(size_t i) const {
        float v[V];
        load_v<V>(x + i, v);
        #pragma unroll
        for (int j = 0; j < V; j++) v[j] = silu_value(v[j]);
        store_v<V>(y + i, v);
    }
};

template <typename T> struct SiluBwdOp {
    const T *dy, *x;
    T *dx;
    template <int V> __device__ void apply(size_t i) const {
        float g[V], v[V], d[V];
        load_v<V>(dy + i, g);
        load_v<V>(x + i, v);
        load_v<V>(dx + i, d);
        #pragma unroll
        for (int j = 0; j < V; j++) {
            d[j] += g[j] * silu_slope(v[j]);
        }
        store_v<V>(dx + i, d);
    }
};

void cuda_silu_fwd(Ctx *ctx, const Tensor *x, Tensor *y) {
    cuda_check_tensor("silu_fwd", "x", x);
    cuda_check_numel("silu_fwd", "y", y, x->numel);
    cuda_check_same_dtype("silu_fwd", "y", y, "x", x);
    bool vec = aligned16(x->data) && aligned16(y->data);
    dispatch_dtype(x->dtype, [&](auto tag) {
        using T = TAG_T(tag);
        launch_map(ctx, x->numel, vec, SiluFwdOp<T>{(const T *)x->data, (T *)y->data});
    });
}

// dx += dy * silu'(x)
void cuda_silu_bwd(Ctx *ctx, const Tensor *dy, const Tensor *x, Tensor *dx) {
    if (!dx) return;
    cuda_check_tensor("silu_bwd", "x", x);
    cuda_check_numel("silu_bwd", "dy", dy, x->numel);
    cuda_check_numel("silu_bwd", "dx", dx, x->numel);
    cuda_check_same_dtype("silu_bwd", "dy", dy, "x", x);
    cuda_check_same_dtype("silu_bwd", "dx", dx, "x", x);
    bool vec = aligned16(dy->data) && aligned16(x->data) && aligned16(dx->data);
    dispatch_dtype(x->dtype, [&](auto tag) {
        using T = TAG_T(tag);
        launch_map(ctx, x->numel, vec,
                   SiluBwdOp<T>{(const T *)dy->data, (const T *)x->data, (T *)dx->data});
    });
}
