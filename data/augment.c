// Crops, flip, normalization and random erasing: see augment.h.
#include "augment.h"
#include <math.h>
#include <string.h>

static float uniform(Rng *r, float a, float b) { return a + (b - a) * rng_uniform(r); }
static int randint(Rng *r, int a, int b) { return a + (int)rng_below(r, (uint32_t)(b - a + 1)); }

CropBox aug_rrc_box(Rng *r, int h, int w, float scale_min, float scale_max, float ratio_min,
                    float ratio_max) {
    double area = (double)h * w, lr0 = log(ratio_min), lr1 = log(ratio_max);
    for (int attempt = 0; attempt < 10; attempt++) {
        double target = uniform(r, scale_min, scale_max) * area;
        double aspect = exp(lr0 + (lr1 - lr0) * rng_uniform(r));
        int cw = (int)nearbyint(sqrt(target * aspect)), ch = (int)nearbyint(sqrt(target / aspect));
        if (cw >= 1 && ch >= 1 && cw <= w && ch <= h) {
            int top = randint(r, 0, h - ch), left = randint(r, 0, w - cw);
            return (CropBox){(float)left, (float)top, (float)cw, (float)ch};
        }
    }
    double in_ratio = (double)w / h;   // fallback: central crop within the ratio range
    int cw = w, ch = h;
    if (in_ratio < ratio_min) ch = (int)nearbyint(w / ratio_min);
    else if (in_ratio > ratio_max) cw = (int)nearbyint(h * ratio_max);
    if (ch > h) ch = h;
    if (cw > w) cw = w;
    if (ch < 1) ch = 1;
    if (cw < 1) cw = 1;
    return (CropBox){(float)((w - cw) / 2), (float)((h - ch) / 2), (float)cw, (float)ch};
}

CropBox aug_eval_box(int h, int w, int out, float crop_pct) {
    int scale = (int)floor(out / (double)crop_pct);
    if (scale < out) scale = out;
    int rh, rw;   // torchvision Resize(int): shorter side -> scale, longer truncated
    if (w <= h) rw = scale, rh = (int)((double)scale * h / w);
    else rh = scale, rw = (int)((double)scale * w / h);
    int top = (int)nearbyint((rh - out) / 2.0), left = (int)nearbyint((rw - out) / 2.0);
    double sx = (double)w / rw, sy = (double)h / rh;
    return (CropBox){(float)(left * sx), (float)(top * sy), (float)(out * sx), (float)(out * sy)};
}

void aug_hflip_u8(uint8_t *img, int h, int w, int c) {
    for (int y = 0; y < h; y++) {
        uint8_t *row = img + (size_t)y * w * c;
        for (int a = 0, b = w - 1; a < b; a++, b--)
            for (int k = 0; k < c; k++) {
                uint8_t t = row[a * c + k];
                row[a * c + k] = row[b * c + k];
                row[b * c + k] = t;
            }
    }
}

void aug_normalize(const uint8_t *img, int h, int w, int c, const float *mean, const float *std,
                   float *out) {
    size_t hw = (size_t)h * w;
    for (int k = 0; k < c; k++) {
        float scale = 1.0f / (255.0f * std[k]), shift = -mean[k] / std[k];
        float *o = out + k * hw;
        if (c == 1)
            for (size_t i = 0; i < hw; i++) o[i] = img[i] * scale + shift;
        else
            for (size_t i = 0; i < hw; i++) o[i] = img[i * c + k] * scale + shift;
    }
}

void aug_random_erase(float *img, int c, int h, int w, float prob, Rng *r) {
    if (prob <= 0 || rng_uniform(r) > prob) return;
    const float min_area = 0.02f, max_area = 1.0f / 3, lo = logf(0.3f), hi = logf(1 / 0.3f);
    double area = (double)h * w;
    for (int attempt = 0; attempt < 10; attempt++) {
        double target = uniform(r, min_area, max_area) * area;
        double aspect = exp(uniform(r, lo, hi));
        int eh = (int)nearbyint(sqrt(target * aspect)), ew = (int)nearbyint(sqrt(target / aspect));
        if (ew < w && eh < h) {
            int top = randint(r, 0, h - eh), left = randint(r, 0, w - ew);
            // Standard normals, two per Box-Muller draw (timm: torch normal_, per pixel).
            float spare = 0;
            int have = 0;
            for (int k = 0; k < c; k++)
                for (int y = top; y < top + eh; y++) {
                    float *row = img + ((size_t)k * h + y) * w;
                    for (int x = left; x < left + ew; x++) {
                        if (have) {
                            row[x] = spare, have = 0;
                            continue;
                        }
                        float u1 = ((rng_u64(r) >> 40) + 1.0f) * (1.0f / 16777217.0f);   // (0, 1)
                        float u2 = (rng_u64(r) >> 40) * (float)(2 * M_PI / 16777216.0);
                        float rad = sqrtf(-2.0f * logf(u1)), sn, cs;
                        sn = sinf(u2), cs = cosf(u2);
                        row[x] = rad * cs, spare = rad * sn, have = 1;
                    }
                }
            return;
        }
    }
}
