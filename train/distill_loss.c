// The distillation loss (train/distill.h): Stage 1 alignment, Stage 2 taps, the logged parts.
#include "distill.h"
#include "../kernels/ops.h"

// ---- the loss -----------------------------------------------------------------------------------------

// raw[k] = v (a 1-element loss); raw is a device vector, v stays on the tape.
static void put(Ctx *ctx, Tensor *raw, int k, const Tensor *v) {
    Tensor slot = *raw;
    slot.data = (float *)raw->data + k;
    slot.grad = NULL;
    slot.requires_grad = false;
    tensor_set_shape(&slot, 1, (int[]){1});
    op_scale_fwd(ctx, v, 1.0f, &slot);
}

// The patch tokens of a student tap (a ViT student's class token dropped).
static Tensor *student_patches(Tape *t, const Encoder *e, Tensor *v) {
    if (!e->prefix) return v;
    return nn_slice_tokens(t, v, e->prefix, e->grid_h * e->grid_w);
}

Tensor *distill_tap_loss(Tape *t, const Adaptor *a, Tensor *vs, Tensor *vt, float lambda,
                         Tensor *raw, int k) {
    Tensor *s = a ? adaptor_forward(t, a, vs) : vs;
    Tensor *mse = nn_mse(t, s, vt), *kl = nn_token_kl(t, s, vt);
    if (raw) {
        put(t->ctx, raw, k, mse);
        put(t->ctx, raw, k + 1, kl);
    }
    return nn_add(t, mse, nn_scale(t, kl, lambda));
}

static Tensor *add_opt(Tape *t, Tensor *sum, Tensor *x) { return sum ? nn_add(t, sum, x) : x; }

Tensor *distill_loss(Distiller *d, Tape *t, Tensor *img, Tensor *targets, Tensor **raw_out) {
    return distill_loss_views(d, t, img, img, targets, raw_out);
}

Tensor *distill_loss_views(Distiller *d, Tape *t, Tensor *img, Tensor *teacher_img,
                           Tensor *targets, Tensor **raw_out) {
    Ctx *ctx = t->ctx;
    const Encoder *st = &d->student;
    Tensor *raw = tape_tensor(t, 1, (int[]){d->n_raw}, true);
    tape_keep(t, raw);   // read by the caller, after backward too
    op_zero(ctx, raw);
    TeacherWant want = {0};
    TeacherTaps tt;
    Tensor *total = NULL;
    if (d->stage == 1) {
        for (int j = 0; j < d->n_taps; j++) want.in[d->taps[j]] = want.pp[d->taps[j]] = true;
        teacher_forward(&d->teacher, t, img, &want, &tt);
        int B = img->shape[0], C = st->cfg.width;
        Tensor *sum = NULL;
        for (int j = 0; j < d->n_taps; j++) {
            const Block *b = &st->blocks[d->taps[j]];
            // The teacher's block input, patch tokens as the (H, W) grid; no gradient reaches it.
            Tensor *x = nn_view(t, tt.in[d->taps[j]], 4, (int[]){B, st->grid_h, st->grid_w, C});
            Tensor *h = layernorm(t, &b->norm1, x);   // reads fp32, writes the activation dtype
            Tensor *fs = cgspn_layer(t, &b->gspn, h);                         // (B,H,W,C)
            Tensor *l = nn_mse(t, fs, tt.pp[d->taps[j]]);
            put(ctx, raw, j, l);
            sum = add_opt(t, sum, l);
        }
        total = nn_scale(t, sum, 1.0f / (float)d->n_taps);
    } else {
        for (int j = 0; j < d->n_taps; j++) {
            want.pp[d->taps[j]] = d->tap_pp;
            want.pb[d->taps[j]] = d->tap_pb;
        }
        want.summary = d->trains_summary;
        teacher_forward(&d->teacher, t, teacher_img, &want, &tt);
        teacher_taps_resize(t, &d->teacher, &tt, st->grid_h, st->grid_w);   // Up(): on the student's grid
        EncoderTaps taps;
        Tensor *tokens = encoder_forward(t, st, img, &taps);
        Tensor *lpp = NULL, *lpb = NULL;
        for (int j = 0; j < d->n_taps; j++) {
            int i = d->taps[j];
            if (d->tap_pp) {
                Tensor *l = distill_tap_loss(t, d->use_adaptors ? &d->ad_pp[j] : NULL,
                                             student_patches(t, st, taps.pp[i]), tt.pp[i],
                                             d->lambda1, raw, 4 * j);
                lpp = add_opt(t, lpp, l);
            }
            if (d->tap_pb) {
                Tensor *l = distill_tap_loss(t, d->use_adaptors ? &d->ad_pb[j] : NULL,
                                             student_patches(t, st, taps.pb[i]), tt.pb[i],
                                             d->lambda2, raw, 4 * j + 2);
                lpb = add_opt(t, lpb, l);
            }
        }
        if (lpp) total = nn_scale(t, lpp, d->alpha / (float)d->n_taps);
        if (lpb) total = add_opt(t, total, nn_scale(t, lpb, d->beta / (float)d->n_taps));
        if (d->trains_head) {
            Tensor *ce = nn_cross_entropy(t, encoder_head(t, st, tokens), targets);
            put(ctx, raw, 4 * d->n_taps, ce);
            total = add_opt(t, total, nn_scale(t, ce, d->gamma));
        }
        if (d->trains_summary) {   // (B, C): the student's pooled vector, adapted, in fp32
            Tensor *s = adaptor_forward(t, &d->ad_summary, encoder_pool(t, st, tokens));
            Tensor *l = nn_mse(t, nn_cast(t, s, DTYPE_F32), tt.summary);
            put(ctx, raw, 4 * d->n_taps + 1, l);
            total = add_opt(t, total, nn_scale(t, l, d->summary_weight));
        }
    }
    put(ctx, raw, d->n_raw - 1, total);
    *raw_out = raw;
    return total;
}

void distill_parts(const Distiller *d, const float *raw, float *parts) {
    int k = 0;
    if (d->stage == 1) {
        for (int j = 0; j < d->n_taps; j++) parts[k++] = raw[j];
        return;
    }
    int nt = d->n_taps;
    for (int j = 0; j < nt && d->tap_pp; j++) parts[k++] = raw[4 * j] + d->lambda1 * raw[4 * j + 1];
    for (int j = 0; j < nt && d->tap_pb; j++) parts[k++] = raw[4 * j + 2] + d->lambda2 * raw[4 * j + 3];
    for (int m = 0; m < 4; m++) {
        if ((m < 2 && !d->tap_pp) || (m >= 2 && !d->tap_pb)) continue;
        double s = 0;
        for (int j = 0; j < nt; j++) s += raw[4 * j + m];
        parts[k++] = (float)(s / nt);
    }
    if (d->trains_head) parts[k++] = raw[4 * nt];
    if (d->trains_summary) parts[k++] = raw[4 * nt + 1];
}
