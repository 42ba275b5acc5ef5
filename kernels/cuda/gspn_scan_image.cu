// C-GSPN scan with shared weights on images that fit on chip (gspn_hier's 28 x 28, 14 x 14 and
// 7 x 7 stages; the plan in gspn_scan.cu's header covers the rest). A scan step is short and the
// steps are serial, so the staged kernels, which copy each step's inputs from global memory and
// wait for them, spend a memory latency per step. Here one block owns one image and all four
// directions: it copies the image's xc, gates (and dyc, h) into shared memory once, runs every
// step from there with one barrier per step, and keeps the four directions' h (and dL/dh) as
// planes on chip, so the merge (yc = sum_d m_d u_d h_d), dxc = sum_d lam_d dh_d and dgates are
// formed in the same block and written once, coalesced: no per-direction fp32 slices in memory.
//
// Thread (d, l) = (tid / L, tid % L), L = max(H, W): lane l of direction d, all Cc channels (the
// shared weights' gradient sums over channels in one thread). Forward step s of direction d reads
// h of step s - 1 from its plane; the backward step s gathers dL/dh of step s + 1 through the
// weights its neighbours computed at that step (kept per lane, double buffered by step parity).
// Arithmetic per element as the staged kernels (gspn_scan_fwd.cu / gspn_scan_bwd.cu): the same
// weights, merge and dxc orders, fp64 dmerge partials per block. Deterministic.
#include "gspn_scan_common.cuh"

namespace gspn {

constexpr int IMG_CMAX = 4;            // channels a thread keeps in registers
// Lanes of the longer line: at most 4 x 64 threads a block. A 56 x 56 image of 1 channel in bf16
// fits for the forward (181 KiB; B = 128: 0.074 -> 0.035 ms against the staged kernels, H100);
// gspn_hier's 2 proxy channels there do not (28 gates a token: 288 KiB), nor any backward.
constexpr int IMG_LMAX = 64;
constexpr size_t IMG_SMEM_MAX = 220 * 1024;

namespace {

struct ImgGeom {
    int H, W, Cc, G, L;   // L = max(H, W)
    int blk;              // gates of one direction: 2 Cc + 3
};

// Direction d as (step s, lane l) -> token within the image (kernels/cpu/gspn_scan.c's ScanDir).
struct ImgDir {
    int steps, lanes, first, sstride, lstride;
};
__device__ __forceinline__ ImgDir img_dir(int d, int H, int W) {
    switch (d) {
    case 0: return {H, W, 0, W, 1};                   // TB
    case 1: return {H, W, (H - 1) * W, -W, 1};        // BT
    case 2: return {W, H, 0, 1, W};                   // LR
    default: return {W, H, W - 1, -1, W};             // RL
    }
}

__host__ __device__ constexpr size_t img_align(size_t bytes) { return (bytes + 15) / 16 * 16; }

// Shared-memory layout (byte offsets), the same on host and device.
struct ImgLayout {
    size_t x, g, dy, h, dh, dg, w, dm, total;
};
template <typename T>
__host__ __device__ ImgLayout img_layout(const ImgGeom &q, bool bwd, bool dgates) {
    const size_t hw = (size_t)q.H * q.W, esz = sizeof(T);
    ImgLayout s;
    s.x = 0;
    s.g = s.x + img_align(hw * q.Cc * esz);                         // xc (HW, Cc)
    s.dy = s.g + img_align(hw * q.G * esz);                         // gates (HW, G)
    s.h = s.dy + (bwd ? img_align(hw * q.Cc * esz) : 0);            // dyc (HW, Cc)
    s.dh = s.h + img_align(DIRS * hw * q.Cc * sizeof(float));       // h (4, HW, Cc)
    s.dg = s.dh + (bwd ? img_align(DIRS * hw * q.Cc * sizeof(float)) : 0);   // dL/dh (4, HW, Cc)
    s.w = s.dg + (bwd && dgates ? img_align(hw * q.G * sizeof(float)) : 0);  // dgates (HW, G)
    s.dm = s.w + (bwd ? img_align(2 * DIRS * q.L * 3 * sizeof(float)) : 0);  // w of steps, by parity
    s.total = s.dm + (bwd ? img_align(DIRS * q.L * sizeof(double)) : 0);     // dmerge partials
    return s;
}

// Starts copying n 4-byte words from src to dst (the caller commits and waits).
__device__ __forceinline__ void img_copy_words(void *dst, const void *src, size_t n) {
    uint32_t *d = static_cast<uint32_t *>(dst);
    const uint32_t *s = static_cast<const uint32_t *>(src);
    for (size_t i = threadIdx.x; i < n; i += blockDim.x) cp_async<4>(d + i, s + i);
}

// The four forward scans over one staged image: h planes (4, HW, Cc) in shared memory.
template <typename T>
__device__ void img_scan_fwd(const ImgGeom &q, const T *xs, const T *gs, float *hp) {
    const int d = threadIdx.x / q.L, l = threadIdx.x % q.L, hw = q.H * q.W;
    const ImgDir r = img_dir(d < DIRS ? d : 0, q.H, q.W);
    const bool live = d < DIRS && l < r.lanes;
    float *h = hp + (size_t)(d < DIRS ? d : 0) * hw * q.Cc;
    for (int s = 0; s < q.L; s++) {
        if (live && s < r.steps) {
            const int t = r.first + s * r.sstride + l * r.lstride;
            const T *gc = gs + (size_t)t * q.G + d * q.blk;   // lam (Cc) | u (Cc) | wt (3)
            float a[3], w[3] = {0.0f, 0.0f, 0.0f};
            if (s > 0)
                weights<T>(to_f32(gc[2 * q.Cc]), to_f32(gc[2 * q.Cc + 1]), to_f32(gc[2 * q.Cc + 2]),
                           l > 0, l < r.lanes - 1, a, w);
            const int tp = t - r.sstride;   // the same lane at step s - 1
            for (int c = 0; c < q.Cc; c++) {
                float acc = to_f32(gc[c]) * to_f32(xs[(size_t)t * q.Cc + c]);
                if (s > 0) {
                    if (l > 0) acc += w[0] * h[(size_t)(tp - r.lstride) * q.Cc + c];
                    acc += w[1] * h[(size_t)tp * q.Cc + c];
                    if (l < r.lanes - 1) acc += w[2] * h[(size_t)(tp + r.lstride) * q.Cc + c];
                }
                h[(size_t)t * q.Cc + c] = acc;
            }
        }
        __syncthreads();
    }
}

// ---- forward --------------------------------------------------------------------------------
template <typename T>
__global__ void __launch_bounds__(DIRS * IMG_LMAX)
gspn_fwd_img_kernel(const T *__restrict__ xc, const T *__restrict__ gates, const void *merge,
                    int merge_bf16, T *__restrict__ yc, float *__restrict__ hid, long long plane,
                    ImgGeom q) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const ImgLayout s = img_layout<T>(q, false, false);
    T *xs = reinterpret_cast<T *>(smem_raw + s.x), *gs = reinterpret_cast<T *>(smem_raw + s.g);
    float *hp = reinterpret_cast<float *>(smem_raw + s.h);
    const size_t hw = (size_t)q.H * q.W, b = blockIdx.x;
    img_copy_words(xs, xc + b * hw * q.Cc, hw * q.Cc * sizeof(T) / 4);
    img_copy_words(gs, gates + b * hw * q.G, hw * q.G * sizeof(T) / 4);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    img_scan_fwd<T>(q, xs, gs, hp);
    const size_t n = hw * q.Cc;
    if (hid)
        for (int dd = 0; dd < DIRS; dd++)
            for (size_t i = threadIdx.x; i < n; i += blockDim.x)
                hid[dd * plane + b * n + i] = hp[dd * n + i];
    const float m0 = load_param(merge, merge_bf16, 0), m1 = load_param(merge, merge_bf16, 1);
    const float m2 = load_param(merge, merge_bf16, 2), m3 = load_param(merge, merge_bf16, 3);
    for (size_t i = threadIdx.x; i < n; i += blockDim.x) {
        const size_t t = i / q.Cc, c = i - t * q.Cc;
        const T *u = gs + t * q.G + q.Cc + c;   // u of direction d at u[d * blk]
        const float y0 = to_f32(u[0]) * hp[i], y1 = to_f32(u[q.blk]) * hp[n + i];
        const float y2 = to_f32(u[2 * q.blk]) * hp[2 * n + i], y3 = to_f32(u[3 * q.blk]) * hp[3 * n + i];
        float acc = m0 * y0;
        acc += m1 * y1;
        acc += m2 * y2;
        acc += m3 * y3;
        yc[b * n + i] = from_f32<T>(acc);
    }
}

// ---- backward -------------------------------------------------------------------------------
// Step s (from the last): dh = m u dyc + w_{+1} dh of lane l-1, w_0 dh of lane l and w_{-1} dh of
// lane l+1 at step s + 1; then dlam = xc dh, du = m h dyc, dwt from dw_k = sum_c dh h[s-1, l+k].
template <typename T>
__global__ void __launch_bounds__(DIRS * IMG_LMAX)
gspn_bwd_img_kernel(const T *__restrict__ dyc, const T *__restrict__ xc, const T *__restrict__ gates,
                    const float *__restrict__ hid, const void *merge, int merge_bf16,
                    T *__restrict__ dxc, T *__restrict__ dgates, double *__restrict__ dmpart,
                    long long plane, int write, ImgGeom q) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const ImgLayout s = img_layout<T>(q, true, dgates != nullptr);
    T *xs = reinterpret_cast<T *>(smem_raw + s.x), *gs = reinterpret_cast<T *>(smem_raw + s.g);
    T *dys = reinterpret_cast<T *>(smem_raw + s.dy);
    float *hp = reinterpret_cast<float *>(smem_raw + s.h), *dhp = reinterpret_cast<float *>(smem_raw + s.dh);
    float *dg = reinterpret_cast<float *>(smem_raw + s.dg), *wb = reinterpret_cast<float *>(smem_raw + s.w);
    double *dmr = reinterpret_cast<double *>(smem_raw + s.dm);
    const size_t hw = (size_t)q.H * q.W, b = blockIdx.x, n = hw * q.Cc;
    img_copy_words(xs, xc + b * n, n * sizeof(T) / 4);
    img_copy_words(gs, gates + b * hw * q.G, hw * q.G * sizeof(T) / 4);
    img_copy_words(dys, dyc + b * n, n * sizeof(T) / 4);
    if (hid)
        for (int dd = 0; dd < DIRS; dd++) img_copy_words(hp + dd * n, hid + dd * plane + b * n, n);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    if (!hid) img_scan_fwd<T>(q, xs, gs, hp);   // h again, on chip

    const int d = threadIdx.x / q.L, l = threadIdx.x % q.L;
    const ImgDir r = img_dir(d < DIRS ? d : 0, q.H, q.W);
    const bool live = d < DIRS && l < r.lanes;
    const float m = d < DIRS ? load_param(merge, merge_bf16, d) : 0.0f;
    float *h = hp + (size_t)(d < DIRS ? d : 0) * n, *dh_pl = dhp + (size_t)(d < DIRS ? d : 0) * n;
    float *wrow = wb + (size_t)(d < DIRS ? d : 0) * q.L * 3;   // + parity * DIRS * L * 3: lane l's w_k
    double dm_acc = 0.0;
    for (int k = 0; k < q.L; k++) {
        const int st = r.steps - 1 - k;   // this direction's step (none when negative)
        if (live && st >= 0) {
            const int t = r.first + st * r.sstride + l * r.lstride;
            const T *gc = gs + (size_t)t * q.G + d * q.blk;
            const bool has_m = l > 0, has_p = l < r.lanes - 1;
            float a[3] = {0.0f, 0.0f, 0.0f}, w[3] = {0.0f, 0.0f, 0.0f}, S = 0.0f;
            if (st > 0)
                S = weights<T>(to_f32(gc[2 * q.Cc]), to_f32(gc[2 * q.Cc + 1]), to_f32(gc[2 * q.Cc + 2]),
                               has_m, has_p, a, w);
            // w_k of step st + 1 (the previous iteration, parity (k - 1) & 1) of lanes l-1, l, l+1
            const float *wprev = wrow + (size_t)((k + 1) & 1) * DIRS * q.L * 3;
            const bool later = st + 1 < r.steps;
            const int tn = t + r.sstride;   // the same lane at step st + 1
            const float wpm = later && has_m ? wprev[(l - 1) * 3 + 2] : 0.0f;
            const float w00 = later ? wprev[l * 3 + 1] : 0.0f;
            const float wmp = later && has_p ? wprev[(l + 1) * 3 + 0] : 0.0f;
            float dws[3] = {0.0f, 0.0f, 0.0f};
            const int tp = t - r.sstride;   // the same lane at step st - 1
            for (int c = 0; c < q.Cc; c++) {
                const size_t i = (size_t)t * q.Cc + c;
                const float dy = to_f32(dys[i]), hc = h[i], u = to_f32(gc[q.Cc + c]);
                float dn_m = 0.0f, dn_0 = 0.0f, dn_p = 0.0f;
                if (later) {
                    if (has_m) dn_m = dh_pl[(size_t)(tn - r.lstride) * q.Cc + c];
                    dn_0 = dh_pl[(size_t)tn * q.Cc + c];
                    if (has_p) dn_p = dh_pl[(size_t)(tn + r.lstride) * q.Cc + c];
                }
                const float dh = wpm * dn_m + w00 * dn_0 + wmp * dn_p + m * u * dy;
                dh_pl[i] = dh;
                dm_acc += (double)u * hc * dy;
                if (dgates) {
                    float *dgc = dg + (size_t)t * q.G + d * q.blk;
                    dgc[c] = to_f32(xs[i]) * dh;
                    dgc[q.Cc + c] = m * hc * dy;
                }
                if (st > 0) {
                    const float hm = has_m ? h[(size_t)(tp - r.lstride) * q.Cc + c] : 0.0f;
                    const float hp_ = has_p ? h[(size_t)(tp + r.lstride) * q.Cc + c] : 0.0f;
                    dws[0] += dh * hm;
                    dws[1] += dh * h[(size_t)tp * q.Cc + c];
                    dws[2] += dh * hp_;
                }
            }
            float *wnow = wrow + (size_t)(k & 1) * DIRS * q.L * 3 + l * 3;
            wnow[0] = w[0], wnow[1] = w[1], wnow[2] = w[2];
            if (dgates) {   // at st = 0, h[-1] = 0: the weights have no gradient
                float gwt[3] = {0.0f, 0.0f, 0.0f};
                if (st > 0) weights_bwd<T>(a, w, S, dws, gwt);
                float *dgc = dg + (size_t)t * q.G + d * q.blk + 2 * q.Cc;
                dgc[0] = gwt[0], dgc[1] = gwt[1], dgc[2] = gwt[2];
            }
        }
        __syncthreads();
    }

    // dxc = sum_d lam_d dh_d (TB, BT, LR, RL in order), dgates, once and coalesced.
    if (dxc)
        for (size_t i = threadIdx.x; i < n; i += blockDim.x) {
            const size_t t = i / q.Cc, c = i - t * q.Cc;
            const T *lam = gs + t * q.G + c;   // lam of direction d at lam[d * blk]
            const float p0 = to_f32(lam[0]) * dhp[i], p1 = to_f32(lam[q.blk]) * dhp[n + i];
            const float p2 = to_f32(lam[2 * q.blk]) * dhp[2 * n + i], p3 = to_f32(lam[3 * q.blk]) * dhp[3 * n + i];
            float acc = write ? 0.0f : to_f32(dxc[b * n + i]);
            acc += ((p0 + p1) + p2) + p3;
            dxc[b * n + i] = from_f32<T>(acc);
        }
    if (dgates)
        for (size_t i = threadIdx.x; i < hw * q.G; i += blockDim.x) {
            T *p = dgates + b * hw * q.G + i;
            *p = from_f32<T>(write ? dg[i] : to_f32(*p) + dg[i]);
        }
    if (dmpart) {   // per direction, lanes in order
        if (threadIdx.x < DIRS * q.L) dmr[threadIdx.x] = dm_acc;
        __syncthreads();
        if (threadIdx.x < DIRS) {
            double sum = 0.0;
            for (int j = 0; j < q.L; j++) sum += dmr[threadIdx.x * q.L + j];
            dmpart[threadIdx.x * gridDim.x + b] = sum;
        }
    }
}

// The image path applies: shared weights, few channels, lines of at most IMG_LMAX lanes, whole
// 4-byte words per image slice of xc (the gates' G = 4 (2 Cc + 3) always is), and the block's
// shared memory within IMG_SMEM_MAX.
template <typename T>
bool img_geom(const Plan &p, bool bwd, bool dgates, ImgGeom &q, size_t &smem) {
    q = {p.H, p.W, p.Cc, p.G, p.H > p.W ? p.H : p.W, 2 * p.Cc + 3};
    smem = 0;
    if (!p.shared || p.stages == 1 || p.Cc > IMG_CMAX || q.L > IMG_LMAX ||
        ((size_t)p.H * p.W * p.Cc * sizeof(T)) % 4 != 0)
        return false;
    smem = img_layout<T>(q, bwd, dgates).total;
    return smem <= IMG_SMEM_MAX && smem <= smem_limit();
}

}  // namespace

template <typename T>
bool img_fits(const Plan &p, bool bwd, bool dgates, const void *const *ptrs, int nptrs) {
    ImgGeom q;
    size_t smem;
    if (!img_geom<T>(p, bwd, dgates, q, smem)) return false;
    for (int i = 0; i < nptrs; i++)
        if (ptrs[i] && !aligned4(ptrs[i])) return false;
    return true;
}

template <typename T>
void fwd_img(CudaCtx *c, const Plan &p, const T *xc, const T *gates, const void *merge, int merge_bf16,
             T *yc, float *hid) {
    ImgGeom q;
    size_t smem;
    img_geom<T>(p, false, false, q, smem);
    auto k = gspn_fwd_img_kernel<T>;
    set_smem(k, smem);
    k<<<p.B, (DIRS * q.L + 31) / 32 * 32, smem, c->stream>>>(xc, gates, merge, merge_bf16, yc, hid,
                                                            p.plane, q);
    CUDA_CHECK_LAUNCH();
}

template <typename T>
void bwd_img(CudaCtx *c, const Plan &p, const T *dyc, const T *xc, const T *gates, const float *hid,
             const void *merge, int merge_bf16, T *dxc, T *dgates, double *dmpart, bool write) {
    ImgGeom q;
    size_t smem;
    img_geom<T>(p, true, dgates != nullptr, q, smem);
    auto k = gspn_bwd_img_kernel<T>;
    set_smem(k, smem);
    k<<<p.B, (DIRS * q.L + 31) / 32 * 32, smem, c->stream>>>(dyc, xc, gates, hid, merge, merge_bf16, dxc,
                                                            dgates, dmpart, p.plane, write ? 1 : 0, q);
    CUDA_CHECK_LAUNCH();
}

#define GSPN_IMG_INSTANCES(T)                                                                  \
    template bool img_fits<T>(const Plan &, bool, bool, const void *const *, int);               \
    template void fwd_img<T>(CudaCtx *, const Plan &, const T *, const T *, const void *, int, T *, \
                             float *);                                                           \
    template void bwd_img<T>(CudaCtx *, const Plan &, const T *, const T *, const T *, const float *, \
                             const void *, int, T *, T *, double *, bool);
GSPN_IMG_INSTANCES(float)
GSPN_IMG_INSTANCES(__nv_bfloat16)
#undef GSPN_IMG_INSTANCES

}  // namespace gspn
