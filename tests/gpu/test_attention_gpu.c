// Attention on the GPU (kernels/cuda/attention.cu: cuDNN's fused flash attention and the fallback
// kernels) against the CPU reference (kernels/cpu/attention.c): forward out and lse, backward
// dqkv, the += contract of the backward, determinism, and cuDNN against the fallback in bf16.
// Shapes hit the kernels' edges: fewer tokens than one 32-row tile, tokens past a tile boundary
// (65, 197), head_dim 8 / 20 / 64 / 72 / 128 / 256 (20: not a multiple of 8, so cuDNN cannot take
// it), 1 to 12 heads, qkv given as a (B,H,W,3C) token grid.
#include "gpulib.h"
#include "../../kernels/cuda/attention.h"

// fp32 (fallback kernels): the same fp32 arithmetic as the CPU in another order (online softmax
// rescaling, __expf, FMA contraction): ~1e-6 relative; 1e-4 is the project's fp32 attention bound and far
// below what a wrong index, scale or missing term gives (order 1e-1 and up).
#define FP32_TOL 1e-4
// bf16 (inputs rounded to bf16 for both sides; the CPU computes in fp32 from them):
// - out: rounded to bf16 once (2^-9 relative per element), and cuDNN also rounds P to bf16 before
//   P V: ~3e-3 norm-wise -> 1e-2.
#define BF16_OUT_TOL 1e-2
// - lse: fp32 from identical inputs (exact bf16 products, fp32 sums, fast exp/log): ~1e-7 seen
//   (cuDNN 9.14, H100) -> 1e-5.
#define BF16_LSE_TOL 1e-5
// - dqkv: cuDNN rounds P and dS to bf16 before its matmuls, dq, dk, dv are rounded, and the +=
//   rounds once more; dq sums dS rows that cancel (they sum to 0), which raises its relative
//   error: ~1e-2 expected, 3e-3 seen (cuDNN 9.14, H100) -> 2e-2 (the project's bf16 attention bound).
#define BF16_GRAD_TOL 2e-2
// cuDNN against the fallback in bf16: each is within the bounds above of the fp32 truth, so
// their difference is within the sum.
#define PATHS_OUT_TOL (2 * BF16_OUT_TOL)
#define PATHS_LSE_TOL (2 * BF16_LSE_TOL)
#define PATHS_GRAD_TOL (2 * BF16_GRAD_TOL)

typedef struct Shape {
    int B, N, H, D;
    int grid_h;   // > 0: qkv is a (B, grid_h, N / grid_h, 3C) token grid
} Shape;

static const Shape SHAPES[] = {
    {2, 7, 2, 8, 0},      // fewer tokens than a tile; the smallest head_dim cuDNN takes
    {2, 65, 2, 72, 0},    // one token past two tiles; so14's head_dim
    {2, 197, 12, 64, 0},  // ViT-B/16: 197 tokens, 12 heads of 64
    {1, 65, 3, 20, 5},    // head_dim 20 (fallback in bf16 too); qkv as a 5 x 13 grid
    {2, 33, 4, 128, 0},   // head_dim 128
    {1, 40, 1, 256, 0},   // the fallback's largest head_dim
};
#define NSHAPES ((int)(sizeof SHAPES / sizeof SHAPES[0]))

static int cudnn_may_take(const Shape *s) { return s->D % 8 == 0 && s->D <= 256; }

// A CPU tensor of (B, N, width), or (B, grid_h, N / grid_h, width) for grid shapes.
static Tensor *token_tensor(const Shape *s, int width) {
    if (s->grid_h > 0) return test_tensor(4, s->B, s->grid_h, s->N / s->grid_h, width);
    return test_tensor(3, s->B, s->N, width);
}

// Inputs and the CPU reference for one shape (bf16: inputs rounded to bf16 first).
typedef struct Case {
    Shape s;
    int C;
    Tensor *qkv, *dout, *dqkv0;      // dqkv0: what dqkv holds before the backward (+=)
    Tensor *out_ref, *lse, *dqkv;    // CPU reference: forward, and dqkv0 + gradient
    Tensor *out;                     // out_ref as the backward's input (rounded like the GPU's)
} Case;

static Case case_make(const Shape *s, DType dt, uint64_t seed) {
    Case c = {.s = *s, .C = s->H * s->D};
    c.qkv = token_tensor(s, 3 * c.C);
    c.dout = token_tensor(s, c.C);
    c.dqkv0 = token_tensor(s, 3 * c.C);
    test_fill(c.qkv, seed, -1.5f, 1.5f);
    test_fill(c.dout, seed + 1, -1.0f, 1.0f);
    test_fill(c.dqkv0, seed + 2, -0.01f, 0.01f);   // small: the comparison is of the gradient
    if (dt == DTYPE_BF16) {
        gpu_test_round_to_bf16(c.qkv);
        gpu_test_round_to_bf16(c.dout);
        gpu_test_round_to_bf16(c.dqkv0);
    }
    c.out_ref = token_tensor(s, c.C);
    c.lse = test_tensor(3, s->B, s->H, s->N);
    Ctx cpu = ctx_cpu();
    cpu_attention_fwd(&cpu, c.qkv, s->H, c.out_ref, c.lse);
    // The backward of both sides starts from the same out (rounded like the GPU's), so its
    // comparison measures the backward alone.
    c.out = token_tensor(s, c.C);
    memcpy(c.out->data, c.out_ref->data, tensor_bytes(c.out));
    if (dt == DTYPE_BF16) gpu_test_round_to_bf16(c.out);
    c.dqkv = token_tensor(s, 3 * c.C);
    memcpy(c.dqkv->data, c.dqkv0->data, tensor_bytes(c.dqkv));
    cpu_attention_bwd(&cpu, c.dout, c.qkv, c.out, c.lse, s->H, 0, c.dqkv);
    return c;
}

static void case_free(Case *c) {
    Tensor *t[] = {c->qkv, c->dout, c->dqkv0, c->out_ref, c->out, c->lse, c->dqkv};
    for (size_t i = 0; i < sizeof t / sizeof *t; i++) test_tensor_free(t[i]);
}

// GPU results of one path, as host fp32 copies.
typedef struct Result {
    CudaAttnPath fwd_path, bwd_path;
    int bwd_deterministic;
    float *out, *lse, *grad;   // grad = dqkv after the backward - dqkv0
} Result;

static void result_free(Result *r) {
    free(r->out);
    free(r->lse);
    free(r->grad);
}

// Poisons a GPU tensor (NaN in fp32 and bf16), so an element no kernel writes shows.
static void gpu_poison(Ctx *ctx, Tensor *t) {
    gpu_test_memset(t->data, 0xff, tensor_bytes(t));
    (void)ctx;
}

static Result run_gpu(Ctx *g, const Case *c, DType dt, CudaAttnPath want) {
    Result r = {0};
    Tensor *qkv = gpu_test_upload(g, c->qkv, dt);
    Tensor *out = gpu_test_upload(g, c->out, dt);   // overwritten below: shape and dtype only
    Tensor *lse = gpu_test_upload(g, c->lse, DTYPE_F32);
    gpu_poison(g, out);
    gpu_poison(g, lse);
    r.fwd_path = cuda_attention_fwd_path(g, qkv, c->s.H, out, lse, want);
    r.out = tensor_to_host_f32(g, out);
    r.lse = tensor_to_host_f32(g, lse);
    gpu_test_free(out);
    gpu_test_free(lse);
    // backward from the reference's out and lse (see case_make)
    Tensor *ref_out = gpu_test_upload(g, c->out, dt);
    Tensor *ref_lse = gpu_test_upload(g, c->lse, DTYPE_F32);
    Tensor *dout = gpu_test_upload(g, c->dout, dt);
    Tensor *dqkv = gpu_test_upload(g, c->dqkv0, dt);
    r.bwd_path = cuda_attention_bwd_path(g, dout, qkv, ref_out, ref_lse, c->s.H, dqkv, want,
                                         &r.bwd_deterministic);
    r.grad = tensor_to_host_f32(g, dqkv);
    const float *g0 = c->dqkv0->data;
    for (size_t i = 0; i < dqkv->numel; i++) r.grad[i] -= g0[i];
    Tensor *t[] = {qkv, ref_out, ref_lse, dout, dqkv};
    for (size_t i = 0; i < sizeof t / sizeof *t; i++) gpu_test_free(t[i]);
    return r;
}

static double rel_err(const char *what, const float *a, const float *b, size_t n) {
    double e = test_rel_err(a, b, n);
    printf("      %-12s rel err %.2e\n", what, e);
    return e;
}

// dqkv - dqkv0 of the CPU reference.
static float *ref_grad(const Case *c) {
    float *g = malloc(c->dqkv->numel * sizeof(float));
    const float *d = c->dqkv->data, *g0 = c->dqkv0->data;
    for (size_t i = 0; i < c->dqkv->numel; i++) g[i] = d[i] - g0[i];
    return g;
}

static const char *path_name(CudaAttnPath p) { return p == CUDA_ATTN_CUDNN ? "cuDNN" : "fallback"; }

// Every shape in dt through path want, against the CPU. deterministic: ctx->deterministic (for
// cuDNN's backward: 1 picks the deterministic-dQ graph, 0 the atomic-dQ one).
static void check_against_cpu(DType dt, CudaAttnPath want, int deterministic, double out_tol,
                              double lse_tol, double grad_tol) {
    GPU_TEST_REQUIRE_DEVICE();
    Ctx g = cuda_ctx_create(0, dt);
    g.deterministic = deterministic;
    for (int i = 0; i < NSHAPES; i++) {
        const Shape *s = &SHAPES[i];
        Case c = case_make(s, dt, 1000 + 10 * i);
        Result r = run_gpu(&g, &c, dt, want);
        printf("    B=%d N=%d heads=%d head_dim=%d %s: forward %s, backward %s\n", s->B, s->N, s->H,
               s->D, dtype_name(dt), path_name(r.fwd_path), path_name(r.bwd_path));
        float *gref = ref_grad(&c);
        double e_out = rel_err("out", r.out, c.out_ref->data, c.out_ref->numel);
        double e_lse = rel_err("lse", r.lse, c.lse->data, c.lse->numel);
        double e_grad = rel_err("dqkv", r.grad, gref, c.dqkv->numel);
        assert_true(e_out <= out_tol);   // NaN fails too
        assert_true(e_lse <= lse_tol);
        assert_true(e_grad <= grad_tol);
        if (dt == DTYPE_F32 || want == CUDA_ATTN_FALLBACK) {
            assert_int_equal(r.fwd_path, CUDA_ATTN_FALLBACK);
            assert_int_equal(r.bwd_path, CUDA_ATTN_FALLBACK);
        }
        free(gref);
        result_free(&r);
        case_free(&c);
    }
    cuda_ctx_destroy(&g);
}

static void test_attention_gpu_fp32_fallback_matches_cpu(void **state) {
    (void)state;
    check_against_cpu(DTYPE_F32, CUDA_ATTN_AUTO, 1, FP32_TOL, FP32_TOL, FP32_TOL);
}

static void test_attention_gpu_bf16_fallback_matches_cpu(void **state) {
    (void)state;
    check_against_cpu(DTYPE_BF16, CUDA_ATTN_FALLBACK, 1, BF16_OUT_TOL, BF16_LSE_TOL,
                      BF16_GRAD_TOL);
}

// The default path: cuDNN where it runs (head_dim a multiple of 8), the fallback elsewhere.
static void test_attention_gpu_bf16_default_path_matches_cpu(void **state) {
    (void)state;
    check_against_cpu(DTYPE_BF16, CUDA_ATTN_AUTO, 1, BF16_OUT_TOL, BF16_LSE_TOL, BF16_GRAD_TOL);
}

// ctx->deterministic = 0: cuDNN's backward through the atomic dQ accumulator (the graph that also
// runs when the deterministic one would need an outsized workspace, e.g. 5476 tokens).
static void test_attention_gpu_bf16_atomic_dq_backward_matches_cpu(void **state) {
    (void)state;
    check_against_cpu(DTYPE_BF16, CUDA_ATTN_AUTO, 0, BF16_OUT_TOL, BF16_LSE_TOL, BF16_GRAD_TOL);
}

// cuDNN and the fallback on the same bf16 inputs; where this build has cuDNN, cuDNN must run for
// the model shapes (head_dim 64, 72, 128), and head_dim 20 must go to the fallback.
static void test_attention_gpu_bf16_cudnn_and_fallback_agree(void **state) {
    (void)state;
    GPU_TEST_REQUIRE_DEVICE();
    Ctx g = cuda_ctx_create(0, DTYPE_BF16);
    int with_cudnn = cuda_attention_built_with_cudnn();
    if (!with_cudnn) printf("    this build has no cuDNN: both runs take the fallback\n");
    for (int i = 0; i < NSHAPES; i++) {
        const Shape *s = &SHAPES[i];
        Case c = case_make(s, DTYPE_BF16, 2000 + 10 * i);
        Result a = run_gpu(&g, &c, DTYPE_BF16, CUDA_ATTN_CUDNN);
        Result b = run_gpu(&g, &c, DTYPE_BF16, CUDA_ATTN_FALLBACK);
        printf("    B=%d N=%d heads=%d head_dim=%d: forward %s, backward %s vs fallback\n", s->B,
               s->N, s->H, s->D, path_name(a.fwd_path), path_name(a.bwd_path));
        if (!cudnn_may_take(s)) {
            assert_int_equal(a.fwd_path, CUDA_ATTN_FALLBACK);
            assert_int_equal(a.bwd_path, CUDA_ATTN_FALLBACK);
        } else if (with_cudnn && (s->D == 64 || s->D == 72 || s->D == 128)) {
            assert_int_equal(a.fwd_path, CUDA_ATTN_CUDNN);
            assert_int_equal(a.bwd_path, CUDA_ATTN_CUDNN);
        }
        size_t n_out = c.out->numel, n_lse = c.lse->numel, n_qkv = c.qkv->numel;
        assert_true(rel_err("out", a.out, b.out, n_out) <= PATHS_OUT_TOL);
        assert_true(rel_err("lse", a.lse, b.lse, n_lse) <= PATHS_LSE_TOL);
        assert_true(rel_err("dqkv", a.grad, b.grad, n_qkv) <= PATHS_GRAD_TOL);
        result_free(&a);
        result_free(&b);
        case_free(&c);
    }
    cuda_ctx_destroy(&g);
}

// Runs the backward n times into dqkv (zeroed first); returns a host copy.
static float *backward_n_times(Ctx *g, const Case *c, DType dt, CudaAttnPath want, int n,
                               CudaAttnPath *path, int *deterministic) {
    Tensor *qkv = gpu_test_upload(g, c->qkv, dt), *out = gpu_test_upload(g, c->out, dt);
    Tensor *lse = gpu_test_upload(g, c->lse, DTYPE_F32), *dout = gpu_test_upload(g, c->dout, dt);
    Tensor *dqkv = gpu_test_upload(g, c->dqkv0, dt);
    gpu_test_memset(dqkv->data, 0, tensor_bytes(dqkv));
    for (int i = 0; i < n; i++)
        *path = cuda_attention_bwd_path(g, dout, qkv, out, lse, c->s.H, dqkv, want, deterministic);
    float *h = tensor_to_host_f32(g, dqkv);
    Tensor *t[] = {qkv, out, lse, dout, dqkv};
    for (size_t i = 0; i < sizeof t / sizeof *t; i++) gpu_test_free(t[i]);
    return h;
}

// The backward adds into dqkv: twice from zero is exactly twice once (x + x = 2x in fp32 and
// bf16) on a deterministic path; on a non-deterministic one within run-to-run noise, where an
// overwrite would be off by half. Both paths, both dtypes.
static void test_attention_gpu_backward_accumulates_into_dqkv(void **state) {
    (void)state;
    GPU_TEST_REQUIRE_DEVICE();
    const Shape s = {2, 65, 2, 72, 0};
    const DType dts[] = {DTYPE_F32, DTYPE_BF16};
    const CudaAttnPath paths[] = {CUDA_ATTN_CUDNN, CUDA_ATTN_FALLBACK};
    for (int d = 0; d < 2; d++) {
        Ctx g = cuda_ctx_create(0, dts[d]);
        Case c = case_make(&s, dts[d], 3000);
        for (int p = 0; p < 2; p++) {
            CudaAttnPath ran1, ran2;
            int det = 1;
            float *once = backward_n_times(&g, &c, dts[d], paths[p], 1, &ran1, &det);
            float *twice = backward_n_times(&g, &c, dts[d], paths[p], 2, &ran2, &det);
            size_t bad = 0;
            for (size_t i = 0; i < c.qkv->numel; i++) {
                bad += twice[i] != 2.0f * once[i];
                once[i] *= 2.0f;
            }
            double err = test_rel_err(twice, once, c.qkv->numel);
            printf("    %s %s: %zu of %zu elements differ from twice one backward (rel err %.1e)\n",
                   dtype_name(dts[d]), path_name(ran1), bad, c.qkv->numel, err);
            if (det) assert_int_equal(bad, 0);
            else assert_true(err <= 1e-2);
            free(once);
            free(twice);
        }
        case_free(&c);
        cuda_ctx_destroy(&g);
    }
}

// Two backward runs give identical bits: always on the fallback; on cuDNN when it reports a
// deterministic engine (the default, ctx->deterministic = 1).
static void test_attention_gpu_backward_is_bitwise_deterministic(void **state) {
    (void)state;
    GPU_TEST_REQUIRE_DEVICE();
    const Shape s = {2, 197, 12, 64, 0};
    const DType dts[] = {DTYPE_F32, DTYPE_BF16};
    const CudaAttnPath paths[] = {CUDA_ATTN_CUDNN, CUDA_ATTN_FALLBACK};
    for (int d = 0; d < 2; d++) {
        Ctx g = cuda_ctx_create(0, dts[d]);
        Case c = case_make(&s, dts[d], 4000);
        for (int p = 0; p < 2; p++) {
            CudaAttnPath ran;
            int det1 = 0, det2 = 0;
            float *a = backward_n_times(&g, &c, dts[d], paths[p], 1, &ran, &det1);
            float *b = backward_n_times(&g, &c, dts[d], paths[p], 1, &ran, &det2);
            int same = !memcmp(a, b, c.qkv->numel * sizeof(float));
            printf("    %s %s: %s engine, runs %s\n", dtype_name(dts[d]), path_name(ran),
                   det1 ? "deterministic" : "non-deterministic",
                   same ? "bitwise identical" : "differ");
            if (det1) assert_true(same);
            free(a);
            free(b);
        }
        case_free(&c);
        cuda_ctx_destroy(&g);
    }
}

// attention_bwd with ATTENTION_WRITE_DQKV overwrites dqkv (poisoned with NaN first) with the gradient: cuDNN writing
// into it directly (bf16, head_dim a multiple of 8), the fallback zeroing it first (fp32, and
// head_dim 20 in bf16).
static void test_attention_gpu_backward_write_overwrites_dqkv(void **state) {
    (void)state;
    GPU_TEST_REQUIRE_DEVICE();
    const DType dts[] = {DTYPE_F32, DTYPE_BF16};
    for (int d = 0; d < 2; d++) {
        Ctx g = cuda_ctx_create(0, dts[d]);
        for (int i = 0; i < NSHAPES; i++) {
            const Shape *s = &SHAPES[i];
            Case c = case_make(s, dts[d], 6000 + 10 * i);
            Tensor *qkv = gpu_test_upload(&g, c.qkv, dts[d]), *out = gpu_test_upload(&g, c.out, dts[d]);
            Tensor *lse = gpu_test_upload(&g, c.lse, DTYPE_F32);
            Tensor *dout = gpu_test_upload(&g, c.dout, dts[d]);
            Tensor *dqkv = gpu_test_upload(&g, c.dqkv0, dts[d]);
            gpu_poison(&g, dqkv);
            op_attention_bwd(&g, dout, qkv, out, lse, s->H, ATTENTION_WRITE_DQKV, dqkv);
            float *got = tensor_to_host_f32(&g, dqkv), *want = ref_grad(&c);
            printf("    B=%d N=%d heads=%d head_dim=%d %s:\n", s->B, s->N, s->H, s->D,
                   dtype_name(dts[d]));
            double e = rel_err("dqkv", got, want, c.dqkv->numel);
            assert_true(e <= (dts[d] == DTYPE_F32 ? FP32_TOL : BF16_GRAD_TOL));
            free(got);
            free(want);
            Tensor *t[] = {qkv, out, lse, dout, dqkv};
            for (size_t k = 0; k < sizeof t / sizeof *t; k++) gpu_test_free(t[k]);
            case_free(&c);
        }
        cuda_ctx_destroy(&g);
    }
}

// A NULL dqkv means "not needed": nothing runs.
static void test_attention_gpu_backward_without_dqkv_is_a_no_op(void **state) {
    (void)state;
    GPU_TEST_REQUIRE_DEVICE();
    Ctx g = cuda_ctx_create(0, DTYPE_BF16);
    const Shape s = {1, 7, 2, 8, 0};
    Case c = case_make(&s, DTYPE_BF16, 5000);
    Tensor *qkv = gpu_test_upload(&g, c.qkv, DTYPE_BF16), *out = gpu_test_upload(&g, c.out, DTYPE_BF16);
    Tensor *lse = gpu_test_upload(&g, c.lse, DTYPE_F32), *dout = gpu_test_upload(&g, c.dout, DTYPE_BF16);
    op_attention_bwd(&g, dout, qkv, out, lse, s.H, 0, NULL);
    CUDA_CHECK(cudaDeviceSynchronize());
    Tensor *t[] = {qkv, out, lse, dout};
    for (size_t i = 0; i < sizeof t / sizeof *t; i++) gpu_test_free(t[i]);
    case_free(&c);
    cuda_ctx_destroy(&g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_attention_gpu_fp32_fallback_matches_cpu),
        cmocka_unit_test(test_attention_gpu_bf16_fallback_matches_cpu),
        cmocka_unit_test(test_attention_gpu_bf16_default_path_matches_cpu),
        cmocka_unit_test(test_attention_gpu_bf16_atomic_dq_backward_matches_cpu),
        cmocka_unit_test(test_attention_gpu_bf16_cudnn_and_fallback_agree),
        cmocka_unit_test(test_attention_gpu_backward_accumulates_into_dqkv),
        cmocka_unit_test(test_attention_gpu_backward_is_bitwise_deterministic),
        cmocka_unit_test(test_attention_gpu_backward_write_overwrites_dqkv),
        cmocka_unit_test(test_attention_gpu_backward_without_dqkv_is_a_no_op),
    };
    return cmocka_run_group_tests_name("attention_gpu", tests, NULL, NULL);
}
