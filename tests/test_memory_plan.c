// The tape's memory plan (nn/tape.h) and activation recomputation (grad_checkpoint):
// gradients bitwise equal with and without recomputation, for every encoder kind, with taps and
// drop path; the arena's peak below what a step hands out; nothing left in use after backward
// but what the caller keeps; the arena's placement repeatable.
#include "testlib.h"
#include "../nn/encoder.h"
#include "../kernels/device.h"
#include "../kernels/error.h"
#include "../train/memory_report.h"

typedef struct Run {
    Ctx ctx;
    Arena arena;
    Tape tape;
    ParamTable params;
    Encoder enc;
    Tensor *img;
} Run;

static EncoderConfig tiny(EncoderKind kind, int depth) {
    EncoderConfig c = {.kind = kind, .img_h = 8, .img_w = 12, .in_chans = 2, .patch = 4,
                       .width = 8, .depth = depth, .heads = 2, .mlp_hidden = 12,
                       .gelu = GELU_TANH, .ln_eps = 1e-6f, .qkv_bias = 1, .num_classes = 5,
                       .gspn_latent = 3, .gspn_out_norm = 1, .attn_every = 2};
    if (kind == ENCODER_VIT) c.class_token = c.pos_embed = 1;
    else c.avg_pool = 1;
    return c;
}

static void run_init(Run *r, const EncoderConfig *cfg, float drop_path) {
    memset(r, 0, sizeof(*r));
    r->ctx = ctx_cpu();
    arena_init(&r->arena, &r->ctx, 1u << 16);   // small chunks: placement across several
    tape_init(&r->tape, &r->ctx, &r->arena);
    params_init_table(&r->params);
    encoder_register(&r->enc, cfg, &r->params);
    params_alloc(&r->params, &r->ctx);
    params_initialize(&r->params, &r->ctx, 7);
    for (int i = 0; i < r->params.n; i++) {   // O(1) weights: every gradient well away from 0
        Param *p = r->params.params[i];
        test_fill(&p->value, 100 + (uint64_t)i, strstr(p->name, "merge") ? 0.1f : -0.5f, 0.5f);
    }
    r->enc.drop_path = (EncoderDropPath){drop_path, 5, 3, 0};
    r->img = test_tensor(4, 3, cfg->in_chans, cfg->img_h, cfg->img_w);
    test_fill(r->img, 11, -1, 1);
    r->img->requires_grad = true;
}

static void run_free(Run *r) {
    tape_free(&r->tape);
    arena_free(&r->arena);
    params_free(&r->params, &r->ctx);
    test_tensor_free(r->img);
}

// One step: forward (with taps: a loss on every block's PP and PB too), cross-entropy on the
// head, backward. Returns the loss; the gradients are in the parameter table and img->grad.
static float step(Run *r, bool taps) {
    tape_reset(&r->tape);
    r->img->grad = NULL;
    params_zero_grads(&r->params, &r->ctx);
    Tape *t = &r->tape;
    EncoderTaps tp;
    Tensor *tokens = encoder_forward(t, &r->enc, r->img, taps ? &tp : NULL);
    Tensor *logits = encoder_head(t, &r->enc, tokens);
    Tensor *targets = tape_tensor(t, 2, logits->shape, true);
    op_zero(&r->ctx, targets);
    for (int b = 0; b < logits->shape[0]; b++) tensor_f32(targets)[b * logits->shape[1] + b] = 1;
    Tensor *loss = nn_cross_entropy(t, logits, targets);
    for (int i = 0; taps && i < r->enc.cfg.depth; i++) {
        Tensor *pp = nn_cast(t, tp.pp[i], DTYPE_F32);
        loss = nn_add(t, loss, nn_mse(t, pp, nn_scale(t, pp, 0.5f)));
        loss = nn_add(t, loss, nn_token_kl(t, tp.pb[i], nn_scale(t, tp.pb[i], 0.25f)));
    }
    tape_keep(t, loss);
    tape_backward(t, loss);
    return tensor_f32(loss)[0];
}

typedef struct Grads { float loss; float *g; size_t n; float *dimg; size_t peak; } Grads;

static Grads grads_of(const EncoderConfig *cfg, int grad_checkpoint, bool taps, float drop_path) {
    EncoderConfig c = *cfg;
    c.grad_checkpoint = grad_checkpoint;
    Run r;
    run_init(&r, &c, drop_path);
    Grads g = {.n = r.params.total};
    g.loss = step(&r, taps);
    g.g = cg_malloc(g.n * sizeof(float));
    memcpy(g.g, r.params.grads, g.n * sizeof(float));
    g.dimg = cg_malloc(tensor_bytes(r.img));
    memcpy(g.dimg, r.img->grad->data, tensor_bytes(r.img));
    g.peak = r.arena.peak;
    // Nothing stays in use after backward but what is kept: the loss and its gradient (256-byte
    // blocks), and the image's gradient (the image is the caller's, not the arena's).
    size_t dimg = (tensor_bytes(r.img) + 255) / 256 * 256;
    assert_int_equal(r.arena.in_use, 2 * 256 + dimg);
    run_free(&r);
    return g;
}

static void grads_free(Grads *g) {
    free(g->g);
    free(g->dimg);
}

// Recomputing every block, or every second one, gives the same bits as keeping everything.
static void check_recomputation_is_bitwise(EncoderKind kind, bool taps, float drop_path) {
    EncoderConfig c = tiny(kind, 4);
    Grads plain = grads_of(&c, 0, taps, drop_path);
    for (int every = 1; every <= 2; every++) {
        Grads rc = grads_of(&c, every, taps, drop_path);
        printf("    %s%s, grad_checkpoint %d: loss %.7g, peak %zu bytes (without: %zu)\n",
               (const char *[]){"vit", "cgspn", "hybrid"}[kind], taps ? " with taps" : "", every,
               rc.loss, rc.peak, plain.peak);
        assert_true(isfinite(plain.loss));
        assert_memory_equal(&rc.loss, &plain.loss, sizeof(float));
        assert_memory_equal(rc.g, plain.g, plain.n * sizeof(float));
        assert_memory_equal(rc.dimg, plain.dimg, 3 * c.in_chans * c.img_h * c.img_w * sizeof(float));
        if (every == 1) assert_true(rc.peak < plain.peak);   // recomputation keeps less
        grads_free(&rc);
    }
    double s = 0;   // the gradients are real: every parameter group reached
    for (size_t i = 0; i < plain.n; i++) s += fabs(plain.g[i]);
    assert_true(s > 0 && isfinite(s));
    grads_free(&plain);
}

static void test_vit_recomputation_is_bitwise(void **state) {
    check_recomputation_is_bitwise(ENCODER_VIT, false, 0.0f);
}
static void test_cgspn_recomputation_is_bitwise(void **state) {
    check_recomputation_is_bitwise(ENCODER_CGSPN, false, 0.0f);
}
static void test_hybrid_recomputation_with_taps_and_drop_path_is_bitwise(void **state) {
    check_recomputation_is_bitwise(ENCODER_HYBRID, true, 0.3f);
}
static void test_vit_recomputation_with_taps_is_bitwise(void **state) {
    check_recomputation_is_bitwise(ENCODER_VIT, true, 0.0f);
}

// The plan releases as backward goes: the peak is well below the bytes the step hands out
// (forward activations + every gradient + backward temporaries), and the same step places its
// blocks at the same addresses every time (the arena is reused, nothing new is allocated).
static void test_backward_releases_and_placement_repeats(void **state) {
    EncoderConfig c = tiny(ENCODER_HYBRID, 6);
    Run r;
    run_init(&r, &c, 0.0f);
    step(&r, false);
    size_t reserved = r.arena.reserved, peak = r.arena.peak;
    float *g1 = cg_malloc(r.params.total * sizeof(float));
    memcpy(g1, r.params.grads, r.params.total * sizeof(float));
    step(&r, false);
    assert_int_equal(r.arena.reserved, reserved);   // no new chunk on the second step
    assert_int_equal(r.arena.peak, peak);
    assert_memory_equal(g1, r.params.grads, r.params.total * sizeof(float));
    // Every gradient of the step in one place at once would need the activations twice over.
    size_t act = 0;
    tape_reset(&r.tape);
    bool old = tape_set_grad_enabled(&r.tape, true);
    encoder_head(&r.tape, &r.enc, encoder_forward(&r.tape, &r.enc, r.img, NULL));
    act = r.arena.in_use;   // the forward's activations, all kept for backward
    tape_set_grad_enabled(&r.tape, old);
    printf("    forward keeps %zu bytes; step peak %zu bytes\n", act, peak);
    assert_true(peak < 2 * act);
    assert_true(peak >= act);
    free(g1);
    run_free(&r);
}

// The memory plan a command prints accounts for every byte the process holds on the device (on
// the CPU: device_alloc's), and the measured peak sees an allocation made and freed in between.
static void test_memory_plan_accounts_for_every_byte(void **state) {
    EncoderConfig c = tiny(ENCODER_CGSPN, 3);
    Run r;
    run_init(&r, &c, 0.0f);
    step(&r, false);
    const ParamTable *tables[1] = {&r.params};
    MemoryPlan m = memory_plan(&r.ctx, tables, 1, &r.arena);
    const size_t n = r.params.total;
    assert_int_equal(m.params, n * (sizeof(float) + sizeof(float)));   // fp32 values + gradients
    assert_int_equal(m.masters, 0);                                      // none in fp32
    assert_int_equal(m.optimizer, 2 * n * sizeof(float));                // AdamW's m and v
    assert_int_equal(m.activations, r.arena.reserved);
    assert_true(m.activations > 0);
    assert_int_equal(m.workspaces, 0);   // the CPU has no workspaces beside these
    DeviceMemoryUse u = device_memory_use(&r.ctx);
    assert_int_equal(m.total, u.now);
    assert_true(u.peak >= u.now);

    device_memory_reset_peak(&r.ctx);
    assert_int_equal(device_memory_use(&r.ctx).peak, u.now);
    void *p = device_alloc(&r.ctx, 1u << 20);
    assert_int_equal(device_memory_use(&r.ctx).now, u.now + (1u << 20));
    device_free(&r.ctx, p);
    assert_int_equal(device_memory_use(&r.ctx).now, u.now);
    assert_int_equal(memory_peak_take(&r.ctx), u.now + (1u << 20));   // the window saw it
    assert_int_equal(memory_peak_take(&r.ctx), u.now);                // a new window did not
    char buf[32];
    assert_string_equal(format_bytes(3u << 20, buf, sizeof buf), "3.0 MiB");
    assert_string_equal(format_bytes((size_t)3 << 30, buf, sizeof buf), "3.00 GiB");
    run_free(&r);
    assert_int_equal(device_memory_use(&r.ctx).now, 0);   // nothing held after the run is freed
}

// Blocks of the arena: best fit, released spans merge, a released block's bytes are reused.
static void test_arena_best_fit_merge_and_stamps(void **state) {
    Ctx cpu = ctx_cpu();
    Arena a;
    arena_init(&a, &cpu, 4096);
    char *p0 = arena_alloc_stamped(&a, 1000, 0);   // 1024
    char *p1 = arena_alloc_stamped(&a, 256, 1);
    char *p2 = arena_alloc_stamped(&a, 512, 2);
    assert_ptr_equal(p1, p0 + 1024);
    assert_ptr_equal(p2, p1 + 256);
    assert_int_equal(a.in_use, 1792);
    assert_int_equal(arena_stamp_of(&a, p1 + 10), 1);   // an inner address finds its block
    arena_release(&a, p0);
    arena_release(&a, p1 + 100);
    assert_int_equal(a.in_use, 512);
    assert_true(isnan(((float *)p0)[0]));               // poisoned on the CPU
    char *q = arena_alloc_stamped(&a, 1280, 3);         // the merged 1024 + 256 span fits exactly
    assert_ptr_equal(q, p0);
    char *r = arena_alloc_stamped(&a, 4096, 4);         // nothing fits: a new chunk
    assert_int_equal(a.n_chunks, 2);
    arena_restamp(&a, q, 5);
    arena_release_from(&a, 3);                          // q (5), r (4) go; p2 (2) stays
    assert_int_equal(a.in_use, 512);
    assert_int_equal(arena_stamp_of(&a, r), ARENA_KEEP);
    assert_int_equal(arena_stamp_of(&a, p2), 2);
    int here = 7;
    arena_release(&a, &here);                           // not the arena's: left alone
    assert_int_equal(a.in_use, 512);
    arena_reset(&a);
    assert_int_equal(a.in_use, 0);
    assert_ptr_equal(arena_alloc_stamped(&a, 4096, 0), a.chunks[0].base);
    arena_free(&a);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_arena_best_fit_merge_and_stamps),
        cmocka_unit_test(test_backward_releases_and_placement_repeats),
        cmocka_unit_test(test_memory_plan_accounts_for_every_byte),
        cmocka_unit_test(test_vit_recomputation_is_bitwise),
        cmocka_unit_test(test_cgspn_recomputation_is_bitwise),
        cmocka_unit_test(test_hybrid_recomputation_with_taps_and_drop_path_is_bitwise),
        cmocka_unit_test(test_vit_recomputation_with_taps_is_bitwise),
    };
    return cmocka_run_group_tests_name("memory_plan", tests, NULL, NULL);
}
