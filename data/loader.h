// The training / eval data loader over a shard split (data/dataset.h).
//
// Background threads read records, decode them (zstd) and augment them (data/augment.h) into a
// ring of prefetch + 1 batch buffers: the trainer holds one batch while the threads fill the
// next ones. Batches come out in a fixed order whatever the thread count:
//   - train: each epoch is a permutation of the split seeded by (seed, epoch); global step s
//     of an epoch takes permutation positions [s*G, (s+1)*G) (G = batch_size, all ranks) and
//     rank r the slice [s*G + r*B, s*G + (r+1)*B) (B = G / world); the last partial batch is
//     dropped (steps_per_epoch = N / G). Ranks therefore read disjoint slices.
//   - eval: the split in order, the last batch partial (steps_per_epoch = ceil(N / G); a rank
//     whose slice is past the end gets count 0).
// An image's augmentation is a pure function of (seed, epoch, image index); mixup/cutmix of
// (seed, epoch, step, rank). The stream never ends: after the last step of epoch e comes step 0
// of epoch e+1. The cursor (epoch, step) names the next batch; saving it and setting it in a
// new loader replays exactly the batches the old one would have produced.
#pragma once
#include "augment.h"
#include "dataset.h"
#include "resize.h"
#include <stdint.h>

typedef struct LoaderOptions {
    const char *dir;            // shard folder (cgspn data build --out)
    const char *split;          // "train", "val", ...
    int train;                  // 1: shuffle, augment, drop the last partial batch; 0: eval path
    int batch_size;             // global, over all ranks; must divide by world
    int rank, world;
    int img_size;               // output side
    int channels;               // 0 = the dataset's; else must match it
    int num_classes;            // target width; 0 = the dataset's (must be >= the dataset's)
    uint64_t seed;
    int threads;                // worker threads; 0 = online cores
    int prefetch;               // batches prepared ahead of the one the caller holds (>= 1)
    // train augmentation (timm names in parentheses)
    float rrc_scale_min, rrc_scale_max;   // random-resized-crop area fraction (scale)
    float rrc_ratio_min, rrc_ratio_max;   // and aspect w/h (ratio)
    float hflip;                // flip probability (hflip)
    int randaug_n;              // RandAugment ops per image; 0 = off
    float randaug_m, randaug_mstd;
    int randaug_inc;            // the "increasing" op variants (inc1)
    float reprob;               // random erasing probability (reprob)
    MixConfig mix;              // mixup/cutmix and label smoothing of the targets
    // eval
    float eval_crop_pct;        // resize shorter side to img_size / crop_pct, centre-crop
    ResizeFilter interp;
    int have_norm;              // 1: mean/std below; 0: the dataset's (from its manifest)
    float mean[3], std[3];
    // Batch image/target buffers (e.g. cudaMallocHost for pinned memory); NULL = malloc/free.
    void *(*alloc)(size_t bytes);
    void (*free)(void *p);
} LoaderOptions;

// timm ImageNet defaults: scale (0.08, 1), ratio (3/4, 4/3), hflip 0.5, no RandAugment,
// erasing, mixup or cutmix; mixup_prob 1, switch 0.5; crop_pct 0.875; bilinear; 2 prefetch.
void loader_options_default(LoaderOptions *o);

typedef struct Batch {
    float *images;              // (count, channels, height, width), normalized
    float *targets;             // (count, classes) soft targets, rows sum to 1
    int32_t *labels;            // (count) the label of each image before mixing
    uint32_t *indices;          // (count) index of each image in the split
    int count, channels, height, width, classes;
    int64_t epoch, step;        // this batch's place in the stream
    float lam;                  // mixup/cutmix weight of the unflipped batch (1 = not mixed)
} Batch;

typedef struct LoaderCursor { int64_t epoch, step; } LoaderCursor;

typedef struct Loader Loader;

// Opens the split and starts the threads at cursor (0, 0). NULL with a message on error.
Loader *loader_open(const LoaderOptions *o, char *err, size_t n);
// The next batch, valid until the next loader_next / loader_cursor_set / loader_close.
// NULL with a message (naming the shard and record) when a record cannot be read.
const Batch *loader_next(Loader *l, char *err, size_t n);
// The batch the next loader_next returns.
LoaderCursor loader_cursor_get(const Loader *l);
// Restarts the stream at c (discarding prepared batches). Returns 0, or -1 (err).
int loader_cursor_set(Loader *l, LoaderCursor c, char *err, size_t n);
int64_t loader_steps_per_epoch(const Loader *l);
const Dataset *loader_dataset(const Loader *l);
// The normalization in use (the options' or the dataset's).
void loader_norm(const Loader *l, float *mean, float *std);
void loader_close(Loader *l);

// The train permutation of epoch (count entries): what rank slices are cut from.
void loader_epoch_order(uint64_t seed, int64_t epoch, uint32_t *order, uint32_t count);
