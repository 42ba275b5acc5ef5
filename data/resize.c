// Separable antialiased resampling: see resize.h. Weights follow PIL's precompute_coeffs.
#include "resize.h"
#include "../kernels/error.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

void resize_scratch_free(ResizeScratch *s) {
    free(s->tmp), free(s->wx), free(s->wy), free(s->ix), free(s->iy);
    memset(s, 0, sizeof *s);
}

static void *grow(void *p, size_t *cap, size_t want) {
    if (*cap >= want) return p;
    *cap = want + want / 2;
    free(p);
    return cg_malloc(*cap);
}

static float filter_support(ResizeFilter f) { return f == RESIZE_BICUBIC ? 2.0f : 1.0f; }

static float filter_eval(ResizeFilter f, float x) {
    if (x < 0) x = -x;
    if (f == RESIZE_BICUBIC) {
        const float a = -0.5f;   // PIL's bicubic
        if (x < 1) return ((a + 2) * x - (a + 3)) * x * x + 1;
        if (x < 2) return (((x - 5) * x + 8) * x - 4) * a;
        return 0;
    }
    return x < 1 ? 1 - x : 0;
}

// Taps for out_size outputs over [in0, in0 + len) of an axis of in_size pixels. Returns the
// taps per output (ksize); idx[2 o] = first input, idx[2 o + 1] = count; w[o * ksize + k].
static int coeffs(int in_size, float in0, float len, int out_size, ResizeFilter f, int **idx,
                  size_t *icap, float **w, size_t *wcap) {
    double scale = (double)len / out_size, fscale = scale < 1 ? 1 : scale;
    double support = filter_support(f) * fscale;
    int ksize = (int)ceil(support) * 2 + 1;
    *idx = grow(*idx, icap, sizeof(int) * 2 * (size_t)out_size);
    *w = grow(*w, wcap, sizeof(float) * (size_t)ksize * out_size);
    for (int o = 0; o < out_size; o++) {
        double center = in0 + (o + 0.5) * scale;
        int lo = (int)(center - support + 0.5), hi = (int)(center + support + 0.5);
        if (lo < 0) lo = 0;
        if (hi > in_size) hi = in_size;
        if (hi - lo > ksize) hi = lo + ksize;
        float *k = *w + (size_t)o * ksize;
        double sum = 0;
        for (int x = lo; x < hi; x++) {
            k[x - lo] = filter_eval(f, (float)((x - center + 0.5) / fscale));
            sum += k[x - lo];
        }
        if (hi <= lo || sum == 0) {   // rectangle off the image: nearest pixel
            lo = (int)center;
            lo = lo < 0 ? 0 : lo >= in_size ? in_size - 1 : lo;
            hi = lo + 1;
            k[0] = 1, sum = 1;
        }
        for (int x = 0; x < hi - lo; x++) k[x] = (float)(k[x] / sum);
        (*idx)[2 * o] = lo;
        (*idx)[2 * o + 1] = hi - lo;
    }
    return ksize;
}

void resize_crop_u8(const uint8_t *src, int sh, int sw, int c, float x0, float y0, float cw,
                    float ch, uint8_t *dst, int dh, int dw, ResizeFilter filter,
                    ResizeScratch *s) {
    // A same-size crop at whole-pixel offsets is a copy (the filter is 1 at each source pixel
    // and 0 at its neighbours): the eval path when the stored size is img_size / crop_pct.
    if (cw == (float)dw && ch == (float)dh && x0 == floorf(x0) && y0 == floorf(y0) && x0 >= 0 &&
        y0 >= 0 && (int)x0 + dw <= sw && (int)y0 + dh <= sh) {
        for (int y = 0; y < dh; y++)
            memcpy(dst + (size_t)y * dw * c, src + ((size_t)((int)y0 + y) * sw + (int)x0) * c,
                   (size_t)dw * c);
        return;
    }
    int kx = coeffs(sw, x0, cw, dw, filter, &s->ix, &s->ix_cap, &s->wx, &s->wx_cap);
    int ky = coeffs(sh, y0, ch, dh, filter, &s->iy, &s->iy_cap, &s->wy, &s->wy_cap);
    int ylo = s->iy[0], yhi = s->iy[2 * (dh - 1)] + s->iy[2 * (dh - 1) + 1];
    for (int o = 0; o < dh; o++) {
        if (s->iy[2 * o] < ylo) ylo = s->iy[2 * o];
        if (s->iy[2 * o] + s->iy[2 * o + 1] > yhi) yhi = s->iy[2 * o] + s->iy[2 * o + 1];
    }
    size_t row = (size_t)dw * c;
    s->tmp = grow(s->tmp, &s->tmp_cap, sizeof(float) * row * (size_t)(yhi - ylo + 1));

    // Horizontal: rows ylo..yhi-1 of src -> tmp (yhi - ylo, dw, c).
    for (int y = ylo; y < yhi; y++) {
        const uint8_t *in = src + (size_t)y * sw * c;
        float *out = s->tmp + (size_t)(y - ylo) * row;
        for (int o = 0; o < dw; o++) {
            int lo = s->ix[2 * o], cnt = s->ix[2 * o + 1];
            const float *k = s->wx + (size_t)o * kx;
            const uint8_t *p = in + (size_t)lo * c;
            if (c == 3) {
                float a0 = 0, a1 = 0, a2 = 0;
                for (int t = 0; t < cnt; t++, p += 3) a0 += k[t] * p[0], a1 += k[t] * p[1], a2 += k[t] * p[2];
                out[3 * o] = a0, out[3 * o + 1] = a1, out[3 * o + 2] = a2;
            } else {
                for (int ci = 0; ci < c; ci++) {
                    float a = 0;
                    for (int t = 0; t < cnt; t++) a += k[t] * p[(size_t)t * c + ci];
                    out[(size_t)o * c + ci] = a;
                }
            }
        }
    }
    // Vertical: tmp -> dst, rounded and clamped; acc is one output row.
    float *acc = s->tmp + row * (size_t)(yhi - ylo);
    for (int o = 0; o < dh; o++) {
        int lo = s->iy[2 * o], cnt = s->iy[2 * o + 1];
        const float *k = s->wy + (size_t)o * ky;
        for (size_t x = 0; x < row; x++) acc[x] = 0.5f;
        for (int t = 0; t < cnt; t++) {
            const float *r = s->tmp + (size_t)(lo - ylo + t) * row;
            float kt = k[t];
            for (size_t x = 0; x < row; x++) acc[x] += kt * r[x];
        }
        uint8_t *out = dst + (size_t)o * row;
        for (size_t x = 0; x < row; x++) {
            float a = acc[x];
            out[x] = a <= 0 ? 0 : a >= 255 ? 255 : (uint8_t)a;
        }
    }
}

void resize_u8(const uint8_t *src, int sh, int sw, int c, uint8_t *dst, int dh, int dw,
               ResizeFilter filter, ResizeScratch *s) {
    resize_crop_u8(src, sh, sw, c, 0, 0, (float)sw, (float)sh, dst, dh, dw, filter, s);
}

void resize_f32(const float *src, int sh, int sw, float *dst, int dh, int dw, ResizeFilter filter,
                ResizeScratch *s) {
    if (sh == dh && sw == dw) {   // the filter is 1 at each source pixel: a copy
        memcpy(dst, src, (size_t)dh * dw * sizeof(float));
        return;
    }
    int kx = coeffs(sw, 0, (float)sw, dw, filter, &s->ix, &s->ix_cap, &s->wx, &s->wx_cap);
    int ky = coeffs(sh, 0, (float)sh, dh, filter, &s->iy, &s->iy_cap, &s->wy, &s->wy_cap);
    // Horizontal: every source row -> tmp (sh, dw).
    s->tmp = grow(s->tmp, &s->tmp_cap, sizeof(float) * (size_t)sh * dw);
    for (int y = 0; y < sh; y++) {
        const float *in = src + (size_t)y * sw;
        float *out = s->tmp + (size_t)y * dw;
        for (int o = 0; o < dw; o++) {
            int lo = s->ix[2 * o], cnt = s->ix[2 * o + 1];
            const float *k = s->wx + (size_t)o * kx;
            float a = 0;
            for (int t = 0; t < cnt; t++) a += k[t] * in[lo + t];
            out[o] = a;
        }
    }
    // Vertical: tmp -> dst (dh, dw).
    for (int o = 0; o < dh; o++) {
        int lo = s->iy[2 * o], cnt = s->iy[2 * o + 1];
        const float *k = s->wy + (size_t)o * ky;
        float *out = dst + (size_t)o * dw;
        for (int x = 0; x < dw; x++) out[x] = 0;
        for (int t = 0; t < cnt; t++) {
            const float *r = s->tmp + (size_t)(lo + t) * dw;
            float kt = k[t];
            for (int x = 0; x < dw; x++) out[x] += kt * r[x];
        }
    }
}
