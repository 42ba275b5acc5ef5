// CUDA: depthwise convolution, channels-last, stride 1, zero padding k/2 (kernels/ops.h; CPU
// reference kernels/cpu/dwconv.c). No shared-memory tiles: a thread owns V channels (one vector
// load) of a strip of 4 output columns (7 at 5x5/7x7) and sweeps down a run of rows, reading each
// input row once (strip + k - 1 pixels straight from global memory; the strips beside it share
// them in L1) and scattering it into the k output rows it feeds, kept as a ring of sums in
// registers; an output row is written the moment its last input row is in. The next row's loads
// are issued before the current row's arithmetic. y and dx share one kernel (dx is dy correlated
// with the mirrored taps), which hands bf16 7x7 on grids of at least 28 x 28 to the tensor-core
// pass (dwconv_mma.cu). dw and db (bf16 7x7: on tensor cores too, except on images of at most 8
// columns, dwconv_plane.cu's) come from a second kernel of the same shape whose ring holds dy
// rows and whose k^2 + 1 sums per channel stay in registers over a run of images, then a
// fixed-order reduction over strips (shared memory) and runs (kernels/cuda/reduce.cu); at k <= 3
// one kernel makes dx, dw and db in a single pass over dy and x. Deterministic.
#include "cuda_elem.cuh"
#include "dwconv_mma.h"
#include "dwconv_plane.h"
#include "narrow_dot.cuh"
#include "../dwconv_shape.h"

typedef DwconvShape DwDims;   // kernels/dwconv_shape.h: the geometry and checks both backends share

static DwDims dw_dims(const char *op, const Tensor *x, const Tensor *w) {
    cuda_check_tensor(op, "x", x);
    cuda_check_tensor(op, "w", w);
    return dwconv_shape(op, x, w);
}

// ---- launch geometry --------------------------------------------------------------------------
// A block is `lanes` channel vectors (consecutive channels: a warp's loads are one contiguous run
// of a pixel's channels) times `sblk` neighbouring strips (their windows overlap by k - 1 pixels,
// which L1 then serves once). Rows are cut into `chunks` runs of `rh` rows when the images alone
// give too few threads to fill the GPU (each run re-reads k - 1 halo rows).
enum { DW_THREADS = 128 };

// Strip width: 7 columns for the y/dx kernel at 5x5 and 7x7 (each tap read from shared memory
// then serves 7 sums; 7 divides every gspn grid), except on images narrower than 14, where 7 would
// leave too few threads; 4 elsewhere (the dw kernel: 4 at every k).
enum { DW_STRIP_DW = 4 };   // the dw kernel's strip width
static int dw_strip(const DwDims &d, bool dw) { return dw ? DW_STRIP_DW : d.k >= 5 && d.W >= 14 ? 7 : 4; }

typedef struct DwGrid {
    int V, cv;               // channels per thread; channel vectors C / V
    int cw;                  // strip width (dw_strip): the kernel's CW
    int lanes, sblk;         // channel vectors and strips per block
    int strips, groups, sgroups;
    int rh, chunks;          // output rows per thread, row runs per image
} DwGrid;

static DwGrid dw_grid(const DwDims &d, int V, int cw) {
    DwGrid g;
    g.V = V;
    g.cv = d.C / V;
    g.cw = cw;
    g.strips = (d.W + cw - 1) / cw;
    // 32 lanes, or 16 where that divides the channel vectors and 32 does not (no idle lanes in
    // the last group), or all of them when fewer.
    g.lanes = g.cv % 32 != 0 && g.cv % 16 == 0 ? 16 : 32;
    if (g.cv < g.lanes) g.lanes = g.cv;
    g.sblk = DW_THREADS / g.lanes < g.strips ? DW_THREADS / g.lanes : g.strips;
    if (g.sblk < 1) g.sblk = 1;
    if (g.lanes * g.sblk < DW_THREADS && g.cv > g.lanes)   // narrow images: more channels a block
        g.lanes = DW_THREADS / g.sblk < g.cv ? DW_THREADS / g.sblk : g.cv;
    g.groups = (g.cv + g.lanes - 1) / g.lanes;
    g.sgroups = (g.strips + g.sblk - 1) / g.sblk;
    g.rh = d.H;
    g.chunks = 1;
    return g;
}

// Cuts rows into runs until the grid has `want` threads (or runs reach 2k rows).
static void dw_split_rows(DwGrid &g, const DwDims &d, size_t want) {
    size_t per_run = (size_t)d.B * g.groups * g.sgroups * g.lanes * g.sblk;
    while (per_run * g.chunks < want && g.rh >= 4 * d.k) {
        g.chunks *= 2;
        g.rh = (d.H + g.chunks - 1) / g.chunks;
    }
    g.chunks = (d.H + g.rh - 1) / g.rh;
}

// Resident threads the launches aim for: four waves of 16 warps per SM (the 7x7 kernels' register
// budget allows 16).
static size_t dw_want_threads(Ctx *ctx) { return (size_t)cuda_ctx_of(ctx)->sm_count * 2048; }

// Channels per thread: 2 (one 8- or 4-byte load) for k <= 3, where the k^2 weights and k rows of
// sums of two channels fit in registers, when C is even and both tensors are aligned to it; else 1.
static int dw_vec(const DwDims &d, size_t elem, const void *a, const void *b) {
    uintptr_t align = (uintptr_t)(2 * elem) - 1;
    return d.k <= 3 && d.C % 2 == 0 && ((uintptr_t)a & align) == 0 && ((uintptr_t)b & align) == 0 ? 2 : 1;
}

// Blocks per SM the registers are kept to: a 7x7 thread holds 49 weights (or sums), 7 rows of
// strip sums (or dy) and two input windows (ptxas: no spills at these counts but a few bytes at 7x7).
template <int K, bool DW> constexpr int dw_min_blocks() { return K <= 1 ? 8 : K <= 3 && !DW ? 6 : 4; }

// A register array (sums, a ring of rows) set to zero; unrolled, so it stays in registers.
template <int A, int B, int V> __device__ __forceinline__ void dw_zero(float (&a)[A][B][V]) {
    #pragma unroll
    for (int i = 0; i < A; i++)
        #pragma unroll
        for (int j = 0; j < B; j++)
            #pragma unroll
            for (int v = 0; v < V; v++) a[i][j][v] = 0.0f;
}

// The thread's place: channel vector and strip (either may lie past the end: `live` false).
struct DwPlace {
    int cvi, strip;
    bool live;
};

__device__ __forceinline__ DwPlace dw_place(const DwGrid &g) {
    DwPlace p;
    const int lane = threadIdx.x % g.lanes, sl = threadIdx.x / g.lanes;
    const int group = blockIdx.x % g.groups, sgrp = blockIdx.x / g.groups;
    p.cvi = group * g.lanes + lane;
    p.strip = sgrp * g.sblk + sl;
    p.live = p.cvi < g.cv && p.strip < g.strips && sl < g.sblk;
    return p;
}

__device__ constexpr float kZeros[8] = {0, 0, 0, 0, 0, 0, 0, 0};

// A thread's columns, fixed for its whole sweep: window pixel q (0 <= q < CW + K - 1) is column
// x0 - P + q, at element offset off0 + q C within a row, and lies in the image where bit q of
// `mask` is set (offsets within one image fit an int: launch checks it).
struct DwCols {
    int off0, row, mask;   // row: elements per image row (W C)
};

template <int K, int CW>
__device__ __forceinline__ DwCols dw_cols(const DwDims &d, int x0, int c) {
    DwCols k;
    k.off0 = (x0 - K / 2) * d.C + c;
    k.row = d.W * d.C;
    k.mask = 0;
    #pragma unroll
    for (int q = 0; q < CW + K - 1; q++) {
        const int xx = x0 - K / 2 + q;
        if (xx >= 0 && xx < d.W) k.mask |= 1 << q;
    }
    return k;
}

// One input row's window: the thread's CW + K - 1 pixels of row r, V channels each, as raw vectors
// (zero outside the image), loaded a row ahead of its use.
template <int K, int CW, int V, typename T> struct DwWindow {
    static constexpr int N = CW + K - 1;
    Vec<T, V> px[N];
    __device__ __forceinline__ void load(const T *img, const DwCols &k, const DwDims &d, int r) {
        const bool row_in = r >= 0 && r < d.H;
        const int base = r * k.row + k.off0;
        #pragma unroll
        for (int q = 0; q < N; q++)
            px[q] = row_in && (k.mask >> q & 1) ? Vec<T, V>::load(img + (base + q * d.C)) : Vec<T, V>::of(kZeros);
    }
    __device__ __forceinline__ void unpack(float (*win)[V]) const {
        #pragma unroll
        for (int q = 0; q < N; q++)
            #pragma unroll
            for (int v = 0; v < V; v++) win[q][v] = px[q].get(v);
    }
};

// dwconv_fwd's added input over a thread's window (KU = DW_ADDED_K; KU = 0: nothing): u's CW + K - 1
// pixels of a row, loaded a row ahead, and the thread's V rows of uw and ub; apply() adds
// u uw^T + ub to the unpacked window's pixels that lie in the image.
template <int K, int CW, int V, int KU, typename TW> struct DwAddedWindow {
    static constexpr int N = CW + K - 1, KV = KU > 0 ? KU : 1;
    Vec<TW, KV> px[KU > 0 ? N : 1];
    float aw[V][KV], ab[V];
    const TW *u;        // image b's u
    float *mid;         // image b's mid
    int uoff0, urow;    // window pixel q of row r: u + r urow + uoff0 + q KU
    __device__ __forceinline__ DwAddedWindow(const DwAdded<TW> &add, const DwDims &d, int b, int x0, int c) {
        if constexpr (KU > 0) {
            u = add.u + (size_t)b * d.H * d.W * KU;
            mid = add.mid ? add.mid + (size_t)b * d.H * d.W * d.C : nullptr;
            uoff0 = (x0 - K / 2) * KU;
            urow = d.W * KU;
            #pragma unroll
            for (int v = 0; v < V; v++) {
                #pragma unroll
                for (int k = 0; k < KU; k++) aw[v][k] = load_or(add.w, (size_t)(c + v) * KU + k, 0.0f);
                ab[v] = load_or(add.b, (size_t)(c + v), 0.0f);
            }
        }
    }
    __device__ __forceinline__ void load(const DwCols &k, const DwDims &d, int r) {
        if constexpr (KU > 0) {
            const bool row_in = r >= 0 && r < d.H;
            #pragma unroll
            for (int q = 0; q < N; q++)
                px[q] = row_in && (k.mask >> q & 1) ? Vec<TW, KU>::load(u + (r * urow + uoff0 + q * KU))
                                                    : Vec<TW, KU>::of(kZeros);
        }
    }
    __device__ __forceinline__ void apply(float (*win)[V], const DwCols &k, const DwDims &d, int r) const {
        if constexpr (KU > 0) {
            if (r < 0 || r >= d.H) return;
            #pragma unroll
            for (int q = 0; q < N; q++) {
                if (!(k.mask >> q & 1)) continue;   // zero padding stays zero
                float uv[KU];
                #pragma unroll
                for (int j = 0; j < KU; j++) uv[j] = px[q].get(j);
                #pragma unroll
                for (int v = 0; v < V; v++) win[q][v] = win[q][v] + narrow_dot<KU>(uv, aw[v], ab[v]);
            }
        }
    }
    // x' at the window's own CW columns of row r, into mid.
    __device__ __forceinline__ void store_mid(float (*win)[V], const DwCols &k, const DwDims &d, int r) const {
        if constexpr (KU > 0) {
            #pragma unroll
            for (int q = 0; q < CW; q++)
                if (k.mask >> (q + K / 2) & 1)
                    store_v<V>(mid + (r * k.row + k.off0 + (q + K / 2) * d.C), win[q + K / 2]);
        }
    }
};

// ---- y and dx -----------------------------------------------------------------------------------
// out[b,h,w,c] (+)= bias[c] + sum_{i,j} w'[i][j] in[b, h+i-p, w+j-p, c] (+ in[b,h,w,c]); w' = w,
// or w mirrored in both axes for dx (dy correlated with the mirrored taps is the adjoint).
// DW_RESID: in's own value added (the residual's identity path); DW_ACCUM: added to out's prior
// value; either way rounded once; DW_SILU: silu of the rounded sum (the flags:
// kernels/cuda/dwconv_mma.h).

// Input row r = y0 - P + t feeds output row y0 + t - i through tap row i; that row's sums sit in
// ring slot (t - i) mod K. Output row y0 + t - (K - 1) has all its rows after step t: it is
// written and its slot cleared for row y0 + t + 1. The step loop unrolls K times, so every slot
// index is a constant.
// KU = DW_ADDED_K: dwconv_fwd's added input (fp32 in), applied to each window as it is unpacked
// (u's pixels loaded with the window, a row ahead); the thread's own run of rows also goes to
// add.mid. KU = 0: none.
template <int K, int CW, int V, int KU, typename T, typename TW>
__global__ void __launch_bounds__(DW_THREADS, dw_min_blocks<K, false>())
dwconv_rows_kernel(const T *__restrict__ in, const TW *__restrict__ w, const TW *__restrict__ bias,
                   T *__restrict__ out, DwDims d, DwGrid g, int flags, DwAdded<TW> add) {
    constexpr int P = K / 2, KK = K * K;
    extern __shared__ float ws[];   // (V, lanes, K^2): the block's taps as read (mirrored for dx)
    const DwPlace pl = dw_place(g);
    const int lane = threadIdx.x % g.lanes, cv0 = blockIdx.x % g.groups * g.lanes;
    for (int e = threadIdx.x; e < V * g.lanes * KK; e += blockDim.x) {
        const int v = e / (g.lanes * KK), ln = e / KK % g.lanes, tap = e % KK;
        const int ch = (cv0 + ln) * V + v;
        ws[e] = ch < d.C ? load_or(w, (size_t)ch * KK + (flags & DW_FLIP ? KK - 1 - tap : tap), 0.0f) : 0.0f;
    }
    __syncthreads();
    if (!pl.live) return;
    const int c = pl.cvi * V, x0 = pl.strip * CW, y0 = blockIdx.y * g.rh, b = blockIdx.z;
    const int rows = min(g.rh, d.H - y0), steps = rows + K - 1;
    // Read anew at every use (volatile): held in registers, 49 taps would crowd out the sums.
    const volatile float *wt[V];
    float bv[V];
    #pragma unroll
    for (int v = 0; v < V; v++) wt[v] = ws + (v * g.lanes + lane) * KK;
    #pragma unroll
    for (int v = 0; v < V; v++) bv[v] = bias ? load_or(bias, (size_t)(c + v), 0.0f) : 0.0f;
    const T *img = in + (size_t)b * d.H * d.W * d.C;
    T *o = out + (size_t)b * d.H * d.W * d.C;
    const DwCols cols = dw_cols<K, CW>(d, x0, c);
    float acc[K][CW][V];
    dw_zero(acc);
    DwWindow<K, CW, V, T> next;
    next.load(img, cols, d, y0 - P);
    DwAddedWindow<K, CW, V, KU, TW> added(add, d, b, x0, c);
    added.load(cols, d, y0 - P);
    for (int t0 = 0; t0 < steps; t0 += K) {
        #pragma unroll
        for (int u = 0; u < K; u++) {
            const int t = t0 + u, r = y0 - P + t;
            if (t >= steps) break;
            float win[DwWindow<K, CW, V, T>::N][V];
            next.unpack(win);
            added.apply(win, cols, d, r);
            if (t + 1 < steps) {
                next.load(img, cols, d, r + 1);
                added.load(cols, d, r + 1);
            }
            if (KU > 0 && add.mid && r >= y0 && r < y0 + rows)   // x' of the thread's own rows
                added.store_mid(win, cols, d, r);
            if (r >= 0 && r < d.H) {   // rows outside the image add nothing
                #pragma unroll
                for (int i = 0; i < K; i++) {
                    const int s = (u - i + K) % K;
                    #pragma unroll
                    for (int j = 0; j < K; j++)
                        #pragma unroll
                        for (int v = 0; v < V; v++) {
                            const float tap = wt[v][i * K + j];
                            #pragma unroll
                            for (int q = 0; q < CW; q++)
                                acc[s][q][v] = fmaf(tap, win[q + j][v], acc[s][q][v]);
                        }
                }
                if (flags & DW_RESID) {
                    const int s = (u - P + K) % K;
                    #pragma unroll
                    for (int q = 0; q < CW; q++)
                        #pragma unroll
                        for (int v = 0; v < V; v++) acc[s][q][v] += win[q + P][v];
                }
            }
            const int s = (u + 1) % K, y = y0 + t - (K - 1);
            if (y >= y0) {
                #pragma unroll
                for (int q = 0; q < CW; q++) {
                    if (!(cols.mask >> (q + P) & 1)) continue;
                    T *p = o + (y * cols.row + cols.off0 + (q + P) * d.C);
                    float val[V];
                    if (flags & DW_ACCUM) load_v<V>(p, val);
                    #pragma unroll
                    for (int v = 0; v < V; v++) {
                        val[v] = acc[s][q][v] + bv[v] + (flags & DW_ACCUM ? val[v] : 0.0f);
                        if (flags & DW_SILU) val[v] = dw_silu<T>(val[v]);
                    }
                    store_v<V>(p, val);
                }
            }
            #pragma unroll
            for (int q = 0; q < CW; q++)
                #pragma unroll
                for (int v = 0; v < V; v++) acc[s][q][v] = 0.0f;
        }
    }
}

// dy's row y at the thread's CW columns (window pixels P .. P + CW - 1); zero where `in_run` is
// false or past the image.
template <int K, int CW, int V, typename T>
__device__ __forceinline__ void dw_load_dy_row(Vec<T, V> *g, const T *img, const DwCols &k,
                                               const DwDims &d, int y, bool in_run) {
    const int base = y * k.row + k.off0;
    #pragma unroll
    for (int q = 0; q < CW; q++)
        g[q] = in_run && (k.mask >> (q + K / 2) & 1) ? Vec<T, V>::load(img + (base + (q + K / 2) * d.C))
                                                     : Vec<T, V>::of(kZeros);
}

// The end of a dw kernel: the thread's k^2 + 1 sums (acc, accb) of every block strip, added in
// strip order in shared memory `red` (sblk, K^2 + 1, lanes V), then the block's row of the partial
// matrix (runs * chunks * strip groups, C k^2 + C): columns c k^2 + tap for dw, C k^2 + c for db.
template <int K, int V>
__device__ __forceinline__ void dw_write_partials(const float (&acc)[K][K][V], const float (&accb)[V],
                                                  const DwDims &d, const DwGrid &g, float *red,
                                                  float *partial) {
    constexpr int KK = K * K;
    const int lane = threadIdx.x % g.lanes, sl = threadIdx.x / g.lanes, width_blk = g.lanes * V;
    if (sl < g.sblk) {
        #pragma unroll
        for (int q = 0; q < KK; q++)
            #pragma unroll
            for (int v = 0; v < V; v++)
                red[(sl * (KK + 1) + q) * width_blk + lane * V + v] = acc[q / K][q % K][v];
        #pragma unroll
        for (int v = 0; v < V; v++) red[(sl * (KK + 1) + KK) * width_blk + lane * V + v] = accb[v];
    }
    __syncthreads();
    const int group = blockIdx.x % g.groups, sgrp = blockIdx.x / g.groups, c0 = group * g.lanes * V;
    const size_t width = (size_t)d.C * KK + d.C;
    float *row = partial + (((size_t)blockIdx.z * g.chunks + blockIdx.y) * g.sgroups + sgrp) * width;
    const int nsl = min(g.sblk, g.strips - sgrp * g.sblk);
    for (int e = threadIdx.x; e < (KK + 1) * width_blk; e += blockDim.x) {
        const int tap = e / width_blk, cq = e - tap * width_blk, ch = c0 + cq;
        if (ch >= d.C) continue;
        float s = 0.0f;
        for (int p = 0; p < nsl; p++) s += red[(p * (KK + 1) + tap) * width_blk + cq];
        row[tap < KK ? (size_t)ch * KK + tap : (size_t)d.C * KK + ch] = s;
    }
}

// ---- dw and db ----------------------------------------------------------------------------------
// The same sweep with the roles turned: at step t the thread brings in x's input row r = y0 - P + t
// (a window) and dy's row y0 + t (into ring slot t mod K; zero past the run), and adds
// dy[y0 + t - i][col] x[r][col + j] into sum (i, j) for every tap. Over its run of images, then
// dw_write_partials.
template <int K, int V, typename T>
__global__ void __launch_bounds__(DW_THREADS, dw_min_blocks<K, true>())
dwconv_dw_rows_kernel(const T *__restrict__ dy, const T *__restrict__ x, DwDims d, DwGrid g,
                      int imgs_per_run, float *__restrict__ partial) {
    constexpr int P = K / 2, CW = DW_STRIP_DW;
    // The next step's rows are loaded during this one, except at 7x7: there the 49 sums and the
    // ring leave no registers for a second window, and the other warps hide the loads.
    constexpr bool PREFETCH = K < 7;
    extern __shared__ float red[];   // (sblk, KK + 1, lanes * V)
    const DwPlace pl = dw_place(g);
    const int c = pl.cvi * V, x0 = pl.strip * CW, y0 = blockIdx.y * g.rh;
    const int rows = min(g.rh, d.H - y0), steps = rows + K - 1;
    float acc[K][K][V], accb[V];
    dw_zero(acc);
    #pragma unroll
    for (int v = 0; v < V; v++) accb[v] = 0.0f;
    const int b0 = blockIdx.z * imgs_per_run, b1 = min(b0 + imgs_per_run, d.B);
    const DwCols cols = dw_cols<K, CW>(d, x0, c);
    const size_t plane = (size_t)d.H * d.W * d.C;
    for (int b = pl.live ? b0 : b1; b < b1; b++) {
        const T *xi = x + b * plane, *gi = dy + b * plane;
        float ring[K][CW][V];
        dw_zero(ring);
        DwWindow<K, CW, V, T> next;
        Vec<T, V> gnext[CW];   // dy's row y0 + t (zero past the run)
        if (PREFETCH) {
            next.load(xi, cols, d, y0 - P);
            dw_load_dy_row<K, CW, V>(gnext, gi, cols, d, y0, rows > 0);
        }
        for (int t0 = 0; t0 < steps; t0 += K) {
            #pragma unroll
            for (int u = 0; u < K; u++) {
                const int t = t0 + u, r = y0 - P + t;
                if (t >= steps) break;
                if (!PREFETCH) {
                    next.load(xi, cols, d, r);
                    dw_load_dy_row<K, CW, V>(gnext, gi, cols, d, y0 + t, t < rows);
                }
                float win[DwWindow<K, CW, V, T>::N][V];
                next.unpack(win);
                // dy's row y0 + t into slot u (the row y0 + t - K it replaces is done).
                #pragma unroll
                for (int q = 0; q < CW; q++)
                    #pragma unroll
                    for (int v = 0; v < V; v++) {
                        ring[u][q][v] = gnext[q].get(v);
                        accb[v] += ring[u][q][v];
                    }
                if (PREFETCH && t + 1 < steps) {
                    next.load(xi, cols, d, r + 1);
                    dw_load_dy_row<K, CW, V>(gnext, gi, cols, d, y0 + t + 1, t + 1 < rows);
                }
                if (r >= 0 && r < d.H) {
                    #pragma unroll
                    for (int i = 0; i < K; i++) {
                        const int s = (u - i + K) % K;
                        #pragma unroll
                        for (int j = 0; j < K; j++)
                            #pragma unroll
                            for (int q = 0; q < CW; q++)
                                #pragma unroll
                                for (int v = 0; v < V; v++)
                                    acc[i][j][v] = fmaf(ring[s][q][v], win[q + j][v], acc[i][j][v]);
                    }
                }
            }
        }
    }
    dw_write_partials<K, V>(acc, accb, d, g, red, partial);
}

// ---- dx, dw and db in one pass (k <= 3) ------------------------------------------------------
// One sweep over dy and x instead of two over dy: the thread keeps rings of k windows of each.
// At step t it brings in dy's row y0 - P + t and x's row y0 + t (x's rows y0 - P .. y0 - 1 come
// in before step 0), both as windows of CW + k - 1 pixels. Then
//   dw: dy's row y = y0 - P + t, if it is in the run, against x's rows y - P .. y + P;
//   dx: row y0 - 2P + t, whose last dy row just came in, from dy's k rows (the mirrored taps).
// V = 1: the two rings, the sums and the weights fill the registers (ptxas) at 3x3.
template <int K, typename T, typename TW>
__global__ void __launch_bounds__(DW_THREADS, 4)
dwconv_bwd_fused_kernel(const T *__restrict__ dy, const T *__restrict__ x, const TW *__restrict__ w,
                        T *__restrict__ dx, DwDims d, DwGrid g, int flags, int imgs_per_run,
                        float *__restrict__ partial) {
    constexpr int P = K / 2, CW = DW_STRIP_DW, V = 1, N = CW + K - 1;
    extern __shared__ float red[];   // (sblk, K^2 + 1, lanes)
    const DwPlace pl = dw_place(g);
    const int c = pl.cvi, x0 = pl.strip * CW, y0 = blockIdx.y * g.rh;
    const int rows = min(g.rh, d.H - y0), steps = rows + 2 * P;
    float wr[K][K], acc[K][K][V], accb[V] = {0.0f};
    #pragma unroll
    for (int i = 0; i < K; i++)
        #pragma unroll
        for (int j = 0; j < K; j++) {
            wr[i][j] = pl.live ? load_or(w, (size_t)c * K * K + i * K + j, 0.0f) : 0.0f;
            acc[i][j][0] = 0.0f;
        }
    const int b0 = blockIdx.z * imgs_per_run, b1 = min(b0 + imgs_per_run, d.B);
    const DwCols cols = dw_cols<K, CW>(d, x0, c);
    const size_t plane = (size_t)d.H * d.W * d.C;
    for (int b = pl.live ? b0 : b1; b < b1; b++) {
        const T *xi = x + b * plane, *gi = dy + b * plane;
        T *o = dx + b * plane;
        float gr[K][N], xr[K][N];   // dy's rows in slot t mod K, x's rows y0 + t in slot t mod K
        DwWindow<K, CW, V, T> gnext, xnext;
        #pragma unroll
        for (int s = 0; s < K; s++) {   // x's rows y0 - P .. y0 - 1 in slots K - P .. K - 1
            if (s < K - P) continue;
            xnext.load(xi, cols, d, y0 + s - K);
            #pragma unroll
            for (int q = 0; q < N; q++) xr[s][q] = xnext.px[q].get(0);
        }
        gnext.load(gi, cols, d, y0 - P);
        xnext.load(xi, cols, d, y0);
        for (int t0 = 0; t0 < steps; t0 += K) {
            #pragma unroll
            for (int u = 0; u < K; u++) {
                const int t = t0 + u;
                if (t >= steps) break;
                #pragma unroll
                for (int q = 0; q < N; q++) {
                    gr[u][q] = gnext.px[q].get(0);
                    xr[u][q] = xnext.px[q].get(0);
                }
                if (t + 1 < steps) {
                    gnext.load(gi, cols, d, y0 - P + t + 1);
                    xnext.load(xi, cols, d, y0 + t + 1);
                }
                if (t >= P && t < rows + P) {   // dy's row y0 - P + t is in the run
                    #pragma unroll
                    for (int q = 0; q < CW; q++) accb[0] += gr[u][q + P];
                    #pragma unroll
                    for (int i = 0; i < K; i++) {
                        const int s = (u - 2 * P + i + 2 * K) % K;   // x's row y + i - P
                        #pragma unroll
                        for (int j = 0; j < K; j++)
                            #pragma unroll
                            for (int q = 0; q < CW; q++)
                                acc[i][j][0] = fmaf(gr[u][q + P], xr[s][q + j], acc[i][j][0]);
                    }
                }
                if (t >= 2 * P) {   // dx's row y0 - 2P + t
                    const int yd = y0 - 2 * P + t;
                    #pragma unroll
                    for (int q = 0; q < CW; q++) {
                        if (!(cols.mask >> (q + P) & 1)) continue;
                        float sum = 0.0f;
                        #pragma unroll
                        for (int i = 0; i < K; i++) {
                            const int s = (u - i + K) % K;   // dy's row yd - i + P
                            #pragma unroll
                            for (int j = 0; j < K; j++) sum = fmaf(wr[i][j], gr[s][q - j + 2 * P], sum);
                        }
                        if (flags & DW_RESID) sum += gr[(u - P + K) % K][q + P];
                        T *p = o + (yd * cols.row + cols.off0 + (q + P) * d.C);
                        if (flags & DW_ACCUM) sum += load_or(p, 0, 0.0f);
                        store_v<1>(p, &sum);
                    }
                }
            }
        }
    }
    dw_write_partials<K, V>(acc, accb, d, g, red, partial);
}

// ---- launches ---------------------------------------------------------------------------------

// f(K, V) as template arguments (the sums and the weights live in registers); V = 2 only for
// k <= 3 (dw_vec).
template <typename F> static void dispatch_k_v(int k, int v, F &&f) {
    using I1 = std::integral_constant<int, 1>;
    using I2 = std::integral_constant<int, 2>;
    switch (k) {
    case 1: if (v == 2) f(I1{}, I2{}); else f(I1{}, I1{}); break;
    case 3: if (v == 2) f(std::integral_constant<int, 3>{}, I2{}); else f(std::integral_constant<int, 3>{}, I1{}); break;
    case 5: f(std::integral_constant<int, 5>{}, I1{}); break;
    default: f(std::integral_constant<int, 7>{}, I1{}); break;   // odd k <= DWCONV_MAX_K = 7
    }
}

// Allows a kernel more than the 48 KiB default of dynamic shared memory when it asks for it.
template <typename Kern> static void dw_allow_smem(Kern kernel, size_t bytes) {
    if (bytes > 48 * 1024)
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}

static void dw_check_grid(const DwGrid &g, const DwDims &d, unsigned z) {
    CG_CHECK((size_t)d.H * d.W * d.C < 0x7fffffffu, "", "dwconv: one image of %dx%dx%d has more "
             "than 2^31 elements", d.H, d.W, d.C);
    CG_CHECK((size_t)g.groups * g.sgroups <= 0x7fffffffu && g.chunks <= 65535 && z <= 65535, "",
             "dwconv: image %dx%dx%d x %d images exceed the grid", d.H, d.W, d.C, d.B);
}

// add.u set: fp32 in and out only, k <= 3 (launch_rows_added).
template <typename T, typename TW>
static void launch_rows(Ctx *ctx, const T *in, const TW *w, const TW *bias, T *out, DwDims d,
                        int flags, const DwAdded<TW> &add = DwAdded<TW>{}) {
    if (cuda_dwconv_plane(ctx, in, w, bias, out, d, flags, add)) return;   // small images
    if constexpr (std::is_same<T, bf16>::value && std::is_same<TW, bf16>::value)
        if (cuda_dwconv_mma(ctx, in, w, bias, out, d, flags)) return;   // 7x7 on tensor cores
    DwGrid g = dw_grid(d, dw_vec(d, sizeof(T), in, out), dw_strip(d, false));
    dw_split_rows(g, d, dw_want_threads(ctx));
    dw_check_grid(g, d, (unsigned)d.B);
    dim3 grid((unsigned)(g.groups * g.sgroups), (unsigned)g.chunks, (unsigned)d.B);
    dispatch_k_v(d.k, g.V, [&](auto kc, auto vc) {
        constexpr int K = decltype(kc)::value, V = decltype(vc)::value;
        auto go = [&](auto cwc, auto kuc) {
            auto kernel = dwconv_rows_kernel<K, decltype(cwc)::value, V, decltype(kuc)::value, T, TW>;
            const size_t smem = (size_t)V * g.lanes * K * K * sizeof(float);
            dw_allow_smem(kernel, smem);
            kernel<<<grid, g.lanes * g.sblk, smem, cuda_stream_of(ctx)>>>(in, w, bias, out, d, g, flags, add);
        };
        using None = std::integral_constant<int, 0>;
        if constexpr (K >= 5) {
            if (g.cw == 7) go(std::integral_constant<int, 7>{}, None{});
            else go(std::integral_constant<int, 4>{}, None{});
        } else if constexpr (std::is_same<T, float>::value) {
            if (add.u) go(std::integral_constant<int, 4>{}, std::integral_constant<int, DW_ADDED_K>{});
            else go(std::integral_constant<int, 4>{}, None{});
        } else {
            go(std::integral_constant<int, 4>{}, None{});
        }
    });
    CUDA_CHECK_LAUNCH();
}

// dwconv_fwd with its added input: one pass where the kernels take it (fp32 x, k <= 3, u of
// DW_ADDED_K channels aligned to its pixels, and the shapes where linear_fwd onto res runs the
// narrow kernel whose bits the pass reproduces: C a multiple of 4, x and mid 16-byte aligned),
// else linear_fwd onto res = x into mid (or a buffer of its own) and the convolution of that.
static void launch_rows_added(Ctx *ctx, const Tensor *x, const Tensor *u, const Tensor *uw,
                              const Tensor *ub, const Tensor *w, const Tensor *b, int flags,
                              Tensor *mid, Tensor *y, const DwDims &d, int ku) {
    const size_t ualign = (size_t)ku * dtype_size(u->dtype) - 1;
    if (x->dtype == DTYPE_F32 && d.k <= 3 && ku == DW_ADDED_K && ((uintptr_t)u->data & ualign) == 0 &&
        d.C % 4 == 0 && aligned16(x->data) && (!mid || aligned16(mid->data))) {
        dispatch_dtype(w->dtype, [&](auto tw) {
            using TW = TAG_T(tw);
            const DwAdded<TW> add = {(const TW *)u->data, (const TW *)uw->data,
                                     ub ? (const TW *)ub->data : nullptr, mid ? (float *)mid->data : nullptr};
            launch_rows(ctx, (const float *)x->data, (const TW *)w->data, b ? (const TW *)b->data : nullptr,
                        (float *)y->data, d, flags, add);
        });
        return;
    }
    Tensor added = *x;
    if (mid) added.data = mid->data;
    else added.data = cuda_temp_alloc(ctx, tensor_bytes(x));
    LinearFwdOpts onto_x = {};
    onto_x.res = x;
    cuda_linear_fwd(ctx, u, uw, ub, &onto_x, &added);
    dispatch_dtype2(x->dtype, w->dtype, [&](auto tx, auto tw) {
        using T = TAG_T(tx);
        using TW = TAG_T(tw);
        launch_rows(ctx, (const T *)added.data, (const TW *)w->data, b ? (const TW *)b->data : nullptr,
                    (T *)y->data, d, flags);
    });
    if (!mid) cuda_temp_free(ctx, added.data);
}

void cuda_dwconv_fwd(Ctx *ctx, const Tensor *x, const Tensor *u, const Tensor *uw, const Tensor *ub,
                     const Tensor *w, const Tensor *b, int flags, Tensor *mid, Tensor *y) {
    const char *op = "dwconv_fwd";
    DwDims d = dw_dims(op, x, w);
    dwconv_check_flags(op, flags, true);
    cuda_check_numel(op, "y", y, x->numel);
    cuda_check_same_dtype(op, "y", y, "x", x);
    CG_CHECK(y->data != x->data, "", "op dwconv_fwd: y is x (the taps read neighbours of what they write)");
    if (b) {
        cuda_check_numel(op, "b", b, (size_t)d.C);
        cuda_check_same_dtype(op, "b", b, "w", w);
    }
    int ku = 0;
    if (u) {
        cuda_check_tensor(op, "u", u);
        cuda_check_tensor(op, "uw", uw);
        if (ub) cuda_check_tensor(op, "ub", ub);
        if (mid) cuda_check_tensor(op, "mid", mid);
        ku = dwconv_added_input(op, &d, x, u, uw, ub, w, mid, y);
    }
    if (x->numel == 0) return;
    const int kflags = (flags & DWCONV_RESIDUAL ? DW_RESID : 0) | (flags & DWCONV_SILU ? DW_SILU : 0);
    if (u) {
        launch_rows_added(ctx, x, u, uw, ub, w, b, kflags, mid, y, d, ku);
        return;
    }
    dispatch_dtype2(x->dtype, w->dtype, [&](auto tx, auto tw) {
        using T = TAG_T(tx);
        using TW = TAG_T(tw);
        launch_rows(ctx, (const T *)x->data, (const TW *)w->data, b ? (const TW *)b->data : nullptr,
                    (T *)y->data, d, kflags);
    });
}

// y (pixels, m) = the sums over channel groups of part (groups, pixels, m), in group order, + pb,
// rounded once to bf16.
__global__ void dw_proj_sum_kernel(const float *__restrict__ part, int groups, size_t n, int m,
                                   const bf16 *__restrict__ pb, bf16 *__restrict__ y) {
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        float s = 0.0f;
        for (int g = 0; g < groups; g++) s += part[(size_t)g * n + e];
        if (pb) s += __bfloat162float(pb[e % m]);
        y[e] = __float2bfloat16_rn(s);
    }
}

// Inference's mixer: the projection from the 7x7 pass's staged results (dwconv_mma.cu's tiled
// pass: bf16, or its fp32 sums at 8 channels and more than 32 columns; dwconv_plane_mma.cu's on
// images of 9 to 16 columns; dwconv_image7.cu's on 7 x 7 images), so silu(conv(x)), 1.5 C_s
// channels a pixel, is never written and read back; elsewhere (and for more than DW_PROJ_M
// outputs) the two ops.
void cuda_dwconv_silu_proj_fwd(Ctx *ctx, const Tensor *x, const Tensor *w, const Tensor *b,
                               const Tensor *pw, const Tensor *pb, Tensor *y) {
    const char *op = "dwconv_silu_proj_fwd";
    DwDims d = dw_dims(op, x, w);
    cuda_check_tensor(op, "pw", pw);
    if (pb) cuda_check_tensor(op, "pb", pb);
    cuda_check_tensor(op, "y", y);
    if (b) {
        cuda_check_numel(op, "b", b, (size_t)d.C);
        cuda_check_same_dtype(op, "b", b, "w", w);
    }
    const int m = dwconv_proj_check(op, &d, x, w, pw, pb, y);
    if (x->numel == 0) return;
    const size_t n = (size_t)d.B * d.H * d.W * m;
    if (x->dtype == DTYPE_BF16 && w->dtype == DTYPE_BF16 && m <= DW_PROJ_M) {
        DwProj proj{(const bf16 *)pw->data, m, (float *)cuda_temp_alloc(ctx, (size_t)(d.C / 8) * n * sizeof(float)), 0};
        const bf16 *xb = (const bf16 *)x->data, *wb = (const bf16 *)w->data, *bb = b ? (const bf16 *)b->data : nullptr;
        const bool whole = d.H <= DWP_MAX_SIDE && d.W <= DWP_MAX_SIDE;   // the whole-image kernels' grids
        const bool fused = whole ? cuda_dwconv_plane_mma(ctx, xb, wb, bb, nullptr, d, DW_SILU, &proj) ||
                                       cuda_dwconv_image7(ctx, xb, wb, bb, nullptr, d, DW_SILU, &proj)
                                 : cuda_dwconv_mma(ctx, xb, wb, bb, nullptr, d, DW_SILU, &proj);
        if (fused) {
            dw_proj_sum_kernel<<<grid_stride_blocks(ctx, n, ELEM_THREADS), ELEM_THREADS, 0, cuda_stream_of(ctx)>>>(
                proj.part, proj.groups, n, m, pb ? (const bf16 *)pb->data : nullptr, (bf16 *)y->data);
            CUDA_CHECK_LAUNCH();
        }
        cuda_temp_free(ctx, proj.part);
        if (fused) return;
    }
    Tensor v = *x;   // silu(dwconv(x)) (B,H,W,C)
    v.data = cuda_temp_alloc(ctx, x->numel * dtype_size(x->dtype));
    v.grad = NULL;
    cuda_dwconv_fwd(ctx, x, NULL, NULL, NULL, w, b, DWCONV_SILU, NULL, &v);
    cuda_linear_fwd(ctx, &v, pw, pb, NULL, y);
    cuda_temp_free(ctx, v.data);
}

// Runs of images for the dw sweeps: enough threads to fill the GPU, each thread summing as many
// images as that allows (fewer partial rows to add); rows cut into chunks only when the images
// alone are too few. The partial matrix (runs * chunks * strip groups, C k^2 + C) in scratch.
struct DwRuns {
    int per, runs;
    size_t parts, width, smem;
    float *partial;
};

static DwRuns dw_runs(Ctx *ctx, const DwDims &d, DwGrid &g) {
    DwRuns r;
    const int KK = d.k * d.k;
    size_t per_img = (size_t)g.groups * g.sgroups * g.lanes * g.sblk;
    size_t want = dw_want_threads(ctx);
    r.runs = (int)((want + per_img - 1) / per_img);
    if (r.runs > d.B) {
        r.runs = d.B;
        DwDims one = d;   // rows cut as for the images alone
        one.B = 1;
        dw_split_rows(g, one, (want + d.B - 1) / d.B);
    }
    r.per = (d.B + r.runs - 1) / r.runs;
    r.runs = (d.B + r.per - 1) / r.per;
    dw_check_grid(g, d, (unsigned)r.runs);
    r.width = (size_t)d.C * KK + d.C;
    r.parts = (size_t)r.runs * g.chunks * g.sgroups;
    r.partial = (float *)cuda_scratch(ctx, r.parts * r.width * sizeof(float));
    r.smem = (size_t)g.sblk * (KK + 1) * g.lanes * g.V * sizeof(float);
    return r;
}

// dw and db: the sweep's partial rows, then their fixed-order column sums.
template <typename T>
static void launch_dw(Ctx *ctx, const T *dy, const T *x, DwDims d, float *dw, float *db) {
    if constexpr (std::is_same<T, bf16>::value) {
        if (cuda_dwconv_plane_mma_dw(ctx, dy, x, d, dw, db)) return;   // 7x7 on 9 to 16 columns
        if (cuda_dwconv_plane_dw(ctx, dy, x, d, dw, db)) return;       // 7x7 on small images
        if (cuda_dwconv_mma_dw(ctx, dy, x, d, dw, db)) return;     // 7x7 on tensor cores
    }
    DwGrid g = dw_grid(d, dw_vec(d, sizeof(T), dy, x), dw_strip(d, true));
    DwRuns r = dw_runs(ctx, d, g);
    dim3 grid((unsigned)(g.groups * g.sgroups), (unsigned)g.chunks, (unsigned)r.runs);
    dispatch_k_v(d.k, g.V, [&](auto kc, auto vc) {
        constexpr int K = decltype(kc)::value, V = decltype(vc)::value;
        auto kernel = dwconv_dw_rows_kernel<K, V, T>;
        dw_allow_smem(kernel, r.smem);
        kernel<<<grid, g.lanes * g.sblk, r.smem, cuda_stream_of(ctx)>>>(dy, x, d, g, r.per, r.partial);
    });
    CUDA_CHECK_LAUNCH();
    cuda_sum_partials(ctx, r.partial, (unsigned)r.parts, r.width, (size_t)d.C * d.k * d.k, dw, db);
}

// dx, dw and db in one sweep (k <= 3), then dw and db's column sums.
template <typename T, typename TW>
static void launch_bwd_fused(Ctx *ctx, const T *dy, const T *x, const TW *w, T *dx, DwDims d,
                             int flags, float *dw, float *db) {
    if (cuda_dwconv_plane_bwd(ctx, dy, x, w, dx, d, flags, dw, db)) return;   // fp32, rows of <= 128
    DwGrid g = dw_grid(d, 1, dw_strip(d, true));
    DwRuns r = dw_runs(ctx, d, g);
    dim3 grid((unsigned)(g.groups * g.sgroups), (unsigned)g.chunks, (unsigned)r.runs);
    auto go = [&](auto kc) {
        auto kernel = dwconv_bwd_fused_kernel<decltype(kc)::value, T, TW>;
        dw_allow_smem(kernel, r.smem);
        kernel<<<grid, g.lanes * g.sblk, r.smem, cuda_stream_of(ctx)>>>(dy, x, w, dx, d, g, flags, r.per,
                                                                          r.partial);
    };
    if (d.k == 1) go(std::integral_constant<int, 1>{});
    else go(std::integral_constant<int, 3>{});
    CUDA_CHECK_LAUNCH();
    cuda_sum_partials(ctx, r.partial, (unsigned)r.parts, r.width, (size_t)d.C * d.k * d.k, dw, db);
}

void cuda_dwconv_bwd(Ctx *ctx, const Tensor *dy, const Tensor *x, const Tensor *w, int flags,
                     Tensor *dx, Tensor *dw, Tensor *db) {
    const char *op = "dwconv_bwd";
    DwDims d = dw_dims(op, x, w);
    dwconv_check_flags(op, flags, false);
    cuda_check_numel(op, "dy", dy, x->numel);
    cuda_check_same_dtype(op, "dy", dy, "x", x);
    if (dw) {
        cuda_check_f32(op, "dw", dw);
        cuda_check_numel(op, "dw", dw, (size_t)d.C * d.k * d.k);
    }
    if (db) {
        cuda_check_f32(op, "db", db);
        cuda_check_numel(op, "db", db, (size_t)d.C);
    }
    if (dx) {
        cuda_check_numel(op, "dx", dx, x->numel);
        cuda_check_same_dtype(op, "dx", dx, "x", x);
        CG_CHECK(dx->data != dy->data, "", "op dwconv_bwd: dx is dy (the taps read neighbours of what they write)");
    }
    if (x->numel == 0) return;
    const int dx_flags = DW_FLIP | (flags & DWCONV_WRITE_DX ? 0 : DW_ACCUM) |
                         (flags & DWCONV_RESIDUAL ? DW_RESID : 0);
    if (dx && (dw || db) && d.k <= 3) {   // one pass over dy and x
        dispatch_dtype2(x->dtype, w->dtype, [&](auto tx, auto tw) {
            using T = TAG_T(tx);
            using TW = TAG_T(tw);
            launch_bwd_fused(ctx, (const T *)dy->data, (const T *)x->data, (const TW *)w->data,
                             (T *)dx->data, d, dx_flags, dw ? tensor_f32(dw) : nullptr,
                             db ? tensor_f32(db) : nullptr);
        });
        return;
    }
    if (dx && (dw || db) && x->dtype == DTYPE_BF16 && w->dtype == DTYPE_BF16 &&
        (cuda_dwconv_plane_mma_bwd(ctx, (const bf16 *)dy->data, (const bf16 *)x->data, (const bf16 *)w->data,
                                   (bf16 *)dx->data, d, dx_flags, dw ? tensor_f32(dw) : nullptr,
                                   db ? tensor_f32(db) : nullptr) ||
         cuda_dwconv_mma_bwd(ctx, (const bf16 *)dy->data, (const bf16 *)x->data, (const bf16 *)w->data,
                             (bf16 *)dx->data, d, dx_flags, dw ? tensor_f32(dw) : nullptr,
                             db ? tensor_f32(db) : nullptr)))
        return;   // the 7x7 on 9 to 16 columns, and on tensor cores: one pass over dy and x
    if (dx)
        dispatch_dtype2(x->dtype, w->dtype, [&](auto tx, auto tw) {
            using T = TAG_T(tx);
            using TW = TAG_T(tw);
            launch_rows(ctx, (const T *)dy->data, (const TW *)w->data, (const TW *)nullptr,
                        (T *)dx->data, d, dx_flags);
        });
    if (dw || db)
        dispatch_dtype(x->dtype, [&](auto tx) {
            using T = TAG_T(tx);
            launch_dw(ctx, (const T *)dy->data, (const T *)x->data, d, dw ? tensor_f32(dw) : nullptr,
                      db ? tensor_f32(db) : nullptr);
        });
}
