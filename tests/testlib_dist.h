// Shared by the data-parallel tests (tests/test_dist.c over forked TCP ranks, and
// tests/test_dist_mpi.c under mpirun): a small parameter table whose sizes put bucket and shard
// boundaries inside parameters, per-rank gradients any rank can regenerate, and the
// single-process reference step on the averaged gradient.
#pragma once
#include "testlib.h"
#include "../dist/ckpt_shard.h"
#include "../dist/grads.h"
#include "../train/optimizer.h"
#include "../kernels/ops.h"
#include "../kernels/arena.h"
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

// A bucket of about 2 KB: several buckets over the ~3,600 elements of the table below, so
// buckets, parts and parameters cut each other in every way.
#define DIST_TEST_BUCKET_MB 0.002
#define DIST_TEST_STEPS 3

typedef struct DistTestModel {
    Ctx ctx;
    ParamTable t;
    Arena arena;
} DistTestModel;

// The table on ctx (its activation dtype for the values).
static inline void dist_test_model_on(DistTestModel *m, Ctx ctx) {
    m->ctx = ctx;
    params_init_table(&m->t);
    params_add(&m->t, "a.weight", 2, (int[]){37, 19}, INIT_TRUNC_NORMAL, 0.02f, true);
    params_add(&m->t, "a.bias", 1, (int[]){37}, INIT_FAN_IN_UNIFORM, 19.0f, false);
    params_add(&m->t, "frozen.weight", 1, (int[]){50}, INIT_ONES, 0.0f, true);
    params_add(&m->t, "b.weight", 2, (int[]){300, 7}, INIT_XAVIER_UNIFORM, 0.0f, true);
    params_add(&m->t, "b.bias", 1, (int[]){300}, INIT_ZEROS, 0.0f, false);
    params_add(&m->t, "tok", 3, (int[]){1, 3, 5}, INIT_TRUNC_NORMAL, 0.02f, false);
    // fp32 values in a bf16 table (nn/params.h): one trainable across the shards' boundaries,
    // one frozen
    params_keep_f32(&m->t, &params_find(&m->t, "b.bias")->value);
    params_keep_f32(&m->t, &params_find(&m->t, "frozen.weight")->value);
    params_set_trainable(&m->t, "frozen.", false);
    params_alloc(&m->t, &m->ctx);
    params_initialize(&m->t, &m->ctx, 42);
    arena_init(&m->arena, &m->ctx, 1 << 16);
}

static inline void dist_test_model(DistTestModel *m) { dist_test_model_on(m, ctx_cpu()); }

// Uploads a host buffer laid out as the table's gradient buffer (t.total floats) into it.
static inline void dist_test_upload_grads(DistTestModel *m, const float *host) {
    Tensor all = {0};
    tensor_set_shape(&all, 1, (int[]){(int)m->t.total});
    all.data = m->t.grads;
    all.dtype = DTYPE_F32;
    all.device = m->ctx.device;
    tensor_upload(&m->ctx, &all, host);
}

static inline void dist_test_model_free(DistTestModel *m) {
    arena_free(&m->arena);
    params_free(&m->t, &m->ctx);
}

// Rank r's gradient of step s (trainable parameters only), reproducible anywhere, into a host
// buffer laid out as t's gradient buffer (t->total floats).
static inline void dist_test_grads_into(const ParamTable *t, float *buf, int rank, int step) {
    memset(buf, 0, t->total * sizeof(float));
    for (int i = 0; i < t->n; i++) {
        const Param *p = t->params[i];
        if (!p->trainable) continue;
        Tensor g = p->grad;
        g.data = buf + p->offset;
        test_fill(&g, 1000003ull * (uint64_t)(rank + 1) + 7919ull * (uint64_t)step + (uint64_t)i, -1.0f, 1.0f);
    }
}

static inline void dist_test_grads(ParamTable *t, int rank, int step) {
    dist_test_grads_into(t, t->grads, rank, step);
}

// The mean over world ranks' gradients, added in rank order as dist/collectives.c does.
static inline void dist_test_mean_grads_into(const ParamTable *t, float *out, int world, int step) {
    size_t n = t->total;
    float *g = calloc(n, sizeof(float));
    for (int r = 0; r < world; r++) {
        dist_test_grads_into(t, g, r, step);
        for (size_t i = 0; i < n; i++) out[i] = r == 0 ? g[i] : out[i] + g[i];
    }
    for (size_t i = 0; i < n; i++) out[i] /= (float)world;
    free(g);
}

static inline void dist_test_mean_grads(ParamTable *t, int world, int step) {
    dist_test_mean_grads_into(t, t->grads, world, step);
}

static inline OptimizerConfig dist_test_optimizer(void) {
    OptimizerConfig o = {{1e-2f, 1e-4f, 1, 10}, 0.9f, 0.999f, 1e-8f, 0.05f, 0.0f};
    // Clipping on, and below the norm of these gradients (|g| ~ 0.58 per element): the scale
    // comes from the global norm, so a wrong cross-rank norm shows in the weights.
    o.grad_clip = 5.0f;
    return o;
}

// Runs DIST_TEST_STEPS data-parallel steps on rank d->rank's gradients, reporting the
// parameters ready in reverse order as backward would (half of them; dist_wait_grads launches
// the rest). Norms into norms[step].
static inline void dist_test_train(Dist *d, DistTestModel *m, int zero, float *norms) {
    DistGrads *g = dist_grads_create(d, &m->t, &m->ctx, zero, DIST_TEST_BUCKET_MB);
    OptimizerConfig o = dist_test_optimizer();
    for (int s = 0; s < DIST_TEST_STEPS; s++) {
        dist_test_grads(&m->t, d->rank, s);
        for (int i = m->t.n - 1; i >= m->t.n / 2; i--) dist_grad_ready(g, i);
        StepStats st = optimizer_step_dist(&m->t, &m->ctx, &m->arena, &o, s, g);
        arena_reset(&m->arena);
        norms[s] = st.grad_norm;
    }
    dist_grads_free(g);
}

// The same steps in one process on the mean gradient of world ranks.
static inline void dist_test_reference(DistTestModel *m, int world, float *norms) {
    OptimizerConfig o = dist_test_optimizer();
    for (int s = 0; s < DIST_TEST_STEPS; s++) {
        dist_test_mean_grads(&m->t, world, s);
        StepStats st = optimizer_step(&m->t, &m->ctx, &m->arena, &o, s);
        arena_reset(&m->arena);
        norms[s] = st.grad_norm;
    }
}

// Largest |a - b| / max(|b|, 1e-3) over the parameter elements of two tables' buffer.
static inline double dist_test_max_rel(const ParamTable *t, const float *a, const float *b) {
    double worst = 0;
    for (int i = 0; i < t->n; i++) {
        const Param *p = t->params[i];
        for (size_t k = 0; k < p->value.numel; k++) {
            double x = a[p->offset + k], y = b[p->offset + k];
            double e = fabs(x - y) / fmax(fabs(y), 1e-3);
            if (e > worst) worst = e;
        }
    }
    return worst;
}

// 1 when two buffers of a table hold the same bits in every parameter element (padding between
// parameters is never written and holds whatever the allocation held).
static inline int dist_test_same_bits(const ParamTable *t, const void *a, const void *b) {
    for (int i = 0; i < t->n; i++) {
        const Param *p = t->params[i];
        if (memcmp((const float *)a + p->offset, (const float *)b + p->offset,
                   p->value.numel * sizeof(float)) != 0)
            return 0;
    }
    return 1;
}

// Moments with values any rank can regenerate: element k of parameter i.
static inline float dist_test_moment(int kind, int i, size_t k) {
    return (float)(kind + 1) * 0.001f * (float)(i + 1) + 1e-7f * (float)k;
}

static inline void dist_test_fill_moments(ParamTable *t) {
    for (int i = 0; i < t->n; i++) {
        Param *p = t->params[i];
        for (size_t k = 0; k < p->value.numel; k++) {
            tensor_f32(&p->m)[k] = dist_test_moment(0, i, k);
            tensor_f32(&p->v)[k] = dist_test_moment(1, i, k);
        }
    }
}

// Element k of parameter i's moment (m or v), in the table's layout (whole or its shard).
static inline float dist_test_state_at(const ParamTable *t, ParamState kind, int i, size_t k) {
    Tensor x = params_state_view(t, kind, i, k, 1);
    return tensor_f32(&x)[0];
}

// 0 when every element of the segments holds dist_test_moment's values; else the first bad one.
static inline int dist_test_check_moments(const ParamTable *t, const ParamSegment *seg, int n,
                                          char *what, size_t wn) {
    for (int s = 0; s < n; s++) {
        const Param *p = t->params[seg[s].param];
        for (size_t k = seg[s].start; k < seg[s].start + seg[s].len; k++) {
            float m = dist_test_state_at(t, PARAM_STATE_M, seg[s].param, k);
            float v = dist_test_state_at(t, PARAM_STATE_V, seg[s].param, k);
            if (m != dist_test_moment(0, seg[s].param, k) || v != dist_test_moment(1, seg[s].param, k)) {
                snprintf(what, wn, "%s[%zu]: m %g v %g", p->name, k, m, v);
                return -1;
            }
        }
    }
    return 0;
}

// The shard layout of a table sharded by dist_grads_create (zero = 1): its m, v (and masters)
// hold exactly the pieces of seg, each at a running offset rounded up to PARAM_ALIGN. 0, else -1
// with what is wrong.
static inline int dist_test_check_shard_layout(const ParamTable *t, const ParamSegment *seg, int n,
                                               char *what, size_t wn) {
    size_t at = 0, elems = 0;
    if (t->shard != seg || t->n_shard != n)
        return snprintf(what, wn, "the DistGrads' shard is not the table's"), -1;
    for (int s = 0; s < n; s++) {
        if (seg[s].at != at)
            return snprintf(what, wn, "piece %d at %zu, expected %zu", s, seg[s].at, at), -1;
        at += (seg[s].len + PARAM_ALIGN - 1) / PARAM_ALIGN * PARAM_ALIGN;
        elems += seg[s].len;
    }
    if (t->state_total != at || t->state_total >= elems + (size_t)n * PARAM_ALIGN)
        return snprintf(what, wn, "state buffers of %zu elements for pieces of %zu (%d pieces)",
                        t->state_total, elems, n), -1;
    for (int i = 0; i < t->n; i++)
        if (t->params[i]->m.data || t->params[i]->v.data || t->params[i]->master.data)
            return snprintf(what, wn, "%s still has whole-layout views", t->params[i]->name), -1;
    return 0;
}

// ---- ranks as forked processes (no MPI): a TCP group meeting in DIR/rendezvous ----------------

#define DIST_TEST_MAX_RANKS 8

// A child's work: 0 on success. Children never use CMocka's asserts (they would unwind into the
// parent's test runner); CHILD_CHECK prints the failure to the child's stderr and returns 1.
typedef int (*DistRankFn)(Dist *d, void *arg);
#define CHILD_CHECK(cond, ...)                                                          \
    do {                                                                                \
        if (!(cond)) {                                                                  \
            fprintf(stderr, "check failed at %s:%d: %s: ", __FILE__, __LINE__, #cond);  \
            fprintf(stderr, __VA_ARGS__);                                               \
            fprintf(stderr, "\n");                                                      \
            return 1;                                                                   \
        }                                                                               \
    } while (0)

// OPEN_TCP: dist_open_tcp_err with the rank; OPEN_ENV: RANK, WORLD_SIZE, LOCAL_RANK and
// CGSPN_RENDEZVOUS set, then dist_init_err, as a torchrun-style launcher would.
typedef enum { OPEN_TCP, OPEN_ENV } OpenMode;

typedef struct RankResult {
    int code;         // exit status, 128 + signal, or -1 when killed for running too long
    double seconds;   // from the fork until it ended
    char err[8192];   // its stderr
} RankResult;

static inline double dist_test_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static inline void dist_test_child(const char *dir, int rank, int world, OpenMode mode,
                                   double timeout_s, DistRankFn fn, void *arg) {
    char path[512], rdv[512];
    snprintf(path, sizeof path, "%s/rank%d.err", dir, rank);
    snprintf(rdv, sizeof rdv, "%s/rendezvous", dir);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 2);
    Dist d;
    char err[1024];
    int rc;
    if (mode == OPEN_TCP) {
        rc = dist_open_tcp_err(&d, rank, world, rdv, timeout_s, err, sizeof err);
    } else {
        char v[32];
        snprintf(v, sizeof v, "%d", rank);
        setenv("RANK", v, 1);
        setenv("LOCAL_RANK", v, 1);
        snprintf(v, sizeof v, "%d", world);
        setenv("WORLD_SIZE", v, 1);
        setenv("CGSPN_RENDEZVOUS", rdv, 1);
        snprintf(v, sizeof v, "%g", timeout_s);
        setenv("CGSPN_DIST_TIMEOUT", v, 1);
        int argc = 1;
        char *args[] = {"test", NULL}, **argv = args;
        rc = dist_init_err(&d, &argc, &argv, err, sizeof err);
    }
    if (rc != 0) {
        fprintf(stderr, "bootstrap: %s\n", err);
        _exit(90);
    }
    rc = fn(&d, arg);
    if (rc == 0) dist_finalize(&d);
    fflush(stdout);
    _exit(rc);
}

// Forks world ranks running fn and waits for them (killing any still running after limit_s);
// their stderr goes to DIR/rankN.err and into res.
static inline void dist_test_run_ranks(const char *dir, int world, OpenMode mode, double timeout_s,
                                       double limit_s, DistRankFn fn, void *arg, RankResult *res) {
    pid_t pid[DIST_TEST_MAX_RANKS];
    const double t0 = dist_test_now();
    fflush(stdout);
    fflush(stderr);
    for (int r = 0; r < world; r++) {
        pid[r] = fork();
        assert_true(pid[r] >= 0);
        if (pid[r] == 0) dist_test_child(dir, r, world, mode, timeout_s, fn, arg);
        res[r].code = -2;
    }
    for (int left = world; left > 0;) {
        for (int r = 0; r < world; r++) {
            int st;
            if (res[r].code != -2 || waitpid(pid[r], &st, WNOHANG) != pid[r]) continue;
            res[r].code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
            res[r].seconds = dist_test_now() - t0;
            left--;
        }
        if (left && dist_test_now() - t0 > limit_s) {
            for (int r = 0; r < world; r++) {
                if (res[r].code != -2) continue;
                kill(pid[r], SIGKILL);
                waitpid(pid[r], NULL, 0);
                res[r].code = -1;
                res[r].seconds = dist_test_now() - t0;
            }
            left = 0;
        }
        struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    for (int r = 0; r < world; r++) {
        char path[512];
        snprintf(path, sizeof path, "%s/rank%d.err", dir, r);
        FILE *f = fopen(path, "r");
        size_t k = f ? fread(res[r].err, 1, sizeof res[r].err - 1, f) : 0;
        res[r].err[k] = 0;
        if (f) fclose(f);
    }
}

static inline void dist_test_assert_all_passed(int world, const RankResult *res) {
    for (int r = 0; r < world; r++)
        if (res[r].code != 0) fail_msg("rank %d ended with %d; its stderr:\n%s", r, res[r].code, res[r].err);
}
