// The distiller built (train/distill.h): taps parsed, teacher, student and adaptors set up.
#include "distill.h"
#include "checkpoint.h"
#include "model_config.h"
#include "../kernels/error.h"

// ---- taps -----------------------------------------------------------------------------------------

int distill_parse_taps(const char *s, int depth, int *blocks, char *err, size_t n) {
    while (*s == ' ') s++;
    if (strcmp(s, "all") == 0) {
        for (int i = 0; i < depth; i++) blocks[i] = i;
        return depth;
    }
    if (strncmp(s, "every", 5) == 0) {
        const char *p = s + 5;
        while (*p == ' ' || *p == '=' || *p == ':') p++;
        char *end;
        long k = strtol(p, &end, 10);
        while (*end == ' ') end++;
        if (end == p || *end || k < 1)
            return cg_set_error(err, n, "taps = '%s': expected 'every N' with N >= 1 (e.g. every 9)", s);
        int count = 0;
        for (long b = k; b <= depth; b += k) blocks[count++] = (int)(b - 1);
        if (!count)
            return cg_set_error(err, n, "taps = '%s' selects no block of a %d-block student", s, depth);
        return count;
    }
    int list[ENCODER_MAX_DEPTH + 1];
    int count = config_parse_int_list("taps", s, list, ENCODER_MAX_DEPTH, err, n);
    if (count < 0) {
        size_t len = strlen(err);
        snprintf(err + len, n > len ? n - len : 0, "\n  hint: taps is a list of 1-based blocks "
                 "(9,18,27), every N, or all");
        return -1;
    }
    if (count == 0) return cg_set_error(err, n, "taps is empty: give blocks (9,18,27), every N, or all");
    bool seen[ENCODER_MAX_DEPTH] = {0};
    for (int i = 0; i < count; i++) {
        if (list[i] < 1 || list[i] > depth)
            return cg_set_error(err, n, "taps = '%s': block %d is not in 1..%d (taps count blocks "
                                "from 1, as the paper's 9, 18, 27)", s, list[i], depth);
        seen[list[i] - 1] = true;
    }
    count = 0;
    for (int i = 0; i < depth; i++)
        if (seen[i]) blocks[count++] = i;
    return count;
}

// ---- building ---------------------------------------------------------------------------------------

static void add_part(Distiller *d, const char *fmt, int block) {
    CG_CHECK(d->n_parts < DISTILL_MAX_PARTS, "", "too many loss parts");
    snprintf(d->part_names[d->n_parts++], DISTILL_PART_NAME, fmt, block);
}

static void set_trainable_block(ParamTable *t, int block, const char *what, bool on) {
    char prefix[64];
    snprintf(prefix, sizeof prefix, "blocks.%d.%s", block, what);
    params_set_trainable(t, prefix, on);
}

int distiller_init_err(Distiller *d, const Config *c, Ctx *ctx, char *err, size_t n) {
    memset(d, 0, sizeof *d);
    if (c->stage != 1 && c->stage != 2)
        return cg_set_error(err, n, "stage = %d: cgspn distill runs stage 1 (sublayer alignment) or "
                            "stage 2 (dual-tap distillation)", c->stage);
    if (teacher_load_err(&d->teacher, c, ctx, err, n) != 0) return -1;
    return distiller_init_with_teacher_err(d, c, ctx, err, n);
}

int distiller_init_with_teacher_err(Distiller *d, const Config *c, Ctx *ctx, char *err, size_t n) {
    d->ctx = ctx;
    d->stage = c->stage;
    EncoderConfig s = encoder_config_from(c);
    const EncoderConfig *tc = &d->teacher.enc.cfg;
    int rc = 0;
    if (s.width != tc->width || s.depth != tc->depth || s.patch != tc->patch)
        rc = cg_set_error(err, n, "the student (width %d, depth %d, patch %d) and the teacher (width %d, "
                          "depth %d, patch %d, %s) differ\n  hint: distillation pairs block i of the "
                          "student with block i of the teacher on the same token grid; give the "
                          "student the teacher's width, depth and patch", s.width, s.depth, s.patch,
                          tc->width, tc->depth, tc->patch, d->teacher.config_path);
    if (rc == 0 && s.kind == ENCODER_VIT && d->stage == 1)
        rc = cg_set_error(err, n, "stage 1 aligns C-GSPN layers; the student is a ViT\n  hint: set "
                          "model = cgspn or hybrid");
    if (rc == 0 && c->multires[0] && s.pos_embed)
        rc = cg_set_error(err, n, "multires = %s: the student has a position embedding made for one "
                          "grid\n  hint: multi-resolution training is for C-GSPN and hybrid students "
                          "(pos_embed = 0)", c->multires);
    if (rc == 0 && d->stage == 1 && (teacher_image_side(c) != c->img_size || c->multires[0]))
        rc = cg_set_error(err, n, "stage 1 feeds the teacher's block inputs to the student: both run "
                          "at img_size\n  hint: teacher_img_size and multires are Stage 2 options");
    if (rc != 0) {
        teacher_free(&d->teacher, ctx);
        return -1;
    }
    params_init_table(&d->params);
    encoder_register(&d->student, &s, &d->params);

    if (d->stage == 1) {
        for (int i = 0; i < s.depth; i++)
            if (!d->student.blocks[i].is_attention) {
                d->taps[d->n_taps++] = i;
                add_part(d, "mse_b%d", i + 1);
            }
        d->n_raw = d->n_taps + 1;
    } else {
        d->n_taps = distill_parse_taps(c->taps, s.depth, d->taps, err, n);
        d->tap_pp = c->tap_pp;
        d->tap_pb = c->tap_pb;
        d->use_adaptors = c->adaptors && (d->tap_pp || d->tap_pb);
        d->alpha = c->alpha;
        d->beta = c->beta;
        d->lambda1 = c->lambda1;
        d->lambda2 = c->lambda2;
        d->gamma = c->gamma;
        d->trains_head = c->gamma > 0;
        d->summary_weight = c->summary_weight;
        d->trains_summary = c->summary_weight > 0;
        if (d->n_taps >= 0 && !d->tap_pp && !d->tap_pb && !d->trains_head && !d->trains_summary)
            rc = cg_set_error(err, n, "stage 2 with tap_pp = 0, tap_pb = 0, gamma = 0 and "
                              "summary_weight = 0 has no loss");
        if (rc == 0 && d->trains_summary && d->teacher.enc.cfg.width != s.width)
            rc = cg_set_error(err, n, "summary_weight: the teacher's summary is %d wide, the "
                              "student's pooled vector %d\n  hint: a student of the teacher's width",
                              d->teacher.enc.cfg.width, s.width);
        if (d->n_taps < 0 || rc != 0) {
            params_free(&d->params, ctx);
            teacher_free(&d->teacher, ctx);
            return -1;
        }
        if (d->trains_head && s.num_classes <= 0) {
            params_free(&d->params, ctx);
            teacher_free(&d->teacher, ctx);
            return cg_set_error(err, n, "gamma = %g needs the student's head: set num_classes",
                                (double)c->gamma);
        }
        int hidden = c->adaptor_hidden > 0 ? c->adaptor_hidden : s.width;
        for (int j = 0; j < d->n_taps && d->use_adaptors; j++) {
            char prefix[64];
            if (d->tap_pp) {
                snprintf(prefix, sizeof prefix, ADAPTOR_PREFIX "%d.pp", d->taps[j]);
                adaptor_register(&d->ad_pp[j], &d->params, prefix, s.width, hidden, s.gelu);
            }
            if (d->tap_pb) {
                snprintf(prefix, sizeof prefix, ADAPTOR_PREFIX "%d.pb", d->taps[j]);
                adaptor_register(&d->ad_pb[j], &d->params, prefix, s.width, hidden, s.gelu);
            }
        }
        if (d->trains_summary)
            adaptor_register(&d->ad_summary, &d->params, ADAPTOR_PREFIX "summary", s.width, hidden,
                             s.gelu);
        for (int j = 0; j < d->n_taps && d->tap_pp; j++) add_part(d, "pp_b%d", d->taps[j] + 1);
        for (int j = 0; j < d->n_taps && d->tap_pb; j++) add_part(d, "pb_b%d", d->taps[j] + 1);
        if (d->tap_pp) add_part(d, "mse_pp", 0), add_part(d, "kl_pp", 0);
        if (d->tap_pb) add_part(d, "mse_pb", 0), add_part(d, "kl_pb", 0);
        if (d->trains_head) add_part(d, "ce", 0);
        if (d->trains_summary) add_part(d, "summary", 0);
        d->n_raw = 4 * d->n_taps + 3;   // per tap mse_pp, kl_pp, mse_pb, kl_pb; ce; summary; total
    }
    params_alloc(&d->params, ctx);
    params_initialize(&d->params, ctx, (uint64_t)c->seed);

    // What trains: only parameters the loss reaches (AdamW's decay would shrink the others).
    if (d->stage == 1) {
        params_set_trainable(&d->params, NULL, false);
        bool norm1 = strcmp(c->stage1_train, "gspn_norm1") == 0;
        for (int j = 0; j < d->n_taps; j++) {
            set_trainable_block(&d->params, d->taps[j], "gspn.", true);
            if (norm1) set_trainable_block(&d->params, d->taps[j], "norm1.", true);
        }
    } else if (!d->trains_head) {   // the head is not reached; with the summary every block
        params_set_trainable(&d->params, "head.", false);   // and the final norm are
        if (!d->trains_summary) {   // nothing after the last tap, nor the final norm
            params_set_trainable(&d->params, "norm.", false);
            for (int i = d->taps[d->n_taps - 1] + 1; i < s.depth; i++)
                set_trainable_block(&d->params, i, "", false);
        }
    }
    return 0;
}

void distiller_init(Distiller *d, const Config *c, Ctx *ctx) {
    char err[4096];
    if (distiller_init_err(d, c, ctx, err, sizeof err) != 0) CG_FAIL("", "%s", err);
}

void distiller_free(Distiller *d) {
    params_free(&d->params, d->ctx);
    teacher_free(&d->teacher, d->ctx);
}
void distiller_init_student(Distiller *d, const Config *c, FILE *f) {
    if (c->init[0]) {   // adaptors may be absent (a Stage 1 checkpoint): they stay fresh
        ckpt_load_init(c->init, &d->params, d->ctx, ADAPTOR_PREFIX, "student", f);
    } else if (c->copy_teacher) {
        CopyReport r;
        student_copy_from_teacher(&d->params, &d->teacher.params, d->ctx, ADAPTOR_PREFIX, &r);
        if (f) copy_report_print(&r, f);
        copy_report_free(&r);
    } else if (f) {
        fprintf(f, "student init: fresh (copy_teacher = 0, no init)\n");
    }
}
