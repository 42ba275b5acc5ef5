// A LayerNorm row's mean and rstd made as layernorm.cu makes them, to the bit, for the kernels
// that normalize rows they hold themselves (mlp_fused.cu's x tile, conv2d_stem.cu's outputs).
// layernorm.cu's short-row and cached kernels give pack p of a row (channels 8p .. 8p + 7) to
// lane p of L, sum each pack in order, then add the packs by a butterfly over xor L/2, ..., 2, 1.
// Here a lane holds NPK of a row's packs, whose numbers differ in the butterfly's high bits: its
// stages over them run in registers (k ^ NPK/2 first), then the lanes of the row pair up by the
// shuffles XOR..., the butterfly's remaining stages in its order. The same pairs are added in the
// same order (fp addition commutes), so the sums are the same.
#pragma once

// v[k]: the lane's pack k (zeros past the row, as layernorm.cu's idle lanes hold); live[k]: pack k
// lies within the row's C channels.
template <int NPK, int... XOR>
__device__ __forceinline__ void ln_row_stats(const float (&v)[NPK][8], const bool (&live)[NPK], int C, float eps,
                                             float &mean, float &rstd) {
    const auto row_sum = [](float (&t)[NPK]) {
        #pragma unroll
        for (int h = NPK / 2; h >= 1; h /= 2)
            #pragma unroll
            for (int k = 0; k < h; k++) t[k] = t[k] + t[k + h];
        float a = t[0];
        ((a += __shfl_xor_sync(0xffffffffu, a, XOR)), ...);
        return a;
    };
    float t[NPK];
    #pragma unroll
    for (int k = 0; k < NPK; k++) {
        float s = 0.0f;
        #pragma unroll
        for (int j = 0; j < 8; j++) s += v[k][j];
        t[k] = s;
    }
    const float m = row_sum(t) / (float)C;
    #pragma unroll
    for (int k = 0; k < NPK; k++) {
        float d2 = 0.0f;
        if (live[k]) {
            #pragma unroll
            for (int j = 0; j < 8; j++) d2 += (v[k][j] - m) * (v[k][j] - m);
        }
        t[k] = d2;
    }
    mean = m;
    rstd = 1.0f / sqrtf(row_sum(t) / (float)C + eps);
}
