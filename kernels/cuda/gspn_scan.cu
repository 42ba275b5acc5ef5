// C-GSPN propagation on the GPU (docs/design.md#cgspn-layer steps 3-5; contract in kernels/ops.h; the CPU
// reference is kernels/cpu/gspn_scan.c).
//
// Work split (both passes): a block owns one image b and a group of CG channels for ALL lanes of a
// line (the W columns of a row for TB/BT, the H rows of a column for LR/RL) and loops over the
// steps of the scan; a line's lanes depend on each other through the neighbour weights, so a line
// cannot be split across blocks without inter-block exchange. Channels-last makes each token's CG
// channels one contiguous run (32, 64 or 128 bytes), so loads are whole sectors.
//
// Five kernel families:
// - on-chip image (gspn_scan_image.cu; sm_90 and up, shared weights, Cc of 1, 2 or 4, lines of at
//   most 64 lanes, an image's slots within a block's shared memory, gradients written): a
//   CLUSTER of two blocks per image, a direction pair each, a warp per direction, runs the
//   scans from shared memory and registers, merges yc and forms dxc and dgates on chip; no
//   per-direction slices in memory. gspn_hier's 56^2 (bf16), 28^2, 14^2 and 7^2 stages take it.
// - pipelined (the fast path for per-channel weights: Cc a multiple of 4, 16-byte aligned data, a
//   line of at most 2048 (fwd, two items a thread) / 608 (bwd) work items): ONE launch for the
//   four directions, blockIdx.x = (image, channel group) * 4 + direction. Each thread owns one or
//   two (lane, 4 or 8 channels) items and copies their inputs for step s+D-1 into a shared-memory
//   stage with cp.async while it computes step s. The backward also stages h[s-1], which the two
//   neighbour lanes read after the step's barrier.
// - lane (shared weights past the chip: the forward at Cc of 1, 2, 4 or 8 on lines of at most
//   1024 lanes, the backward at Cc of 1 or 2 on lines of at most 256, and of at most 1024 where
//   dgates is written): ONE launch for the four directions, a thread per lane loading its own gate
//   chunk and xc (dyc, h) into registers a few steps ahead; the forward's LR/RL store a lane's
//   runs of neighbouring tokens at once. Past 256 lanes at Cc of 1 or 2, LR/RL load a lane's run
//   at once into shared memory (forward and backward: a launch of their own), and the backward
//   writes dgates direction-major to scratch, interleaved into (B, H, W, G) by one more pass. On
//   sm_90 lines go over a cluster of two blocks, the edge lanes' values passed through distributed
//   shared memory every step: LR/RL's runs in bf16, forward and backward (two blocks an SM), and
//   at Cc of 4 and 8 the forward lane kernel where a launch has fewer lines than SMs (Fig. 3:
//   16 x 4) (see gspn_fwd_lane_kernel, gspn_fwd_lane_rows_kernel, gspn_bwd_lane_kernel,
//   gspn_bwd_lane_rows_kernel and gspn_scan_notes.md).
// - staged shared-weight (gspn_shared_w = 1, a token's xc a whole number of 4-byte words; what
//   the lane kernels do not take): ONE launch for the four directions,
//   the direction's odd-offset gate chunk of every lane copied as 4-byte words, consecutive words
//   on consecutive threads (see gspn_fwd_sh_kernel).
// - simple (odd Cc, longer lines, too little shared memory, or stages = 1): one launch per
//   direction on the context's side streams (concurrent), loads issued at the top of each step.
// Forward step: h of the previous step lives in shared memory ((N+2) x CG floats with a zero halo
//   lane each side, double buffered: one barrier per step); the sigmoid and row-stochastic
//   normalization are computed in registers (the weights are never written); h (fp32) goes to
//   `hidden` and y_d = u_d h_d (fp32) to a scratch slice. An elementwise kernel then merges
//   yc = sum_d m_d y_d in the fixed order TB, BT, LR, RL: no atomics, yc is reproducible, and
//   rounded once to the activation dtype (as autocast's fp32 merge is; a bf16 y_d would round
//   four terms that may cancel, then their sum).
// Backward step (reverse scan): dL/dh of step s is m_d u dyc plus the transposed weights of step
//   s+1, which the block keeps in shared memory (w_{-1} dh and w_{+1} dh of every lane, double
//   buffered; w_0 dh stays with its owner). Gate gradients are added into dgates in place (each
//   element has one owner), or written without reading dgates (GSPN_SCAN_WRITE_GRADS, the tape's
//   case; the pipelined kernel then stages 7 slots per item instead of 12, so deeper pipelines
//   fit). dxc needs sum_d lam_d dh_d: each direction writes its own slice (fp32) and an
//   elementwise kernel adds them in the fixed order, rounding once; dmerge is reduced per block in fp64 and the
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
//   what this moves, forward: xc 4x2 + gates 40 + hidden 16 + y_d 4x4 (write, then read) + yc 2
//                                                                                        =  98
//   what must move, backward: dyc 2 + xc 2 + gates 40 + hidden 16 + dxc 2 + dgates 40   = 102
//     (+ dxc 2 + dgates 40 read back, since backward accumulates into them               = 144)
//   what this moves, backward: dyc 4x2 + xc 4x2 + gates 40 + hidden 16 + dgates 40 +
//     dxc_d 4x4 (write, then read) + dxc 2                    (GSPN_SCAN_WRITE_GRADS)    = 146
//     (gspn_scan_bwd accumulating: + dgates 40 + dxc 2 read back                         = 188)
// The extra reads of xc / dyc (one per direction) and the y_d / dxc_d round trip are the price of
// running the directions as separate scans without float atomics; the whole H x W plane of a
// channel group would have to stay on chip to avoid them, which it does not at 74^2 and up.
// Pairing scans does not help: TB reaches row i at step i, BT at step H-1-i, so whichever comes
// second needs the first one's y (or xc) for every row, i.e. the same round trip; only a scan
// that also writes the final yc saves bytes, and that serializes directions. So even at the copy
// rate the forward reaches at most 60/98 = 61% and the writing backward 102/146 = 70% (the
// accumulating one 144/188 = 77% counting the += reads) of the copy bandwidth on the bytes that
// must move (gspn_scan_notes.md; with bf16 slices it was 73%, 78% and 84%, at the price of the
// double rounding).
//
// hidden: the forward saves h (fp32) when given `hidden`; the backward recomputes it into scratch
// when called with hidden == NULL (a second forward scan: 42 bytes read and 16 written per element
// instead of 16 read, so saving is the fast path and recompute the memory-saving one).
//
// Files: gspn_scan_common.cuh (what the passes share), gspn_scan_fwd.cu and gspn_scan_bwd.cu
// (each pass's kernels, launches and entry), gspn_proj.cu (gspn_scan_proj_fwd: the gates made
// from xc on chip; outside libcgspn.so, which has no linear ops), and this one: the plan of a
// call (tuning, channel groups, geometry, shared memory, pipeline depth) and the C entry points.
#include "gspn_scan_common.cuh"
#include "../gspn_scan_shape.h"

namespace gspn {
namespace {

bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

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

}  // namespace

void check_like(const char *op, const char *name, const Tensor *t, const char *ref_name, const Tensor *ref) {
    if (!t) return;
    gspn_scan_check_like(op, name, t, ref_name, ref);
    CG_CHECK(t->device == DEVICE_CUDA, "", "op %s (CUDA): %s is not on the GPU", op, name);
    CG_CHECK(t->dtype == ref->dtype, "", "op %s (CUDA): %s is %s, %s %s", op, name,
             dtype_name(t->dtype), ref_name, dtype_name(ref->dtype));
}

void check_hidden(const char *op, const Tensor *hidden, long long plane) {
    gspn_scan_check_hidden(op, hidden, (size_t)plane);
    CG_CHECK(!hidden || hidden->device == DEVICE_CUDA, "", "op %s (CUDA): hidden is not on the GPU", op);
}

// The shared rules first (kernels/gspn_scan_shape.h), then the CUDA op's: every tensor on the
// GPU, gates in xc's dtype, grids within the launch limits.
Plan make_plan(const char *op, const Tensor *xc, const Tensor *gates, const Tensor *merge, int shared_w,
               Tuning tu, bool bwd, const void *const *ptrs, int nptrs) {
    const GspnScanDims d = gspn_scan_dims(op, xc, gates, merge, shared_w);
    CG_CHECK(xc->device == DEVICE_CUDA && gates->device == DEVICE_CUDA && merge->device == DEVICE_CUDA,
             "", "op %s (CUDA): xc, gates and merge must be on the GPU", op);
    CG_CHECK(gates->dtype == xc->dtype, "", "op %s (CUDA): gates are %s, xc is %s", op,
             dtype_name(gates->dtype), dtype_name(xc->dtype));
    CG_CHECK(d.H <= 65535 && d.W <= 65535, "", "op %s (CUDA): grid %dx%d too large", op, d.H, d.W);
    Plan p{};
    p.B = d.B;
    p.H = d.H;
    p.W = d.W;
    p.Cc = d.Cc;
    p.shared = shared_w != 0;
    p.block = d.block;
    p.G = d.G;
    p.bf16 = xc->dtype == DTYPE_BF16;
    p.plane = (long long)d.plane;

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

size_t smem_limit() {
    int dev = 0, v = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    return (size_t)v;
}

int ew_blocks(long long nvec, const CudaCtx *c) {
    long long want = (nvec + EW_THREADS - 1) / EW_THREADS;
    long long cap = (long long)c->sm_count * 16;
    if (want > cap) want = cap;
    return want < 1 ? 1 : (int)want;
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

// Scratch in the stream-ordered pool, kept by the pool between calls (no cudaMalloc per call;
// cuda_ctx_create sets the pool to keep what it reserves).
void *scratch_alloc(CudaCtx *c, size_t bytes) {
    void *ptr = nullptr;
    CUDA_CHECK(cudaMallocAsync(&ptr, bytes ? bytes : 16, c->stream));
    return ptr;
}

}  // namespace gspn

extern "C" void cuda_gspn_scan_fwd(Ctx *ctx, const Tensor *xc, const Tensor *gates,
                                   const Tensor *merge, int shared_w, Tensor *yc, Tensor *hidden) {
    gspn::gspn_fwd_impl(ctx, xc, gates, merge, shared_w, yc, hidden, gspn::TUNING_DEFAULT);
}

// GSPN_SCAN_WRITE_GRADS: dxc and dgates written, dgates never read back or zeroed.
extern "C" void cuda_gspn_scan_bwd(Ctx *ctx, const Tensor *dyc, const Tensor *xc,
                                   const Tensor *gates, const Tensor *merge, int shared_w,
                                   const Tensor *hidden, int flags, Tensor *dxc, Tensor *dgates,
                                   Tensor *dmerge) {
    gspn::gspn_bwd_impl(ctx, dyc, xc, gates, merge, shared_w, hidden, dxc, dgates, dmerge,
                        gspn::TUNING_DEFAULT, (flags & GSPN_SCAN_WRITE_GRADS) != 0);
}

// For the benchmark (bench/cuda/gspn_bench.cu): the same ops with another tuning.
extern "C" void cuda_gspn_scan_fwd_tuned(Ctx *ctx, const Tensor *xc, const Tensor *gates,
                                         const Tensor *merge, int shared_w, Tensor *yc,
                                         Tensor *hidden, int cg_bytes, int vec_bytes, int stages,
                                         int prefetch, int dir_mask) {
    gspn::gspn_fwd_impl(ctx, xc, gates, merge, shared_w, yc, hidden,
                  gspn::Tuning{cg_bytes, vec_bytes, stages, prefetch, dir_mask});
}
extern "C" void cuda_gspn_scan_bwd_tuned(Ctx *ctx, const Tensor *dyc, const Tensor *xc,
                                         const Tensor *gates, const Tensor *merge, int shared_w,
                                         const Tensor *hidden, Tensor *dxc, Tensor *dgates,
                                         Tensor *dmerge, int cg_bytes, int vec_bytes,
                                         int stages, int prefetch, int dir_mask, int write) {
    gspn::gspn_bwd_impl(ctx, dyc, xc, gates, merge, shared_w, hidden, dxc, dgates, dmerge,
                  gspn::Tuning{cg_bytes, vec_bytes, stages, prefetch, dir_mask}, write != 0);
}
