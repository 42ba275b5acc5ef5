#include "classify.h"
#include "checkpoint.h"
#include "config.h"
#include "model_config.h"
#include "optimizer.h"
#include "runlog.h"
#include "device.h"
#include "../data/fmnist_batch.h"
#include "../nn/error.h"
#include "../nn/targets.h"
#include <math.h>
#include <omp.h>

static void train_usage(FILE *f) {
    fprintf(f, "usage: cgspn train CONFIG [--key=value ...]\n"
               "Trains an encoder (model = vit | cgspn | hybrid) for classification on\n"
               "Fashion-MNIST (IDX files in data_dir) and reports test accuracy.\n"
               "Example: cgspn train configs/fmnist_vit.cfg --epochs=1 --lr=2e-3\n\n");
    config_print_help(f);
}

// Loads a split or exits with the loader's message.
static void load_split(const char *dir, int train, FmnistSplit *s) {
    char err[1024];
    if (fmnist_load(dir, train, s, err, sizeof(err)) != 0)
        CG_FAIL("install Debian's dataset-fashion-mnist (make deps) or set data_dir", "%s", err);
}

EvalResult classify_evaluate(Ctx *ctx, const Encoder *e, const FmnistSplit *split, int batch) {
    Arena arena;
    arena_init(&arena, ctx, 64u << 20);
    Tape tape;
    tape_init(&tape, ctx, &arena);
    tape_set_grad_enabled(&tape, false);
    int K = e->cfg.num_classes, n = split->images.count;
    int hw = split->images.rows * split->images.cols;
    float *img = cg_malloc((size_t)batch * hw * sizeof(float));
    float *logits = cg_malloc((size_t)batch * K * sizeof(float));
    int *labels = cg_malloc((size_t)batch * sizeof(int));
    uint32_t *idx = cg_malloc((size_t)batch * sizeof(uint32_t));
    long correct = 0;
    double loss = 0;
    for (int start = 0; start < n; start += batch) {
        int b = n - start < batch ? n - start : batch;
        for (int i = 0; i < b; i++) idx[i] = (uint32_t)(start + i);
        fmnist_batch(split, idx, b, img, labels);
        tape_reset(&tape);
        Tensor *x = tape_tensor(&tape, 4, (int[]){b, 1, split->images.rows, split->images.cols}, true);
        tensor_upload(ctx, x, img);
        Tensor *out = encoder_head(&tape, e, encoder_forward(&tape, e, x, NULL));
        float *host = tensor_to_host_f32(ctx, out);
        for (int i = 0; i < b; i++) {
            const float *l = host + (size_t)i * K;
            int best = 0;
            double mx = l[0], sum = 0;
            for (int k = 1; k < K; k++)
                if (l[k] > l[best]) best = k;
            for (int k = 0; k < K; k++) mx = fmax(mx, l[k]);
            for (int k = 0; k < K; k++) sum += exp(l[k] - mx);
            loss += mx + log(sum) - l[labels[i]];
            correct += best == labels[i];
        }
        free(host);
    }
    free(img); free(logits); free(labels); free(idx);
    tape_free(&tape);
    arena_free(&arena);
    return (EvalResult){n ? (double)correct / n : 0, n ? loss / n : 0, n};
}

// The data cursor of this trainer: the epoch order is a pure function of (seed, epoch), so the
// position is the step; the log window's partial sum rides along so that a resumed run prints
// the same log lines as one never stopped. Stored as bytes (host little-endian) in checkpoints.
typedef struct ClassifyCursor {
    uint32_t version, reserved;
    int64_t epoch, position;    // the next batch: epoch and batch index within it
    double loss_sum;            // losses of the steps since the last log line
    int64_t loss_n;
} ClassifyCursor;
#define CLASSIFY_CURSOR_VERSION 1

static void save_checkpoint(const Config *c, const RunLog *log, const ParamTable *params, Ctx *ctx,
                            long step, long steps_per_epoch, double loss_sum, int loss_n) {
    CkptState st = {.step = step};
    ClassifyCursor cur = {CLASSIFY_CURSOR_VERSION, 0, step / steps_per_epoch,
                          step % steps_per_epoch, loss_sum, loss_n};
    st.cursor_bytes = sizeof cur;
    memcpy(st.cursor, &cur, sizeof cur);
    CkptOptions o = {.keep_last = c->keep_last};
    char saved[1024];
    ckpt_save(log->dir, &o, c, params, NULL, ctx, &st, saved, sizeof saved);
    if (log->tty) printf("\r\033[K");
    printf("checkpoint: %s\n", saved);
}

TrainResult classify_train(const Config *c, const FmnistSplit *train, const FmnistSplit *test,
                           const TrainOptions *o) {
    TrainOptions none = {0};
    if (!o) o = &none;
    TrainResult res = {0};
    Ctx ctx = device_open(c);
    device_describe(&ctx, stdout);
    CG_CHECK(train->images.rows == c->img_size && train->images.cols == c->img_size && c->in_chans == 1,
             "Fashion-MNIST images are 28x28 with 1 channel: img_size = 28, in_chans = 1",
             "img_size %d / in_chans %d do not match the %dx%d grayscale dataset", c->img_size,
             c->in_chans, train->images.rows, train->images.cols);

    EncoderConfig ecfg = encoder_config_from(c);
    Encoder enc;
    ParamTable params;
    params_init_table(&params);
    encoder_register(&enc, &ecfg, &params);
    params_alloc(&params, &ctx);
    params_initialize(&params, &ctx, (uint64_t)c->seed);
    encoder_describe(&enc, &params, stdout);

    long steps_per_epoch = train->images.count / c->batch_size;
    CG_CHECK(steps_per_epoch > 0, "reduce batch_size", "batch_size %d exceeds the %d training images",
             c->batch_size, train->images.count);
    long total = c->max_steps > 0 ? c->max_steps : steps_per_epoch * c->epochs;
    long eval_every = c->eval_every > 0 ? c->eval_every : steps_per_epoch;
    OptimizerConfig opt = {
        .schedule = {c->lr, c->min_lr, c->warmup_steps, total},
        .beta1 = c->beta1, .beta2 = c->beta2, .eps = c->adam_eps,
        .weight_decay = c->weight_decay, .grad_clip = c->grad_clip,
    };
    // Resume: weights, moments, step and the cursor from a checkpoint. Before the run folder is
    // opened, so a refused resume leaves its config.cfg and logs as they were.
    long first = 0;
    double loss_sum = 0;
    int loss_n = 0;
    char run_dir[1024] = "", from[1024], err[4096];
    if (c->run_name[0]) snprintf(run_dir, sizeof run_dir, "%s/%s", c->out_dir, c->run_name);
    int found = ckpt_resolve_err(c->resume, run_dir, from, sizeof from, err, sizeof err);
    if (found < 0) CG_FAIL("", "%s", err);
    if (found == 0 && strcmp(c->resume, "auto") == 0)
        printf("resume = auto: no complete checkpoint in %s yet; starting at step 0\n", run_dir);
    if (found == 1) {
        CkptState st;
        ckpt_load(from, c, &params, NULL, &ctx, &st);
        ClassifyCursor cur;
        CG_CHECK(st.cursor_bytes == sizeof cur, "the checkpoint was not written by cgspn train",
                 "%s: data cursor of %zu bytes, expected %zu", from, st.cursor_bytes, sizeof cur);
        memcpy(&cur, st.cursor, sizeof cur);
        CG_CHECK(cur.version == CLASSIFY_CURSOR_VERSION, "", "%s: data cursor version %u, expected %d",
                 from, cur.version, CLASSIFY_CURSOR_VERSION);
        first = st.step;
        CG_CHECK(first <= total, "raise max_steps / epochs, or resume an earlier checkpoint",
                 "%s is at step %ld, past the %ld steps of this run", from, first, total);
        loss_sum = cur.loss_sum;
        loss_n = (int)cur.loss_n;
        if (cur.epoch * steps_per_epoch + cur.position != first)
            printf("note: batch_size changed since the checkpoint; data continues from step %ld "
                   "with the new batch size\n", first);
        printf("resumed from %s at step %ld\n", from, first);
    }
    RunLog log;
    runlog_open(&log, c, "train");
    snprintf(res.run_dir, sizeof res.run_dir, "%s", log.dir);
    printf("training: %ld steps (%ld per epoch), batch %d, lr %g, warmup %d\n", total,
           steps_per_epoch, c->batch_size, c->lr, c->warmup_steps);

    Arena arena;
    arena_init(&arena, &ctx, 64u << 20);
    Tape tape;
    tape_init(&tape, &ctx, &arena);
    int B = c->batch_size, K = c->num_classes, hw = c->img_size * c->img_size;
    float *img = cg_malloc((size_t)B * hw * sizeof(float));
    float *targets = cg_malloc((size_t)B * K * sizeof(float));
    int *labels = cg_malloc((size_t)B * sizeof(int));
    uint32_t *order = cg_malloc((size_t)train->images.count * sizeof(uint32_t));
    long order_epoch = -1;
    double flops_step = 3.0 * encoder_flops_per_image(&ecfg) * B;   // forward + backward
    double t_prev = now_seconds();
    EvalResult ev = {0};

    long step = first;
    for (; step < total; step++) {
        long epoch = step / steps_per_epoch, pos = step % steps_per_epoch;
        if (epoch != order_epoch) {
            fmnist_epoch_order((uint64_t)c->seed, epoch, order, (uint32_t)train->images.count);
            order_epoch = epoch;
        }
        fmnist_batch(train, order + pos * B, B, img, labels);
        labels_to_targets(labels, B, K, c->label_smoothing, targets);

        tape_reset(&tape);
        Tensor *x = tape_tensor(&tape, 4, (int[]){B, 1, c->img_size, c->img_size}, true);
        Tensor *tgt = tape_tensor(&tape, 2, (int[]){B, K}, true);
        tensor_upload(&ctx, x, img);
        tensor_upload(&ctx, tgt, targets);
        Tensor *logits = encoder_head(&tape, &enc, encoder_forward(&tape, &enc, x, NULL));
        Tensor *loss = nn_cross_entropy(&tape, logits, tgt);
        float loss_v;
        tensor_download(&ctx, loss, &loss_v);
        CG_CHECK(isfinite(loss_v), "lower lr or enable grad_clip",
                 "loss is %f at step %ld; stopping", loss_v, step + 1);
        tape_backward(&tape, loss);
        StepStats st = optimizer_step(&params, &ctx, &arena, &opt, step);
        CG_CHECK(st.finite, "lower lr or enable grad_clip",
                 "gradient norm is not finite at step %ld; stopping", step + 1);
        if (o->step_losses) o->step_losses[step] = loss_v;
        loss_sum += loss_v;
        loss_n++;

        bool last = step + 1 == total;
        bool stop = o->stop_after > 0 && step + 1 == o->stop_after && !last;
        if ((c->log_every > 0 && (step + 1) % c->log_every == 0) || last) {
            double t = now_seconds(), dt = (t - t_prev) / loss_n;
            char eta[32];
            if (log.tty) printf("\r\033[K");
            printf("step %6ld/%ld | epoch %ld | loss %.4f | lr %.2e | grad_norm %.3f | %.1f ms/step"
                   " | %.0f img/s | %.2f GFLOP/s | mem %.1f MiB | ETA %s\n",
                   step + 1, total, epoch + 1, loss_sum / loss_n, st.lr, st.grad_norm, dt * 1e3,
                   B / dt, flops_step / dt / 1e9, arena.peak / 1048576.0,
                   format_duration((total - step - 1) * dt, eta, sizeof(eta)));
            const char *keys[] = {"loss", "lr", "grad_norm", "ms_per_step", "img_per_s"};
            double vals[] = {loss_sum / loss_n, st.lr, st.grad_norm, dt * 1e3, B / dt};
            runlog_metrics(&log, step + 1, 5, keys, vals);
            loss_sum = 0;
            loss_n = 0;
            t_prev = now_seconds();
        } else {
            runlog_progress(&log, step + 1, total, (now_seconds() - t_prev) / loss_n);
        }
        if ((step + 1) % eval_every == 0 || last) {
            double t0 = now_seconds();
            ev = classify_evaluate(&ctx, &enc, test, 500);
            printf("eval  step %ld | test top1 %.2f%% | test loss %.4f | %ld images | %.1f s\n",
                   step + 1, 100 * ev.top1, ev.loss, ev.count, now_seconds() - t0);
            const char *keys[] = {"test_top1", "test_loss"};
            double vals[] = {ev.top1, ev.loss};
            runlog_metrics(&log, step + 1, 2, keys, vals);
            t_prev = now_seconds();
        }
        if ((c->ckpt_every > 0 && (step + 1) % c->ckpt_every == 0) || last || stop) {
            save_checkpoint(c, &log, &params, &ctx, step + 1, steps_per_epoch, loss_sum, loss_n);
            t_prev = now_seconds();
        }
        if (stop) {
            step++;
            printf("stopping after step %ld of %ld\n", step, total);
            break;
        }
    }
    if (ev.count == 0 && step >= total) {   // resumed at the end: nothing left to train
        ev = classify_evaluate(&ctx, &enc, test, 500);
        printf("eval  step %ld | test top1 %.2f%% | test loss %.4f | %ld images\n", step,
               100 * ev.top1, ev.loss, ev.count);
    }
    char dur[32];
    if (step >= total)
        printf("done: %ld steps in %s, final test top1 %.2f%%\n", total,
               format_duration(now_seconds() - log.t_start, dur, sizeof(dur)), 100 * ev.top1);
    free(img); free(targets); free(labels); free(order);
    tape_free(&tape);
    arena_free(&arena);
    runlog_close(&log);
    params_free(&params, &ctx);
    device_close(&ctx);
    res.step = step;
    res.total = total;
    res.eval = ev;
    return res;
}

int cmd_train(int argc, char **argv) {
    Config c;
    config_defaults(&c);
    for (int i = 2; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            train_usage(stdout);
            return 0;
        }
    int rest = config_parse_args(&c, argc, argv, 2);
    CG_CHECK(rest == 0, "see cgspn train --help", "unexpected argument '%s'", argv[2]);
    if (c.threads > 0) omp_set_num_threads(c.threads);
    CG_CHECK(strcmp(c.dataset, "fashion-mnist") == 0, "dataset = fashion-mnist",
             "dataset '%s' is not supported by this build", c.dataset);
    CG_CHECK(strcmp(c.resume, "auto") != 0 || c.run_name[0], "set run_name to the run to continue",
             "resume = auto needs run_name: it continues the run folder out_dir/run_name");
    FmnistSplit train, test;
    load_split(c.data_dir, 1, &train);
    load_split(c.data_dir, 0, &test);
    classify_train(&c, &train, &test, NULL);
    fmnist_free(&train);
    fmnist_free(&test);
    return 0;
}
