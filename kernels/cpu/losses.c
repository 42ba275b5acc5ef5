// CPU reference: losses (kernels/ops.h, docs/design.md#losses). Each loss is a 1-element fp32 tensor,
// written (not accumulated) by the forward; dloss is a 1-element tensor too. Sums run in
// double: every row (or block of elements) gets its own partial, computed in parallel, and the
// partials are added in index order, so the loss does not depend on the thread count.
#include <math.h>
#include "../ops.h"
#include "../error.h"
#include "../losses_shape.h"

// Elements per partial sum of the MSE.
#define MSE_BLOCK 4096

// Partials summed in index order.
static double sum_in_order(const double *part, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += part[i];
    return s;
}

// log(sum_c exp(x_c)) of one row, shifted by its max.
static double row_logsumexp(const float *x, size_t C) {
    double m = -INFINITY, s = 0;
    for (size_t c = 0; c < C; c++) m = fmax(m, (double)x[c]);
    for (size_t c = 0; c < C; c++) s += exp((double)x[c] - m);
    return m + log(s);
}

// ---- cross-entropy with soft targets ----------------------------------------------------------
// logits, targets (B,K) -> loss = mean_b sum_k -t[b,k] log softmax(logits[b])_k; probs (B,K).
void cpu_cross_entropy_fwd(Ctx *ctx, const Tensor *logits, const Tensor *targets, Tensor *loss,
                           Tensor *probs) {
    size_t K, B = cross_entropy_dims("cross_entropy_fwd", logits, targets, probs, loss, &K);
    const float *x = tensor_f32(logits), *t = tensor_f32(targets);
    float *p = tensor_f32(probs);
    double *row_loss = cg_malloc(B * sizeof(double));
    #pragma omp parallel for
    for (size_t b = 0; b < B; b++) {
        const float *xb = x + b * K, *tb = t + b * K;
        double lse = row_logsumexp(xb, K), l = 0;
        for (size_t k = 0; k < K; k++) {
            double logp = (double)xb[k] - lse;   // log softmax, finite even where p underflows
            p[b * K + k] = (float)exp(logp);
            l -= (double)tb[k] * logp;
        }
        row_loss[b] = l;
    }
    tensor_f32(loss)[0] = (float)(sum_in_order(row_loss, B) / (double)B);
    free(row_loss);
}

// dlogits += dloss * (probs - targets) / B   (the exact gradient when target rows sum to 1)
void cpu_cross_entropy_bwd(Ctx *ctx, const Tensor *dloss, const Tensor *probs,
                           const Tensor *targets, Tensor *dlogits) {
    if (!dlogits) return;
    size_t B = cross_entropy_bwd_dims("cross_entropy_bwd", dloss, probs, targets, dlogits);
    float g = tensor_f32(dloss)[0] / (float)B;
    const float *p = tensor_f32(probs), *t = tensor_f32(targets);
    float *dx = tensor_f32(dlogits);
    #pragma omp parallel for
    for (size_t i = 0; i < dlogits->numel; i++) dx[i] += g * (p[i] - t[i]);
}

// ---- mean squared error -------------------------------------------------------------------
// loss = mean over all n elements of (a - b)^2
void cpu_mse_fwd(Ctx *ctx, const Tensor *a, const Tensor *b, Tensor *loss) {
    size_t n = mse_dims("mse_fwd", a, b, NULL, NULL);
    loss_check_scalar("mse_fwd", "loss", loss);
    const float *pa = tensor_f32(a), *pb = tensor_f32(b);
    size_t blocks = (n + MSE_BLOCK - 1) / MSE_BLOCK;
    double *part = cg_malloc(blocks * sizeof(double));
    #pragma omp parallel for
    for (size_t blk = 0; blk < blocks; blk++) {
        size_t end = (blk + 1) * MSE_BLOCK < n ? (blk + 1) * MSE_BLOCK : n;
        double s = 0;
        for (size_t i = blk * MSE_BLOCK; i < end; i++) {
            double d = (double)pa[i] - pb[i];
            s += d * d;
        }
        part[blk] = s;
    }
    tensor_f32(loss)[0] = (float)(sum_in_order(part, blocks) / (double)n);
    free(part);
}

// da += dloss * 2 (a - b) / n; db -= the same
void cpu_mse_bwd(Ctx *ctx, const Tensor *dloss, const Tensor *a, const Tensor *b, Tensor *da,
                 Tensor *db) {
    loss_check_scalar("mse_bwd", "dloss", dloss);
    size_t n = mse_dims("mse_bwd", a, b, da, db);
    float g = 2.0f * tensor_f32(dloss)[0] / (float)n;
    const float *pa = tensor_f32(a), *pb = tensor_f32(b);
    float *pda = da ? tensor_f32(da) : NULL, *pdb = db ? tensor_f32(db) : NULL;
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        float d = g * (pa[i] - pb[i]);
        if (pda) pda[i] += d;
        if (pdb) pdb[i] -= d;
    }
}

// ---- token-wise softmax KL ------------------------------------------------------------------
// s, t (N,C): ps = softmax(s_n), pt = softmax(t_n) over C; loss = mean_n sum_c ps (log ps - log pt)
void cpu_token_kl_fwd(Ctx *ctx, const Tensor *s, const Tensor *t, Tensor *loss) {
    size_t C, N = token_kl_dims("token_kl_fwd", s, t, NULL, NULL, &C);
    loss_check_scalar("token_kl_fwd", "loss", loss);
    const float *ps = tensor_f32(s), *pt = tensor_f32(t);
    double *row_kl = cg_malloc(N * sizeof(double));
    #pragma omp parallel for
    for (size_t n = 0; n < N; n++) {
        const float *sn = ps + n * C, *tn = pt + n * C;
        double lse_s = row_logsumexp(sn, C), lse_t = row_logsumexp(tn, C), kl = 0;
        for (size_t c = 0; c < C; c++) {
            double ls = sn[c] - lse_s, lt = tn[c] - lse_t;
            kl += exp(ls) * (ls - lt);
        }
        row_kl[n] = kl;
    }
    tensor_f32(loss)[0] = (float)(sum_in_order(row_kl, N) / (double)N);
    free(row_kl);
}

// With g = dloss / N and KL_n the token's divergence (recomputed here):
//   ds[n,c] += g * ps_c * ((log ps_c - log pt_c) - KL_n)
//   dt[n,c] += g * (pt_c - ps_c)
void cpu_token_kl_bwd(Ctx *ctx, const Tensor *dloss, const Tensor *s, const Tensor *t,
                      Tensor *ds, Tensor *dt) {
    if (!ds && !dt) return;
    loss_check_scalar("token_kl_bwd", "dloss", dloss);
    size_t C, N = token_kl_dims("token_kl_bwd", s, t, ds, dt, &C);
    double g = (double)tensor_f32(dloss)[0] / (double)N;
    const float *ps = tensor_f32(s), *pt = tensor_f32(t);
    float *pds = ds ? tensor_f32(ds) : NULL, *pdt = dt ? tensor_f32(dt) : NULL;
    #pragma omp parallel for
    for (size_t n = 0; n < N; n++) {
        const float *sn = ps + n * C, *tn = pt + n * C;
        double lse_s = row_logsumexp(sn, C), lse_t = row_logsumexp(tn, C), kl = 0;
        for (size_t c = 0; c < C; c++) {
            double ls = sn[c] - lse_s, lt = tn[c] - lse_t;
            kl += exp(ls) * (ls - lt);
        }
        for (size_t c = 0; c < C; c++) {
            double ls = sn[c] - lse_s, lt = tn[c] - lse_t;
            double p_s = exp(ls), p_t = exp(lt);
            if (pds) pds[n * C + c] += (float)(g * p_s * ((ls - lt) - kl));
            if (pdt) pdt[n * C + c] += (float)(g * (p_t - p_s));
        }
    }
}
