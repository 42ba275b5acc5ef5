// Deterministic column sums for the CUDA ops: out[c] += sum over rows r of f(r, c), for the
// reductions of a gradient over the rows of a matrix (add_bcast's dp, layer_scale's dg,
// concat_prefix's dprefix, linear's bias gradients, cast_colsum). No atomics: the rows are cut
// into `splits` ranges that depend on the shape alone; inside a range, thread row phase y (of 8)
// adds rows r0+y, r0+y+8, ... in order, the 8 phases are added in order, and a second pass adds
// the ranges in order. The vector and scalar paths use the same cut and the same order, so they
// agree bitwise.
#pragma once
#include "cuda_elem.cuh"

enum {
    COLSUM_TX = 32,              // threads across columns (each V columns)
    COLSUM_TY = 8,               // row phases
    COLSUM_TARGET_BLOCKS = 1024, // enough blocks to fill a large GPU several times
    COLSUM_MIN_ROWS = 64         // fewer rows than this per range would make partials dominate
};

typedef struct ColsumPlan {
    unsigned splits;
    size_t rows_per_split;
} ColsumPlan;

static inline ColsumPlan colsum_plan(size_t R, size_t P) {
    size_t tiles = ceil_div(P, (size_t)COLSUM_TX * 8);
    size_t want = ceil_div(COLSUM_TARGET_BLOCKS, tiles);
    size_t most = ceil_div(R, COLSUM_MIN_ROWS);
    size_t splits = want < most ? want : most;
    if (splits < 1) splits = 1;
    if (splits > 65535) splits = 65535;
    ColsumPlan p;
    p.rows_per_split = ceil_div(R, splits);
    p.splits = (unsigned)ceil_div(R, p.rows_per_split);
    return p;
}

// The plain column sum of x (R, P): acc += x[r, c..c+V).
template <typename T> struct ColsumRows {
    const T *x;
    size_t P;
    template <int V> __device__ void row(size_t r, size_t c, float *acc) const {
        float v[V];
        load_v<V>(x + r * P + c, v);
        #pragma unroll
        for (int j = 0; j < V; j++) acc[j] += v[j];
    }
};

// f.row<V>(r, c, acc) adds f(r, c..c+V-1) into acc[0..V) (and may write side outputs, e.g. dx,
// for exactly that (r, c) range: every element is visited once).
template <int V, typename F>
__global__ void __launch_bounds__(COLSUM_TX * COLSUM_TY)
colsum_kernel(size_t R, size_t P, size_t rows_per_split, F f, float *partial, float *out) {
    __shared__ float sm[COLSUM_TY][COLSUM_TX * V];
    size_t c = ((size_t)blockIdx.x * COLSUM_TX + threadIdx.x) * V;
    size_t r0 = (size_t)blockIdx.y * rows_per_split;
    size_t r1 = r0 + rows_per_split < R ? r0 + rows_per_split : R;
    float acc[V];
    #pragma unroll
    for (int j = 0; j < V; j++) acc[j] = 0.0f;
    if (c < P) {
        // Unrolled so that rows' loads can be in flight together (where f's stores allow it).
        #pragma unroll 4
        for (size_t r = r0 + threadIdx.y; r < r1; r += COLSUM_TY) f.template row<V>(r, c, acc);
    }
    #pragma unroll
    for (int j = 0; j < V; j++) sm[threadIdx.y][threadIdx.x * V + j] = acc[j];
    __syncthreads();
    if (threadIdx.y != 0 || c >= P) return;
    #pragma unroll
    for (int j = 0; j < V; j++) {
        float s = sm[0][threadIdx.x * V + j];
        #pragma unroll
        for (int y = 1; y < COLSUM_TY; y++) s += sm[y][threadIdx.x * V + j];
        if (gridDim.y == 1) out[c + j] += s;
        else partial[(size_t)blockIdx.y * P + c + j] = s;
    }
}

// Column sums of an (R, P) problem into fp32 out (P); vec as for launch_map (P a multiple of 8,
// every pointer f touches 16-byte aligned).
template <typename F>
void launch_colsum(Ctx *ctx, size_t R, size_t P, bool vec, const F &f, float *out) {
    if (R == 0 || P == 0) return;
    ColsumPlan pl = colsum_plan(R, P);
    float *partial = pl.splits > 1 ? (float *)cuda_scratch(ctx, (size_t)pl.splits * P * sizeof(float))
                                   : nullptr;
    cudaStream_t s = cuda_stream_of(ctx);
    dim3 block(COLSUM_TX, COLSUM_TY);
    if (vec) {
        dim3 grid((unsigned)ceil_div(P, (size_t)COLSUM_TX * 8), pl.splits);
        colsum_kernel<8><<<grid, block, 0, s>>>(R, P, pl.rows_per_split, f, partial, out);
    } else {
        dim3 grid((unsigned)ceil_div(P, (size_t)COLSUM_TX), pl.splits);
        colsum_kernel<1><<<grid, block, 0, s>>>(R, P, pl.rows_per_split, f, partial, out);
    }
    CUDA_CHECK_LAUNCH();
    if (pl.splits > 1) cuda_sum_partials(ctx, partial, pl.splits, P, P, out, nullptr);
}
