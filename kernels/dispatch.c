// Routes each op_* to the backend of the context's device (kernels/ops.h has the contracts).
#include "ops.h"
#include "error.h"

#ifdef CGSPN_CUDA
// CUDA kernels are weak references: an op whose kernel is not in this build fails by name
// instead of breaking the link.
#define OP_WEAK(name) extern __typeof__(cpu_##name) cuda_##name __attribute__((weak));
OP_WEAK(zero)
OP_WEAK(accumulate)
OP_WEAK(add_fwd)
OP_WEAK(scale_fwd)
OP_WEAK(scale_bwd)
OP_WEAK(cast_colsum)
OP_WEAK(add_bcast_fwd)
OP_WEAK(add_bcast_bwd)
OP_WEAK(layer_scale_fwd)
OP_WEAK(layer_scale_bwd)
OP_WEAK(linear_fwd)
OP_WEAK(linear_bwd)
OP_WEAK(linear_bwd_write)
OP_WEAK(linear_residual_fwd)
OP_WEAK(linear_gelu_fwd)
OP_WEAK(linear_gelu_bwd)
OP_WEAK(linear_dgelu_bwd)
OP_WEAK(layernorm_fwd)
OP_WEAK(layernorm_bwd)
OP_WEAK(add_layernorm_fwd)
OP_WEAK(gelu_fwd)
OP_WEAK(gelu_bwd)
OP_WEAK(silu_fwd)
OP_WEAK(silu_bwd)
OP_WEAK(softmax_fwd)
OP_WEAK(softmax_bwd)
OP_WEAK(attention_fwd)
OP_WEAK(attention_bwd)
OP_WEAK(attention_bwd_write)
OP_WEAK(attention_pool_fwd)
OP_WEAK(dwconv_fwd)
OP_WEAK(im2col_fwd)
OP_WEAK(im2col_bwd)
OP_WEAK(dwconv_bwd)
OP_WEAK(patch_embed_fwd)
OP_WEAK(patch_embed_bwd)
OP_WEAK(concat_prefix_fwd)
OP_WEAK(concat_prefix_bwd)
OP_WEAK(slice_tokens_fwd)
OP_WEAK(slice_tokens_bwd)
OP_WEAK(mean_tokens_fwd)
OP_WEAK(mean_tokens_bwd)
OP_WEAK(resize_bilinear_fwd)
OP_WEAK(resize_bilinear_bwd)
OP_WEAK(cross_entropy_fwd)
OP_WEAK(cross_entropy_bwd)
OP_WEAK(mse_fwd)
OP_WEAK(mse_bwd)
OP_WEAK(token_kl_fwd)
OP_WEAK(token_kl_bwd)
OP_WEAK(sumsq)
OP_WEAK(adamw)
OP_WEAK(drop_path_fwd)
OP_WEAK(drop_path_bwd)
OP_WEAK(ema_update)
OP_WEAK(gspn_scan_fwd)
OP_WEAK(gspn_scan_bwd)
OP_WEAK(gspn_scan_bwd_write)
#define ROUTE(name, ...)                                                      \
    do {                                                                      \
        if (ctx->profile) ctx->profile(ctx, #name, 0);                        \
        if (ctx->device == DEVICE_CUDA) {                                     \
            CG_CHECK(cuda_##name != NULL, "run with device = cpu",            \
                     "op " #name " has no CUDA kernel in this build");        \
            cuda_##name(__VA_ARGS__);                                         \
        } else {                                                              \
            cpu_##name(__VA_ARGS__);                                          \
        }                                                                     \
        if (ctx->profile) ctx->profile(ctx, #name, 1);                        \
    } while (0)
#else
#define ROUTE(name, ...)                                                      \
    do {                                                                      \
        CG_CHECK(ctx->device == DEVICE_CPU, "rebuild with nvcc on PATH",      \
                 "op " #name ": this build has no CUDA backend");             \
        if (ctx->profile) ctx->profile(ctx, #name, 0);                        \
        cpu_##name(__VA_ARGS__);                                              \
        if (ctx->profile) ctx->profile(ctx, #name, 1);                        \
    } while (0)
#endif

void op_zero(Ctx *ctx, Tensor *y) { ROUTE(zero, ctx, y); }
void op_accumulate(Ctx *ctx, const Tensor *src, Tensor *dst) { ROUTE(accumulate, ctx, src, dst); }
void op_add_fwd(Ctx *ctx, const Tensor *a, const Tensor *b, Tensor *y) { ROUTE(add_fwd, ctx, a, b, y); }
void op_scale_fwd(Ctx *ctx, const Tensor *x, float s, Tensor *y) { ROUTE(scale_fwd, ctx, x, s, y); }
void op_scale_bwd(Ctx *ctx, const Tensor *dy, float s, Tensor *dx) { ROUTE(scale_bwd, ctx, dy, s, dx); }
void op_cast_colsum(Ctx *ctx, const Tensor *x, Tensor *y, Tensor *colsum) {
    ROUTE(cast_colsum, ctx, x, y, colsum);
}
void op_add_bcast_fwd(Ctx *ctx, const Tensor *x, const Tensor *p, Tensor *y) {
    ROUTE(add_bcast_fwd, ctx, x, p, y);
}
void op_add_bcast_bwd(Ctx *ctx, const Tensor *dy, Tensor *dx, Tensor *dp) {
    ROUTE(add_bcast_bwd, ctx, dy, dx, dp);
}
void op_layer_scale_fwd(Ctx *ctx, const Tensor *x, const Tensor *g, Tensor *y) {
    ROUTE(layer_scale_fwd, ctx, x, g, y);
}
void op_layer_scale_bwd(Ctx *ctx, const Tensor *dy, const Tensor *x, const Tensor *g,
                        Tensor *dx, Tensor *dg) {
    ROUTE(layer_scale_bwd, ctx, dy, x, g, dx, dg);
}
void op_linear_fwd(Ctx *ctx, const Tensor *x, const Tensor *w, const Tensor *b, Tensor *y) {
    ROUTE(linear_fwd, ctx, x, w, b, y);
}
void op_linear_bwd(Ctx *ctx, const Tensor *dy, const Tensor *x, const Tensor *w,
                   Tensor *dx, Tensor *dw, Tensor *db) {
    ROUTE(linear_bwd, ctx, dy, x, w, dx, dw, db);
}
void op_linear_residual_fwd(Ctx *ctx, const Tensor *x, const Tensor *w, const Tensor *b,
                           const Tensor *res, Tensor *y) {
    ROUTE(linear_residual_fwd, ctx, x, w, b, res, y);
}
void op_linear_bwd_write(Ctx *ctx, const Tensor *dy, const Tensor *x, const Tensor *w,
                         Tensor *dx, Tensor *dw, Tensor *db) {
    ROUTE(linear_bwd_write, ctx, dy, x, w, dx, dw, db);
}
void op_linear_gelu_fwd(Ctx *ctx, const Tensor *x, const Tensor *w, const Tensor *b, GeluKind kind,
                        Tensor *pre, Tensor *y) {
    ROUTE(linear_gelu_fwd, ctx, x, w, b, kind, pre, y);
}
void op_linear_gelu_bwd(Ctx *ctx, const Tensor *dy, const Tensor *x, const Tensor *w,
                        const Tensor *pre, GeluKind kind, Tensor *dx, Tensor *dw, Tensor *db) {
    ROUTE(linear_gelu_bwd, ctx, dy, x, w, pre, kind, dx, dw, db);
}
void op_linear_dgelu_bwd(Ctx *ctx, const Tensor *dy, const Tensor *h, const Tensor *w,
                         const Tensor *pre, GeluKind kind, Tensor *dpre, Tensor *dpre_db,
                         Tensor *dw, Tensor *db) {
    ROUTE(linear_dgelu_bwd, ctx, dy, h, w, pre, kind, dpre, dpre_db, dw, db);
}
void op_layernorm_fwd(Ctx *ctx, const Tensor *x, const Tensor *w, const Tensor *b, float eps,
                      Tensor *y, Tensor *mean, Tensor *rstd) {
    ROUTE(layernorm_fwd, ctx, x, w, b, eps, y, mean, rstd);
}
void op_layernorm_bwd(Ctx *ctx, const Tensor *dy, const Tensor *x, const Tensor *w,
                      const Tensor *mean, const Tensor *rstd, Tensor *dx, Tensor *dw, Tensor *db,
                      Tensor *dx_act, Tensor *dx_sum) {
    ROUTE(layernorm_bwd, ctx, dy, x, w, mean, rstd, dx, dw, db, dx_act, dx_sum);
}
void op_add_layernorm_fwd(Ctx *ctx, const Tensor *x, const Tensor *r, const Tensor *w,
                          const Tensor *b, float eps, Tensor *h, Tensor *y, Tensor *mean,
                          Tensor *rstd) {
    ROUTE(add_layernorm_fwd, ctx, x, r, w, b, eps, h, y, mean, rstd);
}
void op_gelu_fwd(Ctx *ctx, const Tensor *x, GeluKind kind, Tensor *y) { ROUTE(gelu_fwd, ctx, x, kind, y); }
void op_gelu_bwd(Ctx *ctx, const Tensor *dy, const Tensor *x, GeluKind kind, Tensor *dx) {
    ROUTE(gelu_bwd, ctx, dy, x, kind, dx);
}
void op_silu_fwd(Ctx *ctx, const Tensor *x, Tensor *y) { ROUTE(silu_fwd, ctx, x, y); }
void op_silu_bwd(Ctx *ctx, const Tensor *dy, const Tensor *x, Tensor *dx) {
    ROUTE(silu_bwd, ctx, dy, x, dx);
}
void op_softmax_fwd(Ctx *ctx, const Tensor *x, Tensor *y) { ROUTE(softmax_fwd, ctx, x, y); }
void op_softmax_bwd(Ctx *ctx, const Tensor *dy, const Tensor *y, Tensor *dx) {
    ROUTE(softmax_bwd, ctx, dy, y, dx);
}
void op_im2col_fwd(Ctx *ctx, const Tensor *x, int nchw, int k, int stride, int pad, Tensor *cols) {
    ROUTE(im2col_fwd, ctx, x, nchw, k, stride, pad, cols);
}
void op_im2col_bwd(Ctx *ctx, const Tensor *dcols, int nchw, int k, int stride, int pad, Tensor *dx) {
    ROUTE(im2col_bwd, ctx, dcols, nchw, k, stride, pad, dx);
}
void op_dwconv_fwd(Ctx *ctx, const Tensor *x, const Tensor *w, const Tensor *b, int flags,
                   Tensor *y) {
    ROUTE(dwconv_fwd, ctx, x, w, b, flags, y);
}
void op_dwconv_bwd(Ctx *ctx, const Tensor *dy, const Tensor *x, const Tensor *w, int flags,
                   Tensor *dx, Tensor *dw, Tensor *db) {
    ROUTE(dwconv_bwd, ctx, dy, x, w, flags, dx, dw, db);
}
void op_attention_pool_fwd(Ctx *ctx, const Tensor *q, const Tensor *kv, int heads, Tensor *out) {
    ROUTE(attention_pool_fwd, ctx, q, kv, heads, out);
}
void op_attention_fwd(Ctx *ctx, const Tensor *qkv, int heads, Tensor *out, Tensor *lse) {
    ROUTE(attention_fwd, ctx, qkv, heads, out, lse);
}
void op_attention_bwd(Ctx *ctx, const Tensor *dout, const Tensor *qkv, const Tensor *out,
                      const Tensor *lse, int heads, Tensor *dqkv) {
    ROUTE(attention_bwd, ctx, dout, qkv, out, lse, heads, dqkv);
}
void op_attention_bwd_write(Ctx *ctx, const Tensor *dout, const Tensor *qkv, const Tensor *out,
                            const Tensor *lse, int heads, Tensor *dqkv) {
    ROUTE(attention_bwd_write, ctx, dout, qkv, out, lse, heads, dqkv);
}
void op_patch_embed_fwd(Ctx *ctx, const Tensor *img, const Tensor *w, const Tensor *b,
                        int patch, Tensor *cols, Tensor *y) {
    ROUTE(patch_embed_fwd, ctx, img, w, b, patch, cols, y);
}
void op_patch_embed_bwd(Ctx *ctx, const Tensor *dy, const Tensor *cols, const Tensor *w,
                        int patch, Tensor *dimg, Tensor *dw, Tensor *db) {
    ROUTE(patch_embed_bwd, ctx, dy, cols, w, patch, dimg, dw, db);
}
void op_concat_prefix_fwd(Ctx *ctx, const Tensor *prefix, const Tensor *x, Tensor *y) {
    ROUTE(concat_prefix_fwd, ctx, prefix, x, y);
}
void op_concat_prefix_bwd(Ctx *ctx, const Tensor *dy, Tensor *dprefix, Tensor *dx) {
    ROUTE(concat_prefix_bwd, ctx, dy, dprefix, dx);
}
void op_slice_tokens_fwd(Ctx *ctx, const Tensor *x, int start, Tensor *y) {
    ROUTE(slice_tokens_fwd, ctx, x, start, y);
}
void op_slice_tokens_bwd(Ctx *ctx, const Tensor *dy, int start, Tensor *dx) {
    ROUTE(slice_tokens_bwd, ctx, dy, start, dx);
}
void op_mean_tokens_fwd(Ctx *ctx, const Tensor *x, Tensor *y) { ROUTE(mean_tokens_fwd, ctx, x, y); }
void op_mean_tokens_bwd(Ctx *ctx, const Tensor *dy, Tensor *dx) { ROUTE(mean_tokens_bwd, ctx, dy, dx); }
void op_resize_bilinear_fwd(Ctx *ctx, const Tensor *x, Tensor *y) { ROUTE(resize_bilinear_fwd, ctx, x, y); }
void op_resize_bilinear_bwd(Ctx *ctx, const Tensor *dy, Tensor *dx) { ROUTE(resize_bilinear_bwd, ctx, dy, dx); }
void op_cross_entropy_fwd(Ctx *ctx, const Tensor *logits, const Tensor *targets,
                          Tensor *loss, Tensor *probs) {
    ROUTE(cross_entropy_fwd, ctx, logits, targets, loss, probs);
}
void op_cross_entropy_bwd(Ctx *ctx, const Tensor *dloss, const Tensor *probs,
                          const Tensor *targets, Tensor *dlogits) {
    ROUTE(cross_entropy_bwd, ctx, dloss, probs, targets, dlogits);
}
void op_mse_fwd(Ctx *ctx, const Tensor *a, const Tensor *b, Tensor *loss) { ROUTE(mse_fwd, ctx, a, b, loss); }
void op_mse_bwd(Ctx *ctx, const Tensor *dloss, const Tensor *a, const Tensor *b,
                Tensor *da, Tensor *db) {
    ROUTE(mse_bwd, ctx, dloss, a, b, da, db);
}
void op_token_kl_fwd(Ctx *ctx, const Tensor *s, const Tensor *t, Tensor *loss) {
    ROUTE(token_kl_fwd, ctx, s, t, loss);
}
void op_token_kl_bwd(Ctx *ctx, const Tensor *dloss, const Tensor *s, const Tensor *t,
                     Tensor *ds, Tensor *dt) {
    ROUTE(token_kl_bwd, ctx, dloss, s, t, ds, dt);
}
void op_sumsq(Ctx *ctx, const Tensor *x, Tensor *sumsq) { ROUTE(sumsq, ctx, x, sumsq); }
void op_adamw(Ctx *ctx, Tensor *param, Tensor *master, const Tensor *grad, Tensor *m, Tensor *v,
              const AdamWArgs *args) {
    ROUTE(adamw, ctx, param, master, grad, m, v, args);
}
void op_drop_path_fwd(Ctx *ctx, const Tensor *x, const DropPathArgs *a, Tensor *y) {
    ROUTE(drop_path_fwd, ctx, x, a, y);
}
void op_drop_path_bwd(Ctx *ctx, const Tensor *dy, const DropPathArgs *a, Tensor *dx) {
    ROUTE(drop_path_bwd, ctx, dy, a, dx);
}
void op_ema_update(Ctx *ctx, Tensor *ema, const Tensor *src, float decay, Tensor *out) {
    ROUTE(ema_update, ctx, ema, src, decay, out);
}
void op_gspn_scan_fwd(Ctx *ctx, const Tensor *xc, const Tensor *gates, const Tensor *merge,
                      int shared_w, Tensor *yc, Tensor *hidden) {
    ROUTE(gspn_scan_fwd, ctx, xc, gates, merge, shared_w, yc, hidden);
}
void op_gspn_scan_bwd(Ctx *ctx, const Tensor *dyc, const Tensor *xc, const Tensor *gates,
                      const Tensor *merge, int shared_w, const Tensor *hidden,
                      Tensor *dxc, Tensor *dgates, Tensor *dmerge) {
    ROUTE(gspn_scan_bwd, ctx, dyc, xc, gates, merge, shared_w, hidden, dxc, dgates, dmerge);
}
void op_gspn_scan_bwd_write(Ctx *ctx, const Tensor *dyc, const Tensor *xc, const Tensor *gates,
                            const Tensor *merge, int shared_w, const Tensor *hidden,
                            Tensor *dxc, Tensor *dgates, Tensor *dmerge) {
    ROUTE(gspn_scan_bwd_write, ctx, dyc, xc, gates, merge, shared_w, hidden, dxc, dgates, dmerge);
}
