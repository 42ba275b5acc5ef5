#include "fmnist_batch.h"
#include "../nn/rng.h"

void fmnist_batch(const FmnistSplit *s, const uint32_t *indices, int n, float *images, int *labels) {
    size_t pix = (size_t)s->images.rows * s->images.cols;
    for (int b = 0; b < n; b++) {
        const uint8_t *src = s->images.pixels + (size_t)indices[b] * pix;
        for (size_t k = 0; k < pix; k++)
            images[(size_t)b * pix + k] = (src[k] * (1.0f / 255.0f) - FMNIST_MEAN) / FMNIST_STD;
        labels[b] = s->labels.labels[indices[b]];
    }
}

void fmnist_epoch_order(uint64_t seed, long epoch, uint32_t *order, uint32_t count) {
    for (uint32_t i = 0; i < count; i++) order[i] = i;
    Rng r;
    rng_seed_stream(&r, seed, 0xe90c, (uint64_t)epoch);
    rng_shuffle_u32(&r, order, count);
}
