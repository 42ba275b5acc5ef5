// Per-image augmentation, following timm's training transform
// (RandomResizedCropAndInterpolation -> RandomHorizontalFlip -> RandAugment -> ToTensor ->
// Normalize -> RandomErasing) and its eval transform (Resize(img / crop_pct) -> CenterCrop).
// All randomness comes from the Rng passed in, so an image's augmentation is a pure function
// of the stream the caller seeds (the loader: (seed, epoch, image index)).
#pragma once
#include "resize.h"
#include "../kernels/rng.h"
#include <stdint.h>

// A source rectangle in pixels (fractional for the eval crop).
typedef struct CropBox { float x0, y0, w, h; } CropBox;

// timm's RandomResizedCrop.get_params on an h x w image: 10 tries of area fraction in
// [scale_min, scale_max] and log-uniform aspect w/h in [ratio_min, ratio_max], then the
// central crop clamped to the ratio range.
CropBox aug_rrc_box(Rng *r, int h, int w, float scale_min, float scale_max, float ratio_min,
                    float ratio_max);
// The eval crop: resize the shorter side to floor(out / crop_pct) (torchvision Resize
// rounding), then centre-crop out x out; as one rectangle of the source.
CropBox aug_eval_box(int h, int w, int out, float crop_pct);

void aug_hflip_u8(uint8_t *img, int h, int w, int c);

// out (c, h, w) = (img (h, w, c) / 255 - mean) / std.
void aug_normalize(const uint8_t *img, int h, int w, int c, const float *mean, const float *std,
                   float *out);

// timm RandomErasing(probability, mode='pixel', max_count=1): with probability prob, one
// rectangle of area fraction [0.02, 1/3] and aspect [0.3, 1/0.3] (10 tries) is filled with
// standard-normal noise, per pixel and channel. img is (c, h, w), already normalized.
void aug_random_erase(float *img, int c, int h, int w, float prob, Rng *r);

// timm RandAugment ("rand-m{m}-n{n}-mstd{mstd}[-inc1]"): n ops drawn with replacement from
// the 15-op set (the "increasing" variants when inc), each applied with probability 0.5 at
// magnitude ~ N(m, mstd) clipped to [0, 10]. fill is the colour geometric ops leave behind
// (timm: round(255 * mean)). tmp needs h * w * c bytes.
void randaugment_u8(uint8_t *img, int h, int w, int c, int n, float m, float mstd, int inc,
                    const uint8_t *fill, Rng *r, uint8_t *tmp);

// The op set, for tests and logs.
typedef enum {
    RA_AUTOCONTRAST, RA_EQUALIZE, RA_INVERT, RA_ROTATE, RA_POSTERIZE, RA_SOLARIZE,
    RA_SOLARIZE_ADD, RA_COLOR, RA_CONTRAST, RA_BRIGHTNESS, RA_SHARPNESS, RA_SHEAR_X,
    RA_SHEAR_Y, RA_TRANSLATE_X, RA_TRANSLATE_Y, RA_NUM_OPS
} RandAugOp;
extern const char *const randaug_op_names[RA_NUM_OPS];
// One op at magnitude level (0..10); random sign and the inc variants as in timm.
void randaug_apply(RandAugOp op, uint8_t *img, int h, int w, int c, float level, int inc,
                   const uint8_t *fill, Rng *r, uint8_t *tmp);

// Batch-level mixing (timm Mixup, mode 'batch'): with probability prob, lam ~ Beta(a, a)
// from mixup_alpha, or from cutmix_alpha (switch_prob picks cutmix when both are on).
typedef struct MixConfig {
    float mixup_alpha, cutmix_alpha, prob, switch_prob, label_smoothing;
} MixConfig;
// Mixes images (b, c, h, w) in place with the batch flipped (image i with image b-1-i) and
// returns lam (1 = not mixed); cutmix pastes a box and corrects lam to the box's area.
float mix_batch(float *images, int b, int c, int h, int w, const MixConfig *m, Rng *r);
// targets (b, classes) = lam * onehot(labels) + (1 - lam) * onehot(flipped labels), each
// one-hot smoothed (off = s / K, on = 1 - s + s / K). Rows sum to 1.
void mix_targets(const int32_t *labels, int b, int classes, float lam, float smoothing,
                 float *targets);
// Gamma(shape, 1) and Beta(a, a) samples (Marsaglia-Tsang).
double rng_gamma(Rng *r, double shape);
double rng_beta(Rng *r, double a, double b);
