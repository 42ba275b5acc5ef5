#include "encoder.h"
#include "../kernels/error.h"

void encoder_register(Encoder *e, const EncoderConfig *cfg, ParamTable *t) {
    memset(e, 0, sizeof(*e));
    e->cfg = *cfg;
    if (cfg->kind == ENCODER_GSPN_HIER) {
        hier_register(&e->hier, cfg, t);
        e->grid_h = e->hier.grid_h[HIER_STAGES - 1];
        e->grid_w = e->hier.grid_w[HIER_STAGES - 1];
        e->prefix = 0;
        int Cl = encoder_out_width(cfg);
        layernorm_register(&e->norm, t, "norm", Cl, cfg->ln_eps);
        if (cfg->num_classes > 0) linear_register(&e->head, t, "head", Cl, cfg->num_classes, true, 0.02f);
        return;
    }
    CG_CHECK(cfg->depth >= 1 && cfg->depth <= ENCODER_MAX_DEPTH, "", "depth %d not in [1, %d]",
             cfg->depth, ENCODER_MAX_DEPTH);
    CG_CHECK(cfg->patch > 0 && cfg->img_h % cfg->patch == 0 && cfg->img_w % cfg->patch == 0,
             "set img_size to a multiple of patch", "image %dx%d with patch %d", cfg->img_h,
             cfg->img_w, cfg->patch);
    e->grid_h = cfg->img_h / cfg->patch;
    e->grid_w = cfg->img_w / cfg->patch;
    int C = cfg->width;
    bool vit = cfg->kind == ENCODER_VIT;
    e->prefix = vit ? (cfg->class_token ? 1 : 0) + cfg->reg_tokens : 0;
    CG_CHECK(vit || (!cfg->class_token && !cfg->reg_tokens),
             "set class_token = 0 and reg_tokens = 0 for C-GSPN and hybrid encoders",
             "C-GSPN propagation runs on the token grid and has no class or register tokens");
    CG_CHECK(cfg->reg_tokens >= 0 && cfg->reg_tokens <= 64, "e.g. reg_tokens = 4 (DINOv2 reg4)",
             "reg_tokens %d not in [0, 64]", cfg->reg_tokens);
    CG_CHECK(!cfg->fc_norm || cfg->avg_pool || !cfg->class_token, "set global_pool = avg with fc_norm",
             "fc_norm norms the mean of the patch tokens (timm: global_pool avg), not the class token");

    // PyTorch's Conv2d layout (D, Cin, p, p) and default init (fan-in uniform), as in timm.
    e->patch_embed.w = params_add(t, "patch_embed.proj.weight", 4,
                                  (int[]){C, cfg->in_chans, cfg->patch, cfg->patch},
                                  INIT_FAN_IN_UNIFORM, 0, true);
    // timm ties the patch embedding's bias to norm_pre (bias = not pre_norm: CLIP's conv1 has none).
    if (!cfg->norm_pre)
        e->patch_embed.b = params_add(t, "patch_embed.proj.bias", 1, (int[]){C}, INIT_FAN_IN_UNIFORM,
                                      (float)(cfg->in_chans * cfg->patch * cfg->patch), false);
    if (vit && cfg->class_token)
        e->cls_token = params_add(t, "cls_token", 2, (int[]){1, C}, INIT_TRUNC_NORMAL, 1e-6f, false);
    if (vit && cfg->reg_tokens)
        e->reg_token = params_add(t, "reg_token", 2, (int[]){cfg->reg_tokens, C}, INIT_TRUNC_NORMAL,
                                  1e-6f, false);
    if (vit && cfg->pos_embed) {
        int embedded = (cfg->no_embed_class ? 0 : e->prefix) + e->grid_h * e->grid_w;
        e->pos_embed = params_add(t, "pos_embed", 2, (int[]){embedded, C}, INIT_TRUNC_NORMAL,
                                  0.02f, false);
    }
    if (cfg->norm_pre) layernorm_register(&e->norm_pre, t, "norm_pre", C, cfg->ln_eps);
    for (int i = 0; i < cfg->depth; i++) {
        Block *b = &e->blocks[i];
        char p[32], name[PARAM_NAME_MAX];   // "blocks.N" fits in 32
        snprintf(p, sizeof(p), "blocks.%d", i);
        snprintf(name, sizeof(name), "%s.norm1", p);
        layernorm_register(&b->norm1, t, name, C, cfg->ln_eps);
        b->is_attention = encoder_block_is_attention(cfg, i);
        if (b->is_attention) {
            snprintf(name, sizeof(name), "%s.attn", p);
            attention_register(&b->attn, t, name, C, cfg->heads, cfg->qkv_bias);
        } else {
            snprintf(name, sizeof(name), "%s.gspn", p);
            cgspn_layer_register(&b->gspn, t, name, C, C, cfg->gspn_latent, cfg->gspn_shared_w,
                                 cfg->gspn_out_norm, cfg->ln_eps);
        }
        if (cfg->layer_scale_init > 0) {
            snprintf(name, sizeof(name), "%s.ls1.gamma", p);
            b->ls1 = params_add(t, name, 1, (int[]){C}, INIT_CONST, cfg->layer_scale_init, false);
        }
        snprintf(name, sizeof(name), "%s.norm2", p);
        layernorm_register(&b->norm2, t, name, C, cfg->ln_eps);
        snprintf(name, sizeof(name), "%s.mlp", p);
        mlp_register(&b->mlp, t, name, C, cfg->mlp_hidden, cfg->gelu, cfg->mlp_keep_hidden);
        if (cfg->layer_scale_init > 0) {
            snprintf(name, sizeof(name), "%s.ls2.gamma", p);
            b->ls2 = params_add(t, name, 1, (int[]){C}, INIT_CONST, cfg->layer_scale_init, false);
        }
    }
    layernorm_register(&e->norm, t, cfg->fc_norm ? "fc_norm" : "norm", C, cfg->ln_eps);
    if (cfg->map_pool) {
        CG_CHECK(!cfg->fc_norm, "set fc_norm = 0 with global_pool = map", "a MAP head has no fc_norm");
        MapPool *m = &e->map;
        m->latent = params_add(t, "attn_pool.latent", 2, (int[]){1, C}, INIT_TRUNC_NORMAL, 0.02f, false);
        linear_register(&m->q, t, "attn_pool.q", C, C, cfg->qkv_bias, 0.02f);
        linear_register(&m->kv, t, "attn_pool.kv", C, 2 * C, cfg->qkv_bias, 0.02f);
        linear_register(&m->proj, t, "attn_pool.proj", C, C, true, 0.02f);
        layernorm_register(&m->norm, t, "attn_pool.norm", C, cfg->ln_eps);
        mlp_register(&m->mlp, t, "attn_pool.mlp", C, cfg->mlp_hidden, cfg->gelu, false);   // forward only
    }
    if (cfg->num_classes > 0) linear_register(&e->head, t, "head", C, cfg->num_classes, true, 0.02f);
}

// The residual stream is fp32 (as under PyTorch autocast): bf16 rounding of x at every add
// would compound over deep models. Each sublayer reads it through its LayerNorm, which reads the
// fp32 stream and writes the activation dtype (no separate cast pass).


Tensor *encoder_drop_path(Tape *t, const Encoder *e, int i, int branch, Tensor *x) {
    return encoder_drop_branch(t, &e->drop_path, e->cfg.depth, i, branch, x);
}

static Tensor *block_drop_path(Tape *t, const Encoder *e, const Block *b, int branch, Tensor *x) {
    return encoder_drop_path(t, e, (int)(b - e->blocks), branch, x);
}

// The mixing layer on the sublayer input h (B,T,C): its output (B,T,C), or with `out` its body
// (attention_body, cgspn_layer_body) and *out its output projection.
static Tensor *block_mix(Tape *t, const Encoder *e, const Block *b, Tensor *h, const Linear **out) {
    if (b->is_attention) {
        if (!out) return attention(t, &b->attn, h);
        *out = &b->attn.proj;
        return attention_body(t, &b->attn, h);
    }
    int B = h->shape[0], T = h->shape[1], C = h->shape[2];
    Tensor *grid = nn_view(t, h, 4, (int[]){B, e->grid_h, e->grid_w, C});
    if (!out) return nn_view(t, cgspn_layer(t, &b->gspn, grid), 3, (int[]){B, T, C});
    *out = &b->gspn.up;
    return cgspn_layer_body(t, &b->gspn, grid);
}

Tensor *encoder_block_forward(Tape *t, const Encoder *e, const Block *b, Tensor *x, Tensor **pp) {
    // Without a tap, layer scale or an active drop path, each residual add is fused: the mixing
    // layer's output projection, the add and norm2 in one pass over the fp32 stream
    // (nn_linear_add_layernorm), and fc2 writes x + MLP itself (nn_mlp_residual).
    bool plain = !encoder_drop_active(t, &e->drop_path, e->cfg.depth);
    Tensor *h = layernorm(t, &b->norm1, x), *h2;
    if (!pp && !b->ls1 && plain) {
        const Linear *out;
        Tensor *body = block_mix(t, e, b, h, &out);
        x = nn_linear_add_layernorm(t, x, body, out->w, out->b, b->norm2.w, b->norm2.b,
                                    b->norm2.eps, &h2);
    } else {
        Tensor *mix = block_mix(t, e, b, h, NULL);
        if (pp) *pp = mix;
        if (b->ls1) mix = nn_layer_scale(t, mix, b->ls1);
        x = nn_add(t, x, block_drop_path(t, e, b, 0, mix));
        h2 = layernorm(t, &b->norm2, x);
    }
    if (!b->ls2 && plain) return mlp(t, &b->mlp, h2, x);
    Tensor *m = mlp(t, &b->mlp, h2, NULL);
    if (b->ls2) m = nn_layer_scale(t, m, b->ls2);
    return nn_add(t, x, block_drop_path(t, e, b, 1, m));
}

Tensor *encoder_embed(Tape *t, const Encoder *e, Tensor *img) {
    const EncoderConfig *c = &e->cfg;
    CG_CHECK(img->ndim == 4 && img->shape[1] == c->in_chans && img->shape[2] == c->img_h &&
                 img->shape[3] == c->img_w,
             "check img_size and in_chans", "images of shape (%d,%d,%d,%d), the encoder expects "
             "(B,%d,%d,%d)", img->shape[0], img->shape[1], img->shape[2], img->shape[3],
             c->in_chans, c->img_h, c->img_w);
    int B = img->shape[0], N = e->grid_h * e->grid_w;
    Tensor *x = nn_patch_embed(t, img, e->patch_embed.w, e->patch_embed.b, c->patch); // (B,H,W,C)
    x = nn_view(t, x, 3, (int[]){B, N, c->width});
    // timm's _pos_embed: [class, registers, patches]; pos_embed added after the prefix tokens
    // are prepended, or with no_embed_class to the patch tokens before.
    if (e->pos_embed && c->no_embed_class) x = nn_add_bcast(t, x, e->pos_embed);
    if (e->reg_token) x = nn_concat_prefix(t, e->reg_token, x);
    if (e->cls_token) x = nn_concat_prefix(t, e->cls_token, x);
    if (e->pos_embed && !c->no_embed_class) x = nn_add_bcast(t, x, e->pos_embed);
    if (c->norm_pre) x = layernorm(t, &e->norm_pre, x);
    return nn_cast(t, x, DTYPE_F32);
}

bool encoder_block_is_checkpointed(const EncoderConfig *cfg, int i) {
    return cfg->grad_checkpoint > 0 && i % cfg->grad_checkpoint == 0;
}

// A block as a checkpointed segment (nn/tape.h): outs[0] the block's output, outs[1] its
// mixing layer's output when a tap wants it. Recomputed in backward with the same drop-path
// masks: they are a function of the encoder's drop_path fields, unchanged within a step.
typedef struct { const Encoder *e; const Block *b; bool want_pp; } BlockSegment;
static void block_segment(Tape *t, const void *arg, Tensor *x, Tensor **outs) {
    const BlockSegment *s = arg;
    outs[0] = encoder_block_forward(t, s->e, s->b, x, s->want_pp ? &outs[1] : NULL);
}

// Block i from x, checkpointed when the config asks for it.
static Tensor *block_forward_planned(Tape *t, const Encoder *e, int i, Tensor *x, Tensor **pp) {
    if (!encoder_block_is_checkpointed(&e->cfg, i) || !t->grad_enabled)
        return encoder_block_forward(t, e, &e->blocks[i], x, pp);
    BlockSegment s = {e, &e->blocks[i], pp != NULL};
    Tensor *outs[2];
    tape_checkpoint(t, block_segment, &s, sizeof s, x, pp ? 2 : 1, outs);
    if (pp) *pp = outs[1];
    return outs[0];
}

Tensor *encoder_forward(Tape *t, const Encoder *e, Tensor *img, EncoderTaps *taps) {
    // gspn_hier's final norm writes fp32, as autocast's layer_norm does: a gradient that a loss on
    // the tokens hands it (a feature probe, an MSE) reaches its backward unrounded, where the
    // cancellations of the norm's backward would magnify a bf16 rounding.
    if (e->cfg.kind == ENCODER_GSPN_HIER)
        return layernorm_f32(t, &e->norm, hier_forward(t, &e->hier, &e->cfg, &e->drop_path, img,
                                                       taps ? taps->pp : NULL, taps ? taps->pb : NULL));
    Tensor *x = encoder_embed(t, e, img);
    for (int i = 0; i < e->cfg.depth; i++) {
        x = block_forward_planned(t, e, i, x, taps ? &taps->pp[i] : NULL);
        if (taps) taps->pb[i] = x;
    }
    return encoder_final_norm(t, e, x);
}

Tensor *encoder_final_norm(Tape *t, const Encoder *e, Tensor *x) {
    return e->cfg.fc_norm ? x : layernorm(t, &e->norm, x);
}

int encoder_set_image_size_err(Encoder *e, int img_h, int img_w, char *err, size_t n) {
    if (e->cfg.kind == ENCODER_GSPN_HIER) {
        if (img_h <= 0 || img_w <= 0)
            return cg_set_error(err, n, "image %dx%d: not a positive size", img_h, img_w);
        e->cfg.img_h = img_h;
        e->cfg.img_w = img_w;
        hier_grids(&e->cfg, e->hier.grid_h, e->hier.grid_w);
        e->grid_h = e->hier.grid_h[HIER_STAGES - 1];
        e->grid_w = e->hier.grid_w[HIER_STAGES - 1];
        return 0;
    }
    int p = e->cfg.patch;
    if (img_h <= 0 || img_w <= 0 || img_h % p != 0 || img_w % p != 0)
        return cg_set_error(err, n, "image %dx%d: not a positive multiple of the patch %d\n  hint: "
                            "every resolution must be a multiple of patch (e.g. 378, 518 at patch 14)",
                            img_h, img_w, p);
    if (e->pos_embed && (img_h / p != e->grid_h || img_w / p != e->grid_w))
        return cg_set_error(err, n, "a %dx%d-token position embedding cannot run on %dx%d tokens\n  "
                            "hint: only encoders without pos_embed (C-GSPN, hybrid) change resolution "
                            "from step to step", e->grid_h, e->grid_w, img_h / p, img_w / p);
    e->cfg.img_h = img_h;
    e->cfg.img_w = img_w;
    e->grid_h = img_h / p;
    e->grid_w = img_w / p;
    return 0;
}

void encoder_set_image_size(Encoder *e, int img_h, int img_w) {
    char err[512];
    if (encoder_set_image_size_err(e, img_h, img_w, err, sizeof err) != 0) CG_FAIL("", "%s", err);
}

// timm AttentionPoolLatent (one latent, pool 'token'): tokens (B,N,C) -> (B,C).
static Tensor *map_pool(Tape *t, const Encoder *e, Tensor *tokens) {
    const MapPool *m = &e->map;
    Tensor *q = linear(t, &m->q, m->latent);                                   // (1,C)
    Tensor *kv = linear(t, &m->kv, tokens);                                    // (B,N,2C)
    Tensor *x = linear(t, &m->proj, nn_attention_pool(t, q, kv, e->cfg.heads)); // (B,C)
    return mlp(t, &m->mlp, layernorm(t, &m->norm, x), nn_cast(t, x, DTYPE_F32));
}

Tensor *encoder_pool(Tape *t, const Encoder *e, Tensor *tokens) {
    if (e->cfg.map_pool) return map_pool(t, e, tokens);
    Tensor *pooled;
    if (e->cfg.avg_pool || !e->cls_token) {
        Tensor *patches = e->prefix ? nn_slice_tokens(t, tokens, e->prefix, tokens->shape[1] - e->prefix)
                                    : tokens;
        pooled = nn_mean_tokens(t, patches);                               // (B,C)
    } else {
        Tensor *cls = nn_slice_tokens(t, tokens, 0, 1);                    // (B,1,C)
        pooled = nn_view(t, cls, 2, (int[]){tokens->shape[0], tokens->shape[2]});
    }
    return e->cfg.fc_norm ? layernorm(t, &e->norm, pooled) : pooled;
}

Tensor *encoder_head(Tape *t, const Encoder *e, Tensor *tokens) {
    CG_CHECK(e->cfg.num_classes > 0, "set num_classes", "this encoder has no classification head");
    return linear(t, &e->head, nn_cast(t, encoder_pool(t, e, tokens), e->head.w->dtype));
}

double encoder_flops_per_image(const EncoderConfig *c) {
    if (c->kind == ENCODER_GSPN_HIER) return 2.0 * hier_macs_per_image(c);
    double N = (double)(c->img_h / c->patch) * (c->img_w / c->patch);
    double T = N + (c->kind == ENCODER_VIT ? (c->class_token ? 1 : 0) + c->reg_tokens : 0);
    double C = c->width, macs = N * C * c->in_chans * c->patch * c->patch;
    for (int i = 0; i < c->depth; i++) {
        if (encoder_block_is_attention(c, i)) {
            macs += T * C * 3 * C + 2 * T * T * C + T * C * C;
        } else {
            double Cc = c->gspn_latent, G = c->gspn_shared_w ? 4 * (2 * Cc + 3) : 20 * Cc;
            macs += N * (C * Cc + Cc * G + Cc * C) + N * Cc * 4 * 4;   // projections + 4 scans
        }
        macs += 2 * T * C * c->mlp_hidden;
    }
    macs += C * c->num_classes;
    return 2.0 * macs;   // FLOPs = 2 x multiply-accumulates
}
