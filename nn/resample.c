#include "resample.h"
#include "../kernels/error.h"
#include <math.h>

static double bicubic_aa_filter(double x) {
    const double a = -0.5;
    if (x < 0) x = -x;
    if (x < 1) return ((a + 2) * x - (a + 3)) * x * x + 1;
    if (x < 2) return (((x - 5) * x + 8) * x - 4) * a;
    return 0;
}

// Weights of output index i over inputs [*first, *first + *count).
static void aa_weights(int in, int out, int i, int *first, int *count, double *w) {
    double scale = (double)in / out;
    double support = scale >= 1.0 ? 2.0 * scale : 2.0;
    double invscale = scale >= 1.0 ? 1.0 / scale : 1.0;
    double center = scale * (i + 0.5);
    long lo = (long)(center - support + 0.5);
    if (lo < 0) lo = 0;
    long hi = (long)(center + support + 0.5);
    if (hi > in) hi = in;
    double total = 0;
    for (long j = lo; j < hi; j++) {
        w[j - lo] = bicubic_aa_filter((j - center + 0.5) * invscale);
        total += w[j - lo];
    }
    for (long j = lo; j < hi; j++) w[j - lo] = total != 0 ? w[j - lo] / total : 0;
    *first = (int)lo;
    *count = (int)(hi - lo);
}

// One separable pass along an axis of `n` with stride `stride` (in elements of C-vectors).
static void resample_axis(const float *src, float *dst, int outer, int in, int out, int inner,
                          int C) {
    int maxw = (int)ceil(4.0 * fmax((double)in / out, 1.0)) + 3;
    double *w = cg_malloc((size_t)maxw * sizeof(double));
    for (int o = 0; o < outer; o++)
        for (int i = 0; i < out; i++) {
            int first, count;
            aa_weights(in, out, i, &first, &count, w);
            for (int r = 0; r < inner; r++)
                for (int c = 0; c < C; c++) {
                    double acc = 0;
                    for (int k = 0; k < count; k++)
                        acc += w[k] * src[(((size_t)o * in + first + k) * inner + r) * C + c];
                    dst[(((size_t)o * out + i) * inner + r) * C + c] = (float)acc;
                }
        }
    free(w);
}

void resample_bicubic_aa(const float *src, int sh, int sw, float *dst, int dh, int dw, int C) {
    CG_CHECK(sh > 0 && sw > 0 && dh > 0 && dw > 0, "", "empty position-embedding grid");
    float *tmp = cg_malloc((size_t)sh * dw * C * sizeof(float));
    resample_axis(src, tmp, sh, sw, dw, 1, C);      // along W: (sh, sw, C) -> (sh, dw, C)
    resample_axis(tmp, dst, 1, sh, dh, dw, C);      // along H: (sh, dw, C) -> (dh, dw, C)
    free(tmp);
}
