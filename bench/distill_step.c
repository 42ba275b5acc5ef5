// One timed Stage 2 distillation measurement (bench/distill_step.h).
#include "distill_step.h"
#include "../train/data_parallel.h"
#include "../train/device_config.h"
#include "../train/distill.h"
#include "../train/memory_report.h"
#include "../train/runlog.h"
#include "../kernels/device.h"
#include "../kernels/error.h"
#include "../kernels/rng.h"
#include <math.h>
#include <stdlib.h>

// Fills an input batch (B, in_chans, img, img) with uniform [-1, 1) noise, once.
static Tensor *random_images(Arena *a, Ctx *ctx, const Config *c, int B, uint64_t seed) {
    Tensor *x = arena_tensor(a, 4, (int[]){B, c->in_chans, c->img_size, c->img_size}, true);
    float *h = cg_malloc(x->numel * sizeof(float));
    Rng r;
    rng_seed(&r, seed);
    for (size_t i = 0; i < x->numel; i++) h[i] = 2.0f * rng_uniform(&r) - 1.0f;
    tensor_upload(ctx, x, h);
    free(h);
    return x;
}

BenchResult bench_steps(const Config *c, Dist *d, int warmup, int steps, bool overlap,
                               int say, bool profile) {
    BenchResult r = {0};
    Ctx ctx = device_open(c);
    device_memory_reset_peak(&ctx);   // the peak covers everything this measurement allocates
    if (say & SAY_DEVICE) device_describe(&ctx, stdout);
    Distiller dd;
    distiller_init(&dd, c, &ctx);
    distiller_init_student(&dd, c, NULL);
    DataParallel dp;
    dp_open(&dp, d, &dd.params, &ctx, c);
    dp.overlap = overlap;
    Arena inputs, arena;
    arena_init(&inputs, &ctx, 16u << 20);
    arena_init(&arena, &ctx, ARENA_CHUNK_BYTES);
    Tape tape;
    tape_init(&tape, &ctx, &arena);
    // Different images on every rank, as a real run's slices are.
    Tensor *x = random_images(&inputs, &ctx, c, c->batch_size, (uint64_t)c->seed + 7919u * (uint64_t)d->rank);
    OptimizerConfig opt = {
        .schedule = {c->lr, c->min_lr, c->warmup_steps, warmup + steps},
        .beta1 = c->beta1, .beta2 = c->beta2, .eps = c->adam_eps,
        .weight_decay = c->weight_decay, .grad_clip = c->grad_clip > 0 ? c->grad_clip : 1.0f,
    };
    double t0 = 0, mine = 0;
    OpProfile *prof = NULL;
    const int total = warmup + steps + (profile ? 1 : 0);
    for (int s = 0; s < total; s++) {
        if (s == warmup) {   // every rank starts the timed steps together
            dist_barrier(d, "the start of the timed steps");
            t0 = now_seconds();
        }
        if (s == warmup + steps) {   // the profiled step, after the timing
            mine = now_seconds() - t0;
            prof = op_profile_start(&ctx);
        }
        tape_reset(&tape);
        Tensor *raw;
        dd.student.drop_path.step = s;
        op_profile_mark(prof, "forward (teacher, student, losses)");
        Tensor *loss = distill_loss(&dd, &tape, x, NULL, &raw);
        tape_keep(&tape, loss);   // read after the step
        op_profile_mark(prof, "backward");
        dp_backward(&dp, &tape, loss, true);
        op_profile_mark(prof, "optimizer (after the last bucket)");
        dp_optimizer_step(&dp, &dd.params, &ctx, &arena, &opt, s);   // reads the norm: a sync
        if (s == warmup + steps - 1) tensor_download(&ctx, loss, &r.loss);
    }
    if (!profile) mine = now_seconds() - t0;
    if (prof) {
        op_profile_stop(prof);
        BenchProfile *bp = &r.prof;
        bp->done = true;
        bp->step_ms = op_profile_total_ms(prof);
        bp->n_phases = op_profile_phases(prof, bp->phases, OP_PROFILE_MAX_PHASES);
        bp->n_ops = op_profile_totals(prof, bp->ops, BENCH_PROFILE_OPS);
        bp->has_comm = dist_grads_comm_profile(dp.g, &bp->comm);
        op_profile_free(prof);
    }
    // The slowest rank's time is the job's.
    double *all = cg_malloc((size_t)d->world * sizeof(double));
    dist_all_gather_bytes(d, &mine, all, sizeof mine, "the benchmark's timings");
    r.seconds = 0;
    for (int i = 0; i < d->world; i++) r.seconds = fmax(r.seconds, all[i]);
    free(all);
    r.world = d->world;
    r.global_batch = c->batch_size * d->world;
    r.img_per_s = (double)r.global_batch * steps / r.seconds;
    r.gpu_peak = device_memory_use(&ctx).peak;
    if (say & SAY_PLAN) {   // the split of what this rank holds, as cgspn distill prints it
        const ParamTable *tables[2] = {&dd.params, &dd.teachers[0].teacher.params};
        MemoryPlan plan = memory_plan(&ctx, tables, 2, &arena);
        printf("grad_checkpoint %d, batch %d: ", c->grad_checkpoint, c->batch_size);
        memory_plan_print(stdout, &plan);
    }
    r.grad_checkpoint = c->grad_checkpoint;
    tape_free(&tape);
    arena_free(&arena);
    arena_free(&inputs);
    dp_close(&dp);
    distiller_free(&dd);
    device_close(&ctx);
    return r;
}

DistillProbe bench_distill_alone(const Config *c, int warmup, int steps) {
    Dist alone;
    dist_init_single(&alone);
    alone.timeout_s = BENCH_DIST_TIMEOUT_S;
    BenchResult r = bench_steps(c, &alone, warmup, steps, true, 0, false);
    return (DistillProbe){r.img_per_s, r.gpu_peak / 1073741824.0, r.loss};
}

