// The training loops across ranks, under mpirun: `make test` runs
//   mpirun --allow-run-as-root --oversubscribe -np 2 build/tests/test_dist_train
// Proves, for `cgspn train` and for Stage 2 of `cgspn distill`, that 2 ranks x b images equal
// 1 rank x 2b images (same seed, same data order: every step's loss and the final weights to
// fp32 round-off, zero = 0 and zero = 1), that a 2-rank run stopped and resumed is bit-exact
// (losses, logs, weights, state and optimizer shards), and that a checkpoint written by 2 ranks
// resumes on a world of one and the reverse (zero = 0 and 1), that zero = 1 leaves each rank
// shard-size moment (and master) buffers, and that a NaN on one rank of a distillation run is
// skipped, or stops the run, on both ranks at the same step. The reference runs of one process run inside the
// same job, on a Dist of their own (TrainOptions.dist).
//
// CGSPN_TEST_DEVICE=cuda runs the same tests on two GPUs (one per rank, NCCL; what
// tools/dist_device_check.sh runs): the equivalences in fp32, the bit-exact resumes in bf16.
#include "testlib.h"
#include "jpeg_tree.h"
#include "../dist/ckpt_shard.h"
#include "../train/checkpoint.h"
#include "../train/classify.h"
#include "../train/distill.h"
#include "../train/data_parallel.h"
#include "../train/device_config.h"
#include "../train/model_config.h"
#include "../nn/safetensors.h"
#include <omp.h>
#include <unistd.h>

// 2 x b against 1 x 2b changes the grouping of every sum over the batch (two half-batch means
// averaged against one mean) and of the gradient's all-reduce: fp32 round-off (~1e-7 relative)
// per op, grown by a few AdamW steps (whose update divides by sqrt(v), amplifying relative
// differences of small gradients). Measured on this fixture (CPU, 6 steps): losses within
// 1.0e-7 relative, weights within 2.3e-6 of the largest; the bounds leave a wide margin and
// still catch a wrong slice or a missed average (a rank reading the other's images, or a
// gradient summed instead of averaged, moves the losses by 1e-3 or more).
#define LOSS_TOL 1e-5
#define WEIGHT_TOL 1e-4
// On GPUs cuBLAS may pick other GEMM algorithms for b and 2b images (another grouping of the
// same fp32 sums, never TF32: kernels/cuda/linear.cu), so the bounds are 10x wider there. Not
// yet measured on GPUs: tools/dist_device_check.sh prints the differences.
#define GPU_LOSS_TOL 1e-4
#define GPU_WEIGHT_TOL 1e-3
#define STEPS 6
#define STOP_AT 3

static bool g_gpu;            // CGSPN_TEST_DEVICE=cuda
static Dist *g_dist;
static Dist g_single;        // a world of one, for the reference runs
static char g_dir[256];      // shared by the ranks (rank 0 makes it, then broadcasts the name)

// Largest |a - b| / max|b| over two tensors of the same name in two safetensors files.
static double max_weight_diff(const char *fa, const char *fb) {
    StFile a, b;
    st_open(&a, fa);
    st_open(&b, fb);
    assert_int_equal(a.n, b.n);
    double worst = 0;
    for (int i = 0; i < a.n; i++) {
        const StTensor *ta = &a.tensors[i], *tb = st_find(&b, ta->name);
        assert_non_null(tb);
        assert_int_equal(ta->numel, tb->numel);
        float *x = malloc(ta->numel * sizeof(float)), *y = malloc(tb->numel * sizeof(float));
        char err[512];
        assert_int_equal(st_read_f32_err(&a, ta, x, err, sizeof err), 0);
        assert_int_equal(st_read_f32_err(&b, tb, y, err, sizeof err), 0);
        double scale = 1e-30, diff = 0;
        for (size_t k = 0; k < ta->numel; k++) {
            scale = fmax(scale, fabs(y[k]));
            diff = fmax(diff, fabs((double)x[k] - y[k]));
        }
        worst = fmax(worst, diff / scale);
        free(x);
        free(y);
    }
    st_close(&a);
    st_close(&b);
    return worst;
}

// Steps first+1 .. first+n (1-based in the messages) of two runs' losses.
static void assert_losses_close(const char *what, const float *two, const float *one, int first, int n) {
    for (int i = first; i < first + n; i++) {
        double rel = fabs((double)two[i] - one[i]) / fabs((double)one[i]);
        if (g_dist->rank == 0)
            printf("    %s step %d: 2 ranks %.9f, 1 rank %.9f (rel %.1e)\n", what, i + 1, two[i], one[i], rel);
        if (!(rel < (g_gpu ? GPU_LOSS_TOL : LOSS_TOL))) fail_msg("%s step %d: loss %.9g on 2 ranks, %.9g on 1 (rel %.2g)", what,
                                        i + 1, two[i], one[i], rel);
    }
}

// ---- cgspn train ------------------------------------------------------------------------------------

// On GPUs the fixture's model is widened to the sizes of configs/fmnist_cgspn.cfg (the GPU
// kernels' tested shapes: bf16 rows of 16 bytes and more); the teacher follows.
static void gpu_sizes(Config *c) {
    if (!g_gpu) return;
    c->width = 64;
    c->heads = 4;
    c->mlp_hidden = 128;
    if (strcmp(c->model, "vit") != 0) c->gspn_latent = 16;
}

// precision: "fp32" for the equivalences, "bf16" for the resumes on GPUs (fp32 on the CPU).
static Config train_config_as(const char *run, int zero, const char *precision) {
    Config c = fixture_config(g_dir, "cgspn", run, STEPS);
    gpu_sizes(&c);
    if (g_gpu) {
        snprintf(c.device, sizeof c.device, "cuda");
        snprintf(c.precision, sizeof c.precision, "%s", precision);
    }
    c.batch_size = 8;        // 2 ranks x 4 against 1 rank x 8
    c.eval_batch_size = 8;
    c.ckpt_every = STOP_AT;
    c.log_every = 2;         // a log window spans the resume
    c.zero = zero;
    c.bucket_mb = 0.002f;    // several buckets: the overlapped launch order is exercised
    c.dist_timeout_s = 30;
    return c;
}

static Config train_config(const char *run, int zero) { return train_config_as(run, zero, "fp32"); }

// A run's config for run folder `run` and zero = 0 or 1: train_config_as's fixture, or another
// model on other shards (gspn_hier below).
typedef Config (*RunConfigFn)(const char *run, int zero, const char *precision);

// 2 ranks x 4 images equal 1 rank x 8 (fp32): every step's loss, the evaluation, the weights.
// Run folders PREFIX_ref_r<rank> (each rank's own reference) and PREFIX_two.
static TrainResult two_ranks_equal_one(RunConfigFn make, const char *prefix, int zero) {
    char ref[64], run[64];
    snprintf(ref, sizeof ref, "%s_ref_r%d", prefix, g_dist->rank);
    snprintf(run, sizeof run, "%s_two", prefix);
    Config one = make(ref, zero, "fp32");
    float a[STEPS], b[STEPS];
    TrainOptions oa = {.step_losses = a, .dist = &g_single};
    TrainResult ra = classify_train(&one, &oa);
    assert_int_equal(ra.step, STEPS);
    Config two = make(run, zero, "fp32");
    TrainOptions ob = {.step_losses = b, .dist = g_dist};
    TrainResult rb = classify_train(&two, &ob);
    assert_int_equal(rb.step, STEPS);
    assert_losses_close(prefix, b, a, 0, STEPS);
    // The evaluation covers the whole split on 2 ranks too, and agrees.
    assert_int_equal(rb.eval.count, ra.eval.count);
    assert_true(fabs(rb.eval.loss - ra.eval.loss) < LOSS_TOL * ra.eval.loss);
    char fa[600], fb[600];
    snprintf(fa, sizeof fa, "%s/%s/step_%08d/model.safetensors", g_dir, ref, STEPS);
    snprintf(fb, sizeof fb, "%s/%s/step_%08d/model.safetensors", g_dir, run, STEPS);
    double e = max_weight_diff(fb, fa);
    if (g_dist->rank == 0) printf("    %s zero = %d: weights differ by %.2g (relative to the largest)\n", prefix, zero, e);
    if (!(e < (g_gpu ? GPU_WEIGHT_TOL : WEIGHT_TOL))) fail_msg("%s zero = %d: weights of 2 ranks differ from 1 rank by %.3g", prefix, zero, e);
    return rb;
}

static void train_two_ranks_equal_one(int zero) {
    char prefix[16];
    snprintf(prefix, sizeof prefix, "z%d", zero);
    two_ranks_equal_one(train_config_as, prefix, zero);
}

static void test_train_two_ranks_equal_one_rank_of_twice_the_batch(void **state) {
    train_two_ranks_equal_one(0);
}

static void test_train_two_ranks_zero1_equal_one_rank_of_twice_the_batch(void **state) {
    train_two_ranks_equal_one(1);
}

// The global batch is per-rank micro-batch x ranks x accumulation: 2 ranks x 2 accumulated
// micro-batches of 2 images take the steps of 1 rank x 8 images.
static void test_train_two_ranks_with_accumulation_equal_one_rank_of_the_global_batch(void **state) {
    char ref[64];
    snprintf(ref, sizeof ref, "accref_r%d", g_dist->rank);
    Config one = train_config(ref, 0);
    float a[STEPS], b[STEPS];
    TrainOptions oa = {.step_losses = a, .dist = &g_single};
    assert_int_equal(classify_train(&one, &oa).step, STEPS);
    Config two = train_config("acc2x2", 1);
    two.accum_steps = 2;
    TrainOptions ob = {.step_losses = b, .dist = g_dist};
    assert_int_equal(classify_train(&two, &ob).step, STEPS);
    assert_losses_close("2 ranks x 2 accumulated", b, a, 0, STEPS);
}

// Overlap: with the tape's reports on (the default), every gradient bucket has been launched
// by the time backward returns (each as its last parameter became final); with overlap off,
// none has, and the optimizer step launches them all. The averaged gradients are the same bits.
static float *one_step_grads(bool overlap, int *launched, int *buckets, size_t *total) {
    Config c = train_config("overlap", 0);
    Ctx ctx = device_open(&c);
    EncoderConfig ec = encoder_config_from(&c);
    Encoder e;
    ParamTable t;
    params_init_table(&t);
    encoder_register(&e, &ec, &t);
    params_alloc(&t, &ctx);
    params_initialize(&t, &ctx, 3);
    DataParallel dp;
    dp_open(&dp, g_dist, &t, &ctx, &c);
    dp.overlap = overlap;
    Arena arena;
    arena_init(&arena, &ctx, 1u << 20);
    Tape tape;
    tape_init(&tape, &ctx, &arena);
    const int B = 2, K = c.num_classes;
    Tensor *x = tape_tensor(&tape, 4, (int[]){B, c.in_chans, c.img_size, c.img_size}, true);
    Tensor *y = tape_tensor(&tape, 2, (int[]){B, K}, true);
    float *h = calloc(x->numel, sizeof(float)), *ty = calloc(y->numel, sizeof(float));
    uint64_t seed = 17 + (uint64_t)g_dist->rank;   // each rank its own images
    for (size_t i = 0; i < x->numel; i++) h[i] = (float)(test_rng_next(&seed) >> 40) / 16777216.0f;
    for (int i = 0; i < B; i++) ty[i * K + (i + g_dist->rank) % K] = 1.0f;
    tensor_upload(&ctx, x, h);
    tensor_upload(&ctx, y, ty);
    Tensor *loss = nn_cross_entropy(&tape, encoder_head(&tape, &e, encoder_forward(&tape, &e, x, NULL)), y);
    dp_backward(&dp, &tape, loss, true);
    *launched = dp.g->next;
    *buckets = dp.g->n_buckets;
    dist_wait_grads(dp.g);
    float *g = malloc(t.total * sizeof(float));
    *total = t.total;
    Tensor all = {0};
    tensor_set_shape(&all, 1, (int[]){(int)t.total});
    all.data = t.grads, all.dtype = DTYPE_F32, all.device = ctx.device;
    tensor_download(&ctx, &all, g);
    free(h);
    free(ty);
    tape_free(&tape);
    arena_free(&arena);
    dp_close(&dp);
    params_free(&t, &ctx);
    device_close(&ctx);
    return g;
}

static void test_buckets_launch_during_backward_and_average_the_same(void **state) {
    int launched_on, launched_off, buckets;
    size_t n_on, n_off;
    float *on = one_step_grads(true, &launched_on, &buckets, &n_on);
    float *off = one_step_grads(false, &launched_off, &buckets, &n_off);
    if (g_dist->rank == 0)
        printf("    %d buckets: %d launched during backward with overlap, %d without\n", buckets,
               launched_on, launched_off);
    assert_true(buckets > 2);
    assert_int_equal(launched_on, buckets);
    assert_int_equal(launched_off, 0);
    // The same averaged gradient either way: a bucket's sum does not depend on when it launched.
    assert_int_equal(n_on, n_off);
    assert_memory_equal(on, off, n_on * sizeof(float));
    free(on);
    free(off);
}

// ZeRO-1 in the trainer's setup: dp_open shards the stepped table's optimizer state, so each rank
// allocates moments (and, in bf16 on GPUs, fp32 masters) for its shard only: its pieces back to
// back, PARAM_ALIGN-padded, the two ranks' pieces covering every parameter element once.
static void test_zero1_dp_open_leaves_each_rank_shard_size_moments_and_masters(void **state) {
    Config c = train_config_as("zmem", 1, "bf16");
    Ctx ctx = device_open(&c);
    EncoderConfig ec = encoder_config_from(&c);
    Encoder e;
    ParamTable t;
    params_init_table(&t);
    encoder_register(&e, &ec, &t);
    params_alloc(&t, &ctx);
    params_initialize(&t, &ctx, 3);
    const size_t whole = t.state_total;
    assert_int_equal(whole, t.total);
    DataParallel dp;
    dp_open(&dp, g_dist, &t, &ctx, &c);
    assert_int_equal(dp.zero, 1);
    assert_ptr_equal(t.shard, dp.g->seg);
    const size_t mine = dp.g->shard_elems, pad = (size_t)dp.g->n_seg * PARAM_ALIGN;
    assert_true(dist_sum_f64(g_dist, (double)mine, "the shard sizes") == (double)params_count(&t, false));
    assert_true(t.state_total >= mine && t.state_total < mine + pad);
    assert_true(t.state_total < whole / 2 + pad);
    if (g_gpu) assert_non_null(t.masters);   // bf16 values: the masters are the shard's too
    if (g_dist->rank == 0)
        printf("    rank 0: moments%s of %zu elements each (shard %zu in %d pieces), whole table %zu\n",
               t.masters ? " and masters" : "", t.state_total, mine, dp.g->n_seg, whole);
    dp_close(&dp);
    params_free(&t, &ctx);
    device_close(&ctx);
}

// Every metrics line's loss and grad_norm: the same characters.
static void assert_metrics_same(const char *run_a, const char *run_b) {
    char x[600], y[600];
    snprintf(x, sizeof x, "%s/%s/metrics.jsonl", g_dir, run_a);
    snprintf(y, sizeof y, "%s/%s/metrics.jsonl", g_dir, run_b);
    size_t nx, ny;
    char *tx = (char *)test_read_bytes(x, &nx), *ty = (char *)test_read_bytes(y, &ny);
    const char *keys[] = {"\"loss\"", "\"grad_norm\"", "\"test_top1\""};
    int found = 0;
    for (int k = 0; k < 3; k++) {
        char *u = tx, *v = ty;
        while ((u = strstr(u, keys[k])) != NULL) {
            v = strstr(v, keys[k]);
            assert_non_null(v);
            assert_memory_equal(u, v, strcspn(u, ",}"));
            u++, v++, found++;
        }
    }
    assert_true(found >= 4);
    free(tx);
    free(ty);
}

static void assert_ckpt_files_same(const char *run_a, const char *run_b, int step, int zero) {
    const char *files[] = {"model.safetensors", "state.safetensors",
                           "state.rank00000-of00002.safetensors", "state.rank00001-of00002.safetensors"};
    for (int i = 0; i < (zero ? 4 : 2); i++) {
        char x[700], y[700];
        snprintf(x, sizeof x, "%s/%s/step_%08d/%s", g_dir, run_a, step, files[i]);
        snprintf(y, sizeof y, "%s/%s/step_%08d/%s", g_dir, run_b, step, files[i]);
        assert_files_equal(x, y);
    }
}

// 2 ranks (bf16 on GPUs), stopped after STOP_AT steps and resumed with --resume=auto, against an
// uninterrupted run: the same bits in every loss, the logged metrics and the final checkpoint.
static void two_rank_resume_is_bit_exact(RunConfigFn make, const char *prefix, int zero) {
    char full_run[64], split_run[64];
    snprintf(full_run, sizeof full_run, "%s_full", prefix);
    snprintf(split_run, sizeof split_run, "%s_split", prefix);
    float full[STEPS], split[STEPS];
    memset(split, 0xff, sizeof split);
    Config a = make(full_run, zero, "bf16");
    TrainOptions oa = {.step_losses = full, .dist = g_dist};
    assert_int_equal(classify_train(&a, &oa).step, STEPS);
    Config b = make(split_run, zero, "bf16");
    TrainOptions ob = {.stop_after = STOP_AT, .step_losses = split, .dist = g_dist};
    assert_int_equal(classify_train(&b, &ob).step, STOP_AT);
    if (zero) {   // the optimizer shards and their marker are in the checkpoint
        char dir[600];
        snprintf(dir, sizeof dir, "%s/%s/step_%08d", g_dir, split_run, STOP_AT);
        int world = 0;
        assert_int_equal(dist_ckpt_shards_complete(dir, &world), 1);
        assert_int_equal(world, 2);
    }
    snprintf(b.resume, sizeof b.resume, "auto");
    TrainOptions oc = {.step_losses = split, .dist = g_dist};
    assert_int_equal(classify_train(&b, &oc).step, STEPS);
    for (int i = 0; i < STEPS; i++)
        if (memcmp(&full[i], &split[i], sizeof(float)) != 0)
            fail_msg("%s zero = %d step %d: loss %.9g vs %.9g after the resume", prefix, zero, i + 1, full[i], split[i]);
    if (g_dist->rank == 0) {
        assert_metrics_same(full_run, split_run);
        assert_ckpt_files_same(full_run, split_run, STEPS, zero);
    }
}

static void train_resume_is_bit_exact(int zero) {
    char prefix[16];
    snprintf(prefix, sizeof prefix, "z%d", zero);
    two_rank_resume_is_bit_exact(train_config_as, prefix, zero);
}

static void test_train_two_rank_resume_is_bit_exact(void **state) { train_resume_is_bit_exact(0); }
static void test_train_two_rank_zero1_resume_is_bit_exact(void **state) { train_resume_is_bit_exact(1); }

// A checkpoint of 2 ranks continues on one process (with zero = 1 its optimizer shards
// re-sharded onto one), and a checkpoint of one process continues on 2 ranks: the losses follow
// the uninterrupted run's to round-off.
static void world_change(int zero) {
    float full[STEPS], cont[STEPS];
    char run[64];
    snprintf(run, sizeof run, "wfull_z%d", zero);
    Config a = train_config(run, zero);
    TrainOptions oa = {.step_losses = full, .dist = g_dist};
    assert_int_equal(classify_train(&a, &oa).step, STEPS);
    char one[64];
    snprintf(one, sizeof one, "wone_z%d_r%d", zero, g_dist->rank);
    Config c = train_config(one, zero);
    snprintf(c.resume, sizeof c.resume, "%s/%s/step_%08d", g_dir, run, STOP_AT);
    TrainOptions oc = {.step_losses = cont, .dist = &g_single};
    assert_int_equal(classify_train(&c, &oc).step, STEPS);
    assert_losses_close("2 ranks -> 1", cont, full, STOP_AT, STEPS - STOP_AT);

    // 1 -> 2: a one-process run (each rank its own), and rank 0's resumed on both ranks.
    float solo[STEPS], two[STEPS];
    char alone[64];
    snprintf(alone, sizeof alone, "wsolo_z%d_r%d", zero, g_dist->rank);
    Config e = train_config(alone, zero);
    TrainOptions oe = {.step_losses = solo, .dist = &g_single};
    assert_int_equal(classify_train(&e, &oe).step, STEPS);
    dist_barrier(g_dist, "the one-process runs written");
    snprintf(run, sizeof run, "wtwo_z%d", zero);
    Config f = train_config(run, zero);
    snprintf(f.resume, sizeof f.resume, "%s/wsolo_z%d_r0/step_%08d", g_dir, zero, STOP_AT);
    TrainOptions of = {.step_losses = two, .dist = g_dist};
    assert_int_equal(classify_train(&f, &of).step, STEPS);
    assert_losses_close("1 rank -> 2", two, solo, STOP_AT, STEPS - STOP_AT);
}

static void test_checkpoints_move_between_one_and_two_ranks(void **state) { world_change(0); }
static void test_zero1_checkpoints_move_between_one_and_two_ranks(void **state) { world_change(1); }

// ---- cgspn distill, Stage 2 ------------------------------------------------------------------------

// The teacher: a tiny ViT (the student's width, depth and patch) trained one step by cgspn
// train: its run folder holds the weights and config.cfg. Made once.
static void make_teacher(void) {
    static bool made;
    if (made) return;
    Config t = fixture_config(g_dir, "vit", "teacher", 1);   // on the CPU (any device would do)
    gpu_sizes(&t);
    TrainOptions o = {.dist = &g_single};
    if (g_dist->rank == 0) assert_int_equal(classify_train(&t, &o).step, 1);
    dist_barrier(g_dist, "the teacher written");
    made = true;
}

static Config distill_config_as(const char *run, int zero, const char *precision) {
    Config c = train_config_as(run, zero, precision);
    c.stage = 2;
    snprintf(c.teacher, sizeof c.teacher, "%s/teacher", g_dir);
    snprintf(c.taps, sizeof c.taps, "all");
    c.gamma = 0.5f;          // the head's CE too: every kind of loss term is averaged over ranks
    c.ckpt_every = STOP_AT;
    return c;
}

static Config distill_config(const char *run, int zero) { return distill_config_as(run, zero, "fp32"); }

static void distill_two_ranks_equal_one(int zero) {
    make_teacher();
    char ref[64], run[64];
    snprintf(ref, sizeof ref, "dref_z%d_r%d", zero, g_dist->rank);
    snprintf(run, sizeof run, "dtwo_z%d", zero);
    float a[STEPS], b[STEPS];
    Config one = distill_config(ref, zero);
    DistillOptions oa = {.step_losses = a, .dist = &g_single};
    assert_int_equal(distill_train(&one, &oa).step, STEPS);
    Config two = distill_config(run, zero);
    DistillOptions ob = {.step_losses = b, .dist = g_dist};
    assert_int_equal(distill_train(&two, &ob).step, STEPS);
    assert_losses_close("distill", b, a, 0, STEPS);
    char fa[600], fb[600];
    snprintf(fa, sizeof fa, "%s/%s/step_%08d/model.safetensors", g_dir, ref, STEPS);
    snprintf(fb, sizeof fb, "%s/%s/step_%08d/model.safetensors", g_dir, run, STEPS);
    double e = max_weight_diff(fb, fa);
    if (g_dist->rank == 0) printf("    distill zero = %d: weights differ by %.2g\n", zero, e);
    if (!(e < (g_gpu ? GPU_WEIGHT_TOL : WEIGHT_TOL))) fail_msg("distill zero = %d: weights of 2 ranks differ by %.3g", zero, e);
}

static void test_distill_stage2_two_ranks_equal_one_rank_of_twice_the_batch(void **state) {
    distill_two_ranks_equal_one(0);
}

static void test_distill_stage2_two_ranks_zero1_equal_one_rank_of_twice_the_batch(void **state) {
    distill_two_ranks_equal_one(1);
}

// A NaN on one rank only (its images of step 3): the loss mean is NaN on both, so both skip that
// update together (on_nonfinite = skip) and end on the same step count, or both stop there.
static void test_distill_nan_on_one_rank_is_skipped_or_stops_on_both(void **state) {
    make_teacher();
    Config a = distill_config("dnan_skip", 0);
    snprintf(a.on_nonfinite, sizeof a.on_nonfinite, "skip");
    DistillOptions o = {.nonfinite_at = g_dist->rank == 1 ? 3 : 0, .dist = g_dist};
    TrainResult r = distill_train(&a, &o);
    assert_int_equal(r.status, TRAIN_DONE);
    assert_int_equal(r.step, STEPS);
    assert_int_equal(r.skipped, 1);
    Config b = distill_config("dnan_stop", 0);   // on_nonfinite = stop
    r = distill_train(&b, &o);
    assert_int_equal(r.status, TRAIN_NONFINITE);
    assert_int_equal(r.nonfinite_step, 3);
    assert_int_equal(r.step, 2);
}

static void test_distill_stage2_two_rank_zero1_resume_is_bit_exact(void **state) {
    make_teacher();
    float full[STEPS], split[STEPS];
    Config a = distill_config_as("dfull", 1, "bf16");
    DistillOptions oa = {.step_losses = full, .dist = g_dist};
    assert_int_equal(distill_train(&a, &oa).step, STEPS);
    Config b = distill_config_as("dsplit", 1, "bf16");
    DistillOptions ob = {.stop_after = STOP_AT, .step_losses = split, .dist = g_dist};
    assert_int_equal(distill_train(&b, &ob).step, STOP_AT);
    snprintf(b.resume, sizeof b.resume, "auto");
    DistillOptions oc = {.step_losses = split, .dist = g_dist};
    assert_int_equal(distill_train(&b, &oc).step, STEPS);
    for (int i = 0; i < STEPS; i++)
        if (memcmp(&full[i], &split[i], sizeof(float)) != 0)
            fail_msg("distill step %d: loss %.9g vs %.9g after the resume", i + 1, full[i], split[i]);
    if (g_dist->rank == 0) assert_ckpt_files_same("dfull", "dsplit", STEPS, 1);
}

// Two teachers of different shape (teacher 2: registers, no_embed_class, depth 3, its own input
// normalization), both PHI-S standardized: 2 ranks equal 1 rank of twice the batch (the
// statistics too: each rank's slice means, averaged), and the 2-rank run resumes bit-exactly.
static void make_second_teacher(void) {
    static bool made;
    if (made) return;
    Config t = fixture_config(g_dir, "vit", "teacher2", 1);
    gpu_sizes(&t);
    t.reg_tokens = 2, t.no_embed_class = 1, t.depth = 3;
    TrainOptions o = {.dist = &g_single};
    if (g_dist->rank == 0) {
        assert_int_equal(classify_train(&t, &o).step, 1);
        char path[300];
        snprintf(path, sizeof path, "%s/t2.cfg", g_dir);
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        fprintf(f, "teacher = %s/teacher2\nteacher_mean = 0.25\nteacher_std = 0.4\nbeta = 0.7\n"
                "summary_weight = 0.5\n", g_dir);
        fclose(f);
    }
    dist_barrier(g_dist, "teacher 2 written");
    made = true;
}

static Config two_teacher_config(const char *run, const char *precision) {
    Config c = distill_config_as(run, 0, precision);
    snprintf(c.extra_teachers, sizeof c.extra_teachers, "%s/t2.cfg", g_dir);
    c.phi_s = 1;
    c.phi_s_batches = 2;
    return c;
}

static void test_distill_two_teachers_two_ranks_equal_one_and_resume_bit_exactly(void **state) {
    make_teacher();
    make_second_teacher();
    char ref[64];
    snprintf(ref, sizeof ref, "tref_r%d", g_dist->rank);
    float a[STEPS], b[STEPS];
    Config one = two_teacher_config(ref, "fp32");
    DistillOptions oa = {.step_losses = a, .dist = &g_single};
    assert_int_equal(distill_train(&one, &oa).step, STEPS);
    Config two = two_teacher_config("ttwo", "fp32");
    DistillOptions ob = {.step_losses = b, .dist = g_dist};
    assert_int_equal(distill_train(&two, &ob).step, STEPS);
    assert_losses_close("distill, two teachers", b, a, 0, STEPS);

    float full[STEPS], split[STEPS];
    Config f = two_teacher_config("tfull", "bf16");
    DistillOptions of = {.step_losses = full, .dist = g_dist};
    assert_int_equal(distill_train(&f, &of).step, STEPS);
    Config s = two_teacher_config("tsplit", "bf16");
    DistillOptions os = {.stop_after = STOP_AT, .step_losses = split, .dist = g_dist};
    assert_int_equal(distill_train(&s, &os).step, STOP_AT);
    snprintf(s.resume, sizeof s.resume, "auto");
    DistillOptions oc = {.step_losses = split, .dist = g_dist};
    assert_int_equal(distill_train(&s, &oc).step, STEPS);
    for (int i = 0; i < STEPS; i++)
        if (memcmp(&full[i], &split[i], sizeof(float)) != 0)
            fail_msg("two teachers, step %d: loss %.9g vs %.9g after the resume", i + 1, full[i], split[i]);
    if (g_dist->rank == 0) assert_ckpt_files_same("tfull", "tsplit", STEPS, 0);
}

// ---- gspn_hier on ImageNet's layout ----------------------------------------------------------

// The hierarchical GSPN encoder (a tiny gspn_t: the stem, four stages, LPUs, the 2-channel shared
// scan) on the JPEG ImageFolder tree of tests/jpeg_tree.h (train/<wnid>/*.JPEG, a flat val folder
// with LOC_val_solution.csv), built once by rank 0 into g_dir/jpeg/shards.
static Config hier_config_as(const char *run, int zero, const char *precision) {
    Config c = train_config_as(run, zero, precision);
    fixture_gspn_hier(&c, g_gpu ? 16 : 8);
    c.drop_path = 0.1f;      // the masks follow the global sample index on any number of ranks
    snprintf(c.data_shards, sizeof c.data_shards, "%s/jpeg/shards", g_dir);
    return c;
}

static void test_gspn_hier_on_a_jpeg_tree_two_ranks_equal_one_and_resume_bit_exactly(void **state) {
    TrainResult r = two_ranks_equal_one(hier_config_as, "hier", 0);
    assert_int_equal(r.eval.count, 16);   // the flat val folder, every image once
    two_rank_resume_is_bit_exact(hier_config_as, "hier", 0);
}

int main(int argc, char **argv) {
    omp_set_num_threads(1);   // two ranks share the cores of a CI machine
    const char *dev = getenv("CGSPN_TEST_DEVICE");
    g_gpu = dev && strcmp(dev, "cuda") == 0;
    if (g_gpu) setenv("NCCL_NVLS_ENABLE", "0", 1);   // NVLink multicast off on these machines
    g_dist = dist_process_init(&argc, &argv);
    dist_init_single(&g_single);
    if (g_dist->world != 2) {
        fprintf(stderr, "test_dist_train: run it under mpirun -np 2 (world is %d)\n", g_dist->world);
        dist_finalize(g_dist);
        return 1;
    }
    // Rank 0 makes the shared folder and the shards; rank 1's report goes to a file, shown when
    // it fails.
    if (g_dist->rank == 0) {
        if (test_make_temp_dir(g_dir, sizeof g_dir, "dist_train") != 0) {
            fprintf(stderr, "test_dist_train: cannot make a temporary folder\n");
            return 1;
        }
        fixture_build_shards(g_dir, 40, 16);   // 5 steps of 8 per epoch: the runs cross an epoch
        char jpeg[300];
        snprintf(jpeg, sizeof jpeg, "%s/jpeg", g_dir);
        mkdir(jpeg, 0755);
        jpeg_tree_build(jpeg, 40, 16);          // gspn_hier: ImageNet's layout, 5 steps per epoch
    }
    dist_broadcast(g_dist, g_dir, sizeof g_dir, 0, "the test folder");
    char log[300];
    snprintf(log, sizeof log, "%s/rank1.log", g_dir);
    if (g_dist->rank == 1 && !freopen(log, "w", stdout)) return 1;

    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_train_two_ranks_equal_one_rank_of_twice_the_batch),
        cmocka_unit_test(test_train_two_ranks_zero1_equal_one_rank_of_twice_the_batch),
        cmocka_unit_test(test_train_two_ranks_with_accumulation_equal_one_rank_of_the_global_batch),
        cmocka_unit_test(test_buckets_launch_during_backward_and_average_the_same),
        cmocka_unit_test(test_zero1_dp_open_leaves_each_rank_shard_size_moments_and_masters),
        cmocka_unit_test(test_train_two_rank_resume_is_bit_exact),
        cmocka_unit_test(test_train_two_rank_zero1_resume_is_bit_exact),
        cmocka_unit_test(test_checkpoints_move_between_one_and_two_ranks),
        cmocka_unit_test(test_zero1_checkpoints_move_between_one_and_two_ranks),
        cmocka_unit_test(test_distill_stage2_two_ranks_equal_one_rank_of_twice_the_batch),
        cmocka_unit_test(test_distill_nan_on_one_rank_is_skipped_or_stops_on_both),
        cmocka_unit_test(test_distill_stage2_two_ranks_zero1_equal_one_rank_of_twice_the_batch),
        cmocka_unit_test(test_distill_stage2_two_rank_zero1_resume_is_bit_exact),
        cmocka_unit_test(test_distill_two_teachers_two_ranks_equal_one_and_resume_bit_exactly),
        cmocka_unit_test(test_gspn_hier_on_a_jpeg_tree_two_ranks_equal_one_and_resume_bit_exactly),
    };
    int failed = cmocka_run_group_tests_name(g_dist->rank ? "dist_train (rank 1)" : "dist_train (rank 0)",
                                             tests, NULL, NULL);
    int all_failed = (int)dist_sum_f64(g_dist, failed, "the test results");
    if (g_dist->rank == 1 && failed) {   // show rank 1's report
        fflush(stdout);
        FILE *f = fopen(log, "r");
        char line[512];
        while (f && fgets(line, sizeof line, f)) fputs(line, stderr);
        if (f) fclose(f);
    }
    dist_barrier(g_dist, "the end of the tests");
    dist_finalize(g_dist);
    if (g_dist->rank == 0) {
        if (all_failed) printf("test_dist_train: %d test(s) failed across the ranks\n", all_failed);
        test_remove_dir(g_dir);
    }
    return failed ? 1 : 0;
}
