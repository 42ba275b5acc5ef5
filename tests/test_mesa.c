// MESA's term (train/mesa.h) against its definition in double precision, its gradient against
// central differences, and no gradient for the EMA teacher's logits.
#include "testlib.h"
#include "../train/mesa.h"

typedef struct MesaCase {
    Ctx ctx;
    Arena arena;
    Tape tape;
    Mesa m;
    Tensor *s, *t;   // student and teacher logits (B,K), test-owned
} MesaCase;

static double mesa_value(void *user) {
    MesaCase *c = user;
    tape_reset(&c->tape);
    bool was = tape_set_grad_enabled(&c->tape, false);
    double v = tensor_f32(mesa_loss_from_logits(&c->tape, &c->m, c->t, c->s))[0];
    tape_set_grad_enabled(&c->tape, was);
    return v;
}

// lambda T^2 mean_b sum_k p_t (log p_t - log p_s), p = softmax(logits / T)
static double reference(const float *s, const float *t, int B, int K, double lambda, double T) {
    double total = 0;
    for (int b = 0; b < B; b++) {
        double ms = -1e300, mt = -1e300, zs = 0, zt = 0;
        for (int k = 0; k < K; k++) {
            ms = fmax(ms, s[b * K + k] / T);
            mt = fmax(mt, t[b * K + k] / T);
        }
        for (int k = 0; k < K; k++) {
            zs += exp(s[b * K + k] / T - ms);
            zt += exp(t[b * K + k] / T - mt);
        }
        for (int k = 0; k < K; k++) {
            double lpt = t[b * K + k] / T - mt - log(zt), lps = s[b * K + k] / T - ms - log(zs);
            total += exp(lpt) * (lpt - lps);
        }
    }
    return lambda * T * T * total / B;
}

static void test_mesa_term_matches_its_definition_and_gradient(void **state) {
    (void)state;
    enum { B = 3, K = 7 };
    MesaCase c = {.m = {0.8f, 5.0f, 0}};
    c.ctx = ctx_cpu();
    arena_init(&c.arena, &c.ctx, 1u << 16);
    tape_init(&c.tape, &c.ctx, &c.arena);
    c.s = test_tensor(2, B, K);
    c.t = test_tensor(2, B, K);
    test_fill(c.s, 1, -6, 6);
    test_fill(c.t, 2, -6, 6);
    c.s->requires_grad = true;
    double want = reference(c.s->data, c.t->data, B, K, 0.8, 5.0);
    double got = mesa_value(&c);
    printf("  MESA term %.9f, reference %.9f\n", got, want);
    assert_true(want > 1e-3);   // the logits differ: a real KL
    assert_true(fabs(got - want) <= 1e-5 * want);
    tape_reset(&c.tape);
    c.s->grad = NULL;
    Tensor *loss = mesa_loss_from_logits(&c.tape, &c.m, c.t, c.s);
    tape_backward(&c.tape, loss);
    assert_null(c.t->grad);   // the teacher is a target
    Tensor *g = test_like(c.s);
    memcpy(g->data, c.s->grad->data, tensor_bytes(g));
    assert_true(test_gradcheck("mesa ds", mesa_value, &c, c.s, g) < GRAD_TOL);
    // the same logits on both sides: no term
    memcpy(c.t->data, c.s->data, tensor_bytes(c.s));
    assert_true(fabs(mesa_value(&c)) < 1e-6);
    test_tensor_free(g);
    test_tensor_free(c.s);
    test_tensor_free(c.t);
    tape_free(&c.tape);
    arena_free(&c.arena);
}

static void test_mesa_is_active_from_its_start_epoch(void **state) {
    (void)state;
    Mesa on = {0.8f, 5.0f, 25}, off = {0.0f, 5.0f, 0};
    assert_false(mesa_active(&on, 24));
    assert_true(mesa_active(&on, 25));
    assert_true(mesa_active(&on, 299));
    assert_false(mesa_active(&off, 10));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mesa_term_matches_its_definition_and_gradient),
        cmocka_unit_test(test_mesa_is_active_from_its_start_epoch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
