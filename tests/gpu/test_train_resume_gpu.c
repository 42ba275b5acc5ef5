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

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_vit_training_on_the_gpu_resumes_bit_exactly, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_cgspn_training_on_the_gpu_resumes_bit_exactly, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_vit_training_with_recomputation_on_the_gpu_resumes_bit_exactly, setup_dir, teardown_dir),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
