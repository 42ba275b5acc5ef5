// The training regularizer ops (kernels/ops.h): the EMA of weights against values worked out by
// hand, drop path's mask (deterministic in (seed, step, site, sample), the right kept fraction),
// its forward and backward (finite differences with the mask held fixed, accumulation), and
// stochastic depth in the encoder (only while gradients are recorded, linear over depth).
#include "testlib.h"
#include "../kernels/ops.h"
#include "../kernels/drop_path_mask.h"
#include "../nn/encoder.h"
#include "../nn/tape.h"

// Hand-computed EMA values below are exact in fp32 (dyadic decays and inputs).
#define EXACT 0.0f
// Kept fraction of 20000 Bernoulli draws with p = 0.3: std sqrt(p (1 - p) / n) = 0.0032; five
// standard deviations.
#define FRACTION_TOL 0.016

static void test_ema_update_matches_hand_computed_values(void **state) {
    Ctx ctx = ctx_cpu();
    Tensor *ema = test_tensor(1, 4), *src = test_tensor(1, 4), *out = test_tensor(1, 4);
    float e0[4] = {1.0f, -2.0f, 0.5f, 8.0f}, s0[4] = {3.0f, 2.0f, 0.5f, 0.0f};
    memcpy(ema->data, e0, sizeof e0);
    memcpy(src->data, s0, sizeof s0);
    // decay 0.75: 0.75 e + 0.25 s
    cpu_ema_update(&ctx, ema, src, 0.75f, out);
    float want1[4] = {1.5f, -1.0f, 0.5f, 6.0f};
    for (int i = 0; i < 4; i++) {
        assert_float_equal(tensor_f32(ema)[i], want1[i], EXACT);
        assert_float_equal(tensor_f32(out)[i], want1[i], EXACT);
    }
    // a second step with decay 0.5 and no output tensor: 0.5 e + 0.5 s
    cpu_ema_update(&ctx, ema, src, 0.5f, NULL);
    float want2[4] = {2.25f, 0.5f, 0.5f, 3.0f};
    for (int i = 0; i < 4; i++) assert_float_equal(tensor_f32(ema)[i], want2[i], EXACT);
    // decay 0 copies the weights; decay 1 keeps the average
    cpu_ema_update(&ctx, ema, src, 1.0f, NULL);
    for (int i = 0; i < 4; i++) assert_float_equal(tensor_f32(ema)[i], want2[i], EXACT);
    cpu_ema_update(&ctx, ema, src, 0.0f, NULL);
    for (int i = 0; i < 4; i++) assert_float_equal(tensor_f32(ema)[i], s0[i], EXACT);
    // a non-dyadic decay: the two rounded products and their rounded sum, as documented
    float d = 0.9999f;
    tensor_f32(ema)[0] = 0.1f;
    tensor_f32(src)[0] = 0.7f;
    cpu_ema_update(&ctx, ema, src, d, NULL);
    volatile float a = d * 0.1f, b = (1.0f - d) * 0.7f;
    float want = a + b;
    assert_memory_equal(&tensor_f32(ema)[0], &want, sizeof want);
    test_tensor_free(ema); test_tensor_free(src); test_tensor_free(out);
}

static void test_drop_path_mask_is_deterministic_with_the_kept_fraction(void **state) {
    const float p = 0.3f;
    int kept = 0, n = 20000, differ_step = 0, differ_site = 0, differ_seed = 0;
    for (int s = 0; s < n; s++) {
        float k = drop_path_scale(p, 7, 11, 3, s);
        assert_true(k == 0.0f || k == 1.0f / (1.0f - p));
        assert_true(k == drop_path_scale(p, 7, 11, 3, s));   // a pure function
        kept += k != 0.0f;
        differ_step += k != drop_path_scale(p, 7, 12, 3, s);
        differ_site += k != drop_path_scale(p, 7, 11, 4, s);
        differ_seed += k != drop_path_scale(p, 8, 11, 3, s);
    }
    double frac = (double)kept / n;
    printf("    kept %.4f of samples at drop probability %.2f\n", frac, p);
    assert_true(fabs(frac - (1.0 - p)) < FRACTION_TOL);
    // independent masks for another step, site or seed disagree on ~2 p (1 - p) = 42% of samples
    assert_true(differ_step > n / 3 && differ_site > n / 3 && differ_seed > n / 3);
    assert_true(drop_path_scale(0.0f, 1, 2, 3, 4) == 1.0f);   // rate 0 keeps everything, unscaled
}

typedef struct { Tensor *x, *y, *r; DropPathArgs a; } DropCase;
static double drop_loss(void *u) {
    DropCase *c = u;
    Ctx ctx = ctx_cpu();
    cpu_drop_path_fwd(&ctx, c->x, &c->a, c->y);
    return test_dot(c->y, c->r);
}

static void test_drop_path_forward_and_backward_match_the_mask_and_finite_differences(void **state) {
    Ctx ctx = ctx_cpu();
    enum { B = 16, T = 5, C = 3 };
    DropCase c = {test_tensor(3, B, T, C), NULL, NULL, {0.4f, 99, 5, 2, 32}};
    c.y = test_like(c.x);
    c.r = test_like(c.x);
    test_fill(c.x, 1, -1, 1);
    test_fill(c.r, 2, -1, 1);
    drop_loss(&c);
    int dropped = 0;
    for (int b = 0; b < B; b++) {
        float s = drop_path_scale(0.4f, 99, 5, 2, 32 + b);
        dropped += s == 0.0f;
        for (int i = 0; i < T * C; i++) {
            size_t k = (size_t)b * T * C + i;
            assert_float_equal(tensor_f32(c.y)[k], tensor_f32(c.x)[k] * s, 0.0f);
        }
    }
    assert_true(dropped > 0 && dropped < B);   // this (seed, step, site) drops some, keeps some
    // The step read from step_at (a replayed graph's device word) instead of the argument.
    const int64_t five = 5;
    DropCase at = c;
    at.a.step = 0;
    at.a.step_at = &five;
    at.y = test_like(c.x);
    drop_loss(&at);
    assert_memory_equal(at.y->data, c.y->data, tensor_bytes(c.y));
    test_tensor_free(at.y);
    Tensor *dx = test_like(c.x);
    cpu_drop_path_bwd(&ctx, c.r, &c.a, dx);
    assert_true(test_gradcheck("drop_path dx", drop_loss, &c, c.x, dx) < GRAD_TOL);
    // accumulates: a second call doubles it
    Tensor *once = test_like(dx);
    memcpy(once->data, dx->data, dx->numel * sizeof(float));
    cpu_drop_path_bwd(&ctx, c.r, &c.a, dx);
    for (size_t i = 0; i < dx->numel; i++)
        assert_float_equal(tensor_f32(dx)[i], 2.0f * tensor_f32(once)[i], 0.0f);
    cpu_drop_path_bwd(&ctx, c.r, &c.a, NULL);   // NULL gradient: skipped
    test_tensor_free(dx); test_tensor_free(once);
    test_tensor_free(c.x); test_tensor_free(c.y); test_tensor_free(c.r);
}

// ---- in the encoder ----------------------------------------------------------------------------

static EncoderConfig tiny_vit(void) {
    return (EncoderConfig){.kind = ENCODER_VIT, .img_h = 8, .img_w = 8, .in_chans = 1, .patch = 4,
                           .width = 8, .depth = 3, .heads = 2, .mlp_hidden = 16, .gelu = GELU_ERF,
                           .ln_eps = 1e-6f, .class_token = 1, .pos_embed = 1, .qkv_bias = 1,
                           .num_classes = 3};
}

// Logits of the encoder on a fixed batch, with gradients recorded or not.
static float *logits_of(const Encoder *e, Ctx *ctx, bool grad) {
    Arena arena;
    arena_init(&arena, ctx, 1u << 20);
    Tape t;
    tape_init(&t, ctx, &arena);
    tape_set_grad_enabled(&t, grad);
    Tensor *x = tape_tensor(&t, 4, (int[]){6, 1, 8, 8}, true);
    test_fill(x, 5, -1, 1);
    x->requires_grad = grad;
    Tensor *y = encoder_head(&t, e, encoder_forward(&t, e, x, NULL));
    float *out = malloc(y->numel * sizeof(float));
    memcpy(out, y->data, y->numel * sizeof(float));
    tape_free(&t);
    arena_free(&arena);
    return out;
}

static void test_encoder_drop_path_applies_only_while_training(void **state) {
    Ctx ctx = ctx_cpu();
    EncoderConfig cfg = tiny_vit();
    Encoder e;
    ParamTable p;
    params_init_table(&p);
    encoder_register(&e, &cfg, &p);
    params_alloc(&p, &ctx);
    params_initialize(&p, &ctx, 3);
    size_t n = 6 * 3;
    float *plain = logits_of(&e, &ctx, true);
    e.drop_path = (EncoderDropPath){0.5f, 1, 0, 0};
    float *eval = logits_of(&e, &ctx, false);      // no gradients: no drop path
    float *a = logits_of(&e, &ctx, true), *b = logits_of(&e, &ctx, true);
    e.drop_path.step = 1;
    float *c = logits_of(&e, &ctx, true);
    assert_memory_equal(plain, eval, n * sizeof(float));
    assert_memory_equal(a, b, n * sizeof(float));   // the same step: the same masks
    assert_memory_not_equal(a, plain, n * sizeof(float));
    assert_memory_not_equal(a, c, n * sizeof(float));
    // depth 1: the linear rule gives block 0 rate 0, so nothing is dropped
    EncoderConfig one = cfg;
    one.depth = 1;
    Encoder e1;
    ParamTable p1;
    params_init_table(&p1);
    encoder_register(&e1, &one, &p1);
    params_alloc(&p1, &ctx);
    params_initialize(&p1, &ctx, 3);
    float *q0 = logits_of(&e1, &ctx, true);
    e1.drop_path = (EncoderDropPath){0.9f, 1, 0, 0};
    float *q1 = logits_of(&e1, &ctx, true);
    assert_memory_equal(q0, q1, n * sizeof(float));
    free(plain); free(eval); free(a); free(b); free(c); free(q0); free(q1);
    params_free(&p, &ctx);
    params_free(&p1, &ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ema_update_matches_hand_computed_values),
        cmocka_unit_test(test_drop_path_mask_is_deterministic_with_the_kept_fraction),
        cmocka_unit_test(test_drop_path_forward_and_backward_match_the_mask_and_finite_differences),
        cmocka_unit_test(test_encoder_drop_path_applies_only_while_training),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
