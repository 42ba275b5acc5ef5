// `cgspn train` on the GPU resumes bit-exactly: the CPU test's check
// (tests/resume_check.h: 2N steps vs N + resume + N, and a resume by path; every loss, the log
// lines, final weights, moments and EMA the same bits) with device = cuda and the GPU's default
// precision (bf16 weights and activations, fp32 masters and moments), for a ViT (cuDNN or the
// hand-written attention) and a C-GSPN (the scan kernels). It holds because every CUDA reduction
// is ordered (no float atomics whose order varies) and every random draw is made on the host.
#include "gpulib.h"
#include "../resume_check.h"

static char g_dir[256];

static int setup_dir(void **state) { return test_make_temp_dir(g_dir, sizeof g_dir, "resume_gpu"); }
static int teardown_dir(void **state) { return test_remove_dir(g_dir); }

static void test_vit_training_on_the_gpu_resumes_bit_exactly(void **state) {
    GPU_TEST_REQUIRE_DEVICE();
    resume_is_bit_exact(g_dir, "vit", "cuda", 0);
}

static void test_cgspn_training_on_the_gpu_resumes_bit_exactly(void **state) {
    GPU_TEST_REQUIRE_DEVICE();
    resume_is_bit_exact(g_dir, "cgspn", "cuda", 0);
}

// Every block recomputed in backward (grad_checkpoint = 1): bit-exact on the GPU too.
static void test_vit_training_with_recomputation_on_the_gpu_resumes_bit_exactly(void **state) {
    GPU_TEST_REQUIRE_DEVICE();
    resume_is_bit_exact(g_dir, "vit", "cuda", 1);
}

// cuda_graph = 1 (the default): the step captured as a CUDA graph and replayed gives the bits of
// the step run op by op (cuda_graph = 0), and a run stopped and resumed (its first step after
// the resume op by op, then a new capture) the bits of the uninterrupted one: every loss, the
// final weights and optimizer state. resume_recipe_config's recipe without what keeps a step op
// by op (accumulation, MESA): drop path (its step read from the device by the replay), mixup,
// erasing and the EMA stay. The runs cross an epoch, whose evaluation comes between replays; the
// evaluations replay their batches too (cuda_graph covers them) and give the op-by-op results.
static void graph_steps_match_eager(const char *model) {
    enum { N = 5, TOTAL = 2 * N };
    fixture_build_shards(g_dir, 48, 16);
    const char *runs[] = {"graph", "eager", "graph_split"};
    float losses[3][TOTAL];
    long graph_steps[3];
    EvalResult ev[3];
    for (int i = 0; i < 3; i++) {
        Config c = resume_recipe_config(g_dir, model, "cuda", runs[i], TOTAL, 0);
        if (strcmp(model, "gspn_hier") == 0) fixture_gspn_hier(&c, 16);
        c.accum_steps = 1;
        c.mesa = 0;
        c.cuda_graph = i != 1;
        memset(losses[i], 0xff, sizeof losses[i]);
        TrainOptions o = {.step_losses = losses[i], .stop_after = i == 2 ? N : 0};
        TrainResult r = classify_train(&c, &o);
        graph_steps[i] = r.graph_steps;
        ev[i] = r.eval;
        if (i == 2) {   // stopped after N: resumed for the rest
            assert_int_equal(r.step, N);
            snprintf(c.resume, sizeof c.resume, "auto");
            TrainOptions o2 = {.step_losses = losses[i]};
            r = classify_train(&c, &o2);
            graph_steps[i] += r.graph_steps;
            ev[i] = r.eval;
        }
        assert_int_equal(r.step, TOTAL);
    }
    // Every step but a process's first came from a graph.
    assert_int_equal(graph_steps[0], TOTAL - 1);
    assert_int_equal(graph_steps[1], 0);
    assert_int_equal(graph_steps[2], TOTAL - 2);
    resume_assert_bits_equal(losses[0], losses[1], TOTAL, "replayed against op by op");
    // The final evaluation (16 images, batches of 8): its second batch replayed, the same result.
    assert_int_equal(ev[0].graph_batches, 1);
    assert_int_equal(ev[1].graph_batches, 0);
    assert_true(ev[0].top1 == ev[1].top1 && ev[0].loss == ev[1].loss && ev[0].count == ev[1].count);
    assert_true(ev[0].loss == ev[2].loss);
    resume_assert_bits_equal(losses[0], losses[2], TOTAL, "replayed, stopped and resumed");
    const char *files[] = {"model.safetensors", "state.safetensors"};
    for (int f = 0; f < 2; f++)
        for (int i = 1; i < 3; i++) {
            char a[600], b[600];
            snprintf(a, sizeof a, "%s/%s/step_%08d/%s", g_dir, runs[0], TOTAL, files[f]);
            snprintf(b, sizeof b, "%s/%s/step_%08d/%s", g_dir, runs[i], TOTAL, files[f]);
            assert_files_equal(a, b);
        }
}

static void test_gspn_hier_steps_replayed_as_a_graph_match_eager(void **state) {
    GPU_TEST_REQUIRE_DEVICE();
    graph_steps_match_eager("gspn_hier");
}

static void test_vit_steps_replayed_as_a_graph_match_eager(void **state) {
    GPU_TEST_REQUIRE_DEVICE();
    graph_steps_match_eager("vit");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_vit_training_on_the_gpu_resumes_bit_exactly, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_cgspn_training_on_the_gpu_resumes_bit_exactly, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_vit_training_with_recomputation_on_the_gpu_resumes_bit_exactly, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_gspn_hier_steps_replayed_as_a_graph_match_eager, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_vit_steps_replayed_as_a_graph_match_eager, setup_dir, teardown_dir),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
