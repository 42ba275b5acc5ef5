#include "model_config.h"
#include "../kernels/error.h"

EncoderConfig encoder_config_from(const Config *c) {
    EncoderConfig e = {0};
    if (strcmp(c->model, "vit") == 0) e.kind = ENCODER_VIT;
    else if (strcmp(c->model, "cgspn") == 0) e.kind = ENCODER_CGSPN;
    else if (strcmp(c->model, "hybrid") == 0) e.kind = ENCODER_HYBRID;
    else CG_FAIL("model is one of vit, cgspn, hybrid", "unknown model '%s'", c->model);
    e.img_h = e.img_w = c->img_size;
    e.in_chans = c->in_chans;
    e.patch = c->patch;
    e.width = c->width;
    e.depth = c->depth;
    e.heads = c->heads;
    e.mlp_hidden = c->mlp_hidden;
    e.gelu = strcmp(c->gelu, "tanh") == 0 ? GELU_TANH : GELU_ERF;
    e.ln_eps = c->ln_eps;
    bool vit = e.kind == ENCODER_VIT;
    e.class_token = vit && c->class_token;
    e.pos_embed = vit && c->pos_embed;
    e.avg_pool = strcmp(c->global_pool, "avg") == 0 || !e.class_token;
    e.layer_scale_init = c->layer_scale_init;
    e.qkv_bias = c->qkv_bias;
    e.num_classes = c->num_classes;
    e.gspn_latent = c->gspn_latent;
    e.gspn_shared_w = c->gspn_shared_w;
    e.gspn_out_norm = c->gspn_out_norm;
    e.attn_every = c->attn_every;
    e.grad_checkpoint = c->grad_checkpoint;
    CG_CHECK(e.grad_checkpoint >= 0, "grad_checkpoint = 0 (off), 1 (every block) or N (every N-th)",
             "grad_checkpoint %d is negative", e.grad_checkpoint);
    CG_CHECK(e.kind != ENCODER_HYBRID || e.attn_every > 0, "set attn_every (e.g. 9)",
             "model = hybrid needs attn_every > 0");
    return e;
}

void encoder_describe(const Encoder *e, const ParamTable *t, FILE *f) {
    const EncoderConfig *c = &e->cfg;
    static const char *kinds[] = {"vit", "cgspn", "hybrid"};
    fprintf(f, "model: %s, %d blocks, width %d, %dx%d tokens%s, %.3f M parameters (%.3f M trainable)",
            kinds[c->kind], c->depth, c->width, e->grid_h, e->grid_w,
            e->prefix ? " + class token" : "", params_count(t, false) / 1e6,
            params_count(t, true) / 1e6);
    if (c->kind != ENCODER_VIT)
        fprintf(f, ", C-GSPN latent %d%s", c->gspn_latent, c->gspn_shared_w ? " (shared w)" : "");
    fprintf(f, "\n");
}
