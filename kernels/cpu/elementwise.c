// CPU reference: elementwise ops, broadcast add (pos_embed) and layer scale (kernels/ops.h).
// Reductions over rows (dp, dg) give each output element to one thread, which sums its rows
// in order in double: the result does not depend on the thread count.
#include "../ops.h"
#include "../error.h"

static void check_numel(const char *op, const Tensor *a, const Tensor *b) {
    CG_CHECK(a->numel == b->numel, "", "op %s: tensors of %zu and %zu elements", op, a->numel,
             b->numel);
}

void cpu_zero(Ctx *ctx, Tensor *y) {
    memset(y->data, 0, tensor_bytes(y));
}

void cpu_accumulate(Ctx *ctx, const Tensor *src, Tensor *dst) {
    check_numel("accumulate", src, dst);
    const float *s = tensor_f32(src);
    float *d = tensor_f32(dst);
    #pragma omp parallel for
    for (size_t i = 0; i < dst->numel; i++) d[i] += s[i];
}

void cpu_add_fwd(Ctx *ctx, const Tensor *a, const Tensor *b, Tensor *y) {
    check_numel("add_fwd", a, y);
    check_numel("add_fwd", b, y);
    const float *pa = tensor_f32(a), *pb = tensor_f32(b);
    float *py = tensor_f32(y);
    #pragma omp parallel for
    for (size_t i = 0; i < y->numel; i++) py[i] = pa[i] + pb[i];
}

void cpu_scale_fwd(Ctx *ctx, const Tensor *x, float s, Tensor *y) {
    check_numel("scale_fwd", x, y);
    const float *px = tensor_f32(x);
    float *py = tensor_f32(y);
    #pragma omp parallel for
    for (size_t i = 0; i < y->numel; i++) py[i] = s * px[i];
}

void cpu_scale_bwd(Ctx *ctx, const Tensor *dy, float s, Tensor *dx) {
    if (!dx) return;
    check_numel("scale_bwd", dy, dx);
    const float *pdy = tensor_f32(dy);
    float *pdx = tensor_f32(dx);
    #pragma omp parallel for
    for (size_t i = 0; i < dx->numel; i++) pdx[i] += s * pdy[i];
}

// x (R, P) + p (P) -> y (R, P); P = p->numel, R = x->numel / P.
void cpu_add_bcast_fwd(Ctx *ctx, const Tensor *x, const Tensor *p, Tensor *y) {
    check_numel("add_bcast_fwd", x, y);
    size_t P = p->numel, R = P ? x->numel / P : 0;
    CG_CHECK(R * P == x->numel, "", "op add_bcast_fwd: %zu elements do not split into rows of %zu",
             x->numel, P);
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
    size_t P = dp->numel, R = P ? dy->numel / P : 0;
    CG_CHECK(R * P == dy->numel, "", "op add_bcast_bwd: %zu elements do not split into rows of %zu",
             dy->numel, P);
    colsum_rows(tensor_f32(dy), R, P, tensor_f32(dp));
}

void cpu_cast_colsum(Ctx *ctx, const Tensor *x, Tensor *y, Tensor *colsum) {
    cpu_scale_fwd(ctx, x, 1.0f, y);
    if (!colsum) return;
    size_t P = (size_t)tensor_last(x);
    CG_CHECK(colsum->numel == P, "", "op cast_colsum: colsum has %zu elements, x's last dim is %zu",
             colsum->numel, P);
    colsum_rows(tensor_f32(x), tensor_rows(x), P, tensor_f32(colsum));
}

// x (R, C) * g (C) -> y (R, C); C = g->numel.
void cpu_layer_scale_fwd(Ctx *ctx, const Tensor *x, const Tensor *g, Tensor *y) {
    check_numel("layer_scale_fwd", x, y);
    size_t C = g->numel, R = C ? x->numel / C : 0;
    CG_CHECK(R * C == x->numel && (size_t)tensor_last(x) == C, "",
             "op layer_scale_fwd: last dim %d, gamma has %zu elements", tensor_last(x), C);
    const float *px = tensor_f32(x), *pg = tensor_f32(g);
    float *py = tensor_f32(y);
    #pragma omp parallel for collapse(2)
    for (size_t r = 0; r < R; r++)
        for (size_t c = 0; c < C; c++) py[r * C + c] = px[r * C + c] * pg[c];
}

// dx (R, C) += dy * g; dg (C) += sum over rows of dy * x.
void cpu_layer_scale_bwd(Ctx *ctx, const Tensor *dy, const Tensor *x, const Tensor *g,
                         Tensor *dx, Tensor *dg) {
    size_t C = g->numel, R = C ? dy->numel / C : 0;
    CG_CHECK(R * C == dy->numel && dy->numel == x->numel, "",
             "op layer_scale_bwd: dy %zu, x %zu elements, gamma %zu", dy->numel, x->numel, C);
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
