// Optimizer pieces: the sum of squares op, AdamW against updates worked out by hand, the
// warmup + cosine schedule at known steps, and label-smoothed targets. Calls cpu_* directly.
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include "testlib.h"
#include "../kernels/ops.h"
#include "../nn/schedule.h"
#include "../nn/targets.h"

// An fp32 AdamW step on values of magnitude 0.5..2 rounds each of its ~6 operations to
// 2^-24 relative (~1.2e-7 absolute at 2): a few ulps, far below any error in the formula
// (a missing bias correction or decay term moves the result by 1e-3 or more).
#define ADAM_TOL 1e-6f
// The moments m, v against decimal values: beta2 = 0.999 is not exact in fp32 (0.99900001287),
// so 1 - beta2 is 0.00099998713, 1.3e-5 relative below 0.001 (1 - beta1 is off by 1.2e-7).
// Bias correction uses the same fp32 betas, so the update itself is unaffected.
#define MOMENT_REL_TOL 2e-5

static void assert_rel_close(float got, float want, double rel) {
    assert_true(fabs((double)got - want) <= rel * fabs((double)want));
}
// Learning rates are fp32 values of at most 1e-3 computed in double: one fp32 rounding.
#define LR_TOL 1e-9f
// Sums of fp32 squares accumulated in double and rounded once to fp32.
#define SUMSQ_REL_TOL 1e-6


static Tensor *vec(int n, const float *values) {
    Tensor *t = test_tensor(1, n);
    if (values) memcpy(t->data, values, (size_t)n * sizeof(float));
    return t;
}

// ---- sumsq ----------------------------------------------------------------------------------

static void test_sumsq_adds_sum_of_squares(void **state) {
    Ctx ctx = ctx_cpu();
    const float x4[] = {1, 2, 3, -4};   // 1 + 4 + 9 + 16 = 30
    const float start = 0.5f;
    Tensor *x = vec(4, x4), *s = vec(1, &start);
    cpu_sumsq(&ctx, x, s);
    assert_float_equal(tensor_f32(s)[0], 30.5f, 0.0f);   // adds onto 0.5; exact in fp32
    cpu_sumsq(&ctx, x, s);
    assert_float_equal(tensor_f32(s)[0], 60.5f, 0.0f);

    // Over several partial-sum blocks, against a double sum.
    Tensor *big = test_tensor(2, 123, 457), *t = vec(1, NULL);
    test_fill(big, 1, -1, 1);
    double ref = 0;
    for (size_t i = 0; i < big->numel; i++) ref += (double)tensor_f32(big)[i] * tensor_f32(big)[i];
    cpu_sumsq(&ctx, big, t);
    assert_true(fabs(tensor_f32(t)[0] - ref) <= SUMSQ_REL_TOL * ref);
    test_tensor_free(x); test_tensor_free(s); test_tensor_free(big); test_tensor_free(t);
}

// ---- AdamW ----------------------------------------------------------------------------------

// lr 0.1, betas (0.9, 0.999), eps 1e-8, weight decay 0.01, grad_scale 0.5 (e.g. 1 / loss scale
// or the clipping factor): g = 0.5 * grad.
static const AdamWArgs ADAM = {.lr = 0.1f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                               .weight_decay = 0.01f, .grad_scale = 0.5f, .step = 1};

static void test_adamw_first_step_matches_hand_computed_update(void **state) {
    Ctx ctx = ctx_cpu();
    // p = (1, -2, 0.5, 0.25), grad = (0.2, -0.4, 0, 2e-8) -> g = (0.1, -0.2, 0, 1e-8).
    // Step 1 from m = v = 0:
    //   m = 0.1 g = (0.01, -0.02, 0, 1e-9),  v = 0.001 g^2 = (1e-5, 4e-5, 0, 1e-19)
    //   bc1 = 1 - 0.9 = 0.1, bc2 = 1 - 0.999 = 0.001 -> m/bc1 = g, v/bc2 = g^2, sqrt = |g|
    //   update u = g / (|g| + 1e-8) = (0.1/0.10000001, -0.2/0.20000001, 0/1e-8, 1e-8/2e-8)
    //            = (0.9999999, -0.99999995, 0, 0.5)
    //   (the last element proves eps sits outside the sqrt: inside, u3 = 1e-8/sqrt(1e-16 + 1e-8)
    //   = 1e-4)
    //   p -= 0.1 * (u + 0.01 p):
    //     p0 = 1    - 0.1 * (0.9999999   + 0.01)   = 0.89900001
    //     p1 = -2   - 0.1 * (-0.99999995 - 0.02)   = -1.898000005
    //     p2 = 0.5  - 0.1 * (0           + 0.005)  = 0.4995   (decay alone moves a zero-grad weight)
    //     p3 = 0.25 - 0.1 * (0.5         + 0.0025) = 0.19975
    const float p0[] = {1.0f, -2.0f, 0.5f, 0.25f}, grad[] = {0.2f, -0.4f, 0.0f, 2e-8f};
    Tensor *p = vec(4, p0), *g = vec(4, grad), *m = vec(4, NULL), *v = vec(4, NULL);
    cpu_adamw(&ctx, p, NULL, g, m, v, &ADAM);
    const float want_p[] = {0.89900001f, -1.898000005f, 0.4995f, 0.19975f};
    const float want_m[] = {0.01f, -0.02f, 0.0f, 1e-9f}, want_v[] = {1e-5f, 4e-5f, 0.0f, 1e-19f};
    for (int i = 0; i < 4; i++) {
        assert_float_equal(tensor_f32(p)[i], want_p[i], ADAM_TOL);
        assert_rel_close(tensor_f32(m)[i], want_m[i], MOMENT_REL_TOL);
        assert_rel_close(tensor_f32(v)[i], want_v[i], MOMENT_REL_TOL);
    }
    test_tensor_free(p); test_tensor_free(g); test_tensor_free(m); test_tensor_free(v);
}

static void test_adamw_second_step_applies_bias_correction(void **state) {
    Ctx ctx = ctx_cpu();
    const float p0[] = {1.0f, -2.0f, 0.5f};
    const float grad1[] = {0.2f, -0.4f, 0.0f}, grad2[] = {0.6f, 0.2f, -0.4f};
    Tensor *p = vec(3, p0), *g = vec(3, grad1), *m = vec(3, NULL), *v = vec(3, NULL);
    AdamWArgs args = ADAM;
    cpu_adamw(&ctx, p, NULL, g, m, v, &args);   // step 1 as above
    memcpy(g->data, grad2, sizeof grad2);
    args.step = 2;
    cpu_adamw(&ctx, p, NULL, g, m, v, &args);
    // Step 2, g = 0.5 * grad2 = (0.3, 0.1, -0.2); bc1 = 1 - 0.81 = 0.19, bc2 = 1 - 0.998001 = 0.001999
    //  i=0: m = 0.9*0.01 + 0.1*0.3 = 0.039;   v = 0.999*1e-5 + 0.001*0.09 = 9.999e-5
    //       m/bc1 = 0.2052632, v/bc2 = 0.0500200, sqrt = 0.2236515, u = 0.9177811
    //       p = 0.89900001 - 0.1*(0.9177811 + 0.01*0.89900001) = 0.8063229
    //  i=1: m = 0.9*-0.02 + 0.1*0.1 = -0.008;  v = 0.999*4e-5 + 0.001*0.01 = 4.996e-5
    //       m/bc1 = -0.0421053, v/bc2 = 0.0249925, sqrt = 0.1580902, u = -0.2663370
    //       p = -1.898000005 - 0.1*(-0.2663370 + 0.01*-1.898000005) = -1.8694683
    //  i=2: m = 0.1*-0.2 = -0.02;  v = 0.001*0.04 = 4e-5
    //       m/bc1 = -0.1052632, v/bc2 = 0.0200100, sqrt = 0.1414568, u = -0.7441368
    //       p = 0.4995 - 0.1*(-0.7441368 + 0.01*0.4995) = 0.5734142
    // Without bias correction u0 would be 0.039 / sqrt(9.999e-5) = 3.9 instead of 0.918.
    const float want_p[] = {0.8063229f, -1.8694683f, 0.5734142f};
    const float want_m[] = {0.039f, -0.008f, -0.02f}, want_v[] = {9.999e-5f, 4.996e-5f, 4e-5f};
    for (int i = 0; i < 3; i++) {
        assert_float_equal(tensor_f32(p)[i], want_p[i], ADAM_TOL);
        assert_rel_close(tensor_f32(m)[i], want_m[i], MOMENT_REL_TOL);
        assert_rel_close(tensor_f32(v)[i], want_v[i], MOMENT_REL_TOL);
    }
    test_tensor_free(p); test_tensor_free(g); test_tensor_free(m); test_tensor_free(v);
}

// ---- learning-rate schedule ------------------------------------------------------------------

// Two parameters end to end in one call, decay runs saying the first decays and the second does
// not, give bitwise what one call per parameter gives (weight_decay 0 for the second).
static void test_adamw_decay_runs_match_one_call_per_parameter(void **state) {
    Ctx ctx = ctx_cpu();
    enum { A = 16, B = 8 };
    float p0[A + B], grad[A + B];
    for (int i = 0; i < A + B; i++) {
        p0[i] = 0.5f - 0.03f * (float)i;
        grad[i] = 0.1f * (float)((i * 7) % 11) - 0.5f;
    }
    Tensor *p = vec(A + B, p0), *g = vec(A + B, grad), *m = vec(A + B, NULL), *v = vec(A + B, NULL);
    const uint64_t ends[2] = {A, A + B};
    const uint8_t on[2] = {1, 0};
    AdamWArgs runs = ADAM;
    runs.n_decay_runs = 2, runs.decay_ends = ends, runs.decay_on = on;
    cpu_adamw(&ctx, p, NULL, g, m, v, &runs);
    Tensor *pa = vec(A, p0), *ga = vec(A, grad), *ma = vec(A, NULL), *va = vec(A, NULL);
    Tensor *pb = vec(B, p0 + A), *gb = vec(B, grad + A), *mb = vec(B, NULL), *vb = vec(B, NULL);
    AdamWArgs no_decay = ADAM;
    no_decay.weight_decay = 0.0f;
    cpu_adamw(&ctx, pa, NULL, ga, ma, va, &ADAM);
    cpu_adamw(&ctx, pb, NULL, gb, mb, vb, &no_decay);
    assert_memory_equal(tensor_f32(p), tensor_f32(pa), A * sizeof(float));
    assert_memory_equal(tensor_f32(p) + A, tensor_f32(pb), B * sizeof(float));
    assert_memory_equal(tensor_f32(m) + A, tensor_f32(mb), B * sizeof(float));
    assert_memory_equal(tensor_f32(v), tensor_f32(va), A * sizeof(float));
    // The runs decide: without decay the first parameter would have moved differently.
    Tensor *pn = vec(A, p0), *gn = vec(A, grad), *mn = vec(A, NULL), *vn = vec(A, NULL);
    cpu_adamw(&ctx, pn, NULL, gn, mn, vn, &no_decay);
    assert_true(memcmp(tensor_f32(p), tensor_f32(pn), A * sizeof(float)) != 0);
    Tensor *all[] = {p, g, m, v, pa, ga, ma, va, pb, gb, mb, vb, pn, gn, mn, vn};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) test_tensor_free(all[i]);
}

static void test_lr_schedule_warmup_then_cosine_at_known_steps(void **state) {
    const double base = 1e-3, min = 1e-5;
    LrSchedule s = {.base_lr = (float)base, .min_lr = (float)min, .warmup_steps = 10,
                    .total_steps = 110};
    // Warmup: base * (step + 1) / 10.
    assert_float_equal(lr_schedule(&s, 0), (float)(base * 0.1), LR_TOL);
    assert_float_equal(lr_schedule(&s, 4), (float)(base * 0.5), LR_TOL);
    assert_float_equal(lr_schedule(&s, 9), (float)base, LR_TOL);    // end of warmup
    // Cosine over the 100 steps 10..109: t = (step - 10) / 100.
    assert_float_equal(lr_schedule(&s, 10), (float)base, LR_TOL);   // t = 0
    // t = 1/2: min + (base - min) (1 + cos(pi/2)) / 2 = (base + min) / 2
    assert_float_equal(lr_schedule(&s, 60), (float)(min + (base - min) * (1 + cos(M_PI / 2)) / 2),
                       LR_TOL);
    assert_float_equal(lr_schedule(&s, 60), (float)((base + min) / 2), LR_TOL);
    // t = 1/4: min + (base - min) (1 + sqrt(2)/2) / 2
    assert_float_equal(lr_schedule(&s, 35), (float)(min + (base - min) * (1 + M_SQRT1_2) / 2),
                       LR_TOL);
    // Last step run, t = 99/100: one cosine step above min (1.0244e-5).
    assert_float_equal(lr_schedule(&s, 109),
                       (float)(min + (base - min) * (1 + cos(M_PI * 0.99)) / 2), LR_TOL);
    assert_true(lr_schedule(&s, 109) > (float)min);
    // At and after total_steps: min.
    assert_float_equal(lr_schedule(&s, 110), (float)min, 0.0f);
    assert_float_equal(lr_schedule(&s, 5000), (float)min, 0.0f);
    // Never increases after warmup.
    for (long step = 10; step < 120; step++)
        assert_true(lr_schedule(&s, step + 1) <= lr_schedule(&s, step));

    // No warmup: the cosine starts at step 0.
    LrSchedule nowarm = {.base_lr = 2e-3f, .min_lr = 0.0f, .warmup_steps = 0, .total_steps = 4};
    assert_float_equal(lr_schedule(&nowarm, 0), 2e-3f, LR_TOL);
    assert_float_equal(lr_schedule(&nowarm, 2), 1e-3f, LR_TOL);
    assert_float_equal(lr_schedule(&nowarm, 4), 0.0f, 0.0f);
}

// ---- label smoothing -------------------------------------------------------------------------

static void test_label_smoothing_targets_sum_to_one(void **state) {
    enum { B = 3, K = 10 };
    const int labels[B] = {0, 7, 9};
    float t[B * K];
    labels_to_targets(labels, B, K, 0.1f, t);
    // timm: off = 0.1 / 10 = 0.01, on = 1 - 0.1 + 0.01 = 0.91
    for (int b = 0; b < B; b++) {
        double sum = 0;
        for (int k = 0; k < K; k++) {
            assert_float_equal(t[b * K + k], k == labels[b] ? 0.91f : 0.01f, 1e-7f);
            sum += t[b * K + k];
        }
        assert_float_equal((float)sum, 1.0f, 1e-6f);
    }
    labels_to_targets(labels, B, K, 0.0f, t);   // no smoothing: one-hot
    for (int b = 0; b < B; b++)
        for (int k = 0; k < K; k++) assert_true(t[b * K + k] == (k == labels[b] ? 1.0f : 0.0f));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sumsq_adds_sum_of_squares),
        cmocka_unit_test(test_adamw_first_step_matches_hand_computed_update),
        cmocka_unit_test(test_adamw_second_step_applies_bias_correction),
        cmocka_unit_test(test_adamw_decay_runs_match_one_call_per_parameter),
        cmocka_unit_test(test_lr_schedule_warmup_then_cosine_at_known_steps),
        cmocka_unit_test(test_label_smoothing_targets_sum_to_one),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
