// ImageNet's layout end to end: Fashion-MNIST images (the real dataset when
// /usr/share/datasets/fashion-mnist is there, else the fixture's synthetic IDX set) written as
// JPEG files, train/<wnid>/*.JPEG and a flat val/ folder with Kaggle's LOC_val_solution.csv,
// built into shards by the `cgspn data build` sources, then trained by cgspn train. The val
// split's class indices must be the train split's (sorted wnids), and with the real images the
// model must learn: test top1 well above chance. Shards and runs that disagree on the classes
// are refused by name.
#include "testlib.h"
#include "jpeg_tree.h"
#include "../train/classify.h"

enum { N_TRAIN = 2000, N_VAL = 500 };

static char g_dir[256];
static int setup(void **state) { return test_make_temp_dir(g_dir, sizeof g_dir, "imagefolder"); }
static int teardown(void **state) { return test_remove_dir(g_dir); }

static void test_jpeg_imagefolder_with_a_flat_val_folder_trains(void **state) {
    bool real = jpeg_tree_build(g_dir, N_TRAIN, N_VAL);
    char err[2048];

    // Both splits name the classes n00..n09 in that order.
    char dir[600];
    snprintf(dir, sizeof dir, "%s/shards", g_dir);
    Dataset dtr, dva;
    if (dataset_open(&dtr, dir, "train", err, sizeof err)) fail_msg("%s", err);
    if (dataset_open(&dva, dir, "val", err, sizeof err)) fail_msg("%s", err);
    assert_int_equal(dtr.m.num_classes, 10);
    assert_int_equal(dva.m.num_classes, 10);
    for (int k = 0; k < 10; k++) assert_string_equal(dtr.m.class_names[k], dva.m.class_names[k]);
    assert_string_equal(dva.m.class_names[3], "n03");
    dataset_close(&dtr);
    dataset_close(&dva);

    Config c = fixture_config(g_dir, "vit", "jpeg_run", 0);
    c.width = 32, c.depth = 2, c.heads = 2, c.mlp_hidden = 64, c.patch = 7;
    c.epochs = 4;
    c.max_steps = 0;
    c.batch_size = 50;
    c.warmup_steps = 20;
    c.lr = 2e-3f;
    c.label_smoothing = 0;
    c.log_every = 40;
    c.ckpt_every = 0;
    TrainResult r = classify_train(&c, NULL);
    printf("    %s images: test top1 %.2f%% on %ld images after %ld steps\n", real ? "Fashion-MNIST"
           : "synthetic", 100 * r.eval.top1, r.eval.count, r.step);
    assert_int_equal(r.eval.count, N_VAL);
    assert_true(isfinite(r.eval.loss));
    if (real) assert_true(r.eval.top1 > 0.5);   // chance is 0.1
}

// What the shards and the run must agree on, through the command line: a head of another width
// than the shards' class count, a train split rebuilt with an extra class folder against the
// val split already there, and splits whose class lists differ, are refused by name (each would
// train on shifted or missing labels).
static void test_mismatched_classes_are_refused_by_name(void **state) {
    if (access("./cgspn", X_OK) != 0) fail_msg("./cgspn is not built (make test builds it first)");
    jpeg_tree_build(g_dir, 200, 50);
    Config c = fixture_config(g_dir, "vit", "wide_head", 2);
    c.num_classes = 1000;
    char cfg[600], log[600], cmd[2000];
    snprintf(cfg, sizeof cfg, "%s/wide.cfg", g_dir);
    snprintf(log, sizeof log, "%s/wide.log", g_dir);
    assert_int_equal(config_save(&c, cfg), 0);
    snprintf(cmd, sizeof cmd, "./cgspn train %s", cfg);
    assert_int_not_equal(test_run_logged(cmd, log), 0);
    char *out = test_read_text(log);
    assert_contains(out, "num_classes = 1000, but the train split of");
    assert_contains(out, "has 10 classes");
    free(out);
    // An extra class folder in train/ (one image), the train split rebuilt beside val.
    char extra[700];
    snprintf(extra, sizeof extra, "%s/train/n99", g_dir);
    mkdir(extra, 0755);
    snprintf(cmd, sizeof cmd, "cp \"$(ls %s/train/n00/*.JPEG | head -1)\" %s/", g_dir, extra);
    assert_int_equal(system(cmd), 0);
    snprintf(log, sizeof log, "%s/build.log", g_dir);
    snprintf(cmd, sizeof cmd, "./cgspn data build --from imagefolder %s/train --out %s/shards "
             "--size 28 --quiet", g_dir, g_dir);
    assert_int_not_equal(test_run_logged(cmd, log), 0);
    out = test_read_text(log);
    assert_contains(out, "the train split's classes differ from the val split in");
    assert_contains(out, "11 classes in train, 10 in val (the first 10 agree)");
    free(out);
    // A val split with a class the train split lacks (val takes train's indices: a class outside
    // them has none).
    snprintf(cmd, sizeof cmd, "mkdir -p %s/valx/n00 %s/valx/n99 && cp %s/train/n99/*.JPEG %s/valx/n00/ "
             "&& cp %s/train/n99/*.JPEG %s/valx/n99/", g_dir, g_dir, g_dir, g_dir, g_dir, g_dir);
    assert_int_equal(system(cmd), 0);
    snprintf(cmd, sizeof cmd, "./cgspn data build --from imagefolder %s/valx --out %s/shards "
             "--size 28 --val --quiet", g_dir, g_dir);
    assert_int_not_equal(test_run_logged(cmd, log), 0);
    out = test_read_text(log);
    assert_contains(out, "class 'n99' is not among the 10 classes of the train split in");
    free(out);
    // Splits that data build never compared (that val split built on its own, its files put
    // beside the train split): cgspn train compares the class lists and names the first
    // difference.
    snprintf(cmd, sizeof cmd, "./cgspn data build --from imagefolder %s/valx --out %s/shards_x "
             "--size 28 --channels 1 --val --quiet && mkdir %s/mixed && cp %s/shards/train* %s/shards_x/val* "
             "%s/mixed/", g_dir, g_dir, g_dir, g_dir, g_dir, g_dir);
    assert_int_equal(system(cmd), 0);
    snprintf(log, sizeof log, "%s/mixed.log", g_dir);
    snprintf(cmd, sizeof cmd, "./cgspn train %s --num_classes=10 --data_shards=%s/mixed", cfg, g_dir);
    assert_int_not_equal(test_run_logged(cmd, log), 0);
    out = test_read_text(log);
    assert_contains(out, "cgspn train: the train and val splits of");
    assert_contains(out, "name different classes: class 1 is 'n01' in train, 'n99' in val");
    free(out);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_jpeg_imagefolder_with_a_flat_val_folder_trains, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mismatched_classes_are_refused_by_name, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
