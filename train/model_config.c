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
    e.reg_tokens = vit ? c->reg_tokens : 0;
    e.pos_embed = vit && c->pos_embed;
    e.no_embed_class = e.pos_embed && c->no_embed_class;
    e.norm_pre = c->norm_pre;
    e.map_pool = strcmp(c->global_pool, "map") == 0;
    e.avg_pool = !e.map_pool && (strcmp(c->global_pool, "avg") == 0 || !e.class_token);
    e.fc_norm = c->fc_norm;
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

const char *encoder_prefix_text(const Encoder *e, char *buf, size_t n) {
    buf[0] = 0;
    if (e->cls_token) snprintf(buf, n, " + class token");
    if (e->reg_token) {
        size_t len = strlen(buf);
        snprintf(buf + len, n - len, " + %d registers", e->cfg.reg_tokens);
    }
    return buf;
}

void encoder_describe(const Encoder *e, const ParamTable *t, FILE *f) {
    const EncoderConfig *c = &e->cfg;
    static const char *kinds[] = {"vit", "cgspn", "hybrid"};
    char prefix[64];
    fprintf(f, "model: %s, %d blocks, width %d, %dx%d tokens%s, %.3f M parameters (%.3f M trainable)",
            kinds[c->kind], c->depth, c->width, e->grid_h, e->grid_w,
            encoder_prefix_text(e, prefix, sizeof prefix),
            params_count(t, false) / 1e6, params_count(t, true) / 1e6);
    if (c->kind != ENCODER_VIT)
        fprintf(f, ", C-GSPN latent %d%s", c->gspn_latent, c->gspn_shared_w ? " (shared w)" : "");
    fprintf(f, "\n");
}
