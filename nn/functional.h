// Differentiable ops: each runs op_*_fwd and, when a gradient is needed, records what its
// backward needs on the tape. Shapes as in kernels/ops.h; outputs come from the step's arena.
#pragma once
#include "tape.h"
#include "../kernels/ops.h"

Tensor *nn_linear(Tape *t, Tensor *x, Tensor *w, Tensor *b);            // (..,K) -> (..,M)
// y in the context's activation dtype whatever x's (an fp32 residual stream is normalized
// straight into a bf16 sublayer input on the GPU).
Tensor *nn_layernorm(Tape *t, Tensor *x, Tensor *w, Tensor *b, float eps);
// The same normalizing x (fp32 or bf16) into fp32, as PyTorch's autocast runs layer_norm: a
// norm that starts or ends an fp32 residual stream (gspn_hier's stem, downsampling and final
// norm) keeps its output and the gradient reaching it unrounded; dx has x's dtype.
Tensor *nn_layernorm_f32(Tape *t, Tensor *x, Tensor *w, Tensor *b, float eps);
// res + nn_linear(x, w, b) with the GEMM writing the sum (linear_fwd onto res: one pass over the
// residual stream; y has res's shape and dtype).
Tensor *nn_linear_residual(Tape *t, Tensor *res, Tensor *x, Tensor *w, Tensor *b);
// h = res + nn_linear(x, w, b), returned (res's shape and dtype), and *normed = nn_layernorm(h,
// ln_w, ln_b, eps): the linear writes the branch in the activation dtype and one pass adds it to
// res and normalizes the sum (layernorm_fwd with r); the tape sees a linear onto res, then the
// norm.
Tensor *nn_linear_add_layernorm(Tape *t, Tensor *res, Tensor *x, Tensor *w, Tensor *b,
                                Tensor *ln_w, Tensor *ln_b, float eps, Tensor **normed);
Tensor *nn_gelu(Tape *t, Tensor *x, GeluKind kind);
Tensor *nn_silu(Tape *t, Tensor *x);                                    // x * sigmoid(x)
// nn_linear(nn_silu(x), w, b) as one record (linear_fwd / linear_bwd with silu_in): SiLU's output
// is made on the fly from x and never stored; the record keeps x.
Tensor *nn_silu_linear(Tape *t, Tensor *x, Tensor *w, Tensor *b);
// MLP y = gelu(x w1^T + b1) w2^T + b2 as one record: fc1 by linear_fwd with gelu_out, and in
// backward fc2 by linear_bwd with gelu_in (the GELU's backward fused, dpre written), then fc1's.
// keep_hidden: the record keeps h = gelu(x w1^T + b1) for fc2's weight gradient; else backward
// makes it again from fc1's output (below).
Tensor *nn_mlp(Tape *t, Tensor *x, Tensor *w1, Tensor *b1, Tensor *w2, Tensor *b2, GeluKind kind,
               bool keep_hidden);
// res + nn_mlp(x, ...) with fc2 writing the sum (one pass over the residual stream; y has res's
// shape and dtype); where nothing is recorded, one op (mlp_residual_fwd: on the GPU the hidden
// activation can stay on chip).
Tensor *nn_mlp_residual(Tape *t, Tensor *res, Tensor *x, Tensor *w1, Tensor *b1, Tensor *w2,
                        Tensor *b2, GeluKind kind, bool keep_hidden);
// nn_mlp_residual(res, nn_layernorm(res, ln_w, ln_b, eps), ...): where nothing is recorded, one op
// (mlp_residual_fwd with its norm: on the GPU the normalized rows can stay on chip too); else
// the two records.
Tensor *nn_layernorm_mlp_residual(Tape *t, Tensor *res, Tensor *ln_w, Tensor *ln_b, float eps,
                                  Tensor *w1, Tensor *b1, Tensor *w2, Tensor *b2, GeluKind kind,
                                  bool keep_hidden);
Tensor *nn_softmax(Tape *t, Tensor *x);
Tensor *nn_attention(Tape *t, Tensor *qkv, int heads);                   // (B,N,3C) -> (B,N,C)
// One query per head against every token (kernels/ops.h attention_pool_fwd): q (C), kv (B,N,2C)
// -> (B,C) in kv's dtype. Forward only: it fails when a gradient would be recorded.
Tensor *nn_attention_pool(Tape *t, Tensor *q, Tensor *kv, int heads);
// Depthwise k x k convolution, stride 1, padding k/2 (kernels/ops.h dwconv_fwd): x (B,H,W,C),
// w (C,1,k,k), b (C) or NULL -> (B,H,W,C), x's dtype. GSPN's Local Perception Unit.
Tensor *nn_dwconv(Tape *t, Tensor *x, Tensor *w, Tensor *b);
// x + nn_dwconv(x) in one pass each way (the LPU): one record, no add, and the backward writes
// dy + the taps' sum into x's gradient at once.
Tensor *nn_dwconv_residual(Tape *t, Tensor *x, Tensor *w, Tensor *b);
// nn_dwconv_residual(nn_linear_residual(res, u, uw, ub), w, b) (gspn_hier's up projection onto
// the stream, then the LPU): one pass over the stream (dwconv_fwd's added input), the same
// values and gradients as the two calls; u has at most 4 channels.
Tensor *nn_linear_residual_dwconv(Tape *t, Tensor *res, Tensor *u, Tensor *uw, Tensor *ub,
                                  Tensor *w, Tensor *b);
// nn_silu(nn_dwconv(x, w, b)) (gspn_hier's mixer): one pass (DWCONV_SILU) when nothing is
// recorded, as in inference; the two ops otherwise.
Tensor *nn_dwconv_silu(Tape *t, Tensor *x, Tensor *w, Tensor *b);
// nn_layernorm(nn_dwconv_residual(x, w, b), ln_w, ln_b, eps) (gspn_hier's first LPU and the norm
// after it): the norm's output, and the LPU's (the stream) in *stream; one op
// (dwconv_layernorm_fwd: the stream not read back) where nothing is recorded, the two otherwise.
Tensor *nn_dwconv_residual_layernorm(Tape *t, Tensor *x, Tensor *w, Tensor *b, Tensor *ln_w,
                                     Tensor *ln_b, float eps, Tensor **stream);
// nn_linear(nn_silu(nn_dwconv(x, cw, cb)), w, b) (the mixer's convolution, SiLU and down
// projection): recorded, the convolution's output is kept and the linear applies SiLU on the fly
// (nn_silu_linear); with nothing recorded and at most DWCONV_PROJ_MAX outputs, one op
// (dwconv_silu_proj_fwd: silu(conv) is not stored); else the convolution writes silu
// (nn_dwconv_silu) and a plain linear follows.
Tensor *nn_dwconv_silu_linear(Tape *t, Tensor *x, Tensor *cw, Tensor *cb, Tensor *w, Tensor *b);
// k x k convolution, stride, zero padding (conv2d, kernels/ops_list.h): x (B,H,W,C), or
// (B,C,H,W) images with nchw, fp32 or in w's dtype, w (Cout,C,k,k) PyTorch's layout, b (Cout) or
// NULL -> (B,Ho,Wo,Cout) channels-last in w's dtype. GSPN's stem and downsampling.
Tensor *nn_conv2d(Tape *t, Tensor *x, Tensor *w, Tensor *b, int nchw, int stride, int pad);
// nn_gelu(nn_layernorm(nn_conv2d(x, w, b, ...), ln_w, ln_b, eps), kind): where nothing is
// recorded, one op (conv2d_fwd with its norm and GELU: on the GPU the stem's kernel makes all
// three); else the three records.
Tensor *nn_conv2d_layernorm_gelu(Tape *t, Tensor *x, Tensor *w, Tensor *b, int nchw, int stride,
                                 int pad, Tensor *ln_w, Tensor *ln_b, float eps, GeluKind kind);
Tensor *nn_patch_embed(Tape *t, Tensor *img, Tensor *w, Tensor *b, int patch); // -> (B,H,W,D)
Tensor *nn_add(Tape *t, Tensor *a, Tensor *b);
Tensor *nn_scale(Tape *t, Tensor *x, float s);
Tensor *nn_add_bcast(Tape *t, Tensor *x, Tensor *p);      // x (B, ...) + p (...) 
Tensor *nn_layer_scale(Tape *t, Tensor *x, Tensor *g);
// Stochastic depth (kernels/ops.h drop_path_fwd): x itself when a->prob is 0.
Tensor *nn_drop_path(Tape *t, Tensor *x, const DropPathArgs *a);
Tensor *nn_concat_prefix(Tape *t, Tensor *prefix, Tensor *x);   // (P,C), (B,N,C) -> (B,P+N,C)
Tensor *nn_slice_tokens(Tape *t, Tensor *x, int start, int count);   // x's dtype
Tensor *nn_mean_tokens(Tape *t, Tensor *x);                // (B,N,C) -> (B,C), x's dtype
Tensor *nn_resize_bilinear(Tape *t, Tensor *x, int h2, int w2); // (B,H,W,C) -> (B,h2,w2,C)
// x converted to dtype (a copy; x itself when it already has it); the gradient flows back.
Tensor *nn_cast(Tape *t, Tensor *x, DType dtype);
// Same data, another shape of the same numel; the gradient flows through.
Tensor *nn_view(Tape *t, Tensor *x, int ndim, const int *shape);
Tensor *nn_cross_entropy(Tape *t, Tensor *logits, Tensor *targets);    // -> (1)
Tensor *nn_mse(Tape *t, Tensor *a, Tensor *b);                         // -> (1)
Tensor *nn_token_kl(Tape *t, Tensor *s, Tensor *target);               // -> (1)
// C-GSPN propagation (docs/design.md#cgspn-layer steps 3-5): xc (B,H,W,Cc), gates (B,H,W,G), merge (4)
Tensor *nn_gspn_scan(Tape *t, Tensor *xc, Tensor *gates, Tensor *merge, int shared_w);
// nn_gspn_scan(xc, nn_linear(xc, gw, gb), ...) in one op where nothing is recorded (the gates
// never in memory).
Tensor *nn_gspn_scan_proj(Tape *t, Tensor *xc, Tensor *gw, Tensor *gb, Tensor *merge, int shared_w);
