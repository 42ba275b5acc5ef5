#include "hier.h"

#include <stdlib.h>
#include <string.h>
#include "../kernels/error.h"

static int stage_width(const EncoderConfig *c, int s) { return c->width << s; }
static int mixer_width(const EncoderConfig *c, int s) {
    return (int)(c->mixer_ratio * (float)stage_width(c, s));   // GSPN-1: int(ssm_ratio * d_model)
}
static int mlp_width(const EncoderConfig *c, int s) {
    return (int)(c->mlp_ratio * (float)stage_width(c, s));
}
static int half_up(int n) { return (n + 1) / 2; }   // 3x3, stride 2, padding 1

void hier_grids(const EncoderConfig *c, int *grid_h, int *grid_w) {
    int h = half_up(half_up(c->img_h)), w = half_up(half_up(c->img_w));
    for (int s = 0; s < HIER_STAGES; s++) {
        grid_h[s] = h, grid_w[s] = w;
        h = half_up(h), w = half_up(w);
    }
}

int hier_dwconvs(const EncoderConfig *c, HierDwconv *out, int max) {
    int gh[HIER_STAGES], gw[HIER_STAGES], n = 0;
    hier_grids(c, gh, gw);
    for (int s = 0; s < HIER_STAGES; s++)
        for (int j = 0; j < c->depths[s]; j++) {
            const HierDwconv block[3] = {{s, gh[s], gw[s], stage_width(c, s), HIER_LPU_KERNEL, true},
                                         {s, gh[s], gw[s], mixer_width(c, s), c->mixer_conv, false},
                                         {s, gh[s], gw[s], stage_width(c, s), HIER_LPU_KERNEL, true}};
            for (int q = 0; q < 3; q++, n++)
                if (n < max) out[n] = block[q];
        }
    return n;
}

static const char *const kOpNames[HIER_OPS] = {"norm1", "in_proj", "conv", "silu", "down",
                                                "gate", "scan", "up", "norm2", "mlp"};

static unsigned parse_fp32_ops(const char *list) {
    unsigned mask = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", list ? list : "");
    for (char *save = NULL, *tok = strtok_r(buf, ", ", &save); tok; tok = strtok_r(NULL, ", ", &save)) {
        bool off = tok[0] == '-';
        const char *name = tok + off;
        unsigned bits = 0;
        if (!strcmp(name, "all")) bits = (1u << HIER_OPS) - 1;
        for (int i = 0; i < HIER_OPS; i++)
            if (!strcmp(name, kOpNames[i])) bits = 1u << i;
        CG_CHECK(bits, "name ops among norm1, in_proj, conv, silu, down, gate, scan, up, norm2, "
                 "mlp, all (and -op to leave one out)", "CGSPN_FP32_OPS: unknown op '%s'", name);
        mask = off ? mask & ~bits : mask | bits;
    }
    return mask;
}

static void check_config(const EncoderConfig *c) {
    int total = 0;
    for (int s = 0; s < HIER_STAGES; s++) {
        CG_CHECK(c->depths[s] >= 1, "set depths to four block counts >= 1, e.g. depths = 1,2,9,1",
                 "gspn_hier: stage %d has %d blocks", s + 1, c->depths[s]);
        total += c->depths[s];
    }
    CG_CHECK(total <= HIER_MAX_BLOCKS, "", "gspn_hier: %d blocks, at most %d", total, HIER_MAX_BLOCKS);
    CG_CHECK(c->depth == total, "", "gspn_hier: depth %d is not the sum of depths %d", c->depth, total);
    CG_CHECK(c->width >= 2 && c->width % 2 == 0, "set width to an even embedding width (96 for T)",
             "gspn_hier: the stem's first convolution has width/2 channels; width is %d", c->width);
    CG_CHECK(c->mixer_ratio > 0 && c->mlp_ratio > 0 && mixer_width(c, 0) >= c->gspn_latent,
             "e.g. mixer_ratio = 1.5, mlp_ratio = 4", "gspn_hier: mixer_ratio %g, mlp_ratio %g",
             (double)c->mixer_ratio, (double)c->mlp_ratio);
    CG_CHECK(c->mixer_conv % 2 == 1 && c->mixer_conv >= 1 && c->mixer_conv <= 7,
             "set mixer_conv to 3, 5 or 7", "gspn_hier: mixer_conv %d", c->mixer_conv);
    CG_CHECK(!c->class_token && !c->reg_tokens && !c->pos_embed && !c->map_pool && !c->fc_norm,
             "set class_token = 0, pos_embed = 0, global_pool = avg",
             "gspn_hier has no prefix tokens or position embedding and pools the mean of its last grid");
    CG_CHECK(c->grad_checkpoint == 0, "set grad_checkpoint = 0",
             "gspn_hier does not recompute blocks yet");
    CG_CHECK(c->layer_scale_init == 0, "set layer_scale_init = 0", "gspn_hier has no LayerScale");
}

void hier_register(HierEncoder *h, const EncoderConfig *c, ParamTable *t) {
    check_config(c);
    h->fp32_ops = parse_fp32_ops(getenv("CGSPN_FP32_OPS"));
    hier_grids(c, h->grid_h, h->grid_w);
    int C = c->width;
    // GSPN-1's patch embedding v2 (its LayerNorms are nn.LayerNorm, eps 1e-5 there: ln_eps).
    conv2d_register(&h->stem1, t, "stem.conv1", c->in_chans, C / 2, 3, 2, 1, true);
    layernorm_register(&h->stem_norm1, t, "stem.norm1", C / 2, c->ln_eps);
    conv2d_register(&h->stem2, t, "stem.conv2", C / 2, C, 3, 2, 1, true);
    layernorm_register(&h->stem_norm2, t, "stem.norm2", C, c->ln_eps);
    char p[64], name[PARAM_NAME_MAX];
    int i = 0;
    for (int s = 0; s < HIER_STAGES; s++) {
        int Cs = stage_width(c, s), Ci = mixer_width(c, s);
        for (int j = 0; j < c->depths[s]; j++, i++) {
            HierBlock *b = &h->blocks[i];
            b->stage = s;
            snprintf(p, sizeof p, "stages.%d.blocks.%d", s, j);
#define NAME(leaf) (snprintf(name, sizeof name, "%s." leaf, p), name)
            dwconv_register(&b->lpu1, t, NAME("lpu1"), Cs, HIER_LPU_KERNEL, true);
            layernorm_register(&b->norm1, t, NAME("norm1"), Cs, c->ln_eps);
            linear_register(&b->in_proj, t, NAME("mixer.in_proj"), Cs, Ci, false, 0.02f);
            dwconv_register(&b->mixer_conv, t, NAME("mixer.conv"), Ci, c->mixer_conv, false);
            cgspn_layer_register(&b->gspn, t, NAME("mixer.gspn"), Ci, Cs, c->gspn_latent,
                                 c->gspn_shared_w, c->gspn_out_norm, c->ln_eps);
            dwconv_register(&b->lpu2, t, NAME("lpu2"), Cs, HIER_LPU_KERNEL, true);
            layernorm_register(&b->norm2, t, NAME("norm2"), Cs, c->ln_eps);
            mlp_register(&b->mlp, t, NAME("mlp"), Cs, mlp_width(c, s), c->gelu, c->mlp_keep_hidden);
#undef NAME
        }
        if (s < HIER_STAGES - 1) {
            snprintf(p, sizeof p, "stages.%d.downsample.conv", s);
            conv2d_register(&h->down[s], t, p, Cs, 2 * Cs, 3, 2, 1, true);
            snprintf(p, sizeof p, "stages.%d.downsample.norm", s);
            layernorm_register(&h->down_norm[s], t, p, 2 * Cs, c->ln_eps);
        }
    }
}

// The dtype op computes in: fp32 when CGSPN_FP32_OPS names it, else the activation dtype.
static DType op_dtype(const Tape *t, const HierEncoder *e, HierOp op) {
    return e->fp32_ops >> op & 1u ? DTYPE_F32 : t->ctx->act_dtype;
}
static Tensor *as_dtype(Tape *t, Tensor *x, DType dt) { return x ? nn_cast(t, x, dt) : NULL; }
static Tensor *linear_as(Tape *t, const Linear *l, Tensor *x, DType dt) {
    return nn_linear(t, as_dtype(t, x, dt), as_dtype(t, l->w, dt), as_dtype(t, l->b, dt));
}

// One block on the fp32 stream x (B,H,W,C_s); *pp receives the mixer's output when pp is set.
// The LPUs run on the stream itself (fp32 activations, bf16 weights in a bf16 run).
// dp, depth: stochastic depth over the encoder's blocks.
typedef struct HierDrop { const EncoderDropPath *dp; int depth; } HierDrop;
static Tensor *drop(Tape *t, HierDrop d, int i, int branch, Tensor *x) {
    return encoder_drop_branch(t, d.dp, d.depth, i, branch, x);
}

static Tensor *block_forward(Tape *t, const HierEncoder *e, HierDrop d, int i, Tensor *x,
                             Tensor **pp) {
    const HierBlock *b = &e->blocks[i];
    Tensor *h;
    if (op_dtype(t, e, HIER_OP_NORM1) == DTYPE_F32) {
        x = nn_dwconv_residual(t, x, b->lpu1.w, b->lpu1.b);
        h = layernorm_f32(t, &b->norm1, x);
    } else {   // the LPU and the norm in one pass where nothing is recorded
        h = nn_dwconv_residual_layernorm(t, x, b->lpu1.w, b->lpu1.b, b->norm1.w, b->norm1.b,
                                         b->norm1.eps, &x);
    }
    Tensor *v = linear_as(t, &b->in_proj, h, op_dtype(t, e, HIER_OP_IN_PROJ));   // (B,H,W,Ci)
    DType dt = op_dtype(t, e, HIER_OP_CONV);
    const Conv2d *mc = &b->mixer_conv;
    v = as_dtype(t, v, dt);
    const CgspnLayer *g = &b->gspn;
    Tensor *xc;                                                                  // (B,H,W,Cc)
    if (dt == op_dtype(t, e, HIER_OP_SILU) && dt == op_dtype(t, e, HIER_OP_DOWN)) {
        xc = nn_dwconv_silu_linear(t, v, as_dtype(t, mc->w, dt), as_dtype(t, mc->b, dt),
                                   as_dtype(t, g->down.w, dt), as_dtype(t, g->down.b, dt));
    } else {   // the ops in different dtypes (CGSPN_FP32_OPS)
        v = nn_dwconv(t, v, as_dtype(t, mc->w, dt), as_dtype(t, mc->b, dt));
        v = nn_silu(t, as_dtype(t, v, op_dtype(t, e, HIER_OP_SILU)));
        xc = linear_as(t, &g->down, v, op_dtype(t, e, HIER_OP_DOWN));
    }
    const DType gdt = op_dtype(t, e, HIER_OP_GATE);
    dt = op_dtype(t, e, HIER_OP_SCAN);
    // merge: four fp32 scalars whatever dt is (kept fp32 in a bf16 table, nn/params.h)
    Tensor *merge = as_dtype(t, g->merge, DTYPE_F32), *yc;
    if (gdt == dt) {   // the gates (B,H,W,G) made inside the scan where nothing is recorded
        yc = nn_gspn_scan_proj(t, as_dtype(t, xc, dt), as_dtype(t, g->gate.w, dt), as_dtype(t, g->gate.b, dt),
                               merge, g->shared_w);
    } else {
        Tensor *gates = linear_as(t, &g->gate, xc, gdt);   // (B,H,W,G)
        yc = nn_gspn_scan(t, as_dtype(t, xc, dt), as_dtype(t, gates, dt), merge, g->shared_w);
    }
    if (g->out_norm) yc = layernorm(t, &g->norm, yc);
    if (!pp && !encoder_drop_active(t, d.dp, d.depth) &&
        op_dtype(t, e, HIER_OP_UP) == t->ctx->act_dtype) {   // x + mix and the LPU in one pass
        x = nn_linear_residual_dwconv(t, x, as_dtype(t, yc, t->ctx->act_dtype), g->up.w, g->up.b,
                                      b->lpu2.w, b->lpu2.b);
    } else {
        Tensor *mix = linear_as(t, &g->up, yc, op_dtype(t, e, HIER_OP_UP));    // (B,H,W,C_s)
        if (pp) *pp = mix = as_dtype(t, mix, t->ctx->act_dtype);
        x = nn_add(t, x, drop(t, d, i, 0, mix));
        x = nn_dwconv_residual(t, x, b->lpu2.w, b->lpu2.b);
    }
    dt = op_dtype(t, e, HIER_OP_MLP);
    if (op_dtype(t, e, HIER_OP_NORM2) == t->ctx->act_dtype && dt == t->ctx->act_dtype &&
        !encoder_drop_active(t, d.dp, d.depth))
        return layernorm_mlp(t, &b->norm2, &b->mlp, x);
    Tensor *h2 = op_dtype(t, e, HIER_OP_NORM2) == DTYPE_F32
                     ? layernorm_f32(t, &b->norm2, x)
                     : layernorm(t, &b->norm2, x);
    if (dt == DTYPE_F32 && t->ctx->act_dtype != DTYPE_F32) {
        const Mlp *m = &b->mlp;
        Tensor *y = nn_mlp(t, as_dtype(t, h2, dt), as_dtype(t, m->fc1.w, dt),
                           as_dtype(t, m->fc1.b, dt), as_dtype(t, m->fc2.w, dt),
                           as_dtype(t, m->fc2.b, dt), m->gelu, m->keep_hidden);
        return nn_add(t, x, drop(t, d, i, 1, y));
    }
    h2 = as_dtype(t, h2, dt);
    if (!encoder_drop_active(t, d.dp, d.depth)) return mlp(t, &b->mlp, h2, x);
    return nn_add(t, x, drop(t, d, i, 1, mlp(t, &b->mlp, h2, NULL)));
}

static Tensor *tokens_view(Tape *t, Tensor *x) {   // (B,H,W,C) -> (B,H*W,C)
    return nn_view(t, x, 3, (int[]){x->shape[0], x->shape[1] * x->shape[2], x->shape[3]});
}

Tensor *hier_forward(Tape *t, const HierEncoder *h, const EncoderConfig *c,
                     const EncoderDropPath *dp, Tensor *img, Tensor **pp, Tensor **pb) {
    const HierDrop d = {dp, c->depth};
    CG_CHECK(img->ndim == 4 && img->shape[1] == c->in_chans && img->shape[2] == c->img_h &&
                 img->shape[3] == c->img_w,
             "check img_size and in_chans", "images of shape (%d,%d,%d,%d), the encoder expects "
             "(B,%d,%d,%d)", img->shape[0], img->shape[1], img->shape[2], img->shape[3],
             c->in_chans, c->img_h, c->img_w);
    Tensor *x = conv2d_layernorm_gelu(t, &h->stem1, &h->stem_norm1, img, 1);
    // The residual stream is fp32, as in the isotropic encoders; the norms that start it write
    // fp32 (PyTorch's autocast runs them in fp32): their gradient is not rounded to bf16 before
    // their backward, whose cancellations would magnify it.
    x = layernorm_f32(t, &h->stem_norm2, conv2d(t, &h->stem2, x, 0));
    int i = 0;
    for (int s = 0; s < HIER_STAGES; s++) {
        for (int j = 0; j < c->depths[s]; j++, i++) {
            Tensor *mix = NULL;
            x = block_forward(t, h, d, i, x, pp ? &mix : NULL);
            if (pp) pp[i] = tokens_view(t, mix);
            if (pb) pb[i] = tokens_view(t, x);
        }
        if (s < HIER_STAGES - 1)
            x = layernorm_f32(t, &h->down_norm[s], conv2d(t, &h->down[s], x, 0));
    }
    return tokens_view(t, x);
}

double hier_macs_per_image(const EncoderConfig *c) {
    int gh[HIER_STAGES], gw[HIER_STAGES];
    hier_grids(c, gh, gw);
    double C = c->width, Cc = c->gspn_latent;
    double G = c->gspn_shared_w ? 4 * (2 * Cc + 3) : 20 * Cc;
    double n1 = (double)half_up(c->img_h) * half_up(c->img_w);
    double macs = n1 * 9 * c->in_chans * (C / 2) + (double)gh[0] * gw[0] * 9 * (C / 2) * C;
    for (int s = 0; s < HIER_STAGES; s++) {
        double N = (double)gh[s] * gw[s], Cs = stage_width(c, s), Ci = mixer_width(c, s);
        double k2 = (double)c->mixer_conv * c->mixer_conv, lpu = HIER_LPU_KERNEL * HIER_LPU_KERNEL;
        double block = 2 * lpu * Cs + Cs * Ci + k2 * Ci + Ci * Cc + Cc * G + 4 * 5 * Cc + Cc * Cs +
                       2 * Cs * mlp_width(c, s);
        macs += c->depths[s] * N * block;
        if (s < HIER_STAGES - 1) macs += (double)gh[s + 1] * gw[s + 1] * 9 * Cs * 2 * Cs;
    }
    return macs + encoder_out_width(c) * (double)c->num_classes;
}
