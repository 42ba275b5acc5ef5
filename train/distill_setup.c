// The distiller built (train/distill.h): taps parsed, teacher, student and adaptors set up.
#include "distill.h"
#include "checkpoint.h"
#include "model_config.h"
#include "config_table.h"
#include "../kernels/error.h"
#include <math.h>

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

static void add_part(Distiller *d, const char *label, const char *fmt, int block) {
    CG_CHECK(d->n_parts < DISTILL_MAX_PARTS, "tap fewer blocks (taps = every N) or use fewer teachers",
             "more than %d loss parts", DISTILL_MAX_PARTS);
    char name[DISTILL_PART_NAME];
    snprintf(name, sizeof name, fmt, block);
    snprintf(d->part_names[d->n_parts++], DISTILL_PART_NAME, "%s%s", label, name);
}

static void set_trainable_block(ParamTable *t, int block, const char *what, bool on) {
    char prefix[64];
    snprintf(prefix, sizeof prefix, "blocks.%d.%s", block, what);
    params_set_trainable(t, prefix, on);
}

// The keys a teacher file may set: what one teacher is and what the student learns from it.
static const char *const kTeacherKeys[] = {
    "teacher", "teacher_config", "teacher_prefix", "teacher_img_size", "teacher_mean", "teacher_std",
    "taps", "teacher_taps", "tap_pp", "tap_pb", "adaptors", "adaptor_hidden", "alpha", "beta",
    "lambda1", "lambda2", "summary_weight", "phi_s",
};
#define N_TEACHER_KEYS ((int)(sizeof kTeacherKeys / sizeof kTeacherKeys[0]))

// extra_teachers = "a.cfg, b.cfg" -> files[]; the count, or -1 with a message.
static int split_teacher_files(const char *s, char files[][CONFIG_STR_MAX], int max, char *err,
                               size_t n) {
    int count = 0;
    for (const char *p = s; *p;) {
        while (*p == ' ' || *p == ',') p++;
        if (!*p) break;
        const char *e = p;
        while (*e && *e != ',') e++;
        const char *last = e;
        while (last > p && last[-1] == ' ') last--;
        if (count == max)
            return cg_set_error(err, n, "extra_teachers = %s: at most %d extra teachers", s, max);
        snprintf(files[count++], CONFIG_STR_MAX, "%.*s", (int)(last - p), p);
        p = e;
    }
    return count;
}

// What names one teacher, its input and its pairing: an extra teacher's own, never the run's
// (teacher 1's prefix or side would be wrong for it); its file sets them or they keep defaults.
static const char *const kTeacherIdentityKeys[] = {
    "teacher", "teacher_config", "teacher_prefix", "teacher_img_size", "teacher_mean", "teacher_std",
    "teacher_taps",
};

// Teacher k's keys: the run config's (k = 0) or, for an extra teacher, its file on top of them
// (the loss and adaptor keys inherited, the identity keys from their defaults).
static int teacher_keys_err(Config *tc, const Config *c, const char *file, char *err, size_t n) {
    *tc = *c;
    if (!file[0]) return 0;
    Config defaults;
    config_defaults(&defaults);
    for (size_t i = 0; i < sizeof kTeacherIdentityKeys / sizeof kTeacherIdentityKeys[0]; i++) {
        const CfgKey *k = cfg_key_find(kTeacherIdentityKeys[i]);
        CG_CHECK(k, "", "teacher key %s is not a config key", kTeacherIdentityKeys[i]);
        size_t size = k->type == CFG_STRING ? CONFIG_STR_MAX
                    : k->type == CFG_BOOL   ? sizeof(bool) : 4;   // int, float
        memcpy(cfg_field(tc, k), cfg_field(&defaults, k), size);
    }
    char inner[4096];
    if (config_load_file_err(tc, file, inner, sizeof inner) != 0)
        return cg_set_error(err, n, "extra_teachers: %s", inner);
    const char *other = config_first_difference(c, tc, kTeacherKeys, N_TEACHER_KEYS);
    if (other) {
        int len = cg_set_error(err, n, "extra_teachers: %s sets %s, a key of the run\n  hint: a "
                               "teacher file sets only", file, other);
        for (int i = 0; i < N_TEACHER_KEYS; i++) {
            size_t at = strlen(err);
            snprintf(err + at, n > at ? n - at : 0, "%s %s", i ? "," : "", kTeacherKeys[i]);
        }
        return len;
    }
    if (!tc->teacher[0])
        return cg_set_error(err, n, "extra_teachers: %s does not set teacher (its weights)", file);
    return 0;
}

// teacher_mean / teacher_std of tc: *have set when given, with one value per input channel.
static int parse_teacher_norm(DistillTeacher *dt, const Config *tc, int chans, char *err, size_t n) {
    int nm = config_parse_float_list("teacher_mean", tc->teacher_mean, dt->mean, 3, err, n);
    if (nm < 0) return -1;
    int ns = config_parse_float_list("teacher_std", tc->teacher_std, dt->std, 3, err, n);
    if (ns < 0) return -1;
    if (nm != ns || (nm && nm != chans))
        return cg_set_error(err, n, "teacher_mean has %d values and teacher_std %d: give both, one "
                            "per input channel (%d)", nm, ns, chans);
    for (int i = 0; i < ns; i++)
        if (!(dt->std[i] > 0))
            return cg_set_error(err, n, "teacher_std = %s: every value must be > 0", tc->teacher_std);
    dt->have_norm = nm > 0;
    return 0;
}

// The teacher block paired with each tap: teacher_taps, or the same / the proportional block.
static int map_teacher_blocks(DistillTeacher *dt, const Config *tc, int student_depth, char *err,
                              size_t n) {
    int depth = dt->teacher.enc.cfg.depth;
    if (tc->teacher_taps[0]) {
        int list[ENCODER_MAX_DEPTH + 1];
        int count = config_parse_int_list("teacher_taps", tc->teacher_taps, list, ENCODER_MAX_DEPTH,
                                          err, n);
        if (count < 0) return -1;
        if (count != dt->n_taps)
            return cg_set_error(err, n, "teacher_taps = %s names %d teacher blocks for %d taps (%s)\n"
                                "  hint: one teacher block (1-based) per tapped student block, in "
                                "the order of taps", tc->teacher_taps, count, dt->n_taps, tc->taps);
        for (int j = 0; j < count; j++) {
            if (list[j] < 1 || list[j] > depth)
                return cg_set_error(err, n, "teacher_taps = %s: block %d is not in 1..%d (the "
                                    "teacher's depth)", tc->teacher_taps, list[j], depth);
            dt->teacher_blocks[j] = list[j] - 1;
        }
        return 0;
    }
    for (int j = 0; j < dt->n_taps; j++) {   // block b of D_s -> round(b * D_t / D_s), 1-based
        long b = lround((double)(dt->taps[j] + 1) * depth / student_depth);
        dt->teacher_blocks[j] = (int)(b < 1 ? 0 : b > depth ? depth - 1 : b - 1);
    }
    return 0;
}

// PREFIX.phi_s.shift and .scale, (width): the standardization of one teacher feature.
static void phi_s_register(PhiS *ps, ParamTable *t, const char *prefix, int width) {
    char name[PARAM_NAME_MAX + 16];
    snprintf(name, sizeof name, "%s.phi_s.shift", prefix);
    ps->shift = params_add(t, name, 1, (int[]){width}, INIT_ZEROS, 0, false);
    snprintf(name, sizeof name, "%s.phi_s.scale", prefix);
    ps->scale = params_add(t, name, 1, (int[]){width}, INIT_ONES, 0, false);
}

// Teacher k of a Stage 2 run: taps, pairing, adaptors, standardization and loss parts.
static int stage2_teacher_setup(Distiller *d, int k, const Config *tc, char *err, size_t n) {
    DistillTeacher *dt = &d->teachers[k];
    const EncoderConfig *s = &d->student.cfg, *tcfg = &dt->teacher.enc.cfg;
    dt->n_taps = distill_parse_taps(tc->taps, s->depth, dt->taps, err, n);
    if (dt->n_taps < 0) return -1;
    if (map_teacher_blocks(dt, tc, s->depth, err, n) != 0) return -1;
    if (parse_teacher_norm(dt, tc, tcfg->in_chans, err, n) != 0) return -1;
    if (tcfg->in_chans != s->in_chans)
        return cg_set_error(err, n, "the teacher sees %d input channels, the student %d: both see "
                            "one image", tcfg->in_chans, s->in_chans);
    dt->side = teacher_image_side(tc);
    dt->tap_pp = tc->tap_pp;
    dt->tap_pb = tc->tap_pb;
    dt->use_adaptors = tc->adaptors && (dt->tap_pp || dt->tap_pb);
    dt->alpha = tc->alpha;
    dt->beta = tc->beta;
    dt->lambda1 = tc->lambda1;
    dt->lambda2 = tc->lambda2;
    dt->summary_weight = tc->summary_weight;
    dt->trains_summary = tc->summary_weight > 0;
    dt->phi_s = tc->phi_s;
    int tw = tcfg->width;
    if (!dt->use_adaptors && (dt->tap_pp || dt->tap_pb) && tw != s->width)
        return cg_set_error(err, n, "adaptors = 0 with a teacher of width %d and a student of width "
                            "%d\n  hint: adaptors = 1 maps the student's taps to the teacher's width",
                            tw, s->width);
    char ad[40];   // "adaptors." or "adaptors.t2."
    snprintf(ad, sizeof ad, ADAPTOR_PREFIX "%s", dt->label);
    int hidden = tc->adaptor_hidden > 0 ? tc->adaptor_hidden : s->width;
    char prefix[PARAM_NAME_MAX - 16];   // room for ".phi_s.shift"
    for (int j = 0; j < dt->n_taps; j++) {
        if (dt->tap_pp) {
            snprintf(prefix, sizeof prefix, "%s%d.pp", ad, dt->taps[j]);
            if (dt->use_adaptors)
                adaptor_register(&dt->ad_pp[j], &d->params, prefix, s->width, tw, hidden, s->gelu);
            if (dt->phi_s) phi_s_register(&dt->phi_pp[j], &d->params, prefix, tw);
        }
        if (dt->tap_pb) {
            snprintf(prefix, sizeof prefix, "%s%d.pb", ad, dt->taps[j]);
            if (dt->use_adaptors)
                adaptor_register(&dt->ad_pb[j], &d->params, prefix, s->width, tw, hidden, s->gelu);
            if (dt->phi_s) phi_s_register(&dt->phi_pb[j], &d->params, prefix, tw);
        }
    }
    if (dt->trains_summary) {
        snprintf(prefix, sizeof prefix, "%ssummary", ad);
        adaptor_register(&dt->ad_summary, &d->params, prefix, s->width, tw, hidden, s->gelu);
        if (dt->phi_s) phi_s_register(&dt->phi_summary, &d->params, prefix, tw);
    }
    const char *l = dt->label;
    for (int j = 0; j < dt->n_taps && dt->tap_pp; j++) add_part(d, l, "pp_b%d", dt->taps[j] + 1);
    for (int j = 0; j < dt->n_taps && dt->tap_pb; j++) add_part(d, l, "pb_b%d", dt->taps[j] + 1);
    if (dt->tap_pp) add_part(d, l, "mse_pp", 0), add_part(d, l, "kl_pp", 0);
    if (dt->tap_pb) add_part(d, l, "mse_pb", 0), add_part(d, l, "kl_pb", 0);
    if (k == 0 && d->trains_head) add_part(d, "", "ce", 0);
    if (dt->trains_summary) add_part(d, l, "summary", 0);
    dt->raw_first = d->n_raw;
    d->n_raw += 4 * dt->n_taps + 1;   // per tap mse_pp, kl_pp, mse_pb, kl_pb; summary
    return 0;
}

// Checks of the student against teacher 1 and the run's options.
static int check_student(const Distiller *d, const EncoderConfig *s, const Config *c, char *err,
                         size_t n) {
    const Teacher *T = &d->teachers[0].teacher;
    const EncoderConfig *tc = &T->enc.cfg;
    if (d->stage == 1 && (s->width != tc->width || s->depth != tc->depth || s->patch != tc->patch))
        return cg_set_error(err, n, "the student (width %d, depth %d, patch %d) and the teacher "
                            "(width %d, depth %d, patch %d, %s) differ\n  hint: stage 1 pairs block i "
                            "of the student with block i of the teacher on the same token grid; give "
                            "the student the teacher's width, depth and patch", s->width, s->depth,
                            s->patch, tc->width, tc->depth, tc->patch, T->config_path);
    if (s->kind == ENCODER_GSPN_HIER)
        return cg_set_error(err, n, "the student is a gspn_hier classifier: its stages change width "
                            "and grid, and distillation pairs blocks on one token grid\n  hint: set "
                            "model = cgspn or hybrid (train gspn_hier with cgspn train)");
    if (s->kind == ENCODER_VIT && d->stage == 1)
        return cg_set_error(err, n, "stage 1 aligns C-GSPN layers; the student is a ViT\n  hint: set "
                            "model = cgspn or hybrid");
    if (c->multires[0] && s->pos_embed)
        return cg_set_error(err, n, "multires = %s: the student has a position embedding made for one "
                            "grid\n  hint: multi-resolution training is for C-GSPN and hybrid students "
                            "(pos_embed = 0)", c->multires);
    if (d->stage == 1 && (teacher_image_side(c) != c->img_size || c->multires[0]))
        return cg_set_error(err, n, "stage 1 feeds the teacher's block inputs to the student: both run "
                            "at img_size\n  hint: teacher_img_size and multires are Stage 2 options");
    if (d->stage == 1 && (c->extra_teachers[0] || c->phi_s || c->teacher_mean[0]))
        return cg_set_error(err, n, "stage 1 aligns the student with one teacher as it is\n  hint: "
                            "extra_teachers, phi_s and teacher_mean are Stage 2 options");
    return 0;
}

int distiller_init_err(Distiller *d, const Config *c, Ctx *ctx, char *err, size_t n) {
    memset(d, 0, sizeof *d);
    if (c->stage != 1 && c->stage != 2)
        return cg_set_error(err, n, "stage = %d: cgspn distill runs stage 1 (sublayer alignment) or "
                            "stage 2 (dual-tap distillation)", c->stage);
    if (teacher_load_err(&d->teachers[0].teacher, c, ctx, err, n) != 0) return -1;
    return distiller_init_with_teacher_err(d, c, ctx, err, n);
}

static void free_teachers(Distiller *d, Ctx *ctx) {
    for (int k = 0; k < d->n_teachers; k++) teacher_free(&d->teachers[k].teacher, ctx);
}

int distiller_init_with_teacher_err(Distiller *d, const Config *c, Ctx *ctx, char *err, size_t n) {
    d->ctx = ctx;
    d->stage = c->stage;
    d->n_teachers = 1;
    EncoderConfig s = encoder_config_from(c);
    char files[DISTILL_MAX_TEACHERS][CONFIG_STR_MAX] = {{0}};
    int n_extra = split_teacher_files(c->extra_teachers, files + 1, DISTILL_MAX_TEACHERS - 1, err, n);
    Config *tcs = cg_calloc(DISTILL_MAX_TEACHERS, sizeof(Config));   // each teacher's keys
    int rc = n_extra < 0 ? -1 : check_student(d, &s, c, err, n);
    if (rc == 0) rc = teacher_keys_err(&tcs[0], c, "", err, n);
    for (int k = 1; rc == 0 && k <= n_extra; k++) {
        DistillTeacher *dt = &d->teachers[k];
        snprintf(dt->file, sizeof dt->file, "%s", files[k]);
        snprintf(dt->label, sizeof dt->label, "t%c.", '0' + k + 1);   // k + 1 <= DISTILL_MAX_TEACHERS
        rc = teacher_keys_err(&tcs[k], c, files[k], err, n);
        if (rc == 0 && (rc = teacher_load_err(&dt->teacher, &tcs[k], ctx, err, n)) == 0) d->n_teachers++;
        if (rc != 0) {
            char inner[4096];
            snprintf(inner, sizeof inner, "%s", err);
            cg_set_error(err, n, "teacher %d (%s): %s", k + 1, files[k], inner);
        }
    }
    if (rc != 0) {
        free(tcs);
        free_teachers(d, ctx);
        return -1;
    }
    params_init_table(&d->params);
    encoder_register(&d->student, &s, &d->params);

    DistillTeacher *t0 = &d->teachers[0];
    if (d->stage == 1) {
        for (int i = 0; i < s.depth; i++)
            if (!d->student.blocks[i].is_attention) {
                t0->teacher_blocks[t0->n_taps] = i;
                t0->taps[t0->n_taps++] = i;
                add_part(d, "", "mse_b%d", i + 1);
            }
        t0->side = c->img_size;
        d->n_raw = t0->n_taps + 1;
    } else {
        d->gamma = c->gamma;
        d->trains_head = c->gamma > 0;
        if (d->trains_head && s.num_classes <= 0)
            rc = cg_set_error(err, n, "gamma = %g needs the student's head: set num_classes",
                              (double)c->gamma);
        for (int k = 0; rc == 0 && k < d->n_teachers; k++) {
            rc = stage2_teacher_setup(d, k, &tcs[k], err, n);
            const DistillTeacher *dt = &d->teachers[k];
            if (rc == 0 && !dt->tap_pp && !dt->tap_pb && !dt->trains_summary && !(k == 0 && d->trains_head))
                rc = cg_set_error(err, n, "stage 2 with tap_pp = 0, tap_pb = 0%s and summary_weight = 0 "
                                  "has no loss", k == 0 ? ", gamma = 0" : "");
            if (rc != 0 && k > 0) {
                char inner[4096];
                snprintf(inner, sizeof inner, "%s", err);
                cg_set_error(err, n, "teacher %d (%s): %s", k + 1, dt->file, inner);
            }
        }
        d->raw_ce = d->n_raw;
        d->n_raw += 2;   // ce; the total
    }
    free(tcs);
    if (rc != 0) {
        params_free(&d->params, ctx);
        free_teachers(d, ctx);
        return -1;
    }
    params_alloc(&d->params, ctx);
    params_initialize(&d->params, ctx, (uint64_t)c->seed);

    // What trains: only parameters the loss reaches (AdamW's decay would shrink the others).
    if (d->stage == 1) {
        params_set_trainable(&d->params, NULL, false);
        bool norm1 = strcmp(c->stage1_train, "gspn_norm1") == 0;
        for (int j = 0; j < t0->n_taps; j++) {
            set_trainable_block(&d->params, t0->taps[j], "gspn.", true);
            if (norm1) set_trainable_block(&d->params, t0->taps[j], "norm1.", true);
        }
        return 0;
    }
    bool summary = false;
    int last_tap = -1;
    for (int k = 0; k < d->n_teachers; k++) {
        const DistillTeacher *dt = &d->teachers[k];
        summary |= dt->trains_summary;
        if (dt->n_taps && (dt->tap_pp || dt->tap_pb) && dt->taps[dt->n_taps - 1] > last_tap)
            last_tap = dt->taps[dt->n_taps - 1];
    }
    if (!d->trains_head) {   // the head is not reached; with a summary every block and the
        params_set_trainable(&d->params, "head.", false);   // final norm are
        if (!summary) {   // nothing after the last tap, nor the final norm
            params_set_trainable(&d->params, "norm.", false);
            for (int i = last_tap + 1; i < s.depth; i++) set_trainable_block(&d->params, i, "", false);
        }
    }
    for (int i = 0; i < d->params.n; i++) {   // statistics, set before the first step
        const char *name = d->params.params[i]->name;
        if (strstr(name, ".phi_s.")) params_set_trainable(&d->params, name, false);
    }
    return 0;
}

void distiller_init(Distiller *d, const Config *c, Ctx *ctx) {
    char err[4096];
    if (distiller_init_err(d, c, ctx, err, sizeof err) != 0) CG_FAIL("", "%s", err);
}

void distiller_free(Distiller *d) {
    params_free(&d->params, d->ctx);
    free_teachers(d, d->ctx);
}
void distiller_init_student(Distiller *d, const Config *c, FILE *f) {
    if (c->init[0]) {   // adaptors may be absent (a Stage 1 checkpoint): they stay fresh
        ckpt_load_init(c->init, &d->params, d->ctx, ADAPTOR_PREFIX, "student", f);
    } else if (c->copy_teacher) {
        CopyReport r;
        student_copy_from_teacher(&d->params, &d->teachers[0].teacher.params, d->ctx, ADAPTOR_PREFIX, &r);
        if (f) copy_report_print(&r, f);
        copy_report_free(&r);
    } else if (f) {
        fprintf(f, "student init: fresh (copy_teacher = 0, no init)\n");
    }
}
