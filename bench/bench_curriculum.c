// `cgspn bench curriculum`: one resolution-curriculum Stage-k training step (docs/design.md#curriculum), as
// cgspn curriculum runs it: the frozen teacher (the previous stage's C-GSPN student) on the image
// resized (antialiased, on the host) to its resolution, its tap features upsampled bilinearly to
// the student's grid, the student's forward, the dual-tap MSE + KL loss through adaptors,
// backward and AdamW. Weights are fresh (a step's speed does not depend on their values) and the
// images random, already in host memory (the loader's cost is `cgspn bench data`'s).
//
// On a GPU: the so14 student (configs/cgspn_so14.cfg: hybrid, width 1152, 27 blocks, attention
// every 9th) at 1036 px (74x74 tokens) with its 756 px teacher (54x54 tokens), taps every 9
// blocks (the paper's), batches 1 and 4. On a CPU: the tiny model (configs/cgspn_tiny.cfg) at
// 56 px with a 42 px teacher, so the benchmark runs everywhere.
#include "bench_model.h"
#include "../train/device_config.h"
#include "../train/distill.h"
#include "../train/optimizer.h"
#include "../train/resolution.h"
#include "../train/runlog.h"
#include "../kernels/error.h"
#include "../kernels/rng.h"
#include <math.h>

#define CURRICULUM_BENCH_WARMUP 2
#define CURRICULUM_BENCH_STEPS 5

typedef struct CurriculumCase {
    const char *label, *config;
    int student_px, teacher_px;
    const char *taps;
    int batches[2];               // one row per batch size (0: none)
} CurriculumCase;

static const CurriculumCase GPU_CASE = {"so14 (hybrid C-GSPN)", "configs/cgspn_so14.cfg", 1036, 756,
                                        "every 9", {1, 4}};
static const CurriculumCase CPU_CASE = {"tiny C-GSPN", "configs/cgspn_tiny.cfg", 56, 42, "all", {8, 0}};

static double median(double *v, int n) {
    for (int i = 1; i < n; i++)   // insertion sort: a handful of values
        for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
            double t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// One step: views (host resize + upload), teacher, student, loss, backward, AdamW. Returns the
// loss; the raw download and the optimizer's norm read-back synchronize the device.
static float bench_step(Distiller *d, ResolutionViews *v, const Batch *b, Tape *tape, Arena *arena,
                        const OptimizerConfig *opt, long step, float *raw, double *resize_ms) {
    tape_reset(tape);
    double t0 = now_seconds();
    Tensor *x, *xt[DISTILL_MAX_TEACHERS];
    distill_views(d, v, tape, b, v->img_size, &x, xt);
    *resize_ms = (now_seconds() - t0) * 1e3;
    Tensor *raw_dev;
    Tensor *loss = distill_loss_views(d, tape, x, xt, NULL, &raw_dev);
    tensor_download(d->ctx, raw_dev, raw);
    tape_backward(tape, loss);
    StepStats ss = optimizer_step(&d->params, d->ctx, arena, opt, step);
    CG_CHECK(ss.finite && isfinite(raw[d->n_raw - 1]), "", "bench curriculum: a non-finite loss or "
             "gradient at step %ld", step + 1);
    return raw[d->n_raw - 1];
}

// ctx: the device (device = auto, precision = auto: bf16 on a GPU, fp32 on the CPU).
static void bench_case(FILE *out, const CurriculumCase *cc, Ctx *ctx) {
    Config c;
    config_defaults(&c);
    config_load_file(&c, cc->config);
    c.img_size = cc->student_px;
    c.teacher_img_size = cc->teacher_px;
    c.stage = 2;
    snprintf(c.taps, sizeof c.taps, "%s", cc->taps);
    c.tap_pp = c.tap_pb = 1;
    c.adaptors = 1;
    c.gamma = 0;
    const DeviceInfo dev = device_info(ctx);
    Distiller d;
    memset(&d, 0, sizeof d);
    teacher_init_fresh(&d.teachers[0].teacher, &c, cc->teacher_px, ctx, 7);
    char err[4096];
    if (distiller_init_with_teacher_err(&d, &c, ctx, err, sizeof err) != 0) CG_FAIL("", "%s", err);
    ResolutionViews v;
    if (resolution_views_init_err(&v, &c, err, sizeof err) != 0) CG_FAIL("", "%s", err);
    OptimizerConfig opt = {.schedule = {1e-4f, 1e-4f, 0, 1000000}, .beta1 = 0.9f, .beta2 = 0.999f,
                           .eps = 1e-8f, .weight_decay = 0.05f, .grad_clip = 1.0f};
    Arena arena;
    arena_init(&arena, ctx, ARENA_CHUNK_BYTES);
    Tape tape;
    tape_init(&tape, ctx, &arena);
    float *raw = cg_malloc((size_t)d.n_raw * sizeof(float));
    int P = c.patch, gs = cc->student_px / P, gt = cc->teacher_px / P;
    fprintf(out, "%s on %s: student %d px (%dx%d tokens), teacher %d px (%dx%d tokens, taps upsampled "
            "to %dx%d), taps %s (PP + PB, adaptors); %d timed steps after %d warmup, median\n",
            cc->label, dev.name, cc->student_px, gs, gs, cc->teacher_px, gt, gt, gs, gs, cc->taps,
            CURRICULUM_BENCH_STEPS, CURRICULUM_BENCH_WARMUP);
    fprintf(out, "  %5s %10s %10s %14s %12s %10s %10s\n", "batch", "step ms", "img/s",
            "host resize ms", "act GiB", "GPU GiB", "loss");
    for (int bi = 0; bi < 2 && cc->batches[bi] > 0; bi++) {
        int B = cc->batches[bi], C = c.in_chans, S = cc->student_px;
        Batch b = {0};
        b.count = B, b.channels = C, b.height = b.width = S;
        b.images = cg_malloc((size_t)B * C * S * S * sizeof(float));
        Rng r;
        rng_seed(&r, 99);
        for (size_t i = 0; i < (size_t)B * C * S * S; i++) b.images[i] = 2 * rng_uniform(&r) - 1;
        arena.peak = 0;
        device_memory_reset_peak(ctx);
        double ms[CURRICULUM_BENCH_STEPS], rs[CURRICULUM_BENCH_STEPS], resize_ms = 0;
        float loss = 0;
        long step = 0;
        for (int i = 0; i < CURRICULUM_BENCH_WARMUP; i++)
            bench_step(&d, &v, &b, &tape, &arena, &opt, step++, raw, &resize_ms);
        for (int i = 0; i < CURRICULUM_BENCH_STEPS; i++) {
            double t0 = now_seconds();
            loss = bench_step(&d, &v, &b, &tape, &arena, &opt, step++, raw, &rs[i]);
            ms[i] = (now_seconds() - t0) * 1e3;
        }
        double step_ms = median(ms, CURRICULUM_BENCH_STEPS);
        fprintf(out, "  %5d %10.1f %10.2f %14.1f %12.2f %10.2f %10.4f\n", B, step_ms,
                B / (step_ms * 1e-3), median(rs, CURRICULUM_BENCH_STEPS), arena.peak / 1073741824.0,
                device_memory_use(ctx).peak / 1073741824.0, (double)loss);
        free(b.images);
    }
    fprintf(out, "  (step ms: wall time of the whole step, host resize of the teacher's image included; "
                 "act GiB: the arena's peak; GPU GiB: device_memory_use's peak over the batch's steps, "
                 "everything the process holds)\n");
    free(raw);
    tape_free(&tape);
    arena_free(&arena);
    resolution_views_free(&v);
    distiller_free(&d);
}

int bench_curriculum_run(FILE *out) {
    Config probe;
    config_defaults(&probe);
    Ctx ctx = device_open(&probe);   // auto: the GPU when there is one
    bench_case(out, ctx.device == DEVICE_CUDA ? &GPU_CASE : &CPU_CASE, &ctx);
    device_close(&ctx);
    return 0;
}
