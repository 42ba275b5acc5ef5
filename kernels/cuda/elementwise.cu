// CUDA: elementwise ops, broadcast add (pos_embed) and layer scale (kernels/ops.h; CPU
// reference kernels/cpu/elementwise.c). zero/accumulate/add/scale take any mix of fp32 and bf16
// (a bf16 activation gradient accumulates into an fp32 parameter gradient); the broadcast ops
// take activations in one dtype and the parameter in its own. dp and dg are fp32 column sums in
// a fixed order (kernels/cuda/cuda_colsum.cuh).
#include "cuda_colsum.cuh"
#include "../elementwise_shape.h"

// ---- zero, accumulate, add, scale ---------------------------------------------------------------

void cuda_zero(Ctx *ctx, Tensor *y) {
    cuda_check_tensor("zero", "y", y);
    if (y->numel) CUDA_CHECK(cudaMemsetAsync(y->data, 0, tensor_bytes(y), cuda_stream_of(ctx)));
}

template <typename TS, typename TD> struct AccumulateOp {
    const TS *src;
    TD *dst;
    template <int V> __device__ void apply(size_t i) const {
        float s[V], d[V];
        load_v<V>(src + i, s);
        load_v<V>(dst + i, d);
        #pragma unroll
        for (int j = 0; j < V; j++) d[j] += s[j];
        store_v<V>(dst + i, d);
    }
};

void cuda_accumulate(Ctx *ctx, const Tensor *src, Tensor *dst) {
    cuda_check_tensor("accumulate", "src", src);
    cuda_check_tensor("accumulate", "dst", dst);
    ew_check_numel("accumulate", "dst", dst, "src", src);
    bool vec = aligned16(src->data) && aligned16(dst->data);
    dispatch_dtype2(src->dtype, dst->dtype, [&](auto ts, auto td) {
        using TS = TAG_T(ts);
        using TD = TAG_T(td);
        launch_map(ctx, dst->numel, vec, AccumulateOp<TS, TD>{(const TS *)src->data, (TD *)dst->data});
    });
}

template <typename TA, typename TB, typename TY> struct AddOp {
    const TA *a;
    const TB *b;
    TY *y;
    template <int V> __device__ void apply(size_t i) const {
        float va[V], vb[V];
        load_v<V>(a + i, va);
        load_v<V>(b + i, vb);
        #pragma unroll
        for (int j = 0; j < V; j++) va[j] += vb[j];
        store_v<V>(y + i, va);
    }
};

void cuda_add_fwd(Ctx *ctx, const Tensor *a, const Tensor *b, Tensor *y) {
    cuda_check_tensor("add_fwd", "a", a);
    cuda_check_tensor("add_fwd", "b", b);
    cuda_check_tensor("add_fwd", "y", y);
    ew_check_numel("add_fwd", "a", a, "y", y);
    ew_check_numel("add_fwd", "b", b, "y", y);
    bool vec = aligned16(a->data) && aligned16(b->data) && aligned16(y->data);
    dispatch_dtype3(a->dtype, b->dtype, y->dtype, [&](auto ta, auto tb, auto ty) {
        using TA = TAG_T(ta);
        using TB = TAG_T(tb);
        using TY = TAG_T(ty);
        launch_map(ctx, y->numel, vec,
                   AddOp<TA, TB, TY>{(const TA *)a->data, (const TB *)b->data, (TY *)y->data});
    });
}

// y = s x, or y += s x (ACC).
template <typename TX, typename TY, bool ACC> struct ScaleOp {
    const TX *x;
    TY *y;
    float s;
    template <int V> __device__ void apply(size_t i) const {
        float vx[V], vy[V];
        load_v<V>(x + i, vx);
        if (ACC) load_v<V>(y + i, vy);
        #pragma unroll
        for (int j = 0; j < V; j++) vy[j] = ACC ? vy[j] + s * vx[j] : s * vx[j];
        store_v<V>(y + i, vy);
    }
};

template <bool ACC>
static void scale_launch(Ctx *ctx, const Tensor *x, float s, Tensor *y) {
    bool vec = aligned16(x->data) && aligned16(y->data);
    dispatch_dtype2(x->dtype, y->dtype, [&](auto tx, auto ty) {
        using TX = TAG_T(tx);
        using TY = TAG_T(ty);
        launch_map(ctx, y->numel, vec, ScaleOp<TX, TY, ACC>{(const TX *)x->data, (TY *)y->data, s});
    });
}

void cuda_scale_fwd(Ctx *ctx, const Tensor *x, float s, Tensor *y) {
    cuda_check_tensor("scale_fwd", "x", x);
    cuda_check_tensor("scale_fwd", "y", y);
    ew_check_numel("scale_fwd", "x", x, "y", y);
    scale_launch<false>(ctx, x, s, y);
}

void cuda_scale_bwd(Ctx *ctx, const Tensor *dy, float s, Tensor *dx) {
    if (!dx) return;
    cuda_check_tensor("scale_bwd", "dy", dy);
    cuda_check_tensor("scale_bwd", "dx", dx);
    ew_check_numel("scale_bwd", "dy", dy, "dx", dx);
    scale_launch<true>(ctx, dy, s, dx);
}

// ---- broadcast add: x (R, P) + p (P) -> y (R, P) --------------------------------------------------

template <typename T, typename TP> struct BcastAddOp {
    const T *x;
    const TP *p;
    T *y;
    IndexDiv P;
    template <int V> __device__ void apply(size_t i) const {
        float vx[V], vp[V];
        load_v<V>(x + i, vx);
        load_v<V>(p + P.mod(i), vp);
        #pragma unroll
        for (int j = 0; j < V; j++) vx[j] += vp[j];
        store_v<V>(y + i, vx);
    }
};

void cuda_add_bcast_fwd(Ctx *ctx, const Tensor *x, const Tensor *p, Tensor *y) {
    cuda_check_tensor("add_bcast_fwd", "x", x);
    cuda_check_tensor("add_bcast_fwd", "p", p);
    cuda_check_tensor("add_bcast_fwd", "y", y);
    ew_check_numel("add_bcast_fwd", "x", x, "y", y);
    cuda_check_same_dtype("add_bcast_fwd", "y", y, "x", x);
    size_t P = p->numel;
    bcast_rows("add_bcast_fwd", x, P);
    bool vec = P % 8 == 0 && aligned16(x->data) && aligned16(p->data) && aligned16(y->data);
    dispatch_dtype2(x->dtype, p->dtype, [&](auto tx, auto tp) {
        using T = TAG_T(tx);
        using TP = TAG_T(tp);
        launch_map(ctx, y->numel, vec,
                   BcastAddOp<T, TP>{(const T *)x->data, (const TP *)p->data, (T *)y->data,
                                     index_div(P, y->numel)});
    });
}

// One row range of dp = sum over rows of dy, with dx += dy on the way.
template <typename T> struct BcastBwdRows {
    const T *dy;
    T *dx;
    size_t P;
    template <int V> __device__ void row(size_t r, size_t c, float *acc) const {
        size_t i = r * P + c;
        float g[V], d[V];
        load_v<V>(dy + i, g);
        load_v<V>(dx + i, d);
        #pragma unroll
        for (int j = 0; j < V; j++) {
            acc[j] += g[j];
            d[j] += g[j];
        }
        store_v<V>(dx + i, d);
    }
};

void cuda_add_bcast_bwd(Ctx *ctx, const Tensor *dy, Tensor *dx, Tensor *dp) {
    if (!dp) {
        if (dx) cuda_accumulate(ctx, dy, dx);
        return;
    }
    cuda_check_tensor("add_bcast_bwd", "dy", dy);
    cuda_check_f32("add_bcast_bwd", "dp", dp);
    size_t P = dp->numel, R = bcast_rows("add_bcast_bwd", dy, P);
    if (dx) {
        cuda_check_tensor("add_bcast_bwd", "dx", dx);
        ew_check_numel("add_bcast_bwd", "dx", dx, "dy", dy);
        cuda_check_same_dtype("add_bcast_bwd", "dx", dx, "dy", dy);
    }
    bool vec = P % 8 == 0 && aligned16(dy->data) && aligned16(dp->data) &&
               (!dx || aligned16(dx->data));
    dispatch_dtype(dy->dtype, [&](auto tag) {
        using T = TAG_T(tag);
        if (dx)
            launch_colsum(ctx, R, P, vec, BcastBwdRows<T>{(const T *)dy->data, (T *)dx->data, P},
                          tensor_f32(dp));
        else
            launch_colsum(ctx, R, P, vec, ColsumRows<T>{(const T *)dy->data, P}, tensor_f32(dp));
    });
}

// ---- cast with column sums: y = x (converted), colsum += sums of x over rows ------------------------

template <typename TX, typename TY> struct CastColsumRows {
    const TX *x;
    TY *y;
    size_t P;
    template <int V> __device__ void row(size_t r, size_t c, float *acc) const {
        size_t i = r * P + c;
        float v[V];
        load_v<V>(x + i, v);
        #pragma unroll
        for (int j = 0; j < V; j++) acc[j] += v[j];
        store_v<V>(y + i, v);
    }
};

void cuda_cast_colsum(Ctx *ctx, const Tensor *x, Tensor *y, Tensor *colsum) {
    const char *op = "cast_colsum";
    ew_check_numel(op, "y", y, "x", x);
    if (!colsum) {
        cuda_scale_fwd(ctx, x, 1.0f, y);
        return;
    }
    cuda_check_tensor(op, "x", x);
    cuda_check_tensor(op, "y", y);
    cuda_check_f32(op, "colsum", colsum);
    size_t P = colsum_width(op, x, colsum), R = tensor_rows(x);
    bool vec = P % 8 == 0 && aligned16(x->data) && aligned16(y->data) && aligned16(colsum->data);
    dispatch_dtype2(x->dtype, y->dtype, [&](auto tx, auto ty) {
        using TX = TAG_T(tx);
        using TY = TAG_T(ty);
        launch_colsum(ctx, R, P, vec, CastColsumRows<TX, TY>{(const TX *)x->data, (TY *)y->data, P},
                      tensor_f32(colsum));
    });
}

// ---- layer scale: x (R, C) * g (C) -> y (R, C) ----------------------------------------------------

// y = x * g[c], or y += x * g[c] (ACC; the dx of the backward).
template <typename T, typename TG, bool ACC> struct LayerScaleOp {
    const T *x;
    const TG *g;
    T *y;
    IndexDiv C;
    template <int V> __device__ void apply(size_t i) const {
        float vx[V], vg[V], vy[V];
        load_v<V>(x + i, vx);
        load_v<V>(g + C.mod(i), vg);
        if (ACC) load_v<V>(y + i, vy);
        #pragma unroll
        for (int j = 0; j < V; j++) vy[j] = ACC ? vy[j] + vx[j] * vg[j] : vx[j] * vg[j];
        store_v<V>(y + i, vy);
    }
};

void cuda_layer_scale_fwd(Ctx *ctx, const Tensor *x, const Tensor *g, Tensor *y) {
    cuda_check_tensor("layer_scale_fwd", "x", x);
    cuda_check_tensor("layer_scale_fwd", "g", g);
    cuda_check_tensor("layer_scale_fwd", "y", y);
    ew_check_numel("layer_scale_fwd", "y", y, "x", x);
    cuda_check_same_dtype("layer_scale_fwd", "y", y, "x", x);
    layer_scale_rows("layer_scale_fwd", x, g);
    size_t C = g->numel;
    bool vec = C % 8 == 0 && aligned16(x->data) && aligned16(g->data) && aligned16(y->data);
    dispatch_dtype2(x->dtype, g->dtype, [&](auto tx, auto tg) {
        using T = TAG_T(tx);
        using TG = TAG_T(tg);
        launch_map(ctx, y->numel, vec,
                   LayerScaleOp<T, TG, false>{(const T *)x->data, (const TG *)g->data, (T *)y->data,
                                              index_div(C, y->numel)});
    });
}

// One row range of dg = sum over rows of dy * x; dx += dy * g on the way (HAS_DX).
template <typename T, typename TG, bool HAS_DX> struct LayerScaleBwdRows {
    const T *dy, *x;
    const TG *g;
    T *dx;
    size_t C;
    template <int V> __device__ void row(size_t r, size_t c, float *acc) const {
        size_t i = r * C + c;
        float vdy[V], vx[V];
        load_v<V>(dy + i, vdy);
        load_v<V>(x + i, vx);
        #pragma unroll
        for (int j = 0; j < V; j++) acc[j] += vdy[j] * vx[j];
        if (HAS_DX) {
            float vg[V], d[V];
            load_v<V>(g + c, vg);
            load_v<V>(dx + i, d);
            #pragma unroll
            for (int j = 0; j < V; j++) d[j] += vdy[j] * vg[j];
            store_v<V>(dx + i, d);
        }
    }
};

void cuda_layer_scale_bwd(Ctx *ctx, const Tensor *dy, const Tensor *x, const Tensor *g,
                          Tensor *dx, Tensor *dg) {
    if (!dx && !dg) return;
    cuda_check_tensor("layer_scale_bwd", "dy", dy);
    cuda_check_tensor("layer_scale_bwd", "x", x);
    cuda_check_tensor("layer_scale_bwd", "g", g);
    ew_check_numel("layer_scale_bwd", "dy", dy, "x", x);
    cuda_check_same_dtype("layer_scale_bwd", "dy", dy, "x", x);
    size_t C = g->numel, R = layer_scale_rows("layer_scale_bwd", x, g);
    if (dx) {
        cuda_check_tensor("layer_scale_bwd", "dx", dx);
        ew_check_numel("layer_scale_bwd", "dx", dx, "x", x);
        cuda_check_same_dtype("layer_scale_bwd", "dx", dx, "x", x);
    }
    if (dg) cuda_check_f32("layer_scale_bwd", "dg", dg);
    bool vec = C % 8 == 0 && aligned16(dy->data) && aligned16(x->data) && aligned16(g->data) &&
               (!dx || aligned16(dx->data)) && (!dg || aligned16(dg->data));
    dispatch_dtype2(dy->dtype, g->dtype, [&](auto tx, auto tg) {
        using T = TAG_T(tx);
        using TG = TAG_T(tg);
        if (!dg) {
            launch_map(ctx, dx->numel, vec,
                       LayerScaleOp<T, TG, true>{(const T *)dy->data, (const TG *)g->data,
                                                 (T *)dx->data, index_div(C, dx->numel)});
        } else if (dx) {
            launch_colsum(ctx, R, C, vec,
                          LayerScaleBwdRows<T, TG, true>{(const T *)dy->data, (const T *)x->data,
                                                         (const TG *)g->data, (T *)dx->data, C},
                          tensor_f32(dg));
        } else {
            launch_colsum(ctx, R, C, vec,
                          LayerScaleBwdRows<T, TG, false>{(const T *)dy->data, (const T *)x->data,
                                                          (const TG *)g->data, nullptr, C},
                          tensor_f32(dg));
        }
    });
}
