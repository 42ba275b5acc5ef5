// GSPN-1's gate recurrence on the GPU (contract in gate_recurrent.h; the definition and the CPU
// reference are kernels/cpu/gate_recurrent.h).
//
// Work split: a block per (n, c) plane (looping over planes past the grid's limit), a thread per
// row or per ROWS adjacent rows, walking the W columns. A row's out at column w needs its own and
// its two neighbours' out at column w - 1, so the threads exchange one column through shared
// memory each step: a slot per thread with the values of its first and last row, which the
// threads above and below read; zero halo slots stand for rows -1 and H (rows past H publish
// zeros too); double buffered, so one barrier a column suffices.
//
// Memory: a row's consecutive columns are consecutive addresses (rows are W elements apart), so a
// thread loads V columns of each input at once (a 4- to 16-byte vector: V divides W and every
// pointer is aligned to it, else V = 1) into a ring of P such groups in registers, and refills a
// slot as soon as its group is done: the loads of the next P - 1 groups are in flight while the
// chain runs, and a group's results leave as one vector a row. V and P are sized to the registers
// a thread has (ring_depth, the VMAX of each launch): the forward takes a row a thread up to 1024
// rows (blocks of up to 1024 threads: 64 registers a thread), two up to 2048; the backward, with
// seven inputs and five gradients a row, blocks of up to 512 threads (128 registers): a row a
// thread up to 512 rows, two up to 1024, four up to 2048 (at 1024 threads it spilled).
//
// Backward, right to left: dh[h][w] = dout[h][w] + g1[h+1][w+1] dh[h+1][w+1]
// + g2[h][w+1] dh[h][w+1] + g3[h-1][w+1] dh[h-1][w+1], the last three when column w + 1 is in w's
// run. A thread publishes g1 dh of its first row and g3 dh of its last (g2 dh stays in its
// registers). Then dx = b dh, db = x dh and dg2 = dh out[h][w-1] come from the thread's own rows
// (formed from the group's dh when the group is done); dg1 = dh out[h-1][w-1] and
// dg3 = dh out[h+1][w-1] need the neighbours' out[.][w-1], which they publish with the step's
// other values (it is their own dg2's factor), so dg1 and dg3 of column w are formed one step
// later, at column w - 1, from dh kept in a register. Every gradient element has one writer:
// deterministic, and written or added (accumulate) without atomics.
#include <limits.h>
#include <stdint.h>
#include "gate_recurrent.h"
#include "cuda_elem.cuh"

namespace {

constexpr int GR_FWD_THREADS = 1024, GR_BWD_THREADS = 512;   // a block's threads at most

// Registers a ring slot takes (ROWS rows of `arrays` vectors of V columns of T and `scalars` single
// elements; a lone bf16 takes a register), and the groups in flight: as many as fit `budget`
// registers, 2 to 8.
template <typename T, int ROWS, int V>
__host__ __device__ constexpr int ring_depth(int arrays, int scalars, int budget) {
    const int words = ROWS * (arrays * (V * (int)sizeof(T) >= 4 ? V * (int)sizeof(T) / 4 : 1) + scalars);
    return 8 * words <= budget ? 8 : 4 * words <= budget ? 4 : 2;
}

// ---- forward -----------------------------------------------------------------------------------

enum { FX, FB, FG1, FG2, FG3, FN };   // the forward's inputs, in a ring slot

template <typename T, int ROWS, int V>
__global__ void __launch_bounds__(GR_FWD_THREADS)
gr_fwd_kernel(const T *__restrict__ x, const T *__restrict__ b, const T *__restrict__ g1,
              const T *__restrict__ g2, const T *__restrict__ g3, T *__restrict__ out,
              size_t planes, int H, int W, int chunk) {
    constexpr int P = ring_depth<T, ROWS, V>(FN, 0, 40);
    // out of a column, [2][slots][ROWS]: slot t + 1 holds thread t's rows, slots 0 and
    // blockDim.x + 1 stay 0
    extern __shared__ __align__(16) float col[];
    const int slots = blockDim.x + 2, t = threadIdx.x, r0 = t * ROWS, groups = W / V;
    for (int i = t; i < 2 * slots * ROWS; i += blockDim.x) col[i] = 0.0f;
    bool live[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; r++) live[r] = r0 + r < H;
    const T *const in[FN] = {x, b, g1, g2, g3};
    Vec<T, V> ring[P][ROWS][FN];   // rows past H keep zeros
#pragma unroll
    for (int j = 0; j < P; j++)
#pragma unroll
        for (int r = 0; r < ROWS; r++)
#pragma unroll
            for (int a = 0; a < FN; a++) ring[j][r][a] = Vec<T, V>{};
    __syncthreads();

    for (size_t p = blockIdx.x; p < planes; p += gridDim.x) {
        const size_t row0 = (p * (size_t)H + (size_t)r0) * (size_t)W;   // the thread's first row
        auto load = [&](int g, Vec<T, V>(&slot)[ROWS][FN]) {
            if (g >= groups) return;
#pragma unroll
            for (int r = 0; r < ROWS; r++)
                if (live[r])
#pragma unroll
                    for (int a = 0; a < FN; a++)
                        slot[r][a] = Vec<T, V>::load(in[a] + row0 + (size_t)r * W + (size_t)g * V);
        };
#pragma unroll
        for (int j = 0; j < P; j++) load(j, ring[j]);
        float o[ROWS];   // out[r][w-1]
#pragma unroll
        for (int r = 0; r < ROWS; r++) o[r] = 0.0f;
        int pos = 0, buf = 0;   // pos = w % chunk: 0 starts a run
        for (int g0 = 0; g0 < groups; g0 += P) {
#pragma unroll
            for (int j = 0; j < P; j++) {
                const int g = g0 + j;
                if (g >= groups) break;   // the same for every thread of the block
                float res[ROWS][V];
#pragma unroll
                for (int k = 0; k < V; k++) {
                    const float *prev = col + buf * slots * ROWS;
                    float *cur = col + (buf ^ 1) * slots * ROWS;
                    float v[ROWS];
#pragma unroll
                    for (int r = 0; r < ROWS; r++)
                        v[r] = ring[j][r][FB].get(k) * ring[j][r][FX].get(k);
                    if (pos != 0) {
                        // rows r0 - 1 (thread t - 1's last) and r0 + ROWS (thread t + 1's first)
                        const float up = prev[t * ROWS + ROWS - 1], dn = prev[(t + 2) * ROWS];
#pragma unroll
                        for (int r = 0; r < ROWS; r++) {
                            const float hu = r == 0 ? up : o[r > 0 ? r - 1 : 0];
                            const float hd = r == ROWS - 1 ? dn : o[r + 1 < ROWS ? r + 1 : r];
                            v[r] += ring[j][r][FG1].get(k) * hu;
                            v[r] += ring[j][r][FG2].get(k) * o[r];
                            v[r] += ring[j][r][FG3].get(k) * hd;
                        }
                    }
#pragma unroll
                    for (int r = 0; r < ROWS; r++) {
                        o[r] = live[r] ? v[r] : 0.0f;
                        res[r][k] = o[r];
                        cur[(t + 1) * ROWS + r] = o[r];
                    }
                    __syncthreads();   // the column is in; prev is free for column w + 1 to write
                    buf ^= 1;
                    pos = pos + 1 == chunk ? 0 : pos + 1;
                }
#pragma unroll
                for (int r = 0; r < ROWS; r++)
                    if (live[r])
                        Vec<T, V>::of(res[r]).store(out + row0 + (size_t)r * W + (size_t)g * V);
                load(g + P, ring[j]);
            }
        }
    }
}

// The forward with each row's next 32 bytes of every input at once (V = 32 / sizeof(T) columns).
// Rows are W elements apart, so the kernel above takes a quarter of each 64-byte piece DRAM sends
// with a vector, and on 1024-row planes the rest has left L2 by the thread's next groups (Nsight
// Compute at 16 x 8 x 1024^2, bf16: 5.72 GB read for 1.34 GB of inputs). Here a thread loads its
// row's five 32-byte pieces at once into its own column of shared memory ([FN][8 words][threads]),
// scans the V columns from there and stores its V outputs as one 32-byte piece. Rows a thread: 1.
template <typename T>
__global__ void __launch_bounds__(GR_FWD_THREADS)
gr_fwd_runs_kernel(const T *__restrict__ x, const T *__restrict__ b, const T *__restrict__ g1,
                   const T *__restrict__ g2, const T *__restrict__ g3, T *__restrict__ out,
                   size_t planes, int H, int W, int chunk) {
    constexpr int V = 32 / (int)sizeof(T), WORDS = 8;
    // out of a column, [2][slots] (slot t + 1 thread t's row, slots 0 and blockDim.x + 1 stay 0),
    // then the runs, [FN][WORDS][blockDim.x] words
    extern __shared__ __align__(16) float col[];
    const int slots = blockDim.x + 2, t = threadIdx.x, groups = W / V, nt = blockDim.x;
    uint32_t *runs = reinterpret_cast<uint32_t *>(col + 2 * slots);
    for (int i = t; i < 2 * slots; i += nt) col[i] = 0.0f;
    const bool live = t < H;
    const T *const in[FN] = {x, b, g1, g2, g3};
    __syncthreads();

    for (size_t p = blockIdx.x; p < planes; p += gridDim.x) {
        const size_t row0 = (p * (size_t)H + (size_t)t) * (size_t)W;   // the thread's row
        float o = 0.0f;   // out[t][w-1]
        int pos = 0, buf = 0;   // pos = w % chunk: 0 starts a run
        for (int g = 0; g < groups; g++) {
            if (live) {   // a lane reads back only its own words: no barrier
                uint4 v[FN][2];
#pragma unroll
                for (int a = 0; a < FN; a++)
#pragma unroll
                    for (int h = 0; h < 2; h++)
                        v[a][h] = __ldg(reinterpret_cast<const uint4 *>(in[a] + row0 + (size_t)g * V) + h);
#pragma unroll
                for (int a = 0; a < FN; a++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        uint32_t *d = runs + (size_t)(a * WORDS + 4 * h) * nt + t;
                        d[0] = v[a][h].x, d[nt] = v[a][h].y, d[2 * nt] = v[a][h].z, d[3 * nt] = v[a][h].w;
                    }
            }
            float res[V];
#pragma unroll
            for (int k = 0; k < V; k++) {
                const float *prev = col + buf * slots;
                float *cur = col + (buf ^ 1) * slots;
                float e[FN];   // column k of each input
#pragma unroll
                for (int a = 0; a < FN; a++) {
                    if constexpr (sizeof(T) == 4) {
                        e[a] = live ? __uint_as_float(runs[(size_t)(a * WORDS + k) * nt + t]) : 0.0f;
                    } else {
                        const uint32_t w = live ? runs[(size_t)(a * WORDS + k / 2) * nt + t] : 0u;
                        e[a] = __uint_as_float(k & 1 ? w & 0xffff0000u : w << 16);
                    }
                }
                float v = e[FB] * e[FX];
                if (pos != 0) {   // rows t - 1 and t + 1 at column w - 1
                    const float up = prev[t], dn = prev[t + 2];
                    v += e[FG1] * up;
                    v += e[FG2] * o;
                    v += e[FG3] * dn;
                }
                o = live ? v : 0.0f;
                res[k] = o;
                cur[t + 1] = o;
                __syncthreads();   // the column is in; prev is free for column w + 1 to write
                buf ^= 1;
                pos = pos + 1 == chunk ? 0 : pos + 1;
            }
            if (live) {
                T *q = out + row0 + (size_t)g * V;
                if constexpr (sizeof(T) == 4) {
                    Vec<float, 4>::of(res).store(reinterpret_cast<float *>(q));
                    Vec<float, 4>::of(res + 4).store(reinterpret_cast<float *>(q) + 4);
                } else {
                    Vec<T, 8>::of(res).store(q);
                    Vec<T, 8>::of(res + 8).store(q + 8);
                }
            }
        }
    }
}

// ---- backward ----------------------------------------------------------------------------------

enum { BDOUT, BX, BB, BG1, BG2, BG3, BOUT, BN };   // the backward's inputs, in a ring slot

template <typename T, int ROWS, int V>
__global__ void __launch_bounds__(GR_BWD_THREADS)
gr_bwd_kernel(const T *__restrict__ dout, const T *__restrict__ x, const T *__restrict__ b,
              const T *__restrict__ g1, const T *__restrict__ g2, const T *__restrict__ g3,
              const T *__restrict__ out, T *__restrict__ dx, T *__restrict__ db,
              T *__restrict__ dg1, T *__restrict__ dg2, T *__restrict__ dg3, size_t planes, int H,
              int W, int chunk, int accumulate) {
    constexpr int P = ring_depth<T, ROWS, V>(BN, 1, 64);
    // [2][slots] of (g1 dh of the thread's first row, that row's out[.][w-1], g3 dh of its last
    // row, that row's out[.][w-1]): slot t + 1 is thread t's, slots 0 and blockDim.x + 1 stay 0
    extern __shared__ __align__(16) float4 slot4[];
    const int slots = blockDim.x + 2, t = threadIdx.x, r0 = t * ROWS, groups = W / V;
    for (int i = t; i < 2 * slots; i += blockDim.x) slot4[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    bool live[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; r++) live[r] = r0 + r < H;
    const T *const in[BN] = {dout, x, b, g1, g2, g3, out};
    // a group's inputs, and out of the column left of it (dg2's factor at the group's first
    // column, loaded with the group: the next group's slot, which holds it too, is loaded only
    // one group ahead of its own use); rows past H keep zeros
    Vec<T, V> ring[P][ROWS][BN];
    Vec<T, 1> left_of[P][ROWS];
#pragma unroll
    for (int j = 0; j < P; j++)
#pragma unroll
        for (int r = 0; r < ROWS; r++) {
#pragma unroll
            for (int a = 0; a < BN; a++) ring[j][r][a] = Vec<T, V>{};
            left_of[j][r] = Vec<T, 1>{};
        }
    __syncthreads();

    for (size_t p = blockIdx.x; p < planes; p += gridDim.x) {
        const size_t row0 = (p * (size_t)H + (size_t)r0) * (size_t)W;
        auto load = [&](int g, Vec<T, V>(&slot)[ROWS][BN], Vec<T, 1>(&left)[ROWS]) {
            if (g < 0) return;
#pragma unroll
            for (int r = 0; r < ROWS; r++)
                if (live[r]) {
                    const size_t o = row0 + (size_t)r * W + (size_t)g * V;
#pragma unroll
                    for (int a = 0; a < BN; a++) slot[r][a] = Vec<T, V>::load(in[a] + o);
                    if (g > 0) left[r] = Vec<T, 1>::load(out + o - 1);
                }
        };
        // group g's V values of a gradient, row r: one vector, added to what is there with
        // accumulate
        auto put = [&](T *dst, int g, int r, const float (&v)[V]) {
            if (!dst || !live[r]) return;
            T *q = dst + row0 + (size_t)r * W + (size_t)g * V;
            if (accumulate) {
                const Vec<T, V> old = Vec<T, V>::load(q);
                float s[V];
#pragma unroll
                for (int k = 0; k < V; k++) s[k] = old.get(k) + v[k];
                Vec<T, V>::of(s).store(q);
            } else {
                Vec<T, V>::of(v).store(q);
            }
        };
#pragma unroll
        for (int j = 0; j < P; j++) load(groups - 1 - j, ring[j], left_of[j]);
        // of column w + 1: dh, and g1 dh, g2 dh, g3 dh
        float dhn[ROWS], a1[ROWS], a2[ROWS], a3[ROWS];
#pragma unroll
        for (int r = 0; r < ROWS; r++) dhn[r] = a1[r] = a2[r] = a3[r] = 0.0f;
        // a group's dh, whose dx, db and dg2 leave when the group is done, and its dg1, dg3,
        // which fill a step late: their element 0, the group's last, is set at the next group's
        // first step
        float sd[ROWS][V], s1[ROWS][V], s3[ROWS][V];
        int pos = (W - 1) % chunk, buf = 0;   // pos = w % chunk: 0 starts a run
        bool next = false;                    // column w + 1 exists and is in w's run
        for (int s0 = 0; s0 < groups; s0 += P) {
#pragma unroll
            for (int j = 0; j < P; j++) {
                const int g = groups - 1 - (s0 + j);
                if (g < 0) break;   // the same for every thread of the block
                unsigned starts = 0;   // bit k: column g V + k starts a run
#pragma unroll
                for (int k = V - 1; k >= 0; k--) {
                    const float4 *prev = slot4 + buf * slots;
                    float4 *cur = slot4 + (buf ^ 1) * slots;
                    const bool first = pos == 0;
                    float d[ROWS], e1[ROWS], e3[ROWS], left[ROWS];
#pragma unroll
                    for (int r = 0; r < ROWS; r++) d[r] = ring[j][r][BDOUT].get(k);
                    if (next) {
                        // thread t - 1's last row (r0 - 1) and thread t + 1's first (r0 + ROWS)
                        const float4 above = prev[t], below = prev[t + 2];
#pragma unroll
                        for (int r = 0; r < ROWS; r++) {
                            const int ru = r > 0 ? r - 1 : 0, rd = r + 1 < ROWS ? r + 1 : r;
                            d[r] += r == ROWS - 1 ? below.x : a1[rd];
                            d[r] += a2[r];
                            d[r] += r == 0 ? above.z : a3[ru];
                            // dg1, dg3 of column w + 1: dh there times out[h -+ 1][w]
                            e1[r] = dhn[r] * (r == 0 ? above.w : ring[j][ru][BOUT].get(k));
                            e3[r] = dhn[r] * (r == ROWS - 1 ? below.y : ring[j][rd][BOUT].get(k));
                        }
                    } else {
#pragma unroll
                        for (int r = 0; r < ROWS; r++) e1[r] = e3[r] = 0.0f;
                    }
#pragma unroll
                    for (int r = 0; r < ROWS; r++) {
                        if (!live[r]) d[r] = 0.0f;
                        // out[r][w-1], 0 at a run's first column
                        const float l = k > 0 ? ring[j][r][BOUT].get(k > 0 ? k - 1 : 0)
                                              : left_of[j][r].get(0);
                        left[r] = first ? 0.0f : l;
                        sd[r][k] = d[r];
                        a1[r] = ring[j][r][BG1].get(k) * d[r];
                        a2[r] = ring[j][r][BG2].get(k) * d[r];
                        a3[r] = ring[j][r][BG3].get(k) * d[r];
                        dhn[r] = d[r];
                    }
                    if (k < V - 1) {
#pragma unroll
                        for (int r = 0; r < ROWS; r++) {
                            s1[r][k + 1 < V ? k + 1 : 0] = e1[r];
                            s3[r][k + 1 < V ? k + 1 : 0] = e3[r];
                        }
                    } else {   // column w + 1 is group g + 1's first: that group is complete
#pragma unroll
                        for (int r = 0; r < ROWS; r++) {
                            s1[r][0] = e1[r];
                            s3[r][0] = e3[r];
                            if (g + 1 < groups) {
                                put(dg1, g + 1, r, s1[r]);
                                put(dg3, g + 1, r, s3[r]);
                            }
                        }
                    }
                    cur[t + 1] = make_float4(a1[0], left[0], a3[ROWS - 1], left[ROWS - 1]);
                    __syncthreads();   // the column is in; prev is free for column w - 1 to write
                    starts |= (unsigned)first << k;
                    buf ^= 1;
                    next = !first;
                    pos = first ? chunk - 1 : pos - 1;
                }
#pragma unroll
                for (int r = 0; r < ROWS; r++) {   // dx = b dh, db = x dh, dg2 = dh out[h][w-1]
                    float v[V];
#pragma unroll
                    for (int k = 0; k < V; k++) v[k] = ring[j][r][BB].get(k) * sd[r][k];
                    put(dx, g, r, v);
#pragma unroll
                    for (int k = 0; k < V; k++) v[k] = ring[j][r][BX].get(k) * sd[r][k];
                    put(db, g, r, v);
#pragma unroll
                    for (int k = 0; k < V; k++) {
                        const float l = k > 0 ? ring[j][r][BOUT].get(k > 0 ? k - 1 : 0)
                                              : left_of[j][r].get(0);
                        v[k] = sd[r][k] * ((starts >> k) & 1u ? 0.0f : l);
                    }
                    put(dg2, g, r, v);
                }
                load(g - P, ring[j], left_of[j]);
            }
        }
#pragma unroll
        for (int r = 0; r < ROWS; r++) {   // column 0 starts a run: its dg1 and dg3 are 0
            s1[r][0] = s3[r][0] = 0.0f;
            put(dg1, 0, r, s1[r]);
            put(dg3, 0, r, s3[r]);
        }
    }
}

// ---- launches ----------------------------------------------------------------------------------

// The widest V up to vmax (a power of two) that divides W and to whose bytes every pointer is
// aligned (NULL ones are).
int pick_v(int vmax, int esz, int W, const void *const *ptrs, int n) {
    for (int v = vmax; v > 1; v /= 2) {
        bool ok = W % v == 0;
        for (int i = 0; i < n && ok; i++) ok = (uintptr_t)ptrs[i] % (uintptr_t)(v * esz) == 0;
        if (ok) return v;
    }
    return 1;
}

struct Launch {
    unsigned blocks;
    int threads;
    cudaStream_t stream;
};

// ROWS rows a thread, whole warps, a block per plane.
template <int ROWS> Launch launch_shape(size_t planes, int H, cudaStream_t stream) {
    const int threads = ((H + ROWS - 1) / ROWS + 31) / 32 * 32;
    return Launch{(unsigned)(planes < (size_t)INT_MAX ? planes : (size_t)INT_MAX), threads, stream};
}

template <typename T, int ROWS, int V>
cudaError_t fwd_launch(int v, const Launch &l, size_t planes, int H, int W, int chunk, const void *x,
                       const void *b, const void *g1, const void *g2, const void *g3, void *out) {
    if constexpr (V > 1)
        if (v < V) return fwd_launch<T, ROWS, V / 2>(v, l, planes, H, W, chunk, x, b, g1, g2, g3, out);
    const size_t smem = 2 * (size_t)(l.threads + 2) * ROWS * sizeof(float);
    gr_fwd_kernel<T, ROWS, V><<<l.blocks, l.threads, smem, l.stream>>>(
        (const T *)x, (const T *)b, (const T *)g1, (const T *)g2, (const T *)g3, (T *)out, planes,
        H, W, chunk);
    return cudaGetLastError();
}

template <typename T, int ROWS, int V>
cudaError_t bwd_launch(int v, const Launch &l, size_t planes, int H, int W, int chunk,
                       const void *dout, const void *x, const void *b, const void *g1,
                       const void *g2, const void *g3, const void *out, int accumulate, void *dx,
                       void *db, void *dg1, void *dg2, void *dg3) {
    if constexpr (V > 1)
        if (v < V)
            return bwd_launch<T, ROWS, V / 2>(v, l, planes, H, W, chunk, dout, x, b, g1, g2, g3, out,
                                              accumulate, dx, db, dg1, dg2, dg3);
    const size_t smem = 2 * (size_t)(l.threads + 2) * sizeof(float4);
    gr_bwd_kernel<T, ROWS, V><<<l.blocks, l.threads, smem, l.stream>>>(
        (const T *)dout, (const T *)x, (const T *)b, (const T *)g1, (const T *)g2, (const T *)g3,
        (const T *)out, (T *)dx, (T *)db, (T *)dg1, (T *)dg2, (T *)dg3, planes, H, W, chunk,
        accumulate);
    return cudaGetLastError();
}

// gr_fwd_runs_kernel where a row a thread fits, W is a whole number of 32-byte pieces, every
// pointer 32-byte aligned, and rows long enough (GR_RUNS_MIN_W) for the pieces to matter.
constexpr int GR_RUNS_MIN_W = 256;
template <typename T>
cudaError_t fwd_runs_launch(size_t planes, int H, int W, int chunk, const void *x, const void *b,
                            const void *g1, const void *g2, const void *g3, void *out,
                            cudaStream_t stream) {
    const Launch l = launch_shape<1>(planes, H, stream);
    const size_t smem = 2 * (size_t)(l.threads + 2) * sizeof(float) + (size_t)FN * 8 * l.threads * sizeof(uint32_t);
    cudaError_t e = cudaFuncSetAttribute(gr_fwd_runs_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    gr_fwd_runs_kernel<T><<<l.blocks, l.threads, smem, l.stream>>>(
        (const T *)x, (const T *)b, (const T *)g1, (const T *)g2, (const T *)g3, (T *)out, planes, H, W, chunk);
    return cudaGetLastError();
}

// Widest loads (VMAX, bytes a row and array): 16 at a row a thread, 8 at two; the backward's four
// rows a thread take one element (wider spilled).
template <typename T>
cudaError_t fwd_typed(size_t planes, int H, int W, int chunk, const void *x, const void *b,
                      const void *g1, const void *g2, const void *g3, void *out,
                      cudaStream_t stream) {
    const void *ptrs[6] = {x, b, g1, g2, g3, out};
    constexpr int E = (int)sizeof(T);
    if (H <= GR_FWD_THREADS && W >= GR_RUNS_MIN_W && pick_v(32 / E, E, W, ptrs, 6) == 32 / E)
        return fwd_runs_launch<T>(planes, H, W, chunk, x, b, g1, g2, g3, out, stream);
    if (H <= GR_FWD_THREADS)
        return fwd_launch<T, 1, 16 / E>(pick_v(16 / E, E, W, ptrs, 6), launch_shape<1>(planes, H, stream),
                                        planes, H, W, chunk, x, b, g1, g2, g3, out);
    return fwd_launch<T, 2, 8 / E>(pick_v(8 / E, E, W, ptrs, 6), launch_shape<2>(planes, H, stream),
                                   planes, H, W, chunk, x, b, g1, g2, g3, out);
}

template <typename T>
cudaError_t bwd_typed(size_t planes, int H, int W, int chunk, const void *dout, const void *x,
                      const void *b, const void *g1, const void *g2, const void *g3,
                      const void *out, int accumulate, void *dx, void *db, void *dg1, void *dg2,
                      void *dg3, cudaStream_t stream) {
    const void *ptrs[12] = {dout, x, b, g1, g2, g3, out, dx, db, dg1, dg2, dg3};
    constexpr int E = (int)sizeof(T);
    if (H <= GR_BWD_THREADS)
        return bwd_launch<T, 1, 16 / E>(pick_v(16 / E, E, W, ptrs, 12), launch_shape<1>(planes, H, stream),
                                        planes, H, W, chunk, dout, x, b, g1, g2, g3, out, accumulate,
                                        dx, db, dg1, dg2, dg3);
    if (H <= 2 * GR_BWD_THREADS)
        return bwd_launch<T, 2, 8 / E>(pick_v(8 / E, E, W, ptrs, 12), launch_shape<2>(planes, H, stream),
                                       planes, H, W, chunk, dout, x, b, g1, g2, g3, out, accumulate,
                                       dx, db, dg1, dg2, dg3);
    return bwd_launch<T, 4, 1>(1, launch_shape<4>(planes, H, stream),
                                   planes, H, W, chunk, dout, x, b, g1, g2, g3, out, accumulate, dx,
                                   db, dg1, dg2, dg3);
}

bool shape_ok(size_t planes, int H, int W, int chunk) {
    return planes >= 1 && H >= 1 && W >= 1 && chunk >= 1 && H <= GR_CUDA_MAX_ROWS;
}

}  // namespace

extern "C" cudaError_t cuda_gate_recurrent_fwd(DType dtype, size_t planes, int H, int W, int chunk,
                                               const void *x, const void *b, const void *g1,
                                               const void *g2, const void *g3, void *out,
                                               cudaStream_t stream) {
    if (!shape_ok(planes, H, W, chunk)) return cudaErrorInvalidValue;
    if (dtype == DTYPE_BF16)
        return fwd_typed<bf16>(planes, H, W, chunk, x, b, g1, g2, g3, out, stream);
    return fwd_typed<float>(planes, H, W, chunk, x, b, g1, g2, g3, out, stream);
}

extern "C" cudaError_t cuda_gate_recurrent_bwd(DType dtype, size_t planes, int H, int W, int chunk,
                                               const void *dout, const void *x, const void *b,
                                               const void *g1, const void *g2, const void *g3,
                                               const void *out, int accumulate, void *dx, void *db,
                                               void *dg1, void *dg2, void *dg3,
                                               cudaStream_t stream) {
    if (!shape_ok(planes, H, W, chunk)) return cudaErrorInvalidValue;
    if (dtype == DTYPE_BF16)
        return bwd_typed<bf16>(planes, H, W, chunk, dout, x, b, g1, g2, g3, out, accumulate, dx, db,
                               dg1, dg2, dg3, stream);
    return bwd_typed<float>(planes, H, W, chunk, dout, x, b, g1, g2, g3, out, accumulate, dx, db,
                            dg1, dg2, dg3, stream);
}
