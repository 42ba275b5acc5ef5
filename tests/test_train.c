// `cgspn train` and `cgspn eval` on a tiny shard set built from synthetic IDX files: non-finite
// losses skipped (counted, logged) or stopping the run (naming the step, the last checkpoint
// kept), SIGTERM finishing the step with a checkpoint and exit status 0 (the real binary, forked
// and signalled), the eval command reproducing the trainer's own evaluation of raw and EMA
// weights, gradient accumulation matching one large batch, and the lr scaling rule.
#include "testlib.h"
#include "train_fixture.h"
#include "sigterm_run.h"
#include "../train/checkpoint.h"
#include "../train/classify.h"
#include "../train/export.h"
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

// Accumulating two micro-batches of 4 sums the same per-image gradients as one batch of 8, in
// another order: the losses of later steps drift by fp32 rounding only (~1e-7 relative per
// step, a few steps deep); a wrong scale (1 instead of 1/2) changes them by 1e-2 or more.
#define ACCUM_TOL 1e-5

static char g_dir[256];
static int setup(void **state) {
    if (test_make_temp_dir(g_dir, sizeof g_dir, "train")) return -1;
    fixture_build_shards(g_dir, 48, 16);
    return 0;
}
static int teardown(void **state) { return test_remove_dir(g_dir); }

// Redirects fd (1 or 2) into a file until capture_end, which returns the text written.
typedef struct Capture { int fd, saved; char path[600]; } Capture;
static void capture_begin(Capture *c, int fd, const char *name) {
    fflush(stdout);
    fflush(stderr);
    c->fd = fd;
    snprintf(c->path, sizeof c->path, "%s/%s", g_dir, name);
    c->saved = dup(fd);
    int f = open(c->path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    assert_true(c->saved >= 0 && f >= 0);
    dup2(f, fd);
    close(f);
}
static char *capture_end(Capture *c) {
    fflush(stdout);
    fflush(stderr);
    dup2(c->saved, c->fd);
    close(c->saved);
    return test_read_text(c->path);
}

static char *metrics_of(const char *run) {
    char path[600];
    snprintf(path, sizeof path, "%s/%s/metrics.jsonl", g_dir, run);
    return test_read_text(path);
}

// ---- non-finite losses -------------------------------------------------------------------------

static void test_nonfinite_skip_skips_the_update_counts_and_logs_it(void **state) {
    Config c = fixture_config(g_dir, "vit", "skip", 6);
    snprintf(c.on_nonfinite, sizeof c.on_nonfinite, "skip");
    float losses[6];
    TrainOptions o = {.step_losses = losses, .nonfinite_at = 3};
    TrainResult r = classify_train(&c, &o);
    assert_int_equal(r.status, TRAIN_DONE);
    assert_int_equal(r.step, 6);
    assert_int_equal(r.skipped, 1);
    for (int i = 0; i < 6; i++) assert_true(i == 2 ? isnan(losses[i]) : isfinite(losses[i]));
    assert_true(isfinite(r.eval.loss));   // the NaN never reached the weights
    char *m = metrics_of("skip");
    assert_contains(m, "{\"step\": 3, ");
    assert_contains(m, "\"nonfinite_skipped\": 1}");
    free(m);
    // The skipped update leaves the weights as they were: a run whose step 3 is skipped matches,
    // up to step 2, the one without, and differs after it.
    Config d = fixture_config(g_dir, "vit", "noskip", 6);
    float plain[6];
    TrainOptions od = {.step_losses = plain};
    classify_train(&d, &od);
    assert_memory_equal(losses, plain, 2 * sizeof(float));
    assert_memory_not_equal(&losses[3], &plain[3], sizeof(float));
}

static void test_nonfinite_stop_names_the_step_and_keeps_the_last_checkpoint(void **state) {
    Config c = fixture_config(g_dir, "cgspn", "stop", 8);   // checkpoints every 5 steps... 
    c.ckpt_every = 2;                                         // ...here every 2
    TrainOptions o = {.nonfinite_at = 5};
    Capture cap;
    capture_begin(&cap, 2, "stop.err");
    TrainResult r = classify_train(&c, &o);
    char *err = capture_end(&cap);
    printf("    %s", err);
    assert_int_equal(r.status, TRAIN_NONFINITE);
    assert_int_equal(r.nonfinite_step, 5);
    assert_int_equal(r.step, 4);
    assert_contains(err, "the loss is not finite at step 5");
    assert_contains(err, "on_nonfinite = skip");
    char run[600], latest[1024];
    snprintf(run, sizeof run, "%s/stop", g_dir);
    long steps[8];
    assert_int_equal(ckpt_list(run, steps, 8), 2);   // 2 and 4; nothing of step 5
    assert_int_equal(steps[1], 4);
    assert_int_equal(ckpt_find_latest(run, latest, sizeof latest), 1);
    free(err);
}

// ---- SIGTERM -----------------------------------------------------------------------------------

static void test_sigterm_finishes_the_step_writes_a_checkpoint_and_exits_0(void **state) {
    Config c = fixture_config(g_dir, "vit", "term", 1000000);
    c.log_every = 1;
    c.ckpt_every = 0;
    char cfg[600], log[600], run[600];
    snprintf(cfg, sizeof cfg, "%s/term.cfg", g_dir);
    snprintf(log, sizeof log, "%s/term.log", g_dir);
    snprintf(run, sizeof run, "%s/term", g_dir);
    assert_int_equal(config_save(&c, cfg), 0);
    char metrics[700];
    snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", run);
    int status;
    char *out = test_sigterm_cgspn("train", cfg, log, metrics, &status);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail_msg("cgspn train did not exit 0 after SIGTERM (status %d):\n%s", status, out);
    assert_contains(out, "interrupted by SIGTERM after step ");
    long steps[4];
    assert_int_equal(ckpt_list(run, steps, 4), 1);
    long at = steps[0];
    printf("    SIGTERM: checkpoint at step %ld, exit status 0\n", at);
    assert_true(at >= 3 && at < 1000000);
    char line[64];
    snprintf(line, sizeof line, "interrupted by SIGTERM after step %ld of 1000000", at);
    assert_contains(out, line);
    // The checkpoint holds the last logged step: the one running when the signal came finished.
    char *m = metrics_of("term"), last[64];
    snprintf(last, sizeof last, "{\"step\": %ld, ", at);
    assert_contains(m, last);
    snprintf(last, sizeof last, "{\"step\": %ld, ", at + 1);
    assert_null(strstr(m, last));
    free(m);
    free(out);
    // And the run continues from it.
    Config d = c;
    d.max_steps = (int)at + 2;
    snprintf(d.resume, sizeof d.resume, "auto");
    TrainResult r = classify_train(&d, NULL);
    assert_int_equal(r.status, TRAIN_DONE);
    assert_int_equal(r.step, at + 2);
}

// ---- cgspn eval ----------------------------------------------------------------------------------

// "... top1 12.50% ..." after `key`: the percentage as printed.
static void printed_pct(const char *text, const char *key, char *out, size_t n) {
    const char *p = strstr(text, key);
    if (!p) fail_msg("no '%s' in:\n%s", key, text);
    sscanf(p + strlen(key), "%31[0-9.]", out);
}

static char g_eval_loss[32];   // the loss the last eval_output printed

static void eval_output(const char *weights, bool ema, char *top1, char *top5) {
    char cfg[600], w[1300];
    snprintf(cfg, sizeof cfg, "%s/eval.cfg", g_dir);
    snprintf(w, sizeof w, "--weights=%s", weights);
    char *argv[] = {"cgspn", "eval", cfg, w, ema ? "--ema" : "--threads=0", NULL};
    Capture cap;
    capture_begin(&cap, 1, "eval.out");
    int rc = cmd_eval(5, argv);
    char *out = capture_end(&cap);
    printf("    %s", strstr(out, "eval val"));
    assert_int_equal(rc, 0);
    printed_pct(out, ema ? "ema top1 " : "weights top1 ", top1, 32);
    printed_pct(out, "top5 ", top5, 32);
    printed_pct(out, "loss ", g_eval_loss, sizeof g_eval_loss);
    free(out);
}

static void test_eval_command_reproduces_the_trainers_evaluation(void **state) {
    Config c = fixture_config(g_dir, "vit", "for_eval", 12);
    c.ema_decay = 0.5f;
    c.eval_batch_size = 5;   // a partial last batch (16 images)
    TrainResult r = classify_train(&c, NULL);
    assert_int_equal(r.eval.count, 16);
    char cfg[600];
    snprintf(cfg, sizeof cfg, "%s/eval.cfg", g_dir);
    assert_int_equal(config_save(&c, cfg), 0);
    char want1[32], want5[32], top1[32], top5[32], ckpt[1200];
    // a run folder (its newest checkpoint), its model.safetensors, and the EMA weights
    snprintf(want1, sizeof want1, "%.2f", 100 * r.eval.top1);
    snprintf(want5, sizeof want5, "%.2f", 100 * r.eval.top5);
    eval_output(r.run_dir, false, top1, top5);
    assert_string_equal(top1, want1);
    assert_string_equal(top5, want5);
    // cgspn eval RUN: the run's own config.cfg (this run had no config file of its own)
    {
        char *argv[] = {"cgspn", "eval", r.run_dir, NULL};
        Capture cap;
        capture_begin(&cap, 1, "eval_run.out");
        int rc = cmd_eval(3, argv);
        char *out = capture_end(&cap);
        assert_int_equal(rc, 0);
        assert_contains(out, "config.cfg");
        char t1[32];
        printed_pct(out, "weights top1 ", t1, sizeof t1);
        assert_string_equal(t1, want1);
        free(out);
    }
    snprintf(ckpt, sizeof ckpt, "%s/step_%08d/model.safetensors", r.run_dir, 12);
    eval_output(ckpt, false, top1, top5);
    assert_string_equal(top1, want1);
    snprintf(want1, sizeof want1, "%.2f", 100 * r.eval_ema.top1);
    eval_output(r.run_dir, true, top1, top5);
    assert_string_equal(top1, want1);
    char ema_loss[32];
    snprintf(ema_loss, sizeof ema_loss, "%s", g_eval_loss);
    // cgspn export --ema: plain weights that evaluate as the EMA did (the loss to its 4 printed
    // decimals: the raw weights' differs)
    char exported[700], err[4096];
    snprintf(exported, sizeof exported, "%s/ema.safetensors", g_dir);
    int kept, dropped;
    assert_int_equal(export_student_err(r.run_dir, exported, true, &kept, &dropped, err, sizeof err), 0);
    assert_true(kept > 0);
    eval_output(exported, false, top1, top5);
    assert_string_equal(top1, want1);
    assert_string_equal(g_eval_loss, ema_loss);
    // A run without an EMA, and a file instead of a checkpoint, are refused by name.
    Config plain = fixture_config(g_dir, "vit", "no_ema", 2);
    TrainResult rp = classify_train(&plain, NULL);
    assert_int_equal(export_student_err(rp.run_dir, exported, true, &kept, &dropped, err, sizeof err), -1);
    assert_contains(err, "ema_decay > 0");
    assert_int_equal(export_student_err(ckpt, exported, true, &kept, &dropped, err, sizeof err), -1);
    assert_contains(err, "pass the checkpoint or run folder");
}

// ---- the shards' class count ---------------------------------------------------------------------

// A head of another width than the shards' 10 classes, narrower or wider, is refused before
// training or evaluating, naming num_classes (labels past the head, or a head wider than the
// labels, would train or score the wrong thing silently). The real binary: a refusal exits.
static void test_num_classes_other_than_the_shards_is_refused_by_train_and_eval(void **state) {
    Config c = fixture_config(g_dir, "vit", "nc_run", 2);
    assert_int_equal(c.num_classes, 10);   // the fixture's shards hold 10 classes
    TrainResult r = classify_train(&c, NULL);
    assert_int_equal(r.status, TRAIN_DONE);
    Config refused = fixture_config(g_dir, "vit", "nc_refused", 2);
    char cfg[600];
    snprintf(cfg, sizeof cfg, "%s/nc.cfg", g_dir);
    assert_int_equal(config_save(&refused, cfg), 0);
    fixture_expect_num_classes_refused(g_dir, "train", cfg, "train");
    fixture_expect_num_classes_refused(g_dir, "eval", r.run_dir, "val");   // its config.cfg
    char refused_dir[700];
    snprintf(refused_dir, sizeof refused_dir, "%s/nc_refused", g_dir);
    assert_int_not_equal(access(refused_dir, F_OK), 0);   // refused before a run folder was made
}

// ---- precision on the CPU ---------------------------------------------------------------------------

// precision = auto (every shipped config's) on a machine without a GPU runs in fp32 and one line
// says so; an explicit bf16 there is refused with the override in the hint. The real binary, with
// the GPUs hidden (the GPU machine runs this test too).
static void test_precision_auto_runs_fp32_on_a_cpu_and_says_so_and_bf16_is_refused(void **state) {
    Config c = fixture_config(g_dir, "vit", "auto_cpu", 1);
    snprintf(c.device, sizeof c.device, "auto");
    assert_string_equal(c.precision, "auto");
    char cfg[600], log[600], cmd[2000];
    snprintf(cfg, sizeof cfg, "%s/auto.cfg", g_dir);
    snprintf(log, sizeof log, "%s/auto.log", g_dir);
    assert_int_equal(config_save(&c, cfg), 0);
    snprintf(cmd, sizeof cmd, "CUDA_VISIBLE_DEVICES= ./cgspn train %s", cfg);
    int rc = test_run_logged(cmd, log);
    char *out = test_read_text(log);
    if (rc != 0) fail_msg("cgspn train with precision = auto on the CPU failed:\n%s", out);
    assert_contains(out, "note: no GPU found, running on the CPU in fp32 (precision = auto: bf16 "
                         "on a GPU, fp32 on the CPU)\n");
    assert_contains(out, "device: cpu (");
    assert_contains(out, " threads, fp32)\n");
    free(out);
    snprintf(cmd, sizeof cmd, "CUDA_VISIBLE_DEVICES= ./cgspn train %s --precision=bf16 "
             "--run_name=bf16_cpu", cfg);
    assert_int_not_equal(test_run_logged(cmd, log), 0);
    out = test_read_text(log);
    assert_contains(out, "precision = bf16 needs the GPU");
    assert_contains(out, "hint: set precision = fp32 (or auto) on the CPU");
    free(out);
    char refused[700];
    snprintf(refused, sizeof refused, "%s/bf16_cpu", g_dir);
    assert_int_not_equal(access(refused, F_OK), 0);   // refused before a run folder was made
}

// ---- accumulation and lr scaling -------------------------------------------------------------------

static double first_logged(const char *run, const char *key) {
    char *m = metrics_of(run), pat[64];
    snprintf(pat, sizeof pat, "\"%s\": ", key);
    char *p = strstr(m, pat);
    if (!p) fail_msg("no %s in %s's metrics", key, run);
    double v = strtod(p + strlen(pat), NULL);
    free(m);
    return v;
}

static void test_gradient_accumulation_matches_one_large_batch(void **state) {
    enum { STEPS = 6 };
    Config one = fixture_config(g_dir, "vit", "batch8", STEPS);
    one.log_every = 1;
    one.grad_clip = 0;   // AdamW alone is blind to the gradient's scale: the logged norm is not
    Config acc = one;
    snprintf(acc.run_name, sizeof acc.run_name, "accum2x4");
    acc.accum_steps = 2;
    float a[STEPS], b[STEPS];
    TrainOptions oa = {.step_losses = a}, ob = {.step_losses = b};
    TrainResult ra = classify_train(&one, &oa), rb = classify_train(&acc, &ob);
    for (int i = 0; i < STEPS; i++) {
        double rel = fabs((double)a[i] - b[i]) / fabs((double)a[i]);
        printf("    step %d: batch 8 loss %.9f, 2 x 4 accumulated %.9f (rel %.1e)\n", i + 1, a[i], b[i], rel);
        assert_true(rel < ACCUM_TOL);
    }
    assert_true(fabs(ra.eval.loss - rb.eval.loss) < ACCUM_TOL * ra.eval.loss);
    double na = first_logged("batch8", "grad_norm"), nb = first_logged("accum2x4", "grad_norm");
    printf("    step 1 gradient norm: %.9g and %.9g\n", na, nb);
    assert_true(fabs(na - nb) < ACCUM_TOL * na);
}

// MESA (train/mesa.h): the steps of epochs before mesa_start_epoch are those of a run without it,
// bit for bit (the EMA forward adds nothing to the tape's gradient); from that epoch on the loss
// holds the term (6 steps per epoch: 48 images, batch 8).
static void test_mesa_starts_at_its_epoch(void **state) {
    enum { STEPS = 9 };
    Config plain = fixture_config(g_dir, "vit", "no_mesa", STEPS);
    plain.ema_decay = 0.9f;
    Config mesa = plain;
    snprintf(mesa.run_name, sizeof mesa.run_name, "mesa");
    mesa.mesa = 0.8f;
    mesa.mesa_start_epoch = 1;
    float a[STEPS], b[STEPS];
    TrainOptions oa = {.step_losses = a}, ob = {.step_losses = b};
    classify_train(&plain, &oa);
    classify_train(&mesa, &ob);
    for (int i = 0; i < STEPS; i++) printf("    step %d: loss %.7f, with MESA %.7f\n", i + 1, a[i], b[i]);
    assert_memory_equal(a, b, 6 * sizeof(float));
    for (int i = 6; i < STEPS; i++) {
        assert_true(isfinite(b[i]));
        assert_true(b[i] != a[i]);
    }
    assert_true(b[6] > a[6]);   // step 7's weights are the same: the KL term is positive
}

static void test_lr_scale_batch_scales_the_peak_rate(void **state) {
    Config c = fixture_config(g_dir, "vit", "lr_plain", 1);
    c.warmup_steps = 0;
    c.min_lr = 0;
    c.max_steps = 4;
    c.log_every = 1;
    classify_train(&c, NULL);
    Config s = c;
    snprintf(s.run_name, sizeof s.run_name, "lr_scaled");
    s.lr_scale_batch = 2;   // batch 8 / 2: four times lr
    classify_train(&s, NULL);
    assert_float_equal(first_logged("lr_plain", "lr"), 3e-3, 1e-9);   // cosine at its start
    assert_float_equal(first_logged("lr_scaled", "lr"), 4 * 3e-3, 1e-8);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_nonfinite_skip_skips_the_update_counts_and_logs_it, setup, teardown),
        cmocka_unit_test_setup_teardown(test_nonfinite_stop_names_the_step_and_keeps_the_last_checkpoint, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sigterm_finishes_the_step_writes_a_checkpoint_and_exits_0, setup, teardown),
        cmocka_unit_test_setup_teardown(test_eval_command_reproduces_the_trainers_evaluation, setup, teardown),
        cmocka_unit_test_setup_teardown(test_num_classes_other_than_the_shards_is_refused_by_train_and_eval, setup, teardown),
        cmocka_unit_test_setup_teardown(test_precision_auto_runs_fp32_on_a_cpu_and_says_so_and_bf16_is_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gradient_accumulation_matches_one_large_batch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_lr_scale_batch_scales_the_peak_rate, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mesa_starts_at_its_epoch, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
