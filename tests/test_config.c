// Config files, includes, overrides, error messages, print -> load round trip.
// Not testlib.h: its test_free() collides with cmocka.h's test_free macro (cmocka 1.1).
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include "testlib.h"
#include <float.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "../train/config.h"

static char g_dir[256];   // a fresh temp folder per test

static int setup_dir(void **state) { return test_make_temp_dir(g_dir, sizeof g_dir, "config"); }
static int teardown_dir(void **state) { return test_remove_dir(g_dir); }

// Writes text to g_dir/name (name may hold one subfolder, created); returns the full path.
static const char *write_cfg(const char *name, const char *text) {
    static char paths[8][512];
    static int next;
    char *p = paths[next++ % 8];
    snprintf(p, 512, "%s/%s", g_dir, name);
    char *slash = strrchr(p, '/');
    *slash = '\0';
    mkdir(p, 0700);
    *slash = '/';
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
    return p;
}

static int load(Config *c, const char *path, char *err) {
    config_defaults(c);
    err[0] = '\0';
    return config_load_file_err(c, path, err, 1024);
}

// Every field equal: ints, floats and bools bit for bit, strings by strcmp.
#define SAME_int(a, b, name)    assert_memory_equal(&(a)->name, &(b)->name, sizeof (a)->name);
#define SAME_float(a, b, name)  assert_memory_equal(&(a)->name, &(b)->name, sizeof (a)->name);
#define SAME_bool(a, b, name)   assert_memory_equal(&(a)->name, &(b)->name, sizeof (a)->name);
#define SAME_string(a, b, name) assert_string_equal((a)->name, (b)->name);
static void assert_same_config(const Config *a, const Config *b) {
#define X(type, name, def, help) SAME_##type(a, b, name)
#include "../train/config_keys.h"
#undef X
}

static void test_config_defaults_match_the_key_table_and_validate(void **state) {
    Config c;
    config_defaults(&c);
    assert_string_equal(c.model, "vit");
    assert_int_equal(c.img_size, 28);
    assert_int_equal(c.mlp_hidden, 128);
    assert_true(c.ln_eps == 1e-6f);
    assert_true(c.class_token);
    assert_true(c.lr == 1e-3f);
    assert_true(c.adam_eps == 1e-8f);
    assert_string_equal(c.data_shards, "data/shards/fmnist");
    assert_string_equal(c.on_nonfinite, "stop");
    assert_string_equal(c.run_name, "");
    char err[1024];
    assert_int_equal(config_validate_err(&c, err, sizeof err), 0);   // also checks the tables
}

static void test_config_file_with_comments_includes_and_quotes_parses(void **state) {
    write_cfg("common/base.cfg",
              "# shared settings\n"
              "lr = 0.5\n"
              "width = 32\n"
              "include = ../more.cfg   # relative to common/, so g_dir/more.cfg\n");
    write_cfg("more.cfg", "depth=7\nheads = 2\n");
    const char *main_cfg = write_cfg("main.cfg",
              "\xEF\xBB\xBF# a run config\n"
              "\n"
              "   # indented comment\n"
              "include = common/base.cfg\n"
              "width = 96          # overrides the included 32\n"
              "gelu = tanh\r\n"
              "run_name = \"a # b \\\"q\\\" \"   # quoted: '#' and edge spaces kept\n"
              "out_dir = /tmp/x y\n"
              "class_token = false\n"
              "global_pool = avg\n"
              "layer_scale_init = 1e-5\n"
              "seed = -3\n"
              "max_steps = +12\n");
    Config c;
    char err[1024];
    int rc = load(&c, main_cfg, err);
    if (rc) fail_msg("%s", err);
    assert_true(c.lr == 0.5f);
    assert_int_equal(c.width, 96);
    assert_int_equal(c.depth, 7);
    assert_int_equal(c.heads, 2);
    assert_string_equal(c.gelu, "tanh");
    assert_string_equal(c.run_name, "a # b \"q\" ");
    assert_string_equal(c.out_dir, "/tmp/x y");
    assert_false(c.class_token);
    assert_string_equal(c.global_pool, "avg");
    assert_true(c.layer_scale_init == 1e-5f);
    assert_int_equal(c.seed, -3);
    assert_int_equal(c.max_steps, 12);
    assert_int_equal(c.img_size, 28);   // untouched keys keep their defaults

    config_apply_override(&c, "--width=48");
    config_apply_override(&c, "run_name=");
    config_apply_override(&c, "--data_shards=/d/with # hash");   // command line: literal
    assert_int_equal(c.width, 48);
    assert_string_equal(c.run_name, "");
    assert_string_equal(c.data_shards, "/d/with # hash");
}

static void test_config_bools_take_0_1_true_false(void **state) {
    Config c;
    config_defaults(&c);
    const char *on[] = {"1", "true", "TRUE", "True"}, *off[] = {"0", "false", "False"};
    for (size_t i = 0; i < 4; i++) {
        char arg[64];
        c.class_token = false;
        snprintf(arg, sizeof arg, "--class_token=%s", on[i]);
        config_apply_override(&c, arg);
        assert_true(c.class_token);
    }
    for (size_t i = 0; i < 3; i++) {
        char arg[64];
        c.class_token = true;
        snprintf(arg, sizeof arg, "--class_token=%s", off[i]);
        config_apply_override(&c, arg);
        assert_false(c.class_token);
    }
}

static void test_config_parse_args_loads_file_first_then_overrides_and_leaves_other_args(void **state) {
    const char *path = write_cfg("run.cfg", "lr = 0.25\nepochs = 9\nclass_token = 0\n");
    char *argv[] = {"cgspn", "train", "--lr=0.125", (char *)path, "--help", "--class_token",
                    "extra", "-v", "--epochs=4", NULL};
    int argc = 9;
    Config c;
    config_defaults(&c);
    char err[1024];
    int k = config_parse_args_err(&c, argc, argv, 2, err, sizeof err);
    if (k < 0) fail_msg("%s", err);
    assert_true(c.lr == 0.125f);        // override given before the file still wins
    assert_int_equal(c.epochs, 4);
    assert_true(c.class_token);         // bare --bool_key sets it
    assert_int_equal(k, 3);
    assert_string_equal(argv[2], "--help");
    assert_string_equal(argv[3], "extra");
    assert_string_equal(argv[4], "-v");

    char *bad[] = {"cgspn", "--lr", NULL};
    config_defaults(&c);
    assert_int_equal(config_parse_args_err(&c, 2, bad, 1, err, sizeof err), -1);
    assert_contains(err, "'lr' needs a value");
    assert_contains(err, "--lr=VALUE");

    char *badchoice[] = {"cgspn", "--model=vitt", NULL};
    config_defaults(&c);
    assert_int_equal(config_parse_args_err(&c, 2, badchoice, 1, err, sizeof err), -1);
    assert_contains(err, "'model' is 'vitt'");
    assert_contains(err, "vit | cgspn | hybrid");

    char *nofile[] = {"cgspn", "nope.cfg", NULL};
    config_defaults(&c);
    assert_int_equal(config_parse_args_err(&c, 2, nofile, 1, err, sizeof err), -1);
    assert_contains(err, "nope.cfg");
}

// cpu_config: on a CPU the named file (next to the top-level config) is used instead of the
// recipe, then the command line; not on the GPU; never left in the resolved config.
static void test_cpu_config_swaps_in_the_cpu_file_only_on_the_cpu_and_the_command_line_wins(void **state) {
    write_cfg("sub/small.cfg", "width = 16\nepochs = 2\nlr = 0.5\n");
    write_cfg("sub/base.cfg", "width = 256\nepochs = 100\nlr = 0.25\ncpu_config = small.cfg\n");
    const char *top = write_cfg("sub/top.cfg", "include = base.cfg\ndepth = 7\n");
    char err[1024];
    Config c;

    char *on_cpu[] = {"cgspn", (char *)top, "--device=cpu", "--epochs=3", NULL};
    config_defaults(&c);
    if (config_parse_args_err(&c, 4, on_cpu, 1, err, sizeof err) < 0) fail_msg("%s", err);
    assert_int_equal(c.width, 16);     // the CPU file's
    assert_true(c.lr == 0.5f);
    assert_int_equal(c.epochs, 3);     // the command line's, over both files
    Config defaults;
    config_defaults(&defaults);
    assert_int_equal(c.depth, defaults.depth);   // nothing of the GPU recipe stays
    assert_string_equal(c.cpu_config, "");

    char *on_gpu[] = {"cgspn", (char *)top, "--device=cuda", NULL};
    config_defaults(&c);
    if (config_parse_args_err(&c, 3, on_gpu, 1, err, sizeof err) < 0) fail_msg("%s", err);
    assert_int_equal(c.width, 256);
    assert_int_equal(c.epochs, 100);
    assert_string_equal(c.cpu_config, "");

    write_cfg("sub/broken.cfg", "width = 256\ncpu_config = missing.cfg\n");
    char *missing[] = {"cgspn", (char *)write_cfg("sub/broken_top.cfg", "include = broken.cfg\n"),
                       "--device=cpu", NULL};
    config_defaults(&c);
    assert_int_equal(config_parse_args_err(&c, 3, missing, 1, err, sizeof err), -1);
    assert_contains(err, "missing.cfg");
    assert_contains(err, "cpu_config of");
}

static void test_config_unknown_key_names_file_line_and_closest_key(void **state) {
    const char *path = write_cfg("x.cfg", "# header\nwidth = 8\nlerning_rate = 0.1\n");
    Config c;
    char err[1024];
    assert_int_equal(load(&c, path, err), -1);
    assert_contains(err, "unknown config key 'lerning_rate'");
    assert_contains(err, "x.cfg:3");
    assert_contains(err, "did you mean 'lr'?");

    struct { const char *typo, *want; } cases[] = {
        {"learning_rate", "'lr'"}, {"btach_size", "'batch_size'"}, {"weight_decy", "'weight_decay'"},
        {"LR", "'lr'"}, {"batch-size", "'batch_size'"}, {"warmup", "'warmup_steps'"},
        {"mlp_hiden", "'mlp_hidden'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char arg[64];
        snprintf(arg, sizeof arg, "--%s=1", cases[i].typo);
        config_defaults(&c);
        assert_int_equal(config_apply_override_err(&c, arg, err, sizeof err), -1);
        assert_contains(err, "command line");
        assert_contains(err, cases[i].typo);
        assert_contains(err, cases[i].want);
    }
    config_defaults(&c);
    assert_int_equal(config_apply_override_err(&c, "--zzzzqqq=1", err, sizeof err), -1);
    assert_contains(err, "unknown config key 'zzzzqqq'");
    assert_null(strstr(err, "did you mean"));   // nothing close: no guess
    assert_contains(err, "--help");
}

static void test_config_bad_values_name_key_value_and_type(void **state) {
    struct { const char *arg, *parts[3]; } cases[] = {
        {"epochs=abc",          {"'abc'", "'epochs'", "an int"}},
        {"epochs=12x",          {"'12x'", "'epochs'", "an int"}},
        {"epochs=",             {"''", "'epochs'", "an int"}},
        {"epochs=3.5",          {"'3.5'", "'epochs'", "an int"}},
        {"epochs=99999999999",  {"'99999999999'", "'epochs'", "from -2147483648 to 2147483647"}},
        {"lr=1.0.0",            {"'1.0.0'", "'lr'", "a float"}},
        {"lr=fast",             {"'fast'", "'lr'", "a float"}},
        {"lr=1e99",             {"'1e99'", "'lr'", "finite float"}},
        {"lr=1e-60",            {"'1e-60'", "'lr'", "finite float"}},
        {"lr=nan",              {"'nan'", "'lr'", "finite float"}},
        {"class_token=yes",     {"'yes'", "'class_token'", "0, 1, true or false"}},
        {"class_token=2",       {"'2'", "'class_token'", "a bool"}},
        {"run_name=a\tb",       {"'run_name'", "control character", "0x09"}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        Config c;
        config_defaults(&c);
        char err[1024] = "";
        assert_int_equal(config_apply_override_err(&c, cases[i].arg, err, sizeof err), -1);
        for (int j = 0; j < 3; j++) assert_contains(err, cases[i].parts[j]);
    }
    // In a file the message names the file and line.
    const char *path = write_cfg("bad.cfg", "depth = 4\n\ndepth = four  # words are not ints\n");
    Config c;
    char err[1024];
    assert_int_equal(load(&c, path, err), -1);
    assert_contains(err, "bad.cfg:3");
    assert_contains(err, "'four'");
    assert_contains(err, "'depth'");
}

static void test_config_line_without_equals_is_an_error(void **state) {
    const char *path = write_cfg("noeq.cfg", "lr = 0.1\nwidth 64\n");
    Config c;
    char err[1024];
    assert_int_equal(load(&c, path, err), -1);
    assert_contains(err, "noeq.cfg:2");
    assert_contains(err, "'width 64'");
    assert_contains(err, "no '='");

    path = write_cfg("quote.cfg", "run_name = \"open\n");
    assert_int_equal(load(&c, path, err), -1);
    assert_contains(err, "quote.cfg:1");
    assert_contains(err, "unterminated");

    path = write_cfg("after.cfg", "run_name = \"a\" b\n");
    assert_int_equal(load(&c, path, err), -1);
    assert_contains(err, "after the closing quote");

    assert_int_equal(config_apply_override_err(&c, "--width", err, sizeof err), -1);
    assert_contains(err, "no '='");
}

static void test_config_include_cycle_and_missing_include_are_errors(void **state) {
    write_cfg("a.cfg", "width = 1\ninclude = b.cfg\n");
    write_cfg("b.cfg", "\ninclude = a.cfg\n");
    Config c;
    char err[1024];
    char a[512];
    snprintf(a, sizeof a, "%s/a.cfg", g_dir);
    assert_int_equal(load(&c, a, err), -1);
    assert_contains(err, "include cycle");
    assert_contains(err, "a.cfg -> ");
    assert_contains(err, "b.cfg -> ");
    assert_contains(err, "b.cfg:2");

    const char *self = write_cfg("self.cfg", "include = self.cfg\n");
    assert_int_equal(load(&c, self, err), -1);
    assert_contains(err, "include cycle");

    // The same file included twice (not nested) is fine.
    write_cfg("leaf.cfg", "depth = 5\n");
    const char *twice = write_cfg("twice.cfg", "include = leaf.cfg\ndepth = 6\ninclude = leaf.cfg\n");
    assert_int_equal(load(&c, twice, err), 0);
    assert_int_equal(c.depth, 5);

    const char *missing = write_cfg("missing.cfg", "lr = 1\ninclude = nowhere/gone.cfg\n");
    assert_int_equal(load(&c, missing, err), -1);
    assert_contains(err, "nowhere/gone.cfg");
    assert_contains(err, "missing.cfg:2");
    assert_contains(err, "No such file");

    assert_int_equal(load(&c, "/nonexistent/dir/top.cfg", err), -1);
    assert_contains(err, "/nonexistent/dir/top.cfg");
}

// Every key away from its default, with strings that need quoting and floats that need digits.
#define ODD_int(c, name, i)    (c)->name = (i) % 2 ? -1000 - (i) : INT_MAX - (i);
#define ODD_float(c, name, i)  (c)->name = (float)(i) * 0.1f + 1.0f / 3.0f;
#define ODD_bool(c, name, i)   (c)->name = !(c)->name;
#define ODD_string(c, name, i) snprintf((c)->name, CONFIG_STR_MAX, " v%d \"q\" # \\ \\\" end ", i);

static void test_config_print_then_load_gives_the_same_config(void **state) {
    Config a;
    config_defaults(&a);
    int i = 0;
#define X(type, name, def, help) ODD_##type(&a, name, i) i++;
#include "../train/config_keys.h"
#undef X
    a.lr = FLT_TRUE_MIN;      // float edge cases: subnormal, largest, -0, tiny normal
    a.min_lr = FLT_MAX;
    a.weight_decay = -0.0f;
    a.adam_eps = 1e-8f;
    snprintf(a.run_name, CONFIG_STR_MAX, "%s", "");

    char path[512];
    snprintf(path, sizeof path, "%s/resolved.cfg", g_dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    config_print(&a, f);
    assert_int_equal(fclose(f), 0);

    Config b;
    char err[1024];
    int rc = load(&b, path, err);
    if (rc) fail_msg("%s", err);
    assert_same_config(&a, &b);

    // config_save writes the same thing; a second round trip is memcmp-identical.
    char saved[512];
    snprintf(saved, sizeof saved, "%s/saved.cfg", g_dir);
    assert_int_equal(config_save(&b, saved), 0);
    Config d;
    rc = load(&d, saved, err);
    if (rc) fail_msg("%s", err);
    assert_memory_equal(&b, &d, sizeof b);

    config_defaults(&d);
    assert_int_equal(config_save(&d, "/nonexistent/dir/x.cfg"), -1);
}

static void test_config_help_lists_every_key_type_default_and_help(void **state) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    config_print_help(f);
    fclose(f);
    assert_contains(buf, "lr");
    assert_contains(buf, "float");
    assert_contains(buf, "0.001");
    assert_contains(buf, "1e-8 ");                  // adam_eps, exponent without padding
    assert_contains(buf, "peak learning rate");
    assert_contains(buf, "vit | cgspn | hybrid");
    assert_contains(buf, "\"data/shards/fmnist\"");
#define X(type, name, def, help) assert_contains(buf, "  " #name " "); assert_contains(buf, help);
#include "../train/config_keys.h"
#undef X
    free(buf);
}

static void test_config_int_list_parses_commas_and_spaces(void **state) {
    int v[8];
    char err[256];
    assert_int_equal(config_parse_int_list("stages", "378, 518,756  1036", v, 8, err, sizeof err), 4);
    assert_int_equal(v[0], 378);
    assert_int_equal(v[3], 1036);
    assert_int_equal(config_parse_int_list("stages", "", v, 8, err, sizeof err), 0);
    assert_int_equal(config_parse_int_list("stages", "1,x2", v, 8, err, sizeof err), -1);
    assert_contains(err, "'stages'");
    assert_contains(err, "'x2'");
    assert_int_equal(config_parse_int_list("stages", "1,2,3", v, 2, err, sizeof err), -1);
    assert_contains(err, "more than 2");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_defaults_match_the_key_table_and_validate),
        cmocka_unit_test_setup_teardown(test_config_file_with_comments_includes_and_quotes_parses,
                                        setup_dir, teardown_dir),
        cmocka_unit_test(test_config_bools_take_0_1_true_false),
        cmocka_unit_test_setup_teardown(test_config_parse_args_loads_file_first_then_overrides_and_leaves_other_args,
                                        setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_cpu_config_swaps_in_the_cpu_file_only_on_the_cpu_and_the_command_line_wins, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_config_unknown_key_names_file_line_and_closest_key,
                                        setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_config_bad_values_name_key_value_and_type,
                                        setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_config_line_without_equals_is_an_error,
                                        setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_config_include_cycle_and_missing_include_are_errors,
                                        setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_config_print_then_load_gives_the_same_config,
                                        setup_dir, teardown_dir),
        cmocka_unit_test(test_config_help_lists_every_key_type_default_and_help),
        cmocka_unit_test(test_config_int_list_parses_commas_and_spaces),
    };
    return cmocka_run_group_tests_name("config", tests, NULL, NULL);
}
