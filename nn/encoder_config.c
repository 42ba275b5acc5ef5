// The rules every encoder kind shares (nn/encoder_config.h).
#include "encoder_config.h"
#include "functional.h"

const char *encoder_kind_name(EncoderKind kind) {
    static const char *names[] = {"vit", "cgspn", "hybrid", "gspn_hier"};
    return kind >= 0 && kind <= ENCODER_GSPN_HIER ? names[kind] : "?";
}

int encoder_out_width(const EncoderConfig *cfg) {
    return cfg->kind == ENCODER_GSPN_HIER ? cfg->width << (HIER_STAGES - 1) : cfg->width;
}

int encoder_block_is_attention(const EncoderConfig *cfg, int i) {
    if (cfg->kind == ENCODER_VIT) return 1;
    if (cfg->kind == ENCODER_CGSPN || cfg->kind == ENCODER_GSPN_HIER) return 0;
    return cfg->attn_every > 0 && (i + 1) % cfg->attn_every == 0;
}

bool encoder_drop_active(const Tape *t, const EncoderDropPath *d, int depth) {
    return d->rate > 0.0f && depth >= 2 && t->grad_enabled;
}

Tensor *encoder_drop_branch(Tape *t, const EncoderDropPath *d, int depth, int i, int branch,
                            Tensor *x) {
    if (!encoder_drop_active(t, d, depth)) return x;
    DropPathArgs a = {d->rate * (float)i / (float)(depth - 1), d->seed, d->step, 2 * i + branch,
                      d->first_sample, d->step_at};
    return nn_drop_path(t, x, &a);
}
