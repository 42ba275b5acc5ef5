// Host messages over MPI point-to-point (MPI_Isend/MPI_Irecv, then MPI_Testsome until done or
// the deadline). MPI has no timeouts of its own: polling here knows which peer is late, names
// it, and calls MPI_Abort from the thread that owns MPI. Built only when tools/probe.sh found
// mpicc (CGSPN_HAVE_MPI); otherwise the stubs at the end explain how to get MPI.
#include "dist_internal.h"
#include "../kernels/error.h"
#include <pthread.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>

#ifdef CGSPN_HAVE_MPI
#include <mpi.h>

#define DIST_TAG_DATA 7001
#define DIST_TAG_PROBE 7002
// MPI counts are ints: messages go in pieces of at most this many bytes.
#define MPI_PIECE_BYTES ((size_t)1 << 30)

// Every MPI call is checked; the message names the call, the rank and where.
#define MPI_CHECK(d, call, hint)                                                                \
    do {                                                                                        \
        int rc_ = (call);                                                                       \
        if (rc_ != MPI_SUCCESS) {                                                               \
            char s_[MPI_MAX_ERROR_STRING] = "";                                                 \
            int len_ = 0;                                                                       \
            MPI_Error_string(rc_, s_, &len_);                                                   \
            dist_fail((d), (hint)[0] ? (hint) : "when a rank died, mpirun's output names it",   \
                      "MPI error in %s: %s (%s:%d)", #call, s_, __FILE__, __LINE__);             \
        }                                                                                       \
    } while (0)

static int g_thread_level = MPI_THREAD_SINGLE;
static pthread_t g_mpi_thread;   // the thread that called MPI_Init

bool dist_mpi_available(void) { return true; }

int dist_mpi_init(Dist *d, int *argc, char ***argv, char *err, size_t n) {
    int rc = MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &g_thread_level);
    if (rc != MPI_SUCCESS)
        return cg_set_error(err, n, "MPI_Init_thread failed (error %d): the MPI launcher's environment "
                            "is set but MPI could not start\n  hint: run under the mpirun of the MPI "
                            "this binary was built with (mpicc --showme)", rc);
    g_mpi_thread = pthread_self();
    d->mpi_initialized = true;
    d->backend = DIST_MPI;
    // Errors come back to MPI_CHECK (which names the call) instead of aborting inside MPI.
    MPI_CHECK(d, MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), "");
    MPI_CHECK(d, MPI_Comm_rank(MPI_COMM_WORLD, &d->rank), "");
    MPI_CHECK(d, MPI_Comm_size(MPI_COMM_WORLD, &d->world), "");
    if (d->world > 1) dist_watchdog_start(d);
    char *hosts = cg_calloc((size_t)d->world, DIST_HOST_MAX);
    dist_watch_begin(d, "the host-name exchange at startup (MPI_Allgather)");
    MPI_CHECK(d, MPI_Allgather(d->host, DIST_HOST_MAX, MPI_CHAR, hosts, DIST_HOST_MAX, MPI_CHAR,
                               MPI_COMM_WORLD), "check that every rank started (mpirun's output)");
    dist_watch_end(d);
    dist_local_from_hosts(d, hosts);
    free(hosts);
    return 0;
}

typedef struct Piece {
    int peer;
    bool recv;
} Piece;

static int count_pieces(const DistMsg *m, int k) {
    int c = 0;
    for (int i = 0; i < k; i++)
        if (m[i].bytes) c += (int)((m[i].bytes + MPI_PIECE_BYTES - 1) / MPI_PIECE_BYTES);
    return c;
}

static int post(Dist *d, const DistMsg *m, int k, bool recv, MPI_Request *req, Piece *pc, int at) {
    for (int i = 0; i < k; i++) {
        for (size_t off = 0; off < m[i].bytes; off += MPI_PIECE_BYTES) {
            size_t len = m[i].bytes - off < MPI_PIECE_BYTES ? m[i].bytes - off : MPI_PIECE_BYTES;
            char *p = (char *)m[i].buf + off;
            if (recv)
                MPI_CHECK(d, MPI_Irecv(p, (int)len, MPI_BYTE, m[i].peer, DIST_TAG_DATA,
                                       MPI_COMM_WORLD, &req[at]), "");
            else
                MPI_CHECK(d, MPI_Isend(p, (int)len, MPI_BYTE, m[i].peer, DIST_TAG_DATA,
                                       MPI_COMM_WORLD, &req[at]), "");
            pc[at++] = (Piece){m[i].peer, recv};
        }
    }
    return at;
}

void dist_mpi_exchange(Dist *d, const DistMsg *sends, int ns, const DistMsg *recvs, int nr,
                       const char *what) {
    int total = count_pieces(sends, ns) + count_pieces(recvs, nr);
    if (!total) return;
    MPI_Request *req = cg_malloc((size_t)total * sizeof *req);
    Piece *pc = cg_malloc((size_t)total * sizeof *pc);
    int *idx = cg_malloc((size_t)total * sizeof *idx);
    int at = post(d, recvs, nr, true, req, pc, 0);
    post(d, sends, ns, false, req, pc, at);
    double t0 = dist_now();
    int left = total;
    for (long spins = 0; left > 0; spins++) {
        int done = 0;
        MPI_CHECK(d, MPI_Testsome(total, req, &done, idx, MPI_STATUSES_IGNORE), "");
        if (done == MPI_UNDEFINED) break;
        left -= done;
        if (left == 0) break;
        if (done > 0) continue;
        double waited = dist_now() - t0;
        if (waited > d->timeout_s) {
            // A receive that has not arrived names its sender; else a send nobody takes.
            int late = -1;
            bool sending = false;
            for (int i = 0; i < total && late < 0; i++)
                if (req[i] != MPI_REQUEST_NULL && pc[i].recv) late = pc[i].peer;
            for (int i = 0; i < total && late < 0; i++)
                if (req[i] != MPI_REQUEST_NULL) late = pc[i].peer, sending = true;
            dist_fail_late(d, what, late, sending, waited);
        }
        if (spins > 2000) {   // past the first microseconds, poll without burning a core
            struct timespec ts = {0, 20 * 1000};
            nanosleep(&ts, NULL);
        } else {
            sched_yield();
        }
    }
    free(req);
    free(pc);
    free(idx);
}

void dist_mpi_probe(Dist *d, double grace_s, unsigned char *alive) {
    const int world = d->world;
    MPI_Request *req = cg_malloc(2 * (size_t)world * sizeof *req);
    int *got = cg_calloc((size_t)world, sizeof(int));
    static int token = 1;
    for (int p = 0; p < world; p++) {
        req[p] = req[world + p] = MPI_REQUEST_NULL;
        if (p == d->rank) continue;
        MPI_Irecv(&got[p], 1, MPI_INT, p, DIST_TAG_PROBE, MPI_COMM_WORLD, &req[p]);
        MPI_Isend(&token, 1, MPI_INT, p, DIST_TAG_PROBE, MPI_COMM_WORLD, &req[world + p]);
    }
    const double t0 = dist_now();
    while (dist_now() - t0 < grace_s) {
        int all = 1;
        for (int p = 0; p < world; p++) {
            int done = 0;
            if (req[p] != MPI_REQUEST_NULL) MPI_Test(&req[p], &done, MPI_STATUS_IGNORE);
            if (req[p] != MPI_REQUEST_NULL) all = 0;
        }
        if (all) break;
        struct timespec ts = {0, 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    for (int p = 0; p < world; p++) alive[p] = p == d->rank || got[p] == 1;
    // The job stops next: requests still pending are left to MPI_Abort.
    free(got);
    free(req);
}

void dist_mpi_finalize(Dist *d) {
    dist_watchdog_start(d);
    dist_watch_begin(d, "MPI_Finalize");
    MPI_CHECK(d, MPI_Finalize(), "");
    dist_watch_end(d);
    dist_watchdog_stop(d);
    d->mpi_initialized = false;
}

void dist_mpi_abort(Dist *d) {
    // From a thread other than MPI's own, MPI_Abort is only allowed with MPI_THREAD_MULTIPLE;
    // without it, the caller exits and mpirun stops the job (a rank left without MPI_Finalize).
    (void)d;
    if (g_thread_level == MPI_THREAD_MULTIPLE || pthread_equal(pthread_self(), g_mpi_thread))
        MPI_Abort(MPI_COMM_WORLD, 1);
}

#else   // no MPI in this build

bool dist_mpi_available(void) { return false; }

int dist_mpi_init(Dist *d, int *argc, char ***argv, char *err, size_t n) {
    (void)d, (void)argc, (void)argv;
    return cg_set_error(err, n, "this process was started by an MPI launcher (mpirun, or srun "
                        "--mpi), but this build of cgspn has no MPI\n  hint: install MPI "
                        "(tools/install_deps.sh installs libopenmpi-dev), then rebuild: rm "
                        "build/config.mk && make; or launch with RANK/WORLD_SIZE and "
                        "CGSPN_RENDEZVOUS instead");
}

void dist_mpi_exchange(Dist *d, const DistMsg *sends, int ns, const DistMsg *recvs, int nr,
                       const char *what) {
    (void)sends, (void)ns, (void)recvs, (void)nr;
    dist_fail(d, "", "%s: no MPI in this build", what);
}

void dist_mpi_probe(Dist *d, double grace_s, unsigned char *alive) {
    (void)d, (void)grace_s, (void)alive;
}

void dist_mpi_finalize(Dist *d) { (void)d; }
void dist_mpi_abort(Dist *d) { (void)d; }

#endif
