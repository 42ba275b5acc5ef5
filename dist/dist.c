// Bootstrap of the process group from the environment, the watchdog thread, and stopping the
// job on a fault (dist/dist.h).
#include "dist_internal.h"
#include "../kernels/error.h"
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

// Set by the first thread that stops the job; a second one waits for the process to end.
static atomic_int g_failing;

double dist_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

const char *dist_tag(const Dist *d) {
    static _Thread_local char buf[32];
    if (d->world <= 1) return "";
    snprintf(buf, sizeof buf, "rank %d/%d", d->rank, d->world);
    return buf;
}

void dist_init_single(Dist *d) {
    memset(d, 0, sizeof *d);
    d->world = d->local_world = 1;
    d->backend = DIST_SINGLE;
    d->timeout_s = DIST_DEFAULT_TIMEOUT_S;
    if (gethostname(d->host, sizeof d->host - 1) != 0) snprintf(d->host, sizeof d->host, "localhost");
}

// ---- faults -----------------------------------------------------------------------------------

void dist_fail(Dist *d, const char *hint, const char *fmt, ...) {
    if (atomic_exchange(&g_failing, 1)) {   // another thread is already stopping the job
        for (;;) pause();
    }
    fflush(stdout);
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "cgspn: rank %d: %s\n", d->rank, msg);
    if (hint && hint[0]) fprintf(stderr, "  hint: %s\n", hint);
    fflush(stderr);
    alarm(15);   // should ncclCommAbort or MPI_Abort hang, SIGALRM still ends the process
    if (d->on_abort) d->on_abort(d);
    if (d->backend == DIST_MPI && d->mpi_initialized) dist_mpi_abort(d);
    // Without MPI (or when MPI_Abort is not allowed from this thread): the peers see this
    // process's connections close; under mpirun a rank that exits without MPI_Finalize makes
    // mpirun stop the job.
    _exit(1);
}

void dist_fail_late(Dist *d, const char *what, int peer, bool sending, double waited) {
    dist_fail(d, "a rank that stops answering is hung (a deadlock, a GPU fault, a slow disk) or dead; "
                 "its own log says which; raise dist_timeout_s if the ranks legitimately wait "
                 "this long for each other",
              "%s waited %.1f s for rank %d (%s; dist_timeout_s = %g): that rank is hung or dead; "
              "stopping the job", what, waited, peer, sending ? "it is not receiving" : "nothing arrived",
              d->timeout_s);
}

// ---- watchdog ---------------------------------------------------------------------------------

typedef struct DistWatchdog {
    pthread_t thread;
    pthread_mutex_t mu;
    atomic_int stop;
    bool armed;
    double deadline;
    char what[160];
} DistWatchdog;

static void *watchdog_main(void *arg) {
    Dist *d = arg;
    DistWatchdog *w = d->watchdog;
    while (!atomic_load(&w->stop)) {
        if (d->backend == DIST_TCP && d->tcp) {
            int peer = dist_tcp_poll_closed(d, 100);
            if (peer >= 0 && !atomic_load(&w->stop))
                dist_fail(d, "look for the first error in that rank's output",
                          "rank %d closed its connection (it exited or crashed); stopping this rank",
                          peer);
        } else {
            struct timespec ts = {0, 100 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
        pthread_mutex_lock(&w->mu);
        bool late = w->armed && dist_now() > w->deadline;
        char what[sizeof w->what];
        memcpy(what, w->what, sizeof what);
        pthread_mutex_unlock(&w->mu);
        if (late && !atomic_load(&w->stop))
            dist_fail(d, "a rank is hung or dead; its own log says which; raise dist_timeout_s if "
                         "the ranks legitimately wait this long",
                      "%s did not finish within %g s (dist_timeout_s): a rank is hung or dead; "
                      "stopping the job", what, d->timeout_s);
    }
    return NULL;
}

void dist_watchdog_start(Dist *d) {
    if (d->watchdog || d->world <= 1) return;
    DistWatchdog *w = cg_calloc(1, sizeof *w);
    pthread_mutex_init(&w->mu, NULL);
    d->watchdog = w;
    int rc = pthread_create(&w->thread, NULL, watchdog_main, d);
    CG_CHECK(rc == 0, "", "pthread_create (the distributed watchdog): %s", strerror(rc));
}

void dist_watchdog_stop(Dist *d) {
    DistWatchdog *w = d->watchdog;
    if (!w) return;
    atomic_store(&w->stop, 1);
    pthread_join(w->thread, NULL);
    pthread_mutex_destroy(&w->mu);
    free(w);
    d->watchdog = NULL;
}

void dist_watch_begin(Dist *d, const char *what) {
    DistWatchdog *w = d->watchdog;
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    snprintf(w->what, sizeof w->what, "%s", what);
    w->deadline = dist_now() + d->timeout_s;
    w->armed = true;
    pthread_mutex_unlock(&w->mu);
}

void dist_watch_end(Dist *d) {
    DistWatchdog *w = d->watchdog;
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    w->armed = false;
    pthread_mutex_unlock(&w->mu);
}

// ---- bootstrap --------------------------------------------------------------------------------

void dist_local_from_hosts(Dist *d, const char *hosts) {
    d->local_rank = 0;
    d->local_world = 0;
    for (int r = 0; r < d->world; r++) {
        if (strncmp(hosts + (size_t)r * DIST_HOST_MAX, d->host, DIST_HOST_MAX) != 0) continue;
        if (r < d->rank) d->local_rank++;
        d->local_world++;
    }
}

// The value of the first variable of names that is set, or NULL.
static const char *env_first(const char *const *names, int n, const char **which) {
    for (int i = 0; i < n; i++) {
        const char *v = getenv(names[i]);
        if (v && v[0]) {
            if (which) *which = names[i];
            return v;
        }
    }
    return NULL;
}

static int parse_int_env(const char *name, const char *v, int *out, char *err, size_t n) {
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < 0 || x > 1 << 24)
        return cg_set_error(err, n, "environment variable %s = '%s' is not a rank or count", name, v);
    *out = (int)x;
    return 0;
}

// Started by an MPI launcher: a world size (> 1) from it, or at least a rank.
static bool launched_by_mpi(void) {
    static const char *const sizes[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE",
                                        "MPI_LOCALNRANKS"};
    const char *v = env_first(sizes, 4, NULL);
    if (v) return atoi(v) > 1;
    return getenv("PMIX_RANK") != NULL;
}

// Files of one job in a shared rendezvous folder carry its id, so concurrent jobs (or job steps)
// can share the folder.
static void rendezvous_prefix(char *out, size_t n) {
    const char *job = getenv("SLURM_JOB_ID"), *step = getenv("SLURM_STEP_ID");
    const char *run = getenv("CGSPN_RUN_ID"), *elastic = getenv("TORCHELASTIC_RUN_ID");
    if (run && run[0]) snprintf(out, n, "cgspn-%s", run);
    else if (job && job[0]) snprintf(out, n, "cgspn-slurm%s.%s", job, step ? step : "0");
    else if (elastic && elastic[0]) snprintf(out, n, "cgspn-%s", elastic);
    else snprintf(out, n, "cgspn");
}

int dist_open_tcp_err(Dist *d, int rank, int world, const char *dir, double timeout_s, char *err,
                      size_t n) {
    dist_init_single(d);
    d->rank = rank;
    d->world = world;
    d->backend = DIST_TCP;
    if (timeout_s > 0) d->timeout_s = timeout_s;
    if (world <= 1) {
        d->backend = DIST_SINGLE;
        return 0;
    }
    char prefix[256];
    rendezvous_prefix(prefix, sizeof prefix);
    if (dist_tcp_open(d, dir, prefix, err, n) != 0) return -1;
    dist_watchdog_start(d);
    return 0;
}

int dist_init_err(Dist *d, int *argc, char ***argv, char *err, size_t n) {
    dist_init_single(d);
    const char *t = getenv("CGSPN_DIST_TIMEOUT");
    if (t && atof(t) > 0) d->timeout_s = atof(t);
    if (launched_by_mpi()) return dist_mpi_init(d, argc, argv, err, n);

    // torchrun-style first (torchrun inside a Slurm allocation sets both), then srun.
    static const char *const tr[3] = {"RANK", "WORLD_SIZE", "LOCAL_RANK"};
    static const char *const sl[3] = {"SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID"};
    const char *const *names = NULL;
    if (getenv(tr[1]) && getenv(tr[0])) names = tr;
    else if (getenv(sl[1]) && getenv(sl[0])) names = sl;
    if (!names) return 0;
    int rank = 0, world = 1, local = -1;
    if (parse_int_env(names[0], getenv(names[0]), &rank, err, n) != 0 ||
        parse_int_env(names[1], getenv(names[1]), &world, err, n) != 0)
        return -1;
    if (getenv(names[2]) && parse_int_env(names[2], getenv(names[2]), &local, err, n) != 0) return -1;
    if (world <= 1) return 0;
    if (rank >= world)
        return cg_set_error(err, n, "%s = %d is not below %s = %d", names[0], rank, names[1], world);
    d->rank = rank;
    d->world = world;
    d->local_rank = local >= 0 ? local : 0;
    d->backend = DIST_TCP;
    d->pending = true;
    const char *dir = getenv("CGSPN_RENDEZVOUS");
    if (dir && dir[0]) return dist_setup_err(d, &(DistOptions){d->timeout_s, dir}, err, n);
    return 0;
}

int dist_setup_err(Dist *d, const DistOptions *o, char *err, size_t n) {
    if (o && o->timeout_s > 0) d->timeout_s = o->timeout_s;
    if (!d->pending) return 0;
    const char *dir = o && o->rendezvous && o->rendezvous[0] ? o->rendezvous : getenv("CGSPN_RENDEZVOUS");
    if (!dir || !dir[0])
        return cg_set_error(err, n,
                            "rank %d of %d (from the environment, no MPI): the ranks need a folder "
                            "to meet in\n  hint: set dist_rendezvous = a folder every rank can see "
                            "(a shared filesystem across nodes), or CGSPN_RENDEZVOUS; or launch with "
                            "mpirun / srun --mpi=pmix",
                            d->rank, d->world);
    int local = d->local_rank;
    bool local_from_env = getenv("LOCAL_RANK") || getenv("SLURM_LOCALID");
    int rank = d->rank, world = d->world;
    double timeout = d->timeout_s;
    if (dist_open_tcp_err(d, rank, world, dir, timeout, err, n) != 0) return -1;
    if (local_from_env) d->local_rank = local;   // the launcher's binding wins over host names
    return 0;
}

void dist_finalize(Dist *d) {
    if (d->world <= 1) return;
    if (d->on_finalize) d->on_finalize(d);
    d->on_finalize = NULL;
    d->on_abort = NULL;
    dist_watchdog_stop(d);
    dist_barrier(d, "the end-of-run barrier");
    if (d->backend == DIST_TCP) dist_tcp_close(d);
    if (d->backend == DIST_MPI && d->mpi_initialized) dist_mpi_finalize(d);
    free(d->scratch);
    d->scratch = NULL;
    d->scratch_bytes = 0;
    d->world = 1;
}

static Dist g_process;
static bool g_process_set;

Dist *dist_process(void) {
    if (!g_process_set) {
        dist_init_single(&g_process);
        g_process_set = true;
    }
    return &g_process;
}

Dist *dist_process_init(int *argc, char ***argv) {
    char err[1024];
    g_process_set = true;
    if (dist_init_err(&g_process, argc, argv, err, sizeof err) != 0)
        CG_FAIL("", "%s", err);
    return &g_process;
}

void *dist_scratch(Dist *d, size_t bytes) {
    if (bytes > d->scratch_bytes) {
        free(d->scratch);
        d->scratch = cg_malloc(bytes);
        d->scratch_bytes = bytes;
    }
    return d->scratch;
}
