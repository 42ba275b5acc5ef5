// The hierarchical GSPN encoder's configs (configs/gspn_{t,s,b}.cfg) against the C-GSPN paper's
// Table 2, its parameter names and shapes, its token grids, and its refusals. Its gradients are
// checked end to end in test_tape.c.
#include "testlib.h"
#include <glob.h>
#include <unistd.h>
#include "train_fixture.h"
#include "../train/classify.h"
#include "../train/config.h"
#include "../train/model_config.h"
#include "../kernels/error.h"
#include "../nn/safetensors.h"

static EncoderConfig load(const char *path) {
    Config c;
    config_defaults(&c);
    config_load_file(&c, path);
    return encoder_config_from(&c);
}

// Table 2 (fast GSPN-T/S/B): 24 / 50 / 89 M parameters, 4.2 / 9.2 / 14.2 GMACs at 224 px; the
// configs hold both within 3%. The exact counts pin the layout: a changed layer changes them.
static void test_gspn_configs_match_table_2_within_3_percent(void **state) {
    (void)state;
    static const struct { const char *cfg; double params_m, gmacs; size_t exact; } rows[] = {
        {"configs/gspn_t.cfg", 24, 4.2, 23811754},
        {"configs/gspn_s.cfg", 50, 9.2, 50756104},
        {"configs/gspn_b.cfg", 89, 14.2, 90252300},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        EncoderConfig ec = load(rows[i].cfg);
        Encoder e;
        ParamTable t;
        params_init_table(&t);
        encoder_register(&e, &ec, &t);
        size_t n = params_count(&t, false);
        double gmacs = encoder_flops_per_image(&ec) / 2e9;
        printf("  %s: %zu parameters, %.3f GMACs\n", rows[i].cfg, n, gmacs);
        assert_int_equal(n, rows[i].exact);
        assert_true(fabs(n / 1e6 / rows[i].params_m - 1) <= 0.03);
        assert_true(fabs(gmacs / rows[i].gmacs - 1) <= 0.03);
        assert_int_equal(e.hier.grid_h[0], 56);
        assert_int_equal(e.grid_h, 7);
        params_free(&t, NULL);
    }
}

static const Param *find(const ParamTable *t, const char *name) {
    const Param *p = params_find(t, name);
    if (!p) fail_msg("no parameter %s", name);
    return p;
}

static void assert_shape(const ParamTable *t, const char *name, int ndim, const int *shape) {
    const Param *p = find(t, name);
    assert_int_equal(p->value.ndim, ndim);
    for (int i = 0; i < ndim; i++) assert_int_equal(p->value.shape[i], shape[i]);
}

// The names tests/parity_gspn_hier.py's PyTorch model uses, with PyTorch's layouts.
static void test_gspn_t_parameter_names_and_shapes(void **state) {
    (void)state;
    EncoderConfig ec = load("configs/gspn_t.cfg");
    Encoder e;
    ParamTable t;
    params_init_table(&t);
    encoder_register(&e, &ec, &t);
    assert_shape(&t, "stem.conv1.weight", 4, (int[]){48, 3, 3, 3});
    assert_shape(&t, "stem.conv2.weight", 4, (int[]){96, 48, 3, 3});
    assert_shape(&t, "stages.0.blocks.0.lpu1.weight", 4, (int[]){96, 1, 3, 3});
    assert_shape(&t, "stages.0.blocks.0.mixer.in_proj.weight", 2, (int[]){144, 96});
    assert_null(params_find(&t, "stages.0.blocks.0.mixer.in_proj.bias"));
    assert_shape(&t, "stages.0.blocks.0.mixer.conv.weight", 4, (int[]){144, 1, 7, 7});
    assert_null(params_find(&t, "stages.0.blocks.0.mixer.conv.bias"));
    assert_shape(&t, "stages.2.blocks.8.mixer.gspn.down.weight", 2, (int[]){2, 576});
    assert_shape(&t, "stages.2.blocks.8.mixer.gspn.gate.weight", 2, (int[]){28, 2});
    assert_shape(&t, "stages.2.blocks.8.mixer.gspn.up.weight", 2, (int[]){384, 2});
    assert_shape(&t, "stages.3.blocks.0.mlp.fc1.weight", 2, (int[]){3072, 768});
    assert_shape(&t, "stages.2.downsample.conv.weight", 4, (int[]){768, 384, 3, 3});
    assert_null(params_find(&t, "stages.3.downsample.conv.weight"));
    assert_shape(&t, "norm.weight", 1, (int[]){768});
    assert_shape(&t, "head.weight", 2, (int[]){1000, 768});
    params_free(&t, NULL);
}

// ceil halving per 3x3 stride-2 convolution: Fashion-MNIST's 28 px gives 7, 4, 2, 1.
static void test_gspn_hier_grids_halve_up(void **state) {
    (void)state;
    EncoderConfig c = {.img_h = 28, .img_w = 33};
    int gh[HIER_STAGES], gw[HIER_STAGES];
    hier_grids(&c, gh, gw);
    int eh[] = {7, 4, 2, 1}, ew[] = {9, 5, 3, 2};
    for (int s = 0; s < HIER_STAGES; s++) {
        assert_int_equal(gh[s], eh[s]);
        assert_int_equal(gw[s], ew[s]);
    }
}

// `cgspn describe` prints the counts; a config without four depths stops with the key's name.
static void test_describe_prints_counts_and_names_a_bad_key(void **state) {
    (void)state;
    if (access("./cgspn", X_OK) != 0) fail_msg("./cgspn is not built (make test builds it first)");
    char out[4096];
    FILE *p = popen("./cgspn describe configs/gspn_t.cfg 2>&1", "r");
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = 0;
    assert_int_equal(pclose(p), 0);
    assert_contains(out, "23.812 M parameters");
    assert_contains(out, "4.234 GMACs at 224x224");
    p = popen("./cgspn describe configs/gspn_t.cfg --depths=2,2,7 2>&1", "r");
    n = fread(out, 1, sizeof out - 1, p);
    out[n] = 0;
    assert_int_not_equal(pclose(p), 0);
    assert_contains(out, "depths");
}

// A short CPU run of a tiny gspn_hier on the fixture shards, then `cgspn eval`, `export` and
// `probe` on its checkpoint: the commands that read an encoder's pooled features and head take
// the last stage's width (the probe once read rows of the first stage's).
static void test_train_eval_export_probe_a_tiny_gspn_hier(void **state) {
    (void)state;
    if (access("./cgspn", X_OK) != 0) fail_msg("./cgspn is not built (make test builds it first)");
    char dir[128], cmd[2048];
    assert_int_equal(test_make_temp_dir(dir, sizeof dir, "hier_cli"), 0);
    fixture_build_shards(dir, 48, 16);
    Config c = fixture_config(dir, "gspn_hier", "hier", 4);
    fixture_gspn_hier(&c, 8);
    TrainResult r = classify_train(&c, NULL);
    assert_int_equal(r.status, TRAIN_DONE);
    const char *cmds[] = {"eval %s/hier/config.cfg --weights %s/hier",
                          "export %s/hier --out %s/student.safetensors",
                          "probe %s/hier/config.cfg --weights %s/student.safetensors --epochs=1"};
    for (int i = 0; i < 3; i++) {
        char args[1024];
        snprintf(args, sizeof args, cmds[i], dir, dir);
        snprintf(cmd, sizeof cmd, "./cgspn %s > %s/log 2>&1", args, dir);
        if (system(cmd) != 0) {
            snprintf(cmd, sizeof cmd, "cat %s/log", dir);
            assert_int_equal(system(cmd), 0);
            fail_msg("cgspn %s failed", args);
        }
    }
    char log[300];
    snprintf(log, sizeof log, "%s/log", dir);
    size_t n;
    char *text = (char *)test_read_bytes(log, &n);
    text = realloc(text, n + 1);
    text[n] = 0;
    assert_contains(text, "probe: linear probe");
    free(text);
    test_remove_dir(dir);
}

// Every shipped config loads and builds its encoder (`cgspn describe`): a renamed key or a broken
// include in configs/ fails here, not in a user's run.
static void test_every_shipped_config_builds(void **state) {
    (void)state;
    glob_t g;
    assert_int_equal(glob("configs/*.cfg", 0, NULL, &g), 0);
    assert_true(g.gl_pathc >= 29);
    for (size_t i = 0; i < g.gl_pathc; i++) {
        char cmd[600];
        snprintf(cmd, sizeof cmd, "./cgspn describe %s > /dev/null", g.gl_pathv[i]);
        if (system(cmd) != 0) fail_msg("cgspn describe %s failed", g.gl_pathv[i]);
    }
    printf("  %zu configs\n", g.gl_pathc);
    globfree(&g);
}

// Max |a - b| / max |b| over n values.
static double max_rel(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num = fmax(num, fabs((double)a[i] - b[i]));
        den = fmax(den, fabs((double)b[i]));
    }
    return num / fmax(den, 1e-30);
}

// Every tensor of fixture named prefix + X against X in out: the worst error.
static double compare_all(const StFile *fixture, const char *prefix, const char *out_path, int *n) {
    StFile out;
    st_open(&out, out_path);
    double worst = 0;
    *n = 0;
    for (int i = 0; i < fixture->n; i++) {
        const StTensor *ref = &fixture->tensors[i];
        if (strncmp(ref->name, prefix, strlen(prefix)) != 0) continue;
        const StTensor *mine = st_find(&out, ref->name + strlen(prefix));
        if (!mine) fail_msg("%s has no %s", out_path, ref->name + strlen(prefix));
        size_t count = 1;
        for (int d = 0; d < ref->ndim; d++) count *= (size_t)ref->shape[d];
        float *a = malloc(count * sizeof(float)), *b = malloc(count * sizeof(float));
        char err[256];
        assert_int_equal(st_read_f32_err(&out, mine, a, err, sizeof err), 0);
        assert_int_equal(st_read_f32_err(fixture, ref, b, err, sizeof err), 0);
        double e = max_rel(a, b, count);
        if (e > 1e-4) printf("    %-48s max-rel error %.2e\n", ref->name, e);
        worst = fmax(worst, e);
        (*n)++;
        free(a);
        free(b);
    }
    st_close(&out);
    return worst;
}

// PyTorch's float64 reference of a tiny gspn_hier (tests/parity_gspn_hier.py --case tiny
// --write-fixture, run on the GPU machine where PyTorch is): `cgspn features` on the CPU in fp32
// reproduces its taps, norm, pooled vector and logits, and every parameter's gradient, to 1e-4 of
// each tensor's scale (the fp32 bound of tests/parity_gspn_hier.py).
static void test_cpu_matches_pytorch_reference_of_a_tiny_model(void **state) {
    (void)state;
    if (access("./cgspn", X_OK) != 0) fail_msg("./cgspn is not built (make test builds it first)");
    const char *fx = "tests/data/gspn_hier_tiny.safetensors";
    char dir[128], cmd[2048], feats[256], grads[256];
    assert_int_equal(test_make_temp_dir(dir, sizeof dir, "hier"), 0);
    snprintf(feats, sizeof feats, "%s/feats.safetensors", dir);
    snprintf(grads, sizeof grads, "%s/grads.safetensors", dir);
    // the fixture's case "tiny" (parity_gspn_hier.py CASES): its overrides of gspn_t.cfg
    snprintf(cmd, sizeof cmd, "./cgspn features configs/gspn_t.cfg --weights %s --teacher_prefix=w. "
             "--images %s --out %s --grads %s --device=cpu --precision=fp32 --width=8 "
             "--depths=1,1,2,1 --mlp_ratio=2 --mixer_conv=5 --num_classes=5 > %s/log 2>&1",
             fx, fx, feats, grads, dir);
    if (system(cmd) != 0) {
        snprintf(cmd, sizeof cmd, "cat %s/log", dir);
        assert_int_equal(system(cmd), 0);
        fail_msg("cgspn features failed");
    }
    StFile fixture;
    st_open(&fixture, fx);
    int n_out, n_grad;
    double worst = fmax(compare_all(&fixture, "ref.", feats, &n_out),
                        compare_all(&fixture, "grad.", grads, &n_grad));
    printf("  %d outputs, %d gradients: worst max-relative error %.2e\n", n_out, n_grad, worst);
    assert_int_equal(n_out, 13);      // 5 blocks x (pp, pb), norm, pooled, logits
    assert_int_equal(n_grad, 129);    // every parameter
    assert_true(worst <= 1e-4);
    st_close(&fixture);
    test_remove_dir(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gspn_configs_match_table_2_within_3_percent),
        cmocka_unit_test(test_gspn_t_parameter_names_and_shapes),
        cmocka_unit_test(test_gspn_hier_grids_halve_up),
        cmocka_unit_test(test_describe_prints_counts_and_names_a_bad_key),
        cmocka_unit_test(test_cpu_matches_pytorch_reference_of_a_tiny_model),
        cmocka_unit_test(test_every_shipped_config_builds),
        cmocka_unit_test(test_train_eval_export_probe_a_tiny_gspn_hier),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
