// GPU tests of the memory-bound CUDA ops (kernels/cuda/*.cu): elementwise, broadcast add,
// layer scale, LayerNorm, GELU, softmax, token layout, bilinear resize, losses, sumsq, AdamW.
// Each op runs on the GPU and in the CPU reference (kernels/cpu/) on the same inputs, forward
// and backward, in fp32 and in bf16 (inputs rounded to bf16 on the CPU side first, so the
// reference sees exactly what the GPU sees), on odd shapes (7 rows; 6, 33, 1155 channels: the
// scalar paths) and on multiples of 8 (64, 1152, 1600, 2056: the vector paths, cached or not).
// Every backward starts from nonzero gradients, so += is checked, and the ops with optional
// gradients also run with each one NULL. Reductions are run twice and compared bit for bit.
// The GPU side calls cuda_* directly (as the CPU tests call cpu_*): dispatch.c's weak references
// alone would not pull the kernels out of the archive.
#include "gpulib.h"
#include <float.h>

// fp32: the GPU and the CPU reference do the same fp32 operations except for the order of sums
// (fp32 warp/block trees vs. double on the CPU) and fused multiply-adds; that moves a result by a
// few fp32 ulps (~1e-7 each) on these sizes. A wrong index or a missing term is off by 1e-2+.
#define FP32_TOL 1e-5
// bf16 tensor written once from fp32 math on the inputs the CPU also sees: every element is off
// by at most half a bf16 ulp, 2^-8 = 3.9e-3 of its value, so the norm-wise error is below that
// too (seen: ~1.5e-3); the fp32 differences above add ~1e-6.
#define BF16_ROUNDED_TOL 4e-3
// bf16 gradient accumulated twice: two roundings, the first carried into the second, each at
// most 2^-8 of a sum of comparable size: 2 x 3.9e-3.
#define BF16_TWICE_TOL 8e-3
// A backward's dloss: not 1, so a missing dloss factor shows.
#define DLOSS 0.7f

// bf16 mode tolerances, by tensor. Tensors that stay fp32 in bf16 mode (statistics, losses,
// parameter gradients, optimizer state) see the same bf16-valued inputs as the CPU and do fp32
// math: FP32_TOL. Tensors stored in bf16: BF16_ROUNDED_TOL (one final rounding, the inputs being
// identical) or BF16_TWICE_TOL (accumulated twice).
typedef struct { const char *name; double tol; } NamedTol;
static const NamedTol BF16_TOLS[] = {
    {"zero.y", 0.0},                         // exact zeros
    {"add_fwd.y", BF16_ROUNDED_TOL},
    {"scale_fwd.y", BF16_ROUNDED_TOL},
    {"scale_bwd.dx", BF16_ROUNDED_TOL},      // prior + s dy, rounded once
    {"accumulate.dst", BF16_ROUNDED_TOL},
    {"accumulate.dst_f32", FP32_TOL},        // bf16 src into an fp32 dst: an fp32 add
    {"add_bcast_fwd.y", BF16_ROUNDED_TOL},
    {"add_bcast_bwd.dx", BF16_ROUNDED_TOL},
    {"add_bcast_bwd.dp", FP32_TOL},          // fp32 column sum of bf16 values
    {"cast_colsum.y", BF16_ROUNDED_TOL},     // the fp32 stream rounded once
    {"cast_colsum.colsum", FP32_TOL},        // fp32 column sum of the fp32 values
    {"layer_scale_fwd.y", BF16_ROUNDED_TOL},
    {"layer_scale_bwd.dx", BF16_ROUNDED_TOL},
    {"layer_scale_bwd.dg", FP32_TOL},        // fp32 column sum of products of bf16 values
    {"layernorm_fwd.y", BF16_ROUNDED_TOL},
    {"layernorm_fwd.mean", FP32_TOL},        // fp32 statistics of the same bf16 row
    {"layernorm_fwd.rstd", FP32_TOL},
    {"layernorm_bwd.dx", BF16_ROUNDED_TOL},  // mean, rstd given: only the final rounding differs
    {"layernorm_bwd.dw", FP32_TOL},
    {"layernorm_bwd.db", FP32_TOL},
    {"layernorm_bwd.dx_act", BF16_ROUNDED_TOL},   // the final fp32 dx rounded once
    {"layernorm_bwd.dx_sum", FP32_TOL},
    {"add_layernorm_fwd.h_f32", FP32_TOL},   // an fp32 sum of the same values: exact
    {"add_layernorm_fwd.h", BF16_ROUNDED_TOL},
    {"add_layernorm_fwd.y", BF16_ROUNDED_TOL},   // from the same h (a bf16 h rounded on both sides)
    {"add_layernorm_fwd.mean", FP32_TOL},
    {"add_layernorm_fwd.rstd", FP32_TOL},
    {"gelu_fwd.y", BF16_ROUNDED_TOL},
    {"gelu_bwd.dx", BF16_ROUNDED_TOL},
    {"silu_fwd.y", BF16_ROUNDED_TOL},
    {"silu_bwd.dx", BF16_ROUNDED_TOL},
    {"softmax_fwd.y", BF16_ROUNDED_TOL},
    {"attention_pool_fwd.out", BF16_ROUNDED_TOL},   // fp32 math on bf16 inputs, rounded once
    {"dwconv_fwd.y", BF16_ROUNDED_TOL},
    // the sum rounded as silu reads it, then silu's value rounded: two roundings (seen: at most
    // 2.8e-3 over the 48 shape and dtype cases, H100 and H200, 2026-11-26)
    {"dwconv_fwd.y_silu", BF16_TWICE_TOL},
    {"conv2d_fwd.y", BF16_ROUNDED_TOL},      // fp32 sums of exact products, rounded once
    {"conv2d_bwd.dx", BF16_TWICE_TOL},       // dcols rounded, then prior + its taps rounded
    {"conv2d_bwd.dx_f32", BF16_ROUNDED_TOL}, // dcols rounded; the taps summed into fp32 dx
    {"conv2d_bwd.dw", FP32_TOL},             // fp32 sums of exact products: only the order differs
    {"conv2d_bwd.db", FP32_TOL},
    {"dwconv_bwd.dx", BF16_ROUNDED_TOL},     // prior + the taps' sum, rounded once
    {"dwconv_bwd.dw", FP32_TOL},             // fp32 column sums of bf16 products
    {"dwconv_bwd.db", FP32_TOL},
    {"softmax_bwd.dx", BF16_ROUNDED_TOL},
    {"concat_prefix_fwd.y", 0.0},            // copies of bf16 values: exact
    {"concat_prefix_bwd.dprefix", FP32_TOL}, // fp32 sum over the batch
    {"concat_prefix_bwd.dx", BF16_ROUNDED_TOL},
    {"slice_tokens_fwd.y", 0.0},             // a copy: exact
    {"slice_tokens_bwd.dx", BF16_ROUNDED_TOL},
    {"mean_tokens_fwd.y", BF16_ROUNDED_TOL},
    {"mean_tokens_bwd.dx", BF16_ROUNDED_TOL},
    {"resize_bilinear_fwd.y", BF16_ROUNDED_TOL},
    {"resize_bilinear_bwd.dx", BF16_ROUNDED_TOL},   // gathered in fp32, rounded once
    {"cross_entropy_fwd.loss", FP32_TOL},
    {"cross_entropy_fwd.probs", FP32_TOL},   // probs are fp32 (as the tape keeps them)
    {"cross_entropy_bwd.dlogits", BF16_ROUNDED_TOL},
    {"mse_fwd.loss", FP32_TOL},
    {"mse_bwd.da", BF16_ROUNDED_TOL},
    {"mse_bwd.db", BF16_ROUNDED_TOL},
    {"token_kl_fwd.loss", FP32_TOL},
    {"token_kl_bwd.ds", BF16_ROUNDED_TOL},
    {"token_kl_bwd.dt", BF16_ROUNDED_TOL},
    {"sumsq.sum", FP32_TOL},
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

// ---- tensors that live for one test case ------------------------------------------------------

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

// ---- elementwise -------------------------------------------------------------------------------

static void test_elementwise_ops_match_cpu(void **state) {
    static const int shapes[][2] = {{7, 1155}, {14, 6}, {3, 64}};
    for (int mi = 0; mi < 2; mi++)
        for (int si = 0; si < 3; si++) {
            DType dt = MODES[mi];
            int R = shapes[si][0], C = shapes[si][1];
            printf("  %s (%d, %d)\n", dtype_name(dt), R, C);
            Tensor *a = rnd(HT(R, C), 1, -2, 2, dt), *b = rnd(HT(R, C), 2, -2, 2, dt);
            Tensor *ga = dev(a, dt), *gb = dev(b, dt);
            Tensor *y = HT(R, C), *gy = dev_zeros(y, dt);
            cpu_add_fwd(&H, a, b, y);
            cuda_add_fwd(&G, ga, gb, gy);
            check("add_fwd.y", dt, gy, y);
            cpu_scale_fwd(&H, a, -1.5f, y);
            cuda_scale_fwd(&G, ga, -1.5f, gy);
            check("scale_fwd.y", dt, gy, y);

            Tensor *dx = rnd(HT(R, C), 3, -1, 1, dt), *gdx = dev(dx, dt);
            cpu_scale_bwd(&H, b, 0.75f, dx);
            cuda_scale_bwd(&G, gb, 0.75f, gdx);
            cuda_scale_bwd(&G, gb, 0.75f, NULL);   // a NULL gradient is skipped
            check("scale_bwd.dx", dt, gdx, dx);

            Tensor *d = rnd(HT(R, C), 4, -1, 1, dt), *gd = dev(d, dt);
            cpu_accumulate(&H, a, d);
            cuda_accumulate(&G, ga, gd);
            check("accumulate.dst", dt, gd, d);
            // an activation gradient (act dtype) into a parameter gradient (fp32)
            Tensor *p = rnd(HT(R, C), 5, -1, 1, DTYPE_F32), *gp = dev(p, DTYPE_F32);
            cpu_accumulate(&H, a, p);
            cuda_accumulate(&G, ga, gp);
            check("accumulate.dst_f32", dt, gp, p);

            cpu_zero(&H, d);
            cuda_zero(&G, gd);
            check("zero.y", dt, gd, d);
            release_all();
        }
}

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
        cpu_layernorm_fwd(&H, a, w, b, 1e-5f, y, mean, rstd);
        cuda_layernorm_fwd(&G, &ga, dev(w, dt), dev(b, dt), 1e-5f, &gy, NULL, NULL);
        check("misaligned.layernorm_fwd.y", dt, &gy, y);
        release_all();
    }
}

// ---- broadcast add and layer scale ----------------------------------------------------------------

static void test_add_bcast_matches_cpu(void **state) {
    static const int shapes[][3] = {{3, 7, 6}, {3, 7, 64}, {70, 7, 6}};   // (R, N, C): P = N*C
    for (int mi = 0; mi < 2; mi++)
        for (int si = 0; si < 3; si++) {
            DType dt = MODES[mi];
            int R = shapes[si][0], N = shapes[si][1], C = shapes[si][2];
            printf("  %s (%d, %d, %d)\n", dtype_name(dt), R, N, C);
            Tensor *x = rnd(HT(R, N, C), 1, -1, 1, dt), *p = rnd(HT(N, C), 2, -1, 1, dt);
            Tensor *y = HT(R, N, C), *gy = dev_zeros(y, dt);
            cpu_add_bcast_fwd(&H, x, p, y);
            cuda_add_bcast_fwd(&G, dev(x, dt), dev(p, dt), gy);
            check("add_bcast_fwd.y", dt, gy, y);

            Tensor *dy = rnd(HT(R, N, C), 3, -1, 1, dt), *gdy = dev(dy, dt);
            Tensor *dx = rnd(HT(R, N, C), 4, -1, 1, dt), *dp = rnd(HT(N, C), 5, -1, 1, DTYPE_F32);
            Tensor *gdx = dev(dx, dt), *gdp = dev(dp, DTYPE_F32);
            Tensor *gdx_only = dev(dx, dt), *gdp_only = dev(dp, DTYPE_F32);
            cpu_add_bcast_bwd(&H, dy, dx, dp);
            cuda_add_bcast_bwd(&G, gdy, gdx, gdp);
            cuda_add_bcast_bwd(&G, gdy, gdx_only, NULL);
            cuda_add_bcast_bwd(&G, gdy, NULL, gdp_only);
            check("add_bcast_bwd.dx", dt, gdx, dx);
            check("add_bcast_bwd.dp", dt, gdp, dp);
            check("add_bcast_bwd.dx", dt, gdx_only, dx);
            check("add_bcast_bwd.dp", dt, gdp_only, dp);
            release_all();
        }
}

// A residual branch's gradient from the fp32 stream's: y (the activation dtype, starts NaN) = x,
// colsum (fp32, starts nonzero) += the column sums of x; colsum NULL is skipped.
static void test_cast_colsum_matches_cpu(void **state) {
    static const int shapes[][2] = {{7, 6}, {37, 1152}, {4099, 64}, {9, 1155}};
    for (int mi = 0; mi < 2; mi++)
        for (int si = 0; si < 4; si++) {
            DType dt = MODES[mi];
            int R = shapes[si][0], C = shapes[si][1];
            printf("  %s (%d, %d)\n", dtype_name(dt), R, C);
            Tensor *x = rnd(HT(R, C), 1, -1, 1, DTYPE_F32), *gx = dev(x, DTYPE_F32);
            Tensor *nan = HT(R, C);
            for (size_t i = 0; i < nan->numel; i++) tensor_f32(nan)[i] = NAN;
            Tensor *y = HT(R, C), *gy = dev(nan, dt), *gy_only = dev(nan, dt);
            Tensor *cs = rnd(HT(C), 2, -1, 1, DTYPE_F32), *gcs = dev(cs, DTYPE_F32);
            cpu_cast_colsum(&H, x, y, cs);
            cuda_cast_colsum(&G, gx, gy, gcs);
            cuda_cast_colsum(&G, gx, gy_only, NULL);
            check("cast_colsum.y", dt, gy, y);
            check("cast_colsum.y", dt, gy_only, y);
            check("cast_colsum.colsum", dt, gcs, cs);
            void *first = download_raw(gcs);
            Tensor *gcs2 = dev(rnd(HT(C), 2, -1, 1, DTYPE_F32), DTYPE_F32);
            cuda_cast_colsum(&G, gx, gy, gcs2);
            assert_same_bits("cast_colsum.colsum", gcs2, first);
            release_all();
        }
}

static void test_layer_scale_matches_cpu(void **state) {
    static const int shapes[][2] = {{7, 6}, {7, 1155}, {37, 1152}, {300, 64}};
    for (int mi = 0; mi < 2; mi++)
        for (int si = 0; si < 4; si++) {
            DType dt = MODES[mi];
            int R = shapes[si][0], C = shapes[si][1];
            printf("  %s (%d, %d)\n", dtype_name(dt), R, C);
            Tensor *x = rnd(HT(R, C), 1, -1, 1, dt), *g = rnd(HT(C), 2, 0.5f, 1.5f, dt);
            Tensor *gx = dev(x, dt), *gg = dev(g, dt);
            Tensor *y = HT(R, C), *gy = dev_zeros(y, dt);
            cpu_layer_scale_fwd(&H, x, g, y);
            cuda_layer_scale_fwd(&G, gx, gg, gy);
            check("layer_scale_fwd.y", dt, gy, y);

            Tensor *dy = rnd(HT(R, C), 3, -1, 1, dt), *gdy = dev(dy, dt);
            Tensor *dx = rnd(HT(R, C), 4, -1, 1, dt), *dg = rnd(HT(C), 5, -1, 1, DTYPE_F32);
            Tensor *gdx = dev(dx, dt), *gdg = dev(dg, DTYPE_F32);
            Tensor *gdx_only = dev(dx, dt), *gdg_only = dev(dg, DTYPE_F32);
            cpu_layer_scale_bwd(&H, dy, x, g, dx, dg);
            cuda_layer_scale_bwd(&G, gdy, gx, gg, gdx, gdg);
            cuda_layer_scale_bwd(&G, gdy, gx, gg, gdx_only, NULL);
            cuda_layer_scale_bwd(&G, gdy, gx, gg, NULL, gdg_only);
            check("layer_scale_bwd.dx", dt, gdx, dx);
            check("layer_scale_bwd.dg", dt, gdg, dg);
            check("layer_scale_bwd.dx", dt, gdx_only, dx);
            check("layer_scale_bwd.dg", dt, gdg_only, dg);
            release_all();
        }
}

// ---- LayerNorm, GELU, softmax ----------------------------------------------------------------------

// 6, 33, 1155: scalar; 64, 1152, 1600: vector, row in registers; 2056: vector, read again.
// scalar (6, 33, 1155); short rows, 4 / 8 / 16 lanes each (32, 64, 96, 128); cached (1152, 1600);
// uncached vectors (2056)
static const int LN_SHAPES[][2] = {{7, 6},    {7, 33},    {7, 1155},  {13, 32},  {5, 64},
                                   {70, 64},  {9, 96},    {11, 128},  {37, 1152}, {3, 1600},
                                   {3, 2056}};
enum { N_LN_SHAPES = sizeof LN_SHAPES / sizeof LN_SHAPES[0] };

static void test_layernorm_matches_cpu(void **state) {
    for (int mi = 0; mi < 2; mi++)
        for (int si = 0; si < N_LN_SHAPES; si++) {
            DType dt = MODES[mi];
            int N = LN_SHAPES[si][0], C = LN_SHAPES[si][1];
            printf("  %s (%d, %d)\n", dtype_name(dt), N, C);
            // x off zero, so the means are not tiny numbers compared in relative terms
            Tensor *x = rnd(HT(N, C), 1, -1, 3, dt), *w = rnd(HT(C), 2, 0.5f, 1.5f, dt);
            Tensor *b = rnd(HT(C), 3, -0.5f, 0.5f, dt);
            Tensor *gx = dev(x, dt), *gw = dev(w, dt), *gb = dev(b, dt);
            Tensor *y = HT(N, C), *mean = HT(N), *rstd = HT(N);
            Tensor *gy = dev_zeros(y, dt), *gmean = dev_zeros(mean, DTYPE_F32);
            Tensor *grstd = dev_zeros(rstd, DTYPE_F32);
            cpu_layernorm_fwd(&H, x, w, b, 1e-5f, y, mean, rstd);
            cuda_layernorm_fwd(&G, gx, gw, gb, 1e-5f, gy, gmean, grstd);
            check("layernorm_fwd.y", dt, gy, y);
            check("layernorm_fwd.mean", dt, gmean, mean);
            check("layernorm_fwd.rstd", dt, grstd, rstd);
            // no affine parameters, no saved statistics
            Tensor *y0 = HT(N, C), *gy0 = dev_zeros(y0, dt);
            cpu_layernorm_fwd(&H, x, NULL, NULL, 1e-5f, y0, NULL, NULL);
            cuda_layernorm_fwd(&G, gx, NULL, NULL, 1e-5f, gy0, NULL, NULL);
            check("layernorm_fwd.y", dt, gy0, y0);

            // backward from the reference's statistics (fp32 on both sides)
            Tensor *gm = dev(mean, DTYPE_F32), *gr = dev(rstd, DTYPE_F32);
            Tensor *dy = rnd(HT(N, C), 4, -1, 1, dt), *gdy = dev(dy, dt);
            Tensor *dx = rnd(HT(N, C), 5, -1, 1, dt);
            Tensor *dw = rnd(HT(C), 6, -1, 1, DTYPE_F32), *db = rnd(HT(C), 7, -1, 1, DTYPE_F32);
            Tensor *gdx = dev(dx, dt), *gdw = dev(dw, DTYPE_F32), *gdb = dev(db, DTYPE_F32);
            Tensor *gdx_only = dev(dx, dt), *gdw_only = dev(dw, DTYPE_F32), *gdb_only = dev(db, DTYPE_F32);
            cpu_layernorm_bwd(&H, dy, x, w, mean, rstd, dx, dw, db, NULL, NULL);
            cuda_layernorm_bwd(&G, gdy, gx, gw, gm, gr, gdx, gdw, gdb, NULL, NULL);
            cuda_layernorm_bwd(&G, gdy, gx, gw, gm, gr, gdx_only, NULL, NULL, NULL, NULL);
            cuda_layernorm_bwd(&G, gdy, gx, gw, gm, gr, NULL, gdw_only, gdb_only, NULL, NULL);
            check("layernorm_bwd.dx", dt, gdx, dx);
            check("layernorm_bwd.dw", dt, gdw, dw);
            check("layernorm_bwd.db", dt, gdb, db);
            check("layernorm_bwd.dx", dt, gdx_only, dx);
            check("layernorm_bwd.dw", dt, gdw_only, dw);
            check("layernorm_bwd.db", dt, gdb_only, db);
            // without w (g = dy)
            Tensor *dx0 = rnd(HT(N, C), 8, -1, 1, dt), *db0 = rnd(HT(C), 9, -1, 1, DTYPE_F32);
            Tensor *gdx0 = dev(dx0, dt), *gdb0 = dev(db0, DTYPE_F32);
            cpu_layernorm_bwd(&H, dy, x, NULL, mean, rstd, dx0, NULL, db0, NULL, NULL);
            cuda_layernorm_bwd(&G, gdy, gx, NULL, gm, gr, gdx0, NULL, gdb0, NULL, NULL);
            check("layernorm_bwd.dx", dt, gdx0, dx0);
            check("layernorm_bwd.db", dt, gdb0, db0);
            release_all();
        }
}

// Mixed dtypes: fp32 x (the residual stream) normalized into a bf16 y, as the encoders do, its
// backward a bf16 dy accumulating into an fp32 dx; and bf16 x (a convolution's output) into an
// fp32 y, as gspn_hier starts its fp32 stream, an fp32 dy into a bf16 dx. Each side's bf16
// tensors are rounded on the CPU side too, so both compute from identical values: a tensor
// written in bf16 is one rounding of fp32 math (BF16_ROUNDED_TOL), one written in fp32 is fp32
// math (FP32_TOL); the mode passed to check() is the dtype the tensor is written in. w and b take
// y's dtype.
static void check_layernorm_mixed(DType xt, DType yt) {
    for (int si = 0; si < N_LN_SHAPES; si++) {
        int N = LN_SHAPES[si][0], C = LN_SHAPES[si][1];
        printf("  %s -> %s (%d, %d)\n", dtype_name(xt), dtype_name(yt), N, C);
        Tensor *x = rnd(HT(N, C), 1, -1, 3, xt), *w = rnd(HT(C), 2, 0.5f, 1.5f, yt);
        Tensor *b = rnd(HT(C), 3, -0.5f, 0.5f, yt);
        Tensor *gx = dev(x, xt), *gw = dev(w, yt), *gb = dev(b, yt);
        Tensor *y = HT(N, C), *mean = HT(N), *rstd = HT(N);
        Tensor *gy = dev_zeros(y, yt), *gmean = dev_zeros(mean, DTYPE_F32);
        Tensor *grstd = dev_zeros(rstd, DTYPE_F32);
        cpu_layernorm_fwd(&H, x, w, b, 1e-6f, y, mean, rstd);
        cuda_layernorm_fwd(&G, gx, gw, gb, 1e-6f, gy, gmean, grstd);
        check("layernorm_fwd.y", yt, gy, y);
        check("layernorm_fwd.mean", DTYPE_F32, gmean, mean);
        check("layernorm_fwd.rstd", DTYPE_F32, grstd, rstd);

        Tensor *gm = dev(mean, DTYPE_F32), *gr = dev(rstd, DTYPE_F32);
        Tensor *dy = rnd(HT(N, C), 4, -1, 1, yt), *gdy = dev(dy, yt);
        Tensor *dx = rnd(HT(N, C), 5, -1, 1, xt);
        Tensor *dw = rnd(HT(C), 6, -1, 1, DTYPE_F32), *db = rnd(HT(C), 7, -1, 1, DTYPE_F32);
        Tensor *gdx = dev(dx, xt), *gdw = dev(dw, DTYPE_F32), *gdb = dev(db, DTYPE_F32);
        cpu_layernorm_bwd(&H, dy, x, w, mean, rstd, dx, dw, db, NULL, NULL);
        cuda_layernorm_bwd(&G, gdy, gx, gw, gm, gr, gdx, gdw, gdb, NULL, NULL);
        check("layernorm_bwd.dx", xt, gdx, dx);
        check("layernorm_bwd.dw", DTYPE_F32, gdw, dw);
        check("layernorm_bwd.db", DTYPE_F32, gdb, db);
        if (xt != DTYPE_F32) {
            release_all();
            continue;
        }
        // the residual stream's hand-off of the final dx (in bf16, starts NaN) and its column
        // sums, with and without dw, db, and each part alone
        Tensor *nan = HT(N, C);
        for (size_t i = 0; i < nan->numel; i++) tensor_f32(nan)[i] = NAN;
        Tensor *act = HT(N, C), *sums = rnd(HT(C), 8, -1, 1, DTYPE_F32);
        Tensor *dx2 = rnd(HT(N, C), 5, -1, 1, DTYPE_F32);
        cpu_layernorm_bwd(&H, dy, x, w, mean, rstd, dx2, NULL, NULL, act, sums);
        for (int variant = 0; variant < 3; variant++) {
            Tensor *gdx2 = dev(rnd(HT(N, C), 5, -1, 1, DTYPE_F32), DTYPE_F32);
            Tensor *gact = dev(nan, DTYPE_BF16), *gsums = dev(rnd(HT(C), 8, -1, 1, DTYPE_F32), DTYPE_F32);
            Tensor *gdw2 = dev_zeros(dw, DTYPE_F32);
            cuda_layernorm_bwd(&G, gdy, gx, gw, gm, gr, gdx2, variant == 0 ? gdw2 : NULL, NULL,
                               variant != 2 ? gact : NULL, variant != 1 ? gsums : NULL);
            check("layernorm_bwd.dx", DTYPE_F32, gdx2, dx2);
            if (variant != 2) check("layernorm_bwd.dx_act", DTYPE_BF16, gact, act);
            if (variant != 1) check("layernorm_bwd.dx_sum", DTYPE_F32, gsums, sums);
        }
        release_all();
    }
}

static void test_layernorm_mixed_dtypes_match_cpu(void **state) {
    check_layernorm_mixed(DTYPE_F32, DTYPE_BF16);
    check_layernorm_mixed(DTYPE_BF16, DTYPE_F32);
}

// add_layernorm_fwd: h = x + r, y = LayerNorm(h); both as the encoders use it (fp32 stream x,
// r and y in the mode's dtype) and all in one dtype, on every LayerNorm path (scalar, cached at
// each size, uncached). h and y start NaN: every element must be written.
static void test_add_layernorm_matches_cpu(void **state) {
    for (int mi = 0; mi < 2; mi++)
        for (int xi = 0; xi < 2; xi++)
            for (int si = 0; si < N_LN_SHAPES; si++) {
                DType dt = MODES[mi], xdt = xi == 0 ? DTYPE_F32 : dt;
                if (xi == 1 && dt == DTYPE_F32) continue;   // the same as xi == 0
                int N = LN_SHAPES[si][0], C = LN_SHAPES[si][1];
                printf("  x %s, r and y %s (%d, %d)\n", dtype_name(xdt), dtype_name(dt), N, C);
                Tensor *x = rnd(HT(N, C), 1, -1, 3, xdt), *r = rnd(HT(N, C), 11, -1, 1, dt);
                Tensor *w = rnd(HT(C), 2, 0.5f, 1.5f, dt), *b = rnd(HT(C), 3, -0.5f, 0.5f, dt);
                Tensor *h = HT(N, C), *y = HT(N, C), *mean = HT(N), *rstd = HT(N);
                Tensor *nan = HT(N, C);
                for (size_t i = 0; i < nan->numel; i++) tensor_f32(nan)[i] = NAN;
                Tensor *gh = dev(nan, xdt), *gy = dev(nan, dt);
                Tensor *gmean = dev_zeros(mean, DTYPE_F32), *grstd = dev_zeros(rstd, DTYPE_F32);
                if (xdt == DTYPE_F32) {
                    cpu_add_layernorm_fwd(&H, x, r, w, b, 1e-6f, h, y, mean, rstd);
                } else {   // the GPU's h is bf16, and it normalizes the rounded sum
                    cpu_add_fwd(&H, x, r, h);
                    gpu_test_round_to_bf16(h);
                    cpu_layernorm_fwd(&H, h, w, b, 1e-6f, y, mean, rstd);
                }
                cuda_add_layernorm_fwd(&G, dev(x, xdt), dev(r, dt), dev(w, dt), dev(b, dt), 1e-6f,
                                       gh, gy, gmean, grstd);
                check(xdt == DTYPE_F32 ? "add_layernorm_fwd.h_f32" : "add_layernorm_fwd.h", dt, gh, h);
                check("add_layernorm_fwd.y", dt, gy, y);
                check("add_layernorm_fwd.mean", dt, gmean, mean);
                check("add_layernorm_fwd.rstd", dt, grstd, rstd);
                release_all();
            }
}

static void test_gelu_matches_cpu(void **state) {
    static const int shapes[][2] = {{7, 1155}, {7, 6}, {4, 64}};
    for (int mi = 0; mi < 2; mi++)
        for (int si = 0; si < 3; si++)
            for (int k = 0; k < 2; k++) {
                DType dt = MODES[mi];
                GeluKind kind = k == 0 ? GELU_ERF : GELU_TANH;
                int R = shapes[si][0], C = shapes[si][1];
                printf("  %s (%d, %d) %s\n", dtype_name(dt), R, C, k == 0 ? "erf" : "tanh");
                Tensor *x = rnd(HT(R, C), 1, -4, 4, dt), *gx = dev(x, dt);
                Tensor *y = HT(R, C), *gy = dev_zeros(y, dt);
                cpu_gelu_fwd(&H, x, kind, y);
                cuda_gelu_fwd(&G, gx, kind, gy);
                check("gelu_fwd.y", dt, gy, y);
                Tensor *dy = rnd(HT(R, C), 2, -1, 1, dt), *dx = rnd(HT(R, C), 3, -1, 1, dt);
                Tensor *gdx = dev(dx, dt);
                cpu_gelu_bwd(&H, dy, x, kind, dx);
                cuda_gelu_bwd(&G, dev(dy, dt), gx, kind, gdx);
                check("gelu_bwd.dx", dt, gdx, dx);
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

static void test_silu_matches_cpu(void **state) {
    static const int shapes[][2] = {{7, 1155}, {7, 6}};
    for (int mi = 0; mi < 2; mi++)
        for (int si = 0; si < 2; si++) {
            DType dt = MODES[mi];
            int R = shapes[si][0], C = shapes[si][1];
            printf("  %s (%d, %d)\n", dtype_name(dt), R, C);
            Tensor *x = rnd(HT(R, C), 4, -6, 6, dt), *gx = dev(x, dt);
            Tensor *y = HT(R, C), *gy = dev_zeros(y, dt);
            cpu_silu_fwd(&H, x, y);
            cuda_silu_fwd(&G, gx, gy);
            check("silu_fwd.y", dt, gy, y);
            Tensor *dy = rnd(HT(R, C), 5, -1, 1, dt), *dx = rnd(HT(R, C), 6, -1, 1, dt);
            Tensor *gdx = dev(dx, dt);
            cpu_silu_bwd(&H, dy, x, dx);
            cuda_silu_bwd(&G, dev(dy, dt), gx, gdx);
            check("silu_bwd.dx", dt, gdx, dx);
            release_all();
        }
}

static void test_softmax_matches_cpu(void **state) {
    static const int shapes[][2] = {{7, 6}, {7, 33}, {7, 1155}, {5, 64}, {3, 1000}};
    for (int mi = 0; mi < 2; mi++)
        for (int si = 0; si < 5; si++) {
            DType dt = MODES[mi];
            int R = shapes[si][0], C = shapes[si][1];
            printf("  %s (%d, %d)\n", dtype_name(dt), R, C);
            Tensor *x = rnd(HT(R, C), 1, -3, 3, dt);
            Tensor *y = HT(R, C), *gy = dev_zeros(y, dt);
            cpu_softmax_fwd(&H, x, y);
            cuda_softmax_fwd(&G, dev(x, dt), gy);
            check("softmax_fwd.y", dt, gy, y);
            if (dt == DTYPE_BF16) gpu_test_round_to_bf16(y);   // the saved output both sides use
            Tensor *dy = rnd(HT(R, C), 2, -1, 1, dt), *dx = rnd(HT(R, C), 3, -1, 1, dt);
            Tensor *gdx = dev(dx, dt);
            cpu_softmax_bwd(&H, dy, y, dx);
            cuda_softmax_bwd(&G, dev(dy, dt), dev(y, dt), gdx);
            check("softmax_bwd.dx", dt, gdx, dx);
            release_all();
        }
}

// SigLIP's MAP head shapes among them: 1369 tokens of head dim 72 (so400m at 518 px).
static void test_attention_pool_matches_cpu(void **state) {
    static const int shapes[][4] = {{2, 7, 16, 2}, {3, 50, 64, 4}, {1, 1369, 1152, 16}};   // B N C H
    for (int mi = 0; mi < 2; mi++)
        for (int si = 0; si < 3; si++) {
            DType dt = MODES[mi];
            int B = shapes[si][0], N = shapes[si][1], C = shapes[si][2], heads = shapes[si][3];
            printf("  %s B=%d N=%d C=%d heads=%d\n", dtype_name(dt), B, N, C, heads);
            Tensor *q = rnd(HT(C), 1, -1, 1, dt), *kv = rnd(HT(B, N, 2 * C), 2, -1, 1, dt);
            Tensor *y = HT(B, C), *gy = dev_zeros(y, dt);
            cpu_attention_pool_fwd(&H, q, kv, heads, y);
            cuda_attention_pool_fwd(&G, dev(q, dt), dev(kv, dt), heads, gy);
            check("attention_pool_fwd.out", dt, gy, y);
            release_all();
        }
}

// Depthwise convolution (GSPN's LPU and mixer): k 1, 3, 5 and 7, a channel count of 8s (db's
// vector path) and not, rows longer than a thread's segment (37 > 16: the window carried across
// segments), enough image rows for dw's reduction to split (8 x 28 rows), and a 2x2 grid under a
// 7x7 kernel (gspn_hier's last stages).
// Shapes that reach the kernels' edges: widths that leave a partial last strip (4 or 7 columns)
// and a partial last block of strips (56 x 30, 15 x 29), images of at most 7 rows and rows
// narrower than k, channel counts that leave a partial last block of channels, that are even
// but not multiples of 4 or 8 (18, 108) or odd (one channel a load, no 2-channel threads at 3x3).
// bf16 7x7 on images of at most 16 x 16 with C a multiple of 8 takes the whole-image kernels
// (kernels/cuda/dwconv_plane.cu; dw where C is a multiple of 16): the four shapes from
// 14 x 14 x 96 give them 32, 16 and 8 channels a block, even and odd widths and each flag set,
// and 2 x 2 and 1 x 1 images (narrower than the 7 taps: the dw window's columns past the image).
// On 9 to 16 columns their y / dx and dw passes are the tensor-core ones (dwconv_plane_mma.cu):
// 14 x 14 x 96, 11 x 16 x 32, 16 x 15 x 56 and 16 x 16 x 40 give them 16 and 8 channels a block,
// odd rows and columns, the most units a thread stages (16 x 16), and each flag set.
// So does 3x3 on fp32 activations (both weight dtypes), forward and the one-pass backward: the
// 3x3 shapes up to 16 x 16 with C a multiple of 8. Larger bf16 7x7 grids with
// C a multiple of 8 take the tensor-core kernel (kernels/cuda/dwconv_mma.cu); the three shapes
// from 28 x 28 x 16 give it each flag set. Its dw pass takes the other bf16 7x7 shapes with C a
// multiple of 8 (grids from 2 x 2 to 56 x 30, rows past 16 columns, row blocks past 16 rows).
// Modes: all fp32, all bf16, and fp32 x with bf16 weights (the LPUs on the residual stream),
// whose fp32 arithmetic on the same rounded weights is held to fp32's bound.
// Shapes take turns with the flags: none, DWCONV_RESIDUAL, and that with DWCONV_WRITE_DX (dx's
// random prior values must then be ignored).
static void test_dwconv_matches_cpu(void **state) {
    static const int shapes[][5] = {{2, 9, 7, 16, 3},   {1, 6, 11, 5, 5},  {4, 14, 14, 64, 3},
                                    {2, 5, 37, 40, 7},  {8, 28, 28, 48, 7}, {3, 4, 5, 33, 1},
                                    {4, 2, 2, 24, 7},   {2, 56, 30, 24, 7}, {3, 7, 7, 72, 3},
                                    {2, 16, 9, 20, 5},  {1, 15, 29, 144, 7}, {2, 9, 13, 18, 7},
                                    {1, 30, 28, 108, 3},  {2, 28, 28, 16, 7}, {3, 29, 33, 32, 7},
                                    {2, 40, 28, 8, 7},  {3, 14, 14, 96, 7}, {2, 7, 7, 48, 7},
                                    {2, 11, 16, 32, 7}, {1, 16, 15, 56, 7}, {2, 16, 16, 48, 3},
                                    {3, 5, 12, 40, 3},  {2, 14, 14, 32, 3}, {3, 2, 2, 64, 7},
                                    {2, 1, 1, 32, 7},   {2, 3, 2, 48, 3},   {2, 16, 16, 40, 7}};   // B H W C k
    const int nshapes = (int)(sizeof shapes / sizeof shapes[0]);
    for (int mi = 0; mi < 3; mi++)
        for (int si = 0; si < nshapes; si++) {
            DType xt = mi == 1 ? DTYPE_BF16 : DTYPE_F32, wt = mi == 0 ? DTYPE_F32 : DTYPE_BF16;
            DType mode = xt;   // the tolerance: the activations' dtype
            int B = shapes[si][0], hgt = shapes[si][1], wid = shapes[si][2], C = shapes[si][3],
                k = shapes[si][4];
            const int flag_sets[3] = {0, DWCONV_RESIDUAL, DWCONV_RESIDUAL | DWCONV_WRITE_DX};
            const int flags = flag_sets[si % 3];
            printf("  x %s, w %s (%d,%d,%d,%d) k%d flags %d\n", dtype_name(xt), dtype_name(wt), B, hgt,
                   wid, C, k, flags);
            Tensor *x = rnd(HT(B, hgt, wid, C), 1, -1, 1, xt), *w = rnd(HT(C, 1, k, k), 2, -1, 1, wt);
            Tensor *b = rnd(HT(C), 3, -1, 1, wt), *y = HT(B, hgt, wid, C), *gy = dev_zeros(y, xt);
            const int fwd_flags = flags & DWCONV_RESIDUAL;
            cpu_dwconv_fwd(&H, x, NULL, NULL, NULL, w, b, fwd_flags, NULL, y);
            cuda_dwconv_fwd(&G, dev(x, xt), NULL, NULL, NULL, dev(w, wt), dev(b, wt), fwd_flags, NULL, gy);
            check("dwconv_fwd.y", mode, gy, y);
            Tensor *ys = HT(B, hgt, wid, C), *gys = dev_zeros(ys, xt);   // the mixer's conv + SiLU
            cpu_dwconv_fwd(&H, x, NULL, NULL, NULL, w, b, DWCONV_SILU, NULL, ys);
            cuda_dwconv_fwd(&G, dev(x, xt), NULL, NULL, NULL, dev(w, wt), dev(b, wt), DWCONV_SILU, NULL, gys);
            check("dwconv_fwd.y_silu", mode, gys, ys);
            Tensor *dy = rnd(HT(B, hgt, wid, C), 4, -1, 1, xt), *dx = rnd(HT(B, hgt, wid, C), 5, -1, 1, xt);
            Tensor *dw = rnd(HT(C, 1, k, k), 6, -1, 1, DTYPE_F32), *db = rnd(HT(C), 7, -1, 1, DTYPE_F32);
            Tensor *gdx = dev(dx, xt), *gdw = dev(dw, DTYPE_F32), *gdb = dev(db, DTYPE_F32);
            cpu_dwconv_bwd(&H, dy, x, w, flags, dx, dw, db);
            cuda_dwconv_bwd(&G, dev(dy, xt), dev(x, xt), dev(w, wt), flags, gdx, gdw, gdb);
            check("dwconv_bwd.dx", mode, gdx, dx);
            check("dwconv_bwd.dw", mode, gdw, dw);
            check("dwconv_bwd.db", mode, gdb, db);
            release_all();
        }
}

// dwconv_fwd's added input (the up projection onto the stream, then the LPU): against the CPU, and
// bit for bit against linear_residual_fwd then dwconv_fwd on the GPU (mid and y), which the kernels
// must reproduce (narrow_dot.cuh). gspn_t's four LPU grids at its widths (the row kernel at
// 56 x 56 and 28 x 28, the whole-image kernel at 14 x 14 and 7 x 7), a partial strip and odd
// channels (one channel a thread), 108 channels (even, not a multiple of 8: the row kernel on a
// small image), an odd small image (one column a thread), no ub and no mid; then the shapes the
// kernels do not take (3 proxy channels; bf16 activations, where the two ops round x' and the
// CPU does not: the two-op comparison alone), which run as the two ops. fp32 weights, and bf16
// weights on the fp32 stream (a bf16 run).
static void test_dwconv_added_input_matches_cpu_and_the_two_ops(void **state) {
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
            cpu_dwconv_fwd(&H, x, u, uw, ub, w, b, DWCONV_RESIDUAL, mid, y);
            cuda_dwconv_fwd(&G, gx, gu, guw, gub, gw, gb, DWCONV_RESIDUAL, gmid, gy);
            if (xt == DTYPE_F32) {
                if (with_mid) check("dwconv_fwd.mid", xt, gmid, mid);
                check("dwconv_fwd.y_added", xt, gy, y);
            }
            Tensor *gmid2 = dev_zeros(mid, xt), *gy2 = dev_zeros(y, xt);
            cuda_linear_residual_fwd(&G, gu, guw, gub, gx, gmid2);
            cuda_dwconv_fwd(&G, gmid2, NULL, NULL, NULL, gw, gb, DWCONV_RESIDUAL, NULL, gy2);
            if (with_mid) assert_same_bits("mid against linear_residual_fwd", gmid2, download_raw(gmid));
            assert_same_bits("y against the two ops", gy2, download_raw(gy));
            release_all();
        }
}

// Two backward calls give bitwise the same dx, dw and db: fixed-order sums, no atomics. 30 x 30:
// the tensor-core dw pass of row blocks; 14 x 14: the whole-image one of resident blocks.
static void test_dwconv_bwd_is_deterministic(void **state) {
    static const int sides[] = {30, 14};
    for (int si = 0; si < 2; si++) {
        const int B = 5, hgt = sides[si], wid = sides[si], C = 48, k = 7;
        Tensor *x = rnd(HT(B, hgt, wid, C), 1, -1, 1, DTYPE_BF16), *w = rnd(HT(C, 1, k, k), 2, -1, 1, DTYPE_BF16);
        Tensor *dy = rnd(HT(B, hgt, wid, C), 4, -1, 1, DTYPE_BF16);
        Tensor *gx = dev(x, DTYPE_BF16), *gw = dev(w, DTYPE_BF16), *gdy = dev(dy, DTYPE_BF16);
        float *out[2][3];
        for (int run = 0; run < 2; run++) {
            Tensor *gdx = dev_zeros(x, DTYPE_BF16), *gdw = dev_zeros(w, DTYPE_F32);
            Tensor *gdb = dev_zeros(HT(C), DTYPE_F32);
            cuda_dwconv_bwd(&G, gdy, gx, gw, DWCONV_RESIDUAL, gdx, gdw, gdb);
            out[run][0] = tensor_to_host_f32(&G, gdx);
            out[run][1] = tensor_to_host_f32(&G, gdw);
            out[run][2] = tensor_to_host_f32(&G, gdb);
        }
        const size_t n[3] = {x->numel, w->numel, (size_t)C};
        for (int q = 0; q < 3; q++) {
            assert_memory_equal(out[0][q], out[1][q], n[q] * sizeof(float));
            free(out[0][q]);
            free(out[1][q]);
        }
        release_all();
    }
}

// conv2d for the stem (NCHW image, 3x3 stride 2: RGB and grey with 8k outputs, the direct stem
// kernels, one case over several of their blocks; 6 outputs, the columns), downsampling
// (channels-last 3x3 stride 2, 16 channels: the 8-channel vector path), 2x2 patch merging and an
// odd channel count at stride 1,
// in fp32, in bf16, and with an fp32 x under a bf16 weight (gspn_hier's fp32 stream); gspn_t's
// stem width (48) and the widest the stem kernels take (64, from 4 channels): y with and without
// kept columns (the same bits, or the tensor-core stem's against the CPU), then dx, dw, db added
// to prior values, dx written over garbage, and dw, db alone (no dx, as for an image).
static void test_conv2d_matches_cpu(void **state) {
    static const int cases[][9] = {{1, 2, 3, 16, 12, 8, 3, 2, 1}, {1, 2, 1, 9, 7, 16, 3, 2, 1},
                                   {1, 3, 3, 50, 66, 24, 3, 2, 1}, {1, 2, 3, 9, 11, 6, 3, 2, 1},
                                   {0, 2, 16, 14, 14, 24, 3, 2, 1}, {0, 3, 8, 8, 10, 12, 2, 2, 0},
                                   {0, 1, 5, 7, 7, 6, 3, 1, 1},     {1, 2, 3, 32, 40, 48, 3, 2, 1},
                                   {1, 1, 4, 20, 18, 64, 3, 2, 1}};
    // nchw B C H W Cout k s p
    const int ncases = (int)(sizeof cases / sizeof cases[0]);
    for (int mi = 0; mi < 3; mi++)
        for (int ci = 0; ci < ncases; ci++) {
            const DType dt = mi == 0 ? DTYPE_F32 : DTYPE_BF16, xdt = mi == 1 ? DTYPE_BF16 : DTYPE_F32;
            const int *q = cases[ci];
            int nchw = q[0], B = q[1], C = q[2], hgt = q[3], wid = q[4], Co = q[5], k = q[6], st = q[7], pd = q[8];
            int Ho = (hgt + 2 * pd - k) / st + 1, Wo = (wid + 2 * pd - k) / st + 1;
            printf("  w %s, x %s: %s (%d,%d,%d,%d) -> %d, k%d s%d p%d\n", dtype_name(dt), dtype_name(xdt),
                   nchw ? "NCHW" : "NHWC", B, C, hgt, wid, Co, k, st, pd);
            Tensor *x = nchw ? HT(B, C, hgt, wid) : HT(B, hgt, wid, C);
            rnd(x, 1, -1, 1, dt);   // bf16 values when the columns are bf16, whatever x's dtype
            Tensor *w = rnd(HT(Co, C, k, k), 2, -1, 1, dt), *b = rnd(HT(Co), 3, -1, 1, dt);
            Tensor *cols = HT(B * Ho * Wo, C * k * k), *y = HT(B, Ho, Wo, Co);
            Tensor *gw = dev(w, dt), *gcols = dev_zeros(cols, dt), *gy = dev_zeros(y, dt);
            Tensor *gy2 = dev_zeros(y, dt);
            cpu_conv2d_fwd(&H, x, w, b, nchw, st, pd, cols, y);
            cuda_conv2d_fwd(&G, dev(x, xdt), gw, dev(b, dt), nchw, st, pd, gcols, gy);
            check("conv2d_fwd.y", dt, gy, y);
            cuda_conv2d_fwd(&G, dev(x, xdt), gw, dev(b, dt), nchw, st, pd, NULL, gy2);
            // Without kept columns the same bits, except where the stem's tensor-core kernel runs
            // (an image of 1, 3 or 4 channels, 3x3, bf16 w, Cout a multiple of 8 up to 64), whose
            // sums go in the tensor cores' order: there against the CPU.
            if (nchw && k == 3 && C != 2 && C <= 4 && dt == DTYPE_BF16 && Co % 8 == 0 && Co <= 64)
                check("conv2d_fwd.y", dt, gy2, y);
            else
                assert_same_bits("conv2d_fwd.y without kept columns", gy, download_raw(gy2));

            Tensor *dy = rnd(HT(B, Ho, Wo, Co), 4, -1, 1, dt);
            Tensor *dx = rnd(nchw ? HT(B, C, hgt, wid) : HT(B, hgt, wid, C), 5, -1, 1, xdt);
            Tensor *dw = rnd(HT(Co, C, k, k), 6, -1, 1, DTYPE_F32), *db = rnd(HT(Co), 7, -1, 1, DTYPE_F32);
            Tensor *gdy = dev(dy, dt), *gdx = dev(dx, xdt), *gdw = dev(dw, DTYPE_F32), *gdb = dev(db, DTYPE_F32);
            Tensor *dx_w = HT(B, nchw ? C : hgt, nchw ? hgt : wid, nchw ? wid : C);
            Tensor *gdx_w = dev(rnd(HT(B, nchw ? C : hgt, nchw ? hgt : wid, nchw ? wid : C), 8, -1e3, 1e3, xdt), xdt);
            cpu_conv2d_bwd(&H, dy, cols, w, nchw, st, pd, 0, dx, dw, db);
            cuda_conv2d_bwd(&G, gdy, gcols, gw, nchw, st, pd, 0, gdx, gdw, gdb);
            const char *dx_name = dt == DTYPE_BF16 && xdt == DTYPE_F32 ? "conv2d_bwd.dx_f32" : "conv2d_bwd.dx";
            check(dx_name, dt, gdx, dx);
            check("conv2d_bwd.dw", dt, gdw, dw);
            check("conv2d_bwd.db", dt, gdb, db);
            cpu_conv2d_bwd(&H, dy, cols, w, nchw, st, pd, CONV2D_WRITE_DX, dx_w, NULL, NULL);
            cuda_conv2d_bwd(&G, gdy, gcols, gw, nchw, st, pd, CONV2D_WRITE_DX, gdx_w, NULL, NULL);
            check(dx_name, dt, gdx_w, dx_w);
            Tensor *dw2 = HT(Co, C, k, k), *db2 = HT(Co), *gdw2 = dev_zeros(dw2, DTYPE_F32), *gdb2 = dev_zeros(db2, DTYPE_F32);
            cpu_conv2d_bwd(&H, dy, cols, w, nchw, st, pd, 0, NULL, dw2, db2);
            cuda_conv2d_bwd(&G, gdy, gcols, gw, nchw, st, pd, 0, NULL, gdw2, gdb2);
            check("conv2d_bwd.dw", dt, gdw2, dw2);
            check("conv2d_bwd.db", dt, gdb2, db2);
            release_all();
        }
}

// ---- token layout ------------------------------------------------------------------------------------

static void test_token_ops_match_cpu(void **state) {
    static const int channels[] = {6, 64};
    const int B = 2, N = 7, P = 1, start = 1, count = 5;
    for (int mi = 0; mi < 2; mi++)
        for (int ci = 0; ci < 2; ci++) {
            DType dt = MODES[mi];
            int C = channels[ci];
            printf("  %s B=%d N=%d C=%d\n", dtype_name(dt), B, N, C);
            Tensor *x = rnd(HT(B, N, C), 1, -1, 1, dt), *pre = rnd(HT(P, C), 2, -1, 1, dt);
            Tensor *gx = dev(x, dt);
            Tensor *y = HT(B, P + N, C), *gy = dev_zeros(y, dt);
            cpu_concat_prefix_fwd(&H, pre, x, y);
            cuda_concat_prefix_fwd(&G, dev(pre, dt), gx, gy);
            check("concat_prefix_fwd.y", dt, gy, y);
            Tensor *dy = rnd(HT(B, P + N, C), 3, -1, 1, dt), *gdy = dev(dy, dt);
            Tensor *dpre = rnd(HT(P, C), 4, -1, 1, DTYPE_F32), *dx = rnd(HT(B, N, C), 5, -1, 1, dt);
            Tensor *gdpre = dev(dpre, DTYPE_F32), *gdx = dev(dx, dt);
            Tensor *gdpre_only = dev(dpre, DTYPE_F32), *gdx_only = dev(dx, dt);
            cpu_concat_prefix_bwd(&H, dy, dpre, dx);
            cuda_concat_prefix_bwd(&G, gdy, gdpre, gdx);
            cuda_concat_prefix_bwd(&G, gdy, gdpre_only, NULL);
            cuda_concat_prefix_bwd(&G, gdy, NULL, gdx_only);
            check("concat_prefix_bwd.dprefix", dt, gdpre, dpre);
            check("concat_prefix_bwd.dx", dt, gdx, dx);
            check("concat_prefix_bwd.dprefix", dt, gdpre_only, dpre);
            check("concat_prefix_bwd.dx", dt, gdx_only, dx);

            Tensor *s = HT(B, count, C), *gs = dev_zeros(s, dt);
            cpu_slice_tokens_fwd(&H, x, start, s);
            cuda_slice_tokens_fwd(&G, gx, start, gs);
            check("slice_tokens_fwd.y", dt, gs, s);
            Tensor *ds = rnd(HT(B, count, C), 6, -1, 1, dt), *dx2 = rnd(HT(B, N, C), 7, -1, 1, dt);
            Tensor *gdx2 = dev(dx2, dt);
            cpu_slice_tokens_bwd(&H, ds, start, dx2);
            cuda_slice_tokens_bwd(&G, dev(ds, dt), start, gdx2);
            check("slice_tokens_bwd.dx", dt, gdx2, dx2);

            Tensor *m = HT(B, C), *gm = dev_zeros(m, dt);
            cpu_mean_tokens_fwd(&H, x, m);
            cuda_mean_tokens_fwd(&G, gx, gm);
            check("mean_tokens_fwd.y", dt, gm, m);
            Tensor *dm = rnd(HT(B, C), 8, -1, 1, dt), *dx3 = rnd(HT(B, N, C), 9, -1, 1, dt);
            Tensor *gdx3 = dev(dx3, dt);
            cpu_mean_tokens_bwd(&H, dm, dx3);
            cuda_mean_tokens_bwd(&G, dev(dm, dt), gdx3);
            check("mean_tokens_bwd.dx", dt, gdx3, dx3);
            release_all();
        }
}

// ---- bilinear resize ------------------------------------------------------------------------------

static void test_resize_bilinear_matches_cpu(void **state) {
    // (H, W) -> (H2, W2): mixed up/down, strong upsampling, identity, strong shrink, and the
    // curriculum's upsamplings: 27 -> 37 (378 -> 518 px at patch 14, not an integer ratio) and a
    // non-square 7x10 -> 10x14
    static const int grids[][4] = {{5, 7, 9, 4}, {3, 3, 7, 11}, {4, 6, 4, 6}, {13, 11, 4, 3},
                                   {27, 27, 37, 37}, {7, 10, 10, 14}};
    static const int channels[] = {6, 64};
    for (int mi = 0; mi < 2; mi++)
        for (int gi = 0; gi < (int)(sizeof grids / sizeof grids[0]); gi++)
            for (int ci = 0; ci < 2; ci++) {
                DType dt = MODES[mi];
                int Hh = grids[gi][0], W = grids[gi][1], H2 = grids[gi][2], W2 = grids[gi][3];
                int C = channels[ci];
                printf("  %s (2,%d,%d,%d) -> (2,%d,%d,%d)\n", dtype_name(dt), Hh, W, C, H2, W2, C);
                Tensor *x = rnd(HT(2, Hh, W, C), 1, -1, 1, dt);
                Tensor *y = HT(2, H2, W2, C), *gy = dev_zeros(y, dt);
                cpu_resize_bilinear_fwd(&H, x, y);
                cuda_resize_bilinear_fwd(&G, dev(x, dt), gy);
                check("resize_bilinear_fwd.y", dt, gy, y);
                Tensor *dy = rnd(HT(2, H2, W2, C), 2, -1, 1, dt), *dx = rnd(HT(2, Hh, W, C), 3, -1, 1, dt);
                Tensor *gdx = dev(dx, dt);
                cpu_resize_bilinear_bwd(&H, dy, dx);
                cuda_resize_bilinear_bwd(&G, dev(dy, dt), gdx);
                check("resize_bilinear_bwd.dx", dt, gdx, dx);
                release_all();
            }
}

// ---- losses -----------------------------------------------------------------------------------------

// Soft targets: positive rows that sum to 1 (label smoothing / mixup style).
static Tensor *soft_targets(int B, int K, uint64_t seed, DType dt) {
    Tensor *t = HT(B, K);
    test_fill(t, seed, 0.01f, 1.0f);
    float *p = t->data;
    for (int b = 0; b < B; b++) {
        double s = 0;
        for (int k = 0; k < K; k++) s += p[b * K + k];
        for (int k = 0; k < K; k++) p[b * K + k] = (float)(p[b * K + k] / s);
    }
    if (dt == DTYPE_BF16) gpu_test_round_to_bf16(t);
    return t;
}

static void test_cross_entropy_matches_cpu(void **state) {
    static const int shapes[][2] = {{7, 10}, {5, 64}, {3, 1155}};
    for (int mi = 0; mi < 2; mi++)
        for (int si = 0; si < 3; si++) {
            DType dt = MODES[mi];
            int B = shapes[si][0], K = shapes[si][1];
            printf("  %s (%d, %d)\n", dtype_name(dt), B, K);
            Tensor *logits = rnd(HT(B, K), 1, -4, 4, dt), *targets = soft_targets(B, K, 2, dt);
            Tensor *gt = dev(targets, dt);
            Tensor *loss = HT(1), *probs = HT(B, K);
            Tensor *gloss = dev_zeros(loss, DTYPE_F32), *gprobs = dev_zeros(probs, DTYPE_F32);
            cpu_cross_entropy_fwd(&H, logits, targets, loss, probs);
            cuda_cross_entropy_fwd(&G, dev(logits, dt), gt, gloss, gprobs);
            check("cross_entropy_fwd.loss", dt, gloss, loss);
            check("cross_entropy_fwd.probs", dt, gprobs, probs);
            Tensor *dloss = host_scalar(DLOSS), *dl = rnd(HT(B, K), 3, -1, 1, dt);
            Tensor *gdl = dev(dl, dt);
            cpu_cross_entropy_bwd(&H, dloss, probs, targets, dl);
            cuda_cross_entropy_bwd(&G, dev(dloss, DTYPE_F32), dev(probs, DTYPE_F32), gt, gdl);
            check("cross_entropy_bwd.dlogits", dt, gdl, dl);
            release_all();
        }
}

static void test_mse_matches_cpu(void **state) {
    static const int shapes[][2] = {{7, 1155}, {2, 21}, {300, 64}};
    for (int mi = 0; mi < 2; mi++)
        for (int si = 0; si < 3; si++) {
            DType dt = MODES[mi];
            int R = shapes[si][0], C = shapes[si][1];
            printf("  %s (%d, %d)\n", dtype_name(dt), R, C);
            Tensor *a = rnd(HT(R, C), 1, -1, 1, dt), *b = rnd(HT(R, C), 2, -1, 1, dt);
            Tensor *ga = dev(a, dt), *gb = dev(b, dt);
            Tensor *loss = HT(1), *gloss = dev_zeros(loss, DTYPE_F32);
            cpu_mse_fwd(&H, a, b, loss);
            cuda_mse_fwd(&G, ga, gb, gloss);
            check("mse_fwd.loss", dt, gloss, loss);
            Tensor *dloss = host_scalar(DLOSS), *gdloss = dev(dloss, DTYPE_F32);
            Tensor *da = rnd(HT(R, C), 3, -1e-3f, 1e-3f, dt), *db = rnd(HT(R, C), 4, -1e-3f, 1e-3f, dt);
            Tensor *gda = dev(da, dt), *gdb = dev(db, dt), *gda_only = dev(da, dt), *gdb_only = dev(db, dt);
            cpu_mse_bwd(&H, dloss, a, b, da, db);
            cuda_mse_bwd(&G, gdloss, ga, gb, gda, gdb);
            cuda_mse_bwd(&G, gdloss, ga, gb, gda_only, NULL);
            cuda_mse_bwd(&G, gdloss, ga, gb, NULL, gdb_only);
            check("mse_bwd.da", dt, gda, da);
            check("mse_bwd.db", dt, gdb, db);
            check("mse_bwd.da", dt, gda_only, da);
            check("mse_bwd.db", dt, gdb_only, db);
            release_all();
        }
}

static void test_token_kl_matches_cpu(void **state) {
    static const int shapes[][2] = {{7, 33}, {5, 64}, {7, 1155}, {2, 6}};
    for (int mi = 0; mi < 2; mi++)
        for (int si = 0; si < 4; si++) {
            DType dt = MODES[mi];
            int N = shapes[si][0], C = shapes[si][1];
            printf("  %s (%d, %d)\n", dtype_name(dt), N, C);
            Tensor *s = rnd(HT(N, C), 1, -2, 2, dt), *t = rnd(HT(N, C), 2, -2, 2, dt);
            Tensor *gs = dev(s, dt), *gt = dev(t, dt);
            Tensor *loss = HT(1), *gloss = dev_zeros(loss, DTYPE_F32);
            cpu_token_kl_fwd(&H, s, t, loss);
            cuda_token_kl_fwd(&G, gs, gt, gloss);
            check("token_kl_fwd.loss", dt, gloss, loss);
            Tensor *dloss = host_scalar(DLOSS), *gdloss = dev(dloss, DTYPE_F32);
            // priors of the size of the gradient (dloss / N times probabilities)
            float g = 0.1f / (float)(N * C);
            Tensor *ds = rnd(HT(N, C), 3, -g, g, dt), *dtt = rnd(HT(N, C), 4, -g, g, dt);
            Tensor *gds = dev(ds, dt), *gdt = dev(dtt, dt), *gds_only = dev(ds, dt), *gdt_only = dev(dtt, dt);
            cpu_token_kl_bwd(&H, dloss, s, t, ds, dtt);
            cuda_token_kl_bwd(&G, gdloss, gs, gt, gds, gdt);
            cuda_token_kl_bwd(&G, gdloss, gs, gt, gds_only, NULL);
            cuda_token_kl_bwd(&G, gdloss, gs, gt, NULL, gdt_only);
            check("token_kl_bwd.ds", dt, gds, ds);
            check("token_kl_bwd.dt", dt, gdt, dtt);
            check("token_kl_bwd.ds", dt, gds_only, ds);
            check("token_kl_bwd.dt", dt, gdt_only, dtt);
            release_all();
        }
}

// ---- optimizer --------------------------------------------------------------------------------------

static void test_sumsq_accumulates_and_matches_cpu(void **state) {
    static const int sizes[] = {8085, 6, 100003};
    for (int mi = 0; mi < 2; mi++)
        for (int si = 0; si < 3; si++) {
            DType dt = MODES[mi];
            printf("  %s n=%d\n", dtype_name(dt), sizes[si]);
            Tensor *x = rnd(HT(sizes[si]), 1, -1, 1, dt), *sum = host_scalar(1.5f);
            Tensor *gsum = dev(sum, DTYPE_F32);
            cpu_sumsq(&H, x, sum);
            cuda_sumsq(&G, dev(x, dt), gsum);
            check("sumsq.sum", dt, gsum, sum);
            release_all();
        }
}

// fp32 mode: fp32 parameter, no master. bf16 mode: bf16 parameter + fp32 master; the reference
// updates the master values in fp32.
static void test_adamw_matches_cpu_with_and_without_master(void **state) {
    static const int sizes[] = {8085, 5, 4096};
    for (int mi = 0; mi < 2; mi++)
        for (int si = 0; si < 3; si++) {
            DType dt = MODES[mi];
            int n = sizes[si];
            printf("  %s n=%d %s\n", dtype_name(dt), n, dt == DTYPE_BF16 ? "(master)" : "");
            Tensor *p = rnd(HT(n), 1, -0.5f, 0.5f, DTYPE_F32), *g = rnd(HT(n), 2, -1, 1, DTYPE_F32);
            Tensor *m = rnd(HT(n), 3, -0.1f, 0.1f, DTYPE_F32), *v = rnd(HT(n), 4, 0.0f, 0.01f, DTYPE_F32);
            Tensor *gp = dev(p, dt), *gmaster = dt == DTYPE_BF16 ? dev(p, DTYPE_F32) : NULL;
            Tensor *gg = dev(g, DTYPE_F32), *gm = dev(m, DTYPE_F32), *gv = dev(v, DTYPE_F32);
            AdamWArgs args = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                              .weight_decay = 0.05f, .grad_scale = 0.5f, .step = 3};
            cpu_adamw(&H, p, NULL, g, m, v, &args);
            cuda_adamw(&G, gp, gmaster, gg, gm, gv, &args);
            if (gmaster) check("adamw.master", dt, gmaster, p);
            check("adamw.param", dt, gp, p);
            check("adamw.m", dt, gm, m);
            check("adamw.v", dt, gv, v);
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

// ---- accumulation twice, determinism ----------------------------------------------------------------

// Calling a backward twice adds twice, on the CPU and the GPU alike.
static void test_backward_twice_accumulates_twice(void **state) {
    for (int mi = 0; mi < 2; mi++) {
        DType dt = MODES[mi];
        printf("  %s\n", dtype_name(dt));
        int N = 37, C = 1152;
        Tensor *x = rnd(HT(N, C), 1, -1, 3, dt), *w = rnd(HT(C), 2, 0.5f, 1.5f, dt);
        Tensor *y = HT(N, C), *mean = HT(N), *rstd = HT(N);
        cpu_layernorm_fwd(&H, x, w, NULL, 1e-5f, y, mean, rstd);
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

// Every reduction at a size with many blocks / partials, run twice from the same state.
static void test_reductions_are_bitwise_deterministic(void **state) {
    for (int mi = 0; mi < 2; mi++) {
        DType dt = MODES[mi];
        printf("  %s\n", dtype_name(dt));
        void *first;

        // LayerNorm backward: dx, dw, db over 4099 rows of 1152 (many blocks of partials)
        int N = 4099, C = 1152;
        Tensor *x = rnd(HT(N, C), 1, -1, 3, dt), *w = rnd(HT(C), 2, 0.5f, 1.5f, dt);
        Tensor *y = HT(N, C), *mean = HT(N), *rstd = HT(N);
        cpu_layernorm_fwd(&H, x, w, NULL, 1e-5f, y, mean, rstd);
        Tensor *dy = rnd(HT(N, C), 3, -1, 1, dt);
        Tensor *gx = dev(x, dt), *gw = dev(w, dt), *gdy = dev(dy, dt);
        Tensor *gm = dev(mean, DTYPE_F32), *gr = dev(rstd, DTYPE_F32);
        Tensor *gdx = dev_zeros(x, dt), *gdw = dev_zeros(w, DTYPE_F32), *gdb = dev_zeros(w, DTYPE_F32);
        cuda_layernorm_bwd(&G, gdy, gx, gw, gm, gr, gdx, gdw, gdb, NULL, NULL);
        void *dx1 = download_raw(gdx), *dw1 = download_raw(gdw), *db1 = download_raw(gdb);
        cuda_zero(&G, gdx);
        cuda_zero(&G, gdw);
        cuda_zero(&G, gdb);
        cuda_layernorm_bwd(&G, gdy, gx, gw, gm, gr, gdx, gdw, gdb, NULL, NULL);
        assert_same_bits("layernorm_bwd.dx", gdx, dx1);
        assert_same_bits("layernorm_bwd.dw", gdw, dw1);
        assert_same_bits("layernorm_bwd.db", gdb, db1);

        // layer scale dg and broadcast-add dp over the same rows (many row ranges)
        Tensor *gdg = dev_zeros(w, DTYPE_F32);
        cuda_layer_scale_bwd(&G, gdy, gx, gw, NULL, gdg);
        first = download_raw(gdg);
        cuda_zero(&G, gdg);
        cuda_layer_scale_bwd(&G, gdy, gx, gw, NULL, gdg);
        assert_same_bits("layer_scale_bwd.dg", gdg, first);
        cuda_zero(&G, gdg);
        cuda_add_bcast_bwd(&G, gdy, NULL, gdg);
        first = download_raw(gdg);
        cuda_zero(&G, gdg);
        cuda_add_bcast_bwd(&G, gdy, NULL, gdg);
        assert_same_bits("add_bcast_bwd.dp", gdg, first);

        // class-token gradient: a batch of 300 sequences of 8 tokens
        Tensor dyv = *gdy;   // (300, 8, 1152) view of the first 300*8 rows
        int tshape[3] = {300, 8, C};
        tensor_set_shape(&dyv, 3, tshape);
        Tensor *pre = HT(1, C), *gpre = dev_zeros(pre, DTYPE_F32);
        cuda_concat_prefix_bwd(&G, &dyv, gpre, NULL);
        first = download_raw(gpre);
        cuda_zero(&G, gpre);
        cuda_concat_prefix_bwd(&G, &dyv, gpre, NULL);
        assert_same_bits("concat_prefix_bwd.dprefix", gpre, first);

        // losses and sumsq over the 4.7M elements
        Tensor *loss = HT(1), *gloss = dev_zeros(loss, DTYPE_F32);
        cuda_mse_fwd(&G, gdy, gx, gloss);
        first = download_raw(gloss);
        cuda_mse_fwd(&G, gdy, gx, gloss);
        assert_same_bits("mse_fwd.loss", gloss, first);
        cuda_token_kl_fwd(&G, gdy, gx, gloss);
        first = download_raw(gloss);
        cuda_token_kl_fwd(&G, gdy, gx, gloss);
        assert_same_bits("token_kl_fwd.loss", gloss, first);
        Tensor *gt = dev(soft_targets(N, C, 4, dt), dt), *gprobs = dev_zeros(x, DTYPE_F32);
        cuda_cross_entropy_fwd(&G, gx, gt, gloss, gprobs);
        first = download_raw(gloss);
        cuda_cross_entropy_fwd(&G, gx, gt, gloss, gprobs);
        assert_same_bits("cross_entropy_fwd.loss", gloss, first);
        cuda_zero(&G, gloss);
        cuda_sumsq(&G, gdy, gloss);
        first = download_raw(gloss);
        cuda_zero(&G, gloss);
        cuda_sumsq(&G, gdy, gloss);
        assert_same_bits("sumsq", gloss, first);

        // resize backward 37x37 -> 74x74 (the curriculum's 2x)
        Tensor *rdy = rnd(HT(2, 74, 74, 64), 5, -1, 1, dt), *rdx = HT(2, 37, 37, 64);
        Tensor *grdy = dev(rdy, dt), *grdx = dev_zeros(rdx, dt);
        cuda_resize_bilinear_bwd(&G, grdy, grdx);
        first = download_raw(grdx);
        cuda_zero(&G, grdx);
        cuda_resize_bilinear_bwd(&G, grdy, grdx);
        assert_same_bits("resize_bilinear_bwd.dx", grdx, first);
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
        cmocka_unit_test(test_elementwise_ops_match_cpu),
        cmocka_unit_test(test_misaligned_views_take_the_scalar_path_correctly),
        cmocka_unit_test(test_add_bcast_matches_cpu),
        cmocka_unit_test(test_cast_colsum_matches_cpu),
        cmocka_unit_test(test_layer_scale_matches_cpu),
        cmocka_unit_test(test_layernorm_matches_cpu),
        cmocka_unit_test(test_layernorm_mixed_dtypes_match_cpu),
        cmocka_unit_test(test_add_layernorm_matches_cpu),
        cmocka_unit_test(test_gelu_matches_cpu),
        cmocka_unit_test(test_gelu_bf16_every_input),
        cmocka_unit_test(test_silu_matches_cpu),
        cmocka_unit_test(test_softmax_matches_cpu),
        cmocka_unit_test(test_attention_pool_matches_cpu),
        cmocka_unit_test(test_dwconv_matches_cpu),
        cmocka_unit_test(test_dwconv_bwd_is_deterministic),
        cmocka_unit_test(test_dwconv_added_input_matches_cpu_and_the_two_ops),
        cmocka_unit_test(test_conv2d_matches_cpu),
        cmocka_unit_test(test_token_ops_match_cpu),
        cmocka_unit_test(test_resize_bilinear_matches_cpu),
        cmocka_unit_test(test_cross_entropy_matches_cpu),
        cmocka_unit_test(test_mse_matches_cpu),
        cmocka_unit_test(test_token_kl_matches_cpu),
        cmocka_unit_test(test_sumsq_accumulates_and_matches_cpu),
        cmocka_unit_test(test_adamw_matches_cpu_with_and_without_master),
        cmocka_unit_test(test_adamw_decay_runs_match_cpu),
        cmocka_unit_test(test_backward_twice_accumulates_twice),
        cmocka_unit_test(test_reductions_are_bitwise_deterministic),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
