// Layers: each owns its parameters through the parameter table (timm names) and records its
// ops on the tape. Written once against the op interface; no backend code here.
#pragma once
#include "functional.h"
#include "params.h"

typedef struct Linear { Tensor *w, *b; } Linear;                // w (out, in), b (out) or NULL
typedef struct LayerNorm { Tensor *w, *b; float eps; } LayerNorm;

typedef struct Mlp {   // fc2(gelu(fc1(x)))
    Linear fc1, fc2;
    GeluKind gelu;
    bool keep_hidden;   // backward reads the forward's gelu(fc1(x)) instead of making it again
} Mlp;

typedef struct Attention { Linear qkv, proj; int heads; } Attention;

// A convolution: w (Cout, Cin, k, k) PyTorch's layout, Cin = 1 for a depthwise one; b (Cout) or
// NULL. A dense one has a stride and zero padding; a depthwise one is stride 1, padding k/2.
typedef struct Conv2d { Tensor *w, *b; int stride, pad; } Conv2d;

// docs/design.md#cgspn-layer. x (B,H,W,C) -> y (B,H,W,C_out) through a latent of Cc channels (C_out = C but in a
// hierarchical encoder's mixer, nn/hier.h).
typedef struct CgspnLayer {
    Linear down;     // (Cc, C)
    Linear gate;     // (G, Cc): lam, u, wt per direction (kernels/ops.h has the layout)
    Tensor *merge;   // (4), init 0.25
    LayerNorm norm;  // over Cc, when out_norm
    Linear up;       // (C_out, Cc)
    int latent, shared_w, out_norm;
} CgspnLayer;

// Linear: weight trunc_normal(std) with decay, bias zeros without (timm ViT init).
void linear_register(Linear *l, ParamTable *t, const char *prefix, int in, int out, bool bias,
                     float std);
void layernorm_register(LayerNorm *l, ParamTable *t, const char *prefix, int width, float eps);
void mlp_register(Mlp *m, ParamTable *t, const char *prefix, int width, int hidden, GeluKind g,
                  bool keep_hidden);
void attention_register(Attention *a, ParamTable *t, const char *prefix, int width, int heads,
                        bool qkv_bias);
// x (B,H,W,width) -> (B,H,W,out_width): out_width is width in a block, C in a hierarchical
// mixer whose layer reads its inner width.
// PyTorch's Conv2d init (fan-in uniform weight and bias), weight decayed.
void conv2d_register(Conv2d *c, ParamTable *t, const char *prefix, int in, int out, int k,
                     int stride, int pad, bool bias);
void dwconv_register(Conv2d *c, ParamTable *t, const char *prefix, int channels, int k, bool bias);
void cgspn_layer_register(CgspnLayer *l, ParamTable *t, const char *prefix, int width,
                          int out_width, int latent, int shared_w, int out_norm, float ln_eps);

Tensor *linear(Tape *t, const Linear *l, Tensor *x);
Tensor *layernorm(Tape *t, const LayerNorm *l, Tensor *x);
// The same writing fp32 whatever the activation dtype (nn_layernorm_f32): for a norm whose output
// starts an fp32 stream or is the model's output, as PyTorch's autocast runs layer_norm.
Tensor *layernorm_f32(Tape *t, const LayerNorm *l, Tensor *x);
// res not NULL: res + mlp(x), the sum written by fc2 (one pass over the residual stream; the
// result has res's shape and dtype).
Tensor *mlp(Tape *t, const Mlp *m, Tensor *x, Tensor *res);
// res + mlp(layernorm(res)), the norm's output in the activation dtype (nn_layernorm_mlp_residual:
// one op where nothing is recorded).
Tensor *layernorm_mlp(Tape *t, const LayerNorm *l, const Mlp *m, Tensor *res);
Tensor *attention(Tape *t, const Attention *a, Tensor *x);      // x (B,N,C)
Tensor *cgspn_layer(Tape *t, const CgspnLayer *l, Tensor *x);   // x (B,H,W,C)
// x (B,H,W,C), or (B,C,H,W) images with nchw -> (B,Ho,Wo,Cout) in the activation dtype.
Tensor *conv2d(Tape *t, const Conv2d *c, Tensor *x, int nchw);
// gelu(layernorm(conv2d(x))), the erf GELU (nn_conv2d_layernorm_gelu: one op where nothing is
// recorded).
Tensor *conv2d_layernorm_gelu(Tape *t, const Conv2d *c, const LayerNorm *l, Tensor *x, int nchw);
Tensor *dwconv(Tape *t, const Conv2d *c, Tensor *x);             // (B,H,W,C), x's dtype
// The mixing layers up to their output projection (the layer is that projection of it), for a
// block that fuses the projection with its residual add: attention's heads (B,N,C), C-GSPN's
// latent after the scan and its norm (B,H,W,Cc).
Tensor *attention_body(Tape *t, const Attention *a, Tensor *x);
Tensor *cgspn_layer_body(Tape *t, const CgspnLayer *l, Tensor *x);
// Width of the gate projection for Cc latent channels.
int cgspn_gate_width(int latent, int shared_w);
