// Data parallelism under mpirun (dist/ over MPI point-to-point). `make test` runs
//   mpirun --allow-run-as-root --oversubscribe -np 2 build/tests/test_dist_mpi
// Proves the MPI bootstrap (ranks, local ranks from the host-name exchange), the host
// collectives (rank-order sums: the expected bits, the same on every rank and every run), a
// 2-rank optimizer step equal to the one-process step on the mean gradient (zero = 0 bit-exact,
// zero = 1 to fp32 round-off) with the same global gradient norm, zero = 1 moment buffers of the
// rank's shard size, and sharded checkpoint state written by 2 ranks read back by 2 and by 1.
//
// With --fault=hang or --fault=exit it is instead the fault scenario of tests/test_dist_fault.sh:
// rank 1 hangs in "compute" (or exits) while rank 0 waits in an all-reduce with
// dist_timeout_s = 3; rank 0 must stop the job naming rank 1. --fault=probe: rank 1 hangs and
// rank 0 runs the liveness probe a timed-out NCCL wait runs, which must name rank 1.
#include "testlib_dist.h"
#include <omp.h>
#include <sys/stat.h>
#include <unistd.h>

// See tests/test_dist.c for why these values.
#define SHARDED_STEP_TOL 1e-5
#define NORM_TOL 1e-6
#define FAULT_TIMEOUT_S 3.0

static Dist g_dist;
static char g_dir[256];   // shared by the ranks (rank 0 makes it, then broadcasts the name)

// An assertion failing on one rank leaves the other waiting in the next collective until its
// deadline; the message then names the failed rank, and this rank's own failure is printed.
static void test_mpi_bootstrap_gives_ranks_and_local_ranks_from_host_names(void **state) {
    Dist *d = &g_dist;
    assert_int_equal(d->backend, DIST_MPI);
    assert_int_equal(d->world, 2);
    int all[2];
    dist_all_gather_bytes(d, &d->rank, all, sizeof(int), "the rank check");
    assert_int_equal(all[0], 0);
    assert_int_equal(all[1], 1);
    // One host here: local ranks equal ranks.
    assert_int_equal(d->local_world, 2);
    assert_int_equal(d->local_rank, d->rank);
}

static void fill_rank(float *x, size_t n, int rank, int round) {
    uint64_t s = 977ull * (uint64_t)(rank + 1) + (uint64_t)round;
    for (size_t i = 0; i < n; i++)
        x[i] = (float)((double)(test_rng_next(&s) >> 40) / 16777216.0 * 2.0 - 1.0) * (1.0f + (float)(i % 7));
}

static void test_mpi_collectives_are_rank_order_sums_bit_identical_across_runs(void **state) {
    Dist *d = &g_dist;
    const size_t sizes[] = {1, 129, 64 * 2 * 5 + 3, 100000};
    for (size_t c = 0; c < sizeof sizes / sizeof sizes[0]; c++) {
        const size_t n = sizes[c];
        float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
        float *want = malloc(n * sizeof(float)), *other = malloc(n * sizeof(float));
        fill_rank(want, n, 0, (int)c);
        fill_rank(other, n, 1, (int)c);
        for (size_t i = 0; i < n; i++) want[i] = (want[i] + other[i]) / 2.0f;
        fill_rank(x, n, d->rank, (int)c);
        dist_all_reduce_f32(d, x, n, true, "test all-reduce");
        assert_memory_equal(x, want, n * sizeof(float));
        fill_rank(y, n, d->rank, (int)c);
        dist_all_reduce_f32(d, y, n, true, "test all-reduce, again");
        assert_memory_equal(x, y, n * sizeof(float));
        // reduce-scatter then all-gather
        fill_rank(x, n, d->rank, (int)c);
        dist_reduce_scatter_f32(d, x, n, true, "test reduce-scatter");
        size_t lo, hi;
        dist_part(n, d->world, d->rank, &lo, &hi);
        assert_memory_equal(x + lo, want + lo, (hi - lo) * sizeof(float));
        dist_all_gather_parts(d, x, n, sizeof(float), "test all-gather");
        assert_memory_equal(x, want, n * sizeof(float));
        free(x);
        free(y);
        free(want);
        free(other);
    }
    assert_true(dist_sum_f64(d, d->rank ? 0.25 : 0.5, "test sum") == 0.75);
    assert_int_equal(dist_first_failed(d, d->rank == 0, "test ok"), 1);
}

static void step_matches_one_process(int zero) {
    Dist *d = &g_dist;
    DistTestModel m, ref;
    dist_test_model(&m);
    dist_test_model(&ref);
    float norms[DIST_TEST_STEPS], ref_norms[DIST_TEST_STEPS];
    dist_test_train(d, &m, zero, norms);
    dist_test_reference(&ref, d->world, ref_norms);
    for (int s = 0; s < DIST_TEST_STEPS; s++) {
        if (!zero) assert_true(norms[s] == ref_norms[s]);
        assert_true(fabs(norms[s] - ref_norms[s]) <= NORM_TOL * ref_norms[s]);
    }
    if (!zero) {
        assert_true(dist_test_same_bits(&m.t, m.t.values, ref.t.values));
        assert_true(dist_test_same_bits(&m.t, m.t.m, ref.t.m));
        assert_true(dist_test_same_bits(&m.t, m.t.v, ref.t.v));
    } else {
        double e = dist_test_max_rel(&m.t, m.t.values, ref.t.values);
        if (e > SHARDED_STEP_TOL) fail_msg("values differ from one process by %.3g", e);
    }
    // Both ranks hold the same weights.
    float *other = malloc(m.t.total * sizeof(float));
    memcpy(other, m.t.values, m.t.total * sizeof(float));
    dist_broadcast(d, other, m.t.total * sizeof(float), 0, "rank 0's weights");
    assert_true(dist_test_same_bits(&m.t, m.t.values, other));
    free(other);
    dist_test_model_free(&m);
    dist_test_model_free(&ref);
}

static void test_two_rank_step_equals_one_process_step_on_the_mean_gradient(void **state) {
    step_matches_one_process(0);
}

static void test_two_rank_zero1_step_equals_one_process_step_to_round_off(void **state) {
    step_matches_one_process(1);
}

// ZeRO-1 saves memory: each rank's moment buffers (and masters, in bf16 tables: the GPU test)
// hold its shard only, the pieces back to back with PARAM_ALIGN padding, and the two shards
// together cover every parameter element once: about half of the whole-table buffers each.
static void test_zero1_moment_buffers_hold_only_the_ranks_shard(void **state) {
    Dist *d = &g_dist;
    DistTestModel m;
    dist_test_model(&m);
    const size_t whole = m.t.total, elems = params_count(&m.t, false);
    assert_int_equal(m.t.state_total, whole);   // params_alloc: the whole layout
    DistGrads *g = dist_grads_create(d, &m.t, &m.ctx, 1, DIST_TEST_BUCKET_MB);
    char err[256];
    if (dist_test_check_shard_layout(&m.t, g->seg, g->n_seg, err, sizeof err) != 0) fail_msg("%s", err);
    size_t mine = 0;
    for (int s = 0; s < g->n_seg; s++) mine += g->seg[s].len;
    assert_int_equal(mine, g->shard_elems);
    const double both = dist_sum_f64(d, (double)mine, "the shard sizes");
    assert_true(both == (double)elems);   // every element in exactly one shard (test_dist.c: once)
    assert_true(m.t.state_total < mine + (size_t)g->n_seg * PARAM_ALIGN);
    assert_true(m.t.state_total < whole / 2 + (size_t)g->n_seg * PARAM_ALIGN);
    printf("    rank %d: moments of %zu elements (shard %zu in %d pieces), whole table %zu\n", d->rank,
           m.t.state_total, mine, g->n_seg, whole);
    // A second DistGrads of the same layout reuses the table's shard as it is.
    DistGrads *again = dist_grads_create(d, &m.t, &m.ctx, 1, DIST_TEST_BUCKET_MB);
    assert_ptr_equal(again->seg, g->seg);
    dist_grads_free(again);
    dist_grads_free(g);
    dist_test_model_free(&m);
}

static void test_sharded_state_written_by_two_ranks_reads_back_on_two_and_on_one(void **state) {
    Dist *d = &g_dist;
    char dir[512];
    snprintf(dir, sizeof dir, "%s/step_00000001", g_dir);
    if (d->rank == 0) assert_int_equal(mkdir(dir, 0755), 0);
    dist_barrier(d, "folder made");
    DistTestModel m;
    dist_test_model(&m);
    dist_test_fill_moments(&m.t);
    DistGrads *g = dist_grads_create(d, &m.t, &m.ctx, 1, DIST_TEST_BUCKET_MB);
    char err[1024];
    int ok = dist_ckpt_write_shard_err(g, dir, err, sizeof err) == 0;
    if (!ok) print_error("%s\n", err);
    assert_int_equal(dist_ckpt_commit_err(d, dir, ok, err, sizeof err), 0);
    int world = 0;
    assert_int_equal(dist_ckpt_shards_complete(dir, &world), 1);
    assert_int_equal(world, 2);
    params_zero_moments(&m.t, &m.ctx);
    assert_int_equal(dist_ckpt_read_shard_err(g, dir, err, sizeof err), 0);
    assert_int_equal(dist_test_check_moments(&m.t, g->seg, g->n_seg, err, sizeof err), 0);
    dist_grads_free(g);
    dist_test_model_free(&m);
    // A world of one (on each rank by itself, a table of its own): every parameter.
    Dist single;
    dist_init_single(&single);
    dist_test_model(&m);
    g = dist_grads_create(&single, &m.t, &m.ctx, 1, DIST_TEST_BUCKET_MB);
    assert_null(m.t.shard);   // a world of one keeps the whole state
    if (dist_ckpt_read_shard_err(g, dir, err, sizeof err) != 0) fail_msg("%s", err);
    ParamSegment all[16];
    int n = 0;
    for (int i = 0; i < m.t.n; i++) all[n++] = (ParamSegment){i, 0, m.t.params[i]->value.numel, 0};
    if (dist_test_check_moments(&m.t, all, n, err, sizeof err) != 0) fail_msg("%s", err);
    dist_grads_free(g);
    dist_test_model_free(&m);
    dist_barrier(d, "shard test done");
}

// ---- the fault scenario (tests/test_dist_fault.sh) --------------------------------------------------

static int run_fault(Dist *d, const char *mode) {
    d->timeout_s = FAULT_TIMEOUT_S;
    dist_barrier(d, "the start of the fault test");
    if (d->rank == 1) {
        if (strcmp(mode, "exit") == 0) _exit(3);   // dies without MPI_Finalize
        sleep(120);                                 // hung in "compute"
        return 0;
    }
    if (strcmp(mode, "probe") == 0) {   // what a timed-out NCCL wait does to name the rank
        char late[256];
        dist_describe_late(d, 1.0, late, sizeof late);
        dist_fail(d, "", "the fault test's probe: %s", late);
    }
    float x[1024] = {0};
    dist_all_reduce_f32(d, x, 1024, true, "the fault test's all-reduce");
    fprintf(stderr, "rank 0: the all-reduce returned although rank 1 never joined\n");
    return 1;
}

int main(int argc, char **argv) {
    omp_set_num_threads(1);   // two ranks share the cores of a CI machine
    char err[1024];
    if (dist_init_err(&g_dist, &argc, &argv, err, sizeof err) != 0) {
        fprintf(stderr, "test_dist_mpi: %s\n", err);
        return 1;
    }
    if (g_dist.world != 2) {
        fprintf(stderr, "test_dist_mpi: run it under mpirun -np 2 (world is %d)\n", g_dist.world);
        dist_finalize(&g_dist);
        return 1;
    }
    if (argc > 1 && strncmp(argv[1], "--fault=", 8) == 0) return run_fault(&g_dist, argv[1] + 8);

    // Rank 0 makes the shared folder; rank 1's report goes to a file, shown when it fails.
    if (g_dist.rank == 0 && test_make_temp_dir(g_dir, sizeof g_dir, "dist_mpi") != 0) {
        fprintf(stderr, "test_dist_mpi: cannot make a temporary folder\n");
        return 1;
    }
    dist_broadcast(&g_dist, g_dir, sizeof g_dir, 0, "the test folder");
    char log[300];
    snprintf(log, sizeof log, "%s/rank1.log", g_dir);
    if (g_dist.rank == 1 && !freopen(log, "w", stdout)) return 1;

    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mpi_bootstrap_gives_ranks_and_local_ranks_from_host_names),
        cmocka_unit_test(test_mpi_collectives_are_rank_order_sums_bit_identical_across_runs),
        cmocka_unit_test(test_two_rank_step_equals_one_process_step_on_the_mean_gradient),
        cmocka_unit_test(test_two_rank_zero1_step_equals_one_process_step_to_round_off),
        cmocka_unit_test(test_zero1_moment_buffers_hold_only_the_ranks_shard),
        cmocka_unit_test(test_sharded_state_written_by_two_ranks_reads_back_on_two_and_on_one),
    };
    int failed = cmocka_run_group_tests_name(g_dist.rank ? "dist_mpi (rank 1)" : "dist_mpi (rank 0)",
                                             tests, NULL, NULL);
    int all_failed = (int)dist_sum_f64(&g_dist, failed, "the test results");
    if (g_dist.rank == 1 && failed) {   // show rank 1's report
        fflush(stdout);
        FILE *f = fopen(log, "r");
        char line[512];
        while (f && fgets(line, sizeof line, f)) fputs(line, stderr);
        if (f) fclose(f);
    }
    dist_finalize(&g_dist);
    if (g_dist.rank == 0) {
        if (all_failed) printf("test_dist_mpi: %d test(s) failed across the ranks\n", all_failed);
        test_remove_dir(g_dir);
    }
    return failed ? 1 : 0;
}
