// `cgspn bench ops --op=NAME --case=TEXT` (bench/bench.c, bench/bench_ops.c), the real binary on
// any machine: a title that no case of the op holds is refused by name with exit status 2 before
// a GPU is looked for, and an empty TEXT or an argument past it with the usage hint.
#include "testlib.h"

static char g_dir[256];
static int setup(void **state) { return test_make_temp_dir(g_dir, sizeof g_dir, "bench_ops"); }
static int teardown(void **state) { return test_remove_dir(g_dir); }

// ./cgspn bench ops with `args`; its output in *out (free it); returns the exit status.
static int run_bench_ops(char **out, const char *args) {
    if (access("./cgspn", X_OK) != 0) fail_msg("./cgspn is not built (make test builds it first)");
    char log[400], cmd[600];
    snprintf(log, sizeof log, "%s/bench_ops.log", g_dir);
    snprintf(cmd, sizeof cmd, "./cgspn bench ops %s", args);
    const int status = test_run_logged(cmd, log);
    *out = test_read_text(log);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static void test_a_title_no_case_holds_is_refused_by_name(void **state) {
    char *out;
    assert_int_equal(run_bench_ops(&out, "--op=conv2d_fwd --case=no-such-title"), 2);
    assert_contains(out, "no case runs op 'conv2d_fwd' with 'no-such-title' in its title");
    free(out);
    assert_int_equal(run_bench_ops(&out, "--op=no_such_op"), 2);   // without --case, as before
    assert_contains(out, "no case runs op 'no_such_op' (the names");
    free(out);
}

static void test_an_empty_title_or_an_extra_argument_gets_the_usage(void **state) {
    char *out;
    assert_int_equal(run_bench_ops(&out, "--op=conv2d_fwd --case="), 1);
    assert_contains(out, "unexpected argument '--case='");
    assert_contains(out, "cgspn bench ops --op=NAME [--case=TEXT]");
    free(out);
    assert_int_equal(run_bench_ops(&out, "--op=conv2d_fwd '--case=no kept columns' extra"), 1);
    assert_contains(out, "unexpected argument 'extra'");
    free(out);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_a_title_no_case_holds_is_refused_by_name, setup, teardown),
        cmocka_unit_test_setup_teardown(test_an_empty_title_or_an_extra_argument_gets_the_usage, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
