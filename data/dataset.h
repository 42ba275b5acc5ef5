// A split of a shard folder: DIR/SPLIT.manifest lists the split's shards (DIR/SPLIT-NNNNN.cgs),
// its image count, channels, stored size and layout, class names and pixel mean/std. The
// builder writes the manifest last (tmp + fsync + rename), so a split without a manifest is
// an unfinished build. Functions return 0, or -1 with a message naming the file in err.
#pragma once
#include "shard.h"
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#define MANIFEST_MAGIC   "cgspn-shards"
#define MANIFEST_VERSION 1
#define MANIFEST_EXT     ".manifest"

typedef struct Manifest {
    char split[64];
    uint64_t images;
    int channels, image_size, layout, num_classes, num_shards;
    double mean[3], std[3];          // of pixel/255, per channel
    char **shard_files;              // names relative to the folder
    uint64_t *shard_images;
    char **class_names;
} Manifest;

typedef struct Dataset {
    char *dir;
    Manifest m;
    Shard *shards;                   // m.num_shards, open
    uint64_t *first;                 // m.num_shards + 1: index of each shard's first image
} Dataset;

int  manifest_read(Manifest *m, const char *path, char *err, size_t n);
// Writes DIR/SPLIT.manifest atomically (through a .tmp name, fsync, rename).
int  manifest_write(const Manifest *m, const char *dir, char *err, size_t n);
void manifest_free(Manifest *m);
// DIR/SPLIT.manifest into out.
void manifest_path(const char *dir, const char *split, char *out, size_t n);
// Mean and std per channel from summed statistics.
void manifest_set_stats(Manifest *m, const double *sum, const double *sumsq, uint64_t pixels);
// Whether two splits' class lists differ (labels are indices into them, so they must not); the
// first difference, naming both splits (a_name, b_name), into out: "class 3 is 'x' in train,
// 'y' in val" or "4 classes in train, 5 in val".
bool class_lists_differ(char *const *a, int na, const char *a_name, char *const *b, int nb,
                        const char *b_name, char *out, size_t n);

// Reads the manifest and opens every shard, checking each against it.
int  dataset_open(Dataset *d, const char *dir, const char *split, char *err, size_t n);
void dataset_close(Dataset *d);
// Which shard and record hold image i (< m.images).
void dataset_locate(const Dataset *d, uint64_t i, int *shard, uint64_t *record);
// Splits with a manifest in dir ("train", "val", ...), sorted; returns the count (<= max).
int  dataset_list_splits(const char *dir, char names[][64], int max);
