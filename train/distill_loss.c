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
    Tensor *views[DISTILL_MAX_TEACHERS];
    for (int k = 0; k < d->n_teachers; k++) views[k] = img;
    return distill_loss_views(d, t, img, views, targets, raw_out);
}

// x (..., C) standardized by ps: (x + shift) * scale per channel, x's dtype; x when ps is unset.
static Tensor *phi_s_apply(Tape *t, const PhiS *ps, Tensor *x) {
    if (!ps->shift) return x;
    int C = x->shape[x->ndim - 1], rows = (int)(x->numel / C);
    Tensor *flat = nn_view(t, x, 2, (int[]){rows, C});
    Tensor *y = nn_layer_scale(t, nn_add_bcast(t, flat, ps->shift), ps->scale);
    return nn_view(t, y, x->ndim, x->shape);
}

// Stage 1: every C-GSPN layer of the student against the teacher's attention output.
static Tensor *stage1_loss(Distiller *d, Tape *t, Tensor *img, Tensor *raw) {
    const Encoder *st = &d->student;
    DistillTeacher *dt = &d->teachers[0];
    TeacherWant want = {0};
    TeacherTaps tt;
    for (int j = 0; j < dt->n_taps; j++) want.in[dt->taps[j]] = want.pp[dt->taps[j]] = true;
    teacher_forward(&dt->teacher, t, img, &want, &tt);
    int B = img->shape[0], C = st->cfg.width;
    Tensor *sum = NULL;
    for (int j = 0; j < dt->n_taps; j++) {
        const Block *b = &st->blocks[dt->taps[j]];
        // The teacher's block input, patch tokens as the (H, W) grid; no gradient reaches it.
        Tensor *x = nn_view(t, tt.in[dt->taps[j]], 4, (int[]){B, st->grid_h, st->grid_w, C});
        Tensor *h = layernorm(t, &b->norm1, x);   // reads fp32, writes the activation dtype
        Tensor *fs = cgspn_layer(t, &b->gspn, h);                         // (B,H,W,C)
        Tensor *l = nn_mse(t, fs, tt.pp[dt->taps[j]]);
        put(t->ctx, raw, j, l);
        sum = add_opt(t, sum, l);
    }
    return nn_scale(t, sum, 1.0f / (float)dt->n_taps);
}

void distill_teacher_targets(DistillTeacher *dt, Tape *t, Tensor *view, const Encoder *st,
                             TeacherTaps *tt) {
    TeacherWant want = {0};
    for (int j = 0; j < dt->n_taps; j++) {
        want.pp[dt->teacher_blocks[j]] |= dt->tap_pp;
        want.pb[dt->teacher_blocks[j]] |= dt->tap_pb;
    }
    want.summary = dt->trains_summary;
    teacher_forward(&dt->teacher, t, view, &want, tt);
    teacher_taps_resize(t, &dt->teacher, tt, st->grid_h, st->grid_w);   // Up(): the student's grid
}

// Teacher k's part of the Stage 2 loss: alpha mean(L_PP) + beta mean(L_PB) + summary_weight L_sum.
static Tensor *teacher_loss(Distiller *d, const DistillTeacher *dt, Tape *t, const TeacherTaps *tt,
                            const EncoderTaps *taps, Tensor *tokens, Tensor *raw) {
    const Encoder *st = &d->student;
    Tensor *lpp = NULL, *lpb = NULL, *total = NULL;
    int r = dt->raw_first;
    for (int j = 0; j < dt->n_taps; j++) {
        int i = dt->taps[j], tb = dt->teacher_blocks[j];
        if (dt->tap_pp) {
            Tensor *l = distill_tap_loss(t, dt->use_adaptors ? &dt->ad_pp[j] : NULL,
                                         student_patches(t, st, taps->pp[i]),
                                         phi_s_apply(t, &dt->phi_pp[j], tt->pp[tb]), dt->lambda1,
                                         raw, r + 4 * j);
            lpp = add_opt(t, lpp, l);
        }
        if (dt->tap_pb) {
            Tensor *l = distill_tap_loss(t, dt->use_adaptors ? &dt->ad_pb[j] : NULL,
                                         student_patches(t, st, taps->pb[i]),
                                         phi_s_apply(t, &dt->phi_pb[j], tt->pb[tb]), dt->lambda2,
                                         raw, r + 4 * j + 2);
            lpb = add_opt(t, lpb, l);
        }
    }
    if (lpp) total = nn_scale(t, lpp, dt->alpha / (float)dt->n_taps);
    if (lpb) total = add_opt(t, total, nn_scale(t, lpb, dt->beta / (float)dt->n_taps));
    if (dt->trains_summary) {   // (B, C_t): the student's pooled vector, adapted, in fp32
        Tensor *s = adaptor_forward(t, &dt->ad_summary, encoder_pool(t, st, tokens));
        Tensor *l = nn_mse(t, nn_cast(t, s, DTYPE_F32), phi_s_apply(t, &dt->phi_summary, tt->summary));
        put(t->ctx, raw, r + 4 * dt->n_taps, l);
        total = add_opt(t, total, nn_scale(t, l, dt->summary_weight));
    }
    return total;
}

Tensor *distill_loss_views(Distiller *d, Tape *t, Tensor *img, Tensor *const *teacher_imgs,
                           Tensor *targets, Tensor **raw_out) {
    Ctx *ctx = t->ctx;
    const Encoder *st = &d->student;
    Tensor *raw = tape_tensor(t, 1, (int[]){d->n_raw}, true);
    tape_keep(t, raw);   // read by the caller, after backward too
    op_zero(ctx, raw);
    Tensor *total = NULL;
    if (d->stage == 1) {
        total = stage1_loss(d, t, img, raw);
    } else {
        TeacherTaps tt[DISTILL_MAX_TEACHERS];
        for (int k = 0; k < d->n_teachers; k++)
            distill_teacher_targets(&d->teachers[k], t, teacher_imgs[k], st, &tt[k]);
        EncoderTaps taps;
        Tensor *tokens = encoder_forward(t, st, img, &taps);
        for (int k = 0; k < d->n_teachers; k++)
            total = add_opt(t, total, teacher_loss(d, &d->teachers[k], t, &tt[k], &taps, tokens, raw));
        if (d->trains_head) {
            Tensor *ce = nn_cross_entropy(t, encoder_head(t, st, tokens), targets);
            put(ctx, raw, d->raw_ce, ce);
            total = add_opt(t, total, nn_scale(t, ce, d->gamma));
        }
    }
    put(ctx, raw, d->n_raw - 1, total);
    *raw_out = raw;
    return total;
}

void distill_parts(const Distiller *d, const float *raw, float *parts) {
    int k = 0;
    const DistillTeacher *t0 = &d->teachers[0];
    if (d->stage == 1) {
        for (int j = 0; j < t0->n_taps; j++) parts[k++] = raw[j];
        return;
    }
    for (int q = 0; q < d->n_teachers; q++) {   // the order of stage2_teacher_setup's add_part
        const DistillTeacher *dt = &d->teachers[q];
        const float *r = raw + dt->raw_first;
        int nt = dt->n_taps;
        for (int j = 0; j < nt && dt->tap_pp; j++) parts[k++] = r[4 * j] + dt->lambda1 * r[4 * j + 1];
        for (int j = 0; j < nt && dt->tap_pb; j++) parts[k++] = r[4 * j + 2] + dt->lambda2 * r[4 * j + 3];
        for (int m = 0; m < 4; m++) {
            if ((m < 2 && !dt->tap_pp) || (m >= 2 && !dt->tap_pb)) continue;
            double s = 0;
            for (int j = 0; j < nt; j++) s += r[4 * j + m];
            parts[k++] = (float)(s / nt);
        }
        if (q == 0 && d->trains_head) parts[k++] = raw[d->raw_ce];
        if (dt->trains_summary) parts[k++] = r[4 * nt];
    }
}
