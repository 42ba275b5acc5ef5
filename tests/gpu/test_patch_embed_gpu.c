// CUDA patch embedding (kernels/cuda/patch_embed.cu: im2col + cuBLASLt, col2im) against the CPU
// reference (kernels/cpu/patch_embed.c): forward (cols, y) and backward (dimg, dw, db) in fp32
// and bf16, images in act dtype or fp32, gradients accumulated twice onto non-zero values, on
// shapes with odd channel counts, odd widths, non-square images and K = Cin*p*p not a multiple of 8.
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include "gpulib.h"

// fp32: im2col/col2im copy values exactly; the GEMMs are exact fp32 in another summation order
// (~1e-7 relative); a wrong pixel or channel index is of order 1.
#define FP32_TOL 1e-5
// bf16 (inputs rounded to bf16 on the CPU side too):
// - cols: a copy of bf16-representable values: exact.
#define BF16_COLS_TOL 0.0
// - y and a bf16 dimg: one rounding to bf16 of an fp32-accumulated value (2^-9 per element at most);
//   the bias fallback or the accumulation into dimg rounds once more (2 * 2^-9 = 3.9e-3 worst
//   case per element, 2.2e-3 seen on the H200) -> 6e-3, as in test_linear_gpu.c.
#define BF16_ACT_TOL 6e-3
// - dw, db and an fp32 dimg: fp32 sums of products that are exact in fp32; only the order differs.
#define BF16_FP32_OUT_TOL 1e-4

typedef struct PatchCase {
    int B, Cin, Hi, Wi, p, D;
} PatchCase;

static const PatchCase CASES[] = {
    {2, 3, 8, 12, 4, 5},     // non-square image, D odd, K = 48
    {1, 1, 28, 28, 7, 64},   // Fashion-MNIST: one channel, K = 49 (odd)
    {3, 3, 32, 32, 16, 40},  // K = 768, the ViT-B/16 patch
    {2, 3, 14, 28, 14, 24},  // patch 14 (so14), one patch high
    {1, 2, 5, 5, 5, 3},      // a single token
};
#define NCASES ((int)(sizeof CASES / sizeof CASES[0]))

static Tensor *rand_host(Tensor *t, uint64_t seed, int round) {
    test_fill(t, seed, -1.0f, 1.0f);
    if (round) gpu_test_round_to_bf16(t);
    return t;
}

static int check(Ctx *ctx, const char *name, const PatchCase *c, DType img_dt, const Tensor *gpu,
                 const Tensor *cpu, double tol) {
    char what[96];
    snprintf(what, sizeof what, "%s B%d C%d %dx%d p%d D%d img %s", name, c->B, c->Cin, c->Hi, c->Wi,
             c->p, c->D, dtype_name(img_dt));
    double e = gpu_test_compare(ctx, what, gpu, cpu);
    if (!(e <= tol)) {
        printf("    ^ FAILED: above tolerance %.1e\n", tol);
        return 1;
    }
    return 0;
}

// Forward, then backward twice onto non-zero gradients; img and dimg in img_dt on the GPU.
static int check_case(Ctx *g, const PatchCase *c, DType dt, DType img_dt, uint64_t seed) {
    Ctx cpu = ctx_cpu();
    int r = dt == DTYPE_BF16;
    int H = c->Hi / c->p, W = c->Wi / c->p, K = c->Cin * c->p * c->p, R = c->B * H * W;
    Tensor *img = rand_host(test_tensor(4, c->B, c->Cin, c->Hi, c->Wi), seed, r);
    Tensor *w = rand_host(test_tensor(4, c->D, c->Cin, c->p, c->p), seed + 1, r);
    Tensor *b = rand_host(test_tensor(1, c->D), seed + 2, r);
    Tensor *cols = test_tensor(2, R, K), *y = test_tensor(4, c->B, H, W, c->D);
    cpu_patch_embed_fwd(&cpu, img, w, b, c->p, cols, y);

    Tensor *gimg = gpu_test_upload(g, img, img_dt), *gw = gpu_test_upload(g, w, dt);
    Tensor *gb = gpu_test_upload(g, b, dt);
    Tensor *gcols = gpu_test_upload(g, cols, dt), *gy = gpu_test_upload(g, y, dt);
    gpu_test_memset(gcols->data, 0xff, tensor_bytes(gcols));   // NaN: all must be written
    gpu_test_memset(gy->data, 0xff, tensor_bytes(gy));
    CUDA_CHECK(cudaDeviceSynchronize());
    op_patch_embed_fwd(g, gimg, gw, gb, c->p, gcols, gy);
    int fails = check(g, "patch_embed_fwd cols", c, img_dt, gcols, cols, r ? BF16_COLS_TOL : FP32_TOL) +
                check(g, "patch_embed_fwd y", c, img_dt, gy, y, r ? BF16_ACT_TOL : FP32_TOL);

    Tensor *dy = rand_host(test_tensor(4, c->B, H, W, c->D), seed + 3, r);
    Tensor *dimg = rand_host(test_tensor(4, c->B, c->Cin, c->Hi, c->Wi), seed + 4,
                             img_dt == DTYPE_BF16);
    Tensor *dw = rand_host(test_tensor(4, c->D, c->Cin, c->p, c->p), seed + 5, 0);
    Tensor *db = rand_host(test_tensor(1, c->D), seed + 6, 0);
    Tensor *gdy = gpu_test_upload(g, dy, dt), *gdimg = gpu_test_upload(g, dimg, img_dt);
    Tensor *gdw = gpu_test_upload(g, dw, DTYPE_F32), *gdb = gpu_test_upload(g, db, DTYPE_F32);
    for (int rep = 0; rep < 2; rep++) {
        cpu_patch_embed_bwd(&cpu, dy, cols, w, c->p, dimg, dw, db);
        op_patch_embed_bwd(g, gdy, gcols, gw, c->p, gdimg, gdw, gdb);
    }
    double dimg_tol = !r ? FP32_TOL : img_dt == DTYPE_BF16 ? BF16_ACT_TOL : BF16_FP32_OUT_TOL;
    fails += check(g, "patch_embed_bwd dimg", c, img_dt, gdimg, dimg, dimg_tol) +
             check(g, "patch_embed_bwd dw", c, img_dt, gdw, dw, r ? BF16_FP32_OUT_TOL : FP32_TOL) +
             check(g, "patch_embed_bwd db", c, img_dt, gdb, db, r ? BF16_FP32_OUT_TOL : FP32_TOL);

    Tensor *gpu[] = {gimg, gw, gb, gcols, gy, gdy, gdimg, gdw, gdb};
    Tensor *host[] = {img, w, b, cols, y, dy, dimg, dw, db};
    for (int i = 0; i < 9; i++) { gpu_test_free(gpu[i]); test_tensor_free(host[i]); }
    return fails;
}

static void test_patch_embed_fp32_matches_cpu(void **state) {
    GPU_TEST_REQUIRE_DEVICE();
    Ctx g = cuda_ctx_create(0, DTYPE_F32);
    int fails = 0;
    for (int i = 0; i < NCASES; i++) fails += check_case(&g, &CASES[i], DTYPE_F32, DTYPE_F32, 10 + 9 * i);
    cuda_ctx_destroy(&g);
    assert_int_equal(fails, 0);
}

// bf16 activations with the image in bf16, and with the image (and its gradient) kept in fp32.
static void test_patch_embed_bf16_matches_cpu_with_bf16_and_fp32_images(void **state) {
    GPU_TEST_REQUIRE_DEVICE();
    Ctx g = cuda_ctx_create(0, DTYPE_BF16);
    int fails = 0;
    for (int i = 0; i < NCASES; i++) {
        fails += check_case(&g, &CASES[i], DTYPE_BF16, DTYPE_BF16, 100 + 9 * i);
        fails += check_case(&g, &CASES[i], DTYPE_BF16, DTYPE_F32, 200 + 9 * i);
    }
    cuda_ctx_destroy(&g);
    assert_int_equal(fails, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_patch_embed_fp32_matches_cpu),
        cmocka_unit_test(test_patch_embed_bf16_matches_cpu_with_bf16_and_fp32_images),
    };
    return cmocka_run_group_tests_name("patch_embed_gpu", tests, NULL, NULL);
}
