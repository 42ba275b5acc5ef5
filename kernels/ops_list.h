// The op table: one entry per op, OP(name, (parameters), (argument names)), each with its
// contract above it. Included by kernels/ops.h (declarations of op_NAME, cpu_NAME, cuda_NAME)
// and kernels/dispatch.c (op_NAME routed to the tensors' backend; a CUDA kernel this build lacks
// fails by name), each with its own definition of OP: adding an op is one entry here and its
// kernels. The conventions every op follows are in kernels/ops.h. No include guard: read once
// per definition of OP.

// ---- elementwise and memory -------------------------------------------------------------
// y = 0
OP(zero, (Ctx *ctx, Tensor *y),
   (ctx, y))
// dst += src (same numel)
OP(accumulate, (Ctx *ctx, const Tensor *src, Tensor *dst),
   (ctx, src, dst))
// y = a + b (same numel)
OP(add_fwd, (Ctx *ctx, const Tensor *a, const Tensor *b, Tensor *y),
   (ctx, a, b, y))
// y = s * x
OP(scale_fwd, (Ctx *ctx, const Tensor *x, float s, Tensor *y),
   (ctx, x, s, y))
// y = x, converted to y's dtype (written); colsum (the last dim of x, fp32) += the sums of x over
// its rows, in the same pass (NULL: skipped). The gradient of a residual branch from the fp32
// stream's gradient, with the branch's last bias gradient on the way. A primitive, not a fusion
// of other ops: no op makes a column sum on its own.
OP(cast_colsum, (Ctx *ctx, const Tensor *x, Tensor *y, Tensor *colsum),
   (ctx, x, y, colsum))
// dx += s * dy
OP(scale_bwd, (Ctx *ctx, const Tensor *dy, float s, Tensor *dx),
   (ctx, dy, s, dx))
// Broadcast add over leading dims: x (R, P) + p (P) -> y (R, P)   (pos_embed: P = N*C)
OP(add_bcast_fwd, (Ctx *ctx, const Tensor *x, const Tensor *p, Tensor *y),
   (ctx, x, p, y))
// dx += dy; dp += sum over R of dy
OP(add_bcast_bwd, (Ctx *ctx, const Tensor *dy, Tensor *dx, Tensor *dp),
   (ctx, dy, dx, dp))
// Layer scale: x (R, C) * g (C) -> y (R, C)
OP(layer_scale_fwd, (Ctx *ctx, const Tensor *x, const Tensor *g, Tensor *y),
   (ctx, x, g, y))
OP(layer_scale_bwd, (Ctx *ctx, const Tensor *dy, const Tensor *x, const Tensor *g, Tensor *dx,
       Tensor *dg),
   (ctx, dy, x, g, dx, dg))

// ---- linear ------------------------------------------------------------------------------
// x (N,K), w (M,K) in PyTorch's (out, in) layout, b (M) or NULL -> y (N,M) = x w^T + b.
// opts (kernels/ops.h LinearFwdOpts) NULL: that linear. Else at most one fusion, each the values
// of the unfused ops:
// - silu_in: y = silu(x) w^T + b, linear_fwd of silu_fwd's output (silu(x) rounded to x's dtype,
//   as silu_fwd stores it) without that output in memory (the mixer's SiLU inside its down
//   projection). x, w, b, y one dtype.
// - gelu_out: pre = x w^T + b, y = gelu(pre), kind gelu_kind (GELU_TANH or GELU_ERF); opts->pre
//   (N,M, y's dtype) receives pre, or is NULL when no backward follows. On the GPU the tanh GELU
//   is fused into the GEMM's epilogue (the GELU cuBLASLt computes); the erf GELU (exact, timm's
//   default) runs as the GEMM with its bias fused, then one GELU pass over pre.
// - res: y = res + x w^T + b, a linear added onto a residual stream in one pass (on the GPU the
//   GEMM reads res as its C operand: no separate add, no activation-dtype copy of x w^T + b).
//   res (N,M) and y share a dtype (fp32 in the encoders; y may not alias res), x and w the
//   activation dtype. Its backward is the plain linear_bwd's.
OP(linear_fwd, (Ctx *ctx, const Tensor *x, const Tensor *w, const Tensor *b,
       const LinearFwdOpts *opts, Tensor *y),
   (ctx, x, w, b, opts, y))
// dx (N,K) += dy w; dw (M,K) += dy^T x; db (M) += sum_n dy. dy may be fp32 under bf16 x and w
// (the gradient of a residual stream): dx and dw then take dy rounded to bf16, as a bf16 copy of
// it would hold, and db its fp32 values (cast_colsum's). flags: LINEAR_WRITE_DX: dx = dy w is
// WRITTEN (every element), not accumulated; dw and db still accumulate. The tape passes it for a
// gradient nothing has written yet: on the GPU that saves zeroing dx and reading it back (the dx
// GEMM runs with beta = 0). dx, dw, db may be NULL.
// opts (kernels/ops.h LinearBwdOpts) NULL: that backward. Else what sat around the forward's
// product, its backward fused in (at most one; dy, x, w and pre in one dtype):
// - silu_in (linear_fwd's silu_in; x is SiLU's input): dx (N,K) = (dy w) * silu'(x) WRITTEN
//   whatever flags say (dy w rounded to x's dtype first, as linear_bwd would store it);
//   dw (M,K) += dy^T silu(x); db (M) += sum_n dy.
// - gelu_out (linear_fwd's gelu_out; pre (N,M) its saved pre): with dpre = dy * gelu'(pre) in
//   dy's dtype (what gelu_bwd would hand the linear), the plain backward from dpre: dx (N,K) +=
//   dpre w (= with LINEAR_WRITE_DX); dw += dpre^T x; db += sum_n dpre.
// - gelu_in: x is h = gelu(pre) (an MLP's fc2 after linear_fwd's gelu_out fc1), pre (N,K), the
//   GELU's backward fused into the dx product: dx receives dpre (N,K) = (dy w) * gelu'(pre),
//   WRITTEN whatever flags say (pre feeds only the GELU, so nothing else adds to its gradient);
//   dw (M,K) += dy^T h; db += sum_n dy; dpre_db (K, fp32) += sum_n dpre, the bias gradient of the
//   linear that produced pre (NULL: not wanted; needs dx). GPU: tanh through cuBLASLt's DGELU
//   epilogue; erf as the product written into dx (rounded to its dtype, as an unfused linear
//   backward would hand the GELU) scaled in place by gelu'(pre).
OP(linear_bwd, (Ctx *ctx, const Tensor *dy, const Tensor *x, const Tensor *w, int flags,
       const LinearBwdOpts *opts, Tensor *dx, Tensor *dw, Tensor *db),
   (ctx, dy, x, w, flags, opts, dx, dw, db))
// An MLP onto a residual where no backward follows (inference): y = res + (gelu(x w1^T + b1)
// w2^T + b2), the hidden activation rounded to x's dtype as linear_fwd's gelu_out stores it, the
// sum as its res makes it; x (N,C), w1 (Hd,C), b1 (Hd), w2 (C,Hd), b2 (C) (either bias may be
// NULL), res and y (N,C) in res's dtype (y may not alias res). The values are the two linears',
// up to the order of the fp32 sums (on the GPU the hidden activation can stay on chip).
// norm non-NULL (x then NULL): the MLP reads layernorm(res) with norm's w, b and eps, in w1's
// dtype, as layernorm_fwd writes it: a block's second norm fused into the MLP that reads it (on
// the GPU the normalized rows need not leave the chip).
// An op of its own: two weights, which no option of linear_fwd can carry.
OP(mlp_residual_fwd, (Ctx *ctx, const Tensor *x, const MlpInputNorm *norm, const Tensor *w1,
       const Tensor *b1, const Tensor *w2, const Tensor *b2, GeluKind kind, const Tensor *res,
       Tensor *y),
   (ctx, x, norm, w1, b1, w2, b2, kind, res, y))

// ---- normalization and activations ------------------------------------------------------------
// LayerNorm over the last dim. x (N,C), w, b (C) -> y (N,C); saves mean, rstd (N) fp32.
// w, b may be NULL (1 and 0); mean, rstd may be NULL in forward when no backward follows.
// y may have another dtype than x: the encoders normalize their fp32 residual stream straight
// into a bf16 sublayer input (as PyTorch autocast runs LayerNorm in fp32 and the next linear
// reads it in bf16), and gspn_hier a bf16 convolution's output into its fp32 stream (autocast
// writes layer_norm's output in fp32). In backward dy has y's dtype and dx has x's.
// r and h NULL together: the LayerNorm of x. Else h = x + r is written (x's dtype; r in the
// activation dtype, h aliasing neither) and normalized, in one pass: the residual add of a
// block's mixing branch fused into the norm that reads the sum next. The backward is the add's
// (the gradient of h reaches x and r) after layernorm_bwd's with x = h.
OP(layernorm_fwd, (Ctx *ctx, const Tensor *x, const Tensor *r, const Tensor *w, const Tensor *b,
       float eps, Tensor *h, Tensor *y, Tensor *mean, Tensor *rstd),
   (ctx, x, r, w, b, eps, h, y, mean, rstd))
// The hand-off (each may be NULL; both need dx): dx_act is written with the final dx (after the
// add) in dy's dtype, and dx_sum (fp32, C) += its column sums: the gradient of a residual stream
// that this norm's backward completes, passed on to the branch that wrote the stream with that
// branch's last bias gradient (nn_linear_add_layernorm), in the same pass.
OP(layernorm_bwd, (Ctx *ctx, const Tensor *dy, const Tensor *x, const Tensor *w,
       const Tensor *mean, const Tensor *rstd, Tensor *dx, Tensor *dw, Tensor *db, Tensor *dx_act,
       Tensor *dx_sum),
   (ctx, dy, x, w, mean, rstd, dx, dw, db, dx_act, dx_sum))
// GELU, exact (erf) or tanh approximation, elementwise.
OP(gelu_fwd, (Ctx *ctx, const Tensor *x, GeluKind kind, Tensor *y),
   (ctx, x, kind, y))
OP(gelu_bwd, (Ctx *ctx, const Tensor *dy, const Tensor *x, GeluKind kind, Tensor *dx),
   (ctx, dy, x, kind, dx))
// SiLU (swish), elementwise on any shape: y = x * sigmoid(x), x's dtype. GSPN's mixer activation
// after its depthwise convolution.
OP(silu_fwd, (Ctx *ctx, const Tensor *x, Tensor *y),
   (ctx, x, y))
// dx += dy * silu'(x), silu'(x) = s (1 + x (1 - s)), s = sigmoid(x)
OP(silu_bwd, (Ctx *ctx, const Tensor *dy, const Tensor *x, Tensor *dx),
   (ctx, dy, x, dx))
// Softmax over the last dim. x (N,C) -> y (N,C); backward from the saved output y.
OP(softmax_fwd, (Ctx *ctx, const Tensor *x, Tensor *y),
   (ctx, x, y))
OP(softmax_bwd, (Ctx *ctx, const Tensor *dy, const Tensor *y, Tensor *dx),
   (ctx, dy, y, dx))

// ---- attention ----------------------------------------------------------------------------
// Multi-head scaled dot-product attention, no mask, scale head_dim^-0.5.
// qkv (B,N,3C): the last dim is timm's (3, heads, head_dim) = q | k | v (N = numel/(B*3C),
// so a (B,H,W,3C) grid works too).
// out (B,N,C) with heads concatenated (head h at channels h*head_dim..).
// lse (B,heads,N) fp32: log-sum-exp of each score row, saved for backward (which recomputes
// the probabilities from q, k and lse, as flash attention does).
OP(attention_fwd, (Ctx *ctx, const Tensor *qkv, int heads, Tensor *out, Tensor *lse),
   (ctx, qkv, heads, out, lse))
// dqkv += the gradient. flags: ATTENTION_WRITE_DQKV: dqkv is WRITTEN, not accumulated (a
// gradient nothing has written yet): cuDNN then writes dq, dk, dv straight into it (no zeroing,
// no scratch copy, no add pass).
OP(attention_bwd, (Ctx *ctx, const Tensor *dout, const Tensor *qkv, const Tensor *out,
       const Tensor *lse, int heads, int flags, Tensor *dqkv),
   (ctx, dout, qkv, out, lse, heads, flags, dqkv))

// Attention pooling with one learned query (timm AttentionPoolLatent, SigLIP's MAP head), forward
// only (it runs in frozen teachers and feature extraction): q (C) the query after its projection,
// shared by the batch; kv (B,N,2C) each token's k | v, each (heads, D); out (B,C), head h at
// channels h*D..: out_b,h = softmax_n(scale q_h . k_b,n,h) v_b,n,h, scale D^-0.5.
OP(attention_pool_fwd, (Ctx *ctx, const Tensor *q, const Tensor *kv, int heads, Tensor *out),
   (ctx, q, kv, heads, out))

// ---- convolution (GSPN's stem and downsampling) ----------------------------------------------
// x (B,H,W,C) channels-last, or (B,C,H,W) with nchw (images); w (Cout,C,k,k), PyTorch's layout;
// b (Cout) or NULL; stride s, zero padding p: Ho = (H + 2p - k) / s + 1 (Wo likewise),
//   y[b,ho,wo,o] = b[o] + sum_{c,ky,kx} w[o,c,ky,kx] x[b, ho*s + ky - p, wo*s + kx - p, c]
// (0 outside x), y (B,Ho,Wo,Cout) in w's dtype; x in w's dtype or fp32 (the fp32 stream, read
// as the GEMM's dtype). cols (B*Ho*Wo, C*k*k), w's dtype: the windows, kept for the backward in
// an order of the backend's choosing (kernels/cpu/conv2d.c, kernels/cuda/conv2d.cu), or NULL
// when no backward follows (then the backend uses scratch).
// opts (NULL: none) with ln: y = layernorm(conv), with gelu_out too y = gelu(layernorm(conv)),
// each stage rounded to y's dtype as conv2d_fwd, layernorm_fwd and gelu_fwd write them; cols
// NULL (no backward follows): gspn_hier's stem in inference, whose norm and GELU then need no
// passes of their own.
OP(conv2d_fwd, (Ctx *ctx, const Tensor *x, const Tensor *w, const Tensor *b, int nchw, int stride,
       int pad, const Conv2dFwdOpts *opts, Tensor *cols, Tensor *y),
   (ctx, x, w, b, nchw, stride, pad, opts, cols, y))
// From dy (y's dtype) and the forward's cols: dx (x's shape and dtype) += dL/dx, or = with
// CONV2D_WRITE_DX (every element written, its prior values never read); dw, db (fp32) +=
// theirs. Any of them NULL: skipped. An input element sums its taps in (ky, kx) order.
OP(conv2d_bwd, (Ctx *ctx, const Tensor *dy, const Tensor *cols, const Tensor *w, int nchw,
       int stride, int pad, int flags, Tensor *dx, Tensor *dw, Tensor *db),
   (ctx, dy, cols, w, nchw, stride, pad, flags, dx, dw, db))

// ---- depthwise convolution (GSPN's Local Perception Unit) ------------------------------------
// x (B,H,W,C) channels-last; w (C,1,k,k), PyTorch's depthwise Conv2d weight (groups = C), k odd
// (at most 7: kernels/dwconv_shape.h); stride 1, zero padding k/2; b (C) or NULL. y (B,H,W,C),
// x's dtype:
//   y[b,h,w,c] = b[c] + sum_{i,j < k} w[c,0,i,j] x[b, h+i-k/2, w+j-k/2, c]
// flags: DWCONV_RESIDUAL adds x[b,h,w,c] too (the LPU's x + dwconv(x) in one pass; y is not x);
// DWCONV_SILU (not with DWCONV_RESIDUAL) writes silu(y) instead, y first rounded to x's dtype as
// silu_fwd would read it (the mixer's convolution and activation in one pass, where no backward
// needs y itself).
// u set: the input is not x but x' = x + u uw^T + ub, a residual stream plus a product over at most
// 4 inputs (the mixer's up projection onto the stream, which the LPU after it reads): u (B,H,W,Ku)
// with Ku <= 4, uw (C, Ku), ub (C) or NULL, in w's dtype; x' is what linear_fwd(u, uw, ub) onto
// res = x writes, element for element, and goes to mid when mid is set (the backward's input);
// with DWCONV_RESIDUAL, y adds x' (the stream after both residuals). u NULL: uw, ub, mid unused.
OP(dwconv_fwd, (Ctx *ctx, const Tensor *x, const Tensor *u, const Tensor *uw, const Tensor *ub,
       const Tensor *w, const Tensor *b, int flags, Tensor *mid, Tensor *y),
   (ctx, x, u, uw, ub, w, b, flags, mid, y))
// The mixer's convolution, SiLU and down projection where nothing is recorded: y (B,H,W,M) =
// linear_fwd(dwconv_fwd(x, w, b, DWCONV_SILU), pw, pb), pw (M, C) with M <= DWCONV_PROJ_MAX and
// pb (M) or NULL in w's dtype, y in x's dtype; equal to the two ops up to the order of the
// projection's sums (the convolution's output, rounded as dwconv_fwd stores it, is not written).
OP(dwconv_silu_proj_fwd, (Ctx *ctx, const Tensor *x, const Tensor *w, const Tensor *b,
       const Tensor *pw, const Tensor *pb, Tensor *y),
   (ctx, x, w, b, pw, pb, y))
// The LPU and the LayerNorm that reads its output, where nothing is recorded: h =
// dwconv_fwd(x, w, b, DWCONV_RESIDUAL) (x's dtype, the residual stream) and y =
// layernorm_fwd(h, ln_w, ln_b, eps) (y's dtype; ln_w, ln_b (C) or NULL), in one pass over the
// stream where the backend fuses them (the norm's read of h is gone); equal to the two ops up to
// the order of the sums.
OP(dwconv_layernorm_fwd, (Ctx *ctx, const Tensor *x, const Tensor *w, const Tensor *b,
       const Tensor *ln_w, const Tensor *ln_b, float eps, Tensor *h, Tensor *y),
   (ctx, x, w, b, ln_w, ln_b, eps, h, y))
// dx (x's dtype) += dL/dx, dw and db (fp32) += theirs; any of them NULL: skipped. flags:
// DWCONV_RESIDUAL: dL/dx includes dy itself; DWCONV_WRITE_DX: dx = dL/dx (every element
// written, its prior values never read). dx is not dy (the taps read neighbours of what they
// write).
OP(dwconv_bwd, (Ctx *ctx, const Tensor *dy, const Tensor *x, const Tensor *w, int flags,
       Tensor *dx, Tensor *dw, Tensor *db),
   (ctx, dy, x, w, flags, dx, dw, db))

// ---- patch embedding and token layout --------------------------------------------------------
// Conv p x p stride p with bias, via im2col: img (B,Cin,Hi,Wi) NCHW -> cols (B*H*W, Cin*p*p)
// -> y (B,H,W,D), H = Hi/p, W = Wi/p. w (D, Cin*p*p) is PyTorch's (D,Cin,p,p) flattened
// (a 4-D (D,Cin,p,p) tensor is accepted too).
OP(patch_embed_fwd, (Ctx *ctx, const Tensor *img, const Tensor *w, const Tensor *b, int patch,
       Tensor *cols, Tensor *y),
   (ctx, img, w, b, patch, cols, y))
OP(patch_embed_bwd, (Ctx *ctx, const Tensor *dy, const Tensor *cols, const Tensor *w, int patch,
       Tensor *dimg, Tensor *dw, Tensor *db),
   (ctx, dy, cols, w, patch, dimg, dw, db))
// Prepend P prefix tokens shared by the batch: prefix (P,C), x (B,N,C) -> y (B,P+N,C)
OP(concat_prefix_fwd, (Ctx *ctx, const Tensor *prefix, const Tensor *x, Tensor *y),
   (ctx, prefix, x, y))
OP(concat_prefix_bwd, (Ctx *ctx, const Tensor *dy, Tensor *dprefix, Tensor *dx),
   (ctx, dy, dprefix, dx))
// Token slice: x (B,N,C) -> y (B,count,C) = x[:, start:start+count]
OP(slice_tokens_fwd, (Ctx *ctx, const Tensor *x, int start, Tensor *y),
   (ctx, x, start, y))
OP(slice_tokens_bwd, (Ctx *ctx, const Tensor *dy, int start, Tensor *dx),
   (ctx, dy, start, dx))
// Mean over tokens: x (B,N,C) -> y (B,C)
OP(mean_tokens_fwd, (Ctx *ctx, const Tensor *x, Tensor *y),
   (ctx, x, y))
OP(mean_tokens_bwd, (Ctx *ctx, const Tensor *dy, Tensor *dx),
   (ctx, dy, dx))
// Bilinear resize of a token grid, half-pixel centres (PyTorch interpolate, align_corners=False,
// no antialias): x (B,H,W,C) -> y (B,H2,W2,C)
OP(resize_bilinear_fwd, (Ctx *ctx, const Tensor *x, Tensor *y),
   (ctx, x, y))
OP(resize_bilinear_bwd, (Ctx *ctx, const Tensor *dy, Tensor *dx),
   (ctx, dy, dx))

// ---- losses (fp32 scalars) -----------------------------------------------------------------
// Softmax cross-entropy with soft targets: logits (B,K), targets (B,K) rows summing to 1
// (label smoothing and mixup build them) -> loss (1) = mean_b sum_k -t log softmax(logits);
// probs (B,K) saved for backward.
OP(cross_entropy_fwd, (Ctx *ctx, const Tensor *logits, const Tensor *targets, Tensor *loss,
       Tensor *probs),
   (ctx, logits, targets, loss, probs))
// dlogits += dloss * (probs - targets) / B
OP(cross_entropy_bwd, (Ctx *ctx, const Tensor *dloss, const Tensor *probs, const Tensor *targets,
       Tensor *dlogits),
   (ctx, dloss, probs, targets, dlogits))
// MSE: loss (1) = mean over all elements of (a - b)^2
OP(mse_fwd, (Ctx *ctx, const Tensor *a, const Tensor *b, Tensor *loss),
   (ctx, a, b, loss))
OP(mse_bwd, (Ctx *ctx, const Tensor *dloss, const Tensor *a, const Tensor *b, Tensor *da,
       Tensor *db),
   (ctx, dloss, a, b, da, db))
// Token-wise softmax KL (docs/design.md#stage2): s, t (N,C); P = softmax over C of each token;
// loss (1) = mean over the N tokens of KL(P(s) || P(t)).
OP(token_kl_fwd, (Ctx *ctx, const Tensor *s, const Tensor *t, Tensor *loss),
   (ctx, s, t, loss))
OP(token_kl_bwd, (Ctx *ctx, const Tensor *dloss, const Tensor *s, const Tensor *t, Tensor *ds,
       Tensor *dt),
   (ctx, dloss, s, t, ds, dt))

// ---- optimizer ------------------------------------------------------------------------------
// sumsq (1) += sum of x^2 (double accumulation on the CPU; used for the global gradient norm)
OP(sumsq, (Ctx *ctx, const Tensor *x, Tensor *sumsq),
   (ctx, x, sumsq))
// AdamW on one parameter (PyTorch semantics, decoupled decay):
//   g = grad * grad_scale; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2
//   p -= lr * (m / (1-b1^step) / (sqrt(v / (1-b2^step)) + eps) + wd * p)
// master (fp32) holds the weights when param is bf16: the update is applied to master and
// param receives it rounded; master is NULL when param is fp32. args' decay runs let one call
// update many parameters laid end to end, wd applying only to some (kernels/ops.h AdamWArgs).
OP(adamw, (Ctx *ctx, Tensor *param, Tensor *master, const Tensor *grad, Tensor *m, Tensor *v,
       const AdamWArgs *args),
   (ctx, param, master, grad, m, v, args))

// ---- training regularizers ----------------------------------------------------------------
// Stochastic depth (timm DropPath, scale_by_keep): x (B, ...) -> y (B, ...); sample b is kept
// with probability 1 - prob and then scaled by 1 / (1 - prob), else zeroed. The keep decision is
// drop_path_keep(a, a->first_sample + b) (kernels/drop_path_mask.h): a pure function of
// (seed, step, site, sample), the same on every backend, so backward recomputes it.
OP(drop_path_fwd, (Ctx *ctx, const Tensor *x, const DropPathArgs *a, Tensor *y),
   (ctx, x, a, y))
// dx += dy * (the same per-sample scale)
OP(drop_path_bwd, (Ctx *ctx, const Tensor *dy, const DropPathArgs *a, Tensor *dx),
   (ctx, dy, a, dx))
// EMA of weights over a whole parameter buffer (one call per step):
//   ema (n) fp32 = decay * ema + (1 - decay) * src      (src (n) fp32 or bf16)
// evaluated as two rounded products and a rounded sum (no fused multiply-add), so every
// backend gives the same bits. out (n, any dtype) receives the new ema rounded to its dtype
// (the weights an EMA model is evaluated with), or is NULL.
OP(ema_update, (Ctx *ctx, Tensor *ema, const Tensor *src, float decay, Tensor *out),
   (ctx, ema, src, decay, out))

// ---- C-GSPN propagation (docs/design.md#cgspn-layer steps 3-5) -------------------------
// xc (B,H,W,Cc) latent input. gates (B,H,W,G), per direction d in (TB, BT, LR, RL):
//   per-channel (shared_w = 0): G = 20*Cc, block d at offset d*5*Cc holds
//       lam (Cc) | u (Cc) | wt_{-1} (Cc) | wt_0 (Cc) | wt_{+1} (Cc)
//   shared (shared_w = 1):      G = 4*(2*Cc+3), block d at offset d*(2*Cc+3) holds
//       lam (Cc) | u (Cc) | wt_{-1} | wt_0 | wt_{+1}   (3 scalars shared by the Cc channels)
// merge (4): m_d. yc (B,H,W,Cc) = sum_d m_d * u_d * h_d.
// hidden (4,B,H,W,Cc) fp32 receives h_d for backward, or is NULL when the backend recomputes.
OP(gspn_scan_fwd, (Ctx *ctx, const Tensor *xc, const Tensor *gates, const Tensor *merge,
       int shared_w, Tensor *yc, Tensor *hidden),
   (ctx, xc, gates, merge, shared_w, yc, hidden))
// The propagation where nothing is recorded, its gates made inside it: yc as gspn_scan_fwd
// makes it (hidden NULL) from gates = linear_fwd(xc, gw, gb), gw (G, Cc) and gb (G) or NULL in
// xc's dtype; the gates are never written (the C-GSPN layer's gate projection in inference).
OP(gspn_scan_proj_fwd, (Ctx *ctx, const Tensor *xc, const Tensor *gw, const Tensor *gb,
       const Tensor *merge, int shared_w, Tensor *yc),
   (ctx, xc, gw, gb, merge, shared_w, yc))
// Accumulates dxc (B,H,W,Cc), dgates (B,H,W,G), dmerge (4). flags: GSPN_SCAN_WRITE_GRADS: dxc
// and dgates are WRITTEN (every element; their old contents are ignored) and dmerge still
// accumulates. The tape passes it when nothing has written those gradients yet: on the GPU the
// scan then neither reads dgates back nor needs it zeroed (40 of the 172 bytes per token-channel
// the accumulating kernel moves, kernels/cuda/gspn_scan_notes.md).
OP(gspn_scan_bwd, (Ctx *ctx, const Tensor *dyc, const Tensor *xc, const Tensor *gates,
       const Tensor *merge, int shared_w, const Tensor *hidden, int flags, Tensor *dxc,
       Tensor *dgates, Tensor *dmerge),
   (ctx, dyc, xc, gates, merge, shared_w, hidden, flags, dxc, dgates, dmerge))
