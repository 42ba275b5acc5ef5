// Batch-level mixup / cutmix (timm Mixup, mode 'batch', correct_lam=True): see augment.h.
#include "augment.h"
#include <math.h>
#include <string.h>

double rng_gamma(Rng *r, double shape) {   // Marsaglia & Tsang (2000)
    if (shape < 1) {
        double u = rng_uniform(r);
        while (u <= 0) u = rng_uniform(r);
        return rng_gamma(r, shape + 1) * pow(u, 1.0 / shape);
    }
    double d = shape - 1.0 / 3, c = 1.0 / sqrt(9 * d);
    for (;;) {
        double x = rng_normal(r), v = 1 + c * x;
        if (v <= 0) continue;
        v = v * v * v;
        double u = rng_uniform(r);
        if (u < 1 - 0.0331 * x * x * x * x) return d * v;
        if (u > 0 && log(u) < 0.5 * x * x + d * (1 - v + log(v))) return d * v;
    }
}

double rng_beta(Rng *r, double a, double b) {
    double x = rng_gamma(r, a), y = rng_gamma(r, b);
    return x + y > 0 ? x / (x + y) : 0.5;
}

float mix_batch(float *images, int b, int c, int h, int w, const MixConfig *m, Rng *r) {
    int mixup = m->mixup_alpha > 0, cutmix = m->cutmix_alpha > 0;
    if ((!mixup && !cutmix) || b < 2 || rng_uniform(r) >= m->prob) return 1.0f;
    int use_cutmix = cutmix && (!mixup || rng_uniform(r) < m->switch_prob);
    double alpha = use_cutmix ? m->cutmix_alpha : m->mixup_alpha;
    double lam = rng_beta(r, alpha, alpha);
    size_t img = (size_t)c * h * w;
    if (!use_cutmix) {
        float l = (float)lam, k = 1 - l;
        for (int i = 0; i < b / 2; i++) {   // pairs (i, b-1-i); an odd middle image mixes with itself
            float *x = images + i * img, *y = images + (size_t)(b - 1 - i) * img;
            for (size_t j = 0; j < img; j++) {
                float xi = x[j], yi = y[j];
                x[j] = l * xi + k * yi;
                y[j] = l * yi + k * xi;
            }
        }
        return l;
    }
    // timm rand_bbox: a box of sides int(h sqrt(1-lam)), int(w sqrt(1-lam)) around a uniform
    // centre, clipped; lam corrected to 1 - box area / image area.
    double ratio = sqrt(1 - lam);
    int cut_h = (int)(h * ratio), cut_w = (int)(w * ratio);
    int cy = (int)rng_below(r, (uint32_t)h), cx = (int)rng_below(r, (uint32_t)w);
    int yl = cy - cut_h / 2, yh = cy + cut_h / 2, xl = cx - cut_w / 2, xh = cx + cut_w / 2;
    yl = yl < 0 ? 0 : yl, xl = xl < 0 ? 0 : xl;
    yh = yh > h ? h : yh, xh = xh > w ? w : xh;
    for (int i = 0; i < b / 2; i++) {
        float *x = images + i * img, *y = images + (size_t)(b - 1 - i) * img;
        for (int k = 0; k < c; k++)
            for (int yy = yl; yy < yh; yy++) {
                size_t o = ((size_t)k * h + yy) * w;
                for (int xx = xl; xx < xh; xx++) {
                    float t = x[o + xx];
                    x[o + xx] = y[o + xx];
                    y[o + xx] = t;
                }
            }
    }
    return (float)(1.0 - (double)(yh - yl) * (xh - xl) / ((double)h * w));
}

void mix_targets(const int32_t *labels, int b, int classes, float lam, float smoothing,
                 float *targets) {
    float off = smoothing / classes, on = 1 - smoothing + off;
    for (int i = 0; i < b; i++) {
        float *t = targets + (size_t)i * classes;
        for (int k = 0; k < classes; k++) t[k] = off;
        t[labels[i]] += lam * (on - off);
        t[labels[b - 1 - i]] += (1 - lam) * (on - off);
    }
}
