// Checkpoints (train/checkpoint.h): the training state round trip (fp32, and bf16 values with
// fp32 masters), which folders count as complete, keep_last, refusing a resume that changes
// shapes, a write error (file size limit as a stand-in for a full disk) and kill -9 at every
// stage of a write leaving the previous checkpoint the newest complete one, and `cgspn train`
// resuming bit-exactly (losses, log lines, final weights, moments and EMA) with the whole recipe
// on, reading shards built from synthetic IDX files.
#include "testlib.h"
#include "train_fixture.h"
#include "resume_check.h"
#include "../train/checkpoint.h"
#include "../train/classify.h"
#include "../train/model_config.h"
#include "../nn/params_io.h"
#include "../nn/safetensors.h"
#include "../kernels/ops.h"
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char g_dir[256];   // a fresh temp folder per test

static int setup_dir(void **state) { return test_make_temp_dir(g_dir, sizeof g_dir, "ckpt"); }
static int teardown_dir(void **state) { return test_remove_dir(g_dir); }

static const char *tmp_path(const char *name) {
    static char paths[8][512];
    static int next;
    char *p = paths[next++ % 8];
    snprintf(p, 512, "%s/%s", g_dir, name);
    return p;
}

static bool exists(const char *path) { return access(path, F_OK) == 0; }

// ---- a model with state ------------------------------------------------------------------------

typedef struct Model {
    Config cfg;
    Encoder enc;
    ParamTable t;
    Ctx ctx;
} Model;

static Config tiny_config(int width) {
    Config c;
    config_defaults(&c);
    c.width = width;
    c.depth = 1;
    c.heads = 2;
    c.mlp_hidden = 2 * width;
    c.patch = 7;
    return c;
}

// Parameters from seed (values of dtype: bf16 ones get fp32 masters), moments filled with
// seeded values (as if trained); masters moved off the bf16 grid, as training does.
static Model *model_new_dtype(const Config *c, uint64_t seed, DType dtype) {
    Model *m = calloc(1, sizeof(Model));
    m->cfg = *c;
    EncoderConfig ec = encoder_config_from(c);
    m->ctx = ctx_cpu();
    m->ctx.act_dtype = dtype;
    params_init_table(&m->t);
    encoder_register(&m->enc, &ec, &m->t);
    params_alloc(&m->t, &m->ctx);
    params_initialize(&m->t, &m->ctx, seed);
    for (int i = 0; i < m->t.n; i++) {
        Param *p = m->t.params[i];
        uint64_t s = seed * 1000 + (uint64_t)i;
        for (size_t k = 0; k < p->m.numel; k++) {
            tensor_f32(&p->m)[k] = (float)(test_rng_next(&s) >> 40) * 1e-7f - 0.8f;
            tensor_f32(&p->v)[k] = (float)(test_rng_next(&s) >> 40) * 1e-9f;
            if (p->master.data) tensor_f32(&p->master)[k] += (float)(test_rng_next(&s) >> 40) * 1e-12f;
        }
    }
    return m;
}

static Model *model_new(const Config *c, uint64_t seed) { return model_new_dtype(c, seed, DTYPE_F32); }

static void model_free(Model *m) {
    params_free(&m->t, &m->ctx);
    free(m);
}

static bool same_bytes(const Tensor *a, const Tensor *b) {
    return a->dtype == b->dtype && a->numel == b->numel &&
           memcmp(a->data, b->data, tensor_bytes(a)) == 0;
}

// Every parameter's value, m, v (and master) bit for bit (buffer padding is not state).
static bool buffers_equal(const Model *a, const Model *b) {
    if (a->t.n != b->t.n) return false;
    for (int i = 0; i < a->t.n; i++) {
        const Param *p = a->t.params[i], *q = b->t.params[i];
        if (!same_bytes(&p->value, &q->value) || !same_bytes(&p->m, &q->m) || !same_bytes(&p->v, &q->v))
            return false;
        if ((p->master.data != NULL) != (q->master.data != NULL)) return false;
        if (p->master.data && !same_bytes(&p->master, &q->master)) return false;
    }
    return true;
}

static CkptState state_for(long step) {
    CkptState s = {.step = step, .n_rngs = 2, .cursor_bytes = 5};
    rng_seed(&s.rngs[0], (uint64_t)step);
    rng_seed_stream(&s.rngs[1], 3, 4, (uint64_t)step);
    memcpy(s.cursor, "\x01\x02\x03\xff\x00", 5);
    return s;
}

static void save_step(const char *run, Model *m, long step, int keep_last) {
    CkptState s = state_for(step);
    CkptOptions o = {.keep_last = keep_last};
    char err[2048];
    if (ckpt_save_err(run, &o, &m->cfg, &m->t, NULL, &m->ctx, &s, NULL, 0, err, sizeof err) != 0)
        fail_msg("%s", err);
}

// ---- state round trip -----------------------------------------------------------------------

static void test_state_round_trip_restores_every_bit(void **state) {
    Config c = tiny_config(16);
    Model *a = model_new(&c, 1), *b = model_new(&c, 2), *ema = model_new(&c, 3), *ema2 = model_new(&c, 4);
    char run[512];
    snprintf(run, sizeof run, "%s/run", g_dir);
    CkptState s = state_for(1234);
    char saved[1024], err[2048];
    CkptOptions o = {0};
    assert_int_equal(ckpt_save_err(run, &o, &c, &a->t, &ema->t, &a->ctx, &s, saved, sizeof saved,
                                   err, sizeof err), 0);
    char want[1200];
    ckpt_dir_name(run, 1234, want, sizeof want);
    assert_string_equal(saved, want);
    assert_string_equal(saved + strlen(run), "/step_00001234");
    assert_false(buffers_equal(a, b));
    CkptState got;
    assert_int_equal(ckpt_load_err(saved, &c, &b->t, &ema2->t, &b->ctx, &got, err, sizeof err), 0);
    assert_true(buffers_equal(a, b));   // values, m, v: bit for bit
    assert_true(got.ema_loaded);
    for (int i = 0; i < ema->t.n; i++)
        assert_memory_equal(ema->t.params[i]->value.data, ema2->t.params[i]->value.data,
                            tensor_bytes(&ema->t.params[i]->value));
    assert_int_equal(got.step, 1234);
    assert_int_equal(got.n_rngs, 2);
    assert_memory_equal(got.rngs, s.rngs, 2 * sizeof(Rng));
    assert_int_equal(got.cursor_bytes, 5);
    assert_memory_equal(got.cursor, s.cursor, 5);
    // The config beside it loads back; the weights load in any safetensors reader.
    Config back;
    config_defaults(&back);
    snprintf(want, sizeof want, "%s/config.cfg", saved);
    assert_int_equal(config_load_file_err(&back, want, err, sizeof err), 0);
    assert_int_equal(back.width, 16);
    model_free(a); model_free(b); model_free(ema); model_free(ema2);
}

static void test_bf16_parameters_save_bf16_weights_and_fp32_masters(void **state) {
    Config c = tiny_config(16);
    Model *a = model_new_dtype(&c, 1, DTYPE_BF16), *b = model_new_dtype(&c, 2, DTYPE_BF16);
    Model *f32 = model_new(&c, 3);
    char run[512], err[2048];
    snprintf(run, sizeof run, "%s/run", g_dir);
    save_step(run, a, 4, 0);
    StFile f;
    st_open(&f, tmp_path("run/step_00000004/model.safetensors"));
    assert_int_equal(st_find(&f, "blocks.0.attn.qkv.weight")->dtype, ST_BF16);
    st_close(&f);
    st_open(&f, tmp_path("run/step_00000004/state.safetensors"));
    assert_int_equal(st_find(&f, "master.blocks.0.attn.qkv.weight")->dtype, ST_F32);
    assert_int_equal(st_find(&f, "m.blocks.0.attn.qkv.weight")->dtype, ST_F32);
    st_close(&f);
    CkptState s;
    assert_false(buffers_equal(a, b));
    assert_int_equal(ckpt_load_err(tmp_path("run/step_00000004"), &c, &b->t, NULL, &b->ctx, &s,
                                   err, sizeof err), 0);
    assert_true(buffers_equal(a, b));   // bf16 values, fp32 masters and moments: every bit
    // An fp32 run resuming it takes the masters as its weights.
    assert_int_equal(ckpt_load_err(tmp_path("run/step_00000004"), &c, &f32->t, NULL, &f32->ctx, &s,
                                   err, sizeof err), 0);
    for (int i = 0; i < a->t.n; i++)
        assert_memory_equal(f32->t.params[i]->value.data, a->t.params[i]->master.data,
                            tensor_bytes(&a->t.params[i]->master));
    model_free(a); model_free(b); model_free(f32);
}

// ---- which folders count ---------------------------------------------------------------------

static void make_dir_with(const char *dir, bool complete) {
    mkdir(dir, 0755);
    char p[600];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    fclose(fopen(p, "w"));
    if (complete) {
        snprintf(p, sizeof p, "%s/COMPLETE", dir);
        fclose(fopen(p, "w"));
    }
}

static void test_find_latest_ignores_tmp_incomplete_and_other_names(void **state) {
    char run[512];
    snprintf(run, sizeof run, "%s/run", g_dir);
    char out[1024], err[1024];
    assert_int_equal(ckpt_find_latest(run, out, sizeof out), 0);   // no run folder yet
    mkdir(run, 0755);
    assert_int_equal(ckpt_find_latest(run, out, sizeof out), 0);
    make_dir_with(tmp_path("run/step_00000005"), true);
    make_dir_with(tmp_path("run/step_00000003"), true);
    make_dir_with(tmp_path("run/step_00000010"), false);    // being written when killed
    make_dir_with(tmp_path("run/step_00000012.tmp"), true); // not yet renamed
    make_dir_with(tmp_path("run/step_00000013.old"), true);
    make_dir_with(tmp_path("run/step_x"), true);
    make_dir_with(tmp_path("run/other"), true);
    assert_int_equal(ckpt_find_latest(run, out, sizeof out), 1);
    assert_string_equal(out, tmp_path("run/step_00000005"));
    long steps[8];
    assert_int_equal(ckpt_list(run, steps, 8), 2);
    assert_true(steps[0] == 3 && steps[1] == 5);
    // resume = ...: "", auto, a checkpoint, a run folder, an incomplete one, nothing.
    assert_int_equal(ckpt_resolve_err("", run, out, sizeof out, err, sizeof err), 0);
    assert_int_equal(ckpt_resolve_err("auto", run, out, sizeof out, err, sizeof err), 1);
    assert_string_equal(out, tmp_path("run/step_00000005"));
    assert_int_equal(ckpt_resolve_err("auto", tmp_path("none"), out, sizeof out, err, sizeof err), 0);
    assert_int_equal(ckpt_resolve_err(tmp_path("run/step_00000003"), run, out, sizeof out, err, sizeof err), 1);
    assert_string_equal(out, tmp_path("run/step_00000003"));
    assert_int_equal(ckpt_resolve_err(run, "elsewhere", out, sizeof out, err, sizeof err), 1);
    assert_string_equal(out, tmp_path("run/step_00000005"));
    assert_int_equal(ckpt_resolve_err(tmp_path("run/step_00000010"), run, out, sizeof out, err, sizeof err), -1);
    assert_contains(err, "the checkpoint is incomplete");
    assert_int_equal(ckpt_resolve_err(tmp_path("nope"), run, out, sizeof out, err, sizeof err), -1);
    assert_contains(err, "no such checkpoint folder");
}

static void test_keep_last_prunes_older_checkpoints(void **state) {
    Config c = tiny_config(8);
    Model *m = model_new(&c, 1);
    char run[512];
    snprintf(run, sizeof run, "%s/run", g_dir);
    make_dir_with(tmp_path("run"), false);
    make_dir_with(tmp_path("run/step_00000001.tmp"), false);   // a stale leftover of a crash
    for (long s = 2; s <= 6; s++) save_step(run, m, s, 2);
    long steps[8];
    assert_int_equal(ckpt_list(run, steps, 8), 2);
    assert_true(steps[0] == 5 && steps[1] == 6);
    assert_false(exists(tmp_path("run/step_00000004")));
    assert_false(exists(tmp_path("run/step_00000001.tmp")));
    save_step(run, m, 6, 2);   // the same step again replaces it
    assert_int_equal(ckpt_list(run, steps, 8), 2);
    assert_false(exists(tmp_path("run/step_00000006.old")));
    for (long s = 7; s <= 8; s++) save_step(run, m, s, 0);   // 0 keeps all
    assert_int_equal(ckpt_list(run, steps, 8), 4);
    model_free(m);
}

// ---- refusing a changed model ------------------------------------------------------------------

static void test_resume_with_changed_shapes_is_refused_with_both_configs(void **state) {
    Config c32 = tiny_config(32), c16 = tiny_config(16);
    Model *a = model_new(&c32, 1), *b = model_new(&c16, 2);
    char run[512];
    snprintf(run, sizeof run, "%s/run", g_dir);
    save_step(run, a, 7, 0);
    char dir[1024], err[4096];
    ckpt_dir_name(run, 7, dir, sizeof dir);
    CkptState s;
    assert_int_equal(ckpt_load_err(dir, &c16, &b->t, NULL, &b->ctx, &s, err, sizeof err), -1);
    printf("    %s\n", err);
    assert_contains(err, "step_00000007/model.safetensors: tensor patch_embed.proj.weight has shape "
                         "(32, 1, 7, 7), the config expects (16, 1, 7, 7)");
    assert_contains(err, "hint: resuming cannot change the model's shapes: the checkpoint was written "
                         "with width = 32, mlp_hidden = 64");
    assert_contains(err, "this run has width = 16, mlp_hidden = 32");
    // A deeper model: the checkpoint lacks blocks.1.*.
    Config deep = tiny_config(32);
    deep.depth = 2;
    Model *d = model_new(&deep, 3);
    assert_int_equal(ckpt_load_err(dir, &deep, &d->t, NULL, &d->ctx, &s, err, sizeof err), -1);
    assert_contains(err, "are not in the file: blocks.1.norm1.weight");
    assert_contains(err, "written with depth = 1");
    // A shallower one: the checkpoint has tensors the model does not.
    Config shallow = tiny_config(32);
    shallow.num_classes = 0;
    Model *e = model_new(&shallow, 3);
    assert_int_equal(ckpt_load_err(dir, &shallow, &e->t, NULL, &e->ctx, &s, err, sizeof err), -1);
    assert_contains(err, "2 tensors of the checkpoint are not parameters of this model: head.");
    assert_contains(err, "num_classes = 10");
    model_free(a); model_free(b); model_free(d); model_free(e);
}

static void test_corrupt_checkpoint_files_give_clear_errors(void **state) {
    Config c = tiny_config(8);
    Model *m = model_new(&c, 1);
    char run[512];
    snprintf(run, sizeof run, "%s/run", g_dir);
    save_step(run, m, 3, 0);
    char dir[1024], path[1100], err[4096];
    ckpt_dir_name(run, 3, dir, sizeof dir);
    snprintf(path, sizeof path, "%s/state.safetensors", dir);
    assert_int_equal(truncate(path, 1000), 0);
    CkptState s;
    assert_int_equal(ckpt_load_err(dir, &c, &m->t, NULL, &m->ctx, &s, err, sizeof err), -1);
    printf("    %s\n", err);
    assert_contains(err, "state.safetensors");
    assert_contains(err, "truncated");
    snprintf(path, sizeof path, "%s/COMPLETE", dir);
    unlink(path);
    assert_int_equal(ckpt_load_err(dir, &c, &m->t, NULL, &m->ctx, &s, err, sizeof err), -1);
    assert_contains(err, "not a complete checkpoint");
    model_free(m);
}

// ---- crashes and write errors ------------------------------------------------------------------

static void test_write_error_leaves_previous_checkpoint_and_no_partial_folder(void **state) {
    Config c = tiny_config(16);
    Model *m = model_new(&c, 1);
    char run[512];
    snprintf(run, sizeof run, "%s/run", g_dir);
    save_step(run, m, 1, 0);
    // A file size limit makes write() fail part way (EFBIG), as a full disk does (ENOSPC).
    struct rlimit keep, small;
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &keep), 0);
    small = keep;
    small.rlim_cur = 4096;
    void (*old)(int) = signal(SIGXFSZ, SIG_IGN);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &small), 0);
    CkptState s = state_for(2);
    CkptOptions o = {.keep_last = 1};
    char err[2048];
    int rc = ckpt_save_err(run, &o, &c, &m->t, NULL, &m->ctx, &s, NULL, 0, err, sizeof err);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &keep), 0);
    signal(SIGXFSZ, old);
    assert_int_equal(rc, -1);
    printf("    %s\n", err);
    assert_contains(err, "model.safetensors.tmp: write: File too large");
    assert_contains(err, "no checkpoint was written for step 2 (earlier ones are intact)");
    assert_false(exists(tmp_path("run/step_00000002.tmp")));
    assert_false(exists(tmp_path("run/step_00000002")));
    char out[1024];
    assert_int_equal(ckpt_find_latest(run, out, sizeof out), 1);
    assert_string_equal(out, tmp_path("run/step_00000001"));
    Model *b = model_new(&c, 9);
    CkptState got;
    assert_int_equal(ckpt_load_err(out, &c, &b->t, NULL, &b->ctx, &got, err, sizeof err), 0);
    assert_true(buffers_equal(m, b));
    model_free(m);
    model_free(b);
}

typedef struct KillHook { int fd, stage, count; } KillHook;

// In the child: after the stage-th file, tell the parent and wait to be killed.
static void stall_at_stage(void *user, const char *path) {
    KillHook *h = user;
    if (++h->count != h->stage) return;
    char c = (char)h->stage;
    if (write(h->fd, &c, 1) != 1) _exit(3);
    for (;;) pause();
}

static void test_kill9_mid_write_leaves_previous_checkpoint_newest(void **state) {
    Config c = tiny_config(16);
    Model *m = model_new(&c, 1);
    char run[512];
    snprintf(run, sizeof run, "%s/run", g_dir);
    save_step(run, m, 1, 0);
    Model *later = model_new(&c, 5);   // what the killed writer was saving
    // Stages: after model.safetensors, state.safetensors, config.cfg, COMPLETE (before rename).
    for (int stage = 1; stage <= 4; stage++) {
        int fds[2];
        assert_int_equal(pipe(fds), 0);
        fflush(stdout);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            close(fds[0]);
            KillHook h = {fds[1], stage, 0};
            CkptState s = state_for(2);
            CkptOptions o = {.keep_last = 1, .after_file = stall_at_stage, .user = &h};
            char err[2048];
            ckpt_save_err(run, &o, &c, &later->t, NULL, &later->ctx, &s, NULL, 0, err, sizeof err);
            _exit(2);   // never reached: the parent kills us at the stage
        }
        close(fds[1]);
        char got = 0;
        assert_int_equal(read(fds[0], &got, 1), 1);
        assert_int_equal(got, stage);
        kill(pid, SIGKILL);
        int status;
        assert_int_equal(waitpid(pid, &status, 0), pid);
        assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
        close(fds[0]);
        assert_true(exists(tmp_path("run/step_00000002.tmp")));   // the partial write is there
        char out[1024], err[2048];
        assert_int_equal(ckpt_find_latest(run, out, sizeof out), 1);
        assert_string_equal(out, tmp_path("run/step_00000001"));
        assert_int_equal(ckpt_resolve_err("auto", run, out, sizeof out, err, sizeof err), 1);
        Model *b = model_new(&c, 9);
        CkptState st;
        assert_int_equal(ckpt_load_err(out, &c, &b->t, NULL, &b->ctx, &st, err, sizeof err), 0);
        assert_true(buffers_equal(m, b));
        assert_int_equal(st.step, 1);
        model_free(b);
    }
    // The next save of that step clears the leftover and completes.
    save_step(run, later, 2, 1);
    assert_false(exists(tmp_path("run/step_00000002.tmp")));
    long steps[4];
    assert_int_equal(ckpt_list(run, steps, 4), 1);
    assert_int_equal(steps[0], 2);
    model_free(m);
    model_free(later);
}

// ---- cgspn train resumes bit-exactly (tests/resume_check.h) --------------------------------

static void test_vit_training_resumes_bit_exactly(void **state) {
    resume_is_bit_exact(g_dir, "vit", "cpu", 0);
}
static void test_cgspn_training_resumes_bit_exactly(void **state) {
    resume_is_bit_exact(g_dir, "cgspn", "cpu", 0);
}
// Every block recomputed in backward (grad_checkpoint = 1), drop path on: still bit-exact.
static void test_cgspn_training_with_recomputation_resumes_bit_exactly(void **state) {
    resume_is_bit_exact(g_dir, "cgspn", "cpu", 1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_state_round_trip_restores_every_bit, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_bf16_parameters_save_bf16_weights_and_fp32_masters, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_find_latest_ignores_tmp_incomplete_and_other_names, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_keep_last_prunes_older_checkpoints, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_resume_with_changed_shapes_is_refused_with_both_configs, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_corrupt_checkpoint_files_give_clear_errors, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_write_error_leaves_previous_checkpoint_and_no_partial_folder, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_kill9_mid_write_leaves_previous_checkpoint_newest, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_vit_training_resumes_bit_exactly, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_cgspn_training_resumes_bit_exactly, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_cgspn_training_with_recomputation_resumes_bit_exactly, setup_dir, teardown_dir),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
