// CUDA: LayerNorm over the last dim (kernels/ops.h; CPU reference kernels/cpu/layernorm.c).
// x, dx in one dtype and y, dy in one dtype: the same (the activation dtype), fp32 x and bf16
// y (the encoders' fp32 residual stream normalized straight into a bf16 sublayer input), or bf16
// x and fp32 y (a bf16 convolution's output normalized into gspn_hier's fp32 stream); w and b
// in the parameter dtype (either may be NULL); mean, rstd, dw, db fp32. One warp per row (short
// rows, C <= 128: 4 to 16 lanes per row, several rows per warp). When C is a multiple of 8, the pointers are
// aligned and C <= 2048 (forward) or 1280 (backward), the row stays in registers between the
// passes (one read from memory); otherwise the passes read the row again (from L1/L2).
//
// Backward: every warp adds dy * xhat and dy for its rows into its own slice of shared memory
// (its lanes own fixed channels, its rows come in order), the block adds its warps in order
// into a partial in scratch, and a second kernel adds the blocks in order: dw and db are bitwise
// the same on every run (on a given GPU model: the block count follows the occupancy). The
// slice is laid out by (pack slot, element, lane), so the 32 lanes of a warp touch 32
// consecutive words (no bank conflicts).
#include "cuda_elem.cuh"
#include "../layernorm_shape.h"
#include <type_traits>

enum { LN_FWD_WARPS = 8, LN_BWD_WARPS = 4 };

// Calls f(x tag, y tag, parameter tag) for the dtype combinations the op takes: x and y alike,
// or one fp32 and the other bf16 (checked by the caller).
template <typename F> static void ln_dispatch(DType x, DType y, DType p, F &&f) {
    dispatch_dtype(p, [&](auto tp) {
        if (x == DTYPE_F32 && y == DTYPE_F32) f(DTypeTag<float>{}, DTypeTag<float>{}, tp);
        else if (x == DTYPE_BF16 && y == DTYPE_BF16) f(DTypeTag<bf16>{}, DTypeTag<bf16>{}, tp);
        else if (x == DTYPE_F32) f(DTypeTag<float>{}, DTypeTag<bf16>{}, tp);
        else f(DTypeTag<bf16>{}, DTypeTag<float>{}, tp);
    });
}

static void ln_check_pair(const char *op, const char *yname, const Tensor *y, const char *xname,
                          const Tensor *x) {
    const bool known = (x->dtype == DTYPE_F32 || x->dtype == DTYPE_BF16) &&
                       (y->dtype == DTYPE_F32 || y->dtype == DTYPE_BF16);
    CG_CHECK(known, "LayerNorm reads and writes fp32 or bf16",
             "op %s: %s is %s and %s is %s", op, xname, dtype_name(x->dtype), yname,
             dtype_name(y->dtype));
}

// Packs of 8 kept in registers per lane for a row of C channels (0: read the row again).
static int ln_cached_packs(int C) {
    if (C <= 2 * 256) return 2;
    if (C <= 5 * 256) return 5;   // 768, 1152 (so14), 1280
    if (C <= 8 * 256) return 8;
    return 0;
}

// ---- forward -------------------------------------------------------------------------------

// With TR not void (layernorm_fwd with r): the row of x + add is written to h and normalized.
template <typename T, typename TY, typename TP, int V, int NP, typename TR = void>
__global__ void __launch_bounds__(LN_FWD_WARPS * 32)
ln_fwd_kernel(const T *__restrict__ x, const TP *__restrict__ w, const TP *__restrict__ b,
              float eps, TY *__restrict__ y, float *__restrict__ mean, float *__restrict__ rstd,
              size_t N, int C, const TR *__restrict__ add = nullptr, T *__restrict__ h = nullptr) {
    constexpr bool ADD = !std::is_void<TR>::value;
    size_t row = (size_t)blockIdx.x * LN_FWD_WARPS + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= N) return;
    const T *xr = x + row * C;
    TY *yr = y + row * C;
    Vec<T, V> cache[NP > 0 ? NP : 1];
    if constexpr (ADD) {   // h = x + add (rounded to T), then the passes read h
        T *hr = h + row * C;
        if constexpr (NP > 0) {
            #pragma unroll
            for (int k = 0; k < NP; k++) {
                int c = (k * 32 + lane) * V;
                if (c < C) {
                    float vx[V], vr[V];
                    load_v<V>(xr + c, vx);
                    load_v<V>(add + row * C + c, vr);
                    #pragma unroll
                    for (int j = 0; j < V; j++) vx[j] += vr[j];
                    cache[k] = Vec<T, V>::of(vx);
                    cache[k].store(hr + c);
                }
            }
        } else {
            for (int c = lane * V; c < C; c += 32 * V) {
                float vx[V], vr[V];
                load_v<V>(xr + c, vx);
                load_v<V>(add + row * C + c, vr);
                #pragma unroll
                for (int j = 0; j < V; j++) vx[j] += vr[j];
                store_v<V>(hr + c, vx);
            }
            __syncwarp();   // the passes below read the row back (each lane its own channels)
        }
        xr = hr;
    }

    float s = 0.0f;
    if constexpr (NP > 0) {
        #pragma unroll
        for (int k = 0; k < NP; k++) {
            int c = (k * 32 + lane) * V;
            if (c < C) {
                if constexpr (!ADD) cache[k] = Vec<T, V>::load(xr + c);
                #pragma unroll
                for (int j = 0; j < V; j++) s += cache[k].get(j);
            }
        }
    } else {
        for (int c = lane * V; c < C; c += 32 * V) {
            float v[V];
            load_v<V>(xr + c, v);
            #pragma unroll
            for (int j = 0; j < V; j++) s += v[j];
        }
    }
    float m = warp_sum(s) / (float)C;

    float q = 0.0f;
    if constexpr (NP > 0) {
        #pragma unroll
        for (int k = 0; k < NP; k++) {
            int c = (k * 32 + lane) * V;
            if (c < C) {
                #pragma unroll
                for (int j = 0; j < V; j++) {
                    float d = cache[k].get(j) - m;
                    q += d * d;
                }
            }
        }
    } else {
        for (int c = lane * V; c < C; c += 32 * V) {
            float v[V];
            load_v<V>(xr + c, v);
            #pragma unroll
            for (int j = 0; j < V; j++) q += (v[j] - m) * (v[j] - m);
        }
    }
    float r = 1.0f / sqrtf(warp_sum(q) / (float)C + eps);

    auto write = [&](int c, const float *v) {
        float vw[V], vb[V], out[V];
        if (w) load_v<V>(w + c, vw);
        if (b) load_v<V>(b + c, vb);
        #pragma unroll
        for (int j = 0; j < V; j++) out[j] = (v[j] - m) * r * (w ? vw[j] : 1.0f) + (b ? vb[j] : 0.0f);
        store_v<V>(yr + c, out);
    };
    if constexpr (NP > 0) {
        #pragma unroll
        for (int k = 0; k < NP; k++) {
            int c = (k * 32 + lane) * V;
            if (c < C) {
                float v[V];
                #pragma unroll
                for (int j = 0; j < V; j++) v[j] = cache[k].get(j);
                write(c, v);
            }
        }
    } else {
        for (int c = lane * V; c < C; c += 32 * V) {
            float v[V];
            load_v<V>(xr + c, v);
            write(c, v);
        }
    }
    if (lane == 0) {
        if (mean) mean[row] = m;
        if (rstd) rstd[row] = r;
    }
}

// Short rows (C <= 128, a multiple of 8, aligned): lpr lanes per row (a power of two, 8 * lpr >= C),
// 32 / lpr rows per warp at a time, one pack of 8 channels per lane (a warp per row would leave
// most lanes idle on the C-GSPN latent's 64 channels).
__device__ __forceinline__ float ln_seg_sum(float v, int lpr) {
    for (int o = lpr / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

static int ln_lanes_per_row(int C) { return C <= 32 ? 4 : C <= 64 ? 8 : 16; }

template <typename T, typename TY, typename TP>
__global__ void __launch_bounds__(LN_FWD_WARPS * 32)
ln_fwd_short_kernel(const T *__restrict__ x, const TP *__restrict__ w, const TP *__restrict__ b,
                    float eps, TY *__restrict__ y, float *__restrict__ mean,
                    float *__restrict__ rstd, size_t N, int C, int lpr) {
    constexpr int V = 8;
    int lane = threadIdx.x % 32, c = (lane % lpr) * V;
    size_t row = ((size_t)blockIdx.x * LN_FWD_WARPS + threadIdx.x / 32) * (32 / lpr) + lane / lpr;
    bool on = row < N && c < C;   // every lane takes part in the shuffles
    float v[V];
    #pragma unroll
    for (int j = 0; j < V; j++) v[j] = 0.0f;
    if (on) load_v<V>(x + row * C + c, v);
    float s = 0.0f;
    #pragma unroll
    for (int j = 0; j < V; j++) s += v[j];
    float m = ln_seg_sum(s, lpr) / (float)C, q = 0.0f;
    if (on) {
        #pragma unroll
        for (int j = 0; j < V; j++) q += (v[j] - m) * (v[j] - m);
    }
    float r = 1.0f / sqrtf(ln_seg_sum(q, lpr) / (float)C + eps);
    if (on) {
        float vw[V], vb[V], out[V];
        if (w) load_v<V>(w + c, vw);
        if (b) load_v<V>(b + c, vb);
        #pragma unroll
        for (int j = 0; j < V; j++) out[j] = (v[j] - m) * r * (w ? vw[j] : 1.0f) + (b ? vb[j] : 0.0f);
        store_v<V>(y + row * C + c, out);
        if (c == 0) {
            if (mean) mean[row] = m;
            if (rstd) rstd[row] = r;
        }
    }
}

template <typename T, typename TY, typename TP, int V, int NP, typename TR = void>
static void ln_fwd_launch(Ctx *ctx, const Tensor *x, const Tensor *w, const Tensor *b, float eps,
                          Tensor *y, Tensor *mean, Tensor *rstd, size_t N, int C,
                          const Tensor *r = nullptr, Tensor *h = nullptr) {
    unsigned blocks = (unsigned)ceil_div(N, LN_FWD_WARPS);
    ln_fwd_kernel<T, TY, TP, V, NP, TR><<<blocks, LN_FWD_WARPS * 32, 0, cuda_stream_of(ctx)>>>(
        (const T *)x->data, w ? (const TP *)w->data : nullptr, b ? (const TP *)b->data : nullptr,
        eps, (TY *)y->data, mean ? tensor_f32(mean) : nullptr, rstd ? tensor_f32(rstd) : nullptr,
        N, C, r ? (const TR *)r->data : nullptr, h ? (T *)h->data : nullptr);
    CUDA_CHECK_LAUNCH();
}

// layernorm_fwd, with the add when r (then h) is given.
static void ln_fwd(const char *op, Ctx *ctx, const Tensor *x, const Tensor *r, const Tensor *w,
                   const Tensor *b, float eps, Tensor *h, Tensor *y, Tensor *mean, Tensor *rstd) {
    const LayerNormDims d = layernorm_fwd_dims(op, x, r, w, b, eps, h, y, mean, rstd);
    const int C = d.C;
    const size_t N = d.N;
    cuda_check_tensor(op, "x", x);
    cuda_check_tensor(op, "y", y);
    ln_check_pair(op, "y", y, "x", x);
    if (r) {
        cuda_check_tensor(op, "r", r);
        cuda_check_tensor(op, "h", h);
        cuda_check_same_dtype(op, "h", h, "x", x);
        CG_CHECK(r->dtype == x->dtype || r->dtype == y->dtype, "",
                 "op %s: r is %s, x %s and y %s", op, dtype_name(r->dtype), dtype_name(x->dtype),
                 dtype_name(y->dtype));
    }
    if (w) cuda_check_tensor(op, "w", w);
    if (b) cuda_check_tensor(op, "b", b);
    if (w && b) cuda_check_same_dtype(op, "b", b, "w", w);
    if (mean) cuda_check_f32(op, "mean", mean);
    if (rstd) cuda_check_f32(op, "rstd", rstd);
    if (N == 0) return;
    DType pdt = w ? w->dtype : b ? b->dtype : x->dtype;
    bool vec = C % 8 == 0 && aligned16(x->data) && aligned16(y->data) &&
               (!w || aligned16(w->data)) && (!b || aligned16(b->data)) &&
               (!r || (aligned16(r->data) && aligned16(h->data)));
    int np = vec ? ln_cached_packs(C) : 0;
    ln_dispatch(x->dtype, y->dtype, pdt, [&](auto tx, auto ty, auto tp) {
        using T = TAG_T(tx);
        using TY = TAG_T(ty);
        using TP = TAG_T(tp);
        auto launch = [&](auto tr) {
            using TR = typename decltype(tr)::type;
            if (!vec) ln_fwd_launch<T, TY, TP, 1, 0, TR>(ctx, x, w, b, eps, y, mean, rstd, N, C, r, h);
            else if (np == 2) ln_fwd_launch<T, TY, TP, 8, 2, TR>(ctx, x, w, b, eps, y, mean, rstd, N, C, r, h);
            else if (np == 5) ln_fwd_launch<T, TY, TP, 8, 5, TR>(ctx, x, w, b, eps, y, mean, rstd, N, C, r, h);
            else if (np == 8) ln_fwd_launch<T, TY, TP, 8, 8, TR>(ctx, x, w, b, eps, y, mean, rstd, N, C, r, h);
            else ln_fwd_launch<T, TY, TP, 8, 0, TR>(ctx, x, w, b, eps, y, mean, rstd, N, C, r, h);
        };
        if (!r && vec && C <= 128) {
            int lpr = ln_lanes_per_row(C);
            unsigned blocks = (unsigned)ceil_div(N, (size_t)LN_FWD_WARPS * (32 / lpr));
            ln_fwd_short_kernel<T, TY, TP><<<blocks, LN_FWD_WARPS * 32, 0, cuda_stream_of(ctx)>>>(
                (const T *)x->data, w ? (const TP *)w->data : nullptr,
                b ? (const TP *)b->data : nullptr, eps, (TY *)y->data,
                mean ? tensor_f32(mean) : nullptr, rstd ? tensor_f32(rstd) : nullptr, N, C, lpr);
            CUDA_CHECK_LAUNCH();
        } else if (!r) {
            launch(DTypeTag<void>{});
        } else if (r->dtype == DTYPE_F32) {
            launch(DTypeTag<float>{});
        } else {
            launch(DTypeTag<bf16>{});
        }
    });
}

void cuda_layernorm_fwd(Ctx *ctx, const Tensor *x, const Tensor *r, const Tensor *w,
                        const Tensor *b, float eps, Tensor *h, Tensor *y, Tensor *mean,
                        Tensor *rstd) {
    ln_fwd("layernorm_fwd", ctx, x, r, w, b, eps, h, y, mean, rstd);
}

// ---- backward --------------------------------------------------------------------------------
// Pass 1 sums g = dy w and g xhat over the row (warp butterfly); pass 2 writes
// dx += rstd (g - mean_g - xhat mean_gx) and adds dy xhat, dy into the warp's dw, db sums, which
// live in the warp's own slice of shared memory (its lanes own fixed channels, its rows come in
// order). At the end the block adds its warps' slices in warp order. Two kernels, by row length:
// - cached (C a multiple of 8, C <= 1280, aligned): a lane loads its packs of dy, x and dx for
//   the row in one batch and keeps them in registers for both passes (one memory round trip per
//   row);
// - general: pass 2 reads the row again.

// Channels of a warp's accumulator slice: C rounded up to whole rounds of 32 lanes x V.
__host__ __device__ static inline int ln_acc_len(int C, int V) {
    return (C + 32 * V - 1) / (32 * V) * 32 * V;
}

// Where channel c lives in a slice: lane (c / V) % 32 of round c / (32 V), element c % V, laid
// out by (round, element, lane) so the 32 lanes of a warp touch 32 consecutive words.
template <int V> __device__ __forceinline__ int ln_acc_index(int c) {
    if (V == 1) return c;
    return ((c / (32 * V)) * V + c % V) * 32 + (c / V) % 32;
}

// Adds the block's warp slices (LN_BWD_WARPS, NS, L) in warp order and writes the block's
// partial (2, C) row of dw | db and, when NS is 3, its partial_s (C) row of the hand-off's column
// sums. Called by every thread of the block.
template <int V>
__device__ __forceinline__ void ln_fold_warps(float *acc_all, int NS, int L, int C, float *partial,
                                              float *partial_s) {
    __syncthreads();
    for (int i = threadIdx.x; i < NS * L; i += blockDim.x) {
        float s = acc_all[i];
        #pragma unroll
        for (int k = 1; k < LN_BWD_WARPS; k++) s += acc_all[(size_t)k * NS * L + i];
        acc_all[i] = s;
    }
    __syncthreads();
    float *out = partial + (size_t)blockIdx.x * 2 * C;
    for (int i = threadIdx.x; i < 2 * C; i += blockDim.x)
        out[i] = acc_all[(i < C ? 0 : L) + ln_acc_index<V>(i < C ? i : i - C)];
    if (NS == 3)
        for (int i = threadIdx.x; i < C; i += blockDim.x)
            partial_s[(size_t)blockIdx.x * C + i] = acc_all[2 * L + ln_acc_index<V>(i)];
}

// The hand-off of a row's final dx values d[0..V) at channel slot a (ln_acc_index): the copy in
// dy's dtype, and their column sums into the warp's third slice acc_s. d is what dx holds (already
// rounded to T).
template <typename TY, int V>
__device__ __forceinline__ void ln_handoff(const float *d, TY *dx_act, float *acc_s, int a) {
    if (dx_act) store_v<V>(dx_act, d);
    if (acc_s) {
        #pragma unroll
        for (int j = 0; j < V; j++) acc_s[a + 32 * j] += d[j];
    }
}

// d[0..V) rounded to T, as a store of them to a T tensor reads back.
template <typename T, int V> __device__ __forceinline__ void ln_round(float *d) {
    Vec<T, V> q = Vec<T, V>::of(d);
    #pragma unroll
    for (int j = 0; j < V; j++) d[j] = q.get(j);
}

// partial: (gridDim.x, 2, C) fp32, this block's dw | db, or NULL when neither is wanted (then
// partial_s is NULL too). The hand-off (dx given): dx_act, the final dx in dy's dtype, and
// partial_s (gridDim.x, C), this block's column sums of the final dx (each NULL: not wanted).
template <typename T, typename TY, typename TP, int NP>
__global__ void __launch_bounds__(LN_BWD_WARPS * 32)
ln_bwd_cached_kernel(const TY *__restrict__ dy, const T *__restrict__ x, const TP *__restrict__ w,
                     const float *__restrict__ mean, const float *__restrict__ rstd,
                     T *__restrict__ dx, float *__restrict__ partial, size_t N, int C,
                     TY *__restrict__ dx_act, float *__restrict__ partial_s) {
    constexpr int V = 8, L = NP * 32 * V;
    extern __shared__ float acc_all[];   // (LN_BWD_WARPS, NS, L) when partial
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, NS = partial_s ? 3 : 2;
    float *acc_w = acc_all + (size_t)warp * NS * L, *acc_b = acc_w + L;
    float *acc_s = partial_s ? acc_w + 2 * L : nullptr;
    if (partial) {
        for (int i = lane; i < NS * L; i += 32) acc_w[i] = 0.0f;
        __syncwarp();
    }
    Vec<TY, V> cdy[NP];
    Vec<T, V> cx[NP], cdx[NP];
    size_t warps_total = (size_t)gridDim.x * LN_BWD_WARPS;
    for (size_t row = (size_t)blockIdx.x * LN_BWD_WARPS + warp; row < N; row += warps_total) {
        const TY *dyr = dy + row * C;
        const T *xr = x + row * C;
        T *dxr = dx ? dx + row * C : nullptr;
        float m = mean[row], r = rstd[row];
        #pragma unroll
        for (int k = 0; k < NP; k++) {
            int c = (k * 32 + lane) * V;
            if (c < C) {
                cdy[k] = Vec<TY, V>::load(dyr + c);
                cx[k] = Vec<T, V>::load(xr + c);
                if (dxr) cdx[k] = Vec<T, V>::load(dxr + c);
            }
        }
        float sg = 0.0f, sgx = 0.0f;
        #pragma unroll
        for (int k = 0; k < NP; k++) {
            int c = (k * 32 + lane) * V;
            if (c < C) {
                float vw[V];
                if (w) load_v<V>(w + c, vw);
                #pragma unroll
                for (int j = 0; j < V; j++) {
                    float g = cdy[k].get(j) * (w ? vw[j] : 1.0f);
                    sg += g;
                    sgx += g * ((cx[k].get(j) - m) * r);
                }
            }
        }
        float mean_g = warp_sum(sg) / (float)C, mean_gx = warp_sum(sgx) / (float)C;
        #pragma unroll
        for (int k = 0; k < NP; k++) {
            int c = (k * 32 + lane) * V;
            if (c < C) {
                float xhat[V];
                #pragma unroll
                for (int j = 0; j < V; j++) xhat[j] = (cx[k].get(j) - m) * r;
                if (dxr) {
                    float vw[V], d[V];
                    if (w) load_v<V>(w + c, vw);
                    #pragma unroll
                    for (int j = 0; j < V; j++) {
                        float g = cdy[k].get(j) * (w ? vw[j] : 1.0f);
                        d[j] = cdx[k].get(j) + r * (g - mean_g - xhat[j] * mean_gx);
                    }
                    store_v<V>(dxr + c, d);
                    if (dx_act || acc_s) {
                        ln_round<T, V>(d);
                        ln_handoff<TY, V>(d, dx_act ? dx_act + row * C + c : nullptr, acc_s,
                                          (k * V) * 32 + lane);
                    }
                }
                if (partial) {
                    int a = (k * V) * 32 + lane;   // ln_acc_index<V>(c); element j at a + 32 j
                    #pragma unroll
                    for (int j = 0; j < V; j++) {
                        acc_w[a + 32 * j] += cdy[k].get(j) * xhat[j];
                        acc_b[a + 32 * j] += cdy[k].get(j);
                    }
                }
            }
        }
    }
    if (partial) ln_fold_warps<V>(acc_all, NS, L, C, partial, partial_s);
}

// Short rows (as ln_fwd_short_kernel): lpr lanes per row, 32 / lpr rows per warp at a time. A
// lane's 8 channels are the same in every row it visits, so its dw, db (and hand-off) sums stay
// in registers; at the end the warp's row groups are added in a fixed butterfly and written
// to its slice for ln_fold_warps.
template <typename T, typename TY, typename TP>
__global__ void __launch_bounds__(LN_BWD_WARPS * 32)
ln_bwd_short_kernel(const TY *__restrict__ dy, const T *__restrict__ x, const TP *__restrict__ w,
                    const float *__restrict__ mean, const float *__restrict__ rstd,
                    T *__restrict__ dx, float *__restrict__ partial, size_t N, int C,
                    TY *__restrict__ dx_act, float *__restrict__ partial_s, int lpr) {
    constexpr int V = 8, L = 32 * V;   // ln_acc_len(C <= 256, 8)
    extern __shared__ float acc_all[];  // (LN_BWD_WARPS, NS, L) when partial
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, NS = partial_s ? 3 : 2;
    int c = (lane % lpr) * V, rpw = 32 / lpr;
    float aw[V], ab[V], as[V];
    #pragma unroll
    for (int j = 0; j < V; j++) aw[j] = ab[j] = as[j] = 0.0f;
    size_t step = (size_t)gridDim.x * LN_BWD_WARPS * rpw;
    for (size_t row0 = ((size_t)blockIdx.x * LN_BWD_WARPS + warp) * rpw; row0 < N; row0 += step) {
        size_t row = row0 + lane / lpr;
        bool on = row < N && c < C;   // every lane takes part in the shuffles
        float vdy[V], vx[V], vw[V], d[V];
        #pragma unroll
        for (int j = 0; j < V; j++) vdy[j] = vx[j] = d[j] = 0.0f, vw[j] = 1.0f;
        float m = 0.0f, r = 0.0f;
        if (on) {
            load_v<V>(dy + row * C + c, vdy);
            load_v<V>(x + row * C + c, vx);
            if (w) load_v<V>(w + c, vw);
            if (dx) load_v<V>(dx + row * C + c, d);
            m = mean[row];
            r = rstd[row];
        }
        float sg = 0.0f, sgx = 0.0f, xhat[V];
        #pragma unroll
        for (int j = 0; j < V; j++) {
            xhat[j] = (vx[j] - m) * r;
            sg += vdy[j] * vw[j];
            sgx += vdy[j] * vw[j] * xhat[j];
        }
        float mean_g = ln_seg_sum(sg, lpr) / (float)C, mean_gx = ln_seg_sum(sgx, lpr) / (float)C;
        if (!on) continue;
        if (dx) {
            #pragma unroll
            for (int j = 0; j < V; j++) d[j] += r * (vdy[j] * vw[j] - mean_g - xhat[j] * mean_gx);
            store_v<V>(dx + row * C + c, d);
            if (dx_act || partial_s) {
                ln_round<T, V>(d);
                if (dx_act) store_v<V>(dx_act + row * C + c, d);
                #pragma unroll
                for (int j = 0; j < V; j++) as[j] += d[j];
            }
        }
        #pragma unroll
        for (int j = 0; j < V; j++) {
            aw[j] += vdy[j] * xhat[j];
            ab[j] += vdy[j];
        }
    }
    if (!partial) return;
    #pragma unroll
    for (int j = 0; j < V; j++)
        for (int o = lpr; o < 32; o <<= 1) {
            aw[j] += __shfl_xor_sync(0xffffffffu, aw[j], o);
            ab[j] += __shfl_xor_sync(0xffffffffu, ab[j], o);
            as[j] += __shfl_xor_sync(0xffffffffu, as[j], o);
        }
    float *acc_w = acc_all + (size_t)warp * NS * L;
    if (lane < lpr && c < C) {
        #pragma unroll
        for (int j = 0; j < V; j++) {   // ln_acc_index<8>(c + j) = c / 8 + 32 j
            acc_w[c / V + 32 * j] = aw[j];
            acc_w[L + c / V + 32 * j] = ab[j];
            if (NS == 3) acc_w[2 * L + c / V + 32 * j] = as[j];
        }
    }
    ln_fold_warps<V>(acc_all, NS, L, C, partial, partial_s);
}

template <typename T, typename TY, typename TP, int V>
__global__ void __launch_bounds__(LN_BWD_WARPS * 32)
ln_bwd_kernel(const TY *__restrict__ dy, const T *__restrict__ x, const TP *__restrict__ w,
              const float *__restrict__ mean, const float *__restrict__ rstd, T *__restrict__ dx,
              float *__restrict__ partial, size_t N, int C, TY *__restrict__ dx_act,
              float *__restrict__ partial_s) {
    extern __shared__ float acc_all[];   // (LN_BWD_WARPS, NS, L) when partial
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, L = ln_acc_len(C, V);
    int NS = partial_s ? 3 : 2;
    float *acc_w = acc_all + (size_t)warp * NS * L, *acc_b = acc_w + L;
    float *acc_s = partial_s ? acc_w + 2 * L : nullptr;
    if (partial) {
        for (int i = lane; i < NS * L; i += 32) acc_w[i] = 0.0f;
        __syncwarp();
    }
    size_t warps_total = (size_t)gridDim.x * LN_BWD_WARPS;
    for (size_t row = (size_t)blockIdx.x * LN_BWD_WARPS + warp; row < N; row += warps_total) {
        const TY *dyr = dy + row * C;
        const T *xr = x + row * C;
        float m = mean[row], r = rstd[row];
        float sg = 0.0f, sgx = 0.0f;
        for (int c = lane * V; c < C; c += 32 * V) {
            float vdy[V], vx[V], vw[V];
            load_v<V>(dyr + c, vdy);
            load_v<V>(xr + c, vx);
            if (w) load_v<V>(w + c, vw);
            #pragma unroll
            for (int j = 0; j < V; j++) {
                float g = vdy[j] * (w ? vw[j] : 1.0f);
                sg += g;
                sgx += g * ((vx[j] - m) * r);
            }
        }
        float mean_g = warp_sum(sg) / (float)C, mean_gx = warp_sum(sgx) / (float)C;
        for (int c = lane * V; c < C; c += 32 * V) {
            float vdy[V], vx[V], xhat[V];
            load_v<V>(dyr + c, vdy);
            load_v<V>(xr + c, vx);
            #pragma unroll
            for (int j = 0; j < V; j++) xhat[j] = (vx[j] - m) * r;
            if (dx) {
                float vw[V], d[V];
                if (w) load_v<V>(w + c, vw);
                load_v<V>(dx + row * C + c, d);
                #pragma unroll
                for (int j = 0; j < V; j++) {
                    float g = vdy[j] * (w ? vw[j] : 1.0f);
                    d[j] += r * (g - mean_g - xhat[j] * mean_gx);
                }
                store_v<V>(dx + row * C + c, d);
                if (dx_act || acc_s) {
                    ln_round<T, V>(d);
                    ln_handoff<TY, V>(d, dx_act ? dx_act + row * C + c : nullptr, acc_s,
                                      ln_acc_index<V>(c));
                }
            }
            if (partial) {
                int a = ln_acc_index<V>(c);   // element j at a + 32 j
                #pragma unroll
                for (int j = 0; j < V; j++) {
                    acc_w[a + 32 * j] += vdy[j] * xhat[j];
                    acc_b[a + 32 * j] += vdy[j];
                }
            }
        }
    }
    if (partial) ln_fold_warps<V>(acc_all, NS, L, C, partial, partial_s);
}

// Runs one of the kernels above on a grid that fills the GPU once (blocks per SM from the
// occupancy), then adds the block partials in order into dw, db and dx_sum (kernels/cuda/reduce.cu).
// smem: the bytes of the warps' (dw, db) slices; the hand-off's column sums add half as much.
// extra: the kernel's arguments after the common ones (the short kernel's lanes per row).
template <typename T, typename TY, typename TP, typename K, typename... Extra>
static void ln_bwd_run(Ctx *ctx, K kernel, size_t smem, const Tensor *dy, const Tensor *x,
                       const Tensor *w, const Tensor *mean, const Tensor *rstd, Tensor *dx,
                       Tensor *dw, Tensor *db, Tensor *dx_act, Tensor *dx_sum, size_t N, int C,
                       Extra... extra) {
    CudaCtx *c = cuda_ctx_of(ctx);
    bool want_sums = dw || db || dx_sum;
    smem = !want_sums ? 0 : dx_sum ? smem * 3 / 2 : smem;
    if (smem > 48 * 1024) {
        int limit = 0;
        CUDA_CHECK(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, c->device));
        CG_CHECK(smem <= (size_t)limit, "",
                 "op layernorm_bwd: %d channels need %zu bytes of shared memory, the GPU has %d",
                 C, smem, limit);
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    }
    int per_sm = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, LN_BWD_WARPS * 32, smem));
    size_t blocks = (size_t)(per_sm > 0 ? per_sm : 1) * c->sm_count;
    size_t need = ceil_div(N, LN_BWD_WARPS);
    if (blocks > need) blocks = need;
    size_t wb = blocks * 2 * C, sums = dx_sum ? blocks * C : 0;
    float *partial = want_sums ? (float *)cuda_scratch(ctx, (wb + sums) * sizeof(float)) : nullptr;
    kernel<<<(unsigned)blocks, LN_BWD_WARPS * 32, smem, c->stream>>>(
        (const TY *)dy->data, (const T *)x->data, w ? (const TP *)w->data : nullptr,
        tensor_f32(mean), tensor_f32(rstd), dx ? (T *)dx->data : nullptr, partial, N, C,
        dx_act ? (TY *)dx_act->data : nullptr, dx_sum ? partial + wb : nullptr, extra...);
    CUDA_CHECK_LAUNCH();
    if (dw || db)
        cuda_sum_partials(ctx, partial, (unsigned)blocks, 2 * (size_t)C, (size_t)C,
                          dw ? tensor_f32(dw) : nullptr, db ? tensor_f32(db) : nullptr);
    if (dx_sum)
        cuda_sum_partials(ctx, partial + wb, (unsigned)blocks, (size_t)C, (size_t)C,
                          tensor_f32(dx_sum), nullptr);
}

void cuda_layernorm_bwd(Ctx *ctx, const Tensor *dy, const Tensor *x, const Tensor *w,
                        const Tensor *mean, const Tensor *rstd, Tensor *dx, Tensor *dw,
                        Tensor *db, Tensor *dx_act, Tensor *dx_sum) {
    const char *op = "layernorm_bwd";
    if (!dx && !dw && !db) return;
    const LayerNormDims d = layernorm_bwd_dims(op, dy, x, w, mean, rstd, dx, dw, db, dx_act, dx_sum);
    const int C = d.C;
    const size_t N = d.N;
    cuda_check_tensor(op, "x", x);
    cuda_check_tensor(op, "dy", dy);
    ln_check_pair(op, "dy", dy, "x", x);
    if (w) cuda_check_tensor(op, "w", w);
    cuda_check_f32(op, "mean", mean);
    cuda_check_f32(op, "rstd", rstd);
    if (dx) {
        cuda_check_tensor(op, "dx", dx);
        cuda_check_same_dtype(op, "dx", dx, "x", x);
    }
    if (dw) cuda_check_f32(op, "dw", dw);
    if (db) cuda_check_f32(op, "db", db);
    if (dx_act) {
        cuda_check_tensor(op, "dx_act", dx_act);
        cuda_check_same_dtype(op, "dx_act", dx_act, "dy", dy);
    }
    if (dx_sum) cuda_check_f32(op, "dx_sum", dx_sum);
    if (N == 0) return;
    bool vec = C % 8 == 0 && aligned16(dy->data) && aligned16(x->data) &&
               (!w || aligned16(w->data)) && (!dx || aligned16(dx->data)) &&
               (!dx_act || aligned16(dx_act->data));
    ln_dispatch(x->dtype, dy->dtype, w ? w->dtype : x->dtype, [&](auto tx, auto ty, auto tp) {
        using T = TAG_T(tx);
        using TY = TAG_T(ty);
        using TP = TAG_T(tp);
        auto run = [&](auto kernel, size_t smem, auto... extra) {
            ln_bwd_run<T, TY, TP>(ctx, kernel, smem, dy, x, w, mean, rstd, dx, dw, db, dx_act,
                                  dx_sum, N, C, extra...);
        };
        if (vec && C <= 128)
            run(ln_bwd_short_kernel<T, TY, TP>, (size_t)LN_BWD_WARPS * 2 * 256 * sizeof(float),
                ln_lanes_per_row(C));
        else if (vec && C <= 2 * 256)
            run(ln_bwd_cached_kernel<T, TY, TP, 2>, (size_t)LN_BWD_WARPS * 2 * 2 * 256 * sizeof(float));
        else if (vec && C <= 5 * 256)
            run(ln_bwd_cached_kernel<T, TY, TP, 5>, (size_t)LN_BWD_WARPS * 2 * 5 * 256 * sizeof(float));
        else if (vec)
            run(ln_bwd_kernel<T, TY, TP, 8>, (size_t)LN_BWD_WARPS * 2 * ln_acc_len(C, 8) * sizeof(float));
        else
            run(ln_bwd_kernel<T, TY, TP, 1>, (size_t)LN_BWD_WARPS * 2 * ln_acc_len(C, 1) * sizeof(float));
    });
}
