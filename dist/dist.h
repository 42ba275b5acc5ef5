// The process group of a data-parallel run (docs/design.md#commands): one process per GPU, every
// process holding the whole model, each computing gradients on its slice of the batch.
//
// Bootstrap (dist_init): how the processes were started decides how they find each other.
//   mpirun, or srun --mpi=pmix   (OMPI_COMM_WORLD_SIZE, PMIX_RANK, PMI_SIZE, ... are set)
//       MPI_Init; rank and world from MPI; the local rank from a hostname exchange
//       (MPI_Allgather). Host-side collectives go through MPI point-to-point messages.
//   srun without MPI (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID), or torchrun-style
//   (RANK, WORLD_SIZE, LOCAL_RANK)
//       rank and world from the environment; the ranks meet through a shared folder (config
//       key dist_rendezvous, or CGSPN_RENDEZVOUS): each writes its address there, and they
//       connect a TCP mesh. No MPI call is made, even though the binary links libmpi.
//   anything else: a world of one. No MPI call, no socket, no thread.
//
// Host collectives (below) work on host memory, sum in rank order (rank 0's value first), and
// so are bit-identical on every rank and from run to run, whatever the transport. The GPU path
// (NCCL) lives in dist/grads.h.
//
// Faults: every wait has a deadline (dist_timeout_s). A rank that does not deliver in time is
// named ("rank 0: all-reduce of gradient bucket 3 waited 45 s for rank 1 ...") and the job is
// stopped: MPI_Abort under MPI (mpirun then kills every rank), ncclCommAbort first when an NCCL
// communicator exists, exit otherwise. Without MPI each rank also runs a watchdog thread that
// notices a peer's connection closing (the peer exited or crashed) and exits, so a rank hung in
// compute does not outlive the job.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DIST_DEFAULT_TIMEOUT_S 45.0   // + the probe and the time to stop: all gone within 60 s
#define DIST_PROBE_GRACE_S 5.0        // how long a timed-out NCCL wait listens for the other ranks
#define DIST_HOST_MAX 64
// Parts of a range split across ranks are multiples of this many elements (256 bytes of
// fp32), so every part of a 256-byte aligned buffer is aligned for vector loads.
#define DIST_ALIGN 64

typedef enum { DIST_SINGLE = 0, DIST_MPI = 1, DIST_TCP = 2 } DistBackend;

struct DistTcp;
struct DistWatchdog;
struct DistNccl;

typedef struct Dist {
    int rank, world;
    int local_rank, local_world;   // among the ranks on this host
    DistBackend backend;
    double timeout_s;              // the deadline of every wait
    char host[DIST_HOST_MAX];
    bool pending;                  // DIST_TCP: ranks known from the environment, no rendezvous yet
    bool mpi_initialized;          // this process called MPI_Init (dist_finalize finalizes)
    unsigned long n_ops;           // host collectives issued (messages carry it; same on all ranks)
    struct DistTcp *tcp;
    struct DistWatchdog *watchdog;
    struct DistNccl *nccl;         // dist/grads.c, created on first use with a CUDA context
    void (*on_abort)(struct Dist *d);     // dist_fail calls it first (ncclCommAbort)
    void (*on_finalize)(struct Dist *d);  // dist_finalize calls it first (ncclCommDestroy)
    void *scratch;                 // receive buffers of the host collectives (grows)
    size_t scratch_bytes;
} Dist;

typedef struct DistOptions {
    double timeout_s;         // <= 0: DIST_DEFAULT_TIMEOUT_S
    const char *rendezvous;   // NULL or "": $CGSPN_RENDEZVOUS
} DistOptions;

// ---- bootstrap ------------------------------------------------------------------------------
// From the environment (above). Under MPI this calls MPI_Init, so call it first thing in main.
// Launched without MPI, ranks come from the environment; the rendezvous happens here when the
// folder is known ($CGSPN_RENDEZVOUS), else later in dist_setup (d->pending).
int  dist_init_err(Dist *d, int *argc, char ***argv, char *err, size_t n);
// Applies the options (timeout) and completes a pending rendezvous. Idempotent.
int  dist_setup_err(Dist *d, const DistOptions *o, char *err, size_t n);
// A TCP group with known ranks meeting in folder dir (tests, and dist_init's env launch).
int  dist_open_tcp_err(Dist *d, int rank, int world, const char *dir, double timeout_s,
                       char *err, size_t n);
// A world of one.
void dist_init_single(Dist *d);
// Waits for every rank (with the deadline), then closes connections, stops the watchdog and
// finalizes MPI. A world of one: nothing.
void dist_finalize(Dist *d);

// The process's group: main's dist_init (app/main.c); a world of one until then.
Dist *dist_process(void);
// main: dist_init_err on dist_process(), exiting with the message on error.
Dist *dist_process_init(int *argc, char ***argv);

// "rank 1/8" style prefix for log lines; "" in a world of one.
const char *dist_tag(const Dist *d);

// ---- faults ---------------------------------------------------------------------------------
// Prints "cgspn: rank R: MESSAGE" (and the hint), then stops the whole job: ncclCommAbort when
// a communicator exists, MPI_Abort under MPI, else exit(1) (peers notice the closed sockets).
void dist_fail(Dist *d, const char *hint, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 3, 4)));
// The watchdog thread stops the job when a section armed here is not disarmed by its deadline
// (for blocking calls that cannot poll: MPI_Allgather at bootstrap, NCCL init). what names it.
void dist_watch_begin(Dist *d, const char *what);
void dist_watch_end(Dist *d);
// After a wait timed out without knowing whom it waited for (NCCL): probes every rank for
// grace_s seconds (every rank that timed out does the same) and writes "rank 3 did not answer"
// or "every rank answered" into out. Only from the thread that runs the collectives.
void dist_describe_late(Dist *d, double grace_s, char *out, size_t n);
// Seconds of a monotonic clock.
double dist_now(void);

// ---- host collectives (every rank calls them in the same order) ------------------------------
// Element range [lo, hi) of rank r's part when n elements are split across world ranks: every
// part but the last is the same multiple of DIST_ALIGN; the last takes the remainder.
void dist_part(size_t n, int world, int r, size_t *lo, size_t *hi);

void dist_barrier(Dist *d, const char *what);
// bytes from root to every rank.
void dist_broadcast(Dist *d, void *buf, size_t bytes, int root, const char *what);
// all (world * bytes) = every rank's mine, in rank order.
void dist_all_gather_bytes(Dist *d, const void *mine, void *all, size_t bytes, const char *what);
// buf (n fp32): afterwards this rank's part (dist_part) holds the sum over ranks in rank order,
// times 1/world when average (the rest of buf is left as it was).
void dist_reduce_scatter_f32(Dist *d, float *buf, size_t n, bool average, const char *what);
// buf (n elements of elem_bytes): every rank's part (dist_part) to every rank.
void dist_all_gather_parts(Dist *d, void *buf, size_t n, size_t elem_bytes, const char *what);
// reduce-scatter then all-gather: every rank ends with the same bits.
void dist_all_reduce_f32(Dist *d, float *buf, size_t n, bool average, const char *what);
// Sum of x over ranks, added in rank order (the same double on every rank).
double dist_sum_f64(Dist *d, double x, const char *what);
// The lowest rank that passed ok = 0, or -1 when every rank passed 1.
int  dist_first_failed(Dist *d, int ok, const char *what);

#ifdef __cplusplus
}
#endif
