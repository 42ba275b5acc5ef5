#include "rng.h"
#include <math.h>

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void rng_seed(Rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&seed);
}

void rng_seed_stream(Rng *r, uint64_t seed, uint64_t purpose, uint64_t index) {
    uint64_t x = seed;
    uint64_t mixed = splitmix64(&x) ^ (purpose * 0xD1B54A32D192ED03ull);
    x = mixed;
    mixed = splitmix64(&x) ^ (index * 0x8CB92BA72F3D8DD7ull);
    rng_seed(r, mixed);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t rng_u64(Rng *r) {
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

uint32_t rng_below(Rng *r, uint32_t n) { return (uint32_t)(((rng_u64(r) >> 32) * (uint64_t)n) >> 32); }

float rng_uniform(Rng *r) { return (float)(rng_u64(r) >> 40) * (1.0f / 16777216.0f); }

float rng_normal(Rng *r) {
    double u1 = ((rng_u64(r) >> 11) + 1.0) * (1.0 / 9007199254740993.0);   // (0, 1]
    double u2 = (rng_u64(r) >> 11) * (1.0 / 9007199254740992.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
}

float rng_trunc_normal(Rng *r, float std) {
    for (;;) {
        float z = rng_normal(r);
        if (z >= -2.0f && z <= 2.0f) return z * std;
    }
}

void rng_shuffle_u32(Rng *r, uint32_t *a, uint32_t n) {
    for (uint32_t i = n; i > 1; i--) {
        uint32_t j = rng_below(r, i);
        uint32_t t = a[i - 1];
        a[i - 1] = a[j];
        a[j] = t;
    }
}
