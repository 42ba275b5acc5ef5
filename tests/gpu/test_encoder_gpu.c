// The tape on the GPU against the CPU reference, end to end: a hybrid encoder (two C-GSPN blocks,
// one attention block, tanh and erf GELU) runs forward and backward from the same seed on the CPU
// (fp32) and on the GPU (fp32, then bf16), with the same weights and image (rounded to bf16 on both
// sides in bf16 mode). Compared: the output tokens, every parameter's gradient and the image's.
// It covers what the op tests cannot: how nn/ composes the GPU ops, in particular the fused
// residual paths of a block without taps (the mixing branch's projection, add and norm2 in one
// pass with the norm's backward handing the gradient on; fc2 writing x + MLP) and the unfused path
// a block takes when its post-propagation tap is kept. Bounds as for the timm parity: fp32 1e-4,
// bf16 2e-2 (relative, norm-wise; in bf16 the RMS over draws, and for a gradient that one
// rounding of the inputs already moves far, a measured multiple of that move: below). A second model is a ViT of the teacher families (class token and
// registers, pos_embed without the prefix, norm_pre, fc_norm): its pooled vector is the output,
// so the fp32 residual stream is sliced and averaged in a bf16 run.
#include "gpulib.h"
#include "../../nn/encoder.h"

#define FP32_BOUND 1e-4
#define BF16_BOUND 2e-2

typedef struct Side {
    Ctx ctx;
    Arena arena;
    Tape tape;
    ParamTable params;
    Encoder enc;
} Side;

static EncoderConfig hybrid(GeluKind gelu) {
    // Widths that are multiples of 8 (the GPU's vector paths), a head dim cuDNN takes.
    EncoderConfig c = {.kind = ENCODER_HYBRID, .img_h = 32, .img_w = 24, .in_chans = 3,
                       .patch = 4, .width = 64, .depth = 3, .heads = 2, .mlp_hidden = 96,
                       .gelu = gelu, .ln_eps = 1e-6f, .qkv_bias = 1, .gspn_latent = 8,
                       .gspn_out_norm = 1, .attn_every = 3, .avg_pool = 1};
    return c;
}

static EncoderConfig vit_fc_norm(void) {
    EncoderConfig c = {.kind = ENCODER_VIT, .img_h = 16, .img_w = 24, .in_chans = 3, .patch = 4,
                       .width = 64, .depth = 2, .heads = 2, .mlp_hidden = 96, .gelu = GELU_ERF,
                       .ln_eps = 1e-6f, .qkv_bias = 1, .pos_embed = 1, .class_token = 1,
                       .reg_tokens = 2, .no_embed_class = 1, .norm_pre = 1, .fc_norm = 1,
                       .avg_pool = 1};
    return c;
}

// The hierarchical GSPN encoder: stem, LPUs, the mixer's 7x7 depthwise conv, SiLU and 2-channel
// shared-weight scan, downsampling; grids 8x6 -> 4x3 -> 2x2 -> 1x1. Its MLPs keep their hidden
// activations for backward, as configs/gspn_t.cfg's do.
static EncoderConfig gspn_hier(void) {
    EncoderConfig c = {.kind = ENCODER_GSPN_HIER, .img_h = 32, .img_w = 24, .in_chans = 3,
                       .patch = 4, .width = 16, .depths = {1, 1, 2, 1}, .depth = 5,
                       .mlp_ratio = 2, .mixer_ratio = 1.5f, .mixer_conv = 7, .gelu = GELU_ERF,
                       .ln_eps = 1e-5f, .gspn_latent = 2, .gspn_shared_w = 1, .avg_pool = 1,
                       .mlp_keep_hidden = 1};
    return c;
}

static void side_init(Side *s, Ctx ctx, const EncoderConfig *cfg) {
    memset(s, 0, sizeof *s);
    s->ctx = ctx;
    arena_init(&s->arena, &s->ctx, 1u << 24);
    tape_init(&s->tape, &s->ctx, &s->arena);
    params_init_table(&s->params);
    encoder_register(&s->enc, cfg, &s->params);
    params_alloc(&s->params, &s->ctx);
}

static void side_free(Side *s) {
    tape_free(&s->tape);
    arena_free(&s->arena);
    params_free(&s->params, &s->ctx);
}

// Forward with or without taps, backward from seed (host values; on the GPU a fresh copy in the
// output's dtype, since backward may write into the seed's gradient buffer); returns the output
// tokens, or with pool the pooled vector (B, C).
static Tensor *run(Side *s, Tensor *img, Tensor *seed, bool taps, bool pool) {
    tape_reset(&s->tape);
    img->grad = NULL;
    params_zero_grads(&s->params, &s->ctx);
    EncoderTaps tp;
    Tensor *y = encoder_forward(&s->tape, &s->enc, img, taps ? &tp : NULL);
    if (pool) y = encoder_pool(&s->tape, &s->enc, y);
    tape_keep(&s->tape, y);   // compared after backward
    Tensor *dev_seed = s->ctx.device == DEVICE_CPU ? seed : gpu_test_upload(&s->ctx, seed, y->dtype);
    tape_backward_from(&s->tape, 1, &y, &dev_seed);
    if (dev_seed != seed) gpu_test_free(dev_seed);
    return y;
}

// A gradient that is the sum of many nearly cancelling terms (a bias or merge weight reached
// through gspn_hier's 2-channel proxy) moves by several times its typical bf16 error when any
// rounding upstream lands differently: one draw measures noise (docs/gspn_hier.md). bf16 errors
// are therefore the RMS over BF16_DRAWS models whose parameters differ by about one bf16 ulp, so
// every rounding is drawn anew; fp32 needs one. An RMS over n draws is uncertain by about
// 1/sqrt(2n), and the worst of many such ratios reads high: at 6 draws stage 0's merge weights
// read 0.94-1.01 of their bound as kernels changed only the order of roundings; at 16 and 32
// draws 0.91 and 0.80, the same before and after such a change (H100, 2026-11-26). 32 draws
// take about 3 s.
#define BF16_DRAWS 32
// CGSPN_TEST_BF16_DRAWS=N: N draws instead (how the RMS settles as draws are added).
// CGSPN_GPU_TEST_SMALL (the sanitizer's runs: 32 draws did not finish in 520 s under racecheck):
// SMALL_DRAWS draws, which reach every kernel; an RMS over so few is too uncertain for the bounds
// (at 6 draws one read 0.94-1.01 of its bound), so bf16 then asserts finite errors only.
#define SMALL_DRAWS 2
static int bf16_draws(void) {
    const char *e = getenv("CGSPN_TEST_BF16_DRAWS");
    if (e && atoi(e) > 0) return atoi(e);
    return gpu_test_small() ? SMALL_DRAWS : BF16_DRAWS;
}
#define BF16_DRAW_SCALE 0x1p-8   // parameters scaled by 1 + u 2^-8, u uniform in [-1, 1]
// How much a gradient moves under bf16 is measured here too: s, the RMS over the draws of its
// norm-wise change on the CPU when the image and the seed backward starts from are scaled by
// 1 + u 2^-9 (one rounding of each: the forward's and the backward's conditioning). A gradient
// may be off by max(BF16_BOUND, BF16_SENSITIVITY_FACTOR s). The factor is PyTorch's: autocast
// bf16 on the tiny gspn_hier of tests/parity_gspn_hier.py is off by at most 9.1 times the same s
// on the gradients it gets wrong by 1e-2 or more (`--case tiny --sensitivity 8`, H100,
// 2026-11-25). Well-conditioned gradients move by ~3e-3, so their bound stays near BF16_BOUND.
#define BF16_SENSITIVITY_FACTOR 9.1
#define INPUT_DRAW_SCALE 0x1p-9

// Runs 0, 1: every activation kept, without and with taps; 2, 3: every block recomputed in
// backward (grad_checkpoint = 1), without and with taps (not for gspn_hier, which does not
// recompute).
#define RUNS 4

// dst = src scaled by 1 + u scale, u uniform in [-1, 1] from *st.
static void scale_randomly(float *dst, const float *src, size_t n, uint64_t *st, double scale) {
    for (size_t k = 0; k < n; k++) {
        *st = *st * 6364136223846793005ull + 1442695040888963407ull;
        double u = (double)(*st >> 11) / (double)(1ull << 53) * 2.0 - 1.0;
        dst[k] = (float)(src[k] * (1.0 + u * scale));
    }
}

static void set_params(Side *cpu, Side *gpu, float *const *base, int draw, DType dt) {
    uint64_t st = 0x9e3779b97f4a7c15ull * (uint64_t)(draw + 1);
    for (int i = 0; i < cpu->params.n; i++) {
        Tensor *v = &cpu->params.params[i]->value;
        scale_randomly(v->data, base[i], v->numel, &st, draw ? BF16_DRAW_SCALE : 0.0);
        if (gpu->params.params[i]->value.dtype == DTYPE_BF16) gpu_test_round_to_bf16(v);
        params_set_value(&gpu->params, i, &gpu->ctx, v->data);
    }
}

static void compare_with_cpu(EncoderConfig cfg, bool pool, DType dt) {
    Side cpu, gpu;
    side_init(&cpu, ctx_cpu(), &cfg);
    params_initialize(&cpu.params, &cpu.ctx, 97);
    side_init(&gpu, cuda_ctx_create(0, dt), &cfg);
    int np = cpu.params.n;
    float **base = calloc((size_t)np, sizeof(float *));
    for (int i = 0; i < np; i++) {
        Tensor *v = &cpu.params.params[i]->value;
        base[i] = malloc(v->numel * sizeof(float));
        memcpy(base[i], v->data, v->numel * sizeof(float));
    }
    bool hier = cfg.kind == ENCODER_GSPN_HIER;
    int runs = hier ? 2 : RUNS, draws = dt == DTYPE_F32 ? 1 : bf16_draws();
    int B = 2, N = cpu.enc.grid_h * cpu.enc.grid_w + cpu.enc.prefix;
    int C = encoder_out_width(&cfg);   // the tokens' width
    Tensor *img = test_tensor(4, B, cfg.in_chans, cfg.img_h, cfg.img_w);
    Tensor *seed = pool ? test_tensor(2, B, C) : test_tensor(3, B, N, C);
    test_fill(img, 5, -1, 1);
    test_fill(seed, 6, -1, 1);
    if (dt == DTYPE_BF16) {
        gpu_test_round_to_bf16(img);
        gpu_test_round_to_bf16(seed);
    }
    img->requires_grad = true;
    Tensor *gimg = gpu_test_upload(&gpu.ctx, img, dt);
    gimg->requires_grad = true;
    double bound = dt == DTYPE_F32 ? FP32_BOUND : BF16_BOUND;
    // per run: squared errors summed over the draws; [0] tokens, [1] image grad, [2 + i] param i
    double *sq = calloc((size_t)RUNS * (np + 2), sizeof(double));
    double *sens = calloc((size_t)np, sizeof(double));   // squared changes under image rounding
    Tensor *img_moved = test_tensor(4, B, cfg.in_chans, cfg.img_h, cfg.img_w);
    Tensor *seed_moved = pool ? test_tensor(2, B, C) : test_tensor(3, B, N, C);
    float **moved = calloc((size_t)np, sizeof(float *));
    for (int i = 0; i < np; i++) moved[i] = malloc(cpu.params.params[i]->grad.numel * sizeof(float));
    for (int draw = 0; draw < draws; draw++) {
        set_params(&cpu, &gpu, base, draw, dt);
        if (dt == DTYPE_BF16) {   // first the moved image: the reference's tape must stay intact
            uint64_t st = 0x51ed2701ull + (uint64_t)draw;
            scale_randomly(img_moved->data, img->data, img->numel, &st, INPUT_DRAW_SCALE);
            scale_randomly(seed_moved->data, seed->data, seed->numel, &st, INPUT_DRAW_SCALE);
            img_moved->requires_grad = true;
            run(&cpu, img_moved, seed_moved, false, pool);
            for (int i = 0; i < np; i++)
                memcpy(moved[i], cpu.params.params[i]->grad.data,
                       cpu.params.params[i]->grad.numel * sizeof(float));
        }
        Tensor *y = run(&cpu, img, seed, false, pool);
        if (dt == DTYPE_BF16)
            for (int i = 0; i < np; i++) {
                const Tensor *g = &cpu.params.params[i]->grad;
                sens[i] += pow(test_rel_err(moved[i], g->data, g->numel), 2);
            }
        for (int run_i = 0; run_i < runs; run_i++) {
            double *e = sq + (size_t)run_i * (np + 2);
            gpu.enc.cfg.grad_checkpoint = run_i / 2;
            Tensor *gy = run(&gpu, gimg, seed, run_i % 2, pool);
            e[0] += pow(gpu_test_compare(&gpu.ctx, "tokens", gy, y), 2);
            e[1] += pow(gpu_test_compare(&gpu.ctx, "image grad", gimg->grad, img->grad), 2);
            for (int i = 0; i < np; i++) {
                Param *pc = cpu.params.params[i], *pg = gpu.params.params[i];
                float *h = tensor_to_host_f32(&gpu.ctx, &pg->grad);
                e[2 + i] += pow(test_rel_err(h, pc->grad.data, pc->grad.numel), 2);
                free(h);
                assert_true(test_dot(&pc->grad, &pc->grad) > 0);   // every parameter is reached
            }
        }
    }
    for (int run_i = 0; run_i < runs; run_i++) {
        const double *e = sq + (size_t)run_i * (np + 2);
        printf("  %s, %s GELU, %s, %s%s: RMS over %d draw%s\n",
               hier ? "gspn_hier" : cfg.kind == ENCODER_VIT ? "ViT, fc_norm pooled" : "hybrid",
               cfg.gelu == GELU_TANH ? "tanh" : "erf", dtype_name(dt),
               run_i % 2 ? "taps kept (unfused residual adds)" : "no taps (fused residual paths)",
               run_i / 2 ? ", every block recomputed" : "", draws, draws > 1 ? "s" : "");
        double worst = 0;   // the largest error over its own bound
        const char *worst_name = "tokens";
        for (int j = 0; j < np + 2; j++) {
            double err = sqrt(e[j] / draws), s_j = j < 2 ? 0 : sqrt(sens[j - 2] / draws);
            double own = fmax(bound, BF16_SENSITIVITY_FACTOR * s_j);
            const char *name = j == 0 ? "tokens" : j == 1 ? "image grad" : cpu.params.params[j - 2]->name;
            if (err > own || err > bound)
                printf("    %-40s rel err %.2e, one rounding of the inputs moves it %.2e: bound %.2e%s\n",
                       name, err, s_j, own, err > own ? " EXCEEDED" : "");
            if (err / own > worst) worst = err / own, worst_name = name;
        }
        printf("    worst error over its bound %.2f (%s; bound %.0e, or %g times the move)\n",
               worst, worst_name, bound, BF16_SENSITIVITY_FACTOR);
        if (dt == DTYPE_BF16 && gpu_test_small() && draws == SMALL_DRAWS) {
            printf("    (%d draws: bounds not asserted, errors finite)\n", draws);
            assert_true(isfinite(worst));
        } else {
            assert_true(worst <= 1.0);
        }
    }
    free(sq);
    free(sens);
    test_tensor_free(img_moved);
    test_tensor_free(seed_moved);
    for (int i = 0; i < np; i++) free(base[i]), free(moved[i]);
    free(base);
    free(moved);
    gpu_test_free(gimg);
    test_tensor_free(img);
    test_tensor_free(seed);
    side_free(&gpu);
    cuda_ctx_destroy(&gpu.ctx);
    side_free(&cpu);
}

static void test_hybrid_encoder_fp32_matches_cpu(void **state) {
    GPU_TEST_REQUIRE_DEVICE();
    compare_with_cpu(hybrid(GELU_TANH), false, DTYPE_F32);
    compare_with_cpu(hybrid(GELU_ERF), false, DTYPE_F32);
}

static void test_hybrid_encoder_bf16_matches_cpu(void **state) {
    GPU_TEST_REQUIRE_DEVICE();
    compare_with_cpu(hybrid(GELU_TANH), false, DTYPE_BF16);
    compare_with_cpu(hybrid(GELU_ERF), false, DTYPE_BF16);
}

// Registers, no_embed_class, norm_pre and fc_norm pooling (the distillation teacher families).
static void test_vit_fc_norm_pooled_matches_cpu(void **state) {
    GPU_TEST_REQUIRE_DEVICE();
    compare_with_cpu(vit_fc_norm(), true, DTYPE_F32);
    compare_with_cpu(vit_fc_norm(), true, DTYPE_BF16);
}

static void test_gspn_hier_matches_cpu(void **state) {
    GPU_TEST_REQUIRE_DEVICE();
    compare_with_cpu(gspn_hier(), false, DTYPE_F32);
    compare_with_cpu(gspn_hier(), true, DTYPE_BF16);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gspn_hier_matches_cpu),
        cmocka_unit_test(test_hybrid_encoder_fp32_matches_cpu),
        cmocka_unit_test(test_hybrid_encoder_bf16_matches_cpu),
        cmocka_unit_test(test_vit_fc_norm_pooled_matches_cpu),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
