// MNIST-style IDX files (uint8 images and labels), plain or gzip'd: zlib's gzread reads both.
// Fashion-MNIST ships as gzip'd IDX under /usr/share/datasets/fashion-mnist/ (Debian's
// dataset-fashion-mnist). Header: magic (big-endian u32: 0x00000803 images, 0x00000801
// labels), then one big-endian u32 per dim, then the data, row-major.
// Loaders return 0, or -1 with a message naming the file, what is wrong and what was expected
// written into err (a "\n  hint: " line where one helps); out is then left empty.
#pragma once
#include <stddef.h>
#include <stdint.h>

#define IDX_MAGIC_IMAGES 0x00000803u   // uint8 (0x08), 3 dims
#define IDX_MAGIC_LABELS 0x00000801u   // uint8 (0x08), 1 dim
#define IDX_MAX_SIDE     4096          // rows, cols above this mean a corrupt header
#define IDX_MAX_COUNT    100000000     // likewise for the image / label count
#define FMNIST_CLASSES   10

typedef struct {
    uint8_t *pixels;   // (count, rows, cols), row-major, 0 = background
    int count, rows, cols;
} IdxImages;

typedef struct {
    uint8_t *labels;   // (count)
    int count;
} IdxLabels;

typedef struct {
    IdxImages images;
    IdxLabels labels;  // labels.count == images.count, every label < FMNIST_CLASSES
} FmnistSplit;

int  idx_load_images(const char *path, IdxImages *out, char *err, size_t n);
int  idx_load_labels(const char *path, IdxLabels *out, char *err, size_t n);
void idx_free_images(IdxImages *im);
void idx_free_labels(IdxLabels *lb);

// The train (train != 0: train-*) or test (t10k-*) split from dir: {prefix}-images-idx3-ubyte
// and {prefix}-labels-idx1-ubyte, with ".gz" or, when that is absent, without. Checks that the
// counts match, there is at least one image and every label is below FMNIST_CLASSES.
int  fmnist_load(const char *dir, int train, FmnistSplit *out, char *err, size_t n);
void fmnist_free(FmnistSplit *s);
