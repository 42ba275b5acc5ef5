// What the C-GSPN scan's files share: constants, device loads, weights, geometry, the plan.
// The design is in kernels/cuda/gspn_scan.cu's header; gspn_scan_fwd.cu and gspn_scan_bwd.cu
// hold the two passes' kernels and launches, gspn_scan.cu the plan of a call and the C entries.
#pragma once
#include "cuda_common.h"
#include "cuda_async.cuh"
#include "../ops.h"
#include <cooperative_groups.h>
#include <stdint.h>

namespace gspn {

constexpr int DIRS = 4;

namespace cgrp = cooperative_groups;

// The cluster's calls (sm_90 and up; host code launches the kernels that make them only there,
// so an older target compiles a stand-in): the block's rank in its cluster of two, the address in
// the other block's shared memory of an address in this one's, and the cluster's barrier.
__device__ __forceinline__ int chip_rank() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    return (int)cgrp::this_cluster().block_rank();
#else
    return 0;
#endif
}
__device__ __forceinline__ unsigned char *chip_peer(unsigned char *own, int rank) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    return static_cast<unsigned char *>(cgrp::this_cluster().map_shared_rank((void *)own, rank ^ 1));
#else
    return own + 0 * rank;
#endif
}
__device__ __forceinline__ void chip_sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    cgrp::this_cluster().sync();
#else
    __trap();
#endif
}

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

// ---- the weights (docs/design.md#cgspn-layer step 3) --------------------------------------------------------
// fp32 activations use the accurate expf and IEEE division (the fp32 path is held to 1e-5 against
// the CPU); bf16 ones the approximate exp2 / reciprocal units, flushing denormals (~2 ulp, far
// below bf16 rounding of the gates; an exp2 result under 2^-126 only meets 1 + e, and S is at
// least S_MIN). The scans are instruction-bound when every reciprocal is the IEEE sequence (about a
// dozen instructions; ncu: issue-active ~53%, "wait" stalls on top), and the non-flushing
// approximations add range fix-ups (four more instructions a sigmoid), so this matters.
__device__ __forceinline__ float rcp_approx(float x) {
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
}
template <typename T>
__device__ __forceinline__ float recip(float x) {
    if constexpr (sizeof(T) == 4) return 1.0f / x;
    else return rcp_approx(x);
}
template <typename T>
__device__ __forceinline__ float sigmoid(float x) {
    if constexpr (sizeof(T) == 4) {
        return 1.0f / (1.0f + expf(-x));
    } else {
        float e;
        asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(x * -1.4426950408889634f));
        return rcp_approx(1.0f + e);
    }
}

// a_k = sigmoid(wt_k) for neighbours that exist (else 0), S their sum, w_k = a_k / max(S, S_MIN).
// All three sigmoids are formed and the missing ones dropped by selects: no branches in the
// scans' steps.
template <typename T>
__device__ __forceinline__ float weights(float wm, float w0, float wp, bool has_m, bool has_p,
                                         float (&a)[3], float (&w)[3]) {
    const float sm = sigmoid<T>(wm), sp = sigmoid<T>(wp);
    a[0] = has_m ? sm : 0.0f;
    a[1] = sigmoid<T>(w0);
    a[2] = has_p ? sp : 0.0f;
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

// Slots of a pipelined backward stage per item (gspn_bwd_pipe_kernel): 7 inputs, and the 5 old
// dgates when they are added to.
__host__ __device__ constexpr int bwd_stage_slots(int dg_write) { return dg_write ? 7 : 12; }

// ---- pipelined scans (per-channel weights, 8- or 16-byte vectors) ------------------------------
// The same scans with the loads of the next D-1 steps in flight: each thread copies its item's
// inputs for step s+D-1 into a shared-memory stage with cp.async while it computes step s, so
// the memory system always has D-1 steps of every block's traffic to work on (the simple kernels
// above wait for each step's loads before computing it). One launch covers the four directions;
// blockIdx.x = (image, channel group) * 4 + direction, so the four scans of one image slice run
// side by side and can share xc / dyc in L2 (the four read them at different steps).

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
    int dg_write;        // backward: write dgates (GSPN_SCAN_WRITE_GRADS) instead of adding into it
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

// ---- the lane kernels (gspn_fwd_lane_kernel, gspn_bwd_lane_kernel): a thread per lane --------
// Words a lane's step takes: its gate chunk as the 16-byte vectors covering it (VEC) or as the
// 4-byte words covering it, and its xc (or dyc) as the words covering it.
template <typename T, int CC, bool VEC> struct LaneWords {
    static constexpr int CB = (2 * CC + 3) * (int)sizeof(T);   // chunk bytes: 2 CC + 3 elements
    static constexpr int MAXOFF = sizeof(T) == 2 ? 14 : 12;     // its largest offset in a vector
    static constexpr int NV = (MAXOFF + CB + 15) / 16;          // covering 16-byte vectors
    static constexpr int NW = sizeof(T) == 2 ? CC + 2 : 2 * CC + 3;   // covering 4-byte words
    static constexpr int GW = VEC ? 4 * NV : NW;                // words the ring holds a chunk in
    // xc: whole words, except bf16 tokens of odd CC, which may start 2 bytes into a word
    static constexpr int XW = sizeof(T) == 4 ? CC : CC % 2 == 0 ? CC / 2 : (2 * CC + 5) / 4;
    static constexpr int N = GW + XW;
};

// Element q of a run of T values starting `off` bytes (0 or 2; 0 in fp32) into words w.
template <typename T, int NW>
__device__ __forceinline__ float lane_el(const uint32_t (&w)[NW], int off, int q) {
    if constexpr (sizeof(T) == 4) {
        return __uint_as_float(w[q]);
    } else {   // half q or q + 1 of the words: both constant (q is), picked by off
        const uint32_t a = w[q >> 1], b = w[(q + 1) >> 1];
        const uint32_t ea = q & 1 ? a >> 16 : a & 0xffffu, eb = (q + 1) & 1 ? b >> 16 : b & 0xffffu;
        return __uint_as_float((off ? eb : ea) << 16);
    }
}

// Words AT .. AT + GW - 1 of w: the lane's gate chunk starting at byte cb of the gate tensor
// (gend bytes long; the last token's covering vectors may reach past it: those words one by one).
template <typename T, int CC, bool VEC, int AT, int N>
__device__ __forceinline__ void lane_load_chunk(const T *__restrict__ g, long long cb, long long gend,
                                                uint32_t (&w)[N]) {
    using LW = LaneWords<T, CC, VEC>;
    const uint32_t *gw = reinterpret_cast<const uint32_t *>(g);
    if constexpr (VEC) {
        const long long vb = cb & ~15LL;
#pragma unroll
        for (int v = 0; v < LW::NV; v++) {
            uint4 r = make_uint4(0, 0, 0, 0);
            if (vb + 16 * v + 16 <= gend) r = __ldg(reinterpret_cast<const uint4 *>(g) + (vb >> 4) + v);
            else if (vb + 16 * v < gend) {
                const uint32_t *q = gw + ((vb >> 2) + 4 * v);
                r.x = __ldg(q);
                if (vb + 16 * v + 8 <= gend) r.y = __ldg(q + 1);
                if (vb + 16 * v + 12 <= gend) r.z = __ldg(q + 2);
            }
            w[AT + 4 * v] = r.x, w[AT + 4 * v + 1] = r.y, w[AT + 4 * v + 2] = r.z, w[AT + 4 * v + 3] = r.w;
        }
    } else {
#pragma unroll
        for (int i = 0; i < LW::NW; i++) w[AT + i] = __ldg(gw + (cb >> 2) + i);
    }
}

// The chunk's NW words from its first covering word on (cb: its byte in the tensor) out of the
// GW words at AT of w.
template <typename T, int CC, bool VEC, int AT, int N>
__device__ __forceinline__ void lane_chunk_words(const uint32_t (&w)[N], long long cb,
                                                 uint32_t (&cw)[LaneWords<T, CC, VEC>::NW]) {
    using LW = LaneWords<T, CC, VEC>;
    if constexpr (VEC) {
        static_assert(LW::NW + 3 <= LW::GW, "covering vectors");   // no guard needed below
        const int w0 = (int)((cb & 15) >> 2);
#pragma unroll
        for (int i = 0; i < LW::NW; i++)
            cw[i] = w0 == 0 ? w[AT + i] : w0 == 1 ? w[AT + i + 1] : w0 == 2 ? w[AT + i + 2] : w[AT + i + 3];
    } else {
#pragma unroll
        for (int i = 0; i < LW::NW; i++) cw[i] = w[AT + i];
    }
}

// Words AT .. AT + XW - 1 of w: the words covering token t's CC values of x (xend bytes long; the
// last word of an odd-length bf16 tensor covers 2 bytes past its end and is read as its element).
template <typename T, int CC, int AT, int N>
__device__ __forceinline__ void lane_load_x(const T *__restrict__ x, long long t, long long xend,
                                            uint32_t (&w)[N]) {
    const uint32_t *xw = reinterpret_cast<const uint32_t *>(x);
    const long long xb = (t * CC * (long long)sizeof(T)) & ~3LL;
#pragma unroll
    for (int i = 0; i < LaneWords<T, CC, false>::XW; i++) {
        const long long b = xb + 4LL * i;
        w[AT + i] = b + 4 <= xend ? __ldg(xw + (b >> 2))
                                  : *reinterpret_cast<const unsigned short *>(reinterpret_cast<const char *>(x) + b);
    }
}

// h and y of a lane's P steps (hg[j], yg[j]: step j), whose tokens are neighbours in memory from
// t_lo up (up: step j is token t_lo + j; else t_lo + P - 1 - j), each stored as one run, in 16-byte
// vectors where aligned (a direction's slice starts plane floats in).
template <int P, int CC>
__device__ __forceinline__ void lane_store_run(float *hid, float *ypart, long long t_lo, bool up,
                                               const float (&hg)[P][CC], const float (&yg)[P][CC]) {
    float hr[P * CC], yr[P * CC];
#pragma unroll
    for (int r = 0; r < P; r++)
#pragma unroll
        for (int c = 0; c < CC; c++) {
            hr[r * CC + c] = up ? hg[r][c] : hg[P - 1 - r][c];
            yr[r * CC + c] = up ? yg[r][c] : yg[P - 1 - r][c];
        }
    auto aligned = [](const float *q) { return ((uintptr_t)q & 15u) == 0; };
    if (hid && aligned(hid + t_lo * CC)) stf_stream<P * CC>(hid + t_lo * CC, hr);
    else if (hid)
#pragma unroll
        for (int i = 0; i < P * CC; i++) __stcs(hid + t_lo * CC + i, hr[i]);
    if (ypart && aligned(ypart + t_lo * CC)) stf<P * CC>(ypart + t_lo * CC, yr);
    else if (ypart)
#pragma unroll
        for (int i = 0; i < P * CC; i++) ypart[t_lo * CC + i] = yr[i];
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

// Tuning (the benchmark sweeps it): cg_bytes = bytes of one token's channels a block owns with
// per-channel weights (32 = one sector); vec_bytes = bytes a thread loads at once (16 or 8);
// cg_bytes = 0 picks both (auto_tuning). stages = cp.async pipeline depth of the pipelined
// kernels (0: the largest that keeps enough blocks resident; 1: the simple kernels).
struct Tuning {
    int cg_bytes, vec_bytes, stages, prefetch;
    int dir_mask;   // benchmark diagnostics only: run these directions of the pipelined kernels
};
// The default tuning: channel group and vector width by auto_tuning, pipeline depth by occupancy,
// no L2 prefetch (it helped in some runs and hurt in others), all four directions.
constexpr Tuning TUNING_DEFAULT = {0, 0, 0, 0, 15};

// The plan of a call and the launch geometry (gspn_scan.cu, each described there).
Plan make_plan(const char *op, const Tensor *xc, const Tensor *gates, const Tensor *merge, int shared_w,
               Tuning tu, bool bwd, const void *const *ptrs, int nptrs);
// t (NULL: not given) as ref: its element count (kernels/gspn_scan_shape.h), on the GPU, ref's dtype.
void check_like(const char *op, const char *name, const Tensor *t, const char *ref_name, const Tensor *ref);
// hidden (NULL: not given): (4, B, H, W, Cc) fp32 on the GPU.
void check_hidden(const char *op, const Tensor *hidden, long long plane);
DirGeom dir_geom(const Plan &p, int d);
int scan_threads(const DirGeom &g);
size_t smem_limit();
int ew_blocks(long long nvec, const CudaCtx *c);
ScanArgs scan_args(const Plan &p);
int lane_state_bytes(const Plan &p, const ScanArgs &a, bool bwd);
size_t pipe_smem(const Plan &p, const ScanArgs &a, bool bwd, int D);
int pipe_stages(const Plan &p, const ScanArgs &a, bool bwd, int max_threads, const CudaCtx *c);
bool aligned4(const void *p);
size_t sh_plan(const Plan &p, bool bwd, int sgroups, ShArgs &a);
int sh_threads(const ShArgs &a, bool bwd);
void *scratch_alloc(CudaCtx *c, size_t bytes);

// A launch in clusters of two blocks (sm_90 and up: a launch attribute, so sm_80 builds the
// kernels without it); cudaLaunchKernelEx(&l.cfg, kernel, args...).
struct PairLaunch {
    cudaLaunchAttribute attr[1];
    cudaLaunchConfig_t cfg;
    PairLaunch(cudaStream_t stream, int blocks, int threads, size_t smem) : attr{}, cfg{} {
        attr[0].id = cudaLaunchAttributeClusterDimension;
        attr[0].val.clusterDim.x = 2;
        attr[0].val.clusterDim.y = 1;
        attr[0].val.clusterDim.z = 1;
        cfg.gridDim = dim3(blocks);
        cfg.blockDim = dim3(threads);
        cfg.dynamicSmemBytes = smem;
        cfg.stream = stream;
        cfg.attrs = attr;
        cfg.numAttrs = 1;
    }
};

template <typename K>
void set_smem(K kernel, size_t bytes) {
    if (bytes > 48 * 1024)
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        (int)bytes));
}

template <typename K, typename... Args>
void launch_pipe(K kernel, const Plan &p, const ScanArgs &a, size_t smem, int ipt,
                 cudaStream_t st, Args... args) {
    set_smem(kernel, smem);
    const int threads = ((a.items_max + ipt - 1) / ipt + 31) / 32 * 32;
    kernel<<<DIRS * p.B * p.ngroups, threads, smem, st>>>(args..., a);
    CUDA_CHECK_LAUNCH();
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

// The instantiations GSPN_DISPATCH picks from (explicitly instantiated by gspn_scan_fwd.cu).
#define GSPN_INSTANCES(X)                                                                      \
    X(__nv_bfloat16, 8, true) X(__nv_bfloat16, 8, false)                                       \
    X(__nv_bfloat16, 4, true) X(__nv_bfloat16, 4, false)                                       \
    X(__nv_bfloat16, 1, true) X(__nv_bfloat16, 1, false)                                       \
    X(float, 4, true) X(float, 4, false)                                                       \
    X(float, 1, true) X(float, 1, false)

// The four forward scans (gspn_scan_fwd.cu; the backward recomputes h with them).
template <typename T, int V, bool SH>
void fwd_scans(CudaCtx *c, const Plan &p, const T *xc, const T *gates, float *hid, float *ypart);

// The shared-weight scans on images that fit on chip (gspn_scan_image.cu): img_fits says whether
// the path applies to the device, the plan and pointers (NULL ones skipped; adds_dgates: a
// backward that adds into dgates, which it does not take); fwd_img writes yc and hid (or not,
// NULL), its gates made from xc by gw and gb where gw is set (gates unused then); bwd_img writes
// (write) or adds dxc, writes dgates (either NULL: skipped), h from hid or recomputed when NULL,
// and dmpart (4, B) fp64 partials of dmerge (NULL: skipped).
template <typename T>
bool img_fits(const CudaCtx *c, const Plan &p, bool bwd, bool adds_dgates, const void *const *ptrs,
              int nptrs);
template <typename T>
void fwd_img(CudaCtx *c, const Plan &p, const T *xc, const T *gates, const T *gw, const T *gb, const void *merge,
             int merge_bf16, T *yc, float *hid);
template <typename T>
void bwd_img(CudaCtx *c, const Plan &p, const T *dyc, const T *xc, const T *gates, const float *hid,
             const void *merge, int merge_bf16, T *dxc, T *dgates, double *dmpart, bool write);

// The two passes with a tuning (gspn_scan_fwd.cu, gspn_scan_bwd.cu); gspn_scan.cu's C entries.
void gspn_fwd_impl(Ctx *ctx, const Tensor *xc, const Tensor *gates, const Tensor *merge,
                   int shared_w, Tensor *yc, Tensor *hidden, Tuning tu);
void gspn_bwd_impl(Ctx *ctx, const Tensor *dyc, const Tensor *xc, const Tensor *gates,
                   const Tensor *merge, int shared_w, const Tensor *hidden, Tensor *dxc,
                   Tensor *dgates, Tensor *dmerge, Tuning tu, bool write);

}  // namespace gspn
