// Between the files of dist/: the transports under the host collectives.
#pragma once
#include "dist.h"

// One message of an exchange: bytes to or from peer.
typedef struct DistMsg {
    int peer;
    void *buf;
    size_t bytes;
} DistMsg;

// Posts every send and receive, then waits for all of them with the deadline; a peer that does
// not deliver in time (or closes its connection) is named and the job stopped (dist_fail).
// At most one send and one receive per peer; messages of 0 bytes are skipped.
void dist_exchange(Dist *d, const DistMsg *sends, int ns, const DistMsg *recvs, int nr,
                   const char *what);
// Host memory for receives, valid until the next call (grows, never shrinks).
void *dist_scratch(Dist *d, size_t bytes);
// The deadline's message, shared by the transports.
void dist_fail_late(Dist *d, const char *what, int peer, bool sending, double waited)
    __attribute__((noreturn));

// Liveness probe, for a wait that cannot tell whom it waits for (an NCCL collective): sends a
// probe to every peer and collects theirs for grace_s seconds; alive[p] = 1 for each peer heard.
// Every rank that times out probes, so the ranks that never answer are the hung or dead ones.
void dist_mpi_probe(Dist *d, double grace_s, unsigned char *alive);
void dist_tcp_probe(Dist *d, double grace_s, unsigned char *alive);

// ---- MPI (dist/transport_mpi.c; stubs that explain when the build has no MPI) -------------------
bool dist_mpi_available(void);
int  dist_mpi_init(Dist *d, int *argc, char ***argv, char *err, size_t n);
void dist_mpi_exchange(Dist *d, const DistMsg *sends, int ns, const DistMsg *recvs, int nr,
                       const char *what);
void dist_mpi_finalize(Dist *d);
// MPI_Abort(MPI_COMM_WORLD, 1) when MPI allows it from this thread; returns otherwise.
void dist_mpi_abort(Dist *d);

// ---- TCP (dist/transport_tcp.c) ---------------------------------------------------------------
// The rendezvous in folder dir (files named after prefix), then a full mesh of connections.
int  dist_tcp_open(Dist *d, const char *dir, const char *prefix, char *err, size_t n);
void dist_tcp_exchange(Dist *d, const DistMsg *sends, int ns, const DistMsg *recvs, int nr,
                       const char *what);
// Waits up to ms for a peer's connection to close: its rank, or -1 (watchdog thread).
int  dist_tcp_poll_closed(Dist *d, int ms);
void dist_tcp_close(Dist *d);

// ---- watchdog thread (dist/dist.c) -------------------------------------------------------------
void dist_watchdog_start(Dist *d);
void dist_watchdog_stop(Dist *d);

// Local rank and count from every rank's host name (world * DIST_HOST_MAX bytes).
void dist_local_from_hosts(Dist *d, const char *hosts);
