// Host messages over TCP, for ranks started without MPI (srun, torchrun-style variables).
//
// Rendezvous: each rank listens on a free port and writes "HOST IP PORT" to
// DIR/PREFIX.rank<R> (written to a temporary name, then renamed); rank r connects to every
// lower rank (reading its file, retrying until the deadline: the file may not exist yet, or be
// a stale one from an earlier job) and accepts a connection from every higher rank. A hello in
// each direction checks the magic, the world size and the ranks. Once every rank is connected
// (a host-name exchange, which also gives the local ranks) each rank removes its file.
//
// Messages: a 24-byte header (magic, sender, collective number, payload bytes) then the
// payload. The receiver checks the header against what it expects, so ranks that drift into
// different sequences of collectives stop with a message instead of mixing up data.
#define _GNU_SOURCE   // POLLRDHUP
#include "dist_internal.h"
#include "../kernels/error.h"
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define WIRE_MAGIC  0x44534743u   // "CGSD"
#define HELLO_MAGIC 0x4f4c4548u   // "HELO"
#define PROBE_MAGIC 0x45424f50u   // "PROB"
#define CONNECT_ATTEMPT_S 5.0      // one connect() or hello may take this long before a retry

typedef struct DistTcp {
    int *fd;             // per rank; -1 for this rank
    char path[1200];     // this rank's rendezvous file, until every peer has connected
} DistTcp;

typedef struct WireHeader {
    uint32_t magic, from;
    uint64_t op, bytes;
} WireHeader;

typedef struct Hello {
    uint32_t magic, rank, world, pad;
} Hello;

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void set_nonblock(int fd, bool on) {
    int fl = fcntl(fd, F_GETFL, 0);
    fcntl(fd, F_SETFL, on ? fl | O_NONBLOCK : fl & ~O_NONBLOCK);
}

// Reads or writes all n bytes of a blocking socket, giving up at the deadline. 0 or -1.
static int io_full(int fd, void *buf, size_t n, bool reading, double deadline) {
    char *p = buf;
    while (n > 0) {
        int ms = (int)((deadline - dist_now()) * 1000);
        if (ms <= 0) return -1;
        struct pollfd pf = {fd, reading ? POLLIN : POLLOUT, 0};
        int rc = poll(&pf, 1, ms);
        if (rc < 0 && errno == EINTR) continue;
        if (rc <= 0) return -1;
        ssize_t k = reading ? recv(fd, p, n, MSG_DONTWAIT) : send(fd, p, n, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
        if (k <= 0) return -1;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

// A non-loopback IPv4 address of this host (the first interface that is up), else 127.0.0.1.
static void local_ip(char *out, size_t n) {
    const char *env = getenv("CGSPN_DIST_ADDR");
    if (env && env[0]) {
        snprintf(out, n, "%s", env);
        return;
    }
    snprintf(out, n, "127.0.0.1");
    struct ifaddrs *ifs;
    if (getifaddrs(&ifs) != 0) return;
    for (struct ifaddrs *i = ifs; i; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
        if (!(i->ifa_flags & IFF_UP) || (i->ifa_flags & IFF_LOOPBACK)) continue;
        inet_ntop(AF_INET, &((struct sockaddr_in *)i->ifa_addr)->sin_addr, out, (socklen_t)n);
        break;
    }
    freeifaddrs(ifs);
}

static int write_addr_file(const char *path, const char *host, const char *ip, int port) {
    char tmp[1300];
    snprintf(tmp, sizeof tmp, "%s.tmp%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f) return -1;
    fprintf(f, "%s %s %d\n", host, ip, port);
    int bad = fflush(f) != 0 || fsync(fileno(f)) != 0;
    bad |= fclose(f) != 0;
    if (bad || rename(tmp, path) != 0) {
        unlink(tmp);
        return -1;
    }
    return 0;
}

static int read_addr_file(const char *path, char *host, char *ip, int *port) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    int k = fscanf(f, "%63s %63s %d", host, ip, port);
    fclose(f);
    return k == 3 ? 0 : -1;
}

// A connected blocking socket to host:port, or -1 (refused, unreachable, not resolved, late).
static int connect_to(const char *host, int port, double deadline) {
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(host, ps, &hints, &res) != 0) return -1;
    int fd = -1;
    for (struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) continue;
        set_nonblock(fd, true);
        int rc = connect(fd, a->ai_addr, a->ai_addrlen);
        if (rc != 0 && errno == EINPROGRESS) {
            double until = dist_now() + CONNECT_ATTEMPT_S;
            if (until > deadline) until = deadline;
            int ms = (int)((until - dist_now()) * 1000);
            struct pollfd pf = {fd, POLLOUT, 0};
            int err = 0;
            socklen_t len = sizeof err;
            if (ms > 0 && poll(&pf, 1, ms) == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 &&
                err == 0)
                rc = 0;
        }
        if (rc != 0) {
            close(fd);
            fd = -1;
            continue;
        }
        set_nonblock(fd, false);
    }
    freeaddrinfo(res);
    return fd;
}

static void close_all(DistTcp *t, int world) {
    for (int r = 0; r < world; r++)
        if (t->fd[r] >= 0) close(t->fd[r]);
}

int dist_tcp_open(Dist *d, const char *dir, const char *prefix, char *err, size_t n) {
    const int rank = d->rank, world = d->world;
    const double deadline = dist_now() + d->timeout_s;
    if (mkdir(dir, 0775) != 0 && errno != EEXIST)
        return cg_set_error(err, n, "rank %d: rendezvous folder %s: %s\n  hint: dist_rendezvous (or "
                            "CGSPN_RENDEZVOUS) must be a folder every rank can write", rank, dir,
                            strerror(errno));
    DistTcp *t = cg_calloc(1, sizeof *t);
    t->fd = cg_malloc((size_t)world * sizeof(int));
    for (int r = 0; r < world; r++) t->fd[r] = -1;

    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in addr = {0};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    socklen_t alen = sizeof addr;
    int one = 1;
    if (lfd < 0 || setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        bind(lfd, (struct sockaddr *)&addr, sizeof addr) != 0 || listen(lfd, world) != 0 ||
        getsockname(lfd, (struct sockaddr *)&addr, &alen) != 0) {
        int e = errno;
        if (lfd >= 0) close(lfd);
        free(t->fd);
        free(t);
        return cg_set_error(err, n, "rank %d: cannot listen on a TCP port: %s", rank, strerror(e));
    }
    char ip[64];
    local_ip(ip, sizeof ip);
    snprintf(t->path, sizeof t->path, "%s/%s.rank%d", dir, prefix, rank);
    if (write_addr_file(t->path, d->host, ip, ntohs(addr.sin_port)) != 0) {
        cg_set_error(err, n, "rank %d: cannot write the rendezvous file %s: %s", rank, t->path,
                     strerror(errno));
        close(lfd);
        free(t->fd);
        free(t);
        return -1;
    }

    int rc = 0;
    // Connect to every lower rank.
    for (int j = 0; j < rank && rc == 0; j++) {
        char path[1200], host[64], pip[64];
        snprintf(path, sizeof path, "%s/%s.rank%d", dir, prefix, j);
        for (;;) {
            if (dist_now() > deadline) {
                rc = cg_set_error(err, n, "rank %d: rank %d did not show up in the rendezvous folder "
                                  "within %g s (no usable %s)\n  hint: is rank %d running, with the "
                                  "same dist_rendezvous / CGSPN_RENDEZVOUS (a folder every node sees)?",
                                  rank, j, d->timeout_s, path, j);
                break;
            }
            int port, fd = -1;
            if (read_addr_file(path, host, pip, &port) == 0) {
                // The same host: loopback; else its name, then the address it saw for itself.
                if (strcmp(host, d->host) == 0) fd = connect_to("127.0.0.1", port, deadline);
                if (fd < 0) fd = connect_to(host, port, deadline);
                if (fd < 0) fd = connect_to(pip, port, deadline);
            }
            if (fd >= 0) {
                Hello h = {HELLO_MAGIC, (uint32_t)rank, (uint32_t)world, 0}, r = {0};
                double until = dist_now() + CONNECT_ATTEMPT_S;
                if (until > deadline) until = deadline;
                if (io_full(fd, &h, sizeof h, false, until) == 0 &&
                    io_full(fd, &r, sizeof r, true, until) == 0 && r.magic == HELLO_MAGIC &&
                    r.rank == (uint32_t)j && r.world == (uint32_t)world) {
                    t->fd[j] = fd;
                    break;
                }
                close(fd);   // a stale file's port, now someone else's
            }
            sleep_ms(20);
        }
    }
    // Accept every higher rank.
    int missing = world - 1 - rank;
    while (rc == 0 && missing > 0) {
        int ms = (int)((deadline - dist_now()) * 1000);
        struct pollfd pf = {lfd, POLLIN, 0};
        if (ms <= 0) {
            char list[256] = "";
            for (int j = rank + 1; j < world; j++)
                if (t->fd[j] < 0 && strlen(list) < sizeof list - 16)
                    snprintf(list + strlen(list), sizeof list - strlen(list), "%s%d", list[0] ? ", " : "", j);
            rc = cg_set_error(err, n, "rank %d: rank(s) %s did not connect within %g s\n  hint: are they "
                              "running, with the same world size and rendezvous folder (%s)?",
                              rank, list, d->timeout_s, dir);
            break;
        }
        if (poll(&pf, 1, ms < 200 ? ms : 200) <= 0 || !(pf.revents & POLLIN)) continue;
        int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) continue;
        Hello h = {0};
        double until = dist_now() + CONNECT_ATTEMPT_S;
        if (until > deadline) until = deadline;
        if (io_full(fd, &h, sizeof h, true, until) != 0 || h.magic != HELLO_MAGIC ||
            h.world != (uint32_t)world || h.rank <= (uint32_t)rank || h.rank >= (uint32_t)world ||
            t->fd[h.rank] >= 0) {
            if (h.magic == HELLO_MAGIC && h.world != (uint32_t)world)
                rc = cg_set_error(err, n, "rank %d: rank %u runs with a world of %u, this rank with %d\n"
                                  "  hint: every rank must be started with the same world size",
                                  rank, h.rank, h.world, world);
            close(fd);
            continue;
        }
        Hello r = {HELLO_MAGIC, (uint32_t)rank, (uint32_t)world, 0};
        if (io_full(fd, &r, sizeof r, false, until) != 0) {
            close(fd);
            continue;
        }
        t->fd[h.rank] = fd;
        missing--;
    }
    close(lfd);
    if (rc != 0) {
        unlink(t->path);
        close_all(t, world);
        free(t->fd);
        free(t);
        return rc;
    }
    for (int r = 0; r < world; r++) {
        if (t->fd[r] < 0) continue;
        setsockopt(t->fd[r], IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        set_nonblock(t->fd[r], true);
    }
    d->tcp = t;
    // Every rank connected to every other: the files have served (the exchange completes only
    // once every peer is connected to this rank).
    char *hosts = cg_calloc((size_t)world, DIST_HOST_MAX);
    dist_all_gather_bytes(d, d->host, hosts, DIST_HOST_MAX, "the host-name exchange at startup");
    dist_local_from_hosts(d, hosts);
    free(hosts);
    unlink(t->path);
    return 0;
}

// ---- exchange ---------------------------------------------------------------------------------

typedef struct Io {
    bool active;
    char *buf;
    size_t bytes, done;    // done counts the header too
    WireHeader h;          // sent, or received
} Io;

static void peer_closed(Dist *d, int peer, const char *what) {
    dist_fail(d, "look for the first error in that rank's output",
              "rank %d closed its connection (it exited or crashed) during %s; stopping", peer, what);
}

static void recv_some(Dist *d, int peer, Io *io, const char *what) {
    const size_t total = sizeof(WireHeader) + io->bytes;
    while (io->done < total) {
        ssize_t k;
        if (io->done < sizeof(WireHeader))
            k = recv(d->tcp->fd[peer], (char *)&io->h + io->done, sizeof(WireHeader) - io->done, 0);
        else
            k = recv(d->tcp->fd[peer], io->buf + (io->done - sizeof(WireHeader)), total - io->done, 0);
        if (k == 0) peer_closed(d, peer, what);
        if (k < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) return;
            if (errno == EINTR) continue;
            if (errno == ECONNRESET) peer_closed(d, peer, what);
            dist_fail(d, "", "recv from rank %d during %s: %s", peer, what, strerror(errno));
        }
        bool header_done = io->done < sizeof(WireHeader) && io->done + (size_t)k >= sizeof(WireHeader);
        io->done += (size_t)k;
        if (header_done &&
            (io->h.magic != WIRE_MAGIC || io->h.from != (uint32_t)peer || io->h.op != d->n_ops ||
             io->h.bytes != io->bytes))
            dist_fail(d, "every rank must run the same binary with the same config",
                      "rank %d sent %llu bytes for host collective #%llu while this rank expects %zu "
                      "bytes for #%lu (%s): the ranks are out of step", peer,
                      (unsigned long long)io->h.bytes, (unsigned long long)io->h.op, io->bytes,
                      d->n_ops, what);
    }
    io->active = false;
}

static void send_some(Dist *d, int peer, Io *io, const char *what) {
    const size_t total = sizeof(WireHeader) + io->bytes;
    while (io->done < total) {
        ssize_t k;
        if (io->done < sizeof(WireHeader))
            k = send(d->tcp->fd[peer], (char *)&io->h + io->done, sizeof(WireHeader) - io->done,
                     MSG_NOSIGNAL);
        else
            k = send(d->tcp->fd[peer], io->buf + (io->done - sizeof(WireHeader)), total - io->done,
                     MSG_NOSIGNAL);
        if (k < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) return;
            if (errno == EINTR) continue;
            if (errno == EPIPE || errno == ECONNRESET) peer_closed(d, peer, what);
            dist_fail(d, "", "send to rank %d during %s: %s", peer, what, strerror(errno));
        }
        io->done += (size_t)k;
    }
    io->active = false;
}

void dist_tcp_exchange(Dist *d, const DistMsg *sends, int ns, const DistMsg *recvs, int nr,
                       const char *what) {
    const int world = d->world;
    Io *snd = cg_calloc((size_t)world, sizeof(Io)), *rcv = cg_calloc((size_t)world, sizeof(Io));
    for (int i = 0; i < ns; i++) {
        if (!sends[i].bytes) continue;
        Io *io = &snd[sends[i].peer];
        *io = (Io){true, sends[i].buf, sends[i].bytes, 0,
                   {WIRE_MAGIC, (uint32_t)d->rank, d->n_ops, sends[i].bytes}};
    }
    for (int i = 0; i < nr; i++) {
        if (!recvs[i].bytes) continue;
        rcv[recvs[i].peer] = (Io){true, recvs[i].buf, recvs[i].bytes, 0, {0}};
    }
    struct pollfd *pf = cg_malloc((size_t)world * sizeof *pf);
    int *pp = cg_malloc((size_t)world * sizeof *pp);
    const double t0 = dist_now();
    for (;;) {
        int k = 0;
        for (int p = 0; p < world; p++) {
            if (!snd[p].active && !rcv[p].active) continue;
            pf[k] = (struct pollfd){d->tcp->fd[p], (short)((rcv[p].active ? POLLIN : 0) |
                                                           (snd[p].active ? POLLOUT : 0)), 0};
            pp[k++] = p;
        }
        if (!k) break;
        double waited = dist_now() - t0;
        if (waited > d->timeout_s) {
            for (int i = 0; i < k; i++)
                if (rcv[pp[i]].active) dist_fail_late(d, what, pp[i], false, waited);
            dist_fail_late(d, what, pp[0], true, waited);
        }
        int ms = (int)((d->timeout_s - waited) * 1000) + 1;
        if (ms > 100) ms = 100;
        int rc = poll(pf, (nfds_t)k, ms);
        if (rc < 0 && errno != EINTR) dist_fail(d, "", "poll during %s: %s", what, strerror(errno));
        for (int i = 0; rc > 0 && i < k; i++) {
            int p = pp[i];
            short ev = pf[i].revents;
            if (!ev) continue;
            if (rcv[p].active && (ev & (POLLIN | POLLHUP | POLLERR))) recv_some(d, p, &rcv[p], what);
            if (snd[p].active && (ev & (POLLOUT | POLLHUP | POLLERR))) send_some(d, p, &snd[p], what);
        }
    }
    free(pf);
    free(pp);
    free(snd);
    free(rcv);
}

void dist_tcp_probe(Dist *d, double grace_s, unsigned char *alive) {
    const int world = d->world;
    WireHeader probe = {PROBE_MAGIC, (uint32_t)d->rank, d->n_ops, 0};
    for (int p = 0; p < world; p++)
        if (p != d->rank) send(d->tcp->fd[p], &probe, sizeof probe, MSG_NOSIGNAL | MSG_DONTWAIT);
    // Whatever a peer sends now (a probe, or data of a collective it is in) shows it is alive.
    unsigned char *closed = cg_calloc((size_t)world, 1);
    const double t0 = dist_now();
    for (int heard = 1; heard < world && dist_now() - t0 < grace_s;) {
        struct pollfd pf[world];
        int pp[world], k = 0;
        for (int p = 0; p < world; p++) {
            if (p == d->rank || alive[p] || closed[p]) continue;
            pf[k] = (struct pollfd){d->tcp->fd[p], POLLIN, 0};
            pp[k++] = p;
        }
        if (!k) break;
        if (poll(pf, (nfds_t)k, 50) <= 0) continue;
        for (int i = 0; i < k; i++) {
            if (!(pf[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            char byte;
            if (recv(pf[i].fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT) == 1) alive[pp[i]] = 1;
            else closed[pp[i]] = 1;   // gone: it stays "did not answer"
            heard++;
        }
    }
    free(closed);
}

int dist_tcp_poll_closed(Dist *d, int ms) {
    const int world = d->world;
    struct pollfd pf[world > 0 ? world : 1];
    int pp[world > 0 ? world : 1], k = 0;
    for (int p = 0; p < world; p++) {
        if (d->tcp->fd[p] < 0) continue;
        pf[k] = (struct pollfd){d->tcp->fd[p], POLLRDHUP, 0};
        pp[k++] = p;
    }
    if (poll(pf, (nfds_t)k, ms) <= 0) return -1;
    for (int i = 0; i < k; i++)
        if (pf[i].revents & (POLLRDHUP | POLLHUP | POLLERR)) return pp[i];
    return -1;
}

void dist_tcp_close(Dist *d) {
    DistTcp *t = d->tcp;
    if (!t) return;
    close_all(t, d->world);
    free(t->fd);
    free(t);
    d->tcp = NULL;
}
