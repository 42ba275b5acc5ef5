// Loader options from the run config (the data keys of train/config_keys.h).
#pragma once
#include "config.h"
#include "../data/loader.h"

// Fills o for the train (train = 1: train_split, augmented) or eval (val_split) stream of
// this rank. Exits with a message naming the key when data_mean / data_std do not parse.
void loader_options_from_config(const Config *c, int train, int rank, int world,
                                LoaderOptions *o);

// Opens the train (train = 1) or eval loader of this config with batch images per step (pinned:
// host buffers from the device's pinned allocator), or exits naming the shards and how to build
// them.
Loader *loader_open_from_config(const Config *c, int train, int batch, bool pinned);
// The same for rank of world (batch global, divisible by world): this rank's slice of every batch.
Loader *loader_open_from_config_rank(const Config *c, int train, int batch, bool pinned, int rank,
                                     int world);

// Exits with a message when the shards do not fit the run: the train and val splits name
// different classes (labels index them; the first difference named), or a head of num_classes
// outputs (> 0) has not one per class. train or val may be NULL. who names the command.
void data_check_classes(const Config *c, const Loader *train, const Loader *val, const char *who);
