// C-GSPN scan with shared weights on images that fit on chip (gspn_hier's 56 x 56, 28 x 28,
// 14 x 14 and 7 x 7 latents at Cc = 2; the plan in gspn_scan.cu's header covers the rest). A scan
// step is short and the steps are serial, so kernels that fetch each step's inputs from global
// memory spend a memory latency per step. Here an image goes on chip once and every step runs
// from shared memory and registers.
//
// Work split: a cluster of two blocks per image (sm_90 and up); block r owns the direction pair
// {2r, 2r+1} (TB+BT, LR+RL), a warp per direction, two lanes a thread (lines of at most 64
// lanes), the neighbours' h (dL/dh) of the previous step passed by warp shuffles: no barrier
// inside the scan. Each block keeps, per direction of its pair, a plane of slots (one per
// token: that direction's lam | u | wt, padded to 16 bytes) in its pair's layout: rows-major
// for TB/BT and columns-major for LR/RL (column pitch H | 1, odd, so that neither the lanes'
// reads nor the staging writes conflict in the banks). So a step's lanes read consecutive
// slots in every direction.
//
// Forward: the blocks stage the gates coalesced (each block half of the image's tokens, through
// a per-warp scratch, writing every direction's slots into its own or its peer's shared memory),
// then xc in their layout; or, given the gate projection (gspn_scan_proj_fwd), xc first and each
// token's gates made from it into the slots, as linear_fwd's narrow kernel makes them (the gates
// never in memory). Once a step has read a slot, the slot keeps that token's h (fp32) and u.
// After a cluster barrier each block merges yc = m0 y0 + m1 y1 + m2 y2 + m3 y3 with y_d = u_d h_d
// (the staged kernels' order) for its half of the tokens, reading the peer's planes through
// distributed shared memory, and writes its two directions' h to `hid` as whole rows.
// Backward: xc, dyc and h (from hid, or recomputed on chip) staged likewise; the reverse scan runs
// only the chain of dL/dh into a plane; then all eight warps form, token by token, the gate
// gradients into the slots (rounded once: the writing op only; an accumulating one takes the
// staged kernels) and lam dh over dh; then dxc = ((p0 + p1) + p2) + p3 for each block's half of
// the tokens (the peer's planes by distributed shared memory) and dgates as each block's half of
// every token's row (its pair's gates are 4-byte aligned there) through a per-warp scratch.
// dmerge in fp64: a thread's tokens, the warp in a fixed tree, the warps in order. Bitwise
// deterministic.
//
// Bytes: the inputs are read once and the outputs written once (the must-move bytes of
// gspn_scan.cu's model), no per-direction slices. At 56 x 56, Cc = 2, bf16 the forward block
// takes 112 KiB (two an SM) and the backward's 225 KiB (one an SM).
#include "gspn_scan_common.cuh"
#include "narrow_dot.cuh"

namespace gspn {

namespace {

constexpr int CHIP_LMAX = 64;     // lanes of the longer line: two a thread, one warp a direction
constexpr int CHIP_THREADS = 256;
constexpr int CHIP_WARPS = CHIP_THREADS / 32;
constexpr int CHIP_TG = 16;       // tokens a warp stages or writes out at once through its scratch

// A direction's gates of one token in a slot: lam (CC) | u (CC) | wt (3), as in the gate tensor.
template <typename T, int CC>
struct Slot {
    static constexpr int SE = 2 * CC + 3;
    static constexpr int BYTES = (SE * (int)sizeof(T) + 15) / 16 * 16;
    static constexpr int WORDS = BYTES / 4;
    static constexpr int RW = DIRS * SE * (int)sizeof(T) / 4;   // 4-byte words of a token's gates
};

struct ChipGeom {
    int H, W, PH, NT;   // PH = H | 1: columns-major planes' pitch; NT = W * PH slots a plane
    float invW;         // t / W exactly for t < 2^16 (see chip_rc)
    size_t xs, dys, hid, part, dm, total;   // byte offsets (the slot planes first)
};

__host__ __device__ constexpr size_t chip_align(size_t b) { return (b + 15) / 16 * 16; }

template <typename T, int CC>
ChipGeom chip_geom(int H, int W, bool bwd) {
    ChipGeom g{};
    g.H = H;
    g.W = W;
    g.PH = H | 1;
    g.NT = W * g.PH;
    g.invW = 1.0f / (float)W;
    const size_t nt = (size_t)g.NT, tok = chip_align(nt * CC * sizeof(T));
    const size_t f32 = chip_align(nt * CC * sizeof(float));
    const size_t scratch = (size_t)CHIP_WARPS * CHIP_TG * Slot<T, CC>::RW * 4;
    g.xs = 2 * nt * Slot<T, CC>::BYTES;
    // the gates' staging scratch: where xc goes next (forward), in the lam dh planes (backward,
    // whose xc, dyc and h copies start first); the backward's write-out scratch: the h planes
    g.dys = g.xs + tok;
    g.hid = g.xs + (bwd ? 2 * tok : (tok > scratch ? tok : scratch));
    g.part = g.hid + (bwd ? (2 * f32 > scratch ? 2 * f32 : scratch) : 0);
    g.dm = g.part + (bwd ? (2 * f32 > scratch ? 2 * f32 : scratch) : 0);
    g.total = g.dm + (bwd ? 2 * CHIP_WARPS * sizeof(double) : 0);
    return g;
}

// Token t of the image as (row, column): floor((t + 0.5) / W) in fp32 is exact while t < 2^16
// (the error, below t 2^-23 / W, stays under the 0.5 / W margin).
__device__ __forceinline__ void chip_rc(const ChipGeom &g, int t, int &i, int &j) {
    i = __float2int_rz(((float)t + 0.5f) * g.invW);
    j = t - i * g.W;
}
// Slot index of (i, j) in pair r's layout.
__device__ __forceinline__ int chip_tix(const ChipGeom &g, int r, int i, int j) {
    return r == 0 ? i * g.W + j : j * g.PH + i;
}
// Direction d's walk: its steps and lanes, and the slot index s0 + s ss + l of step s and lane l
// (the lanes of a step are consecutive slots in both layouts).
struct ChipWalk {
    int steps, lanes, s0, ss;
};
__device__ __forceinline__ ChipWalk chip_walk(const ChipGeom &g, int d) {
    switch (d) {
    case 0: return {g.H, g.W, 0, g.W};                       // TB
    case 1: return {g.H, g.W, (g.H - 1) * g.W, -g.W};        // BT
    case 2: return {g.W, g.H, 0, g.PH};                      // LR
    default: return {g.W, g.H, (g.W - 1) * g.PH, -g.PH};     // RL
    }
}

// Element e of 4-byte words holding T values: its bits (a bf16's 16 in the low half).
template <typename T, int N>
__device__ __forceinline__ uint32_t raw_elem(const uint32_t (&w)[N], int e) {
    if constexpr (sizeof(T) == 4) return w[e];
    else return (e & 1) ? (w[e >> 1] >> 16) : (w[e >> 1] & 0xffffu);
}
template <typename T, int N>
__device__ __forceinline__ void put_raw(uint32_t (&w)[N], int e, uint32_t bits) {
    if constexpr (sizeof(T) == 4) w[e] = bits;
    else w[e >> 1] |= (e & 1) ? (bits << 16) : bits;
}
template <typename T, int N>
__device__ __forceinline__ float get_f32(const uint32_t (&w)[N], int e) {
    if constexpr (sizeof(T) == 4) return __uint_as_float(w[e]);
    else return __uint_as_float(raw_elem<T>(w, e) << 16);
}
template <typename T>
__device__ __forceinline__ uint32_t f32_bits(float v) {
    if constexpr (sizeof(T) == 4) return __float_as_uint(v);
    else return __bfloat16_as_ushort(__float2bfloat16_rn(v));
}

template <typename T, int CC>
__device__ __forceinline__ void slot_load(const unsigned char *slot, uint32_t (&w)[Slot<T, CC>::WORDS]) {
#pragma unroll
    for (int v = 0; v < Slot<T, CC>::WORDS / 4; v++) {
        const uint4 q = reinterpret_cast<const uint4 *>(slot)[v];
        w[4 * v] = q.x, w[4 * v + 1] = q.y, w[4 * v + 2] = q.z, w[4 * v + 3] = q.w;
    }
}
template <typename T, int CC>
__device__ __forceinline__ void slot_store(unsigned char *slot, const uint32_t (&w)[Slot<T, CC>::WORDS]) {
#pragma unroll
    for (int v = 0; v < Slot<T, CC>::WORDS / 4; v++)
        reinterpret_cast<uint4 *>(slot)[v] = make_uint4(w[4 * v], w[4 * v + 1], w[4 * v + 2], w[4 * v + 3]);
}

// Slot planes of direction d: in block d / 2's shared memory (own or peer), plane d % 2.
template <typename T, int CC>
__device__ __forceinline__ unsigned char *slot_plane(const ChipGeom &g, unsigned char *own,
                                                     unsigned char *peer, int rank, int d) {
    return ((d >> 1) == rank ? own : peer) + (size_t)(d & 1) * g.NT * Slot<T, CC>::BYTES;
}

// This block's half of the image's tokens.
__device__ __forceinline__ void chip_half(const ChipGeom &g, int rank, int &t0, int &t1) {
    const int hw = g.H * g.W, half = (hw + 1) / 2;
    t0 = rank * half;
    t1 = hw < t0 + half ? hw : t0 + half;
}

// The gates of this block's half of the tokens into the four directions' slots. A warp copies
// CHIP_TG whole token rows into its scratch (consecutive words on consecutive lanes), then a lane
// per token splits its row into the four slots; the loads of the warp's next NB groups are in
// flight meanwhile.
template <typename T, int CC>
__device__ void chip_stage_gates(const ChipGeom &g, const T *gimg, int rank, unsigned char *own,
                                 unsigned char *peer, uint32_t *scratch_all) {
    using S = Slot<T, CC>;
    constexpr int PER_LANE = (CHIP_TG * S::RW + 31) / 32;
    constexpr int NB = 28 / PER_LANE > 1 ? 28 / PER_LANE : 1;   // about 56 registers of loads
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    uint32_t *scratch = scratch_all + warp * CHIP_TG * S::RW;
    const uint32_t *src = reinterpret_cast<const uint32_t *>(gimg);
    int t0, t1;
    chip_half(g, rank, t0, t1);
    const int first = t0 + warp * CHIP_TG, stride = CHIP_WARPS * CHIP_TG;
    const int ngroups = first < t1 ? (t1 - first + stride - 1) / stride : 0;
    const auto load = [&](int k0, uint32_t (&v)[NB][PER_LANE]) {
#pragma unroll
        for (int gi = 0; gi < NB; gi++) {
            const int tg = first + (k0 + gi) * stride, nw = (t1 - tg < CHIP_TG ? t1 - tg : CHIP_TG) * S::RW;
#pragma unroll
            for (int k = 0; k < PER_LANE; k++) {
                const int w = lane + 32 * k;
                v[gi][k] = k0 + gi < ngroups && w < nw ? __ldg(src + (size_t)tg * S::RW + w) : 0u;
            }
        }
    };
    uint32_t cur[NB][PER_LANE], nxt[NB][PER_LANE];
    load(0, cur);
    for (int k0 = 0; k0 < ngroups; k0 += NB) {
        if (k0 + NB < ngroups) load(k0 + NB, nxt);
#pragma unroll
        for (int gi = 0; gi < NB; gi++) {
            if (k0 + gi >= ngroups) break;
            const int tg = first + (k0 + gi) * stride, n = t1 - tg < CHIP_TG ? t1 - tg : CHIP_TG;
#pragma unroll
            for (int k = 0; k < PER_LANE; k++)
                if (lane + 32 * k < n * S::RW) scratch[lane + 32 * k] = cur[gi][k];
            __syncwarp();
            if (lane < n) {
                uint32_t rec[S::RW];
#pragma unroll
                for (int w = 0; w < S::RW; w++) rec[w] = scratch[lane * S::RW + w];
                int i, j;
                chip_rc(g, tg + lane, i, j);
#pragma unroll
                for (int d = 0; d < DIRS; d++) {
                    uint32_t sw[S::WORDS] = {};
#pragma unroll
                    for (int k = 0; k < S::SE; k++) put_raw<T>(sw, k, raw_elem<T>(rec, d * S::SE + k));
                    slot_store<T, CC>(slot_plane<T, CC>(g, own, peer, rank, d) +
                                          (size_t)chip_tix(g, d >> 1, i, j) * S::BYTES, sw);
                }
            }
            __syncwarp();
        }
#pragma unroll
        for (int gi = 0; gi < NB; gi++)
#pragma unroll
            for (int k = 0; k < PER_LANE; k++) cur[gi][k] = nxt[gi][k];
    }
}

// The gates of this block's half of the tokens made from xc (staged in this pair's layout) into
// the four directions' slots: gate o = narrow_dot(xc, gw[o], gb[o]) rounded to T, linear_fwd's
// narrow kernel's formula (narrow_dot.cuh), so the slots hold the bits the gate projection writes.
template <typename T, int CC>
__device__ void chip_make_gates(const ChipGeom &g, const T *__restrict__ gw, const T *__restrict__ gb, int rank,
                                unsigned char *own, unsigned char *peer) {
    using S = Slot<T, CC>;
    const T *xs = reinterpret_cast<const T *>(own + g.xs);
    int t0, t1;
    chip_half(g, rank, t0, t1);
    for (int t = t0 + (int)threadIdx.x; t < t1; t += CHIP_THREADS) {
        int i, j;
        chip_rc(g, t, i, j);
        float xv[CC];
#pragma unroll
        for (int c = 0; c < CC; c++) xv[c] = to_f32(xs[chip_tix(g, rank, i, j) * CC + c]);
#pragma unroll
        for (int d = 0; d < DIRS; d++) {
            uint32_t sw[S::WORDS] = {};
#pragma unroll
            for (int k = 0; k < S::SE; k++) {
                const int o = d * S::SE + k;   // uniform across the block: cached loads
                float wv[CC];
#pragma unroll
                for (int c = 0; c < CC; c++) wv[c] = to_f32(gw[o * CC + c]);
                put_raw<T>(sw, k, f32_bits<T>(narrow_dot<CC>(xv, wv, gb ? to_f32(gb[o]) : 0.0f)));
            }
            slot_store<T, CC>(slot_plane<T, CC>(g, own, peer, rank, d) + (size_t)chip_tix(g, d >> 1, i, j) * S::BYTES,
                              sw);
        }
    }
}

// CC values a token of an image-major array (xc, dyc: T; h: fp32) into this pair's layout: 4-byte
// copies in flight (cp.async; the caller commits and waits) where a token is whole words, else
// loads and stores.
template <typename E, int CC>
__device__ void chip_stage_tokens(const ChipGeom &g, int rank, const E *__restrict__ src, E *dst) {
    const int hw = g.H * g.W;
    if constexpr (CC * sizeof(E) % 4 == 0) {
        constexpr int WPT = CC * (int)sizeof(E) / 4;   // words a token
        const uint32_t *s = reinterpret_cast<const uint32_t *>(src);
        uint32_t *d = reinterpret_cast<uint32_t *>(dst);
        for (int e = threadIdx.x; e < hw * WPT; e += CHIP_THREADS) {
            const int t = e / WPT, k = e - t * WPT;
            int i, j;
            chip_rc(g, t, i, j);
            cp_async<4>(d + chip_tix(g, rank, i, j) * WPT + k, s + e);
        }
    } else {
        constexpr int U = 8;
        for (int e0 = threadIdx.x; e0 < hw * CC; e0 += U * CHIP_THREADS) {
            E v[U];
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int e = e0 + u * CHIP_THREADS;
                v[u] = e < hw * CC ? src[e] : E{};
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int e = e0 + u * CHIP_THREADS;
                if (e >= hw * CC) break;
                const int t = e / CC, c = e - t * CC;
                int i, j;
                chip_rc(g, t, i, j);
                dst[chip_tix(g, rank, i, j) * CC + c] = v[u];
            }
        }
    }
}

// A thread's two lanes are 2 lane and 2 lane + 1: the values of lanes 2 lane - 1 (thread lane - 1's
// second) and 2 lane + 2 (thread lane + 1's first), by shuffles (the warp's edges get their own).
template <int N>
__device__ __forceinline__ void beside_lanes(const float (&v)[2][N], float (&left)[N], float (&right)[N]) {
#pragma unroll
    for (int c = 0; c < N; c++) {
        left[c] = __shfl_up_sync(0xffffffffu, v[1][c], 1);
        right[c] = __shfl_down_sync(0xffffffffu, v[0][c], 1);
    }
}

// Forward scan of direction d = 2 rank + q by one warp. HU_SLOT: h (fp32) and u (T) into the slot
// once read, for the merge and the write-out of h (else the slots keep the gates); HID_S: h into
// this direction's plane on chip (hid_s). The next step's slots are read and its weights formed
// while this step's chain (shuffles, then three FMAs a channel) runs. Branch-free: a missing
// neighbour has weight 0 and h is 0 before the first step, so the sums need no tests (a step is
// issue-bound: one warp a direction).
template <typename T, int CC, bool HU_SLOT, bool HID_S>
__device__ void chip_scan_fwd(const ChipGeom &g, int rank, int q, unsigned char *own, float *hid_s) {
    using S = Slot<T, CC>;
    const int d = 2 * rank + q, lane = threadIdx.x & 31;
    const ChipWalk k = chip_walk(g, d);
    unsigned char *plane = own + (size_t)q * g.NT * S::BYTES;
    const T *xs = reinterpret_cast<const T *>(own + g.xs);
    int lc[2];
    bool live[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int l = 2 * lane + r;
        live[r] = l < k.lanes;
        lc[r] = live[r] ? l : k.lanes - 1;
    }
    struct In {
        float lx[CC], u[CC], w[3];   // lam xc, u, the weights
    };
    const auto load = [&](int s, In (&in)[2]) {
        const int sb = k.s0 + s * k.ss;
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int t = sb + lc[r];
            uint32_t w[S::WORDS] = {};
            // a lane past the line reads nothing under HU_SLOT: its stand-in slot, the last lane's,
            // is rewritten by that lane with no barrier between
            if (!HU_SLOT || live[r]) slot_load<T, CC>(plane + (size_t)t * S::BYTES, w);
#pragma unroll
            for (int c = 0; c < CC; c++) {
                in[r].lx[c] = get_f32<T>(w, c) * to_f32(xs[t * CC + c]);
                in[r].u[c] = get_f32<T>(w, CC + c);
            }
            float a[3];
            weights<T>(get_f32<T>(w, 2 * CC), get_f32<T>(w, 2 * CC + 1), get_f32<T>(w, 2 * CC + 2),
                       lc[r] > 0, lc[r] < k.lanes - 1, a, in[r].w);
        }
    };
    float h[2][CC] = {};
    In cur[2];
    load(0, cur);
    for (int s = 0; s < k.steps; s++) {
        In nxt[2];
        load(s + 1 < k.steps ? s + 1 : s, nxt);   // the last step loads itself again: no branch
        float left[CC], right[CC];   // h at step s - 1
        beside_lanes<CC>(h, left, right);
        const int sb = k.s0 + s * k.ss;
        float hn[2][CC];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const float *w = cur[r].w;
#pragma unroll
            for (int c = 0; c < CC; c++) {
                const float hm = r == 0 ? left[c] : h[0][c], hp = r == 0 ? h[1][c] : right[c];
                float acc = cur[r].lx[c];
                acc += w[0] * hm;
                acc += w[1] * h[r][c];
                acc += w[2] * hp;
                hn[r][c] = live[r] ? acc : 0.0f;
            }
            if (live[r]) {
                const int t = sb + lc[r];
                if (HU_SLOT) {   // h (CC fp32), then u (CC of T) from byte 4 CC on
                    constexpr int U0 = CC * 4 / (int)sizeof(T);
                    uint32_t hu[S::WORDS] = {};
#pragma unroll
                    for (int c = 0; c < CC; c++) {
                        hu[c] = __float_as_uint(hn[r][c]);
                        put_raw<T>(hu, U0 + c, f32_bits<T>(cur[r].u[c]));
                    }
                    slot_store<T, CC>(plane + (size_t)t * S::BYTES, hu);
                }
                if (HID_S)
#pragma unroll
                    for (int c = 0; c < CC; c++) hid_s[t * CC + c] = hn[r][c];
            }
        }
#pragma unroll
        for (int r = 0; r < 2; r++) {
#pragma unroll
            for (int c = 0; c < CC; c++) h[r][c] = hn[r][c];
            cur[r] = nxt[r];
        }
    }
}

// ---- forward --------------------------------------------------------------------------------
// gw NULL: the gates are read from gates; else made from xc with gw and gb (gates unused).
template <typename T, int CC>
__global__ void __launch_bounds__(CHIP_THREADS)
gspn_fwd_chip_kernel(const T *__restrict__ xc, const T *__restrict__ gates, const T *__restrict__ gw,
                     const T *__restrict__ gb, const void *merge, int merge_bf16, T *__restrict__ yc,
                     float *__restrict__ hid, long long plane, ChipGeom g) {
    using S = Slot<T, CC>;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const int rank = chip_rank(), b = blockIdx.x / 2, hw = g.H * g.W;
    unsigned char *peer = chip_peer(smem_raw, rank);
    chip_sync();   // the peer has started: its shared memory may be written
    if (!gw) {
        chip_stage_gates<T, CC>(g, gates + (size_t)b * hw * DIRS * S::SE, rank, smem_raw, peer,
                                reinterpret_cast<uint32_t *>(smem_raw + g.xs));
        __syncthreads();   // the scratch (in the xc region) is free again
    }
    chip_stage_tokens<T, CC>(g, rank, xc + (size_t)b * hw * CC, reinterpret_cast<T *>(smem_raw + g.xs));
    cp_async_commit();
    cp_async_wait<0>();
    if (gw) {
        __syncthreads();   // every thread's xc copies have landed
        chip_make_gates<T, CC>(g, gw, gb, rank, smem_raw, peer);
    }
    chip_sync();
    const int warp = threadIdx.x >> 5;
    if (warp < 2) chip_scan_fwd<T, CC, true, false>(g, rank, warp, smem_raw, nullptr);
    chip_sync();
    float m[DIRS];
#pragma unroll
    for (int d = 0; d < DIRS; d++) m[d] = load_param(merge, merge_bf16, d);
    int t0, t1;
    chip_half(g, rank, t0, t1);
    constexpr int U = 4;   // elements a thread has in flight (the peer's reads take a round trip)
    for (int e0 = t0 * CC + threadIdx.x; e0 < t1 * CC; e0 += U * CHIP_THREADS) {
        float y[U][DIRS];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int e = e0 + u * CHIP_THREADS, t = (e < t1 * CC ? e : t0 * CC) / CC, c = e - t * CC;
            int i, j;
            chip_rc(g, t, i, j);
#pragma unroll
            for (int d = 0; d < DIRS; d++) {   // y_d = u_d h_d
                const unsigned char *slot = slot_plane<T, CC>(g, smem_raw, peer, rank, d) +
                                            (size_t)chip_tix(g, d >> 1, i, j) * S::BYTES;
                y[u][d] = to_f32(reinterpret_cast<const T *>(slot + CC * 4)[c]) *
                          reinterpret_cast<const float *>(slot)[c];
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int e = e0 + u * CHIP_THREADS;
            if (e >= t1 * CC) break;
            float acc = m[0] * y[u][0];
            acc += m[1] * y[u][1];
            acc += m[2] * y[u][2];
            acc += m[3] * y[u][3];
            yc[(size_t)b * hw * CC + e] = from_f32<T>(acc);
        }
    }
    if (hid)   // h of this block's two directions, coalesced
        for (int q = 0; q < 2; q++) {
            const unsigned char *pl = smem_raw + (size_t)q * g.NT * S::BYTES;
            float *dst = hid + (2 * rank + q) * plane + (size_t)b * hw * CC;
            for (int e = threadIdx.x; e < hw * CC; e += CHIP_THREADS) {
                const int t = e / CC, c = e - t * CC;
                int i, j;
                chip_rc(g, t, i, j);
                dst[e] = reinterpret_cast<const float *>(pl + (size_t)chip_tix(g, rank, i, j) * S::BYTES)[c];
            }
        }
    chip_sync();   // the peer reads this block's planes until here
}

// ---- backward -------------------------------------------------------------------------------
// Reverse scan of direction d = 2 rank + q by one warp: only the chain. Step st: dh = m u dyc +
// w_{+1} dh of lane l-1, w_0 dh of lane l and w_{-1} dh of lane l+1 at step st + 1 (their weights
// and dh from the previous iteration, by shuffles; zero before the first), into this direction's
// part plane. The gradients that hang off dh are formed afterwards by every warp (chip_grads).
template <typename T, int CC>
__device__ void chip_scan_bwd(const ChipGeom &g, int rank, int q, unsigned char *own, float m) {
    using S = Slot<T, CC>;
    const int d = 2 * rank + q, lane = threadIdx.x & 31;
    const ChipWalk k = chip_walk(g, d);
    const unsigned char *plane = own + (size_t)q * g.NT * S::BYTES;
    const T *dys = reinterpret_cast<const T *>(own + g.dys);
    float *dhp = reinterpret_cast<float *>(own + g.part) + (size_t)q * g.NT * CC;
    int lc[2];
    bool live[2], has_m[2], has_p[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int l = 2 * lane + r;
        live[r] = l < k.lanes;
        lc[r] = live[r] ? l : k.lanes - 1;
        has_m[r] = lc[r] > 0;
        has_p[r] = lc[r] < k.lanes - 1;
    }
    struct In {
        float mud[CC], w[3];   // m u dyc, the step's weights
    };
    const auto load = [&](int st, In (&in)[2]) {
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int t = k.s0 + st * k.ss + lc[r];
            uint32_t sw[S::WORDS];
            slot_load<T, CC>(plane + (size_t)t * S::BYTES, sw);
#pragma unroll
            for (int c = 0; c < CC; c++) in[r].mud[c] = m * get_f32<T>(sw, CC + c) * to_f32(dys[t * CC + c]);
            float a[3];
            weights<T>(get_f32<T>(sw, 2 * CC), get_f32<T>(sw, 2 * CC + 1), get_f32<T>(sw, 2 * CC + 2),
                       has_m[r], has_p[r], a, in[r].w);
        }
    };
    float dhn[2][CC] = {}, wn[2][3] = {};   // dL/dh and w_k of step st + 1, by lane
    In cur[2];
    load(k.steps - 1, cur);
    for (int it = 0; it < k.steps; it++) {
        const int st = k.steps - 1 - it;
        In nxt[2];
        load(st > 0 ? st - 1 : 0, nxt);   // the last step loads itself again: no branch
        // lane 2 lane - 1 (thread lane - 1's second) and 2 lane + 2 (thread lane + 1's first)
        const float up_w = __shfl_up_sync(0xffffffffu, wn[1][2], 1);
        const float down_w = __shfl_down_sync(0xffffffffu, wn[0][0], 1);
        float up_dh[CC], down_dh[CC];
        beside_lanes<CC>(dhn, up_dh, down_dh);
        const int sb = k.s0 + st * k.ss;
        float dh_new[2][CC];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const float wpm = has_m[r] ? (r == 0 ? up_w : wn[0][2]) : 0.0f;
            const float w00 = wn[r][1];
            const float wmp = has_p[r] ? (r == 1 ? down_w : wn[1][0]) : 0.0f;
#pragma unroll
            for (int c = 0; c < CC; c++) {
                const float dn_m = has_m[r] ? (r == 0 ? up_dh[c] : dhn[0][c]) : 0.0f;
                const float dn_p = has_p[r] ? (r == 1 ? down_dh[c] : dhn[1][c]) : 0.0f;
                const float dh = wpm * dn_m + w00 * dhn[r][c] + wmp * dn_p + cur[r].mud[c];
                dh_new[r][c] = live[r] ? dh : 0.0f;
                if (live[r]) dhp[(sb + lc[r]) * CC + c] = dh;
            }
        }
#pragma unroll
        for (int r = 0; r < 2; r++) {
#pragma unroll
            for (int c = 0; c < CC; c++) dhn[r][c] = dh_new[r][c];
#pragma unroll
            for (int kk = 0; kk < 3; kk++) wn[r][kk] = live[r] ? cur[r].w[kk] : 0.0f;
            cur[r] = nxt[r];
        }
    }
}

// The gradients off dh, every token of this block's two directions at once: dlam = xc dh, du =
// m h dyc, dwt from dw_k = sum_c dh h[st-1, l+k] (none at st = 0, where h[-1] = 0) into the slot
// when DG (dgates, rounded once), lam dh over dh in the part plane (for dxc), and m's gradient
// sum_t u h dyc per direction into dm (this thread's share, fp64).
template <typename T, int CC, bool DG>
__device__ void chip_grads(const ChipGeom &g, int rank, unsigned char *own, const float (&m)[2],
                           double (&dm)[2]) {
    using S = Slot<T, CC>;
    const int hw = g.H * g.W;
    const T *xs = reinterpret_cast<const T *>(own + g.xs), *dys = reinterpret_cast<const T *>(own + g.dys);
#pragma unroll
    for (int q = 0; q < 2; q++) {
        const int d = 2 * rank + q;
        const ChipWalk k = chip_walk(g, d);
        unsigned char *plane = own + (size_t)q * g.NT * S::BYTES;
        const float *hs = reinterpret_cast<const float *>(own + g.hid) + (size_t)q * g.NT * CC;
        float *dhp = reinterpret_cast<float *>(own + g.part) + (size_t)q * g.NT * CC;
        dm[q] = 0.0;
        for (int e = threadIdx.x; e < hw; e += CHIP_THREADS) {
            int i, j;
            chip_rc(g, e, i, j);
            const int ts = chip_tix(g, rank, i, j);
            const int st = d == 0 ? i : d == 1 ? g.H - 1 - i : d == 2 ? j : g.W - 1 - j;
            const int l = d < 2 ? j : i;
            const bool has_m = l > 0, has_p = l < k.lanes - 1, first = st == 0;
            const int tp = first ? ts : ts - k.ss;   // (st - 1, l)
            const int tpm = has_m ? tp - 1 : tp, tpp = has_p ? tp + 1 : tp;
            uint32_t sw[S::WORDS];
            slot_load<T, CC>(plane + (size_t)ts * S::BYTES, sw);
            float a[3], w[3];
            const float Ssum = weights<T>(get_f32<T>(sw, 2 * CC), get_f32<T>(sw, 2 * CC + 1),
                                          get_f32<T>(sw, 2 * CC + 2), has_m, has_p, a, w);
            float dws[3] = {0.0f, 0.0f, 0.0f}, dlam[CC], du[CC];
#pragma unroll
            for (int c = 0; c < CC; c++) {
                const float dh = dhp[ts * CC + c], hc = hs[ts * CC + c], dy = to_f32(dys[ts * CC + c]);
                const float u = get_f32<T>(sw, CC + c);
                dm[q] += (double)u * hc * dy;
                dlam[c] = to_f32(xs[ts * CC + c]) * dh;
                du[c] = m[q] * hc * dy;
                const float hm = has_m && !first ? hs[tpm * CC + c] : 0.0f;
                const float h0 = first ? 0.0f : hs[tp * CC + c];
                const float hp = has_p && !first ? hs[tpp * CC + c] : 0.0f;
                dws[0] += dh * hm;
                dws[1] += dh * h0;
                dws[2] += dh * hp;
                dhp[ts * CC + c] = get_f32<T>(sw, c) * dh;   // lam dh
            }
            if (DG) {
                float gwt[3];
                weights_bwd<T>(a, w, Ssum, dws, gwt);
                uint32_t ow[S::WORDS] = {};
#pragma unroll
                for (int c = 0; c < CC; c++) {
                    put_raw<T>(ow, c, f32_bits<T>(dlam[c]));
                    put_raw<T>(ow, CC + c, f32_bits<T>(du[c]));
                }
#pragma unroll
                for (int kk = 0; kk < 3; kk++) put_raw<T>(ow, 2 * CC + kk, f32_bits<T>(first ? 0.0f : gwt[kk]));
                slot_store<T, CC>(plane + (size_t)ts * S::BYTES, ow);
            }
        }
    }
}

template <typename T, int CC>
__global__ void __launch_bounds__(CHIP_THREADS)
gspn_bwd_chip_kernel(const T *__restrict__ dyc, const T *__restrict__ xc, const T *__restrict__ gates,
                     const float *__restrict__ hid, const void *merge, int merge_bf16,
                     T *__restrict__ dxc, T *__restrict__ dgates, double *__restrict__ dmpart,
                     long long plane, int write, ChipGeom g) {
    using S = Slot<T, CC>;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const int rank = chip_rank(), b = blockIdx.x / 2, hw = g.H * g.W, B = gridDim.x / 2;
    unsigned char *peer = chip_peer(smem_raw, rank);
    const size_t img = (size_t)b * hw * CC;
    chip_stage_tokens<T, CC>(g, rank, xc + img, reinterpret_cast<T *>(smem_raw + g.xs));
    chip_stage_tokens<T, CC>(g, rank, dyc + img, reinterpret_cast<T *>(smem_raw + g.dys));
    float *hs = reinterpret_cast<float *>(smem_raw + g.hid);
    if (hid)
        for (int q = 0; q < 2; q++)
            chip_stage_tokens<float, CC>(g, rank, hid + (2 * rank + q) * plane + img, hs + (size_t)q * g.NT * CC);
    cp_async_commit();
    chip_sync();   // the peer has started: its shared memory may be written
    chip_stage_gates<T, CC>(g, gates + (size_t)b * hw * DIRS * S::SE, rank, smem_raw, peer,
                            reinterpret_cast<uint32_t *>(smem_raw + g.part));
    cp_async_wait<0>();
    chip_sync();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const float m[2] = {load_param(merge, merge_bf16, 2 * rank), load_param(merge, merge_bf16, 2 * rank + 1)};
    if (warp < 2) {
        if (!hid)   // h again, on chip, into the warp's own plane
            chip_scan_fwd<T, CC, false, true>(g, rank, warp, smem_raw, hs + (size_t)warp * g.NT * CC);
        __syncwarp();
        chip_scan_bwd<T, CC>(g, rank, warp, smem_raw, warp == 0 ? m[0] : m[1]);
    }
    __syncthreads();
    double dm[2];
    if (dgates) chip_grads<T, CC, true>(g, rank, smem_raw, m, dm);
    else chip_grads<T, CC, false>(g, rank, smem_raw, m, dm);
    // dmerge: each thread's share, then the warp's (a fixed tree), then the warps in order
    double *dm_warps = reinterpret_cast<double *>(smem_raw + g.dm);
#pragma unroll
    for (int q = 0; q < 2; q++) {
        double v = dm[q];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0) dm_warps[q * CHIP_WARPS + warp] = v;
    }
    __syncthreads();
    if (dmpart && threadIdx.x < 2) {
        double sum = 0.0;
        for (int w = 0; w < CHIP_WARPS; w++) sum += dm_warps[threadIdx.x * CHIP_WARPS + w];
        dmpart[(2 * rank + threadIdx.x) * B + b] = sum;
    }
    chip_sync();
    int t0, t1;
    chip_half(g, rank, t0, t1);
    if (dxc) {   // dxc = sum_d lam_d dh_d, TB, BT, LR, RL in order
        constexpr int U = 4;   // elements a thread has in flight (the peer's reads take a round trip)
        for (int e0 = t0 * CC + threadIdx.x; e0 < t1 * CC; e0 += U * CHIP_THREADS) {
            float p[U][DIRS];
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int e = e0 + u * CHIP_THREADS < t1 * CC ? e0 + u * CHIP_THREADS : t0 * CC;
                const int t = e / CC, c = e - t * CC;
                int i, j;
                chip_rc(g, t, i, j);
#pragma unroll
                for (int d = 0; d < DIRS; d++) {
                    const unsigned char *base = (d >> 1) == rank ? smem_raw : peer;
                    p[u][d] = reinterpret_cast<const float *>(base + g.part)[(size_t)(d & 1) * g.NT * CC +
                                                                            chip_tix(g, d >> 1, i, j) * CC + c];
                }
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int e = e0 + u * CHIP_THREADS;
                if (e >= t1 * CC) break;
                float acc = write ? 0.0f : to_f32(dxc[img + e]);
                acc += ((p[u][0] + p[u][1]) + p[u][2]) + p[u][3];
                dxc[img + e] = from_f32<T>(acc);
            }
        }
    }
    if (dgates) {   // this pair's half of every token's row (4-byte aligned), through the warp's scratch
        constexpr int RH = S::RW / 2;
        uint32_t *scratch = reinterpret_cast<uint32_t *>(smem_raw + g.hid) + warp * CHIP_TG * RH;
        uint32_t *dst = reinterpret_cast<uint32_t *>(dgates) + (size_t)b * hw * S::RW + rank * RH;
        for (int tg = warp * CHIP_TG; tg < hw; tg += CHIP_WARPS * CHIP_TG) {
            const int n = hw - tg < CHIP_TG ? hw - tg : CHIP_TG;
            if (lane < n) {
                int i, j;
                chip_rc(g, tg + lane, i, j);
                const size_t ts = (size_t)chip_tix(g, rank, i, j);
                uint32_t rec[RH] = {};
#pragma unroll
                for (int q = 0; q < 2; q++) {
                    uint32_t sw[S::WORDS];
                    slot_load<T, CC>(smem_raw + (size_t)q * g.NT * S::BYTES + ts * S::BYTES, sw);
#pragma unroll
                    for (int kk = 0; kk < S::SE; kk++) put_raw<T>(rec, q * S::SE + kk, raw_elem<T>(sw, kk));
                }
#pragma unroll
                for (int w = 0; w < RH; w++) scratch[lane * RH + w] = rec[w];
            }
            __syncwarp();
            for (int w = lane; w < n * RH; w += 32) {
                const int tk = w / RH;
                dst[(size_t)(tg + tk) * S::RW + (w - tk * RH)] = scratch[w];
            }
            __syncwarp();
        }
    }
    chip_sync();   // the peer reads this block's planes until here
}

template <typename T>
size_t chip_smem(const Plan &p, bool bwd) {
    switch (p.Cc) {
    case 1: return chip_geom<T, 1>(p.H, p.W, bwd).total;
    case 2: return chip_geom<T, 2>(p.H, p.W, bwd).total;
    case 4: return chip_geom<T, 4>(p.H, p.W, bwd).total;
    default: return 0;
    }
}

template <typename T, int CC>
void fwd_chip(CudaCtx *c, const Plan &p, const T *xc, const T *gates, const T *gw, const T *gb,
              const void *merge, int merge_bf16, T *yc, float *hid) {
    const ChipGeom g = chip_geom<T, CC>(p.H, p.W, false);
    auto k = gspn_fwd_chip_kernel<T, CC>;
    set_smem(k, g.total);
    PairLaunch l(c->stream, 2 * p.B, CHIP_THREADS, g.total);   // two blocks an image
    CUDA_CHECK(cudaLaunchKernelEx(&l.cfg, k, xc, gates, gw, gb, merge, merge_bf16, yc, hid, (long long)p.plane,
                                  g));
}

template <typename T, int CC>
void bwd_chip(CudaCtx *c, const Plan &p, const T *dyc, const T *xc, const T *gates, const float *hid,
              const void *merge, int merge_bf16, T *dxc, T *dgates, double *dmpart, bool write) {
    const ChipGeom g = chip_geom<T, CC>(p.H, p.W, true);
    auto k = gspn_bwd_chip_kernel<T, CC>;
    set_smem(k, g.total);
    PairLaunch l(c->stream, 2 * p.B, CHIP_THREADS, g.total);   // two blocks an image
    CUDA_CHECK(cudaLaunchKernelEx(&l.cfg, k, dyc, xc, gates, hid, merge, merge_bf16, dxc, dgates, dmpart,
                                  (long long)p.plane, write ? 1 : 0, g));
}

}  // namespace

// The on-chip path applies on sm_90 and up (thread-block clusters) to shared weights with 1, 2
// or 4 channels, lines of at most CHIP_LMAX lanes, 4-byte aligned tensors, a block's shared
// memory within the device's limit, and gradients that are written (dgates added into: the
// staged kernels).
template <typename T>
bool img_fits(const CudaCtx *c, const Plan &p, bool bwd, bool adds_dgates, const void *const *ptrs,
              int nptrs) {
    if (c->cc < 90 || !p.shared || p.stages == 1 || adds_dgates || p.H > CHIP_LMAX || p.W > CHIP_LMAX)
        return false;
    const size_t smem = chip_smem<T>(p, bwd);
    if (smem == 0 || smem > smem_limit()) return false;
    for (int i = 0; i < nptrs; i++)
        if (ptrs[i] && !aligned4(ptrs[i])) return false;
    return true;
}

template <typename T>
void fwd_img(CudaCtx *c, const Plan &p, const T *xc, const T *gates, const T *gw, const T *gb, const void *merge,
             int merge_bf16, T *yc, float *hid) {
    switch (p.Cc) {
    case 1: fwd_chip<T, 1>(c, p, xc, gates, gw, gb, merge, merge_bf16, yc, hid); break;
    case 2: fwd_chip<T, 2>(c, p, xc, gates, gw, gb, merge, merge_bf16, yc, hid); break;
    default: fwd_chip<T, 4>(c, p, xc, gates, gw, gb, merge, merge_bf16, yc, hid); break;
    }
}

template <typename T>
void bwd_img(CudaCtx *c, const Plan &p, const T *dyc, const T *xc, const T *gates, const float *hid,
             const void *merge, int merge_bf16, T *dxc, T *dgates, double *dmpart, bool write) {
    switch (p.Cc) {
    case 1: bwd_chip<T, 1>(c, p, dyc, xc, gates, hid, merge, merge_bf16, dxc, dgates, dmpart, write); break;
    case 2: bwd_chip<T, 2>(c, p, dyc, xc, gates, hid, merge, merge_bf16, dxc, dgates, dmpart, write); break;
    default: bwd_chip<T, 4>(c, p, dyc, xc, gates, hid, merge, merge_bf16, dxc, dgates, dmpart, write); break;
    }
}

#define GSPN_IMG_INSTANCES(T)                                                                  \
    template bool img_fits<T>(const CudaCtx *, const Plan &, bool, bool, const void *const *, int); \
    template void fwd_img<T>(CudaCtx *, const Plan &, const T *, const T *, const T *, const T *,    \
                             const void *, int, T *, float *);                                   \
    template void bwd_img<T>(CudaCtx *, const Plan &, const T *, const T *, const T *, const float *, \
                             const void *, int, T *, T *, double *, bool);
GSPN_IMG_INSTANCES(float)
GSPN_IMG_INSTANCES(__nv_bfloat16)
#undef GSPN_IMG_INSTANCES

}  // namespace gspn
