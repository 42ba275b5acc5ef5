// Batches from an in-memory Fashion-MNIST split (data/idx.h): uint8 28x28 -> normalized
// float (B,1,28,28), and an epoch order that depends only on (seed, epoch).
#pragma once
#include "idx.h"
#include <stdint.h>

#define FMNIST_MEAN 0.2860f   // of the training pixels in [0, 1]
#define FMNIST_STD  0.3530f

// images (n,1,rows,cols) = (pixel/255 - mean)/std for the listed indices; labels (n).
void fmnist_batch(const FmnistSplit *s, const uint32_t *indices, int n, float *images, int *labels);
// order (count) = a permutation of 0..count-1 seeded by (seed, epoch).
void fmnist_epoch_order(uint64_t seed, long epoch, uint32_t *order, uint32_t count);
