// Host collectives over the point-to-point exchange (dist/dist.h). Reductions are direct: each
// rank receives every other rank's copy of its part and adds the copies in rank order, so the
// result does not depend on the transport, the timing or which rank owns the part: the same
// bits on every rank and in every run. The bytes each rank sends, (world - 1) / world of the
// buffer per reduce-scatter or all-gather, equal a ring's.
#include "dist_internal.h"
#include "../kernels/error.h"

void dist_part(size_t n, int world, int r, size_t *lo, size_t *hi) {
    size_t s = n / ((size_t)world * DIST_ALIGN) * DIST_ALIGN;
    *lo = (size_t)r * s;
    *hi = r == world - 1 ? n : *lo + s;
}

void dist_exchange(Dist *d, const DistMsg *sends, int ns, const DistMsg *recvs, int nr,
                   const char *what) {
    switch (d->backend) {
    case DIST_MPI: dist_mpi_exchange(d, sends, ns, recvs, nr, what); break;
    case DIST_TCP: dist_tcp_exchange(d, sends, ns, recvs, nr, what); break;
    case DIST_SINGLE: break;
    }
}

void dist_all_gather_bytes(Dist *d, const void *mine, void *all, size_t bytes, const char *what) {
    memcpy((char *)all + (size_t)d->rank * bytes, mine, bytes);
    if (d->world <= 1) return;
    d->n_ops++;
    DistMsg *s = cg_malloc((size_t)d->world * sizeof *s), *r = cg_malloc((size_t)d->world * sizeof *r);
    int k = 0;
    for (int p = 0; p < d->world; p++) {
        if (p == d->rank) continue;
        s[k] = (DistMsg){p, (void *)mine, bytes};
        r[k++] = (DistMsg){p, (char *)all + (size_t)p * bytes, bytes};
    }
    dist_exchange(d, s, k, r, k, what);
    free(s);
    free(r);
}

void dist_barrier(Dist *d, const char *what) {
    if (d->world <= 1) return;
    char one = 1, *all = cg_malloc((size_t)d->world);
    dist_all_gather_bytes(d, &one, all, 1, what);
    free(all);
}

void dist_broadcast(Dist *d, void *buf, size_t bytes, int root, const char *what) {
    if (d->world <= 1) return;
    d->n_ops++;
    if (d->rank == root) {
        DistMsg *s = cg_malloc((size_t)d->world * sizeof *s);
        int k = 0;
        for (int p = 0; p < d->world; p++)
            if (p != root) s[k++] = (DistMsg){p, buf, bytes};
        dist_exchange(d, s, k, NULL, 0, what);
        free(s);
    } else {
        DistMsg r = {root, buf, bytes};
        dist_exchange(d, NULL, 0, &r, 1, what);
    }
}

void dist_reduce_scatter_f32(Dist *d, float *buf, size_t n, bool average, const char *what) {
    const int world = d->world;
    if (world <= 1) return;
    d->n_ops++;
    size_t lo, hi;
    dist_part(n, world, d->rank, &lo, &hi);
    const size_t len = hi - lo;
    float *in = dist_scratch(d, (size_t)world * len * sizeof(float) + 1);   // slot p: rank p's copy
    DistMsg *s = cg_malloc((size_t)world * sizeof *s), *r = cg_malloc((size_t)world * sizeof *r);
    int k = 0;
    for (int p = 0; p < world; p++) {
        if (p == d->rank) continue;
        size_t plo, phi;
        dist_part(n, world, p, &plo, &phi);
        s[k] = (DistMsg){p, buf + plo, (phi - plo) * sizeof(float)};
        r[k++] = (DistMsg){p, in + (size_t)p * len, len * sizeof(float)};
    }
    dist_exchange(d, s, k, r, k, what);
    free(s);
    free(r);
    memcpy(in + (size_t)d->rank * len, buf + lo, len * sizeof(float));
    float *out = buf + lo;
    #pragma omp parallel for if (len > 65536) schedule(static)
    for (size_t i = 0; i < len; i++) {
        float acc = in[i];
        for (int p = 1; p < world; p++) acc += in[(size_t)p * len + i];
        out[i] = average ? acc / (float)world : acc;
    }
}

void dist_all_gather_parts(Dist *d, void *buf, size_t n, size_t elem_bytes, const char *what) {
    const int world = d->world;
    if (world <= 1) return;
    d->n_ops++;
    size_t lo, hi;
    dist_part(n, world, d->rank, &lo, &hi);
    DistMsg *s = cg_malloc((size_t)world * sizeof *s), *r = cg_malloc((size_t)world * sizeof *r);
    int k = 0;
    for (int p = 0; p < world; p++) {
        if (p == d->rank) continue;
        size_t plo, phi;
        dist_part(n, world, p, &plo, &phi);
        s[k] = (DistMsg){p, (char *)buf + lo * elem_bytes, (hi - lo) * elem_bytes};
        r[k++] = (DistMsg){p, (char *)buf + plo * elem_bytes, (phi - plo) * elem_bytes};
    }
    dist_exchange(d, s, k, r, k, what);
    free(s);
    free(r);
}

void dist_all_reduce_f32(Dist *d, float *buf, size_t n, bool average, const char *what) {
    dist_reduce_scatter_f32(d, buf, n, average, what);
    dist_all_gather_parts(d, buf, n, sizeof(float), what);
}

double dist_sum_f64(Dist *d, double x, const char *what) {
    if (d->world <= 1) return x;
    double *all = cg_malloc((size_t)d->world * sizeof(double));
    dist_all_gather_bytes(d, &x, all, sizeof(double), what);
    double s = 0;
    for (int p = 0; p < d->world; p++) s += all[p];
    free(all);
    return s;
}

int dist_first_failed(Dist *d, int ok, const char *what) {
    if (d->world <= 1) return ok ? -1 : 0;
    int *all = cg_malloc((size_t)d->world * sizeof(int));
    dist_all_gather_bytes(d, &ok, all, sizeof(int), what);
    int bad = -1;
    for (int p = 0; p < d->world && bad < 0; p++)
        if (!all[p]) bad = p;
    free(all);
    return bad;
}

void dist_describe_late(Dist *d, double grace_s, char *out, size_t n) {
    out[0] = 0;
    if (d->world <= 1) return;
    unsigned char *alive = cg_calloc((size_t)d->world, 1);
    if (d->backend == DIST_MPI) dist_mpi_probe(d, grace_s, alive);
    else if (d->backend == DIST_TCP) dist_tcp_probe(d, grace_s, alive);
    alive[d->rank] = 1;
    size_t k = 0;
    int late = 0;
    for (int p = 0; p < d->world; p++) {
        if (alive[p]) continue;
        if (k < n) k += (size_t)snprintf(out + k, n - k, "%s%d", late ? ", " : "rank(s) ", p);
        late++;
    }
    if (late && k < n) snprintf(out + k, n - k, " did not answer a probe within %g s: hung or dead", grace_s);
    if (!late) snprintf(out, n, "every rank answered a probe, so none is dead; one is slow or stuck "
                        "in a collective the others did not enter");
    free(alive);
}
