// CUDA linear ops (kernels/cuda/linear.cu, cuBLASLt) against the CPU reference
// (kernels/cpu/linear.c): linear forward and backward (dx, dw, db), linear + GELU (tanh: fused
// into cuBLASLt's epilogues; erf: GEMM then a GELU pass) forward and backward, the DGELU-fused
// backward, in fp32 and bf16, on odd shapes (K, M not
// multiples of 8, one row, 3-D x), with accumulation into non-zero gradients, backward twice,
// NULL gradients skipped, fused epilogues against their unfused fallbacks, and the plan cache.
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include "gpulib.h"
#include "../../kernels/cuda/cuda_gemm.h"

// fp32: cuBLASLt with CUBLAS_COMPUTE_32F (no TF32) does exact fp32 multiply-adds in another
// order than the CPU's blocked sgemm: ~1e-7 * sqrt(K) relative; an index or transpose error is
// of order 1.
#define FP32_TOL 1e-5
// Calling a backward twice from zero gradients: the second call adds the same values again
// (beta = 1 for dx, dw; db += scratch), so only the rounding of the sum may differ.
#define ACCUM_TOL 1e-6
// bf16 tolerances (inputs rounded to bf16 on the CPU side too, so both compute from identical
// values; the GPU accumulates in fp32):
// - activations written in bf16 (y, pre, dx, dpre): one rounding to bf16, at most 2^-9 per element,
//   ~1e-3 norm-wise on large tensors; an unfused fallback rounds twice (pre, then gelu(pre) or
//   + bias), up to 2 * 2^-9 = 3.9e-3 per element, which a 15-element tensor can nearly reach
//   norm-wise (3.7e-3 seen on the H200, linear_fwd+gelu_out y at N=5 K=7 M=3) -> 6e-3.
#define BF16_ACT_TOL 6e-3
// - parameter gradients (dw, db) in fp32 from bf16 products, which are exact in fp32: only the
//   accumulation order differs (~1e-6); 1e-4 leaves room for tensor-core accumulation.
#define BF16_PARAM_GRAD_TOL 1e-4
// - linear_bwd+gelu_out's dx, dw, db in bf16: dpre = dy * gelu'(pre) is rounded to bf16 before the
//   GEMMs (as an unfused gelu_bwd would hand it to the linear); the CPU keeps it fp32 -> act level.
#define BF16_GELU_GRAD_TOL BF16_ACT_TOL

typedef struct Tols {
    double act, param;   // activations and their gradients; parameter gradients
} Tols;
static const Tols FP32_TOLS = {FP32_TOL, FP32_TOL};
static const Tols BF16_TOLS = {BF16_ACT_TOL, BF16_PARAM_GRAD_TOL};
static const Tols *tols_for(DType dt) { return dt == DTYPE_BF16 ? &BF16_TOLS : &FP32_TOLS; }

typedef struct Case {
    int N, K, M;
    int x3d;   // x as (1, N, K): rows are read from any leading shape
} Case;

static const Case CASES[] = {
    {5, 7, 3, 0},        // K, M odd: 14- and 6-byte bf16 rows, nothing 16-byte aligned
    {1000, 96, 130, 0},  // M = 130 not a multiple of 8: the GELU aux epilogue cannot run (ld % 8)
    {33, 130, 96, 0},    // K = 130 not a multiple of 8: DGELU aux cannot run; dx rows unaligned
    {257, 64, 136, 1},   // every fused epilogue can run (K, M multiples of 8); x is 3-D
    {1, 8, 8, 0},        // one row
    {3001, 2, 96, 0},    // K = 2 (the propagation's proxy into its up projection): the narrow kernel
    {517, 3, 28, 1},     // K = 3, M = 28 (a gate width): the narrow kernel, 4 outputs a thread
    {700, 2, 392, 0},    // K = 2, M = 392: the narrow backward's dx from 4 column tiles' partials
    {3001, 144, 2, 0},   // M = 2 (the propagation's down projection): the narrow-output kernels
    {333, 136, 3, 1},    // M = 3, 17 chunks of 8 inputs a row; x is 3-D
    {513, 8, 1, 0},      // M = 1, one chunk a row (256 rows a block at a time)
    {65, 2000, 4, 0},    // M = 4, 250 chunks a row (one row a block at a time)
};
#define NCASES ((int)(sizeof CASES / sizeof CASES[0]))
// The GELU (MLP) tests take the cases before the narrow ones: no MLP has a layer 1 to 4 wide, and
// there fc1's bias gradient is a column sum of 2 or 3 columns of bf16 dpre over thousands of rows,
// whose cancellation alone leaves a relative error of 1e-2 (N = 3001: 1.4e-2).
#define NCASES_MLP 5

// ---- helpers ---------------------------------------------------------------------------------

static Tensor *host_x(const Case *c, int cols) {
    return c->x3d ? test_tensor(3, 1, c->N, cols) : test_tensor(2, c->N, cols);
}

// A host fp32 tensor filled in [-1, 1); rounded to bf16 values when `round` (its GPU copy is bf16).
static Tensor *host_rand(Tensor *t, uint64_t seed, int round) {
    test_fill(t, seed, -1.0f, 1.0f);
    if (round) gpu_test_round_to_bf16(t);
    return t;
}

static Tensor *host_copy(const Tensor *t) {
    Tensor *c = test_like(t);
    memcpy(c->data, t->data, t->numel * sizeof(float));
    return c;
}

// A GPU tensor of host's shape filled with NaN, for outputs the op must write in full.
static Tensor *gpu_poison(Ctx *ctx, const Tensor *host, DType dt) {
    Tensor *nan = test_like(host);
    for (size_t i = 0; i < nan->numel; i++) ((float *)nan->data)[i] = NAN;
    Tensor *g = gpu_test_upload(ctx, nan, dt);
    test_tensor_free(nan);
    return g;
}

// Compares and prints; returns 1 on failure (NaN fails).
static int check(Ctx *ctx, const char *op, const char *name, const Case *c, const Tensor *gpu,
                 const Tensor *cpu, double tol) {
    char what[96];
    snprintf(what, sizeof what, "%s %s N=%d K=%d M=%d", op, name, c->N, c->K, c->M);
    double e = gpu_test_compare(ctx, what, gpu, cpu);
    if (!(e <= tol)) {
        printf("    ^ FAILED: above tolerance %.1e\n", tol);
        return 1;
    }
    return 0;
}

// ---- linear ------------------------------------------------------------------------------------

static int check_linear_fwd(Ctx *g, const Case *c, DType dt, int bias, uint64_t seed) {
    Ctx cpu = ctx_cpu();
    int r = dt == DTYPE_BF16;
    Tensor *x = host_rand(host_x(c, c->K), seed, r);
    Tensor *w = host_rand(test_tensor(2, c->M, c->K), seed + 1, r);
    Tensor *b = host_rand(test_tensor(1, c->M), seed + 2, r);
    Tensor *y = host_x(c, c->M);
    cpu_linear_fwd(&cpu, x, w, bias ? b : NULL, NULL, y);

    Tensor *gx = gpu_test_upload(g, x, dt), *gw = gpu_test_upload(g, w, dt);
    Tensor *gb = gpu_test_upload(g, b, dt), *gy = gpu_poison(g, y, dt);
    op_linear_fwd(g, gx, gw, bias ? gb : NULL, NULL, gy);
    int fails = check(g, bias ? "linear_fwd" : "linear_fwd(no b)", "y", c, gy, y, tols_for(dt)->act);

    gpu_test_free(gx); gpu_test_free(gw); gpu_test_free(gb); gpu_test_free(gy);
    test_tensor_free(x); test_tensor_free(w); test_tensor_free(b); test_tensor_free(y);
    return fails;
}

// Backward twice onto non-zero gradients; `mask` picks dx (1), dw (2), db (4); the rest NULL.
static int check_linear_bwd(Ctx *g, const Case *c, DType dt, int mask, uint64_t seed) {
    Ctx cpu = ctx_cpu();
    int r = dt == DTYPE_BF16;
    Tensor *x = host_rand(host_x(c, c->K), seed, r);
    Tensor *w = host_rand(test_tensor(2, c->M, c->K), seed + 1, r);
    Tensor *dy = host_rand(host_x(c, c->M), seed + 2, r);
    Tensor *dx = host_rand(host_x(c, c->K), seed + 3, r);      // act dtype on the GPU
    Tensor *dw = host_rand(test_tensor(2, c->M, c->K), seed + 4, 0);   // fp32 on the GPU
    Tensor *db = host_rand(test_tensor(1, c->M), seed + 5, 0);
    Tensor *gx = gpu_test_upload(g, x, dt), *gw = gpu_test_upload(g, w, dt);
    Tensor *gdy = gpu_test_upload(g, dy, dt), *gdx = gpu_test_upload(g, dx, dt);
    Tensor *gdw = gpu_test_upload(g, dw, DTYPE_F32), *gdb = gpu_test_upload(g, db, DTYPE_F32);
    for (int rep = 0; rep < 2; rep++) {
        cpu_linear_bwd(&cpu, dy, x, w, 0, NULL, mask & 1 ? dx : NULL, mask & 2 ? dw : NULL,
                       mask & 4 ? db : NULL);
        op_linear_bwd(g, gdy, gx, gw, 0, NULL, mask & 1 ? gdx : NULL, mask & 2 ? gdw : NULL,
                      mask & 4 ? gdb : NULL);
    }
    char op[32];
    snprintf(op, sizeof op, "linear_bwd[%s%s%s]", mask & 1 ? "dx" : "", mask & 2 ? "dw" : "",
             mask & 4 ? "db" : "");
    const Tols *t = tols_for(dt);
    // Every gradient is compared, the NULL ones too: they must keep their initial values.
    int fails = check(g, op, "dx", c, gdx, dx, t->act) + check(g, op, "dw", c, gdw, dw, t->param) +
                check(g, op, "db", c, gdb, db, t->param);

    Tensor *gpu[] = {gx, gw, gdy, gdx, gdw, gdb}, *host[] = {x, w, dy, dx, dw, db};
    for (int i = 0; i < 6; i++) { gpu_test_free(gpu[i]); test_tensor_free(host[i]); }
    return fails;
}

// linear_bwd with LINEAR_WRITE_DX: dx starts as NaN and must be overwritten (beta = 0), dw and db still add.
static int check_linear_bwd_write(Ctx *g, const Case *c, DType dt, uint64_t seed) {
    Ctx cpu = ctx_cpu();
    int r = dt == DTYPE_BF16;
    Tensor *x = host_rand(host_x(c, c->K), seed, r);
    Tensor *w = host_rand(test_tensor(2, c->M, c->K), seed + 1, r);
    Tensor *dy = host_rand(host_x(c, c->M), seed + 2, r);
    Tensor *dx = host_rand(host_x(c, c->K), seed + 3, r);   // the CPU op overwrites it too
    Tensor *dw = host_rand(test_tensor(2, c->M, c->K), seed + 4, 0);
    Tensor *db = host_rand(test_tensor(1, c->M), seed + 5, 0);
    Tensor *gx = gpu_test_upload(g, x, dt), *gw = gpu_test_upload(g, w, dt);
    Tensor *gdy = gpu_test_upload(g, dy, dt), *gdx = gpu_poison(g, dx, dt);
    Tensor *gdw = gpu_test_upload(g, dw, DTYPE_F32), *gdb = gpu_test_upload(g, db, DTYPE_F32);
    cpu_linear_bwd(&cpu, dy, x, w, LINEAR_WRITE_DX, NULL, dx, dw, db);
    op_linear_bwd(g, gdy, gx, gw, LINEAR_WRITE_DX, NULL, gdx, gdw, gdb);
    const Tols *t = tols_for(dt);
    int fails = check(g, "linear_bwd (dx written)", "dx", c, gdx, dx, t->act) +
                check(g, "linear_bwd (dx written)", "dw", c, gdw, dw, t->param) +
                check(g, "linear_bwd (dx written)", "db", c, gdb, db, t->param);
    Tensor *gpu[] = {gx, gw, gdy, gdx, gdw, gdb}, *host[] = {x, w, dy, dx, dw, db};
    for (int i = 0; i < 6; i++) { gpu_test_free(gpu[i]); test_tensor_free(host[i]); }
    return fails;
}

// An fp32 dy under bf16 x and w (the residual stream's gradient into a bf16 branch), written
// (`write`) or added: dx and dw from dy rounded to bf16, db from its fp32 values, as a bf16 copy
// of dy with its column sums (cast_colsum) would give. Tolerances: dx one bf16 rounding; dw exact
// products summed in fp32 (BF16_PARAM_GRAD_TOL); db fp32 sums of the same values (FP32_TOL).
// Measured on an H100 over every case: dx at most 3.1e-3, dw 2.1e-7, db 1.3e-6.
static int check_linear_bwd_fp32_dy(Ctx *g, const Case *c, int write, uint64_t seed) {
    Ctx cpu = ctx_cpu();
    Tensor *x = host_rand(host_x(c, c->K), seed, 1);
    Tensor *w = host_rand(test_tensor(2, c->M, c->K), seed + 1, 1);
    Tensor *dy = host_rand(host_x(c, c->M), seed + 2, 0), *dyr = host_copy(dy);
    gpu_test_round_to_bf16(dyr);
    Tensor *dx = host_rand(host_x(c, c->K), seed + 3, 1);
    Tensor *dw = host_rand(test_tensor(2, c->M, c->K), seed + 4, 0);
    Tensor *db = host_rand(test_tensor(1, c->M), seed + 5, 0);
    Tensor *gx = gpu_test_upload(g, x, DTYPE_BF16), *gw = gpu_test_upload(g, w, DTYPE_BF16);
    Tensor *gdy = gpu_test_upload(g, dy, DTYPE_F32);
    Tensor *gdx = write ? gpu_poison(g, dx, DTYPE_BF16) : gpu_test_upload(g, dx, DTYPE_BF16);
    Tensor *gdw = gpu_test_upload(g, dw, DTYPE_F32), *gdb = gpu_test_upload(g, db, DTYPE_F32);
    cpu_linear_bwd(&cpu, dyr, x, w, write ? LINEAR_WRITE_DX : 0, NULL, dx, dw, NULL);
    cpu_linear_bwd(&cpu, dy, x, w, 0, NULL, NULL, NULL, db);
    op_linear_bwd(g, gdy, gx, gw, write ? LINEAR_WRITE_DX : 0, NULL, gdx, gdw, gdb);
    const char *op = write ? "linear_bwd (dx written, fp32 dy)" : "linear_bwd(fp32 dy)";
    int fails = check(g, op, "dx", c, gdx, dx, BF16_ACT_TOL) +
                check(g, op, "dw", c, gdw, dw, BF16_PARAM_GRAD_TOL) +
                check(g, op, "db", c, gdb, db, FP32_TOL);
    Tensor *gpu[] = {gx, gw, gdy, gdx, gdw, gdb}, *host[] = {x, w, dy, dyr, dx, dw, db};
    for (int i = 0; i < 6; i++) gpu_test_free(gpu[i]);
    for (int i = 0; i < 7; i++) test_tensor_free(host[i]);
    return fails;
}

static void test_linear_backward_takes_fp32_dy_under_bf16(void **state) {
    GPU_TEST_REQUIRE_DEVICE();
    Ctx g = cuda_ctx_create(0, DTYPE_BF16);
    int fails = 0;
    for (int i = 0; i < NCASES; i++)   // the narrow kernel and the cast-then-GEMM path
        for (int write = 0; write < 2; write++) fails += check_linear_bwd_fp32_dy(&g, &CASES[i], write, 200 + 13 * i);
    cuda_ctx_destroy(&g);
    assert_int_equal(fails, 0);
}

// linear_fwd / linear_bwd with silu_in against the CPU's silu then linear, with the GPU's
// roundings made on the CPU side too in bf16 (silu(x) rounded before the products, dy w rounded
// before silu'): y and dx then differ by one final rounding (act tolerance), dw and db by the
// order of fp32 sums. dx starts NaN: it is written. Measured on an H100 over every case: bf16 y
// and dx at most 1.7e-3, fp32 y 6.0e-7 and dx 2.9e-7, dw 1.4e-6, db 3.1e-7.
static int check_linear_silu_in(Ctx *g, const Case *c, DType dt, uint64_t seed) {
    Ctx cpu = ctx_cpu();
    int r = dt == DTYPE_BF16;
    Tensor *x = host_rand(host_x(c, c->K), seed, r);
    Tensor *w = host_rand(test_tensor(2, c->M, c->K), seed + 1, r);
    Tensor *b = host_rand(test_tensor(1, c->M), seed + 2, r);
    Tensor *dy = host_rand(host_x(c, c->M), seed + 3, r);
    Tensor *sx = host_x(c, c->K), *y = host_x(c, c->M), *gd = host_x(c, c->K), *dx = host_x(c, c->K);
    Tensor *dw = host_rand(test_tensor(2, c->M, c->K), seed + 4, 0);
    Tensor *db = host_rand(test_tensor(1, c->M), seed + 5, 0);
    Tensor *gx = gpu_test_upload(g, x, dt), *gw = gpu_test_upload(g, w, dt), *gb = gpu_test_upload(g, b, dt);
    Tensor *gdy = gpu_test_upload(g, dy, dt), *gy = gpu_poison(g, y, dt), *gdx = gpu_poison(g, dx, dt);
    Tensor *gdw = gpu_test_upload(g, dw, DTYPE_F32), *gdb = gpu_test_upload(g, db, DTYPE_F32);
    cpu_silu_fwd(&cpu, x, sx);
    if (r) gpu_test_round_to_bf16(sx);
    cpu_linear_fwd(&cpu, sx, w, b, NULL, y);
    memset(gd->data, 0, gd->numel * sizeof(float));
    cpu_linear_bwd(&cpu, dy, sx, w, 0, NULL, gd, NULL, NULL);
    if (r) gpu_test_round_to_bf16(gd);
    memset(dx->data, 0, dx->numel * sizeof(float));
    cpu_silu_bwd(&cpu, gd, x, dx);
    for (int rep = 0; rep < 2; rep++) cpu_linear_bwd(&cpu, dy, sx, w, 0, NULL, NULL, dw, db);
    const LinearFwdOpts silu_fwd = {.silu_in = 1};
    const LinearBwdOpts silu_bwd = {.silu_in = 1};
    op_linear_fwd(g, gx, gw, gb, &silu_fwd, gy);
    op_linear_bwd(g, gdy, gx, gw, 0, &silu_bwd, gdx, gdw, gdb);
    op_linear_bwd(g, gdy, gx, gw, 0, &silu_bwd, gdx, gdw, gdb);   // dx written again, dw and db added twice
    const Tols *t = tols_for(dt);
    int fails = check(g, "linear_fwd+silu_in", "y", c, gy, y, t->act) +
                check(g, "linear_bwd+silu_in", "dx", c, gdx, dx, t->act) +
                check(g, "linear_bwd+silu_in", "dw", c, gdw, dw, t->param) +
                check(g, "linear_bwd+silu_in", "db", c, gdb, db, t->param);
    Tensor *gpu[] = {gx, gw, gb, gdy, gy, gdx, gdw, gdb}, *host[] = {x, w, b, dy, sx, y, gd, dx, dw, db};
    for (int i = 0; i < 8; i++) gpu_test_free(gpu[i]);
    for (int i = 0; i < 10; i++) test_tensor_free(host[i]);
    return fails;
}

static void test_silu_linear_matches_cpu(void **state) {
    GPU_TEST_REQUIRE_DEVICE();
    int fails = 0;
    for (int d = 0; d < 2; d++) {
        DType dt = d ? DTYPE_BF16 : DTYPE_F32;
        Ctx g = cuda_ctx_create(0, dt);
        for (int i = 0; i < NCASES; i++) fails += check_linear_silu_in(&g, &CASES[i], dt, 300 + 17 * i);
        cuda_ctx_destroy(&g);
    }
    assert_int_equal(fails, 0);
}

// linear_fwd onto res: y (fp32, starts NaN) = res (fp32) + x w^T + b, the GEMM reading res as C.
// The CPU adds the fp32 product to res; the fused GPU path does the same in the epilogue (only
// the accumulation order differs), its fallback rounds the product to the activation dtype first.
static int check_linear_res_fwd(Ctx *g, const Case *c, DType dt, int bias, uint64_t seed) {
    Ctx cpu = ctx_cpu();
    int r = dt == DTYPE_BF16;
    Tensor *x = host_rand(host_x(c, c->K), seed, r);
    Tensor *w = host_rand(test_tensor(2, c->M, c->K), seed + 1, r);
    Tensor *b = host_rand(test_tensor(1, c->M), seed + 2, r);
    Tensor *res = host_rand(host_x(c, c->M), seed + 3, 0);
    Tensor *y = host_x(c, c->M);
    const LinearFwdOpts onto_res = {.res = res};
    cpu_linear_fwd(&cpu, x, w, bias ? b : NULL, &onto_res, y);
    Tensor *gx = gpu_test_upload(g, x, dt), *gw = gpu_test_upload(g, w, dt);
    Tensor *gb = gpu_test_upload(g, b, dt), *gres = gpu_test_upload(g, res, DTYPE_F32);
    Tensor *gy = gpu_poison(g, y, DTYPE_F32);
    int plans;
    long queries, fused0, fused1;
    cuda_gemm_cache_stats(g, &plans, &queries, &fused0);
    op_linear_fwd(g, gx, gw, bias ? gb : NULL, &(LinearFwdOpts){.res = gres}, gy);
    cuda_gemm_cache_stats(g, &plans, &queries, &fused1);
    if (bias) printf("    linear_fwd+res N=%d K=%d M=%d %s: %s\n", c->N, c->K, c->M,
                     dtype_name(dt), fused1 > fused0 ? "one GEMM (res as C, bias epilogue)" : "fallback");
    int fails = check(g, bias ? "linear_fwd+res" : "linear_fwd+res(no b)", "y", c, gy, y,
                      tols_for(dt)->act);
    Tensor *gpu[] = {gx, gw, gb, gres, gy}, *host[] = {x, w, b, res, y};
    for (int i = 0; i < 5; i++) { gpu_test_free(gpu[i]); test_tensor_free(host[i]); }
    return fails;
}

static void test_linear_residual_matches_cpu(void **state) {
    GPU_TEST_REQUIRE_DEVICE();
    int fails = 0;
    for (int d = 0; d < 2; d++) {
        DType dt = d ? DTYPE_BF16 : DTYPE_F32;
        Ctx g = cuda_ctx_create(0, dt);
        for (int i = 0; i < NCASES; i++)
            for (int bias = 0; bias < 2; bias++)
                fails += check_linear_res_fwd(&g, &CASES[i], dt, bias, 40 + 7 * i);
        cuda_ctx_destroy(&g);
    }
    assert_int_equal(fails, 0);
}

// mlp_residual_fwd: y = res + MLP(x) in one op (nothing recorded). gspn_t/s/b's widths at 56^2 and
// 28^2 take the fused kernel in bf16 on an H100 (kernels/cuda/mlp_fused.cu: two blocks an SM to
// 128 channels, one at 192), with rows that leave a partial last block of 128; 64 channels takes
// the two ops. Against the CPU, and against the GPU's two ops:
// both round pre and h to bf16, so they differ only where fc1's fp32 sums, added in another order,
// round pre to a neighbouring bf16 (a few elements in 10^5; each moves its row of y by about
// 2^-9 |h w2|): 1e-3 norm-wise bounds that with room (measured on an H100: 0 at every shape
// below). fp32 runs the two ops: FP32_TOL.
static int check_mlp_residual_fwd(Ctx *g, int N, int C, int Hd, DType dt, uint64_t seed) {
    Ctx cpu = ctx_cpu();
    const Case c = {N, C, Hd, 0};
    int r = dt == DTYPE_BF16;
    Tensor *x = host_rand(test_tensor(2, N, C), seed, r);
    Tensor *w1 = host_rand(test_tensor(2, Hd, C), seed + 1, r), *b1 = host_rand(test_tensor(1, Hd), seed + 2, r);
    Tensor *w2 = host_rand(test_tensor(2, C, Hd), seed + 3, r), *b2 = host_rand(test_tensor(1, C), seed + 4, r);
    Tensor *res = host_rand(test_tensor(2, N, C), seed + 5, 0), *y = test_tensor(2, N, C);
    cpu_mlp_residual_fwd(&cpu, x, NULL, w1, b1, w2, b2, GELU_ERF, res, y);
    Tensor *gx = gpu_test_upload(g, x, dt), *gw1 = gpu_test_upload(g, w1, dt), *gb1 = gpu_test_upload(g, b1, dt);
    Tensor *gw2 = gpu_test_upload(g, w2, dt), *gb2 = gpu_test_upload(g, b2, dt);
    Tensor *gres = gpu_test_upload(g, res, DTYPE_F32), *gy = gpu_poison(g, y, DTYPE_F32);
    op_mlp_residual_fwd(g, gx, NULL, gw1, gb1, gw2, gb2, GELU_ERF, gres, gy);
    int fails = check(g, "mlp_residual_fwd", "y", &c, gy, y, tols_for(dt)->act);
    Tensor *h = test_tensor(2, N, Hd);
    Tensor *gh = gpu_poison(g, h, dt), *gy2 = gpu_poison(g, y, DTYPE_F32);
    op_linear_fwd(g, gx, gw1, gb1, &(LinearFwdOpts){.gelu_out = 1, .gelu_kind = GELU_ERF}, gh);
    op_linear_fwd(g, gh, gw2, gb2, &(LinearFwdOpts){.res = gres}, gy2);
    Tensor *y2 = test_like(y);
    float *two = tensor_to_host_f32(g, gy2);
    memcpy(y2->data, two, y2->numel * sizeof(float));
    free(two);
    fails += check(g, "mlp_residual_fwd against the two ops", "y", &c, gy, y2, r ? 1e-3 : FP32_TOL);

    // With the LayerNorm in front (norm: x = layernorm(res)). Against the CPU, whose normalized
    // rows stay fp32 where the GPU's are rounded to bf16 as layernorm_fwd stores them: one more
    // rounding of 2^-9 at most an element of x beside pre's and h's, within the act bound. Against
    // layernorm_fwd, then the op on its output: 0, since the fused kernel normalizes each row
    // with layernorm.cu's sums in layernorm.cu's order, and the fallback is those two ops.
    const float eps = 1e-5f;
    Tensor *lnw = host_rand(test_tensor(1, C), seed + 6, 0), *lnb = host_rand(test_tensor(1, C), seed + 7, 0);
    Tensor *yn = test_tensor(2, N, C);
    cpu_mlp_residual_fwd(&cpu, NULL, &(MlpInputNorm){lnw, lnb, eps}, w1, b1, w2, b2, GELU_ERF, res, yn);
    Tensor *glnw = gpu_test_upload(g, lnw, DTYPE_F32), *glnb = gpu_test_upload(g, lnb, DTYPE_F32);
    Tensor *gyn = gpu_poison(g, yn, DTYPE_F32), *gyn2 = gpu_poison(g, yn, DTYPE_F32), *gxn = gpu_poison(g, x, dt);
    op_mlp_residual_fwd(g, NULL, &(MlpInputNorm){glnw, glnb, eps}, gw1, gb1, gw2, gb2, GELU_ERF, gres, gyn);
    fails += check(g, "mlp_residual_fwd with its norm", "y", &c, gyn, yn, tols_for(dt)->act);
    op_layernorm_fwd(g, gres, NULL, glnw, glnb, eps, NULL, gxn, NULL, NULL);
    op_mlp_residual_fwd(g, gxn, NULL, gw1, gb1, gw2, gb2, GELU_ERF, gres, gyn2);
    float *apart = tensor_to_host_f32(g, gyn2);
    memcpy(yn->data, apart, yn->numel * sizeof(float));
    free(apart);
    fails += check(g, "mlp_residual_fwd with its norm against layernorm_fwd, then the op", "y", &c, gyn, yn, 0.0);
    Tensor *gpu[] = {gx, gw1, gb1, gw2, gb2, gres, gy, gh, gy2, glnw, glnb, gyn, gyn2, gxn};
    Tensor *host[] = {x, w1, b1, w2, b2, res, y, h, y2, lnw, lnb, yn};
    for (int i = 0; i < 14; i++) gpu_test_free(gpu[i]);
    for (int i = 0; i < 12; i++) test_tensor_free(host[i]);
    return fails;
}

static void test_mlp_residual_matches_cpu_and_the_two_ops(void **state) {
    GPU_TEST_REQUIRE_DEVICE();
    static const int shapes[][3] = {{300, 96, 384}, {150, 112, 448}, {200, 128, 512}, {129, 192, 768}, {77, 64, 256}};   // N C Hd
    int fails = 0;
    for (int d = 0; d < 2; d++) {
        DType dt = d ? DTYPE_BF16 : DTYPE_F32;
        Ctx g = cuda_ctx_create(0, dt);
        for (int i = 0; i < 5; i++)
            fails += check_mlp_residual_fwd(&g, shapes[i][0], shapes[i][1], shapes[i][2], dt, 90 + 7 * i);
        cuda_ctx_destroy(&g);
    }
    assert_int_equal(fails, 0);
}

static void test_linear_forward_matches_cpu(DType dt) {
    GPU_TEST_REQUIRE_DEVICE();
    Ctx g = cuda_ctx_create(0, dt);
    int fails = 0;
    for (int i = 0; i < NCASES; i++)
        for (int bias = 0; bias < 2; bias++) fails += check_linear_fwd(&g, &CASES[i], dt, bias, 10 + 7 * i);
    cuda_ctx_destroy(&g);
    assert_int_equal(fails, 0);
}

static void test_linear_backward_matches_cpu(DType dt) {
    GPU_TEST_REQUIRE_DEVICE();
    Ctx g = cuda_ctx_create(0, dt);
    int fails = 0;
    const int masks[] = {7, 1, 2, 4, 6};   // all; dx only; dw only; db only (column sum); dw + db
    for (int i = 0; i < NCASES; i++) {
        for (int m = 0; m < 5; m++) fails += check_linear_bwd(&g, &CASES[i], dt, masks[m], 100 + 11 * i);
        fails += check_linear_bwd_write(&g, &CASES[i], dt, 150 + 11 * i);
    }
    cuda_ctx_destroy(&g);
    assert_int_equal(fails, 0);
}

static void test_linear_fp32_forward_matches_cpu(void **state) { test_linear_forward_matches_cpu(DTYPE_F32); }
static void test_linear_bf16_forward_matches_cpu(void **state) { test_linear_forward_matches_cpu(DTYPE_BF16); }
static void test_linear_fp32_backward_accumulates_and_matches_cpu(void **state) {
    test_linear_backward_matches_cpu(DTYPE_F32);
}
static void test_linear_bf16_backward_accumulates_and_matches_cpu(void **state) {
    test_linear_backward_matches_cpu(DTYPE_BF16);
}

// From zero gradients, two backward calls give exactly twice one call (dx, dw, db).
static void test_linear_backward_twice_doubles_the_gradients(void **state) {
    GPU_TEST_REQUIRE_DEVICE();
    int fails = 0;
    for (int d = 0; d < 2; d++) {
        DType dt = d ? DTYPE_BF16 : DTYPE_F32;
        Ctx g = cuda_ctx_create(0, dt);
        const Case *c = &CASES[3];
        int r = d;
        Tensor *x = host_rand(host_x(c, c->K), 5, r), *w = host_rand(test_tensor(2, c->M, c->K), 6, r);
        Tensor *dy = host_rand(host_x(c, c->M), 7, r);
        Tensor *zx = host_x(c, c->K), *zw = test_tensor(2, c->M, c->K), *zb = test_tensor(1, c->M);
        Tensor *gx = gpu_test_upload(&g, x, dt), *gw = gpu_test_upload(&g, w, dt);
        Tensor *gdy = gpu_test_upload(&g, dy, dt);
        Tensor *once[3], *twice[3];
        for (int k = 0; k < 2; k++) {
            Tensor **o = k ? twice : once;
            o[0] = gpu_test_upload(&g, zx, dt);
            o[1] = gpu_test_upload(&g, zw, DTYPE_F32);
            o[2] = gpu_test_upload(&g, zb, DTYPE_F32);
            for (int rep = 0; rep <= k; rep++) op_linear_bwd(&g, gdy, gx, gw, 0, NULL, o[0], o[1], o[2]);
        }
        const char *names[3] = {"dx", "dw", "db"};
        for (int i = 0; i < 3; i++) {
            float *a = tensor_to_host_f32(&g, once[i]), *b2 = tensor_to_host_f32(&g, twice[i]);
            for (size_t j = 0; j < once[i]->numel; j++) a[j] *= 2.0f;
            double e = test_rel_err(b2, a, once[i]->numel);
            // bf16 dx: round(round(v) + v) against 2 round(v): one bf16 rounding apart.
            double tol = (i == 0 && d) ? BF16_ACT_TOL : ACCUM_TOL;
            printf("    twice = 2 x once %-4s %s rel err %.2e\n", names[i], dtype_name(dt), e);
            fails += !(e <= tol);
            free(a); free(b2);
            gpu_test_free(once[i]); gpu_test_free(twice[i]);
        }
        gpu_test_free(gx); gpu_test_free(gw); gpu_test_free(gdy);
        Tensor *host[] = {x, w, dy, zx, zw, zb};
        for (int i = 0; i < 6; i++) test_tensor_free(host[i]);
        cuda_ctx_destroy(&g);
    }
    assert_int_equal(fails, 0);
}

// ---- linear + GELU -------------------------------------------------------------------------------

static int check_linear_gelu_out_fwd(Ctx *g, const Case *c, DType dt, GeluKind kind, int keep_pre,
                                     uint64_t seed) {
    Ctx cpu = ctx_cpu();
    int r = dt == DTYPE_BF16;
    Tensor *x = host_rand(host_x(c, c->K), seed, r);
    Tensor *w = host_rand(test_tensor(2, c->M, c->K), seed + 1, r);
    Tensor *b = host_rand(test_tensor(1, c->M), seed + 2, r);
    Tensor *pre = host_x(c, c->M), *y = host_x(c, c->M);
    const LinearFwdOpts gelu_out = {.gelu_out = 1, .gelu_kind = kind, .pre = pre};
    cpu_linear_fwd(&cpu, x, w, b, &gelu_out, y);   // the contract: linear, then gelu

    Tensor *gx = gpu_test_upload(g, x, dt), *gw = gpu_test_upload(g, w, dt);
    Tensor *gb = gpu_test_upload(g, b, dt);
    Tensor *gpre = keep_pre ? gpu_poison(g, pre, dt) : NULL, *gy = gpu_poison(g, y, dt);
    const LinearFwdOpts ggelu_out = {.gelu_out = 1, .gelu_kind = kind, .pre = gpre};
    op_linear_fwd(g, gx, gw, gb, &ggelu_out, gy);
    const Tols *t = tols_for(dt);
    int fails = check(g, keep_pre ? "linear_fwd+gelu_out" : "linear_fwd+gelu_out(no pre)", "y", c,
                      gy, y, t->act);
    if (keep_pre) fails += check(g, "linear_fwd+gelu_out", "pre", c, gpre, pre, t->act);

    gpu_test_free(gx); gpu_test_free(gw); gpu_test_free(gb); gpu_test_free(gpre); gpu_test_free(gy);
    test_tensor_free(x); test_tensor_free(w); test_tensor_free(b); test_tensor_free(pre);
    test_tensor_free(y);
    return fails;
}

// linear_bwd with gelu_out, twice onto non-zero gradients (write: dx written both times).
static int check_linear_gelu_out_bwd(Ctx *g, const Case *c, DType dt, GeluKind kind, int write,
                                     uint64_t seed) {
    Ctx cpu = ctx_cpu();
    int r = dt == DTYPE_BF16;
    Tensor *x = host_rand(host_x(c, c->K), seed, r);
    Tensor *w = host_rand(test_tensor(2, c->M, c->K), seed + 1, r);
    Tensor *pre = host_rand(host_x(c, c->M), seed + 2, r);
    for (size_t i = 0; i < pre->numel; i++) ((float *)pre->data)[i] *= 3.0f;   // the GELU's bend
    if (r) gpu_test_round_to_bf16(pre);
    Tensor *dy = host_rand(host_x(c, c->M), seed + 3, r);
    Tensor *dx = host_rand(host_x(c, c->K), seed + 4, r);
    Tensor *dw = host_rand(test_tensor(2, c->M, c->K), seed + 5, 0);
    Tensor *db = host_rand(test_tensor(1, c->M), seed + 6, 0);
    Tensor *gx = gpu_test_upload(g, x, dt), *gw = gpu_test_upload(g, w, dt);
    Tensor *gpre = gpu_test_upload(g, pre, dt), *gdy = gpu_test_upload(g, dy, dt);
    Tensor *gdx = gpu_test_upload(g, dx, dt), *gdw = gpu_test_upload(g, dw, DTYPE_F32);
    Tensor *gdb = gpu_test_upload(g, db, DTYPE_F32);
    const LinearBwdOpts gelu_out = {.gelu_out = 1, .gelu_kind = kind, .pre = pre};
    const LinearBwdOpts ggelu_out = {.gelu_out = 1, .gelu_kind = kind, .pre = gpre};
    const int flags = write ? LINEAR_WRITE_DX : 0;
    for (int rep = 0; rep < 2; rep++) {
        cpu_linear_bwd(&cpu, dy, x, w, flags, &gelu_out, dx, dw, db);
        op_linear_bwd(g, gdy, gx, gw, flags, &ggelu_out, gdx, gdw, gdb);
    }
    double tol = dt == DTYPE_BF16 ? BF16_GELU_GRAD_TOL : FP32_TOL;
    const char *op = write ? "linear_bwd+gelu_out (dx written)" : "linear_bwd+gelu_out";
    int fails = check(g, op, "dx", c, gdx, dx, tol) + check(g, op, "dw", c, gdw, dw, tol) +
                check(g, op, "db", c, gdb, db, tol);
    Tensor *gpu[] = {gx, gw, gpre, gdy, gdx, gdw, gdb}, *host[] = {x, w, pre, dy, dx, dw, db};
    for (int i = 0; i < 7; i++) { gpu_test_free(gpu[i]); test_tensor_free(host[i]); }
    return fails;
}

// The fc2 side, linear_bwd with gelu_in: y = h w^T + b with h = gelu(pre); dpre (dx) written, dw
// and db accumulated.
// erf: the GPU rounds the product dy w to the activation dtype before scaling it (as an unfused
// backward does), the CPU keeps it fp32: two roundings in bf16, inside BF16_ACT_TOL.
static int check_linear_gelu_in_bwd(Ctx *g, const Case *c, DType dt, GeluKind kind, uint64_t seed) {
    Ctx cpu = ctx_cpu();
    int r = dt == DTYPE_BF16;
    Tensor *pre = host_rand(host_x(c, c->K), seed, 0);
    for (size_t i = 0; i < pre->numel; i++) ((float *)pre->data)[i] *= 3.0f;
    if (r) gpu_test_round_to_bf16(pre);
    Tensor *h = host_x(c, c->K);
    cpu_gelu_fwd(&cpu, pre, kind, h);
    if (r) gpu_test_round_to_bf16(h);
    Tensor *w = host_rand(test_tensor(2, c->M, c->K), seed + 1, r);
    Tensor *dy = host_rand(host_x(c, c->M), seed + 2, r);
    Tensor *dpre = host_x(c, c->K);
    Tensor *dw = host_rand(test_tensor(2, c->M, c->K), seed + 3, 0);
    Tensor *db = host_rand(test_tensor(1, c->M), seed + 4, 0);
    Tensor *dpdb = host_rand(test_tensor(1, c->K), seed + 5, 0);   // fc1's bias gradient
    Tensor *gdpdb = gpu_test_upload(g, dpdb, DTYPE_F32);
    Tensor *gpre = gpu_test_upload(g, pre, dt), *gh = gpu_test_upload(g, h, dt);
    Tensor *gw = gpu_test_upload(g, w, dt), *gdy = gpu_test_upload(g, dy, dt);
    Tensor *gdpre = gpu_poison(g, dpre, dt), *gdw = gpu_test_upload(g, dw, DTYPE_F32);
    Tensor *gdb = gpu_test_upload(g, db, DTYPE_F32);
    const LinearBwdOpts gelu_in = {.gelu_in = 1, .gelu_kind = kind, .pre = pre, .dpre_db = dpdb};
    const LinearBwdOpts ggelu_in = {.gelu_in = 1, .gelu_kind = kind, .pre = gpre, .dpre_db = gdpdb};
    for (int rep = 0; rep < 2; rep++) {   // dpre: written both times; dw, db: accumulated
        cpu_linear_bwd(&cpu, dy, h, w, 0, &gelu_in, dpre, dw, db);
        op_linear_bwd(g, gdy, gh, gw, 0, &ggelu_in, gdpre, gdw, gdb);
    }
    const Tols *t = tols_for(dt);
    int fails = check(g, "linear_bwd+gelu_in", "dpre", c, gdpre, dpre, t->act) +
                check(g, "linear_bwd+gelu_in", "dw", c, gdw, dw, t->param) +
                check(g, "linear_bwd+gelu_in", "db", c, gdb, db, t->param) +
                check(g, "linear_bwd+gelu_in", "dpre_db", c, gdpdb, dpdb, t->act);
    Tensor *gpu[] = {gpre, gh, gw, gdy, gdpre, gdw, gdb, gdpdb};
    Tensor *host[] = {pre, h, w, dy, dpre, dw, db, dpdb};
    for (int i = 0; i < 8; i++) { gpu_test_free(gpu[i]); test_tensor_free(host[i]); }
    return fails;
}

static void test_linear_gelu_matches_cpu(DType dt) {
    GPU_TEST_REQUIRE_DEVICE();
    Ctx g = cuda_ctx_create(0, dt);
    int fails = 0;
    for (int k = 0; k < 2; k++) {
        GeluKind kind = k == 0 ? GELU_TANH : GELU_ERF;
        printf("  %s, GELU %s\n", dtype_name(dt), k == 0 ? "tanh" : "erf");
        for (int i = 0; i < NCASES_MLP; i++) {
            for (int keep = 0; keep < 2; keep++)
                fails += check_linear_gelu_out_fwd(&g, &CASES[i], dt, kind, keep, 200 + 13 * i);
            for (int write = 0; write < 2; write++)
                fails += check_linear_gelu_out_bwd(&g, &CASES[i], dt, kind, write, 300 + 17 * i);
            fails += check_linear_gelu_in_bwd(&g, &CASES[i], dt, kind, 400 + 19 * i);
        }
    }
    cuda_ctx_destroy(&g);
    assert_int_equal(fails, 0);
}

static void test_linear_gelu_fp32_fused_matches_cpu_composition(void **state) {
    test_linear_gelu_matches_cpu(DTYPE_F32);
}
static void test_linear_gelu_bf16_fused_matches_cpu_composition(void **state) {
    test_linear_gelu_matches_cpu(DTYPE_BF16);
}

// Each fused epilogue (BIAS, BGRADB, GELU_AUX_BIAS, DGELU; BGRADB is opt-in, so all are switched
// on here) against the same op with fusion switched off, on the shape where all of them can run;
// prints how many fused launches ran. The default-policy runs of the other tests cover BIAS,
// GELU and DGELU fused and db through the column sum.
static void test_fused_epilogues_match_unfused_paths(void **state) {
    GPU_TEST_REQUIRE_DEVICE();
    int fails = 0;
    const Case *c = &CASES[3];
    for (int d = 0; d < 2; d++) {
        DType dt = d ? DTYPE_BF16 : DTYPE_F32;
        Ctx g = cuda_ctx_create(0, dt);
        Tensor *x = host_rand(host_x(c, c->K), 31, d), *w = host_rand(test_tensor(2, c->M, c->K), 32, d);
        Tensor *b = host_rand(test_tensor(1, c->M), 33, d), *dy = host_rand(host_x(c, c->M), 34, d);
        Tensor *zy = host_x(c, c->M), *zx = host_x(c, c->K), *zw = test_tensor(2, c->M, c->K);
        Tensor *zb = test_tensor(1, c->M);
        Tensor *gx = gpu_test_upload(&g, x, dt), *gw = gpu_test_upload(&g, w, dt);
        Tensor *gb = gpu_test_upload(&g, b, dt), *gdy = gpu_test_upload(&g, dy, dt);
        Tensor *out[2][6];   // [fused][y, pre, gy, dw, db, dpre]
        long fused_before, fused_after;
        int plans;
        long queries;
        for (int fused = 1; fused >= 0; fused--) {
            Tensor **o = out[fused];
            cuda_gemm_set_fusion(&g, fused ? CUDA_FUSE_ALL : 0);
            cuda_gemm_cache_stats(&g, &plans, &queries, &fused_before);
            o[0] = gpu_poison(&g, zy, dt);
            op_linear_fwd(&g, gx, gw, gb, NULL, o[0]);
            o[1] = gpu_poison(&g, zy, dt);
            o[2] = gpu_poison(&g, zy, dt);
            const LinearFwdOpts tanh_out = {.gelu_out = 1, .gelu_kind = GELU_TANH, .pre = o[1]};
            op_linear_fwd(&g, gx, gw, gb, &tanh_out, o[2]);
            o[3] = gpu_test_upload(&g, zw, DTYPE_F32);
            o[4] = gpu_test_upload(&g, zb, DTYPE_F32);
            op_linear_bwd(&g, gdy, gx, gw, 0, NULL, NULL, o[3], o[4]);
            o[5] = gpu_poison(&g, zx, dt);   // x stands in for h and for pre
            const LinearBwdOpts tanh_in = {.gelu_in = 1, .gelu_kind = GELU_TANH, .pre = gx};
            op_linear_bwd(&g, gdy, gx, gw, 0, &tanh_in, o[5], NULL, NULL);
            cuda_gemm_cache_stats(&g, &plans, &queries, &fused_after);
            printf("    %s fusion %s: %ld fused-epilogue launches (of 4 possible)\n", dtype_name(dt),
                   fused ? "on " : "off", fused_after - fused_before);
            if (!fused) fails += fused_after != fused_before;
        }
        const char *names[6] = {"y (BIAS)", "pre (GELU_AUX_BIAS)", "gelu y (GELU_AUX_BIAS)",
                                "dw (BGRADB)", "db (BGRADB)", "dpre (DGELU)"};
        const Tols *t = tols_for(dt);
        const double tol[6] = {t->act, t->act, t->act, t->param, t->param, t->act};
        for (int i = 0; i < 6; i++) {
            float *h = tensor_to_host_f32(&g, out[0][i]);
            Tensor ref = *out[0][i];   // the unfused result as the reference, on the host
            ref.data = h;
            ref.device = DEVICE_CPU;
            char what[64];
            snprintf(what, sizeof what, "fused vs unfused %s", names[i]);
            double e = gpu_test_compare(&g, what, out[1][i], &ref);
            fails += !(e <= tol[i]);
            free(h);
            gpu_test_free(out[0][i]);
            gpu_test_free(out[1][i]);
        }
        gpu_test_free(gx); gpu_test_free(gw); gpu_test_free(gb); gpu_test_free(gdy);
        Tensor *host[] = {x, w, b, dy, zy, zx, zw, zb};
        for (int i = 0; i < 8; i++) test_tensor_free(host[i]);
        cuda_ctx_destroy(&g);
    }
    assert_int_equal(fails, 0);
}

#ifdef CGSPN_HAVE_CUTLASS
// The fused erf-GELU kernels are built for sm_90 only.
static int device_is_sm90(void) {
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0) != cudaSuccess)
        return 0;
    return major == 9 && minor == 0;
}
#endif

// The erf GELU in the GEMM epilogue (kernels/cuda/gemm_cutlass.cu, bf16 on sm_90 with CUTLASS)
// against the same ops with fusion off (GEMM, then the GELU pass or the gelu' scaling): y with pre
// kept and without, pre, and dpre. Both round pre (and dy w) to bf16 before the GELU, so they differ
// only where the two GEMMs' sums round to neighbouring bf16 values. Shapes: rows not a multiple of
// the 128-row tile (257), gspn_t's stage-1 fc1 widths (96 -> 384), its 14^2 ones (384 -> 1536)
// and K = 776, where y without pre runs on the ping-pong schedule (gemm_cutlass.cu kPingPongMinK).
// Where the fused kernels are built they must run: 3 fused launches a shape.
static void test_erf_gelu_epilogue_matches_unfused(void **state) {
    GPU_TEST_REQUIRE_DEVICE();
    static const Case cases[] = {{257, 64, 136, 0}, {1000, 96, 384, 0}, {300, 384, 1536, 1}, {333, 776, 264, 0}};
    const DType dt = DTYPE_BF16;
    Ctx g = cuda_ctx_create(0, dt);
    int fails = 0;
    for (int ci = 0; ci < (int)(sizeof cases / sizeof cases[0]); ci++) {
        const Case *c = &cases[ci];
        Tensor *x = host_rand(host_x(c, c->K), 41, 1), *w = host_rand(test_tensor(2, c->M, c->K), 42, 1);
        Tensor *b = host_rand(test_tensor(1, c->M), 43, 1), *dy = host_rand(host_x(c, c->M), 44, 1);
        Tensor *zy = host_x(c, c->M);
        Tensor *gx = gpu_test_upload(&g, x, dt), *gw = gpu_test_upload(&g, w, dt);
        Tensor *gb = gpu_test_upload(&g, b, dt), *gdy = gpu_test_upload(&g, dy, dt);
        // fc2 of the MLP: its input h (N, M) and pre (N, M); w2 (K, M) maps them back to K wide.
        Tensor *w2 = host_rand(test_tensor(2, c->K, c->M), 45, 1), *dy2 = host_rand(host_x(c, c->K), 46, 1);
        Tensor *gw2 = gpu_test_upload(&g, w2, dt), *gdy2 = gpu_test_upload(&g, dy2, dt);
        Tensor *out[2][4];   // [fused][pre, y, y (pre not kept), dpre]
        for (int fused = 1; fused >= 0; fused--) {
            Tensor **o = out[fused];
            cuda_gemm_set_fusion(&g, fused ? CUDA_FUSE_DEFAULT : 0);
            int plans;
            long queries, before, after;
            cuda_gemm_cache_stats(&g, &plans, &queries, &before);
            o[0] = gpu_poison(&g, zy, dt);
            o[1] = gpu_poison(&g, zy, dt);
            const LinearFwdOpts erf_out = {.gelu_out = 1, .gelu_kind = GELU_ERF, .pre = o[0]};
            op_linear_fwd(&g, gx, gw, gb, &erf_out, o[1]);
            o[2] = gpu_poison(&g, zy, dt);
            op_linear_fwd(&g, gx, gw, gb, &(LinearFwdOpts){.gelu_out = 1, .gelu_kind = GELU_ERF}, o[2]);
            o[3] = gpu_poison(&g, zy, dt);   // dpre of the unfused pre, the same in both runs
            const LinearBwdOpts erf_in = {.gelu_in = 1, .gelu_kind = GELU_ERF, .pre = out[1][0]};
            op_linear_bwd(&g, gdy2, out[1][1], gw2, 0, &erf_in, o[3], NULL, NULL);
            cuda_gemm_cache_stats(&g, &plans, &queries, &after);
            printf("    N=%d K=%d M=%d, fusion %s: %ld fused launches\n", c->N, c->K, c->M,
                   fused ? "on " : "off", after - before);
#ifdef CGSPN_HAVE_CUTLASS
            if (fused && device_is_sm90()) fails += after - before != 3;
#endif
        }
        const char *names[4] = {"erf pre", "erf y", "erf y (no pre)", "erf dpre"};
        for (int i = 0; i < 4; i++) {
            float *h = tensor_to_host_f32(&g, out[0][i]);
            Tensor ref = *out[0][i];
            ref.data = h;
            ref.device = DEVICE_CPU;
            char what[64];
            snprintf(what, sizeof what, "fused vs unfused %s", names[i]);
            double e = gpu_test_compare(&g, what, out[1][i], &ref);
            fails += !(e <= BF16_ACT_TOL);
            free(h);
        }
        for (int f = 0; f < 2; f++)
            for (int i = 0; i < 4; i++) gpu_test_free(out[f][i]);
        Tensor *dev[] = {gx, gw, gb, gdy, gw2, gdy2};
        for (int i = 0; i < 6; i++) gpu_test_free(dev[i]);
        Tensor *host[] = {x, w, b, dy, zy, w2, dy2};
        for (int i = 0; i < 7; i++) test_tensor_free(host[i]);
    }
    cuda_gemm_set_fusion(&g, CUDA_FUSE_DEFAULT);
    cuda_ctx_destroy(&g);
    assert_int_equal(fails, 0);
}

// The second call with the same shapes, dtypes and alignment reuses the plan: no new query.
static void test_gemm_plans_are_cached_per_shape(void **state) {
    GPU_TEST_REQUIRE_DEVICE();
    Ctx g = cuda_ctx_create(0, DTYPE_BF16);
    const Case *c = &CASES[1];
    Tensor *x = host_rand(host_x(c, c->K), 1, 1), *w = host_rand(test_tensor(2, c->M, c->K), 2, 1);
    Tensor *y = host_x(c, c->M);
    Tensor *gx = gpu_test_upload(&g, x, DTYPE_BF16), *gw = gpu_test_upload(&g, w, DTYPE_BF16);
    Tensor *gy = gpu_test_upload(&g, y, DTYPE_BF16);
    int plans1, plans2;
    long q1, q2, f;
    op_linear_fwd(&g, gx, gw, NULL, NULL, gy);
    cuda_gemm_cache_stats(&g, &plans1, &q1, &f);
    for (int i = 0; i < 10; i++) op_linear_fwd(&g, gx, gw, NULL, NULL, gy);
    cuda_gemm_cache_stats(&g, &plans2, &q2, &f);
    printf("    plans %d -> %d, heuristic queries %ld -> %ld\n", plans1, plans2, q1, q2);
    assert_int_equal(plans1, 1);
    assert_int_equal(plans2, 1);
    assert_true(q2 == q1);
    gpu_test_free(gx); gpu_test_free(gw); gpu_test_free(gy);
    test_tensor_free(x); test_tensor_free(w); test_tensor_free(y);
    cuda_ctx_destroy(&g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_linear_fp32_forward_matches_cpu),
        cmocka_unit_test(test_linear_bf16_forward_matches_cpu),
        cmocka_unit_test(test_linear_fp32_backward_accumulates_and_matches_cpu),
        cmocka_unit_test(test_linear_bf16_backward_accumulates_and_matches_cpu),
        cmocka_unit_test(test_linear_backward_twice_doubles_the_gradients),
        cmocka_unit_test(test_linear_backward_takes_fp32_dy_under_bf16),
        cmocka_unit_test(test_silu_linear_matches_cpu),
        cmocka_unit_test(test_linear_gelu_fp32_fused_matches_cpu_composition),
        cmocka_unit_test(test_linear_gelu_bf16_fused_matches_cpu_composition),
        cmocka_unit_test(test_fused_epilogues_match_unfused_paths),
        cmocka_unit_test(test_erf_gelu_epilogue_matches_unfused),
        cmocka_unit_test(test_gemm_plans_are_cached_per_shape),
        cmocka_unit_test(test_linear_residual_matches_cpu),
        cmocka_unit_test(test_mlp_residual_matches_cpu_and_the_two_ops),
    };
    return cmocka_run_group_tests_name("linear_gpu", tests, NULL, NULL);
}
