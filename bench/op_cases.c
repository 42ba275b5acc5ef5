// The op cases (bench/op_cases.h): per op family, its phases and the shapes that reach every
// kernel path, then the training sizes `cgspn bench ops` times.
#include "op_cases.h"
#include "../kernels/error.h"
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ---- tolerances: allowed ||gpu - cpu|| / ||cpu|| per result --------------------------------------
// fp32: the GPU and the CPU do the same fp32 operations but for the order of sums and fused
// multiply-adds: a few fp32 ulps (~1e-7 each) at these sizes. A wrong index or a missing term is
// off by 1e-2 and more.
#define TOL_F32 1e-5
// Copies: the same bits.
#define TOL_EXACT 0.0
// bf16 written once from fp32 math on identical inputs: at most half a bf16 ulp, 2^-8 = 3.9e-3
// of each value, so below that norm-wise too (seen: ~1.5e-3).
#define TOL_ROUNDED 4e-3
// bf16 rounded twice, the first rounding carried into the second: 2 x 3.9e-3.
#define TOL_TWICE 8e-3
// A bf16 GEMM output: one rounding of exact products summed in fp32 (~1e-3 norm-wise on large
// tensors); a fallback that rounds pre, then gelu(pre) or + bias, rounds twice, up to 2 x 2^-9
// per element, which a 15-element tensor can nearly reach norm-wise (3.7e-3 seen on an H200).
#define TOL_GEMM_ACT 6e-3
// fp32 parameter gradients of exact bf16 products: only the accumulation order differs (~1e-6);
// 1e-4 leaves room for tensor-core accumulation.
#define TOL_GEMM_F32 1e-4
// Attention in fp32 (the fallback kernels): online softmax rescaling, __expf, FMA contraction:
// ~1e-6; 1e-4 is far below what a wrong index, scale or missing term gives (1e-1 and up).
#define TOL_ATTN_F32 1e-4
// bf16 attention: out rounded once and cuDNN rounds P to bf16 before P V (~3e-3 norm-wise).
#define TOL_ATTN_OUT 1e-2
// The log-sum-exp: fp32 from identical inputs (~1e-7 seen, cuDNN 9.14, H100).
#define TOL_ATTN_LSE 1e-5
// dqkv: cuDNN rounds P and dS to bf16 before its products and dq sums dS rows that cancel:
// ~1e-2 expected, 3e-3 seen (cuDNN 9.14, H100).
#define TOL_ATTN_GRAD 2e-2
// The scan's fp32 state from identical inputs through the bf16 path's fast sigmoid (__expf, rcp):
// 1e-5 relative per weight.
#define TOL_SCAN_HIDDEN 5e-5
// The scan's bf16 outputs: each direction's y_d rounded before the merge, the sum once more, and
// the fast sigmoid: a few 2^-9 in the worst element, ~3e-3 norm-wise.
#define TOL_SCAN_ACT 1e-2

// ---- building cases --------------------------------------------------------------------------

#define SHAPE(...) (int)(sizeof((int[]){__VA_ARGS__}) / sizeof(int)), (int[]){__VA_ARGS__}

static OpCase *case_new(OpCaseList *l, CasePhase fwd, CasePhase bwd, const char *fmt, ...) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 256;
        l->cases = realloc(l->cases, (size_t)l->cap * sizeof *l->cases);
        CG_CHECK(l->cases, "", "out of host memory for %d op cases", l->cap);
    }
    OpCase *c = &l->cases[l->n++];
    memset(c, 0, sizeof *c);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->title, sizeof c->title, fmt, ap);
    va_end(ap);
    c->fwd = fwd;
    c->bwd = bwd;
    c->f32_tol = TOL_F32;
    return c;
}

static void case_ops(OpCase *c, const char *a, const char *b) {
    c->ops[0] = a;
    c->ops[1] = b;
}

static CaseArg *put(OpCase *c, int i, const char *name, ArgRole role, ArgType type, float lo,
                    float hi, double bf16_tol, int ndim, const int *shape) {
    CG_CHECK(i >= 0 && i < OPC_MAX_ARGS && ndim <= TENSOR_MAX_DIMS, "", "case %s: argument %d",
             c->title, i);
    CaseArg *a = &c->arg[i];
    *a = (CaseArg){.name = name, .role = role, .type = type, .lo = lo, .hi = hi,
                   .bf16_tol = bf16_tol, .ndim = ndim};
    memcpy(a->shape, shape, (size_t)ndim * sizeof(int));
    if (i >= c->nargs) c->nargs = i + 1;
    return a;
}

// An activation input; an fp32 one; a result; an upstream gradient; a gradient added into.
static CaseArg *in(OpCase *c, int i, const char *name, float lo, float hi, int nd, const int *s) {
    return put(c, i, name, ARG_IN, TYPE_ACT, lo, hi, 0, nd, s);
}
static CaseArg *in32(OpCase *c, int i, const char *name, float lo, float hi, int nd, const int *s) {
    return put(c, i, name, ARG_IN, TYPE_F32, lo, hi, 0, nd, s);
}
static CaseArg *out(OpCase *c, int i, const char *name, double tol, int nd, const int *s) {
    return put(c, i, name, ARG_OUT, TYPE_ACT, 0, 0, tol, nd, s);
}
static CaseArg *out32(OpCase *c, int i, const char *name, double tol, int nd, const int *s) {
    return put(c, i, name, ARG_OUT, TYPE_F32, 0, 0, tol, nd, s);
}
static CaseArg *seed(OpCase *c, int i, const char *name, const char *of, int nd, const int *s) {
    CaseArg *a = put(c, i, name, ARG_IN, TYPE_ACT, -1, 1, 0, nd, s);
    a->seed_of = of;
    return a;
}
static CaseArg *grad(OpCase *c, int i, const char *name, const char *of, double tol, int nd,
                     const int *s) {
    CaseArg *a = put(c, i, name, ARG_ACC, TYPE_ACT, -1, 1, tol, nd, s);
    a->grad_of = of;
    return a;
}
static CaseArg *grad32(OpCase *c, int i, const char *name, const char *of, double tol, int nd,
                       const int *s) {
    CaseArg *a = put(c, i, name, ARG_ACC, TYPE_F32, -1, 1, tol, nd, s);
    a->grad_of = of;
    return a;
}
// The same argument absent (passed as NULL).
static void drop(OpCase *c, int i) { c->arg[i].role = ARG_ABSENT; }
// A gradient that the op writes rather than adds into.
static void written(OpCase *c, int i) { c->arg[i].role = ARG_OUT; }

// A copy of case c appended to l (the variants of one shape); c may move, so it is returned.
static OpCase *case_copy(OpCaseList *l, int index, const char *suffix) {
    OpCase *c = case_new(l, NULL, NULL, "%s", "");
    *c = l->cases[index];
    size_t n = strlen(c->title);
    snprintf(c->title + n, sizeof c->title - n, "%s", suffix);
    return c;
}

#define T(i) (t[i])

// ---- elementwise and memory ----------------------------------------------------------------------

enum { EW_A, EW_B, EW_Y, EW_DY, EW_DX };
static void fwd_add(Ctx *ctx, Tensor *const *t, const OpCase *c) {
    (void)c;
    op_add_fwd(ctx, T(EW_A), T(EW_B), T(EW_Y));
}
static void fwd_scale(Ctx *ctx, Tensor *const *t, const OpCase *c) {
    op_scale_fwd(ctx, T(EW_A), c->f[0], T(EW_Y));
}
static void bwd_scale(Ctx *ctx, Tensor *const *t, const OpCase *c) {
    op_scale_bwd(ctx, T(EW_DY), c->f[0], T(EW_DX));
}
static void fwd_accumulate(Ctx *ctx, Tensor *const *t, const OpCase *c) {
    (void)c;
    op_accumulate(ctx, T(EW_A), T(EW_Y));
}
static void fwd_zero(Ctx *ctx, Tensor *const *t, const OpCase *c) {
    (void)c;
    op_zero(ctx, T(EW_Y));
}

static void elementwise_cases(OpCaseList *l) {
    static const int shapes[][2] = {{7, 1155}, {14, 6}, {3, 64}};
    for (int s = 0; s < 3; s++) {
        const int R = shapes[s][0], C = shapes[s][1];
        OpCase *c = case_new(l, fwd_add, NULL, "add (%d, %d)", R, C);
        case_ops(c, "add_fwd", NULL);
        in(c, EW_A, "a", -2, 2, SHAPE(R, C));
        in(c, EW_B, "b", -2, 2, SHAPE(R, C));
        out(c, EW_Y, "y", TOL_ROUNDED, SHAPE(R, C));

        c = case_new(l, fwd_scale, bwd_scale, "scale (%d, %d)", R, C);
        case_ops(c, "scale_fwd", "scale_bwd");
        c->f[0] = -1.5f;
        in(c, EW_A, "x", -2, 2, SHAPE(R, C));
        out(c, EW_Y, "y", TOL_ROUNDED, SHAPE(R, C));
        seed(c, EW_DY, "dy", "y", SHAPE(R, C));
        grad(c, EW_DX, "dx", "x", TOL_ROUNDED, SHAPE(R, C));   // prior + s dy, rounded once

        c = case_new(l, fwd_accumulate, NULL, "accumulate (%d, %d)", R, C);
        case_ops(c, "accumulate", NULL);
        in(c, EW_A, "src", -2, 2, SHAPE(R, C));
        put(c, EW_Y, "dst", ARG_ACC, TYPE_ACT, -1, 1, TOL_ROUNDED, SHAPE(R, C));
        // an activation gradient into a parameter gradient: an fp32 add
        c = case_new(l, fwd_accumulate, NULL, "accumulate into fp32 (%d, %d)", R, C);
        case_ops(c, "accumulate", NULL);
        in(c, EW_A, "src", -2, 2, SHAPE(R, C));
        put(c, EW_Y, "dst", ARG_ACC, TYPE_F32, -1, 1, TOL_F32, SHAPE(R, C));
        c->flags = CASE_NO_F32;

        c = case_new(l, fwd_zero, NULL, "zero (%d, %d)", R, C);
        case_ops(c, "zero", NULL);
        put(c, EW_Y, "y", ARG_ACC, TYPE_ACT, -1, 1, TOL_EXACT, SHAPE(R, C));
    }
}

enum { CC_X, CC_Y, CC_SUM };
static void fwd_cast_colsum(Ctx *ctx, Tensor *const *t, const OpCase *c) {
    (void)c;
    op_cast_colsum(ctx, T(CC_X), T(CC_Y), T(CC_SUM));
}

static void cast_colsum_cases(OpCaseList *l) {
    static const int shapes[][2] = {{7, 6}, {37, 1152}, {4099, 64}, {9, 1155}};
    for (int s = 0; s < 4; s++) {
        const int R = shapes[s][0], C = shapes[s][1];
        OpCase *c = case_new(l, fwd_cast_colsum, NULL, "cast_colsum (%d, %d)", R, C);
        case_ops(c, "cast_colsum", NULL);
        in32(c, CC_X, "x", -1, 1, SHAPE(R, C));   // the fp32 stream's gradient
        out(c, CC_Y, "y", TOL_ROUNDED, SHAPE(R, C));
        put(c, CC_SUM, "colsum", ARG_ACC, TYPE_F32, -1, 1, TOL_F32, SHAPE(C));
        c = case_copy(l, l->n - 1, ", no colsum");
        drop(c, CC_SUM);
    }
}

// ---- broadcast add, layer scale ------------------------------------------------------------------

enum { BC_X, BC_P, BC_Y, BC_DY, BC_DX, BC_DP };
static void fwd_add_bcast(Ctx *ctx, Tensor *const *t, const OpCase *c) {
    (void)c;
    op_add_bcast_fwd(ctx, T(BC_X), T(BC_P), T(BC_Y));
}
static void bwd_add_bcast(Ctx *ctx, Tensor *const *t, const OpCase *c) {
    (void)c;
    op_add_bcast_bwd(ctx, T(BC_DY), T(BC_DX), T(BC_DP));
}
static void fwd_layer_scale(Ctx *ctx, Tensor *const *t, const OpCase *c) {
    (void)c;
    op_layer_scale_fwd(ctx, T(BC_X), T(BC_P), T(BC_Y));
}
static void bwd_layer_scale(Ctx *ctx, Tensor *const *t, const OpCase *c) {
    (void)c;
    op_layer_scale_bwd(ctx, T(BC_DY), T(BC_X), T(BC_P), T(BC_DX), T(BC_DP));
}

// The case at index, then one without each gradient (a and b: their indices).
static void without_each(OpCaseList *l, int index, int a, int b) {
    char suffix[48];
    snprintf(suffix, sizeof suffix, ", no %s", l->cases[index].arg[a].name);
    drop(case_copy(l, index, suffix), a);
    snprintf(suffix, sizeof suffix, ", no %s", l->cases[index].arg[b].name);
    drop(case_copy(l, index, suffix), b);
}

static void bcast_scale_cases(OpCaseList *l) {
    static const int bshapes[][3] = {{3, 7, 6}, {3, 7, 64}, {70, 7, 6}};   // (R, N, C): P = N*C
    for (int s = 0; s < 3; s++) {
        const int R = bshapes[s][0], N = bshapes[s][1], C = bshapes[s][2];
        OpCase *c = case_new(l, fwd_add_bcast, bwd_add_bcast, "add_bcast (%d, %d, %d)", R, N, C);
        case_ops(c, "add_bcast_fwd", "add_bcast_bwd");
        in(c, BC_X, "x", -1, 1, SHAPE(R, N, C));
        in(c, BC_P, "p", -1, 1, SHAPE(N, C));
        out(c, BC_Y, "y", TOL_ROUNDED, SHAPE(R, N, C));
        seed(c, BC_DY, "dy", "y", SHAPE(R, N, C));
        grad(c, BC_DX, "dx", "x", TOL_ROUNDED, SHAPE(R, N, C));
        grad32(c, BC_DP, "dp", "p", TOL_F32, SHAPE(N, C));   // fp32 column sums of bf16 values
        without_each(l, l->n - 1, BC_DX, BC_DP);
    }
    static const int sshapes[][2] = {{7, 6}, {7, 1155}, {37, 1152}, {300, 64}};
    for (int s = 0; s < 4; s++) {
        const int R = sshapes[s][0], C = sshapes[s][1];
        OpCase *c = case_new(l, fwd_layer_scale, bwd_layer_scale, "layer_scale (%d, %d)", R, C);
        case_ops(c, "layer_scale_fwd", "layer_scale_bwd");
        in(c, BC_X, "x", -1, 1, SHAPE(R, C));
        in(c, BC_P, "g", 0.5f, 1.5f, SHAPE(C));
        out(c, BC_Y, "y", TOL_ROUNDED, SHAPE(R, C));
        seed(c, BC_DY, "dy", "y", SHAPE(R, C));
        grad(c, BC_DX, "dx", "x", TOL_ROUNDED, SHAPE(R, C));
        grad32(c, BC_DP, "dg", "g", TOL_F32, SHAPE(C));   // fp32 sums of products of bf16 values
        without_each(l, l->n - 1, BC_DX, BC_DP);
    }
}

// ---- LayerNorm -------------------------------------------------------------------------------------

enum { LN_X, LN_W, LN_B, LN_Y, LN_MEAN, LN_RSTD, LN_DY, LN_DX, LN_DW, LN_DB, LN_DX_ACT, LN_DX_SUM,
       LN_R, LN_H };
// r and h present: h = x + r normalized (the add fused into the norm).
static void fwd_layernorm(Ctx *ctx, Tensor *const *t, const OpCase *c) {
    op_layernorm_fwd(ctx, T(LN_X), T(LN_R), T(LN_W), T(LN_B), c->f[0], T(LN_H), T(LN_Y),
                     T(LN_MEAN), T(LN_RSTD));
}
static void bwd_layernorm(Ctx *ctx, Tensor *const *t, const OpCase *c) {
    (void)c;
    op_layernorm_bwd(ctx, T(LN_DY), T(LN_X), T(LN_W), T(LN_MEAN), T(LN_RSTD), T(LN_DX), T(LN_DW),
                     T(LN_DB), T(LN_DX_ACT), T(LN_DX_SUM));
}

// 6, 33, 1155: scalar; short rows, 4 / 8 / 16 lanes each (32, 64, 96, 128); cached (1152,
// 1600); uncached vectors (2056).
static const int LN_SHAPES[][2] = {{7, 6},   {7, 33},  {7, 1155}, {13, 32},   {5, 64},  {70, 64},
                                   {9, 96},  {11, 128}, {37, 1152}, {3, 1600}, {3, 2056}};

static OpCase *layernorm_case(OpCaseList *l, int N, int C, ArgType xt, ArgType yt, float eps,
                              const char *what) {
    OpCase *c = case_new(l, fwd_layernorm, bwd_layernorm, "layernorm%s (%d, %d)", what, N, C);
    case_ops(c, "layernorm_fwd", "layernorm_bwd");
    c->f[0] = eps;
    // x off zero, so the means are not tiny numbers compared in relative terms
    put(c, LN_X, "x", ARG_IN, xt, -1, 3, 0, SHAPE(N, C));
    put(c, LN_W, "w", ARG_IN, yt, 0.5f, 1.5f, 0, SHAPE(C));
    put(c, LN_B, "b", ARG_IN, yt, -0.5f, 0.5f, 0, SHAPE(C));
    put(c, LN_Y, "y", ARG_OUT, yt, 0, 0, yt == TYPE_ACT ? TOL_ROUNDED : TOL_F32, SHAPE(N, C));
    out32(c, LN_MEAN, "mean", TOL_F32, SHAPE(N));   // fp32 statistics of the same rows
    out32(c, LN_RSTD, "rstd", TOL_F32, SHAPE(N));
    put(c, LN_DY, "dy", ARG_IN, yt, -1, 1, 0, SHAPE(N, C))->seed_of = "y";
    // dx: the final rounding alone differs (mean and rstd agree to fp32)
    put(c, LN_DX, "dx", ARG_ACC, xt, -1, 1, xt == TYPE_ACT ? TOL_ROUNDED : TOL_F32, SHAPE(N, C))
        ->grad_of = "x";
    grad32(c, LN_DW, "dw", "w", TOL_F32, SHAPE(C));
    grad32(c, LN_DB, "db", "b", TOL_F32, SHAPE(C));
    return c;
}

static void layernorm_cases(OpCaseList *l) {
    for (int s = 0; s < (int)(sizeof LN_SHAPES / sizeof LN_SHAPES[0]); s++) {
        const int N = LN_SHAPES[s][0], C = LN_SHAPES[s][1];
        layernorm_case(l, N, C, TYPE_ACT, TYPE_ACT, 1e-5f, "");
        const int full = l->n - 1;
        OpCase *c = case_copy(l, full, ", no affine, no statistics");
        c->bwd = NULL;
        drop(c, LN_W), drop(c, LN_B), drop(c, LN_MEAN), drop(c, LN_RSTD);
        drop(c, LN_DY), drop(c, LN_DX), drop(c, LN_DW), drop(c, LN_DB);
        c = case_copy(l, full, ", dx alone");
        drop(c, LN_DW), drop(c, LN_DB);
        c = case_copy(l, full, ", dw and db alone");
        drop(c, LN_DX);
        c = case_copy(l, full, ", no w");   // the backward's g = dy
        drop(c, LN_W), drop(c, LN_DW);

        // The encoders' fp32 stream normalized into a bf16 sublayer input, its backward handing
        // the final dx (bf16, written) and its column sums on; and a bf16 convolution's output
        // into gspn_hier's fp32 stream.
        c = layernorm_case(l, N, C, TYPE_F32, TYPE_ACT, 1e-6f, ", fp32 x");
        c->flags = CASE_NO_F32;
        c = case_copy(l, l->n - 1, ", hand-off");
        drop(c, LN_DB);
        out(c, LN_DX_ACT, "dx_act", TOL_ROUNDED, SHAPE(N, C));   // the final fp32 dx rounded once
        put(c, LN_DX_SUM, "dx_sum", ARG_ACC, TYPE_F32, -1, 1, TOL_F32, SHAPE(C));
        c = layernorm_case(l, N, C, TYPE_ACT, TYPE_F32, 1e-6f, ", fp32 y");
        c->flags = CASE_NO_F32;

        // h = x + r, y = LayerNorm(h): the fp32 stream (h fp32: an exact sum) and all in one
        // dtype (a bf16 h normalized by the GPU, the exact sum by the CPU: y rounded twice).
        for (int xi = 0; xi < 2; xi++) {
            const ArgType xt = xi == 0 ? TYPE_F32 : TYPE_ACT;
            c = case_new(l, fwd_layernorm, NULL, "layernorm with the add, x %s (%d, %d)",
                         xi == 0 ? "fp32" : "act", N, C);
            case_ops(c, "layernorm_fwd", NULL);
            c->f[0] = 1e-6f;
            put(c, LN_X, "x", ARG_IN, xt, -1, 3, 0, SHAPE(N, C));
            in(c, LN_R, "r", -1, 1, SHAPE(N, C));
            in(c, LN_W, "w", 0.5f, 1.5f, SHAPE(C));
            in(c, LN_B, "b", -0.5f, 0.5f, SHAPE(C));
            put(c, LN_H, "h", ARG_OUT, xt, 0, 0, xi == 0 ? TOL_F32 : TOL_ROUNDED, SHAPE(N, C));
            out(c, LN_Y, "y", xi == 0 ? TOL_ROUNDED : TOL_TWICE, SHAPE(N, C));
            // the statistics of the rounded sum, against the exact one's: 2^-9 relative per element
            out32(c, LN_MEAN, "mean", xi == 0 ? TOL_F32 : TOL_ROUNDED, SHAPE(N));
            out32(c, LN_RSTD, "rstd", xi == 0 ? TOL_F32 : TOL_ROUNDED, SHAPE(N));
            if (xi == 0) c->flags = CASE_NO_F32;
        }
    }
}

// ---- activations, softmax, attention pooling --------------------------------------------------------

enum { ACT_X, ACT_Y, ACT_DY, ACT_DX };
static void fwd_gelu(Ctx *ctx, Tensor *const *t, const OpCase *c) {
    op_gelu_fwd(ctx, T(ACT_X), (GeluKind)c->i[0], T(ACT_Y));
}
static void bwd_gelu(Ctx *ctx, Tensor *const *t, const OpCase *c) {
    op_gelu_bwd(ctx, T(ACT_DY), T(ACT_X), (GeluKind)c->i[0], T(ACT_DX));
}
static void fwd_silu(Ctx *ctx, Tensor *const *t, const OpCase *c) {
    (void)c;
    op_silu_fwd(ctx, T(ACT_X), T(ACT_Y));
}
static void bwd_silu(Ctx *ctx, Tensor *const *t, const OpCase *c) {
    (void)c;
    op_silu_bwd(ctx, T(ACT_DY), T(ACT_X), T(ACT_DX));
}
static void fwd_softmax(Ctx *ctx, Tensor *const *t, const OpCase *c) {
    (void)c;
    op_softmax_fwd(ctx, T(ACT_X), T(ACT_Y));
}
static void bwd_softmax(Ctx *ctx, Tensor *const *t, const OpCase *c) {
    (void)c;
    op_softmax_bwd(ctx, T(ACT_DY), T(ACT_Y), T(ACT_DX));
}

static OpCase *unary_case(OpCaseList *l, CasePhase fwd, CasePhase bwd, const char *fop,
                          const char *bop, const char *title, int R, int C, float lo, float hi) {
    OpCase *c = case_new(l, fwd, bwd, "%s (%d, %d)", title, R, C);
    case_ops(c, fop, bop);
    in(c, ACT_X, "x", lo, hi, SHAPE(R, C));
    out(c, ACT_Y, "y", TOL_ROUNDED, SHAPE(R, C));
    seed(c, ACT_DY, "dy", "y", SHAPE(R, C));
    grad(c, ACT_DX, "dx", "x", TOL_ROUNDED, SHAPE(R, C));
    return c;
}

enum { POOL_Q, POOL_KV, POOL_OUT };
static void fwd_attention_pool(Ctx *ctx, Tensor *const *t, const OpCase *c) {
    op_attention_pool_fwd(ctx, T(POOL_Q), T(POOL_KV), c->i[0], T(POOL_OUT));
}

static void activation_cases(OpCaseList *l) {
    static const int gshapes[][2] = {{7, 1155}, {7, 6}, {4, 64}};
    for (int s = 0; s < 3; s++)
        for (int k = 0; k < 2; k++) {
            OpCase *c = unary_case(l, fwd_gelu, bwd_gelu, "gelu_fwd", "gelu_bwd",
                                   k == 0 ? "gelu erf" : "gelu tanh", gshapes[s][0], gshapes[s][1],
                                   -4, 4);
            c->i[0] = k == 0 ? GELU_ERF : GELU_TANH;
        }
    static const int sshapes[][2] = {{7, 1155}, {7, 6}};
    for (int s = 0; s < 2; s++)
        unary_case(l, fwd_silu, bwd_silu, "silu_fwd", "silu_bwd", "silu", sshapes[s][0],
                   sshapes[s][1], -6, 6);
    static const int mshapes[][2] = {{7, 6}, {7, 33}, {7, 1155}, {5, 64}, {3, 1000}};
    for (int s = 0; s < 5; s++)
        unary_case(l, fwd_softmax, bwd_softmax, "softmax_fwd", "softmax_bwd", "softmax",
                   mshapes[s][0], mshapes[s][1], -3, 3);

    // SigLIP's MAP head among them: 1369 tokens of head dim 72 (so400m at 518 px).
    static const int pshapes[][4] = {{2, 7, 16, 2}, {3, 50, 64, 4}, {1, 1369, 1152, 16}};   // B N C H
    for (int s = 0; s < 3; s++) {
        const int B = pshapes[s][0], N = pshapes[s][1], C = pshapes[s][2];
        OpCase *c = case_new(l, fwd_attention_pool, NULL, "attention_pool B=%d N=%d C=%d heads=%d",
                             B, N, C, pshapes[s][3]);
        case_ops(c, "attention_pool_fwd", NULL);
        c->i[0] = pshapes[s][3];
        in(c, POOL_Q, "q", -1, 1, SHAPE(C));
        in(c, POOL_KV, "kv", -1, 1, SHAPE(B, N, 2 * C));
        out(c, POOL_OUT, "out", TOL_ROUNDED, SHAPE(B, C));   // fp32 math on bf16 inputs, rounded once
    }
}

// ---- attention ------------------------------------------------------------------------------------

enum { AT_QKV, AT_OUT, AT_LSE, AT_DOUT, AT_DQKV };
static void fwd_attention(Ctx *ctx, Tensor *const *t, const OpCase *c) {
    op_attention_fwd(ctx, T(AT_QKV), c->i[0], T(AT_OUT), T(AT_LSE));
}
// A gradient the case writes (ARG_OUT) rather than adds into: the op's write mode.
static int write_flag(const OpCase *c, int grad, int flag) {
    return c->arg[grad].role == ARG_OUT ? flag : 0;
}
static void bwd_attention(Ctx *ctx, Tensor *const *t, const OpCase *c) {
    op_attention_bwd(ctx, T(AT_DOUT), T(AT_QKV), T(AT_OUT), T(AT_LSE), c->i[0],
                     write_flag(c, AT_DQKV, ATTENTION_WRITE_DQKV), T(AT_DQKV));
}

static void attention_cases(OpCaseList *l) {
    // fewer tokens than a tile, the smallest head_dim cuDNN takes; one token past two tiles at
    // so14's head_dim; head_dim 20 (the fallback in bf16 too)
    static const int shapes[][4] = {{2, 7, 2, 8}, {2, 65, 2, 72}, {1, 65, 3, 20}};   // B N heads D
    for (int s = 0; s < 3; s++) {
        const int B = shapes[s][0], N = shapes[s][1], heads = shapes[s][2], C = heads * shapes[s][3];
        OpCase *c = case_new(l, fwd_attention, bwd_attention, "attention B=%d N=%d heads=%d D=%d",
                             B, N, heads, shapes[s][3]);
        case_ops(c, "attention_fwd", "attention_bwd");
        c->i[0] = heads;
        c->f32_tol = TOL_ATTN_F32;
        in(c, AT_QKV, "qkv", -1.5f, 1.5f, SHAPE(B, N, 3 * C));
        out(c, AT_OUT, "out", TOL_ATTN_OUT, SHAPE(B, N, C));
        out32(c, AT_LSE, "lse", TOL_ATTN_LSE, SHAPE(B, heads, N));
        seed(c, AT_DOUT, "dout", "out", SHAPE(B, N, C));
        CaseArg *d = grad(c, AT_DQKV, "dqkv", "qkv", TOL_ATTN_GRAD, SHAPE(B, N, 3 * C));
        d->lo = -0.01f, d->hi = 0.01f;   // small: the comparison is of the gradient
        c = case_copy(l, l->n - 1, ", dqkv written");
        written(c, AT_DQKV);
    }
}

// ---- convolutions -----------------------------------------------------------------------------------

enum { DW_X, DW_W, DW_B, DW_Y, DW_DY, DW_DX, DW_DW, DW_DB, DW_U, DW_UW, DW_UB, DW_MID };
static void fwd_dwconv(Ctx *ctx, Tensor *const *t, const OpCase *c) {
    op_dwconv_fwd(ctx, T(DW_X), T(DW_U), T(DW_UW), T(DW_UB), T(DW_W), T(DW_B),
                  c->i[0] & (DWCONV_RESIDUAL | DWCONV_SILU), T(DW_MID), T(DW_Y));
}
static void bwd_dwconv(Ctx *ctx, Tensor *const *t, const OpCase *c) {
    op_dwconv_bwd(ctx, T(DW_DY), T(DW_X), T(DW_W), c->i[0], T(DW_DX), T(DW_DW), T(DW_DB));
}

// Depthwise convolution (GSPN's LPU and mixer): k 1, 3, 5 and 7, channel counts of 8s (db's
// vector path) and not, rows longer than a thread's segment (37 > 16), enough rows for dw's
// reduction to split (8 x 28 rows), widths that leave a partial last strip and block of strips
// (56 x 30, 15 x 29), images of at most 7 rows, rows narrower than k, channel counts that leave
// a partial block, even but not multiples of 4 or 8 (18, 108), odd ones. bf16 7x7 on images of
// at most 16 x 16 with C a multiple of 8 takes the whole-image kernels (dwconv_plane.cu; on 9 to
// 16 columns their tensor-core passes, dwconv_plane_mma.cu: 14x14x96, 11x16x32, 16x15x56,
// 16x16x40), and so does 3x3 on fp32 activations up to 16 x 16; larger bf16 7x7 grids with C a
// multiple of 8 take dwconv_mma.cu. Modes: fp32, bf16, and fp32 x with bf16 weights (the LPUs
// on the residual stream: fp32 arithmetic on the same rounded weights, fp32's bound). The flags
// take turns: none, DWCONV_RESIDUAL, and that with DWCONV_WRITE_DX (dx written over NaN), unless
// the caller names three others.
static const int dwconv_flag_turns[3] = {0, DWCONV_RESIDUAL, DWCONV_RESIDUAL | DWCONV_WRITE_DX};
static void dwconv_cases_of(OpCaseList *l, const int (*shapes)[5], int n, const int *flag_sets) {
    for (int s = 0; s < n; s++)
        for (int m = 0; m < 2; m++) {
            const int B = shapes[s][0], H = shapes[s][1], W = shapes[s][2], C = shapes[s][3],
                      k = shapes[s][4];
            const ArgType xt = m == 0 ? TYPE_ACT : TYPE_F32;
            const double tol = m == 0 ? TOL_ROUNDED : TOL_F32;
            OpCase *c = case_new(l, fwd_dwconv, bwd_dwconv, "dwconv%s (%d,%d,%d,%d) k%d flags %d",
                                 m ? ", fp32 x" : "", B, H, W, C, k, flag_sets[s % 3]);
            case_ops(c, "dwconv_fwd", "dwconv_bwd");
            c->i[0] = flag_sets[s % 3];
            if (m) c->flags = CASE_NO_F32;
            put(c, DW_X, "x", ARG_IN, xt, -1, 1, 0, SHAPE(B, H, W, C));
            in(c, DW_W, "w", -1, 1, SHAPE(C, 1, k, k));
            in(c, DW_B, "b", -1, 1, SHAPE(C));
            put(c, DW_Y, "y", ARG_OUT, xt, 0, 0, tol, SHAPE(B, H, W, C));
            put(c, DW_DY, "dy", ARG_IN, xt, -1, 1, 0, SHAPE(B, H, W, C))->seed_of = "y";
            put(c, DW_DX, "dx", ARG_ACC, xt, -1, 1, tol, SHAPE(B, H, W, C))->grad_of = "x";
            if (flag_sets[s % 3] & DWCONV_WRITE_DX) written(c, DW_DX);
            grad32(c, DW_DW, "dw", "w", TOL_F32, SHAPE(C, 1, k, k));   // fp32 sums of bf16 products
            grad32(c, DW_DB, "db", "b", TOL_F32, SHAPE(C));
            // the mixer's convolution and SiLU: the sum rounded as silu reads it, then silu's
            // value rounded (seen: at most 2.8e-3 over the shapes, H100 and H200)
            c = case_copy(l, l->n - 1, ", silu");
            c->bwd = NULL;
            c->i[0] = DWCONV_SILU;
            c->arg[DW_Y].bf16_tol = m == 0 ? TOL_TWICE : TOL_F32;
            drop(c, DW_DY), drop(c, DW_DX), drop(c, DW_DW), drop(c, DW_DB);
        }
}

static void dwconv_cases(OpCaseList *l) {
    static const int shapes[][5] = {{2, 9, 7, 16, 3},   {1, 6, 11, 5, 5},  {4, 14, 14, 64, 3},
                                    {2, 5, 37, 40, 7},  {8, 28, 28, 48, 7}, {3, 4, 5, 33, 1},
                                    {4, 2, 2, 24, 7},   {2, 56, 30, 24, 7}, {3, 7, 7, 72, 3},
                                    {2, 16, 9, 20, 5},  {1, 15, 29, 144, 7}, {2, 9, 13, 18, 7},
                                    {1, 30, 28, 108, 3},  {2, 28, 28, 16, 7}, {3, 29, 33, 32, 7},
                                    {2, 40, 28, 8, 7},  {3, 14, 14, 96, 7}, {2, 7, 7, 48, 7},
                                    {2, 11, 16, 32, 7}, {1, 16, 15, 56, 7}, {2, 16, 16, 48, 3},
                                    {3, 5, 12, 40, 3},  {2, 14, 14, 32, 3}, {3, 2, 2, 64, 7},
                                    {2, 1, 1, 32, 7},   {2, 3, 2, 48, 3},   {2, 16, 16, 40, 7}};   // B H W C k
    dwconv_cases_of(l, shapes, (int)(sizeof shapes / sizeof shapes[0]), dwconv_flag_turns);

    // The added input x' = x + u uw^T + ub (the mixer's up projection onto the stream, then the
    // LPU) on the fp32 stream, fp32 or bf16 weights: gspn_t's four LPU grids at its widths, a
    // partial strip with odd channels, 108 channels, an odd small image, no ub, no mid, and 3
    // proxy channels (the two ops).
    static const int ushapes[][5] = {{2, 56, 56, 96, 2}, {2, 28, 28, 192, 2}, {3, 14, 14, 384, 2},
                                     {2, 7, 7, 768, 2},  {2, 9, 13, 33, 2},   {2, 12, 10, 108, 2},
                                     {2, 9, 7, 16, 2},   {2, 9, 13, 24, 3},   {2, 14, 14, 32, 2}};   // B H W C Ku
    for (int s = 0; s < (int)(sizeof ushapes / sizeof ushapes[0]); s++) {
        const int B = ushapes[s][0], H = ushapes[s][1], W = ushapes[s][2], C = ushapes[s][3],
                  ku = ushapes[s][4];
        OpCase *c = case_new(l, fwd_dwconv, NULL, "dwconv, added input (%d,%d,%d,%d) u of %d", B,
                             H, W, C, ku);
        case_ops(c, "dwconv_fwd", NULL);
        c->i[0] = DWCONV_RESIDUAL;
        in32(c, DW_X, "x", -1, 1, SHAPE(B, H, W, C));
        in(c, DW_W, "w", -1, 1, SHAPE(C, 1, 3, 3));
        in(c, DW_B, "b", -1, 1, SHAPE(C));
        in(c, DW_U, "u", -2, 2, SHAPE(B, H, W, ku));
        in(c, DW_UW, "uw", -1, 1, SHAPE(C, ku));
        in(c, DW_UB, "ub", -1, 1, SHAPE(C));
        out32(c, DW_MID, "mid", TOL_F32, SHAPE(B, H, W, C));   // fp32 arithmetic on the same values
        out32(c, DW_Y, "y", TOL_F32, SHAPE(B, H, W, C));
        if (s == 4) drop(c, DW_UB);
        if (s == 5) drop(c, DW_MID);
    }
}

enum { CV_X, CV_W, CV_B, CV_COLS, CV_Y, CV_DY, CV_DX, CV_DW, CV_DB };
static void fwd_conv2d(Ctx *ctx, Tensor *const *t, const OpCase *c) {
    op_conv2d_fwd(ctx, T(CV_X), T(CV_W), T(CV_B), c->i[0], c->i[1], c->i[2], NULL, T(CV_COLS), T(CV_Y));
}
static void bwd_conv2d(Ctx *ctx, Tensor *const *t, const OpCase *c) {
    op_conv2d_bwd(ctx, T(CV_DY), T(CV_COLS), T(CV_W), c->i[0], c->i[1], c->i[2], c->i[3], T(CV_DX),
                  T(CV_DW), T(CV_DB));
}

// conv2d for the stem (NCHW image, 3x3 stride 2: RGB and grey with 8k outputs, the direct stem
// kernels; 6 outputs, the columns), downsampling (channels-last 3x3 stride 2, 16 channels: the
// 8-channel vector path), 2x2 patch merging, an odd channel count at stride 1, gspn_t's stem width
// (48) and the widest the stem kernels take (64, from 4 channels); fp32, bf16, and an fp32 x
// under a bf16 weight (gspn_hier's fp32 stream, its values bf16 ones: the columns are bf16).
// Then dx written over NaN, dw and db alone, and the forward without kept columns.
typedef int Conv2dCaseShape[9];   // nchw B C H W Cout k s p
static void conv2d_cases_of(OpCaseList *l, const Conv2dCaseShape *cases, int n) {
    for (int ci = 0; ci < n; ci++)
        for (int m = 0; m < 2; m++) {
            const int *q = cases[ci];
            const int nchw = q[0], B = q[1], C = q[2], H = q[3], W = q[4], Co = q[5], k = q[6],
                      st = q[7], pd = q[8];
            const int Ho = (H + 2 * pd - k) / st + 1, Wo = (W + 2 * pd - k) / st + 1;
            const ArgType xt = m == 0 ? TYPE_ACT : TYPE_F32;
            OpCase *c = case_new(l, fwd_conv2d, bwd_conv2d, "conv2d%s %s (%d,%d,%d,%d) -> %d k%d s%d p%d",
                                 m ? ", fp32 x" : "", nchw ? "NCHW" : "NHWC", B, C, H, W, Co, k, st, pd);
            case_ops(c, "conv2d_fwd", "conv2d_bwd");
            c->i[0] = nchw, c->i[1] = st, c->i[2] = pd;
            if (m) c->flags = CASE_NO_F32;
            CaseArg *x = nchw ? put(c, CV_X, "x", ARG_IN, xt, -1, 1, 0, SHAPE(B, C, H, W))
                              : put(c, CV_X, "x", ARG_IN, xt, -1, 1, 0, SHAPE(B, H, W, C));
            x->act_values = 1;
            in(c, CV_W, "w", -1, 1, SHAPE(Co, C, k, k));
            in(c, CV_B, "b", -1, 1, SHAPE(Co));
            put(c, CV_COLS, "cols", ARG_SCRATCH, TYPE_ACT, 0, 0, 0, SHAPE(B * Ho * Wo, C * k * k));
            out(c, CV_Y, "y", TOL_ROUNDED, SHAPE(B, Ho, Wo, Co));   // fp32 sums of exact products
            seed(c, CV_DY, "dy", "y", SHAPE(B, Ho, Wo, Co));
            // bf16 dx: the columns' gradient rounded, then prior + its taps; fp32 dx: once
            CaseArg *dx = nchw ? put(c, CV_DX, "dx", ARG_ACC, xt, -1, 1, 0, SHAPE(B, C, H, W))
                               : put(c, CV_DX, "dx", ARG_ACC, xt, -1, 1, 0, SHAPE(B, H, W, C));
            dx->grad_of = "x";
            dx->bf16_tol = m == 0 ? TOL_TWICE : TOL_ROUNDED;
            grad32(c, CV_DW, "dw", "w", TOL_F32, SHAPE(Co, C, k, k));   // order of fp32 sums only
            grad32(c, CV_DB, "db", "b", TOL_F32, SHAPE(Co));
            const int full = l->n - 1;
            c = case_copy(l, full, ", dx written");
            c->i[3] = CONV2D_WRITE_DX;
            written(c, CV_DX);
            drop(c, CV_DW), drop(c, CV_DB);
            c = case_copy(l, full, ", dw and db alone");
            drop(c, CV_DX);
            c = case_copy(l, full, ", no kept columns");
            c->bwd = NULL;
            drop(c, CV_COLS), drop(c, CV_DY), drop(c, CV_DX), drop(c, CV_DW), drop(c, CV_DB);
        }
}
static void conv2d_cases(OpCaseList *l) {
    static const Conv2dCaseShape cases[] = {{1, 2, 3, 16, 12, 8, 3, 2, 1}, {1, 2, 1, 9, 7, 16, 3, 2, 1},
                                            {1, 3, 3, 50, 66, 24, 3, 2, 1}, {1, 2, 3, 9, 11, 6, 3, 2, 1},
                                            {0, 2, 16, 14, 14, 24, 3, 2, 1}, {0, 3, 8, 8, 10, 12, 2, 2, 0},
                                            {0, 1, 5, 7, 7, 6, 3, 1, 1},     {1, 2, 3, 32, 40, 48, 3, 2, 1},
                                            {1, 1, 4, 20, 18, 64, 3, 2, 1}};
    conv2d_cases_of(l, cases, (int)(sizeof cases / sizeof cases[0]));
}

// The 7x7 on gspn's grids at 224 px (dwconv_mma.cu's kernels with constant offsets: 56 and 28
// columns, and 53, a partial last tile of the same count; dwconv_plane_mma.cu's at 14 x 14 with 8
// channels a block; dwconv_image7.cu's at 7 x 7: a part of a warp's 32 channels, an image count
// not a multiple of a block's slots, each of the three flag sets), built after the older cases so
// that theirs keep their seeds.
static void dwconv_stage_cases(OpCaseList *l) {
    static const int shapes[][5] = {{1, 56, 56, 144, 7}, {1, 50, 53, 48, 7}, {2, 28, 28, 288, 7},
                                    {3, 14, 14, 40, 7},  {5, 7, 7, 40, 7},   {2, 7, 7, 96, 7},
                                    {3, 7, 7, 64, 7}};   // B H W C k
    dwconv_cases_of(l, shapes, (int)(sizeof shapes / sizeof shapes[0]), dwconv_flag_turns);
}

// The 7x7's backward in one pass over dy and x where dx is written: dwconv_plane_mma.cu's on
// images of 9 to 16 columns (14 x 14 at 16 channels a block, the model's shape, dx alone and with
// the residual; at 8, 24 channels; 9 x 13 on a run-time side) and dwconv_mma.cu's on rows of at
// most 32 columns (28 x 28 with its constant offsets, with the residual; 20 x 30 on run-time ones;
// 17 x 32, a last row block of one row). Built after the cases before, so that theirs keep their
// seeds.
static void dwconv_bwd_one_pass_cases(OpCaseList *l) {
    static const int shapes[][5] = {{3, 14, 14, 48, 7}, {2, 14, 14, 32, 7}, {2, 14, 14, 24, 7},
                                    {3, 9, 13, 16, 7},  {1, 28, 28, 48, 7}, {2, 20, 30, 32, 7},
                                    {1, 17, 32, 16, 7}};   // B H W C k
    static const int flag_sets[3] = {DWCONV_WRITE_DX, DWCONV_RESIDUAL | DWCONV_WRITE_DX, DWCONV_WRITE_DX};
    dwconv_cases_of(l, shapes, (int)(sizeof shapes / sizeof shapes[0]), flag_sets);
}

// The LPU's 3x3 backward on fp32 activations in tiles of rows (dwconv_plane.cu): 28 x 28 in two
// tiles, 56 x 56 in four, 37 rows in tiles of 10 (a partial last one), 20 x 17 at 32 channels in
// two, and 128 columns, the widest, in tiles of 6 (a partial last one). The fp32-x mode takes it;
// bf16 x keeps dwconv.cu's kernel. Last, 23 x 20 in three tiles (8, 8, 7 rows) at 66 groups of
// 32 channels: one block an SM leaves a group one or two blocks (up to 197 SMs), each taking
// items through its two staging buffers so that a first tile follows another tile in the same
// buffer and must have its zero rows above written again (with no more items than blocks, as in
// the cases before, no buffer is reused). Built after the cases before, so that theirs keep
// their seeds.
static void dwconv_lpu_tile_cases(OpCaseList *l) {
    static const int shapes[][5] = {{2, 28, 28, 48, 3}, {1, 56, 56, 24, 3}, {2, 37, 40, 16, 3},
                                    {3, 20, 17, 32, 3}, {1, 23, 128, 8, 3}, {3, 23, 20, 2112, 3}};   // B H W C k
    dwconv_cases_of(l, shapes, (int)(sizeof shapes / sizeof shapes[0]), dwconv_flag_turns);
}

// The mixer's 7x7 without a bias (its dw passes then leave out the bias gradient's MMAs): the
// one pass of dwconv_plane_mma.cu (14 x 14, 9 x 13) and of dwconv_mma.cu (28 x 28, 20 x 30), and
// where dx is added to, both files' dw passes alone (56 x 56 with its constant offsets, 14 x 14).
// Built after the cases before, so that theirs keep their seeds.
static void dwconv_no_bias_cases(OpCaseList *l) {
    static const int shapes[][5] = {{2, 14, 14, 48, 7}, {1, 56, 56, 16, 7}, {1, 28, 28, 32, 7},
                                    {2, 9, 13, 16, 7},  {2, 14, 14, 32, 7}, {1, 20, 30, 16, 7}};   // B H W C k
    static const int flag_sets[3] = {DWCONV_WRITE_DX, 0, DWCONV_RESIDUAL | DWCONV_WRITE_DX};
    const int first = l->n;
    dwconv_cases_of(l, shapes, (int)(sizeof shapes / sizeof shapes[0]), flag_sets);
    for (int i = first; i < l->n; i++) {
        OpCase *c = &l->cases[i];
        drop(c, DW_B), drop(c, DW_DB);
        const size_t n = strlen(c->title);
        snprintf(c->title + n, sizeof c->title - n, ", no bias");
    }
}

// The mixer's convolution, SiLU and down projection as one op (dwconv_silu_proj_fwd): the fused
// path of dwconv_mma.cu at 16 channels a block (28 x 28) and at 8 (20 x 30, a partial column
// tile, one output, no projection bias; 56 x 40, where the pass keeps its staged fp32 sums), and
// of dwconv_plane_mma.cu (14 x 14 at 16 channels a block; 9 x 13); of dwconv_image7.cu on 7 x 7
// images; the two ops past the fused passes' two outputs (17 x 33 with 4 and no convolution bias;
// 11 x 16 with 3). bf16: the convolution's output and SiLU's each rounded as
// the two ops store them, then the projection's sum once more; its terms add their rounding
// errors in quadrature, so norm-wise the result stays within the twice-rounded bound.
enum { DP_X, DP_W, DP_B, DP_PW, DP_PB, DP_Y };
static void fwd_dwconv_silu_proj(Ctx *ctx, Tensor *const *t, const OpCase *c) {
    (void)c;
    op_dwconv_silu_proj_fwd(ctx, T(DP_X), T(DP_W), T(DP_B), T(DP_PW), T(DP_PB), T(DP_Y));
}
static void dwconv_silu_proj_cases_of(OpCaseList *l, const int (*shapes)[5], int n) {
    for (int s = 0; s < n; s++) {
        const int B = shapes[s][0], H = shapes[s][1], W = shapes[s][2], C = shapes[s][3], M = shapes[s][4];
        OpCase *c = case_new(l, fwd_dwconv_silu_proj, NULL, "dwconv, silu, projection (%d,%d,%d,%d) to %d",
                             B, H, W, C, M);
        case_ops(c, "dwconv_silu_proj_fwd", NULL);
        in(c, DP_X, "x", -1, 1, SHAPE(B, H, W, C));
        in(c, DP_W, "w", -1, 1, SHAPE(C, 1, 7, 7));
        in(c, DP_B, "b", -1, 1, SHAPE(C));
        in(c, DP_PW, "pw", -1, 1, SHAPE(M, C));
        in(c, DP_PB, "pb", -1, 1, SHAPE(M));
        out(c, DP_Y, "y", TOL_TWICE, SHAPE(B, H, W, M));
        if (s == 1) drop(c, DP_B);
        if (s == 2) drop(c, DP_PB);
    }
}
static void dwconv_silu_proj_cases(OpCaseList *l) {
    static const int shapes[][5] = {{1, 28, 28, 48, 2}, {1, 17, 33, 32, 4}, {2, 20, 30, 24, 1},
                                    {1, 56, 40, 40, 2}, {2, 9, 13, 16, 2},  {3, 14, 14, 48, 2},
                                    {2, 11, 16, 40, 3}, {2, 7, 7, 32, 2}};   // B H W C M
    dwconv_silu_proj_cases_of(l, shapes, (int)(sizeof shapes / sizeof shapes[0]));
}

// The fused passes' write-out by pairs of pixels on odd widths, where the last pair has one
// pixel: dwconv_mma.cu's at 16 channels a block with a partial row tile, at 8 with its staged
// sums (more than 32 columns, no convolution bias) and one output (no projection bias), and
// dwconv_plane_mma.cu's (pairs from column -1). Built last, so that the cases before keep their
// seeds.
static void dwconv_silu_proj_odd_cases(OpCaseList *l) {
    static const int shapes[][5] = {{1, 17, 33, 32, 2}, {1, 15, 37, 40, 2}, {2, 20, 31, 24, 1},
                                    {2, 9, 15, 16, 2}};   // B H W C M
    dwconv_silu_proj_cases_of(l, shapes, (int)(sizeof shapes / sizeof shapes[0]));
}

// dwconv_image7.cu's projection: two groups of 32 channels and one output; 48 channels (not a
// multiple of 32: the two ops) without the convolution's bias; three groups without the
// projection's bias. Built last, so that the cases before keep their seeds.
static void dwconv_silu_proj_image7_cases(OpCaseList *l) {
    static const int shapes[][5] = {{3, 7, 7, 64, 1}, {2, 7, 7, 48, 2}, {5, 7, 7, 96, 2}};   // B H W C M
    dwconv_silu_proj_cases_of(l, shapes, (int)(sizeof shapes / sizeof shapes[0]));
}

// The LPU and the LayerNorm after it as one op (dwconv_layernorm_fwd) on the fp32 stream: every
// lane layout of kernels/cuda/dwconv_norm.cu (96: 8 lanes a pixel, 3 chunks; 192: 16 and 3, a
// partial band; 128: 32 and 1, taps in registers; 256, 384, 512, 768, 1024), no convolution bias,
// no norm weights, runs of several rows a block (6 x 100 x 70: halo rows across runs), and 40
// channels (the two ops). h: fp32 arithmetic on the same values (fused multiply-adds); y rounded
// once from the fp32 norm. Built last, so that the cases before keep their seeds.
enum { DN_X, DN_W, DN_B, DN_LNW, DN_LNB, DN_H, DN_Y };
static void fwd_dwconv_layernorm(Ctx *ctx, Tensor *const *t, const OpCase *c) {
    op_dwconv_layernorm_fwd(ctx, T(DN_X), T(DN_W), T(DN_B), T(DN_LNW), T(DN_LNB), c->f[0], T(DN_H), T(DN_Y));
}
static void dwconv_layernorm_cases(OpCaseList *l) {
    static const int shapes[][4] = {{2, 9, 11, 96},   {1, 20, 40, 192}, {2, 7, 9, 128},   {1, 14, 14, 256},
                                    {2, 6, 5, 384},   {1, 5, 7, 512},   {1, 4, 3, 768},   {1, 3, 4, 1024},
                                    {6, 100, 70, 32}, {2, 5, 6, 40}};   // B H W C
    for (int s = 0; s < (int)(sizeof shapes / sizeof shapes[0]); s++) {
        const int B = shapes[s][0], H = shapes[s][1], W = shapes[s][2], C = shapes[s][3];
        OpCase *c = case_new(l, fwd_dwconv_layernorm, NULL, "dwconv and layernorm (%d,%d,%d,%d)", B, H, W, C);
        case_ops(c, "dwconv_layernorm_fwd", NULL);
        c->f[0] = 1e-5f;
        in32(c, DN_X, "x", -1, 3, SHAPE(B, H, W, C));   // off zero, as layernorm's cases
        in(c, DN_W, "w", -1, 1, SHAPE(C, 1, 3, 3));
        in(c, DN_B, "b", -1, 1, SHAPE(C));
        in32(c, DN_LNW, "ln_w", 0.5f, 1.5f, SHAPE(C));
        in32(c, DN_LNB, "ln_b", -0.5f, 0.5f, SHAPE(C));
        out32(c, DN_H, "h", TOL_F32, SHAPE(B, H, W, C));
        out(c, DN_Y, "y", TOL_ROUNDED, SHAPE(B, H, W, C));
        if (s == 1) drop(c, DN_B);
        if (s == 2) drop(c, DN_LNW), drop(c, DN_LNB);
    }
}

// gspn_t's second stem convolution (48 -> 96, channels-last: kernels/cuda/conv2d_rows.cu where no
// columns are kept) on an odd output height, odd sizes, its 112^2 image and more row pairs than
// an H100 has SMs. Built last, so that the cases before keep their seeds.
static void conv2d_stem2_cases(OpCaseList *l) {
    static const Conv2dCaseShape cases[] = {{0, 2, 48, 14, 16, 96, 3, 2, 1}, {0, 1, 48, 9, 13, 96, 3, 2, 1},
                                            {0, 1, 48, 112, 112, 96, 3, 2, 1}, {0, 12, 48, 48, 20, 96, 3, 2, 1}};
    conv2d_cases_of(l, cases, (int)(sizeof cases / sizeof cases[0]));
}

// The second stem convolution at widths 112 and 128 (56 -> 112; 64 -> 128, gspn_s's and gspn_b's;
// channels-last, bf16, no kept columns: kernels/cuda/conv2d_taps.cu), forward only: tiles of 128
// output pixels with a partial last one, and (4 x 130 x 134) more tiles than an H100 has SMs, so
// that blocks take a second tile. Built after the cases before, so that theirs keep their seeds.
static void conv2d_stem2_wide_cases(OpCaseList *l) {
    static const int cases[][5] = {{1, 64, 30, 26, 128}, {2, 56, 23, 40, 112}, {4, 64, 130, 134, 128}};   // B C H W Cout
    for (int ci = 0; ci < (int)(sizeof cases / sizeof cases[0]); ci++) {
        const int B = cases[ci][0], C = cases[ci][1], H = cases[ci][2], W = cases[ci][3], Co = cases[ci][4];
        const int Ho = (H - 1) / 2 + 1, Wo = (W - 1) / 2 + 1;
        OpCase *c = case_new(l, fwd_conv2d, NULL, "conv2d NHWC (%d,%d,%d,%d) -> %d k3 s2 p1, no kept columns",
                             B, C, H, W, Co);
        case_ops(c, "conv2d_fwd", NULL);
        c->i[0] = 0, c->i[1] = 2, c->i[2] = 1;
        CaseArg *x = put(c, CV_X, "x", ARG_IN, TYPE_ACT, -1, 1, 0, SHAPE(B, H, W, C));
        x->act_values = 1;
        in(c, CV_W, "w", -1, 1, SHAPE(Co, C, 3, 3));
        in(c, CV_B, "b", -1, 1, SHAPE(Co));
        out(c, CV_Y, "y", TOL_ROUNDED, SHAPE(B, Ho, Wo, Co));   // fp32 sums of exact products
    }
}

enum { PE_IMG, PE_W, PE_B, PE_COLS, PE_Y, PE_DY, PE_DIMG, PE_DW, PE_DB };
static void fwd_patch_embed(Ctx *ctx, Tensor *const *t, const OpCase *c) {
    op_patch_embed_fwd(ctx, T(PE_IMG), T(PE_W), T(PE_B), c->i[0], T(PE_COLS), T(PE_Y));
}
static void bwd_patch_embed(Ctx *ctx, Tensor *const *t, const OpCase *c) {
    op_patch_embed_bwd(ctx, T(PE_DY), T(PE_COLS), T(PE_W), c->i[0], T(PE_DIMG), T(PE_DW), T(PE_DB));
}

static void patch_embed_cases(OpCaseList *l) {
    // non-square, D odd, K = 48; Fashion-MNIST (K = 49); the ViT-B/16 patch; patch 14, one patch
    // high; a single token
    static const int cases[][6] = {{2, 3, 8, 12, 4, 5}, {1, 1, 28, 28, 7, 64}, {3, 3, 32, 32, 16, 40},
                                   {2, 3, 14, 28, 14, 24}, {1, 2, 5, 5, 5, 3}};   // B Cin Hi Wi p D
    for (int ci = 0; ci < 5; ci++) {
        const int *q = cases[ci];
        const int B = q[0], Ci = q[1], Hi = q[2], Wi = q[3], p = q[4], D = q[5], K = Ci * p * p;
        const int Ht = Hi / p, Wt = Wi / p;
        OpCase *c = case_new(l, fwd_patch_embed, bwd_patch_embed, "patch_embed (%d,%d,%d,%d) p%d D=%d",
                             B, Ci, Hi, Wi, p, D);
        case_ops(c, "patch_embed_fwd", "patch_embed_bwd");
        c->i[0] = p;
        in(c, PE_IMG, "img", -1, 1, SHAPE(B, Ci, Hi, Wi));
        in(c, PE_W, "w", -1, 1, SHAPE(D, K));
        in(c, PE_B, "b", -1, 1, SHAPE(D));
        put(c, PE_COLS, "cols", ARG_SCRATCH, TYPE_ACT, 0, 0, 0, SHAPE(B * Ht * Wt, K));
        out(c, PE_Y, "y", TOL_GEMM_ACT, SHAPE(B, Ht, Wt, D));
        seed(c, PE_DY, "dy", "y", SHAPE(B, Ht, Wt, D));
        grad(c, PE_DIMG, "dimg", "img", TOL_GEMM_ACT, SHAPE(B, Ci, Hi, Wi));
        grad32(c, PE_DW, "dw", "w", TOL_GEMM_F32, SHAPE(D, K));
        grad32(c, PE_DB, "db", "b", TOL_GEMM_F32, SHAPE(D));
    }
}

// ---- linear ----------------------------------------------------------------------------------------

enum { LI_X, LI_W, LI_B, LI_Y, LI_DY, LI_DX, LI_DW, LI_DB, LI_RES, LI_PRE, LI_W2, LI_B2, LI_H,
       LI_DPRE_DB };
static void fwd_linear(Ctx *ctx, Tensor *const *t, const OpCase *c) {
    (void)c;
    op_linear_fwd(ctx, T(LI_X), T(LI_W), T(LI_B), NULL, T(LI_Y));
}
static void bwd_linear(Ctx *ctx, Tensor *const *t, const OpCase *c) {
    op_linear_bwd(ctx, T(LI_DY), T(LI_X), T(LI_W), write_flag(c, LI_DX, LINEAR_WRITE_DX), NULL,
                  T(LI_DX), T(LI_DW), T(LI_DB));
}
// SiLU on the input: y = silu(x) w^T + b.
static void fwd_linear_silu_in(Ctx *ctx, Tensor *const *t, const OpCase *c) {
    (void)c;
    op_linear_fwd(ctx, T(LI_X), T(LI_W), T(LI_B), &(LinearFwdOpts){.silu_in = 1}, T(LI_Y));
}
static void bwd_linear_silu_in(Ctx *ctx, Tensor *const *t, const OpCase *c) {
    (void)c;
    op_linear_bwd(ctx, T(LI_DY), T(LI_X), T(LI_W), 0, &(LinearBwdOpts){.silu_in = 1}, T(LI_DX),
                  T(LI_DW), T(LI_DB));
}
// Onto a residual: y = res + x w^T + b.
static void fwd_linear_res(Ctx *ctx, Tensor *const *t, const OpCase *c) {
    (void)c;
    op_linear_fwd(ctx, T(LI_X), T(LI_W), T(LI_B), &(LinearFwdOpts){.res = T(LI_RES)}, T(LI_Y));
}
// GELU on the output: pre = x w^T + b, y = gelu(pre).
static void fwd_linear_gelu_out(Ctx *ctx, Tensor *const *t, const OpCase *c) {
    const LinearFwdOpts o = {.gelu_out = 1, .gelu_kind = (GeluKind)c->i[0], .pre = T(LI_PRE)};
    op_linear_fwd(ctx, T(LI_X), T(LI_W), T(LI_B), &o, T(LI_Y));
}
static void bwd_linear_gelu_out(Ctx *ctx, Tensor *const *t, const OpCase *c) {
    const LinearBwdOpts o = {.gelu_out = 1, .gelu_kind = (GeluKind)c->i[0], .pre = T(LI_PRE)};
    op_linear_bwd(ctx, T(LI_DY), T(LI_X), T(LI_W), write_flag(c, LI_DX, LINEAR_WRITE_DX), &o,
                  T(LI_DX), T(LI_DW), T(LI_DB));
}
static void fwd_mlp_residual(Ctx *ctx, Tensor *const *t, const OpCase *c) {
    op_mlp_residual_fwd(ctx, T(LI_X), NULL, T(LI_W), T(LI_B), T(LI_W2), T(LI_B2), (GeluKind)c->i[0],
                        T(LI_RES), T(LI_Y));
}
// fc2 after a GELU: h = gelu(pre), y = h w^T + b; its backward with the GELU's fused in
// (gelu_in: dx is pre's gradient).
static void fwd_gelu_linear(Ctx *ctx, Tensor *const *t, const OpCase *c) {
    op_gelu_fwd(ctx, T(LI_PRE), (GeluKind)c->i[0], T(LI_H));
    op_linear_fwd(ctx, T(LI_H), T(LI_W), T(LI_B), NULL, T(LI_Y));
}
static void bwd_linear_gelu_in(Ctx *ctx, Tensor *const *t, const OpCase *c) {
    const LinearBwdOpts o = {.gelu_in = 1, .gelu_kind = (GeluKind)c->i[0], .pre = T(LI_PRE),
                             .dpre_db = T(LI_DPRE_DB)};
    op_linear_bwd(ctx, T(LI_DY), T(LI_H), T(LI_W), 0, &o, T(LI_DX), T(LI_DW), T(LI_DB));
}

static OpCase *linear_case(OpCaseList *l, CasePhase fwd, CasePhase bwd, const char *title, int N,
                           int K, int M) {
    OpCase *c = case_new(l, fwd, bwd, "%s N=%d K=%d M=%d", title, N, K, M);
    in(c, LI_X, "x", -1, 1, SHAPE(N, K));
    in(c, LI_W, "w", -1, 1, SHAPE(M, K));
    in(c, LI_B, "b", -1, 1, SHAPE(M));
    out(c, LI_Y, "y", TOL_GEMM_ACT, SHAPE(N, M));
    if (bwd) {
        seed(c, LI_DY, "dy", "y", SHAPE(N, M));
        grad(c, LI_DX, "dx", "x", TOL_GEMM_ACT, SHAPE(N, K));
        grad32(c, LI_DW, "dw", "w", TOL_GEMM_F32, SHAPE(M, K));
        grad32(c, LI_DB, "db", "b", TOL_GEMM_F32, SHAPE(M));
    }
    c->flops = 2.0 * N * K * M * (bwd ? 3 : 1);
    return c;
}

static void linear_cases(OpCaseList *l) {
    // tiny and odd (the fallbacks' edges), multiples of 8 (the tensor-core paths), a K past one
    // tile with M not a multiple of 8
    static const int shapes[][3] = {{5, 7, 3}, {64, 96, 48}, {37, 192, 130}};   // N K M
    for (int s = 0; s < 3; s++) {
        const int N = shapes[s][0], K = shapes[s][1], M = shapes[s][2];
        OpCase *c = linear_case(l, fwd_linear, bwd_linear, "linear", N, K, M);
        case_ops(c, "linear_fwd", "linear_bwd");
        const int full = l->n - 1;
        c = case_copy(l, full, ", dx written, no bias");
        written(c, LI_DX);
        drop(c, LI_B), drop(c, LI_DB);
        // an fp32 dy under bf16 x and w (the residual stream's gradient): the GPU rounds dy to
        // bf16 for dx and dw (2^-9 relative per element) where the CPU keeps it fp32; db from its
        // fp32 values
        c = case_copy(l, full, ", fp32 dy");
        c->flags = CASE_NO_F32;
        c->arg[LI_DY].type = TYPE_F32;
        c->arg[LI_DW].bf16_tol = TOL_ROUNDED;
        c = case_copy(l, l->n - 1, ", written");
        written(c, LI_DX);

        // silu(x) rounded to bf16 before the products on the GPU, exact on the CPU: dw too is a
        // rounding away; dx = (dy w, rounded) * silu'(x), rounded: twice
        c = linear_case(l, fwd_linear_silu_in, bwd_linear_silu_in, "linear, silu_in", N, K, M);
        case_ops(c, "linear_fwd", "linear_bwd");
        c->arg[LI_X].lo = -4, c->arg[LI_X].hi = 4;
        written(c, LI_DX);
        c->arg[LI_DX].bf16_tol = TOL_TWICE;
        c->arg[LI_DW].bf16_tol = TOL_ROUNDED;

        // onto an fp32 residual: the fused GEMM adds its fp32 product to res, its fallback rounds
        // the product to bf16 first (seen on an H100: 0.9e-3 to 1.7e-3)
        c = linear_case(l, fwd_linear_res, NULL, "linear, res", N, K, M);
        case_ops(c, "linear_fwd", NULL);
        in32(c, LI_RES, "res", -1, 1, SHAPE(N, M));
        c->arg[LI_Y].type = TYPE_F32;

        for (int k = 0; k < 2; k++) {
            // dpre = dy gelu'(pre) rounded to bf16 before the products (as an unfused GELU
            // backward hands it on), fp32 on the CPU: every gradient a rounding away
            c = linear_case(l, fwd_linear_gelu_out, bwd_linear_gelu_out,
                            k ? "linear, gelu_out tanh" : "linear, gelu_out erf", N, K, M);
            case_ops(c, "linear_fwd", "linear_bwd");
            c->i[0] = k ? GELU_TANH : GELU_ERF;
            out(c, LI_PRE, "pre", TOL_GEMM_ACT, SHAPE(N, M));
            c->arg[LI_DW].bf16_tol = TOL_GEMM_ACT;
            c->arg[LI_DB].bf16_tol = TOL_GEMM_ACT;
            c = case_copy(l, l->n - 1, ", dx written");
            written(c, LI_DX);

            // fc2 after the GELU: h identical on both sides (the CPU's rounded as the GPU stores
            // it), so dw and db are exact products; dpre and its sums a rounding or two away
            c = case_new(l, fwd_gelu_linear, bwd_linear_gelu_in, "linear, gelu_in %s N=%d K=%d M=%d",
                         k ? "tanh" : "erf", N, K, M);
            case_ops(c, "gelu_fwd", "linear_fwd");
            c->ops[2] = "linear_bwd";
            c->i[0] = k ? GELU_TANH : GELU_ERF;
            in(c, LI_PRE, "pre", -3, 3, SHAPE(N, K));
            out(c, LI_H, "h", TOL_ROUNDED, SHAPE(N, K));
            in(c, LI_W, "w", -1, 1, SHAPE(M, K));
            in(c, LI_B, "b", -1, 1, SHAPE(M));
            out(c, LI_Y, "y", TOL_GEMM_ACT, SHAPE(N, M));
            seed(c, LI_DY, "dy", "y", SHAPE(N, M));
            put(c, LI_DX, "dpre", ARG_OUT, TYPE_ACT, 0, 0, TOL_GEMM_ACT, SHAPE(N, K))->grad_of = "pre";
            put(c, LI_DPRE_DB, "dpre_db", ARG_ACC, TYPE_F32, -1, 1, TOL_GEMM_ACT, SHAPE(K));
            grad32(c, LI_DW, "dw", "w", TOL_GEMM_F32, SHAPE(M, K));
            grad32(c, LI_DB, "db", "b", TOL_GEMM_F32, SHAPE(M));
        }

        // the MLP onto a residual in one op: the hidden activation rounded twice (pre, h) on the
        // GPU, exact on the CPU, averaged in the second product; y fp32
        c = linear_case(l, fwd_mlp_residual, NULL, "mlp_residual", N, K, M);
        case_ops(c, "mlp_residual_fwd", NULL);
        c->i[0] = GELU_ERF;
        in(c, LI_W2, "w2", -1, 1, SHAPE(K, M));
        in(c, LI_B2, "b2", -1, 1, SHAPE(K));
        in32(c, LI_RES, "res", -1, 1, SHAPE(N, K));
        put(c, LI_Y, "y", ARG_OUT, TYPE_F32, 0, 0, TOL_GEMM_ACT, SHAPE(N, K));
    }
}

// ---- token layout, resize ------------------------------------------------------------------------

enum { TK_X, TK_P, TK_Y, TK_DY, TK_DX, TK_DP };
static void fwd_concat(Ctx *ctx, Tensor *const *t, const OpCase *c) {
    (void)c;
    op_concat_prefix_fwd(ctx, T(TK_P), T(TK_X), T(TK_Y));
}
static void bwd_concat(Ctx *ctx, Tensor *const *t, const OpCase *c) {
    (void)c;
    op_concat_prefix_bwd(ctx, T(TK_DY), T(TK_DP), T(TK_DX));
}
static void fwd_slice(Ctx *ctx, Tensor *const *t, const OpCase *c) {
    op_slice_tokens_fwd(ctx, T(TK_X), c->i[0], T(TK_Y));
}
static void bwd_slice(Ctx *ctx, Tensor *const *t, const OpCase *c) {
    op_slice_tokens_bwd(ctx, T(TK_DY), c->i[0], T(TK_DX));
}
static void fwd_mean_tokens(Ctx *ctx, Tensor *const *t, const OpCase *c) {
    (void)c;
    op_mean_tokens_fwd(ctx, T(TK_X), T(TK_Y));
}
static void bwd_mean_tokens(Ctx *ctx, Tensor *const *t, const OpCase *c) {
    (void)c;
    op_mean_tokens_bwd(ctx, T(TK_DY), T(TK_DX));
}
static void fwd_resize(Ctx *ctx, Tensor *const *t, const OpCase *c) {
    (void)c;
    op_resize_bilinear_fwd(ctx, T(TK_X), T(TK_Y));
}
static void bwd_resize(Ctx *ctx, Tensor *const *t, const OpCase *c) {
    (void)c;
    op_resize_bilinear_bwd(ctx, T(TK_DY), T(TK_DX));
}

static void token_cases(OpCaseList *l) {
    const int B = 2, N = 7, P = 1, start = 1, count = 5;
    for (int ci = 0; ci < 2; ci++) {
        const int C = ci == 0 ? 6 : 64;
        OpCase *c = case_new(l, fwd_concat, bwd_concat, "concat_prefix B=%d N=%d C=%d", B, N, C);
        case_ops(c, "concat_prefix_fwd", "concat_prefix_bwd");
        in(c, TK_X, "x", -1, 1, SHAPE(B, N, C));
        in(c, TK_P, "prefix", -1, 1, SHAPE(P, C));
        out(c, TK_Y, "y", TOL_EXACT, SHAPE(B, P + N, C));   // copies of the same values
        seed(c, TK_DY, "dy", "y", SHAPE(B, P + N, C));
        grad(c, TK_DX, "dx", "x", TOL_ROUNDED, SHAPE(B, N, C));
        grad32(c, TK_DP, "dprefix", "prefix", TOL_F32, SHAPE(P, C));   // an fp32 sum over the batch
        without_each(l, l->n - 1, TK_DX, TK_DP);

        c = case_new(l, fwd_slice, bwd_slice, "slice_tokens B=%d N=%d C=%d", B, N, C);
        case_ops(c, "slice_tokens_fwd", "slice_tokens_bwd");
        c->i[0] = start;
        in(c, TK_X, "x", -1, 1, SHAPE(B, N, C));
        out(c, TK_Y, "y", TOL_EXACT, SHAPE(B, count, C));   // a copy
        seed(c, TK_DY, "dy", "y", SHAPE(B, count, C));
        grad(c, TK_DX, "dx", "x", TOL_ROUNDED, SHAPE(B, N, C));

        c = case_new(l, fwd_mean_tokens, bwd_mean_tokens, "mean_tokens B=%d N=%d C=%d", B, N, C);
        case_ops(c, "mean_tokens_fwd", "mean_tokens_bwd");
        in(c, TK_X, "x", -1, 1, SHAPE(B, N, C));
        out(c, TK_Y, "y", TOL_ROUNDED, SHAPE(B, C));
        seed(c, TK_DY, "dy", "y", SHAPE(B, C));
        grad(c, TK_DX, "dx", "x", TOL_ROUNDED, SHAPE(B, N, C));
    }

    // (H, W) -> (H2, W2): mixed up and down, strong upsampling, identity, strong shrink, and the
    // curriculum's 27 -> 37 (378 -> 518 px at patch 14) and a non-square 7x10 -> 10x14
    static const int grids[][4] = {{5, 7, 9, 4}, {3, 3, 7, 11}, {4, 6, 4, 6}, {13, 11, 4, 3},
                                   {27, 27, 37, 37}, {7, 10, 10, 14}};
    for (int g = 0; g < 6; g++)
        for (int ci = 0; ci < 2; ci++) {
            const int H = grids[g][0], W = grids[g][1], H2 = grids[g][2], W2 = grids[g][3];
            const int C = ci == 0 ? 6 : 64;
            OpCase *c = case_new(l, fwd_resize, bwd_resize, "resize_bilinear (2,%d,%d,%d) -> (%d,%d)",
                                 H, W, C, H2, W2);
            case_ops(c, "resize_bilinear_fwd", "resize_bilinear_bwd");
            in(c, TK_X, "x", -1, 1, SHAPE(2, H, W, C));
            out(c, TK_Y, "y", TOL_ROUNDED, SHAPE(2, H2, W2, C));
            seed(c, TK_DY, "dy", "y", SHAPE(2, H2, W2, C));
            grad(c, TK_DX, "dx", "x", TOL_ROUNDED, SHAPE(2, H, W, C));   // gathered in fp32
        }
}

// ---- losses -----------------------------------------------------------------------------------------

enum { LS_A, LS_B, LS_LOSS, LS_PROBS, LS_DLOSS, LS_DA, LS_DB };
static void fwd_cross_entropy(Ctx *ctx, Tensor *const *t, const OpCase *c) {
    (void)c;
    op_cross_entropy_fwd(ctx, T(LS_A), T(LS_B), T(LS_LOSS), T(LS_PROBS));
}
static void bwd_cross_entropy(Ctx *ctx, Tensor *const *t, const OpCase *c) {
    (void)c;
    op_cross_entropy_bwd(ctx, T(LS_DLOSS), T(LS_PROBS), T(LS_B), T(LS_DA));
}
static void fwd_mse(Ctx *ctx, Tensor *const *t, const OpCase *c) {
    (void)c;
    op_mse_fwd(ctx, T(LS_A), T(LS_B), T(LS_LOSS));
}
static void bwd_mse(Ctx *ctx, Tensor *const *t, const OpCase *c) {
    (void)c;
    op_mse_bwd(ctx, T(LS_DLOSS), T(LS_A), T(LS_B), T(LS_DA), T(LS_DB));
}
static void fwd_token_kl(Ctx *ctx, Tensor *const *t, const OpCase *c) {
    (void)c;
    op_token_kl_fwd(ctx, T(LS_A), T(LS_B), T(LS_LOSS));
}
static void bwd_token_kl(Ctx *ctx, Tensor *const *t, const OpCase *c) {
    (void)c;
    op_token_kl_bwd(ctx, T(LS_DLOSS), T(LS_A), T(LS_B), T(LS_DA), T(LS_DB));
}

// A loss case: a, b (R, C) -> loss; dloss 0.7 (not 1, so a missing dloss factor shows).
static OpCase *loss_case(OpCaseList *l, CasePhase fwd, CasePhase bwd, const char *title, int R,
                         int C, float lo, float hi, float prior) {
    OpCase *c = case_new(l, fwd, bwd, "%s (%d, %d)", title, R, C);
    in(c, LS_A, "a", lo, hi, SHAPE(R, C));
    in(c, LS_B, "b", lo, hi, SHAPE(R, C));
    out32(c, LS_LOSS, "loss", TOL_F32, SHAPE(1));
    in32(c, LS_DLOSS, "dloss", 0.7f, 0.7f, SHAPE(1))->seed_of = "loss";
    CaseArg *d = grad(c, LS_DA, "da", "a", TOL_ROUNDED, SHAPE(R, C));
    d->lo = -prior, d->hi = prior;   // priors of the gradient's size
    d = grad(c, LS_DB, "db", "b", TOL_ROUNDED, SHAPE(R, C));
    d->lo = -prior, d->hi = prior;
    return c;
}

static void loss_cases(OpCaseList *l) {
    static const int cshapes[][2] = {{7, 10}, {5, 64}, {3, 1155}};
    for (int s = 0; s < 3; s++) {
        const int B = cshapes[s][0], K = cshapes[s][1];
        OpCase *c = loss_case(l, fwd_cross_entropy, bwd_cross_entropy, "cross_entropy", B, K, -4, 4, 1);
        case_ops(c, "cross_entropy_fwd", "cross_entropy_bwd");
        c->arg[LS_A].name = "logits";
        c->arg[LS_B] = (CaseArg){.name = "targets", .role = ARG_IN, .fill = FILL_ROWS_SUM1,
                                 .lo = 0.01f, .hi = 1.0f, .ndim = 2, .shape = {B, K}};
        out32(c, LS_PROBS, "probs", TOL_F32, SHAPE(B, K));   // fp32, as the tape keeps them
        c->arg[LS_DA].grad_of = "logits";
        drop(c, LS_DB);
    }
    static const int mshapes[][2] = {{7, 1155}, {2, 21}, {300, 64}};
    for (int s = 0; s < 3; s++) {
        OpCase *c = loss_case(l, fwd_mse, bwd_mse, "mse", mshapes[s][0], mshapes[s][1], -1, 1, 1e-3f);
        case_ops(c, "mse_fwd", "mse_bwd");
        without_each(l, l->n - 1, LS_DA, LS_DB);
    }
    static const int kshapes[][2] = {{7, 33}, {5, 64}, {7, 1155}, {2, 6}};
    for (int s = 0; s < 4; s++) {
        const int N = kshapes[s][0], C = kshapes[s][1];
        OpCase *c = loss_case(l, fwd_token_kl, bwd_token_kl, "token_kl", N, C, -2, 2,
                              0.1f / (float)(N * C));   // dloss / N times probabilities
        case_ops(c, "token_kl_fwd", "token_kl_bwd");
        c->arg[LS_A].name = "s", c->arg[LS_B].name = "t";
        c->arg[LS_DA].name = "ds", c->arg[LS_DA].grad_of = "s";
        c->arg[LS_DB].name = "dt", c->arg[LS_DB].grad_of = "t";
        without_each(l, l->n - 1, LS_DA, LS_DB);
    }
}

// ---- optimizer, regularizers, EMA ------------------------------------------------------------------

enum { OPT_PARAM, OPT_MASTER, OPT_GRAD, OPT_M, OPT_V };
static const AdamWArgs ADAMW_ARGS = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                                     .weight_decay = 0.05f, .grad_scale = 0.5f, .step = 3};
// The CPU keeps fp32 parameters and no master: where the GPU updates a bf16 parameter through its
// fp32 master, the CPU updates the master's values and hands them to the parameter.
static void fwd_adamw(Ctx *ctx, Tensor *const *t, const OpCase *c) {
    (void)c;
    if (ctx->device == DEVICE_CPU && T(OPT_MASTER)) {
        op_adamw(ctx, T(OPT_MASTER), NULL, T(OPT_GRAD), T(OPT_M), T(OPT_V), &ADAMW_ARGS);
        memcpy(T(OPT_PARAM)->data, T(OPT_MASTER)->data, tensor_bytes(T(OPT_MASTER)));
    } else {
        op_adamw(ctx, T(OPT_PARAM), T(OPT_MASTER), T(OPT_GRAD), T(OPT_M), T(OPT_V), &ADAMW_ARGS);
    }
}
static void fwd_sumsq(Ctx *ctx, Tensor *const *t, const OpCase *c) {
    (void)c;
    op_sumsq(ctx, T(OPT_GRAD), T(OPT_PARAM));
}

enum { RG_X, RG_Y, RG_DY, RG_DX };
static const DropPathArgs DROP_PATH_ARGS = {.prob = 0.35f, .seed = 1234, .step = 77, .site = 5,
                                            .first_sample = 16};
static void fwd_drop_path(Ctx *ctx, Tensor *const *t, const OpCase *c) {
    (void)c;
    op_drop_path_fwd(ctx, T(RG_X), &DROP_PATH_ARGS, T(RG_Y));
}
static void bwd_drop_path(Ctx *ctx, Tensor *const *t, const OpCase *c) {
    (void)c;
    op_drop_path_bwd(ctx, T(RG_DY), &DROP_PATH_ARGS, T(RG_DX));
}
static void fwd_ema(Ctx *ctx, Tensor *const *t, const OpCase *c) {
    op_ema_update(ctx, T(RG_Y), T(RG_X), c->f[0], T(RG_DX));
}

static void optim_cases(OpCaseList *l) {
    static const int sizes[] = {8085, 6, 100003};
    for (int s = 0; s < 3; s++) {
        OpCase *c = case_new(l, fwd_sumsq, NULL, "sumsq n=%d", sizes[s]);
        case_ops(c, "sumsq", NULL);
        in(c, OPT_GRAD, "x", -1, 1, SHAPE(sizes[s]));
        put(c, OPT_PARAM, "sum", ARG_ACC, TYPE_F32, 1.5f, 1.5f, TOL_F32, SHAPE(1));
    }
    static const int asizes[] = {8085, 5, 4096};
    for (int s = 0; s < 3; s++)
        for (int m = 0; m < 2; m++) {   // an fp32 parameter; a bf16 one with its fp32 master
            const int n = asizes[s];
            OpCase *c = case_new(l, fwd_adamw, NULL, "adamw n=%d%s", n, m ? ", master" : "");
            case_ops(c, "adamw", NULL);
            c->flags = m ? CASE_NO_F32 : CASE_NO_BF16;
            put(c, OPT_PARAM, "param", ARG_ACC, TYPE_ACT, -0.5f, 0.5f, TOL_ROUNDED, SHAPE(n));
            if (m) put(c, OPT_MASTER, "master", ARG_ACC, TYPE_F32, -0.5f, 0.5f, TOL_F32, SHAPE(n));
            in32(c, OPT_GRAD, "grad", -1, 1, SHAPE(n));
            put(c, OPT_M, "m", ARG_ACC, TYPE_F32, -0.1f, 0.1f, TOL_F32, SHAPE(n));
            put(c, OPT_V, "v", ARG_ACC, TYPE_F32, 0.0f, 0.01f, TOL_F32, SHAPE(n));
        }

    static const int dshapes[][3] = {{24, 7, 6}, {40, 3, 64}};   // B T C
    for (int s = 0; s < 2; s++) {
        const int B = dshapes[s][0], Tn = dshapes[s][1], C = dshapes[s][2];
        OpCase *c = case_new(l, fwd_drop_path, bwd_drop_path, "drop_path (%d, %d, %d)", B, Tn, C);
        case_ops(c, "drop_path_fwd", "drop_path_bwd");
        in(c, RG_X, "x", -1, 1, SHAPE(B, Tn, C));
        out(c, RG_Y, "y", TOL_ROUNDED, SHAPE(B, Tn, C));   // x times the kept scale, rounded once
        seed(c, RG_DY, "dy", "y", SHAPE(B, Tn, C));
        grad(c, RG_DX, "dx", "x", TOL_ROUNDED, SHAPE(B, Tn, C));
    }
    static const int esizes[] = {8085, 7};
    for (int s = 0; s < 2; s++) {
        // two rounded products and a rounded sum, no fused multiply-add: the same bits
        OpCase *c = case_new(l, fwd_ema, NULL, "ema_update n=%d", esizes[s]);
        case_ops(c, "ema_update", NULL);
        c->f[0] = 0.9f;
        c->f32_tol = TOL_EXACT;
        c->flags = CASE_NO_FD;
        in(c, RG_X, "src", -1, 1, SHAPE(esizes[s]));
        put(c, RG_Y, "ema", ARG_ACC, TYPE_F32, -1, 1, TOL_EXACT, SHAPE(esizes[s]));
        out(c, RG_DX, "out", TOL_EXACT, SHAPE(esizes[s]));
    }
}

// ---- the C-GSPN scan ---------------------------------------------------------------------------------

enum { SC_XC, SC_GATES, SC_MERGE, SC_YC, SC_HIDDEN, SC_DYC, SC_DXC, SC_DGATES, SC_DMERGE };
static void fwd_scan(Ctx *ctx, Tensor *const *t, const OpCase *c) {
    op_gspn_scan_fwd(ctx, T(SC_XC), T(SC_GATES), T(SC_MERGE), c->i[0], T(SC_YC), T(SC_HIDDEN));
}
static void bwd_scan(Ctx *ctx, Tensor *const *t, const OpCase *c) {
    op_gspn_scan_bwd(ctx, T(SC_DYC), T(SC_XC), T(SC_GATES), T(SC_MERGE), c->i[0], T(SC_HIDDEN),
                     write_flag(c, SC_DXC, GSPN_SCAN_WRITE_GRADS), T(SC_DXC), T(SC_DGATES),
                     T(SC_DMERGE));
}

static void scan_cases(OpCaseList *l) {
    // H != W with W not a multiple of 32 and Cc = 3 (scalar); H = 1; W = 1; vectors past 64
    // lanes; H > W; Cc = 8 (a 16-byte vector per token in bf16); a single token
    static const int shapes[][4] = {{2, 5, 37, 3}, {1, 1, 33, 64}, {2, 7, 1, 1}, {1, 9, 70, 64},
                                    {2, 23, 6, 64}, {3, 12, 45, 8}, {1, 1, 1, 3}};   // B H W Cc
    for (int s = 0; s < 7; s++)
        for (int shared = 0; shared < 2; shared++) {
            const int B = shapes[s][0], H = shapes[s][1], W = shapes[s][2], Cc = shapes[s][3];
            const int G = shared ? 4 * (2 * Cc + 3) : 20 * Cc;
            OpCase *c = case_new(l, fwd_scan, bwd_scan, "gspn_scan%s (%d,%d,%d,%d)",
                                 shared ? " shared" : "", B, H, W, Cc);
            case_ops(c, "gspn_scan_fwd", "gspn_scan_bwd");
            c->i[0] = shared;
            in(c, SC_XC, "xc", -1, 1, SHAPE(B, H, W, Cc));
            in(c, SC_GATES, "gates", -2, 2, SHAPE(B, H, W, G));
            in32(c, SC_MERGE, "merge", -1, 1, SHAPE(4));
            out(c, SC_YC, "yc", TOL_SCAN_ACT, SHAPE(B, H, W, Cc));
            out32(c, SC_HIDDEN, "hidden", TOL_SCAN_HIDDEN, SHAPE(4, B, H, W, Cc));
            seed(c, SC_DYC, "dyc", "yc", SHAPE(B, H, W, Cc));
            grad(c, SC_DXC, "dxc", "xc", TOL_SCAN_ACT, SHAPE(B, H, W, Cc));
            grad(c, SC_DGATES, "dgates", "gates", TOL_SCAN_ACT, SHAPE(B, H, W, G));
            grad32(c, SC_DMERGE, "dmerge", "merge", TOL_SCAN_HIDDEN, SHAPE(4));
            const int full = l->n - 1;
            c = case_copy(l, full, ", written");
            written(c, SC_DXC), written(c, SC_DGATES);
            c = case_copy(l, full, ", hidden recomputed");
            drop(c, SC_HIDDEN);
        }
}

// The scan with its gates made inside it (gspn_scan_proj_fwd): the on-chip kernels at gspn_hier's
// 2 proxy channels (14 x 14; 7 x 9 without a gate bias), 1 and 4 channels, and the two ops past
// them (a 70-lane line; per-channel weights). bf16: the gates are rounded as linear_fwd stores
// them where the CPU keeps them in fp32, one more half ulp (2^-9) of each gate on top of what
// TOL_SCAN_ACT allows for the scan alone (~3e-3 norm-wise of its 1e-2), about 2e-3 more.
// Built last, so that the cases before keep their seeds.
enum { SP_XC, SP_GW, SP_GB, SP_MERGE, SP_YC };
static void fwd_scan_proj(Ctx *ctx, Tensor *const *t, const OpCase *c) {
    op_gspn_scan_proj_fwd(ctx, T(SP_XC), T(SP_GW), T(SP_GB), T(SP_MERGE), c->i[0], T(SP_YC));
}
static void scan_proj_cases(OpCaseList *l) {
    static const int shapes[][5] = {{2, 14, 14, 2, 1}, {3, 7, 9, 2, 1}, {2, 11, 6, 1, 1}, {1, 13, 10, 4, 1},
                                    {2, 9, 70, 2, 1},  {2, 6, 5, 3, 0}};   // B H W Cc shared
    for (int s = 0; s < (int)(sizeof shapes / sizeof shapes[0]); s++) {
        const int B = shapes[s][0], H = shapes[s][1], W = shapes[s][2], Cc = shapes[s][3], shared = shapes[s][4];
        const int G = shared ? 4 * (2 * Cc + 3) : 20 * Cc;
        OpCase *c = case_new(l, fwd_scan_proj, NULL, "gspn_scan_proj%s (%d,%d,%d,%d)", shared ? " shared" : "",
                             B, H, W, Cc);
        case_ops(c, "gspn_scan_proj_fwd", NULL);
        c->i[0] = shared;
        in(c, SP_XC, "xc", -1, 1, SHAPE(B, H, W, Cc));
        in(c, SP_GW, "gw", -1, 1, SHAPE(G, Cc));
        in(c, SP_GB, "gb", -1, 1, SHAPE(G));
        in32(c, SP_MERGE, "merge", -1, 1, SHAPE(4));
        out(c, SP_YC, "yc", TOL_SCAN_ACT, SHAPE(B, H, W, Cc));
        if (s == 1) drop(c, SP_GB);
    }
}

// ---- sizes with many blocks of partial sums ---------------------------------------------------------

// The reductions at sizes where they split into many blocks (4099 rows of 1152: 4.7M elements),
// so that the GPU test's second run shows any order that depends on scheduling. Their gradients
// are checked by finite differences at the small shapes above.
static void reduction_cases(OpCaseList *l) {
    const int N = 4099, C = 1152;
    OpCase *c = layernorm_case(l, N, C, TYPE_ACT, TYPE_ACT, 1e-5f, "");
    c->flags = CASE_NO_FD;
    c = case_new(l, fwd_layer_scale, bwd_layer_scale, "layer_scale (%d, %d)", N, C);
    case_ops(c, "layer_scale_fwd", "layer_scale_bwd");
    c->flags = CASE_NO_FD;
    in(c, BC_X, "x", -1, 1, SHAPE(N, C));
    in(c, BC_P, "g", 0.5f, 1.5f, SHAPE(C));
    out(c, BC_Y, "y", TOL_ROUNDED, SHAPE(N, C));
    seed(c, BC_DY, "dy", "y", SHAPE(N, C));
    grad(c, BC_DX, "dx", "x", TOL_ROUNDED, SHAPE(N, C));
    grad32(c, BC_DP, "dg", "g", TOL_F32, SHAPE(C));
    c = case_new(l, fwd_add_bcast, bwd_add_bcast, "add_bcast (%d, 1, %d)", N, C);
    case_ops(c, "add_bcast_fwd", "add_bcast_bwd");
    c->flags = CASE_NO_FD;
    in(c, BC_X, "x", -1, 1, SHAPE(N, 1, C));
    in(c, BC_P, "p", -1, 1, SHAPE(1, C));
    out(c, BC_Y, "y", TOL_ROUNDED, SHAPE(N, 1, C));
    seed(c, BC_DY, "dy", "y", SHAPE(N, 1, C));
    grad(c, BC_DX, "dx", "x", TOL_ROUNDED, SHAPE(N, 1, C));
    grad32(c, BC_DP, "dp", "p", TOL_F32, SHAPE(1, C));
    // the class token's gradient over a batch of 300 sequences of 8 tokens
    c = case_new(l, fwd_concat, bwd_concat, "concat_prefix B=300 N=8 C=%d", C);
    case_ops(c, "concat_prefix_fwd", "concat_prefix_bwd");
    c->flags = CASE_NO_FD;
    in(c, TK_X, "x", -1, 1, SHAPE(300, 8, C));
    in(c, TK_P, "prefix", -1, 1, SHAPE(1, C));
    out(c, TK_Y, "y", TOL_EXACT, SHAPE(300, 9, C));
    seed(c, TK_DY, "dy", "y", SHAPE(300, 9, C));
    grad(c, TK_DX, "dx", "x", TOL_ROUNDED, SHAPE(300, 8, C));
    grad32(c, TK_DP, "dprefix", "prefix", TOL_F32, SHAPE(1, C));
    c = loss_case(l, fwd_mse, bwd_mse, "mse", N, C, -1, 1, 1e-3f);
    case_ops(c, "mse_fwd", "mse_bwd");
    c->flags = CASE_NO_FD;
    c = loss_case(l, fwd_token_kl, bwd_token_kl, "token_kl", N, C, -2, 2, 0.1f / (float)(N * C));
    case_ops(c, "token_kl_fwd", "token_kl_bwd");
    c->flags = CASE_NO_FD;
    c = case_new(l, fwd_sumsq, NULL, "sumsq n=%d", N * C);
    case_ops(c, "sumsq", NULL);
    in(c, OPT_GRAD, "x", -1, 1, SHAPE(N * C));
    put(c, OPT_PARAM, "sum", ARG_ACC, TYPE_F32, 1.5f, 1.5f, TOL_F32, SHAPE(1));
    // the curriculum's 2x, backward a gather over 74 x 74
    c = case_new(l, fwd_resize, bwd_resize, "resize_bilinear (2,37,37,64) -> (74,74)");
    case_ops(c, "resize_bilinear_fwd", "resize_bilinear_bwd");
    c->flags = CASE_NO_FD;
    in(c, TK_X, "x", -1, 1, SHAPE(2, 37, 37, 64));
    out(c, TK_Y, "y", TOL_ROUNDED, SHAPE(2, 74, 74, 64));
    seed(c, TK_DY, "dy", "y", SHAPE(2, 74, 74, 64));
    grad(c, TK_DX, "dx", "x", TOL_ROUNDED, SHAPE(2, 37, 37, 64));
}

// ---- training sizes for `cgspn bench ops` ----------------------------------------------------------

// so14's width at 1036 px: 32 x 74 x 74 tokens of 1152 channels; the C-GSPN latent (64 channels)
// over the 2058 px grid's tokens, about 4x as many; AdamW over 400M parameters.
static void bench_cases(OpCaseList *l) {
    const int N = 32 * 74 * 74, C = 1152, Nc = 4 * N, Cc = 64, P = 400000000;
    layernorm_case(l, N, C, TYPE_ACT, TYPE_ACT, 1e-6f, "");
    OpCase *c = case_copy(l, l->n - 1, ", dx alone");
    drop(c, LN_DW), drop(c, LN_DB);
    layernorm_case(l, N, C, TYPE_F32, TYPE_ACT, 1e-6f, ", fp32 x");
    c = case_copy(l, l->n - 1, ", hand-off");
    drop(c, LN_DB);
    out(c, LN_DX_ACT, "dx_act", 0, SHAPE(N, C));
    put(c, LN_DX_SUM, "dx_sum", ARG_ACC, TYPE_F32, -1, 1, 0, SHAPE(C));
    layernorm_case(l, Nc, Cc, TYPE_ACT, TYPE_ACT, 1e-6f, " (short rows)");

    c = case_new(l, fwd_layernorm, NULL, "layernorm with the add, x fp32 (%d, %d)", N, C);
    case_ops(c, "layernorm_fwd", NULL);
    c->f[0] = 1e-6f;
    in32(c, LN_X, "x", -1, 3, SHAPE(N, C));
    in(c, LN_R, "r", -1, 1, SHAPE(N, C));
    in(c, LN_W, "w", 0.5f, 1.5f, SHAPE(C));
    in(c, LN_B, "b", -0.5f, 0.5f, SHAPE(C));
    out32(c, LN_H, "h", 0, SHAPE(N, C));
    out(c, LN_Y, "y", 0, SHAPE(N, C));
    out32(c, LN_MEAN, "mean", 0, SHAPE(N));
    out32(c, LN_RSTD, "rstd", 0, SHAPE(N));

    c = case_new(l, fwd_layer_scale, bwd_layer_scale, "layer_scale (%d, %d)", N, C);
    case_ops(c, "layer_scale_fwd", "layer_scale_bwd");
    in(c, BC_X, "x", -1, 1, SHAPE(N, C));
    in(c, BC_P, "g", 0.5f, 1.5f, SHAPE(C));
    out(c, BC_Y, "y", 0, SHAPE(N, C));
    seed(c, BC_DY, "dy", "y", SHAPE(N, C));
    grad(c, BC_DX, "dx", "x", 0, SHAPE(N, C));
    grad32(c, BC_DP, "dg", "g", 0, SHAPE(C));
    c = case_new(l, fwd_cast_colsum, NULL, "cast_colsum (%d, %d)", N, C);
    case_ops(c, "cast_colsum", NULL);
    in32(c, CC_X, "x", -1, 1, SHAPE(N, C));
    out(c, CC_Y, "y", 0, SHAPE(N, C));
    put(c, CC_SUM, "colsum", ARG_ACC, TYPE_F32, -1, 1, 0, SHAPE(C));
    unary_case(l, fwd_softmax, bwd_softmax, "softmax_fwd", "softmax_bwd", "softmax", N, C, -3, 3);
    c = unary_case(l, fwd_gelu, bwd_gelu, "gelu_fwd", "gelu_bwd", "gelu tanh", N, C, -4, 4);
    c->i[0] = GELU_TANH;
    c = case_new(l, fwd_accumulate, NULL, "accumulate (%d, %d)", N, C);
    case_ops(c, "accumulate", NULL);
    in(c, EW_A, "src", -1, 1, SHAPE(N, C));
    put(c, EW_Y, "dst", ARG_ACC, TYPE_ACT, -1, 1, 0, SHAPE(N, C));

    // the curriculum's 2x: (32, 37, 37, C) <-> (32, 74, 74, C)
    c = case_new(l, fwd_resize, bwd_resize, "resize_bilinear (32,37,37,%d) -> (74,74)", C);
    case_ops(c, "resize_bilinear_fwd", "resize_bilinear_bwd");
    in(c, TK_X, "x", -1, 1, SHAPE(32, 37, 37, C));
    out(c, TK_Y, "y", 0, SHAPE(32, 74, 74, C));
    seed(c, TK_DY, "dy", "y", SHAPE(32, 74, 74, C));
    grad(c, TK_DX, "dx", "x", 0, SHAPE(32, 37, 37, C));

    for (int m = 0; m < 2; m++) {   // a bf16 parameter with its fp32 master; an fp32 one
        c = case_new(l, fwd_adamw, NULL, "adamw %dM%s", P / 1000000, m ? ", fp32 param" : ", master");
        case_ops(c, "adamw", NULL);
        put(c, OPT_PARAM, "param", ARG_ACC, m ? TYPE_F32 : TYPE_ACT, -0.1f, 0.1f, 0, SHAPE(P));
        if (!m) put(c, OPT_MASTER, "master", ARG_ACC, TYPE_F32, -0.1f, 0.1f, 0, SHAPE(P));
        in32(c, OPT_GRAD, "grad", -1e-3f, 1e-3f, SHAPE(P));
        put(c, OPT_M, "m", ARG_ACC, TYPE_F32, -1e-4f, 1e-4f, 0, SHAPE(P));
        put(c, OPT_V, "v", ARG_ACC, TYPE_F32, 0.0f, 1e-6f, 0, SHAPE(P));
    }
    c = case_new(l, fwd_sumsq, NULL, "sumsq %dM fp32", P / 1000000);
    case_ops(c, "sumsq", NULL);
    in32(c, OPT_GRAD, "x", -1, 1, SHAPE(P));
    put(c, OPT_PARAM, "sum", ARG_ACC, TYPE_F32, 0, 0, 0, SHAPE(1));
}

// ---- the list ----------------------------------------------------------------------------------------

void op_cases_build(OpCaseList *l, CaseSet set) {
    if (set == CASES_BENCH) {
        bench_cases(l);
        return;
    }
    elementwise_cases(l);
    cast_colsum_cases(l);
    bcast_scale_cases(l);
    layernorm_cases(l);
    activation_cases(l);
    attention_cases(l);
    dwconv_cases(l);
    conv2d_cases(l);
    patch_embed_cases(l);
    linear_cases(l);
    token_cases(l);
    loss_cases(l);
    optim_cases(l);
    scan_cases(l);
    reduction_cases(l);
    conv2d_stem2_cases(l);
    dwconv_stage_cases(l);
    dwconv_silu_proj_cases(l);
    conv2d_stem2_wide_cases(l);
    dwconv_silu_proj_odd_cases(l);
    scan_proj_cases(l);
    dwconv_bwd_one_pass_cases(l);
    dwconv_lpu_tile_cases(l);
    dwconv_no_bias_cases(l);
    dwconv_silu_proj_image7_cases(l);
    dwconv_layernorm_cases(l);
}

void op_cases_free(OpCaseList *l) {
    free(l->cases);
    memset(l, 0, sizeof *l);
}

int op_case_arg(const OpCase *c, const char *name) {
    for (int i = 0; i < c->nargs; i++)
        if (c->arg[i].role != ARG_ABSENT && c->arg[i].name && strcmp(c->arg[i].name, name) == 0)
            return i;
    return -1;
}

int op_cases_cover(const OpCaseList *l, const char *op) {
    for (int k = 0; k < l->n; k++)
        for (int j = 0; j < OPC_MAX_OPS; j++)
            if (l->cases[k].ops[j] && strcmp(l->cases[k].ops[j], op) == 0) return 1;
    return 0;
}
