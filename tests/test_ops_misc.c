// CPU reference ops other than the dense ones: elementwise, token layout, bilinear resize,
// losses. Each forward is compared with a naive double-precision reference (and, for resize,
// cross-entropy and KL, with values known by hand), each backward with central finite
// differences of loss = sum(y * r) for a fixed random r (for the loss ops, of the loss itself),
// and every backward is called twice to prove it accumulates. Calls cpu_* directly.
#include <omp.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include "testlib.h"
#include "../kernels/ops.h"

// fp32 op vs double reference: a handful of fp32 roundings (2^-24 ~ 6e-8 each) per output;
// a wrong index or weight is off by 1e-2 or more.
#define FWD_TOL 1e-5
// Values worked out by hand (resize): weights are 1/4, 3/4, 1/2 or 2/3-ish, results are exact
// or within a few fp32 ulps of numbers below 16.
#define HAND_TOL 1e-5f
// A backward run twice must give twice the first result; the second pass adds onto nonzero
// values, so only rounding (relative ~1e-7) separates them.
#define ACCUM_TOL 1e-6
// dloss used by the loss backward tests: not 1, so a missing dloss factor shows.
#define DLOSS 0.7f


static Tensor *test_clone(const Tensor *t) {
    Tensor *c = test_like(t);
    memcpy(c->data, t->data, t->numel * sizeof(float));
    return c;
}

static Tensor *test_scalar(float v) {
    Tensor *t = test_tensor(1, 1);
    tensor_f32(t)[0] = v;
    return t;
}

static void assert_close_ref(const char *what, const Tensor *got, const double *ref) {
    float *r = malloc(got->numel * sizeof(float));
    for (size_t i = 0; i < got->numel; i++) r[i] = (float)ref[i];
    double err = test_rel_err(got->data, r, got->numel);
    printf("    forward   %-28s rel err %.2e\n", what, err);
    free(r);
    assert_true(err < FWD_TOL);
}

static void assert_grad(const char *what, TestLossFn loss, void *user, Tensor *x,
                        const Tensor *analytic) {
    assert_true(test_gradcheck(what, loss, user, x, analytic) < GRAD_TOL);
}

// `twice` holds a gradient after two backward calls, `once` a copy after the first.
static void assert_doubled(const Tensor *twice, const Tensor *once) {
    Tensor *expect = test_clone(once);
    for (size_t i = 0; i < expect->numel; i++) tensor_f32(expect)[i] *= 2.0f;
    assert_true(test_rel_err(twice->data, expect->data, twice->numel) < ACCUM_TOL);
    test_tensor_free(expect);
}

// ---- elementwise -------------------------------------------------------------------------------

static void test_zero_accumulate_add_scale_match_reference(void **state) {
    Ctx ctx = ctx_cpu();
    Tensor *a = test_tensor(3, 2, 7, 6), *b = test_like(a), *y = test_like(a);
    test_fill(a, 1, -1, 1);
    test_fill(b, 2, -1, 1);
    double *ref = malloc(a->numel * sizeof(double));
    const float *pa = a->data, *pb = b->data;

    cpu_add_fwd(&ctx, a, b, y);
    for (size_t i = 0; i < a->numel; i++) ref[i] = (double)pa[i] + pb[i];
    assert_close_ref("add", y, ref);

    cpu_scale_fwd(&ctx, a, -1.5f, y);
    for (size_t i = 0; i < a->numel; i++) ref[i] = -1.5 * pa[i];
    assert_close_ref("scale", y, ref);

    cpu_accumulate(&ctx, b, y);   // y = -1.5 a + b
    for (size_t i = 0; i < a->numel; i++) ref[i] = -1.5 * pa[i] + pb[i];
    assert_close_ref("accumulate", y, ref);

    cpu_zero(&ctx, y);
    for (size_t i = 0; i < y->numel; i++) assert_true(tensor_f32(y)[i] == 0.0f);
    free(ref);
    test_tensor_free(a); test_tensor_free(b); test_tensor_free(y);
}

typedef struct { Tensor *x, *y, *r; float s; } ScaleCase;
static double scale_loss(void *u) {
    ScaleCase *c = u;
    Ctx ctx = ctx_cpu();
    cpu_scale_fwd(&ctx, c->x, c->s, c->y);
    return test_dot(c->y, c->r);
}

static void test_scale_backward_matches_finite_differences(void **state) {
    Ctx ctx = ctx_cpu();
    ScaleCase c = {test_tensor(3, 2, 7, 6), NULL, NULL, 0.37f};
    c.y = test_like(c.x);
    c.r = test_like(c.x);
    test_fill(c.x, 3, -1, 1);
    test_fill(c.r, 4, -1, 1);
    Tensor *dx = test_like(c.x);
    cpu_scale_bwd(&ctx, c.r, c.s, dx);
    assert_grad("scale dx", scale_loss, &c, c.x, dx);
    Tensor *once = test_clone(dx);
    cpu_scale_bwd(&ctx, c.r, c.s, dx);
    assert_doubled(dx, once);
    cpu_scale_bwd(&ctx, c.r, c.s, NULL);   // NULL gradient: skipped
    test_tensor_free(once); test_tensor_free(dx); test_tensor_free(c.x); test_tensor_free(c.y); test_tensor_free(c.r);
}

// x (2,7,6) + pos_embed p (7,6): R = 2 rows of P = 42.
typedef struct { Tensor *x, *p, *y, *r; } BcastCase;
static double bcast_loss(void *u) {
    BcastCase *c = u;
    Ctx ctx = ctx_cpu();
    cpu_add_bcast_fwd(&ctx, c->x, c->p, c->y);
    return test_dot(c->y, c->r);
}

static void test_add_bcast_matches_reference_and_finite_differences(void **state) {
    Ctx ctx = ctx_cpu();
    BcastCase c = {test_tensor(3, 2, 7, 6), test_tensor(2, 7, 6), NULL, NULL};
    c.y = test_like(c.x);
    c.r = test_like(c.x);
    test_fill(c.x, 5, -1, 1);
    test_fill(c.p, 6, -1, 1);
    test_fill(c.r, 7, -1, 1);

    bcast_loss(&c);
    double ref[84];
    for (int r = 0; r < 2; r++)
        for (int i = 0; i < 42; i++)
            ref[r * 42 + i] = (double)tensor_f32(c.x)[r * 42 + i] + tensor_f32(c.p)[i];
    assert_close_ref("add_bcast", c.y, ref);

    Tensor *dx = test_like(c.x), *dp = test_like(c.p);
    cpu_add_bcast_bwd(&ctx, c.r, dx, dp);
    assert_grad("add_bcast dx", bcast_loss, &c, c.x, dx);
    assert_grad("add_bcast dp", bcast_loss, &c, c.p, dp);
    Tensor *dx1 = test_clone(dx), *dp1 = test_clone(dp);
    cpu_add_bcast_bwd(&ctx, c.r, dx, dp);
    assert_doubled(dx, dx1);
    assert_doubled(dp, dp1);
    cpu_add_bcast_bwd(&ctx, c.r, NULL, dp);   // dx not needed
    cpu_add_bcast_bwd(&ctx, c.r, dx, NULL);   // dp not needed
    for (size_t i = 0; i < dp->numel; i++)
        assert_float_equal(tensor_f32(dp)[i], 3.0f * tensor_f32(dp1)[i], 1e-5f);
    test_tensor_free(dx); test_tensor_free(dp); test_tensor_free(dx1); test_tensor_free(dp1);
    test_tensor_free(c.x); test_tensor_free(c.p); test_tensor_free(c.y); test_tensor_free(c.r);
}

// y = x copied, colsum += the sums of x's rows, by hand on a (3, 2) x.
static void test_cast_colsum_copies_and_sums_columns(void **state) {
    Ctx ctx = ctx_cpu();
    Tensor *x = test_tensor(2, 3, 2), *y = test_like(x), *cs = test_tensor(1, 2);
    const float xv[6] = {1.5f, -2.0f, 0.25f, 4.0f, -3.0f, 0.5f};
    memcpy(x->data, xv, sizeof xv);
    tensor_f32(cs)[0] = 10.0f;
    tensor_f32(cs)[1] = -1.0f;
    cpu_cast_colsum(&ctx, x, y, cs);
    for (int i = 0; i < 6; i++) assert_float_equal(tensor_f32(y)[i], xv[i], 0.0f);
    assert_float_equal(tensor_f32(cs)[0], 10.0f + 1.5f + 0.25f - 3.0f, 1e-6f);
    assert_float_equal(tensor_f32(cs)[1], -1.0f - 2.0f + 4.0f + 0.5f, 1e-6f);
    cpu_cast_colsum(&ctx, x, y, NULL);   // the copy alone
    assert_float_equal(tensor_f32(cs)[0], 8.75f, 1e-6f);
    test_tensor_free(x); test_tensor_free(y); test_tensor_free(cs);
}

// x (2,7,6) * gamma (6)
typedef struct { Tensor *x, *g, *y, *r; } LayerScaleCase;
static double layer_scale_loss(void *u) {
    LayerScaleCase *c = u;
    Ctx ctx = ctx_cpu();
    cpu_layer_scale_fwd(&ctx, c->x, c->g, c->y);
    return test_dot(c->y, c->r);
}

static void test_layer_scale_matches_reference_and_finite_differences(void **state) {
    Ctx ctx = ctx_cpu();
    LayerScaleCase c = {test_tensor(3, 2, 7, 6), test_tensor(1, 6), NULL, NULL};
    c.y = test_like(c.x);
    c.r = test_like(c.x);
    test_fill(c.x, 8, -1, 1);
    test_fill(c.g, 9, -1, 1);
    test_fill(c.r, 10, -1, 1);

    layer_scale_loss(&c);
    double ref[84];
    for (int i = 0; i < 84; i++) ref[i] = (double)tensor_f32(c.x)[i] * tensor_f32(c.g)[i % 6];
    assert_close_ref("layer_scale", c.y, ref);

    Tensor *dx = test_like(c.x), *dg = test_like(c.g);
    cpu_layer_scale_bwd(&ctx, c.r, c.x, c.g, dx, dg);
    assert_grad("layer_scale dx", layer_scale_loss, &c, c.x, dx);
    assert_grad("layer_scale dg", layer_scale_loss, &c, c.g, dg);
    Tensor *dx1 = test_clone(dx), *dg1 = test_clone(dg);
    cpu_layer_scale_bwd(&ctx, c.r, c.x, c.g, dx, dg);
    assert_doubled(dx, dx1);
    assert_doubled(dg, dg1);
    cpu_layer_scale_bwd(&ctx, c.r, c.x, c.g, NULL, NULL);
    test_tensor_free(dx); test_tensor_free(dg); test_tensor_free(dx1); test_tensor_free(dg1);
    test_tensor_free(c.x); test_tensor_free(c.g); test_tensor_free(c.y); test_tensor_free(c.r);
}

// ---- token layout ------------------------------------------------------------------------------

// prefix (2,6) + x (2,7,6) -> y (2,9,6)
typedef struct { Tensor *prefix, *x, *y, *r; } ConcatCase;
static double concat_loss(void *u) {
    ConcatCase *c = u;
    Ctx ctx = ctx_cpu();
    cpu_concat_prefix_fwd(&ctx, c->prefix, c->x, c->y);
    return test_dot(c->y, c->r);
}

static void test_concat_prefix_matches_reference_and_finite_differences(void **state) {
    Ctx ctx = ctx_cpu();
    ConcatCase c = {test_tensor(2, 2, 6), test_tensor(3, 2, 7, 6), test_tensor(3, 2, 9, 6), NULL};
    c.r = test_like(c.y);
    test_fill(c.prefix, 11, -1, 1);
    test_fill(c.x, 12, -1, 1);
    test_fill(c.r, 13, -1, 1);

    concat_loss(&c);
    double ref[2 * 9 * 6];
    for (int b = 0; b < 2; b++)
        for (int n = 0; n < 9; n++)
            for (int ch = 0; ch < 6; ch++)
                ref[(b * 9 + n) * 6 + ch] = n < 2 ? tensor_f32(c.prefix)[n * 6 + ch]
                                                  : tensor_f32(c.x)[(b * 7 + n - 2) * 6 + ch];
    assert_close_ref("concat_prefix", c.y, ref);

    Tensor *dp = test_like(c.prefix), *dx = test_like(c.x);
    cpu_concat_prefix_bwd(&ctx, c.r, dp, dx);
    assert_grad("concat_prefix dprefix", concat_loss, &c, c.prefix, dp);
    assert_grad("concat_prefix dx", concat_loss, &c, c.x, dx);
    Tensor *dp1 = test_clone(dp), *dx1 = test_clone(dx);
    cpu_concat_prefix_bwd(&ctx, c.r, dp, dx);
    assert_doubled(dp, dp1);
    assert_doubled(dx, dx1);
    // Either gradient alone: the prefix length comes from the other one.
    cpu_concat_prefix_bwd(&ctx, c.r, NULL, dx);
    cpu_concat_prefix_bwd(&ctx, c.r, dp, NULL);
    for (size_t i = 0; i < dx->numel; i++)
        assert_float_equal(tensor_f32(dx)[i], 3.0f * tensor_f32(dx1)[i], 1e-5f);
    for (size_t i = 0; i < dp->numel; i++)
        assert_float_equal(tensor_f32(dp)[i], 3.0f * tensor_f32(dp1)[i], 1e-5f);
    test_tensor_free(dp); test_tensor_free(dx); test_tensor_free(dp1); test_tensor_free(dx1);
    test_tensor_free(c.prefix); test_tensor_free(c.x); test_tensor_free(c.y); test_tensor_free(c.r);
}

// x (2,7,6)[:, 2:5] -> y (2,3,6)
#define SLICE_START 2
typedef struct { Tensor *x, *y, *r; } SliceCase;
static double slice_loss(void *u) {
    SliceCase *c = u;
    Ctx ctx = ctx_cpu();
    cpu_slice_tokens_fwd(&ctx, c->x, SLICE_START, c->y);
    return test_dot(c->y, c->r);
}

static void test_slice_tokens_matches_reference_and_finite_differences(void **state) {
    Ctx ctx = ctx_cpu();
    SliceCase c = {test_tensor(3, 2, 7, 6), test_tensor(3, 2, 3, 6), NULL};
    c.r = test_like(c.y);
    test_fill(c.x, 14, -1, 1);
    test_fill(c.r, 15, -1, 1);

    slice_loss(&c);
    double ref[2 * 3 * 6];
    for (int b = 0; b < 2; b++)
        for (int i = 0; i < 18; i++) ref[b * 18 + i] = tensor_f32(c.x)[(b * 7 + SLICE_START) * 6 + i];
    assert_close_ref("slice_tokens", c.y, ref);

    Tensor *dx = test_like(c.x);
    cpu_slice_tokens_bwd(&ctx, c.r, SLICE_START, dx);
    assert_grad("slice_tokens dx", slice_loss, &c, c.x, dx);
    Tensor *dx1 = test_clone(dx);
    cpu_slice_tokens_bwd(&ctx, c.r, SLICE_START, dx);
    assert_doubled(dx, dx1);
    test_tensor_free(dx); test_tensor_free(dx1); test_tensor_free(c.x); test_tensor_free(c.y); test_tensor_free(c.r);
}

// x (2,7,6) -> y (2,6); also a (2,3,5,6) grid, whose 15 tokens are averaged the same way.
typedef struct { Tensor *x, *y, *r; } MeanCase;
static double mean_loss(void *u) {
    MeanCase *c = u;
    Ctx ctx = ctx_cpu();
    cpu_mean_tokens_fwd(&ctx, c->x, c->y);
    return test_dot(c->y, c->r);
}

static void check_mean_tokens(Tensor *x, const char *what) {
    Ctx ctx = ctx_cpu();
    int B = x->shape[0], C = tensor_last(x), N = (int)(x->numel / (size_t)(B * C));
    MeanCase c = {x, test_tensor(2, B, C), NULL};
    c.r = test_like(c.y);
    test_fill(c.x, 16, -1, 1);
    test_fill(c.r, 17, -1, 1);

    mean_loss(&c);
    double *ref = calloc((size_t)(B * C), sizeof(double));
    for (int b = 0; b < B; b++)
        for (int n = 0; n < N; n++)
            for (int ch = 0; ch < C; ch++) ref[b * C + ch] += tensor_f32(x)[(b * N + n) * C + ch] / (double)N;
    assert_close_ref(what, c.y, ref);
    free(ref);

    Tensor *dx = test_like(c.x);
    cpu_mean_tokens_bwd(&ctx, c.r, dx);
    assert_grad(what, mean_loss, &c, c.x, dx);
    Tensor *dx1 = test_clone(dx);
    cpu_mean_tokens_bwd(&ctx, c.r, dx);
    assert_doubled(dx, dx1);
    test_tensor_free(dx); test_tensor_free(dx1); test_tensor_free(c.y); test_tensor_free(c.r);
}

static void test_mean_tokens_matches_reference_and_finite_differences(void **state) {
    Tensor *x = test_tensor(3, 2, 7, 6), *grid = test_tensor(4, 2, 3, 5, 6);
    check_mean_tokens(x, "mean_tokens (B,N,C)");
    check_mean_tokens(grid, "mean_tokens (B,H,W,C)");
    test_tensor_free(x); test_tensor_free(grid);
}

// ---- attention pooling ------------------------------------------------------------------------

// The shapes kernels/tokens_shape.h refuses, on either backend: y one token short of prefix + x,
// a prefix gradient whose width is not dy's, a slice past the end, a mean of the wrong size, a
// bf16 tensor given to the CPU.
static void prefix_y_one_token_short(void) {
    Ctx ctx = ctx_cpu();
    Tensor *p = test_tensor(2, 1, 4), *x = test_tensor(3, 2, 5, 4), *y = test_tensor(3, 2, 5, 4);
    cpu_concat_prefix_fwd(&ctx, p, x, y);
}
static void prefix_grad_width_differs(void) {
    Ctx ctx = ctx_cpu();
    Tensor *dy = test_tensor(3, 2, 6, 4), *dp = test_tensor(2, 1, 3);
    cpu_concat_prefix_bwd(&ctx, dy, dp, NULL);
}
static void slice_past_the_end(void) {
    Ctx ctx = ctx_cpu();
    Tensor *x = test_tensor(3, 2, 5, 4), *y = test_tensor(3, 2, 3, 4);
    cpu_slice_tokens_fwd(&ctx, x, 3, y);
}
static void mean_of_the_wrong_size(void) {
    Ctx ctx = ctx_cpu();
    Tensor *x = test_tensor(3, 2, 5, 4), *y = test_tensor(2, 2, 5);
    cpu_mean_tokens_fwd(&ctx, x, y);
}
static void tokens_in_bf16_on_the_cpu(void) {
    Ctx ctx = ctx_cpu();
    Tensor *x = test_tensor(3, 2, 5, 4), *y = test_tensor(2, 2, 4);
    x->dtype = DTYPE_BF16;
    cpu_mean_tokens_fwd(&ctx, x, y);
}

static void test_token_ops_reject_bad_shapes_with_a_message(void **state) {
    expect_stop(prefix_y_one_token_short, (const char *[]){"concat_prefix_fwd", "y 2 x 5 x 4", NULL});
    expect_stop(prefix_grad_width_differs, (const char *[]){"concat_prefix_bwd", "dprefix has last dim 3", NULL});
    expect_stop(slice_past_the_end, (const char *[]){"slice_tokens_fwd", "tokens 3..6 of 5", NULL});
    expect_stop(mean_of_the_wrong_size, (const char *[]){"mean_tokens_fwd", "y has 10 elements", NULL});
    expect_stop(tokens_in_bf16_on_the_cpu, (const char *[]){"mean_tokens_fwd", "x is a bf16 tensor", NULL});
}

// One query shared by every token: full self-attention over rows q | k_n | v_n gives every row
// the pooled output, so the tested attention op is the reference.
static void test_attention_pool_equals_attention_with_the_query_in_every_row(void **state) {
    Ctx ctx = ctx_cpu();
    enum { B = 2, N = 9, C = 12, HEADS = 3 };
    Tensor *q = test_tensor(1, C), *kv = test_tensor(3, B, N, 2 * C), *y = test_tensor(2, B, C);
    test_fill(q, 71, -1.5f, 1.5f);
    test_fill(kv, 72, -1.5f, 1.5f);
    Tensor *qkv = test_tensor(3, B, N, 3 * C), *out = test_tensor(3, B, N, C);
    Tensor *lse = test_tensor(3, B, HEADS, N);
    for (int r = 0; r < B * N; r++) {
        memcpy(tensor_f32(qkv) + (size_t)r * 3 * C, q->data, C * sizeof(float));
        memcpy(tensor_f32(qkv) + (size_t)r * 3 * C + C, tensor_f32(kv) + (size_t)r * 2 * C,
               2 * C * sizeof(float));
    }
    cpu_attention_pool_fwd(&ctx, q, kv, HEADS, y);
    cpu_attention_fwd(&ctx, qkv, HEADS, out, lse);
    for (int b = 0; b < B; b++)
        for (int n = 0; n < N; n++)
            for (int c = 0; c < C; c++)
                assert_float_equal(tensor_f32(y)[b * C + c], tensor_f32(out)[((size_t)b * N + n) * C + c],
                                   1e-5);
    test_tensor_free(q); test_tensor_free(kv); test_tensor_free(y);
    test_tensor_free(qkv); test_tensor_free(out); test_tensor_free(lse);
}

// ---- depthwise convolution ------------------------------------------------------------------------

typedef struct DwCase {
    Tensor *x, *w, *b, *y, *r;   // loss = sum(y * r)
    int flags;                   // DWCONV_RESIDUAL: y = x + dwconv(x)
} DwCase;

static double dw_loss(void *user) {
    DwCase *c = user;
    Ctx ctx = ctx_cpu();
    cpu_dwconv_fwd(&ctx, c->x, NULL, NULL, NULL, c->w, c->b, c->flags & DWCONV_RESIDUAL, NULL, c->y);
    double s = 0;
    for (size_t i = 0; i < c->y->numel; i++) s += (double)tensor_f32(c->y)[i] * tensor_f32(c->r)[i];
    return s;
}

// Forward against a scatter-form reference (every input pixel adds into the outputs it reaches),
// backward against finite differences for x, w and b. flags: DWCONV_RESIDUAL adds x to the
// reference (and dy to dx); DWCONV_WRITE_DX starts dx from values the op must ignore.
static void check_dwconv(int B, int H, int W, int C, int k, int flags) {
    Ctx ctx = ctx_cpu();
    DwCase c = {test_tensor(4, B, H, W, C), test_tensor(4, C, 1, k, k), test_tensor(1, C),
                test_tensor(4, B, H, W, C), test_tensor(4, B, H, W, C), flags};
    test_fill(c.x, 81, -1, 1);
    test_fill(c.w, 82, -1, 1);
    test_fill(c.b, 83, -1, 1);
    test_fill(c.r, 84, -1, 1);
    dw_loss(&c);
    double *ref = calloc(c.y->numel, sizeof(double));
    int p = k / 2;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int w = 0; w < W; w++)
                for (int ch = 0; ch < C; ch++) {
                    double v = tensor_f32(c.x)[(((size_t)b * H + h) * W + w) * C + ch];
                    ref[(((size_t)b * H + h) * W + w) * C + ch] +=
                        tensor_f32(c.b)[ch] + (flags & DWCONV_RESIDUAL ? v : 0.0);
                    for (int i = 0; i < k; i++)       // output (h - i + p, w - j + p) reads this
                        for (int j = 0; j < k; j++) {   // pixel through tap (i, j)
                            int ho = h - i + p, wo = w - j + p;
                            if (ho < 0 || ho >= H || wo < 0 || wo >= W) continue;
                            ref[(((size_t)b * H + ho) * W + wo) * C + ch] +=
                                v * tensor_f32(c.w)[((size_t)ch * k + i) * k + j];
                        }
                }
    char what[64];
    snprintf(what, sizeof what, "dwconv k%d (%d,%d,%d,%d) flags %d", k, B, H, W, C, flags);
    assert_close_ref(what, c.y, ref);
    free(ref);
    Tensor *dx = test_like(c.x), *dw = test_like(c.w), *db = test_like(c.b);
    if (flags & DWCONV_WRITE_DX) test_fill(dx, 85, 5, 9);   // stale values, to be overwritten
    cpu_dwconv_bwd(&ctx, c.r, c.x, c.w, flags, dx, dw, db);
    assert_grad("dwconv dx", dw_loss, &c, c.x, dx);
    assert_grad("dwconv dw", dw_loss, &c, c.w, dw);
    assert_grad("dwconv db", dw_loss, &c, c.b, db);
    Tensor *t[] = {c.x, c.w, c.b, c.y, c.r, dx, dw, db};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) test_tensor_free(t[i]);
}

static void test_dwconv_matches_reference_and_finite_differences(void **state) {
    check_dwconv(2, 5, 7, 3, 3, 0);
    check_dwconv(1, 6, 4, 2, 5, 0);
    check_dwconv(1, 2, 3, 4, 3, 0);   // smaller than the kernel's reach
    check_dwconv(2, 5, 7, 3, 3, DWCONV_RESIDUAL);
    check_dwconv(1, 6, 4, 2, 5, DWCONV_RESIDUAL | DWCONV_WRITE_DX);
}

// DWCONV_SILU: y = silu(conv(x) + b), against SiLU's formula in double on the plain output.
static void test_dwconv_silu_is_silu_of_the_convolution(void **state) {
    Ctx ctx = ctx_cpu();
    Tensor *x = test_tensor(4, 2, 6, 5, 3), *w = test_tensor(4, 3, 1, 5, 5), *b = test_tensor(1, 3);
    Tensor *y = test_like(x), *ys = test_like(x);
    test_fill(x, 91, -2, 2);
    test_fill(w, 92, -1, 1);
    test_fill(b, 93, -1, 1);
    cpu_dwconv_fwd(&ctx, x, NULL, NULL, NULL, w, b, 0, NULL, y);
    cpu_dwconv_fwd(&ctx, x, NULL, NULL, NULL, w, b, DWCONV_SILU, NULL, ys);
    double worst = 0, scale = 0;
    for (size_t i = 0; i < y->numel; i++) {
        double v = tensor_f32(y)[i], want = v / (1.0 + exp(-v));
        worst = fmax(worst, fabs(tensor_f32(ys)[i] - want));
        scale = fmax(scale, fabs(want));
    }
    assert_true(worst <= 1e-6 * scale);   // fp32's expf and division: a few ulps
    Tensor *t[] = {x, w, b, y, ys};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) test_tensor_free(t[i]);
}

// The added input: y = x' + b + taps(x') with x' = x + u uw^T + ub, against the formula in double
// (mid: x' itself); without mid the same y.
static void test_dwconv_added_input_convolves_the_stream_plus_the_product(void **state) {
    Ctx ctx = ctx_cpu();
    enum { B = 2, H = 5, W = 6, C = 4, KU = 2, K = 3 };
    Tensor *x = test_tensor(4, B, H, W, C), *u = test_tensor(4, B, H, W, KU), *uw = test_tensor(2, C, KU);
    Tensor *ub = test_tensor(1, C), *w = test_tensor(4, C, 1, K, K), *b = test_tensor(1, C);
    Tensor *mid = test_like(x), *y = test_like(x), *y2 = test_like(x);
    test_fill(x, 101, -1, 1);
    test_fill(u, 102, -2, 2);
    test_fill(uw, 103, -1, 1);
    test_fill(ub, 104, -1, 1);
    test_fill(w, 105, -1, 1);
    test_fill(b, 106, -1, 1);
    cpu_dwconv_fwd(&ctx, x, u, uw, ub, w, b, DWCONV_RESIDUAL, mid, y);
    cpu_dwconv_fwd(&ctx, x, u, uw, ub, w, b, DWCONV_RESIDUAL, NULL, y2);
    double *xp = calloc(x->numel, sizeof(double)), *ref = calloc(x->numel, sizeof(double));
    for (size_t px = 0; px < x->numel / C; px++)
        for (int c = 0; c < C; c++) {
            double v = tensor_f32(x)[px * C + c] + tensor_f32(ub)[c];
            for (int k = 0; k < KU; k++) v += (double)tensor_f32(u)[px * KU + k] * tensor_f32(uw)[c * KU + k];
            xp[px * C + c] = v;
        }
    for (int bi = 0; bi < B; bi++)
        for (int h = 0; h < H; h++)
            for (int wx = 0; wx < W; wx++)
                for (int c = 0; c < C; c++) {
                    const size_t o = (((size_t)bi * H + h) * W + wx) * C + c;
                    double v = xp[o] + tensor_f32(b)[c];
                    for (int i = 0; i < K; i++)
                        for (int j = 0; j < K; j++) {
                            int hh = h + i - K / 2, ww = wx + j - K / 2;
                            if (hh < 0 || hh >= H || ww < 0 || ww >= W) continue;
                            v += tensor_f32(w)[(c * K + i) * K + j] * xp[(((size_t)bi * H + hh) * W + ww) * C + c];
                        }
                    ref[o] = v;
                }
    assert_close_ref("dwconv added input: mid", mid, xp);
    assert_close_ref("dwconv added input: y", y, ref);
    assert_memory_equal(y->data, y2->data, tensor_bytes(y));
    free(xp);
    free(ref);
    Tensor *t[] = {x, u, uw, ub, w, b, mid, y, y2};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) test_tensor_free(t[i]);
}

static void dwconv_added_input_of_five_channels(void) {
    Ctx ctx = ctx_cpu();
    Tensor *x = test_tensor(4, 1, 3, 3, 2), *w = test_tensor(4, 2, 1, 3, 3), *y = test_like(x);
    Tensor *u = test_tensor(4, 1, 3, 3, 5), *uw = test_tensor(2, 2, 5);
    cpu_dwconv_fwd(&ctx, x, u, uw, NULL, w, NULL, DWCONV_RESIDUAL, NULL, y);
}

static void dwconv_silu_with_residual(void) {
    Ctx ctx = ctx_cpu();
    Tensor *x = test_tensor(4, 1, 3, 3, 2), *w = test_tensor(4, 2, 1, 3, 3), *y = test_like(x);
    cpu_dwconv_fwd(&ctx, x, NULL, NULL, NULL, w, NULL, DWCONV_SILU | DWCONV_RESIDUAL, NULL, y);
}

static void dwconv_backward_of_silu(void) {
    Ctx ctx = ctx_cpu();
    Tensor *x = test_tensor(4, 1, 3, 3, 2), *w = test_tensor(4, 2, 1, 3, 3), *dx = test_like(x);
    cpu_dwconv_bwd(&ctx, test_like(x), x, w, DWCONV_SILU, dx, NULL, NULL);
}

// Flags an op does not take stop with a message naming the op and the flags (kernels/
// dwconv_shape.h, shared with the CUDA op; run in a child process).
static void test_dwconv_rejects_flags_it_does_not_take(void **state) {
    expect_stop(dwconv_silu_with_residual, (const char *[]){"dwconv_fwd", "flags 5", NULL});
    expect_stop(dwconv_backward_of_silu, (const char *[]){"dwconv_bwd", "flags 4", NULL});
    expect_stop(dwconv_added_input_of_five_channels, (const char *[]){"dwconv_fwd", "u (1, 3, 3, 5)", NULL});
}

// ---- convolution ------------------------------------------------------------------------------

// conv2d_fwd against a direct convolution, and conv2d_bwd as its adjoint for random dy = r:
// <conv(x) - b, r> = <x, dx> = <w, dw> (the convolution is linear in x and in w) and db = the sums
// of r; dx written (CONV2D_WRITE_DX, over garbage) equals dx added to zeros, bitwise.
static void check_conv(int nchw, int B, int C, int H, int W, int Cout, int k, int s, int p) {
    Ctx ctx = ctx_cpu();
    Tensor *x = nchw ? test_tensor(4, B, C, H, W) : test_tensor(4, B, H, W, C);
    int Ho = (H + 2 * p - k) / s + 1, Wo = (W + 2 * p - k) / s + 1;
    Tensor *cols = test_tensor(2, B * Ho * Wo, C * k * k), *w = test_tensor(4, Cout, C, k, k);
    Tensor *bias = test_tensor(1, Cout), *y = test_tensor(4, B, Ho, Wo, Cout);
    test_fill(x, 91, -1, 1);
    test_fill(w, 92, -1, 1);
    test_fill(bias, 93, -1, 1);
    cpu_conv2d_fwd(&ctx, x, w, bias, nchw, s, p, NULL, cols, y);
    double *ref = calloc(y->numel, sizeof(double));
    for (int b = 0; b < B; b++)
        for (int ho = 0; ho < Ho; ho++)
            for (int wo = 0; wo < Wo; wo++)
                for (int o = 0; o < Cout; o++) {
                    double acc = tensor_f32(bias)[o];
                    for (int c = 0; c < C; c++)
                        for (int ky = 0; ky < k; ky++)
                            for (int kx = 0; kx < k; kx++) {
                                int h = ho * s + ky - p, wx = wo * s + kx - p;
                                if (h < 0 || h >= H || wx < 0 || wx >= W) continue;
                                size_t xi = nchw ? (((size_t)b * C + c) * H + h) * W + wx
                                                 : (((size_t)b * H + h) * W + wx) * C + c;
                                acc += tensor_f32(x)[xi] * tensor_f32(w)[((size_t)o * C + c) * k * k + ky * k + kx];
                            }
                    ref[(((size_t)b * Ho + ho) * Wo + wo) * Cout + o] = acc;
                }
    char what[80];
    snprintf(what, sizeof what, "conv k%d s%d p%d %s", k, s, p, nchw ? "NCHW" : "NHWC");
    assert_close_ref(what, y, ref);
    Tensor *r = test_like(y), *dx = test_like(x), *dx_w = test_like(x), *dw = test_like(w);
    Tensor *db = test_like(bias);
    test_fill(r, 94, -1, 1);
    test_fill(dx_w, 95, -1e3, 1e3);   // garbage the written dx must not read
    cpu_conv2d_bwd(&ctx, r, cols, w, nchw, s, p, 0, dx, dw, db);
    cpu_conv2d_bwd(&ctx, r, cols, w, nchw, s, p, CONV2D_WRITE_DX, dx_w, NULL, NULL);
    assert_memory_equal(dx->data, dx_w->data, x->numel * sizeof(float));
    double lhs = 0, rhs_x = 0, rhs_w = 0;
    for (size_t i = 0; i < y->numel; i++)
        lhs += (ref[i] - tensor_f32(bias)[i % Cout]) * tensor_f32(r)[i];
    for (size_t i = 0; i < x->numel; i++) rhs_x += (double)tensor_f32(x)[i] * tensor_f32(dx)[i];
    for (size_t i = 0; i < w->numel; i++) rhs_w += (double)tensor_f32(w)[i] * tensor_f32(dw)[i];
    printf("    adjoint   %-28s %.9g vs dx %.9g, dw %.9g\n", what, lhs, rhs_x, rhs_w);
    // fp32 sums of at most a few hundred products of values in [-1, 1]: 1e-5 relative
    assert_true(fabs(lhs - rhs_x) <= 1e-5 * (fabs(lhs) + 1));
    assert_true(fabs(lhs - rhs_w) <= 1e-5 * (fabs(lhs) + 1));
    for (int o = 0; o < Cout; o++) {
        double sum = 0;
        for (size_t i = o; i < r->numel; i += Cout) sum += tensor_f32(r)[i];
        assert_true(fabs(sum - tensor_f32(db)[o]) <= 1e-5 * (fabs(sum) + 1));
    }
    free(ref);
    Tensor *t[] = {x, cols, w, bias, y, r, dx, dx_w, dw, db};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) test_tensor_free(t[i]);
}

static void test_conv2d_matches_direct_and_its_adjoint(void **state) {
    check_conv(1, 2, 3, 9, 8, 5, 3, 2, 1);   // a stem: NCHW image, 3x3 stride 2
    check_conv(0, 2, 4, 7, 6, 6, 3, 2, 1);   // downsampling, channels-last
    check_conv(0, 1, 3, 8, 8, 4, 2, 2, 0);   // 2x2 stride 2 (patch merging)
    check_conv(0, 1, 2, 5, 5, 3, 3, 1, 1);   // stride 1: every input in up to 9 windows
}

// The shapes kernels/conv2d_shape.h refuses, on either backend: a weight of other channels than
// x, a non-square kernel, y of the wrong grid, a column matrix one row short, a kernel larger
// than the padded image. Each runs in a child process (expect_stop).
static void conv_fwd_of(Tensor *x, Tensor *w, Tensor *y, int stride, int pad) {
    Ctx ctx = ctx_cpu();
    cpu_conv2d_fwd(&ctx, x, w, NULL, 0, stride, pad, NULL, NULL, y);
}
static void conv_channels_differ(void) {
    conv_fwd_of(test_tensor(4, 1, 6, 6, 4), test_tensor(4, 8, 3, 3, 3), test_tensor(4, 1, 3, 3, 8), 2, 1);
}
static void conv_kernel_not_square(void) {
    conv_fwd_of(test_tensor(4, 1, 6, 6, 4), test_tensor(4, 8, 4, 3, 2), test_tensor(4, 1, 3, 3, 8), 2, 1);
}
static void conv_output_grid_wrong(void) {
    conv_fwd_of(test_tensor(4, 1, 6, 6, 4), test_tensor(4, 8, 4, 3, 3), test_tensor(4, 1, 6, 6, 8), 2, 1);
}
static void conv_kernel_past_the_padding(void) {
    conv_fwd_of(test_tensor(4, 1, 2, 2, 4), test_tensor(4, 8, 4, 5, 5), test_tensor(4, 1, 1, 1, 8), 1, 1);
}
static void conv_cols_one_row_short(void) {
    Ctx ctx = ctx_cpu();
    Tensor *dy = test_tensor(4, 1, 3, 3, 8), *w = test_tensor(4, 8, 4, 3, 3), *cols = test_tensor(2, 8, 36),
           *dw = test_tensor(4, 8, 4, 3, 3);
    cpu_conv2d_bwd(&ctx, dy, cols, w, 0, 2, 1, 0, NULL, dw, NULL);
}

static void conv_dx_channels_differ(void) {   // the backward names dx, not x
    Ctx ctx = ctx_cpu();
    Tensor *dy = test_tensor(4, 1, 3, 3, 8), *w = test_tensor(4, 8, 4, 3, 3), *cols = test_tensor(2, 9, 36),
           *dx = test_tensor(4, 1, 6, 6, 5);
    cpu_conv2d_bwd(&ctx, dy, cols, w, 0, 2, 1, 0, dx, NULL, NULL);
}

static void conv_gelu_without_norm(void) {
    Ctx ctx = ctx_cpu();
    cpu_conv2d_fwd(&ctx, test_tensor(4, 1, 6, 6, 4), test_tensor(4, 8, 4, 3, 3), NULL, 0, 2, 1,
                   &(Conv2dFwdOpts){.gelu_out = 1}, NULL, test_tensor(4, 1, 3, 3, 8));
}
static void conv_norm_with_cols(void) {
    Ctx ctx = ctx_cpu();
    cpu_conv2d_fwd(&ctx, test_tensor(4, 1, 6, 6, 4), test_tensor(4, 8, 4, 3, 3), NULL, 0, 2, 1,
                   &(Conv2dFwdOpts){.ln = 1}, test_tensor(2, 9, 36), test_tensor(4, 1, 3, 3, 8));
}
static void test_conv2d_rejects_bad_shapes_with_a_message(void **state) {
    expect_stop(conv_channels_differ, (const char *[]){"conv2d_fwd", "x has 4 channels, w takes 3", NULL});
    expect_stop(conv_kernel_not_square, (const char *[]){"conv2d_fwd", "expected (Cout, C, k, k)", NULL});
    expect_stop(conv_output_grid_wrong, (const char *[]){"conv2d_fwd", "y has shape", "(1, 3, 3, 8)", NULL});
    expect_stop(conv_cols_one_row_short, (const char *[]){"conv2d_bwd", "cols has 288 elements", NULL});
    expect_stop(conv_kernel_past_the_padding, (const char *[]){"conv2d_fwd", "kernel 5", NULL});
    expect_stop(conv_dx_channels_differ, (const char *[]){"conv2d_bwd", "dx has 5 channels, w takes 4", NULL});
    expect_stop(conv_gelu_without_norm, (const char *[]){"conv2d_fwd", "gelu_out comes only after", NULL});
    expect_stop(conv_norm_with_cols, (const char *[]){"conv2d_fwd", "ln with cols", NULL});
}

// The stem's fusion (opts: ln, then gelu_out): the convolution, layernorm_fwd and gelu_fwd in
// turn, to the bit (the CPU's op runs those three), with the norm's weights and without.
static void test_conv2d_norm_gelu_is_the_three_ops(void **state) {
    Ctx ctx = ctx_cpu();
    Tensor *x = test_tensor(4, 2, 3, 9, 11), *w = test_tensor(4, 16, 3, 3, 3), *b = test_tensor(1, 16);
    Tensor *lw = test_tensor(1, 16), *lb = test_tensor(1, 16), *y = test_tensor(4, 2, 5, 6, 16);
    Tensor *conv = test_like(y), *normed = test_like(y), *want = test_like(y);
    test_fill(x, 111, -1, 1);
    test_fill(w, 112, -1, 1);
    test_fill(b, 113, -1, 1);
    test_fill(lw, 114, 0.5f, 1.5f);
    test_fill(lb, 115, -0.5f, 0.5f);
    cpu_conv2d_fwd(&ctx, x, w, b, 1, 2, 1, NULL, NULL, conv);
    for (int with_w = 0; with_w < 2; with_w++)
        for (int gelu = 0; gelu < 2; gelu++) {
            const Tensor *nw = with_w ? lw : NULL, *nb = with_w ? lb : NULL;
            cpu_layernorm_fwd(&ctx, conv, NULL, nw, nb, 1e-5f, NULL, normed, NULL, NULL);
            if (gelu) cpu_gelu_fwd(&ctx, normed, GELU_ERF, want);
            else memcpy(want->data, normed->data, want->numel * sizeof(float));
            const Conv2dFwdOpts o = {.ln = 1, .ln_w = nw, .ln_b = nb, .ln_eps = 1e-5f, .gelu_out = gelu,
                                     .gelu_kind = GELU_ERF};
            cpu_conv2d_fwd(&ctx, x, w, b, 1, 2, 1, &o, NULL, y);
            assert_memory_equal(y->data, want->data, y->numel * sizeof(float));
        }
    Tensor *t[] = {x, w, b, lw, lb, y, conv, normed, want};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) test_tensor_free(t[i]);
}

// ---- bilinear resize -------------------------------------------------------------------------

// Resizes a single-channel grid given as rows and compares with values known by hand.
static void check_resize_by_hand(int H, int W, const float *in, int H2, int W2, const float *want) {
    Ctx ctx = ctx_cpu();
    Tensor *x = test_tensor(4, 1, H, W, 1), *y = test_tensor(4, 1, H2, W2, 1);
    memcpy(x->data, in, (size_t)(H * W) * sizeof(float));
    cpu_resize_bilinear_fwd(&ctx, x, y);
    for (int i = 0; i < H2 * W2; i++) assert_float_equal(tensor_f32(y)[i], want[i], HAND_TOL);
    test_tensor_free(x); test_tensor_free(y);
}

// Per axis, src = max((dst + 0.5) * in / out - 0.5, 0), i0 = floor(src), i1 = min(i0 + 1, in - 1).
static void test_resize_forward_matches_pytorch_values_by_hand(void **state) {
    // 2x2 -> 4x4 (scale 1/2): src = -0.25 -> 0, 0.25, 0.75, 1.25 (i0 = 1 = in-1: both taps row 1),
    // so each axis maps (a, b) to (a, 3a/4 + b/4, a/4 + 3b/4, b). PyTorch prints the same.
    const float in22[] = {1, 2, 3, 4};
    const float up44[] = {1.0f, 1.25f, 1.75f, 2.0f,
                          1.5f, 1.75f, 2.25f, 2.5f,
                          2.5f, 2.75f, 3.25f, 3.5f,
                          3.0f, 3.25f, 3.75f, 4.0f};
    check_resize_by_hand(2, 2, in22, 4, 4, up44);
    // 4x4 -> 2x2 (scale 2): src = 0.5, 2.5: each output is the mean of a 2x2 block.
    const float in44[] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    const float down22[] = {2.5f, 4.5f, 10.5f, 12.5f};
    check_resize_by_hand(4, 4, in44, 2, 2, down22);
    // 1x3 -> 1x2, non-integer ratio 1.5 along W, H unchanged: src = 0.25, 1.75:
    // (0, 4, 8) -> (0.75*0 + 0.25*4, 0.25*4 + 0.75*8) = (1, 7).
    const float in13[] = {0, 4, 8};
    const float down12[] = {1, 7};
    check_resize_by_hand(1, 3, in13, 1, 2, down12);
    // 2x1 -> 3x1, ratio 2/3: src = -1/6 -> 0, 0.5, 7/6 (i0 = 1 = in-1): (10, 20) -> (10, 15, 20).
    const float in21[] = {10, 20};
    const float up31[] = {10, 15, 20};
    check_resize_by_hand(2, 1, in21, 3, 1, up31);
    // Same size: a copy.
    check_resize_by_hand(4, 4, in44, 4, 4, in44);
}

// Naive reference: one output element at a time, the PyTorch formula in double.
static void ref_axis(int dst, int in, int out, int *i0, int *i1, double *l1) {
    double src = ((double)dst + 0.5) * (double)in / (double)out - 0.5;
    if (src < 0) src = 0;
    *i0 = (int)floor(src);
    if (*i0 > in - 1) *i0 = in - 1;
    *i1 = *i0 + 1 < in ? *i0 + 1 : in - 1;
    *l1 = src - *i0;
}

static double *ref_resize(const Tensor *x, int H2, int W2) {
    int B = x->shape[0], H = x->shape[1], W = x->shape[2], C = x->shape[3];
    const float *px = x->data;
    double *y = malloc((size_t)B * H2 * W2 * C * sizeof(double));
    for (int b = 0; b < B; b++)
        for (int oh = 0; oh < H2; oh++)
            for (int ow = 0; ow < W2; ow++)
                for (int c = 0; c < C; c++) {
                    int h0, h1, w0, w1;
                    double lh, lw;
                    ref_axis(oh, H, H2, &h0, &h1, &lh);
                    ref_axis(ow, W, W2, &w0, &w1, &lw);
#define X(h, w) ((double)px[(((size_t)b * H + (h)) * W + (w)) * C + c])
                    y[(((size_t)b * H2 + oh) * W2 + ow) * C + c] =
                        (1 - lh) * ((1 - lw) * X(h0, w0) + lw * X(h0, w1)) +
                        lh * ((1 - lw) * X(h1, w0) + lw * X(h1, w1));
#undef X
                }
    return y;
}

typedef struct { Tensor *x, *y, *r; } ResizeCase;
static double resize_loss(void *u) {
    ResizeCase *c = u;
    Ctx ctx = ctx_cpu();
    cpu_resize_bilinear_fwd(&ctx, c->x, c->y);
    return test_dot(c->y, c->r);
}

static void check_resize(int B, int H, int W, int C, int H2, int W2, int gradcheck) {
    Ctx ctx = ctx_cpu();
    char what[64];
    snprintf(what, sizeof what, "resize %dx%d->%dx%d", H, W, H2, W2);
    ResizeCase c = {test_tensor(4, B, H, W, C), test_tensor(4, B, H2, W2, C), NULL};
    c.r = test_like(c.y);
    test_fill(c.x, 18, -1, 1);
    test_fill(c.r, 19, -1, 1);

    resize_loss(&c);
    double *ref = ref_resize(c.x, H2, W2);
    assert_close_ref(what, c.y, ref);
    free(ref);

    Tensor *dx = test_like(c.x);
    cpu_resize_bilinear_bwd(&ctx, c.r, dx);
    if (gradcheck) {
        assert_grad(what, resize_loss, &c, c.x, dx);
    } else {   // a linear op's backward is its adjoint: <resize(x), r> = <x, resize^T r>
        double lhs = test_dot(c.y, c.r), rhs = test_dot(c.x, dx);
        printf("    adjoint   %-28s rel err %.2e\n", what, fabs(lhs - rhs) / fabs(lhs));
        assert_true(fabs(lhs - rhs) <= FWD_TOL * fabs(lhs));
    }
    Tensor *dx1 = test_clone(dx);
    cpu_resize_bilinear_bwd(&ctx, c.r, dx);
    assert_doubled(dx, dx1);
    test_tensor_free(dx); test_tensor_free(dx1); test_tensor_free(c.x); test_tensor_free(c.y); test_tensor_free(c.r);
}

// The shapes kernels/resize_shape.h refuses, on either backend: an empty output side, channels
// that differ, a grid that is not 4-D.
static void resize_to_no_rows(void) {
    Ctx ctx = ctx_cpu();
    Tensor *x = test_tensor(4, 1, 3, 3, 2), *y = test_tensor(4, 1, 0, 3, 2);
    cpu_resize_bilinear_fwd(&ctx, x, y);
}
static void resize_channels_differ(void) {
    Ctx ctx = ctx_cpu();
    Tensor *x = test_tensor(4, 1, 3, 3, 2), *y = test_tensor(4, 1, 5, 5, 3);
    cpu_resize_bilinear_fwd(&ctx, x, y);
}
static void resize_tokens_not_a_grid(void) {
    Ctx ctx = ctx_cpu();
    Tensor *dx = test_tensor(3, 1, 9, 2), *dy = test_tensor(4, 1, 5, 5, 2);
    cpu_resize_bilinear_bwd(&ctx, dy, dx);
}

static void test_resize_rejects_bad_shapes_with_a_message(void **state) {
    expect_stop(resize_to_no_rows, (const char *[]){"resize_bilinear_fwd", "(1, 3, 3, 2) -> (1, 0, 3, 2)", NULL});
    expect_stop(resize_channels_differ, (const char *[]){"resize_bilinear_fwd", "-> (1, 5, 5, 3)", NULL});
    expect_stop(resize_tokens_not_a_grid, (const char *[]){"resize_bilinear_bwd", "got (1, 9, 2)", NULL});
}

static void test_resize_matches_reference_and_finite_differences(void **state) {
    check_resize(2, 3, 5, 4, 7, 4, 1);     // up along H, down along W
    check_resize(2, 5, 5, 3, 3, 2, 1);     // down, H != W out
    check_resize(1, 7, 7, 2, 10, 10, 1);   // non-integer up (7 -> 10)
    check_resize(1, 27, 27, 3, 37, 37, 0); // the curriculum's 27 -> 37 (378 -> 518 px at p 14)
    check_resize(2, 37, 27, 2, 27, 37, 0); // non-integer down along H, up along W
    check_resize(1, 4, 6, 33, 4, 6, 1);    // same size, C over one backward channel block
}

// ---- losses ----------------------------------------------------------------------------------

// logits (3,5) with soft targets (rows sum to 1).
typedef struct { Tensor *logits, *targets, *loss, *probs; } CeCase;
static double ce_loss(void *u) {
    CeCase *c = u;
    Ctx ctx = ctx_cpu();
    cpu_cross_entropy_fwd(&ctx, c->logits, c->targets, c->loss, c->probs);
    return DLOSS * tensor_f32(c->loss)[0];
}

static void test_cross_entropy_matches_reference_and_finite_differences(void **state) {
    Ctx ctx = ctx_cpu();
    enum { B = 3, K = 5 };
    CeCase c = {test_tensor(2, B, K), test_tensor(2, B, K), test_scalar(0), test_tensor(2, B, K)};
    test_fill(c.logits, 20, -3, 3);
    test_fill(c.targets, 21, 0, 1);
    float *t = c.targets->data, *x = c.logits->data;
    for (int b = 0; b < B; b++) {
        float s = 0;
        for (int k = 0; k < K; k++) s += t[b * K + k];
        for (int k = 0; k < K; k++) t[b * K + k] /= s;
    }

    ce_loss(&c);
    double ref_loss = 0, ref_probs[B * K];
    for (int b = 0; b < B; b++) {
        double z = 0;
        for (int k = 0; k < K; k++) z += exp(x[b * K + k]);
        for (int k = 0; k < K; k++) {
            ref_probs[b * K + k] = exp(x[b * K + k]) / z;
            ref_loss -= t[b * K + k] * log(ref_probs[b * K + k]) / B;
        }
    }
    assert_close_ref("cross_entropy loss", c.loss, &ref_loss);
    assert_close_ref("cross_entropy probs", c.probs, ref_probs);

    Tensor *dloss = test_scalar(DLOSS), *dx = test_like(c.logits);
    cpu_cross_entropy_bwd(&ctx, dloss, c.probs, c.targets, dx);
    assert_grad("cross_entropy dlogits", ce_loss, &c, c.logits, dx);
    ce_loss(&c);   // probs back to the unperturbed logits
    Tensor *dx1 = test_clone(dx);
    cpu_cross_entropy_bwd(&ctx, dloss, c.probs, c.targets, dx);
    assert_doubled(dx, dx1);
    test_tensor_free(dloss); test_tensor_free(dx); test_tensor_free(dx1);
    test_tensor_free(c.logits); test_tensor_free(c.targets); test_tensor_free(c.loss); test_tensor_free(c.probs);
}

static void test_cross_entropy_one_hot_is_minus_log_softmax_at_label(void **state) {
    Ctx ctx = ctx_cpu();
    enum { B = 2, K = 4 };
    const int label[B] = {2, 0};
    // Row 0: logits (0, 0, ln 2, 0): softmax at 2 = 2 / 5.  Row 1: (1000, 1000, 1000, 1000) —
    // large enough to overflow exp without the max shift; softmax at 0 = 1 / 4.
    const float logits[B * K] = {0, 0, (float)M_LN2, 0, 1000, 1000, 1000, 1000};
    Tensor *x = test_tensor(2, B, K), *t = test_tensor(2, B, K), *loss = test_scalar(0),
           *probs = test_tensor(2, B, K);
    memcpy(x->data, logits, sizeof logits);
    for (int b = 0; b < B; b++) tensor_f32(t)[b * K + label[b]] = 1.0f;
    cpu_cross_entropy_fwd(&ctx, x, t, loss, probs);
    double want = (-log(2.0 / 5.0) - log(1.0 / 4.0)) / 2.0;
    assert_float_equal(tensor_f32(loss)[0], (float)want, 1e-6f);
    assert_float_equal(tensor_f32(probs)[2], 0.4f, 1e-6f);
    assert_float_equal(tensor_f32(probs)[K], 0.25f, 1e-6f);
    test_tensor_free(x); test_tensor_free(t); test_tensor_free(loss); test_tensor_free(probs);
}

// MSE over (2,7,6)
typedef struct { Tensor *a, *b, *loss; } MseCase;
static double mse_loss(void *u) {
    MseCase *c = u;
    Ctx ctx = ctx_cpu();
    cpu_mse_fwd(&ctx, c->a, c->b, c->loss);
    return DLOSS * tensor_f32(c->loss)[0];
}

static void test_mse_matches_reference_and_finite_differences(void **state) {
    Ctx ctx = ctx_cpu();
    MseCase c = {test_tensor(3, 2, 7, 6), test_tensor(3, 2, 7, 6), test_scalar(0)};
    test_fill(c.a, 22, -1, 1);
    test_fill(c.b, 23, -1, 1);

    mse_loss(&c);
    double ref = 0;
    for (size_t i = 0; i < c.a->numel; i++) {
        double d = (double)tensor_f32(c.a)[i] - tensor_f32(c.b)[i];
        ref += d * d / (double)c.a->numel;
    }
    assert_close_ref("mse loss", c.loss, &ref);

    Tensor *dloss = test_scalar(DLOSS), *da = test_like(c.a), *db = test_like(c.b);
    cpu_mse_bwd(&ctx, dloss, c.a, c.b, da, db);
    assert_grad("mse da", mse_loss, &c, c.a, da);
    assert_grad("mse db", mse_loss, &c, c.b, db);
    Tensor *da1 = test_clone(da), *db1 = test_clone(db);
    cpu_mse_bwd(&ctx, dloss, c.a, c.b, da, db);
    assert_doubled(da, da1);
    assert_doubled(db, db1);
    cpu_mse_bwd(&ctx, dloss, c.a, c.b, da, NULL);   // the teacher side needs no gradient
    test_tensor_free(dloss); test_tensor_free(da); test_tensor_free(db); test_tensor_free(da1); test_tensor_free(db1);
    test_tensor_free(c.a); test_tensor_free(c.b); test_tensor_free(c.loss);
}

// Token KL over s, t (7,6)
typedef struct { Tensor *s, *t, *loss; } KlCase;
static double kl_loss(void *u) {
    KlCase *c = u;
    Ctx ctx = ctx_cpu();
    cpu_token_kl_fwd(&ctx, c->s, c->t, c->loss);
    return DLOSS * tensor_f32(c->loss)[0];
}

static void test_token_kl_matches_reference_and_finite_differences(void **state) {
    Ctx ctx = ctx_cpu();
    enum { N = 7, C = 6 };
    KlCase c = {test_tensor(2, N, C), test_tensor(2, N, C), test_scalar(0)};
    test_fill(c.s, 24, -2, 2);
    test_fill(c.t, 25, -2, 2);

    kl_loss(&c);
    double ref = 0;
    for (int n = 0; n < N; n++) {
        double zs = 0, zt = 0;
        const float *s = tensor_f32(c.s) + n * C, *t = tensor_f32(c.t) + n * C;
        for (int k = 0; k < C; k++) { zs += exp(s[k]); zt += exp(t[k]); }
        for (int k = 0; k < C; k++) {
            double ps = exp(s[k]) / zs, pt = exp(t[k]) / zt;
            ref += ps * log(ps / pt) / N;
        }
    }
    assert_close_ref("token_kl loss", c.loss, &ref);

    Tensor *dloss = test_scalar(DLOSS), *ds = test_like(c.s), *dt = test_like(c.t);
    cpu_token_kl_bwd(&ctx, dloss, c.s, c.t, ds, dt);
    assert_grad("token_kl ds", kl_loss, &c, c.s, ds);
    assert_grad("token_kl dt", kl_loss, &c, c.t, dt);
    Tensor *ds1 = test_clone(ds), *dt1 = test_clone(dt);
    cpu_token_kl_bwd(&ctx, dloss, c.s, c.t, ds, dt);
    assert_doubled(ds, ds1);
    assert_doubled(dt, dt1);
    cpu_token_kl_bwd(&ctx, dloss, c.s, c.t, ds, NULL);
    test_tensor_free(dloss); test_tensor_free(ds); test_tensor_free(dt); test_tensor_free(ds1); test_tensor_free(dt1);
    test_tensor_free(c.s); test_tensor_free(c.t); test_tensor_free(c.loss);
}

static void test_token_kl_is_zero_for_identical_inputs_and_positive_otherwise(void **state) {
    Ctx ctx = ctx_cpu();
    Tensor *s = test_tensor(2, 7, 6), *t = test_tensor(2, 7, 6), *loss = test_scalar(-1);
    test_fill(s, 26, -3, 3);
    memcpy(t->data, s->data, s->numel * sizeof(float));
    cpu_token_kl_fwd(&ctx, s, t, loss);
    assert_float_equal(tensor_f32(loss)[0], 0.0f, 1e-7f);
    // Softmax ignores a per-token shift: still zero.
    for (size_t i = 0; i < t->numel; i++) tensor_f32(t)[i] += 5.0f;
    cpu_token_kl_fwd(&ctx, s, t, loss);
    assert_float_equal(tensor_f32(loss)[0], 0.0f, 1e-6f);
    test_fill(t, 27, -3, 3);
    cpu_token_kl_fwd(&ctx, s, t, loss);
    assert_true(tensor_f32(loss)[0] > 1e-3f);
    test_tensor_free(s); test_tensor_free(t); test_tensor_free(loss);
}

// The shapes kernels/losses_shape.h refuses: a loss of more than one element, targets of another
// size than the logits, an empty batch, mse over tensors of different sizes, a da of the wrong
// size, token KL over different last dims. Each runs in a child process (expect_stop).
static void ce_loss_not_scalar(void) {
    Ctx ctx = ctx_cpu();
    Tensor *x = test_tensor(2, 3, 4);
    cpu_cross_entropy_fwd(&ctx, x, test_like(x), test_tensor(1, 2), test_like(x));
}
static void ce_targets_short(void) {
    Ctx ctx = ctx_cpu();
    Tensor *x = test_tensor(2, 3, 4);
    cpu_cross_entropy_fwd(&ctx, x, test_tensor(2, 3, 3), test_scalar(0), test_like(x));
}
static void ce_empty_batch(void) {
    Ctx ctx = ctx_cpu();
    Tensor *x = test_tensor(2, 0, 4);
    cpu_cross_entropy_fwd(&ctx, x, test_like(x), test_scalar(0), test_like(x));
}
static void mse_sizes_differ(void) {
    Ctx ctx = ctx_cpu();
    cpu_mse_fwd(&ctx, test_tensor(2, 3, 4), test_tensor(2, 4, 4), test_scalar(0));
}
static void mse_da_short(void) {
    Ctx ctx = ctx_cpu();
    Tensor *a = test_tensor(2, 3, 4);
    cpu_mse_bwd(&ctx, test_scalar(1), a, test_like(a), test_tensor(2, 3, 3), NULL);
}
static void token_kl_last_dims_differ(void) {
    Ctx ctx = ctx_cpu();
    cpu_token_kl_fwd(&ctx, test_tensor(2, 4, 6), test_tensor(2, 6, 4), test_scalar(0));
}

static void test_losses_refuse_bad_shapes_with_a_message(void **state) {
    expect_stop(ce_loss_not_scalar, (const char *[]){"cross_entropy_fwd", "loss holds 1 element, got 2", NULL});
    expect_stop(ce_targets_short, (const char *[]){"cross_entropy_fwd", "targets has shape (3, 3)", NULL});
    expect_stop(ce_empty_batch, (const char *[]){"cross_entropy_fwd", "empty batch", NULL});
    expect_stop(mse_sizes_differ, (const char *[]){"mse_fwd", "b has shape (4, 4) (16 elements), expected 12", NULL});
    expect_stop(mse_da_short, (const char *[]){"mse_bwd", "da has shape (3, 3)", NULL});
    expect_stop(token_kl_last_dims_differ, (const char *[]){"token_kl_fwd", "t has last dim 4", NULL});
}

// ---- determinism -------------------------------------------------------------------------------

// Reductions must not depend on the thread count: 1 and 3 threads give identical bits.
static void test_reductions_are_identical_for_any_thread_count(void **state) {
    Ctx ctx = ctx_cpu();
    Tensor *a = test_tensor(4, 2, 37, 27, 13), *b = test_like(a), *loss = test_scalar(0);
    Tensor *g = test_tensor(4, 2, 27, 37, 13), *dx = test_like(a), *mean = test_tensor(2, 2, 13);
    Tensor *dp = test_tensor(3, 37, 27, 13);
    test_fill(a, 28, -1, 1);
    test_fill(b, 29, -1, 1);
    test_fill(g, 30, -1, 1);
    float first[4] = {0};
    int keep = omp_get_max_threads();
    for (int run = 0; run < 2; run++) {
        omp_set_num_threads(run == 0 ? 1 : 3);
        memset(dx->data, 0, tensor_bytes(dx));
        memset(dp->data, 0, tensor_bytes(dp));
        cpu_mse_fwd(&ctx, a, b, loss);
        cpu_resize_bilinear_bwd(&ctx, g, dx);
        cpu_mean_tokens_fwd(&ctx, a, mean);
        cpu_add_bcast_bwd(&ctx, a, NULL, dp);
        float got[4] = {tensor_f32(loss)[0], (float)test_dot(dx, dx), (float)test_dot(mean, mean),
                        (float)test_dot(dp, dp)};
        if (run == 0) memcpy(first, got, sizeof got);
        else assert_memory_equal(first, got, sizeof got);
    }
    omp_set_num_threads(keep);
    test_tensor_free(a); test_tensor_free(b); test_tensor_free(loss); test_tensor_free(g); test_tensor_free(dx); test_tensor_free(mean);
    test_tensor_free(dp);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_zero_accumulate_add_scale_match_reference),
        cmocka_unit_test(test_scale_backward_matches_finite_differences),
        cmocka_unit_test(test_add_bcast_matches_reference_and_finite_differences),
        cmocka_unit_test(test_cast_colsum_copies_and_sums_columns),
        cmocka_unit_test(test_layer_scale_matches_reference_and_finite_differences),
        cmocka_unit_test(test_concat_prefix_matches_reference_and_finite_differences),
        cmocka_unit_test(test_slice_tokens_matches_reference_and_finite_differences),
        cmocka_unit_test(test_mean_tokens_matches_reference_and_finite_differences),
        cmocka_unit_test(test_token_ops_reject_bad_shapes_with_a_message),
        cmocka_unit_test(test_attention_pool_equals_attention_with_the_query_in_every_row),
        cmocka_unit_test(test_dwconv_matches_reference_and_finite_differences),
        cmocka_unit_test(test_dwconv_silu_is_silu_of_the_convolution),
        cmocka_unit_test(test_dwconv_added_input_convolves_the_stream_plus_the_product),
        cmocka_unit_test(test_dwconv_rejects_flags_it_does_not_take),
        cmocka_unit_test(test_conv2d_matches_direct_and_its_adjoint),
        cmocka_unit_test(test_conv2d_rejects_bad_shapes_with_a_message),
        cmocka_unit_test(test_conv2d_norm_gelu_is_the_three_ops),
        cmocka_unit_test(test_resize_forward_matches_pytorch_values_by_hand),
        cmocka_unit_test(test_resize_matches_reference_and_finite_differences),
        cmocka_unit_test(test_resize_rejects_bad_shapes_with_a_message),
        cmocka_unit_test(test_cross_entropy_matches_reference_and_finite_differences),
        cmocka_unit_test(test_cross_entropy_one_hot_is_minus_log_softmax_at_label),
        cmocka_unit_test(test_mse_matches_reference_and_finite_differences),
        cmocka_unit_test(test_token_kl_matches_reference_and_finite_differences),
        cmocka_unit_test(test_token_kl_is_zero_for_identical_inputs_and_positive_otherwise),
        cmocka_unit_test(test_losses_refuse_bad_shapes_with_a_message),
        cmocka_unit_test(test_reductions_are_identical_for_any_thread_count),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
