// Seeded, reproducible random numbers (splitmix64 seeding a xoshiro256** stream).
// The whole state is 4 words, so it goes into checkpoints as is.
#pragma once
#include <stdint.h>

typedef struct Rng { uint64_t s[4]; } Rng;

void rng_seed(Rng *r, uint64_t seed);
// An independent stream for (seed, purpose, index): e.g. per rank, per epoch, per parameter.
void rng_seed_stream(Rng *r, uint64_t seed, uint64_t purpose, uint64_t index);
uint64_t rng_u64(Rng *r);
uint32_t rng_below(Rng *r, uint32_t n);      // uniform in [0, n)
float rng_uniform(Rng *r);                   // [0, 1)
float rng_normal(Rng *r);                    // standard normal (Box-Muller)
// Normal(0, std) truncated to [-2 std, 2 std] by resampling (timm's trunc_normal_(std=...)).
float rng_trunc_normal(Rng *r, float std);
void rng_shuffle_u32(Rng *r, uint32_t *a, uint32_t n);   // Fisher-Yates
