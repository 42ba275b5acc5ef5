// The options of `cgspn bench ops --op=NAME --case=TEXT` (bench/bench.c, bench/bench_ops.c) and
// `cgspn bench classify --only=LABEL --config=LABEL:PATH` (bench/bench_model.c), the real binary on
// any machine, before a GPU is looked for: a title that no case of the op holds is refused by name
// with exit status 2, an empty TEXT or an argument past it with the usage hint; a label that names
// no model, a config that is not LABEL:PATH or not a file or of a model --only leaves out, and an
// unknown option, each by name.
#include "testlib.h"

static char g_dir[256];
static int setup(void **state) { return test_make_temp_dir(g_dir, sizeof g_dir, "bench_ops"); }
static int teardown(void **state) { return test_remove_dir(g_dir); }

// ./cgspn bench with `args`; its output in *out (free it); returns the exit status.
static int run_bench(char **out, const char *args) {
    if (access("./cgspn", X_OK) != 0) fail_msg("./cgspn is not built (make test builds it first)");
    char log[400], cmd[600];
    snprintf(log, sizeof log, "%s/bench.log", g_dir);
    snprintf(cmd, sizeof cmd, "./cgspn bench %s", args);
    const int status = test_run_logged(cmd, log);
    *out = test_read_text(log);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// ./cgspn bench `args` exits with `status`, its output holding each of the n texts.
static void assert_refused(const char *args, int status, int n, const char *const *texts) {
    char *out;
    assert_int_equal(run_bench(&out, args), status);
    for (int i = 0; i < n; i++) assert_contains(out, texts[i]);
    free(out);
}
#define REFUSED(args, status, ...) \
    assert_refused(args, status, (int)(sizeof((const char *[]){__VA_ARGS__}) / sizeof(const char *)), \
                   (const char *[]){__VA_ARGS__})

static void test_a_title_no_case_holds_is_refused_by_name(void **state) {
    REFUSED("ops --op=conv2d_fwd --case=no-such-title", 2,
            "no case runs op 'conv2d_fwd' with 'no-such-title' in its title");
    REFUSED("ops --op=no_such_op", 2, "no case runs op 'no_such_op' (the names");   // without --case
}

static void test_an_empty_title_or_an_extra_argument_gets_the_usage(void **state) {
    REFUSED("ops --op=conv2d_fwd --case=", 1, "unexpected argument '--case='",
            "cgspn bench ops --op=NAME [--case=TEXT]");
    REFUSED("ops --op=conv2d_fwd '--case=no kept columns' extra", 1, "unexpected argument 'extra'");
}

static void test_classify_options_are_refused_by_name(void **state) {
    REFUSED("classify --only=gspn_x", 1, "--only names no model 'gspn_x'",
            "the models are gspn_t, gspn_s and gspn_b");
    REFUSED("classify --config=gspn_b", 1, "--config=gspn_b is not LABEL:PATH");
    REFUSED("classify --config=gspn_q:configs/gspn_b.cfg", 1, "--config names no model 'gspn_q'");
    REFUSED("classify --config=gspn_b:no/such.cfg", 1, "cannot open no/such.cfg");
    REFUSED("classify --only=gspn_t --config=gspn_b:configs/gspn_b.cfg", 1,
            "--config reads gspn_b, which --only=gspn_t leaves out");
    REFUSED("classify --only=gspn_b --fast", 1, "unexpected argument '--fast'",
            "cgspn bench classify [--only=LABEL] [--config=LABEL:PATH]");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_a_title_no_case_holds_is_refused_by_name, setup, teardown),
        cmocka_unit_test_setup_teardown(test_an_empty_title_or_an_extra_argument_gets_the_usage, setup, teardown),
        cmocka_unit_test_setup_teardown(test_classify_options_are_refused_by_name, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
