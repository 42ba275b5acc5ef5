// The gate recurrence's CPU cores, written once for any real type. kernels/cpu/gate_recurrent.c
// includes this file twice after defining GR_REAL (float | double) and GR_SFX (f32 | f64). No
// include guard on purpose; it undefines the names above.
#define GR_CAT_(a, b) a##_##b
#define GR_CAT(a, b) GR_CAT_(a, b)
#define GR_FN(name) GR_CAT(name, GR_SFX)
#define real GR_REAL

void GR_FN(gate_recurrent_fwd)(size_t planes, int H, int W, int chunk, const real *x, const real *b,
                               const real *g1, const real *g2, const real *g3, real *out) {
    const size_t hw = (size_t)H * W;
#pragma omp parallel for schedule(static)
    for (size_t p = 0; p < planes; p++) {
        const size_t o = p * hw;
        for (int w = 0; w < W; w++) {
            const int first = w % chunk == 0;   // the run's first column: no state before it
            for (int h = 0; h < H; h++) {
                const size_t i = o + (size_t)h * W + w;
                real v = b[i] * x[i];
                if (!first) {
                    if (h > 0) v += g1[i] * out[i - W - 1];
                    v += g2[i] * out[i - 1];
                    if (h < H - 1) v += g3[i] * out[i + W - 1];
                }
                out[i] = v;
            }
        }
    }
}

void GR_FN(gate_recurrent_bwd)(size_t planes, int H, int W, int chunk, const real *x, const real *b,
                               const real *g1, const real *g2, const real *g3, const real *out,
                               const real *dout, real *dh, real *dx, real *db, real *dg1,
                               real *dg2, real *dg3) {
    const size_t hw = (size_t)H * W;
#pragma omp parallel for schedule(static)
    for (size_t p = 0; p < planes; p++) {
        const size_t o = p * hw;
        for (int w = W - 1; w >= 0; w--) {
            // column w + 1 reads this one when it is in the same run
            const int next = w + 1 < W && (w + 1) % chunk != 0;
            const int first = w % chunk == 0;
            for (int h = 0; h < H; h++) {
                const size_t i = o + (size_t)h * W + w;
                real d = dout[i];
                if (next) {   // out[h][w] feeds out[h+1][w+1] (g1), out[h][w+1] (g2), out[h-1][w+1] (g3)
                    if (h < H - 1) d += g1[i + W + 1] * dh[i + W + 1];
                    d += g2[i + 1] * dh[i + 1];
                    if (h > 0) d += g3[i - W + 1] * dh[i - W + 1];
                }
                dh[i] = d;
                if (dx) dx[i] += b[i] * d;
                if (db) db[i] += x[i] * d;
                if (!first) {
                    if (dg1 && h > 0) dg1[i] += d * out[i - W - 1];
                    if (dg2) dg2[i] += d * out[i - 1];
                    if (dg3 && h < H - 1) dg3[i] += d * out[i + W - 1];
                }
            }
        }
    }
}

#undef real
#undef GR_FN
#undef GR_CAT
#undef GR_CAT_
#undef GR_REAL
#undef GR_SFX
