// The C-GSPN scan's backward pass on the GPU: kernels, launches, entry (design: gspn_scan.cu).
#include "gspn_scan_common.cuh"
#include "../gspn_scan_shape.h"

namespace gspn {
namespace {

// The block's sum of its threads' dm_acc (a term of dmerge) to *out: warps, then the warps in
// order, so the same in every run. Every thread of the block calls it (a barrier inside).
__device__ __forceinline__ void block_dm_sum(double dm_acc, double *out) {
    __shared__ double red[BWD_RED_WARPS];
    for (int off = 16; off > 0; off >>= 1) dm_acc += __shfl_xor_sync(0xffffffffu, dm_acc, off);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = dm_acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        double sum = 0.0;
        for (int i = 0; i < (int)(blockDim.x + 31) / 32; i++) sum += red[i];
        *out = sum;
    }
}

// ---- backward: one direction -------------------------------------------------------------------
// Reverse scan. dxpart (B,H,W,Cc) = lam_d dh_d or NULL; dgates += the gate gradients of direction
// d or NULL; dmpart[blockIdx.x] = this block's sum of u h dyc, or NULL.
template <typename T, int V, bool SH>
__global__ void __launch_bounds__(SCAN_THREADS_MAX)
gspn_bwd_dir_kernel(const T *__restrict__ dyc, const T *__restrict__ xc,
                    const T *__restrict__ gates, const float *__restrict__ hid,
                    const void *merge, int merge_bf16, float *__restrict__ dxpart,
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
                if (dxpart) stf<V>(dxpart + o, dx);
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

    if (dmpart) block_dm_sum(dm_acc, dmpart + blockIdx.x);
}

// dxc (+)= ((dxpart_TB + dxpart_BT) + dxpart_LR) + dxpart_RL; write: dxc's old values unread
template <typename T, int V>
__global__ void gspn_dx_finalize_kernel(const float *__restrict__ dxpart, long long plane,
                                        T *__restrict__ dxc, int write) {
    const long long nvec = plane / V;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < nvec;
         i += (long long)gridDim.x * blockDim.x) {
        const long long o = i * V;
        float p0[V], p1[V], p2[V], p3[V], acc[V];
        ldf_ro<V>(dxpart + o, p0);
        ldf_ro<V>(dxpart + plane + o, p1);
        ldf_ro<V>(dxpart + 2 * plane + o, p2);
        ldf_ro<V>(dxpart + 3 * plane + o, p3);
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

// Backward. Stage slots: q = 0 dyc, 1 xc, 2 lam, 3 u, 4..6 wt, 7..11 the old dgates of this
// direction (lam, u, wt x3; not staged when dgates is written: a.dg_write); then h[s-1] of the
// item (fp32, V floats) in its own array, read by the item and its two neighbour lanes (visible
// to them after the step's barrier).
template <typename T, int V, int D>
__global__ void __launch_bounds__(PipeThreads<T, V>::bwd)
gspn_bwd_pipe_kernel(const T *__restrict__ dyc, const T *__restrict__ xc,
                     const T *__restrict__ gates, const float *__restrict__ hid,
                     const void *merge, int merge_bf16, float *__restrict__ dxpart,
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
            if (dxpart) stf<V>(dxpart + o, dx);
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

    if (dmpart) block_dm_sum(dm_acc, dmpart + d * nblk + bg);
}

// Backward. Stage per lane: nw gate chunk words, nw old dgates chunk words, (padding to 16
// bytes) Cc floats of h[s-1]. Carry rows [2][N+2][Cc+4]: dh, w_{-1}, w_0, w_{+1}, pad.
template <typename T, int V>
__global__ void __launch_bounds__(SH_BWD_THREADS)
gspn_bwd_sh_kernel(const T *__restrict__ dyc, const T *__restrict__ xc,
                   const T *__restrict__ gates, const float *__restrict__ hid,
                   const void *merge, int merge_bf16, float *__restrict__ dxpart,
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
            DivWalk lw(threadIdx.x, blockDim.x, per);   // f as (lane, word)
            for (int f = threadIdx.x; f < N * per; f += blockDim.x, lw.next(per)) {
                const int w = lw.r;
                const uint32_t *src = nullptr;
                if (w < 2 * a.nw) {
                    const long long cw = (gb0 + lw.q * gstep) >> 2;
                    if (w < a.nw) src = gw + cw + w;
                    else if (dgates) src = dgw + cw + (w - a.nw);
                } else if (w >= hoff && s > 0) {
                    src = hw + hw0 + lw.q * hstep + (w - hoff);   // h[s-1] of lane l
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
                if (dxpart) stf<V>(dxpart + o, dx);
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
            DivWalk lw(threadIdx.x, blockDim.x, nq);   // f as (lane, word)
            for (int f = threadIdx.x; f < N * nq; f += blockDim.x, lw.next(nq)) {
                const long long el = e0 + lw.q * estep;
                const int off = (int)((el * (long long)sizeof(T)) & 3);
                const unsigned char *dgc =
                    reinterpret_cast<const unsigned char *>(stg + (size_t)lw.q * per + a.nw) + off;
                dgates[el + lw.r] = *reinterpret_cast<const T *>(dgc + lw.r * (int)sizeof(T));
            }
        }
    }

    if (dmpart) block_dm_sum(dm_acc, dmpart + d * nblk + b);
}

// ---- shared weights, few channels: the backward a thread per lane ---------------------------
// Lane l's step s of the reverse scan, from its gate chunk's words cw (the chunk's first element
// goff bytes into cw[0]), the words covering its dyc and xc (xoff), h of the step, h before it of
// lanes l - 1, l, l + 1 (hb(q, c): lane l - 1 + q, channel c; zero at s = 0 and for lanes past the
// line; read where used, which keeps the lane kernel's registers), and the rows the lanes
// l - 1, l, l + 1 wrote at step s + 1 (cm, c0, cp: dh at 0 .. CC - 1, then the normalized weights
// w_{-1}, w_0, w_{+1}; zero before the first step and for the halo lanes). Out: dh, dx = lam dh,
// the chunk's gradient (lam, u, then the three raw weights: zero at s = 0) and the step's
// normalized weights for the neighbours' step s - 1; dm_acc gains u h dyc.
template <typename T, int CC, int NW, int XW, typename HB>
__device__ __forceinline__ void lane_bwd_step(const uint32_t (&cw)[NW], int goff, const uint32_t (&dyw)[XW],
                                              const uint32_t (&xw)[XW], int xoff, const float (&h)[CC],
                                              HB hb, const float *cm, const float *c0,
                                              const float *cp, float m, bool first, bool has_m, bool has_p,
                                              double &dm_acc, float (&dh)[CC], float (&dx)[CC],
                                              float (&grad)[2 * CC + 3], float (&sw)[3]) {
    float sa[3] = {0.0f, 0.0f, 0.0f}, sS = 0.0f, dws[3] = {0.0f, 0.0f, 0.0f};
    sw[0] = sw[1] = sw[2] = 0.0f;
    if (!first)
        sS = weights<T>(lane_el<T>(cw, goff, 2 * CC), lane_el<T>(cw, goff, 2 * CC + 1),
                        lane_el<T>(cw, goff, 2 * CC + 2), has_m, has_p, sa, sw);
    // dL/dh of step s + 1 reaching lane l: w_{+1} dh of lane l - 1, w_0 dh of lane l, w_{-1} dh of
    // lane l + 1
    const float wpm = cm[CC + 2], w00 = c0[CC + 1], wmp = cp[CC];
#pragma unroll
    for (int c = 0; c < CC; c++) {
        const float dy = lane_el<T>(dyw, xoff, c), x = lane_el<T>(xw, xoff, c);
        const float lam = lane_el<T>(cw, goff, c), u = lane_el<T>(cw, goff, CC + c);
        dm_acc += (double)u * h[c] * dy;
        dh[c] = wpm * cm[c] + w00 * c0[c] + wmp * cp[c] + m * u * dy;
        dx[c] = lam * dh[c];
#pragma unroll
        for (int q = 0; q < 3; q++) dws[q] += dh[c] * hb(q, c);
        grad[c] = x * dh[c];
        grad[CC + c] = m * h[c] * dy;
    }
    float gwt[3] = {0.0f, 0.0f, 0.0f};   // at s = 0, h before is 0: no weight gradient
    if (!first) weights_bwd<T>(sa, sw, sS, dws, gwt);
#pragma unroll
    for (int q = 0; q < 3; q++) grad[2 * CC + q] = gwt[q];
}

// A token's CH gate gradients of one direction to dg (its first element goff bytes into a word).
// bf16: whole 4-byte words where both halves are this chunk's; the first or last element shares
// its word with the next direction's chunk, written by another block.
template <typename T, int CH>
__device__ __forceinline__ void lane_store_chunk(T *dg, int goff, const T (&v)[CH]) {
    if constexpr (sizeof(T) == 2) {
        auto word = [](T lo, T hi) {
            return (uint32_t)__bfloat16_as_ushort(lo) | (uint32_t)__bfloat16_as_ushort(hi) << 16;
        };
        if (goff == 0) {
#pragma unroll
            for (int q = 0; q + 1 < CH; q += 2) *reinterpret_cast<uint32_t *>(dg + q) = word(v[q], v[q + 1]);
            dg[CH - 1] = v[CH - 1];
        } else {
            dg[0] = v[0];
#pragma unroll
            for (int q = 1; q + 1 < CH; q += 2) *reinterpret_cast<uint32_t *>(dg + q) = word(v[q], v[q + 1]);
        }
    } else {
#pragma unroll
        for (int q = 0; q < CH; q++) dg[q] = v[q];
    }
}

// Where the lane kernels write direction d's gate gradients of token t: element d dir + t token of
// dgates. The op's layout (B, H, W, G): token = G, dir = 2 Cc + 3 (a token's four chunks share
// its sectors, so each store leaves a sector partly written); direction-major scratch
// (4, tokens, 2 Cc + 3): token = 2 Cc + 3, dir = tokens x (2 Cc + 3), interleaved afterwards.
struct DgLayout {
    long long token, dir;
};

// dgates (tokens, 4, CH) from the direction-major scratch (4, tokens, CH).
template <typename T, int CH>
__global__ void gspn_dgates_interleave_kernel(const T *__restrict__ src, T *__restrict__ dst, long long tokens) {
    const long long n = tokens * 4 * CH, stride = (long long)gridDim.x * blockDim.x;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += stride) {
        const long long t = i / (4 * CH);
        const int r = (int)(i - t * 4 * CH), d = r / CH;
        dst[i] = src[(d * tokens + t) * CH + (r - d * CH)];
    }
}

// The forward's lane kernel (gspn_scan_fwd.cu) run in reverse: each thread owns one lane and
// loads its step's inputs into a ring of registers P steps ahead (the gate chunk, with ACC the old
// dgates chunk, dyc and xc as covering words, h of the step and of the step before); shared
// memory holds, per lane and step, what the neighbours read: dL/dh, the three weights and h of
// the step before the next one. One barrier a step. Without ACC dgates is written (every element
// of the direction's chunks, so no zeroing first); with ACC added to. A chunk goes out as whole
// 4-byte words but its first or last element (7 scattered 2-byte stores a step cost a third of
// the time at 56^2: 0.265 -> 0.202 ms with the words and 3 steps ahead, H100). Blocks of at most
// MAXT threads; dir_mask: the directions this launch runs.
template <typename T, int CC, bool ACC> struct BwdLaneWords {
    using LW = LaneWords<T, CC, true>;
    static constexpr int G = 0, DG = LW::GW, DY = DG + (ACC ? LW::GW : 0), X = DY + LW::XW;
    static constexpr int H = X + LW::XW, HP = H + CC, N = HP + CC;   // h of the step, of the one before
};

template <typename T, int CC, int P, bool ACC, int MAXT>
__global__ void __launch_bounds__(MAXT)
gspn_bwd_lane_kernel(const T *__restrict__ dyc, const T *__restrict__ xc, const T *__restrict__ gates,
                     const float *__restrict__ hid, const void *merge, int merge_bf16,
                     float *__restrict__ dxpart, T *__restrict__ dgates, double *__restrict__ dmpart,
                     long long plane, int nblk, ShArgs a, int dir_mask, DgLayout dgl) {
    using LW = LaneWords<T, CC, true>;
    using BW = BwdLaneWords<T, CC, ACC>;
    constexpr int RW = 2 * CC + 4;   // a lane's row: dh (CC), w_{-1}, w_0, w_{+1}, h before (CC), pad
    constexpr int CH = 2 * CC + 3;
    const int d = blockIdx.x & 3, b = blockIdx.x >> 2;
    if (!((dir_mask >> d) & 1)) return;
    const DirGeom g = pick_dir_sh(a, d);
    extern __shared__ __align__(16) unsigned char smem_raw[];
    float *rows = reinterpret_cast<float *>(smem_raw);   // [2][N+2][RW], zero halo lanes
    const int N = g.N, rowf = (N + 2) * RW, l = threadIdx.x;
    for (int i = threadIdx.x; i < 2 * rowf; i += blockDim.x) rows[i] = 0.0f;
    const bool live = l < N;
    const long long t0 = (long long)b * g.img_tokens + g.first + (long long)l * g.lstride;
    const long long tokens = plane / CC;
    const long long xend = plane * (long long)sizeof(T), gend = tokens * g.G * (long long)sizeof(T);
    hid += d * plane;
    if (dxpart) dxpart += d * plane;
    const float m = load_param(merge, merge_bf16, d);
    auto chunk_byte = [&](long long t) { return (t * g.G + g.goff) * (long long)sizeof(T); };
    auto load = [&](int s, uint32_t (&w)[BW::N]) {
        if (!live || s < 0) return;
        const long long t = t0 + (long long)s * g.sstride, cb = chunk_byte(t);
        lane_load_chunk<T, CC, true, BW::G>(gates, cb, gend, w);
        if constexpr (ACC) lane_load_chunk<T, CC, true, BW::DG>(dgates, cb, gend, w);
        lane_load_x<T, CC, BW::DY>(dyc, t, xend, w);
        lane_load_x<T, CC, BW::X>(xc, t, xend, w);
#pragma unroll
        for (int c = 0; c < CC; c++) {
            w[BW::H + c] = __float_as_uint(__ldg(hid + t * CC + c));
            w[BW::HP + c] = s > 0 ? __float_as_uint(__ldg(hid + (t - g.sstride) * CC + c)) : 0u;
        }
    };
    // The ring: slot j of a group of P holds step L - 1 - (k0 + j).
    uint32_t ring[P][BW::N];
#pragma unroll
    for (int j = 0; j < P; j++) load(g.L - 1 - j, ring[j]);
    __syncthreads();   // the zeros in before the first step's rows are written
    if (live)   // the first step's neighbours read h of the step before it from here
#pragma unroll
        for (int c = 0; c < CC; c++) rows[(l + 1) * RW + CC + 3 + c] = __uint_as_float(ring[0][BW::HP + c]);
    __syncthreads();
    double dm_acc = 0.0;
    for (int k0 = 0; k0 < g.L; k0 += P) {
#pragma unroll
        for (int j = 0; j < P; j++) {
            const int k = k0 + j, s = g.L - 1 - k;
            if (s < 0) break;   // the same for every thread of the block
            const float *rk = rows + (k & 1) * rowf;   // written at step s + 1
            float *wk = rows + ((k + 1) & 1) * rowf;   // read at step s - 1
            if (live) {
                const uint32_t(&w)[BW::N] = ring[j];
                const long long t = t0 + (long long)s * g.sstride, cb = chunk_byte(t);
                const int goff = (int)(cb & 3), xoff = (int)((t * CC * (long long)sizeof(T)) & 3);
                uint32_t cw[LW::NW], dgw[LW::NW], dyw[LW::XW], xw[LW::XW];
                lane_chunk_words<T, CC, true, BW::G>(w, cb, cw);
                if constexpr (ACC) lane_chunk_words<T, CC, true, BW::DG>(w, cb, dgw);
#pragma unroll
                for (int i = 0; i < LW::XW; i++) dyw[i] = w[BW::DY + i], xw[i] = w[BW::X + i];
                // the lanes l - 1, l, l + 1 (halo rows are zero)
                const float *cm = rk + l * RW, *c0 = rk + (l + 1) * RW, *cp = rk + (l + 2) * RW;
                float h[CC], dh[CC], dx[CC], grad[CH], sw[3];
#pragma unroll
                for (int c = 0; c < CC; c++) h[c] = __uint_as_float(w[BW::H + c]);
                auto hb = [&](int q, int c) { return (q == 0 ? cm : q == 1 ? c0 : cp)[CC + 3 + c]; };
                lane_bwd_step<T, CC>(cw, goff, dyw, xw, xoff, h, hb, cm, c0, cp, m, s == 0, l > 0,
                                     l < N - 1, dm_acc, dh, dx, grad, sw);
                // the neighbours' reads at step s - 1: dh, the weights, h before step s - 1
                float *wr = wk + (l + 1) * RW;
#pragma unroll
                for (int c = 0; c < CC; c++) wr[c] = dh[c];
                wr[CC] = sw[0], wr[CC + 1] = sw[1], wr[CC + 2] = sw[2];
                if (s > 0)
#pragma unroll
                    for (int c = 0; c < CC; c++) wr[CC + 3 + c] = __uint_as_float(ring[(j + 1) % P][BW::HP + c]);
                if (dxpart) stf<CC>(dxpart + t * CC, dx);
                if (dgates) {   // at s = 0 the weights' gradients are 0
                    T v[CH];
#pragma unroll
                    for (int q = 0; q < CH; q++) v[q] = from_f32<T>((ACC ? lane_el<T>(dgw, goff, q) : 0.0f) + grad[q]);
                    const long long o = d * dgl.dir + t * dgl.token;   // = cb / sizeof(T) in the gates' layout
                    lane_store_chunk<T, CH>(dgates + o, (int)((o * (long long)sizeof(T)) & 3), v);
                }
            }
            load(s - P, ring[j]);
            __syncthreads();   // rows of step s in; rk is free to be written at step s - 1
        }
    }
    if (dmpart) block_dm_sum(dm_acc, dmpart + d * nblk + b);
}

// ---- shared weights, LR and RL on long lines: the backward by runs of a lane's tokens ----------
// The forward's gspn_fwd_lane_rows_kernel in reverse, where dgates is written (or not taken): one
// token a step in LR and RL is a few bytes of a sector a lane, rows apart across the warp, so a
// lane loads the words of K steps at once (each token's gate chunk; the words covering the run's
// dyc and xc; h of the K steps and of the step before them: neighbours in its row) into its own
// column of shared memory, then runs the K steps from there: one barrier after the loads (a step
// reads its neighbour lanes' h before it from their columns) and one a step. dx of the K steps
// goes out as one run, each token's gate gradients as the lane kernel writes them (or to the
// direction-major scratch, DgLayout).
//
// A lane's column: the K gate chunks (GW words each), the words covering the run's dyc and xc (XR
// each: K CC values, which in bf16 at odd CC may start 2 bytes into a word), h of the K steps and the one
// before. K: 8 tokens in bf16 at Cc = 1 (43 words a lane: 217 KB with the rows at 1024 lanes), 4
// elsewhere, 2 in fp32 at Cc = 2.
template <typename T, int CC> __host__ __device__ constexpr int bwd_rows_run() {
    return sizeof(T) == 2 && CC == 1 ? 8 : sizeof(T) == 4 && CC == 2 ? 2 : 4;
}
template <typename T, int CC, int K> struct BwdRowsWords {
    using LW = LaneWords<T, CC, false>;
    static constexpr int GW = LW::NW, XW = LW::XW, TW = GW + CC;   // a token's gate and h words
    static constexpr int XR = (K * CC * (int)sizeof(T) + 3) / 4 + (sizeof(T) == 2 && CC % 2 ? 1 : 0);
    static constexpr int G = 0, DY = K * GW, X = DY + XR, H = X + XR;   // H: K + 1 steps of h
    static constexpr int N = H + (K + 1) * CC;   // words a lane
    static constexpr int RW = (CC + 3) | 1;      // a lane's row: dh, w_{-1}, w_0, w_{+1} (odd: no bank conflicts)
};

// SPLIT (sm_90 and up): each line over a cluster of two blocks of half its lanes, two blocks an SM
// (about 109 KB each at 1024 lanes), so that one block's loads and barriers overlap the other's
// steps. The edge lanes' rows go into the other block's halo row each step, their h before the
// step is read from the other block's columns, and the two blocks' dmerge sums are added in
// part order.
template <typename T, int CC, int K, bool SPLIT = false>
__global__ void __launch_bounds__(SPLIT ? SH_FWD_THREADS / 2 : SH_FWD_THREADS, SPLIT ? 2 : 1)
gspn_bwd_lane_rows_kernel(const T *__restrict__ dyc, const T *__restrict__ xc, const T *__restrict__ gates,
                          const float *__restrict__ hid, const void *merge, int merge_bf16,
                          float *__restrict__ dxpart, T *__restrict__ dgates, double *__restrict__ dmpart,
                          long long plane, int nblk, ShArgs a, int dir_mask, DgLayout dgl) {
    using RWD = BwdRowsWords<T, CC, K>;
    constexpr int GW = RWD::GW, XW = RWD::XW, XR = RWD::XR, TW = RWD::TW, RW = RWD::RW, CH = 2 * CC + 3;
    const int part = SPLIT ? chip_rank() : 0, blk = SPLIT ? (int)(blockIdx.x >> 1) : (int)blockIdx.x;
    const int d = 2 + (blk & 1), b = blk >> 1;   // LR, RL; the same for both blocks of a cluster
    if (!((dir_mask >> d) & 1)) return;   // the benchmark's diagnostics only
    const DirGeom g = pick_dir_sh(a, d);
    extern __shared__ __align__(16) unsigned char smem_raw[];
    float *rows = reinterpret_cast<float *>(smem_raw);   // [2][NP+2][RW], zero halo lanes
    // lane l of the line is slot li = l - part NP of this block's NP
    const int N = g.N, NP = SPLIT ? (N + 1) / 2 : N, rowf = (NP + 2) * RW, li = threadIdx.x, l = part * NP + li;
    uint32_t *words = reinterpret_cast<uint32_t *>(rows + 2 * rowf);   // [RWD::N][NP]: lane li's column
    unsigned char *peer = SPLIT ? chip_peer(smem_raw, part) : nullptr;   // the other block's
    for (int i = threadIdx.x; i < 2 * rowf; i += blockDim.x) rows[i] = 0.0f;
    const bool live = li < NP && l < N, has_m = l > 0, has_p = l < N - 1;
    const long long t0 = (long long)b * g.img_tokens + g.first + (long long)l * g.lstride;
    const long long xend = plane * (long long)sizeof(T), gend = plane / CC * g.G * (long long)sizeof(T);
    hid += d * plane;
    if (dxpart) dxpart += d * plane;
    const float m = load_param(merge, merge_bf16, d);
    auto chunk_byte = [&](long long t) { return (t * g.G + g.goff) * (long long)sizeof(T); };
    auto word = [&](int i, int slot) { return words[(size_t)i * NP + slot]; };
    auto peer_word = [&](int i, int slot) {   // the other block's column `slot`
        return reinterpret_cast<const uint32_t *>(peer + (reinterpret_cast<unsigned char *>(words) - smem_raw))[(size_t)i * NP + slot];
    };
    auto barrier = [] {
        if constexpr (SPLIT) chip_sync();
        else __syncthreads();
    };
    const bool up = g.sstride > 0;
    double dm_acc = 0.0;
    int n = 0;   // steps done: the rows' buffer
    barrier();   // the zero rows (in both blocks, before the other one's first write into them)
    // runs as the forward's: steps s0 .. s0 + K - 1 from s0 = 0 on, the line's last one shorter
    for (int s0 = (g.L - 1) / K * K; s0 >= 0; s0 -= K) {
        const int run = g.L - s0 < K ? g.L - s0 : K;
        // the run's lowest token, and the byte its xc and dyc start at in their first covering word
        const long long t_lo = t0 + (long long)(up ? s0 : s0 + run - 1) * g.sstride;
        const int xoff0 = (int)((t_lo * CC * (long long)sizeof(T)) & 3);
        if (live) {
            {   // the words covering the run's dyc and xc (none past the tensor's end)
                const uint32_t *dw = reinterpret_cast<const uint32_t *>(dyc), *xw = reinterpret_cast<const uint32_t *>(xc);
                const long long xb = (t_lo * CC * (long long)sizeof(T)) & ~3LL;
                uint32_t wd[XR], wx[XR];
#pragma unroll
                for (int i = 0; i < XR; i++) {
                    const long long bi = xb + 4LL * i;
                    wd[i] = wx[i] = 0u;
                    if (bi + 4 <= xend) wd[i] = __ldg(dw + (bi >> 2)), wx[i] = __ldg(xw + (bi >> 2));
                    else if (bi < xend) {   // an odd-length bf16 tensor's last element
                        wd[i] = *reinterpret_cast<const unsigned short *>(reinterpret_cast<const char *>(dyc) + bi);
                        wx[i] = *reinterpret_cast<const unsigned short *>(reinterpret_cast<const char *>(xc) + bi);
                    }
                }
#pragma unroll
                for (int i = 0; i < XR; i++)
                    words[(size_t)(RWD::DY + i) * NP + li] = wd[i], words[(size_t)(RWD::X + i) * NP + li] = wx[i];
            }
            // the gate chunks and h KH tokens at a time, all issued before the first store (about
            // 24 words in registers, within the 64 a thread has)
            constexpr int KH = K * TW <= 24 ? K : K / 2 * TW <= 24 ? K / 2 : 1;
#pragma unroll
            for (int k0 = 0; k0 < K; k0 += KH) {
                if (k0 >= run) break;
                uint32_t w[KH][TW];
#pragma unroll
                for (int k = 0; k < KH; k++)
                    if (k0 + k < run) {
                        const long long t = t0 + (long long)(s0 + k0 + k) * g.sstride;
                        lane_load_chunk<T, CC, false, 0>(gates, chunk_byte(t), gend, w[k]);
#pragma unroll
                        for (int c = 0; c < CC; c++) w[k][GW + c] = __float_as_uint(__ldg(hid + t * CC + c));
                    }
#pragma unroll
                for (int k = 0; k < KH; k++)
                    if (k0 + k < run) {
                        const int s = k0 + k;   // the step within the run
#pragma unroll
                        for (int i = 0; i < GW; i++) words[(size_t)(RWD::G + s * GW + i) * NP + li] = w[k][i];
#pragma unroll
                        for (int c = 0; c < CC; c++) words[(size_t)(RWD::H + (s + 1) * CC + c) * NP + li] = w[k][GW + c];
                    }
            }
            const long long tb = t0 + (long long)(s0 - 1) * g.sstride;   // h before the run (0 at s0 = 0)
#pragma unroll
            for (int c = 0; c < CC; c++)
                words[(size_t)(RWD::H + c) * NP + li] = s0 > 0 ? __float_as_uint(__ldg(hid + tb * CC + c)) : 0u;
        }
        barrier();   // the run's words in: the steps read the neighbour lanes' h
        float dxg[K][CC];
#pragma unroll
        for (int k = K - 1; k >= 0; k--) {
            if (k >= run) continue;   // the same for every thread of the block
            const int s = s0 + k;
            const float *rk = rows + (n & 1) * rowf;   // written at step s + 1
            float *wk = rows + ((n + 1) & 1) * rowf;   // read at step s - 1
            n++;
            if (live) {
                const long long t = t0 + (long long)s * g.sstride, cb = chunk_byte(t);
                // the token's xc and dyc: byte xb of the run's covering words (token t_lo + j)
                const int j = up ? k : run - 1 - k, xb = xoff0 + j * CC * (int)sizeof(T);
                const int goff = (int)(cb & 3), xoff = xb & 3;
                uint32_t cw[GW], dyw[XW], xw[XW];
#pragma unroll
                for (int i = 0; i < GW; i++) cw[i] = word(RWD::G + k * GW + i, li);
#pragma unroll
                for (int i = 0; i < XW; i++) dyw[i] = word(RWD::DY + (xb >> 2) + i, li), xw[i] = word(RWD::X + (xb >> 2) + i, li);
                float h[CC], dh[CC], grad[CH], sw[3];
#pragma unroll
                for (int c = 0; c < CC; c++) h[c] = __uint_as_float(word(RWD::H + (k + 1) * CC + c, li));
                auto hb = [&](int q, int c) {   // h before step s of lane l - 1 + q, from its column
                    const int i = RWD::H + k * CC + c, sl = li - 1 + q;
                    if ((q == 0 && !has_m) || (q == 2 && !has_p)) return 0.0f;
                    if constexpr (SPLIT)   // the other block's edge column
                        if (sl < 0 || sl >= NP) return __uint_as_float(peer_word(i, sl < 0 ? NP - 1 : 0));
                    return __uint_as_float(word(i, sl));
                };
                lane_bwd_step<T, CC>(cw, goff, dyw, xw, xoff, h, hb, rk + li * RW, rk + (li + 1) * RW,
                                     rk + (li + 2) * RW, m, s == 0, has_m, has_p, dm_acc, dh, dxg[k], grad, sw);
                float r[RW];   // the neighbours' reads at step s - 1
#pragma unroll
                for (int c = 0; c < CC; c++) r[c] = dh[c];
                r[CC] = sw[0], r[CC + 1] = sw[1], r[CC + 2] = sw[2];
#pragma unroll
                for (int i = CC + 3; i < RW; i++) r[i] = 0.0f;
                float *wr = wk + (li + 1) * RW;
#pragma unroll
                for (int i = 0; i < CC + 3; i++) wr[i] = r[i];
                if constexpr (SPLIT)   // an edge lane's row into the other block's halo row
                    if (part == 0 ? li == NP - 1 : li == 0) {
                        float *pr = reinterpret_cast<float *>(peer + (reinterpret_cast<unsigned char *>(wk) - smem_raw)) +
                                    (part == 0 ? 0 : NP + 1) * RW;
#pragma unroll
                        for (int i = 0; i < CC + 3; i++) pr[i] = r[i];
                    }
                if (dxpart && run < K) stf<CC>(dxpart + t * CC, dxg[k]);
                if (dgates) {
                    T v[CH];
#pragma unroll
                    for (int q = 0; q < CH; q++) v[q] = from_f32<T>(grad[q]);
                    const long long o = d * dgl.dir + t * dgl.token;
                    lane_store_chunk<T, CH>(dgates + o, (int)((o * (long long)sizeof(T)) & 3), v);
                }
            }
            barrier();   // rows of step s in; rk is free to be written at step s - 1
        }
        // step k of the run is token t0 + (s0 + k) sstride: from the run's lowest token up (LR) or down
        if (live && dxpart && run == K)
            lane_store_run<K, CC>(nullptr, dxpart, t0 + (long long)(up ? s0 : s0 + K - 1) * g.sstride, up, dxg, dxg);
    }
    if constexpr (SPLIT) {   // each part's sum into part 0's halves[part], then added in part order
        __shared__ double own_sum, halves[2];
        if (dmpart) block_dm_sum(dm_acc, &own_sum);
        if (dmpart && threadIdx.x == 0) {   // the thread that wrote own_sum
            double *dst = part == 0 ? halves : reinterpret_cast<double *>(chip_peer(reinterpret_cast<unsigned char *>(halves), part));
            dst[part] = own_sum;
        }
        chip_sync();
        if (dmpart && part == 0 && threadIdx.x == 0) dmpart[d * nblk + b] = halves[0] + halves[1];
    } else if (dmpart) {
        block_dm_sum(dm_acc, dmpart + d * nblk + b);
    }
}

// ---- host side -----------------------------------------------------------------------------
template <typename T, int V, bool SH>
void launch_bwd_dir(const DirGeom &g, int B, const T *dyc, const T *xc, const T *gates,
                    const float *hid, const void *merge, int merge_bf16, float *dxpart, T *dgates,
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

template <typename T, int V>
bool bwd_pipe(CudaCtx *c, const Plan &p, const T *dyc, const T *xc, const T *gates,
              const float *hid, const void *merge, int merge_bf16, float *dxpart, T *dgates,
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

// The lane kernel for the directions of dir_mask, one thread a lane: blocks of 256 threads and 3
// steps ahead on lines of at most 256 lanes, of 1024 threads (64 registers a thread) and 2 steps
// ahead on longer ones, where dgates is written or not taken.
template <typename T, int CC>
bool bwd_lane_cc(CudaCtx *c, const Plan &p, const ShArgs &a, int lanes, int dir_mask, const T *dyc,
                 const T *xc, const T *gates, const float *hid, const void *merge, int merge_bf16,
                 float *dxpart, T *dgates, double *dmpart, bool write, DgLayout dgl) {
    const size_t smem = 2 * (size_t)(lanes + 2) * (2 * CC + 4) * sizeof(float);
    if (smem > smem_limit()) return false;
    const bool acc = !write && dgates;
    auto k = acc ? gspn_bwd_lane_kernel<T, CC, 3, true, 256> : gspn_bwd_lane_kernel<T, CC, 3, false, 256>;
    if (lanes > 256) {
        if (acc || lanes > SH_FWD_THREADS) return false;
        k = gspn_bwd_lane_kernel<T, CC, 2, false, SH_FWD_THREADS>;
    }
    set_smem(k, smem);
    k<<<DIRS * p.B, (lanes + 31) / 32 * 32, smem, c->stream>>>(dyc, xc, gates, hid, merge, merge_bf16, dxpart,
                                                             dgates, dmpart, p.plane, p.B, a, dir_mask, dgl);
    CUDA_CHECK_LAUNCH();
    return true;
}

// LR and RL by gspn_bwd_lane_rows_kernel: lines of at most SH_FWD_THREADS lanes, dgates written or
// not taken; runs of bwd_rows_run tokens, so that a lane's words fit shared memory at 1024 lanes;
// in bf16 on sm_90 each line over a cluster of two blocks.
template <typename T, int CC>
bool bwd_lane_rows(CudaCtx *c, const Plan &p, const ShArgs &a, const T *dyc, const T *xc, const T *gates,
                   const float *hid, const void *merge, int merge_bf16, float *dxpart, T *dgates,
                   double *dmpart, int dir_mask, DgLayout dgl) {
    constexpr int K = bwd_rows_run<T, CC>();
    using RWD = BwdRowsWords<T, CC, K>;
    const int N = a.g[2].N;   // H
    const bool split = c->cc >= 90 && sizeof(T) == 2;
    const int NP = split ? (N + 1) / 2 : N;   // lanes a block
    const size_t smem = (2 * (size_t)(NP + 2) * RWD::RW + (size_t)RWD::N * NP) * sizeof(float);
    if (N > SH_FWD_THREADS || smem > smem_limit()) return false;
    if constexpr (sizeof(T) == 2)
        if (split) {
            auto k = gspn_bwd_lane_rows_kernel<T, CC, K, true>;
            set_smem(k, smem);
            PairLaunch l(c->stream, 2 * 2 * p.B, (NP + 31) / 32 * 32, smem);   // two blocks a line
            CUDA_CHECK(cudaLaunchKernelEx(&l.cfg, k, dyc, xc, gates, hid, merge, merge_bf16, dxpart, dgates,
                                          dmpart, p.plane, p.B, a, dir_mask, dgl));
            return true;
        }
    auto k = gspn_bwd_lane_rows_kernel<T, CC, K>;
    set_smem(k, smem);
    k<<<2 * p.B, (N + 31) / 32 * 32, smem, c->stream>>>(dyc, xc, gates, hid, merge, merge_bf16, dxpart,
                                                      dgates, dmpart, p.plane, p.B, a, dir_mask, dgl);
    CUDA_CHECK_LAUNCH();
    return true;
}

// The lane kernels where they apply: shared weights, Cc of 1 or 2 (at 4 the lane kernel ran slower
// than the staged kernel, 0.484 against 0.402 ms at 56^2 with 2-byte dgates stores; more does not
// fit its ring), 16-byte aligned gates and dgates. Lines of at most 256 lanes: the lane kernel for
// all four directions. Longer lines, where dgates is written: LR and RL by runs
// (gspn_bwd_lane_rows_kernel), TB and BT by the lane kernel.
template <typename T>
bool bwd_lane(CudaCtx *c, const Plan &p, const T *dyc, const T *xc, const T *gates, const float *hid,
              const void *merge, int merge_bf16, float *dxpart, T *dgates, double *dmpart, bool write) {
    auto al = [](const void *q, uintptr_t n) { return ((uintptr_t)q & (n - 1)) == 0; };
    if (!p.shared || p.stages == 1 || !al(gates, 16) || (dgates && !al(dgates, 16)) || !al(dyc, 4) ||
        !al(xc, 4) || (p.Cc != 1 && p.Cc != 2))
        return false;
    ShArgs a{};
    for (int d = 0; d < DIRS; d++) {
        a.g[d] = dir_geom(p, d);
        a.lanes_max = a.g[d].N > a.lanes_max ? a.g[d].N : a.lanes_max;
    }
    auto lane = [&](int lanes, int mask, T *dg, DgLayout dgl) {
        return p.Cc == 1 ? bwd_lane_cc<T, 1>(c, p, a, lanes, mask, dyc, xc, gates, hid, merge, merge_bf16, dxpart, dg, dmpart, write, dgl)
                         : bwd_lane_cc<T, 2>(c, p, a, lanes, mask, dyc, xc, gates, hid, merge, merge_bf16, dxpart, dg, dmpart, write, dgl);
    };
    const long long CH = 2 * p.Cc + 3, tokens = p.plane / p.Cc;
    if (a.lanes_max <= 256) return lane(a.lanes_max, p.dir_mask, dgates, DgLayout{p.G, CH});
    if ((!write && dgates) || a.g[0].N > SH_FWD_THREADS) return false;
    // dgates direction-major into scratch, interleaved into the op's layout after both kernels
    T *dgs = dgates ? static_cast<T *>(scratch_alloc(c, (size_t)tokens * p.G * sizeof(T))) : nullptr;
    const DgLayout dgl{CH, tokens * CH};
    const bool rows = p.Cc == 1 ? bwd_lane_rows<T, 1>(c, p, a, dyc, xc, gates, hid, merge, merge_bf16, dxpart, dgs, dmpart, p.dir_mask, dgl)
                                : bwd_lane_rows<T, 2>(c, p, a, dyc, xc, gates, hid, merge, merge_bf16, dxpart, dgs, dmpart, p.dir_mask, dgl);
    const bool done = rows && lane(a.g[0].N, p.dir_mask & 3, dgs, dgl);
    if (done && dgs) {
        if (p.Cc == 1)
            gspn_dgates_interleave_kernel<T, 5><<<ew_blocks(tokens * p.G, c), EW_THREADS, 0, c->stream>>>(dgs, dgates, tokens);
        else
            gspn_dgates_interleave_kernel<T, 7><<<ew_blocks(tokens * p.G, c), EW_THREADS, 0, c->stream>>>(dgs, dgates, tokens);
        CUDA_CHECK_LAUNCH();
    }
    if (dgs) CUDA_CHECK(cudaFreeAsync(dgs, c->stream));
    return done;
}

template <typename T, int V>
bool bwd_sh(CudaCtx *c, const Plan &p, const T *dyc, const T *xc, const T *gates,
            const float *hid, const void *merge, int merge_bf16, float *dxpart, T *dgates,
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

template <typename T, int V, bool SH>
void scan_bwd(Ctx *ctx, const Plan &p, const Tensor *dyc, const Tensor *xc, const Tensor *gates,
              const Tensor *merge, const Tensor *hidden, Tensor *dxc, Tensor *dgates,
              Tensor *dmerge, bool write) {
    CudaCtx *c = cuda_ctx_of(ctx);
    const int mbf = merge->dtype == DTYPE_BF16;
    const void *ptrs[] = {dyc->data, xc->data, gates->data, dxc ? dxc->data : nullptr,
                          dgates ? dgates->data : nullptr};
    if (SH && img_fits<T>(c, p, true, dgates != nullptr && !write, ptrs, 5)) {   // the whole image on chip
        double *dmpart = dmerge ? static_cast<double *>(scratch_alloc(c, DIRS * (size_t)p.B * sizeof(double)))
                                : nullptr;
        bwd_img<T>(c, p, static_cast<const T *>(dyc->data), static_cast<const T *>(xc->data),
                   static_cast<const T *>(gates->data), hidden ? tensor_f32(hidden) : nullptr, merge->data,
                   mbf, dxc ? static_cast<T *>(dxc->data) : nullptr,
                   dgates ? static_cast<T *>(dgates->data) : nullptr, dmpart, write);
        if (dmpart) {
            gspn_dmerge_finalize_kernel<<<1, 32 * DIRS, 0, c->stream>>>(dmpart, p.B, dmerge->data,
                                                                         dmerge->dtype == DTYPE_BF16);
            CUDA_CHECK_LAUNCH();
            CUDA_CHECK(cudaFreeAsync(dmpart, c->stream));
        }
        return;
    }
    const int nblk = p.B * p.ngroups;   // blocks per direction
    const size_t part_bytes = dxc ? DIRS * (size_t)p.plane * sizeof(float) : 0;
    const size_t hid_bytes = hidden ? 0 : DIRS * (size_t)p.plane * sizeof(float);
    const size_t dm_bytes = dmerge ? DIRS * (size_t)nblk * sizeof(double) : 0;
    char *scratch = static_cast<char *>(scratch_alloc(c, part_bytes + hid_bytes + dm_bytes));
    float *dxpart = dxc ? reinterpret_cast<float *>(scratch) : nullptr;
    float *hid = hidden ? tensor_f32(hidden) : reinterpret_cast<float *>(scratch + part_bytes);
    double *dmpart = dmerge ? reinterpret_cast<double *>(scratch + part_bytes + hid_bytes) : nullptr;
    const T *x = static_cast<const T *>(xc->data), *g = static_cast<const T *>(gates->data);

    if (!hidden) fwd_scans<T, V, SH>(c, p, x, g, hid, nullptr);   // recompute h
    const T *dy = static_cast<const T *>(dyc->data);
    T *dg = dgates ? static_cast<T *>(dgates->data) : nullptr;
    // write: the pipelined and lane kernels write dgates; the other kernels add, into zeros.
    bool done = !SH && bwd_pipe<T, V>(c, p, dy, x, g, hid, merge->data, mbf, dxpart, dg, dmpart, write);
    if (!done && SH) done = bwd_lane<T>(c, p, dy, x, g, hid, merge->data, mbf, dxpart, dg, dmpart, write);
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

}  // namespace

void gspn_bwd_impl(Ctx *ctx, const Tensor *dyc, const Tensor *xc, const Tensor *gates,
                   const Tensor *merge, int shared_w, const Tensor *hidden, Tensor *dxc,
                   Tensor *dgates, Tensor *dmerge, Tuning tu, bool write) {
    const char *op = "gspn_scan_bwd";
    CG_CHECK(dyc && xc && gates, "", "op %s: dyc, xc, gates and merge are required", op);
    const void *ptrs[] = {dyc->data, xc->data, gates->data, hidden ? hidden->data : nullptr,
                          dxc ? dxc->data : nullptr, dgates ? dgates->data : nullptr};
    const Plan p = make_plan(op, xc, gates, merge, shared_w, tu, true, ptrs, 6);
    check_like(op, "dyc", dyc, "xc", xc);
    check_like(op, "dxc", dxc, "xc", xc);
    check_like(op, "dgates", dgates, "gates", gates);
    if (dmerge) {
        gspn_scan_check_like(op, "dmerge", dmerge, "merge", merge);
        CG_CHECK(dmerge->device == DEVICE_CUDA, "", "op %s (CUDA): dmerge is not on the GPU", op);
    }
    check_hidden(op, hidden, p.plane);
    if (p.plane == 0 || (!dxc && !dgates && !dmerge)) return;
    GSPN_DISPATCH(p, scan_bwd, ctx, p, dyc, xc, gates, merge, hidden, dxc, dgates, dmerge, write);
}

}  // namespace gspn
