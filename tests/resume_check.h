// `cgspn train` resumes bit-exactly: the check shared by the CPU test (tests/test_checkpoint.c)
// and the GPU one (tests/gpu/test_train_resume_gpu.c). Train 2N steps; separately train N, stop
// (like a killed run), resume with --resume=auto and train N more; and resume the first run's
// middle checkpoint by path into a third run folder. Every step's loss, every logged line, the
// final weights, optimizer state and EMA must be the same bits.
#pragma once
#include "train_fixture.h"
#include "../train/classify.h"

// The full recipe, so that every random source is covered: random-resized crops, flips,
// RandAugment, erasing, mixup/cutmix, label smoothing, drop path over 2 blocks, an EMA with MESA
// against it, and gradient accumulation (2 micro-batches of 4 per step). device "cpu" (fp32) or "cuda"
// (precision auto: bf16 weights and activations, fp32 masters). grad_checkpoint: the config key.
static inline Config resume_recipe_config(const char *dir, const char *model, const char *device,
                                          const char *run_name, long total, int grad_checkpoint) {
    Config c = fixture_config(dir, model, run_name, total);
    c.grad_checkpoint = grad_checkpoint;
    snprintf(c.device, sizeof c.device, "%s", device);
    c.depth = 2;
    c.rrc_scale_min = 0.5f;
    c.rrc_ratio_min = 0.75f;
    c.rrc_ratio_max = 1.3333334f;
    c.hflip = 0.5f;
    c.randaug_n = 2;
    c.reprob = 0.25f;
    c.mixup_alpha = 0.8f;
    c.cutmix_alpha = 1.0f;
    c.drop_path = 0.2f;
    c.ema_decay = 0.9f;
    c.mesa = 0.5f;   // from epoch 0: every step reads the EMA model, restored on resume
    c.accum_steps = 2;
    return c;
}

static inline void resume_assert_bits_equal(const float *a, const float *b, long n,
                                            const char *what) {
    for (long i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0)
            fail_msg("%s: step %ld loss %.9g vs %.9g", what, i + 1, a[i], b[i]);
}

// The "loss" values of DIR/RUN/metrics.jsonl (the logged means of each log window), in order,
// as the text written (%.9g: exact for floats summed in double); returns how many.
static inline int resume_logged_losses(const char *dir, const char *run, char out[][32], int max) {
    char path[600];
    snprintf(path, sizeof path, "%s/%s/metrics.jsonl", dir, run);
    size_t n;
    char *text = (char *)test_read_bytes(path, &n);
    text = realloc(text, n + 1);
    text[n] = 0;
    int count = 0;
    for (char *p = text; (p = strstr(p, "\"loss\": ")) != NULL && count < max; p++)
        sscanf(p + 8, "%31[^,}]", out[count++]);
    free(text);
    return count;
}

// Builds the fixture shards in DIR and checks a MODEL ("vit", "cgspn") run on DEVICE.
static inline void resume_is_bit_exact(const char *dir, const char *model, const char *device,
                                       int grad_checkpoint) {
    enum { N = 5, TOTAL = 2 * N };   // 48 images / batch 8 = 6 steps per epoch: crosses an epoch
    fixture_build_shards(dir, 48, 16);
    float full[TOTAL], split_losses[TOTAL];
    memset(split_losses, 0xff, sizeof split_losses);

    Config a = resume_recipe_config(dir, model, device, "full", TOTAL, grad_checkpoint);
    TrainOptions oa = {.step_losses = full};
    TrainResult ra = classify_train(&a, &oa);
    assert_int_equal(ra.step, TOTAL);

    Config b = resume_recipe_config(dir, model, device, "split", TOTAL, grad_checkpoint);   // stopped after N
    TrainOptions ob = {.stop_after = N, .step_losses = split_losses};
    TrainResult rb = classify_train(&b, &ob);
    assert_int_equal(rb.step, N);
    snprintf(b.resume, sizeof b.resume, "auto");
    TrainOptions oc = {.step_losses = split_losses};
    TrainResult rc = classify_train(&b, &oc);
    assert_int_equal(rc.step, TOTAL);
    resume_assert_bits_equal(full, split_losses, TOTAL, model);

    // Resuming the uninterrupted run's middle checkpoint by path, into another run folder.
    Config d = resume_recipe_config(dir, model, device, "from_path", TOTAL, grad_checkpoint);
    snprintf(d.resume, sizeof d.resume, "%s/full/step_%08d", dir, N);
    float from_path[TOTAL];
    memcpy(from_path, full, sizeof from_path);
    memset(from_path + N, 0xff, N * sizeof(float));
    TrainOptions od = {.step_losses = from_path};
    classify_train(&d, &od);
    resume_assert_bits_equal(full, from_path, TOTAL, model);

    // The logged losses: the log window spanning the resume (steps 4-6) included.
    char la[8][32], lb[8][32];
    int na = resume_logged_losses(dir, "full", la, 8), nb = resume_logged_losses(dir, "split", lb, 8);
    assert_int_equal(na, TOTAL / 3 + 1);
    assert_int_equal(nb, na);
    for (int i = 0; i < na; i++) assert_string_equal(la[i], lb[i]);

    // Final weights and optimizer state: the same bytes.
    const char *files[] = {"model.safetensors", "state.safetensors"};
    for (int i = 0; i < 2; i++) {
        char x[600], y[600], z[600];
        snprintf(x, sizeof x, "%s/full/step_%08d/%s", dir, TOTAL, files[i]);
        snprintf(y, sizeof y, "%s/split/step_%08d/%s", dir, TOTAL, files[i]);
        snprintf(z, sizeof z, "%s/from_path/step_%08d/%s", dir, TOTAL, files[i]);
        assert_files_equal(x, y);
        assert_files_equal(x, z);
    }
    assert_true(ra.eval.top1 == rc.eval.top1 && ra.eval.loss == rc.eval.loss);
    assert_true(ra.eval_ema.count > 0 && ra.eval_ema.loss == rc.eval_ema.loss);
    assert_true(ra.status == TRAIN_DONE && rb.status == TRAIN_STOPPED && rc.status == TRAIN_DONE);
}
