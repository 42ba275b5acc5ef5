#include "model_config.h"
#include "../kernels/error.h"

EncoderConfig encoder_config_from(const Config *c) {
    EncoderConfig e = {0};
    if (strcmp(c->model, "vit") == 0) e.kind = ENCODER_VIT;
    else if (strcmp(c->model, "cgspn") == 0) e.kind = ENCODER_CGSPN;
    else if (strcmp(c->model, "hybrid") == 0) e.kind = ENCODER_HYBRID;
    else if (strcmp(c->model, "gspn_hier") == 0) e.kind = ENCODER_GSPN_HIER;
    else CG_FAIL("model is one of vit, cgspn, hybrid, gspn_hier", "unknown model '%s'", c->model);
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
    e.mlp_keep_hidden = c->mlp_keep_hidden;
    CG_CHECK(e.grad_checkpoint >= 0, "grad_checkpoint = 0 (off), 1 (every block) or N (every N-th)",
             "grad_checkpoint %d is negative", e.grad_checkpoint);
    CG_CHECK(e.kind != ENCODER_HYBRID || e.attn_every > 0, "set attn_every (e.g. 9)",
             "model = hybrid needs attn_every > 0");
    if (e.kind == ENCODER_GSPN_HIER) {
        // A hierarchical encoder has no prefix tokens and pools the mean of its last grid; its
        // depth is the sum of its stages' and its stem has stride 4.
        char err[256];
        int n = config_parse_int_list("depths", c->depths, e.depths, HIER_STAGES, err, sizeof err);
        CG_CHECK(n >= 0, "e.g. depths = 1,2,9,1", "%s", err);
        CG_CHECK(n == HIER_STAGES, "e.g. depths = 1,2,9,1 (configs/gspn_t.cfg)",
                 "model = gspn_hier needs depths with %d numbers, got '%s'", HIER_STAGES, c->depths);
        e.depth = 0;
        for (int s = 0; s < HIER_STAGES; s++) e.depth += e.depths[s];
        e.patch = 4;
        e.class_token = e.reg_tokens = e.pos_embed = e.no_embed_class = 0;
        e.avg_pool = 1;
        e.mlp_ratio = c->mlp_ratio;
        e.mixer_ratio = c->mixer_ratio;
        e.mixer_conv = c->mixer_conv;
    }
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
    char prefix[64];
    if (c->kind == ENCODER_GSPN_HIER)
        fprintf(f, "model: gspn_hier, depths %d,%d,%d,%d, widths %d..%d, grids %dx%d..%dx%d",
                c->depths[0], c->depths[1], c->depths[2], c->depths[3], c->width,
                encoder_out_width(c), e->hier.grid_h[0], e->hier.grid_w[0], e->grid_h,
                e->grid_w);
    else
        fprintf(f, "model: %s, %d blocks, width %d, %dx%d tokens%s", encoder_kind_name(c->kind),
                c->depth, c->width, e->grid_h, e->grid_w, encoder_prefix_text(e, prefix, sizeof prefix));
    fprintf(f, ", %.3f M parameters (%.3f M trainable), %.4g GMACs at %dx%d",
            params_count(t, false) / 1e6, params_count(t, true) / 1e6,
            encoder_flops_per_image(c) / 2e9, c->img_h, c->img_w);
    if (c->kind != ENCODER_VIT)
        fprintf(f, ", C-GSPN latent %d%s", c->gspn_latent, c->gspn_shared_w ? " (shared w)" : "");
    fprintf(f, "\n");
}
