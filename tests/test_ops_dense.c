// CPU dense ops (kernels/cpu: gemm, linear, layernorm, gelu, softmax, attention, patch_embed):
// forward against straightforward double-precision references, backward against central
// finite differences of loss = sum(y * r) for a fixed random r, accumulation semantics, and
// the sgemm helper on every transpose combination.
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include "testlib.h"
#include <omp.h>
#include "../kernels/ops.h"
#include "../kernels/cpu/gemm.h"

// Forward results against double references: fp32 rounding of sums of at most a few hundred
// terms stays near 1e-6 relative; an indexing or scaling bug gives errors of order 1.
#define FWD_TOL 1e-5
// Calling a backward twice must give twice the gradient; the second call adds the same fp32
// values again, so only rounding of the sum (~1e-7 relative) may differ.
#define ACCUM_TOL 1e-6


static float *f(const Tensor *t) { return (float *)t->data; }

// Relative error of an fp32 result against a double reference.
static double rel_err_d(const float *a, const double *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += (a[i] - ref[i]) * (a[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return sqrt(num) / fmax(sqrt(den), 1e-12);
}

// g2 == 2 * g1 (up to ACCUM_TOL): the second backward call added the same gradient again.
static void assert_doubled(const char *what, const Tensor *g1, const Tensor *g2) {
    float *twice = malloc(sizeof(float) * g1->numel);
    for (size_t i = 0; i < g1->numel; i++) twice[i] = 2.0f * f(g1)[i];
    double err = test_rel_err(f(g2), twice, g1->numel);
    printf("    accumulate %-27s rel err %.2e\n", what, err);
    free(twice);
    assert_true(err < ACCUM_TOL);
}

// ---- sgemm ------------------------------------------------------------------------------------

// C = alpha op(A) op(B) + beta C in double, for the same storage conventions as cpu_sgemm.
static void naive_gemm(int ta, int tb, int M, int N, int K, double alpha, const float *A, int lda,
                       const float *B, int ldb, double beta, const float *C, int ldc, double *out) {
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0;
            for (int p = 0; p < K; p++) {
                double a = ta ? A[(size_t)p * lda + i] : A[(size_t)i * lda + p];
                double b = tb ? B[(size_t)j * ldb + p] : B[(size_t)p * ldb + j];
                s += a * b;
            }
            out[(size_t)i * N + j] = alpha * s + (beta != 0 ? beta * C[(size_t)i * ldc + j] : 0);
        }
}

// One sgemm call with padded leading dimensions; checks the result and that the padding
// columns of C were left alone.
static void check_sgemm(int ta, int tb, int M, int N, int K, float alpha, float beta, uint64_t seed) {
    int lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 5, ldc = N + 2;
    Tensor *A = test_tensor(1, (ta ? K : M) * lda), *B = test_tensor(1, (tb ? N : K) * ldb);
    Tensor *C = test_tensor(1, M * ldc);
    test_fill(A, seed, -1, 1);
    test_fill(B, seed + 1, -1, 1);
    test_fill(C, seed + 2, -1, 1);
    for (int i = 0; i < M; i++)
        for (int j = N; j < ldc; j++) f(C)[(size_t)i * ldc + j] = 12345.0f;   // padding sentinel
    if (beta == 0)   // beta = 0 must not read C: garbage (NaN) there must not reach the result
        for (int i = 0; i < M; i++) f(C)[(size_t)i * ldc] = NAN;
    double *ref = malloc(sizeof(double) * M * N);
    naive_gemm(ta, tb, M, N, K, alpha, f(A), lda, f(B), ldb, beta, f(C), ldc, ref);
    cpu_sgemm(ta, tb, M, N, K, alpha, f(A), lda, f(B), ldb, beta, f(C), ldc);
    float *got = malloc(sizeof(float) * M * N);
    int pad_ok = 1;
    for (int i = 0; i < M; i++) {
        memcpy(got + (size_t)i * N, f(C) + (size_t)i * ldc, sizeof(float) * N);
        for (int j = N; j < ldc; j++) pad_ok &= f(C)[(size_t)i * ldc + j] == 12345.0f;
    }
    double err = rel_err_d(got, ref, (size_t)M * N);
    printf("    sgemm ta=%d tb=%d M=%4d N=%3d K=%3d alpha=%.2f beta=%.2f  rel err %.2e\n", ta, tb,
           M, N, K, alpha, beta, err);
    assert_true(err < FWD_TOL);
    assert_true(pad_ok);
    free(got);
    free(ref);
    test_tensor_free(A);
    test_tensor_free(B);
    test_tensor_free(C);
}

// Both micro-kernels: the one this CPU picks (AVX2 + FMA where present) and the baseline.
static void test_sgemm_matches_naive_for_all_transposes(void **state) {
    for (int baseline = 1; baseline >= 0; baseline--) {
        cpu_sgemm_use_baseline(baseline);
        printf("    kernel: %s\n", cpu_sgemm_kernel_name());
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) {
                check_sgemm(ta, tb, 13, 37, 19, 0.7f, -1.3f, 10 + ta * 2 + tb);   // edge tiles
                check_sgemm(ta, tb, 5, 3, 7, 1.0f, 0.0f, 20 + ta * 2 + tb);   // under one tile
                check_sgemm(ta, tb, 101, 45, 300, -0.5f, 1.0f, 30 + ta * 2 + tb);   // 2 depth blocks
            }
        check_sgemm(1, 0, 3100, 21, 33, 1.0f, 0.5f, 40);   // more rows than one packed row block
        check_sgemm(0, 1, 4, 6, 0, 1.0f, 2.0f, 41);        // K = 0: C = beta C
    }
}

static void test_sgemm_is_deterministic_across_thread_counts(void **state) {
    int M = 203, N = 99, K = 517;   // several depth blocks and tiles: threads split the work
    Tensor *A = test_tensor(2, K, M), *B = test_tensor(2, K, N);
    Tensor *C1 = test_tensor(2, M, N), *C3 = test_tensor(2, M, N);
    test_fill(A, 50, -1, 1);
    test_fill(B, 51, -1, 1);
    int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    cpu_sgemm(1, 0, M, N, K, 1.0f, f(A), M, f(B), N, 0.0f, f(C1), N);
    omp_set_num_threads(3);
    cpu_sgemm(1, 0, M, N, K, 1.0f, f(A), M, f(B), N, 0.0f, f(C3), N);
    omp_set_num_threads(saved);
    assert_memory_equal(C1->data, C3->data, sizeof(float) * M * N);
    test_tensor_free(A);
    test_tensor_free(B);
    test_tensor_free(C1);
    test_tensor_free(C3);
}

// ---- linear -----------------------------------------------------------------------------------

typedef struct LinearCase {
    Tensor *x, *w, *b, *y, *r;   // x (..., K), w (M, K), b (M) or NULL, y and r (..., M)
} LinearCase;

static LinearCase linear_case(int rows, int K, int M, int with_bias, uint64_t seed) {
    LinearCase c = {.x = test_tensor(2, rows, K), .w = test_tensor(2, M, K),
                    .b = with_bias ? test_tensor(1, M) : NULL, .y = test_tensor(2, rows, M),
                    .r = test_tensor(2, rows, M)};
    test_fill(c.x, seed, -1, 1);
    test_fill(c.w, seed + 1, -1, 1);
    if (c.b) test_fill(c.b, seed + 2, -1, 1);
    test_fill(c.r, seed + 3, -1, 1);
    return c;
}

static void linear_case_free(LinearCase *c) {
    test_tensor_free(c->x);
    test_tensor_free(c->w);
    test_tensor_free(c->b);
    test_tensor_free(c->y);
    test_tensor_free(c->r);
}

static double linear_loss(void *user) {
    LinearCase *c = user;
    Ctx ctx = ctx_cpu();
    cpu_linear_fwd(&ctx, c->x, c->w, c->b, NULL, c->y);
    return test_dot(c->y, c->r);
}

static void test_linear_forward_matches_naive_matmul(void **state) {
    for (int with_bias = 0; with_bias < 2; with_bias++) {
        LinearCase c = linear_case(5, 7, 3, with_bias, 100);
        int N = 5, K = 7, M = 3;
        double ref[15];
        for (int n = 0; n < N; n++)
            for (int m = 0; m < M; m++) {
                double s = with_bias ? f(c.b)[m] : 0;
                for (int k = 0; k < K; k++) s += (double)f(c.x)[n * K + k] * f(c.w)[m * K + k];
                ref[n * M + m] = s;
            }
        f(c.y)[0] = NAN;   // y is overwritten, not accumulated into
        linear_loss(&c);
        assert_true(rel_err_d(f(c.y), ref, (size_t)N * M) < FWD_TOL);
        linear_case_free(&c);
    }
}

static void test_linear_backward_matches_finite_differences(void **state) {
    LinearCase c = linear_case(5, 7, 3, 1, 110);
    Ctx ctx = ctx_cpu();
    Tensor *dx = test_like(c.x), *dw = test_like(c.w), *db = test_like(c.b);
    cpu_linear_bwd(&ctx, c.r, c.x, c.w, 0, NULL, dx, dw, db);
    assert_true(test_gradcheck("linear dx", linear_loss, &c, c.x, dx) < GRAD_TOL);
    assert_true(test_gradcheck("linear dw", linear_loss, &c, c.w, dw) < GRAD_TOL);
    assert_true(test_gradcheck("linear db", linear_loss, &c, c.b, db) < GRAD_TOL);
    test_tensor_free(dx);
    test_tensor_free(dw);
    test_tensor_free(db);
    linear_case_free(&c);
}

static void test_linear_backward_accumulates_and_skips_null_gradients(void **state) {
    LinearCase c = linear_case(5, 7, 3, 1, 120);
    Ctx ctx = ctx_cpu();
    Tensor *dx1 = test_like(c.x), *dw1 = test_like(c.w), *db1 = test_like(c.b);
    Tensor *dx2 = test_like(c.x), *dw2 = test_like(c.w), *db2 = test_like(c.b);
    cpu_linear_bwd(&ctx, c.r, c.x, c.w, 0, NULL, dx1, dw1, db1);
    for (int rep = 0; rep < 2; rep++) cpu_linear_bwd(&ctx, c.r, c.x, c.w, 0, NULL, dx2, dw2, db2);
    assert_doubled("linear dx", dx1, dx2);
    assert_doubled("linear dw", dw1, dw2);
    assert_doubled("linear db", db1, db2);
    // NULL gradients are skipped; the others come out the same.
    Tensor *dw3 = test_like(c.w);
    cpu_linear_bwd(&ctx, c.r, c.x, c.w, 0, NULL, NULL, dw3, NULL);
    assert_memory_equal(dw3->data, dw1->data, sizeof(float) * dw1->numel);
    Tensor *dx3 = test_like(c.x);
    cpu_linear_bwd(&ctx, c.r, c.x, c.w, 0, NULL, dx3, NULL, NULL);
    assert_memory_equal(dx3->data, dx1->data, sizeof(float) * dx1->numel);
    Tensor *t[] = {dx1, dw1, db1, dx2, dw2, db2, dw3, dx3};
    for (size_t i = 0; i < sizeof t / sizeof *t; i++) test_tensor_free(t[i]);
    linear_case_free(&c);
}

static void test_linear_backward_is_deterministic_across_thread_counts(void **state) {
    LinearCase c = linear_case(777, 40, 37, 1, 130);
    Ctx ctx = ctx_cpu();
    Tensor *dw1 = test_like(c.w), *db1 = test_like(c.b), *dw3 = test_like(c.w), *db3 = test_like(c.b);
    int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    cpu_linear_bwd(&ctx, c.r, c.x, c.w, 0, NULL, NULL, dw1, db1);
    omp_set_num_threads(3);
    cpu_linear_bwd(&ctx, c.r, c.x, c.w, 0, NULL, NULL, dw3, db3);
    omp_set_num_threads(saved);
    assert_memory_equal(dw1->data, dw3->data, sizeof(float) * dw1->numel);
    assert_memory_equal(db1->data, db3->data, sizeof(float) * db1->numel);
    test_tensor_free(dw1);
    test_tensor_free(db1);
    test_tensor_free(dw3);
    test_tensor_free(db3);
    linear_case_free(&c);
}

static void linear_with_7_inputs_against_6(void) {
    Ctx ctx = ctx_cpu();
    Tensor *x = test_tensor(2, 5, 7), *w = test_tensor(2, 3, 6), *y = test_tensor(2, 5, 3);
    cpu_linear_fwd(&ctx, x, w, NULL, NULL, y);
}
// Fusions no kernel implements, refused by kernels/linear_shape.h on either backend.
static void linear_silu_in_onto_res(void) {
    Ctx ctx = ctx_cpu();
    Tensor *x = test_tensor(2, 5, 7), *w = test_tensor(2, 3, 7), *y = test_tensor(2, 5, 3),
           *res = test_tensor(2, 5, 3);
    cpu_linear_fwd(&ctx, x, w, NULL, &(LinearFwdOpts){.silu_in = 1, .res = res}, y);
}
static void linear_pre_without_gelu(void) {
    Ctx ctx = ctx_cpu();
    Tensor *x = test_tensor(2, 5, 7), *w = test_tensor(2, 3, 7), *y = test_tensor(2, 5, 3),
           *pre = test_tensor(2, 5, 3);
    cpu_linear_fwd(&ctx, x, w, NULL, &(LinearFwdOpts){.pre = pre}, y);
}
static void linear_bwd_gelu_out_and_in(void) {
    Ctx ctx = ctx_cpu();
    Tensor *x = test_tensor(2, 5, 7), *w = test_tensor(2, 3, 7), *dy = test_tensor(2, 5, 3),
           *pre = test_tensor(2, 5, 3), *dw = test_tensor(2, 3, 7);
    const LinearBwdOpts o = {.gelu_out = 1, .gelu_in = 1, .pre = pre};
    cpu_linear_bwd(&ctx, dy, x, w, 0, &o, NULL, dw, NULL);
}
static void linear_bwd_dpre_db_without_gelu_in(void) {
    Ctx ctx = ctx_cpu();
    Tensor *x = test_tensor(2, 5, 7), *w = test_tensor(2, 3, 7), *dy = test_tensor(2, 5, 3),
           *dx = test_tensor(2, 5, 7), *dpre_db = test_tensor(1, 7);
    cpu_linear_bwd(&ctx, dy, x, w, 0, &(LinearBwdOpts){.silu_in = 1, .dpre_db = dpre_db}, dx,
                   NULL, NULL);
}

// A shape error stops the program with a message naming the op (run in a child process).
static void test_linear_rejects_mismatched_shapes_with_a_message(void **state) {
    expect_stop(linear_with_7_inputs_against_6, (const char *[]){"linear_fwd", "(5, 7)", NULL});
}

// An options combination no kernel implements stops with the op and the combination named.
static void test_linear_refuses_unimplemented_fusions_by_name(void **state) {
    expect_stop(linear_silu_in_onto_res,
                (const char *[]){"linear_fwd", "silu_in + res together", NULL});
    expect_stop(linear_pre_without_gelu, (const char *[]){"linear_fwd", "gelu_out is not set", NULL});
    expect_stop(linear_bwd_gelu_out_and_in,
                (const char *[]){"linear_bwd", "gelu_out + gelu_in together", NULL});
    expect_stop(linear_bwd_dpre_db_without_gelu_in,
                (const char *[]){"linear_bwd", "dpre_db", "gelu_in is not set", NULL});
}

// ---- layernorm --------------------------------------------------------------------------------

#define LN_EPS 1e-5f

typedef struct LnCase {
    Tensor *x, *w, *b, *y, *mean, *rstd, *r;
} LnCase;

static LnCase ln_case(int N, int C, uint64_t seed) {
    LnCase c = {.x = test_tensor(2, N, C), .w = test_tensor(1, C), .b = test_tensor(1, C),
                .y = test_tensor(2, N, C), .mean = test_tensor(1, N), .rstd = test_tensor(1, N),
                .r = test_tensor(2, N, C)};
    test_fill(c.x, seed, -2, 2);
    test_fill(c.w, seed + 1, 0.5f, 1.5f);
    test_fill(c.b, seed + 2, -0.5f, 0.5f);
    test_fill(c.r, seed + 3, -1, 1);
    return c;
}

static void ln_case_free(LnCase *c) {
    Tensor *t[] = {c->x, c->w, c->b, c->y, c->mean, c->rstd, c->r};
    for (size_t i = 0; i < sizeof t / sizeof *t; i++) test_tensor_free(t[i]);
}

static double ln_loss(void *user) {
    LnCase *c = user;
    Ctx ctx = ctx_cpu();
    cpu_layernorm_fwd(&ctx, c->x, NULL, c->w, c->b, LN_EPS, NULL, c->y, c->mean, c->rstd);
    return test_dot(c->y, c->r);
}

static void test_layernorm_forward_matches_naive(void **state) {
    int N = 5, C = 7;
    LnCase c = ln_case(N, C, 200);
    ln_loss(&c);
    double ref[35], ref_mean[5], ref_rstd[5];
    for (int n = 0; n < N; n++) {
        double mu = 0, var = 0;
        for (int k = 0; k < C; k++) mu += f(c.x)[n * C + k] / (double)C;
        for (int k = 0; k < C; k++) var += pow(f(c.x)[n * C + k] - mu, 2) / C;
        ref_mean[n] = mu;
        ref_rstd[n] = 1 / sqrt(var + LN_EPS);
        for (int k = 0; k < C; k++)
            ref[n * C + k] = (f(c.x)[n * C + k] - mu) * ref_rstd[n] * f(c.w)[k] + f(c.b)[k];
    }
    assert_true(rel_err_d(f(c.y), ref, (size_t)N * C) < FWD_TOL);
    assert_true(rel_err_d(f(c.mean), ref_mean, N) < FWD_TOL);
    assert_true(rel_err_d(f(c.rstd), ref_rstd, N) < FWD_TOL);
    ln_case_free(&c);
}

static void test_layernorm_backward_matches_finite_differences(void **state) {
    LnCase c = ln_case(5, 7, 210);
    Ctx ctx = ctx_cpu();
    ln_loss(&c);
    Tensor *dx = test_like(c.x), *dw = test_like(c.w), *db = test_like(c.b);
    cpu_layernorm_bwd(&ctx, c.r, c.x, c.w, c.mean, c.rstd, dx, dw, db, NULL, NULL);
    assert_true(test_gradcheck("layernorm dx", ln_loss, &c, c.x, dx) < GRAD_TOL);
    assert_true(test_gradcheck("layernorm dw", ln_loss, &c, c.w, dw) < GRAD_TOL);
    assert_true(test_gradcheck("layernorm db", ln_loss, &c, c.b, db) < GRAD_TOL);
    // accumulation: a second call doubles every gradient
    Tensor *dx2 = test_like(c.x), *dw2 = test_like(c.w), *db2 = test_like(c.b);
    for (int rep = 0; rep < 2; rep++)
        cpu_layernorm_bwd(&ctx, c.r, c.x, c.w, c.mean, c.rstd, dx2, dw2, db2, NULL, NULL);
    assert_doubled("layernorm dx", dx, dx2);
    assert_doubled("layernorm dw", dw, dw2);
    assert_doubled("layernorm db", db, db2);
    // the hand-off: a copy of the final dx (after a third add) and its column sums, added to
    Tensor *act = test_like(c.x), *sums = test_like(c.w);
    for (int k = 0; k < 7; k++) tensor_f32(sums)[k] = 1.0f;
    cpu_layernorm_bwd(&ctx, c.r, c.x, c.w, c.mean, c.rstd, dx2, NULL, NULL, act, sums);
    for (int n = 0; n < 5; n++)
        for (int k = 0; k < 7; k++) {
            float v = tensor_f32(dx2)[n * 7 + k];
            assert_float_equal(v, 3.0f * tensor_f32(dx)[n * 7 + k], 1e-5f);
            assert_float_equal(tensor_f32(act)[n * 7 + k], v, 0.0f);
        }
    for (int k = 0; k < 7; k++) {
        double s = 1.0;
        for (int n = 0; n < 5; n++) s += tensor_f32(dx2)[n * 7 + k];
        assert_float_equal(tensor_f32(sums)[k], (float)s, 1e-5f);
    }
    test_tensor_free(act);
    test_tensor_free(sums);
    Tensor *t[] = {dx, dw, db, dx2, dw2, db2};
    for (size_t i = 0; i < sizeof t / sizeof *t; i++) test_tensor_free(t[i]);
    ln_case_free(&c);
}

// The shapes kernels/layernorm_shape.h refuses, on either backend: a weight of C + 1, statistics
// of N + 1 rows, dw without a weight, a sum h that aliases x.
static void ln_weight_too_long(void) {
    Ctx ctx = ctx_cpu();
    Tensor *x = test_tensor(2, 3, 8), *w = test_tensor(1, 9), *y = test_tensor(2, 3, 8);
    cpu_layernorm_fwd(&ctx, x, NULL, w, NULL, 1e-5f, NULL, y, NULL, NULL);
}
static void ln_stats_one_row_long(void) {
    Ctx ctx = ctx_cpu();
    Tensor *x = test_tensor(2, 3, 8), *y = test_tensor(2, 3, 8), *mean = test_tensor(1, 4);
    cpu_layernorm_fwd(&ctx, x, NULL, NULL, NULL, 1e-5f, NULL, y, mean, NULL);
}
static void ln_dw_without_weight(void) {
    Ctx ctx = ctx_cpu();
    Tensor *x = test_tensor(2, 3, 8), *dy = test_tensor(2, 3, 8), *mean = test_tensor(1, 3),
           *rstd = test_tensor(1, 3), *dw = test_tensor(1, 8);
    cpu_layernorm_bwd(&ctx, dy, x, NULL, mean, rstd, NULL, dw, NULL, NULL, NULL);
}
static void ln_sum_aliases_x(void) {
    Ctx ctx = ctx_cpu();
    Tensor *x = test_tensor(2, 3, 8), *r = test_tensor(2, 3, 8), *y = test_tensor(2, 3, 8);
    cpu_layernorm_fwd(&ctx, x, r, NULL, NULL, 1e-5f, x, y, NULL, NULL);
}

static void test_layernorm_rejects_bad_shapes_with_a_message(void **state) {
    expect_stop(ln_weight_too_long, (const char *[]){"layernorm_fwd", "w has shape (9)", NULL});
    expect_stop(ln_stats_one_row_long, (const char *[]){"layernorm_fwd", "mean", "expected 3", NULL});
    expect_stop(ln_dw_without_weight, (const char *[]){"layernorm_bwd", "no weight w", NULL});
    expect_stop(ln_sum_aliases_x, (const char *[]){"layernorm_fwd", "must not alias", NULL});
}

// ---- gelu -------------------------------------------------------------------------------------

typedef struct GeluCase {
    Tensor *x, *y, *r;
    GeluKind kind;
} GeluCase;

static double gelu_loss(void *user) {
    GeluCase *c = user;
    Ctx ctx = ctx_cpu();
    cpu_gelu_fwd(&ctx, c->x, c->kind, c->y);
    return test_dot(c->y, c->r);
}

// Reference values: PyTorch gelu(x) and gelu(x, approximate='tanh') (also from the formulas
// in double). The two differ by ~1.5e-4 at |x| = 1 and ~4e-4 at x = -3, far above fp32 rounding.
static void test_gelu_erf_and_tanh_match_known_values(void **state) {
    const float xs[] = {1.0f, -1.0f, -3.0f, 2.0f, 0.5f};
    const double erf_ref[] = {0.841344746, -0.158655254, -0.004049694, 1.954499736, 0.345731231};
    const double tanh_ref[] = {0.841191991, -0.158808009, -0.003637392, 1.954597694, 0.345714010};
    Tensor *x = test_tensor(1, 5), *ye = test_tensor(1, 5), *yt = test_tensor(1, 5);
    memcpy(x->data, xs, sizeof xs);
    Ctx ctx = ctx_cpu();
    cpu_gelu_fwd(&ctx, x, GELU_ERF, ye);
    cpu_gelu_fwd(&ctx, x, GELU_TANH, yt);
    for (int i = 0; i < 5; i++) {
        assert_float_equal(f(ye)[i], erf_ref[i], 2e-7);   // a few fp32 ulps at these values
        assert_float_equal(f(yt)[i], tanh_ref[i], 2e-7);
    }
    assert_true(fabs(f(ye)[0] - f(yt)[0]) > 1e-4);   // the kinds are really different
    test_tensor_free(x);
    test_tensor_free(ye);
    test_tensor_free(yt);
}

static void test_gelu_backward_matches_finite_differences(void **state) {
    const char *names[] = {"gelu erf dx", "gelu tanh dx"};
    for (int kind = GELU_ERF; kind <= GELU_TANH; kind++) {
        GeluCase c = {.x = test_tensor(2, 3, 5), .y = test_tensor(2, 3, 5),
                      .r = test_tensor(2, 3, 5), .kind = (GeluKind)kind};
        test_fill(c.x, 300 + kind, -3, 3);
        test_fill(c.r, 310 + kind, -1, 1);
        Ctx ctx = ctx_cpu();
        Tensor *dx = test_like(c.x), *dx2 = test_like(c.x);
        cpu_gelu_bwd(&ctx, c.r, c.x, c.kind, dx);
        assert_true(test_gradcheck(names[kind], gelu_loss, &c, c.x, dx) < GRAD_TOL);
        for (int rep = 0; rep < 2; rep++) cpu_gelu_bwd(&ctx, c.r, c.x, c.kind, dx2);
        assert_doubled(names[kind], dx, dx2);
        cpu_gelu_bwd(&ctx, c.r, c.x, c.kind, NULL);   // NULL gradient: nothing to do
        Tensor *t[] = {c.x, c.y, c.r, dx, dx2};
        for (size_t i = 0; i < sizeof t / sizeof *t; i++) test_tensor_free(t[i]);
    }
}

// ---- silu -------------------------------------------------------------------------------------

static double silu_loss(void *user) {
    GeluCase *c = user;   // kind unused
    Ctx ctx = ctx_cpu();
    cpu_silu_fwd(&ctx, c->x, c->y);
    return test_dot(c->y, c->r);
}

// Reference values: PyTorch F.silu(x), x / (1 + exp(-x)) in double.
static void test_silu_matches_known_values_and_finite_differences(void **state) {
    const float xs[] = {1.0f, -1.0f, -3.0f, 2.0f, 0.0f};
    const double ref[] = {0.731058579, -0.268941421, -0.142277620, 1.761594156, 0.0};
    GeluCase c = {.x = test_tensor(1, 5), .y = test_tensor(1, 5), .r = test_tensor(1, 5)};
    memcpy(c.x->data, xs, sizeof xs);
    Ctx ctx = ctx_cpu();
    cpu_silu_fwd(&ctx, c.x, c.y);
    for (int i = 0; i < 5; i++) assert_float_equal(f(c.y)[i], ref[i], 2e-7);
    test_tensor_free(c.x);
    test_tensor_free(c.y);
    test_tensor_free(c.r);
    c = (GeluCase){.x = test_tensor(2, 3, 5), .y = test_tensor(2, 3, 5), .r = test_tensor(2, 3, 5)};
    test_fill(c.x, 320, -5, 5);
    test_fill(c.r, 321, -1, 1);
    Tensor *dx = test_like(c.x), *dx2 = test_like(c.x);
    cpu_silu_bwd(&ctx, c.r, c.x, dx);
    assert_true(test_gradcheck("silu dx", silu_loss, &c, c.x, dx) < GRAD_TOL);
    for (int rep = 0; rep < 2; rep++) cpu_silu_bwd(&ctx, c.r, c.x, dx2);
    assert_doubled("silu dx", dx, dx2);
    Tensor *t[] = {c.x, c.y, c.r, dx, dx2};
    for (size_t i = 0; i < sizeof t / sizeof *t; i++) test_tensor_free(t[i]);
}

// ---- softmax ----------------------------------------------------------------------------------

typedef struct SoftmaxCase {
    Tensor *x, *y, *r;
} SoftmaxCase;

static double softmax_loss(void *user) {
    SoftmaxCase *c = user;
    Ctx ctx = ctx_cpu();
    cpu_softmax_fwd(&ctx, c->x, c->y);
    return test_dot(c->y, c->r);
}

static void test_softmax_forward_matches_naive_and_is_stable(void **state) {
    int N = 4, C = 9;
    Tensor *x = test_tensor(2, N, C), *y = test_tensor(2, N, C), *xs = test_tensor(2, N, C),
           *ys = test_tensor(2, N, C);
    test_fill(x, 400, -3, 3);
    double ref[36];
    for (int n = 0; n < N; n++) {
        double s = 0;
        for (int k = 0; k < C; k++) s += exp(f(x)[n * C + k]);
        for (int k = 0; k < C; k++) ref[n * C + k] = exp(f(x)[n * C + k]) / s;
    }
    Ctx ctx = ctx_cpu();
    cpu_softmax_fwd(&ctx, x, y);
    assert_true(rel_err_d(f(y), ref, (size_t)N * C) < FWD_TOL);
    // Shifted by +1000 (exp overflows fp32 without the max subtraction): same probabilities.
    for (size_t i = 0; i < x->numel; i++) f(xs)[i] = f(x)[i] + 1000.0f;
    cpu_softmax_fwd(&ctx, xs, ys);
    for (size_t i = 0; i < ys->numel; i++) assert_true(isfinite(f(ys)[i]));
    // 1000 + x keeps ~5e-5 absolute precision of x in fp32, so compare at that level.
    assert_true(rel_err_d(f(ys), ref, (size_t)N * C) < 1e-3);
    test_tensor_free(x);
    test_tensor_free(y);
    test_tensor_free(xs);
    test_tensor_free(ys);
}

static void test_softmax_backward_matches_finite_differences(void **state) {
    SoftmaxCase c = {.x = test_tensor(2, 4, 9), .y = test_tensor(2, 4, 9), .r = test_tensor(2, 4, 9)};
    test_fill(c.x, 410, -3, 3);
    test_fill(c.r, 411, -1, 1);
    Ctx ctx = ctx_cpu();
    softmax_loss(&c);
    Tensor *dx = test_like(c.x), *dx2 = test_like(c.x);
    cpu_softmax_bwd(&ctx, c.r, c.y, dx);
    assert_true(test_gradcheck("softmax dx", softmax_loss, &c, c.x, dx) < GRAD_TOL);
    softmax_loss(&c);   // gradcheck leaves y from a perturbed input; restore it
    for (int rep = 0; rep < 2; rep++) cpu_softmax_bwd(&ctx, c.r, c.y, dx2);
    assert_doubled("softmax dx", dx, dx2);
    Tensor *t[] = {c.x, c.y, c.r, dx, dx2};
    for (size_t i = 0; i < sizeof t / sizeof *t; i++) test_tensor_free(t[i]);
}

// ---- attention --------------------------------------------------------------------------------

typedef struct AttnCase {
    int B, N, C, heads;
    Tensor *qkv, *out, *lse, *r;   // qkv (B,N,3C), out and r (B,N,C), lse (B,heads,N)
} AttnCase;

static AttnCase attn_case(int B, int N, int C, int heads, uint64_t seed) {
    AttnCase c = {.B = B, .N = N, .C = C, .heads = heads, .qkv = test_tensor(3, B, N, 3 * C),
                  .out = test_tensor(3, B, N, C), .lse = test_tensor(3, B, heads, N),
                  .r = test_tensor(3, B, N, C)};
    test_fill(c.qkv, seed, -1.5f, 1.5f);
    test_fill(c.r, seed + 1, -1, 1);
    return c;
}

static void attn_case_free(AttnCase *c) {
    test_tensor_free(c->qkv);
    test_tensor_free(c->out);
    test_tensor_free(c->lse);
    test_tensor_free(c->r);
}

static double attn_loss(void *user) {
    AttnCase *c = user;
    Ctx ctx = ctx_cpu();
    cpu_attention_fwd(&ctx, c->qkv, c->heads, c->out, c->lse);
    return test_dot(c->out, c->r);
}

// Explicit per-head softmax(q k^T / sqrt(D)) v, in double.
static void naive_attention(const AttnCase *c, double *out, double *lse) {
    int B = c->B, N = c->N, C = c->C, H = c->heads, D = C / H;
    const float *qkv = f(c->qkv);
    double *p = malloc(sizeof(double) * N);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < N; i++) {
                const float *q = qkv + ((size_t)b * N + i) * 3 * C + h * D;
                double mx = -INFINITY, s = 0;
                for (int j = 0; j < N; j++) {
                    const float *k = qkv + ((size_t)b * N + j) * 3 * C + C + h * D;
                    double dot = 0;
                    for (int d = 0; d < D; d++) dot += (double)q[d] * k[d];
                    p[j] = dot / sqrt((double)D);
                    mx = fmax(mx, p[j]);
                }
                for (int j = 0; j < N; j++) s += exp(p[j] - mx);
                lse[((size_t)b * H + h) * N + i] = mx + log(s);
                for (int d = 0; d < D; d++) {
                    double o = 0;
                    for (int j = 0; j < N; j++)
                        o += exp(p[j] - mx) / s * qkv[((size_t)b * N + j) * 3 * C + 2 * C + h * D + d];
                    out[((size_t)b * N + i) * C + h * D + d] = o;
                }
            }
    free(p);
}

static void check_attention_forward(int B, int N, int C, int heads, uint64_t seed) {
    AttnCase c = attn_case(B, N, C, heads, seed);
    double *out = malloc(sizeof(double) * B * N * C), *lse = malloc(sizeof(double) * B * heads * N);
    naive_attention(&c, out, lse);
    attn_loss(&c);
    double e_out = rel_err_d(f(c.out), out, c.out->numel), e_lse = rel_err_d(f(c.lse), lse, c.lse->numel);
    printf("    attention B=%d N=%d C=%d heads=%d: out rel err %.2e, lse rel err %.2e\n", B, N, C,
           heads, e_out, e_lse);
    assert_true(e_out < FWD_TOL);
    assert_true(e_lse < FWD_TOL);
    free(out);
    free(lse);
    attn_case_free(&c);
}

static void test_attention_forward_matches_naive_softmax_attention(void **state) {
    check_attention_forward(2, 7, 6, 2, 500);    // small odd shape
    check_attention_forward(1, 70, 8, 1, 501);   // more tokens than one query block
    check_attention_forward(3, 9, 12, 4, 502);   // more (batch, head) tasks than threads
}

static void check_attention_backward(int B, int N, int C, int heads, uint64_t seed) {
    AttnCase c = attn_case(B, N, C, heads, seed);
    Ctx ctx = ctx_cpu();
    attn_loss(&c);
    Tensor *dqkv = test_like(c.qkv), *dqkv2 = test_like(c.qkv);
    cpu_attention_bwd(&ctx, c.r, c.qkv, c.out, c.lse, c.heads, 0, dqkv);
    char name[64];
    snprintf(name, sizeof name, "attention dqkv N=%d h=%d", N, heads);
    assert_true(test_gradcheck(name, attn_loss, &c, c.qkv, dqkv) < GRAD_TOL);
    attn_loss(&c);   // gradcheck leaves out/lse from a perturbed input; restore them
    for (int rep = 0; rep < 2; rep++)
        cpu_attention_bwd(&ctx, c.r, c.qkv, c.out, c.lse, c.heads, 0, dqkv2);
    assert_doubled(name, dqkv, dqkv2);
    test_tensor_free(dqkv);
    test_tensor_free(dqkv2);
    attn_case_free(&c);
}

static void test_attention_backward_matches_finite_differences(void **state) {
    check_attention_backward(2, 7, 6, 2, 510);
    check_attention_backward(1, 70, 4, 1, 511);   // two query blocks: dk, dv summed over both
}

// ---- patch embed ------------------------------------------------------------------------------

typedef struct PatchCase {
    int p;
    Tensor *img, *w, *b, *cols, *y, *r;
} PatchCase;

static PatchCase patch_case(int B, int Cin, int Hi, int Wi, int p, int D, uint64_t seed) {
    int H = Hi / p, W = Wi / p;
    PatchCase c = {.p = p, .img = test_tensor(4, B, Cin, Hi, Wi), .w = test_tensor(4, D, Cin, p, p),
                   .b = test_tensor(1, D), .cols = test_tensor(2, B * H * W, Cin * p * p),
                   .y = test_tensor(4, B, H, W, D), .r = test_tensor(4, B, H, W, D)};
    test_fill(c.img, seed, -1, 1);
    test_fill(c.w, seed + 1, -0.5f, 0.5f);
    test_fill(c.b, seed + 2, -1, 1);
    test_fill(c.r, seed + 3, -1, 1);
    return c;
}

static void patch_case_free(PatchCase *c) {
    Tensor *t[] = {c->img, c->w, c->b, c->cols, c->y, c->r};
    for (size_t i = 0; i < sizeof t / sizeof *t; i++) test_tensor_free(t[i]);
}

static double patch_loss(void *user) {
    PatchCase *c = user;
    Ctx ctx = ctx_cpu();
    cpu_patch_embed_fwd(&ctx, c->img, c->w, c->b, c->p, c->cols, c->y);
    return test_dot(c->y, c->r);
}

static void test_patch_embed_forward_matches_direct_convolution(void **state) {
    int B = 2, Cin = 3, Hi = 8, Wi = 12, p = 4, D = 5, H = Hi / p, W = Wi / p;
    PatchCase c = patch_case(B, Cin, Hi, Wi, p, D, 600);
    patch_loss(&c);
    double *ref = malloc(sizeof(double) * c.y->numel);
    int cols_ok = 1;
    for (int b = 0; b < B; b++)
        for (int i = 0; i < H; i++)
            for (int j = 0; j < W; j++)
                for (int d = 0; d < D; d++) {
                    double s = f(c.b)[d];
                    for (int ci = 0; ci < Cin; ci++)
                        for (int ky = 0; ky < p; ky++)
                            for (int kx = 0; kx < p; kx++) {
                                float px = f(c.img)[(((size_t)b * Cin + ci) * Hi + i * p + ky) * Wi + j * p + kx];
                                int col = (ci * p + ky) * p + kx;   // PyTorch (D,Cin,p,p) order
                                s += (double)f(c.w)[(size_t)d * Cin * p * p + col] * px;
                                cols_ok &= f(c.cols)[(((size_t)b * H + i) * W + j) * Cin * p * p + col] == px;
                            }
                    ref[(((size_t)b * H + i) * W + j) * D + d] = s;
                }
    assert_true(cols_ok);
    assert_true(rel_err_d(f(c.y), ref, c.y->numel) < FWD_TOL);
    free(ref);
    patch_case_free(&c);
}

static void test_patch_embed_backward_matches_finite_differences(void **state) {
    PatchCase c = patch_case(2, 3, 8, 12, 4, 5, 610);
    Ctx ctx = ctx_cpu();
    patch_loss(&c);
    Tensor *dimg = test_like(c.img), *dw = test_like(c.w), *db = test_like(c.b);
    cpu_patch_embed_bwd(&ctx, c.r, c.cols, c.w, c.p, dimg, dw, db);
    assert_true(test_gradcheck("patch_embed dimg", patch_loss, &c, c.img, dimg) < GRAD_TOL);
    assert_true(test_gradcheck("patch_embed dw", patch_loss, &c, c.w, dw) < GRAD_TOL);
    assert_true(test_gradcheck("patch_embed db", patch_loss, &c, c.b, db) < GRAD_TOL);
    patch_loss(&c);   // restore cols of the unperturbed image
    Tensor *dimg2 = test_like(c.img), *dw2 = test_like(c.w), *db2 = test_like(c.b);
    for (int rep = 0; rep < 2; rep++) cpu_patch_embed_bwd(&ctx, c.r, c.cols, c.w, c.p, dimg2, dw2, db2);
    assert_doubled("patch_embed dimg", dimg, dimg2);
    assert_doubled("patch_embed dw", dw, dw2);
    assert_doubled("patch_embed db", db, db2);
    // dimg NULL (the image needs no gradient): dw, db unchanged
    Tensor *dw3 = test_like(c.w), *db3 = test_like(c.b);
    cpu_patch_embed_bwd(&ctx, c.r, c.cols, c.w, c.p, NULL, dw3, db3);
    assert_memory_equal(dw3->data, dw->data, sizeof(float) * dw->numel);
    assert_memory_equal(db3->data, db->data, sizeof(float) * db->numel);
    Tensor *t[] = {dimg, dw, db, dimg2, dw2, db2, dw3, db3};
    for (size_t i = 0; i < sizeof t / sizeof *t; i++) test_tensor_free(t[i]);
    patch_case_free(&c);
}

static void patch_embed_of_ragged_image(void) {   // 10 rows do not split into 4-row patches
    Ctx ctx = ctx_cpu();
    Tensor *img = test_tensor(4, 1, 3, 10, 8), *w = test_tensor(2, 5, 48);
    cpu_patch_embed_fwd(&ctx, img, w, NULL, 4, test_tensor(2, 4, 48), test_tensor(2, 4, 5));
}

static void patch_embed_weight_for_other_channels(void) {   // 2 channels x 4 x 4 is 32, not 48
    Ctx ctx = ctx_cpu();
    Tensor *img = test_tensor(4, 1, 3, 8, 8), *w = test_tensor(2, 5, 32);
    cpu_patch_embed_fwd(&ctx, img, w, NULL, 4, test_tensor(2, 4, 48), test_tensor(2, 4, 5));
}

static void patch_embed_bwd_dimg_of_other_images(void) {   // cols of 4 tokens, dimg of 8
    Ctx ctx = ctx_cpu();
    Tensor *cols = test_tensor(2, 4, 48), *w = test_tensor(2, 5, 48), *dy = test_tensor(2, 4, 5);
    cpu_patch_embed_bwd(&ctx, dy, cols, w, 4, test_tensor(4, 2, 3, 8, 8), NULL, NULL);
}

// Shapes the op does not take stop with a message naming the op and the mismatch
// (kernels/patch_embed_shape.h, shared with the CUDA op; run in a child process).
// The shapes kernels/attention_shape.h refuses: a qkv whose last dim is not 3C, channels that do
// not split into the heads (each in a child process).
static void attention_of_qkv_not_3c(void) {
    Ctx ctx = ctx_cpu();
    cpu_attention_fwd(&ctx, test_tensor(3, 2, 5, 16), 2, test_tensor(3, 2, 5, 5), test_tensor(3, 2, 2, 5));
}
static void attention_of_uneven_heads(void) {
    Ctx ctx = ctx_cpu();
    cpu_attention_fwd(&ctx, test_tensor(3, 2, 5, 18), 4, test_tensor(3, 2, 5, 6), test_tensor(3, 2, 4, 5));
}
static void test_attention_rejects_bad_shapes_with_a_message(void **state) {
    expect_stop(attention_of_qkv_not_3c, (const char *[]){"attention_fwd", "qkv has shape (2, 5, 16)", NULL});
    expect_stop(attention_of_uneven_heads, (const char *[]){"attention_fwd", "6 channels do not split into 4 heads", NULL});
}

static void test_patch_embed_rejects_shapes_it_does_not_take(void **state) {
    expect_stop(patch_embed_of_ragged_image,
                (const char *[]){"patch_embed_fwd", "10x8 image does not split into 4x4", NULL});
    expect_stop(patch_embed_weight_for_other_channels,
                (const char *[]){"patch_embed_fwd", "w has shape (5, 32)", NULL});
    expect_stop(patch_embed_bwd_dimg_of_other_images,
                (const char *[]){"patch_embed_bwd", "does not match cols of 4 tokens", NULL});
}

// ---- the profile hook (kernels/ctx.h): every op_* reports its name and its tensors' bytes ----

typedef struct HookLog { const char *op[8]; double bytes[8]; int begins, ends; } HookLog;
static HookLog g_hook;
static void record_hook(Ctx *ctx, const char *op, int end, double bytes) {
    (void)ctx;
    if (end) {
        g_hook.ends++;
        return;
    }
    if (g_hook.begins < 8) g_hook.op[g_hook.begins] = op, g_hook.bytes[g_hook.begins] = bytes;
    g_hook.begins++;
}

static void test_profile_hook_gets_each_ops_name_and_tensor_bytes(void **state) {
    Ctx ctx = ctx_cpu();
    memset(&g_hook, 0, sizeof g_hook);
    ctx.profile = record_hook;
    Tensor *a = test_tensor(2, 3, 4), *b = test_tensor(2, 3, 4), *y = test_tensor(2, 3, 4);
    Tensor *w = test_tensor(2, 5, 4), *y5 = test_tensor(2, 3, 5);
    test_fill(a, 1, -1, 1);
    test_fill(b, 2, -1, 1);
    test_fill(w, 3, -1, 1);
    op_add_fwd(&ctx, a, b, y);                 // three (3,4) fp32 tensors: 3 x 48 bytes
    op_scale_fwd(&ctx, a, 2.0f, y);            // the float counts nothing: 2 x 48
    op_linear_fwd(&ctx, a, w, NULL, NULL, y5); // a NULL bias counts nothing: 48 + 80 + 60
    // A fused variant is a row of its own, its options' tensors counted (+ res: 248 bytes); and
    // LayerNorm with the add (h = a + b into y, normalized into n)
    Tensor *res = test_tensor(2, 3, 5), *r5 = test_tensor(2, 3, 5), *n = test_tensor(2, 3, 4);
    op_linear_fwd(&ctx, a, w, NULL, &(LinearFwdOpts){.res = res}, r5);
    op_layernorm_fwd(&ctx, a, b, NULL, NULL, 1e-5f, y, n, NULL, NULL);
    assert_int_equal(g_hook.begins, 5);
    assert_int_equal(g_hook.ends, 5);
    assert_string_equal(g_hook.op[0], "add_fwd");
    assert_string_equal(g_hook.op[1], "scale_fwd");
    assert_string_equal(g_hook.op[2], "linear_fwd");
    assert_string_equal(g_hook.op[3], "linear_fwd+res");
    assert_string_equal(g_hook.op[4], "layernorm_fwd+add");
    assert_float_equal(g_hook.bytes[0], 144.0, 0.0);
    assert_float_equal(g_hook.bytes[1], 96.0, 0.0);
    assert_float_equal(g_hook.bytes[2], 188.0, 0.0);
    assert_float_equal(g_hook.bytes[3], 248.0, 0.0);
    Tensor *t[] = {a, b, y, w, y5, res, r5, n};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) test_tensor_free(t[i]);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_profile_hook_gets_each_ops_name_and_tensor_bytes),
        cmocka_unit_test(test_sgemm_matches_naive_for_all_transposes),
        cmocka_unit_test(test_sgemm_is_deterministic_across_thread_counts),
        cmocka_unit_test(test_linear_forward_matches_naive_matmul),
        cmocka_unit_test(test_linear_backward_matches_finite_differences),
        cmocka_unit_test(test_linear_backward_accumulates_and_skips_null_gradients),
        cmocka_unit_test(test_linear_backward_is_deterministic_across_thread_counts),
        cmocka_unit_test(test_linear_rejects_mismatched_shapes_with_a_message),
        cmocka_unit_test(test_linear_refuses_unimplemented_fusions_by_name),
        cmocka_unit_test(test_layernorm_forward_matches_naive),
        cmocka_unit_test(test_layernorm_backward_matches_finite_differences),
        cmocka_unit_test(test_layernorm_rejects_bad_shapes_with_a_message),
        cmocka_unit_test(test_gelu_erf_and_tanh_match_known_values),
        cmocka_unit_test(test_gelu_backward_matches_finite_differences),
        cmocka_unit_test(test_silu_matches_known_values_and_finite_differences),
        cmocka_unit_test(test_softmax_forward_matches_naive_and_is_stable),
        cmocka_unit_test(test_softmax_backward_matches_finite_differences),
        cmocka_unit_test(test_attention_forward_matches_naive_softmax_attention),
        cmocka_unit_test(test_attention_backward_matches_finite_differences),
        cmocka_unit_test(test_attention_rejects_bad_shapes_with_a_message),
        cmocka_unit_test(test_patch_embed_forward_matches_direct_convolution),
        cmocka_unit_test(test_patch_embed_backward_matches_finite_differences),
        cmocka_unit_test(test_patch_embed_rejects_shapes_it_does_not_take),
    };
    return cmocka_run_group_tests_name("ops_dense", tests, NULL, NULL);
}
