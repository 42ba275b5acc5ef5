// Layers: each owns its parameters through the parameter table (timm names) and records its
// ops on the tape. Written once against the op interface; no backend code here.
#pragma once
#include "functional.h"
#include "params.h"

typedef struct Linear { Tensor *w, *b; } Linear;                // w (out, in), b (out) or NULL
typedef struct LayerNorm { Tensor *w, *b; float eps; } LayerNorm;

typedef struct Mlp { Linear fc1, fc2; GeluKind gelu; } Mlp;     // fc2(gelu(fc1(x)))

typedef struct Attention { Linear qkv, proj; int heads; } Attention;

// DESIGN §5. x (B,H,W,C) -> y (B,H,W,C) through a latent of Cc channels.
typedef struct CgspnLayer {
    Linear down;     // (Cc, C)
    Linear gate;     // (G, Cc): lam, u, wt per direction (kernels/ops.h has the layout)
    Tensor *merge;   // (4), init 0.25
    LayerNorm norm;  // over Cc, when out_norm
    Linear up;       // (C, Cc)
    int latent, shared_w, out_norm;
} CgspnLayer;

// Linear: weight trunc_normal(std) with decay, bias zeros without (timm ViT init).
void linear_register(Linear *l, ParamTable *t, const char *prefix, int in, int out, bool bias,
                     float std);
void layernorm_register(LayerNorm *l, ParamTable *t, const char *prefix, int width, float eps);
void mlp_register(Mlp *m, ParamTable *t, const char *prefix, int width, int hidden, GeluKind g);
void attention_register(Attention *a, ParamTable *t, const char *prefix, int width, int heads,
                        bool qkv_bias);
void cgspn_layer_register(CgspnLayer *l, ParamTable *t, const char *prefix, int width,
                          int latent, int shared_w, int out_norm, float ln_eps);

Tensor *linear(Tape *t, const Linear *l, Tensor *x);
Tensor *layernorm(Tape *t, const LayerNorm *l, Tensor *x);
// res not NULL: res + mlp(x), the sum written by fc2 (one pass over the residual stream; the
// result has res's shape and dtype).
Tensor *mlp(Tape *t, const Mlp *m, Tensor *x, Tensor *res);
Tensor *attention(Tape *t, const Attention *a, Tensor *x);      // x (B,N,C)
Tensor *cgspn_layer(Tape *t, const CgspnLayer *l, Tensor *x);   // x (B,H,W,C)
// The mixing layers up to their output projection (the layer is that projection of it), for a
// block that fuses the projection with its residual add: attention's heads (B,N,C), C-GSPN's
// latent after the scan and its norm (B,H,W,Cc).
Tensor *attention_body(Tape *t, const Attention *a, Tensor *x);
Tensor *cgspn_layer_body(Tape *t, const CgspnLayer *l, Tensor *x);
// Width of the gate projection for Cc latent channels.
int cgspn_gate_width(int latent, int shared_w);
