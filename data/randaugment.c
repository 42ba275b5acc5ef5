// RandAugment on uint8 HWC images: timm's op set and level functions
// (timm/data/auto_augment.py), with the PIL operations they call written out.
#include "augment.h"
#include <math.h>
#include <string.h>

const char *const randaug_op_names[RA_NUM_OPS] = {
    "AutoContrast", "Equalize", "Invert", "Rotate", "Posterize", "Solarize", "SolarizeAdd",
    "Color", "Contrast", "Brightness", "Sharpness", "ShearX", "ShearY", "TranslateXRel",
    "TranslateYRel",
};

#define LEVEL_DENOM 10.0f        // timm _LEVEL_DENOM: magnitudes live in [0, 10]
#define TRANSLATE_PCT 0.45f      // timm translate_pct default
#define SOLARIZE_ADD_THRESH 128

static float rand_neg(Rng *r, float v) { return rng_uniform(r) > 0.5f ? -v : v; }

static void apply_lut(uint8_t *img, size_t hw, int c, uint8_t lut[][256]) {
    for (size_t i = 0; i < hw; i++)
        for (int k = 0; k < c; k++) img[i * c + k] = lut[k][img[i * c + k]];
}

static void histogram(const uint8_t *img, size_t hw, int c, int k, uint32_t h[256]) {
    memset(h, 0, 256 * sizeof(uint32_t));
    for (size_t i = 0; i < hw; i++) h[img[i * c + k]]++;
}

static void autocontrast(uint8_t *img, size_t hw, int c) {   // PIL ImageOps.autocontrast
    uint8_t lut[3][256];
    for (int k = 0; k < c; k++) {
        uint32_t h[256];
        histogram(img, hw, c, k, h);
        int lo = 0, hi = 255;
        while (lo < 255 && !h[lo]) lo++;
        while (hi > 0 && !h[hi]) hi--;
        for (int i = 0; i < 256; i++) {
            if (hi <= lo) { lut[k][i] = (uint8_t)i; continue; }
            double scale = 255.0 / (hi - lo), offset = -lo * scale;
            int v = (int)(i * scale + offset);
            lut[k][i] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
        }
    }
    apply_lut(img, hw, c, lut);
}

static void equalize(uint8_t *img, size_t hw, int c) {   // PIL ImageOps.equalize
    uint8_t lut[3][256];
    for (int k = 0; k < c; k++) {
        uint32_t h[256];
        histogram(img, hw, c, k, h);
        uint64_t total = 0, last = 0;
        int nonzero = 0;
        for (int i = 0; i < 256; i++)
            if (h[i]) total += h[i], last = h[i], nonzero++;
        uint64_t step = nonzero > 1 ? (total - last) / 255 : 0;
        uint64_t acc = step / 2;
        for (int i = 0; i < 256; i++) {
            if (!step) { lut[k][i] = (uint8_t)i; continue; }
            uint64_t v = acc / step;
            lut[k][i] = (uint8_t)(v > 255 ? 255 : v);
            acc += h[i];
        }
    }
    apply_lut(img, hw, c, lut);
}

static void point(uint8_t *img, size_t n, const uint8_t lut[256]) {
    for (size_t i = 0; i < n; i++) img[i] = lut[img[i]];
}

static uint8_t luma(const uint8_t *p, int c) {   // PIL's RGB -> L
    if (c == 1) return p[0];
    return (uint8_t)((p[0] * 19595u + p[1] * 38470u + p[2] * 7471u + 0x8000u) >> 16);
}

// PIL Image.blend(degenerate, img, f) = deg + f (img - deg), clipped and truncated.
static uint8_t blend(float deg, float v, float f) {
    float t = deg + f * (v - deg);
    return t <= 0 ? 0 : t >= 255 ? 255 : (uint8_t)t;
}

static void enhance(RandAugOp op, uint8_t *img, int h, int w, int c, float f, uint8_t *tmp) {
    size_t hw = (size_t)h * w;
    if (op == RA_BRIGHTNESS) {
        for (size_t i = 0; i < hw * c; i++) img[i] = blend(0, img[i], f);
    } else if (op == RA_CONTRAST) {
        uint64_t s = 0;
        for (size_t i = 0; i < hw; i++) s += luma(img + i * c, c);
        float mean = (float)(int)((double)s / hw + 0.5);
        for (size_t i = 0; i < hw * c; i++) img[i] = blend(mean, img[i], f);
    } else if (op == RA_COLOR) {
        if (c == 1) return;   // gray: the degenerate image is the image
        for (size_t i = 0; i < hw; i++) {
            float g = luma(img + 3 * i, 3);
            for (int k = 0; k < 3; k++) img[3 * i + k] = blend(g, img[3 * i + k], f);
        }
    } else {   // RA_SHARPNESS: degenerate = 3x3 SMOOTH filter (1 1 1 / 1 5 1 / 1 1 1) / 13
        memcpy(tmp, img, hw * c);
        for (int y = 1; y < h - 1; y++)
            for (int x = 1; x < w - 1; x++)
                for (int k = 0; k < c; k++) {
                    int s = 4 * tmp[((size_t)y * w + x) * c + k];
                    for (int dy = -1; dy <= 1; dy++)
                        for (int dx = -1; dx <= 1; dx++)
                            s += tmp[((size_t)(y + dy) * w + x + dx) * c + k];
                    float deg = (float)(int)(s / 13.0f + 0.5f);
                    img[((size_t)y * w + x) * c + k] = blend(deg, tmp[((size_t)y * w + x) * c + k], f);
                }
    }
}

// PIL Image.transform(AFFINE, (a, b, cx, d, e, cy), BILINEAR, fillcolor): output pixel centre
// (x, y) reads input (a x + b y + cx, d x + e y + cy); points outside the image get fill.
static void affine(uint8_t *img, int h, int w, int c, const double m[6], const uint8_t *fill,
                   uint8_t *tmp) {
    memcpy(tmp, img, (size_t)h * w * c);
    const float a = (float)m[0], d = (float)m[3];
    for (int y = 0; y < h; y++) {
        // Input coordinates of this row's first pixel centre, then + (a, d) per pixel.
        float xi = (float)(m[0] * 0.5 + m[1] * (y + 0.5) + m[2]);
        float yi = (float)(m[3] * 0.5 + m[4] * (y + 0.5) + m[5]);
        uint8_t *out = img + (size_t)y * w * c;
        for (int x = 0; x < w; x++, xi += a, yi += d, out += c) {
            if (!(xi >= 0 && xi < w && yi >= 0 && yi < h)) {
                for (int k = 0; k < c; k++) out[k] = fill[k];
                continue;
            }
            float u = xi - 0.5f, v = yi - 0.5f;
            int x0 = (int)floorf(u), y0 = (int)floorf(v);
            float fx = u - x0, fy = v - y0;
            int x1 = x0 + 1, y1 = y0 + 1;
            x0 = x0 < 0 ? 0 : x0, y0 = y0 < 0 ? 0 : y0;
            x1 = x1 >= w ? w - 1 : x1, y1 = y1 >= h ? h - 1 : y1;
            const uint8_t *p00 = tmp + ((size_t)y0 * w + x0) * c, *p01 = tmp + ((size_t)y0 * w + x1) * c;
            const uint8_t *p10 = tmp + ((size_t)y1 * w + x0) * c, *p11 = tmp + ((size_t)y1 * w + x1) * c;
            for (int k = 0; k < c; k++) {
                float top = p00[k] + fx * (p01[k] - p00[k]), bot = p10[k] + fx * (p11[k] - p10[k]);
                float val = top + fy * (bot - top) + 0.5f;
                out[k] = (uint8_t)(val >= 255 ? 255 : val);
            }
        }
    }
}

void randaug_apply(RandAugOp op, uint8_t *img, int h, int w, int c, float level, int inc,
                   const uint8_t *fill, Rng *r, uint8_t *tmp) {
    size_t hw = (size_t)h * w, n = hw * c;
    float lv = level / LEVEL_DENOM;
    uint8_t lut[256];
    switch (op) {
    case RA_AUTOCONTRAST: autocontrast(img, hw, c); break;
    case RA_EQUALIZE: equalize(img, hw, c); break;
    case RA_INVERT:
        for (size_t i = 0; i < n; i++) img[i] = (uint8_t)(255 - img[i]);
        break;
    case RA_POSTERIZE: {
        int bits = inc ? 4 - (int)(lv * 4) : (int)(lv * 4) + 4;
        if (bits >= 8) break;
        uint8_t mask = (uint8_t)~((1u << (8 - bits)) - 1);
        for (int i = 0; i < 256; i++) lut[i] = (uint8_t)(i & mask);
        point(img, n, lut);
        break;
    }
    case RA_SOLARIZE: {
        int thresh = inc ? 256 - (int)(lv * 256) : (int)(lv * 256);
        for (int i = 0; i < 256; i++) lut[i] = (uint8_t)(i < thresh ? i : 255 - i);
        point(img, n, lut);
        break;
    }
    case RA_SOLARIZE_ADD: {
        int add = (int)(lv * 110);
        for (int i = 0; i < 256; i++)
            lut[i] = (uint8_t)(i < SOLARIZE_ADD_THRESH ? (i + add > 255 ? 255 : i + add) : i);
        point(img, n, lut);
        break;
    }
    case RA_COLOR: case RA_CONTRAST: case RA_BRIGHTNESS: case RA_SHARPNESS: {
        float f;
        if (inc) {
            f = 1.0f + rand_neg(r, lv * 0.9f);
            if (f < 0.1f) f = 0.1f;
        } else {
            f = lv * 1.8f + 0.1f;
        }
        enhance(op, img, h, w, c, f, tmp);
        break;
    }
    case RA_ROTATE: {   // PIL Image.rotate(deg) about the centre, counter-clockwise
        double t = -rand_neg(r, lv * 30.0f) * M_PI / 180.0, cx = w / 2.0, cy = h / 2.0;
        double m[6] = {cos(t), sin(t), 0, -sin(t), cos(t), 0};
        m[2] = m[0] * -cx + m[1] * -cy + cx;
        m[5] = m[3] * -cx + m[4] * -cy + cy;
        affine(img, h, w, c, m, fill, tmp);
        break;
    }
    case RA_SHEAR_X: case RA_SHEAR_Y: {
        double s = rand_neg(r, lv * 0.3f);
        double m[6] = {1, op == RA_SHEAR_X ? s : 0, 0, op == RA_SHEAR_Y ? s : 0, 1, 0};
        affine(img, h, w, c, m, fill, tmp);
        break;
    }
    case RA_TRANSLATE_X: case RA_TRANSLATE_Y: {
        double p = rand_neg(r, lv * TRANSLATE_PCT);
        double m[6] = {1, 0, op == RA_TRANSLATE_X ? p * w : 0, 0, 1, op == RA_TRANSLATE_Y ? p * h : 0};
        affine(img, h, w, c, m, fill, tmp);
        break;
    }
    default: break;
    }
}

void randaugment_u8(uint8_t *img, int h, int w, int c, int n, float m, float mstd, int inc,
                    const uint8_t *fill, Rng *r, uint8_t *tmp) {
    RandAugOp ops[64];
    if (n > 64) n = 64;
    for (int i = 0; i < n; i++) ops[i] = (RandAugOp)rng_below(r, RA_NUM_OPS);
    for (int i = 0; i < n; i++) {
        if (rng_uniform(r) > 0.5f) continue;   // each op applies with probability 0.5
        float level = m;
        if (mstd > 0) level = isinf(mstd) ? m * rng_uniform(r) : m + mstd * rng_normal(r);
        level = level < 0 ? 0 : level > LEVEL_DENOM ? LEVEL_DENOM : level;
        randaug_apply(ops[i], img, h, w, c, level, inc, fill, r, tmp);
    }
}
