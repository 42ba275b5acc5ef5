// The C-GSPN scan's forward pass on the GPU: kernels, launches, entry (design: gspn_scan.cu).
#include "gspn_scan_common.cuh"

namespace gspn {
namespace {

// ---- forward: one direction -------------------------------------------------------------------
// xc (B,H,W,Cc), gates (B,H,W,G) -> hid (B,H,W,Cc) fp32 or NULL, ypart = u_d * h_d (B,H,W,Cc).
template <typename T, int V, bool SH>
__global__ void __launch_bounds__(SCAN_THREADS_MAX)
gspn_fwd_dir_kernel(const T *__restrict__ xc, const T *__restrict__ gates,
                    float *__restrict__ hid, float *__restrict__ ypart, DirGeom g) {
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
                if (ypart) stf<V>(ypart + o, y);
            }
        }
        __syncthreads();
    }
}

// yc = sum_d m_d ypart_d, in the fixed order TB, BT, LR, RL.
template <typename T, int V>
__global__ void gspn_merge_kernel(const float *__restrict__ ypart, long long plane, const void *merge,
                                  int merge_bf16, T *__restrict__ yc) {
    const float m0 = load_param(merge, merge_bf16, 0), m1 = load_param(merge, merge_bf16, 1);
    const float m2 = load_param(merge, merge_bf16, 2), m3 = load_param(merge, merge_bf16, 3);
    const long long nvec = plane / V;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < nvec;
         i += (long long)gridDim.x * blockDim.x) {
        const long long o = i * V;
        float y0[V], y1[V], y2[V], y3[V], acc[V];
        ldf_ro<V>(ypart + o, y0);
        ldf_ro<V>(ypart + plane + o, y1);
        ldf_ro<V>(ypart + 2 * plane + o, y2);
        ldf_ro<V>(ypart + 3 * plane + o, y3);
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

// Forward. Stage slot q of item e: q = 0 xc, 1 lam, 2 u, 3..5 wt_{-1,0,+1}. A thread owns IPT
// items, e = threadIdx.x + i * blockDim.x (IPT = 2 lets a 147-lane line take 64-byte channel
// groups: 1176 items on 608 threads).
template <typename T, int V, int D, int IPT>
__global__ void __launch_bounds__(PipeThreads<T, V>::fwd)
gspn_fwd_pipe_kernel(const T *__restrict__ xc, const T *__restrict__ gates,
                     float *__restrict__ hid, float *__restrict__ ypart, long long plane,
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
                stf<V>(ypart + o, y);
            }
        }
        __syncthreads();
    }
    cp_async_wait<0>();
}

// Forward. Stage per lane: nw chunk words, then xw xc words.
template <typename T, int V>
__global__ void __launch_bounds__(SH_FWD_THREADS)
gspn_fwd_sh_kernel(const T *__restrict__ xc, const T *__restrict__ gates,
                   float *__restrict__ hid, float *__restrict__ ypart, long long plane, ShArgs a) {
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
            DivWalk lw(threadIdx.x, blockDim.x, per);   // f as (lane, word)
            for (int f = threadIdx.x; f < N * per; f += blockDim.x, lw.next(per)) {
                const uint32_t *src = lw.r < a.nw ? gw + ((gb0 + lw.q * gstep) >> 2) + lw.r
                                                  : xw + xw0 + lw.q * xstep + (lw.r - a.nw);
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
                    stf<V>(ypart + o, y);
                }
            }
        }
    }
    cp_async_wait<0>();
}

// ---- host side -----------------------------------------------------------------------------
template <typename T, int V, bool SH>
void launch_fwd_dir(const DirGeom &g, int B, const T *xc, const T *gates, float *hid, float *ypart,
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

// The four forward scans, concurrently on the side streams. hid (4 slices) and/or ypart
// (4 slices) may be NULL.
template <typename T, int V, bool SH>
void fwd_all(CudaCtx *c, const Plan &p, const T *xc, const T *gates, float *hid, float *ypart) {
    CUDA_CHECK(cudaEventRecord(c->fork, c->stream));
    for (int d = 0; d < DIRS; d++) {
        CUDA_CHECK(cudaStreamWaitEvent(c->side[d], c->fork, 0));
        launch_fwd_dir<T, V, SH>(dir_geom(p, d), p.B, xc, gates, hid ? hid + d * p.plane : nullptr,
                                 ypart ? ypart + d * p.plane : nullptr, c->side[d]);
        CUDA_CHECK(cudaEventRecord(c->join[d], c->side[d]));
    }
    for (int d = 0; d < DIRS; d++) CUDA_CHECK(cudaStreamWaitEvent(c->stream, c->join[d], 0));
}

template <typename T, int V>
bool fwd_pipe(CudaCtx *c, const Plan &p, const T *xc, const T *gates, float *hid, float *ypart) {
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

// ---- shared weights, few channels: a thread per lane, inputs straight into registers ----------
// A lane kernel's thread's line: direction d's geometry for image img, its lane l of the line's N
// (the block's part `part` of `parts` equal parts of the line: lanes from base on, li = l - base
// its slot in hbuf; live if a lane of the part), the lane's first token, the tensors' ends in
// bytes (xc, gates), and h of the step before the first zeroed in hbuf ([2][NP+2][CC] for the
// part's NP lanes, the halo lanes staying zero; a barrier must follow).
template <typename T, int CC> struct LaneLine {
    DirGeom g;
    int N, NP, base, rowf, l, li;
    bool live;
    long long t0, xend, gend;
    __device__ __forceinline__ long long chunk_byte(long long t) const {
        return (t * g.G + g.goff) * (long long)sizeof(T);
    }
};
template <typename T, int CC>
__device__ __forceinline__ LaneLine<T, CC> lane_line(const ShArgs &a, int d, long long img, long long plane,
                                                     float *hbuf, int part = 0, int parts = 1) {
    LaneLine<T, CC> q;
    q.g = pick_dir_sh(a, d);
    q.N = q.g.N;
    q.NP = (q.N + parts - 1) / parts;
    q.base = part * q.NP;
    q.rowf = (q.NP + 2) * CC;
    q.li = threadIdx.x;
    q.l = q.base + q.li;
    for (int i = threadIdx.x; i < 2 * q.rowf; i += blockDim.x) hbuf[i] = 0.0f;
    q.live = q.li < q.NP && q.l < q.N;
    q.t0 = img * q.g.img_tokens + q.g.first + (long long)q.l * q.g.lstride;
    q.xend = plane * (long long)sizeof(T);
    q.gend = plane / CC * q.g.G * (long long)sizeof(T);
    return q;
}

// Lines over a cluster of two blocks (SPLIT): the edge lane of each half (the last of part 0, the
// first of part 1) passes its h of the step into the other block's halo slot of `cur` (slot 0 in
// part 1, NP + 1 in part 0; peer: the other block's hbuf), and the cluster's barrier stands for
// the block's.
template <typename T, int CC>
__device__ __forceinline__ void lane_pass_edge(const LaneLine<T, CC> &q, int part, float *peer, const float *hbuf,
                                               const float *cur, const float (&h)[CC]) {
    if (q.live && (part == 0 ? q.li == q.NP - 1 : q.li == 0))
        stf<CC>(peer + (cur - hbuf) + (part == 0 ? 0 : q.NP + 1) * CC, h);
}
template <bool SPLIT> __device__ __forceinline__ void lane_barrier() {
    if constexpr (SPLIT) chip_sync();
    else __syncthreads();
}

// A lane's step inputs as the recurrence takes them: lam x, u and the normalized weights (zero at
// the first step), from the words it loaded for token t (lane_load_chunk, lane_load_x; cb: the
// token's chunk byte). They do not depend on h.
template <int CC> struct LaneStepIn {
    float lx[CC], u[CC], sw[3];
};
template <typename T, int CC, bool VEC>
__device__ __forceinline__ void lane_step_in(const uint32_t (&w)[LaneWords<T, CC, VEC>::N], long long t,
                                             long long cb, bool first, bool has_m, bool has_p,
                                             LaneStepIn<CC> &in) {
    using LW = LaneWords<T, CC, VEC>;
    // the chunk's words from its first covering word on, and its offset in that word
    uint32_t cw[LW::NW], xwv[LW::XW];
    const int goff = (int)(cb & 3);
    lane_chunk_words<T, CC, VEC, 0>(w, cb, cw);
#pragma unroll
    for (int i = 0; i < LW::XW; i++) xwv[i] = w[LW::GW + i];
    const int xoff = (int)((t * CC * (long long)sizeof(T)) & 3);
    float sa[3];
    in.sw[0] = in.sw[1] = in.sw[2] = 0.0f;
    if (!first)
        weights<T>(lane_el<T>(cw, goff, 2 * CC), lane_el<T>(cw, goff, 2 * CC + 1), lane_el<T>(cw, goff, 2 * CC + 2),
                   has_m, has_p, sa, in.sw);
#pragma unroll
    for (int c = 0; c < CC; c++) {
        in.lx[c] = lane_el<T>(cw, goff, c) * lane_el<T>(xwv, xoff, c);
        in.u[c] = lane_el<T>(cw, goff, CC + c);
    }
}

// Lane l's step: h = lam x plus the weighted h of its three neighbours at the step before (prev, a
// row of N + 2 lanes of CC with zero halo lanes; none at the first step), written to cur for the
// neighbours' next step; y = u h.
template <int CC>
__device__ __forceinline__ void lane_step(const float *prev, float *cur, int l, bool first,
                                          const LaneStepIn<CC> &in, float (&h)[CC], float (&y)[CC]) {
#pragma unroll
    for (int c = 0; c < CC; c++) h[c] = in.lx[c];
    if (!first) {
        float hm[CC], h0[CC], hp[CC];
        const float *pr = prev + (l + 1) * CC;
        ldf<CC>(pr - CC, hm);
        ldf<CC>(pr, h0);
        ldf<CC>(pr + CC, hp);
#pragma unroll
        for (int c = 0; c < CC; c++) {
            h[c] += in.sw[0] * hm[c];
            h[c] += in.sw[1] * h0[c];
            h[c] += in.sw[2] * hp[c];
        }
    }
    stf<CC>(cur + (l + 1) * CC, h);
#pragma unroll
    for (int c = 0; c < CC; c++) y[c] = in.u[c] * h[c];
}

// The staged kernel above spends most of a step moving words through shared memory (about 1,700
// instructions a warp and step at 1024^2, Cc = 8, H100, Nsight Compute); with Cc <= 8 a lane's
// inputs of a step are a few words, so each thread loads its own (its gate chunk and its xc) into
// a ring of registers P steps ahead of their use, and the only shared memory left is h of the
// previous step for the two neighbour lanes (one barrier a step). Ring slot j holds step s0 + j of
// an unrolled group of P steps, so its index is a constant. VEC: the chunk comes in as the 16-byte
// vectors covering it (a third of the load instructions and of the sectors asked of L1 at Cc = 2);
// without VEC (1024-thread blocks: 64 registers a thread) as the 4-byte words covering it.
// P: steps ahead; blocks of at most MAXT threads; GROUP: LR / RL store P steps at once (at Cc = 8
// the run's registers cost more than the sectors save: 56^2 forward 0.189 against 0.176 ms, H100);
// EARLY: a step's inputs formed during the step before (56^2, Cc = 2: 0.081 -> 0.076 ms), not
// in 64 registers (1024^2, Cc = 8: spills, 12.6 -> 14.7 ms).
// SPLIT (sm_90 and up): a line over a cluster of two blocks, each half its lanes, for launches of
// fewer blocks than SMs (Fig. 3: 16 images x 4 directions, one 1024-thread block an SM, left half
// the SMs idle). Each step the half's edge lane also writes its h into the other block's halo
// slot (distributed shared memory), and the cluster's barrier stands for the block's.
template <typename T, int CC, int P, int MAXT, bool VEC, bool SPLIT = false, bool GROUP = VEC && CC <= 4,
          bool EARLY = VEC>
__global__ void __launch_bounds__(MAXT)
gspn_fwd_lane_kernel(const T *__restrict__ xc, const T *__restrict__ gates, float *__restrict__ hid,
                     float *__restrict__ ypart, long long plane, ShArgs a, int dir_mask) {
    using LW = LaneWords<T, CC, VEC>;
    const int part = SPLIT ? chip_rank() : 0, blk = SPLIT ? (int)(blockIdx.x >> 1) : (int)blockIdx.x;
    const int d = blk & 3;   // the same for both blocks of a cluster: both return, or neither
    if (!((dir_mask >> d) & 1)) return;   // the benchmark's diagnostics only
    extern __shared__ __align__(16) unsigned char smem_raw[];
    float *hbuf = reinterpret_cast<float *>(smem_raw);   // [2][NP+2][CC], zero halo lanes
    const LaneLine<T, CC> q = lane_line<T, CC>(a, d, blk >> 2, plane, hbuf, part, SPLIT ? 2 : 1);
    const DirGeom &g = q.g;
    const int N = q.N, rowf = q.rowf, l = q.l, li = q.li;
    float *const peer = SPLIT ? reinterpret_cast<float *>(chip_peer(smem_raw, part)) : nullptr;
    const bool live = q.live;
    const long long t0 = q.t0, xend = q.xend, gend = q.gend;
    if (hid) hid += d * plane;
    if (ypart) ypart += d * plane;
    auto chunk_byte = [&](long long t) { return q.chunk_byte(t); };
    auto load = [&](int s, uint32_t (&w)[LW::N]) {
        if (!live || s >= g.L) return;
        const long long t = t0 + (long long)s * g.sstride;
        lane_load_chunk<T, CC, VEC, 0>(gates, chunk_byte(t), gend, w);
        lane_load_x<T, CC, LW::GW>(xc, t, xend, w);
    };
    // With EARLY step s + 1's inputs are formed during step s, off the path from one barrier to the
    // next (neighbours' h, three FMAs a channel, h out).
    using StepIn = LaneStepIn<CC>;
    auto prep = [&](int s, const uint32_t (&w)[LW::N], StepIn &in) {
        if (!live || s >= g.L) return;
        const long long t = t0 + (long long)s * g.sstride;
        lane_step_in<T, CC, VEC>(w, t, chunk_byte(t), s == 0, l > 0, l < N - 1, in);
    };
    uint32_t ring[P][LW::N];
#pragma unroll
    for (int j = 0; j < P; j++) load(j, ring[j]);
    StepIn in;
    if constexpr (EARLY) {
        prep(0, ring[0], in);
        load(P, ring[0]);
    }
    // LR / RL: a lane's P steps are P neighbouring tokens of its row, whose h and y go out after
    // the group as one run (sectors written whole; one token a step is 4 CC bytes of a 32-byte
    // sector, rows apart across the warp). TB / BT: lanes are neighbouring tokens, one run a step.
    const bool grouped = GROUP && g.lstride != 1;
    float hg[GROUP ? P : 1][CC], yg[GROUP ? P : 1][CC];
    lane_barrier<SPLIT>();   // the zero halo (in both blocks, before the other one's first write into it)
    for (int s0 = 0; s0 < g.L; s0 += P) {
        const bool whole = grouped && s0 + P <= g.L;   // a full group: its run is stored at the end
#pragma unroll
        for (int j = 0; j < P; j++) {
            const int s = s0 + j;
            if (s >= g.L) break;   // the same for every thread of the block
            const float *prev = hbuf + (s & 1) * rowf;
            float *cur = hbuf + ((s + 1) & 1) * rowf;
            float h[CC], y[CC];
            if constexpr (!EARLY) prep(s, ring[j], in);
            if (live) {
                const long long t = t0 + (long long)s * g.sstride;
                lane_step<CC>(prev, cur, li, s == 0, in, h, y);
                if constexpr (SPLIT) lane_pass_edge<T, CC>(q, part, peer, hbuf, cur, h);
                if (whole) {
                    if constexpr (GROUP) {
#pragma unroll
                        for (int c = 0; c < CC; c++) hg[j][c] = h[c], yg[j][c] = y[c];
                    }
                } else {
                    if (hid) stf_stream<CC>(hid + t * CC, h);
                    if (ypart) stf<CC>(ypart + t * CC, y);
                }
            }
            if constexpr (EARLY) {   // step s + 1's inputs, then their slot refilled with step s + 1 + P
                prep(s + 1, ring[(j + 1) % P], in);
                load(s + 1 + P, ring[(j + 1) % P]);
            } else {
                load(s + P, ring[j]);
            }
            lane_barrier<SPLIT>();   // h of step s in; prev is free to be written at step s + 1
        }
        if constexpr (GROUP) {   // the run starts at the group's lowest token: j = 0 (LR), P - 1 (RL)
            if (whole && live) {
                const bool up = g.sstride > 0;
                lane_store_run<P, CC>(hid, ypart, t0 + (long long)(up ? s0 : s0 + P - 1) * g.sstride, up, hg, yg);
            }
        }
    }
}

// ---- shared weights, LR and RL on long lines: a lane's run of tokens at once ------------------
// In LR and RL a lane is a row, so one token a step is a sector a lane for a few of its bytes. On
// 1024-lane lines the lane kernel above then moved about 8 times the bytes the op must move
// (Nsight Compute, Fig. S3: 130 GB at 36% of DRAM for 16; gspn_scan_notes.md): by the step after, the
// 64-byte piece a lane's token came in with has left L2. Here a lane takes K = 8 / CC steps at a
// time: it loads the words of its K tokens, neighbours in its row, all at once (so each piece
// arriving serves the tokens in it) into its own column of shared memory, scans the K steps from
// there (one barrier a step, as the lane kernel), and stores h and y of the K steps as one 32-byte
// run each. A line's last, shorter run goes out token by token. SPLIT: each line over a cluster of
// two blocks of at most 512 threads, two blocks an SM, so that one block's loads overlap the
// other's chain (lane_pass_edge).
template <typename T, int CC, bool SPLIT = false>
__global__ void __launch_bounds__(SPLIT ? SH_FWD_THREADS / 2 : SH_FWD_THREADS, SPLIT ? 2 : 1)
gspn_fwd_lane_rows_kernel(const T *__restrict__ xc, const T *__restrict__ gates, float *__restrict__ hid,
                          float *__restrict__ ypart, long long plane, ShArgs a, int dir_mask) {
    using LW = LaneWords<T, CC, false>;
    constexpr int K = 8 / CC;
    const int part = SPLIT ? chip_rank() : 0, blk = SPLIT ? (int)(blockIdx.x >> 1) : (int)blockIdx.x;
    const int d = 2 + (blk & 1);   // LR, RL; the same for both blocks of a cluster
    if (!((dir_mask >> d) & 1)) return;   // the benchmark's diagnostics only
    extern __shared__ __align__(16) unsigned char smem_raw[];
    float *hbuf = reinterpret_cast<float *>(smem_raw);   // [2][NP+2][CC], zero halo lanes
    const LaneLine<T, CC> q = lane_line<T, CC>(a, d, blk >> 1, plane, hbuf, part, SPLIT ? 2 : 1);
    const DirGeom &g = q.g;
    const int N = q.N, NP = q.NP, rowf = q.rowf, l = q.l, li = q.li;
    uint32_t *words = reinterpret_cast<uint32_t *>(hbuf + 2 * rowf);   // [K][LW::N][NP]: lane li's words
    float *const peer = SPLIT ? reinterpret_cast<float *>(chip_peer(smem_raw, part)) : nullptr;
    if (hid) hid += d * plane;
    if (ypart) ypart += d * plane;
    const bool up = g.sstride > 0;
    lane_barrier<SPLIT>();   // the zero halo (in both blocks, before the other one's first write into it)
    for (int s0 = 0; s0 < g.L; s0 += K) {
        const int run = g.L - s0 < K ? g.L - s0 : K;
        // the run's loads KH tokens at a time, all issued before the first store (KH: about 24 words
        // in registers, within the 64 a thread has); a lane reads back only its own words
        constexpr int KH = K * LW::N <= 24 ? K : K / 2 * LW::N <= 24 ? K / 2 : K / 4;
#pragma unroll
        for (int k0 = 0; k0 < K; k0 += KH) {
            if (!q.live || k0 >= run) break;
            uint32_t w[KH][LW::N];
#pragma unroll
            for (int k = 0; k < KH; k++)
                if (k0 + k < run) {
                    const long long t = q.t0 + (long long)(s0 + k0 + k) * g.sstride;
                    lane_load_chunk<T, CC, false, 0>(gates, q.chunk_byte(t), q.gend, w[k]);
                    lane_load_x<T, CC, LW::GW>(xc, t, q.xend, w[k]);
                }
#pragma unroll
            for (int k = 0; k < KH; k++)
                if (k0 + k < run)
#pragma unroll
                    for (int i = 0; i < LW::N; i++) words[((k0 + k) * LW::N + i) * NP + li] = w[k][i];
        }
        float hg[K][CC], yg[K][CC];
#pragma unroll
        for (int k = 0; k < K; k++) {
            if (k >= run) break;   // the same for every thread of the block
            const int s = s0 + k;
            const float *prev = hbuf + (s & 1) * rowf;
            float *cur = hbuf + ((s + 1) & 1) * rowf;
            if (q.live) {
                const long long t = q.t0 + (long long)s * g.sstride;
                uint32_t w[LW::N];
#pragma unroll
                for (int i = 0; i < LW::N; i++) w[i] = words[(k * LW::N + i) * NP + li];
                LaneStepIn<CC> in;
                lane_step_in<T, CC, false>(w, t, q.chunk_byte(t), s == 0, l > 0, l < N - 1, in);
                lane_step<CC>(prev, cur, li, s == 0, in, hg[k], yg[k]);
                if constexpr (SPLIT) lane_pass_edge<T, CC>(q, part, peer, hbuf, cur, hg[k]);
                if (run < K) {
                    if (hid) stf_stream<CC>(hid + t * CC, hg[k]);
                    if (ypart) stf<CC>(ypart + t * CC, yg[k]);
                }
            }
            lane_barrier<SPLIT>();   // h of step s in; prev is free to be written at step s + 1
        }
        if (q.live && run == K)
            lane_store_run<K, CC>(hid, ypart, q.t0 + (long long)(up ? s0 : s0 + K - 1) * g.sstride, up, hg, yg);
    }
}

// LR and RL by gspn_fwd_lane_rows_kernel (Cc of 1 or 2; lines of at most SH_FWD_THREADS lanes),
// in bf16 on sm_90 each line over a cluster of two blocks.
template <typename T, int CC>
bool fwd_lane_rows(CudaCtx *c, const Plan &p, const ShArgs &a, const T *xc, const T *gates, float *hid,
                   float *ypart) {
    const int N = a.g[2].N;   // H
    const bool split = c->cc >= 90 && sizeof(T) == 2;   // fp32 at 64 registers spilled 212 bytes
    const int NP = split ? (N + 1) / 2 : N;   // lanes a block
    const size_t smem = 2 * (size_t)(NP + 2) * CC * sizeof(float) +
                        (size_t)(8 / CC) * LaneWords<T, CC, false>::N * NP * sizeof(uint32_t);
    if (N > SH_FWD_THREADS || smem > smem_limit()) return false;
    if constexpr (sizeof(T) == 2)
        if (split) {
            auto k = gspn_fwd_lane_rows_kernel<T, CC, true>;
            set_smem(k, smem);
            PairLaunch l(c->stream, 2 * 2 * p.B, (NP + 31) / 32 * 32, smem);   // two blocks a line
            CUDA_CHECK(cudaLaunchKernelEx(&l.cfg, k, xc, gates, hid, ypart, p.plane, a, p.dir_mask));
            return true;
        }
    auto k = gspn_fwd_lane_rows_kernel<T, CC>;
    set_smem(k, smem);
    k<<<2 * p.B, (N + 31) / 32 * 32, smem, c->stream>>>(xc, gates, hid, ypart, p.plane, a, p.dir_mask);
    CUDA_CHECK_LAUNCH();
    return true;
}

// The lane kernel with each line over a cluster of two blocks (SPLIT): 512 threads a block, so 16-byte
// vectors and the registers of the 256-lane kernel's steps.
constexpr int SPLIT_THREADS = 512;
template <typename T, int CC>
bool fwd_lane_split(CudaCtx *c, const Plan &p, const ShArgs &a, const T *xc, const T *gates, float *hid,
                    float *ypart) {
    const int NP = (a.lanes_max + 1) / 2;
    const size_t smem = 2 * (size_t)(NP + 2) * CC * sizeof(float);
    if (NP > SPLIT_THREADS || smem > smem_limit()) return false;
    auto k = gspn_fwd_lane_kernel<T, CC, 2, SPLIT_THREADS, true, true>;
    set_smem(k, smem);
    PairLaunch l(c->stream, 2 * DIRS * p.B, (NP + 31) / 32 * 32, smem);   // two blocks a line
    CUDA_CHECK(cudaLaunchKernelEx(&l.cfg, k, xc, gates, hid, ypart, p.plane, a, p.dir_mask));
    return true;
}

// The lane kernel where it applies: shared weights, Cc of 1, 2, 4 or 8, a line of at most
// SH_FWD_THREADS lanes, 4-byte aligned tensors. Lines of at most 256 lanes: vectors, P = 4 steps
// ahead (tuning stages 2 or 3: 2; 8 ran no faster at 56^2); longer lines (1024 threads leave 64
// registers a thread): words, 2 steps ahead, where a step's words fit (not fp32 Cc >= 4); there, at
// Cc of 1 or 2, LR and RL go to gspn_fwd_lane_rows_kernel first.
template <typename T, int CC>
bool fwd_lane_cc(CudaCtx *c, const Plan &p, const ShArgs &a, const T *xc, const T *gates, float *hid,
                 float *ypart) {
    const size_t smem = 2 * (size_t)(a.lanes_max + 2) * CC * sizeof(float);
    if (smem > smem_limit()) return false;
    auto k = p.stages == 2 || p.stages == 3 ? gspn_fwd_lane_kernel<T, CC, 2, 256, true>
                                             : gspn_fwd_lane_kernel<T, CC, 4, 256, true>;
    // fewer lines than SMs, and no runs for LR and RL (Cc of 4 or 8): each line over two blocks
    if constexpr (CC >= 4)
        if (a.lanes_max > 256 && c->cc >= 90 && DIRS * p.B < c->sm_count &&
            fwd_lane_split<T, CC>(c, p, a, xc, gates, hid, ypart))
            return true;
    if (a.lanes_max > 256) {
        if constexpr (LaneWords<T, CC, false>::N <= 14) k = gspn_fwd_lane_kernel<T, CC, 2, SH_FWD_THREADS, false>;
        else return false;
    }
    int dir_mask = p.dir_mask;   // LR and RL by runs where they apply
    if constexpr (CC <= 2)
        if (a.lanes_max > 256 && fwd_lane_rows<T, CC>(c, p, a, xc, gates, hid, ypart)) dir_mask &= 3;
    set_smem(k, smem);
    k<<<DIRS * p.B, sh_threads(a, false), smem, c->stream>>>(xc, gates, hid, ypart, p.plane, a, dir_mask);
    CUDA_CHECK_LAUNCH();
    return true;
}

template <typename T>
bool fwd_lane(CudaCtx *c, const Plan &p, const T *xc, const T *gates, float *hid, float *ypart) {
    if (!p.shared || p.stages == 1 || !aligned4(xc) || ((uintptr_t)gates & 15u) != 0) return false;
    ShArgs a{};
    for (int d = 0; d < DIRS; d++) {
        a.g[d] = dir_geom(p, d);
        a.lanes_max = a.g[d].N > a.lanes_max ? a.g[d].N : a.lanes_max;
    }
    if (a.lanes_max > SH_FWD_THREADS) return false;
    switch (p.Cc) {
    case 1: return fwd_lane_cc<T, 1>(c, p, a, xc, gates, hid, ypart);
    case 2: return fwd_lane_cc<T, 2>(c, p, a, xc, gates, hid, ypart);
    case 4: return fwd_lane_cc<T, 4>(c, p, a, xc, gates, hid, ypart);
    case 8: return fwd_lane_cc<T, 8>(c, p, a, xc, gates, hid, ypart);
    default: return false;
    }
}

// Forward: one block per (image, direction). A split of the channels over two blocks per image
// (sgroups = 2: 128 blocks at the 1024^2 benchmark instead of 64, each with the whole gate chunk)
// measured 2.5x slower (H200: 28.8 ms against 11.6 ms), so sgroups stays 1.
template <typename T, int V>
bool fwd_sh(CudaCtx *c, const Plan &p, const T *xc, const T *gates, float *hid, float *ypart) {
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

}  // namespace

// The four forward scans by the fastest path that applies. hid and/or ypart may be NULL.
template <typename T, int V, bool SH>
void fwd_scans(CudaCtx *c, const Plan &p, const T *xc, const T *gates, float *hid, float *ypart) {
    const bool done = SH ? fwd_lane<T>(c, p, xc, gates, hid, ypart) || fwd_sh<T, V>(c, p, xc, gates, hid, ypart)
                         : fwd_pipe<T, V>(c, p, xc, gates, hid, ypart);
    if (!done) fwd_all<T, V, SH>(c, p, xc, gates, hid, ypart);
}
#define GSPN_FWD_SCANS(T, V, SH)                                                               \
    template void fwd_scans<T, V, SH>(CudaCtx *, const Plan &, const T *, const T *, float *, float *);
GSPN_INSTANCES(GSPN_FWD_SCANS)
#undef GSPN_FWD_SCANS

template <typename T, int V, bool SH>
void scan_fwd(Ctx *ctx, const Plan &p, const Tensor *xc, const Tensor *gates, const Tensor *merge,
              Tensor *yc, Tensor *hidden) {
    CudaCtx *c = cuda_ctx_of(ctx);
    const T *x = static_cast<const T *>(xc->data), *g = static_cast<const T *>(gates->data);
    float *hid = hidden ? tensor_f32(hidden) : nullptr;
    const void *ptrs[] = {x, g, yc->data};
    if (SH && img_fits<T>(c, p, false, false, ptrs, 3)) {   // the whole image on chip: merged there
        fwd_img<T>(c, p, x, g, nullptr, nullptr, merge->data, merge->dtype == DTYPE_BF16,
                   static_cast<T *>(yc->data), hid);
        return;
    }
    float *ypart = static_cast<float *>(scratch_alloc(c, DIRS * (size_t)p.plane * sizeof(float)));
    fwd_scans<T, V, SH>(c, p, x, g, hid, ypart);
    const long long nvec = p.plane / V;
    gspn_merge_kernel<T, V><<<ew_blocks(nvec, c), EW_THREADS, 0, c->stream>>>(
        ypart, p.plane, merge->data, merge->dtype == DTYPE_BF16, static_cast<T *>(yc->data));
    CUDA_CHECK_LAUNCH();
    CUDA_CHECK(cudaFreeAsync(ypart, c->stream));
}

void gspn_fwd_impl(Ctx *ctx, const Tensor *xc, const Tensor *gates, const Tensor *merge,
                   int shared_w, Tensor *yc, Tensor *hidden, Tuning tu) {
    CG_CHECK(xc && gates, "", "op gspn_scan_fwd: xc, gates and merge are required");
    const void *ptrs[] = {xc->data, gates->data, yc ? yc->data : nullptr,
                          hidden ? hidden->data : nullptr};
    const char *op = "gspn_scan_fwd";
    const Plan p = make_plan(op, xc, gates, merge, shared_w, tu, false, ptrs, 4);
    CG_CHECK(yc, "", "op %s: yc is required", op);
    check_like(op, "yc", yc, "xc", xc);
    check_hidden(op, hidden, p.plane);
    if (p.plane == 0) return;
    GSPN_DISPATCH(p, scan_fwd, ctx, p, xc, gates, merge, yc, hidden);
}

}  // namespace gspn
