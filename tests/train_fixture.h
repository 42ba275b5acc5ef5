// Trainer test fixtures: a tiny Fashion-MNIST-shaped shard set (synthetic IDX files written to a
// folder and built into shards by the real `cgspn data build --from idx` path) and a small run
// config that trains on it in well under a second.
#pragma once
#include "testlib.h"
#include "../data/build.h"
#include "../data/shard_format.h"
#include "../train/config.h"
#include <sys/stat.h>

static inline void fixture_put_be32(FILE *f, uint32_t v) {
    uint8_t b[4] = {(uint8_t)(v >> 24), (uint8_t)(v >> 16), (uint8_t)(v >> 8), (uint8_t)v};
    fwrite(b, 1, 4, f);
}

// DIR/PREFIX-images-idx3-ubyte and DIR/PREFIX-labels-idx1-ubyte: count 28x28 images of random
// pixels, each labelled by its mean brightness (mod 10), so a model can learn something.
static inline void fixture_write_idx(const char *dir, const char *prefix, int count, uint64_t seed) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s-images-idx3-ubyte", dir, prefix);
    FILE *fi = fopen(path, "wb");
    snprintf(path, sizeof path, "%s/%s-labels-idx1-ubyte", dir, prefix);
    FILE *fl = fopen(path, "wb");
    if (!fi || !fl) fail_msg("cannot write IDX files in %s", dir);
    fixture_put_be32(fi, 0x00000803u);
    fixture_put_be32(fi, (uint32_t)count);
    fixture_put_be32(fi, 28);
    fixture_put_be32(fi, 28);
    fixture_put_be32(fl, 0x00000801u);
    fixture_put_be32(fl, (uint32_t)count);
    uint8_t img[28 * 28];
    for (int i = 0; i < count; i++) {
        uint64_t sum = 0;
        for (int k = 0; k < 28 * 28; k++) sum += img[k] = (uint8_t)(test_rng_next(&seed) >> 56);
        fwrite(img, 1, sizeof img, fi);
        uint8_t label = (uint8_t)((sum / 784) % 10);
        fwrite(&label, 1, 1, fl);
    }
    fclose(fi);
    fclose(fl);
}

// DIR/idx (synthetic IDX, n_train + n_val images) built into DIR/shards (splits train, val).
static inline void fixture_build_shards(const char *dir, int n_train, int n_val) {
    char idx[600], out[600], err[2048];
    snprintf(idx, sizeof idx, "%s/idx", dir);
    snprintf(out, sizeof out, "%s/shards", dir);
    mkdir(idx, 0755);
    fixture_write_idx(idx, "train", n_train, 11);
    fixture_write_idx(idx, "t10k", n_val, 12);
    const char *splits[] = {"train", "val"};
    for (int s = 0; s < 2; s++) {
        BuildSource src;
        if (build_source_idx(&src, idx, splits[s], err, sizeof err)) fail_msg("%s", err);
        BuildOptions o = {.out_dir = out, .split = splits[s], .size = 28,
                          .layout = SHARD_LAYOUT_SQUARE, .channels = 1, .max_aspect = 3.0f,
                          .shard_bytes = 16000, .zstd_level = 1, .threads = 1};
        BuildStats st;
        if (build_shards(&src, &o, &st, err, sizeof err)) fail_msg("%s", err);
        build_source_free(&src);
    }
}

// A 1-block model on the fixture's shards (no augmentation beyond what callers switch on),
// run folder DIR/RUN_NAME, CPU, fp32.
static inline Config fixture_config(const char *dir, const char *model, const char *run_name,
                                    long total) {
    Config c;
    config_defaults(&c);
    snprintf(c.model, sizeof c.model, "%s", model);
    c.width = 16;
    c.depth = 1;
    c.heads = 2;
    c.mlp_hidden = 32;
    c.patch = 7;
    if (strcmp(model, "vit") != 0) {
        c.class_token = 0;
        c.gspn_latent = 4;
    }
    snprintf(c.device, sizeof c.device, "cpu");
    snprintf(c.data_shards, sizeof c.data_shards, "%s/shards", dir);
    c.eval_crop_pct = 1.0f;
    c.rrc_scale_min = 1.0f;
    c.rrc_ratio_min = c.rrc_ratio_max = 1.0f;
    c.hflip = 0.0f;
    c.loader_threads = 2;
    c.batch_size = 8;
    c.max_steps = (int)total;
    c.warmup_steps = 3;
    c.lr = 3e-3f;
    c.log_every = 3;
    c.ckpt_every = 5;
    c.keep_last = 0;
    c.label_smoothing = 0.1f;
    snprintf(c.out_dir, sizeof c.out_dir, "%s", dir);
    snprintf(c.run_name, sizeof c.run_name, "%s", run_name);
    return c;
}

// The fixture's model made a tiny hierarchical GSPN (model = gspn_hier, nn/hier.h): one block per
// stage at width, width*2, *4, *8; a 3x3 mixer convolution; the 2-channel shared-weight proxy of
// configs/gspn_t.cfg. The 28 px images give grids 7, 4, 2, 1.
static inline void fixture_gspn_hier(Config *c, int width) {
    snprintf(c->model, sizeof c->model, "gspn_hier");
    snprintf(c->depths, sizeof c->depths, "1,1,1,1");
    c->width = width;
    c->mlp_ratio = 2;
    c->mixer_conv = 3;
    c->gspn_latent = 2;
    c->gspn_shared_w = 1;
    c->gspn_out_norm = 0;
    c->ln_eps = 1e-5f;
    c->class_token = 0;
    c->pos_embed = 0;
    snprintf(c->global_pool, sizeof c->global_pool, "avg");
}

// `./cgspn COMMAND ARG` (a config or run folder on the fixture's shards of 10 classes) run with a
// head narrower (num_classes 5) and wider (12), its output in DIR/nc.log: both refused, naming
// num_classes in the hint. Narrower, by the loader (a label past the head has no output); wider,
// by the command's own check ("cgspn COMMAND: ...", naming split).
static inline void fixture_expect_num_classes_refused(const char *dir, const char *command,
                                                      const char *arg, const char *split) {
    const int wrong[] = {5, 12};
    for (int i = 0; i < 2; i++) {
        char cmd[1400], log[600], what[128];
        snprintf(cmd, sizeof cmd, "./cgspn %s %s --num_classes=%d", command, arg, wrong[i]);
        snprintf(log, sizeof log, "%s/nc.log", dir);
        if (test_run_logged(cmd, log) == 0) fail_msg("%s was not refused", cmd);
        char *out = test_read_text(log);
        if (wrong[i] < 10)
            snprintf(what, sizeof what, "/%s: 10 classes; num_classes is %d\n", split, wrong[i]);
        else
            snprintf(what, sizeof what, "cgspn %s: num_classes = %d, but the %s split of", command,
                     wrong[i], split);
        assert_contains(out, what);
        assert_contains(out, "hint: set num_classes to the shards' class count");
        assert_null(strstr(out, "hint: build shards"));   // one hint, the one that applies
        free(out);
    }
}
