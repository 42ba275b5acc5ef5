// `cgspn distill`: the training loop, its log and checkpoints, and the one-batch loss dump.
#include "distill.h"
#include "checkpoint.h"
#include "cli_args.h"
#include "data_config.h"
#include "data_parallel.h"
#include "device_config.h"
#include "loop.h"
#include "memory_report.h"
#include "model_config.h"
#include "optimizer.h"
#include "resolution.h"
#include "runlog.h"
#include "step_graph.h"
#include "../kernels/error.h"
#include "../nn/safetensors.h"
#include <math.h>
#include <omp.h>
#include <stddef.h>
#include <sys/stat.h>

static void distill_usage(FILE *f) {
    fprintf(f, "usage: cgspn distill CONFIG [--init PATH] [--key=value ...]\n"
               "Distills the student of CONFIG (model = cgspn | hybrid) from a frozen teacher\n"
               "(teacher = weights, teacher_config = its model keys) on the shards of data_shards\n"
               "(train_split; the student is evaluated on val_split with its own head):\n"
               "  stage = 1  every C-GSPN layer aligned to the teacher's attention output of its\n"
               "             block, from the teacher's block input (docs/design.md#stage1)\n"
               "  stage = 2  full student; PP and PB taps (taps = 9,18,27 | every 9 | all),\n"
               "             adaptors, alpha mean(L_PP) + beta mean(L_PB) (+ gamma CE)\n"
               "--init PATH starts the student from PATH (a Stage 1 checkpoint or run folder, or\n"
               "safetensors); without it the student copies the teacher where shapes match.\n"
               "Stage 2 across resolutions: teacher_img_size = R shows the teacher the image resized\n"
               "to R (antialiased) and resizes its taps to the student's grid (bilinear, half-pixel\n"
               "centres); multires = 378,448,518 draws the student's side per step (img_size = the\n"
               "largest). cgspn curriculum runs such stages one after another.\n"
               "Several teachers: extra_teachers = t2.cfg,t3.cfg (files of teacher keys: teacher,\n"
               "teacher_img_size, teacher_mean/std, taps, teacher_taps, loss weights, ...); phi_s = 1\n"
               "standardizes every teacher feature (PHI-S) from statistics gathered before step 1.\n"
               "Ctrl-C (SIGINT) or SIGTERM finishes the step, writes a checkpoint and exits 0;\n"
               "--resume=auto continues. Checkpoints also every ckpt_every steps and ckpt_minutes.\n"
               "Example: cgspn distill configs/fmnist_distill_stage2.cfg --init checkpoints/s1\n"
               "One step's loss, no training (parity with a PyTorch implementation):\n"
               "  cgspn distill CONFIG --images X.safetensors --loss-out L.safetensors [--init W]\n"
               "X holds \"images\" (B, in_chans, H, W) float and, with gamma > 0, \"targets\" (B, K);\n"
               "L gets \"loss\", \"part.NAME\" for every logged part and \"grad.NAME\" for every\n"
               "trainable parameter (fp32).\n\n");
    config_print_help(f);
}

// ---- the run ------------------------------------------------------------------------------------------

// The data cursor, the log window's partial sums and the count of skipped updates (so a resumed
// run logs the same lines). Version 2 ended before skipped (it resumes with none skipped).
typedef struct DistillCursor {
    uint32_t version, n_parts;
    int64_t epoch, step;          // the train loader's next batch
    double loss_sum;
    int64_t loss_n;
    float part_sums[DISTILL_MAX_PARTS];
    int64_t skipped;              // updates skipped for a non-finite loss or gradient norm
} DistillCursor;
#define DISTILL_CURSOR_VERSION 3
#define DISTILL_CURSOR_V2_BYTES offsetof(DistillCursor, skipped)
_Static_assert(sizeof(DistillCursor) <= CKPT_CURSOR_MAX, "distill cursor exceeds the checkpoint's");

static bool is_adaptor(const char *name) {
    return strncmp(name, ADAPTOR_PREFIX, strlen(ADAPTOR_PREFIX)) == 0;
}

// Values of the student's parameters (adaptors = 0) or of the adaptors (1), all or trainable.
static size_t count_values(const ParamTable *t, bool adaptors, bool trainable_only) {
    size_t n = 0;
    for (int i = 0; i < t->n; i++) {
        const Param *p = t->params[i];
        if (is_adaptor(p->name) == adaptors && (!trainable_only || p->trainable)) n += p->value.numel;
    }
    return n;
}

static void describe(const Distiller *d, const Config *c, FILE *f) {
    const Encoder *e = &d->student;
    char prefix[64];
    fprintf(f, "student model: %s, %d blocks, width %d, %dx%d tokens%s, %.3f M parameters (%.3f M "
            "trainable)", encoder_kind_name(e->cfg.kind), e->cfg.depth, e->cfg.width, e->grid_h, e->grid_w,
            encoder_prefix_text(e, prefix, sizeof prefix), count_values(&d->params, false, false) / 1e6,
            count_values(&d->params, false, true) / 1e6);
    if (e->cfg.kind != ENCODER_VIT)
        fprintf(f, ", C-GSPN latent %d%s", e->cfg.gspn_latent, e->cfg.gspn_shared_w ? " (shared w)" : "");
    fprintf(f, "\n");
    size_t trainable = params_count(&d->params, true), adaptors = count_values(&d->params, true, false);
    if (d->stage == 1) {
        const DistillTeacher *t0 = &d->teachers[0];
        fprintf(f, "distill: stage 1, %d C-GSPN layers aligned (blocks", t0->n_taps);
        for (int j = 0; j < t0->n_taps; j++) fprintf(f, "%s%d", j ? "," : " ", t0->taps[j] + 1);
        fprintf(f, "), training %s; %.3f M trainable parameters\n",
                strcmp(c->stage1_train, "gspn") == 0 ? "the C-GSPN layers" : "the C-GSPN layers and norm1",
                trainable / 1e6);
        return;
    }
    fprintf(f, "distill: stage 2 from %d teacher%s, gamma %g; adaptors %.3f M; %.3f M trainable "
            "parameters (adaptors included)\n", d->n_teachers, d->n_teachers > 1 ? "s" : "",
            (double)d->gamma, adaptors / 1e6, trainable / 1e6);
    for (int k = 0; k < d->n_teachers; k++) {
        const DistillTeacher *dt = &d->teachers[k];
        const Teacher *T = &dt->teacher;
        fprintf(f, "  teacher %d%s%s%s: taps at student blocks", k + 1, dt->file[0] ? " (" : "",
                dt->file, dt->file[0] ? ")" : "");
        bool same = true;
        for (int j = 0; j < dt->n_taps; j++) {
            fprintf(f, "%s%d", j ? "," : " ", dt->taps[j] + 1);
            same &= dt->teacher_blocks[j] == dt->taps[j];
        }
        if (!same) {   // paired with other teacher blocks (teacher_taps, or proportional depth)
            fprintf(f, " <- teacher blocks");
            for (int j = 0; j < dt->n_taps; j++) fprintf(f, "%s%d", j ? "," : " ", dt->teacher_blocks[j] + 1);
        }
        fprintf(f, " (%s%s%s), ", dt->tap_pp ? "PP" : "", dt->tap_pp && dt->tap_pb ? " + " : "",
                dt->tap_pb ? "PB" : "");
        if (dt->use_adaptors) fprintf(f, "adaptors %d -> %d", e->cfg.width, T->enc.cfg.width);
        else fprintf(f, "no adaptors");
        fprintf(f, ", alpha %g beta %g lambda1 %g lambda2 %g", (double)dt->alpha, (double)dt->beta,
                (double)dt->lambda1, (double)dt->lambda2);
        if (dt->trains_summary) fprintf(f, ", summary_weight %g", (double)dt->summary_weight);
        fprintf(f, "; %d px", dt->side);
        if (dt->have_norm)
            fprintf(f, ", renormalized to mean %g,%g,%g std %g,%g,%g", (double)dt->mean[0],
                    (double)dt->mean[1], (double)dt->mean[2], (double)dt->std[0], (double)dt->std[1],
                    (double)dt->std[2]);
        if (dt->phi_s) fprintf(f, ", PHI-S standardized");
        fprintf(f, "\n");
    }
}

// "resolution: student 518 px (37x37 tokens), teacher 378 px (27x27), taps resized bilinearly"
static void describe_resolution(const Distiller *d, const ResolutionViews *v, FILE *f) {
    int p = d->student.cfg.patch;
    fprintf(f, "resolution: student ");
    if (v->n_multires) {
        fprintf(f, "multires");
        for (int i = 0; i < v->n_multires; i++) fprintf(f, "%s%d", i ? "," : " ", v->multires[i]);
        fprintf(f, " px (one drawn per step; the loader's %d px image resized, antialiased)", v->img_size);
    } else {
        fprintf(f, "%d px (%dx%d tokens)", v->img_size, v->img_size / p, v->img_size / p);
    }
    for (int k = 0; k < d->n_teachers; k++)
        fprintf(f, ", teacher %d %d px (%dx%d tokens)", k + 1, d->teachers[k].side,
                d->teachers[k].teacher.enc.grid_h, d->teachers[k].teacher.enc.grid_w);
    fprintf(f, "; teachers see the student's image resized (antialiased), their taps resized "
            "bilinearly (half-pixel centres) to the student's grid\n");
}

// What the loop's hooks (train/loop.h) work on.
typedef struct DistillRun {
    const Config *c;
    const DistillOptions *o;
    Distiller *d;
    Ctx *ctx;
    DataParallel *dp;
    RunLog *log;
    Tape *tape;
    Loader *train, *val;
    ResolutionViews *views;
    float *raw;                              // the step's loss terms (d->n_raw) and LOOP_FLAGS
    float parts[DISTILL_MAX_PARTS];          // the step's logged parts
    float part_sums[DISTILL_MAX_PARTS];      // over the log window's updates
    char (*part_keys)[DISTILL_PART_NAME + 8];
    StepGraph graph;                         // the step replayed as a CUDA graph (one rank)
    Tensor *x, *xt[DISTILL_MAX_TEACHERS], *tgt;   // the views and targets the step body reads
    EvalResult ev;                           // the last evaluation
} DistillRun;

static void save_checkpoint(void *self, long step, const LoopWindow *w) {
    const DistillRun *r = self;
    const Distiller *d = r->d;
    CkptState st = {.step = step};
    LoaderCursor lc = loader_cursor_get(r->train);
    DistillCursor cur = {DISTILL_CURSOR_VERSION, (uint32_t)d->n_parts, lc.epoch, lc.step, w->loss_sum,
                         w->loss_n, {0}, w->skipped};
    memcpy(cur.part_sums, r->part_sums, (size_t)d->n_parts * sizeof(float));
    st.cursor_bytes = sizeof cur;
    memcpy(st.cursor, &cur, sizeof cur);
    CkptOptions o = {.keep_last = r->c->keep_last};
    char saved[1024];
    dp_save(r->dp, r->log->dir, &o, r->c, &d->params, NULL, r->ctx, &st, saved, sizeof saved);
    if (r->log->tty) printf("\r\033[K");
    printf("checkpoint: %s\n", saved);
}

static void print_eval(const RunLog *log, long step, const EvalResult *ev, double seconds) {
    if (log->tty) printf("\r\033[K");
    printf("eval  step %ld | student test top1 %.2f%% (its head) | top5 %.2f%% | loss %.4f | "
           "%ld images", step, 100 * ev->top1, 100 * ev->top5, ev->loss, ev->count);
    if (seconds >= 0) printf(" | %.1f s", seconds);
    printf("\n");
}

// The loss terms (kept) and the backward of one rank's batch, as step_graph_run captures and
// replays it.
static Tensor *graph_body(void *self) {
    DistillRun *r = self;
    Tensor *raw_dev;
    Tensor *loss = distill_loss_views(r->d, r->tape, r->x, r->xt, r->tgt, &raw_dev);
    dp_backward(r->dp, r->tape, loss, true);
    return raw_dev;
}

// One global batch: the student's and teachers' views, the loss, backward. The loss terms' mean
// over ranks carries the loop's flags in the same collective.
static LoopStepResult distill_step(void *self, long step, float *flags) {
    DistillRun *r = self;
    Distiller *d = r->d;
    const Config *c = r->c;
    Tape *tape = r->tape;
    char err[4096];
    const Batch *b = loader_next(r->train, err, sizeof err);
    if (!b) CG_FAIL("run cgspn data verify on the shards", "%s", err);
    tape_reset(tape);
    // The student's image at this step's side (multires) and the teacher's at its own.
    int side = resolution_student_side(r->views, step);
    encoder_set_image_size(&d->student, side, side);
    Tensor *x, *xt[DISTILL_MAX_TEACHERS];
    distill_views(d, r->views, tape, b, side, &x, xt);
    if (r->o->nonfinite_at == step + 1) op_scale_fwd(r->ctx, x, NAN, x);
    Tensor *tgt = NULL;
    if (d->trains_head) {   // the loader's soft targets (label smoothing, mixup), K wide
        tgt = tape_tensor(tape, 2, (int[]){b->count, c->num_classes}, true);   // the shards' classes
        tensor_upload(r->ctx, tgt, b->targets);
    }
    d->student.drop_path.step = step;
    d->student.drop_path.step_at = step_graph_set_step(&r->graph, step);
    d->student.drop_path.first_sample = r->dp->rank * b->count;   // masks by global sample index
    // One rank: the loss terms after the backward, which may be replayed (train/step_graph.h).
    if (r->graph.on && r->dp->world == 1 && r->o->nonfinite_at != step + 1) {
        Tensor *in[2 + DISTILL_MAX_TEACHERS] = {x};
        int n = 1;
        for (int k = 0; k < d->n_teachers; k++)
            if (xt[k] != x) in[n++] = xt[k];
        if (tgt) in[n++] = tgt;
        r->x = x, r->tgt = tgt;
        memcpy(r->xt, xt, sizeof r->xt);
        tensor_download(r->ctx, step_graph_run(&r->graph, in, n, graph_body, r), r->raw);
        distill_parts(d, r->raw, r->parts);   // one rank: the terms are the global means, flags as set
        return (LoopStepResult){r->raw[d->n_raw - 1], (long)b->epoch};
    }
    Tensor *raw_dev;
    Tensor *loss = distill_loss_views(d, tape, x, xt, tgt, &raw_dev);
    tensor_download(r->ctx, raw_dev, r->raw);
    memcpy(r->raw + d->n_raw, flags, LOOP_FLAGS * sizeof(float));
    dp_mean_f32(r->dp, r->raw, d->n_raw + LOOP_FLAGS, "the step's loss terms");   // global means
    memcpy(flags, r->raw + d->n_raw, LOOP_FLAGS * sizeof(float));
    float loss_v = r->raw[d->n_raw - 1];
    // Every rank runs the backward (the gradient collectives must match); a non-finite loss is
    // non-finite on every rank (the mean), and the loop discards the step.
    dp_backward(r->dp, tape, loss, true);
    distill_parts(d, r->raw, r->parts);
    return (LoopStepResult){loss_v, (long)b->epoch};
}

static void distill_updated(void *self, long step) {
    DistillRun *r = self;
    for (int k = 0; k < r->d->n_parts; k++) r->part_sums[k] += r->parts[k];
}

// The parts' means over the window, below the progress line and into metrics.jsonl.
static void distill_log(void *self, long n_updates, const char **keys, double *vals, int *n) {
    DistillRun *r = self;
    const Distiller *d = r->d;
    printf("      ");
    for (int k = 0; k < d->n_parts; k++) {
        double mean = n_updates ? r->part_sums[k] / (double)n_updates : NAN;
        printf(" %s %.4f", d->part_names[k], mean);
        if (*n < 7 + LOOP_EXTRA_METRICS - 1) keys[*n] = r->part_keys[k], vals[(*n)++] = mean;
        r->part_sums[k] = 0;
    }
    printf("\n");
}

static void distill_eval(void *self, long step) {
    DistillRun *r = self;
    double t0 = now_seconds();
    encoder_set_image_size(&r->d->student, r->c->img_size, r->c->img_size);   // val: img_size
    r->ev = classify_evaluate_dp(r->ctx, &r->d->student, r->val, r->dp, r->c->cuda_graph);
    print_eval(r->log, step, &r->ev, now_seconds() - t0);
    const char *k2[] = {"test_top1", "test_top5", "test_loss"};
    double v2[] = {r->ev.top1, r->ev.top5, r->ev.loss};
    runlog_metrics(r->log, step, 3, k2, v2);
}

TrainResult distill_train(const Config *c, const DistillOptions *o) {
    DistillOptions none = {0};
    if (!o) o = &none;
    TrainResult res = {0};
    CG_CHECK(c->accum_steps == 1, "set accum_steps = 1 (or a smaller batch_size)",
             "cgspn distill does not accumulate gradients (accum_steps = %d)", c->accum_steps);
    Ctx ctx = device_open(c);
    device_describe(&ctx, stdout);
    CG_CHECK(c->drop_path >= 0 && c->drop_path < 1, "", "drop_path %g: expected [0, 1)", c->drop_path);
    Distiller d;
    distiller_init(&d, c, &ctx);
    for (int k = 0; k < d.n_teachers; k++) teacher_describe(&d.teachers[k].teacher, stdout);
    describe(&d, c, stdout);
    // Stochastic depth in the Stage 2 student, as cgspn train has it (the teacher runs without).
    if (d.stage == 2) d.student.drop_path = (EncoderDropPath){.rate = c->drop_path, .seed = (uint64_t)c->seed};

    DataParallel dp;   // ranks each take a slice of every batch (train/data_parallel.h)
    dp_open(&dp, o->dist, &d.params, &ctx, c);
    ResolutionViews views;
    char verr[1024];
    if (resolution_views_init_err(&views, c, verr, sizeof verr) != 0) CG_FAIL("", "%s", verr);
    bool other_side = false;
    for (int k = 0; k < d.n_teachers; k++) other_side |= d.teachers[k].side != c->img_size;
    if (views.n_multires > 0 || other_side) describe_resolution(&d, &views, stdout);
    bool gpu = ctx.device == DEVICE_CUDA, has_head = c->num_classes > 0;
    Loader *train = dp_loader_open(&dp, c, 1, c->batch_size, gpu);
    float norm_mean[3], norm_std[3];   // the student's input normalization
    loader_norm(train, norm_mean, norm_std);
    distill_set_normalization(&d, norm_mean, norm_std);
    Loader *val = has_head ? dp_loader_open(&dp, c, 0, c->eval_batch_size > 0 ? c->eval_batch_size
                                                                  : c->batch_size, gpu) : NULL;
    data_check_classes(c, train, val, "cgspn distill");
    RunPlan plan = run_plan(c, (long)loader_steps_per_epoch(train), 1,
                            (unsigned long long)loader_dataset(train)->m.images);
    long steps_per_epoch = plan.steps_per_epoch, total = plan.total, warmup = plan.warmup;
    long eval_every = plan.eval_every;
    OptimizerConfig opt = plan.opt;
    long first = 0;
    double loss_sum = 0;
    long loss_n = 0, skipped = 0;
    float part_sums[DISTILL_MAX_PARTS] = {0};
    char run_dir[1024] = "", from[1024], err[4096];
    if (c->run_name[0]) snprintf(run_dir, sizeof run_dir, "%s/%s", c->out_dir, c->run_name);
    int found = ckpt_resolve_err(c->resume, run_dir, from, sizeof from, err, sizeof err);
    if (found < 0) CG_FAIL("", "%s", err);
    if (found == 0 && strcmp(c->resume, "auto") == 0)
        printf("resume = auto: no complete checkpoint in %s yet; starting at step 0\n", run_dir);
    if (found == 1) {
        CkptState st;
        dp_load(&dp, from, c, &d.params, NULL, &ctx, &st);
        DistillCursor cur = {0};
        CG_CHECK(st.cursor_bytes == sizeof cur || st.cursor_bytes == DISTILL_CURSOR_V2_BYTES,
                 "resume a checkpoint of cgspn distill",
                 "%s: data cursor of %zu bytes, expected %zu (not a distillation checkpoint)", from,
                 st.cursor_bytes, sizeof cur);
        memcpy(&cur, st.cursor, st.cursor_bytes);
        bool known = st.cursor_bytes == sizeof cur ? cur.version == DISTILL_CURSOR_VERSION
                                                   : cur.version == 2;
        CG_CHECK(known && cur.n_parts == (uint32_t)d.n_parts,
                 "resume with the config of the checkpoint (stage, taps, tap_pp, tap_pb)",
                 "%s: cursor version %u with %u loss parts, this run has version %d with %d", from,
                 cur.version, cur.n_parts, DISTILL_CURSOR_VERSION, d.n_parts);
        first = st.step;
        CG_CHECK(first <= total, "raise max_steps / epochs, or resume an earlier checkpoint",
                 "%s is at step %ld, past the %ld steps of this run", from, first, total);
        if (loader_cursor_set(train, (LoaderCursor){cur.epoch, cur.step}, err, sizeof err) != 0)
            CG_FAIL("", "%s", err);
        loss_sum = cur.loss_sum;
        loss_n = (long)cur.loss_n;
        skipped = (long)cur.skipped;
        memcpy(part_sums, cur.part_sums, (size_t)d.n_parts * sizeof(float));
        printf("resumed from %s at step %ld\n", from, first);
    } else {
        distiller_init_student(&d, c, stdout);
        if (d.stage == 2) {   // PHI-S statistics on a loader of their own (train's cursor stays)
            Loader *stats = dp_loader_open(&dp, c, 1, c->batch_size, gpu);
            distill_phi_s_gather(&d, stats, &views, &dp, c->phi_s_batches, stdout);
            loader_close(stats);
        }
    }
    RunLog log;
    dp_runlog_open(&dp, &log, c, "distill");
    snprintf(res.run_dir, sizeof res.run_dir, "%s", log.dir);
    printf("distilling: %ld steps (%ld per epoch), batch %d", total, steps_per_epoch, c->batch_size);
    if (dp.world > 1) printf(" (%d ranks x %d)", dp.world, c->batch_size / dp.world);
    printf(", lr %g, warmup %ld\n", opt.schedule.base_lr, warmup);

    Arena arena;
    arena_init(&arena, &ctx, ARENA_CHUNK_BYTES);
    Tape tape;
    tape_init(&tape, &ctx, &arena);
    const ParamTable *tables[1 + DISTILL_MAX_TEACHERS] = {&d.params};
    for (int k = 0; k < d.n_teachers; k++) tables[1 + k] = &d.teachers[k].teacher.params;
    int n_tables = 1 + d.n_teachers;
    MemoryPlan held = memory_plan(&ctx, tables, n_tables, &arena);
    memory_header_print(stdout, &held);
    memory_peak_take(&ctx);   // the window of the first progress line starts here
    DistillRun run = {.c = c, .o = o, .d = &d, .ctx = &ctx, .dp = &dp, .log = &log, .tape = &tape,
                      .train = train, .val = val, .views = &views,
                      .raw = cg_malloc((size_t)(d.n_raw + LOOP_FLAGS) * sizeof(float)),
                      .part_keys = cg_malloc((size_t)d.n_parts * sizeof *run.part_keys)};
    memcpy(run.part_sums, part_sums, sizeof part_sums);
    step_graph_init(&run.graph, &ctx, c->cuda_graph);
    for (int k = 0; k < d.n_parts; k++)
        snprintf(run.part_keys[k], sizeof run.part_keys[k], "loss_%s", d.part_names[k]);
    LoopSpec spec = {
        .c = c, .ctx = &ctx, .dp = &dp, .log = &log, .params = &d.params, .arena = &arena,
        .opt = &opt, .first = first, .total = total, .eval_every = eval_every,
        .stop_after = o->stop_after, .step_losses = o->step_losses,
        .images_per_step = c->batch_size, .tables = tables, .n_tables = n_tables};
    LoopHooks hooks = {&run, distill_step, distill_updated, distill_log,
                       has_head ? distill_eval : NULL, save_checkpoint};
    LoopResult lr = loop_run(&spec, &hooks, (LoopWindow){loss_sum, loss_n, skipped});
    long step = lr.step;
    EvalResult ev = run.ev;
    res.status = lr.status;
    res.nonfinite_step = lr.nonfinite_step;
    res.skipped = lr.skipped;
    if (has_head && ev.count == 0 && res.status == TRAIN_DONE) {   // resumed at the end
        encoder_set_image_size(&d.student, c->img_size, c->img_size);
        ev = classify_evaluate_dp(&ctx, &d.student, val, &dp, c->cuda_graph);
        print_eval(&log, step, &ev, -1);
    }
    char dur[32];
    if (res.status == TRAIN_DONE) {
        printf("done: %ld steps in %s", total, format_duration(now_seconds() - log.t_start, dur, sizeof dur));
        if (has_head) printf(", final student test top1 %.2f%%", 100 * ev.top1);
        printf("\n");
    }
    res.graph_steps = run.graph.replayed;
    step_graph_free(&run.graph);
    free(run.raw);
    free(run.part_keys);
    resolution_views_free(&views);
    loader_close(train);
    if (val) loader_close(val);
    tape_free(&tape);
    arena_free(&arena);
    runlog_close(&log);
    dp_close(&dp);
    distiller_free(&d);
    device_close(&ctx);
    res.step = step;
    res.total = total;
    res.eval = ev;
    return res;
}

// A float tensor of the file as fp32 host values (shape into shape[]), or NULL when absent.
static float *read_host_f32(StFile *f, const char *name, int ndim, int *shape) {
    const StTensor *s = st_find(f, name);
    if (!s) return NULL;
    CG_CHECK(s->ndim == ndim, "", "%s: tensor %s has %d dims, expected %d", f->path, name, s->ndim, ndim);
    for (int i = 0; i < ndim; i++) shape[i] = (int)s->shape[i];
    float *host = cg_malloc(s->numel * sizeof(float));
    char err[1024];
    if (st_read_f32_err(f, s, host, err, sizeof err) != 0) CG_FAIL("", "%s", err);
    return host;
}

// The student's normalization for teachers with teacher_mean / teacher_std: data_mean, data_std.
static void images_normalization(const Distiller *d, const Config *c, float *mean, float *std) {
    bool needed = false;
    for (int k = 0; k < d->n_teachers; k++) needed |= d->teachers[k].have_norm;
    if (!needed) return;
    char err[512];
    int nm = config_parse_float_list("data_mean", c->data_mean, mean, 3, err, sizeof err);
    int ns = config_parse_float_list("data_std", c->data_std, std, 3, err, sizeof err);
    CG_CHECK(nm == d->student.cfg.in_chans && ns == nm, "set data_mean and data_std (how the images "
             "were normalized)", "--images with teacher_mean / teacher_std: the images' own "
             "normalization is needed to renormalize them for the teacher");
}

// `--images X --loss-out L`: the loss of one batch and its gradients, written as fp32.
static void distill_loss_once(const Config *c, const char *images, const char *out) {
    Ctx ctx = device_open(c);
    device_describe(&ctx, stdout);
    Distiller d;
    distiller_init(&d, c, &ctx);
    for (int k = 0; k < d.n_teachers; k++) teacher_describe(&d.teachers[k].teacher, stdout);
    describe(&d, c, stdout);
    distiller_init_student(&d, c, stdout);
    CG_CHECK(!c->phi_s, "set phi_s = 0", "--images: the PHI-S statistics come from a training run");
    float mean[3] = {0}, std[3] = {1, 1, 1};
    images_normalization(&d, c, mean, std);
    distill_set_normalization(&d, mean, std);
    Arena arena;
    arena_init(&arena, &ctx, ARENA_CHUNK_BYTES);
    Tape tape;
    tape_init(&tape, &ctx, &arena);
    StFile f;
    st_open(&f, images);
    int ishape[4], tshape[2];
    float *img_host = read_host_f32(&f, "images", 4, ishape);
    CG_CHECK(img_host, "write the batch as a float tensor named \"images\" (B,C,H,W)", "%s: no tensor "
             "\"images\"", images);
    CG_CHECK(ishape[2] == c->img_size && ishape[3] == c->img_size, "set img_size to the images' side",
             "%s: images of %dx%d, img_size is %d", images, ishape[2], ishape[3], c->img_size);
    float *tgt_host = read_host_f32(&f, "targets", 2, tshape);
    CG_CHECK(tgt_host || !d.trains_head, "add \"targets\" (B, num_classes), rows summing to 1",
             "%s: gamma > 0 needs targets", images);
    Tensor *tgt = NULL;
    if (tgt_host) {
        tgt = tape_tensor(&tape, 2, tshape, true);
        tensor_upload(&ctx, tgt, tgt_host);
    }
    ResolutionViews views;
    char verr[1024];
    if (resolution_views_init_err(&views, c, verr, sizeof verr) != 0) CG_FAIL("", "%s", verr);
    Batch b = {.images = img_host, .count = ishape[0], .channels = ishape[1], .height = ishape[2],
               .width = ishape[3]};
    Tensor *img, *teacher_imgs[DISTILL_MAX_TEACHERS];
    distill_views(&d, &views, &tape, &b, c->img_size, &img, teacher_imgs);
    Tensor *raw;
    Tensor *loss = distill_loss_views(&d, &tape, img, teacher_imgs, tgt, &raw);
    params_zero_grads(&d.params, &ctx);
    tape_backward(&tape, loss);
    float *rawh = tensor_to_host_f32(&ctx, raw), parts[DISTILL_MAX_PARTS];
    distill_parts(&d, rawh, parts);
    int n = 1 + d.n_parts + d.params.n, k = 0;
    StWriteTensor *w = cg_calloc((size_t)n, sizeof(StWriteTensor));
    char (*names)[PARAM_NAME_MAX + 8] = cg_calloc((size_t)n, sizeof *names);
    float **data = cg_calloc((size_t)n, sizeof(float *));
    float lossv = rawh[d.n_raw - 1];
    w[k++] = (StWriteTensor){"loss", ST_F32, 1, {1}, &lossv};
    for (int i = 0; i < d.n_parts; i++, k++) {
        snprintf(names[k], sizeof names[k], "part.%s", d.part_names[i]);
        w[k] = (StWriteTensor){names[k], ST_F32, 1, {1}, &parts[i]};
    }
    for (int i = 0; i < d.params.n; i++) {
        const Param *p = d.params.params[i];
        if (!p->trainable) continue;
        snprintf(names[k], sizeof names[k], "grad.%s", p->name);
        data[k] = tensor_to_host_f32(&ctx, &p->grad);
        w[k].name = names[k];
        w[k].dtype = ST_F32;
        w[k].ndim = params_file_shape(p, w[k].shape);
        w[k].data = data[k];
        k++;
    }
    char err[2048];
    if (st_write_err(out, w, k, NULL, 0, NULL, NULL, err, sizeof err) != 0) CG_FAIL("", "%s", err);
    printf("loss %.9g", lossv);
    for (int i = 0; i < d.n_parts; i++) printf(" | %s %.6g", d.part_names[i], parts[i]);
    printf("\nwrote %s: loss, %d parts, %d gradients\n", out, d.n_parts, k - 1 - d.n_parts);
    for (int i = 0; i < n; i++) free(data[i]);
    free(data); free(names); free(w); free(rawh);
    free(img_host); free(tgt_host);
    resolution_views_free(&views);
    st_close(&f);
    tape_free(&tape);
    arena_free(&arena);
    distiller_free(&d);
    device_close(&ctx);
}

int cmd_distill(int argc, char **argv) {
    if (cli_wants_help(argc, argv, 2)) {
        distill_usage(stdout);
        return 0;
    }
    const char *init = cli_take_flag(&argc, argv, 2, "--init");
    const char *images = cli_take_flag(&argc, argv, 2, "--images");
    const char *loss_out = cli_take_flag(&argc, argv, 2, "--loss-out");
    Config c;
    config_defaults(&c);
    int rest = config_parse_args(&c, argc, argv, 2);
    CG_CHECK(rest == 0, "see cgspn distill --help", "unexpected argument '%s'", argv[2]);
    if (init) {
        CG_CHECK(strlen(init) < sizeof c.init, "", "--init path too long");
        snprintf(c.init, sizeof c.init, "%s", init);
    }
    if (c.threads > 0) omp_set_num_threads(c.threads);
    CG_CHECK(!images == !loss_out, "give both --images and --loss-out", "--images and --loss-out go together");
    if (images) {
        distill_loss_once(&c, images, loss_out);
        return 0;
    }
    CG_CHECK(strcmp(c.resume, "auto") != 0 || c.run_name[0], "set run_name to the run to continue",
             "resume = auto needs run_name: it continues the run folder out_dir/run_name");
    TrainResult r = distill_train(&c, NULL);
    return r.status == TRAIN_NONFINITE ? 1 : 0;
}
