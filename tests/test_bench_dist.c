// `cgspn bench distill` on the CPU (bench/bench_dist.c, bench/bench_max_batch.c): the largest-
// batch search against probes with a known limit (doubling, bisection to within an eighth, the
// cap, a failure that is not an out-of-memory); then the real binary, forked, with a tiny C-GSPN
// student and ViT teacher: --memory=1 prints a row per grad_checkpoint beside PyTorch's numbers
// from a JSON written here, --max-batch forks a probe per candidate and reaches the cap, a
// probe's error ends its search with exit status 1, and a launch of several ranks is refused.
#include "testlib.h"
#include "../bench/bench_max_batch.h"
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

static char g_dir[256];
static int setup(void **state) { return test_make_temp_dir(g_dir, sizeof g_dir, "bench_dist"); }
static int teardown(void **state) { return test_remove_dir(g_dir); }

// ---- the search, against a fake GPU that fits batches up to a limit ----------------------------

typedef struct FakeGpu {
    int limit;        // the largest batch that fits
    int fail_at;      // a batch at or above this fails without an out-of-memory (0: never)
    int probes;
} FakeGpu;

static ProbeOutcome fake_probe(void *arg, int batch, ProbeResult *r) {
    FakeGpu *g = arg;
    g->probes++;
    assert_true(batch >= 1);
    if (g->fail_at && batch >= g->fail_at) return PROBE_FAILED;
    if (batch > g->limit) return PROBE_OUT_OF_MEMORY;
    *r = (ProbeResult){.img_per_s = 10.0 * batch, .gpu_gib = 0.5 * batch, .loss = 1.0f};
    return PROBE_FITS;
}

static void test_max_batch_search_brackets_every_limit_within_an_eighth(void **state) {
    for (int limit = 0; limit <= 600; limit++) {
        FakeGpu g = {.limit = limit};
        MaxBatch m = max_batch_search(MAX_BATCH_START, MAX_BATCH_CAP, fake_probe, &g);
        const int tol = m.batch / 8 > 1 ? m.batch / 8 : 1;
        if (!(m.batch <= limit && limit < m.no_fit && m.no_fit - m.batch <= tol))
            fail_msg("limit %d: found %d, no fit at %d (tolerance %d)", limit, m.batch, m.no_fit, tol);
        assert_false(m.capped);
        assert_false(m.failed);
        assert_int_equal(m.probes, g.probes);
        if (m.batch > 0) assert_true(m.at.img_per_s == 10.0 * m.batch);   // measured at m.batch
        assert_true(m.probes <= 16);   // doubling to 1024 and bisection: a few probes
    }
    FakeGpu g = {.limit = 20};   // 8, 16, 32 no, 24 no, 20, 22 no: within 20 / 8
    MaxBatch m = max_batch_search(MAX_BATCH_START, MAX_BATCH_CAP, fake_probe, &g);
    assert_int_equal(m.batch, 20);
    assert_int_equal(m.no_fit, 22);
    assert_int_equal(m.probes, 6);
}

static void test_max_batch_search_stops_at_the_cap_when_it_fits(void **state) {
    FakeGpu g = {.limit = 100};
    MaxBatch m = max_batch_search(MAX_BATCH_START, 64, fake_probe, &g);   // 8, 16, 32, 64
    assert_int_equal(m.batch, 64);
    assert_true(m.capped);
    assert_int_equal(m.no_fit, 0);
    assert_int_equal(m.probes, 4);
    FakeGpu h = {.limit = 100};
    m = max_batch_search(MAX_BATCH_START, 5, fake_probe, &h);   // a cap below the start: 5 alone
    assert_int_equal(m.batch, 5);
    assert_true(m.capped);
    assert_int_equal(m.probes, 1);
}

static void test_max_batch_search_ends_at_a_failure_that_is_not_out_of_memory(void **state) {
    FakeGpu g = {.limit = 1000, .fail_at = 30};   // 8, 16 fit; 32 fails
    MaxBatch m = max_batch_search(MAX_BATCH_START, MAX_BATCH_CAP, fake_probe, &g);
    assert_true(m.failed);
    assert_int_equal(m.batch, 16);
    assert_int_equal(m.no_fit, 32);
    assert_int_equal(m.probes, 3);
}

// ---- the binary -----------------------------------------------------------------------------------

// PyTorch's numbers for the tiny pair at 28 px, as bench/bench_timm.py would write them.
static const char *write_timm_json(void) {
    static char path[300];
    snprintf(path, sizeof path, "%s/bench_timm.json", g_dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("{\n \"date\": \"2026-01-01\",\n \"device\": \"cpu\",\n"
          " \"distill/28/eager/batch\": 4,\n \"distill/28/eager/img_per_s\": 100.0,\n"
          " \"distill/28/eager/peak_reserved_gib\": 2.0,\n"
          " \"distill/28/eager_ckpt/batch\": 4,\n \"distill/28/eager_ckpt/img_per_s\": 80.0,\n"
          " \"distill/28/eager_ckpt/peak_reserved_gib\": 1.0,\n"
          " \"distill/28/eager/max_batch\": 6,\n \"distill/28/eager/max_batch_capped\": 0,\n"
          " \"distill/28/eager/max_batch_img_per_s\": 90.0,\n"
          " \"distill/28/eager_ckpt/max_batch\": 8,\n \"distill/28/eager_ckpt/max_batch_capped\": 1,\n"
          " \"distill/28/eager_ckpt/max_batch_img_per_s\": 70.0,\n"
          " \"timm\": \"1.0\",\n \"torch\": \"2.0\"\n}\n", f);
    assert_int_equal(fclose(f), 0);
    return path;
}

// ./cgspn bench distill with the tiny CPU pair and `extra` (NULL-terminated); its stdout and
// stderr in *out (free it); returns the exit status (-1: killed by a signal).
static int run_bench(char **out, const char *const *extra, const char *const *env) {
    if (access("./cgspn", X_OK) != 0) fail_msg("./cgspn is not built (make test builds it first)");
    char log[400];
    snprintf(log, sizeof log, "%s/bench.log", g_dir);
    const char *argv[32] = {"cgspn", "bench", "distill", "configs/cgspn_tiny.cfg",
                            "--teacher_config=configs/vit_tiny.cfg", "--device=cpu",
                            "--batch_size=4", "--taps=all", "--steps=1", "--warmup=0"};
    int n = 10;
    for (int i = 0; extra[i]; i++) argv[n++] = extra[i];
    argv[n] = NULL;
    fflush(stdout);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int f = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (f < 0 || dup2(f, 1) < 0 || dup2(f, 2) < 0) _exit(126);
        setenv("CGSPN_BENCH_TIMM_JSON", write_timm_json(), 1);
        for (int i = 0; env && env[i]; i += 2) setenv(env[i], env[i + 1], 1);
        execv("./cgspn", (char *const *)argv);
        _exit(127);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    *out = test_read_text(log);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static void test_bench_distill_memory_prints_both_grad_checkpoint_rows_beside_pytorch(void **state) {
    char *out;
    int rc = run_bench(&out, (const char *const[]){"--memory=1", NULL}, NULL);
    if (rc != 0) fail_msg("exit %d:\n%s", rc, out);
    assert_contains(out, "| GPUs | grad_checkpoint | global batch |");
    assert_contains(out, "| 1 | 0 | 4 |");   // 1 GPU, grad_checkpoint 0, batch 4
    assert_contains(out, "| 1 | 1 | 4 |");
    assert_contains(out, "| grad_checkpoint | batch | img/s | GPU GiB (peak) | PyTorch |");
    assert_contains(out, "| eager | 4 | 100.0 | 2.00 |");
    assert_contains(out, "| eager_ckpt | 4 | 80.0 | 1.00 |");
    assert_contains(out, "| compiled_ckpt | 0 | 0.0 | 0.00 | 0.00x | 0.00x |");   // not in the JSON
    free(out);
}

static void test_bench_distill_max_batch_forks_a_probe_per_batch_and_reaches_the_cap(void **state) {
    char *out;
    int rc = run_bench(&out, (const char *const[]){"--max-batch", "--sizes=28",
                                                   "--max-batch-cap=8", NULL}, NULL);
    if (rc != 0) fail_msg("exit %d:\n%s", rc, out);
    assert_contains(out, "28 px, grad_checkpoint 0, batch 8: fits");
    assert_contains(out, "28 px, grad_checkpoint 1, batch 8: fits");
    assert_contains(out, "| px | grad_checkpoint | max batch | no fit at | img/s | GPU GiB (peak) |");
    assert_contains(out, "| 28 | 0 | 8+ | - |");   // the cap fitted
    assert_contains(out, "| 28 | 1 | 8+ | - |");
    assert_contains(out, "| eager | 6 | 90.0 |");   // PyTorch's, from the JSON
    assert_contains(out, "| eager_ckpt | 8+ | 70.0 |");
    assert_contains(out, "2 probes in");
    free(out);
}

static void test_bench_distill_max_batch_reports_a_probe_that_fails_and_exits_1(void **state) {
    char *out;   // 30 px is no multiple of the patch (7): every probe fails at the config
    int rc = run_bench(&out, (const char *const[]){"--max-batch", "--sizes=30",
                                                   "--max-batch-cap=8", NULL}, NULL);
    assert_int_equal(rc, 1);
    assert_contains(out, "| 30 | 0 | 0 | failed at 8 |");
    assert_contains(out, "a probe failed without running out of memory");
    assert_contains(out, "not a multiple");
    free(out);
}

static void test_bench_distill_max_batch_refuses_a_launch_of_several_ranks(void **state) {
    char *out;
    int rc = run_bench(&out, (const char *const[]){"--max-batch", NULL},
                       (const char *const[]){"RANK", "0", "WORLD_SIZE", "2", NULL});
    assert_int_not_equal(rc, 0);
    assert_contains(out, "runs in one process on one GPU");
    free(out);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_max_batch_search_brackets_every_limit_within_an_eighth),
        cmocka_unit_test(test_max_batch_search_stops_at_the_cap_when_it_fits),
        cmocka_unit_test(test_max_batch_search_ends_at_a_failure_that_is_not_out_of_memory),
        cmocka_unit_test_setup_teardown(test_bench_distill_memory_prints_both_grad_checkpoint_rows_beside_pytorch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bench_distill_max_batch_forks_a_probe_per_batch_and_reaches_the_cap, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bench_distill_max_batch_reports_a_probe_that_fails_and_exits_1, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bench_distill_max_batch_refuses_a_launch_of_several_ranks, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
