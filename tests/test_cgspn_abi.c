// The C ABI of libcgspn (kernels/cgspn.h): the fp32 path equals the op it wraps
// (cpu_gspn_scan_fwd/bwd), overwrite and accumulate modes, the fp64 and bf16 CPU paths against
// fp32, and bad arguments coming back as status codes with every output untouched.
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <pthread.h>
#include "abi_testlib.h"
#include "../kernels/ops.h"
#include "../kernels/error.h"

// fp64 vs fp32 on scans of a few steps over values of order 1: each fp32 rounding is ~6e-8
// relative and a result carries a few dozen of them, so 1e-5 in norm is a wide margin that a
// wrong index or weight (errors of order 0.1) cannot pass.
#define F64_TOL 1e-5
// bf16 outputs are fp32 results rounded once to 8 significant bits: at most 2^-8 = 3.9e-3
// relative per element, so at most that in norm; accumulate mode rounds once more (twice that).
#define BF16_TOL 4e-3
#define BF16_ACC_TOL 8e-3
// Accumulate mode vs P + (overwrite result): one fp32 addition each, so equal to rounding.
#define ACC_TOL 1e-6
// Canary written into every output before a call that must fail.
#define CANARY 1234.5f

static int gate_width(int Cc, int shared_w) { return shared_w ? 4 * (2 * Cc + 3) : 20 * Cc; }

// One problem on the CPU in fp32, as Tensors for the op and raw pointers for the ABI.
typedef struct Problem {
    int B, H, W, Cc, G, shared_w;
    Tensor *xc, *gates, *merge, *dyc;
} Problem;

static Problem problem_new(int B, int H, int W, int Cc, int shared_w, uint64_t seed) {
    Problem p = {B, H, W, Cc, gate_width(Cc, shared_w), shared_w, NULL, NULL, NULL, NULL};
    p.xc = test_tensor(4, B, H, W, Cc);
    p.gates = test_tensor(4, B, H, W, p.G);
    p.merge = test_tensor(1, 4);
    p.dyc = test_tensor(4, B, H, W, Cc);
    test_fill(p.xc, seed + 1, -1.0f, 1.0f);
    test_fill(p.gates, seed + 2, -2.0f, 2.0f);
    test_fill(p.merge, seed + 3, -1.0f, 1.0f);
    test_fill(p.dyc, seed + 4, -1.0f, 1.0f);
    return p;
}

static void problem_free(Problem *p) {
    test_tensor_free(p->xc);
    test_tensor_free(p->gates);
    test_tensor_free(p->merge);
    test_tensor_free(p->dyc);
}

static Ctx cpu_ctx(void) {
    return (Ctx){.device = DEVICE_CPU, .act_dtype = DTYPE_F32, .deterministic = 1};
}

typedef struct Outputs { Tensor *yc, *hidden, *dxc, *dgates, *dmerge; } Outputs;

static Outputs outputs_new(const Problem *p, float fill) {
    Outputs o = {test_like(p->xc), test_tensor(5, 4, p->B, p->H, p->W, p->Cc), test_like(p->xc),
                 test_like(p->gates), test_like(p->merge)};
    Tensor *all[5] = {o.yc, o.hidden, o.dxc, o.dgates, o.dmerge};
    for (int i = 0; i < 5; i++)
        for (size_t k = 0; k < all[i]->numel; k++) tensor_f32(all[i])[k] = fill;
    return o;
}

static void outputs_free(Outputs *o) {
    test_tensor_free(o->yc);
    test_tensor_free(o->hidden);
    test_tensor_free(o->dxc);
    test_tensor_free(o->dgates);
    test_tensor_free(o->dmerge);
}

// The op itself (accumulating into zeroed gradients): the reference the ABI must reproduce.
static Outputs op_reference(const Problem *p) {
    Ctx ctx = cpu_ctx();
    Outputs o = outputs_new(p, 0.0f);
    cpu_gspn_scan_fwd(&ctx, p->xc, p->gates, p->merge, p->shared_w, o.yc, o.hidden);
    cpu_gspn_scan_bwd(&ctx, p->dyc, p->xc, p->gates, p->merge, p->shared_w, o.hidden, 0, o.dxc,
                      o.dgates, o.dmerge);
    return o;
}

static int abi_fwd(const Problem *p, int dtype, const void *xc, const void *gates,
                   const void *merge, void *yc, void *hidden) {
    return cgspn_gspn_scan_fwd(CGSPN_DEVICE_CPU, NULL, dtype, p->B, p->H, p->W, p->Cc,
                               p->shared_w, xc, gates, merge, yc, hidden);
}

static int abi_bwd(const Problem *p, int dtype, const void *dyc, const void *xc,
                   const void *gates, const void *merge, const void *hidden, int mode,
                   void *dxc, void *dgates, void *dmerge) {
    return cgspn_gspn_scan_bwd(CGSPN_DEVICE_CPU, NULL, dtype, p->B, p->H, p->W, p->Cc,
                               p->shared_w, dyc, xc, gates, merge, hidden, mode, dxc, dgates,
                               dmerge);
}

static void assert_same(const Tensor *got, const Tensor *want) {
    assert_memory_equal(got->data, want->data, tensor_bytes(want));
}

static const int SHAPES[][4] = {{2, 3, 5, 3}, {1, 4, 1, 2}, {1, 1, 6, 1}, {2, 6, 7, 4}};
#define N_SHAPES (sizeof SHAPES / sizeof SHAPES[0])

// ---- tests -------------------------------------------------------------------------------------

static void test_abi_version_and_status_strings(void **state) {
    assert_int_equal(cgspn_abi_version(), CGSPN_ABI_VERSION);
    for (int s = CGSPN_OK; s <= CGSPN_ERR_BACKEND; s++) {
        assert_non_null(cgspn_status_string(s));
        assert_string_not_equal(cgspn_status_string(s), "unknown status");
        for (int t = CGSPN_OK; t < s; t++)
            assert_string_not_equal(cgspn_status_string(s), cgspn_status_string(t));
    }
    assert_string_equal(cgspn_status_string(-1), "unknown status");
    assert_string_equal(cgspn_status_string(1000), "unknown status");
}

static void test_abi_fp32_forward_equals_cpu_op(void **state) {
    for (size_t s = 0; s < N_SHAPES; s++)
        for (int shared = 0; shared <= 1; shared++) {
            const int *d = SHAPES[s];
            Problem p = problem_new(d[0], d[1], d[2], d[3], shared, 10 * s + shared);
            Outputs want = op_reference(&p), got = outputs_new(&p, CANARY);
            assert_int_equal(abi_fwd(&p, CGSPN_DTYPE_F32, p.xc->data, p.gates->data,
                                     p.merge->data, got.yc->data, got.hidden->data), CGSPN_OK);
            assert_string_equal(cgspn_last_error(), "");
            assert_same(got.yc, want.yc);
            assert_same(got.hidden, want.hidden);
            // hidden is optional
            Tensor *yc2 = test_like(p.xc);
            assert_int_equal(abi_fwd(&p, CGSPN_DTYPE_F32, p.xc->data, p.gates->data,
                                     p.merge->data, yc2->data, NULL), CGSPN_OK);
            assert_same(yc2, want.yc);
            test_tensor_free(yc2);
            outputs_free(&want);
            outputs_free(&got);
            problem_free(&p);
        }
}

static void test_abi_fp32_backward_overwrites_or_accumulates_like_cpu_op(void **state) {
    for (size_t s = 0; s < N_SHAPES; s++)
        for (int shared = 0; shared <= 1; shared++) {
            const int *d = SHAPES[s];
            Problem p = problem_new(d[0], d[1], d[2], d[3], shared, 20 * s + shared);
            Outputs want = op_reference(&p);
            for (int saved = 0; saved <= 1; saved++) {   // hidden from the forward, or recomputed
                const void *hidden = saved ? want.hidden->data : NULL;
                // Overwrite: whatever was in the outputs is replaced.
                Outputs got = outputs_new(&p, CANARY);
                assert_int_equal(abi_bwd(&p, CGSPN_DTYPE_F32, p.dyc->data, p.xc->data,
                                         p.gates->data, p.merge->data, hidden,
                                         CGSPN_GRAD_OVERWRITE, got.dxc->data, got.dgates->data,
                                         got.dmerge->data), CGSPN_OK);
                assert_same(got.dxc, want.dxc);
                assert_same(got.dgates, want.dgates);
                assert_same(got.dmerge, want.dmerge);
                // Accumulate: prior + gradient.
                Outputs acc = outputs_new(&p, 0.0f);
                Tensor *a[3] = {acc.dxc, acc.dgates, acc.dmerge};
                Tensor *w[3] = {want.dxc, want.dgates, want.dmerge};
                for (int n = 0; n < 3; n++) test_fill(a[n], 77 + n, -1.0f, 1.0f);
                Tensor *expect[3];
                for (int n = 0; n < 3; n++) {
                    expect[n] = test_like(a[n]);
                    for (size_t k = 0; k < a[n]->numel; k++)
                        tensor_f32(expect[n])[k] = tensor_f32(a[n])[k] + tensor_f32(w[n])[k];
                }
                assert_int_equal(abi_bwd(&p, CGSPN_DTYPE_F32, p.dyc->data, p.xc->data,
                                         p.gates->data, p.merge->data, hidden,
                                         CGSPN_GRAD_ACCUMULATE, acc.dxc->data, acc.dgates->data,
                                         acc.dmerge->data), CGSPN_OK);
                for (int n = 0; n < 3; n++) {
                    assert_true(test_rel_err(a[n]->data, expect[n]->data, a[n]->numel) < ACC_TOL);
                    test_tensor_free(expect[n]);
                }
                // One gradient at a time; the others are not touched.
                Outputs one = outputs_new(&p, CANARY);
                assert_int_equal(abi_bwd(&p, CGSPN_DTYPE_F32, p.dyc->data, p.xc->data,
                                         p.gates->data, p.merge->data, hidden,
                                         CGSPN_GRAD_OVERWRITE, NULL, one.dgates->data, NULL),
                                 CGSPN_OK);
                assert_same(one.dgates, want.dgates);
                assert_float_equal(tensor_f32(one.dxc)[0], CANARY, 0.0f);
                assert_float_equal(tensor_f32(one.dmerge)[0], CANARY, 0.0f);
                outputs_free(&got);
                outputs_free(&acc);
                outputs_free(&one);
            }
            outputs_free(&want);
            problem_free(&p);
        }
}

static double *to_f64(const Tensor *t) {
    double *d = malloc(t->numel * sizeof(double));
    for (size_t k = 0; k < t->numel; k++) d[k] = tensor_f32(t)[k];
    return d;
}

// ||f32 - f64|| / ||f64||
static double rel_err_f64(const Tensor *f32, const double *f64) {
    double num = 0, den = 0;
    for (size_t k = 0; k < f32->numel; k++) {
        double e = tensor_f32(f32)[k] - f64[k];
        num += e * e;
        den += f64[k] * f64[k];
    }
    return sqrt(num) / fmax(sqrt(den), 1e-300);
}

static void test_abi_fp64_agrees_with_fp32(void **state) {
    double worst = 0;
    for (size_t s = 0; s < N_SHAPES; s++)
        for (int shared = 0; shared <= 1; shared++) {
            const int *d = SHAPES[s];
            Problem p = problem_new(d[0], d[1], d[2], d[3], shared, 30 * s + shared);
            Outputs want = op_reference(&p);
            double *xc = to_f64(p.xc), *gates = to_f64(p.gates), *merge = to_f64(p.merge);
            double *dyc = to_f64(p.dyc);
            double *yc = calloc(p.xc->numel, sizeof(double));
            double *hidden = calloc(4 * p.xc->numel, sizeof(double));
            double *dxc = calloc(p.xc->numel, sizeof(double));
            double *dgates = calloc(p.gates->numel, sizeof(double));
            double dmerge[4] = {0};
            assert_int_equal(abi_fwd(&p, CGSPN_DTYPE_F64, xc, gates, merge, yc, hidden), CGSPN_OK);
            assert_int_equal(abi_bwd(&p, CGSPN_DTYPE_F64, dyc, xc, gates, merge, NULL,
                                     CGSPN_GRAD_OVERWRITE, dxc, dgates, dmerge), CGSPN_OK);
            const double err[5] = {rel_err_f64(want.yc, yc), rel_err_f64(want.hidden, hidden),
                                   rel_err_f64(want.dxc, dxc), rel_err_f64(want.dgates, dgates),
                                   rel_err_f64(want.dmerge, dmerge)};
            for (int n = 0; n < 5; n++) {
                worst = fmax(worst, err[n]);
                assert_true(err[n] < F64_TOL);
            }
            free(xc), free(gates), free(merge), free(dyc);
            free(yc), free(hidden), free(dxc), free(dgates);
            outputs_free(&want);
            problem_free(&p);
        }
    printf("    worst fp32 vs fp64 rel err %.2e\n", worst);
}

static uint16_t bf16_round(float f) {   // nearest even; test values are finite
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static float bf16_value(uint16_t v) {
    uint32_t u = (uint32_t)v << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

// t rounded to bf16 in place (so fp32 and bf16 runs see the same inputs); returns the bf16 copy.
static uint16_t *to_bf16(Tensor *t) {
    uint16_t *b = malloc(t->numel * sizeof(uint16_t));
    for (size_t k = 0; k < t->numel; k++) {
        b[k] = bf16_round(tensor_f32(t)[k]);
        tensor_f32(t)[k] = bf16_value(b[k]);
    }
    return b;
}

static double rel_err_bf16(const uint16_t *got, const Tensor *want) {
    float *g = malloc(want->numel * sizeof(float));
    for (size_t k = 0; k < want->numel; k++) g[k] = bf16_value(got[k]);
    double e = test_rel_err(g, want->data, want->numel);
    free(g);
    return e;
}

static void test_abi_bf16_cpu_path_matches_fp32_to_bf16_rounding(void **state) {
    for (int shared = 0; shared <= 1; shared++) {
        Problem p = problem_new(2, 6, 7, 4, shared, 40 + shared);
        uint16_t *xc = to_bf16(p.xc), *gates = to_bf16(p.gates), *dyc = to_bf16(p.dyc);
        Outputs want = op_reference(&p), got = outputs_new(&p, 0.0f);   // merge etc. stay fp32
        const size_t n = p.xc->numel, ng = p.gates->numel;
        uint16_t *yc = calloc(n, 2), *dxc = calloc(n, 2), *dgates = calloc(ng, 2);
        assert_int_equal(abi_fwd(&p, CGSPN_DTYPE_BF16, xc, gates, p.merge->data, yc,
                                 got.hidden->data), CGSPN_OK);
        assert_true(rel_err_bf16(yc, want.yc) < BF16_TOL);
        assert_true(test_rel_err(got.hidden->data, want.hidden->data, want.hidden->numel) <
                    ACC_TOL);
        assert_int_equal(abi_bwd(&p, CGSPN_DTYPE_BF16, dyc, xc, gates, p.merge->data, NULL,
                                 CGSPN_GRAD_OVERWRITE, dxc, dgates, got.dmerge->data), CGSPN_OK);
        assert_true(rel_err_bf16(dxc, want.dxc) < BF16_TOL);
        assert_true(rel_err_bf16(dgates, want.dgates) < BF16_TOL);
        assert_true(test_rel_err(got.dmerge->data, want.dmerge->data, 4) < ACC_TOL);
        // Accumulate: twice the gradient.
        assert_int_equal(abi_bwd(&p, CGSPN_DTYPE_BF16, dyc, xc, gates, p.merge->data, NULL,
                                 CGSPN_GRAD_ACCUMULATE, dxc, dgates, got.dmerge->data), CGSPN_OK);
        for (size_t k = 0; k < n; k++) tensor_f32(want.dxc)[k] *= 2.0f;
        for (size_t k = 0; k < ng; k++) tensor_f32(want.dgates)[k] *= 2.0f;
        for (size_t k = 0; k < 4; k++) tensor_f32(want.dmerge)[k] *= 2.0f;
        assert_true(rel_err_bf16(dxc, want.dxc) < BF16_ACC_TOL);
        assert_true(rel_err_bf16(dgates, want.dgates) < BF16_ACC_TOL);
        assert_true(test_rel_err(got.dmerge->data, want.dmerge->data, 4) < ACC_TOL);
        free(xc), free(gates), free(dyc), free(yc), free(dxc), free(dgates);
        outputs_free(&want);
        outputs_free(&got);
        problem_free(&p);
    }
}

// Every output still holds the canary.
static void assert_untouched(const Outputs *o) {
    const Tensor *all[5] = {o->yc, o->hidden, o->dxc, o->dgates, o->dmerge};
    for (int i = 0; i < 5; i++)
        for (size_t k = 0; k < all[i]->numel; k++)
            assert_float_equal(tensor_f32(all[i])[k], CANARY, 0.0f);
}

// One forward call with arguments changed from a valid fp32 CPU call.
typedef struct FwdArgs {
    int device, dtype, B, H, W, Cc, shared_w;
    const void *xc, *gates, *merge;
    void *yc, *hidden;
} FwdArgs;

static void expect_fwd(FwdArgs a, int status, const Outputs *o, const char *what) {
    const int got = cgspn_gspn_scan_fwd(a.device, NULL, a.dtype, a.B, a.H, a.W, a.Cc, a.shared_w,
                                        a.xc, a.gates, a.merge, a.yc, a.hidden);
    printf("    %-28s -> %d (%s)\n", what, got, cgspn_last_error());
    assert_int_equal(got, status);
    assert_true(strlen(cgspn_last_error()) > 0);
    assert_untouched(o);
}

typedef struct BwdArgs {
    int device, dtype, B, H, W, Cc, shared_w, mode;
    const void *dyc, *xc, *gates, *merge, *hidden;
    void *dxc, *dgates, *dmerge;
} BwdArgs;

static void expect_bwd(BwdArgs a, int status, const Outputs *o, const char *what) {
    const int got = cgspn_gspn_scan_bwd(a.device, NULL, a.dtype, a.B, a.H, a.W, a.Cc, a.shared_w,
                                        a.dyc, a.xc, a.gates, a.merge, a.hidden, a.mode, a.dxc,
                                        a.dgates, a.dmerge);
    printf("    %-28s -> %d (%s)\n", what, got, cgspn_last_error());
    assert_int_equal(got, status);
    assert_true(strlen(cgspn_last_error()) > 0);
    assert_untouched(o);
}

static void test_abi_bad_arguments_return_status_and_write_nothing(void **state) {
    Problem p = problem_new(2, 3, 5, 3, 0, 50);
    Outputs o = outputs_new(&p, CANARY);
    const FwdArgs f = {CGSPN_DEVICE_CPU, CGSPN_DTYPE_F32, 2, 3, 5, 3, 0, p.xc->data,
                       p.gates->data, p.merge->data, o.yc->data, o.hidden->data};
    FwdArgs a;
    a = f, a.xc = NULL;           expect_fwd(a, CGSPN_ERR_NULL_POINTER, &o, "fwd xc NULL");
    a = f, a.gates = NULL;        expect_fwd(a, CGSPN_ERR_NULL_POINTER, &o, "fwd gates NULL");
    a = f, a.merge = NULL;        expect_fwd(a, CGSPN_ERR_NULL_POINTER, &o, "fwd merge NULL");
    a = f, a.yc = NULL;           expect_fwd(a, CGSPN_ERR_NULL_POINTER, &o, "fwd yc NULL");
    a = f, a.B = -1;              expect_fwd(a, CGSPN_ERR_BAD_SHAPE, &o, "fwd B = -1");
    a = f, a.H = 0;               expect_fwd(a, CGSPN_ERR_BAD_SHAPE, &o, "fwd H = 0");
    a = f, a.W = -5;              expect_fwd(a, CGSPN_ERR_BAD_SHAPE, &o, "fwd W = -5");
    a = f, a.Cc = -3;             expect_fwd(a, CGSPN_ERR_BAD_SHAPE, &o, "fwd Cc = -3");
    a = f, a.Cc = 200000000;      expect_fwd(a, CGSPN_ERR_BAD_SHAPE, &o, "fwd G overflows int");
    a = f, a.B = a.H = a.W = 1 << 20;
                                  expect_fwd(a, CGSPN_ERR_BAD_SHAPE, &o, "fwd sizes overflow");
    a = f, a.dtype = 7;           expect_fwd(a, CGSPN_ERR_BAD_DTYPE, &o, "fwd dtype 7");
    a = f, a.dtype = -1;          expect_fwd(a, CGSPN_ERR_BAD_DTYPE, &o, "fwd dtype -1");
    a = f, a.device = 2;          expect_fwd(a, CGSPN_ERR_BAD_DEVICE, &o, "fwd device 2");
    a = f, a.shared_w = 2;        expect_fwd(a, CGSPN_ERR_BAD_ARGUMENT, &o, "fwd shared_w 2");
    a = f, a.device = CGSPN_DEVICE_CUDA, a.dtype = CGSPN_DTYPE_F64;
                                  expect_fwd(a, CGSPN_ERR_UNSUPPORTED, &o, "fwd fp64 on CUDA");

    const BwdArgs b0 = {CGSPN_DEVICE_CPU, CGSPN_DTYPE_F32, 2, 3, 5, 3, 0, CGSPN_GRAD_OVERWRITE,
                        p.dyc->data, p.xc->data, p.gates->data, p.merge->data, NULL,
                        o.dxc->data, o.dgates->data, o.dmerge->data};
    BwdArgs b;
    b = b0, b.dyc = NULL;         expect_bwd(b, CGSPN_ERR_NULL_POINTER, &o, "bwd dyc NULL");
    b = b0, b.xc = NULL;          expect_bwd(b, CGSPN_ERR_NULL_POINTER, &o, "bwd xc NULL");
    b = b0, b.gates = NULL;       expect_bwd(b, CGSPN_ERR_NULL_POINTER, &o, "bwd gates NULL");
    b = b0, b.merge = NULL;       expect_bwd(b, CGSPN_ERR_NULL_POINTER, &o, "bwd merge NULL");
    b = b0, b.H = -2;             expect_bwd(b, CGSPN_ERR_BAD_SHAPE, &o, "bwd H = -2");
    b = b0, b.dtype = 3;          expect_bwd(b, CGSPN_ERR_BAD_DTYPE, &o, "bwd dtype 3");
    b = b0, b.device = -1;        expect_bwd(b, CGSPN_ERR_BAD_DEVICE, &o, "bwd device -1");
    b = b0, b.mode = 2;           expect_bwd(b, CGSPN_ERR_BAD_ARGUMENT, &o, "bwd grad_mode 2");
    b = b0, b.shared_w = -1;      expect_bwd(b, CGSPN_ERR_BAD_ARGUMENT, &o, "bwd shared_w -1");

    // Nothing asked for: a valid no-op, even without dyc.
    b = b0, b.dyc = NULL, b.dxc = b.dgates = b.dmerge = NULL;
    assert_int_equal(cgspn_gspn_scan_bwd(b.device, NULL, b.dtype, b.B, b.H, b.W, b.Cc, b.shared_w,
                                         b.dyc, b.xc, b.gates, b.merge, b.hidden, b.mode, NULL,
                                         NULL, NULL), CGSPN_OK);
    assert_string_equal(cgspn_last_error(), "");
    assert_untouched(&o);
    outputs_free(&o);
    problem_free(&p);
}

// Host pointers with device = CUDA: no GPU kernel in this build (UNSUPPORTED), no GPU (CUDA), or
// a GPU that rejects host memory (BAD_DEVICE); in every case a status, not an exit.
static void test_abi_cuda_call_on_host_memory_fails_cleanly(void **state) {
    Problem p = problem_new(1, 2, 3, 2, 1, 60);
    Outputs o = outputs_new(&p, CANARY);
    FwdArgs f = {CGSPN_DEVICE_CUDA, CGSPN_DTYPE_F32, 1, 2, 3, 2, 1, p.xc->data, p.gates->data,
                 p.merge->data, o.yc->data, o.hidden->data};
    const int st = cgspn_gspn_scan_fwd(f.device, NULL, f.dtype, f.B, f.H, f.W, f.Cc, f.shared_w,
                                       f.xc, f.gates, f.merge, f.yc, f.hidden);
    assert_cuda_on_host_refused(st);
    assert_untouched(&o);
    outputs_free(&o);
    problem_free(&p);
}

// Calls from several threads at once give what one thread gives.
typedef struct Job { Problem p; Outputs got; int status; } Job;

static void *job_run(void *arg) {
    Job *j = arg;
    const Problem *p = &j->p;
    for (int rep = 0; rep < 5 && j->status == CGSPN_OK; rep++) {
        j->status = abi_fwd(p, CGSPN_DTYPE_F32, p->xc->data, p->gates->data, p->merge->data,
                            j->got.yc->data, j->got.hidden->data);
        if (j->status == CGSPN_OK)
            j->status = abi_bwd(p, CGSPN_DTYPE_F32, p->dyc->data, p->xc->data, p->gates->data,
                                p->merge->data, j->got.hidden->data, CGSPN_GRAD_OVERWRITE,
                                j->got.dxc->data, j->got.dgates->data, j->got.dmerge->data);
    }
    return NULL;
}

static void test_abi_concurrent_calls_match_sequential(void **state) {
    enum { JOBS = 4 };
    Job jobs[JOBS];
    pthread_t th[JOBS];
    for (int i = 0; i < JOBS; i++) {
        jobs[i].p = problem_new(2, 5 + i, 4, 3, i % 2, 70 + i);
        jobs[i].got = outputs_new(&jobs[i].p, CANARY);
        jobs[i].status = CGSPN_OK;
        assert_int_equal(pthread_create(&th[i], NULL, job_run, &jobs[i]), 0);
    }
    for (int i = 0; i < JOBS; i++) assert_int_equal(pthread_join(th[i], NULL), 0);
    for (int i = 0; i < JOBS; i++) {
        assert_int_equal(jobs[i].status, CGSPN_OK);
        Outputs want = op_reference(&jobs[i].p);
        assert_same(jobs[i].got.yc, want.yc);
        assert_same(jobs[i].got.dxc, want.dxc);
        assert_same(jobs[i].got.dgates, want.dgates);
        assert_same(jobs[i].got.dmerge, want.dmerge);
        outputs_free(&want);
        outputs_free(&jobs[i].got);
        problem_free(&jobs[i].p);
    }
}

// The ABI's CUDA path relies on this: under a trap, cg_fail comes back with its message instead of
// ending the process.
static void test_cg_fail_under_a_trap_returns_instead_of_exiting(void **state) {
    static CgTrap trap;   // static: read after the longjmp
    CgTrap *outer = cg_trap_set(&trap);
    if (setjmp(trap.env) == 0) {
        CG_FAIL("the hint", "kernel failed with %d", 42);
        fail_msg("cg_fail returned");
    }
    assert_ptr_equal(cg_trap_set(outer), &trap);
    assert_string_equal(trap.message, "kernel failed with 42 (hint: the hint)");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_abi_version_and_status_strings),
        cmocka_unit_test(test_abi_fp32_forward_equals_cpu_op),
        cmocka_unit_test(test_abi_fp32_backward_overwrites_or_accumulates_like_cpu_op),
        cmocka_unit_test(test_abi_fp64_agrees_with_fp32),
        cmocka_unit_test(test_abi_bf16_cpu_path_matches_fp32_to_bf16_rounding),
        cmocka_unit_test(test_abi_bad_arguments_return_status_and_write_nothing),
        cmocka_unit_test(test_abi_cuda_call_on_host_memory_fails_cleanly),
        cmocka_unit_test(test_abi_concurrent_calls_match_sequential),
        cmocka_unit_test(test_cg_fail_under_a_trap_returns_instead_of_exiting),
    };
    return cmocka_run_group_tests_name("cgspn_abi", tests, NULL, NULL);
}
