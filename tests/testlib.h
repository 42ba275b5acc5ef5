// Shared helpers for the CMocka tests: CPU tensors, seeded fills, finite-difference checks, and
// expect_stop for the refusals of bad arguments.
#pragma once
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include <sys/wait.h>
#include <unistd.h>
#include "../kernels/tensor.h"

// Central differences in fp32 with this step: truncation error ~ eps^2 * f''' stays near 1e-4
// for the smooth ops tested, round-off ~ 1e-7 * |L| / eps near 1e-5 for the small losses used.
#define FD_EPS 1e-2f
// Relative error ||analytic - numeric|| / ||numeric|| allowed per tensor. A wrong gradient
// (missing term, transposed index, wrong scale) gives errors of order 1, far above this.
#define GRAD_TOL 1e-2

// A fresh temporary folder /tmp/cgspn_test_<tag>_XXXXXX in buf; 0 on success.
static inline int test_make_temp_dir(char *buf, size_t n, const char *tag) {
    snprintf(buf, n, "/tmp/cgspn_test_%s_XXXXXX", tag);
    return mkdtemp(buf) ? 0 : -1;
}

static inline int test_remove_dir(const char *dir) {
    char cmd[1100];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd);
}

// Fails unless s contains part (error-message checks).
static inline void assert_contains(const char *s, const char *part) {
    if (!strstr(s, part)) fail_msg("expected the message to contain '%s', got:\n%s", part, s);
}

// A whole file's bytes (n of them); free the result.
// Runs fn in a child process and expects it to stop (exit status 1) with a message on stderr
// that contains every string of want (NULL-terminated).
static inline void expect_stop(void (*fn)(void), const char *const *want) {
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    fflush(stdout);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(fds[1], 2);
        fn();
        _exit(0);
    }
    close(fds[1]);
    char msg[512] = {0};
    size_t got = 0;
    ssize_t n;
    while (got < sizeof msg - 1 && (n = read(fds[0], msg + got, sizeof msg - 1 - got)) > 0)
        got += (size_t)n;
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    printf("    message: %s", msg);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 1);
    for (; *want; want++) assert_non_null(strstr(msg, *want));
}

static inline uint8_t *test_read_bytes(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("cannot open %s", path);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *p = malloc(*n ? *n : 1);
    assert_int_equal(fread(p, 1, *n, f), *n);
    fclose(f);
    return p;
}

// The file as a NUL-terminated string (malloc'd).
static inline char *test_read_text(const char *path) {
    size_t n;
    uint8_t *p = test_read_bytes(path, &n);
    char *s = realloc(p, n + 1);
    s[n] = 0;
    return s;
}

// Runs the shell command cmd with its stdout and stderr in the file log; its exit status (0:
// success). For the real binary (./cgspn): a refusal there exits, which a forked child of a test
// that already ran OpenMP could not reach (libgomp does not survive fork).
static inline int test_run_logged(const char *cmd, const char *log) {
    size_t n = strlen(cmd) + strlen(log) + 16;
    char *full = malloc(n);
    snprintf(full, n, "%s > %s 2>&1", cmd, log);
    int rc = system(full);
    free(full);
    return rc;
}

static inline void assert_files_equal(const char *a, const char *b) {
    size_t na, nb;
    uint8_t *x = test_read_bytes(a, &na), *y = test_read_bytes(b, &nb);
    if (na != nb || memcmp(x, y, na) != 0) fail_msg("%s and %s differ", a, b);
    free(x);
    free(y);
}

// A CPU fp32 tensor that owns its data (free with test_tensor_free). shape given as ints.
static inline Tensor *test_tensor(int ndim, ...) {
    int shape[TENSOR_MAX_DIMS];
    va_list ap;
    va_start(ap, ndim);
    for (int i = 0; i < ndim; i++) shape[i] = va_arg(ap, int);
    va_end(ap);
    Tensor *t = calloc(1, sizeof(Tensor));
    tensor_set_shape(t, ndim, shape);
    t->data = calloc(t->numel ? t->numel : 1, sizeof(float));
    t->dtype = DTYPE_F32;
    t->device = DEVICE_CPU;
    return t;
}

// A zeroed tensor of t's shape.
static inline Tensor *test_like(const Tensor *t) {
    Tensor *g = calloc(1, sizeof(Tensor));
    *g = *t;
    g->grad = NULL;
    g->data = calloc(t->numel ? t->numel : 1, sizeof(float));
    return g;
}

static inline void test_tensor_free(Tensor *t) {
    if (!t) return;
    free(t->data);
    free(t);
}

static inline uint64_t test_rng_next(uint64_t *s) {   // splitmix64
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// Uniform in [lo, hi), reproducible from seed.
static inline void test_fill(Tensor *t, uint64_t seed, float lo, float hi) {
    float *p = t->data;
    for (size_t i = 0; i < t->numel; i++)
        p[i] = lo + (hi - lo) * (float)((test_rng_next(&seed) >> 40) * (1.0 / 16777216.0));
}

static inline double test_dot(const Tensor *a, const Tensor *b) {
    double s = 0;
    const float *x = a->data, *y = b->data;
    for (size_t i = 0; i < a->numel; i++) s += (double)x[i] * y[i];
    return s;
}

// Relative error ||a - b|| / max(||b||, 1e-12), over n floats.
static inline double test_rel_err(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    return sqrt(num) / fmax(sqrt(den), 1e-12);
}

// Finite-difference check of one input. `loss` runs the forward pass on the current inputs
// and returns a scalar; `analytic` is dloss/dx already computed by the backward pass.
// Perturbs every element of x (restoring it), prints and returns the relative error.
typedef double (*TestLossFn)(void *user);
// The directional form, for a loss whose per-element differences drown in fp32 noise (small
// gradients through a deep model): along the analytic gradient's direction d = g/|g|, the
// central difference over a step h (|h| d moves the loss by ~h |g|, far above its noise) must
// read <g, d> = |g|. Then along a random unit direction r it must read <g, r>. Returns the worse
// of the two relative errors (the second relative to |g|).
static inline double test_gradcheck_directional(const char *what, TestLossFn loss, void *user,
                                                Tensor *x, const Tensor *analytic, float h,
                                                uint64_t seed) {
    float *p = x->data;
    const float *g = analytic->data;
    size_t n = x->numel;
    float *keep = malloc(n * sizeof(float)), *dir = malloc(n * sizeof(float));
    memcpy(keep, p, n * sizeof(float));
    double gn = 0;
    for (size_t i = 0; i < n; i++) gn += (double)g[i] * g[i];
    gn = sqrt(gn);
    double err = 0;
    for (int pass = 0; pass < 2; pass++) {
        double dn = 0, expect = 0;
        uint64_t st = seed * 2654435761u + 1;
        for (size_t i = 0; i < n; i++) {
            st = st * 6364136223846793005ull + 1442695040888963407ull;
            dir[i] = pass == 0 ? g[i] : (float)((double)(st >> 11) / 9007199254740992.0 - 0.5);
            dn += (double)dir[i] * dir[i];
        }
        dn = sqrt(dn);
        for (size_t i = 0; i < n; i++) expect += g[i] * (dir[i] / dn);
        for (size_t i = 0; i < n; i++) p[i] = keep[i] + h * (float)(dir[i] / dn);
        double lp = loss(user);
        for (size_t i = 0; i < n; i++) p[i] = keep[i] - h * (float)(dir[i] / dn);
        double lm = loss(user);
        memcpy(p, keep, n * sizeof(float));
        double numeric = (lp - lm) / (2.0 * h);
        err = fmax(err, fabs(numeric - expect) / fmax(gn, 1e-12));
    }
    printf("    gradcheck %-28s directional rel err %.2e (|g| %.2e)\n", what, err, gn);
    free(keep);
    free(dir);
    return err;
}

static inline double test_gradcheck(const char *what, TestLossFn loss, void *user,
                                    Tensor *x, const Tensor *analytic) {
    float *p = x->data;
    float *numeric = calloc(x->numel ? x->numel : 1, sizeof(float));
    for (size_t i = 0; i < x->numel; i++) {
        float keep = p[i];
        p[i] = keep + FD_EPS;
        double lp = loss(user);
        p[i] = keep - FD_EPS;
        double lm = loss(user);
        p[i] = keep;
        numeric[i] = (float)((lp - lm) / (2.0 * FD_EPS));
    }
    double err = test_rel_err(analytic->data, numeric, x->numel);
    printf("    gradcheck %-28s rel err %.2e\n", what, err);
    free(numeric);
    return err;
}
