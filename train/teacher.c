#include "teacher.h"
#include "checkpoint.h"
#include "model_config.h"
#include "../kernels/ops.h"
#include "../kernels/error.h"
#include <stdarg.h>
#include <sys/stat.h>

__attribute__((format(printf, 3, 4)))
static void append(char *err, size_t n, const char *fmt, ...) {
    size_t len = strlen(err);
    if (len + 1 >= n) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err + len, n - len, fmt, ap);
    va_end(ap);
}

static bool is_dir(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

int teacher_image_side(const Config *c) {
    return c->teacher_img_size > 0 ? c->teacher_img_size : c->img_size;
}

// The encoder of T->cfg at image side x side: parameters registered and allocated frozen.
static void teacher_build(Teacher *T, int side, Ctx *ctx) {
    T->cfg.img_size = side;
    EncoderConfig ecfg = encoder_config_from(&T->cfg);
    ecfg.grad_checkpoint = 0;   // frozen: nothing to recompute
    params_init_table(&T->params);
    encoder_register(&T->enc, &ecfg, &T->params);
    params_alloc_frozen(&T->params, ctx);
}

int teacher_load_err(Teacher *T, const Config *c, Ctx *ctx, char *err, size_t n) {
    memset(T, 0, sizeof *T);
    if (!c->teacher[0])
        return cg_set_error(err, n, "no teacher: set teacher to its weights (a safetensors file, or "
                            "a checkpoint or run folder of cgspn train)");
    char cfg_default[1024] = "";
    struct stat sb;
    // teacher = random: freshly initialized weights of teacher_config's model (benchmarks: the
    // step costs the same with any weights, and no multi-GB file has to exist).
    const bool random = strcmp(c->teacher, TEACHER_RANDOM) == 0;
    if (random)
        snprintf(T->weights, sizeof T->weights, "%s (initialized from seed %d)", TEACHER_RANDOM, c->seed);
    else if (stat(c->teacher, &sb) != 0)
        return cg_set_error(err, n, "teacher = %s: %s\n  hint: train one (cgspn train "
                            "configs/fmnist_vit.cfg --global_pool=avg --run_name=NAME, then teacher = "
                            "checkpoints/NAME) or point teacher at its weights", c->teacher,
                            strerror(errno));
    if (random) {
        // named above; the model keys must come from teacher_config
    } else if (is_dir(c->teacher)) {
        char ckpt[960];   // leaves room for "/model.safetensors" in T->weights
        int found = ckpt_resolve_err(c->teacher, "", ckpt, sizeof ckpt, err, n);
        if (found < 0) {
            char inner[2048];
            snprintf(inner, sizeof inner, "%s", err);
            return cg_set_error(err, n, "teacher: %s", inner);
        }
        snprintf(T->weights, sizeof T->weights, "%s/model.safetensors", ckpt);
        snprintf(cfg_default, sizeof cfg_default, "%s/config.cfg", ckpt);
    } else {
        snprintf(T->weights, sizeof T->weights, "%s", c->teacher);
    }
    const char *cfg = c->teacher_config[0] ? c->teacher_config : cfg_default;
    if (!cfg[0])
        return cg_set_error(err, n, "teacher = %s is a weights file: set teacher_config to the config "
                            "of its model (the cfg it was trained with, e.g. configs/fmnist_vit.cfg)",
                            c->teacher);
    snprintf(T->config_path, sizeof T->config_path, "%s", cfg);
    config_defaults(&T->cfg);
    char e2[2048];
    if (config_load_file_err(&T->cfg, cfg, e2, sizeof e2) != 0)
        return cg_set_error(err, n, "teacher_config: %s", e2);
    if (T->cfg.in_chans != c->in_chans)
        return cg_set_error(err, n, "the teacher (%s) takes in_chans = %d, the run's images have %d",
                            cfg, T->cfg.in_chans, c->in_chans);
    // The teacher sees the run's images (or teacher_img_size); a pos_embed follows its grid.
    int side = teacher_image_side(c);
    EncoderConfig ecfg = encoder_config_from(&T->cfg);
    if (ecfg.kind == ENCODER_GSPN_HIER)
        return cg_set_error(err, n, "the teacher (%s) is a gspn_hier classifier: its stages change "
                            "width and grid, and distillation pairs blocks on one token grid\n  hint: "
                            "a teacher is a vit, cgspn or hybrid encoder", cfg);
    if (side % ecfg.patch != 0)
        return cg_set_error(err, n, "%s %d is not a multiple of the teacher's patch %d (%s)",
                            c->teacher_img_size > 0 ? "teacher_img_size" : "img_size", side,
                            ecfg.patch, cfg);
    teacher_build(T, side, ctx);
    T->report.pos_grid_h = T->enc.grid_h;
    T->report.pos_grid_w = T->enc.grid_w;
    if (random) {
        params_initialize(&T->params, ctx, (uint64_t)c->seed);
    } else if (params_load_safetensors_err(&T->params, ctx, T->weights, c->teacher_prefix, &T->report,
                                           e2, sizeof e2) != 0) {
        cg_set_error(err, n, "teacher: %s", e2);
        append(err, n, "\n  hint: the teacher's model keys come from %s%s; check them and "
               "teacher_prefix ('%s')", cfg, c->teacher_config[0] ? " (teacher_config)" : "",
               c->teacher_prefix);
        params_free(&T->params, ctx);
        load_report_free(&T->report);
        return -1;
    }
    return 0;
}

void teacher_init_fresh(Teacher *T, const Config *model, int side, Ctx *ctx, uint64_t seed) {
    memset(T, 0, sizeof *T);
    T->cfg = *model;
    snprintf(T->weights, sizeof T->weights, "(fresh weights, seed %llu)", (unsigned long long)seed);
    snprintf(T->config_path, sizeof T->config_path, "(the run's model keys)");
    teacher_build(T, side, ctx);
    params_initialize(&T->params, ctx, seed);
}

void teacher_load(Teacher *T, const Config *c, Ctx *ctx) {
    char err[4096];
    if (teacher_load_err(T, c, ctx, err, sizeof err) != 0) CG_FAIL("", "%s", err);
}

void teacher_free(Teacher *T, Ctx *ctx) {
    params_free(&T->params, ctx);
    load_report_free(&T->report);
}

void teacher_describe(const Teacher *T, FILE *f) {
    fprintf(f, "teacher: %s (model keys from %s), frozen; ", T->weights, T->config_path);
    load_report_print(&T->report, f);
    fprintf(f, "teacher ");
    encoder_describe(&T->enc, &T->params, f);
}

// y (B, N, C) = the patch tokens of x (B, prefix + N, C), a new tensor on keep's arena.
static Tensor *keep_patches(Tape *keep, const Teacher *T, const Tensor *x) {
    int B = x->shape[0], N = T->enc.grid_h * T->enc.grid_w, C = x->shape[2];
    Tensor *y = tape_tensor(keep, 3, (int[]){B, N, C}, x->dtype == DTYPE_F32);
    y->dtype = x->dtype;
    op_slice_tokens_fwd(keep->ctx, x, T->enc.prefix, y);
    return y;
}

void teacher_forward(Teacher *T, Tape *keep, Tensor *img, const TeacherWant *want,
                     TeacherTaps *out) {
    memset(out, 0, sizeof *out);
    int depth = T->enc.cfg.depth, last = want->summary ? depth - 1 : -1;   // the last block to run
    for (int i = 0; i < depth; i++) {
        if (want->pp[i] || want->pb[i]) last = i > last ? i : last;
        if (want->in[i] && i - 1 > last) last = i - 1;
    }
    Ctx *ctx = keep->ctx;
    // The teacher runs on keep's arena without gradients, each piece in a scope: what a block
    // makes beyond the taps and the stream it hands on is released when the block is done, for
    // the student's forward and backward to reuse.
    Arena *arena = keep->arena;
    Tape run;
    tape_init(&run, ctx, arena);
    tape_set_grad_enabled(&run, false);
    const int clock = arena->stamp;
    arena->stamp = ARENA_SCOPE;
    Tensor *x = encoder_embed(&run, &T->enc, img);                  // (B, prefix+N, C) fp32
    arena_restamp(arena, x->data, clock);   // the stream a block hands on outlives the scope
    arena_release_scope(arena);
    for (int i = 0; i < depth && i <= last + 1; i++) {
        arena->stamp = clock;
        if (want->in[i]) out->in[i] = keep_patches(keep, T, x);
        if (i > last) break;
        Tensor *pp = NULL;
        arena->stamp = ARENA_SCOPE;   // the block's activations are dead once it has run
        Tensor *y = encoder_block_forward(&run, &T->enc, &T->enc.blocks[i], x,
                                          want->pp[i] ? &pp : NULL);
        arena->stamp = clock;
        if (pp) out->pp[i] = keep_patches(keep, T, pp);
        arena_restamp(arena, y->data, clock);
        arena_release_scope(arena);
        tape_release(keep, x);
        x = y;
        if (want->pb[i]) out->pb[i] = keep_patches(keep, T, x);
    }
    arena->stamp = clock;
    if (want->summary) {
        arena->stamp = ARENA_SCOPE;
        Tensor *s = encoder_pool(&run, &T->enc, encoder_final_norm(&run, &T->enc, x));   // (B, C)
        arena->stamp = clock;
        out->summary = tape_tensor(keep, 2, s->shape, true);
        op_scale_fwd(ctx, s, 1.0f, out->summary);   // fp32, converting on the way
        arena_release_scope(arena);
    }
    tape_release(keep, x);   // the taps are copies
    tape_free(&run);
}

void teacher_taps_resize(Tape *keep, const Teacher *T, TeacherTaps *tt, int grid_h, int grid_w) {
    int h = T->enc.grid_h, w = T->enc.grid_w;
    if (h == grid_h && w == grid_w) return;
    Tensor **lists[] = {tt->in, tt->pp, tt->pb};
    for (int l = 0; l < 3; l++)
        for (int i = 0; i < ENCODER_MAX_DEPTH; i++) {
            Tensor *x = lists[l][i];
            if (!x) continue;
            int B = x->shape[0], C = x->shape[2];
            Tensor grid = *x;   // (B, h*w, C) seen as the (B, h, w, C) grid it is
            tensor_set_shape(&grid, 4, (int[]){B, h, w, C});
            Tensor *y = tape_tensor(keep, 4, (int[]){B, grid_h, grid_w, C}, x->dtype == DTYPE_F32);
            y->dtype = x->dtype;
            op_resize_bilinear_fwd(keep->ctx, &grid, y);                    // (B, H, W, C)
            tensor_set_shape(y, 3, (int[]){B, grid_h * grid_w, C});
            lists[l][i] = y;
        }
}

// ---- student init -----------------------------------------------------------------------------

static void list_add(char ***list, int *count, const char *name) {
    *list = cg_realloc(*list, (size_t)(*count + 1) * sizeof(char *));
    (*list)[(*count)++] = cg_strdup(name);
}

void student_copy_from_teacher(ParamTable *student, const ParamTable *teacher, Ctx *ctx,
                               const char *skip_prefix, CopyReport *r) {
    memset(r, 0, sizeof *r);
    size_t skip = skip_prefix ? strlen(skip_prefix) : 0;
    for (int i = 0; i < student->n; i++) {
        Param *p = student->params[i];
        if (skip && strncmp(p->name, skip_prefix, skip) == 0) continue;
        const Param *q = params_find(teacher, p->name);
        char why[PARAM_NAME_MAX + 96], a[64], b[64];
        if (!q) {
            snprintf(why, sizeof why, "%s (not in the teacher)", p->name);
            list_add(&r->kept, &r->n_kept, why);
        } else if (!tensor_same_shape(&p->value, &q->value)) {
            snprintf(why, sizeof why, "%s (shape %s, the teacher's %s)", p->name,
                     tensor_shape_str(&p->value, a, sizeof a), tensor_shape_str(&q->value, b, sizeof b));
            list_add(&r->kept, &r->n_kept, why);
        } else {
            float *host = tensor_to_host_f32(ctx, &q->value);
            params_set_value(student, i, ctx, host);
            free(host);
            list_add(&r->copied, &r->n_copied, p->name);
            r->values_copied += p->value.numel;
        }
    }
}

// "blocks.12.mlp.fc1.weight (why)" -> "blocks.*.mlp.fc1.weight (why)"
static void fold_blocks(const char *name, char *out, size_t n) {
    const char *p = name;
    size_t k = 0;
    while (*p && k + 1 < n) {
        if (strncmp(p, "blocks.", 7) == 0 && p[7] >= '0' && p[7] <= '9') {
            for (const char *s = "blocks.*"; *s && k + 1 < n; s++) out[k++] = *s;
            p += 7;
            while (*p >= '0' && *p <= '9') p++;
        } else {
            out[k++] = *p++;
        }
    }
    out[k] = 0;
}

// The distinct folded names of a list, in order of first appearance, comma separated.
static void print_folded(FILE *f, char **names, int n) {
    char **seen = cg_calloc((size_t)(n ? n : 1), sizeof(char *));
    int n_seen = 0;
    for (int i = 0; i < n; i++) {
        char folded[PARAM_NAME_MAX + 128];
        fold_blocks(names[i], folded, sizeof folded);
        bool dup = false;
        for (int k = 0; k < n_seen && !dup; k++) dup = strcmp(seen[k], folded) == 0;
        if (!dup) seen[n_seen++] = cg_strdup(folded);
    }
    for (int k = 0; k < n_seen; k++) {
        fprintf(f, "%s%s", k ? ", " : "", seen[k]);
        free(seen[k]);
    }
    free(seen);
}

void copy_report_print(const CopyReport *r, FILE *f) {
    fprintf(f, "student init from the teacher: copied %d tensors (%.3f M values): ", r->n_copied,
            r->values_copied / 1e6);
    print_folded(f, r->copied, r->n_copied);
    fprintf(f, "\n  not copied (%d, initialized fresh): ", r->n_kept);
    print_folded(f, r->kept, r->n_kept);
    fprintf(f, "\n");
}

void copy_report_free(CopyReport *r) {
    for (int i = 0; i < r->n_copied; i++) free(r->copied[i]);
    for (int i = 0; i < r->n_kept; i++) free(r->kept[i]);
    free(r->copied);
    free(r->kept);
    memset(r, 0, sizeof *r);
}
