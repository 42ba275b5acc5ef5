// GPU tests of the training regularizer ops (kernels/cuda/drop_path.cu) against the CPU
// reference (kernels/cpu/drop_path.c): drop path forward and backward (the same per-sample mask
// on both backends; += checked from nonzero gradients), and the EMA update over a buffer with a
// fp32 or bf16 source and an optional rounded output. Shapes with per-sample sizes that are
// multiples of 8 take the vector path, odd ones the scalar path. And the parameters a bf16 table
// keeps in fp32 (nn/params.h) under AdamW.
#include "gpulib.h"
#include "../testlib_dist.h"
#include "../../kernels/drop_path_mask.h"

// fp32: both backends do one rounded product (and one rounded sum for the backward / EMA) per
// element with the same operands and the same mask, so the results are identical bits.
#define EXACT 0.0
// bf16 outputs: the same fp32 value rounded to bf16 once on the GPU; the CPU value is unrounded,
// so they differ by at most half a bf16 ulp, 2^-8 = 3.9e-3 relative.
#define BF16_ROUNDED_TOL 4e-3

static Ctx G, H;

static void check(const char *what, double err, double tol) {
    if (err > tol) fail_msg("%s: rel err %.3e above %.1e", what, err, tol);
}

static void drop_path_case(int B, int T, int C, DType dt) {
    Tensor *x = test_tensor(3, B, T, C), *dy = test_tensor(3, B, T, C), *y = test_tensor(3, B, T, C);
    Tensor *dx = test_tensor(3, B, T, C);
    test_fill(x, 1, -2, 2);
    test_fill(dy, 2, -1, 1);
    test_fill(dx, 3, -1, 1);   // nonzero: the backward accumulates
    if (dt == DTYPE_BF16) {
        gpu_test_round_to_bf16(x);
        gpu_test_round_to_bf16(dy);
        gpu_test_round_to_bf16(dx);
    }
    DropPathArgs a = {0.35f, 1234, 77, 5, 16};
    Tensor *gx = gpu_test_upload(&G, x, dt), *gdy = gpu_test_upload(&G, dy, dt);
    Tensor *gdx = gpu_test_upload(&G, dx, dt), *gy = gpu_test_zeros(&G, y, dt);
    cpu_drop_path_fwd(&H, x, &a, y);
    cuda_drop_path_fwd(&G, gx, &a, gy);
    cpu_drop_path_bwd(&H, dy, &a, dx);
    cuda_drop_path_bwd(&G, gdy, &a, gdx);
    double tol = dt == DTYPE_F32 ? EXACT : BF16_ROUNDED_TOL;
    char what[96];
    snprintf(what, sizeof what, "drop_path_fwd.y (%d,%d,%d)", B, T, C);
    check(what, gpu_test_compare(&G, what, gy, y), tol);
    snprintf(what, sizeof what, "drop_path_bwd.dx (%d,%d,%d)", B, T, C);
    check(what, gpu_test_compare(&G, what, gdx, dx), tol);
    // dropped samples are exact zeros in y on the GPU too
    float *h = tensor_to_host_f32(&G, gy);
    for (int b = 0; b < B; b++)
        if (drop_path_scale(a.prob, a.seed, a.step, a.site, a.first_sample + b) == 0.0f)
            for (int i = 0; i < T * C; i++) assert_true(h[(size_t)b * T * C + i] == 0.0f);
    free(h);
    gpu_test_free(gx); gpu_test_free(gdy); gpu_test_free(gdx); gpu_test_free(gy);
    test_tensor_free(x); test_tensor_free(dy); test_tensor_free(y); test_tensor_free(dx);
}

static void test_drop_path_matches_cpu(void **state) {
    drop_path_case(9, 7, 6, DTYPE_F32);     // 42 per sample: scalar path
    drop_path_case(33, 16, 64, DTYPE_F32);  // vector path
    drop_path_case(9, 7, 6, DTYPE_BF16);
    drop_path_case(33, 16, 64, DTYPE_BF16);
}

static void ema_case(int n, DType src_dt, DType out_dt) {
    Tensor *ema = test_tensor(1, n), *src = test_tensor(1, n), *out = test_tensor(1, n);
    test_fill(ema, 4, -1, 1);
    test_fill(src, 5, -1, 1);
    if (src_dt == DTYPE_BF16) gpu_test_round_to_bf16(src);
    Tensor *gema = gpu_test_upload(&G, ema, DTYPE_F32), *gsrc = gpu_test_upload(&G, src, src_dt);
    Tensor *gout = gpu_test_zeros(&G, out, out_dt);
    for (int step = 0; step < 3; step++) {
        float decay = step == 0 ? 0.9999f : 0.9f;
        cpu_ema_update(&H, ema, src, decay, out);
        cuda_ema_update(&G, gema, gsrc, decay, gout);
    }
    char what[96];
    snprintf(what, sizeof what, "ema_update.ema n=%d src %s", n, dtype_name(src_dt));
    check(what, gpu_test_compare(&G, what, gema, ema), EXACT);
    snprintf(what, sizeof what, "ema_update.out n=%d", n);
    if (out_dt == DTYPE_BF16) gpu_test_round_to_bf16(out);   // the CPU value, rounded as the GPU does
    check(what, gpu_test_compare(&G, what, gout, out), EXACT);
    cuda_ema_update(&G, gema, gsrc, 0.5f, NULL);   // no output tensor
    gpu_test_free(gema); gpu_test_free(gsrc); gpu_test_free(gout);
    test_tensor_free(ema); test_tensor_free(src); test_tensor_free(out);
}

static void test_ema_update_matches_cpu_bit_for_bit(void **state) {
    ema_case(1003, DTYPE_F32, DTYPE_F32);    // odd: scalar tail
    ema_case(4096, DTYPE_F32, DTYPE_BF16);   // vector path, bf16 evaluation copy
    ema_case(4096, DTYPE_BF16, DTYPE_BF16);  // bf16 source (values of a bf16 table)
}

static bool same_bits(Ctx *ctx, const Tensor *a, const Tensor *b) {
    float *x = tensor_to_host_f32(ctx, a), *y = tensor_to_host_f32(ctx, b);
    bool same = memcmp(x, y, a->numel * sizeof(float)) == 0;
    free(x);
    free(y);
    return same;
}

// The same table in bf16 and in fp32, stepped on the same gradients: a kept parameter's value is
// its master, in fp32, and moves bit for bit as in the fp32 table (the same fp32 AdamW); every
// other parameter's master does too, its value being that master rounded. all_train: every
// parameter trains (one AdamW launch over the whole buffers), else one stays frozen (a launch
// per parameter).
static void kept_f32_case(bool all_train) {
    Ctx c32 = G;
    c32.act_dtype = DTYPE_F32;
    DistTestModel m, ref;
    dist_test_model_on(&m, G);
    dist_test_model_on(&ref, c32);
    if (all_train) {
        params_set_trainable(&m.t, NULL, true);
        params_set_trainable(&ref.t, NULL, true);
    }
    float *host = malloc(m.t.total * sizeof(float));
    OptimizerConfig o = dist_test_optimizer();
    for (int s = 0; s < DIST_TEST_STEPS; s++) {
        dist_test_grads_into(&m.t, host, 0, s);
        dist_test_upload_grads(&m, host);
        dist_test_upload_grads(&ref, host);
        StepStats a = optimizer_step(&m.t, &m.ctx, &m.arena, &o, s);
        StepStats b = optimizer_step(&ref.t, &ref.ctx, &ref.arena, &o, s);
        arena_reset(&m.arena);
        arena_reset(&ref.arena);
        assert_true(a.grad_norm == b.grad_norm);
    }
    int kept = 0;
    for (int i = 0; i < m.t.n; i++) {
        Param *p = m.t.params[i], *q = ref.t.params[i];
        if (p->keep_f32) {
            kept++;
            assert_int_equal(p->value.dtype, DTYPE_F32);
            assert_ptr_equal(p->value.data, p->master.data);
            if (!same_bits(&G, &p->value, &q->value)) fail_msg("%s: kept fp32 value differs", p->name);
        } else {
            assert_int_equal(p->value.dtype, DTYPE_BF16);
            if (!same_bits(&G, &p->master, &q->value)) fail_msg("%s: master differs", p->name);
        }
    }
    assert_int_equal(kept, 2);
    free(host);
    dist_test_model_free(&m);
    dist_test_model_free(&ref);
}

static void test_bf16_table_keeps_marked_parameters_fp32_under_adamw(void **state) {
    kept_f32_case(false);
    kept_f32_case(true);
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
    cuda_ctx_destroy(&G);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_drop_path_matches_cpu),
        cmocka_unit_test(test_ema_update_matches_cpu_bit_for_bit),
        cmocka_unit_test(test_bf16_table_keeps_marked_parameters_fp32_under_adamw),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
