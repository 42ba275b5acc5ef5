// CPU reference: multi-head scaled dot-product attention, no mask (kernels/ops.h).
//   qkv (B,N,3C): each token's row is q | k | v, each (heads, D), D = C / heads.
//   per batch b and head h:  S = scale Q K^T (N,N),  P = softmax_rows(S),  O = P V (N,D)
//   out (B,N,C) holds head h at channels h*D..; lse (B,heads,N) = log sum_j exp(S_ij).
// Q, K, V and O are read and written in place as strided matrices (row stride 3C or C), so no
// head is copied out. Query rows go in blocks of ATTN_QB: scratch is ATTN_QB x N per thread.
//
// Backward (flash-attention style), from q, k, v, out, lse and dO:
//   P = exp(S - lse);  dV = P^T dO;  dP = dO V^T;  D_i = sum_d dO_id O_id (= sum_j P_ij dP_ij)
//   dS = P * (dP - D_i);  dQ = scale dS K;  dK = scale dS^T Q
#include "../ops.h"
#include "../attention_shape.h"
#include "cpu_check.h"
#include "gemm.h"
#include <math.h>
#include <omp.h>

enum { ATTN_QB = 64 };   // query rows per block

static AttnShape attn_shape(const char *op, const Tensor *qkv, int heads, const Tensor *out,
                            const Tensor *lse) {
    AttnShape s = attention_shape(op, qkv, heads);
    cpu_check_f32(op, "qkv", qkv);
    cpu_check_matrix(op, "out", out, (size_t)s.B * s.N, s.C);
    cpu_check_numel(op, "lse", lse, (size_t)s.B * s.H * s.N);
    return s;
}

// Row softmax of S (rows x N) in place, returning each row's log-sum-exp in lse_rows.
static void attn_softmax_rows(float *S, int rows, int N, float *lse_rows) {
    for (int i = 0; i < rows; i++) {
        float *sr = S + (size_t)i * N;
        float mx = -INFINITY;
        for (int j = 0; j < N; j++) mx = sr[j] > mx ? sr[j] : mx;   // (fmaxf is a libm call)
        double sum = 0;
        for (int j = 0; j < N; j++) {
            sr[j] = expf(sr[j] - mx);
            sum += sr[j];
        }
        float inv = (float)(1.0 / sum);
        for (int j = 0; j < N; j++) sr[j] *= inv;
        lse_rows[i] = mx + (float)log(sum);
    }
}

// One (batch, head, query block): rows i0..i0+qb-1 of out and lse. S is qb x N scratch.
static void attn_fwd_block(const AttnShape *s, const float *qkv, float *out, float *lse, int b,
                           int h, int i0, int qb, float *S) {
    int ld = 3 * s->C;
    const float *Q = qkv + (size_t)b * s->N * ld + h * s->D;   // row stride 3C
    const float *K = Q + s->C, *V = Q + 2 * s->C;
    cpu_sgemm(0, 1, qb, s->N, s->D, s->scale, Q + (size_t)i0 * ld, ld, K, ld, 0.0f, S, s->N);
    attn_softmax_rows(S, qb, s->N, lse + ((size_t)b * s->H + h) * s->N + i0);
    float *O = out + ((size_t)b * s->N + i0) * s->C + h * s->D;   // row stride C
    cpu_sgemm(0, 0, qb, s->D, s->N, 1.0f, S, s->N, V, ld, 0.0f, O, s->C);
}

void cpu_attention_fwd(Ctx *ctx, const Tensor *qkv, int heads, Tensor *out, Tensor *lse) {
    AttnShape s = attn_shape("attention_fwd", qkv, heads, out, lse);
    if (s.B == 0 || s.N == 0) return;
    int qblocks = (s.N + ATTN_QB - 1) / ATTN_QB;
    int tasks = s.B * s.H * qblocks;
    // Many tasks: one per thread at a time, each sgemm single-threaded. Few: one after the
    // other, each sgemm using all threads.
    int outer = tasks >= omp_get_max_threads();
    int nthreads = outer ? omp_get_max_threads() : 1;
    size_t scratch = (size_t)ATTN_QB * s.N;
    float *S_all = cg_malloc(sizeof(float) * scratch * nthreads);
    const float *pqkv = tensor_f32(qkv);
    float *pout = tensor_f32(out), *plse = tensor_f32(lse);
    #pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads) if (outer)
    for (int t = 0; t < tasks; t++) {
        int qbi = t % qblocks, h = (t / qblocks) % s.H, b = t / (qblocks * s.H);
        int i0 = qbi * ATTN_QB, qb = s.N - i0 < ATTN_QB ? s.N - i0 : ATTN_QB;
        attn_fwd_block(&s, pqkv, pout, plse, b, h, i0, qb, S_all + scratch * omp_get_thread_num());
    }
    free(S_all);
}

// One (batch, head): accumulates its dq, dk, dv over the query blocks in order.
// P and dS are ATTN_QB x N scratch, Di ATTN_QB.
static void attn_bwd_head(const AttnShape *s, const float *dout, const float *qkv,
                          const float *out, const float *lse, float *dqkv, int b, int h,
                          float *P, float *dS, float *Di) {
    int ld = 3 * s->C, N = s->N, D = s->D;
    size_t qkv_off = (size_t)b * N * ld + h * D, o_off = (size_t)b * N * s->C + h * D;
    const float *Q = qkv + qkv_off, *K = Q + s->C, *V = Q + 2 * s->C;
    float *dQ = dqkv + qkv_off, *dK = dQ + s->C, *dV = dQ + 2 * s->C;
    const float *lse_bh = lse + ((size_t)b * s->H + h) * N;
    for (int i0 = 0; i0 < N; i0 += ATTN_QB) {
        int qb = N - i0 < ATTN_QB ? N - i0 : ATTN_QB;
        const float *Qi = Q + (size_t)i0 * ld;
        const float *dOi = dout + o_off + (size_t)i0 * s->C, *Oi = out + o_off + (size_t)i0 * s->C;
        // P = exp(scale Q K^T - lse)
        cpu_sgemm(0, 1, qb, N, D, s->scale, Qi, ld, K, ld, 0.0f, P, N);
        for (int i = 0; i < qb; i++)
            for (int j = 0; j < N; j++) P[(size_t)i * N + j] = expf(P[(size_t)i * N + j] - lse_bh[i0 + i]);
        // dV += P^T dO
        cpu_sgemm(1, 0, N, D, qb, 1.0f, P, N, dOi, s->C, 1.0f, dV, ld);
        // dP = dO V^T, then dS = P * (dP - D_i)
        cpu_sgemm(0, 1, qb, N, D, 1.0f, dOi, s->C, V, ld, 0.0f, dS, N);
        for (int i = 0; i < qb; i++) {
            double di = 0;
            for (int d = 0; d < D; d++) di += (double)dOi[(size_t)i * s->C + d] * Oi[(size_t)i * s->C + d];
            Di[i] = (float)di;
        }
        for (int i = 0; i < qb; i++)
            for (int j = 0; j < N; j++) {
                size_t ij = (size_t)i * N + j;
                dS[ij] = P[ij] * (dS[ij] - Di[i]);
            }
        // dQ += scale dS K;  dK += scale dS^T Q
        cpu_sgemm(0, 0, qb, D, N, s->scale, dS, N, K, ld, 1.0f, dQ + (size_t)i0 * ld, ld);
        cpu_sgemm(1, 0, N, D, qb, s->scale, dS, N, Qi, ld, 1.0f, dK, ld);
    }
}

// ATTENTION_WRITE_DQKV: the reference writes by zeroing dqkv, then adding.
void cpu_attention_bwd(Ctx *ctx, const Tensor *dout, const Tensor *qkv, const Tensor *out,
                       const Tensor *lse, int heads, int flags, Tensor *dqkv) {
    if (!dqkv) return;
    AttnShape s = attn_shape("attention_bwd", qkv, heads, out, lse);
    cpu_check_same("attention_bwd", "dout", dout, "out", out);
    cpu_check_same("attention_bwd", "dqkv", dqkv, "qkv", qkv);
    if (flags & ATTENTION_WRITE_DQKV) memset(dqkv->data, 0, tensor_bytes(dqkv));
    if (s.B == 0 || s.N == 0) return;
    // One task per (batch, head): dk and dv sum over all query blocks, so a head is never split.
    int tasks = s.B * s.H;
    int outer = tasks >= omp_get_max_threads();
    int nthreads = outer ? omp_get_max_threads() : 1;
    size_t per_thread = 2 * (size_t)ATTN_QB * s.N + ATTN_QB;
    float *scratch = cg_malloc(sizeof(float) * per_thread * nthreads);
    const float *pdout = tensor_f32(dout), *pqkv = tensor_f32(qkv), *pout = tensor_f32(out);
    const float *plse = tensor_f32(lse);
    float *pdqkv = tensor_f32(dqkv);
    #pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads) if (outer)
    for (int t = 0; t < tasks; t++) {
        float *P = scratch + per_thread * omp_get_thread_num();
        float *dS = P + (size_t)ATTN_QB * s.N, *Di = dS + (size_t)ATTN_QB * s.N;
        attn_bwd_head(&s, pdout, pqkv, pout, plse, pdqkv, t / s.H, t % s.H, P, dS, Di);
    }
    free(scratch);
}

// Attention pooling with one query per head (kernels/ops.h attention_pool_fwd): per (b, h) the
// scores of the N keys, their softmax, the weighted sum of the values.
void cpu_attention_pool_fwd(Ctx *ctx, const Tensor *q, const Tensor *kv, int heads, Tensor *out) {
    (void)ctx;
    const char *op = "attention_pool_fwd";
    cpu_check_f32(op, "q", q);
    cpu_check_f32(op, "kv", kv);
    cpu_check_f32(op, "out", out);
    int C = (int)q->numel, B = kv->shape[0];
    CG_CHECK(heads > 0 && C % heads == 0 && kv->ndim == 3 && kv->shape[2] == 2 * C &&
             out->numel == (size_t)B * C, "", "op %s: q of %d, kv (%d, %d, %d), out of %zu, %d heads",
             op, C, kv->shape[0], kv->ndim == 3 ? kv->shape[1] : -1, tensor_last(kv), out->numel, heads);
    int N = kv->shape[1], D = C / heads;
    float scale = 1.0f / sqrtf((float)D);
    #pragma omp parallel for schedule(static)
    for (int bh = 0; bh < B * heads; bh++) {
        int b = bh / heads, h = bh % heads;
        const float *qh = tensor_f32(q) + h * D, *kvb = tensor_f32(kv) + (size_t)b * N * 2 * C;
        float *S = cg_malloc((size_t)N * sizeof(float)), lse;
        for (int n = 0; n < N; n++) {
            const float *k = kvb + (size_t)n * 2 * C + h * D;
            float s = 0;
            for (int d = 0; d < D; d++) s += qh[d] * k[d];
            S[n] = scale * s;
        }
        attn_softmax_rows(S, 1, N, &lse);
        float *o = tensor_f32(out) + (size_t)b * C + h * D;
        for (int d = 0; d < D; d++) o[d] = 0;
        for (int n = 0; n < N; n++) {
            const float *v = kvb + (size_t)n * 2 * C + C + h * D;
            for (int d = 0; d < D; d++) o[d] += S[n] * v[d];
        }
        free(S);
    }
}
