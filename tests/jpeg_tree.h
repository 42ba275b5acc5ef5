// ImageNet's on-disk layout for the tests: Fashion-MNIST images (the real dataset when
// /usr/share/datasets/fashion-mnist is there, else the fixture's synthetic IDX set) written as
// JPEG files, train/<wnid>/*.JPEG and a flat val/ folder with Kaggle's LOC_val_solution.csv,
// built into DIR/shards (splits train, val) by the `cgspn data build` sources. Used by
// tests/test_imagefolder_train.c and tests/test_dist_train.c.
#pragma once
#include "train_fixture.h"
#include "../data/dataset.h"
#include "../data/idx.h"
#include "../data/image.h"
#include <sys/stat.h>
#include <unistd.h>

#define JPEG_TREE_FMNIST_DIR "/usr/share/datasets/fashion-mnist"

// Class k's wnid: n0..n9 shuffled, so the sorted order is not the label order.
static const char *const kJpegTreeWnid[10] = {"n07", "n03", "n09", "n01", "n05", "n00", "n08",
                                              "n02", "n06", "n04"};

static inline void jpeg_tree_write(const char *path, const uint8_t *pixels) {
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

// The real split when the Debian dataset is installed (true), else count synthetic images.
static inline bool jpeg_tree_load_split(const char *dir, int train, int count, FmnistSplit *s) {
    char err[1024];
    if (access(JPEG_TREE_FMNIST_DIR, R_OK) == 0 &&
        fmnist_load(JPEG_TREE_FMNIST_DIR, train, s, err, sizeof err) == 0)
        return true;
    char idx[600];
    snprintf(idx, sizeof idx, "%s/idx", dir);
    mkdir(idx, 0755);
    fixture_write_idx(idx, train ? "train" : "t10k", count, train ? 31 : 32);
    if (fmnist_load(idx, train, s, err, sizeof err)) fail_msg("%s", err);
    return false;
}

static inline void jpeg_tree_build_split(const char *dir, const char *split, BuildSource *src) {
    char out[600], err[2048];
    snprintf(out, sizeof out, "%s/shards", dir);
    BuildOptions o = {.out_dir = out, .split = split, .size = 28, .layout = SHARD_LAYOUT_SHORTER,
                      .channels = 1, .max_aspect = 3.0f, .shard_bytes = 1 << 20, .zstd_level = 1,
                      .threads = 2};
    BuildStats st;
    if (build_shards(src, &o, &st, err, sizeof err)) fail_msg("%s", err);
    build_source_free(src);
}

// The first n_train training and n_val test images as DIR/train/<wnid>/*.JPEG and DIR/val/*.JPEG
// + DIR/LOC_val_solution.csv, then DIR/shards. Returns whether the images are Fashion-MNIST's.
static inline bool jpeg_tree_build(const char *dir, int n_train, int n_val) {
    FmnistSplit tr, te;
    bool real = jpeg_tree_load_split(dir, 1, n_train, &tr);
    jpeg_tree_load_split(dir, 0, n_val, &te);
    char path[700];
    snprintf(path, sizeof path, "%s/train", dir);
    mkdir(path, 0755);
    for (int k = 0; k < 10; k++) {
        snprintf(path, sizeof path, "%s/train/%s", dir, kJpegTreeWnid[k]);
        mkdir(path, 0755);
    }
    for (int i = 0; i < n_train; i++) {
        snprintf(path, sizeof path, "%s/train/%s/%05d.JPEG", dir, kJpegTreeWnid[tr.labels.labels[i]], i);
        jpeg_tree_write(path, tr.images.pixels + (size_t)i * 784);
    }
    snprintf(path, sizeof path, "%s/val", dir);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/LOC_val_solution.csv", dir);
    FILE *sol = fopen(path, "w");
    assert_non_null(sol);
    fprintf(sol, "ImageId,PredictionString\n");
    for (int i = 0; i < n_val; i++) {
        snprintf(path, sizeof path, "%s/val/val_%05d.JPEG", dir, i);
        jpeg_tree_write(path, te.images.pixels + (size_t)i * 784);
        fprintf(sol, "val_%05d,%s 0 0 27 27\n", i, kJpegTreeWnid[te.labels.labels[i]]);
    }
    fclose(sol);
    BuildSource src;
    char root[700], labels[700], err[2048];
    snprintf(root, sizeof root, "%s/train", dir);
    if (build_source_imagefolder(&src, root, false, err, sizeof err)) fail_msg("%s", err);
    int n_classes = src.num_classes;
    char **classes = malloc(sizeof(char *) * (size_t)n_classes);   // train's, for the val split
    for (int k = 0; k < n_classes; k++) classes[k] = strdup(src.class_names[k]);
    jpeg_tree_build_split(dir, "train", &src);
    snprintf(root, sizeof root, "%s/val", dir);
    snprintf(labels, sizeof labels, "%s/LOC_val_solution.csv", dir);
    if (build_source_labeled_folder(&src, root, labels, err, sizeof err)) fail_msg("%s", err);
    // A small val set may lack some classes: it takes train's indices, as cgspn data build does.
    if (build_source_use_classes(&src, classes, n_classes, "train", err, sizeof err))
        fail_msg("%s", err);
    for (int k = 0; k < n_classes; k++) free(classes[k]);
    free(classes);
    jpeg_tree_build_split(dir, "val", &src);
    fmnist_free(&tr);
    fmnist_free(&te);
    return real;
}
