// CUDA: losses (kernels/ops.h, docs/design.md#losses; CPU reference kernels/cpu/losses.c). Each loss is a
// 1-element fp32 tensor written by the forward; dloss is read on the device (no host sync).
// Determinism: a row loss (cross-entropy, KL) is one warp's fixed butterfly sum, an MSE block
// partial is one block's fixed tree, and kernels/cuda/reduce.cu adds the row or block partials
// in order, in double. Inputs may be fp32 or bf16 each; the math is fp32.
// Shapes: kernels/losses_shape.h (both backends); the device and dtype rules here.
#include "cuda_elem.cuh"
#include "../losses_shape.h"

enum { LOSS_WARPS = 8, MSE_THREADS = 256, MSE_MAX_BLOCKS = 1024 };

// A loss or its dloss: one fp32 element on the GPU.
static void check_scalar(const char *op, const char *name, const Tensor *t) {
    cuda_check_f32(op, name, t);
    loss_check_scalar(op, name, t);
}

static unsigned row_blocks(size_t rows) { return (unsigned)ceil_div(rows, LOSS_WARPS); }

// log-sum-exp of one row, by the warp (every lane gets it).
template <int V, typename T> __device__ __forceinline__ float warp_row_lse(const T *xr, int C, int lane) {
    float m = -INFINITY, s = 0.0f;
    for (int c = lane * V; c < C; c += 32 * V) {
        float v[V], pm = -INFINITY, ps = 0.0f;
        load_v<V>(xr + c, v);
        #pragma unroll
        for (int j = 0; j < V; j++) pm = fmaxf(pm, v[j]);
        #pragma unroll
        for (int j = 0; j < V; j++) ps += expf(v[j] - pm);
        lse_merge(m, s, pm, ps);
    }
    warp_lse(m, s);
    return m + logf(s);
}

// ---- cross-entropy with soft targets ------------------------------------------------------------

template <typename TL, typename TT, typename TP, int V>
__global__ void __launch_bounds__(LOSS_WARPS * 32)
ce_fwd_kernel(const TL *__restrict__ logits, const TT *__restrict__ targets, TP *__restrict__ probs,
              float *__restrict__ row_loss, size_t B, int K) {
    size_t row = (size_t)blockIdx.x * LOSS_WARPS + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= B) return;
    size_t off = row * K;
    float lse = warp_row_lse<V>(logits + off, K, lane), l = 0.0f;
    for (int c = lane * V; c < K; c += 32 * V) {
        float x[V], t[V], p[V];
        load_v<V>(logits + off + c, x);
        load_v<V>(targets + off + c, t);
        #pragma unroll
        for (int j = 0; j < V; j++) {
            float logp = x[j] - lse;   // log softmax, finite even where p underflows
            p[j] = expf(logp);
            l -= t[j] * logp;
        }
        store_v<V>(probs + off + c, p);
    }
    l = warp_sum(l);
    if (lane == 0) row_loss[row] = l;
}

// logits, targets (B,K) -> loss = mean_b sum_k -t log softmax(logits); probs (B,K)
void cuda_cross_entropy_fwd(Ctx *ctx, const Tensor *logits, const Tensor *targets, Tensor *loss,
                            Tensor *probs) {
    const char *op = "cross_entropy_fwd";
    cuda_check_tensor(op, "logits", logits);
    cuda_check_tensor(op, "targets", targets);
    cuda_check_tensor(op, "probs", probs);
    cuda_check_f32(op, "loss", loss);
    size_t Kz, B = cross_entropy_dims(op, logits, targets, probs, loss, &Kz);
    const int K = (int)Kz;
    float *row_loss = (float *)cuda_scratch(ctx, B * sizeof(float));
    bool vec = K % 8 == 0 && aligned16(logits->data) && aligned16(targets->data) && aligned16(probs->data);
    cudaStream_t s = cuda_stream_of(ctx);
    dispatch_dtype3(logits->dtype, targets->dtype, probs->dtype, [&](auto tl, auto tt, auto tp) {
        using TL = TAG_T(tl);
        using TT = TAG_T(tt);
        using TP = TAG_T(tp);
        const TL *pl = (const TL *)logits->data;
        const TT *pt = (const TT *)targets->data;
        TP *pp = (TP *)probs->data;
        if (vec) ce_fwd_kernel<TL, TT, TP, 8><<<row_blocks(B), LOSS_WARPS * 32, 0, s>>>(pl, pt, pp, row_loss, B, K);
        else ce_fwd_kernel<TL, TT, TP, 1><<<row_blocks(B), LOSS_WARPS * 32, 0, s>>>(pl, pt, pp, row_loss, B, K);
    });
    CUDA_CHECK_LAUNCH();
    cuda_finish_sum(ctx, row_loss, B, 1.0 / (double)B, tensor_f32(loss), false);
}

// dlogits += dloss * (probs - targets) / B
template <typename TP, typename TT, typename TD> struct CeBwdOp {
    const float *dloss;
    const TP *probs;
    const TT *targets;
    TD *dlogits;
    float b;   // the batch size
    template <int V> __device__ void apply(size_t i) const {
        float g = dloss[0] / b, p[V], t[V], d[V];
        load_v<V>(probs + i, p);
        load_v<V>(targets + i, t);
        load_v<V>(dlogits + i, d);
        #pragma unroll
        for (int j = 0; j < V; j++) d[j] += g * (p[j] - t[j]);
        store_v<V>(dlogits + i, d);
    }
};

void cuda_cross_entropy_bwd(Ctx *ctx, const Tensor *dloss, const Tensor *probs,
                            const Tensor *targets, Tensor *dlogits) {
    const char *op = "cross_entropy_bwd";
    if (!dlogits) return;
    cuda_check_f32(op, "dloss", dloss);
    cuda_check_tensor(op, "probs", probs);
    cuda_check_tensor(op, "targets", targets);
    cuda_check_tensor(op, "dlogits", dlogits);
    // dloss / B in fp32, as the CPU reference
    const float B = (float)cross_entropy_bwd_dims(op, dloss, probs, targets, dlogits);
    bool vec = aligned16(probs->data) && aligned16(targets->data) && aligned16(dlogits->data);
    dispatch_dtype3(probs->dtype, targets->dtype, dlogits->dtype, [&](auto tp, auto tt, auto td) {
        using TP = TAG_T(tp);
        using TT = TAG_T(tt);
        using TD = TAG_T(td);
        launch_map(ctx, dlogits->numel, vec,
                   CeBwdOp<TP, TT, TD>{tensor_f32(dloss), (const TP *)probs->data,
                                       (const TT *)targets->data, (TD *)dlogits->data, B});
    });
}

// ---- mean squared error ----------------------------------------------------------------------------

// Per-block partial sums of (a - b)^2 over a grid-stride loop (the block count depends on n only).
template <typename TA, typename TB, int V>
__global__ void __launch_bounds__(MSE_THREADS)
mse_partial_kernel(const TA *__restrict__ a, const TB *__restrict__ b, size_t n, float *part) {
    size_t tid = blockIdx.x * (size_t)blockDim.x + threadIdx.x, stride = (size_t)gridDim.x * blockDim.x;
    float s = 0.0f;
    for (size_t p = tid; p < n / V; p += stride) {
        float va[V], vb[V];
        load_v<V>(a + p * V, va);
        load_v<V>(b + p * V, vb);
        #pragma unroll
        for (int j = 0; j < V; j++) s += (va[j] - vb[j]) * (va[j] - vb[j]);
    }
    if (V > 1)
        for (size_t i = n / V * V + tid; i < n; i += stride) {
            float d = load_or(a, i, 0.0f) - load_or(b, i, 0.0f);
            s += d * d;
        }
    s = block_sum(s);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
}

static unsigned reduce_blocks(size_t n) {
    size_t b = ceil_div(n, (size_t)MSE_THREADS * 8);
    return (unsigned)(b < 1 ? 1 : b > MSE_MAX_BLOCKS ? MSE_MAX_BLOCKS : b);
}

void cuda_mse_fwd(Ctx *ctx, const Tensor *a, const Tensor *b, Tensor *loss) {
    const char *op = "mse_fwd";
    cuda_check_tensor(op, "a", a);
    cuda_check_tensor(op, "b", b);
    check_scalar(op, "loss", loss);
    const size_t n = mse_dims(op, a, b, NULL, NULL);
    unsigned blocks = reduce_blocks(n);
    float *part = (float *)cuda_scratch(ctx, blocks * sizeof(float));
    bool vec = aligned16(a->data) && aligned16(b->data);
    cudaStream_t s = cuda_stream_of(ctx);
    dispatch_dtype2(a->dtype, b->dtype, [&](auto ta, auto tb) {
        using TA = TAG_T(ta);
        using TB = TAG_T(tb);
        if (vec) mse_partial_kernel<TA, TB, 8><<<blocks, MSE_THREADS, 0, s>>>((const TA *)a->data, (const TB *)b->data, n, part);
        else mse_partial_kernel<TA, TB, 1><<<blocks, MSE_THREADS, 0, s>>>((const TA *)a->data, (const TB *)b->data, n, part);
    });
    CUDA_CHECK_LAUNCH();
    cuda_finish_sum(ctx, part, blocks, 1.0 / (double)n, tensor_f32(loss), false);
}

// da += dloss * 2 (a - b) / n; db -= the same
template <typename TA, typename TB, bool DA, bool DB> struct MseBwdOp {
    const float *dloss;
    const TA *a;
    const TB *b;
    TA *da;
    TB *db;
    float n;
    template <int V> __device__ void apply(size_t i) const {
        float g = 2.0f * dloss[0] / n, va[V], vb[V];
        load_v<V>(a + i, va);
        load_v<V>(b + i, vb);
        #pragma unroll
        for (int j = 0; j < V; j++) va[j] = g * (va[j] - vb[j]);   // the gradient of a
        if (DA) {
            float d[V];
            load_v<V>(da + i, d);
            #pragma unroll
            for (int j = 0; j < V; j++) d[j] += va[j];
            store_v<V>(da + i, d);
        }
        if (DB) {
            float d[V];
            load_v<V>(db + i, d);
            #pragma unroll
            for (int j = 0; j < V; j++) d[j] -= va[j];
            store_v<V>(db + i, d);
        }
    }
};

void cuda_mse_bwd(Ctx *ctx, const Tensor *dloss, const Tensor *a, const Tensor *b, Tensor *da,
                  Tensor *db) {
    const char *op = "mse_bwd";
    if (!da && !db) return;
    check_scalar(op, "dloss", dloss);
    cuda_check_tensor(op, "a", a);
    cuda_check_tensor(op, "b", b);
    if (da) { cuda_check_tensor(op, "da", da); cuda_check_same_dtype(op, "da", da, "a", a); }
    if (db) { cuda_check_tensor(op, "db", db); cuda_check_same_dtype(op, "db", db, "b", b); }
    mse_dims(op, a, b, da, db);
    bool vec = aligned16(a->data) && aligned16(b->data) && (!da || aligned16(da->data)) &&
               (!db || aligned16(db->data));
    float n = (float)a->numel;
    dispatch_dtype2(a->dtype, b->dtype, [&](auto ta, auto tb) {
        using TA = TAG_T(ta);
        using TB = TAG_T(tb);
        const TA *pa = (const TA *)a->data;
        const TB *pb = (const TB *)b->data;
        TA *pda = da ? (TA *)da->data : nullptr;
        TB *pdb = db ? (TB *)db->data : nullptr;
        const float *g = tensor_f32(dloss);
        if (da && db) launch_map(ctx, a->numel, vec, MseBwdOp<TA, TB, true, true>{g, pa, pb, pda, pdb, n});
        else if (da) launch_map(ctx, a->numel, vec, MseBwdOp<TA, TB, true, false>{g, pa, pb, pda, pdb, n});
        else launch_map(ctx, a->numel, vec, MseBwdOp<TA, TB, false, true>{g, pa, pb, pda, pdb, n});
    });
}

// ---- token-wise softmax KL -------------------------------------------------------------------------

// KL(P(s_n) || P(t_n)) of one row, by the warp; lse_s, lse_t as computed.
template <int V, typename TS, typename TT>
__device__ __forceinline__ float warp_row_kl(const TS *sr, const TT *tr, int C, int lane,
                                             float lse_s, float lse_t) {
    float kl = 0.0f;
    for (int c = lane * V; c < C; c += 32 * V) {
        float vs[V], vt[V];
        load_v<V>(sr + c, vs);
        load_v<V>(tr + c, vt);
        #pragma unroll
        for (int j = 0; j < V; j++) {
            float ls = vs[j] - lse_s, lt = vt[j] - lse_t;
            kl += expf(ls) * (ls - lt);
        }
    }
    return warp_sum(kl);
}

template <typename TS, typename TT, int V>
__global__ void __launch_bounds__(LOSS_WARPS * 32)
token_kl_fwd_kernel(const TS *__restrict__ s, const TT *__restrict__ t, float *__restrict__ row_kl,
                    size_t N, int C) {
    size_t row = (size_t)blockIdx.x * LOSS_WARPS + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= N) return;
    const TS *sr = s + row * C;
    const TT *tr = t + row * C;
    float lse_s = warp_row_lse<V>(sr, C, lane), lse_t = warp_row_lse<V>(tr, C, lane);
    float kl = warp_row_kl<V>(sr, tr, C, lane, lse_s, lse_t);
    if (lane == 0) row_kl[row] = kl;
}

// s, t (N,C) -> loss = mean_n KL(softmax(s_n) || softmax(t_n))
void cuda_token_kl_fwd(Ctx *ctx, const Tensor *s, const Tensor *t, Tensor *loss) {
    const char *op = "token_kl_fwd";
    cuda_check_tensor(op, "s", s);
    cuda_check_tensor(op, "t", t);
    check_scalar(op, "loss", loss);
    size_t Cz, N = token_kl_dims(op, s, t, NULL, NULL, &Cz);
    const int C = (int)Cz;
    float *row_kl = (float *)cuda_scratch(ctx, N * sizeof(float));
    bool vec = C % 8 == 0 && aligned16(s->data) && aligned16(t->data);
    cudaStream_t st = cuda_stream_of(ctx);
    dispatch_dtype2(s->dtype, t->dtype, [&](auto ts, auto tt) {
        using TS = TAG_T(ts);
        using TT = TAG_T(tt);
        if (vec) token_kl_fwd_kernel<TS, TT, 8><<<row_blocks(N), LOSS_WARPS * 32, 0, st>>>((const TS *)s->data, (const TT *)t->data, row_kl, N, C);
        else token_kl_fwd_kernel<TS, TT, 1><<<row_blocks(N), LOSS_WARPS * 32, 0, st>>>((const TS *)s->data, (const TT *)t->data, row_kl, N, C);
    });
    CUDA_CHECK_LAUNCH();
    cuda_finish_sum(ctx, row_kl, N, 1.0 / (double)N, tensor_f32(loss), false);
}

// With g = dloss / N and KL_n recomputed:
//   ds[n,c] += g * ps_c * ((log ps_c - log pt_c) - KL_n);  dt[n,c] += g * (pt_c - ps_c)
template <typename TS, typename TT, int V>
__global__ void __launch_bounds__(LOSS_WARPS * 32)
token_kl_bwd_kernel(const float *__restrict__ dloss, const TS *__restrict__ s,
                    const TT *__restrict__ t, TS *__restrict__ ds, TT *__restrict__ dt, size_t N,
                    int C) {
    size_t row = (size_t)blockIdx.x * LOSS_WARPS + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= N) return;
    size_t off = row * C;
    float g = dloss[0] / (float)N;
    float lse_s = warp_row_lse<V>(s + off, C, lane), lse_t = warp_row_lse<V>(t + off, C, lane);
    float kl = warp_row_kl<V>(s + off, t + off, C, lane, lse_s, lse_t);
    for (int c = lane * V; c < C; c += 32 * V) {
        float vs[V], vt[V], ps[V], pt[V], lr[V];
        load_v<V>(s + off + c, vs);
        load_v<V>(t + off + c, vt);
        #pragma unroll
        for (int j = 0; j < V; j++) {
            float ls = vs[j] - lse_s, lt = vt[j] - lse_t;
            ps[j] = expf(ls);
            pt[j] = expf(lt);
            lr[j] = ls - lt;
        }
        if (ds) {
            float d[V];
            load_v<V>(ds + off + c, d);
            #pragma unroll
            for (int j = 0; j < V; j++) d[j] += g * ps[j] * (lr[j] - kl);
            store_v<V>(ds + off + c, d);
        }
        if (dt) {
            float d[V];
            load_v<V>(dt + off + c, d);
            #pragma unroll
            for (int j = 0; j < V; j++) d[j] += g * (pt[j] - ps[j]);
            store_v<V>(dt + off + c, d);
        }
    }
}

void cuda_token_kl_bwd(Ctx *ctx, const Tensor *dloss, const Tensor *s, const Tensor *t,
                       Tensor *ds, Tensor *dt) {
    const char *op = "token_kl_bwd";
    if (!ds && !dt) return;
    check_scalar(op, "dloss", dloss);
    cuda_check_tensor(op, "s", s);
    cuda_check_tensor(op, "t", t);
    if (ds) { cuda_check_tensor(op, "ds", ds); cuda_check_same_dtype(op, "ds", ds, "s", s); }
    if (dt) { cuda_check_tensor(op, "dt", dt); cuda_check_same_dtype(op, "dt", dt, "t", t); }
    size_t Cz, N = token_kl_dims(op, s, t, ds, dt, &Cz);
    const int C = (int)Cz;
    bool vec = C % 8 == 0 && aligned16(s->data) && aligned16(t->data) &&
               (!ds || aligned16(ds->data)) && (!dt || aligned16(dt->data));
    cudaStream_t st = cuda_stream_of(ctx);
    dispatch_dtype2(s->dtype, t->dtype, [&](auto ts, auto tt) {
        using TS = TAG_T(ts);
        using TT = TAG_T(tt);
        const TS *ps = (const TS *)s->data;
        const TT *pt = (const TT *)t->data;
        TS *pds = ds ? (TS *)ds->data : nullptr;
        TT *pdt = dt ? (TT *)dt->data : nullptr;
        if (vec) token_kl_bwd_kernel<TS, TT, 8><<<row_blocks(N), LOSS_WARPS * 32, 0, st>>>(tensor_f32(dloss), ps, pt, pds, pdt, N, C);
        else token_kl_bwd_kernel<TS, TT, 1><<<row_blocks(N), LOSS_WARPS * 32, 0, st>>>(tensor_f32(dloss), ps, pt, pds, pdt, N, C);
    });
    CUDA_CHECK_LAUNCH();
}
