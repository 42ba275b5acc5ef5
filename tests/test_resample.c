// Position-embedding resampling (timm's resample_abs_pos_embed: PyTorch bicubic, antialias).
#include "testlib.h"
#include "../nn/resample.h"

// Exact to float rounding of a few weighted sums.
#define RESAMPLE_TOL 1e-6f

// Same size: the filter at integer offsets is 1, 0, 0 -> the identity.
static void test_same_size_is_identity(void **state) {
    (void)state;
    Tensor *src = test_tensor(3, 5, 3, 4), *dst = test_tensor(3, 5, 3, 4);
    test_fill(src, 1, -1, 1);
    resample_bicubic_aa(src->data, 5, 3, dst->data, 5, 3, 4);
    for (size_t i = 0; i < src->numel; i++)
        assert_float_equal(tensor_f32(dst)[i], tensor_f32(src)[i], RESAMPLE_TOL);
    test_tensor_free(src);
    test_tensor_free(dst);
}

// Weights are normalized, so a constant grid stays constant when growing and shrinking.
static void test_constant_grid_stays_constant(void **state) {
    (void)state;
    int sizes[][4] = {{3, 3, 5, 7}, {6, 6, 4, 4}, {7, 2, 3, 9}};
    for (int s = 0; s < 3; s++) {
        int sh = sizes[s][0], sw = sizes[s][1], dh = sizes[s][2], dw = sizes[s][3];
        Tensor *src = test_tensor(3, sh, sw, 2), *dst = test_tensor(3, dh, dw, 2);
        for (size_t i = 0; i < src->numel; i++) tensor_f32(src)[i] = 0.75f;
        resample_bicubic_aa(src->data, sh, sw, dst->data, dh, dw, 2);
        for (size_t i = 0; i < dst->numel; i++) assert_float_equal(tensor_f32(dst)[i], 0.75f, RESAMPLE_TOL);
        test_tensor_free(src);
        test_tensor_free(dst);
    }
}

// 1x2 -> 1x4 of [1, 2], worked by hand. Upsampling (scale 0.5): support 2, no stretch.
// Output 0: centre 0.25, window [0, 2): taps at distance 0.25 and 1.25 with the a = -0.5 cubic:
//   f(0.25) = ((1.5)(0.25) - 2.5)(0.0625) + 1 = 0.8671875
//   f(1.25) = (((1.25 - 5)(1.25) + 8)(1.25) - 4)(-0.5) = -0.0703125
// normalized by their sum 0.796875: 1.0882353, -0.0882353 -> 1.0882353 - 0.1764706 = 0.9117647.
// Output 1: centre 0.75, distances (j + 0.5 - 0.75) = -0.25 -> f = 0.8671875 and
// 0.75 -> f(0.75) = ((1.5)(0.75) - 2.5)(0.5625) + 1 = 0.2265625; sum 1.09375:
// 0.7928571 * 1 + 0.2071429 * 2 = 1.2071429. By symmetry outputs 2, 3 are 3 - those.
static void test_upsample_matches_hand_computed_values(void **state) {
    (void)state;
    float src[2] = {1, 2}, dst[4];
    resample_bicubic_aa(src, 1, 2, dst, 1, 4, 1);
    const float want[4] = {0.9117647f, 1.2071429f, 1.7928571f, 2.0882353f};
    for (int i = 0; i < 4; i++) assert_float_equal(dst[i], want[i], 1e-6f);
}

// Shrinking 4 -> 2 stretches the filter by 2 (support 4): output 0 centre 1.0 covers inputs
// 0..3 with distances (j + 0.5 - 1) / 2 = -0.25, 0.25, 0.75, 1.25 -> weights 0.8671875,
// 0.8671875, 0.2265625, -0.0703125 (sum 1.890625). Of [1, 2, 3, 4]:
// (0.8671875 + 1.734375 + 0.6796875 - 0.28125) / 1.890625 = 3 / 1.890625.
static void test_downsample_matches_hand_computed_values(void **state) {
    (void)state;
    float src[4] = {1, 2, 3, 4}, dst[2];
    resample_bicubic_aa(src, 4, 1, dst, 2, 1, 1);
    float first = 3.0f / 1.890625f;
    assert_float_equal(dst[0], first, 1e-6f);
    assert_float_equal(dst[1], 5.0f - first, 1e-6f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_size_is_identity),
        cmocka_unit_test(test_constant_grid_stays_constant),
        cmocka_unit_test(test_upsample_matches_hand_computed_values),
        cmocka_unit_test(test_downsample_matches_hand_computed_values),
    };
    return cmocka_run_group_tests_name("resample", tests, NULL, NULL);
}
