// CPU reference: elementwise ops, broadcast add (pos_embed) and layer scale (kernels/ops.h).
// Reductions over rows (dp, dg) give each output element to one thread, which sums its rows
// in order in double: the result does not depend on the thread count.
#include "../ops.h"
#include "../error.h"
#include "../elementwise_shape.h"

void cpu_zero(Ctx *ctx, Tensor *y) {
    memset(y->data, 0, tensor_bytes(y));
}

void cpu_accumulate(Ctx *ctx, const Tensor *src, Tensor *dst) {
    ew_check_numel("accumulate", "dst", dst, "src", src);
    const float *s = tensor_f32(src);
    float *d = tensor_f32(dst);
    #pragma omp parallel for
    for (size_t i = 0; i < dst->numel; i++) d[i] += s[i];
}

void cpu_add_fwd(Ctx *ctx, const Tensor *a, const Tensor *b, Tensor *y) {
    ew_check_numel("add_fwd", "a", a, "y", y);
    ew_check_numel("add_fwd", "b", b, "y", y);
    const float *pa = tensor_f32(a), *pb = tensor_f32(b);
    float *py = tensor_f32(y);
    #pragma omp parallel for
    for (size_t i = 0; i < y->numel; i++) py[i] = pa[i] + pb[i];
}

void cpu_scale_fwd(Ctx *ctx, const Tensor *x, float s, Tensor *y) {
    ew_check_numel("scale_fwd", "x", x, "y", y);
    const float *px = tensor_f32(x);
    float *py = tensor_f32(y);
    #pragma omp parallel for
    for (size_t i = 0; i < y->numel; i++) py[i] = s * px[i];
}

void cpu_scale_bwd(Ctx *ctx, const Tensor *dy, float s, Tensor *dx) {
    if (!dx) return;
    ew_check_numel("scale_bwd", "dy", dy, "dx", dx);
    const float *pdy = tensor_f32(dy);
    float *pdx = tensor_f32(dx);
    #pragma omp parallel for
    for (size_t i = 0; i < dx->numel; i++) pdx[i] += s * pdy[i];
}

// x (R, P) + p (P) -> y (R, P); P = p->numel, R = x->numel / P.
void cpu_add_bcast_fwd(Ctx *ctx, const Tensor *x, const Tensor *p, Tensor *y) {
    ew_check_numel("add_bcast_fwd", "x", x, "y", y);
    size_t P = p->numel, R = bcast_rows("add_bcast_fwd", x, P);
    const float *px = tensor_f32(x), *pp = tensor_f32(p);
    float *py = tensor_f32(y);
    #pragma omp parallel for collapse(2)
    for (size_t r = 0; r < R; r++)
        for (size_t i = 0; i < P; i++) py[r * P + i] = px[r * P + i] + pp[i];
}

// out (P) += the sums of x (R, P) over its rows.
static void colsum_rows(const float *x, size_t R, size_t P, float *out) {
    #pragma omp parallel for
    for (size_t i = 0; i < P; i++) {
        double s = 0;
        for (size_t r = 0; r < R; r++) s += x[r * P + i];
        out[i] += (float)s;
    }
}

// dx += dy; dp (P) += sum over the R rows of dy.
void cpu_add_bcast_bwd(Ctx *ctx, const Tensor *dy, Tensor *dx, Tensor *dp) {
    if (dx) cpu_accumulate(ctx, dy, dx);
    if (!dp) return;
    size_t P = dp->numel, R = bcast_rows("add_bcast_bwd", dy, P);
    colsum_rows(tensor_f32(dy), R, P, tensor_f32(dp));
}

void cpu_cast_colsum(Ctx *ctx, const Tensor *x, Tensor *y, Tensor *colsum) {
    ew_check_numel("cast_colsum", "y", y, "x", x);
    cpu_scale_fwd(ctx, x, 1.0f, y);
    if (!colsum) return;
    size_t P = colsum_width("cast_colsum", x, colsum);
    colsum_rows(tensor_f32(x), tensor_rows(x), P, tensor_f32(colsum));
}

// x (R, C) * g (C) -> y (R, C); C = g->numel.
void cpu_layer_scale_fwd(Ctx *ctx, const Tensor *x, const Tensor *g, Tensor *y) {
    ew_check_numel("layer_scale_fwd", "y", y, "x", x);
    size_t C = g->numel, R = layer_scale_rows("layer_scale_fwd", x, g);
    const float *px = tensor_f32(x), *pg = tensor_f32(g);
    float *py = tensor_f32(y);
    #pragma omp parallel for collapse(2)
    for (size_t r = 0; r < R; r++)
        for (size_t c = 0; c < C; c++) py[r * C + c] = px[r * C + c] * pg[c];
}

// dx (R, C) += dy * g; dg (C) += sum over rows of dy * x.
void cpu_layer_scale_bwd(Ctx *ctx, const Tensor *dy, const Tensor *x, const Tensor *g,
                         Tensor *dx, Tensor *dg) {
    ew_check_numel("layer_scale_bwd", "dy", dy, "x", x);
    size_t C = g->numel, R = layer_scale_rows("layer_scale_bwd", x, g);
    const float *pdy = tensor_f32(dy), *px = tensor_f32(x), *pg = tensor_f32(g);
    if (dx) {
        float *pdx = tensor_f32(dx);
        #pragma omp parallel for collapse(2)
        for (size_t r = 0; r < R; r++)
            for (size_t c = 0; c < C; c++) pdx[r * C + c] += pdy[r * C + c] * pg[c];
    }
    if (dg) {
        float *pdg = tensor_f32(dg);
        #pragma omp parallel for
        for (size_t c = 0; c < C; c++) {
            double s = 0;
            for (size_t r = 0; r < R; r++) s += (double)pdy[r * C + c] * px[r * C + c];
            pdg[c] += (float)s;
        }
    }
}
