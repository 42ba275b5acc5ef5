// Resolution curriculum (train/curriculum.h, train/resolution.h, teacher_taps_resize): the
// antialiased image resize against PyTorch's values by hand; the Stage 2 loss with a
// lower-resolution teacher (grids that are not integer multiples, non-square images) against
// the same loss composed from the tested ops; the stage plan and its errors; a two-stage tiny
// curriculum end to end that resumes bit-exactly after an interruption inside stage 2 without
// re-running stage 1; a multires run. (The bilinear op itself: tests/test_ops_misc.c against
// finite differences, tests/gpu/test_ops_gpu.c CUDA against the CPU.)
#include "testlib.h"
#include "train_fixture.h"
#include "../train/classify.h"
#include "../train/curriculum.h"
#include "../train/distill.h"
#include "../train/model_config.h"
#include "../data/resize.h"

// The same ops in the same order; only the order of a few fp32 sums may differ.
#define SAME_LOSS_TOL 1e-5
// resize_f32 against values worked out by hand in double: fp32 rounding of 3-7 term sums.
#define RESIZE_TOL 1e-6

static char g_dir[256];
static int setup_dir(void **state) { return test_make_temp_dir(g_dir, sizeof g_dir, "curriculum"); }
static int teardown_dir(void **state) { return test_remove_dir(g_dir); }

static void assert_close(double a, double b, double tol, const char *what) {
    double rel = fabs(a - b) / fmax(fabs(b), 1e-12);
    if (rel > tol) fail_msg("%s: %.9g vs reference %.9g (rel %.2e)", what, a, b, rel);
}

// ---- the teacher's image: antialiased resize -------------------------------------------------------

// PyTorch: F.interpolate(x, size, mode='bilinear', align_corners=False, antialias=True).
static void test_resize_f32_matches_pytorch_antialias_values_by_hand(void **state) {
    ResizeScratch s = {0};
    // 1x4 -> 1x2 (scale 2): the triangle filter is stretched to support 2; output 0 is centred
    // at 1.0 and reads x = 0, 1, 2 with weights 0.75, 0.75, 0.25 (normalized: 3/7, 3/7, 1/7),
    // output 1 at 3.0 reads 1, 2, 3 with 1/7, 3/7, 3/7 (the 4th tap is outside):
    // (0, 1, 2, 3) -> (5/7, 16/7). PyTorch prints 0.7143, 2.2857.
    const float in[] = {0, 1, 2, 3};
    float out[2];
    resize_f32(in, 1, 4, out, 1, 2, RESIZE_BILINEAR, &s);
    assert_close(out[0], 5.0 / 7.0, RESIZE_TOL, "antialiased shrink, output 0");
    assert_close(out[1], 16.0 / 7.0, RESIZE_TOL, "antialiased shrink, output 1");
    // Upsampling is plain bilinear with half-pixel centres: 2 -> 4 along H gives
    // (a, 3a/4 + b/4, a/4 + 3b/4, b), as the non-antialiased op.
    const float col[] = {10, 20};
    float up[4];
    resize_f32(col, 2, 1, up, 4, 1, RESIZE_BILINEAR, &s);
    const float want[] = {10, 12.5f, 17.5f, 20};
    for (int i = 0; i < 4; i++) assert_close(up[i], want[i], RESIZE_TOL, "bilinear upsample");
    // A constant image stays constant at any size (the weights are normalized).
    float flat[6 * 5], small[4 * 3];
    for (int i = 0; i < 30; i++) flat[i] = 0.25f;
    resize_f32(flat, 6, 5, small, 4, 3, RESIZE_BILINEAR, &s);
    for (int i = 0; i < 12; i++) assert_close(small[i], 0.25, RESIZE_TOL, "constant image");
    resize_scratch_free(&s);
}

// ---- the Stage 2 loss with a lower-resolution teacher ----------------------------------------------

// A tiny C-GSPN student (patch 4, two blocks); its teacher has the same model keys.
static Config tiny_config(void) {
    Config c;
    config_defaults(&c);
    snprintf(c.model, sizeof c.model, "cgspn");
    c.img_size = 28, c.in_chans = 1, c.patch = 4, c.width = 16, c.depth = 2, c.mlp_hidden = 24;
    c.class_token = 0, c.pos_embed = 0, c.gspn_latent = 4, c.num_classes = 10;
    snprintf(c.global_pool, sizeof c.global_pool, "avg");
    snprintf(c.device, sizeof c.device, "cpu");
    c.stage = 2;
    c.alpha = 0.3f, c.beta = 0.6f, c.lambda1 = 1.5f, c.lambda2 = 2.5f;
    return c;
}

static void randomize(ParamTable *t, uint64_t seed) {
    for (int i = 0; i < t->n; i++) {
        Param *p = t->params[i];
        bool merge = strstr(p->name, "merge") != NULL;
        test_fill(&p->value, seed + (uint64_t)i, merge ? 0.1f : -0.5f, 0.5f);
    }
}

// Student on (sh, sw) px, teacher on (th, tw) px: distill_loss_views against the teacher's full
// forward at its size, every tap resized by nn_resize_bilinear to the student's grid, and the
// tap losses of the tested ops.
static void loss_with_teacher_at(int sh, int sw, int th, int tw) {
    Config c = tiny_config();
    Ctx ctx = ctx_cpu();
    Distiller d;
    memset(&d, 0, sizeof d);
    teacher_init_fresh(&d.teachers[0].teacher, &c, c.img_size, &ctx, 77);
    char err[4096];
    if (distiller_init_with_teacher_err(&d, &c, &ctx, err, sizeof err) != 0) fail_msg("%s", err);
    randomize(&d.params, 500);             // adaptors included: not the identity
    randomize(&d.teachers[0].teacher.params, 900);
    encoder_set_image_size(&d.student, sh, sw);
    encoder_set_image_size(&d.teachers[0].teacher.enc, th, tw);
    int P = c.patch, B = 2, Hs = sh / P, Ws = sw / P, Ht = th / P, Wt = tw / P, C = c.width;

    Arena arena;
    arena_init(&arena, &ctx, 1u << 20);
    Tape t;
    tape_init(&t, &ctx, &arena);
    Tensor *img = test_tensor(4, B, 1, sh, sw), *timg = test_tensor(4, B, 1, th, tw), *raw;
    test_fill(img, 31, -1, 1);
    test_fill(timg, 32, -1, 1);
    Tensor *loss = distill_loss_views(&d, &t, img, &timg, NULL, &raw);
    double got = tensor_f32(loss)[0];

    Arena a2;
    arena_init(&a2, &ctx, 1u << 20);
    Tape r;
    tape_init(&r, &ctx, &a2);
    tape_set_grad_enabled(&r, false);
    EncoderTaps tt, st;
    encoder_forward(&r, &d.teachers[0].teacher.enc, timg, &tt);
    encoder_forward(&r, &d.student, img, &st);
    double sum_pp = 0, sum_pb = 0;
    for (int i = 0; i < c.depth; i++) {
        Tensor *up[2];
        Tensor *src[2] = {tt.pp[i], tt.pb[i]};
        for (int k = 0; k < 2; k++) {   // (B, Ht*Wt, C) -> (B, Ht, Wt, C) -> (B, Hs, Ws, C) -> (B, Hs*Ws, C)
            Tensor *g = nn_view(&r, src[k], 4, (int[]){B, Ht, Wt, C});
            up[k] = nn_view(&r, nn_resize_bilinear(&r, g, Hs, Ws), 3, (int[]){B, Hs * Ws, C});
        }
        Tensor *vs = adaptor_forward(&r, &d.teachers[0].ad_pp[i], st.pp[i]);
        sum_pp += tensor_f32(nn_mse(&r, vs, up[0]))[0] + 1.5 * tensor_f32(nn_token_kl(&r, vs, up[0]))[0];
        vs = adaptor_forward(&r, &d.teachers[0].ad_pb[i], st.pb[i]);
        sum_pb += tensor_f32(nn_mse(&r, vs, up[1]))[0] + 2.5 * tensor_f32(nn_token_kl(&r, vs, up[1]))[0];
    }
    double want = 0.3 * sum_pp / c.depth + 0.6 * sum_pb / c.depth;
    char what[96];
    snprintf(what, sizeof what, "stage 2 loss, student %dx%d px, teacher %dx%d px", sh, sw, th, tw);
    printf("    %s: %.9g vs %.9g\n", what, got, want);
    assert_close(got, want, SAME_LOSS_TOL, what);
    tape_backward(&t, loss);   // the student's gradients: finite, and none reaches the teacher
    for (int i = 0; i < d.params.n; i++) {
        const Param *p = d.params.params[i];
        double s = 0;
        for (size_t q = 0; q < p->grad.numel; q++) s += fabs(tensor_f32(&p->grad)[q]);
        if (p->trainable && !(s > 0 && isfinite(s))) fail_msg("gradient of %s: %g", p->name, s);
    }
    test_tensor_free(img);
    test_tensor_free(timg);
    tape_free(&r);
    arena_free(&a2);
    tape_free(&t);
    arena_free(&arena);
    distiller_free(&d);
}

static void test_loss_with_upsampled_teacher_taps_matches_ops_composed_by_hand(void **state) {
    loss_with_teacher_at(28, 28, 20, 20);   // 5x5 -> 7x7 tokens: not an integer ratio (as 27 -> 37)
    loss_with_teacher_at(40, 20, 28, 12);   // non-square: 7x3 -> 10x5 tokens
    loss_with_teacher_at(28, 28, 28, 28);   // the same grid: no resize
}

// ---- the plan ------------------------------------------------------------------------------------------

static void plan_fails(const char *res, const char *steps, const char *samples, const char *lr,
                       const char *expect) {
    Config c = tiny_config();
    snprintf(c.resolutions, sizeof c.resolutions, "%s", res);
    snprintf(c.stage_steps, sizeof c.stage_steps, "%s", steps);
    snprintf(c.stage_samples, sizeof c.stage_samples, "%s", samples);
    snprintf(c.stage_lr, sizeof c.stage_lr, "%s", lr);
    CurriculumPlan p;
    char err[1024];
    assert_int_equal(curriculum_plan_err(&c, &p, err, sizeof err), -1);
    assert_contains(err, expect);
}

static void test_plan_expands_stage_lists_and_rejects_bad_ones(void **state) {
    Config c = tiny_config();
    c.batch_size = 10;
    snprintf(c.resolutions, sizeof c.resolutions, "28, 40,56");
    snprintf(c.stage_samples, sizeof c.stage_samples, "100,35");
    snprintf(c.stage_lr, sizeof c.stage_lr, "1e-3");
    CurriculumPlan p;
    char err[1024];
    if (curriculum_plan_err(&c, &p, err, sizeof err) != 0) fail_msg("%s", err);
    assert_int_equal(p.n_res, 3);
    assert_int_equal(p.res[2], 56);
    assert_int_equal(p.steps[1], 10);
    assert_int_equal(p.steps[2], 3);   // 35 images: 3 whole batches of 10
    assert_true(p.lr[1] == 1e-3f && p.lr[2] == 1e-3f);
    Config sc;
    snprintf(c.init, sizeof c.init, "/x/s0");
    snprintf(c.run_name, sizeof c.run_name, "cur");
    snprintf(c.out_dir, sizeof c.out_dir, "/x");
    curriculum_stage_config(&c, &p, 2, &sc);
    assert_int_equal(sc.img_size, 56);
    assert_int_equal(sc.teacher_img_size, 40);
    assert_string_equal(sc.teacher, "/x/cur/stage1_40px");
    assert_string_equal(sc.teacher_config, "/x/cur/curriculum.cfg");
    assert_string_equal(sc.run_name, "stage2_56px");
    assert_string_equal(sc.resume, "auto");
    assert_int_equal(sc.max_steps, 3);
    assert_string_equal(sc.resolutions, "");
    curriculum_stage_config(&c, &p, 1, &sc);
    assert_string_equal(sc.teacher, "/x/s0");

    plan_fails("28", "5", "", "", "at least one higher");
    plan_fails("28,40,36", "5", "", "", "must increase");
    plan_fails("28,42", "5", "", "", "not a positive multiple of patch 4");
    plan_fails("28,40,56", "5,5,5", "", "", "give 1 or 2");
    plan_fails("28,40", "", "", "", "set one of stage_steps");
    plan_fails("28,40", "5", "500", "", "not both");
    plan_fails("28,40", "5", "", "1e-3,2e-3,3", "give 1 or 1");
    plan_fails("28,40", "5", "", "fast", "not a number");
}

// ---- runs ---------------------------------------------------------------------------------------------

// The Stage 0 student: a C-GSPN trained a few steps at 14 px on the fixture's shards.
static void train_stage0(void) {
    Config c = fixture_config(g_dir, "cgspn", "s0", 4);
    c.img_size = 14;
    c.eval_batch_size = 16;
    assert_int_equal(classify_train(&c, NULL).status, TRAIN_DONE);
}

// The curriculum 14 -> 21 -> 28 px (2x2 -> 3x3 -> 4x4 tokens at patch 7) of the stage 0 student.
static Config curriculum_config(const char *run) {
    Config c = fixture_config(g_dir, "cgspn", run, 0);
    c.img_size = 14;
    c.max_steps = 0;
    c.eval_batch_size = 16;
    snprintf(c.init, sizeof c.init, "%s/s0", g_dir);
    snprintf(c.resolutions, sizeof c.resolutions, "14,21,28");
    snprintf(c.stage_steps, sizeof c.stage_steps, "4,6");
    snprintf(c.stage_lr, sizeof c.stage_lr, "2e-3,1e-3");
    c.ckpt_every = 2;
    c.drop_path = 0.1f;   // the stage's stochastic depth resumes exactly too
    return c;
}

static void test_two_stage_curriculum_resumes_exactly_inside_stage_2(void **state) {
    enum { S1 = 4, S2 = 6, STOP = 3 };
    fixture_build_shards(g_dir, 40, 16);
    train_stage0();
    float a1[S1], a2[S2], b1[S1], b2[S2];
    memset(b1, 0xff, sizeof b1);   // NaN: a step run writes its loss here
    memset(b2, 0xff, sizeof b2);
    Config a = curriculum_config("full");
    CurriculumOptions oa = {.step_losses = {NULL, a1, a2}};
    CurriculumResult ra = curriculum_run(&a, &oa);
    assert_int_equal(ra.stages_done, 2);
    assert_false(ra.stopped);
    assert_true(ra.eval[2].count > 0);

    Config b = curriculum_config("split");
    CurriculumOptions ob = {.stop_stage = 2, .stop_after = STOP, .step_losses = {NULL, b1, b2}};
    CurriculumResult rb = curriculum_run(&b, &ob);
    assert_true(rb.stopped);
    assert_int_equal(rb.stages_done, 1);
    float keep1[S1];
    memcpy(keep1, b1, sizeof keep1);
    memset(b1, 0xff, sizeof b1);
    CurriculumOptions oc = {.step_losses = {NULL, b1, b2}};
    CurriculumResult rc = curriculum_run(&b, &oc);
    assert_int_equal(rc.stages_done, 2);
    for (int i = 0; i < S1; i++) {   // stage 1 is finished: not run again
        assert_true(isnan(b1[i]));
        if (memcmp(&keep1[i], &a1[i], sizeof(float)) != 0)
            fail_msg("stage 1 step %d: loss %.9g vs %.9g", i + 1, keep1[i], a1[i]);
    }
    for (int i = 0; i < S2; i++)
        if (memcmp(&a2[i], &b2[i], sizeof(float)) != 0)
            fail_msg("stage 2 step %d: loss %.9g (uninterrupted) vs %.9g (resumed)", i + 1, a2[i], b2[i]);
    const char *files[] = {"model.safetensors", "state.safetensors"};
    char x[700], y[700];
    for (int i = 0; i < 2; i++) {
        snprintf(x, sizeof x, "%s/full/stage2_28px/step_%08d/%s", g_dir, S2, files[i]);
        snprintf(y, sizeof y, "%s/split/stage2_28px/step_%08d/%s", g_dir, S2, files[i]);
        assert_files_equal(x, y);
    }
    // Stage 2's teacher was stage 1's final student, at stage 1's resolution.
    snprintf(x, sizeof x, "%s/split/stage2_28px/step_%08d/config.cfg", g_dir, S2);
    Config saved;
    config_defaults(&saved);
    config_load_file(&saved, x);
    assert_int_equal(saved.teacher_img_size, 21);
    assert_contains(saved.teacher, "split/stage1_21px");
}

// multires: one Stage 2 run whose student sees 14, 21 or 28 px per step, supervised by the
// stage 0 student at 14 px through the same upsampling; the draws are a function of the step,
// so a resumed run repeats them.
static void test_multires_run_draws_sides_per_step_trains_and_resumes_exactly(void **state) {
    fixture_build_shards(g_dir, 40, 16);
    train_stage0();
    Config c = fixture_config(g_dir, "cgspn", "multires", 6);
    c.eval_batch_size = 16;
    c.stage = 2;
    snprintf(c.teacher, sizeof c.teacher, "%s/s0", g_dir);
    c.teacher_img_size = 14;
    snprintf(c.multires, sizeof c.multires, "14,21,28");
    ResolutionViews v;
    char err[1024];
    if (resolution_views_init_err(&v, &c, err, sizeof err) != 0) fail_msg("%s", err);
    bool seen[3] = {0};
    for (long s = 0; s < 64; s++) {
        int side = resolution_student_side(&v, s);
        assert_int_equal(side, resolution_student_side(&v, s));
        assert_true(side == 14 || side == 21 || side == 28);
        seen[side / 7 - 2] = true;
    }
    assert_true(seen[0] && seen[1] && seen[2]);
    resolution_views_free(&v);
    float losses[6];
    DistillOptions o = {.step_losses = losses};
    TrainResult r = distill_train(&c, &o);
    assert_int_equal(r.step, 6);
    for (int i = 0; i < 6; i++) assert_true(isfinite(losses[i]) && losses[i] > 0);
    assert_true(r.eval.count > 0);   // evaluated at img_size = 28
    // Stopped after step 3 and resumed: the same draws, the same losses.
    float split[6];
    snprintf(c.run_name, sizeof c.run_name, "multires_split");
    DistillOptions o1 = {.stop_after = 3, .step_losses = split};
    assert_int_equal(distill_train(&c, &o1).step, 3);
    snprintf(c.resume, sizeof c.resume, "auto");
    DistillOptions o2 = {.step_losses = split};
    assert_int_equal(distill_train(&c, &o2).step, 6);
    for (int i = 0; i < 6; i++)
        if (memcmp(&losses[i], &split[i], sizeof(float)) != 0)
            fail_msg("multires step %d: loss %.9g vs %.9g resumed", i + 1, losses[i], split[i]);
    c.resume[0] = '\0';

    c.img_size = 21;   // img_size must be the largest side
    assert_int_equal(resolution_views_init_err(&v, &c, err, sizeof err), -1);
    assert_contains(err, "set img_size = 28");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_resize_f32_matches_pytorch_antialias_values_by_hand),
        cmocka_unit_test(test_loss_with_upsampled_teacher_taps_matches_ops_composed_by_hand),
        cmocka_unit_test(test_plan_expands_stage_lists_and_rejects_bad_ones),
        cmocka_unit_test_setup_teardown(test_two_stage_curriculum_resumes_exactly_inside_stage_2, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_multires_run_draws_sides_per_step_trains_and_resumes_exactly, setup_dir, teardown_dir),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
