// GSPN-1's gate recurrence through the C ABI (kernels/cgspn.h, cgspn_gate_recurrent_fwd/bwd) on
// the CPU: the forward against a loop written here from the formula, the backward against central
// differences of sum(dout * out) in fp64, overwrite and accumulate, bf16 against fp32, and bad
// arguments (CUDA on host memory among them) coming back as status codes with the outputs
// untouched. The CUDA kernel is checked through PyTorch (tests/gpu/test_gate_recurrent_torch.py).
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "abi_testlib.h"

// fp64 central differences, step 1e-5 on values of order 1: truncation ~1e-10 (the output is
// polynomial of degree <= W in each input, smooth) and cancellation ~1e-16 / 1e-5 = 1e-11, so
// 1e-7 relative is a wide margin that a wrong neighbour, gate or run boundary cannot pass.
#define FD_TOL 1e-7
// bf16 outputs are fp32 results rounded once: at most 2^-8 relative per element.
#define BF16_TOL 4e-3

typedef struct Shape { int N, C, H, W, chunk; } Shape;
// odd sizes; runs of 1, of 3 on 7 columns (a short last run), one run (chunk >= W); one row; one column
static const Shape SHAPES[] = {{2, 3, 5, 7, 3}, {1, 2, 4, 6, 1}, {1, 1, 3, 5, 9},
                               {2, 1, 1, 6, 4}, {1, 2, 6, 1, 2}};
enum { NIN = 5 };   // x, b, g1, g2, g3

static size_t numel(const Shape *s) { return (size_t)s->N * s->C * s->H * s->W; }

static double *random_f64(size_t n, uint64_t seed, double lo, double hi) {
    double *v = malloc(n * sizeof *v);
    uint64_t z = seed * 0x9e3779b97f4a7c15ULL + 1;
    for (size_t i = 0; i < n; i++) {
        z ^= z << 13, z ^= z >> 7, z ^= z << 17;
        v[i] = lo + (hi - lo) * (double)(z >> 11) / 9007199254740992.0;
    }
    return v;
}

// The formula, one element at a time.
static void reference_fwd(const Shape *s, double *const in[NIN], double *out) {
    const double *x = in[0], *b = in[1], *g1 = in[2], *g2 = in[3], *g3 = in[4];
    for (size_t p = 0; p < (size_t)s->N * s->C; p++)
        for (int w = 0; w < s->W; w++)
            for (int h = 0; h < s->H; h++) {
                const size_t i = (p * s->H + h) * s->W + w;
                double v = b[i] * x[i];
                if (w % s->chunk != 0) {   // not the first column of a run
                    if (h > 0) v += g1[i] * out[i - s->W - 1];
                    v += g2[i] * out[i - 1];
                    if (h + 1 < s->H) v += g3[i] * out[i + s->W - 1];
                }
                out[i] = v;
            }
}

static double loss(const Shape *s, double *const in[NIN], const double *dout) {
    const size_t n = numel(s);
    double *out = malloc(n * sizeof *out), sum = 0;
    reference_fwd(s, in, out);
    for (size_t i = 0; i < n; i++) sum += dout[i] * out[i];
    free(out);
    return sum;
}

static void test_gate_recurrent_forward_matches_the_formula(void **state) {
    for (size_t k = 0; k < sizeof SHAPES / sizeof *SHAPES; k++) {
        const Shape *s = &SHAPES[k];
        const size_t n = numel(s);
        double *in[NIN], *got = malloc(n * sizeof *got), *want = malloc(n * sizeof *want);
        for (int j = 0; j < NIN; j++) in[j] = random_f64(n, 10 * k + j + 1, -1, 1);
        reference_fwd(s, in, want);
        assert_int_equal(cgspn_gate_recurrent_fwd(CGSPN_DEVICE_CPU, NULL, CGSPN_DTYPE_F64, s->N, s->C,
                                                  s->H, s->W, s->chunk, in[0], in[1], in[2], in[3],
                                                  in[4], got), CGSPN_OK);
        for (size_t i = 0; i < n; i++) assert_true(fabs(got[i] - want[i]) <= 1e-12 * (1 + fabs(want[i])));
        for (int j = 0; j < NIN; j++) free(in[j]);
        free(got);
        free(want);
    }
}

static void test_gate_recurrent_backward_matches_finite_differences(void **state) {
    static const char *names[NIN] = {"dx", "db", "dg1", "dg2", "dg3"};
    for (size_t k = 0; k < sizeof SHAPES / sizeof *SHAPES; k++) {
        const Shape *s = &SHAPES[k];
        const size_t n = numel(s);
        double *in[NIN], *grad[NIN], *out = malloc(n * sizeof *out);
        double *dout = random_f64(n, 100 + k, -1, 1);
        for (int j = 0; j < NIN; j++) {
            in[j] = random_f64(n, 10 * k + j + 1, -1, 1);
            grad[j] = malloc(n * sizeof **grad);
        }
        assert_int_equal(cgspn_gate_recurrent_fwd(CGSPN_DEVICE_CPU, NULL, CGSPN_DTYPE_F64, s->N, s->C,
                                                  s->H, s->W, s->chunk, in[0], in[1], in[2], in[3],
                                                  in[4], out), CGSPN_OK);
        assert_int_equal(cgspn_gate_recurrent_bwd(CGSPN_DEVICE_CPU, NULL, CGSPN_DTYPE_F64, s->N, s->C,
                                                  s->H, s->W, s->chunk, dout, in[0], in[1], in[2],
                                                  in[3], in[4], out, CGSPN_GRAD_OVERWRITE, grad[0],
                                                  grad[1], grad[2], grad[3], grad[4]), CGSPN_OK);
        for (int j = 0; j < NIN; j++) {
            double err = 0, ref = 0;
            for (size_t i = 0; i < n; i++) {
                const double keep = in[j][i], eps = 1e-5;
                in[j][i] = keep + eps;
                const double lp = loss(s, in, dout);
                in[j][i] = keep - eps;
                const double lm = loss(s, in, dout);
                in[j][i] = keep;
                const double fd = (lp - lm) / (2 * eps);
                err += (grad[j][i] - fd) * (grad[j][i] - fd);
                ref += fd * fd;
            }
            if (sqrt(err) > FD_TOL * (1 + sqrt(ref)))
                fail_msg("shape %zu %s: |grad - fd| = %.3g, |fd| = %.3g", k, names[j], sqrt(err),
                         sqrt(ref));
        }
        for (int j = 0; j < NIN; j++) free(in[j]), free(grad[j]);
        free(out);
        free(dout);
    }
}

static void test_gate_recurrent_accumulate_adds_and_bf16_rounds(void **state) {
    const Shape s = {2, 3, 5, 7, 3};
    const size_t n = numel(&s);
    // fp32 inputs from fp64 draws; the accumulate mode adds to what the gradients held
    float *in[NIN], *dout = malloc(n * sizeof *dout), *out = malloc(n * sizeof *out);
    float *g_over[NIN], *g_acc[NIN];
    double *d = random_f64(n, 77, -1, 1);
    for (size_t i = 0; i < n; i++) dout[i] = (float)d[i];
    free(d);
    for (int j = 0; j < NIN; j++) {
        double *v = random_f64(n, 50 + j, -1, 1);
        in[j] = malloc(n * sizeof **in);
        g_over[j] = malloc(n * sizeof **g_over);
        g_acc[j] = malloc(n * sizeof **g_acc);
        for (size_t i = 0; i < n; i++) in[j][i] = (float)v[i], g_acc[j][i] = 0.5f;
        free(v);
    }
    assert_int_equal(cgspn_gate_recurrent_fwd(CGSPN_DEVICE_CPU, NULL, CGSPN_DTYPE_F32, s.N, s.C, s.H,
                                              s.W, s.chunk, in[0], in[1], in[2], in[3], in[4], out),
                     CGSPN_OK);
    assert_int_equal(cgspn_gate_recurrent_bwd(CGSPN_DEVICE_CPU, NULL, CGSPN_DTYPE_F32, s.N, s.C, s.H,
                                              s.W, s.chunk, dout, in[0], in[1], in[2], in[3], in[4],
                                              out, CGSPN_GRAD_OVERWRITE, g_over[0], g_over[1],
                                              g_over[2], g_over[3], g_over[4]), CGSPN_OK);
    assert_int_equal(cgspn_gate_recurrent_bwd(CGSPN_DEVICE_CPU, NULL, CGSPN_DTYPE_F32, s.N, s.C, s.H,
                                              s.W, s.chunk, dout, in[0], in[1], in[2], in[3], in[4],
                                              out, CGSPN_GRAD_ACCUMULATE, g_acc[0], g_acc[1], g_acc[2],
                                              g_acc[3], g_acc[4]), CGSPN_OK);
    for (int j = 0; j < NIN; j++)
        for (size_t i = 0; i < n; i++) assert_float_equal(g_acc[j][i], 0.5f + g_over[j][i], 0.0f);

    // bf16: the same inputs rounded; out and the gradients within one rounding of fp32's on them
    uint16_t *bin[NIN], *bout = malloc(n * 2), *bdout = malloc(n * 2), *bg[NIN];
    float *fin[NIN], *fout = malloc(n * sizeof *fout), *fdout = malloc(n * sizeof *fdout), *fg[NIN];
    for (size_t i = 0; i < n; i++) bdout[i] = f32_to_bf16(dout[i]), fdout[i] = bf16_to_f32(bdout[i]);
    for (int j = 0; j < NIN; j++) {
        bin[j] = malloc(n * 2), bg[j] = malloc(n * 2);
        fin[j] = malloc(n * sizeof **fin), fg[j] = malloc(n * sizeof **fg);
        for (size_t i = 0; i < n; i++) bin[j][i] = f32_to_bf16(in[j][i]), fin[j][i] = bf16_to_f32(bin[j][i]);
    }
    assert_int_equal(cgspn_gate_recurrent_fwd(CGSPN_DEVICE_CPU, NULL, CGSPN_DTYPE_BF16, s.N, s.C, s.H,
                                              s.W, s.chunk, bin[0], bin[1], bin[2], bin[3], bin[4],
                                              bout), CGSPN_OK);
    assert_int_equal(cgspn_gate_recurrent_fwd(CGSPN_DEVICE_CPU, NULL, CGSPN_DTYPE_F32, s.N, s.C, s.H,
                                              s.W, s.chunk, fin[0], fin[1], fin[2], fin[3], fin[4],
                                              fout), CGSPN_OK);
    for (size_t i = 0; i < n; i++)
        assert_true(fabsf(bf16_to_f32(bout[i]) - fout[i]) <= BF16_TOL * (fabsf(fout[i]) + 1e-6f));
    // the backward reads out as given: give both paths the bf16 one
    for (size_t i = 0; i < n; i++) fout[i] = bf16_to_f32(bout[i]);
    assert_int_equal(cgspn_gate_recurrent_bwd(CGSPN_DEVICE_CPU, NULL, CGSPN_DTYPE_BF16, s.N, s.C, s.H,
                                              s.W, s.chunk, bdout, bin[0], bin[1], bin[2], bin[3],
                                              bin[4], bout, CGSPN_GRAD_OVERWRITE, bg[0], bg[1], bg[2],
                                              bg[3], bg[4]), CGSPN_OK);
    assert_int_equal(cgspn_gate_recurrent_bwd(CGSPN_DEVICE_CPU, NULL, CGSPN_DTYPE_F32, s.N, s.C, s.H,
                                              s.W, s.chunk, fdout, fin[0], fin[1], fin[2], fin[3],
                                              fin[4], fout, CGSPN_GRAD_OVERWRITE, fg[0], fg[1], fg[2],
                                              fg[3], fg[4]), CGSPN_OK);
    for (int j = 0; j < NIN; j++)
        for (size_t i = 0; i < n; i++)
            assert_true(fabsf(bf16_to_f32(bg[j][i]) - fg[j][i]) <= BF16_TOL * (fabsf(fg[j][i]) + 1e-6f));
    for (int j = 0; j < NIN; j++) {
        free(in[j]), free(g_over[j]), free(g_acc[j]);
        free(bin[j]), free(bg[j]), free(fin[j]), free(fg[j]);
    }
    free(dout), free(out), free(bout), free(bdout), free(fout), free(fdout);
}

static void test_gate_recurrent_bad_arguments_write_nothing(void **state) {
    enum { N = 1, C = 1, H = 2, W = 3 };
    float x[6] = {1, 2, 3, 4, 5, 6}, out[6], dx[6];
    for (int i = 0; i < 6; i++) out[i] = dx[i] = 1234.5f;
    const int dev = CGSPN_DEVICE_CPU, f32 = CGSPN_DTYPE_F32;
    assert_int_equal(cgspn_gate_recurrent_fwd(dev, NULL, f32, N, C, H, W, 0, x, x, x, x, x, out),
                     CGSPN_ERR_BAD_ARGUMENT);
    assert_int_equal(cgspn_gate_recurrent_fwd(dev, NULL, f32, N, C, 0, W, 1, x, x, x, x, x, out),
                     CGSPN_ERR_BAD_SHAPE);
    assert_int_equal(cgspn_gate_recurrent_fwd(dev, NULL, f32, N, C, H, W, 1, x, x, NULL, x, x, out),
                     CGSPN_ERR_NULL_POINTER);
    assert_int_equal(cgspn_gate_recurrent_fwd(dev, NULL, 7, N, C, H, W, 1, x, x, x, x, x, out),
                     CGSPN_ERR_BAD_DTYPE);
    // CUDA on host memory: refused whatever the build (no CUDA: unsupported; CUDA but no GPU: the
    // pointer query fails; a GPU: not device memory). fp64, and planes taller than the kernel
    // takes, are the CPU's alone.
    const int st = cgspn_gate_recurrent_fwd(CGSPN_DEVICE_CUDA, NULL, f32, N, C, H, W, 1, x, x, x, x,
                                            x, out);
    assert_cuda_on_host_refused(st);
    assert_int_equal(cgspn_gate_recurrent_fwd(CGSPN_DEVICE_CUDA, NULL, CGSPN_DTYPE_F64, N, C, H, W, 1,
                                              x, x, x, x, x, out), CGSPN_ERR_UNSUPPORTED);
    float *tall = calloc(2049, sizeof *tall);
    assert_int_equal(cgspn_gate_recurrent_fwd(CGSPN_DEVICE_CUDA, NULL, f32, 1, 1, 2049, 1, 1, tall,
                                              tall, tall, tall, tall, tall), CGSPN_ERR_UNSUPPORTED);
    free(tall);
    assert_int_equal(cgspn_gate_recurrent_bwd(dev, NULL, f32, N, C, H, W, 1, x, x, x, x, x, x, x, 2,
                                              dx, NULL, NULL, NULL, NULL), CGSPN_ERR_BAD_ARGUMENT);
    assert_int_equal(cgspn_gate_recurrent_bwd(dev, NULL, f32, N, C, H, W, 1, NULL, x, x, x, x, x, x,
                                              CGSPN_GRAD_OVERWRITE, dx, NULL, NULL, NULL, NULL),
                     CGSPN_ERR_NULL_POINTER);
    assert_true(strstr(cgspn_last_error(), "dout") != NULL);
    for (int i = 0; i < 6; i++) assert_float_equal(out[i], 1234.5f, 0.0f), assert_float_equal(dx[i], 1234.5f, 0.0f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gate_recurrent_forward_matches_the_formula),
        cmocka_unit_test(test_gate_recurrent_backward_matches_finite_differences),
        cmocka_unit_test(test_gate_recurrent_accumulate_adds_and_bf16_rounds),
        cmocka_unit_test(test_gate_recurrent_bad_arguments_write_nothing),
    };
    return cmocka_run_group_tests_name("gate_recurrent", tests, NULL, NULL);
}
