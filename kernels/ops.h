// The op table. Each op is declared once here; kernels/cpu/*.c (cpu_*) and kernels/cuda/*.cu
// (cuda_*) implement it with the same signature, and kernels/dispatch.c routes op_* to the
// backend the tensors live on. Layers (nn/) call only op_*.
//
// Conventions
// - Tokens are channels-last: (B,H,W,C) is also a (B*H*W, C) matrix; ops that only need rows
//   and a last dim read them from the tensor (rows = numel / last dim).
// - Backward functions ACCUMULATE (+=) into every gradient they are given; a NULL gradient
//   means "not needed" and is skipped. The tape zeroes activation gradients when it creates
//   them and the optimizer zeroes parameter gradients, so fan-out (residuals) just works.
// - Scalars that come back to the host (losses, norms) are written to 1-element fp32 tensors.
// - Precision: activations and their gradients are in ctx->act_dtype (fp32 on the CPU; bf16 or
//   fp32 on the GPU), except the encoders' residual stream, kept in fp32; parameters are in
//   act_dtype too, with fp32 master copies when that is bf16; parameter gradients, optimizer
//   moments, LayerNorm statistics and losses are fp32.
//   An op accepts any mix that follows these rules (e.g. linear_bwd: bf16 dy, x, w; fp32 dw).
#pragma once
#include "ctx.h"
#include "device.h"   // memory and copies: every op user needs them

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { GELU_ERF = 0, GELU_TANH = 1 } GeluKind;

#define OP_DECL(name, ...)                 \
    void op_##name(__VA_ARGS__);           \
    void cpu_##name(__VA_ARGS__);          \
    void cuda_##name(__VA_ARGS__);

// ---- elementwise and memory -------------------------------------------------------------
// y = 0
OP_DECL(zero, Ctx *ctx, Tensor *y)
// dst += src (same numel)
OP_DECL(accumulate, Ctx *ctx, const Tensor *src, Tensor *dst)
// y = a + b (same numel)
OP_DECL(add_fwd, Ctx *ctx, const Tensor *a, const Tensor *b, Tensor *y)
// y = s * x
OP_DECL(scale_fwd, Ctx *ctx, const Tensor *x, float s, Tensor *y)
// y = x, converted to y's dtype (written); colsum (the last dim of x, fp32) += the sums of x over
// its rows, in the same pass (NULL: skipped). The gradient of a residual branch from the fp32
// stream's gradient, with the branch's last bias gradient on the way.
OP_DECL(cast_colsum, Ctx *ctx, const Tensor *x, Tensor *y, Tensor *colsum)
// dx += s * dy
OP_DECL(scale_bwd, Ctx *ctx, const Tensor *dy, float s, Tensor *dx)
// Broadcast add over leading dims: x (R, P) + p (P) -> y (R, P)   (pos_embed: P = N*C)
OP_DECL(add_bcast_fwd, Ctx *ctx, const Tensor *x, const Tensor *p, Tensor *y)
// dx += dy; dp += sum over R of dy
OP_DECL(add_bcast_bwd, Ctx *ctx, const Tensor *dy, Tensor *dx, Tensor *dp)
// Layer scale: x (R, C) * g (C) -> y (R, C)
OP_DECL(layer_scale_fwd, Ctx *ctx, const Tensor *x, const Tensor *g, Tensor *y)
OP_DECL(layer_scale_bwd, Ctx *ctx, const Tensor *dy, const Tensor *x, const Tensor *g,
        Tensor *dx, Tensor *dg)

// ---- linear ------------------------------------------------------------------------------
// x (N,K), w (M,K) in PyTorch's (out, in) layout, b (M) or NULL -> y (N,M) = x w^T + b
OP_DECL(linear_fwd, Ctx *ctx, const Tensor *x, const Tensor *w, const Tensor *b, Tensor *y)
// dx (N,K) += dy w; dw (M,K) += dy^T x; db (M) += sum_n dy
OP_DECL(linear_bwd, Ctx *ctx, const Tensor *dy, const Tensor *x, const Tensor *w,
        Tensor *dx, Tensor *dw, Tensor *db)
// As linear_bwd, but dx (N,K) = dy w is WRITTEN (every element), not accumulated; dw and db
// still accumulate. The tape calls it for a gradient nothing has written yet: on the GPU that
// saves zeroing dx and reading it back (the dx GEMM runs with beta = 0).
OP_DECL(linear_bwd_write, Ctx *ctx, const Tensor *dy, const Tensor *x, const Tensor *w,
        Tensor *dx, Tensor *dw, Tensor *db)
// y (N,M) = res + x w^T + b: a linear added onto a residual stream in one pass (on the GPU the
// GEMM reads res as its C operand: no separate add, no activation-dtype copy of x w^T + b).
// res and y share a dtype (fp32 in the encoders; y may not alias res), x and w the activation
// dtype; b may be NULL. Forward only: the tape's backward of it is linear_bwd's.
OP_DECL(linear_residual_fwd, Ctx *ctx, const Tensor *x, const Tensor *w, const Tensor *b,
        const Tensor *res, Tensor *y)
// Linear then GELU: pre (N,M) = x w^T + b, y = gelu(pre), kind GELU_TANH or GELU_ERF. On the
// GPU the tanh GELU is fused into the GEMM's epilogue (the GELU cuBLASLt computes); the erf GELU
// (exact, timm's default) runs as the GEMM with its bias fused, then one GELU pass over pre.
// pre may be NULL when no backward follows.
OP_DECL(linear_gelu_fwd, Ctx *ctx, const Tensor *x, const Tensor *w, const Tensor *b,
        GeluKind kind, Tensor *pre, Tensor *y)
// With dpre = dy * gelu'(pre): dx (N,K) += dpre w; dw += dpre^T x; db += sum_n dpre
OP_DECL(linear_gelu_bwd, Ctx *ctx, const Tensor *dy, const Tensor *x, const Tensor *w,
        const Tensor *pre, GeluKind kind, Tensor *dx, Tensor *dw, Tensor *db)
// Backward of a linear y = h w^T + b whose input is h = gelu(pre) (an MLP's fc2 after
// linear_gelu_fwd's fc1), with the GELU's backward fused into the dx product:
//   dpre (N,K) = (dy w) * gelu'(pre), WRITTEN, not accumulated: the one exception to the
//   rule above, since pre feeds only the GELU and nothing else adds to its gradient;
//   dw (M,K) += dy^T h; db += sum_n dy; dpre_db (K, fp32) += sum_n dpre, the bias gradient of
//   the linear that produced pre (NULL: not wanted; needs dpre). h, pre, dpre (N,K), dy (N,M).
// GPU: tanh through cuBLASLt's DGELU epilogue; erf as the product written into dpre (rounded
// to its dtype, as an unfused linear backward would hand the GELU) scaled in place by gelu'(pre).
OP_DECL(linear_dgelu_bwd, Ctx *ctx, const Tensor *dy, const Tensor *h, const Tensor *w,
        const Tensor *pre, GeluKind kind, Tensor *dpre, Tensor *dpre_db, Tensor *dw, Tensor *db)

// ---- normalization and activations ------------------------------------------------------------
// LayerNorm over the last dim. x (N,C), w, b (C) -> y (N,C); saves mean, rstd (N) fp32.
// w, b may be NULL (1 and 0); mean, rstd may be NULL in forward when no backward follows.
// y may have another dtype than x: the encoders normalize their fp32 residual stream straight
// into a bf16 sublayer input (as PyTorch autocast runs LayerNorm in fp32 and the next linear
// reads it in bf16). In backward dy has y's dtype and dx has x's.
OP_DECL(layernorm_fwd, Ctx *ctx, const Tensor *x, const Tensor *w, const Tensor *b, float eps,
        Tensor *y, Tensor *mean, Tensor *rstd)
// The hand-off (each may be NULL; both need dx): dx_act is written with the final dx (after the
// add) in dy's dtype, and dx_sum (fp32, C) += its column sums: the gradient of a residual stream
// that this norm's backward completes, passed on to the branch that wrote the stream with that
// branch's last bias gradient (nn_linear_add_layernorm), in the same pass.
OP_DECL(layernorm_bwd, Ctx *ctx, const Tensor *dy, const Tensor *x, const Tensor *w,
        const Tensor *mean, const Tensor *rstd, Tensor *dx, Tensor *dw, Tensor *db,
        Tensor *dx_act, Tensor *dx_sum)
// h = x + r (written, x's dtype; r in the activation dtype), then layernorm_fwd of h, in one pass:
// the residual add of a block's mixing branch fused into the norm that reads the sum next. The
// backward is the add's (the gradient of h reaches x and r) after layernorm_bwd's with x = h.
OP_DECL(add_layernorm_fwd, Ctx *ctx, const Tensor *x, const Tensor *r, const Tensor *w,
        const Tensor *b, float eps, Tensor *h, Tensor *y, Tensor *mean, Tensor *rstd)
// GELU, exact (erf) or tanh approximation, elementwise.
OP_DECL(gelu_fwd, Ctx *ctx, const Tensor *x, GeluKind kind, Tensor *y)
OP_DECL(gelu_bwd, Ctx *ctx, const Tensor *dy, const Tensor *x, GeluKind kind, Tensor *dx)
// SiLU (swish), elementwise on any shape: y = x * sigmoid(x), x's dtype. GSPN's mixer activation
// after its depthwise convolution.
OP_DECL(silu_fwd, Ctx *ctx, const Tensor *x, Tensor *y)
// dx += dy * silu'(x), silu'(x) = s (1 + x (1 - s)), s = sigmoid(x)
OP_DECL(silu_bwd, Ctx *ctx, const Tensor *dy, const Tensor *x, Tensor *dx)
// Softmax over the last dim. x (N,C) -> y (N,C); backward from the saved output y.
OP_DECL(softmax_fwd, Ctx *ctx, const Tensor *x, Tensor *y)
OP_DECL(softmax_bwd, Ctx *ctx, const Tensor *dy, const Tensor *y, Tensor *dx)

// ---- attention ----------------------------------------------------------------------------
// Multi-head scaled dot-product attention, no mask, scale head_dim^-0.5.
// qkv (B,N,3C): the last dim is timm's (3, heads, head_dim) = q | k | v (N = numel/(B*3C),
// so a (B,H,W,3C) grid works too).
// out (B,N,C) with heads concatenated (head h at channels h*head_dim..).
// lse (B,heads,N) fp32: log-sum-exp of each score row, saved for backward (which recomputes
// the probabilities from q, k and lse, as flash attention does).
OP_DECL(attention_fwd, Ctx *ctx, const Tensor *qkv, int heads, Tensor *out, Tensor *lse)
OP_DECL(attention_bwd, Ctx *ctx, const Tensor *dout, const Tensor *qkv, const Tensor *out,
        const Tensor *lse, int heads, Tensor *dqkv)
// As attention_bwd, but dqkv is WRITTEN, not accumulated (a gradient nothing has written yet):
// cuDNN then writes dq, dk, dv straight into it (no zeroing, no scratch copy, no add pass).
OP_DECL(attention_bwd_write, Ctx *ctx, const Tensor *dout, const Tensor *qkv, const Tensor *out,
        const Tensor *lse, int heads, Tensor *dqkv)

// Attention pooling with one learned query (timm AttentionPoolLatent, SigLIP's MAP head), forward
// only (it runs in frozen teachers and feature extraction): q (C) the query after its projection,
// shared by the batch; kv (B,N,2C) each token's k | v, each (heads, D); out (B,C), head h at
// channels h*D..: out_b,h = softmax_n(scale q_h . k_b,n,h) v_b,n,h, scale D^-0.5.
OP_DECL(attention_pool_fwd, Ctx *ctx, const Tensor *q, const Tensor *kv, int heads, Tensor *out)

// ---- convolution as im2col + GEMM (GSPN's stem and downsampling) -------------------------------
// x (B,H,W,C) channels-last, or (B,C,H,W) with nchw (images); k x k windows, stride s, zero
// padding p: Ho = (H + 2p - k) / s + 1 (Wo likewise). cols (B*Ho*Wo, C*k*k), x's dtype, row
// (b*Ho + ho)*Wo + wo, column c*k*k + ky*k + kx = x[b, ho*s + ky - p, wo*s + kx - p, c] (0
// outside): PyTorch's (Cout, C, k, k) weight flattened is the GEMM's (Cout, C*k*k).
OP_DECL(im2col_fwd, Ctx *ctx, const Tensor *x, int nchw, int k, int stride, int pad, Tensor *cols)
// dx += the adjoint: every input element sums the columns that copied it, in (ky, kx) order.
OP_DECL(im2col_bwd, Ctx *ctx, const Tensor *dcols, int nchw, int k, int stride, int pad, Tensor *dx)

// ---- depthwise convolution (GSPN's Local Perception Unit) ------------------------------------
// x (B,H,W,C) channels-last; w (C,1,k,k), PyTorch's depthwise Conv2d weight (groups = C), k odd
// (CUDA: at most 7); stride 1, zero padding k/2; b (C) or NULL. y (B,H,W,C), x's dtype:
//   y[b,h,w,c] = b[c] + sum_{i,j < k} w[c,0,i,j] x[b, h+i-k/2, w+j-k/2, c]
// flags: DWCONV_RESIDUAL adds x[b,h,w,c] too (the LPU's x + dwconv(x) in one pass; y is not x).
enum { DWCONV_RESIDUAL = 1, DWCONV_WRITE_DX = 2 };
OP_DECL(dwconv_fwd, Ctx *ctx, const Tensor *x, const Tensor *w, const Tensor *b, int flags, Tensor *y)
// dx (x's dtype) += dL/dx, dw and db (fp32) += theirs; any of them NULL: skipped. flags:
// DWCONV_RESIDUAL: dL/dx includes dy itself; DWCONV_WRITE_DX: dx = dL/dx (every element
// written, its prior values never read). dx is not dy (the taps read neighbours of what they write).
OP_DECL(dwconv_bwd, Ctx *ctx, const Tensor *dy, const Tensor *x, const Tensor *w, int flags,
        Tensor *dx, Tensor *dw, Tensor *db)

// ---- patch embedding and token layout --------------------------------------------------------
// Conv p x p stride p with bias, via im2col: img (B,Cin,Hi,Wi) NCHW -> cols (B*H*W, Cin*p*p)
// -> y (B,H,W,D), H = Hi/p, W = Wi/p. w (D, Cin*p*p) is PyTorch's (D,Cin,p,p) flattened
// (a 4-D (D,Cin,p,p) tensor is accepted too).
OP_DECL(patch_embed_fwd, Ctx *ctx, const Tensor *img, const Tensor *w, const Tensor *b,
        int patch, Tensor *cols, Tensor *y)
OP_DECL(patch_embed_bwd, Ctx *ctx, const Tensor *dy, const Tensor *cols, const Tensor *w,
        int patch, Tensor *dimg, Tensor *dw, Tensor *db)
// Prepend P prefix tokens shared by the batch: prefix (P,C), x (B,N,C) -> y (B,P+N,C)
OP_DECL(concat_prefix_fwd, Ctx *ctx, const Tensor *prefix, const Tensor *x, Tensor *y)
OP_DECL(concat_prefix_bwd, Ctx *ctx, const Tensor *dy, Tensor *dprefix, Tensor *dx)
// Token slice: x (B,N,C) -> y (B,count,C) = x[:, start:start+count]
OP_DECL(slice_tokens_fwd, Ctx *ctx, const Tensor *x, int start, Tensor *y)
OP_DECL(slice_tokens_bwd, Ctx *ctx, const Tensor *dy, int start, Tensor *dx)
// Mean over tokens: x (B,N,C) -> y (B,C)
OP_DECL(mean_tokens_fwd, Ctx *ctx, const Tensor *x, Tensor *y)
OP_DECL(mean_tokens_bwd, Ctx *ctx, const Tensor *dy, Tensor *dx)
// Bilinear resize of a token grid, half-pixel centres (PyTorch interpolate, align_corners=False,
// no antialias): x (B,H,W,C) -> y (B,H2,W2,C)
OP_DECL(resize_bilinear_fwd, Ctx *ctx, const Tensor *x, Tensor *y)
OP_DECL(resize_bilinear_bwd, Ctx *ctx, const Tensor *dy, Tensor *dx)

// ---- losses (fp32 scalars) -----------------------------------------------------------------
// Softmax cross-entropy with soft targets: logits (B,K), targets (B,K) rows summing to 1
// (label smoothing and mixup build them) -> loss (1) = mean_b sum_k -t log softmax(logits);
// probs (B,K) saved for backward.
OP_DECL(cross_entropy_fwd, Ctx *ctx, const Tensor *logits, const Tensor *targets,
        Tensor *loss, Tensor *probs)
// dlogits += dloss * (probs - targets) / B
OP_DECL(cross_entropy_bwd, Ctx *ctx, const Tensor *dloss, const Tensor *probs,
        const Tensor *targets, Tensor *dlogits)
// MSE: loss (1) = mean over all elements of (a - b)^2
OP_DECL(mse_fwd, Ctx *ctx, const Tensor *a, const Tensor *b, Tensor *loss)
OP_DECL(mse_bwd, Ctx *ctx, const Tensor *dloss, const Tensor *a, const Tensor *b,
        Tensor *da, Tensor *db)
// Token-wise softmax KL (docs/design.md#stage2): s, t (N,C); P = softmax over C of each token;
// loss (1) = mean over the N tokens of KL(P(s) || P(t)).
OP_DECL(token_kl_fwd, Ctx *ctx, const Tensor *s, const Tensor *t, Tensor *loss)
OP_DECL(token_kl_bwd, Ctx *ctx, const Tensor *dloss, const Tensor *s, const Tensor *t,
        Tensor *ds, Tensor *dt)

// ---- optimizer ------------------------------------------------------------------------------
// sumsq (1) += sum of x^2 (double accumulation on the CPU; used for the global gradient norm)
OP_DECL(sumsq, Ctx *ctx, const Tensor *x, Tensor *sumsq)
// AdamW on one parameter (PyTorch semantics, decoupled decay):
//   g = grad * grad_scale; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2
//   p -= lr * (m / (1-b1^step) / (sqrt(v / (1-b2^step)) + eps) + wd * p)
// master (fp32) holds the weights when param is bf16: the update is applied to master and
// param receives it rounded; master is NULL when param is fp32.
typedef struct AdamWArgs {
    float lr, beta1, beta2, eps, weight_decay, grad_scale;
    int step;   // 1-based
} AdamWArgs;
OP_DECL(adamw, Ctx *ctx, Tensor *param, Tensor *master, const Tensor *grad, Tensor *m,
        Tensor *v, const AdamWArgs *args)

// ---- training regularizers ----------------------------------------------------------------
// Stochastic depth (timm DropPath, scale_by_keep): x (B, ...) -> y (B, ...); sample b is kept
// with probability 1 - prob and then scaled by 1 / (1 - prob), else zeroed. The keep decision is
// drop_path_keep(a, a->first_sample + b) (kernels/drop_path_mask.h): a pure function of
// (seed, step, site, sample), the same on every backend, so backward recomputes it.
typedef struct DropPathArgs {
    float prob;           // drop probability, in [0, 1)
    uint64_t seed;
    int64_t step;         // the batch's place in the run (micro-batch index with accumulation)
    int site;             // which residual branch (trainer: 2 * block + 0 attention/mixing, + 1 MLP)
    int first_sample;     // global index of sample 0 of this batch (rank * per-rank batch)
} DropPathArgs;
OP_DECL(drop_path_fwd, Ctx *ctx, const Tensor *x, const DropPathArgs *a, Tensor *y)
// dx += dy * (the same per-sample scale)
OP_DECL(drop_path_bwd, Ctx *ctx, const Tensor *dy, const DropPathArgs *a, Tensor *dx)
// EMA of weights over a whole parameter buffer (one call per step):
//   ema (n) fp32 = decay * ema + (1 - decay) * src      (src (n) fp32 or bf16)
// evaluated as two rounded products and a rounded sum (no fused multiply-add), so every
// backend gives the same bits. out (n, any dtype) receives the new ema rounded to its dtype
// (the weights an EMA model is evaluated with), or is NULL.
OP_DECL(ema_update, Ctx *ctx, Tensor *ema, const Tensor *src, float decay, Tensor *out)

// ---- C-GSPN propagation (docs/design.md#cgspn-layer steps 3-5) ------------------------------------------------
// xc (B,H,W,Cc) latent input. gates (B,H,W,G), per direction d in (TB, BT, LR, RL):
//   per-channel (shared_w = 0): G = 20*Cc, block d at offset d*5*Cc holds
//       lam (Cc) | u (Cc) | wt_{-1} (Cc) | wt_0 (Cc) | wt_{+1} (Cc)
//   shared (shared_w = 1):      G = 4*(2*Cc+3), block d at offset d*(2*Cc+3) holds
//       lam (Cc) | u (Cc) | wt_{-1} | wt_0 | wt_{+1}   (3 scalars shared by the Cc channels)
// merge (4): m_d. yc (B,H,W,Cc) = sum_d m_d * u_d * h_d.
// hidden (4,B,H,W,Cc) fp32 receives h_d for backward, or is NULL when the backend recomputes.
OP_DECL(gspn_scan_fwd, Ctx *ctx, const Tensor *xc, const Tensor *gates, const Tensor *merge,
        int shared_w, Tensor *yc, Tensor *hidden)
// Accumulates dxc (B,H,W,Cc), dgates (B,H,W,G), dmerge (4).
OP_DECL(gspn_scan_bwd, Ctx *ctx, const Tensor *dyc, const Tensor *xc, const Tensor *gates,
        const Tensor *merge, int shared_w, const Tensor *hidden,
        Tensor *dxc, Tensor *dgates, Tensor *dmerge)
// As gspn_scan_bwd, but dxc and dgates are WRITTEN (every element; their old contents are
// ignored) and dmerge still accumulates. The tape calls it when nothing has written those
// gradients yet: on the GPU the scan then neither reads dgates back nor needs it zeroed (40 of
// the 172 bytes per token-channel the accumulating kernel moves, kernels/cuda/gspn_scan_notes.md).
OP_DECL(gspn_scan_bwd_write, Ctx *ctx, const Tensor *dyc, const Tensor *xc, const Tensor *gates,
        const Tensor *merge, int shared_w, const Tensor *hidden,
        Tensor *dxc, Tensor *dgates, Tensor *dmerge)

#ifdef __cplusplus
}
#endif
