// Data parallelism without MPI (dist/): ranks are forked processes that meet through a
// rendezvous folder and talk TCP, as under srun or a RANK/WORLD_SIZE launcher. Proves the
// bootstrap agrees on ranks, the host collectives are rank-order sums (the same bits on every
// rank), a multi-rank optimizer step equals the one-process step on the mean gradient (zero = 0
// and 1), sharded checkpoint state re-shards exactly across world sizes, and a rank that exits
// or hangs stops the others with a message naming it. (tests/test_dist_mpi.c: the same under
// mpirun.)
#include "testlib_dist.h"
#include "../dist/dist_internal.h"   // dist_watchdog_stop
#include <omp.h>
#include <sys/stat.h>
#include <unistd.h>

// fp32 round-off of a few AdamW steps whose clip scale comes from a norm summed in another order
// (per-shard partial sums): relative, per element. A wrong norm, a missed shard or a stale
// all-gather gives errors of 1e-2 and more.
#define SHARDED_STEP_TOL 1e-5
// The norm itself: one sum of ~3,000 squares in double, rounded to fp32, in another grouping.
#define NORM_TOL 1e-6

static char g_dir[256];

static int setup_dir(void **state) { return test_make_temp_dir(g_dir, sizeof g_dir, "dist"); }
static int teardown_dir(void **state) { return test_remove_dir(g_dir); }

// ---- layout ------------------------------------------------------------------------------------------

static void test_dist_part_splits_ranges_into_aligned_parts_covering_everything(void **state) {
    const size_t sizes[] = {0, 1, 63, 64, 127, 128, 1000, 64 * 3 * 7, 64 * 3 * 7 + 5, 100000};
    const int worlds[] = {1, 2, 3, 8};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        for (size_t w = 0; w < sizeof worlds / sizeof worlds[0]; w++) {
            size_t at = 0, first = 0;
            for (int r = 0; r < worlds[w]; r++) {
                size_t lo, hi;
                dist_part(sizes[i], worlds[w], r, &lo, &hi);
                assert_int_equal(lo, at);
                assert_true(hi >= lo);
                if (r == 0) first = hi - lo;
                if (r < worlds[w] - 1) {
                    assert_int_equal((hi - lo) % DIST_ALIGN, 0);
                    assert_int_equal(hi - lo, first);
                }
                at = hi;
            }
            assert_int_equal(at, sizes[i]);
        }
    }
}

static void test_shards_of_all_ranks_cover_every_parameter_element_once(void **state) {
    DistTestModel m;
    dist_test_model(&m);
    for (int world = 1; world <= 5; world++) {
        size_t B = dist_bucket_elems(DIST_TEST_BUCKET_MB, world);
        assert_int_equal(B % ((size_t)world * DIST_ALIGN), 0);
        assert_true(m.t.total / B >= 2);   // several buckets
        unsigned char *seen = calloc(m.t.total, 1);
        for (int r = 0; r < world; r++) {
            ParamSegment *seg;
            int n = dist_shard_segments(&m.t, B, world, r, &seg);
            for (int s = 0; s < n; s++) {
                const Param *p = m.t.params[seg[s].param];
                assert_true(seg[s].len > 0 && seg[s].start + seg[s].len <= p->value.numel);
                if (s) assert_true(seg[s].param > seg[s - 1].param ||
                                   seg[s].start >= seg[s - 1].start + seg[s - 1].len);
                for (size_t k = 0; k < seg[s].len; k++) seen[p->offset + seg[s].start + k]++;
            }
            free(seg);
        }
        for (int i = 0; i < m.t.n; i++)
            for (size_t k = 0; k < m.t.params[i]->value.numel; k++)
                if (seen[m.t.params[i]->offset + k] != 1)
                    fail_msg("world %d: %s[%zu] is in %d shards", world, m.t.params[i]->name, k,
                             seen[m.t.params[i]->offset + k]);
        free(seen);
    }
    dist_test_model_free(&m);
}

// ---- bootstrap ------------------------------------------------------------------------------------

static int child_ranks_agree(Dist *d, void *arg) {
    int expect_world = *(int *)arg;
    CHILD_CHECK(d->world == expect_world && d->backend == DIST_TCP, "world %d backend %d", d->world,
                d->backend);
    int all[DIST_TEST_MAX_RANKS];
    dist_all_gather_bytes(d, &d->rank, all, sizeof(int), "the rank check");
    for (int r = 0; r < d->world; r++) CHILD_CHECK(all[r] == r, "slot %d holds rank %d", r, all[r]);
    CHILD_CHECK(d->local_world == d->world && d->local_rank == d->rank, "local %d of %d",
                d->local_rank, d->local_world);
    return 0;
}

static void test_three_forked_ranks_meet_through_the_rendezvous_folder(void **state) {
    int world = 3;
    RankResult res[3];
    dist_test_run_ranks(g_dir, world, OPEN_TCP, 20, 30, child_ranks_agree, &world, res);
    dist_test_assert_all_passed(world, res);
    // Every rank removed its address file once all were connected.
    char path[512];
    snprintf(path, sizeof path, "%s/rendezvous/cgspn.rank0", g_dir);
    assert_int_not_equal(access(path, F_OK), 0);
}

static void test_rank_and_world_size_from_the_environment_bootstrap_without_mpi(void **state) {
    int world = 2;
    RankResult res[2];
    dist_test_run_ranks(g_dir, world, OPEN_ENV, 20, 30, child_ranks_agree, &world, res);
    dist_test_assert_all_passed(world, res);
}

static void test_env_launch_without_a_rendezvous_folder_says_which_key_to_set(void **state) {
    unsetenv("CGSPN_RENDEZVOUS");
    setenv("RANK", "1", 1);
    setenv("WORLD_SIZE", "2", 1);
    Dist d;
    char err[1024];
    int argc = 1;
    char *args[] = {"test_dist", NULL}, **argv = args;
    assert_int_equal(dist_init_err(&d, &argc, &argv, err, sizeof err), 0);
    assert_true(d.pending);
    assert_int_equal(d.rank, 1);
    assert_int_equal(d.world, 2);
    assert_int_equal(dist_setup_err(&d, &(DistOptions){5, ""}, err, sizeof err), -1);
    assert_contains(err, "dist_rendezvous");
    setenv("RANK", "2", 1);
    assert_int_equal(dist_init_err(&d, &argc, &argv, err, sizeof err), -1);
    assert_contains(err, "RANK = 2 is not below WORLD_SIZE = 2");
    unsetenv("RANK");
    unsetenv("WORLD_SIZE");
    assert_int_equal(dist_init_err(&d, &argc, &argv, err, sizeof err), 0);
    assert_int_equal(d.world, 1);
    assert_int_equal(d.backend, DIST_SINGLE);
}

// ---- host collectives ---------------------------------------------------------------------------------

static void fill_rank(float *x, size_t n, int rank, int round) {
    uint64_t s = 977ull * (uint64_t)(rank + 1) + (uint64_t)round;
    for (size_t i = 0; i < n; i++)
        x[i] = (float)((double)(test_rng_next(&s) >> 40) / 16777216.0 * 2.0 - 1.0) * (1.0f + (float)(i % 7));
}

// The rank-order sum (mean) of every rank's fill_rank data.
static void expected_sum(float *out, size_t n, int world, int round, bool average) {
    float *x = malloc((n ? n : 1) * sizeof(float));
    for (int r = 0; r < world; r++) {
        fill_rank(x, n, r, round);
        for (size_t i = 0; i < n; i++) out[i] = r == 0 ? x[i] : out[i] + x[i];
    }
    if (average)
        for (size_t i = 0; i < n; i++) out[i] /= (float)world;
    free(x);
}

static int child_collectives(Dist *d, void *arg) {
    const size_t sizes[] = {1, 100, 64 * 3 * 4 + 17, 5000, (1 << 20) + 3};   // the last: MBs, past socket buffers
    for (size_t c = 0; c < sizeof sizes / sizeof sizes[0]; c++) {
        const size_t n = sizes[c];
        float *x = malloc(n * sizeof(float)), *want = malloc(n * sizeof(float));
        float *again = malloc(n * sizeof(float));
        for (int average = 0; average <= 1; average++) {
            fill_rank(x, n, d->rank, (int)c);
            dist_all_reduce_f32(d, x, n, average, "test all-reduce");
            expected_sum(want, n, d->world, (int)c, average);
            CHILD_CHECK(memcmp(x, want, n * sizeof(float)) == 0, "all-reduce n %zu average %d", n, average);
            fill_rank(again, n, d->rank, (int)c);
            dist_all_reduce_f32(d, again, n, average, "test all-reduce, again");
            CHILD_CHECK(memcmp(x, again, n * sizeof(float)) == 0, "second all-reduce differs");
        }
        // reduce-scatter: this rank's part only; then all-gather completes it.
        fill_rank(x, n, d->rank, (int)c);
        dist_reduce_scatter_f32(d, x, n, true, "test reduce-scatter");
        size_t lo, hi;
        dist_part(n, d->world, d->rank, &lo, &hi);
        expected_sum(want, n, d->world, (int)c, true);
        CHILD_CHECK(memcmp(x + lo, want + lo, (hi - lo) * sizeof(float)) == 0, "reduce-scatter part");
        dist_all_gather_parts(d, x, n, sizeof(float), "test all-gather");
        CHILD_CHECK(memcmp(x, want, n * sizeof(float)) == 0, "all-gather n %zu", n);
        // broadcast from the last rank
        fill_rank(x, n, d->rank, 99);
        dist_broadcast(d, x, n * sizeof(float), d->world - 1, "test broadcast");
        fill_rank(want, n, d->world - 1, 99);
        CHILD_CHECK(memcmp(x, want, n * sizeof(float)) == 0, "broadcast n %zu", n);
        free(x);
        free(want);
        free(again);
    }
    double s = dist_sum_f64(d, 0.1 * (d->rank + 1), "test sum");
    double want = 0;
    for (int r = 0; r < d->world; r++) want += 0.1 * (r + 1);
    CHILD_CHECK(s == want, "sum %.17g, expected %.17g", s, want);
    CHILD_CHECK(dist_first_failed(d, d->rank != 1, "test ok") == 1, "first failed");
    CHILD_CHECK(dist_first_failed(d, 1, "test ok") == -1, "none failed");
    dist_barrier(d, "test barrier");
    return 0;
}

static void test_host_collectives_are_rank_order_sums_bit_identical_on_every_rank(void **state) {
    RankResult res[3];
    dist_test_run_ranks(g_dir, 3, OPEN_TCP, 20, 30, child_collectives, NULL, res);
    dist_test_assert_all_passed(3, res);
}

// ---- the optimizer step ----------------------------------------------------------------------------

static uint64_t hash_bytes(const void *p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ ((const uint8_t *)p)[i]) * 1099511628211ull;
    return h;
}

static int child_step(Dist *d, void *arg) {
    const int zero = *(int *)arg;
    DistTestModel m, ref;
    dist_test_model(&m);
    dist_test_model(&ref);
    float norms[DIST_TEST_STEPS], ref_norms[DIST_TEST_STEPS];
    dist_test_train(d, &m, zero, norms);
    dist_test_reference(&ref, d->world, ref_norms);
    // Every rank ends with the same weights.
    uint64_t h = 0, all[DIST_TEST_MAX_RANKS];
    for (int i = 0; i < m.t.n; i++)
        h = h * 31 + hash_bytes(m.t.params[i]->value.data, m.t.params[i]->value.numel * sizeof(float));
    dist_all_gather_bytes(d, &h, all, sizeof h, "weights hash");
    for (int r = 0; r < d->world; r++) CHILD_CHECK(all[r] == h, "rank %d's weights differ", r);
    for (int s = 0; s < DIST_TEST_STEPS; s++)
        CHILD_CHECK(fabs(norms[s] - ref_norms[s]) <= NORM_TOL * ref_norms[s] &&
                    (zero || norms[s] == ref_norms[s]), "step %d norm %.9g, one process %.9g", s,
                    norms[s], ref_norms[s]);
    if (!zero) {
        // The same averaged gradient, then the same code: the same bits, moments included.
        CHILD_CHECK(dist_test_same_bits(&m.t, m.t.values, ref.t.values), "values");
        CHILD_CHECK(dist_test_same_bits(&m.t, m.t.m, ref.t.m), "m");
        CHILD_CHECK(dist_test_same_bits(&m.t, m.t.v, ref.t.v), "v");
    } else {
        double e = dist_test_max_rel(&m.t, m.t.values, ref.t.values);
        CHILD_CHECK(e <= SHARDED_STEP_TOL, "values differ from one process by %.3g", e);
        // Moments are kept only in this rank's shard (the table's layout: the same pieces again).
        DistGrads *g = dist_grads_create(d, &m.t, &m.ctx, 1, DIST_TEST_BUCKET_MB);
        char err[256];
        CHILD_CHECK(dist_test_check_shard_layout(&m.t, g->seg, g->n_seg, err, sizeof err) == 0, "%s", err);
        for (int s = 0; s < g->n_seg; s++) {
            const Param *p = m.t.params[g->seg[s].param], *q = ref.t.params[g->seg[s].param];
            for (size_t k = g->seg[s].start; k < g->seg[s].start + g->seg[s].len; k++) {
                float a = dist_test_state_at(&m.t, PARAM_STATE_M, g->seg[s].param, k);
                float b = tensor_f32(&q->m)[k];
                CHILD_CHECK(fabsf(a - b) <= SHARDED_STEP_TOL * fmaxf(fabsf(b), 1e-3f), "%s m[%zu] %g vs %g",
                            p->name, k, a, b);
            }
        }
        dist_grads_free(g);
    }
    // Frozen parameters never move.
    const Param *fz = params_find(&m.t, "frozen.weight");
    for (size_t k = 0; k < fz->value.numel; k++) CHILD_CHECK(tensor_f32(&fz->value)[k] == 1.0f, "frozen moved");
    dist_test_model_free(&m);
    dist_test_model_free(&ref);
    return 0;
}

static void test_two_ranks_step_bit_exactly_like_one_process_on_the_mean_gradient(void **state) {
    int zero = 0;
    RankResult res[2];
    dist_test_run_ranks(g_dir, 2, OPEN_TCP, 20, 30, child_step, &zero, res);
    dist_test_assert_all_passed(2, res);
}

static void test_zero1_on_two_and_three_ranks_steps_like_one_process(void **state) {
    int zero = 1;
    RankResult res[3];
    dist_test_run_ranks(g_dir, 2, OPEN_TCP, 20, 30, child_step, &zero, res);
    dist_test_assert_all_passed(2, res);
    dist_test_run_ranks(g_dir, 3, OPEN_TCP, 20, 30, child_step, &zero, res);
    dist_test_assert_all_passed(3, res);
}

static void test_one_rank_step_dist_is_optimizer_step(void **state) {
    Dist d;
    dist_init_single(&d);
    DistTestModel m, ref;
    dist_test_model(&m);
    dist_test_model(&ref);
    float norms[DIST_TEST_STEPS], ref_norms[DIST_TEST_STEPS];
    dist_test_train(&d, &m, 1, norms);
    dist_test_reference(&ref, 1, ref_norms);
    assert_true(dist_test_same_bits(&m.t, m.t.values, ref.t.values));
    assert_true(dist_test_same_bits(&m.t, m.t.m, ref.t.m));
    assert_memory_equal(norms, ref_norms, sizeof norms);
    dist_test_model_free(&m);
    dist_test_model_free(&ref);
}

// ---- checkpoint shards -------------------------------------------------------------------------------

static int child_write_shards(Dist *d, void *arg) {
    const char *dir = arg;
    DistTestModel m;
    dist_test_model(&m);
    dist_test_fill_moments(&m.t);
    DistGrads *g = dist_grads_create(d, &m.t, &m.ctx, 1, DIST_TEST_BUCKET_MB);
    char err[1024];
    if (d->rank == 0) mkdir(dir, 0755);
    dist_barrier(d, "folder made");
    int ok = dist_ckpt_write_shard_err(g, dir, err, sizeof err) == 0;
    if (!ok) fprintf(stderr, "%s\n", err);
    CHILD_CHECK(dist_ckpt_commit_err(d, dir, ok, err, sizeof err) == 0, "%s", err);
    int world = 0;
    CHILD_CHECK(dist_ckpt_shards_complete(dir, &world) && world == d->world, "marker");
    dist_grads_free(g);
    dist_test_model_free(&m);
    return 0;
}

static int child_read_shards(Dist *d, void *arg) {
    const char *dir = arg;
    DistTestModel m;
    dist_test_model(&m);
    DistGrads *g = dist_grads_create(d, &m.t, &m.ctx, 1, DIST_TEST_BUCKET_MB * 3);
    char err[1024];
    CHILD_CHECK(dist_ckpt_read_shard_err(g, dir, err, sizeof err) == 0, "%s", err);
    CHILD_CHECK(dist_test_check_moments(&m.t, g->seg, g->n_seg, err, sizeof err) == 0, "%s", err);
    dist_grads_free(g);
    dist_test_model_free(&m);
    return 0;
}

static void test_sharded_optimizer_state_reshards_exactly_to_other_world_sizes(void **state) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/step_00000003", g_dir);
    RankResult res[3];
    dist_test_run_ranks(g_dir, 2, OPEN_TCP, 20, 30, child_write_shards, dir, res);
    dist_test_assert_all_passed(2, res);
    int world = 0;
    assert_int_equal(dist_ckpt_shards_complete(dir, &world), 1);
    assert_int_equal(world, 2);
    // Three ranks (and another bucket size) read what two wrote.
    dist_test_run_ranks(g_dir, 3, OPEN_TCP, 20, 30, child_read_shards, dir, res);
    dist_test_assert_all_passed(3, res);
    // One process, zero = 0: every parameter's moments.
    Dist d;
    dist_init_single(&d);
    DistTestModel m;
    dist_test_model(&m);
    DistGrads *g = dist_grads_create(&d, &m.t, &m.ctx, 1, DIST_TEST_BUCKET_MB);
    char err[1024];
    assert_int_equal(dist_ckpt_read_shard_err(g, dir, err, sizeof err), 0);
    ParamSegment all[16];
    int n = 0;
    for (int i = 0; i < m.t.n; i++) all[n++] = (ParamSegment){i, 0, m.t.params[i]->value.numel, 0};
    if (dist_test_check_moments(&m.t, all, n, err, sizeof err) != 0) fail_msg("%s", err);
    // A missing shard: the checkpoint is not complete, and loading says so.
    char path[1024];
    dist_ckpt_shard_path(dir, 1, 2, path, sizeof path);
    assert_int_equal(unlink(path), 0);
    assert_int_equal(dist_ckpt_shards_complete(dir, NULL), 0);
    assert_int_equal(dist_ckpt_read_shard_err(g, dir, err, sizeof err), -1);
    assert_contains(err, "no complete set of optimizer shards");
    dist_grads_free(g);
    dist_test_model_free(&m);
}

// ---- faults ----------------------------------------------------------------------------------------

static int child_exit_early(Dist *d, void *arg) {
    if (d->rank == 1) _exit(3);   // dies without a word
    float x[256] = {0};
    dist_all_reduce_f32(d, x, 256, true, "the test all-reduce");
    return 0;
}

static void test_a_rank_that_exits_stops_the_others_with_its_rank_named(void **state) {
    RankResult res[2];
    dist_test_run_ranks(g_dir, 2, OPEN_TCP, 20, 30, child_exit_early, NULL, res);
    assert_int_equal(res[1].code, 3);
    assert_int_equal(res[0].code, 1);
    assert_contains(res[0].err, "rank 1 closed its connection");
    assert_true(res[0].seconds < 10);
}

static int child_hang(Dist *d, void *arg) {
    if (d->rank == 1) {   // hung in "compute": never reaches the collective
        sleep(60);
        return 0;
    }
    float x[256] = {0};
    dist_all_reduce_f32(d, x, 256, true, "the test all-reduce");
    return 0;
}

static void test_a_hung_rank_is_named_within_the_timeout_and_does_not_outlive_the_job(void **state) {
    const double timeout = 2;
    RankResult res[2];
    dist_test_run_ranks(g_dir, 2, OPEN_TCP, timeout, 30, child_hang, NULL, res);
    assert_int_equal(res[0].code, 1);
    assert_contains(res[0].err, "waited 2.0 s for rank 1");
    assert_contains(res[0].err, "hung or dead");
    assert_true(res[0].seconds >= timeout && res[0].seconds < timeout + 5);
    // The hung rank's watchdog sees rank 0 go and ends it too: no orphan.
    assert_int_equal(res[1].code, 1);
    assert_contains(res[1].err, "rank 0 closed its connection");
    assert_true(res[1].seconds < timeout + 5);
}

static int child_probe(Dist *d, void *arg) {
    if (d->rank == 2) {   // hung: answers nothing
        sleep(60);
        return 0;
    }
    // The live ranks stop their own watchdogs first: whichever finishes its probe first exits,
    // and the other's watchdog would take that closed connection for a crash (it did, under
    // load). A probe needs no watchdog: a rank is alive when its own probe arrives.
    dist_watchdog_stop(d);
    char late[256];
    dist_describe_late(d, 3.0, late, sizeof late);
    CHILD_CHECK(strstr(late, "rank(s) 2 did not answer") != NULL, "got: %s", late);
    _exit(0);   // no finalize: the hung rank's watchdog must notice and end it
}

static void test_a_probe_after_an_nccl_style_timeout_names_the_rank_that_never_answers(void **state) {
    RankResult res[3];
    dist_test_run_ranks(g_dir, 3, OPEN_TCP, 20, 30, child_probe, NULL, res);
    if (res[0].code || res[1].code)
        fail_msg("rank 0 exit %d:\n%s\nrank 1 exit %d:\n%s", res[0].code, res[0].err, res[1].code,
                 res[1].err);
    assert_int_equal(res[2].code, 1);
    assert_contains(res[2].err, "closed its connection");
    assert_true(res[2].seconds < 10);
}

int main(void) {
    // One thread: forked children must not inherit an OpenMP pool (libgomp is not fork-safe).
    omp_set_num_threads(1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dist_part_splits_ranges_into_aligned_parts_covering_everything),
        cmocka_unit_test(test_shards_of_all_ranks_cover_every_parameter_element_once),
        cmocka_unit_test_setup_teardown(test_three_forked_ranks_meet_through_the_rendezvous_folder, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_rank_and_world_size_from_the_environment_bootstrap_without_mpi, setup_dir, teardown_dir),
        cmocka_unit_test(test_env_launch_without_a_rendezvous_folder_says_which_key_to_set),
        cmocka_unit_test_setup_teardown(test_host_collectives_are_rank_order_sums_bit_identical_on_every_rank, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_two_ranks_step_bit_exactly_like_one_process_on_the_mean_gradient, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_zero1_on_two_and_three_ranks_steps_like_one_process, setup_dir, teardown_dir),
        cmocka_unit_test(test_one_rank_step_dist_is_optimizer_step),
        cmocka_unit_test_setup_teardown(test_sharded_optimizer_state_reshards_exactly_to_other_world_sizes, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_a_rank_that_exits_stops_the_others_with_its_rank_named, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_a_hung_rank_is_named_within_the_timeout_and_does_not_outlive_the_job, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_a_probe_after_an_nccl_style_timeout_names_the_rank_that_never_answers, setup_dir, teardown_dir),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
