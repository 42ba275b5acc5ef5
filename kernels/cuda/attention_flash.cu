// Fallback attention kernels (kernels/cuda/attention.h): flash-style, tiled, online softmax, fp32
// accumulation, for fp32 (parity mode) and for bf16 where cuDNN cannot run. Plain CUDA cores,
// no tensor cores: correct and deterministic first, a few tens of TFLOP/s at best.
//
// A block owns 32 rows (queries or keys) of one (batch, head); each of its 4 warps owns R = 8 of
// them. Tiles of the other side, 32 rows, go through shared memory as fp32. Every tile step has
//   phase A: lane = the other side's row: dot products over head_dim for the warp's R rows
//            (scores, dO.V), the softmax or gradient terms, written to a per-warp table;
//   phase B: lane = channel d (head_dim / 32 per lane): the warp's R accumulators += the table
//            times the tile's rows.
// Shared rows are padded to an odd stride, so phase A's lane-per-row reads hit 32 banks.
//
// Forward, per query row i over key tiles (m, l running max and sum):
//   s_ij = scale q_i.k_j;  m' = max(m, max_j s_ij);  p_ij = exp(s_ij - m');
//   l = l exp(m - m') + sum_j p_ij;  o_i = o_i exp(m - m') + sum_j p_ij v_j;  m = m'
//   out_i = o_i / l;  lse_i = m + log l
// Backward (as kernels/cpu/attention.c), in three kernels, no atomics:
//   Di = sum_d dO_id O_id                                    (flash_bwd_di_kernel)
//   per key block, over all query tiles:                     (flash_bwd_dkdv_kernel)
//     p_ij = exp(s_ij - lse_i); ds_ij = p_ij (dO_i.v_j - Di)
//     dv_j += sum_i p_ij dO_i;  dk_j += scale sum_i ds_ij q_i
//   per query block, over all key tiles: dq_i += scale sum_j ds_ij k_j   (flash_bwd_dq_kernel)
// Each output element is summed by one thread in a fixed order and added once into dqkv.
#include "attention_internal.h"
#include <math.h>
#include <stdint.h>
#include <type_traits>

namespace {

constexpr int WARPS = 4;
constexpr int THREADS = WARPS * 32;
constexpr int R = 8;                 // rows per warp
constexpr int TILE = WARPS * R;      // rows per block, and rows per tile of the other side (32)
static_assert(TILE == 32, "phase A maps one lane to one row of a 32-row tile");

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) {
    return __float2bfloat16_rn(x);
}

__device__ __forceinline__ float warp_max(float x) {
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}
__device__ __forceinline__ float warp_sum(float x) {
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

// Odd row stride of the shared tiles: lane l reading row l, column d hits bank (l*DP + d) % 32.
__host__ __device__ inline int padded(int D) { return D % 2 == 0 ? D + 1 : D; }

// rows [r0, r0+32) of one (b, h) part of qkv (row stride ld) into tile (32 x DP), zero past N.
template <typename T>
__device__ void load_tile(float *tile, const T *src, size_t ld, int r0, int N, int D, int DP) {
    for (int idx = threadIdx.x; idx < TILE * D; idx += THREADS) {
        int r = idx / D, d = idx - r * D, n = r0 + r;
        tile[r * DP + d] = n < N ? to_f32(src[(size_t)n * ld + d]) : 0.0f;
    }
}

// ---- forward ---------------------------------------------------------------------------------
// grid (ceil(N/32), H, B). smem: Qs, Ks, Vs (32 x DP each), Ps (WARPS x R x 32).
template <typename T, int DMAX>
__global__ void __launch_bounds__(THREADS)
flash_fwd_kernel(const T *__restrict__ qkv, T *__restrict__ out, float *__restrict__ lse, int N,
                 int H, int D, float scale) {
    constexpr int CH = DMAX / 32;   // channels per lane in phase B
    extern __shared__ float smem[];
    const int DP = padded(D);
    float *Qs = smem, *Ks = Qs + TILE * DP, *Vs = Ks + TILE * DP, *Ps = Vs + TILE * DP;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int b = blockIdx.z, h = blockIdx.y, q0 = blockIdx.x * TILE;
    const int C = H * D;
    const size_t ld = 3 * (size_t)C;
    const T *Q = qkv + (size_t)b * N * ld + (size_t)h * D, *K = Q + C, *V = Q + 2 * C;

    load_tile(Qs, Q, ld, q0, N, D, DP);
    float m[R], l[R], acc[R][CH];
#pragma unroll
    for (int r = 0; r < R; r++) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
#pragma unroll
        for (int c = 0; c < CH; c++) acc[r][c] = 0.0f;
    }
    const float *Qw = Qs + warp * R * DP;
    float *Pw = Ps + warp * R * TILE;

    for (int k0 = 0; k0 < N; k0 += TILE) {
        __syncthreads();   // the previous tile is consumed (and Qs is loaded, first time)
        load_tile(Ks, K, ld, k0, N, D, DP);
        load_tile(Vs, V, ld, k0, N, D, DP);
        __syncthreads();
        // phase A: lane = key k0 + lane
        const bool kvalid = k0 + lane < N;
        float s[R];
#pragma unroll
        for (int r = 0; r < R; r++) s[r] = 0.0f;
        const float *kr = Ks + lane * DP;
        for (int d = 0; d < D; d++) {
            float kv = kr[d];
#pragma unroll
            for (int r = 0; r < R; r++) s[r] = fmaf(Qw[r * DP + d], kv, s[r]);
        }
#pragma unroll
        for (int r = 0; r < R; r++) {
            float x = kvalid ? s[r] * scale : -INFINITY;
            float mnew = fmaxf(m[r], warp_max(x));   // finite: key k0 is valid
            float p = kvalid ? __expf(x - mnew) : 0.0f;
            float corr = __expf(m[r] - mnew);        // 0 on the first tile (m = -inf)
            l[r] = l[r] * corr + warp_sum(p);
            m[r] = mnew;
#pragma unroll
            for (int c = 0; c < CH; c++) acc[r][c] *= corr;
            Pw[r * TILE + lane] = p;
        }
        __syncwarp();
        // phase B: lane = channel
        const int jmax = min(TILE, N - k0);
        for (int j = 0; j < jmax; j++) {
            float v[CH];
#pragma unroll
            for (int c = 0; c < CH; c++) {
                int d = c * 32 + lane;
                v[c] = d < D ? Vs[j * DP + d] : 0.0f;
            }
#pragma unroll
            for (int r = 0; r < R; r++) {
                float p = Pw[r * TILE + j];
#pragma unroll
                for (int c = 0; c < CH; c++) acc[r][c] = fmaf(p, v[c], acc[r][c]);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
        int n = q0 + warp * R + r;
        if (n >= N) continue;
        float inv = 1.0f / l[r];
        T *o = out + ((size_t)b * N + n) * C + (size_t)h * D;
#pragma unroll
        for (int c = 0; c < CH; c++) {
            int d = c * 32 + lane;
            if (d < D) o[d] = from_f32<T>(acc[r][c] * inv);
        }
        if (lane == 0) lse[((size_t)b * H + h) * N + n] = m[r] + logf(l[r]);
    }
}

// ---- backward ------------------------------------------------------------------------------------
// Di (B,H,N) = sum_d dout * out, one warp per (b, n, h) row.
template <typename T>
__global__ void flash_bwd_di_kernel(const T *__restrict__ dout, const T *__restrict__ out,
                                    float *__restrict__ di, int B, int N, int H, int D) {
    const size_t rows = (size_t)B * N * H;
    const int lane = threadIdx.x % 32;
    for (size_t row = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) / 32; row < rows;
         row += (size_t)gridDim.x * blockDim.x / 32) {
        const size_t off = row * D;   // (b, n, h) rows of D are contiguous in (B,N,C)
        float s = 0.0f;
        for (int d = lane; d < D; d += 32) s = fmaf(to_f32(dout[off + d]), to_f32(out[off + d]), s);
        s = warp_sum(s);
        if (lane == 0) {
            size_t h = row % H, n = (row / H) % N, b = row / ((size_t)H * N);
            di[(b * H + h) * N + n] = s;
        }
    }
}

// dk, dv of 32 keys. grid (ceil(N/32), H, B). smem: Ks, Vs (this block's keys), Qs, dOs (query
// tile), Ls, Ds (32 each), Ps, dSs (WARPS x R x 32 each).
template <typename T, int DMAX>
__global__ void __launch_bounds__(THREADS)
flash_bwd_dkdv_kernel(const T *__restrict__ qkv, const T *__restrict__ dout,
                      const float *__restrict__ lse, const float *__restrict__ di,
                      T *__restrict__ dqkv, int N, int H, int D, float scale) {
    constexpr int CH = DMAX / 32;
    extern __shared__ float smem[];
    const int DP = padded(D);
    float *Ks = smem, *Vs = Ks + TILE * DP, *Qs = Vs + TILE * DP, *dOs = Qs + TILE * DP;
    float *Ls = dOs + TILE * DP, *Ds = Ls + TILE, *Ps = Ds + TILE, *dSs = Ps + WARPS * R * TILE;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int b = blockIdx.z, h = blockIdx.y, k0 = blockIdx.x * TILE;
    const int C = H * D;
    const size_t ld = 3 * (size_t)C;
    const T *Q = qkv + (size_t)b * N * ld + (size_t)h * D, *K = Q + C, *V = Q + 2 * C;
    const T *dO = dout + (size_t)b * N * C + (size_t)h * D;
    const float *lse_bh = lse + ((size_t)b * H + h) * N, *di_bh = di + ((size_t)b * H + h) * N;

    load_tile(Ks, K, ld, k0, N, D, DP);
    load_tile(Vs, V, ld, k0, N, D, DP);
    float dk[R][CH], dv[R][CH];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int c = 0; c < CH; c++) dk[r][c] = dv[r][c] = 0.0f;
    const float *Kw = Ks + warp * R * DP, *Vw = Vs + warp * R * DP;
    float *Pw = Ps + warp * R * TILE, *dSw = dSs + warp * R * TILE;

    for (int q0 = 0; q0 < N; q0 += TILE) {
        __syncthreads();
        load_tile(Qs, Q, ld, q0, N, D, DP);
        load_tile(dOs, dO, (size_t)C, q0, N, D, DP);
        if (threadIdx.x < TILE) {
            int n = q0 + threadIdx.x;
            Ls[threadIdx.x] = n < N ? lse_bh[n] : 0.0f;
            Ds[threadIdx.x] = n < N ? di_bh[n] : 0.0f;
        }
        __syncthreads();
        // phase A: lane = query q0 + lane
        const bool qvalid = q0 + lane < N;
        float s[R], dp[R];
#pragma unroll
        for (int r = 0; r < R; r++) s[r] = dp[r] = 0.0f;
        const float *qi = Qs + lane * DP, *doi = dOs + lane * DP;
        for (int d = 0; d < D; d++) {
            float qv = qi[d], dov = doi[d];
#pragma unroll
            for (int r = 0; r < R; r++) {
                s[r] = fmaf(qv, Kw[r * DP + d], s[r]);
                dp[r] = fmaf(dov, Vw[r * DP + d], dp[r]);
            }
        }
        const float lse_i = Ls[lane], di_i = Ds[lane];
#pragma unroll
        for (int r = 0; r < R; r++) {
            float p = qvalid ? __expf(s[r] * scale - lse_i) : 0.0f;
            Pw[r * TILE + lane] = p;
            dSw[r * TILE + lane] = p * (dp[r] - di_i);
        }
        __syncwarp();
        // phase B: lane = channel
        const int imax = min(TILE, N - q0);
        for (int i = 0; i < imax; i++) {
            float qv[CH], dov[CH];
#pragma unroll
            for (int c = 0; c < CH; c++) {
                int d = c * 32 + lane;
                qv[c] = d < D ? Qs[i * DP + d] : 0.0f;
                dov[c] = d < D ? dOs[i * DP + d] : 0.0f;
            }
#pragma unroll
            for (int r = 0; r < R; r++) {
                float p = Pw[r * TILE + i], ds = dSw[r * TILE + i];
#pragma unroll
                for (int c = 0; c < CH; c++) {
                    dv[r][c] = fmaf(p, dov[c], dv[r][c]);
                    dk[r][c] = fmaf(ds, qv[c], dk[r][c]);
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
        int n = k0 + warp * R + r;
        if (n >= N) continue;
        T *dK = dqkv + ((size_t)b * N + n) * ld + C + (size_t)h * D, *dV = dK + C;
#pragma unroll
        for (int c = 0; c < CH; c++) {
            int d = c * 32 + lane;
            if (d < D) {
                dK[d] = from_f32<T>(to_f32(dK[d]) + scale * dk[r][c]);
                dV[d] = from_f32<T>(to_f32(dV[d]) + dv[r][c]);
            }
        }
    }
}

// dq of 32 queries. grid (ceil(N/32), H, B). smem: Qs, dOs (this block's queries), Ks, Vs (key
// tile), dSs (WARPS x R x 32).
template <typename T, int DMAX>
__global__ void __launch_bounds__(THREADS)
flash_bwd_dq_kernel(const T *__restrict__ qkv, const T *__restrict__ dout,
                    const float *__restrict__ lse, const float *__restrict__ di,
                    T *__restrict__ dqkv, int N, int H, int D, float scale) {
    constexpr int CH = DMAX / 32;
    extern __shared__ float smem[];
    const int DP = padded(D);
    float *Qs = smem, *dOs = Qs + TILE * DP, *Ks = dOs + TILE * DP, *Vs = Ks + TILE * DP;
    float *dSs = Vs + TILE * DP;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int b = blockIdx.z, h = blockIdx.y, q0 = blockIdx.x * TILE;
    const int C = H * D;
    const size_t ld = 3 * (size_t)C;
    const T *Q = qkv + (size_t)b * N * ld + (size_t)h * D, *K = Q + C, *V = Q + 2 * C;
    const T *dO = dout + (size_t)b * N * C + (size_t)h * D;
    const float *lse_bh = lse + ((size_t)b * H + h) * N, *di_bh = di + ((size_t)b * H + h) * N;

    load_tile(Qs, Q, ld, q0, N, D, DP);
    load_tile(dOs, dO, (size_t)C, q0, N, D, DP);
    float dq[R][CH], lse_r[R], di_r[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        int n = min(q0 + warp * R + r, N - 1);   // rows past N compute junk, never stored
        lse_r[r] = lse_bh[n];
        di_r[r] = di_bh[n];
#pragma unroll
        for (int c = 0; c < CH; c++) dq[r][c] = 0.0f;
    }
    const float *Qw = Qs + warp * R * DP, *dOw = dOs + warp * R * DP;
    float *dSw = dSs + warp * R * TILE;

    for (int k0 = 0; k0 < N; k0 += TILE) {
        __syncthreads();
        load_tile(Ks, K, ld, k0, N, D, DP);
        load_tile(Vs, V, ld, k0, N, D, DP);
        __syncthreads();
        // phase A: lane = key k0 + lane
        const bool kvalid = k0 + lane < N;
        float s[R], dp[R];
#pragma unroll
        for (int r = 0; r < R; r++) s[r] = dp[r] = 0.0f;
        const float *kj = Ks + lane * DP, *vj = Vs + lane * DP;
        for (int d = 0; d < D; d++) {
            float kv = kj[d], vv = vj[d];
#pragma unroll
            for (int r = 0; r < R; r++) {
                s[r] = fmaf(Qw[r * DP + d], kv, s[r]);
                dp[r] = fmaf(dOw[r * DP + d], vv, dp[r]);
            }
        }
#pragma unroll
        for (int r = 0; r < R; r++) {
            float p = kvalid ? __expf(s[r] * scale - lse_r[r]) : 0.0f;
            dSw[r * TILE + lane] = p * (dp[r] - di_r[r]);
        }
        __syncwarp();
        // phase B: lane = channel
        const int jmax = min(TILE, N - k0);
        for (int j = 0; j < jmax; j++) {
            float kv[CH];
#pragma unroll
            for (int c = 0; c < CH; c++) {
                int d = c * 32 + lane;
                kv[c] = d < D ? Ks[j * DP + d] : 0.0f;
            }
#pragma unroll
            for (int r = 0; r < R; r++) {
                float ds = dSw[r * TILE + j];
#pragma unroll
                for (int c = 0; c < CH; c++) dq[r][c] = fmaf(ds, kv[c], dq[r][c]);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
        int n = q0 + warp * R + r;
        if (n >= N) continue;
        T *dQ = dqkv + ((size_t)b * N + n) * ld + (size_t)h * D;
#pragma unroll
        for (int c = 0; c < CH; c++) {
            int d = c * 32 + lane;
            if (d < D) dQ[d] = from_f32<T>(to_f32(dQ[d]) + scale * dq[r][c]);
        }
    }
}

// dst += src; 8 elements (16 bytes of bf16, 32 of fp32) per thread where aligned.
template <typename T>
__global__ void accumulate_kernel(const T *__restrict__ src, T *__restrict__ dst, size_t n) {
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += stride)
        dst[i] = from_f32<T>(to_f32(dst[i]) + to_f32(src[i]));
}
__global__ void accumulate_bf16x8_kernel(const uint4 *__restrict__ src, uint4 *__restrict__ dst,
                                         size_t n8) {
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n8; i += stride) {
        uint4 a = dst[i], s = src[i];
        __nv_bfloat162 *pa = reinterpret_cast<__nv_bfloat162 *>(&a);
        const __nv_bfloat162 *ps = reinterpret_cast<const __nv_bfloat162 *>(&s);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            float2 fa = __bfloat1622float2(pa[k]), fs = __bfloat1622float2(ps[k]);
            pa[k] = __floats2bfloat162_rn(fa.x + fs.x, fa.y + fs.y);
        }
        dst[i] = a;
    }
}

// ---- launch ------------------------------------------------------------------------------------
size_t fwd_smem(int D) { return sizeof(float) * (3 * TILE * padded(D) + WARPS * R * TILE); }
size_t dkdv_smem(int D) {
    return sizeof(float) * (4 * TILE * padded(D) + 2 * TILE + 2 * WARPS * R * TILE);
}
size_t dq_smem(int D) { return sizeof(float) * (4 * TILE * padded(D) + WARPS * R * TILE); }

template <typename Kernel>
void set_smem(Kernel kernel, size_t bytes) {
    if (bytes > 48 * 1024)
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        (int)bytes));
}

template <typename T, int DMAX>
void launch_fwd(cudaStream_t st, const AttnDims &a, const void *qkv, void *out, float *lse) {
    dim3 grid((a.N + TILE - 1) / TILE, a.H, a.B);
    size_t smem = fwd_smem(a.D);
    set_smem(flash_fwd_kernel<T, DMAX>, smem);
    flash_fwd_kernel<T, DMAX><<<grid, THREADS, smem, st>>>((const T *)qkv, (T *)out, lse, a.N,
                                                           a.H, a.D, a.scale);
    CUDA_CHECK_LAUNCH();
}

template <typename T, int DMAX>
void launch_bwd(cudaStream_t st, const AttnDims &a, const void *dout, const void *qkv,
                const void *out, const float *lse, void *dqkv, float *di) {
    size_t rows = (size_t)a.B * a.N * a.H;
    int blocks = (int)((rows + 7) / 8 < 65536 ? (rows + 7) / 8 : 65536);   // 8 warps a block
    flash_bwd_di_kernel<T><<<blocks, 256, 0, st>>>((const T *)dout, (const T *)out, di, a.B, a.N,
                                                    a.H, a.D);
    CUDA_CHECK_LAUNCH();
    dim3 grid((a.N + TILE - 1) / TILE, a.H, a.B);
    size_t smem = dkdv_smem(a.D);
    set_smem(flash_bwd_dkdv_kernel<T, DMAX>, smem);
    flash_bwd_dkdv_kernel<T, DMAX><<<grid, THREADS, smem, st>>>(
        (const T *)qkv, (const T *)dout, lse, di, (T *)dqkv, a.N, a.H, a.D, a.scale);
    CUDA_CHECK_LAUNCH();
    smem = dq_smem(a.D);
    set_smem(flash_bwd_dq_kernel<T, DMAX>, smem);
    flash_bwd_dq_kernel<T, DMAX><<<grid, THREADS, smem, st>>>(
        (const T *)qkv, (const T *)dout, lse, di, (T *)dqkv, a.N, a.H, a.D, a.scale);
    CUDA_CHECK_LAUNCH();
}

// Calls f(T{}, integral_constant<int, DMAX>) for the dtype and the smallest DMAX >= D.
template <typename F>
void dispatch(const AttnDims &a, F &&f) {
    CG_CHECK(a.D <= FLASH_MAX_HEAD_DIM, "use heads so that head_dim = width / heads <= 256",
             "attention on the GPU: head_dim %d is above the fallback kernels' limit of %d", a.D,
             FLASH_MAX_HEAD_DIM);
    auto by_dim = [&](auto type_tag) {
        if (a.D <= 32) f(type_tag, std::integral_constant<int, 32>{});
        else if (a.D <= 64) f(type_tag, std::integral_constant<int, 64>{});
        else if (a.D <= 128) f(type_tag, std::integral_constant<int, 128>{});
        else f(type_tag, std::integral_constant<int, 256>{});
    };
    if (a.dtype == DTYPE_F32) by_dim(float{});
    else by_dim(__nv_bfloat16{});
}

}   // namespace

void flash_attention_fwd(cudaStream_t stream, const AttnDims &a, const void *qkv, void *out,
                         float *lse) {
    if (a.B == 0 || a.N == 0) return;
    dispatch(a, [&](auto type_tag, auto dmax) {
        launch_fwd<decltype(type_tag), decltype(dmax)::value>(stream, a, qkv, out, lse);
    });
}

void flash_attention_bwd(cudaStream_t stream, const AttnDims &a, const void *dout,
                         const void *qkv, const void *out, const float *lse, void *dqkv,
                         float *di) {
    if (a.B == 0 || a.N == 0) return;
    dispatch(a, [&](auto type_tag, auto dmax) {
        launch_bwd<decltype(type_tag), decltype(dmax)::value>(stream, a, dout, qkv, out, lse,
                                                               dqkv, di);
    });
}

void attn_accumulate(cudaStream_t stream, DType dtype, const void *src, void *dst, size_t n) {
    if (n == 0) return;
    const int threads = 256;
    auto blocks_for = [&](size_t items) {
        size_t b = (items + threads - 1) / threads;
        return (int)(b < 4096 ? b : 4096);
    };
    if (dtype == DTYPE_BF16 && n % 8 == 0 && (uintptr_t)src % 16 == 0 && (uintptr_t)dst % 16 == 0) {
        accumulate_bf16x8_kernel<<<blocks_for(n / 8), threads, 0, stream>>>(
            (const uint4 *)src, (uint4 *)dst, n / 8);
    } else if (dtype == DTYPE_BF16) {
        accumulate_kernel<__nv_bfloat16><<<blocks_for(n), threads, 0, stream>>>(
            (const __nv_bfloat16 *)src, (__nv_bfloat16 *)dst, n);
    } else {
        accumulate_kernel<float><<<blocks_for(n), threads, 0, stream>>>((const float *)src,
                                                                        (float *)dst, n);
    }
    CUDA_CHECK_LAUNCH();
}
