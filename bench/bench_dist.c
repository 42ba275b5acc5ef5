// `cgspn bench distill` (bench/bench_dist.h): Stage 2 distillation throughput on 1 GPU and on
// every rank of the launch, and the scaling between them.
//
// What a timed step is: exactly the step of `cgspn distill` (train/distill.c) without the data
// loader: the frozen teacher's forward to the tapped blocks, the student's forward, the dual-tap
// loss with adaptors, the tape's backward with each gradient bucket's all-reduce (reduce-scatter
// with zero = 1) launched as backward finishes it (overlap = 1) or all after backward
// (overlap = 0), and optimizer_step_dist (global-norm clipping, AdamW, the all-gather of updated
// values with zero = 1). The images are random, generated once per rank (the loader is measured
// apart: cgspn bench data). Each step ends with the optimizer's host read of the gradient norm,
// so wall-clock time over the timed steps is the device time.
//
// Two measurements per run:
//   1 GPU     every rank at once, each in a process group of its own (the same per-GPU batch),
//             so no rank waits for another; the table shows rank 0's, and the spread.
//   N GPUs    all ranks together, global batch = per-GPU batch x N.
// scaling = img/s on N GPUs / img/s on 1 GPU (ideal: N).
//
// GPU GiB (peak): device_memory_use's peak from the context's opening through the timed steps
// (parameters, gradients, AdamW state, the frozen teacher, arena, workspaces, the stream-ordered
// pool; this process's own), torch.cuda.max_memory_reserved's counterpart.
// --memory=1: the 1-GPU step with grad_checkpoint 0 and 1, beside PyTorch's ViT -> ViT step
// (bench/bench_timm.py, distill/<px>/<eager|compiled>[_ckpt]). --max-batch: the largest batch
// that fits, in bench/bench_max_batch.c.
#include "bench_dist.h"
#include "distill_step.h"
#include "bench_max_batch.h"
#include "timm_json.h"
#include "../train/cli_args.h"
#include "../train/config.h"
#include "../train/data_parallel.h"
#include "../train/device_config.h"
#include "../train/distill.h"
#include "../train/memory_report.h"
#include "op_profile.h"
#include "../train/runlog.h"
#include "../kernels/device.h"
#include "../kernels/error.h"
#include "../kernels/rng.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define BENCH_STUDENT_CFG "configs/cgspn_so14.cfg"   // the paper's student at 378 px
#define BENCH_TEACHER_CFG "configs/vit_so14.cfg"     // and its SO400M-shaped teacher
#define BENCH_BATCH_PER_GPU 32                       // what fits an H100/H200 with the teacher
#define BENCH_WARMUP 3
#define BENCH_STEPS 10
static double op_ms(const BenchProfile *p, const char *name, int *calls) {
    for (int i = 0; i < p->n_ops; i++)
        if (strcmp(p->ops[i].name, name) == 0) {
            if (calls) *calls = p->ops[i].calls;
            return p->ops[i].ms;
        }
    if (calls) *calls = 0;
    return 0;
}

typedef struct OpDiff { const char *name; int calls; double one, all; } OpDiff;

static int cmp_diff(const void *a, const void *b) {
    const OpDiff *x = a, *y = b;
    double dx = fabs(x->all - x->one), dy = fabs(y->all - y->one);
    return dx > dy ? -1 : dx < dy;
}

// Where the N-GPU step spends the time the 1-GPU step does not: phases, collectives, ops.
static void print_profiles(const BenchProfile *one, const BenchProfile *all, int world) {
    printf("\nprofile of one step on rank 0 (an event pair around every op, so a little slower "
           "than the timed steps), ms:\n"
           "| phase | 1 GPU | %d GPUs | change | in ops, 1 GPU | in ops, %d GPUs |\n"
           "|---|---:|---:|---:|---:|---:|\n", world, world);
    for (int k = 0; k < one->n_phases && k < all->n_phases; k++)
        printf("| %s | %.2f | %.2f | %+.2f | %.2f | %.2f |\n", one->phases[k].name,
               one->phases[k].ms, all->phases[k].ms, all->phases[k].ms - one->phases[k].ms,
               one->phases[k].op_ms, all->phases[k].op_ms);
    printf("| step | %.2f | %.2f | %+.2f | | |\n", one->step_ms, all->step_ms,
           all->step_ms - one->step_ms);
    if (all->has_comm)
        printf("gradient collectives (%d GPUs, communication stream): %d buckets, %.2f ms busy, "
               "%.2f ms from backward's end to the last one's end, longest queue %.2f ms\n", world,
               all->comm.buckets, all->comm.busy_ms, all->comm.tail_ms, all->comm.queued_ms);
    OpDiff diff[BENCH_PROFILE_OPS];
    int n = 0;
    for (int i = 0; i < all->n_ops; i++) {
        int calls;
        diff[n++] = (OpDiff){all->ops[i].name, all->ops[i].calls, op_ms(one, all->ops[i].name, &calls),
                             all->ops[i].ms};
    }
    qsort(diff, (size_t)n, sizeof *diff, cmp_diff);
    printf("ops that changed most (%d GPUs - 1 GPU):\n  %-22s %6s %9s %9s %8s\n", world, "op",
           "calls", "1 GPU", "N GPUs", "change");
    for (int i = 0; i < n && i < 12; i++)
        printf("  %-22s %6d %9.3f %9.3f %+8.3f\n", diff[i].name, diff[i].calls, diff[i].one,
               diff[i].all, diff[i].all - diff[i].one);
}

static void bench_distill_usage(FILE *f) {
    fprintf(f, "usage: [mpirun -np N] cgspn bench distill [STUDENT_CFG] [--steps=N] [--warmup=N]\n"
               "                                 [--overlap=0|1] [--profile=1] [--key=value ...]\n"
               "       [mpirun -np N] cgspn bench distill [STUDENT_CFG] --memory=1 [...]\n"
               "       cgspn bench distill [STUDENT_CFG] --max-batch [--sizes=378,1036]\n"
               "                                 [--max-batch-cap=N] [--steps=N] [--warmup=N]\n"
               "Stage 2 distillation img/s on 1 GPU and on the N ranks of the launch, and the\n"
               "scaling, with each rank's peak GPU memory (device_memory_use: parameters,\n"
               "gradients, AdamW state, teacher, activations, workspaces). Defaults: student %s,\n"
               "teacher_config %s (teacher = random weights), %d images per GPU, taps every 9,\n"
               "adaptors, %d warm-up and %d timed steps, grad_checkpoint as configured (0: off).\n"
               "--zero=1 shards the optimizer (ZeRO-1); --overlap=0 launches every gradient bucket\n"
               "after backward instead of during it. --profile=1 adds one step timed op by op on\n"
               "rank 0, 1 GPU against N GPUs (phases, collectives, the ops that changed most).\n"
               "--memory=1: the 1-GPU step with grad_checkpoint 0 and 1 (every block recomputed in\n"
               "backward), img/s and peak GPU memory beside PyTorch's ViT -> ViT step (eager,\n"
               "compiled, each with and without gradient checkpointing; build/bench_timm.json).\n"
               "--max-batch: one process, one GPU: for each side of --sizes (default 378,1036)\n"
               "and grad_checkpoint 0 and 1, the largest per-GPU batch that runs (doubling from 8\n"
               "up to --max-batch-cap, default %d, then bisection), each candidate in a child\n"
               "process of its own (%d warm-up + %d timed steps unless --warmup/--steps say\n"
               "otherwise), img/s and peak GPU memory at it, beside PyTorch's largest batch.\n"
               "Example: mpirun -np 2 ./cgspn bench distill --zero=1\n",
            BENCH_STUDENT_CFG, BENCH_TEACHER_CFG, BENCH_BATCH_PER_GPU, BENCH_WARMUP, BENCH_STEPS,
            MAX_BATCH_CAP, MAX_BATCH_WARMUP, MAX_BATCH_STEPS);
}

static int parse_count(const char *flag, const char *v, int fallback, int min) {
    if (!v) return fallback;
    char *end;
    long k = strtol(v, &end, 10);
    CG_CHECK(*v && !*end && k >= min && k <= 100000, "e.g. --steps=10", "%s=%s: expected a whole "
             "number >= %d", flag, v, min);
    return (int)k;
}

static void print_table_head(void) {
    printf("| GPUs | grad_checkpoint | global batch | ms/step | img/s | scaling | loss | "
           "GPU GiB (peak, rank 0) |\n|---:|---:|---:|---:|---:|---:|---:|---:|\n");
}

static void print_table_row(const BenchResult *r, int steps, double one_ips) {
    printf("| %d | %d | %d | %.1f | %.1f | %.2fx | %.4f | %.2f |\n", r->world, r->grad_checkpoint,
           r->global_batch, 1e3 * r->seconds / steps, r->img_per_s, r->img_per_s / one_ips, r->loss,
           r->gpu_peak / 1073741824.0);
}

// --memory=1 on rank 0: each grad_checkpoint row beside PyTorch's step at the same side,
// distill/<px>/<eager|compiled>[_ckpt] (bench/bench_timm.py).
static void print_memory_vs_torch(const BenchResult *rows, int n, int img_size) {
    char *json = timm_json_load(stdout);
    if (!json) return;
    printf("| grad_checkpoint | batch | img/s | GPU GiB (peak) | PyTorch | batch | img/s | "
           "GiB (peak reserved) | img/s ratio | mem ratio |\n"
           "|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|\n");
    for (int i = 0; i < n; i++) {
        const BenchResult *r = &rows[i];
        const double gib = r->gpu_peak / 1073741824.0;
        const char *modes[2] = {"eager", "compiled"};
        for (int m = 0; m < 2; m++) {
            char mode[32];
            snprintf(mode, sizeof mode, "%s%s", modes[m], r->grad_checkpoint ? "_ckpt" : "");
            double ips = timm_json_numberf(json, "distill/%d/%s/img_per_s", img_size, mode);
            double tgib = timm_json_numberf(json, "distill/%d/%s/peak_reserved_gib", img_size, mode);
            int tb = (int)timm_json_numberf(json, "distill/%d/%s/batch", img_size, mode);
            printf("| %d | %d | %.1f | %.2f | %s | %d | %.1f | %.2f | %.2fx | %.2fx |%s\n",
                   r->grad_checkpoint, r->global_batch, r->img_per_s, gib, mode, tb, ips, tgib,
                   ips > 0 ? r->img_per_s / ips : 0, tgib > 0 ? gib / tgib : 0,
                   tb == r->global_batch || tb == 0 ? "" : " (batch differs)");
        }
    }
    printf("(PyTorch: timm so14-shaped ViT student and teacher, the same taps, adaptors and loss; "
           "grad_checkpoint 1 against set_grad_checkpointing(True); img/s ratio = cgspn / PyTorch, "
           "mem ratio = cgspn GiB / PyTorch GiB; 0 = not measured)\n");
    free(json);
}

int bench_distill_cmd(int argc, char **argv, int first) {
    if (cli_wants_help(argc, argv, first)) {
        bench_distill_usage(stdout);
        return 0;
    }
    const bool max_batch = cli_take_switch(&argc, argv, first, "--max-batch");
    const bool memory = cli_take_switch(&argc, argv, first, "--memory");
    const char *sizes = cli_take_flag(&argc, argv, first, "--sizes");
    const int cap = parse_count("--max-batch-cap", cli_take_flag(&argc, argv, first, "--max-batch-cap"),
                                MAX_BATCH_CAP, 1);
    CG_CHECK(!sizes || max_batch, "--sizes=378,1036 --max-batch", "--sizes is a --max-batch option");
    const int steps = parse_count("--steps", cli_take_flag(&argc, argv, first, "--steps"),
                                  max_batch ? MAX_BATCH_STEPS : BENCH_STEPS, 1);
    const int warmup = parse_count("--warmup", cli_take_flag(&argc, argv, first, "--warmup"),
                                   max_batch ? MAX_BATCH_WARMUP : BENCH_WARMUP, 0);
    const bool overlap = parse_count("--overlap", cli_take_flag(&argc, argv, first, "--overlap"), 1, 0) != 0;
    const bool profile = parse_count("--profile", cli_take_flag(&argc, argv, first, "--profile"), 0, 0) != 0;
    CG_CHECK(!(max_batch && (memory || profile)), "run them one at a time",
             "--max-batch goes with neither --memory nor --profile");
    Config c;
    config_defaults(&c);
    // The defaults that make it the so14 Stage 2 benchmark; a config file or --key=value wins.
    bool has_cfg = argc > first && strncmp(argv[first], "--", 2) != 0;
    char student_cfg[1024];
    snprintf(student_cfg, sizeof student_cfg, "%s", has_cfg ? argv[first] : BENCH_STUDENT_CFG);
    if (!has_cfg) {
        char err[2048];
        if (config_load_file_err(&c, BENCH_STUDENT_CFG, err, sizeof err) != 0)
            CG_FAIL("run from the repository's root, or give the student config", "%s", err);
    }
    snprintf(c.teacher, sizeof c.teacher, "%s", TEACHER_RANDOM);
    snprintf(c.teacher_config, sizeof c.teacher_config, "%s", BENCH_TEACHER_CFG);
    c.stage = 2;
    snprintf(c.taps, sizeof c.taps, "every 9");
    c.adaptors = 1;
    c.batch_size = BENCH_BATCH_PER_GPU;
    c.dist_timeout_s = (float)BENCH_DIST_TIMEOUT_S;
    int rest = config_parse_args(&c, argc, argv, first);
    CG_CHECK(rest == 0, "see cgspn bench distill --help", "unexpected argument '%s'", argv[first]);

    Dist *world = dist_process();
    if (max_batch) {   // before any CUDA call: its probes fork (bench/bench_max_batch.c)
        CG_CHECK(world->world == 1, "run it without mpirun: cgspn bench distill --max-batch",
                 "bench distill --max-batch runs in one process on one GPU (this launch has %d "
                 "ranks)", world->world);
        return bench_distill_max_batch(&c, student_cfg, sizes ? sizes : MAX_BATCH_SIZES, cap,
                                       warmup, steps);
    }
    Dist alone;
    dist_init_single(&alone);
    alone.timeout_s = BENCH_DIST_TIMEOUT_S;
    const bool main_rank = world->rank == 0;
    if (main_rank)
        printf("distill Stage 2 step (teacher forward, student forward + backward, AdamW): student "
               "%s, teacher %s, %d px, %d images per GPU, taps %s, zero = %d, overlap = %d, %d "
               "warm-up + %d timed steps%s\n", student_cfg,
               c.teacher_config, c.img_size, c.batch_size, c.taps, c.zero, overlap, warmup, steps,
               memory ? ", 1 GPU with grad_checkpoint 0 and 1" : "");

    if (memory) {   // 1 GPU (every rank alone), without and with recomputation
        BenchResult rows[2];
        for (int g = 0; g < 2; g++) {
            Config cg = c;
            cg.grad_checkpoint = g;
            rows[g] = bench_steps(&cg, &alone, warmup, steps, overlap,
                                  main_rank ? (g == 0 ? SAY_DEVICE : 0) | SAY_PLAN : 0, false);
        }
        if (main_rank) {
            print_table_head();
            for (int g = 0; g < 2; g++) print_table_row(&rows[g], steps, rows[g].img_per_s);
            printf("\n");
            print_memory_vs_torch(rows, 2, c.img_size);
        }
        return isfinite(rows[0].loss) && isfinite(rows[1].loss) ? 0 : 1;
    }

    // 1 GPU: every rank alone at the same time.
    BenchResult one = bench_steps(&c, &alone, warmup, steps, overlap,
                                  main_rank ? SAY_DEVICE | SAY_PLAN : 0, profile);
    double *ones = cg_malloc((size_t)world->world * sizeof(double));
    dist_all_gather_bytes(world, &one.img_per_s, ones, sizeof(double), "the 1-GPU results");
    double lo = ones[0], hi = ones[0];
    for (int i = 1; i < world->world; i++) lo = fmin(lo, ones[i]), hi = fmax(hi, ones[i]);
    free(ones);
    // N GPUs together.
    BenchResult all = one;
    if (world->world > 1) all = bench_steps(&c, world, warmup, steps, overlap, 0, profile);

    if (main_rank) {
        print_table_head();
        print_table_row(&one, steps, one.img_per_s);
        if (world->world > 1) print_table_row(&all, steps, one.img_per_s);
        if (world->world > 1)
            printf("1-GPU img/s across the %d GPUs (each alone): %.1f .. %.1f\n", world->world, lo, hi);
        printf("scaling %d GPUs / 1 GPU: %.3f (zero = %d, overlap = %d)\n", all.world,
               all.img_per_s / one.img_per_s, c.zero, overlap);
        if (profile && one.prof.done && world->world > 1) print_profiles(&one.prof, &all.prof, world->world);
        else if (profile && !one.prof.done) printf("--profile=1: op timing needs the GPU (nothing to show)\n");
    }
    int finite = isfinite(one.loss) && isfinite(all.loss);
    return finite ? 0 : 1;
}
