// C-GSPN propagation on the GPU (kernels/cuda/gspn_scan.cu) against the CPU reference
// (kernels/cpu/gspn_scan.c): forward (yc, hidden) and backward (dxc, dgates, dmerge), fp32 and
// bf16, per-channel and shared weights, on shapes that hit the edges of the kernels' tiling:
// H != W, H = 1, W = 1, W not a multiple of 32, Cc in {1, 3, 64} (vector and scalar paths); and
// gspn_scan_proj_fwd against linear_fwd then gspn_scan_fwd on the GPU.
#include "gpulib.h"

enum { DIRS = 4 };

// kernels/cuda/gspn_scan.cu: the ops with another tuning (the benchmark sweeps these); the
// default entry points use cg_bytes = 0 (auto), stages = 0, prefetch = 0 (dir_mask 15 = all four
// directions).
void cuda_gspn_scan_fwd_tuned(Ctx *ctx, const Tensor *xc, const Tensor *gates,
                              const Tensor *merge, int shared_w, Tensor *yc, Tensor *hidden,
                              int cg_bytes, int vec_bytes, int stages, int prefetch,
                              int dir_mask);
void cuda_gspn_scan_bwd_tuned(Ctx *ctx, const Tensor *dyc, const Tensor *xc, const Tensor *gates,
                              const Tensor *merge, int shared_w, const Tensor *hidden,
                              Tensor *dxc, Tensor *dgates, Tensor *dmerge, int cg_bytes,
                              int vec_bytes, int stages, int prefetch, int dir_mask, int write);
// (cg_bytes, vec_bytes, stages, prefetch): cg_bytes 0 = chosen by the kernel; stages 0 = the pipelined kernels at their chosen
// depth, 1 = the simple kernels (also what shared weights and odd Cc use), 2..4 = a fixed depth;
// prefetch = L2 prefetch distance (it cannot change results; run to cover its addressing).
static const int TUNINGS[][4] = {{0, 0, 0, 0},   {16, 16, 0, 0}, {64, 16, 0, 3}, {32, 8, 0, 1},
                                 {16, 8, 0, 2},  {32, 16, 1, 0}, {32, 8, 1, 0},  {32, 16, 2, 4},
                                 {16, 8, 3, 0},  {32, 16, 4, 1}, {64, 8, 0, 0},  {64, 8, 2, 1}};

// fp32: the GPU computes the same fp32 operations as the CPU in another order (FMA contraction,
// fixed-order reductions in other groupings), ~1e-7 per operation on values of order 1 over
// contractive scans; 1e-5 relative (norm-wise, per tensor) is far below what a wrong index,
// neighbour or direction gives (order 1e-1 and up).
#define FP32_TOL 1e-5
// bf16 activations (inputs rounded to bf16 for both sides, so only the GPU's outputs differ):
// - hidden is fp32 state computed from identical inputs: fp32-level agreement, but with the
//   fast sigmoid (__expf, rcp) of the bf16 path: 1e-5 relative per weight -> 5e-5.
#define BF16_HIDDEN_TOL 5e-5
// - yc: each direction's y_d is rounded to bf16 (2^-9 relative) before the merge, then the sum
//   once more: a few 2^-9 in the worst element, ~3e-3 norm-wise -> 1e-2.
#define BF16_YC_TOL 1e-2
// - dxc: lam_d dh_d rounded to bf16 per direction, then dxc (+=) rounded: as yc -> 1e-2.
// - dgates: one rounding of (old + gradient) to bf16, plus the fast sigmoid: -> 1e-2.
#define BF16_GRAD_TOL 1e-2
// - dmerge stays fp32 (a parameter gradient), summed in fp64 from identical bf16 inputs and the
//   fp32 h: fp32-level -> 5e-5 like hidden.
#define BF16_DMERGE_TOL 5e-5

typedef struct Shape {
    int B, H, W, Cc;
} Shape;

static const Shape SHAPES[] = {
    {2, 5, 37, 3},    // H != W, W not a multiple of 32, Cc = 3 (scalar path)
    {1, 1, 33, 64},   // H = 1: TB/BT are one step, LR/RL have a single lane
    {2, 7, 1, 1},     // W = 1, Cc = 1
    {1, 9, 70, 64},   // W > 64 lanes, vector path (fp32 4-wide, bf16 8-wide)
    {2, 23, 6, 64},   // H > W
    {3, 12, 45, 8},   // Cc = 8: one 16-byte vector per token in bf16
    {1, 1, 1, 3},     // a single token
};
#define NSHAPES ((int)(sizeof SHAPES / sizeof SHAPES[0]))

static int gate_width(int Cc, int shared_w) { return shared_w ? 4 * (2 * Cc + 3) : 20 * Cc; }

// A GPU tensor of dtype dt with the CPU tensor's values; for bf16 the CPU tensor is rounded in
// place first, so both sides compute from the same inputs.
static Tensor *gpu_from(Ctx *ctx, Tensor *cpu, DType dt) {
    if (dt == DTYPE_BF16) gpu_test_round_to_bf16(cpu);
    return gpu_test_upload(ctx, cpu, dt);
}

// An uninitialised GPU tensor filled with NaN bytes, so an element the kernel forgets shows.
static Tensor *gpu_poisoned(int ndim, const int *shape, DType dt) {
    Tensor *g = calloc(1, sizeof(Tensor));
    tensor_set_shape(g, ndim, shape);
    g->dtype = dt;
    g->device = DEVICE_CUDA;
    g->data = cuda_malloc(tensor_bytes(g));
    gpu_test_memset(g->data, 0xff, tensor_bytes(g));
    CUDA_CHECK(cudaDeviceSynchronize());   // the context's streams do not wait for stream 0
    return g;
}

// Relative error of a GPU tensor against a CPU one; NaN anywhere fails.
static double err_vs(Ctx *ctx, const Tensor *gpu, const Tensor *cpu) {
    float *h = tensor_to_host_f32(ctx, gpu);
    double e = test_rel_err(h, tensor_f32(cpu), cpu->numel);
    for (size_t i = 0; i < cpu->numel; i++)
        if (isnan(h[i])) e = INFINITY;
    free(h);
    return e;
}

typedef struct Tols {
    double yc, hidden, dxc, dgates, dmerge;
} Tols;
static const Tols FP32_TOLS = {FP32_TOL, FP32_TOL, FP32_TOL, FP32_TOL, FP32_TOL};
static const Tols BF16_TOLS = {BF16_YC_TOL, BF16_HIDDEN_TOL, BF16_GRAD_TOL, BF16_GRAD_TOL, BF16_DMERGE_TOL};

// One shape, one dtype, one weight variant: forward and backward against the CPU, the backward
// adding with hidden saved, and writing with hidden saved and recomputed (NULL; the on-chip path
// takes only the writing op). Returns the number of failed comparisons.
static int check_case(Ctx *g, const Shape *s, int shared_w, DType dt, const Tols *tol,
                      uint64_t seed, int tuning) {
    const int cgb = TUNINGS[tuning][0], vb = TUNINGS[tuning][1], st = TUNINGS[tuning][2],
              pf = TUNINGS[tuning][3];
    const int G = gate_width(s->Cc, shared_w);
    Tensor *xc = test_tensor(4, s->B, s->H, s->W, s->Cc);
    Tensor *gates = test_tensor(4, s->B, s->H, s->W, G);
    Tensor *merge = test_tensor(1, DIRS);
    Tensor *dyc = test_tensor(4, s->B, s->H, s->W, s->Cc);
    Tensor *yc = test_like(xc), *hidden = test_tensor(5, DIRS, s->B, s->H, s->W, s->Cc);
    // Gradients start non-zero: backward must add to them.
    Tensor *dxc = test_like(xc), *dgates = test_like(gates), *dmerge = test_like(merge);
    test_fill(xc, seed + 1, -1.0f, 1.0f);
    test_fill(gates, seed + 2, -2.0f, 2.0f);
    test_fill(merge, seed + 3, -1.0f, 1.0f);
    test_fill(dyc, seed + 4, -1.0f, 1.0f);
    test_fill(dxc, seed + 5, -1.0f, 1.0f);
    test_fill(dgates, seed + 6, -1.0f, 1.0f);
    test_fill(dmerge, seed + 7, -1.0f, 1.0f);

    // GPU copies (rounding the CPU inputs to bf16 where the GPU runs bf16).
    Tensor *gx = gpu_from(g, xc, dt), *gg = gpu_from(g, gates, dt);
    Tensor *gm = gpu_from(g, merge, DTYPE_F32), *gdy = gpu_from(g, dyc, dt);
    Tensor *gdx = gpu_from(g, dxc, dt), *gdg = gpu_from(g, dgates, dt);
    Tensor *gdm = gpu_from(g, dmerge, DTYPE_F32);
    // gspn_scan_bwd with GSPN_SCAN_WRITE_GRADS, with hidden and without (h recomputed): dxc and
    // dgates start as NaN (every element must be written), dmerge from the same values (it still
    // accumulates).
    Tensor *gdxw = gpu_poisoned(4, xc->shape, dt), *gdgw = gpu_poisoned(4, gates->shape, dt);
    Tensor *gdmw = gpu_from(g, dmerge, DTYPE_F32);
    Tensor *gdx2 = gpu_poisoned(4, xc->shape, dt), *gdg2 = gpu_poisoned(4, gates->shape, dt);
    Tensor *gdm2 = gpu_from(g, dmerge, DTYPE_F32);
    Tensor *dxcw = test_like(xc), *dgw = test_like(gates), *dmw = test_like(merge);
    memcpy(dmw->data, dmerge->data, tensor_bytes(dmerge));
    test_fill(dxcw, seed + 8, -1.0f, 1.0f);   // the CPU op must ignore these too
    test_fill(dgw, seed + 9, -1.0f, 1.0f);
    Tensor *gy = gpu_poisoned(4, xc->shape, dt), *gy2 = gpu_poisoned(4, xc->shape, dt);
    Tensor *gh = gpu_poisoned(5, hidden->shape, DTYPE_F32);

    Ctx c = ctx_cpu();
    cpu_gspn_scan_fwd(&c, xc, gates, merge, shared_w, yc, hidden);
    cpu_gspn_scan_bwd(&c, dyc, xc, gates, merge, shared_w, hidden, 0, dxc, dgates, dmerge);
    cpu_gspn_scan_bwd(&c, dyc, xc, gates, merge, shared_w, hidden, GSPN_SCAN_WRITE_GRADS, dxcw, dgw, dmw);

    if (tuning == 0) {   // the entry points of ops.h
        cuda_gspn_scan_fwd(g, gx, gg, gm, shared_w, gy, gh);
        cuda_gspn_scan_fwd(g, gx, gg, gm, shared_w, gy2, NULL);
        cuda_gspn_scan_bwd(g, gdy, gx, gg, gm, shared_w, gh, 0, gdx, gdg, gdm);
        cuda_gspn_scan_bwd(g, gdy, gx, gg, gm, shared_w, NULL, GSPN_SCAN_WRITE_GRADS, gdx2, gdg2, gdm2);
        cuda_gspn_scan_bwd(g, gdy, gx, gg, gm, shared_w, gh, GSPN_SCAN_WRITE_GRADS, gdxw, gdgw, gdmw);
    } else {
        cuda_gspn_scan_fwd_tuned(g, gx, gg, gm, shared_w, gy, gh, cgb, vb, st, pf, 15);
        cuda_gspn_scan_fwd_tuned(g, gx, gg, gm, shared_w, gy2, NULL, cgb, vb, st, pf, 15);
        cuda_gspn_scan_bwd_tuned(g, gdy, gx, gg, gm, shared_w, gh, gdx, gdg, gdm, cgb, vb, st, pf,
                                 15, 0);
        cuda_gspn_scan_bwd_tuned(g, gdy, gx, gg, gm, shared_w, NULL, gdx2, gdg2, gdm2, cgb, vb,
                                 st, pf, 15, 1);
        cuda_gspn_scan_bwd_tuned(g, gdy, gx, gg, gm, shared_w, gh, gdxw, gdgw, gdmw, cgb, vb, st,
                                 pf, 15, 1);
    }
    CUDA_CHECK(cudaDeviceSynchronize());

    const struct {
        const char *name;
        const Tensor *gpu, *cpu;
        double tol;
    } cmp[] = {
        {"yc", gy, yc, tol->yc},           {"yc (no hidden)", gy2, yc, tol->yc},
        {"hidden", gh, hidden, tol->hidden}, {"dxc", gdx, dxc, tol->dxc},
        {"dgates", gdg, dgates, tol->dgates}, {"dmerge", gdm, dmerge, tol->dmerge},
        {"dxc (write, recompute)", gdx2, dxcw, tol->dxc},
        {"dgates (write, recompute)", gdg2, dgw, tol->dgates},
        {"dmerge (write, recompute)", gdm2, dmw, tol->dmerge},
        {"dxc (write)", gdxw, dxcw, tol->dxc}, {"dgates (write)", gdgw, dgw, tol->dgates},
        {"dmerge (write)", gdmw, dmw, tol->dmerge},
    };
    int fails = 0;
    printf("    %dx%dx%dx%d %s %s", s->B, s->H, s->W, s->Cc, dtype_name(dt),
           shared_w ? "shared" : "per-channel");
    if (tuning) printf(" cg=%d v=%d D=%d P=%d", cgb, vb, st, pf);
    printf(":");
    for (size_t i = 0; i < sizeof cmp / sizeof cmp[0]; i++) {
        const double e = err_vs(g, cmp[i].gpu, cmp[i].cpu);
        const int bad = !(e <= cmp[i].tol);
        fails += bad;
        if (i < 6 || bad) printf(" %s %.1e%s", cmp[i].name, e, bad ? " FAIL" : "");
    }
    printf("\n");

    Tensor *cpu_all[] = {xc, gates, merge, dyc, yc, hidden, dxc, dgates, dmerge, dxcw, dgw, dmw};
    for (size_t i = 0; i < sizeof cpu_all / sizeof cpu_all[0]; i++) test_tensor_free(cpu_all[i]);
    Tensor *gpu_all[] = {gx, gg, gm, gdy, gdx, gdg, gdm, gdx2, gdg2, gdm2, gy, gy2, gh,
                         gdxw, gdgw, gdmw};
    for (size_t i = 0; i < sizeof gpu_all / sizeof gpu_all[0]; i++) gpu_test_free(gpu_all[i]);
    return fails;
}

static void run_all_shapes(int shared_w, DType dt) {
    GPU_TEST_REQUIRE_DEVICE();
    Ctx g = cuda_ctx_create(0, dt);
    int fails = 0;
    for (int i = 0; i < NSHAPES; i++)
        fails += check_case(&g, &SHAPES[i], shared_w, dt, dt == DTYPE_BF16 ? &BF16_TOLS : &FP32_TOLS,
                            1000 + 17 * (uint64_t)i, 0);
    cuda_ctx_destroy(&g);
    assert_int_equal(fails, 0);
}

// Every shape in fp32 and in bf16 with the default tuning: with shared weights only (variants 1)
// or per-channel then shared (variants 2); case seed = seed + step * shape + variant. Returns the
// number of failed comparisons.
static int check_shapes_both_dtypes(const Shape *shapes, int n, int variants, uint64_t seed, int step) {
    int fails = 0;
    for (int dti = 0; dti < 2; dti++) {
        const DType dt = dti ? DTYPE_BF16 : DTYPE_F32;
        Ctx g = cuda_ctx_create(0, dt);
        for (int i = 0; i < n; i++)
            for (int v = 0; v < variants; v++) {
                const int sh = variants == 1 ? 1 : v;
                fails += check_case(&g, &shapes[i], sh, dt, dti ? &BF16_TOLS : &FP32_TOLS,
                                    seed + step * i + v, 0);
            }
        cuda_ctx_destroy(&g);
    }
    return fails;
}

static void test_gspn_gpu_fp32_per_channel_matches_cpu(void **state) {
    run_all_shapes(0, DTYPE_F32);
}
static void test_gspn_gpu_fp32_shared_w_matches_cpu(void **state) { run_all_shapes(1, DTYPE_F32); }
static void test_gspn_gpu_bf16_per_channel_matches_cpu(void **state) {
    run_all_shapes(0, DTYPE_BF16);
}
static void test_gspn_gpu_bf16_shared_w_matches_cpu(void **state) { run_all_shapes(1, DTYPE_BF16); }

// Larger than the edge cases: the benchmark's latent block at 27x27 and a 74-lane line, where a
// block's lanes exceed one warp many times and TB/LR blocks differ in size; and a 600-lane line,
// where the staged shared-weight backward (512 threads) gives a thread two lanes.
static void test_gspn_gpu_latent_sizes_match_cpu(void **state) {
    GPU_TEST_REQUIRE_DEVICE();
    // small: smaller cases of the same kinds (lanes over one warp, unequal TB/LR blocks, two lanes
    // per thread in the 600-lane line)
    const Shape full[] = {{2, 27, 27, 64}, {1, 74, 31, 64}, {1, 5, 600, 8}};
    const Shape small[] = {{1, 9, 40, 16}, {1, 40, 3, 8}, {1, 2, 600, 8}};
    assert_int_equal(check_shapes_both_dtypes(gpu_test_small() ? small : full, 3, 2, 77, 5), 0);
}

// Shared weights on images that fit on chip (kernels/cuda/gspn_scan_image.cu, sm_90: a cluster of
// two blocks per image, lines of at most 64 lanes, 1, 2 or 4 channels): gspn_hier's 56 x 56 (bf16;
// fp32 forward only), 28 x 28, 14 x 14 and 7 x 7 latents (Cc = 2), H != W both ways, one row, one
// column, Cc = 1 and 4, and lines of 32 and 64 lanes (two lanes a thread; odd lines leave a
// thread's second lane idle); the accumulating backward (flags 0) takes the staged kernels; past the chip,
// Cc = 1 on 67-lane lines with an odd element count (the lane kernel's last bf16 xc word covers 2
// bytes past the tensor; LR/RL runs of 4 tokens, the last one short).
static void test_gspn_gpu_shared_w_images_on_chip_match_cpu(void **state) {
    GPU_TEST_REQUIRE_DEVICE();
    const Shape shapes[] = {{3, 14, 14, 2}, {2, 7, 7, 2},  {2, 28, 28, 2}, {2, 13, 9, 2},
                            {2, 6, 11, 1},  {1, 32, 17, 4}, {2, 1, 6, 2},  {2, 9, 1, 2},
                            {2, 56, 56, 2}, {1, 64, 37, 2}, {1, 33, 50, 1}, {1, 3, 67, 1}};
    assert_int_equal(check_shapes_both_dtypes(shapes, 12, 1, 500, 11), 0);
}

// Shared weights past 256 lanes. At Cc of 1 and 2 LR and RL take runs of a lane's tokens, forward
// (gspn_fwd_lane_rows_kernel: 8 / Cc) and, where dgates is written, backward
// (gspn_bwd_lane_rows_kernel: 8 at Cc = 1 in bf16, 4 or 2 otherwise), both in bf16 on sm_90 each
// line over a cluster of two blocks (513 lanes as 257 and 256), TB and BT the lane kernels;
// at Cc of 4 and 8 the forward takes the lane kernel, each line over a cluster of two blocks on
// sm_90 where there are fewer lines than SMs (301 lanes: 151 and 150), and the backward the staged
// kernels. Runs whole and a line's last short one (19 steps
// = 8 + 8 + 3, 10 = 4 + 4 + 2, 290 = 36 x 8 + 2), lines of 300, 260 and 513 lanes, an odd element
// count (the last bf16 xc word reaches past the tensor), and long TB / BT lines beside short LR /
// RL ones.
static void test_gspn_gpu_shared_w_long_rows_match_cpu(void **state) {
    GPU_TEST_REQUIRE_DEVICE();
    const Shape shapes[] = {{1, 300, 19, 1}, {2, 260, 10, 2}, {1, 513, 9, 1}, {1, 270, 301, 2},
                            {2, 20, 290, 1}, {1, 301, 19, 8}, {2, 260, 7, 4}};
    assert_int_equal(check_shapes_both_dtypes(shapes, 7, 1, 900, 13), 0);
}

// The other tunings (channels per block, load width) compute the same function.
static void test_gspn_gpu_tunings_match_cpu(void **state) {
    GPU_TEST_REQUIRE_DEVICE();
    // small: the 150-lane line shortened to 70 (still over 64 lanes), one image
    const Shape shapes[] = {{2, 13, 37, 64}, {1, 6, 5, 24}, {2, 3, 9, 3}, {1, 5, 150, 64}};
    const Shape small[] = {{1, 5, 37, 64}, {1, 6, 5, 24}, {1, 3, 9, 3}, {1, 2, 70, 64}};
    const Shape *use = gpu_test_small() ? small : shapes;
    const int ntun = (int)(sizeof TUNINGS / sizeof TUNINGS[0]);
    int fails = 0;
    for (int dti = 0; dti < 2; dti++) {
        const DType dt = dti ? DTYPE_BF16 : DTYPE_F32;
        Ctx g = cuda_ctx_create(0, dt);
        for (int i = 0; i < 4; i++)
            for (int t = 1; t < ntun; t++)
                fails += check_case(&g, &use[i], 0, dt, dti ? &BF16_TOLS : &FP32_TOLS, 300 + 7 * i + t, t);
        cuda_ctx_destroy(&g);
    }
    assert_int_equal(fails, 0);
}

// gspn_scan_proj_fwd equals linear_fwd into the gates, then gspn_scan_fwd without hidden, to the
// bit (the on-chip kernels make each gate by linear_fwd's narrow formula and rounding), fp32 and
// bf16: gspn_hier's four latents, an odd grid, no gate bias, Cc of 1 and 4, and past the chip (a
// 70-lane line, per-channel weights: the two ops themselves). yc starts as NaN bytes.
static void test_gspn_gpu_scan_proj_equals_the_two_ops(void **state) {
    GPU_TEST_REQUIRE_DEVICE();
    const Shape shapes[] = {{2, 56, 56, 2}, {3, 28, 28, 2}, {4, 14, 14, 2}, {5, 7, 7, 2},
                            {2, 13, 9, 2},  {2, 11, 6, 1},  {1, 13, 10, 4}, {2, 9, 70, 2}, {2, 6, 5, 3}};
    const int nshapes = (int)(sizeof shapes / sizeof shapes[0]);
    int fails = 0;
    for (int dti = 0; dti < 2; dti++) {
        const DType dt = dti ? DTYPE_BF16 : DTYPE_F32;
        Ctx g = cuda_ctx_create(0, dt);
        for (int i = 0; i < nshapes; i++) {
            const Shape *s = &shapes[i];
            const int shared_w = i < nshapes - 1, G = gate_width(s->Cc, shared_w), bias = i != 4;
            Tensor *xc = test_tensor(4, s->B, s->H, s->W, s->Cc), *gw = test_tensor(2, G, s->Cc);
            Tensor *gb = test_tensor(1, G), *merge = test_tensor(1, DIRS);
            test_fill(xc, 700 + i, -1.0f, 1.0f);
            test_fill(gw, 710 + i, -1.0f, 1.0f);
            test_fill(gb, 720 + i, -1.0f, 1.0f);
            test_fill(merge, 730 + i, -1.0f, 1.0f);
            Tensor *gx = gpu_from(&g, xc, dt), *gwd = gpu_from(&g, gw, dt), *gbd = gpu_from(&g, gb, dt);
            Tensor *gm = gpu_from(&g, merge, DTYPE_F32);
            Tensor *gates = gpu_poisoned(4, (int[]){s->B, s->H, s->W, G}, dt);
            Tensor *y2 = gpu_poisoned(4, xc->shape, dt), *y1 = gpu_poisoned(4, xc->shape, dt);
            cuda_linear_fwd(&g, gx, gwd, bias ? gbd : NULL, NULL, gates);
            cuda_gspn_scan_fwd(&g, gx, gates, gm, shared_w, y2, NULL);
            cuda_gspn_scan_proj_fwd(&g, gx, gwd, bias ? gbd : NULL, gm, shared_w, y1);
            float *h1 = tensor_to_host_f32(&g, y1), *h2 = tensor_to_host_f32(&g, y2);
            size_t off = 0;
            for (size_t e = 0; e < xc->numel; e++) off += memcmp(&h1[e], &h2[e], sizeof(float)) != 0 || isnan(h1[e]);
            if (off) {
                printf("  %s (%d,%d,%d,%d)%s: %zu of %zu yc elements differ from the two ops\n",
                       dti ? "bf16" : "fp32", s->B, s->H, s->W, s->Cc, shared_w ? " shared" : "", off, xc->numel);
                fails++;
            }
            free(h1);
            free(h2);
            Tensor *cpu_all[] = {xc, gw, gb, merge};
            for (size_t k = 0; k < sizeof cpu_all / sizeof cpu_all[0]; k++) test_tensor_free(cpu_all[k]);
            Tensor *gpu_all[] = {gx, gwd, gbd, gm, gates, y1, y2};
            for (size_t k = 0; k < sizeof gpu_all / sizeof gpu_all[0]; k++) gpu_test_free(gpu_all[k]);
        }
        cuda_ctx_destroy(&g);
    }
    assert_int_equal(fails, 0);
}

// Two backward calls on the same inputs give bitwise the same gradients: no float atomics, all
// reductions in a fixed order. The second shape with shared weights takes the on-chip image path
// (the writing op; the accumulating one takes the staged kernels, as per-channel weights do).
static void test_gspn_gpu_backward_is_bitwise_deterministic(void **state) {
    GPU_TEST_REQUIRE_DEVICE();
    Ctx g = cuda_ctx_create(0, DTYPE_BF16);
    const Shape shapes[] = {{4, 19, 41, 64}, {4, 14, 14, 2}};
    for (int case_i = 0; case_i < 4; case_i++) {
        const Shape s = shapes[case_i / 2];
        const int shared_w = case_i % 2;
        const int G = gate_width(s.Cc, shared_w);
        Tensor *xc = test_tensor(4, s.B, s.H, s.W, s.Cc), *gates = test_tensor(4, s.B, s.H, s.W, G);
        Tensor *merge = test_tensor(1, DIRS), *dyc = test_like(xc);
        Tensor *zx = test_like(xc), *zg = test_like(gates), *zm = test_like(merge);
        test_fill(xc, 1, -1, 1);
        test_fill(gates, 2, -2, 2);
        test_fill(merge, 3, -1, 1);
        test_fill(dyc, 4, -1, 1);
        Tensor *gx = gpu_from(&g, xc, DTYPE_F32), *gg = gpu_from(&g, gates, DTYPE_F32);
        Tensor *gm = gpu_from(&g, merge, DTYPE_F32), *gdy = gpu_from(&g, dyc, DTYPE_F32);
        Tensor *gh = gpu_poisoned(5, (int[]){DIRS, s.B, s.H, s.W, s.Cc}, DTYPE_F32);
        Tensor *gy = gpu_poisoned(4, xc->shape, DTYPE_F32);
        cuda_gspn_scan_fwd(&g, gx, gg, gm, shared_w, gy, gh);
        float *out[2][3];
        for (int run = 0; run < 2; run++) {
            Tensor *dx = gpu_from(&g, zx, DTYPE_F32), *dg = gpu_from(&g, zg, DTYPE_F32);
            Tensor *dm = gpu_from(&g, zm, DTYPE_F32);
            cuda_gspn_scan_bwd(&g, gdy, gx, gg, gm, shared_w, gh, shared_w ? GSPN_SCAN_WRITE_GRADS : 0,
                               dx, dg, dm);
            out[run][0] = tensor_to_host_f32(&g, dx);
            out[run][1] = tensor_to_host_f32(&g, dg);
            out[run][2] = tensor_to_host_f32(&g, dm);
            gpu_test_free(dx);
            gpu_test_free(dg);
            gpu_test_free(dm);
        }
        const size_t n[3] = {xc->numel, gates->numel, DIRS};
        for (int k = 0; k < 3; k++) {
            assert_memory_equal(out[0][k], out[1][k], n[k] * sizeof(float));
            free(out[0][k]);
            free(out[1][k]);
        }
        Tensor *cpu_all[] = {xc, gates, merge, dyc, zx, zg, zm};
        for (size_t i = 0; i < sizeof cpu_all / sizeof cpu_all[0]; i++) test_tensor_free(cpu_all[i]);
        Tensor *gpu_all[] = {gx, gg, gm, gdy, gh, gy};
        for (size_t i = 0; i < sizeof gpu_all / sizeof gpu_all[0]; i++) gpu_test_free(gpu_all[i]);
    }
    cuda_ctx_destroy(&g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gspn_gpu_fp32_per_channel_matches_cpu),
        cmocka_unit_test(test_gspn_gpu_fp32_shared_w_matches_cpu),
        cmocka_unit_test(test_gspn_gpu_bf16_per_channel_matches_cpu),
        cmocka_unit_test(test_gspn_gpu_bf16_shared_w_matches_cpu),
        cmocka_unit_test(test_gspn_gpu_latent_sizes_match_cpu),
        cmocka_unit_test(test_gspn_gpu_shared_w_images_on_chip_match_cpu),
        cmocka_unit_test(test_gspn_gpu_shared_w_long_rows_match_cpu),
        cmocka_unit_test(test_gspn_gpu_tunings_match_cpu),
        cmocka_unit_test(test_gspn_gpu_scan_proj_equals_the_two_ops),
        cmocka_unit_test(test_gspn_gpu_backward_is_bitwise_deterministic),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
