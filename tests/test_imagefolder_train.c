// ImageNet's layout end to end (issue 17, item 5): Fashion-MNIST images (the real dataset when
// /usr/share/datasets/fashion-mnist is there, else the fixture's synthetic IDX set) written as
// JPEG files, train/<wnid>/*.JPEG and a flat val/ folder with Kaggle's LOC_val_solution.csv,
// built into shards by the `cgspn data build` sources, then trained by cgspn train. The val
// split's class indices must be the train split's (sorted wnids), and with the real images the
// model must learn: test top1 well above chance.
#include "testlib.h"
#include "train_fixture.h"
#include "../data/dataset.h"
#include "../data/idx.h"
#include "../data/image.h"
#include "../train/classify.h"
#include <sys/stat.h>
#include <unistd.h>

#define FMNIST_DIR "/usr/share/datasets/fashion-mnist"
enum { N_TRAIN = 2000, N_VAL = 500 };

static char g_dir[256];
static int setup(void **state) { return test_make_temp_dir(g_dir, sizeof g_dir, "imagefolder"); }
static int teardown(void **state) { return test_remove_dir(g_dir); }

static void write_jpeg(const char *path, const uint8_t *pixels) {
    uint8_t *buf;
    size_t size;
    char err[1024];
    if (image_encode_jpeg(pixels, 28, 28, 1, 95, &buf, &size, err, sizeof err)) fail_msg("%s", err);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(buf, 1, size, f), size);
    fclose(f);
    free(buf);
}

// Class k's wnid: n0..n9 shuffled, so the sorted order is not the label order.
static const char *const kWnid[10] = {"n07", "n03", "n09", "n01", "n05", "n00", "n08", "n02",
                                      "n06", "n04"};

static bool load_split(int train, int count, FmnistSplit *s) {
    char err[1024];
    if (access(FMNIST_DIR, R_OK) == 0 && fmnist_load(FMNIST_DIR, train, s, err, sizeof err) == 0)
        return true;
    char idx[600];   // the fixture's synthetic IDX files
    snprintf(idx, sizeof idx, "%s/idx", g_dir);
    mkdir(idx, 0755);
    fixture_write_idx(idx, train ? "train" : "t10k", count, train ? 31 : 32);
    if (fmnist_load(idx, train, s, err, sizeof err)) fail_msg("%s", err);
    return false;
}

static void build(const char *split, BuildSource *src) {
    char out[600], err[2048];
    snprintf(out, sizeof out, "%s/shards", g_dir);
    BuildOptions o = {.out_dir = out, .split = split, .size = 28, .layout = SHARD_LAYOUT_SHORTER,
                      .channels = 1, .max_aspect = 3.0f, .shard_bytes = 1 << 20, .zstd_level = 1,
                      .threads = 2};
    BuildStats st;
    if (build_shards(src, &o, &st, err, sizeof err)) fail_msg("%s", err);
    build_source_free(src);
}

static void test_jpeg_imagefolder_with_a_flat_val_folder_trains(void **state) {
    FmnistSplit tr, te;
    bool real = load_split(1, N_TRAIN, &tr);
    load_split(0, N_VAL, &te);
    char path[700];
    snprintf(path, sizeof path, "%s/train", g_dir);
    mkdir(path, 0755);
    for (int k = 0; k < 10; k++) {
        snprintf(path, sizeof path, "%s/train/%s", g_dir, kWnid[k]);
        mkdir(path, 0755);
    }
    for (int i = 0; i < N_TRAIN; i++) {
        snprintf(path, sizeof path, "%s/train/%s/%05d.JPEG", g_dir, kWnid[tr.labels.labels[i]], i);
        write_jpeg(path, tr.images.pixels + (size_t)i * 784);
    }
    snprintf(path, sizeof path, "%s/val", g_dir);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/LOC_val_solution.csv", g_dir);
    FILE *sol = fopen(path, "w");
    assert_non_null(sol);
    fprintf(sol, "ImageId,PredictionString\n");
    for (int i = 0; i < N_VAL; i++) {
        snprintf(path, sizeof path, "%s/val/val_%05d.JPEG", g_dir, i);
        write_jpeg(path, te.images.pixels + (size_t)i * 784);
        fprintf(sol, "val_%05d,%s 0 0 27 27\n", i, kWnid[te.labels.labels[i]]);
    }
    fclose(sol);

    BuildSource src;
    char root[700], labels[700], err[2048];
    snprintf(root, sizeof root, "%s/train", g_dir);
    if (build_source_imagefolder(&src, root, err, sizeof err)) fail_msg("%s", err);
    build("train", &src);
    snprintf(root, sizeof root, "%s/val", g_dir);
    snprintf(labels, sizeof labels, "%s/LOC_val_solution.csv", g_dir);
    if (build_source_labeled_folder(&src, root, labels, err, sizeof err)) fail_msg("%s", err);
    build("val", &src);

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
    fmnist_free(&tr);
    fmnist_free(&te);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_jpeg_imagefolder_with_a_flat_val_folder_trains, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
