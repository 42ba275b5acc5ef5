// The shapes of the token layout ops (kernels/ops_list.h: concat_prefix, slice_tokens,
// mean_tokens) and their refusals, shared by the CPU and CUDA ops. A token tensor is (B, N, C):
// B = shape[0], C = the last dim, N = the rest, so a (B, H, W, C) grid counts as N = H*W tokens.
// A backend adds its own device and dtype rules.
#pragma once
#include "tensor.h"
#include "error.h"

typedef struct { size_t B, N, C; } TokenDims;

static inline TokenDims token_dims(const char *op, const char *name, const Tensor *t) {
    CG_CHECK(t->ndim >= 2, "", "op %s: %s has rank %d, expected (B, N, C)", op, name, t->ndim);
    TokenDims d = {(size_t)t->shape[0], 0, (size_t)tensor_last(t)};
    d.N = d.B > 0 && d.C > 0 ? t->numel / (d.B * d.C) : 0;
    return d;
}

// concat_prefix_fwd: prefix (P, C), x (B, N, C) -> y (B, P+N, C). Returns P.
static inline size_t concat_prefix_dims(const char *op, const Tensor *prefix, const Tensor *x,
                                        const Tensor *y, TokenDims *dx, TokenDims *dy) {
    *dx = token_dims(op, "x", x);
    *dy = token_dims(op, "y", y);
    size_t P = tensor_rows(prefix), C = dx->C;
    CG_CHECK(dy->B == dx->B && dy->C == C && (size_t)tensor_last(prefix) == C && dy->N == P + dx->N,
             "", "op %s: prefix %zu x %d, x %zu x %zu x %zu, y %zu x %zu x %zu", op, P,
             tensor_last(prefix), dx->B, dx->N, dx->C, dy->B, dy->N, dy->C);
    return P;
}

// concat_prefix_bwd: dy (B, P+N, C); dprefix (P, C) and dx (B, N, C), either NULL. P comes from
// dprefix, else from dx. Returns P (0 when both are NULL).
static inline size_t concat_prefix_bwd_dims(const char *op, const Tensor *dy, const Tensor *dprefix,
                                            const Tensor *dx, TokenDims *d) {
    *d = token_dims(op, "dy", dy);
    if (!dprefix && !dx) return 0;
    const size_t P = dprefix ? tensor_rows(dprefix) : d->N - token_dims(op, "dx", dx).N;
    CG_CHECK(P <= d->N, "", "op %s: %zu prefix tokens of %zu", op, P, d->N);
    if (dprefix)
        CG_CHECK((size_t)tensor_last(dprefix) == d->C, "", "op %s: dprefix has last dim %d, dy %zu",
                 op, tensor_last(dprefix), d->C);
    if (dx) {
        TokenDims dX = token_dims(op, "dx", dx);
        CG_CHECK(dX.B == d->B && dX.N == d->N - P && dX.C == d->C, "",
                 "op %s: dx %zu x %zu x %zu, dy %zu x %zu x %zu with %zu prefix tokens", op, dX.B,
                 dX.N, dX.C, d->B, d->N, d->C, P);
    }
    return P;
}

// slice_tokens: part (B, count, C) = whole (B, N, C)[:, start:start+count].
static inline void slice_tokens_dims(const char *op, const char *whole_name, const Tensor *whole,
                                     const char *part_name, const Tensor *part, int start,
                                     TokenDims *dw, TokenDims *dp) {
    *dw = token_dims(op, whole_name, whole);
    *dp = token_dims(op, part_name, part);
    CG_CHECK(dw->B == dp->B && dw->C == dp->C && start >= 0 && (size_t)start + dp->N <= dw->N, "",
             "op %s: tokens %d..%zu of %zu (%s %zu x %zu x %zu, %s %zu x %zu x %zu)", op, start,
             (size_t)start + dp->N, dw->N, whole_name, dw->B, dw->N, dw->C, part_name, dp->B, dp->N,
             dp->C);
}

// mean_tokens: tokens (B, N, C), N > 0, and their mean (B, C).
static inline TokenDims mean_tokens_dims(const char *op, const char *tokens_name, const Tensor *tokens,
                                         const char *mean_name, const Tensor *mean) {
    TokenDims d = token_dims(op, tokens_name, tokens);
    CG_CHECK(mean->numel == d.B * d.C && d.N > 0, "", "op %s: %s %zu x %zu x %zu, %s has %zu "
             "elements", op, tokens_name, d.B, d.N, d.C, mean_name, mean->numel);
    return d;
}
