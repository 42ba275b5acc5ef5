// `cgspn probe`: evaluates the weights' own head (for a distilled student: the teacher's head,
// copied at init), then trains a fresh linear head on the frozen encoder's pooled features
// (the head's input: mean of patch tokens or the class token, after the final norm) for
// `epochs` epochs with AdamW + warmup/cosine, and evaluates it. The encoder runs once over the
// train and val splits of data_shards (the loader's eval path: no augmentation, in order); the
// head trains on the cached features.
#include "probe.h"
#include "classify.h"
#include "cli_args.h"
#include "data_config.h"
#include "device_config.h"
#include "model_config.h"
#include "optimizer.h"
#include "runlog.h"
#include "../kernels/error.h"
#include "../nn/params_io.h"
#include "../nn/targets.h"
#include "../data/loader.h"
#include <math.h>
#include <omp.h>

static void probe_usage(FILE *f) {
    fprintf(f, "usage: cgspn probe CONFIG --weights W.safetensors [--key=value ...]\n"
               "Evaluates the encoder of CONFIG with the weights W (its own head, when W has one)\n"
               "on val_split of data_shards,\n"
               "then a linear probe: a fresh head trained for `epochs` epochs (lr, batch_size,\n"
               "weight_decay, warmup_steps) on the frozen encoder's pooled features.\n"
               "Example: cgspn probe configs/fmnist_cgspn.cfg --weights student.safetensors --epochs=1\n");
}

// The eval-path loader (no augmentation, in order) over split of data_shards.
static Loader *open_split(const Config *c, const char *split, int batch) {
    LoaderOptions o;
    loader_options_from_config(c, 0, 0, 1, &o);
    o.split = split;
    o.batch_size = batch;
    char err[2048];
    Loader *l = loader_open(&o, err, sizeof err);
    if (!l)
        CG_FAIL(strcmp(c->data_shards, "data/shards/fmnist") == 0 ? "build the Fashion-MNIST shards "
                "first: make fmnist-shards" : "build shards with cgspn data build, or set data_shards",
                "%s", err);
    return l;
}

typedef struct Features { float *x; int *labels; int n, classes; } Features;

// Pooled head inputs (n, C) and labels of every image of the loader's split, in order.
static Features pooled_features(Ctx *ctx, const Encoder *e, Loader *l) {
    Arena arena;
    arena_init(&arena, ctx, ARENA_CHUNK_BYTES);
    Tape tape;
    tape_init(&tape, ctx, &arena);
    tape_set_grad_enabled(&tape, false);
    int C = encoder_out_width(&e->cfg);
    int64_t total = (int64_t)loader_dataset(l)->m.images, steps = loader_steps_per_epoch(l);
    Features f = {cg_malloc((size_t)total * C * sizeof(float)), cg_malloc((size_t)total * sizeof(int)), 0, 0};
    char err[2048];
    for (int64_t s = 0; s < steps; s++) {
        const Batch *b = loader_next(l, err, sizeof err);
        if (!b) CG_FAIL("run cgspn data verify on the shards", "%s", err);
        if (b->count == 0) continue;
        tape_reset(&tape);
        Tensor *x = tape_tensor(&tape, 4, (int[]){b->count, b->channels, b->height, b->width}, true);
        tensor_upload(ctx, x, b->images);
        Tensor *tokens = encoder_forward(&tape, e, x, NULL);
        Tensor *pooled = encoder_pool(&tape, e, tokens);   // (B, C)
        CG_CHECK(pooled->ndim == 2 && pooled->shape[1] == C, "", "probe: the pooled features have "
                 "%d channels, %d expected", pooled->shape[pooled->ndim - 1], C);
        float *host = tensor_to_host_f32(ctx, pooled);
        CG_CHECK(f.n + b->count <= total, "", "the loader gave more images than the split holds");
        memcpy(f.x + (size_t)f.n * C, host, (size_t)b->count * C * sizeof(float));
        for (int i = 0; i < b->count; i++) f.labels[f.n + i] = b->labels[i];
        f.n += b->count;
        f.classes = b->classes;
        free(host);
    }
    tape_free(&tape);
    arena_free(&arena);
    return f;
}

static void features_free(Features *f) {
    free(f->x);
    free(f->labels);
}

// Top-1 of the linear head on cached features.
static double head_top1(const float *w, const float *bias, const Features *f, int C, int K) {
    long correct = 0;
    for (int i = 0; i < f->n; i++) {
        const float *x = f->x + (size_t)i * C;
        int best = 0;
        double best_v = -INFINITY;
        for (int k = 0; k < K; k++) {
            double v = bias[k];
            for (int c = 0; c < C; c++) v += (double)w[(size_t)k * C + c] * x[c];
            if (v > best_v) best_v = v, best = k;
        }
        correct += best == f->labels[i];
    }
    return f->n ? (double)correct / f->n : 0;
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
    int eval_batch = c.eval_batch_size > 0 ? c.eval_batch_size : 500;
    Loader *val = open_split(&c, c.val_split, eval_batch), *trn = open_split(&c, c.train_split, eval_batch);
    if (head_loaded) {
        EvalResult ev = classify_evaluate(&ctx, &enc, val, c.cuda_graph);
        printf("probe: the weights' own head: test top1 %.2f%% | top5 %.2f%% | loss %.4f\n",
               100 * ev.top1, 100 * ev.top5, ev.loss);
    }
    char err[2048];
    if (loader_cursor_set(val, (LoaderCursor){0, 0}, err, sizeof err) != 0) CG_FAIL("", "%s", err);
    Features ftrain = pooled_features(&ctx, &enc, trn), ftest = pooled_features(&ctx, &enc, val);
    loader_close(trn);
    loader_close(val);
    int C = encoder_out_width(&ecfg), K = c.num_classes, B = c.batch_size, n = ftrain.n;
    CG_CHECK(ftrain.classes <= K, "set num_classes to the dataset's class count or more",
             "the data has %d classes, the head %d", ftrain.classes, K);
    CG_CHECK(n >= B, "reduce batch_size", "batch_size %d exceeds the %d training images", B, n);
    printf("probe: features of %d + %d images in %.1f s\n", n, ftest.n, now_seconds() - t0);

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
        if (pos == 0) loader_epoch_order((uint64_t)c.seed, epoch, order, (uint32_t)n);
        tape_reset(&tape);
        Tensor *x = tape_tensor(&tape, 2, (int[]){B, C}, true);
        for (int i = 0; i < B; i++) {
            uint32_t k = order[pos * B + i];
            memcpy(tensor_f32(x) + (size_t)i * C, ftrain.x + (size_t)k * C, C * sizeof(float));
            labels[i] = ftrain.labels[k];
        }
        labels_to_targets(labels, B, K, 0.0f, targets);
        Tensor *tgt = tape_tensor(&tape, 2, (int[]){B, K}, true);
        memcpy(tgt->data, targets, (size_t)B * K * sizeof(float));
        Tensor *loss = nn_cross_entropy(&tape, linear(&tape, &lin, x), tgt);
        loss_sum += tensor_f32(loss)[0];
        tape_backward(&tape, loss);
        optimizer_step(&head, &cpu, &arena, &opt, step);
    }
    double top1 = head_top1(tensor_f32(lin.w), tensor_f32(lin.b), &ftest, C, K);
    printf("probe: linear probe (%ld steps, %d epoch%s on frozen features, train loss %.4f): "
           "test top1 %.2f%%\n", total, c.epochs > 0 ? c.epochs : 1, c.epochs == 1 ? "" : "s",
           total ? loss_sum / total : 0, 100 * top1);
    free(order); free(targets); free(labels);
    features_free(&ftrain);
    features_free(&ftest);
    tape_free(&tape);
    arena_free(&arena);
    params_free(&head, &cpu);
    params_free(&params, &ctx);
    device_close(&ctx);
    return 0;
}
