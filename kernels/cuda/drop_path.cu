// CUDA: drop path (stochastic depth) and the EMA of weights (kernels/ops.h; CPU reference
// kernels/cpu/drop_path.c). Both are single elementwise passes. The drop-path mask comes from
// kernels/drop_path_mask.h, the same function the CPU evaluates; products and sums are the
// rounded fp32 operations the CPU performs (__fmul_rn / __fadd_rn: no contraction into FMA),
// so fp32 results match the CPU bit for bit.
#include "cuda_elem.cuh"
#include "../drop_path_mask.h"

// y = x * scale(sample), or dx += dy * scale(sample) (ACC). With V = 8 the per-sample size is a
// multiple of 8, so a pack never straddles two samples.
template <typename TX, typename TY, bool ACC> struct DropPathOp {
    const TX *x;
    TY *y;
    IndexDiv per;
    DropPathArgs a;
    template <int V> __device__ void apply(size_t i) const {
        int b = (int)per.div(i);
        const int64_t step = drop_path_step(a.step, a.step_at);
        float s = drop_path_scale(a.prob, a.seed, step, a.site, a.first_sample + b);
        float vx[V], vy[V];
        load_v<V>(x + i, vx);
        if (ACC) load_v<V>(y + i, vy);
        #pragma unroll
        for (int j = 0; j < V; j++) {
            float p = __fmul_rn(vx[j], s);
            vy[j] = ACC ? __fadd_rn(vy[j], p) : p;
        }
        store_v<V>(y + i, vy);
    }
};

template <bool ACC>
static void drop_path_launch(Ctx *ctx, const char *op, const Tensor *x, const DropPathArgs *a,
                             Tensor *y) {
    cuda_check_tensor(op, "x", x);
    cuda_check_tensor(op, "y", y);
    CG_CHECK(x->ndim >= 1 && x->shape[0] > 0 && x->numel == y->numel, "",
             "op %s: tensors of %zu and %zu elements, batch %d", op, x->numel, y->numel,
             x->ndim ? x->shape[0] : 0);
    CG_CHECK(a->prob >= 0.0f && a->prob < 1.0f, "set drop_path in [0, 1)",
             "op %s: drop probability %g", op, a->prob);
    size_t per = x->numel / (size_t)x->shape[0];
    bool vec = per % 8 == 0 && aligned16(x->data) && aligned16(y->data);
    dispatch_dtype2(x->dtype, y->dtype, [&](auto tx, auto ty) {
        using TX = TAG_T(tx);
        using TY = TAG_T(ty);
        launch_map(ctx, y->numel, vec,
                   DropPathOp<TX, TY, ACC>{(const TX *)x->data, (TY *)y->data,
                                           index_div(per, y->numel), *a});
    });
}

void cuda_drop_path_fwd(Ctx *ctx, const Tensor *x, const DropPathArgs *a, Tensor *y) {
    drop_path_launch<false>(ctx, "drop_path_fwd", x, a, y);
}

void cuda_drop_path_bwd(Ctx *ctx, const Tensor *dy, const DropPathArgs *a, Tensor *dx) {
    if (!dx) return;
    drop_path_launch<true>(ctx, "drop_path_bwd", dy, a, dx);
}

// ema = d ema + (1 - d) src; out = ema in out's dtype (HAS_OUT).
template <typename TS, typename TO, bool HAS_OUT> struct EmaOp {
    float *ema;
    const TS *src;
    TO *out;
    float d, r;
    template <int V> __device__ void apply(size_t i) const {
        float e[V], s[V];
        load_v<V>(ema + i, e);
        load_v<V>(src + i, s);
        #pragma unroll
        for (int j = 0; j < V; j++) e[j] = __fadd_rn(__fmul_rn(d, e[j]), __fmul_rn(r, s[j]));
        store_v<V>(ema + i, e);
        if (HAS_OUT) store_v<V>(out + i, e);
    }
};

void cuda_ema_update(Ctx *ctx, Tensor *ema, const Tensor *src, float decay, Tensor *out) {
    cuda_check_f32("ema_update", "ema", ema);
    cuda_check_tensor("ema_update", "src", src);
    CG_CHECK(src->numel == ema->numel && (!out || out->numel == ema->numel), "",
             "op ema_update: ema %zu, src %zu, out %zu elements", ema->numel, src->numel,
             out ? out->numel : ema->numel);
    if (out) cuda_check_tensor("ema_update", "out", out);
    bool vec = aligned16(ema->data) && aligned16(src->data) && (!out || aligned16(out->data));
    float d = decay, r = 1.0f - decay;
    dispatch_dtype2(src->dtype, out ? out->dtype : DTYPE_F32, [&](auto ts, auto to) {
        using TS = TAG_T(ts);
        using TO = TAG_T(to);
        if (out && out->data != ema->data)
            launch_map(ctx, ema->numel, vec,
                       EmaOp<TS, TO, true>{tensor_f32(ema), (const TS *)src->data, (TO *)out->data, d, r});
        else
            launch_map(ctx, ema->numel, vec,
                       EmaOp<TS, TO, false>{tensor_f32(ema), (const TS *)src->data, nullptr, d, r});
    });
}
