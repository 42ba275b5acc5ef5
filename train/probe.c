// `cgspn probe`: evaluates the weights' own head (for a distilled student: the teacher's head,
// copied at init), then trains a fresh linear head on the frozen encoder's pooled features
// (the head's input: mean of patch tokens or the class token, after the final norm) for
// `epochs` epochs with AdamW + warmup/cosine, and evaluates it. The encoder runs once over the
// training and test sets; the head trains on the cached features.
#include "probe.h"
#include "classify.h"
#include "cli_args.h"
#include "device.h"
#include "model_config.h"
#include "optimizer.h"
#include "runlog.h"
#include "../data/fmnist_batch.h"
#include "../nn/error.h"
#include "../nn/params_io.h"
#include "../nn/targets.h"
#include <math.h>
#include <omp.h>

static void probe_usage(FILE *f) {
    fprintf(f, "usage: cgspn probe CONFIG --weights W.safetensors [--key=value ...]\n"
               "Evaluates the encoder of CONFIG with the weights W (its own head, when W has one),\n"
               "then a linear probe: a fresh head trained for `epochs` epochs (lr, batch_size,\n"
               "weight_decay, warmup_steps) on the frozen encoder's pooled features.\n"
               "Example: cgspn probe configs/fmnist_cgspn.cfg --weights student.safetensors --epochs=1\n");
}

// Pooled head inputs of every image of split: (count, C) on the host.
static float *pooled_features(Ctx *ctx, const Encoder *e, const FmnistSplit *s, int batch) {
    Arena arena;
    arena_init(&arena, ctx, 64u << 20);
    Tape tape;
    tape_init(&tape, ctx, &arena);
    tape_set_grad_enabled(&tape, false);
    int n = s->images.count, C = e->cfg.width, hw = s->images.rows * s->images.cols;
    float *feat = cg_malloc((size_t)n * C * sizeof(float));
    float *img = cg_malloc((size_t)batch * hw * sizeof(float));
    int *labels = cg_malloc((size_t)batch * sizeof(int));
    uint32_t *idx = cg_malloc((size_t)batch * sizeof(uint32_t));
    for (int start = 0; start < n; start += batch) {
        int b = n - start < batch ? n - start : batch;
        for (int i = 0; i < b; i++) idx[i] = (uint32_t)(start + i);
        fmnist_batch(s, idx, b, img, labels);
        tape_reset(&tape);
        Tensor *x = tape_tensor(&tape, 4, (int[]){b, e->cfg.in_chans, s->images.rows, s->images.cols}, true);
        tensor_upload(ctx, x, img);
        Tensor *tokens = encoder_forward(&tape, e, x, NULL);
        Tensor *pooled;
        if (e->cfg.avg_pool || !e->prefix) {
            Tensor *patches = e->prefix ? nn_slice_tokens(&tape, tokens, e->prefix, e->grid_h * e->grid_w)
                                        : tokens;
            pooled = nn_mean_tokens(&tape, patches);
        } else {
            pooled = nn_view(&tape, nn_slice_tokens(&tape, tokens, 0, 1), 2, (int[]){b, C});
        }
        float *host = tensor_to_host_f32(ctx, pooled);
        memcpy(feat + (size_t)start * C, host, (size_t)b * C * sizeof(float));
        free(host);
    }
    free(img); free(labels); free(idx);
    tape_free(&tape);
    arena_free(&arena);
    return feat;
}

// Top-1 of the linear head on cached features.
static double head_top1(const float *w, const float *bias, const float *feat, const FmnistSplit *s,
                        int C, int K) {
    long correct = 0;
    for (int i = 0; i < s->labels.count; i++) {
        const float *f = feat + (size_t)i * C;
        int best = 0;
        double best_v = -INFINITY;
        for (int k = 0; k < K; k++) {
            double v = bias[k];
            for (int c = 0; c < C; c++) v += (double)w[(size_t)k * C + c] * f[c];
            if (v > best_v) best_v = v, best = k;
        }
        correct += best == s->labels.labels[i];
    }
    return s->labels.count ? (double)correct / s->labels.count : 0;
}

int cmd_probe(int argc, char **argv) {
    if (cli_wants_help(argc, argv, 2)) {
        probe_usage(stdout);
        return 0;
    }
    const char *weights = cli_take_flag(&argc, argv, 2, "--weights");
    if (!weights) {
        probe_usage(stderr);
        CG_FAIL("see the usage above", "cgspn probe needs --weights");
    }
    Config c;
    config_defaults(&c);
    int rest = config_parse_args(&c, argc, argv, 2);
    CG_CHECK(rest == 0, "see cgspn probe --help", "unexpected argument '%s'", argv[2]);
    CG_CHECK(c.num_classes > 0, "set num_classes (10 for Fashion-MNIST)", "a probe needs a head");
    if (c.threads > 0) omp_set_num_threads(c.threads);
    char err[4096];
    FmnistSplit train, test;
    if (fmnist_load(c.data_dir, 1, &train, err, sizeof err) != 0 ||
        fmnist_load(c.data_dir, 0, &test, err, sizeof err) != 0)
        CG_FAIL("install Debian's dataset-fashion-mnist (make deps) or set data_dir", "%s", err);

    Ctx ctx = device_open(&c);
    device_describe(&ctx, stdout);
    EncoderConfig ecfg = encoder_config_from(&c);
    Encoder enc;
    ParamTable params;
    params_init_table(&params);
    encoder_register(&enc, &ecfg, &params);
    params_alloc(&params, &ctx);
    params_initialize(&params, &ctx, (uint64_t)c.seed);
    LoadReport r = {.allow_missing = true};
    params_load_safetensors(&params, &ctx, weights, c.teacher_prefix, &r);
    bool head_loaded = true;
    for (int i = 0; i < r.n_missing; i++) {
        CG_CHECK(strncmp(r.missing[i], "head.", 5) == 0, "give the weights of this encoder (its "
                 "config's model keys)", "%s has no tensor %s", weights, r.missing[i]);
        head_loaded = false;
    }
    printf("weights %s: ", weights);
    load_report_print(&r, stdout);
    load_report_free(&r);
    encoder_describe(&enc, &params, stdout);
    double t0 = now_seconds();
    if (head_loaded) {
        EvalResult ev = classify_evaluate(&ctx, &enc, &test, 500);
        printf("probe: the weights' own head: test top1 %.2f%% | test loss %.4f\n", 100 * ev.top1,
               ev.loss);
    }

    int C = ecfg.width, K = c.num_classes, B = c.batch_size, n = train.images.count;
    float *ftrain = pooled_features(&ctx, &enc, &train, 500);
    float *ftest = pooled_features(&ctx, &enc, &test, 500);
    printf("probe: features of %d + %d images in %.1f s\n", n, test.images.count, now_seconds() - t0);

    // The head alone, on the CPU: a (K, C) linear from zero.
    Ctx cpu = ctx_cpu();
    ParamTable head;
    params_init_table(&head);
    Linear lin;
    linear_register(&lin, &head, "head", C, K, true, 0.02f);
    params_alloc(&head, &cpu);
    params_zero_moments(&head, &cpu);
    memset(lin.w->data, 0, lin.w->numel * sizeof(float));
    memset(lin.b->data, 0, lin.b->numel * sizeof(float));
    long steps_per_epoch = n / B, total = steps_per_epoch * (c.epochs > 0 ? c.epochs : 1);
    OptimizerConfig opt = {
        .schedule = {c.lr, c.min_lr, c.warmup_steps < total ? c.warmup_steps : 0, total},
        .beta1 = c.beta1, .beta2 = c.beta2, .eps = c.adam_eps,
        .weight_decay = c.weight_decay, .grad_clip = c.grad_clip,
    };
    Arena arena;
    arena_init(&arena, &cpu, 8u << 20);
    Tape tape;
    tape_init(&tape, &cpu, &arena);
    uint32_t *order = cg_malloc((size_t)n * sizeof(uint32_t));
    float *targets = cg_malloc((size_t)B * K * sizeof(float));
    int *labels = cg_malloc((size_t)B * sizeof(int));
    double loss_sum = 0;
    for (long step = 0; step < total; step++) {
        long epoch = step / steps_per_epoch, pos = step % steps_per_epoch;
        if (pos == 0) fmnist_epoch_order((uint64_t)c.seed, epoch, order, (uint32_t)n);
        tape_reset(&tape);
        Tensor *x = tape_tensor(&tape, 2, (int[]){B, C}, true);
        for (int i = 0; i < B; i++) {
            uint32_t k = order[pos * B + i];
            memcpy(tensor_f32(x) + (size_t)i * C, ftrain + (size_t)k * C, C * sizeof(float));
            labels[i] = train.labels.labels[k];
        }
        labels_to_targets(labels, B, K, 0.0f, targets);
        Tensor *tgt = tape_tensor(&tape, 2, (int[]){B, K}, true);
        memcpy(tgt->data, targets, (size_t)B * K * sizeof(float));
        Tensor *loss = nn_cross_entropy(&tape, linear(&tape, &lin, x), tgt);
        loss_sum += tensor_f32(loss)[0];
        tape_backward(&tape, loss);
        optimizer_step(&head, &cpu, &arena, &opt, step);
    }
    double top1 = head_top1(tensor_f32(lin.w), tensor_f32(lin.b), ftest, &test, C, K);
    printf("probe: linear probe (%ld steps, %d epoch%s on frozen features, train loss %.4f): "
           "test top1 %.2f%%\n", total, c.epochs > 0 ? c.epochs : 1, c.epochs == 1 ? "" : "s",
           total ? loss_sum / total : 0, 100 * top1);
    free(order); free(targets); free(labels); free(ftrain); free(ftest);
    tape_free(&tape);
    arena_free(&arena);
    params_free(&head, &cpu);
    params_free(&params, &ctx);
    device_close(&ctx);
    fmnist_free(&train);
    fmnist_free(&test);
    return 0;
}
