// Building a split's shards (`cgspn data build`): images from a source (an ImageFolder tree or
// IDX files) are decoded, resized to the stored size, compressed and written in source order
// to DIR/SPLIT-NNNNN.cgs, a new shard after each ~shard_bytes, then DIR/SPLIT.manifest.
// Decoding, resizing and compression run on all cores (OpenMP); the output does not depend on
// the thread count. Unreadable images are reported by path and skipped (strict: the build
// fails). A failed build removes its shards and leaves no manifest.
#pragma once
#include "image.h"
#include <stdbool.h>
#include <stdint.h>

typedef struct BuildOptions {
    const char *out_dir;
    const char *split;       // "train", "val", ...
    int size;                // S: stored side (square layout) or shorter side (shorter layout)
    int layout;              // SHARD_LAYOUT_SQUARE or SHARD_LAYOUT_SHORTER
    int channels;            // 1 or 3
    float max_aspect;        // shorter layout: the longer side is centre-cropped to this * S
    uint64_t shard_bytes;    // a new shard once one reaches this size
    int zstd_level;
    int threads;             // 0 = all cores
    int strict;              // an unreadable image fails the build
    int progress;            // print progress and ETA to stderr
} BuildOptions;
#define BUILD_DEFAULT_SHARD_BYTES (1ull << 30)
#define BUILD_DEFAULT_ZSTD_LEVEL  3
#define BUILD_DEFAULT_MAX_ASPECT  3.0f

typedef struct BuildStats {
    uint64_t images, skipped, warnings, ignored;   // ignored: files of other types (imagefolder)
    uint64_t bytes;
    int shards;
    double seconds;
} BuildStats;

// Where images come from. get decodes item i into *im (to `channels` channels; min_side as in
// image_decode) and its label, returning 0 or -1 with a message naming the item.
typedef struct BuildSource {
    uint64_t count;
    int num_classes;
    char **class_names;
    void *ctx;
    int (*get)(void *ctx, uint64_t i, int channels, int min_side, Image *im, int *label,
               int *warning, char *err, size_t n);
    const char *(*name)(void *ctx, uint64_t i);
    uint64_t ignored;        // files skipped for their type while scanning
    int native_size;         // IDX: the images' side (a default for size); 0 = varies
    char note[512];          // what the scan left out, by name, for the caller to print ("")
} BuildSource;

int build_shards(const BuildSource *src, const BuildOptions *o, BuildStats *st, char *err,
                 size_t n);

// ROOT/CLASS/**/*.{png,jpg,jpeg} (any case); classes are ROOT's subfolders in sorted order,
// files sorted within each. Other files are counted as ignored. A class folder without images is
// refused by name (every subfolder is a class: an extra one shifts every later label), unless
// skip_empty, which leaves it out and names it in src->note.
int  build_source_imagefolder(BuildSource *src, const char *root, bool skip_empty, char *err,
                              size_t n);
// Renumbers a folder source's labels to another split's class list (names, n; whose names it in
// messages), so that a split holding some of the classes (a small val set) still uses the
// other's indices. A class not in the list is refused by name. 0, or -1 with a message.
int  build_source_use_classes(BuildSource *src, char *const *names, int n, const char *whose,
                              char *err, size_t en);
// A flat folder of images and a label file naming each one's class (ImageNet's val/ with a
// "NAME WNID" / "NAME,WNID" list, or Kaggle's LOC_val_solution.csv: header, then
// ImageId,"WNID x y ..."); names may leave out the image extension. Classes are the label
// file's class names in sorted order; images are in sorted path order. Images of the folder the
// label file does not name are not read; src->note counts them and names the first few.
int  build_source_labeled_folder(BuildSource *src, const char *dir, const char *labels, char *err,
                                 size_t n);
// MNIST-style IDX files in dir: split "train" reads train-*, any other split t10k-*.
// Class names are Fashion-MNIST's when dir's name contains "fashion", else the digits.
int  build_source_idx(BuildSource *src, const char *dir, const char *split, char *err, size_t n);
void build_source_free(BuildSource *src);
