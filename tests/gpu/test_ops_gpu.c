// GPU tests of the CUDA ops against the CPU reference (kernels/cpu/): every case of
// bench/op_cases.c (every op of kernels/ops_list.h, forward and backward, on the shapes that reach
// each kernel path, fp32 and bf16) run on both backends from the same inputs, each result held
// to its case's tolerance, and run a second time on the GPU for the same bits. Then what a case
// cannot say: misaligned views, the bf16 GELU on every input, the fused dwconv input against the
// two ops it replaces, the stem's fused norm and GELU against the three ops, AdamW's decay runs
// (device arrays), and a backward called twice.
#include "gpulib.h"
#include "../../bench/op_harness.h"
#include <float.h>

// fp32: the same fp32 operations but for the order of sums and fused multiply-adds: a few ulps.
#define FP32_TOL 1e-5
// bf16 written once from fp32 math on the inputs the CPU also sees: half a bf16 ulp, 2^-8 = 3.9e-3
// of each value at most.
#define BF16_ROUNDED_TOL 4e-3
// bf16 accumulated twice: two roundings, the first carried into the second.
#define BF16_TWICE_TOL 8e-3
// A backward's dloss: not 1, so a missing dloss factor shows.
#define DLOSS 0.7f

// bf16 mode tolerances of the tests below, by tensor: fp32 tensors (statistics, parameter
// gradients, optimizer state) from the same bf16 values FP32_TOL; bf16 ones one or two roundings.
typedef struct { const char *name; double tol; } NamedTol;
static const NamedTol BF16_TOLS[] = {
    {"adamw.master", FP32_TOL},              // the fp32 update, as the CPU does it
    {"adamw.param", BF16_ROUNDED_TOL},       // the master rounded to bf16
    {"adamw.m", FP32_TOL},
    {"adamw.v", FP32_TOL},
    {"misaligned.accumulate.dst", BF16_ROUNDED_TOL},
    {"misaligned.layernorm_fwd.y", BF16_ROUNDED_TOL},
    {"twice.layernorm_bwd.dx", BF16_TWICE_TOL},
    {"twice.layernorm_bwd.dw", FP32_TOL},
    {"twice.resize_bilinear_bwd.dx", BF16_TWICE_TOL},
    {"twice.token_kl_bwd.ds", BF16_TWICE_TOL},
    {"twice.add_bcast_bwd.dp", FP32_TOL},
};

static const DType MODES[2] = {DTYPE_F32, DTYPE_BF16};

static Ctx G, H;   // the GPU context and the CPU (reference) one

static double tol_for(const char *name, DType mode) {
    if (mode == DTYPE_F32) return FP32_TOL;
    for (size_t i = 0; i < sizeof BF16_TOLS / sizeof BF16_TOLS[0]; i++)
        if (strcmp(BF16_TOLS[i].name, name) == 0) return BF16_TOLS[i].tol;
    fail_msg("no bf16 tolerance for %s in BF16_TOLS", name);
    return 0;
}

// ---- every op case ------------------------------------------------------------------------------

// One case in one mode: the CPU's forward, its activation results rounded as the GPU stores them,
// its backward; the GPU's phases; every result compared; then the GPU again from the same start,
// for the same bits. Returns the number of failed comparisons.
static int check_case(const OpCase *c, DType mode, uint64_t seed) {
    CaseTensors h, g;
    case_tensors_make(&h, c, &H, mode, seed, 0);
    case_tensors_make(&g, c, &G, mode, seed, 1);
    case_run(c, &h, PHASE_FWD);
    case_round_results(c, &h);
    case_run(c, &h, PHASE_BWD);
    case_run(c, &g, PHASE_BOTH);
    void *first[OPC_MAX_ARGS] = {0};
    int failed = 0;
    double worst = 0;
    for (int i = 0; i < c->nargs; i++) {
        const CaseArg *a = &c->arg[i];
        if (!g.t[i] || (a->role != ARG_OUT && a->role != ARG_ACC)) continue;
        float *got = case_download(&g, i);
        const double err = test_rel_err(got, tensor_f32(h.t[i]), h.t[i]->numel);
        const double tol = mode == DTYPE_F32 ? c->f32_tol : a->bf16_tol;
        free(got);
        if (!(err <= tol)) {
            printf("    %s %s: %s rel err %.2e above %.1e\n", c->title, dtype_name(mode), a->name,
                   err, tol);
            failed++;
        }
        if (tol > 0 && err / tol > worst) worst = err / tol;
        first[i] = malloc(tensor_bytes(g.t[i]) ? tensor_bytes(g.t[i]) : 1);
        tensor_download(&G, g.t[i], first[i]);
    }
    case_tensors_reset(&g, c);
    case_run(c, &g, PHASE_BOTH);
    int repeat = 1;
    for (int i = 0; i < c->nargs; i++) {
        if (!first[i]) continue;
        void *second = malloc(tensor_bytes(g.t[i]) ? tensor_bytes(g.t[i]) : 1);
        tensor_download(&G, g.t[i], second);
        if (memcmp(first[i], second, tensor_bytes(g.t[i])) != 0) {
            printf("    %s %s: %s differs from one run to the next\n", c->title, dtype_name(mode),
                   c->arg[i].name);
            repeat = 0;
            failed++;
        }
        free(first[i]);
        free(second);
    }
    printf("  %-72s %s worst %.2f of its tolerance%s\n", c->title, dtype_name(mode), worst,
           repeat ? ", the same bits twice" : "");
    case_tensors_free(&h);
    case_tensors_free(&g);
    return failed;
}

static void test_every_op_case_matches_cpu(void **state) {
    OpCaseList l = {0};
    op_cases_build(&l, CASES_TEST);
    int failed = 0, runs = 0;
    for (int k = 0; k < l.n; k++)
        for (int mi = 0; mi < 2; mi++) {
            const OpCase *c = &l.cases[k];
            if ((mi == 0 && (c->flags & CASE_NO_F32)) || (mi == 1 && (c->flags & CASE_NO_BF16)))
                continue;
            failed += check_case(c, MODES[mi], (uint64_t)k + 1);
            runs++;
        }
    printf("%d cases, %d runs, %d failed comparisons\n", l.n, runs, failed);
    op_cases_free(&l);
    assert_int_equal(failed, 0);
}

// ---- tensors that live for one test ---------------------------------------------------------------

#define MAX_KEPT 256
static Tensor *g_host[MAX_KEPT], *g_dev[MAX_KEPT];
static int g_nhost, g_ndev;

static Tensor *keep_host(Tensor *t) {
    assert_true(g_nhost < MAX_KEPT);
    return g_host[g_nhost++] = t;
}

static Tensor *keep_dev(Tensor *t) {
    assert_true(g_ndev < MAX_KEPT);
    return g_dev[g_ndev++] = t;
}

static void release_all(void) {
    for (int i = 0; i < g_nhost; i++) test_tensor_free(g_host[i]);
    for (int i = 0; i < g_ndev; i++) gpu_test_free(g_dev[i]);
    g_nhost = g_ndev = 0;
}

// A zeroed CPU fp32 tensor: HT(7, 1155).
static Tensor *host_new(int ndim, const int *shape) {
    Tensor *t = calloc(1, sizeof(Tensor));
    tensor_set_shape(t, ndim, shape);
    t->data = calloc(t->numel ? t->numel : 1, sizeof(float));
    t->dtype = DTYPE_F32;
    t->device = DEVICE_CPU;
    return keep_host(t);
}
#define HT(...) host_new((int)(sizeof((int[]){__VA_ARGS__}) / sizeof(int)), (int[]){__VA_ARGS__})

static Tensor *host_scalar(float v) {
    Tensor *t = HT(1);
    tensor_f32(t)[0] = v;
    return t;
}

// Fills t from seed in [lo, hi) and rounds it to bf16 when it goes to the GPU as bf16.
static Tensor *rnd(Tensor *t, uint64_t seed, float lo, float hi, DType dt) {
    test_fill(t, seed, lo, hi);
    if (dt == DTYPE_BF16) gpu_test_round_to_bf16(t);
    return t;
}

static Tensor *dev(const Tensor *h, DType dt) { return keep_dev(gpu_test_upload(&G, h, dt)); }

static Tensor *dev_zeros(const Tensor *h, DType dt) { return keep_dev(gpu_test_zeros(&G, h, dt)); }

// GPU result against the CPU reference, with the tolerance of `name` in `mode`.
static void check(const char *name, DType mode, const Tensor *gpu, const Tensor *cpu) {
    double err = gpu_test_compare(&G, name, gpu, cpu), tol = tol_for(name, mode);
    if (err > tol) printf("    ^ above the tolerance %.1e\n", tol);
    assert_true(err <= tol);
}

static void *download_raw(const Tensor *g) {
    void *p = malloc(tensor_bytes(g) ? tensor_bytes(g) : 1);
    tensor_download(&G, g, p);
    return p;
}

// g now holds the same bits as `first` (a download of an earlier run); frees `first`.
static void assert_same_bits(const char *what, const Tensor *g, void *first) {
    void *second = download_raw(g);
    bool same = memcmp(first, second, tensor_bytes(g)) == 0;
    printf("    %-36s %s run to run\n", what, same ? "bitwise equal" : "DIFFERENT");
    free(first);
    free(second);
    assert_true(same);
}

// ---- what a case cannot say ----------------------------------------------------------------------

// Views that start one element into their buffer: not 16-byte aligned, so the ops take their
// scalar paths even where the shape would allow vectors.
static Tensor misaligned_view(const Tensor *h, DType dt) {
    Tensor *big = HT((int)h->numel + 1);
    memcpy(tensor_f32(big) + 1, h->data, h->numel * sizeof(float));
    Tensor *gbig = dev(big, dt);
    Tensor v = *gbig;
    v.ndim = h->ndim;
    memcpy(v.shape, h->shape, sizeof v.shape);
    v.numel = h->numel;
    v.data = (char *)gbig->data + dtype_size(dt);
    return v;
}

static void test_misaligned_views_take_the_scalar_path_correctly(void **state) {
    for (int mi = 0; mi < 2; mi++) {
        DType dt = MODES[mi];
        printf("  %s\n", dtype_name(dt));
        Tensor *a = rnd(HT(9, 64), 1, -1, 3, dt), *d = rnd(HT(9, 64), 2, -1, 1, dt);
        Tensor ga = misaligned_view(a, dt), gd = misaligned_view(d, dt);
        cpu_accumulate(&H, a, d);
        cuda_accumulate(&G, &ga, &gd);
        check("misaligned.accumulate.dst", dt, &gd, d);
        Tensor *w = rnd(HT(64), 3, 0.5f, 1.5f, dt), *b = rnd(HT(64), 4, -0.5f, 0.5f, dt);
        Tensor *y = HT(9, 64), *mean = HT(9), *rstd = HT(9);
        Tensor gy = misaligned_view(y, dt);
        cpu_layernorm_fwd(&H, a, NULL, w, b, 1e-5f, NULL, y, mean, rstd);
        cuda_layernorm_fwd(&G, &ga, NULL, dev(w, dt), dev(b, dt), 1e-5f, NULL, &gy, NULL, NULL);
        check("misaligned.layernorm_fwd.y", dt, &gy, y);
        release_all();
    }
}

// The bf16 erf GELU (kernels/cuda/gelu.h's fit for Phi) on every finite bf16 input, against the
// exact GELU and slope (double erfc) rounded to bf16: no output may be more than one bf16 ulp
// off, and at most GELU_BF16_INEXACT_MAX GELU outputs may differ at all. The fit's relative error
// is at most 5.4e-6 (|x| <= 9): an exact result rounds differently only where it lies that close
// to a halfway point between two bf16 values, about 5.4e-6 / 2^-8 = 0.14% of inputs at worst
// (about 90); 2 do on an H100 (an fp32 emulation of the erff formula misses 197 of 65,280, mostly
// in the negative tail). Results below fp32's smallest normal (x < -13.2) flush to
// 0 (ftz), as fp32 arithmetic on the GPU does, and are not compared. The slope: one bf16 ulp,
// or 1e-6 where it crosses zero (x near -0.75; the fit's absolute error there is below 2e-6 x 0.23).
#define GELU_BF16_INEXACT_MAX 90
static long bf16_ulps(float a, float b) {
    uint16_t ua = f32_to_bf16(a), ub = f32_to_bf16(b);
    long ia = ua & 0x8000 ? -(long)(ua & 0x7fff) : (long)ua;   // sign-magnitude to a line
    long ib = ub & 0x8000 ? -(long)(ub & 0x7fff) : (long)ub;
    return ia > ib ? ia - ib : ib - ia;
}

static void test_gelu_bf16_every_input(void **state) {
    Tensor *x = HT(256, 256), *one = HT(256, 256);
    float *px = x->data, *pone = one->data;
    int n = 0;
    for (uint32_t b = 0; b < 65536; b++) {
        float v = bf16_to_f32((uint16_t)b);
        if (!isfinite(v)) continue;
        px[n++] = v;
    }
    for (int i = 0; i < 65536; i++) {
        if (i >= n) px[i] = 0.0f;
        pone[i] = 1.0f;
    }
    Tensor *gx = dev(x, DTYPE_BF16), *gy = dev_zeros(x, DTYPE_BF16), *gdx = dev_zeros(x, DTYPE_BF16);
    cuda_gelu_fwd(&G, gx, GELU_ERF, gy);
    cuda_gelu_bwd(&G, dev(one, DTYPE_BF16), gx, GELU_ERF, gdx);   // dx = 0 + 1 * gelu'(x)
    float *y = tensor_to_host_f32(&G, gy), *dx = tensor_to_host_f32(&G, gdx);
    long inexact = 0, worst_ulps = 0, worst_slope_ulps = 0;
    float worst_at = 0, worst_slope_at = 0;
    for (int i = 0; i < n; i++) {
        double v = px[i], phi = 0.5 * erfc(-v / sqrt(2.0)), g = v * phi;
        double slope = phi + v * exp(-0.5 * v * v) / sqrt(2.0 * M_PI);
        if (fabs(g) >= FLT_MIN) {
            long u = bf16_ulps(y[i], (float)g);
            if (u > 0) inexact++;
            if (u > worst_ulps) worst_ulps = u, worst_at = px[i];
        }
        long us = fabs(slope) < 1e-4 ? (fabs(dx[i] - slope) > 1e-6 ? 99 : 0) : bf16_ulps(dx[i], (float)slope);
        if (us > worst_slope_ulps) worst_slope_ulps = us, worst_slope_at = px[i];
    }
    printf("  %d bf16 inputs: %ld GELU outputs off the exact rounding (worst %ld ulp, x = %g); "
           "slope worst %ld ulp (x = %g)\n", n, inexact, worst_ulps, worst_at, worst_slope_ulps,
           worst_slope_at);
    free(y);
    free(dx);
    release_all();
    assert_true(worst_ulps <= 1);
    assert_true(inexact <= GELU_BF16_INEXACT_MAX);
    assert_true(worst_slope_ulps <= 1);
}

// dwconv_fwd's added input (the up projection onto the stream, then the LPU) bit for bit against
// linear_fwd onto res then dwconv_fwd on the GPU (mid and y), which the kernels must reproduce
// (narrow_dot.cuh); its cases in bench/op_cases.c hold it against the CPU. gspn_t's four LPU grids at its widths (the row kernel at
// 56 x 56 and 28 x 28, the whole-image kernel at 14 x 14 and 7 x 7), a partial strip and odd
// channels (one channel a thread), 108 channels (even, not a multiple of 8: the row kernel on a
// small image), an odd small image (one column a thread), no ub and no mid; then the shapes the
// kernels do not take (3 proxy channels; bf16 activations, where the two ops round x' and the
// CPU does not: the two-op comparison alone), which run as the two ops. fp32 weights, and bf16
// weights on the fp32 stream (a bf16 run).
static void test_dwconv_added_input_matches_the_two_ops(void **state) {
    static const int shapes[][5] = {{2, 56, 56, 96, 2}, {2, 28, 28, 192, 2}, {3, 14, 14, 384, 2},
                                    {2, 7, 7, 768, 2},  {2, 9, 13, 33, 2},   {2, 12, 10, 108, 2},
                                    {2, 9, 7, 16, 2},   {2, 9, 13, 24, 3},   {2, 14, 14, 32, 2}};   // B H W C Ku
    const int nshapes = (int)(sizeof shapes / sizeof shapes[0]);
    for (int mi = 0; mi < 3; mi++)
        for (int si = 0; si < nshapes; si++) {
            // mode 2: bf16 activations and weights (the two ops); else fp32 x, w fp32 or bf16
            DType xt = mi == 2 ? DTYPE_BF16 : DTYPE_F32, wt = mi == 0 ? DTYPE_F32 : DTYPE_BF16;
            int B = shapes[si][0], hgt = shapes[si][1], wid = shapes[si][2], C = shapes[si][3], ku = shapes[si][4];
            const bool with_b = si != 4, with_mid = si != 5;
            printf("  x %s, w %s (%d,%d,%d,%d) u of %d%s%s\n", dtype_name(xt), dtype_name(wt), B, hgt, wid,
                   C, ku, with_b ? "" : ", no ub", with_mid ? "" : ", no mid");
            Tensor *x = rnd(HT(B, hgt, wid, C), 1, -1, 1, xt), *w = rnd(HT(C, 1, 3, 3), 2, -1, 1, wt);
            Tensor *b = rnd(HT(C), 3, -1, 1, wt), *u = rnd(HT(B, hgt, wid, ku), 4, -2, 2, wt);
            Tensor *uw = rnd(HT(C, ku), 5, -1, 1, wt), *ub = with_b ? rnd(HT(C), 6, -1, 1, wt) : NULL;
            Tensor *mid = HT(B, hgt, wid, C), *y = HT(B, hgt, wid, C);
            Tensor *gx = dev(x, xt), *gw = dev(w, wt), *gb = dev(b, wt), *gu = dev(u, wt), *guw = dev(uw, wt);
            Tensor *gub = with_b ? dev(ub, wt) : NULL;
            Tensor *gmid = with_mid ? dev_zeros(mid, xt) : NULL, *gy = dev_zeros(y, xt);
            cuda_dwconv_fwd(&G, gx, gu, guw, gub, gw, gb, DWCONV_RESIDUAL, gmid, gy);
            Tensor *gmid2 = dev_zeros(mid, xt), *gy2 = dev_zeros(y, xt);
            cuda_linear_fwd(&G, gu, guw, gub, &(LinearFwdOpts){.res = gx}, gmid2);
            cuda_dwconv_fwd(&G, gmid2, NULL, NULL, NULL, gw, gb, DWCONV_RESIDUAL, NULL, gy2);
            if (with_mid) assert_same_bits("mid against linear_fwd onto res", gmid2, download_raw(gmid));
            assert_same_bits("y against the two ops", gy2, download_raw(gy));
            release_all();
        }
}

// The stem's convolution with its norm and GELU in one op (conv2d_fwd's opts) against
// conv2d_fwd, layernorm_fwd and gelu_fwd in turn: the same bits (kernels/cuda/conv2d_stem.cu: the
// tensor-core kernel sums each row as layernorm.cu does). gspn_t/s/b's stem widths (48, 56, 64)
// and 16 (the norm's 4 lanes a row), row counts that leave a partial tile, an fp32 image and a
// bf16 one, the norm alone; fp32 runs the three ops.
static void test_conv2d_norm_gelu_matches_the_three_ops(void **state) {
    static const int shapes[][5] = {{2, 3, 30, 34, 48}, {1, 3, 17, 21, 56}, {2, 3, 12, 10, 64},
                                    {1, 1, 9, 13, 16}};   // B C H W Cout
    for (int mi = 0; mi < 3; mi++)   // fp32; bf16 on an fp32 image; bf16 on a bf16 image
        for (int si = 0; si < 4; si++)
            for (int gelu = 0; gelu < 2; gelu++) {
                const DType wt = mi ? DTYPE_BF16 : DTYPE_F32, xt = mi == 2 ? DTYPE_BF16 : DTYPE_F32;
                const int B = shapes[si][0], C = shapes[si][1], hgt = shapes[si][2], wid = shapes[si][3];
                const int Co = shapes[si][4], Ho = (hgt - 1) / 2 + 1, Wo = (wid - 1) / 2 + 1;
                printf("  w %s, x %s (%d,%d,%d,%d) -> %d%s\n", dtype_name(wt), dtype_name(xt), B, C, hgt, wid,
                       Co, gelu ? ", GELU" : ", the norm alone");
                Tensor *x = rnd(HT(B, C, hgt, wid), 1, -1, 1, xt), *w = rnd(HT(Co, C, 3, 3), 2, -1, 1, wt);
                Tensor *b = rnd(HT(Co), 3, -1, 1, wt), *lw = rnd(HT(Co), 4, 0.5f, 1.5f, DTYPE_F32);
                Tensor *lb = rnd(HT(Co), 5, -0.5f, 0.5f, DTYPE_F32), *y = HT(B, Ho, Wo, Co);
                Tensor *gx = dev(x, xt), *gw = dev(w, wt), *gb = dev(b, wt), *glw = dev(lw, DTYPE_F32);
                Tensor *glb = dev(lb, DTYPE_F32), *gy = dev_zeros(y, wt), *gconv = dev_zeros(y, wt);
                Tensor *gn = dev_zeros(y, wt), *gy2 = dev_zeros(y, wt);
                const Conv2dFwdOpts o = {.ln = 1, .ln_w = glw, .ln_b = glb, .ln_eps = 1e-5f, .gelu_out = gelu,
                                         .gelu_kind = GELU_ERF};
                cuda_conv2d_fwd(&G, gx, gw, gb, 1, 2, 1, &o, NULL, gy);
                cuda_conv2d_fwd(&G, gx, gw, gb, 1, 2, 1, NULL, NULL, gconv);
                cuda_layernorm_fwd(&G, gconv, NULL, glw, glb, 1e-5f, NULL, gn, NULL, NULL);
                if (gelu) cuda_gelu_fwd(&G, gn, GELU_ERF, gy2);
                assert_same_bits("y against the three ops", gelu ? gy2 : gn, download_raw(gy));
                release_all();
            }
}

// A device copy of `bytes` (a multiple of 4) host bytes; free with device_free.
static void *dev_bytes(const void *host, size_t bytes) {
    Tensor t = {0};
    tensor_set_shape(&t, 1, (int[]){(int)(bytes / sizeof(float))});
    t.dtype = DTYPE_F32;
    t.device = DEVICE_CUDA;
    t.data = device_alloc(&G, bytes);
    tensor_upload(&G, &t, host);
    return t.data;
}

// Several parameters in one call: decay runs (device arrays) of lengths 64, 128, 64 and the
// rest, decaying on, off, on, off, against the CPU with the same runs.
static void test_adamw_decay_runs_match_cpu(void **state) {
    const int n = 8085;
    const uint64_t ends[4] = {64, 192, 256, (uint64_t)n};
    const uint8_t on[4] = {1, 0, 1, 0};
    for (int mi = 0; mi < 2; mi++) {
        DType dt = MODES[mi];
        printf("  %s\n", dtype_name(dt));
        Tensor *p = rnd(HT(n), 1, -0.5f, 0.5f, DTYPE_F32), *g = rnd(HT(n), 2, -1, 1, DTYPE_F32);
        Tensor *m = rnd(HT(n), 3, -0.1f, 0.1f, DTYPE_F32), *v = rnd(HT(n), 4, 0.0f, 0.01f, DTYPE_F32);
        Tensor *gp = dev(p, dt), *gmaster = dt == DTYPE_BF16 ? dev(p, DTYPE_F32) : NULL;
        Tensor *gg = dev(g, DTYPE_F32), *gm = dev(m, DTYPE_F32), *gv = dev(v, DTYPE_F32);
        uint64_t *dends = dev_bytes(ends, sizeof ends);
        uint8_t *don = dev_bytes(on, sizeof on);
        AdamWArgs args = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                          .weight_decay = 0.05f, .grad_scale = 0.5f, .step = 3,
                          .n_decay_runs = 4, .decay_ends = ends, .decay_on = on};
        cpu_adamw(&H, p, NULL, g, m, v, &args);
        args.decay_ends = dends, args.decay_on = don;
        cuda_adamw(&G, gp, gmaster, gg, gm, gv, &args);
        if (gmaster) check("adamw.master", dt, gmaster, p);
        check("adamw.param", dt, gp, p);
        check("adamw.m", dt, gm, m);
        check("adamw.v", dt, gv, v);
        device_free(&G, dends);
        device_free(&G, don);
        release_all();
    }
}

// Calling a backward twice adds twice, on the CPU and the GPU alike.
static void test_backward_twice_accumulates_twice(void **state) {
    for (int mi = 0; mi < 2; mi++) {
        DType dt = MODES[mi];
        printf("  %s\n", dtype_name(dt));
        int N = 37, C = 1152;
        Tensor *x = rnd(HT(N, C), 1, -1, 3, dt), *w = rnd(HT(C), 2, 0.5f, 1.5f, dt);
        Tensor *y = HT(N, C), *mean = HT(N), *rstd = HT(N);
        cpu_layernorm_fwd(&H, x, NULL, w, NULL, 1e-5f, NULL, y, mean, rstd);
        Tensor *dy = rnd(HT(N, C), 3, -1, 1, dt), *dx = rnd(HT(N, C), 4, -1, 1, dt);
        Tensor *dw = rnd(HT(C), 5, -1, 1, DTYPE_F32);
        Tensor *gdy = dev(dy, dt), *gx = dev(x, dt), *gw = dev(w, dt), *gm = dev(mean, DTYPE_F32);
        Tensor *gr = dev(rstd, DTYPE_F32), *gdx = dev(dx, dt), *gdw = dev(dw, DTYPE_F32);
        for (int k = 0; k < 2; k++) {
            cpu_layernorm_bwd(&H, dy, x, w, mean, rstd, dx, dw, NULL, NULL, NULL);
            cuda_layernorm_bwd(&G, gdy, gx, gw, gm, gr, gdx, gdw, NULL, NULL, NULL);
        }
        check("twice.layernorm_bwd.dx", dt, gdx, dx);
        check("twice.layernorm_bwd.dw", dt, gdw, dw);

        Tensor *rdy = rnd(HT(2, 9, 4, 64), 6, -1, 1, dt), *rdx = rnd(HT(2, 5, 7, 64), 7, -1, 1, dt);
        Tensor *grdy = dev(rdy, dt), *grdx = dev(rdx, dt);
        for (int k = 0; k < 2; k++) {
            cpu_resize_bilinear_bwd(&H, rdy, rdx);
            cuda_resize_bilinear_bwd(&G, grdy, grdx);
        }
        check("twice.resize_bilinear_bwd.dx", dt, grdx, rdx);

        Tensor *s = rnd(HT(5, 64), 8, -2, 2, dt), *t = rnd(HT(5, 64), 9, -2, 2, dt);
        Tensor *dloss = host_scalar(DLOSS), *ds = rnd(HT(5, 64), 10, -1e-3f, 1e-3f, dt);
        Tensor *gs = dev(s, dt), *gt = dev(t, dt), *gdl = dev(dloss, DTYPE_F32), *gds = dev(ds, dt);
        for (int k = 0; k < 2; k++) {
            cpu_token_kl_bwd(&H, dloss, s, t, ds, NULL);
            cuda_token_kl_bwd(&G, gdl, gs, gt, gds, NULL);
        }
        check("twice.token_kl_bwd.ds", dt, gds, ds);

        Tensor *bdy = rnd(HT(4, 7, 64), 11, -1, 1, dt), *dp = rnd(HT(7, 64), 12, -1, 1, DTYPE_F32);
        Tensor *gbdy = dev(bdy, dt), *gdp = dev(dp, DTYPE_F32);
        for (int k = 0; k < 2; k++) {
            cpu_add_bcast_bwd(&H, bdy, NULL, dp);
            cuda_add_bcast_bwd(&G, gbdy, NULL, gdp);
        }
        check("twice.add_bcast_bwd.dp", dt, gdp, dp);
        release_all();
    }
}

static int group_setup(void **state) {
    if (cuda_device_count() == 0) {
        printf("no CUDA device visible (make test-gpu runs on a GPU machine)\n");
        return -1;
    }
    G = cuda_ctx_create(0, DTYPE_BF16);
    H = ctx_cpu();
    return 0;
}

static int group_teardown(void **state) {
    release_all();
    cuda_ctx_destroy(&G);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_op_case_matches_cpu),
        cmocka_unit_test(test_misaligned_views_take_the_scalar_path_correctly),
        cmocka_unit_test(test_gelu_bf16_every_input),
        cmocka_unit_test(test_dwconv_added_input_matches_the_two_ops),
        cmocka_unit_test(test_conv2d_norm_gelu_matches_the_three_ops),
        cmocka_unit_test(test_adamw_decay_runs_match_cpu),
        cmocka_unit_test(test_backward_twice_accumulates_twice),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
