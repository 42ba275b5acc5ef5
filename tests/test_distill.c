// Distillation (train/distill.h, train/teacher.h, nn/adaptor.h, train/export.h): the MSE and KL
// taps and the adaptor against finite differences; the Stage 1 and Stage 2 losses of a tiny
// teacher/student pair against the same losses composed by hand from the tested ops; what the
// student copies from the teacher; loading a teacher (pos_embed resampled, missing and
// mis-shaped tensors refused with a message); export dropping the adaptors; a distillation run
// resumed bit-exactly.
#include "testlib.h"
#include "train_fixture.h"
#include "sigterm_run.h"
#include "../train/checkpoint.h"
#include "../train/data_parallel.h"
#include "../train/distill.h"
#include "../kernels/error.h"
#include "../train/export.h"
#include "../train/model_config.h"
#include "../nn/params_io.h"
#include "../nn/resample.h"
#include "../nn/safetensors.h"
#include <unistd.h>

// Losses composed two ways from the same ops in the same order agree to the last bit but for
// the order of a few fp32 additions; 1e-5 relative is far below any real difference.
#define SAME_LOSS_TOL 1e-5

static char g_dir[256];
static int setup_dir(void **state) { return test_make_temp_dir(g_dir, sizeof g_dir, "distill"); }
static int teardown_dir(void **state) { return test_remove_dir(g_dir); }

static const char *tmp_path(const char *name) {
    static char paths[8][512];
    static int next;
    char *p = paths[next++ % 8];
    snprintf(p, 512, "%s/%s", g_dir, name);
    return p;
}

static void assert_close(double a, double b, double tol, const char *what) {
    double rel = fabs(a - b) / fmax(fabs(b), 1e-12);
    if (rel > tol) fail_msg("%s: %.9g vs reference %.9g (rel %.2e)", what, a, b, rel);
}

// ---- tiny teacher and student ------------------------------------------------------------------

// Register tokens of the teacher write_teacher writes (0: a plain ViT; else also no_embed_class
// and layer scale, DINOv2-reg / DeiT-III style).
static int g_teacher_regs;
// 1: the teacher pools with a MAP head (SigLIP's attn_pool) and has no class token.
static int g_teacher_map;

// The model keys of a tiny Fashion-MNIST-shaped ViT teacher (class token) / C-GSPN student.
static Config tiny_teacher_config(void) {
    Config c;
    config_defaults(&c);
    snprintf(c.model, sizeof c.model, "vit");
    c.img_size = 28, c.in_chans = 1, c.patch = 7, c.width = 16, c.depth = 2, c.heads = 2;
    c.mlp_hidden = 24, c.num_classes = 10, c.class_token = 1, c.pos_embed = 1;
    c.reg_tokens = g_teacher_regs;
    c.no_embed_class = g_teacher_regs > 0;
    c.layer_scale_init = g_teacher_regs > 0 ? 0.5f : 0.0f;
    if (g_teacher_map) {
        c.class_token = 0;
        snprintf(c.global_pool, sizeof c.global_pool, "map");
    }
    snprintf(c.device, sizeof c.device, "cpu");
    return c;
}

// The run config: student model keys, the teacher written by write_teacher.
static Config tiny_run_config(int stage, const char *model) {
    Config c = tiny_teacher_config();
    snprintf(c.model, sizeof c.model, "%s", model);
    c.class_token = 0, c.pos_embed = 0, c.gspn_latent = 4;
    c.reg_tokens = 0, c.no_embed_class = 0, c.layer_scale_init = 0;
    if (strcmp(model, "hybrid") == 0) c.attn_every = 2;
    snprintf(c.global_pool, sizeof c.global_pool, "avg");   // the student's, whatever the teacher's
    c.stage = stage;
    snprintf(c.teacher, sizeof c.teacher, "%s", tmp_path("teacher.safetensors"));
    snprintf(c.teacher_config, sizeof c.teacher_config, "%s", tmp_path("teacher.cfg"));
    snprintf(c.out_dir, sizeof c.out_dir, "%s", g_dir);
    return c;
}

// Draws every parameter of t from U(lo, hi) (merge weights positive), so every tap is O(1).
static void randomize(ParamTable *t, uint64_t seed, float lo, float hi) {
    for (int i = 0; i < t->n; i++) {
        Param *p = t->params[i];
        bool merge = strstr(p->name, "merge") != NULL;
        test_fill(&p->value, seed + (uint64_t)i, merge ? 0.1f : lo, hi);
    }
}

// Writes a random ViT teacher of model keys tc (weights NAME.safetensors + NAME.cfg) into the temp
// folder, with a pos_embed for the grid of img_size (the run's, or another one to test
// resampling); the cfg says img_size 28.
static void write_teacher_as(Config tc, const char *name, int img_size, const char *prefix,
                             const char *skip, bool wrong_shape) {
    tc.img_size = img_size;
    Ctx ctx = ctx_cpu();
    Encoder e;
    ParamTable t;
    params_init_table(&t);
    EncoderConfig ec = encoder_config_from(&tc);
    encoder_register(&e, &ec, &t);
    params_alloc(&t, &ctx);
    params_initialize(&t, &ctx, 5);
    randomize(&t, 300, -0.5f, 0.5f);
    StWriteTensor *w = calloc((size_t)t.n, sizeof(StWriteTensor));
    char (*names)[160] = calloc((size_t)t.n, sizeof *names);
    int k = 0;
    for (int i = 0; i < t.n; i++) {
        Param *p = t.params[i];
        if (skip && strcmp(p->name, skip) == 0) continue;
        snprintf(names[k], sizeof names[k], "%s%s", prefix, p->name);
        w[k].name = names[k];
        w[k].dtype = ST_F32;
        w[k].ndim = params_file_shape(p, w[k].shape);
        w[k].data = p->value.data;
        if (wrong_shape && strcmp(p->name, "blocks.1.mlp.fc1.weight") == 0) w[k].shape[0] = 12;   // 12*16 of 24*16 values
        k++;
    }
    char err[1024], path[64];
    snprintf(path, sizeof path, "%s.safetensors", name);
    if (st_write_err(tmp_path(path), w, k, NULL, 0, NULL, NULL, err, sizeof err) != 0)
        fail_msg("%s", err);
    tc.img_size = 28;
    snprintf(path, sizeof path, "%s.cfg", name);
    assert_int_equal(config_save(&tc, tmp_path(path)), 0);
    free(w);
    free(names);
    params_free(&t, &ctx);
}

static void write_teacher(int img_size, const char *prefix, const char *skip, bool wrong_shape) {
    write_teacher_as(tiny_teacher_config(), "teacher", img_size, prefix, skip, wrong_shape);
}

static Tensor *random_images(int batch, uint64_t seed) {
    Tensor *img = test_tensor(4, batch, 1, 28, 28);
    test_fill(img, seed, -1, 1);
    return img;
}

// ---- taps and adaptor gradients ------------------------------------------------------------------

typedef struct TapCase {
    Ctx ctx;
    Arena arena;
    Tape tape;
    ParamTable params;
    Adaptor ad;
    bool with_adaptor;
    Tensor *vs, *vt;
    float lambda;
} TapCase;

// vs (2, 3, 6) against vt (2, 3, out): out = 6 with the residual adaptor, else a width-changing
// one (a teacher of another width).
static void tap_case_init_out(TapCase *c, bool with_adaptor, int out, uint64_t seed) {
    memset(c, 0, sizeof *c);
    c->ctx = ctx_cpu();
    arena_init(&c->arena, &c->ctx, 1u << 20);
    tape_init(&c->tape, &c->ctx, &c->arena);
    params_init_table(&c->params);
    adaptor_register(&c->ad, &c->params, "adaptors.0.pp", 6, out, 5, GELU_ERF);
    params_alloc(&c->params, &c->ctx);
    params_initialize(&c->params, &c->ctx, 3);
    randomize(&c->params, seed, -0.5f, 0.5f);   // W2 != 0, so every adaptor parameter matters
    c->with_adaptor = with_adaptor;
    c->vs = test_tensor(3, 2, 3, 6);
    c->vt = test_tensor(3, 2, 3, out);
    test_fill(c->vs, seed + 100, -1.5f, 1.5f);
    test_fill(c->vt, seed + 200, -1.5f, 1.5f);
    c->vs->requires_grad = true;
    c->lambda = 7.0f / 3.0f;
}

static void tap_case_init(TapCase *c, bool with_adaptor, uint64_t seed) {
    tap_case_init_out(c, with_adaptor, 6, seed);
}

static void tap_case_free(TapCase *c) {
    tape_free(&c->tape);
    arena_free(&c->arena);
    params_free(&c->params, &c->ctx);
    test_tensor_free(c->vs);
    test_tensor_free(c->vt);
}

static Tensor *tap_case_loss(TapCase *c) {
    tape_reset(&c->tape);
    c->vs->grad = NULL;
    return distill_tap_loss(&c->tape, c->with_adaptor ? &c->ad : NULL, c->vs, c->vt, c->lambda,
                            NULL, 0);
}

static double tap_case_value(void *user) {
    TapCase *c = user;
    bool old = tape_set_grad_enabled(&c->tape, false);
    double v = tensor_f32(tap_case_loss(c))[0];
    tape_set_grad_enabled(&c->tape, old);
    return v;
}

static double tap_case_check(TapCase *c) {
    params_zero_grads(&c->params, &c->ctx);
    tape_backward(&c->tape, tap_case_loss(c));
    Tensor *dvs = test_like(c->vs);
    memcpy(dvs->data, c->vs->grad->data, tensor_bytes(dvs));
    double worst = test_gradcheck("student tap v_s", tap_case_value, c, c->vs, dvs);
    test_tensor_free(dvs);
    for (int i = 0; c->with_adaptor && i < c->params.n; i++) {
        Param *p = c->params.params[i];
        Tensor *g = test_like(&p->grad);
        memcpy(g->data, p->grad.data, tensor_bytes(g));
        worst = fmax(worst, test_gradcheck(p->name, tap_case_value, c, &p->value, g));
        test_tensor_free(g);
    }
    return worst;
}

static void test_mse_and_kl_tap_gradients_match_finite_differences(void **state) {
    TapCase c;
    tap_case_init(&c, false, 21);
    assert_true(tap_case_check(&c) < GRAD_TOL);
    tap_case_free(&c);
}

static void test_adaptor_tap_gradients_match_finite_differences(void **state) {
    TapCase c;
    tap_case_init(&c, true, 31);
    assert_true(tap_case_check(&c) < GRAD_TOL);
    tap_case_free(&c);
}

// A teacher of another width: the adaptor maps 6 -> 4 without the residual, W2 drawn at random.
static void test_width_changing_adaptor_gradients_match_finite_differences(void **state) {
    TapCase c;
    tap_case_init_out(&c, true, 4, 51);
    assert_false(c.ad.residual);
    assert_true(tap_case_check(&c) < GRAD_TOL);
    params_initialize(&c.params, &c.ctx, 3);   // the registered init: W2 random, not zero
    const float *w2 = tensor_f32(c.ad.fc2.w);
    double s = 0;
    for (size_t i = 0; i < c.ad.fc2.w->numel; i++) s += fabs(w2[i]);
    assert_true(s > 0);
    tap_case_free(&c);
}

static void test_adaptor_starts_as_the_identity(void **state) {
    TapCase c;
    tap_case_init(&c, true, 41);
    params_initialize(&c.params, &c.ctx, 3);   // the registered init: W2 = 0, b2 = 0
    Tensor *y = adaptor_forward(&c.tape, &c.ad, c.vs);
    assert_memory_equal(y->data, c.vs->data, tensor_bytes(c.vs));
    const float *w1 = tensor_f32(c.ad.fc1.w);
    double s = 0;
    for (size_t i = 0; i < c.ad.fc1.w->numel; i++) s += fabs(w1[i]);
    assert_true(s > 0);   // W1 is random, so W2's first gradient is not zero
    tap_case_free(&c);
}

// ---- taps parsing --------------------------------------------------------------------------------

static void test_taps_parse_lists_every_and_all(void **state) {
    int b[ENCODER_MAX_DEPTH];
    char err[512];
    assert_int_equal(distill_parse_taps("9,18,27", 27, b, err, sizeof err), 3);
    assert_int_equal(b[0], 8), assert_int_equal(b[1], 17), assert_int_equal(b[2], 26);
    assert_int_equal(distill_parse_taps("every 9", 27, b, err, sizeof err), 3);
    assert_int_equal(b[2], 26);
    assert_int_equal(distill_parse_taps("every=2", 5, b, err, sizeof err), 2);
    assert_int_equal(b[0], 1), assert_int_equal(b[1], 3);
    assert_int_equal(distill_parse_taps("all", 4, b, err, sizeof err), 4);
    assert_int_equal(distill_parse_taps("3 1 3", 4, b, err, sizeof err), 2);   // sorted, once
    assert_int_equal(b[0], 0), assert_int_equal(b[1], 2);
    assert_int_equal(distill_parse_taps("0,1", 4, b, err, sizeof err), -1);
    assert_contains(err, "count blocks from 1");
    assert_int_equal(distill_parse_taps("every x", 4, b, err, sizeof err), -1);
    assert_int_equal(distill_parse_taps("every 9", 4, b, err, sizeof err), -1);
    assert_int_equal(distill_parse_taps("nine", 4, b, err, sizeof err), -1);
    assert_contains(err, "every N");
}

// ---- Stage 1 and Stage 2 losses against a composition by hand --------------------------------------

// The teacher's reference taps from its plain full forward (encoder_forward), patch tokens.
static Tensor *patches(Tape *t, const Encoder *e, Tensor *x) {
    return e->prefix ? nn_slice_tokens(t, x, e->prefix, e->grid_h * e->grid_w) : x;
}

static void test_stage1_loss_matches_ops_composed_by_hand(void **state) {
    Config c = tiny_run_config(1, "hybrid");   // blocks 1 and 3 C-GSPN, 2 attention
    c.depth = 3;
    Ctx ctx = ctx_cpu();
    Config tc = tiny_teacher_config();
    tc.depth = 3;
    assert_int_equal(config_save(&tc, tmp_path("teacher.cfg")), 0);
    {
        Encoder e;
        ParamTable t;
        params_init_table(&t);
        EncoderConfig ec = encoder_config_from(&tc);
        encoder_register(&e, &ec, &t);
        params_alloc(&t, &ctx);
        params_initialize(&t, &ctx, 5);
        randomize(&t, 700, -0.5f, 0.5f);
        params_save_safetensors(&t, &ctx, tmp_path("teacher.safetensors"), NULL, 0);
        params_free(&t, &ctx);
    }
    Distiller d;
    char err[4096];
    if (distiller_init_err(&d, &c, &ctx, err, sizeof err) != 0) fail_msg("%s", err);
    assert_int_equal(d.teachers[0].n_taps, 2);
    assert_int_equal(d.teachers[0].taps[0], 0), assert_int_equal(d.teachers[0].taps[1], 2);
    randomize(&d.params, 900, -0.5f, 0.5f);
    // Only the C-GSPN layers train.
    for (int i = 0; i < d.params.n; i++) {
        const Param *p = d.params.params[i];
        assert_int_equal(p->trainable, strstr(p->name, ".gspn.") != NULL);
    }

    Arena arena;
    arena_init(&arena, &ctx, 1u << 20);
    Tape t;
    tape_init(&t, &ctx, &arena);
    Tensor *img = random_images(3, 77), *raw;
    Tensor *loss = distill_loss(&d, &t, img, NULL, &raw);
    float got = tensor_f32(loss)[0], parts[2];
    distill_parts(&d, tensor_f32(raw), parts);
    tape_backward(&t, loss);

    // By hand: the teacher's plain forward; each C-GSPN layer on norm1 of the block input.
    Arena a2;
    arena_init(&a2, &ctx, 1u << 20);
    Tape r;
    tape_init(&r, &ctx, &a2);
    tape_set_grad_enabled(&r, false);
    const Encoder *te = &d.teachers[0].teacher.enc, *se = &d.student;
    EncoderTaps tt;
    Tensor *h0 = encoder_embed(&r, te, img);
    encoder_forward(&r, te, img, &tt);
    double sum = 0;
    for (int j = 0; j < 2; j++) {
        int i = d.teachers[0].taps[j];
        Tensor *in = patches(&r, te, i == 0 ? h0 : tt.pb[i - 1]);
        Tensor *grid = nn_view(&r, in, 4, (int[]){3, 4, 4, 16});
        Tensor *fs = cgspn_layer(&r, &se->blocks[i].gspn, layernorm(&r, &se->blocks[i].norm1, grid));
        double l = tensor_f32(nn_mse(&r, fs, patches(&r, te, tt.pp[i])))[0];
        assert_close(parts[j], l, SAME_LOSS_TOL, "stage 1 block loss");
        sum += l;
    }
    assert_close(got, sum / 2, SAME_LOSS_TOL, "stage 1 loss");
    // Gradients reached the aligned layers and nothing else.
    double g_gspn = 0, g_other = 0;
    for (int i = 0; i < d.params.n; i++) {
        const Param *p = d.params.params[i];
        double s = 0;
        for (size_t k = 0; k < p->grad.numel; k++) s += fabs(tensor_f32(&p->grad)[k]);
        if (p->trainable) g_gspn += s;
        else g_other += s;
    }
    assert_true(g_gspn > 0);
    assert_true(g_other == 0);
    test_tensor_free(img);
    tape_free(&r);
    arena_free(&a2);
    tape_free(&t);
    arena_free(&arena);
    distiller_free(&d);
}

static void stage2_matches(bool adaptors, bool pp, float gamma, float summary) {
    write_teacher(28, "", NULL, false);
    Config c = tiny_run_config(2, "cgspn");
    c.adaptors = adaptors;
    c.tap_pp = pp;
    c.gamma = gamma;
    c.summary_weight = summary;
    c.alpha = 0.3f, c.beta = 0.6f, c.lambda1 = 1.5f, c.lambda2 = 2.5f;
    snprintf(c.taps, sizeof c.taps, "%s", "1,2");
    Ctx ctx = ctx_cpu();
    Distiller d;
    char err[4096];
    if (distiller_init_err(&d, &c, &ctx, err, sizeof err) != 0) fail_msg("%s", err);
    randomize(&d.params, 1200, -0.5f, 0.5f);
    int n_adaptor = 0;
    for (int i = 0; i < d.params.n; i++) n_adaptor += strncmp(d.params.params[i]->name, "adaptors.", 9) == 0;
    assert_int_equal(n_adaptor, (adaptors ? (pp ? 2 : 1) * 2 * 4 : 0) + (summary > 0 ? 4 : 0));
    // The head trains only with the CE term, the final norm with CE or the summary.
    assert_int_equal(params_find(&d.params, "head.weight")->trainable, gamma > 0);
    assert_int_equal(params_find(&d.params, "norm.weight")->trainable, gamma > 0 || summary > 0);

    Arena arena;
    arena_init(&arena, &ctx, 1u << 20);
    Tape t;
    tape_init(&t, &ctx, &arena);
    Tensor *img = random_images(3, 88), *raw;
    Tensor *targets = test_tensor(2, 3, 10);
    for (int b = 0; b < 3; b++) tensor_f32(targets)[b * 10 + (b * 3) % 10] = 1.0f;
    Tensor *loss = distill_loss(&d, &t, img, gamma > 0 ? targets : NULL, &raw);
    float got = tensor_f32(loss)[0], parts[DISTILL_MAX_PARTS];
    distill_parts(&d, tensor_f32(raw), parts);

    Arena a2;
    arena_init(&a2, &ctx, 1u << 20);
    Tape r;
    tape_init(&r, &ctx, &a2);
    tape_set_grad_enabled(&r, false);
    EncoderTaps tt, st;
    Tensor *teacher_tokens = encoder_forward(&r, &d.teachers[0].teacher.enc, img, &tt);
    Tensor *tokens = encoder_forward(&r, &d.student, img, &st);
    double lpp[2], lpb[2], sum_pp = 0, sum_pb = 0;
    for (int i = 0; i < 2; i++) {
        Tensor *vs = st.pp[i], *vt = patches(&r, &d.teachers[0].teacher.enc, tt.pp[i]);
        if (adaptors && pp) vs = adaptor_forward(&r, &d.teachers[0].ad_pp[i], vs);
        lpp[i] = tensor_f32(nn_mse(&r, vs, vt))[0] + 1.5 * tensor_f32(nn_token_kl(&r, vs, vt))[0];
        vs = st.pb[i], vt = patches(&r, &d.teachers[0].teacher.enc, tt.pb[i]);
        if (adaptors) vs = adaptor_forward(&r, &d.teachers[0].ad_pb[i], vs);
        lpb[i] = tensor_f32(nn_mse(&r, vs, vt))[0] + 2.5 * tensor_f32(nn_token_kl(&r, vs, vt))[0];
        sum_pp += lpp[i];
        sum_pb += lpb[i];
    }
    double want = (pp ? 0.3 * sum_pp / 2 : 0) + 0.6 * sum_pb / 2;
    if (gamma > 0) want += gamma * tensor_f32(nn_cross_entropy(&r, encoder_head(&r, &d.student, tokens), targets))[0];
    double l_summary = 0;   // the student's pooled vector, adapted, against the teacher's class token
    if (summary > 0) {
        Tensor *s = adaptor_forward(&r, &d.teachers[0].ad_summary, encoder_pool(&r, &d.student, tokens));
        l_summary = tensor_f32(nn_mse(&r, s, encoder_pool(&r, &d.teachers[0].teacher.enc, teacher_tokens)))[0];
        assert_true(l_summary > 1e-3);
        want += summary * l_summary;
    }
    assert_close(got, want, SAME_LOSS_TOL, "stage 2 loss");
    int k = 0;
    for (int i = 0; i < 2 && pp; i++) assert_close(parts[k++], lpp[i], SAME_LOSS_TOL, "L_PP per tap");
    for (int i = 0; i < 2; i++) assert_close(parts[k++], lpb[i], SAME_LOSS_TOL, "L_PB per tap");
    assert_string_equal(d.part_names[0], pp ? "pp_b1" : "pb_b1");
    assert_int_equal(d.n_parts, (pp ? 2 + 2 : 0) + 2 + 2 + (gamma > 0) + (summary > 0));
    if (summary > 0) {
        assert_string_equal(d.part_names[d.n_parts - 1], "summary");
        assert_close(parts[d.n_parts - 1], l_summary, SAME_LOSS_TOL, "summary part");
    }

    tape_backward(&t, loss);   // every trainable parameter on the path gets a gradient
    for (int i = 0; i < d.params.n; i++) {
        const Param *p = d.params.params[i];
        double s = 0;
        for (size_t q = 0; q < p->grad.numel; q++) s += fabs(tensor_f32(&p->grad)[q]);
        if (p->trainable && !(s > 0)) fail_msg("no gradient reached %s", p->name);
    }
    test_tensor_free(img);
    test_tensor_free(targets);
    tape_free(&r);
    arena_free(&a2);
    tape_free(&t);
    arena_free(&arena);
    distiller_free(&d);
}

static void test_stage2_loss_matches_ops_composed_by_hand(void **state) {
    stage2_matches(true, true, 0.0f, 0.0f);
}

static void test_stage2_loss_without_adaptors_pb_only_with_ce_matches(void **state) {
    stage2_matches(false, false, 0.7f, 0.0f);
}

// RADIO's summary loss beside the taps: the student's pooled vector through adaptors.summary
// against the teacher's class token; every block and the final norm then train.
static void test_stage2_summary_loss_matches_ops_composed_by_hand(void **state) {
    stage2_matches(true, true, 0.0f, 0.8f);
}

// A teacher with register tokens, pos_embed on the patch tokens only and layer scale (DINOv2-reg,
// DeiT-III): its taps are its patch tokens, its summary its class token.
static void test_stage2_with_a_register_teacher_matches_ops_composed_by_hand(void **state) {
    g_teacher_regs = 2;
    stage2_matches(true, true, 0.0f, 0.8f);
    g_teacher_regs = 0;
}

// ---- several teachers --------------------------------------------------------------------------------

// Teacher 2 of another shape: class token and 2 registers (no_embed_class, layer scale), width 12,
// depth 4, patch 4, seen at 32 px (8x8 tokens, its taps resized to the student's 4x4).
static Config second_teacher_config(void) {
    Config c = tiny_teacher_config();
    c.width = 12, c.heads = 2, c.depth = 4, c.patch = 4, c.mlp_hidden = 20;
    c.reg_tokens = 2, c.no_embed_class = 1, c.layer_scale_init = 0.5f;
    return c;
}

// t2.cfg: teacher 2's keys (its own weights, side, normalization, loss weights, summary).
static void write_second_teacher(bool phi_s) {
    write_teacher_as(second_teacher_config(), "teacher2", 32, "", NULL, false);
    FILE *f = fopen(tmp_path("t2.cfg"), "w");
    assert_non_null(f);
    fprintf(f, "teacher = %s\nteacher_config = %s\nteacher_img_size = 32\nteacher_mean = 0.2\n"
            "teacher_std = 0.5\nalpha = 0.4\nbeta = 0.9\nlambda1 = 1.0\nsummary_weight = 0.7\n"
            "adaptor_hidden = 6\nphi_s = %d\n", tmp_path("teacher2.safetensors"),
            tmp_path("teacher2.cfg"), phi_s);
    fclose(f);
}

// dst's values from src by name; src_prefix / dst_prefix: adaptors renamed between them.
static void copy_values(ParamTable *dst, const ParamTable *src, const char *src_prefix,
                        const char *dst_prefix) {
    for (int i = 0; i < dst->n; i++) {
        Param *p = dst->params[i];
        char name[PARAM_NAME_MAX];
        size_t dl = strlen(dst_prefix);
        if (strncmp(p->name, dst_prefix, dl) == 0)
            snprintf(name, sizeof name, "%s%s", src_prefix, p->name + dl);
        else
            snprintf(name, sizeof name, "%s", p->name);
        const Param *q = params_find(src, name);
        if (!q) fail_msg("%s (as %s) is not in the source table", p->name, name);
        assert_int_equal(q->value.numel, p->value.numel);
        memcpy(p->value.data, q->value.data, tensor_bytes(&p->value));
    }
}

typedef struct OneLoss {
    float loss, parts[DISTILL_MAX_PARTS];
} OneLoss;

// d's loss on the batch b (the student at 28 px, each teacher its view), its parts.
static OneLoss loss_on(Distiller *d, const Config *c, const Batch *b) {
    const float mean[1] = {0.3f}, std[1] = {0.8f};   // the student's normalization
    distill_set_normalization(d, mean, std);
    Arena arena;
    arena_init(&arena, d->ctx, 1u << 22);
    Tape t;
    tape_init(&t, d->ctx, &arena);
    ResolutionViews v;
    char err[512];
    if (resolution_views_init_err(&v, c, err, sizeof err) != 0) fail_msg("%s", err);
    Tensor *x, *views[DISTILL_MAX_TEACHERS], *raw;
    distill_views(d, &v, &t, b, 28, &x, views);
    OneLoss r;
    r.loss = tensor_f32(distill_loss_views(d, &t, x, views, NULL, &raw))[0];
    distill_parts(d, tensor_f32(raw), r.parts);
    resolution_views_free(&v);
    tape_free(&t);
    arena_free(&arena);
    return r;
}

// Two teachers of different shape: the loss is teacher 1's alone plus teacher 2's alone (same
// student and adaptor values), the parts are theirs side by side, teacher 2's taps pair with its
// proportional blocks, its view is the image resized and renormalized, and every trainable
// parameter gets a gradient.
static void test_two_teachers_loss_is_the_sum_of_each_teachers_alone(void **state) {
    write_teacher(28, "", NULL, false);
    write_second_teacher(false);
    Config c = tiny_run_config(2, "cgspn");
    snprintf(c.taps, sizeof c.taps, "1,2");
    c.summary_weight = 0.8f;
    Config c1 = c, c2 = c;
    snprintf(c.extra_teachers, sizeof c.extra_teachers, "%s", tmp_path("t2.cfg"));
    config_load_file(&c2, tmp_path("t2.cfg"));   // teacher 2 as the only teacher
    Ctx ctx = ctx_cpu();
    Distiller d, d1, d2;
    char err[4096];
    if (distiller_init_err(&d, &c, &ctx, err, sizeof err) != 0) fail_msg("%s", err);
    if (distiller_init_err(&d1, &c1, &ctx, err, sizeof err) != 0) fail_msg("%s", err);
    if (distiller_init_err(&d2, &c2, &ctx, err, sizeof err) != 0) fail_msg("%s", err);
    assert_int_equal(d.n_teachers, 2);
    const DistillTeacher *t2 = &d.teachers[1];
    assert_int_equal(t2->teacher_blocks[0], 1);   // student block 1 of 2 -> teacher block 2 of 4
    assert_int_equal(t2->teacher_blocks[1], 3);
    assert_int_equal(t2->side, 32);
    assert_false(t2->ad_pp[0].residual);   // 16 -> 12
    assert_non_null(params_find(&d.params, "adaptors.t2.0.pp.fc2.weight"));
    assert_int_equal(params_find(&d.params, "adaptors.t2.summary.fc2.bias")->value.numel, 12);
    randomize(&d.params, 1700, -0.5f, 0.5f);
    copy_values(&d1.params, &d.params, "", "");
    copy_values(&d2.params, &d.params, "adaptors.t2.", "adaptors.");

    float *host = cg_malloc(3 * 28 * 28 * sizeof(float));
    Tensor *img = random_images(3, 91);
    memcpy(host, img->data, 3 * 28 * 28 * sizeof(float));
    Batch b = {.images = host, .count = 3, .channels = 1, .height = 28, .width = 28};
    OneLoss both = loss_on(&d, &c, &b), one = loss_on(&d1, &c1, &b), two = loss_on(&d2, &c2, &b);
    assert_close(both.loss, one.loss + two.loss, SAME_LOSS_TOL, "two teachers = the sum");
    assert_int_equal(d.n_parts, d1.n_parts + d2.n_parts);
    for (int k = 0; k < d1.n_parts; k++) {
        assert_string_equal(d.part_names[k], d1.part_names[k]);
        assert_close(both.parts[k], one.parts[k], SAME_LOSS_TOL, d1.part_names[k]);
    }
    for (int k = 0; k < d2.n_parts; k++) {
        char want[DISTILL_PART_NAME + 4];
        snprintf(want, sizeof want, "t2.%s", d2.part_names[k]);
        assert_string_equal(d.part_names[d1.n_parts + k], want);
        assert_close(both.parts[d1.n_parts + k], two.parts[k], SAME_LOSS_TOL, want);
    }
    assert_string_equal(d.part_names[d.n_parts - 1], "t2.summary");

    // Teacher 2's view: the image resized to 32 px, then (x * 0.8 + 0.3 - 0.2) / 0.5.
    Arena arena;
    arena_init(&arena, &ctx, 1u << 22);
    Tape t;
    tape_init(&t, &ctx, &arena);
    ResolutionViews v;
    if (resolution_views_init_err(&v, &c, err, sizeof err) != 0) fail_msg("%s", err);
    Tensor *x, *views[DISTILL_MAX_TEACHERS], *raw;
    distill_views(&d, &v, &t, &b, 28, &x, views);
    float *want = cg_malloc(3 * 32 * 32 * sizeof(float));
    resolution_resize_batch(&v, host, 3, 1, 28, 28, want, 32, 32);
    double worst = 0;
    for (int i = 0; i < 3 * 32 * 32; i++)
        worst = fmax(worst, fabs(tensor_f32(views[1])[i] - (want[i] * 0.8 + 0.1) / 0.5));
    assert_true(worst < 1e-5);
    assert_ptr_equal(views[0], x);   // teacher 1 sees the loader's tensor itself
    Tensor *loss = distill_loss_views(&d, &t, x, views, NULL, &raw);
    tape_backward(&t, loss);
    for (int i = 0; i < d.params.n; i++) {
        const Param *p = d.params.params[i];
        double sum = 0;
        for (size_t q = 0; q < p->grad.numel; q++) sum += fabs(tensor_f32(&p->grad)[q]);
        if (p->trainable && !(sum > 0)) fail_msg("no gradient reached %s", p->name);
    }
    free(want);
    resolution_views_free(&v);
    tape_free(&t);
    arena_free(&arena);
    free(host);
    test_tensor_free(img);
    distiller_free(&d);
    distiller_free(&d1);
    distiller_free(&d2);
}

// What a teacher file or a multi-teacher run may not do, each refused with a message naming it.
static void test_teacher_files_refuse_run_keys_and_bad_pairings(void **state) {
    write_teacher(28, "", NULL, false);
    write_second_teacher(false);
    Ctx ctx = ctx_cpu();
    char err[4096];
    struct { const char *file_text; const char *want; int stage; } cases[] = {
        {"img_size = 32\n", "sets img_size, a key of the run", 2},
        {"alpha = 0.1\n", "does not set teacher", 2},
        {"", "stage 1 aligns the student with one teacher", 1},
        {"adaptors = 0\n", "adaptors = 0 with a teacher of width 12", 2},
        {"teacher_taps = 4\n", "names 1 teacher blocks for 2 taps", 2},
        {"teacher_taps = 2,5\n", "block 5 is not in 1..4", 2},
        {"teacher_mean = 0.1,0.2\nteacher_std = 0.5,0.5\n", "one per input channel (1)", 2},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        FILE *f = fopen(tmp_path("bad.cfg"), "w");
        assert_non_null(f);
        bool sets_teacher = strstr(cases[i].want, "does not set teacher") == NULL;
        if (sets_teacher)
            fprintf(f, "include = t2.cfg\n");
        fprintf(f, "%s", cases[i].file_text);
        fclose(f);
        Config c = tiny_run_config(cases[i].stage, "cgspn");
        snprintf(c.taps, sizeof c.taps, "1,2");
        snprintf(c.extra_teachers, sizeof c.extra_teachers, "%s", tmp_path("bad.cfg"));
        Distiller d;
        if (distiller_init_err(&d, &c, &ctx, err, sizeof err) == 0) {
            distiller_free(&d);
            fail_msg("case %zu (%s) was accepted", i, cases[i].want);
        }
        if (!strstr(err, cases[i].want)) fail_msg("case %zu: '%s' not in: %s", i, cases[i].want, err);
        if (cases[i].stage == 2 && !strstr(err, "teacher 2 (") && !strstr(err, "extra_teachers"))
            fail_msg("case %zu does not name the teacher: %s", i, err);
    }
}

// A gspn_hier student (stages of changing width and grid) is refused with a message, before
// anything runs.
static void test_gspn_hier_student_is_refused(void **state) {
    write_teacher(28, "", NULL, false);
    Ctx ctx = ctx_cpu();
    char err[4096];
    Config c = tiny_run_config(2, "gspn_hier");
    snprintf(c.depths, sizeof c.depths, "1,1,1,1");
    c.width = 8;
    c.gspn_latent = 2;
    c.gspn_out_norm = 0;
    Distiller d;
    if (distiller_init_err(&d, &c, &ctx, err, sizeof err) == 0) {
        distiller_free(&d);
        fail_msg("a gspn_hier student was accepted");
    }
    assert_contains(err, "gspn_hier");
    assert_contains(err, "set model = cgspn or hybrid");
}

// A SigLIP-style teacher: no class token, its summary the MAP head's output (forward only).
static void test_stage2_summary_from_a_map_head_teacher_matches_ops_composed_by_hand(void **state) {
    g_teacher_map = 1;
    stage2_matches(true, true, 0.0f, 0.8f);
    g_teacher_map = 0;
}

// ---- student from teacher, teacher loading ------------------------------------------------------------

static void test_student_copies_teacher_where_shapes_match_and_reports_it(void **state) {
    write_teacher(28, "", NULL, false);
    Config c = tiny_run_config(2, "hybrid");   // block 2 attends: its attention is copied
    Ctx ctx = ctx_cpu();
    Distiller d;
    distiller_init(&d, &c, &ctx);
    CopyReport r;
    student_copy_from_teacher(&d.params, &d.teachers[0].teacher.params, &ctx, ADAPTOR_PREFIX, &r);
    int attn = 0;
    for (int i = 0; i < r.n_copied; i++) {
        const Param *s = params_find(&d.params, r.copied[i]), *t = params_find(&d.teachers[0].teacher.params, r.copied[i]);
        assert_non_null(s);
        assert_memory_equal(s->value.data, t->value.data, tensor_bytes(&s->value));
        assert_null(strstr(r.copied[i], "gspn"));
        attn += strncmp(r.copied[i], "blocks.1.attn.", 14) == 0;
    }
    assert_int_equal(attn, 4);   // qkv and proj, weight and bias
    assert_non_null(params_find(&d.params, "blocks.0.mlp.fc1.weight"));
    // patch embed 2, per block norm1 2 + norm2 2 + mlp 4 (+ attention 4 in block 2), norm 2, head 2
    assert_int_equal(r.n_copied, 2 + 2 * 8 + 4 + 2 + 2);
    for (int i = 0; i < r.n_kept; i++) {
        assert_non_null(strstr(r.kept[i], "blocks.0.gspn."));
        assert_non_null(strstr(r.kept[i], "(not in the teacher)"));
    }
    assert_int_equal(r.n_kept, 2 + 2 + 1 + 2 + 2);   // down, gate, merge, norm, up
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    copy_report_print(&r, f);
    fclose(f);
    assert_contains(text, "copied 26 tensors");
    assert_contains(text, "blocks.*.mlp.fc1.weight");
    assert_contains(text, "blocks.*.gspn.down.weight (not in the teacher)");
    free(text);
    copy_report_free(&r);
    distiller_free(&d);
}

static void test_teacher_pos_embed_is_resampled_to_the_run_grid(void **state) {
    write_teacher(14, "visual.trunk.", NULL, false);   // a 2x2 grid file, OpenCLIP-style prefix
    Config c = tiny_run_config(2, "cgspn");
    snprintf(c.teacher_prefix, sizeof c.teacher_prefix, "visual.trunk.");
    Ctx ctx = ctx_cpu();
    Teacher T;
    char err[4096];
    if (teacher_load_err(&T, &c, &ctx, err, sizeof err) != 0) fail_msg("%s", err);
    assert_int_equal(T.report.pos_from_h, 2);
    assert_int_equal(T.report.pos_grid_h, 4);
    StFile f;
    st_open(&f, tmp_path("teacher.safetensors"));
    const StTensor *pe = st_find(&f, "visual.trunk.pos_embed");
    float src[5 * 16], want[17 * 16];
    assert_int_equal(st_read_f32_err(&f, pe, src, err, sizeof err), 0);
    memcpy(want, src, 16 * sizeof(float));   // the class token's row as it is
    resample_bicubic_aa(src + 16, 2, 2, want + 16, 4, 4, 16);
    assert_memory_equal(T.enc.pos_embed->data, want, sizeof want);
    st_close(&f);
    char *text = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&text, &len);
    teacher_describe(&T, m);
    fclose(m);
    assert_contains(text, "pos_embed resampled from 2x2 to 4x4");
    free(text);
    teacher_free(&T, &ctx);
}

static void test_teacher_missing_or_misshaped_tensor_fails_with_a_clear_message(void **state) {
    Config c = tiny_run_config(2, "cgspn");
    Ctx ctx = ctx_cpu();
    Teacher T;
    char err[4096];
    write_teacher(28, "", "blocks.1.attn.proj.weight", false);
    assert_int_equal(teacher_load_err(&T, &c, &ctx, err, sizeof err), -1);
    assert_contains(err, "teacher: ");
    assert_contains(err, "blocks.1.attn.proj.weight");
    assert_contains(err, "teacher.cfg");
    write_teacher(28, "", NULL, true);
    assert_int_equal(teacher_load_err(&T, &c, &ctx, err, sizeof err), -1);
    assert_contains(err, "blocks.1.mlp.fc1.weight has shape (12, 16), the config expects (24, 16)");
    write_teacher(28, "visual.trunk.", NULL, false);   // the prefix not set
    assert_int_equal(teacher_load_err(&T, &c, &ctx, err, sizeof err), -1);
    assert_contains(err, "teacher_prefix");
    c.teacher_config[0] = 0;   // a weights file needs its config
    assert_int_equal(teacher_load_err(&T, &c, &ctx, err, sizeof err), -1);
    assert_contains(err, "set teacher_config");
}

// ---- runs: resume, export --------------------------------------------------------------------------

// A run on the fixture's shards (train_fixture.h: 28x28 synthetic images, no augmentation).
static Config run_config(int stage, const char *run, long total) {
    Config c = tiny_run_config(stage, "cgspn");
    snprintf(c.data_shards, sizeof c.data_shards, "%s/shards", g_dir);
    c.eval_crop_pct = 1.0f;
    c.rrc_scale_min = 1.0f;
    c.rrc_ratio_min = c.rrc_ratio_max = 1.0f;
    c.hflip = 0.0f;
    c.loader_threads = 2;
    c.batch_size = 8;
    c.max_steps = (int)total;
    c.warmup_steps = 2;
    c.lr = 3e-3f;
    c.log_every = 3;   // the log window spans the resume
    c.ckpt_every = 4;
    c.keep_last = 0;
    c.gamma = stage == 2 ? 0.5f : 0.0f;
    c.drop_path = stage == 2 ? 0.2f : 0.0f;   // the student's stochastic depth resumes exactly too
    snprintf(c.run_name, sizeof c.run_name, "%s", run);
    return c;
}

// two_teachers: Stage 2 from the run's teacher and teacher 2 (t2.cfg), both PHI-S standardized
// (the statistics of the first run are checkpointed and used again after the resume).
static void resume_is_bit_exact(int stage, bool two_teachers) {
    enum { N = 4, TOTAL = 2 * N };   // 40 images / batch 8 = 5 steps per epoch: crosses an epoch
    write_teacher(28, "", NULL, false);
    if (two_teachers) write_second_teacher(true);
    fixture_build_shards(g_dir, 40, 16);
    float full[TOTAL], split[TOTAL];
    memset(split, 0xff, sizeof split);
    char sa[32], sb[32];
    snprintf(sa, sizeof sa, "full%d%s", stage, two_teachers ? "t" : "");
    snprintf(sb, sizeof sb, "split%d%s", stage, two_teachers ? "t" : "");
    Config a = run_config(stage, sa, TOTAL);
    if (two_teachers) {
        snprintf(a.extra_teachers, sizeof a.extra_teachers, "%s", tmp_path("t2.cfg"));
        a.phi_s = 1;
        a.phi_s_batches = 2;
    }
    DistillOptions oa = {.step_losses = full};
    assert_int_equal(distill_train(&a, &oa).step, TOTAL);
    Config b = a;
    snprintf(b.run_name, sizeof b.run_name, "%s", sb);
    DistillOptions ob = {.stop_after = N, .step_losses = split};
    assert_int_equal(distill_train(&b, &ob).step, N);
    snprintf(b.resume, sizeof b.resume, "auto");
    DistillOptions oc = {.step_losses = split};
    assert_int_equal(distill_train(&b, &oc).step, TOTAL);
    for (int i = 0; i < TOTAL; i++)
        if (memcmp(&full[i], &split[i], sizeof(float)) != 0)
            fail_msg("stage %d step %d: loss %.9g vs %.9g", stage, i + 1, full[i], split[i]);
    // The logs (every part's window mean) and the final weights and state: the same bytes.
    char x[600], y[600];
    snprintf(x, sizeof x, "%s/%s/metrics.jsonl", g_dir, sa);
    snprintf(y, sizeof y, "%s/%s/metrics.jsonl", g_dir, sb);
    size_t nx, ny;
    char *tx = (char *)test_read_bytes(x, &nx), *ty = (char *)test_read_bytes(y, &ny);
    int lines = 0;
    for (char *p = tx, *q = ty; p < tx + nx && q < ty + ny; lines++) {
        char *pe = memchr(p, '\n', (size_t)(tx + nx - p)), *qe = memchr(q, '\n', (size_t)(ty + ny - q));
        assert_non_null(pe), assert_non_null(qe);
        // Drop "time" (wall clock) and the timing keys; compare the rest.
        char *pl = strndup(p, (size_t)(pe - p)), *ql = strndup(q, (size_t)(qe - q));
        const char *keys[] = {"\"loss\"", stage == 1 ? "\"loss_mse_b1\"" : "\"loss_pp_b1\"",
                              stage == 1 ? "\"loss_mse_b2\"" : "\"loss_kl_pb\"", "\"test_top1\""};
        for (int k = 0; k < 4; k++) {
            char *u = strstr(pl, keys[k]), *v = strstr(ql, keys[k]);
            assert_true((u == NULL) == (v == NULL));
            if (u) assert_memory_equal(u, v, strcspn(u, ",}"));
        }
        free(pl), free(ql);
        p = pe + 1, q = qe + 1;
    }
    assert_true(lines >= 4);
    free(tx), free(ty);
    const char *files[] = {"model.safetensors", "state.safetensors"};
    for (int i = 0; i < 2; i++) {
        snprintf(x, sizeof x, "%s/%s/step_%08d/%s", g_dir, sa, TOTAL, files[i]);
        snprintf(y, sizeof y, "%s/%s/step_%08d/%s", g_dir, sb, TOTAL, files[i]);
        assert_files_equal(x, y);
    }
}

static void test_stage1_run_resumes_bit_exactly(void **state) { resume_is_bit_exact(1, false); }
static void test_stage2_run_resumes_bit_exactly(void **state) { resume_is_bit_exact(2, false); }
static void test_stage2_two_teachers_phi_s_run_resumes_bit_exactly(void **state) {
    resume_is_bit_exact(2, true);
}

static void test_stage2_init_from_stage1_and_export_drops_adaptors(void **state) {
    write_teacher(28, "", NULL, false);
    fixture_build_shards(g_dir, 24, 8);
    Config s1 = run_config(1, "s1", 3);
    distill_train(&s1, NULL);
    Config s2 = run_config(2, "s2", 3);
    snprintf(s2.init, sizeof s2.init, "%s/s1", g_dir);   // a run folder: its newest checkpoint
    Ctx ctx = ctx_cpu();
    Distiller d;
    distiller_init(&d, &s2, &ctx);
    distiller_init_student(&d, &s2, NULL);
    StFile f1;
    st_open(&f1, tmp_path("s1/step_00000003/model.safetensors"));
    for (int i = 0; i < d.params.n; i++) {   // the student from Stage 1, the adaptors fresh
        const Param *p = d.params.params[i];
        const StTensor *t = st_find(&f1, p->name);
        if (strncmp(p->name, "adaptors.", 9) == 0) {
            assert_null(t);
            if (strstr(p->name, "fc2")) {
                for (size_t k = 0; k < p->value.numel; k++) assert_true(tensor_f32(&p->value)[k] == 0);
            }
        } else {
            assert_non_null(t);
            assert_memory_equal(st_data(&f1, t), p->value.data, tensor_bytes(&p->value));
        }
    }
    st_close(&f1);
    distiller_free(&d);

    distill_train(&s2, NULL);
    char err[2048];
    int kept, dropped;
    assert_int_equal(export_student_err(tmp_path("s2"), tmp_path("student.safetensors"), false, &kept,
                                        &dropped, err, sizeof err), 0);
    StFile ck, out;
    st_open(&ck, tmp_path("s2/step_00000003/model.safetensors"));
    st_open(&out, tmp_path("student.safetensors"));
    assert_int_equal(dropped, 2 * 2 * 4);   // 2 taps x (PP, PB) x (fc1, fc2) x (weight, bias)
    assert_int_equal(kept, ck.n - dropped);
    assert_int_equal(out.n, kept);
    for (int i = 0; i < ck.n; i++) {
        const StTensor *t = &ck.tensors[i], *o = st_find(&out, t->name);
        if (strncmp(t->name, "adaptors.", 9) == 0) {
            assert_null(o);
            continue;
        }
        assert_non_null(o);
        assert_int_equal(o->dtype, t->dtype);
        assert_int_equal(o->numel, t->numel);
        assert_memory_equal(st_data(&out, o), st_data(&ck, t), t->end - t->begin);
    }
    // The exported student loads as the student model, strictly.
    Config sc = s2;
    EncoderConfig ec = encoder_config_from(&sc);
    Encoder e;
    ParamTable t;
    params_init_table(&t);
    encoder_register(&e, &ec, &t);
    params_alloc(&t, &ctx);
    LoadReport r = {0};
    assert_int_equal(params_load_safetensors_err(&t, &ctx, tmp_path("student.safetensors"), NULL, &r,
                                                 err, sizeof err), 0);
    assert_int_equal(r.n_extra, 0);
    load_report_free(&r);
    params_free(&t, &ctx);
    st_close(&ck);
    st_close(&out);
}

// PHI-S: after the statistics of 2 batches, the same batches' teacher features, standardized,
// have mean 0 in every channel and mean square 1 per channel (trace(cov) / C = 1); the
// statistics are not trained.
static void test_phi_s_standardizes_the_gathered_features(void **state) {
    write_teacher(28, "", NULL, false);
    write_second_teacher(true);
    fixture_build_shards(g_dir, 40, 16);
    Config c = run_config(2, "phis", 4);
    snprintf(c.extra_teachers, sizeof c.extra_teachers, "%s", tmp_path("t2.cfg"));
    Ctx ctx = ctx_cpu();
    Distiller d;
    distiller_init(&d, &c, &ctx);
    DataParallel dp;
    dp_open(&dp, NULL, &d.params, &ctx, &c);
    Loader *l = dp_loader_open(&dp, &c, 1, c.batch_size, false);
    float mean[3], std[3];
    loader_norm(l, mean, std);
    distill_set_normalization(&d, mean, std);
    ResolutionViews v;
    char err[512];
    if (resolution_views_init_err(&v, &c, err, sizeof err) != 0) fail_msg("%s", err);
    distill_phi_s_gather(&d, l, &v, &dp, 2, stdout);
    loader_close(l);
    const DistillTeacher *t2 = &d.teachers[1];
    assert_false(d.teachers[0].phi_s);
    assert_true(t2->phi_s);
    assert_false(params_find(&d.params, "adaptors.t2.1.pb.phi_s.scale")->trainable);

    l = dp_loader_open(&dp, &c, 1, c.batch_size, false);   // the same 2 batches again
    Arena arena;
    arena_init(&arena, &ctx, 1u << 22);
    Tape t;
    tape_init(&t, &ctx, &arena);
    const PhiS *ps[] = {&t2->phi_pp[1], &t2->phi_pb[1], &t2->phi_summary};
    int C = 12;
    double sum[3][12] = {{0}}, sq[3] = {0}, rows[3] = {0};
    for (int i = 0; i < 2; i++) {
        const Batch *b = loader_next(l, err, sizeof err);
        assert_non_null(b);
        tape_reset(&t);
        Tensor *x, *views[DISTILL_MAX_TEACHERS];
        distill_views(&d, &v, &t, b, 28, &x, views);
        TeacherTaps tt;
        distill_teacher_targets(&d.teachers[1], &t, views[1], &d.student, &tt);
        Tensor *feats[] = {tt.pp[t2->teacher_blocks[1]], tt.pb[t2->teacher_blocks[1]], tt.summary};
        for (int f = 0; f < 3; f++) {
            const float *y = tensor_f32(feats[f]), *shift = tensor_f32(ps[f]->shift),
                        *scale = tensor_f32(ps[f]->scale);
            size_t n = feats[f]->numel / C;
            for (size_t r = 0; r < n; r++)
                for (int k = 0; k < C; k++) {
                    double z = (y[r * C + k] + shift[k]) * scale[k];
                    sum[f][k] += z;
                    sq[f] += z * z;
                }
            rows[f] += n;
        }
    }
    for (int f = 0; f < 3; f++) {
        for (int k = 0; k < C; k++) assert_true(fabs(sum[f][k] / rows[f]) < 1e-4);
        assert_close(sq[f] / rows[f] / C, 1.0, 1e-4, "PHI-S mean square per channel");
    }
    loader_close(l);
    tape_free(&t);
    arena_free(&arena);
    resolution_views_free(&v);
    dp_close(&dp);
    distiller_free(&d);
}

// ---- the shared loop (train/loop.h) under distill: non-finite steps, time-based checkpoints,
// SIGTERM ----------------------------------------------------------------------------------------

static void test_nonfinite_step_in_distill_is_skipped_or_stops_as_configured(void **state) {
    write_teacher(28, "", NULL, false);
    fixture_build_shards(g_dir, 40, 16);
    Config a = run_config(2, "nan_skip", 6);
    snprintf(a.on_nonfinite, sizeof a.on_nonfinite, "skip");
    DistillOptions o = {.nonfinite_at = 3};
    TrainResult r = distill_train(&a, &o);
    assert_int_equal(r.status, TRAIN_DONE);
    assert_int_equal(r.step, 6);
    assert_int_equal(r.skipped, 1);
    char path[600];
    snprintf(path, sizeof path, "%s/nan_skip/metrics.jsonl", g_dir);
    char *m = test_read_text(path);
    assert_contains(m, "{\"step\": 3, ");
    assert_contains(m, "\"nonfinite_skipped\": 1}");
    free(m);
    // Stopped after step 4 (a checkpoint) and resumed: the update skipped before the checkpoint
    // is still counted, so one skipped after the resume (step 5) is the second, as in a run
    // never stopped.
    Config a2 = run_config(2, "nan_skip_resumed", 6);
    snprintf(a2.on_nonfinite, sizeof a2.on_nonfinite, "skip");
    DistillOptions o2 = {.nonfinite_at = 3, .stop_after = 4};
    r = distill_train(&a2, &o2);
    assert_int_equal(r.status, TRAIN_STOPPED);
    assert_int_equal(r.skipped, 1);
    snprintf(a2.resume, sizeof a2.resume, "auto");
    o2 = (DistillOptions){.nonfinite_at = 5};
    r = distill_train(&a2, &o2);
    assert_int_equal(r.status, TRAIN_DONE);
    assert_int_equal(r.step, 6);
    assert_int_equal(r.skipped, 2);
    snprintf(path, sizeof path, "%s/nan_skip_resumed/metrics.jsonl", g_dir);
    m = test_read_text(path);
    assert_contains(m, "\"nonfinite_skipped\": 1}");
    assert_contains(m, "\"nonfinite_skipped\": 2}");   // step 5's, counting step 3's
    free(m);
    Config b = run_config(2, "nan_stop", 6);   // on_nonfinite = stop, the default
    r = distill_train(&b, &o);
    assert_int_equal(r.status, TRAIN_NONFINITE);
    assert_int_equal(r.nonfinite_step, 3);
    assert_int_equal(r.step, 2);
    snprintf(path, sizeof path, "%s/nan_stop", g_dir);
    long steps[4];
    assert_int_equal(ckpt_list(path, steps, 4), 0);   // ckpt_every 4: nothing; nothing of step 3
}

// A student head of another width than the shards' 10 classes, narrower or wider, is refused
// before the run starts, naming num_classes. The real binary: a refusal exits.
static void test_num_classes_other_than_the_shards_is_refused_by_distill(void **state) {
    if (access("./cgspn", X_OK) != 0) fail_msg("./cgspn is not built (make test builds it first)");
    write_teacher(28, "", NULL, false);
    fixture_build_shards(g_dir, 40, 16);
    Config c = run_config(2, "nc_refused", 2);
    assert_int_equal(c.num_classes, 10);
    char cfg[600], cmd[700], log[600];
    snprintf(cfg, sizeof cfg, "%s/nc.cfg", g_dir);
    assert_int_equal(config_save(&c, cfg), 0);
    fixture_expect_num_classes_refused(g_dir, "distill", cfg, "train");
    snprintf(cmd, sizeof cmd, "./cgspn distill %s", cfg);   // the shards' count: the run goes on
    snprintf(log, sizeof log, "%s/nc_ok.log", g_dir);
    if (test_run_logged(cmd, log) != 0) fail_msg("%s failed:\n%s", cmd, test_read_text(log));
}

static void test_ckpt_minutes_writes_checkpoints_by_wall_time(void **state) {
    write_teacher(28, "", NULL, false);
    fixture_build_shards(g_dir, 40, 16);
    Config a = run_config(1, "by_time", 5);
    a.ckpt_every = 0;
    // 60 us: due at the start of any step that began that long after the last checkpoint (or the
    // start), which a step of this model takes; so every second step at least.
    a.ckpt_minutes = 1e-6f;
    assert_int_equal(distill_train(&a, NULL).step, 5);
    char path[600];
    snprintf(path, sizeof path, "%s/by_time", g_dir);
    long steps[8];
    int n = ckpt_list(path, steps, 8);
    printf("    ckpt_minutes = 1e-6: %d checkpoints in 5 steps\n", n);
    assert_true(n >= 3);   // steps 2, 4 and the end at least
    assert_int_equal(steps[n - 1], 5);
    Config b = run_config(1, "by_end", 5);
    b.ckpt_every = 0;
    b.ckpt_minutes = 0;   // off: the end only
    assert_int_equal(distill_train(&b, NULL).step, 5);
    snprintf(path, sizeof path, "%s/by_end", g_dir);
    assert_int_equal(ckpt_list(path, steps, 8), 1);
    assert_int_equal(steps[0], 5);
}

// The real binary, forked: SIGTERM during a Stage 2 run finishes the step, writes a checkpoint
// and exits 0; the checkpoint holds the same bytes as a run told to stop after that step.
static void test_sigterm_to_distill_writes_a_checkpoint_exits_0_and_matches_a_clean_stop(void **state) {
    write_teacher(28, "", NULL, false);
    fixture_build_shards(g_dir, 40, 16);
    enum { TOTAL = 1000000 };
    Config c = run_config(2, "term", TOTAL);
    c.log_every = 1;
    c.ckpt_every = 0;
    const char *cfg = tmp_path("term.cfg"), *log = tmp_path("term.log");
    assert_int_equal(config_save(&c, cfg), 0);
    char metrics[600];
    snprintf(metrics, sizeof metrics, "%s/term/metrics.jsonl", g_dir);
    int status;
    char *out = test_sigterm_cgspn("distill", cfg, log, metrics, &status);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail_msg("cgspn distill did not exit 0 after SIGTERM (status %d):\n%s", status, out);
    assert_contains(out, "interrupted by SIGTERM after step ");
    char run[600];
    snprintf(run, sizeof run, "%s/term", g_dir);
    long steps[4];
    assert_int_equal(ckpt_list(run, steps, 4), 1);
    long at = steps[0];
    printf("    SIGTERM: checkpoint at step %ld, exit status 0\n", at);
    assert_true(at >= 3 && at < TOTAL);
    free(out);
    Config ref = c;
    snprintf(ref.run_name, sizeof ref.run_name, "term_ref");
    DistillOptions o = {.stop_after = at};
    assert_int_equal(distill_train(&ref, &o).step, at);
    const char *files[] = {"model.safetensors", "state.safetensors"};
    for (int i = 0; i < 2; i++) {
        char x[700], y[700];
        snprintf(x, sizeof x, "%s/term/step_%08ld/%s", g_dir, at, files[i]);
        snprintf(y, sizeof y, "%s/term_ref/step_%08ld/%s", g_dir, at, files[i]);
        assert_files_equal(x, y);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mse_and_kl_tap_gradients_match_finite_differences),
        cmocka_unit_test(test_adaptor_tap_gradients_match_finite_differences),
        cmocka_unit_test(test_width_changing_adaptor_gradients_match_finite_differences),
        cmocka_unit_test(test_adaptor_starts_as_the_identity),
        cmocka_unit_test(test_taps_parse_lists_every_and_all),
        cmocka_unit_test_setup_teardown(test_stage1_loss_matches_ops_composed_by_hand, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_stage2_loss_matches_ops_composed_by_hand, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_stage2_loss_without_adaptors_pb_only_with_ce_matches, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_stage2_summary_loss_matches_ops_composed_by_hand, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_stage2_with_a_register_teacher_matches_ops_composed_by_hand, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_stage2_summary_from_a_map_head_teacher_matches_ops_composed_by_hand, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_two_teachers_loss_is_the_sum_of_each_teachers_alone, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_teacher_files_refuse_run_keys_and_bad_pairings, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_gspn_hier_student_is_refused, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_student_copies_teacher_where_shapes_match_and_reports_it, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_teacher_pos_embed_is_resampled_to_the_run_grid, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_teacher_missing_or_misshaped_tensor_fails_with_a_clear_message, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_stage1_run_resumes_bit_exactly, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_stage2_run_resumes_bit_exactly, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_stage2_two_teachers_phi_s_run_resumes_bit_exactly, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_phi_s_standardizes_the_gathered_features, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_stage2_init_from_stage1_and_export_drops_adaptors, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_nonfinite_step_in_distill_is_skipped_or_stops_as_configured, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_num_classes_other_than_the_shards_is_refused_by_distill, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_ckpt_minutes_writes_checkpoints_by_wall_time, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_sigterm_to_distill_writes_a_checkpoint_exits_0_and_matches_a_clean_stop, setup_dir, teardown_dir),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
