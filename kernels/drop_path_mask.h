// The per-sample keep decision of drop path (kernels/ops.h, drop_path_fwd/bwd), shared by the
// CPU and CUDA backends so that both draw the same mask: a counter-based hash of
// (seed, step, site, sample) (splitmix64's finalizer, chained), no RNG state to carry or save.
#pragma once
#include <stdint.h>

#ifdef __CUDACC__
#define DROP_PATH_HD __host__ __device__ __forceinline__
#else
#define DROP_PATH_HD static inline
#endif

DROP_PATH_HD uint64_t drop_path_mix(uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// Uniform in [0, 1) with 24 bits, from (seed, step, site, sample).
DROP_PATH_HD float drop_path_uniform(uint64_t seed, int64_t step, int site, int sample) {
    uint64_t h = drop_path_mix(seed ^ 0xD509A7F1ull);
    h = drop_path_mix(h ^ (uint64_t)step);
    h = drop_path_mix(h ^ (uint64_t)(uint32_t)site);
    h = drop_path_mix(h ^ (uint64_t)(uint32_t)sample);
    return (float)(h >> 40) * (1.0f / 16777216.0f);
}

// The step a mask is drawn for: *step_at where the trainer keeps it on the device, else step.
DROP_PATH_HD int64_t drop_path_step(int64_t step, const int64_t *step_at) {
    return step_at ? *step_at : step;
}

// The factor sample `sample` (global index) is multiplied by: 1 / (1 - prob) when kept
// (probability 1 - prob, as torch's bernoulli_(keep_prob)), else 0.
DROP_PATH_HD float drop_path_scale(float prob, uint64_t seed, int64_t step, int site, int sample) {
    float keep = 1.0f - prob;
    return drop_path_uniform(seed, step, site, sample) < keep ? 1.0f / keep : 0.0f;
}
