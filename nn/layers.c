#include "layers.h"
#include "../kernels/error.h"

static void pname(char *buf, size_t n, const char *prefix, const char *leaf) {
    int len = snprintf(buf, n, "%s%s%s", prefix, prefix[0] ? "." : "", leaf);
    CG_CHECK(len >= 0 && (size_t)len < n, "", "parameter name too long: %s.%s", prefix, leaf);
}

void linear_register(Linear *l, ParamTable *t, const char *prefix, int in, int out, bool bias,
                     float std) {
    char name[PARAM_NAME_MAX];
    pname(name, sizeof(name), prefix, "weight");
    l->w = params_add(t, name, 2, (int[]){out, in}, INIT_TRUNC_NORMAL, std, true);
    l->b = NULL;
    if (bias) {
        pname(name, sizeof(name), prefix, "bias");
        l->b = params_add(t, name, 1, (int[]){out}, INIT_ZEROS, 0, false);
    }
}

void layernorm_register(LayerNorm *l, ParamTable *t, const char *prefix, int width, float eps) {
    char name[PARAM_NAME_MAX];
    pname(name, sizeof(name), prefix, "weight");
    l->w = params_add(t, name, 1, (int[]){width}, INIT_ONES, 0, false);
    pname(name, sizeof(name), prefix, "bias");
    l->b = params_add(t, name, 1, (int[]){width}, INIT_ZEROS, 0, false);
    params_keep_f32(t, l->w);   // autocast keeps norms fp32 (nn/params.h)
    params_keep_f32(t, l->b);
    l->eps = eps;
}

void mlp_register(Mlp *m, ParamTable *t, const char *prefix, int width, int hidden, GeluKind g,
                  bool keep_hidden) {
    char name[PARAM_NAME_MAX];
    pname(name, sizeof(name), prefix, "fc1");
    linear_register(&m->fc1, t, name, width, hidden, true, 0.02f);
    pname(name, sizeof(name), prefix, "fc2");
    linear_register(&m->fc2, t, name, hidden, width, true, 0.02f);
    m->gelu = g;
    m->keep_hidden = keep_hidden;
}

void attention_register(Attention *a, ParamTable *t, const char *prefix, int width, int heads,
                        bool qkv_bias) {
    CG_CHECK(heads > 0 && width % heads == 0, "width must be divisible by heads",
             "attention width %d, heads %d", width, heads);
    char name[PARAM_NAME_MAX];
    pname(name, sizeof(name), prefix, "qkv");
    linear_register(&a->qkv, t, name, width, 3 * width, qkv_bias, 0.02f);
    pname(name, sizeof(name), prefix, "proj");
    linear_register(&a->proj, t, name, width, width, true, 0.02f);
    a->heads = heads;
}

void conv2d_register(Conv2d *c, ParamTable *t, const char *prefix, int in, int out, int k,
                     int stride, int pad, bool bias) {
    char name[PARAM_NAME_MAX];
    pname(name, sizeof(name), prefix, "weight");
    c->w = params_add(t, name, 4, (int[]){out, in, k, k}, INIT_FAN_IN_UNIFORM, 0, true);
    c->b = NULL;
    if (bias) {
        pname(name, sizeof(name), prefix, "bias");
        c->b = params_add(t, name, 1, (int[]){out}, INIT_FAN_IN_UNIFORM, (float)(in * k * k), false);
    }
    c->stride = stride;
    c->pad = pad;
}

void dwconv_register(Conv2d *c, ParamTable *t, const char *prefix, int channels, int k, bool bias) {
    CG_CHECK(k % 2 == 1 && k <= 7, "a depthwise kernel of 1, 3, 5 or 7", "%s: kernel %d", prefix, k);
    conv2d_register(c, t, prefix, 1, channels, k, 1, k / 2, bias);
}

int cgspn_gate_width(int latent, int shared_w) {
    return shared_w ? 4 * (2 * latent + 3) : 20 * latent;
}

void cgspn_layer_register(CgspnLayer *l, ParamTable *t, const char *prefix, int width,
                          int out_width, int latent, int shared_w, int out_norm, float ln_eps) {
    CG_CHECK(latent > 0 && latent <= width, "set gspn_latent between 1 and width",
             "C-GSPN latent channels %d for width %d", latent, width);
    // A LayerNorm over 1 or 2 channels maps every position to (about) +-1 whatever the scan
    // computed: it would erase the propagation and its gradient.
    CG_CHECK(!out_norm || latent >= 3, "set gspn_out_norm = 0 with gspn_latent 1 or 2",
             "%s: a LayerNorm over %d latent channels", prefix, latent);
    char name[PARAM_NAME_MAX];
    pname(name, sizeof(name), prefix, "down");
    linear_register(&l->down, t, name, width, latent, true, 0.02f);
    // The gates set the scan's scale (lam, u) and its weights; PyTorch's default Linear init
    // (fan-in uniform) keeps them O(1) at the start instead of ~0.02.
    int G = cgspn_gate_width(latent, shared_w);
    pname(name, sizeof(name), prefix, "gate.weight");
    l->gate.w = params_add(t, name, 2, (int[]){G, latent}, INIT_FAN_IN_UNIFORM, 0, true);
    pname(name, sizeof(name), prefix, "gate.bias");
    l->gate.b = params_add(t, name, 1, (int[]){G}, INIT_ZEROS, 0, false);
    pname(name, sizeof(name), prefix, "merge");
    l->merge = params_add(t, name, 1, (int[]){4}, INIT_CONST, 0.25f, false);
    params_keep_f32(t, l->merge);   // read by the scan as a scalar, never by a GEMM
    if (out_norm) {
        pname(name, sizeof(name), prefix, "norm");
        layernorm_register(&l->norm, t, name, latent, ln_eps);
    }
    pname(name, sizeof(name), prefix, "up");
    linear_register(&l->up, t, name, latent, out_width, true, 0.02f);
    l->latent = latent;
    l->shared_w = shared_w;
    l->out_norm = out_norm;
}

Tensor *linear(Tape *t, const Linear *l, Tensor *x) { return nn_linear(t, x, l->w, l->b); }

Tensor *layernorm(Tape *t, const LayerNorm *l, Tensor *x) {
    return nn_layernorm(t, x, l->w, l->b, l->eps);
}

Tensor *layernorm_f32(Tape *t, const LayerNorm *l, Tensor *x) {
    return nn_layernorm_f32(t, x, l->w, l->b, l->eps);
}

Tensor *mlp(Tape *t, const Mlp *m, Tensor *x, Tensor *res) {
    if (res)
        return nn_mlp_residual(t, res, x, m->fc1.w, m->fc1.b, m->fc2.w, m->fc2.b, m->gelu,
                               m->keep_hidden);
    return nn_mlp(t, x, m->fc1.w, m->fc1.b, m->fc2.w, m->fc2.b, m->gelu, m->keep_hidden);
}

Tensor *layernorm_mlp(Tape *t, const LayerNorm *l, const Mlp *m, Tensor *res) {
    return nn_layernorm_mlp_residual(t, res, l->w, l->b, l->eps, m->fc1.w, m->fc1.b, m->fc2.w,
                                     m->fc2.b, m->gelu, m->keep_hidden);
}

Tensor *attention_body(Tape *t, const Attention *a, Tensor *x) {
    Tensor *qkv = linear(t, &a->qkv, x);          // (B,N,3C)
    return nn_attention(t, qkv, a->heads);        // (B,N,C)
}

Tensor *attention(Tape *t, const Attention *a, Tensor *x) {
    return linear(t, &a->proj, attention_body(t, a, x));
}

Tensor *cgspn_layer_body(Tape *t, const CgspnLayer *l, Tensor *x) {
    Tensor *xc = linear(t, &l->down, x);          // (B,H,W,Cc)
    Tensor *g = linear(t, &l->gate, xc);          // (B,H,W,G)
    Tensor *yc = nn_gspn_scan(t, xc, g, l->merge, l->shared_w);
    return l->out_norm ? layernorm(t, &l->norm, yc) : yc;
}

Tensor *cgspn_layer(Tape *t, const CgspnLayer *l, Tensor *x) {
    return linear(t, &l->up, cgspn_layer_body(t, l, x));   // (B,H,W,C)
}

Tensor *conv2d(Tape *t, const Conv2d *c, Tensor *x, int nchw) {
    return nn_conv2d(t, x, c->w, c->b, nchw, c->stride, c->pad);
}

Tensor *conv2d_layernorm_gelu(Tape *t, const Conv2d *c, const LayerNorm *l, Tensor *x, int nchw) {
    return nn_conv2d_layernorm_gelu(t, x, c->w, c->b, nchw, c->stride, c->pad, l->w, l->b, l->eps,
                                    GELU_ERF);
}

Tensor *dwconv(Tape *t, const Conv2d *c, Tensor *x) { return nn_dwconv(t, x, c->w, c->b); }
