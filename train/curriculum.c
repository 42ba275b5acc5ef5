// `cgspn curriculum`: see curriculum.h. Each trained stage is one distill_train run (the Stage 2
// loop of train/distill.c) with the stage's config; this file only plans the stages, derives their
// configs and skips the finished ones.
#include "curriculum.h"
#include "../dist/dist.h"
#include "checkpoint.h"
#include "cli_args.h"
#include "distill.h"
#include "runlog.h"
#include "../kernels/error.h"
#include <errno.h>
#include <omp.h>
#include <sys/stat.h>

#define CURRICULUM_CONFIG "curriculum.cfg"

static void curriculum_usage(FILE *f) {
    fprintf(f, "usage: cgspn curriculum CONFIG [--init PATH] [--key=value ...]\n"
               "Resolution curriculum with upsampling self-distillation (docs/design.md#curriculum): resolutions =\n"
               "r0,r1,...,rK. Stage 0 is the student given by init (a Stage 2 output; a checkpoint,\n"
               "run folder or safetensors of CONFIG's model) at r0. Stage k = 1..K trains at r_k as\n"
               "cgspn distill stage 2 does, with stage k-1's final student frozen as the teacher:\n"
               "it sees the same augmented image resized (antialiased) to r_{k-1}, its PP/PB taps\n"
               "are upsampled bilinearly (half-pixel centres) to the student's grid, and supervise\n"
               "it through MSE + KL with fresh adaptors (taps, alpha, beta, lambda1, lambda2,\n"
               "adaptors as in cgspn distill). The student starts as its teacher.\n"
               "  stage_steps or stage_samples  the length of each trained stage (one value for all,\n"
               "                                or K values)\n"
               "  stage_lr                      peak lr of each stage (one value or K; empty = lr)\n"
               "Folders: out_dir/run_name/stageK_RRRpx/ per stage (checkpoints, logs). Run the same\n"
               "command again after a crash: finished stages are skipped, the interrupted one\n"
               "resumes from its newest checkpoint (ckpt_every, ckpt_minutes, or the one SIGINT /\n"
               "SIGTERM writes before exiting 0) bit-exactly.\n"
               "Example: cgspn curriculum configs/fmnist_curriculum.cfg --init checkpoints/fm28\n\n");
    config_print_help(f);
}

// ---- the plan ------------------------------------------------------------------------------------

// A list key with one value for all K stages, or K values: out[1..K].
static int expand_longs(const char *key, const char *s, int K, long *out, char *err, size_t n) {
    int v[RESOLUTION_MAX + 1];
    int m = config_parse_int_list(key, s, v, RESOLUTION_MAX, err, n);
    if (m < 0) return -1;
    if (m != 1 && m != K)
        return cg_set_error(err, n, "%s = '%s' has %d values; the curriculum trains %d stages "
                            "(one per resolution after the first): give 1 or %d", key, s, m, K, K);
    for (int k = 1; k <= K; k++) {
        out[k] = v[m == 1 ? 0 : k - 1];
        if (out[k] < 1)
            return cg_set_error(err, n, "%s = '%s': stage %d gets %ld; expected >= 1", key, s, k, out[k]);
    }
    return 0;
}

int curriculum_plan_err(const Config *c, CurriculumPlan *p, char *err, size_t n) {
    memset(p, 0, sizeof *p);
    p->n_res = config_parse_int_list("resolutions", c->resolutions, p->res, RESOLUTION_MAX, err, n);
    if (p->n_res < 0) return -1;
    if (p->n_res < 2)
        return cg_set_error(err, n, "resolutions = '%s': give the student's resolution and at least one "
                            "higher one (e.g. resolutions = 378,518,756,1036)", c->resolutions);
    for (int k = 0; k < p->n_res; k++) {
        if (p->res[k] <= 0 || p->res[k] % c->patch != 0)
            return cg_set_error(err, n, "resolutions = '%s': %d is not a positive multiple of patch %d",
                                c->resolutions, p->res[k], c->patch);
        if (k > 0 && p->res[k] <= p->res[k - 1])
            return cg_set_error(err, n, "resolutions = '%s' must increase (a stage's teacher is the "
                                "previous, lower-resolution stage)", c->resolutions);
    }
    int K = p->n_res - 1;
    if (!c->stage_steps[0] == !c->stage_samples[0])
        return cg_set_error(err, n, "set one of stage_steps (optimizer steps per stage) and "
                            "stage_samples (images per stage)%s", c->stage_steps[0] ? ", not both" : "");
    if (c->stage_steps[0]) {
        if (expand_longs("stage_steps", c->stage_steps, K, p->steps, err, n) != 0) return -1;
    } else {
        long samples[RESOLUTION_MAX];
        if (expand_longs("stage_samples", c->stage_samples, K, samples, err, n) != 0) return -1;
        for (int k = 1; k <= K; k++) {
            p->steps[k] = samples[k] / c->batch_size;
            if (p->steps[k] < 1)
                return cg_set_error(err, n, "stage_samples: stage %d has %ld images, fewer than one "
                                    "batch of %d", k, samples[k], c->batch_size);
        }
    }
    float lr[RESOLUTION_MAX];
    int m = config_parse_float_list("stage_lr", c->stage_lr, lr, RESOLUTION_MAX, err, n);
    if (m < 0) return -1;
    if (m > 1 && m != K)
        return cg_set_error(err, n, "stage_lr = '%s' has %d values; give 1 or %d (one per trained "
                            "stage)", c->stage_lr, m, K);
    for (int k = 1; k <= K; k++) {
        p->lr[k] = m == 0 ? c->lr : lr[m == 1 ? 0 : k - 1];
        if (!(p->lr[k] > 0)) return cg_set_error(err, n, "stage_lr: stage %d gets lr %g", k, (double)p->lr[k]);
    }
    return 0;
}

void curriculum_run_dir(const Config *c, char *out, size_t n) {
    snprintf(out, n, "%s/%s", c->out_dir, c->run_name);
}

void curriculum_stage_dir(const Config *c, const CurriculumPlan *p, int k, char *out, size_t n) {
    snprintf(out, n, "%s/%s/stage%d_%dpx", c->out_dir, c->run_name, k, p->res[k]);
}

// dst (a CONFIG_STR_MAX field) = src, or exit naming the key.
static void set_str(char *dst, const char *key, const char *src) {
    CG_CHECK(strlen(src) < CONFIG_STR_MAX, "use shorter out_dir / run_name paths",
             "curriculum: %s would be %zu characters (at most %d)", key, strlen(src), CONFIG_STR_MAX - 1);
    memmove(dst, src, strlen(src) + 1);
}

void curriculum_stage_config(const Config *c, const CurriculumPlan *p, int k, Config *o) {
    CG_CHECK(k >= 1 && k < p->n_res, "", "curriculum: no trained stage %d", k);
    *o = *c;
    char run[1100], path[1200];
    curriculum_run_dir(c, run, sizeof run);
    o->stage = 2;
    o->img_size = p->res[k];
    o->teacher_img_size = p->res[k - 1];
    if (k == 1) {
        set_str(o->teacher, "teacher", c->init);
    } else {
        curriculum_stage_dir(c, p, k - 1, path, sizeof path);
        set_str(o->teacher, "teacher", path);
    }
    snprintf(path, sizeof path, "%s/%s", run, CURRICULUM_CONFIG);
    set_str(o->teacher_config, "teacher_config", path);
    o->init[0] = '\0';
    o->copy_teacher = 1;   // the student starts as its teacher; its adaptors fresh
    o->max_steps = (int)p->steps[k];
    o->lr = p->lr[k];
    set_str(o->out_dir, "out_dir", run);
    snprintf(path, sizeof path, "stage%d_%dpx", k, p->res[k]);
    set_str(o->run_name, "run_name", path);
    set_str(o->resume, "resume", "auto");
    o->resolutions[0] = o->stage_steps[0] = o->stage_samples[0] = o->stage_lr[0] = '\0';
    o->multires[0] = '\0';
}

// ---- the run -------------------------------------------------------------------------------------

// The step of the newest complete checkpoint of dir (0: none).
static long newest_step(const char *dir) {
    long steps[1];
    int count = ckpt_list(dir, steps, 0);
    if (count == 0) return 0;
    long *all = cg_malloc((size_t)count * sizeof(long));
    ckpt_list(dir, all, count);
    long s = all[count - 1];
    free(all);
    return s;
}

static void make_dir(const char *path) {
    CG_CHECK_ERRNO(mkdir(path, 0755) == 0 || errno == EEXIST, path);
}

static void print_plan(const Config *c, const CurriculumPlan *p, FILE *f) {
    fprintf(f, "curriculum: %d px (stage 0: %s)", p->res[0], c->init);
    for (int k = 1; k < p->n_res; k++) fprintf(f, " -> %d px", p->res[k]);
    fprintf(f, "\n");
    for (int k = 1; k < p->n_res; k++) {
        int g0 = p->res[k - 1] / c->patch, g1 = p->res[k] / c->patch;
        fprintf(f, "  stage %d: %d px (%dx%d tokens), teacher stage %d at %d px (%dx%d tokens, taps "
                "upsampled %dx%d -> %dx%d); %ld steps x %d images, lr %g\n", k, p->res[k], g1, g1,
                k - 1, p->res[k - 1], g0, g0, g0, g0, g1, g1, p->steps[k], c->batch_size,
                (double)p->lr[k]);
    }
}

CurriculumResult curriculum_run(const Config *c, const CurriculumOptions *o) {
    CurriculumOptions none = {0};
    if (!o) o = &none;
    CurriculumResult res = {0};
    CurriculumPlan p;
    char err[4096];
    if (curriculum_plan_err(c, &p, err, sizeof err) != 0) CG_FAIL("see cgspn curriculum --help", "%s", err);
    CG_CHECK(c->init[0], "pass --init PATH (a Stage 2 checkpoint or run folder, or safetensors)",
             "the curriculum starts from a student at %d px: set init", p.res[0]);
    struct stat sb;
    CG_CHECK(stat(c->init, &sb) == 0, "init is the Stage 0 student: a checkpoint or run folder, or "
             "a safetensors file", "init = %s: %s", c->init, strerror(errno));
    CG_CHECK(c->run_name[0], "set run_name (e.g. --run_name=fm_curriculum)",
             "the curriculum needs run_name: running the same command again resumes its folder");
    CG_CHECK(!c->resume[0] || strcmp(c->resume, "auto") == 0, "leave resume unset: every stage resumes "
             "by itself", "resume = %s: cgspn curriculum always continues its run folder (finished "
             "stages are skipped, an interrupted one resumes)", c->resume);
    CG_CHECK(!c->multires[0], "use multires with cgspn distill (one multi-resolution Stage 2 run)",
             "multires = %s: the curriculum trains one resolution per stage", c->multires);
    CG_CHECK(!c->extra_teachers[0], "distill from several teachers with cgspn distill, then start the "
             "curriculum from that student (init)", "extra_teachers = %s: each curriculum stage "
             "distills from the previous stage's student alone", c->extra_teachers);
    CG_CHECK(c->teacher_img_size == 0, "leave teacher_img_size at 0",
             "teacher_img_size = %d: the curriculum sets each stage's teacher resolution (the "
             "previous stage's)", c->teacher_img_size);

    char run[1100], path[1200];
    curriculum_run_dir(c, run, sizeof run);
    // Under mpirun every rank runs this: rank 0 writes the shared folder and config (the others
    // would race it on the same temporary file), the rest wait for it before reading them.
    Dist *dist = dist_process();
    char derr[1024];
    if (dist_setup_err(dist, &(DistOptions){c->dist_timeout_s, c->dist_rendezvous}, derr,
                       sizeof derr) != 0)
        CG_FAIL("", "%s", derr);
    snprintf(path, sizeof path, "%s/%s", run, CURRICULUM_CONFIG);
    if (dist->rank == 0) {
        make_dir(c->out_dir);
        make_dir(run);
        CG_CHECK_ERRNO(config_save(c, path) == 0, path);
    }
    dist_barrier(dist, "the curriculum folder and config written by rank 0");
    print_plan(c, &p, stdout);

    for (int k = 1; k < p.n_res; k++) {
        char dir[1200];
        curriculum_stage_dir(c, &p, k, dir, sizeof dir);
        snprintf(res.final_dir, sizeof res.final_dir, "%s", dir);
        long done = newest_step(dir);
        if (done >= p.steps[k]) {
            printf("== stage %d of %d (%d px): finished (%s/step_%08ld); not run again\n", k,
                   p.n_res - 1, p.res[k], dir, done);
            res.stages_done = k;
            continue;
        }
        printf("== stage %d of %d: %d px, teacher %d px (%s)\n", k, p.n_res - 1, p.res[k],
               p.res[k - 1], k == 1 ? c->init : "the previous stage's final student");
        Config sc;
        curriculum_stage_config(c, &p, k, &sc);
        DistillOptions dopt = {.stop_after = o->stop_stage == k ? o->stop_after : 0,
                               .step_losses = o->step_losses[k]};
        TrainResult r = distill_train(&sc, &dopt);
        res.eval[k] = r.eval;
        if (r.status != TRAIN_DONE) {
            res.stopped = true;
            res.status = r.status;
            if (r.status == TRAIN_NONFINITE)
                printf("curriculum: stage %d stopped at a non-finite step %ld; fix the run (see "
                       "above), then run the same command to resume from the stage's newest "
                       "checkpoint\n", k, r.nonfinite_step);
            else
                printf("curriculum: stopped in stage %d at step %ld of %ld; run the same command "
                       "to resume it\n", k, r.step, r.total);
            return res;
        }
        res.stages_done = k;
    }
    printf("curriculum: done, %d stages; final student %s", p.n_res - 1, res.final_dir);
    for (int k = 1; k < p.n_res; k++)
        if (res.eval[k].count > 0) printf("%s stage %d (%d px) test top1 %.2f%%", k == 1 ? ";" : ",",
                                          k, p.res[k], 100 * res.eval[k].top1);
    printf("\n");
    return res;
}

int cmd_curriculum(int argc, char **argv) {
    if (cli_wants_help(argc, argv, 2)) {
        curriculum_usage(stdout);
        return 0;
    }
    const char *init = cli_take_flag(&argc, argv, 2, "--init");
    Config c;
    config_defaults(&c);
    int rest = config_parse_args(&c, argc, argv, 2);
    CG_CHECK(rest == 0, "see cgspn curriculum --help", "unexpected argument '%s'", argv[2]);
    if (init) set_str(c.init, "init", init);
    if (c.threads > 0) omp_set_num_threads(c.threads);
    CurriculumResult r = curriculum_run(&c, NULL);
    return r.status == TRAIN_NONFINITE ? 1 : 0;
}
