// Stage 2 from two teachers on the GPU resumes bit-exactly: teacher 1 a ViT, teacher 2
// a ViT of another width and depth with registers, pos_embed on the patch tokens only, its own
// input normalization, both PHI-S standardized; the student a C-GSPN with drop path and the CE
// term. 2N steps against N + resume + N with device = cuda and the GPU's default precision (bf16
// weights and activations, fp32 masters and moments): every loss, the final weights and the
// optimizer state the same bits. The PHI-S statistics of the first N steps' run come back from
// its checkpoint. The runs replay their steps as a CUDA graph (cuda_graph, the default: each
// process's first step op by op); a run with cuda_graph = 0 gives the same bits.
#include "gpulib.h"
#include "../train_fixture.h"
#include "../../train/classify.h"
#include "../../train/distill.h"

enum { N = 3, TOTAL = 2 * N };

static char g_dir[256];

static int setup_dir(void **state) { return test_make_temp_dir(g_dir, sizeof g_dir, "distill_gpu"); }
static int teardown_dir(void **state) { return test_remove_dir(g_dir); }

// Widths and heads the GPU's vector paths and cuDNN take.
static void gpu_sizes(Config *c) {
    snprintf(c->device, sizeof c->device, "cuda");
    c->width = 64, c->heads = 4, c->mlp_hidden = 128, c->depth = 2;
}

static void make_teachers(void) {
    Config t1 = fixture_config(g_dir, "vit", "teacher1", 1);
    gpu_sizes(&t1);
    assert_int_equal(classify_train(&t1, NULL).step, 1);
    Config t2 = fixture_config(g_dir, "vit", "teacher2", 1);
    gpu_sizes(&t2);
    t2.width = 32, t2.heads = 2, t2.mlp_hidden = 64, t2.depth = 3;
    t2.reg_tokens = 2, t2.no_embed_class = 1, t2.layer_scale_init = 0.5f;
    assert_int_equal(classify_train(&t2, NULL).step, 1);
    char path[300];
    snprintf(path, sizeof path, "%s/t2.cfg", g_dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f, "teacher = %s/teacher2\nteacher_mean = 0.25\nteacher_std = 0.4\nbeta = 0.7\n"
            "summary_weight = 0.5\nphi_s = 1\n", g_dir);
    fclose(f);
}

static Config student_config(const char *run) {
    Config c = fixture_config(g_dir, "cgspn", run, TOTAL);
    gpu_sizes(&c);
    c.gspn_latent = 16;
    c.stage = 2;
    snprintf(c.teacher, sizeof c.teacher, "%s/teacher1", g_dir);
    snprintf(c.extra_teachers, sizeof c.extra_teachers, "%s/t2.cfg", g_dir);
    c.phi_s = 1;
    c.phi_s_batches = 2;
    c.gamma = 0.5f;
    c.drop_path = 0.1f;
    c.ckpt_every = N;
    c.log_every = 2;   // a log window spans the resume
    return c;
}

static void test_two_teacher_stage2_on_the_gpu_resumes_bit_exactly(void **state) {
    GPU_TEST_REQUIRE_DEVICE();
    fixture_build_shards(g_dir, 40, 16);
    make_teachers();
    float full[TOTAL], split[TOTAL];
    memset(split, 0xff, sizeof split);
    Config a = student_config("full");
    DistillOptions oa = {.step_losses = full};
    TrainResult ra = distill_train(&a, &oa);
    assert_int_equal(ra.step, TOTAL);
    assert_int_equal(ra.graph_steps, TOTAL - 1);
    Config b = student_config("split");
    DistillOptions ob = {.stop_after = N, .step_losses = split};
    assert_int_equal(distill_train(&b, &ob).step, N);
    snprintf(b.resume, sizeof b.resume, "auto");
    DistillOptions oc = {.step_losses = split};
    assert_int_equal(distill_train(&b, &oc).step, TOTAL);
    float eager[TOTAL];
    Config e = student_config("eager");
    e.cuda_graph = 0;
    DistillOptions oe = {.step_losses = eager};
    TrainResult re = distill_train(&e, &oe);
    assert_int_equal(re.step, TOTAL);
    assert_int_equal(re.graph_steps, 0);
    for (int i = 0; i < TOTAL; i++) {
        printf("  step %d: loss %.9g | %.9g | %.9g\n", i + 1, full[i], split[i], eager[i]);
        if (memcmp(&full[i], &split[i], sizeof(float)) != 0)
            fail_msg("step %d: loss %.9g vs %.9g after the resume", i + 1, full[i], split[i]);
        if (memcmp(&full[i], &eager[i], sizeof(float)) != 0)
            fail_msg("step %d: loss %.9g replayed vs %.9g op by op", i + 1, full[i], eager[i]);
    }
    const char *files[] = {"model.safetensors", "state.safetensors"};
    const char *runs[] = {"split", "eager"};
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++) {
            char x[600], y[600];
            snprintf(x, sizeof x, "%s/full/step_%08d/%s", g_dir, TOTAL, files[i]);
            snprintf(y, sizeof y, "%s/%s/step_%08d/%s", g_dir, runs[j], TOTAL, files[i]);
            assert_files_equal(x, y);
        }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_two_teacher_stage2_on_the_gpu_resumes_bit_exactly, setup_dir, teardown_dir),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
