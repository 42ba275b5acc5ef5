// CPU reference: linear layer y = x w^T + b (kernels/ops.h), on cpu_sgemm.
// x (N,K) is any tensor with last dim K (rows N = numel / K); w (M,K) is PyTorch's (out, in).
#include "../ops.h"
#include "cpu_check.h"
#include "gemm.h"
#include "../linear_shape.h"

// Columns per bias-gradient chunk (one cache line of a row): each chunk is one thread's and
// sums its rows in order, so db does not depend on the thread count.
enum { LINEAR_DB_CHUNK = 16 };

// db (M) += column sums of dy (N,M), each over rows 0..N-1 in order, in double.
static void colsum_add(const float *dy, size_t N, int M, float *db) {
    int chunks = (M + LINEAR_DB_CHUNK - 1) / LINEAR_DB_CHUNK;
    #pragma omp parallel for schedule(static)
    for (int ch = 0; ch < chunks; ch++) {
        int m0 = ch * LINEAR_DB_CHUNK;
        int m1 = m0 + LINEAR_DB_CHUNK < M ? m0 + LINEAR_DB_CHUNK : M;
        double sum[LINEAR_DB_CHUNK] = {0};
        for (size_t n = 0; n < N; n++)
            for (int m = m0; m < m1; m++) sum[m - m0] += dy[n * M + m];
        for (int m = m0; m < m1; m++) db[m] += (float)sum[m - m0];
    }
}

// x (N,K), w (M,K), b (M) or NULL -> y (N,M) = x w^T + b
static void plain_fwd(const Tensor *x, const Tensor *w, const Tensor *b, Tensor *y) {
    cpu_check_f32("linear_fwd", "w", w);
    cpu_check_f32("linear_fwd", "x", x);
    const LinearDims ld = linear_dims("linear_fwd", x, w);
    const size_t N = ld.N;
    const int M = ld.M, K = ld.K;
    cpu_check_matrix("linear_fwd", "y", y, N, M);
    if (b) cpu_check_numel("linear_fwd", "b", b, (size_t)M);

    const float *px = tensor_f32(x), *pw = tensor_f32(w);
    float *py = tensor_f32(y);
    if (b) {   // y = b in every row, then y += x w^T
        const float *pb = tensor_f32(b);
        #pragma omp parallel for schedule(static)
        for (size_t n = 0; n < N; n++) memcpy(py + n * M, pb, (size_t)M * sizeof(float));
    }
    cpu_sgemm(0, 1, (int)N, M, K, 1.0f, px, K, pw, K, b ? 1.0f : 0.0f, py, M);
}

// y = res + (x w^T + b), in the unfused ops' order (the same numbers as the linear, then add_fwd).
static void res_fwd(const Tensor *x, const Tensor *w, const Tensor *b, const Tensor *res,
                    Tensor *y) {
    cpu_check_f32("linear_fwd", "res", res);
    cpu_check_f32("linear_fwd", "y", y);
    CG_CHECK(res->numel == y->numel && res->data != y->data, "",
             "op linear_fwd: res (%zu elements) must match y (%zu) and not alias it",
             res->numel, y->numel);
    plain_fwd(x, w, b, y);
    const float *pr = tensor_f32(res);
    float *py = tensor_f32(y);
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < y->numel; i++) py[i] = pr[i] + py[i];
}

// dx (N,K) += dy w (= with LINEAR_WRITE_DX: the reference writes by zeroing, then adding); dw
// (M,K) += dy^T x; db (M) += sum_n dy
static void plain_bwd(const Tensor *dy, const Tensor *x, const Tensor *w, int flags, Tensor *dx,
                      Tensor *dw, Tensor *db) {
    cpu_check_f32("linear_bwd", "w", w);
    cpu_check_f32("linear_bwd", "x", x);
    const LinearDims ld = linear_dims("linear_bwd", x, w);
    const size_t N = ld.N;
    const int M = ld.M, K = ld.K;
    cpu_check_matrix("linear_bwd", "dy", dy, N, M);
    const float *pdy = tensor_f32(dy), *px = tensor_f32(x), *pw = tensor_f32(w);

    if (dx) {   // (N,M) . (M,K)
        cpu_check_same("linear_bwd", "dx", dx, "x", x);
        const float beta = flags & LINEAR_WRITE_DX ? 0.0f : 1.0f;
        cpu_sgemm(0, 0, (int)N, K, M, 1.0f, pdy, M, pw, K, beta, tensor_f32(dx), K);
    }
    if (dw) {   // (M,N) . (N,K), dy read transposed
        cpu_check_same("linear_bwd", "dw", dw, "w", w);
        cpu_sgemm(1, 0, M, K, (int)N, 1.0f, pdy, M, px, K, 1.0f, tensor_f32(dw), K);
    }
    if (db) {
        cpu_check_numel("linear_bwd", "db", db, (size_t)M);
        colsum_add(pdy, N, M, tensor_f32(db));
    }
}

// A zeroed CPU fp32 scratch tensor of ref's shape; free its data with free().
static Tensor linear_scratch_like(const Tensor *ref) {
    Tensor t = tensor_view(ref, ref->ndim, ref->shape);
    t.data = cg_calloc(ref->numel ? ref->numel : 1, sizeof(float));
    t.grad = NULL;
    return t;
}

// y = silu(x) w^T + b
static void silu_in_fwd(Ctx *ctx, const Tensor *x, const Tensor *w, const Tensor *b, Tensor *y) {
    Tensor s = linear_scratch_like(x);
    cpu_silu_fwd(ctx, x, &s);
    plain_fwd(&s, w, b, y);
    free(s.data);
}

// dx = (dy w) * silu'(x) (written); dw += dy^T silu(x); db += sum_n dy.
static void silu_in_bwd(Ctx *ctx, const Tensor *dy, const Tensor *x, const Tensor *w, Tensor *dx,
                        Tensor *dw, Tensor *db) {
    if (!dx && !dw && !db) return;
    Tensor s = linear_scratch_like(x), g = linear_scratch_like(x);
    cpu_silu_fwd(ctx, x, &s);
    plain_bwd(dy, &s, w, 0, dx ? &g : NULL, dw, db);
    if (dx) {
        cpu_check_same("linear_bwd", "dx", dx, "x", x);
        memset(dx->data, 0, dx->numel * sizeof(float));
        cpu_silu_bwd(ctx, &g, x, dx);
    }
    free(s.data);
    free(g.data);
}

// pre = x w^T + b; y = gelu(pre)   (pre NULL: computed in y, then GELU in place)
static void gelu_out_fwd(Ctx *ctx, const Tensor *x, const Tensor *w, const Tensor *b,
                         GeluKind kind, Tensor *pre, Tensor *y) {
    Tensor *p = pre ? pre : y;
    if (pre) cpu_check_same("linear_fwd", "pre", pre, "y", y);
    plain_fwd(x, w, b, p);
    cpu_gelu_fwd(ctx, p, kind, y);
}

// dpre = dy * gelu'(pre); then linear's backward from dpre.
static void gelu_out_bwd(Ctx *ctx, const Tensor *dy, const Tensor *x, const Tensor *w,
                         const Tensor *pre, GeluKind kind, int flags, Tensor *dx, Tensor *dw,
                         Tensor *db) {
    if (!dx && !dw && !db) return;
    CG_CHECK(pre != NULL, "", "op linear_bwd: gelu_out needs pre, the GELU's input");
    cpu_check_same("linear_bwd", "pre", pre, "dy", dy);
    Tensor dpre = linear_scratch_like(dy);
    cpu_gelu_bwd(ctx, dy, pre, kind, &dpre);
    plain_bwd(&dpre, x, w, flags, dx, dw, db);
    free(dpre.data);
}

// dpre = (dy w) * gelu'(pre) (written); dpre_db += sum_n dpre; dw += dy^T h; db += sum_n dy.
static void gelu_in_bwd(Ctx *ctx, const Tensor *dy, const Tensor *h, const Tensor *w,
                        const Tensor *pre, GeluKind kind, Tensor *dpre, Tensor *dpre_db,
                        Tensor *dw, Tensor *db) {
    CG_CHECK(!dpre_db || dpre, "", "op linear_bwd: gelu_in's dpre_db needs dx");
    if (dpre) {
        CG_CHECK(pre != NULL, "", "op linear_bwd: gelu_in needs pre, the GELU's input");
        cpu_check_same("linear_bwd", "pre", pre, "x", h);
        cpu_check_same("linear_bwd", "dx", dpre, "x", h);
        Tensor dh = linear_scratch_like(h);
        plain_bwd(dy, h, w, 0, &dh, NULL, NULL);
        memset(dpre->data, 0, dpre->numel * sizeof(float));
        cpu_gelu_bwd(ctx, &dh, pre, kind, dpre);
        free(dh.data);
        if (dpre_db) {
            cpu_check_numel("linear_bwd", "dpre_db", dpre_db, (size_t)tensor_last(dpre));
            colsum_add(tensor_f32(dpre), tensor_rows(dpre), tensor_last(dpre), tensor_f32(dpre_db));
        }
    }
    if (dw || db) plain_bwd(dy, h, w, 0, NULL, dw, db);
}

void cpu_linear_fwd(Ctx *ctx, const Tensor *x, const Tensor *w, const Tensor *b,
                    const LinearFwdOpts *opts, Tensor *y) {
    switch (linear_fwd_fusion(opts)) {
    case LINEAR_SILU_IN: silu_in_fwd(ctx, x, w, b, y); break;
    case LINEAR_GELU_OUT: gelu_out_fwd(ctx, x, w, b, opts->gelu_kind, opts->pre, y); break;
    case LINEAR_RES: res_fwd(x, w, b, opts->res, y); break;
    default: plain_fwd(x, w, b, y); break;
    }
}

void cpu_linear_bwd(Ctx *ctx, const Tensor *dy, const Tensor *x, const Tensor *w, int flags,
                    const LinearBwdOpts *opts, Tensor *dx, Tensor *dw, Tensor *db) {
    switch (linear_bwd_fusion(opts)) {
    case LINEAR_SILU_IN: silu_in_bwd(ctx, dy, x, w, dx, dw, db); break;
    case LINEAR_GELU_OUT:
        gelu_out_bwd(ctx, dy, x, w, opts->pre, opts->gelu_kind, flags, dx, dw, db);
        break;
    case LINEAR_GELU_IN:
        gelu_in_bwd(ctx, dy, x, w, opts->pre, opts->gelu_kind, dx, opts->dpre_db, dw, db);
        break;
    default: plain_bwd(dy, x, w, flags, dx, dw, db); break;
    }
}

// The LayerNorm (with norm) and the two linears, each output in a buffer of its own.
void cpu_mlp_residual_fwd(Ctx *ctx, const Tensor *x, const MlpInputNorm *norm, const Tensor *w1,
                          const Tensor *b1, const Tensor *w2, const Tensor *b2, GeluKind kind,
                          const Tensor *res, Tensor *y) {
    const char *op = "mlp_residual_fwd";
    CG_CHECK(!norm == !!x, "", "op %s: x and norm go one without the other (norm: x is layernorm(res))", op);
    Tensor xn;   // layernorm(res) (N, C)
    if (norm) {
        xn = *res;
        xn.data = cg_calloc(xn.numel ? xn.numel : 1, sizeof(float));
        xn.grad = NULL;
        cpu_layernorm_fwd(ctx, res, NULL, norm->w, norm->b, norm->eps, NULL, &xn, NULL, NULL);
        x = &xn;
    }
    const LinearDims ld = linear_dims(op, x, w1);
    Tensor h = *x;   // (N, Hd)
    tensor_set_shape(&h, 2, (int[]){(int)ld.N, ld.M});
    h.data = cg_calloc(h.numel ? h.numel : 1, sizeof(float));
    h.grad = NULL;
    gelu_out_fwd(ctx, x, w1, b1, kind, NULL, &h);
    res_fwd(&h, w2, b2, res, y);
    free(h.data);
    if (norm) free(xn.data);
}
