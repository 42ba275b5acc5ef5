// C-GSPN propagation on the GPU (DESIGN §5 steps 3-5; contract in kernels/ops.h; the CPU
// reference is kernels/cpu/gspn_scan.c).
//
// Work split (both passes): a block owns one image b and a group of CG channels for ALL lanes of a
// line (the W columns of a row for TB/BT, the H rows of a column for LR/RL) and loops over the
// steps of the scan; a line's lanes depend on each other through the neighbour weights, so a line
// cannot be split across blocks without inter-block exchange. Channels-last makes each token's CG
// channels one contiguous run (32, 64 or 128 bytes), so loads are whole sectors.
//
// Three kernel families:
// - pipelined (the fast path for per-channel weights: Cc a multiple of 4, 16-byte aligned data, a
//   line of at most 2048 (fwd, two items a thread) / 608 (bwd) work items): ONE launch for the
//   four directions, blockIdx.x = (image, channel group) * 4 + direction. Each thread owns one or
//   two (lane, 4 or 8 channels) items and copies their inputs for step s+D-1 into a shared-memory
//   stage with cp.async while it computes step s. The backward also stages h[s-1], which the two
//   neighbour lanes read after the step's barrier.
// - staged shared-weight (gspn_shared_w = 1, a token's xc a whole number of 4-byte words): ONE
//   launch for the four directions, the direction's odd-offset gate chunk of every lane copied as
//   4-byte words, consecutive words on consecutive threads (see gspn_fwd_sh_kernel).
// - simple (odd Cc, longer lines, too little shared memory, or stages = 1): one launch per
//   direction on the context's side streams (concurrent), loads issued at the top of each step.
// Forward step: h of the previous step lives in shared memory ((N+2) x CG floats with a zero halo
//   lane each side, double buffered: one barrier per step); the sigmoid and row-stochastic
//   normalization are computed in registers (the weights are never written); h (fp32) goes to
//   `hidden` and y_d = u_d h_d (activation dtype) to a scratch slice. An elementwise kernel then
//   merges yc = sum_d m_d y_d in the fixed order TB, BT, LR, RL: no atomics, yc is reproducible.
// Backward step (reverse scan): dL/dh of step s is m_d u dyc plus the transposed weights of step
//   s+1, which the block keeps in shared memory (w_{-1} dh and w_{+1} dh of every lane, double
//   buffered; w_0 dh stays with its owner). Gate gradients are added into dgates in place (each
//   element has one owner), or written without reading dgates (gspn_scan_bwd_write, the tape's
//   case; the pipelined kernel then stages 7 slots per item instead of 12, so deeper pipelines
//   fit). dxc needs sum_d lam_d dh_d: each direction writes its own slice and an
//   elementwise kernel adds them in the fixed order; dmerge is reduced per block in fp64 and the
//   block partials summed in a fixed order, one warp per direction. Bitwise deterministic.
//
// The channel group, vector width and pipeline depth are chosen per call (auto_tuning,
// pipe_stages): measured on an H200, fewer channels per thread, wider groups (whole 128-byte
// token rows in the forward where a line fits) and at most ~160 KB of shared memory per SM win.
// bf16 uses the approximate exp / reciprocal units: with IEEE division everywhere the kernels
// were instruction-bound (ncu: issue ~53%).
//
// Bytes per element (one token-channel) for bf16 activations and per-channel weights, G = 20 Cc:
//   what must move, forward:  xc 2 + gates 40 + yc 2 + hidden 16 (fp32, 4 directions)   =  60
//   what this moves, forward: xc 4x2 + gates 40 + hidden 16 + y_d 4x2 (write, then read) + yc 2
//                                                                                        =  82
//   what must move, backward: dyc 2 + xc 2 + gates 40 + hidden 16 + dxc 2 + dgates 40   = 102
//     (+ dxc 2 + dgates 40 read back, since backward accumulates into them               = 144)
//   what this moves, backward: dyc 4x2 + xc 4x2 + gates 40 + hidden 16 + dgates 40 +
//     dxc_d 4x2 (write, then read) + dxc 2                    (gspn_scan_bwd_write)      = 130
//     (gspn_scan_bwd, accumulating: + dgates 40 + dxc 2 read back                        = 172)
// The extra reads of xc / dyc (one per direction) and the y_d / dxc_d round trip are the price of
// running the directions as separate scans without float atomics; the whole H x W plane of a
// channel group would have to stay on chip to avoid them, which it does not at 74^2 and up.
// Pairing scans does not help: TB reaches row i at step i, BT at step H-1-i, so whichever comes
// second needs the first one's y (or xc) for every row, i.e. the same round trip; only a scan
// that also writes the final yc saves bytes, and that serializes directions. So even at the copy
// rate the forward reaches at most 60/82 = 73% and the writing backward 102/130 = 78% (the
// accumulating one 144/172 = 84% counting the += reads) of the copy bandwidth on the bytes that
// must move (gspn_scan_notes.md).
//
// hidden: the forward saves h (fp32) when given `hidden`; the backward recomputes it into scratch
// when called with hidden == NULL (a second forward scan: 42 bytes read and 16 written per element
// instead of 16 read, so saving is the fast path and recompute the memory-saving one).
#include "cuda_common.h"
#include "../ops.h"
#include <stdint.h>

namespace {

constexpr int DIRS = 4;
constexpr float S_MIN = 1e-7f;            // w_k = a_k / max(S, S_MIN), as the CPU reference
constexpr int SCAN_THREADS_MAX = 512;     // threads per scan block (lanes beyond loop)
constexpr int EW_THREADS = 256;           // elementwise kernels
// Pipelined kernels: one item per thread, so a whole line must fit one block. Their register
// needs set the bound: 16-byte vectors (8 bf16 channels a thread) ~80 (fwd) / ~155 (bwd);
// 8-byte vectors (4 channels) ~56 / ~104, which allows bigger blocks.
template <typename T, int V>
struct PipeThreads {
    static constexpr bool narrow = V * sizeof(T) == 8;
    static constexpr int fwd = narrow ? 1024 : 512;
    static constexpr int bwd = narrow ? 608 : 384;
};
constexpr int BWD_RED_WARPS = 32;         // block reduction slots (up to 1024 threads)

// ---- loads and stores of V consecutive elements, converted to / from fp32 ----------------------
__device__ __forceinline__ float bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);   // .x (low half) = lo
    return *reinterpret_cast<uint32_t *>(&v);
}
__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) {
    return __float2bfloat16_rn(x);
}

// 32-bit words -> V floats
template <typename T, int V, int NW>
__device__ __forceinline__ void unpack(const uint32_t (&w)[NW], float (&o)[V]) {
    if constexpr (sizeof(T) == 4) {
#pragma unroll
        for (int i = 0; i < V; i++) o[i] = __uint_as_float(w[i]);
    } else {
#pragma unroll
        for (int i = 0; i < V / 2; i++) {
            o[2 * i] = bf16_lo(w[i]);
            o[2 * i + 1] = bf16_hi(w[i]);
        }
    }
}
template <typename T, int V, int NW>
__device__ __forceinline__ void pack(const float (&v)[V], uint32_t (&w)[NW]) {
    if constexpr (sizeof(T) == 4) {
#pragma unroll
        for (int i = 0; i < V; i++) w[i] = __float_as_uint(v[i]);
    } else {
#pragma unroll
        for (int i = 0; i < V / 2; i++) w[i] = pack_bf16(v[2 * i], v[2 * i + 1]);
    }
}

// Read-only load of V elements; p aligned to V * sizeof(T) when that is 4, 8 or 16 bytes.
template <typename T, int V>
__device__ __forceinline__ void ldv(const T *p, float (&o)[V]) {
    constexpr int BYTES = V * (int)sizeof(T);
    if constexpr (BYTES == 16) {
        uint4 r = __ldg(reinterpret_cast<const uint4 *>(p));
        uint32_t w[4] = {r.x, r.y, r.z, r.w};
        unpack<T, V>(w, o);
    } else if constexpr (BYTES == 8) {
        uint2 r = __ldg(reinterpret_cast<const uint2 *>(p));
        uint32_t w[2] = {r.x, r.y};
        unpack<T, V>(w, o);
    } else {
#pragma unroll
        for (int i = 0; i < V; i++) o[i] = to_f32(p[i]);
    }
}
// Plain load (the buffer is written by this kernel too: no read-only path).
template <typename T, int V>
__device__ __forceinline__ void ldv_rw(const T *p, float (&o)[V]) {
    constexpr int BYTES = V * (int)sizeof(T);
    if constexpr (BYTES == 16) {
        uint4 r = *reinterpret_cast<const uint4 *>(p);
        uint32_t w[4] = {r.x, r.y, r.z, r.w};
        unpack<T, V>(w, o);
    } else if constexpr (BYTES == 8) {
        uint2 r = *reinterpret_cast<const uint2 *>(p);
        uint32_t w[2] = {r.x, r.y};
        unpack<T, V>(w, o);
    } else {
#pragma unroll
        for (int i = 0; i < V; i++) o[i] = to_f32(p[i]);
    }
}
// Unaligned: element by element (the shared-weight gate layout has odd offsets).
template <typename T, int V>
__device__ __forceinline__ void ldv_unaligned(const T *p, float (&o)[V]) {
#pragma unroll
    for (int i = 0; i < V; i++) o[i] = to_f32(p[i]);
}
template <typename T, int V>
__device__ __forceinline__ void stv(T *p, const float (&v)[V]) {
    constexpr int BYTES = V * (int)sizeof(T);
    if constexpr (BYTES == 16) {
        uint32_t w[4];
        pack<T, V>(v, w);
        *reinterpret_cast<uint4 *>(p) = make_uint4(w[0], w[1], w[2], w[3]);
    } else if constexpr (BYTES == 8) {
        uint32_t w[2];
        pack<T, V>(v, w);
        *reinterpret_cast<uint2 *>(p) = make_uint2(w[0], w[1]);
    } else {
#pragma unroll
        for (int i = 0; i < V; i++) p[i] = from_f32<T>(v[i]);
    }
}
template <typename T, int V>
__device__ __forceinline__ void stv_unaligned(T *p, const float (&v)[V]) {
#pragma unroll
    for (int i = 0; i < V; i++) p[i] = from_f32<T>(v[i]);
}
// fp32 vectors (hidden, shared memory): V floats, 16-byte pieces when V % 4 == 0.
template <int V>
__device__ __forceinline__ void ldf(const float *p, float (&o)[V]) {
    if constexpr (V % 4 == 0) {
#pragma unroll
        for (int i = 0; i < V; i += 4) {
            float4 r = *reinterpret_cast<const float4 *>(p + i);
            o[i] = r.x; o[i + 1] = r.y; o[i + 2] = r.z; o[i + 3] = r.w;
        }
    } else {
#pragma unroll
        for (int i = 0; i < V; i++) o[i] = p[i];
    }
}
template <int V>
__device__ __forceinline__ void ldf_ro(const float *p, float (&o)[V]) {
    if constexpr (V % 4 == 0) {
#pragma unroll
        for (int i = 0; i < V; i += 4) {
            float4 r = __ldg(reinterpret_cast<const float4 *>(p + i));
            o[i] = r.x; o[i + 1] = r.y; o[i + 2] = r.z; o[i + 3] = r.w;
        }
    } else {
#pragma unroll
        for (int i = 0; i < V; i++) o[i] = __ldg(p + i);
    }
}
template <int V>
__device__ __forceinline__ void stf(float *p, const float (&v)[V]) {
    if constexpr (V % 4 == 0) {
#pragma unroll
        for (int i = 0; i < V; i += 4)
            *reinterpret_cast<float4 *>(p + i) = make_float4(v[i], v[i + 1], v[i + 2], v[i + 3]);
    } else {
#pragma unroll
        for (int i = 0; i < V; i++) p[i] = v[i];
    }
}
// Streaming store (hidden is read back only by the backward pass).
template <int V>
__device__ __forceinline__ void stf_stream(float *p, const float (&v)[V]) {
    if constexpr (V % 4 == 0) {
#pragma unroll
        for (int i = 0; i < V; i += 4)
            __stcs(reinterpret_cast<float4 *>(p + i), make_float4(v[i], v[i + 1], v[i + 2], v[i + 3]));
    } else {
#pragma unroll
        for (int i = 0; i < V; i++) __stcs(p + i, v[i]);
    }
}

// ---- the weights (DESIGN §5 step 3) --------------------------------------------------------
// fp32 activations use the accurate expf and IEEE division (the fp32 path is held to 1e-5 against
// the CPU); bf16 ones the approximate exp2 / reciprocal units (~2 ulp, far below bf16 rounding of
// the gates). The scans are instruction-bound when every reciprocal is the IEEE sequence (about a
// dozen instructions; ncu: issue-active ~53%, "wait" stalls on top), so this matters.
template <typename T>
__device__ __forceinline__ float recip(float x) {
    if constexpr (sizeof(T) == 4) return 1.0f / x;
    else return __fdividef(1.0f, x);
}
template <typename T>
__device__ __forceinline__ float sigmoid(float x) {
    if constexpr (sizeof(T) == 4) return 1.0f / (1.0f + expf(-x));
    else return __fdividef(1.0f, 1.0f + __expf(-x));
}

// a_k = sigmoid(wt_k) for neighbours that exist (else 0), S their sum, w_k = a_k / max(S, S_MIN).
template <typename T>
__device__ __forceinline__ float weights(float wm, float w0, float wp, bool has_m, bool has_p,
                                         float (&a)[3], float (&w)[3]) {
    a[0] = has_m ? sigmoid<T>(wm) : 0.0f;
    a[1] = sigmoid<T>(w0);
    a[2] = has_p ? sigmoid<T>(wp) : 0.0f;
    const float S = a[0] + a[1] + a[2];
    const float inv = recip<T>(fmaxf(S, S_MIN));
#pragma unroll
    for (int k = 0; k < 3; k++) w[k] = a[k] * inv;
    return S;
}

// dL/dwt from dL/dw through the normalization (as the CPU reference's weights_backward). For
// S > S_MIN the weights are a_k / S, so 1/S = w_k / a_k is already known: w_1 / a_1 (a_1, the
// centre, always exists and is > 0). fp32 divides as the reference does.
template <typename T>
__device__ __forceinline__ void weights_bwd(const float (&a)[3], const float (&w)[3], float S,
                                            const float (&dw)[3], float (&dwt)[3]) {
    if (S > S_MIN) {
        const float mean = w[0] * dw[0] + w[1] * dw[1] + w[2] * dw[2];
        if constexpr (sizeof(T) == 4) {
#pragma unroll
            for (int k = 0; k < 3; k++) dwt[k] = a[k] * (1.0f - a[k]) * (dw[k] - mean) / S;
        } else {
            const float invS = recip<T>(S);
#pragma unroll
            for (int k = 0; k < 3; k++) dwt[k] = a[k] * (1.0f - a[k]) * (dw[k] - mean) * invS;
        }
    } else {
#pragma unroll
        for (int k = 0; k < 3; k++) dwt[k] = a[k] * (1.0f - a[k]) * dw[k] * (1.0f / S_MIN);
    }
}

__device__ __forceinline__ float load_param(const void *p, int bf16, int i) {
    return bf16 ? __bfloat162float(static_cast<const __nv_bfloat16 *>(p)[i])
                : static_cast<const float *>(p)[i];
}

// ---- geometry -------------------------------------------------------------------------------
// Direction d as (step s, lane l): token = first + s * sstride + l * lstride within an image; the
// neighbour k of (s, l) is (s-1, l+k). TB: rows down, lanes = columns; BT: rows up; LR: columns
// right, lanes = rows; RL: columns left.
struct DirGeom {
    int d;
    int N, L;                           // lanes, steps
    long long first, sstride, lstride;  // in tokens, within one image
    long long img_tokens;               // H * W
    int Cc, G, goff;                    // channels, gates per token, direction d's first gate
    int CG, ngroups, nvg;               // channels per block, blocks per image, vectors per item
    int items;                          // work items per block and step
};

// Per-channel: item = (lane, one vector of V channels of the block's group).
// Shared weights: item = lane, all Cc channels (CG = Cc), so the weight gradient's sum over the
// channels stays in one thread.
template <bool SH>
__device__ __forceinline__ void item_of(const DirGeom &g, int e, int &l, int &v0, int &v1, int V) {
    if (SH) {
        l = e; v0 = 0; v1 = g.CG / V;
    } else {
        l = e / g.nvg; v0 = e % g.nvg; v1 = v0 + 1;
    }
}

// ---- forward: one direction -------------------------------------------------------------------
// xc (B,H,W,Cc), gates (B,H,W,G) -> hid (B,H,W,Cc) fp32 or NULL, ypart = u_d * h_d (B,H,W,Cc).
template <typename T, int V, bool SH>
__global__ void __launch_bounds__(SCAN_THREADS_MAX)
gspn_fwd_dir_kernel(const T *__restrict__ xc, const T *__restrict__ gates,
                    float *__restrict__ hid, T *__restrict__ ypart, DirGeom g) {
    extern __shared__ float smem[];     // h of the previous / current step: [2][N+2][CG]
    const int rowf = (g.N + 2) * g.CG;
    for (int i = threadIdx.x; i < 2 * rowf; i += blockDim.x) smem[i] = 0.0f;
    __syncthreads();
    const int b = blockIdx.x / g.ngroups, c0 = (blockIdx.x % g.ngroups) * g.CG;
    const long long img = (long long)b * g.img_tokens;
    const int Cc = g.Cc;

    for (int s = 0; s < g.L; s++) {
        const float *prev = smem + (s & 1) * rowf;
        float *cur = smem + ((s + 1) & 1) * rowf;
        const long long ts = img + g.first + (long long)s * g.sstride;
        for (int e = threadIdx.x; e < g.items; e += blockDim.x) {
            int l, v0, v1;
            item_of<SH>(g, e, l, v0, v1, V);
            const long long t = ts + (long long)l * g.lstride;
            const T *gp = gates + t * g.G + g.goff;
            const bool has_m = l > 0, has_p = l < g.N - 1;
            float sa[3], sw[3];
            if (SH && s > 0)
                weights<T>(to_f32(gp[2 * Cc]), to_f32(gp[2 * Cc + 1]), to_f32(gp[2 * Cc + 2]),
                           has_m, has_p, sa, sw);
            for (int v = v0; v < v1; v++) {
                const int cl = v * V, c = c0 + cl;
                const long long o = t * Cc + c;
                float x[V], lam[V], u[V], h[V];
                ldv<T, V>(xc + o, x);
                if (SH) {
                    ldv_unaligned<T, V>(gp + c, lam);
                    ldv_unaligned<T, V>(gp + Cc + c, u);
                } else {
                    ldv<T, V>(gp + c, lam);
                    ldv<T, V>(gp + Cc + c, u);
                }
#pragma unroll
                for (int i = 0; i < V; i++) h[i] = lam[i] * x[i];
                if (s > 0) {
                    float hm[V], h0[V], hp[V];
                    const float *pr = prev + (l + 1) * g.CG + cl;
                    ldf<V>(pr - g.CG, hm);
                    ldf<V>(pr, h0);
                    ldf<V>(pr + g.CG, hp);
                    if (SH) {
#pragma unroll
                        for (int i = 0; i < V; i++) {
                            h[i] += sw[0] * hm[i];
                            h[i] += sw[1] * h0[i];
                            h[i] += sw[2] * hp[i];
                        }
                    } else {
                        float wm[V], w0[V], wp[V];
                        ldv<T, V>(gp + 2 * Cc + c, wm);
                        ldv<T, V>(gp + 3 * Cc + c, w0);
                        ldv<T, V>(gp + 4 * Cc + c, wp);
#pragma unroll
                        for (int i = 0; i < V; i++) {
                            float a[3], w[3];
                            weights<T>(wm[i], w0[i], wp[i], has_m, has_p, a, w);
                            h[i] += w[0] * hm[i];
                            h[i] += w[1] * h0[i];
                            h[i] += w[2] * hp[i];
                        }
                    }
                }
                stf<V>(cur + (l + 1) * g.CG + cl, h);
                if (hid) stf_stream<V>(hid + o, h);
                float y[V];
#pragma unroll
                for (int i = 0; i < V; i++) y[i] = u[i] * h[i];
                if (ypart) stv<T, V>(ypart + o, y);
            }
        }
        __syncthreads();
    }
}

// yc = sum_d m_d ypart_d, in the fixed order TB, BT, LR, RL.
template <typename T, int V>
__global__ void gspn_merge_kernel(const T *__restrict__ ypart, long long plane, const void *merge,
                                  int merge_bf16, T *__restrict__ yc) {
    const float m0 = load_param(merge, merge_bf16, 0), m1 = load_param(merge, merge_bf16, 1);
    const float m2 = load_param(merge, merge_bf16, 2), m3 = load_param(merge, merge_bf16, 3);
    const long long nvec = plane / V;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < nvec;
         i += (long long)gridDim.x * blockDim.x) {
        const long long o = i * V;
        float y0[V], y1[V], y2[V], y3[V], acc[V];
        ldv<T, V>(ypart + o, y0);
        ldv<T, V>(ypart + plane + o, y1);
        ldv<T, V>(ypart + 2 * plane + o, y2);
        ldv<T, V>(ypart + 3 * plane + o, y3);
#pragma unroll
        for (int k = 0; k < V; k++) {
            acc[k] = m0 * y0[k];
            acc[k] += m1 * y1[k];
            acc[k] += m2 * y2[k];
            acc[k] += m3 * y3[k];
        }
        stv<T, V>(yc + o, acc);
    }
}

// Slots of a pipelined backward stage per item (gspn_bwd_pipe_kernel): 7 inputs, and the 5 old
// dgates when they are added to.
__host__ __device__ constexpr int bwd_stage_slots(int dg_write) { return dg_write ? 7 : 12; }

// ---- backward: one direction -------------------------------------------------------------------
// Reverse scan. dxpart (B,H,W,Cc) = lam_d dh_d or NULL; dgates += the gate gradients of direction
// d or NULL; dmpart[blockIdx.x] = this block's sum of u h dyc, or NULL.
template <typename T, int V, bool SH>
__global__ void __launch_bounds__(SCAN_THREADS_MAX)
gspn_bwd_dir_kernel(const T *__restrict__ dyc, const T *__restrict__ xc,
                    const T *__restrict__ gates, const float *__restrict__ hid,
                    const void *merge, int merge_bf16, T *__restrict__ dxpart,
                    T *__restrict__ dgates, double *__restrict__ dmpart, DirGeom g) {
    // Carries into step s-1 from step s: cm[l] = w_{-1} dh (goes to lane l-1), cp[l] = w_{+1} dh
    // (to lane l+1), both double buffered; c0[l] = w_0 dh (to lane l, read only by its owner).
    extern __shared__ float smem[];
    const int rowf = (g.N + 2) * g.CG;
    float *cm = smem, *cp = smem + 2 * rowf, *c0s = smem + 4 * rowf;
    for (int i = threadIdx.x; i < 5 * rowf; i += blockDim.x) smem[i] = 0.0f;
    __syncthreads();
    const int b = blockIdx.x / g.ngroups, c0 = (blockIdx.x % g.ngroups) * g.CG;
    const long long img = (long long)b * g.img_tokens;
    const int Cc = g.Cc;
    const float m = load_param(merge, merge_bf16, g.d);
    double dm_acc = 0.0;

    for (int k = 0; k < g.L; k++) {
        const int s = g.L - 1 - k;
        const float *rm = cm + (k & 1) * rowf, *rp = cp + (k & 1) * rowf;
        float *wm_s = cm + ((k + 1) & 1) * rowf, *wp_s = cp + ((k + 1) & 1) * rowf;
        const long long ts = img + g.first + (long long)s * g.sstride;
        const long long tsp = ts - g.sstride;   // step s-1 (used only when s > 0)
        for (int e = threadIdx.x; e < g.items; e += blockDim.x) {
            int l, v0, v1;
            item_of<SH>(g, e, l, v0, v1, V);
            const long long t = ts + (long long)l * g.lstride;
            const T *gp = gates + t * g.G + g.goff;
            T *dgp = dgates ? dgates + t * g.G + g.goff : nullptr;
            const bool has_m = l > 0, has_p = l < g.N - 1;
            float sa[3] = {0, 0, 0}, sw[3] = {0, 0, 0}, sS = 0.0f, dws[3] = {0, 0, 0};
            if (SH && s > 0)
                sS = weights<T>(to_f32(gp[2 * Cc]), to_f32(gp[2 * Cc + 1]), to_f32(gp[2 * Cc + 2]),
                                has_m, has_p, sa, sw);
            for (int v = v0; v < v1; v++) {
                const int cl = v * V, c = c0 + cl;
                const long long o = t * Cc + c;
                const int si = (l + 1) * g.CG + cl;   // this lane's slot in shared memory
                float dy[V], x[V], lam[V], u[V], hc[V];
                ldv<T, V>(dyc + o, dy);
                ldv<T, V>(xc + o, x);
                if (SH) {
                    ldv_unaligned<T, V>(gp + c, lam);
                    ldv_unaligned<T, V>(gp + Cc + c, u);
                } else {
                    ldv<T, V>(gp + c, lam);
                    ldv<T, V>(gp + Cc + c, u);
                }
                ldf_ro<V>(hid + o, hc);
                float hm[V], h0[V], hp[V], wtm[V], wt0[V], wtp[V];
#pragma unroll
                for (int i = 0; i < V; i++) hm[i] = h0[i] = hp[i] = wtm[i] = wt0[i] = wtp[i] = 0.0f;
                if (s > 0) {
                    const long long op = (tsp + (long long)l * g.lstride) * Cc + c;
                    ldf_ro<V>(hid + op, h0);
                    if (has_m) ldf_ro<V>(hid + op - g.lstride * Cc, hm);
                    if (has_p) ldf_ro<V>(hid + op + g.lstride * Cc, hp);
                    if (!SH) {
                        ldv<T, V>(gp + 2 * Cc + c, wtm);
                        ldv<T, V>(gp + 3 * Cc + c, wt0);
                        ldv<T, V>(gp + 4 * Cc + c, wtp);
                    }
                }
                float crp[V], cr0[V], crm[V];
                ldf<V>(rp + si - g.CG, crp);   // w_{+1} dh of lane l-1
                ldf<V>(c0s + si, cr0);         // w_0 dh of lane l
                ldf<V>(rm + si + g.CG, crm);   // w_{-1} dh of lane l+1

                float dh[V], dlam[V], du[V], dx[V], nm[V], n0[V], np[V];
                float dwt[3][V];
#pragma unroll
                for (int i = 0; i < V; i++) {
                    dm_acc += (double)u[i] * hc[i] * dy[i];
                    du[i] = m * hc[i] * dy[i];
                    dh[i] = crp[i] + cr0[i] + crm[i] + m * u[i] * dy[i];
                    dx[i] = lam[i] * dh[i];
                    dlam[i] = x[i] * dh[i];
                    const float dw[3] = {dh[i] * hm[i], dh[i] * h0[i], dh[i] * hp[i]};
                    if (SH) {
                        dws[0] += dw[0];
                        dws[1] += dw[1];
                        dws[2] += dw[2];
                        nm[i] = sw[0] * dh[i];
                        n0[i] = sw[1] * dh[i];
                        np[i] = sw[2] * dh[i];
                    } else {
                        float a[3], w[3], gw[3];
                        const float S = weights<T>(wtm[i], wt0[i], wtp[i], has_m, has_p, a, w);
                        weights_bwd<T>(a, w, S, dw, gw);
                        dwt[0][i] = gw[0];
                        dwt[1][i] = gw[1];
                        dwt[2][i] = gw[2];
                        nm[i] = w[0] * dh[i];
                        n0[i] = w[1] * dh[i];
                        np[i] = w[2] * dh[i];
                    }
                }
                if (dxpart) stv<T, V>(dxpart + o, dx);
                if (dgp) {
                    float ol[V], ou[V];
                    if (SH) {
                        ldv_unaligned<T, V>(dgp + c, ol);
                        ldv_unaligned<T, V>(dgp + Cc + c, ou);
                    } else {
                        ldv_rw<T, V>(dgp + c, ol);
                        ldv_rw<T, V>(dgp + Cc + c, ou);
                    }
#pragma unroll
                    for (int i = 0; i < V; i++) {
                        ol[i] += dlam[i];
                        ou[i] += du[i];
                    }
                    if (SH) {
                        stv_unaligned<T, V>(dgp + c, ol);
                        stv_unaligned<T, V>(dgp + Cc + c, ou);
                    } else {
                        stv<T, V>(dgp + c, ol);
                        stv<T, V>(dgp + Cc + c, ou);
                        if (s > 0) {   // at s = 0, h[-1] = 0: the weights have no gradient
#pragma unroll
                            for (int q = 0; q < 3; q++) {
                                float ow[V];
                                ldv_rw<T, V>(dgp + (2 + q) * Cc + c, ow);
#pragma unroll
                                for (int i = 0; i < V; i++) ow[i] += dwt[q][i];
                                stv<T, V>(dgp + (2 + q) * Cc + c, ow);
                            }
                        }
                    }
                }
                if (s > 0) {
                    stf<V>(wm_s + si, nm);
                    stf<V>(wp_s + si, np);
                    stf<V>(c0s + si, n0);
                }
            }
            if (SH && s > 0 && dgp) {
                float gw[3];
                weights_bwd<T>(sa, sw, sS, dws, gw);
#pragma unroll
                for (int q = 0; q < 3; q++)
                    dgp[2 * Cc + q] = from_f32<T>(to_f32(dgp[2 * Cc + q]) + gw[q]);
            }
        }
        __syncthreads();
    }

    if (dmpart) {   // block sum of dm_acc: warps, then the warps in order
        __shared__ double red[SCAN_THREADS_MAX / 32];
        for (int off = 16; off > 0; off >>= 1) dm_acc += __shfl_xor_sync(0xffffffffu, dm_acc, off);
        if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = dm_acc;
        __syncthreads();
        if (threadIdx.x == 0) {
            double sum = 0.0;
            for (int w = 0; w < (int)(blockDim.x + 31) / 32; w++) sum += red[w];
            dmpart[blockIdx.x] = sum;
        }
    }
}

// dxc (+)= ((dxpart_TB + dxpart_BT) + dxpart_LR) + dxpart_RL; write: dxc's old values unread
template <typename T, int V>
__global__ void gspn_dx_finalize_kernel(const T *__restrict__ dxpart, long long plane,
                                        T *__restrict__ dxc, int write) {
    const long long nvec = plane / V;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < nvec;
         i += (long long)gridDim.x * blockDim.x) {
        const long long o = i * V;
        float p0[V], p1[V], p2[V], p3[V], acc[V];
        ldv<T, V>(dxpart + o, p0);
        ldv<T, V>(dxpart + plane + o, p1);
        ldv<T, V>(dxpart + 2 * plane + o, p2);
        ldv<T, V>(dxpart + 3 * plane + o, p3);
        if (write) {
#pragma unroll
            for (int k = 0; k < V; k++) acc[k] = 0.0f;
        } else {
            ldv_rw<T, V>(dxc + o, acc);
        }
#pragma unroll
        for (int k = 0; k < V; k++) acc[k] += ((p0[k] + p1[k]) + p2[k]) + p3[k];
        stv<T, V>(dxc + o, acc);
    }
}

// dmerge[d] += sum over the blocks of direction d of dmpart (one warp per direction, fixed order).
__global__ void gspn_dmerge_finalize_kernel(const double *__restrict__ dmpart, int nblk,
                                            void *dmerge, int dmerge_bf16) {
    const int d = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (d >= DIRS) return;
    double acc = 0.0;
    for (int i = lane; i < nblk; i += 32) acc += dmpart[d * nblk + i];
    for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    if (lane == 0) {
        if (dmerge_bf16) {
            __nv_bfloat16 *p = static_cast<__nv_bfloat16 *>(dmerge) + d;
            *p = __float2bfloat16_rn(__bfloat162float(*p) + (float)acc);
        } else {
            static_cast<float *>(dmerge)[d] += (float)acc;
        }
    }
}

// ---- pipelined scans (per-channel weights, 8- or 16-byte vectors) ------------------------------
// The same scans with the loads of the next D-1 steps in flight: each thread copies its item's
// inputs for step s+D-1 into a shared-memory stage with cp.async while it computes step s, so
// the memory system always has D-1 steps of every block's traffic to work on (the simple kernels
// above wait for each step's loads before computing it). One launch covers the four directions;
// blockIdx.x = (image, channel group) * 4 + direction, so the four scans of one image slice run
// side by side and can share xc / dyc in L2 (the four read them at different steps).
// No L2 cache-policy hints on cp.async: fractional policies there are miscompiled by ptxas before
// 13.4.59 (triton-lang/triton#11660; this project's machines have 13.0) and faulted here with
// "illegal instruction".
template <int BYTES>
__device__ __forceinline__ void cp_async(void *dst, const void *src) {
    const uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
    if constexpr (BYTES == 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src) : "memory");
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(d), "l"(src), "n"(BYTES)
                     : "memory");
}
// L2 prefetch of `bytes` (a multiple of 16) at a 16-byte aligned address (sm_90 bulk copy engine;
// nothing on older GPUs).
__device__ __forceinline__ void l2_prefetch(const void *src, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(src), "r"(bytes) : "memory");
#endif
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

// V elements of T staged in shared memory -> floats.
template <typename T, int V>
__device__ __forceinline__ void lds_v(const unsigned char *p, float (&o)[V]) {
    constexpr int BYTES = V * (int)sizeof(T);
    if constexpr (BYTES == 16) {
        uint4 r = *reinterpret_cast<const uint4 *>(p);
        uint32_t w[4] = {r.x, r.y, r.z, r.w};
        unpack<T, V>(w, o);
    } else {
        uint2 r = *reinterpret_cast<const uint2 *>(p);
        uint32_t w[2] = {r.x, r.y};
        unpack<T, V>(w, o);
    }
}

// The four directions' geometry; a block takes g[blockIdx.x & 3]. Shared-memory layout sizes
// are the largest over the directions (H != W gives TB/BT and LR/RL different lane counts).
struct ScanArgs {
    DirGeom g[DIRS];
    int items_max;       // staging slots per stage
    int lanes_max;       // lanes + 2 halo lanes of the longer line
    int lane_bytes;      // bytes of the per-lane state region (h or carries), 16-aligned
    int prefetch;        // L2 prefetch distance in steps (0: none)
    int dir_mask;        // directions to run (bit d); 15 except in the benchmark's diagnostics
    int dg_write;        // backward: write dgates (gspn_scan_bwd_write) instead of adding into it
};

// L2 prefetch of step s's whole token rows (all Cc channels, not just this block's group), so
// that DRAM is read in full lines once and the ngroups blocks of an image slice, which each read
// a 32-byte piece of every row, hit L2. Block group grp prefetches lanes l = grp (mod ngroups),
// one thread per lane. Rows: xc / dyc (Cc elements), the direction's gates and dgates
// (5 Cc), hidden (Cc floats).
__device__ __forceinline__ bool prefetch_lane(const DirGeom &g, const ScanArgs &a, int l, int e,
                                              int grp) {
    return a.prefetch > 0 && e < g.items && e % g.nvg == 0 && l % g.ngroups == grp;
}

__device__ __forceinline__ DirGeom pick_dir(const ScanArgs &a, int d) {
    return d == 0 ? a.g[0] : d == 1 ? a.g[1] : d == 2 ? a.g[2] : a.g[3];
}

// Forward. Stage slot q of item e: q = 0 xc, 1 lam, 2 u, 3..5 wt_{-1,0,+1}. A thread owns IPT
// items, e = threadIdx.x + i * blockDim.x (IPT = 2 lets a 147-lane line take 64-byte channel
// groups: 1176 items on 608 threads).
template <typename T, int V, int D, int IPT>
__global__ void __launch_bounds__(PipeThreads<T, V>::fwd)
gspn_fwd_pipe_kernel(const T *__restrict__ xc, const T *__restrict__ gates,
                     float *__restrict__ hid, T *__restrict__ ypart, long long plane,
                     ScanArgs a) {
    constexpr int VB = V * (int)sizeof(T), NQ = 6;
    const int d = blockIdx.x & 3;
    if (!((a.dir_mask >> d) & 1)) return;
    const DirGeom g = pick_dir(a, d);
    extern __shared__ __align__(16) unsigned char smem_raw[];
    float *hbuf = reinterpret_cast<float *>(smem_raw);   // [2][N+2][CG]
    unsigned char *stg = smem_raw + a.lane_bytes;          // [D][NQ][items_max][VB]
    const int rowf = (g.N + 2) * g.CG;
    for (int i = threadIdx.x; i < 2 * rowf; i += blockDim.x) hbuf[i] = 0.0f;

    const int bg = blockIdx.x >> 2, b = bg / g.ngroups, c0 = (bg % g.ngroups) * g.CG;
    const int Cc = g.Cc;
    int e[IPT], l[IPT], cl[IPT], c[IPT];
    bool active[IPT];
    long long tl[IPT];
#pragma unroll
    for (int it = 0; it < IPT; it++) {
        e[it] = threadIdx.x + it * blockDim.x;
        active[it] = e[it] < g.items;
        l[it] = e[it] / g.nvg;
        cl[it] = (e[it] % g.nvg) * V;
        c[it] = c0 + cl[it];
        tl[it] = (long long)b * g.img_tokens + g.first + (long long)l[it] * g.lstride;
    }
    if (hid) hid += d * plane;
    if (ypart) ypart += d * plane;
    auto slot = [&](int st, int q, int item) {
        return stg + ((size_t)(st * NQ + q) * a.items_max + item) * VB;
    };
    auto issue = [&](int s) {
#pragma unroll
        for (int it = 0; it < IPT; it++) {
            if (active[it] && s < g.L) {
                const long long t = tl[it] + (long long)s * g.sstride;
                const T *gp = gates + t * g.G + g.goff + c[it];
                const int st = s % D;
                cp_async<VB>(slot(st, 0, e[it]), xc + t * Cc + c[it]);
#pragma unroll
                for (int q = 0; q < 5; q++) cp_async<VB>(slot(st, 1 + q, e[it]), gp + q * Cc);
            }
        }
        cp_async_commit();
    };
#pragma unroll
    for (int p = 0; p < D - 1; p++) issue(p);
    __syncthreads();   // hbuf zeroed

    const bool pf = prefetch_lane(g, a, l[0], e[0], bg % g.ngroups);
    for (int s = 0; s < g.L; s++) {
        const int sp = s + D - 1 + a.prefetch;
        if (pf && sp < g.L) {
            const long long t = tl[0] + (long long)sp * g.sstride;
            l2_prefetch(xc + t * Cc, Cc * sizeof(T));
            l2_prefetch(gates + t * g.G + g.goff, 5 * Cc * sizeof(T));
        }
        issue(s + D - 1);
        cp_async_wait<D - 1>();   // this thread's copies of step s have landed
        const float *prev = hbuf + (s & 1) * rowf;
        float *cur = hbuf + ((s + 1) & 1) * rowf;
        const int st = s % D;
#pragma unroll
        for (int it = 0; it < IPT; it++) {
            if (!active[it]) continue;
            const long long o = (tl[it] + (long long)s * g.sstride) * Cc + c[it];
            float x[V], lam[V], u[V], h[V];
            lds_v<T, V>(slot(st, 0, e[it]), x);
            lds_v<T, V>(slot(st, 1, e[it]), lam);
            lds_v<T, V>(slot(st, 2, e[it]), u);
#pragma unroll
            for (int i = 0; i < V; i++) h[i] = lam[i] * x[i];
            if (s > 0) {
                const bool has_m = l[it] > 0, has_p = l[it] < g.N - 1;
                float wm[V], w0[V], wp[V], hm[V], h0[V], hp[V];
                lds_v<T, V>(slot(st, 3, e[it]), wm);
                lds_v<T, V>(slot(st, 4, e[it]), w0);
                lds_v<T, V>(slot(st, 5, e[it]), wp);
                const float *pr = prev + (l[it] + 1) * g.CG + cl[it];
                ldf<V>(pr - g.CG, hm);
                ldf<V>(pr, h0);
                ldf<V>(pr + g.CG, hp);
#pragma unroll
                for (int i = 0; i < V; i++) {
                    float aa[3], w[3];
                    weights<T>(wm[i], w0[i], wp[i], has_m, has_p, aa, w);
                    h[i] += w[0] * hm[i];
                    h[i] += w[1] * h0[i];
                    h[i] += w[2] * hp[i];
                }
            }
            stf<V>(cur + (l[it] + 1) * g.CG + cl[it], h);
            if (hid) stf_stream<V>(hid + o, h);
            if (ypart) {
                float y[V];
#pragma unroll
                for (int i = 0; i < V; i++) y[i] = u[i] * h[i];
                stv<T, V>(ypart + o, y);
            }
        }
        __syncthreads();
    }
    cp_async_wait<0>();
}

// Backward. Stage slots: q = 0 dyc, 1 xc, 2 lam, 3 u, 4..6 wt, 7..11 the old dgates of this
// direction (lam, u, wt x3; not staged when dgates is written: a.dg_write); then h[s-1] of the
// item (fp32, V floats) in its own array, read by the item and its two neighbour lanes (visible
// to them after the step's barrier).
template <typename T, int V, int D>
__global__ void __launch_bounds__(PipeThreads<T, V>::bwd)
gspn_bwd_pipe_kernel(const T *__restrict__ dyc, const T *__restrict__ xc,
                     const T *__restrict__ gates, const float *__restrict__ hid,
                     const void *merge, int merge_bf16, T *__restrict__ dxpart,
                     T *__restrict__ dgates, double *__restrict__ dmpart, long long plane,
                     int nblk, ScanArgs a) {
    constexpr int VB = V * (int)sizeof(T), HB = V * 4;
    const int NQ = bwd_stage_slots(a.dg_write);
    const int d = blockIdx.x & 3;
    if (!((a.dir_mask >> d) & 1)) return;
    const DirGeom g = pick_dir(a, d);
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const int rowf = (g.N + 2) * g.CG;
    // carries as the simple kernel's, except w_0 dh, which stays in a register (one item per thread)
    float *cm = reinterpret_cast<float *>(smem_raw), *cp = cm + 2 * rowf;
    unsigned char *stg = smem_raw + a.lane_bytes;                          // [D][NQ][items][VB]
    // [D][items][HB], 16-byte aligned for its cp.async (7 slots of 8 bytes need not be)
    unsigned char *hst = stg + ((size_t)D * NQ * a.items_max * VB + 15) / 16 * 16;
    for (int i = threadIdx.x; i < 4 * rowf; i += blockDim.x) cm[i] = 0.0f;

    const int bg = blockIdx.x >> 2, b = bg / g.ngroups, c0 = (bg % g.ngroups) * g.CG;
    const int e = threadIdx.x;
    const bool active = e < g.items;
    const int l = e / g.nvg, cl = (e % g.nvg) * V, c = c0 + cl;
    const bool has_m = l > 0, has_p = l < g.N - 1;
    const int Cc = g.Cc;
    const long long tl = (long long)b * g.img_tokens + g.first + (long long)l * g.lstride;
    hid += d * plane;
    if (dxpart) dxpart += d * plane;
    const float m = load_param(merge, merge_bf16, d);
    auto slot = [&](int st, int q) {
        return stg + ((size_t)(st * NQ + q) * a.items_max + e) * VB;
    };
    auto hslot = [&](int st, int item) {
        return reinterpret_cast<const float *>(hst + ((size_t)st * a.items_max + item) * HB);
    };
    auto issue = [&](int k) {
        if (active && k < g.L) {
            const int s = g.L - 1 - k, st = k % D;
            const long long t = tl + (long long)s * g.sstride, o = t * Cc + c;
            const T *gp = gates + t * g.G + g.goff + c;
            cp_async<VB>(slot(st, 0), dyc + o);
            cp_async<VB>(slot(st, 1), xc + o);
#pragma unroll
            for (int q = 0; q < 5; q++) cp_async<VB>(slot(st, 2 + q), gp + q * Cc);
            if (dgates && !a.dg_write) {   // the old values, to add to
                const T *dgp = dgates + t * g.G + g.goff + c;
#pragma unroll
                for (int q = 0; q < 5; q++) cp_async<VB>(slot(st, 7 + q), dgp + q * Cc);
            }
            if (s > 0) {
                const float *hp = hid + o - g.sstride * Cc;   // h[s-1] of this lane
                unsigned char *dst = hst + ((size_t)st * a.items_max + e) * HB;
#pragma unroll
                for (int q = 0; q < HB / 16; q++) cp_async<16>(dst + 16 * q, hp + 4 * q);
            }
        }
        cp_async_commit();
    };

    float hc[V];   // h[s] of this item: the previous step's h[s-1]
    float cr0[V];  // w_0 dh of this item at the previous step: its carry into this step
#pragma unroll
    for (int i = 0; i < V; i++) cr0[i] = 0.0f;
    if (active) ldf_ro<V>(hid + (tl + (long long)(g.L - 1) * g.sstride) * Cc + c, hc);
#pragma unroll
    for (int p = 0; p < D - 1; p++) issue(p);
    cp_async_wait<D - 2>();
    __syncthreads();   // carries zeroed, step 0's stage visible to the neighbours

    double dm_acc = 0.0;
    const bool pf = prefetch_lane(g, a, l, e, bg % g.ngroups);
    for (int k = 0; k < g.L; k++) {
        const int s = g.L - 1 - k, st = k % D;
        const int sp = s - (D - 1 + a.prefetch);
        if (pf && sp >= 0) {
            const long long t = tl + (long long)sp * g.sstride;
            l2_prefetch(dyc + t * Cc, Cc * sizeof(T));
            l2_prefetch(xc + t * Cc, Cc * sizeof(T));
            l2_prefetch(gates + t * g.G + g.goff, 5 * Cc * sizeof(T));
            if (dgates && !a.dg_write) l2_prefetch(dgates + t * g.G + g.goff, 5 * Cc * sizeof(T));
            if (sp > 0) l2_prefetch(hid + (t - g.sstride) * Cc, Cc * 4);
        }
        issue(k + D - 1);
        const float *rm = cm + (k & 1) * rowf, *rp = cp + (k & 1) * rowf;
        float *wm_s = cm + ((k + 1) & 1) * rowf, *wp_s = cp + ((k + 1) & 1) * rowf;
        if (active) {
            const long long o = (tl + (long long)s * g.sstride) * Cc + c;
            const int si = (l + 1) * g.CG + cl;
            float dy[V], x[V], lam[V], u[V], hm[V], h0[V], hp[V], wtm[V], wt0[V], wtp[V];
            lds_v<T, V>(slot(st, 0), dy);
            lds_v<T, V>(slot(st, 1), x);
            lds_v<T, V>(slot(st, 2), lam);
            lds_v<T, V>(slot(st, 3), u);
#pragma unroll
            for (int i = 0; i < V; i++) hm[i] = h0[i] = hp[i] = 0.0f;
            if (s > 0) {
                lds_v<T, V>(slot(st, 4), wtm);
                lds_v<T, V>(slot(st, 5), wt0);
                lds_v<T, V>(slot(st, 6), wtp);
                ldf<V>(hslot(st, e), h0);
                if (has_m) ldf<V>(hslot(st, e - g.nvg), hm);
                if (has_p) ldf<V>(hslot(st, e + g.nvg), hp);
            }
            float crp[V], crm[V];
            ldf<V>(rp + si - g.CG, crp);
            ldf<V>(rm + si + g.CG, crm);

            float dh[V], dlam[V], du[V], dx[V], nm[V], n0[V], np[V], dwt[3][V];
#pragma unroll
            for (int i = 0; i < V; i++) {
                dm_acc += (double)u[i] * hc[i] * dy[i];
                du[i] = m * hc[i] * dy[i];
                dh[i] = crp[i] + cr0[i] + crm[i] + m * u[i] * dy[i];
                dx[i] = lam[i] * dh[i];
                dlam[i] = x[i] * dh[i];
                dwt[0][i] = dwt[1][i] = dwt[2][i] = nm[i] = n0[i] = np[i] = 0.0f;
                if (s > 0) {
                    const float dw[3] = {dh[i] * hm[i], dh[i] * h0[i], dh[i] * hp[i]};
                    float aa[3], w[3], gw[3];
                    const float S = weights<T>(wtm[i], wt0[i], wtp[i], has_m, has_p, aa, w);
                    weights_bwd<T>(aa, w, S, dw, gw);
                    dwt[0][i] = gw[0];
                    dwt[1][i] = gw[1];
                    dwt[2][i] = gw[2];
                    nm[i] = w[0] * dh[i];
                    n0[i] = w[1] * dh[i];
                    np[i] = w[2] * dh[i];
                }
            }
            if (dxpart) stv<T, V>(dxpart + o, dx);
            if (dgates) {
                T *dgp = dgates + (tl + (long long)s * g.sstride) * g.G + g.goff + c;
                float ol[V], ou[V];
                if (a.dg_write) {
#pragma unroll
                    for (int i = 0; i < V; i++) ol[i] = ou[i] = 0.0f;
                } else {
                    lds_v<T, V>(slot(st, 7), ol);
                    lds_v<T, V>(slot(st, 8), ou);
                }
#pragma unroll
                for (int i = 0; i < V; i++) {
                    ol[i] += dlam[i];
                    ou[i] += du[i];
                }
                stv<T, V>(dgp, ol);
                stv<T, V>(dgp + Cc, ou);
                // at s = 0, h[-1] = 0: the weights have no gradient (written as 0 in write mode)
                if (s > 0 || a.dg_write) {
#pragma unroll
                    for (int q = 0; q < 3; q++) {
                        float ow[V];
                        if (a.dg_write) {
#pragma unroll
                            for (int i = 0; i < V; i++) ow[i] = 0.0f;
                        } else {
                            lds_v<T, V>(slot(st, 9 + q), ow);
                        }
#pragma unroll
                        for (int i = 0; i < V; i++) ow[i] += dwt[q][i];
                        stv<T, V>(dgp + (2 + q) * Cc, ow);
                    }
                }
            }
            if (s > 0) {
                stf<V>(wm_s + si, nm);
                stf<V>(wp_s + si, np);
#pragma unroll
                for (int i = 0; i < V; i++) {
                    cr0[i] = n0[i];
                    hc[i] = h0[i];
                }
            }
        }
        cp_async_wait<D - 2>();   // step k+1's stage has landed (this thread's copies)
        __syncthreads();          // ... and everyone's: the neighbours' h[s-2] are visible
    }

    if (dmpart) {
        __shared__ double red[BWD_RED_WARPS];
        for (int off = 16; off > 0; off >>= 1) dm_acc += __shfl_xor_sync(0xffffffffu, dm_acc, off);
        if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = dm_acc;
        __syncthreads();
        if (threadIdx.x == 0) {
            double sum = 0.0;
            for (int w = 0; w < (int)(blockDim.x + 31) / 32; w++) sum += red[w];
            dmpart[d * nblk + bg] = sum;
        }
    }
}

// ---- shared weights: the gate chunks staged whole, coalesced -----------------------------------
// With gspn_shared_w a direction's gates of one token are one chunk of CH = 2 Cc + 3 elements at
// an element offset d * CH (odd for d = 1, 3): the simple kernels load it element by element, so
// every load instruction of a warp touches 32 lines (TB: 152-byte token stride; LR: a row apart),
// 19 such loads per lane and step at Cc = 8. That made them L1-bound: 15 us (forward) and 53 us
// (backward) per step at 1024^2 (H100), against the ~2 us the bytes need. These kernels copy each
// lane's chunk as the 4-byte words that cover it (the chunk starts 2-byte aligned in bf16, so
// Cc + 2 words; 2 Cc + 3 in fp32), the words of consecutive lanes on consecutive threads, into
// shared memory, and read the elements from there. One launch for the four directions,
// blockIdx.x = image * 4 + direction (ngroups = 1: a thread owns all Cc channels of its lanes, so
// the weight gradient's sum over channels stays in one thread, as in the simple kernel).
// Forward: the chunk and xc words of step s+1 are copied (cp.async) while step s computes, two
// stages. Backward: the chunk, the old dgates chunk and h[s-1] (for the neighbour lanes) are
// copied at the top of each step (one stage: the carries take the rest of shared memory); the new
// dgates are written into the staged chunk and stored element by element, consecutive elements on
// consecutive threads (only this direction's elements: the words also hold 2 bytes of the next
// chunk, which another block owns). Carries: dh (Cc floats) and the step's three weights per
// lane; a lane computes w_{+1}[l-1] dh[l-1] + w_0[l] dh[l] + w_{-1}[l+1] dh[l+1] itself.
constexpr int SH_FWD_THREADS = 1024;   // forward: ~50 registers
constexpr int SH_BWD_THREADS = 512;    // backward: ~105-125 registers

// L2 prefetch of the line holding p (the staged kernels fetch the next step's lines early, so
// their copies and loads at the top of a step find them in L2).
__device__ __forceinline__ void l2_prefetch_line(const void *p) {
    asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p));
}

// Walks f = threadIdx.x, threadIdx.x + blockDim.x, ... < n as (lane, word) = divmod(f, per)
// without a division per element.
struct LaneWalk {
    int l, w, dl, dw;
    __device__ LaneWalk(int per) {
        l = threadIdx.x / per;
        w = threadIdx.x - l * per;
        dl = blockDim.x / per;
        dw = blockDim.x - dl * per;
    }
    __device__ void next(int per) {
        l += dl;
        w += dw;
        if (w >= per) {
            w -= per;
            l++;
        }
    }
};

struct ShArgs {
    DirGeom g[DIRS];
    int lanes_max;   // lanes of the longer line
    int nw;          // 4-byte words covering one lane's gate chunk
    int sgroups;     // forward: channel groups (blocks) per image and direction (1, see fwd_sh)
    int xtw;         // 4-byte words of one token's xc
    int xw;          // 4-byte words of one channel group's xc (forward stage)
    int row_bytes;   // bytes of the per-lane rows (h or carries), 16-aligned
};

__device__ __forceinline__ DirGeom pick_dir_sh(const ShArgs &a, int d) {
    return d == 0 ? a.g[0] : d == 1 ? a.g[1] : d == 2 ? a.g[2] : a.g[3];
}

// Word index of the first word covering token t's chunk of direction g.d; off = byte offset of
// the chunk's first element in that word (0, or 2 for bf16 at odd d).
template <typename T>
__device__ __forceinline__ long long chunk_word(const DirGeom &g, long long t, int &off) {
    const long long byte = (t * g.G + g.goff) * (long long)sizeof(T);
    off = (int)(byte & 3);
    return byte >> 2;
}
template <typename T>
__device__ __forceinline__ float sm_el(const unsigned char *p, int q) {
    return to_f32(*reinterpret_cast<const T *>(p + q * (int)sizeof(T)));
}
template <typename T>
__device__ __forceinline__ void sm_st(unsigned char *p, int q, float v) {
    *reinterpret_cast<T *>(p + q * (int)sizeof(T)) = from_f32<T>(v);
}

// Forward. Stage per lane: nw chunk words, then xw xc words.
template <typename T, int V>
__global__ void __launch_bounds__(SH_FWD_THREADS)
gspn_fwd_sh_kernel(const T *__restrict__ xc, const T *__restrict__ gates,
                   float *__restrict__ hid, T *__restrict__ ypart, long long plane, ShArgs a) {
    const int d = blockIdx.x & 3;
    const DirGeom g = pick_dir_sh(a, d);
    extern __shared__ __align__(16) unsigned char smem_raw[];
    // block = (image, channel group, direction); the group's CG channels start at c0
    const int bg = blockIdx.x >> 2, grp = bg % a.sgroups;
    const int N = g.N, Cc = g.Cc, CG = Cc / a.sgroups, c0 = grp * CG, per = a.nw + a.xw;
    const int rowf = (N + 2) * CG;
    float *hbuf = reinterpret_cast<float *>(smem_raw);                      // [2][N+2][CG]
    uint32_t *stg = reinterpret_cast<uint32_t *>(smem_raw + a.row_bytes);   // [2][lanes_max][per]
    const int stage_words = a.lanes_max * per;
    for (int i = threadIdx.x; i < 2 * rowf; i += blockDim.x) hbuf[i] = 0.0f;
    const long long img = (long long)(bg / a.sgroups) * g.img_tokens;
    const uint32_t *gw = reinterpret_cast<const uint32_t *>(gates);
    const uint32_t *xw = reinterpret_cast<const uint32_t *>(xc);
    if (hid) hid += d * plane;
    if (ypart) ypart += d * plane;
    auto issue = [&](int s) {
        if (s < g.L) {
            uint32_t *st = stg + (s & 1) * stage_words;
            const long long ts = img + g.first + (long long)s * g.sstride;
            // lane l's chunk starts at byte gb0 + l * gstep; its xc at word xw0 + l * xstep
            const long long gb0 = (ts * g.G + g.goff) * (long long)sizeof(T);
            const long long gstep = g.lstride * g.G * (long long)sizeof(T);
            const long long xw0 = ts * a.xtw + grp * a.xw, xstep = g.lstride * a.xtw;
            LaneWalk lw(per);
            for (int f = threadIdx.x; f < N * per; f += blockDim.x, lw.next(per)) {
                const uint32_t *src = lw.w < a.nw ? gw + ((gb0 + lw.l * gstep) >> 2) + lw.w
                                                  : xw + xw0 + lw.l * xstep + (lw.w - a.nw);
                cp_async<4>(st + f, src);
            }
        }
        cp_async_commit();
    };

    issue(0);
    for (int s = 0; s < g.L; s++) {
        cp_async_wait<0>();
        // Everyone's copies of step s have landed; h of step s-1 is written; stage (s+1)&1 was
        // last read at step s-1 and may be refilled.
        __syncthreads();
        issue(s + 1);
        const uint32_t *st = stg + (s & 1) * stage_words;
        const float *prev = hbuf + (s & 1) * rowf;
        float *cur = hbuf + ((s + 1) & 1) * rowf;
        const long long ts = img + g.first + (long long)s * g.sstride;
        for (int l = threadIdx.x; l < N; l += blockDim.x) {
            const long long t = ts + (long long)l * g.lstride;
            if (s + 2 < g.L) {   // the lines step s+2 will copy
                const long long t2 = t + 2 * g.sstride;
                const T *gp = gates + t2 * g.G + g.goff;
                l2_prefetch_line(gp);
                l2_prefetch_line(gp + 2 * Cc + 2);
                l2_prefetch_line(xc + t2 * Cc);
            }
            int off;
            chunk_word<T>(g, t, off);
            const unsigned char *gc = reinterpret_cast<const unsigned char *>(st + l * per) + off;
            const unsigned char *xs = reinterpret_cast<const unsigned char *>(st + l * per + a.nw);
            float sa[3], sw[3] = {0.0f, 0.0f, 0.0f};
            if (s > 0)
                weights<T>(sm_el<T>(gc, 2 * Cc), sm_el<T>(gc, 2 * Cc + 1), sm_el<T>(gc, 2 * Cc + 2),
                           l > 0, l < N - 1, sa, sw);
            for (int c = 0; c < CG; c += V) {   // channels c0 + c ...
                float h[V], u[V];
#pragma unroll
                for (int i = 0; i < V; i++) {
                    h[i] = sm_el<T>(gc, c0 + c + i) * sm_el<T>(xs, c + i);
                    u[i] = sm_el<T>(gc, Cc + c0 + c + i);
                }
                if (s > 0) {
                    float hm[V], h0[V], hp[V];
                    const float *pr = prev + (l + 1) * CG + c;
                    ldf<V>(pr - CG, hm);
                    ldf<V>(pr, h0);
                    ldf<V>(pr + CG, hp);
#pragma unroll
                    for (int i = 0; i < V; i++) {
                        h[i] += sw[0] * hm[i];
                        h[i] += sw[1] * h0[i];
                        h[i] += sw[2] * hp[i];
                    }
                }
                stf<V>(cur + (l + 1) * CG + c, h);
                const long long o = t * Cc + c0 + c;
                if (hid) stf_stream<V>(hid + o, h);
                if (ypart) {
                    float y[V];
#pragma unroll
                    for (int i = 0; i < V; i++) y[i] = u[i] * h[i];
                    stv<T, V>(ypart + o, y);
                }
            }
        }
    }
    cp_async_wait<0>();
}

// Backward. Stage per lane: nw gate chunk words, nw old dgates chunk words, (padding to 16
// bytes) Cc floats of h[s-1]. Carry rows [2][N+2][Cc+4]: dh, w_{-1}, w_0, w_{+1}, pad.
template <typename T, int V>
__global__ void __launch_bounds__(SH_BWD_THREADS)
gspn_bwd_sh_kernel(const T *__restrict__ dyc, const T *__restrict__ xc,
                   const T *__restrict__ gates, const float *__restrict__ hid,
                   const void *merge, int merge_bf16, T *__restrict__ dxpart,
                   T *__restrict__ dgates, double *__restrict__ dmpart, long long plane, int nblk,
                   ShArgs a) {
    const int d = blockIdx.x & 3;
    const DirGeom g = pick_dir_sh(a, d);
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const int N = g.N, Cc = g.Cc, CW = Cc + 4, CH = 2 * Cc + 3;
    const int hoff = (2 * a.nw + 3) & ~3, per = hoff + Cc;
    const int rowf = (N + 2) * CW;
    float *rows = reinterpret_cast<float *>(smem_raw);
    uint32_t *stg = reinterpret_cast<uint32_t *>(smem_raw + a.row_bytes);   // [N][per]
    for (int i = threadIdx.x; i < 2 * rowf; i += blockDim.x) rows[i] = 0.0f;
    const int b = blockIdx.x >> 2;
    const long long img = (long long)b * g.img_tokens;
    const uint32_t *gw = reinterpret_cast<const uint32_t *>(gates);
    const uint32_t *dgw = reinterpret_cast<const uint32_t *>(dgates);
    hid += d * plane;
    const uint32_t *hw = reinterpret_cast<const uint32_t *>(hid);
    if (dxpart) dxpart += d * plane;
    const float m = load_param(merge, merge_bf16, d);
    double dm_acc = 0.0;

    for (int k = 0; k < g.L; k++) {
        const int s = g.L - 1 - k;
        const long long ts = img + g.first + (long long)s * g.sstride;
        __syncthreads();   // the stage's last step is stored; the carries of step s+1 are written
        {
            // lane l's chunk starts at byte gb0 + l * gstep; its h[s-1] at word hw0 + l * hstep
            const long long gb0 = (ts * g.G + g.goff) * (long long)sizeof(T);
            const long long gstep = g.lstride * g.G * (long long)sizeof(T);
            const long long hw0 = (ts - g.sstride) * Cc, hstep = g.lstride * Cc;
            LaneWalk lw(per);
            for (int f = threadIdx.x; f < N * per; f += blockDim.x, lw.next(per)) {
                const int w = lw.w;
                const uint32_t *src = nullptr;
                if (w < 2 * a.nw) {
                    const long long cw = (gb0 + lw.l * gstep) >> 2;
                    if (w < a.nw) src = gw + cw + w;
                    else if (dgates) src = dgw + cw + (w - a.nw);
                } else if (w >= hoff && s > 0) {
                    src = hw + hw0 + lw.l * hstep + (w - hoff);   // h[s-1] of lane l
                }
                if (src) cp_async<4>(stg + f, src);
                else stg[f] = 0u;
            }
        }
        cp_async_commit();
        cp_async_wait<0>();
        __syncthreads();

        const float *rk = rows + (k & 1) * rowf;   // carries from step s+1
        float *wk = rows + ((k + 1) & 1) * rowf;   // carries into step s-1
        for (int l = threadIdx.x; l < N; l += blockDim.x) {
            const long long t = ts + (long long)l * g.lstride;
            if (s > 0) {   // the lines step s-1 will copy and load
                const long long t1 = t - g.sstride;
                const T *gp = gates + t1 * g.G + g.goff;
                l2_prefetch_line(gp);
                l2_prefetch_line(gp + 2 * Cc + 2);
                if (dgates) {
                    l2_prefetch_line(dgates + t1 * g.G + g.goff);
                    l2_prefetch_line(dgates + t1 * g.G + g.goff + 2 * Cc + 2);
                }
                l2_prefetch_line(xc + t1 * Cc);
                l2_prefetch_line(dyc + t1 * Cc);
                if (s > 1) l2_prefetch_line(hid + (t1 - g.sstride) * Cc);
            }
            int off;
            chunk_word<T>(g, t, off);
            unsigned char *lane = reinterpret_cast<unsigned char *>(stg + (size_t)l * per);
            const unsigned char *gc = lane + off;
            unsigned char *dgc = lane + 4 * a.nw + off;
            const float *hs = reinterpret_cast<const float *>(stg + (size_t)l * per + hoff);
            const bool has_m = l > 0, has_p = l < N - 1;
            float sa[3] = {0, 0, 0}, sw[3] = {0, 0, 0}, sS = 0.0f, dws[3] = {0, 0, 0};
            if (s > 0)
                sS = weights<T>(sm_el<T>(gc, 2 * Cc), sm_el<T>(gc, 2 * Cc + 1),
                                sm_el<T>(gc, 2 * Cc + 2), has_m, has_p, sa, sw);
            // dL/dh of step s+1 reaching lane l: w_{+1} dh of lane l-1, w_0 dh of lane l,
            // w_{-1} dh of lane l+1 (halo rows are zero)
            const float *cm = rk + l * CW, *c0 = rk + (l + 1) * CW, *cp = rk + (l + 2) * CW;
            const float wpm = cm[Cc + 2], w00 = c0[Cc + 1], wmp = cp[Cc];
            for (int c = 0; c < Cc; c += V) {
                const long long o = t * Cc + c;
                float dy[V], x[V], hc[V], hm[V], h0[V], hp[V], dm_[V], d0[V], dp[V];
                ldv<T, V>(dyc + o, dy);
                ldv<T, V>(xc + o, x);
                ldf_ro<V>(hid + o, hc);
                ldf<V>(hs + c, h0);
#pragma unroll
                for (int i = 0; i < V; i++) hm[i] = hp[i] = 0.0f;
                if (has_m) ldf<V>(hs + c - per, hm);
                if (has_p) ldf<V>(hs + c + per, hp);
                ldf<V>(cm + c, dm_);
                ldf<V>(c0 + c, d0);
                ldf<V>(cp + c, dp);
                float dh[V], dx[V];
#pragma unroll
                for (int i = 0; i < V; i++) {
                    const float lam = sm_el<T>(gc, c + i), u = sm_el<T>(gc, Cc + c + i);
                    dm_acc += (double)u * hc[i] * dy[i];
                    const float du = m * hc[i] * dy[i];
                    dh[i] = wpm * dm_[i] + w00 * d0[i] + wmp * dp[i] + m * u * dy[i];
                    dx[i] = lam * dh[i];
                    dws[0] += dh[i] * hm[i];
                    dws[1] += dh[i] * h0[i];
                    dws[2] += dh[i] * hp[i];
                    if (dgates) {
                        sm_st<T>(dgc, c + i, sm_el<T>(dgc, c + i) + x[i] * dh[i]);
                        sm_st<T>(dgc, Cc + c + i, sm_el<T>(dgc, Cc + c + i) + du);
                    }
                }
                stf<V>(wk + (l + 1) * CW + c, dh);
                if (dxpart) stv<T, V>(dxpart + o, dx);
            }
            float *wr = wk + (l + 1) * CW + Cc;
            wr[0] = sw[0];
            wr[1] = sw[1];
            wr[2] = sw[2];
            if (s > 0 && dgates) {   // at s = 0, h[-1] = 0: the weights have no gradient
                float gwt[3];
                weights_bwd<T>(sa, sw, sS, dws, gwt);
#pragma unroll
                for (int q = 0; q < 3; q++)
                    sm_st<T>(dgc, 2 * Cc + q, sm_el<T>(dgc, 2 * Cc + q) + gwt[q]);
            }
        }
        if (dgates) {
            __syncthreads();   // the new dgates chunks are staged
            const int nq = s > 0 ? CH : 2 * Cc;
            // lane l's chunk starts at element e0 + l * estep of dgates
            const long long e0 = ts * g.G + g.goff, estep = g.lstride * g.G;
            LaneWalk lw(nq);
            for (int f = threadIdx.x; f < N * nq; f += blockDim.x, lw.next(nq)) {
                const long long el = e0 + lw.l * estep;
                const int off = (int)((el * (long long)sizeof(T)) & 3);
                const unsigned char *dgc =
                    reinterpret_cast<const unsigned char *>(stg + (size_t)lw.l * per + a.nw) + off;
                dgates[el + lw.w] = *reinterpret_cast<const T *>(dgc + lw.w * (int)sizeof(T));
            }
        }
    }

    if (dmpart) {
        __shared__ double red[SH_BWD_THREADS / 32];
        for (int off = 16; off > 0; off >>= 1) dm_acc += __shfl_xor_sync(0xffffffffu, dm_acc, off);
        __syncthreads();
        if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = dm_acc;
        __syncthreads();
        if (threadIdx.x == 0) {
            double sum = 0.0;
            for (int w = 0; w < (int)(blockDim.x + 31) / 32; w++) sum += red[w];
            dmpart[d * nblk + b] = sum;
        }
    }
}

// ---- host side -----------------------------------------------------------------------------
struct Plan {
    int B, H, W, Cc, G, block;
    bool shared, bf16;
    int V, CG, ngroups, nvg;
    long long plane;   // B*H*W*Cc
    int stages;        // as Tuning::stages
    int prefetch;      // as Tuning::prefetch
    int dir_mask;      // as Tuning::dir_mask
};

bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

void check_dtype_like(const char *what, const Tensor *t, const Tensor *ref) {
    char a[64], b[64];
    if (!t) return;
    CG_CHECK(t->device == DEVICE_CUDA, "", "gspn_scan (CUDA): %s is not on the GPU", what);
    CG_CHECK(t->numel == ref->numel && t->dtype == ref->dtype, "",
             "gspn_scan (CUDA): %s %s %s does not match xc %s %s", what,
             tensor_shape_str(t, a, sizeof a), dtype_name(t->dtype),
             tensor_shape_str(ref, b, sizeof b), dtype_name(ref->dtype));
}

// Tuning (the benchmark sweeps it): cg_bytes = bytes of one token's channels a block owns with
// per-channel weights (32 = one sector); vec_bytes = bytes a thread loads at once (16 or 8);
// cg_bytes = 0 picks both (auto_tuning). stages = cp.async pipeline depth of the pipelined
// kernels (0: the largest that keeps enough blocks resident; 1: the simple kernels).
struct Tuning {
    int cg_bytes, vec_bytes, stages, prefetch;
    int dir_mask;   // benchmark diagnostics only: run these directions of the pipelined kernels
};

// Measured on an H200 (gspn_bench.cu; B=32, Cc=64, bf16): fewer channels a thread (8-byte
// vectors) and wider channel groups (64 or 128 bytes of a token per block: fewer, fuller blocks,
// whole DRAM atoms and lines) run faster, as long as a line still fits one pipelined block
// (forward: 37^2 0.103 -> 0.074 ms, 74^2 0.273 -> 0.254 ms going from 64 to 128 bytes). The
// widest group that fits wins; lines too long fall back to (32, 16).
Tuning auto_tuning(Tuning tu, bool bf16, int Cc, int lanes, bool bwd) {
    if (tu.cg_bytes != 0) return tu;
    const int esz = bf16 ? 2 : 4, vb = bf16 ? 8 : 16;
    const int limit = bwd ? (vb == 8 ? PipeThreads<__nv_bfloat16, 4>::bwd : PipeThreads<float, 4>::bwd)
                          : 2 * (vb == 8 ? PipeThreads<__nv_bfloat16, 4>::fwd : PipeThreads<float, 4>::fwd);
    // The forward also tries whole 128-byte token rows (Cc = 64 bf16: one block per image and
    // direction, full lines per request); the backward's stages do not fit that many items.
    for (int cgb : {128, 64, 32}) {
        if (bwd && cgb == 128) continue;
        const int cg = cgb < Cc * esz ? cgb : Cc * esz;
        if ((long long)lanes * (cg / vb > 0 ? cg / vb : 1) <= limit) {
            tu.cg_bytes = cgb;
            tu.vec_bytes = vb;
            return tu;
        }
    }
    tu.cg_bytes = 32;
    tu.vec_bytes = 16;
    return tu;
}

Plan make_plan(const Tensor *xc, const Tensor *gates, const Tensor *merge, int shared_w,
               Tuning tu, bool bwd, const void *const *ptrs, int nptrs) {
    char a[64], b[64];
    CG_CHECK(xc->ndim == 4, "", "gspn_scan: xc must be (B, H, W, Cc), got %s",
             tensor_shape_str(xc, a, sizeof a));
    CG_CHECK(xc->device == DEVICE_CUDA && gates->device == DEVICE_CUDA &&
             merge->device == DEVICE_CUDA, "", "gspn_scan (CUDA): tensors must be on the GPU");
    Plan p{};
    p.B = xc->shape[0];
    p.H = xc->shape[1];
    p.W = xc->shape[2];
    p.Cc = xc->shape[3];
    p.shared = shared_w != 0;
    p.block = p.shared ? 2 * p.Cc + 3 : 5 * p.Cc;
    p.G = DIRS * p.block;
    p.bf16 = xc->dtype == DTYPE_BF16;
    p.plane = (long long)xc->numel;
    CG_CHECK(gates->ndim == 4 && gates->shape[0] == p.B && gates->shape[1] == p.H &&
             gates->shape[2] == p.W && gates->shape[3] == p.G,
             shared_w ? "gspn_shared_w = 1 expects G = 4*(2*Cc+3)" : "gspn_shared_w = 0 expects G = 20*Cc",
             "gspn_scan: gates %s do not match xc %s", tensor_shape_str(gates, a, sizeof a),
             tensor_shape_str(xc, b, sizeof b));
    CG_CHECK(gates->dtype == xc->dtype, "", "gspn_scan (CUDA): gates are %s, xc is %s",
             dtype_name(gates->dtype), dtype_name(xc->dtype));
    CG_CHECK(merge->numel == DIRS, "", "gspn_scan: merge has %zu elements, expected 4", merge->numel);
    CG_CHECK(p.H <= 65535 && p.W <= 65535, "", "gspn_scan (CUDA): grid %dx%d too large", p.H, p.W);

    const int esz = p.bf16 ? 2 : 4;
    tu = auto_tuning(tu, p.bf16, p.Cc, p.H > p.W ? p.H : p.W, bwd);
    const int vmax = (tu.vec_bytes == 8 && p.bf16 ? 8 : 16) / esz;
    bool al = true;
    for (int i = 0; i < nptrs; i++) al = al && (ptrs[i] == nullptr || aligned16(ptrs[i]));
    p.V = (al && p.Cc % vmax == 0) ? vmax : 1;
    if (p.shared) {
        p.CG = p.Cc;
        p.nvg = p.Cc / p.V;
    } else {
        const int per_vec = p.V * esz;
        int nvg = tu.cg_bytes / per_vec;
        if (nvg < 1) nvg = 1;
        if (nvg > p.Cc / p.V) nvg = p.Cc / p.V;
        while ((p.Cc / p.V) % nvg != 0) nvg--;
        p.nvg = nvg;
        p.CG = nvg * p.V;
    }
    p.ngroups = p.Cc / p.CG;
    p.stages = tu.stages;
    // L2 prefetch needs 16-byte aligned rows.
    p.prefetch = (p.Cc * esz) % 16 == 0 ? tu.prefetch : 0;
    p.dir_mask = tu.dir_mask ? tu.dir_mask : 15;
    return p;
}

DirGeom dir_geom(const Plan &p, int d) {
    DirGeom g{};
    g.d = d;
    const bool rows = d < 2;            // TB, BT scan rows; LR, RL scan columns
    g.N = rows ? p.W : p.H;
    g.L = rows ? p.H : p.W;
    g.lstride = rows ? 1 : p.W;
    switch (d) {
    case 0: g.first = 0; g.sstride = p.W; break;                              // TB
    case 1: g.first = (long long)(p.H - 1) * p.W; g.sstride = -p.W; break;    // BT
    case 2: g.first = 0; g.sstride = 1; break;                                // LR
    default: g.first = p.W - 1; g.sstride = -1; break;                        // RL
    }
    g.img_tokens = (long long)p.H * p.W;
    g.Cc = p.Cc;
    g.G = p.G;
    g.goff = d * p.block;
    g.CG = p.CG;
    g.ngroups = p.ngroups;
    g.nvg = p.nvg;
    g.items = p.shared ? g.N : g.N * p.nvg;
    return g;
}

int scan_threads(const DirGeom &g) {
    int t = (g.items + 31) / 32 * 32;
    return t > SCAN_THREADS_MAX ? SCAN_THREADS_MAX : t;
}

template <typename K>
void set_smem(K kernel, size_t bytes) {
    if (bytes > 48 * 1024)
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        (int)bytes));
}

size_t smem_limit() {
    int dev = 0, v = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    return (size_t)v;
}

template <typename T, int V, bool SH>
void launch_fwd_dir(const DirGeom &g, int B, const T *xc, const T *gates, float *hid, T *ypart,
                    cudaStream_t st) {
    const size_t smem = 2 * (size_t)(g.N + 2) * g.CG * sizeof(float);
    CG_CHECK(smem <= smem_limit(), "use gspn_shared_w = 0 or a smaller grid",
             "gspn_scan (CUDA): a line of %d lanes x %d channels needs %zu bytes of shared memory",
             g.N, g.CG, smem);
    auto k = gspn_fwd_dir_kernel<T, V, SH>;
    set_smem(k, smem);
    k<<<B * g.ngroups, scan_threads(g), smem, st>>>(xc, gates, hid, ypart, g);
    CUDA_CHECK_LAUNCH();
}

template <typename T, int V, bool SH>
void launch_bwd_dir(const DirGeom &g, int B, const T *dyc, const T *xc, const T *gates,
                    const float *hid, const void *merge, int merge_bf16, T *dxpart, T *dgates,
                    double *dmpart, cudaStream_t st) {
    const size_t smem = 5 * (size_t)(g.N + 2) * g.CG * sizeof(float);
    CG_CHECK(smem <= smem_limit(), "use gspn_shared_w = 0 or a smaller grid",
             "gspn_scan (CUDA): a line of %d lanes x %d channels needs %zu bytes of shared memory",
             g.N, g.CG, smem);
    auto k = gspn_bwd_dir_kernel<T, V, SH>;
    set_smem(k, smem);
    k<<<B * g.ngroups, scan_threads(g), smem, st>>>(dyc, xc, gates, hid, merge, merge_bf16, dxpart,
                                                   dgates, dmpart, g);
    CUDA_CHECK_LAUNCH();
}

int ew_blocks(long long nvec, const CudaCtx *c) {
    long long want = (nvec + EW_THREADS - 1) / EW_THREADS;
    long long cap = (long long)c->sm_count * 16;
    if (want > cap) want = cap;
    return want < 1 ? 1 : (int)want;
}

// The four forward scans, concurrently on the side streams. hid (4 slices) and/or ypart
// (4 slices) may be NULL.
template <typename T, int V, bool SH>
void fwd_all(CudaCtx *c, const Plan &p, const T *xc, const T *gates, float *hid, T *ypart) {
    CUDA_CHECK(cudaEventRecord(c->fork, c->stream));
    for (int d = 0; d < DIRS; d++) {
        CUDA_CHECK(cudaStreamWaitEvent(c->side[d], c->fork, 0));
        launch_fwd_dir<T, V, SH>(dir_geom(p, d), p.B, xc, gates, hid ? hid + d * p.plane : nullptr,
                                 ypart ? ypart + d * p.plane : nullptr, c->side[d]);
        CUDA_CHECK(cudaEventRecord(c->join[d], c->side[d]));
    }
    for (int d = 0; d < DIRS; d++) CUDA_CHECK(cudaStreamWaitEvent(c->stream, c->join[d], 0));
}

// ---- pipelined path: one launch for the four directions --------------------------------------
ScanArgs scan_args(const Plan &p) {
    ScanArgs a{};
    int nmax = 0;
    for (int d = 0; d < DIRS; d++) {
        a.g[d] = dir_geom(p, d);
        a.items_max = a.g[d].items > a.items_max ? a.g[d].items : a.items_max;
        nmax = a.g[d].N > nmax ? a.g[d].N : nmax;
    }
    a.lanes_max = nmax + 2;
    a.prefetch = p.prefetch;
    a.dir_mask = p.dir_mask;
    return a;
}

// Bytes of a pipelined block's per-lane state: h (2 rows) or the carries (4 rows).
int lane_state_bytes(const Plan &p, const ScanArgs &a, bool bwd) {
    return (int)(((size_t)(bwd ? 4 : 2) * a.lanes_max * p.CG * 4 + 15) / 16 * 16);
}

// Shared memory of a pipelined block: the per-lane state (h: 2 rows; carries: 5 rows) and D
// stages of the items' inputs.
size_t pipe_smem(const Plan &p, const ScanArgs &a, bool bwd, int D) {
    const size_t vb = (size_t)p.V * (p.bf16 ? 2 : 4);
    const size_t lane = (size_t)lane_state_bytes(p, a, bwd);
    if (!bwd) return lane + (size_t)D * a.items_max * 6 * vb;
    const size_t inputs = (size_t)D * a.items_max * bwd_stage_slots(a.dg_write) * vb;
    return lane + (inputs + 15) / 16 * 16 + (size_t)D * a.items_max * p.V * 4;
}

// Pipeline depth: the deepest (<= 4) with which all blocks are resident at once, else the
// deepest that keeps two blocks per SM, else the deepest with one, each first under SMEM_SOFT of
// shared memory per SM; 0 = take the simple path.
// max_threads: the items a block can take (threads x items per thread).
int pipe_stages(const Plan &p, const ScanArgs &a, bool bwd, int max_threads, const CudaCtx *c) {
    if (p.shared || p.V * (p.bf16 ? 2 : 4) < 8 || p.stages == 1 || a.items_max > max_threads)
        return 0;
    int dev = c->device, per_sm = 0, per_block = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    const auto fits = [&](int D, int k) {
        const size_t sm = pipe_smem(p, a, bwd, D);
        return sm <= (size_t)per_block && (size_t)k * (sm + 1024) <= (size_t)per_sm;
    };
    if (p.stages >= 2) return fits(p.stages, 1) ? p.stages : 0;
    const int blocks = DIRS * p.B * p.ngroups;
    const int want = (blocks + c->sm_count - 1) / c->sm_count;
    // First the residencies k (blocks per SM) and depths whose shared memory stays under
    // SMEM_SOFT per SM, the rest of the SM's 228 KB being L1; then any that fits. Measured (H200,
    // B=32, Cc=64 bf16): 147^2 forward, one block per SM, D = 3 (207 KB) 1.72 ms against D = 2
    // (151 KB) 1.15 ms; 54^2 backward, one block, D = 4 (222 KB) 0.46 ms against D = 2 (125 KB)
    // 0.34 ms; 37^2 backward, two blocks at D = 2 (2 x 87 KB) 0.179 ms against one at D = 4
    // (152 KB) 0.164 ms; 74^2 forward, two blocks, D = 3 (2 x 105 KB) 0.273 ms, D = 2 0.266 ms.
    constexpr size_t SMEM_SOFT = 160 * 1024;
    const int ks[3] = {want, 2, 1};
    for (int pass = 0; pass < 2; pass++)
        for (int k : ks)
            for (int D = 4; D >= 2; D--)
                if (fits(D, k) &&
                    (pass == 1 || (size_t)k * (pipe_smem(p, a, bwd, D) + 1024) <= SMEM_SOFT))
                    return D;
    return 0;
}

template <typename K, typename... Args>
void launch_pipe(K kernel, const Plan &p, const ScanArgs &a, size_t smem, int ipt,
                 cudaStream_t st, Args... args) {
    set_smem(kernel, smem);
    const int threads = ((a.items_max + ipt - 1) / ipt + 31) / 32 * 32;
    kernel<<<DIRS * p.B * p.ngroups, threads, smem, st>>>(args..., a);
    CUDA_CHECK_LAUNCH();
}

template <typename T, int V>
bool fwd_pipe(CudaCtx *c, const Plan &p, const T *xc, const T *gates, float *hid, T *ypart) {
    if constexpr (V * sizeof(T) < 8) {
        return false;
    } else {
        ScanArgs a = scan_args(p);
        constexpr int MAXT = PipeThreads<T, V>::fwd;
        const int D = pipe_stages(p, a, false, 2 * MAXT, c);
        if (!D) return false;
        const size_t smem = pipe_smem(p, a, false, D);
        a.lane_bytes = lane_state_bytes(p, a, false);
        const int ipt = a.items_max > MAXT ? 2 : 1;
#define GSPN_FWD_PIPE(DD, II)                                                                  \
    launch_pipe(gspn_fwd_pipe_kernel<T, V, DD, II>, p, a, smem, II, c->stream, xc, gates, hid, \
                ypart, p.plane)
        if (ipt == 1) {
            if (D == 2) GSPN_FWD_PIPE(2, 1);
            else if (D == 3) GSPN_FWD_PIPE(3, 1);
            else GSPN_FWD_PIPE(4, 1);
        } else {
            if (D == 2) GSPN_FWD_PIPE(2, 2);
            else if (D == 3) GSPN_FWD_PIPE(3, 2);
            else GSPN_FWD_PIPE(4, 2);
        }
#undef GSPN_FWD_PIPE
        return true;
    }
}

template <typename T, int V>
bool bwd_pipe(CudaCtx *c, const Plan &p, const T *dyc, const T *xc, const T *gates,
              const float *hid, const void *merge, int merge_bf16, T *dxpart, T *dgates,
              double *dmpart, bool dg_write) {
    if constexpr (V * sizeof(T) < 8) {
        return false;
    } else {
        ScanArgs a = scan_args(p);
        a.dg_write = dg_write;   // smaller stages: pipe_smem
        const int D = pipe_stages(p, a, true, PipeThreads<T, V>::bwd, c);
        if (!D) return false;
        const size_t smem = pipe_smem(p, a, true, D);
        a.lane_bytes = lane_state_bytes(p, a, true);
        const int nblk = p.B * p.ngroups;
        if (D == 2) launch_pipe(gspn_bwd_pipe_kernel<T, V, 2>, p, a, smem, 1, c->stream, dyc, xc, gates, hid, merge, merge_bf16, dxpart, dgates, dmpart, p.plane, nblk);
        else if (D == 3) launch_pipe(gspn_bwd_pipe_kernel<T, V, 3>, p, a, smem, 1, c->stream, dyc, xc, gates, hid, merge, merge_bf16, dxpart, dgates, dmpart, p.plane, nblk);
        else launch_pipe(gspn_bwd_pipe_kernel<T, V, 4>, p, a, smem, 1, c->stream, dyc, xc, gates, hid, merge, merge_bf16, dxpart, dgates, dmpart, p.plane, nblk);
        return true;
    }
}

// ---- shared-weight path: the staged kernels ------------------------------------------------
bool aligned4(const void *p) { return ((uintptr_t)p & 3u) == 0; }

// Geometry and shared memory of the staged shared-weight kernels; 0 bytes when they do not apply
// (odd token rows in bytes, stages = 1 asks for the simple kernels, or too little shared memory).
size_t sh_plan(const Plan &p, bool bwd, int sgroups, ShArgs &a) {
    const int esz = p.bf16 ? 2 : 4;
    if (!p.shared || p.stages == 1 || (p.Cc * esz) % 4 != 0) return 0;
    a = ShArgs{};
    for (int d = 0; d < DIRS; d++) {
        a.g[d] = dir_geom(p, d);
        a.lanes_max = a.g[d].N > a.lanes_max ? a.g[d].N : a.lanes_max;
    }
    a.nw = p.bf16 ? p.Cc + 2 : 2 * p.Cc + 3;
    a.sgroups = sgroups;
    a.xtw = p.Cc * esz / 4;
    a.xw = a.xtw / sgroups;
    size_t rows, stage;
    if (bwd) {
        rows = 2 * (size_t)(a.lanes_max + 2) * (p.Cc + 4) * 4;
        stage = (size_t)a.lanes_max * (((2 * a.nw + 3) & ~3) + p.Cc) * 4;
    } else {
        rows = 2 * (size_t)(a.lanes_max + 2) * (p.Cc / sgroups) * 4;
        stage = 2 * (size_t)a.lanes_max * (a.nw + a.xw) * 4;
    }
    rows = (rows + 15) / 16 * 16;
    a.row_bytes = (int)rows;
    const size_t smem = rows + stage;
    return smem + 1024 <= smem_limit() ? smem : 0;   // 1 KB: the backward's static reduction slots
}

int sh_threads(const ShArgs &a, bool bwd) {
    const int t = (a.lanes_max + 31) / 32 * 32;
    const int cap = bwd ? SH_BWD_THREADS : SH_FWD_THREADS;
    return t > cap ? cap : t;
}

// Forward: one block per (image, direction). A split of the channels over two blocks per image
// (sgroups = 2: 128 blocks at the 1024^2 benchmark instead of 64, each with the whole gate chunk)
// measured 2.5x slower (H200: 28.8 ms against 11.6 ms), so sgroups stays 1.
template <typename T, int V>
bool fwd_sh(CudaCtx *c, const Plan &p, const T *xc, const T *gates, float *hid, T *ypart) {
    if (!aligned4(xc) || !aligned4(gates)) return false;
    ShArgs a;
    const size_t smem = sh_plan(p, false, 1, a);
    if (!smem) return false;
    auto k = gspn_fwd_sh_kernel<T, V>;
    set_smem(k, smem);
    k<<<DIRS * p.B, sh_threads(a, false), smem, c->stream>>>(xc, gates, hid, ypart, p.plane, a);
    CUDA_CHECK_LAUNCH();
    return true;
}

template <typename T, int V>
bool bwd_sh(CudaCtx *c, const Plan &p, const T *dyc, const T *xc, const T *gates,
            const float *hid, const void *merge, int merge_bf16, T *dxpart, T *dgates,
            double *dmpart) {
    ShArgs a;
    const size_t smem = sh_plan(p, true, 1, a);
    if (!smem || !aligned4(gates) || (dgates && !aligned4(dgates))) return false;
    auto k = gspn_bwd_sh_kernel<T, V>;
    set_smem(k, smem);
    k<<<DIRS * p.B, sh_threads(a, true), smem, c->stream>>>(dyc, xc, gates, hid, merge, merge_bf16,
                                                       dxpart, dgates, dmpart, p.plane,
                                                       p.B * p.ngroups, a);
    CUDA_CHECK_LAUNCH();
    return true;
}

// The four forward scans by the fastest path that applies. hid and/or ypart may be NULL.
template <typename T, int V, bool SH>
void fwd_scans(CudaCtx *c, const Plan &p, const T *xc, const T *gates, float *hid, T *ypart) {
    const bool done = SH ? fwd_sh<T, V>(c, p, xc, gates, hid, ypart)
                         : fwd_pipe<T, V>(c, p, xc, gates, hid, ypart);
    if (!done) fwd_all<T, V, SH>(c, p, xc, gates, hid, ypart);
}

// Scratch in the stream-ordered pool, kept by the pool between calls (no cudaMalloc per call).
void *scratch_alloc(CudaCtx *c, size_t bytes) {
    cudaMemPool_t pool;
    CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, c->device));
    uint64_t keep = UINT64_MAX;
    CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
    void *ptr = nullptr;
    CUDA_CHECK(cudaMallocAsync(&ptr, bytes ? bytes : 16, c->stream));
    return ptr;
}

template <typename T, int V, bool SH>
void scan_fwd(Ctx *ctx, const Plan &p, const Tensor *xc, const Tensor *gates, const Tensor *merge,
              Tensor *yc, Tensor *hidden) {
    CudaCtx *c = cuda_ctx_of(ctx);
    T *ypart = static_cast<T *>(scratch_alloc(c, DIRS * (size_t)p.plane * sizeof(T)));
    const T *x = static_cast<const T *>(xc->data), *g = static_cast<const T *>(gates->data);
    float *hid = hidden ? tensor_f32(hidden) : nullptr;
    fwd_scans<T, V, SH>(c, p, x, g, hid, ypart);
    const long long nvec = p.plane / V;
    gspn_merge_kernel<T, V><<<ew_blocks(nvec, c), EW_THREADS, 0, c->stream>>>(
        ypart, p.plane, merge->data, merge->dtype == DTYPE_BF16, static_cast<T *>(yc->data));
    CUDA_CHECK_LAUNCH();
    CUDA_CHECK(cudaFreeAsync(ypart, c->stream));
}

template <typename T, int V, bool SH>
void scan_bwd(Ctx *ctx, const Plan &p, const Tensor *dyc, const Tensor *xc, const Tensor *gates,
              const Tensor *merge, const Tensor *hidden, Tensor *dxc, Tensor *dgates,
              Tensor *dmerge, bool write) {
    CudaCtx *c = cuda_ctx_of(ctx);
    const int nblk = p.B * p.ngroups;   // blocks per direction
    const size_t part_bytes = dxc ? DIRS * (size_t)p.plane * sizeof(T) : 0;
    const size_t hid_bytes = hidden ? 0 : DIRS * (size_t)p.plane * sizeof(float);
    const size_t dm_bytes = dmerge ? DIRS * (size_t)nblk * sizeof(double) : 0;
    char *scratch = static_cast<char *>(scratch_alloc(c, part_bytes + hid_bytes + dm_bytes));
    T *dxpart = dxc ? reinterpret_cast<T *>(scratch) : nullptr;
    float *hid = hidden ? tensor_f32(hidden) : reinterpret_cast<float *>(scratch + part_bytes);
    double *dmpart = dmerge ? reinterpret_cast<double *>(scratch + part_bytes + hid_bytes) : nullptr;
    const T *x = static_cast<const T *>(xc->data), *g = static_cast<const T *>(gates->data);

    if (!hidden) fwd_scans<T, V, SH>(c, p, x, g, hid, nullptr);   // recompute h
    const T *dy = static_cast<const T *>(dyc->data);
    T *dg = dgates ? static_cast<T *>(dgates->data) : nullptr;
    const int mbf = merge->dtype == DTYPE_BF16;
    // write: the pipelined kernel writes dgates; the other kernels add, into zeros.
    bool done = !SH && bwd_pipe<T, V>(c, p, dy, x, g, hid, merge->data, mbf, dxpart, dg, dmpart, write);
    if (!done && write && dg)
        CUDA_CHECK(cudaMemsetAsync(dg, 0, tensor_bytes(dgates), c->stream));
    if (!done && SH) done = bwd_sh<T, V>(c, p, dy, x, g, hid, merge->data, mbf, dxpart, dg, dmpart);
    if (!done) {
        CUDA_CHECK(cudaEventRecord(c->fork, c->stream));
        for (int d = 0; d < DIRS; d++) {
            CUDA_CHECK(cudaStreamWaitEvent(c->side[d], c->fork, 0));
            launch_bwd_dir<T, V, SH>(dir_geom(p, d), p.B, dy, x, g, hid + d * p.plane, merge->data,
                                     mbf, dxpart ? dxpart + d * p.plane : nullptr, dg,
                                     dmpart ? dmpart + d * nblk : nullptr, c->side[d]);
            CUDA_CHECK(cudaEventRecord(c->join[d], c->side[d]));
        }
        for (int d = 0; d < DIRS; d++) CUDA_CHECK(cudaStreamWaitEvent(c->stream, c->join[d], 0));
    }
    if (dxc) {
        const long long nvec = p.plane / V;
        gspn_dx_finalize_kernel<T, V><<<ew_blocks(nvec, c), EW_THREADS, 0, c->stream>>>(
            dxpart, p.plane, static_cast<T *>(dxc->data), write ? 1 : 0);
        CUDA_CHECK_LAUNCH();
    }
    if (dmerge) {
        gspn_dmerge_finalize_kernel<<<1, 32 * DIRS, 0, c->stream>>>(dmpart, nblk, dmerge->data,
                                                                     dmerge->dtype == DTYPE_BF16);
        CUDA_CHECK_LAUNCH();
    }
    CUDA_CHECK(cudaFreeAsync(scratch, c->stream));
}

// (dtype, vector width, weight variant) -> the instantiation.
#define GSPN_DISPATCH(p, FN, ...)                                                              \
    do {                                                                                       \
        if ((p).bf16) {                                                                        \
            if ((p).V == 8) {                                                                  \
                if ((p).shared) FN<__nv_bfloat16, 8, true>(__VA_ARGS__);                       \
                else FN<__nv_bfloat16, 8, false>(__VA_ARGS__);                                 \
            } else if ((p).V == 4) {                                                           \
                if ((p).shared) FN<__nv_bfloat16, 4, true>(__VA_ARGS__);                       \
                else FN<__nv_bfloat16, 4, false>(__VA_ARGS__);                                 \
            } else {                                                                           \
                if ((p).shared) FN<__nv_bfloat16, 1, true>(__VA_ARGS__);                       \
                else FN<__nv_bfloat16, 1, false>(__VA_ARGS__);                                 \
            }                                                                                  \
        } else {                                                                               \
            if ((p).V == 4) {                                                                  \
                if ((p).shared) FN<float, 4, true>(__VA_ARGS__);                               \
                else FN<float, 4, false>(__VA_ARGS__);                                         \
            } else {                                                                           \
                if ((p).shared) FN<float, 1, true>(__VA_ARGS__);                               \
                else FN<float, 1, false>(__VA_ARGS__);                                         \
            }                                                                                  \
        }                                                                                      \
    } while (0)

void gspn_fwd_impl(Ctx *ctx, const Tensor *xc, const Tensor *gates, const Tensor *merge,
                   int shared_w, Tensor *yc, Tensor *hidden, Tuning tu) {
    const void *ptrs[] = {xc->data, gates->data, yc ? yc->data : nullptr,
                          hidden ? hidden->data : nullptr};
    const Plan p = make_plan(xc, gates, merge, shared_w, tu, false, ptrs, 4);
    check_dtype_like("yc", yc, xc);
    CG_CHECK(!hidden || (hidden->numel == DIRS * (size_t)p.plane && hidden->dtype == DTYPE_F32 &&
                         hidden->device == DEVICE_CUDA),
             "", "gspn_scan (CUDA): hidden must be (4, B, H, W, Cc) fp32 on the GPU");
    if (p.plane == 0) return;
    GSPN_DISPATCH(p, scan_fwd, ctx, p, xc, gates, merge, yc, hidden);
}

void gspn_bwd_impl(Ctx *ctx, const Tensor *dyc, const Tensor *xc, const Tensor *gates,
                   const Tensor *merge, int shared_w, const Tensor *hidden, Tensor *dxc,
                   Tensor *dgates, Tensor *dmerge, Tuning tu, bool write) {
    const void *ptrs[] = {dyc->data, xc->data, gates->data, hidden ? hidden->data : nullptr,
                          dxc ? dxc->data : nullptr, dgates ? dgates->data : nullptr};
    const Plan p = make_plan(xc, gates, merge, shared_w, tu, true, ptrs, 6);
    check_dtype_like("dyc", dyc, xc);
    check_dtype_like("dxc", dxc, xc);
    check_dtype_like("dgates", dgates, gates);
    CG_CHECK(!dmerge || (dmerge->numel == DIRS && dmerge->device == DEVICE_CUDA), "",
             "gspn_scan (CUDA): dmerge must be 4 elements on the GPU");
    CG_CHECK(!hidden || (hidden->numel == DIRS * (size_t)p.plane && hidden->dtype == DTYPE_F32 &&
                         hidden->device == DEVICE_CUDA),
             "", "gspn_scan (CUDA): hidden must be (4, B, H, W, Cc) fp32 on the GPU");
    if (p.plane == 0 || (!dxc && !dgates && !dmerge)) return;
    GSPN_DISPATCH(p, scan_bwd, ctx, p, dyc, xc, gates, merge, hidden, dxc, dgates, dmerge, write);
}

}  // namespace

// The default tuning: channel group and vector width by auto_tuning, pipeline depth by occupancy,
// no L2 prefetch (it helped in some runs and hurt in others), all four directions.
static const Tuning GSPN_TUNING_DEFAULT = {0, 0, 0, 0, 15};

extern "C" void cuda_gspn_scan_fwd(Ctx *ctx, const Tensor *xc, const Tensor *gates,
                                   const Tensor *merge, int shared_w, Tensor *yc, Tensor *hidden) {
    gspn_fwd_impl(ctx, xc, gates, merge, shared_w, yc, hidden, GSPN_TUNING_DEFAULT);
}

extern "C" void cuda_gspn_scan_bwd(Ctx *ctx, const Tensor *dyc, const Tensor *xc,
                                   const Tensor *gates, const Tensor *merge, int shared_w,
                                   const Tensor *hidden, Tensor *dxc, Tensor *dgates,
                                   Tensor *dmerge) {
    gspn_bwd_impl(ctx, dyc, xc, gates, merge, shared_w, hidden, dxc, dgates, dmerge,
                  GSPN_TUNING_DEFAULT, false);
}

extern "C" void cuda_gspn_scan_bwd_write(Ctx *ctx, const Tensor *dyc, const Tensor *xc,
                                         const Tensor *gates, const Tensor *merge, int shared_w,
                                         const Tensor *hidden, Tensor *dxc, Tensor *dgates,
                                         Tensor *dmerge) {
    gspn_bwd_impl(ctx, dyc, xc, gates, merge, shared_w, hidden, dxc, dgates, dmerge,
                  GSPN_TUNING_DEFAULT, true);
}

// For the benchmark (bench/cuda/gspn_bench.cu): the same ops with another tuning.
extern "C" void cuda_gspn_scan_fwd_tuned(Ctx *ctx, const Tensor *xc, const Tensor *gates,
                                         const Tensor *merge, int shared_w, Tensor *yc,
                                         Tensor *hidden, int cg_bytes, int vec_bytes, int stages,
                                         int prefetch, int dir_mask) {
    gspn_fwd_impl(ctx, xc, gates, merge, shared_w, yc, hidden,
                  Tuning{cg_bytes, vec_bytes, stages, prefetch, dir_mask});
}
extern "C" void cuda_gspn_scan_bwd_tuned(Ctx *ctx, const Tensor *dyc, const Tensor *xc,
                                         const Tensor *gates, const Tensor *merge, int shared_w,
                                         const Tensor *hidden, Tensor *dxc, Tensor *dgates,
                                         Tensor *dmerge, int cg_bytes, int vec_bytes,
                                         int stages, int prefetch, int dir_mask, int write) {
    gspn_bwd_impl(ctx, dyc, xc, gates, merge, shared_w, hidden, dxc, dgates, dmerge,
                  Tuning{cg_bytes, vec_bytes, stages, prefetch, dir_mask}, write != 0);
}
