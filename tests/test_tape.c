// The tape end to end: encoders composed from the ops (patch embed -> blocks -> head -> CE)
// gradient-checked against central finite differences for every parameter and the input.
#include "testlib.h"
#include "../nn/encoder.h"
#include "../nn/params_io.h"
#include "../kernels/error.h"

typedef struct Net {
    Ctx ctx;
    Arena arena;
    Tape tape;
    ParamTable params;
    Encoder enc;
    Tensor *img, *targets;   // test-owned CPU tensors
    bool tap_loss;           // add mean(v^2) of every block's mixer output and output: early
                             // layers' gradients stay well above finite-difference noise instead
                             // of fading through the stages to the head
} Net;

// Weights drawn from U(-0.5, 0.5) instead of the 0.02 init, so every gradient is O(0.1) and
// finite-difference noise (~1e-5 absolute) stays far below GRAD_TOL.
static void net_init(Net *n, const EncoderConfig *cfg, int batch) {
    memset(n, 0, sizeof(*n));
    n->ctx = ctx_cpu();
    arena_init(&n->arena, &n->ctx, 1u << 20);
    tape_init(&n->tape, &n->ctx, &n->arena);
    params_init_table(&n->params);
    encoder_register(&n->enc, cfg, &n->params);
    params_alloc(&n->params, &n->ctx);
    params_initialize(&n->params, &n->ctx, 7);
    for (int i = 0; i < n->params.n; i++) {
        Param *p = n->params.params[i];
        bool merge = strstr(p->name, "merge") != NULL;
        test_fill(&p->value, 100 + (uint64_t)i, merge ? 0.1f : -0.5f, 0.5f);
    }
    n->img = test_tensor(4, batch, cfg->in_chans, cfg->img_h, cfg->img_w);
    test_fill(n->img, 11, -1, 1);
    n->img->requires_grad = true;
    n->targets = test_tensor(2, batch, cfg->num_classes);
    float *t = n->targets->data;
    for (int b = 0; b < batch; b++) t[b * cfg->num_classes + (b * 3) % cfg->num_classes] = 1.0f;
}

static void net_free(Net *n) {
    tape_free(&n->tape);
    arena_free(&n->arena);
    params_free(&n->params, &n->ctx);
    test_tensor_free(n->img);
    test_tensor_free(n->targets);
}

static Tensor *net_loss(Net *n) {
    tape_reset(&n->tape);
    n->img->grad = NULL;
    EncoderTaps taps;
    Tensor *tokens = encoder_forward(&n->tape, &n->enc, n->img, n->tap_loss ? &taps : NULL);
    Tensor *loss = nn_cross_entropy(&n->tape, encoder_head(&n->tape, &n->enc, tokens), n->targets);
    for (int i = 0; n->tap_loss && i < 2 * n->enc.cfg.depth; i++) {
        Tensor *tap = i % 2 ? taps.pb[i / 2] : taps.pp[i / 2];
        Tensor *zero = tape_tensor_like(&n->tape, tap);
        op_zero(n->tape.ctx, zero);
        loss = nn_add(&n->tape, loss, nn_mse(&n->tape, tap, zero));
    }
    return loss;
}

static double loss_value(void *user) {
    Net *n = user;
    bool old = tape_set_grad_enabled(&n->tape, false);
    double v = tensor_f32(net_loss(n))[0];
    tape_set_grad_enabled(&n->tape, old);
    return v;
}

// Checks every parameter and the image; returns the worst relative error.
static double check_all(Net *n) {
    params_zero_grads(&n->params, &n->ctx);
    tape_backward(&n->tape, net_loss(n));
    Tensor *dimg = test_like(n->img);
    memcpy(dimg->data, n->img->grad->data, tensor_bytes(dimg));
    double worst = 0;
    for (int i = 0; i < n->params.n; i++) {
        Param *p = n->params.params[i];
        Tensor *g = test_like(&p->grad);
        memcpy(g->data, p->grad.data, tensor_bytes(g));
        double err = test_gradcheck(p->name, loss_value, n, &p->value, g);
        worst = fmax(worst, err);
        test_tensor_free(g);
    }
    worst = fmax(worst, test_gradcheck("image", loss_value, n, n->img, dimg));
    test_tensor_free(dimg);
    return worst;
}

// check_all in the directional form (testlib.h): every parameter and the image.
static double check_all_directional(Net *n) {
    params_zero_grads(&n->params, &n->ctx);
    tape_backward(&n->tape, net_loss(n));
    double worst = 0;
    for (int i = 0; i < n->params.n; i++) {
        Param *p = n->params.params[i];
        Tensor *g = test_like(&p->grad);
        memcpy(g->data, p->grad.data, tensor_bytes(g));
        worst = fmax(worst, test_gradcheck_directional(p->name, loss_value, n, &p->value, g, 0.02f,
                                                       (uint64_t)i + 1));
        test_tensor_free(g);
    }
    return worst;
}

static EncoderConfig tiny(EncoderKind kind) {
    EncoderConfig c = {.kind = kind, .img_h = 8, .img_w = 12, .in_chans = 2, .patch = 4,
                       .width = 8, .depth = 2, .heads = 2, .mlp_hidden = 12, .gelu = GELU_ERF,
                       .ln_eps = 1e-6f, .qkv_bias = 1, .num_classes = 5, .gspn_latent = 3,
                       .gspn_out_norm = 1, .attn_every = 2};
    if (kind == ENCODER_VIT) c.class_token = c.pos_embed = 1;
    else c.avg_pool = 1;
    return c;
}

// A tiny gspn_hier: odd grids (9x11 -> 3x3 -> 2x2 -> 1x1 after the stem: ceil halving), a 5x5
// mixer convolution, the 2-channel shared-weight scan.
static EncoderConfig tiny_hier(void) {
    return (EncoderConfig){.kind = ENCODER_GSPN_HIER, .img_h = 9, .img_w = 11, .in_chans = 2,
                           .patch = 4, .width = 8, .depths = {1, 1, 1, 1}, .depth = 4,
                           .mlp_ratio = 1, .mixer_ratio = 1.5f, .mixer_conv = 5, .gelu = GELU_ERF,
                           .ln_eps = 1e-5f, .num_classes = 5, .gspn_latent = 2, .gspn_shared_w = 1,
                           .avg_pool = 1};
}

static void test_vit_backward_matches_finite_differences(void **state) {
    (void)state;
    Net n;
    EncoderConfig c = tiny(ENCODER_VIT);
    c.gelu = GELU_TANH;
    c.layer_scale_init = 0.5f;
    net_init(&n, &c, 2);
    assert_true(check_all(&n) < GRAD_TOL);
    net_free(&n);
}

static void test_vit_avg_pool_backward_matches_finite_differences(void **state) {
    (void)state;
    Net n;
    EncoderConfig c = tiny(ENCODER_VIT);
    c.avg_pool = 1;
    net_init(&n, &c, 2);
    assert_true(check_all(&n) < GRAD_TOL);
    net_free(&n);
}

// timm's teacher layouts: register tokens, pos_embed without the prefix slots (no_embed_class:
// DeiT-III, DINOv2), layer scale, the class token's summary.
static void test_vit_registers_no_embed_class_backward_matches_finite_differences(void **state) {
    (void)state;
    Net n;
    EncoderConfig c = tiny(ENCODER_VIT);
    c.reg_tokens = 2;
    c.no_embed_class = 1;
    c.layer_scale_init = 0.5f;
    net_init(&n, &c, 2);
    assert_int_equal(n.enc.prefix, 3);
    assert_true(check_all(&n) < GRAD_TOL);
    net_free(&n);
}

// fc_norm: the mean of the patch tokens (registers and class token left out) is normed, the
// tokens are not (timm: norm is the identity); norm_pre (OpenCLIP ln_pre) before the blocks.
static void test_vit_registers_fc_norm_norm_pre_backward_matches_finite_differences(void **state) {
    (void)state;
    Net n;
    EncoderConfig c = tiny(ENCODER_VIT);
    c.reg_tokens = 3;
    c.avg_pool = 1;
    c.fc_norm = 1;
    c.norm_pre = 1;
    net_init(&n, &c, 2);
    assert_non_null(params_find(&n.params, "fc_norm.weight"));
    assert_null(params_find(&n.params, "norm.weight"));
    assert_null(params_find(&n.params, "patch_embed.proj.bias"));   // timm: bias = not pre_norm
    assert_true(check_all(&n) < GRAD_TOL);
    net_free(&n);
}

// The token layout of timm's _pos_embed, exactly: with a zero patch embedding the tokens are
// [class, registers, patches] with pos_embed on every token, or with no_embed_class on the
// patch tokens only; reg_token is (R, C) here and (1, R, C) in a timm file.
static void test_vit_prefix_tokens_follow_timms_layout(void **state) {
    (void)state;
    for (int no_embed_class = 0; no_embed_class <= 1; no_embed_class++) {
        EncoderConfig c = tiny(ENCODER_VIT);
        c.reg_tokens = 2;
        c.no_embed_class = no_embed_class;
        Net n;
        net_init(&n, &c, 1);
        op_zero(&n.ctx, n.enc.patch_embed.w);
        op_zero(&n.ctx, n.enc.patch_embed.b);
        const int P = 3, N = n.enc.grid_h * n.enc.grid_w, C = c.width;
        Param *pos = params_find(&n.params, "pos_embed"), *reg = params_find(&n.params, "reg_token");
        assert_int_equal(pos->value.shape[0], (no_embed_class ? 0 : P) + N);
        int64_t file_shape[4];
        assert_int_equal(params_file_shape(reg, file_shape), 3);
        assert_true(file_shape[0] == 1 && file_shape[1] == 2 && file_shape[2] == C);
        tape_reset(&n.tape);
        Tensor *x = encoder_embed(&n.tape, &n.enc, n.img);   // (1, P + N, C)
        assert_int_equal(x->shape[1], P + N);
        const float *y = tensor_f32(x), *cls = tensor_f32(n.enc.cls_token),
                    *rg = tensor_f32(n.enc.reg_token), *pe = tensor_f32(n.enc.pos_embed);
        for (int tkn = 0; tkn < P + N; tkn++)
            for (int k = 0; k < C; k++) {
                float base = tkn == 0 ? cls[k] : tkn < P ? rg[(tkn - 1) * C + k] : 0.0f;
                int row = no_embed_class ? tkn - P : tkn;   // the pos_embed row of this token
                float want = base + (row >= 0 ? pe[row * C + k] : 0.0f);
                assert_float_equal(y[(size_t)tkn * C + k], want, 1e-6f);
            }
        net_free(&n);
    }
}

static void test_cgspn_backward_matches_finite_differences(void **state) {
    (void)state;
    Net n;
    EncoderConfig c = tiny(ENCODER_CGSPN);
    net_init(&n, &c, 2);
    assert_true(check_all(&n) < GRAD_TOL);
    net_free(&n);
}

static void test_cgspn_shared_w_without_out_norm_backward_matches_finite_differences(void **state) {
    (void)state;
    Net n;
    EncoderConfig c = tiny(ENCODER_CGSPN);
    c.gspn_shared_w = 1;
    c.gspn_out_norm = 0;
    net_init(&n, &c, 2);
    assert_true(check_all(&n) < GRAD_TOL);
    net_free(&n);
}

static void test_hybrid_backward_matches_finite_differences(void **state) {
    (void)state;
    Net n;
    EncoderConfig c = tiny(ENCODER_HYBRID);
    net_init(&n, &c, 2);
    assert_true(n.enc.blocks[1].is_attention && !n.enc.blocks[0].is_attention);
    assert_true(check_all(&n) < GRAD_TOL);
    net_free(&n);
}

// No-grad mode records nothing and gives the same loss.
// The hierarchical GSPN encoder (nn/hier.h) end to end: stem convolutions on the NCHW image,
// odd grids (9x11 -> 3x3 -> 2x2 -> 1x1 after the stem: ceil halving), LPUs, the mixer's
// in_proj, depthwise conv, SiLU and 2-channel shared-weight scan, downsampling, head.
static void test_gspn_hier_backward_matches_finite_differences(void **state) {
    (void)state;
    EncoderConfig c = tiny_hier();
    Net n;
    net_init(&n, &c, 2);
    n.tap_loss = true;
    assert_int_equal(n.enc.hier.grid_h[0], 3);
    assert_int_equal(n.enc.hier.grid_w[0], 3);
    assert_int_equal(n.enc.grid_h * n.enc.grid_w, 1);
    // The scan's inputs reach the loss through a 2-channel proxy: their gradients (~5e-4 per
    // element) sit near the fp32 noise of a 4-stage loss, and element-wise central differences
    // read 2-13% there (growing as FD_EPS shrinks: noise, not a wrong term). Directional
    // differences move the loss far above that noise; a step of 0.02 leaves a truncation error
    // up to ~9e-3 (the stem's first convolution, through a 4-channel LayerNorm), so the bound is
    // 2e-2, still far below the order-1 error of a wrong term.
    assert_true(check_all_directional(&n) < 2e-2);
    net_free(&n);
}

// mlp_keep_hidden: backward reads the forward's gelu(fc1(x)) instead of making it again; the
// gradients are the same bits (the CPU makes h from the same fp32 pre either way), and the arena
// holds the kept hidden activations after the forward pass.
static void expect_keep_hidden_same_gradients(EncoderConfig c, bool taps) {
    Net a, b;
    c.mlp_keep_hidden = 0;
    net_init(&a, &c, 2);
    c.mlp_keep_hidden = 1;
    net_init(&b, &c, 2);
    a.tap_loss = b.tap_loss = taps;
    params_zero_grads(&a.params, &a.ctx);
    params_zero_grads(&b.params, &b.ctx);
    Tensor *la = net_loss(&a), *lb = net_loss(&b);
    assert_true(b.arena.in_use > a.arena.in_use);
    tape_backward(&a.tape, la);
    tape_backward(&b.tape, lb);
    for (int i = 0; i < a.params.n; i++) {
        const Tensor *ga = &a.params.params[i]->grad, *gb = &b.params.params[i]->grad;
        assert_true(test_dot(ga, ga) > 0);
        assert_memory_equal(ga->data, gb->data, tensor_bytes(ga));
    }
    assert_memory_equal(a.img->grad->data, b.img->grad->data, tensor_bytes(a.img));
    net_free(&a);
    net_free(&b);
}

static void test_mlp_keep_hidden_gives_the_same_gradients(void **state) {
    (void)state;
    EncoderConfig v = tiny(ENCODER_VIT);
    expect_keep_hidden_same_gradients(v, false);   // fc2 writing x + MLP (nn_mlp_residual)
    v.layer_scale_init = 0.5f;
    expect_keep_hidden_same_gradients(v, true);    // layer scale: the MLP alone (nn_mlp)
    expect_keep_hidden_same_gradients(tiny_hier(), false);
}

// gspn_hier too, whose mixer then runs its convolution and SiLU as one op (nn_dwconv_silu).
static void expect_no_grad_records_nothing(EncoderConfig c) {
    Net n;
    net_init(&n, &c, 2);
    float with = tensor_f32(net_loss(&n))[0];
    assert_true(n.tape.n > 0);
    tape_set_grad_enabled(&n.tape, false);
    float without = tensor_f32(net_loss(&n))[0];
    assert_int_equal(n.tape.n, 0);
    assert_true(with == without);
    net_free(&n);
}

static void test_no_grad_records_nothing(void **state) {
    (void)state;
    expect_no_grad_records_nothing(tiny(ENCODER_VIT));
    expect_no_grad_records_nothing(tiny_hier());
}

// Frozen parameters get no gradient; the others still do.
static void test_frozen_parameters_get_no_gradient(void **state) {
    (void)state;
    Net n;
    EncoderConfig c = tiny(ENCODER_CGSPN);
    net_init(&n, &c, 2);
    params_set_trainable(&n.params, NULL, false);
    params_set_trainable(&n.params, "blocks.0.gspn", true);
    params_zero_grads(&n.params, &n.ctx);
    tape_backward(&n.tape, net_loss(&n));
    for (int i = 0; i < n.params.n; i++) {
        Param *p = n.params.params[i];
        double s = test_dot(&p->grad, &p->grad);
        if (p->trainable) assert_true(s > 0);
        else assert_true(s == 0);
    }
    net_free(&n);
}

// What the data-parallel trainer relies on (tape_set_param_done): every trainable parameter is
// reported once per backward, at a moment its gradient already has its final value, and the
// last layers are reported while the first ones' gradients are still untouched (so their
// all-reduce can overlap the rest of backward).
typedef struct DoneLog {
    ParamTable *t;
    float **at_report;        // per parameter: a copy of its gradient when reported
    int *order;               // report position per parameter (-1: never)
    int n;
    bool embed_zero_at_head;  // patch_embed.proj.weight's gradient was all zero when head.weight came
} DoneLog;

static void log_done(void *user, const Tensor *grad) {
    DoneLog *l = user;
    for (int i = 0; i < l->t->n; i++) {
        Param *p = l->t->params[i];
        if (&p->grad != grad) continue;
        assert_int_equal(l->order[i], -1);   // once
        l->order[i] = l->n++;
        l->at_report[i] = malloc(tensor_bytes(grad));
        memcpy(l->at_report[i], grad->data, tensor_bytes(grad));
        if (strcmp(p->name, "head.weight") == 0)
            l->embed_zero_at_head = test_dot(&params_find(l->t, "patch_embed.proj.weight")->grad,
                                             &params_find(l->t, "patch_embed.proj.weight")->grad) == 0;
        return;
    }
    fail_msg("a reported gradient is not a parameter's");
}

static void test_param_done_reports_each_parameter_once_with_its_final_gradient(void **state) {
    (void)state;
    Net n;
    EncoderConfig c = tiny(ENCODER_CGSPN);
    c.attn_every = 2;   // a hybrid: attention and C-GSPN records
    c.kind = ENCODER_HYBRID;
    net_init(&n, &c, 2);
    params_set_trainable(&n.params, "blocks.0.norm2.", false);   // frozen: never reported
    DoneLog l = {.t = &n.params};
    l.at_report = calloc((size_t)n.params.n, sizeof(float *));
    l.order = malloc((size_t)n.params.n * sizeof(int));
    for (int i = 0; i < n.params.n; i++) l.order[i] = -1;
    params_zero_grads(&n.params, &n.ctx);
    Tensor *loss = net_loss(&n);
    tape_set_param_done(&n.tape, log_done, &l);
    tape_backward(&n.tape, loss);
    tape_set_param_done(&n.tape, NULL, NULL);
    for (int i = 0; i < n.params.n; i++) {
        Param *p = n.params.params[i];
        if (!p->trainable) {
            assert_int_equal(l.order[i], -1);
            continue;
        }
        if (l.order[i] < 0) fail_msg("%s was never reported", p->name);
        assert_memory_equal(l.at_report[i], p->grad.data, tensor_bytes(&p->grad));
        free(l.at_report[i]);
    }
    assert_true(l.embed_zero_at_head);
    assert_true(l.order[0] > l.order[n.params.n - 1]);   // the first parameter comes last
    free(l.at_report);
    free(l.order);
    net_free(&n);
}

// tape_backward_from(tokens, seed) is the gradient of sum(tokens * seed): the seed is written into
// the fresh gradient of the output; a second seed for the same output adds to it;
// tape_backward_from_consume gives the same gradients through the seed's own buffer.
typedef struct SeedCase {
    Net n;
    Tensor *seed;
} SeedCase;

static Tensor *seed_tokens(Net *n) {
    tape_reset(&n->tape);
    n->img->grad = NULL;
    return encoder_forward(&n->tape, &n->enc, n->img, NULL);
}

static double seeded_value(void *user) {
    SeedCase *c = user;
    bool old = tape_set_grad_enabled(&c->n.tape, false);
    double v = test_dot(seed_tokens(&c->n), c->seed);
    tape_set_grad_enabled(&c->n.tape, old);
    return v;
}

static void test_backward_from_seeds_match_finite_differences(void **state) {
    (void)state;
    SeedCase c;
    EncoderConfig cfg = tiny(ENCODER_CGSPN);
    net_init(&c.n, &cfg, 2);
    Tensor *y = seed_tokens(&c.n);
    c.seed = test_like(y);
    test_fill(c.seed, 31, -1, 1);
    params_zero_grads(&c.n.params, &c.n.ctx);
    tape_backward_from(&c.n.tape, 1, &y, &c.seed);
    double worst = 0;
    for (int i = 0; i < c.n.params.n; i++) {
        Param *p = c.n.params.params[i];
        Tensor *g = test_like(&p->grad);
        memcpy(g->data, p->grad.data, tensor_bytes(g));
        worst = fmax(worst, test_gradcheck(p->name, seeded_value, &c, &p->value, g));
        test_tensor_free(g);
    }
    assert_true(worst < GRAD_TOL);

    // Two halves of the seed on the same output: the same gradients (the second one adds).
    Param *w = c.n.params.params[0];   // patch_embed.proj.weight: every path reaches it
    Tensor *once = test_like(&w->grad);
    memcpy(once->data, w->grad.data, tensor_bytes(once));
    Tensor *half = test_like(c.seed);
    for (size_t i = 0; i < half->numel; i++) tensor_f32(half)[i] = 0.5f * tensor_f32(c.seed)[i];
    params_zero_grads(&c.n.params, &c.n.ctx);
    y = seed_tokens(&c.n);
    tape_backward_from(&c.n.tape, 2, (Tensor *[]){y, y}, (Tensor *[]){half, half});
    assert_true(test_rel_err(tensor_f32(&w->grad), tensor_f32(once), once->numel) < 1e-6);
    assert_true(test_dot(once, once) > 0);

    // Consumed (the seed becomes the output's gradient buffer): the same gradients.
    Tensor *taken = test_like(c.seed);
    memcpy(taken->data, c.seed->data, tensor_bytes(c.seed));
    params_zero_grads(&c.n.params, &c.n.ctx);
    y = seed_tokens(&c.n);
    tape_backward_from_consume(&c.n.tape, 1, &y, &taken);
    assert_ptr_equal(y->grad->data, taken->data);
    assert_true(test_rel_err(tensor_f32(&w->grad), tensor_f32(once), once->numel) < 1e-6);
    test_tensor_free(taken);
    test_tensor_free(once);
    test_tensor_free(half);
    test_tensor_free(c.seed);
    net_free(&c.n);
}

// GSPN's stem and Local Perception Unit as the tape composes them: an NCHW image through
// nn_conv2d (3x3, stride 2), then channels-last nn_conv2d (2x2, stride 2), x + nn_dwconv(x) and
// nn_dwconv_residual(x), then a linear written onto its own input (nn_linear_residual: y + y w^T
// + b, the residual's gradient adopted and the branch's added), then a 2-channel projection of
// the result added back and convolved in one op (nn_linear_residual_dwconv, the LPU's weights
// again), every parameter and the image against finite differences.
typedef struct ConvChain {
    Ctx ctx;
    Arena arena;
    Tape tape;
    ParamTable params;
    Tensor *w1, *b1, *w2, *b2, *dw, *db, *wl, *bl, *wp, *wu, *bu, *img, *target;
} ConvChain;

static Tensor *conv_chain_loss(ConvChain *c) {
    tape_reset(&c->tape);
    c->img->grad = NULL;
    Tensor *y = nn_conv2d(&c->tape, c->img, c->w1, c->b1, 1, 2, 1);   // (2,5,4,6)
    y = nn_conv2d(&c->tape, y, c->w2, c->b2, 0, 2, 0);                // (2,2,2,8)
    y = nn_add(&c->tape, y, nn_dwconv(&c->tape, y, c->dw, c->db));
    y = nn_dwconv_residual(&c->tape, y, c->dw, c->db);   // the same LPU fused, its weights again
    y = nn_linear_residual(&c->tape, y, y, c->wl, c->bl);
    Tensor *u = nn_linear(&c->tape, y, c->wp, NULL);                    // (2,2,2,2)
    y = nn_linear_residual_dwconv(&c->tape, y, u, c->wu, c->bu, c->dw, c->db);
    return nn_mse(&c->tape, y, c->target);
}

static double conv_chain_value(void *user) {
    ConvChain *c = user;
    bool old = tape_set_grad_enabled(&c->tape, false);
    double v = tensor_f32(conv_chain_loss(c))[0];
    tape_set_grad_enabled(&c->tape, old);
    return v;
}

static void test_conv2d_and_dwconv_backward_matches_finite_differences(void **state) {
    (void)state;
    ConvChain c;
    memset(&c, 0, sizeof c);
    c.ctx = ctx_cpu();
    arena_init(&c.arena, &c.ctx, 1u << 22);
    tape_init(&c.tape, &c.ctx, &c.arena);
    params_init_table(&c.params);
    c.w1 = params_add(&c.params, "stem.weight", 4, (int[]){6, 3, 3, 3}, INIT_FAN_IN_UNIFORM, 0, true);
    c.b1 = params_add(&c.params, "stem.bias", 1, (int[]){6}, INIT_ZEROS, 0, false);
    c.w2 = params_add(&c.params, "down.weight", 4, (int[]){8, 6, 2, 2}, INIT_FAN_IN_UNIFORM, 0, true);
    c.b2 = params_add(&c.params, "down.bias", 1, (int[]){8}, INIT_ZEROS, 0, false);
    c.dw = params_add(&c.params, "lpu.weight", 4, (int[]){8, 1, 3, 3}, INIT_FAN_IN_UNIFORM, 0, true);
    c.db = params_add(&c.params, "lpu.bias", 1, (int[]){8}, INIT_ZEROS, 0, false);
    c.wl = params_add(&c.params, "proj.weight", 2, (int[]){8, 8}, INIT_FAN_IN_UNIFORM, 0, true);
    c.bl = params_add(&c.params, "proj.bias", 1, (int[]){8}, INIT_ZEROS, 0, false);
    c.wp = params_add(&c.params, "proxy.weight", 2, (int[]){2, 8}, INIT_FAN_IN_UNIFORM, 0, true);
    c.wu = params_add(&c.params, "up.weight", 2, (int[]){8, 2}, INIT_FAN_IN_UNIFORM, 0, true);
    c.bu = params_add(&c.params, "up.bias", 1, (int[]){8}, INIT_ZEROS, 0, false);
    params_alloc(&c.params, &c.ctx);
    for (int i = 0; i < c.params.n; i++) test_fill(&c.params.params[i]->value, 50 + i, -0.5f, 0.5f);
    c.img = test_tensor(4, 2, 3, 9, 8);
    c.target = test_tensor(4, 2, 2, 2, 8);
    test_fill(c.img, 60, -1, 1);
    test_fill(c.target, 61, -1, 1);
    c.img->requires_grad = true;
    params_zero_grads(&c.params, &c.ctx);
    tape_backward(&c.tape, conv_chain_loss(&c));
    Tensor *gimg = test_like(c.img);
    memcpy(gimg->data, c.img->grad->data, tensor_bytes(gimg));
    double worst = test_gradcheck("image", conv_chain_value, &c, c.img, gimg);
    for (int i = 0; i < c.params.n; i++) {
        Param *p = c.params.params[i];
        Tensor *g = test_like(&p->grad);
        memcpy(g->data, p->grad.data, tensor_bytes(g));
        assert_true(test_dot(g, g) > 0);
        worst = fmax(worst, test_gradcheck(p->name, conv_chain_value, &c, &p->value, g));
        test_tensor_free(g);
    }
    assert_true(worst < GRAD_TOL);
    test_tensor_free(gimg);
    test_tensor_free(c.img);
    test_tensor_free(c.target);
    tape_free(&c.tape);
    arena_free(&c.arena);
    params_free(&c.params, &c.ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conv2d_and_dwconv_backward_matches_finite_differences),
        cmocka_unit_test(test_vit_backward_matches_finite_differences),
        cmocka_unit_test(test_vit_avg_pool_backward_matches_finite_differences),
        cmocka_unit_test(test_vit_registers_no_embed_class_backward_matches_finite_differences),
        cmocka_unit_test(test_vit_registers_fc_norm_norm_pre_backward_matches_finite_differences),
        cmocka_unit_test(test_vit_prefix_tokens_follow_timms_layout),
        cmocka_unit_test(test_cgspn_backward_matches_finite_differences),
        cmocka_unit_test(test_cgspn_shared_w_without_out_norm_backward_matches_finite_differences),
        cmocka_unit_test(test_hybrid_backward_matches_finite_differences),
        cmocka_unit_test(test_gspn_hier_backward_matches_finite_differences),
        cmocka_unit_test(test_mlp_keep_hidden_gives_the_same_gradients),
        cmocka_unit_test(test_no_grad_records_nothing),
        cmocka_unit_test(test_frozen_parameters_get_no_gradient),
        cmocka_unit_test(test_param_done_reports_each_parameter_once_with_its_final_gradient),
        cmocka_unit_test(test_backward_from_seeds_match_finite_differences),
    };
    return cmocka_run_group_tests_name("tape", tests, NULL, NULL);
}
